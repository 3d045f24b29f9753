/* Building blocks of the AVX512-BF16 kernel files (compiled with the
 * avx512 flags plus -mavx512bf16 -mavx512vbmi): bf16 and FP8 loads as bf16,
 * the dot product, and P rows as bf16 pairs. */
#ifndef PA_KERNELS_AVX512BF16_COMMON_H
#define PA_KERNELS_AVX512BF16_COMMON_H

#include <string.h>

#include "avx512-common.h"
#include "kernels.h"

enum { PA_PAIR_KEYS = PA_PACK_KEYS }; /* keys per P conversion */

/* FP8 magnitudes (7 bits) as bf16 bits, and the same split into their low
 * and high bytes (for vpermi2b lookups), filled by pa_bf16_tables_init(). */
extern uint16_t pa_e4m3_bf16[128], pa_e5m2_bf16[128];
typedef struct pa_fp8_bytes {
  uint8_t low[128], high[128];
} pa_fp8_bytes;
extern pa_fp8_bytes pa_e4m3_bytes, pa_e5m2_bytes;
void pa_bf16_tables_init(void);

typedef struct pa_fp8_tables {
  __m512i low[2], high[2], sign;
} pa_fp8_tables;

PA_INLINE pa_fp8_tables fp8_tables(const pa_fp8_bytes *b) {
  pa_fp8_tables t = {{_mm512_loadu_si512(b->low), _mm512_loadu_si512(b->low + 64)},
                     {_mm512_loadu_si512(b->high), _mm512_loadu_si512(b->high + 64)},
                     _mm512_set1_epi8((char)0x80)};
  return t;
}

/* The low and high bytes of 64 FP8 values' bf16 codes (sign included). */
PA_INLINE void fp8_code_bytes(__m512i bytes, const pa_fp8_tables *t, __m512i *low, __m512i *high) {
  *low = _mm512_permutex2var_epi8(t->low[0], bytes, t->low[1]);
  *high = _mm512_permutex2var_epi8(t->high[0], bytes, t->high[1]);
  *high = _mm512_ternarylogic_epi32(*high, bytes, t->sign, 0xf8); /* high | (bytes & 0x80) */
}

typedef struct pa_bf16_tables {
  __m512i part[4];
} pa_bf16_tables;

PA_INLINE pa_bf16_tables load_tables(const uint16_t *table) {
  pa_bf16_tables t;
  for (int i = 0; i < 4; i++) t.part[i] = _mm512_loadu_si512(table + 32 * i);
  return t;
}

PA_INLINE __mmask64 tail_mask64(size_t count) {
  return count >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << count) - 1);
}

PA_INLINE __m512i load64(const void *p, __mmask64 m) {
  return m == ~(__mmask64)0 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(m, p);
}

/* 64 FP8 values as bf16 codes, by the lookups and a byte interleave: the
 * values in the order {0-7, 16-23, 32-39, 48-55} (first), then {8-15,
 * 24-31, 40-47, 56-63} (second). */
PA_INLINE void to_bf16x64(__m512i bytes, const pa_fp8_tables *t, __m512i *first, __m512i *second) {
  __m512i low, high;
  fp8_code_bytes(bytes, t, &low, &high);
  *first = _mm512_unpacklo_epi8(low, high);
  *second = _mm512_unpackhi_epi8(low, high);
}

PA_INLINE __mmask32 tail_mask32(size_t count) {
  return count >= 32 ? 0xffffffffu : (__mmask32)((1u << count) - 1u);
}

/* 32 elements as bf16. Plain loads for full vectors (a masked load that
 * misses the cache is slow here). */
PA_INLINE __m512i load_bf16x32(const void *p, __mmask32 m, const pa_bf16_tables *t) {
  (void)t;
  return m == 0xffffffffu ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p);
}

PA_INLINE __m512i load_fp8x32(const void *p, __mmask32 m, const pa_bf16_tables *t) {
  __m256i bytes = m == 0xffffffffu ? _mm256_loadu_si256(p) : _mm256_maskz_loadu_epi8(m, p);
  __m512i w = _mm512_cvtepu8_epi16(bytes);
  __m512i low = _mm512_permutex2var_epi16(t->part[0], w, t->part[1]);  /* magnitudes 0..63 */
  __m512i high = _mm512_permutex2var_epi16(t->part[2], w, t->part[3]); /* 64..127 */
  __mmask32 upper = _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40));
  __m512i magnitude = _mm512_mask_blend_epi16(upper, low, high);
  __m512i sign = _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8);
  return _mm512_or_si512(magnitude, sign);
}

typedef __m512i (*pa_bf16_loader)(const void *, __mmask32, const pa_bf16_tables *);

/* bf16 Q as it is stored, for the kernels that take it so (the score factor
 * goes to the softmax instead). */
