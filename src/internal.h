/* Framework internals: the opaque handles and the helpers the entry points
 * share. Nothing here is a kernel. */
#ifndef PA_INTERNAL_H
#define PA_INTERNAL_H

#include "common.h"
#include "dispatch.h"
#include "pool.h"

typedef struct pa_plan_item pa_plan_item;

struct pa_context {
  int num_threads;
  pa_isa isa;
  pa_kernels kernels;
  pa_pool *pool; /* NULL with one thread */
  /* Scratch of each thread, grown on demand (never on a steady-state call). */
  void **thread_scratch;
  size_t thread_scratch_size;
  /* Shared workspace of one call: split-K partial results. */
  void *workspace;
  size_t workspace_size;
  /* The plan a call makes when the caller passes none; reused call to call. */
  pa_plan *scratch_plan;
};

struct pa_layer {
  int num_heads;
  int num_kv_heads;
  int head_size;
  int group; /* query heads per KV head */
  float scale;
  float soft_cap;
  int window;
  pa_attn_type type;
  pa_dtype dtype;
  float *alibi; /* [num_heads] or NULL */
  float *sinks; /* [num_heads] or NULL */
};

/* Grows the per-thread scratch and the shared workspace to at least the given
 * sizes. PA_ERR_OUT_OF_MEMORY (with a message naming `caller`) on failure. */
pa_status pa_context_reserve(pa_context *ctx, size_t per_thread, size_t shared, const char *caller);

/* Argument checks shared by entry points. Each returns PA_OK or records the
 * failure (naming `caller` and the argument) and returns its status. */
pa_status pa_check_cache(const pa_kv_cache *cache, const char *caller, const char *name);
pa_status pa_check_activation_dtype(pa_dtype dtype, const char *caller, const char *name);
/* `rows` rows of `width` elements `stride` apart: stride >= width, extent addressable. */
pa_status pa_check_rows(int64_t rows, int64_t stride, int64_t width, size_t elem_size,
                        const char *caller, const char *name);

/* Bytes of the tiles of one block of one cache tensor (keys or values):
 * what a block holds, wherever its strides put the tiles. */
size_t pa_cache_block_bytes(const pa_kv_cache *cache);

/* Where a checked cache's tiles are, in bytes from key (or value). */
typedef struct pa_cache_layout {
  int64_t tile_bytes;  /* one KV head's [block_size][head_size] tile */
  int64_t head_bytes;  /* from a KV head's tile to the next one's in the block */
  int64_t block_bytes; /* from a block to the next */
  int heads_adjacent;  /* head_bytes == tile_bytes: a block's tiles are one run */
} pa_cache_layout;

/* For a cache pa_check_cache accepted. A stride that is never stepped (the
 * block stride of a cache of one block, the head stride of one KV head, any
 * stride of an empty cache) may be anything up to INT64_MAX, and its byte
 * count could overflow: it reads as 0 (block) or the dense value, which
 * address the same bytes. */
pa_cache_layout pa_cache_layout_of(const pa_kv_cache *cache);

#endif
