#define _POSIX_C_SOURCE 200809L

#include "workloads.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

pab_case *pab_case_new(const char *name, pab_api api, int num_seqs) {
  pab_case *c = pab_xcalloc(1, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s", name);
  c->api = api;
  c->bound = PAB_BOUND_COMPUTE;
  c->num_seqs = num_seqs;
  c->q_lens = pab_xcalloc((size_t)num_seqs, sizeof *c->q_lens);
  c->k_lens = pab_xcalloc((size_t)num_seqs, sizeof *c->k_lens);
  c->num_heads = 32;
  c->num_kv_heads = 8;
  c->head_size = 128;
  c->block_size = 16;
  c->dtype = PA_BF16;
  c->cache_dtype = PA_BF16;
  c->attn_type = PA_ATTN_DECODER;
  c->layout = -1;
  return c;
}

void pab_case_free(pab_case *c) {
  if (!c) return;
  free(c->q_lens);
  free(c->k_lens);
  free(c);
}

void pab_seq_pairs(pa_attn_type type, int window, int q_len, int k_len, double *pairs,
                   int64_t *keys_touched) {
  /* Mirrors the mask rules of pagedattn.h: query r sits at position k_len - q_len + r. */
  double n = 0;
  int64_t lo_all = INT64_MAX, hi_all = -1;
  for (int r = 0; r < q_len; r++) {
    int64_t i = (int64_t)k_len - q_len + r;
    int64_t lo = 0, hi = type == PA_ATTN_DECODER ? i : (int64_t)k_len - 1;
    if (window > 0) {
      if (lo < i - window + 1) lo = i - window + 1;
      int64_t h = type == PA_ATTN_ENCODER_ONLY ? i + window - 1 : i;
      if (hi > h) hi = h;
    }
    if (hi > (int64_t)k_len - 1) hi = (int64_t)k_len - 1;
    if (hi < lo) continue;
    n += (double)(hi - lo + 1);
    if (lo < lo_all) lo_all = lo;
    if (hi > hi_all) hi_all = hi;
  }
  *pairs = n;
  *keys_touched = hi_all >= lo_all ? hi_all - lo_all + 1 : 0;
}

void pab_case_metrics(const pab_case *c, pab_metrics *m) {
  memset(m, 0, sizeof *m);
  pa_dtype kv = c->api == PAB_API_PAGED ? c->cache_dtype : c->dtype;
  double row_bytes = (double)c->num_kv_heads * c->head_size * 2.0 * (double)pa_dtype_size(kv);
  for (int s = 0; s < c->num_seqs; s++) {
    double pairs;
    int64_t keys;
    pab_seq_pairs(c->attn_type, c->window, c->q_lens[s], c->k_lens[s], &pairs, &keys);
    m->pairs += pairs;
    m->kv_bytes += (double)keys * row_bytes;
    m->rows += c->q_lens[s];
  }
  m->flops = 4.0 * c->head_size * c->num_heads * m->pairs;
}

void pab_case_shape(const pab_case *c, char *buf, size_t cap) {
  /* Run-length groups of equal (q, k) keep ragged batches readable: "1x q2048 k2048 + 31x ...". */
  size_t len = 0;
  buf[0] = 0;
  for (int s = 0; s < c->num_seqs;) {
    int e = s;
    while (e < c->num_seqs && c->q_lens[e] == c->q_lens[s] && c->k_lens[e] == c->k_lens[s]) e++;
    int n = snprintf(buf + len, cap - len, "%s%dx q%d k%d", s ? " + " : "", e - s,
                     (int)c->q_lens[s], (int)c->k_lens[s]);
    if (n < 0 || (size_t)n >= cap - len) return;
    len += (size_t)n;
    s = e;
  }
  char extra[96] = "";
  size_t el = 0;
  if (c->window > 0) el += (size_t)snprintf(extra + el, sizeof extra - el, " win%d", c->window);
  if (c->alibi) el += (size_t)snprintf(extra + el, sizeof extra - el, " alibi");
  if (c->softcap > 0)
    el += (size_t)snprintf(extra + el, sizeof extra - el, " cap%g", (double)c->softcap);
  if (c->sinks) el += (size_t)snprintf(extra + el, sizeof extra - el, " sinks");
  if (c->lse) el += (size_t)snprintf(extra + el, sizeof extra - el, " lse");
  if (c->api == PAB_API_PAGED && c->fragmented)
    el += (size_t)snprintf(extra + el, sizeof extra - el, " frag");
  if (c->api == PAB_API_PAGED && c->layout == PA_KV_TILED)
    el += (size_t)snprintf(extra + el, sizeof extra - el, " tiled");
  /* "bf16>fp8_e4m3" only when the cache dtype differs from the activations'. */
  char types[40];
  if (c->api == PAB_API_PAGED && c->cache_dtype != c->dtype)
    snprintf(types, sizeof types, "%s>%s", pa_dtype_name(c->dtype), pa_dtype_name(c->cache_dtype));
  else
    snprintf(types, sizeof types, "%s", pa_dtype_name(c->dtype));
  if (c->api == PAB_API_PAGED)
    snprintf(buf + len, cap - len, " | h%d/%d d%d bs%d %s%s", c->num_heads, c->num_kv_heads,
             c->head_size, c->block_size, types, extra);
  else
    snprintf(buf + len, cap - len, " | h%d/%d d%d dense %s %s%s", c->num_heads, c->num_kv_heads,
             c->head_size, types, c->attn_type == PA_ATTN_DECODER ? "causal" : "bidir", extra);
}

/* ---- inputs -------------------------------------------------------------------------------- */

struct pab_data {
  const pab_case *c;
  pa_layer *layer;
  int64_t rows, row_elems; /* query/output rows and their width */
  void *query, *out;
  float *lse; /* [rows][num_heads] when the case asks for it */
  /* paged */
  pa_kv_cache cache;
  int rot;
  int32_t *qsl, *seq_lens, *block_tables;
  int stride;
  pa_batch *batches; /* [rot]: same lengths, disjoint blocks */
  /* varlen */
  void *key, *value;
  int32_t *cu_q, *cu_k;
  int next; /* rotation of the next call */
};

int pab_data_rotations(const pab_data *d) { return d->rot; }

static void make_layer(pab_data *d) {
  const pab_case *c = d->c;
  float *slopes = NULL;
  if (c->alibi) {
    /* The geometric slopes of the ALiBi paper; only their cost matters here. */
    slopes = pab_xmalloc((size_t)c->num_heads * sizeof *slopes);
    for (int h = 0; h < c->num_heads; h++)
      slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)c->num_heads);
  }
  float *sinks = NULL;
  if (c->sinks) {
    sinks = pab_xmalloc((size_t)c->num_heads * sizeof *sinks);
    for (int h = 0; h < c->num_heads; h++) sinks[h] = (float)(h % 4) - 1.0f;
  }
  pa_layer_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.num_heads = c->num_heads;
  cfg.num_kv_heads = c->num_kv_heads;
  cfg.head_size = c->head_size;
  cfg.alibi_slopes = slopes;
  cfg.sliding_window = c->window;
  cfg.logits_soft_cap = c->softcap;
  cfg.sinks = sinks;
  cfg.attn_type = c->attn_type;
  cfg.dtype = c->dtype;
  PAB_CHECK(pa_layer_create(&cfg, &d->layer));
  free(slopes);
  free(sinks);
}

