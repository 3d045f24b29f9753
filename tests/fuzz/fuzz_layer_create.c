/* pa_layer_create from arbitrary bytes: every field of the config hostile
 * in turn (counts, head sizes, NaN/inf/negative scale, window, soft-cap,
 * slopes and sinks, enums out of range, FP8 activations). An error must
 * return no layer; a layer that is made must compute what the reference
 * computes for its config (a small pa_varlen_attention call). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { LSE_EXTRA = 4 };

/* num_heads floats for slopes or sinks: exactly that many, so ASan sees a
 * read past them; a token when num_heads is not a valid count. */
static float *per_head(fz_in *in, int num_heads, int *extreme, fz_buf *buf) {
  static const float values[] = {0.0f, 0.125f, -0.5f, 1.0f, 3.0f, -2.0f, 0.03f, 6.0f};
  static const float hostile[] = {NAN, INFINITY, -INFINITY, 1e20f, -1e20f, 1e-40f};
  if (num_heads < 1 || num_heads > 65536) {
    fz_alloc_token(buf);
    return (float *)buf->p;
  }
  fz_alloc(buf, (uint64_t)num_heads * sizeof(float));
  float *p = (float *)buf->p;
  for (int h = 0; h < num_heads; h++) {
    unsigned b = h < 64 ? fz_u8(in) : 0;
    p[h] = b < 248 ? values[b % 8] : hostile[(b - 248) % 6];
    if (b >= 251 && b < 253) *extreme = 1;
  }
  return p;
}

static int all_finite(const float *p, int n) {
  for (int i = 0; i < n; i++)
    if (!isfinite(p[i])) return 0;
  return 1;
}

