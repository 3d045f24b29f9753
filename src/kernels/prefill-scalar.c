/* Packed-tile micro-kernels for prefill, scalar: the specification of the
 * f32 packed layouts (see kernels.h) and of S = Q K^T, O += P V over them. */
#include "codecs.h"
#include "kernels.h"

static size_t v_stride(size_t d) { return (d + 15) / 16 * 16; }

static void pack_k(pa_dtype dtype, void *dst, const void *const *rows, size_t n, size_t d) {
  float *kt = dst;
  for (size_t e = 0; e < d; e++) {
    for (size_t j = 0; j < PA_PACK_KEYS; j++) {
      kt[e * PA_PACK_KEYS + j] = j < n ? pa_decode_element(dtype, rows[j], e) : 0.0f;
    }
  }
}

static void pack_v(pa_dtype dtype, void *dst, const void *const *rows, size_t n, size_t d) {
  float *v = dst;
  size_t ldv = v_stride(d);
  for (size_t j = 0; j < n; j++) {
    for (size_t e = 0; e < ldv; e++)
      v[j * ldv + e] = e < d ? pa_decode_element(dtype, rows[j], e) : 0.0f;
  }
}

#define PA_DEFINE_PACK(suffix, dtype)                                                   \
  static void pa_pack_k_##suffix##_scalar(void *dst, const void *const *rows, size_t n, \
                                          size_t d) {                                   \
    pack_k(dtype, dst, rows, n, d);                                                     \
  }                                                                                     \
  static void pa_pack_v_##suffix##_scalar(void *dst, const void *const *rows, size_t n, \
                                          size_t d) {                                   \
    pack_v(dtype, dst, rows, n, d);                                                     \
  }

PA_DEFINE_PACK(f32, PA_F32)
PA_DEFINE_PACK(f16, PA_F16)
PA_DEFINE_PACK(bf16, PA_BF16)
PA_DEFINE_PACK(e4m3, PA_FP8_E4M3)
PA_DEFINE_PACK(e5m2, PA_FP8_E5M2)

/* The scalar kernels leave prefetching to the hardware. */
static void pa_qk_packed_f32_scalar(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                                    const void *k_packed, float *s, size_t lds,
                                    pa_prefetch *prefetch) {
  const float *q = q_rows, *kt = k_packed;
  (void)n;
  (void)prefetch;
  for (size_t i = 0; i < m; i++) {
    for (size_t j = 0; j < PA_PACK_KEYS; j++) {
      float acc = 0.0f;
      for (size_t e = 0; e < d; e++) acc += q[i * ldq + e] * kt[e * PA_PACK_KEYS + j];
      s[i * lds + j] = acc;
    }
  }
}

static void pa_pv_packed_f32_scalar(size_t m, size_t n, size_t d, const void *weights, size_t ldp,
                                    const void *v_packed, float *o, size_t ldo,
                                    const float *rescale, pa_prefetch *prefetch) {
  const float *p = weights;
  const float *v = v_packed;
  (void)prefetch;
  pa_rescale_rows_scalar(m, d, o, ldo, rescale);
  size_t ldv = v_stride(d);
  for (size_t i = 0; i < m; i++) {
    for (size_t j = 0; j < n; j++) {
      float weight = p[i * ldp + j];
      for (size_t e = 0; e < d; e++) o[i * ldo + e] += weight * v[j * ldv + e];
    }
  }
}

void pa_prefill_kernels_scalar(pa_kernels *k) {
  PA_SET_PER_DTYPE(k->pack_k, pa_pack_k, scalar);
  PA_SET_PER_DTYPE(k->pack_v, pa_pack_v, scalar);
  k->qk_packed = pa_qk_packed_f32_scalar;
  k->pv_packed = pa_pv_packed_f32_scalar;
  k->packed_min_rows = 64; /* as the AVX-512 f32 kernels */
}
