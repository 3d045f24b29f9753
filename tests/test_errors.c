/*
 * Every error path of API.md, for every entry point: the exact status, a
 * message from pa_last_error() that names the argument, and no byte of the
 * cache, the output or lse written ("on failure nothing has been written").
 *
 * Statuses: PA_ERR_INVALID_ARGUMENT for a null pointer, a bad shape or an
 * inconsistency; PA_ERR_OUT_OF_RANGE for a slot or block id outside the
 * cache and a seq_len beyond its block table row; PA_ERR_UNSUPPORTED for
 * FP8 activations and for a tiled cache (0.3) whose block or head size is
 * not a multiple of 16: well-formed requests the build cannot serve.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define INV PA_ERR_INVALID_ARGUMENT
#define OOR PA_ERR_OUT_OF_RANGE
/* FP8 is a well-formed pa_dtype, but not one this build serves as an
 * activation (pa_dtype_is_supported says no): "well-formed, but this build
 * cannot serve it". */
#define UNS PA_ERR_UNSUPPORTED

/* The fixture: a valid call of every entry point, which each check breaks
 * in one place. */
enum { NH = 4, NKV = 2, D = 16, BS = 4, NB = 8, BT_STRIDE = 4, ROWS = 4, KROWS = 15 };
enum { QW = NH * D, KW = NKV * D };

static pa_context *g_ctx;
static pa_layer *g_layer;
static pa_kv_cache g_cache, g_cache2, g_fp8; /* g_cache2: same geometry, for copies and swaps */
static int32_t g_qsl[3] = {0, 3, 4}, g_seq_lens[2] = {6, 9};
static int32_t g_bt[2 * BT_STRIDE] = {5, 2, -1, -1, 0, 7, 3, -1};
static pa_batch g_batch;
static float *g_query, *g_out, *g_lse, *g_krows, *g_vrows;
static int32_t g_cu_k[3] = {0, 6, 15};
static int64_t g_slots[3] = {1, 9, 30};
static int64_t g_pairs[2 * 2] = {0, 1, 3, 4};

/* ---- snapshots ----------------------------------------------------------- */

typedef struct region {
  void *p;
  size_t bytes;
  unsigned char *copy;
} region;

static region g_regions[8];
static int g_num_regions;

static void watch(void *p, size_t bytes) {
  region *r = &g_regions[g_num_regions++];
  r->p = p;
  r->bytes = bytes;
  r->copy = tu_malloc(bytes);
}

static void snapshot(void) {
  for (int i = 0; i < g_num_regions; i++)
    memcpy(g_regions[i].copy, g_regions[i].p, g_regions[i].bytes);
}

static const char *first_change(void) {
  static const char *names[] = {"cache key", "cache value", "cache2 key", "cache2 value",
                                "fp8 key",   "fp8 value",   "out",        "lse"};
  for (int i = 0; i < g_num_regions; i++)
    if (memcmp(g_regions[i].copy, g_regions[i].p, g_regions[i].bytes) != 0) return names[i];
  return NULL;
}

/* ---- messages ------------------------------------------------------------ */

/* names: alternatives separated by '|'; 1 when msg contains one of them. */
static int mentions(const char *msg, const char *names) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", names);
  for (char *save = NULL, *tok = strtok_r(buf, "|", &save); tok; tok = strtok_r(NULL, "|", &save))
    if (strstr(msg, tok)) return 1;
  return 0;
}

/* Leaves a message that mentions none of names, so that a call which fails
 * without setting its own message cannot pass on a stale one. */
static void reset_error(const char *names) {
  for (int k = 0; k < 3; k++) {
    pa_layer *l = NULL;
    if (k == 0) (void)pa_layer_create(NULL, &l);
    if (k == 1) (void)pa_context_create(1, NULL);
    if (k == 2) (void)pa_validate_head_size(0);
    const char *m = pa_last_error();
    if (m && *m && !mentions(m, names)) return;
  }
}

static void prepare(const char *names) {
  reset_error(names);
  snapshot();
}

static void verify(int line, const char *call, pa_status got, pa_status want, const char *names) {
  const char *msg = pa_last_error();
  TU_CHECK(got == want, "line %d: %s: status %s (%d), want %s; message: %s", line, call,
           pa_status_string(got), (int)got, pa_status_string(want), msg ? msg : "(null)");
  TU_CHECK(msg && *msg && mentions(msg, names), "line %d: %s: message \"%s\" does not name %s",
           line, call, msg ? msg : "(null)", names);
  if (getenv("PA_TEST_VERBOSE")) printf("line %d: %s\n", line, msg ? msg : "(null)");
  const char *changed = first_change();
  TU_CHECK(!changed, "line %d: %s failed but wrote %s", line, call, changed ? changed : "");
  snapshot(); /* a broken call must not make every later check fail too */
}

/* A call that must fail with status `want` and a message naming one of
 * `names`, writing nothing. */
