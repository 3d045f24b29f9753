/* The micro-kernel interface. Each operation file fills its entries of a
 * pa_kernels table; a family (scalar, avx2, avx512) is the scalar entries
 * overridden by the vector ones the machine supports. The framework builds
 * the table once at context creation and calls through it. Every entry has a scalar version in
 * *-scalar.c that is its specification; the vector ones are unit-tested against it.
 *
 * Conventions: counts are size_t; leading dimensions (ld*) are in elements;
 * K and V rows are given as one pointer per key, which serves the paged
 * cache (rows scattered over blocks) and dense K/V (one strided run) alike.
 *
 * Names: every kernel that a table holds is named pa_<operation>_<dtypes>_
 * <isa>, static or not, so that a profile tells them apart: e.g.
 * pa_qk_f32_bf16_avx512 (Q K^T, Q in f32 over a bf16 cache, AVX-512),
 * pa_pv_packed_bf16_amx, pa_pack_k_e4m3_avx512bf16, pa_softmax_avx2,
 * pa_store_row_f16_scalar. */
#ifndef PA_KERNELS_H
#define PA_KERNELS_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "../common.h"

/* dst[i] = float(src[i]) * factor: f32 out, src of an activation dtype. */
typedef void (*pa_load_row_fn)(void *dst, const void *src, size_t n, float factor);
/* dst[i] = dtype(src[i] * factor), rounded to nearest even. */
typedef void (*pa_store_row_fn)(void *dst, const float *src, size_t n, float factor);
/* dst[i] = cache_dtype(src[i] / scale) for FP8, cache_dtype(src[i]) otherwise. */
typedef void (*pa_encode_row_fn)(void *dst, const float *src, size_t n, float scale);
/* y[i] += a * x[i], the product rounded before the sum (no FMA), so that
 * every family gives the same bits. */
typedef void (*pa_axpy_fn)(float *y, const float *x, size_t n, float a);

/* Memory a kernel asks for while it computes: the next tile's K and V, as
 * address ranges in address order, and this call's share of their cache
 * lines. Requests spread evenly through the compute keep DRAM busy; a burst
 * before or after it does not. A kernel that walks its keys several times
 * (row groups, column blocks) spreads the share over all of its work (see
 * pa_prefetch_span). */
typedef struct pa_prefetch {
  const char *const *start; /* [count] range starts */
  const size_t *bytes;      /* [count] range lengths */
  size_t count;
  size_t next;                    /* the range being issued */
  size_t offset;                  /* bytes of it already issued */
  size_t budget;                  /* lines this call issues */
  size_t issued;                  /* lines this call has issued */
  size_t span_end;                /* issued by the end of the kernel's current loop */
  uint64_t span_begin, span_rate; /* 32.32: issued after step k is begin + rate * k */
  int to_l2;                      /* requests into L2 only (PREFETCHT1), else into L1 too */
} pa_prefetch;

/* S[i][j] = dot(Q[i], K[j]) for i < m, j < n over d elements. Q has leading
 * dimension ldq and the element type its pa_attn_ops loads (f32 for the
 * qk[] entries); K row j is k_rows[j], d elements of the cache dtype, stored
 * values (the FP8 scale is folded into the score factor). */
typedef void (*pa_qk_fn)(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                         const void *const *k_rows, float *s, size_t lds, pa_prefetch *prefetch);

/* O[i][:] = O[i][:] * rescale[i] + sum_j P[i][j] * V[j][:] for i < m,
 * j < n over d columns (rescale NULL: 1). Rescaling here, where O is loaded
 * anyway, makes the online softmax's correction free. A zero rescale[i]
 * discards O's row, so O needs no initialisation before a row's first keys
 * (the softmax's correction is 0 then). Every key is multiplied in, a zero
 * weight too (IEEE arithmetic, as the vector kernels do it: a NaN in V
 * reaches O even where its key was masked). */
typedef void (*pa_pv_fn)(size_t m, size_t n, size_t d, const float *p, size_t ldp,
                         const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                         pa_prefetch *prefetch);

/* Puts one row of O (d floats) from a direct P V's own order into column
 * order, or back (pa_attn_ops.o_to_columns). */
typedef void (*pa_reorder_row_fn)(float *o, size_t d);

