/* The online softmax of a key tile (pa_softmax_fn) on AVX-512, one source
 * for the families that store its weights differently: f32 over S
 * (attn-avx512.c), or bf16 over the start of each row, or as split pairs,
 * for the P V kernels that take them so (softmax_bf16_rows and
 * softmax_split_rows, prefill-avx512bf16.c). */
#ifndef PA_SOFTMAX_AVX512_H
#define PA_SOFTMAX_AVX512_H

#include <math.h>
#include <string.h>

#include "avx512-common.h"
#include "kernels.h"

/* Stores the weights of keys [j, j + 16) of a row (lanes in in_tile; the
 * others are zeros, which a split store writes too). */
typedef void (*pa512_store_weights)(float *row, size_t j, __m512 weights, __mmask16 in_tile);
/* Stores the weights of keys [j, j + 16) and [j + 16, j + 32): a pair
 * converts to bf16 in one instruction. */
typedef void (*pa512_store_weight_pair)(float *row, size_t j, __m512 lo, __m512 hi);

/* The zeros after a row's n bf16 weights (see softmax_bf16_rows); none
 * (and no call) for whole tiles, the common case. */
PA_INLINE void zero_bf16_tail(float *row, size_t n) {
  size_t pad = pa_bf16_row_keys(n) - n;
  if (pad) memset((char *)row + n * 2, 0, pad * 2);
}

/* The weight 2^x: to 1e-4 where it will be rounded to bf16, else to f32;
 * where no logit is -inf (raw scores) without the mask for it. */
PA_INLINE __m512 weight_of(__m512 x, int rounded, int finite) {
  if (rounded) return finite ? pa512_exp2_bf16_finite(x) : pa512_exp2_bf16(x);
  return finite ? pa512_exp2_finite(x) : pa512_exp2(x);
}

/* The tile's columns [*lo, *hi) that row i sees (possibly none). */
PA_INLINE void visible_columns(const pa_softmax_tile *t, size_t i, int64_t *lo, int64_t *hi) {
  *lo = 0, *hi = (int64_t)t->n;
  if (t->key_lo) {
    *lo = PA_MAX((int64_t)t->key_lo[i] - t->first_key, 0);
    *hi = PA_MIN((int64_t)t->key_hi[i] - t->first_key, (int64_t)t->n);
  }
}

/* The lanes of columns [j, j + 16) inside [lo, hi). */
PA_INLINE __mmask16 columns_in(int64_t lo, int64_t hi, size_t j) {
  int64_t first = lo - (int64_t)j, end = hi - (int64_t)j;
  uint32_t before_end = end >= 16 ? 0xffffu : end <= 0 ? 0u : (1u << end) - 1;
  uint32_t from_first = first <= 0 ? 0xffffu : first >= 16 ? 0u : 0xffffu & ~((1u << first) - 1);
  return (__mmask16)(before_end & from_first);
}

/* Base-2 logits of row i's visible columns written over the row (-inf
 * elsewhere in the tile); returns their lane-wise maximum. */
PA_INLINE __m512 logits_row(const pa_softmax_tile *t, size_t i, float *row) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  const float cap = t->soft_cap;
  int64_t lo, hi;
  visible_columns(t, i, &lo, &hi);
  __m512 vmax = minus_inf;
  for (size_t j = 0; j < t->n; j += 16) {
    __mmask16 in_tile = pa512_tail_mask(t->n - j);
    __m512 column = _mm512_add_ps(iota, _mm512_set1_ps((float)j));
    __mmask16 visible =
        _mm512_mask_cmp_ps_mask(in_tile, column, _mm512_set1_ps((float)lo), _CMP_GE_OQ) &
        _mm512_cmp_ps_mask(column, _mm512_set1_ps((float)hi), _CMP_LT_OQ);
    __m512 x =
        _mm512_mul_ps(_mm512_maskz_loadu_ps(visible, row + j), _mm512_set1_ps(t->score_scale));
    if (cap > 0.0f) {
      x = _mm512_mul_ps(_mm512_set1_ps(cap),
                        pa512_tanh(_mm512_mul_ps(x, _mm512_set1_ps(pa_soft_cap_inverse(cap)))));
    }
    if (t->alibi) {
      float distance = (float)(t->first_key - t->position[i]);
      __m512 bias = _mm512_add_ps(column, _mm512_set1_ps(distance));
      x = _mm512_fmadd_ps(_mm512_set1_ps(t->alibi[i]), bias, x);
    }
    x = _mm512_mask_mov_ps(minus_inf, visible, _mm512_mul_ps(x, _mm512_set1_ps(PA_LOG2E)));
    _mm512_mask_storeu_ps(row + j, in_tile, x);
    vmax = _mm512_max_ps(x, vmax); /* a NaN x is passed over, as fmaxf does */
  }
  return vmax;
}

