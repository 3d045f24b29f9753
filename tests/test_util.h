/*
 * Helpers shared by the pagedattn tests: a seeded generator, failure
 * accounting and canary buffers. Nothing here calls the library, so the
 * reference self-test can use it before the library exists.
 */
#ifndef PA_TEST_UTIL_H
#define PA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64: tiny, seedable, and identical on every platform, so a printed
 * seed reproduces a case anywhere. */
typedef struct tu_rng {
  uint64_t state;
} tu_rng;

void tu_rng_seed(tu_rng *rng, uint64_t seed);
uint64_t tu_next(tu_rng *rng);
double tu_uniform(tu_rng *rng);                     /* [0, 1) */
double tu_range(tu_rng *rng, double lo, double hi); /* [lo, hi) */
int tu_int(tu_rng *rng, int lo, int hi);            /* [lo, hi], inclusive */
int tu_chance(tu_rng *rng, double p);               /* 1 with probability p */
uint64_t tu_mix(uint64_t a, uint64_t b);            /* derive a case seed from the run seed */

/* The run seed: "--seed=N" (or a bare number) on the command line, else the
 * environment variable PA_TEST_SEED, else default_seed. Decimal or 0x hex. */
uint64_t tu_seed_from_args(int argc, char **argv, uint64_t default_seed);
/* PA_TEST_ONLY=<case index> runs one randomised case; -1 when unset. */
long tu_only_case(void);
/* PA_TEST_SCALE multiplies the number of randomised cases (default 1). */
double tu_case_scale(void);

void *tu_malloc(size_t bytes); /* never NULL: aborts the test instead */
void *tu_calloc(size_t count, size_t size);

/* Canary bytes mark memory a call must not touch. */
#define TU_CANARY 0xA5
void tu_fill_canary(void *p, size_t bytes);
/* Index of the first byte that is not the canary, or bytes if all are. */
size_t tu_find_non_canary(const void *p, size_t bytes);
void tu_fill_random_bytes(tu_rng *rng, void *p, size_t bytes);

/* Failure accounting: a test keeps going after a failed check so that one
 * run reports every problem, and exits non-zero at the end. */
extern long tu_failures;
extern long tu_checks;
void tu_fail(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
#define TU_CHECK(cond, ...)                                \
  do {                                                     \
    tu_checks++;                                           \
    if (!(cond)) tu_fail(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

double tu_now(void);                  /* seconds, monotonic */
int tu_finish(const char *test_name); /* prints the summary; non-zero on a failure or no checks */

#endif /* PA_TEST_UTIL_H */
