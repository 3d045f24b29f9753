#define _POSIX_C_SOURCE 200809L

#include "suite.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct list {
  pab_case **v;
  int n, cap;
} list;

static pab_case *push(list *l, pab_case *c) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 32;
    l->v = realloc(l->v, (size_t)l->cap * sizeof *l->v);
    if (!l->v) pab_die("out of memory");
  }
  return l->v[l->n++] = c;
}

static pab_case *decode_case(const char *suffix, int batch, int ctx) {
  char name[PAB_NAME_MAX];
  snprintf(name, sizeof name, "decode_%dx%d%s", batch, ctx, suffix);
  pab_case *c = pab_case_new(name, PAB_API_PAGED, batch);
  for (int s = 0; s < batch; s++) {
    c->q_lens[s] = 1;
    c->k_lens[s] = ctx;
  }
  c->bound = PAB_BOUND_MEMORY;
  c->cold = 1;
  return c;
}

static pab_case *prefill_case(int len, pa_dtype dtype) {
  char name[PAB_NAME_MAX];
  snprintf(name, sizeof name, "prefill_%d_%s", len, pa_dtype_name(dtype));
  pab_case *c = pab_case_new(name, PAB_API_PAGED, 1);
  c->q_lens[0] = c->k_lens[0] = len;
  c->dtype = c->cache_dtype = dtype;
  return c;
}

static double case_pairs(const pab_case *c) {
  pab_metrics m;
  pab_case_metrics(c, &m);
  return m.pairs;
}

/* Uniform causal prompts whose pair count is closest to `pairs`: the ragged batch's twin. */
static int uniform_len(int num, double pairs) {
  int best = 1;
  double best_err = INFINITY;
  for (int len = 1; len < 1 << 20; len++) {
    double p = (double)num * len * (len + 1) / 2.0, err = fabs(p - pairs);
    if (err < best_err) {
      best_err = err;
      best = len;
    }
    if (p > pairs) break;
  }
  return best;
}

