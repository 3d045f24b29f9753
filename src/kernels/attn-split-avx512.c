/* Attention micro-kernels for bf16 caches on the f32 FMA units, AVX-512,
 * widening bf16 without the shuffle unit.
 *
 * Each 32-bit lane of a bf16 row holds a pair of elements: shifted left by
 * 16 it is the even element as an f32, with its low half cleared the odd
 * one. Widening 16 elements in order instead takes a vpmovzxwd, a shuffle,
 * and on the Xeons whose bf16 caches take these kernels (their bf16 dot
 * products are slower than the FMAs, pa_bf16_dot_is_fast) the shuffle port
 * is one of the two FMA ports (docs/decode-memory.md, "bf16 split in
 * pairs"). Elsewhere they serve f32 and f16 activations over bf16 caches.
 *
 * So every 32 elements of a row are split into an even and an odd vector:
 * Q K^T takes Q split the same way once per call (each 32-element group
 * stored as its 16 even, then its 16 odd elements in f32, by
 * pa_load_q_split_*), and P V splits the columns of O it keeps in registers
 * on loading them and interleaves them back on storing. Elements past the
 * head size are loaded as zeros (a masked 16-bit load), so any head size
 * works and no byte past a row is read. */
#include "avx512-common.h"
#include "kernels.h"
#include "prefetch.h"

/* permutex2var indices: the even and odd elements of a 32-element group
 * held in order as two vectors, and elements 0-15 and 16-31 of a group
 * held split. */
#define PA_EVEN_LANES 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define PA_ODD_LANES 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define PA_INORDER_LO 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define PA_INORDER_HI 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31
#define PA_LANES(...) _mm512_setr_epi32(__VA_ARGS__)

PA_INLINE __mmask32 words_before(size_t left) {
  return left >= 32 ? (__mmask32)~0u : (__mmask32)((1u << left) - 1u);
}

/* The 32 bf16 elements of `row` from element c, those at or past d as 0
 * (all of them where a block's last group starts past d). */
PA_INLINE __m512i load_pairs(const void *row, size_t c, size_t d) {
  const char *at = (const char *)row + 2 * c;
  if (c + 32 <= d) return _mm512_loadu_si512(at);
  return _mm512_maskz_loadu_epi16(c < d ? words_before(d - c) : 0, at);
}

/* A group of 32 f32 elements held in order (lo: 0-15, hi: 16-31) as its
 * even and odd elements, and back. */
PA_INLINE void split_group(__m512 lo, __m512 hi, __m512 *even, __m512 *odd) {
  *even = _mm512_permutex2var_ps(lo, PA_LANES(PA_EVEN_LANES), hi);
  *odd = _mm512_permutex2var_ps(lo, PA_LANES(PA_ODD_LANES), hi);
}

PA_INLINE void join_group(__m512 even, __m512 odd, __m512 *lo, __m512 *hi) {
  *lo = _mm512_permutex2var_ps(even, PA_LANES(PA_INORDER_LO), odd);
  *hi = _mm512_permutex2var_ps(even, PA_LANES(PA_INORDER_HI), odd);
}

/* Q row conversion (see pa_load_row_fn): n elements times `factor`, each
 * 32-element group split (even elements, then odd), zeros up to the group's
 * end. */
#define PA_DEFINE_LOAD_Q_SPLIT(name, elem_t, load)                                           \
  static void name(void *out, const void *src, size_t n, float factor) {                     \
    float *dst = out;                                                                        \
    const elem_t *in = src;                                                                  \
    const __m512 f = _mm512_set1_ps(factor);                                                 \
    for (size_t c = 0; c < n; c += 32) {                                                     \
      __m512 lo = _mm512_mul_ps(load(in + c, pa512_tail_mask(n - c)), f);                    \
      __m512 hi = _mm512_setzero_ps(), even, odd;                                            \
      if (c + 16 < n) hi = _mm512_mul_ps(load(in + c + 16, pa512_tail_mask(n - c - 16)), f); \
      split_group(lo, hi, &even, &odd);                                                      \
      _mm512_storeu_ps(dst + c, even);                                                       \
      _mm512_storeu_ps(dst + c + 16, odd);                                                   \
    }                                                                                        \
  }

PA_DEFINE_LOAD_Q_SPLIT(pa_load_q_split_f32_avx512, float, pa512_load_f32)
PA_DEFINE_LOAD_Q_SPLIT(pa_load_q_split_f16_avx512, uint16_t, pa512_load_f16)
PA_DEFINE_LOAD_Q_SPLIT(pa_load_q_split_bf16_avx512, uint16_t, pa512_load_bf16)

/* rows x keys = 16 dot products of split Q rows with bf16 K rows (k: `keys`
 * pointers, padded by the caller); rows x `valid` of them stored, the block
 * before finished on the way (pa512_pending_block). */
