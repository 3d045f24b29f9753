/*
 * The descriptive entry points: names, sizes, shapes, head sizes, contexts
 * and status strings, as the header states them.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void test_dtypes(void) {
  static const struct {
    pa_dtype t;
    size_t size;
    const char *name;
    int activation;
  } want[] = {{PA_F32, 4, "f32", 1},
              {PA_F16, 2, "f16", 1},
              {PA_BF16, 2, "bf16", 1},
              {PA_FP8_E4M3, 1, "fp8_e4m3", 0},
              {PA_FP8_E5M2, 1, "fp8_e5m2", 0}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    TU_CHECK(pa_dtype_size(want[i].t) == want[i].size, "pa_dtype_size(%s) = %zu", want[i].name,
             pa_dtype_size(want[i].t));
    const char *name = pa_dtype_name(want[i].t);
    TU_CHECK(name && strcmp(name, want[i].name) == 0, "pa_dtype_name(%d) = %s", (int)want[i].t,
             name ? name : "(null)");
    TU_CHECK(!!pa_dtype_is_supported(want[i].t) == want[i].activation,
             "pa_dtype_is_supported(%s) = %d", want[i].name, pa_dtype_is_supported(want[i].t));
  }
  /* Values outside the enum, as a caller's cast could produce. */
  static const int bad[] = {5, -1, 1000};
  for (size_t i = 0; i < 3; i++) {
    pa_dtype t = (pa_dtype)bad[i];
    TU_CHECK(pa_dtype_size(t) == 0, "pa_dtype_size(%d) = %zu, want 0", bad[i], pa_dtype_size(t));
    const char *name = pa_dtype_name(t);
    TU_CHECK(name && strcmp(name, "invalid") == 0, "pa_dtype_name(%d) = %s, want invalid", bad[i],
             name ? name : "(null)");
    TU_CHECK(!pa_dtype_is_supported(t), "pa_dtype_is_supported(%d) is true", bad[i]);
  }
}

static void test_backend(void) {
  const char *name = pa_backend_name();
  TU_CHECK(name && strcmp(name, "PAGEDATTN") == 0, "pa_backend_name = %s", name ? name : "(null)");
  for (int h = PA_MIN_HEAD_SIZE; h <= PA_MAX_HEAD_SIZE; h++)
    TU_CHECK(pa_validate_head_size(h) == PA_OK, "pa_validate_head_size(%d) fails: %s", h,
             pa_last_error());
  TU_CHECK(PA_MIN_HEAD_SIZE == 1 && PA_MAX_HEAD_SIZE == 1024, "supported head sizes changed");

  static const struct {
    int64_t nb;
    int bs, nkv, d;
  } shapes[] = {
      {1, 1, 1, 1}, {512, 16, 8, 128}, {7, 17, 3, 130}, {(int64_t)1 << 33, 128, 64, 1024}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int64_t s[3] = {-1, -1, -1};
    pa_kv_cache_shape(shapes[i].nb, shapes[i].bs, shapes[i].nkv, shapes[i].d, s);
    int64_t row = (int64_t)shapes[i].bs * shapes[i].nkv * shapes[i].d;
    TU_CHECK(s[0] == 2 && s[1] == shapes[i].nb && s[2] == row,
             "pa_kv_cache_shape(%lld, %d, %d, %d) = {%lld, %lld, %lld}", (long long)shapes[i].nb,
             shapes[i].bs, shapes[i].nkv, shapes[i].d, (long long)s[0], (long long)s[1],
             (long long)s[2]);
  }
}

static void test_status_strings(void) {
  static const pa_status all[] = {PA_OK, PA_ERR_INVALID_ARGUMENT, PA_ERR_UNSUPPORTED,
                                  PA_ERR_OUT_OF_RANGE, PA_ERR_OUT_OF_MEMORY};
  for (int i = 0; i < 5; i++) {
    const char *a = pa_status_string(all[i]);
    TU_CHECK(a && *a, "pa_status_string(%d) is empty", (int)all[i]);
    for (int j = 0; j < i; j++) {
      const char *b = pa_status_string(all[j]);
      TU_CHECK(!a || !b || strcmp(a, b) != 0, "statuses %d and %d share the string %s", i, j,
               a ? a : "");
    }
  }
  const char *unknown = pa_status_string((pa_status)99);
  TU_CHECK(unknown != NULL, "pa_status_string(99) is NULL");
}

/* The path is one PA_ISA names, of the family pa_context_isa reports, and
 * no further along than a PA_ISA cap. */
