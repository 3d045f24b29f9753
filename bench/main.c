/* pagedattn-bench: times pagedattn's attention calls on LLM-shaped workloads and puts each
 * number next to this machine's roofline, measured in the same process. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pagedattn.h"
#include "report.h"
#include "roofline.h"
#include "suite.h"
#include "util.h"
#include "workloads.h"

#define MAX_THREAD_COUNTS 16

typedef struct options {
  int threads[MAX_THREAD_COUNTS];
  int num_threads;
  int repeats;
  const char *isa;
  pab_format format;
  const char *filter;
  int quick;
  int no_scalar;
  int layout; /* --layout: PA_KV_ROWS, PA_KV_TILED, or -1 (auto) */
  pab_custom custom;
  int custom_knob; /* a shape/layer option was given: needs --mode */
} options;

static void usage(FILE *f) {
  fputs(
      "usage: pagedattn-bench [options]\n"
      "\n"
      "Without --mode, runs the default suite (Llama-3-8B-shaped layer: 32 query heads, 8 KV\n"
      "heads, head size 128, block size 16, bf16) with 1 and 2 threads, after measuring this\n"
      "machine's roofline (streaming-read bandwidth, f32 FMA, bf16 dot and AMX peaks).\n"
      "\n"
      "general:\n"
      "  --threads LIST      thread counts, comma-separated (default 1,2)\n"
      "  --repeats N         timed calls per row (default: adaptive, ~0.5 s, >= 3 when cheap)\n"
      "  --isa NAME          set PA_ISA=NAME for the library (scalar, avx2, avx512, avx512bf16,\n"
      "                      amx)\n"
      "  --csv | --json      machine-readable output instead of the table\n"
      "  --filter SUBSTRING  run only rows whose name contains SUBSTRING\n"
      "  --quick             small shapes and short timings (for tests)\n"
      "  --no-scalar         skip the scalar-kernel comparison rows\n"
      "  --layout L          paged caches in rows | tiled | auto (default: auto, the layout\n"
      "                      pa_kv_layout_preferred names for the row's dtypes and shape)\n"
      "  --help              this text\n"
      "\n"
      "one custom case instead of the suite:\n"
      "  --mode M            decode | prefill | chunked | encoder | mixed\n"
      "  --batch N           sequences (decode/mixed default 16, others 1; mixed: 1 chunk +\n"
      "                      N-1 decodes)\n"
      "  --context N         decode: tokens in cache (4096); prefill/encoder: prompt length\n"
      "                      (512); chunked/mixed: cached tokens before the chunk (3584/1024)\n"
      "  --q-len N           decode: queries per sequence (1); prefill/encoder: prompt length;\n"
      "                      chunked/mixed: new tokens in the chunk (512/256)\n"
      "  --decode-context N  mixed: context of the decode sequences (2048)\n"
      "  --heads N           query heads (32; encoder 12)\n"
      "  --kv-heads N        KV heads (8 if it divides --heads, else --heads)\n"
      "  --head-size N       (128; encoder 64)\n"
      "  --block-size N      (16)\n"
      "  --dtype T           activations: f32 | f16 | bf16 (bf16)\n"
      "  --cache-dtype T     f32 | f16 | bf16 | fp8_e4m3 | fp8_e5m2 (the activation dtype)\n"
      "  --window W          sliding window\n"
      "  --alibi             ALiBi slopes\n"
      "  --sinks             one attention-sink logit per head\n"
      "  --lse               also write the log-sum-exp of every row and head\n"
      "  --softcap C         logits soft cap\n"
      "  --hot               decode/mixed: reuse one copy of the K/V (cache-resident when it\n"
      "                      fits) instead of rotating copies that force DRAM reads\n",
      f);
}

static int parse_int(const char *opt, const char *s, int lo, int hi) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    pab_die("%s: '%s' is not an integer in [%d, %d]", opt, s, lo, hi);
  return (int)v;
}

static pa_dtype parse_dtype(const char *opt, const char *s, int activation) {
  static const pa_dtype all[] = {PA_F32, PA_F16, PA_BF16, PA_FP8_E4M3, PA_FP8_E5M2};
  for (int i = 0; i < 5; i++)
    if (strcmp(s, pa_dtype_name(all[i])) == 0) {
      if (activation && i > 2) pab_die("%s: %s is not an activation dtype", opt, s);
      return all[i];
    }
  pab_die("%s: unknown dtype '%s' (f32, f16, bf16%s)", opt, s,
          activation ? "" : ", fp8_e4m3, fp8_e5m2");
}

