/* Dispatch: the caller publishes a job and bumps a generation counter;
 * workers spin on it for a while (a spinning worker wakes hundreds of times
 * sooner than a sleeping one; docs/code-figures.md, pool) and then sleep on
 * it.
 *
 * Tasks are claimed from a 64-bit counter holding the job's generation in
 * its high half and the next task index in its low half, so a worker that
 * wakes up late can only claim tasks of the job it saw: a claim on a
 * finished job fails (the caller closes a job's claims before it writes
 * the next job), and a job's fields are read only after one of its tasks
 * has been claimed (the caller cannot replace a job while a task of it is
 * running; tests/test_pool.c). The caller runs task 0 itself, outside the
 * counter (which starts at 1): a job's first task, the longest of a plan,
 * then stays on the caller's core from one call to the next instead of
 * going to whichever thread wins the first claim (the worker often won it,
 * so the two halves of a split decode changed cores every few calls).
 * Completion counts tasks, not
 * workers: the caller, which claims tasks too, waits only for tasks that
 * were claimed, never for a worker that another process keeps off the CPU.
 * With the other core busy, a call degrades to one thread's speed instead
 * of stalling. */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define PA_HAVE_FUTEX 1
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PA_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define PA_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define PA_CPU_RELAX() ((void)0)
#endif

/* Spinning long enough to cover the gap between the layers of one engine
 * step, short enough not to burn a core between steps (docs/code-figures.md,
 * pool). */
enum { PA_SPIN_ITERATIONS = 20000, PA_WAIT_SPINS_BEFORE_YIELD = 2000 };

struct pa_pool {
  int num_threads;
  pthread_t *threads;
  /* A host's team (pa_pool_create_on_team): jobs go to it, no thread here. */
  pa_team_fn team_run;
  void *team;
  /* The job; written by the caller before the claim counter names it. */
  pa_task_fn task;
  void *arg;
  atomic_uint num_tasks; /* read before a claim, so atomic (relaxed) */
  /* generation << 32 | next task index */
  _Alignas(PA_CACHE_LINE) _Atomic uint64_t claim;
  _Alignas(PA_CACHE_LINE) atomic_uint done;       /* tasks of the current job finished */
  _Alignas(PA_CACHE_LINE) atomic_uint generation; /* bumped per job: what workers wait on */
  atomic_int sleepers;
  atomic_int stop;
#if !PA_HAVE_FUTEX
  pthread_mutex_t mutex;
  pthread_cond_t wake;
#endif
  /* sizeof rounds up to a whole line: nothing else shares generation's. */
};

typedef struct pa_worker_start {
  pa_pool *pool;
  int index;
} pa_worker_start;

static void sleep_while_generation_is(pa_pool *pool, unsigned seen) {
#if PA_HAVE_FUTEX
  syscall(SYS_futex, (void *)&pool->generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
  pthread_mutex_lock(&pool->mutex);
  while (atomic_load(&pool->generation) == seen) pthread_cond_wait(&pool->wake, &pool->mutex);
  pthread_mutex_unlock(&pool->mutex);
#endif
}

static void wake_sleepers(pa_pool *pool) {
#if PA_HAVE_FUTEX
  syscall(SYS_futex, (void *)&pool->generation, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
#else
  pthread_mutex_lock(&pool->mutex);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->mutex);
#endif
}

/* Claims and runs tasks of job `generation` until none is left. */
static void run_tasks(pa_pool *pool, uint32_t generation, int thread) {
  uint64_t claim = atomic_load_explicit(&pool->claim, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(claim >> 32) != generation) return;
    /* num_tasks may already be the next job's (see pa_pool_run): then the
     * caller has closed this job's claims first, which this acquire makes
     * visible to the CAS below, so that CAS fails. */
    if ((uint32_t)claim >= atomic_load_explicit(&pool->num_tasks, memory_order_acquire)) return;
    if (!atomic_compare_exchange_weak_explicit(&pool->claim, &claim, claim + 1,
                                               memory_order_acq_rel, memory_order_acquire)) {
      continue;
    }
    pool->task(pool->arg, (uint32_t)claim, thread);
    atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
    claim = atomic_load_explicit(&pool->claim, memory_order_acquire);
  }
}

static unsigned wait_for_new_generation(pa_pool *pool, unsigned seen) {
  for (int spin = 0; spin < PA_SPIN_ITERATIONS; spin++) {
    unsigned now = atomic_load_explicit(&pool->generation, memory_order_acquire);
    if (now != seen) return now;
    PA_CPU_RELAX();
  }
  for (;;) {
    atomic_fetch_add(&pool->sleepers, 1);
    /* The caller bumps the generation before reading sleepers, and the
     * futex re-checks the generation atomically: no lost wake-up. */
    unsigned now = atomic_load(&pool->generation);
    if (now == seen) sleep_while_generation_is(pool, seen);
    atomic_fetch_sub(&pool->sleepers, 1);
    now = atomic_load_explicit(&pool->generation, memory_order_acquire);
    if (now != seen) return now;
  }
}

