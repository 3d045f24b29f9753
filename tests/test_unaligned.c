/*
 * Pointers need only the alignment of their element type (the header). Every
 * tensor and index argument of every entry point here starts 1, 2 or 3
 * elements past a 64-byte boundary (rows also have odd strides, so no row
 * after the first is aligned either), for every activation and cache dtype:
 * the cache bytes must be the ones pa_write_kv / pa_copy_blocks /
 * pa_swap_blocks promise and the attention outputs the reference's.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { NH = 4, NKV = 2, HS = 72, WIDTH = NH * HS, KW = NKV * HS, BS = 16, NB = 12, NSEQ = 3 };
enum { ROWS = 43, KEYS = 106, QSTRIDE = WIDTH + 1, OSTRIDE = WIDTH + 3, KSTRIDE = KW + 1 };
/* A decode (4 rows per KV head: the cache rows read directly), a
 * speculative decode (18: directly or packed, as the dtype pair's
 * packed_min_rows says) and a prompt chunk (66: packed tiles). */
static const int32_t g_q[NSEQ] = {1, 9, 33}, g_k[NSEQ] = {40, 30, 36};

static pa_context *g_ctx[2];

/* Memory for count elements of elem bytes that starts `offset` elements
 * past a 64-byte boundary; *base is what to free. */
static void *shifted(size_t count, size_t elem, int offset, void **base) {
  if (posix_memalign(base, 64, count * elem + 64 + (size_t)offset * elem) != 0) {
    fprintf(stderr, "test_unaligned: out of memory\n");
    exit(1);
  }
  memset(*base, 0, count * elem + 64 + (size_t)offset * elem);
  return (char *)*base + (size_t)offset * elem;
}

typedef struct bufs {
  void *base[24];
  int n;
} bufs;

static void *take(bufs *b, size_t count, size_t elem, int offset) {
  return shifted(count, elem, offset, &b->base[b->n++]);
}

static void release(bufs *b) {
  for (int i = 0; i < b->n; i++) free(b->base[i]);
}

