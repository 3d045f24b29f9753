/* Dispatch is a generation counter: the caller publishes a job and bumps the
 * generation; workers spin on it for a while (a spinning wake-up costs about
 * 0.1 us here, a futex wake-up about 50 us) and then sleep on it. Completion
 * is a countdown the caller spins on, yielding the CPU after a while so a
 * worker that was preempted by another process can finish. */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

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

/* About 50-100 us of spinning at a few ns per pause: long enough to cover
 * the gap between the layers of one engine step, short enough not to burn a
 * core between steps. */
enum { PA_SPIN_ITERATIONS = 20000, PA_WAIT_SPINS_BEFORE_YIELD = 2000 };

struct pa_pool {
  int num_threads;
  pthread_t *threads;
  /* Written by the caller before the generation is bumped. */
  pa_task_fn task;
  void *arg;
  size_t num_tasks;
  _Alignas(PA_CACHE_LINE) atomic_size_t next_task;
  _Alignas(PA_CACHE_LINE) atomic_uint generation;
  atomic_int sleepers;
  atomic_int stop;
  _Alignas(PA_CACHE_LINE) atomic_int busy_workers;
#if !PA_HAVE_FUTEX
  pthread_mutex_t mutex;
  pthread_cond_t wake;
#endif
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

static void run_tasks(pa_pool *pool, int thread) {
  for (;;) {
    size_t index = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
    if (index >= pool->num_tasks) return;
    pool->task(pool->arg, index, thread);
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
    run_tasks(pool, start.index);
    atomic_fetch_sub_explicit(&pool->busy_workers, 1, memory_order_release);
  }
}

static void publish(pa_pool *pool) {
  atomic_fetch_add_explicit(&pool->generation, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&pool->sleepers, memory_order_seq_cst) > 0) wake_sleepers(pool);
}

int pa_pool_create(int num_threads, pa_pool **out) {
  *out = NULL;
  if (num_threads <= 1) return 0;
  pa_pool *pool = calloc(1, sizeof *pool);
  if (!pool) return -1;
  pool->num_threads = num_threads;
  pool->threads = calloc((size_t)num_threads, sizeof *pool->threads);
  if (!pool->threads) {
    free(pool);
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

void pa_pool_destroy(pa_pool *pool) {
  if (!pool) return;
  atomic_store_explicit(&pool->stop, 1, memory_order_release);
  publish(pool);
  wake_sleepers(pool); /* a worker may be between its spin and its sleep */
  for (int i = 1; i < pool->num_threads; i++) pthread_join(pool->threads[i], NULL);
#if !PA_HAVE_FUTEX
  pthread_mutex_destroy(&pool->mutex);
  pthread_cond_destroy(&pool->wake);
#endif
  free(pool->threads);
  free(pool);
}

void pa_pool_run(pa_pool *pool, pa_task_fn task, void *arg, size_t num_tasks) {
  if (!pool || num_tasks <= 1) {
    for (size_t i = 0; i < num_tasks; i++) task(arg, i, 0);
    return;
  }
  pool->task = task;
  pool->arg = arg;
  pool->num_tasks = num_tasks;
  atomic_store_explicit(&pool->next_task, 0, memory_order_relaxed);
  atomic_store_explicit(&pool->busy_workers, pool->num_threads - 1, memory_order_relaxed);
  publish(pool);
  run_tasks(pool, 0);
  for (int spin = 0; atomic_load_explicit(&pool->busy_workers, memory_order_acquire) > 0; spin++) {
    if (spin < PA_WAIT_SPINS_BEFORE_YIELD) {
      PA_CPU_RELAX();
    } else {
      sched_yield();
    }
  }
}
