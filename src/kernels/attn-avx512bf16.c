/* Attention micro-kernels with AVX512-BF16 dot products (vdpbf16ps), for
 * bf16 activations over bf16 caches: Q K^T loses nothing (exact products,
 * f32 sums) and half the instructions of the f32 path go away. P is rounded
 * to bf16 for the P V product, as FlashAttention does on GPUs. FP8 caches
 * have kernels of their own (attn-fp8-avx512bf16.c); this file keeps the
 * FP8 tables that they and the packed kernels share.
 *
 * Q stays raw bf16 (the score factor is applied in the softmax). For P V,
 * two keys' V rows are interleaved word by word (vpunpck{l,h}wd), which
 * leaves the output columns permuted within each 32-column chunk. O's whole
 * chunks stay in that order from one call to the next (pa_attn_ops
 * o_to_columns); a chunk that d cuts short is permuted on load and back
 * on store, so that its masked loads and stores stay within the row. */
#include <pthread.h>

#include "avx512bf16-common.h"
#include "codecs.h"
#include "prefetch.h"

uint16_t pa_e4m3_bf16[128], pa_e5m2_bf16[128];
pa_fp8_bytes pa_e4m3_bytes, pa_e5m2_bytes;
static pthread_once_t pa_tables_once = PTHREAD_ONCE_INIT;

static void split_table(const uint16_t *words, pa_fp8_bytes *bytes) {
  for (int m = 0; m < 128; m++) {
    bytes->low[m] = (uint8_t)(words[m] & 0xff);
    bytes->high[m] = (uint8_t)(words[m] >> 8);
  }
}

static void build_tables(void) {
  for (int m = 0; m < 128; m++) {
    pa_e4m3_bf16[m] = pa_f32_to_bf16(pa_e4m3_to_f32((uint8_t)m));
    pa_e5m2_bf16[m] = pa_f32_to_bf16(pa_e5m2_to_f32((uint8_t)m));
  }
  split_table(pa_e4m3_bf16, &pa_e4m3_bytes);
  split_table(pa_e5m2_bf16, &pa_e5m2_bytes);
}

void pa_bf16_tables_init(void) { pthread_once(&pa_tables_once, build_tables); }

/* Rows of more than 128 elements take their share of the requests once per
 * 32-column chunk (step `done` + keys after each), not once per block: a
 * block's share is 32 lines or more at head size 256, too many at once
 * (docs/code-figures.md, Q K^T request steps). */
PA_INLINE int qk_steps_per_chunk(size_t d) { return d > 128; }

/* One block of rows x keys sums; the block before it (`pending`) is
 * finished after this one's second chunk of dot products, and this one left
 * pending in turn. */
PA_INLINE void qk_block(const int rows, const int keys, size_t d, const uint16_t *q, size_t ldq,
                        const void *const *k, float *s, size_t lds, size_t keys_valid,
                        pa_prefetch *prefetch, size_t done, pa512_pending_block *pending) {
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  PA_FOR_CHUNKS(c, d, 32, "GCC unroll 8", {
    if (qk_steps_per_chunk(d)) pa_prefetch_step(prefetch, done + (c / 32 + 1) * (size_t)keys);
    __mmask32 m = tail_mask32(d - c);
    __m512i qv[4];
    for (int r = 0; r < rows; r++) qv[r] = load_bf16x32(q + r * ldq + c, m, NULL);
    for (int j = 0; j < keys; j++) {
      __m512i kv = load_bf16x32((const uint16_t *)k[j] + c, m, NULL);
      for (int r = 0; r < rows; r++) acc[r * keys + j] = dot(acc[r * keys + j], qv[r], kv);
    }
    if (c == 32) pa512_finish_block(rows, pending, lds);
  });
  pa512_finish_block(rows, pending, lds);
  pa512_reduce16_begin(acc, pending, s, keys_valid);
}

PA_INLINE void qk_rows(const int rows, size_t n, size_t d, const uint16_t *q, size_t ldq,
                       const void *const *k_rows, float *s, size_t lds, pa_prefetch *prefetch) {
  const int keys = 16 / rows;
  const size_t chunks = (d + 31) / 32;
  pa512_pending_block pending = {.s = NULL};
  for (size_t j = 0; j < n; j += (size_t)keys) {
    if (!qk_steps_per_chunk(d)) pa_prefetch_step(prefetch, j + (size_t)keys);
    const void *k[16];
    size_t valid = pa_key_block(k_rows, j, keys, n, k);
    qk_block(rows, keys, d, q, ldq, k, s + j, lds, valid, prefetch, j * chunks, &pending);
  }
  pa512_finish_block(rows, &pending, lds);
}

