/* Attention micro-kernels, AVX-512 (f32 FMA on K/V decoded in registers).
 *
 * S = Q K^T works on register blocks of 16 dot products (4 rows x 4 keys,
 * 2 x 8 or 1 x 16): each K chunk is decoded once per block and reused by
 * every row, and the 16 accumulators are reduced together by a transpose
 * tree (45 shuffles and adds instead of 16 separate horizontal sums).
 * O += P V keeps a block of O in registers across all keys of the tile. */
#include <math.h>

#include "avx512-common.h"
#include "kernels.h"
#include "prefetch.h"
#include "softmax-avx512.h"

typedef __m512 (*pa512_loader)(const void *, __mmask16);

/* rows x keys = 16 dot products; q has `rows` rows of Q elements that
 * `qload` widens (f32, or bf16 as it is stored), k has `keys` pointers
 * (padded by the caller); only rows x keys_valid results are stored. The
 * block before it (`pending`) is finished after this one's second chunk,
 * and this one left pending in turn (pa512_pending_block). */
PA_INLINE void qk_block(const int rows, const int keys, pa512_loader qload, size_t q_elem,
                        pa512_loader load, size_t elem, size_t d, const char *q, size_t ldq,
                        const void *const *k, float *s, size_t lds, size_t keys_valid,
                        pa512_pending_block *pending) {
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  PA_FOR_CHUNKS(c, d, 16, "GCC unroll 16", {
    __mmask16 m = pa512_tail_mask(d - c);
    __m512 qv[4];
    for (int r = 0; r < rows; r++) qv[r] = qload(q + (r * ldq + c) * q_elem, m);
    for (int j = 0; j < keys; j++) {
      __m512 kv = load((const char *)k[j] + c * elem, m);
      for (int r = 0; r < rows; r++)
        acc[r * keys + j] = _mm512_fmadd_ps(qv[r], kv, acc[r * keys + j]);
    }
    if (c == 16) pa512_finish_block(rows, pending, lds);
  });
  pa512_finish_block(rows, pending, lds);
  pa512_reduce16_begin(acc, pending, s, keys_valid);
}

PA_INLINE void qk_rows(const int rows, pa512_loader qload, size_t q_elem, pa512_loader load,
                       size_t elem, size_t n, size_t d, const char *q, size_t ldq,
                       const void *const *k_rows, float *s, size_t lds, pa_prefetch *prefetch) {
#define QK_BLOCK(keys, k, j, valid, pending) \
  qk_block(rows, keys, qload, q_elem, load, elem, d, q, ldq, k, s + (j), lds, valid, pending)
  PA512_QK_KEY_BLOCKS(rows, n, k_rows, lds, prefetch, QK_BLOCK);
#undef QK_BLOCK
}

PA_INLINE void qk(pa512_loader qload, size_t q_elem, pa512_loader load, size_t elem, size_t m,
                  size_t n, size_t d, const void *q_rows, size_t ldq, const void *const *k_rows,
                  float *s, size_t lds, pa_prefetch *prefetch) {
  const char *q = q_rows;
#define QK_GROUP(rows, i)                                                               \
  qk_rows(rows, qload, q_elem, load, elem, n, width, q + (i)*ldq * q_elem, ldq, k_rows, \
          s + (i)*lds, lds, prefetch)
  PA_WITH_HEAD_SIZE(d, width, PA_ROW_GROUPS(prefetch, m, n, QK_GROUP));
#undef QK_GROUP
}

/* acc[r][c] += P[r][j] V[j][c] for keys [0, n), one prefetch step per 8
 * keys (docs/code-figures.md, P V request steps); `full`: no partial
 * chunk, so the loads need no mask test. */
PA_INLINE void pv_keys(const int rows, const int chunks, const int full, pa512_loader load,
                       size_t elem, size_t n, const __mmask16 *mask, const float *p, size_t ldp,
                       const char *const *v_rows, size_t offset, __m512 *acc,
                       pa_prefetch *prefetch) {
  for (size_t j = 0; j < n; j++) {
    if (j % 8 == 0) pa_prefetch_step(prefetch, j + 8);
    __m512 vv[8];
    const char *v = v_rows[j] + offset;
    for (int c = 0; c < chunks; c++)
      vv[c] =
          full ? load(v + 16 * (size_t)c * elem, 0xffff) : load(v + 16 * (size_t)c * elem, mask[c]);
    for (int r = 0; r < rows; r++) {
      __m512 weight = _mm512_set1_ps(p[r * ldp + j]);
      for (int c = 0; c < chunks; c++)
        acc[r * chunks + c] = _mm512_fmadd_ps(weight, vv[c], acc[r * chunks + c]);
    }
  }
}

/* O[0..rows)[c0 .. c0 + 16 chunks) += P V over n keys. */
PA_INLINE void pv_block(const int rows, const int chunks, pa512_loader load, size_t elem, size_t n,
                        size_t c0, size_t d, const float *p, size_t ldp, const void *const *v_rows,
                        float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  __mmask16 mask[8];
  __m512 acc[16];
  pa512_load_o_vectors(rows, chunks, c0, d, o, ldo, rescale, mask, acc);
  const char *const *v = (const char *const *)v_rows;
  if (c0 + 16 * (size_t)chunks <= d)
    pv_keys(rows, chunks, 1, load, elem, n, mask, p, ldp, v, c0 * elem, acc, prefetch);
  else
    pv_keys(rows, chunks, 0, load, elem, n, mask, p, ldp, v, c0 * elem, acc, prefetch);
  pa512_store_o_vectors(rows, chunks, c0, mask, acc, o, ldo);
}

