/* Scalar conversions between f32 and the narrow dtypes: the specification
 * the vector kernels are tested against. Round to nearest even everywhere;
 * FP8 saturates to its largest finite magnitude (infinities included) and
 * keeps NaN a NaN; f16 overflows to infinity as IEEE does. */
#ifndef PA_KERNELS_CODECS_H
#define PA_KERNELS_CODECS_H

#include <stdint.h>
#include <string.h>

#include "../common.h"

static inline uint32_t pa_f32_bits(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}

static inline float pa_f32_from_bits(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

/* Rounds a finite, non-negative f32 (given as bits) to the nearest-even value
 * of a binary format with `man_bits` fraction bits and exponent `bias`, and
 * returns its code (exponent << man_bits | fraction). The code may exceed the
 * format's largest finite one: callers saturate or make it an infinity. f32
 * subnormals round to zero, which is exact for every format used here (the
 * smallest, f16, has its half-ulp at 2^-25). */
static inline uint32_t pa_round_to_minifloat(uint32_t abs_bits, int man_bits, int bias) {
  int f32_exp = (int)(abs_bits >> 23);
  if (f32_exp == 0) return 0;
  uint32_t mant = (abs_bits & 0x7fffffu) | 0x800000u; /* value = mant * 2^(f32_exp - 150) */
  int exp = f32_exp - 127 + bias;                     /* biased exponent in the target */
  int shift = 23 - man_bits;
  if (exp < 1) { /* subnormal in the target: one fewer fraction bit per step below */
    shift += 1 - exp;
    exp = 0;
  }
  if (shift > 25) shift = 25; /* everything is below half the smallest subnormal */
  uint32_t q = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  q += (rem > half) | ((rem == half) & q);
  if (exp == 0) return q; /* a carry to 1 << man_bits is the smallest normal's code */
  return ((uint32_t)exp << man_bits) + (q - (1u << man_bits)); /* carry bumps the exponent */
}

static inline float pa_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal: man * 2^-24 is exact in f32 */
    float mag = (float)man * 0x1p-24f;
    return pa_f32_from_bits(pa_f32_bits(mag) | sign);
  }
  if (exp == 31) return pa_f32_from_bits(sign | 0x7f800000u | (man << 13));
  return pa_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t pa_f32_to_f16(float value) {
  uint32_t bits = pa_f32_bits(value);
  uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  /* NaN stays a NaN, quieted, with the payload's top bits (as F16C does). */
  if (abs_bits > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
  if (abs_bits == 0x7f800000u) return sign | 0x7c00u;
  uint32_t code = pa_round_to_minifloat(abs_bits, 10, 15);
  return (uint16_t)(sign | (code >= 0x7c00u ? 0x7c00u : code));
}

static inline float pa_bf16_to_f32(uint16_t b) { return pa_f32_from_bits((uint32_t)b << 16); }

static inline uint16_t pa_f32_to_bf16(float value) {
  uint32_t bits = pa_f32_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
  /* bf16 keeps f32's exponent, so rounding is an add on the raw bits; a
   * carry out of the fraction is the correct next binade (or infinity). */
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)((bits + rounding) >> 16);
}

/* E4M3 (bias 7, no infinities, S.1111.111 is NaN). Shifted left by 7 its
 * exponent and fraction land in an f16's fields, giving value * 2^-8
 * (subnormals included), so decoding is an f16 decode and a scale. */
static inline float pa_e4m3_to_f32(uint8_t b) {
  uint32_t mag_bits = b & 0x7fu;
  float mag = mag_bits == 0x7fu ? pa_f32_from_bits(0x7fc00000u)
                                : pa_f16_to_f32((uint16_t)(mag_bits << 7)) * 256.0f;
  return (b & 0x80u) ? -mag : mag;
}

static inline uint8_t pa_f32_to_e4m3(float value) {
  uint32_t bits = pa_f32_bits(value);
  uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7fu;
  if (abs_bits >= 0x43e00000u) return sign | 0x7eu; /* >= 448 (and inf): saturate */
  uint32_t code = pa_round_to_minifloat(abs_bits, 3, 7);
  return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
}

/* E5M2 is the upper byte of an f16. */
static inline float pa_e5m2_to_f32(uint8_t b) { return pa_f16_to_f32((uint16_t)(b << 8)); }

static inline uint8_t pa_f32_to_e5m2(float value) {
  uint32_t bits = pa_f32_bits(value);
  uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7fu;
  uint32_t code = abs_bits == 0x7f800000u ? 0x7bu : pa_round_to_minifloat(abs_bits, 2, 15);
  return (uint8_t)(sign | (code > 0x7bu ? 0x7bu : code)); /* 0x7b = 57344 */
}

/* Element e of a row of any dtype, as f32. */
static inline float pa_decode_element(pa_dtype dtype, const void *row, size_t e) {
  switch (dtype) {
    case PA_F32: return ((const float *)row)[e];
    case PA_F16: return pa_f16_to_f32(((const uint16_t *)row)[e]);
    case PA_BF16: return pa_bf16_to_f32(((const uint16_t *)row)[e]);
    case PA_FP8_E4M3: return pa_e4m3_to_f32(((const uint8_t *)row)[e]);
    case PA_FP8_E5M2: return pa_e5m2_to_f32(((const uint8_t *)row)[e]);
  }
  return 0.0f;
}

#endif
