/* pagedattn-kernel-bench: the decode micro-kernels alone, as the attention loop calls them for
 * one tile (Q K^T per KV head, one softmax for all rows, P V per KV head), with K and V resident
 * in L2. Each figure is the time per key and KV head next to the time this machine's memory
 * needs to deliver that key's K and V bytes at the streaming-read bandwidth measured in the same
 * process: a loop slower than that cannot run decode at memory speed whatever the prefetching.
 *
 * The next tile's prefetch requests are issued as the library issues them, to one of three
 * targets: none (the kernels alone), lines already in L2/L3 (the cost of issuing them), or a
 * buffer far beyond the L3 walked in order (the cost of requests that go to DRAM). A fourth
 * row, stream, reads K and V themselves from DRAM: a paged cache of 2 x 512 MiB walked tile
 * by tile, each tile requesting the next (the decode loop without the framework around it).
 * Internal tool: it includes the library's private headers (src/). */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "kernels/prefetch.h"
#include "kernels_prefill.h"
#include "roofline.h"
#include "util.h"

enum { KV_HEADS = 8, LDS = PA_PACK_KEYS };
/* Query rows per KV head: Llama-3-8B's 32 / 8 heads unless --rows says otherwise. */
static size_t rows_per_head = 4;
enum { TARGET_NONE, TARGET_CACHED, TARGET_DRAM, NUM_TARGETS };
static const char *const target_names[NUM_TARGETS] = {"none", "cached", "dram"};

typedef struct kernel_case {
  const char *name;
  pa_dtype act, cache;
  size_t head_size, keys; /* keys per tile, as the decode loop picks them */
} kernel_case;

static const kernel_case cases[] = {
    {"bf16", PA_BF16, PA_BF16, 128, 32},
    {"f16", PA_F16, PA_F16, 128, 32},
    {"fp8_e4m3", PA_BF16, PA_FP8_E4M3, 128, 64},
    {"fp8_e5m2", PA_BF16, PA_FP8_E5M2, 128, 64},
    {"f32", PA_F32, PA_F32, 128, 16},
    {"bf16_hs64", PA_BF16, PA_BF16, 64, 64},
    {"bf16_hs96", PA_BF16, PA_BF16, 96, 48},
    {"bf16_hs256", PA_BF16, PA_BF16, 256, 16},
    /* The same shapes at other tile lengths: what a tile costs apart from
     * its keys (docs/decode-memory.md, "Fixed costs of a tile"). */
    {"bf16_k16", PA_BF16, PA_BF16, 128, 16},
    {"bf16_k64", PA_BF16, PA_BF16, 128, 64},
    {"hs256_k32", PA_BF16, PA_BF16, 256, 32},
};

typedef struct prefetch_target {
  char *base;
  size_t bytes, at; /* the walk's position */
} prefetch_target;

typedef struct phase_times {
  double qk, softmax, pv; /* seconds, summed over the timed reps */
} phase_times;

/* What a tile's kernel calls work on besides K and V: Q for every row (loaded as the case's
 * kernels take it), S, O, the softmax state, and one row pointer per key and KV head. */
typedef struct tile_state {
  const pa_kernels *k;
  const pa_attn_ops *ops;
  size_t d, n, ldq;
  char *q;
  float *s, *o, *row_max, *row_sum, *rescale;
  const void **k_rows, **v_rows; /* [KV_HEADS * n] */
} tile_state;

