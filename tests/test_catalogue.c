/*
 * A catalogue of named bad inputs across every entry point. Each row breaks
 * one argument of a valid call and states the exact status, the argument the
 * message must name and (where the contract asks for it) the position and
 * value it must show. The runner checks, for every row, that the failed call
 * wrote nothing: no byte of any cache, output or lse, no handle returned,
 * and that its inputs are as they were.
 *
 * test_errors.c walks the same contract call by call; this file is the one
 * table a reviewer reads to see which hostile inputs are covered.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define INV PA_ERR_INVALID_ARGUMENT
#define OOR PA_ERR_OUT_OF_RANGE
#define UNS PA_ERR_UNSUPPORTED

/* The fixture: one valid call of every entry point (a decoder layer with
 * GQA, two sequences over a paged cache of 8 blocks of 4 tokens). */
enum { NH = 4, NKV = 2, D = 16, BS = 4, NB = 8, BT_STRIDE = 4, ROWS = 4, KROWS = 15 };
enum { QW = NH * D, KW = NKV * D };
/* Caches get this many times the memory their geometry needs, so that a
 * call which missed a bad geometry writes into watched memory instead of
 * corrupting the heap. */
enum { ROOM = 128 };

static pa_context *g_ctx;
static pa_layer *g_layer;                /* the fixture's */
static pa_plan *g_plan;                  /* made for the fixture's layer and batch */
static pa_plan *g_plan_mha, *g_plan_d32; /* made for layers of other geometry */
/* Layers of head size 8 (4 heads over 2) and 40 (one head), for tiled
 * caches whose head size matches the layer's but not the tiles'. */
static pa_layer *g_layer_d8, *g_layer_d40;
static pa_kv_cache g_cache, g_cache2, g_fp8;
static float *g_query, *g_out, *g_lse, *g_krows, *g_vrows, *g_lse_a, *g_lse_b;
/* Arrays of valid entries that end at an inaccessible page: a call that
 * believes a lying count reads past them and faults. */
static int64_t *g_guarded_pairs, *g_guarded_slots;

typedef enum entry {
  CONTEXT,
  HEAD_SIZE,
  LAYER,
  WRITE_KV,
  COPY,
  SWAP,
  PLAN,
  PAGED,
  VARLEN,
  MERGE
} entry;
static const char *const entry_names[] = {
    "pa_context_create",   "pa_validate_head_size", "pa_layer_create", "pa_write_kv",
    "pa_copy_blocks",      "pa_swap_blocks",        "pa_plan_create",  "pa_paged_attention",
    "pa_varlen_attention", "pa_merge_states"};

/* Every argument of every entry point; defaults() makes each call valid. */
typedef struct args {
  pa_context *ctx;
  /* pa_context_create, pa_validate_head_size */
  int num_threads;
  const char *isa_env; /* PA_ISA during the call; NULL leaves it alone */
  int head_size;
  /* pa_layer_create */
  pa_layer_config config;
  const pa_layer_config *config_p;
  float slopes[NH], sinks[NH];
  /* Handles a call returns: each must stay NULL when it fails. */
  pa_context *made_ctx, **ctx_out;
  pa_layer *made_layer, **layer_out;
  pa_plan *made_plan, **plan_out;
  /* Caches: cache is written, attended, copied (caches[0]) and swapped
   * from; other is copied (caches[1]) and swapped to. */
  pa_kv_cache cache, other, caches[2];
  const pa_kv_cache *cache_p, *other_p, *caches_p;
  int num_caches;
  /* pa_write_kv */
  const void *key, *value;
  int64_t key_stride, value_stride;
  pa_dtype src_dtype;
  int64_t num_tokens;
  int64_t slots[3];
  const int64_t *slot_mapping;
  /* pa_copy_blocks, pa_swap_blocks */
  int64_t pairs[4];
  const int64_t *block_pairs;
  int64_t num_pairs;
  /* pa_plan_create, pa_paged_attention */
  const pa_layer *layer;
  const pa_plan *plan;
  int32_t qsl[3], seq_lens[2], bt[2 * BT_STRIDE];
  pa_batch batch;
  const pa_batch *batch_p;
  const void *query;
  int64_t query_stride;
  void *out;
  int64_t out_stride;
  float *lse;
  /* pa_varlen_attention (query, out and lse as above) */
  int num_seqs;
  int32_t cu_k[3];
  const int32_t *cu_seqlens_q, *cu_seqlens_k;
  const void *vkey, *vvalue;
  int64_t vkey_stride, vvalue_stride;
  /* pa_merge_states: the query's rows and the key rows merged into out
   * (and lse), as above */
  int64_t merge_rows;
  int merge_heads, merge_head_size;
  pa_dtype merge_dtype;
  const void *out_a, *out_b;
  int64_t a_stride, b_stride;
  const float *lse_a, *lse_b;
} args;

static pa_layer_config base_config(void) {
  pa_layer_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.num_heads = NH;
  cfg.num_kv_heads = NKV;
  cfg.head_size = D;
  cfg.attn_type = PA_ATTN_DECODER;
  cfg.dtype = PA_F32;
  return cfg;
}

static void defaults(args *a) {
  memset(a, 0, sizeof *a);
  a->ctx = g_ctx;
  a->num_threads = 1;
  a->head_size = 64;
  a->config = base_config();
  a->config_p = &a->config;
  for (int h = 0; h < NH; h++) a->slopes[h] = a->sinks[h] = 0.25f * (float)h;
  a->ctx_out = &a->made_ctx;
  a->layer_out = &a->made_layer;
  a->plan_out = &a->made_plan;
  a->cache = a->caches[0] = g_cache;
  a->other = a->caches[1] = g_cache2;
  a->cache_p = &a->cache;
  a->other_p = &a->other;
  a->caches_p = a->caches;
  a->num_caches = 2;
  a->key = a->vkey = g_krows;
  a->value = a->vvalue = g_vrows;
  a->key_stride = a->value_stride = a->vkey_stride = a->vvalue_stride = KW;
  a->src_dtype = PA_F32;
  a->num_tokens = 3;
  memcpy(a->slots, (int64_t[]){1, 9, 30}, sizeof a->slots);
  a->slot_mapping = a->slots;
  memcpy(a->pairs, (int64_t[]){0, 1, 3, 4}, sizeof a->pairs);
  a->block_pairs = a->pairs;
  a->num_pairs = 2;
  a->layer = g_layer;
  memcpy(a->qsl, (int32_t[]){0, 3, 4}, sizeof a->qsl);
  memcpy(a->seq_lens, (int32_t[]){6, 9}, sizeof a->seq_lens);
  memcpy(a->bt, (int32_t[]){5, 2, -1, -1, 0, 7, 3, -1}, sizeof a->bt);
  a->batch = (pa_batch){2, a->qsl, a->seq_lens, a->bt, BT_STRIDE};
  a->batch_p = &a->batch;
  a->query = g_query;
  a->query_stride = a->out_stride = QW;
  a->out = g_out;
  a->lse = g_lse;
  a->num_seqs = 2;
  memcpy(a->cu_k, (int32_t[]){0, 6, 15}, sizeof a->cu_k);
  a->cu_seqlens_q = a->qsl;
  a->cu_seqlens_k = a->cu_k;
  a->merge_rows = ROWS;
  a->merge_heads = NH;
  a->merge_head_size = D;
  a->merge_dtype = PA_F32;
  a->out_a = g_query;
  a->out_b = g_krows; /* KROWS x KW floats hold ROWS x QW */
  a->a_stride = a->b_stride = QW;
  a->lse_a = g_lse_a;
  a->lse_b = g_lse_b;
}

