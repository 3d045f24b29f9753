/* Tiled caches (pa_kv_layout PA_KV_TILED) read through rows: the copy that
 * serves the kernel paths and dtype pairs without tiles' kernels, and the
 * specification those kernels are tested against (with the row kernels
 * after it). Elements are moved as they are stored, whatever their dtype. */
#include <string.h>

#include "kernels.h"

/* Copies element e (size bytes) of each row from anchor + offset(e). The
 * sizes are constants in each instance, so that the copies are moves. */
#define PA_UNPACK(size, OFFSET)                                             \
  for (size_t i = 0; i < n; i++) {                                          \
    char *row = (char *)rows + i * d * (size);                              \
    const char *anchor = anchors[i];                                        \
    for (size_t e = 0; e < d; e++) {                                        \
      memcpy(row + e * (size), anchor + (size_t)(OFFSET) * (size), (size)); \
    }                                                                       \
  }

#define PA_BY_SIZE(OFFSET)                \
  switch (elem_size) {                    \
    case 1: PA_UNPACK(1, OFFSET); break;  \
    case 2: PA_UNPACK(2, OFFSET); break;  \
    default: PA_UNPACK(4, OFFSET); break; \
  }

static void pa_unpack_keys_tiled_scalar(void *rows, const void *const *anchors, size_t n, size_t d,
                                        size_t elem_size, size_t block_size) {
  (void)block_size;
  PA_BY_SIZE(pa_tiled_key_offset((int64_t)e));
}

static void pa_unpack_values_tiled_scalar(void *rows, const void *const *anchors, size_t n,
                                          size_t d, size_t elem_size, size_t block_size) {
  PA_BY_SIZE(pa_tiled_value_offset((int64_t)e, (int64_t)block_size));
}

void pa_tiled_kernels_scalar(pa_kernels *k) {
  k->unpack_tiled[0] = pa_unpack_keys_tiled_scalar;
  k->unpack_tiled[1] = pa_unpack_values_tiled_scalar;
}
