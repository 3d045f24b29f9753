/* Attention micro-kernels with AVX512-BF16 dot products (vdpbf16ps), for
 * bf16 activations over bf16 and FP8 caches: those values are exactly bf16,
 * so Q K^T loses nothing (exact products, f32 sums) and half the
 * instructions of the f32 path go away. P is rounded to bf16 for the P V
 * product, as FlashAttention does on GPUs.
 *
 * Q stays raw bf16 (the score factor is applied in the softmax). For P V,
 * two keys' V rows are interleaved word by word (vpunpck{l,h}wd), which
 * leaves the output columns permuted within each 32-column chunk; O is
 * permuted on load and back on store, once per call. */
#include <pthread.h>
#include <string.h>

#include "avx512-common.h"
#include "codecs.h"
#include "kernels.h"
#include "prefetch.h"

/* FP8 magnitudes (7 bits) as bf16 bits: four 32-entry tables per format. */
static uint16_t pa_e4m3_bf16[128], pa_e5m2_bf16[128];
static pthread_once_t pa_tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
  for (int m = 0; m < 128; m++) {
    pa_e4m3_bf16[m] = pa_f32_to_bf16(pa_e4m3_to_f32((uint8_t)m));
    pa_e5m2_bf16[m] = pa_f32_to_bf16(pa_e5m2_to_f32((uint8_t)m));
  }
}

typedef struct pa_bf16_tables {
  __m512i part[4];
} pa_bf16_tables;

PA_INLINE pa_bf16_tables load_tables(const uint16_t *table) {
  pa_bf16_tables t;
  for (int i = 0; i < 4; i++) t.part[i] = _mm512_loadu_si512(table + 32 * i);
  return t;
}

PA_INLINE __mmask32 tail_mask32(size_t count) {
  return count >= 32 ? 0xffffffffu : (__mmask32)((1u << count) - 1u);
}

/* 32 elements as bf16. Plain loads for full vectors (a masked load that
 * misses the cache is slow here). */
PA_INLINE __m512i load_bf16x32(const void *p, __mmask32 m, const pa_bf16_tables *t) {
  (void)t;
  return m == 0xffffffffu ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(m, p);
}

PA_INLINE __m512i load_fp8x32(const void *p, __mmask32 m, const pa_bf16_tables *t) {
  __m256i bytes = m == 0xffffffffu ? _mm256_loadu_si256(p) : _mm256_maskz_loadu_epi8(m, p);
  __m512i w = _mm512_cvtepu8_epi16(bytes);
  __m512i low = _mm512_permutex2var_epi16(t->part[0], w, t->part[1]);  /* magnitudes 0..63 */
  __m512i high = _mm512_permutex2var_epi16(t->part[2], w, t->part[3]); /* 64..127 */
  __mmask32 upper = _mm512_test_epi16_mask(w, _mm512_set1_epi16(0x40));
  __m512i magnitude = _mm512_mask_blend_epi16(upper, low, high);
  __m512i sign = _mm512_slli_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0x80)), 8);
  return _mm512_or_si512(magnitude, sign);
}

typedef __m512i (*pa_bf16_loader)(const void *, __mmask32, const pa_bf16_tables *);

PA_INLINE __m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

PA_INLINE void qk_block(const int rows, const int keys, pa_bf16_loader load, size_t elem,
                        const pa_bf16_tables *tables, size_t d, const uint16_t *q, size_t ldq,
                        const void *const *k, float *s, size_t lds, size_t keys_valid) {
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  for (size_t c = 0; c < d; c += 32) {
    __mmask32 m = tail_mask32(d - c);
    __m512i qv[4];
    for (int r = 0; r < rows; r++) qv[r] = load_bf16x32(q + r * ldq + c, m, tables);
    for (int j = 0; j < keys; j++) {
      __m512i kv = load((const char *)k[j] + c * elem, m, tables);
      for (int r = 0; r < rows; r++) acc[r * keys + j] = dot(acc[r * keys + j], qv[r], kv);
    }
  }
  float sums[16];
  _mm512_storeu_ps(sums, pa512_reduce16(acc));
  for (int r = 0; r < rows; r++) {
    for (size_t j = 0; j < keys_valid; j++) s[r * lds + j] = sums[r * keys + (int)j];
  }
}

