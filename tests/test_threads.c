/*
 * Contexts used from several host threads at once, and one context reused
 * for thousands of calls.
 *
 * Concurrency: four jobs (each a pa_write_kv, pa_copy_blocks,
 * pa_swap_blocks, pa_paged_attention with and without a plan, and
 * pa_varlen_attention, over its own cache) first run one after another,
 * each on a fresh context of its thread count; then all four run at once
 * from four host threads, each on its own context, many times over. Every
 * concurrent run must reproduce its sequential result bit for bit. Two of
 * the jobs share one layer and one plan (both are read-only once made).
 * Built with -fsanitize=thread (PA_SANITIZE=thread) this is the TSan test.
 *
 * Reuse: one context serves thousands of calls of every entry point, with
 * changing batch shapes and some failing calls mixed in; its resident
 * memory must not grow after warm-up (LeakSanitizer, in the ASan build,
 * checks that nothing leaks).
 */
#define _DEFAULT_SOURCE /* pthread_barrier_t */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PA_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PA_TEST_SANITIZED 1
#endif
#endif
#ifndef PA_TEST_SANITIZED
#define PA_TEST_SANITIZED 0
#endif

/* ---- a job ------------------------------------------------------------------ */

/* Sequence 1 is a whole 40-token prompt: 40, 80 or 160 rows per KV head
 * over the jobs' GQA ratios (1, 2, 4). Its items take the packed tiles where
 * that reaches the dtype pair's packed_min_rows: in every job on AVX-512, in
 * some on the scalar and AVX2 families (64 and 128 rows). The decodes read
 * the cache rows. */
enum { NSEQ = 3, BS = 16, NB = 64, NEW_TOKENS = 64 + 41, NPAIRS = 3 };
static const int32_t g_q_lens[NSEQ] = {1, 40, 1}, g_seq_lens[NSEQ] = {700, 40, 90};

typedef struct job {
  int threads; /* of the context it runs on */
  pa_dtype act, cache_dtype;
  int nh, nkv, hs;
  pa_layer *layer;
  const pa_plan *plan; /* made on a context of another thread count, maybe shared */
  int owns_layer_and_plan;
  /* Inputs, read-only once built. */
  pa_kv_cache cache, swap; /* the memory is the worker's, reset before each run */
  unsigned char *cache_init[2];
  void *krows, *vrows;
  int64_t kw, slots[NEW_TOKENS], pairs[2 * NPAIRS], swap_pairs[2 * NPAIRS];
  int32_t qsl[NSEQ + 1], seq_lens[NSEQ], bt[NSEQ * 48], cu_k[NSEQ + 1];
  pa_batch batch;
  void *query, *dense_k, *dense_v;
  int64_t rows, width;
  /* The result of one run: caches, then out and lse of the three calls. */
  size_t cache_bytes, out_bytes, lse_bytes, result_bytes;
} job;

static size_t act_size(const job *j) { return pa_dtype_size(j->act); }

