/* Attention micro-kernels, AVX2 (f32 FMA on K/V decoded in registers): the
 * AVX-512 design at half width, with blocks of 8 dot products (4 rows x 2
 * keys, 2 x 4 or 1 x 8) to fit sixteen registers. */
#include <math.h>

#include "avx2-common.h"
#include "kernels.h"
#include "prefetch.h"

typedef __m256 (*pa256_loader)(const void *, size_t);

/* Lane k of the result is the sum of v[k]'s lanes. */
PA_INLINE __m256 reduce8(const __m256 *v) {
  __m256 pair[4], quad[2];
  for (int i = 0; i < 4; i++) {
    pair[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                            _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  for (int i = 0; i < 2; i++) {
    quad[i] = _mm256_add_ps(_mm256_shuffle_ps(pair[2 * i], pair[2 * i + 1], 0x44),
                            _mm256_shuffle_ps(pair[2 * i], pair[2 * i + 1], 0xee));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(quad[0], quad[1], 0x20),
                       _mm256_permute2f128_ps(quad[0], quad[1], 0x31));
}

/* Lanes [r * 8 / rows, (r + 1) * 8 / rows) of `sums` into S's row r, for
 * each of the block's rows (1, 2 or 4). */
PA_INLINE void store_rows(const int rows, __m256 sums, float *s, size_t lds) {
  if (rows == 1) {
    _mm256_storeu_ps(s, sums);
    return;
  }
  __m128 low = _mm256_castps256_ps128(sums), high = _mm256_extractf128_ps(sums, 1);
  if (rows == 2) {
    _mm_storeu_ps(s, low);
    _mm_storeu_ps(s + lds, high);
    return;
  }
  _mm_storel_pi((__m64 *)s, low);
  _mm_storeh_pi((__m64 *)(s + lds), low);
  _mm_storel_pi((__m64 *)(s + 2 * lds), high);
  _mm_storeh_pi((__m64 *)(s + 3 * lds), high);
}

/* The products of elements [c, c + count) of the block's rows and keys. */
PA_INLINE void qk_chunk(const int rows, const int keys, pa256_loader load, size_t elem, size_t c,
                        size_t count, const float *q, size_t ldq, const void *const *k,
                        __m256 *acc) {
  __m256 qv[4];
  for (int r = 0; r < rows; r++) {
    qv[r] = pa256_load_f32(q + r * ldq + c, count);
    /* Opaque to the compiler, so that Q stays in a register: folded into
     * each FMA as a memory operand, it was loaded once per key instead of
     * once per chunk (docs/decode-memory.md, "AVX2 Q K^T"). */
    __asm__("" : "+x"(qv[r]));
  }
  for (int j = 0; j < keys; j++) {
    __m256 kv = load((const char *)k[j] + c * elem, count);
    for (int r = 0; r < rows; r++)
      acc[r * keys + j] = _mm256_fmadd_ps(qv[r], kv, acc[r * keys + j]);
  }
}

/* Whole 8-element chunks, then the tail: a constant count lets the loads
 * drop their partial-copy branch, which otherwise stays inside the loop. */
PA_INLINE void qk_block(const int rows, const int keys, pa256_loader load, size_t elem, float unit,
                        size_t d, const float *q, size_t ldq, const void *const *k, float *s,
                        size_t lds, size_t keys_valid) {
  __m256 acc[8];
  for (int a = 0; a < 8; a++) acc[a] = _mm256_setzero_ps();
  size_t c = 0;
  for (; c + 8 <= d; c += 8) qk_chunk(rows, keys, load, elem, c, 8, q, ldq, k, acc);
  if (c < d) qk_chunk(rows, keys, load, elem, c, d - c, q, ldq, k, acc);
  __m256 sums = _mm256_mul_ps(reduce8(acc), _mm256_set1_ps(unit));
  if (keys_valid == (size_t)keys) {
    store_rows(rows, sums, s, lds);
    return;
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, sums);
  for (int r = 0; r < rows; r++) {
    for (size_t j = 0; j < keys_valid; j++) s[r * lds + j] = lanes[r * keys + (int)j];
  }
}

PA_INLINE void qk_rows(const int rows, pa256_loader load, size_t elem, float unit, size_t n,
                       size_t d, const float *q, size_t ldq, const void *const *k_rows, float *s,
                       size_t lds, pa_prefetch *prefetch) {
  const int keys = 8 / rows;
  for (size_t j = 0; j < n; j += (size_t)keys) {
    pa_prefetch_step(prefetch, j + (size_t)keys);
    const void *k[8];
    size_t valid = pa_key_block(k_rows, j, keys, n, k);
    qk_block(rows, keys, load, elem, unit, d, q, ldq, k, s + j, lds, valid);
  }
}

/* `unit` is what the loader's values must be multiplied by to be the
 * cache's (1 but for E4M3's pa256_load_e4m3_scaled): applied to each sum
 * here, to each weight in P V, where it costs one multiply per 8 keys or
 * per key instead of one per 8 values. Powers of two, so exact. */
PA_INLINE void qk(pa256_loader load, size_t elem, float unit, size_t m, size_t n, size_t d,
                  const float *q, size_t ldq, const void *const *k_rows, float *s, size_t lds,
                  pa_prefetch *prefetch) {
#define QK_GROUP(rows, i) \
  qk_rows(rows, load, elem, unit, n, d, q + (i)*ldq, ldq, k_rows, s + (i)*lds, lds, prefetch)
  PA_ROW_GROUPS(prefetch, m, n, QK_GROUP);
#undef QK_GROUP
}

/* O[0..rows)[c0 .. c0 + 8 chunks) += P V when all those columns exist: no
 * partial chunk, so the accumulators stay in registers. */
PA_INLINE void pv_block_full(const int rows, const int chunks, pa256_loader load, size_t elem,
                             float unit, size_t n, size_t c0, const float *p, size_t ldp,
                             const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                             pa_prefetch *prefetch) {
  __m256 acc[8];
  for (int r = 0; r < rows; r++) {
    __m256 scale = pa256_row_scale(rescale, r);
    for (int c = 0; c < chunks; c++)
      acc[r * chunks + c] = pa256_scaled(_mm256_loadu_ps(o + r * ldo + c0 + 8 * c), scale);
  }
  for (size_t j = 0; j < n; j++) {
    pa_prefetch_step(prefetch, j + 1);
    const char *v = (const char *)v_rows[j] + c0 * elem;
    __m256 vv[4];
    for (int c = 0; c < chunks; c++) vv[c] = load(v + 8 * (size_t)c * elem, 8);
    for (int r = 0; r < rows; r++) {
      __m256 weight = _mm256_set1_ps(p[r * ldp + j] * unit);
      for (int c = 0; c < chunks; c++)
        acc[r * chunks + c] = _mm256_fmadd_ps(weight, vv[c], acc[r * chunks + c]);
    }
  }
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < chunks; c++)
      _mm256_storeu_ps(o + r * ldo + c0 + 8 * c, acc[r * chunks + c]);
}

/* O[0..rows)[c0 .. c0 + 8 chunks) += P V; partial chunks go through a copy. */
PA_INLINE void pv_block(const int rows, const int chunks, pa256_loader load, size_t elem,
                        float unit, size_t n, size_t c0, size_t d, const float *p, size_t ldp,
                        const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                        pa_prefetch *prefetch) {
  if (c0 + 8 * (size_t)chunks <= d) {
    pv_block_full(rows, chunks, load, elem, unit, n, c0, p, ldp, v_rows, o, ldo, rescale, prefetch);
    return;
  }
  size_t count[4];
  __m256 acc[8];
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 8 * (size_t)c;
    count[c] = col >= d ? 0 : (d - col < 8 ? d - col : 8);
    for (int r = 0; r < rows; r++) {
      acc[r * chunks + c] = count[c] ? pa256_scaled(pa256_load_f32(o + r * ldo + col, count[c]),
                                                    pa256_row_scale(rescale, r))
                                     : _mm256_setzero_ps();
    }
  }
  for (size_t j = 0; j < n; j++) {
    pa_prefetch_step(prefetch, j + 1);
    __m256 vv[4];
    const char *v = (const char *)v_rows[j] + c0 * elem;
    for (int c = 0; c < chunks; c++) {
      vv[c] = count[c] ? load(v + 8 * (size_t)c * elem, count[c]) : _mm256_setzero_ps();
    }
    for (int r = 0; r < rows; r++) {
      __m256 weight = _mm256_set1_ps(p[r * ldp + j] * unit);
      for (int c = 0; c < chunks; c++)
        acc[r * chunks + c] = _mm256_fmadd_ps(weight, vv[c], acc[r * chunks + c]);
    }
  }
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 8 * (size_t)c;
    for (int r = 0; r < rows && count[c]; r++)
      pa256_store_f32(o + r * ldo + col, acc[r * chunks + c], count[c]);
  }
}

