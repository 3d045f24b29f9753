#include "batch.h"

static pa_status check_cumulative(int num_seqs, const int32_t *starts, const char *name,
                                  const char *caller) {
  if (!starts) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", caller, name);
  if (starts[0] != 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s[0] = %d must be 0", caller, name,
                   (int)starts[0]);
  }
  for (int s = 0; s < num_seqs; s++) {
    if (starts[s + 1] < starts[s]) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s[%d] = %d is less than %s[%d] = %d", caller,
                     name, s + 1, (int)starts[s + 1], name, s, (int)starts[s]);
    }
  }
  return PA_OK;
}

pa_status pa_check_lengths(int num_seqs, const int32_t *q_starts, const char *q_name,
                           const int32_t *kv_lens, const int32_t *kv_starts, const char *kv_name,
                           int require_q_le_k, const char *caller) {
  if (num_seqs < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: num_seqs = %d is negative", caller, num_seqs);
  }
  if (num_seqs == 0 && !q_starts) return PA_OK;
  pa_status status = check_cumulative(num_seqs, q_starts, q_name, caller);
  if (status != PA_OK) return status;
  if (kv_starts) return check_cumulative(num_seqs, kv_starts, kv_name, caller);
  if (num_seqs > 0 && !kv_lens) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s is NULL", caller, kv_name);
  }
  for (int s = 0; s < num_seqs; s++) {
    if (kv_lens[s] < 0) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s[%d] = %d is negative", caller, kv_name, s,
                     (int)kv_lens[s]);
    }
    int32_t q_len = q_starts[s + 1] - q_starts[s];
    if (require_q_le_k && q_len > kv_lens[s]) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT,
                     "%s: sequence %d has %d query rows (%s[%d] - %s[%d]) but %s[%d] = %d; a "
                     "decoder's new tokens must already be in the cache",
                     caller, s, (int)q_len, q_name, s + 1, q_name, s, kv_name, s, (int)kv_lens[s]);
    }
  }
  return PA_OK;
}
