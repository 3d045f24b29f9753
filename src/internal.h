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

/* Number of bytes of one block of one cache tensor (keys or values). */
size_t pa_cache_block_bytes(const pa_kv_cache *cache);

#endif
