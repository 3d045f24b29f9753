/* pagedattn.Error and the translation of a library status into Python. */
#include "ext.h"

#include <stdarg.h>
#include <string.h>

PyObject *pyx_error;

static const char *status_name(pa_status status) {
  switch (status) {
    case PA_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case PA_ERR_UNSUPPORTED: return "unsupported";
    case PA_ERR_OUT_OF_RANGE: return "out_of_range";
    default: return "invalid_argument";
  }
}

int pyx_errors_init(PyObject *module) {
  PyObject *doc = NULL;
  pyx_error = PyErr_NewExceptionWithDoc(
      "pagedattn.Error",
      "A call pagedattn refused: .status is 'invalid_argument', 'unsupported' or "
      "'out_of_range', the text the library's message (argument, position, value). "
      "Nothing was written.",
      PyExc_ValueError, doc);
  if (!pyx_error) return -1;
  if (PyObject_SetAttrString(pyx_error, "status", Py_None) < 0) return -1;
  Py_INCREF(pyx_error);
  return PyModule_AddObject(module, "Error", pyx_error);
}

static PyObject *raise_error(const char *status, PyObject *message) {
  PyObject *error = PyObject_CallOneArg(pyx_error, message);
  if (!error) return NULL;
  PyObject *name = PyUnicode_FromString(status);
  if (name && PyObject_SetAttrString(error, "status", name) == 0) {
    PyErr_SetObject(pyx_error, error);
  }
  Py_XDECREF(name);
  Py_DECREF(error);
  return NULL;
}

PyObject *pyx_raise_status(pa_status status, const char *message) {
  if (status == PA_ERR_OUT_OF_MEMORY) {
    PyErr_SetString(PyExc_MemoryError, message);
    return NULL;
  }
  PyObject *text = PyUnicode_FromString(message);
  if (!text) return NULL;
  raise_error(status_name(status), text);
  Py_DECREF(text);
  return NULL;
}

static PyObject *raise_formatted(const char *status, const char *fmt, va_list args) {
  PyObject *text = PyUnicode_FromFormatV(fmt, args);
  if (!text) return NULL;
  raise_error(status, text);
  Py_DECREF(text);
  return NULL;
}

PyObject *pyx_invalid(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  raise_formatted("invalid_argument", fmt, args);
  va_end(args);
  return NULL;
}

PyObject *pyx_out_of_range(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  raise_formatted("out_of_range", fmt, args);
  va_end(args);
  return NULL;
}

void pyx_copy_error(char *message, size_t size) {
  const char *detail = pa_last_error();
  size_t n = strlen(detail);
  if (n >= size) n = size - 1;
  memcpy(message, detail, n);
  message[n] = '\0';
}

int pyx_check_nargs(const char *function, Py_ssize_t nargs, Py_ssize_t expected) {
  if (nargs == expected) return 0;
  PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", function, expected, nargs);
  return -1;
}
