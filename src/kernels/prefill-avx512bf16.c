/* Packed-tile micro-kernels for prefill with AVX512-BF16 dot products: the
 * bf16 pair layouts of kernels.h. K^T pairs come from a 16 x 16 transpose of
 * 32-bit pairs; V pairs interleave two keys' rows word by word. */
#include <string.h>

#include "avx512bf16-common.h"
#include "prefetch.h"
#include "softmax-avx512.h"

/* K^T as pairs: each K row is d/2 pairs; transposing the (keys x pairs)
 * matrix of 32-bit elements puts 16 keys' pair e next to each other. */
PA_INLINE void pack_k_pairs(pa_bf16_loader load, size_t elem, const uint16_t *table, void *dst,
                            const void *const *rows, size_t n, size_t d) {
  pa_bf16_tables tables = table ? load_tables(table) : (pa_bf16_tables){0};
  uint32_t *kt = dst;
  size_t pairs = (d + 1) / 2;
  for (size_t j0 = 0; j0 < (n + 63) / 64 * 64; j0 += 16) { /* the columns qk_packed reads */
    for (size_t e0 = 0; e0 < d; e0 += 32) {
      __mmask32 m = tail_mask32(d - e0);
      __m512 block[16];
      for (size_t j = 0; j < 16; j++) {
        block[j] =
            j0 + j < n
                ? _mm512_castsi512_ps(load((const char *)rows[j0 + j] + e0 * elem, m, &tables))
                : _mm512_setzero_ps();
      }
      pa512_transpose16(block);
      for (size_t p = 0; p < 16 && e0 / 2 + p < pairs; p++) {
        _mm512_storeu_si512(kt + (e0 / 2 + p) * PA_PACK_KEYS + j0, _mm512_castps_si512(block[p]));
      }
    }
  }
}

/* V as pairs of keys: word 2k of a pair vector is v_j[c + k], word 2k + 1
 * is v_{j+1}[c + k], in column order. */
static const int16_t pa_interleave_low[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                              37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                              11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

PA_INLINE void pack_v_pairs(pa_bf16_loader load, size_t elem, const uint16_t *table, void *dst,
                            const void *const *rows, size_t n, size_t d) {
  pa_bf16_tables tables = table ? load_tables(table) : (pa_bf16_tables){0};
  uint32_t *v = dst;
  size_t ldv = (d + 15) / 16 * 16;
  const __m512i low = _mm512_loadu_si512(pa_interleave_low);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (size_t j = 0; j < n; j += 2) {
    for (size_t e = 0; e < d; e += 32) {
      __mmask32 m = tail_mask32(d - e);
      __m512i a = load((const char *)rows[j] + e * elem, m, &tables);
      __m512i b = j + 1 < n ? load((const char *)rows[j + 1] + e * elem, m, &tables)
                            : _mm512_setzero_si512();
      uint32_t *out = v + (j / 2) * ldv + e;
      _mm512_storeu_si512(out, _mm512_permutex2var_epi16(a, low, b));
      if (e + 16 < ldv) _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi16(a, high, b));
    }
  }
}

#define PA_DEFINE_PACK(suffix, loader, elem, table)                                              \
  static void pa_pack_k_##suffix##_avx512bf16(void *dst, const void *const *rows, size_t n,      \
                                              size_t d) {                                        \
    pack_k_pairs(loader, elem, table, dst, rows, n, d);                                          \
  }                                                                                              \
  void pa_pack_v_##suffix##_avx512bf16(void *dst, const void *const *rows, size_t n, size_t d) { \
    pack_v_pairs(loader, elem, table, dst, rows, n, d);                                          \
  }

PA_DEFINE_PACK(bf16, load_bf16x32, 2, NULL)
PA_DEFINE_PACK(e4m3, load_fp8x32, 1, pa_e4m3_bf16)
PA_DEFINE_PACK(e5m2, load_fp8x32, 1, pa_e5m2_bf16)

/* Two adjacent bf16 as one 32-bit pair (memcpy: no aliasing or alignment
 * assumption; it compiles to the broadcast's memory operand). */
