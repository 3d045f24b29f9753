/* Attention calls: paged_attention, varlen_attention, merge_states and the
 * backend's fused forward (write the new K/V, then attend, in one call). */
#include "ext.h"

#include <limits.h>
#include <time.h>

/* Releases every tensor of a call on the way out. */
typedef struct tensors {
  pyx_tensor t[8];
  int count;
} tensors;

static pyx_tensor *take(tensors *all, PyObject *obj, const char *name, int writable) {
  pyx_tensor *t = &all->t[all->count];
  if (pyx_tensor_get(obj, name, writable, t) < 0) return NULL;
  all->count++;
  return t;
}

static void release(tensors *all) {
  for (int i = 0; i < all->count; i++) pyx_tensor_release(&all->t[i]);
}

/* Where a paged call's row count comes from, as its error message names it. */
#define QSL "query_start_loc[-1] = "

/* Query (or output) rows: the layer's width, at least `need` rows, named by `bound` in the
 * message (QSL; NULL for a varlen call, whose offsets are cu_seqlens_q or, from the impl,
 * the metadata's query_start_loc). */
static int activation_rows(const pyx_tensor *t, const char *name, const pa_layer_config *c,
                           int64_t need, const char *bound, int64_t *stride) {
  int64_t rows;
  if (pyx_tensor_activation(t, name) < 0 ||
      pyx_tensor_rows(t, name, "num_heads * head_size", (int64_t)c->num_heads * c->head_size,
                      c->head_size, &rows, stride) < 0) {
    return -1;
  }
  if (need > rows) {
    pyx_invalid("%s has %lld rows; the batch has %s%lld query rows", name, (long long)rows,
                bound ? bound : "", (long long)need);
    return -1;
  }
  return 0;
}

/* out: writable rows of query's dtype. */
static int output_rows(const pyx_tensor *out, const pyx_tensor *query, const pa_layer_config *c,
                       int64_t need, const char *bound, int64_t *stride) {
  if (out->elem != query->elem) {
    pyx_invalid("out has dtype %s; query has %s", pyx_dtype_of(out), pyx_dtype_of(query));
    return -1;
  }
  return activation_rows(out, "out", c, need, bound, stride);
}

/* lse: float32 [rows, num_heads] with dense rows; rows >= need (== need if exact). */
static int lse_check(const pyx_tensor *t, const char *name, int heads, int64_t need, int exact,
                     float **lse) {
  char shape[160];
  if (t->elem != PYX_F32) {
    pyx_invalid("%s has dtype %s; it must be float32", name, pyx_dtype_of(t));
  } else if (t->ndim != 2 || t->shape[1] != heads || t->shape[0] < need ||
             (exact && t->shape[0] != need)) {
    pyx_invalid("%s has shape %s; it must be [%lld, num_heads = %d]", name,
                pyx_shape_string(t, shape, sizeof shape), (long long)need, heads);
  } else if ((heads > 1 && t->strides[1] != 1) || (t->shape[0] > 1 && t->strides[0] != heads)) {
    pyx_invalid("%s has strides [%lld, %lld]; it must be dense ([%d, 1])", name,
                (long long)t->strides[0], (long long)t->strides[1], heads);
  } else {
    *lse = (float *)t->data;
    return 0;
  }
  return -1;
}

/* lse: None (*lse NULL) or as lse_check wants. */
static int lse_arg(tensors *all, PyObject *obj, const char *name, int heads, int64_t need,
                   int exact, float **lse) {
  *lse = NULL;
  if (obj == Py_None) return 0;
  pyx_tensor *t = take(all, obj, name, 1);
  return t ? lse_check(t, name, heads, need, exact, lse) : -1;
}

