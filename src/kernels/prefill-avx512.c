/* Packed-tile micro-kernels for prefill, AVX-512 f32.
 *
 * Packing K transposes it 16 x 16 at a time so that S = Q K^T becomes a
 * register-blocked outer product: 6 query rows x 64 keys of accumulators,
 * one broadcast of q[i][e] per row and four loads of K^T per step e. O += P V
 * is the same shape over V's columns. Each tile is packed once and used by
 * every query row of the item.
 *
 * The layouts are kernels.h's cut into the panels the register blocks walk:
 * K^T in panels of 64 keys (kt_at), V in panels of 64 columns (v_at), each
 * contiguous. In kernels.h's rows of PA_PACK_KEYS (512 bytes) a block's
 * 256-byte slices of the rows fall in half the L1 sets, more lines than
 * their ways hold, and every row block read its panel from L2 again
 * (docs/xeon-amx.md, "f32 packed panels"). */
#include "avx512-common.h"
#include "kernels.h"
#include "prefetch.h"

typedef __m512 (*pa512_loader)(const void *, __mmask16);

enum { PA_PANEL = 64 }; /* keys of a K^T panel, columns of a V panel */

/* K^T: element e of key j. */
PA_INLINE size_t kt_at(size_t j, size_t e, size_t d) {
  return j / PA_PANEL * PA_PANEL * d + e * PA_PANEL + j % PA_PANEL;
}

/* V (rows padded to ldv, a multiple of 16, columns): column e of key j, in
 * the panel of width v_panel_width(e / 64 * 64). */
PA_INLINE size_t v_panel_width(size_t c0, size_t ldv) { return PA_MIN(ldv - c0, (size_t)PA_PANEL); }
PA_INLINE size_t v_at(size_t j, size_t e, size_t ldv) {
  size_t c0 = e / PA_PANEL * PA_PANEL;
  return c0 * PA_PACK_KEYS + j * v_panel_width(c0, ldv) + e % PA_PANEL;
}

PA_INLINE void pack_k(pa512_loader load, size_t elem, void *dst, const void *const *rows, size_t n,
                      size_t d) {
  float *kt = dst;
  for (size_t j0 = 0; j0 < (n + 63) / 64 * 64;
       j0 += 16) { /* the columns pa_qk_packed_f32_avx512 reads */
    for (size_t e0 = 0; e0 < d; e0 += 16) {
      __mmask16 m = pa512_tail_mask(d - e0);
      __m512 block[16];
      for (size_t j = 0; j < 16; j++) {
        block[j] =
            j0 + j < n ? load((const char *)rows[j0 + j] + e0 * elem, m) : _mm512_setzero_ps();
      }
      pa512_transpose16(block);
      for (size_t e = 0; e < 16 && e0 + e < d; e++)
        _mm512_storeu_ps(kt + kt_at(j0, e0 + e, d), block[e]);
    }
  }
}

PA_INLINE void pack_v(pa512_loader load, size_t elem, void *dst, const void *const *rows, size_t n,
                      size_t d) {
  float *v = dst;
  size_t ldv = (d + 15) / 16 * 16;
  for (size_t j = 0; j < n; j++) {
    for (size_t e = 0; e < d; e += 16) {
      _mm512_storeu_ps(v + v_at(j, e, ldv),
                       load((const char *)rows[j] + e * elem, pa512_tail_mask(d - e)));
    }
  }
}

#define PA_DEFINE_PACK(suffix, loader, elem)                                            \
  static void pa_pack_k_##suffix##_avx512(void *dst, const void *const *rows, size_t n, \
                                          size_t d) {                                   \
    pack_k(loader, elem, dst, rows, n, d);                                              \
  }                                                                                     \
  static void pa_pack_v_##suffix##_avx512(void *dst, const void *const *rows, size_t n, \
                                          size_t d) {                                   \
    pack_v(loader, elem, dst, rows, n, d);                                              \
  }

PA_DEFINE_PACK(f32, pa512_load_f32, 4)
PA_DEFINE_PACK(f16, pa512_load_f16, 2)
PA_DEFINE_PACK(bf16, pa512_load_bf16, 2)
PA_DEFINE_PACK(e4m3, pa512_load_e4m3, 1)
PA_DEFINE_PACK(e5m2, pa512_load_e5m2, 1)

/* rows x (16 cols) scores: one broadcast of q per row and `cols` K^T loads
 * per e. The block is units [first, first + rows * keys) of the call's
 * `total`. */
PA_INLINE void qk_block(const int rows, const int cols, size_t keys, size_t d, const float *q,
                        size_t ldq, const float *kt, float *s, size_t lds, pa_prefetch *prefetch,
                        size_t first, size_t total) {
  pa_prefetch_span(prefetch, first, (size_t)rows * keys, total, pa_packed_steps(d));
  __m512 acc[6][4];
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) acc[r][c] = _mm512_setzero_ps();
  }
  for (size_t e = 0; e < d; e++) {
    pa_prefetch_packed(prefetch, e);
    const float *k = kt + e * PA_PANEL;
    __m512 kv[4];
    for (int c = 0; c < cols; c++) kv[c] = _mm512_loadu_ps(k + 16 * c);
    for (int r = 0; r < rows; r++) {
      __m512 b = _mm512_set1_ps(q[r * ldq + e]);
      for (int c = 0; c < cols; c++) acc[r][c] = _mm512_fmadd_ps(b, kv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < cols; c++) _mm512_storeu_ps(s + r * lds + 16 * c, acc[r][c]);
  }
}

