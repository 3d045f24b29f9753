/* Row conversions to bf16 through vcvtne2ps2bf16: one instruction for 32
 * values where the AVX-512 kernels round by shifts (eight instructions for
 * 16). The instruction rounds to nearest even and quiets NaN as the scalar
 * kernel does, but reads denormal inputs as zero; a step with one takes
 * the shifts instead, so every row matches pa_store_row_bf16_scalar bit
 * for bit. Output rows are written once per query row and head, and bf16
 * caches through encode_row once per token. */
#include "avx512-common.h"
#include "kernels.h"

enum { PA_FPCLASS_DENORMAL = 0x20 };

PA_INLINE void store_bf16_exact(uint16_t *out, __m512 x, __mmask16 m) {
  _mm256_mask_storeu_epi16(out, m, pa512_to_bf16(x));
}

static void pa_store_row_bf16_avx512bf16(void *dst, const float *src, size_t n, float factor) {
  uint16_t *out = dst;
  const __m512 f = _mm512_set1_ps(factor);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(src + i), f);
    __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(src + i + 16), f);
    if (_mm512_fpclass_ps_mask(lo, PA_FPCLASS_DENORMAL) |
        _mm512_fpclass_ps_mask(hi, PA_FPCLASS_DENORMAL)) {
      store_bf16_exact(out + i, lo, 0xffff);
      store_bf16_exact(out + i + 16, hi, 0xffff);
    } else {
      _mm512_storeu_si512(out + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
  for (; i < n; i += 16) {
    __mmask16 m = pa512_tail_mask(n - i);
    store_bf16_exact(out + i, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), f), m);
  }
}

static void pa_encode_row_bf16_avx512bf16(void *dst, const float *src, size_t n, float scale) {
  (void)scale;
  pa_store_row_bf16_avx512bf16(dst, src, n, 1.0f);
}

void pa_convert_kernels_avx512bf16(pa_kernels *k) {
  k->store_row[PA_BF16] = pa_store_row_bf16_avx512bf16;
  k->encode_row[PA_BF16] = pa_encode_row_bf16_avx512bf16;
}
