/* This machine's roofline, measured in-process: streaming-read bandwidth, f32 FMA peak, bf16
 * dot peak and AMX bf16 tile peak, for a given number of threads running at once. */
#ifndef PAB_ROOFLINE_H
#define PAB_ROOFLINE_H

#include <stddef.h>

typedef struct pab_machine {
  char cpu[128];        /* /proc/cpuinfo model name, or "unknown" */
  size_t l2_bytes;      /* per core */
  size_t l3_bytes;      /* per socket/CCD as the OS reports it */
  const char *read_isa; /* loop used for the bandwidth: "avx512", "avx2" or "generic" */
  const char *fma_isa;  /* "avx512", "avx2" or NULL: no vector FMA on this machine/build */
  const char *bf16_isa; /* "avx512_bf16" or NULL */
  const char *amx_isa;  /* "amx_bf16" or NULL (no AMX, or the OS does not grant it) */
} pab_machine;

typedef struct pab_roof {
  int threads;
  double read_gbs;    /* best of the reps, 1e9 bytes/s */
  double fma_gflops;  /* f32 FMA peak for this many threads; < 0: n/a */
  double bf16_gflops; /* vdpbf16ps peak for this many threads; < 0: n/a */
  double amx_gflops;  /* tdpbf16ps peak for this many threads; < 0: n/a */
} pab_roof;

void pab_machine_probe(pab_machine *m);

/* buf_bytes: the read buffer (should be far beyond L3); seconds: rough length of one peak-FLOP
 * run; reps: read passes and peak runs per thread count (the best one counts). */
void pab_roofline_measure(const pab_machine *m, const int *threads, int num_threads,
                          size_t buf_bytes, double seconds, int reps, pab_roof *out);

/* Streaming-read bandwidth, measured again on demand: a machine shared with others drifts
 * over a run, so a memory-bound row is judged against measurements taken around it. */
typedef struct pab_read_probe pab_read_probe;
pab_read_probe *pab_read_probe_new(const pab_machine *m, size_t buf_bytes, int max_threads);
double pab_read_probe_gbs(pab_read_probe *p, int threads, int reps); /* best of reps passes */
void pab_read_probe_free(pab_read_probe *p);

/* The compute peaks, measured again on demand for the same reason: on a shared machine a
 * thread count's peak in the table can be one taken while another tenant held a core (half
 * the FMA rate or less), against which a compute-bound row would read above 100%. */
typedef struct pab_peak_probe pab_peak_probe;
pab_peak_probe *pab_peak_probe_new(const pab_machine *m, double seconds); /* per run */
/* Raises each of roof's peaks to the one measured now where that is higher (best of reps). */
void pab_peak_probe_raise(pab_peak_probe *p, int threads, int reps, pab_roof *roof);
void pab_peak_probe_free(pab_peak_probe *p);

/* The row for a thread count (the measured one with the same count, else NULL). */
const pab_roof *pab_roof_for(const pab_roof *roofs, int num, int threads);

/* Runs fn(arg, tid, n) on n threads at once (the caller is tid 0), reps times, with a barrier
 * before and after each rep; returns the fastest rep's wall time in seconds. */
typedef void (*pab_work_fn)(void *arg, int tid, int nthreads);
double pab_run_parallel(int nthreads, int reps, pab_work_fn fn, void *arg);

#endif
