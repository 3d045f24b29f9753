/* Writing new tokens into the cache, copying and swapping blocks.
 *
 * All three split the work by byte range, never by token or block pair: a
 * task owns a slice of every row (or block) and walks the tokens (or pairs)
 * in order, so a repeated slot or a chain of pairs has the sequential
 * meaning the header promises, whatever the thread count. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Below this many bytes a single task is cheaper than waking the pool. */
enum { PA_PARALLEL_COPY_BYTES = 1 << 16, PA_CONVERT_CHUNK = 256 };

/* The most int64_t entries an index array (slot_mapping, block_pairs) can
 * have: its bytes must be addressable. */
#define PA_MAX_INDEX_ENTRIES ((int64_t)(PA_MIN((uint64_t)INT64_MAX, (uint64_t)SIZE_MAX) / 8))

static int ranges_for(const pa_context *ctx, int64_t total_bytes) {
  return total_bytes < PA_PARALLEL_COPY_BYTES ? 1 : ctx->num_threads;
}

/* ----------------------------------------------------------------------- */
/* pa_write_kv                                                             */
/* ----------------------------------------------------------------------- */

typedef struct pa_write_job {
  const pa_kernels *kernels;
  const pa_kv_cache *cache;
  const char *src[2]; /* keys, values */
  int64_t src_stride[2];
  pa_dtype src_dtype;
  int64_t num_tokens;
  const int64_t *slot_mapping;
  int64_t row_width; /* num_kv_heads * head_size */
  pa_cache_layout layout;
  int ranges;
} pa_write_job;

/* Places elements [first, first + n) of one token, already encoded, at
 * their offsets from the token's anchor in a tiled tile. Each instance
 * copies a constant size, which compiles to one move per element, where a
 * memcpy of a run-time size would be a call per element (and the cache
 * need not be aligned to its element, so no typed stores). */
#define PA_DEFINE_PLACE_TILED(name, size)                                                  \
  static void name(char *at, const char *from, int64_t first, size_t n, int values,        \
                   int64_t block_size) {                                                   \
    for (size_t i = 0; i < n; i++) {                                                       \
      int64_t e = first + (int64_t)i;                                                      \
      int64_t to = values ? pa_tiled_value_offset(e, block_size) : pa_tiled_key_offset(e); \
      memcpy(at + to * (size), from + i * (size), (size));                                 \
    }                                                                                      \
  }
PA_DEFINE_PLACE_TILED(place_tiled_1, 1)
PA_DEFINE_PLACE_TILED(place_tiled_2, 2)
PA_DEFINE_PLACE_TILED(place_tiled_4, 4)

/* Elements [first, first + count) of token `offset` of a tiled tile
 * (keys: tensor 0, values: 1), encoded in chunks and placed. */
static void write_tiled(const pa_write_job *job, int tensor, char *tile, int64_t offset,
                        int64_t first, int64_t count, const char *src) {
  const pa_kv_cache *cache = job->cache;
  size_t src_size = pa_dtype_size(job->src_dtype), size = pa_dtype_size(cache->dtype);
  float scale = tensor ? cache->v_scale : cache->k_scale;
  int64_t anchor =
      tensor ? pa_tiled_value_anchor(offset) : pa_tiled_key_anchor(offset, cache->head_size);
  char *at = tile + anchor * (int64_t)size;
  float buffer[PA_CONVERT_CHUNK];
  char encoded[PA_CONVERT_CHUNK * sizeof(float)];
  for (int64_t done = 0; done < count; done += PA_CONVERT_CHUNK) {
    size_t n = (size_t)PA_MIN(count - done, (int64_t)PA_CONVERT_CHUNK);
    const char *from = src + done * (int64_t)src_size;
    if (cache->dtype != job->src_dtype) { /* the same dtype is placed as it is, bit for bit */
      job->kernels->load_row[job->src_dtype](buffer, from, n, 1.0f);
      job->kernels->encode_row[cache->dtype](encoded, buffer, n, scale);
      from = encoded;
    }
    int64_t e = first + done;
    if (size == 1) place_tiled_1(at, from, e, n, tensor, cache->block_size);
    if (size == 2) place_tiled_2(at, from, e, n, tensor, cache->block_size);
    if (size == 4) place_tiled_4(at, from, e, n, tensor, cache->block_size);
  }
}

