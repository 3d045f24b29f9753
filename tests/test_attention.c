/*
 * pa_paged_attention and pa_varlen_attention against the double-precision
 * reference: seeded random cases over shapes, dtypes and features, plus
 * targeted cases for the edges (see main). K/V go through pa_write_kv, whose
 * stored bytes are checked too, and the reference reads them back with its
 * own codecs. A share of the paged cases keep their cache in a strided
 * layout (vLLM's interleaved K/V, padding between tiles), with NaN in
 * every byte between the tiles: read, it would show in the output; written,
 * the checks of the cache's buffers catch it.
 *
 * Reproduce a failure with the printed PA_TEST_SEED and PA_TEST_ONLY; the
 * seed can also be given as the first argument (--seed=N).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_runner.h"

/* ---- case driver ------------------------------------------------------------ */

static uint64_t g_seed;
static long g_index, g_only = -1, g_failed_cases;

/* After a case: if it failed, how to see it again. */
static void report_case(const attn_case *c, const char *tag, long index, long failures_before) {
  if (tu_failures == failures_before) return;
  char desc[1024];
  ar_describe(c, desc, sizeof desc);
  fprintf(stderr, "  %s: %s\n  reproduce: PA_TEST_SEED=%llu PA_TEST_ONLY=%ld\n", tag, desc,
          (unsigned long long)g_seed, index);
  g_failed_cases++;
}

static void run_case(attn_case *c) {
  long index = g_index++;
  if (g_only >= 0 && index != g_only) return;
  c->seed = tu_mix(g_seed, (uint64_t)index);
  char tag[32];
  snprintf(tag, sizeof tag, "case %ld", index);
  long before = tu_failures;
  if (c->varlen)
    ar_run_varlen(c, tag);
  else
    ar_run_paged(c, tag);
  report_case(c, tag, index, before);
}

/* The default of every targeted case: a mixed batch (a full prefill, a
 * chunk over a cached prefix, decodes) in f32, which the groups below vary
 * one dimension at a time. */
static attn_case base_case(const char *group) {
  attn_case c;
  memset(&c, 0, sizeof c);
  c.group = group;
  c.act = c.cache_dtype = c.src_dtype = PA_F32;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_size = 64;
  c.block_size = 16;
  c.type = PA_ATTN_DECODER;
  c.num_seqs = 4;
  static const int q[] = {20, 7, 1, 1}, k[] = {20, 37, 45, 1};
  memcpy(c.q_len, q, sizeof q);
  memcpy(c.seq_len, k, sizeof k);
  static int next_ctx;
  c.ctx = next_ctx++ % AR_NUM_CTX; /* groups that care set their own */
  c.lse = 1;
  c.shuffle = 1;
  c.pad = 3;
  c.k_scale = c.v_scale = 1.0f;
  c.q_mag = 1.5;
  c.k_mag = 1.5;
  c.v_mag = 1.0;
  return c;
}

static void set_seqs(attn_case *c, int n, const int *q, const int *k) {
  c->num_seqs = n;
  for (int s = 0; s < n; s++) {
    c->q_len[s] = q[s];
    c->seq_len[s] = k[s];
  }
}

/* FP8 scales that map the largest |x| to somewhere between 0.5 and a bit
 * past the format's top (448 / 57344): the whole code range gets used,
 * subnormals and saturation included. */
static void pick_fp8_scales(tu_rng *g, attn_case *c) {
  double hi = c->cache_dtype == PA_FP8_E4M3 ? 500.0 : 60000.0;
  c->k_scale = (float)(c->k_mag / exp(tu_range(g, log(0.5), log(hi))));
  c->v_scale = (float)(c->v_mag / exp(tu_range(g, log(0.5), log(hi))));
}

/* ---- random cases ------------------------------------------------------------ */

/* Shrinks the lengths until q_len * k_len * heads * head_size fits the
 * budget that keeps the scalar run short; halving both (rounding up) keeps
 * q_len <= k_len. */
static void fit_budget(attn_case *c, double budget) {
  for (;;) {
    double work = 0;
    int big = 0;
    for (int s = 0; s < c->num_seqs; s++) {
      work += (double)(c->q_len[s] + 1) * (double)(c->seq_len[s] + 1);
      if (c->q_len[s] > 1 || c->seq_len[s] > 1) big = 1;
    }
    work *= (double)c->num_heads * (double)c->head_size;
    if (work <= budget || !big) return;
    for (int s = 0; s < c->num_seqs; s++) {
      c->q_len[s] = (c->q_len[s] + 1) / 2;
      c->seq_len[s] = (c->seq_len[s] + 1) / 2;
    }
  }
}

