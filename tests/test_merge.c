/*
 * pa_merge_states against the double-precision reference (ref_merge_states,
 * written from the definition): seeded random cases over shapes, dtypes,
 * strides, thread counts and aliasing (out over out_a or out_b, lse over
 * lse_a or lse_b), rows with -inf on one side or both, and the header's
 * rules for NaN and +inf. Every case also checks that the call wrote
 * nothing but its rows and lse entries, and read-only inputs stayed as they
 * were.
 *
 * Reproduce a failure with the printed PA_TEST_SEED and PA_TEST_ONLY.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { NUM_CTX = 3, EXTRA_ROWS = 2, LSE_EXTRA = 5 };
static const int g_threads[NUM_CTX] = {1, 2, 3};
static pa_context *g_ctx[NUM_CTX];
static uint64_t g_seed;
static long g_index, g_only = -1;

typedef enum alias { ALIAS_NONE, ALIAS_OUT_A, ALIAS_OUT_B } alias;

typedef struct merge_case {
  int64_t rows;
  int num_heads, head_size;
  pa_dtype dtype;
  int pad_a, pad_b, pad_out; /* elements after each row */
  alias out_alias;           /* out is out_a or out_b (then its stride too) */
  alias lse_alias;           /* lse is lse_a or lse_b */
  int want_lse;
  double empty_a, empty_b; /* chance of -inf per row and head */
  int ctx;
  double mag;
} merge_case;

static void describe(const merge_case *c, char *buf, size_t size) {
  static const char *const aliases[] = {"none", "a", "b"};
  snprintf(buf, size,
           "rows=%lld heads=%d head_size=%d dtype=%s pads=%d/%d/%d out_alias=%s lse_alias=%s "
           "lse=%d empty=%g/%g threads=%d mag=%g",
           (long long)c->rows, c->num_heads, c->head_size, pa_dtype_name(c->dtype), c->pad_a,
           c->pad_b, c->pad_out, aliases[c->out_alias], aliases[c->lse_alias], c->want_lse,
           c->empty_a, c->empty_b, g_threads[c->ctx], c->mag);
}

/* lse values of partial results: moderate, far apart now and then (one
 * side's weight underflows), or -inf (the side saw no key). */
static void fill_lse(tu_rng *rng, float *lse, int64_t n, double empty) {
  for (int64_t i = 0; i < n; i++) {
    double u = tu_uniform(rng);
    lse[i] = tu_chance(rng, empty) ? -INFINITY
             : u < 0.9             ? (float)tu_range(rng, -6.0, 12.0)
                                   : (float)tu_range(rng, -120.0, 120.0);
  }
}

static float *alloc_lse(int64_t n) {
  float *p = tu_malloc((size_t)(n + LSE_EXTRA) * sizeof(float));
  tu_fill_canary(p, (size_t)(n + LSE_EXTRA) * sizeof(float));
  return p;
}

/* |out - ref| within the activation tolerance, the absolute part relative
 * to the larger input magnitude of that row and head. */
