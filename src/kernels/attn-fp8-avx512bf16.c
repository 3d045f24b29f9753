/* Decode micro-kernels for FP8 caches under bf16 activations: vdpbf16ps on
 * FP8 values turned into bf16 (exactly) 64 at a time.
 *
 * The conversion is two byte-table lookups (vpermi2b: the low and the high
 * byte of each magnitude's bf16 code), the sign or-ed in, and a byte
 * interleave: five instructions for 64 values, where a word-table lookup
 * needs eight for 32. The interleave leaves the 64 values of a group in the
 * order {0-7, 16-23, 32-39, 48-55} then {8-15, ...}: Q is loaded in that
 * order (so the dot products match), and the P V accumulators hold the
 * columns in a 4 x 4 transpose of 128-bit blocks, undone when O is stored. */
#include <pthread.h>
#include <string.h>

#include "avx512bf16-common.h"
#include "prefetch.h"

/* Where value e of a 64-value group lands in that order. */
static size_t group_position(size_t e) {
  size_t lane = e / 16, within = e % 16;
  return within < 8 ? lane * 8 + within : 32 + lane * 8 + (within - 8);
}

/* pa_group_source[p]: the value of a group that lands at position p. */
static uint16_t pa_group_source[64];

static void group_tables(void) {
  for (size_t e = 0; e < 64; e++) pa_group_source[group_position(e)] = (uint16_t)e;
}

/* 64 words in their natural order stored in the group order. */
PA_INLINE void store_grouped(uint16_t *out, __m512i natural0, __m512i natural1) {
  const __m512i first = _mm512_loadu_si512(pa_group_source);
  const __m512i second = _mm512_loadu_si512(pa_group_source + 32);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi16(natural0, first, natural1));
  _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(natural0, second, natural1));
}

PA_INLINE size_t q_padded(size_t n) { return (n + 63) / 64 * 64; }

/* bf16 Q rows in the group order, zero-padded to a multiple of 64 (the
 * score factor goes to the softmax). */
static void pa_load_q_bf16_grouped_avx512bf16(void *dst, const void *src, size_t n, float factor) {
  (void)factor;
  uint16_t *out = dst;
  const uint16_t *in = src;
  for (size_t g = 0; g < n; g += 64) {
    __m512i a = _mm512_maskz_loadu_epi16(tail_mask32(n - g), in + g);
    __m512i b = _mm512_maskz_loadu_epi16(tail_mask32(n - g > 32 ? n - g - 32 : 0), in + g + 32);
    store_grouped(out + g, a, b);
  }
}

/* f16 Q for the bf16 dot products: each value split exactly into two bf16
 * parts (bf16_parts), the high parts in [0, padded), the rests in
 * [padded, 2 padded) of the row, both in the group order. Q K^T then takes
 * two dot products per K vector instead of an f32 FMA per converted value. */
static void pa_load_q_f16_split_avx512bf16(void *dst, const void *src, size_t n, float factor) {
  (void)factor;
  uint16_t *high_out = dst, *rest_out = (uint16_t *)dst + q_padded(n);
  const uint16_t *in = src;
  for (size_t g = 0; g < n; g += 64) {
    __m512i high[2], rest[2];
    for (int h = 0; h < 2; h++) {
      __m256i high16[2], rest16[2];
      for (int part = 0; part < 2; part++) {
        size_t at = g + 32 * (size_t)h + 16 * (size_t)part, left = at < n ? n - at : 0;
        __m512 q = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(pa512_tail_mask(left), in + at));
        bf16_parts(q, &high16[part], &rest16[part]);
      }
      high[h] = pa512_concat(high16[0], high16[1]);
      rest[h] = pa512_concat(rest16[0], rest16[1]);
    }
    store_grouped(high_out + g, high[0], high[1]);
    store_grouped(rest_out + g, rest[0], rest[1]);
  }
}

/* f16 Q as f32 for the packed (prefill) kernels of the same pair, whose
 * scores the softmax scales too. */
static void pa_load_q_f16_avx512bf16(void *dst, const void *src, size_t n, float factor) {
  (void)factor;
  float *out = dst;
  const uint16_t *in = src;
  for (size_t e = 0; e < n; e += 16) {
    __mmask16 m = pa512_tail_mask(n - e);
    _mm512_mask_storeu_ps(out + e, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, in + e)));
  }
}

/* With `split`, Q rows hold high parts then rests (pa_load_q_f16_split_avx512bf16) and are
 * 2 ldq words apart; every K vector meets both. */
