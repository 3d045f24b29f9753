/* Execution of a plan: the online-softmax loop over key tiles for one work
 * item, and the merge of split-K partial results. Validation is done before
 * any of this runs. */
#ifndef PA_ATTEND_H
#define PA_ATTEND_H

#include "plan.h"

/* Where the keys and values of a sequence live: the paged cache (rows found
 * through the block table) or dense K/V rows (block_tables NULL). */
typedef struct pa_kv_source {
  const char *key, *value;
  pa_dtype dtype;
  /* Paged. */
  const int32_t *block_tables;
  int64_t block_table_stride;
  int64_t block_size;
  int64_t block_bytes; /* from one block to the next */
  int64_t head_bytes;  /* from one KV head's rows to the next's (paged and dense) */
  int heads_adjacent;  /* a block's tiles are one run of bytes (the dense layout) */
  int64_t token_bytes; /* one token of one KV head */
  int tiled;           /* PA_KV_TILED: rows are the tokens' anchors (pa_tiled_key_anchor) */
  /* Dense. */
  const int32_t *row_starts; /* [num_seqs + 1] cumulative key rows */
  int64_t key_row_bytes, value_row_bytes;
} pa_kv_source;

typedef struct pa_attention_call {
  const pa_kernels *kernels;
  const pa_attn_ops *ops; /* for the layer's and the K/V's dtypes */
  const pa_layer *layer;
  const pa_plan *plan;
  pa_mask mask;
  const char *query;
  int64_t query_row_bytes;
  char *out;
  int64_t out_row_bytes;
  float *lse;
  pa_kv_source kv;
  float q_factor; /* softmax scale times the K dequantisation scale */
  float v_factor; /* the V dequantisation scale */
  void *const *thread_scratch;
  float *partials;
} pa_attention_call;

/* Runs the plan's items and merges, on the context's pool. */
void pa_attention_run(pa_context *ctx, const pa_attention_call *call);

#endif
