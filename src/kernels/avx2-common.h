/* AVX2 building blocks shared by the avx2 kernel files: loading 8 elements
 * of any dtype as f32 (decoded in registers), rounding stores and a vector
 * exp. AVX2 has no masked 8- or 16-bit loads, so a partial vector goes
 * through a zero-padded copy on the stack. */
#ifndef PA_KERNELS_AVX2_COMMON_H
#define PA_KERNELS_AVX2_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#define PA_INLINE static inline __attribute__((always_inline))

/* `count` (<= 8) elements of `size` bytes from p, zero-padded to 8. */
PA_INLINE const void *pa256_partial(const void *p, size_t count, size_t size, void *buffer) {
  if (count >= 8) return p;
  memset(buffer, 0, 32);
  memcpy(buffer, p, count * size);
  return buffer;
}

/* The factor a P V kernel applies to row r of O (see pa_pv_fn). */
PA_INLINE __m256 pa256_row_scale(const float *rescale, int r) {
  return _mm256_set1_ps(rescale ? rescale[r] : 1.0f);
}

/* O times its factor; a zero factor discards O, which may be uninitialised. */
PA_INLINE __m256 pa256_scaled(__m256 o, __m256 scale) {
  __m256 keep = _mm256_cmp_ps(scale, _mm256_setzero_ps(), _CMP_NEQ_UQ);
  return _mm256_and_ps(keep, _mm256_mul_ps(o, scale));
}

/* Lanes [0, count) set (32-bit elements). */
PA_INLINE __m256i pa256_tail_mask(size_t count) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), lane);
}

/* A plain store for a whole vector (the common case in a loop), a masked
 * one for a tail. (A masked load for f32 tails, likewise, was slower in
 * the decode though not in the kernels alone, so loads keep the copy;
 * docs/code-figures.md, AVX2 tails.) */
PA_INLINE void pa256_store_f32(float *p, __m256 v, size_t count) {
  if (count >= 8)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, pa256_tail_mask(count), v);
}

PA_INLINE __m256 pa256_load_f32(const void *p, size_t count) {
  float buffer[8];
  return _mm256_loadu_ps(pa256_partial(p, count, 4, buffer));
}

PA_INLINE __m256 pa256_load_bf16(const void *p, size_t count) {
  uint16_t buffer[16];
  __m128i raw = _mm_loadu_si128(pa256_partial(p, count, 2, buffer));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

PA_INLINE __m256 pa256_load_f16(const void *p, size_t count) {
  uint16_t buffer[16];
  return _mm256_cvtph_ps(_mm_loadu_si128(pa256_partial(p, count, 2, buffer)));
}

PA_INLINE __m128i pa256_load_8_raw(const void *p, size_t count) {
  uint8_t buffer[32];
  return _mm_loadl_epi64(pa256_partial(p, count, 1, buffer));
}

/* E5M2 is the upper byte of an f16. */
PA_INLINE __m256 pa256_load_e5m2(const void *p, size_t count) {
  return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), pa256_load_8_raw(p, count)));
}

/* E4M3 bytes (the low 8 of `bytes`) as the f16 codes of value * 2^-8,
 * exact for every finite value, subnormals included: a byte in the high
 * half of a word, shifted right by one with its sign, is S.S.EEEE.MMM and
 * seven zeros, and clearing bit 14 leaves an f16's sign, exponent and
 * fraction. The NaN magnitude (0x7f) comes out as 1.875 (480 after the
 * factor): callers deal with it. */
PA_INLINE __m128i pa256_e4m3_f16_codes(__m128i bytes) {
  __m128i high = _mm_unpacklo_epi8(_mm_setzero_si128(), bytes);
  return _mm_and_si128(_mm_srai_epi16(high, 1), _mm_set1_epi16((short)0xbfff));
}

/* E4M3 with NaN kept a NaN (the code's exponent set to all ones). */
PA_INLINE __m256 pa256_load_e4m3(const void *p, size_t count) {
  __m128i half = pa256_e4m3_f16_codes(pa256_load_8_raw(p, count));
  const __m128i nan_magnitude = _mm_set1_epi16(0x3f80);
  __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(half, nan_magnitude), nan_magnitude);
  half = _mm_or_si128(half, _mm_and_si128(nan, _mm_set1_epi16(0x7c00)));
  return _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0f));
}

/* E4M3 known to hold no NaN (see pa256_e4m3_has_nan) as value * 2^-8: the
 * kernels apply the 2^8 to a sum or a weight instead, three instructions
 * fewer per 8 values than pa256_load_e4m3. */
PA_INLINE __m256 pa256_load_e4m3_scaled(const void *p, size_t count) {
  return _mm256_cvtph_ps(pa256_e4m3_f16_codes(pa256_load_8_raw(p, count)));
}

/* Whether any of the first d bytes of rows[0..n) is an E4M3 NaN
 * (S.1111.111): the largest magnitude seen, 32 bytes at a time. */
PA_INLINE int pa256_e4m3_has_nan(const void *const *rows, size_t n, size_t d) {
  const __m256i magnitude = _mm256_set1_epi8(0x7f);
  __m256i largest = _mm256_setzero_si256();
  size_t whole = d / 32 * 32;
  for (size_t j = 0; j < n; j++) {
    const uint8_t *row = rows[j];
    for (size_t c = 0; c < whole; c += 32) {
      __m256i bytes = _mm256_loadu_si256((const void *)(row + c));
      largest = _mm256_max_epu8(largest, _mm256_and_si256(bytes, magnitude));
    }
    for (size_t c = whole; c < d; c++) {
      if ((row[c] & 0x7f) == 0x7f) return 1;
    }
  }
  return _mm256_movemask_epi8(_mm256_cmpeq_epi8(largest, magnitude)) != 0;
}

/* Round-to-nearest-even f32 -> bf16 on the raw bits, in the low 16 bits of
 * each lane; NaN stays a quiet NaN. */
PA_INLINE __m128i pa256_to_bf16(__m256 x) {
  __m256i bits = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  rounded = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), nan));
  __m256i halves = _mm256_srli_epi32(rounded, 16);
  __m256i packed = _mm256_packus_epi32(halves, halves); /* per 128-bit lane */
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

/* 2^x: as the AVX-512 version, with 2^n built in the exponent field.
 * Arguments below -125 give 0 (so 2^-inf = 0), by a mask, not by products
 * that underflow (an assist each); 2^NaN is NaN (the clamps take x as
 * their second operand, which vmaxps/vminps return for a NaN). */
PA_INLINE __m256 pa256_exp2(__m256 x) {
  __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-125.0f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_set1_ps(-125.0f), x);
  x = _mm256_min_ps(_mm256_set1_ps(127.0f), x);
  __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.3280616e-3f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6756266e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5507012e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022117e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314694e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(bits)));
}

/* tanh(x) as pa512_tanh computes it. */
PA_INLINE __m256 pa256_tanh(__m256 x) {
  __m256 e = pa256_exp2(_mm256_mul_ps(x, _mm256_set1_ps(2.0f * 1.44269504088896341f)));
  __m256 one = _mm256_set1_ps(1.0f);
  __m256 far = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(pa_tanh_series[3]);
  for (int i = 2; i >= 0; i--) p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(pa_tanh_series[i]));
  __m256 near = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
  __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  __m256 small = _mm256_cmp_ps(magnitude, _mm256_set1_ps(PA_TANH_SERIES_BELOW), _CMP_LT_OQ);
  return _mm256_blendv_ps(far, near, small);
}

#endif
