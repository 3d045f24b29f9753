/* The attention entry points: validate everything, plan, reserve memory,
 * and only then run. */
#include <math.h>
#include <stdlib.h>

#include "attend.h"

static pa_status check_layer_and_cache(const pa_layer *layer, const pa_kv_cache *cache,
                                       const char *caller) {
  if (cache->num_kv_heads != layer->num_kv_heads) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: cache->num_kv_heads = %d does not match the layer's num_kv_heads = %d",
                   caller, cache->num_kv_heads, layer->num_kv_heads);
  }
  if (cache->head_size != layer->head_size) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: cache->head_size = %d does not match the layer's head_size = %d", caller,
                   cache->head_size, layer->head_size);
  }
  return PA_OK;
}

/* Every block a sequence's keys occupy must be named and inside the cache. */
static pa_status check_block_tables(const pa_batch *batch, const pa_kv_cache *cache,
                                    const char *caller) {
  if (batch->block_table_stride < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: batch->block_table_stride = %d is negative",
                   caller, batch->block_table_stride);
  }
  for (int s = 0; s < batch->num_seqs; s++) {
    int64_t seq_len = batch->seq_lens[s];
    int64_t blocks = (seq_len + cache->block_size - 1) / cache->block_size;
    if (blocks > batch->block_table_stride) {
      return pa_fail(PA_ERR_OUT_OF_RANGE,
                     "%s: seq_lens[%d] = %lld needs %lld blocks of %d tokens but "
                     "block_table_stride = %d",
                     caller, s, (long long)seq_len, (long long)blocks, cache->block_size,
                     batch->block_table_stride);
    }
    if (blocks == 0) continue; /* block_tables may be NULL: no row of it is formed */
    if (!batch->block_tables) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: block_tables is NULL", caller);
    }
    const int32_t *row = batch->block_tables + (int64_t)s * batch->block_table_stride;
    for (int64_t b = 0; b < blocks; b++) {
      if (row[b] < 0 || row[b] >= cache->num_blocks) {
        return pa_fail(PA_ERR_OUT_OF_RANGE, "%s: block_tables[%d][%lld] = %d is outside [0, %lld)",
                       caller, s, (long long)b, (int)row[b], (long long)cache->num_blocks);
      }
    }
  }
  return PA_OK;
}

/* A caller's plan must describe this layer's geometry and this batch. */
static pa_status check_plan(const pa_plan *plan, const pa_layer *layer, const pa_batch *batch,
                            const char *caller) {
  if (plan->num_heads != layer->num_heads || plan->num_kv_heads != layer->num_kv_heads ||
      plan->head_size != layer->head_size) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: plan was made for num_heads %d, num_kv_heads %d, head_size %d; the layer "
                   "has %d, %d, %d",
                   caller, plan->num_heads, plan->num_kv_heads, plan->head_size, layer->num_heads,
                   layer->num_kv_heads, layer->head_size);
  }
  if (plan->num_seqs != batch->num_seqs) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: plan was made for num_seqs = %d; batch->num_seqs = %d", caller,
                   plan->num_seqs, batch->num_seqs);
  }
  for (int s = 0; s < batch->num_seqs; s++) {
    if (plan->q_starts[s + 1] != batch->query_start_loc[s + 1]) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT,
                     "%s: plan was made for query_start_loc[%d] = %d; the batch has %d", caller,
                     s + 1, (int)plan->q_starts[s + 1], (int)batch->query_start_loc[s + 1]);
    }
    if (plan->kv_lens[s] != batch->seq_lens[s]) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT,
                     "%s: plan was made for seq_lens[%d] = %d; the batch has %d", caller, s,
                     (int)plan->kv_lens[s], (int)batch->seq_lens[s]);
    }
  }
  return PA_OK;
}

static pa_status check_io(const pa_layer *layer, int64_t rows, const void *query,
                          int64_t query_stride, const void *out, int64_t out_stride,
                          const char *caller) {
  if (rows == 0) return PA_OK;
  int64_t width = (int64_t)layer->num_heads * layer->head_size;
  size_t size = pa_dtype_size(layer->dtype);
  if (!query) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: query is NULL", caller);
  if (!out) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: out is NULL", caller);
  pa_status status = pa_check_rows(rows, query_stride, width, size, caller, "query_stride");
  if (status != PA_OK) return status;
  return pa_check_rows(rows, out_stride, width, size, caller, "out_stride");
}

