/* pa_paged_attention from arbitrary bytes: a layer with any features, a
 * cache whose geometry may disagree with it (dense or strided, NaN between
 * its tiles), a batch with hostile lengths,
 * block tables and strides, and a plan that may have been made for
 * something else. PA_OK must give the reference's output (and lse) and
 * write nothing else; an error must leave out and lse as they were. The
 * cache and the query are never written. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ROWS = 160, MAX_ENTRIES = 4096, MAX_KEYS = 8192, LSE_EXTRA = 4 };

typedef enum plan_mode {
  PLAN_NONE,
  PLAN_SAME,          /* made for this layer and batch */
  PLAN_OTHER_CONTEXT, /* ... on the context with the other thread count */
  PLAN_SIBLING,       /* ... for a layer of the same geometry, other features */
  PLAN_OTHER_HEADS,   /* ... for a layer of another geometry: an error */
  PLAN_OTHER_LENGTHS, /* ... for a batch with another seq_len: an error */
} plan_mode;

static pa_plan *make_plan(pa_context *ctx, const pa_layer_config *cfg, const pa_batch *batch) {
  pa_layer *layer = NULL;
  pa_plan *plan = NULL;
  if (pa_layer_create(cfg, &layer) != PA_OK) return NULL;
  if (pa_plan_create(ctx, layer, batch, &plan) != PA_OK) plan = NULL;
  pa_layer_destroy(layer);
  return plan;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  pa_context *ctx = fz_context(&in);
  int extreme = 0;
  float slopes[FZ_MAX_HEADS], sinks[FZ_MAX_HEADS];
  pa_layer_config cfg;
  pa_layer *layer = fz_make_layer(&in, __FILE__, &cfg, slopes, sinks, &extreme);
  int nh = cfg.num_heads, nkv = cfg.num_kv_heads ? cfg.num_kv_heads : nh, hs = cfg.head_size;
  int decoder = cfg.attn_type == PA_ATTN_DECODER;
  fz_cache fc;
  fz_decode_cache(&in, &fc, nkv, hs, 1);
  extreme |= fc.extreme;
  fz_lengths l;
  fz_decode_lengths(&in, &l, 0);
  int null_layer = fz_one_in(&in, 64), null_cache = fz_one_in(&in, 64);
  int null_batch = fz_one_in(&in, 64), null_tables = fz_one_in(&in, 48);
  int null_query = fz_one_in(&in, 48), null_out = fz_one_in(&in, 48);
  int want_lse = fz_one_in(&in, 2);
  plan_mode mode = fz_one_in(&in, 2) ? (plan_mode)fz_range(&in, 1, 5) : PLAN_NONE;

  fz_expect e = {"pa_paged_attention", 0, 0};
  const pa_status inv = PA_ERR_INVALID_ARGUMENT, oor = PA_ERR_OUT_OF_RANGE;
  fz_need(&e, !ctx || null_layer || null_batch, inv);
  fz_model_cache(&e, null_cache ? NULL : &fc.c);
  int cache_ok = fz_cache_geometry_ok(&fc.c);
  fz_need(&e, fc.c.num_kv_heads != nkv || fc.c.head_size != hs, inv);
  fz_model_lengths(&e, &l, decoder);

  /* Block tables: the blocks each sequence needs, mostly valid ids. */
  int bs = fc.c.block_size > 0 ? fc.c.block_size : 1;
  int64_t needed[FZ_MAX_SEQS] = {0}, most = 0;
  for (int s = 0; s < l.decoded; s++) {
    int64_t k = fz_k_len(&l, s);
    needed[s] = k > 0 ? (k + bs - 1) / bs : 0;
    if (needed[s] > most) most = needed[s];
  }
  int stride = fz_int(
      FZ_EDGY(&in, most, most + 2, most - 1, 0, -1, INT32_MAX, INT32_MIN, 1 << 20, most + 1000));
  if (l.ok && cache_ok && !null_cache) {
    fz_need(&e, stride < 0, inv);
    for (int s = 0; s < l.num_seqs; s++) fz_need(&e, stride >= 0 && needed[s] > stride, oor);
    fz_need(&e, most > 0 && stride >= most && null_tables, inv);
  } else {
    fz_allow(&e, 1, oor); /* lengths or sizes that mean nothing yet */
  }
  fz_allow(&e, stride < 0 || null_tables, inv);
  /* The table is backed to its declared num_seqs x stride entries: a call
   * may read any of them. Dense tables hold garbage (-1) past each
   * sequence's blocks; sparse ones (huge strides) zeros. */
  int64_t nb = fc.c.num_blocks;
  fz_buf table;
  uint64_t table_bytes = (uint64_t)l.decoded * (stride > 0 ? (uint64_t)stride : 0) * 4;
  /* Valid sequences this long would make the call (and the reference)
   * slow, not wrong: the limits test covers them. */
  int64_t entries = 0;
  for (int s = 0; s < l.decoded; s++) entries += needed[s];
  int backed =
      l.num_seqs <= FZ_MAX_SEQS && (!l.ok || (entries <= MAX_ENTRIES && l.keys <= MAX_KEYS));
  if (!l.ok || stride <= 0) {
    fz_alloc_token(&table);
  } else if (!fz_alloc(&table, table_bytes)) {
    fz_alloc_token(&table);
    backed = 0;
  }
  int32_t *bt = (int32_t *)table.p;
  int dense_table = l.ok && stride > 0 && table.bytes <= FZ_DENSE_LIMIT;
  if (dense_table) memset(bt, 0xff, (size_t)table.bytes);
  if (l.ok && stride > 0 && backed) {
    for (int s = 0; s < l.decoded; s++)
      for (int64_t b = 0; b < needed[s] && b < stride; b++) {
        int64_t id = FZ_EDGY(&in, 0, nb < 200 ? fz_sat_add(nb, -1) : 200, -1, nb, fz_sat_add(nb, 1),
                             INT32_MAX, INT32_MIN, 0);
        bt[(uint64_t)s * (uint64_t)stride + (uint64_t)b] = (int32_t)id;
        if (cache_ok && !null_cache && stride >= most) fz_need(&e, id < 0 || id >= nb, oor);
        fz_allow(&e, id < 0 || id >= nb, oor);
      }
  }

  /* Query, output and lse rows. */
  int64_t width = (int64_t)nh * hs, rows = l.ok ? l.rows : 0;
  size_t act = pa_dtype_size(cfg.dtype);
  int64_t qstride = FZ_EDGY(&in, width, width + 2, width - 1, 0, -1, INT64_MIN, INT64_MAX / 2,
                            (int64_t)1 << 33, width + 1000);
  int64_t ostride =
      FZ_EDGY(&in, width, width + 2, width - 1, 0, -1, INT64_MAX / 3, (int64_t)1 << 32, width + 64);
  if (l.ok) {
    fz_need(&e, rows > 0 && (null_query || null_out), inv);
    fz_allow(&e, rows == 0 && (null_query || null_out), inv);
    fz_model_rows(&e, rows, qstride, width, act);
    fz_model_rows(&e, rows, ostride, width, act);
  }
  fz_rows q, out;
  int qshape = l.ok && fz_extent(rows, qstride, width, act) != UINT64_MAX;
  /* A canary row after the output when its extent still fits. */
  int oshape = l.ok && fz_extent(rows, ostride, width, act) != UINT64_MAX;
  int extra = fz_extent(rows + 1, ostride, width, act) != UINT64_MAX;
  backed &= rows <= MAX_ROWS;
  backed &= fz_rows_alloc(&q, qshape ? rows : 0, 0, qstride, width, act, qshape);
  backed &= fz_rows_alloc(&out, oshape ? rows : 0, extra, ostride, width, act, oshape);
  if (cache_ok && !fc.provisioned) backed = 0;
  /* The reference is slow: keep a call's work within reach of the timeout. */
  if (l.ok && (double)rows * (double)l.keys * (double)width > (double)(1 << 25)) backed = 0;

  size_t lse_bytes = ((size_t)(backed ? rows : 0) * (size_t)nh + LSE_EXTRA) * sizeof(float);
  float *lse = want_lse ? malloc(lse_bytes) : NULL;
  if (lse) tu_fill_canary(lse, lse_bytes);

  pa_batch batch = {l.num_seqs, l.null_qsl ? NULL : l.qsl, l.null_kv ? NULL : l.kv,
                    null_tables ? NULL : bt, stride};
  /* The plan, made before the call (a failed make means none). */
  pa_plan *plan = NULL;
  if (backed && mode != PLAN_NONE && l.ok && !null_batch && ctx) {
    pa_layer_config other = cfg;
    pa_batch b2 = batch;
    int32_t lens[FZ_MAX_SEQS];
    if (mode == PLAN_SIBLING) {
      other.dtype = (pa_dtype)((cfg.dtype + 1) % 3);
      other.sliding_window = cfg.sliding_window ? 0 : 5;
      other.alibi_slopes = other.sinks = NULL;
      other.scale = 0.5f;
    } else if (mode == PLAN_OTHER_HEADS) {
      other.head_size = hs < 1024 ? hs + 1 : hs - 1;
    } else if (mode == PLAN_OTHER_LENGTHS && l.num_seqs > 0) {
      memcpy(lens, l.kv, sizeof lens);
      lens[l.num_seqs - 1] = lens[l.num_seqs - 1] < INT32_MAX ? lens[l.num_seqs - 1] + 1 : 0;
      b2.seq_lens = lens;
    }
    plan = make_plan(mode == PLAN_OTHER_CONTEXT ? fz_context_other(ctx) : ctx, &other, &b2);
    int mismatch = mode == PLAN_OTHER_HEADS || (mode == PLAN_OTHER_LENGTHS && l.num_seqs > 0);
    fz_need(&e, plan && mismatch, inv);
  }

  if (backed) {
    fz_cache_fill(&fc, in.at);
    fz_rows_fill(&q, in.at + 3, cfg.dtype, 2.0);
    fz_rows_fill(&out, 0, cfg.dtype, 1.0);
    /* The cache's buffers whole, what lies between the tiles included. */
    size_t key_bytes = fz_cache_buf_bytes(&fc, 0), value_bytes = fz_cache_buf_bytes(&fc, 1);
    unsigned char *ck = fz_copy(fc.key.p, key_bytes), *cv = fz_copy(fc.value.p, value_bytes);
    unsigned char *lse_copy = lse ? fz_copy(lse, lse_bytes) : NULL;
    size_t bt_watch = dense_table ? (size_t)table.bytes : 0;
    unsigned char *bt_copy = fz_copy(table.p, bt_watch);
    fz_plant_stale_message();
    pa_status st =
        pa_paged_attention(ctx, null_layer ? NULL : layer, plan, null_query ? NULL : q.buf.p,
                           qstride, null_cache ? NULL : &fc.c, null_batch ? NULL : &batch,
                           null_out ? NULL : out.buf.p, ostride, lse);
    int ok = fz_check_status(&e, st);
    FZ_ASSERT(memcmp(ck, fc.key.p, key_bytes) == 0 && memcmp(cv, fc.value.p, value_bytes) == 0,
              "pa_paged_attention wrote the cache");
    FZ_ASSERT(fz_rows_unchanged(&q), "pa_paged_attention wrote its query");
    FZ_ASSERT(memcmp(bt_copy, table.p, bt_watch) == 0, "pa_paged_attention wrote the block tables");
    if (!ok) {
      FZ_ASSERT(fz_rows_unchanged(&out), "pa_paged_attention failed (%s) but wrote out",
                pa_last_error());
      FZ_ASSERT(!lse || memcmp(lse_copy, lse, lse_bytes) == 0,
                "pa_paged_attention failed (%s) but wrote lse", pa_last_error());
    } else if (!extreme && rows > 0) {
      pa_kv_cache backing = fz_cache_backing(&fc);
      ref_layer rl = fz_ref_layer(&cfg);
      ref_cache rc = fz_ref_cache(&backing);
      double *ref_out = malloc((size_t)(rows * width) * sizeof(double));
      double *ref_lse = malloc((size_t)(rows * nh) * sizeof(double));
      double *vmax = malloc((size_t)rows * sizeof(double));
      ref_paged_attention(&rl, (ref_dtype)cfg.dtype, q.buf.p, qstride, &rc, l.num_seqs, l.qsl, l.kv,
                          bt, stride, ref_out, ref_lse, vmax);
      int64_t longest = 0;
      for (int s = 0; s < l.num_seqs; s++)
        longest = fz_k_len(&l, s) > longest ? fz_k_len(&l, s) : longest;
      fz_check_attention("pa_paged_attention", cfg.dtype, &cfg, rows, &out, lse, LSE_EXTRA, ref_out,
                         ref_lse, vmax, fz_logit_error(&cfg, 2.0, 1.0, longest));
      free(ref_out);
      free(ref_lse);
      free(vmax);
    } else {
      FZ_ASSERT(fz_rows_canaries_ok(&out), "pa_paged_attention wrote outside its output rows");
    }
    free(ck);
    free(cv);
    free(lse_copy);
    free(bt_copy);
  }
  pa_plan_destroy(plan);
  free(lse);
  fz_rows_free(&q);
  fz_rows_free(&out);
  fz_free(&table);
  fz_cache_free(&fc);
  pa_layer_destroy(layer);
  return 0;
}
