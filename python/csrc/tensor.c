/* Tensors to pointers: a torch.Tensor through one DLPack export, or its
 * Python attributes where the export is declined (torch is not needed to
 * build, and is looked up only once the caller has imported it), anything
 * else through the buffer protocol (numpy arrays). */
#include "ext.h"

#include <stdio.h>
#include <string.h>

/* torch's tensor type, its dtypes (by pyx_elem) and torch.strided, found once
 * torch is in sys.modules. */
static PyTypeObject *torch_tensor_type;
static PyObject *torch_dtypes[PYX_OTHER];
static PyObject *torch_strided;
/* torch.utils.dlpack.to_dlpack, or NULL where this torch has none. */
static PyObject *torch_to_dlpack;
static PyObject *str_is_cpu, *str_device, *str_layout, *str_dtype, *str_shape, *str_data_ptr,
    *str_stride;

static const char *const torch_dtype_attrs[PYX_OTHER] = {
    [PYX_F32] = "float32",
    [PYX_F16] = "float16",
    [PYX_BF16] = "bfloat16",
    [PYX_FP8_E4M3] = "float8_e4m3fn",
    [PYX_FP8_E5M2] = "float8_e5m2",
    [PYX_U8] = "uint8",
    [PYX_I32] = "int32",
    [PYX_I64] = "int64",
};

static const char *const elem_names[PYX_OTHER + 1] = {
    [PYX_F32] = "float32",
    [PYX_F16] = "float16",
    [PYX_BF16] = "bfloat16",
    [PYX_FP8_E4M3] = "float8_e4m3fn",
    [PYX_FP8_E5M2] = "float8_e5m2",
    [PYX_U8] = "uint8",
    [PYX_I32] = "int32",
    [PYX_I64] = "int64",
    [PYX_OTHER] = "another dtype",
};

const char *pyx_elem_name(pyx_elem elem) { return elem_names[elem]; }

const char *pyx_dtype_of(const pyx_tensor *t) {
  return t->elem == PYX_OTHER && t->other_dtype[0] ? t->other_dtype : elem_names[t->elem];
}

size_t pyx_elem_size(pyx_elem elem) {
  switch (elem) {
    case PYX_F32:
    case PYX_I32: return 4;
    case PYX_F16:
    case PYX_BF16: return 2;
    case PYX_FP8_E4M3:
    case PYX_FP8_E5M2:
    case PYX_U8: return 1;
    case PYX_I64: return 8;
    default: return 0;
  }
}

static int intern_names(void) {
  struct {
    PyObject **slot;
    const char *text;
  } names[] = {{&str_is_cpu, "is_cpu"}, {&str_device, "device"}, {&str_layout, "layout"},
               {&str_dtype, "dtype"},   {&str_shape, "shape"},   {&str_data_ptr, "data_ptr"},
               {&str_stride, "stride"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!*names[i].slot && !(*names[i].slot = PyUnicode_InternFromString(names[i].text))) {
      return -1;
    }
  }
  return 0;
}

/* torch.utils.dlpack.to_dlpack, or NULL (no error set) where it cannot be found: the
 * attributes' path then serves every tensor. */
static PyObject *find_to_dlpack(void) {
  PyObject *module = PyImport_ImportModule("torch.utils.dlpack");
  PyObject *function = module ? PyObject_GetAttrString(module, "to_dlpack") : NULL;
  Py_XDECREF(module);
  if (!function || !PyCallable_Check(function)) {
    Py_XDECREF(function);
    PyErr_Clear();
    return NULL;
  }
  return function;
}

