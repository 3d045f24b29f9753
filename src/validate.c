/* Argument checks shared by the entry points. */
#include <math.h>

#include "internal.h"

enum { PA_MAX_KV_HEADS = 1 << 16 };

size_t pa_cache_block_bytes(const pa_kv_cache *cache) {
  return (size_t)cache->block_size * (size_t)cache->num_kv_heads * (size_t)cache->head_size *
         pa_dtype_size(cache->dtype);
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
  /* Every byte offset into the cache must fit in 64 bits (and in size_t). */
  int64_t bytes = (int64_t)pa_cache_block_bytes(cache);
  if (!pa_mul_i64(bytes, cache->num_blocks, &bytes) || (uint64_t)bytes > SIZE_MAX) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: %s->num_blocks = %lld makes the cache larger than the address space",
                   caller, name, (long long)cache->num_blocks);
  }
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
