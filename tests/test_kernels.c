/* Micro-kernel unit tests: every entry of every vector kernel family this
 * machine runs (avx2, avx512 with or without AVX512-BF16) against the scalar
 * family, which is the specification. Shapes cover vector tails: head sizes
 * and key counts that are not multiples of 8, 16 or 32, single rows, and
 * rows spread over scattered, misaligned memory.
 *
 * Conversions must match the scalar kernels bit for bit; dot products and
 * sums may differ only by f32 summation order, bounded by a relative
 * tolerance on the sum of absolute terms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "kernels/codecs.h"
#include "kernels/prefetch.h"
#include "reference.h"
#include "test_util.h"

static const char *g_family;

#define CHECK(cond, fmt, ...) TU_CHECK(cond, "[%s] " fmt, g_family, __VA_ARGS__)

static const size_t g_heads[] = {1, 3, 8, 15, 16, 17, 31, 32, 33, 64, 79, 80, 128, 130, 256};
/* Packed tiles hold up to PA_PACK_KEYS keys. */
static const size_t g_packed_keys[] = {1, 3, 17, 63, 64, 65, 100, 127, 128};
/* Direct kernels take any key count; S rows of the direct tests hold 70. */
static const size_t g_direct_keys[] = {1, 2, 3, 5, 15, 16, 17, 33, 63, 64, 65, 70};
static const size_t g_rows[] = {1, 2, 3, 4, 5, 6, 7, 9, 13, 16, 17};
/* Packed kernels take more rows (AMX tiles are 16 rows, in blocks of 32). */
static const size_t g_packed_rows[] = {1, 3, 6, 13, 16, 17, 31, 32, 33, 48, 50, 64};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Random values of a dtype, as bytes, finite (no NaN/inf codes). */
static void random_elements(tu_rng *rng, pa_dtype dtype, void *out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = (float)tu_range(rng, -2.0, 2.0);
    switch (dtype) {
      case PA_F32: ((float *)out)[i] = x; break;
      case PA_F16: ((uint16_t *)out)[i] = pa_f32_to_f16(x); break;
      case PA_BF16: ((uint16_t *)out)[i] = pa_f32_to_bf16(x); break;
      case PA_FP8_E4M3: ((uint8_t *)out)[i] = pa_f32_to_e4m3(x * 100.0f); break;
      case PA_FP8_E5M2: ((uint8_t *)out)[i] = pa_f32_to_e5m2(x * 100.0f); break;
    }
  }
}

static float element(pa_dtype dtype, const void *row, size_t e) {
  return pa_decode_element(dtype, row, e);
}

/* The yardsticks of the kernels' rounding: S[i][j]'s is the sum of its
 * terms' magnitudes over d elements, O[i][e]'s that over keys [0, n) plus
 * O's value before and 1. */
static double qk_scale(pa_dtype q_dtype, const void *q_row, pa_dtype k_dtype, const void *k_row,
                       size_t d) {
  double scale = 0;
  for (size_t e = 0; e < d; e++)
    scale += fabs(element(q_dtype, q_row, e) * element(k_dtype, k_row, e));
  return scale;
}

static double pv_scale(const float *p_row, pa_dtype v_dtype, const void *const *v_rows, size_t n,
                       size_t e, float o_before) {
  double scale = fabs(o_before) + 1;
  for (size_t j = 0; j < n; j++) scale += fabs(p_row[j] * element(v_dtype, v_rows[j], e));
  return scale;
}

/* A row's rescale factor: 1, a fraction, or (a quarter of the time) 0,
 * which must discard the row of O: it is then filled with NaN, as
 * uninitialised memory may hold. */
static float random_rescale(tu_rng *rng, float *o_got, float *o_want, size_t d) {
  int kind = tu_int(rng, 0, 3);
  if (kind == 0) {
    for (size_t e = 0; e < d; e++) o_got[e] = o_want[e] = NAN;
    return 0.0f;
  }
  return kind == 1 ? 1.0f : (float)tu_range(rng, 0.01, 1);
}

/* n rows of d elements, each in its own allocation at an odd offset and
 * ending where its allocation ends, so that kernels cannot assume
 * contiguity or alignment beyond the element's, and a read past a row's
 * end is caught under AddressSanitizer. */
typedef struct rows {
  size_t n;
  void *block[PA_PACK_KEYS];
  const void *ptr[PA_PACK_KEYS];
} rows;

static void make_rows(tu_rng *rng, rows *r, pa_dtype dtype, size_t n, size_t d) {
  size_t size = pa_dtype_size(dtype);
  r->n = n;
  for (size_t j = 0; j < n; j++) {
    size_t offset = size * (size_t)tu_int(rng, 0, 6);
    r->block[j] = malloc(offset + d * size);
    char *row = (char *)r->block[j] + offset;
    random_elements(rng, dtype, row, d);
    r->ptr[j] = row;
  }
}

static void free_rows(rows *r) {
  for (size_t j = 0; j < r->n; j++) free(r->block[j]);
}

/* A prefetch request list (over memory of its own: requests have no
 * visible effect) of three ranges that end mid-line, with a budget of some
 * of their lines: up to several hundred, so that a kernel whose steps fall
 * short of its loop's end leaves lines of it unissued. */
typedef struct prefetch_probe {
  char memory[3 * 64 * 200 + 3];
  const char *start[3];
  size_t bytes[3];
  pa_prefetch p;
} prefetch_probe;

static void prefetch_probe_init(prefetch_probe *pr, tu_rng *rng) {
  size_t total = sizeof pr->memory;
  for (int i = 0; i < 3; i++) {
    pr->start[i] = pr->memory + (size_t)i * (total / 3);
    pr->bytes[i] = total / 3;
  }
  pr->p =
      (pa_prefetch){.start = pr->start, .bytes = pr->bytes, .count = 3, .to_l2 = tu_int(rng, 0, 1)};
  size_t lines = 3 * ((total / 3 + PA_CACHE_LINE - 1) / PA_CACHE_LINE);
  pa_prefetch_begin(&pr->p, (size_t)tu_int(rng, 1, (int)lines));
}

/* The kernel issued its whole budget by the end of the call (however many
 * passes it made over its keys), and not a line more. */
static void check_prefetch_spent(const prefetch_probe *pr, const char *what, size_t m, size_t n,
                                 size_t d) {
  CHECK(pr->p.issued == pr->p.budget, "%s m=%zu n=%zu d=%zu issued %zu of a budget of %zu", what, m,
        n, d, pr->p.issued, pr->p.budget);
}

static double rel_close(double got, double want, double scale, double tol) {
  return fabs(got - want) <= tol * scale + 1e-30;
}

static const pa_dtype g_dtypes[] = {PA_F32, PA_F16, PA_BF16, PA_FP8_E4M3, PA_FP8_E5M2};

/* ------------------------------------------------------------------------ */

static int same_bits(const void *a, const void *b, size_t size) { return memcmp(a, b, size) == 0; }

/* Inputs that exercise rounding: random values, exact midpoints between
 * narrow-format neighbours, subnormals, zeros, overflow, inf and NaN. */
static float tricky_float(tu_rng *rng, size_t i) {
  static const float special[] = {0.0f,   -0.0f,  65504.0f, 65520.0f, 70000.0f, 1e-8f,     -3e-39f,
                                  448.0f, 464.0f, 57344.0f, 1e30f,    INFINITY, -INFINITY, NAN};
  if (i % 5 == 0) return special[(i / 5) % COUNT(special)];
  uint32_t bits = (uint32_t)tu_next(rng);
  if (i % 5 == 1) bits = (bits & 0xffff0000u) | 0x8000u; /* a bf16 midpoint */
  if (i % 5 == 2) bits = (bits & 0xffffe000u) | 0x1000u; /* an f16 midpoint */
  if (i % 5 == 3) bits &= 0xbfffffffu;                   /* moderate exponents */
  return pa_f32_from_bits(bits);
}