static long check_case(const char *tag, const merge_case *c, const void *out, int64_t out_stride,
                       const float *lse, const unsigned char *a0, int64_t a_stride,
                       const float *la0, const unsigned char *b0, int64_t b_stride,
                       const float *lb0, const double *ref_out, const double *ref_lse) {
  ref_dtype t = hx_ref_dtype(c->dtype);
  size_t es = ref_dtype_size(t);
  int d = c->head_size, width = c->num_heads * d;
  hx_tol tol = hx_tolerance(c->dtype);
  long bad = 0;
  for (int64_t r = 0; r < c->rows; r++) {
    for (int h = 0; h < c->num_heads; h++) {
      float la = la0[r * c->num_heads + h], lb = lb0[r * c->num_heads + h];
      const unsigned char *got =
          (const unsigned char *)out + ((size_t)(r * out_stride) + (size_t)h * (size_t)d) * es;
      if (la == -INFINITY || lb == -INFINITY) {
        /* The other side, bit for bit (or zeros). */
        const unsigned char *want =
            la == -INFINITY ? b0 + ((size_t)(r * b_stride) + (size_t)h * (size_t)d) * es
                            : a0 + ((size_t)(r * a_stride) + (size_t)h * (size_t)d) * es;
        int ok = 1;
        for (int e = 0; e < d && ok; e++) {
          if (la == -INFINITY && lb == -INFINITY)
            ok = ref_load(got, e, t) == 0.0f && !signbit(ref_load(got, e, t));
          else
            ok = memcmp(got + (size_t)e * es, want + (size_t)e * es, es) == 0;
        }
        if (!ok && bad++ < 6)
          TU_CHECK(0, "%s: row %lld head %d (lse %g, %g): out is not %s", tag, (long long)r, h,
                   (double)la, (double)lb,
                   la == lb ? "zeros" : "the other side's row, bit for bit");
      } else {
        double vmax = 0;
        for (int e = 0; e < d; e++) {
          vmax = fmax(vmax, fabs(ref_load(a0, r * a_stride + (int64_t)h * d + e, t)));
          vmax = fmax(vmax, fabs(ref_load(b0, r * b_stride + (int64_t)h * d + e, t)));
        }
        for (int e = 0; e < d; e++) {
          double g = ref_load(got, e, t), w = ref_out[r * width + (int64_t)h * d + e];
          double lim = tol.atol * vmax + tol.rtol * fabs(w);
          if (fabs(g - w) <= lim) continue; /* also rejects NaN */
          if (bad++ < 6)
            TU_CHECK(0, "%s: row %lld head %d dim %d: got %.9g want %.9g (tolerance %.3g)", tag,
                     (long long)r, h, e, g, w, lim);
        }
      }
      if (lse) {
        double g = lse[r * c->num_heads + h], w = ref_lse[r * c->num_heads + h];
        int ok = isinf(w) ? g == w : fabs(g - w) <= 1e-5 * (1.0 + fabs(w));
        if (!ok && bad++ < 6)
          TU_CHECK(0, "%s: lse row %lld head %d: got %.9g want %.9g", tag, (long long)r, h, g, w);
      }
    }
  }
  tu_checks++;
  if (bad > 6) TU_CHECK(0, "%s: %ld values wrong in all", tag, bad);
  return bad;
}