static void random_case(tu_rng *g, attn_case *c, int varlen) {
  static const int head_sizes[] = {1,  2,  3,  4,   7,   8,   16,  32, 64,
                                   64, 80, 96, 112, 128, 128, 130, 256};
  static const int block_sizes[] = {1, 2, 3, 4, 5, 8, 16, 16, 17, 32, 128};
  static const int groups[] = {1, 1, 2, 3, 4, 7, 8};
  memset(c, 0, sizeof *c);
  c->group = "random";
  c->varlen = varlen;
  c->act = (pa_dtype)tu_int(g, 0, 2);
  c->cache_dtype = varlen ? c->act : (pa_dtype)tu_int(g, 0, 4);
  c->src_dtype = tu_chance(g, 0.8) ? c->act : (pa_dtype)tu_int(g, 0, 2);
  int nkv = tu_int(g, 1, 4), group = groups[tu_int(g, 0, 6)];
  c->num_heads = nkv * group;
  c->num_kv_heads = group == 1 && tu_chance(g, 0.3) ? 0 : nkv;
  c->head_size = head_sizes[tu_int(g, 0, (int)(sizeof head_sizes / sizeof(int)) - 1)];
  c->block_size = block_sizes[tu_int(g, 0, (int)(sizeof block_sizes / sizeof(int)) - 1)];
  c->scale = tu_chance(g, 0.5) ? 0.0f : (float)tu_range(g, 0.02, 0.5);
  c->alibi = tu_chance(g, 0.25);
  c->sinks = tu_chance(g, 0.25);
  c->window = tu_chance(g, 0.25) ? tu_int(g, 1, 80) : 0;
  c->soft_cap = tu_chance(g, 0.2) ? (float)tu_range(g, 1.0, 30.0) : 0.0f;
  double t = tu_uniform(g);
  c->type = t < 0.6    ? PA_ATTN_DECODER
            : t < 0.73 ? PA_ATTN_ENCODER
            : t < 0.86 ? PA_ATTN_ENCODER_ONLY
                       : PA_ATTN_ENCODER_DECODER;
  c->ctx = tu_int(g, 0, AR_NUM_CTX - 1);
  c->plan = varlen ? 0 : tu_int(g, 0, 2);
  c->lse = tu_chance(g, 0.75);
  c->shuffle = tu_chance(g, 0.6);
  c->pad = tu_chance(g, 0.5) ? tu_int(g, 1, 9) : 0;
  c->poison = !varlen && tu_chance(g, 0.1);
  c->fused = varlen && tu_chance(g, 0.5);
  c->q_mag = exp(tu_range(g, log(0.3), log(4.0)));
  c->k_mag = exp(tu_range(g, log(0.3), log(3.0)));
  c->v_mag = exp(tu_range(g, log(0.1), log(8.0)));
  c->k_scale = c->v_scale = 1.0f;
  if (c->cache_dtype >= PA_FP8_E4M3) pick_fp8_scales(g, c);

  c->num_seqs = tu_chance(g, 0.03) ? 0 : tu_int(g, 1, 6);
  int L = tu_int(g, 1, 160);
  int self = c->type == PA_ATTN_ENCODER || c->type == PA_ATTN_ENCODER_ONLY;
  for (int s = 0; s < c->num_seqs; s++) {
    int *q = &c->q_len[s], *k = &c->seq_len[s];
    if (c->type == PA_ATTN_DECODER) {
      switch (tu_int(g, 0, 3)) {
        case 0: *q = *k = tu_int(g, 1, L); break;                       /* prefill */
        case 1: *q = tu_int(g, 1, L), *k = *q + tu_int(g, 1, L); break; /* chunk */
        case 2: *q = 1, *k = tu_int(g, 1, 4 * L); break;                /* decode */
        default: *q = 0, *k = tu_int(g, 0, L); break;                   /* idle */
      }
      /* varlen: a decoder with more queries than keys leaves rows unseen */
      if (varlen && tu_chance(g, 0.1)) *q = *k + tu_int(g, 1, 8);
    } else if (self && tu_chance(g, 0.85)) {
      *q = *k = tu_int(g, 0, L);
    } else {
      *q = tu_int(g, 0, L);
      *k = tu_int(g, 0, L);
    }
  }
  fit_budget(c, 3e6);
  if (!varlen && tu_chance(g, 0.35)) c->layout = (hx_layout)tu_int(g, 1, HX_NUM_LAYOUTS - 1);
}

/* ---- targeted cases ------------------------------------------------------------ */

static void targeted_shapes(tu_rng *g) {
  static const int head_sizes[] = {1, 3, 80, 96, 112, 130, 256, 576, 1024};
  for (int i = 0; i < 9; i++) {
    attn_case c = base_case("head_size");
    c.head_size = head_sizes[i];
    c.act = (pa_dtype)(i % 3);
    c.src_dtype = c.act;
    c.cache_dtype = (pa_dtype)(i % 5);
    if (c.cache_dtype >= PA_FP8_E4M3) pick_fp8_scales(g, &c);
    if (c.head_size >= 576) {
      static const int q[] = {9, 4, 1}, k[] = {9, 13, 30};
      c.num_heads = 2;
      c.num_kv_heads = 1;
      set_seqs(&c, 3, q, k);
    }
    c.ctx = i % AR_NUM_CTX;
    run_case(&c);
  }
  static const int block_sizes[] = {1, 3, 16, 17, 128};
  for (int i = 0; i < 5; i++) {
    attn_case c = base_case("block_size");
    c.block_size = block_sizes[i];
    c.plan = i % 3;
    c.ctx = i % AR_NUM_CTX;
    run_case(&c);
  }
  static const int groups[] = {1, 2, 4, 7, 8};
  for (int i = 0; i < 5; i++) {
    attn_case c = base_case("gqa");
    c.num_kv_heads = 2;
    c.num_heads = 2 * groups[i];
    c.head_size = 32;
    c.act = (pa_dtype)(i % 3);
    c.src_dtype = c.act;
    c.cache_dtype = c.act;
    run_case(&c);
  }
  attn_case mqa = base_case("mqa");
  mqa.num_heads = 8;
  mqa.num_kv_heads = 1;
  run_case(&mqa);
  mqa.varlen = 1;
  run_case(&mqa);
  attn_case mha = base_case("num_kv_heads=0");
  mha.num_kv_heads = 0;
  run_case(&mha);
  attn_case scaled = base_case("explicit scale");
  scaled.scale = 0.3f;
  run_case(&scaled);
}