static void test_conversions(const pa_kernels *k, const pa_kernels *s, tu_rng *rng) {
  enum { N = 203 };
  float in[N], got_f[N], want_f[N];
  uint8_t src[N * 4], got[N * 4], want[N * 4];
  for (size_t n = 1; n <= N; n += (n < 40 ? 1 : 37)) {
    for (size_t i = 0; i < n; i++) in[i] = tricky_float(rng, i);
    for (int a = 0; a < PA_NUM_ACT_DTYPES; a++) {
      size_t size = pa_dtype_size((pa_dtype)a);
      for (size_t i = 0; i < n * size; i++) src[i] = (uint8_t)tu_next(rng);
      k->load_row[a](got_f, src, n, 0.75f);
      s->load_row[a](want_f, src, n, 0.75f);
      CHECK(same_bits(got_f, want_f, n * 4), "load_row[%s] n=%zu", pa_dtype_name(a), n);
      k->store_row[a](got, in, n, 1.5f);
      s->store_row[a](want, in, n, 1.5f);
      CHECK(same_bits(got, want, n * size), "store_row[%s] n=%zu", pa_dtype_name(a), n);
    }
    for (size_t i = 0; i < n; i++) got_f[i] = want_f[i] = tricky_float(rng, i + 1);
    k->axpy(got_f, in, n, -0.3f);
    s->axpy(want_f, in, n, -0.3f);
    CHECK(same_bits(got_f, want_f, n * 4), "axpy n=%zu", n);
    for (int c = 0; c < PA_NUM_DTYPES; c++) {
      size_t size = pa_dtype_size((pa_dtype)c);
      k->encode_row[c](got, in, n, 0.37f);
      s->encode_row[c](want, in, n, 0.37f);
      CHECK(same_bits(got, want, n * size), "encode_row[%s] n=%zu", pa_dtype_name(c), n);
    }
  }
}

/* ------------------------------------------------------------------------ */

/* Direct (decode) S = Q K^T against the scalar kernel, f32 Q. */
static void test_qk_pv(const pa_kernels *k, const pa_kernels *s, tu_rng *rng) {
  for (size_t di = 0; di < COUNT(g_heads); di++) {
    size_t d = g_heads[di];
    for (size_t t = 0; t < 6; t++) {
      pa_dtype dtype = g_dtypes[t % COUNT(g_dtypes)];
      size_t m = g_rows[(size_t)tu_int(rng, 0, (int)(COUNT(g_rows) - 1))],
             n = g_direct_keys[(size_t)tu_int(rng, 0, (int)(COUNT(g_direct_keys) - 1))];
      rows kr, vr;
      make_rows(rng, &kr, dtype, n, d);
      make_rows(rng, &vr, dtype, n, d);
      size_t ldq = d + 3, lds = 72, ldo = d + 5;
      float *q = malloc(m * ldq * 4), *got = malloc(m * lds * 4), *want = malloc(m * lds * 4);
      float *o_got = malloc(m * ldo * 4), *o_want = malloc(m * ldo * 4), rescale[17];
      for (size_t i = 0; i < m * ldq; i++) q[i] = (float)tu_range(rng, -1, 1);
      k->qk[dtype](m, n, d, q, ldq, kr.ptr, got, lds, NULL);
      s->qk[dtype](m, n, d, q, ldq, kr.ptr, want, lds, NULL);
      prefetch_probe probe;
      prefetch_probe_init(&probe, rng);
      float *again = malloc(m * lds * 4);
      k->qk[dtype](m, n, d, q, ldq, kr.ptr, again, lds, &probe.p);
      check_prefetch_spent(&probe, "qk", m, n, d);
      for (size_t i = 0; i < m; i++)
        CHECK(memcmp(again + i * lds, got + i * lds, n * 4) == 0,
              "qk[%s] row %zu differs with prefetch", pa_dtype_name(dtype), i);
      free(again);
      for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++) {
          double scale = qk_scale(PA_F32, q + i * ldq, dtype, kr.ptr[j], d);
          CHECK(rel_close(got[i * lds + j], want[i * lds + j], scale, 1e-5),
                "qk[%s] m=%zu n=%zu d=%zu S[%zu][%zu] %g vs %g", pa_dtype_name(dtype), m, n, d, i,
                j, got[i * lds + j], want[i * lds + j]);
        }
      }
      /* P V with a random P (some zeros, as masked keys give) and rescale. */
      const float *scales = (size_t)tu_int(rng, 0, (int)(2) - 1) ? rescale : NULL;
      for (size_t i = 0; i < m; i++) {
        for (size_t j = 0; j < n; j++)
          got[i * lds + j] =
              (size_t)tu_int(rng, 0, (int)(4) - 1) ? (float)tu_range(rng, 0, 1) : 0.0f;
        for (size_t e = 0; e < ldo; e++)
          o_got[i * ldo + e] = o_want[i * ldo + e] = (float)tu_range(rng, -1, 1);
        rescale[i] = scales ? random_rescale(rng, o_got + i * ldo, o_want + i * ldo, d) : 1.0f;
      }
      float *o_again = malloc(m * ldo * 4);
      memcpy(o_again, o_got, m * ldo * 4);
      k->pv[dtype](m, n, d, got, lds, vr.ptr, o_got, ldo, scales, NULL);
      s->pv[dtype](m, n, d, got, lds, vr.ptr, o_want, ldo, scales, NULL);
      prefetch_probe_init(&probe, rng);
      k->pv[dtype](m, n, d, got, lds, vr.ptr, o_again, ldo, scales, &probe.p);
      check_prefetch_spent(&probe, "pv", m, n, d);
      CHECK(memcmp(o_again, o_got, m * ldo * 4) == 0, "pv[%s] differs with prefetch",
            pa_dtype_name(dtype));
      free(o_again);
      for (size_t i = 0; i < m; i++) {
        for (size_t e = 0; e < ldo; e++) {
          int inside = e < d;
          double scale =
              inside ? pv_scale(got + i * lds, dtype, vr.ptr, n, e, o_want[i * ldo + e]) : 0;
          CHECK(inside ? rel_close(o_got[i * ldo + e], o_want[i * ldo + e], scale, 1e-5)
                       : o_got[i * ldo + e] == o_want[i * ldo + e],
                "pv[%s] m=%zu n=%zu d=%zu O[%zu][%zu] %g vs %g%s", pa_dtype_name(dtype), m, n, d, i,
                e, o_got[i * ldo + e], o_want[i * ldo + e], inside ? "" : " (past d)");
        }
      }
      free_rows(&kr), free_rows(&vr), free(q), free(got), free(want), free(o_got), free(o_want);
    }
  }
}

/* ------------------------------------------------------------------------ */

/* One side of a softmax comparison: S and the running state of its rows. */
typedef struct softmax_side {
  float *s, *row_max, *row_sum, *rescale;
} softmax_side;

/* The forms a softmax leaves its weights in: f32, softmax_bf16_rows',
 * softmax_split_rows'. */
enum { WEIGHTS_F32, WEIGHTS_BF16_ROWS, WEIGHTS_SPLIT };

static pa_softmax_fn softmax_of(const pa_kernels *k, int form) {
  return form == WEIGHTS_BF16_ROWS ? k->softmax_bf16_rows
         : form == WEIGHTS_SPLIT   ? k->softmax_split_rows
                                   : k->softmax;
}

/* Tile t through the family's softmax of `form` on `got` and the scalar
 * one on `want`. */
static void softmax_both(const pa_kernels *k, const pa_kernels *s, pa_softmax_tile t,
                         softmax_side got, softmax_side want, size_t lds, int form) {
  t.row_max = got.row_max, t.row_sum = got.row_sum, t.rescale = got.rescale;
  softmax_of(k, form)(&t, got.s, lds);
  t.row_max = want.row_max, t.row_sum = want.row_sum, t.rescale = want.rescale;
  softmax_of(s, form)(&t, want.s, lds);
}

/* Weight j of a softmax_bf16_rows row. */
static float bf16_weight(const float *row, size_t j) {
  uint16_t bits;
  memcpy(&bits, (const char *)row + j * 2, 2);
  return pa_bf16_to_f32(bits);
}

/* Weight j of a softmax_split_rows row: its high part plus its rest. */
static float split_weight(const float *row, size_t j) {
  uint16_t parts[2];
  memcpy(parts, row + j, sizeof parts);
  return pa_bf16_to_f32(parts[0]) + pa_bf16_to_f32(parts[1]);
}

static float weight_in(int form, const float *row, size_t j) {
  return form == WEIGHTS_BF16_ROWS ? bf16_weight(row, j)
         : form == WEIGHTS_SPLIT   ? split_weight(row, j)
                                   : row[j];
}

