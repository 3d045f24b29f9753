/* The ISA-specific roofline loops. Each lives in its own file compiled with its own -m flags
 * (see CMakeLists.txt) and is only called after __builtin_cpu_supports says the CPU has it. */
#ifndef PAB_ROOFLINE_KERNELS_H
#define PAB_ROOFLINE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Read every byte of buf (64-byte aligned, bytes a multiple of 256); the sum keeps the loads
 * from being optimized away. */
uint64_t pab_read_avx512(const void *buf, size_t bytes);
uint64_t pab_read_avx2(const void *buf, size_t bytes);

/* iters rounds of independent multiply-adds; the result keeps them live. */
#define PAB_FMA512_FLOPS_PER_ITER (16.0 * 16.0 * 2.0) /* 16 chains x 16 lanes x 2 */
#define PAB_FMA256_FLOPS_PER_ITER (12.0 * 8.0 * 2.0)  /* 12 chains x 8 lanes x 2 */
#define PAB_DPBF16_FLOPS_PER_ITER (16.0 * 64.0)       /* 16 chains x (16 lanes x 2 pairs x 2) */
float pab_fma_avx512(uint64_t iters);
float pab_fma_avx2(uint64_t iters);
float pab_dpbf16_avx512(uint64_t iters);
#define PAB_TDPBF16_FLOPS_PER_ITER (4.0 * 16.0 * 16.0 * 32.0 * 2.0) /* 4 tiles x 16x16x32 x 2 */
float pab_tdpbf16_amx(uint64_t iters);
int pab_amx_granted(void); /* asks the OS for the AMX tile state; 1 when granted */

#endif