static void run_case(pa_dtype act, pa_dtype cache_dtype, int offset) {
  char tag[96];
  snprintf(tag, sizeof tag, "act %s, cache %s, offset %d", pa_dtype_name(act),
           pa_dtype_name(cache_dtype), offset);
  tu_rng rng;
  tu_rng_seed(&rng, 900 + (uint64_t)(act * 40 + cache_dtype * 4 + offset));
  bufs b = {.n = 0};
  size_t as = pa_dtype_size(act), cs = pa_dtype_size(cache_dtype);

  /* The layer: ALiBi slopes and sinks from shifted arrays too. */
  float *slopes = take(&b, NH, sizeof(float), offset), *sinks = take(&b, NH, sizeof(float), offset);
  for (int h = 0; h < NH; h++) {
    slopes[h] = 0.03f * (float)(h + 1);
    sinks[h] = 0.5f * (float)h - 1.0f;
  }
  pa_layer_config cfg = {.num_heads = NH,
                         .num_kv_heads = NKV,
                         .head_size = HS,
                         .alibi_slopes = slopes,
                         .sinks = sinks,
                         .attn_type = PA_ATTN_DECODER,
                         .dtype = act};
  pa_layer *layer = NULL;
  pa_status st = pa_layer_create(&cfg, &layer);
  TU_CHECK(st == PA_OK, "%s: pa_layer_create: %s", tag, pa_last_error());
  if (!layer) return;
  ref_layer ref = {NH, NKV, HS, 1.0 / sqrt((double)HS), slopes, 0, 0, sinks, REF_DECODER};

  /* The cache and the batch. */
  pa_kv_cache cache = {NULL, NULL, NB, BS, NKV, HS, cache_dtype, 0.02f, 0.03f, 0, 0, PA_KV_ROWS};
  int64_t elems = hx_cache_elems(&cache);
  cache.key = take(&b, (size_t)elems, cs, offset);
  cache.value = take(&b, (size_t)elems, cs, offset);
  hx_fill_cache(&rng, &cache, 1.0, 0);
  int32_t *qsl = take(&b, NSEQ + 1, 4, offset), *seq_lens = take(&b, NSEQ, 4, offset);
  int32_t *cu_k = take(&b, NSEQ + 1, 4, offset), *bt = take(&b, NSEQ * 3, 4, offset);
  int64_t *slots = take(&b, KEYS, 8, offset);
  qsl[0] = cu_k[0] = 0;
  int next = NB - 1, n = 0;
  for (int s = 0; s < NSEQ; s++) {
    qsl[s + 1] = qsl[s] + g_q[s];
    cu_k[s + 1] = cu_k[s] + g_k[s];
    seq_lens[s] = g_k[s];
    for (int i = 0; i < 3; i++) bt[s * 3 + i] = i * BS < g_k[s] ? next-- : -1;
    for (int t = 0; t < g_k[s]; t++) slots[n++] = (int64_t)bt[s * 3 + t / BS] * BS + t % BS;
  }
  pa_batch batch = {NSEQ, qsl, seq_lens, bt, 3};

  /* pa_write_kv of every token, from shifted rows of an odd stride. */
  void *krows = take(&b, (size_t)KEYS * KSTRIDE, as, offset);
  void *vrows = take(&b, (size_t)KEYS * KSTRIDE, as, offset);
  hx_fill_rows(&rng, krows, KSTRIDE, KEYS, KW, act, 1.0);
  hx_fill_rows(&rng, vrows, KSTRIDE, KEYS, KW, act, 1.0);
  size_t cache_bytes = hx_cache_bytes(&cache);
  unsigned char *img[4];
  for (int i = 0; i < 4; i++) {
    img[i] = tu_malloc(cache_bytes);
    memcpy(img[i], i % 2 ? cache.value : cache.key, cache_bytes);
  }
  hx_expect_write(&cache, img[0], img[1], img[2], img[3], krows, KSTRIDE, vrows, KSTRIDE, act, KEYS,
                  slots);
  st = pa_write_kv(g_ctx[1], &cache, krows, KSTRIDE, vrows, KSTRIDE, act, KEYS, slots);
  TU_CHECK(st == PA_OK, "%s: pa_write_kv: %s", tag, pa_last_error());
  hx_compare_cache(tag, &cache, img[0], img[1], img[2], img[3]);

  /* pa_paged_attention, without and with a plan, one context each. */
  void *query = take(&b, (size_t)ROWS * QSTRIDE, as, offset);
  void *out = take(&b, (size_t)(ROWS + 1) * OSTRIDE, as, offset);
  float *lse = take(&b, ROWS * NH + 4, sizeof(float), offset);
  hx_fill_rows(&rng, query, QSTRIDE, ROWS, WIDTH, act, 1.0);
  double *ref_out = tu_malloc(ROWS * WIDTH * sizeof(double));
  double ref_lse[ROWS * NH], vmax[ROWS];
  ref_cache rc = {cache.key,     cache.value,   NB, BS, NKV,     HS, hx_ref_dtype(cache_dtype),
                  cache.k_scale, cache.v_scale, 0,  0,  REF_ROWS};
  ref_paged_attention(&ref, hx_ref_dtype(act), query, QSTRIDE, &rc, NSEQ, qsl, seq_lens, bt, 3,
                      ref_out, ref_lse, vmax);
  for (int with_plan = 0; with_plan < 2; with_plan++) {
    pa_plan *plan = NULL;
    if (with_plan) {
      st = pa_plan_create(g_ctx[with_plan], layer, &batch, &plan);
      TU_CHECK(st == PA_OK, "%s: pa_plan_create: %s", tag, pa_last_error());
    }
    tu_fill_canary(out, (size_t)(ROWS + 1) * OSTRIDE * as);
    tu_fill_canary(lse, (ROWS * NH + 4) * sizeof(float));
    st = pa_paged_attention(g_ctx[with_plan], layer, plan, query, QSTRIDE, &cache, &batch, out,
                            OSTRIDE, lse);
    TU_CHECK(st == PA_OK, "%s: pa_paged_attention: %s", tag, pa_last_error());
    if (st == PA_OK)
      hx_check_outputs(tag, act, NH, HS, ROWS, out, OSTRIDE, 1, lse, 4, ref_out, ref_lse, vmax);
    pa_plan_destroy(plan);
  }

  /* pa_varlen_attention over the same (shifted, odd-stride) key rows. */
  tu_fill_canary(out, (size_t)(ROWS + 1) * OSTRIDE * as);
  tu_fill_canary(lse, (ROWS * NH + 4) * sizeof(float));
  ref_varlen_attention(&ref, hx_ref_dtype(act), query, QSTRIDE, krows, KSTRIDE, vrows, KSTRIDE,
                       NSEQ, qsl, cu_k, ref_out, ref_lse, vmax);
  st = pa_varlen_attention(g_ctx[1], layer, query, QSTRIDE, krows, KSTRIDE, vrows, KSTRIDE, NSEQ,
                           qsl, cu_k, out, OSTRIDE, lse);
  TU_CHECK(st == PA_OK, "%s: pa_varlen_attention: %s", tag, pa_last_error());
  if (st == PA_OK)
    hx_check_outputs(tag, act, NH, HS, ROWS, out, OSTRIDE, 1, lse, 4, ref_out, ref_lse, vmax);

  /* pa_copy_blocks and pa_swap_blocks with shifted pairs and destination. */
  int64_t *pairs = take(&b, 4, 8, offset);
  memcpy(pairs, (int64_t[]){NB - 1, 0, 0, 1}, 4 * sizeof(int64_t));
  size_t block = cache_bytes / NB;
  st = pa_copy_blocks(g_ctx[0], &cache, 1, pairs, 2);
  TU_CHECK(st == PA_OK, "%s: pa_copy_blocks: %s", tag, pa_last_error());
  pa_kv_cache dst = cache;
  dst.num_blocks = 3;
  dst.key = take(&b, (size_t)elems / NB * 3, cs, offset);
  dst.value = take(&b, (size_t)elems / NB * 3, cs, offset);
  memcpy(pairs, (int64_t[]){1, 2, NB - 2, 0}, 4 * sizeof(int64_t));
  st = pa_swap_blocks(g_ctx[1], &cache, &dst, pairs, 2);
  TU_CHECK(st == PA_OK, "%s: pa_swap_blocks: %s", tag, pa_last_error());
  for (int side = 0; side < 2; side++) {
    const char *c = side ? cache.value : cache.key, *d = side ? dst.value : dst.key;
    TU_CHECK(memcmp(c, c + (NB - 1) * block, block) == 0 &&
                 memcmp(c + block, c + (NB - 1) * block, block) == 0,
             "%s: pa_copy_blocks: block %d was not copied", tag, NB - 1);
    TU_CHECK(memcmp(d + 2 * block, c + (NB - 1) * block, block) == 0 &&
                 memcmp(d, c + (NB - 2) * block, block) == 0,
             "%s: pa_swap_blocks: blocks were not copied", tag);
  }
  for (int i = 0; i < 4; i++) free(img[i]);
  free(ref_out);
  pa_layer_destroy(layer);
  release(&b);
}

int main(void) {
  for (int i = 0; i < 2; i++) {
    if (pa_context_create(i + 1, &g_ctx[i]) != PA_OK) {
      fprintf(stderr, "pa_context_create: %s\n", pa_last_error());
      return 1;
    }
  }
  printf("test_unaligned: isa %s\n", pa_context_isa(g_ctx[0]));
  for (int act = PA_F32; act <= PA_BF16; act++)
    for (int cache = PA_F32; cache <= PA_FP8_E5M2; cache++)
      for (int offset = 1; offset <= 3; offset++) run_case((pa_dtype)act, (pa_dtype)cache, offset);
  for (int i = 0; i < 2; i++) pa_context_destroy(g_ctx[i]);
  return tu_finish("test_unaligned");
}