/* 1 when torch's objects are known, 0 when torch is not imported, -1 on error. */
static int find_torch(void) {
  if (torch_tensor_type) return 1;
  PyObject *name = PyUnicode_FromString("torch");
  if (!name) return -1;
  PyObject *torch = PyImport_GetModule(name);
  Py_DECREF(name);
  if (!torch) return PyErr_Occurred() ? -1 : 0;
  int result = -1;
  PyObject *dtypes[PYX_OTHER] = {0}, *strided = NULL;
  PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
  if (!tensor || !PyType_Check(tensor) || intern_names() < 0) goto done;
  for (int e = 0; e < PYX_OTHER; e++) {
    if (!(dtypes[e] = PyObject_GetAttrString(torch, torch_dtype_attrs[e]))) goto done;
  }
  if (!(strided = PyObject_GetAttrString(torch, "strided"))) goto done;
  /* Kept for the life of the process, as torch itself is. */
  memcpy(torch_dtypes, dtypes, sizeof dtypes);
  torch_strided = strided;
  torch_to_dlpack = find_to_dlpack();
  torch_tensor_type = (PyTypeObject *)tensor;
  Py_DECREF(torch);
  return 1;
done:
  for (int e = 0; e < PYX_OTHER; e++) Py_XDECREF(dtypes[e]);
  Py_XDECREF(strided);
  Py_XDECREF(tensor);
  Py_DECREF(torch);
  return result;
}

static int is_torch_tensor(PyObject *obj) {
  if (!torch_tensor_type) {
    int found = find_torch();
    if (found <= 0) return found;
  }
  return PyObject_TypeCheck(obj, torch_tensor_type);
}

