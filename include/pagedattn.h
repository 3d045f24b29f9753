/*
 * pagedattn: the attention backend of an LLM inference engine on CPU.
 *
 * One header, C11, usable from C++. The contract behind every name here is
 * ../shared/design/API.md; this header restates it next to the declarations
 * and documents the choices the contract leaves open.
 *
 * Conventions
 * - Every fallible function returns pa_status. On failure nothing has been
 *   written: no cache slot, no output row, no lse entry.
 * - Tensors are raw pointers with a documented layout. Row strides are counted
 *   in elements and must be >= the row's width (views into a fused QKV buffer
 *   are fine). Pointers need only the alignment of their element type.
 * - pa_last_error() names the argument, the position and the bad value of the
 *   calling thread's last failure.
 */
#ifndef PAGEDATTN_H
#define PAGEDATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Public functions are exported from the shared library; the rest is hidden. */
#if defined(_WIN32)
#define PA_API
#elif defined(__GNUC__)
#define PA_API __attribute__((visibility("default")))
#else
#define PA_API
#endif

#define PA_VERSION_MAJOR 0
#define PA_VERSION_MINOR 3
#define PA_VERSION_PATCH 0
#define PA_VERSION_STRING "0.3.0"

/* Supported head sizes: PA_MIN_HEAD_SIZE .. PA_MAX_HEAD_SIZE inclusive. */
#define PA_MIN_HEAD_SIZE 1
#define PA_MAX_HEAD_SIZE 1024

/* ------------------------------------------------------------------------ */
/* Status and errors                                                        */
/* ------------------------------------------------------------------------ */

typedef enum pa_status {
  PA_OK = 0,
  PA_ERR_INVALID_ARGUMENT = 1,
  PA_ERR_UNSUPPORTED = 2,  /* well-formed, but this build cannot serve it */
  PA_ERR_OUT_OF_RANGE = 3, /* a slot, block id or length outside the cache */
  PA_ERR_OUT_OF_MEMORY = 4,
} pa_status;

PA_API const char *pa_status_string(pa_status status);
/* Thread-local detail of this thread's last failure; "" if none. A later
 * successful call does not clear it. */
PA_API const char *pa_last_error(void);

/* ------------------------------------------------------------------------ */
/* Data types                                                               */
/* ------------------------------------------------------------------------ */

/* Activations are F32, F16 or BF16; a KV cache may be any of the five. FP8
 * follows OCP (E4M3: bias 7, max 448, no infinities; E5M2: bias 15,
 * IEEE-like) and stores value / scale. Conversions round to nearest even;
 * conversions to FP8 saturate to +-448 / +-57344 (infinities included) and
 * keep NaN a NaN. */
typedef enum pa_dtype { PA_F32, PA_F16, PA_BF16, PA_FP8_E4M3, PA_FP8_E5M2 } pa_dtype;

PA_API size_t pa_dtype_size(pa_dtype dtype);      /* 0 for a value outside the enum */
PA_API const char *pa_dtype_name(pa_dtype dtype); /* "f32", ..., "fp8_e5m2"; "invalid" otherwise */

/* ------------------------------------------------------------------------ */
/* Context: threads and CPU dispatch                                        */
/* ------------------------------------------------------------------------ */

/* A context owns a persistent thread pool (num_threads - 1 workers; the
 * calling thread is the first worker) and per-thread scratch memory. The
 * environment variable PA_ISA ("scalar", "avx2", "avx512", "avx512bf16",
 * "amx") caps the kernel path; PA_BF16_DOT ("on", "off", "auto") and
 * PA_PREFETCH ("l1", "l2", "auto") choose within it (README.md, Environment).
 * An unknown value of any of them is an error at creation. A context is used by one
 * caller thread at a time; different contexts may be used concurrently. */
typedef struct pa_context pa_context;