/* One key tile's epilogue for m query rows, the online (streaming) softmax
 * in base 2. A raw score s becomes the logit x = s * score_scale, soft-capped
 * (x = c tanh(x / c)), ALiBi-biased (x += slope (j - position)), then
 * x * log2(e); masked keys are dropped. row_max is the running maximum of
 * those base-2 logits, the weights written over S are 2^(x - row_max), and
 * row_sum is their running sum; rescale[i] says by how much row i of O must
 * shrink because its maximum grew (applied by the P V kernel). Row i's keys
 * are first_key .. first_key + n - 1. */
typedef struct pa_softmax_tile {
  size_t m, n;
  int64_t first_key;
  float score_scale;       /* natural-log units per raw score unit */
  float soft_cap;          /* 0: none */
  const float *alibi;      /* [m] slope per row, or NULL */
  const int32_t *position; /* [m] query position per row (for ALiBi) */
  const int32_t *key_lo;   /* [m] row i keeps keys in [key_lo[i], key_hi[i]); */
  const int32_t *key_hi;   /*   NULL: the whole tile is visible to every row */
  float *row_max;          /* [m] running maximum (base 2), -inf before the first key */
  float *row_sum;          /* [m] running sum of 2^(x - row_max) */
  float *rescale;          /* [m] out: factor for row i of O */
  int bf16_weights;        /* the weights will be rounded to bf16: an exp good to ~1e-4 will do */
} pa_softmax_tile;

/* The soft cap's tanh in the vector softmaxes: below |x| = 1/4 the series
 * x + x^3 (c[0] + x^2 (c[1] + x^2 (c[2] + x^2 c[3]))), whose first omitted
 * term is under 1e-8 of tanh(x) there. */
#define PA_TANH_SERIES_BELOW 0.25f
static const float pa_tanh_series[4] = {-1.0f / 3.0f, 2.0f / 15.0f, -17.0f / 315.0f,
                                        62.0f / 2835.0f};

/* 1 / c for the soft cap's tanh(x / c), held to FLT_MAX: a subnormal cap's
 * inverse is inf, and a zero logit times inf NaN. */
static inline float pa_soft_cap_inverse(float cap) {
  float inverse = 1.0f / cap;
  return inverse < FLT_MAX ? inverse : FLT_MAX;
}

#define PA_LOG2E 1.44269504088896341f
#define PA_LN2 0.693147180559945309f
#define PA_LOG2E_D 1.44269504088896340736
#define PA_LN2_D 0.693147180559945309417

typedef void (*pa_softmax_fn)(const pa_softmax_tile *tile, float *s, size_t lds);
/* A softmax_bf16_rows (pa_kernels) is the same epilogue with the weights
 * written as bf16 over the start of each row: weight j of row i at
 * ((uint16_t *)(s + i * lds))[j], rounded to nearest even, then zeros up to
 * n rounded up to PA_BF16_ROW_KEYS; the rest of the row holds anything.
 * The P V kernels that multiply bf16 weights read them there as they lie
 * (pa_attn_ops.packed_p_bf16_rows), instead of converting P themselves. */
enum { PA_BF16_ROW_KEYS = 32 };
static inline size_t pa_bf16_row_keys(size_t n) {
  return (n + PA_BF16_ROW_KEYS - 1) / PA_BF16_ROW_KEYS * PA_BF16_ROW_KEYS;
}

/* A softmax_split_rows (pa_kernels) writes each weight w as two bf16 over
 * its own float: the high part h = bf16(w) in the low half, the rest
 * bf16(w - h) in the high half (h + rest is w to 2^-18, where one bf16
 * is 2^-9 off: for f16 activations), then zero pairs up to n rounded
 * up to PA_SPLIT_ROW_KEYS. P V kernels over values whose every bf16 pair is
 * one value twice take these pairs as they lie (pa_attn_ops.tiled_p_split). */
enum { PA_SPLIT_ROW_KEYS = 16 };
static inline size_t pa_split_row_keys(size_t n) {
  return (n + PA_SPLIT_ROW_KEYS - 1) / PA_SPLIT_ROW_KEYS * PA_SPLIT_ROW_KEYS;
}