static void targeted_batches(void) {
  static const int q1[] = {1, 1}, k1[] = {1, 1};
  attn_case c = base_case("length 1");
  set_seqs(&c, 2, q1, k1);
  run_case(&c);
  c.varlen = 1;
  run_case(&c);

  /* Decodes, prefills and chunks interleaved. */
  static const int qm[] = {1, 33, 12, 1, 1, 1, 64, 5}, km[] = {50, 33, 29, 2, 1, 65, 64, 130};
  c = base_case("mixed order");
  set_seqs(&c, 8, qm, km);
  c.block_size = 5;
  for (int i = 0; i < AR_NUM_CTX; i++) {
    c.ctx = i;
    c.plan = i % 2;
    run_case(&c);
  }

  c = base_case("empty batch");
  c.num_seqs = 0;
  run_case(&c);
  c.plan = 1;
  run_case(&c);
  c.varlen = 1;
  c.plan = 0;
  run_case(&c);

  static const int qz[] = {0, 5, 0, 1, 0}, kz[] = {10, 5, 0, 3, 40};
  c = base_case("q_len 0");
  set_seqs(&c, 5, qz, kz);
  run_case(&c);
  c.varlen = 1;
  run_case(&c);
  c.varlen = 0;
  static const int qa[] = {0, 0}, ka[] = {7, 0};
  set_seqs(&c, 2, qa, ka); /* no rows at all */
  run_case(&c);
}

static void targeted_features(void) {
  /* Windows smaller and larger than the context, for every type. */
  static const int windows[] = {1, 5, 30, 1000};
  for (int t = 0; t < 4; t++)
    for (int w = 0; w < 4; w++) {
      attn_case c = base_case("window");
      c.type = (pa_attn_type)t;
      c.window = windows[w];
      c.varlen = w % 2;
      if (t != PA_ATTN_DECODER) {
        static const int q[] = {12, 30, 3}, k[] = {12, 30, 9};
        set_seqs(&c, 3, q, k);
      }
      run_case(&c);
    }

  /* All four types, paged and varlen. */
  for (int t = 0; t < 4; t++)
    for (int vl = 0; vl < 2; vl++) {
      attn_case c = base_case("attn type");
      c.type = (pa_attn_type)t;
      c.varlen = vl;
      if (t != PA_ATTN_DECODER) {
        static const int q[] = {17, 4, 25}, k[] = {17, 40, 3};
        set_seqs(&c, 3, q, k);
      }
      run_case(&c);
    }

  /* Sinks and ALiBi, alone and together, with and without a window and a
   * soft cap. */
  for (int i = 0; i < 8; i++) {
    attn_case c = base_case("sinks/alibi");
    c.sinks = (i & 1) || i == 6;
    c.alibi = (i & 2) != 0;
    c.window = (i & 4) ? 9 : 0;
    c.soft_cap = i >= 6 ? 4.0f : 0.0f;
    c.act = (pa_dtype)(i % 3);
    c.src_dtype = c.act;
    c.cache_dtype = c.act;
    c.varlen = i == 5;
    run_case(&c);
  }

  /* The logit features at their extremes: sinks whose base-2 logits pass
   * FLT_MAX (outputs near 0, lse the sink), a cap so far above the logits
   * that tanh's argument is near 0 (they pass through unchanged), and a
   * subnormal cap (every logit within a hair of 0). */
  for (int i = 0; i < 6; i++) {
    attn_case c = base_case("logit extremes");
    c.sinks = i < 2;
    c.sink_offset = i == 0 ? 3e38f : i == 1 ? -3e38f : 0.0f;
    c.soft_cap = i < 2 ? 0.0f : i < 4 ? 1e8f : 1e-40f;
    c.act = c.src_dtype = c.cache_dtype = i % 2 ? PA_F32 : PA_BF16;
    c.lse = 1;
    c.varlen = i == 3;
    run_case(&c);
  }

  /* Rows that see no key: zeros and lse = -inf, with a sink too. */
  for (int sinks = 0; sinks < 2; sinks++) {
    static const int q[] = {3, 2, 4}, k[] = {0, 6, 0};
    attn_case c = base_case("no keys: encoder-decoder");
    c.type = PA_ATTN_ENCODER_DECODER;
    c.sinks = sinks;
    set_seqs(&c, 3, q, k);
    run_case(&c);
    c.varlen = 1;
    run_case(&c);
    static const int qd[] = {5, 3, 2}, kd[] = {2, 0, 9};
    attn_case d = base_case("no keys: varlen decoder q_len > k_len");
    d.sinks = sinks;
    d.alibi = 1;
    d.varlen = 1;
    set_seqs(&d, 3, qd, kd);
    run_case(&d);
  }

  /* FP8 with scales so small that most values saturate. */
  for (int e5 = 0; e5 < 2; e5++) {
    attn_case c = base_case("fp8 saturation");
    c.cache_dtype = e5 ? PA_FP8_E5M2 : PA_FP8_E4M3;
    c.k_scale = (float)(c.k_mag / (e5 ? 40000.0 : 300.0));
    c.v_scale = (float)(c.v_mag / (e5 ? 80000.0 : 900.0));
    run_case(&c);
  }

  /* NaN in every slot and block no sequence owns: a kernel that computes a
   * whole block and masks afterwards must not let 0 * NaN through. */
  attn_case c = base_case("poisoned free slots");
  c.poison = 1;
  c.block_size = 16;
  for (int i = 0; i < 3; i++) {
    c.cache_dtype = (pa_dtype)(i == 2 ? PA_FP8_E4M3 : i);
    run_case(&c);
  }

  c = base_case("no lse, contiguous blocks, no padding");
  c.lse = 0;
  c.shuffle = 0;
  c.pad = 0;
  run_case(&c);

  c = base_case("plan from a sibling layer");
  c.plan = 2;
  c.alibi = c.sinks = 1;
  c.window = 11;
  run_case(&c);

  c = base_case("varlen fused qkv");
  static const int qf[] = {12, 1, 30}, kf[] = {12, 1, 30};
  set_seqs(&c, 3, qf, kf);
  c.varlen = 1;
  c.fused = 1;
  c.type = PA_ATTN_ENCODER_ONLY;
  run_case(&c);
}

