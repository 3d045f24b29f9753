/* Spreading prefetch requests over a kernel's loop (see pa_prefetch). */
#ifndef PA_KERNELS_PREFETCH_H
#define PA_KERNELS_PREFETCH_H

#include "kernels.h"

/* The kernel's next loop of `steps` steps over its keys covers units
 * [first, first + width) of the `total` units of its work (row x column or
 * key x row x column products, as the kernel counts them): the budget is
 * spread over all of the work, not spent in the first loop. The loop's
 * share is interpolated in 32.32 fixed point, so that a step costs a
 * multiply, not a division (docs/code-figures.md, pa_prefetch_span). */
static inline void pa_prefetch_span(pa_prefetch *p, size_t first, size_t width, size_t total,
                                    size_t steps) {
  if (!p) return;
  size_t begin = p->budget * first / total;
  p->span_end = p->budget * (first + width) / total;
  p->span_begin = (uint64_t)begin << 32;
  /* Rounded up: the last step reaches span_end. */
  p->span_rate = steps ? (((uint64_t)(p->span_end - begin) << 32) + steps - 1) / steps : 0;
}

/* Rows [0, m) in groups of 4, then 2, then 1 (the row counts of the
 * kernels' register blocks), each group's loop of `steps` steps taking its
 * rows' share of the prefetch budget. GROUP(rows, i) is a function-like
 * macro of the kernel file that runs the group of `rows` rows from row i. */
#define PA_ROW_GROUPS(prefetch, m, steps, GROUP)        \
  do {                                                  \
    size_t pa_row_ = 0;                                 \
    for (; pa_row_ + 4 <= (m); pa_row_ += 4) {          \
      pa_prefetch_span(prefetch, pa_row_, 4, m, steps); \
      GROUP(4, pa_row_);                                \
    }                                                   \
    for (; pa_row_ + 2 <= (m); pa_row_ += 2) {          \
      pa_prefetch_span(prefetch, pa_row_, 2, m, steps); \
      GROUP(2, pa_row_);                                \
    }                                                   \
    for (; pa_row_ < (m); pa_row_++) {                  \
      pa_prefetch_span(prefetch, pa_row_, 1, m, steps); \
      GROUP(1, pa_row_);                                \
    }                                                   \
  } while (0)

/* A kernel call starts with all of its budget ahead, as one loop of one step. */
static inline void pa_prefetch_begin(pa_prefetch *p, size_t budget) {
  p->budget = budget;
  p->issued = 0;
  pa_prefetch_span(p, 0, 1, 1, 1);
}

/* Issues the lines of `p`'s budget that belong to the loop's first `done`
 * steps (its share of the span so far), continuing where the ranges were
 * left. */
static inline void pa_prefetch_step(pa_prefetch *p, size_t done) {
  if (!p) return;
  size_t target = (size_t)((p->span_begin + p->span_rate * done) >> 32);
  target = PA_MIN(target, p->span_end);
  if (p->issued >= target) return;
  /* The cursor lives in locals here: through the pointer every update would
   * be a store the compiler cannot drop. Each range's share goes out as one
   * run of lines, with no per-line bookkeeping (docs/decode-memory.md, the
   * walk without per-line loads). */
  size_t next = p->next, offset = p->offset, issued = p->issued;
  while (issued < target && next < p->count) {
    const char *line = p->start[next] + offset;
    size_t left = (p->bytes[next] - offset + PA_CACHE_LINE - 1) / PA_CACHE_LINE;
    size_t run = PA_MIN(left, target - issued);
    /* The hint must be a constant, hence a loop for each. */
    if (p->to_l2) {
      for (size_t i = 0; i < run; i++) __builtin_prefetch(line + i * PA_CACHE_LINE, 0, 2);
    } else {
      for (size_t i = 0; i < run; i++) __builtin_prefetch(line + i * PA_CACHE_LINE, 0, 3);
    }
    issued += run;
    offset += run * PA_CACHE_LINE;
    if (offset >= p->bytes[next]) {
      next++;
      offset = 0;
    }
  }
  p->next = next;
  p->offset = offset;
  p->issued = issued;
}

/* A packed (prefill) kernel's register block loops over pairs, elements or
 * keys; it takes a step every PA_PACKED_STEP iterations (a few lines each).
 * Issued at once before each call instead, its share of the next tile
 * (hundreds of lines) was mostly lost (docs/code-figures.md,
 * PA_PACKED_STEP). */
enum { PA_PACKED_STEP = 16 };

static inline size_t pa_packed_steps(size_t iterations) {
  return (iterations + PA_PACKED_STEP - 1) / PA_PACKED_STEP;
}

/* Rows [0, m) in the AVX-512 packed kernels' register blocks of 6, then 4, 3,
 * 2 and 1 rows: BLOCK(rows, i) runs the block of `rows` rows from row i. */
#define PA_PACKED_ROW_BLOCKS(m, BLOCK)                          \
  do {                                                          \
    size_t pa_row_ = 0;                                         \
    for (; pa_row_ + 6 <= (m); pa_row_ += 6) BLOCK(6, pa_row_); \
    for (; pa_row_ + 4 <= (m); pa_row_ += 4) BLOCK(4, pa_row_); \
    for (; pa_row_ + 3 <= (m); pa_row_ += 3) BLOCK(3, pa_row_); \
    for (; pa_row_ + 2 <= (m); pa_row_ += 2) BLOCK(2, pa_row_); \
    for (; pa_row_ < (m); pa_row_++) BLOCK(1, pa_row_);         \
  } while (0)

/* Runs STATEMENT with `cols`, a constant, set to the 16-lane vectors that
 * hold `count` (1 to 64) columns: the column count of a register block of
 * 64 keys (Q K^T) or 64 columns of O (P V) that ends early. */
#define PA_FOR_COLUMN_VECTORS(count, STATEMENT) \
  do {                                          \
    switch (((count) + 15) / 16) {              \
      case 1: {                                 \
        const int cols = 1;                     \
        STATEMENT;                              \
        break;                                  \
      }                                         \
      case 2: {                                 \
        const int cols = 2;                     \
        STATEMENT;                              \
        break;                                  \
      }                                         \
      case 3: {                                 \
        const int cols = 3;                     \
        STATEMENT;                              \
        break;                                  \
      }                                         \
      default: {                                \
        const int cols = 4;                     \
        STATEMENT;                              \
        break;                                  \
      }                                         \
    }                                           \
  } while (0)

/* Iteration i of a packed block's loop, which has pa_packed_steps steps. */
static inline void pa_prefetch_packed(pa_prefetch *p, size_t i) {
  if (i % PA_PACKED_STEP == 0) pa_prefetch_step(p, i / PA_PACKED_STEP + 1);
}

#endif