static void build_job(job *j, uint64_t seed, pa_context *plan_ctx, const job *share) {
  tu_rng rng;
  tu_rng_seed(&rng, seed);
  j->kw = (int64_t)j->nkv * j->hs;
  j->width = (int64_t)j->nh * j->hs;
  if (share) {
    j->layer = share->layer;
    j->plan = share->plan;
  } else {
    pa_layer_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_heads = j->nh;
    cfg.num_kv_heads = j->nkv;
    cfg.head_size = j->hs;
    cfg.attn_type = PA_ATTN_DECODER;
    cfg.dtype = j->act;
    cfg.sliding_window = j->nh == 8 ? 300 : 0;
    pa_status st = pa_layer_create(&cfg, &j->layer);
    TU_CHECK(st == PA_OK, "pa_layer_create: %s", pa_last_error());
    j->owns_layer_and_plan = 1;
  }
  j->cache = (pa_kv_cache){NULL,           NULL,  NB,    BS, j->nkv, j->hs,
                           j->cache_dtype, 0.03f, 0.02f, 0,  0,      PA_KV_ROWS};
  j->swap = j->cache;
  j->swap.num_blocks = 8;
  j->cache_bytes = hx_cache_bytes(&j->cache);
  j->cache.key = tu_malloc(j->cache_bytes);
  j->cache.value = tu_malloc(j->cache_bytes);
  hx_fill_cache(&rng, &j->cache, 1.0, 0);
  for (int i = 0; i < 2; i++) {
    j->cache_init[i] = tu_malloc(j->cache_bytes);
    memcpy(j->cache_init[i], i ? j->cache.value : j->cache.key, j->cache_bytes);
  }
  /* Blocks: sequence s owns a run of blocks from 60 downwards. */
  int next = NB - 4;
  j->qsl[0] = j->cu_k[0] = 0;
  for (int s = 0; s < NSEQ; s++) {
    j->qsl[s + 1] = j->qsl[s] + g_q_lens[s];
    j->cu_k[s + 1] = j->cu_k[s] + g_seq_lens[s];
    j->seq_lens[s] = g_seq_lens[s];
    for (int b = 0; b < 48; b++) j->bt[s * 48 + b] = b * BS < g_seq_lens[s] ? next-- : -1;
  }
  j->batch = (pa_batch){NSEQ, j->qsl, j->seq_lens, j->bt, 48};
  /* New tokens: the last 64 of sequence 0 and every query token. */
  int n = 0;
  for (int s = 0; s < NSEQ; s++) {
    int count = s == 0 ? 64 : g_q_lens[s];
    for (int t = g_seq_lens[s] - count; t < g_seq_lens[s]; t++)
      j->slots[n++] = (int64_t)j->bt[s * 48 + t / BS] * BS + t % BS;
  }
  j->krows = hx_alloc_rows(NEW_TOKENS, j->kw, j->act);
  j->vrows = hx_alloc_rows(NEW_TOKENS, j->kw, j->act);
  hx_fill_rows(&rng, j->krows, j->kw, NEW_TOKENS, (int)j->kw, j->act, 1.0);
  hx_fill_rows(&rng, j->vrows, j->kw, NEW_TOKENS, (int)j->kw, j->act, 1.0);
  /* Copy-on-write of two free blocks and a chain; swap three out. */
  int64_t pairs[2 * NPAIRS] = {NB - 4, 1, 1, 2, NB - 5, 3};
  int64_t swaps[2 * NPAIRS] = {NB - 4, 0, NB - 6, 7, 2, 3};
  memcpy(j->pairs, pairs, sizeof pairs);
  memcpy(j->swap_pairs, swaps, sizeof swaps);
  j->rows = j->qsl[NSEQ];
  j->query = hx_alloc_rows(j->rows, j->width, j->act);
  hx_fill_rows(&rng, j->query, j->width, j->rows, (int)j->width, j->act, 1.0);
  int64_t keys = j->cu_k[NSEQ];
  j->dense_k = hx_alloc_rows(keys, j->kw, j->act);
  j->dense_v = hx_alloc_rows(keys, j->kw, j->act);
  hx_fill_rows(&rng, j->dense_k, j->kw, keys, (int)j->kw, j->act, 1.0);
  hx_fill_rows(&rng, j->dense_v, j->kw, keys, (int)j->kw, j->act, 1.0);
  if (!share) {
    pa_plan *plan = NULL;
    pa_status st = pa_plan_create(plan_ctx, j->layer, &j->batch, &plan);
    TU_CHECK(st == PA_OK, "pa_plan_create: %s", pa_last_error());
    j->plan = plan;
  }
  j->out_bytes = (size_t)(j->rows * j->width) * act_size(j);
  j->lse_bytes = (size_t)(j->rows * j->nh) * sizeof(float);
  j->result_bytes =
      2 * j->cache_bytes + 2 * hx_cache_bytes(&j->swap) + 3 * (j->out_bytes + j->lse_bytes);
}

static void free_job(job *j) {
  if (j->owns_layer_and_plan) {
    pa_plan_destroy((pa_plan *)j->plan);
    pa_layer_destroy(j->layer);
  }
  for (int i = 0; i < 2; i++) free(j->cache_init[i]);
  free(j->cache.key);
  free(j->cache.value);
  free(j->krows);
  free(j->vrows);
  free(j->query);
  free(j->dense_k);
  free(j->dense_v);
}