/* A tuple of ints (torch.Size, a stride tuple) into out[ndim]. */
static int read_ints(PyObject *tuple, const char *name, const char *what, int64_t *out, int *ndim) {
  if (!PyTuple_Check(tuple)) {
    PyErr_Format(PyExc_TypeError, "%s.%s is not a tuple", name, what);
    return -1;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  if (n > PYX_MAX_DIMS) {
    pyx_invalid("%s has %zd dimensions; pagedattn reads at most %d", name, n, PYX_MAX_DIMS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    out[i] = v;
  }
  *ndim = (int)n;
  return 0;
}

/* The head of DLPack's DLManagedTensor (its DLTensor), whose layout dlpack.h keeps stable:
 * the fields read here. */
typedef struct pyx_dltensor {
  void *data;
  struct {
    int32_t type;
    /* cppcheck-suppress unusedStructMember ; kept for the layout */
    int32_t id;
  } device;
  int32_t ndim;
  struct {
    uint8_t code, bits;
    uint16_t lanes;
  } dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
} pyx_dltensor;

enum { PYX_DL_CPU = 1, PYX_DL_INT = 0, PYX_DL_UINT = 1, PYX_DL_FLOAT = 2, PYX_DL_BFLOAT = 4 };
enum { PYX_DL_FLOAT8_E4M3FN = 10, PYX_DL_FLOAT8_E5M2 = 12 };

static pyx_elem dl_elem(int code, int bits) {
  switch (code * 256 + bits) {
    case PYX_DL_FLOAT * 256 + 32: return PYX_F32;
    case PYX_DL_FLOAT * 256 + 16: return PYX_F16;
    case PYX_DL_BFLOAT * 256 + 16: return PYX_BF16;
    case PYX_DL_FLOAT8_E4M3FN * 256 + 8: return PYX_FP8_E4M3;
    case PYX_DL_FLOAT8_E5M2 * 256 + 8: return PYX_FP8_E5M2;
    case PYX_DL_UINT * 256 + 8: return PYX_U8;
    case PYX_DL_INT * 256 + 32: return PYX_I32;
    case PYX_DL_INT * 256 + 64: return PYX_I64;
    default: return PYX_OTHER;
  }
}

/* A CPU tensor of a known dtype through one DLPack export, which costs a
 * third of the six attribute reads of torch_get. 1: read; 0: not
 * exported or not such a tensor (torch_get reads it, and names what is
 * wrong); never an exception. */
static int torch_get_dlpack(PyObject *obj, pyx_tensor *t) {
  if (!torch_to_dlpack) return 0;
  PyObject *capsule = PyObject_CallOneArg(torch_to_dlpack, obj);
  const pyx_dltensor *dl = capsule ? PyCapsule_GetPointer(capsule, "dltensor") : NULL;
  pyx_elem elem = dl && dl->dtype.lanes == 1 ? dl_elem(dl->dtype.code, dl->dtype.bits) : PYX_OTHER;
  int read = elem != PYX_OTHER && dl->device.type == PYX_DL_CPU && dl->ndim >= 0 &&
             dl->ndim <= PYX_MAX_DIMS;
  if (read) {
    t->elem = elem;
    t->data = dl->data ? (char *)dl->data + dl->byte_offset : NULL;
    t->ndim = dl->ndim;
    int64_t dense = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      t->shape[d] = dl->shape[d];
      t->strides[d] = dl->strides ? dl->strides[d] : dense; /* NULL: C order */
      dense *= dl->shape[d];
    }
  }
  Py_XDECREF(capsule); /* its destructor frees the export */
  PyErr_Clear();
  return read;
}

static int torch_get_attributes(PyObject *obj, const char *name, pyx_tensor *t) {
  PyObject *value = PyObject_GetAttr(obj, str_is_cpu);
  if (!value) return -1;
  int cpu = PyObject_IsTrue(value);
  Py_DECREF(value);
  if (cpu < 0) return -1;
  if (!cpu) {
    PyObject *device = PyObject_GetAttr(obj, str_device);
    if (!device) return -1;
    pyx_invalid("%s is on device %S; pagedattn reads CPU tensors in place and copies nothing", name,
                device);
    Py_DECREF(device);
    return -1;
  }
  if (!(value = PyObject_GetAttr(obj, str_layout))) return -1;
  int strided = value == torch_strided;
  if (!strided) pyx_invalid("%s has layout %S; pagedattn reads strided tensors", name, value);
  Py_DECREF(value);
  if (!strided) return -1;

  if (!(value = PyObject_GetAttr(obj, str_dtype))) return -1;
  t->elem = PYX_OTHER;
  for (int e = 0; e < PYX_OTHER; e++) {
    if (value == torch_dtypes[e]) t->elem = (pyx_elem)e;
  }
  if (t->elem == PYX_OTHER) {
    PyObject *text = PyObject_Str(value);
    const char *utf8 = text ? PyUnicode_AsUTF8(text) : NULL;
    if (utf8) snprintf(t->other_dtype, sizeof t->other_dtype, "%s", utf8);
    Py_XDECREF(text);
    PyErr_Clear();
  }
  Py_DECREF(value);

  if (!(value = PyObject_CallMethodNoArgs(obj, str_data_ptr))) return -1;
  t->data = PyLong_AsVoidPtr(value);
  Py_DECREF(value);
  if (PyErr_Occurred()) return -1;

  int ndim = 0, stride_dims = 0;
  if (!(value = PyObject_GetAttr(obj, str_shape))) return -1;
  int failed = read_ints(value, name, "shape", t->shape, &ndim);
  Py_DECREF(value);
  if (failed) return -1;
  if (!(value = PyObject_CallMethodNoArgs(obj, str_stride))) return -1;
  failed = read_ints(value, name, "stride()", t->strides, &stride_dims);
  Py_DECREF(value);
  if (failed) return -1;
  t->ndim = ndim;
  return 0;
}

static int torch_get(PyObject *obj, const char *name, pyx_tensor *t) {
  return torch_get_dlpack(obj, t) ? 0 : torch_get_attributes(obj, name, t);
}

static pyx_elem buffer_elem(const Py_buffer *view) {
  const char *f = view->format ? view->format : "B";
  if (*f == '@' || *f == '=' || *f == '<') f++;
  if (*f == '\0' || f[1] != '\0') return PYX_OTHER; /* big-endian, structs, ... */
  switch (*f) {
    case 'f': return view->itemsize == 4 ? PYX_F32 : PYX_OTHER;
    case 'e': return view->itemsize == 2 ? PYX_F16 : PYX_OTHER;
    case 'B': return view->itemsize == 1 ? PYX_U8 : PYX_OTHER;
    case 'i':
    case 'l':
    case 'q':
      if (view->itemsize == 4) return PYX_I32;
      return view->itemsize == 8 ? PYX_I64 : PYX_OTHER;
    default: return PYX_OTHER;
  }
}

static int buffer_get(PyObject *obj, const char *name, int writable, pyx_tensor *t) {
  int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, &t->view, flags) < 0) {
    if (writable && PyObject_GetBuffer(obj, &t->view, PyBUF_RECORDS_RO) == 0) {
      PyBuffer_Release(&t->view);
      PyErr_Clear();
      pyx_invalid("%s is read-only; pagedattn writes it in place", name);
    }
    return -1;
  }
  t->has_view = 1;
  if (t->view.ndim > PYX_MAX_DIMS) {
    pyx_invalid("%s has %d dimensions; pagedattn reads at most %d", name, t->view.ndim,
                PYX_MAX_DIMS);
    return -1;
  }
  t->elem = buffer_elem(&t->view);
  if (t->elem == PYX_OTHER) {
    snprintf(t->other_dtype, sizeof t->other_dtype, "buffer format '%s' of %zd bytes",
             t->view.format ? t->view.format : "B", t->view.itemsize);
  }
  t->data = t->view.buf;
  t->ndim = t->view.ndim;
  for (int d = 0; d < t->ndim; d++) {
    Py_ssize_t stride = t->view.strides ? t->view.strides[d] : 0;
    t->shape[d] = t->view.shape[d];
    if (t->view.itemsize <= 0 || stride % t->view.itemsize != 0) {
      pyx_invalid(
          "%s's dimension %d has a stride of %zd bytes, not a whole number of %zd-byte "
          "elements",
          name, d, stride, t->view.itemsize);
      return -1;
    }
    t->strides[d] = stride / t->view.itemsize;
  }
  return 0;
}

