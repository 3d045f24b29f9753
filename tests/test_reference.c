/*
 * Self-test of the reference (no library): the codecs exhaustively over every
 * code and every rounding midpoint, cross-checked against independent
 * formulations, and the attention on cases small enough to solve by hand.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "test_util.h"

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* One codec under test, through function pointers so that the exhaustive
 * loops are written once. */
typedef struct codec {
  const char *name;
  unsigned num_codes; /* 256 or 65536 */
  unsigned sign_bit;
  unsigned max_finite; /* largest finite positive code */
  int saturates;       /* encode never gives infinity */
  float (*decode)(unsigned);
  unsigned (*encode)(float);
} codec;

static float dec_f16(unsigned c) { return ref_f16_decode((uint16_t)c); }
static unsigned enc_f16(float x) { return ref_f16_encode(x); }
static float dec_bf16(unsigned c) { return ref_bf16_decode((uint16_t)c); }
static unsigned enc_bf16(float x) { return ref_bf16_encode(x); }
static float dec_e4m3(unsigned c) { return ref_e4m3_decode((uint8_t)c); }
static unsigned enc_e4m3(float x) { return ref_e4m3_encode(x); }
static float dec_e5m2(unsigned c) { return ref_e5m2_decode((uint8_t)c); }
static unsigned enc_e5m2(float x) { return ref_e5m2_encode(x); }

static const codec CODECS[] = {
    {"f16", 65536, 0x8000, 0x7BFF, 0, dec_f16, enc_f16},
    {"bf16", 65536, 0x8000, 0x7F7F, 0, dec_bf16, enc_bf16},
    {"fp8_e4m3", 256, 0x80, 0x7E, 1, dec_e4m3, enc_e4m3},
    {"fp8_e5m2", 256, 0x80, 0x7B, 1, dec_e5m2, enc_e5m2},
};

/* Every code decodes to a value that encodes back to the same code; NaN
 * stays NaN; infinities are kept (F16/BF16) or saturate (FP8). */
static void test_round_trip(const codec *c) {
  long bad = 0;
  for (unsigned code = 0; code < c->num_codes; code++) {
    float x = c->decode(code);
    unsigned back = c->encode(x);
    int ok;
    if (isnan(x))
      ok = isnan(c->decode(back));
    else if (isinf(x) && c->saturates)
      ok = back == ((code & c->sign_bit) | c->max_finite);
    else
      ok = back == code;
    if (!ok && bad++ < 5)
      TU_CHECK(0, "%s: code 0x%X decodes to %a, encodes back to 0x%X", c->name, code, x, back);
  }
  TU_CHECK(bad == 0, "%s: %ld codes do not round-trip", c->name, bad);
}

/* Between every two adjacent finite codes: the midpoint goes to the even
 * code, one float below it to the lower, one above to the upper. Also for
 * the negative half. */
static void test_midpoints(const codec *c) {
  long bad = 0;
  for (unsigned code = 0; code < c->max_finite; code++) {
    float lo = c->decode(code), hi = c->decode(code + 1);
    float mid = (float)(0.5 * ((double)lo + (double)hi)); /* exact: one more bit */
    TU_CHECK(0.5 * ((double)lo + (double)hi) == (double)mid, "%s: midpoint not exact", c->name);
    unsigned even = (code & 1u) ? code + 1 : code;
    for (int neg = 0; neg < 2; neg++) {
      float sg = neg ? -1.0f : 1.0f;
      unsigned sb = neg ? c->sign_bit : 0u;
      unsigned e_mid = c->encode(sg * mid);
      unsigned e_below = c->encode(sg * nextafterf(mid, 0.0f));
      unsigned e_above = c->encode(sg * nextafterf(mid, INFINITY));
      int ok = e_mid == (sb | even) && e_below == (sb | code) && e_above == (sb | (code + 1));
      if (!ok && bad++ < 5)
        TU_CHECK(0, "%s: between 0x%X (%a) and 0x%X (%a): mid->0x%X below->0x%X above->0x%X",
                 c->name, code, lo, code + 1, hi, e_mid, e_below, e_above);
    }
  }
  TU_CHECK(bad == 0, "%s: %ld midpoints round wrongly", c->name, bad);
}

