/* AVX-512 building blocks shared by the avx512 kernel files: loading 16
 * elements of any dtype as f32 (decoded in registers), rounding stores, and
 * a vector exp. Only included by files compiled with the avx512 flags. */
#ifndef PA_KERNELS_AVX512_COMMON_H
#define PA_KERNELS_AVX512_COMMON_H

#include <immintrin.h>
#include <stdint.h>

#include "kernels.h"

#define PA_INLINE static inline __attribute__((always_inline))

PA_INLINE __mmask16 pa512_tail_mask(size_t count) {
  return (__mmask16)(count >= 16 ? 0xffffu : (1u << count) - 1u);
}

/* Masked loads only for partial vectors: a masked load that misses the
 * cache is far slower here than a plain one. */
PA_INLINE __m256i pa512_load_16x16(const void *p, __mmask16 m) {
  return m == 0xffff ? _mm256_loadu_si256(p) : _mm256_maskz_loadu_epi16(m, p);
}

PA_INLINE __m128i pa512_load_16x8(const void *p, __mmask16 m) {
  return m == 0xffff ? _mm_loadu_si128(p) : _mm_maskz_loadu_epi8(m, p);
}

PA_INLINE __m512 pa512_load_f32(const void *p, __mmask16 m) {
  return m == 0xffff ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}

/* The factor a P V kernel applies to row r of O (see pa_pv_fn). */
PA_INLINE __m512 pa512_row_scale(const float *rescale, int r) {
  return _mm512_set1_ps(rescale ? rescale[r] : 1.0f);
}

/* O times its factor; a zero factor discards O, which may be uninitialised
 * (0 * NaN would not). */
PA_INLINE __m512 pa512_scaled(__m512 o, __m512 scale) {
  return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(scale, _mm512_setzero_ps(), _CMP_NEQ_UQ), o, scale);
}

/* A packed P V block's rows x (16 cols) columns of O (row stride ldo), the
 * last vector `partial` (masked by `last`) where the block ends past d:
 * loaded and scaled by each row's factor into acc, and stored back. */
PA_INLINE void pa512_load_o_block(const int rows, const int cols, const int partial, __mmask16 last,
                                  const float *o, size_t ldo, const float *rescale,
                                  __m512 acc[6][4]) {
  for (int c = 0; c < cols; c++) {
    for (int r = 0; r < rows; r++) {
      const float *at = o + r * ldo + 16 * (size_t)c;
      __m512 before = c + 1 < cols || !partial ? _mm512_loadu_ps(at) : pa512_load_f32(at, last);
      acc[r][c] = pa512_scaled(before, pa512_row_scale(rescale, r));
    }
  }
}

PA_INLINE void pa512_store_o_block(const int rows, const int cols, const int partial,
                                   __mmask16 last, float *o, size_t ldo, __m512 acc[6][4]) {
  for (int c = 0; c < cols; c++) {
    for (int r = 0; r < rows; r++) {
      float *at = o + r * ldo + 16 * (size_t)c;
      if (c + 1 < cols || !partial) {
        /* cppcheck-suppress negativeIndex ; c counts up from 0 (cppcheck 2.10 infers -1) */
        _mm512_storeu_ps(at, acc[r][c]);
      } else {
        _mm512_mask_storeu_ps(at, last, acc[r][c]);
      }
    }
  }
}

/* A direct P V block's rows x `vectors` 16-column vectors of O from column
 * c0 (row stride ldo): loaded and scaled by each row's factor into acc
 * (row-major), mask[c] the columns of vector c before d, and stored back. */
PA_INLINE void pa512_load_o_vectors(const int rows, const int vectors, size_t c0, size_t d,
                                    const float *o, size_t ldo, const float *rescale,
                                    __mmask16 *mask, __m512 *acc) {
  for (int c = 0; c < vectors; c++) {
    size_t col = c0 + 16 * (size_t)c;
    mask[c] = col < d ? pa512_tail_mask(d - col) : 0;
    for (int r = 0; r < rows; r++)
      acc[r * vectors + c] = pa512_scaled(_mm512_maskz_loadu_ps(mask[c], o + r * ldo + col),
                                          pa512_row_scale(rescale, r));
  }
}

PA_INLINE void pa512_store_o_vectors(const int rows, const int vectors, size_t c0,
                                     const __mmask16 *mask, const __m512 *acc, float *o,
                                     size_t ldo) {
  for (int c = 0; c < vectors; c++) {
    size_t col = c0 + 16 * (size_t)c;
    for (int r = 0; r < rows; r++)
      _mm512_mask_storeu_ps(o + r * ldo + col, mask[c], acc[r * vectors + c]);
  }
}