/* Weights are 2^(x - max) with |x| up to ~70 here: one rounding of x more or
 * less (the vector kernels fold log2(e) into the score scale) moves a weight
 * by up to ln2 * ulp(70) ~ 5e-6 relative, hence 1e-5; weights that will be
 * rounded to bf16 may take an exp good to 1e-4 (pa_softmax_tile), hence 2e-4
 * for them; a soft cap's tanh adds a few ulps of the cap to x. */
static double weights_exp_tol(const pa_softmax_tile *t, int form) {
  /* A split pair is its weight to 2^-18. */
  return form == WEIGHTS_BF16_ROWS || t->bf16_weights ? 2e-4
         : form == WEIGHTS_SPLIT                      ? 1.4e-5
                                                      : 1e-5;
}

/* No cap, or one near the logits, far above them (tanh's argument near 0,
 * where 1 - 2 / (e^2x + 1) cancels its digits) or subnormal (an inverse
 * past FLT_MAX). */
static float draw_soft_cap(tu_rng *rng) {
  switch (tu_int(rng, 0, 5)) {
    case 0: return (float)tu_range(rng, 5, 50);
    case 1: return (float)pow(10.0, tu_range(rng, 2, 8));
    case 2: return 1e-40f;
    default: return 0.0f;
  }
}

static void test_softmax(const pa_kernels *k, const pa_kernels *s, tu_rng *rng, int form) {
  const int bf16_rows = form == WEIGHTS_BF16_ROWS;
  enum { M = 19, LDS = 72 };
  for (int round = 0; round < 300; round++) {
    size_t m = 1 + (size_t)tu_int(rng, 0, (int)(M)-1),
           n = 1 + (size_t)tu_int(rng, 0, (int)(64) - 1);
    float got[M * LDS], want[M * LDS], alibi[M];
    float max_got[M], max_want[M], sum_got[M], sum_want[M], res_got[M], res_want[M];
    int32_t position[M], lo[M], hi[M];
    int64_t first = (int64_t)(size_t)tu_int(rng, 0, (int)(1000) - 1);
    int masked = (size_t)tu_int(rng, 0, (int)(2) - 1);
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < LDS; j++)
        got[i * LDS + j] = want[i * LDS + j] = (float)tu_range(rng, -30, 30);
      alibi[i] = (float)tu_range(rng, 0, 0.5);
      position[i] = (int32_t)(first + (int64_t)(size_t)tu_int(rng, 0, (int)(80) - 1));
      lo[i] = (int32_t)(first + (int64_t)(size_t)tu_int(rng, 0, (int)(70) - 1)) - 4;
      hi[i] = lo[i] + (int32_t)(size_t)tu_int(rng, 0, (int)(80) - 1) - 8; /* sometimes empty */
      int fresh = (size_t)tu_int(rng, 0, (int)(3) - 1) == 0;
      max_got[i] = max_want[i] = fresh ? -INFINITY : (float)tu_range(rng, -20, 40);
      sum_got[i] = sum_want[i] = fresh ? 0.0f : (float)tu_range(rng, 1, 9);
    }
    pa_softmax_tile t = {
        .m = m,
        .n = n,
        .first_key = first,
        .score_scale = (float)tu_range(rng, 0.05, 1.5),
        .soft_cap = draw_soft_cap(rng),
        .alibi = (size_t)tu_int(rng, 0, (int)(3) - 1) == 0 ? alibi : NULL,
        .position = position,
        .key_lo = masked ? lo : NULL,
        .key_hi = hi,
        .bf16_weights = tu_int(rng, 0, 1),
    };
    softmax_both(k, s, t, (softmax_side){got, max_got, sum_got, res_got},
                 (softmax_side){want, max_want, sum_want, res_want}, LDS, form);
    const double exp_tol = weights_exp_tol(&t, form);
    for (size_t i = 0; i < m; i++) {
      /* A soft cap's tanh is an approximation good to a few ulps of the
       * cap (or of the logit, below a cap of 50); ALiBi's bias, up to 45
       * here, may cancel a score as large, leaving their rounding. */
      double max_scale =
          fabs(max_want[i]) + 1.0 + 2.0 * fmin(t.soft_cap, 50.0) + (t.alibi ? 90.0 : 0.0);
      CHECK(max_got[i] == max_want[i] || rel_close(max_got[i], max_want[i], max_scale, 2e-6),
            "softmax row_max[%zu] %.9g vs %.9g (cap=%g alibi=%d)", i, max_got[i], max_want[i],
            (double)t.soft_cap, t.alibi != NULL);
      CHECK(rel_close(res_got[i], res_want[i], 1, 1e-5), "softmax rescale[%zu] %g vs %g", i,
            res_got[i], res_want[i]);
      CHECK(rel_close(sum_got[i], sum_want[i], fabs(sum_want[i]) + 1e-30, exp_tol),
            "softmax row_sum[%zu] %g vs %g", i, sum_got[i], sum_want[i]);
      const float *row_got = got + i * LDS, *row_want = want + i * LDS;
      /* Rounded to bf16, weights a few ulps of f32 apart may round a bf16
       * ulp apart: up to 2^-7 of the larger. */
      for (size_t j = 0; j < n; j++) {
        float p_got = weight_in(form, row_got, j);
        float p_want = weight_in(form, row_want, j);
        CHECK(rel_close(p_got, p_want, 1, exp_tol + 4e-7 * fmin(t.soft_cap, 50.0)) ||
                  (bf16_rows && rel_close(p_got, p_want, fmax(fabs(p_got), fabs(p_want)), 0x1p-7)),
              "softmax%s P[%zu][%zu] %g vs %g (m=%zu n=%zu cap=%g alibi=%d mask=%d)",
              bf16_rows               ? "_bf16_rows"
              : form == WEIGHTS_SPLIT ? "_split_rows"
                                      : "",
              i, j, p_got, p_want, m, n, (double)t.soft_cap, t.alibi != NULL, masked);
      }
      size_t untouched = n;
      if (bf16_rows) {
        for (size_t j = n; j < pa_bf16_row_keys(n); j++)
          CHECK(bf16_weight(row_got, j) == 0.0f, "softmax_bf16_rows P[%zu][%zu] past n=%zu: %g", i,
                j, n, bf16_weight(row_got, j));
        /* The floats past n and past the bf16 weights' bytes. */
        untouched = PA_MAX(n, pa_bf16_row_keys(n) / 2);
      }
      if (form == WEIGHTS_SPLIT) {
        for (size_t j = n; j < pa_split_row_keys(n); j++)
          CHECK(got[i * LDS + j] == 0.0f && !signbit(got[i * LDS + j]),
                "softmax_split_rows pair [%zu][%zu] past n=%zu not zero: %g", i, j, n,
                (double)got[i * LDS + j]);
        untouched = pa_split_row_keys(n);
      }
      for (size_t j = untouched; j < LDS; j++) {
        CHECK(got[i * LDS + j] == want[i * LDS + j],
              "softmax wrote S[%zu][%zu] past n=%zu: %g vs %g (m=%zu masked=%d lo=%d hi=%d "
              "first=%lld max=%g)",
              i, j, n, got[i * LDS + j], want[i * LDS + j], m, masked, (int)lo[i], (int)hi[i],
              (long long)first, max_want[i]);
      }
    }
  }
}

/* A NaN score (from a NaN or infinite Q or K) beside finite ones makes its
 * row's sum NaN, and so its output, in every family and with or without a
 * soft cap: the vector exp2 once weighed it as 0 (its clamp dropped the
 * NaN), the vector tanh as -1. Other rows keep their sums. (A row whose
 * every score is NaN counts as one that sees no key, as fmaxf ignores NaN.) */