PA_INLINE void qk_rows(const int rows, pa_bf16_loader load, size_t elem,
                       const pa_bf16_tables *tables, size_t n, size_t d, const uint16_t *q,
                       size_t ldq, const void *const *k_rows, float *s, size_t lds,
                       const pa_prefetch *prefetch) {
  const int keys = 16 / rows;
  for (size_t j = 0; j < n; j += (size_t)keys) {
    size_t valid = n - j < (size_t)keys ? n - j : (size_t)keys;
    pa_prefetch_step(prefetch, j, (size_t)keys, n);
    const void *k[16];
    for (int t = 0; t < keys; t++) k[t] = k_rows[j + ((size_t)t < valid ? (size_t)t : valid - 1)];
    qk_block(rows, keys, load, elem, tables, d, q, ldq, k, s + j, lds, valid);
  }
}

PA_INLINE void qk(pa_bf16_loader load, size_t elem, const uint16_t *table, size_t m, size_t n,
                  size_t d, const uint16_t *q, size_t ldq, const void *const *k_rows, float *s,
                  size_t lds, const pa_prefetch *prefetch) {
  pa_bf16_tables tables = table ? load_tables(table) : (pa_bf16_tables){0};
  size_t i = 0;
  for (; i + 4 <= m; i += 4) {
    qk_rows(4, load, elem, &tables, n, d, q + i * ldq, ldq, k_rows, s + i * lds, lds,
            i == 0 ? prefetch : NULL);
  }
  for (; i + 2 <= m; i += 2) {
    qk_rows(2, load, elem, &tables, n, d, q + i * ldq, ldq, k_rows, s + i * lds, lds,
            i == 0 ? prefetch : NULL);
  }
  for (; i < m; i++) {
    qk_rows(1, load, elem, &tables, n, d, q + i * ldq, ldq, k_rows, s + i * lds, lds,
            i == 0 ? prefetch : NULL);
  }
}

/* Where the 32 columns of a chunk sit in the (low, high) accumulators after
 * the word interleave: low holds columns 0-3, 8-11, 16-19, 24-27. */
static const int32_t pa_to_low[16] = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
static const int32_t pa_to_high[16] = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
static const int32_t pa_from_0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
static const int32_t pa_from_1[16] = {8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};

enum { PA_PAIR_KEYS = 64 }; /* keys per P conversion */

/* O[0..rows)[c0 .. c0 + 32 chunks) += P V over n <= 64 keys whose P rows
 * are already bf16 pairs. */
