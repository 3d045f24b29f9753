/* Packed-tile micro-kernels for prefill, AVX2 f32: the AVX-512 design with
 * 8-wide vectors, 8 x 8 transposes, and register blocks of up to 6 rows x
 * 16 keys (or columns of O) to fit sixteen registers. */
#include "avx2-common.h"
#include "kernels.h"
#include "prefetch.h"

typedef __m256 (*pa256_loader)(const void *, size_t);

PA_INLINE void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  /* u[4b + c] holds columns c and c+4 of rows 4b..4b+3. */
  for (int c = 0; c < 4; c++) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

/* This family's packed layouts (see kernels.h) hold each 16-key panel of
 * K^T, and each 16-column panel of V, whole in consecutive memory:
 *   K: kt[(j / 16) * 16 * d + e * 16 + j % 16] = k_j[e]
 *   V: v[(e / 16) * 16 * PA_PACK_KEYS + j * 16 + e % 16] = v_j[e]
 * so that a register block's pass over its panel walks one run. With the
 * rows PA_PACK_KEYS floats (512 bytes) apart, a panel's lines fell into an
 * eighth of the L1's sets, more than those hold (docs/code-figures.md,
 * "AVX2 packed panels"). */
PA_INLINE const float *k_panel(const float *kt, size_t j0, size_t d) {
  return kt + j0 / 16 * 16 * d;
}

PA_INLINE const float *v_panel(const float *v, size_t c0) {
  return v + c0 / 16 * 16 * (size_t)PA_PACK_KEYS;
}

PA_INLINE void pack_k(pa256_loader load, size_t elem, void *dst, const void *const *rows, size_t n,
                      size_t d) {
  float *kt = dst;
  for (size_t j0 = 0; j0 < (n + 15) / 16 * 16;
       j0 += 8) { /* the columns pa_qk_packed_f32_avx2 reads */
    for (size_t e0 = 0; e0 < d; e0 += 8) {
      size_t count = d - e0 < 8 ? d - e0 : 8;
      __m256 block[8];
      for (size_t j = 0; j < 8; j++) {
        block[j] =
            j0 + j < n ? load((const char *)rows[j0 + j] + e0 * elem, count) : _mm256_setzero_ps();
      }
      transpose8(block);
      for (size_t e = 0; e < count; e++) {
        _mm256_storeu_ps(kt + j0 / 16 * 16 * d + (e0 + e) * 16 + j0 % 16, block[e]);
      }
    }
  }
}

PA_INLINE void pack_v(pa256_loader load, size_t elem, void *dst, const void *const *rows, size_t n,
                      size_t d) {
  float *v = dst;
  size_t ldv = (d + 15) / 16 * 16;
  for (size_t j = 0; j < n; j++) {
    for (size_t e = 0; e < ldv; e += 8) {
      __m256 x = e < d ? load((const char *)rows[j] + e * elem, d - e) : _mm256_setzero_ps();
      _mm256_storeu_ps(v + e / 16 * 16 * PA_PACK_KEYS + j * 16 + e % 16, x);
    }
  }
}

#define PA_DEFINE_PACK(suffix, loader, elem)                                                      \
  static void pa_pack_k_##suffix##_avx2(void *dst, const void *const *rows, size_t n, size_t d) { \
    pack_k(loader, elem, dst, rows, n, d);                                                        \
  }                                                                                               \
  static void pa_pack_v_##suffix##_avx2(void *dst, const void *const *rows, size_t n, size_t d) { \
    pack_v(loader, elem, dst, rows, n, d);                                                        \
  }

PA_DEFINE_PACK(f32, pa256_load_f32, 4)
PA_DEFINE_PACK(f16, pa256_load_f16, 2)
PA_DEFINE_PACK(bf16, pa256_load_bf16, 2)
PA_DEFINE_PACK(e4m3, pa256_load_e4m3, 1)
PA_DEFINE_PACK(e5m2, pa256_load_e5m2, 1)

/* Runs STATEMENT with `cols`, a constant, set to the 8-lane vectors that
 * hold `count` (1 to 16) keys or columns of a register block. */
#define FOR_VECTORS(count, STATEMENT) \
  do {                                \
    if ((count) > 8) {                \
      const int cols = 2;             \
      STATEMENT;                      \
    } else {                          \
      const int cols = 1;             \
      STATEMENT;                      \
    }                                 \
  } while (0)

/* rows x (8 cols) scores: one broadcast of q per row and `cols` K^T loads
 * per e. Twelve accumulators (6 rows x 16 keys) hide the FMA latency,
 * which eight do not, and leave a register for K and one for Q. The block
 * is units [first, first + rows * keys) of the call's `total`. */