static void pa_qk_packed_f32_avx512(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                                    const void *k_packed, float *s, size_t lds,
                                    pa_prefetch *prefetch) {
  const float *q = q_rows, *kt = k_packed;
  /* A K^T panel at a time, the last block in as many 16-key columns as it
   * needs (a causal diagonal ends anywhere). The requests are spread over
   * the row x key products. */
  for (size_t k0 = 0; k0 < n; k0 += PA_PANEL) {
    size_t keys = PA_MIN(n - k0, (size_t)PA_PANEL);
    const float *panel = kt + kt_at(k0, 0, d);
#define QK_BLOCK(rows, i)                                                                 \
  qk_block(rows, cols, keys, d, q + (i)*ldq, ldq, panel, s + (i)*lds + k0, lds, prefetch, \
           k0 * m + (i)*keys, m * n)
    PA_FOR_COLUMN_VECTORS(keys, PA_PACKED_ROW_BLOCKS(m, QK_BLOCK));
#undef QK_BLOCK
  }
}

/* rows x (16 cols) columns of O from c0, kept in registers over the tile's
 * keys; `cols` (a constant) vectors hold the block's columns below d, only
 * the last of which may be `partial` (docs/code-figures.md, pv_packed_block).
 * The block is units [first, first + rows * columns) of the call's `total`. */
PA_INLINE void pv_block(const int rows, const int cols, const int partial, size_t n, size_t c0,
                        size_t d, const float *p, size_t ldp, const float *v, size_t ldv, float *o,
                        size_t ldo, const float *rescale, pa_prefetch *prefetch, size_t first,
                        size_t total) {
  pa_prefetch_span(prefetch, first, (size_t)rows * PA_MIN(d - c0, 64), total, pa_packed_steps(n));
  /* Packed V rows are padded to 16 columns, so full loads are safe up to d. */
  const __mmask16 last = partial ? pa512_tail_mask(d - c0 - 16 * (size_t)(cols - 1)) : 0xffff;
  __m512 acc[6][4];
  pa512_load_o_block(rows, cols, partial, last, o + c0, ldo, rescale, acc);
  const float *vj = v + v_at(0, c0, ldv);
  const size_t row_stride = v_panel_width(c0, ldv);
  for (size_t j = 0; j < n; j++, vj += row_stride) {
    pa_prefetch_packed(prefetch, j);
    __m512 vc[4];
    for (int c = 0; c < cols; c++) vc[c] = _mm512_loadu_ps(vj + 16 * c);
    for (int r = 0; r < rows; r++) {
      __m512 b = _mm512_set1_ps(p[r * ldp + j]);
      for (int c = 0; c < cols; c++) acc[r][c] = _mm512_fmadd_ps(b, vc[c], acc[r][c]);
    }
  }
  pa512_store_o_block(rows, cols, partial, last, o + c0, ldo, acc);
}

static void pa_pv_packed_f32_avx512(size_t m, size_t n, size_t d, const void *weights, size_t ldp,
                                    const void *v_packed, float *o, size_t ldo,
                                    const float *rescale, pa_prefetch *prefetch) {
  const float *p = weights;
  const float *v = v_packed;
  size_t ldv = (d + 15) / 16 * 16;
  /* The requests are spread over the row x column products. */
  for (size_t c0 = 0; c0 < d; c0 += 64) {
#define PV_BLOCK(rows, i)                                                             \
  pv_block(rows, cols, partial, n, c0, d, p + (i)*ldp, ldp, v, ldv, o + (i)*ldo, ldo, \
           pa_rescale_from(rescale, i), prefetch, c0 * m + (i)*PA_MIN(d - c0, 64), m * d)
    if (c0 + 64 <= d) {
      const int cols = 4, partial = 0;
      PA_PACKED_ROW_BLOCKS(m, PV_BLOCK);
    } else {
      const int partial = 1;
      PA_FOR_COLUMN_VECTORS(d - c0, PA_PACKED_ROW_BLOCKS(m, PV_BLOCK));
    }
#undef PV_BLOCK
  }
}

void pa_prefill_kernels_avx512(pa_kernels *k) {
  PA_SET_PER_DTYPE(k->pack_k, pa_pack_k, avx512);
  PA_SET_PER_DTYPE(k->pack_v, pa_pack_v, avx512);
  k->qk_packed = pa_qk_packed_f32_avx512;
  k->pv_packed = pa_pv_packed_f32_avx512;
  /* The packed kernels overtake the direct ones between 16 and 64 rows per
   * KV head (docs/code-figures.md, packed_min_rows). */
  k->packed_min_rows = 64;
}
