/* Row conversions between f32 and every dtype: the scalar specification. */
#include "codecs.h"
#include "kernels.h"

static void pa_load_row_f32_scalar(void *out, const void *src, size_t n, float factor) {
  float *dst = out;
  const float *in = src;
  for (size_t i = 0; i < n; i++) dst[i] = in[i] * factor;
}

static void pa_load_row_f16_scalar(void *out, const void *src, size_t n, float factor) {
  float *dst = out;
  const uint16_t *in = src;
  for (size_t i = 0; i < n; i++) dst[i] = pa_f16_to_f32(in[i]) * factor;
}

static void pa_load_row_bf16_scalar(void *out, const void *src, size_t n, float factor) {
  float *dst = out;
  const uint16_t *in = src;
  for (size_t i = 0; i < n; i++) dst[i] = pa_bf16_to_f32(in[i]) * factor;
}

static void pa_store_row_f32_scalar(void *dst, const float *src, size_t n, float factor) {
  float *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = src[i] * factor;
}

static void pa_store_row_f16_scalar(void *dst, const float *src, size_t n, float factor) {
  uint16_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_f16(src[i] * factor);
}

static void pa_store_row_bf16_scalar(void *dst, const float *src, size_t n, float factor) {
  uint16_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_bf16(src[i] * factor);
}

/* The cache encoders ignore the scale unless they are FP8. */
static void pa_encode_row_f32_scalar(void *dst, const float *src, size_t n, float scale) {
  (void)scale;
  pa_store_row_f32_scalar(dst, src, n, 1.0f);
}

static void pa_encode_row_f16_scalar(void *dst, const float *src, size_t n, float scale) {
  (void)scale;
  pa_store_row_f16_scalar(dst, src, n, 1.0f);
}

static void pa_encode_row_bf16_scalar(void *dst, const float *src, size_t n, float scale) {
  (void)scale;
  pa_store_row_bf16_scalar(dst, src, n, 1.0f);
}

/* value / scale is one correctly rounded f32 division, then one rounding to
 * FP8; multiplying by a reciprocal would round twice before the FP8 step. */
static void pa_encode_row_e4m3_scalar(void *dst, const float *src, size_t n, float scale) {
  uint8_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_e4m3(src[i] / scale);
}

static void pa_encode_row_e5m2_scalar(void *dst, const float *src, size_t n, float scale) {
  uint8_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_e5m2(src[i] / scale);
}

static void pa_axpy_scalar(float *y, const float *x, size_t n, float a) {
  for (size_t i = 0; i < n; i++) {
    float product = a * x[i];
    y[i] += product;
  }
}

void pa_convert_kernels_scalar(pa_kernels *k) {
  PA_SET_ROW_KERNELS(k, scalar);
  k->encode_row[PA_FP8_E4M3] = pa_encode_row_e4m3_scalar;
  k->encode_row[PA_FP8_E5M2] = pa_encode_row_e5m2_scalar;
}