PA_INLINE void pv_block(const int rows, const int chunks, pa_bf16_loader load, size_t elem,
                        const pa_bf16_tables *tables, size_t n, size_t c0, size_t d,
                        const uint32_t (*pairs)[PA_PAIR_KEYS / 2], const void *const *v_rows,
                        float *o, size_t ldo, const float *rescale, const pa_prefetch *prefetch,
                        size_t prefetch_step, size_t prefetch_steps) {
  const __m512i to_low = _mm512_loadu_si512(pa_to_low), to_high = _mm512_loadu_si512(pa_to_high);
  __mmask32 mask[4];
  __m512 low[4][4], high[4][4];
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 32 * (size_t)c;
    size_t left = col < d ? d - col : 0;
    mask[c] = tail_mask32(left);
    __mmask16 m0 = pa512_tail_mask(left), m1 = pa512_tail_mask(left > 16 ? left - 16 : 0);
    for (int r = 0; r < rows; r++) {
      __m512 scale = pa512_row_scale(rescale, r);
      __m512 o0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, o + r * ldo + col), scale);
      __m512 o1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, o + r * ldo + col + 16), scale);
      low[r][c] = _mm512_permutex2var_ps(o0, to_low, o1);
      high[r][c] = _mm512_permutex2var_ps(o0, to_high, o1);
    }
  }
  for (size_t j = 0; j < n; j += 2) {
    pa_prefetch_step(prefetch, prefetch_step + j, 2, prefetch_steps);
    const char *va = (const char *)v_rows[j] + c0 * elem;
    const char *vb = j + 1 < n ? (const char *)v_rows[j + 1] + c0 * elem : NULL;
    __m512i lo_v[4], hi_v[4];
    for (int c = 0; c < chunks; c++) {
      __m512i a = load(va + 32 * (size_t)c * elem, mask[c], tables);
      __m512i b = vb ? load(vb + 32 * (size_t)c * elem, mask[c], tables) : _mm512_setzero_si512();
      lo_v[c] = _mm512_unpacklo_epi16(a, b);
      hi_v[c] = _mm512_unpackhi_epi16(a, b);
    }
    for (int r = 0; r < rows; r++) {
      __m512i weights = _mm512_set1_epi32((int)pairs[r][j / 2]);
      for (int c = 0; c < chunks; c++) {
        low[r][c] = dot(low[r][c], weights, lo_v[c]);
        high[r][c] = dot(high[r][c], weights, hi_v[c]);
      }
    }
  }
  const __m512i from_0 = _mm512_loadu_si512(pa_from_0), from_1 = _mm512_loadu_si512(pa_from_1);
  for (int c = 0; c < chunks; c++) {
    size_t col = c0 + 32 * (size_t)c;
    size_t left = col < d ? d - col : 0;
    __mmask16 m0 = pa512_tail_mask(left), m1 = pa512_tail_mask(left > 16 ? left - 16 : 0);
    for (int r = 0; r < rows; r++) {
      _mm512_mask_storeu_ps(o + r * ldo + col, m0,
                            _mm512_permutex2var_ps(low[r][c], from_0, high[r][c]));
      _mm512_mask_storeu_ps(o + r * ldo + col + 16, m1,
                            _mm512_permutex2var_ps(low[r][c], from_1, high[r][c]));
    }
  }
}

