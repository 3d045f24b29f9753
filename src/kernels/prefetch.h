/* Spreading prefetch requests over a kernel's loop (see pa_prefetch). */
#ifndef PA_KERNELS_PREFETCH_H
#define PA_KERNELS_PREFETCH_H

#include "kernels.h"

/* Issues the lines of `p`'s budget that belong to steps [step, step + count)
 * of a loop of `steps` steps, continuing where the ranges were left. */
static inline void pa_prefetch_step(pa_prefetch *p, size_t step, size_t count, size_t steps) {
  if (!p || steps == 0) return;
  size_t done = step + count >= steps ? steps : step + count;
  size_t target = p->budget * done / steps;
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
