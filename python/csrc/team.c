/* Contexts whose work runs on the process's OpenMP team (torch's): found at
 * run time in the OpenMP runtime already loaded (libgomp, or libiomp5 with
 * its GOMP entry points), never linked. In an engine whose other work runs
 * on that team, two sets of threads would otherwise spin against each other
 * on the same cores. */
#include "ext.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads,
                                 unsigned flags);
typedef int (*omp_int_fn)(void);

static struct {
  gomp_parallel_fn parallel;
  omp_int_fn thread_num, max_threads;
} omp;

static int bind(void *handle) {
  omp.parallel = (gomp_parallel_fn)dlsym(handle, "GOMP_parallel");
  omp.thread_num = (omp_int_fn)dlsym(handle, "omp_get_thread_num");
  omp.max_threads = (omp_int_fn)dlsym(handle, "omp_get_max_threads");
  return omp.parallel && omp.thread_num && omp.max_threads;
}

/* The runtime's symbols: global ones (an LD_PRELOAD, as vLLM's CPU build
 * sets), else those of a runtime some module loaded privately, found by
 * its path in /proc/self/maps and opened again without loading anything. */
static int find_openmp(void) {
  if (omp.parallel) return 1;
  if (bind(RTLD_DEFAULT)) return 1;
  FILE *maps = fopen("/proc/self/maps", "r");
  if (!maps) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, maps)) {
    char *path = strchr(line, '/');
    if (!path || !(strstr(path, "libgomp") || strstr(path, "libiomp5"))) continue;
    path[strcspn(path, "\n")] = '\0';
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    found = handle && bind(handle);
  }
  fclose(maps);
  return found;
}

typedef struct team_call {
  pa_team_work_fn work;
  void *arg;
} team_call;

static void member(void *data) {
  const team_call *call = data;
  call->work(call->arg, omp.thread_num());
}

static void openmp_run(void *team, pa_team_work_fn work, void *arg, int num_threads) {
  (void)team;
  team_call call = {work, arg};
  omp.parallel(member, &call, (unsigned)num_threads, 0);
}

int pyx_openmp_team(pa_team_fn *run, int *max_threads) {
  if (!find_openmp()) {
    pyx_invalid(
        "threads='openmp': no OpenMP runtime (libgomp or libiomp5) is loaded in this "
        "process; import torch first, or use threads='own'");
    return -1;
  }
  *run = openmp_run;
  *max_threads = omp.max_threads();
  return 0;
}