/* One group of `rows` rows (1-4) over every column of O, in blocks of up to
 * `width` 16-column chunks; a block takes no more chunks than the columns
 * left need, rounded up to a power of two (head size 64: four chunks, not
 * eight of which four load and multiply nothing). */
PA_INLINE void pv_group(const int rows, const int width, pa512_loader load, size_t elem, size_t i,
                        size_t m, size_t n, size_t d, const float *p, size_t ldp,
                        const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                        pa_prefetch *prefetch) {
  for (size_t c0 = 0; c0 < d; c0 += 16 * (size_t)width) {
    size_t left = (d - c0 + 15) / 16;
    pa_prefetch_span(prefetch, i * d + (size_t)rows * c0,
                     (size_t)rows * PA_MIN(d - c0, 16 * (size_t)width), m * d, n);
    const float *r = pa_rescale_from(rescale, i);
#define PV_BLOCK(chunks)                                                                      \
  pv_block(rows, chunks, load, elem, n, c0, d, p + i * ldp, ldp, v_rows, o + i * ldo, ldo, r, \
           prefetch)
    if (left > 4 && width >= 8) {
      PV_BLOCK(8);
    } else if (left > 2) {
      PV_BLOCK(4);
    } else if (left > 1) {
      PV_BLOCK(2);
    } else {
      PV_BLOCK(1);
    }
#undef PV_BLOCK
  }
}

/* Rows in groups of 4, then one of 3, 2 or 1, so that each V row is read
 * once per group: 4 or 3 rows take 4-chunk blocks, 2 or 1 rows 8-chunk
 * blocks (16 accumulators at most). */
PA_INLINE void pv(pa512_loader load, size_t elem, size_t m, size_t n, size_t d, const float *p,
                  size_t ldp, const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                  pa_prefetch *prefetch) {
#define PV_GROUP(rows, i)                                                                      \
  pv_group(rows, (rows) >= 3 ? 4 : 8, load, elem, i, m, n, d, p, ldp, v_rows, o, ldo, rescale, \
           prefetch)
  PA_ROW_GROUPS_OF_4(m, PV_GROUP);
#undef PV_GROUP
}

#define PA_DEFINE_QK_PV(suffix, loader, elem)                                                      \
  static void pa_qk_f32_##suffix##_avx512(size_t m, size_t n, size_t d, const void *q, size_t ldq, \
                                          const void *const *k_rows, float *s, size_t lds,         \
                                          pa_prefetch *prefetch) {                                 \
    qk(pa512_load_f32, 4, loader, elem, m, n, d, q, ldq, k_rows, s, lds, prefetch);                \
  }                                                                                                \
  static void pa_pv_f32_##suffix##_avx512(                                                         \
      size_t m, size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,         \
      float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {                         \
    pv(loader, elem, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                          \
  }

PA_DEFINE_QK_PV(f32, pa512_load_f32, 4)
PA_DEFINE_QK_PV(f16, pa512_load_f16, 2)
PA_DEFINE_QK_PV(bf16, pa512_load_bf16, 2)
PA_DEFINE_QK_PV(e4m3, pa512_load_e4m3, 1)
PA_DEFINE_QK_PV(e5m2, pa512_load_e5m2, 1)

/* Q K^T with Q as bf16 activations hold it (the score factor left to the
 * pa_softmax_avx512) over a bf16 cache, and P V over it, on the FMA units: the bf16
 * pair's direct kernels where the CPU's bf16 dot products are slower than
 * its FMA (see pa_bf16_dot_is_fast) but its packed ones want Q unscaled. */
void pa_qk_bf16_bf16_avx512(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                            const void *const *k_rows, float *s, size_t lds,
                            pa_prefetch *prefetch) {
  qk(pa512_load_bf16, 2, pa512_load_bf16, 2, m, n, d, q, ldq, k_rows, s, lds, prefetch);
}

void pa_pv_bf16_bf16_avx512(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                            const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                            pa_prefetch *prefetch) {
  pa_pv_f32_bf16_avx512(m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);
}

/* The online softmax of softmax-avx512.h with f32 weights. */
PA_INLINE void store_f32_weights(float *row, size_t j, __m512 weights, __mmask16 in_tile) {
  _mm512_mask_storeu_ps(row + j, in_tile, weights);
}

PA_INLINE void store_f32_weight_pair(float *row, size_t j, __m512 lo, __m512 hi) {
  _mm512_storeu_ps(row + j, lo);
  _mm512_storeu_ps(row + j + 16, hi);
}

static void pa_softmax_avx512(const pa_softmax_tile *t, float *s, size_t lds) {
  pa512_softmax(t, s, lds, PA512_WEIGHTS_F32, store_f32_weights, store_f32_weight_pair);
}

void pa_attn_kernels_avx512(pa_kernels *k) {
  PA_SET_PER_DTYPE(k->qk, pa_qk_f32, avx512);
  PA_SET_PER_DTYPE(k->pv, pa_pv_f32, avx512);
  k->softmax = pa_softmax_avx512;
}