static void write_task(void *arg, size_t index, int thread) {
  (void)thread;
  const pa_write_job *job = arg;
  const pa_kv_cache *cache = job->cache;
  int tensor = (int)(index % 2);
  int64_t range = (int64_t)(index / 2);
  int64_t begin = job->row_width * range / job->ranges;
  int64_t end = job->row_width * (range + 1) / job->ranges;
  char *dst_base = tensor ? cache->value : cache->key;
  float scale = tensor ? cache->v_scale : cache->k_scale;
  size_t src_size = pa_dtype_size(job->src_dtype), dst_size = pa_dtype_size(cache->dtype);
  int64_t head_size = cache->head_size, token_bytes = head_size * (int64_t)dst_size;
  const pa_cache_layout *layout = &job->layout;
  float buffer[PA_CONVERT_CHUNK];

  for (int64_t t = 0; t < job->num_tokens; t++) {
    int64_t slot = job->slot_mapping[t];
    if (slot < 0) continue; /* padding */
    int64_t block = slot / cache->block_size, offset = slot % cache->block_size;
    const char *src_row = job->src[tensor] + t * job->src_stride[tensor] * (int64_t)src_size;
    for (int64_t e = begin; e < end;) {
      int64_t head = e / head_size, d = e % head_size;
      int64_t count = PA_MIN(head_size - d, end - e);
      char *tile = dst_base + block * layout->block_bytes + head * layout->head_bytes;
      const char *src = src_row + e * (int64_t)src_size;
      if (cache->layout == PA_KV_TILED) {
        write_tiled(job, tensor, tile, offset, d, count, src);
        e += count;
        continue;
      }
      char *dst = tile + offset * token_bytes + d * (int64_t)dst_size;
      if (cache->dtype == job->src_dtype) {
        memcpy(dst, src, (size_t)count * dst_size);
      } else {
        for (int64_t done = 0; done < count; done += PA_CONVERT_CHUNK) {
          size_t n = (size_t)PA_MIN(count - done, (int64_t)PA_CONVERT_CHUNK);
          job->kernels->load_row[job->src_dtype](buffer, src + done * (int64_t)src_size, n, 1.0f);
          job->kernels->encode_row[cache->dtype](dst + done * (int64_t)dst_size, buffer, n, scale);
        }
      }
      e += count;
    }
  }
}

pa_status pa_write_kv(pa_context *ctx, const pa_kv_cache *cache, const void *key,
                      int64_t key_stride, const void *value, int64_t value_stride,
                      pa_dtype src_dtype, int64_t num_tokens, const int64_t *slot_mapping) {
  const char *caller = "pa_write_kv";
  if (!ctx) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  pa_status status = pa_check_cache(cache, caller, "cache");
  if (status != PA_OK) return status;
  status = pa_check_activation_dtype(src_dtype, caller, "src_dtype");
  if (status != PA_OK) return status;
  if (num_tokens < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_tokens = %lld is negative", caller,
                   (long long)num_tokens);
  }
  /* A count whose slot_mapping could not fit in memory is a lie the slot
   * checks below would act on by reading past the caller's array. */
  if (num_tokens > PA_MAX_INDEX_ENTRIES) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: num_tokens = %lld makes slot_mapping larger than the address space", caller,
                   (long long)num_tokens);
  }
  if (num_tokens == 0) return PA_OK;
  if (!key) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: key is NULL", caller);
  if (!value) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: value is NULL", caller);
  if (!slot_mapping) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: slot_mapping is NULL", caller);
  int64_t width = (int64_t)cache->num_kv_heads * cache->head_size;
  size_t src_size = pa_dtype_size(src_dtype);
  status = pa_check_rows(num_tokens, key_stride, width, src_size, caller, "key_stride");
  if (status != PA_OK) return status;
  status = pa_check_rows(num_tokens, value_stride, width, src_size, caller, "value_stride");
  if (status != PA_OK) return status;
  int64_t num_slots = cache->num_blocks * cache->block_size; /* fits: the bytes did */
  for (int64_t t = 0; t < num_tokens; t++) {
    if (slot_mapping[t] >= num_slots) {
      return pa_fail(PA_ERR_OUT_OF_RANGE,
                     "%s: slot_mapping[%lld] = %lld is outside [0, %lld) (negative slots are "
                     "padding)",
                     caller, (long long)t, (long long)slot_mapping[t], (long long)num_slots);
    }
  }

  pa_write_job job = {
      .kernels = &ctx->kernels,
      .cache = cache,
      .src = {key, value},
      .src_stride = {key_stride, value_stride},
      .src_dtype = src_dtype,
      .num_tokens = num_tokens,
      .slot_mapping = slot_mapping,
      .row_width = width,
      .layout = pa_cache_layout_of(cache),
  };
  job.ranges = ranges_for(ctx, num_tokens * width * (int64_t)src_size);
  if (job.ranges > width) job.ranges = (int)width;
  pa_pool_run(ctx->pool, write_task, &job, (size_t)job.ranges * 2);
  return PA_OK;
}

