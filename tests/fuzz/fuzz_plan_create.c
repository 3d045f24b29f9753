/* pa_plan_create from arbitrary bytes: a layer and a batch with hostile
 * lengths. An error must return no plan. A plan that is made is then used:
 * pa_paged_attention with it (on its context or the other one) must give the
 * reference's output over a cache built for the batch, and the same plan
 * with a batch of other lengths must be refused without writing out. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ROWS = 64, MAX_KEYS = 1100 };

/* The plan in use: a cache of block_size bs holding every sequence's keys
 * in shuffled blocks, a query, and outputs; compared with the reference. */
static void use_plan(fz_in *in, pa_context *ctx, const pa_layer *layer, const pa_layer_config *cfg,
                     const pa_plan *plan, const fz_lengths *l, int extreme) {
  int nh = cfg->num_heads, nkv = cfg->num_kv_heads ? cfg->num_kv_heads : nh, hs = cfg->head_size;
  int64_t width = (int64_t)nh * hs, rows = l->rows;
  if (rows > MAX_ROWS || l->keys > MAX_KEYS || width * l->keys > (1 << 18)) return;
  fz_cache fc;
  memset(&fc, 0, sizeof fc);
  pa_kv_cache *c = &fc.c;
  c->block_size = fz_range(in, 1, 20);
  c->num_kv_heads = nkv;
  c->head_size = hs;
  c->dtype = (pa_dtype)fz_range(in, 0, 4);
  c->k_scale = 0.25f;
  c->v_scale = 0.5f;
  int stride = 0;
  for (int s = 0; s < l->num_seqs; s++) {
    int need = (int)((fz_k_len(l, s) + c->block_size - 1) / c->block_size);
    c->num_blocks += need;
    if (need > stride) stride = need;
  }
  c->num_blocks += 1;
  uint64_t bytes = (uint64_t)fz_cache_elems(c) * pa_dtype_size(c->dtype);
  fz_alloc(&fc.key, bytes);
  fz_alloc(&fc.value, bytes);
  c->key = fc.key.p;
  c->value = fc.value.p;
  fc.provisioned = 1;
  fz_cache_fill(&fc, in->at);
  int32_t *bt = malloc((size_t)(l->num_seqs * stride + 1) * sizeof(int32_t));
  int32_t next = (int32_t)(c->num_blocks - 1);
  for (int s = 0; s < l->num_seqs; s++)
    for (int b = 0; b < stride; b++)
      bt[s * stride + b] = b * c->block_size < fz_k_len(l, s) ? next-- : -1;
  pa_batch batch = {l->num_seqs, l->null_qsl ? NULL : l->qsl, l->null_kv ? NULL : l->kv, bt,
                    stride};

  size_t act = pa_dtype_size(cfg->dtype);
  fz_rows q, out;
  int backed = fz_rows_alloc(&q, rows, 0, width, width, act, 1);
  if (!fz_rows_alloc(&out, rows, 1, width, width, act, 1) || !backed) {
    fz_rows_free(&q);
    fz_rows_free(&out);
    fz_cache_free(&fc);
    free(bt);
    return;
  }
  fz_rows_fill(&q, in->at + 1, cfg->dtype, 2.0);
  fz_rows_fill(&out, 0, cfg->dtype, 1.0);
  float *lse = malloc(((size_t)rows * (size_t)nh + 4) * sizeof(float));
  tu_fill_canary(lse, ((size_t)rows * (size_t)nh + 4) * sizeof(float));
  pa_context *run_on = fz_one_in(in, 2) ? fz_context_other(ctx) : ctx;
  pa_status st =
      pa_paged_attention(run_on, layer, plan, q.buf.p, width, c, &batch, out.buf.p, width, lse);
  FZ_ASSERT(st == PA_OK, "pa_paged_attention refused the batch its plan was made for: %s",
            pa_last_error());
  if (!extreme && rows > 0) {
    ref_layer rl = fz_ref_layer(cfg);
    ref_cache rc = fz_ref_cache(c);
    double *ref_out = malloc((size_t)(rows * width) * sizeof(double) + 1);
    double *ref_lse = malloc((size_t)(rows * nh) * sizeof(double) + 1);
    double *vmax = malloc((size_t)rows * sizeof(double) + 1);
    ref_paged_attention(&rl, (ref_dtype)cfg->dtype, q.buf.p, width, &rc, l->num_seqs, l->qsl, l->kv,
                        bt, stride, ref_out, ref_lse, vmax);
    fz_check_attention("pa_paged_attention with a plan", cfg->dtype, cfg, rows, &out, lse, 4,
                       ref_out, ref_lse, vmax, fz_logit_error(cfg, 2.0, 1.0, l->keys));
    free(ref_out);
    free(ref_lse);
    free(vmax);
  }

  /* The same plan with other lengths: an error, and out left alone. */
  if (l->num_seqs > 0) {
    int32_t lens[FZ_MAX_SEQS];
    memcpy(lens, l->kv, sizeof lens);
    int s = fz_range(in, 0, l->num_seqs - 1);
    int64_t q_len = fz_q_len(l, s);
    if (lens[s] > q_len) {
      lens[s]--; /* fewer keys: the block table still covers them */
      batch.seq_lens = lens;
      fz_rows_fill(&out, 0, cfg->dtype, 1.0);
      fz_plant_stale_message();
      st = pa_paged_attention(run_on, layer, plan, q.buf.p, width, c, &batch, out.buf.p, width,
                              NULL);
      FZ_ASSERT(st == PA_ERR_INVALID_ARGUMENT && strstr(pa_last_error(), "plan"),
                "a plan used with other lengths gave %s (%s)", pa_status_string(st),
                pa_last_error());
      FZ_ASSERT(fz_rows_unchanged(&out), "a refused plan wrote out");
    }
  }
  free(lse);
  free(bt);
  fz_rows_free(&q);
  fz_rows_free(&out);
  fz_cache_free(&fc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  pa_context *ctx = fz_context(&in);
  int extreme = 0;
  float slopes[FZ_MAX_HEADS], sinks[FZ_MAX_HEADS];
  pa_layer_config cfg;
  pa_layer *layer = fz_make_layer(&in, __FILE__, &cfg, slopes, sinks, &extreme);
  fz_lengths l;
  fz_decode_lengths(&in, &l, 0);
  int null_layer = fz_one_in(&in, 48), null_batch = fz_one_in(&in, 48);
  int null_out = fz_one_in(&in, 48);
  /* The block tables are not the planner's business: garbage is fine. */
  int32_t garbage[2] = {-7, INT32_MAX};
  pa_batch batch = {l.num_seqs, l.null_qsl ? NULL : l.qsl, l.null_kv ? NULL : l.kv, garbage,
                    fz_int(FZ_EDGY(&in, 0, 2, -1, INT32_MAX, INT32_MIN))};

  fz_expect e = {"pa_plan_create", 0, 0};
  const pa_status inv = PA_ERR_INVALID_ARGUMENT;
  fz_need(&e, !ctx || null_layer || null_batch || null_out, inv);
  fz_model_lengths(&e, &l, cfg.attn_type == PA_ATTN_DECODER);
  fz_allow(&e, batch.block_table_stride < 0, inv);
  /* A valid batch this long would take the planner a long time, not fail. */
  if (l.ok && l.rows > 100000) {
    pa_layer_destroy(layer);
    return 0;
  }

  pa_plan *plan = NULL;
  fz_plant_stale_message();
  pa_status st = pa_plan_create(ctx, null_layer ? NULL : layer, null_batch ? NULL : &batch,
                                null_out ? NULL : &plan);
  if (fz_check_status(&e, st)) {
    FZ_ASSERT(plan != NULL, "pa_plan_create returned ok and no plan");
    use_plan(&in, ctx, layer, &cfg, plan, &l, extreme);
    pa_plan_destroy(plan);
  } else {
    FZ_ASSERT(plan == NULL, "pa_plan_create failed (%s) but returned a plan", pa_last_error());
  }
  pa_layer_destroy(layer);
  return 0;
}
