/* Decode micro-kernels for FP8 caches on the f32 FMA units, for the CPUs of
 * this family whose bf16 dot products are slower than their FMAs
 * (pa_bf16_dot_is_fast): Q and P in f32, as the f32 path of attn-avx512.c
 * takes them, with K and V decoded 64 values at a time.
 *
 * The decoding is two byte-table lookups (vpermi2b: the low and the high
 * byte of each magnitude's bf16 code), the sign or-ed in, and for each 16
 * values one more two-source byte permutation that puts their low and high
 * bytes in the upper half of 32-bit lanes and zeroes the lower half: an
 * f32, exactly, in the values' own order. Seven instructions for 64 values,
 * where widening through f16 (pa512_load_e4m3) takes about ten for 16; so
 * Q, P and O keep the plain order of the f32 kernels, and the blocks are
 * theirs (4 rows x 4 keys of dot products reduced by a transpose tree; O in
 * blocks of 64 or 128 columns), only walked 64 values at a time. */
#include <pthread.h>

#include "avx512bf16-common.h"
#include "prefetch.h"

typedef struct fp8_decoder {
  pa_fp8_tables codes;
  __m512i spread[4]; /* where the 16 values of each output vector come from */
} fp8_decoder;

/* Bytes 4i + 2 and 4i + 3 of every 32-bit lane: the code's low and high byte. */
#define PA_CODE_BYTES 0xccccccccccccccccull

/* The spreads' byte indices: value 16v + i's low byte (the first table) to
 * byte 4i + 2 of vector v, its high byte (the second) to 4i + 3; bytes 4i
 * and 4i + 1 are zeroed by the mask. Filled once, at registration. */
static uint8_t pa_fp8_spread[4][64];

static void spread_tables(void) {
  for (int v = 0; v < 4; v++) {
    for (int i = 0; i < 16; i++) {
      pa_fp8_spread[v][4 * i + 2] = (uint8_t)(16 * v + i);
      pa_fp8_spread[v][4 * i + 3] = (uint8_t)(64 + 16 * v + i);
    }
  }
}

PA_INLINE fp8_decoder decoder(const pa_fp8_bytes *b) {
  fp8_decoder t = {.codes = fp8_tables(b)};
  for (int v = 0; v < 4; v++) t.spread[v] = _mm512_loadu_si512(pa_fp8_spread[v]);
  return t;
}

/* The values [c, c + 16 vectors) of a row of d FP8 values as f32 vectors,
 * those at or past d as 0 (a masked byte load reads none of them). */
PA_INLINE void decode(const void *row, size_t c, size_t d, const fp8_decoder *t, const int vectors,
                      __m512 *out) {
  const char *at = (const char *)row + c;
  __m512i bytes =
      c + 64 <= d ? _mm512_loadu_si512(at) : _mm512_maskz_loadu_epi8(tail_mask64(d - c), at);
  __m512i low, high;
  fp8_code_bytes(bytes, &t->codes, &low, &high);
  for (int v = 0; v < vectors; v++) {
    out[v] =
        _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(PA_CODE_BYTES, low, t->spread[v], high));
  }
}

/* rows x keys = 16 dot products of f32 Q rows (stride ldq) with FP8 K rows
 * (k: `keys` pointers, padded by the caller); rows x `valid` of them stored,
 * the block before finished on the way (pa512_pending_block). Q's vectors
 * are the FMAs' memory operands: sixteen of them would not fit beside the
 * sums. */
PA_INLINE void qk_block(const int rows, const int keys, const fp8_decoder *t, size_t d,
                        const float *q, size_t ldq, const void *const *k, float *s, size_t lds,
                        size_t valid, pa512_pending_block *pending) {
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  PA_FOR_CHUNKS(c, d, 64, "GCC unroll 2", {
    for (int j = 0; j < keys; j++) {
      __m512 kv[4];
      decode(k[j], c, d, t, 4, kv);
      for (int r = 0; r < rows; r++) {
        for (int v = 0; v < 4; v++) {
          size_t e = c + 16 * (size_t)v;
          /* Q past d is stale scratch: masked, as K there is 0. */
          __m512 qv = e + 16 <= d ? _mm512_loadu_ps(q + r * ldq + e)
                                  : _mm512_maskz_loadu_ps(pa512_tail_mask(e < d ? d - e : 0),
                                                          q + r * ldq + e);
          acc[r * keys + j] = _mm512_fmadd_ps(qv, kv[v], acc[r * keys + j]);
        }
      }
    }
    if (c == 0) pa512_finish_block(rows, pending, lds);
  });
  pa512_finish_block(rows, pending, lds);
  pa512_reduce16_begin(acc, pending, s, valid);
}

PA_INLINE void qk_rows(const int rows, const fp8_decoder *t, size_t n, size_t d, const float *q,
                       size_t ldq, const void *const *k_rows, float *s, size_t lds,
                       pa_prefetch *prefetch) {
  const int keys = 16 / rows;
  pa512_pending_block pending = {.s = NULL};
  for (size_t j = 0; j < n; j += (size_t)keys) {
    pa_prefetch_step(prefetch, j + (size_t)keys);
    const void *k[16];
    size_t valid = pa_key_block(k_rows, j, keys, n, k);
    qk_block(rows, keys, t, d, q, ldq, k, s + j, lds, valid, &pending);
  }
  pa512_finish_block(rows, &pending, lds);
}

