/* Argument checks shared by the entry points. */
#include <math.h>

#include "internal.h"

enum { PA_MAX_KV_HEADS = 1 << 16 };

size_t pa_cache_block_bytes(const pa_kv_cache *cache) {
  return (size_t)cache->block_size * (size_t)cache->num_kv_heads * (size_t)cache->head_size *
         pa_dtype_size(cache->dtype);
}

/* The strides in elements, zero resolved to the dense ones. */
static int64_t tile_elems(const pa_kv_cache *cache) {
  return (int64_t)cache->block_size * cache->head_size;
}
static int64_t head_stride_of(const pa_kv_cache *cache) {
  return cache->head_stride ? cache->head_stride : tile_elems(cache);
}
static int64_t block_stride_of(const pa_kv_cache *cache) {
  return cache->block_stride ? cache->block_stride : cache->num_kv_heads * tile_elems(cache);
}

pa_cache_layout pa_cache_layout_of(const pa_kv_cache *cache) {
  int64_t size = (int64_t)pa_dtype_size(cache->dtype), tile = tile_elems(cache) * size;
  /* The dense strides' bytes fit: at most 2^16 heads x 2^31 tokens x 2^10 x 4 bytes. */
  pa_cache_layout l = {tile, tile, cache->num_kv_heads * tile, 1};
  if (cache->num_blocks == 0) return l; /* nothing is addressed */
  if (cache->num_kv_heads > 1) l.head_bytes = head_stride_of(cache) * size;
  if (cache->block_stride) l.block_bytes = cache->num_blocks > 1 ? cache->block_stride * size : 0;
  l.heads_adjacent = l.head_bytes == tile;
  return l;
}

/* block_stride and head_stride: at least the dense strides, and the last
 * tile's end addressable. */
static pa_status check_strides(const pa_kv_cache *cache, const char *caller, const char *name) {
  int64_t tile = tile_elems(cache), heads = cache->num_kv_heads;
  if (cache->head_stride < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->head_stride = %lld is negative", caller, name,
                   (long long)cache->head_stride);
  }
  if (cache->block_stride < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->block_stride = %lld is negative", caller, name,
                   (long long)cache->block_stride);
  }
  if (cache->head_stride != 0 && cache->head_stride < tile) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: %s->head_stride = %lld is smaller than block_size * head_size = %lld",
                   caller, name, (long long)cache->head_stride, (long long)tile);
  }
  int64_t heads_extent;
  if (!pa_mul_i64(heads, head_stride_of(cache), &heads_extent)) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: %s->head_stride = %lld over num_kv_heads = %d heads exceeds the address "
                   "space",
                   caller, name, (long long)cache->head_stride, cache->num_kv_heads);
  }
  if (block_stride_of(cache) < heads_extent) {
    const char *bound =
        cache->head_stride ? "num_kv_heads * head_stride" : "num_kv_heads * block_size * head_size";
    if (cache->block_stride) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT,
                     "%s: %s->block_stride = %lld is smaller than %s = %lld", caller, name,
                     (long long)cache->block_stride, bound, (long long)heads_extent);
    }
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: %s->block_stride = 0 (dense: num_kv_heads * block_size * head_size = "
                   "%lld) is smaller than num_kv_heads * head_stride = %lld; set block_stride",
                   caller, name, (long long)block_stride_of(cache), (long long)heads_extent);
  }
  /* Every byte offset into the cache must fit in 64 bits (and in size_t):
   * the last tile of the last block ends at
   * (num_blocks - 1) * block_stride + (num_kv_heads - 1) * head_stride + tile. */
  if (cache->num_blocks == 0) return PA_OK;
  int64_t blocks_extent, last_head = heads_extent - head_stride_of(cache), bytes;
  if (!pa_mul_i64(cache->num_blocks - 1, block_stride_of(cache), &blocks_extent) ||
      blocks_extent > INT64_MAX - last_head - tile ||
      !pa_mul_i64(blocks_extent + last_head + tile, (int64_t)pa_dtype_size(cache->dtype), &bytes) ||
      (uint64_t)bytes > SIZE_MAX) {
    if (!cache->block_stride && !cache->head_stride) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT,
                     "%s: %s->num_blocks = %lld makes the cache larger than the address space",
                     caller, name, (long long)cache->num_blocks);
    }
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: %s->block_stride = %lld and head_stride = %lld over num_blocks = %lld "
                   "blocks make the cache larger than the address space",
                   caller, name, (long long)cache->block_stride, (long long)cache->head_stride,
                   (long long)cache->num_blocks);
  }
  return PA_OK;
}