static void parse_threads(options *o, const char *s) {
  o->num_threads = 0;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int n = parse_int("--threads", tok, 1, 4096), dup = 0;
    for (int i = 0; i < o->num_threads; i++) dup |= o->threads[i] == n;
    if (dup) continue;
    if (o->num_threads == MAX_THREAD_COUNTS)
      pab_die("--threads: at most %d counts", MAX_THREAD_COUNTS);
    o->threads[o->num_threads++] = n;
  }
  if (o->num_threads == 0) pab_die("--threads: empty list");
}

static void parse_args(options *o, int argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->threads[0] = 1;
  o->layout = -1;
  o->threads[1] = 2;
  o->num_threads = 2;
  pab_custom_init(&o->custom);
  pab_custom *c = &o->custom;
  for (int i = 1; i < argc; i++) {
    char opt[64];
    const char *arg = argv[i], *val = NULL;
    /* Accept both "--opt value" and "--opt=value". */
    const char *eq = strchr(arg, '=');
    if (strncmp(arg, "--", 2) == 0 && eq) {
      snprintf(opt, sizeof opt, "%.*s", (int)(eq - arg), arg);
      val = eq + 1;
    } else {
      snprintf(opt, sizeof opt, "%s", arg);
    }
#define FLAG(name) (strcmp(opt, name) == 0 && !val)
#define VALUE(name) (strcmp(opt, name) == 0 && (val || (i + 1 < argc && (val = argv[++i]))))
    if (FLAG("--help") || FLAG("-h")) {
      usage(stdout);
      exit(0);
    } else if (FLAG("--csv")) {
      o->format = PAB_FMT_CSV;
    } else if (FLAG("--json")) {
      o->format = PAB_FMT_JSON;
    } else if (FLAG("--quick")) {
      o->quick = 1;
    } else if (FLAG("--no-scalar")) {
      o->no_scalar = 1;
    } else if (VALUE("--layout")) {
      if (strcmp(val, "rows") == 0) {
        o->layout = PA_KV_ROWS;
      } else if (strcmp(val, "tiled") == 0) {
        o->layout = PA_KV_TILED;
      } else if (strcmp(val, "auto") == 0) {
        o->layout = -1;
      } else {
        pab_die("--layout: bad value '%s' (rows, tiled or auto)", val);
      }
    } else if (FLAG("--alibi")) {
      c->alibi = 1;
      o->custom_knob = 1;
    } else if (FLAG("--sinks")) {
      c->sinks = 1;
      o->custom_knob = 1;
    } else if (FLAG("--lse")) {
      c->lse = 1;
      o->custom_knob = 1;
    } else if (FLAG("--hot")) {
      c->hot = 1;
      o->custom_knob = 1;
    } else if (VALUE("--threads")) {
      parse_threads(o, val);
    } else if (VALUE("--repeats")) {
      o->repeats = parse_int(opt, val, 1, 1000000);
    } else if (VALUE("--isa")) {
      o->isa = val;
    } else if (VALUE("--filter")) {
      o->filter = val;
    } else if (VALUE("--mode")) {
      static const char *modes[] = {"decode", "prefill", "chunked", "encoder", "mixed"};
      for (int m = 0; m < 5; m++)
        if (strcmp(val, modes[m]) == 0) c->mode = (pab_mode)(PAB_MODE_DECODE + m);
      if (c->mode == PAB_MODE_NONE) pab_die("--mode: unknown mode '%s'", val);
    } else if (VALUE("--batch")) {
      c->batch = parse_int(opt, val, 1, 1 << 20);
      o->custom_knob = 1;
    } else if (VALUE("--context")) {
      c->context = parse_int(opt, val, 0, 1 << 30);
      o->custom_knob = 1;
    } else if (VALUE("--q-len")) {
      c->q_len = parse_int(opt, val, 1, 1 << 30);
      o->custom_knob = 1;
    } else if (VALUE("--decode-context")) {
      c->decode_context = parse_int(opt, val, 1, 1 << 30);
      o->custom_knob = 1;
    } else if (VALUE("--heads")) {
      c->heads = parse_int(opt, val, 1, 1 << 16);
      o->custom_knob = 1;
    } else if (VALUE("--kv-heads")) {
      c->kv_heads = parse_int(opt, val, 1, 1 << 16);
      o->custom_knob = 1;
    } else if (VALUE("--head-size")) {
      c->head_size = parse_int(opt, val, 1, 1 << 16);
      o->custom_knob = 1;
    } else if (VALUE("--block-size")) {
      c->block_size = parse_int(opt, val, 1, 1 << 20);
      o->custom_knob = 1;
    } else if (VALUE("--window")) {
      c->window = parse_int(opt, val, 0, 1 << 30);
      o->custom_knob = 1;
    } else if (VALUE("--softcap")) {
      char *end;
      c->softcap = strtof(val, &end);
      if (end == val || *end || !(c->softcap >= 0)) pab_die("--softcap: bad value '%s'", val);
      o->custom_knob = 1;
    } else if (VALUE("--dtype")) {
      c->dtype = parse_dtype(opt, val, 1);
      c->dtype_set = 1;
      o->custom_knob = 1;
    } else if (VALUE("--cache-dtype")) {
      c->cache_dtype = parse_dtype(opt, val, 0);
      c->cache_dtype_set = 1;
      o->custom_knob = 1;
    } else {
      fprintf(stderr, "pagedattn-bench: unknown option or missing value: %s\n\n", arg);
      usage(stderr);
      exit(2);
    }
#undef FLAG
#undef VALUE
  }
  if (o->custom_knob && c->mode == PAB_MODE_NONE)
    pab_die("shape and layer options (--batch, --heads, --dtype, ...) need --mode");
}