static tile_state tile_state_new(const pa_kernels *k, const kernel_case *c) {
  tile_state st = {.k = k, .ops = &k->attn[c->act][c->cache], .d = c->head_size, .n = c->keys};
  size_t rows = (size_t)KV_HEADS * rows_per_head;
  st.ldq = (st.d + 63) / 64 * 64;
  float *q_f32 = pab_xcalloc(rows * st.ldq, sizeof(float));
  st.q = pab_xcalloc(rows * st.ldq, 4);
  st.s = pab_xcalloc(rows * LDS, sizeof(float));
  st.o = pab_xcalloc(rows * st.d, sizeof(float));
  st.row_max = pab_xcalloc(rows, sizeof(float));
  st.row_sum = pab_xcalloc(rows, sizeof(float));
  st.rescale = pab_xcalloc(rows, sizeof(float));
  st.k_rows = pab_xcalloc(KV_HEADS * st.n, sizeof(void *));
  st.v_rows = pab_xcalloc(KV_HEADS * st.n, sizeof(void *));
  pab_rng rng = {42};
  for (size_t i = 0; i < rows * st.ldq; i++) q_f32[i] = (float)(pab_rng_next(&rng) % 100) / 50 - 1;
  /* Q as the activation dtype holds it, then loaded as the kernels take it. */
  char *q_act = pab_xcalloc(st.ldq, pa_dtype_size(c->act));
  for (size_t r = 0; r < rows; r++) {
    k->store_row[c->act](q_act, q_f32 + r * st.ldq, st.d, 1.0f);
    st.ops->load_q(st.q + r * st.ldq * st.ops->q_size, q_act, st.d, 0.1f);
  }
  free(q_act);
  free(q_f32);
  return st;
}

/* Every row's softmax starts afresh (no key seen). */
static void tile_state_restart(tile_state *st) {
  for (size_t r = 0; r < (size_t)KV_HEADS * rows_per_head; r++) {
    st->row_max[r] = -INFINITY;
    st->row_sum[r] = 0.0f;
  }
}

static void tile_state_free(tile_state *st) {
  free(st->q), free(st->s), free(st->o), free(st->row_max), free(st->row_sum), free(st->rescale);
  free(st->k_rows), free(st->v_rows);
}

/* One tile's kernel calls as the decode loop makes them (Q K^T per KV head, one softmax for
 * all rows, P V per KV head), each call taking its share `budget` of `ahead`'s requests (none
 * when `ahead` is NULL); the phases' times are added to *t. */
static void run_tile(const tile_state *st, pa_prefetch *ahead, size_t budget, phase_times *t) {
  const pa_attn_ops *ops = st->ops;
  size_t d = st->d, n = st->n, ldq = st->ldq, rows = (size_t)KV_HEADS * rows_per_head;
  double t0 = pab_now();
  for (size_t h = 0; h < KV_HEADS; h++) {
    if (ahead) pa_prefetch_begin(ahead, budget);
    ops->qk(rows_per_head, n, d, st->q + h * rows_per_head * ldq * ops->q_size, ldq,
            st->k_rows + h * n, st->s + h * rows_per_head * LDS, LDS, ahead);
  }
  double t1 = pab_now();
  pa_softmax_tile tile = {.m = rows,
                          .n = n,
                          .score_scale = ops->scale_scores ? 0.1f : 1.0f,
                          .row_max = st->row_max,
                          .row_sum = st->row_sum,
                          .rescale = st->rescale,
                          .bf16_weights = ops->p_bf16};
  st->k->softmax(&tile, st->s, LDS);
  double t2 = pab_now();
  for (size_t h = 0; h < KV_HEADS; h++) {
    if (ahead) pa_prefetch_begin(ahead, budget);
    ops->pv(rows_per_head, n, d, st->s + h * rows_per_head * LDS, LDS, st->v_rows + h * n,
            st->o + h * rows_per_head * d, d, st->rescale + h * rows_per_head, ahead);
  }
  double t3 = pab_now();
  t->qk += t1 - t0;
  t->softmax += t2 - t1;
  t->pv += t3 - t2;
}

/* A kernel call's share of requests for `bytes` of K and V, as attend.c splits them. */
static size_t call_budget(size_t bytes) {
  return (bytes / PA_CACHE_LINE + 2 * KV_HEADS - 1) / (2 * KV_HEADS);
}

/* One tile's kernel calls, `reps` times (after a warm-up); the next tile's requests (the same
 * bytes as the tile's K and V) are taken from `target` when it is set. */
