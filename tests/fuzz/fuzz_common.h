/*
 * What the libFuzzer harnesses share: a decoder from arbitrary bytes to
 * shapes, lengths, strides and indices (typical small values most of the
 * time, hostile edges now and then), an independent model of which statuses
 * the contract allows for a call, buffers sized exactly to what a call may
 * touch (so AddressSanitizer sees any access beyond them), and the checks
 * every harness makes: PA_OK with the reference's result, or an error with
 * a message and every watched byte unchanged.
 *
 * Tensors are never larger than a few hundred KiB of touched memory; huge
 * strides and tables are backed by sparse anonymous mappings, so 64-bit
 * offsets get exercised without using the memory.
 */
#ifndef PA_FUZZ_COMMON_H
#define PA_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "pagedattn.h"
#include "reference.h"

/* ---- decoding ------------------------------------------------------------ */

typedef struct fz_in {
  const uint8_t *data;
  size_t size, at;
} fz_in;

unsigned fz_u8(fz_in *in); /* 0 once the input is used up */
uint32_t fz_u32(fz_in *in);
int fz_range(fz_in *in, int lo, int hi); /* [lo, hi], hi - lo < 256 */
int fz_one_in(fz_in *in, int n);         /* 1 about once in n */
/* A value in [lo, hi] (hi - lo < 256) most of the time, else one of edges. */
int64_t fz_edgy(fz_in *in, int64_t lo, int64_t hi, const int64_t *edges, int num_edges);
#define FZ_EDGY(in, lo, hi, ...)                      \
  fz_edgy(in, lo, hi, (const int64_t[]){__VA_ARGS__}, \
          (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
/* An int-typed field: values outside int are clamped to its range. */
int fz_int(int64_t v);
/* a + b, saturated to the int64_t range (edge values built from hostile ones). */
int64_t fz_sat_add(int64_t a, int64_t b);
/* With FZ_VERBOSE set: prints a decoded layer config, to read a finding. */
void fz_describe_layer(const char *entry, const pa_layer_config *cfg);

/* A float from moderate values or, rarely, a hostile one (0, negative, NaN,
 * infinities, denormals, huge). *extreme is set when the value is finite
 * and legal but large or small enough that f32 and the double reference
 * may part ways. */
float fz_scale(fz_in *in, int *extreme);

pa_context *fz_context(fz_in *in);                   /* 1 or 2 threads, or rarely NULL */
pa_context *fz_context_other(const pa_context *ctx); /* the context with the other thread count */

/* ---- failures -------------------------------------------------------------- */

/* Prints the finding and aborts, which libFuzzer reports as a crash. */
void fz_fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;
#define FZ_ASSERT(cond, ...)           \
  do {                                 \
    if (!(cond)) fz_fail(__VA_ARGS__); \
  } while (0)

/* ---- the model of the contract ------------------------------------------- */

/* Statuses a call may return. `must`: conditions that make the call fail
 * (it must fail with one of their statuses, or with a `may` one); `may`:
 * conditions the contract leaves open (a NULL pointer for zero rows). */
typedef struct fz_expect {
  const char *entry;
  unsigned must, may;
} fz_expect;
#define FZ_BIT(status) (1u << (unsigned)(status))
void fz_need(fz_expect *e, int cond, pa_status status);
void fz_allow(fz_expect *e, int cond, pa_status status);
int fz_may_succeed(const fz_expect *e);
/* Leaves a message that names no entry point, so that a failing call which
 * sets none cannot pass on a stale one. Call it right before the call. */
void fz_plant_stale_message(void);
/* The status against the model; for an error, a message that names the
 * entry point. Returns 1 for PA_OK. */
int fz_check_status(const fz_expect *e, pa_status status);

/* A cache's own validity (header: geometry, dtype, FP8 scales, size). */
void fz_model_cache(fz_expect *e, const pa_kv_cache *cache);
int fz_cache_geometry_ok(const pa_kv_cache *cache);
/* rows of width elements stride apart: stride >= width and the extent fits
 * in 64 bits. Adds INV to `must` (or `may` when rows == 0) otherwise. */
void fz_model_rows(fz_expect *e, int64_t rows, int64_t stride, int64_t width, size_t elem);
/* Bytes rows x stride x elem occupy, or UINT64_MAX when they cannot. */
uint64_t fz_extent(int64_t rows, int64_t stride, int64_t width, size_t elem);

/* ---- buffers --------------------------------------------------------------- */

/* Memory that ends where the access ends: malloc for small buffers (ASan
 * sees every byte past them), a mapping with a guard page after it for
 * large sparse ones. */
typedef struct fz_buf {
  unsigned char *p;
  uint64_t bytes;
  void *map;
  size_t map_bytes;
} fz_buf;
enum { FZ_DENSE_LIMIT = 1 << 20 };
/* Caches are filled value by value: smaller keeps the executions fast. */
enum { FZ_CACHE_LIMIT = 1 << 17 };
#define FZ_SPARSE_LIMIT ((uint64_t)1 << 36)
/* 0 when bytes is beyond FZ_SPARSE_LIMIT (the harness skips the call). */
int fz_alloc(fz_buf *b, uint64_t bytes);
void fz_free(fz_buf *b);
/* A placeholder for a buffer a call must reject before touching. */
void fz_alloc_token(fz_buf *b);

/* Rows of a tensor: row r's elements [0, width) are data, the rest of the
 * row up to stride is padding; only a window of each row (data plus up to
 * FZ_PAD_WINDOW padding elements) is filled and watched, so sparse buffers
 * stay sparse. */
enum { FZ_PAD_WINDOW = 16 };
typedef struct fz_rows {
  fz_buf buf;
  int64_t rows, stride, width, extra_rows;
  size_t elem;
  unsigned char *copy; /* the windows, as filled */
} fz_rows;
/* Allocates rows (+ extra_rows canary rows) of the given shape; 0 when it
 * cannot be backed. Invalid shapes get a token buffer. */
int fz_rows_alloc(fz_rows *r, int64_t rows, int64_t extra_rows, int64_t stride, int64_t width,
                  size_t elem, int shape_ok);
/* Data rows get values of dtype t in [-mag, mag) (f32/f16/bf16), padding
 * and extra rows the canary; then the windows are copied. */
void fz_rows_fill(fz_rows *r, uint64_t seed, pa_dtype t, double mag);
int fz_rows_unchanged(const fz_rows *r);
/* Padding and extra rows still hold the canary (the data may differ). */
int fz_rows_canaries_ok(const fz_rows *r);
void fz_rows_free(fz_rows *r);

/* Snapshot of a dense buffer. */
unsigned char *fz_copy(const void *p, size_t bytes);

/* ---- caches ---------------------------------------------------------------- */

/* A cache decoded from the input: small valid geometries most of the time
 * (nkv and hs when non-zero are the preferred head count and size), hostile
 * fields now and then; dense mostly, sometimes strided (vLLM's interleaved
 * K/V in one buffer, padding between tiles), with hostile strides now and
 * then. Memory is allocated when the geometry is valid and small, else a
 * token; bytes between tiles hold FZ_PAD_BYTE. */
enum { FZ_PAD_BYTE = 0xFF }; /* NaN in every cache dtype */
typedef struct fz_cache {
  pa_kv_cache c;
  fz_buf key, value; /* value is a token when key's buffer holds both */
  int shared;        /* value's tiles live in key's buffer */
  int64_t value_at;  /* shared: elements from the buffer's start to value */
  int provisioned;   /* memory backs every slot */
  int extreme;       /* FP8 scales that make the reference comparison moot */
} fz_cache;
void fz_decode_cache(fz_in *in, fz_cache *fc, int nkv, int hs, int64_t min_blocks);
/* (Re)allocates fc's buffers for fc->c's geometry and strides (freeing the
 * old ones) and points key and value at them, keeping a NULL key or value
 * NULL. */
void fz_cache_provision(fz_cache *fc);
void fz_cache_fill(fz_cache *fc, uint64_t seed);
void fz_cache_free(fz_cache *fc);
int64_t fz_cache_elems(
    const pa_kv_cache *c); /* tile elements per side; the geometry must be valid */
/* Bytes of the buffer behind side 0 (key, or both when shared) or 1; 0 when
 * not provisioned or shared. */
size_t fz_cache_buf_bytes(const fz_cache *fc, int side);
unsigned char *fz_cache_buf(const fz_cache *fc, int side);
/* fc->c with its pointers at the buffers (the call may be given NULL). */
pa_kv_cache fz_cache_backing(const fz_cache *fc);
/* 1 when every byte of the buffers outside the tiles holds FZ_PAD_BYTE. */
int fz_cache_padding_ok(const fz_cache *fc);
ref_cache fz_ref_cache(const pa_kv_cache *c);

/* ---- layers ------------------------------------------------------------------ */

/* A valid layer config over small shapes with every feature in play;
 * slopes and sinks point into the given arrays ([FZ_MAX_HEADS]). */
enum { FZ_MAX_HEADS = 8 };
void fz_decode_layer(fz_in *in, pa_layer_config *cfg, float *slopes, float *sinks, int *extreme);
/* fz_decode_layer, then the layer itself (`harness` names the caller in a
 * finding's description); pa_layer_create rejecting that config is a finding. */
pa_layer *fz_make_layer(fz_in *in, const char *harness, pa_layer_config *cfg, float *slopes,
                        float *sinks, int *extreme);
ref_layer fz_ref_layer(const pa_layer_config *cfg);

/* A bound on the f32 error of one logit: the dot product's (d terms of at
 * most q_mag * k_mag, times the scale), ALiBi's bias over max_dist
 * positions and the soft-cap's tanh; plus the relative error of sums over
 * max_dist keys, which moves the output as much. The hx tolerances assume logits of
 * modest size (scale 1/sqrt(d)); a fuzzed layer may have scale 1 and
 * d = 1024, where an error of this size moves the softmax. */
double fz_logit_error(const pa_layer_config *cfg, double q_mag, double k_mag, int64_t max_dist);
/* Compares the outputs of a successful attention call with the reference:
 * the hx tolerances plus what logit_err can move (2 logit_err max|v| on an
 * output, logit_err on lse); aborts on a mismatch. */
void fz_check_attention(const char *entry, pa_dtype act, const pa_layer_config *cfg, int64_t rows,
                        const fz_rows *out, const float *lse, int lse_extra, const double *ref_out,
                        const double *ref_lse, const double *vmax, double logit_err);

/* ---- batch lengths ----------------------------------------------------------- */

/* num_seqs, query_start_loc and seq_lens (or, for varlen, cumulative key
 * starts) as a caller might get them wrong. */
enum { FZ_MAX_SEQS = 5 };
typedef struct fz_lengths {
  int num_seqs; /* as declared */
  int decoded;  /* entries decoded: num_seqs clamped to [0, FZ_MAX_SEQS] */
  int32_t qsl[FZ_MAX_SEQS + 1];
  int32_t kv[FZ_MAX_SEQS + 1]; /* seq_lens, or cumulative key starts when cumulative */
  int cumulative;
  int null_qsl, null_kv;
  int ok;             /* the model finds nothing wrong with them */
  int64_t rows, keys; /* totals when ok */
} fz_lengths;

void fz_decode_lengths(fz_in *in, fz_lengths *l, int cumulative);
/* Adds the lengths' conditions; require_q_le_k for a decoder over a cache. */
void fz_model_lengths(fz_expect *e, fz_lengths *l, int require_q_le_k);
int64_t fz_q_len(const fz_lengths *l, int s);
int64_t fz_k_len(const fz_lengths *l, int s);

#endif