static pa_status call(const args *a, entry e) {
  switch (e) {
    case CONTEXT: return pa_context_create(a->num_threads, a->ctx_out);
    case HEAD_SIZE: return pa_validate_head_size(a->head_size);
    case LAYER: return pa_layer_create(a->config_p, a->layer_out);
    case WRITE_KV:
      return pa_write_kv(a->ctx, a->cache_p, a->key, a->key_stride, a->value, a->value_stride,
                         a->src_dtype, a->num_tokens, a->slot_mapping);
    case COPY:
      return pa_copy_blocks(a->ctx, a->caches_p, a->num_caches, a->block_pairs, a->num_pairs);
    case SWAP: return pa_swap_blocks(a->ctx, a->cache_p, a->other_p, a->block_pairs, a->num_pairs);
    case PLAN: return pa_plan_create(a->ctx, a->layer, a->batch_p, a->plan_out);
    case PAGED:
      return pa_paged_attention(a->ctx, a->layer, a->plan, a->query, a->query_stride, a->cache_p,
                                a->batch_p, a->out, a->out_stride, a->lse);
    case VARLEN:
      return pa_varlen_attention(a->ctx, a->layer, a->query, a->query_stride, a->vkey,
                                 a->vkey_stride, a->vvalue, a->vvalue_stride, a->num_seqs,
                                 a->cu_seqlens_q, a->cu_seqlens_k, a->out, a->out_stride, a->lse);
    case MERGE:
      return pa_merge_states(a->ctx, a->merge_rows, a->merge_heads, a->merge_head_size,
                             a->merge_dtype, a->out_a, a->a_stride, a->lse_a, a->out_b, a->b_stride,
                             a->lse_b, a->out, a->out_stride, a->lse);
  }
  return PA_OK;
}

/* ---- the catalogue --------------------------------------------------------
 * X(name, entry point, status, argument the message names ('|' separates
 *   alternatives), value or position it shows (NULL: not checked), edit of
 *   the valid call) */