PA_INLINE void qk(const pa_fp8_bytes *bytes, size_t m, size_t n, size_t d, const void *q_rows,
                  size_t ldq, const void *const *k_rows, float *s, size_t lds,
                  pa_prefetch *prefetch) {
  const fp8_decoder t = decoder(bytes);
  const float *q = q_rows;
#define QK_GROUP(rows, i) \
  qk_rows(rows, &t, n, width, q + (i)*ldq, ldq, k_rows, s + (i)*lds, lds, prefetch)
  PA_WITH_HEAD_SIZE(d, width, PA_ROW_GROUPS(prefetch, m, n, QK_GROUP));
#undef QK_GROUP
}

/* O[0..rows)[c0 .. c0 + 16 vectors) = O * rescale + P V over n keys, c0 a
 * multiple of 64; each V row decoded once per block. */
PA_INLINE void pv_block(const int rows, const int vectors, const fp8_decoder *t, size_t n,
                        size_t c0, size_t d, const float *p, size_t ldp, const void *const *v_rows,
                        float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  __mmask16 mask[8];
  __m512 acc[16];
  pa512_load_o_vectors(rows, vectors, c0, d, o, ldo, rescale, mask, acc);
  for (size_t j = 0; j < n; j++) {
    if (j % 8 == 0) pa_prefetch_step(prefetch, j + 8);
    __m512 vv[8];
    for (int h = 0; h < vectors; h += 4) decode(v_rows[j], c0 + 16 * (size_t)h, d, t, 4, vv + h);
    for (int r = 0; r < rows; r++) {
      __m512 weight = _mm512_set1_ps(p[r * ldp + j]);
      for (int c = 0; c < vectors; c++)
        acc[r * vectors + c] = _mm512_fmadd_ps(weight, vv[c], acc[r * vectors + c]);
    }
  }
  pa512_store_o_vectors(rows, vectors, c0, mask, acc, o, ldo);
}

/* One group of `rows` rows (1-4) over every column of O, in blocks of
 * `width` vectors (4 or 8: whole decoded groups of 64). */
PA_INLINE void pv_group(const int rows, const int width, const fp8_decoder *t, size_t i, size_t m,
                        size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,
                        float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  for (size_t c0 = 0; c0 < d; c0 += 16 * (size_t)width) {
    pa_prefetch_span(prefetch, i * d + (size_t)rows * c0,
                     (size_t)rows * PA_MIN(d - c0, 16 * (size_t)width), m * d, n);
    const float *r = pa_rescale_from(rescale, i);
#define PV_BLOCK(vectors) \
  pv_block(rows, vectors, t, n, c0, d, p + i * ldp, ldp, v_rows, o + i * ldo, ldo, r, prefetch)
    if (width == 8 && d - c0 > 64) {
      PV_BLOCK(8);
    } else {
      PV_BLOCK(4);
    }
#undef PV_BLOCK
  }
}

/* Rows in groups of 4, then one of 3, 2 or 1, so that each V row is read
 * once per group: 4 or 3 rows take 64-column blocks, 2 or 1 rows 128-column
 * blocks (16 accumulators at most). */
PA_INLINE void pv(const pa_fp8_bytes *bytes, size_t m, size_t n, size_t d, const float *p,
                  size_t ldp, const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                  pa_prefetch *prefetch) {
  const fp8_decoder t = decoder(bytes);
#define PV_GROUP(rows, i) \
  pv_group(rows, (rows) >= 3 ? 4 : 8, &t, i, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch)
  PA_ROW_GROUPS_OF_4(m, PV_GROUP);
#undef PV_GROUP
}

#define PA_DEFINE_QK_PV(suffix, bytes)                                                         \
  static void pa_qk_f32_##suffix##_avx512bf16(size_t m, size_t n, size_t d, const void *q,     \
                                              size_t ldq, const void *const *k_rows, float *s, \
                                              size_t lds, pa_prefetch *prefetch) {             \
    qk(&(bytes), m, n, d, q, ldq, k_rows, s, lds, prefetch);                                   \
  }                                                                                            \
  static void pa_pv_f32_##suffix##_avx512bf16(                                                 \
      size_t m, size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,     \
      float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {                     \
    pv(&(bytes), m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                          \
  }

PA_DEFINE_QK_PV(e4m3, pa_e4m3_bytes)
PA_DEFINE_QK_PV(e5m2, pa_e5m2_bytes)

/* The f32 path's direct kernels for FP8 caches (every activation dtype
 * takes Q converted and scaled, as pa_kernels_build gives the pairs that set
 * no kernels of their own). */
void pa_attn_fp8_fma_kernels_avx512bf16(pa_kernels *k) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pa_bf16_tables_init();
  pthread_once(&once, spread_tables);
  k->qk[PA_FP8_E4M3] = pa_qk_f32_e4m3_avx512bf16;
  k->qk[PA_FP8_E5M2] = pa_qk_f32_e5m2_avx512bf16;
  k->pv[PA_FP8_E4M3] = pa_pv_f32_e4m3_avx512bf16;
  k->pv[PA_FP8_E5M2] = pa_pv_f32_e5m2_avx512bf16;
}