static phase_times time_tile(const pa_kernels *k, const kernel_case *c, prefetch_target *target,
                             int reps) {
  tile_state st = tile_state_new(k, c);
  size_t row_bytes = c->head_size * pa_dtype_size(c->cache);
  size_t tile_bytes = KV_HEADS * c->keys * row_bytes; /* K, and as much V */
  char *kv = pab_big_alloc(2 * tile_bytes);
  if (!kv) pab_die("out of memory for the tile");
  pab_rng rng = {43};
  /* Bytes 0x30-0x3b: small normal values of every cache dtype. Denormals
   * (which K and V of a model do not hold) would cost the FMA kernels a
   * microcode assist per product and time that instead. */
  for (size_t i = 0; i < 2 * tile_bytes; i++) kv[i] = (char)(0x30 | (pab_rng_next(&rng) & 0x0b));
  for (size_t j = 0; j < KV_HEADS * c->keys; j++) {
    st.k_rows[j] = kv + j * row_bytes;
    st.v_rows[j] = kv + tile_bytes + j * row_bytes;
  }
  const char *range_start[1];
  size_t range_bytes[1] = {2 * tile_bytes};
  phase_times t = {0, 0, 0}, warm_up = {0, 0, 0};
  for (int rep = -reps / 4; rep < reps; rep++) { /* negative: warm-up */
    pa_prefetch ahead = {
        .start = range_start, .bytes = range_bytes, .count = 1, .to_l2 = k->prefetch_to_l2};
    if (target) {
      if (target->at + range_bytes[0] > target->bytes) target->at = 0;
      range_start[0] = target->base + target->at;
      target->at += range_bytes[0];
    }
    tile_state_restart(&st);
    run_tile(&st, target ? &ahead : NULL, call_budget(2 * tile_bytes), rep >= 0 ? &t : &warm_up);
  }
  pab_big_free(kv);
  tile_state_free(&st);
  return t;
}

/* The kernel calls of time_tile over a paged cache of `region` bytes per side, far beyond the
 * L3 ([block][KV head][16 keys][row], blocks in order), one tile after another, each tile's
 * calls requesting the next tile's K and V runs. Returns the phases summed over the tiles of
 * the fastest of `passes` walks (a shared machine's other tenants slow some of them by half);
 * *keys gets the keys per KV head of one walk. */
static phase_times time_stream(const pa_kernels *k, const kernel_case *c, size_t region, int passes,
                               double *keys) {
  tile_state st = tile_state_new(k, c);
  size_t n = c->keys, row_bytes = c->head_size * pa_dtype_size(c->cache);
  /* Every case's tile is whole 16-key blocks. */
  size_t block_bytes = KV_HEADS * 16 * row_bytes, tile_bytes = (n / 16) * block_bytes;
  size_t tiles = region / tile_bytes - 1;
  char *key = pab_big_alloc(region), *value = pab_big_alloc(region);
  if (!key || !value) pab_die("out of memory for the streamed cache");
  memset(key, 0x11, region); /* small values of every dtype */
  memset(value, 0x11, region);
  tile_state_restart(&st);
  const char *range_start[2];
  size_t range_bytes[2] = {tile_bytes, tile_bytes};
  phase_times best = {0, 0, 0};
  for (int pass = 0; pass < passes; pass++) {
    phase_times t = {0, 0, 0};
    for (size_t tile = 0; tile < tiles; tile++) {
      size_t at = tile * tile_bytes;
      for (size_t h = 0; h < KV_HEADS; h++) {
        for (size_t j = 0; j < n; j++) {
          size_t offset = at + (j / 16) * block_bytes + (h * 16 + j % 16) * row_bytes;
          st.k_rows[h * n + j] = key + offset;
          st.v_rows[h * n + j] = value + offset;
        }
      }
      range_start[0] = key + at + tile_bytes;
      range_start[1] = value + at + tile_bytes;
      pa_prefetch ahead = {.start = range_start, .bytes = range_bytes, .to_l2 = k->prefetch_to_l2};
      ahead.count = tile + 1 < tiles ? 2 : 0;
      run_tile(&st, &ahead, call_budget(2 * tile_bytes), &t);
    }
    if (pass == 0 || t.qk + t.softmax + t.pv < best.qk + best.softmax + best.pv) best = t;
  }
  *keys = (double)tiles * (double)n;
  pab_big_free(key);
  pab_big_free(value);
  tile_state_free(&st);
  return best;
}

