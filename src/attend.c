/* The flash-attention loop of one work item over the micro-kernels, and the
 * log-sum-exp merge of split-K partial results. */
#include "attend.h"

#include <math.h>
#include <string.h>

#include "kernels/prefetch.h"

/* Pointers to the K and V rows of keys [first, first + n) of a sequence for
 * one KV head; another KV head's rows are kv->head_bytes further on. */
static void gather_tile_rows(const pa_kv_source *kv, int32_t seq, int32_t kv_head, int64_t first,
                             int64_t n, const void **k_rows, const void **v_rows) {
  if (!kv->block_tables) {
    int64_t row = kv->row_starts[seq] + first;
    const char *k = kv->key + row * kv->key_row_bytes + kv_head * kv->head_bytes;
    const char *v = kv->value + row * kv->value_row_bytes + kv_head * kv->head_bytes;
    for (int64_t i = 0; i < n; i++) {
      k_rows[i] = k + i * kv->key_row_bytes;
      v_rows[i] = v + i * kv->value_row_bytes;
    }
    return;
  }
  /* One division per call, not per block: with 1-token blocks a division
   * per key cost more than the rest of the walk. */
  const int32_t *table = kv->block_tables + seq * kv->block_table_stride + first / kv->block_size;
  int64_t head = kv_head * kv->head_bytes, i = 0;
  int64_t size = (int64_t)pa_dtype_size(kv->dtype), d = kv->token_bytes / size;
  for (int64_t key = first, end = first + n, offset = first % kv->block_size; key < end;
       table++, offset = 0) {
    int64_t run = PA_MIN(kv->block_size - offset, end - key);
    int64_t at = *table * kv->block_bytes + head;
    if (kv->tiled) {
      /* pa_tiled_key_anchor and pa_tiled_value_anchor on unsigned tokens
       * (shifts and masks: this runs for every key of every tile). */
      const char *k = kv->key + at, *v = kv->value + at;
      size_t group_bytes = (size_t)(PA_TILED_GROUP * d * size), pair = (size_t)(2 * size);
      for (size_t t = (size_t)offset; t < (size_t)(offset + run); t++, i++) {
        k_rows[i] = k + t / PA_TILED_GROUP * group_bytes + t % PA_TILED_GROUP * pair;
        v_rows[i] = v + t / 2 * (PA_TILED_GROUP * pair) + t % 2 * (size_t)size;
      }
    } else {
      at += offset * kv->token_bytes;
      for (int64_t r = 0; r < run; r++, i++) {
        k_rows[i] = kv->key + at + r * kv->token_bytes;
        v_rows[i] = kv->value + at + r * kv->token_bytes;
      }
    }
    key += run;
  }
}

/* A tiled cache's tiles are read in place by the tiles' kernels where the
 * dtype pair has them, through rows unpacked per tile otherwise. */
static int reads_tiles(const pa_attention_call *c) {
  return c->kv.tiled && c->ops->qk_tiled &&
         (size_t)c->layer->head_size % c->ops->tiled_head_multiple == 0;
}

static char *out_row(const pa_attention_call *c, int64_t row, int32_t head) {
  int64_t head_bytes = (int64_t)c->layer->head_size * (int64_t)pa_dtype_size(c->layer->dtype);
  return c->out + row * c->out_row_bytes + head * head_bytes;
}

static const char *query_row(const pa_attention_call *c, int64_t row, int32_t head) {
  int64_t head_bytes = (int64_t)c->layer->head_size * (int64_t)pa_dtype_size(c->layer->dtype);
  return c->query + row * c->query_row_bytes + head * head_bytes;
}

/* Normalises one row's accumulator into the output (and lse). row_max (a
 * base-2 logit, see pa_softmax_tile) is -inf exactly when the row saw no
 * key: zeros and lse = -inf. */
static void finish_row(const pa_attention_call *c, int64_t row, int32_t head, const float *o,
                       float row_max, float row_sum) {
  const pa_layer *layer = c->layer;
  char *dst = out_row(c, row, head);
  float *lse = c->lse ? c->lse + row * layer->num_heads + head : NULL;
  if (row_max == -INFINITY) {
    memset(dst, 0, (size_t)layer->head_size * pa_dtype_size(layer->dtype));
    if (lse) *lse = -INFINITY;
    return;
  }
  /* The sink joins the denominator; both terms are taken relative to the
   * larger exponent, so a sink far above every logit cannot overflow, and
   * in double, where a finite sink's base-2 logit stays finite. */
  double top = row_max, keys = 1.0, sink = 0.0;
  if (layer->sinks) {
    double sink_logit = (double)layer->sinks[head] * PA_LOG2E_D;
    top = fmax(top, sink_logit);
    keys = exp2(row_max - top);
    sink = exp2(sink_logit - top);
  }
  double total = row_sum * keys + sink;
  c->kernels->store_row[layer->dtype](dst, o, (size_t)layer->head_size,
                                      (float)(c->v_factor * keys / total));
  if (lse) *lse = (float)(top * PA_LN2_D + log(total));
}

static size_t rows_per_kv_head(const pa_plan_item *item) {
  return pa_item_rows(item) / (size_t)(item->kv_end - item->kv_begin);
}

/* Items with at least the dtype pair's packed_min_rows rows per KV head
 * pack each K/V tile once for all of them; fewer rows read the cache rows
 * directly (see pa_attn_ops). */
