/* Spreading prefetch requests over a kernel's loop (see pa_prefetch). */
#ifndef PA_KERNELS_PREFETCH_H
#define PA_KERNELS_PREFETCH_H

#include "kernels.h"

/* A kernel call starts with all of its budget ahead, as one loop. */
static inline void pa_prefetch_begin(pa_prefetch *p, size_t budget) {
  p->budget = budget;
  p->issued = 0;
  p->span_first = 0;
  p->span_width = 1;
  p->span_total = 1;
}

/* The kernel's next loop over its keys covers units [first, first + width)
 * of the `total` units of its work (row x column or key x row x column
 * products, as the kernel counts them): the budget is spread over all of
 * the work, not spent in the first loop (8x4096 decode, 1 thread: 1-token
 * blocks 68% -> 76% of the read bandwidth, 64-token blocks 74% -> 83%, head
 * size 256 66% -> 76%, once P V's column blocks shared it). */
static inline void pa_prefetch_span(pa_prefetch *p, size_t first, size_t width, size_t total) {
  if (!p) return;
  p->span_first = first;
  p->span_width = width;
  p->span_total = total;
}

/* Issues the lines of `p`'s budget that belong to steps [step, step + count)
 * of a loop of `steps` steps in the current span, continuing where the
 * ranges were left. */
static inline void pa_prefetch_step(pa_prefetch *p, size_t step, size_t count, size_t steps) {
  if (!p || steps == 0 || p->span_total == 0) return;
  size_t done = step + count >= steps ? steps : step + count;
  size_t target =
      p->budget * (p->span_first * steps + p->span_width * done) / (p->span_total * steps);
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
