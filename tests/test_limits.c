/*
 * Sizes near the limits, on sparse memory: caches of more than 2^31 slots
 * and 2^31 elements (up to 2^32 + 1024 slots), addressed in 64 bits by
 * pa_write_kv, pa_paged_attention, pa_copy_blocks and pa_swap_blocks, and
 * sequences whose lengths and positions are within a few tokens of
 * INT32_MAX (paged and dense). The memory is an anonymous MAP_NORESERVE
 * mapping: pages the library never touches cost nothing, so the test
 * allocates tens of GiB of address space and touches a few hundred KiB.
 *
 * Every written token is checked where it belongs, and the places a 32-bit
 * (or otherwise wrong) offset would have put it are checked to be still
 * zero; outputs are compared with the reference.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "harness.h"

static pa_context *g_ctx[2]; /* 1 and 2 threads */

/* ---- sparse memory ------------------------------------------------------- */

static void *map_sparse(size_t bytes) {
  void *p =
      mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

typedef struct big_cache {
  pa_kv_cache c;
  size_t bytes; /* per side */
} big_cache;

static int map_cache(big_cache *b, pa_dtype t, int64_t num_blocks, int block_size, int nkv,
                     int hs) {
  memset(b, 0, sizeof *b);
  b->c =
      (pa_kv_cache){NULL, NULL, num_blocks, block_size, nkv, hs, t, 0.5f, 0.25f, 0, 0, PA_KV_ROWS};
  b->bytes = (size_t)hx_cache_bytes(&b->c);
  b->c.key = map_sparse(b->bytes);
  b->c.value = map_sparse(b->bytes);
  if (b->c.key && b->c.value) return 1;
  if (b->c.key) munmap(b->c.key, b->bytes);
  if (b->c.value) munmap(b->c.value, b->bytes);
  b->c.key = b->c.value = NULL;
  return 0;
}

static void unmap_cache(big_cache *b) {
  munmap(b->c.key, b->bytes);
  munmap(b->c.value, b->bytes);
}

/* ---- element addressing, independently of the library ------------------ */

static int64_t elem_index(const pa_kv_cache *c, int64_t slot, int head, int dim) {
  int64_t block = slot / c->block_size, offset = slot % c->block_size;
  return ((block * c->num_kv_heads + head) * c->block_size + offset) * c->head_size + dim;
}

/* 1 when every element of the slot, keys and values, is still zero bits. */
static int slot_untouched(const pa_kv_cache *c, int64_t slot) {
  size_t es = pa_dtype_size(c->dtype);
  for (int side = 0; side < 2; side++) {
    const unsigned char *base = side ? c->value : c->key;
    for (int h = 0; h < c->num_kv_heads; h++) {
      const unsigned char *p = base + (size_t)elem_index(c, slot, h, 0) * es;
      for (size_t i = 0; i < (size_t)c->head_size * es; i++)
        if (p[i]) return 0;
    }
  }
  return 1;
}

/* Token t of the rows went to `slot`: compares every element with what
 * encoding x / scale gives (or x * (1 / scale), which the contract allows
 * too). Returns the number of mismatches. */
static long check_written(const char *tag, const pa_kv_cache *c, int64_t slot, const float *krow,
                          const float *vrow) {
  ref_dtype t = hx_ref_dtype(c->dtype);
  int fp8 = c->dtype == PA_FP8_E4M3 || c->dtype == PA_FP8_E5M2;
  long bad = 0;
  for (int side = 0; side < 2; side++) {
    const float *row = side ? vrow : krow;
    float scale = side ? c->v_scale : c->k_scale;
    for (int h = 0; h < c->num_kv_heads; h++)
      for (int d = 0; d < c->head_size; d++) {
        float x = row[h * c->head_size + d];
        float got = ref_load(side ? c->value : c->key, elem_index(c, slot, h, d), t);
        float want = ref_round(fp8 ? x / scale : x, t);
        float alt = ref_round(fp8 ? x * (1.0f / scale) : x, t);
        if (got == want || got == alt) continue;
        if (bad++ < 4)
          TU_CHECK(0, "%s: slot %lld head %d dim %d %s: stored %g, want %g", tag, (long long)slot,
                   h, d, side ? "value" : "key", (double)got, (double)want);
      }
  }
  tu_checks++;
  return bad;
}

/* ---- caches of more than 2^31 slots -------------------------------------- */

enum { NH = 2, NKV = 1, HS = 8, W = NKV * HS, QW = NH * HS, BS = 16 };

static pa_layer *make_layer(int window, int alibi_and_sinks, ref_layer *ref, float *slopes,
                            float *sinks) {
  pa_layer_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.num_heads = NH;
  cfg.num_kv_heads = NKV;
  cfg.head_size = HS;
  cfg.sliding_window = window;
  cfg.attn_type = PA_ATTN_DECODER;
  cfg.dtype = PA_F32;
  for (int h = 0; h < NH; h++) {
    slopes[h] = 0.05f * (float)(h + 1);
    sinks[h] = 0.5f * (float)h - 0.25f;
  }
  if (alibi_and_sinks) {
    cfg.alibi_slopes = slopes;
    cfg.sinks = sinks;
  }
  pa_layer *layer = NULL;
  pa_status st = pa_layer_create(&cfg, &layer);
  TU_CHECK(st == PA_OK, "pa_layer_create: %s", pa_last_error());
  memset(ref, 0, sizeof *ref);
  *ref = (ref_layer){NH, NKV,       HS,         1.0 / sqrt((double)HS), cfg.alibi_slopes, window,
                     0,  cfg.sinks, REF_DECODER};
  return layer;
}

/* Two sequences whose blocks sit at the top of the cache and on both sides
 * of slot 2^31 (and 2^32 when the cache reaches it); all their tokens are
 * written with one pa_write_kv, then attended, copied and swapped. */
static void test_big_cache(pa_dtype t, int64_t num_blocks) {
  char tag[64];
  snprintf(tag, sizeof tag, "%s cache of %lld slots", pa_dtype_name(t),
           (long long)(num_blocks * BS));
  big_cache big;
  if (!map_cache(&big, t, num_blocks, BS, NKV, HS)) {
    TU_CHECK(0, "%s: cannot map %zu bytes of address space twice", tag, (size_t)0);
    return;
  }
  pa_kv_cache *c = &big.c;
  int64_t nb = num_blocks, b31 = ((int64_t)1 << 31) / BS, b32 = ((int64_t)1 << 32) / BS;
  TU_CHECK(nb * BS > ((int64_t)1 << 31) && hx_cache_elems(c) > ((int64_t)1 << 31),
           "%s: the cache does not cross 2^31 slots and elements", tag);
  /* Sequence 0: 20 tokens in blocks [nb - 1, 2^31 / BS]; sequence 1: 35 in
   * [2^31 / BS - 1, nb - 2, 2^32 / BS or 3]. */
  enum { STRIDE = 3 };
  int32_t seq_lens[2] = {20, 35}, qsl[3] = {0, 1, 4};
  int32_t bt[2 * STRIDE] = {(int32_t)(nb - 1),  (int32_t)b31,      -1,
                            (int32_t)(b31 - 1), (int32_t)(nb - 2), (int32_t)(b32 < nb ? b32 : 3)};
  int64_t slots[64];
  int n = 0;
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < seq_lens[s]; i++) {
      if (i % 7 == 3) slots[n++] = -1; /* padding */
      slots[n++] = (int64_t)bt[s * STRIDE + i / BS] * BS + i % BS;
    }
  tu_rng rng;
  tu_rng_seed(&rng, 31 + (uint64_t)t);
  float *krows = tu_malloc((size_t)n * W * sizeof(float));
  float *vrows = tu_malloc((size_t)n * W * sizeof(float));
  hx_fill_rows(&rng, krows, W, n, W, PA_F32, 1.0);
  hx_fill_rows(&rng, vrows, W, n, W, PA_F32, 1.0);
  pa_status st = pa_write_kv(g_ctx[1], c, krows, W, vrows, W, PA_F32, n, slots);
  TU_CHECK(st == PA_OK, "%s: pa_write_kv: %s", tag, pa_last_error());

  /* Each token where it belongs; nothing where a wrong offset would put it:
   * the rest of each block, the slot after it, and the slot's offset
   * truncated to 32 and 31 bits. */
  long bad = 0;
  for (int i = 0; i < n; i++) {
    if (slots[i] < 0) continue;
    bad += check_written(tag, c, slots[i], krows + (size_t)i * W, vrows + (size_t)i * W);
    int64_t wrong[3] = {slots[i] & 0xFFFFFFFF, slots[i] & 0x7FFFFFFF, slots[i] + 2 * BS};
    for (int k = 0; k < 3; k++) {
      int used = 0;
      for (int j = 0; j < n; j++) used |= slots[j] == wrong[k];
      if (wrong[k] == slots[i] || used || wrong[k] >= nb * BS) continue;
      TU_CHECK(slot_untouched(c, wrong[k]), "%s: token %d (slot %lld) also changed slot %lld", tag,
               i, (long long)slots[i], (long long)wrong[k]);
    }
  }
  TU_CHECK(slot_untouched(c, 20 % BS + (int64_t)b31 * BS), "%s: a slot past sequence 0 changed",
           tag);
  TU_CHECK(bad == 0, "%s: %ld elements stored wrong", tag, bad);

  /* Attention over those blocks, both thread counts, against the reference. */
  ref_layer ref;
  float slopes[NH], sinks[NH];
  pa_layer *layer = make_layer(0, 1, &ref, slopes, sinks);
  pa_batch batch = {2, qsl, seq_lens, bt, STRIDE};
  float query[4 * QW], out[5 * QW], lse[4 * NH + 4];
  double ref_out[4 * QW], ref_lse[4 * NH], vmax[4];
  hx_fill_rows(&rng, query, QW, 4, QW, PA_F32, 1.0);
  ref_cache rc = {c->key,          c->value,   nb,         BS, NKV, HS,
                  hx_ref_dtype(t), c->k_scale, c->v_scale, 0,  0,   REF_ROWS};
  ref_paged_attention(&ref, REF_F32, query, QW, &rc, 2, qsl, seq_lens, bt, STRIDE, ref_out, ref_lse,
                      vmax);
  for (int i = 0; i < 2 && layer; i++) {
    tu_fill_canary(out, sizeof out);
    tu_fill_canary(lse, sizeof lse);
    st = pa_paged_attention(g_ctx[i], layer, NULL, query, QW, c, &batch, out, QW, lse);
    TU_CHECK(st == PA_OK, "%s: pa_paged_attention: %s", tag, pa_last_error());
    if (st == PA_OK)
      hx_check_outputs(tag, PA_F32, NH, HS, 4, out, QW, 1, lse, 4, ref_out, ref_lse, vmax);
  }
  pa_layer_destroy(layer);

  /* Copies between the top, the middle and the bottom of the cache. */
  size_t block_bytes = (size_t)BS * NKV * HS * pa_dtype_size(t);
  unsigned char *top = tu_malloc(block_bytes);
  memcpy(top, (char *)c->key + (size_t)(nb - 1) * block_bytes, block_bytes);
  int64_t pairs[4] = {nb - 1, b31 + 1, b31 + 1, 1};
  st = pa_copy_blocks(g_ctx[1], c, 1, pairs, 2);
  TU_CHECK(st == PA_OK, "%s: pa_copy_blocks: %s", tag, pa_last_error());
  TU_CHECK(memcmp((char *)c->key + (size_t)(b31 + 1) * block_bytes, top, block_bytes) == 0 &&
               memcmp((char *)c->key + block_bytes, top, block_bytes) == 0,
           "%s: pa_copy_blocks did not copy block %lld", tag, (long long)(nb - 1));
  TU_CHECK(
      slot_untouched(c, (b31 + 2) * BS) && slot_untouched(c, BS - 1) && slot_untouched(c, 2 * BS),
      "%s: pa_copy_blocks wrote past a destination block", tag);

  /* Swaps with a small cache, both ways. */
  pa_kv_cache small = *c;
  small.num_blocks = 4;
  small.key = tu_calloc(4, block_bytes);
  small.value = tu_calloc(4, block_bytes);
  int64_t out_pair[2] = {nb - 2, 2}, in_pair[2] = {2, nb - 3};
  st = pa_swap_blocks(g_ctx[0], c, &small, out_pair, 1);
  TU_CHECK(st == PA_OK, "%s: pa_swap_blocks out: %s", tag, pa_last_error());
  st = pa_swap_blocks(g_ctx[1], &small, c, in_pair, 1);
  TU_CHECK(st == PA_OK, "%s: pa_swap_blocks in: %s", tag, pa_last_error());
  for (int side = 0; side < 2; side++) {
    const char *base = side ? c->value : c->key;
    TU_CHECK(memcmp(base + (size_t)(nb - 3) * block_bytes, base + (size_t)(nb - 2) * block_bytes,
                    block_bytes) == 0,
             "%s: a block swapped out and back in differs", tag);
  }
  free(small.key);
  free(small.value);
  free(top);
  free(krows);
  free(vrows);
  unmap_cache(&big);
}

