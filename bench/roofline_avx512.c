/* Compiled with -mavx512f; called only when the CPU reports AVX-512F. */
#include <immintrin.h>

#include "roofline_kernels.h"

uint64_t pab_read_avx512(const void *buf, size_t bytes) {
  /* Four independent integer sums: adds are cheap, so the loop is bound by the loads alone. */
  const __m512i *p = (const __m512i *)buf;
  size_t n = bytes / 64;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 1));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 2));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 3));
  }
  a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
  /* Summed as unsigned by hand: _mm512_reduce_add_epi64 adds signed and overflows (UB). */
  uint64_t lanes[8], sum = 0;
  _mm512_storeu_si512(lanes, a0);
  for (int i = 0; i < 8; i++) sum += lanes[i];
  return sum;
}

float pab_fma_avx512(uint64_t iters) {
  /* 16 chains cover a 4-cycle FMA latency on 2 pipes with room to spare; the multiplier just
   * below 1 and the small addend keep every value normal forever. */
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  __m512 a0 = _mm512_set1_ps(0.1f), a1 = _mm512_set1_ps(0.2f), a2 = _mm512_set1_ps(0.3f);
  __m512 a3 = _mm512_set1_ps(0.4f), a4 = _mm512_set1_ps(0.5f), a5 = _mm512_set1_ps(0.6f);
  __m512 a6 = _mm512_set1_ps(0.7f), a7 = _mm512_set1_ps(0.8f), a8 = _mm512_set1_ps(0.9f);
  __m512 a9 = _mm512_set1_ps(1.0f), a10 = _mm512_set1_ps(1.1f), a11 = _mm512_set1_ps(1.2f);
  __m512 a12 = _mm512_set1_ps(1.3f), a13 = _mm512_set1_ps(1.4f), a14 = _mm512_set1_ps(1.5f);
  __m512 a15 = _mm512_set1_ps(1.6f);
  for (uint64_t i = 0; i < iters; i++) {
    a0 = _mm512_fmadd_ps(a0, m, c);
    a1 = _mm512_fmadd_ps(a1, m, c);
    a2 = _mm512_fmadd_ps(a2, m, c);
    a3 = _mm512_fmadd_ps(a3, m, c);
    a4 = _mm512_fmadd_ps(a4, m, c);
    a5 = _mm512_fmadd_ps(a5, m, c);
    a6 = _mm512_fmadd_ps(a6, m, c);
    a7 = _mm512_fmadd_ps(a7, m, c);
    a8 = _mm512_fmadd_ps(a8, m, c);
    a9 = _mm512_fmadd_ps(a9, m, c);
    a10 = _mm512_fmadd_ps(a10, m, c);
    a11 = _mm512_fmadd_ps(a11, m, c);
    a12 = _mm512_fmadd_ps(a12, m, c);
    a13 = _mm512_fmadd_ps(a13, m, c);
    a14 = _mm512_fmadd_ps(a14, m, c);
    a15 = _mm512_fmadd_ps(a15, m, c);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                           _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15)));
  return _mm512_reduce_add_ps(_mm512_add_ps(s, t));
}