static void run_case(const merge_case *c) {
  long index = g_index++;
  if (g_only >= 0 && index != g_only) return;
  char tag[48];
  snprintf(tag, sizeof tag, "case %ld", index);
  long before = tu_failures;
  tu_rng rng;
  tu_rng_seed(&rng, tu_mix(g_seed, (uint64_t)index));
  int width = c->num_heads * c->head_size;
  int64_t rows = c->rows, heads = c->num_heads, n_lse = rows * heads;
  size_t es = pa_dtype_size(c->dtype);
  int64_t a_stride = width + c->pad_a, b_stride = width + c->pad_b;
  int64_t all_rows = rows + EXTRA_ROWS;
  /* Inputs, with NaN in their padding (hx_fill_rows): a merge that reads
   * it shows. */
  void *a = hx_alloc_rows(all_rows, a_stride, c->dtype),
       *b = hx_alloc_rows(all_rows, b_stride, c->dtype);
  hx_fill_rows(&rng, a, a_stride, all_rows, width, c->dtype, c->mag);
  hx_fill_rows(&rng, b, b_stride, all_rows, width, c->dtype, c->mag * tu_range(&rng, 0.1, 3.0));
  float *la = alloc_lse(n_lse), *lb = alloc_lse(n_lse);
  fill_lse(&rng, la, n_lse, c->empty_a);
  fill_lse(&rng, lb, n_lse, c->empty_b);
  /* Copies of everything before the call: the reference reads these, and
   * the read-only inputs must still match them afterwards. */
  size_t a_bytes = (size_t)(all_rows * a_stride) * es, b_bytes = (size_t)(all_rows * b_stride) * es;
  size_t lse_bytes = (size_t)(n_lse + LSE_EXTRA) * sizeof(float);
  unsigned char *a0 = tu_malloc(a_bytes), *b0 = tu_malloc(b_bytes);
  float *la0 = tu_malloc(lse_bytes), *lb0 = tu_malloc(lse_bytes);
  memcpy(a0, a, a_bytes);
  memcpy(b0, b, b_bytes);
  memcpy(la0, la, lse_bytes);
  memcpy(lb0, lb, lse_bytes);

  void *out = NULL, *own_out = NULL;
  int64_t out_stride = width + c->pad_out;
  size_t out_bytes = (size_t)(all_rows * out_stride) * es;
  if (c->out_alias == ALIAS_OUT_A) {
    out = a;
    out_stride = a_stride;
  } else if (c->out_alias == ALIAS_OUT_B) {
    out = b;
    out_stride = b_stride;
  } else {
    out = own_out = tu_malloc(out_bytes);
    tu_fill_canary(own_out, out_bytes);
  }
  float *lse = NULL, *own_lse = NULL;
  if (c->want_lse) {
    lse = c->lse_alias == ALIAS_OUT_A ? la : c->lse_alias == ALIAS_OUT_B ? lb : NULL;
    if (!lse) lse = own_lse = alloc_lse(n_lse);
  }

  double *ref_out = tu_calloc((size_t)(rows * width) + 1, sizeof(double));
  double *ref_lse = tu_calloc((size_t)n_lse + 1, sizeof(double));
  ref_merge_states(rows, c->num_heads, c->head_size, hx_ref_dtype(c->dtype), a0, a_stride, la0, b0,
                   b_stride, lb0, ref_out, ref_lse);
  pa_status st = pa_merge_states(g_ctx[c->ctx], rows, c->num_heads, c->head_size, c->dtype, a,
                                 a_stride, la, b, b_stride, lb, out, out_stride, lse);
  TU_CHECK(st == PA_OK, "%s: pa_merge_states: %s (%s)", tag, pa_status_string(st), pa_last_error());
  if (st == PA_OK)
    check_case(tag, c, out, out_stride, lse, a0, a_stride, la0, b0, b_stride, lb0, ref_out,
               ref_lse);

  /* Nothing else written: each row's padding and the rows after the batch
   * hold what they held, and so does every input the call does not write. */
  const unsigned char *out_before = c->out_alias == ALIAS_OUT_A   ? a0
                                    : c->out_alias == ALIAS_OUT_B ? b0
                                                                  : NULL;
  for (int64_t r = 0; r < all_rows; r++) {
    size_t row = (size_t)(r * out_stride) * es;
    size_t from = r < rows ? row + (size_t)width * es : row, to = row + (size_t)out_stride * es;
    int same = 1;
    for (size_t i = from; i < to && same; i++)
      same = out_before ? ((unsigned char *)out)[i] == out_before[i]
                        : ((unsigned char *)out)[i] == TU_CANARY;
    TU_CHECK(same, "%s: out %s %lld was written", tag, r < rows ? "padding of row" : "row",
             (long long)r);
  }
  if (c->out_alias != ALIAS_OUT_A)
    TU_CHECK(memcmp(a, a0, a_bytes) == 0, "%s: out_a was written", tag);
  if (c->out_alias != ALIAS_OUT_B)
    TU_CHECK(memcmp(b, b0, b_bytes) == 0, "%s: out_b was written", tag);
  if (!lse || lse != la) TU_CHECK(memcmp(la, la0, lse_bytes) == 0, "%s: lse_a was written", tag);
  if (!lse || lse != lb) TU_CHECK(memcmp(lb, lb0, lse_bytes) == 0, "%s: lse_b was written", tag);
  if (lse) {
    size_t at = tu_find_non_canary(lse + n_lse, LSE_EXTRA * sizeof(float));
    int untouched = lse == own_lse ? at == LSE_EXTRA * sizeof(float)
                                   : memcmp(lse + n_lse, (lse == la ? la0 : lb0) + n_lse,
                                            LSE_EXTRA * sizeof(float)) == 0;
    TU_CHECK(untouched, "%s: lse entries past the rows were written", tag);
  }

  if (tu_failures != before) {
    char desc[512];
    describe(c, desc, sizeof desc);
    fprintf(stderr, "  %s: %s\n  reproduce: PA_TEST_SEED=%llu PA_TEST_ONLY=%ld\n", tag, desc,
            (unsigned long long)g_seed, index);
  }
  free(a), free(b), free(la), free(lb), free(a0), free(b0), free(la0), free(lb0);
  free(own_out), free(own_lse), free(ref_out), free(ref_lse);
}