/* ---- lengths and positions near INT32_MAX -------------------------------- */

enum { WINDOW = 40, CHUNK = 4 };

/* The keys of positions [first, first + n) read back from the cache (their
 * stored values) into k, v: [n][W]. Block table: identity. */
static void gather(const pa_kv_cache *c, int64_t first, int n, double *k, double *v) {
  ref_dtype t = hx_ref_dtype(c->dtype);
  for (int i = 0; i < n; i++)
    for (int h = 0; h < NKV; h++)
      for (int d = 0; d < HS; d++) {
        int64_t at = elem_index(c, first + i, h, d);
        k[(size_t)i * W + (size_t)h * HS + d] = ref_load(c->key, at, t);
        v[(size_t)i * W + (size_t)h * HS + d] = ref_load(c->value, at, t);
      }
}

/* A decode at position INT32_MAX - 1 (seq_len INT32_MAX) and a chunk of
 * CHUNK rows ending one before it, over a sliding window: only the last
 * WINDOW + CHUNK tokens exist, written at slots just below 2^31. */
static void test_long_sequences(void) {
  const char *tag = "seq_len INT32_MAX";
  int64_t bs = 1 << 16, nb = ((int64_t)1 << 31) / bs; /* 2^31 slots, 2^34 elements */
  big_cache big;
  if (!map_cache(&big, PA_F16, nb, (int)bs, NKV, HS)) {
    TU_CHECK(0, "%s: cannot map the cache", tag);
    return;
  }
  pa_kv_cache *c = &big.c;
  int32_t seq_lens[2] = {INT32_MAX, INT32_MAX - 1}, qsl[3] = {0, 1, 1 + CHUNK};
  int stride = (int)nb;
  int32_t *bt = tu_malloc(2 * (size_t)stride * sizeof(int32_t));
  for (int s = 0; s < 2; s++)
    for (int b = 0; b < stride; b++) bt[(size_t)s * stride + b] = b;
  enum { N = WINDOW + CHUNK };
  int64_t first = (int64_t)INT32_MAX - N, slots[N];
  for (int i = 0; i < N; i++) slots[i] = first + i;
  tu_rng rng;
  tu_rng_seed(&rng, 77);
  float krows[N * W], vrows[N * W], query[(1 + CHUNK) * QW];
  hx_fill_rows(&rng, krows, W, N, W, PA_F32, 1.0);
  hx_fill_rows(&rng, vrows, W, N, W, PA_F32, 1.0);
  hx_fill_rows(&rng, query, QW, 1 + CHUNK, QW, PA_F32, 1.0);
  pa_status st = pa_write_kv(g_ctx[0], c, krows, W, vrows, W, PA_F32, N, slots);
  TU_CHECK(st == PA_OK, "%s: pa_write_kv: %s", tag, pa_last_error());
  for (int i = 0; i < N; i++) check_written(tag, c, slots[i], krows + i * W, vrows + i * W);

  /* The reference sees only the keys the window keeps: positions are
   * relative in every term (mask, ALiBi), so a sequence of those keys alone
   * gives the same result. */
  ref_layer ref;
  float slopes[NH], sinks[NH];
  pa_layer *layer = make_layer(WINDOW, 1, &ref, slopes, sinks);
  double k[N * W], v[N * W], q[(1 + CHUNK) * QW], ref_out[(1 + CHUNK) * QW],
      ref_lse[(1 + CHUNK) * NH], vmax[1 + CHUNK];
  ref_load_rows(query, QW, REF_F32, 0, 1 + CHUNK, QW, q);
  gather(c, first, N, k, v);
  /* Decode: the last WINDOW keys. Chunk: WINDOW + CHUNK - 1 keys ending one
   * before the last. */
  ref_attention_seq(&ref, 1, WINDOW, q, k + (size_t)CHUNK * W, v + (size_t)CHUNK * W, ref_out,
                    ref_lse);
  ref_attention_seq(&ref, CHUNK, N - 1, q + QW, k, v, ref_out + QW, ref_lse + NH);
  for (int r = 0; r <= CHUNK; r++) {
    vmax[r] = 0;
    for (int i = 0; i < N * W; i++) vmax[r] = fmax(vmax[r], fabs(v[i]));
  }
  pa_batch batch = {2, qsl, seq_lens, bt, stride};
  float out[(2 + CHUNK) * QW], lse[(1 + CHUNK) * NH + 4];
  for (int i = 0; i < 2 && layer; i++) {
    pa_plan *plan = NULL;
    st = pa_plan_create(g_ctx[i], layer, &batch, &plan);
    TU_CHECK(st == PA_OK, "%s: pa_plan_create: %s", tag, pa_last_error());
    tu_fill_canary(out, sizeof out);
    tu_fill_canary(lse, sizeof lse);
    st = pa_paged_attention(g_ctx[i], layer, plan, query, QW, c, &batch, out, QW, lse);
    TU_CHECK(st == PA_OK, "%s: pa_paged_attention: %s", tag, pa_last_error());
    if (st == PA_OK)
      hx_check_outputs(tag, PA_F32, NH, HS, 1 + CHUNK, out, QW, 1, lse, 4, ref_out, ref_lse, vmax);
    pa_plan_destroy(plan);
  }

  /* The same decode from dense K/V: INT32_MAX key rows of a sparse buffer
   * (f32 rows holding the cache's f16 values), the last WINDOW written. */
  const char *dense_tag = "varlen with INT32_MAX key rows";
  size_t rows_bytes = (size_t)INT32_MAX * W * sizeof(float);
  float *kbig = map_sparse(rows_bytes), *vbig = map_sparse(rows_bytes);
  TU_CHECK(kbig && vbig, "%s: cannot map the key rows", dense_tag);
  if (kbig && vbig && layer) {
    for (int i = 0; i < WINDOW; i++)
      for (int e = 0; e < W; e++) {
        size_t at = ((size_t)INT32_MAX - WINDOW + (size_t)i) * W + (size_t)e;
        kbig[at] = (float)k[(size_t)(CHUNK + i) * W + (size_t)e];
        vbig[at] = (float)v[(size_t)(CHUNK + i) * W + (size_t)e];
      }
    int32_t cu_q[2] = {0, 1}, cu_k[2] = {0, INT32_MAX};
    tu_fill_canary(out, sizeof out);
    tu_fill_canary(lse, sizeof lse);
    st = pa_varlen_attention(g_ctx[1], layer, query, QW, kbig, W, vbig, W, 1, cu_q, cu_k, out, QW,
                             lse);
    TU_CHECK(st == PA_OK, "%s: pa_varlen_attention: %s", dense_tag, pa_last_error());
    if (st == PA_OK)
      hx_check_outputs(dense_tag, PA_F32, NH, HS, 1, out, QW, 1, lse, 4, ref_out, ref_lse, vmax);
  }
  if (kbig) munmap(kbig, rows_bytes);
  if (vbig) munmap(vbig, rows_bytes);
  pa_layer_destroy(layer);
  free(bt);
  unmap_cache(&big);
}