/* ---- contexts -------------------------------------------------------------------------------- */

/* Contexts read PA_ISA when they are created, so a scalar one is made with it set for a moment
 * and the previous value restored. */
static pa_context *make_context(int threads, const char *isa) {
  char *saved = NULL;
  if (isa) {
    const char *old = getenv("PA_ISA");
    if (old) saved = strdup(old);
    setenv("PA_ISA", isa, 1);
  }
  pa_context *ctx = NULL;
  pa_status st = pa_context_create(threads, &ctx);
  if (isa) {
    if (saved)
      setenv("PA_ISA", saved, 1);
    else
      unsetenv("PA_ISA");
    free(saved);
  }
  if (st != PA_OK) pab_pa_fail(isa ? "pa_context_create (PA_ISA=scalar)" : "pa_context_create", st);
  return ctx;
}

/* ---- one row ------------------------------------------------------------------------------- */

static void fill_row(pab_row *r, const pab_case *c, const pab_metrics *m, const pab_result *res,
                     const pab_roof *roof, const pab_machine *mach, int rotations) {
  r->name = c->name;
  r->reps = res->reps;
  r->median_us = res->median_s * 1e6;
  r->min_us = res->min_s * 1e6;
  r->kv_bytes = m->kv_bytes;
  r->flops = m->flops;
  double t = res->median_s > 0 ? res->median_s : 1e-12;
  r->kv_gbs = m->kv_bytes / t * 1e-9;
  r->gflops = m->flops / t * 1e-9;
  pab_case_shape(c, r->shape, sizeof r->shape);

  r->mem = "-";
  if (c->bound != PAB_BOUND_COMPUTE) {
    if (rotations > 1 || m->kv_bytes > (double)mach->l3_bytes)
      r->mem = "DRAM";
    else
      r->mem = m->kv_bytes <= (double)mach->l2_bytes ? "L2" : "L3";
  }

  /* A row is held to the largest peak its dtype can use on the library's path: the FMA for
   * f32; the FMA or the bf16 dot for 16-bit rows, and the AMX tiles for bf16 rows on the amx
   * path (whichever this machine runs fastest); f16 over a tiled FP8 cache takes the tiles at
   * two products for each (Q and P split in two bf16 parts), half their peak. */
  double peak = -1;
  const char *peak_name = "fma";
  int amx_path = r->isa && strcmp(r->isa, "amx") == 0;
  if (roof) {
    peak = roof->fma_gflops;
    if (c->dtype != PA_F32 && roof->bf16_gflops > peak) {
      peak = roof->bf16_gflops;
      peak_name = "bf16";
    }
    if (c->dtype == PA_BF16 && amx_path && roof->amx_gflops > peak) {
      peak = roof->amx_gflops;
      peak_name = "amx";
    }
    int split_tiles = c->dtype == PA_F16 && c->cache_dtype >= PA_FP8_E4M3 &&
                      c->layout == PA_KV_TILED && c->head_size % 32 == 0;
    if (split_tiles && amx_path && roof->amx_gflops / 2 > peak) {
      peak = roof->amx_gflops / 2;
      peak_name = "amx/2";
    }
  }
  r->roof_pct = -1;
  r->roof = "-";
  if (!roof) return;
  if (c->bound == PAB_BOUND_MEMORY) {
    r->roof = "bw";
    r->roof_pct = 100.0 * r->kv_gbs / roof->read_gbs;
  } else if (c->bound == PAB_BOUND_COMPUTE) {
    r->roof = peak_name;
    if (peak > 0) r->roof_pct = 100.0 * r->gflops / peak;
  } else {
    r->roof = "max";
    double tb = m->kv_bytes / (roof->read_gbs * 1e9);
    double tc = peak > 0 ? m->flops / (peak * 1e9) : 0;
    r->roof_pct = 100.0 * (tb > tc ? tb : tc) / t;
  }
}

