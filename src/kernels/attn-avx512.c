/* Attention micro-kernels, AVX-512 (f32 FMA on K/V decoded in registers).
 *
 * S = Q K^T works on register blocks of 16 dot products (4 rows x 4 keys,
 * 2 x 8 or 1 x 16): each K chunk is decoded once per block and reused by
 * every row, and the 16 accumulators are reduced together by a transpose
 * tree (45 shuffles and adds instead of 16 separate horizontal sums).
 * O += P V keeps a block of O in registers across all keys of the tile. */
#include <math.h>

#include "avx512-common.h"
#include "kernels.h"
#include "prefetch.h"

typedef __m512 (*pa512_loader)(const void *, __mmask16);

/* rows x keys = 16 dot products; q has `rows` rows of Q elements that
 * `qload` widens (f32, or bf16 as it is stored), k has `keys` pointers
 * (padded by the caller); only rows_valid x keys_valid results are stored. */
PA_INLINE void qk_block(const int rows, const int keys, pa512_loader qload, size_t q_elem,
                        pa512_loader load, size_t elem, size_t d, const char *q, size_t ldq,
                        const void *const *k, float *s, size_t lds, size_t keys_valid) {
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  PA_FOR_CHUNKS(c, d, 16, "GCC unroll 16", {
    __mmask16 m = pa512_tail_mask(d - c);
    __m512 qv[4];
    for (int r = 0; r < rows; r++) qv[r] = qload(q + (r * ldq + c) * q_elem, m);
    for (int j = 0; j < keys; j++) {
      __m512 kv = load((const char *)k[j] + c * elem, m);
      for (int r = 0; r < rows; r++)
        acc[r * keys + j] = _mm512_fmadd_ps(qv[r], kv, acc[r * keys + j]);
    }
  });
  pa512_store_block(rows, pa512_reduce16(acc), s, lds, keys_valid);
}

PA_INLINE void qk_rows(const int rows, pa512_loader qload, size_t q_elem, pa512_loader load,
                       size_t elem, size_t n, size_t d, const char *q, size_t ldq,
                       const void *const *k_rows, float *s, size_t lds, pa_prefetch *prefetch) {
  const int keys = 16 / rows;
  for (size_t j = 0; j < n; j += (size_t)keys) {
    pa_prefetch_step(prefetch, j + (size_t)keys);
    const void *k[16];
    size_t valid = pa_key_block(k_rows, j, keys, n, k);
    qk_block(rows, keys, qload, q_elem, load, elem, d, q, ldq, k, s + j, lds, valid);
  }
}

PA_INLINE void qk(pa512_loader qload, size_t q_elem, pa512_loader load, size_t elem, size_t m,
                  size_t n, size_t d, const void *q_rows, size_t ldq, const void *const *k_rows,
                  float *s, size_t lds, pa_prefetch *prefetch) {
  const char *q = q_rows;
#define QK_GROUP(rows, i)                                                               \
  qk_rows(rows, qload, q_elem, load, elem, n, width, q + (i)*ldq * q_elem, ldq, k_rows, \
          s + (i)*lds, lds, prefetch)
  PA_WITH_HEAD_SIZE(d, width, PA_ROW_GROUPS(prefetch, m, n, QK_GROUP));
#undef QK_GROUP
}

/* acc[r][c] += P[r][j] V[j][c] for keys [0, n), one prefetch step per 8
 * keys (docs/code-figures.md, P V request steps); `full`: no partial
 * chunk, so the loads need no mask test. */
PA_INLINE void pv_keys(const int rows, const int chunks, const int full, pa512_loader load,
                       size_t elem, size_t n, const __mmask16 *mask, const float *p, size_t ldp,
                       const char *const *v_rows, size_t offset, __m512 *acc,
                       pa_prefetch *prefetch) {
  for (size_t j = 0; j < n; j++) {
    if (j % 8 == 0) pa_prefetch_step(prefetch, j + 8);
    __m512 vv[8];
    const char *v = v_rows[j] + offset;
    for (int c = 0; c < chunks; c++)
      vv[c] =
          full ? load(v + 16 * (size_t)c * elem, 0xffff) : load(v + 16 * (size_t)c * elem, mask[c]);
    for (int r = 0; r < rows; r++) {
      __m512 weight = _mm512_set1_ps(p[r * ldp + j]);
      for (int c = 0; c < chunks; c++)
        acc[r * chunks + c] = _mm512_fmadd_ps(weight, vv[c], acc[r * chunks + c]);
    }
  }
}

