/* Compiled with -mavx2 -mfma; called only when the CPU reports both. */
#include <immintrin.h>

#include "roofline_kernels.h"

uint64_t pab_read_avx2(const void *buf, size_t bytes) {
  const __m256i *p = (const __m256i *)buf;
  size_t n = bytes / 32;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + i + 1));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + i + 2));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + i + 3));
  }
  a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  __m128i h = _mm_add_epi64(_mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1));
  return (uint64_t)_mm_cvtsi128_si64(h) + (uint64_t)_mm_extract_epi64(h, 1);
}

float pab_fma_avx2(uint64_t iters) {
  /* 12 chains (of 16 ymm registers, 2 hold constants) cover a 4-5 cycle latency on 2 pipes. */
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  __m256 a0 = _mm256_set1_ps(0.1f), a1 = _mm256_set1_ps(0.2f), a2 = _mm256_set1_ps(0.3f);
  __m256 a3 = _mm256_set1_ps(0.4f), a4 = _mm256_set1_ps(0.5f), a5 = _mm256_set1_ps(0.6f);
  __m256 a6 = _mm256_set1_ps(0.7f), a7 = _mm256_set1_ps(0.8f), a8 = _mm256_set1_ps(0.9f);
  __m256 a9 = _mm256_set1_ps(1.0f), a10 = _mm256_set1_ps(1.1f), a11 = _mm256_set1_ps(1.2f);
  for (uint64_t i = 0; i < iters; i++) {
    a0 = _mm256_fmadd_ps(a0, m, c);
    a1 = _mm256_fmadd_ps(a1, m, c);
    a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c);
    a4 = _mm256_fmadd_ps(a4, m, c);
    a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c);
    a7 = _mm256_fmadd_ps(a7, m, c);
    a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c);
    a10 = _mm256_fmadd_ps(a10, m, c);
    a11 = _mm256_fmadd_ps(a11, m, c);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}