#define CATALOGUE(X)                                                                               \
  /* pa_context_create */                                                                          \
  X(context_out_null, CONTEXT, INV, "ctx", NULL, a->ctx_out = NULL)                                \
  X(context_threads_over_limit, CONTEXT, INV, "num_threads", "4096", a->num_threads = 4096)        \
  X(context_isa_unknown, CONTEXT, INV, "PA_ISA", "bogus", a->isa_env = "bogus")                    \
  /* pa_validate_head_size: the message lists the supported range */                               \
  X(head_size_zero, HEAD_SIZE, INV, "head_size", "1024", a->head_size = 0)                         \
  X(head_size_1025, HEAD_SIZE, INV, "head_size", "1025", a->head_size = 1025)                      \
  X(head_size_negative, HEAD_SIZE, INV, "head_size", "-3", a->head_size = -3)                      \
  /* pa_layer_create */                                                                            \
  X(layer_config_null, LAYER, INV, "config", NULL, a->config_p = NULL)                             \
  X(layer_out_null, LAYER, INV, "layer", NULL, a->layer_out = NULL)                                \
  X(layer_num_heads_zero, LAYER, INV, "num_heads", "0", a->config.num_heads = 0)                   \
  X(layer_num_heads_negative, LAYER, INV, "num_heads", "-4", a->config.num_heads = -4)             \
  X(layer_num_heads_over_limit, LAYER, INV, "num_heads", "65537", a->config.num_heads = 65537;     \
    a->config.num_kv_heads = 0)                                                                    \
  X(layer_num_kv_heads_negative, LAYER, INV, "num_kv_heads", "-1", a->config.num_kv_heads = -1)    \
  X(layer_heads_not_divisible, LAYER, INV, "num_kv_heads", "3", a->config.num_kv_heads = 3)        \
  X(layer_more_kv_heads_than_heads, LAYER, INV, "num_kv_heads", "8", a->config.num_kv_heads = 8)   \
  X(layer_head_size_zero, LAYER, INV, "head_size", "0", a->config.head_size = 0)                   \
  X(layer_head_size_1025, LAYER, INV, "head_size", "1025", a->config.head_size = 1025)             \
  X(layer_scale_nan, LAYER, INV, "scale", "nan", a->config.scale = NAN)                            \
  X(layer_scale_inf, LAYER, INV, "scale", "inf", a->config.scale = INFINITY)                       \
  X(layer_scale_negative, LAYER, INV, "scale", "-0.125", a->config.scale = -0.125f)                \
  X(layer_window_negative, LAYER, INV, "sliding_window", "-1", a->config.sliding_window = -1)      \
  X(layer_soft_cap_nan, LAYER, INV, "logits_soft_cap", "nan", a->config.logits_soft_cap = NAN)     \
  X(layer_soft_cap_inf, LAYER, INV, "logits_soft_cap", "inf",                                      \
    a->config.logits_soft_cap = INFINITY)                                                          \
  X(layer_soft_cap_negative, LAYER, INV, "logits_soft_cap", "-30",                                 \
    a->config.logits_soft_cap = -30.0f)                                                            \
  X(layer_attn_type_invalid, LAYER, INV, "attn_type", "4", a->config.attn_type = (pa_attn_type)4)  \
  X(layer_dtype_fp8_e4m3, LAYER, UNS, "dtype", "fp8_e4m3", a->config.dtype = PA_FP8_E4M3)          \
  X(layer_dtype_fp8_e5m2, LAYER, UNS, "dtype", "fp8_e5m2", a->config.dtype = PA_FP8_E5M2)          \
  X(layer_dtype_invalid, LAYER, INV, "dtype", "9", a->config.dtype = (pa_dtype)9)                  \
  X(layer_alibi_slope_nan, LAYER, INV, "alibi_slopes", "[2]", a->slopes[2] = NAN;                  \
    a->config.alibi_slopes = a->slopes)                                                            \
  X(layer_alibi_slope_inf, LAYER, INV, "alibi_slopes", "[0]", a->slopes[0] = -INFINITY;            \
    a->config.alibi_slopes = a->slopes)                                                            \
  X(layer_sink_nan, LAYER, INV, "sinks", "[3]", a->sinks[3] = NAN; a->config.sinks = a->sinks)     \
  X(layer_sink_inf, LAYER, INV, "sinks", "[1]", a->sinks[1] = INFINITY;                            \
    a->config.sinks = a->sinks)                                                                    \
  /* pa_write_kv */                                                                                \
  X(write_ctx_null, WRITE_KV, INV, "ctx", NULL, a->ctx = NULL)                                     \
  X(write_cache_null, WRITE_KV, INV, "cache", NULL, a->cache_p = NULL)                             \
  X(write_key_null, WRITE_KV, INV, "key", NULL, a->key = NULL)                                     \
  X(write_value_null, WRITE_KV, INV, "value", NULL, a->value = NULL)                               \
  X(write_slot_mapping_null, WRITE_KV, INV, "slot_mapping", NULL, a->slot_mapping = NULL)          \
  X(write_num_tokens_negative, WRITE_KV, INV, "num_tokens", "-1", a->num_tokens = -1)              \
  /* 2^61 slots of 8 bytes exceed the address space; rows of one f16 do not */                     \
  X(write_num_tokens_overflow, WRITE_KV, INV, "num_tokens", "2305843009213693952",                 \
    a->cache.num_kv_heads = 1;                                                                     \
    a->cache.head_size = 1; a->src_dtype = PA_F16; a->key_stride = a->value_stride = 1;            \
    a->slot_mapping = g_guarded_slots; a->num_tokens = (int64_t)1 << 61)                           \
  X(write_key_stride_short, WRITE_KV, INV, "key_stride", "31", a->key_stride = KW - 1)             \
  X(write_value_stride_zero, WRITE_KV, INV, "value_stride", "0", a->value_stride = 0)              \
  X(write_key_stride_negative, WRITE_KV, INV, "key_stride", "-9223372036854775808",                \
    a->key_stride = INT64_MIN)                                                                     \
  X(write_value_stride_overflow, WRITE_KV, INV, "value_stride", NULL,                              \
    a->value_stride = INT64_MAX / 2)                                                               \
  X(write_src_fp8_e4m3, WRITE_KV, UNS, "src_dtype", "fp8_e4m3", a->src_dtype = PA_FP8_E4M3)        \
  X(write_src_fp8_e5m2, WRITE_KV, UNS, "src_dtype", "fp8_e5m2", a->src_dtype = PA_FP8_E5M2)        \
  X(write_src_dtype_invalid, WRITE_KV, INV, "src_dtype", "7", a->src_dtype = (pa_dtype)7)          \
  X(write_slot_at_end, WRITE_KV, OOR, "slot_mapping", "[1] = 32",                                  \
    memcpy(a->slots, (int64_t[]){1, NB * BS, 2}, sizeof a->slots))                                 \
  X(write_slot_int64_max, WRITE_KV, OOR, "slot_mapping", "[2] = 9223372036854775807",              \
    a->slots[2] = INT64_MAX)                                                                       \
  X(write_slot_far_after_padding, WRITE_KV, OOR, "slot_mapping", "[2] = 1000",                     \
    memcpy(a->slots, (int64_t[]){-1, INT64_MIN, 1000}, sizeof a->slots))                           \
  X(write_cache_key_null, WRITE_KV, INV, "cache->key", NULL, a->cache.key = NULL)                  \
  X(write_cache_value_null, WRITE_KV, INV, "cache->value", NULL, a->cache.value = NULL)            \
  X(write_cache_block_size_zero, WRITE_KV, INV, "block_size", "0", a->cache.block_size = 0)        \
  X(write_cache_block_size_negative, WRITE_KV, INV, "block_size", "-4", a->cache.block_size = -4)  \
  X(write_cache_kv_heads_zero, WRITE_KV, INV, "num_kv_heads", "0", a->cache.num_kv_heads = 0)      \
  X(write_cache_head_size_zero, WRITE_KV, INV, "head_size", "0", a->cache.head_size = 0)           \
  X(write_cache_head_size_1025, WRITE_KV, INV, "head_size", "1025", a->cache.head_size = 1025)     \
  X(write_cache_dtype_invalid, WRITE_KV, INV, "dtype", "9", a->cache.dtype = (pa_dtype)9)          \
  X(write_cache_num_blocks_negative, WRITE_KV, INV, "num_blocks", "-1", a->cache.num_blocks = -1)  \
  X(write_cache_bytes_overflow, WRITE_KV, INV, "num_blocks", NULL,                                 \
    a->cache.num_blocks = INT64_MAX / 64)                                                          \
  X(write_fp8_k_scale_zero, WRITE_KV, INV, "k_scale", "0", a->cache = g_fp8;                       \
    a->cache.k_scale = 0.0f)                                                                       \
  X(write_fp8_k_scale_nan, WRITE_KV, INV, "k_scale", "nan", a->cache = g_fp8;                      \
    a->cache.k_scale = NAN)                                                                        \
  X(write_fp8_k_scale_negative, WRITE_KV, INV, "k_scale", "-1", a->cache = g_fp8;                  \
    a->cache.k_scale = -1.0f)                                                                      \
  X(write_fp8_v_scale_inf, WRITE_KV, INV, "v_scale", "inf", a->cache = g_fp8;                      \
    a->cache.v_scale = INFINITY)                                                                   \
  /* pa_write_kv: the 0.2 strides (a tile is BS * D = 64 elements) */                              \
  X(write_head_stride_negative, WRITE_KV, INV, "head_stride", "-1", a->cache.head_stride = -1)     \
  X(write_block_stride_negative, WRITE_KV, INV, "block_stride", "-5", a->cache.block_stride = -5)  \
  X(write_head_stride_below_tile, WRITE_KV, INV, "head_stride", "63", a->cache.head_stride = 63)   \
  X(write_block_stride_below_heads, WRITE_KV, INV, "block_stride", "127",                          \
    a->cache.block_stride = NKV * BS * D - 1)                                                      \
  X(write_block_stride_below_strided_heads, WRITE_KV, INV, "block_stride", "= 255",                \
    a->cache.head_stride = 2 * BS * D;                                                             \
    a->cache.block_stride = 2 * NKV * BS * D - 1)                                                  \
  X(write_block_stride_zero_with_strided_heads, WRITE_KV, INV, "block_stride", "= 256",            \
    a->cache.head_stride = 2 * BS * D)                                                             \
  X(write_head_stride_over_heads_overflow, WRITE_KV, INV, "head_stride", "4611686018427387904",    \
    a->cache.head_stride = (int64_t)1 << 62;                                                       \
    a->cache.block_stride = INT64_MAX)                                                             \
  X(write_strided_extent_overflow, WRITE_KV, INV, "block_stride", "2305843009213693951",           \
    a->cache.block_stride = INT64_MAX / 4)                                                         \
  X(write_strided_extent_bytes_overflow, WRITE_KV, INV, "block_stride", NULL,                      \
    a->cache.block_stride = INT64_MAX / 16)                                                        \
  /* pa_write_kv: the 0.3 layout (a tiled cache needs block and head sizes multiples of 16) */     \
  X(write_layout_2, WRITE_KV, INV, "cache->layout", "2", a->cache.layout = (pa_kv_layout)2)        \
  X(write_layout_negative, WRITE_KV, INV, "cache->layout", "-1",                                   \
    a->cache.layout = (pa_kv_layout)-1)                                                            \
  X(write_tiled_block_size_4, WRITE_KV, UNS, "cache->layout", "4", a->cache.layout = PA_KV_TILED)  \
  X(write_tiled_block_size_17, WRITE_KV, UNS, "cache->layout", "17",                               \
    a->cache.layout = PA_KV_TILED;                                                                 \
    a->cache.block_size = 17)                                                                      \
  X(write_tiled_block_size_8, WRITE_KV, UNS, "cache->layout", "8", a->cache.layout = PA_KV_TILED;  \
    a->cache.block_size = 8)                                                                       \
  X(write_tiled_head_size_40, WRITE_KV, UNS, "cache->layout", "40", a->cache.layout = PA_KV_TILED; \
    a->cache.block_size = 16; a->cache.head_size = 40; a->key_stride = a->value_stride = NKV * 40) \
  X(write_tiled_head_size_8, WRITE_KV, UNS, "cache->layout", "and 8",                              \
    a->cache.layout = PA_KV_TILED;                                                                 \
    a->cache.block_size = 16; a->cache.head_size = 8)                                              \
  /* pa_copy_blocks */                                                                             \
  X(copy_ctx_null, COPY, INV, "ctx", NULL, a->ctx = NULL)                                          \
  X(copy_caches_null, COPY, INV, "caches", NULL, a->caches_p = NULL)                               \
  X(copy_num_caches_negative, COPY, INV, "num_caches", "-1", a->num_caches = -1)                   \
  X(copy_block_pairs_null, COPY, INV, "block_pairs", NULL, a->block_pairs = NULL)                  \
  X(copy_num_pairs_negative, COPY, INV, "num_pairs", "-1", a->num_pairs = -1)                      \
  X(copy_num_pairs_overflow, COPY, INV, "num_pairs", "9223372036854775807",                        \
    a->block_pairs = g_guarded_pairs;                                                              \
    a->num_pairs = INT64_MAX)                                                                      \
  X(copy_source_past_end, COPY, OOR, "block_pairs", "[1][0] = 8",                                  \
    memcpy(a->pairs, (int64_t[]){0, 1, NB, 1}, sizeof a->pairs))                                   \
  X(copy_destination_negative, COPY, OOR, "block_pairs", "[1][1] = -5",                            \
    memcpy(a->pairs, (int64_t[]){0, 1, 2, -5}, sizeof a->pairs))                                   \
  X(copy_id_inside_first_cache_only, COPY, OOR, "block_pairs", "caches[1]",                        \
    a->caches[1].num_blocks = 4;                                                                   \
    memcpy(a->pairs, (int64_t[]){0, 1, 2, 6}, sizeof a->pairs))                                    \
  X(copy_second_cache_value_null, COPY, INV, "value", "caches[1]", a->caches[1].value = NULL)      \
  X(copy_second_cache_block_size_zero, COPY, INV, "block_size", "caches[1]",                       \
    a->caches[1].block_size = 0)                                                                   \
  X(copy_second_cache_fp8_scale_nan, COPY, INV, "v_scale", "caches[1]", a->caches[1] = g_fp8;      \
    a->caches[1].v_scale = NAN)                                                                    \
  X(copy_second_cache_head_stride_negative, COPY, INV, "caches[1]->head_stride", "-64",            \
    a->caches[1].head_stride = -64)                                                                \
  X(copy_first_cache_head_stride_below_tile, COPY, INV, "caches[0]->head_stride", "1",             \
    a->caches[0].head_stride = 1)                                                                  \
  X(copy_second_cache_block_stride_below_heads, COPY, INV, "caches[1]->block_stride", "200",       \
    a->caches[1].head_stride = 2 * BS * D;                                                         \
    a->caches[1].block_stride = 200)                                                               \
  X(copy_second_cache_strided_extent_overflow, COPY, INV, "caches[1]->block_stride", NULL,         \
    a->caches[1].block_stride = INT64_MAX / 2)                                                     \
  /* pa_copy_blocks: the 0.3 layout */                                                             \
  X(copy_second_cache_layout_2, COPY, INV, "caches[1]->layout", "2",                               \
    a->caches[1].layout = (pa_kv_layout)2)                                                         \
  X(copy_second_cache_layout_negative, COPY, INV, "caches[1]->layout", "-1",                       \
    a->caches[1].layout = (pa_kv_layout)-1)                                                        \
  X(copy_second_cache_tiled_block_size_4, COPY, UNS, "caches[1]->layout", "4",                     \
    a->caches[1].layout = PA_KV_TILED)                                                             \
  X(copy_second_cache_tiled_block_size_17, COPY, UNS, "caches[1]->layout", "17",                   \
    a->caches[1].layout = PA_KV_TILED;                                                             \
    a->caches[1].block_size = 17)                                                                  \
  X(copy_second_cache_tiled_block_size_8, COPY, UNS, "caches[1]->layout", "8",                     \
    a->caches[1].layout = PA_KV_TILED;                                                             \
    a->caches[1].block_size = 8)                                                                   \
  X(copy_second_cache_tiled_head_size_40, COPY, UNS, "caches[1]->layout", "40",                    \
    a->caches[1].layout = PA_KV_TILED;                                                             \
    a->caches[1].block_size = 16; a->caches[1].head_size = 40)                                     \
  X(copy_second_cache_tiled_head_size_8, COPY, UNS, "caches[1]->layout", "and 8",                  \
    a->caches[1].layout = PA_KV_TILED;                                                             \
    a->caches[1].block_size = 16; a->caches[1].head_size = 8)                                      \
  X(copy_first_cache_layout_2, COPY, INV, "caches[0]->layout", "2",                                \
    a->caches[0].layout = (pa_kv_layout)2)                                                         \
  X(copy_first_cache_tiled_block_size_17, COPY, UNS, "caches[0]->layout", "17",                    \
    a->caches[0].layout = PA_KV_TILED;                                                             \
    a->caches[0].block_size = 17)                                                                  \
  /* pa_swap_blocks */                                                                             \
  X(swap_ctx_null, SWAP, INV, "ctx", NULL, a->ctx = NULL)                                          \
  X(swap_src_null, SWAP, INV, "src", NULL, a->cache_p = NULL)                                      \
  X(swap_dst_null, SWAP, INV, "dst", NULL, a->other_p = NULL)                                      \
  X(swap_block_pairs_null, SWAP, INV, "block_pairs", NULL, a->block_pairs = NULL)                  \
  X(swap_num_pairs_negative, SWAP, INV, "num_pairs", "-3", a->num_pairs = -3)                      \
  X(swap_num_pairs_overflow, SWAP, INV, "num_pairs", "1152921504606846976",                        \
    a->block_pairs = g_guarded_pairs;                                                              \
    a->num_pairs = (int64_t)1 << 60)                                                               \
  X(swap_dst_block_size_differs, SWAP, INV, "dst", NULL, a->other.block_size = 2 * BS)             \
  X(swap_dst_kv_heads_differ, SWAP, INV, "dst", NULL, a->other.num_kv_heads = 1)                   \
  X(swap_dst_head_size_differs, SWAP, INV, "dst", NULL, a->other.head_size = 8)                    \
  X(swap_dst_dtype_differs, SWAP, INV, "dst", "bf16", a->other.dtype = PA_BF16)                    \
  X(swap_fp8_k_scales_differ, SWAP, INV, "dst", "0.75", a->cache = g_fp8; a->other = g_fp8;        \
    a->other.key = g_cache2.key; a->other.value = g_cache2.value; a->other.k_scale = 0.75f)        \
  X(swap_src_block_past_end, SWAP, OOR, "block_pairs", "[1][0] = 8",                               \
    memcpy(a->pairs, (int64_t[]){0, 1, NB, 2}, sizeof a->pairs))                                   \
  X(swap_dst_block_past_smaller_dst, SWAP, OOR, "block_pairs", "[1][1] = 3",                       \
    a->other.num_blocks = 3;                                                                       \
    memcpy(a->pairs, (int64_t[]){0, 1, 5, 3}, sizeof a->pairs))                                    \
  X(swap_src_head_size_1025, SWAP, INV, "head_size", "1025", a->cache.head_size = 1025)            \
  X(swap_src_head_stride_negative, SWAP, INV, "src->head_stride", "-1", a->cache.head_stride = -1) \
  X(swap_dst_block_stride_negative, SWAP, INV, "dst->block_stride", "-128",                        \
    a->other.block_stride = -128)                                                                  \
  X(swap_dst_head_stride_below_tile, SWAP, INV, "dst->head_stride", "32",                          \
    a->other.head_stride = 32)                                                                     \
  X(swap_src_block_stride_below_strided_heads, SWAP, INV, "src->block_stride", "192",              \
    a->cache.head_stride = 2 * BS * D;                                                             \
    a->cache.block_stride = 192)                                                                   \
  X(swap_dst_strided_extent_overflow, SWAP, INV, "dst->block_stride", NULL,                        \
    a->other.head_stride = INT64_MAX / 8;                                                          \
    a->other.block_stride = INT64_MAX / 4)                                                         \
  /* pa_swap_blocks: the 0.3 layout (src and dst must share it) */                                 \
  X(swap_src_layout_2, SWAP, INV, "src->layout", "2", a->cache.layout = (pa_kv_layout)2)           \
  X(swap_dst_layout_negative, SWAP, INV, "dst->layout", "-1", a->other.layout = (pa_kv_layout)-1)  \
  X(swap_src_layout_negative, SWAP, INV, "src->layout", "-1", a->cache.layout = (pa_kv_layout)-1)  \
  X(swap_dst_layout_2, SWAP, INV, "dst->layout", "2", a->other.layout = (pa_kv_layout)2)           \
  X(swap_rows_to_tiled, SWAP, INV, "layout", NULL, a->cache.block_size = a->other.block_size = 16; \
    a->other.layout = PA_KV_TILED)                                                                 \
  X(swap_tiled_to_rows, SWAP, INV, "layout", NULL, a->cache.block_size = a->other.block_size = 16; \
    a->cache.layout = PA_KV_TILED)                                                                 \
  X(swap_tiled_block_size_4, SWAP, UNS, "layout", "4",                                             \
    a->cache.layout = a->other.layout = PA_KV_TILED)                                               \
  X(swap_tiled_block_size_17, SWAP, UNS, "layout", "17",                                           \
    a->cache.block_size = a->other.block_size = 17;                                                \
    a->cache.layout = a->other.layout = PA_KV_TILED)                                               \
  X(swap_tiled_block_size_8, SWAP, UNS, "layout", "8",                                             \
    a->cache.block_size = a->other.block_size = 8;                                                 \
    a->cache.layout = a->other.layout = PA_KV_TILED)                                               \
  X(swap_tiled_head_size_40, SWAP, UNS, "layout", "40",                                            \
    a->cache.block_size = a->other.block_size = 16;                                                \
    a->cache.head_size = a->other.head_size = 40; a->cache.layout = a->other.layout = PA_KV_TILED) \
  X(swap_tiled_head_size_8, SWAP, UNS, "layout", "and 8",                                          \
    a->cache.block_size = a->other.block_size = 16;                                                \
    a->cache.head_size = a->other.head_size = 8; a->cache.layout = a->other.layout = PA_KV_TILED)  \
  X(plan_ctx_null, PLAN, INV, "ctx", NULL, a->ctx = NULL)                                          \
  X(plan_layer_null, PLAN, INV, "layer", NULL, a->layer = NULL)                                    \
  X(plan_batch_null, PLAN, INV, "batch", NULL, a->batch_p = NULL)                                  \
  X(plan_out_null, PLAN, INV, "plan", NULL, a->plan_out = NULL)                                    \
  X(plan_num_seqs_negative, PLAN, INV, "num_seqs", "-1", a->batch.num_seqs = -1)                   \
  X(plan_query_start_loc_null, PLAN, INV, "query_start_loc", NULL,                                 \
    a->batch.query_start_loc = NULL)                                                               \
  X(plan_seq_lens_null, PLAN, INV, "seq_lens", NULL, a->batch.seq_lens = NULL)                     \
  X(plan_query_start_loc_not_from_zero, PLAN, INV, "query_start_loc", "[0] = 1", a->qsl[0] = 1)    \
  X(plan_query_start_loc_decreasing, PLAN, INV, "query_start_loc", "[2] = 2", a->qsl[2] = 2)       \
  X(plan_query_start_loc_near_int32_max, PLAN, INV, "query_start_loc", "[2] = 4",                  \
    a->qsl[1] = INT32_MAX)                                                                         \
  X(plan_seq_len_negative, PLAN, INV, "seq_lens", "[1] = -1", a->seq_lens[1] = -1)                 \
  X(plan_decoder_q_len_over_seq_len, PLAN, INV, "seq_lens", "[0] = 2", a->seq_lens[0] = 2)         \
  /* pa_paged_attention: pointers and strides */                                                   \
  X(paged_ctx_null, PAGED, INV, "ctx", NULL, a->ctx = NULL)                                        \
  X(paged_layer_null, PAGED, INV, "layer", NULL, a->layer = NULL)                                  \
  X(paged_query_null, PAGED, INV, "query", NULL, a->query = NULL)                                  \
  X(paged_cache_null, PAGED, INV, "cache", NULL, a->cache_p = NULL)                                \
  X(paged_batch_null, PAGED, INV, "batch", NULL, a->batch_p = NULL)                                \
  X(paged_out_null, PAGED, INV, "out", NULL, a->out = NULL)                                        \
  X(paged_query_stride_short, PAGED, INV, "query_stride", "63", a->query_stride = QW - 1)          \
  X(paged_out_stride_short, PAGED, INV, "out_stride", "16", a->out_stride = D)                     \
  X(paged_query_stride_overflow, PAGED, INV, "query_stride", NULL,                                 \
    a->query_stride = INT64_MAX / 2)                                                               \
  /* pa_paged_attention: the batch */                                                              \
  X(paged_num_seqs_negative, PAGED, INV, "num_seqs", "-1", a->batch.num_seqs = -1)                 \
  X(paged_query_start_loc_null, PAGED, INV, "query_start_loc", NULL,                               \
    a->batch.query_start_loc = NULL)                                                               \
  X(paged_seq_lens_null, PAGED, INV, "seq_lens", NULL, a->batch.seq_lens = NULL)                   \
  X(paged_block_tables_null, PAGED, INV, "block_tables", NULL, a->batch.block_tables = NULL)       \
  X(paged_query_start_loc_negative_start, PAGED, INV, "query_start_loc", "[0] = -1",               \
    a->qsl[0] = -1)                                                                                \
  X(paged_query_start_loc_decreasing, PAGED, INV, "query_start_loc", "[2] = 2", a->qsl[2] = 2)     \
  X(paged_decoder_q_len_over_seq_len, PAGED, INV, "seq_lens", "[0] = 2", a->seq_lens[0] = 2)       \
  X(paged_seq_len_negative, PAGED, INV, "seq_lens", "[0] = -6", a->seq_lens[0] = -6)               \
  X(paged_seq_len_beyond_table_row, PAGED, OOR, "seq_lens", "[1] = 17", a->seq_lens[1] = 17)       \
  X(paged_seq_len_int32_max, PAGED, OOR, "seq_lens", "2147483647", a->seq_lens[1] = INT32_MAX)     \
  X(paged_block_table_stride_short, PAGED, OOR, "block_table_stride", "= 1",                       \
    a->batch.block_table_stride = 1)                                                               \
  X(paged_block_table_stride_negative, PAGED, INV, "block_table_stride", "-1",                     \
    a->batch.block_table_stride = -1)                                                              \
  X(paged_block_id_past_cache, PAGED, OOR, "block_tables", "[1][2] = 912",                         \
    a->bt[BT_STRIDE + 2] = 912)                                                                    \
  X(paged_block_id_at_num_blocks, PAGED, OOR, "block_tables", "[0][1] = 8", a->bt[1] = NB)         \
  X(paged_block_id_negative, PAGED, OOR, "block_tables", "[1][0] = -1", a->bt[BT_STRIDE] = -1)     \
  X(paged_block_id_int32_min, PAGED, OOR, "block_tables", "-2147483648", a->bt[0] = INT32_MIN)     \
  /* pa_paged_attention: the cache against the layer and itself */                                 \
  X(paged_cache_kv_heads_vs_layer, PAGED, INV, "num_kv_heads", "1", a->cache.num_kv_heads = 1)     \
  X(paged_cache_head_size_vs_layer, PAGED, INV, "head_size", "8", a->cache.head_size = 8)          \
  X(paged_cache_block_size_zero, PAGED, INV, "block_size", "0", a->cache.block_size = 0)           \
  X(paged_cache_dtype_invalid, PAGED, INV, "dtype", "9", a->cache.dtype = (pa_dtype)9)             \
  X(paged_cache_value_null, PAGED, INV, "value", NULL, a->cache.value = NULL)                      \
  X(paged_cache_num_blocks_negative, PAGED, INV, "num_blocks", "-1", a->cache.num_blocks = -1)     \
  X(paged_fp8_k_scale_nan, PAGED, INV, "k_scale", "nan", a->cache = g_fp8; a->cache.k_scale = NAN) \
  X(paged_fp8_v_scale_negative, PAGED, INV, "v_scale", "-0.25", a->cache = g_fp8;                  \
    a->cache.v_scale = -0.25f)                                                                     \
  X(paged_cache_head_stride_negative, PAGED, INV, "head_stride", "-9223372036854775808",           \
    a->cache.head_stride = INT64_MIN)                                                              \
  X(paged_cache_block_stride_negative, PAGED, INV, "block_stride", "-1",                           \
    a->cache.block_stride = -1)                                                                    \
  X(paged_cache_head_stride_below_tile, PAGED, INV, "head_stride", "48",                           \
    a->cache.head_stride = 48)                                                                     \
  X(paged_cache_block_stride_below_heads, PAGED, INV, "block_stride", "100",                       \
    a->cache.block_stride = 100)                                                                   \
  X(paged_cache_block_stride_below_strided_heads, PAGED, INV, "block_stride", "= 255",             \
    a->cache.head_stride = 2 * BS * D;                                                             \
    a->cache.block_stride = 255)                                                                   \
  X(paged_cache_strided_extent_overflow, PAGED, INV, "block_stride", NULL,                         \
    a->cache.head_stride = 1 << 20;                                                                \
    a->cache.block_stride = INT64_MAX / 7)                                                         \
  /* pa_paged_attention: the 0.3 layout (layers of head size 8 and 40 for the tiles off 16) */     \
  X(paged_cache_layout_2, PAGED, INV, "cache->layout", "2", a->cache.layout = (pa_kv_layout)2)     \
  X(paged_cache_layout_negative, PAGED, INV, "cache->layout", "-1",                                \
    a->cache.layout = (pa_kv_layout)-1)                                                            \
  X(paged_cache_tiled_block_size_4, PAGED, UNS, "cache->layout", "4",                              \
    a->cache.layout = PA_KV_TILED)                                                                 \
  X(paged_cache_tiled_block_size_17, PAGED, UNS, "cache->layout", "17",                            \
    a->cache.layout = PA_KV_TILED;                                                                 \
    a->cache.block_size = 17)                                                                      \
  X(paged_cache_tiled_block_size_8, PAGED, UNS, "cache->layout", "8",                              \
    a->cache.layout = PA_KV_TILED;                                                                 \
    a->cache.block_size = 8)                                                                       \
  X(paged_cache_tiled_head_size_40, PAGED, UNS, "cache->layout", "40",                             \
    a->cache.layout = PA_KV_TILED;                                                                 \
    a->cache.block_size = 16; a->cache.head_size = 40; a->cache.num_kv_heads = 1;                  \
    a->layer = g_layer_d40)                                                                        \
  X(paged_cache_tiled_head_size_8, PAGED, UNS, "cache->layout", "and 8",                           \
    a->cache.layout = PA_KV_TILED;                                                                 \
    a->cache.block_size = 16; a->cache.head_size = 8; a->layer = g_layer_d8)                       \
  /* pa_paged_attention: a plan made for something else */                                         \
  X(paged_plan_other_seq_lens, PAGED, INV, "plan", "10", a->plan = g_plan; a->seq_lens[1] = 10)    \
  X(paged_plan_other_split, PAGED, INV, "plan", NULL, a->plan = g_plan; a->qsl[1] = 2)             \
  X(paged_plan_other_num_seqs, PAGED, INV, "plan", NULL, a->plan = g_plan; a->batch.num_seqs = 1)  \
  X(paged_plan_other_num_heads, PAGED, INV, "plan", NULL, a->plan = g_plan_mha)                    \
  X(paged_plan_other_head_size, PAGED, INV, "plan", "32", a->plan = g_plan_d32)                    \
  /* pa_varlen_attention */                                                                        \
  X(varlen_ctx_null, VARLEN, INV, "ctx", NULL, a->ctx = NULL)                                      \
  X(varlen_layer_null, VARLEN, INV, "layer", NULL, a->layer = NULL)                                \
  X(varlen_query_null, VARLEN, INV, "query", NULL, a->query = NULL)                                \
  X(varlen_key_null, VARLEN, INV, "key", NULL, a->vkey = NULL)                                     \
  X(varlen_value_null, VARLEN, INV, "value", NULL, a->vvalue = NULL)                               \
  X(varlen_out_null, VARLEN, INV, "out", NULL, a->out = NULL)                                      \
  X(varlen_cu_seqlens_q_null, VARLEN, INV, "cu_seqlens_q", NULL, a->cu_seqlens_q = NULL)           \
  X(varlen_cu_seqlens_k_null, VARLEN, INV, "cu_seqlens_k", NULL, a->cu_seqlens_k = NULL)           \
  X(varlen_num_seqs_negative, VARLEN, INV, "num_seqs", "-1", a->num_seqs = -1)                     \
  X(varlen_query_stride_short, VARLEN, INV, "query_stride", "1", a->query_stride = 1)              \
  X(varlen_key_stride_short, VARLEN, INV, "key_stride", "31", a->vkey_stride = KW - 1)             \
  X(varlen_value_stride_negative, VARLEN, INV, "value_stride", "-1", a->vvalue_stride = -1)        \
  X(varlen_out_stride_zero, VARLEN, INV, "out_stride", "0", a->out_stride = 0)                     \
  X(varlen_cu_seqlens_q_not_from_zero, VARLEN, INV, "cu_seqlens_q", "[0] = 1", a->qsl[0] = 1)      \
  X(varlen_cu_seqlens_q_decreasing, VARLEN, INV, "cu_seqlens_q", "[2] = 1", a->qsl[2] = 1)         \
  X(varlen_cu_seqlens_k_not_from_zero, VARLEN, INV, "cu_seqlens_k", "[0] = 2", a->cu_k[0] = 2)     \
  X(varlen_cu_seqlens_k_decreasing, VARLEN, INV, "cu_seqlens_k", "[2] = 6", a->cu_k[1] = 9;        \
    a->cu_k[2] = 6)                                                                                \
  X(varlen_key_stride_overflow_near_int32_max, VARLEN, INV, "key_stride", NULL,                    \
    a->cu_k[2] = INT32_MAX;                                                                        \
    a->vkey_stride = INT64_MAX / 1024)                                                             \
  /* pa_merge_states */                                                                            \
  X(merge_ctx_null, MERGE, INV, "ctx", NULL, a->ctx = NULL)                                        \
  X(merge_num_rows_negative, MERGE, INV, "num_rows", "-1", a->merge_rows = -1)                     \
  X(merge_num_heads_zero, MERGE, INV, "num_heads", "0", a->merge_heads = 0)                        \
  X(merge_num_heads_over_limit, MERGE, INV, "num_heads", "65537", a->merge_heads = 65537)          \
  X(merge_head_size_zero, MERGE, INV, "head_size", "0", a->merge_head_size = 0)                    \
  X(merge_head_size_1025, MERGE, INV, "head_size", "1025", a->merge_head_size = 1025)              \
  X(merge_dtype_fp8_e4m3, MERGE, UNS, "dtype", "fp8_e4m3", a->merge_dtype = PA_FP8_E4M3)           \
  X(merge_dtype_invalid, MERGE, INV, "dtype", "9", a->merge_dtype = (pa_dtype)9)                   \
  X(merge_out_a_null, MERGE, INV, "out_a", NULL, a->out_a = NULL)                                  \
  X(merge_lse_a_null, MERGE, INV, "lse_a", NULL, a->lse_a = NULL)                                  \
  X(merge_out_b_null, MERGE, INV, "out_b", NULL, a->out_b = NULL)                                  \
  X(merge_lse_b_null, MERGE, INV, "lse_b", NULL, a->lse_b = NULL)                                  \
  X(merge_out_null, MERGE, INV, "out", NULL, a->out = NULL)                                        \
  X(merge_a_stride_short, MERGE, INV, "a_stride", "63", a->a_stride = QW - 1)                      \
  X(merge_b_stride_negative, MERGE, INV, "b_stride", "-1", a->b_stride = -1)                       \
  X(merge_out_stride_zero, MERGE, INV, "out_stride", "0", a->out_stride = 0)                       \
  X(merge_a_stride_overflow, MERGE, INV, "a_stride", NULL, a->a_stride = INT64_MAX / 2)            \
  /* rows of one f16 fit the address space; their lse floats do not */                             \
  X(merge_lse_overflow, MERGE, INV, "num_rows", "2305843009213693952",                             \
    a->merge_rows = (int64_t)1 << 61;                                                              \
    a->merge_heads = a->merge_head_size = 1; a->merge_dtype = PA_F16;                              \
    a->a_stride = a->b_stride = a->out_stride = 1)