/* ---- strides of a single row ---------------------------------------------- */

/* One row's stride is never used to reach another row, so any stride the
 * extent check accepts is legal: up to INT64_MAX for a row whose width fits.
 * The library must not compute stride * element size for it (signed
 * overflow, found by fuzz_varlen_attention). */
static void test_lone_row_strides(void) {
  const char *tag = "one row with a stride near INT64_MAX";
  ref_layer ref;
  float slopes[NH], sinks[NH];
  pa_layer *layer = make_layer(0, 1, &ref, slopes, sinks);
  if (!layer) return;
  enum { KEYS = 5 };
  tu_rng rng;
  tu_rng_seed(&rng, 5);
  float query[QW], krows[KEYS * W], vrows[KEYS * W], out[2 * QW], lse[NH + 4];
  hx_fill_rows(&rng, query, QW, 1, QW, PA_F32, 1.0);
  hx_fill_rows(&rng, krows, W, KEYS, W, PA_F32, 1.0);
  hx_fill_rows(&rng, vrows, W, KEYS, W, PA_F32, 1.0);
  static const int64_t strides[] = {INT64_MAX, INT64_MAX / 2, INT64_MAX / 4 + 1, (int64_t)1 << 61};
  double q[QW], k[KEYS * W], v[KEYS * W], ref_out[QW], ref_lse[NH], vmax[1] = {0};
  ref_load_rows(query, QW, REF_F32, 0, 1, QW, q);
  ref_load_rows(krows, W, REF_F32, 0, KEYS, W, k);
  ref_load_rows(vrows, W, REF_F32, 0, KEYS, W, v);
  for (int i = 0; i < KEYS * W; i++) vmax[0] = fmax(vmax[0], fabs(v[i]));
  ref_attention_seq(&ref, 1, KEYS, q, k, v, ref_out, ref_lse);

  /* Dense: one query row, one output row; the keys in one row each of
   * their own varlen sequence would need a stride, so a single key row. */
  int32_t cu_q[2] = {0, 1}, cu_k[2] = {0, KEYS};
  for (int i = 0; i < 4; i++) {
    tu_fill_canary(out, sizeof out);
    tu_fill_canary(lse, sizeof lse);
    pa_status st = pa_varlen_attention(g_ctx[i % 2], layer, query, strides[i], krows, W, vrows, W,
                                       1, cu_q, cu_k, out, strides[3 - i], lse);
    TU_CHECK(st == PA_OK, "%s: pa_varlen_attention: %s", tag, pa_last_error());
    if (st == PA_OK)
      hx_check_outputs(tag, PA_F32, NH, HS, 1, out, QW, 1, lse, 4, ref_out, ref_lse, vmax);
  }
  /* One key row: its stride is free too. */
  double ref1_out[QW], ref1_lse[NH];
  ref_attention_seq(&ref, 1, 1, q, k, v, ref1_out, ref1_lse);
  int32_t one_k[2] = {0, 1};
  for (int i = 0; i < 4; i++) {
    tu_fill_canary(out, sizeof out);
    pa_status st = pa_varlen_attention(g_ctx[1], layer, query, QW, krows, strides[i], vrows,
                                       strides[3 - i], 1, cu_q, one_k, out, QW, NULL);
    TU_CHECK(st == PA_OK, "%s: pa_varlen_attention, one key: %s", tag, pa_last_error());
    if (st == PA_OK)
      hx_check_outputs(tag, PA_F32, NH, HS, 1, out, QW, 1, NULL, 0, ref1_out, ref1_lse, vmax);
  }

  /* Paged: one query row over a small cache. */
  pa_kv_cache cache = {NULL, NULL, 2, BS, NKV, HS, PA_F32, 1.0f, 1.0f, 0, 0, PA_KV_ROWS};
  cache.key = tu_calloc(1, hx_cache_bytes(&cache));
  cache.value = tu_calloc(1, hx_cache_bytes(&cache));
  int64_t slots[KEYS];
  for (int i = 0; i < KEYS; i++) slots[i] = BS + i; /* block 1 */
  pa_status st = pa_write_kv(g_ctx[0], &cache, krows, W, vrows, W, PA_F32, KEYS, slots);
  TU_CHECK(st == PA_OK, "%s: pa_write_kv: %s", tag, pa_last_error());
  /* pa_write_kv of one token: its strides are free as well. */
  for (int i = 0; i < 4; i++) {
    int64_t slot = BS + KEYS - 1;
    st = pa_write_kv(g_ctx[i % 2], &cache, krows + (KEYS - 1) * W, strides[i],
                     vrows + (KEYS - 1) * W, strides[3 - i], PA_F32, 1, &slot);
    TU_CHECK(st == PA_OK, "%s: pa_write_kv, one token: %s", tag, pa_last_error());
  }
  check_written(tag, &cache, BS + KEYS - 1, krows + (KEYS - 1) * W, vrows + (KEYS - 1) * W);
  int32_t qsl[2] = {0, 1}, seq_lens[1] = {KEYS}, bt[1] = {1};
  pa_batch batch = {1, qsl, seq_lens, bt, 1};
  for (int i = 0; i < 4; i++) {
    tu_fill_canary(out, sizeof out);
    tu_fill_canary(lse, sizeof lse);
    st = pa_paged_attention(g_ctx[i % 2], layer, NULL, query, strides[i], &cache, &batch, out,
                            strides[3 - i], lse);
    TU_CHECK(st == PA_OK, "%s: pa_paged_attention: %s", tag, pa_last_error());
    if (st == PA_OK)
      hx_check_outputs(tag, PA_F32, NH, HS, 1, out, QW, 1, lse, 4, ref_out, ref_lse, vmax);
  }
  free(cache.key);
  free(cache.value);
  pa_layer_destroy(layer);
}