/* Packed tiles, for many query rows at once (prefill): a tile of up to
 * PA_PACK_KEYS keys is packed once into the micro-kernels' layout and then
 * used by every row. Layouts (ldv = d rounded up to 16, zero padding):
 *   f32 K:  kt[e * PA_PACK_KEYS + j] = k_j[e]          (e < d; j >= n: 0)
 *   f32 V:  v[j * ldv + e] = v_j[e]                    (j < n)
 *   bf16 K: pairs kt[(e / 2) * PA_PACK_KEYS + j] = (k_j[e], k_j[e + 1])
 *   bf16 V: pairs v[(j / 2) * ldv + e] = (v_j[e], v_{j+1}[e]) (v_n = 0)
 * A family whose kernels walk the tile otherwise may pack it in an order of
 * its own (AVX2: 16-key panels, prefill-avx2.c; AVX-512 f32: 64-key and
 * 64-column panels, prefill-avx512.c); a pack and the products that read
 * it always come from one family. Each fits in
 * pa_packed_bytes(d). */
enum { PA_PACK_KEYS = 128 };

/* pa_attn_ops.partial_tile_rows by default: 8 register blocks of 6 rows
 * (docs/code-figures.md, PA_PARTIAL_TILE_ROWS). */
enum { PA_PARTIAL_TILE_ROWS = 48 };

static inline size_t pa_packed_bytes(size_t d) {
  return (size_t)PA_PACK_KEYS * ((d + 31) / 32 * 32) * sizeof(float);
}

/* Packs rows[0..n) (n <= PA_PACK_KEYS rows of d cache-dtype elements). */
typedef void (*pa_pack_fn)(void *dst, const void *const *rows, size_t n, size_t d);
/* S[i][j] = dot(Q[i], K[j]) over a packed K tile (columns up to n rounded up
 * to the family's block of keys, 16 or 64, are written; those past n hold
 * zeros' dot products). Like the
 * direct kernels, these spend `prefetch` (NULL: nothing) over their loops. */
typedef void (*pa_qk_packed_fn)(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                                const void *k_packed, float *s, size_t lds, pa_prefetch *prefetch);
/* O[i][:] = O[i][:] * rescale[i] + sum_j P[i][j] V[j][:] over a packed V tile.
 * P is f32, or the bf16 rows of a softmax_bf16_rows where the pair's
 * packed_p_bf16_rows is set; ldp counts floats either way (S's stride). */
typedef void (*pa_pv_packed_fn)(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                                const void *v_packed, float *o, size_t ldo, const float *rescale,
                                pa_prefetch *prefetch);

/* Tiled caches (pa_kv_layout PA_KV_TILED). A key's or value's anchor is
 * where its element 0 lies (pa_tiled_key_anchor, pa_tiled_value_anchor).
 *
 * rows[i][e] = element e of the key (side 0) or value (side 1) anchored at
 * anchors[i], for i < n, e < d: rows of elem_size-byte elements, d apart;
 * block_size places the values' column groups. */
typedef void (*pa_unpack_tiled_fn)(void *rows, const void *const *anchors, size_t n, size_t d,
                                   size_t elem_size, size_t block_size);

/* The products read from the tiles in place. Keys [0, n) of a call are
 * consecutive tokens of a sequence from a multiple of PA_TILED_STEP on
 * (key 0 starts a 16-token group and a pair of them, when the block holds
 * whole pairs); keys past n in their group may hold anything, NaN
 * included, and must not reach O. Q K^T writes S columns up to n rounded
 * up to 16; otherwise these are the packed kernels' contracts. */
enum { PA_TILED_STEP = 32 };
/* Both take `stage`, pa_packed_bytes(d) bytes of scratch: what the pair's
 * stage_tiled left there (pa_attn_ops), or room for a copy of V where the
 * blocks hold no whole steps of the tiles. */
typedef void (*pa_qk_tiled_fn)(size_t m, size_t n, size_t d, const void *q, size_t ldq,
                               const void *const *k_anchors, void *stage, float *s, size_t lds,
                               pa_prefetch *prefetch);
typedef void (*pa_pv_tiled_fn)(size_t m, size_t n, size_t d, const void *p, size_t ldp,
                               const void *const *v_anchors, size_t block_size, void *stage,
                               float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch);
/* Keys [0, n) of one KV head's tile (anchors as for qk_tiled, block_size as
 * for pv_tiled) converted into `stage` (pa_packed_bytes(d) bytes), where
 * the pair's qk_tiled (side 0) or pv_tiled (side 1) then reads them: for
 * caches whose elements the tiles cannot take as they are (FP8). */
