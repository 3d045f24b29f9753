/* How fast this CPU's bf16 dot products are against its f32 FMA: the same
 * count of vdpbf16ps and of vfmadd231ps, each in 12 independent chains
 * (more than latency x pipes on the CPUs known), timed in turn. On some
 * CPUs (Zen 4) vdpbf16ps issues as often as an FMA and does twice its
 * work; on others (some Xeons) it issues at a third of the FMA's rate, and
 * kernels that widen bf16 to f32 for the FMA units are then the faster. */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <time.h>

#include "kernels.h"

enum { PA_ITERS = 2048, PA_ROUNDS = 5 };

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One timed loop of PA_ITERS x 12 independent accumulations, each chain
 * its own variable (an array of them went through the stack). The sums
 * stay small (products of 1e-3), so no lane overflows or goes denormal (an
 * assist would be timed instead); the asm keeps every chain alive. */
#define PA_TIMED_CHAINS(step)                                                                     \
  __m512 c0 = _mm512_set1_ps(0.1f), c1 = _mm512_set1_ps(0.2f), c2 = _mm512_set1_ps(0.3f);         \
  __m512 c3 = _mm512_set1_ps(0.4f), c4 = _mm512_set1_ps(0.5f), c5 = _mm512_set1_ps(0.6f);         \
  __m512 c6 = _mm512_set1_ps(0.7f), c7 = _mm512_set1_ps(0.8f), c8 = _mm512_set1_ps(0.9f);         \
  __m512 c9 = _mm512_set1_ps(1.0f), c10 = _mm512_set1_ps(1.1f), c11 = _mm512_set1_ps(1.2f);       \
  double start = seconds();                                                                       \
  for (int i = 0; i < PA_ITERS; i++) {                                                            \
    c0 = step(c0), c1 = step(c1), c2 = step(c2), c3 = step(c3), c4 = step(c4), c5 = step(c5);     \
    c6 = step(c6), c7 = step(c7), c8 = step(c8), c9 = step(c9), c10 = step(c10), c11 = step(c11); \
    __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5));            \
    __asm__ volatile("" : "+v"(c6), "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));          \
  }                                                                                               \
  double elapsed = seconds() - start;                                                             \
  volatile float sink = _mm512_reduce_add_ps(                                                     \
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),                  \
                    _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))));                \
  sink += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));    \
  (void)sink;                                                                                     \
  return elapsed

__attribute__((noinline)) static double time_dot(void) {
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(-1e-3f));
#define PA_DOT_STEP(c) _mm512_dpbf16_ps(c, a, a)
  PA_TIMED_CHAINS(PA_DOT_STEP);
#undef PA_DOT_STEP
}

__attribute__((noinline)) static double time_fma(void) {
  const __m512 a = _mm512_set1_ps(1e-3f), b = _mm512_set1_ps(-1e-3f);
#define PA_FMA_STEP(c) _mm512_fmadd_ps(a, b, c)
  PA_TIMED_CHAINS(PA_FMA_STEP);
#undef PA_FMA_STEP
}

/* The time of a vdpbf16ps over that of a vfmadd231ps, the fastest of
 * PA_ROUNDS alternating rounds of each (a fraction of a millisecond in all;
 * docs/xeon-amx.md). */
double pa_bf16_dot_cost_avx512bf16(void) {
  double dot = 1e30, fma = 1e30;
  for (int r = 0; r < PA_ROUNDS; r++) {
    double t = time_fma();
    fma = t < fma ? t : fma;
    t = time_dot();
    dot = t < dot ? t : dot;
  }
  return fma > 0.0 ? dot / fma : 1.0;
}
