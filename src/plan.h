/* Planning: the split of one batch's attention into work items.
 *
 * An item is one sequence's query rows [row_begin, row_end) for the query
 * heads [head_begin, head_end) of the KV heads [kv_begin, kv_end), over the
 * keys [key_begin, key_end). All query heads of a KV head go into one item
 * where scratch allows, so each K/V tile is read once for all of them. A
 * decode item takes every KV head of its sequence, so it reads each cache
 * block as one contiguous region (the heads of a block are adjacent). A long key range is
 * split across several items (split-K); their partial results are merged
 * through the log-sum-exp afterwards, one merge per split group. The pool
 * takes items in order: a sequence's items together, longest first, and
 * sequences by their longest item (plan.c, `before`). */
#ifndef PA_PLAN_H
#define PA_PLAN_H

#include "batch.h"

struct pa_plan_item {
  int32_t seq;
  int32_t kv_begin, kv_end;     /* several only when they bring all their query heads */
  int32_t head_begin, head_end; /* absolute query head indices */
  int32_t row_begin, row_end;   /* rows of the sequence, from 0 */
  int32_t key_begin, key_end;
  int32_t split;       /* index within its split group; -1 when not split */
  int32_t split_group; /* index into pa_plan.groups when split */
  int64_t cost;        /* for ordering: attended (row, head, key) triples plus keys read */
  int64_t group_cost;  /* the largest cost among its sequence's items before splits */
};

/* Rows of a split group merged by one task. */
enum { PA_MERGE_ROWS = 8 };

/* The items of a split group share seq, heads and rows (`shape`, an item
 * whose keys do not matter); each leaves its partial result at
 * partial_offset + split * rows * heads * (head_size + 2).
 * Rows of an item or group are ordered by KV head, query row, query head. */
typedef struct pa_split_group {
  pa_plan_item shape;
  int32_t num_splits;
  size_t partial_offset; /* in floats, into the call's workspace */
} pa_split_group;

struct pa_plan {
  /* What the plan was made for: a call must match it. */
  int num_heads, num_kv_heads, head_size;
  int num_seqs;
  int32_t *q_starts; /* [num_seqs + 1], in `lengths` */
  int32_t *kv_lens;  /* [num_seqs], in `lengths` */
  int32_t *lengths;
  /* The work. */
  pa_plan_item *items;
  size_t num_items;
  pa_split_group *groups;
  size_t num_groups;
  size_t partial_floats; /* split-K workspace */
  size_t merge_chunks;   /* merge tasks per group: its rows in PA_MERGE_ROWS chunks, at most */
  size_t scratch_bytes;  /* per thread */
  int max_rows;          /* rows x heads of the largest item */
  int key_tile;          /* keys per tile */
  /* Capacities, so the context's own plan is rebuilt without allocating. */
  size_t lengths_capacity, items_capacity, groups_capacity;
};

typedef struct pa_plan_request {
  int num_threads;
  int num_heads, num_kv_heads, head_size;
  pa_mask mask; /* for the cost model only: items always cover every key */
  int num_seqs;
  const int32_t *q_starts;  /* [num_seqs + 1]; NULL when num_seqs is 0 */
  const int32_t *kv_lens;   /* [num_seqs] key count per sequence, or */
  const int32_t *kv_starts; /* [num_seqs + 1] cumulative key rows (dense K/V) */
} pa_plan_request;

/* Query rows x heads of an item (or a split group's shape). */
static inline size_t pa_item_rows(const pa_plan_item *item) {
  return (size_t)(item->row_end - item->row_begin) * (size_t)(item->head_end - item->head_begin);
}

/* The output row and query head of row i of an item's (or group's) rows. */
static inline void pa_item_row_head(const pa_plan_item *item, size_t i, int32_t *row,
                                    int32_t *head) {
  size_t heads_per_kv =
      (size_t)(item->head_end - item->head_begin) / (size_t)(item->kv_end - item->kv_begin);
  size_t rows = (size_t)(item->row_end - item->row_begin);
  size_t kv = i / (rows * heads_per_kv), within = i % (rows * heads_per_kv);
  *row = item->row_begin + (int32_t)(within / heads_per_kv);
  *head = item->head_begin + (int32_t)(kv * heads_per_kv + within % heads_per_kv);
}

/* The same for rows i, i + 1, ... in turn, without pa_item_row_head's
 * divisions per row (a decode item's rows are a few per KV head, and the
 * divisions were a visible share of a short call). */
typedef struct pa_row_walk {
  int32_t row, head;   /* of the current row */
  int32_t within_kv;   /* its head's index among its KV head's */
  int32_t kv_heads_at; /* its KV head's first query head */
  int32_t heads_per_kv, row_begin, row_end;
} pa_row_walk;

static inline pa_row_walk pa_row_walk_from(const pa_plan_item *item, size_t i) {
  pa_row_walk w;
  pa_item_row_head(item, i, &w.row, &w.head);
  w.heads_per_kv = (item->head_end - item->head_begin) / (item->kv_end - item->kv_begin);
  w.within_kv = (w.head - item->head_begin) % w.heads_per_kv;
  w.kv_heads_at = w.head - w.within_kv;
  w.row_begin = item->row_begin;
  w.row_end = item->row_end;
  return w;
}

static inline void pa_row_walk_next(pa_row_walk *w) {
  if (++w->within_kv < w->heads_per_kv) {
    w->head++;
    return;
  }
  w->within_kv = 0;
  w->head = w->kv_heads_at;
  if (++w->row == w->row_end) {
    w->row = w->row_begin;
    w->kv_heads_at += w->heads_per_kv;
    w->head = w->kv_heads_at;
  }
}

/* (Re)builds `plan` in place; PA_ERR_OUT_OF_MEMORY names `caller`. */
pa_status pa_plan_build(pa_plan *plan, const pa_plan_request *request, const char *caller);

/* Per-thread scratch layout of one item, shared by the planner (for its size)
 * and the executor. */
typedef struct pa_scratch_layout {
  size_t q, o, s, row_max, row_sum, rescale, position, key_lo, key_hi, alibi, k_rows, v_rows, merge;
  size_t k_packed, v_packed, k_unpacked, v_unpacked, range_start, range_bytes;
  size_t stream_start, stream_bytes;
  size_t total;
} pa_scratch_layout;

pa_scratch_layout pa_scratch_layout_for(int max_rows, int head_size, int key_tile);

/* Prefetch ranges the scratch holds for one tile: with dense tiles, two per
 * key at most, plus one pair per KV head for the partial blocks at the
 * tile's two ends (an item has <= max_rows KV heads). */
static inline size_t pa_prefetch_ranges(int max_rows, int key_tile) {
  return 2 * (size_t)key_tile + 4 * (size_t)max_rows;
}

#endif
