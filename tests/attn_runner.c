/* See attn_runner.h. */
#include "attn_runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int ar_ctx_threads[AR_NUM_CTX] = {1, 2, 3};
pa_context *ar_ctx[AR_NUM_CTX];

int ar_kv_heads(const attn_case *c) { return c->num_kv_heads ? c->num_kv_heads : c->num_heads; }

void ar_describe(const attn_case *c, char *buf, size_t size) {
  int n = snprintf(buf, size,
                   "[%s] %s act=%s cache=%s src=%s heads=%d kv_heads=%d head_size=%d "
                   "block_size=%d scale=%g alibi=%d sinks=%d window=%d soft_cap=%g type=%s "
                   "ctx_threads=%d plan=%d lse=%d shuffle=%d pad=%d poison=%d layout=%s%s "
                   "fused=%d k_scale=%g v_scale=%g mags=%g/%g/%g seqs(q_len/k_len)=",
                   c->group, c->varlen ? "varlen" : "paged", pa_dtype_name(c->act),
                   pa_dtype_name(c->cache_dtype), pa_dtype_name(c->src_dtype), c->num_heads,
                   c->num_kv_heads, c->head_size, c->block_size, (double)c->scale, c->alibi,
                   c->sinks, c->window, (double)c->soft_cap, hx_attn_name(c->type),
                   ar_ctx_threads[c->ctx], c->plan, c->lse, c->shuffle, c->pad, c->poison,
                   hx_layout_name(c->layout), c->kv_layout == PA_KV_TILED ? "+tiled" : "", c->fused,
                   (double)c->k_scale, (double)c->v_scale, c->q_mag, c->k_mag, c->v_mag);
  for (int s = 0; s < c->num_seqs && n > 0 && (size_t)n < size; s++)
    n += snprintf(buf + n, size - (size_t)n, "%s%d/%d", s ? "," : "", c->q_len[s], c->seq_len[s]);
}

/* ---- layer ----------------------------------------------------------------- */

static pa_layer_config config_of(const attn_case *c, const float *slopes, const float *sinks) {
  pa_layer_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.num_heads = c->num_heads;
  cfg.num_kv_heads = c->num_kv_heads;
  cfg.head_size = c->head_size;
  cfg.scale = c->scale;
  cfg.alibi_slopes = c->alibi ? slopes : NULL;
  cfg.sliding_window = c->window;
  cfg.logits_soft_cap = c->soft_cap;
  cfg.sinks = c->sinks ? sinks : NULL;
  cfg.attn_type = c->type;
  cfg.dtype = c->act;
  return cfg;
}

static int make_layer(tu_rng *rng, const attn_case *c, const char *tag, layer_bundle *lb) {
  int nh = c->num_heads;
  lb->slopes = tu_malloc((size_t)nh * sizeof(float));
  lb->sinks = tu_malloc((size_t)nh * sizeof(float));
  int geometric = tu_chance(rng, 0.5);
  for (int h = 0; h < nh; h++) {
    /* vLLM's geometric slopes, or arbitrary ones (0 included). */
    lb->slopes[h] =
        geometric ? exp2f(-8.0f * (float)(h + 1) / (float)nh) : (float)tu_range(rng, 0.0, 0.6);
    lb->sinks[h] = (float)tu_range(rng, -3.0, 6.0) + c->sink_offset;
  }
  pa_layer_config cfg = config_of(c, lb->slopes, lb->sinks);
  lb->layer = NULL;
  pa_status st = pa_layer_create(&cfg, &lb->layer);
  TU_CHECK(st == PA_OK && lb->layer, "%s: pa_layer_create: %s (%s)", tag, pa_status_string(st),
           pa_last_error());
  if (st != PA_OK) {
    free(lb->slopes);
    free(lb->sinks);
    return 0;
  }
  lb->ref.num_heads = nh;
  lb->ref.num_kv_heads = ar_kv_heads(c);
  lb->ref.head_size = c->head_size;
  lb->ref.scale = c->scale != 0 ? (double)c->scale : 1.0 / sqrt((double)c->head_size);
  lb->ref.alibi_slopes = c->alibi ? lb->slopes : NULL;
  lb->ref.sliding_window = c->window;
  lb->ref.soft_cap = c->soft_cap;
  lb->ref.sinks = c->sinks ? lb->sinks : NULL;
  lb->ref.attn_type = hx_ref_attn(c->type);
  return 1;
}

static void free_layer(layer_bundle *lb) {
  if (lb->layer) pa_layer_destroy(lb->layer);
  free(lb->slopes);
  free(lb->sinks);
}