#define DEFINE_EDIT(name, entry, status, arg, value, ...) \
  static void edit_##name(args *a) { __VA_ARGS__; }
CATALOGUE(DEFINE_EDIT)
#undef DEFINE_EDIT

typedef struct bad_input {
  const char *name;
  entry entry;
  pa_status status;
  const char *arg;
  const char *value;
  void (*edit)(args *a);
} bad_input;

#define ROW(name, entry, status, arg, value, ...) {#name, entry, status, arg, value, edit_##name},
static const bad_input catalogue[] = {CATALOGUE(ROW)};
#undef ROW
enum { CATALOGUE_SIZE = sizeof catalogue / sizeof catalogue[0] };

/* ---- watched memory ------------------------------------------------------ */

typedef struct region {
  const char *name;
  void *p;
  size_t bytes;
  unsigned char *copy;
} region;

static region g_regions[16];
static int g_num_regions;

static void watch(const char *name, void *p, size_t bytes) {
  region *r = &g_regions[g_num_regions++];
  *r = (region){name, p, bytes, tu_malloc(bytes)};
}

static void snapshot(void) {
  for (int i = 0; i < g_num_regions; i++)
    memcpy(g_regions[i].copy, g_regions[i].p, g_regions[i].bytes);
}

static const char *first_change(void) {
  for (int i = 0; i < g_num_regions; i++)
    if (memcmp(g_regions[i].copy, g_regions[i].p, g_regions[i].bytes) != 0)
      return g_regions[i].name;
  return NULL;
}

