#define _POSIX_C_SOURCE 200809L

#include "roofline.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "roofline_kernels.h"
#include "util.h"

#if defined(__x86_64__) || defined(__i386__)
#define PAB_X86 1
#else
#define PAB_X86 0
#endif

/* ---- machine facts ----------------------------------------------------------------------- */

static size_t read_cache_size(int index, size_t fallback) {
  char path[96];
  snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
  FILE *f = fopen(path, "r");
  if (!f) return fallback;
  unsigned long v = 0;
  char unit = 0;
  int n = fscanf(f, "%lu%c", &v, &unit);
  fclose(f);
  if (n < 1 || v == 0) return fallback;
  if (unit == 'K') v *= 1024ul;
  if (unit == 'M') v *= 1024ul * 1024ul;
  return (size_t)v;
}

static void read_cpu_model(char *dst, size_t cap) {
  snprintf(dst, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    /* x86 says "model name", some ARM kernels only "CPU part"/"Hardware"; take the first. */
    if (strncmp(line, "model name", 10) == 0 || strncmp(line, "Hardware", 8) == 0) {
      char *colon = strchr(line, ':');
      if (!colon) continue;
      colon++;
      while (*colon == ' ' || *colon == '\t') colon++;
      colon[strcspn(colon, "\n")] = 0;
      snprintf(dst, cap, "%s", colon);
      break;
    }
  }
  fclose(f);
}

void pab_machine_probe(pab_machine *m) {
  memset(m, 0, sizeof *m);
  read_cpu_model(m->cpu, sizeof m->cpu);
  /* index2/index3 are L2/L3 on every Linux x86 and most ARM systems; elsewhere assume sizes
   * typical of a server core so that "bigger than L3" stays conservative. */
  m->l2_bytes = read_cache_size(2, (size_t)1 << 20);
  m->l3_bytes = read_cache_size(3, (size_t)32 << 20);
  m->read_isa = "generic";
#if PAB_X86
  __builtin_cpu_init();
#if defined(PAB_HAVE_AVX2)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    m->read_isa = "avx2";
    m->fma_isa = "avx2";
  }
#endif
#if defined(PAB_HAVE_AVX512)
  if (__builtin_cpu_supports("avx512f")) {
    m->read_isa = "avx512";
    m->fma_isa = "avx512";
  }
#endif
#if defined(PAB_HAVE_AVX512BF16)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
    m->bf16_isa = "avx512_bf16";
#endif
#if defined(PAB_HAVE_AMX)
  if (__builtin_cpu_supports("amx-bf16") && pab_amx_granted()) m->amx_isa = "amx_bf16";
#endif
#endif
}

/* ---- a tiny barrier-synchronized thread team --------------------------------------------- */

/* Hand-rolled barrier: pthread_barrier_t is optional in POSIX and missing on macOS. */
typedef struct pab_barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int count, waiting;
  unsigned gen;
} pab_barrier;