/* Strided caches (the 0.2 block_stride / head_stride) on every path: each
 * layout with each cache dtype, block sizes 1, 3, 16 and 128 across them, in
 * a batch whose prompt takes the packed kernels (100 rows per KV head) and
 * whose decodes take the direct ones; then long decodes in small blocks,
 * where the tiles' prefetch ranges are per head (no longer one per block),
 * split-K over two threads, and 8 KV heads in 1-token blocks, more ranges
 * than a tile's scratch holds. */
static void targeted_strided(tu_rng *g) {
  static const int block_sizes[] = {1, 3, 16, 128};
  static const int q[] = {50, 40, 1, 1, 3}, k[] = {50, 90, 150, 1, 200};
  for (int layout = HX_DENSE_EXPLICIT; layout < HX_NUM_LAYOUTS; layout++) {
    for (int t = PA_F32; t <= PA_FP8_E5M2; t++) {
      attn_case c = base_case("strided cache");
      c.layout = (hx_layout)layout;
      c.cache_dtype = (pa_dtype)t;
      c.act = c.src_dtype = (pa_dtype)(t < PA_FP8_E4M3 ? t : (layout + t) % 3);
      c.block_size = block_sizes[(layout + t) % 4];
      set_seqs(&c, 5, q, k);
      if (t >= PA_FP8_E4M3) pick_fp8_scales(g, &c);
      c.plan = t % 3;
      c.poison = layout % 2;
      c.sinks = t == PA_F16;
      c.alibi = t == PA_BF16;
      run_case(&c);
    }
  }
  static const int qd[] = {1, 1, 2}, kd[] = {700, 333, 517};
  for (int layout = HX_DENSE_EXPLICIT; layout < HX_NUM_LAYOUTS; layout++) {
    attn_case c = base_case("strided cache, long decode");
    c.layout = (hx_layout)layout;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_size = layout % 2 ? 128 : 96;
    c.block_size = layout % 2 ? 16 : 5;
    c.act = c.src_dtype = c.cache_dtype = layout % 2 ? PA_BF16 : PA_F16;
    set_seqs(&c, 3, qd, kd);
    c.ctx = layout % 2; /* 1 and 2 threads: split-K on two */
    run_case(&c);
  }
  static const int q1[] = {1, 1}, k1[] = {1100, 300};
  for (int layout = HX_BLOCK_PADDED; layout < HX_NUM_LAYOUTS; layout++) {
    attn_case c = base_case("strided cache, 8 kv heads in 1-token blocks");
    c.layout = (hx_layout)layout;
    c.num_heads = c.num_kv_heads = 8;
    c.head_size = 32;
    c.block_size = 1;
    c.act = c.src_dtype = c.cache_dtype = (pa_dtype)(layout % 3);
    set_seqs(&c, 2, q1, k1);
    c.ctx = layout % AR_NUM_CTX;
    run_case(&c);
  }
}

/* ---- tiled caches (0.3) --------------------------------------------------------
 * PA_KV_TILED: keys in 16-token groups of element pairs, values in
 * 16-element column groups of token pairs. Every case here keeps its cache
 * tiled; most poison it (NaN in every element of every token no sequence
 * owns, the tokens past a sequence's end in its last 16-token group and
 * value pair included: a kernel that reads a whole group and masks
 * afterwards lets 0 * NaN through). The runner writes the cache through
 * pa_write_kv and checks its bytes, and the reference reads it back, both
 * through the harness's own index of the tiled order. */