static int item_is_packed(const pa_attention_call *c, const pa_plan_item *item) {
  return rows_per_kv_head(item) >= c->ops->packed_min_rows;
}

/* Rows per KV head from which a packed item's requests go into L1 where
 * the direct items' go into L2 (pa_kernels.prefetch_to_l2). */
enum { PA_PACKED_L1_ROWS = 28 };

/* Items whose cache rows the direct kernels (pa_attn_ops.qk and .pv) read:
 * neither packed nor over a tiled cache. Every other item's Q goes through
 * the packed kernels' loader (the tiles' kernels share the packed kernels'
 * Q). */
static int reads_rows_directly(const pa_attention_call *c, const pa_plan_item *item) {
  return !item_is_packed(c, item) && !reads_tiles(c);
}

/* Q rows in scratch: d elements rounded up to 64 (see pa_attn_ops). */
static size_t q_stride(size_t d) { return (d + 63) / 64 * 64; }

typedef struct pa_item_scratch {
  const char **range_start, **stream_start;
  size_t *range_bytes, *stream_bytes;
  void *q, *k_packed, *v_packed, *unpacked[2];
  float *o, *s, *row_max, *row_sum, *rescale, *alibi;
  size_t ldo; /* O's row stride: d in scratch, d + 2 in a split's partials */
  int32_t *position, *key_lo, *key_hi;
  const void **k_rows, **v_rows;
  float *merge;
} pa_item_scratch;

static void *scratch_at(void *base, size_t offset) { return (char *)base + offset; }

static pa_item_scratch carve_scratch(const pa_attention_call *c, int thread) {
  void *base = c->thread_scratch[thread];
  pa_scratch_layout l =
      pa_scratch_layout_for(c->plan->max_rows, c->layer->head_size, c->plan->key_tile);
  pa_item_scratch s = {
      .range_start = scratch_at(base, l.range_start),
      .range_bytes = scratch_at(base, l.range_bytes),
      .stream_start = scratch_at(base, l.stream_start),
      .stream_bytes = scratch_at(base, l.stream_bytes),
      .q = scratch_at(base, l.q),
      .k_packed = scratch_at(base, l.k_packed),
      .v_packed = scratch_at(base, l.v_packed),
      .unpacked = {scratch_at(base, l.k_unpacked), scratch_at(base, l.v_unpacked)},
      .o = scratch_at(base, l.o),
      .ldo = (size_t)c->layer->head_size,
      .s = scratch_at(base, l.s),
      .row_max = scratch_at(base, l.row_max),
      .row_sum = scratch_at(base, l.row_sum),
      .rescale = scratch_at(base, l.rescale),
      .alibi = scratch_at(base, l.alibi),
      .position = scratch_at(base, l.position),
      .key_lo = scratch_at(base, l.key_lo),
      .key_hi = scratch_at(base, l.key_hi),
      .k_rows = scratch_at(base, l.k_rows),
      .v_rows = scratch_at(base, l.v_rows),
      .merge = scratch_at(base, l.merge),
  };
  return s;
}

/* Rows the walk over an item's queries requests ahead of itself: a row is
 * a run of a few hundred bytes, a query token's heads a few KiB, far apart
 * in memory, which the hardware prefetchers do not reach before the loop
 * does (docs/peer-limits.md, "The rows around the kernels"). */
enum { PA_ROW_LEAD = 8 };

/* Requests into L1 the lines of [p, p + bytes). */
static inline void request_row(const char *p, size_t bytes) {
  const char *line = p - (uintptr_t)p % PA_CACHE_LINE;
  for (; line < p + bytes; line += PA_CACHE_LINE) __builtin_prefetch(line, 0, 3);
}

/* Loads the item's query rows (by KV head, row, head) and the keys each
 * sees; returns the union of those key ranges in *lo, *hi. */
static size_t load_queries(const pa_attention_call *c, const pa_plan_item *item, pa_item_scratch *s,
                           int64_t *lo, int64_t *hi) {
  const pa_layer *layer = c->layer;
  const pa_plan *plan = c->plan;
  size_t d = (size_t)layer->head_size, act_size = pa_dtype_size(layer->dtype);
  int64_t q_start = plan->q_starts[item->seq];
  int64_t q_len = plan->q_starts[item->seq + 1] - q_start, k_len = plan->kv_lens[item->seq];
  size_t m = pa_item_rows(item);
  pa_load_row_fn load_q = reads_rows_directly(c, item) ? c->ops->load_q : c->ops->load_q_packed;
  if (reads_tiles(c) && c->ops->load_q_tiled) load_q = c->ops->load_q_tiled;
  *lo = INT64_MAX;
  *hi = INT64_MIN;
  size_t row_bytes = d * act_size;
  pa_row_walk walk = pa_row_walk_from(item, 0), ahead = pa_row_walk_from(item, 0);
  for (size_t i = 0; i < PA_MIN(m, (size_t)PA_ROW_LEAD); i++, pa_row_walk_next(&ahead)) {
    request_row(query_row(c, q_start + ahead.row, ahead.head), row_bytes);
  }
  for (size_t i = 0; i < m; i++, pa_row_walk_next(&walk)) {
    int32_t r = walk.row, h = walk.head;
    if (i + PA_ROW_LEAD < m) {
      request_row(query_row(c, q_start + ahead.row, ahead.head), row_bytes);
      pa_row_walk_next(&ahead);
    }
    int64_t key_lo, key_hi;
    pa_row_keys(c->mask, q_len, k_len, r, &key_lo, &key_hi);
    key_lo = PA_MAX(key_lo, item->key_begin);
    key_hi = PA_MAX(PA_MIN(key_hi, item->key_end), key_lo);
    if (key_hi > key_lo) {
      *lo = PA_MIN(*lo, key_lo);
      *hi = PA_MAX(*hi, key_hi);
    }
    const char *src = query_row(c, q_start + r, h);
    load_q((char *)s->q + i * q_stride(d) * c->ops->q_size, src, d, c->q_factor);
    s->position[i] = (int32_t)(k_len - q_len + r);
    s->key_lo[i] = (int32_t)key_lo;
    s->key_hi[i] = (int32_t)key_hi;
    s->alibi[i] = layer->alibi ? layer->alibi[h] : 0.0f;
  }
  return m;
}