/* The two bf16 elements of each 32-bit lane as f32: shifted left by 16 the
 * first (even) one, its low half cleared the second (odd) one. */
PA_INLINE __m512 pa512_pair_even(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}

PA_INLINE __m512 pa512_pair_odd(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int)0xffff0000u)));
}

/* bf16 is the upper half of an f32. */
PA_INLINE __m512 pa512_load_bf16(const void *p, __mmask16 m) {
  __m512i wide = _mm512_cvtepu16_epi32(pa512_load_16x16(p, m));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

PA_INLINE __m512 pa512_load_f16(const void *p, __mmask16 m) {
  return _mm512_cvtph_ps(pa512_load_16x16(p, m));
}

/* E5M2 is the upper byte of an f16. */
PA_INLINE __m512 pa512_load_e5m2(const void *p, __mmask16 m) {
  __m256i half = _mm256_slli_epi16(_mm256_cvtepu8_epi16(pa512_load_16x8(p, m)), 8);
  return _mm512_cvtph_ps(half);
}

/* E4M3's exponent and fraction, shifted left by 7, are an f16's fields for
 * value * 2^-8 (subnormals included); S.1111.111 is NaN. */
PA_INLINE __m512 pa512_load_e4m3(const void *p, __mmask16 m) {
  __m256i bytes = _mm256_cvtepu8_epi16(pa512_load_16x8(p, m));
  __m256i magnitude = _mm256_and_si256(bytes, _mm256_set1_epi16(0x7f));
  __m256i sign = _mm256_slli_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(0x80)), 8);
  __m256i half = _mm256_or_si256(_mm256_slli_epi16(magnitude, 7), sign);
  __m512 value = _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0f));
  __mmask16 nan = _mm256_cmpeq_epi16_mask(magnitude, _mm256_set1_epi16(0x7f));
  return _mm512_mask_mov_ps(value, nan, _mm512_set1_ps(__builtin_nanf("")));
}

/* Round-to-nearest-even f32 -> bf16 on the raw bits; NaN stays a quiet NaN.
 * (vcvtneps2bf16 would flush subnormals, which the scalar path keeps.) */
PA_INLINE __m256i pa512_to_bf16(__m512 x) {
  __m512i bits = _mm512_castps_si512(x);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512i quiet = _mm512_or_si512(bits, _mm512_set1_epi32(0x400000));
  rounded = _mm512_mask_mov_epi32(rounded, nan, quiet);
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

/* 2^x = 2^n * p(f), x = n + f with |f| <= 1/2 and p the polynomial with
 * the `count` coefficients `c`, highest degree first; vscalefps does the
 * 2^n. Below -125 the result is 0 (so 2^-inf = 0), set by a mask rather
 * than left to vscalefps: results that underflow to denormals or to zero
 * take a microcode assist each, and the masked keys of every causal tile
 * are such results. 2^NaN is NaN, as exp2f gives (the mask keeps unordered
 * lanes, and vmaxps returns its second operand when either is NaN), so that
 * a NaN score is not weighed as a zero. */
PA_INLINE __m512 pa512_exp2_poly(__m512 x, const float *c, int count, const int finite) {
  const __m512 lowest = _mm512_set1_ps(-125.0f);
  __mmask16 keep = finite ? (__mmask16)0xffff : _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);
  x = _mm512_max_ps(lowest, x);
  /* vreduceps gives f = x - round(x) in one uop, where vrndscaleps takes
   * two and a subtraction; both are exact. */
  __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 n = _mm512_sub_ps(x, f);
  __m512 p = _mm512_set1_ps(c[0]);
  for (int i = 1; i < count; i++) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[i]));
  return _mm512_maskz_scalef_ps(keep, p, n);
}

/* 2^x to 2.4e-7 relative (degree-5 minimax polynomial). */
static const float pa512_exp2_coefficients[6] = {1.3280616e-3f, 9.6756266e-3f, 5.5507012e-2f,
                                                 2.4022117e-1f, 6.9314694e-1f, 1.0f};

PA_INLINE __m512 pa512_exp2(__m512 x) { return pa512_exp2_poly(x, pa512_exp2_coefficients, 6, 0); }

