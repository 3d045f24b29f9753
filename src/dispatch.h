/* Runtime CPU dispatch: which kernel family this machine (and PA_ISA) allows. */
#ifndef PA_DISPATCH_H
#define PA_DISPATCH_H

#include "kernels/kernels.h"

typedef enum pa_isa { PA_ISA_SCALAR, PA_ISA_AVX2, PA_ISA_AVX512 } pa_isa;

/* The best family the CPU and OS support. */
pa_isa pa_isa_detect(void);
/* Parses a PA_ISA value; 0 if it names no family. */
int pa_isa_parse(const char *name, pa_isa *isa);
const char *pa_isa_name(pa_isa isa);
/* Fills `kernels` with the family `isa` (which must be supported). */
void pa_kernels_build(pa_isa isa, pa_kernels *kernels);

#endif