static void offset_rows(const void *const *rows, int64_t n, int64_t offset, const void **out) {
  for (int64_t i = 0; i < n; i++) out[i] = (const char *)rows[i] + offset;
}

/* The memory of keys [first, first + n) for the item's KV heads, as ranges
 * in key order, K then V of each block (or run of blocks adjacent in
 * memory): one range for all heads when the keys fill their block and the
 * heads' tiles are adjacent (the dense layout), one per head otherwise.
 * Dense rows hold all heads of a key side by side. At most `capacity`
 * ranges: strided tiles in small blocks need more than the dense layout's
 * bound, and the rest of such a tile is left to the hardware prefetcher. */
static size_t tile_ranges(const pa_attention_call *c, const pa_plan_item *item, int64_t first,
                          int64_t n, const char **start, size_t *bytes, size_t capacity) {
  const pa_kv_source *kv = &c->kv;
  int64_t heads = item->kv_end - item->kv_begin, head0 = item->kv_begin * kv->head_bytes;
  size_t count = 0;
  if (!kv->block_tables) {
    size_t width = (size_t)(heads * kv->head_bytes);
    for (int64_t row = kv->row_starts[item->seq] + first, end = row + n; row < end; row++) {
      start[count] = kv->key + row * kv->key_row_bytes + head0;
      bytes[count++] = width;
      start[count] = kv->value + row * kv->value_row_bytes + head0;
      bytes[count++] = width;
    }
    return count;
  }
  const int32_t *table =
      kv->block_tables + item->seq * kv->block_table_stride + first / kv->block_size;
  for (int64_t key = first, end = first + n, offset = first % kv->block_size; key < end;
       table++, offset = 0) {
    int64_t run = PA_MIN(kv->block_size - offset, end - key);
    int64_t at = *table * kv->block_bytes + head0;
    int whole = run == kv->block_size && kv->heads_adjacent;
    for (int64_t h = 0; h < (whole ? 1 : heads); h++) {
      int64_t from = at + h * kv->head_bytes + offset * kv->token_bytes;
      size_t length = (size_t)(whole ? heads * kv->head_bytes : run * kv->token_bytes);
      int64_t value_from = from;
      size_t value_length = length;
      if (kv->tiled && !whole) {
        /* The keys' 16-token groups hold them; their values are spread over
         * the whole tile. */
        int64_t group = PA_TILED_GROUP * kv->token_bytes;
        from = at + h * kv->head_bytes + offset / PA_TILED_GROUP * group;
        length = (size_t)((offset + run + PA_TILED_GROUP - 1) / PA_TILED_GROUP * group -
                          offset / PA_TILED_GROUP * group);
        value_from = at + h * kv->head_bytes;
        value_length = (size_t)(kv->block_size * kv->token_bytes);
      }
      if (count >= 2 && start[count - 2] + bytes[count - 2] == kv->key + from &&
          start[count - 1] + bytes[count - 1] == kv->value + value_from) {
        /* Blocks adjacent in memory extend the last pair of ranges: fewer,
         * longer runs of requests (docs/code-figures.md, tile_ranges). */
        bytes[count - 2] += length;
        bytes[count - 1] += value_length;
        continue;
      }
      if (count + 2 > capacity) return count;
      start[count] = kv->key + from;
      bytes[count++] = length;
      start[count] = kv->value + value_from;
      bytes[count++] = value_length;
    }
    key += run;
  }
  return count;
}

/* Appends [at, at + length) to the `*count` ranges, extending the last one
 * where it ends at `at`; 0 when that needs a range past `capacity`. */
static int append_range(const char **start, size_t *bytes, size_t *count, size_t capacity,
                        const char *at, size_t length) {
  if (*count > 0 && start[*count - 1] + bytes[*count - 1] == at) {
    bytes[*count - 1] += length;
    return 1;
  }
  if (*count >= capacity) return 0;
  start[*count] = at;
  bytes[(*count)++] = length;
  return 1;
}

/* The item's output rows as ranges, adjacent rows merged (a query token's
 * heads lie side by side), at most `capacity`: the last tile's kernels
 * request them as they compute, so that finish_row stores into lines
 * already in cache rather than waiting on each row's (docs/peer-limits.md,
 * "The rows around the kernels"). */
