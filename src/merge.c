/* pa_merge_states: two partial attention results over disjoint key sets
 * combined through their log-sum-exps. */
#include <math.h>
#include <string.h>

#include "internal.h"

enum {
  PA_MAX_MERGE_HEADS = 1 << 16,
  /* Below this many bytes of output a single task is cheaper than waking
   * the pool (as for the cache copies). */
  PA_PARALLEL_MERGE_BYTES = 1 << 16,
  /* Tasks per thread: rows are uniform work, a few chunks each even out
   * the threads' finishing times. */
  PA_MERGE_TASKS_PER_THREAD = 4,
};

typedef struct pa_merge_job {
  const pa_kernels *kernels;
  int64_t num_rows, rows_per_task;
  int num_heads, head_size;
  pa_dtype dtype;
  const char *a, *b;
  int64_t a_row_bytes, b_row_bytes;
  const float *lse_a, *lse_b;
  char *out;
  int64_t out_row_bytes;
  float *lse;
} pa_merge_job;

/* One row and head: everything of this row and head is read before any of
 * it is written, so out and lse may be the a or b side. */
static void merge_head(const pa_merge_job *job, const char *a, const char *b, char *dst,
                       float lse_a, float lse_b, float *lse) {
  size_t d = (size_t)job->head_size, bytes = d * pa_dtype_size(job->dtype);
  if (lse_a == -INFINITY || lse_b == -INFINITY) {
    /* The side without keys contributes nothing, not even 0 * its values
     * (which may be anything, NaN included). */
    if (lse_a == -INFINITY && lse_b == -INFINITY) {
      memset(dst, 0, bytes);
    } else {
      memmove(dst, lse_a == -INFINITY ? b : a, bytes);
    }
    if (lse) *lse = lse_a == -INFINITY ? lse_b : lse_a;
    return;
  }
  float top = fmaxf(lse_a, lse_b);
  /* NaN or +inf on a side: no finite denominator to weigh by. */
  if (isnan(lse_a) || isnan(lse_b) || top == INFINITY) top = NAN;
  float weight_a = expf(lse_a - top), weight_b = expf(lse_b - top);
  float total = weight_a + weight_b; /* in [1, 2], or NaN */
  float merged[PA_MAX_HEAD_SIZE], b_part[PA_MAX_HEAD_SIZE];
  job->kernels->load_row[job->dtype](merged, a, d, weight_a / total);
  job->kernels->load_row[job->dtype](b_part, b, d, weight_b / total);
  job->kernels->axpy(merged, b_part, d, 1.0f);
  job->kernels->store_row[job->dtype](dst, merged, d, 1.0f);
  if (lse) *lse = top + logf(total);
}

static void merge_task(void *arg, size_t index, int thread) {
  (void)thread;
  const pa_merge_job *job = arg;
  int64_t begin = (int64_t)index * job->rows_per_task;
  int64_t end = PA_MIN(begin + job->rows_per_task, job->num_rows);
  int64_t head_bytes = (int64_t)job->head_size * (int64_t)pa_dtype_size(job->dtype);
  for (int64_t r = begin; r < end; r++) {
    const char *a = job->a + r * job->a_row_bytes, *b = job->b + r * job->b_row_bytes;
    char *dst = job->out + r * job->out_row_bytes;
    int64_t at = r * job->num_heads;
    for (int h = 0; h < job->num_heads; h++) {
      merge_head(job, a + h * head_bytes, b + h * head_bytes, dst + h * head_bytes,
                 job->lse_a[at + h], job->lse_b[at + h], job->lse ? job->lse + at + h : NULL);
    }
  }
}

/* Bytes between rows: see row_bytes in attention.c (a lone row's stride
 * may be anything). */
static int64_t row_bytes(int64_t rows, int64_t stride, size_t size) {
  return rows > 1 ? stride * (int64_t)size : 0;
}

pa_status pa_merge_states(pa_context *ctx, int64_t num_rows, int num_heads, int head_size,
                          pa_dtype dtype, const void *out_a, int64_t a_stride, const float *lse_a,
                          const void *out_b, int64_t b_stride, const float *lse_b, void *out,
                          int64_t out_stride, float *lse) {
  const char *caller = "pa_merge_states";
  if (!ctx) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  if (num_rows < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_rows = %lld is negative", caller,
                   (long long)num_rows);
  }
  if (num_heads < 1 || num_heads > PA_MAX_MERGE_HEADS) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_heads = %d is outside [1, %d]", caller,
                   num_heads, PA_MAX_MERGE_HEADS);
  }
  if (head_size < PA_MIN_HEAD_SIZE || head_size > PA_MAX_HEAD_SIZE) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: head_size = %d is outside [%d, %d]", caller,
                   head_size, PA_MIN_HEAD_SIZE, PA_MAX_HEAD_SIZE);
  }
  pa_status status = pa_check_activation_dtype(dtype, caller, "dtype");
  if (status != PA_OK || num_rows == 0) return status;
  if (!out_a) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: out_a is NULL", caller);
  if (!lse_a) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: lse_a is NULL", caller);
  if (!out_b) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: out_b is NULL", caller);
  if (!lse_b) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: lse_b is NULL", caller);
  if (!out) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: out is NULL", caller);
  int64_t width = (int64_t)num_heads * head_size;
  size_t size = pa_dtype_size(dtype);
  status = pa_check_rows(num_rows, a_stride, width, size, caller, "a_stride");
  if (status == PA_OK) status = pa_check_rows(num_rows, b_stride, width, size, caller, "b_stride");
  if (status == PA_OK) {
    status = pa_check_rows(num_rows, out_stride, width, size, caller, "out_stride");
  }
  if (status != PA_OK) return status;
  /* The lse arrays' floats must be addressable too. */
  int64_t lse_bytes;
  if (!pa_mul_i64(num_rows, (int64_t)num_heads * (int64_t)sizeof(float), &lse_bytes) ||
      (uint64_t)lse_bytes > SIZE_MAX) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: num_rows = %lld of num_heads = %d makes lse_a larger than the address "
                   "space",
                   caller, (long long)num_rows, num_heads);
  }

  pa_merge_job job = {
      .kernels = &ctx->kernels,
      .num_rows = num_rows,
      .num_heads = num_heads,
      .head_size = head_size,
      .dtype = dtype,
      .a = out_a,
      .b = out_b,
      .a_row_bytes = row_bytes(num_rows, a_stride, size),
      .b_row_bytes = row_bytes(num_rows, b_stride, size),
      .lse_a = lse_a,
      .lse_b = lse_b,
      .out = out,
      .out_row_bytes = row_bytes(num_rows, out_stride, size),
      .lse = lse,
  };
  /* Saturating: only the comparison with the parallel threshold matters. */
  double total = (double)num_rows * (double)width * (double)size;
  int64_t tasks = total < PA_PARALLEL_MERGE_BYTES || ctx->num_threads == 1
                      ? 1
                      : PA_MIN(num_rows, (int64_t)ctx->num_threads * PA_MERGE_TASKS_PER_THREAD);
  job.rows_per_task = (num_rows + tasks - 1) / tasks;
  tasks = (num_rows + job.rows_per_task - 1) / job.rows_per_task;
  pa_pool_run(ctx->pool, merge_task, &job, (size_t)tasks);
  return PA_OK;
}
