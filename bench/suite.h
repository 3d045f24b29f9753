/* The cases the tool runs: the default Llama-3-8B-shaped suite, or one custom case. */
#ifndef PAB_SUITE_H
#define PAB_SUITE_H

#include "workloads.h"

typedef enum pab_mode {
  PAB_MODE_NONE,
  PAB_MODE_DECODE,
  PAB_MODE_PREFILL,
  PAB_MODE_CHUNKED,
  PAB_MODE_ENCODER,
  PAB_MODE_MIXED,
} pab_mode;

/* Options of the custom single case; -1 (or *_set == 0) means "the mode's default". */
typedef struct pab_custom {
  pab_mode mode;
  int batch, context, q_len, decode_context;
  int heads, kv_heads, head_size, block_size;
  pa_dtype dtype, cache_dtype;
  int dtype_set, cache_dtype_set;
  int window, alibi, sinks, lse, hot;
  float softcap;
} pab_custom;

void pab_custom_init(pab_custom *o);

/* Returns the number of cases; *out is a malloc'd array of them. quick: small shapes. */
int pab_suite_default(int quick, pab_case ***out);
pab_case *pab_suite_custom(const pab_custom *o);

#endif