/* ----------------------------------------------------------------------- */
/* pa_copy_blocks and pa_swap_blocks                                       */
/* ----------------------------------------------------------------------- */

/* Tensor i of a copy is caches[i / 2]'s keys (even i) or values (odd i),
 * copied onto itself; a swap has two tensors, from src to dst. A task owns
 * a byte range of what a block holds, its tiles in order, and finds those
 * bytes through each side's strides. */
typedef struct pa_block_job {
  const pa_kv_cache *src; /* num_src caches (copy) or one (swap) */
  const pa_kv_cache *dst; /* NULL for a copy: dst is src */
  const int64_t *pairs;
  int64_t num_pairs;
  int chunks; /* byte ranges per tensor */
} pa_block_job;

/* Bytes [begin, end) of the tiles of block `from_block` to the same bytes
 * of block `to_block`. */
static void copy_tiles(char *to, const pa_cache_layout *to_layout, int64_t to_block,
                       const char *from, const pa_cache_layout *from_layout, int64_t from_block,
                       int64_t begin, int64_t end) {
  to += to_block * to_layout->block_bytes;
  from += from_block * from_layout->block_bytes;
  if (to_layout->heads_adjacent && from_layout->heads_adjacent) {
    memmove(to + begin, from + begin, (size_t)(end - begin));
    return;
  }
  int64_t tile = from_layout->tile_bytes;
  for (int64_t at = begin; at < end;) {
    int64_t head = at / tile, within = at % tile, n = PA_MIN(tile - within, end - at);
    memmove(to + head * to_layout->head_bytes + within,
            from + head * from_layout->head_bytes + within, (size_t)n);
    at += n;
  }
}

static void block_task(void *arg, size_t index, int thread) {
  (void)thread;
  const pa_block_job *job = arg;
  size_t tensor = index / (size_t)job->chunks, chunk = index % (size_t)job->chunks;
  const pa_kv_cache *src = job->dst ? job->src : &job->src[tensor / 2];
  const pa_kv_cache *dst = job->dst ? job->dst : src;
  int values = (int)(tensor % 2);
  const char *from = values ? src->value : src->key;
  char *to = values ? dst->value : dst->key;
  pa_cache_layout from_layout = pa_cache_layout_of(src), to_layout = pa_cache_layout_of(dst);
  /* A block onto itself through the same strides is no copy. */
  int same = from == to && from_layout.head_bytes == to_layout.head_bytes &&
             from_layout.block_bytes == to_layout.block_bytes;
  size_t block_bytes = pa_cache_block_bytes(src);
  size_t begin = block_bytes * chunk / (size_t)job->chunks;
  size_t end = block_bytes * (chunk + 1) / (size_t)job->chunks;
  for (int64_t p = 0; p < job->num_pairs; p++) {
    int64_t s = job->pairs[2 * p], d = job->pairs[2 * p + 1];
    if (same && s == d) continue;
    copy_tiles(to, &to_layout, d, from, &from_layout, s, (int64_t)begin, (int64_t)end);
  }
}

static pa_status check_pairs_shape(const int64_t *pairs, int64_t num_pairs, const char *caller) {
  if (num_pairs < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_pairs = %lld is negative", caller,
                   (long long)num_pairs);
  }
  if (num_pairs > PA_MAX_INDEX_ENTRIES / 2) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: num_pairs = %lld makes block_pairs larger than the address space", caller,
                   (long long)num_pairs);
  }
  if (num_pairs > 0 && !pairs) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: block_pairs is NULL", caller);
  }
  return PA_OK;
}

static pa_status check_pairs(const int64_t *pairs, int64_t num_pairs, const pa_kv_cache *src,
                             const pa_kv_cache *dst, const char *caller, const char *where) {
  for (int64_t p = 0; p < num_pairs; p++) {
    for (int side = 0; side < 2; side++) {
      int64_t block = pairs[2 * p + side];
      int64_t limit = side ? dst->num_blocks : src->num_blocks;
      if (block < 0 || block >= limit) {
        return pa_fail(PA_ERR_OUT_OF_RANGE,
                       "%s: block_pairs[%lld][%d] = %lld is outside [0, %lld)%s", caller,
                       (long long)p, side, (long long)block, (long long)limit, where);
      }
    }
  }
  return PA_OK;
}