static void test_softmax_nan(const pa_kernels *k, const pa_kernels *s, tu_rng *rng, int form) {
  enum { M = 6, LDS = 48 };
  for (int round = 0; round < 60; round++) {
    size_t m = 1 + (size_t)tu_int(rng, 0, M - 1), n = 2 + (size_t)tu_int(rng, 0, LDS - 2);
    size_t bad_row = (size_t)tu_int(rng, 0, (int)m - 1),
           bad_key = (size_t)tu_int(rng, 0, (int)n - 1);
    float got[M * LDS], want[M * LDS], max_got[M], max_want[M], sum_got[M], sum_want[M];
    float res_got[M], res_want[M];
    int32_t position[M];
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < LDS; j++)
        got[i * LDS + j] = want[i * LDS + j] = (float)tu_range(rng, -30, 30);
      position[i] = 100;
      max_got[i] = max_want[i] = -INFINITY;
      sum_got[i] = sum_want[i] = 0.0f;
    }
    got[bad_row * LDS + bad_key] = want[bad_row * LDS + bad_key] = NAN;
    pa_softmax_tile t = {
        .m = m,
        .n = n,
        .first_key = 0,
        .score_scale = 0.125f,
        .soft_cap = round % 2 ? draw_soft_cap(rng) : 0.0f,
        .position = position,
        .bf16_weights = tu_int(rng, 0, 1),
    };
    softmax_both(k, s, t, (softmax_side){got, max_got, sum_got, res_got},
                 (softmax_side){want, max_want, sum_want, res_want}, LDS, form);
    for (size_t i = 0; i < m; i++) {
      if (i == bad_row) {
        CHECK(isnan(sum_got[i]) && isnan(sum_want[i]),
              "softmax with a NaN score: row_sum %g (scalar %g), cap=%g n=%zu key=%zu", sum_got[i],
              sum_want[i], (double)t.soft_cap, n, bad_key);
      } else {
        CHECK(rel_close(sum_got[i], sum_want[i], fabs(sum_want[i]), weights_exp_tol(&t, form)),
              "softmax row_sum[%zu] beside a NaN row: %g vs %g", i, sum_got[i], sum_want[i]);
      }
    }
  }
}

/* ------------------------------------------------------------------------ */

/* P (values that are bf16 already) as the pair's packed and tiled P V
 * kernels take it: as it is, or (packed_p_bf16_rows) in `bf16_rows` as the
 * rows of a softmax_bf16_rows, with NaN after their zeros, which a kernel
 * reading past them would carry into O. */
static const void *packed_p(const pa_attn_ops *k, const float *p, size_t m, size_t n, size_t lds,
                            void *bf16_rows) {
  if (!k->packed_p_bf16_rows) return p;
  for (size_t i = 0; i < m; i++) {
    uint16_t *weights = (uint16_t *)bf16_rows + i * lds * 2;
    for (size_t j = 0; j < lds * 2; j++) {
      weights[j] = j < n ? pa_f32_to_bf16(p[i * lds + j]) : j < pa_bf16_row_keys(n) ? 0 : 0x7fc0;
    }
  }
  return bf16_rows;
}

/* P as the pair's tiled P V kernel takes it: as packed_p, or
 * (tiled_p_split) as the pairs of a softmax_split_rows, with NaN after
 * their zeros. */
static const void *tiled_p(const pa_attn_ops *k, const float *p, size_t m, size_t n, size_t lds,
                           void *pairs) {
  if (!k->tiled_p_split) return packed_p(k, p, m, n, lds, pairs);
  for (size_t i = 0; i < m; i++) {
    float *row = (float *)pairs + i * lds;
    for (size_t j = 0; j < lds; j++) {
      float w = p[i * lds + j];
      uint16_t high = pa_f32_to_bf16(w);
      uint16_t parts[2] = {high, pa_f32_to_bf16(w - pa_bf16_to_f32(high))};
      if (j >= pa_split_row_keys(n)) parts[0] = parts[1] = 0x7fc0;
      memcpy(row + j, parts, sizeof parts);
    }
  }
  return pairs;
}

/* Packed tiles: each family packs in its own layout, so compare the
 * results of pack + qk_packed and pack + pv_packed with the scalar ones.
 * The vector kernels also spend a prefetch budget (the scalar ones leave
 * prefetching to the hardware). */
static void test_packed(const pa_attn_ops *k, const pa_attn_ops *s, pa_dtype act, pa_dtype cache,
                        tu_rng *rng) {
  for (size_t di = 0; di < COUNT(g_heads); di++) {
    size_t d = g_heads[di],
           n = g_packed_keys[(size_t)tu_int(rng, 0, (int)(COUNT(g_packed_keys) - 1))];
    /* Q rows hold d rounded up to 64 (see pa_attn_ops). */
    size_t m = g_packed_rows[(size_t)tu_int(rng, 0, (int)(COUNT(g_packed_rows) - 1))];
    size_t ldq = (d + 63) / 64 * 64 + 2, lds = PA_PACK_KEYS + 3, ldo = d + 1;
    rows kr, vr;
    make_rows(rng, &kr, cache, n, d);
    make_rows(rng, &vr, cache, n, d);
    void *q_act = malloc(m * ldq * 4), *q_k = malloc(m * ldq * 4), *q_s = malloc(m * ldq * 4);
    void *kp = malloc(pa_packed_bytes(d)), *sp = malloc(pa_packed_bytes(d));
    /* A packed tile's buffer holds an earlier tile's data: NaN here, so that
     * a kernel reading past what it packed shows. */
    memset(kp, 0xff, pa_packed_bytes(d));
    float *got = malloc(m * lds * 4), *want = malloc(m * lds * 4);
    float *o_got = malloc(m * ldo * 4), *o_want = malloc(m * ldo * 4), *rescale = malloc(m * 4);
    random_elements(rng, act, q_act, m * ldq);
    size_t act_size = pa_dtype_size(act);
    for (size_t i = 0; i < m; i++) {
      k->load_q_packed((char *)q_k + i * ldq * k->q_size, (char *)q_act + i * ldq * act_size, d,
                       1.0f);
      s->load_q_packed((char *)q_s + i * ldq * s->q_size, (char *)q_act + i * ldq * act_size, d,
                       1.0f);
    }
    k->pack_k(kp, kr.ptr, n, d);
    s->pack_k(sp, kr.ptr, n, d);
    prefetch_probe probe;
    prefetch_probe_init(&probe, rng);
    k->qk_packed(m, n, d, q_k, ldq, kp, got, lds, &probe.p);
    check_prefetch_spent(&probe, "qk_packed", m, n, d);
    s->qk_packed(m, n, d, q_s, ldq, sp, want, lds, NULL);
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < n; j++) {
        double scale = qk_scale(act, (char *)q_act + i * ldq * act_size, cache, kr.ptr[j], d);
        CHECK(rel_close(got[i * lds + j], want[i * lds + j], scale, 1e-5),
              "qk_packed[%s,%s] m=%zu n=%zu d=%zu S[%zu][%zu] %g vs %g", pa_dtype_name(act),
              pa_dtype_name(cache), m, n, d, i, j, got[i * lds + j], want[i * lds + j]);
      }
    }
    /* P rounded to bf16 first: a bf16 P V kernel rounds it, the scalar one does not. */
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < n; j++) {
        float p = (size_t)tu_int(rng, 0, (int)(4) - 1) ? (float)tu_range(rng, 0, 1) : 0.0f;
        got[i * lds + j] = pa_bf16_to_f32(pa_f32_to_bf16(p));
      }
      for (size_t e = 0; e < ldo; e++)
        o_got[i * ldo + e] = o_want[i * ldo + e] = (float)tu_range(rng, -1, 1);
      rescale[i] = random_rescale(rng, o_got + i * ldo, o_want + i * ldo, d);
    }
    k->pack_v(kp, vr.ptr, n, d);
    s->pack_v(sp, vr.ptr, n, d);
    prefetch_probe_init(&probe, rng);
    void *p_rows = malloc(m * lds * 4);
    k->pv_packed(m, n, d, packed_p(k, got, m, n, lds, p_rows), lds, kp, o_got, ldo, rescale,
                 &probe.p);
    free(p_rows);
    check_prefetch_spent(&probe, "pv_packed", m, n, d);
    s->pv_packed(m, n, d, got, lds, sp, o_want, ldo, rescale, NULL);
    for (size_t i = 0; i < m; i++) {
      for (size_t e = 0; e < ldo; e++) {
        double scale =
            e < d ? pv_scale(got + i * lds, cache, vr.ptr, n, e, o_want[i * ldo + e]) : 0;
        CHECK(e < d ? rel_close(o_got[i * ldo + e], o_want[i * ldo + e], scale, 1e-5)
                    : o_got[i * ldo + e] == o_want[i * ldo + e],
              "pv_packed[%s,%s] m=%zu n=%zu d=%zu O[%zu][%zu] %g vs %g", pa_dtype_name(act),
              pa_dtype_name(cache), m, n, d, i, e, o_got[i * ldo + e], o_want[i * ldo + e]);
      }
    }
    free_rows(&kr), free_rows(&vr), free(q_act), free(q_k), free(q_s), free(kp), free(sp);
    free(got), free(want), free(o_got), free(o_want), free(rescale);
  }
}

