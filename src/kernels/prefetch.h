/* Spreading prefetch requests over a kernel's loop (see pa_prefetch). */
#ifndef PA_KERNELS_PREFETCH_H
#define PA_KERNELS_PREFETCH_H

#include "kernels.h"

/* A kernel call starts with all of its budget ahead and one pass. */
static inline void pa_prefetch_begin(pa_prefetch *p, size_t budget) {
  p->budget = budget;
  p->issued = 0;
  p->pass = 0;
  p->passes = 1;
}

/* The kernel starts pass `pass` of `passes` over its keys: the budget is
 * spread over all of them, not spent in the first (8x4096 decode, 1 thread:
 * 1-token blocks 68% -> 76% of the read bandwidth, 64-token blocks 74% ->
 * 83%, head size 256 66% -> 76%, once P V's column blocks shared it). */
static inline void pa_prefetch_pass(pa_prefetch *p, size_t pass, size_t passes) {
  if (!p) return;
  p->pass = pass;
  p->passes = passes;
}

/* Row groups of a kernel that takes its rows 4, then 2, then 1 at a time. */
static inline size_t pa_row_groups(size_t m) { return m / 4 + m % 4 / 2 + m % 2; }

/* Passes of such a kernel that takes `cols_by_4` columns at a time in its
 * groups of 4 rows and `cols_fewer` in the others. */
static inline size_t pa_column_passes(size_t m, size_t d, size_t cols_by_4, size_t cols_fewer) {
  return m / 4 * ((d + cols_by_4 - 1) / cols_by_4) +
         (m % 4 / 2 + m % 2) * ((d + cols_fewer - 1) / cols_fewer);
}

/* Issues the lines of `p`'s budget that belong to steps [step, step + count)
 * of a loop of `steps` steps in the current pass, continuing where the
 * ranges were left. */
static inline void pa_prefetch_step(pa_prefetch *p, size_t step, size_t count, size_t steps) {
  if (!p || steps == 0 || p->passes == 0) return;
  size_t done = step + count >= steps ? steps : step + count;
  size_t target = p->budget * (p->pass * steps + done) / (p->passes * steps);
  if (p->issued >= target) return;
  /* The cursor lives in locals here: through the pointer every update would
   * be a store the compiler cannot drop. */
  size_t next = p->next, offset = p->offset, issued = p->issued;
  for (; issued < target && next < p->count; issued++) {
    __builtin_prefetch(p->start[next] + offset, 0, 3);
    offset += PA_CACHE_LINE;
    if (offset >= p->bytes[next]) {
      next++;
      offset = 0;
    }
  }
  p->next = next;
  p->offset = offset;
  p->issued = issued;
}

#endif