/* What a worker owns: a context and memory to run its job in. */
typedef struct worker {
  job *job;
  pa_context *ctx;
  pa_kv_cache cache, swap; /* the job's geometry, the worker's memory */
  unsigned char *result;
  int runs;
  long mismatches, failures;
  char first_failure[256];
  const unsigned char *baseline;
  pthread_barrier_t *start;
} worker;

static void worker_init(worker *w, job *j) {
  memset(w, 0, sizeof *w);
  w->job = j;
  w->cache = j->cache;
  w->swap = j->swap;
  w->cache.key = tu_malloc(j->cache_bytes);
  w->cache.value = tu_malloc(j->cache_bytes);
  w->swap.key = tu_calloc(1, hx_cache_bytes(&j->swap));
  w->swap.value = tu_calloc(1, hx_cache_bytes(&j->swap));
  w->result = tu_malloc(j->result_bytes);
  pa_status st = pa_context_create(j->threads, &w->ctx);
  TU_CHECK(st == PA_OK, "pa_context_create(%d): %s", j->threads, pa_last_error());
}

static void worker_free(worker *w) {
  pa_context_destroy(w->ctx);
  free(w->cache.key);
  free(w->cache.value);
  free(w->swap.key);
  free(w->swap.value);
  free(w->result);
}

/* No TU_CHECK here: workers run concurrently and the counters are not. */
static void note(worker *w, const char *what, pa_status st) {
  if (st == PA_OK) return;
  if (w->failures++ == 0)
    snprintf(w->first_failure, sizeof w->first_failure, "%s: %s", what, pa_last_error());
}

static void run_job(worker *w) {
  const job *j = w->job;
  pa_context *ctx = w->ctx;
  memcpy(w->cache.key, j->cache_init[0], j->cache_bytes);
  memcpy(w->cache.value, j->cache_init[1], j->cache_bytes);
  size_t swap_bytes = hx_cache_bytes(&w->swap);
  memset(w->swap.key, 0, swap_bytes);
  memset(w->swap.value, 0, swap_bytes);
  unsigned char *at = w->result + 2 * j->cache_bytes + 2 * swap_bytes;
  memset(at, 0, 3 * (j->out_bytes + j->lse_bytes));
  note(w, "pa_write_kv",
       pa_write_kv(ctx, &w->cache, j->krows, j->kw, j->vrows, j->kw, j->act, NEW_TOKENS, j->slots));
  note(w, "pa_copy_blocks", pa_copy_blocks(ctx, &w->cache, 1, j->pairs, NPAIRS));
  note(w, "pa_swap_blocks", pa_swap_blocks(ctx, &w->cache, &w->swap, j->swap_pairs, NPAIRS));
  for (int call = 0; call < 3; call++) {
    void *out = at;
    float *lse = (float *)(at + j->out_bytes);
    pa_status st;
    if (call < 2) {
      st = pa_paged_attention(ctx, j->layer, call ? j->plan : NULL, j->query, j->width, &w->cache,
                              &j->batch, out, j->width, lse);
    } else {
      st = pa_varlen_attention(ctx, j->layer, j->query, j->width, j->dense_k, j->kw, j->dense_v,
                               j->kw, NSEQ, j->qsl, j->cu_k, out, j->width, lse);
    }
    note(w, call == 2 ? "pa_varlen_attention" : "pa_paged_attention", st);
    at += j->out_bytes + j->lse_bytes;
  }
  memcpy(w->result, w->cache.key, j->cache_bytes);
  memcpy(w->result + j->cache_bytes, w->cache.value, j->cache_bytes);
  memcpy(w->result + 2 * j->cache_bytes, w->swap.key, swap_bytes);
  memcpy(w->result + 2 * j->cache_bytes + swap_bytes, w->swap.value, swap_bytes);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(w->start);
  for (int r = 0; r < w->runs; r++) {
    run_job(w);
    if (memcmp(w->result, w->baseline, w->job->result_bytes) != 0) w->mismatches++;
  }
  return NULL;
}