/* The direct kernels of an (activation, cache) pair that has its own (the
 * bf16 dot-product kernels): against the scalar f32 kernels on the same Q
 * values and on P as precise as the pair keeps it. */
static void test_narrow_direct(const pa_attn_ops *k, const pa_kernels *s, pa_dtype act,
                               pa_dtype cache, tu_rng *rng) {
  /* Every head size twice: with any key and row counts, and with whole
   * register blocks of rows and keys, where a kernel's last step has no
   * partial block to overshoot its loop with and must reach its end itself. */
  for (size_t it = 0; it < 2 * COUNT(g_heads); it++) {
    size_t d = g_heads[it / 2], whole = it % 2;
    size_t n = whole ? 16 * (size_t)tu_int(rng, 1, 4)
                     : g_direct_keys[(size_t)tu_int(rng, 0, (int)(COUNT(g_direct_keys) - 1))];
    size_t m = whole ? (size_t)1 << tu_int(rng, 0, 4)
                     : g_rows[(size_t)tu_int(rng, 0, (int)(COUNT(g_rows) - 1))];
    size_t ldq = (d + 63) / 64 * 64 + 4, lds = 71, ldo = d + 3;
    rows kr, vr;
    make_rows(rng, &kr, cache, n, d);
    make_rows(rng, &vr, cache, n, d);
    size_t act_size = pa_dtype_size(act);
    void *q_act = malloc(m * ldq * act_size), *q_k = malloc(m * ldq * k->q_size);
    float *q_f = malloc(m * ldq * 4), *got = malloc(m * lds * 4), *want = malloc(m * lds * 4);
    float *o_got = malloc(m * ldo * 4), *o_want = malloc(m * ldo * 4);
    random_elements(rng, act, q_act, m * ldq);
    for (size_t i = 0; i < m; i++) {
      k->load_q((char *)q_k + i * ldq * k->q_size, (char *)q_act + i * ldq * act_size, d, 1.0f);
      s->load_row[act](q_f + i * ldq, (char *)q_act + i * ldq * act_size, d, 1.0f);
    }
    k->qk(m, n, d, q_k, ldq, kr.ptr, got, lds, NULL);
    s->qk[cache](m, n, d, q_f, ldq, kr.ptr, want, lds, NULL);
    prefetch_probe probe;
    prefetch_probe_init(&probe, rng);
    float *again = malloc(m * lds * 4);
    k->qk(m, n, d, q_k, ldq, kr.ptr, again, lds, &probe.p);
    check_prefetch_spent(&probe, "qk narrow", m, n, d);
    for (size_t i = 0; i < m; i++)
      CHECK(memcmp(again + i * lds, got + i * lds, n * 4) == 0,
            "qk[%s,%s] row %zu differs with prefetch", pa_dtype_name(act), pa_dtype_name(cache), i);
    free(again);
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < n; j++) {
        double scale = qk_scale(PA_F32, q_f + i * ldq, cache, kr.ptr[j], d);
        CHECK(rel_close(got[i * lds + j], want[i * lds + j], scale, 1e-5),
              "qk[%s,%s] m=%zu n=%zu d=%zu S[%zu][%zu] %g vs %g", pa_dtype_name(act),
              pa_dtype_name(cache), m, n, d, i, j, got[i * lds + j], want[i * lds + j]);
      }
    }
    /* The scalar kernel sees P as the kernel pair's precision makes it: bf16
     * where its P V rounds P so (p_bf16), P itself where the pair splits P
     * in two bf16 parts or multiplies on the FMA units. */
    float *p_ref = malloc(m * lds * 4), *rescale = malloc(m * 4);
    const float *scales = tu_int(rng, 0, 1) ? rescale : NULL;
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < n; j++) {
        got[i * lds + j] = (float)tu_range(rng, 0, 1);
        p_ref[i * lds + j] =
            k->p_bf16 ? pa_bf16_to_f32(pa_f32_to_bf16(got[i * lds + j])) : got[i * lds + j];
      }
      for (size_t e = 0; e < ldo; e++)
        o_got[i * ldo + e] = o_want[i * ldo + e] = (float)tu_range(rng, -1, 1);
      rescale[i] = scales ? random_rescale(rng, o_got + i * ldo, o_want + i * ldo, d) : 1.0f;
      /* O as the kernel keeps it from one call to the next. */
      if (k->o_from_columns) k->o_from_columns(o_got + i * ldo, d);
    }
    float *o_again = malloc(m * ldo * 4);
    memcpy(o_again, o_got, m * ldo * 4);
    k->pv(m, n, d, got, lds, vr.ptr, o_got, ldo, scales, NULL);
    s->pv[cache](m, n, d, p_ref, lds, vr.ptr, o_want, ldo, scales, NULL);
    free(p_ref);
    prefetch_probe_init(&probe, rng);
    k->pv(m, n, d, got, lds, vr.ptr, o_again, ldo, scales, &probe.p);
    check_prefetch_spent(&probe, "pv narrow", m, n, d);
    CHECK(memcmp(o_again, o_got, m * ldo * 4) == 0, "pv[%s,%s] differs with prefetch",
          pa_dtype_name(act), pa_dtype_name(cache));
    free(o_again), free(rescale);
    for (size_t i = 0; i < m && k->o_to_columns; i++) k->o_to_columns(o_got + i * ldo, d);
    for (size_t i = 0; i < m; i++) {
      for (size_t e = 0; e < d; e++) {
        double scale = pv_scale(got + i * lds, cache, vr.ptr, n, e, o_want[i * ldo + e]);
        CHECK(rel_close(o_got[i * ldo + e], o_want[i * ldo + e], scale, 1e-5),
              "pv[%s,%s] m=%zu n=%zu d=%zu O[%zu][%zu] %g vs %g", pa_dtype_name(act),
              pa_dtype_name(cache), m, n, d, i, e, o_got[i * ldo + e], o_want[i * ldo + e]);
      }
    }
    free_rows(&kr), free_rows(&vr), free(q_act), free(q_k), free(q_f), free(got), free(want);
    free(o_got), free(o_want);
  }
}

/* ------------------------------------------------------------------------ */

/* FP8 rows that cycle through every finite code (subnormals, both zeros,
 * the largest magnitudes) from a random start; with `poison`, one element
 * of one row becomes a NaN (and, for E5M2, another an infinity). */
static void fill_fp8_codes(tu_rng *rng, pa_dtype cache, const rows *r, size_t n, size_t d,
                           int poison) {
  unsigned code = (unsigned)tu_int(rng, 0, 255);
  for (size_t j = 0; j < n; j++) {
    uint8_t *row = (uint8_t *)r->block + ((const char *)r->ptr[j] - (const char *)r->block);
    for (size_t e = 0; e < d; e++) {
      do code = (code + 1) & 0xff;
      while (!isfinite(pa_decode_element(cache, &(uint8_t){(uint8_t)code}, 0)));
      row[e] = (uint8_t)code;
    }
  }
  if (!poison) return;
  uint8_t *nan_row = (uint8_t *)r->block +
                     ((const char *)r->ptr[tu_int(rng, 0, (int)n - 1)] - (const char *)r->block);
  nan_row[tu_int(rng, 0, (int)d - 1)] = cache == PA_FP8_E4M3 ? 0xff : 0x7e;
  if (cache == PA_FP8_E5M2) {
    uint8_t *inf_row = (uint8_t *)r->block +
                       ((const char *)r->ptr[tu_int(rng, 0, (int)n - 1)] - (const char *)r->block);
    inf_row[tu_int(rng, 0, (int)d - 1)] = tu_int(rng, 0, 1) ? 0x7c : 0xfc;
  }
}

/* got matches want: the same NaN-ness, the same infinity, or within tol of
 * scale (NaN or infinite only where want is). */