/* The prefetch budget is spread over the row groups but issued in the
 * first column block of each: these kernels are compute-bound, and a step
 * per column block costs more than it gives (docs/code-figures.md, AVX2
 * P V). */
PA_INLINE void pv(pa256_loader load, size_t elem, float unit, size_t m, size_t n, size_t d,
                  const float *p, size_t ldp, const void *const *v_rows, float *o, size_t ldo,
                  const float *rescale, pa_prefetch *prefetch) {
/* 4 rows take blocks of 2 chunks (8 accumulators), 2 rows and 1 row 4. */
#define PV_CHUNKS(rows) ((rows) == 4 ? 2 : 4)
#define PV_GROUP(rows, i)                                                               \
  for (size_t c0 = 0; c0 < d; c0 += 8 * PV_CHUNKS(rows))                                \
  pv_block(rows, PV_CHUNKS(rows), load, elem, unit, n, c0, d, p + (i)*ldp, ldp, v_rows, \
           o + (i)*ldo, ldo, pa_rescale_from(rescale, i), c0 == 0 ? prefetch : NULL)
  PA_ROW_GROUPS(prefetch, m, n, PV_GROUP);
#undef PV_GROUP
#undef PV_CHUNKS
}

#define PA_DEFINE_QK_PV(suffix, loader, elem)                                                     \
  static void pa_qk_f32_##suffix##_avx2(size_t m, size_t n, size_t d, const void *q, size_t ldq,  \
                                        const void *const *k_rows, float *s, size_t lds,          \
                                        pa_prefetch *prefetch) {                                  \
    qk(loader, elem, 1.0f, m, n, d, q, ldq, k_rows, s, lds, prefetch);                            \
  }                                                                                               \
  static void pa_pv_f32_##suffix##_avx2(size_t m, size_t n, size_t d, const float *p, size_t ldp, \
                                        const void *const *v_rows, float *o, size_t ldo,          \
                                        const float *rescale, pa_prefetch *prefetch) {            \
    pv(loader, elem, 1.0f, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                   \
  }

PA_DEFINE_QK_PV(f32, pa256_load_f32, 4)
PA_DEFINE_QK_PV(f16, pa256_load_f16, 2)
PA_DEFINE_QK_PV(bf16, pa256_load_bf16, 2)
PA_DEFINE_QK_PV(e5m2, pa256_load_e5m2, 1)

/* E4M3 decodes two instructions cheaper when no value is a NaN, and a scan
 * of the tile's bytes for one costs far less than those two. */
static void pa_qk_f32_e4m3_avx2(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                                const void *const *k_rows, float *s, size_t lds,
                                pa_prefetch *prefetch) {
  if (pa256_e4m3_has_nan(k_rows, n, d))
    qk(pa256_load_e4m3, 1, 1.0f, m, n, d, q, ldq, k_rows, s, lds, prefetch);
  else
    qk(pa256_load_e4m3_scaled, 1, 256.0f, m, n, d, q, ldq, k_rows, s, lds, prefetch);
}

static void pa_pv_f32_e4m3_avx2(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                                const void *const *v_rows, float *o, size_t ldo,
                                const float *rescale, pa_prefetch *prefetch) {
  if (pa256_e4m3_has_nan(v_rows, n, d))
    pv(pa256_load_e4m3, 1, 1.0f, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);
  else
    pv(pa256_load_e4m3_scaled, 1, 256.0f, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);
}

PA_INLINE float reduce_add(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

PA_INLINE float reduce_max(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

/* Base-2 logits of row i's visible columns written over the row (-inf
 * elsewhere in the tile); returns their maximum. */
PA_INLINE float logits_row(const pa_softmax_tile *t, size_t i, float *row) {
  const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  const float cap = t->soft_cap;
  const int plain = cap == 0.0f && !t->alibi;
  const __m256 scale = _mm256_set1_ps(plain ? t->score_scale * PA_LOG2E : t->score_scale);
  int64_t lo = 0, hi = (int64_t)t->n;
  if (t->key_lo) {
    lo = PA_MAX((int64_t)t->key_lo[i] - t->first_key, 0);
    hi = PA_MIN((int64_t)t->key_hi[i] - t->first_key, (int64_t)t->n);
  }
  __m256 lo_v = _mm256_set1_ps((float)lo), hi_v = _mm256_set1_ps((float)hi);
  __m256 vmax = minus_inf;
  for (size_t j = 0; j < t->n; j += 8) {
    size_t count = t->n - j < 8 ? t->n - j : 8;
    __m256 column = _mm256_add_ps(iota, _mm256_set1_ps((float)j));
    __m256 visible = _mm256_and_ps(_mm256_cmp_ps(column, lo_v, _CMP_GE_OQ),
                                   _mm256_cmp_ps(column, hi_v, _CMP_LT_OQ));
    __m256 x = _mm256_mul_ps(pa256_load_f32(row + j, count), scale);
    if (!plain) {
      if (cap > 0.0f) {
        x = _mm256_mul_ps(_mm256_set1_ps(cap),
                          pa256_tanh(_mm256_mul_ps(x, _mm256_set1_ps(pa_soft_cap_inverse(cap)))));
      }
      if (t->alibi) {
        float distance = (float)(t->first_key - t->position[i]);
        __m256 bias = _mm256_add_ps(column, _mm256_set1_ps(distance));
        x = _mm256_fmadd_ps(_mm256_set1_ps(t->alibi[i]), bias, x);
      }
      x = _mm256_mul_ps(x, _mm256_set1_ps(PA_LOG2E));
    }
    x = _mm256_blendv_ps(minus_inf, x, visible);
    pa256_store_f32(row + j, x, count);
    vmax = _mm256_max_ps(x, vmax); /* a NaN x is passed over, as fmaxf does */
  }
  return reduce_max(vmax);
}

/* The largest of a row's n raw scores (a NaN passed over). */
PA_INLINE float raw_max(const float *row, size_t n) {
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  __m256 vmax = minus_inf;
  size_t j = 0;
  for (; j + 8 <= n; j += 8) vmax = _mm256_max_ps(_mm256_loadu_ps(row + j), vmax);
  if (j < n) {
    __m256 tail = _mm256_castsi256_ps(pa256_tail_mask(n - j));
    vmax = _mm256_max_ps(_mm256_blendv_ps(minus_inf, pa256_load_f32(row + j, n - j), tail), vmax);
  }
  return reduce_max(vmax);
}

/* As the AVX-512 version: maxima, corrections 8 rows per vector, weights.
 * A tile that every row sees whole, with no cap or ALiBi (most of a
 * prompt's), keeps its raw scores: the logits' maximum is the scores'
 * times the positive scale, and each weight takes its logit from the score
 * in the exponential's FMA, so the first pass writes nothing. */
static void pa_softmax_avx2(const pa_softmax_tile *t, float *s, size_t lds) {
  const int raw = !t->key_lo && t->soft_cap == 0.0f && !t->alibi && t->score_scale > 0.0f;
  const float log2_scale = t->score_scale * PA_LOG2E;
  float *old_max = t->rescale;
  for (size_t i = 0; i < t->m; i++) {
    old_max[i] = t->row_max[i];
    float top = raw ? raw_max(s + i * lds, t->n) * log2_scale : logits_row(t, i, s + i * lds);
    t->row_max[i] = fmaxf(old_max[i], top);
  }
  for (size_t i = 0; i < t->m; i += 8) {
    size_t count = t->m - i < 8 ? t->m - i : 8;
    __m256 before = pa256_load_f32(old_max + i, count);
    __m256 after = pa256_load_f32(t->row_max + i, count);
    __m256 none = _mm256_cmp_ps(after, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
    __m256 correction =
        _mm256_blendv_ps(pa256_exp2(_mm256_sub_ps(before, after)), _mm256_set1_ps(1.0f), none);
    __m256 sum = _mm256_mul_ps(pa256_load_f32(t->row_sum + i, count), correction);
    pa256_store_f32(t->rescale + i, correction, count);
    pa256_store_f32(t->row_sum + i, sum, count);
  }
  for (size_t i = 0; i < t->m; i++) {
    float *row = s + i * lds;
    if (t->row_max[i] == -INFINITY) {
      memset(row, 0, t->n * sizeof(float));
      continue;
    }
    __m256 shift = _mm256_set1_ps(t->row_max[i]), vsum = _mm256_setzero_ps();
    __m256 factor = _mm256_set1_ps(raw ? log2_scale : 1.0f);
    size_t j = 0;
    for (; j + 8 <= t->n; j += 8) {
      __m256 weight = pa256_exp2(_mm256_fmsub_ps(_mm256_loadu_ps(row + j), factor, shift));
      _mm256_storeu_ps(row + j, weight);
      vsum = _mm256_add_ps(vsum, weight);
    }
    if (j < t->n) {
      size_t count = t->n - j;
      __m256 weight = pa256_exp2(_mm256_fmsub_ps(pa256_load_f32(row + j, count), factor, shift));
      pa256_store_f32(row + j, weight, count);
      /* The padding lanes hold 2^(0 - shift), not part of the sum. */
      vsum =
          _mm256_add_ps(vsum, _mm256_and_ps(weight, _mm256_castsi256_ps(pa256_tail_mask(count))));
    }
    t->row_sum[i] += reduce_add(vsum);
  }
}

void pa_attn_kernels_avx2(pa_kernels *k) {
  PA_SET_PER_DTYPE(k->qk, pa_qk_f32, avx2);
  PA_SET_PER_DTYPE(k->pv, pa_pv_f32, avx2);
  k->softmax = pa_softmax_avx2;
}