/* O[0..rows)[c0 .. c0 + 16 chunks) += P V over n keys. */
PA_INLINE void pv_block(const int rows, const int chunks, pa512_loader load, size_t elem, size_t n,
                        size_t c0, size_t d, const float *p, size_t ldp, const void *const *v_rows,
                        float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  __mmask16 mask[8];
  __m512 acc[16];
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 16 * (size_t)c;
    mask[c] = col < d ? pa512_tail_mask(d - col) : 0;
    for (int r = 0; r < rows; r++)
      acc[r * chunks + c] = pa512_scaled(_mm512_maskz_loadu_ps(mask[c], o + r * ldo + col),
                                         pa512_row_scale(rescale, r));
  }
  const char *const *v = (const char *const *)v_rows;
  if (c0 + 16 * (size_t)chunks <= d)
    pv_keys(rows, chunks, 1, load, elem, n, mask, p, ldp, v, c0 * elem, acc, prefetch);
  else
    pv_keys(rows, chunks, 0, load, elem, n, mask, p, ldp, v, c0 * elem, acc, prefetch);
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 16 * (size_t)c;
    for (int r = 0; r < rows; r++)
      _mm512_mask_storeu_ps(o + r * ldo + col, mask[c], acc[r * chunks + c]);
  }
}

/* One group of `rows` rows (1-4) over every column of O, in blocks of up to
 * `width` 16-column chunks; a block takes no more chunks than the columns
 * left need, rounded up to a power of two (head size 64: four chunks, not
 * eight of which four load and multiply nothing). */
PA_INLINE void pv_group(const int rows, const int width, pa512_loader load, size_t elem, size_t i,
                        size_t m, size_t n, size_t d, const float *p, size_t ldp,
                        const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                        pa_prefetch *prefetch) {
  for (size_t c0 = 0; c0 < d; c0 += 16 * (size_t)width) {
    size_t left = (d - c0 + 15) / 16;
    pa_prefetch_span(prefetch, i * d + (size_t)rows * c0,
                     (size_t)rows * PA_MIN(d - c0, 16 * (size_t)width), m * d, n);
    const float *r = pa_rescale_from(rescale, i);
#define PV_BLOCK(chunks)                                                                      \
  pv_block(rows, chunks, load, elem, n, c0, d, p + i * ldp, ldp, v_rows, o + i * ldo, ldo, r, \
           prefetch)
    if (left > 4 && width >= 8) {
      PV_BLOCK(8);
    } else if (left > 2) {
      PV_BLOCK(4);
    } else if (left > 1) {
      PV_BLOCK(2);
    } else {
      PV_BLOCK(1);
    }
#undef PV_BLOCK
  }
}

/* Rows in groups of 4, then one of 3, 2 or 1, so that each V row is read
 * once per group: 4 or 3 rows take 4-chunk blocks, 2 or 1 rows 8-chunk
 * blocks (16 accumulators at most). */
PA_INLINE void pv(pa512_loader load, size_t elem, size_t m, size_t n, size_t d, const float *p,
                  size_t ldp, const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                  pa_prefetch *prefetch) {
#define PV_GROUP(rows, i)                                                                      \
  pv_group(rows, (rows) >= 3 ? 4 : 8, load, elem, i, m, n, d, p, ldp, v_rows, o, ldo, rescale, \
           prefetch)
  PA_ROW_GROUPS_OF_4(m, PV_GROUP);
#undef PV_GROUP
}

#define PA_DEFINE_QK_PV(suffix, loader, elem)                                                      \
  static void pa_qk_f32_##suffix##_avx512(size_t m, size_t n, size_t d, const void *q, size_t ldq, \
                                          const void *const *k_rows, float *s, size_t lds,         \
                                          pa_prefetch *prefetch) {                                 \
    qk(pa512_load_f32, 4, loader, elem, m, n, d, q, ldq, k_rows, s, lds, prefetch);                \
  }                                                                                                \
  static void pa_pv_f32_##suffix##_avx512(                                                         \
      size_t m, size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,         \
      float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {                         \
    pv(loader, elem, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                          \
  }

PA_DEFINE_QK_PV(f32, pa512_load_f32, 4)
PA_DEFINE_QK_PV(f16, pa512_load_f16, 2)
PA_DEFINE_QK_PV(bf16, pa512_load_bf16, 2)
PA_DEFINE_QK_PV(e4m3, pa512_load_e4m3, 1)
PA_DEFINE_QK_PV(e5m2, pa512_load_e5m2, 1)

/* Q K^T with Q as bf16 activations hold it (the score factor left to the
 * pa_softmax_avx512) over a bf16 cache, and P V over it, on the FMA units: the bf16
 * pair's direct kernels where the CPU's bf16 dot products are slower than
 * its FMA (see pa_bf16_dot_is_fast) but its packed ones want Q unscaled. */
void pa_qk_bf16_bf16_avx512(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                            const void *const *k_rows, float *s, size_t lds,
                            pa_prefetch *prefetch) {
  qk(pa512_load_bf16, 2, pa512_load_bf16, 2, m, n, d, q, ldq, k_rows, s, lds, prefetch);
}

void pa_pv_bf16_bf16_avx512(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                            const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                            pa_prefetch *prefetch) {
  pa_pv_f32_bf16_avx512(m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);
}

/* Base-2 logits of row i's visible columns written over the row (-inf
 * elsewhere in the tile); returns their lane-wise maximum. */
PA_INLINE __m512 logits_row(const pa_softmax_tile *t, size_t i, float *row) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  const float cap = t->soft_cap;
  int64_t lo = 0, hi = (int64_t)t->n;
  if (t->key_lo) {
    lo = PA_MAX((int64_t)t->key_lo[i] - t->first_key, 0);
    hi = PA_MIN((int64_t)t->key_hi[i] - t->first_key, (int64_t)t->n);
  }
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
                        pa512_tanh(_mm512_mul_ps(x, _mm512_set1_ps(1.0f / cap))));
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