/* Lane-wise maximum of a row's raw scores in columns [lo, hi) (no cap, no
 * ALiBi: the logits are the scores times a constant and need not be
 * written; the weights pass masks the columns the row does not see). */
PA_INLINE __m512 raw_max_columns(int64_t lo, int64_t hi, const float *row) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = lo / 16 * 16; j < hi; j += 16) {
    __mmask16 m = columns_in(lo, hi, (size_t)j);
    vmax = _mm512_mask_max_ps(vmax, m, _mm512_maskz_loadu_ps(m, row + j), vmax); /* as above */
  }
  return vmax;
}

/* The same over the whole tile. */
PA_INLINE __m512 raw_max_row(size_t n, const float *row) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  size_t j = 0;
  for (; j + 16 <= n; j += 16) vmax = _mm512_max_ps(_mm512_loadu_ps(row + j), vmax); /* as above */
  if (j < n) {
    __mmask16 m = pa512_tail_mask(n - j);
    vmax = _mm512_mask_max_ps(vmax, m, _mm512_maskz_loadu_ps(m, row + j), vmax);
  }
  return vmax;
}

/* How a softmax leaves its weights: f32 over S, the rows of a
 * softmax_bf16_rows (rounded: the exp to 1e-4 is enough), or the pairs of
 * a softmax_split_rows, whose stores write whole vectors (zeros past n). */
enum { PA512_WEIGHTS_F32, PA512_WEIGHTS_BF16_ROWS, PA512_WEIGHTS_SPLIT };

/* Three passes, the per-row reductions done 16 rows at a time by a
 * transpose tree: every row's maximum and the correction of its running
 * state; every row's weights; every row's sum. Without a cap or ALiBi
 * (`raw`) no logits are written: the weights are 2^(s * c - max) with c
 * the score scale in base 2, one FMA from the raw score, and a row that
 * sees only part of the tile (a causal diagonal, a window) has the other
 * columns' weights masked to zero. */