/* The same for x that is never -inf (see pa512_exp2_bf16_finite). */
PA_INLINE __m512 pa512_exp2_finite(__m512 x) {
  return pa512_exp2_poly(x, pa512_exp2_coefficients, 6, 1);
}

/* 2^x to 1.0e-4 relative (degree-3 minimax polynomial, exact at 0): for
 * weights rounded to bf16 later, whose rounding alone is up to 2^-9. */
static const float pa512_exp2_bf16_coefficients[4] = {5.50089292e-2f, 2.42210969e-1f,
                                                      6.93282902e-1f, 1.0f};

PA_INLINE __m512 pa512_exp2_bf16(__m512 x) {
  return pa512_exp2_poly(x, pa512_exp2_bf16_coefficients, 4, 0);
}

/* The same for x that is never -inf, where 2^-125 may stand for a smaller
 * weight (raw scores, the masked columns' weights zeroed by the caller):
 * one mask fewer. */
PA_INLINE __m512 pa512_exp2_bf16_finite(__m512 x) {
  return pa512_exp2_poly(x, pa512_exp2_bf16_coefficients, 4, 1);
}

/* tanh(x) = 1 - 2 / (e^(2x) + 1), which saturates cleanly at both ends;
 * below PA_TANH_SERIES_BELOW the subtraction would cancel x's digits (a cap
 * far above the logits flattened them all to 0), so there the series
 * (pa_tanh_series) stands in. */
PA_INLINE __m512 pa512_tanh(__m512 x) {
  __m512 e = pa512_exp2(_mm512_mul_ps(x, _mm512_set1_ps(2.0f * 1.44269504088896341f)));
  __m512 one = _mm512_set1_ps(1.0f);
  __m512 far = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(pa_tanh_series[3]);
  for (int i = 2; i >= 0; i--) p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(pa_tanh_series[i]));
  __m512 near = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), x, x);
  __mmask16 small =
      _mm512_cmp_ps_mask(_mm512_abs_ps(x), _mm512_set1_ps(PA_TANH_SERIES_BELOW), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(far, small, near);
}

PA_INLINE __m512 pa512_add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
PA_INLINE __m512 pa512_max(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }

/* The transpose tree's first two levels: v[0..15] to four vectors, lane
 * 4 i + k of quad[q] holding op over a quarter of v[4 q + k]'s lanes
 * (quarter i). */