/* A plan made with a layer of the same head geometry but other features:
 * the header says such a plan serves every layer of that geometry. */
static pa_plan *make_plan(const attn_case *c, const char *tag, const pa_layer *layer,
                          const pa_batch *batch) {
  if (!c->plan) return NULL;
  pa_layer *owner = (pa_layer *)layer, *sibling = NULL;
  float slopes[1] = {0}, sinks[1] = {0};
  if (c->plan == 2) {
    attn_case s = *c;
    s.num_kv_heads = ar_kv_heads(c);
    s.act = (pa_dtype)((c->act + 1) % 3);
    s.scale = 0.25f;
    s.alibi = s.sinks = 0;
    s.window = c->window ? 0 : 7;
    s.soft_cap = c->soft_cap > 0 ? 0.0f : 5.0f;
    pa_layer_config cfg = config_of(&s, slopes, sinks);
    pa_status st = pa_layer_create(&cfg, &sibling);
    TU_CHECK(st == PA_OK, "%s: sibling pa_layer_create: %s", tag, pa_last_error());
    if (st != PA_OK) return NULL;
    owner = sibling;
  }
  pa_plan *plan = NULL;
  pa_status st = pa_plan_create(ar_ctx[c->ctx], owner, batch, &plan);
  TU_CHECK(st == PA_OK && plan, "%s: pa_plan_create: %s (%s)", tag, pa_status_string(st),
           pa_last_error());
  if (sibling) pa_layer_destroy(sibling);
  return st == PA_OK ? plan : NULL;
}

/* ---- output buffers --------------------------------------------------------- */

static void make_outputs(const attn_case *c, tu_rng *rng, int64_t rows, outputs *o) {
  memset(o, 0, sizeof *o);
  int width = c->num_heads * c->head_size;
  size_t es = pa_dtype_size(c->act);
  o->stride = width + (c->pad ? tu_int(rng, 1, c->pad) : 0);
  size_t out_bytes = (size_t)((rows + AR_EXTRA_OUT_ROWS) * o->stride) * es;
  o->out = tu_malloc(out_bytes);
  tu_fill_canary(o->out, out_bytes);
  o->lse = NULL;
  if (c->lse) {
    size_t lse_bytes = ((size_t)rows * (size_t)c->num_heads + AR_EXTRA_LSE) * sizeof(float);
    o->lse = tu_malloc(lse_bytes);
    tu_fill_canary(o->lse, lse_bytes);
  }
  o->ref_out = tu_calloc((size_t)rows * (size_t)width, sizeof(double));
  o->ref_lse = tu_calloc((size_t)rows * (size_t)c->num_heads, sizeof(double));
  o->vmax = tu_calloc((size_t)rows, sizeof(double));
}

static void free_outputs(outputs *o) {
  free(o->out);
  free(o->lse);
  free(o->ref_out);
  free(o->ref_lse);
  free(o->vmax);
}

/* ---- inputs ---------------------------------------------------------------- */

/* Attention reads its inputs: a copy of them taken before the call must
 * still match afterwards. */
typedef struct span {
  const char *name;
  const void *p;
  size_t bytes;
} span;

static unsigned char *copy_spans(const span in[3]) {
  unsigned char *copy = tu_malloc(in[0].bytes + in[1].bytes + in[2].bytes), *at = copy;
  for (int i = 0; i < 3; i++) {
    memcpy(at, in[i].p, in[i].bytes);
    at += in[i].bytes;
  }
  return copy;
}

static void check_spans(const char *tag, const span in[3], const unsigned char *copy) {
  for (int i = 0; i < 3; i++) {
    TU_CHECK(memcmp(copy, in[i].p, in[i].bytes) == 0, "%s: the call changed %s", tag, in[i].name);
    copy += in[i].bytes;
  }
}

/* ---- pa_paged_attention -------------------------------------------------- */

/* Block tables: each sequence gets ceil(seq_len / block_size) distinct
 * physical blocks (shuffled or in order), a few spare blocks stay free, and
 * table entries past a sequence's blocks hold garbage the library must not
 * read (the header: only the first ceil(seq_len / block_size) must name
 * blocks). */