/* Lengths that end anywhere in a 16-token group and a token pair. */
static int odd_length(tu_rng *g, int lo, int hi) {
  int n = tu_int(g, lo, hi);
  return n % 16 == 0 && tu_chance(g, 0.7) ? n + tu_int(g, 1, 15) : n;
}

static void random_tiled_case(tu_rng *g, attn_case *c) {
  static const int head_sizes[] = {16, 48, 64, 64, 80, 96, 128, 128, 256};
  static const int block_sizes[] = {16, 16, 32, 48, 128};
  static const int groups[] = {1, 1, 2, 4, 7, 8};
  memset(c, 0, sizeof *c);
  c->group = "random tiled";
  c->kv_layout = PA_KV_TILED;
  /* bf16 over bf16 or FP8, or f16 over FP8 (the pairs the AMX tiles read,
   * in place or converted per tile) a third of the time. */
  static const pa_dtype amx_caches[] = {PA_BF16, PA_BF16, PA_FP8_E4M3, PA_FP8_E5M2};
  int amx_pair = tu_chance(g, 0.33);
  c->cache_dtype = amx_pair ? amx_caches[tu_int(g, 0, 3)] : (pa_dtype)tu_int(g, 0, 4);
  c->act = !amx_pair                                            ? (pa_dtype)tu_int(g, 0, 2)
           : c->cache_dtype >= PA_FP8_E4M3 && tu_chance(g, 0.5) ? PA_F16
                                                                : PA_BF16;
  c->src_dtype = tu_chance(g, 0.8) ? c->act : (pa_dtype)tu_int(g, 0, 2);
  int nkv = tu_chance(g, 0.2) ? 1 : tu_int(g, 1, 4), group = groups[tu_int(g, 0, 5)];
  if (nkv == 1 && tu_chance(g, 0.5)) group = 8; /* MQA */
  c->num_heads = nkv * group;
  c->num_kv_heads = group == 1 && tu_chance(g, 0.3) ? 0 : nkv;
  c->head_size = head_sizes[tu_int(g, 0, (int)(sizeof head_sizes / sizeof(int)) - 1)];
  c->block_size = block_sizes[tu_int(g, 0, (int)(sizeof block_sizes / sizeof(int)) - 1)];
  c->scale = tu_chance(g, 0.5) ? 0.0f : (float)tu_range(g, 0.02, 0.5);
  c->alibi = tu_chance(g, 0.25);
  c->sinks = tu_chance(g, 0.25);
  c->window = tu_chance(g, 0.3) ? tu_int(g, 1, 100) : 0;
  c->soft_cap = tu_chance(g, 0.2) ? (float)tu_range(g, 1.0, 30.0) : 0.0f;
  double t = tu_uniform(g);
  c->type = t < 0.8    ? PA_ATTN_DECODER
            : t < 0.87 ? PA_ATTN_ENCODER
            : t < 0.94 ? PA_ATTN_ENCODER_ONLY
                       : PA_ATTN_ENCODER_DECODER;
  c->ctx = tu_int(g, 0, AR_NUM_CTX - 1);
  c->plan = tu_int(g, 0, 2);
  c->lse = tu_chance(g, 0.75);
  c->shuffle = tu_chance(g, 0.7);
  c->pad = tu_chance(g, 0.5) ? tu_int(g, 1, 9) : 0;
  c->poison = tu_chance(g, 0.6);
  c->layout = tu_chance(g, 0.4) ? (hx_layout)tu_int(g, 1, HX_NUM_LAYOUTS - 1) : HX_DENSE;
  c->q_mag = exp(tu_range(g, log(0.3), log(4.0)));
  c->k_mag = exp(tu_range(g, log(0.3), log(3.0)));
  c->v_mag = exp(tu_range(g, log(0.1), log(8.0)));
  c->k_scale = c->v_scale = 1.0f;
  if (c->cache_dtype >= PA_FP8_E4M3) pick_fp8_scales(g, c);

  c->num_seqs = tu_int(g, 1, 6);
  int L = tu_int(g, 1, 200);
  int self = c->type == PA_ATTN_ENCODER || c->type == PA_ATTN_ENCODER_ONLY;
  for (int s = 0; s < c->num_seqs; s++) {
    int *q = &c->q_len[s], *k = &c->seq_len[s];
    if (c->type == PA_ATTN_DECODER) {
      switch (tu_int(g, 0, 5)) {
        case 0: *q = *k = odd_length(g, 1, L); break;                            /* prefill */
        case 1: *q = tu_int(g, 1, L), *k = *q + odd_length(g, 1, L); break;      /* chunk */
        case 2: *q = 1, *k = odd_length(g, 1, 4 * L); break;                     /* decode */
        case 3: *q = tu_int(g, 2, 16), *k = *q + odd_length(g, 0, 2 * L); break; /* speculative */
        case 4: *q = *k = 1; break;                                              /* length 1 */
        default: *q = 0, *k = tu_int(g, 0, L); break;                            /* idle */
      }
    } else if (self && tu_chance(g, 0.85)) {
      *q = *k = odd_length(g, 0, L);
    } else {
      *q = tu_int(g, 0, L);
      *k = odd_length(g, 0, L);
    }
  }
  fit_budget(c, 2e6);
}

