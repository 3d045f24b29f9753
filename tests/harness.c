#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* hx_ref_dtype and hx_ref_attn are casts. */
_Static_assert((int)PA_F32 == (int)REF_F32 && (int)PA_F16 == (int)REF_F16 &&
                   (int)PA_BF16 == (int)REF_BF16 && (int)PA_FP8_E4M3 == (int)REF_E4M3 &&
                   (int)PA_FP8_E5M2 == (int)REF_E5M2,
               "the reference's dtype enum must follow pa_dtype");
_Static_assert((int)PA_ATTN_DECODER == (int)REF_DECODER &&
                   (int)PA_ATTN_ENCODER == (int)REF_ENCODER &&
                   (int)PA_ATTN_ENCODER_ONLY == (int)REF_ENCODER_ONLY &&
                   (int)PA_ATTN_ENCODER_DECODER == (int)REF_ENCODER_DECODER,
               "the reference's attention types must follow pa_attn_type");
_Static_assert((int)PA_KV_ROWS == (int)REF_ROWS && (int)PA_KV_TILED == (int)REF_TILED,
               "the reference's layouts must follow pa_kv_layout");

/* How many mismatches of one kind are printed before only counting. */
#define HX_REPORT 6

long hx_alt_matches;
double hx_worst_ratio[3];

const char *hx_attn_name(pa_attn_type t) {
  switch (t) {
    case PA_ATTN_DECODER: return "decoder";
    case PA_ATTN_ENCODER: return "encoder";
    case PA_ATTN_ENCODER_ONLY: return "encoder_only";
    case PA_ATTN_ENCODER_DECODER: return "encoder_decoder";
  }
  return "?";
}

void *hx_alloc_rows(int64_t rows, int64_t stride, pa_dtype t) {
  return tu_malloc((size_t)(rows * stride) * ref_dtype_size(hx_ref_dtype(t)));
}

void hx_fill_rows(tu_rng *rng, void *buf, int64_t stride, int64_t rows, int width, pa_dtype t,
                  double mag) {
  ref_dtype rt = hx_ref_dtype(t);
  for (int64_t r = 0; r < rows; r++) {
    for (int c = 0; c < width; c++)
      ref_store(buf, r * stride + c, rt, (float)tu_range(rng, -mag, mag));
    for (int64_t c = width; c < stride; c++) ref_store(buf, r * stride + c, rt, NAN);
  }
}

int64_t hx_cache_elems(const pa_kv_cache *cache) {
  return cache->num_blocks * cache->block_size * cache->num_kv_heads * cache->head_size;
}

size_t hx_cache_bytes(const pa_kv_cache *cache) {
  return (size_t)hx_cache_elems(cache) * ref_dtype_size(hx_ref_dtype(cache->dtype));
}

/* Where element e of token offset t lies within its tile. */
static int64_t tile_offset(const pa_kv_cache *c, int side, int t, int e) {
  return ref_tile_offset((ref_layout)c->layout, side, c->block_size, c->head_size, t, e);
}

/* Element by element, in image order (block, head, token, dim), each to
 * where the strides and the layout put it. */
void hx_fill_cache(tu_rng *rng, const pa_kv_cache *cache, double mag, int poison) {
  ref_dtype rt = hx_ref_dtype(cache->dtype);
  int fp8 = rt == REF_E4M3 || rt == REF_E5M2;
  for (int side = 0; side < 2; side++) {
    void *p = side ? cache->value : cache->key;
    double s = fp8 ? (side ? cache->v_scale : cache->k_scale) : 1.0;
    for (int64_t b = 0; b < cache->num_blocks; b++) {
      for (int h = 0; h < cache->num_kv_heads; h++) {
        int64_t tile = hx_tile_index(cache, b, h, 0);
        for (int t = 0; t < cache->block_size; t++)
          for (int e = 0; e < cache->head_size; e++)
            ref_store(p, tile + tile_offset(cache, side, t, e), rt,
                      poison ? NAN : (float)(tu_range(rng, -mag, mag) / s));
      }
    }
  }
}

/* ---- cache layouts -------------------------------------------------------- */