static inline void pa_load_q_bf16(void *dst, const void *src, size_t n, float factor) {
  (void)factor;
  memcpy(dst, src, n * sizeof(uint16_t));
}

PA_INLINE __m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

/* x as two bf16 parts, high + rest (rest = x - high, rounded in turn): x to
 * 2^-17, and exactly for values of up to 16 significant bits (an f16's
 * 11). An infinite x gets a zero rest (inf - inf would be NaN). */
PA_INLINE void bf16_parts(__m512 x, __m256i *high, __m256i *rest) {
  *high = (__m256i)_mm512_cvtneps_pbh(x);
  __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(*high), 16));
  __mmask16 finite = ~_mm512_fpclass_ps_mask(back, 0x18); /* not +-inf */
  *rest = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_sub_ps(finite, x, back));
}

PA_INLINE __m512i pa512_concat(__m256i low, __m256i high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

/* x[k] to byte 2k and x[32 + k] to byte 2k + 1 (k < 32). */
static const uint8_t pa_split_halves[64] = {
    0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
    11, 43, 12, 44, 13, 45, 14, 46, 15, 47, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53,
    22, 54, 23, 55, 24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

/* 64 FP8 values as bf16 in their order: values 0-31 in *first, 32-63 in
 * *second (exactly: every FP8 value is a bf16 value). The halves go to the
 * even and the odd bytes first (one byte permute), so that after the
 * lookups each 16-bit lane holds a code byte of either half: shifts and
 * masks, not two-source permutes (two uops each here), put them together. */
PA_INLINE void fp8x64_bf16(__m512i bytes, const pa_fp8_tables *t, __m512i *first, __m512i *second) {
  __m512i low, high;
  fp8_code_bytes(_mm512_permutexvar_epi8(_mm512_loadu_si512(pa_split_halves), bytes), t, &low,
                 &high);
  const __m512i low_bytes = _mm512_set1_epi16(0x00ff);
  /* (a & c) | b and a | (b & ~c), c the low bytes */
  *first = _mm512_ternarylogic_epi32(low, _mm512_slli_epi16(high, 8), low_bytes, 0xec);
  *second = _mm512_ternarylogic_epi32(_mm512_srli_epi16(low, 8), high, low_bytes, 0xf4);
}

/* P rows [0, rows) for keys [0, n), n <= PA_PAIR_KEYS, as bf16 pairs (the
 * pair past an odd n gets a zero). With `split`, rows [rows, 2 rows) get
 * the pairs of the rests (bf16_parts): one bf16 is 2^-9 off, and f16
 * activations want better than that. */
PA_INLINE void pack_pairs_parts(const int split, int rows, size_t n, const float *p, size_t ldp,
                                uint32_t (*pairs)[PA_PAIR_KEYS / 2]) {
  for (int r = 0; r < rows; r++) {
    for (size_t j = 0; j < n; j += 32) {
      size_t left = j < n ? n - j : 0;
      __m512 a = _mm512_maskz_loadu_ps(pa512_tail_mask(left), p + r * ldp + j);
      __m512 b =
          _mm512_maskz_loadu_ps(pa512_tail_mask(left > 16 ? left - 16 : 0), p + r * ldp + j + 16);
      if (!split) {
        _mm512_storeu_si512(&pairs[r][j / 2], (__m512i)_mm512_cvtne2ps_pbh(b, a));
        continue;
      }
      __m256i high_a, rest_a, high_b, rest_b;
      bf16_parts(a, &high_a, &rest_a);
      bf16_parts(b, &high_b, &rest_b);
      _mm512_storeu_si512(&pairs[r][j / 2], pa512_concat(high_a, high_b));
      _mm512_storeu_si512(&pairs[rows + r][j / 2], pa512_concat(rest_a, rest_b));
    }
  }
}

PA_INLINE void pack_pairs(int rows, size_t n, const float *p, size_t ldp,
                          uint32_t (*pairs)[PA_PAIR_KEYS / 2]) {
  pack_pairs_parts(0, rows, n, p, ldp, pairs);
}

/* The packed bf16 kernels of prefill-avx512bf16.c, which the AMX kernels
 * share (layouts) and fall back on (row tails, head sizes that are not a
 * multiple of 32). */
void pa_pack_v_bf16_avx512bf16(void *dst, const void *const *rows, size_t n, size_t d);
void pa_pack_v_e4m3_avx512bf16(void *dst, const void *const *rows, size_t n, size_t d);
void pa_pack_v_e5m2_avx512bf16(void *dst, const void *const *rows, size_t n, size_t d);
void pa_qk_packed_bf16_avx512bf16(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                                  const void *k_packed, float *s, size_t lds,
                                  pa_prefetch *prefetch);
void pa_pv_packed_bf16_avx512bf16(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                                  const void *v_packed, float *o, size_t ldo, const float *rescale,
                                  pa_prefetch *prefetch);

#endif