pa_status pa_check_cache(const pa_kv_cache *cache, const char *caller, const char *name) {
  if (!cache) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", caller, name);
  if (cache->num_blocks < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->num_blocks = %lld is negative", caller, name,
                   (long long)cache->num_blocks);
  }
  if (cache->block_size < 1) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->block_size = %d must be >= 1", caller, name,
                   cache->block_size);
  }
  if (cache->num_kv_heads < 1 || cache->num_kv_heads > PA_MAX_KV_HEADS) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->num_kv_heads = %d is outside [1, %d]", caller,
                   name, cache->num_kv_heads, PA_MAX_KV_HEADS);
  }
  if (cache->head_size < PA_MIN_HEAD_SIZE || cache->head_size > PA_MAX_HEAD_SIZE) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->head_size = %d is outside [%d, %d]", caller,
                   name, cache->head_size, PA_MIN_HEAD_SIZE, PA_MAX_HEAD_SIZE);
  }
  if (!pa_dtype_valid(cache->dtype)) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->dtype = %d is not a pa_dtype", caller, name,
                   (int)cache->dtype);
  }
  if (pa_dtype_is_fp8(cache->dtype)) {
    if (!isfinite(cache->k_scale) || !(cache->k_scale > 0.0f)) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT,
                     "%s: %s->k_scale = %g must be finite and > 0 for an %s cache", caller, name,
                     (double)cache->k_scale, pa_dtype_name(cache->dtype));
    }
    if (!isfinite(cache->v_scale) || !(cache->v_scale > 0.0f)) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT,
                     "%s: %s->v_scale = %g must be finite and > 0 for an %s cache", caller, name,
                     (double)cache->v_scale, pa_dtype_name(cache->dtype));
    }
  }
  if (cache->layout != PA_KV_ROWS && cache->layout != PA_KV_TILED) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: %s->layout = %d is not a pa_kv_layout (PA_KV_ROWS or PA_KV_TILED)", caller,
                   name, (int)cache->layout);
  }
  if (cache->layout == PA_KV_TILED &&
      (cache->block_size % PA_TILED_GROUP || cache->head_size % PA_TILED_GROUP)) {
    return pa_fail(PA_ERR_UNSUPPORTED,
                   "%s: %s->layout = PA_KV_TILED needs block_size and head_size multiples of %d; "
                   "they are %d and %d",
                   caller, name, PA_TILED_GROUP, cache->block_size, cache->head_size);
  }
  pa_status status = check_strides(cache, caller, name);
  if (status != PA_OK) return status;
  if (cache->num_blocks > 0 && !cache->key) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->key is NULL", caller, name);
  }
  if (cache->num_blocks > 0 && !cache->value) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s->value is NULL", caller, name);
  }
  return PA_OK;
}

pa_status pa_check_rows(int64_t rows, int64_t stride, int64_t width, size_t elem_size,
                        const char *caller, const char *name) {
  if (stride < width) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s = %lld is smaller than the row width %lld",
                   caller, name, (long long)stride, (long long)width);
  }
  /* The last row's end, in bytes, must be addressable. */
  int64_t extent = 0;
  if (rows > 0 &&
      (!pa_mul_i64(rows - 1, stride, &extent) || extent > INT64_MAX - width ||
       !pa_mul_i64(extent + width, (int64_t)elem_size, &extent) || (uint64_t)extent > SIZE_MAX)) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: %s = %lld over %lld rows exceeds the address space", caller, name,
                   (long long)stride, (long long)rows);
  }
  return PA_OK;
}