/* A mixed batch of every kind of sequence, ending mid-group and mid-pair:
 * a whole prompt, a chunk over a cached prefix, decodes (one of length 1),
 * and a 16-token speculative decode. */
static attn_case tiled_case(const char *group) {
  attn_case c = base_case(group);
  static const int q[] = {20, 7, 1, 1, 16}, k[] = {20, 37, 45, 1, 50};
  set_seqs(&c, 5, q, k);
  c.kv_layout = PA_KV_TILED;
  c.poison = 1;
  return c;
}

static void targeted_tiled(tu_rng *g) {
  /* Every activation over every cache dtype, across block and head sizes. */
  static const int block_sizes[] = {16, 32, 48, 128}, head_sizes[] = {64, 80, 96, 128, 16, 48};
  for (int a = PA_F32; a <= PA_BF16; a++)
    for (int t = PA_F32; t <= PA_FP8_E5M2; t++) {
      int i = a * 5 + t;
      attn_case c = tiled_case("tiled: dtypes");
      c.act = (pa_dtype)a;
      c.src_dtype = (pa_dtype)(i % 4 == 3 ? (a + 1) % 3 : a);
      c.cache_dtype = (pa_dtype)t;
      if (t >= PA_FP8_E4M3) pick_fp8_scales(g, &c);
      c.block_size = block_sizes[i % 4];
      c.head_size = head_sizes[i % 6];
      c.ctx = i % AR_NUM_CTX;
      c.plan = i % 3;
      c.poison = i % 5 != 4;
      c.shuffle = i % 2;
      run_case(&c);
    }

  /* Logit features on the pair AMX tiles read in place (bf16 over bf16)
   * and on an f32 one: ALiBi, sinks, soft cap, and windows that start
   * inside a 16-token group (a window of 21 keys ending at key 49 starts
   * at 29) or at its first key (16, 32). */
  static const int windows[] = {1, 5, 16, 21, 32, 37, 1000};
  for (int w = 0; w < 7; w++) {
    attn_case c = tiled_case("tiled: window");
    c.act = c.src_dtype = c.cache_dtype = w % 3 ? PA_BF16 : PA_F32;
    c.window = windows[w];
    c.block_size = w % 2 ? 16 : 32;
    c.alibi = w % 2;
    c.sinks = w % 3 == 1;
    c.soft_cap = w == 3 ? 6.0f : 0.0f;
    c.ctx = w % AR_NUM_CTX;
    run_case(&c);
  }
  for (int i = 0; i < 4; i++) {
    attn_case c = tiled_case("tiled: alibi/sinks/soft cap");
    c.act = c.src_dtype = (pa_dtype)(i % 3);
    c.cache_dtype = i == 3 ? PA_FP8_E5M2 : PA_BF16;
    if (i == 3) pick_fp8_scales(g, &c);
    c.alibi = c.sinks = 1;
    c.soft_cap = i % 2 ? 0.0f : 10.0f;
    c.lse = 1;
    c.ctx = i % AR_NUM_CTX;
    run_case(&c);
  }
  /* The other attention types over a tiled cache, a symmetric window
   * (encoder-only) among them. */
  for (int t = PA_ATTN_ENCODER; t <= PA_ATTN_ENCODER_DECODER; t++) {
    static const int q[] = {17, 4, 33}, k[] = {17, 40, 33};
    attn_case c = tiled_case("tiled: attn type");
    set_seqs(&c, 3, q, k);
    c.type = (pa_attn_type)t;
    c.act = c.src_dtype = c.cache_dtype = PA_BF16;
    c.window = t == PA_ATTN_ENCODER_ONLY ? 9 : 0;
    run_case(&c);
  }

  /* Prompts long enough for the packed kernels (and AMX tiles), a chunk
   * over a cached prefix and a 16-token speculative decode with them, for
   * GQA 7:1 and MQA, head sizes off and on multiples of 32. */
  static const int qp[] = {100, 41, 16, 1}, kp[] = {100, 130, 81, 77};
  static const int kv_heads[] = {1, 1, 2, 1}, groups_p[] = {7, 8, 2, 4};
  static const int head_sizes_p[] = {128, 80, 256, 96};
  for (int i = 0; i < 4; i++) {
    attn_case c = tiled_case("tiled: prefill");
    set_seqs(&c, 4, qp, kp);
    c.num_kv_heads = kv_heads[i];
    c.num_heads = kv_heads[i] * groups_p[i];
    c.head_size = head_sizes_p[i];
    c.block_size = i == 2 ? 48 : 16 << (i % 3);
    c.act = c.src_dtype = i < 3 ? PA_BF16 : PA_F16;
    c.cache_dtype = i == 1 ? PA_FP8_E4M3 : c.act;
    if (i == 1) pick_fp8_scales(g, &c);
    c.ctx = i % AR_NUM_CTX;
    c.plan = i % 2;
    c.window = i == 3 ? 45 : 0;
    run_case(&c);
  }

  /* Long decodes split over threads (split-K on 2 and 3), a speculative
   * decode among them, in blocks of 16, 32 and 128. */
  static const int qd[] = {1, 1, 16}, kd[] = {520, 250, 130};
  for (int i = 0; i < 3; i++) {
    attn_case c = tiled_case("tiled: long decode");
    set_seqs(&c, 3, qd, kd);
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_size = 128;
    c.block_size = 16 << (i == 2 ? 3 : i);
    c.act = c.src_dtype = PA_BF16;
    c.cache_dtype = i == 1 ? PA_FP8_E4M3 : PA_BF16;
    if (i == 1) pick_fp8_scales(g, &c);
    c.ctx = 1 + i % 2;
    c.plan = i % 2;
    c.sinks = i == 2;
    run_case(&c);
  }

  /* Tiled order inside strided tiles: every stride layout, vLLM's page of
   * interleaved key and value tiles among them, NaN between the tiles. */
  for (int layout = HX_DENSE_EXPLICIT; layout < HX_NUM_LAYOUTS; layout++) {
    attn_case c = tiled_case("tiled: strided");
    c.layout = (hx_layout)layout;
    c.act = c.src_dtype = (pa_dtype)(layout % 3);
    c.cache_dtype = layout == HX_VLLM ? PA_BF16 : (pa_dtype)((layout + 1) % 5);
    if (c.cache_dtype >= PA_FP8_E4M3) pick_fp8_scales(g, &c);
    c.block_size = block_sizes[layout % 4];
    c.head_size = layout % 2 ? 64 : 48;
    c.ctx = layout % AR_NUM_CTX;
    c.plan = layout % 3;
    run_case(&c);
  }

  /* Sequences of one token and of lengths just off the groups. */
  static const int q1[] = {1, 1, 1, 1, 3}, k1[] = {1, 15, 17, 31, 33};
  for (int i = 0; i < 2; i++) {
    attn_case c = tiled_case("tiled: short");
    set_seqs(&c, 5, q1, k1);
    c.act = c.src_dtype = c.cache_dtype = i ? PA_BF16 : PA_F32;
    c.block_size = 16 * (i + 1);
    c.ctx = i;
    run_case(&c);
  }
}

