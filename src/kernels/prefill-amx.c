/* Packed-tile micro-kernels for prefill on AMX tiles (tdpbf16ps): the bf16
 * pair layouts of kernels.h are the tiles' own. Q K^T: A = 16 query rows x
 * 32 elements of Q, B = 16 pairs of K^T x 16 keys; P V: A = 16 rows x 32
 * keys of P as bf16, B = 16 key pairs of V x 16 columns. Every tile is 16
 * rows of 64 bytes: two row blocks by two column blocks of C, and the A and
 * B tiles they share, fill the eight tile registers.
 *
 * The tiles take 32-element steps whole: head sizes that are not a
 * multiple of 32 go to the AVX512-BF16 kernels on the same layouts. The
 * last rows of a call take tiles of fewer rows (a second configuration).
 * The tile configuration is loaded at every call and released at its end:
 * the thread's other code (a GEMM library) may use the tiles with its own. */
#include <immintrin.h>
#include <string.h>

#include "avx512bf16-common.h"
#include "prefetch.h"

enum { PA_TILE_ROWS = 16, PA_TILE_STEP = 32 /* bf16 elements per tile row */ };

/* The 64-byte tile configuration (palette 1): byte 0 the palette, bytes
 * 16 + 2t the bytes per row of tile t, byte 48 + t its rows. The C and A
 * tiles (0-5) take `rows` rows (16, or a call's last rows), the B tiles 16. */
static void load_tile_config(int rows) {
  uint8_t config[64];
  memset(config, 0, sizeof config);
  config[0] = 1;
  for (int t = 0; t < 8; t++) {
    uint16_t bytes = 64;
    memcpy(config + 16 + 2 * t, &bytes, sizeof bytes);
    config[48 + t] = (uint8_t)(t < 6 ? rows : PA_TILE_ROWS);
  }
  _tile_loadconfig(config);
}

/* The share of the call's requests that rows [first, first + rows) of m
 * carry, issued as those rows start (tile blocks are long: each is a step). */
static void prefetch_rows(pa_prefetch *prefetch, size_t first, size_t rows, size_t m) {
  pa_prefetch_span(prefetch, first, rows, m, 1);
  pa_prefetch_step(prefetch, 1);
}

/* C tiles 0-3 (row block r, column block c: tile 2r + c), A tiles 4-5, B
 * tiles 6-7. Tile numbers are immediates, hence macros. */
#define PA_C00 0
#define PA_C01 1
#define PA_C10 2
#define PA_C11 3
#define PA_A0 4
#define PA_A1 5
#define PA_B0 6
#define PA_B1 7

/* S for 32 rows x 32 keys (rows and keys PA_TILE_ROWS apart) over d / 32
 * steps; K^T pair rows are PA_PACK_KEYS pairs long. */
static void qk_block_2x2(size_t d, const uint16_t *q, size_t ldq, const uint32_t *kt, float *s,
                         size_t lds) {
  _tile_zero(PA_C00);
  _tile_zero(PA_C01);
  _tile_zero(PA_C10);
  _tile_zero(PA_C11);
  for (size_t e = 0; e < d; e += PA_TILE_STEP) {
    _tile_loadd(PA_A0, q + e, ldq * 2);
    _tile_loadd(PA_A1, q + PA_TILE_ROWS * ldq + e, ldq * 2);
    _tile_loadd(PA_B0, kt + (e / 2) * PA_PACK_KEYS, PA_PACK_KEYS * 4);
    _tile_loadd(PA_B1, kt + (e / 2) * PA_PACK_KEYS + 16, PA_PACK_KEYS * 4);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
    _tile_dpbf16ps(PA_C01, PA_A0, PA_B1);
    _tile_dpbf16ps(PA_C10, PA_A1, PA_B0);
    _tile_dpbf16ps(PA_C11, PA_A1, PA_B1);
  }
  _tile_stored(PA_C00, s, lds * 4);
  _tile_stored(PA_C01, s + 16, lds * 4);
  _tile_stored(PA_C10, s + PA_TILE_ROWS * lds, lds * 4);
  _tile_stored(PA_C11, s + PA_TILE_ROWS * lds + 16, lds * 4);
}

/* The same for 16 rows x 16 keys (the blocks a 2 x 2 does not fill). */
static void qk_block_1x1(size_t d, const uint16_t *q, size_t ldq, const uint32_t *kt, float *s,
                         size_t lds) {
  _tile_zero(PA_C00);
  for (size_t e = 0; e < d; e += PA_TILE_STEP) {
    _tile_loadd(PA_A0, q + e, ldq * 2);
    _tile_loadd(PA_B0, kt + (e / 2) * PA_PACK_KEYS, PA_PACK_KEYS * 4);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
  }
  _tile_stored(PA_C00, s, lds * 4);
}

