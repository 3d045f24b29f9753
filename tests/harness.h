/*
 * Library-facing helpers shared by the API tests: activation buffers, the
 * expected bytes of a cache after pa_write_kv, and the comparison of outputs
 * with the reference (tolerances and canaries live here, in one place).
 */
#ifndef PA_TEST_HARNESS_H
#define PA_TEST_HARNESS_H

#include <stdint.h>

#include "pagedattn.h"
#include "reference.h"
#include "test_util.h"

static inline ref_dtype hx_ref_dtype(pa_dtype t) { return (ref_dtype)t; }
static inline ref_attn hx_ref_attn(pa_attn_type t) { return (ref_attn)t; }
const char *hx_attn_name(pa_attn_type t);

/* rows x stride elements of dtype t. */
void *hx_alloc_rows(int64_t rows, int64_t stride, pa_dtype t);
/* Rows of width values uniform in [-mag, mag), rounded to dtype t. The
 * elements between width and stride hold NaN: a kernel that uses them shows. */
void hx_fill_rows(tu_rng *rng, void *buf, int64_t stride, int64_t rows, int width, pa_dtype t,
                  double mag);
/* Every element of every tile of a cache side: finite values in [-mag,
 * mag) (stale data an engine may leave in free slots), or NaN when poison is
 * set: in a tiled cache (PA_KV_TILED) too, every element of every token
 * inside each tile, wherever the layout puts it, so that the tokens past a
 * sequence's end in its 16-token group (keys) or token pair (values) stay
 * NaN once the sequence's own are written. Memory between tiles is left
 * alone. */
void hx_fill_cache(tu_rng *rng, const pa_kv_cache *cache, double mag, int poison);
/* Elements (bytes) of a side's tiles: num_blocks x num_kv_heads x
 * block_size x head_size, what a dense image of the side holds. */
int64_t hx_cache_elems(const pa_kv_cache *cache);
size_t hx_cache_bytes(const pa_kv_cache *cache);

/* ---- cache layouts -------------------------------------------------------- */

/* The layouts the tests put caches in (pa_kv_cache's block_stride and
 * head_stride). */
typedef enum hx_layout {
  HX_DENSE,           /* zero strides; two buffers of exactly the tiles */
  HX_DENSE_EXPLICIT,  /* the dense strides, given explicitly */
  HX_BLOCK_PADDED,    /* adjacent heads, padding after each block */
  HX_VLLM,            /* one buffer [num_blocks][num_kv_heads][2 * block_size][head_size] */
  HX_VLLM_PADDED,     /* one buffer, padding in each head's slot and after each block */
  HX_SEPARATE_PADDED, /* two buffers, padding before them, after each tile, block and the end */
  HX_NUM_LAYOUTS
} hx_layout;
const char *hx_layout_name(hx_layout layout);

/* Bytes outside the tiles hold this: a NaN in every cache dtype, so a
 * kernel that reads padding shows in its output. */
#define HX_PAD_BYTE 0xFF

/* The buffers behind a cache: buf[1] is NULL when key and value share
 * buf[0]. */
typedef struct hx_cache_mem {
  unsigned char *buf[2];
  size_t bytes[2];
} hx_cache_mem;

/* Element index within a side of the start of KV head h's tile in block
 * b, through the cache's strides, plus t * head_size: with t = 0 the
 * tile's first element in either layout, otherwise the start of token
 * offset t's row in a PA_KV_ROWS cache (use hx_elem_index for elements). */
int64_t hx_tile_index(const pa_kv_cache *cache, int64_t b, int h, int t);
/* Element index within key (side 0) or value (side 1) of element e of
 * token offset t of KV head h in block b: the strides place the tile, the
 * cache's layout orders the elements in it (the reference's
 * ref_tile_offset, written from the header, not from the library). */
int64_t hx_elem_index(const pa_kv_cache *cache, int side, int64_t b, int h, int t, int e);
/* The reference's view of a cache (strides and layout included). */
ref_cache hx_ref_cache(const pa_kv_cache *cache);
/* Elements from a side's pointer to the end of its last tile. */
int64_t hx_cache_span(const pa_kv_cache *cache);
/* Sets the strides, key and value of a cache whose geometry and dtype are
 * set, over new buffers filled with HX_PAD_BYTE (padding sizes from rng). */
void hx_cache_alloc(tu_rng *rng, pa_kv_cache *cache, hx_layout layout, hx_cache_mem *mem);
void hx_cache_free(hx_cache_mem *mem);
/* Copies side 0 (keys) or 1 (values) of a cache into a dense image, and
 * back. The image is [num_blocks][num_kv_heads][block_size][head_size] in
 * either layout: a tiled cache's elements are gathered into token rows
 * (hx_elem_index), so images of a rows and a tiled cache compare, and
 * hx_expect_write and hx_compare_cache work on both. */
void hx_gather_tiles(const pa_kv_cache *cache, int side, unsigned char *dense);
void hx_scatter_tiles(const pa_kv_cache *cache, int side, const unsigned char *dense);
/* Fails for every byte of the buffers outside the tiles that no longer
 * holds HX_PAD_BYTE; returns how many. */
long hx_check_padding(const char *label, const pa_kv_cache *cache, const hx_cache_mem *mem);

/* What pa_write_kv must leave in a cache: applies the write to the images
 * (dense copies of the cache's tiles, hx_gather_tiles) in token order,
 * skipping negative slots.
 * exact_* gets encode(x / scale) with the quotient rounded to f32 once;
 * alt_* the same but with x * (1 / scale), which the contract's "stores
 * value / scale" also allows (they differ only for FP8 and only when the two
 * quotients straddle an FP8 rounding boundary). alt_* may be NULL for
 * non-FP8 caches. */
void hx_expect_write(const pa_kv_cache *cache, unsigned char *exact_key, unsigned char *exact_val,
                     unsigned char *alt_key, unsigned char *alt_val, const void *key,
                     int64_t key_stride, const void *value, int64_t value_stride,
                     pa_dtype src_dtype, int64_t num_tokens, const int64_t *slot_mapping);
/* Compares both sides of the cache (its tiles, gathered) with dense images
 * (NaN matches any NaN). Returns the number of mismatching elements and
 * reports the first ones. */
long hx_compare_cache(const char *label, const pa_kv_cache *cache, const unsigned char *exact_key,
                      const unsigned char *exact_val, const unsigned char *alt_key,
                      const unsigned char *alt_val);

/* Cache elements that matched only the x * (1 / scale) variant. */
extern long hx_alt_matches;
/* The largest |out - ref| / tolerance seen so far, by activation dtype: how
 * much room the tolerances leave. */
extern double hx_worst_ratio[3];

/* Tolerances, see harness.c for why. */
typedef struct hx_tol {
  double rtol;
  double atol; /* multiplied by the largest |v| of the row's sequence */
} hx_tol;
hx_tol hx_tolerance(pa_dtype act);
#define HX_LSE_ATOL 1e-3

/* Checks rows [0, rows) of out and lse against the reference (a row and
 * head that sees no key must hold exact zeros and -inf) and that the
 * library wrote nothing else: the padding of each row up to out_stride, the
 * extra_rows rows after them, and lse_extra floats after lse's rows must
 * still hold the canary. lse may be NULL. Returns the number of failures. */
long hx_check_outputs(const char *label, pa_dtype act, int num_heads, int head_size, int64_t rows,
                      const void *out, int64_t out_stride, int extra_rows, const float *lse,
                      int lse_extra, const double *ref_out, const double *ref_lse,
                      const double *vmax);

#endif /* PA_TEST_HARNESS_H */
