/*
 * The reference: codecs from the bit definitions, attention in double.
 * Written for clarity, not speed; see reference.h.
 */
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- codecs -------------------------------------------------------------- */

/* A small binary float format: sign, exp_bits, man_bits. */
typedef struct fmt {
  int exp_bits;
  int man_bits;
  int bias;
  int ieee_specials;   /* all-ones exponent is inf (mantissa 0) or NaN; else only 0x7F is NaN */
  int saturate;        /* overflow and infinity give the largest finite value */
  unsigned max_finite; /* code of the largest finite magnitude */
  unsigned nan_code;   /* what a NaN encodes to (sign added) */
  float *values;       /* every code, decoded: filled on first use */
  int ready;
} fmt;

static float f16_values[1 << 16], bf16_values[1 << 16], e4m3_values[1 << 8], e5m2_values[1 << 8];
/* The tables only cache fmt_decode so that the tests stay fast; they are
 * filled on first use, which assumes the tests call the codecs from one
 * thread. */
static fmt FMT_F16 = {5, 10, 15, 1, 0, 0x7BFFu, 0x7E00u, f16_values, 0};
static fmt FMT_BF16 = {8, 7, 127, 1, 0, 0x7F7Fu, 0x7FC0u, bf16_values, 0};
static fmt FMT_E4M3 = {4, 3, 7, 0, 1, 0x7Eu, 0x7Fu, e4m3_values, 0};
static fmt FMT_E5M2 = {5, 2, 15, 1, 1, 0x7Bu, 0x7Eu, e5m2_values, 0};

/* (-1)^s * 2^(e - bias) * (1 + m / 2^M), or the subnormal / special cases. */
static double fmt_decode(const fmt *f, unsigned code) {
  unsigned sign = (code >> (f->exp_bits + f->man_bits)) & 1u;
  unsigned e = (code >> f->man_bits) & ((1u << f->exp_bits) - 1u);
  unsigned m = code & ((1u << f->man_bits) - 1u);
  unsigned e_ones = (1u << f->exp_bits) - 1u;
  unsigned m_ones = (1u << f->man_bits) - 1u;
  double mag;
  if (f->ieee_specials && e == e_ones) {
    mag = m == 0 ? INFINITY : NAN;
  } else if (!f->ieee_specials && e == e_ones && m == m_ones) {
    mag = NAN;
  } else if (e == 0) {
    mag = ldexp((double)m, 1 - f->bias - f->man_bits);
  } else {
    mag = ldexp((double)((1u << f->man_bits) + m), (int)e - f->bias - f->man_bits);
  }
  return sign ? -mag : mag;
}

static const float *fmt_values(fmt *f) {
  if (!f->ready) {
    unsigned n = 1u << (1 + f->exp_bits + f->man_bits);
    for (unsigned c = 0; c < n; c++) f->values[c] = (float)fmt_decode(f, c);
    f->ready = 1;
  }
  return f->values;
}

/* Round to nearest, ties to even, by searching the (monotonic) positive
 * codes: obviously right, and fast enough with the table. */
static unsigned fmt_encode(fmt *f, float x) {
  const float *val = fmt_values(f);
  unsigned sign = signbit(x) ? 1u << (f->exp_bits + f->man_bits) : 0u;
  if (isnan(x)) return sign | f->nan_code;
  double a = fabs((double)x);
  double max = val[f->max_finite];
  if (a >= max) {
    if (f->saturate || a == max) return sign | f->max_finite;
    /* IEEE overflow: round against the next power of two, which stands for
     * infinity; max_finite's mantissa is odd, so a tie goes to infinity. */
    double next = ldexp(1.0, (int)((1u << f->exp_bits) - 2u) - f->bias + 1);
    if (a >= 0.5 * (max + next)) return sign | (f->max_finite + 1u);
    return sign | f->max_finite;
  }
  /* The largest code whose value is <= a. */
  unsigned lo = 0, hi = f->max_finite;
  while (lo < hi) {
    unsigned mid = lo + (hi - lo + 1u) / 2u;
    if ((double)val[mid] <= a)
      lo = mid;
    else
      hi = mid - 1u;
  }
  double below = val[lo];
  if (below == a) return sign | lo;
  /* a < max, so lo + 1 is finite. Near a tie both values are within a factor
   * of two of a, so the subtractions are exact (Sterbenz). */
  double d_lo = a - below;
  double d_hi = (double)val[lo + 1u] - a;
  unsigned code;
  if (d_lo < d_hi)
    code = lo;
  else if (d_hi < d_lo)
    code = lo + 1u;
  else
    code = (lo & 1u) ? lo + 1u : lo;
  return sign | code;
}