PA_INLINE void pa512_softmax(const pa_softmax_tile *t, float *s, size_t lds, const int form,
                             pa512_store_weights store, pa512_store_weight_pair store_pair) {
  const int raw = t->soft_cap == 0.0f && !t->alibi;
  const int bf16_rows = form == PA512_WEIGHTS_BF16_ROWS;
  const int rounded = bf16_rows || t->bf16_weights;
  /* In a local: the stores through `row` may alias *t as far as the
   * compiler knows, and t->n would be reloaded after each. */
  const size_t n = t->n;
  const float c = t->score_scale * PA_LOG2E;
  __m512 lanes[16];
  for (size_t i0 = 0; i0 < t->m; i0 += 16) {
    size_t rows = t->m - i0 < 16 ? t->m - i0 : 16; /* >= 1 as i0 < m */
    for (size_t r = 0; r < rows; r++) {            // cppcheck-suppress knownConditionTrueFalse
      float *row = s + (i0 + r) * lds;
      int64_t first, end;
      visible_columns(t, i0 + r, &first, &end);
      lanes[r] = !raw                              ? logits_row(t, i0 + r, row)
                 : first == 0 && end == (int64_t)n ? raw_max_row(n, row)
                                                   : raw_max_columns(first, end, row);
    }
    for (size_t r = rows; r < 16; r++) lanes[r] = _mm512_set1_ps(-INFINITY);
    __m512 tile_max = pa512_reduce16_with(lanes, pa512_max);
    if (raw) tile_max = _mm512_mul_ps(tile_max, _mm512_set1_ps(c));
    __mmask16 m = pa512_tail_mask(rows);
    __m512 before = _mm512_maskz_loadu_ps(m, t->row_max + i0);
    __m512 after = _mm512_max_ps(before, tile_max);
    /* 2^(-inf) = 0 when the first key arrives; 1 while no key has come. */
    __mmask16 none = _mm512_cmp_ps_mask(after, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
    __m512 correction =
        _mm512_mask_mov_ps(pa512_exp2(_mm512_sub_ps(before, after)), none, _mm512_set1_ps(1.0f));
    _mm512_mask_storeu_ps(t->row_max + i0, m, after);
    _mm512_mask_storeu_ps(t->rescale + i0, m, correction);
    __m512 sum = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, t->row_sum + i0), correction);

    for (size_t r = 0; r < 16; r++) lanes[r] = _mm512_setzero_ps();
    /* Each row's shift is taken from `after` in registers, not read back
     * from row_max behind the masked store above, which would wait on the
     * store (docs/code-figures.md, AVX-512 pa_softmax_avx512). */
    const __m512 minus_after = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(after), _mm512_set1_epi32(INT32_MIN)));
    for (size_t r = 0; r < rows; r++) {  // cppcheck-suppress knownConditionTrueFalse
      float *row = s + (i0 + r) * lds;
      if (none & (1u << r)) { /* no key seen yet: nothing to weigh */
        for (size_t j = 0; j < n; j += 16)
          store(row, j, _mm512_setzero_ps(), pa512_tail_mask(n - j));
        if (bf16_rows) zero_bf16_tail(row, n);
        continue;
      }
      __m512 scale = _mm512_set1_ps(raw ? c : 1.0f),
             minus = _mm512_permutexvar_ps(_mm512_set1_epi32((int)r), minus_after);
      /* The row's sum in a register: lanes[r], indexed at run time, lives
       * in memory, and adding into it there chains every step through a
       * store and a reload. */
      __m512 total = _mm512_setzero_ps();
      size_t j = 0;
      int64_t first, end;
      visible_columns(t, i0 + r, &first, &end);
      if (raw && (first > 0 || end < (int64_t)n)) { /* part of the tile, by masks */
        for (; j < n; j += 16) {
          __mmask16 seen = columns_in(first, end, j);
          __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(seen, row + j), scale, minus);
          __m512 weight = _mm512_maskz_mov_ps(seen, weight_of(x, rounded, 1));
          store(row, j, weight, pa512_tail_mask(n - j));
          total = _mm512_add_ps(total, weight);
        }
      }
      /* Whole pairs of vectors without masks, then the tail
       * (docs/code-figures.md, AVX-512 pa_softmax_avx512). */
      for (; j + 32 <= n; j += 32) {
        __m512 lo = _mm512_fmadd_ps(_mm512_loadu_ps(row + j), scale, minus);
        __m512 hi = _mm512_fmadd_ps(_mm512_loadu_ps(row + j + 16), scale, minus);
        lo = weight_of(lo, rounded, raw);
        hi = weight_of(hi, rounded, raw);
        store_pair(row, j, lo, hi);
        total = _mm512_add_ps(total, _mm512_add_ps(lo, hi));
      }
      for (; j < n; j += 16) {
        __mmask16 in_tile = pa512_tail_mask(n - j);
        __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in_tile, row + j), scale, minus);
        __m512 weight = _mm512_maskz_mov_ps(in_tile, weight_of(x, rounded, raw));
        store(row, j, weight, in_tile);
        total = _mm512_add_ps(total, weight);
      }
      if (bf16_rows) zero_bf16_tail(row, n);
      lanes[r] = total;
    }
    sum = _mm512_add_ps(sum, pa512_reduce16(lanes));
    _mm512_mask_storeu_ps(t->row_sum + i0, m, sum);
  }
}

#endif