int pab_suite_default(int quick, pab_case ***out) {
  list l = {0};
  pab_case *c;
  /* Quick shapes are ~8x smaller in every length so the whole suite runs in seconds. */
  int d = quick ? 8 : 1;

  /* Decode. The two small ones are meant to be cache-resident (labelled L2/L3); the rest rotate
   * over more than L3 so every call streams K/V from DRAM, as between layers of a real model.
   * Block tables are in allocation order; the "_frag" rows shuffle them (see pab_case). The
   * scalar kernel is timed beside the rows of the decode targets. */
  c = push(&l, decode_case("", 1, 128 / d));
  c->cold = 0;
  c->scalar = 1;
  c = push(&l, decode_case("", 1, 4096 / d));
  c->cold = 0;
  c = push(&l, decode_case("", quick ? 4 : 16, 1024 / d));
  const pa_dtype cache_types[] = {PA_BF16, PA_F16, PA_FP8_E4M3, PA_FP8_E5M2};
  for (int i = 0; i < 4; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "_%s", pa_dtype_name(cache_types[i]));
    c = push(&l, decode_case(suffix, quick ? 4 : 16, 4096 / d));
    c->cache_dtype = cache_types[i];
    c->scalar = cache_types[i] == PA_BF16 || cache_types[i] == PA_FP8_E4M3;
  }
  /* An f16 model over FP8 caches (Q and P split in two bf16 parts; see
   * attn-fp8-avx512bf16.c): to compare with the f16 cache row above. */
  for (int i = 0; i < 2; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "_f16act_%s", i ? "e5m2" : "e4m3");
    c = push(&l, decode_case(suffix, quick ? 4 : 16, 4096 / d));
    c->dtype = PA_F16;
    c->cache_dtype = cache_types[2 + i];
  }
  /* Speculative decoding: 4 and 16 new tokens per sequence. With 4 query
   * heads per KV head these are 16 and 64 rows per KV head, compute-bound
   * here: judged against the slower of the memory and the dot-product peak. */
  const int draft_lens[] = {4, 16};
  for (int i = 0; i < 2; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "_q%d", draft_lens[i]);
    c = push(&l, decode_case(suffix, quick ? 4 : 16, 4096 / d));
    for (int s = 0; s < c->num_seqs; s++) c->q_lens[s] = draft_lens[i];
    c->bound = PAB_BOUND_MAX;
  }
  c = push(&l, decode_case("_bf16_frag", quick ? 4 : 16, 4096 / d));
  c->fragmented = 1;
  /* The logit features together (ALiBi, Gemma-2's soft cap of 50, sinks) with
   * the lse output: to compare with the plain bf16 row. */
  c = push(&l, decode_case("_features", quick ? 4 : 16, 4096 / d));
  c->alibi = c->sinks = c->lse = 1;
  c->softcap = 50.0f;
  /* Mid-size variants: 8x4096 keeps even head size 64 (64 MiB of K/V) beyond L3. */
  const int block_sizes[] = {1, 16, 64};
  for (int i = 0; i < 3; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "_bs%d", block_sizes[i]);
    c = push(&l, decode_case(suffix, quick ? 2 : 8, 4096 / d));
    c->block_size = block_sizes[i];
    c->scalar = 1;
  }
  c = push(&l, decode_case("_bs1_frag", quick ? 2 : 8, 4096 / d));
  c->block_size = 1;
  c->fragmented = 1;
  const int head_sizes[] = {64, 96, 256};
  for (int i = 0; i < 3; i++) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "_hs%d", head_sizes[i]);
    c = push(&l, decode_case(suffix, quick ? 2 : 8, 4096 / d));
    c->head_size = head_sizes[i];
    c->scalar = 1;
  }

  /* Causal prefill of one prompt. */
  c = push(&l, prefill_case(512 / d, PA_BF16));
  c->scalar = 1;
  c = push(&l, prefill_case(2048 / d, PA_BF16));
  c->scalar = 1; /* a few seconds a call: timed once */
  c = push(&l, prefill_case(512 / d, PA_F32));
  c->scalar = 1;
  push(&l, prefill_case(2048 / d, PA_F32));

  /* Chunked prefill and a dense bidirectional twin with the same pair count: the gap is what
   * the paged gather and the causal mask cost. */
  {
    int q = 512 / d, cached = 3584 / d;
    char name[PAB_NAME_MAX];
    snprintf(name, sizeof name, "chunked_%d+%d", q, cached);
    c = push(&l, pab_case_new(name, PAB_API_PAGED, 1));
    c->q_lens[0] = q;
    c->k_lens[0] = q + cached;
    c->scalar = 1;
    int k = (int)ceil(case_pairs(c) / q);
    snprintf(name, sizeof name, "dense_%dx%d_bidir", q, k);
    c = push(&l, pab_case_new(name, PAB_API_VARLEN, 1));
    c->attn_type = PA_ATTN_ENCODER_ONLY;
    c->q_lens[0] = q;
    c->k_lens[0] = k;
  }

  /* A BERT-base-like encoder layer. */
  {
    int len = 512 / d;
    char name[PAB_NAME_MAX];
    snprintf(name, sizeof name, "encoder_%d_h12x64", len);
    c = push(&l, pab_case_new(name, PAB_API_VARLEN, 1));
    c->attn_type = PA_ATTN_ENCODER_ONLY;
    c->num_heads = c->num_kv_heads = 12;
    c->head_size = 64;
    c->q_lens[0] = c->k_lens[0] = len;
    c->scalar = 1;
  }

  /* Ragged prefill batch vs a uniform one of the same FLOPs: how well the library balances one
   * long prompt against many short ones across threads. */
  {
    int big = 2048 / d, small = quick ? 16 : 64, nsmall = quick ? 7 : 31;
    char name[PAB_NAME_MAX];
    snprintf(name, sizeof name, "ragged_%d+%dx%d", big, nsmall, small);
    c = push(&l, pab_case_new(name, PAB_API_PAGED, 1 + nsmall));
    c->q_lens[0] = c->k_lens[0] = big;
    c->scalar = 1;
    for (int s = 1; s <= nsmall; s++) c->q_lens[s] = c->k_lens[s] = small;
    int len = uniform_len(1 + nsmall, case_pairs(c));
    snprintf(name, sizeof name, "uniform_%dx%d", 1 + nsmall, len);
    c = push(&l, pab_case_new(name, PAB_API_PAGED, 1 + nsmall));
    for (int s = 0; s <= nsmall; s++) c->q_lens[s] = c->k_lens[s] = len;
  }

  /* One continuous-batching step: decodes first (as vLLM orders them), then a prefill chunk. */
  {
    int chunk = 256 / d, cached = 1024 / d, ndec = quick ? 3 : 15, dctx = 2048 / d;
    char name[PAB_NAME_MAX];
    snprintf(name, sizeof name, "mixed_%d+%d_%dx%d", chunk, cached, ndec, dctx);
    c = push(&l, pab_case_new(name, PAB_API_PAGED, ndec + 1));
    for (int s = 0; s < ndec; s++) {
      c->q_lens[s] = 1;
      c->k_lens[s] = dctx;
    }
    c->q_lens[ndec] = chunk;
    c->k_lens[ndec] = chunk + cached;
    c->bound = PAB_BOUND_MAX;
    c->cold = 1;
    c->scalar = 1;
  }

  *out = l.v;
  return l.n;
}