PA_INLINE void pa512_reduce16_quads(const __m512 *v, __m512 (*op)(__m512, __m512), __m512 *quad) {
  __m512 pair[8];
  for (int i = 0; i < 8; i++) {
    pair[i] =
        op(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 4; i++) {
    quad[i] = op(_mm512_shuffle_ps(pair[2 * i], pair[2 * i + 1], 0x44),
                 _mm512_shuffle_ps(pair[2 * i], pair[2 * i + 1], 0xee));
  }
}

/* Its last two levels: lane k of the result is op over v[k]. */
PA_INLINE __m512 pa512_reduce16_end(const __m512 *quad, __m512 (*op)(__m512, __m512)) {
  __m512 oct[2];
  for (int i = 0; i < 2; i++) {
    oct[i] = op(_mm512_shuffle_f32x4(quad[2 * i], quad[2 * i + 1], 0x88),
                _mm512_shuffle_f32x4(quad[2 * i], quad[2 * i + 1], 0xdd));
  }
  return op(_mm512_shuffle_f32x4(oct[0], oct[1], 0x88), _mm512_shuffle_f32x4(oct[0], oct[1], 0xdd));
}

/* Reduces each of v[0..15] across its lanes with `op`; lane k of the result
 * is op over v[k]. A transpose tree: 45 shuffles and ops instead of 16
 * horizontal reductions. */
PA_INLINE __m512 pa512_reduce16_with(const __m512 *v, __m512 (*op)(__m512, __m512)) {
  __m512 quad[4];
  pa512_reduce16_quads(v, op, quad);
  return pa512_reduce16_end(quad, op);
}

PA_INLINE __m512 pa512_reduce16(const __m512 *v) { return pa512_reduce16_with(v, pa512_add); }

/* A Q K^T block's 16 sums, reduced to four vectors (pa512_reduce16_quads)
 * and kept while the next block's dot products start; `s` is NULL when
 * there is none. The rest of the tree and the store then fill the pipes
 * beside those dot products instead of holding them back at the block's
 * end (docs/decode-memory.md, "Zen 4: the reduction beside the next
 * block"). */
typedef struct pa512_pending_block {
  __m512 quad[4];
  float *s;
  size_t valid;
} pa512_pending_block;

PA_INLINE void pa512_reduce16_begin(const __m512 *v, pa512_pending_block *p, float *s,
                                    size_t valid) {
  pa512_reduce16_quads(v, pa512_add, p->quad);
  p->s = s;
  p->valid = valid;
}

/* Stores a block of 16 dot products, lane r * (16 / rows) + j holding row
 * r's key j, as rows x `valid` entries of S (leading dimension lds). */
PA_INLINE void pa512_store_block(const int rows, __m512 sums, float *s, size_t lds, size_t valid) {
  if (rows == 1) {
    _mm512_mask_storeu_ps(s, pa512_tail_mask(valid), sums);
  } else if (rows == 2) {
    __mmask8 m = (__mmask8)pa512_tail_mask(valid);
    _mm256_mask_storeu_ps(s, m, _mm512_castps512_ps256(sums));
    _mm256_mask_storeu_ps(s + lds, m, _mm512_extractf32x8_ps(sums, 1));
  } else {
    __mmask8 m = (__mmask8)pa512_tail_mask(valid);
    _mm_mask_storeu_ps(s, m, _mm512_castps512_ps128(sums));
    _mm_mask_storeu_ps(s + lds, m, _mm512_extractf32x4_ps(sums, 1));
    _mm_mask_storeu_ps(s + 2 * lds, m, _mm512_extractf32x4_ps(sums, 2));
    _mm_mask_storeu_ps(s + 3 * lds, m, _mm512_extractf32x4_ps(sums, 3));
  }
}

/* Ends a pending block's reduction and stores its sums (pa512_store_block). */
PA_INLINE void pa512_finish_block(const int rows, pa512_pending_block *p, size_t lds) {
  if (!p->s) return;
  pa512_store_block(rows, pa512_reduce16_end(p->quad, pa512_add), p->s, lds, p->valid);
  p->s = NULL;
}

/* Q K^T's walk over n keys for a group of `rows` rows: blocks of 16 / rows
 * keys (pa_key_block pads the last), one request step each, each block's
 * sums finished during the next block's products (pa512_pending_block).
 * BLOCK(keys, k, j, valid, pending) computes keys [j, j + keys) from their
 * K rows k, `valid` of them real. Where it is used, prefetch.h is included. */
#define PA512_QK_KEY_BLOCKS(rows, n, k_rows, lds, prefetch, BLOCK)            \
  do {                                                                        \
    const int pa_keys_ = 16 / (rows);                                         \
    pa512_pending_block pa_pending_ = {.s = NULL};                            \
    for (size_t pa_j_ = 0; pa_j_ < (n); pa_j_ += (size_t)pa_keys_) {          \
      pa_prefetch_step((prefetch), pa_j_ + (size_t)pa_keys_);                 \
      const void *pa_k_[16];                                                  \
      size_t pa_valid_ = pa_key_block((k_rows), pa_j_, pa_keys_, (n), pa_k_); \
      BLOCK(pa_keys_, pa_k_, pa_j_, pa_valid_, &pa_pending_);                 \
    }                                                                         \
    pa512_finish_block((rows), &pa_pending_, (lds));                          \
  } while (0)

/* Transposes a 16 x 16 block of 32-bit elements held as 16 row vectors. */
PA_INLINE void pa512_transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  /* u[4b + c] holds columns c, c+4, c+8, c+12 of rows 4b..4b+3, one per lane. */
  for (int c = 0; c < 4; c++) {
    __m512 a0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);      /* cols c, c+8: rows 0-7 */
    __m512 a1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);      /* cols c+4, c+12 */
    __m512 b0 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88); /* rows 8-15 */
    __m512 b1 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_f32x4(a0, b0, 0x88);
    r[c + 8] = _mm512_shuffle_f32x4(a0, b0, 0xdd);
    r[c + 4] = _mm512_shuffle_f32x4(a1, b1, 0x88);
    r[c + 12] = _mm512_shuffle_f32x4(a1, b1, 0xdd);
  }
}

/* The bf16 pair's FMA direct kernels of attn-avx512.c (Q as bf16 is
 * stored, the score factor left to the softmax), which the AVX512-BF16
 * registration takes where the dot products are slow. */
void pa_qk_bf16_bf16_avx512(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                            const void *const *k_rows, float *s, size_t lds, pa_prefetch *prefetch);
void pa_pv_bf16_bf16_avx512(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                            const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                            pa_prefetch *prefetch);

#endif