/* Columns past n up to a multiple of 16 are written (zeros' products: the
 * K^T tile holds zeros there up to a multiple of 64). */
static void pa_qk_packed_bf16_amx(size_t m, size_t n, size_t d, const void *q_rows, size_t ldq,
                                  const void *k_packed, float *s, size_t lds,
                                  pa_prefetch *prefetch) {
  const uint16_t *q = q_rows;
  const uint32_t *kt = k_packed;
  if (d % PA_TILE_STEP) {
    pa_qk_packed_bf16_avx512bf16(m, n, d, q_rows, ldq, k_packed, s, lds, prefetch);
    return;
  }
  size_t whole = m / PA_TILE_ROWS * PA_TILE_ROWS, keys = (n + 15) / 16 * 16, i = 0;
  load_tile_config(PA_TILE_ROWS);
  for (; i + 2 * PA_TILE_ROWS <= whole; i += 2 * PA_TILE_ROWS) {
    prefetch_rows(prefetch, i, 2 * PA_TILE_ROWS, m);
    size_t j = 0;
    for (; j + 32 <= keys; j += 32) qk_block_2x2(d, q + i * ldq, ldq, kt + j, s + i * lds + j, lds);
    for (; j < keys; j += 16) {
      for (size_t r = i; r < i + 2 * PA_TILE_ROWS; r += PA_TILE_ROWS)
        qk_block_1x1(d, q + r * ldq, ldq, kt + j, s + r * lds + j, lds);
    }
  }
  for (; i < m; i += PA_TILE_ROWS) {
    if (i == whole) load_tile_config((int)(m - whole)); /* the last rows */
    prefetch_rows(prefetch, i, PA_MIN(m - i, (size_t)PA_TILE_ROWS), m);
    for (size_t j = 0; j < keys; j += 16)
      qk_block_1x1(d, q + i * ldq, ldq, kt + j, s + i * lds + j, lds);
  }
  _tile_release();
}

/* O rows [0, PA_TILE_ROWS) times their rescale factors (a zero factor
 * discards the row, which may be uninitialised), before the tiles add P V. */
static void rescale_rows(float *o, size_t ldo, size_t d, const float *rescale, size_t rows) {
  if (!rescale) return;
  for (size_t r = 0; r < rows; r++) {
    float f = rescale[r];
    if (f == 1.0f) continue;
    for (size_t c = 0; c < d; c += 16) {
      __mmask16 mask = pa512_tail_mask(d - c);
      __m512 x = f == 0.0f ? _mm512_setzero_ps()
                           : _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, o + r * ldo + c),
                                           _mm512_set1_ps(f));
      _mm512_mask_storeu_ps(o + r * ldo + c, mask, x);
    }
  }
}

/* O for 32 rows x 32 columns += P (as bf16 pairs, two row blocks) V over
 * `keys` keys (a multiple of 32: P and V hold zeros up to it). */
static void pv_block_2x2(size_t keys, const uint32_t (*pairs)[PA_PAIR_KEYS / 2], const uint32_t *v,
                         size_t ldv, float *o, size_t ldo) {
  const size_t lda = PA_PAIR_KEYS / 2 * 4, ldb = ldv * 4, ldc = ldo * 4;
  _tile_loadd(PA_C00, o, ldc);
  _tile_loadd(PA_C01, o + 16, ldc);
  _tile_loadd(PA_C10, o + PA_TILE_ROWS * ldo, ldc);
  _tile_loadd(PA_C11, o + PA_TILE_ROWS * ldo + 16, ldc);
  for (size_t j = 0; j < keys; j += PA_TILE_STEP) {
    _tile_loadd(PA_A0, &pairs[0][j / 2], lda);
    _tile_loadd(PA_A1, &pairs[PA_TILE_ROWS][j / 2], lda);
    _tile_loadd(PA_B0, v + (j / 2) * ldv, ldb);
    _tile_loadd(PA_B1, v + (j / 2) * ldv + 16, ldb);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
    _tile_dpbf16ps(PA_C01, PA_A0, PA_B1);
    _tile_dpbf16ps(PA_C10, PA_A1, PA_B0);
    _tile_dpbf16ps(PA_C11, PA_A1, PA_B1);
  }
  _tile_stored(PA_C00, o, ldc);
  _tile_stored(PA_C01, o + 16, ldc);
  _tile_stored(PA_C10, o + PA_TILE_ROWS * ldo, ldc);
  _tile_stored(PA_C11, o + PA_TILE_ROWS * ldo + 16, ldc);
}