/* A plan for one sequence of INT32_MAX query rows: the planner's row loop
 * once overflowed int on its last step and ran away. */
static void test_plan_of_int32_max_rows(void) {
  pa_layer_config cfg = {
      .num_heads = 1, .head_size = 1, .attn_type = PA_ATTN_ENCODER_DECODER, .dtype = PA_F32};
  pa_layer *layer = NULL;
  pa_plan *plan = NULL;
  int32_t qsl[2] = {0, INT32_MAX}, seq_lens[1] = {1};
  pa_batch batch = {1, qsl, seq_lens, NULL, 0};
  TU_CHECK(pa_layer_create(&cfg, &layer) == PA_OK, "layer: %s", pa_last_error());
  pa_status st = pa_plan_create(g_ctx[1], layer, &batch, &plan);
  TU_CHECK(st == PA_OK, "plan of INT32_MAX rows: %s (%s)", pa_status_string(st), pa_last_error());
  pa_plan_destroy(plan);
  pa_layer_destroy(layer);
}

/* A sink far above every kept logit (by more than f32's exp range): lse is
 * the sink, the output ~0; once lse came out +inf. */
static void test_dominant_sink(void) {
  float sinks[1] = {10.0f};
  pa_layer_config cfg = {.num_heads = 1,
                         .head_size = 1,
                         .scale = 1.0f,
                         .sinks = sinks,
                         .attn_type = PA_ATTN_ENCODER_ONLY,
                         .dtype = PA_F32};
  pa_layer *layer = NULL;
  TU_CHECK(pa_layer_create(&cfg, &layer) == PA_OK, "layer: %s", pa_last_error());
  float q = 8.0f, k = -10.0f, v = 1.0f, out = -1.0f, lse = 0.0f;
  int32_t cu[2] = {0, 1};
  pa_status st =
      pa_varlen_attention(g_ctx[0], layer, &q, 1, &k, 1, &v, 1, 1, cu, cu, &out, 1, &lse);
  double want_lse = 10.0 + log1p(exp(-90.0)), want_out = exp(-90.0) / (1.0 + exp(-90.0));
  TU_CHECK(st == PA_OK, "dominant sink: %s", pa_last_error());
  TU_CHECK(fabs(lse - want_lse) < 1e-5, "dominant sink: lse %g, want %g", (double)lse, want_lse);
  TU_CHECK(fabs(out - want_out) < 1e-30, "dominant sink: out %g, want %g", (double)out, want_out);
  pa_layer_destroy(layer);
}

int main(void) {
  for (int i = 0; i < 2; i++) {
    if (pa_context_create(i + 1, &g_ctx[i]) != PA_OK) {
      fprintf(stderr, "pa_context_create: %s\n", pa_last_error());
      return 1;
    }
  }
  printf("test_limits: isa %s\n", pa_context_isa(g_ctx[0]));
  double t = tu_now();
  /* FP8 reaches 2^32 + 1024 slots (32 GiB of address space per side); the
   * wider dtypes 2^31 + 1024 (up to 64 GiB per side). */
  test_big_cache(PA_FP8_E4M3, ((int64_t)1 << 28) + 64);
  test_big_cache(PA_F16, ((int64_t)1 << 27) + 64);
  test_big_cache(PA_F32, ((int64_t)1 << 27) + 64);
  test_long_sequences();
  test_lone_row_strides();
  test_plan_of_int32_max_rows();
  test_dominant_sink();
  printf("test_limits: %.2f s\n", tu_now() - t);
  for (int i = 0; i < 2; i++) pa_context_destroy(g_ctx[i]);
  return tu_finish("test_limits");
}