static void test_concurrent_contexts(void) {
  enum { NJOBS = 4 };
  /* Thread counts, dtypes and shapes differ per job; jobs 2 and 3 share a
   * layer and a plan made on a two-thread context. */
  job jobs[NJOBS] = {
      {.threads = 2, .act = PA_F32, .cache_dtype = PA_F32, .nh = 8, .nkv = 4, .hs = 64},
      {.threads = 1, .act = PA_BF16, .cache_dtype = PA_FP8_E4M3, .nh = 4, .nkv = 4, .hs = 64},
      {.threads = 2, .act = PA_F16, .cache_dtype = PA_BF16, .nh = 8, .nkv = 2, .hs = 128},
      {.threads = 1, .act = PA_F16, .cache_dtype = PA_F16, .nh = 8, .nkv = 2, .hs = 128},
  };
  pa_context *plan_ctx[2];
  for (int i = 0; i < 2; i++) {
    pa_status st = pa_context_create(2 - i, &plan_ctx[i]);
    TU_CHECK(st == PA_OK, "pa_context_create: %s", pa_last_error());
  }
  for (int i = 0; i < NJOBS; i++)
    build_job(&jobs[i], 1000 + (uint64_t)i, plan_ctx[i % 2], i == 3 ? &jobs[2] : NULL);

  /* Sequential baselines, each on a fresh context of the job's thread count. */
  unsigned char *baseline[NJOBS];
  for (int i = 0; i < NJOBS; i++) {
    worker w;
    worker_init(&w, &jobs[i]);
    run_job(&w);
    TU_CHECK(w.failures == 0, "job %d, sequential: %s", i, w.first_failure);
    baseline[i] = w.result;
    w.result = NULL;
    worker_free(&w);
  }

  /* All at once, from four threads, many times. */
  int runs = (int)(50 * tu_case_scale());
  worker workers[NJOBS];
  pthread_t threads[NJOBS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, NJOBS);
  for (int i = 0; i < NJOBS; i++) {
    worker_init(&workers[i], &jobs[i]);
    workers[i].runs = runs;
    workers[i].baseline = baseline[i];
    workers[i].start = &start;
  }
  double t = tu_now();
  int started[NJOBS];
  for (int i = 0; i < NJOBS; i++)
    started[i] = pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0;
  for (int i = 0; i < NJOBS; i++) {
    TU_CHECK(started[i], "pthread_create failed");
    if (started[i]) pthread_join(threads[i], NULL);
  }
  printf("  %d jobs x %d runs at once: %.2f s\n", NJOBS, runs, tu_now() - t);
  for (int i = 0; i < NJOBS; i++) {
    TU_CHECK(workers[i].failures == 0, "job %d, concurrent: %ld failed calls, first: %s", i,
             workers[i].failures, workers[i].first_failure);
    TU_CHECK(workers[i].mismatches == 0,
             "job %d (%d threads): %ld of %d concurrent runs differ from the sequential run", i,
             jobs[i].threads, workers[i].mismatches, runs);
    worker_free(&workers[i]);
    free(baseline[i]);
  }
  pthread_barrier_destroy(&start);
  for (int i = NJOBS - 1; i >= 0; i--) free_job(&jobs[i]);
  for (int i = 0; i < 2; i++) pa_context_destroy(plan_ctx[i]);
}

/* ---- one context, thousands of calls ------------------------------------------ */

