/* Row conversions, AVX-512: f16 through F16C, bf16 by shifts. FP8 encoding
 * keeps the scalar kernel: it runs once per token written, not per read. */
#include "avx512-common.h"
#include "kernels.h"

#define PA_DEFINE_LOAD_ROW(name, elem_t, load)                              \
  static void name(void *out, const void *src, size_t n, float factor) {    \
    float *dst = out;                                                       \
    const elem_t *in = src;                                                 \
    __m512 f = _mm512_set1_ps(factor);                                      \
    for (size_t i = 0; i < n; i += 16) {                                    \
      __mmask16 m = pa512_tail_mask(n - i);                                 \
      _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(load(in + i, m), f)); \
    }                                                                       \
  }

PA_DEFINE_LOAD_ROW(pa_load_row_f32_avx512, float, pa512_load_f32)
PA_DEFINE_LOAD_ROW(pa_load_row_f16_avx512, uint16_t, pa512_load_f16)
PA_DEFINE_LOAD_ROW(pa_load_row_bf16_avx512, uint16_t, pa512_load_bf16)

PA_INLINE void store_f32_lanes(void *out, __mmask16 m, __m512 x) {
  _mm512_mask_storeu_ps(out, m, x);
}
PA_INLINE void store_f16_lanes(void *out, __mmask16 m, __m512 x) {
  _mm256_mask_storeu_epi16(out, m,
                           _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
PA_INLINE void store_bf16_lanes(void *out, __mmask16 m, __m512 x) {
  _mm256_mask_storeu_epi16(out, m, pa512_to_bf16(x));
}

#define PA_DEFINE_STORE_ROW(name, encode, elem_t, store)                      \
  static void name(void *dst, const float *src, size_t n, float factor) {     \
    elem_t *out = dst; /* NOLINT(bugprone-macro-parentheses): a type */       \
    __m512 f = _mm512_set1_ps(factor);                                        \
    for (size_t i = 0; i < n; i += 16) {                                      \
      __mmask16 m = pa512_tail_mask(n - i);                                   \
      store(out + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), f)); \
    }                                                                         \
  }                                                                           \
  static void encode(void *dst, const float *src, size_t n, float scale) {    \
    (void)scale;                                                              \
    name(dst, src, n, 1.0f);                                                  \
  }

PA_DEFINE_STORE_ROW(pa_store_row_f32_avx512, pa_encode_row_f32_avx512, float, store_f32_lanes)
PA_DEFINE_STORE_ROW(pa_store_row_f16_avx512, pa_encode_row_f16_avx512, uint16_t, store_f16_lanes)
PA_DEFINE_STORE_ROW(pa_store_row_bf16_avx512, pa_encode_row_bf16_avx512, uint16_t, store_bf16_lanes)

static void pa_axpy_avx512(float *y, const float *x, size_t n, float a) {
  __m512 factor = _mm512_set1_ps(a);
  for (size_t i = 0; i < n; i += 16) {
    __mmask16 m = pa512_tail_mask(n - i);
    __m512 product = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), factor);
    _mm512_mask_storeu_ps(y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), product));
  }
}

void pa_convert_kernels_avx512(pa_kernels *k) { PA_SET_ROW_KERNELS(k, avx512); }
