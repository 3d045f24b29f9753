/* Internal helpers shared by the framework and the kernels. */
#ifndef PA_COMMON_H
#define PA_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "pagedattn.h"

#if defined(__GNUC__)
#define PA_LIKELY(x) __builtin_expect(!!(x), 1)
#define PA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define PA_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PA_LIKELY(x) (x)
#define PA_UNLIKELY(x) (x)
#define PA_PRINTF_LIKE(f, a)
#endif

#define PA_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PA_MAX(a, b) ((a) > (b) ? (a) : (b))
#define PA_CACHE_LINE 64
/* The largest alignment any kernel asks of its scratch buffers. */
#define PA_SCRATCH_ALIGN 64

enum { PA_NUM_DTYPES = 5, PA_NUM_ACT_DTYPES = 3 };

static inline int pa_dtype_valid(pa_dtype dtype) {
  return (int)dtype >= 0 && (int)dtype < PA_NUM_DTYPES;
}
static inline int pa_dtype_is_fp8(pa_dtype dtype) {
  return dtype == PA_FP8_E4M3 || dtype == PA_FP8_E5M2;
}
static inline int pa_dtype_is_activation(pa_dtype dtype) {
  return dtype == PA_F32 || dtype == PA_F16 || dtype == PA_BF16;
}

/* Records `status` and a formatted message as this thread's last error and
 * returns `status`, so validation reads `return pa_fail(...)`. */
pa_status pa_fail(pa_status status, const char *fmt, ...) PA_PRINTF_LIKE(2, 3);

/* 64-bit products with overflow detection: return 0 and leave *out unset on
 * overflow. Operands must be non-negative. */
static inline int pa_mul_i64(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

/* PA_KV_TILED (see pa_kv_layout), in elements within a (block, KV head)
 * tile. A token's anchor is where its element 0 lies; its element e lies
 * the offset further on. Groups are PA_TILED_GROUP tokens (keys) or
 * elements (values). */
enum { PA_TILED_GROUP = 16 };

static inline int64_t pa_tiled_key_anchor(int64_t token, int64_t head_size) {
  return token / PA_TILED_GROUP * PA_TILED_GROUP * head_size + token % PA_TILED_GROUP * 2;
}
static inline int64_t pa_tiled_key_offset(int64_t e) {
  return e / 2 * (2 * PA_TILED_GROUP) + e % 2;
}
static inline int64_t pa_tiled_value_anchor(int64_t token) {
  return token / 2 * (2 * PA_TILED_GROUP) + token % 2;
}
static inline int64_t pa_tiled_value_offset(int64_t e, int64_t block_size) {
  return e / PA_TILED_GROUP * PA_TILED_GROUP * block_size + e % PA_TILED_GROUP * 2;
}

void *pa_aligned_alloc(size_t alignment, size_t size);
void pa_aligned_free(void *ptr);

#endif
