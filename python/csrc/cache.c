/* pagedattn._ext.KVCache (a pa_kv_cache over caller-owned tensors) and the
 * cache operations: write_kv, copy_blocks, swap_blocks. */
#include "ext.h"

#include <limits.h>
#include <stdlib.h>

static const char *const cache_dtypes_expected =
    "a cache holds float32, float16, bfloat16, float8_e4m3fn, float8_e5m2 or uint8 (FP8 bytes)";

/* The cache dtype from the tensor's and the caller's kv_cache_dtype
 * (-1: the tensor's own; PA_FP8_*: those bytes). */
static int resolve_dtype(const pyx_tensor *t, const char *name, int requested, pa_dtype *out) {
  pyx_elem e = t->elem;
  if (requested != -1 && requested != PA_FP8_E4M3 && requested != PA_FP8_E5M2) {
    pyx_invalid("kv_cache_dtype code %d is not -1, fp8_e4m3 or fp8_e5m2", requested);
    return -1;
  }
  if (e == PYX_F32 || e == PYX_F16 || e == PYX_BF16) {
    if (requested != -1) {
      pyx_invalid("kv_cache_dtype '%s' needs a cache of float8 or uint8 bytes; %s is %s",
                  pa_dtype_name((pa_dtype)requested), name, pyx_elem_name(e));
      return -1;
    }
    *out = (pa_dtype)e;
    return 0;
  }
  if (e == PYX_FP8_E4M3 || e == PYX_FP8_E5M2) {
    if (requested != -1 && requested != (int)e) {
      pyx_invalid("kv_cache_dtype '%s' does not match %s, which is %s",
                  pa_dtype_name((pa_dtype)requested), name, pyx_elem_name(e));
      return -1;
    }
    *out = (pa_dtype)e;
    return 0;
  }
  if (e == PYX_U8) {
    if (requested == -1) {
      pyx_invalid(
          "%s holds uint8: say which FP8 format its bytes are with kv_cache_dtype "
          "'fp8_e4m3' or 'fp8_e5m2'",
          name);
      return -1;
    }
    *out = (pa_dtype)requested;
    return 0;
  }
  pyx_invalid("%s has dtype %s; %s", name, pyx_dtype_of(t), cache_dtypes_expected);
  return -1;
}

static int fits_int(int64_t value, const char *name, const char *what) {
  if (value <= INT_MAX) return 0;
  pyx_invalid("%s's %s = %lld exceeds the library's int range", name, what, (long long)value);
  return -1;
}

/* A [num_blocks, num_kv_heads, block_size, head_size] view with dense tiles. */
static int tile_view(const pyx_tensor *t, const char *name, pa_kv_cache *c) {
  char shape[160];
  if (t->ndim != 4) {
    pyx_invalid("%s has shape %s; it must be [num_blocks, num_kv_heads, block_size, head_size]",
                name, pyx_shape_string(t, shape, sizeof shape));
    return -1;
  }
  if ((t->shape[3] > 1 && t->strides[3] != 1) ||
      (t->shape[2] > 1 && t->strides[2] != t->shape[3])) {
    pyx_invalid(
        "%s (shape %s, strides [%lld, %lld, %lld, %lld]) does not hold each "
        "[block_size, head_size] tile dense",
        name, pyx_shape_string(t, shape, sizeof shape), (long long)t->strides[0],
        (long long)t->strides[1], (long long)t->strides[2], (long long)t->strides[3]);
    return -1;
  }
  /* The library reads a stride of 0 as "dense": a real one (blocks or heads on top of each
   * other, as an expanded view makes) must not reach it. */
  for (int d = 0; d < 2; d++) {
    if (t->shape[d] > 1 && t->strides[d] == 0) {
      pyx_invalid("%s has stride 0 in dimension %d: its %s overlap", name, d,
                  d ? "KV heads" : "blocks");
      return -1;
    }
  }
  if (fits_int(t->shape[1], name, "num_kv_heads") || fits_int(t->shape[2], name, "block_size") ||
      fits_int(t->shape[3], name, "head_size")) {
    return -1;
  }
  c->num_blocks = t->shape[0];
  c->num_kv_heads = (int)t->shape[1];
  c->block_size = (int)t->shape[2];
  c->head_size = (int)t->shape[3];
  /* A stride over a dimension of one is never stepped: the dense one serves. */
  c->head_stride = t->shape[1] > 1 ? t->strides[1] : 0;
  c->block_stride = t->shape[0] > 1
                        ? t->strides[0]
                        : (int64_t)c->num_kv_heads *
                              (c->head_stride ? c->head_stride : t->shape[2] * t->shape[3]);
  return 0;
}