/* paged_attention(ctx, layer, plan, query, cache, batch, out, lse) -> rows written */
PyObject *pyx_paged_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("paged_attention", nargs, 8) < 0) return NULL;
  int plan_ok;
  pyx_context *context = pyx_context_arg(args[0]);
  pyx_layer *layer = context ? pyx_layer_arg(args[1]) : NULL;
  pyx_plan *plan = layer ? pyx_plan_arg(args[2], &plan_ok) : NULL;
  if (!layer || !plan_ok) return NULL;
  pyx_cache *cache = pyx_cache_arg(args[4]);
  pyx_batch *batch = cache ? pyx_batch_arg(args[5]) : NULL;
  if (!batch || pyx_batch_check_columns(batch, cache->cache.block_size) < 0) return NULL;
  tensors all = {.count = 0};
  PyObject *result = NULL;
  const pa_layer_config *c = &layer->config;
  int64_t rows = batch->num_rows, query_stride, out_stride;
  float *lse;
  pyx_tensor *query = take(&all, args[3], "query", 0);
  pyx_tensor *out = query ? take(&all, args[6], "out", 1) : NULL;
  if (out && activation_rows(query, "query", c, rows, QSL, &query_stride) == 0 &&
      output_rows(out, query, c, rows, QSL, &out_stride) == 0 &&
      lse_arg(&all, args[7], "lse", c->num_heads, rows, 0, &lse) == 0) {
    const pa_layer *l = pyx_layer_for(layer, (pa_dtype)query->elem);
    if (l) {
      pa_status status;
      char message[PYX_MESSAGE_SIZE];
      PYX_CALL(context,
               status = pa_paged_attention(context->ctx, l, plan ? plan->plan : NULL, query->data,
                                           query_stride, &cache->cache, &batch->batch, out->data,
                                           out_stride, lse),
               message);
      result = status == PA_OK ? PyLong_FromLongLong(rows) : pyx_raise_status(status, message);
    }
  }
  release(&all);
  return result;
}

/* cu_seqlens_q and cu_seqlens_k: int32 [num_seqs + 1] each. */
static int cu_seqlens(tensors *all, PyObject *q_obj, PyObject *k_obj, const int32_t **q,
                      const int32_t **k, int *num_seqs) {
  pyx_tensor *tq = take(all, q_obj, "cu_seqlens_q", 0);
  if (!tq || pyx_tensor_vector(tq, "cu_seqlens_q", PYX_I32) < 0) return -1;
  pyx_tensor *tk = take(all, k_obj, "cu_seqlens_k", 0);
  if (!tk || pyx_tensor_vector(tk, "cu_seqlens_k", PYX_I32) < 0) return -1;
  if (tq->shape[0] < 1 || tq->shape[0] - 1 > INT_MAX) {
    pyx_invalid("cu_seqlens_q has %lld entries; it needs num_seqs + 1 >= 1",
                (long long)tq->shape[0]);
    return -1;
  }
  if (tk->shape[0] != tq->shape[0]) {
    pyx_invalid("cu_seqlens_k has %lld entries; cu_seqlens_q has %lld", (long long)tk->shape[0],
                (long long)tq->shape[0]);
    return -1;
  }
  *q = (const int32_t *)tq->data;
  *k = (const int32_t *)tk->data;
  *num_seqs = (int)(tq->shape[0] - 1);
  return 0;
}

/* varlen_attention(ctx, layer, query, key, value, cu_seqlens_q, cu_seqlens_k, out, lse)
 * -> rows written */