PA_INLINE uint32_t pair_at(const uint16_t *p) {
  uint32_t pair;
  memcpy(&pair, p, sizeof pair);
  return pair;
}

/* Where a block's K^T pair rows lie: column vector c's pair row e (16
 * keys' pair e) at col[c] + e * stride, in 32-bit pairs. Packed: one
 * buffer, rows PA_PACK_KEYS apart; a tiled cache: each 16-key group in
 * place, its pair rows one after the other. */
typedef struct pa_kt_cols {
  const uint32_t *col[4];
  size_t stride;
} pa_kt_cols;

/* rows x (16 cols) scores over the pairs [0, pairs) of Q's rows (element
 * stride ldq): one broadcast of row r's pair e, `cols` K^T loads per step.
 * The block's loop counts its pairs from `counted` (for its requests). */
PA_INLINE void qk_pairs_steps(const int rows, const int cols, size_t pairs, const uint16_t *q,
                              size_t ldq, const pa_kt_cols *kt, __m512 acc[6][4],
                              pa_prefetch *prefetch, size_t counted) {
  for (size_t e = 0; e < pairs; e++) {
    pa_prefetch_packed(prefetch, counted + e);
    __m512i kv[4];
    for (int c = 0; c < cols; c++) kv[c] = _mm512_loadu_si512(kt->col[c] + e * kt->stride);
    for (int r = 0; r < rows; r++) {
      __m512i b = _mm512_set1_epi32((int)pair_at(q + r * ldq + 2 * e));
      for (int c = 0; c < cols; c++) acc[r][c] = dot(acc[r][c], b, kv[c]);
    }
  }
}

/* The block is units [first, first + rows * keys) of the call's `total`. */
PA_INLINE void qk_pairs_block(const int rows, const int cols, size_t keys, size_t d,
                              const uint16_t *q, size_t ldq, const pa_kt_cols *kt, float *s,
                              size_t lds, pa_prefetch *prefetch, size_t first, size_t total) {
  pa_prefetch_span(prefetch, first, (size_t)rows * keys, total, pa_packed_steps((d + 1) / 2));
  __m512 acc[6][4];
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) acc[r][c] = _mm512_setzero_ps();
  }
  qk_pairs_steps(rows, cols, d / 2, q, ldq, kt, acc, prefetch, 0);
  if (d % 2) { /* an odd row's last element pairs with zero, not with what follows */
    uint16_t last[6][2];
    for (int r = 0; r < rows; r++) {
      last[r][0] = q[r * ldq + d - 1];
      last[r][1] = 0;
    }
    pa_kt_cols tail = *kt;
    for (int c = 0; c < cols; c++) tail.col[c] += (d / 2) * kt->stride;
    qk_pairs_steps(rows, cols, 1, &last[0][0], 2, &tail, acc, prefetch, d / 2);
  }
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) _mm512_storeu_ps(s + r * lds + 16 * c, acc[r][c]);
  }
}

/* S = Q K^T over K^T pairs packed (k: the buffer) or in a tiled cache's
 * groups (`tiled`; k: key j's anchor at [j], a 16-key group's start). */
PA_INLINE void qk_pairs(const int tiled, size_t m, size_t n, size_t d, const uint16_t *q,
                        size_t ldq, const void *k, float *s, size_t lds, pa_prefetch *prefetch) {
  const uint32_t *k_packed = k;
  const void *const *k_anchors = k;
  /* 64 keys at a time, the last block in as many 16-key columns as it
   * needs. The requests are spread over the row x key products. */
  for (size_t k0 = 0; k0 < n; k0 += 64) {
    size_t keys = PA_MIN(n - k0, 64);
    pa_kt_cols kt = {{0}, tiled ? PA_TILED_GROUP : PA_PACK_KEYS};
    for (size_t c = 0; c < 4; c++) { /* those past the block's columns repeat its last */
      size_t j = k0 + 16 * PA_MIN(c, (keys - 1) / 16);
      kt.col[c] = tiled ? k_anchors[j] : k_packed + j;
    }
#define QK_BLOCK(rows, i)                                                                     \
  qk_pairs_block(rows, cols, keys, d, q + (i)*ldq, ldq, &kt, s + (i)*lds + k0, lds, prefetch, \
                 k0 * m + (i)*keys, m * n)
    PA_FOR_COLUMN_VECTORS(keys, PA_PACKED_ROW_BLOCKS(m, QK_BLOCK));
#undef QK_BLOCK
  }
}