/* num_threads <= 0: one per online CPU. */
PA_API pa_status pa_context_create(int num_threads, pa_context **ctx);

/* A host's thread team, for a context that runs its work on the host's
 * threads instead of a pool of its own: an engine whose other work runs on
 * an OpenMP team (torch's) gives it that team, so that two sets of threads
 * do not spin against each other on the same cores. run(team, work, arg,
 * num_threads) calls work(arg, t) once for each of up to num_threads
 * threads t in [0, num_threads), concurrently, the caller's among them, and
 * returns when every call has returned (distinct t for calls that overlap;
 * fewer threads than asked, down to one, is allowed). */
typedef void (*pa_team_work_fn)(void *arg, int thread);
typedef void (*pa_team_fn)(void *team, pa_team_work_fn work, void *arg, int num_threads);

/* As pa_context_create with num_threads >= 1, the work running on `run`'s
 * team; `team` is passed to it as it is. */
PA_API pa_status pa_context_create_with_team(int num_threads, pa_team_fn run, void *team,
                                             pa_context **ctx);
PA_API void pa_context_destroy(pa_context *ctx);
PA_API int pa_context_num_threads(const pa_context *ctx);
PA_API const char *pa_context_isa(const pa_context *ctx); /* "avx512", "avx2" or "scalar" */
/* The kernel path within the family, as PA_ISA names it: "scalar", "avx2",
 * "avx512" (AVX-512 F/BW/DQ/VL only), "avx512bf16" (with its bf16 dot
 * products) or "amx" (with AMX tiles for the packed bf16 products). PA_ISA
 * set to one of these caps the path. */
PA_API const char *pa_context_kernel_path(const pa_context *ctx);

/* ------------------------------------------------------------------------ */
/* Backend description                                                      */
/* ------------------------------------------------------------------------ */

PA_API const char *pa_backend_name(void);              /* "PAGEDATTN" */
PA_API pa_status pa_validate_head_size(int head_size); /* accepts 1..1024 */
PA_API int pa_dtype_is_supported(pa_dtype dtype);      /* as an activation dtype */
/* shape = {2, num_blocks, block_size * num_kv_heads * head_size}: 0 keys, 1 values */
PA_API void pa_kv_cache_shape(int64_t num_blocks, int block_size, int num_kv_heads, int head_size,
                              int64_t shape[3]);

/* ------------------------------------------------------------------------ */
/* Layer                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum pa_attn_type {
  PA_ATTN_DECODER,         /* causal self-attention; K/V live in the paged cache */
  PA_ATTN_ENCODER,         /* bidirectional self-attention of an encoder-decoder model */
  PA_ATTN_ENCODER_ONLY,    /* bidirectional self-attention of an encoder-only model */
  PA_ATTN_ENCODER_DECODER, /* cross-attention: decoder queries over encoder K/V */
} pa_attn_type;

/* The logit of query i and key j:
 *   s = scale * dot(q_i, k_j); s = c * tanh(s / c) if soft-capped;
 *   s += slope_h * (j - i) if ALiBi; masked keys are excluded;
 *   softmax over the kept keys (and the sink); out = sum p_j v_j.
 * Query positions are aligned to the end of the keys: with q_len queries over
 * k_len keys, query r has position k_len - q_len + r.
 * Masks: PA_ATTN_DECODER is causal (j <= i). A sliding window w > 0 keeps
 * i - w < j <= i for every type except PA_ATTN_ENCODER_ONLY, whose window is
 * symmetric (|i - j| < w), as in vLLM. A row that sees no key outputs zeros
 * and lse = -inf, sink or not.
 * Non-finite Q, K and V are not rejected; they follow IEEE arithmetic as
 * far as the online softmax allows: a NaN logit that shares its tile of
 * keys (16 to 128) with a finite logit of its row makes the row's output
 * NaN; a row whose logits are all NaN outputs zeros, as one that sees no
 * key; a NaN or infinite V may reach rows for which its key is masked (keys
 * are multiplied in by tiles, as GPU kernels do). */