static int fp8_close(float got, float want, double scale) {
  if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
  if (isinf(want) || isinf(got)) return got == want;
  return rel_close(got, want, scale, 1e-5);
}

/* The direct FP8 kernels (f32 Q, and bf16 Q where the family has it) over
 * every code and over NaN and infinite values, against the scalar kernels:
 * a vector kernel may decode codes with shortcuts that are exact only for
 * finite values, and must then notice the others. */
static void test_fp8_codes(const pa_kernels *k, const pa_kernels *s, tu_rng *rng) {
  static const size_t heads[] = {1, 7, 8, 31, 32, 33, 64, 100, 128, 130};
  for (int c = 0; c < 2; c++) {
    pa_dtype cache = c ? PA_FP8_E5M2 : PA_FP8_E4M3;
    const pa_attn_ops *narrow = &k->attn[PA_BF16][cache];
    for (size_t di = 0; di < COUNT(heads); di++) {
      for (int poison = 0; poison < 2; poison++) {
        size_t d = heads[di],
               n = g_direct_keys[(size_t)tu_int(rng, 0, (int)(COUNT(g_direct_keys) - 1))],
               m = g_rows[(size_t)tu_int(rng, 0, (int)(COUNT(g_rows) - 1))];
        size_t ldq = (d + 63) / 64 * 64 + 4, lds = 72, ldo = d + 3;
        rows kr, vr;
        make_rows(rng, &kr, cache, n, d);
        make_rows(rng, &vr, cache, n, d);
        fill_fp8_codes(rng, cache, &kr, n, d, poison);
        fill_fp8_codes(rng, cache, &vr, n, d, poison);
        uint16_t *q_bf16 = malloc(m * ldq * 2);
        void *q_narrow = malloc(m * ldq * narrow->q_size);
        float *q = malloc(m * ldq * 4), *got = malloc(m * lds * 4), *want = malloc(m * lds * 4);
        float *o_got = malloc(m * ldo * 4), *o_want = malloc(m * ldo * 4);
        for (size_t i = 0; i < m * ldq; i++) {
          q_bf16[i] = pa_f32_to_bf16((float)tu_range(rng, -1, 1));
          q[i] = pa_bf16_to_f32(q_bf16[i]);
        }
        /* bf16 Q through the family's own kernel pair where it has one (a
         * narrow Q, or f32 Q in an order of its own), else f32 Q. */
        int use_narrow = narrow->qk != k->qk[cache] && tu_int(rng, 0, 1);
        if (use_narrow) {
          for (size_t i = 0; i < m; i++)
            narrow->load_q((char *)q_narrow + i * ldq * narrow->q_size, q_bf16 + i * ldq, d, 1.0f);
          narrow->qk(m, n, d, q_narrow, ldq, kr.ptr, got, lds, NULL);
        } else {
          k->qk[cache](m, n, d, q, ldq, kr.ptr, got, lds, NULL);
        }
        s->qk[cache](m, n, d, q, ldq, kr.ptr, want, lds, NULL);
        for (size_t i = 0; i < m; i++) {
          for (size_t j = 0; j < n; j++) {
            double scale = qk_scale(PA_F32, q + i * ldq, cache, kr.ptr[j], d);
            CHECK(fp8_close(got[i * lds + j], want[i * lds + j], scale),
                  "qk[%s%s] poison=%d m=%zu n=%zu d=%zu S[%zu][%zu] %g vs %g", pa_dtype_name(cache),
                  use_narrow ? ",bf16 Q" : "", poison, m, n, d, i, j, got[i * lds + j],
                  want[i * lds + j]);
          }
        }
        /* P rounded to bf16 (as the narrow P V takes it), some zeros. */
        for (size_t i = 0; i < m; i++) {
          for (size_t j = 0; j < n; j++)
            got[i * lds + j] = tu_int(rng, 0, 3)
                                   ? pa_bf16_to_f32(pa_f32_to_bf16((float)tu_range(rng, 0, 1)))
                                   : 0.0f;
          for (size_t e = 0; e < ldo; e++)
            o_got[i * ldo + e] = o_want[i * ldo + e] = (float)tu_range(rng, -1, 1);
        }
        if (use_narrow) {
          for (size_t i = 0; i < m && narrow->o_from_columns; i++)
            narrow->o_from_columns(o_got + i * ldo, d);
          narrow->pv(m, n, d, got, lds, vr.ptr, o_got, ldo, NULL, NULL);
          for (size_t i = 0; i < m && narrow->o_to_columns; i++)
            narrow->o_to_columns(o_got + i * ldo, d);
        } else {
          k->pv[cache](m, n, d, got, lds, vr.ptr, o_got, ldo, NULL, NULL);
        }
        s->pv[cache](m, n, d, got, lds, vr.ptr, o_want, ldo, NULL, NULL);
        for (size_t i = 0; i < m; i++) {
          for (size_t e = 0; e < d; e++) {
            double scale = pv_scale(got + i * lds, cache, vr.ptr, n, e, o_want[i * ldo + e]);
            CHECK(fp8_close(o_got[i * ldo + e], o_want[i * ldo + e], scale),
                  "pv[%s%s] poison=%d m=%zu n=%zu d=%zu O[%zu][%zu] %g vs %g", pa_dtype_name(cache),
                  use_narrow ? ",bf16 P" : "", poison, m, n, d, i, e, o_got[i * ldo + e],
                  o_want[i * ldo + e]);
          }
        }
        free_rows(&kr), free_rows(&vr), free(q_bf16), free(q_narrow), free(q), free(got);
        free(want), free(o_got), free(o_want);
      }
    }
  }
}

/* ---- tiled caches (PA_KV_TILED) --------------------------------------------- */

/* Where element e of token t of a tiled tile lies, in elements: the
 * reference's ref_tile_offset, written from the header (not common.h). */
static size_t tiled_at(int side, size_t block_size, size_t d, size_t t, size_t e) {
  return (size_t)ref_tile_offset(REF_TILED, side, (int)block_size, (int)d, (int)t, (int)e);
}

/* unpack_tiled[side](rows, anchors, n, d, size, block_size): row i holds
 * the elements of the key or value anchored at anchors[i] (where its
 * element 0 lies), for element sizes 1, 2 and 4; tokens in any order, from
 * two tiles (a range of keys across blocks), against the header's order. */
static void test_unpack_tiled(const pa_kernels *k, tu_rng *rng) {
  static const size_t block_sizes[] = {16, 32, 48, 128}, heads[] = {16, 48, 80, 128, 256};
  static const size_t sizes[] = {1, 2, 4};
  for (size_t si = 0; si < COUNT(sizes); si++) {
    for (size_t hi = 0; hi < COUNT(heads); hi++) {
      size_t size = sizes[si], d = heads[hi];
      size_t bs = block_sizes[(size_t)tu_int(rng, 0, (int)COUNT(block_sizes) - 1)];
      size_t tile = bs * d * size, n = (size_t)tu_int(rng, 1, (int)(2 * bs));
      unsigned char *tiles = malloc(2 * tile + 3), *out = malloc(n * d * size + 1);
      const void **anchors = malloc(n * sizeof(void *));
      size_t *tok = malloc(n * sizeof(size_t)), *which = malloc(n * sizeof(size_t));
      unsigned char *base = tiles + (size == 1); /* an odd address for 1-byte elements */
      for (int side = 0; side < 2; side++) {
        for (size_t i = 0; i < 2 * tile; i++) base[i] = (unsigned char)tu_next(rng);
        for (size_t i = 0; i < n; i++) {
          which[i] = (size_t)tu_int(rng, 0, 1);
          tok[i] = i < bs ? i : (size_t)tu_int(rng, 0, (int)bs - 1); /* all, then any */
          anchors[i] = base + which[i] * tile + tiled_at(side, bs, d, tok[i], 0) * size;
        }
        memset(out, 0xA5, n * d * size);
        k->unpack_tiled[side](out, anchors, n, d, size, bs);
        long bad = 0;
        for (size_t i = 0; i < n; i++)
          for (size_t e = 0; e < d; e++) {
            const unsigned char *want =
                base + which[i] * tile + tiled_at(side, bs, d, tok[i], e) * size;
            if (memcmp(out + (i * d + e) * size, want, size) != 0 && bad++ < 3)
              CHECK(
                  0,
                  "unpack_tiled[%s] size %zu block_size %zu d %zu: row %zu (token %zu) element %zu",
                  side ? "values" : "keys", size, bs, d, i, tok[i], e);
          }
        CHECK(bad == 0, "unpack_tiled[%s] size %zu block_size %zu d %zu n %zu: %ld elements wrong",
              side ? "values" : "keys", size, bs, d, n, bad);
      }
      free(tiles), free(out), free(anchors), free(tok), free(which);
    }
  }
}