int pyx_tensor_get(PyObject *obj, const char *name, int writable, pyx_tensor *t) {
  memset(t, 0, sizeof *t);
  int torch = is_torch_tensor(obj);
  if (torch < 0) return -1;
  int failed;
  if (torch) {
    failed = torch_get(obj, name, t);
  } else if (PyObject_CheckBuffer(obj)) {
    failed = buffer_get(obj, name, writable, t);
  } else {
    PyErr_Format(PyExc_TypeError, "%s must be a torch.Tensor or a numpy array, not %.100s", name,
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (!failed) {
    for (int d = 0; d < t->ndim; d++) {
      if (t->strides[d] < 0 && t->shape[d] > 1) {
        pyx_invalid(
            "%s's dimension %d has a negative stride (%lld); pagedattn reads it in place "
            "and copies nothing",
            name, d, (long long)t->strides[d]);
        failed = -1;
        break;
      }
    }
  }
  if (failed) pyx_tensor_release(t);
  return failed;
}

static PyObject *ints_tuple(const int64_t *values, int count) {
  PyObject *tuple = PyTuple_New(count);
  for (int i = 0; tuple && i < count; i++) {
    PyObject *value = PyLong_FromLongLong(values[i]);
    if (!value) {
      Py_CLEAR(tuple);
      break;
    }
    PyTuple_SET_ITEM(tuple, i, value);
  }
  return tuple;
}

/* tensor_view(obj, reader) -> (address, dtype, shape, strides), or None where the reader
 * "dlpack" declines the tensor; reader "attributes" reads a torch tensor's attributes,
 * "auto" reads as every call does. For the tests of both readers. */
PyObject *pyx_tensor_view(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *obj;
  const char *reader;
  if (!PyArg_ParseTuple(args, "Os:tensor_view", &obj, &reader)) return NULL;
  pyx_tensor t;
  memset(&t, 0, sizeof t);
  int torch = is_torch_tensor(obj);
  if (torch < 0) return NULL;
  int is_auto = strcmp(reader, "auto") == 0, is_dlpack = strcmp(reader, "dlpack") == 0;
  if (!is_auto && (!torch || (!is_dlpack && strcmp(reader, "attributes") != 0))) {
    return pyx_invalid("reader = '%s' needs a torch tensor and is one of auto, dlpack, attributes",
                       reader);
  }
  if (is_dlpack) {
    if (!torch_get_dlpack(obj, &t)) Py_RETURN_NONE;
  } else if ((is_auto ? pyx_tensor_get(obj, "tensor", 0, &t)
                      : torch_get_attributes(obj, "tensor", &t)) < 0) {
    return NULL;
  }
  PyObject *shape = ints_tuple(t.shape, t.ndim), *strides = ints_tuple(t.strides, t.ndim);
  PyObject *result = shape && strides ? Py_BuildValue("(NsOO)", PyLong_FromVoidPtr(t.data),
                                                      pyx_dtype_of(&t), shape, strides)
                                      : NULL;
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  pyx_tensor_release(&t);
  return result;
}

void pyx_tensor_release(pyx_tensor *t) {
  if (t->has_view) PyBuffer_Release(&t->view);
  t->has_view = 0;
}

const char *pyx_shape_string(const pyx_tensor *t, char *buf, size_t size) {
  size_t used = (size_t)snprintf(buf, size, "[");
  for (int d = 0; d < t->ndim && used < size; d++) {
    used +=
        (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
  }
  if (used < size) snprintf(buf + used, size - used, "]");
  return buf;
}

int pyx_tensor_rows(const pyx_tensor *t, const char *name, const char *width_what, int64_t width,
                    int64_t head_size, int64_t *rows, int64_t *stride) {
  char shape[160];
  if (t->ndim != 2 && t->ndim != 3) {
    pyx_invalid("%s has shape %s; it must be [rows, %s] or [rows, heads, head_size]", name,
                pyx_shape_string(t, shape, sizeof shape), width_what);
    return -1;
  }
  if (t->ndim == 3 && t->shape[2] != head_size) {
    pyx_invalid("%s has shape %s: heads of %lld elements where head_size = %lld", name,
                pyx_shape_string(t, shape, sizeof shape), (long long)t->shape[2],
                (long long)head_size);
    return -1;
  }
  int64_t elements = 1;
  for (int d = t->ndim - 1; d >= 1; d--) {
    if (t->shape[d] != 1 && t->strides[d] != elements) {
      pyx_invalid(
          "%s (shape %s) has stride %lld in dimension %d where %lld would make its rows "
          "dense; pagedattn reads rows in place and copies nothing",
          name, pyx_shape_string(t, shape, sizeof shape), (long long)t->strides[d], d,
          (long long)elements);
      return -1;
    }
    elements *= t->shape[d];
  }
  if (elements != width) {
    pyx_invalid("%s has shape %s: %lld elements per row where %s = %lld", name,
                pyx_shape_string(t, shape, sizeof shape), (long long)elements, width_what,
                (long long)width);
    return -1;
  }
  *rows = t->shape[0];
  *stride = t->shape[0] > 1 ? t->strides[0] : width;
  return 0;
}

int pyx_tensor_vector(const pyx_tensor *t, const char *name, pyx_elem elem) {
  if (t->elem != elem) {
    pyx_invalid("%s has dtype %s; it must be %s", name, pyx_dtype_of(t), pyx_elem_name(elem));
    return -1;
  }
  if (t->ndim != 1) {
    char shape[160];
    pyx_invalid("%s has shape %s; it must be 1-D", name, pyx_shape_string(t, shape, sizeof shape));
    return -1;
  }
  if (t->shape[0] > 1 && t->strides[0] != 1) {
    pyx_invalid("%s has stride %lld; it must be dense (stride 1)", name, (long long)t->strides[0]);
    return -1;
  }
  return 0;
}

int pyx_tensor_activation(const pyx_tensor *t, const char *name) {
  if (t->elem == PYX_F32 || t->elem == PYX_F16 || t->elem == PYX_BF16) return 0;
  pyx_invalid("%s has dtype %s; activations are float32, float16 or bfloat16", name,
              pyx_dtype_of(t));
  return -1;
}
