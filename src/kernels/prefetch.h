/* Spreading prefetch requests over a kernel's loop (see pa_prefetch). */
#ifndef PA_KERNELS_PREFETCH_H
#define PA_KERNELS_PREFETCH_H

#include "kernels.h"

/* Requests the rows of `p` that belong to steps [step, step + count) of a
 * loop of `steps` steps: the rows are spread evenly, the last step takes the
 * rest. */
static inline void pa_prefetch_step(const pa_prefetch *p, size_t step, size_t count, size_t steps) {
  if (!p || !p->rows || steps == 0) return;
  size_t begin = step * p->n / steps;
  size_t end = step + count >= steps ? p->n : (step + count) * p->n / steps;
  for (size_t i = begin; i < end; i++) {
    const char *row = p->rows[i];
    for (size_t at = 0; at < p->row_bytes; at += PA_CACHE_LINE) __builtin_prefetch(row + at, 0, 3);
    __builtin_prefetch(row + p->row_bytes - 1, 0, 3);
  }
}

#endif