void pab_custom_init(pab_custom *o) {
  memset(o, 0, sizeof *o);
  o->batch = o->context = o->q_len = o->decode_context = -1;
  o->heads = o->kv_heads = o->head_size = o->block_size = -1;
  o->dtype = o->cache_dtype = PA_BF16;
}

static int or_default(int v, int def) { return v >= 0 ? v : def; }

pab_case *pab_suite_custom(const pab_custom *o) {
  int encoder = o->mode == PAB_MODE_ENCODER;
  int many = o->mode == PAB_MODE_DECODE || o->mode == PAB_MODE_MIXED;
  int batch = or_default(o->batch, many ? 16 : 1);
  if (batch < 1) pab_die("--batch must be >= 1");
  pab_case *c = pab_case_new("custom", encoder ? PAB_API_VARLEN : PAB_API_PAGED, batch);
  c->num_heads = or_default(o->heads, encoder ? 12 : 32);
  /* Llama's 8 KV heads when they divide the query heads; otherwise plain multi-head. */
  int kv_default = !encoder && c->num_heads % 8 == 0 ? 8 : c->num_heads;
  c->num_kv_heads = or_default(o->kv_heads, kv_default);
  c->head_size = or_default(o->head_size, encoder ? 64 : 128);
  c->block_size = or_default(o->block_size, 16);
  c->dtype = o->dtype_set ? o->dtype : PA_BF16;
  c->cache_dtype = o->cache_dtype_set ? o->cache_dtype : c->dtype;
  c->window = o->window;
  c->alibi = o->alibi;
  c->sinks = o->sinks;
  c->lse = o->lse;
  c->softcap = o->softcap;
  const char *mode = "";
  switch (o->mode) {
    case PAB_MODE_DECODE: {
      int ctx = or_default(o->context, 4096), q = or_default(o->q_len, 1);
      for (int s = 0; s < batch; s++) {
        c->q_lens[s] = q;
        c->k_lens[s] = ctx;
      }
      c->bound = q > 1 ? PAB_BOUND_MAX : PAB_BOUND_MEMORY; /* see the _q4 rows */
      c->cold = !o->hot;
      mode = "decode";
      break;
    }
    case PAB_MODE_PREFILL: {
      int len = or_default(o->q_len, or_default(o->context, 512));
      for (int s = 0; s < batch; s++) c->q_lens[s] = c->k_lens[s] = len;
      mode = "prefill";
      break;
    }
    case PAB_MODE_CHUNKED: {
      int q = or_default(o->q_len, 512), cached = or_default(o->context, 3584);
      for (int s = 0; s < batch; s++) {
        c->q_lens[s] = q;
        c->k_lens[s] = q + cached;
      }
      mode = "chunked";
      break;
    }
    case PAB_MODE_ENCODER: {
      int len = or_default(o->q_len, or_default(o->context, 512));
      for (int s = 0; s < batch; s++) c->q_lens[s] = c->k_lens[s] = len;
      c->attn_type = PA_ATTN_ENCODER_ONLY;
      mode = "encoder";
      break;
    }
    case PAB_MODE_MIXED: {
      int chunk = or_default(o->q_len, 256), cached = or_default(o->context, 1024);
      int dctx = or_default(o->decode_context, 2048);
      for (int s = 0; s < batch - 1; s++) {
        c->q_lens[s] = 1;
        c->k_lens[s] = dctx;
      }
      c->q_lens[batch - 1] = chunk;
      c->k_lens[batch - 1] = chunk + cached;
      c->bound = PAB_BOUND_MAX;
      c->cold = !o->hot;
      mode = "mixed";
      break;
    }
    default: pab_die("internal: custom case without a mode");
  }
  c->scalar = 1;
  snprintf(c->name, sizeof c->name, "custom_%s", mode);
  for (int s = 0; s < batch; s++)
    if (c->q_lens[s] < 0 || c->k_lens[s] < c->q_lens[s] || c->k_lens[s] < 1)
      pab_die("custom %s: lengths q=%d k=%d make no sense", mode, (int)c->q_lens[s],
              (int)c->k_lens[s]);
  return c;
}