PyObject *pyx_varlen_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("varlen_attention", nargs, 9) < 0) return NULL;
  pyx_context *context = pyx_context_arg(args[0]);
  pyx_layer *layer = context ? pyx_layer_arg(args[1]) : NULL;
  if (!layer) return NULL;
  tensors all = {.count = 0};
  PyObject *result = NULL;
  const pa_layer_config *c = &layer->config;
  const int32_t *cu_q, *cu_k;
  int num_seqs;
  int64_t query_stride, out_stride, key_stride, value_stride, key_rows, value_rows;
  int64_t kv_width = (int64_t)(c->num_kv_heads ? c->num_kv_heads : c->num_heads) * c->head_size;
  float *lse;
  if (cu_seqlens(&all, args[5], args[6], &cu_q, &cu_k, &num_seqs) < 0) goto done;
  int64_t rows = cu_q[num_seqs], keys = cu_k[num_seqs];
  pyx_tensor *query = take(&all, args[2], "query", 0);
  pyx_tensor *key = query ? take(&all, args[3], "key", 0) : NULL;
  pyx_tensor *value = key ? take(&all, args[4], "value", 0) : NULL;
  pyx_tensor *out = value ? take(&all, args[7], "out", 1) : NULL;
  if (!out || activation_rows(query, "query", c, rows, NULL, &query_stride) < 0 ||
      output_rows(out, query, c, rows, NULL, &out_stride) < 0 ||
      pyx_tensor_rows(key, "key", "num_kv_heads * head_size", kv_width, c->head_size, &key_rows,
                      &key_stride) < 0 ||
      pyx_tensor_rows(value, "value", "num_kv_heads * head_size", kv_width, c->head_size,
                      &value_rows, &value_stride) < 0 ||
      lse_arg(&all, args[8], "lse", c->num_heads, rows, 0, &lse) < 0) {
    goto done;
  }
  if (key->elem != query->elem || value->elem != query->elem) {
    pyx_invalid("%s has dtype %s; query has %s", key->elem != query->elem ? "key" : "value",
                pyx_dtype_of(key->elem != query->elem ? key : value), pyx_dtype_of(query));
    goto done;
  }
  if (keys > key_rows || keys > value_rows) {
    pyx_invalid("%s has %lld rows; cu_seqlens_k[-1] = %lld", keys > key_rows ? "key" : "value",
                (long long)(keys > key_rows ? key_rows : value_rows), (long long)keys);
    goto done;
  }
  const pa_layer *l = pyx_layer_for(layer, (pa_dtype)query->elem);
  if (!l) goto done;
  pa_status status;
  char message[PYX_MESSAGE_SIZE];
  PYX_CALL(context,
           status = pa_varlen_attention(context->ctx, l, query->data, query_stride, key->data,
                                        key_stride, value->data, value_stride, num_seqs, cu_q, cu_k,
                                        out->data, out_stride, lse),
           message);
  result = status == PA_OK ? PyLong_FromLongLong(rows) : pyx_raise_status(status, message);
done:
  release(&all);
  return result;
}

/* merge_states(ctx, num_heads, head_size, out_a, lse_a, out_b, lse_b, out, lse) */
PyObject *pyx_merge_states(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("merge_states", nargs, 9) < 0) return NULL;
  pyx_context *context = pyx_context_arg(args[0]);
  if (!context) return NULL;
  long heads = PyLong_AsLong(args[1]), head_size = PyLong_AsLong(args[2]);
  if (PyErr_Occurred()) return NULL;
  if (heads < 1 || heads > INT_MAX || head_size < 1 || head_size > INT_MAX) {
    return pyx_invalid("num_heads = %ld and head_size = %ld must be positive", heads, head_size);
  }
  tensors all = {.count = 0};
  PyObject *result = NULL;
  int64_t width = (int64_t)heads * head_size, rows = 0, a_stride = 0, b_stride = 0, out_stride = 0;
  int64_t n = 0;
  float *lse_a, *lse_b, *lse;
  pyx_tensor *sides[3], *lse_a_t;
  /* out_a's rows are the batch's: every other tensor is held to them. */
  const char *names[3] = {"out_a", "out_b", "out"};
  PyObject *objs[3] = {args[3], args[5], args[7]};
  int64_t *strides[3] = {&a_stride, &b_stride, &out_stride};
  for (int i = 0; i < 3; i++) {
    if (!(sides[i] = take(&all, objs[i], names[i], i == 2)) ||
        pyx_tensor_activation(sides[i], names[i]) < 0 ||
        pyx_tensor_rows(sides[i], names[i], "num_heads * head_size", width, head_size, &n,
                        strides[i]) < 0) {
      goto done;
    }
    if (i == 0) rows = n;
    if (sides[i]->elem != sides[0]->elem) {
      pyx_invalid("%s has dtype %s; out_a has %s", names[i], pyx_dtype_of(sides[i]),
                  pyx_dtype_of(sides[0]));
      goto done;
    }
    if (n != rows) {
      pyx_invalid("%s has %lld rows; out_a has %lld", names[i], (long long)n, (long long)rows);
      goto done;
    }
  }
  lse_a_t = take(&all, args[4], "lse_a", 0);
  if (!lse_a_t || lse_check(lse_a_t, "lse_a", (int)heads, rows, 1, &lse_a) < 0 ||
      lse_arg(&all, args[6], "lse_b", (int)heads, rows, 1, &lse_b) < 0 ||
      lse_arg(&all, args[8], "lse", (int)heads, rows, 1, &lse) < 0) {
    goto done;
  }
  pa_status status;
  char message[PYX_MESSAGE_SIZE];
  PYX_CALL(
      context,
      status = pa_merge_states(context->ctx, rows, (int)heads, (int)head_size,
                               (pa_dtype)sides[0]->elem, sides[0]->data, a_stride, lse_a,
                               sides[1]->data, b_stride, lse_b, sides[2]->data, out_stride, lse),
      message);
  result = status == PA_OK ? Py_NewRef(Py_None) : pyx_raise_status(status, message);