static void pa_qk_bf16_bf16_avx512bf16(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                                       const void *const *k_rows, float *s, size_t lds,
                                       pa_prefetch *prefetch) {
  const uint16_t *q = q_rows;
#define QK_GROUP(rows, i) \
  qk_rows(rows, n, width, q + (i)*ldq, ldq, k_rows, s + (i)*lds, lds, prefetch)
  /* A group's loop counts its steps in keys, or in key x chunk (see qk_steps_per_chunk). */
  size_t steps = qk_steps_per_chunk(d) ? n * ((d + 31) / 32) : n;
  PA_WITH_HEAD_SIZE(d, width, PA_ROW_GROUPS(prefetch, m, steps, QK_GROUP));
#undef QK_GROUP
}

/* Where the 32 columns of a chunk sit in the (low, high) accumulators after
 * the word interleave: low holds columns 0-3, 8-11, 16-19, 24-27. */
static const int32_t pa_to_low[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
static const int32_t pa_to_high[16] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
static const int32_t pa_from_0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
static const int32_t pa_from_1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

/* O[0..rows)[c0 .. c0 + 32 chunks) += P V over n <= 64 keys whose P rows
 * are already bf16 pairs. */
PA_INLINE void pv_block(const int rows, const int chunks, size_t n, size_t c0, size_t d,
                        const uint32_t (*pairs)[PA_PAIR_KEYS / 2], const void *const *v_rows,
                        float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  const __m512i to_low = _mm512_loadu_si512(pa_to_low), to_high = _mm512_loadu_si512(pa_to_high);
  __mmask32 mask[4];
  __m512 low[4][4], high[4][4];
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 32 * (size_t)c;
    size_t left = col < d ? d - col : 0;
    mask[c] = tail_mask32(left);
    __mmask16 m0 = pa512_tail_mask(left), m1 = pa512_tail_mask(left > 16 ? left - 16 : 0);
    for (int r = 0; r < rows; r++) {
      __m512 scale = pa512_row_scale(rescale, r);
      const float *row = o + r * ldo + col;
      if (left >= 32) {
        low[r][c] = pa512_scaled(_mm512_loadu_ps(row), scale);
        high[r][c] = pa512_scaled(_mm512_loadu_ps(row + 16), scale);
        continue;
      }
      __m512 o0 = pa512_scaled(_mm512_maskz_loadu_ps(m0, row), scale);
      __m512 o1 = pa512_scaled(_mm512_maskz_loadu_ps(m1, row + 16), scale);
      low[r][c] = _mm512_permutex2var_ps(o0, to_low, o1);
      high[r][c] = _mm512_permutex2var_ps(o0, to_high, o1);
    }
  }
  for (size_t j = 0; j < n; j += 2) {
    pa_prefetch_step(prefetch, j + 2);
    const uint16_t *va = (const uint16_t *)v_rows[j] + c0;
    const uint16_t *vb = j + 1 < n ? (const uint16_t *)v_rows[j + 1] + c0 : NULL;
    __m512i lo_v[4], hi_v[4];
    for (int c = 0; c < chunks; c++) {
      __m512i a = load_bf16x32(va + 32 * c, mask[c], NULL);
      __m512i b = vb ? load_bf16x32(vb + 32 * c, mask[c], NULL) : _mm512_setzero_si512();
      lo_v[c] = _mm512_unpacklo_epi16(a, b);
      hi_v[c] = _mm512_unpackhi_epi16(a, b);
    }
    for (int r = 0; r < rows; r++) {
      __m512i weights = _mm512_set1_epi32((int)pairs[r][j / 2]);
      for (int c = 0; c < chunks; c++) {
        low[r][c] = dot(low[r][c], weights, lo_v[c]);
        high[r][c] = dot(high[r][c], weights, hi_v[c]);
      }
    }
  }
  const __m512i from_0 = _mm512_loadu_si512(pa_from_0), from_1 = _mm512_loadu_si512(pa_from_1);
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 32 * (size_t)c;
    size_t left = col < d ? d - col : 0;
    __mmask16 m0 = pa512_tail_mask(left), m1 = pa512_tail_mask(left > 16 ? left - 16 : 0);
    for (int r = 0; r < rows; r++) {
      float *row = o + r * ldo + col;
      if (left >= 32) {
        _mm512_storeu_ps(row, low[r][c]);
        _mm512_storeu_ps(row + 16, high[r][c]);
        continue;
      }
      _mm512_mask_storeu_ps(row, m0, _mm512_permutex2var_ps(low[r][c], from_0, high[r][c]));
      _mm512_mask_storeu_ps(row + 16, m1, _mm512_permutex2var_ps(low[r][c], from_1, high[r][c]));
    }
  }
}

/* O's whole 32-column chunks through the two-source permutes `first` and
 * `second` (pa_from_0 and pa_from_1 into column order, pa_to_low and
 * pa_to_high into pv_block's). */
