/* Attention micro-kernels, scalar: the specification of S = Q K^T, the
 * online-pa_softmax_scalar tile epilogue and O += P V. */
#include <math.h>
#include <string.h>

#include "codecs.h"
#include "kernels.h"

/* Each K/V row is decoded once into f32 and then used by every query row. */
static void decode_row(pa_dtype dtype, const void *src, size_t d, float *dst) {
  for (size_t e = 0; e < d; e++) dst[e] = pa_decode_element(dtype, src, e);
}

static void pa_qk_f32_any_scalar(pa_dtype dtype, size_t m, size_t n, size_t d, const float *q,
                                 size_t ldq, const void *const *k_rows, float *s, size_t lds) {
  float k[PA_MAX_HEAD_SIZE];
  for (size_t j = 0; j < n; j++) {
    decode_row(dtype, k_rows[j], d, k);
    for (size_t i = 0; i < m; i++) {
      const float *qi = q + i * ldq;
      float acc = 0.0f;
      for (size_t e = 0; e < d; e++) acc += qi[e] * k[e];
      s[i * lds + j] = acc;
    }
  }
}

static void pa_pv_f32_any_scalar(pa_dtype dtype, size_t m, size_t n, size_t d, const float *p,
                                 size_t ldp, const void *const *v_rows, float *o, size_t ldo,
                                 const float *rescale) {
  float v[PA_MAX_HEAD_SIZE];
  pa_rescale_rows_scalar(m, d, o, ldo, rescale);
  for (size_t j = 0; j < n; j++) {
    decode_row(dtype, v_rows[j], d, v);
    for (size_t i = 0; i < m; i++) {
      float weight = p[i * ldp + j];
      float *oi = o + i * ldo;
      for (size_t e = 0; e < d; e++) oi[e] += weight * v[e];
    }
  }
}

/* The scalar kernels leave prefetching to the hardware. */
#define PA_DEFINE_QK_PV(suffix, dtype)                                                             \
  static void pa_qk_f32_##suffix##_scalar(size_t m, size_t n, size_t d, const void *q, size_t ldq, \
                                          const void *const *k_rows, float *s, size_t lds,         \
                                          pa_prefetch *prefetch) {                                 \
    (void)prefetch;                                                                                \
    pa_qk_f32_any_scalar(dtype, m, n, d, q, ldq, k_rows, s, lds);                                  \
  }                                                                                                \
  static void pa_pv_f32_##suffix##_scalar(                                                         \
      size_t m, size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,         \
      float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {                         \
    (void)prefetch;                                                                                \
    pa_pv_f32_any_scalar(dtype, m, n, d, p, ldp, v_rows, o, ldo, rescale);                         \
  }

PA_DEFINE_QK_PV(f32, PA_F32)
PA_DEFINE_QK_PV(f16, PA_F16)
PA_DEFINE_QK_PV(bf16, PA_BF16)
PA_DEFINE_QK_PV(e4m3, PA_FP8_E4M3)
PA_DEFINE_QK_PV(e5m2, PA_FP8_E5M2)

/* Visible columns of row i in this tile, as [*lo, *hi) within [0, n). */
static void visible_columns(const pa_softmax_tile *t, size_t i, size_t *lo, size_t *hi) {
  *lo = 0;
  *hi = t->n;
  if (!t->key_lo) return;
  int64_t n = (int64_t)t->n;
  int64_t first = PA_MIN(PA_MAX((int64_t)t->key_lo[i] - t->first_key, 0), n);
  int64_t last = PA_MIN(PA_MAX((int64_t)t->key_hi[i] - t->first_key, first), n);
  *lo = (size_t)first;
  *hi = (size_t)last;
}

static void pa_softmax_scalar(const pa_softmax_tile *t, float *s, size_t lds) {
  for (size_t i = 0; i < t->m; i++) {
    float *row = s + i * lds;
    size_t lo, hi;
    visible_columns(t, i, &lo, &hi);
    float tile_max = -INFINITY;
    for (size_t j = lo; j < hi; j++) {
      float x = row[j] * t->score_scale;
      if (t->soft_cap > 0.0f) x = t->soft_cap * tanhf(x / t->soft_cap);
      if (t->alibi) x += t->alibi[i] * (float)(t->first_key + (int64_t)j - t->position[i]);
      row[j] = x * PA_LOG2E;
      tile_max = fmaxf(tile_max, row[j]);
    }
    for (size_t j = 0; j < lo; j++) row[j] = 0.0f;
    for (size_t j = hi; j < t->n; j++) row[j] = 0.0f;

    float old_max = t->row_max[i];
    float new_max = fmaxf(old_max, tile_max);
    t->rescale[i] = 1.0f;
    if (new_max == -INFINITY) { /* no key seen yet: nothing to weigh */
      for (size_t j = lo; j < hi; j++) row[j] = 0.0f;
      continue;
    }
    float correction = exp2f(old_max - new_max); /* 0 when old_max is -inf */
    float sum = 0.0f;
    for (size_t j = lo; j < hi; j++) {
      row[j] = exp2f(row[j] - new_max);
      sum += row[j];
    }
    t->row_sum[i] = t->row_sum[i] * correction + sum;
    t->row_max[i] = new_max;
    t->rescale[i] = correction;
  }
}

/* The weights of pa_softmax_scalar, each rounded to bf16 and written over
 * the start of its row: weight j's two bytes go where weight j / 2 was,
 * read before. Byte copies, as the row's floats and the bf16 weights
 * share memory. */
static void pa_softmax_bf16_rows_scalar(const pa_softmax_tile *t, float *s, size_t lds) {
  pa_softmax_scalar(t, s, lds);
  for (size_t i = 0; i < t->m; i++) {
    float *row = s + i * lds;
    for (size_t j = 0; j < pa_bf16_row_keys(t->n); j++) {
      uint16_t weight = j < t->n ? pa_f32_to_bf16(row[j]) : 0;
      memcpy((char *)row + j * sizeof weight, &weight, sizeof weight);
    }
  }
}

/* The weights of pa_softmax_scalar as softmax_split_rows writes them: each
 * float replaced by its bf16 high part and rest (see PA_SPLIT_ROW_KEYS). */
static void pa_softmax_split_rows_scalar(const pa_softmax_tile *t, float *s, size_t lds) {
  pa_softmax_scalar(t, s, lds);
  for (size_t i = 0; i < t->m; i++) {
    float *row = s + i * lds;
    for (size_t j = 0; j < pa_split_row_keys(t->n); j++) {
      float w = j < t->n ? row[j] : 0.0f;
      uint16_t high = pa_f32_to_bf16(w);
      uint16_t parts[2] = {high, pa_f32_to_bf16(w - pa_bf16_to_f32(high))};
      memcpy(row + j, parts, sizeof parts);
    }
  }
}

void pa_attn_kernels_scalar(pa_kernels *k) {
  PA_SET_PER_DTYPE(k->qk, pa_qk_f32, scalar);
  PA_SET_PER_DTYPE(k->pv, pa_pv_f32, scalar);
  k->softmax = pa_softmax_scalar;
  k->softmax_bf16_rows = pa_softmax_bf16_rows_scalar;
  k->softmax_split_rows = pa_softmax_split_rows_scalar;
}
