/* A persistent pool of worker threads. The caller is thread 0 and works too;
 * a pool of one thread has no worker and runs everything inline. Tasks are
 * handed out dynamically (an atomic counter), so a caller that orders its
 * tasks longest first gets a longest-processing-time schedule. */
#ifndef PA_POOL_H
#define PA_POOL_H

#include <stddef.h>

#include "pagedattn.h"

typedef struct pa_pool pa_pool;

/* Runs task(arg, index, thread) for every index < num_tasks; thread is in
 * [0, num_threads) and names the running thread's scratch. */
typedef void (*pa_task_fn)(void *arg, size_t index, int thread);

/* 0 on success; *pool is NULL for a single thread. */
int pa_pool_create(int num_threads, pa_pool **pool);
/* A pool that runs its jobs on a host's thread team (pa_context_create_with_team) instead of
 * threads of its own; 0 on success, *pool NULL for a single thread. */
int pa_pool_create_on_team(int num_threads, pa_team_fn run, void *team, pa_pool **pool);
void pa_pool_destroy(pa_pool *pool);
void pa_pool_run(pa_pool *pool, pa_task_fn task, void *arg, size_t num_tasks);

#endif