float ref_f16_decode(uint16_t bits) { return fmt_values(&FMT_F16)[bits]; }
uint16_t ref_f16_encode(float x) { return (uint16_t)fmt_encode(&FMT_F16, x); }
float ref_bf16_decode(uint16_t bits) { return fmt_values(&FMT_BF16)[bits]; }
uint16_t ref_bf16_encode(float x) { return (uint16_t)fmt_encode(&FMT_BF16, x); }
float ref_e4m3_decode(uint8_t bits) { return fmt_values(&FMT_E4M3)[bits]; }
uint8_t ref_e4m3_encode(float x) { return (uint8_t)fmt_encode(&FMT_E4M3, x); }
float ref_e5m2_decode(uint8_t bits) { return fmt_values(&FMT_E5M2)[bits]; }
uint8_t ref_e5m2_encode(float x) { return (uint8_t)fmt_encode(&FMT_E5M2, x); }

const char *ref_dtype_name(ref_dtype t) {
  switch (t) {
    case REF_F32: return "f32";
    case REF_F16: return "f16";
    case REF_BF16: return "bf16";
    case REF_E4M3: return "fp8_e4m3";
    case REF_E5M2: return "fp8_e5m2";
  }
  return "?";
}

size_t ref_dtype_size(ref_dtype t) {
  switch (t) {
    case REF_F32: return 4;
    case REF_F16:
    case REF_BF16: return 2;
    case REF_E4M3:
    case REF_E5M2: return 1;
  }
  return 0;
}

float ref_load(const void *base, int64_t i, ref_dtype t) {
  const unsigned char *b = base;
  switch (t) {
    case REF_F32: {
      float x;
      memcpy(&x, b + 4 * i, 4);
      return x;
    }
    case REF_F16:
    case REF_BF16: {
      uint16_t h;
      memcpy(&h, b + 2 * i, 2);
      return t == REF_F16 ? ref_f16_decode(h) : ref_bf16_decode(h);
    }
    case REF_E4M3: return ref_e4m3_decode(b[i]);
    case REF_E5M2: return ref_e5m2_decode(b[i]);
  }
  return NAN;
}

void ref_store(void *base, int64_t i, ref_dtype t, float x) {
  unsigned char *b = base;
  switch (t) {
    case REF_F32: memcpy(b + 4 * i, &x, 4); break;
    case REF_F16:
    case REF_BF16: {
      uint16_t h = t == REF_F16 ? ref_f16_encode(x) : ref_bf16_encode(x);
      memcpy(b + 2 * i, &h, 2);
      break;
    }
    case REF_E4M3: b[i] = ref_e4m3_encode(x); break;
    case REF_E5M2: b[i] = ref_e5m2_encode(x); break;
  }
}

float ref_round(float x, ref_dtype t) {
  unsigned char buf[4];
  ref_store(buf, 0, t, x);
  return ref_load(buf, 0, t);
}

/* ---- attention ----------------------------------------------------------- */

void ref_build_mask(const ref_layer *layer, int q_len, int k_len, unsigned char *mask) {
  int w = layer->sliding_window;
  for (int r = 0; r < q_len; r++) {
    /* Query positions are aligned to the end of the keys. */
    long i = (long)k_len - q_len + r;
    for (int j = 0; j < k_len; j++) {
      int keep = 1;
      if (layer->attn_type == REF_DECODER) keep = j <= i;
      if (w > 0) {
        if (layer->attn_type == REF_ENCODER_ONLY)
          keep = keep && labs(i - j) < w;
        else
          keep = keep && j > i - w && j <= i;
      }
      mask[(size_t)r * (size_t)k_len + (size_t)j] = (unsigned char)keep;
    }
  }
}

