/* Layer creation: every parameter checked once, so calls need not. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { PA_MAX_HEADS = 1 << 16 };

static const char *const pa_layer_caller = "pa_layer_create";

static pa_status check_per_head(const float *values, int num_heads, const char *name) {
  if (!values) return PA_OK;
  for (int h = 0; h < num_heads; h++) {
    if (!isfinite(values[h])) {
      return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: config->%s[%d] = %g is not finite",
                     pa_layer_caller, name, h, (double)values[h]);
    }
  }
  return PA_OK;
}

pa_status pa_check_activation_dtype(pa_dtype dtype, const char *caller, const char *name) {
  if (!pa_dtype_valid(dtype)) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: %s = %d is not a pa_dtype", caller, name,
                   (int)dtype);
  }
  if (!pa_dtype_is_activation(dtype)) {
    return pa_fail(PA_ERR_UNSUPPORTED,
                   "%s: %s = %s is not an activation dtype (expected f32, f16 or bf16)", caller,
                   name, pa_dtype_name(dtype));
  }
  return PA_OK;
}

static pa_status check_config(const pa_layer_config *c) {
  const char *caller = pa_layer_caller;
  if (c->num_heads < 1 || c->num_heads > PA_MAX_HEADS) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: config->num_heads = %d is outside [1, %d]", caller,
                   c->num_heads, PA_MAX_HEADS);
  }
  if (c->num_kv_heads < 0 || c->num_kv_heads > c->num_heads) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: config->num_kv_heads = %d is outside [0, num_heads = %d]", caller,
                   c->num_kv_heads, c->num_heads);
  }
  if (c->num_kv_heads > 0 && c->num_heads % c->num_kv_heads != 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: config->num_kv_heads = %d does not divide num_heads = %d", caller,
                   c->num_kv_heads, c->num_heads);
  }
  if (c->head_size < PA_MIN_HEAD_SIZE || c->head_size > PA_MAX_HEAD_SIZE) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: config->head_size = %d is outside [%d, %d]",
                   caller, c->head_size, PA_MIN_HEAD_SIZE, PA_MAX_HEAD_SIZE);
  }
  if (!isfinite(c->scale) || c->scale < 0.0f) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: config->scale = %g must be finite and >= 0 (0: 1/sqrt(head_size))", caller,
                   (double)c->scale);
  }
  if (c->sliding_window < 0) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: config->sliding_window = %d is negative", caller,
                   c->sliding_window);
  }
  if (!isfinite(c->logits_soft_cap) || c->logits_soft_cap < 0.0f) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT,
                   "%s: config->logits_soft_cap = %g must be finite and >= 0", caller,
                   (double)c->logits_soft_cap);
  }
  if ((int)c->attn_type < PA_ATTN_DECODER || (int)c->attn_type > PA_ATTN_ENCODER_DECODER) {
    return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: config->attn_type = %d is not a pa_attn_type",
                   caller, (int)c->attn_type);
  }
  pa_status status = pa_check_activation_dtype(c->dtype, caller, "config->dtype");
  if (status != PA_OK) return status;
  status = check_per_head(c->alibi_slopes, c->num_heads, "alibi_slopes");
  if (status != PA_OK) return status;
  return check_per_head(c->sinks, c->num_heads, "sinks");
}

static float *copy_per_head(const float *values, int num_heads, int *failed) {
  if (!values) return NULL;
  float *copy = malloc((size_t)num_heads * sizeof *copy);
  if (!copy) {
    *failed = 1;
    return NULL;
  }
  memcpy(copy, values, (size_t)num_heads * sizeof *copy);
  return copy;
}

pa_status pa_layer_create(const pa_layer_config *config, pa_layer **out) {
  if (!out) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: layer is NULL", pa_layer_caller);
  if (!config) return pa_fail(PA_ERR_INVALID_ARGUMENT, "%s: config is NULL", pa_layer_caller);
  pa_status status = check_config(config);
  if (status != PA_OK) return status;

  pa_layer *layer = calloc(1, sizeof *layer);
  if (!layer) return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: out of memory", pa_layer_caller);
  layer->num_heads = config->num_heads;
  layer->num_kv_heads = config->num_kv_heads ? config->num_kv_heads : config->num_heads;
  layer->head_size = config->head_size;
  layer->group = layer->num_heads / layer->num_kv_heads;
  layer->scale = config->scale > 0.0f ? config->scale : 1.0f / sqrtf((float)config->head_size);
  layer->soft_cap = config->logits_soft_cap;
  layer->window = config->sliding_window;
  layer->type = config->attn_type;
  layer->dtype = config->dtype;
  int failed = 0;
  layer->alibi = copy_per_head(config->alibi_slopes, config->num_heads, &failed);
  layer->sinks = copy_per_head(config->sinks, config->num_heads, &failed);
  if (failed) {
    pa_layer_destroy(layer);
    return pa_fail(PA_ERR_OUT_OF_MEMORY, "%s: out of memory", pa_layer_caller);
  }
  *out = layer;
  return PA_OK;
}

void pa_layer_destroy(pa_layer *layer) {
  if (!layer) return;
  free(layer->alibi);
  free(layer->sinks);
  free(layer);
}