static void test_known_values(void) {
  /* Values straight from the format definitions. */
  TU_CHECK(ref_f16_decode(0x3C00) == 1.0f, "f16 1.0");
  TU_CHECK(ref_f16_decode(0xC000) == -2.0f, "f16 -2.0");
  TU_CHECK(ref_f16_decode(0x7BFF) == 65504.0f, "f16 max");
  TU_CHECK(ref_f16_decode(0x0001) == 0x1p-24f, "f16 min subnormal");
  TU_CHECK(ref_f16_decode(0x0400) == 0x1p-14f, "f16 min normal");
  TU_CHECK(isinf(ref_f16_decode(0x7C00)) && ref_f16_decode(0xFC00) < 0, "f16 inf");
  TU_CHECK(isnan(ref_f16_decode(0x7C01)) && isnan(ref_f16_decode(0xFE00)), "f16 nan");
  TU_CHECK(ref_bf16_decode(0x3F80) == 1.0f, "bf16 1.0");
  TU_CHECK(ref_bf16_decode(0x7F7F) == 0x1.FEp127f, "bf16 max");
  TU_CHECK(ref_bf16_decode(0x0001) == 0x1p-133f, "bf16 min subnormal");
  TU_CHECK(ref_e4m3_decode(0x38) == 1.0f, "e4m3 1.0");
  TU_CHECK(ref_e4m3_decode(0x7E) == 448.0f && ref_e4m3_decode(0xFE) == -448.0f, "e4m3 max");
  TU_CHECK(ref_e4m3_decode(0x78) == 256.0f, "e4m3 0x78 is 256 (exponent 15 is finite)");
  TU_CHECK(ref_e4m3_decode(0x01) == 0x1p-9f, "e4m3 min subnormal");
  TU_CHECK(ref_e4m3_decode(0x08) == 0x1p-6f, "e4m3 min normal");
  TU_CHECK(isnan(ref_e4m3_decode(0x7F)) && isnan(ref_e4m3_decode(0xFF)), "e4m3 nan");
  TU_CHECK(ref_e5m2_decode(0x3C) == 1.0f, "e5m2 1.0");
  TU_CHECK(ref_e5m2_decode(0x7B) == 57344.0f, "e5m2 max");
  TU_CHECK(ref_e5m2_decode(0x01) == 0x1p-16f, "e5m2 min subnormal");
  TU_CHECK(isinf(ref_e5m2_decode(0x7C)) && isnan(ref_e5m2_decode(0x7D)), "e5m2 inf/nan");

  /* Overflow: F16/BF16 go to infinity (ties to even), FP8 saturates. */
  TU_CHECK(ref_f16_encode(65519.996f) == 0x7BFF, "f16 just below the overflow midpoint");
  TU_CHECK(ref_f16_encode(65520.0f) == 0x7C00, "f16 overflow midpoint ties to inf");
  TU_CHECK(ref_f16_encode(-1e10f) == 0xFC00, "f16 overflow");
  TU_CHECK(ref_f16_encode(INFINITY) == 0x7C00, "f16 inf");
  TU_CHECK(ref_bf16_encode(f32_from_bits(0x7F7F7FFF)) == 0x7F7F, "bf16 below overflow mid");
  TU_CHECK(ref_bf16_encode(f32_from_bits(0x7F7F8000)) == 0x7F80, "bf16 overflow midpoint");
  TU_CHECK(ref_bf16_encode(FLT_MAX) == 0x7F80, "bf16 FLT_MAX overflows");
  TU_CHECK(ref_e4m3_encode(464.0f) == 0x7E, "e4m3 464");
  TU_CHECK(ref_e4m3_encode(1e30f) == 0x7E, "e4m3 saturates");
  TU_CHECK(ref_e4m3_encode(INFINITY) == 0x7E && ref_e4m3_encode(-INFINITY) == 0xFE,
           "e4m3 inf saturates");
  TU_CHECK(ref_e5m2_encode(61440.0f) == 0x7B && ref_e5m2_encode(1e10f) == 0x7B, "e5m2 saturates");
  TU_CHECK(ref_e5m2_encode(-INFINITY) == 0xFB, "e5m2 -inf saturates");
  TU_CHECK(isnan(ref_e4m3_decode(ref_e4m3_encode(NAN))), "e4m3 NaN");
  TU_CHECK(isnan(ref_e5m2_decode(ref_e5m2_encode(-NAN))), "e5m2 NaN");
  TU_CHECK(isnan(ref_f16_decode(ref_f16_encode(NAN))), "f16 NaN");
  TU_CHECK(isnan(ref_bf16_decode(ref_bf16_encode(NAN))), "bf16 NaN");

  /* Signed zero and underflow keep the sign. */
  TU_CHECK(ref_f16_encode(-0.0f) == 0x8000 && ref_e4m3_encode(-0.0f) == 0x80, "-0");
  TU_CHECK(ref_f16_encode(-0x1p-26f) == 0x8000, "f16 underflow to -0");
  TU_CHECK(ref_e4m3_encode(0x1p-10f) == 0x00, "e4m3 half the min subnormal ties to 0");
  TU_CHECK(ref_e4m3_encode(0x1.8p-9f) == 0x02, "e4m3 1.5 min subnormal ties to even (2)");
  TU_CHECK(ref_e5m2_encode(0x1p-17f) == 0x00 && ref_e5m2_encode(0x1.1p-17f) == 0x01,
           "e5m2 around half the min subnormal");
}