static size_t output_ranges(const pa_attention_call *c, const pa_plan_item *item,
                            const char **start, size_t *bytes, size_t capacity) {
  size_t m = pa_item_rows(item), count = 0;
  size_t row_bytes = (size_t)c->layer->head_size * pa_dtype_size(c->layer->dtype);
  int64_t q_start = c->plan->q_starts[item->seq];
  pa_row_walk walk = pa_row_walk_from(item, 0);
  for (size_t i = 0; i < m; i++, pa_row_walk_next(&walk)) {
    const char *row = out_row(c, q_start + walk.row, walk.head);
    if (!append_range(start, bytes, &count, capacity, row, row_bytes)) break;
  }
  return count;
}

/* Cache lines of `count` ranges of these lengths. */
static size_t range_lines(const size_t *bytes, size_t count) {
  size_t lines = 0;
  for (size_t r = 0; r < count; r++) lines += (bytes[r] + PA_CACHE_LINE - 1) / PA_CACHE_LINE;
  return lines;
}

/* Appends to start / bytes (from `count`, up to `capacity`) the memory of
 * keys [first, first + n) of the item's KV head h in a tiled cache, side 0
 * (K: the 16-token groups holding them) or 1 (V: each block's whole tile,
 * over which a token's values are spread); blocks adjacent in memory extend
 * one range. Returns the new count. */
static size_t tiled_side_ranges(const pa_attention_call *c, const pa_plan_item *item, int64_t first,
                                int64_t n, int64_t h, int side, const char **start, size_t *bytes,
                                size_t count, size_t capacity) {
  const pa_kv_source *kv = &c->kv;
  if (!kv->block_tables) return count;
  const char *base = (side ? kv->value : kv->key) + (item->kv_begin + h) * kv->head_bytes;
  int64_t group = PA_TILED_GROUP * kv->token_bytes;
  const int32_t *table =
      kv->block_tables + item->seq * kv->block_table_stride + first / kv->block_size;
  for (int64_t key = first, end = first + n, offset = first % kv->block_size; key < end;
       table++, offset = 0) {
    int64_t run = PA_MIN(kv->block_size - offset, end - key);
    const char *at = base + *table * kv->block_bytes;
    size_t length = (size_t)(kv->block_size * kv->token_bytes);
    if (!side) {
      at += offset / PA_TILED_GROUP * group;
      length = (size_t)(((offset + run + PA_TILED_GROUP - 1) / PA_TILED_GROUP -
                         offset / PA_TILED_GROUP) *
                        group);
    }
    key += run;
    if (!append_range(start, bytes, &count, capacity, at, length)) break;
  }
  return count;
}

/* How far the tiles' kernels request ahead of their reads, in cache
 * elements (the same keys ahead whatever their size): far enough for
 * lines from DRAM to arrive in L2 before the tile loads that wait on them,
 * not so far that they push out lines still to be read (docs/xeon-amx.md,
 * "Requests just ahead of the tiles", "The requests' lead"). */
enum { PA_STREAM_LEAD_ELEMENTS = 16384 };

static size_t stream_lead(const pa_attention_call *c) {
  return PA_STREAM_LEAD_ELEMENTS * pa_dtype_size(c->kv.dtype);
}

/* Moves the requests' cursor `bytes` on without requesting them. */
static void stream_skip(pa_prefetch *p, size_t bytes) {
  while (p->next < p->count && bytes > 0) {
    size_t left = p->bytes[p->next] - p->offset, take = PA_MIN(left, bytes);
    p->offset += take;
    bytes -= take;
    if (p->offset >= p->bytes[p->next]) {
      p->next++;
      p->offset = 0;
    }
  }
}

/* Bytes of `count` ranges. */
static size_t range_total(const size_t *bytes, size_t count) {
  size_t total = 0;
  for (size_t r = 0; r < count; r++) total += bytes[r];
  return total;
}

/* A direct item's reads over a tiled cache in the order the tiles' kernels
 * make them: K of every KV head, then V of every head, of keys [first,
 * first + n), then as much of the next tile's (next_n keys from `next`, in
 * the same order) as the requests run ahead; *tile_lines counts the lines
 * of this tile's. */
static size_t tiled_read_order(const pa_attention_call *c, const pa_plan_item *item,
                               const pa_item_scratch *s, int64_t first, int64_t n, int64_t next,
                               int64_t next_n, size_t *tile_lines) {
  size_t capacity = pa_prefetch_ranges(c->plan->max_rows, c->plan->key_tile), count = 0;
  int64_t heads = item->kv_end - item->kv_begin;
  for (int side = 0; side < 2; side++) {
    for (int64_t h = 0; h < heads; h++) {
      count = tiled_side_ranges(c, item, first, n, h, side, s->stream_start, s->stream_bytes, count,
                                capacity);
    }
  }
  *tile_lines = range_lines(s->stream_bytes, count);
  size_t tile_bytes = range_total(s->stream_bytes, count), listed = 0, lead = stream_lead(c);
  for (int side = 0; side < 2 && next_n > 0 && listed < lead; side++) {
    for (int64_t h = 0; h < heads && listed < lead; h++) {
      count = tiled_side_ranges(c, item, next, next_n, h, side, s->stream_start, s->stream_bytes,
                                count, capacity);
      listed = range_total(s->stream_bytes, count) - tile_bytes;
    }
  }
  return count;
}

/* The online-softmax epilogue of rows [r0, r0 + m) over keys [first, first + n),
 * for the packed and tiled P V kernels (`packed`) or the direct ones. */
