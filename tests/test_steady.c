/*
 * Steady state: once a context has served a call, the same call again
 * allocates nothing, creates no thread and gives the same bytes.
 *
 * The library's calls to malloc, calloc, realloc, posix_memalign,
 * aligned_alloc and pthread_create go through the counting wrappers below
 * (the linker's --wrap, see CMakeLists.txt). That sees every call the
 * library makes to them, though not allocations inside libc itself.
 *
 * Each case warms one context up with one round of every entry point
 * (write, mixed prefill / chunk / decode batch, a long decode split over
 * the threads, the same with a plan, dense varlen attention, copy and swap,
 * the merge of the mixed batch's result with itself), then repeats the
 * round with the counters on. The dtype pairs cover the three kernel
 * families of a decode (bf16 dot products, FP8 lookups, f32); half the
 * cases keep the cache in vLLM's interleaved layout (block_stride,
 * head_stride) and swap it with a dense pool.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---- counting wrappers ------------------------------------------------------ */

static volatile int g_counting;
static long g_allocations, g_threads;

void *__real_malloc(size_t size);
void *__real_calloc(size_t count, size_t size);
void *__real_realloc(void *p, size_t size);
int __real_posix_memalign(void **p, size_t alignment, size_t size);
void *__real_aligned_alloc(size_t alignment, size_t size);
int __real_pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t count, size_t size);
void *__wrap_realloc(void *p, size_t size);
int __wrap_posix_memalign(void **p, size_t alignment, size_t size);
void *__wrap_aligned_alloc(size_t alignment, size_t size);
int __wrap_pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg);

void *__wrap_malloc(size_t size) {
  if (g_counting) __atomic_add_fetch(&g_allocations, 1, __ATOMIC_RELAXED);
  return __real_malloc(size);
}
void *__wrap_calloc(size_t count, size_t size) {
  if (g_counting) __atomic_add_fetch(&g_allocations, 1, __ATOMIC_RELAXED);
  return __real_calloc(count, size);
}
void *__wrap_realloc(void *p, size_t size) {
  if (g_counting) __atomic_add_fetch(&g_allocations, 1, __ATOMIC_RELAXED);
  return __real_realloc(p, size);
}
int __wrap_posix_memalign(void **p, size_t alignment, size_t size) {
  if (g_counting) __atomic_add_fetch(&g_allocations, 1, __ATOMIC_RELAXED);
  return __real_posix_memalign(p, alignment, size);
}
void *__wrap_aligned_alloc(size_t alignment, size_t size) {
  if (g_counting) __atomic_add_fetch(&g_allocations, 1, __ATOMIC_RELAXED);
  return __real_aligned_alloc(alignment, size);
}
int __wrap_pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg) {
  if (g_counting) __atomic_add_fetch(&g_threads, 1, __ATOMIC_RELAXED);
  return __real_pthread_create(thread, attr, fn, arg);
}

/* ---- one case ---------------------------------------------------------------- */

/* Mixed batch: a decode, a 37-token chunk over a cached prefix, a whole
 * 100-token prompt. Decode batch: one long sequence (split over the threads)
 * and three short ones. Blocks from SPARE_BLOCK on are left to copy and swap. */
enum { NH = 8, NKV = 2, HS = 96, BS = 16, NB = 200, SPARE_BLOCK = 190, TABLE = 128 };
enum { MIXED_SEQS = 3, MIXED_ROWS = 1 + 37 + 100, DECODE_SEQS = 4, ROUNDS = 3 };
static const int32_t g_mixed_q[MIXED_SEQS] = {1, 37, 100},
                     g_mixed_len[MIXED_SEQS] = {300, 200, 100};
static const int32_t g_decode_len[DECODE_SEQS] = {2000, 17, 1, 64};

typedef struct outputs {
  unsigned char *mixed, *decode, *planned, *dense, *merged;
  float *lse, *merged_lse;
} outputs;

/* One round of every entry point; results into `out`. Returns the number
 * of calls that failed. */
static int run_round(pa_context *ctx, const pa_layer *layer, const pa_plan *plan,
                     const pa_kv_cache *cache, const pa_kv_cache *swap, const void *query,
                     const void *new_kv, pa_dtype act, const int64_t *slots, const pa_batch *mixed,
                     const pa_batch *decode, const int32_t *cu, outputs *out) {
  int64_t width = NH * HS, kv_width = NKV * HS;
  int64_t pairs[4] = {SPARE_BLOCK, SPARE_BLOCK + 1, SPARE_BLOCK + 2, SPARE_BLOCK + 3};
  pa_status st[8] = {
      pa_write_kv(ctx, cache, new_kv, kv_width, new_kv, kv_width, act, MIXED_ROWS, slots),
      pa_paged_attention(ctx, layer, NULL, query, width, cache, mixed, out->mixed, width, out->lse),
      pa_paged_attention(ctx, layer, NULL, query, width, cache, decode, out->decode, width, NULL),
      pa_paged_attention(ctx, layer, plan, query, width, cache, decode, out->planned, width, NULL),
      pa_varlen_attention(ctx, layer, query, width, new_kv, kv_width, new_kv, kv_width, MIXED_SEQS,
                          cu, cu, out->dense, width, NULL),
      pa_copy_blocks(ctx, cache, 1, pairs, 2),
      pa_swap_blocks(ctx, cache, swap, pairs, 2),
      PA_OK,
  };
  /* After the array: its initialisers are not sequenced, and this one reads
   * the mixed batch's result. */
  st[7] = pa_merge_states(ctx, MIXED_ROWS, NH, HS, act, out->mixed, width, out->lse, out->mixed,
                          width, out->lse, out->merged, width, out->merged_lse);
  int failed = 0;
  for (int i = 0; i < 8; i++) failed += st[i] != PA_OK;
  return failed;
}

