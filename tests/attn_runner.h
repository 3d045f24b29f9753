/*
 * The runner of the attention tests: one attn_case (shapes, dtypes,
 * features, batch) becomes a layer, a paged cache written through
 * pa_write_kv (whose bytes are checked), a query, outputs with canaries, and
 * a call of pa_paged_attention or pa_varlen_attention compared with the
 * reference. test_attention.c holds the cases.
 */
#ifndef PA_TEST_ATTN_RUNNER_H
#define PA_TEST_ATTN_RUNNER_H

#include "harness.h"

#define AR_MAX_SEQS 12
#define AR_EXTRA_OUT_ROWS 2 /* canary rows after the batch's output rows */
#define AR_EXTRA_LSE 8      /* canary floats after the batch's lse entries */

/* Contexts with 1, 2 and 3 threads: the work splits differ with each. The
 * test creates them; cases name one by index. */
#define AR_NUM_CTX 3
extern const int ar_ctx_threads[AR_NUM_CTX];
extern pa_context *ar_ctx[AR_NUM_CTX];

typedef struct attn_case {
  const char *group;
  uint64_t seed;                        /* the data of this case */
  int varlen;                           /* pa_varlen_attention instead of pa_paged_attention */
  pa_dtype act, cache_dtype, src_dtype; /* src_dtype: of the rows given to pa_write_kv */
  int num_heads;
  int num_kv_heads; /* as given to the config: 0 means num_heads */
  int head_size;
  int block_size;
  float scale; /* as given to the config: 0 means 1/sqrt(head_size) */
  int alibi, sinks, window;
  float soft_cap;
  float sink_offset; /* added to every sink drawn (-3 to 6) */
  pa_attn_type type;
  int num_seqs;
  int q_len[AR_MAX_SEQS];
  int seq_len[AR_MAX_SEQS]; /* keys: cache tokens, or varlen key rows */
  int ctx;                  /* index into ar_ctx */
  int plan;                 /* 0: none; 1: made for this layer; 2: made for a sibling layer */
  int lse;                  /* ask for lse */
  int shuffle;              /* physical blocks in random order */
  int pad;                  /* extra elements per row of every activation buffer */
  int poison;               /* NaN in every cache slot no sequence owns */
  hx_layout layout;         /* the cache's strides (NaN in every byte between tiles) */
  pa_kv_layout kv_layout;   /* the order inside each tile (0.3): PA_KV_ROWS or PA_KV_TILED */
  int fused;                /* varlen: q, k, v are views of one QKV buffer */
  float k_scale, v_scale;
  double q_mag, k_mag, v_mag;
} attn_case;

int ar_kv_heads(const attn_case *c); /* num_kv_heads resolved */
void ar_describe(const attn_case *c, char *buf, size_t size);
void ar_run_paged(const attn_case *c, const char *tag);
void ar_run_varlen(const attn_case *c, const char *tag);

typedef struct layer_bundle {
  pa_layer *layer;
  ref_layer ref;
  float *slopes, *sinks;
} layer_bundle;

typedef struct outputs {
  void *out;
  int64_t stride;
  float *lse;
  double *ref_out, *ref_lse, *vmax;
} outputs;

typedef struct paged_setup {
  pa_kv_cache cache;
  hx_cache_mem mem;
  int32_t *block_tables;
  int bt_stride;
} paged_setup;

/* One paged case, in steps, so that several can be called concurrently. */
typedef struct paged_run {
  const attn_case *c;
  layer_bundle lb;
  paged_setup p;
  int32_t qsl[AR_MAX_SEQS + 1], seq_lens[AR_MAX_SEQS + 1];
  pa_batch batch;
  void *q;
  int64_t qstride, rows;
  outputs o;
  pa_plan *plan;
  unsigned char *inputs_copy; /* cache buffers and query before the call */
} paged_run;

/* Layer, cache (written through pa_write_kv and checked), query, outputs
 * and plan; 0 if a step failed (and was reported). */
int ar_paged_prepare(const attn_case *c, const char *tag, paged_run *r);
pa_status ar_paged_call(paged_run *r, pa_context *ctx);
/* Compares the outputs of the call that returned st with the reference. */
void ar_paged_check(paged_run *r, const char *tag, pa_status st);
void ar_paged_free(paged_run *r);

#endif /* PA_TEST_ATTN_RUNNER_H */
