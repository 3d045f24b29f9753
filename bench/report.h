/* Output of the roofline header and the result rows: aligned table, CSV or JSON, streamed so a
 * long run shows rows as they finish. */
#ifndef PAB_REPORT_H
#define PAB_REPORT_H

#include "roofline.h"

typedef enum pab_format { PAB_FMT_TABLE, PAB_FMT_CSV, PAB_FMT_JSON } pab_format;

typedef struct pab_header {
  const pab_machine *machine;
  const pab_roof *roofs;
  int num_roofs;
  size_t roof_buffer_bytes;
  const char *backend;
  const char *lib_isa; /* pa_context_isa of the default contexts */
  const char *isa_env; /* PA_ISA as set for them, or NULL */
  char date[40];
} pab_header;

typedef struct pab_row {
  const char *name;
  const char *isa;
  int threads;
  char shape[200];
  const char *mem; /* where the K/V of a decode row live between calls: L2, L3, DRAM; or "-" */
  int reps;
  double median_us, min_us;
  double kv_bytes, flops;
  double kv_gbs, gflops;
  double roof_pct;  /* < 0: n/a */
  const char *roof; /* what roof_pct is relative to: "bw", "fma", "bf16", "max" */
} pab_row;

void pab_report_begin(pab_format f, const pab_header *h);
void pab_report_row(pab_format f, const pab_row *r);
void pab_report_end(pab_format f, double total_s);

#endif
