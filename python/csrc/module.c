/* pagedattn._ext: the module, its types and the library's backend facts. */
#include "ext.h"

#include <limits.h>

static PyObject *backend_name(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  return PyUnicode_FromString(pa_backend_name());
}

static PyObject *validate_head_size(PyObject *self, PyObject *arg) {
  (void)self;
  int overflow;
  long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
  if (value == -1 && PyErr_Occurred()) return NULL;
  if (overflow || value < INT_MIN || value > INT_MAX) {
    return pyx_invalid("head_size = %S is outside the supported range %d..%d", arg,
                       PA_MIN_HEAD_SIZE, PA_MAX_HEAD_SIZE);
  }
  pa_status status = pa_validate_head_size((int)value);
  if (status != PA_OK) {
    char message[PYX_MESSAGE_SIZE];
    pyx_copy_error(message, sizeof message);
    return pyx_raise_status(status, message);
  }
  Py_RETURN_NONE;
}

static PyObject *kv_cache_shape(PyObject *self, PyObject *args) {
  (void)self;
  long long num_blocks;
  int block_size, kv_heads, head_size;
  if (!PyArg_ParseTuple(args, "Liii:kv_cache_shape", &num_blocks, &block_size, &kv_heads,
                        &head_size)) {
    return NULL;
  }
  int64_t shape[3];
  pa_kv_cache_shape(num_blocks, block_size, kv_heads, head_size, shape);
  return Py_BuildValue("(LLL)", (long long)shape[0], (long long)shape[1], (long long)shape[2]);
}

static PyObject *dtype_is_supported(PyObject *self, PyObject *arg) {
  (void)self;
  long dtype = PyLong_AsLong(arg);
  if (dtype == -1 && PyErr_Occurred()) return NULL;
  return PyBool_FromLong(dtype >= 0 && dtype <= PA_FP8_E5M2 &&
                         pa_dtype_is_supported((pa_dtype)dtype));
}

static PyMethodDef methods[] = {
    {"backend_name", backend_name, METH_NOARGS, "pa_backend_name()"},
    {"validate_head_size", validate_head_size, METH_O, "pa_validate_head_size(head_size)"},
    {"kv_cache_shape", kv_cache_shape, METH_VARARGS,
     "kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size) -> (2, num_blocks, n)"},
    {"dtype_is_supported", dtype_is_supported, METH_O, "pa_dtype_is_supported(pa_dtype value)"},
    {"write_kv", (PyCFunction)(void (*)(void))pyx_write_kv, METH_FASTCALL,
     "write_kv(ctx, cache, key, value, slot_mapping)"},
    {"copy_blocks", (PyCFunction)(void (*)(void))pyx_copy_blocks, METH_FASTCALL,
     "copy_blocks(ctx, caches, block_mapping)"},
    {"swap_blocks", (PyCFunction)(void (*)(void))pyx_swap_blocks, METH_FASTCALL,
     "swap_blocks(ctx, src, dst, block_mapping)"},
    {"paged_attention", (PyCFunction)(void (*)(void))pyx_paged_attention, METH_FASTCALL,
     "paged_attention(ctx, layer, plan, query, cache, batch, out, lse) -> rows written"},
    {"varlen_attention", (PyCFunction)(void (*)(void))pyx_varlen_attention, METH_FASTCALL,
     "varlen_attention(ctx, layer, query, key, value, cu_seqlens_q, cu_seqlens_k, out, lse)"},
    {"merge_states", (PyCFunction)(void (*)(void))pyx_merge_states, METH_FASTCALL,
     "merge_states(ctx, num_heads, head_size, out_a, lse_a, out_b, lse_b, out, lse)"},
    {"forward", (PyCFunction)(void (*)(void))pyx_forward, METH_FASTCALL,
     "forward(ctx, layer, plan, query, key, value, cache, batch, out) -> rows\n\n"
     "Writes key/value (None: nothing to write) through the batch's slot_mapping, then\n"
     "attends over the cache; both steps' arguments are checked before either writes."},
    {"time_forward", (PyCFunction)(void (*)(void))pyx_time_forward, METH_FASTCALL,
     "time_forward(ctx, layer, plan, query, key, value, cache, batch, out, calls)\n"
     "-> seconds of `calls` library calls in a C loop: forward's (key and value given) or\n"
     "pa_paged_attention's alone. For bench/python_overhead.py."},
    {"tensor_view", pyx_tensor_view, METH_VARARGS,
     "tensor_view(obj, reader) -> (address, dtype, shape, strides) as the extension reads obj\n"
     "(reader: auto, dlpack (None where it declines), attributes). For the tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pagedattn._ext",
    .m_doc = "The C extension over libpagedattn (see the pagedattn package for the API).",
    .m_size = -1,
    .m_methods = methods,
};

static int add_type(PyObject *module, PyTypeObject *type, const char *name) {
  if (PyType_Ready(type) < 0) return -1;
  Py_INCREF(type);
  if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

PyMODINIT_FUNC PyInit__ext(void);
PyMODINIT_FUNC PyInit__ext(void) {
  PyObject *module = PyModule_Create(&module_def);
  if (!module) return NULL;
  char version[32];
  PyOS_snprintf(version, sizeof version, "%d.%d.%d", PA_VERSION_MAJOR, PA_VERSION_MINOR,
                PA_VERSION_PATCH);
  if (pyx_errors_init(module) < 0 || pyx_context_init_module() < 0 ||
      add_type(module, &pyx_context_type, "Context") < 0 ||
      add_type(module, &pyx_layer_type, "Layer") < 0 ||
      add_type(module, &pyx_cache_type, "KVCache") < 0 ||
      add_type(module, &pyx_batch_type, "Batch") < 0 ||
      add_type(module, &pyx_plan_type, "Plan") < 0 ||
      PyModule_AddStringConstant(module, "library_version", version) < 0 ||
      PyModule_AddIntConstant(module, "MIN_HEAD_SIZE", PA_MIN_HEAD_SIZE) < 0 ||
      PyModule_AddIntConstant(module, "MAX_HEAD_SIZE", PA_MAX_HEAD_SIZE) < 0) {
    Py_DECREF(module);
    return NULL;
  }
  return module;
}