PA_INLINE void qk_block(const int rows, const int keys, size_t d, const float *q, size_t ldq,
                        const void *const *k, float *s, size_t lds, size_t valid,
                        pa512_pending_block *pending) {
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  PA_FOR_CHUNKS(c, d, 32, "GCC unroll 8", {
    __m512 q_even[4], q_odd[4];
    for (int r = 0; r < rows; r++) {
      q_even[r] = _mm512_loadu_ps(q + r * ldq + c);
      q_odd[r] = _mm512_loadu_ps(q + r * ldq + c + 16);
    }
    for (int j = 0; j < keys; j++) {
      __m512i pairs = load_pairs(k[j], c, d);
      __m512 k_even = pa512_pair_even(pairs), k_odd = pa512_pair_odd(pairs);
      for (int r = 0; r < rows; r++) {
        acc[r * keys + j] = _mm512_fmadd_ps(q_even[r], k_even, acc[r * keys + j]);
        acc[r * keys + j] = _mm512_fmadd_ps(q_odd[r], k_odd, acc[r * keys + j]);
      }
    }
    if (c == 32) pa512_finish_block(rows, pending, lds);
  });
  pa512_finish_block(rows, pending, lds);
  pa512_reduce16_begin(acc, pending, s, valid);
}

PA_INLINE void qk_rows(const int rows, size_t n, size_t d, const float *q, size_t ldq,
                       const void *const *k_rows, float *s, size_t lds, pa_prefetch *prefetch) {
#define QK_BLOCK(keys, k, j, valid, pending) \
  qk_block(rows, keys, d, q, ldq, k, s + (j), lds, valid, pending)
  PA512_QK_KEY_BLOCKS(rows, n, k_rows, lds, prefetch, QK_BLOCK);
#undef QK_BLOCK
}

/* S = Q K^T (see pa_qk_fn) with Q as pa_load_q_split_* writes it. */
static void pa_qk_split_bf16_avx512(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                                    const void *const *k_rows, float *s, size_t lds,
                                    pa_prefetch *prefetch) {
  const float *q = q_rows;
#define QK_GROUP(rows, i) \
  qk_rows(rows, n, width, q + (i)*ldq, ldq, k_rows, s + (i)*lds, lds, prefetch)
  PA_WITH_HEAD_SIZE(d, width, PA_ROW_GROUPS(prefetch, m, n, QK_GROUP));
#undef QK_GROUP
}

/* acc (rows x groups, each an even and an odd vector) += P V over n keys,
 * one prefetch step per 8 keys as the in-order kernels take them. */
PA_INLINE void pv_keys(const int rows, const int groups, size_t n, size_t c0, size_t d,
                       const float *p, size_t ldp, const void *const *v_rows, __m512 *acc,
                       pa_prefetch *prefetch) {
  for (size_t j = 0; j < n; j++) {
    if (j % 8 == 0) pa_prefetch_step(prefetch, j + 8);
    __m512 v_even[4], v_odd[4];
    for (int g = 0; g < groups; g++) {
      __m512i pairs = load_pairs(v_rows[j], c0 + 32 * (size_t)g, d);
      v_even[g] = pa512_pair_even(pairs);
      v_odd[g] = pa512_pair_odd(pairs);
    }
    for (int r = 0; r < rows; r++) {
      __m512 weight = _mm512_set1_ps(p[r * ldp + j]);
      for (int g = 0; g < groups; g++) {
        __m512 *a = acc + 2 * (r * groups + g);
        a[0] = _mm512_fmadd_ps(weight, v_even[g], a[0]);
        a[1] = _mm512_fmadd_ps(weight, v_odd[g], a[1]);
      }
    }
  }
}

/* O[0..rows)[c0 .. c0 + 32 groups) += P V over n keys; with `kept`, whole
 * groups of O stay in the accumulators' order (even columns, then odd)
 * from one call to the next (pa_attn_ops.o_to_columns). */
PA_INLINE void pv_block(const int rows, const int groups, const int kept, size_t n, size_t c0,
                        size_t d, const float *p, size_t ldp, const void *const *v_rows, float *o,
                        size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  __mmask16 lo_mask[4], hi_mask[4];
  __m512 acc[16];
  for (int g = 0; g < groups; g++) {
    size_t col = c0 + 32 * (size_t)g;
    lo_mask[g] = col < d ? pa512_tail_mask(d - col) : 0;
    hi_mask[g] = col + 16 < d ? pa512_tail_mask(d - col - 16) : 0;
    for (int r = 0; r < rows; r++) {
      const float *at = o + r * ldo + col;
      __m512 scale = pa512_row_scale(rescale, r), *a = &acc[2 * (r * groups + g)];
      if (kept && col + 32 <= d) {
        a[0] = pa512_scaled(_mm512_loadu_ps(at), scale);
        a[1] = pa512_scaled(_mm512_loadu_ps(at + 16), scale);
        continue;
      }
      __m512 lo = pa512_scaled(_mm512_maskz_loadu_ps(lo_mask[g], at), scale);
      __m512 hi = pa512_scaled(_mm512_maskz_loadu_ps(hi_mask[g], at + 16), scale);
      split_group(lo, hi, &a[0], &a[1]);
    }
  }
  pv_keys(rows, groups, n, c0, d, p, ldp, v_rows, acc, prefetch);
  for (int g = 0; g < groups; g++) {
    size_t col = c0 + 32 * (size_t)g;
    for (int r = 0; r < rows; r++) {
      float *at = o + r * ldo + col;
      const __m512 *a = &acc[2 * (r * groups + g)];
      if (kept && col + 32 <= d) {
        _mm512_storeu_ps(at, a[0]);
        _mm512_storeu_ps(at + 16, a[1]);
        continue;
      }
      __m512 lo, hi;
      join_group(a[0], a[1], &lo, &hi);
      _mm512_mask_storeu_ps(at, lo_mask[g], lo);
      _mm512_mask_storeu_ps(at + 16, hi_mask[g], hi);
    }
  }
}