static void softmax_rows(const pa_attention_call *c, const pa_item_scratch *s, int64_t first,
                         size_t n, size_t r0, size_t m, int all_visible, int packed) {
  const pa_layer *layer = c->layer;
  size_t tile = (size_t)c->plan->key_tile;
  pa_softmax_tile t = {
      .m = m,
      .n = n,
      .first_key = first,
      .score_scale = c->ops->scale_scores ? c->q_factor : 1.0f,
      .soft_cap = layer->soft_cap,
      .alibi = layer->alibi ? s->alibi + r0 : NULL,
      .position = s->position + r0,
      .key_lo = all_visible ? NULL : s->key_lo + r0,
      .key_hi = s->key_hi + r0,
      .row_max = s->row_max + r0,
      .row_sum = s->row_sum + r0,
      .rescale = s->rescale + r0,
      .bf16_weights = c->ops->p_bf16,
  };
  pa_softmax_fn softmax = c->kernels->softmax;
  if (packed && reads_tiles(c) && c->ops->tiled_p_split) {
    softmax = c->kernels->softmax_split_rows;
  } else if (packed && c->ops->packed_p_bf16_rows) {
    softmax = c->kernels->softmax_bf16_rows;
  }
  softmax(&t, s->s + r0 * tile, tile);
}

/* Rows (anchors, in a tiled cache) of KV head `kv` (of the item) for the
 * tile whose first head's are `rows`: those themselves, or a spare set
 * filled with them. */
static const void **head_anchors(const pa_attention_call *c, const void **rows, size_t n, size_t kv,
                                 const void **spare) {
  if (kv == 0) return rows;
  offset_rows(rows, (int64_t)n, (int64_t)kv * c->kv.head_bytes, spare);
  return spare;
}

/* Rows of KV head `kv`'s keys (side 0) or values (1) for the row kernels:
 * as head_anchors, or, from a tiled cache, unpacked into the side's
 * scratch (one head at a time: a kernel call reads one head's side). */
static const void **head_rows(const pa_attention_call *c, const pa_item_scratch *s,
                              const void **rows, size_t n, size_t kv, int side,
                              const void **spare) {
  const void **anchors = head_anchors(c, rows, n, kv, spare);
  if (!c->kv.tiled) return anchors;
  size_t size = pa_dtype_size(c->kv.dtype), row_bytes = (size_t)c->kv.token_bytes;
  c->kernels->unpack_tiled[side](s->unpacked[side], anchors, n, row_bytes / size, size,
                                 (size_t)c->kv.block_size);
  for (size_t i = 0; i < n; i++) spare[i] = (const char *)s->unpacked[side] + i * row_bytes;
  return spare;
}

/* A side's tile converted for the tiles' products, where the pair's cache
 * needs it (FP8): into k_packed or v_packed, the stage those products get. */
static void stage_tiles(const pa_attention_call *c, const pa_item_scratch *s, int side,
                        const void **anchors, size_t n) {
  pa_stage_tiled_fn stage = c->ops->stage_tiled[side];
  if (stage) {
    stage(side ? s->v_packed : s->k_packed, anchors, n, (size_t)c->layer->head_size,
          (size_t)c->kv.block_size);
  }
}

/* The keys of [first, first + n) that rows [r0, r0 + m) see some of: a
 * prefix of the tile, empty when none of them sees any. */
static size_t seen_prefix(const pa_item_scratch *s, size_t r0, size_t m, int64_t first, size_t n) {
  int64_t hi = first;
  for (size_t i = r0; i < r0 + m; i++) {
    if (s->key_hi[i] > s->key_lo[i]) hi = PA_MAX(hi, (int64_t)s->key_hi[i]);
  }
  return (size_t)PA_MIN(hi - first, (int64_t)n);
}

/* Packed (many rows per head): each head's tile is packed once and used by
 * all its rows. Kept out of attend_tile, the decode loop, so that changes
 * here leave that loop's code as it is. */