typedef void (*pa_stage_tiled_fn)(void *stage, const void *const *anchors, size_t n, size_t d,
                                  size_t block_size);

/* The kernels attention runs for one (activation, cache) dtype pair. Q rows
 * sit in scratch with a stride of d rounded up to 64 elements; Q is loaded
 * into q_size-byte elements: f32 already multiplied by the
 * score factor (scale_scores 0), or kept as it is with the factor applied to
 * the scores by the softmax (scale_scores 1), for dot-product instructions
 * that take narrow inputs. */
typedef struct pa_attn_ops {
  pa_load_row_fn load_q;        /* for qk; writes d elements, or up to d rounded up to 64 */
  pa_load_row_fn load_q_packed; /* for qk_packed */
  size_t q_size;
  int scale_scores;
  int p_bf16;  /* P V takes P rounded to bf16 (the softmax's weights need no more) */
  pa_qk_fn qk; /* direct: few rows (decode) */
  pa_pv_fn pv;
  /* Where set, pv keeps O's rows in an order of its own from one call to
   * the next (a permutation within each whole group of columns, the order
   * its accumulators hold them in), so that a call loads and stores them as
   * they are: o_to_columns puts a row in column order once the item's keys
   * are done, o_from_columns the other way. NULL: column order. */
  pa_reorder_row_fn o_to_columns;
  pa_reorder_row_fn o_from_columns;
  pa_pack_fn pack_k; /* packed: many rows (prefill) */
  pa_pack_fn pack_v;
  pa_qk_packed_fn qk_packed;
  pa_pv_packed_fn pv_packed;
  /* pv_packed and pv_tiled take P as the bf16 rows of the family's
   * softmax_bf16_rows, not f32 (the direct pv keeps f32). */
  int packed_p_bf16_rows;
  /* Where set, Q for qk_tiled is loaded by this instead of load_q_packed,
   * and pv_tiled takes P as the pairs of softmax_split_rows (tiled_p_split):
   * the tiles' kernels of a pair whose packed kernels keep other forms. */
  pa_load_row_fn load_q_tiled;
  int tiled_p_split;
  /* The tiles' kernels are given no requests for the next tile, as
   * packed_unprefetched says for the packed ones; a direct item's tiles
   * request its own reads just ahead instead (attend_tile). */
  int tiled_unprefetched;
  /* Items with this many query rows per KV head or more (a prompt chunk,
   * a long speculative decode) take the packed kernels: where they start to
   * beat the direct ones from DRAM (the family's f32 figure unless the pair
   * sets its own; docs/decode-memory.md). */
  size_t packed_min_rows;
  /* Rows per packed call on a tile that some rows see only in part (the
   * causal diagonal), in groups of whole query tokens, each over only the
   * keys its rows see: whole register blocks of the pair's packed kernels
   * (PA_PARTIAL_TILE_ROWS unless the pair sets its own). */
  size_t partial_tile_rows;
  /* The packed kernels are given no requests for the next tile: they
   * compute a tile faster than issuing its requests pays back (AMX). */
  int packed_unprefetched;
  /* For every item over a tiled cache, when set (the loop of the packed
   * kernels, without packing); NULL: such a cache is unpacked per tile. */
  pa_qk_tiled_fn qk_tiled;
  pa_pv_tiled_fn pv_tiled;
  /* When set, run once per KV head and tile before the products of that
   * side, which then read the stage instead of the anchors. */
  pa_stage_tiled_fn stage_tiled[2];
  size_t tiled_head_multiple; /* they serve head sizes that are multiples of this */
  int tiled_whole_tiles;      /* they want whole key tiles (a direct item's short ones cost) */
  int tiled_preferred;        /* pa_kv_layout_preferred names the tiles: they beat rows here */
} pa_attn_ops;