#define EXPECT(want, names, call)              \
  do {                                         \
    prepare(names);                            \
    pa_status st_ = (call);                    \
    verify(__LINE__, #call, st_, want, names); \
  } while (0)

/* A value check on top of EXPECT: the contract's messages name the value. */
static void message_has(int line, const char *value) {
  const char *msg = pa_last_error();
  TU_CHECK(msg && strstr(msg, value), "line %d: message \"%s\" does not show the value %s", line,
           msg ? msg : "(null)", value);
}

#define OK(call)                                                                           \
  do {                                                                                     \
    pa_status st_ = (call);                                                                \
    TU_CHECK(st_ == PA_OK, "line %d: %s: %s (%s)", __LINE__, #call, pa_status_string(st_), \
             pa_last_error());                                                             \
  } while (0)

/* ---- fixture --------------------------------------------------------------- */

static pa_layer_config base_config(void) {
  pa_layer_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.num_heads = NH;
  cfg.num_kv_heads = NKV;
  cfg.head_size = D;
  cfg.attn_type = PA_ATTN_DECODER;
  cfg.dtype = PA_F32;
  return cfg;
}

/* Fixture caches get this many times the memory their geometry needs, so
 * that a call which misses a bad geometry (a head_size of 1025, say) writes
 * into watched memory instead of corrupting the heap. */
#define ROOM 128

static size_t alloc_bytes(const pa_kv_cache *c) { return ROOM * hx_cache_bytes(c); }

static pa_kv_cache new_cache(pa_dtype t, int64_t nb) {
  pa_kv_cache c;
  memset(&c, 0, sizeof c);
  c.num_blocks = nb;
  c.block_size = BS;
  c.num_kv_heads = NKV;
  c.head_size = D;
  c.dtype = t;
  c.k_scale = 0.5f;
  c.v_scale = 0.25f;
  c.key = tu_calloc(1, alloc_bytes(&c));
  c.value = tu_calloc(1, alloc_bytes(&c));
  return c;
}

static void setup(void) {
  tu_rng rng;
  tu_rng_seed(&rng, 99);
  if (pa_context_create(2, &g_ctx) != PA_OK) {
    fprintf(stderr, "pa_context_create: %s\n", pa_last_error());
    exit(1);
  }
  pa_layer_config cfg = base_config();
  if (pa_layer_create(&cfg, &g_layer) != PA_OK) {
    fprintf(stderr, "pa_layer_create: %s\n", pa_last_error());
    exit(1);
  }
  g_cache = new_cache(PA_F32, NB);
  g_cache2 = new_cache(PA_F32, NB);
  g_fp8 = new_cache(PA_FP8_E4M3, NB);
  pa_kv_cache *all[3] = {&g_cache, &g_cache2, &g_fp8};
  for (int i = 0; i < 3; i++) {
    hx_fill_cache(&rng, all[i], 1.0, 0);
    watch(all[i]->key, alloc_bytes(all[i]));
    watch(all[i]->value, alloc_bytes(all[i]));
  }
  g_batch = (pa_batch){2, g_qsl, g_seq_lens, g_bt, BT_STRIDE};
  g_query = tu_malloc(ROWS * QW * sizeof(float));
  hx_fill_rows(&rng, g_query, QW, ROWS, QW, PA_F32, 1.0);
  g_krows = tu_malloc(KROWS * KW * sizeof(float));
  g_vrows = tu_malloc(KROWS * KW * sizeof(float));
  hx_fill_rows(&rng, g_krows, KW, KROWS, KW, PA_F32, 1.0);
  hx_fill_rows(&rng, g_vrows, KW, KROWS, KW, PA_F32, 1.0);
  g_out = tu_malloc((ROWS + 1) * QW * sizeof(float));
  g_lse = tu_malloc((ROWS * NH + 4) * sizeof(float));
  tu_fill_canary(g_out, (ROWS + 1) * QW * sizeof(float));
  tu_fill_canary(g_lse, (ROWS * NH + 4) * sizeof(float));
  watch(g_out, (ROWS + 1) * QW * sizeof(float));
  watch(g_lse, (ROWS * NH + 4) * sizeof(float));
}

static pa_status paged(const pa_layer *layer, const pa_plan *plan, const pa_kv_cache *cache,
                       const pa_batch *batch) {
  return pa_paged_attention(g_ctx, layer, plan, g_query, QW, cache, batch, g_out, QW, g_lse);
}

/* The valid calls the checks start from must work, or the rest means
 * nothing; they run on copies of the outputs. */
static int fixture_works(void) {
  long before = tu_failures;
  float *out = g_out, *lse = g_lse;
  g_out = tu_malloc((ROWS + 1) * QW * sizeof(float));
  g_lse = tu_malloc((ROWS * NH + 4) * sizeof(float));
  pa_kv_cache c = new_cache(PA_F32, NB), c2 = new_cache(PA_F32, NB);
  memcpy(c.key, g_cache.key, hx_cache_bytes(&c));
  memcpy(c.value, g_cache.value, hx_cache_bytes(&c));
  OK(paged(g_layer, NULL, &c, &g_batch));
  OK(pa_varlen_attention(g_ctx, g_layer, g_query, QW, g_krows, KW, g_vrows, KW, 2, g_qsl, g_cu_k,
                         g_out, QW, g_lse));
  OK(pa_write_kv(g_ctx, &c, g_krows, KW, g_vrows, KW, PA_F32, 3, g_slots));
  OK(pa_copy_blocks(g_ctx, &c, 1, g_pairs, 2));
  OK(pa_swap_blocks(g_ctx, &c, &c2, g_pairs, 2));
  pa_plan *plan = NULL;
  OK(pa_plan_create(g_ctx, g_layer, &g_batch, &plan));
  if (plan) {
    OK(paged(g_layer, plan, &c, &g_batch));
    pa_plan_destroy(plan);
  }
  /* Block table entries past ceil(seq_len / block_size) are not read. */
  int32_t bt[2 * BT_STRIDE];
  memcpy(bt, g_bt, sizeof bt);
  bt[2] = bt[3] = bt[7] = 912;
  pa_batch b = g_batch;
  b.block_tables = bt;
  OK(paged(g_layer, NULL, &c, &b));
  free(g_out);
  free(g_lse);
  g_out = out;
  g_lse = lse;
  free(c.key);
  free(c.value);
  free(c2.key);
  free(c2.value);
  return tu_failures == before;
}

/* ---- checks per entry point ---------------------------------------------- */

static void test_context_and_head_size(void) {
  EXPECT(INV, "ctx", pa_context_create(1, NULL));

  /* An unknown PA_ISA is an error at creation; the caller's value comes
   * back afterwards (this test also runs under PA_ISA=scalar). */
  const char *old = getenv("PA_ISA");
  char *saved = old ? strcpy(tu_malloc(strlen(old) + 1), old) : NULL;
  setenv("PA_ISA", "bogus", 1);
  pa_context *ctx = NULL;
  EXPECT(INV, "PA_ISA", pa_context_create(1, &ctx));
  if (ctx) pa_context_destroy(ctx);
  if (saved) {
    setenv("PA_ISA", saved, 1);
    free(saved);
  } else {
    unsetenv("PA_ISA");
  }

  static const int bad[] = {0, -1, 1025, 1 << 30};
  for (int i = 0; i < 4; i++) {
    EXPECT(INV, "head_size", pa_validate_head_size(bad[i]));
    message_has(__LINE__, "1024"); /* "the message lists the supported range" */
  }
}

static void test_layer_create(void) {
  pa_layer *l = NULL;
  pa_layer_config cfg = base_config();
  EXPECT(INV, "config", pa_layer_create(NULL, &l));
  EXPECT(INV, "layer", pa_layer_create(&cfg, NULL));

#define BAD_CONFIG(names, field, val)              \
  do {                                             \
    cfg = base_config();                           \
    cfg.field = val;                               \
    l = NULL;                                      \
    EXPECT(INV, names, pa_layer_create(&cfg, &l)); \
    if (l) pa_layer_destroy(l);                    \
  } while (0)

  BAD_CONFIG("num_heads", num_heads, 0);
  BAD_CONFIG("num_heads", num_heads, -4);
  BAD_CONFIG("num_kv_heads", num_kv_heads, -1);
  BAD_CONFIG("num_kv_heads|num_heads", num_kv_heads, 3); /* 4 heads over 3 */
  BAD_CONFIG("num_kv_heads|num_heads", num_kv_heads, 8); /* more kv heads than heads */
  BAD_CONFIG("head_size", head_size, 0);
  BAD_CONFIG("head_size", head_size, 1025);
  message_has(__LINE__, "1025");
  BAD_CONFIG("head_size", head_size, -16);
  BAD_CONFIG("scale", scale, NAN);
  BAD_CONFIG("scale", scale, INFINITY);
  BAD_CONFIG("scale", scale, -0.125f);
  BAD_CONFIG("sliding_window", sliding_window, -1);
  BAD_CONFIG("logits_soft_cap", logits_soft_cap, NAN);
  BAD_CONFIG("logits_soft_cap", logits_soft_cap, -30.0f);
  BAD_CONFIG("attn_type", attn_type, (pa_attn_type)4);
  BAD_CONFIG("attn_type", attn_type, (pa_attn_type)-1);
  cfg = base_config();
  cfg.dtype = PA_FP8_E4M3;
  l = NULL;
  EXPECT(UNS, "dtype", pa_layer_create(&cfg, &l));
  cfg.dtype = PA_FP8_E5M2;
  EXPECT(UNS, "dtype", pa_layer_create(&cfg, &l));
  if (l) pa_layer_destroy(l);
  BAD_CONFIG("dtype", dtype, (pa_dtype)9);

  float slopes[NH] = {0.5f, 0.25f, NAN, 0.0625f}, sinks[NH] = {0, 1, 2, NAN};
  cfg = base_config();
  cfg.alibi_slopes = slopes;
  EXPECT(INV, "alibi_slopes", pa_layer_create(&cfg, &l));
  cfg = base_config();
  cfg.sinks = sinks;
  EXPECT(INV, "sinks", pa_layer_create(&cfg, &l));
#undef BAD_CONFIG
}

static void test_write_kv(void) {
  pa_kv_cache c;
  const pa_kv_cache *cache = &g_cache;
  const float *k = g_krows, *v = g_vrows;
  EXPECT(INV, "ctx", pa_write_kv(NULL, cache, k, KW, v, KW, PA_F32, 3, g_slots));
  EXPECT(INV, "cache", pa_write_kv(g_ctx, NULL, k, KW, v, KW, PA_F32, 3, g_slots));
  EXPECT(INV, "key", pa_write_kv(g_ctx, cache, NULL, KW, v, KW, PA_F32, 3, g_slots));
  EXPECT(INV, "value", pa_write_kv(g_ctx, cache, k, KW, NULL, KW, PA_F32, 3, g_slots));
  EXPECT(INV, "slot_mapping", pa_write_kv(g_ctx, cache, k, KW, v, KW, PA_F32, 3, NULL));
  EXPECT(INV, "num_tokens", pa_write_kv(g_ctx, cache, k, KW, v, KW, PA_F32, -1, g_slots));
  EXPECT(INV, "key_stride", pa_write_kv(g_ctx, cache, k, KW - 1, v, KW, PA_F32, 3, g_slots));
  EXPECT(INV, "value_stride", pa_write_kv(g_ctx, cache, k, KW, v, 0, PA_F32, 3, g_slots));
  EXPECT(UNS, "dtype", pa_write_kv(g_ctx, cache, k, KW, v, KW, PA_FP8_E4M3, 3, g_slots));
  EXPECT(INV, "dtype", pa_write_kv(g_ctx, cache, k, KW, v, KW, (pa_dtype)7, 3, g_slots));

#define BAD_CACHE(want, names, base, field, val)                                   \
  do {                                                                             \
    c = base;                                                                      \
    c.field = val;                                                                 \
    EXPECT(want, names, pa_write_kv(g_ctx, &c, k, KW, v, KW, PA_F32, 3, g_slots)); \
  } while (0)
  BAD_CACHE(INV, "key", g_cache, key, NULL);
  BAD_CACHE(INV, "value", g_cache, value, NULL);
  BAD_CACHE(INV, "dtype", g_cache, dtype, (pa_dtype)9);
  BAD_CACHE(INV, "block_size", g_cache, block_size, 0);
  BAD_CACHE(INV, "num_kv_heads", g_cache, num_kv_heads, 0);
  BAD_CACHE(INV, "head_size", g_cache, head_size, 0);
  BAD_CACHE(INV, "head_size", g_cache, head_size, 1025);
  BAD_CACHE(INV, "num_blocks", g_cache, num_blocks, -1);
  BAD_CACHE(INV, "k_scale", g_fp8, k_scale, 0.0f);
  BAD_CACHE(INV, "k_scale", g_fp8, k_scale, NAN);
  BAD_CACHE(INV, "k_scale", g_fp8, k_scale, -1.0f);
  BAD_CACHE(INV, "k_scale", g_fp8, k_scale, INFINITY);
  BAD_CACHE(INV, "v_scale", g_fp8, v_scale, NAN);
  BAD_CACHE(INV, "v_scale", g_fp8, v_scale, 0.0f);
  /* The 0.2 strides: a tile is BS * D = 64 elements, a dense block 128. */
  BAD_CACHE(INV, "head_stride", g_cache, head_stride, -1);
  BAD_CACHE(INV, "head_stride", g_cache, head_stride, BS * D - 1);
  message_has(__LINE__, "63");
  message_has(__LINE__, "64");
  BAD_CACHE(INV, "block_stride", g_cache, block_stride, INT64_MIN);
  BAD_CACHE(INV, "block_stride", g_cache, block_stride, NKV * BS * D - 1);
  message_has(__LINE__, "127");
  BAD_CACHE(INV, "block_stride", g_cache, head_stride, 2 * BS * D); /* block_stride 0 */
  c = g_cache;
  c.head_stride = 2 * BS * D;
  c.block_stride = 2 * NKV * BS * D - 1;
  EXPECT(INV, "block_stride", pa_write_kv(g_ctx, &c, k, KW, v, KW, PA_F32, 3, g_slots));
  message_has(__LINE__, "255");
  BAD_CACHE(INV, "block_stride", g_cache, block_stride, INT64_MAX / 4);
#undef BAD_CACHE

  /* A slot past the cache is out of range and nothing is written, not even
   * the tokens before it. */
  int64_t slots[3] = {1, NB * BS, 2};
  EXPECT(OOR, "slot_mapping", pa_write_kv(g_ctx, cache, k, KW, v, KW, PA_F32, 3, slots));
  message_has(__LINE__, "32");
  int64_t huge[3] = {1, 2, INT64_MAX};
  EXPECT(OOR, "slot_mapping", pa_write_kv(g_ctx, cache, k, KW, v, KW, PA_F32, 3, huge));
  int64_t many[KROWS];
  for (int t = 0; t < KROWS; t++) many[t] = t;
  many[KROWS - 1] = 123456;
  EXPECT(OOR, "slot_mapping", pa_write_kv(g_ctx, cache, k, KW, v, KW, PA_F32, KROWS, many));
  message_has(__LINE__, "123456");
  EXPECT(OOR, "slot_mapping", pa_write_kv(g_ctx, &g_fp8, k, KW, v, KW, PA_F32, KROWS, many));
}

static void test_copy_swap(void) {
  pa_kv_cache two[2] = {g_cache, g_cache2};
  int64_t p[2 * 2];
  EXPECT(INV, "ctx", pa_copy_blocks(NULL, two, 2, g_pairs, 2));
  EXPECT(INV, "caches", pa_copy_blocks(g_ctx, NULL, 2, g_pairs, 2));
  EXPECT(INV, "num_caches", pa_copy_blocks(g_ctx, two, -1, g_pairs, 2));
  EXPECT(INV, "block_pairs", pa_copy_blocks(g_ctx, two, 2, NULL, 2));
  EXPECT(INV, "num_pairs", pa_copy_blocks(g_ctx, two, 2, g_pairs, -1));
  static const int64_t bad_ids[][2] = {{-1, 1}, {NB, 1}, {1, NB}, {2, -5}, {912, 0}};
  for (int i = 0; i < 5; i++) {
    /* The bad pair is the last: the good one before it must not happen. */
    int64_t q[4] = {0, 1, bad_ids[i][0], bad_ids[i][1]};
    EXPECT(OOR, "block_pairs", pa_copy_blocks(g_ctx, two, 2, q, 2));
  }
  message_has(__LINE__, "912");
  /* An id valid in the first cache only: the first must not change either. */
  pa_kv_cache small[2] = {g_cache, g_cache2};
  small[1].num_blocks = 4;
  memcpy(p, (int64_t[]){0, 1, 2, 6}, sizeof p);
  EXPECT(OOR, "block_pairs", pa_copy_blocks(g_ctx, small, 2, p, 2));
  pa_kv_cache broken[2] = {g_cache, g_cache2};
  broken[1].value = NULL;
  EXPECT(INV, "value", pa_copy_blocks(g_ctx, broken, 2, g_pairs, 2));
  broken[1] = g_cache2;
  broken[1].block_size = 0;
  EXPECT(INV, "block_size", pa_copy_blocks(g_ctx, broken, 2, g_pairs, 2));
  broken[1] = g_cache2;
  broken[1].head_stride = -BS * D;
  EXPECT(INV, "caches[1]->head_stride", pa_copy_blocks(g_ctx, broken, 2, g_pairs, 2));
  broken[1] = g_cache2;
  broken[1].head_stride = 2 * BS * D;
  broken[1].block_stride = 2 * BS * D; /* one head's worth for two heads */
  EXPECT(INV, "caches[1]->block_stride", pa_copy_blocks(g_ctx, broken, 2, g_pairs, 2));

  const pa_kv_cache *src = &g_cache, *dst = &g_cache2;
  EXPECT(INV, "ctx", pa_swap_blocks(NULL, src, dst, g_pairs, 2));
  EXPECT(INV, "src", pa_swap_blocks(g_ctx, NULL, dst, g_pairs, 2));
  EXPECT(INV, "dst", pa_swap_blocks(g_ctx, src, NULL, g_pairs, 2));
  EXPECT(INV, "block_pairs", pa_swap_blocks(g_ctx, src, dst, NULL, 2));
  EXPECT(INV, "num_pairs", pa_swap_blocks(g_ctx, src, dst, g_pairs, -3));

  /* dst must share the geometry, the dtype and (FP8) the scales; the
   * message names the argument, dst. d is a copy of the source with one
   * field changed that points at g_cache2's memory: watched, and with ROOM
   * to spare for a call that ignores the mismatch. */
  pa_kv_cache d;
  int64_t low_pairs[4] = {0, 0, 1, 1};
#define BAD_DST(names, base_src, field, val)                               \
  do {                                                                     \
    d = *(base_src);                                                       \
    d.key = g_cache2.key;                                                  \
    d.value = g_cache2.value;                                              \
    d.field = val;                                                         \
    EXPECT(INV, names, pa_swap_blocks(g_ctx, base_src, &d, low_pairs, 2)); \
  } while (0)
  BAD_DST("dst", src, block_size, 2 * BS);
  BAD_DST("dst", src, num_kv_heads, 1);
  BAD_DST("dst", src, head_size, 8);
  BAD_DST("dst", src, dtype, PA_BF16);
  BAD_DST("dst", &g_fp8, k_scale, 0.75f);
  BAD_DST("dst", &g_fp8, v_scale, 1.0f);
  BAD_DST("dst->head_stride", src, head_stride, -1);
  BAD_DST("dst->block_stride", src, block_stride, 1);
  BAD_DST("dst->block_stride", src, block_stride, INT64_MAX / 2);
#undef BAD_DST
  d = g_cache;
  d.head_stride = 1;
  EXPECT(INV, "src->head_stride", pa_swap_blocks(g_ctx, &d, dst, low_pairs, 2));

  /* Ids: the source's against the source, the destination's against the
   * destination, whose num_blocks may differ (little: g_cache2's memory
   * declared as 3 blocks). */
  pa_kv_cache little = g_cache2;
  little.num_blocks = 3;
  memcpy(p, (int64_t[]){0, 1, NB, 2}, sizeof p);
  EXPECT(OOR, "block_pairs", pa_swap_blocks(g_ctx, src, dst, p, 2));
  memcpy(p, (int64_t[]){0, 1, 5, 3}, sizeof p);
  EXPECT(OOR, "block_pairs", pa_swap_blocks(g_ctx, src, &little, p, 2));
  memcpy(p, (int64_t[]){0, 1, 2, -1}, sizeof p);
  EXPECT(OOR, "block_pairs", pa_swap_blocks(g_ctx, src, dst, p, 2));
  memcpy(p, (int64_t[]){0, 1, 7, 2}, sizeof p); /* 7 fits the source, 2 the destination */
  OK(pa_swap_blocks(g_ctx, src, &little, p, 2));
  snapshot();
}

/* Variants of the fixture's batch; each breaks one field. */
typedef struct batch_copy {
  int32_t qsl[3], seq_lens[2], bt[2 * BT_STRIDE];
  pa_batch b;
} batch_copy;

static void copy_batch(batch_copy *bc) {
  memcpy(bc->qsl, g_qsl, sizeof g_qsl);
  memcpy(bc->seq_lens, g_seq_lens, sizeof g_seq_lens);
  memcpy(bc->bt, g_bt, sizeof g_bt);
  bc->b = (pa_batch){2, bc->qsl, bc->seq_lens, bc->bt, BT_STRIDE};
}

static void test_plan_create(void) {
  pa_plan *plan = NULL;
  batch_copy bc;
  EXPECT(INV, "ctx", pa_plan_create(NULL, g_layer, &g_batch, &plan));
  EXPECT(INV, "layer", pa_plan_create(g_ctx, NULL, &g_batch, &plan));
  EXPECT(INV, "batch", pa_plan_create(g_ctx, g_layer, NULL, &plan));
  EXPECT(INV, "plan", pa_plan_create(g_ctx, g_layer, &g_batch, NULL));
  copy_batch(&bc);
  bc.b.num_seqs = -1;
  EXPECT(INV, "num_seqs", pa_plan_create(g_ctx, g_layer, &bc.b, &plan));
  copy_batch(&bc);
  bc.b.query_start_loc = NULL;
  EXPECT(INV, "query_start_loc", pa_plan_create(g_ctx, g_layer, &bc.b, &plan));
  copy_batch(&bc);
  bc.b.seq_lens = NULL;
  EXPECT(INV, "seq_lens", pa_plan_create(g_ctx, g_layer, &bc.b, &plan));
  copy_batch(&bc);
  bc.qsl[0] = 1;
  EXPECT(INV, "query_start_loc", pa_plan_create(g_ctx, g_layer, &bc.b, &plan));
  copy_batch(&bc);
  bc.qsl[2] = 2; /* decreasing */
  EXPECT(INV, "query_start_loc", pa_plan_create(g_ctx, g_layer, &bc.b, &plan));
  copy_batch(&bc);
  bc.seq_lens[1] = -1;
  EXPECT(INV, "seq_lens", pa_plan_create(g_ctx, g_layer, &bc.b, &plan));
  copy_batch(&bc);
  bc.seq_lens[0] = 2; /* decoder: q_len 3 > seq_len 2 */
  EXPECT(INV, "seq_lens|query_start_loc", pa_plan_create(g_ctx, g_layer, &bc.b, &plan));
}

static void test_paged_attention(void) {
  const pa_kv_cache *cache = &g_cache;
  batch_copy bc;
  EXPECT(INV, "ctx",
         pa_paged_attention(NULL, g_layer, NULL, g_query, QW, cache, &g_batch, g_out, QW, g_lse));
  EXPECT(INV, "layer",
         pa_paged_attention(g_ctx, NULL, NULL, g_query, QW, cache, &g_batch, g_out, QW, g_lse));
  EXPECT(INV, "query",
         pa_paged_attention(g_ctx, g_layer, NULL, NULL, QW, cache, &g_batch, g_out, QW, g_lse));
  EXPECT(INV, "cache",
         pa_paged_attention(g_ctx, g_layer, NULL, g_query, QW, NULL, &g_batch, g_out, QW, g_lse));
  EXPECT(INV, "batch",
         pa_paged_attention(g_ctx, g_layer, NULL, g_query, QW, cache, NULL, g_out, QW, g_lse));
  EXPECT(INV, "out",
         pa_paged_attention(g_ctx, g_layer, NULL, g_query, QW, cache, &g_batch, NULL, QW, g_lse));
  EXPECT(
      INV, "query_stride",
      pa_paged_attention(g_ctx, g_layer, NULL, g_query, QW - 1, cache, &g_batch, g_out, QW, g_lse));
  EXPECT(INV, "out_stride",
         pa_paged_attention(g_ctx, g_layer, NULL, g_query, QW, cache, &g_batch, g_out, D, g_lse));

  /* The batch, one field at a time. */
#define BAD_BATCH(want, names, edit)                         \
  do {                                                       \
    copy_batch(&bc);                                         \
    edit;                                                    \
    EXPECT(want, names, paged(g_layer, NULL, cache, &bc.b)); \
  } while (0)
  BAD_BATCH(INV, "num_seqs", bc.b.num_seqs = -1);
  BAD_BATCH(INV, "query_start_loc", bc.b.query_start_loc = NULL);
  BAD_BATCH(INV, "seq_lens", bc.b.seq_lens = NULL);
  BAD_BATCH(INV, "block_tables", bc.b.block_tables = NULL);
  BAD_BATCH(INV, "query_start_loc", bc.qsl[0] = 1);
  BAD_BATCH(INV, "query_start_loc", bc.qsl[0] = -1);
  BAD_BATCH(INV, "query_start_loc", bc.qsl[2] = 2);
  BAD_BATCH(INV, "seq_lens", bc.seq_lens[0] = -6);
  BAD_BATCH(INV, "seq_lens|query_start_loc", bc.seq_lens[0] = 2); /* q_len 3 > seq_len 2 */
  BAD_BATCH(INV, "block_table_stride", bc.b.block_table_stride = -1);
  /* 17 tokens need 5 blocks of 4; the row holds 4. */
  BAD_BATCH(OOR, "seq_lens|block_table", bc.seq_lens[1] = BT_STRIDE * BS + 1);
  BAD_BATCH(OOR, "seq_lens|block_table", bc.b.block_table_stride = 1);
  BAD_BATCH(OOR, "block_tables", bc.bt[1] = NB);
  BAD_BATCH(OOR, "block_tables", bc.bt[BT_STRIDE] = -1);
  BAD_BATCH(OOR, "block_tables", bc.bt[BT_STRIDE + 2] = 912); /* the last block seq 1 needs */
  message_has(__LINE__, "912");
#undef BAD_BATCH

  /* The cache against the layer and itself. */
  pa_kv_cache c;
#define BAD_CACHE(want, names, base, field, val)             \
  do {                                                       \
    c = base;                                                \
    c.field = val;                                           \
    EXPECT(want, names, paged(g_layer, NULL, &c, &g_batch)); \
  } while (0)
  BAD_CACHE(INV, "key", g_cache, key, NULL);
  BAD_CACHE(INV, "value", g_cache, value, NULL);
  BAD_CACHE(INV, "num_kv_heads", g_cache, num_kv_heads, 1);
  BAD_CACHE(INV, "num_kv_heads", g_cache, num_kv_heads, NH);
  BAD_CACHE(INV, "head_size", g_cache, head_size, D / 2);
  BAD_CACHE(INV, "dtype", g_cache, dtype, (pa_dtype)9);
  BAD_CACHE(INV, "block_size", g_cache, block_size, 0);
  BAD_CACHE(INV, "num_blocks", g_cache, num_blocks, -1);
  BAD_CACHE(INV, "k_scale", g_fp8, k_scale, 0.0f);
  BAD_CACHE(INV, "k_scale", g_fp8, k_scale, NAN);
  BAD_CACHE(INV, "v_scale", g_fp8, v_scale, INFINITY);
  BAD_CACHE(INV, "v_scale", g_fp8, v_scale, -0.25f);
  BAD_CACHE(INV, "head_stride", g_cache, head_stride, -2);
  BAD_CACHE(INV, "head_stride", g_cache, head_stride, 1);
  BAD_CACHE(INV, "block_stride", g_cache, block_stride, -3);
  BAD_CACHE(INV, "block_stride", g_cache, block_stride, NKV * BS * D / 2);
  BAD_CACHE(INV, "block_stride", g_cache, head_stride, 3 * BS * D);
  BAD_CACHE(INV, "head_stride", g_cache, head_stride, INT64_MAX);
#undef BAD_CACHE
}

/* The strides of a valid layout are accepted everywhere: vLLM's, one buffer
 * with each head's key tile followed by its value tile (g_cache's memory
 * has room to spare). */
static void test_valid_strides(void) {
  pa_kv_cache c = g_cache, d = g_cache2;
  c.value = (float *)c.key + BS * D;
  c.head_stride = 2 * BS * D;
  c.block_stride = NKV * c.head_stride;
  OK(pa_write_kv(g_ctx, &c, g_krows, KW, g_vrows, KW, PA_F32, 3, g_slots));
  OK(pa_copy_blocks(g_ctx, &c, 1, g_pairs, 2));
  OK(pa_swap_blocks(g_ctx, &c, &d, g_pairs, 2));
  OK(pa_swap_blocks(g_ctx, &d, &c, g_pairs, 2));
  OK(paged(g_layer, NULL, &c, &g_batch));
  /* One block: its block stride is never stepped, any value past the
   * heads will do. */
  c.num_blocks = 1;
  c.block_stride = INT64_MAX;
  int64_t slot0[3] = {0, 1, -1};
  OK(pa_write_kv(g_ctx, &c, g_krows, KW, g_vrows, KW, PA_F32, 3, slot0));
  snapshot();
}

/* 0.3's layout: PA_KV_TILED is served where block_size and head_size are
 * multiples of 16 (valid calls of every entry point over tiled caches
 * first); otherwise PA_ERR_UNSUPPORTED, with a message that names the
 * layout, block_size and head_size and their values; a layout outside the
 * enum is PA_ERR_INVALID_ARGUMENT; a swap between layouts is refused. The
 * failing calls address g_cache's and g_cache2's watched memory. */
static void test_tiled_layout(void) {
  enum { TBS = 16 };
  pa_kv_cache t = g_cache, t2 = g_cache2;
  t.block_size = t2.block_size = TBS;
  t.layout = t2.layout = PA_KV_TILED;
  t.key = tu_calloc(1, hx_cache_bytes(&t));
  t.value = tu_calloc(1, hx_cache_bytes(&t));
  t2.key = tu_calloc(1, 2 * hx_cache_bytes(&t2));
  t2.value = (char *)t2.key + (size_t)TBS * D * sizeof(float); /* vLLM's page */
  t2.head_stride = 2 * TBS * D;
  t2.block_stride = NKV * t2.head_stride;
  float out[(ROWS + 1) * QW], lse[ROWS * NH + 4];
  OK(pa_write_kv(g_ctx, &t, g_krows, KW, g_vrows, KW, PA_F32, 3, g_slots));
  OK(pa_copy_blocks(g_ctx, &t, 1, g_pairs, 2));
  OK(pa_swap_blocks(g_ctx, &t, &t2, g_pairs, 2));
  OK(pa_swap_blocks(g_ctx, &t2, &t, g_pairs, 2));
  OK(pa_validate_paged_attention(g_ctx, g_layer, NULL, g_query, QW, &t, &g_batch, out, QW));
  OK(pa_paged_attention(g_ctx, g_layer, NULL, g_query, QW, &t, &g_batch, out, QW, lse));
  OK(pa_paged_attention(g_ctx, g_layer, NULL, g_query, QW, &t2, &g_batch, out, QW, lse));
  free(t.key);
  free(t.value);
  free(t2.key);

  /* The same geometry over the watched memory, broken one field at a time. */
  t = g_cache;
  t.block_size = TBS;
  t.layout = PA_KV_TILED;
  const float *k = g_krows, *v = g_vrows;
  static const struct {
    int block_size, head_size;
    const char *values;
  } off[] = {{17, D, "17"}, {8, D, "8"}, {BS, D, "4"}, {TBS, 40, "40"}, {TBS, 8, "8"}};
  for (int i = 0; i < 5; i++) {
    pa_kv_cache c = t;
    c.block_size = off[i].block_size;
    c.head_size = off[i].head_size;
    int64_t stride = NKV * (int64_t)c.head_size > KW ? NKV * (int64_t)c.head_size : KW;
    EXPECT(UNS, "layout", pa_write_kv(g_ctx, &c, k, stride, v, stride, PA_F32, 3, g_slots));
    message_has(__LINE__, "block_size");
    message_has(__LINE__, "head_size");
    message_has(__LINE__, off[i].values);
    EXPECT(UNS, "layout", pa_copy_blocks(g_ctx, &c, 1, g_pairs, 2));
    message_has(__LINE__, "block_size");
    message_has(__LINE__, "head_size");
    pa_kv_cache d = c;
    d.key = g_cache2.key;
    d.value = g_cache2.value;
    EXPECT(UNS, "layout", pa_swap_blocks(g_ctx, &c, &d, g_pairs, 2));
    message_has(__LINE__, off[i].values);
    if (c.head_size != D) continue; /* attention: the layer's head size */
    EXPECT(UNS, "layout", paged(g_layer, NULL, &c, &g_batch));
    message_has(__LINE__, "block_size");
    message_has(__LINE__, "head_size");
    message_has(__LINE__, off[i].values);
    EXPECT(UNS, "layout",
           pa_validate_paged_attention(g_ctx, g_layer, NULL, g_query, QW, &c, &g_batch, g_out, QW));
  }

  /* Values outside the enum. */
  static const int bad[] = {2, -1, 1000};
  for (int i = 0; i < 3; i++) {
    pa_kv_cache c = g_cache;
    c.layout = (pa_kv_layout)bad[i];
    char value[16];
    snprintf(value, sizeof value, "%d", bad[i]);
    EXPECT(INV, "layout", pa_write_kv(g_ctx, &c, k, KW, v, KW, PA_F32, 3, g_slots));
    message_has(__LINE__, value);
    EXPECT(INV, "layout", paged(g_layer, NULL, &c, &g_batch));
    message_has(__LINE__, value);
    EXPECT(INV, "layout",
           pa_validate_paged_attention(g_ctx, g_layer, NULL, g_query, QW, &c, &g_batch, g_out, QW));
    pa_kv_cache two[2] = {g_cache, c};
    two[1].key = g_cache2.key;
    two[1].value = g_cache2.value;
    EXPECT(INV, "caches[1]->layout", pa_copy_blocks(g_ctx, two, 2, g_pairs, 2));
    EXPECT(INV, "src->layout", pa_swap_blocks(g_ctx, &c, &g_cache2, g_pairs, 2));
    pa_kv_cache d = c;
    d.key = g_cache2.key;
    d.value = g_cache2.value;
    EXPECT(INV, "dst->layout", pa_swap_blocks(g_ctx, &g_cache, &d, g_pairs, 2));
  }

  /* Blocks are swapped as stored: rows to tiled and back are refused. */
  pa_kv_cache rows = g_cache, tiled = g_cache2;
  rows.block_size = tiled.block_size = TBS;
  tiled.layout = PA_KV_TILED;
  EXPECT(INV, "layout", pa_swap_blocks(g_ctx, &rows, &tiled, g_pairs, 2));
  message_has(__LINE__, "dst");
  tiled.key = g_cache.key;
  tiled.value = g_cache.value;
  rows.key = g_cache2.key;
  rows.value = g_cache2.value;
  EXPECT(INV, "layout", pa_swap_blocks(g_ctx, &tiled, &rows, g_pairs, 2));
  snapshot();
}

static void test_merge_states(void) {
  float la[ROWS * NH], lb[ROWS * NH];
  for (int i = 0; i < ROWS * NH; i++) la[i] = lb[i] = 0.5f * (float)(i % 3);
  const float *A = g_query, *B = g_krows;
#define MERGE(ctx, rows, heads, hs, t, a, as, lsa, b, bs, lsb, o, os) \
  pa_merge_states(ctx, rows, heads, hs, t, a, as, lsa, b, bs, lsb, o, os, g_lse)
  OK(MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, la, B, QW, lb, g_out, QW));
  snapshot();
  EXPECT(INV, "ctx", MERGE(NULL, ROWS, NH, D, PA_F32, A, QW, la, B, QW, lb, g_out, QW));
  EXPECT(INV, "num_rows", MERGE(g_ctx, -1, NH, D, PA_F32, A, QW, la, B, QW, lb, g_out, QW));
  EXPECT(INV, "num_heads", MERGE(g_ctx, ROWS, 0, D, PA_F32, A, QW, la, B, QW, lb, g_out, QW));
  EXPECT(INV, "head_size", MERGE(g_ctx, ROWS, NH, 0, PA_F32, A, QW, la, B, QW, lb, g_out, QW));
  EXPECT(INV, "head_size", MERGE(g_ctx, ROWS, NH, 1025, PA_F32, A, QW, la, B, QW, lb, g_out, QW));
  message_has(__LINE__, "1025");
  EXPECT(UNS, "dtype", MERGE(g_ctx, ROWS, NH, D, PA_FP8_E5M2, A, QW, la, B, QW, lb, g_out, QW));
  EXPECT(INV, "dtype", MERGE(g_ctx, ROWS, NH, D, (pa_dtype)-1, A, QW, la, B, QW, lb, g_out, QW));
  EXPECT(INV, "out_a", MERGE(g_ctx, ROWS, NH, D, PA_F32, NULL, QW, la, B, QW, lb, g_out, QW));
  EXPECT(INV, "lse_a", MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, NULL, B, QW, lb, g_out, QW));
  EXPECT(INV, "out_b", MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, la, NULL, QW, lb, g_out, QW));
  EXPECT(INV, "lse_b", MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, la, B, QW, NULL, g_out, QW));
  EXPECT(INV, "out", MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, la, B, QW, lb, NULL, QW));
  EXPECT(INV, "a_stride", MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW - 1, la, B, QW, lb, g_out, QW));
  message_has(__LINE__, "63");
  EXPECT(INV, "b_stride", MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, la, B, 0, lb, g_out, QW));
  EXPECT(INV, "out_stride", MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, la, B, QW, lb, g_out, -QW));
  EXPECT(INV, "out_stride",
         MERGE(g_ctx, ROWS, NH, D, PA_F32, A, QW, la, B, QW, lb, g_out, INT64_MAX / 2));
  /* No rows: nothing to look at, not even the tensors. */
  OK(MERGE(g_ctx, 0, NH, D, PA_F32, NULL, 0, NULL, NULL, 0, NULL, NULL, 0));