int pyx_layout_arg(PyObject *obj, pa_kv_layout *layout) {
  *layout = PA_KV_ROWS;
  if (!obj || obj == Py_None) return 0;
  if (!PyUnicode_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "layout must be 'rows' or 'tiled', not %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (PyUnicode_CompareWithASCIIString(obj, "rows") == 0) return 0;
  if (PyUnicode_CompareWithASCIIString(obj, "tiled") == 0) {
    *layout = PA_KV_TILED;
    return 0;
  }
  pyx_invalid("layout = %R is not 'rows' or 'tiled'", obj);
  return -1;
}

const char *pyx_layout_name(pa_kv_layout layout) {
  return layout == PA_KV_TILED ? "tiled" : "rows";
}

static int same_layout(const pyx_tensor *a, const pyx_tensor *b) {
  if (a->elem != b->elem || a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++) {
    if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->strides[d] != b->strides[d])) return 0;
  }
  return 1;
}

static PyObject *cache_new(PyTypeObject *type, PyObject *key, PyObject *value,
                           const pa_kv_cache *c) {
  pyx_cache *self = (pyx_cache *)type->tp_alloc(type, 0);
  if (!self) return NULL;
  self->cache = *c;
  Py_INCREF(key);
  Py_INCREF(value);
  self->key = key;
  self->value = value;
  return (PyObject *)self;
}

static int scales_arg(PyObject *k_scale, PyObject *v_scale, pa_kv_cache *c) {
  double k = PyFloat_AsDouble(k_scale);
  if (k == -1.0 && PyErr_Occurred()) return -1;
  double v = PyFloat_AsDouble(v_scale);
  if (v == -1.0 && PyErr_Occurred()) return -1;
  c->k_scale = (float)k;
  c->v_scale = (float)v;
  return 0;
}

/* KVCache(key_cache, value_cache, kv_cache_dtype, k_scale, v_scale, layout="rows") */
static PyObject *cache_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"key_cache", "value_cache", "kv_cache_dtype", "k_scale", "v_scale",
                             "layout",    NULL};
  PyObject *key, *value, *k_scale, *v_scale, *layout = NULL;
  int requested;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOiOO|O:KVCache", keywords, &key, &value,
                                   &requested, &k_scale, &v_scale, &layout)) {
    return NULL;
  }
  pa_kv_cache c = {0};
  if (pyx_layout_arg(layout, &c.layout) < 0) return NULL;
  pyx_tensor k, v;
  if (pyx_tensor_get(key, "key_cache", 1, &k) < 0) return NULL;
  if (pyx_tensor_get(value, "value_cache", 1, &v) < 0) {
    pyx_tensor_release(&k);
    return NULL;
  }
  PyObject *result = NULL;
  if (!same_layout(&k, &v)) {
    char shape_k[160], shape_v[160];
    pyx_invalid(
        "value_cache (%s, shape %s) does not have key_cache's dtype, shape and strides "
        "(%s, shape %s)",
        pyx_dtype_of(&v), pyx_shape_string(&v, shape_v, sizeof shape_v), pyx_dtype_of(&k),
        pyx_shape_string(&k, shape_k, sizeof shape_k));
  } else if (resolve_dtype(&k, "key_cache", requested, &c.dtype) == 0 &&
             tile_view(&k, "key_cache", &c) == 0 && scales_arg(k_scale, v_scale, &c) == 0) {
    c.key = k.data;
    c.value = v.data;
    result = cache_new(type, key, value, &c);
  }
  pyx_tensor_release(&k);
  pyx_tensor_release(&v);
  return result;
}

/* KVCache.combined(kv_cache, num_kv_heads, head_size, kv_cache_dtype, k_scale, v_scale,
 * layout="rows"): the backend's [2, num_blocks, block_size * num_kv_heads * head_size]. */