/* A NaN of each cache dtype, as stored. */
static void store_nan(pa_dtype dtype, void *at) {
  switch (dtype) {
    case PA_F32: *(float *)at = NAN; break;
    case PA_F16: *(uint16_t *)at = 0x7E00u; break;
    case PA_BF16: *(uint16_t *)at = 0x7FC0u; break;
    case PA_FP8_E4M3: *(uint8_t *)at = 0x7Fu; break;
    case PA_FP8_E5M2: *(uint8_t *)at = 0x7Eu; break;
  }
}

static const size_t g_tiled_keys[] = {1, 2, 5, 15, 16, 17, 31, 32, 33, 47, 64, 100, 127, 128};
static const size_t g_tiled_heads[] = {16, 32, 48, 64, 80, 96, 128, 256};

/* The products that read a tiled cache in place (qk_tiled, pv_tiled),
 * where a family has them for a dtype pair, against the scalar
 * specification: the tiles unpacked into rows (the scalar unpack, checked
 * above against the header's order), then the scalar pack and packed
 * kernels. Keys [0, n) start a sequence's block (a multiple of 32 keys);
 * their blocks lie scattered. Keys past n hold NaN: in their 16-token group
 * (keys) and their value pair (poison 0, the contract's minimum), or every
 * token of the blocks past n (poison 1, what a cache's unowned slots hold);
 * none may reach S's first n columns or O. S's columns past n rounded up
 * to 16 keep what they held. Head sizes are multiples of 16, those of the
 * kernels' tiled_head_multiple. */
static void test_tiled_products(const pa_attn_ops *k, const pa_attn_ops *s, const pa_kernels *spec,
                                pa_dtype act, pa_dtype cache, tu_rng *rng) {
  static const size_t block_sizes[] = {16, 32, 48, 128};
  size_t size = pa_dtype_size(cache), act_size = pa_dtype_size(act);
  for (size_t it = 0; it < 2 * COUNT(g_tiled_heads); it++) {
    int poison = (int)(it % 2);
    size_t d = g_tiled_heads[it / 2];
    if (d % k->tiled_head_multiple) continue;
    size_t n = g_tiled_keys[(size_t)tu_int(rng, 0, (int)COUNT(g_tiled_keys) - 1)];
    size_t bs = block_sizes[(size_t)tu_int(rng, 0, (int)COUNT(block_sizes) - 1)];
    size_t m = g_packed_rows[(size_t)tu_int(rng, 0, (int)(COUNT(g_packed_rows) - 1))];
    size_t used = (n + bs - 1) / bs, slots = used + 2, tile = bs * d * size;
    size_t ldq = (d + 63) / 64 * 64 + 2, lds = PA_PACK_KEYS + 3, ldo = d + 1;
    /* Blocks in shuffled slots of one buffer per side. */
    size_t order[PA_PACK_KEYS + 2];
    for (size_t b = 0; b < slots; b++) order[b] = b;
    for (size_t b = slots - 1; b > 0; b--) {
      size_t j = (size_t)tu_int(rng, 0, (int)b), x = order[b];
      order[b] = order[j];
      order[j] = x;
    }
    unsigned char *side_buf[2];
    const void **anchors[2];
    rows unpacked[2];
    for (int side = 0; side < 2; side++) {
      side_buf[side] = malloc(slots * tile);
      random_elements(rng, cache, side_buf[side], slots * bs * d);
      anchors[side] = malloc(n * sizeof(void *));
      for (size_t j = 0; j < n; j++)
        anchors[side][j] =
            side_buf[side] + order[j / bs] * tile + tiled_at(side, bs, d, j % bs, 0) * size;
    }
    /* NaN past n. */
    size_t last = (n - 1) / bs, end = poison ? (last + 1) * bs : 0;
    for (size_t t = n; t < (poison ? end : (n + 15) / 16 * 16); t++)
      for (size_t e = 0; e < d; e++)
        store_nan(cache, side_buf[0] + order[t / bs] * tile + tiled_at(0, bs, d, t % bs, e) * size);
    for (size_t t = n; t < (poison ? end : n + (n % 2)); t++)
      for (size_t e = 0; e < d; e++)
        store_nan(cache, side_buf[1] + order[t / bs] * tile + tiled_at(1, bs, d, t % bs, e) * size);
    if (poison) /* the spare blocks: free slots */
      for (size_t b = used; b < slots; b++)
        for (size_t t = 0; t < bs; t++)
          for (size_t e = 0; e < d; e++)
            for (int side = 0; side < 2; side++)
              store_nan(cache,
                        side_buf[side] + order[b] * tile + tiled_at(side, bs, d, t, e) * size);
    for (int side = 0; side < 2; side++) {
      /* One block of n rows, the layout unpack_tiled writes. */
      unpacked[side].n = 1;
      unpacked[side].block[0] = malloc(n * d * size + 1);
      spec->unpack_tiled[side](unpacked[side].block[0], anchors[side], n, d, size, bs);
      for (size_t j = 0; j < n; j++)
        unpacked[side].ptr[j] = (const char *)unpacked[side].block[0] + j * d * size;
    }

    void *q_act = malloc(m * ldq * 4), *q_k = malloc(m * ldq * 4), *q_s = malloc(m * ldq * 4);
    void *sp = malloc(pa_packed_bytes(d));
    float *got = malloc(m * lds * 4), *want = malloc(m * lds * 4), *p = malloc(m * lds * 4);
    float *o_got = malloc(m * ldo * 4), *o_want = malloc(m * ldo * 4), *rescale = malloc(m * 4);
    random_elements(rng, act, q_act, m * ldq);
    pa_load_row_fn load_q_tiled = k->load_q_tiled ? k->load_q_tiled : k->load_q_packed;
    for (size_t i = 0; i < m; i++) {
      load_q_tiled((char *)q_k + i * ldq * k->q_size, (char *)q_act + i * ldq * act_size, d, 1.0f);
      s->load_q_packed((char *)q_s + i * ldq * s->q_size, (char *)q_act + i * ldq * act_size, d,
                       1.0f);
    }
    for (size_t i = 0; i < m * lds; i++) got[i] = -1234.5f;
    void *k_stage = malloc(pa_packed_bytes(d)); /* the kernel's scratch, stale NaN */
    memset(k_stage, 0xff, pa_packed_bytes(d));
    if (k->stage_tiled[0]) k->stage_tiled[0](k_stage, anchors[0], n, d, bs);
    k->qk_tiled(m, n, d, q_k, ldq, anchors[0], k_stage, got, lds, NULL);
    free(k_stage);
    s->pack_k(sp, unpacked[0].ptr, n, d);
    s->qk_packed(m, n, d, q_s, ldq, sp, want, lds, NULL);
    size_t written = (n + 15) / 16 * 16;
    long bad = 0;
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < n; j++) {
        double scale =
            qk_scale(act, (char *)q_act + i * ldq * act_size, cache, unpacked[0].ptr[j], d);
        if (!rel_close(got[i * lds + j], want[i * lds + j], scale, 1e-5) && bad++ < 3)
          CHECK(0,
                "qk_tiled[%s,%s] poison=%d m=%zu n=%zu d=%zu block_size=%zu S[%zu][%zu] %g vs %g",
                pa_dtype_name(act), pa_dtype_name(cache), poison, m, n, d, bs, i, j,
                got[i * lds + j], want[i * lds + j]);
      }
      for (size_t j = written; j < lds; j++)
        if (got[i * lds + j] != -1234.5f && bad++ < 3)
          CHECK(0, "qk_tiled[%s,%s] m=%zu n=%zu d=%zu wrote S[%zu][%zu], past n rounded up to 16",
                pa_dtype_name(act), pa_dtype_name(cache), m, n, d, i, j);
    }
    CHECK(bad == 0, "qk_tiled[%s,%s] poison=%d m=%zu n=%zu d=%zu block_size=%zu: %ld wrong",
          pa_dtype_name(act), pa_dtype_name(cache), poison, m, n, d, bs, bad);

    /* P rounded to bf16 (a bf16 P V rounds it; split pairs keep it), zeros
     * past n. */
    for (size_t i = 0; i < m; i++) {
      for (size_t j = 0; j < lds; j++) {
        float x = j < n && tu_int(rng, 0, 3) ? (float)tu_range(rng, 0, 1) : 0.0f;
        p[i * lds + j] = k->tiled_p_split ? x : pa_bf16_to_f32(pa_f32_to_bf16(x));
      }
      for (size_t e = 0; e < ldo; e++)
        o_got[i * ldo + e] = o_want[i * ldo + e] = (float)tu_range(rng, -1, 1);
      rescale[i] = random_rescale(rng, o_got + i * ldo, o_want + i * ldo, d);
    }
    void *stage = malloc(pa_packed_bytes(d)); /* the kernel's scratch, stale NaN */
    memset(stage, 0xff, pa_packed_bytes(d));
    void *p_rows = malloc(m * lds * 4);
    if (k->stage_tiled[1]) k->stage_tiled[1](stage, anchors[1], n, d, bs);
    k->pv_tiled(m, n, d, tiled_p(k, p, m, n, lds, p_rows), lds, anchors[1], bs, stage, o_got, ldo,
                rescale, NULL);
    free(stage), free(p_rows);
    s->pack_v(sp, unpacked[1].ptr, n, d);
    s->pv_packed(m, n, d, p, lds, sp, o_want, ldo, rescale, NULL);
    bad = 0;
    for (size_t i = 0; i < m; i++) {
      for (size_t e = 0; e < ldo; e++) {
        int ok = e < d ? rel_close(o_got[i * ldo + e], o_want[i * ldo + e],
                                   pv_scale(p + i * lds, cache, unpacked[1].ptr, n, e,
                                            o_want[i * ldo + e]),
                                   1e-5)
                       : o_got[i * ldo + e] == o_want[i * ldo + e];
        if (!ok && bad++ < 3)
          CHECK(0,
                "pv_tiled[%s,%s] poison=%d m=%zu n=%zu d=%zu block_size=%zu O[%zu][%zu] %g vs %g",
                pa_dtype_name(act), pa_dtype_name(cache), poison, m, n, d, bs, i, e,
                o_got[i * ldo + e], o_want[i * ldo + e]);
      }
    }
    CHECK(bad == 0, "pv_tiled[%s,%s] poison=%d m=%zu n=%zu d=%zu block_size=%zu: %ld wrong",
          pa_dtype_name(act), pa_dtype_name(cache), poison, m, n, d, bs, bad);
    for (int side = 0; side < 2; side++)
      free(side_buf[side]), free(anchors[side]), free_rows(&unpacked[side]);
    free(q_act), free(q_k), free(q_s), free(sp), free(got), free(want), free(p);
    free(o_got), free(o_want), free(rescale);
  }
}