const char *hx_layout_name(hx_layout layout) {
  switch (layout) {
    case HX_DENSE: return "dense";
    case HX_DENSE_EXPLICIT: return "dense_explicit";
    case HX_BLOCK_PADDED: return "block_padded";
    case HX_VLLM: return "vllm";
    case HX_VLLM_PADDED: return "vllm_padded";
    case HX_SEPARATE_PADDED: return "separate_padded";
    case HX_NUM_LAYOUTS: break;
  }
  return "?";
}

int64_t hx_tile_index(const pa_kv_cache *c, int64_t b, int h, int t) {
  int64_t tile = (int64_t)c->block_size * c->head_size;
  int64_t head_stride = c->head_stride ? c->head_stride : tile;
  int64_t block_stride = c->block_stride ? c->block_stride : c->num_kv_heads * tile;
  return b * block_stride + h * head_stride + (int64_t)t * c->head_size;
}

ref_cache hx_ref_cache(const pa_kv_cache *c) {
  ref_cache rc = {c->key,          c->value,        c->num_blocks,          c->block_size,
                  c->num_kv_heads, c->head_size,    hx_ref_dtype(c->dtype), c->k_scale,
                  c->v_scale,      c->block_stride, c->head_stride,         (ref_layout)c->layout};
  return rc;
}

int64_t hx_elem_index(const pa_kv_cache *c, int side, int64_t b, int h, int t, int e) {
  ref_cache rc = hx_ref_cache(c);
  return ref_cache_index(&rc, side, b, h, t, e);
}

int64_t hx_cache_span(const pa_kv_cache *c) {
  if (c->num_blocks == 0) return 0;
  return hx_tile_index(c, c->num_blocks - 1, c->num_kv_heads - 1, 0) +
         (int64_t)c->block_size * c->head_size;
}

static unsigned char *pad_buffer(size_t bytes) {
  unsigned char *p = tu_malloc(bytes ? bytes : 1);
  memset(p, HX_PAD_BYTE, bytes);
  return p;
}

void hx_cache_alloc(tu_rng *rng, pa_kv_cache *c, hx_layout layout, hx_cache_mem *mem) {
  memset(mem, 0, sizeof *mem);
  int64_t tile = (int64_t)c->block_size * c->head_size, heads = c->num_kv_heads;
  size_t es = ref_dtype_size(hx_ref_dtype(c->dtype));
  /* Padding of up to a tile and a bit, at least one element (drawn only
   * for the layouts that have it, so a dense case's data stays as it was). */
  int pad_limit = (int)(tile < 64 ? tile : 64) + 4;
  int64_t pad_head = 0, pad_block = 0, lead = 0, tail = 0, value_at = 0;
  if (layout == HX_BLOCK_PADDED || layout == HX_VLLM_PADDED || layout == HX_SEPARATE_PADDED) {
    pad_head = tu_int(rng, 1, pad_limit);
    pad_block = tu_int(rng, 1, pad_limit);
  }
  c->block_stride = c->head_stride = 0;
  int shared = 0;
  switch (layout) {
    case HX_DENSE: break;
    case HX_DENSE_EXPLICIT:
      c->head_stride = tile;
      c->block_stride = heads * tile;
      break;
    case HX_BLOCK_PADDED:
      c->block_stride = heads * tile + pad_block;
      tail = pad_block;
      break;
    case HX_VLLM:
      c->head_stride = 2 * tile;
      c->block_stride = heads * c->head_stride;
      value_at = tile;
      shared = 1;
      break;
    case HX_VLLM_PADDED:
      /* Each head's slot: key tile, a gap, value tile, the rest of the padding. */
      c->head_stride = 2 * tile + pad_head;
      c->block_stride = heads * c->head_stride + pad_block;
      value_at = tile + tu_int(rng, 0, (int)pad_head);
      tail = pad_block;
      shared = 1;
      break;
    case HX_SEPARATE_PADDED:
      c->head_stride = tile + pad_head;
      c->block_stride = heads * c->head_stride + pad_block;
      lead = tu_int(rng, 1, 7);
      tail = pad_block;
      break;
    case HX_NUM_LAYOUTS: break;
  }
  int64_t span = hx_cache_span(c);
  if (shared) {
    mem->bytes[0] = (size_t)(value_at + span + tail) * es;
    mem->buf[0] = pad_buffer(mem->bytes[0]);
    c->key = mem->buf[0];
    c->value = mem->buf[0] + (size_t)value_at * es;
    return;
  }
  for (int side = 0; side < 2; side++) {
    mem->bytes[side] = (size_t)(lead + span + tail) * es;
    mem->buf[side] = pad_buffer(mem->bytes[side]);
  }
  c->key = mem->buf[0] + (size_t)lead * es;
  c->value = mem->buf[1] + (size_t)lead * es;
}