static PyObject *cache_combined(PyObject *cls, PyObject *args) {
  PyObject *kv, *k_scale, *v_scale, *layout = NULL;
  int kv_heads, head_size, requested;
  if (!PyArg_ParseTuple(args, "OiiiOO|O:combined", &kv, &kv_heads, &head_size, &requested, &k_scale,
                        &v_scale, &layout)) {
    return NULL;
  }
  pa_kv_cache c = {0};
  if (pyx_layout_arg(layout, &c.layout) < 0) return NULL;
  pyx_tensor t;
  if (pyx_tensor_get(kv, "kv_cache", 1, &t) < 0) return NULL;
  PyObject *result = NULL;
  char shape[160];
  int64_t per_token = (int64_t)kv_heads * head_size;
  if (t.ndim != 3 || t.shape[0] != 2) {
    pyx_invalid(
        "kv_cache has shape %s; it must be [2, num_blocks, block_size * num_kv_heads * "
        "head_size]",
        pyx_shape_string(&t, shape, sizeof shape));
  } else if (t.shape[2] > 1 && t.strides[2] != 1) {
    pyx_invalid("kv_cache has stride %lld in its last dimension; each block must be dense",
                (long long)t.strides[2]);
  } else if (t.strides[0] == 0 || (t.shape[1] > 1 && t.strides[1] == 0)) {
    pyx_invalid("kv_cache has strides [%lld, %lld, %lld]: its %s overlap", (long long)t.strides[0],
                (long long)t.strides[1], (long long)t.strides[2],
                t.strides[0] == 0 ? "keys and values" : "blocks");
  } else if (kv_heads < 1 || head_size < 1 || t.shape[2] % per_token != 0 || t.shape[2] == 0) {
    pyx_invalid(
        "kv_cache has shape %s: %lld elements per block, not a positive multiple of "
        "num_kv_heads * head_size = %d * %d",
        pyx_shape_string(&t, shape, sizeof shape), (long long)t.shape[2], kv_heads, head_size);
  } else if (fits_int(t.shape[2] / per_token, "kv_cache", "block_size") == 0 &&
             resolve_dtype(&t, "kv_cache", requested, &c.dtype) == 0 &&
             scales_arg(k_scale, v_scale, &c) == 0) {
    c.num_blocks = t.shape[1];
    c.block_size = (int)(t.shape[2] / per_token);
    c.num_kv_heads = kv_heads;
    c.head_size = head_size;
    c.block_stride = t.shape[1] > 1 ? t.strides[1] : 0;
    c.key = t.data;
    c.value = (char *)t.data + t.strides[0] * (int64_t)pyx_elem_size(t.elem);
    result = cache_new((PyTypeObject *)cls, kv, kv, &c);
  }
  pyx_tensor_release(&t);
  return result;
}

/* KVCache.pages(kv_cache, head_size, kv_cache_dtype, k_scale, v_scale, layout="rows"):
 * vLLM's CPU page, [num_blocks, num_kv_heads, block_size, 2 * head_size] with each (block,
 * head)'s [block_size, 2 * head_size] dense and read as its K tile then its V tile. */