PA_INLINE void qk_block(const int rows, const int keys, const int split, const pa_fp8_tables *t,
                        size_t d, const uint16_t *q, size_t ldq, const void *const *k, float *s,
                        size_t lds, size_t keys_valid, pa512_pending_block *pending) {
  const size_t row_stride = split ? 2 * ldq : ldq, rest = q_padded(d);
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  PA_FOR_CHUNKS(g, d, 64, "GCC unroll 4", {
    __mmask64 m = tail_mask64(d - g);
    if (keys <= 4) {
      /* Few keys: convert them all first, then load each Q chunk once for
       * all of them (registers: 16 sums, 8 keys' halves, 2 of Q). */
      __m512i first[4], second[4];
      for (int j = 0; j < keys; j++) {
        to_bf16x64(load64((const uint8_t *)k[j] + g, m), t, &first[j], &second[j]);
      }
      for (int r = 0; r < rows; r++) {
        for (int part = 0; part <= split; part++) {
          const uint16_t *qr = q + r * row_stride + (part ? rest : 0) + g;
          __m512i q0 = _mm512_loadu_si512(qr), q1 = _mm512_loadu_si512(qr + 32);
          for (int j = 0; j < keys; j++) {
            acc[r * keys + j] = dot(acc[r * keys + j], q0, first[j]);
            acc[r * keys + j] = dot(acc[r * keys + j], q1, second[j]);
          }
        }
      }
    } else {
      for (int j = 0; j < keys; j++) {
        __m512i first, second;
        to_bf16x64(load64((const uint8_t *)k[j] + g, m), t, &first, &second);
        for (int r = 0; r < rows; r++) {
          for (int part = 0; part <= split; part++) {
            const uint16_t *qr = q + r * row_stride + (part ? rest : 0) + g;
            acc[r * keys + j] = dot(acc[r * keys + j], _mm512_loadu_si512(qr), first);
            acc[r * keys + j] = dot(acc[r * keys + j], _mm512_loadu_si512(qr + 32), second);
          }
        }
      }
    }
    if (g == 0 && !split) pa512_finish_block(rows, pending, lds);
  });
  pa512_finish_block(rows, pending, lds);
  pa512_reduce16_begin(acc, pending, s, keys_valid);
  /* Split Q's doubled dot products leave no registers for a pending block. */
  if (split) pa512_finish_block(rows, pending, lds);
}

PA_INLINE void qk_rows(const int rows, const int split, const pa_fp8_tables *t, size_t n, size_t d,
                       const uint16_t *q, size_t ldq, const void *const *k_rows, float *s,
                       size_t lds, pa_prefetch *prefetch) {
#define QK_BLOCK(keys, k, j, valid, pending) \
  qk_block(rows, keys, split, t, d, q, ldq, k, s + (j), lds, valid, pending)
  PA512_QK_KEY_BLOCKS(rows, n, k_rows, lds, prefetch, QK_BLOCK);
#undef QK_BLOCK
}

PA_INLINE void qk(const pa_fp8_bytes *bytes, const int split, size_t m, size_t n, size_t d,
                  const uint16_t *q, size_t ldq, const void *const *k_rows, float *s, size_t lds,
                  pa_prefetch *prefetch) {
  pa_fp8_tables t = fp8_tables(bytes);
  const size_t row_stride = split ? 2 * ldq : ldq;
#define QK_GROUP(rows, i) \
  qk_rows(rows, split, &t, n, width, q + (i)*row_stride, ldq, k_rows, s + (i)*lds, lds, prefetch)
  /* Head size 128 compiled apart (see PA_WITH_HEAD_SIZE) for bf16 Q only:
   * every copy of these kernels adds seconds to a sanitizer build. */
  if (d == 128 && !split) {
    const size_t width = 128;
    PA_ROW_GROUPS(prefetch, m, n, QK_GROUP);
  } else {
    const size_t width = d;
    PA_ROW_GROUPS(prefetch, m, n, QK_GROUP);
  }
#undef QK_GROUP
}

/* Swaps 128-bit blocks (i, j) with (j, i) across four vectors: natural O
 * columns of a group <-> the P V accumulators' order (its own inverse). */