/* tiled_rng: the tiled caches' tests draw from their own generator, so the
 * other tests' data stays what it was before them. */
/* A family whose kernels keep the tile configuration between calls
 * (release_tiles): the call after a release loads it again, whatever rows
 * the call before had (one that found the tiles released would fault). */
static void test_release_tiles(const pa_kernels *k, const pa_kernels *s, tu_rng *rng) {
  for (int round = 0; round < 4; round++) {
    k->release_tiles();
    k->release_tiles(); /* twice: nothing to release the second time */
    test_packed(&k->attn[PA_BF16][PA_BF16], &s->attn[PA_BF16][PA_BF16], PA_BF16, PA_BF16, rng);
  }
  k->release_tiles();
}

static void test_family(pa_isa isa, int bf16_dot, const pa_kernels *scalar, tu_rng *rng,
                        tu_rng *tiled_rng) {
  pa_kernels k;
  pa_kernels_build(isa, bf16_dot, &k);
  static char name[64];
  snprintf(name, sizeof name, "%s%s", pa_isa_name(isa),
           isa < PA_ISA_AVX512BF16 ? ""
           : bf16_dot              ? " (bf16 dot)"
                                   : " (bf16 on FMA)");
  g_family = name;
  test_conversions(&k, scalar, rng);
  test_qk_pv(&k, scalar, rng);
  test_fp8_codes(&k, scalar, rng);
  test_softmax(&k, scalar, rng, WEIGHTS_F32);
  test_softmax_nan(&k, scalar, rng, WEIGHTS_F32);
  if (k.softmax_bf16_rows != scalar->softmax_bf16_rows) {
    test_softmax(&k, scalar, rng, WEIGHTS_BF16_ROWS);
    test_softmax_nan(&k, scalar, rng, WEIGHTS_BF16_ROWS);
  }
  if (k.softmax_split_rows != scalar->softmax_split_rows) {
    test_softmax(&k, scalar, rng, WEIGHTS_SPLIT);
    test_softmax_nan(&k, scalar, rng, WEIGHTS_SPLIT);
  }
  test_unpack_tiled(&k, tiled_rng);
  int tiled_pairs = 0;
  for (int a = 0; a < PA_NUM_ACT_DTYPES; a++) {
    for (int c = 0; c < PA_NUM_DTYPES; c++) {
      const pa_attn_ops *ops = &k.attn[a][c];
      test_packed(ops, &scalar->attn[a][c], (pa_dtype)a, (pa_dtype)c, rng);
      if (ops->qk != k.qk[c] || ops->pv != k.pv[c]) /* a direct kernel pair of its own */
        test_narrow_direct(ops, scalar, (pa_dtype)a, (pa_dtype)c, rng);
      if (ops->qk_tiled) {
        CHECK(ops->pv_tiled != NULL, "[%s,%s] has qk_tiled without pv_tiled",
              pa_dtype_name((pa_dtype)a), pa_dtype_name((pa_dtype)c));
        if (!ops->pv_tiled) continue;
        test_tiled_products(ops, &scalar->attn[a][c], scalar, (pa_dtype)a, (pa_dtype)c, tiled_rng);
        tiled_pairs++;
      }
    }
  }
  if (!tiled_pairs)
    printf("test_kernels: %s: no dtype pair reads tiled caches in place (qk_tiled), skipped\n",
           g_family);
  if (k.release_tiles) test_release_tiles(&k, scalar, rng);
  printf("test_kernels: %s family checked against scalar\n", g_family);
}

int main(int argc, char **argv) {
  uint64_t seed = tu_seed_from_args(argc, argv, 20261129);
  tu_rng rng;
  tu_rng_seed(&rng, seed);
  printf("test_kernels: seed %llu (PA_TEST_SEED=%llu reproduces a run)\n", (unsigned long long)seed,
         (unsigned long long)seed);
  pa_kernels scalar;
  pa_kernels_build(PA_ISA_SCALAR, 0, &scalar);
  /* The scalar unpack of tiled caches is the specification of the tiled
   * products: checked against the header's order itself. */
  tu_rng tiled_rng;
  tu_rng_seed(&tiled_rng, tu_mix(seed, 0x711ED));
  g_family = "scalar";
  test_unpack_tiled(&scalar, &tiled_rng);
  pa_isa best = pa_isa_detect();
  if (best == PA_ISA_SCALAR) {
    /* The scalar kernels are the specification: with no vector family
     * there is nothing to compare them with. */
    printf("test_kernels: no vector family on this CPU, nothing to compare\n");
    return tu_finish("test_kernels");
  }
  /* The paths with bf16 dot products run with them and with the FMA units
   * for bf16 caches instead: which one a context takes depends on the CPU. */
  for (int isa = PA_ISA_AVX2; isa <= (int)best; isa++) {
    test_family((pa_isa)isa, 1, &scalar, &rng, &tiled_rng);
    if (isa >= PA_ISA_AVX512BF16) test_family((pa_isa)isa, 0, &scalar, &rng, &tiled_rng);
  }
  for (int isa = (int)best + 1; isa < PA_NUM_ISAS; isa++) {
    printf("test_kernels: %s family not checked: this CPU%s does not provide it\n",
           pa_isa_name((pa_isa)isa),
           isa == PA_ISA_AMX ? " (or the OS, which grants the tiles)" : "");
  }
  return tu_finish("test_kernels");
}
