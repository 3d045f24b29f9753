/* Row conversions between f32 and every dtype: the scalar specification. */
#include "codecs.h"
#include "kernels.h"

static void load_f32(void *out, const void *src, size_t n, float factor) {
  float *dst = out;
  const float *in = src;
  for (size_t i = 0; i < n; i++) dst[i] = in[i] * factor;
}

static void load_f16(void *out, const void *src, size_t n, float factor) {
  float *dst = out;
  const uint16_t *in = src;
  for (size_t i = 0; i < n; i++) dst[i] = pa_f16_to_f32(in[i]) * factor;
}

static void load_bf16(void *out, const void *src, size_t n, float factor) {
  float *dst = out;
  const uint16_t *in = src;
  for (size_t i = 0; i < n; i++) dst[i] = pa_bf16_to_f32(in[i]) * factor;
}

static void store_f32(void *dst, const float *src, size_t n, float factor) {
  float *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = src[i] * factor;
}

static void store_f16(void *dst, const float *src, size_t n, float factor) {
  uint16_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_f16(src[i] * factor);
}

static void store_bf16(void *dst, const float *src, size_t n, float factor) {
  uint16_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_bf16(src[i] * factor);
}

/* The cache encoders ignore the scale unless they are FP8. */
static void encode_f32(void *dst, const float *src, size_t n, float scale) {
  (void)scale;
  store_f32(dst, src, n, 1.0f);
}

static void encode_f16(void *dst, const float *src, size_t n, float scale) {
  (void)scale;
  store_f16(dst, src, n, 1.0f);
}

static void encode_bf16(void *dst, const float *src, size_t n, float scale) {
  (void)scale;
  store_bf16(dst, src, n, 1.0f);
}

/* value / scale is one correctly rounded f32 division, then one rounding to
 * FP8; multiplying by a reciprocal would round twice before the FP8 step. */
static void encode_e4m3(void *dst, const float *src, size_t n, float scale) {
  uint8_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_e4m3(src[i] / scale);
}

static void encode_e5m2(void *dst, const float *src, size_t n, float scale) {
  uint8_t *out = dst;
  for (size_t i = 0; i < n; i++) out[i] = pa_f32_to_e5m2(src[i] / scale);
}

static void axpy(float *y, const float *x, size_t n, float a) {
  for (size_t i = 0; i < n; i++) {
    float product = a * x[i];
    y[i] += product;
  }
}

void pa_convert_kernels_scalar(pa_kernels *k) {
  k->axpy = axpy;
  k->load_row[PA_F32] = load_f32;
  k->load_row[PA_F16] = load_f16;
  k->load_row[PA_BF16] = load_bf16;
  k->store_row[PA_F32] = store_f32;
  k->store_row[PA_F16] = store_f16;
  k->store_row[PA_BF16] = store_bf16;
  k->encode_row[PA_F32] = encode_f32;
  k->encode_row[PA_F16] = encode_f16;
  k->encode_row[PA_BF16] = encode_bf16;
  k->encode_row[PA_FP8_E4M3] = encode_e4m3;
  k->encode_row[PA_FP8_E5M2] = encode_e5m2;
}
