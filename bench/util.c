#define _DEFAULT_SOURCE 1
#define _POSIX_C_SOURCE 200809L

#include "util.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

void pab_pa_fail(const char *what, pa_status status) {
  fprintf(stderr, "pagedattn-bench: %s failed: %s: %s\n", what, pa_status_string(status),
          pa_last_error());
  exit(1);
}

void pab_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("pagedattn-bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

double pab_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 64-byte aligned, as the library's scratch and an engine's tensors are: the
 * kernel bench's Q, S and O came from calloc 16 bytes off a line, so that
 * every 64-byte load of them touched two lines (an FP8 Q K^T that loads Q
 * 64 times a block took 6.7 ns per key and KV head instead of 4.4). */
#define PAB_ALIGN ((size_t)64)

void *pab_xmalloc(size_t bytes) {
  size_t rounded = (bytes + PAB_ALIGN - 1) / PAB_ALIGN * PAB_ALIGN;
  void *p = aligned_alloc(PAB_ALIGN, rounded ? rounded : PAB_ALIGN);
  if (!p) pab_die("out of memory allocating %zu bytes", bytes);
  return p;
}

void *pab_xcalloc(size_t count, size_t size) {
  if (size && count > SIZE_MAX / size)
    pab_die("allocation of %zu x %zu bytes overflows", count, size);
  void *p = pab_xmalloc(count * size);
  memset(p, 0, count * size);
  return p;
}

#define PAB_HUGE_ALIGN ((size_t)2 << 20)

void *pab_big_alloc(size_t bytes) {
  /* 2 MiB alignment lets the kernel back the whole buffer with huge pages. */
  size_t rounded = (bytes + PAB_HUGE_ALIGN - 1) / PAB_HUGE_ALIGN * PAB_HUGE_ALIGN;
  void *p = aligned_alloc(PAB_HUGE_ALIGN, rounded ? rounded : PAB_HUGE_ALIGN);
  if (!p) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void pab_big_free(void *p) { free(p); }

uint64_t pab_rng_next(pab_rng *r) {
  /* splitmix64: fast, and good enough to make every cache line different. */
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void pab_fill_random(pab_rng *r, void *dst, size_t n, pa_dtype dtype) {
  /* Build the bit patterns directly (sign, exponent in [-8, -1], random mantissa) so no float
   * conversion code is needed for the 16-bit types. */
  size_t i = 0;
  while (i < n) {
    uint64_t bits = pab_rng_next(r);
    for (int k = 0; k < 2 && i < n; k++, i++) {
      uint32_t b = (uint32_t)(bits >> (32 * k));
      uint32_t sign = b >> 31, ex = (b >> 28) & 7u, man = b & 0x0FFFFFFFu;
      switch (dtype) {
        case PA_F32: {
          uint32_t f = (sign << 31) | ((119u + ex) << 23) | (man & 0x7FFFFFu);
          memcpy((uint32_t *)dst + i, &f, 4);
          break;
        }
        case PA_BF16: {
          uint16_t h = (uint16_t)((sign << 15) | ((119u + ex) << 7) | (man & 0x7Fu));
          ((uint16_t *)dst)[i] = h;
          break;
        }
        case PA_F16: {
          uint16_t h = (uint16_t)((sign << 15) | ((7u + ex) << 10) | (man & 0x3FFu));
          ((uint16_t *)dst)[i] = h;
          break;
        }
        default: pab_die("random fill: %s is not an activation dtype", pa_dtype_name(dtype));
      }
    }
  }
}

int pab_num_cpus(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
