/* Row conversions, AVX2: f16 through F16C, bf16 by shifts. FP8 encoding
 * keeps the scalar kernel: it runs once per token written, not per read. */
#include "avx2-common.h"
#include "kernels.h"

#define PA_DEFINE_LOAD_ROW(name, elem_t, load)                                               \
  static void name(void *out, const void *src, size_t n, float factor) {                     \
    float *dst = out;                                                                        \
    const elem_t *in = src;                                                                  \
    __m256 f = _mm256_set1_ps(factor);                                                       \
    size_t i = 0;                                                                            \
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(load(in + i, 8), f)); \
    if (i < n) {                                                                             \
      float tail[8];                                                                         \
      _mm256_storeu_ps(tail, _mm256_mul_ps(load(in + i, n - i), f));                         \
      memcpy(dst + i, tail, (n - i) * sizeof(float));                                        \
    }                                                                                        \
  }

PA_DEFINE_LOAD_ROW(pa_load_row_f32_avx2, float, pa256_load_f32)
PA_DEFINE_LOAD_ROW(pa_load_row_f16_avx2, uint16_t, pa256_load_f16)
PA_DEFINE_LOAD_ROW(pa_load_row_bf16_avx2, uint16_t, pa256_load_bf16)

/* Each writes 8 converted lanes to a 32-byte buffer. */
PA_INLINE void pack_f32(void *out, __m256 x) { _mm256_storeu_ps(out, x); }
PA_INLINE void pack_f16(void *out, __m256 x) {
  _mm_storeu_si128(out, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
PA_INLINE void pack_bf16(void *out, __m256 x) { _mm_storeu_si128(out, pa256_to_bf16(x)); }

#define PA_DEFINE_STORE_ROW(name, encode, elem_t, pack)                                   \
  static void name(void *dst, const float *src, size_t n, float factor) {                 \
    elem_t *out = dst; /* NOLINT(bugprone-macro-parentheses): a type */                   \
    __m256 f = _mm256_set1_ps(factor);                                                    \
    size_t i = 0;                                                                         \
    for (; i + 8 <= n; i += 8) pack(out + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), f)); \
    if (i < n) {                                                                          \
      elem_t packed[8];                                                                   \
      pack(packed, _mm256_mul_ps(pa256_load_f32(src + i, n - i), f));                     \
      memcpy(out + i, packed, (n - i) * sizeof(elem_t));                                  \
    }                                                                                     \
  }                                                                                       \
  static void encode(void *dst, const float *src, size_t n, float scale) {                \
    (void)scale;                                                                          \
    name(dst, src, n, 1.0f);                                                              \
  }

PA_DEFINE_STORE_ROW(pa_store_row_f32_avx2, pa_encode_row_f32_avx2, float, pack_f32)
PA_DEFINE_STORE_ROW(pa_store_row_f16_avx2, pa_encode_row_f16_avx2, uint16_t, pack_f16)
PA_DEFINE_STORE_ROW(pa_store_row_bf16_avx2, pa_encode_row_bf16_avx2, uint16_t, pack_bf16)

static void pa_axpy_avx2(float *y, const float *x, size_t n, float a) {
  __m256 factor = _mm256_set1_ps(a);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 product = _mm256_mul_ps(_mm256_loadu_ps(x + i), factor);
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), product));
  }
  for (; i < n; i++) {
    float product = a * x[i];
    y[i] += product;
  }
}

void pa_convert_kernels_avx2(pa_kernels *k) { PA_SET_ROW_KERNELS(k, avx2); }