static void run_case(int threads, pa_dtype act, pa_dtype cache_dtype, int strided, uint64_t seed) {
  tu_rng rng;
  tu_rng_seed(&rng, seed);
  char label[96];
  snprintf(label, sizeof label, "%d thread(s), %s over %s%s", threads, pa_dtype_name(act),
           pa_dtype_name(cache_dtype), strided ? ", interleaved cache" : "");

  pa_context *ctx = NULL;
  pa_layer *layer = NULL;
  pa_layer_config config = {.num_heads = NH,
                            .num_kv_heads = NKV,
                            .head_size = HS,
                            .attn_type = PA_ATTN_DECODER,
                            .dtype = act};
  TU_CHECK(pa_context_create(threads, &ctx) == PA_OK, "%s: context: %s", label, pa_last_error());
  TU_CHECK(pa_layer_create(&config, &layer) == PA_OK, "%s: layer: %s", label, pa_last_error());
  if (!ctx || !layer) {
    pa_layer_destroy(layer);
    pa_context_destroy(ctx);
    return;
  }

  size_t block_bytes = (size_t)BS * NKV * HS * pa_dtype_size(cache_dtype);
  pa_kv_cache cache = {.key = tu_calloc(NB, block_bytes),
                       .value = tu_calloc(NB, block_bytes),
                       .num_blocks = NB,
                       .block_size = BS,
                       .num_kv_heads = NKV,
                       .head_size = HS,
                       .dtype = cache_dtype,
                       .k_scale = 0.5f,
                       .v_scale = 0.25f};
  pa_kv_cache swap = cache;
  swap.key = tu_calloc(NB, block_bytes);
  swap.value = tu_calloc(NB, block_bytes);
  if (strided) {
    /* One buffer, [NB][NKV][2 * BS][HS]: each head's key tile, then its value tile. */
    free(cache.value);
    free(cache.key);
    cache.key = tu_calloc(NB, 2 * block_bytes);
    cache.value = (char *)cache.key + (size_t)BS * HS * pa_dtype_size(cache_dtype);
    cache.head_stride = 2 * BS * HS;
    cache.block_stride = NKV * cache.head_stride;
  }
  hx_fill_cache(&rng, &cache, 1.0, 0);

  size_t act_size = pa_dtype_size(act), width = NH * HS, kv_width = NKV * HS;
  void *query = tu_malloc((size_t)MIXED_ROWS * width * act_size);
  void *new_kv = tu_malloc((size_t)MIXED_ROWS * kv_width * act_size);
  hx_fill_rows(&rng, query, (int64_t)width, MIXED_ROWS, (int)width, act, 1.0);
  hx_fill_rows(&rng, new_kv, (int64_t)kv_width, MIXED_ROWS, (int)kv_width, act, 1.0);

  /* Block tables below SPARE_BLOCK, overlapping between sequences (the
   * attention calls only read them); sequence 0 of the decode batch runs on
   * to 125 blocks. */
  int32_t table[DECODE_SEQS * TABLE];
  for (int s = 0; s < DECODE_SEQS; s++)
    for (int b = 0; b < TABLE; b++) table[s * TABLE + b] = (s * 37 + b) % SPARE_BLOCK;
  int32_t mixed_qsl[MIXED_SEQS + 1] = {0}, decode_qsl[DECODE_SEQS + 1], cu[MIXED_SEQS + 1] = {0};
  for (int s = 0; s < MIXED_SEQS; s++) mixed_qsl[s + 1] = mixed_qsl[s] + g_mixed_q[s];
  for (int s = 0; s <= DECODE_SEQS; s++) decode_qsl[s] = s;
  memcpy(cu, mixed_qsl, sizeof cu);
  pa_batch mixed = {MIXED_SEQS, mixed_qsl, g_mixed_len, table, TABLE};
  pa_batch decode = {DECODE_SEQS, decode_qsl, g_decode_len, table, TABLE};

  /* The new tokens go where the mixed batch reads them; every seventh is
   * padding. */
  int64_t slots[MIXED_ROWS];
  for (int s = 0, row = 0; s < MIXED_SEQS; s++) {
    for (int r = 0; r < g_mixed_q[s]; r++, row++) {
      int64_t position = g_mixed_len[s] - g_mixed_q[s] + r;
      slots[row] =
          row % 7 == 3 ? -1 : (int64_t)table[s * TABLE + position / BS] * BS + position % BS;
    }
  }

  pa_plan *plan = NULL;
  TU_CHECK(pa_plan_create(ctx, layer, &decode, &plan) == PA_OK, "%s: plan: %s", label,
           pa_last_error());

  size_t out_bytes = (size_t)MIXED_ROWS * width * act_size;
  outputs first = {tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc((size_t)MIXED_ROWS * NH, sizeof(float)),
                   tu_calloc((size_t)MIXED_ROWS * NH, sizeof(float))};
  outputs again = {tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc(out_bytes, 1),
                   tu_calloc((size_t)MIXED_ROWS * NH, sizeof(float)),
                   tu_calloc((size_t)MIXED_ROWS * NH, sizeof(float))};

  int failed = run_round(ctx, layer, plan, &cache, &swap, query, new_kv, act, slots, &mixed,
                         &decode, cu, &first);
  TU_CHECK(failed == 0, "%s: %d calls of the warm-up failed, last error: %s", label, failed,
           pa_last_error());

  g_allocations = g_threads = 0;
  g_counting = 1;
  for (int round = 0; round < ROUNDS; round++) {
    failed += run_round(ctx, layer, plan, &cache, &swap, query, new_kv, act, slots, &mixed, &decode,
                        cu, &again);
  }
  g_counting = 0;
  TU_CHECK(failed == 0, "%s: %d calls failed after warm-up", label, failed);
  TU_CHECK(g_allocations == 0, "%s: %ld allocations in %d rounds after warm-up", label,
           g_allocations, ROUNDS);
  TU_CHECK(g_threads == 0, "%s: %ld threads created after warm-up", label, g_threads);

  /* The decode batch's output rows are DECODE_SEQS; the others MIXED_ROWS. */
  size_t decode_bytes = (size_t)DECODE_SEQS * width * act_size;
  TU_CHECK(memcmp(first.mixed, again.mixed, out_bytes) == 0, "%s: mixed batch output changed",
           label);
  TU_CHECK(memcmp(first.lse, again.lse, (size_t)MIXED_ROWS * NH * sizeof(float)) == 0,
           "%s: mixed batch lse changed", label);
  TU_CHECK(memcmp(first.decode, again.decode, decode_bytes) == 0, "%s: decode output changed",
           label);
  TU_CHECK(memcmp(first.decode, first.planned, decode_bytes) == 0,
           "%s: decode with a plan differs from decode without", label);
  TU_CHECK(memcmp(first.planned, again.planned, decode_bytes) == 0,
           "%s: planned decode output changed", label);
  TU_CHECK(memcmp(first.dense, again.dense, out_bytes) == 0, "%s: varlen output changed", label);
  TU_CHECK(
      memcmp(first.merged, again.merged, out_bytes) == 0 &&
          memcmp(first.merged_lse, again.merged_lse, (size_t)MIXED_ROWS * NH * sizeof(float)) == 0,
      "%s: merged states changed", label);
  /* A state merged with itself is itself, over twice the denominator. */
  int same = 1;
  for (int i = 0; i < MIXED_ROWS * NH && same; i++)
    same = fabsf(first.merged_lse[i] - (first.lse[i] + logf(2.0f))) <=
           1e-5f * (1.0f + fabsf(first.lse[i]));
  TU_CHECK(same, "%s: merging a state with itself does not add log 2 to its lse", label);
  printf("  %s: %ld allocations, %ld thread creations after warm-up\n", label, g_allocations,
         g_threads);

  pa_plan_destroy(plan);
  pa_layer_destroy(layer);
  pa_context_destroy(ctx);
  outputs all[2] = {first, again};
  for (int i = 0; i < 2; i++) {
    free(all[i].mixed), free(all[i].decode), free(all[i].planned), free(all[i].dense);
    free(all[i].merged), free(all[i].lse), free(all[i].merged_lse);
  }
  free(query), free(new_kv);
  free(cache.key), free(swap.key), free(swap.value);
  if (!strided) free(cache.value);
}

int main(int argc, char **argv) {
  uint64_t seed = tu_seed_from_args(argc, argv, 0x57eadc0de);
  const char *isa = getenv("PA_ISA");
  printf("test_steady: PA_ISA=%s seed=%llu\n", isa ? isa : "(unset)", (unsigned long long)seed);
  const pa_dtype pairs[3][2] = {{PA_BF16, PA_BF16}, {PA_BF16, PA_FP8_E4M3}, {PA_F32, PA_F16}};
  for (int threads = 1; threads <= 2; threads++)
    for (int p = 0; p < 3; p++)
      for (int strided = 0; strided < 2; strided++)
        run_case(threads, pairs[p][0], pairs[p][1], strided,
                 tu_mix(seed, (uint64_t)(threads * 6 + p * 2 + strided)));
  return tu_finish("test_steady");
}
