/* The planner on its own (internal header): over random batches, the items
 * cover every (sequence, query head, query row) over all of its keys exactly
 * once, split pieces included, and come in the order the pool relies on: a
 * sequence's items together, longest first, sequences by their longest
 * item (before splits); pa_row_walk names an item's rows as
 * pa_item_row_head does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "test_util.h"

enum { PA_TEST_CASES = 400, PA_TEST_MAX_SEQS = 12 };

typedef struct batch_case {
  pa_plan_request request;
  int32_t q_starts[PA_TEST_MAX_SEQS + 1];
  int32_t kv_lens[PA_TEST_MAX_SEQS];
} batch_case;

static void draw_case(tu_rng *rng, batch_case *c) {
  static const int kv_heads[] = {1, 2, 8, 3};
  static const int groups[] = {1, 4, 7, 2};
  static const int head_sizes[] = {64, 128, 80, 256};
  memset(c, 0, sizeof *c);
  pa_plan_request *r = &c->request;
  r->num_threads = tu_int(rng, 1, 4);
  r->num_kv_heads = kv_heads[tu_int(rng, 0, 3)];
  r->num_heads = r->num_kv_heads * groups[tu_int(rng, 0, 3)];
  r->head_size = head_sizes[tu_int(rng, 0, 3)];
  r->mask.causal = tu_chance(rng, 0.75);
  r->mask.window = tu_chance(rng, 0.25) ? tu_int(rng, 1, 300) : 0;
  r->mask.symmetric = !r->mask.causal && r->mask.window && tu_chance(rng, 0.5);
  r->num_seqs = tu_int(rng, 0, PA_TEST_MAX_SEQS);
  for (int s = 0; s < r->num_seqs; s++) {
    /* Decodes, short and long prompts, chunks over a cached prefix. */
    int32_t q_len = tu_chance(rng, 0.3) ? tu_int(rng, 1, 4) : tu_int(rng, 1, 1200);
    c->q_starts[s + 1] = c->q_starts[s] + q_len;
    c->kv_lens[s] = q_len + (tu_chance(rng, 0.5) ? tu_int(rng, 0, 3000) : 0);
  }
  r->q_starts = r->num_seqs ? c->q_starts : NULL;
  r->kv_lens = c->kv_lens;
}

/* Every (sequence, head, row) is covered by items whose key ranges tile
 * [0, kv_len): the lengths add up and exactly one starts at key 0. */
static int check_coverage(const batch_case *c, const pa_plan *plan) {
  const pa_plan_request *r = &c->request;
  size_t units = (size_t)c->q_starts[r->num_seqs] * (size_t)r->num_heads;
  int64_t *keys = tu_calloc(units + 1, sizeof *keys);
  int *starts = tu_calloc(units + 1, sizeof *starts);
  int failures = 0;
  for (size_t i = 0; i < plan->num_items; i++) {
    const pa_plan_item *item = &plan->items[i];
    for (size_t k = 0; k < pa_item_rows(item); k++) {
      int32_t row, head;
      pa_item_row_head(item, k, &row, &head);
      size_t unit = (size_t)(c->q_starts[item->seq] + row) * (size_t)r->num_heads + (size_t)head;
      keys[unit] += item->key_end - item->key_begin;
      starts[unit] += item->key_begin == 0;
    }
  }
  for (int s = 0; s < r->num_seqs && failures < 5; s++) {
    for (int32_t row = c->q_starts[s]; row < c->q_starts[s + 1]; row++) {
      for (int h = 0; h < r->num_heads; h++) {
        size_t unit = (size_t)row * (size_t)r->num_heads + (size_t)h;
        if (keys[unit] != c->kv_lens[s] || starts[unit] != 1) {
          fprintf(stderr,
                  "sequence %d row %d head %d: %lld keys in %d first pieces, want %d in 1\n", s,
                  row - c->q_starts[s], h, (long long)keys[unit], starts[unit], c->kv_lens[s]);
          failures++;
        }
      }
    }
  }
  free(keys);
  free(starts);
  return failures;
}

/* pa_row_walk, from row 0 and from a later row, names the rows
 * pa_item_row_head does. */
