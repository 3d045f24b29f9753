/* pa_varlen_attention from arbitrary bytes: a layer with any features,
 * hostile cumulative lengths for queries and keys, strides (huge ones are
 * sparse), NULL pointers, and Q, K, V as views of one fused buffer. PA_OK
 * must give the reference's output and lse and write nothing else; an error
 * must leave out and lse as they were. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ROWS = 160, MAX_KEYS = 2048, LSE_EXTRA = 4 };

static int64_t edgy_stride(fz_in *in, int64_t width) {
  return FZ_EDGY(in, width, width + 2, width - 1, 0, -1, INT64_MIN, INT64_MAX / 2, (int64_t)1 << 31,
                 width + 1000);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  pa_context *ctx = fz_context(&in);
  int extreme = 0;
  float slopes[FZ_MAX_HEADS], sinks[FZ_MAX_HEADS];
  pa_layer_config cfg;
  pa_layer *layer = fz_make_layer(&in, __FILE__, &cfg, slopes, sinks, &extreme);
  int nh = cfg.num_heads, nkv = cfg.num_kv_heads ? cfg.num_kv_heads : nh, hs = cfg.head_size;
  fz_lengths l;
  fz_decode_lengths(&in, &l, 1);
  int null_layer = fz_one_in(&in, 64), null_query = fz_one_in(&in, 48);
  int null_key = fz_one_in(&in, 48), null_value = fz_one_in(&in, 48);
  int null_out = fz_one_in(&in, 48), want_lse = fz_one_in(&in, 2), fused = fz_one_in(&in, 4);
  int64_t width = (int64_t)nh * hs, kw = (int64_t)nkv * hs;
  int64_t qstride = edgy_stride(&in, width), kstride = edgy_stride(&in, kw);
  int64_t vstride = edgy_stride(&in, kw), ostride = edgy_stride(&in, width);

  fz_expect e = {"pa_varlen_attention", 0, 0};
  const pa_status inv = PA_ERR_INVALID_ARGUMENT;
  fz_need(&e, !ctx || null_layer, inv);
  fz_model_lengths(&e, &l, 0);
  int64_t rows = l.ok ? l.rows : 0, keys = l.ok ? l.keys : 0;
  size_t act = pa_dtype_size(cfg.dtype);
  fused = fused && l.ok && rows == keys && rows > 0;
  /* A fused row holds [q | k | v] and maybe a little padding. */
  int64_t pad = qstride >= width && qstride <= width + 8 ? qstride - width : 0;
  if (fused) qstride = kstride = vstride = width + 2 * kw + pad;
  if (l.ok) {
    fz_need(&e, rows > 0 && (null_query || null_out), inv);
    fz_need(&e, keys > 0 && (null_key || null_value), inv);
    fz_allow(&e, null_query || null_out || null_key || null_value, inv);
    fz_model_rows(&e, rows, qstride, width, act);
    fz_model_rows(&e, rows, ostride, width, act);
    fz_model_rows(&e, keys, kstride, kw, act);
    fz_model_rows(&e, keys, vstride, kw, act);
  }

  /* The reference is slow: keep a call's work within reach of the timeout. */
  int backed = rows <= MAX_ROWS && keys <= MAX_KEYS &&
               (double)rows * (double)keys * (double)width <= (double)(1 << 25);
  fz_rows q, k, v, out;
  memset(&k, 0, sizeof k);
  memset(&v, 0, sizeof v);
  if (fused) {
    /* One row of [q | k | v] per token. */
    int shape = fz_extent(rows, qstride, width + 2 * kw, act) != UINT64_MAX;
    backed &= fz_rows_alloc(&q, shape ? rows : 0, 0, qstride, width + 2 * kw, act, shape);
    fz_alloc_token(&k.buf);
    fz_alloc_token(&v.buf);
  } else {
    int qs = l.ok && fz_extent(rows, qstride, width, act) != UINT64_MAX;
    int ks = l.ok && fz_extent(keys, kstride, kw, act) != UINT64_MAX;
    int vs = l.ok && fz_extent(keys, vstride, kw, act) != UINT64_MAX;
    backed &= fz_rows_alloc(&q, qs ? rows : 0, 0, qstride, width, act, qs);
    backed &= fz_rows_alloc(&k, ks ? keys : 0, 0, kstride, kw, act, ks);
    backed &= fz_rows_alloc(&v, vs ? keys : 0, 0, vstride, kw, act, vs);
  }
  /* A canary row after the output when its extent still fits. */
  int os = l.ok && fz_extent(rows, ostride, width, act) != UINT64_MAX;
  int extra = fz_extent(rows + 1, ostride, width, act) != UINT64_MAX;
  backed &= fz_rows_alloc(&out, os ? rows : 0, extra, ostride, width, act, os);

  if (backed) {
    fz_rows_fill(&q, in.at, cfg.dtype, 2.0);
    fz_rows_fill(&k, in.at + 1, cfg.dtype, 2.0);
    fz_rows_fill(&v, in.at + 2, cfg.dtype, 2.0);
    fz_rows_fill(&out, 0, cfg.dtype, 1.0);
    const unsigned char *qp = q.buf.p;
    const unsigned char *kp = fused ? qp + (size_t)width * act : k.buf.p;
    const unsigned char *vp = fused ? qp + (size_t)(width + kw) * act : v.buf.p;
    size_t lse_bytes = ((size_t)rows * (size_t)nh + LSE_EXTRA) * sizeof(float);
    float *lse = want_lse ? malloc(lse_bytes) : NULL;
    if (lse) tu_fill_canary(lse, lse_bytes);
    unsigned char *lse_copy = lse ? fz_copy(lse, lse_bytes) : NULL;
    fz_plant_stale_message();
    pa_status st = pa_varlen_attention(
        ctx, null_layer ? NULL : layer, null_query ? NULL : qp, qstride, null_key ? NULL : kp,
        kstride, null_value ? NULL : vp, vstride, l.num_seqs, l.null_qsl ? NULL : l.qsl,
        l.null_kv ? NULL : l.kv, null_out ? NULL : out.buf.p, ostride, lse);
    int ok = fz_check_status(&e, st);
    FZ_ASSERT(fz_rows_unchanged(&q) && fz_rows_unchanged(&k) && fz_rows_unchanged(&v),
              "pa_varlen_attention wrote its query, key or value rows");
    if (!ok) {
      FZ_ASSERT(fz_rows_unchanged(&out), "pa_varlen_attention failed (%s) but wrote out",
                pa_last_error());
      FZ_ASSERT(!lse || memcmp(lse_copy, lse, lse_bytes) == 0,
                "pa_varlen_attention failed (%s) but wrote lse", pa_last_error());
    } else if (!extreme && rows > 0) {
      ref_layer rl = fz_ref_layer(&cfg);
      double *ref_out = malloc((size_t)(rows * width) * sizeof(double));
      double *ref_lse = malloc((size_t)(rows * nh) * sizeof(double));
      double *vmax = malloc((size_t)rows * sizeof(double));
      ref_varlen_attention(&rl, (ref_dtype)cfg.dtype, qp, qstride, kp, kstride, vp, vstride,
                           l.num_seqs, l.qsl, l.kv, ref_out, ref_lse, vmax);
      fz_check_attention("pa_varlen_attention", cfg.dtype, &cfg, rows, &out, lse, LSE_EXTRA,
                         ref_out, ref_lse, vmax, fz_logit_error(&cfg, 2.0, 2.0, keys));
      free(ref_out);
      free(ref_lse);
      free(vmax);
    } else {
      FZ_ASSERT(fz_rows_canaries_ok(&out), "pa_varlen_attention wrote outside its output rows");
    }
    free(lse);
    free(lse_copy);
  }
  fz_rows_free(&q);
  fz_rows_free(&k);
  fz_rows_free(&v);
  fz_rows_free(&out);
  pa_layer_destroy(layer);
  return 0;
}