static void *random_buffer(pab_rng *rng, size_t elems, pa_dtype dtype) {
  void *p = pab_xmalloc(elems * pa_dtype_size(dtype));
  pab_fill_random(rng, p, elems, dtype);
  return p;
}

static void build_paged(pab_data *d, pa_context *writer, size_t cold_bytes, int min_rotations,
                        pab_rng *rng) {
  const pab_case *c = d->c;
  int bs = c->block_size;
  int64_t set_blocks = 0;
  d->stride = 1;
  for (int s = 0; s < c->num_seqs; s++) {
    int nb = (int)((c->k_lens[s] + bs - 1) / bs);
    set_blocks += nb;
    if (nb > d->stride) d->stride = nb;
  }
  if (set_blocks == 0) set_blocks = 1;
  size_t row_bytes = (size_t)c->num_kv_heads * c->head_size * pa_dtype_size(c->cache_dtype);
  size_t set_bytes = (size_t)set_blocks * (size_t)bs * row_bytes * 2;

  /* A cold row must not find its K/V in cache from the previous call: rotate over enough
   * disjoint copies that one round trip touches cold_bytes (many L3s: the L3 keeps part of
   * a set re-read in a cycle, even of one several times its size). */
  d->rot = 1;
  if (c->cold) {
    d->rot = (int)((cold_bytes + set_bytes - 1) / set_bytes);
    if (d->rot < min_rotations) d->rot = min_rotations;
    if (d->rot < 1) d->rot = 1;
    if (d->rot > 1024) d->rot = 1024;
  }
  int64_t num_blocks = set_blocks * d->rot;

  pa_kv_cache *kc = &d->cache;
  kc->num_blocks = num_blocks;
  kc->block_size = bs;
  kc->num_kv_heads = c->num_kv_heads;
  kc->head_size = c->head_size;
  kc->dtype = c->cache_dtype;
  kc->k_scale = 1.0f;
  kc->v_scale = 1.0f;
  kc->layout = c->layout == PA_KV_TILED ? PA_KV_TILED : PA_KV_ROWS;
  int64_t shape[3];
  pa_kv_cache_shape(num_blocks, bs, c->num_kv_heads, c->head_size, shape);
  size_t half = (size_t)shape[1] * (size_t)shape[2] * pa_dtype_size(c->cache_dtype);
  kc->key = pab_big_alloc(half);
  kc->value = pab_big_alloc(half);
  if (!kc->key || !kc->value) pab_die("%s: cannot allocate a %zu-byte KV cache", c->name, 2 * half);

  /* Block ids in allocation order, or shuffled (see pab_case.fragmented). */
  int32_t *perm = pab_xmalloc((size_t)num_blocks * sizeof *perm);
  for (int64_t i = 0; i < num_blocks; i++) perm[i] = (int32_t)i;
  for (int64_t i = num_blocks - 1; i > 0 && c->fragmented; i--) {
    int64_t j = (int64_t)(pab_rng_next(rng) % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  size_t table_len = (size_t)c->num_seqs * (size_t)d->stride;
  d->block_tables = pab_xcalloc((size_t)d->rot * table_len, sizeof *d->block_tables);
  int64_t next_block = 0;
  for (int r = 0; r < d->rot; r++)
    for (int s = 0; s < c->num_seqs; s++) {
      int nb = (int)((c->k_lens[s] + bs - 1) / bs);
      int32_t *row = d->block_tables + (size_t)r * table_len + (size_t)s * (size_t)d->stride;
      for (int b = 0; b < nb; b++) row[b] = perm[next_block++];
    }
  free(perm);

  d->qsl = pab_xmalloc((size_t)(c->num_seqs + 1) * sizeof *d->qsl);
  d->seq_lens = pab_xmalloc((size_t)(c->num_seqs ? c->num_seqs : 1) * sizeof *d->seq_lens);
  d->qsl[0] = 0;
  for (int s = 0; s < c->num_seqs; s++) {
    d->qsl[s + 1] = d->qsl[s] + c->q_lens[s];
    d->seq_lens[s] = c->k_lens[s];
  }
  d->batches = pab_xcalloc((size_t)d->rot, sizeof *d->batches);
  for (int r = 0; r < d->rot; r++) {
    d->batches[r].num_seqs = c->num_seqs;
    d->batches[r].query_start_loc = d->qsl;
    d->batches[r].seq_lens = d->seq_lens;
    d->batches[r].block_tables = d->block_tables + (size_t)r * table_len;
    d->batches[r].block_table_stride = d->stride;
  }

  /* Fill every used slot through the library, from one reused random pool: the values only
   * need to look like activations, and regenerating them per token would dominate setup. */
  int64_t kv_row = (int64_t)c->num_kv_heads * c->head_size;
  int64_t chunk = ((int64_t)1 << 22) / kv_row;
  if (chunk < 1) chunk = 1;
  void *pool = random_buffer(rng, (size_t)(chunk * kv_row), c->dtype);
  int64_t *slots = pab_xmalloc((size_t)chunk * sizeof *slots);
  for (int r = 0; r < d->rot; r++)
    for (int s = 0; s < c->num_seqs; s++) {
      const int32_t *row = d->batches[r].block_tables + (size_t)s * (size_t)d->stride;
      for (int64_t t0 = 0; t0 < c->k_lens[s]; t0 += chunk) {
        int64_t n = c->k_lens[s] - t0 < chunk ? c->k_lens[s] - t0 : chunk;
        for (int64_t t = 0; t < n; t++) {
          int64_t pos = t0 + t;
          slots[t] = (int64_t)row[pos / bs] * bs + pos % bs;
        }
        PAB_CHECK(pa_write_kv(writer, kc, pool, kv_row, pool, kv_row, c->dtype, n, slots));
      }
    }
  free(slots);
  free(pool);
}

static void build_varlen(pab_data *d, pab_rng *rng) {
  const pab_case *c = d->c;
  d->cu_q = pab_xmalloc((size_t)(c->num_seqs + 1) * sizeof *d->cu_q);
  d->cu_k = pab_xmalloc((size_t)(c->num_seqs + 1) * sizeof *d->cu_k);
  d->cu_q[0] = d->cu_k[0] = 0;
  for (int s = 0; s < c->num_seqs; s++) {
    d->cu_q[s + 1] = d->cu_q[s] + c->q_lens[s];
    d->cu_k[s + 1] = d->cu_k[s] + c->k_lens[s];
  }
  size_t kv_elems = (size_t)d->cu_k[c->num_seqs] * (size_t)c->num_kv_heads * c->head_size;
  d->key = random_buffer(rng, kv_elems, c->dtype);
  d->value = random_buffer(rng, kv_elems, c->dtype);
  d->rot = 1;
}

pab_data *pab_data_build(const pab_case *c, pa_context *writer, size_t cold_bytes,
                         int min_rotations, uint64_t seed) {
  pab_data *d = pab_xcalloc(1, sizeof *d);
  pab_rng rng = {seed};
  d->c = c;
  make_layer(d);
  d->row_elems = (int64_t)c->num_heads * c->head_size;
  for (int s = 0; s < c->num_seqs; s++) d->rows += c->q_lens[s];
  size_t q_elems = (size_t)(d->rows ? d->rows : 1) * (size_t)d->row_elems;
  d->query = random_buffer(&rng, q_elems, c->dtype);
  d->out = pab_xcalloc(q_elems, pa_dtype_size(c->dtype));
  if (c->lse)
    d->lse = pab_xcalloc((size_t)(d->rows ? d->rows : 1) * (size_t)c->num_heads, sizeof(float));
  if (c->api == PAB_API_PAGED)
    build_paged(d, writer, cold_bytes, min_rotations, &rng);
  else
    build_varlen(d, &rng);
  return d;
}

void pab_data_free(pab_data *d) {
  if (!d) return;
  pa_layer_destroy(d->layer);
  free(d->query);
  free(d->out);
  free(d->lse);
  pab_big_free(d->cache.key);
  pab_big_free(d->cache.value);
  free(d->qsl);
  free(d->seq_lens);
  free(d->block_tables);
  free(d->batches);
  free(d->key);
  free(d->value);
  free(d->cu_q);
  free(d->cu_k);
  free(d);
}

/* ---- timing -------------------------------------------------------------------------------- */

static double one_call(pab_data *d, pa_context *ctx, const pa_plan *plan) {
  const pab_case *c = d->c;
  double t0 = pab_now();
  if (c->api == PAB_API_PAGED) {
    const pa_batch *b = &d->batches[d->next];
    d->next = (d->next + 1) % d->rot;
    PAB_CHECK(pa_paged_attention(ctx, d->layer, plan, d->query, d->row_elems, &d->cache, b, d->out,
                                 d->row_elems, d->lse));
  } else {
    int64_t kv_row = (int64_t)c->num_kv_heads * c->head_size;
    PAB_CHECK(pa_varlen_attention(ctx, d->layer, d->query, d->row_elems, d->key, kv_row, d->value,
                                  kv_row, c->num_seqs, d->cu_q, d->cu_k, d->out, d->row_elems,
                                  d->lse));
  }
  return pab_now() - t0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void pab_data_time(pab_data *d, pa_context *ctx, const pab_timing *t, pab_result *r) {
  /* The plan is made outside the timed calls: an engine makes it once per step and reuses it
   * for every layer. One plan serves all rotations, which differ only in block ids. */
  pa_plan *plan = NULL;
  if (d->c->api == PAB_API_PAGED) PAB_CHECK(pa_plan_create(ctx, d->layer, &d->batches[0], &plan));
  d->next = 0;
  double first = t->warmup ? one_call(d, ctx, plan) : 0.0;
  int n = t->repeats;
  double *samples = NULL;
  int have = 0;
  if (n <= 0) {
    /* Adaptive: the warm-up call estimates the cost; without one, the first timed call does. */
    if (!t->warmup) {
      samples = pab_xmalloc(sizeof *samples);
      first = samples[have++] = one_call(d, ctx, plan);
    }
    double est = first > 1e-7 ? first : 1e-7;
    /* A warm-up that alone fills the budget is kept as the sample: its one-time costs (first
     * touch of the output) are noise next to a call that long, and a second call would double
     * the slowest rows' share of the run. */
    if (t->warmup && first >= t->budget_s) {
      samples = pab_xmalloc(sizeof *samples);
      samples[have++] = first;
    }
    n = (int)ceil(t->budget_s / est);
    if (n < t->min_reps && est * t->min_reps <= 2.5 * t->budget_s) n = t->min_reps;
    if (n < 1) n = 1;
    if (n > t->max_reps) n = t->max_reps;
  }
  if (n < have) n = have;
  samples = realloc(samples, (size_t)n * sizeof *samples);
  if (!samples) pab_die("out of memory");
  while (have < n) samples[have++] = one_call(d, ctx, plan);
  if (plan) pa_plan_destroy(plan);
  qsort(samples, (size_t)n, sizeof *samples, cmp_double);
  r->reps = n;
  r->min_s = samples[0];
  r->median_s = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  free(samples);
}
