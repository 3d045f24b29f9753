/* Small helpers shared by the bench files: time, fatal errors, big buffers, random fill. */
#ifndef PAB_UTIL_H
#define PAB_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "pagedattn.h"

/* Every pa_* status goes through this, so a failure names the call and the library's detail. */
#define PAB_CHECK(call)                                \
  do {                                                 \
    pa_status pab_st_ = (call);                        \
    if (pab_st_ != PA_OK) pab_pa_fail(#call, pab_st_); \
  } while (0)

void pab_pa_fail(const char *what, pa_status status);
void pab_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

double pab_now(void); /* seconds, monotonic */

/* 64-byte aligned (free with free); exit with a message when out of memory. */
void *pab_xmalloc(size_t bytes);
void *pab_xcalloc(size_t count, size_t size);
/* Page-aligned, asks for transparent huge pages: the roofline buffer and the KV caches are
 * allocated the same way so their bandwidths are comparable. NULL when out of memory. */
void *pab_big_alloc(size_t bytes);
void pab_big_free(void *p);

typedef struct pab_rng {
  uint64_t s;
} pab_rng;
uint64_t pab_rng_next(pab_rng *r);
/* Fills n elements of an activation dtype with values of magnitude in [2^-8, 1) and a random
 * sign: realistic attention inputs without denormals or overflow. */
void pab_fill_random(pab_rng *r, void *dst, size_t n, pa_dtype dtype);

int pab_num_cpus(void);

#endif