/* Long decodes, which the library splits over threads. */
static void targeted_long(void) {
  static const int q[] = {1, 1, 1, 3}, k[] = {2100, 2600, 37, 2003};
  for (int i = 0; i < 4; i++) {
    attn_case c = base_case("long context");
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_size = 128;
    set_seqs(&c, 4, q, k);
    c.ctx = i < 2 ? i : 1; /* 1 and 2 threads */
    c.plan = i % 2;
    if (i == 2) {
      c.act = c.src_dtype = PA_BF16;
      c.cache_dtype = PA_FP8_E4M3;
      c.k_scale = 0.01f;
      c.v_scale = 0.005f;
      c.sinks = c.alibi = 1;
    }
    if (i == 3) {
      c.act = c.src_dtype = c.cache_dtype = PA_F16;
      c.window = 300;
      c.soft_cap = 8.0f;
    }
    run_case(&c);
  }
  /* 2-byte caches in small blocks take tiles of a fixed byte size: 64,
   * 48 (not a power of two), 16 keys and the 128-key cap, over several tiles. */
  static const int head_sizes[] = {64, 96, 80, 256, 24};
  static const int qd[] = {1, 1, 2}, kd[] = {700, 333, 517};
  for (int i = 0; i < 5; i++) {
    attn_case c = base_case("long decode, tiles by bytes");
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_size = head_sizes[i];
    c.block_size = i == 1 ? 5 : 16;
    c.act = c.src_dtype = i == 2 ? PA_F16 : PA_BF16;
    c.cache_dtype = c.act;
    set_seqs(&c, 3, qd, kd);
    c.ctx = 0;
    run_case(&c);
  }
  /* Fewer sequences than threads: their KV heads are dealt out to the
   * threads (8 heads in halves, 7 in 4 + 3, 3 in 2 + 1; 1 stays whole), GQA 7:1
   * included, with and without a plan. */
  static const int kv_heads[] = {8, 7, 3, 1}, groups[] = {4, 7, 1, 2}, q2[] = {1, 2},
                   k2[] = {128, 300};
  for (int i = 0; i < 4; i++) {
    attn_case c = base_case("short decode, KV heads over threads");
    c.num_kv_heads = kv_heads[i];
    c.num_heads = kv_heads[i] * groups[i];
    c.head_size = i == 1 ? 80 : 128;
    c.block_size = i == 2 ? 7 : 16;
    set_seqs(&c, 1 + i % 2, q2, k2);
    c.ctx = 1 + i % 2; /* 2 and 3 threads */
    c.plan = i / 2;
    run_case(&c);
  }
  /* A batch of one long decode: all threads must share one sequence. */
  static const int q1[] = {1}, k1[] = {4099};
  for (int i = 0; i < 2; i++) {
    attn_case c = base_case("one long decode");
    c.num_heads = c.num_kv_heads = 2;
    set_seqs(&c, 1, q1, k1);
    c.ctx = i;
    c.block_size = 128;
    run_case(&c);
  }
}

