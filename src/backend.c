/* Dtypes and the engine-facing description of the backend. */
#include "internal.h"

size_t pa_dtype_size(pa_dtype dtype) {
  switch (dtype) {
    case PA_F32: return 4;
    case PA_F16:
    case PA_BF16: return 2;
    case PA_FP8_E4M3:
    case PA_FP8_E5M2: return 1;
  }
  return 0;
}

const char *pa_dtype_name(pa_dtype dtype) {
  switch (dtype) {
    case PA_F32: return "f32";
    case PA_F16: return "f16";
    case PA_BF16: return "bf16";
    case PA_FP8_E4M3: return "fp8_e4m3";
    case PA_FP8_E5M2: return "fp8_e5m2";
  }
  return "invalid";
}

const char *pa_backend_name(void) { return "PAGEDATTN"; }

pa_status pa_validate_head_size(int head_size) {
  if (head_size < PA_MIN_HEAD_SIZE || head_size > PA_MAX_HEAD_SIZE) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "head_size = %d is outside the supported range %d..%d",
                   head_size, PA_MIN_HEAD_SIZE, PA_MAX_HEAD_SIZE);
  }
  return PA_OK;
}

int pa_dtype_is_supported(pa_dtype dtype) { return pa_dtype_is_activation(dtype); }

void pa_kv_cache_shape(int64_t num_blocks, int block_size, int num_kv_heads, int head_size,
                       int64_t shape[3]) {
  if (!shape) return;
  shape[0] = 2;
  shape[1] = num_blocks;
  shape[2] = (int64_t)block_size * num_kv_heads * head_size;
}