/* ---- messages ------------------------------------------------------------ */

/* alternatives: substrings separated by '|'; 1 when msg contains one. */
static int mentions(const char *msg, const char *alternatives) {
  if (!alternatives) return 1;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", alternatives);
  char *save = NULL;
  for (char *tok = strtok_r(buf, "|", &save); tok; tok = strtok_r(NULL, "|", &save))
    if (strstr(msg, tok)) return 1;
  return 0;
}

static int message_ok(const bad_input *row, const char *msg) {
  if (!msg || !*msg) return 0;
  /* pa_validate_head_size is the one entry point whose message has no
   * caller to name: it is the question itself. */
  if (row->entry != HEAD_SIZE && !strstr(msg, entry_names[row->entry])) return 0;
  return mentions(msg, row->arg) && mentions(msg, row->value);
}

/* Leaves a message that would not pass this row's check, so that a call
 * which fails without setting its own message cannot pass on a stale one. */
static void plant_stale_message(const bad_input *row) {
  for (int k = 0; k < 3; k++) {
    pa_layer *l = NULL;
    if (k == 0) (void)pa_layer_create(NULL, &l);
    if (k == 1) (void)pa_context_create(1, NULL);
    if (k == 2) (void)pa_validate_head_size(-77);
    if (!message_ok(row, pa_last_error())) return;
  }
}