/* One row of the table: the phases per key and KV head over `keys` keys of each KV head. */
static void print_row(const kernel_case *c, const char *target, const phase_times *t, double keys,
                      double memory_ns) {
  double per = 1e9 / (keys * KV_HEADS), total = (t->qk + t->softmax + t->pv) * per;
  printf("%-11s %4zu %4zu %-8s %7.2f %7.2f %7.2f %7.2f %7.2f %9.2f\n", c->name, c->head_size,
         c->keys, target, t->qk * per, t->softmax * per, t->pv * per, total, memory_ns,
         total / memory_ns);
}

static void usage(FILE *f) {
  fputs(
      "usage: pagedattn-kernel-bench [--quick] [--isa NAME] [--rows N] [--case NAME]\n"
      "                              [--reread | --prefill]\n"
      "Times the decode micro-kernels of one tile with K/V in L2 (see the top of\n"
      "bench/kernels.c); ns per key and KV head, and that time over the time the\n"
      "memory needs for the same K/V bytes at the read bandwidth measured first;\n"
      "the stream rows read K/V from DRAM, tile after tile (2 x 512 MiB, best of 5).\n"
      "--rows N: query rows per KV head (1 to 16; 4, Llama-3-8B's, by default);\n"
      "--case NAME: only the cache case NAME (the table's first column).\n"
      "--reread instead reads sets of 32 MiB to 1 GiB over and over (1 thread, the\n"
      "best of 5 passes after a first): what the L3 keeps of a set larger than itself.\n"
      "--prefill instead times the packed (prefill) kernels on one tile in cache, against\n"
      "the f32 FMA and bf16 dot peaks measured first (bench/kernels_prefill.c); its tile\n"
      "has 128 rows unless --rows says otherwise (a decode item over a tiled cache).\n",
      f);
}

/* The streaming-read bandwidth of sets re-read in a cycle. A set a few times the L3 still
 * reads faster than one far beyond it on this machine, so a benchmark that re-reads such a
 * set beats a bandwidth measured over 1 GiB (see bench/main.c, the cold rows' copies). */
static void reread_sets(const pab_machine *mach) {
  printf("# set MiB, GB/s (1 thread, best of 5 passes after a first)\n");
  for (size_t mib = 32; mib <= 1024; mib *= 2) {
    pab_read_probe *probe = pab_read_probe_new(mach, mib << 20, 1);
    if (!probe) pab_die("out of memory for a %zu MiB set", mib);
    printf("%5zu %7.1f\n", mib, pab_read_probe_gbs(probe, 1, 5));
    pab_read_probe_free(probe);
  }
}