done:
  release(&all);
  return result;
}

typedef struct forward_call {
  pa_context *ctx;
  const pa_layer *layer;
  const pa_plan *plan;
  const pa_kv_cache *cache;
  const pa_batch *batch;
  const void *query, *key, *value;
  void *out;
  int64_t query_stride, key_stride, value_stride, out_stride, num_tokens;
  pa_dtype src_dtype;
  const int64_t *slot_mapping; /* NULL: nothing to write */
} forward_call;

/* Checks the attention first, so that a batch it would refuse leaves the
 * cache as it was; pa_write_kv checks its own arguments before writing. */
static pa_status forward_run(const forward_call *c) {
  pa_status status =
      pa_validate_paged_attention(c->ctx, c->layer, c->plan, c->query, c->query_stride, c->cache,
                                  c->batch, c->out, c->out_stride);
  if (status == PA_OK && c->slot_mapping) {
    status = pa_write_kv(c->ctx, c->cache, c->key, c->key_stride, c->value, c->value_stride,
                         c->src_dtype, c->num_tokens, c->slot_mapping);
  }
  if (status != PA_OK) return status;
  return pa_paged_attention(c->ctx, c->layer, c->plan, c->query, c->query_stride, c->cache,
                            c->batch, c->out, c->out_stride, NULL);
}

/* For the benchmark: `calls` runs back to back, *seconds their time. Without K/V to write,
 * pa_paged_attention alone (the library call the Python layer wraps). */
