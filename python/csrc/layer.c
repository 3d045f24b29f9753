/* pagedattn._ext.Layer: one attention layer's fixed parameters, with its
 * pa_layer made per activation dtype on first use (the dtype of a layer's
 * activations is known only when its first tensors arrive). */
#include "ext.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* An int argument that must fit in C's int; the library judges its value. */
static int int_arg(PyObject *obj, const char *name, int *out) {
  if (!PyLong_Check(obj) || PyBool_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(obj)->tp_name);
    return -1;
  }
  long long value = PyLong_AsLongLong(obj);
  if (value == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    value = LLONG_MAX;
  }
  if (value < INT_MIN || value > INT_MAX) {
    pyx_invalid("%s = %S is outside the range of a C int", name, obj);
    return -1;
  }
  *out = (int)value;
  return 0;
}

static int float_arg(PyObject *obj, const char *name, float *out) {
  double value = PyFloat_AsDouble(obj);
  if (value == -1.0 && PyErr_Occurred()) {
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Format(PyExc_TypeError, "%s must be a float, not %.100s", name, Py_TYPE(obj)->tp_name);
    }
    return -1;
  }
  *out = (float)value;
  return 0;
}

/* None, a sequence of numbers or a float32 tensor of `count` entries into
 * a new array (*out NULL for None). */
static int per_head_arg(PyObject *obj, const char *name, int count, float **out) {
  *out = NULL;
  if (obj == Py_None) return 0;
  PyObject *items = PySequence_Fast(obj, "");
  if (!items) {
    PyErr_Format(PyExc_TypeError, "%s must be None or a sequence of floats, not %.100s", name,
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  if (count >= 1 && n != count) {
    pyx_invalid("%s has %zd entries; the layer has num_heads = %d", name, n, count);
    Py_DECREF(items);
    return -1;
  }
  float *values = malloc((size_t)(n > 0 ? n : 1) * sizeof *values);
  if (!values) {
    Py_DECREF(items);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(items, i));
    if (v == -1.0 && PyErr_Occurred()) {
      free(values);
      Py_DECREF(items);
      return -1;
    }
    values[i] = (float)v;
  }
  Py_DECREF(items);
  *out = values;
  return 0;
}

static int layer_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  pyx_layer *l = (pyx_layer *)self;
  static char *keywords[] = {
      "num_heads",      "num_kv_heads",    "head_size", "scale",     "alibi_slopes",
      "sliding_window", "logits_soft_cap", "sinks",     "attn_type", NULL};
  PyObject *heads, *kv_heads, *head_size, *scale, *alibi, *window, *cap, *sinks, *type;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOO:Layer", keywords, &heads, &kv_heads,
                                   &head_size, &scale, &alibi, &window, &cap, &sinks, &type)) {
    return -1;
  }
  if (l->layers[PA_F32]) {
    PyErr_SetString(PyExc_RuntimeError, "Layer is already initialised");
    return -1;
  }
  pa_layer_config config = {0};
  int attn_type;
  if (int_arg(heads, "num_heads", &config.num_heads) < 0 ||
      int_arg(kv_heads, "num_kv_heads", &config.num_kv_heads) < 0 ||
      int_arg(head_size, "head_size", &config.head_size) < 0 ||
      float_arg(scale, "scale", &config.scale) < 0 ||
      int_arg(window, "sliding_window", &config.sliding_window) < 0 ||
      float_arg(cap, "logits_soft_cap", &config.logits_soft_cap) < 0 ||
      int_arg(type, "attn_type", &attn_type) < 0) {
    return -1;
  }
  config.attn_type = (pa_attn_type)attn_type;
  if (per_head_arg(alibi, "alibi_slopes", config.num_heads, &l->alibi) < 0 ||
      per_head_arg(sinks, "sinks", config.num_heads, &l->sinks) < 0) {
    return -1;
  }
  /* The library reads num_heads entries: a bad num_heads is its to report. */
  config.alibi_slopes = config.num_heads >= 1 ? l->alibi : NULL;
  config.sinks = config.num_heads >= 1 ? l->sinks : NULL;
  config.dtype = PA_F32;
  l->config = config;
  /* Made now so that a bad configuration fails here, not at a first call. */
  return pyx_layer_for(l, PA_F32) ? 0 : -1;
}

const pa_layer *pyx_layer_for(pyx_layer *l, pa_dtype dtype) {
  if (l->layers[dtype]) return l->layers[dtype];
  pa_layer_config config = l->config;
  config.dtype = dtype;
  pa_status status = pa_layer_create(&config, &l->layers[dtype]);
  if (status != PA_OK) {
    char message[PYX_MESSAGE_SIZE];
    pyx_copy_error(message, sizeof message);
    pyx_raise_status(status, message);
    return NULL;
  }
  return l->layers[dtype];
}

static void layer_dealloc(PyObject *self) {
  pyx_layer *l = (pyx_layer *)self;
  for (int d = 0; d < 3; d++) pa_layer_destroy(l->layers[d]);
  free(l->alibi);
  free(l->sinks);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *layer_repr(PyObject *self) {
  const pa_layer_config *c = &((pyx_layer *)self)->config;
  return PyUnicode_FromFormat(
      "<pagedattn._ext.Layer num_heads=%d num_kv_heads=%d head_size=%d "
      "attn_type=%d>",
      c->num_heads, c->num_kv_heads, c->head_size, (int)c->attn_type);
}

PyTypeObject pyx_layer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pagedattn._ext.Layer",
    .tp_basicsize = sizeof(pyx_layer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Layer(num_heads, num_kv_heads, head_size, scale, alibi_slopes, sliding_window,\n"
        "      logits_soft_cap, sinks, attn_type)\n\n"
        "A pa_layer's configuration (0 for num_kv_heads, scale, window and cap: the\n"
        "library's defaults); attn_type is a pa_attn_type value.",
    .tp_new = PyType_GenericNew,
    .tp_init = layer_init,
    .tp_dealloc = layer_dealloc,
    .tp_repr = layer_repr,
};

pyx_layer *pyx_layer_arg(PyObject *obj) {
  if (!PyObject_TypeCheck(obj, &pyx_layer_type) || !((pyx_layer *)obj)->layers[PA_F32]) {
    PyErr_Format(PyExc_TypeError, "layer must be an initialised pagedattn._ext.Layer, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
  }
  return (pyx_layer *)obj;
}