/* ---- fixture --------------------------------------------------------------- */

static pa_kv_cache new_cache(pa_dtype t) {
  pa_kv_cache c;
  memset(&c, 0, sizeof c);
  c.num_blocks = NB;
  c.block_size = BS;
  c.num_kv_heads = NKV;
  c.head_size = D;
  c.dtype = t;
  c.k_scale = 0.5f;
  c.v_scale = 0.25f;
  c.key = tu_calloc(ROOM, hx_cache_bytes(&c));
  c.value = tu_calloc(ROOM, hx_cache_bytes(&c));
  return c;
}

/* n valid int64 (zeros) that end where an inaccessible page begins. */
static int64_t *guarded_i64(size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char *base = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED || mprotect(base + page, page, PROT_NONE) != 0) {
    perror("test_catalogue: mmap");
    exit(1);
  }
  int64_t *p = (int64_t *)(base + page) - n;
  memset(p, 0, n * sizeof *p);
  return p;
}

static pa_layer *make_layer(int num_heads, int num_kv_heads, int head_size) {
  pa_layer_config cfg = base_config();
  cfg.num_heads = num_heads;
  cfg.num_kv_heads = num_kv_heads;
  cfg.head_size = head_size;
  pa_layer *layer = NULL;
  if (pa_layer_create(&cfg, &layer) != PA_OK) {
    fprintf(stderr, "test_catalogue: pa_layer_create: %s\n", pa_last_error());
    exit(1);
  }
  return layer;
}