static void *worker_main(void *raw) {
  pa_worker_start start = *(pa_worker_start *)raw;
  free(raw);
  pa_pool *pool = start.pool;
  unsigned seen = 0;
  for (;;) {
    seen = wait_for_new_generation(pool, seen);
    if (atomic_load_explicit(&pool->stop, memory_order_acquire)) return NULL;
    run_tasks(pool, seen, start.index);
  }
}

static void publish(pa_pool *pool) {
  atomic_fetch_add_explicit(&pool->generation, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&pool->sleepers, memory_order_seq_cst) > 0) wake_sleepers(pool);
}

int pa_pool_create(int num_threads, pa_pool **out) {
  *out = NULL;
  if (num_threads <= 1) return 0;
  /* Aligned, so that the fields aligned to their own cache lines are: with
   * malloc's 16 bytes, a line the workers poll could hold other hot data. */
  pa_pool *pool = pa_aligned_alloc(PA_CACHE_LINE, sizeof *pool);
  if (pool) memset(pool, 0, sizeof *pool);
  if (!pool) return -1;
  pool->num_threads = num_threads;
  pool->threads = calloc((size_t)num_threads, sizeof *pool->threads);
  if (!pool->threads) {
    pa_aligned_free(pool);
    return -1;
  }
#if !PA_HAVE_FUTEX
  pthread_mutex_init(&pool->mutex, NULL);
  pthread_cond_init(&pool->wake, NULL);
#endif
  for (int i = 1; i < num_threads; i++) {
    pa_worker_start *start = malloc(sizeof *start);
    if (start) {
      start->pool = pool;
      start->index = i;
    }
    if (!start || pthread_create(&pool->threads[i], NULL, worker_main, start) != 0) {
      free(start);
      pool->num_threads = i; /* tear down the ones already running */
      pa_pool_destroy(pool);
      return -1;
    }
  }
  *out = pool;
  return 0;
}

int pa_pool_create_on_team(int num_threads, pa_team_fn run, void *team, pa_pool **out) {
  *out = NULL;
  if (num_threads <= 1) return 0;
  pa_pool *pool = pa_aligned_alloc(PA_CACHE_LINE, sizeof *pool);
  if (!pool) return -1;
  memset(pool, 0, sizeof *pool);
  pool->num_threads = num_threads;
  pool->team_run = run;
  pool->team = team;
  *out = pool;
  return 0;
}

/* A job on a host's team: each member claims tasks from one counter until
 * none is left, so the job completes however many members the host runs. */
typedef struct pa_team_job {
  pa_task_fn task;
  void *arg;
  size_t num_tasks;
  _Alignas(PA_CACHE_LINE) atomic_size_t next;
} pa_team_job;

static void team_member(void *raw, int thread) {
  pa_team_job *job = raw;
  for (size_t i;
       (i = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed)) < job->num_tasks;) {
    job->task(job->arg, i, thread);
  }
}

void pa_pool_destroy(pa_pool *pool) {
  if (!pool) return;
  if (pool->team_run) {
    pa_aligned_free(pool);
    return;
  }
  atomic_store_explicit(&pool->stop, 1, memory_order_release);
  publish(pool);
  wake_sleepers(pool); /* a worker may be between its spin and its sleep */
  for (int i = 1; i < pool->num_threads; i++) pthread_join(pool->threads[i], NULL);
#if !PA_HAVE_FUTEX
  pthread_mutex_destroy(&pool->mutex);
  pthread_cond_destroy(&pool->wake);
#endif
  free(pool->threads);
  pa_aligned_free(pool);
}

void pa_pool_run(pa_pool *pool, pa_task_fn task, void *arg, size_t num_tasks) {
  /* Task indices travel in 32 bits; no plan comes near that many items. */
  if (!pool || num_tasks <= 1 || num_tasks > UINT32_MAX) {
    for (size_t i = 0; i < num_tasks; i++) task(arg, i, 0);
    return;
  }
  if (pool->team_run) {
    pa_team_job job = {.task = task, .arg = arg, .num_tasks = num_tasks};
    atomic_init(&job.next, 0);
    pool->team_run(pool->team, team_member, &job, pool->num_threads);
    return;
  }
  /* Every task of the previous job is done, but a worker may still be
   * leaving it: close its claims (the new generation with no index left)
   * before num_tasks changes, or that worker could claim index n of the
   * previous job as a task of this one, which then runs twice (the release
   * store on num_tasks pairs with the acquire load in run_tasks). */
  uint32_t generation =
      (uint32_t)(atomic_load_explicit(&pool->claim, memory_order_relaxed) >> 32) + 1;
  atomic_store_explicit(&pool->claim, (uint64_t)generation << 32 | UINT32_MAX,
                        memory_order_relaxed);
  pool->task = task;
  pool->arg = arg;
  atomic_store_explicit(&pool->num_tasks, (uint32_t)num_tasks, memory_order_release);
  atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
  atomic_store_explicit(&pool->claim, (uint64_t)generation << 32 | 1, memory_order_release);
  publish(pool);
  task(arg, 0, 0);
  atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
  run_tasks(pool, generation, 0);
  for (int spin = 0; atomic_load_explicit(&pool->done, memory_order_acquire) < num_tasks; spin++) {
    if (spin < PA_WAIT_SPINS_BEFORE_YIELD) {
      PA_CPU_RELAX();
    } else {
      sched_yield();
    }
  }
}