/* O's whole 32-column groups through split_group or join_group: from column
 * order into pv_block's (even columns, then odd), or back. */
PA_INLINE void reorder_groups(float *o, size_t d,
                              void (*move)(__m512, __m512, __m512 *, __m512 *)) {
  for (size_t col = 0; col + 32 <= d; col += 32) {
    __m512 first, second;
    move(_mm512_loadu_ps(o + col), _mm512_loadu_ps(o + col + 16), &first, &second);
    _mm512_storeu_ps(o + col, first);
    _mm512_storeu_ps(o + col + 16, second);
  }
}

static void pa_o_to_columns_split_avx512(float *o, size_t d) { reorder_groups(o, d, join_group); }

static void pa_o_from_columns_split_avx512(float *o, size_t d) {
  reorder_groups(o, d, split_group);
}

/* One group of `rows` rows (1-4) over every column of O, in blocks of up to
 * `width` 32-column groups, a block no wider than the columns left need
 * (rounded up to a power of two). */
PA_INLINE void pv_rows(const int rows, const int width, const int kept, size_t i, size_t m,
                       size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,
                       float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  for (size_t c0 = 0; c0 < d; c0 += 32 * (size_t)width) {
    size_t left = (d - c0 + 31) / 32;
    pa_prefetch_span(prefetch, i * d + (size_t)rows * c0,
                     (size_t)rows * PA_MIN(d - c0, 32 * (size_t)width), m * d, n);
    const float *r = pa_rescale_from(rescale, i);
#define PV_BLOCK(groups) \
  pv_block(rows, groups, kept, n, c0, d, p + i * ldp, ldp, v_rows, o + i * ldo, ldo, r, prefetch)
    if (left > 2 && width >= 4) {
      PV_BLOCK(4);
    } else if (left > 1) {
      PV_BLOCK(2);
    } else {
      PV_BLOCK(1);
    }
#undef PV_BLOCK
  }
}

/* O = O * rescale + P V (see pa_pv_fn) over a bf16 cache: rows in groups
 * of 4, then one of 3, 2 or 1; 3 or 4 rows take blocks of 64 columns, 1 or
 * 2 rows of 128 (16 accumulators at most). */
PA_INLINE void pv_split(const int kept, size_t m, size_t n, size_t d, const float *p, size_t ldp,
                        const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                        pa_prefetch *prefetch) {
#define PV_GROUP(rows, i) \
  pv_rows(rows, (rows) >= 3 ? 2 : 4, kept, i, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch)
  PA_ROW_GROUPS_OF_4(m, PV_GROUP);
#undef PV_GROUP
}

/* O in column order (the f32 path's pv[] entry). */
static void pa_pv_split_bf16_avx512(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                                    const void *const *v_rows, float *o, size_t ldo,
                                    const float *rescale, pa_prefetch *prefetch) {
  pv_split(0, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);
}

/* O's whole groups in the accumulators' order (the pairs' pa_attn_ops). */
static void pa_pv_split_kept_bf16_avx512(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                                         const void *const *v_rows, float *o, size_t ldo,
                                         const float *rescale, pa_prefetch *prefetch) {
  pv_split(1, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);
}

/* bf16 caches of every activation dtype on the f32 path: these direct
 * kernels with split Q; the packed (prefill) kernels keep Q in order. */
void pa_attn_split_kernels_avx512(pa_kernels *k) {
  static const pa_load_row_fn load_q[PA_NUM_ACT_DTYPES] = {
      [PA_F32] = pa_load_q_split_f32_avx512,
      [PA_F16] = pa_load_q_split_f16_avx512,
      [PA_BF16] = pa_load_q_split_bf16_avx512,
  };
  k->pv[PA_BF16] = pa_pv_split_bf16_avx512;
  for (int act = 0; act < PA_NUM_ACT_DTYPES; act++) {
    pa_attn_ops *ops = &k->attn[act][PA_BF16];
    ops->load_q = load_q[act];
    ops->load_q_packed = k->load_row[act];
    ops->q_size = sizeof(float);
    ops->scale_scores = 0;
    ops->qk = pa_qk_split_bf16_avx512;
    ops->pv = pa_pv_split_kept_bf16_avx512;
    ops->o_to_columns = pa_o_to_columns_split_avx512;
    ops->o_from_columns = pa_o_from_columns_split_avx512;
  }
}
