/*
 * A context on a host's thread team (pa_context_create_with_team) gives the
 * bytes a context with its own pool gives, whether the host runs every
 * member on a thread of its own, one after another on the caller's, or
 * fewer members than asked; and its arguments are checked.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { MEMBERS = 3, NB = 96, BS = 16, NKV = 2, HEADS = 8, HS = 64 };

/* Hosts: every member on a thread of its own (the caller's among them), all
 * members in turn on the caller's thread, or only member 0. */
typedef enum host_kind { HOST_THREADS, HOST_IN_TURN, HOST_ONE } host_kind;

typedef struct member_start {
  pa_team_work_fn work;
  void *arg;
  int thread;
} member_start;

static void *member_main(void *raw) {
  member_start *m = raw;
  m->work(m->arg, m->thread);
  return NULL;
}

static long g_team_calls;

static void host_run(void *team, pa_team_work_fn work, void *arg, int num_threads) {
  host_kind kind = *(host_kind *)team;
  g_team_calls++;
  TU_CHECK(num_threads == MEMBERS, "the team was asked for %d members", num_threads);
  if (kind == HOST_ONE) {
    work(arg, 0);
  } else if (kind == HOST_IN_TURN) {
    for (int t = num_threads - 1; t >= 0; t--) work(arg, t);
  } else {
    pthread_t threads[MEMBERS];
    member_start starts[MEMBERS];
    for (int t = 1; t < num_threads; t++) {
      starts[t] = (member_start){work, arg, t};
      TU_CHECK(pthread_create(&threads[t], NULL, member_main, &starts[t]) == 0, "pthread_create");
    }
    work(arg, 0);
    for (int t = 1; t < num_threads; t++) pthread_join(threads[t], NULL);
  }
}

/* A write and a mixed batch (a prompt on the packed tiles, a chunk, decodes
 * long enough to be split over the threads); out and lse get the result. */
static void run(pa_context *ctx, const pa_kv_cache *cache, const void *keys, const void *query,
                void *out, float *lse) {
  static const int32_t qsl[5] = {0, 40, 41, 42, 50}, lens[4] = {40, 900, 700, 300};
  static int32_t tables[4][60];
  static int64_t slots[40];
  for (int s = 0; s < 4; s++) {
    for (int b = 0; b < 60; b++) tables[s][b] = (s * 23 + b * 5) % NB;
  }
  for (int t = 0; t < 40; t++) slots[t] = (int64_t)tables[0][t / BS] * BS + t % BS;
  pa_layer_config config = {.num_heads = HEADS,
                            .num_kv_heads = NKV,
                            .head_size = HS,
                            .attn_type = PA_ATTN_DECODER,
                            .dtype = PA_BF16};
  pa_layer *layer = NULL;
  TU_CHECK(pa_layer_create(&config, &layer) == PA_OK, "layer: %s", pa_last_error());
  TU_CHECK(pa_write_kv(ctx, cache, keys, NKV * HS, keys, NKV * HS, PA_BF16, 40, slots) == PA_OK,
           "write: %s", pa_last_error());
  pa_batch batch = {4, qsl, lens, &tables[0][0], 60};
  TU_CHECK(pa_paged_attention(ctx, layer, NULL, query, HEADS * HS, cache, &batch, out, HEADS * HS,
                              lse) == PA_OK,
           "attention: %s", pa_last_error());
  pa_layer_destroy(layer);
}

int main(int argc, char **argv) {
  tu_rng rng;
  tu_rng_seed(&rng, tu_seed_from_args(argc, argv, 20261201));
  size_t side = (size_t)NB * NKV * BS * HS * 2, rows = 50;
  unsigned char *k0 = tu_malloc(side), *v0 = tu_malloc(side);
  tu_fill_random_bytes(&rng, k0, side);
  for (size_t i = 0; i < side / 2; i++) ((uint16_t *)k0)[i] &= 0x3fff; /* finite bf16 */
  memcpy(v0, k0, side);
  void *keys = hx_alloc_rows(40, NKV * HS, PA_BF16),
       *query = hx_alloc_rows(50, HEADS * HS, PA_BF16);
  hx_fill_rows(&rng, keys, NKV * HS, 40, NKV * HS, PA_BF16, 1.0);
  hx_fill_rows(&rng, query, HEADS * HS, 50, HEADS * HS, PA_BF16, 1.0);

  /* The reference: a context with its own pool. */
  void *want = tu_malloc(rows * HEADS * HS * 2);
  float *want_lse = tu_malloc(rows * HEADS * sizeof(float));
  unsigned char *kc = tu_malloc(side), *vc = tu_malloc(side);
  memcpy(kc, k0, side), memcpy(vc, v0, side);
  pa_kv_cache cache = {kc, vc, NB, BS, NKV, HS, PA_BF16, 1.0f, 1.0f, 0, 0, PA_KV_ROWS};
  pa_context *own = NULL;
  TU_CHECK(pa_context_create(MEMBERS, &own) == PA_OK, "own pool: %s", pa_last_error());
  run(own, &cache, keys, query, want, want_lse);
  pa_context_destroy(own);

  static const host_kind kinds[] = {HOST_THREADS, HOST_IN_TURN, HOST_ONE};
  static const char *names[] = {"threads", "in turn", "one member"};
  for (int k = 0; k < 3; k++) {
    host_kind kind = kinds[k];
    memcpy(kc, k0, side), memcpy(vc, v0, side);
    pa_context *ctx = NULL;
    long calls = g_team_calls;
    TU_CHECK(pa_context_create_with_team(MEMBERS, host_run, &kind, &ctx) == PA_OK, "%s: %s",
             names[k], pa_last_error());
    if (!ctx) continue;
    TU_CHECK(pa_context_num_threads(ctx) == MEMBERS, "%s: %d threads", names[k],
             pa_context_num_threads(ctx));
    void *got = tu_malloc(rows * HEADS * HS * 2);
    float *lse = tu_malloc(rows * HEADS * sizeof(float));
    run(ctx, &cache, keys, query, got, lse);
    TU_CHECK(g_team_calls > calls, "%s: the team ran no job", names[k]);
    TU_CHECK(memcmp(got, want, rows * HEADS * HS * 2) == 0, "%s: output differs", names[k]);
    TU_CHECK(memcmp(lse, want_lse, rows * HEADS * sizeof(float)) == 0, "%s: lse differs", names[k]);
    free(got), free(lse);
    pa_context_destroy(ctx);
  }

  host_kind kind = HOST_ONE;
  pa_context *ctx = NULL;
  TU_CHECK(pa_context_create_with_team(MEMBERS, NULL, &kind, &ctx) == PA_ERR_INVALID_ARGUMENT &&
               strstr(pa_last_error(), "run is NULL"),
           "a NULL run: %s", pa_last_error());
  TU_CHECK(pa_context_create_with_team(0, host_run, &kind, &ctx) == PA_ERR_INVALID_ARGUMENT &&
               strstr(pa_last_error(), "num_threads = 0"),
           "num_threads 0: %s", pa_last_error());
  TU_CHECK(pa_context_create_with_team(MEMBERS, host_run, &kind, NULL) == PA_ERR_INVALID_ARGUMENT,
           "a NULL ctx: %s", pa_last_error());
  TU_CHECK(!ctx, "a failed create returned a context");
  free(k0), free(v0), free(kc), free(vc), free(keys), free(query), free(want), free(want_lse);
  return tu_finish("test_team");
}