static pa_plan *make_plan(const pa_layer *layer) {
  args a;
  defaults(&a);
  pa_plan *plan = NULL;
  if (pa_plan_create(g_ctx, layer, &a.batch, &plan) != PA_OK) {
    fprintf(stderr, "test_catalogue: pa_plan_create: %s\n", pa_last_error());
    exit(1);
  }
  return plan;
}

static void setup(void) {
  tu_rng rng;
  tu_rng_seed(&rng, 4242);
  if (pa_context_create(2, &g_ctx) != PA_OK) {
    fprintf(stderr, "test_catalogue: pa_context_create: %s\n", pa_last_error());
    exit(1);
  }
  g_layer = make_layer(NH, NKV, D);
  g_plan = make_plan(g_layer);
  pa_layer *mha = make_layer(2 * NH, NKV, D), *d32 = make_layer(NH, NKV, 2 * D);
  g_plan_mha = make_plan(mha);
  g_plan_d32 = make_plan(d32);
  pa_layer_destroy(mha); /* a plan outlives the layer it was made with */
  pa_layer_destroy(d32);
  g_layer_d8 = make_layer(NH, NKV, 8);
  g_layer_d40 = make_layer(1, 1, 40);

  g_cache = new_cache(PA_F32);
  g_cache2 = new_cache(PA_F32);
  g_fp8 = new_cache(PA_FP8_E4M3);
  const pa_kv_cache *caches[3] = {&g_cache, &g_cache2, &g_fp8};
  static const char *const names[3][2] = {
      {"cache keys", "cache values"}, {"cache2 keys", "cache2 values"}, {"fp8 keys", "fp8 values"}};
  for (int i = 0; i < 3; i++) {
    hx_fill_cache(&rng, caches[i], 1.0, 0);
    watch(names[i][0], caches[i]->key, ROOM * hx_cache_bytes(caches[i]));
    watch(names[i][1], caches[i]->value, ROOM * hx_cache_bytes(caches[i]));
  }
  g_query = tu_malloc(ROWS * QW * sizeof(float));
  g_krows = tu_malloc(KROWS * KW * sizeof(float));
  g_vrows = tu_malloc(KROWS * KW * sizeof(float));
  hx_fill_rows(&rng, g_query, QW, ROWS, QW, PA_F32, 1.0);
  hx_fill_rows(&rng, g_krows, KW, KROWS, KW, PA_F32, 1.0);
  hx_fill_rows(&rng, g_vrows, KW, KROWS, KW, PA_F32, 1.0);
  /* Outputs with a row and a few lse entries to spare, all canary. */
  size_t out_bytes = (ROWS + 1) * QW * sizeof(float), lse_bytes = (ROWS * NH + 4) * sizeof(float);
  g_out = tu_malloc(out_bytes);
  g_lse = tu_malloc(lse_bytes);
  tu_fill_canary(g_out, out_bytes);
  tu_fill_canary(g_lse, lse_bytes);
  watch("out", g_out, out_bytes);
  watch("lse", g_lse, lse_bytes);
  watch("query", g_query, ROWS * QW * sizeof(float));
  watch("key rows", g_krows, KROWS * KW * sizeof(float));
  watch("value rows", g_vrows, KROWS * KW * sizeof(float));
  g_lse_a = tu_malloc(ROWS * NH * sizeof(float));
  g_lse_b = tu_malloc(ROWS * NH * sizeof(float));
  for (int i = 0; i < ROWS * NH; i++) g_lse_a[i] = g_lse_b[i] = (float)(i % 5) - 1.0f;
  watch("lse_a", g_lse_a, ROWS * NH * sizeof(float));
  watch("lse_b", g_lse_b, ROWS * NH * sizeof(float));
  g_guarded_pairs = guarded_i64(4);
  g_guarded_slots = guarded_i64(3);
}