static int check_walk(const pa_plan *plan, tu_rng *rng) {
  for (size_t k = 0; k < plan->num_items; k++) {
    const pa_plan_item *item = &plan->items[k];
    size_t m = pa_item_rows(item), from = (size_t)tu_int(rng, 0, (int)m - 1);
    size_t starts[2] = {0, from};
    for (int t = 0; t < 2; t++) {
      pa_row_walk walk = pa_row_walk_from(item, starts[t]);
      for (size_t i = starts[t]; i < m; i++, pa_row_walk_next(&walk)) {
        int32_t row, head;
        pa_item_row_head(item, i, &row, &head);
        if (walk.row != row || walk.head != head) {
          fprintf(stderr, "item %zu row %zu (walk from %zu): walk (%d, %d), want (%d, %d)\n", k, i,
                  starts[t], walk.row, walk.head, row, head);
          return 1;
        }
      }
    }
  }
  return 0;
}

/* A sequence's items together, longest first; sequences by their longest
 * item before splits (group_cost: every item's cost or more, and its
 * sequence's longest when none of them is split). */
static int check_order(const pa_plan *plan) {
  int seen[PA_TEST_MAX_SEQS] = {0};
  int64_t previous_group = INT64_MAX;
  size_t first = 0; /* of the current sequence */
  for (size_t i = 0; i <= plan->num_items; i++) {
    const pa_plan_item *item = i < plan->num_items ? &plan->items[i] : NULL;
    if (i > 0 && (!item || item->seq != plan->items[i - 1].seq)) {
      /* The sequence of items [first, i) is complete. */
      const pa_plan_item *head = &plan->items[first];
      int split = 0;
      for (size_t j = first; j < i; j++) split |= plan->items[j].split >= 0;
      if (!split && head->group_cost != head->cost) {
        fprintf(stderr, "item %zu: sequence %d's group cost %lld, its longest item %lld\n", first,
                head->seq, (long long)head->group_cost, (long long)head->cost);
        return 1;
      }
      first = i;
    }
    if (!item) break;
    if (item->cost > item->group_cost) {
      fprintf(stderr, "item %zu: cost %lld above its group cost %lld\n", i, (long long)item->cost,
              (long long)item->group_cost);
      return 1;
    }
    if (i == first) {
      if (seen[item->seq]) {
        fprintf(stderr, "item %zu: sequence %d's items are not together\n", i, item->seq);
        return 1;
      }
      seen[item->seq] = 1;
      if (item->group_cost > previous_group) {
        fprintf(stderr, "item %zu: sequence %d (group cost %lld) after a smaller one (%lld)\n", i,
                item->seq, (long long)item->group_cost, (long long)previous_group);
        return 1;
      }
      previous_group = item->group_cost;
    } else if (item->cost > plan->items[i - 1].cost ||
               item->group_cost != plan->items[i - 1].group_cost) {
      fprintf(stderr, "item %zu: cost %lld (group %lld) after %lld (group %lld) in sequence %d\n",
              i, (long long)item->cost, (long long)item->group_cost,
              (long long)plan->items[i - 1].cost, (long long)plan->items[i - 1].group_cost,
              item->seq);
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  tu_rng rng;
  tu_rng_seed(&rng, tu_seed_from_args(argc, argv, 0x91a7));
  pa_plan plan;
  memset(&plan, 0, sizeof plan);
  int failures = 0;
  for (int k = 0; k < PA_TEST_CASES && !failures; k++) {
    batch_case c;
    draw_case(&rng, &c);
    /* The same plan rebuilt in place, as the context does. */
    if (pa_plan_build(&plan, &c.request, "test_plan") != PA_OK) {
      fprintf(stderr, "case %d: pa_plan_build failed\n", k);
      failures++;
      break;
    }
    int bad = check_coverage(&c, &plan) + check_order(&plan) + check_walk(&plan, &rng);
    if (bad) {
      fprintf(stderr, "case %d: %d sequences, %d/%d heads, d %d, %d threads\n", k,
              c.request.num_seqs, c.request.num_heads, c.request.num_kv_heads, c.request.head_size,
              c.request.num_threads);
      failures += bad;
    }
  }
  free(plan.lengths);
  free(plan.items);
  free(plan.groups);
  printf("%s: %d cases\n", failures ? "FAIL" : "ok", PA_TEST_CASES);
  return failures ? 1 : 0;
}
