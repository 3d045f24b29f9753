/*
 * An independent reference for the pagedattn tests. It shares no code with
 * the library (not even the header's enums) so that a misunderstanding in
 * one does not hide in the other: its own dtype codecs, written from the bit
 * definitions, and a double-precision attention that walks the block table
 * with a plain loop.
 */
#ifndef PA_REFERENCE_H
#define PA_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

/* Same order as pa_dtype / pa_attn_type; the API tests assert that. */
typedef enum ref_dtype { REF_F32, REF_F16, REF_BF16, REF_E4M3, REF_E5M2 } ref_dtype;
typedef enum ref_attn { REF_DECODER, REF_ENCODER, REF_ENCODER_ONLY, REF_ENCODER_DECODER } ref_attn;

/* ---- codecs ---------------------------------------------------------------
 * Decoding is exact (every value of these formats is a float). Encoding
 * rounds to nearest, ties to even. F16/BF16 overflow to infinity; FP8
 * saturates to +-448 (E4M3) / +-57344 (E5M2), infinities included. NaN
 * encodes to a NaN and the sign of zero is kept. */
float ref_f16_decode(uint16_t bits);
uint16_t ref_f16_encode(float x);
float ref_bf16_decode(uint16_t bits);
uint16_t ref_bf16_encode(float x);
float ref_e4m3_decode(uint8_t bits);
uint8_t ref_e4m3_encode(float x);
float ref_e5m2_decode(uint8_t bits);
uint8_t ref_e5m2_encode(float x);

const char *ref_dtype_name(ref_dtype t);
size_t ref_dtype_size(ref_dtype t);
/* Element i of an array of dtype t, decoded (no FP8 scale applied). */
float ref_load(const void *base, int64_t i, ref_dtype t);
/* Encode x into element i (no FP8 scale applied). */
void ref_store(void *base, int64_t i, ref_dtype t, float x);
/* x rounded to dtype t and back: what storing then loading gives. */
float ref_round(float x, ref_dtype t);

/* ---- attention ------------------------------------------------------------ */

typedef struct ref_layer {
  int num_heads;
  int num_kv_heads; /* already resolved: divides num_heads */
  int head_size;
  double scale;              /* already resolved: 1/sqrt(head_size) if the config had 0 */
  const float *alibi_slopes; /* [num_heads] or NULL */
  int sliding_window;        /* 0: none */
  double soft_cap;           /* 0: none */
  const float *sinks;        /* [num_heads] or NULL */
  ref_attn attn_type;
} ref_layer;

/* The dense mask of one sequence: mask[r * k_len + j] = 1 when query row r
 * (position k_len - q_len + r) may see key j. */
void ref_build_mask(const ref_layer *layer, int q_len, int k_len, unsigned char *mask);

/* One sequence. q: [q_len][num_heads * head_size]; k, v: [k_len][num_kv_heads
 * * head_size]; out: [q_len][num_heads * head_size]; lse: [q_len][num_heads]
 * (natural log of the softmax denominator, sink included; -INFINITY and a
 * zero output for a row that sees no key). */
void ref_attention_seq(const ref_layer *layer, int q_len, int k_len, const double *q,
                       const double *k, const double *v, double *out, double *lse);

/* The order of the elements inside a (block, KV head) tile, the same
 * numbers as pa_kv_layout. REF_ROWS: element e of token offset t at
 * t * head_size + e. REF_TILED (block_size and head_size multiples of 16):
 * keys in 16-token groups of element pairs,
 *   (t / 16) * 16 * head_size + (e / 2) * 32 + (t % 16) * 2 + e % 2,
 * values in 16-element column groups of token pairs,
 *   (e / 16) * 16 * block_size + (t / 2) * 32 + (e % 16) * 2 + t % 2. */
typedef enum ref_layout { REF_ROWS, REF_TILED } ref_layout;

/* Where element e of token offset t lies within its tile, for keys (side
 * 0) or values (side 1) in a tile of block_size tokens of head_size
 * elements ordered by layout. */
int64_t ref_tile_offset(ref_layout layout, int side, int block_size, int head_size, int t, int e);

typedef struct ref_cache {
  const void *key; /* tiles of block_size x head_size elements per block and KV head */
  const void *value;
  int64_t num_blocks;
  int block_size;
  int num_kv_heads;
  int head_size;
  ref_dtype dtype;
  double k_scale; /* applied to FP8 only */
  double v_scale;
  /* Elements from one block's tiles to the next's, and from one KV head's
   * tile to the next's; 0: the dense [num_blocks][num_kv_heads][block_size]
   * [head_size] layout. */
  int64_t block_stride, head_stride;
  ref_layout layout; /* the order inside each tile */
} ref_cache;

/* Element index, within key (side 0) or value (side 1), of dimension c of
 * token offset t of KV head h in block b. */
int64_t ref_cache_index(const ref_cache *cache, int side, int64_t b, int h, int t, int c);

/* The first seq_len tokens of a sequence, in order, read through its block
 * table row: k, v are [seq_len][num_kv_heads * head_size], scaled. */
void ref_gather_paged(const ref_cache *cache, const int32_t *block_table_row, int seq_len,
                      double *k, double *v);

/* rows x width elements of dtype t starting at row first, rows stride apart. */
void ref_load_rows(const void *base, int64_t stride, ref_dtype t, int64_t first, int64_t rows,
                   int width, double *dst);

/* The whole batch over a paged cache. out: [total_rows][num_heads *
 * head_size]; lse: [total_rows][num_heads]; vmax (may be NULL):
 * [total_rows], the largest |v| among the keys of the row's sequence, which
 * sizes the absolute tolerance. */
void ref_paged_attention(const ref_layer *layer, ref_dtype act, const void *query,
                         int64_t query_stride, const ref_cache *cache, int num_seqs,
                         const int32_t *query_start_loc, const int32_t *seq_lens,
                         const int32_t *block_tables, int block_table_stride, double *out,
                         double *lse, double *vmax);

/* Dense ragged attention; key/value rows are of dtype act. */
void ref_varlen_attention(const ref_layer *layer, ref_dtype act, const void *query,
                          int64_t query_stride, const void *key, int64_t key_stride,
                          const void *value, int64_t value_stride, int num_seqs,
                          const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, double *out,
                          double *lse, double *vmax);

/* ---- merging partial states ------------------------------------------------ */

/* Two partial results of the same rows over disjoint key sets, combined in
 * double from their definitions: out = (e^la out_a + e^lb out_b) / (e^la +
 * e^lb), lse = log(e^la + e^lb), computed relative to the larger lse. A
 * side whose lse is -inf contributes nothing (its values are not read); -inf
 * on both sides gives zeros and -inf. out_a, out_b: rows of num_heads *
 * head_size elements of dtype t, a_stride and b_stride apart; lse_*:
 * [num_rows][num_heads]; out: [num_rows][num_heads * head_size] doubles;
 * lse: [num_rows][num_heads]. */
void ref_merge_states(int64_t num_rows, int num_heads, int head_size, ref_dtype t,
                      const void *out_a, int64_t a_stride, const float *lse_a, const void *out_b,
                      int64_t b_stride, const float *lse_b, double *out, double *lse);

#endif /* PA_REFERENCE_H */