static pa_status forward_timed(const forward_call *c, long calls, double *seconds) {
  struct timespec start, end;
  pa_status status = PA_OK;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (long i = 0; i < calls && status == PA_OK; i++) {
    status = c->slot_mapping
                 ? forward_run(c)
                 : pa_paged_attention(c->ctx, c->layer, c->plan, c->query, c->query_stride,
                                      c->cache, c->batch, c->out, c->out_stride, NULL);
  }
  clock_gettime(CLOCK_MONOTONIC, &end);
  *seconds = (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
  return status;
}

/* The arguments of forward and time_forward: (ctx, layer, plan, query, key, value, cache,
 * batch, out). calls 0: run once and return the rows; calls > 0: time. */
static PyObject *forward_args(PyObject *const *args, long calls) {
  int plan_ok;
  pyx_context *context = pyx_context_arg(args[0]);
  pyx_layer *layer = context ? pyx_layer_arg(args[1]) : NULL;
  pyx_plan *plan = layer ? pyx_plan_arg(args[2], &plan_ok) : NULL;
  if (!layer || !plan_ok) return NULL;
  pyx_cache *cache = pyx_cache_arg(args[6]);
  pyx_batch *batch = cache ? pyx_batch_arg(args[7]) : NULL;
  if (!batch || pyx_batch_check_columns(batch, cache->cache.block_size) < 0) return NULL;
  int write = args[4] != Py_None || args[5] != Py_None;
  tensors all = {.count = 0};
  PyObject *result = NULL;
  const pa_layer_config *c = &layer->config;
  int64_t rows = batch->num_rows, query_stride, out_stride, key_stride = 0, value_stride = 0;
  pyx_tensor *query = take(&all, args[3], "query", 0);
  pyx_tensor *out = query ? take(&all, args[8], "out", 1) : NULL;
  if (!out || activation_rows(query, "query", c, rows, QSL, &query_stride) < 0 ||
      output_rows(out, query, c, rows, QSL, &out_stride) < 0) {
    goto done;
  }
  pyx_tensor *key = NULL, *value = NULL;
  if (write) {
    if (args[4] == Py_None || args[5] == Py_None) {
      pyx_invalid("%s is None but %s is not: give both or neither",
                  args[4] == Py_None ? "key" : "value", args[4] == Py_None ? "value" : "key");
      goto done;
    }
    if (!batch->tensors[3]) {
      pyx_invalid(
          "key and value are given but the batch has no slot_mapping to write them "
          "through");
      goto done;
    }
    /* A decoder's new tokens are its query rows: each needs its slot, or the attention
     * reads keys that were never written. (Cross-attention writes the encoder's tokens.) */
    if (c->attn_type == PA_ATTN_DECODER && batch->num_slots < rows) {
      pyx_invalid("slot_mapping has %lld entries; the batch has %lld new tokens, one slot each",
                  (long long)batch->num_slots, (long long)rows);
      goto done;
    }
    if (!(key = take(&all, args[4], "key", 0)) || !(value = take(&all, args[5], "value", 0)) ||
        pyx_kv_rows(key, value, &cache->cache, batch->num_slots, &key_stride, &value_stride) < 0) {
      goto done;
    }
  }
  forward_call call = {
      .ctx = context->ctx,
      .layer = pyx_layer_for(layer, (pa_dtype)query->elem),
      .plan = plan ? plan->plan : NULL,
      .cache = &cache->cache,
      .batch = &batch->batch,
      .query = query->data,
      .query_stride = query_stride,
      .out = out->data,
      .out_stride = out_stride,
  };
  if (!call.layer) goto done;
  if (write) {
    call.key = key->data;
    call.value = value->data;
    call.key_stride = key_stride;
    call.value_stride = value_stride;
    call.src_dtype = (pa_dtype)key->elem;
    call.num_tokens = batch->num_slots;
    call.slot_mapping = batch->slot_mapping;
  }
  pa_status status;
  char message[PYX_MESSAGE_SIZE];
  double seconds = 0;
  if (calls > 0) {
    PYX_CALL(context, status = forward_timed(&call, calls, &seconds), message);
  } else {
    PYX_CALL(context, status = forward_run(&call), message);
  }
  if (status != PA_OK) {
    pyx_raise_status(status, message);
  } else {
    result = calls > 0 ? PyFloat_FromDouble(seconds) : PyLong_FromLongLong(rows);
  }
done:
  release(&all);
  return result;
}

/* forward(ctx, layer, plan, query, key, value, cache, batch, out) -> rows:
 * writes key/value (unless None) through the batch's slot_mapping, then attends over the
 * cache; every argument of both steps is checked before either writes. */
PyObject *pyx_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("forward", nargs, 9) < 0) return NULL;
  return forward_args(args, 0);
}

/* time_forward(ctx, layer, plan, query, key, value, cache, batch, out, calls) -> seconds
 * for `calls` library calls (forward's, or pa_paged_attention's alone when key and value are
 * None), arguments converted once: for bench/python_overhead.py. */
PyObject *pyx_time_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("time_forward", nargs, 10) < 0) return NULL;
  long calls = PyLong_AsLong(args[9]);
  if (calls == -1 && PyErr_Occurred()) return NULL;
  if (calls < 1) return pyx_invalid("calls = %ld must be >= 1", calls);
  return forward_args(args, calls);
}