int main(int argc, char **argv) {
  int quick = 0, reread = 0, prefill = 0, rows_given = 0;
  const char *isa_name = NULL, *only_case = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else if (!strcmp(argv[i], "--reread")) {
      reread = 1;
    } else if (!strcmp(argv[i], "--prefill")) {
      prefill = 1;
    } else if (!strcmp(argv[i], "--isa") && i + 1 < argc) {
      isa_name = argv[++i];
    } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
      const char *arg = argv[++i];
      char *end;
      long value = strtol(arg, &end, 10);
      if (*end || value < 1 || value > 16) pab_die("--rows %s: not a row count from 1 to 16", arg);
      rows_per_head = (size_t)value;
      rows_given = 1;
    } else if (!strcmp(argv[i], "--case") && i + 1 < argc) {
      only_case = argv[++i];
      size_t found = 0;
      for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        found += !strcmp(cases[c].name, only_case);
      if (!found)
        pab_die("--case %s: no such case (the names are the table's first column)", only_case);
    } else {
      usage(strcmp(argv[i], "--help") ? stderr : stdout);
      return strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  pa_isa isa = pa_isa_detect();
  if (isa_name && (!pa_isa_parse(isa_name, &isa) || isa > pa_isa_detect()))
    pab_die("--isa %s: not a family this machine runs (scalar, avx2, avx512)", isa_name);
  pa_kernels k;
  const char *force = getenv("PA_BF16_DOT"); /* on / off, as for a context */
  int bf16_dot = force && !strcmp(force, "on")    ? 1
                 : force && !strcmp(force, "off") ? 0
                                                  : pa_bf16_dot_is_fast();
  pa_kernels_build(isa, bf16_dot, &k);
  const char *level = getenv("PA_PREFETCH"); /* l1 / l2, as for a context */
  k.prefetch_to_l2 = level && !strcmp(level, "l2")   ? 1
                     : level && !strcmp(level, "l1") ? 0
                                                     : pa_prefetch_to_l2_suits();

  pab_machine mach;
  pab_machine_probe(&mach);
  if (reread) {
    reread_sets(&mach);
    return 0;
  }
  if (prefill) {
    pab_prefill_kernels(&k, &mach, rows_given ? rows_per_head : 128, quick);
    return 0;
  }
  size_t far_bytes = quick ? (size_t)16 << 20 : PA_MAX((size_t)256 << 20, 8 * mach.l3_bytes);
  pab_read_probe *probe = pab_read_probe_new(&mach, far_bytes, 1);
  if (!probe) pab_die("out of memory for the read probe");
  double read_gbs = pab_read_probe_gbs(probe, 1, quick ? 1 : 3);
  pab_read_probe_free(probe);
  prefetch_target cached = {pab_big_alloc((size_t)256 << 10), (size_t)256 << 10, 0};
  prefetch_target far = {pab_big_alloc(far_bytes), far_bytes, 0};
  if (!cached.base || !far.base) pab_die("out of memory for the prefetch targets");
  memset(cached.base, 1, cached.bytes);
  memset(far.base, 1, far.bytes);

  printf("# pagedattn-kernel-bench isa=%s%s prefetch=%s cpu=%s read_gbs=%.2f (1 thread)\n",
         pa_isa_name(isa),
         k.bf16_dot                 ? ""
         : isa >= PA_ISA_AVX512BF16 ? " (bf16 on FMA)"
                                    : "",
         k.prefetch_to_l2 ? "l2" : "l1", mach.cpu, read_gbs);
  printf(
      "# ns per key and KV head, %d KV heads x %d query rows each; memory = the K and V bytes "
      "of a key and KV head at read_gbs\n",
      KV_HEADS, (int)rows_per_head);
  printf("%-11s %4s %4s %-7s %7s %7s %7s %7s %7s %9s\n", "cache", "d", "keys", "prefetch", "qk",
         "softmax", "pv", "total", "memory", "total/mem");
  int reps = quick ? 20 : 20000;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const kernel_case *c = &cases[i];
    if (only_case && strcmp(c->name, only_case)) continue;
    double memory_ns = 2.0 * (double)(c->head_size * pa_dtype_size(c->cache)) / read_gbs;
    for (int target = 0; target < NUM_TARGETS; target++) {
      prefetch_target *where = target == TARGET_NONE     ? NULL
                               : target == TARGET_CACHED ? &cached
                                                         : &far;
      phase_times t = time_tile(&k, c, where, reps);
      print_row(c, target_names[target], &t, (double)reps * (double)c->keys, memory_ns);
    }
    double keys = 0;
    phase_times t =
        time_stream(&k, c, quick ? (size_t)16 << 20 : (size_t)512 << 20, quick ? 1 : 5, &keys);
    print_row(c, "stream", &t, keys, memory_ns);
  }
  pab_big_free(cached.base);
  pab_big_free(far.base);
  return 0;
}
