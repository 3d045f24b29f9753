/* The prefill half of pagedattn-kernel-bench (bench/kernels_prefill.c). */
#ifndef PAB_KERNELS_PREFILL_H
#define PAB_KERNELS_PREFILL_H

#include "kernels/kernels.h"
#include "roofline.h"

/* Times the packed micro-kernels of `k` on one tile of `rows` rows per case and prints the
 * table. */
void pab_prefill_kernels(const pa_kernels *k, const pab_machine *mach, size_t rows, int quick);

#endif