void hx_cache_free(hx_cache_mem *mem) {
  free(mem->buf[0]);
  free(mem->buf[1]);
  memset(mem, 0, sizeof *mem);
}

/* Copies a side's tiles into an image in token rows (gather: `out`) or
 * back (scatter: `in`): whole tiles in PA_KV_ROWS, element by element
 * (hx_elem_index) otherwise. */
static void move_tiles(const pa_kv_cache *c, int side, unsigned char *out,
                       const unsigned char *in) {
  size_t es = ref_dtype_size(hx_ref_dtype(c->dtype));
  size_t d = (size_t)c->head_size, tile = (size_t)c->block_size * d * es;
  unsigned char *base = side ? c->value : c->key;
  for (int64_t b = 0, i = 0; b < c->num_blocks; b++) {
    for (int h = 0; h < c->num_kv_heads; h++, i++) {
      size_t image = (size_t)i * tile;
      if (c->layout == PA_KV_ROWS) {
        unsigned char *at = base + (size_t)hx_tile_index(c, b, h, 0) * es;
        if (out)
          memcpy(out + image, at, tile);
        else
          memcpy(at, in + image, tile);
        continue;
      }
      unsigned char *tile_at = base + (size_t)hx_tile_index(c, b, h, 0) * es;
      for (int t = 0; t < c->block_size; t++) {
        for (int e = 0; e < c->head_size; e++) {
          unsigned char *at = tile_at + (size_t)tile_offset(c, side, t, e) * es;
          size_t from = image + ((size_t)t * d + (size_t)e) * es;
          if (out)
            memcpy(out + from, at, es);
          else
            memcpy(at, in + from, es);
        }
      }
    }
  }
}

void hx_gather_tiles(const pa_kv_cache *c, int side, unsigned char *dense) {
  move_tiles(c, side, dense, NULL);
}

void hx_scatter_tiles(const pa_kv_cache *c, int side, const unsigned char *dense) {
  move_tiles(c, side, NULL, dense);
}

long hx_check_padding(const char *label, const pa_kv_cache *c, const hx_cache_mem *mem) {
  size_t es = ref_dtype_size(hx_ref_dtype(c->dtype)),
         tile = (size_t)c->block_size * (size_t)c->head_size * es;
  long bad = 0;
  for (int m = 0; m < 2 && mem->buf[m]; m++) {
    unsigned char *is_tile = tu_calloc(mem->bytes[m] + 1, 1);
    for (int side = 0; side < 2; side++) {
      const unsigned char *base = side ? c->value : c->key;
      if (base < mem->buf[m] || base >= mem->buf[m] + mem->bytes[m]) continue;
      size_t at = (size_t)(base - mem->buf[m]);
      for (int64_t b = 0; b < c->num_blocks; b++)
        for (int h = 0; h < c->num_kv_heads; h++)
          memset(is_tile + at + (size_t)hx_tile_index(c, b, h, 0) * es, 1, tile);
    }
    for (size_t i = 0; i < mem->bytes[m]; i++) {
      if (is_tile[i] || mem->buf[m][i] == HX_PAD_BYTE) continue;
      if (bad++ < HX_REPORT)
        TU_CHECK(0, "%s: padding byte %zu of cache buffer %d (%s layout) was written: 0x%02X",
                 label, i, m, c->head_stride || c->block_stride ? "strided" : "dense",
                 mem->buf[m][i]);
    }
    free(is_tile);
  }
  tu_checks++;
  if (bad > HX_REPORT) TU_CHECK(0, "%s: %ld padding bytes written in all", label, bad);
  return bad;
}