/* bf16 by the classic bit trick (add 0x7FFF plus the lsb, truncate): a
 * formulation independent of the search. */
static uint16_t bf16_bit_trick(float x) {
  uint32_t u = f32_bits(x);
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void test_cross_checks(void) {
  tu_rng rng;
  tu_rng_seed(&rng, 12345);
  long bad_bf16 = 0, bad_f16 = 0;
  for (long n = 0; n < 400000; n++) {
    /* Random bit patterns cover every exponent; random small values cover
     * the subnormal and rounding-heavy ranges of the narrow formats. */
    float x = n & 1 ? f32_from_bits((uint32_t)tu_next(&rng))
                    : (float)tu_range(&rng, -70000.0, 70000.0) * ldexpf(1.0f, tu_int(&rng, -30, 0));
    if (isnan(x)) continue;
    if (ref_bf16_encode(x) != bf16_bit_trick(x) && bad_bf16++ < 5)
      TU_CHECK(0, "bf16 encode %a: 0x%04X, bit trick 0x%04X", x, ref_bf16_encode(x),
               bf16_bit_trick(x));
#if defined(__FLT16_MANT_DIG__)
    /* The compiler's own conversion (RNE, IEEE overflow) where it has one. */
    _Float16 h = (_Float16)x;
    uint16_t hb;
    memcpy(&hb, &h, 2);
    if (ref_f16_encode(x) != hb && bad_f16++ < 5)
      TU_CHECK(0, "f16 encode %a: 0x%04X, compiler 0x%04X", x, ref_f16_encode(x), hb);
#endif
  }
  TU_CHECK(bad_bf16 == 0, "bf16: %ld mismatches with the bit trick", bad_bf16);
  TU_CHECK(bad_f16 == 0, "f16: %ld mismatches with _Float16", bad_f16);
  /* BF16 decoding is the top half of an f32. */
  long bad = 0;
  for (uint32_t c = 0; c < 65536; c++) {
    float a = ref_bf16_decode((uint16_t)c), b = f32_from_bits(c << 16);
    if (!(a == b || (isnan(a) && isnan(b))) || signbit(a) != signbit(b)) bad++;
  }
  TU_CHECK(bad == 0, "bf16 decode differs from the f32 top half in %ld codes", bad);
}

static int close_to(double a, double b, double tol) { return fabs(a - b) <= tol; }

static void check_mask(const ref_layer *l, int q_len, int k_len, const char *expect,
                       const char *what) {
  unsigned char m[64];
  ref_build_mask(l, q_len, k_len, m);
  char got[65];
  for (int i = 0; i < q_len * k_len; i++) got[i] = m[i] ? '1' : '0';
  got[q_len * k_len] = 0;
  TU_CHECK(strcmp(got, expect) == 0, "mask %s: got %s want %s", what, got, expect);
}

static void test_masks(void) {
  ref_layer l = {1, 1, 1, 1.0, NULL, 0, 0, NULL, REF_DECODER};
  /* 3 queries at positions 2, 3, 4 over 5 keys. */
  check_mask(&l, 3, 5, "111001111011111", "decoder causal");
  l.sliding_window = 2;
  check_mask(&l, 3, 5, "011000011000011", "decoder window 2");
  l.sliding_window = 9;
  check_mask(&l, 3, 5, "111001111011111", "decoder window > context");
  l.sliding_window = 0;
  /* 4 queries over 2 keys: positions -2, -1, 0, 1; the first two see nothing. */
  check_mask(&l, 4, 2, "00001011", "decoder q_len > k_len");
  l.attn_type = REF_ENCODER;
  check_mask(&l, 2, 3, "111111", "encoder");
  l.sliding_window = 2;
  check_mask(&l, 3, 3, "100110011", "encoder window keeps i-w < j <= i");
  l.attn_type = REF_ENCODER_DECODER;
  check_mask(&l, 2, 3, "110011", "encoder-decoder window (positions 1, 2)");
  l.sliding_window = 0;
  check_mask(&l, 2, 3, "111111", "encoder-decoder");
  l.attn_type = REF_ENCODER_ONLY;
  l.sliding_window = 2;
  check_mask(&l, 4, 4, "1100111001110011", "encoder-only symmetric window");
}

static void test_attention_by_hand(void) {
  /* Two heads sharing one KV head (GQA 2), head_size 2, three keys. */
  ref_layer l = {2, 1, 2, 0.5, NULL, 0, 0, NULL, REF_ENCODER};
  double q[4] = {1, 0, 0, 0};        /* head 0 looks along x, head 1 sees all equal */
  double k[6] = {2, 0, 0, 0, -2, 0}; /* logits for head 0: 1, 0, -1 */
  double v[6] = {1, 10, 2, 20, 3, 30};
  double out[4], lse[2];
  ref_attention_seq(&l, 1, 3, q, k, v, out, lse);
  double e1 = exp(1.0), e0 = 1.0, em = exp(-1.0), z = e1 + e0 + em;
  TU_CHECK(close_to(out[0], (1 * e1 + 2 * e0 + 3 * em) / z, 1e-12), "head0 out %g", out[0]);
  TU_CHECK(close_to(out[1], (10 * e1 + 20 * e0 + 30 * em) / z, 1e-12), "head0 out1");
  TU_CHECK(close_to(lse[0], log(z), 1e-12), "head0 lse");
  TU_CHECK(close_to(out[2], 2.0, 1e-12) && close_to(out[3], 20.0, 1e-12), "head1 mean");
  TU_CHECK(close_to(lse[1], log(3.0), 1e-12), "head1 lse");

  /* A sink joins the denominator only. */
  float sinks[2] = {0.0f, 1.0f};
  l.sinks = sinks;
  ref_attention_seq(&l, 1, 3, q, k, v, out, lse);
  TU_CHECK(close_to(out[2], 2.0 * 3.0 / (3.0 + e1), 1e-12), "sink shrinks the output");
  TU_CHECK(close_to(lse[1], log(3.0 + e1), 1e-12), "sink in lse");
  TU_CHECK(close_to(lse[0], log(z + 1.0), 1e-12), "sink 0 adds e^0");

  /* ALiBi: slope * (j - i), the query at position 2 (k_len 3, q_len 1). */
  float slopes[2] = {0.0f, 0.5f};
  l.sinks = NULL;
  l.alibi_slopes = slopes;
  ref_attention_seq(&l, 1, 3, q, k, v, out, lse);
  double a0 = exp(-1.0), a1 = exp(-0.5), a2 = 1.0, za = a0 + a1 + a2;
  TU_CHECK(close_to(out[2], (1 * a0 + 2 * a1 + 3 * a2) / za, 1e-12), "alibi");
  TU_CHECK(close_to(lse[1], log(za), 1e-12), "alibi lse");

  /* Soft cap: c * tanh(s / c) before ALiBi. */
  l.alibi_slopes = NULL;
  l.soft_cap = 0.5;
  ref_attention_seq(&l, 1, 3, q, k, v, out, lse);
  double c1 = exp(0.5 * tanh(2.0)), cm = exp(-0.5 * tanh(2.0)), zc = c1 + 1.0 + cm;
  TU_CHECK(close_to(lse[0], log(zc), 1e-12), "soft cap lse");

  /* A decoder row that sees nothing: zeros and -inf, even with a sink. */
  l.soft_cap = 0;
  l.attn_type = REF_DECODER;
  l.sinks = sinks;
  double q2[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  double out2[8], lse2[4];
  double k1[2] = {1, 1}, v1[2] = {5, 6};
  ref_attention_seq(&l, 2, 1, q2, k1, v1, out2, lse2);
  TU_CHECK(out2[0] == 0 && out2[3] == 0 && lse2[0] == -INFINITY && lse2[1] == -INFINITY,
           "row without keys");
  TU_CHECK(lse2[2] > -INFINITY && out2[4] > 0, "last row sees the key");
}

static void test_paged_gather(void) {
  /* Three tokens in blocks 2 then 0 (block_size 2, 1 kv head, head_size 1),
   * e4m3 with scale 0.5. */
  unsigned char key[6] = {0}, val[6] = {0};
  int32_t table[2] = {2, 0};
  float tok_k[3] = {1.0f, 2.0f, 3.0f};
  for (int t = 0; t < 3; t++) {
    int slot = table[t / 2] * 2 + t % 2;
    key[slot] = ref_e4m3_encode(tok_k[t] / 0.5f);
    val[slot] = ref_e4m3_encode(-tok_k[t] / 0.25f);
  }
  ref_cache c = {key, val, 3, 2, 1, 1, REF_E4M3, 0.5, 0.25, 0, 0, REF_ROWS};
  double k[3], v[3];
  ref_gather_paged(&c, table, 3, k, v);
  TU_CHECK(k[0] == 1 && k[1] == 2 && k[2] == 3 && v[0] == -1 && v[2] == -3, "gather");

  /* vLLM's CPU layout, worked out by hand: one f32 buffer [3 blocks][2
   * heads][2 * block_size 2][head_size 1], key tiles first in each head's
   * slot, value tiles after, and 1 element of padding after each block
   * (block_stride 2 * 4 + 1). Element (b, h, t) of key is b * 9 + h * 4 + t;
   * value is 2 further on. */
  float buf[3 * 9];
  for (int i = 0; i < 27; i++) buf[i] = (float)(1000 + i);
  ref_cache s = {buf, buf + 2, 3, 2, 2, 1, REF_F32, 1, 1, 9, 4, REF_ROWS};
  TU_CHECK(ref_cache_index(&s, 0, 2, 1, 1, 0) == 23 && ref_cache_index(&s, 1, 2, 1, 1, 0) == 23,
           "strided index: %lld", (long long)ref_cache_index(&s, 0, 2, 1, 1, 0));
  double sk[3 * 2], sv[3 * 2];
  ref_gather_paged(&s, table, 3, sk, sv);
  /* Token 2 (block 0, offset 0), head 1: key at 4, value at 6. */
  TU_CHECK(sk[0] == 1018 && sk[1] == 1022 && sv[0] == 1020 && sv[1] == 1024 && sk[5] == 1004 &&
               sv[5] == 1006,
           "strided gather: %g %g %g %g %g %g", sk[0], sk[1], sv[0], sv[1], sk[5], sv[5]);
}

/* PA_KV_TILED's element order, worked out by hand from the header's
 * pictures (keys: 16-token groups of head_size / 2 rows of 16 tokens x 2
 * elements; values: 16-element column groups of block_size / 2 rows of 16
 * elements x 2 tokens), then every tile position taken exactly once. */
static void test_tiled_order(void) {
  static const struct {
    int side, bs, d, t, e;
    int64_t at;
  } cases[] = {
      {0, 16, 16, 0, 0, 0},
      {0, 16, 16, 0, 1, 1},
      {0, 16, 16, 1, 0, 2},
      {0, 16, 16, 15, 1, 31},
      {0, 16, 16, 0, 2, 32},
      {0, 16, 16, 3, 15, 7 * 32 + 7},
      {0, 32, 16, 16, 0, 256},
      {0, 32, 16, 17, 5, 323},
      {0, 48, 80, 40, 79, 2 * 1280 + 39 * 32 + 17},
      {1, 16, 16, 0, 0, 0},
      {1, 16, 16, 1, 0, 1},
      {1, 16, 16, 0, 1, 2},
      {1, 16, 16, 2, 0, 32},
      {1, 32, 16, 17, 5, 267},
      {1, 32, 32, 3, 20, 512 + 32 + 9},
      {1, 48, 80, 47, 79, 4 * 768 + 23 * 32 + 31},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t at =
        ref_tile_offset(REF_TILED, cases[i].side, cases[i].bs, cases[i].d, cases[i].t, cases[i].e);
    TU_CHECK(at == cases[i].at, "tiled %s bs %d d %d t %d e %d: %lld, want %lld",
             cases[i].side ? "value" : "key", cases[i].bs, cases[i].d, cases[i].t, cases[i].e,
             (long long)at, (long long)cases[i].at);
  }
  TU_CHECK(ref_tile_offset(REF_ROWS, 1, 32, 48, 5, 7) == 5 * 48 + 7, "rows order");
  static const int shapes[][2] = {{16, 16}, {32, 48}, {48, 80}, {128, 16}, {16, 256}};
  for (int i = 0; i < 5; i++) {
    int bs = shapes[i][0], d = shapes[i][1];
    for (int side = 0; side < 2; side++) {
      unsigned char *seen = tu_calloc((size_t)bs * (size_t)d, 1);
      long bad = 0;
      for (int t = 0; t < bs; t++)
        for (int e = 0; e < d; e++) {
          int64_t at = ref_tile_offset(REF_TILED, side, bs, d, t, e);
          if (at < 0 || at >= (int64_t)bs * d || seen[at]++) bad++;
        }
      TU_CHECK(bad == 0, "tiled %s order of %d x %d: %ld positions out of the tile or taken twice",
               side ? "value" : "key", bs, d, bad);
      free(seen);
    }
  }

  /* A gather through a tiled cache: one f32 block of 16 tokens, one head of
   * 16, element (t, e) of keys holding 100 t + e and values -(100 t + e),
   * placed by hand (keys: pair rows of 16 tokens; values: pair rows of 16
   * columns). */
  float kbuf[256], vbuf[256];
  for (int row = 0; row < 8; row++)
    for (int col = 0; col < 16; col++)
      for (int pair = 0; pair < 2; pair++) {
        kbuf[row * 32 + col * 2 + pair] = (float)(100 * col + 2 * row + pair);
        vbuf[row * 32 + col * 2 + pair] = -(float)(100 * (2 * row + pair) + col);
      }
  ref_cache tc = {kbuf, vbuf, 1, 16, 1, 16, REF_F32, 1, 1, 0, 0, REF_TILED};
  int32_t one[1] = {0};
  double tk[16 * 16], tv[16 * 16];
  ref_gather_paged(&tc, one, 16, tk, tv);
  long bad = 0;
  for (int t = 0; t < 16; t++)
    for (int e = 0; e < 16; e++)
      bad += tk[t * 16 + e] != 100 * t + e || tv[t * 16 + e] != -(100 * t + e);
  TU_CHECK(bad == 0, "tiled gather: %ld elements wrong", bad);
}

/* The merge by hand: two rows of one head of size 2. */
static void test_merge_by_hand(void) {
  float a[4] = {1, 2, 10, 20}, b[4] = {3, 6, 30, 40};
  float la[2] = {0.0f, -INFINITY}, lb[2] = {(float)log(3.0), 1.5f};
  double out[4], lse[2];
  ref_merge_states(2, 1, 2, REF_F32, a, 2, la, b, 2, lb, out, lse);
  /* Row 0: weights 1/4 and 3/4; row 1 takes b. */
  TU_CHECK(fabs(out[0] - 2.5) < 1e-6 && fabs(out[1] - 5.0) < 1e-6 && fabs(lse[0] - log(4.0)) < 1e-6,
           "merge row 0: %g %g lse %g", out[0], out[1], lse[0]);
  TU_CHECK(out[2] == 30 && out[3] == 40 && lse[1] == 1.5, "merge row 1: %g %g lse %g", out[2],
           out[3], lse[1]);
  la[0] = lb[0] = -INFINITY;
  ref_merge_states(1, 1, 2, REF_F32, a, 2, la, b, 2, lb, out, lse);
  TU_CHECK(out[0] == 0 && out[1] == 0 && lse[0] == -INFINITY, "merge of two empty rows");
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  double t0 = tu_now();
  test_known_values();
  for (size_t i = 0; i < sizeof CODECS / sizeof CODECS[0]; i++) {
    test_round_trip(&CODECS[i]);
    test_midpoints(&CODECS[i]);
  }
  test_cross_checks();
  test_masks();
  test_attention_by_hand();
  test_paged_gather();
  test_tiled_order();
  test_merge_by_hand();
  printf("test_reference: %.2f s\n", tu_now() - t0);
  return tu_finish("test_reference");
}