static void check_kernel_path(const pa_context *ctx, const char *cap) {
  static const char *paths[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx"};
  static const char *family_of[] = {"scalar", "avx2", "avx512", "avx512", "avx512"};
  const char *path = pa_context_kernel_path(ctx), *isa = pa_context_isa(ctx);
  int at = -1, cap_at = 4;
  for (int i = 0; i < 5; i++) {
    if (path && strcmp(path, paths[i]) == 0) at = i;
    if (cap && strcmp(cap, paths[i]) == 0) cap_at = i;
  }
  TU_CHECK(at >= 0, "pa_context_kernel_path = %s", path ? path : "(null)");
  if (at < 0) return;
  TU_CHECK(strcmp(isa, family_of[at]) == 0, "path %s but isa %s", path, isa);
  TU_CHECK(at <= cap_at, "PA_ISA=%s but path %s", cap ? cap : "", path);
}

static void test_contexts(void) {
  static const char *families[] = {"avx512", "avx2", "scalar"};
  static const int requests[] = {1, 2, 3, 0, -4};
  const char *cap = getenv("PA_ISA");
  for (int i = 0; i < 5; i++) {
    pa_context *ctx = NULL;
    pa_status st = pa_context_create(requests[i], &ctx);
    TU_CHECK(st == PA_OK && ctx, "pa_context_create(%d): %s", requests[i], pa_last_error());
    if (st != PA_OK) continue;
    int n = pa_context_num_threads(ctx);
    if (requests[i] > 0)
      TU_CHECK(n == requests[i], "pa_context_num_threads = %d, want %d", n, requests[i]);
    else
      TU_CHECK(n >= 1, "pa_context_num_threads = %d for a request of %d", n, requests[i]);
    const char *isa = pa_context_isa(ctx);
    int known = 0;
    for (int f = 0; f < 3; f++) known |= isa && strcmp(isa, families[f]) == 0;
    TU_CHECK(known, "pa_context_isa = %s", isa ? isa : "(null)");
    /* PA_ISA caps the family: scalar is always available, so it is exact;
     * avx2 may fall back to scalar on a CPU without it, never up. */
    if (cap && strcmp(cap, "scalar") == 0)
      TU_CHECK(isa && strcmp(isa, "scalar") == 0, "PA_ISA=scalar but isa %s", isa);
    if (cap && strcmp(cap, "avx2") == 0)
      TU_CHECK(isa && strcmp(isa, "avx512") != 0, "PA_ISA=avx2 but isa %s", isa);
    check_kernel_path(ctx, cap);
    pa_context_destroy(ctx);
  }
}

/* A bad value of PA_ISA or PA_BF16_DOT refuses the context, naming the
 * variable and the value; the variable's value is restored afterwards. */
static void test_bad_environment(void) {
  static const char *vars[] = {"PA_ISA", "PA_BF16_DOT", "PA_PREFETCH"};
  for (int v = 0; v < 3; v++) {
    const char *was = getenv(vars[v]);
    char *saved = was ? strdup(was) : NULL;
    setenv(vars[v], "fastest", 1);
    pa_context *ctx = NULL;
    pa_status st = pa_context_create(1, &ctx);
    TU_CHECK(st == PA_ERR_INVALID_ARGUMENT && !ctx, "%s=fastest: status %d", vars[v], (int)st);
    const char *message = pa_last_error();
    TU_CHECK(strstr(message, vars[v]) && strstr(message, "\"fastest\""), "%s=fastest: message %s",
             vars[v], message);
    if (ctx) pa_context_destroy(ctx);
    if (saved) {
      setenv(vars[v], saved, 1);
      free(saved);
    } else {
      unsetenv(vars[v]);
    }
  }
}

/* pa_kv_layout_preferred (0.3): PA_KV_ROWS for every argument no cache
 * could have; for valid ones either layout, PA_KV_TILED only where the
 * tiles read it, which the header places on the amx path for bf16
 * activations over a bf16 cache and bf16 or f16 ones over an FP8 cache:
 * never under a PA_ISA cap below amx.
 * The answer is the same for the same arguments. */
static void check_preferred(const pa_context *ctx, const char *what) {
  const char *path = pa_context_kernel_path(ctx);
  int amx = path && strcmp(path, "amx") == 0;
  /* Arguments no cache could have. */
  static const int bad_dtypes[] = {5, -1, 1000};
  for (int i = 0; i < 3; i++) {
    pa_dtype t = (pa_dtype)bad_dtypes[i];
    TU_CHECK(pa_kv_layout_preferred(ctx, t, PA_BF16, 16, 128) == PA_KV_ROWS,
             "%s: pa_kv_layout_preferred(act %d) is not PA_KV_ROWS", what, bad_dtypes[i]);
    TU_CHECK(pa_kv_layout_preferred(ctx, PA_BF16, t, 16, 128) == PA_KV_ROWS,
             "%s: pa_kv_layout_preferred(cache dtype %d) is not PA_KV_ROWS", what, bad_dtypes[i]);
  }
  for (int t = PA_FP8_E4M3; t <= PA_FP8_E5M2; t++)
    TU_CHECK(pa_kv_layout_preferred(ctx, (pa_dtype)t, PA_BF16, 16, 128) == PA_KV_ROWS,
             "%s: pa_kv_layout_preferred(act %s) is not PA_KV_ROWS", what,
             pa_dtype_name((pa_dtype)t));
  static const int bad_blocks[] = {17, 8, 1, 0, -16, 24, 40};
  for (int i = 0; i < 7; i++)
    TU_CHECK(pa_kv_layout_preferred(ctx, PA_BF16, PA_BF16, bad_blocks[i], 128) == PA_KV_ROWS,
             "%s: pa_kv_layout_preferred(block_size %d) is not PA_KV_ROWS", what, bad_blocks[i]);
  static const int bad_heads[] = {40, 8, 1, 0, -16, 1040, 2048, 136};
  for (int i = 0; i < 8; i++)
    TU_CHECK(pa_kv_layout_preferred(ctx, PA_BF16, PA_BF16, 16, bad_heads[i]) == PA_KV_ROWS,
             "%s: pa_kv_layout_preferred(head_size %d) is not PA_KV_ROWS", what, bad_heads[i]);
  /* Valid arguments. */
  static const int blocks[] = {16, 32, 48, 128}, heads[] = {16, 48, 64, 80, 96, 128, 256, 1024};
  for (int a = PA_F32; a <= PA_BF16; a++)
    for (int c = PA_F32; c <= PA_FP8_E5M2; c++)
      for (int b = 0; b < 4; b++)
        for (int h = 0; h < 8; h++) {
          pa_kv_layout l =
              pa_kv_layout_preferred(ctx, (pa_dtype)a, (pa_dtype)c, blocks[b], heads[h]);
          TU_CHECK(l == PA_KV_ROWS || l == PA_KV_TILED,
                   "%s: pa_kv_layout_preferred(%s, %s, %d, %d) = %d", what,
                   pa_dtype_name((pa_dtype)a), pa_dtype_name((pa_dtype)c), blocks[b], heads[h],
                   (int)l);
          /* The tiles read bf16 caches in place and FP8 ones converted per tile
           * (for f16 activations too, in two bf16 parts). */
          int tiles = amx && ((a == PA_BF16 && c == PA_BF16) ||
                              ((a == PA_BF16 || a == PA_F16) && c >= PA_FP8_E4M3));
          TU_CHECK(l == PA_KV_ROWS || tiles,
                   "%s: pa_kv_layout_preferred(%s, %s, %d, %d) is PA_KV_TILED on path %s", what,
                   pa_dtype_name((pa_dtype)a), pa_dtype_name((pa_dtype)c), blocks[b], heads[h],
                   path ? path : "(null)");
          TU_CHECK(l == pa_kv_layout_preferred(ctx, (pa_dtype)a, (pa_dtype)c, blocks[b], heads[h]),
                   "%s: pa_kv_layout_preferred changes its answer", what);
        }
}

static void test_layout_preferred(void) {
  TU_CHECK(pa_kv_layout_preferred(NULL, PA_BF16, PA_BF16, 16, 128) == PA_KV_ROWS,
           "pa_kv_layout_preferred(NULL ctx) is not PA_KV_ROWS");
  pa_context *ctx = NULL;
  if (pa_context_create(1, &ctx) == PA_OK) {
    check_preferred(ctx, "the environment's path");
    printf(
        "test_api: pa_kv_layout_preferred(bf16, bf16, 16, 128) on path %s: %s\n",
        pa_context_kernel_path(ctx),
        pa_kv_layout_preferred(ctx, PA_BF16, PA_BF16, 16, 128) == PA_KV_TILED ? "tiled" : "rows");
    pa_context_destroy(ctx);
  }
  /* Under each PA_ISA cap below amx, rows everywhere. */
  static const char *caps[] = {"scalar", "avx2", "avx512", "avx512bf16"};
  const char *was = getenv("PA_ISA");
  char *saved = was ? strdup(was) : NULL;
  for (int i = 0; i < 4; i++) {
    setenv("PA_ISA", caps[i], 1);
    ctx = NULL;
    pa_status st = pa_context_create(1, &ctx);
    TU_CHECK(st == PA_OK, "PA_ISA=%s: pa_context_create: %s", caps[i], pa_last_error());
    if (st != PA_OK) continue;
    char what[64];
    snprintf(what, sizeof what, "PA_ISA=%s (path %s)", caps[i], pa_context_kernel_path(ctx));
    check_preferred(ctx, what);
    for (int a = PA_F32; a <= PA_BF16; a++)
      for (int c = PA_F32; c <= PA_FP8_E5M2; c++)
        TU_CHECK(pa_kv_layout_preferred(ctx, (pa_dtype)a, (pa_dtype)c, 32, 128) == PA_KV_ROWS,
                 "%s: pa_kv_layout_preferred(%s, %s, 32, 128) is not PA_KV_ROWS", what,
                 pa_dtype_name((pa_dtype)a), pa_dtype_name((pa_dtype)c));
    pa_context_destroy(ctx);
  }
  if (saved) {
    setenv("PA_ISA", saved, 1);
    free(saved);
  } else {
    unsetenv("PA_ISA");
  }
}

int main(void) {
  test_bad_environment();
  test_layout_preferred();
  test_dtypes();
  test_backend();
  test_status_strings();
  test_contexts();
  return tu_finish("test_api");
}
