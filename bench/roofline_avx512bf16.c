/* Compiled with -mavx512f -mavx512bf16; called only when the CPU reports AVX512-BF16. */
#include <immintrin.h>

#include "roofline_kernels.h"

float pab_dpbf16_avx512(uint64_t iters) {
  /* 16 independent vdpbf16ps chains hide its latency (about 6 cycles) on 2 pipes. The products
   * are ~1e-6, so the sums stay far from overflow for any realistic iteration count. */
  const __m512 x = _mm512_set1_ps(1e-3f), y = _mm512_set1_ps(-1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(x, y), b = _mm512_cvtne2ps_pbh(y, x);
  __m512 a0 = _mm512_set1_ps(0.1f), a1 = _mm512_set1_ps(0.2f), a2 = _mm512_set1_ps(0.3f);
  __m512 a3 = _mm512_set1_ps(0.4f), a4 = _mm512_set1_ps(0.5f), a5 = _mm512_set1_ps(0.6f);
  __m512 a6 = _mm512_set1_ps(0.7f), a7 = _mm512_set1_ps(0.8f), a8 = _mm512_set1_ps(0.9f);
  __m512 a9 = _mm512_set1_ps(1.0f), a10 = _mm512_set1_ps(1.1f), a11 = _mm512_set1_ps(1.2f);
  __m512 a12 = _mm512_set1_ps(1.3f), a13 = _mm512_set1_ps(1.4f), a14 = _mm512_set1_ps(1.5f);
  __m512 a15 = _mm512_set1_ps(1.6f);
  for (uint64_t i = 0; i < iters; i++) {
    a0 = _mm512_dpbf16_ps(a0, a, b);
    a1 = _mm512_dpbf16_ps(a1, a, b);
    a2 = _mm512_dpbf16_ps(a2, a, b);
    a3 = _mm512_dpbf16_ps(a3, a, b);
    a4 = _mm512_dpbf16_ps(a4, a, b);
    a5 = _mm512_dpbf16_ps(a5, a, b);
    a6 = _mm512_dpbf16_ps(a6, a, b);
    a7 = _mm512_dpbf16_ps(a7, a, b);
    a8 = _mm512_dpbf16_ps(a8, a, b);
    a9 = _mm512_dpbf16_ps(a9, a, b);
    a10 = _mm512_dpbf16_ps(a10, a, b);
    a11 = _mm512_dpbf16_ps(a11, a, b);
    a12 = _mm512_dpbf16_ps(a12, a, b);
    a13 = _mm512_dpbf16_ps(a13, a, b);
    a14 = _mm512_dpbf16_ps(a14, a, b);
    a15 = _mm512_dpbf16_ps(a15, a, b);
  }
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  __m512 t = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                           _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15)));
  return _mm512_reduce_add_ps(_mm512_add_ps(s, t));
}