/* P rows [0, rows) for keys [0, n), n <= 64, as bf16 pairs (zero-padded). */
PA_INLINE void pack_pairs(int rows, size_t n, const float *p, size_t ldp,
                          uint32_t (*pairs)[PA_PAIR_KEYS / 2]) {
  for (int r = 0; r < rows; r++) {
    for (size_t j = 0; j < PA_PAIR_KEYS; j += 32) {
      size_t left = j < n ? n - j : 0;
      __m512 a = _mm512_maskz_loadu_ps(pa512_tail_mask(left), p + r * ldp + j);
      __m512 b =
          _mm512_maskz_loadu_ps(pa512_tail_mask(left > 16 ? left - 16 : 0), p + r * ldp + j + 16);
      _mm512_storeu_si512(&pairs[r][j / 2], (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
}

PA_INLINE void pv(pa_bf16_loader load, size_t elem, const uint16_t *table, size_t m, size_t n,
                  size_t d, const float *p, size_t ldp, const void *const *v_rows, float *o,
                  size_t ldo, const float *rescale, const pa_prefetch *prefetch) {
  pa_bf16_tables tables = table ? load_tables(table) : (pa_bf16_tables){0};
  uint32_t pairs[4][PA_PAIR_KEYS / 2];
  for (size_t j0 = 0; j0 < n; j0 += PA_PAIR_KEYS) {
    size_t count = n - j0 < PA_PAIR_KEYS ? n - j0 : PA_PAIR_KEYS;
    const void *const *v = v_rows + j0;
    size_t i = 0;
    for (; i + 4 <= m; i += 4) {
      pack_pairs(4, count, p + i * ldp + j0, ldp, pairs);
      for (size_t c0 = 0; c0 < d; c0 += 64) {
        pv_block(4, 2, load, elem, &tables, count, c0, d, pairs, v, o + i * ldo, ldo,
                 pa_rescale_from(rescale, i), i == 0 && c0 == 0 ? prefetch : NULL, j0, n);
      }
    }
    for (; i + 2 <= m; i += 2) {
      pack_pairs(2, count, p + i * ldp + j0, ldp, pairs);
      for (size_t c0 = 0; c0 < d; c0 += 128) {
        pv_block(2, 4, load, elem, &tables, count, c0, d, pairs, v, o + i * ldo, ldo,
                 pa_rescale_from(rescale, i), i == 0 && c0 == 0 ? prefetch : NULL, j0, n);
      }
    }
    for (; i < m; i++) {
      pack_pairs(1, count, p + i * ldp + j0, ldp, pairs);
      for (size_t c0 = 0; c0 < d; c0 += 128) {
        pv_block(1, 4, load, elem, &tables, count, c0, d, pairs, v, o + i * ldo, ldo,
                 pa_rescale_from(rescale, i), i == 0 && c0 == 0 ? prefetch : NULL, j0, n);
      }
    }
  }
}

#define PA_DEFINE_QK_PV(suffix, loader, elem, table)                                             \
  static void qk_##suffix(size_t m, size_t n, size_t d, const void *q, size_t ldq,               \
                          const void *const *k_rows, float *s, size_t lds,                       \
                          const pa_prefetch *prefetch) {                                         \
    qk(loader, elem, table, m, n, d, q, ldq, k_rows, s, lds, prefetch);                          \
  }                                                                                              \
  static void pv_##suffix(size_t m, size_t n, size_t d, const float *p, size_t ldp,              \
                          const void *const *v_rows, float *o, size_t ldo, const float *rescale, \
                          const pa_prefetch *prefetch) {                                         \
    pv(loader, elem, table, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                 \
  }

PA_DEFINE_QK_PV(bf16, load_bf16x32, 2, NULL)
PA_DEFINE_QK_PV(e4m3, load_fp8x32, 1, pa_e4m3_bf16)
PA_DEFINE_QK_PV(e5m2, load_fp8x32, 1, pa_e5m2_bf16)

/* ------------------------------------------------------------------------ */
/* Packed tiles (prefill): bf16 pair layouts of kernels.h                   */
/* ------------------------------------------------------------------------ */

/* K^T as pairs: each K row is d/2 pairs; transposing the (keys x pairs)
 * matrix of 32-bit elements puts 16 keys' pair e next to each other. */
PA_INLINE void pack_k_pairs(pa_bf16_loader load, size_t elem, const uint16_t *table, void *dst,
                            const void *const *rows, size_t n, size_t d) {
  pa_bf16_tables tables = table ? load_tables(table) : (pa_bf16_tables){0};
  uint32_t *kt = dst;
  size_t pairs = (d + 1) / 2;
  for (size_t j0 = 0; j0 < PA_PACK_KEYS; j0 += 16) {
    for (size_t e0 = 0; e0 < d; e0 += 32) {
      __mmask32 m = tail_mask32(d - e0);
      __m512 block[16];
      for (size_t j = 0; j < 16; j++) {
        block[j] =
            j0 + j < n
                ? _mm512_castsi512_ps(load((const char *)rows[j0 + j] + e0 * elem, m, &tables))
                : _mm512_setzero_ps();
      }
      pa512_transpose16(block);
      for (size_t p = 0; p < 16 && e0 / 2 + p < pairs; p++) {
        _mm512_storeu_ps((float *)kt + (e0 / 2 + p) * PA_PACK_KEYS + j0, block[p]);
      }
    }
  }
}

/* V as pairs of keys: word 2k of a pair vector is v_j[c + k], word 2k + 1
 * is v_{j+1}[c + k], in column order. */
static const int16_t pa_interleave_low[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                              37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                              11, 43, 12, 44, 13, 45, 14, 46, 15, 47};

PA_INLINE void pack_v_pairs(pa_bf16_loader load, size_t elem, const uint16_t *table, void *dst,
                            const void *const *rows, size_t n, size_t d) {
  pa_bf16_tables tables = table ? load_tables(table) : (pa_bf16_tables){0};
  uint32_t *v = dst;
  size_t ldv = (d + 15) / 16 * 16;
  const __m512i low = _mm512_loadu_si512(pa_interleave_low);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (size_t j = 0; j < n; j += 2) {
    for (size_t e = 0; e < d; e += 32) {
      __mmask32 m = tail_mask32(d - e);
      __m512i a = load((const char *)rows[j] + e * elem, m, &tables);
      __m512i b = j + 1 < n ? load((const char *)rows[j + 1] + e * elem, m, &tables)
                            : _mm512_setzero_si512();
      uint32_t *out = v + (j / 2) * ldv + e;
      _mm512_storeu_si512(out, _mm512_permutex2var_epi16(a, low, b));
      if (e + 16 < ldv) _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi16(a, high, b));
    }
  }
}

#define PA_DEFINE_PACK(suffix, loader, elem, table)                                     \
  static void pack_k_##suffix(void *dst, const void *const *rows, size_t n, size_t d) { \
    pack_k_pairs(loader, elem, table, dst, rows, n, d);                                 \
  }                                                                                     \
  static void pack_v_##suffix(void *dst, const void *const *rows, size_t n, size_t d) { \
    pack_v_pairs(loader, elem, table, dst, rows, n, d);                                 \
  }