__attribute__((noinline)) static void packed_tile(const pa_attention_call *c,
                                                  const pa_plan_item *item,
                                                  const pa_item_scratch *s, int64_t first, size_t n,
                                                  const void **k_rows, const void **v_rows,
                                                  const void **spare[2][2], pa_prefetch *ahead,
                                                  size_t budget, int all_visible) {
  size_t d = (size_t)c->layer->head_size, tile = (size_t)c->plan->key_tile;
  size_t kv_count = (size_t)(item->kv_end - item->kv_begin);
  size_t m_kv = pa_item_rows(item) / kv_count, ldq = q_stride(d);
  size_t heads = (size_t)(item->head_end - item->head_begin) / kv_count;
  /* A tile some rows see only in part goes in groups of whole query tokens,
   * each over only the keys its rows see: the masked keys past a group are
   * not computed (pa_attn_ops.partial_tile_rows). */
  size_t group = all_visible ? m_kv : PA_MAX(c->ops->partial_tile_rows / heads, 1) * heads;
  int tiles = reads_tiles(c);
  /* Kernels that compute a tile faster than its requests pay back take
   * none (AMX; docs/xeon-amx.md). */
  int unprefetched = tiles ? c->ops->tiled_unprefetched : c->ops->packed_unprefetched;
  pa_prefetch *requests = unprefetched ? NULL : ahead;
  for (size_t kv = 0; kv < kv_count; kv++) {
    const void **k = NULL, **v = NULL;
    if (tiles) {
      k = head_anchors(c, k_rows, n, kv, spare[kv & 1][0]);
      v = head_anchors(c, v_rows, n, kv, spare[kv & 1][1]);
      stage_tiles(c, s, 0, k, n);
      stage_tiles(c, s, 1, v, n);
    } else {
      c->ops->pack_k(s->k_packed, head_rows(c, s, k_rows, n, kv, 0, spare[kv & 1][0]), n, d);
      c->ops->pack_v(s->v_packed, head_rows(c, s, v_rows, n, kv, 1, spare[kv & 1][1]), n, d);
    }
    for (size_t g0 = 0; g0 < m_kv; g0 += group) {
      size_t r0 = kv * m_kv + g0, m = PA_MIN(group, m_kv - g0);
      size_t keys = all_visible ? n : seen_prefix(s, r0, m, first, n);
      if (keys == 0) continue; /* the online softmax over no keys changes nothing */
      size_t share = (budget * m + m_kv - 1) / m_kv;
      const char *q = (const char *)s->q + r0 * ldq * c->ops->q_size;
      float *scores = s->s + r0 * tile, *o = s->o + r0 * s->ldo;
      pa_prefetch_begin(ahead, share);
      if (tiles) {
        c->ops->qk_tiled(m, keys, d, q, ldq, k, s->k_packed, scores, tile, requests);
      } else {
        c->ops->qk_packed(m, keys, d, q, ldq, s->k_packed, scores, tile, requests);
      }
      softmax_rows(c, s, first, keys, r0, m, all_visible, 1);
      pa_prefetch_begin(ahead, share);
      if (tiles) {
        c->ops->pv_tiled(m, keys, d, scores, tile, v, (size_t)c->kv.block_size, s->v_packed, o,
                         s->ldo, s->rescale + r0, requests);
      } else {
        c->ops->pv_packed(m, keys, d, scores, tile, s->v_packed, o, s->ldo, s->rescale + r0,
                          requests);
      }
    }
  }
}

/* Keys [first, first + n) for every KV head of the item. k_rows / v_rows
 * hold the first head's rows; `spare` two sets for the others; `ahead` the
 * next tile's memory, requested over this tile's kernel calls.
 *
 * Direct (decode): S for every head, one softmax over all the item's rows
 * (its per-call work, the row reductions, is then shared by them), P V for
 * every head (docs/code-figures.md, attend_tile). */
static void attend_tile(const pa_attention_call *c, const pa_plan_item *item,
                        const pa_item_scratch *s, int64_t first, size_t n, const void **k_rows,
                        const void **v_rows, const void **spare[2][2], pa_prefetch *ahead,
                        pa_prefetch *stream, size_t stream_budget) {
  size_t d = (size_t)c->layer->head_size, tile = (size_t)c->plan->key_tile;
  size_t m = pa_item_rows(item), kv_count = (size_t)(item->kv_end - item->kv_begin);
  size_t m_kv = m / kv_count, ldq = q_stride(d);
  int all_visible = 1;
  for (size_t i = 0; i < m && all_visible; i++) {
    all_visible = s->key_lo[i] <= first && s->key_hi[i] >= first + (int64_t)n;
  }
  /* per kernel call */
  size_t budget = (range_lines(ahead->bytes, ahead->count) + 2 * kv_count - 1) / (2 * kv_count);

  if (item_is_packed(c, item)) {
    packed_tile(c, item, s, first, n, k_rows, v_rows, spare, ahead, budget, all_visible);
    return;
  }
  /* A direct item over tiles the kernels read in place takes the tiles'
   * products in this loop's order: one softmax for all its KV heads. The
   * tiles' kernels (which the next tile's requests do not pay back) are
   * given the item's reads a little ahead instead (`stream`, each call an
   * equal share; docs/xeon-amx.md). */
  int tiles = reads_tiles(c);
  pa_prefetch *requests = tiles && c->ops->tiled_unprefetched ? stream : ahead;
  for (size_t kv = 0; kv < kv_count; kv++) {
    size_t r0 = kv * m_kv;
    const char *q = (const char *)s->q + r0 * ldq * c->ops->q_size;
    pa_prefetch_begin(ahead, budget);
    if (stream) pa_prefetch_begin(stream, stream_budget);
    if (tiles) {
      const void **k = head_anchors(c, k_rows, n, kv, spare[kv & 1][0]);
      stage_tiles(c, s, 0, k, n);
      c->ops->qk_tiled(m_kv, n, d, q, ldq, k, s->k_packed, s->s + r0 * tile, tile, requests);
    } else {
      c->ops->qk(m_kv, n, d, q, ldq, head_rows(c, s, k_rows, n, kv, 0, spare[kv & 1][0]),
                 s->s + r0 * tile, tile, ahead);
    }
  }
  softmax_rows(c, s, first, n, 0, m, all_visible, tiles);
  for (size_t kv = 0; kv < kv_count; kv++) {
    size_t r0 = kv * m_kv;
    float *o = s->o + r0 * s->ldo;
    pa_prefetch_begin(ahead, budget);
    if (stream) pa_prefetch_begin(stream, stream_budget);
    if (tiles) {
      const void **v = head_anchors(c, v_rows, n, kv, spare[kv & 1][1]);
      stage_tiles(c, s, 1, v, n);
      c->ops->pv_tiled(m_kv, n, d, s->s + r0 * tile, tile, v, (size_t)c->kv.block_size, s->v_packed,
                       o, s->ldo, s->rescale + r0, requests);
    } else {
      c->ops->pv(m_kv, n, d, s->s + r0 * tile, tile,
                 head_rows(c, s, v_rows, n, kv, 1, spare[kv & 1][1]), o, s->ldo, s->rescale + r0,
                 ahead);
    }
  }
}