PA_INLINE void qk_block(const int rows, const int cols, size_t keys, size_t d, const float *q,
                        size_t ldq, const float *kt, float *s, size_t lds, pa_prefetch *prefetch,
                        size_t first, size_t total) {
  pa_prefetch_span(prefetch, first, (size_t)rows * keys, total, pa_packed_steps(d));
  __m256 acc[6][2];
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) acc[r][c] = _mm256_setzero_ps();
  }
  for (size_t e = 0; e < d; e++) {
    pa_prefetch_packed(prefetch, e);
    const float *k = kt + e * 16;
    __m256 kv[2];
    for (int c = 0; c < cols; c++) kv[c] = _mm256_loadu_ps(k + 8 * c);
    for (int r = 0; r < rows; r++) {
      __m256 b = _mm256_broadcast_ss(q + r * ldq + e);
      for (int c = 0; c < cols; c++) acc[r][c] = _mm256_fmadd_ps(b, kv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) _mm256_storeu_ps(s + r * lds + 8 * c, acc[r][c]);
  }
}

static void pa_qk_packed_f32_avx2(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                                  const void *k_packed, float *s, size_t lds,
                                  pa_prefetch *prefetch) {
  const float *q = q_rows, *kt = k_packed;
  /* 16 keys at a time, the last block in one vector when it needs no more
   * (a causal diagonal ends anywhere). The requests are spread over the
   * row x key products. */
  for (size_t k0 = 0; k0 < n; k0 += 16) {
    size_t keys = PA_MIN(n - k0, 16);
#define QK_BLOCK(rows, i)                                                                    \
  qk_block(rows, cols, keys, d, q + (i)*ldq, ldq, k_panel(kt, k0, d), s + (i)*lds + k0, lds, \
           prefetch, k0 * m + (i)*keys, m * n)
    FOR_VECTORS(keys, PA_PACKED_ROW_BLOCKS(m, QK_BLOCK));
#undef QK_BLOCK
  }
}

/* rows x (8 cols) columns of O from c0, kept in registers over the tile's
 * keys; the last of the `cols` vectors holds `last` (1 to 8) columns below
 * d. The packed V panel's rows are padded to 16 columns with zeros, so
 * V loads whole vectors. The block is units [first, first + rows *
 * columns) of the call's `total`. */
PA_INLINE void pv_block(const int rows, const int cols, size_t last, size_t n, const float *p,
                        size_t ldp, const float *v, float *o, size_t ldo, const float *rescale,
                        pa_prefetch *prefetch, size_t first, size_t total) {
  size_t columns = 8 * (size_t)(cols - 1) + last;
  pa_prefetch_span(prefetch, first, (size_t)rows * columns, total, pa_packed_steps(n));
  const __m256i tail = pa256_tail_mask(last);
  __m256 acc[6][2];
  for (int r = 0; r < rows; r++) {
    __m256 scale = pa256_row_scale(rescale, r);
    for (int c = 0; c < cols; c++) {
      const float *at = o + r * ldo + 8 * c;
      __m256 before =
          c + 1 < cols || last == 8 ? _mm256_loadu_ps(at) : _mm256_maskload_ps(at, tail);
      acc[r][c] = pa256_scaled(before, scale);
    }
  }
  for (size_t j = 0; j < n; j++, v += 16) {
    pa_prefetch_packed(prefetch, j);
    __m256 vv[2];
    for (int c = 0; c < cols; c++) vv[c] = _mm256_loadu_ps(v + 8 * c);
    for (int r = 0; r < rows; r++) {
      __m256 b = _mm256_broadcast_ss(p + r * ldp + j);
      for (int c = 0; c < cols; c++) acc[r][c] = _mm256_fmadd_ps(b, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) {
      float *at = o + r * ldo + 8 * c;
      if (c + 1 < cols || last == 8)
        _mm256_storeu_ps(at, acc[r][c]);
      else
        _mm256_maskstore_ps(at, tail, acc[r][c]);
    }
  }
}

static void pa_pv_packed_f32_avx2(size_t m, size_t n, size_t d, const void *weights, size_t ldp,
                                  const void *v_packed, float *o, size_t ldo, const float *rescale,
                                  pa_prefetch *prefetch) {
  const float *p = weights;
  const float *v = v_packed;
  /* 16 columns at a time; the requests are spread over the row x column
   * products. */
  for (size_t c0 = 0; c0 < d; c0 += 16) {
    size_t columns = PA_MIN(d - c0, 16), last = (columns - 1) % 8 + 1;
#define PV_BLOCK(rows, i)                                                                \
  pv_block(rows, cols, last, n, p + (i)*ldp, ldp, v_panel(v, c0), o + (i)*ldo + c0, ldo, \
           pa_rescale_from(rescale, i), prefetch, c0 * m + (i)*columns, m * d)
    FOR_VECTORS(columns, PA_PACKED_ROW_BLOCKS(m, PV_BLOCK));
#undef PV_BLOCK
  }
}

void pa_prefill_kernels_avx2(pa_kernels *k) {
  PA_SET_PER_DTYPE(k->pack_k, pa_pack_k, avx2);
  PA_SET_PER_DTYPE(k->pack_v, pa_pack_v, avx2);
  k->qk_packed = pa_qk_packed_f32_avx2;
  k->pv_packed = pa_pv_packed_f32_avx2;
  /* Items of 16 rows per KV head or more take the packed kernels: with
   * twelve accumulators and whole panels they overtook the direct ones
   * between 4 rows and 16 on Zen 2 (docs/code-figures.md, AVX2
   * packed_min_rows). */
  k->packed_min_rows = 16;
}