PA_DEFINE_PACK(bf16, load_bf16x32, 2, NULL)
PA_DEFINE_PACK(e4m3, load_fp8x32, 1, pa_e4m3_bf16)
PA_DEFINE_PACK(e5m2, load_fp8x32, 1, pa_e5m2_bf16)

/* Two adjacent bf16 as one 32-bit pair (memcpy: no aliasing or alignment
 * assumption; it compiles to the broadcast's memory operand). */
PA_INLINE uint32_t pair_at(const uint16_t *p) {
  uint32_t pair;
  memcpy(&pair, p, sizeof pair);
  return pair;
}

/* rows x 64 scores over the pairs [0, pairs) of Q's rows (element stride
 * ldq): one broadcast of row r's pair e, four K^T loads per step. */
PA_INLINE void qk_packed_pairs(const int rows, size_t pairs, const uint16_t *q, size_t ldq,
                               const uint32_t *kt, __m512 acc[6][4]) {
  for (size_t e = 0; e < pairs; e++) {
    const uint32_t *k = kt + e * PA_PACK_KEYS;
    __m512i k0 = _mm512_loadu_si512(k), k1 = _mm512_loadu_si512(k + 16);
    __m512i k2 = _mm512_loadu_si512(k + 32), k3 = _mm512_loadu_si512(k + 48);
    for (int r = 0; r < rows; r++) {
      __m512i b = _mm512_set1_epi32((int)pair_at(q + r * ldq + 2 * e));
      acc[r][0] = dot(acc[r][0], b, k0);
      acc[r][1] = dot(acc[r][1], b, k1);
      acc[r][2] = dot(acc[r][2], b, k2);
      acc[r][3] = dot(acc[r][3], b, k3);
    }
  }
}

PA_INLINE void qk_packed_block(const int rows, size_t d, const uint16_t *q, size_t ldq,
                               const uint32_t *kt, float *s, size_t lds) {
  __m512 acc[6][4];
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
  }
  qk_packed_pairs(rows, d / 2, q, ldq, kt, acc);
  if (d % 2) { /* an odd row's last element pairs with zero, not with what follows */
    uint16_t last[6][2];
    for (int r = 0; r < rows; r++) {
      last[r][0] = q[r * ldq + d - 1];
      last[r][1] = 0;
    }
    qk_packed_pairs(rows, 1, &last[0][0], 2, kt + (d / 2) * PA_PACK_KEYS, acc);
  }
  for (int r = 0; r < rows; r++) {
    for (int c = 0; c < 4; c++) _mm512_storeu_ps(s + r * lds + 16 * c, acc[r][c]);
  }
}

static void qk_packed(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                      const void *k_packed, float *s, size_t lds) {
  const uint16_t *q = q_rows;
  const uint32_t *kt = k_packed;
  (void)n;
  size_t i = 0;
  for (; i + 6 <= m; i += 6) qk_packed_block(6, d, q + i * ldq, ldq, kt, s + i * lds, lds);
  for (; i + 4 <= m; i += 4) qk_packed_block(4, d, q + i * ldq, ldq, kt, s + i * lds, lds);
  for (; i + 2 <= m; i += 2) qk_packed_block(2, d, q + i * ldq, ldq, kt, s + i * lds, lds);
  for (; i < m; i++) qk_packed_block(1, d, q + i * ldq, ldq, kt, s + i * lds, lds);
}