/* Bytes of one KV head's K rows in a direct tile of a long sequence in
 * small blocks: head sizes 64 / 96 / 128 / 256 in 2 bytes then take 64 /
 * 48 / 32 / 16 keys, rounded to multiples of 16 so that the 4 x 4 Q K^T
 * blocks have no tail (docs/code-figures.md, PA_DIRECT_TILE_BYTES). */
enum { PA_DIRECT_TILE_BYTES = 8192 };

/* Keys per tile of a direct (decode) item over `keys` keys (measurements in
 * docs/decode-memory.md). Short tiles keep the next tile, requested while
 * this one computes, close to where it is read: measured best for long
 * sequences of 2-byte caches in small blocks.
 * FP8 decode is compute-bound, large blocks are contiguous anyway, and a
 * short sequence is mostly per-call overhead: there fewer, longer kernel
 * calls win, and up to a whole tile's worth of keys in one tile. */
static size_t direct_tile(const pa_kv_source *kv, int64_t keys, size_t key_tile) {
  int long_tiles =
      pa_dtype_size(kv->dtype) == 1 || !kv->block_tables || kv->block_size >= 64 || keys <= 256;
  if (keys <= (int64_t)key_tile) return key_tile; /* one tile: nothing ahead to fetch */
  if (long_tiles) return 64;
  size_t fill = (PA_DIRECT_TILE_BYTES + (size_t)kv->token_bytes - 1) / (size_t)kv->token_bytes;
  return PA_MIN(PA_MAX((fill + 15) / 16 * 16, 16), key_tile);
}

static void attend_item(const pa_attention_call *c, const pa_plan_item *item, int thread) {
  pa_item_scratch s = carve_scratch(c, thread);
  size_t d = (size_t)c->layer->head_size, lds_tile = (size_t)c->plan->key_tile;
  int64_t lo, hi;
  size_t m = load_queries(c, item, &s, &lo, &hi);
  int64_t keys = hi > lo ? hi - lo : 0; /* lo > hi when no row sees a key */
  size_t tile = item_is_packed(c, item) ? lds_tile : direct_tile(&c->kv, keys, lds_tile);
  if (reads_tiles(c)) {
    /* The tiles' kernels take keys from a multiple of PA_TILED_STEP on (the
     * keys before the item's are masked), and whole key tiles where each
     * call loads and releases a tile configuration, a cost that short
     * direct tiles would pay several times over (docs/xeon-amx.md).
     * Otherwise a tile holds whole blocks where it can: a token's values
     * are spread over its block, so part of a block is requested whole. */
    lo = lo < hi ? lo / PA_TILED_STEP * PA_TILED_STEP : lo;
    size_t keys_wanted = PA_MAX(tile, (size_t)c->kv.block_size);
    tile =
        c->ops->tiled_whole_tiles
            ? lds_tile
            : PA_MIN((keys_wanted + PA_TILED_STEP - 1) / PA_TILED_STEP * PA_TILED_STEP, lds_tile);
  }
  float *partial = NULL; /* a split's O, max and sum per row, for merge_rows */
  if (item->split >= 0) {
    const pa_split_group *g = &c->plan->groups[item->split_group];
    partial = c->partials + g->partial_offset + (size_t)item->split * m * (d + 2);
    s.o = partial; /* O accumulates in place */
    s.ldo = d + 2;
  }
  /* O needs no zeroing: a row's first keys come with a zero correction,
   * which makes the P V kernel discard what O held (see pa_pv_fn). */
  for (size_t i = 0; i < m; i++) {
    s.row_max[i] = -INFINITY;
    s.row_sum[i] = 0.0f;
  }

  /* Row pointers of the first KV head, double-buffered so the next tile's
   * are known (and requested) while this one computes; two spare sets for
   * the other KV heads. */
  const void **k_rows[2] = {s.k_rows, s.k_rows + lds_tile},
             **v_rows[2] = {s.v_rows, s.v_rows + lds_tile};
  const void **spare[2][2] = {{s.k_rows + 2 * lds_tile, s.v_rows + 2 * lds_tile},
                              {s.k_rows + 3 * lds_tile, s.v_rows + 3 * lds_tile}};
  int current = 0;
  /* Packed tiles of many rows per KV head request less per unit of work
   * and want the lines in L1 even where the direct ones request into L2;
   * those of few rows, as many requests for a quarter of the work, want L2
   * too (docs/decode-memory.md, "Zen 4: requests into L2", "Zen 4: packed
   * tiles of 16 rows"). */
  int to_l2 = c->kernels->prefetch_to_l2 &&
              (!item_is_packed(c, item) || rows_per_kv_head(item) < PA_PACKED_L1_ROWS);
  /* The tiles' kernels of a direct item request its reads just ahead
   * (attend_tile), except in an item of one tile, mostly per-call work,
   * which the requests cost more than they save (docs/xeon-amx.md). */
  int streamed = reads_tiles(c) && c->ops->tiled_unprefetched && !item_is_packed(c, item) &&
                 hi - lo > (int64_t)tile;
  size_t kv_heads = (size_t)(item->kv_end - item->kv_begin);
  if (lo < hi) {
    gather_tile_rows(&c->kv, item->seq, item->kv_begin, lo, PA_MIN((int64_t)tile, hi - lo),
                     k_rows[0], v_rows[0]);
  }
  for (int64_t first = lo; first < hi; first += (int64_t)tile, current ^= 1) {
    int64_t next = first + (int64_t)tile, next_n = PA_MAX(PA_MIN((int64_t)tile, hi - next), 0);
    int64_t n = PA_MIN((int64_t)tile, hi - first);
    pa_prefetch ahead = {.start = s.range_start, .bytes = s.range_bytes, .to_l2 = to_l2};
    if (next_n > 0) {
      gather_tile_rows(&c->kv, item->seq, item->kv_begin, next, next_n, k_rows[current ^ 1],
                       v_rows[current ^ 1]);
      ahead.count = tile_ranges(c, item, next, next_n, s.range_start, s.range_bytes,
                                pa_prefetch_ranges(c->plan->max_rows, c->plan->key_tile));
    } else if (!partial) {
      ahead.count = output_ranges(c, item, s.range_start, s.range_bytes,
                                  pa_prefetch_ranges(c->plan->max_rows, c->plan->key_tile));
    }
    /* Into L2: a stream request into L1 as well was slower (docs/xeon-amx.md). */
    pa_prefetch stream = {.start = s.stream_start, .bytes = s.stream_bytes, .to_l2 = 1};
    size_t stream_budget = 0, tile_lines = 0;
    if (streamed) {
      stream.count = tiled_read_order(c, item, &s, first, n, next, next_n, &tile_lines);
      stream_skip(&stream, stream_lead(c));
      stream_budget = (tile_lines + 2 * kv_heads - 1) / (2 * kv_heads); /* a call's own reads */
    }
    attend_tile(c, item, &s, first, (size_t)n, k_rows[current], v_rows[current], spare, &ahead,
                streamed ? &stream : NULL, stream_budget);
  }

  /* A direct item's P V may have kept O in an order of its own. */
  if (lo < hi && c->ops->o_to_columns && reads_rows_directly(c, item)) {
    for (size_t i = 0; i < m; i++) c->ops->o_to_columns(s.o + i * s.ldo, d);
  }
  if (partial) {
    for (size_t i = 0; i < m; i++, partial += d + 2) {
      partial[d] = s.row_max[i];
      partial[d + 1] = s.row_sum[i];
    }
    return;
  }
  int64_t q_start = c->plan->q_starts[item->seq];
  pa_row_walk walk = pa_row_walk_from(item, 0);
  for (size_t i = 0; i < m; i++, pa_row_walk_next(&walk)) {
    finish_row(c, q_start + walk.row, walk.head, s.o + i * d, s.row_max[i], s.row_sum[i]);
  }
}