void pa_qk_packed_bf16_avx512bf16(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                                  const void *k_packed, float *s, size_t lds,
                                  pa_prefetch *prefetch) {
  qk_pairs(0, m, n, d, q_rows, ldq, k_packed, s, lds, prefetch);
}

/* Columns past n up to a multiple of 16 get the products of whatever their
 * group holds there. */
static void pa_qk_tiled_bf16_avx512bf16(size_t m, size_t n, size_t d, const void *q_rows,
                                        size_t ldq, const void *const *k_anchors, void *stage,
                                        float *s, size_t lds, pa_prefetch *prefetch) {
  (void)stage;
  qk_pairs(1, m, n, d, q_rows, ldq, k_anchors, s, lds, prefetch);
}

/* Where P V finds the V pairs of keys j and j + 1 (j even) for the 16
 * columns from c (a multiple of 16): packed, packed + j / 2 * ldv + c; a
 * tiled cache, anchors[j] + c / 16 * group (a block's pair rows of one
 * column group lie one after the other, its column groups `group` apart). */
typedef struct pa_v_pairs {
  const uint32_t *packed;
  size_t ldv;
  const void *const *anchors;
  size_t group;
} pa_v_pairs;

PA_INLINE const uint32_t *v_pair_row(const pa_v_pairs *v, size_t j, size_t c) {
  return v->anchors ? (const uint32_t *)v->anchors[j] + c / 16 * v->group
                    : v->packed + j / 2 * v->ldv + c;
}

/* O block += the pair of keys j, j + 1 (the bf16 weights at P's row r,
 * rows ldp floats apart); `keep` masks the V words used (all, or the
 * first key's where the second is past n). */
PA_INLINE void pv_pair_step(const int rows, const int cols, const pa_v_pairs *v, size_t j,
                            size_t c0, __m512i keep, const float *p, size_t ldp, __m512 acc[6][4]) {
  const uint32_t *vj = v_pair_row(v, j, c0);
  size_t step = v->anchors ? v->group : 16;
  __m512i vc[4];
  for (int c = 0; c < cols; c++)
    vc[c] = _mm512_and_si512(_mm512_loadu_si512(vj + (size_t)c * step), keep);
  for (int r = 0; r < rows; r++) {
    __m512i b = _mm512_broadcastd_epi32(_mm_loadu_si32((const char *)(p + r * ldp) + j * 2));
    for (int c = 0; c < cols; c++) acc[r][c] = dot(acc[r][c], b, vc[c]);
  }
}

/* rows x (16 cols) columns of O from c0; `cols` (a constant) vectors
 * hold the block's columns below d, only the last of which may be partial
 * (`partial`; docs/code-figures.md, pv_packed_block). */
PA_INLINE void pv_pairs_block(const int rows, const int cols, const int partial, size_t n,
                              size_t c0, size_t d, const float *p, size_t ldp, const pa_v_pairs *v,
                              float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  /* Full V loads up to d (rows are padded to 16); see prefill-avx512.c. */
  const __mmask16 last = partial ? pa512_tail_mask(d - c0 - 16 * (size_t)(cols - 1)) : 0xffff;
  const __m512i all = _mm512_set1_epi32(-1);
  __m512 acc[6][4];
  pa512_load_o_block(rows, cols, partial, last, o + c0, ldo, rescale, acc);
  size_t j = 0;
  for (; j + 2 <= n; j += 2) {
    pa_prefetch_packed(prefetch, j); /* j even: every PA_PACKED_STEP keys */
    pv_pair_step(rows, cols, v, j, c0, all, p, ldp, acc);
  }
  if (j < n) { /* key n may be anything in a tiled cache, NaN included */
    pa_prefetch_packed(prefetch, j);
    pv_pair_step(rows, cols, v, j, c0, _mm512_set1_epi32(0xffff), p, ldp, acc);
  }
  pa512_store_o_block(rows, cols, partial, last, o + c0, ldo, acc);
}

