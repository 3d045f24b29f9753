/* pa_merge_states from arbitrary bytes: shapes, dtypes, strides, NULL
 * pointers, out and lse aliasing an input, and lse values that are finite,
 * far apart, -inf on one side or both, NaN or +inf. PA_OK must give the
 * reference's merge (and, for the values that are not finite, the header's
 * rules) and write nothing but the rows and lse entries; an error must
 * leave out and lse as they were. Inputs that are not out or lse are never
 * written. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_ROWS = 64, MAX_ELEMS = 1 << 16, LSE_EXTRA = 4 };

typedef enum alias { ALIAS_NONE, ALIAS_A, ALIAS_B } alias;

static float decode_lse(fz_in *in) {
  static const float edges[] = {-INFINITY, -INFINITY, NAN,    INFINITY, 88.0f, -88.0f,
                                1e30f,     -1e30f,    1e-40f, 0.0f,     -0.0f, 200.0f};
  unsigned b = fz_u8(in);
  if (b < 200) return (float)((int)(b % 64) - 24) * 0.375f;
  return edges[(b - 200) % 12];
}

static int64_t lse_floats(int64_t rows, int heads) {
  return rows > 0 && heads > 0 ? rows * heads : 0;
}

/* The header's rules for one row and head, the values of both sides given. */
static void check_head(pa_dtype t, int d, const unsigned char *a, const unsigned char *b, float la,
                       float lb, const unsigned char *got, float got_lse, int has_lse,
                       const double *ref, double ref_lse) {
  ref_dtype rt = (ref_dtype)t;
  size_t es = pa_dtype_size(t);
  if (la == -INFINITY || lb == -INFINITY) {
    const unsigned char *want = la == -INFINITY ? b : a;
    for (int e = 0; e < d; e++) {
      if (la == -INFINITY && lb == -INFINITY) {
        float v = ref_load(got, e, rt);
        FZ_ASSERT(v == 0.0f && !signbit(v), "pa_merge_states: -inf on both sides gave %g", v);
      } else {
        FZ_ASSERT(memcmp(got + (size_t)e * es, want + (size_t)e * es, es) == 0,
                  "pa_merge_states: -inf on one side did not take the other's value bit for bit");
      }
    }
    float want_lse = la == -INFINITY ? lb : la;
    FZ_ASSERT(!has_lse || memcmp(&got_lse, &want_lse, sizeof want_lse) == 0 ||
                  (isnan(got_lse) && isnan(want_lse)),
              "pa_merge_states: -inf on one side gave lse %g, not the other's %g", (double)got_lse,
              (double)want_lse);
    return;
  }
  if (isnan(la) || isnan(lb) || la == INFINITY || lb == INFINITY) {
    for (int e = 0; e < d; e++)
      FZ_ASSERT(isnan(ref_load(got, e, rt)), "pa_merge_states: lse %g, %g gave a number",
                (double)la, (double)lb);
    FZ_ASSERT(!has_lse || isnan(got_lse), "pa_merge_states: lse %g, %g gave lse %g", (double)la,
              (double)lb, (double)got_lse);
    return;
  }
  hx_tol tol = hx_tolerance(t);
  double vmax = 0;
  for (int e = 0; e < d; e++)
    vmax = fmax(vmax, fmax(fabs(ref_load(a, e, rt)), fabs(ref_load(b, e, rt))));
  for (int e = 0; e < d; e++) {
    double g = ref_load(got, e, rt), lim = tol.atol * vmax + tol.rtol * fabs(ref[e]);
    FZ_ASSERT(fabs(g - ref[e]) <= lim,
              "pa_merge_states: dim %d: got %.9g, the reference %.9g (lse %g, %g)", e, g, ref[e],
              (double)la, (double)lb);
  }
  FZ_ASSERT(!has_lse || fabs(got_lse - ref_lse) <= 1e-5 * (1.0 + fabs(ref_lse)),
            "pa_merge_states: lse %.9g, the reference %.9g", (double)got_lse, ref_lse);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  pa_context *ctx = fz_context(&in);
  int64_t rows = FZ_EDGY(&in, 0, 9, -1, INT64_MIN, MAX_ROWS, (int64_t)1 << 61, INT64_MAX, 33);
  int heads = fz_int(FZ_EDGY(&in, 1, 8, 0, -1, 65536, 65537, INT32_MAX, 16));
  int hs = fz_int(FZ_EDGY(&in, 1, 24, 0, -1, 64, 128, 1024, 1025, INT32_MIN));
  pa_dtype t = fz_one_in(&in, 16) ? (pa_dtype)fz_int(FZ_EDGY(&in, 3, 7, -1, INT32_MIN))
                                  : (pa_dtype)fz_range(&in, 0, 2);
  int64_t width = (int64_t)heads * hs;
  int64_t strides[3];
  for (int i = 0; i < 3; i++)
    strides[i] = FZ_EDGY(&in, width, width + 3, width - 1, 0, -1, INT64_MIN, INT64_MAX,
                         INT64_MAX / 2, (int64_t)1 << 33, width + 1000);
  alias out_alias = (alias)(fz_one_in(&in, 3) ? fz_range(&in, 1, 2) : 0);
  alias lse_alias = (alias)(fz_one_in(&in, 3) ? fz_range(&in, 1, 2) : 0);
  if (out_alias) strides[2] = strides[out_alias - 1];
  int want_lse = lse_alias != ALIAS_NONE || !fz_one_in(&in, 4);
  int null_a = fz_one_in(&in, 48), null_b = fz_one_in(&in, 48), null_out = fz_one_in(&in, 48);
  int null_la = fz_one_in(&in, 48), null_lb = fz_one_in(&in, 48);

  /* The model. */
  const pa_status inv = PA_ERR_INVALID_ARGUMENT;
  fz_expect e = {"pa_merge_states", 0, 0};
  int shape_ok = heads >= 1 && heads <= 65536 && hs >= 1 && hs <= 1024;
  int dtype_ok = t == PA_F32 || t == PA_F16 || t == PA_BF16;
  fz_need(&e, !ctx || rows < 0 || !shape_ok, inv);
  fz_need(&e, (int)t < 0 || (int)t > 4, inv);
  fz_need(&e, t == PA_FP8_E4M3 || t == PA_FP8_E5M2, PA_ERR_UNSUPPORTED);
  size_t es = dtype_ok ? pa_dtype_size(t) : 0;
  int known = rows > 0 && shape_ok && dtype_ok;
  if (known) {
    fz_need(&e, null_a || null_b || null_out || null_la || null_lb, inv);
    for (int i = 0; i < 3; i++) fz_model_rows(&e, rows, strides[i], width, es);
    unsigned __int128 lse_bytes = (unsigned __int128)rows * (unsigned)heads * sizeof(float);
    fz_need(&e, lse_bytes > (unsigned __int128)INT64_MAX, inv);
  }
  if (known && (rows > MAX_ROWS || rows * width > MAX_ELEMS)) return 0; /* not backed */

  /* Tensors: rows when the call may read them, tokens otherwise. */
  int64_t n = known ? rows : 0, n_lse = lse_floats(n, heads);
  fz_rows r[3];
  int backed = 1;
  for (int i = 0; i < 3; i++) {
    int ok = known && fz_extent(n, strides[i], width, es) != UINT64_MAX;
    int64_t extra = i == 2 && fz_extent(n + 1, strides[i], width, es) != UINT64_MAX;
    backed &= fz_rows_alloc(&r[i], ok ? n : 0, extra, strides[i], width, es ? es : 1, ok);
    if (ok) fz_rows_fill(&r[i], in.at + (uint64_t)i, t, i ? 3.0 : 1.0);
  }
  float *lse_in[2], *lse_out = NULL;
  size_t lse_bytes = (size_t)(n_lse + LSE_EXTRA) * sizeof(float);
  for (int i = 0; i < 2; i++) {
    lse_in[i] = malloc(lse_bytes);
    if (!lse_in[i]) fz_fail("out of memory");
    tu_fill_canary(lse_in[i], lse_bytes);
    for (int64_t k = 0; k < n_lse; k++) lse_in[i][k] = decode_lse(&in);
  }
  if (want_lse && !lse_alias) {
    lse_out = malloc(lse_bytes);
    if (!lse_out) fz_fail("out of memory");
    tu_fill_canary(lse_out, lse_bytes);
  }
  float *lse = !want_lse ? NULL : lse_alias ? lse_in[lse_alias - 1] : lse_out;
  fz_rows *out_rows = out_alias ? &r[out_alias - 1] : &r[2];

  if (backed) {
    unsigned char *a0 = NULL, *b0 = NULL;
    size_t a_bytes = 0, b_bytes = 0;
    if (n > 0) {
      /* The inputs as they were: aliasing overwrites them. */
      a_bytes = (size_t)fz_extent(n, strides[0], width, es);
      b_bytes = (size_t)fz_extent(n, strides[1], width, es);
      if (a_bytes > FZ_DENSE_LIMIT || b_bytes > FZ_DENSE_LIMIT) a_bytes = b_bytes = 0;
    }
    int compare = n > 0 && a_bytes && b_bytes && fz_may_succeed(&e);
    if (compare) {
      a0 = fz_copy(r[0].buf.p, a_bytes);
      b0 = fz_copy(r[1].buf.p, b_bytes);
    }
    unsigned char *la0 = fz_copy(lse_in[0], lse_bytes), *lb0 = fz_copy(lse_in[1], lse_bytes);
    unsigned char *lse_copy = lse ? fz_copy(lse, lse_bytes) : NULL;
    fz_plant_stale_message();
    pa_status st = pa_merge_states(ctx, rows, heads, hs, t, null_a ? NULL : r[0].buf.p, strides[0],
                                   null_la ? NULL : lse_in[0], null_b ? NULL : r[1].buf.p,
                                   strides[1], null_lb ? NULL : lse_in[1],
                                   null_out ? NULL : out_rows->buf.p, strides[2], lse);
    int ok = fz_check_status(&e, st);
    if (!ok) {
      for (int i = 0; i < 3; i++)
        FZ_ASSERT(fz_rows_unchanged(&r[i]), "pa_merge_states failed (%s) but wrote a tensor",
                  pa_last_error());
      FZ_ASSERT(!lse || memcmp(lse_copy, lse, lse_bytes) == 0,
                "pa_merge_states failed (%s) but wrote lse", pa_last_error());
    } else if (compare) {
      double *ref = malloc((size_t)(n * width) * sizeof(double) + 1);
      double *ref_lse = malloc((size_t)n_lse * sizeof(double) + 1);
      if (!ref || !ref_lse) fz_fail("out of memory");
      const float *fa = (const float *)la0, *fb = (const float *)lb0;
      ref_merge_states(n, heads, hs, (ref_dtype)t, a0, strides[0], fa, b0, strides[1], fb, ref,
                       ref_lse);
      for (int64_t row = 0; row < n; row++) {
        for (int h = 0; h < heads; h++) {
          size_t at = (size_t)h * (size_t)hs * es;
          check_head(t, hs, a0 + (size_t)(row * strides[0]) * es + at,
                     b0 + (size_t)(row * strides[1]) * es + at, fa[row * heads + h],
                     fb[row * heads + h],
                     out_rows->buf.p + (uint64_t)row * (uint64_t)strides[2] * es + at,
                     lse ? lse[row * heads + h] : 0.0f, lse != NULL, ref + row * width + h * hs,
                     ref_lse[row * heads + h]);
        }
      }
      free(ref);
      free(ref_lse);
    }
    /* Never written: padding and canary rows, the inputs that are not out,
     * lse_a and lse_b unless they are lse, lse past its rows. */
    for (int i = 0; i < 3; i++) {
      int written = &r[i] == out_rows;
      FZ_ASSERT(written ? fz_rows_canaries_ok(&r[i]) : fz_rows_unchanged(&r[i]),
                "pa_merge_states wrote outside its output rows");
    }
    for (int i = 0; i < 2; i++) {
      const unsigned char *was = i ? lb0 : la0;
      size_t upto = lse == lse_in[i] ? (size_t)n_lse * sizeof(float) : 0;
      FZ_ASSERT(memcmp(was + upto, (unsigned char *)lse_in[i] + upto, lse_bytes - upto) == 0,
                "pa_merge_states wrote lse_%c", i ? 'b' : 'a');
    }
    if (lse && lse == lse_out) {
      size_t at = tu_find_non_canary(lse + n_lse, LSE_EXTRA * sizeof(float));
      FZ_ASSERT(at == LSE_EXTRA * sizeof(float), "pa_merge_states wrote lse past its rows");
    }
    free(a0);
    free(b0);
    free(la0);
    free(lb0);
    free(lse_copy);
  }
  for (int i = 0; i < 3; i++) fz_rows_free(&r[i]);
  free(lse_in[0]);
  free(lse_in[1]);
  free(lse_out);
  return 0;
}
