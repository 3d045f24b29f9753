/* Runtime CPU dispatch: which kernel family this machine (and PA_ISA) allows. */
#ifndef PA_DISPATCH_H
#define PA_DISPATCH_H

#include "kernels/kernels.h"

/* Kernel paths, each the one before it plus more: AVX-512 without and with
 * its bf16 dot products, then AMX tiles for the packed bf16 products. PA_ISA
 * names one of them to cap the path; pa_context_isa() reports the family
 * (scalar, avx2, avx512) and pa_context_kernel_path() the path. */
typedef enum pa_isa {
  PA_ISA_SCALAR,
  PA_ISA_AVX2,
  PA_ISA_AVX512,
  PA_ISA_AVX512BF16,
  PA_ISA_AMX,
  PA_NUM_ISAS
} pa_isa;

/* The best path the CPU and OS support (for AMX: the OS grants this process
 * the tile state, which this requests). */
pa_isa pa_isa_detect(void);
/* Parses a PA_ISA value; 0 if it names no path. */
int pa_isa_parse(const char *name, pa_isa *isa);
const char *pa_isa_name(pa_isa isa);        /* the path: "amx", "avx512bf16", ... */
const char *pa_isa_family_name(pa_isa isa); /* "scalar", "avx2" or "avx512" */
/* Whether this CPU's bf16 dot products beat widening bf16 for its FMA
 * units, measured once per process (docs/xeon-amx.md); 0 without them. */
int pa_bf16_dot_is_fast(void);
/* Whether the next tile's K/V are best requested into L2 only, by what the
 * CPU is (docs/decode-memory.md): on Zen 4 and the recent Xeons, requests
 * into L1 stall the loop once L1's few miss buffers are taken, and the
 * decode reads faster with PREFETCHT1; elsewhere (Zen 5) the lines are
 * wanted in L1. */
int pa_prefetch_to_l2_suits(void);
/* Fills `kernels` with the family `isa` (which must be supported); on the
 * AVX512-BF16 and AMX paths, bf16 caches' direct products (and, without
 * tiles, the packed ones) take the dot products when `bf16_dot` is set,
 * the FMA units otherwise. */
void pa_kernels_build(pa_isa isa, int bf16_dot, pa_kernels *kernels);

#endif