PA_INLINE void pv_packed_block(const int rows, size_t n, size_t c0, size_t d,
                               const uint32_t (*pairs)[PA_PAIR_KEYS / 2], const uint32_t *v,
                               size_t ldv, float *o, size_t ldo, const float *rescale) {
  __mmask16 mask[4];
  __m512 acc[6][4];
  for (int c = 0; c < 4; c++) {
    size_t col = c0 + 16 * (size_t)c;
    mask[c] = col < d ? pa512_tail_mask(d - col) : 0;
    for (int r = 0; r < rows; r++)
      acc[r][c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[c], o + r * ldo + col),
                                pa512_row_scale(rescale, r));
  }
  for (size_t j = 0; j < n; j += 2) {
    const uint32_t *vj = v + (j / 2) * ldv + c0;
    __m512i v0 = _mm512_maskz_loadu_epi32(mask[0], vj),
            v1 = _mm512_maskz_loadu_epi32(mask[1], vj + 16);
    __m512i v2 = _mm512_maskz_loadu_epi32(mask[2], vj + 32),
            v3 = _mm512_maskz_loadu_epi32(mask[3], vj + 48);
    for (int r = 0; r < rows; r++) {
      __m512i b = _mm512_set1_epi32((int)pairs[r][j / 2]);
      acc[r][0] = dot(acc[r][0], b, v0);
      acc[r][1] = dot(acc[r][1], b, v1);
      acc[r][2] = dot(acc[r][2], b, v2);
      acc[r][3] = dot(acc[r][3], b, v3);
    }
  }
  for (int c = 0; c < 4; c++) {
    size_t col = c0 + 16 * (size_t)c;
    for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(o + r * ldo + col, mask[c], acc[r][c]);
  }
}

PA_INLINE void pv_packed_rows(const int rows, size_t n, size_t d, const float *p, size_t ldp,
                              const uint32_t *v, size_t ldv, float *o, size_t ldo,
                              const float *rescale) {
  uint32_t pairs[6][PA_PAIR_KEYS / 2];
  pack_pairs(rows, n, p, ldp, pairs);
  for (size_t c0 = 0; c0 < d; c0 += 64)
    pv_packed_block(rows, n, c0, d, pairs, v, ldv, o, ldo, rescale);
}

static void pv_packed(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                      const void *v_packed, float *o, size_t ldo, const float *rescale) {
  const uint32_t *v = v_packed;
  size_t ldv = (d + 15) / 16 * 16;
  size_t i = 0;
  for (; i + 6 <= m; i += 6)
    pv_packed_rows(6, n, d, p + i * ldp, ldp, v, ldv, o + i * ldo, ldo,
                   pa_rescale_from(rescale, i));
  for (; i + 4 <= m; i += 4)
    pv_packed_rows(4, n, d, p + i * ldp, ldp, v, ldv, o + i * ldo, ldo,
                   pa_rescale_from(rescale, i));
  for (; i + 2 <= m; i += 2)
    pv_packed_rows(2, n, d, p + i * ldp, ldp, v, ldv, o + i * ldo, ldo,
                   pa_rescale_from(rescale, i));
  for (; i < m; i++)
    pv_packed_rows(1, n, d, p + i * ldp, ldp, v, ldv, o + i * ldo, ldo,
                   pa_rescale_from(rescale, i));
}

/* Q is used as stored: the score factor goes to the softmax. */
static void load_q_raw(void *dst, const void *src, size_t n, float factor) {
  (void)factor;
  memcpy(dst, src, n * sizeof(uint16_t));
}

void pa_attn_kernels_avx512bf16(pa_kernels *k) {
  pthread_once(&pa_tables_once, build_tables);
  k->attn[PA_BF16][PA_BF16] = (pa_attn_ops){load_q_raw,  2,           1,         qk_bf16,  pv_bf16,
                                            pack_k_bf16, pack_v_bf16, qk_packed, pv_packed};
  k->attn[PA_BF16][PA_FP8_E4M3] = (pa_attn_ops){
      load_q_raw, 2, 1, qk_e4m3, pv_e4m3, pack_k_e4m3, pack_v_e4m3, qk_packed, pv_packed};
  k->attn[PA_BF16][PA_FP8_E5M2] = (pa_attn_ops){
      load_q_raw, 2, 1, qk_e5m2, pv_e5m2, pack_k_e5m2, pack_v_e5m2, qk_packed, pv_packed};
}