PA_INLINE void transpose_blocks(__m512 v[4]) {
  __m512 t0 = _mm512_shuffle_f32x4(v[0], v[1], 0x44), t1 = _mm512_shuffle_f32x4(v[0], v[1], 0xee);
  __m512 t2 = _mm512_shuffle_f32x4(v[2], v[3], 0x44), t3 = _mm512_shuffle_f32x4(v[2], v[3], 0xee);
  v[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
  v[1] = _mm512_shuffle_f32x4(t0, t2, 0xdd);
  v[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
  v[3] = _mm512_shuffle_f32x4(t1, t3, 0xdd);
}

/* O[0..rows)[g .. g + 64) += P V over n <= 64 keys (P already bf16 pairs;
 * with `split`, the pairs of P's rests follow, see pack_pairs_parts). */
PA_INLINE void pv_group(const int rows, const int split, const pa_fp8_tables *t, size_t n, size_t g,
                        size_t d, const uint32_t (*pairs)[PA_PAIR_KEYS / 2],
                        const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                        pa_prefetch *prefetch) {
  __mmask16 mask[4];
  __m512 acc[4][4];
  for (int c = 0; c < 4; c++) {
    size_t col = g + 16 * (size_t)c;
    mask[c] = col < d ? pa512_tail_mask(d - col) : 0;
  }
  /* A whole group of O stays in the accumulators' order from one call to
   * the next (pa_attn_ops.o_to_columns); one that d cuts short keeps
   * column order, so that its masked loads and stores stay within the row. */
  const int whole = g + 64 <= d;
  for (int r = 0; r < rows; r++) {
    __m512 scale = pa512_row_scale(rescale, r);
    for (int c = 0; c < 4; c++) {
      acc[r][c] = pa512_scaled(_mm512_maskz_loadu_ps(mask[c], o + r * ldo + g + 16 * c), scale);
    }
    if (!whole) transpose_blocks(acc[r]);
  }
  __mmask64 m = tail_mask64(d - g);
  for (size_t j = 0; j < n; j += 2) {
    if (j % 8 == 0) pa_prefetch_step(prefetch, j + 8); /* see pv_rows */
    /* Bytes interleaved before the lookups, which then give bf16 pairs
     * (V[j][e], V[j + 1][e]) directly, in the order described above. */
    __m512i a = load64((const uint8_t *)v_rows[j] + g, m);
    __m512i b = j + 1 < n ? load64((const uint8_t *)v_rows[j + 1] + g, m) : _mm512_setzero_si512();
    __m512i pair[4];
    to_bf16x64(_mm512_unpacklo_epi8(a, b), t, &pair[0], &pair[1]);
    to_bf16x64(_mm512_unpackhi_epi8(a, b), t, &pair[2], &pair[3]);
    for (int r = 0; r < rows; r++) {
      for (int part = 0; part <= split; part++) {
        __m512i weights = _mm512_set1_epi32((int)pairs[part * rows + r][j / 2]);
        for (int c = 0; c < 4; c++) acc[r][c] = dot(acc[r][c], weights, pair[c]);
      }
    }
  }
  for (int r = 0; r < rows; r++) {
    if (!whole) transpose_blocks(acc[r]);
    for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(o + r * ldo + g + 16 * c, mask[c], acc[r][c]);
  }
}

/* O's whole 64-column groups between pv_group's order and column order
 * (transpose_blocks is its own inverse: one function each way). */
static void pa_o_reorder_fp8_avx512bf16(float *o, size_t d) {
  for (size_t g = 0; g + 64 <= d; g += 64) {
    __m512 v[4];
    for (int c = 0; c < 4; c++) v[c] = _mm512_loadu_ps(o + g + 16 * c);
    transpose_blocks(v);
    for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + g + 16 * c, v[c]);
  }
}

/* The requests are issued every 8 keys of each group: FP8 decode is
 * compute-bound, and more frequent steps cost it (docs/code-figures.md,
 * P V request steps). */
PA_INLINE void pv_rows(const int rows, const int split, const pa_fp8_tables *t, size_t n, size_t d,
                       const float *p, size_t ldp, const void *const *v_rows, float *o, size_t ldo,
                       const float *rescale, pa_prefetch *prefetch, size_t work_done,
                       size_t work_total) {
  uint32_t pairs[8][PA_PAIR_KEYS / 2];
  pack_pairs_parts(split, rows, n, p, ldp, pairs);
  for (size_t g = 0; g < d; g += 64) {
    pa_prefetch_span(prefetch, work_done + n * (size_t)rows * g,
                     n * (size_t)rows * PA_MIN(d - g, 64), work_total, n);
    pv_group(rows, split, t, n, g, d, pairs, v_rows, o, ldo, rescale, prefetch);
  }
}

PA_INLINE void pv_sized(const pa_fp8_bytes *bytes, const int split, size_t m, size_t n, size_t d,
                        const float *p, size_t ldp, const void *const *v_rows, float *o, size_t ldo,
                        const float *rescale, pa_prefetch *prefetch) {
  pa_fp8_tables t = fp8_tables(bytes);
  /* The budget is spread over the key x row x column products. */
  for (size_t j0 = 0; j0 < n; j0 += PA_PAIR_KEYS) {
    size_t count = n - j0 < PA_PAIR_KEYS ? n - j0 : PA_PAIR_KEYS;
    const void *const *v = v_rows + j0;
    /* Only the first tile's correction applies: later ones find O rescaled. */
    const float *scales = j0 == 0 ? rescale : NULL;
    size_t i = 0;
    for (; i + 4 <= m; i += 4) {
      pv_rows(4, split, &t, count, d, p + i * ldp + j0, ldp, v, o + i * ldo, ldo,
              pa_rescale_from(scales, i), prefetch, (j0 * m + count * i) * d, n * m * d);
    }
    for (; i + 2 <= m; i += 2) {
      pv_rows(2, split, &t, count, d, p + i * ldp + j0, ldp, v, o + i * ldo, ldo,
              pa_rescale_from(scales, i), prefetch, (j0 * m + count * i) * d, n * m * d);
    }
    for (; i < m; i++) {
      pv_rows(1, split, &t, count, d, p + i * ldp + j0, ldp, v, o + i * ldo, ldo,
              pa_rescale_from(scales, i), prefetch, (j0 * m + count * i) * d, n * m * d);
    }
  }
}

PA_INLINE void pv(const pa_fp8_bytes *bytes, const int split, size_t m, size_t n, size_t d,
                  const float *p, size_t ldp, const void *const *v_rows, float *o, size_t ldo,
                  const float *rescale, pa_prefetch *prefetch) {
  if (d == 128 && !split) /* as in qk */
    pv_sized(bytes, split, m, n, 128, p, ldp, v_rows, o, ldo, rescale, prefetch);
  else
    pv_sized(bytes, split, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);
}

#define PA_DEFINE_QK_PV(suffix, bytes)                                                          \
  static void pa_qk_bf16_##suffix##_avx512bf16(size_t m, size_t n, size_t d, const void *q,     \
                                               size_t ldq, const void *const *k_rows, float *s, \
                                               size_t lds, pa_prefetch *prefetch) {             \
    qk(&(bytes), 0, m, n, d, q, ldq, k_rows, s, lds, prefetch);                                 \
  }                                                                                             \
  static void pa_qk_f16_##suffix##_avx512bf16(size_t m, size_t n, size_t d, const void *q,      \
                                              size_t ldq, const void *const *k_rows, float *s,  \
                                              size_t lds, pa_prefetch *prefetch) {              \
    qk(&(bytes), 1, m, n, d, q, ldq, k_rows, s, lds, prefetch);                                 \
  }                                                                                             \
  static void pa_pv_bf16_##suffix##_avx512bf16(                                                 \
      size_t m, size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,      \
      float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {                      \
    pv(&(bytes), 0, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                        \
  }                                                                                             \
  static void pa_pv_f16_##suffix##_avx512bf16(                                                  \
      size_t m, size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,      \
      float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {                      \
    pv(&(bytes), 1, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                        \
  }

PA_DEFINE_QK_PV(e4m3, pa_e4m3_bytes)
PA_DEFINE_QK_PV(e5m2, pa_e5m2_bytes)

/* bf16 activations use Q as it is and P rounded to bf16; f16 activations
 * split both Q (exactly, see pa_load_q_f16_split_avx512bf16) and P (to 2^-17, see
 * pack_pairs_parts) in two bf16 parts, which doubles the dot products but
 * needs no f32 conversion of K and V. Their packed (prefill) kernels stay
 * the f32 ones. */
void pa_attn_fp8_kernels_avx512bf16(pa_kernels *k) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pa_bf16_tables_init();
  pthread_once(&once, group_tables);
  const pa_qk_fn qk_fns[2] = {pa_qk_bf16_e4m3_avx512bf16, pa_qk_bf16_e5m2_avx512bf16},
                 qk_split_fns[2] = {pa_qk_f16_e4m3_avx512bf16, pa_qk_f16_e5m2_avx512bf16};
  const pa_pv_fn pv_fns[2] = {pa_pv_bf16_e4m3_avx512bf16, pa_pv_bf16_e5m2_avx512bf16},
                 pv_split_fns[2] = {pa_pv_f16_e4m3_avx512bf16, pa_pv_f16_e5m2_avx512bf16};
  const pa_dtype caches[2] = {PA_FP8_E4M3, PA_FP8_E5M2};
  for (int i = 0; i < 2; i++) {
    pa_attn_ops *ops = &k->attn[PA_BF16][caches[i]];
    ops->load_q = pa_load_q_bf16_grouped_avx512bf16;
    ops->load_q_packed = pa_load_q_bf16; /* the packed kernels want Q as it is */
    ops->q_size = 2;
    ops->scale_scores = 1;
    ops->p_bf16 = 1;
    ops->qk = qk_fns[i];
    ops->pv = pv_fns[i];
    ops->o_to_columns = ops->o_from_columns = pa_o_reorder_fp8_avx512bf16;
    ops = &k->attn[PA_F16][caches[i]];
    ops->load_q = pa_load_q_f16_split_avx512bf16;
    ops->load_q_packed = pa_load_q_f16_avx512bf16;
    ops->q_size = 4; /* two bf16 parts per value; f32 for the packed kernels */
    ops->scale_scores = 1;
    ops->qk = qk_split_fns[i];
    ops->pv = pv_split_fns[i];
    ops->o_to_columns = ops->o_from_columns = pa_o_reorder_fp8_avx512bf16;
  }
}