/* A small varlen call with the new layer, against the reference. */
static void try_layer(fz_in *in, const pa_layer *layer, const pa_layer_config *cfg) {
  fz_describe_layer(__FILE__, cfg);
  int nh = cfg->num_heads, nkv = cfg->num_kv_heads ? cfg->num_kv_heads : nh, hs = cfg->head_size;
  int64_t width = (int64_t)nh * hs, kw = (int64_t)nkv * hs;
  if (width > 4096) return;
  int32_t cu_q[3] = {0}, cu_k[3] = {0};
  int num_seqs = fz_range(in, 1, 2);
  for (int s = 0; s < num_seqs; s++) {
    cu_q[s + 1] = cu_q[s] + fz_range(in, 0, 5);
    cu_k[s + 1] = cu_k[s] + fz_range(in, 0, 40);
  }
  int64_t rows = cu_q[num_seqs], keys = cu_k[num_seqs];
  if (rows == 0) return;
  size_t act = pa_dtype_size(cfg->dtype);
  fz_rows q, k, v, out;
  int backed = fz_rows_alloc(&q, rows, 0, width, width, act, 1);
  backed &= fz_rows_alloc(&k, keys, 0, kw, kw, act, 1);
  backed &= fz_rows_alloc(&v, keys, 0, kw, kw, act, 1);
  backed &= fz_rows_alloc(&out, rows, 1, width + 1, width, act, 1);
  if (!backed) { /* more than the buffers' budget */
    fz_rows_free(&q);
    fz_rows_free(&k);
    fz_rows_free(&v);
    fz_rows_free(&out);
    return;
  }
  fz_rows_fill(&q, in->at, cfg->dtype, 2.0);
  fz_rows_fill(&k, in->at + 1, cfg->dtype, 2.0);
  fz_rows_fill(&v, in->at + 2, cfg->dtype, 2.0);
  fz_rows_fill(&out, 0, cfg->dtype, 1.0);
  size_t lse_bytes = ((size_t)rows * (size_t)nh + LSE_EXTRA) * sizeof(float);
  float *lse = malloc(lse_bytes);
  tu_fill_canary(lse, lse_bytes);
  pa_context *ctx = fz_context(in);
  if (!ctx) ctx = fz_context_other(NULL);
  pa_status st = pa_varlen_attention(ctx, layer, q.buf.p, width, k.buf.p, kw, v.buf.p, kw, num_seqs,
                                     cu_q, cu_k, out.buf.p, width + 1, lse);
  FZ_ASSERT(st == PA_OK, "pa_varlen_attention failed with a fresh layer: %s", pa_last_error());
  ref_layer rl = fz_ref_layer(cfg);
  double *ref_out = malloc((size_t)(rows * width) * sizeof(double));
  double *ref_lse = malloc((size_t)(rows * nh) * sizeof(double));
  double *vmax = malloc((size_t)rows * sizeof(double));
  ref_varlen_attention(&rl, (ref_dtype)cfg->dtype, q.buf.p, width, k.buf.p, kw, v.buf.p, kw,
                       num_seqs, cu_q, cu_k, ref_out, ref_lse, vmax);
  fz_check_attention("pa_layer_create", cfg->dtype, cfg, rows, &out, lse, LSE_EXTRA, ref_out,
                     ref_lse, vmax, fz_logit_error(cfg, 2.0, 2.0, keys));
  free(ref_out);
  free(ref_lse);
  free(vmax);
  free(lse);
  fz_rows_free(&q);
  fz_rows_free(&k);
  fz_rows_free(&v);
  fz_rows_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  int extreme = 0;
  pa_layer_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.num_heads = fz_int(FZ_EDGY(&in, 1, 8, 0, -1, 65536, 65537, INT32_MIN, INT32_MAX, 12));
  cfg.num_kv_heads = fz_int(FZ_EDGY(&in, 0, 8, -1, INT32_MIN, INT32_MAX, 65536, 3));
  cfg.head_size = fz_int(FZ_EDGY(&in, 1, 40, 0, -1, 1024, 1025, INT32_MAX, 64, 128, 256));
  cfg.scale = fz_one_in(&in, 3) ? 0.0f : fz_scale(&in, &extreme);
  fz_buf slopes, sinks;
  memset(&slopes, 0, sizeof slopes);
  memset(&sinks, 0, sizeof sinks);
  if (fz_one_in(&in, 3)) cfg.alibi_slopes = per_head(&in, cfg.num_heads, &extreme, &slopes);
  if (fz_one_in(&in, 3)) cfg.sinks = per_head(&in, cfg.num_heads, &extreme, &sinks);
  cfg.sliding_window = fz_int(FZ_EDGY(&in, 0, 30, -1, INT32_MIN, INT32_MAX, 0, 0, 0));
  cfg.logits_soft_cap = fz_one_in(&in, 2) ? 0.0f : fz_scale(&in, &extreme) * 10.0f;
  cfg.attn_type = (pa_attn_type)fz_int(FZ_EDGY(&in, 0, 3, -1, 4, INT32_MAX, INT32_MIN));
  cfg.dtype = (pa_dtype)fz_int(FZ_EDGY(&in, 0, 2, 3, 4, 5, -1, INT32_MAX));
  int null_config = fz_one_in(&in, 48), null_out = fz_one_in(&in, 48);
  if (!isfinite(cfg.logits_soft_cap * 0.1f)) extreme = 1;

  fz_expect e = {"pa_layer_create", 0, 0};
  const pa_status inv = PA_ERR_INVALID_ARGUMENT;
  fz_need(&e, null_config || null_out, inv);
  int nh = cfg.num_heads, nkv = cfg.num_kv_heads;
  fz_need(&e, nh < 1 || nh > 65536, inv);
  fz_need(&e, nkv < 0 || (nh >= 1 && nkv > nh) || (nkv > 0 && nh % nkv != 0), inv);
  fz_need(&e, cfg.head_size < 1 || cfg.head_size > 1024, inv);
  fz_need(&e, !isfinite(cfg.scale) || cfg.scale < 0.0f, inv);
  fz_need(&e, cfg.sliding_window < 0, inv);
  fz_need(&e, !isfinite(cfg.logits_soft_cap) || cfg.logits_soft_cap < 0.0f, inv);
  fz_need(&e, (int)cfg.attn_type < 0 || (int)cfg.attn_type > 3, inv);
  fz_need(&e, (int)cfg.dtype < 0 || (int)cfg.dtype > 4, inv);
  fz_need(&e, cfg.dtype == PA_FP8_E4M3 || cfg.dtype == PA_FP8_E5M2, PA_ERR_UNSUPPORTED);
  if (nh >= 1 && nh <= 65536) {
    fz_need(&e, cfg.alibi_slopes && !all_finite(cfg.alibi_slopes, nh), inv);
    fz_need(&e, cfg.sinks && !all_finite(cfg.sinks, nh), inv);
  }
  /* A soft-cap whose logits reach f32's limits is as legal as any. */
  if (cfg.logits_soft_cap > 0 && cfg.logits_soft_cap < 1e-6f) extreme = 1;

  pa_layer *layer = NULL;
  fz_plant_stale_message();
  pa_status st = pa_layer_create(null_config ? NULL : &cfg, null_out ? NULL : &layer);
  if (fz_check_status(&e, st)) {
    FZ_ASSERT(layer != NULL, "pa_layer_create returned ok and no layer");
    /* The layer copied slopes and sinks: NaN scribbled over the caller's
     * arrays after creation must change nothing. */
    int heads = cfg.num_heads;
    float *kept[2] = {NULL, NULL};
    fz_buf *arrays[2] = {&slopes, &sinks};
    const float **fields[2] = {&cfg.alibi_slopes, &cfg.sinks};
    for (int i = 0; i < 2; i++) {
      if (!*fields[i]) continue;
      kept[i] = (float *)fz_copy(*fields[i], (size_t)heads * sizeof(float));
      memset(arrays[i]->p, 0xff, (size_t)heads * sizeof(float));
      *fields[i] = kept[i];
    }
    if (!extreme) try_layer(&in, layer, &cfg);
    free(kept[0]);
    free(kept[1]);
    pa_layer_destroy(layer);
  } else {
    FZ_ASSERT(layer == NULL, "pa_layer_create failed (%s) but returned a layer", pa_last_error());
  }
  fz_free(&slopes);
  fz_free(&sinks);
  return 0;
}