void ref_attention_seq(const ref_layer *layer, int q_len, int k_len, const double *q,
                       const double *k, const double *v, double *out, double *lse) {
  int nh = layer->num_heads, nkv = layer->num_kv_heads, d = layer->head_size;
  int group = nh / nkv;
  size_t qw = (size_t)nh * (size_t)d, kw = (size_t)nkv * (size_t)d;
  unsigned char *mask = malloc((size_t)q_len * (size_t)k_len + 1);
  double *s = malloc(((size_t)k_len + 1) * sizeof(double));
  if (!mask || !s) abort();
  ref_build_mask(layer, q_len, k_len, mask);
  for (int r = 0; r < q_len; r++) {
    long i = (long)k_len - q_len + r;
    const unsigned char *mrow = mask + (size_t)r * (size_t)k_len;
    for (int h = 0; h < nh; h++) {
      int kvh = h / group;
      const double *qv = q + (size_t)r * qw + (size_t)h * (size_t)d;
      double *o = out + (size_t)r * qw + (size_t)h * (size_t)d;
      double m = -INFINITY;
      int seen = 0;
      for (int j = 0; j < k_len; j++) {
        if (!mrow[j]) continue;
        const double *kv = k + (size_t)j * kw + (size_t)kvh * (size_t)d;
        double dot = 0;
        for (int c = 0; c < d; c++) dot += qv[c] * kv[c];
        double x = layer->scale * dot;
        if (layer->soft_cap > 0) x = layer->soft_cap * tanh(x / layer->soft_cap);
        if (layer->alibi_slopes) x += (double)layer->alibi_slopes[h] * (double)(j - i);
        s[j] = x;
        if (x > m) m = x;
        seen++;
      }
      for (int c = 0; c < d; c++) o[c] = 0;
      if (!seen) {
        /* The header: no key at all means zeros and -inf, sink or not. */
        lse[(size_t)r * (size_t)nh + (size_t)h] = -INFINITY;
        continue;
      }
      double sink = layer->sinks ? (double)layer->sinks[h] : -INFINITY;
      if (sink > m) m = sink;
      double denom = layer->sinks ? exp(sink - m) : 0.0;
      for (int j = 0; j < k_len; j++) {
        if (!mrow[j]) continue;
        double p = exp(s[j] - m);
        denom += p;
        const double *vv = v + (size_t)j * kw + (size_t)kvh * (size_t)d;
        for (int c = 0; c < d; c++) o[c] += p * vv[c];
      }
      for (int c = 0; c < d; c++) o[c] /= denom;
      lse[(size_t)r * (size_t)nh + (size_t)h] = m + log(denom);
    }
  }
  free(mask);
  free(s);
}

/* Written from the header's description of pa_kv_layout, not from the
 * library's code: a tiled tile is a sequence of groups (16 tokens of keys,
 * 16 elements of values), each group a sequence of 32-element rows, each
 * row 16 pairs of two adjacent elements (keys) or two adjacent tokens
 * (values). */
int64_t ref_tile_offset(ref_layout layout, int side, int block_size, int head_size, int t, int e) {
  if (layout == REF_ROWS) return (int64_t)t * head_size + e;
  enum { GROUP = 16 };
  if (side == 0) {
    int64_t group = t / GROUP, row = e / 2, column = t % GROUP, pair = e % 2;
    return group * GROUP * head_size + row * 2 * GROUP + column * 2 + pair;
  }
  int64_t group = e / GROUP, row = t / 2, column = e % GROUP, pair = t % 2;
  return group * GROUP * block_size + row * 2 * GROUP + column * 2 + pair;
}

int64_t ref_cache_index(const ref_cache *cache, int side, int64_t b, int h, int t, int c) {
  int64_t tile = (int64_t)cache->block_size * cache->head_size;
  int64_t head_stride = cache->head_stride ? cache->head_stride : tile;
  int64_t block_stride = cache->block_stride ? cache->block_stride : cache->num_kv_heads * tile;
  return b * block_stride + h * head_stride +
         ref_tile_offset(cache->layout, side, cache->block_size, cache->head_size, t, c);
}

void ref_gather_paged(const ref_cache *cache, const int32_t *block_table_row, int seq_len,
                      double *k, double *v) {
  int bs = cache->block_size, nkv = cache->num_kv_heads, d = cache->head_size;
  int fp8 = cache->dtype == REF_E4M3 || cache->dtype == REF_E5M2;
  double ks = fp8 ? cache->k_scale : 1.0, vs = fp8 ? cache->v_scale : 1.0;
  for (int t = 0; t < seq_len; t++) {
    int64_t block = block_table_row[t / bs];
    int offset = t % bs;
    for (int h = 0; h < nkv; h++) {
      for (int c = 0; c < d; c++) {
        size_t at = ((size_t)t * (size_t)nkv + (size_t)h) * (size_t)d + (size_t)c;
        k[at] = ks * (double)ref_load(cache->key, ref_cache_index(cache, 0, block, h, offset, c),
                                      cache->dtype);
        v[at] = vs * (double)ref_load(cache->value, ref_cache_index(cache, 1, block, h, offset, c),
                                      cache->dtype);
      }
    }
  }
}

void ref_load_rows(const void *base, int64_t stride, ref_dtype t, int64_t first, int64_t rows,
                   int width, double *dst) {
  for (int64_t r = 0; r < rows; r++)
    for (int c = 0; c < width; c++)
      dst[r * width + c] = (double)ref_load(base, (first + r) * stride + c, t);
}