/* Bytes from one row of a tensor to the next. Only a tensor of two or more
 * rows steps by them, and for those pa_check_rows has bounded stride * size;
 * a lone row's stride may be anything (up to INT64_MAX) and the product
 * would overflow. */
static int64_t row_bytes(int64_t rows, int64_t stride, size_t size) {
  return rows > 1 ? stride * (int64_t)size : 0;
}

/* Makes the plan if the caller gave none, reserves scratch, and runs. */
static pa_status plan_reserve_run(pa_context *ctx, const pa_layer *layer, const pa_plan *plan,
                                  const pa_plan_request *request, pa_attention_call *call,
                                  const char *caller) {
  if (!plan) {
    if (!ctx->scratch_plan) {
      ctx->scratch_plan = calloc(1, sizeof *ctx->scratch_plan);
      if (!ctx->scratch_plan) {
        return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: cannot allocate a plan", caller);
      }
    }
    pa_status status = pa_plan_build(ctx->scratch_plan, request, caller);
    if (status != PA_OK) return status;
    plan = ctx->scratch_plan;
  }
  pa_status status =
      pa_context_reserve(ctx, plan->scratch_bytes, plan->partial_floats * sizeof(float), caller);
  if (status != PA_OK) return status;
  call->kernels = &ctx->kernels;
  call->ops = &ctx->kernels.attn[layer->dtype][call->kv.dtype];
  call->layer = layer;
  call->plan = plan;
  call->mask = pa_layer_mask(layer);
  call->thread_scratch = ctx->thread_scratch;
  call->partials = ctx->workspace;
  pa_attention_run(ctx, call);
  return PA_OK;
}

/* Every check of pa_paged_attention; *rows gets the batch's query rows. */
static pa_status check_paged_attention(const pa_context *ctx, const pa_layer *layer,
                                       const pa_plan *plan, const void *query, int64_t query_stride,
                                       const pa_kv_cache *cache, const pa_batch *batch,
                                       const void *out, int64_t out_stride, int64_t *rows) {
  const char *caller = "pa_paged_attention";
  if (!ctx) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  if (!layer) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: layer is NULL", caller);
  if (!batch) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: batch is NULL", caller);
  pa_status status = pa_check_cache(cache, caller, "cache");
  if (status == PA_OK) status = check_layer_and_cache(layer, cache, caller);
  if (status == PA_OK) {
    status =
        pa_check_lengths(batch->num_seqs, batch->query_start_loc, "query_start_loc",
                         batch->seq_lens, NULL, "seq_lens", layer->type == PA_ATTN_DECODER, caller);
  }
  if (status == PA_OK) status = check_block_tables(batch, cache, caller);
  if (status == PA_OK && plan) status = check_plan(plan, layer, batch, caller);
  if (status != PA_OK) return status;
  *rows = batch->num_seqs > 0 ? batch->query_start_loc[batch->num_seqs] : 0;
  return check_io(layer, *rows, query, query_stride, out, out_stride, caller);
}

pa_status pa_validate_paged_attention(const pa_context *ctx, const pa_layer *layer,
                                      const pa_plan *plan, const void *query, int64_t query_stride,
                                      const pa_kv_cache *cache, const pa_batch *batch,
                                      const void *out, int64_t out_stride) {
  int64_t rows;
  return check_paged_attention(ctx, layer, plan, query, query_stride, cache, batch, out, out_stride,
                               &rows);
}

