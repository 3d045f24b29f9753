/* Micro-kernels on AMX tiles (tdpbf16ps) for bf16 activations (and f16
 * ones over a tiled FP8 cache, in two bf16 parts: the last section): Q
 * K^T with A = 16 query rows x 32 elements of Q and B = 16 pairs of K^T x
 * 16 keys;
 * P V with A = 16 rows x 32 keys of P as bf16 (the rows of the softmax's
 * softmax_bf16_rows, read where it wrote them) and B = 16 key pairs of V x
 * 16 columns. B tiles come from the packed layouts of
 * kernels.h (the packed kernels, prefill) or straight from a tiled cache
 * (pa_kv_layout; the tiled kernels, every item over such a cache; an FP8
 * one converted to bf16 per tile first, stage_tiled): the same loops over
 * B tiles addressed two ways. Two row blocks by two column
 * blocks of C, and the A and B tiles they share, fill the eight tile
 * registers.
 *
 * The tiles take 32-element steps of the head whole: head sizes that are
 * not a multiple of 32 go to the AVX512-BF16 kernels on the packed layouts
 * (and read a tiled cache through rows). The last rows of a call take
 * tiles of fewer rows (a second configuration). A configuration stays
 * loaded from one call to the next on a thread until release_tiles
 * (pa_kernels): the thread's other code (a GEMM library) may use the tiles
 * with its own after that. */
#include <immintrin.h>
#include <string.h>

#include "avx512bf16-common.h"
#include "prefetch.h"

enum {
  PA_TILE_ROWS = 16,
  PA_TILE_STEP = 32,                            /* bf16 elements per A tile row */
  PA_GROUP_KEYS = 16,                           /* keys per Q K^T B tile */
  PA_MAX_GROUPS = PA_PACK_KEYS / PA_GROUP_KEYS, /* per call */
  PA_MAX_STEPS = PA_PACK_KEYS / 16, /* P V key steps per call: 32 keys, 16 over split pairs */
};

/* The rows of the C and A tiles of the thread's loaded configuration; 0:
 * none loaded (the tiles released). */
static _Thread_local int g_loaded_rows;

/* The 64-byte tile configuration (palette 1): byte 0 the palette, bytes
 * 16 + 2t the bytes per row of tile t, byte 48 + t its rows. The C and A
 * tiles (0-5) take `rows` rows (16, or a call's last rows), the B tiles 16;
 * every row is 64 bytes. Loaded unless it is loaded already. */