typedef struct pa_layer_config {
  int num_heads;             /* query heads, >= 1 */
  int num_kv_heads;          /* 0 means num_heads; must divide num_heads */
  int head_size;             /* 1..1024 */
  float scale;               /* 0 means 1/sqrt(head_size); finite, >= 0 */
  const float *alibi_slopes; /* [num_heads] or NULL; copied at creation */
  int sliding_window;        /* 0: none; w > 0 (see above) */
  float logits_soft_cap;     /* 0: none; c > 0: s = c * tanh(s / c) */
  const float *sinks;        /* [num_heads] or NULL: one extra logit per head that joins the
                                softmax denominator and contributes no value; copied */
  pa_attn_type attn_type;
  pa_dtype dtype; /* query/key/value/output dtype: F32, F16 or BF16 */
} pa_layer_config;

typedef struct pa_layer pa_layer;
PA_API pa_status pa_layer_create(const pa_layer_config *config, pa_layer **layer);
PA_API void pa_layer_destroy(pa_layer *layer);

/* ------------------------------------------------------------------------ */
/* KV cache                                                                 */
/* ------------------------------------------------------------------------ */

/* The memory belongs to the caller. A slot is block * block_size + offset.
 *
 * Each KV head of a block holds a dense [block_size][head_size] tile; the
 * strides place the tiles. Element e of token offset t of KV head h in
 * block b is at element
 *   b * block_stride + h * head_stride + t * head_size + e
 * of key (and of value). Zero strides are the dense layout
 * [num_blocks][num_kv_heads][block_size][head_size], so an initialiser of
 * the first nine fields means what it meant in 0.1. A non-zero stride is at
 * least the dense one: head_stride >= block_size * head_size and
 * block_stride >= num_kv_heads * head_stride (with the dense head stride
 * when head_stride is 0; a block_stride of 0 is the dense
 * num_kv_heads * block_size * head_size and must meet the same bound).
 *
 * vLLM's CPU cache, one tensor [num_blocks][num_kv_heads][2 * block_size]
 * [head_size] with each head's key tile followed by its value tile, is
 *   key = base, value = base + block_size * head_size elements,
 *   head_stride = 2 * block_size * head_size,
 *   block_stride = num_kv_heads * head_stride.
 * The library reads and writes only the tiles: whatever lies between them
 * (the other side's tiles, padding) is never touched. The regions key and
 * value address must not overlap; that is the caller's layout, not checked.
 *
 * 0.3: `layout` orders the elements inside each tile (the tiles themselves
 * stay where the strides put them). PA_KV_ROWS is the order above. In
 * PA_KV_TILED, the order AMX tiles load without packing, the t * head_size
 * + e of the formula above becomes, for keys (16-token groups of element
 * pairs: one group is head_size / 2 rows of 16 tokens x 2 elements)
 *   (t / 16) * 16 * head_size + (e / 2) * 32 + (t % 16) * 2 + e % 2
 * and for values (16-element column groups of token pairs: one group is
 * block_size / 2 rows of 16 elements x 2 tokens)
 *   (e / 16) * 16 * block_size + (t / 2) * 32 + (e % 16) * 2 + t % 2.
 * A tiled cache needs block_size and head_size multiples of 16
 * (PA_ERR_UNSUPPORTED otherwise). Every kernel path reads both orders; on
 * the amx path bf16 activations over a tiled bf16 cache feed the tiles
 * straight from the cache (no packing per call), bf16 or f16 activations
 * over a tiled FP8 cache through a conversion of each tile to bf16 in the
 * same order (no transposes; f16 in two bf16 parts), and on the
 * avx512bf16 path with the bf16 dot products the bf16 pair is read in
 * place by dot products over the same groups; the other paths and dtype
 * pairs read a tiled cache through a copy into rows per tile.
 * pa_kv_layout_preferred says which order is the faster here. */