static long resident_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (!f) return -1;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void test_reuse(void) {
  job j = {.threads = 2, .act = PA_BF16, .cache_dtype = PA_F16, .nh = 8, .nkv = 4, .hs = 64};
  pa_context *ctx;
  pa_status st = pa_context_create(2, &ctx);
  TU_CHECK(st == PA_OK, "pa_context_create: %s", pa_last_error());
  build_job(&j, 77, ctx, NULL);
  worker w;
  worker_init(&w, &j);
  pa_context_destroy(w.ctx);
  w.ctx = ctx;
  int iterations = (int)(3000 * tu_case_scale()), warm = iterations / 6;
  long rss_warm = 0, rss_peak = 0;
  int32_t bad_bt[NSEQ * 48];
  memcpy(bad_bt, j.bt, sizeof bad_bt);
  bad_bt[5] = NB + 7;
  double t = tu_now();
  for (int i = 0; i < iterations; i++) {
    /* Batches of changing shape: all three sequences, the last two, the
     * first one, none. */
    int first = i % 4 == 1 ? 1 : 0, count = (int[]){3, 2, 1, 0}[i % 4];
    int32_t qsl[NSEQ + 1];
    for (int s = 0; s <= count; s++) qsl[s] = j.qsl[first + s] - j.qsl[first];
    pa_batch b = {count, qsl, j.seq_lens + first, j.bt + first * 48, 48};
    const char *q = (const char *)j.query + (size_t)j.qsl[first] * (size_t)j.width * act_size(&j);
    st = pa_write_kv(ctx, &w.cache, j.krows, j.kw, j.vrows, j.kw, j.act, NEW_TOKENS - i % 5,
                     j.slots);
    note(&w, "pa_write_kv", st);
    note(&w, "pa_paged_attention",
         pa_paged_attention(ctx, j.layer, NULL, q, j.width, &w.cache, &b, w.result, j.width,
                            (float *)(w.result + j.out_bytes)));
    if (i % 10 == 0) {
      pa_plan *plan = NULL;
      note(&w, "pa_plan_create", pa_plan_create(ctx, j.layer, &b, &plan));
      note(&w, "pa_paged_attention",
           pa_paged_attention(ctx, j.layer, plan, q, j.width, &w.cache, &b, w.result, j.width,
                              NULL));
      pa_plan_destroy(plan);
    }
    if (i % 3 == 0) {
      note(&w, "pa_varlen_attention",
           pa_varlen_attention(ctx, j.layer, j.query, j.width, j.dense_k, j.kw, j.dense_v, j.kw,
                               NSEQ, j.qsl, j.cu_k, w.result, j.width, NULL));
      note(&w, "pa_copy_blocks", pa_copy_blocks(ctx, &w.cache, 1, j.pairs, NPAIRS));
      note(&w, "pa_swap_blocks", pa_swap_blocks(ctx, &w.cache, &w.swap, j.swap_pairs, NPAIRS));
    }
    if (i % 50 == 0) {
      pa_layer *layer = NULL;
      pa_layer_config cfg = {.num_heads = 8,
                             .num_kv_heads = 4,
                             .head_size = 64,
                             .sinks = (const float[8]){0},
                             .dtype = PA_F32};
      note(&w, "pa_layer_create", pa_layer_create(&cfg, &layer));
      pa_layer_destroy(layer);
    }
    /* Failing calls take their own paths through the library. */
    pa_batch broken = j.batch;
    broken.block_tables = bad_bt;
    TU_CHECK(pa_paged_attention(ctx, j.layer, NULL, j.query, j.width, &w.cache, &broken, w.result,
                                j.width, NULL) == PA_ERR_OUT_OF_RANGE,
             "a bad block id was not refused");
    long rss = resident_kib();
    if (i == warm) rss_warm = rss;
    if (i >= warm && rss > rss_peak) rss_peak = rss;
  }
  TU_CHECK(w.failures == 0, "reuse: %ld failed calls, first: %s", w.failures, w.first_failure);
  printf("  %d iterations on one context: %.2f s, resident %ld KiB after warm-up, peak %ld KiB\n",
         iterations, tu_now() - t, rss_warm, rss_peak);
  /* Sanitizer runtimes keep freed memory in quarantine, so RSS means
   * nothing there; LeakSanitizer checks for leaks instead. */
  if (!PA_TEST_SANITIZED && rss_warm > 0)
    TU_CHECK(rss_peak - rss_warm <= 256, "resident memory grew by %ld KiB after warm-up",
             rss_peak - rss_warm);
  w.ctx = NULL;
  pa_context_destroy(ctx);
  worker_free(&w);
  free_job(&j);
}

int main(void) {
  double t = tu_now();
  const char *isa = getenv("PA_ISA");
  printf("test_threads: PA_ISA=%s\n", isa ? isa : "(unset)");
  test_concurrent_contexts();
  test_reuse();
  printf("test_threads: %.2f s\n", tu_now() - t);
  return tu_finish("test_threads");
}