#undef MERGE
}

/* A plan serves one geometry and one set of lengths; anything else is an
 * error, not a wrong answer. */
static void test_plan_mismatch(void) {
  pa_plan *plan = NULL;
  OK(pa_plan_create(g_ctx, g_layer, &g_batch, &plan));
  if (!plan) return;
  batch_copy bc;
  copy_batch(&bc);
  bc.seq_lens[1] = 10;
  EXPECT(INV, "plan", paged(g_layer, plan, &g_cache, &bc.b));
  copy_batch(&bc);
  bc.qsl[1] = 2; /* same rows in all, split differently */
  EXPECT(INV, "plan", paged(g_layer, plan, &g_cache, &bc.b));
  copy_batch(&bc);
  bc.b.num_seqs = 1;
  EXPECT(INV, "plan", paged(g_layer, plan, &g_cache, &bc.b));

  static const int geometry[][3] = {{2 * NH, NKV, D}, {NH, NH, D}, {NH, NKV, 2 * D}};
  for (int i = 0; i < 3; i++) {
    pa_layer_config cfg = base_config();
    cfg.num_heads = geometry[i][0];
    cfg.num_kv_heads = geometry[i][1];
    cfg.head_size = geometry[i][2];
    pa_layer *other = NULL;
    OK(pa_layer_create(&cfg, &other));
    if (!other) continue;
    /* A plan of the other geometry used with the fixture's layer. */
    pa_plan *p2 = NULL;
    OK(pa_plan_create(g_ctx, other, &g_batch, &p2));
    if (p2) {
      EXPECT(INV, "plan", paged(g_layer, p2, &g_cache, &g_batch));
      pa_plan_destroy(p2);
    }
    pa_layer_destroy(other);
  }
  pa_plan_destroy(plan);
}

