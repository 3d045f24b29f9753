/* The context: thread pool, kernel family and scratch memory. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "plan.h"

enum { PA_MAX_THREADS = 1024 };

void *pa_aligned_alloc(size_t alignment, size_t size) {
  void *ptr = NULL;
  if (size == 0) size = alignment;
  if (posix_memalign(&ptr, alignment, size) != 0) return NULL;
  return ptr;
}

void pa_aligned_free(void *ptr) { free(ptr); }

static int online_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > PA_MAX_THREADS ? PA_MAX_THREADS : (int)n);
}

/* A two-way choice read from environment variable `var`: `yes` or `no`
 * forces it, "auto" (or nothing) leaves it to `automatic` (what the CPU is
 * or a measurement of it). */
static pa_status choose_switch(const char *var, const char *yes, const char *no,
                               int (*automatic)(void), int *out, const char *caller) {
  const char *force = getenv(var);
  if (!force || !*force || strcmp(force, "auto") == 0) {
    *out = automatic();
  } else if (strcmp(force, yes) == 0 || strcmp(force, no) == 0) {
    *out = strcmp(force, yes) == 0;
  } else {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: environment variable %s = \"%s\" is not %s, %s or auto", caller, var, force,
                   yes, no);
  }
  return PA_OK;
}

static pa_status choose_isa(pa_isa *isa, const char *caller) {
  *isa = pa_isa_detect();
  const char *cap = getenv("PA_ISA");
  if (!cap || !*cap) return PA_OK;
  pa_isa requested;
  if (!pa_isa_parse(cap, &requested)) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: environment variable PA_ISA = \"%s\" names no kernel "
                   "path (expected scalar, avx2, avx512, avx512bf16 or amx)",
                   caller, cap);
  }
  if (requested < *isa) *isa = requested;
  return PA_OK;
}

static pa_status create_context(int num_threads, pa_team_fn run, void *team, const char *caller,
                                pa_context **out) {
  if (!out) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  if (num_threads > PA_MAX_THREADS) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_threads = %d exceeds %d", caller, num_threads,
                   PA_MAX_THREADS);
  }
  pa_isa isa;
  int bf16_dot = 0, prefetch_to_l2 = 0;
  pa_status status = choose_isa(&isa, caller);
  /* PA_BF16_DOT: bf16 caches' products on the dot products or the FMA
   * units; PA_PREFETCH: the next tile's K/V requested into L2 or L1. */
  if (status == PA_OK)
    status = choose_switch("PA_BF16_DOT", "on", "off", pa_bf16_dot_is_fast, &bf16_dot, caller);
  if (status == PA_OK) {
    status =
        choose_switch("PA_PREFETCH", "l2", "l1", pa_prefetch_to_l2_suits, &prefetch_to_l2, caller);
  }
  if (status != PA_OK) return status;

  pa_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: out of memory", caller);
  ctx->num_threads = num_threads <= 0 ? online_cpus() : num_threads;
  ctx->isa = isa;
  pa_kernels_build(isa, bf16_dot, &ctx->kernels);
  ctx->kernels.prefetch_to_l2 = prefetch_to_l2;
  ctx->thread_scratch = calloc((size_t)ctx->num_threads, sizeof *ctx->thread_scratch);
  int pool_failed =
      !ctx->thread_scratch || (run ? pa_pool_create_on_team(ctx->num_threads, run, team, &ctx->pool)
                                   : pa_pool_create(ctx->num_threads, &ctx->pool)) != 0;
  if (pool_failed) {
    int wanted = ctx->num_threads; /* num_threads <= 0 asked for one per online CPU */
    free(ctx->thread_scratch);
    free(ctx);
    return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: cannot start %d threads", caller, wanted);
  }
  *out = ctx;
  return PA_OK;
}

pa_status pa_context_create(int num_threads, pa_context **out) {
  return create_context(num_threads, NULL, NULL, "pa_context_create", out);
}

pa_status pa_context_create_with_team(int num_threads, pa_team_fn run, void *team,
                                      pa_context **out) {
  const char *caller = "pa_context_create_with_team";
  if (!run) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: run is NULL", caller);
  if (num_threads < 1) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_threads = %d must be >= 1", caller,
                   num_threads);
  }
  return create_context(num_threads, run, team, caller, out);
}

void pa_context_destroy(pa_context *ctx) {
  if (!ctx) return;
  pa_pool_destroy(ctx->pool);
  for (int i = 0; i < ctx->num_threads; i++) pa_aligned_free(ctx->thread_scratch[i]);
  free(ctx->thread_scratch);
  pa_aligned_free(ctx->workspace);
  pa_plan_destroy(ctx->scratch_plan);
  free(ctx);
}

int pa_context_num_threads(const pa_context *ctx) { return ctx ? ctx->num_threads : 0; }

const char *pa_context_isa(const pa_context *ctx) { return ctx ? ctx->kernels.isa : ""; }

const char *pa_context_kernel_path(const pa_context *ctx) {
  return ctx ? pa_isa_name(ctx->isa) : "";
}

pa_kv_layout pa_kv_layout_preferred(const pa_context *ctx, pa_dtype act_dtype, pa_dtype cache_dtype,
                                    int block_size, int head_size) {
  if (!ctx || !pa_dtype_is_activation(act_dtype) || !pa_dtype_valid(cache_dtype) ||
      block_size < 1 || block_size % PA_TILED_GROUP || head_size < PA_MIN_HEAD_SIZE ||
      head_size > PA_MAX_HEAD_SIZE || head_size % PA_TILED_GROUP) {
    return PA_KV_ROWS;
  }
  const pa_attn_ops *ops = &ctx->kernels.attn[act_dtype][cache_dtype];
  return ops->tiled_preferred && (size_t)head_size % ops->tiled_head_multiple == 0 ? PA_KV_TILED
                                                                                   : PA_KV_ROWS;
}

/* Sizes grow by half again so a slowly growing workload settles quickly. */
static size_t grown(size_t have, size_t need) {
  size_t next = have + have / 2;
  return next > need ? next : need;
}

pa_status pa_context_reserve(pa_context *ctx, size_t per_thread, size_t shared,
                             const char *caller) {
  if (per_thread > ctx->thread_scratch_size) {
    size_t size = grown(ctx->thread_scratch_size, per_thread);
    for (int i = 0; i < ctx->num_threads; i++) {
      void *buffer = pa_aligned_alloc(PA_SCRATCH_ALIGN, size);
      if (!buffer) {
        return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of scratch", caller,
                       size);
      }
      pa_aligned_free(ctx->thread_scratch[i]);
      ctx->thread_scratch[i] = buffer;
    }
    ctx->thread_scratch_size = size;
  }
  if (shared > ctx->workspace_size) {
    size_t size = grown(ctx->workspace_size, shared);
    void *buffer = pa_aligned_alloc(PA_SCRATCH_ALIGN, size);
    if (!buffer) {
      return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of workspace", caller,
                     size);
    }
    pa_aligned_free(ctx->workspace);
    ctx->workspace = buffer;
    ctx->workspace_size = size;
  }
  return PA_OK;
}
