#define _POSIX_C_SOURCE 200809L

#include "report.h"

#include <stdio.h>
#include <string.h>

static int g_rows_printed;

static void na_or(char *buf, size_t cap, const char *fmt, double v) {
  if (v < 0)
    snprintf(buf, cap, "n/a");
  else
    snprintf(buf, cap, fmt, v);
}

static void json_str(const char *s) {
  putchar('"');
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

static void json_num(double v) {
  if (v < 0)
    printf("null");
  else
    printf("%.6g", v);
}

static void csv_str(const char *s) {
  /* Shapes contain spaces and '|' but never quotes; quote them anyway for safety. */
  putchar('"');
  for (; s && *s; s++) {
    if (*s == '"') putchar('"');
    putchar(*s);
  }
  putchar('"');
}

static void header_table(const pab_header *h) {
  const pab_machine *m = h->machine;
  printf("pagedattn-bench  backend %s  library isa %s%s%s%s\n", h->backend, h->lib_isa,
         h->isa_env ? " (PA_ISA=" : "", h->isa_env ? h->isa_env : "", h->isa_env ? ")" : "");
  printf("cpu: %s  L2 %zu KiB  L3 %zu MiB  date: %s\n", m->cpu, m->l2_bytes >> 10,
         m->l3_bytes >> 20, h->date);
  printf(
      "roofline (measured here; read: %s loop over %zu MiB, best rep; fma: %s; bf16: %s; "
      "amx: %s)\n",
      m->read_isa, h->roof_buffer_bytes >> 20, m->fma_isa ? m->fma_isa : "n/a",
      m->bf16_isa ? m->bf16_isa : "n/a", m->amx_isa ? m->amx_isa : "n/a");
  printf("  %7s  %12s  %16s  %17s  %17s\n", "threads", "read GB/s", "f32 FMA GFLOP/s",
         "bf16 dot GFLOP/s", "AMX bf16 GFLOP/s");
  for (int i = 0; i < h->num_roofs; i++) {
    const pab_roof *r = &h->roofs[i];
    char fma[32], bf16[32], amx[32];
    na_or(fma, sizeof fma, "%.1f", r->fma_gflops);
    na_or(bf16, sizeof bf16, "%.1f", r->bf16_gflops);
    na_or(amx, sizeof amx, "%.1f", r->amx_gflops);
    printf("  %7d  %12.1f  %16s  %17s  %17s\n", r->threads, r->read_gbs, fma, bf16, amx);
  }
  fputs(
      "%roof: bw = KV GB/s over read GB/s (decode); fma|bf16|amx = GFLOP/s over the largest\n"
      "  peak the row's dtype can use on the library's path (prefill, encoder: the FMA for f32;\n"
      "  the FMA or the bf16 dot for 16-bit rows, and AMX for bf16 rows on the amx path;\n"
      "  amx/2, half of it, for f16 over a tiled FP8 cache, whose products go twice);\n"
      "  max = max(bytes/bw, flops/peak) over the time (mixed, speculative decode).\n"
      "  DRAM rows use the largest of the table's read GB/s and those measured just before and\n"
      "  after the row, compute-bound and mixed rows the same of the peaks (a shared machine\n"
      "  drifts over a run).\n"
      "mem: where a decode row's K/V come from on each call (L2/L3 when they fit and are\n"
      "  reused, else DRAM).\n",
      stdout);
  printf("\n%-26s %-6s %3s  %-58s %-4s %4s %11s %8s %8s %12s\n", "name", "isa", "thr", "shape",
         "mem", "reps", "median_us", "KV_GB/s", "GFLOP/s", "%roof");
}

static void header_csv(const pab_header *h) {
  const pab_machine *m = h->machine;
  printf("# pagedattn-bench backend=%s lib_isa=%s cpu=%s date=%s\n", h->backend, h->lib_isa, m->cpu,
         h->date);
  for (int i = 0; i < h->num_roofs; i++) {
    const pab_roof *r = &h->roofs[i];
    char fma[32], bf16[32], amx[32];
    na_or(fma, sizeof fma, "%.1f", r->fma_gflops);
    na_or(bf16, sizeof bf16, "%.1f", r->bf16_gflops);
    na_or(amx, sizeof amx, "%.1f", r->amx_gflops);
    printf("# roofline threads=%d read_gbs=%.2f fma_gflops=%s bf16_gflops=%s amx_gflops=%s\n",
           r->threads, r->read_gbs, fma, bf16, amx);
  }
  printf(
      "name,isa,threads,shape,mem,reps,median_us,min_us,kv_bytes,flops,kv_gbs,gflops,"
      "roof_pct,roof\n");
}

static void header_json(const pab_header *h) {
  const pab_machine *m = h->machine;
  printf("{\n  \"tool\": \"pagedattn-bench\",\n  \"backend\": ");
  json_str(h->backend);
  printf(",\n  \"lib_isa\": ");
  json_str(h->lib_isa);
  printf(",\n  \"pa_isa_env\": ");
  if (h->isa_env)
    json_str(h->isa_env);
  else
    printf("null");
  printf(",\n  \"cpu\": ");
  json_str(m->cpu);
  printf(",\n  \"date\": ");
  json_str(h->date);
  printf(",\n  \"l2_bytes\": %zu,\n  \"l3_bytes\": %zu,\n", m->l2_bytes, m->l3_bytes);
  printf("  \"roofline\": {\"read_isa\": ");
  json_str(m->read_isa);
  printf(", \"fma_isa\": ");
  if (m->fma_isa)
    json_str(m->fma_isa);
  else
    printf("null");
  printf(", \"bf16_isa\": ");
  if (m->bf16_isa)
    json_str(m->bf16_isa);
  else
    printf("null");
  printf(", \"buffer_bytes\": %zu, \"by_threads\": [", h->roof_buffer_bytes);
  for (int i = 0; i < h->num_roofs; i++) {
    const pab_roof *r = &h->roofs[i];
    printf("%s\n    {\"threads\": %d, \"read_gbs\": ", i ? "," : "", r->threads);
    json_num(r->read_gbs);
    printf(", \"fma_gflops\": ");
    json_num(r->fma_gflops);
    printf(", \"bf16_gflops\": ");
    json_num(r->bf16_gflops);
    printf(", \"amx_gflops\": ");
    json_num(r->amx_gflops);
    printf("}");
  }
  printf("\n  ]},\n  \"rows\": [");
}

void pab_report_begin(pab_format f, const pab_header *h) {
  g_rows_printed = 0;
  if (f == PAB_FMT_TABLE) header_table(h);
  if (f == PAB_FMT_CSV) header_csv(h);
  if (f == PAB_FMT_JSON) header_json(h);
  fflush(stdout);
}

void pab_report_row(pab_format f, const pab_row *r) {
  if (f == PAB_FMT_TABLE) {
    char pct[32];
    if (r->roof_pct < 0)
      snprintf(pct, sizeof pct, "n/a");
    else
      snprintf(pct, sizeof pct, "%.1f%% %s", r->roof_pct, r->roof);
    printf("%-26s %-6s %3d  %-58s %-4s %4d %11.1f %8.2f %8.1f %12s\n", r->name, r->isa, r->threads,
           r->shape, r->mem, r->reps, r->median_us, r->kv_gbs, r->gflops, pct);
  } else if (f == PAB_FMT_CSV) {
    csv_str(r->name);
    printf(",%s,%d,", r->isa, r->threads);
    csv_str(r->shape);
    printf(",%s,%d,%.3f,%.3f,%.0f,%.0f,%.4f,%.3f,", r->mem, r->reps, r->median_us, r->min_us,
           r->kv_bytes, r->flops, r->kv_gbs, r->gflops);
    if (r->roof_pct >= 0) printf("%.2f", r->roof_pct);
    printf(",%s\n", r->roof);
  } else {
    printf("%s\n    {\"name\": ", g_rows_printed ? "," : "");
    json_str(r->name);
    printf(", \"isa\": ");
    json_str(r->isa);
    printf(", \"threads\": %d, \"shape\": ", r->threads);
    json_str(r->shape);
    printf(", \"mem\": ");
    json_str(r->mem);
    printf(
        ", \"reps\": %d, \"median_us\": %.3f, \"min_us\": %.3f, \"kv_bytes\": %.0f, "
        "\"flops\": %.0f, \"kv_gbs\": %.4f, \"gflops\": %.3f, \"roof_pct\": ",
        r->reps, r->median_us, r->min_us, r->kv_bytes, r->flops, r->kv_gbs, r->gflops);
    json_num(r->roof_pct);
    printf(", \"roof\": ");
    json_str(r->roof);
    printf("}");
  }
  g_rows_printed++;
  fflush(stdout);
}

void pab_report_end(pab_format f, double total_s) {
  if (f == PAB_FMT_TABLE)
    printf("\n%d rows, total run time %.1f s\n", g_rows_printed, total_s);
  else if (f == PAB_FMT_CSV)
    printf("# total_s=%.2f\n", total_s);
  else
    printf("\n  ],\n  \"total_s\": %.3f\n}\n", total_s);
  fflush(stdout);
}