static void random_case(tu_rng *g, merge_case *c) {
  static const int head_sizes[] = {1, 2, 3, 7, 8, 16, 64, 64, 80, 96, 128, 128, 130, 256, 1024};
  memset(c, 0, sizeof *c);
  c->num_heads = tu_int(g, 1, 8);
  c->head_size = head_sizes[tu_int(g, 0, (int)(sizeof head_sizes / sizeof(int)) - 1)];
  c->rows = tu_chance(g, 0.05) ? 0 : tu_int(g, 1, 40);
  while (c->rows * c->num_heads * c->head_size > 200000) c->rows /= 2;
  c->dtype = (pa_dtype)tu_int(g, 0, 2);
  c->pad_a = tu_chance(g, 0.5) ? tu_int(g, 1, 9) : 0;
  c->pad_b = tu_chance(g, 0.5) ? tu_int(g, 1, 9) : 0;
  c->pad_out = tu_chance(g, 0.5) ? tu_int(g, 1, 9) : 0;
  c->out_alias = (alias)(tu_chance(g, 0.4) ? tu_int(g, 1, 2) : 0);
  c->lse_alias = (alias)(tu_chance(g, 0.4) ? tu_int(g, 1, 2) : 0);
  c->want_lse = c->lse_alias != ALIAS_NONE || tu_chance(g, 0.8);
  c->empty_a = tu_chance(g, 0.3) ? tu_range(g, 0.0, 0.5) : 0.0;
  c->empty_b = tu_chance(g, 0.3) ? tu_range(g, 0.0, 0.5) : 0.0;
  c->ctx = tu_int(g, 0, NUM_CTX - 1);
  c->mag = exp(tu_range(g, log(0.01), log(100.0)));
}

static merge_case base(int64_t rows, int heads, int head_size, pa_dtype t) {
  merge_case c;
  memset(&c, 0, sizeof c);
  c.rows = rows;
  c.num_heads = heads;
  c.head_size = head_size;
  c.dtype = t;
  c.want_lse = 1;
  c.mag = 2.0;
  return c;
}

static void targeted_cases(void) {
  /* Every aliasing of out and lse, each dtype, with -inf rows on either side. */
  for (int t = PA_F32; t <= PA_BF16; t++)
    for (int oa = 0; oa < 3; oa++)
      for (int la = 0; la < 3; la++) {
        merge_case c = base(17, 3, 40, (pa_dtype)t);
        c.out_alias = (alias)oa;
        c.lse_alias = (alias)la;
        c.pad_a = 3;
        c.pad_b = oa == 2 ? 0 : 5;
        c.pad_out = 2;
        c.empty_a = 0.2;
        c.empty_b = 0.2;
        c.ctx = (t + oa + la) % NUM_CTX;
        run_case(&c);
      }
  /* All rows empty on one side, then on both. */
  for (int side = 0; side < 3; side++) {
    merge_case c = base(9, 2, 64, PA_BF16);
    c.empty_a = side != 1 ? 1.0 : 0.0;
    c.empty_b = side != 0 ? 1.0 : 0.0;
    run_case(&c);
  }
  /* Large enough for the pool: 3 threads, each dtype, every head size class. */
  static const int sizes[] = {128, 1024, 1};
  for (int t = PA_F32; t <= PA_BF16; t++) {
    merge_case c = base(t == 2 ? 2000 : 300, 8, sizes[t], (pa_dtype)t);
    c.ctx = 2;
    c.empty_a = 0.05;
    c.out_alias = t == 1 ? ALIAS_OUT_B : ALIAS_NONE;
    c.lse_alias = t == 1 ? ALIAS_OUT_A : ALIAS_NONE;
    run_case(&c);
  }
  /* Without lse, and one row of one element. */
  merge_case c = base(5, 4, 16, PA_F16);
  c.want_lse = 0;
  run_case(&c);
  run_case(&(merge_case){.rows = 1, .num_heads = 1, .head_size = 1, .want_lse = 1, .mag = 1});
}