typedef enum pa_kv_layout {
  PA_KV_ROWS = 0,
  PA_KV_TILED = 1,
} pa_kv_layout;

typedef struct pa_kv_cache {
  void *key;   /* key tiles of dtype (layout above) */
  void *value; /* value tiles, same strides */
  int64_t num_blocks;
  int block_size; /* any value >= 1 */
  int num_kv_heads;
  int head_size;
  pa_dtype dtype;
  float k_scale; /* FP8 only (stored = real / k_scale), finite and > 0; ignored otherwise */
  float v_scale;
  /* 0.2: strides in elements, the same in key and in value (layout above) */
  int64_t block_stride; /* from block b to b+1; 0: num_kv_heads * block_size * head_size */
  int64_t head_stride;  /* from KV head h to h+1 within a block; 0: block_size * head_size */
  pa_kv_layout layout;  /* 0.3: the order inside each tile; 0: PA_KV_ROWS */
} pa_kv_cache;

/* 0.3: the layout whose reads are fastest on this context's kernel path for
 * activations of act_dtype over a cache of cache_dtype with this geometry:
 * PA_KV_TILED where the AMX tiles read it in place or converted per tile
 * (see pa_kv_layout), PA_KV_ROWS otherwise (and for arguments no cache could
 * have). */
PA_API pa_kv_layout pa_kv_layout_preferred(const pa_context *ctx, pa_dtype act_dtype,
                                           pa_dtype cache_dtype, int block_size, int head_size);

/* key/value: num_tokens rows of num_kv_heads * head_size elements of
 * src_dtype (an activation dtype). Token t goes to slot slot_mapping[t]; a
 * negative slot is padding and is skipped. If two tokens name the same slot
 * the later one wins. */
PA_API pa_status pa_write_kv(pa_context *ctx, const pa_kv_cache *cache, const void *key,
                             int64_t key_stride, const void *value, int64_t value_stride,
                             pa_dtype src_dtype, int64_t num_tokens, const int64_t *slot_mapping);

/* block_pairs: [num_pairs][2] = (source block, destination block). Pairs take
 * effect in order, as if copied one after another (so chains and repeated
 * destinations are well defined). pa_copy_blocks copies keys and values
 * within each of num_caches caches; pa_swap_blocks copies from src to dst,
 * which must share block_size, num_kv_heads, head_size, dtype, layout and (FP8) the
 * scales; their num_blocks and strides may differ (a strided device cache
 * and a dense host pool, say). Only the tiles are copied. */
PA_API pa_status pa_copy_blocks(pa_context *ctx, const pa_kv_cache *caches, int num_caches,
                                const int64_t *block_pairs, int64_t num_pairs);
PA_API pa_status pa_swap_blocks(pa_context *ctx, const pa_kv_cache *src, const pa_kv_cache *dst,
                                const int64_t *block_pairs, int64_t num_pairs);

/* ------------------------------------------------------------------------ */
/* Batch over the paged cache                                               */
/* ------------------------------------------------------------------------ */

/* Sequence s owns query/output rows [query_start_loc[s], query_start_loc[s+1])
 * and has seq_lens[s] tokens in the cache, its new ones included (write them
 * first). Its first ceil(seq_lens[s] / block_size) block table entries must
 * name blocks of the cache. For PA_ATTN_DECODER q_len <= seq_len. */
typedef struct pa_batch {
  int num_seqs;
  const int32_t *query_start_loc; /* [num_seqs + 1], starts at 0, non-decreasing */
  const int32_t *seq_lens;        /* [num_seqs] */
  const int32_t *block_tables;    /* [num_seqs][block_table_stride] physical block ids */
  int block_table_stride;
} pa_batch;