/* Lane-wise maximum of a row's raw scores (a plain tile: every key
 * visible, no cap, no ALiBi, so the logits are the scores times a constant
 * and need not be written). */
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

/* Three passes, the per-row reductions done 16 rows at a time by a
 * transpose tree: every row's maximum and the correction of its running
 * state; every row's weights; every row's sum. A plain tile (see
 * raw_max_row) skips writing logits: its weights are 2^(s * c - max) with
 * c the score scale in base 2, one FMA from the raw score. */
static void pa_softmax_avx512(const pa_softmax_tile *t, float *s, size_t lds) {
  const int plain = !t->key_lo && t->soft_cap == 0.0f && !t->alibi;
  const float c = t->score_scale * PA_LOG2E;
  __m512 lanes[16];
  for (size_t i0 = 0; i0 < t->m; i0 += 16) {
    size_t rows = t->m - i0 < 16 ? t->m - i0 : 16; /* >= 1 as i0 < m */
    for (size_t r = 0; r < rows; r++) {            // cppcheck-suppress knownConditionTrueFalse
      float *row = s + (i0 + r) * lds;
      lanes[r] = plain ? raw_max_row(t->n, row) : logits_row(t, i0 + r, row);
    }
    for (size_t r = rows; r < 16; r++) lanes[r] = _mm512_set1_ps(-INFINITY);
    __m512 tile_max = pa512_reduce16_with(lanes, pa512_max);
    if (plain) tile_max = _mm512_mul_ps(tile_max, _mm512_set1_ps(c));
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
        for (size_t j = 0; j < t->n; j += 16) {
          _mm512_mask_storeu_ps(row + j, pa512_tail_mask(t->n - j), _mm512_setzero_ps());
        }
        continue;
      }
      __m512 scale = _mm512_set1_ps(plain ? c : 1.0f),
             minus = _mm512_permutexvar_ps(_mm512_set1_epi32((int)r), minus_after);
      /* The row's sum in a register: lanes[r], indexed at run time, lives
       * in memory, and adding into it there chains every step through a
       * store and a reload. */
      __m512 total = _mm512_setzero_ps();
      size_t j = 0;
      /* Whole vectors without masks, then the tail (docs/code-figures.md,
       * AVX-512 pa_softmax_avx512). */
      for (; j + 16 <= t->n; j += 16) {
        __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(row + j), scale, minus);
        __m512 weight = t->bf16_weights ? pa512_exp2_bf16(x) : pa512_exp2(x);
        _mm512_storeu_ps(row + j, weight);
        total = _mm512_add_ps(total, weight);
      }
      if (j < t->n) {
        __mmask16 in_tile = pa512_tail_mask(t->n - j);
        __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in_tile, row + j), scale, minus);
        __m512 weight =
            _mm512_maskz_mov_ps(in_tile, t->bf16_weights ? pa512_exp2_bf16(x) : pa512_exp2(x));
        _mm512_mask_storeu_ps(row + j, in_tile, weight);
        total = _mm512_add_ps(total, weight);
      }
      lanes[r] = total;
    }
    sum = _mm512_add_ps(sum, pa512_reduce16(lanes));
    _mm512_mask_storeu_ps(t->row_sum + i0, m, sum);
  }
}

void pa_attn_kernels_avx512(pa_kernels *k) {
  PA_SET_PER_DTYPE(k->qk, pa_qk_f32, avx512);
  PA_SET_PER_DTYPE(k->pv, pa_pv_f32, avx512);
  k->softmax = pa_softmax_avx512;
}