static void run_block_job(pa_context *ctx, pa_block_job *job, int64_t tensors, size_t block_bytes) {
  if (job->num_pairs == 0 || tensors == 0) return;
  /* Saturating: only the comparison with the parallel threshold matters. */
  double total = (double)block_bytes * (double)job->num_pairs * (double)tensors;
  int64_t wanted = total < PA_PARALLEL_COPY_BYTES ? 1 : ctx->num_threads;
  job->chunks = tensors >= wanted ? 1 : (int)((wanted + tensors - 1) / tensors);
  pa_pool_run(ctx->pool, block_task, job, (size_t)tensors * (size_t)job->chunks);
}

pa_status pa_copy_blocks(pa_context *ctx, const pa_kv_cache *caches, int num_caches,
                         const int64_t *block_pairs, int64_t num_pairs) {
  const char *caller = "pa_copy_blocks";
  if (!ctx) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  if (num_caches < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_caches = %d is negative", caller, num_caches);
  }
  if (num_caches > 0 && !caches) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: caches is NULL", caller);
  }
  pa_status status = check_pairs_shape(block_pairs, num_pairs, caller);
  if (status != PA_OK) return status;
  size_t max_block_bytes = 0;
  for (int c = 0; c < num_caches; c++) {
    char name[32], where[48];
    snprintf(name, sizeof name, "caches[%d]", c);
    snprintf(where, sizeof where, " of caches[%d]", c);
    status = pa_check_cache(&caches[c], caller, name);
    if (status == PA_OK) {
      status = check_pairs(block_pairs, num_pairs, &caches[c], &caches[c], caller, where);
    }
    if (status != PA_OK) return status;
    max_block_bytes = PA_MAX(max_block_bytes, pa_cache_block_bytes(&caches[c]));
  }
  pa_block_job job = {.src = caches, .pairs = block_pairs, .num_pairs = num_pairs};
  run_block_job(ctx, &job, 2 * (int64_t)num_caches, max_block_bytes);
  return PA_OK;
}

pa_status pa_swap_blocks(pa_context *ctx, const pa_kv_cache *src, const pa_kv_cache *dst,
                         const int64_t *block_pairs, int64_t num_pairs) {
  const char *caller = "pa_swap_blocks";
  if (!ctx) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  pa_status status = pa_check_cache(src, caller, "src");
  if (status != PA_OK) return status;
  status = pa_check_cache(dst, caller, "dst");
  if (status != PA_OK) return status;
  if (src->layout != dst->layout) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: dst->layout = %d differs from src->layout = %d; blocks are copied as "
                   "stored",
                   caller, (int)dst->layout, (int)src->layout);
  }
  if (src->block_size != dst->block_size || src->num_kv_heads != dst->num_kv_heads ||
      src->head_size != dst->head_size || src->dtype != dst->dtype) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: dst (block_size %d, num_kv_heads %d, head_size %d, %s) does not match "
                   "src (block_size %d, num_kv_heads %d, head_size %d, %s)",
                   caller, dst->block_size, dst->num_kv_heads, dst->head_size,
                   pa_dtype_name(dst->dtype), src->block_size, src->num_kv_heads, src->head_size,
                   pa_dtype_name(src->dtype));
  }
  if (pa_dtype_is_fp8(src->dtype) &&
      (src->k_scale != dst->k_scale || src->v_scale != dst->v_scale)) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: dst scales (k_scale %g, v_scale %g) differ from src scales (k_scale %g, "
                   "v_scale %g); FP8 blocks are copied as stored",
                   caller, (double)dst->k_scale, (double)dst->v_scale, (double)src->k_scale,
                   (double)src->v_scale);
  }
  status = check_pairs_shape(block_pairs, num_pairs, caller);
  if (status == PA_OK) status = check_pairs(block_pairs, num_pairs, src, dst, caller, "");
  if (status != PA_OK) return status;
  pa_block_job job = {.src = src, .dst = dst, .pairs = block_pairs, .num_pairs = num_pairs};
  run_block_job(ctx, &job, 2, pa_cache_block_bytes(src));
  return PA_OK;
}