/* The same for 16 rows x 16 columns. */
static void pv_block_1x1(size_t keys, const uint32_t (*pairs)[PA_PAIR_KEYS / 2], const uint32_t *v,
                         size_t ldv, float *o, size_t ldo) {
  _tile_loadd(PA_C00, o, ldo * 4);
  for (size_t j = 0; j < keys; j += PA_TILE_STEP) {
    _tile_loadd(PA_A0, &pairs[0][j / 2], PA_PAIR_KEYS / 2 * 4);
    _tile_loadd(PA_B0, v + (j / 2) * ldv, ldv * 4);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
  }
  _tile_stored(PA_C00, o, ldo * 4);
}

static void pa_pv_packed_bf16_amx(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                                  const void *v_packed, float *o, size_t ldo, const float *rescale,
                                  pa_prefetch *prefetch) {
  const uint32_t *v = v_packed;
  if (d % PA_TILE_STEP) {
    pa_pv_packed_bf16_avx512bf16(m, n, d, p, ldp, v_packed, o, ldo, rescale, prefetch);
    return;
  }
  size_t ldv = (d + 15) / 16 * 16, keys = (n + PA_TILE_STEP - 1) / PA_TILE_STEP * PA_TILE_STEP;
  size_t whole = m / PA_TILE_ROWS * PA_TILE_ROWS;
  uint32_t pairs[2 * PA_TILE_ROWS][PA_PAIR_KEYS / 2];
  load_tile_config(PA_TILE_ROWS);
  for (size_t i = 0; i < m;) {
    int two = i + 2 * PA_TILE_ROWS <= whole;
    size_t rows = two ? 2 * PA_TILE_ROWS : PA_MIN(m - i, (size_t)PA_TILE_ROWS);
    if (i == whole && rows < PA_TILE_ROWS) load_tile_config((int)rows); /* the last rows */
    prefetch_rows(prefetch, i, rows, m);
    pack_pairs((int)rows, n, p + i * ldp, ldp, pairs); /* zeros past n, to a multiple of 32 */
    rescale_rows(o + i * ldo, ldo, d, pa_rescale_from(rescale, i), rows);
    for (size_t c = 0; c < d; c += 32) {
      if (two) {
        pv_block_2x2(keys, pairs, v + c, ldv, o + i * ldo + c, ldo);
      } else {
        pv_block_1x1(keys, pairs, v + c, ldv, o + i * ldo + c, ldo);
        pv_block_1x1(keys, pairs, v + c + 16, ldv, o + i * ldo + c + 16, ldo);
      }
    }
    i += rows;
  }
  _tile_release();
}

/* V pairs as prefill-avx512bf16.c packs them, with zero pairs after the
 * last key up to a multiple of 32 keys: the P V tiles read 32 keys at a
 * time, and stale pairs there (whatever an earlier tile left, NaN
 * included) would reach O through P's zeros. */
static void zero_pairs_after(void *dst, size_t n, size_t d) {
  size_t ldv = (d + 15) / 16 * 16, first = (n + 1) / 2;
  size_t end = (n + PA_TILE_STEP - 1) / PA_TILE_STEP * PA_TILE_STEP / 2;
  if (end > first) memset((uint32_t *)dst + first * ldv, 0, (end - first) * ldv * 4);
}

#define PA_DEFINE_PACK_V(suffix)                                                                 \
  static void pa_pack_v_##suffix##_amx(void *dst, const void *const *rows, size_t n, size_t d) { \
    pa_pack_v_##suffix##_avx512bf16(dst, rows, n, d);                                            \
    zero_pairs_after(dst, n, d);                                                                 \
  }

PA_DEFINE_PACK_V(bf16)
PA_DEFINE_PACK_V(e4m3)
PA_DEFINE_PACK_V(e5m2)

/* Over the AVX512-BF16 registration: the bf16-activation pairs whose packed
 * kernels use the bf16 pair layouts get the tiles for their products. */
void pa_prefill_kernels_amx(pa_kernels *k) {
  static const pa_pack_fn pack_v[PA_NUM_DTYPES] = {[PA_BF16] = pa_pack_v_bf16_amx,
                                                   [PA_FP8_E4M3] = pa_pack_v_e4m3_amx,
                                                   [PA_FP8_E5M2] = pa_pack_v_e5m2_amx};
  for (int cache = 0; cache < PA_NUM_DTYPES; cache++) {
    if (!pack_v[cache]) continue;
    pa_attn_ops *ops = &k->attn[PA_BF16][cache];
    ops->pack_v = pack_v[cache];
    ops->qk_packed = pa_qk_packed_bf16_amx;
    ops->pv_packed = pa_pv_packed_bf16_amx;
    /* Requests for the next tile cost more issue time than they save here
     * (docs/xeon-amx.md); the tiles' reads are in order within a block. */
    ops->packed_unprefetched = 1;
  }
}
