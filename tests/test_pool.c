/* The thread pool on its own (internal header): every task of a job runs
 * exactly once, across many jobs of changing sizes run back to back. That
 * is where a worker still looking at the previous job could claim a task of
 * the next one (a bug this test caught: that task then ran twice, and the
 * caller's wait could end while it still ran). Task 0 runs on the caller
 * (thread 0), which keeps a job's first task on the same core. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "pool.h"

enum { PA_TEST_MAX_TASKS = 9, PA_TEST_JOBS = 300000 };

typedef struct job {
  _Atomic int runs[PA_TEST_MAX_TASKS];
  _Atomic int first_task_thread;
} job;

static void count_task(void *arg, size_t index, int thread) {
  job *j = arg;
  atomic_fetch_add_explicit(&j->runs[index], 1, memory_order_relaxed);
  if (index == 0) atomic_store_explicit(&j->first_task_thread, thread, memory_order_relaxed);
}

/* Sizes 2..9 in a pattern that often puts a bigger job after a smaller one. */
static size_t job_tasks(int k) { return 2 + (size_t)((k * 7) % (PA_TEST_MAX_TASKS - 1)); }

static int run_jobs(int threads, job *jobs) {
  pa_pool *pool = NULL;
  if (pa_pool_create(threads, &pool) != 0) {
    fprintf(stderr, "pa_pool_create(%d) failed\n", threads);
    return 1;
  }
  /* Nothing between the calls: the next job is published as soon as the
   * previous one is done, while workers may still be leaving it. */
  for (int k = 0; k < PA_TEST_JOBS; k++) pa_pool_run(pool, count_task, &jobs[k], job_tasks(k));
  pa_pool_destroy(pool);
  int failures = 0;
  for (int k = 0; k < PA_TEST_JOBS && failures < 5; k++) {
    int first = atomic_load(&jobs[k].first_task_thread);
    if (first != 0) {
      fprintf(stderr, "threads=%d job %d: task 0 ran on thread %d, not the caller\n", threads, k,
              first);
      failures++;
    }
    for (size_t i = 0; i < PA_TEST_MAX_TASKS; i++) {
      int want = i < job_tasks(k) ? 1 : 0, got = atomic_load(&jobs[k].runs[i]);
      if (got != want) {
        fprintf(stderr, "threads=%d job %d (%zu tasks): task %zu ran %d times\n", threads, k,
                job_tasks(k), i, got);
        failures++;
      }
    }
  }
  return failures;
}

int main(void) {
  int failures = 0;
  for (int threads = 2; threads <= 3; threads++) {
    job *jobs = calloc(PA_TEST_JOBS, sizeof *jobs);
    if (!jobs) return 1;
    for (int k = 0; k < PA_TEST_JOBS; k++) atomic_init(&jobs[k].first_task_thread, -1);
    failures += run_jobs(threads, jobs);
    free(jobs);
  }
  if (failures) {
    fprintf(stderr, "test_pool: %d failures\n", failures);
    return 1;
  }
  printf("test_pool: ok\n");
  return 0;
}