pa_status pa_paged_attention(pa_context *ctx, const pa_layer *layer, const pa_plan *plan,
                             const void *query, int64_t query_stride, const pa_kv_cache *cache,
                             const pa_batch *batch, void *out, int64_t out_stride, float *lse) {
  const char *caller = "pa_paged_attention";
  int64_t rows = 0;
  pa_status status = check_paged_attention(ctx, layer, plan, query, query_stride, cache, batch, out,
                                           out_stride, &rows);
  if (status != PA_OK || rows == 0) return status;

  size_t act_size = pa_dtype_size(layer->dtype), kv_size = pa_dtype_size(cache->dtype);
  int fp8 = pa_dtype_is_fp8(cache->dtype);
  int64_t token_bytes = (int64_t)cache->head_size * (int64_t)kv_size;
  pa_cache_layout layout = pa_cache_layout_of(cache);
  pa_attention_call call = {
      .query = query,
      .query_row_bytes = row_bytes(rows, query_stride, act_size),
      .out = out,
      .out_row_bytes = row_bytes(rows, out_stride, act_size),
      .lse = lse,
      .kv = {.key = cache->key,
             .value = cache->value,
             .dtype = cache->dtype,
             .block_tables = batch->block_tables,
             .block_table_stride = batch->block_table_stride,
             .block_size = cache->block_size,
             .block_bytes = layout.block_bytes,
             .head_bytes = layout.head_bytes,
             .heads_adjacent = layout.heads_adjacent,
             .token_bytes = token_bytes,
             .tiled = cache->layout == PA_KV_TILED},
      .q_factor = layer->scale * (fp8 ? cache->k_scale : 1.0f),
      .v_factor = fp8 ? cache->v_scale : 1.0f,
  };
  pa_plan_request request = {
      .num_threads = ctx->num_threads,
      .num_heads = layer->num_heads,
      .num_kv_heads = layer->num_kv_heads,
      .head_size = layer->head_size,
      .mask = pa_layer_mask(layer),
      .num_seqs = batch->num_seqs,
      .q_starts = batch->query_start_loc,
      .kv_lens = batch->seq_lens,
  };
  return plan_reserve_run(ctx, layer, plan, &request, &call, caller);
}

pa_status pa_varlen_attention(pa_context *ctx, const pa_layer *layer, const void *query,
                              int64_t query_stride, const void *key, int64_t key_stride,
                              const void *value, int64_t value_stride, int num_seqs,
                              const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, void *out,
                              int64_t out_stride, float *lse) {
  const char *caller = "pa_varlen_attention";
  if (!ctx) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  if (!layer) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: layer is NULL", caller);
  pa_status status = pa_check_lengths(num_seqs, cu_seqlens_q, "cu_seqlens_q", NULL, cu_seqlens_k,
                                      "cu_seqlens_k", 0, caller);
  if (status != PA_OK) return status;
  if (num_seqs > 0 && !cu_seqlens_k) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: cu_seqlens_k is NULL", caller);
  }
  int64_t rows = num_seqs > 0 ? cu_seqlens_q[num_seqs] : 0;
  int64_t keys = num_seqs > 0 ? cu_seqlens_k[num_seqs] : 0;
  status = check_io(layer, rows, query, query_stride, out, out_stride, caller);
  if (status != PA_OK) return status;
  int64_t kv_width = (int64_t)layer->num_kv_heads * layer->head_size;
  size_t act_size = pa_dtype_size(layer->dtype);
  if (keys > 0) {
    if (!key) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: key is NULL", caller);
    if (!value) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: value is NULL", caller);
    status = pa_check_rows(keys, key_stride, kv_width, act_size, caller, "key_stride");
    if (status == PA_OK) {
      status = pa_check_rows(keys, value_stride, kv_width, act_size, caller, "value_stride");
    }
    if (status != PA_OK) return status;
  }
  if (rows == 0) return PA_OK;

  pa_attention_call call = {
      .query = query,
      .query_row_bytes = row_bytes(rows, query_stride, act_size),
      .out = out,
      .out_row_bytes = row_bytes(rows, out_stride, act_size),
      .lse = lse,
      .kv = {.key = key,
             .value = value,
             .dtype = layer->dtype,
             .row_starts = cu_seqlens_k,
             .head_bytes = (int64_t)layer->head_size * (int64_t)act_size,
             .key_row_bytes = row_bytes(keys, key_stride, act_size),
             .value_row_bytes = row_bytes(keys, value_stride, act_size)},
      .q_factor = layer->scale,
      .v_factor = 1.0f,
  };
  pa_plan_request request = {
      .num_threads = ctx->num_threads,
      .num_heads = layer->num_heads,
      .num_kv_heads = layer->num_kv_heads,
      .head_size = layer->head_size,
      .mask = pa_layer_mask(layer),
      .num_seqs = num_seqs,
      .q_starts = cu_seqlens_q,
      .kv_lens = NULL,
      .kv_starts = cu_seqlens_k,
  };
  return plan_reserve_run(ctx, layer, NULL, &request, &call, caller);
}