/* Rows [i, i + rows) of m: units [i d, (i + rows) d) of the row x column
 * products over which the requests are spread. */
PA_INLINE void pv_pairs_rows(const int rows, size_t i, size_t m, size_t n, size_t d, const float *p,
                             size_t ldp, const pa_v_pairs *v, float *o, size_t ldo,
                             const float *rescale, pa_prefetch *prefetch) {
  /* The block's weights side by side: one base register addresses all its
   * rows, where rows ldp apart take one each and the 6-row block spills. */
  float pairs[6][PA_PAIR_KEYS / 2];
  for (int r = 0; r < rows; r++) memcpy(pairs[r], p + r * ldp, (n + 1) / 2 * sizeof(float));
  p = pairs[0];
  ldp = PA_PAIR_KEYS / 2;
  for (size_t c0 = 0; c0 < d; c0 += 64) {
    pa_prefetch_span(prefetch, i * d + (size_t)rows * c0, (size_t)rows * PA_MIN(d - c0, 64), m * d,
                     pa_packed_steps(n));
    if (c0 + 64 <= d) {
      pv_pairs_block(rows, 4, 0, n, c0, d, p, ldp, v, o, ldo, rescale, prefetch);
    } else {
      PA_FOR_COLUMN_VECTORS(
          d - c0, pv_pairs_block(rows, cols, 1, n, c0, d, p, ldp, v, o, ldo, rescale, prefetch));
    }
  }
}

/* P: the bf16 rows of pa_softmax_bf16_rows_avx512bf16. */
PA_INLINE void pv_pairs(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                        const pa_v_pairs *v, float *o, size_t ldo, const float *rescale,
                        pa_prefetch *prefetch) {
#define PV_ROWS(rows, i)                                                   \
  pv_pairs_rows(rows, (i), m, n, d, p + (i)*ldp, ldp, v, o + (i)*ldo, ldo, \
                pa_rescale_from(rescale, i), prefetch)
  PA_PACKED_ROW_BLOCKS(m, PV_ROWS);
#undef PV_ROWS
}

void pa_pv_packed_bf16_avx512bf16(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                                  const void *v_packed, float *o, size_t ldo, const float *rescale,
                                  pa_prefetch *prefetch) {
  const pa_v_pairs v = {v_packed, (d + 15) / 16 * 16, NULL, 0};
  pv_pairs(m, n, d, p, ldp, &v, o, ldo, rescale, prefetch);
}

/* A tiled cache's values read in place, any block size (a multiple of 16
 * holds whole pairs); `stage` is not needed. */
static void pa_pv_tiled_bf16_avx512bf16(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                                        const void *const *v_anchors, size_t block_size,
                                        void *stage, float *o, size_t ldo, const float *rescale,
                                        pa_prefetch *prefetch) {
  (void)stage;
  const pa_v_pairs v = {NULL, 0, v_anchors, PA_TILED_GROUP * block_size / 2};
  pv_pairs(m, n, d, p, ldp, &v, o, ldo, rescale, prefetch);
}

/* The softmax for these P V kernels (and AMX's): bf16 weights over the
 * start of each row, which they read as they lie. */
PA_INLINE void store_bf16_weights(float *row, size_t j, __m512 weights, __mmask16 in_tile) {
  _mm256_mask_storeu_epi16((char *)row + j * 2, in_tile, (__m256i)_mm512_cvtneps_pbh(weights));
}

/* Weights are 0 or normal (pa512_exp2_poly), which vcvtne2ps2bf16 rounds
 * as pa_f32_to_bf16 does (it would flush subnormals). */