static PyObject *cache_pages(PyObject *cls, PyObject *args) {
  PyObject *kv, *k_scale, *v_scale, *layout = NULL;
  int head_size, requested;
  if (!PyArg_ParseTuple(args, "OiiOO|O:pages", &kv, &head_size, &requested, &k_scale, &v_scale,
                        &layout)) {
    return NULL;
  }
  pa_kv_cache c = {0};
  if (pyx_layout_arg(layout, &c.layout) < 0) return NULL;
  pyx_tensor t;
  if (pyx_tensor_get(kv, "kv_cache", 1, &t) < 0) return NULL;
  PyObject *result = NULL;
  char shape[160];
  if (t.ndim != 4 || head_size < 1 || t.shape[3] != 2 * (int64_t)head_size) {
    pyx_invalid(
        "kv_cache has shape %s; it must be [num_blocks, num_kv_heads, block_size, "
        "2 * head_size] with head_size = %d",
        pyx_shape_string(&t, shape, sizeof shape), head_size);
  } else if (t.strides[3] != 1 || (t.shape[2] > 1 && t.strides[2] != t.shape[3])) {
    pyx_invalid(
        "kv_cache (shape %s) has strides [%lld, %lld, %lld, %lld]: each page's "
        "[block_size, 2 * head_size] must be dense",
        pyx_shape_string(&t, shape, sizeof shape), (long long)t.strides[0], (long long)t.strides[1],
        (long long)t.strides[2], (long long)t.strides[3]);
  } else if ((t.shape[0] > 1 && t.strides[0] == 0) || (t.shape[1] > 1 && t.strides[1] == 0)) {
    pyx_invalid("kv_cache has stride 0 in dimension %d: its %s overlap",
                t.shape[0] > 1 && t.strides[0] == 0 ? 0 : 1,
                t.shape[0] > 1 && t.strides[0] == 0 ? "blocks" : "KV heads");
  } else if (fits_int(t.shape[1], "kv_cache", "num_kv_heads") == 0 &&
             fits_int(t.shape[2], "kv_cache", "block_size") == 0 &&
             resolve_dtype(&t, "kv_cache", requested, &c.dtype) == 0 &&
             scales_arg(k_scale, v_scale, &c) == 0) {
    int64_t tile = t.shape[2] * head_size, page = 2 * tile;
    c.num_blocks = t.shape[0];
    c.num_kv_heads = (int)t.shape[1];
    c.block_size = (int)t.shape[2];
    c.head_size = head_size;
    c.head_stride = t.shape[1] > 1 ? t.strides[1] : page;
    c.block_stride = t.shape[0] > 1 ? t.strides[0] : c.num_kv_heads * c.head_stride;
    c.key = t.data;
    c.value = (char *)t.data + tile * (int64_t)pyx_elem_size(t.elem);
    result = cache_new((PyTypeObject *)cls, kv, kv, &c);
  }
  pyx_tensor_release(&t);
  return result;
}

