/* Which keys each query row sees, and the checks of a batch's lengths. */
#ifndef PA_BATCH_H
#define PA_BATCH_H

#include "internal.h"

/* The mask of a layer: causal (decoder), a window, and whether the window
 * reaches into the future as well (encoder-only, as in vLLM). */
typedef struct pa_mask {
  int causal;
  int64_t window; /* 0: none */
  int symmetric;
} pa_mask;

static inline pa_mask pa_layer_mask(const pa_layer *layer) {
  pa_mask mask = {layer->type == PA_ATTN_DECODER, layer->window,
                  layer->type == PA_ATTN_ENCODER_ONLY};
  return mask;
}

/* Query row r of q_len rows over k_len keys has position k_len - q_len + r
 * and sees keys [*lo, *hi) (possibly empty). */
static inline void pa_row_keys(pa_mask mask, int64_t q_len, int64_t k_len, int64_t r, int64_t *lo,
                               int64_t *hi) {
  int64_t pos = k_len - q_len + r;
  int64_t begin = 0, end = k_len;
  if (mask.window > 0) {
    begin = pos - mask.window + 1;
    end = mask.symmetric ? pos + mask.window : pos + 1;
  } else if (mask.causal) {
    end = pos + 1;
  }
  begin = PA_MAX(begin, 0);
  end = PA_MIN(end, k_len);
  *lo = begin;
  *hi = PA_MAX(end, begin);
}

/* Checks num_seqs, query_start_loc (from 0, non-decreasing) and, when
 * kv_lens_name is not NULL, the per-sequence key lengths: either kv_lens
 * (seq_lens, >= 0) or, when kv_starts is set, cumulative starts. For a
 * decoder over the paged cache q_len <= seq_len. */
pa_status pa_check_lengths(int num_seqs, const int32_t *q_starts, const char *q_name,
                           const int32_t *kv_lens, const int32_t *kv_starts, const char *kv_name,
                           int require_q_le_k, const char *caller);

#endif