PA_INLINE void store_bf16_weight_pair(float *row, size_t j, __m512 lo, __m512 hi) {
  _mm512_storeu_si512((char *)row + j * 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

static void pa_softmax_bf16_rows_avx512bf16(const pa_softmax_tile *t, float *s, size_t lds) {
  pa512_softmax(t, s, lds, PA512_WEIGHTS_BF16_ROWS, store_bf16_weights, store_bf16_weight_pair);
}

/* vcvtne2ps2bf16(rests, weights) leaves weight k's high part in word k
 * and its rest in word 16 + k: they go to words 2k and 2k + 1. */
static const uint16_t pa_pair_words[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                           21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                           11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* The split pairs of 16 weights (see PA_SPLIT_ROW_KEYS), each over its own
 * float. Weights are finite or NaN (never infinite), so the rest needs no
 * mask (bf16_parts has one for Q). */
PA_INLINE __m512i split_pairs(__m512 weights) {
  __m256i high = (__m256i)_mm512_cvtneps_pbh(weights);
  __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(high), 16));
  __m512i both = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(weights, back), weights);
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(pa_pair_words), both);
}

/* Whole vectors: the lanes past n hold zeros (pa512_softmax), and the
 * split rows have zero pairs up to a multiple of 16. */
PA_INLINE void store_split_weights(float *row, size_t j, __m512 weights, __mmask16 in_tile) {
  (void)in_tile;
  _mm512_storeu_si512(row + j, split_pairs(weights));
}

PA_INLINE void store_split_weight_pair(float *row, size_t j, __m512 lo, __m512 hi) {
  _mm512_storeu_si512(row + j, split_pairs(lo));
  _mm512_storeu_si512(row + j + 16, split_pairs(hi));
}

static void pa_softmax_split_rows_avx512bf16(const pa_softmax_tile *t, float *s, size_t lds) {
  pa512_softmax(t, s, lds, PA512_WEIGHTS_SPLIT, store_split_weights, store_split_weight_pair);
}

/* These packed kernels overtake the direct ones (whose Q K^T blocks end in a
 * reduction) from 16 rows per KV head for bf16 caches and from 32 for FP8
 * (docs/code-figures.md, packed_min_rows). Without `bf16_pairs` bf16 and FP8 caches keep the f32
 * packed kernels (the FMA path, for CPUs whose dot products are slow and that have no tiles). */
void pa_prefill_kernels_avx512bf16(pa_kernels *k, int bf16_pairs) {
  pa_bf16_tables_init();
  k->softmax_bf16_rows = pa_softmax_bf16_rows_avx512bf16;
  k->softmax_split_rows = pa_softmax_split_rows_avx512bf16;
  if (!bf16_pairs) return;
  static const pa_pack_fn pack_k[PA_NUM_DTYPES] = {[PA_BF16] = pa_pack_k_bf16_avx512bf16,
                                                   [PA_FP8_E4M3] = pa_pack_k_e4m3_avx512bf16,
                                                   [PA_FP8_E5M2] = pa_pack_k_e5m2_avx512bf16};
  static const pa_pack_fn pack_v[PA_NUM_DTYPES] = {[PA_BF16] = pa_pack_v_bf16_avx512bf16,
                                                   [PA_FP8_E4M3] = pa_pack_v_e4m3_avx512bf16,
                                                   [PA_FP8_E5M2] = pa_pack_v_e5m2_avx512bf16};
  for (int cache = 0; cache < PA_NUM_DTYPES; cache++) {
    if (!pack_k[cache]) continue;
    pa_attn_ops *ops = &k->attn[PA_BF16][cache];
    ops->pack_k = pack_k[cache];
    ops->pack_v = pack_v[cache];
    ops->qk_packed = pa_qk_packed_bf16_avx512bf16;
    ops->pv_packed = pa_pv_packed_bf16_avx512bf16;
    ops->packed_p_bf16_rows = 1;
    ops->packed_min_rows = cache == PA_BF16 ? 16 : 32;
  }
  /* A tiled bf16 cache's groups are these kernels' pair layouts, read in
   * place; rows stay the preferred layout (docs/decode-memory.md, "Tiled
   * caches without AMX"). */
  pa_attn_ops *tiled = &k->attn[PA_BF16][PA_BF16];
  tiled->qk_tiled = pa_qk_tiled_bf16_avx512bf16;
  tiled->pv_tiled = pa_pv_tiled_bf16_avx512bf16;
  tiled->tiled_head_multiple = PA_TILED_GROUP;
}