static void test_varlen(void) {
  int32_t q[3], k[3];
  const float *Q = g_query, *K = g_krows, *V = g_vrows;
#define VARLEN(ctx, layer, qp, qs, kp, ks, vp, vs, n, cq, ck, op, os) \
  pa_varlen_attention(ctx, layer, qp, qs, kp, ks, vp, vs, n, cq, ck, op, os, g_lse)
  EXPECT(INV, "ctx", VARLEN(NULL, g_layer, Q, QW, K, KW, V, KW, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "layer", VARLEN(g_ctx, NULL, Q, QW, K, KW, V, KW, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "query", VARLEN(g_ctx, g_layer, NULL, QW, K, KW, V, KW, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "key", VARLEN(g_ctx, g_layer, Q, QW, NULL, KW, V, KW, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "value", VARLEN(g_ctx, g_layer, Q, QW, K, KW, NULL, KW, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "out", VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, g_qsl, g_cu_k, NULL, QW));
  EXPECT(INV, "cu_seqlens_q",
         VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, NULL, g_cu_k, g_out, QW));
  EXPECT(INV, "cu_seqlens_k",
         VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, g_qsl, NULL, g_out, QW));
  EXPECT(INV, "num_seqs",
         VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, -1, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "query_stride",
         VARLEN(g_ctx, g_layer, Q, 1, K, KW, V, KW, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "key_stride",
         VARLEN(g_ctx, g_layer, Q, QW, K, KW - 1, V, KW, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "value_stride",
         VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, -1, 2, g_qsl, g_cu_k, g_out, QW));
  EXPECT(INV, "out_stride",
         VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, g_qsl, g_cu_k, g_out, 0));
  memcpy(q, (int32_t[]){1, 3, 4}, sizeof q);
  EXPECT(INV, "cu_seqlens_q", VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, q, g_cu_k, g_out, QW));
  memcpy(q, (int32_t[]){0, 3, 1}, sizeof q);
  EXPECT(INV, "cu_seqlens_q", VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, q, g_cu_k, g_out, QW));
  memcpy(k, (int32_t[]){2, 6, 15}, sizeof k);
  EXPECT(INV, "cu_seqlens_k", VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, g_qsl, k, g_out, QW));
  memcpy(k, (int32_t[]){0, 9, 6}, sizeof k);
  EXPECT(INV, "cu_seqlens_k", VARLEN(g_ctx, g_layer, Q, QW, K, KW, V, KW, 2, g_qsl, k, g_out, QW));
