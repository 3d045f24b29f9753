/* One benchmark case (shapes, dtypes, layer knobs), its inputs and the timing of its calls. */
#ifndef PAB_WORKLOADS_H
#define PAB_WORKLOADS_H

#include <stddef.h>
#include <stdint.h>

#include "pagedattn.h"

typedef enum pab_api {
  PAB_API_PAGED,  /* pa_paged_attention over the KV cache */
  PAB_API_VARLEN, /* pa_varlen_attention over dense K/V */
} pab_api;

/* Which roof a row's "% of roofline" is measured against. */
typedef enum pab_bound {
  PAB_BOUND_MEMORY,  /* streaming-read bandwidth (decode) */
  PAB_BOUND_COMPUTE, /* FMA peak for f32, bf16 dot peak for bf16/f16 (prefill, encoder) */
  PAB_BOUND_MAX,     /* whichever takes longer: bytes / bandwidth or flops / peak (mixed) */
} pab_bound;

#define PAB_NAME_MAX 64

typedef struct pab_case {
  char name[PAB_NAME_MAX];
  pab_api api;
  pab_bound bound;
  int num_seqs;
  int32_t *q_lens; /* [num_seqs] query rows */
  int32_t *k_lens; /* [num_seqs] paged: seq_len (cached + new); varlen: key rows */
  int num_heads, num_kv_heads, head_size, block_size;
  pa_dtype dtype;       /* activations */
  pa_dtype cache_dtype; /* paged only */
  pa_attn_type attn_type;
  int window;
  int alibi;
  float softcap;
  int sinks;  /* one sink logit per head */
  int lse;    /* the call also writes the log-sum-exp of every row and head */
  int cold;   /* rotate over disjoint copies of the K/V so no call reuses the last one's lines */
  int scalar; /* also time it with a scalar-kernel context */
  /* Block ids: 0 in allocation order (each sequence's blocks contiguous, as a freshly started
   * engine hands them out), 1 shuffled (an allocator after churn: every block a random jump). */
  int fragmented;
  /* Paged: the cache's pa_kv_layout, or -1 (pab_case_new's): pa_kv_layout_preferred, as an
   * engine that asks the library would choose. */
  int layout;
} pab_case;

/* A case with Llama-3-8B layer defaults (32/8 heads of 128, block 16, bf16, decoder). */
pab_case *pab_case_new(const char *name, pab_api api, int num_seqs);
void pab_case_free(pab_case *c);

/* Attended (query, key) pairs of one sequence and the keys any of its queries sees. */
void pab_seq_pairs(pa_attn_type type, int window, int q_len, int k_len, double *pairs,
                   int64_t *keys_touched);

typedef struct pab_metrics {
  double pairs;    /* attended (query, key) pairs summed over sequences */
  double flops;    /* 4 * head_size * num_heads * pairs */
  double kv_bytes; /* K and V bytes read per call */
  int64_t rows;    /* query rows */
} pab_metrics;
void pab_case_metrics(const pab_case *c, pab_metrics *m);

/* "16x q1 k4096 | h32/8 d128 bs16 bf16>bf16" style summary. */
void pab_case_shape(const pab_case *c, char *buf, size_t cap);

typedef struct pab_data pab_data;

/* Allocates and fills everything a call needs; writer fills the cache through pa_write_kv.
 * A cold case gets at least min_rotations disjoint copies of its K/V, and enough of them to
 * touch cold_bytes per round trip. */
pab_data *pab_data_build(const pab_case *c, pa_context *writer, size_t cold_bytes,
                         int min_rotations, uint64_t seed);
void pab_data_free(pab_data *d);
int pab_data_rotations(const pab_data *d);

typedef struct pab_timing {
  int repeats;     /* > 0: exactly this many timed calls; 0: adaptive */
  int warmup;      /* untimed first call */
  double budget_s; /* adaptive: aim for this much timed time */
  int min_reps;    /* adaptive: at least this many when they fit in ~2.5x the budget */
  int max_reps;
} pab_timing;

typedef struct pab_result {
  int reps;
  double median_s;
  double min_s;
} pab_result;

void pab_data_time(pab_data *d, pa_context *ctx, const pab_timing *t, pab_result *r);

#endif