static void make_tables(tu_rng *rng, const attn_case *c, paged_setup *p) {
  int bs = c->block_size, max_blocks = 0;
  int64_t total = 0;
  for (int s = 0; s < c->num_seqs; s++) {
    int nb = (c->seq_len[s] + bs - 1) / bs;
    total += nb;
    if (nb > max_blocks) max_blocks = nb;
  }
  p->bt_stride = max_blocks + tu_int(rng, 0, 2);
  p->cache.num_blocks = total + tu_int(rng, 1, 3);
  int64_t nblk = p->cache.num_blocks;
  int32_t *perm = tu_malloc((size_t)nblk * sizeof(int32_t));
  for (int64_t i = 0; i < nblk; i++) perm[i] = (int32_t)i;
  if (c->shuffle)
    for (int64_t i = nblk - 1; i > 0; i--) {
      int64_t j = (int64_t)(tu_next(rng) % (uint64_t)(i + 1));
      int32_t t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
  p->block_tables = tu_malloc((size_t)(c->num_seqs * p->bt_stride + 1) * sizeof(int32_t));
  static const int32_t garbage[] = {-1, INT32_MAX, INT32_MIN, 1 << 30};
  int64_t next = 0;
  for (int s = 0; s < c->num_seqs; s++) {
    int nb = (c->seq_len[s] + bs - 1) / bs;
    for (int b = 0; b < p->bt_stride; b++)
      p->block_tables[s * p->bt_stride + b] = b < nb ? perm[next++] : garbage[tu_int(rng, 0, 3)];
  }
  free(perm);
}

static int64_t slot_of(const attn_case *c, const paged_setup *p, int s, int t) {
  return (int64_t)p->block_tables[s * p->bt_stride + t / c->block_size] * c->block_size +
         t % c->block_size;
}

/* Writes tokens [from(s), to(s)) of every sequence with one pa_write_kv,
 * mixing in padding slots and stale rows for slots that a later row of the
 * same call overwrites, and checks the cache's bytes afterwards. */
static void write_phase(tu_rng *rng, const attn_case *c, const char *tag, paged_setup *p,
                        const int *from, const int *to) {
  const pa_kv_cache *cache = &p->cache;
  int kw = ar_kv_heads(c) * c->head_size;
  int64_t cap = 1; /* a token takes up to three rows: padding, stale, real */
  for (int s = 0; s < c->num_seqs; s++) cap += 3 * (to[s] - from[s]);
  int64_t *slots = tu_malloc((size_t)cap * sizeof(int64_t));
  int64_t n = 0;
  for (int s = 0; s < c->num_seqs; s++)
    for (int t = from[s]; t < to[s]; t++) {
      if (tu_chance(rng, 0.08)) slots[n++] = -1 - tu_int(rng, 0, 5); /* padding */
      if (tu_chance(rng, 0.04)) slots[n++] = slot_of(c, p, s, t);    /* stale, overwritten */
      slots[n++] = slot_of(c, p, s, t);
    }
  if (n == 0 || tu_chance(rng, 0.2)) slots[n++] = -1;
  int64_t ks = kw + (c->pad ? tu_int(rng, 0, c->pad) : 0);
  int64_t vs = kw + (c->pad ? tu_int(rng, 0, c->pad) : 0);
  void *krows = hx_alloc_rows(n, ks, c->src_dtype), *vrows = hx_alloc_rows(n, vs, c->src_dtype);
  hx_fill_rows(rng, krows, ks, n, kw, c->src_dtype, c->k_mag);
  hx_fill_rows(rng, vrows, vs, n, kw, c->src_dtype, c->v_mag);

  size_t bytes = hx_cache_bytes(cache);
  unsigned char *img[4];
  for (int i = 0; i < 4; i++) {
    img[i] = tu_malloc(bytes);
    hx_gather_tiles(cache, i % 2, img[i]);
  }
  hx_expect_write(cache, img[0], img[1], img[2], img[3], krows, ks, vrows, vs, c->src_dtype, n,
                  slots);
  pa_status st = pa_write_kv(ar_ctx[c->ctx], cache, krows, ks, vrows, vs, c->src_dtype, n, slots);
  TU_CHECK(st == PA_OK, "%s: pa_write_kv: %s (%s)", tag, pa_status_string(st), pa_last_error());
  hx_compare_cache(tag, cache, img[0], img[1], img[2], img[3]);
  hx_check_padding(tag, cache, &p->mem);
  for (int i = 0; i < 4; i++) free(img[i]);
  free(krows);
  free(vrows);
  free(slots);
}

/* The cache's buffers whole, padding included: attention writes none of it. */
static void paged_inputs(const paged_run *r, span in[3]) {
  const hx_cache_mem *mem = &r->p.mem;
  in[0] = (span){"the cache's key buffer", mem->buf[0], mem->bytes[0]};
  in[1] = mem->buf[1] ? (span){"the cache's value buffer", mem->buf[1], mem->bytes[1]}
                      : (span){"no second buffer", mem->buf[0], 0};
  in[2] = (span){"the query", r->q, (size_t)(r->rows * r->qstride) * pa_dtype_size(r->c->act)};
}

int ar_paged_prepare(const attn_case *c, const char *tag, paged_run *r) {
  memset(r, 0, sizeof *r); /* also zeroes struct fields the header may add later */
  r->c = c;
  tu_rng rng;
  tu_rng_seed(&rng, c->seed);
  if (!make_layer(&rng, c, tag, &r->lb)) return 0;

  paged_setup *p = &r->p;
  make_tables(&rng, c, p);
  pa_kv_cache *cache = &p->cache;
  cache->block_size = c->block_size;
  cache->num_kv_heads = ar_kv_heads(c);
  cache->head_size = c->head_size;
  cache->dtype = c->cache_dtype;
  cache->k_scale = c->k_scale;
  cache->v_scale = c->v_scale;
  cache->layout = c->kv_layout;
  hx_cache_alloc(&rng, cache, c->layout, &p->mem);
  hx_fill_cache(&rng, cache, c->k_mag > c->v_mag ? c->k_mag : c->v_mag, c->poison);

  /* The cached prefix first, then the new tokens, as an engine does. */
  int zero[AR_MAX_SEQS] = {0}, mid[AR_MAX_SEQS];
  for (int s = 0; s < c->num_seqs; s++) {
    int prefix = c->seq_len[s] - c->q_len[s];
    mid[s] = prefix > 0 ? prefix : 0;
  }
  write_phase(&rng, c, tag, p, zero, mid);
  write_phase(&rng, c, tag, p, mid, c->seq_len);

  r->qsl[0] = 0;
  for (int s = 0; s < c->num_seqs; s++) {
    r->qsl[s + 1] = r->qsl[s] + c->q_len[s];
    r->seq_lens[s] = c->seq_len[s];
  }
  r->rows = r->qsl[c->num_seqs];
  r->batch = (pa_batch){c->num_seqs, r->qsl, r->seq_lens, p->block_tables, p->bt_stride};

  int width = c->num_heads * c->head_size;
  r->qstride = width + (c->pad ? tu_int(&rng, 1, c->pad) : 0);
  r->q = hx_alloc_rows(r->rows, r->qstride, c->act);
  hx_fill_rows(&rng, r->q, r->qstride, r->rows, width, c->act, c->q_mag);
  make_outputs(c, &rng, r->rows, &r->o);
  span in[3];
  paged_inputs(r, in);
  r->inputs_copy = copy_spans(in);
  r->plan = make_plan(c, tag, r->lb.layer, &r->batch);
  return !c->plan || r->plan;
}

pa_status ar_paged_call(paged_run *r, pa_context *ctx) {
  return pa_paged_attention(ctx, r->lb.layer, r->plan, r->q, r->qstride, &r->p.cache, &r->batch,
                            r->o.out, r->o.stride, r->o.lse);
}

void ar_paged_check(paged_run *r, const char *tag, pa_status st) {
  const attn_case *c = r->c;
  TU_CHECK(st == PA_OK, "%s: pa_paged_attention: %s (%s)", tag, pa_status_string(st),
           pa_last_error());
  span in[3];
  paged_inputs(r, in);
  check_spans(tag, in, r->inputs_copy);
  if (st != PA_OK) return;
  ref_cache rc = hx_ref_cache(&r->p.cache);
  ref_paged_attention(&r->lb.ref, hx_ref_dtype(c->act), r->q, r->qstride, &rc, c->num_seqs, r->qsl,
                      r->seq_lens, r->p.block_tables, r->p.bt_stride, r->o.ref_out, r->o.ref_lse,
                      r->o.vmax);
  hx_check_outputs(tag, c->act, c->num_heads, c->head_size, r->rows, r->o.out, r->o.stride,
                   AR_EXTRA_OUT_ROWS, r->o.lse, AR_EXTRA_LSE, r->o.ref_out, r->o.ref_lse,
                   r->o.vmax);
}

void ar_paged_free(paged_run *r) {
  if (r->plan) pa_plan_destroy(r->plan);
  free(r->inputs_copy);
  free_outputs(&r->o);
  free(r->q);
  hx_cache_free(&r->p.mem);
  free(r->p.block_tables);
  if (r->lb.layer) free_layer(&r->lb);
}

void ar_run_paged(const attn_case *c, const char *tag) {
  paged_run r;
  if (ar_paged_prepare(c, tag, &r)) ar_paged_check(&r, tag, ar_paged_call(&r, ar_ctx[c->ctx]));
  ar_paged_free(&r);
}

/* ---- pa_varlen_attention ------------------------------------------------- */

void ar_run_varlen(const attn_case *c, const char *tag) {
  tu_rng rng;
  tu_rng_seed(&rng, c->seed);
  layer_bundle lb;
  if (!make_layer(&rng, c, tag, &lb)) return;
  int nh = c->num_heads, d = c->head_size, width = nh * d, kw = ar_kv_heads(c) * d;

  int32_t cu_q[AR_MAX_SEQS + 1], cu_k[AR_MAX_SEQS + 1];
  cu_q[0] = cu_k[0] = 0;
  for (int s = 0; s < c->num_seqs; s++) {
    cu_q[s + 1] = cu_q[s] + c->q_len[s];
    cu_k[s + 1] = cu_k[s] + c->seq_len[s];
  }
  int64_t rows = cu_q[c->num_seqs], krows = cu_k[c->num_seqs];
  int64_t qs, ks, vs;
  void *qbuf, *kbuf, *vbuf;
  const void *q, *k, *v;
  size_t es = pa_dtype_size(c->act);
  if (c->fused && rows == krows) {
    /* One row of [q | k | v] per token, as a fused QKV projection gives. */
    qs = ks = vs = width + 2 * kw + (c->pad ? tu_int(&rng, 1, c->pad) : 0);
    qbuf = hx_alloc_rows(rows, qs, c->act);
    hx_fill_rows(&rng, qbuf, qs, rows, width + 2 * kw, c->act, c->q_mag);
    /* K and V get their own magnitudes. */
    for (int64_t r = 0; r < rows; r++)
      for (int i = 0; i < 2 * kw; i++)
        ref_store(qbuf, r * qs + width + i, hx_ref_dtype(c->act),
                  (float)tu_range(&rng, -1, 1) * (float)(i < kw ? c->k_mag : c->v_mag));
    kbuf = vbuf = NULL;
    q = qbuf;
    k = (const char *)qbuf + (size_t)width * es;
    v = (const char *)qbuf + (size_t)(width + kw) * es;
  } else {
    qs = width + (c->pad ? tu_int(&rng, 1, c->pad) : 0);
    ks = kw + (c->pad ? tu_int(&rng, 0, c->pad) : 0);
    vs = kw + (c->pad ? tu_int(&rng, 0, c->pad) : 0);
    qbuf = hx_alloc_rows(rows, qs, c->act);
    kbuf = hx_alloc_rows(krows, ks, c->act);
    vbuf = hx_alloc_rows(krows, vs, c->act);
    hx_fill_rows(&rng, qbuf, qs, rows, width, c->act, c->q_mag);
    hx_fill_rows(&rng, kbuf, ks, krows, kw, c->act, c->k_mag);
    hx_fill_rows(&rng, vbuf, vs, krows, kw, c->act, c->v_mag);
    q = qbuf;
    k = kbuf;
    v = vbuf;
  }
  outputs o;
  make_outputs(c, &rng, rows, &o);
  span in[3] = {{"the query", q, (size_t)(rows * qs) * es},
                {"the keys", k, (size_t)(krows * ks) * es},
                {"the values", v, (size_t)(krows * vs) * es}};
  if (!kbuf) in[1].bytes = in[2].bytes = 0; /* fused: the query's rows hold all three */
  unsigned char *inputs_copy = copy_spans(in);
  pa_status st = pa_varlen_attention(ar_ctx[c->ctx], lb.layer, q, qs, k, ks, v, vs, c->num_seqs,
                                     cu_q, cu_k, o.out, o.stride, o.lse);
  TU_CHECK(st == PA_OK, "%s: pa_varlen_attention: %s (%s)", tag, pa_status_string(st),
           pa_last_error());
  check_spans(tag, in, inputs_copy);
  free(inputs_copy);
  if (st == PA_OK) {
    ref_varlen_attention(&lb.ref, hx_ref_dtype(c->act), q, qs, k, ks, v, vs, c->num_seqs, cu_q,
                         cu_k, o.ref_out, o.ref_lse, o.vmax);
    hx_check_outputs(tag, c->act, nh, d, rows, o.out, o.stride, AR_EXTRA_OUT_ROWS, o.lse,
                     AR_EXTRA_LSE, o.ref_out, o.ref_lse, o.vmax);
  }
  free_outputs(&o);
  free(qbuf);
  free(kbuf);
  free(vbuf);
  free_layer(&lb);
}