/* Raises roof's bandwidth (probe) and peaks (peaks) to those measured now, where higher;
 * either may be NULL. */
static void raise_roof(pab_read_probe *probe, pab_peak_probe *peaks, int threads, pab_roof *roof) {
  if (probe) {
    double gbs = pab_read_probe_gbs(probe, threads, 3);
    if (gbs > roof->read_gbs) roof->read_gbs = gbs;
  }
  if (peaks) pab_peak_probe_raise(peaks, threads, 3, roof);
}

int main(int argc, char **argv) {
  options o;
  parse_args(&o, argc, argv);
  double t_start = pab_now();
  if (o.isa) setenv("PA_ISA", o.isa, 1);

  pab_case **cases = NULL;
  int num_cases = 0;
  if (o.custom.mode != PAB_MODE_NONE) {
    cases = pab_xmalloc(sizeof *cases);
    cases[0] = pab_suite_custom(&o.custom);
    PAB_CHECK(pa_validate_head_size(cases[0]->head_size));
    num_cases = 1;
  } else {
    num_cases = pab_suite_default(o.quick, &cases);
  }
  int kept = 0;
  for (int i = 0; i < num_cases; i++) {
    if (o.filter && !strstr(cases[i]->name, o.filter))
      pab_case_free(cases[i]);
    else
      cases[kept++] = cases[i];
  }
  num_cases = kept;
  if (num_cases == 0) pab_die("no case matches --filter '%s'", o.filter ? o.filter : "");

  /* A throwaway single-threaded context checks PA_ISA before the roofline spends seconds. */
  pa_context_destroy(make_context(1, NULL));

  /* Roofline first, before any library thread exists to compete with it. */
  pab_machine mach;
  pab_machine_probe(&mach);
  pab_roof roofs[MAX_THREAD_COUNTS];
  size_t roof_bytes = o.quick ? 4 * mach.l3_bytes : (size_t)1 << 30;
  fprintf(stderr, "measuring roofline (%zu MiB read buffer) ...\n", roof_bytes >> 20);
  pab_roofline_measure(&mach, o.threads, o.num_threads, roof_bytes, o.quick ? 0.01 : 0.05,
                       o.quick ? 2 : 5, roofs);

  pa_context *ctx[MAX_THREAD_COUNTS] = {0};
  pa_context *writer = NULL;
  int writer_threads = 0;
  for (int i = 0; i < o.num_threads; i++) {
    ctx[i] = make_context(o.threads[i], NULL);
    if (o.threads[i] > writer_threads) {
      writer_threads = o.threads[i];
      writer = ctx[i];
    }
  }
  const char *lib_isa = pa_context_kernel_path(ctx[0]);
  int want_scalar = !o.no_scalar && strcmp(lib_isa, "scalar") != 0;

  pab_header h;
  memset(&h, 0, sizeof h);
  h.machine = &mach;
  h.roofs = roofs;
  h.num_roofs = o.num_threads;
  h.roof_buffer_bytes = roof_bytes;
  h.backend = pa_backend_name();
  h.lib_isa = lib_isa;
  h.isa_env = getenv("PA_ISA");
  time_t now = time(NULL);
  struct tm tmv;
  localtime_r(&now, &tmv);
  strftime(h.date, sizeof h.date, "%Y-%m-%d %H:%M:%S %Z", &tmv);
  pab_report_begin(o.format, &h);

  pab_timing timing = {o.repeats, 1, o.quick ? 0.01 : 0.5, o.quick ? 1 : 3, o.quick ? 20 : 2000};
  /* Rows are judged against the larger of the table's bandwidth (memory-bound rows) or peaks
   * (compute-bound ones; rows bound by either, both) and those measured just before and just
   * after the row: the machine drifts over a run when others share it. */
  int max_threads = 1;
  for (int t = 0; t < o.num_threads; t++)
    if (o.threads[t] > max_threads) max_threads = o.threads[t];
  pab_read_probe *probe =
      o.quick ? NULL : pab_read_probe_new(&mach, (size_t)512 << 20, max_threads);
  pab_peak_probe *peaks = o.quick ? NULL : pab_peak_probe_new(&mach, 0.02);
  /* Scalar rows are there for scale, not precision: one call each. */
  pab_timing scalar_timing = {1, 0, 0, 1, 1};
  for (int i = 0; i < num_cases; i++) {
    pab_case *c = cases[i];
    c->layout = o.layout >= 0 || c->api != PAB_API_PAGED
                    ? (o.layout >= 0 ? o.layout : PA_KV_ROWS)
                    : (int)pa_kv_layout_preferred(writer, c->dtype, c->cache_dtype, c->block_size,
                                                  c->head_size);
    char shape[200];
    pab_case_shape(c, shape, sizeof shape);
    fprintf(stderr, "[%d/%d] %s  %s ...\n", i + 1, num_cases, c->name, shape);
    pab_metrics m;
    pab_case_metrics(c, &m);
    /* A cold row's copies add up to at least the roofline's buffer: the L3 keeps part of a
     * set that is read over and over (`pagedattn-kernel-bench --reread`: here a 128 MiB set
     * re-read reads 5% faster than 1 GiB, a 64 MiB one 30%), so a smaller round trip would
     * beat the bandwidth it is measured against. Quick runs
     * keep the rotation (so tests cover several block tables under one plan) but not the
     * footprint, which would dominate their run time. */
    pab_data *d = pab_data_build(c, writer, o.quick ? 0 : roof_bytes, o.quick ? 2 : 1,
                                 0x5EED0000u + (uint64_t)i);
    for (int pass = 0; pass < 2; pass++) {
      if (pass == 1 && !(want_scalar && c->scalar)) break;
      for (int t = 0; t < o.num_threads; t++) {
        /* Scalar contexts live only for their row, so their idle workers never share the
         * machine with the timed native calls. */
        pa_context *cx = pass ? make_context(o.threads[t], "scalar") : ctx[t];
        int threads = pa_context_num_threads(cx);
        const pab_roof *found = pab_roof_for(roofs, o.num_threads, threads);
        pab_roof roof = found ? *found : roofs[t];
        int reprobe_read = probe && c->bound != PAB_BOUND_COMPUTE && c->cold && !pass;
        int reprobe_peaks = peaks && c->bound != PAB_BOUND_MEMORY && !pass;
        pab_result res;
        /* Before and after the timing: the machine can change under a row either way. */
        raise_roof(reprobe_read ? probe : NULL, reprobe_peaks ? peaks : NULL, threads, &roof);
        pab_data_time(d, cx, pass ? &scalar_timing : &timing, &res);
        raise_roof(reprobe_read ? probe : NULL, reprobe_peaks ? peaks : NULL, threads, &roof);
        pab_row row;
        memset(&row, 0, sizeof row);
        row.isa = pa_context_kernel_path(cx);
        row.threads = threads;
        fill_row(&row, c, &m, &res, &roof, &mach, pab_data_rotations(d));
        pab_report_row(o.format, &row);
        if (pass) pa_context_destroy(cx);
      }
    }
    pab_data_free(d);
  }
  pab_report_end(o.format, pab_now() - t_start);
  pab_read_probe_free(probe);
  pab_peak_probe_free(peaks);

  for (int i = 0; i < o.num_threads; i++) pa_context_destroy(ctx[i]);
  for (int i = 0; i < num_cases; i++) pab_case_free(cases[i]);
  free(cases);
  return 0;
}