/* The header's rules for the lse values that are not finite. */
static void test_special_lse(void) {
  enum { H = 6, D = 3 };
  float a[H * D], b[H * D], out[H * D], lse[H];
  for (int i = 0; i < H * D; i++) a[i] = (float)i, b[i] = (float)(-i - 1);
  a[1 * D] = NAN; /* garbage in a side that saw no key is never read */
  float la[H] = {-INFINITY, -INFINITY, NAN, INFINITY, NAN, -INFINITY};
  float lb[H] = {2.0f, -INFINITY, 1.0f, 0.0f, -INFINITY, NAN};
  pa_status st =
      pa_merge_states(g_ctx[0], 1, H, D, PA_F32, a, H * D, la, b, H * D, lb, out, H * D, lse);
  TU_CHECK(st == PA_OK, "special lse: %s", pa_last_error());
  if (st != PA_OK) return;
  TU_CHECK(out[0] == b[0] && out[2] == b[2] && lse[0] == 2.0f, "-inf on a: takes b");
  TU_CHECK(out[D] == 0 && out[D + 1] == 0 && lse[1] == -INFINITY, "-inf on both: zeros, -inf");
  TU_CHECK(isnan(out[2 * D]) && isnan(out[2 * D + 2]) && isnan(lse[2]), "NaN lse: NaN row");
  TU_CHECK(isnan(out[3 * D]) && isnan(lse[3]), "+inf lse: NaN row");
  TU_CHECK(out[4 * D] == a[4 * D] && isnan(lse[4]), "NaN against -inf: that side as it is");
  TU_CHECK(out[5 * D + 1] == b[5 * D + 1] && isnan(lse[5]), "-inf against NaN: the NaN side");
}

/* Zero rows need no tensors; one row's strides may be anything. */
static void test_edges(void) {
  TU_CHECK(pa_merge_states(g_ctx[1], 0, 4, 64, PA_BF16, NULL, 0, NULL, NULL, 0, NULL, NULL, 0,
                           NULL) == PA_OK,
           "zero rows: %s", pa_last_error());
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {8, 7, 6, 5, 4, 3, 2, 1}, out[8], lse[2];
  float la[2] = {0, 0}, lb[2] = {0, 0};
  pa_status st = pa_merge_states(g_ctx[0], 1, 2, 4, PA_F32, a, INT64_MAX, la, b, INT64_MAX / 2, lb,
                                 out, INT64_MAX, lse);
  TU_CHECK(st == PA_OK && out[0] == 4.5f && out[7] == 4.5f && fabsf(lse[1] - logf(2.0f)) < 1e-6f,
           "one row, huge strides: %s", pa_last_error());
}

int main(int argc, char **argv) {
  g_seed = tu_seed_from_args(argc, argv, 0x3e76e);
  g_only = tu_only_case();
  for (int i = 0; i < NUM_CTX; i++) {
    if (pa_context_create(g_threads[i], &g_ctx[i]) != PA_OK) {
      fprintf(stderr, "pa_context_create(%d): %s\n", g_threads[i], pa_last_error());
      return 1;
    }
  }
  printf("test_merge: seed %llu, isa %s\n", (unsigned long long)g_seed, pa_context_isa(g_ctx[0]));
  double t0 = tu_now();
  targeted_cases();
  test_special_lse();
  test_edges();
  tu_rng g;
  tu_rng_seed(&g, tu_mix(g_seed, 0xB1E2D));
  long n_random = (long)(400 * tu_case_scale());
  for (long i = 0; i < n_random; i++) {
    merge_case c;
    random_case(&g, &c);
    run_case(&c);
  }
  for (int i = 0; i < NUM_CTX; i++) pa_context_destroy(g_ctx[i]);
  printf("test_merge: %ld cases, %.2f s\n", g_index, tu_now() - t0);
  return tu_finish("test_merge");
}