#undef VARLEN
}

/* pa_last_error is per thread: a failure elsewhere leaves this thread's
 * message alone, and a thread without failures reads "". */
static void *other_thread(void *arg) {
  const char *before = pa_last_error();
  int *clean = arg;
  *clean = before && *before == '\0';
  (void)pa_validate_head_size(4096);
  return NULL;
}

static void test_thread_local_errors(void) {
  (void)pa_layer_create(NULL, NULL);
  char mine[512];
  snprintf(mine, sizeof mine, "%s", pa_last_error());
  int clean = 0;
  pthread_t t;
  if (pthread_create(&t, NULL, other_thread, &clean) != 0) return;
  pthread_join(t, NULL);
  TU_CHECK(clean, "a new thread's pa_last_error is not empty");
  TU_CHECK(strcmp(mine, pa_last_error()) == 0, "another thread's failure changed this one's: %s",
           pa_last_error());
  /* A later success does not clear it. */
  TU_CHECK(pa_validate_head_size(64) == PA_OK, "pa_validate_head_size(64)");
  TU_CHECK(strcmp(mine, pa_last_error()) == 0, "a success changed pa_last_error");
}

int main(void) {
  const char *first = pa_last_error();
  TU_CHECK(first && *first == '\0', "pa_last_error before any failure: \"%s\"",
           first ? first : "(null)");
  setup();
  printf("test_errors: isa %s\n", pa_context_isa(g_ctx));
  if (!fixture_works()) {
    fprintf(stderr, "the valid fixture calls fail; the error checks would mean nothing\n");
    return tu_finish("test_errors");
  }
  snapshot();
  test_context_and_head_size();
  test_layer_create();
  test_write_kv();
  test_copy_swap();
  test_plan_create();
  test_paged_attention();
  test_valid_strides();
  test_tiled_layout();
  test_merge_states();
  test_plan_mismatch();
  test_varlen();
  test_thread_local_errors();
  pa_layer_destroy(g_layer);
  pa_context_destroy(g_ctx);
  return tu_finish("test_errors");
}