static void cache_dealloc(PyObject *self) {
  pyx_cache *c = (pyx_cache *)self;
  Py_XDECREF(c->key);
  Py_XDECREF(c->value);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *cache_get(PyObject *self, void *closure) {
  const pa_kv_cache *c = &((pyx_cache *)self)->cache;
  switch ((int)(intptr_t)closure) {
    case 0: return PyLong_FromLongLong(c->num_blocks);
    case 1: return PyLong_FromLong(c->block_size);
    case 2: return PyLong_FromLong(c->num_kv_heads);
    case 3: return PyLong_FromLong(c->head_size);
    case 4: return PyUnicode_FromString(pa_dtype_name(c->dtype));
    case 5: return PyLong_FromLongLong(c->block_stride);
    case 6: return PyLong_FromLongLong(c->head_stride);
    case 7: return PyFloat_FromDouble(c->k_scale);
    case 8: return PyFloat_FromDouble(c->v_scale);
    default: return PyUnicode_FromString(pyx_layout_name(c->layout));
  }
}

static PyGetSetDef cache_getset[] = {
    {"num_blocks", cache_get, NULL, NULL, (void *)0},
    {"block_size", cache_get, NULL, NULL, (void *)1},
    {"num_kv_heads", cache_get, NULL, NULL, (void *)2},
    {"head_size", cache_get, NULL, NULL, (void *)3},
    {"dtype", cache_get, NULL, "The library's dtype name ('bf16', 'fp8_e4m3', ...).", (void *)4},
    {"block_stride", cache_get, NULL, "Elements from one block to the next; 0: dense.", (void *)5},
    {"head_stride", cache_get, NULL, "Elements from one KV head to the next; 0: dense.", (void *)6},
    {"k_scale", cache_get, NULL, NULL, (void *)7},
    {"v_scale", cache_get, NULL, NULL, (void *)8},
    {"layout", cache_get, NULL,
     "The order inside each tile: 'rows' (PA_KV_ROWS) or 'tiled' (PA_KV_TILED).", (void *)9},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cache_methods[] = {
    {"combined", cache_combined, METH_VARARGS | METH_CLASS,
     "combined(kv_cache, num_kv_heads, head_size, kv_cache_dtype, k_scale, v_scale, "
     "layout='rows')\n\n"
     "The backend's cache tensor [2, num_blocks, block_size * num_kv_heads * head_size]."},
    {"pages", cache_pages, METH_VARARGS | METH_CLASS,
     "pages(kv_cache, head_size, kv_cache_dtype, k_scale, v_scale, layout='rows')\n\n"
     "vLLM's CPU cache of a layer, [num_blocks, num_kv_heads, block_size, 2 * head_size]:\n"
     "each (block, head) page holds its K tile, then its V tile."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject pyx_cache_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pagedattn._ext.KVCache",
    .tp_basicsize = sizeof(pyx_cache),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "KVCache(key_cache, value_cache, kv_cache_dtype, k_scale, v_scale, layout='rows')\n\n"
        "A pa_kv_cache over two [num_blocks, num_kv_heads, block_size, head_size] views\n"
        "(dense tiles, free block and head strides); kv_cache_dtype -1 takes the\n"
        "tensors' dtype, a pa_dtype FP8 value names the format of float8/uint8 bytes.\n"
        "layout: the order inside each tile, 'rows' (PA_KV_ROWS) or 'tiled' (PA_KV_TILED;\n"
        "the library checks at each call that the geometry allows it).",
    .tp_new = cache_tp_new,
    .tp_dealloc = cache_dealloc,
    .tp_getset = cache_getset,
    .tp_methods = cache_methods,
};

pyx_cache *pyx_cache_arg(PyObject *obj) {
  if (!PyObject_TypeCheck(obj, &pyx_cache_type)) {
    PyErr_Format(PyExc_TypeError, "expected a pagedattn._ext.KVCache, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
  }
  return (pyx_cache *)obj;
}

/* ---- operations ---------------------------------------------------------- */

int pyx_kv_rows(const pyx_tensor *key, const pyx_tensor *value, const pa_kv_cache *cache,
                int64_t tokens, int64_t *key_stride, int64_t *value_stride) {
  int64_t width = (int64_t)cache->num_kv_heads * cache->head_size, key_rows, value_rows;
  if (pyx_tensor_activation(key, "key") < 0 ||
      pyx_tensor_rows(key, "key", "num_kv_heads * head_size", width, cache->head_size, &key_rows,
                      key_stride) < 0 ||
      pyx_tensor_rows(value, "value", "num_kv_heads * head_size", width, cache->head_size,
                      &value_rows, value_stride) < 0) {
    return -1;
  }
  if (value->elem != key->elem) {
    pyx_invalid("value has dtype %s; key has %s", pyx_dtype_of(value), pyx_dtype_of(key));
    return -1;
  }
  if (key_rows < tokens || value_rows < tokens) {
    pyx_invalid("%s has %lld rows; slot_mapping has %lld entries",
                key_rows < tokens ? "key" : "value",
                (long long)(key_rows < tokens ? key_rows : value_rows), (long long)tokens);
    return -1;
  }
  return 0;
}

/* write_kv(ctx, cache, key, value, slot_mapping) */
PyObject *pyx_write_kv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("write_kv", nargs, 5) < 0) return NULL;
  pyx_context *context = pyx_context_arg(args[0]);
  pyx_cache *cache = context ? pyx_cache_arg(args[1]) : NULL;
  if (!cache) return NULL;
  pyx_tensor key, value, slots;
  if (pyx_tensor_get(args[2], "key", 0, &key) < 0) return NULL;
  if (pyx_tensor_get(args[3], "value", 0, &value) < 0) {
    pyx_tensor_release(&key);
    return NULL;
  }
  if (pyx_tensor_get(args[4], "slot_mapping", 0, &slots) < 0) {
    pyx_tensor_release(&key);
    pyx_tensor_release(&value);
    return NULL;
  }
  PyObject *result = NULL;
  int64_t key_stride, value_stride;
  if (pyx_tensor_vector(&slots, "slot_mapping", PYX_I64) == 0 &&
      pyx_kv_rows(&key, &value, &cache->cache, slots.shape[0], &key_stride, &value_stride) == 0) {
    pa_status status;
    char message[PYX_MESSAGE_SIZE];
    PYX_CALL(context,
             status = pa_write_kv(context->ctx, &cache->cache, key.data, key_stride, value.data,
                                  value_stride, (pa_dtype)key.elem, slots.shape[0],
                                  (const int64_t *)slots.data),
             message);
    result = status == PA_OK ? Py_NewRef(Py_None) : pyx_raise_status(status, message);
  }
  pyx_tensor_release(&key);
  pyx_tensor_release(&value);
  pyx_tensor_release(&slots);
  return result;
}

/* An int64 [n, 2] dense array of block pairs. */
static int pairs_arg(PyObject *obj, pyx_tensor *t) {
  char shape[160];
  if (pyx_tensor_get(obj, "block_mapping", 0, t) < 0) return -1;
  if (t->elem != PYX_I64) {
    pyx_invalid("block_mapping has dtype %s; it must be int64", pyx_dtype_of(t));
  } else if (t->ndim != 2 || t->shape[1] != 2) {
    pyx_invalid("block_mapping has shape %s; it must be [num_pairs, 2]",
                pyx_shape_string(t, shape, sizeof shape));
  } else if (t->shape[0] > 1 && (t->strides[0] != 2 || t->strides[1] != 1)) {
    pyx_invalid("block_mapping has strides [%lld, %lld]; it must be dense ([2, 1])",
                (long long)t->strides[0], (long long)t->strides[1]);
  } else if (t->shape[0] == 1 && t->strides[1] != 1) {
    pyx_invalid("block_mapping has stride %lld in dimension 1; it must be dense",
                (long long)t->strides[1]);
  } else {
    return 0;
  }
  pyx_tensor_release(t);
  return -1;
}

/* copy_blocks(ctx, caches (a sequence of KVCache), block_mapping) */
PyObject *pyx_copy_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("copy_blocks", nargs, 3) < 0) return NULL;
  pyx_context *context = pyx_context_arg(args[0]);
  if (!context) return NULL;
  PyObject *items = PySequence_Fast(args[1], "kv_caches must be a sequence of caches");
  if (!items) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  if (n > INT_MAX) {
    Py_DECREF(items);
    return pyx_invalid("kv_caches has %zd caches; at most %d", n, INT_MAX);
  }
  pa_kv_cache *caches = malloc((size_t)(n > 0 ? n : 1) * sizeof *caches);
  if (!caches) {
    Py_DECREF(items);
    return PyErr_NoMemory();
  }
  PyObject *result = NULL;
  Py_ssize_t i = 0;
  for (; i < n; i++) {
    pyx_cache *c = pyx_cache_arg(PySequence_Fast_GET_ITEM(items, i));
    if (!c) break;
    caches[i] = c->cache;
  }
  pyx_tensor pairs;
  if (i == n && pairs_arg(args[2], &pairs) == 0) {
    pa_status status;
    char message[PYX_MESSAGE_SIZE];
    PYX_CALL(context,
             status = pa_copy_blocks(context->ctx, caches, (int)n, (const int64_t *)pairs.data,
                                     pairs.shape[0]),
             message);
    result = status == PA_OK ? Py_NewRef(Py_None) : pyx_raise_status(status, message);
    pyx_tensor_release(&pairs);
  }
  free(caches);
  Py_DECREF(items);
  return result;
}

/* swap_blocks(ctx, src, dst, block_mapping) */
PyObject *pyx_swap_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (pyx_check_nargs("swap_blocks", nargs, 4) < 0) return NULL;
  pyx_context *context = pyx_context_arg(args[0]);
  pyx_cache *src = context ? pyx_cache_arg(args[1]) : NULL;
  pyx_cache *dst = src ? pyx_cache_arg(args[2]) : NULL;
  pyx_tensor pairs;
  if (!dst || pairs_arg(args[3], &pairs) < 0) return NULL;
  pa_status status;
  char message[PYX_MESSAGE_SIZE];
  PYX_CALL(context,
           status = pa_swap_blocks(context->ctx, &src->cache, &dst->cache,
                                   (const int64_t *)pairs.data, pairs.shape[0]),
           message);
  pyx_tensor_release(&pairs);
  return status == PA_OK ? Py_NewRef(Py_None) : pyx_raise_status(status, message);
}