static int is_fp8(pa_dtype t) { return t == PA_FP8_E4M3 || t == PA_FP8_E5M2; }

void hx_expect_write(const pa_kv_cache *cache, unsigned char *exact_key, unsigned char *exact_val,
                     unsigned char *alt_key, unsigned char *alt_val, const void *key,
                     int64_t key_stride, const void *value, int64_t value_stride,
                     pa_dtype src_dtype, int64_t num_tokens, const int64_t *slot_mapping) {
  ref_dtype st = hx_ref_dtype(src_dtype), ct = hx_ref_dtype(cache->dtype);
  int nkv = cache->num_kv_heads, d = cache->head_size, bs = cache->block_size;
  for (int64_t t = 0; t < num_tokens; t++) {
    int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    int64_t block = slot / bs, offset = slot % bs;
    for (int h = 0; h < nkv; h++) {
      for (int c = 0; c < d; c++) {
        int64_t at = ((block * nkv + h) * bs + offset) * d + c;
        for (int side = 0; side < 2; side++) {
          const void *src = side ? value : key;
          int64_t stride = side ? value_stride : key_stride;
          float x = ref_load(src, t * stride + (int64_t)h * d + c, st);
          float e = x, a = x;
          if (is_fp8(cache->dtype)) {
            float s = side ? cache->v_scale : cache->k_scale;
            e = x / s;
            a = x * (1.0f / s);
          }
          ref_store(side ? exact_val : exact_key, at, ct, e);
          unsigned char *alt = side ? alt_val : alt_key;
          if (alt) ref_store(alt, at, ct, a);
        }
      }
    }
  }
}

long hx_compare_cache(const char *label, const pa_kv_cache *cache, const unsigned char *exact_key,
                      const unsigned char *exact_val, const unsigned char *alt_key,
                      const unsigned char *alt_val) {
  ref_dtype ct = hx_ref_dtype(cache->dtype);
  size_t es = ref_dtype_size(ct);
  int64_t n = hx_cache_elems(cache);
  long bad = 0;
  unsigned char *tiles = tu_malloc((size_t)n * es + 1);
  for (int side = 0; side < 2; side++) {
    hx_gather_tiles(cache, side, tiles);
    const unsigned char *got = tiles;
    const unsigned char *want = side ? exact_val : exact_key;
    const unsigned char *alt = side ? alt_val : alt_key;
    /* Fast path: the usual case is byte-identical. */
    if (memcmp(got, want, (size_t)n * es) == 0) continue;
    for (int64_t i = 0; i < n; i++) {
      const unsigned char *g = got + (size_t)i * es, *w = want + (size_t)i * es;
      if (memcmp(g, w, es) == 0) continue;
      if (alt && memcmp(g, alt + (size_t)i * es, es) == 0) {
        hx_alt_matches++;
        continue;
      }
      float gv = ref_load(got, i, ct), wv = ref_load(want, i, ct);
      if (isnan(gv) && isnan(wv)) continue;
      if (bad++ < HX_REPORT) {
        int64_t per_block = (int64_t)cache->num_kv_heads * cache->block_size * cache->head_size;
        int64_t in_block = i % per_block;
        int64_t head = in_block / ((int64_t)cache->block_size * cache->head_size);
        int64_t offset = in_block / cache->head_size % cache->block_size;
        TU_CHECK(0,
                 "%s: %scache %s block %lld head %lld offset %lld dim %lld: stored %a (bytes "
                 "0x%02X%02X), expected %a",
                 label, cache->layout == PA_KV_TILED ? "tiled " : "", side ? "value" : "key",
                 (long long)(i / per_block), (long long)head, (long long)offset,
                 (long long)(i % cache->head_size), (double)gv, es > 1 ? g[1] : 0, g[0],
                 (double)wv);
      }
    }
  }
  free(tiles);
  tu_checks++;
  if (bad > HX_REPORT) TU_CHECK(0, "%s: %ld cache elements differ in all", label, bad);
  return bad;
}