/* Merges rows [begin, end) of a split group: each split's O weighed by its
 * share of the row's exponent sum. */
static void merge_rows(const pa_attention_call *c, const pa_split_group *g, size_t begin,
                       size_t end, int thread) {
  size_t d = (size_t)c->layer->head_size;
  size_t m = pa_item_rows(&g->shape);
  float *acc = carve_scratch(c, thread).merge;
  const float *parts = c->partials + g->partial_offset;
  int64_t q_start = c->plan->q_starts[g->shape.seq];
  pa_row_walk walk = pa_row_walk_from(&g->shape, begin);
  for (size_t i = begin; i < end && i < m; i++, pa_row_walk_next(&walk)) {
    float row_max = -INFINITY;
    for (int32_t p = 0; p < g->num_splits; p++) {
      row_max = fmaxf(row_max, parts[((size_t)p * m + i) * (d + 2) + d]);
    }
    memset(acc, 0, d * sizeof(float));
    float row_sum = 0.0f;
    if (row_max != -INFINITY) {
      for (int32_t p = 0; p < g->num_splits; p++) {
        const float *part = parts + ((size_t)p * m + i) * (d + 2);
        if (part[d] == -INFINITY) continue; /* this split saw no key of the row */
        float weight = exp2f(part[d] - row_max);
        row_sum += weight * part[d + 1];
        c->kernels->axpy(acc, part, d, weight);
      }
    }
    finish_row(c, q_start + walk.row, walk.head, acc, row_max, row_sum);
  }
}

static void item_task(void *arg, size_t index, int thread) {
  const pa_attention_call *c = arg;
  attend_item(c, &c->plan->items[index], thread);
  if (c->kernels->release_tiles) c->kernels->release_tiles();
}

/* Task `index` merges chunk index % merge_chunks of group index / merge_chunks. */
static void merge_task(void *arg, size_t index, int thread) {
  const pa_attention_call *c = arg;
  size_t chunks = c->plan->merge_chunks, begin = index % chunks * PA_MERGE_ROWS;
  merge_rows(c, &c->plan->groups[index / chunks], begin, begin + PA_MERGE_ROWS, thread);
}

void pa_attention_run(pa_context *ctx, const pa_attention_call *call) {
  const pa_plan *plan = call->plan;
  pa_pool_run(ctx->pool, item_task, (void *)call, plan->num_items);
  pa_pool_run(ctx->pool, merge_task, (void *)call, plan->num_groups * plan->merge_chunks);
}