PA_INLINE void reorder_chunks(float *o, size_t d, const int32_t *first, const int32_t *second) {
  const __m512i a = _mm512_loadu_si512(first), b = _mm512_loadu_si512(second);
  for (size_t col = 0; col + 32 <= d; col += 32) {
    __m512 lo = _mm512_loadu_ps(o + col), hi = _mm512_loadu_ps(o + col + 16);
    _mm512_storeu_ps(o + col, _mm512_permutex2var_ps(lo, a, hi));
    _mm512_storeu_ps(o + col + 16, _mm512_permutex2var_ps(lo, b, hi));
  }
}

static void pa_o_to_columns_bf16_avx512bf16(float *o, size_t d) {
  reorder_chunks(o, d, pa_from_0, pa_from_1);
}

static void pa_o_from_columns_bf16_avx512bf16(float *o, size_t d) {
  reorder_chunks(o, d, pa_to_low, pa_to_high);
}

/* One group of `rows` rows (1-4) over every column of O: 32-column chunks
 * in blocks of up to `width` chunks, a block sized to the columns left so
 * that no chunk is all padding (head size 64: two chunks, not four of which
 * two load and multiply nothing). */
PA_INLINE void pv_group(const int rows, const int width, size_t j0, size_t count, size_t n,
                        size_t m, size_t i, size_t d, const uint32_t (*pairs)[PA_PAIR_KEYS / 2],
                        const void *const *v, float *o, size_t ldo, const float *scales,
                        pa_prefetch *prefetch) {
  for (size_t c0 = 0; c0 < d; c0 += 32 * (size_t)width) {
    size_t left = (d - c0 + 31) / 32;
    pa_prefetch_span(prefetch, j0 * m * d + count * (i * d + (size_t)rows * c0),
                     count * (size_t)rows * PA_MIN(d - c0, 32 * (size_t)width), n * m * d, count);
    const float *r = pa_rescale_from(scales, i);
    if (left >= (size_t)width) {
      pv_block(rows, width, count, c0, d, pairs, v, o + i * ldo, ldo, r, prefetch);
    } else if (left == 3) {
      pv_block(rows, 3, count, c0, d, pairs, v, o + i * ldo, ldo, r, prefetch);
    } else if (left == 2) {
      pv_block(rows, 2, count, c0, d, pairs, v, o + i * ldo, ldo, r, prefetch);
    } else {
      pv_block(rows, 1, count, c0, d, pairs, v, o + i * ldo, ldo, r, prefetch);
    }
  }
}

/* Rows in groups of 4, then one of 3, 2 or 1, so that each V row is read
 * once per group: 4 or 3 rows take 2-chunk blocks (16 or 12
 * accumulators), 2 or 1 rows 4-chunk blocks. */
static void pa_pv_bf16_bf16_avx512bf16(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                                       const void *const *v_rows, float *o, size_t ldo,
                                       const float *rescale, pa_prefetch *prefetch) {
  uint32_t pairs[4][PA_PAIR_KEYS / 2];
  /* The budget is spread over the key x row x column products. */
  for (size_t j0 = 0; j0 < n; j0 += PA_PAIR_KEYS) {
    size_t count = n - j0 < PA_PAIR_KEYS ? n - j0 : PA_PAIR_KEYS;
    const void *const *v = v_rows + j0;
    /* Only the first chunk applies the correction: later ones find O rescaled. */
    const float *scales = j0 == 0 ? rescale : NULL;
#define PV_GROUP(rows, i)                                                                \
  do {                                                                                   \
    pack_pairs(rows, count, p + (i)*ldp + j0, ldp, pairs);                               \
    pv_group(rows, (rows) >= 3 ? 2 : 4, j0, count, n, m, i, d, pairs, v, o, ldo, scales, \
             prefetch);                                                                  \
  } while (0)
    PA_ROW_GROUPS_OF_4(m, PV_GROUP);
#undef PV_GROUP
  }
}

/* The bf16 pair's direct kernels, on the dot products or (`dot` 0) on the
 * FMA units, both with Q as it is stored: the packed kernels of the pair
 * (these dot products' or AMX's) share that Q. */
void pa_attn_kernels_avx512bf16(pa_kernels *k, int dot) {
  pa_attn_ops *ops = &k->attn[PA_BF16][PA_BF16];
  ops->load_q = pa_load_q_bf16;
  ops->load_q_packed = pa_load_q_bf16;
  ops->q_size = 2;
  ops->scale_scores = 1;
  ops->p_bf16 = dot;
  ops->qk = dot ? pa_qk_bf16_bf16_avx512bf16 : pa_qk_bf16_bf16_avx512;
  ops->pv = dot ? pa_pv_bf16_bf16_avx512bf16 : pa_pv_bf16_bf16_avx512;
  ops->o_to_columns = dot ? pa_o_to_columns_bf16_avx512bf16 : NULL;
  ops->o_from_columns = dot ? pa_o_from_columns_bf16_avx512bf16 : NULL;
}