/* Tolerances. The reference is given exactly the rounded inputs the library
 * sees (q in its dtype, the cache's stored values), so what separates them is
 * f32 accumulation in the library plus one rounding of the output to its
 * dtype (relative 2^-24, 2^-11, 2^-8 for f32, f16, bf16). rtol allows a few
 * of those roundings plus the f32 error of exp and the dot products; atol
 * covers cancellation in sum p_j v_j, whose error is relative to the terms
 * (bounded by max |v|), not to the result, hence its scaling by max |v|. A
 * bf16 path may also round P to bf16 (2^-9) before the PV product, which
 * the wider bf16 atol absorbs. lse is a logarithm: its error is absolute
 * (f32 exp/log and sums give ~1e-6); 1e-3 leaves room for fast exp. */
hx_tol hx_tolerance(pa_dtype act) {
  switch (act) {
    case PA_F16: return (hx_tol){2e-3, 1e-3};
    case PA_BF16: return (hx_tol){1.6e-2, 8e-3};
    default: return (hx_tol){2e-4, 2e-5};
  }
}

static long check_canary(const char *label, const char *what, const void *p, size_t bytes) {
  size_t at = tu_find_non_canary(p, bytes);
  TU_CHECK(at == bytes, "%s: the library wrote %s (byte %zu of %zu)", label, what, at, bytes);
  return at != bytes;
}

long hx_check_outputs(const char *label, pa_dtype act, int num_heads, int head_size, int64_t rows,
                      const void *out, int64_t out_stride, int extra_rows, const float *lse,
                      int lse_extra, const double *ref_out, const double *ref_lse,
                      const double *vmax) {
  ref_dtype at = hx_ref_dtype(act);
  size_t es = ref_dtype_size(at);
  int width = num_heads * head_size;
  hx_tol tol = hx_tolerance(act);
  long bad = 0, bad_lse = 0;
  double worst = 0;
  for (int64_t r = 0; r < rows; r++) {
    for (int c = 0; c < width; c++) {
      double got = ref_load(out, r * out_stride + c, at);
      double want = ref_out[r * width + c];
      double err = fabs(got - want);
      /* A row that sees no key outputs exact zeros (the header). */
      int unseen = isinf(ref_lse[r * num_heads + c / head_size]);
      double lim = unseen ? 0.0 : tol.atol * vmax[r] + tol.rtol * fabs(want);
      if (lim > 0 && err / lim > worst) worst = err / lim;
      if (err <= lim) continue; /* also rejects NaN */
      if (bad++ < HX_REPORT)
        TU_CHECK(0, "%s: out row %lld head %d dim %d: got %.9g want %.9g (err %.3g > %.3g)", label,
                 (long long)r, c / head_size, c % head_size, got, want, err, lim);
    }
    const unsigned char *pad = (const unsigned char *)out + (size_t)(r * out_stride) * es;
    bad += check_canary(label, "the padding after an output row", pad + (size_t)width * es,
                        (size_t)(out_stride - width) * es);
    if (lse) {
      for (int h = 0; h < num_heads; h++) {
        double got = lse[r * num_heads + h], want = ref_lse[r * num_heads + h];
        int ok = isinf(want) ? got == want : fabs(got - want) <= HX_LSE_ATOL;
        if (ok) continue;
        if (bad_lse++ < HX_REPORT)
          TU_CHECK(0, "%s: lse row %lld head %d: got %.9g want %.9g", label, (long long)r, h, got,
                   want);
      }
    }
  }
  const unsigned char *after = (const unsigned char *)out + (size_t)(rows * out_stride) * es;
  bad += check_canary(label, "output rows beyond the batch", after,
                      (size_t)((int64_t)extra_rows * out_stride) * es);
  if (lse)
    bad += check_canary(label, "lse entries beyond the batch", lse + rows * num_heads,
                        (size_t)lse_extra * sizeof(float));
  if ((int)act >= 0 && (int)act < 3 && worst > hx_worst_ratio[act]) hx_worst_ratio[act] = worst;
  tu_checks++;
  if (bad > HX_REPORT)
    TU_CHECK(0, "%s: %ld output elements wrong in all (worst err/tol %.3g)", label, bad, worst);
  if (bad_lse > HX_REPORT) TU_CHECK(0, "%s: %ld lse entries wrong in all", label, bad_lse);
  return bad + bad_lse;
}
