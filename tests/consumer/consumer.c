/* Decodes one token against a four-token cache through the installed library. */
#include <pagedattn.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  pa_context *ctx = NULL;
  pa_layer *layer = NULL;
  pa_layer_config config = {.num_heads = 2,
                            .num_kv_heads = 1,
                            .head_size = 4,
                            .attn_type = PA_ATTN_DECODER,
                            .dtype = PA_F32};
  if (pa_context_create(1, &ctx) != PA_OK || pa_layer_create(&config, &layer) != PA_OK) {
    fprintf(stderr, "setup failed: %s\n", pa_last_error());
    return 1;
  }
  float key_cache[2 * 4 * 4] = {0}, value_cache[2 * 4 * 4] = {0};
  pa_kv_cache cache = {key_cache, value_cache, 2, 4, 1, 4, PA_F32, 1.0f, 1.0f};
  float keys[4 * 4], values[4 * 4];
  for (int i = 0; i < 16; i++) {
    keys[i] = (float)(i % 5) * 0.25f;
    values[i] = (float)(i / 4); /* token t's value row is all t */
  }
  int64_t slots[4] = {4, 5, 6, 7}; /* block 1 */
  int32_t query_start_loc[2] = {0, 1}, seq_lens[1] = {4}, block_table[1] = {1};
  pa_batch batch = {1, query_start_loc, seq_lens, block_table, 1};
  float query[8] = {0}, out[8];
  float lse[2];
  if (pa_write_kv(ctx, &cache, keys, 4, values, 4, PA_F32, 4, slots) != PA_OK ||
      pa_paged_attention(ctx, layer, NULL, query, 8, &cache, &batch, out, 8, lse) != PA_OK) {
    fprintf(stderr, "call failed: %s\n", pa_last_error());
    return 1;
  }
  /* A zero query weighs the four tokens equally: the mean of 0, 1, 2, 3. */
  int ok = 1;
  for (int i = 0; i < 8; i++) ok &= out[i] > 1.4999f && out[i] < 1.5001f;
  ok &= lse[0] > 1.3862f && lse[0] < 1.3863f; /* log 4 */
  printf("%s: %s, isa %s\n", pa_backend_name(), ok ? "ok" : "WRONG", pa_context_isa(ctx));
  pa_layer_destroy(layer);
  pa_context_destroy(ctx);
  return ok ? 0 : 1;
}