static double max_abs(const double *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++)
    if (fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

/* Runs one sequence whose K/V are already in doubles, writing its rows of
 * the batch outputs. */
static void run_seq(const ref_layer *layer, ref_dtype act, const void *query, int64_t query_stride,
                    int64_t q0, int q_len, int k_len, const double *k, const double *v, double *out,
                    double *lse, double *vmax) {
  size_t qw = (size_t)layer->num_heads * (size_t)layer->head_size;
  size_t kw = (size_t)layer->num_kv_heads * (size_t)layer->head_size;
  double *q = malloc((size_t)q_len * qw * sizeof(double) + 1);
  if (!q) abort();
  ref_load_rows(query, query_stride, act, q0, q_len, (int)qw, q);
  ref_attention_seq(layer, q_len, k_len, q, k, v, out + (size_t)q0 * qw,
                    lse + (size_t)q0 * (size_t)layer->num_heads);
  if (vmax) {
    double m = max_abs(v, (size_t)k_len * kw);
    for (int r = 0; r < q_len; r++) vmax[q0 + r] = m;
  }
  free(q);
}

void ref_paged_attention(const ref_layer *layer, ref_dtype act, const void *query,
                         int64_t query_stride, const ref_cache *cache, int num_seqs,
                         const int32_t *query_start_loc, const int32_t *seq_lens,
                         const int32_t *block_tables, int block_table_stride, double *out,
                         double *lse, double *vmax) {
  size_t kw = (size_t)cache->num_kv_heads * (size_t)cache->head_size;
  for (int s = 0; s < num_seqs; s++) {
    int q0 = query_start_loc[s], q_len = query_start_loc[s + 1] - q0, k_len = seq_lens[s];
    double *k = malloc((size_t)k_len * kw * sizeof(double) + 1);
    double *v = malloc((size_t)k_len * kw * sizeof(double) + 1);
    if (!k || !v) abort();
    ref_gather_paged(cache, block_tables + (size_t)s * (size_t)block_table_stride, k_len, k, v);
    run_seq(layer, act, query, query_stride, q0, q_len, k_len, k, v, out, lse, vmax);
    free(k);
    free(v);
  }
}

void ref_varlen_attention(const ref_layer *layer, ref_dtype act, const void *query,
                          int64_t query_stride, const void *key, int64_t key_stride,
                          const void *value, int64_t value_stride, int num_seqs,
                          const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k, double *out,
                          double *lse, double *vmax) {
  int kw = layer->num_kv_heads * layer->head_size;
  for (int s = 0; s < num_seqs; s++) {
    int q0 = cu_seqlens_q[s], q_len = cu_seqlens_q[s + 1] - q0;
    int k0 = cu_seqlens_k[s], k_len = cu_seqlens_k[s + 1] - k0;
    double *k = malloc((size_t)k_len * (size_t)kw * sizeof(double) + 1);
    double *v = malloc((size_t)k_len * (size_t)kw * sizeof(double) + 1);
    if (!k || !v) abort();
    ref_load_rows(key, key_stride, act, k0, k_len, kw, k);
    ref_load_rows(value, value_stride, act, k0, k_len, kw, v);
    run_seq(layer, act, query, query_stride, q0, q_len, k_len, k, v, out, lse, vmax);
    free(k);
    free(v);
  }
}

/* ---- merging partial states ---------------------------------------------- */

void ref_merge_states(int64_t num_rows, int num_heads, int head_size, ref_dtype t,
                      const void *out_a, int64_t a_stride, const float *lse_a, const void *out_b,
                      int64_t b_stride, const float *lse_b, double *out, double *lse) {
  int64_t width = (int64_t)num_heads * head_size;
  for (int64_t r = 0; r < num_rows; r++) {
    for (int h = 0; h < num_heads; h++) {
      double la = lse_a[r * num_heads + h], lb = lse_b[r * num_heads + h];
      double *o = out + r * width + (int64_t)h * head_size;
      double m = la > lb ? la : lb;
      /* e^la + e^lb = e^m (e^(la - m) + e^(lb - m)); an -inf side weighs 0. */
      double wa = la == -INFINITY ? 0.0 : exp(la - m);
      double wb = lb == -INFINITY ? 0.0 : exp(lb - m);
      double denom = wa + wb;
      for (int c = 0; c < head_size; c++) {
        int64_t col = (int64_t)h * head_size + c;
        double sum = 0;
        if (wa > 0) sum += wa * ref_load(out_a, r * a_stride + col, t);
        if (wb > 0) sum += wb * ref_load(out_b, r * b_stride + col, t);
        o[c] = denom > 0 ? sum / denom : 0.0;
      }
      lse[r * num_heads + h] = denom > 0 ? m + log(denom) : -INFINITY;
    }
  }
}