static void load_tile_config(int rows) {
  if (g_loaded_rows == rows) return;
  g_loaded_rows = rows;
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

/* The rows of a call's first configuration: 16, or all of a call of fewer
 * (a decode's), which then needs no second one. */
static int first_rows(size_t m) { return m < PA_TILE_ROWS ? (int)m : PA_TILE_ROWS; }

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

/* ---- Q K^T ---------------------------------------------------------------- */

/* S for 32 rows x 32 keys (rows and keys PA_TILE_ROWS apart) over d / 32
 * steps: keys of groups b0 and b1, whose pair rows are ldb bytes apart. */
static void qk_block_2x2(size_t d, const uint16_t *q, size_t ldq, const char *b0, const char *b1,
                         size_t ldb, float *s, size_t lds) {
  _tile_zero(PA_C00);
  _tile_zero(PA_C01);
  _tile_zero(PA_C10);
  _tile_zero(PA_C11);
  for (size_t e = 0; e < d; e += PA_TILE_STEP) {
    _tile_loadd(PA_A0, q + e, ldq * 2);
    _tile_loadd(PA_A1, q + PA_TILE_ROWS * ldq + e, ldq * 2);
    _tile_loadd(PA_B0, b0 + e / 2 * ldb, ldb);
    _tile_loadd(PA_B1, b1 + e / 2 * ldb, ldb);
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

/* One row block (the tiles' configured rows) x the keys of groups b0 and b1;
 * `rest` (elements from each row's start; 0: none) holds the rests of Q's
 * values split in two bf16 (f16 activations), whose products add to S. */
static void qk_block_1x2(size_t d, const uint16_t *q, size_t ldq, size_t rest, const char *b0,
                         const char *b1, size_t ldb, float *s, size_t lds, pa_prefetch *prefetch,
                         size_t done) {
  _tile_zero(PA_C00);
  _tile_zero(PA_C01);
  for (size_t e = 0; e < d; e += PA_TILE_STEP) {
    /* A share per step, not per block: a decode's B tiles come from
     * memory, and the requests must keep just ahead of them. */
    pa_prefetch_step(prefetch, done + e / PA_TILE_STEP + 1);
    _tile_loadd(PA_A0, q + e, ldq * 2);
    _tile_loadd(PA_B0, b0 + e / 2 * ldb, ldb);
    _tile_loadd(PA_B1, b1 + e / 2 * ldb, ldb);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
    _tile_dpbf16ps(PA_C01, PA_A0, PA_B1);
    if (rest) {
      _tile_loadd(PA_A1, q + rest + e, ldq * 2);
      _tile_dpbf16ps(PA_C00, PA_A1, PA_B0);
      _tile_dpbf16ps(PA_C01, PA_A1, PA_B1);
    }
  }
  _tile_stored(PA_C00, s, lds * 4);
  _tile_stored(PA_C01, s + 16, lds * 4);
}

static void qk_block_1x1(size_t d, const uint16_t *q, size_t ldq, size_t rest, const char *b0,
                         size_t ldb, float *s, size_t lds) {
  _tile_zero(PA_C00);
  for (size_t e = 0; e < d; e += PA_TILE_STEP) {
    _tile_loadd(PA_A0, q + e, ldq * 2);
    _tile_loadd(PA_B0, b0 + e / 2 * ldb, ldb);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
    if (rest) {
      _tile_loadd(PA_A1, q + rest + e, ldq * 2);
      _tile_dpbf16ps(PA_C00, PA_A1, PA_B0);
    }
  }
  _tile_stored(PA_C00, s, lds * 4);
}

/* The keys of one row block (rows of the configuration) over all groups. */
static void qk_row_block(size_t count, size_t d, const uint16_t *q, size_t ldq, size_t rest,
                         const char *const *groups, size_t ldb, float *s, size_t lds,
                         pa_prefetch *prefetch) {
  size_t g = 0;
  for (; g + 2 <= count; g += 2) {
    qk_block_1x2(d, q, ldq, rest, groups[g], groups[g + 1], ldb, s + g * PA_GROUP_KEYS, lds,
                 prefetch, g / 2 * (d / PA_TILE_STEP));
  }
  if (g < count) qk_block_1x1(d, q, ldq, rest, groups[g], ldb, s + g * PA_GROUP_KEYS, lds);
  pa_prefetch_step(prefetch, (count + 1) / 2 * (d / PA_TILE_STEP));
}

/* S[i][j] for i < m and j < n rounded up to 16, group g holding keys
 * [16g, 16g + 16). Requests spread over each row block's groups. With
 * rests (qk_block_1x2), every row block takes the one-block path: the
 * 2 x 2 blocks fill the tile registers without them. */
static void qk_amx(size_t m, size_t n, size_t d, const uint16_t *q, size_t ldq, size_t rest,
                   const char *const *groups, size_t ldb, float *s, size_t lds,
                   pa_prefetch *prefetch) {
  size_t count = (n + PA_GROUP_KEYS - 1) / PA_GROUP_KEYS, pairs = (count + 1) / 2;
  size_t whole = m / PA_TILE_ROWS * PA_TILE_ROWS, i = 0;
  size_t block_pairs_end = rest ? 0 : whole;
  load_tile_config(first_rows(m));
  for (; i + 2 * PA_TILE_ROWS <= block_pairs_end; i += 2 * PA_TILE_ROWS) {
    pa_prefetch_span(prefetch, i, 2 * PA_TILE_ROWS, m, pairs);
    size_t g = 0;
    for (; g + 2 <= count; g += 2) {
      qk_block_2x2(d, q + i * ldq, ldq, groups[g], groups[g + 1], ldb,
                   s + i * lds + g * PA_GROUP_KEYS, lds);
      pa_prefetch_step(prefetch, g / 2 + 1);
    }
    for (size_t r = i; g < count && r < i + 2 * PA_TILE_ROWS; r += PA_TILE_ROWS)
      qk_block_1x1(d, q + r * ldq, ldq, 0, groups[g], ldb, s + r * lds + g * PA_GROUP_KEYS, lds);
    pa_prefetch_step(prefetch, pairs);
  }
  for (; i < m; i += PA_TILE_ROWS) {
    if (i == whole && i > 0) load_tile_config((int)(m - whole)); /* the last rows */
    pa_prefetch_span(prefetch, i, PA_MIN(m - i, (size_t)PA_TILE_ROWS), m,
                     pairs * (d / PA_TILE_STEP));
    qk_row_block(count, d, q + i * ldq, ldq, rest, groups, ldb, s + i * lds, lds, prefetch);
  }
}

/* Columns past n up to a multiple of 16 are written (zeros' products: the
 * K^T tile holds zeros there up to a multiple of 64). */
static void pa_qk_packed_bf16_amx(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                                  const void *k_packed, float *s, size_t lds,
                                  pa_prefetch *prefetch) {
  if (d % PA_TILE_STEP) {
    pa_qk_packed_bf16_avx512bf16(m, n, d, q, ldq, k_packed, s, lds, prefetch);
    return;
  }
  const char *groups[PA_MAX_GROUPS] = {0};
  for (size_t g = 0; g * PA_GROUP_KEYS < n; g++)
    groups[g] = (const char *)k_packed + g * PA_GROUP_KEYS * 4;
  qk_amx(m, n, d, q, ldq, 0, groups, PA_PACK_KEYS * 4, s, lds, prefetch);
}

/* A tiled cache's 16-token groups are B tiles as they lie: 64-byte pair
 * rows, one after the other. */
static void pa_qk_tiled_bf16_amx(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                                 const void *const *k_anchors, void *stage, float *s, size_t lds,
                                 pa_prefetch *prefetch) {
  (void)stage;
  const char *groups[PA_MAX_GROUPS] = {0};
  for (size_t g = 0; g * PA_GROUP_KEYS < n; g++) groups[g] = k_anchors[g * PA_GROUP_KEYS];
  qk_amx(m, n, d, q, ldq, 0, groups, 64, s, lds, prefetch);
}

/* ---- P V ------------------------------------------------------------------ */

/* Where P V finds its B tiles: step t's 16 pair rows (its 32 keys' V, two
 * keys a row) of the column group c are at step[t] + c * group_bytes, rows
 * row_bytes apart. A tiled cache's last step may end inside a pair row
 * group whose later keys hold anything: `tail` keys of it are the call's
 * (0: the step is whole, or the rows past n are zeros, as packed). */
typedef struct pa_pv_source {
  const char *const *step;
  size_t row_bytes, group_bytes, steps, tail;
} pa_pv_source;

/* Pair row r (keys 2r and 2r + 1, 16 columns) with the keys from `keep` on
 * zeroed: whatever lies there (NaN included) would reach O through P's
 * zeros. */
PA_INLINE __m512i keys_before(__m512i row, size_t r, size_t keep) {
  if (r < keep / 2) return row;
  if (r < (keep + 1) / 2) return _mm512_and_si512(row, _mm512_set1_epi32(0xffff)); /* 2r only */
  return _mm512_setzero_si512();
}

/* The same for the pair row at `at`, read only where a key is kept. */
static __m512i pair_row_before(const char *at, size_t r, size_t keep) {
  return r < (keep + 1) / 2 ? keys_before(_mm512_loadu_si512(at), r, keep) : _mm512_setzero_si512();
}

/* The last step's rows of column group `offset` with the keys past the
 * call's zeroed, in `tile`. */
static const char *clean_tail(const pa_pv_source *v, size_t offset, uint32_t tile[16][16]) {
  const char *src = v->step[v->steps - 1] + offset;
  for (size_t r = 0; r < PA_TILE_STEP / 2; r++)
    _mm512_storeu_si512(tile[r], pair_row_before(src + r * v->row_bytes, r, v->tail));
  return (const char *)tile;
}

/* The B tile of step t, column group at byte `offset`. */
static const char *pv_b(const pa_pv_source *v, size_t t, size_t offset, uint32_t tile[16][16],
                        size_t *ldb) {
  if (v->tail && t == v->steps - 1) {
    *ldb = 64;
    return clean_tail(v, offset, tile);
  }
  *ldb = v->row_bytes;
  return v->step[t] + offset;
}

/* The tiles' sums of 32 rows x 32 columns (acc, rows of 32) added to O:
 * O = O * rescale + acc, row by row (a zero factor discards O's row, which
 * may be uninitialised; NULL: 1). On vector registers, after the tiles:
 * tile loads of O just written by vector stores would wait for them. */
static void add_sums(float *o, size_t ldo, const float (*acc)[32], const float *rescale,
                     size_t rows) {
  for (size_t r = 0; r < rows; r++) {
    float f = rescale ? rescale[r] : 1.0f;
    __m512 lo = _mm512_loadu_ps(acc[r]), hi = _mm512_loadu_ps(acc[r] + 16);
    if (f != 0.0f) {
      __m512 factor = _mm512_set1_ps(f);
      lo = _mm512_fmadd_ps(_mm512_loadu_ps(o + r * ldo), factor, lo);
      hi = _mm512_fmadd_ps(_mm512_loadu_ps(o + r * ldo + 16), factor, hi);
    }
    _mm512_storeu_ps(o + r * ldo, lo);
    _mm512_storeu_ps(o + r * ldo + 16, hi);
  }
}

/* acc (32 rows x the column groups at byte offsets c0 and c1, 16 columns
 * each) = P V over every step, P's bf16 rows (two row blocks) lda bytes
 * apart. */
static void pv_block_2x2(const pa_pv_source *v, const char *p, size_t lda, size_t c0, size_t c1,
                         float (*acc)[32]) {
  const size_t ldc = 32 * 4;
  uint32_t tail[2][16][16];
  _tile_zero(PA_C00);
  _tile_zero(PA_C01);
  _tile_zero(PA_C10);
  _tile_zero(PA_C11);
  for (size_t t = 0; t < v->steps; t++) {
    size_t ld0, ld1, j = t * PA_TILE_STEP;
    const char *b0 = pv_b(v, t, c0, tail[0], &ld0), *b1 = pv_b(v, t, c1, tail[1], &ld1);
    _tile_loadd(PA_A0, p + j * 2, lda);
    _tile_loadd(PA_A1, p + PA_TILE_ROWS * lda + j * 2, lda);
    _tile_loadd(PA_B0, b0, ld0);
    _tile_loadd(PA_B1, b1, ld1);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
    _tile_dpbf16ps(PA_C01, PA_A0, PA_B1);
    _tile_dpbf16ps(PA_C10, PA_A1, PA_B0);
    _tile_dpbf16ps(PA_C11, PA_A1, PA_B1);
  }
  _tile_stored(PA_C00, acc[0], ldc);
  _tile_stored(PA_C01, acc[0] + 16, ldc);
  _tile_stored(PA_C10, acc[PA_TILE_ROWS], ldc);
  _tile_stored(PA_C11, acc[PA_TILE_ROWS] + 16, ldc);
}

/* The same for one row block (the configuration's rows). */
static void pv_block_1x2(const pa_pv_source *v, const char *p, size_t lda, size_t c0, size_t c1,
                         float (*acc)[32], pa_prefetch *prefetch, size_t done) {
  const size_t ldc = 32 * 4;
  uint32_t tail[2][16][16];
  _tile_zero(PA_C00);
  _tile_zero(PA_C01);
  for (size_t t = 0; t < v->steps; t++) {
    pa_prefetch_step(prefetch, done + t + 1);
    size_t ld0, ld1;
    const char *b0 = pv_b(v, t, c0, tail[0], &ld0), *b1 = pv_b(v, t, c1, tail[1], &ld1);
    _tile_loadd(PA_A0, p + t * PA_TILE_STEP * 2, lda);
    _tile_loadd(PA_B0, b0, ld0);
    _tile_loadd(PA_B1, b1, ld1);
    _tile_dpbf16ps(PA_C00, PA_A0, PA_B0);
    _tile_dpbf16ps(PA_C01, PA_A0, PA_B1);
  }
  _tile_stored(PA_C00, acc[0], ldc);
  _tile_stored(PA_C01, acc[0] + 16, ldc);
}

/* A block's sums waiting to be added to O (add_sums) while the next
 * block's products run: vector loads of a tile store's bytes right after it
 * wait for the store to complete. */
typedef struct pa_pending_sums {
  float *o;
  const float *rescale;
  size_t rows;
} pa_pending_sums;

static void add_pending(pa_pending_sums *pending, size_t ldo, const float (*acc)[32]) {
  if (pending->o) add_sums(pending->o, ldo, acc, pending->rescale, pending->rows);
  pending->o = NULL;
}

/* O[i][:] = O[i][:] * rescale[i] + P[i][:n] V for i < m; d a multiple of
 * 32. P: bf16 rows ldp floats apart, zeros from n to a multiple of 32 (the
 * A tiles, as the softmax left them). */
static void pv_amx(size_t m, size_t d, const void *p, size_t ldp, const pa_pv_source *v, float *o,
                   size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  size_t whole = m / PA_TILE_ROWS * PA_TILE_ROWS, lda = ldp * sizeof(float);
  float acc[2][2 * PA_TILE_ROWS][32];
  pa_pending_sums pending = {NULL, NULL, 0};
  size_t block = 0;
  load_tile_config(first_rows(m));
  for (size_t i = 0; i < m;) {
    int two = i + 2 * PA_TILE_ROWS <= whole;
    size_t rows = two ? 2 * PA_TILE_ROWS : PA_MIN(m - i, (size_t)PA_TILE_ROWS);
    if (i == whole && i > 0 && rows < PA_TILE_ROWS) load_tile_config((int)rows);
    pa_prefetch_span(prefetch, i, rows, m, d / 32 * (two ? 1 : v->steps));
    const char *a = (const char *)p + i * lda;
    for (size_t c = 0; c < d; c += 32, block ^= 1) {
      size_t c0 = c / 16 * v->group_bytes, c1 = c0 + v->group_bytes;
      if (two) {
        pv_block_2x2(v, a, lda, c0, c1, acc[block]);
      } else {
        pv_block_1x2(v, a, lda, c0, c1, acc[block], prefetch, c / 32 * v->steps);
      }
      add_pending(&pending, ldo, (const float(*)[32])acc[block ^ 1]);
      pending = (pa_pending_sums){o + i * ldo + c, pa_rescale_from(rescale, i), rows};
      pa_prefetch_step(prefetch, two ? c / 32 + 1 : (c / 32 + 1) * v->steps);
    }
    i += rows;
  }
  add_pending(&pending, ldo, (const float(*)[32])acc[block ^ 1]);
}

static void pa_pv_packed_bf16_amx(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                                  const void *v_packed, float *o, size_t ldo, const float *rescale,
                                  pa_prefetch *prefetch) {
  if (d % PA_TILE_STEP) {
    pa_pv_packed_bf16_avx512bf16(m, n, d, p, ldp, v_packed, o, ldo, rescale, prefetch);
    return;
  }
  size_t ldv = (d + 15) / 16 * 16;
  const char *step[PA_MAX_STEPS] = {0};
  pa_pv_source v = {step, ldv * 4, 64, (n + PA_TILE_STEP - 1) / PA_TILE_STEP, 0};
  for (size_t t = 0; t < v.steps; t++)
    step[t] = (const char *)v_packed + t * (PA_TILE_STEP / 2) * ldv * 4;
  pv_amx(m, d, p, ldp, &v, o, ldo, rescale, prefetch);
}

/* V of keys [0, n) copied from a tiled cache into the packed pair layout
 * (each 16-key group's column groups are 8 pair rows of 64 bytes there and
 * here), with the keys past n zeroed up to a multiple of 32. */
static void stage_values(uint32_t *dst, const void *const *v_anchors, size_t n, size_t d,
                         size_t block_size) {
  size_t ldv = (d + 15) / 16 * 16, group_bytes = PA_GROUP_KEYS * block_size * 2;
  for (size_t j = 0; j < n; j += PA_GROUP_KEYS) {
    const char *src = v_anchors[j];
    size_t keep = PA_MIN(n - j, (size_t)PA_GROUP_KEYS);
    for (size_t g = 0; g < d / PA_GROUP_KEYS; g++) {
      for (size_t r = 0; r < PA_GROUP_KEYS / 2; r++) {
        __m512i row = pair_row_before(src + g * group_bytes + r * 64, r, keep);
        _mm512_storeu_si512(dst + (j / 2 + r) * ldv + g * PA_GROUP_KEYS, row);
      }
    }
  }
  size_t end = (n + PA_TILE_STEP - 1) / PA_TILE_STEP * PA_TILE_STEP / 2;
  size_t first = (n + PA_GROUP_KEYS - 1) / PA_GROUP_KEYS * PA_GROUP_KEYS / 2;
  if (end > first) memset(dst + first * ldv, 0, (end - first) * ldv * 4);
}

/* A tiled cache's values: a column group is block_size / 2 pair rows of 64
 * bytes, read in steps of 32 keys where a block holds whole steps; other
 * block sizes are staged in the packed layout first (steps of 16 keys,
 * half a tile's work per product, cost more than the copy). */
static void pa_pv_tiled_bf16_amx(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                                 const void *const *v_anchors, size_t block_size, void *stage,
                                 float *o, size_t ldo, const float *rescale,
                                 pa_prefetch *prefetch) {
  if (block_size % PA_TILE_STEP) {
    stage_values(stage, v_anchors, n, d, block_size);
    pa_pv_packed_bf16_amx(m, n, d, p, ldp, stage, o, ldo, rescale, prefetch);
    return;
  }
  const char *step[PA_MAX_STEPS] = {0};
  pa_pv_source v = {step, 64, PA_GROUP_KEYS * block_size * 2, (n + PA_TILE_STEP - 1) / PA_TILE_STEP,
                    n % PA_TILE_STEP};
  for (size_t t = 0; t < v.steps; t++) step[t] = v_anchors[t * PA_TILE_STEP];
  pv_amx(m, d, p, ldp, &v, o, ldo, rescale, prefetch);
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

/* ---- FP8 caches in the tiled order --------------------------------------- */

/* An FP8 tiled cache holds the bf16 tiled order at one byte an element:
 * stage_tiled converts a tile's groups (64 bytes into two 64-byte rows, in
 * order) once per KV head, and the products read the stage. Keys: each
 * 16-token group is 16 d contiguous elements (a multiple of 512 here),
 * converted whole (the keys past n in the last group give S columns past
 * n, which the contract allows), one group after the other. */
PA_INLINE void stage_keys_fp8(const pa_fp8_bytes *bytes, void *stage, const void *const *k_anchors,
                              size_t n, size_t d) {
  const pa_fp8_tables t = fp8_tables(bytes);
  const size_t group_elements = PA_GROUP_KEYS * d;
  for (size_t g = 0; g * PA_GROUP_KEYS < n; g++) {
    const uint8_t *src = k_anchors[g * PA_GROUP_KEYS];
    uint16_t *dst = (uint16_t *)stage + g * group_elements;
    for (size_t i = 0; i < group_elements; i += 64) {
      __m512i first, second;
      fp8x64_bf16(_mm512_loadu_si512(src + i), &t, &first, &second);
      _mm512_storeu_si512(dst + i, first);
      _mm512_storeu_si512(dst + i + 32, second);
    }
  }
}

/* Values into the packed pair layout: a 16-token group's column group is 8
 * pair rows of 32 bytes, which become those 8 packed rows' 16 columns; the
 * keys past n are zeroed, up to a multiple of 32. */
PA_INLINE void stage_values_fp8(const pa_fp8_bytes *bytes, void *stage,
                                const void *const *v_anchors, size_t n, size_t d,
                                size_t block_size) {
  const pa_fp8_tables t = fp8_tables(bytes);
  const size_t column_bytes = PA_GROUP_KEYS * block_size; /* d is a multiple of 32: ldv = d */
  uint32_t *dst = stage;
  for (size_t j = 0; j < n; j += PA_GROUP_KEYS) {
    const uint8_t *src = v_anchors[j];
    size_t keep = PA_MIN(n - j, (size_t)PA_GROUP_KEYS);
    for (size_t c = 0; c < d / PA_GROUP_KEYS; c++) {
      for (size_t r = 0; r < PA_GROUP_KEYS / 2; r += 2) {
        __m512i first, second;
        fp8x64_bf16(_mm512_loadu_si512(src + c * column_bytes + r * 32), &t, &first, &second);
        uint32_t *row = dst + (j / 2 + r) * d + c * PA_GROUP_KEYS;
        _mm512_storeu_si512(row, keys_before(first, r, keep));
        _mm512_storeu_si512(row + d, keys_before(second, r + 1, keep));
      }
    }
  }
  zero_pairs_after(stage, n, d);
}

#define PA_DEFINE_STAGE_FP8(suffix)                                                         \
  static void pa_stage_keys_tiled_##suffix##_amx(void *stage, const void *const *anchors,   \
                                                 size_t n, size_t d, size_t block_size) {   \
    (void)block_size;                                                                       \
    stage_keys_fp8(&pa_##suffix##_bytes, stage, anchors, n, d);                             \
  }                                                                                         \
  static void pa_stage_values_tiled_##suffix##_amx(void *stage, const void *const *anchors, \
                                                   size_t n, size_t d, size_t block_size) { \
    stage_values_fp8(&pa_##suffix##_bytes, stage, anchors, n, d, block_size);               \
  }                                                                                         \
  static void pa_stage_values_twice_##suffix##_amx(void *stage, const void *const *anchors, \
                                                   size_t n, size_t d, size_t block_size) { \
    stage_values_fp8_twice(&pa_##suffix##_bytes, stage, anchors, n, d, block_size);         \
  }

/* Q K^T over a stage of keys in the tiled group order; `rest` as for
 * qk_amx. */
PA_INLINE void qk_staged(size_t m, size_t n, size_t d, const void *q, size_t ldq, size_t rest,
                         const void *stage, float *s, size_t lds, pa_prefetch *prefetch) {
  const char *groups[PA_MAX_GROUPS] = {0};
  for (size_t g = 0; g * PA_GROUP_KEYS < n; g++)
    groups[g] = (const char *)stage + g * PA_GROUP_KEYS * d * 2;
  qk_amx(m, n, d, q, ldq, rest, groups, 64, s, lds, prefetch);
}

static void pa_qk_staged_amx(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                             const void *const *k_anchors, void *stage, float *s, size_t lds,
                             pa_prefetch *prefetch) {
  (void)k_anchors;
  qk_staged(m, n, d, q, ldq, 0, stage, s, lds, prefetch);
}

static void pa_pv_staged_amx(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                             const void *const *v_anchors, size_t block_size, void *stage, float *o,
                             size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  (void)v_anchors, (void)block_size;
  pa_pv_packed_bf16_amx(m, n, d, p, ldp, stage, o, ldo, rescale, prefetch);
}

/* ---- f16 activations over FP8 tiles -------------------------------------- */

/* An f16 value has 11 significant bits, which two bf16 hold exactly: Q's
 * rows hold the high parts in [0, padded) and the rests in [padded,
 * 2 padded), padded = d rounded up to 64 (the q_size of 4 bytes an element
 * leaves that room), and Q K^T adds the rests' products to S. One bf16 of
 * P would be 2^-9 off, more than f16 outputs allow: the softmax leaves
 * each weight as a split pair (softmax_split_rows), and the values are
 * staged as pairs of one value twice, so that a product of pairs adds the
 * high part's and the rest's terms. Twice the tiles' products of bf16
 * activations, in place of the dot products' four per pair. */
PA_INLINE size_t q_padded(size_t d) { return (d + 63) / 64 * 64; }

static void pa_load_q_f16_split_amx(void *dst, const void *src, size_t n, float factor) {
  (void)factor; /* the softmax scales the scores */
  uint16_t *high = dst, *rest = (uint16_t *)dst + q_padded(n);
  const uint16_t *in = src;
  for (size_t e = 0; e < q_padded(n); e += 16) {
    __mmask16 m = pa512_tail_mask(e < n ? n - e : 0);
    __m256i h, r;
    bf16_parts(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, in + e)), &h, &r);
    _mm256_storeu_si256((__m256i *)(high + e), h);
    _mm256_storeu_si256((__m256i *)(rest + e), r);
  }
}

/* A staged key's row, or zeros from `keep` on. */
PA_INLINE __m512i key_before(__m512i row, size_t key, size_t keep) {
  return key < keep ? row : _mm512_setzero_si512();
}

/* Values staged as pairs of one value twice: key j's row of d pairs at
 * j * d (32-bit units), from a tiled FP8 cache's pair rows (keys 2r and
 * 2r + 1 of 16 columns, one word a column once converted); keys past n
 * zero, up to a multiple of 16. */
PA_INLINE void stage_values_fp8_twice(const pa_fp8_bytes *bytes, void *stage,
                                      const void *const *v_anchors, size_t n, size_t d,
                                      size_t block_size) {
  const pa_fp8_tables t = fp8_tables(bytes);
  const size_t column_bytes = PA_GROUP_KEYS * block_size;
  const __m512i low_half = _mm512_set1_epi32(0xffff);
  uint32_t *dst = stage;
  for (size_t j = 0; j < n; j += PA_GROUP_KEYS) {
    const uint8_t *src = v_anchors[j];
    size_t keep = PA_MIN(n - j, (size_t)PA_GROUP_KEYS);
    for (size_t c = 0; c < d / PA_GROUP_KEYS; c++) {
      for (size_t r = 0; r < PA_GROUP_KEYS / 2; r += 2) {
        __m512i pairs[2];
        fp8x64_bf16(_mm512_loadu_si512(src + c * column_bytes + r * 32), &t, &pairs[0], &pairs[1]);
        for (size_t h = 0; h < 2; h++) {
          size_t key = 2 * (r + h);
          __m512i w = pairs[h];
          __m512i even = _mm512_or_si512(_mm512_and_si512(w, low_half), _mm512_slli_epi32(w, 16));
          __m512i odd = _mm512_or_si512(_mm512_srli_epi32(w, 16), _mm512_andnot_si512(low_half, w));
          uint32_t *row = dst + (j + key) * d + c * PA_GROUP_KEYS;
          _mm512_storeu_si512(row, key_before(even, key, keep));
          _mm512_storeu_si512(row + d, key_before(odd, key + 1, keep));
        }
      }
    }
  }
}

PA_DEFINE_STAGE_FP8(e4m3)
PA_DEFINE_STAGE_FP8(e5m2)

/* Q's rows are ldq elements of 4 bytes apart: 2 ldq bf16. */
static void pa_qk_staged_split_amx(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                                   const void *const *k_anchors, void *stage, float *s, size_t lds,
                                   pa_prefetch *prefetch) {
  (void)k_anchors;
  qk_staged(m, n, d, q, 2 * ldq, q_padded(d), stage, s, lds, prefetch);
}

/* P's split pairs, 16 keys (64 bytes) an A tile row, over the staged
 * values' rows of pairs. */
static void pa_pv_staged_twice_amx(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                                   const void *const *v_anchors, size_t block_size, void *stage,
                                   float *o, size_t ldo, const float *rescale,
                                   pa_prefetch *prefetch) {
  (void)v_anchors, (void)block_size;
  const char *step[PA_MAX_STEPS] = {0};
  pa_pv_source v = {step, d * 4, 64, (n + PA_GROUP_KEYS - 1) / PA_GROUP_KEYS, 0};
  for (size_t t = 0; t < v.steps; t++) step[t] = (const char *)stage + t * PA_GROUP_KEYS * d * 4;
  pv_amx(m, d, p, ldp, &v, o, ldo, rescale, prefetch);
}

static void pa_release_tiles_amx(void) {
  if (!g_loaded_rows) return;
  _tile_release();
  g_loaded_rows = 0;
}

/* Over the AVX512-BF16 registration: the bf16-activation pairs whose packed
 * kernels use the bf16 pair layouts get the tiles for their products, and
 * a tiled bf16 cache is read in place. */
void pa_prefill_kernels_amx(pa_kernels *k) {
  k->release_tiles = pa_release_tiles_amx;
  static const pa_pack_fn pack_v[PA_NUM_DTYPES] = {[PA_BF16] = pa_pack_v_bf16_amx,
                                                   [PA_FP8_E4M3] = pa_pack_v_e4m3_amx,
                                                   [PA_FP8_E5M2] = pa_pack_v_e5m2_amx};
  for (int cache = 0; cache < PA_NUM_DTYPES; cache++) {
    if (!pack_v[cache]) continue;
    pa_attn_ops *ops = &k->attn[PA_BF16][cache];
    ops->pack_v = pack_v[cache];
    ops->qk_packed = pa_qk_packed_bf16_amx;
    ops->pv_packed = pa_pv_packed_bf16_amx;
    ops->packed_p_bf16_rows = 1; /* the A tiles of P V */
    /* Requests for the next tile cost more issue time than they save here
     * (docs/xeon-amx.md); the tiles' reads are in order within a block. */
    ops->packed_unprefetched = 1;
    /* Diagonal groups of whole 2 x 2 blocks of tiles (two row blocks of 16
     * each), not the vector kernels' 6-row blocks (docs/code-figures.md,
     * PA_PARTIAL_TILE_ROWS). */
    ops->partial_tile_rows = 4 * PA_TILE_ROWS;
  }
  static const pa_stage_tiled_fn key_stages[PA_NUM_DTYPES] = {
      [PA_FP8_E4M3] = pa_stage_keys_tiled_e4m3_amx, [PA_FP8_E5M2] = pa_stage_keys_tiled_e5m2_amx};
  static const pa_stage_tiled_fn value_stages[PA_NUM_DTYPES] = {
      [PA_FP8_E4M3] = pa_stage_values_tiled_e4m3_amx,
      [PA_FP8_E5M2] = pa_stage_values_tiled_e5m2_amx};
  for (int cache = 0; cache < PA_NUM_DTYPES; cache++) {
    if (cache != PA_BF16 && !key_stages[cache]) continue;
    pa_attn_ops *tiled = &k->attn[PA_BF16][cache];
    int staged = key_stages[cache] != NULL;
    tiled->qk_tiled = staged ? pa_qk_staged_amx : pa_qk_tiled_bf16_amx;
    tiled->pv_tiled = staged ? pa_pv_staged_amx : pa_pv_tiled_bf16_amx;
    tiled->stage_tiled[0] = key_stages[cache];
    tiled->stage_tiled[1] = value_stages[cache];
    tiled->tiled_head_multiple = PA_TILE_STEP;
    tiled->tiled_whole_tiles = 1; /* each call loads the tile configuration */
    tiled->tiled_preferred = 1;
    tiled->tiled_unprefetched = 1;
  }
  /* f16 over FP8 tiles; the pair's packed kernels (a cache in rows) keep
   * the f32 forms of Q and P. */
  static const pa_stage_tiled_fn values_twice[PA_NUM_DTYPES] = {
      [PA_FP8_E4M3] = pa_stage_values_twice_e4m3_amx,
      [PA_FP8_E5M2] = pa_stage_values_twice_e5m2_amx};
  for (int cache = 0; cache < PA_NUM_DTYPES; cache++) {
    if (!values_twice[cache]) continue;
    pa_attn_ops *tiled = &k->attn[PA_F16][cache];
    tiled->load_q_tiled = pa_load_q_f16_split_amx;
    tiled->tiled_p_split = 1;
    tiled->qk_tiled = pa_qk_staged_split_amx;
    tiled->pv_tiled = pa_pv_staged_twice_amx;
    tiled->stage_tiled[0] = key_stages[cache];
    tiled->stage_tiled[1] = values_twice[cache];
    tiled->tiled_head_multiple = PA_TILE_STEP;
    tiled->tiled_whole_tiles = 1;
    tiled->tiled_preferred = 1;
    tiled->tiled_unprefetched = 1;
  }
}