static void destroy_made(args *a) {
  if (a->made_ctx) pa_context_destroy(a->made_ctx);
  if (a->made_layer) pa_layer_destroy(a->made_layer);
  if (a->made_plan) pa_plan_destroy(a->made_plan);
}

/* The valid call each row breaks must work, or the row proves nothing. */
static int fixture_works(void) {
  long before = tu_failures;
  for (int e = CONTEXT; e <= MERGE; e++) {
    args a;
    defaults(&a);
    pa_status st = call(&a, (entry)e);
    TU_CHECK(st == PA_OK, "the valid %s call fails: %s (%s)", entry_names[e], pa_status_string(st),
             pa_last_error());
    if (e == PAGED) {
      st = pa_validate_paged_attention(a.ctx, a.layer, a.plan, a.query, a.query_stride, a.cache_p,
                                       a.batch_p, a.out, a.out_stride);
      TU_CHECK(st == PA_OK, "pa_validate_paged_attention refuses the valid call: %s",
               pa_last_error());
    }
    destroy_made(&a);
  }
  return tu_failures == before;
}

/* ---- the runner -------------------------------------------------------------- */

static void with_env(const char *name, const char *value, char **saved) {
  const char *old = getenv(name);
  *saved = old ? strcpy(tu_malloc(strlen(old) + 1), old) : NULL;
  setenv(name, value, 1);
}

static void restore_env(const char *name, char *saved) {
  if (saved) {
    setenv(name, saved, 1);
    free(saved);
  } else {
    unsetenv(name);
  }
}

/* pa_validate_paged_attention refuses what pa_paged_attention refuses, with
 * the same status and message, and writes nothing either. */
static void check_validate_agrees(const bad_input *row, const args *a, pa_status st,
                                  const char *msg) {
  char want[1024];
  snprintf(want, sizeof want, "%s", msg);
  snapshot();
  pa_status vst = pa_validate_paged_attention(a->ctx, a->layer, a->plan, a->query, a->query_stride,
                                              a->cache_p, a->batch_p, a->out, a->out_stride);
  TU_CHECK(vst == st, "%s: pa_validate_paged_attention gives %s, pa_paged_attention %s", row->name,
           pa_status_string(vst), pa_status_string(st));
  TU_CHECK(strcmp(pa_last_error(), want) == 0,
           "%s: pa_validate_paged_attention says \"%s\", pa_paged_attention \"%s\"", row->name,
           pa_last_error(), want);
  const char *changed = first_change();
  TU_CHECK(!changed, "%s: pa_validate_paged_attention wrote %s", row->name, changed ? changed : "");
}

/* A row about the 0.3 layout breaks nothing else: the same call with every
 * cache back in PA_KV_ROWS succeeds (and may write: the snapshot of the
 * next row is taken afresh). */
static void check_layout_twin(const bad_input *row) {
  if (!strstr(row->name, "layout") && !strstr(row->name, "tiled")) return;
  args a;
  defaults(&a);
  row->edit(&a);
  a.cache.layout = a.other.layout = a.caches[0].layout = a.caches[1].layout = PA_KV_ROWS;
  pa_status st = call(&a, row->entry);
  TU_CHECK(st == PA_OK, "%s (%s): the same call over rows caches fails: %s (%s)", row->name,
           entry_names[row->entry], pa_status_string(st), pa_last_error());
  destroy_made(&a);
}

static void run_row(const bad_input *row) {
  args a;
  defaults(&a);
  row->edit(&a);
  plant_stale_message(row);
  snapshot();
  char *saved_isa = NULL;
  if (a.isa_env) with_env("PA_ISA", a.isa_env, &saved_isa);
  pa_status st = call(&a, row->entry);
  if (a.isa_env) restore_env("PA_ISA", saved_isa);
  const char *msg = pa_last_error();

  TU_CHECK(st == row->status, "%s (%s): status %s, want %s; message: %s", row->name,
           entry_names[row->entry], pa_status_string(st), pa_status_string(row->status), msg);
  TU_CHECK(message_ok(row, msg), "%s (%s): message \"%s\" does not name %s%s%s", row->name,
           entry_names[row->entry], msg, row->entry == HEAD_SIZE ? "" : "the function and ",
           row->arg, row->value ? " and show the value" : "");
  const char *changed = first_change();
  TU_CHECK(!changed, "%s (%s): the failed call wrote %s", row->name, entry_names[row->entry],
           changed ? changed : "");
  TU_CHECK(!a.made_ctx && !a.made_layer && !a.made_plan,
           "%s (%s): the failed call returned a handle", row->name, entry_names[row->entry]);
  if (getenv("PA_TEST_VERBOSE")) printf("  %-45s %-13s %s\n", row->name, pa_status_string(st), msg);
  if (row->entry == PAGED) check_validate_agrees(row, &a, st, msg);
  destroy_made(&a);
  check_layout_twin(row);
}

int main(void) {
  setup();
  printf("test_catalogue: %d bad inputs, isa %s\n", (int)CATALOGUE_SIZE, pa_context_isa(g_ctx));
  if (!fixture_works()) {
    fprintf(stderr, "the valid fixture calls fail; the catalogue would mean nothing\n");
    return tu_finish("test_catalogue");
  }
  int per_entry[MERGE + 1] = {0};
  for (int i = 0; i < CATALOGUE_SIZE; i++) {
    run_row(&catalogue[i]);
    per_entry[catalogue[i].entry]++;
  }
  for (int e = CONTEXT; e <= MERGE; e++) printf("  %-22s %d\n", entry_names[e], per_entry[e]);
  TU_CHECK(CATALOGUE_SIZE >= 40, "the catalogue has %d rows", (int)CATALOGUE_SIZE);
  pa_plan_destroy(g_plan);
  pa_plan_destroy(g_plan_mha);
  pa_plan_destroy(g_plan_d32);
  pa_layer_destroy(g_layer_d8);
  pa_layer_destroy(g_layer_d40);
  pa_layer_destroy(g_layer);
  pa_context_destroy(g_ctx);
  return tu_finish("test_catalogue");
}
