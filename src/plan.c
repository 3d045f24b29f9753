/* The planner and the public plan handle. */
#include "plan.h"

#include "kernels/kernels.h"

#include <stdlib.h>
#include <string.h>

enum {
  PA_KEY_TILE = PA_PACK_KEYS,
  /* Query rows x heads x head_size of a prefill item: enough rows to
   * amortise packing a K/V tile, few enough that Q, O and the scores stay in
   * L2 (128 rows at head size 128, 256 at 64), within [64, 256] rows. */
  PA_TARGET_ELEMENTS = 32768,
  /* rows x heads x head_size of any item (Q and O scratch, 128 KiB each). */
  PA_ROW_BUDGET = 32768,
  /* Up to this many query rows per sequence (decode, speculative decoding)
   * go into one item, so the sequence's K/V are read once. */
  PA_DECODE_ROWS = 16,
  /* keys x KV heads x head size of the smallest split (128 keys of a
   * Llama-3-8B layer): a split costs a merge and hand-offs between cores,
   * which smaller pieces do not pay back (docs/code-figures.md,
   * PA_MIN_SPLIT_WORK). */
  PA_MIN_SPLIT_WORK = 128 * 8 * 128,
  /* keys x KV heads x head size of the smallest item made by dealing a
   * decode's KV heads out to threads that would otherwise idle (fewer
   * sequences than threads): a quarter of the smallest split, as the pieces
   * need no merge. */
  PA_MIN_HEAD_SHARE_WORK = PA_MIN_SPLIT_WORK / 4,
  PA_MAX_SPLITS = 64,
  PA_ITEMS_PER_THREAD = 4,
  PA_SPLIT_ALIGN = 16,
};