typedef struct pa_kernels {
  const char *isa;
  int bf16_dot;       /* bf16 caches' products on the dot products (else the FMA units) */
  int prefetch_to_l2; /* the next tile's requests into L2 only (pa_prefetch.to_l2) */
  pa_load_row_fn load_row[PA_NUM_ACT_DTYPES];   /* by activation dtype */
  pa_store_row_fn store_row[PA_NUM_ACT_DTYPES]; /* by activation dtype */
  pa_encode_row_fn encode_row[PA_NUM_DTYPES];   /* by cache dtype */
  pa_axpy_fn axpy;                              /* the split-K merge */
  pa_unpack_tiled_fn unpack_tiled[2];           /* keys, values */
  pa_qk_fn qk[PA_NUM_DTYPES];                   /* by K dtype */
  pa_pv_fn pv[PA_NUM_DTYPES];                   /* by V dtype */
  pa_softmax_fn softmax;
  pa_softmax_fn softmax_bf16_rows;  /* see pa_softmax_fn */
  pa_softmax_fn softmax_split_rows; /* see PA_SPLIT_ROW_KEYS */
  pa_pack_fn pack_k[PA_NUM_DTYPES]; /* f32 layouts, by cache dtype */
  pa_pack_fn pack_v[PA_NUM_DTYPES];
  pa_qk_packed_fn qk_packed;
  pa_pv_packed_fn pv_packed;
  size_t packed_min_rows; /* for pa_attn_ops, set with qk_packed */
  /* By activation and cache dtype; entries no family sets get the f32
   * path: load_row[act], qk[cache], pv[cache], pack_*[cache], *_packed. */
  pa_attn_ops attn[PA_NUM_ACT_DTYPES][PA_NUM_DTYPES];
  /* NULL, or the family's kernels keep a thread's tile configuration
   * loaded from one call to the next (docs/xeon-amx.md, "The tile
   * configuration"): whoever calls them calls this on that thread before
   * it runs other tile code or returns to the library's caller, who then
   * finds the tiles released, as after any call of the library. */
  void (*release_tiles)(void);
} pa_kernels;

/* O[i][:] *= rescale[i] (nothing when rescale is NULL; a zero factor
 * discards the row, which may be uninitialised): the part of a P V
 * kernel's contract the scalar kernels share. */
static inline void pa_rescale_rows_scalar(size_t m, size_t d, float *o, size_t ldo,
                                          const float *rescale) {
  if (!rescale) return;
  for (size_t i = 0; i < m; i++) {
    if (rescale[i] == 1.0f) continue;
    for (size_t e = 0; e < d; e++)
      o[i * ldo + e] = rescale[i] == 0.0f ? 0.0f : o[i * ldo + e] * rescale[i];
  }
}

/* rescale offset to row i (NULL stays NULL). */
static inline const float *pa_rescale_from(const float *rescale, size_t i) {
  return rescale ? rescale + i : NULL;
}

/* The `keys` (a register block's count) K rows from key j of n into k,
 * returning how many exist: a block that runs past n repeats its last
 * row, so that the block reads only rows it was given and its surplus
 * sums are computed but not stored. */
static inline size_t pa_key_block(const void *const *k_rows, size_t j, int keys, size_t n,
                                  const void **k) {
  size_t valid = PA_MIN(n - j, (size_t)keys);
  for (int t = 0; t < keys; t++) k[t] = k_rows[j + PA_MIN((size_t)t, valid - 1)];
  return valid;
}

/* The row kernels of a family: pa_axpy_<isa> and the load, store and
 * encode rows of the three activation dtypes (FP8 encoding is the scalar
 * family's alone). */
#define PA_SET_ROW_KERNELS(k, isa)                       \
  do {                                                   \
    (k)->axpy = pa_axpy_##isa;                           \
    (k)->load_row[PA_F32] = pa_load_row_f32_##isa;       \
    (k)->load_row[PA_F16] = pa_load_row_f16_##isa;       \
    (k)->load_row[PA_BF16] = pa_load_row_bf16_##isa;     \
    (k)->store_row[PA_F32] = pa_store_row_f32_##isa;     \
    (k)->store_row[PA_F16] = pa_store_row_f16_##isa;     \
    (k)->store_row[PA_BF16] = pa_store_row_bf16_##isa;   \
    (k)->encode_row[PA_F32] = pa_encode_row_f32_##isa;   \
    (k)->encode_row[PA_F16] = pa_encode_row_f16_##isa;   \
    (k)->encode_row[PA_BF16] = pa_encode_row_bf16_##isa; \
  } while (0)

/* Fills table[dtype] with the five functions prefix_f32_isa .. prefix_e5m2_isa of a
 * registration function's file. */