/* "Different contexts may be used concurrently": four cases, each on its
 * own two-thread context in its own thread, several calls each, all at
 * once. Library state shared between contexts would show as wrong output. */
typedef struct worker {
  paged_run *run;
  pa_context *ctx;
  pa_status st;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  for (int rep = 0; rep < 4 && w->st == PA_OK; rep++) w->st = ar_paged_call(w->run, w->ctx);
  return NULL;
}

static void test_concurrent_contexts(void) {
  enum { N = 4 };
  static const int q[] = {1, 9, 1}, k[] = {900, 9, 1500};
  attn_case cases[N];
  paged_run runs[N];
  worker workers[N];
  pthread_t threads[N];
  int started[N] = {0};
  char tags[N][32];
  int ready = 1;
  long first = g_index;
  if (g_only >= 0 && (g_only < first || g_only >= first + N)) {
    g_index += N;
    return;
  }
  for (int i = 0; i < N; i++) {
    cases[i] = base_case("concurrent contexts");
    set_seqs(&cases[i], 3, q, k);
    cases[i].act = cases[i].src_dtype = (pa_dtype)(i % 3);
    cases[i].cache_dtype = (pa_dtype)(i == 3 ? PA_FP8_E5M2 : i % 3);
    cases[i].k_scale = cases[i].v_scale = 0.01f;
    cases[i].sinks = i % 2;
    cases[i].seed = tu_mix(g_seed, (uint64_t)g_index);
    snprintf(tags[i], sizeof tags[i], "case %ld", g_index++);
    ready &= ar_paged_prepare(&cases[i], tags[i], &runs[i]);
    workers[i] = (worker){&runs[i], NULL, PA_OK};
    pa_status st = pa_context_create(2, &workers[i].ctx);
    TU_CHECK(st == PA_OK, "pa_context_create(2): %s", pa_last_error());
    ready &= st == PA_OK;
  }
  if (ready) {
    for (int i = 0; i < N; i++)
      started[i] = pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0;
    for (int i = 0; i < N; i++) {
      TU_CHECK(started[i], "pthread_create failed");
      if (started[i]) pthread_join(threads[i], NULL);
    }
    for (int i = 0; i < N; i++) {
      long before = tu_failures;
      if (started[i]) ar_paged_check(&runs[i], tags[i], workers[i].st);
      report_case(&cases[i], tags[i], first + i, before);
    }
  }
  for (int i = 0; i < N; i++) {
    ar_paged_free(&runs[i]);
    if (workers[i].ctx) pa_context_destroy(workers[i].ctx);
  }
}

int main(int argc, char **argv) {
  g_seed = tu_seed_from_args(argc, argv, 20240607);
  g_only = tu_only_case();
  double t0 = tu_now();
  for (int i = 0; i < AR_NUM_CTX; i++) {
    pa_status st = pa_context_create(ar_ctx_threads[i], &ar_ctx[i]);
    if (st != PA_OK) {
      fprintf(stderr, "pa_context_create(%d): %s (%s)\n", ar_ctx_threads[i], pa_status_string(st),
              pa_last_error());
      return 1;
    }
  }
  printf("test_attention: seed %llu, isa %s\n", (unsigned long long)g_seed,
         pa_context_isa(ar_ctx[0]));

  tu_rng g;
  tu_rng_seed(&g, tu_mix(g_seed, 0xC0FFEE));
  double t = tu_now();
  targeted_shapes(&g);
  targeted_batches();
  targeted_features();
  printf("  targeted cases: %.2f s\n", tu_now() - t);
  t = tu_now();
  targeted_long();
  printf("  long contexts: %.2f s\n", tu_now() - t);
  t = tu_now();
  targeted_strided(&g);
  printf("  strided caches: %.2f s\n", tu_now() - t);
  test_concurrent_contexts();

  t = tu_now();
  long n_random = (long)(600 * tu_case_scale());
  for (long i = 0; i < n_random; i++) {
    attn_case c;
    random_case(&g, &c, i % 4 == 3);
    run_case(&c);
  }
  printf("  %ld random cases: %.2f s\n", n_random, tu_now() - t);

  /* Tiled caches last, from their own generator: the cases above keep
   * their indices and data. */
  t = tu_now();
  tu_rng tg;
  tu_rng_seed(&tg, tu_mix(g_seed, 0x711ED));
  targeted_tiled(&tg);
  long n_tiled = (long)(48 * tu_case_scale());
  for (long i = 0; i < n_tiled; i++) {
    attn_case c;
    random_tiled_case(&tg, &c);
    run_case(&c);
  }
  printf("  tiled caches (%ld random): %.2f s\n", n_tiled, tu_now() - t);

  for (int i = 0; i < AR_NUM_CTX; i++) pa_context_destroy(ar_ctx[i]);
  printf("test_attention: %ld cases, %ld failed, %.2f s\n", g_index, g_failed_cases, tu_now() - t0);
  printf("  worst |out - ref| / tolerance: f32 %.3g, f16 %.3g, bf16 %.3g\n", hx_worst_ratio[0],
         hx_worst_ratio[1], hx_worst_ratio[2]);
  printf("  fp8 cache elements matching only x * (1 / scale): %ld\n", hx_alt_matches);
  return tu_finish("test_attention");
}