static size_t align_up(size_t value, size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

pa_scratch_layout pa_scratch_layout_for(int max_rows, int head_size, int key_tile) {
  size_t m = (size_t)max_rows, d = (size_t)head_size, n = (size_t)key_tile;
  pa_scratch_layout l;
  size_t at = 0;
#define PA_PLACE(field, bytes) \
  l.field = at;                \
  at = align_up(at + (bytes), PA_SCRATCH_ALIGN)
  PA_PLACE(q, m * ((d + 63) / 64 * 64) * sizeof(float)); /* rows padded to 64 */
  PA_PLACE(o, m * d * sizeof(float));
  PA_PLACE(s, m * n * sizeof(float));
  PA_PLACE(row_max, m * sizeof(float));
  PA_PLACE(row_sum, m * sizeof(float));
  PA_PLACE(rescale, m * sizeof(float));
  PA_PLACE(position, m * sizeof(int32_t));
  PA_PLACE(key_lo, m * sizeof(int32_t));
  PA_PLACE(key_hi, m * sizeof(int32_t));
  PA_PLACE(alibi, m * sizeof(float));
  PA_PLACE(k_rows, 4 * n * sizeof(void *)); /* see attend_item */
  PA_PLACE(v_rows, 4 * n * sizeof(void *));
  PA_PLACE(merge, d * sizeof(float));
  PA_PLACE(k_packed, pa_packed_bytes(d));
  PA_PLACE(v_packed, pa_packed_bytes(d));
  PA_PLACE(k_unpacked, n * d * sizeof(float)); /* a tiled cache's rows, at most f32 */
  PA_PLACE(v_unpacked, n * d * sizeof(float));
  PA_PLACE(range_start, pa_prefetch_ranges(max_rows, key_tile) * sizeof(char *));
  PA_PLACE(range_bytes, pa_prefetch_ranges(max_rows, key_tile) * sizeof(size_t));
  PA_PLACE(stream_start, pa_prefetch_ranges(max_rows, key_tile) * sizeof(char *));
  PA_PLACE(stream_bytes, pa_prefetch_ranges(max_rows, key_tile) * sizeof(size_t));
#undef PA_PLACE
  l.total = at;
  return l;
}

/* Grows *array to hold `count` elements of `size` bytes. */
static int reserve(void **array, size_t *capacity, size_t count, size_t size) {
  if (count <= *capacity) return 1;
  size_t next = PA_MAX(count, *capacity * 2);
  void *grown = realloc(*array, next * size);
  if (!grown) return 0;
  *array = grown;
  *capacity = next;
  return 1;
}

static int64_t item_cost(const pa_plan *plan, pa_mask mask, const pa_plan_item *item) {
  int64_t q_len = plan->q_starts[item->seq + 1] - plan->q_starts[item->seq];
  int64_t k_len = plan->kv_lens[item->seq];
  int64_t pairs = 0;
  for (int64_t row = item->row_begin; row < item->row_end; row++) {
    int64_t lo, hi;
    pa_row_keys(mask, q_len, k_len, row, &lo, &hi);
    lo = PA_MAX(lo, item->key_begin);
    hi = PA_MIN(hi, item->key_end);
    if (hi > lo) pairs += hi - lo;
  }
  int64_t keys_read = (int64_t)(item->key_end - item->key_begin) * (item->kv_end - item->kv_begin);
  return pairs * (item->head_end - item->head_begin) + keys_read;
}

/* The keys any row of the item sees: consecutive rows' ranges overlap or
 * touch, so the union is one interval. */
static void item_visible_keys(const pa_plan *plan, pa_mask mask, const pa_plan_item *item,
                              int64_t *lo, int64_t *hi) {
  int64_t q_len = plan->q_starts[item->seq + 1] - plan->q_starts[item->seq];
  int64_t k_len = plan->kv_lens[item->seq], unused;
  pa_row_keys(mask, q_len, k_len, item->row_begin, lo, &unused);
  pa_row_keys(mask, q_len, k_len, item->row_end - 1, &unused, hi);
}

static pa_status out_of_memory(const char *caller) {
  return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: cannot allocate the plan", caller);
}

static int push_item(pa_plan *plan, const pa_plan_item *item) {
  if (!reserve((void **)&plan->items, &plan->items_capacity, plan->num_items + 1,
               sizeof *plan->items)) {
    return 0;
  }
  plan->items[plan->num_items++] = *item;
  return 1;
}

/* Appends the items of sequence s: `rows` query rows by `heads` query heads
 * of one KV head each, or, when kv_per_item > 1, whole KV heads. */
static pa_status push_sequence(pa_plan *plan, const pa_plan_request *r, int s, int rows, int heads,
                               int kv_per_item, const char *caller) {
  int group = r->num_heads / r->num_kv_heads;
  int64_t q_len = plan->q_starts[s + 1] - plan->q_starts[s];
  size_t first = plan->num_items;
  for (int kv = 0; kv < r->num_kv_heads; kv += kv_per_item) {
    int kv_end = PA_MIN(kv + kv_per_item, r->num_kv_heads);
    for (int h = 0; h < group; h += heads) {
      /* 64-bit: the last step may pass INT32_MAX for a sequence that long. */
      for (int64_t row = 0; row < q_len; row += rows) {
        pa_plan_item item = {
            .seq = s,
            .kv_begin = kv,
            .kv_end = kv_end,
            .head_begin = kv * group + h,
            .head_end = kv_per_item > 1 ? kv_end * group : kv * group + PA_MIN(h + heads, group),
            .row_begin = (int32_t)row,
            .row_end = (int32_t)PA_MIN(row + rows, q_len),
            .key_begin = 0,
            .key_end = plan->kv_lens[s],
            .split = -1,
            .split_group = -1,
        };
        item.cost = item_cost(plan, r->mask, &item);
        if (!push_item(plan, &item)) return out_of_memory(caller);
      }
    }
  }
  int64_t longest = 0;
  for (size_t i = first; i < plan->num_items; i++) longest = PA_MAX(longest, plan->items[i].cost);
  for (size_t i = first; i < plan->num_items; i++) plan->items[i].group_cost = longest;
  return PA_OK;
}

/* KV heads per item of a decode of `keys` keys that holds at most `fit`:
 * with fewer sequences than threads, the heads are dealt out so that every
 * thread gets some (1 x 128 keys on 2 threads: one item of 8 KV heads left
 * a thread idle), as long as each item keeps enough work to pay for its
 * hand-off. */
static int decode_kv_per_item(const pa_plan_request *r, int fit, int64_t keys, int sequences) {
  int64_t threads = PA_MAX(r->num_threads, 1); /* 64-bit: heads x sequences may pass INT_MAX */
  int64_t per_thread = PA_MAX(((int64_t)r->num_kv_heads * sequences + threads - 1) / threads, 1);
  int kv_per_item = fit;
  while (kv_per_item > per_thread &&
         keys * ((kv_per_item + 1) / 2) * r->head_size >= PA_MIN_HEAD_SHARE_WORK) {
    kv_per_item = (kv_per_item + 1) / 2;
  }
  return kv_per_item;
}

static pa_status make_items(pa_plan *plan, const pa_plan_request *r, const char *caller) {
  int group = r->num_heads / r->num_kv_heads;
  int max_rows = PA_MAX(1, PA_ROW_BUDGET / r->head_size);
  int sequences = 0; /* with queries */
  for (int s = 0; s < r->num_seqs; s++) sequences += plan->q_starts[s + 1] > plan->q_starts[s];
  plan->max_rows = 1;
  for (int s = 0; s < r->num_seqs; s++) {
    int q_len = plan->q_starts[s + 1] - plan->q_starts[s];
    if (q_len == 0) continue;
    int heads, rows, kv_per_item = 1;
    if (q_len <= PA_DECODE_ROWS && q_len <= max_rows) {
      rows = q_len;
      heads = max_rows / rows;
      if (heads >= group) { /* whole groups: as many KV heads as fit */
        heads = group;
        kv_per_item = decode_kv_per_item(r, PA_MIN(r->num_kv_heads, max_rows / (rows * group)),
                                         plan->kv_lens[s], sequences);
      }
    } else {
      heads = PA_MIN(group, max_rows);
      int target = PA_MIN(PA_MAX(PA_TARGET_ELEMENTS / r->head_size, 64), 256);
      rows = PA_MAX(1, PA_MIN(target, max_rows) / heads);
    }
    plan->max_rows = PA_MAX(plan->max_rows, rows * heads * kv_per_item);
    pa_status status = push_sequence(plan, r, s, rows, heads, kv_per_item, caller);
    if (status != PA_OK) return status;
  }
  return PA_OK;
}

/* Splits items whose cost dwarfs a thread's fair share along their keys.
 * Split items are appended; the original becomes split 0. */
static pa_status split_long_items(pa_plan *plan, const pa_plan_request *r, const char *caller) {
  if (r->num_threads <= 1) return PA_OK;
  double total = 0; /* a double: the sum of absurd batches must not overflow */
  for (size_t i = 0; i < plan->num_items; i++) total += (double)plan->items[i].cost;
  int64_t fair = (int64_t)(total / (r->num_threads * PA_ITEMS_PER_THREAD));
  if (fair <= 0) return PA_OK;
  size_t original_items = plan->num_items;
  size_t m_plus = (size_t)r->head_size + 2;
  for (size_t i = 0; i < original_items; i++) {
    pa_plan_item item = plan->items[i];
    if (item.cost <= 2 * fair) continue;
    int64_t lo, hi;
    item_visible_keys(plan, r->mask, &item, &lo, &hi);
    int64_t splits = (item.cost + fair - 1) / fair;
    int64_t work = (hi - lo) * (item.kv_end - item.kv_begin) * r->head_size;
    int64_t most = PA_MIN(work / PA_MIN_SPLIT_WORK, (int64_t)PA_MAX_SPLITS);
    if (splits > most) splits = most;
    if (splits < 2) continue;
    if (!reserve((void **)&plan->groups, &plan->groups_capacity, plan->num_groups + 1,
                 sizeof *plan->groups)) {
      return out_of_memory(caller);
    }
    pa_split_group *g = &plan->groups[plan->num_groups];
    *g = (pa_split_group){.shape = item, .partial_offset = plan->partial_floats};
    /* Cut the visible keys evenly; the first and last pieces reach the ends
     * of the sequence so the items cover every key for any layer's mask. */
    int64_t begin = 0;
    for (int64_t k = 1; k <= splits; k++) {
      int64_t end = k == splits ? item.key_end
                                : (lo + (hi - lo) * k / splits) / PA_SPLIT_ALIGN * PA_SPLIT_ALIGN;
      if (end <= begin) continue;
      pa_plan_item piece = item;
      piece.key_begin = (int32_t)begin;
      piece.key_end = (int32_t)end;
      piece.split = g->num_splits++;
      piece.split_group = (int32_t)plan->num_groups;
      piece.cost = item_cost(plan, r->mask, &piece);
      if (piece.split == 0) {
        plan->items[i] = piece;
      } else if (!push_item(plan, &piece)) {
        return out_of_memory(caller);
      }
      begin = end;
    }
    size_t rows =
        (size_t)(item.row_end - item.row_begin) * (size_t)(item.head_end - item.head_begin);
    plan->partial_floats += (size_t)g->num_splits * rows * m_plus;
    plan->merge_chunks = PA_MAX(plan->merge_chunks, (rows + PA_MERGE_ROWS - 1) / PA_MERGE_ROWS);
    plan->num_groups++;
  }
  return PA_OK;
}

/* The pool takes items in order. A sequence's items one after another
 * find its K/V, Q and O in cache: in order of cost alone, the items of one
 * row position in every sequence came together, and a batch of prompts
 * read each sequence's K/V from memory again for every row position
 * (docs/xeon-amx.md, "Items by sequence"). So: the sequence with the
 * longest item first (group_cost: before splits), a sequence's items
 * together, longest first, so that the last items taken are short; then by
 * position for a deterministic order. */
static int before(const pa_plan_item *x, const pa_plan_item *y) {
  if (x->group_cost != y->group_cost) return x->group_cost > y->group_cost;
  if (x->seq != y->seq) return x->seq < y->seq;
  if (x->cost != y->cost) return x->cost > y->cost;
  if (x->kv_begin != y->kv_begin) return x->kv_begin < y->kv_begin;
  if (x->head_begin != y->head_begin) return x->head_begin < y->head_begin;
  if (x->row_begin != y->row_begin) return x->row_begin < y->row_begin;
  return x->key_begin < y->key_begin;
}

static void sift_down(pa_plan_item *items, size_t root, size_t count) {
  for (size_t child; (child = 2 * root + 1) < count; root = child) {
    if (child + 1 < count && before(&items[child], &items[child + 1])) child++;
    if (!before(&items[root], &items[child])) return;
    pa_plan_item swap = items[root];
    items[root] = items[child];
    items[child] = swap;
  }
}

/* Heapsort: in place, so planning inside a call allocates nothing (glibc's
 * qsort may malloc a merge buffer). */
static void sort_items(pa_plan_item *items, size_t count) {
  for (size_t i = count / 2; i-- > 0;) sift_down(items, i, count);
  for (size_t end = count; end-- > 1;) {
    pa_plan_item swap = items[0];
    items[0] = items[end];
    items[end] = swap;
    sift_down(items, 0, end);
  }
}

pa_status pa_plan_build(pa_plan *plan, const pa_plan_request *r, const char *caller) {
  size_t seqs = (size_t)r->num_seqs;
  /* q_starts and kv_lens share one allocation: [seqs + 1] then [seqs]. */
  if (!reserve((void **)&plan->lengths, &plan->lengths_capacity, 2 * seqs + 1, sizeof(int32_t)) ||
      !plan->lengths) {
    return out_of_memory(caller);
  }
  plan->q_starts = plan->lengths;
  plan->kv_lens = plan->lengths + seqs + 1;
  plan->num_heads = r->num_heads;
  plan->num_kv_heads = r->num_kv_heads;
  plan->head_size = r->head_size;
  plan->num_seqs = r->num_seqs;
  plan->q_starts[0] = 0;
  if (seqs > 0) {
    memcpy(plan->q_starts, r->q_starts, (seqs + 1) * sizeof(int32_t));
    for (size_t s = 0; s < seqs; s++) {
      plan->kv_lens[s] = r->kv_starts ? r->kv_starts[s + 1] - r->kv_starts[s] : r->kv_lens[s];
    }
  }
  plan->num_items = 0;
  plan->num_groups = 0;
  plan->partial_floats = 0;
  plan->merge_chunks = 0;
  plan->key_tile = PA_KEY_TILE;

  pa_status status = make_items(plan, r, caller);
  if (status == PA_OK) status = split_long_items(plan, r, caller);
  if (status != PA_OK) return status;
  sort_items(plan->items, plan->num_items);
  plan->scratch_bytes = pa_scratch_layout_for(plan->max_rows, r->head_size, plan->key_tile).total;
  return PA_OK;
}

pa_status pa_plan_create(pa_context *ctx, const pa_layer *layer, const pa_batch *batch,
                         pa_plan **out) {
  const char *caller = "pa_plan_create";
  if (!ctx) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", caller);
  if (!layer) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: layer is NULL", caller);
  if (!batch) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: batch is NULL", caller);
  if (!out) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: plan is NULL", caller);
  pa_status status =
      pa_check_lengths(batch->num_seqs, batch->query_start_loc, "query_start_loc", batch->seq_lens,
                       NULL, "seq_lens", layer->type == PA_ATTN_DECODER, caller);
  if (status != PA_OK) return status;
  pa_plan *plan = calloc(1, sizeof *plan);
  if (!plan) return out_of_memory(caller);
  pa_plan_request request = {
      .num_threads = ctx->num_threads,
      .num_heads = layer->num_heads,
      .num_kv_heads = layer->num_kv_heads,
      .head_size = layer->head_size,
      .mask = pa_layer_mask(layer),
      .num_seqs = batch->num_seqs,
      .q_starts = batch->query_start_loc,
      .kv_lens = batch->seq_lens,
  };
  status = pa_plan_build(plan, &request, caller);
  if (status != PA_OK) {
    pa_plan_destroy(plan);
    return status;
  }
  *out = plan;
  return PA_OK;
}

void pa_plan_destroy(pa_plan *plan) {
  if (!plan) return;
  free(plan->lengths);
  free(plan->items);
  free(plan->groups);
  free(plan);
}
