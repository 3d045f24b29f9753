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

void *pa_aligned_alloc(size_t alignment, size_t size);
void pa_aligned_free(void *ptr);

#endif