#define PA_SET_PER_DTYPE(table, prefix, isa)    \
  do {                                          \
    (table)[PA_F32] = prefix##_f32_##isa;       \
    (table)[PA_F16] = prefix##_f16_##isa;       \
    (table)[PA_BF16] = prefix##_bf16_##isa;     \
    (table)[PA_FP8_E4M3] = prefix##_e4m3_##isa; \
    (table)[PA_FP8_E5M2] = prefix##_e5m2_##isa; \
  } while (0)

/* Runs `body` with `width` (a size_t) equal to the head size d, as a
 * compile-time constant for head sizes 128 and 64: an inlined kernel's
 * loop over a row then has a constant trip count and no tail, and unrolls
 * (PA_FOR_CHUNKS; docs/decode-memory.md, "The Q K^T block's own
 * overhead"). Each copy costs build time, most in sanitizer builds: hence
 * two sizes. */
#define PA_WITH_HEAD_SIZE(d, width, body) \
  do {                                    \
    if ((d) == 128) {                     \
      const size_t width = 128;           \
      body;                               \
    } else if ((d) == 64) {               \
      const size_t width = 64;            \
      body;                               \
    } else {                              \
      const size_t width = (d);           \
      body;                               \
    }                                     \
  } while (0)

/* Rows [0, m) in groups of 4, then one group of the 3, 2 or 1 left, so
 * that a P V kernel reads each V row once per group. GROUP(rows, i) is a
 * function-like macro of the kernel file that runs `rows` rows from row i. */
#define PA_ROW_GROUPS_OF_4(m, GROUP)                            \
  do {                                                          \
    size_t pa_row_ = 0;                                         \
    for (; pa_row_ + 4 <= (m); pa_row_ += 4) GROUP(4, pa_row_); \
    switch ((m)-pa_row_) {                                      \
      case 3: GROUP(3, pa_row_); break;                         \
      case 2: GROUP(2, pa_row_); break;                         \
      case 1: GROUP(1, pa_row_); break;                         \
      default: break;                                           \
    }                                                           \
  } while (0)

/* for (size_t var = 0; var < limit; var += step) { ... }, unrolled in full
 * (`unroll`: "GCC unroll N") where `limit` is a compile-time constant, as
 * PA_WITH_HEAD_SIZE makes it, and left rolled where it is not: unrolling a
 * run-time loop only bloats it (and multiplies the sanitizer build's time;
 * docs/code-figures.md, PA_FOR_CHUNKS). */
#define PA_FOR_CHUNKS(var, limit, step, unroll, ...)                                     \
  do {                                                                                   \
    if (__builtin_constant_p(limit)) {                                                   \
      _Pragma(unroll) for (size_t var = 0; var < (limit); var += (step)) { __VA_ARGS__ } \
    } else {                                                                             \
      for (size_t var = 0; var < (limit); var += (step)) {                               \
        __VA_ARGS__                                                                      \
      }                                                                                  \
    }                                                                                    \
  } while (0)

/* Registration: each fills the entries of one operation file. */
void pa_convert_kernels_scalar(pa_kernels *k);
void pa_attn_kernels_scalar(pa_kernels *k);
void pa_prefill_kernels_scalar(pa_kernels *k);
void pa_tiled_kernels_scalar(pa_kernels *k);
#if defined(PA_HAVE_X86_KERNELS)
void pa_convert_kernels_avx2(pa_kernels *k);
void pa_attn_kernels_avx2(pa_kernels *k);
void pa_prefill_kernels_avx2(pa_kernels *k);
void pa_convert_kernels_avx512(pa_kernels *k);
void pa_attn_kernels_avx512(pa_kernels *k);
void pa_attn_split_kernels_avx512(pa_kernels *k);
void pa_prefill_kernels_avx512(pa_kernels *k);
void pa_convert_kernels_avx512bf16(pa_kernels *k);
void pa_attn_kernels_avx512bf16(pa_kernels *k, int dot);
void pa_prefill_kernels_avx512bf16(pa_kernels *k, int bf16_pairs);
double pa_bf16_dot_cost_avx512bf16(void);
void pa_attn_fp8_kernels_avx512bf16(pa_kernels *k);
void pa_attn_fp8_fma_kernels_avx512bf16(pa_kernels *k);
void pa_prefill_kernels_amx(pa_kernels *k);
#endif

#endif