static void barrier_wait(pab_barrier *b) {
  pthread_mutex_lock(&b->mu);
  unsigned gen = b->gen;
  if (++b->waiting == b->count) {
    b->waiting = 0;
    b->gen++;
    pthread_cond_broadcast(&b->cv);
  } else {
    while (gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
  }
  pthread_mutex_unlock(&b->mu);
}

typedef struct team {
  pab_barrier bar;
  int nthreads, reps;
  pab_work_fn fn;
  void *arg;
  double best;
} team;

typedef struct member {
  team *t;
  int tid;
} member;

static void *member_main(void *p) {
  member *me = (member *)p;
  team *t = me->t;
  for (int r = 0; r < t->reps; r++) {
    barrier_wait(&t->bar);
    double t0 = me->tid == 0 ? pab_now() : 0.0;
    t->fn(t->arg, me->tid, t->nthreads);
    barrier_wait(&t->bar);
    if (me->tid == 0) {
      double dt = pab_now() - t0;
      if (r == 0 || dt < t->best) t->best = dt;
    }
  }
  return NULL;
}

double pab_run_parallel(int nthreads, int reps, pab_work_fn fn, void *arg) {
  if (nthreads < 1) nthreads = 1;
  if (reps < 1) reps = 1;
  team t;
  memset(&t, 0, sizeof t);
  pthread_mutex_init(&t.bar.mu, NULL);
  pthread_cond_init(&t.bar.cv, NULL);
  t.bar.count = nthreads;
  t.nthreads = nthreads;
  t.reps = reps;
  t.fn = fn;
  t.arg = arg;
  member *ms = pab_xcalloc((size_t)nthreads, sizeof *ms);
  pthread_t *th = pab_xcalloc((size_t)nthreads, sizeof *th);
  for (int i = 0; i < nthreads; i++) {
    ms[i].t = &t;
    ms[i].tid = i;
  }
  for (int i = 1; i < nthreads; i++)
    if (pthread_create(&th[i], NULL, member_main, &ms[i]) != 0)
      pab_die("pthread_create failed for roofline thread %d", i);
  member_main(&ms[0]);
  for (int i = 1; i < nthreads; i++) pthread_join(th[i], NULL);
  pthread_cond_destroy(&t.bar.cv);
  pthread_mutex_destroy(&t.bar.mu);
  free(ms);
  free(th);
  return t.best;
}

/* ---- streaming read ---------------------------------------------------------------------- */

/* Written so the optimizer cannot drop the loads whose sums end up here. */
static volatile uint64_t g_sink_u64[64];
static volatile float g_sink_f32[64];

static uint64_t read_generic(const void *buf, size_t bytes) {
  const uint64_t *p = (const uint64_t *)buf;
  size_t n = bytes / 8;
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
    a4 += p[i + 4];
    a5 += p[i + 5];
    a6 += p[i + 6];
    a7 += p[i + 7];
  }
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

typedef uint64_t (*read_fn)(const void *, size_t);

typedef struct read_job {
  unsigned char *buf;
  size_t bytes;
  read_fn fn;
  int touch;
} read_job;

static void chunk_of(size_t bytes, int tid, int n, size_t *off, size_t *len) {
  /* 4 KiB-aligned chunks: aligned for every vector width, and each thread first-touches the
   * pages it later reads (matters on NUMA machines). */
  size_t pages = bytes / 4096;
  size_t lo = pages * (size_t)tid / (size_t)n, hi = pages * (size_t)(tid + 1) / (size_t)n;
  *off = lo * 4096;
  *len = (hi - lo) * 4096;
}

static void read_work(void *arg, int tid, int n) {
  read_job *j = (read_job *)arg;
  size_t off, len;
  chunk_of(j->bytes, tid, n, &off, &len);
  if (j->touch) {
    memset(j->buf + off, 0x5A + tid, len);
    return;
  }
  g_sink_u64[tid & 63] += j->fn(j->buf + off, len);
}

static read_fn pick_read(const pab_machine *m) {
#if PAB_X86 && defined(PAB_HAVE_AVX512)
  if (strcmp(m->read_isa, "avx512") == 0) return pab_read_avx512;
#endif
#if PAB_X86 && defined(PAB_HAVE_AVX2)
  if (strcmp(m->read_isa, "avx2") == 0) return pab_read_avx2;
#endif
  (void)m;
  return read_generic;
}

/* ---- peak FLOPs -------------------------------------------------------------------------- */

typedef float (*peak_fn)(uint64_t);

typedef struct peak_job {
  peak_fn fn;
  uint64_t iters;
} peak_job;

static void peak_work(void *arg, int tid, int n) {
  (void)n;
  peak_job *j = (peak_job *)arg;
  g_sink_f32[tid & 63] += j->fn(j->iters);
}

/* The iteration count that makes one run of fn on one thread take about `seconds`. */
static uint64_t calibrate_peak(peak_fn fn, double seconds) {
  peak_job j = {fn, 1024};
  for (;;) {
    double t = pab_run_parallel(1, 1, peak_work, &j);
    if (t >= seconds / 8 || j.iters > ((uint64_t)1 << 40)) {
      double scale = t > 0 ? seconds / t : 8.0;
      return (uint64_t)((double)j.iters * scale) + 1;
    }
    j.iters *= 4;
  }
}

/* GFLOP/s of fn with nthreads running it at once, `iters` iterations each (the best of reps). */
static double run_peak(peak_fn fn, double flops_per_iter, uint64_t iters, int nthreads, int reps) {
  peak_job j = {fn, iters};
  double best = pab_run_parallel(nthreads, reps, peak_work, &j);
  return flops_per_iter * (double)iters * nthreads / best * 1e-9;
}

static double measure_peak(peak_fn fn, double flops_per_iter, int nthreads, double seconds,
                           int reps) {
  return run_peak(fn, flops_per_iter, calibrate_peak(fn, seconds), nthreads, reps);
}

static peak_fn pick_fma(const pab_machine *m, double *flops_per_iter) {
#if PAB_X86 && defined(PAB_HAVE_AVX512)
  if (m->fma_isa && strcmp(m->fma_isa, "avx512") == 0) {
    *flops_per_iter = PAB_FMA512_FLOPS_PER_ITER;
    return pab_fma_avx512;
  }
#endif
#if PAB_X86 && defined(PAB_HAVE_AVX2)
  if (m->fma_isa && strcmp(m->fma_isa, "avx2") == 0) {
    *flops_per_iter = PAB_FMA256_FLOPS_PER_ITER;
    return pab_fma_avx2;
  }
#endif
  (void)m;
  *flops_per_iter = 0;
  return NULL;
}

static peak_fn pick_bf16(const pab_machine *m, double *flops_per_iter) {
#if PAB_X86 && defined(PAB_HAVE_AVX512BF16)
  if (m->bf16_isa) {
    *flops_per_iter = PAB_DPBF16_FLOPS_PER_ITER;
    return pab_dpbf16_avx512;
  }
#endif
  (void)m;
  *flops_per_iter = 0;
  return NULL;
}

static peak_fn pick_amx(const pab_machine *m, double *flops_per_iter) {
#if PAB_X86 && defined(PAB_HAVE_AMX)
  if (m->amx_isa) {
    *flops_per_iter = PAB_TDPBF16_FLOPS_PER_ITER;
    return pab_tdpbf16_amx;
  }
#endif
  (void)m;
  *flops_per_iter = 0;
  return NULL;
}

/* ---- driver ------------------------------------------------------------------------------ */

struct pab_read_probe {
  read_job job;
};

pab_read_probe *pab_read_probe_new(const pab_machine *m, size_t buf_bytes, int max_threads) {
  buf_bytes = buf_bytes / 4096 * 4096;
  unsigned char *buf = NULL;
  /* A smaller machine still gets a number; halving stops at 4x L3 so it still measures DRAM. */
  while (!(buf = pab_big_alloc(buf_bytes)) && buf_bytes / 2 >= 4 * m->l3_bytes) buf_bytes /= 2;
  if (!buf) pab_die("cannot allocate the %zu-byte roofline read buffer", buf_bytes);
  pab_read_probe *p = pab_xmalloc(sizeof *p);
  p->job = (read_job){buf, buf_bytes, pick_read(m), 1};
  /* Each thread first-touches the pages it later reads (matters on NUMA machines). */
  pab_run_parallel(max_threads, 1, read_work, &p->job);
  p->job.touch = 0;
  return p;
}

double pab_read_probe_gbs(pab_read_probe *p, int threads, int reps) {
  /* One untimed pass settles clocks and the TLB before the timed ones. */
  pab_run_parallel(threads, 1, read_work, &p->job);
  double t = pab_run_parallel(threads, reps, read_work, &p->job);
  return (double)p->job.bytes / t * 1e-9;
}

/* The peaks again, each fn's iteration count calibrated once. */
struct pab_peak_probe {
  peak_fn fn[3]; /* FMA, bf16 dot, AMX (NULL: n/a) */
  double flops_per_iter[3];
  uint64_t iters[3];
};

pab_peak_probe *pab_peak_probe_new(const pab_machine *m, double seconds) {
  pab_peak_probe *p = pab_xmalloc(sizeof *p);
  p->fn[0] = pick_fma(m, &p->flops_per_iter[0]);
  p->fn[1] = pick_bf16(m, &p->flops_per_iter[1]);
  p->fn[2] = pick_amx(m, &p->flops_per_iter[2]);
  for (int i = 0; i < 3; i++) p->iters[i] = p->fn[i] ? calibrate_peak(p->fn[i], seconds) : 0;
  return p;
}

void pab_peak_probe_raise(pab_peak_probe *p, int threads, int reps, pab_roof *roof) {
  double *peak[3] = {&roof->fma_gflops, &roof->bf16_gflops, &roof->amx_gflops};
  for (int i = 0; i < 3; i++) {
    if (!p->fn[i]) continue;
    double now = run_peak(p->fn[i], p->flops_per_iter[i], p->iters[i], threads, reps);
    if (now > *peak[i]) *peak[i] = now;
  }
}

void pab_peak_probe_free(pab_peak_probe *p) { free(p); }

void pab_read_probe_free(pab_read_probe *p) {
  if (!p) return;
  pab_big_free(p->job.buf);
  free(p);
}

void pab_roofline_measure(const pab_machine *m, const int *threads, int num_threads,
                          size_t buf_bytes, double seconds, int reps, pab_roof *out) {
  int max_threads = 1;
  for (int i = 0; i < num_threads; i++)
    if (threads[i] > max_threads) max_threads = threads[i];
  pab_read_probe *probe = pab_read_probe_new(m, buf_bytes, max_threads);
  double fma_fpi = 0, bf16_fpi = 0, amx_fpi = 0;
  peak_fn fma = pick_fma(m, &fma_fpi), bf16 = pick_bf16(m, &bf16_fpi);
  peak_fn amx = pick_amx(m, &amx_fpi);
  for (int i = 0; i < num_threads; i++) {
    int n = threads[i];
    out[i].threads = n;
    out[i].read_gbs = pab_read_probe_gbs(probe, n, reps);
    out[i].fma_gflops = fma ? measure_peak(fma, fma_fpi, n, seconds, reps) : -1.0;
    out[i].bf16_gflops = bf16 ? measure_peak(bf16, bf16_fpi, n, seconds, reps) : -1.0;
    out[i].amx_gflops = amx ? measure_peak(amx, amx_fpi, n, seconds, reps) : -1.0;
  }
  pab_read_probe_free(probe);
}

const pab_roof *pab_roof_for(const pab_roof *roofs, int num, int threads) {
  for (int i = 0; i < num; i++)
    if (roofs[i].threads == threads) return &roofs[i];
  return NULL;
}