/* A plan holds the split of one batch's work over the context's threads.
 * Made once per engine step, it serves every layer with the same num_heads,
 * num_kv_heads and head_size for a batch with the same lengths; using it with
 * another geometry or other lengths is an error, not a wrong answer. */
typedef struct pa_plan pa_plan;
PA_API pa_status pa_plan_create(pa_context *ctx, const pa_layer *layer, const pa_batch *batch,
                                pa_plan **plan);
PA_API void pa_plan_destroy(pa_plan *plan);

/* query/out: rows of num_heads * head_size elements of the layer dtype.
 * lse: NULL or [rows][num_heads], the natural log of the softmax denominator
 * (sink included). plan: NULL plans inside the call. */
PA_API pa_status pa_paged_attention(pa_context *ctx, const pa_layer *layer, const pa_plan *plan,
                                    const void *query, int64_t query_stride,
                                    const pa_kv_cache *cache, const pa_batch *batch, void *out,
                                    int64_t out_stride, float *lse);

/* The checks of pa_paged_attention with the same arguments (and the same
 * status and message for a bad one), without the work: a caller that writes
 * K/V and then attends (an engine's layer) calls it first, so that a batch
 * the attention would refuse leaves the cache unwritten. */
PA_API pa_status pa_validate_paged_attention(const pa_context *ctx, const pa_layer *layer,
                                             const pa_plan *plan, const void *query,
                                             int64_t query_stride, const pa_kv_cache *cache,
                                             const pa_batch *batch, const void *out,
                                             int64_t out_stride);

/* ------------------------------------------------------------------------ */
/* Dense ragged attention (no cache)                                        */
/* ------------------------------------------------------------------------ */

/* Sequence s owns query rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) and key and
 * value rows [cu_seqlens_k[s], cu_seqlens_k[s+1]). key/value rows hold
 * num_kv_heads * head_size elements of the layer dtype. PA_ATTN_DECODER is
 * causal with the last query aligned to the last key; the others are
 * bidirectional. */
PA_API pa_status pa_varlen_attention(pa_context *ctx, const pa_layer *layer, const void *query,
                                     int64_t query_stride, const void *key, int64_t key_stride,
                                     const void *value, int64_t value_stride, int num_seqs,
                                     const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k,
                                     void *out, int64_t out_stride, float *lse);

/* ------------------------------------------------------------------------ */
/* Merging partial attention states                                         */
/* ------------------------------------------------------------------------ */

/* Combines two partial results over disjoint key sets of the same query rows
 * (e.g. a shared prefix and a sequence's own suffix): per row and head,
 *   out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b),
 *   lse = log(e^lse_a + e^lse_b).
 * out_a, out_b and out: num_rows rows of num_heads * head_size elements of
 * dtype (F32, F16 or BF16), a_stride, b_stride and out_stride elements
 * apart (each >= num_heads * head_size). lse_a and lse_b: [num_rows]
 * [num_heads] natural logs, as pa_paged_attention gives them; lse: the same
 * shape, or NULL when the merged lse is not wanted. Computed in f32.
 *
 * A row and head whose lse is -inf on one side takes the other side as it
 * is (its out values and its lse, bit for bit, whatever they hold); -inf on
 * both gives zeros and -inf. Otherwise an lse of NaN or +inf on either side
 * gives NaN in that row and head's out and lse.
 *
 * out may be out_a or out_b (the same memory with the same stride), and lse
 * may be lse_a or lse_b; other overlaps are not supported. num_rows == 0 is
 * a valid call that does nothing (the tensors and their strides are not
 * looked at). */
PA_API pa_status pa_merge_states(pa_context *ctx, int64_t num_rows, int num_heads, int head_size,
                                 pa_dtype dtype, const void *out_a, int64_t a_stride,
                                 const float *lse_a, const void *out_b, int64_t b_stride,
                                 const float *lse_b, void *out, int64_t out_stride, float *lse);

#ifdef __cplusplus
}
#endif

#endif /* PAGEDATTN_H */
