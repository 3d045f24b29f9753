#define _POSIX_C_SOURCE 200809L
#include "test_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

long tu_failures = 0;
long tu_checks = 0;

void tu_rng_seed(tu_rng *rng, uint64_t seed) { rng->state = seed; }

uint64_t tu_next(tu_rng *rng) {
  uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double tu_uniform(tu_rng *rng) { return (double)(tu_next(rng) >> 11) * 0x1.0p-53; }

double tu_range(tu_rng *rng, double lo, double hi) { return lo + (hi - lo) * tu_uniform(rng); }

int tu_int(tu_rng *rng, int lo, int hi) {
  uint64_t span = (uint64_t)((int64_t)hi - (int64_t)lo + 1);
  return (int)((int64_t)lo + (int64_t)(tu_next(rng) % span));
}

int tu_chance(tu_rng *rng, double p) { return tu_uniform(rng) < p; }

uint64_t tu_mix(uint64_t a, uint64_t b) {
  tu_rng r;
  tu_rng_seed(&r, a ^ (b * 0xD1B54A32D192ED03ull));
  tu_next(&r);
  return tu_next(&r);
}

static int parse_u64(const char *s, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s || *end != '\0') return 0;
  *out = (uint64_t)v;
  return 1;
}

uint64_t tu_seed_from_args(int argc, char **argv, uint64_t default_seed) {
  uint64_t seed = default_seed;
  const char *env = getenv("PA_TEST_SEED");
  if (env && *env && !parse_u64(env, &seed)) {
    fprintf(stderr, "PA_TEST_SEED=%s is not a number\n", env);
    exit(2);
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--seed=", 7) == 0) a += 7;
    if (!parse_u64(a, &seed)) {
      fprintf(stderr, "usage: %s [--seed=N]\n", argv[0]);
      exit(2);
    }
  }
  return seed;
}

long tu_only_case(void) {
  const char *env = getenv("PA_TEST_ONLY");
  if (!env || !*env) return -1;
  return strtol(env, NULL, 0);
}

double tu_case_scale(void) {
  const char *env = getenv("PA_TEST_SCALE");
  if (!env || !*env) return 1.0;
  double s = strtod(env, NULL);
  return s > 0 ? s : 1.0;
}

void *tu_malloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
    abort();
  }
  return p;
}

void *tu_calloc(size_t count, size_t size) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p) {
    fprintf(stderr, "test: out of memory (%zu x %zu bytes)\n", count, size);
    abort();
  }
  return p;
}

void tu_fill_canary(void *p, size_t bytes) { memset(p, TU_CANARY, bytes); }

size_t tu_find_non_canary(const void *p, size_t bytes) {
  const unsigned char *b = p;
  for (size_t i = 0; i < bytes; i++)
    if (b[i] != TU_CANARY) return i;
  return bytes;
}

void tu_fill_random_bytes(tu_rng *rng, void *p, size_t bytes) {
  unsigned char *b = p;
  for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(tu_next(rng) >> 56);
}

void tu_fail(const char *file, int line, const char *fmt, ...) {
  tu_failures++;
  /* Cap the noise: the first failures tell the story. */
  if (tu_failures > 200) return;
  fprintf(stderr, "FAIL %s:%d: ", file, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  if (tu_failures == 200) fprintf(stderr, "(further failures are counted, not printed)\n");
}

double tu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tu_finish(const char *test_name) {
  /* A run that checked nothing (a PA_TEST_ONLY index that selects no case,
   * a loop that never ran) proves nothing: it fails. */
  if (tu_checks == 0) {
    fprintf(stderr, "%s: no checks ran\n", test_name);
    return 1;
  }
  if (tu_failures) {
    fprintf(stderr, "%s: %ld of %ld checks FAILED\n", test_name, tu_failures, tu_checks);
    return 1;
  }
  printf("%s: all %ld checks passed\n", test_name, tu_checks);
  return 0;
}
