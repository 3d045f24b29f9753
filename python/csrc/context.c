/* pagedattn.Context: a pa_context (the library's thread pool and scratch)
 * and the lock that lets one caller thread at a time use it. */
#include "ext.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A forked child has none of its parent's pool threads: a context made
 * before the fork would wait for them forever. Each context remembers the
 * process generation it was made in; the child's count is one higher. */
static unsigned long fork_generation;
static void after_fork_in_child(void) { fork_generation++; }

int pyx_context_init_module(void) {
  return pthread_atfork(NULL, NULL, after_fork_in_child) == 0 ? 0 : -1;
}

/* The CPUs this process may run on (its affinity mask), so that a process
 * pinned to some cores (VLLM_CPU_OMP_THREADS_BIND) does not oversubscribe
 * them; 0 lets the library count the online CPUs. */
static int affinity_cpus(void) {
#ifdef CPU_COUNT
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  return 0;
}

uint64_t pyx_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static int default_threads(int *threads) {
  const char *text = getenv("PA_NUM_THREADS");
  if (!text || !*text) {
    *threads = affinity_cpus();
    return 0;
  }
  char *end;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || *end != '\0' || value < 1 || value > INT_MAX) {
    pyx_invalid("the environment variable PA_NUM_THREADS = '%s' is not a thread count >= 1", text);
    return -1;
  }
  *threads = (int)value;
  return 0;
}

static int thread_count_arg(PyObject *count, int *threads) {
  if (!PyLong_Check(count) || PyBool_Check(count)) {
    PyErr_Format(PyExc_TypeError, "num_threads must be an int or None, not %.100s",
                 Py_TYPE(count)->tp_name);
    return -1;
  }
  long value = PyLong_AsLong(count);
  if (value == -1 && PyErr_Occurred()) return -1;
  if (value < 1 || value > INT_MAX) {
    pyx_invalid(
        "num_threads = %ld must be >= 1 (None: PA_NUM_THREADS, else the CPUs this "
        "process may run on, or the OpenMP team's size)",
        value);
    return -1;
  }
  *threads = (int)value;
  return 0;
}

static int context_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  pyx_context *c = (pyx_context *)self;
  static char *keywords[] = {"num_threads", "threads", NULL};
  PyObject *count = Py_None;
  const char *kind = "own";
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O$s:Context", keywords, &count, &kind)) {
    return -1;
  }
  if (c->ctx) {
    PyErr_SetString(PyExc_RuntimeError, "Context is already initialised");
    return -1;
  }
  pa_team_fn run = NULL;
  int threads, team_threads = 0;
  if (strcmp(kind, "openmp") == 0) {
    if (pyx_openmp_team(&run, &team_threads) < 0) return -1;
  } else if (strcmp(kind, "own") != 0) {
    pyx_invalid("threads = '%s' is not 'own' or 'openmp'", kind);
    return -1;
  }
  if (count != Py_None) {
    if (thread_count_arg(count, &threads) < 0) return -1;
  } else if (run) {
    threads = team_threads > 0 ? team_threads : 1;
  } else if (default_threads(&threads) < 0) {
    return -1;
  }
  if (!(c->lock = PyThread_allocate_lock())) {
    PyErr_NoMemory();
    return -1;
  }
  pa_context *ctx = NULL;
  pa_status status;
  Py_BEGIN_ALLOW_THREADS status = run ? pa_context_create_with_team(threads, run, NULL, &ctx)
                                      : pa_context_create(threads, &ctx);
  Py_END_ALLOW_THREADS if (status != PA_OK) {
    char message[PYX_MESSAGE_SIZE];
    pyx_copy_error(message, sizeof message);
    pyx_raise_status(status, message);
    return -1;
  }
  c->ctx = ctx;
  c->generation = fork_generation;
  c->openmp = run != NULL;
  return 0;
}

static void context_dealloc(PyObject *self) {
  pyx_context *c = (pyx_context *)self;
  if (c->weakrefs) PyObject_ClearWeakRefs(self);
  /* A parent's context is left to the parent: destroying it would join
   * threads this process does not have. */
  if (c->ctx && c->generation == fork_generation) {
    Py_BEGIN_ALLOW_THREADS pa_context_destroy(c->ctx);
    Py_END_ALLOW_THREADS
  }
  if (c->lock) PyThread_free_lock(c->lock);
  Py_TYPE(self)->tp_free(self);
}

static int context_ready(const pyx_context *c) {
  if (!c->ctx) {
    PyErr_SetString(PyExc_RuntimeError, "Context.__init__ was not called");
    return 0;
  }
  if (c->generation != fork_generation) {
    pyx_invalid(
        "this Context was made in the parent of this forked process, and its threads "
        "stayed there; make a new Context in this process");
    return 0;
  }
  return 1;
}

static PyObject *context_num_threads(PyObject *self, void *closure) {
  (void)closure;
  pyx_context *c = (pyx_context *)self;
  return context_ready(c) ? PyLong_FromLong(pa_context_num_threads(c->ctx)) : NULL;
}

static PyObject *context_isa(PyObject *self, void *closure) {
  (void)closure;
  pyx_context *c = (pyx_context *)self;
  return context_ready(c) ? PyUnicode_FromString(pa_context_isa(c->ctx)) : NULL;
}

static PyObject *context_threads(PyObject *self, void *closure) {
  (void)closure;
  pyx_context *c = (pyx_context *)self;
  return context_ready(c) ? PyUnicode_FromString(c->openmp ? "openmp" : "own") : NULL;
}

static PyObject *context_kernel_path(PyObject *self, void *closure) {
  (void)closure;
  pyx_context *c = (pyx_context *)self;
  return context_ready(c) ? PyUnicode_FromString(pa_context_kernel_path(c->ctx)) : NULL;
}

static PyObject *context_get_timing(PyObject *self, void *closure) {
  (void)closure;
  return PyBool_FromLong(((pyx_context *)self)->timing);
}

static int context_set_timing(PyObject *self, PyObject *value, void *closure) {
  (void)closure;
  int on = value ? PyObject_IsTrue(value) : 0;
  if (on < 0) return -1;
  ((pyx_context *)self)->timing = on;
  return 0;
}

static PyObject *context_get_library_seconds(PyObject *self, void *closure) {
  (void)closure;
  return PyFloat_FromDouble(1e-9 * (double)((pyx_context *)self)->library_ns);
}

static int context_set_library_seconds(PyObject *self, PyObject *value, void *closure) {
  (void)closure;
  double seconds = value ? PyFloat_AsDouble(value) : 0.0;
  if (seconds == -1.0 && PyErr_Occurred()) return -1;
  ((pyx_context *)self)->library_ns = (unsigned long long)(seconds * 1e9);
  return 0;
}

/* A pa_dtype from the library's name for it ("f32", "bf16", "fp8_e4m3", ...). */
static int dtype_name_arg(const char *text, const char *name, pa_dtype *dtype) {
  static const pa_dtype all[] = {PA_F32, PA_F16, PA_BF16, PA_FP8_E4M3, PA_FP8_E5M2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (strcmp(text, pa_dtype_name(all[i])) == 0) {
      *dtype = all[i];
      return 0;
    }
  }
  pyx_invalid("%s = '%s' is not one of 'f32', 'f16', 'bf16', 'fp8_e4m3', 'fp8_e5m2'", name, text);
  return -1;
}

/* Context.kv_layout_preferred(act_dtype, cache_dtype, block_size, head_size) */
static PyObject *context_kv_layout_preferred(PyObject *self, PyObject *args) {
  pyx_context *c = (pyx_context *)self;
  const char *act_name, *cache_name;
  int block_size, head_size;
  if (!PyArg_ParseTuple(args, "ssii:kv_layout_preferred", &act_name, &cache_name, &block_size,
                        &head_size)) {
    return NULL;
  }
  pa_dtype act, cache;
  if (!context_ready(c) || dtype_name_arg(act_name, "act_dtype", &act) < 0 ||
      dtype_name_arg(cache_name, "cache_dtype", &cache) < 0) {
    return NULL;
  }
  /* The kernel table it reads is fixed at the context's creation: no lock needed. */
  pa_kv_layout layout = pa_kv_layout_preferred(c->ctx, act, cache, block_size, head_size);
  return PyUnicode_FromString(pyx_layout_name(layout));
}

static PyMethodDef context_methods[] = {
    {"kv_layout_preferred", context_kv_layout_preferred, METH_VARARGS,
     "kv_layout_preferred(act_dtype, cache_dtype, block_size, head_size) -> 'rows' | 'tiled'\n\n"
     "pa_kv_layout_preferred: the cache layout whose reads are fastest on this context's\n"
     "kernel path for activations of act_dtype over a cache of cache_dtype (the library's\n"
     "names: 'f32', 'f16', 'bf16', 'fp8_e4m3', 'fp8_e5m2') with this geometry; 'rows' for\n"
     "a geometry no tiled cache can have."},
    {NULL, NULL, 0, NULL},
};

static PyObject *context_repr(PyObject *self) {
  pyx_context *c = (pyx_context *)self;
  if (!c->ctx) return PyUnicode_FromString("<pagedattn.Context (not initialised)>");
  return PyUnicode_FromFormat("<pagedattn.Context num_threads=%d isa='%s' kernel_path='%s'>",
                              pa_context_num_threads(c->ctx), pa_context_isa(c->ctx),
                              pa_context_kernel_path(c->ctx));
}

static PyGetSetDef context_getset[] = {
    {"num_threads", context_num_threads, NULL, "Threads of the pool, the caller's included.", NULL},
    {"isa", context_isa, NULL, "Kernel family in use: 'avx512', 'avx2' or 'scalar'.", NULL},
    {"threads", context_threads, NULL, "'own' (a pool of its own) or 'openmp'.", NULL},
    {"kernel_path", context_kernel_path, NULL,
     "The path within the family, as PA_ISA names it: 'scalar', 'avx2', 'avx512',\n"
     "'avx512bf16' or 'amx'.",
     NULL},
    {"timing", context_get_timing, context_set_timing,
     "When true, the time of each library call on this context adds to library_seconds\n"
     "(for benchmarks: what a Python caller spends outside the library).",
     NULL},
    {"library_seconds", context_get_library_seconds, context_set_library_seconds,
     "Seconds spent in library calls while timing was on (assign 0 to reset).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pyx_context_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pagedattn.Context",
    .tp_basicsize = sizeof(pyx_context),
    .tp_weaklistoffset = offsetof(pyx_context, weakrefs),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Context(num_threads=None, *, threads='own')\n\n"
        "The library's thread pool and scratch memory. num_threads None: the\n"
        "PA_NUM_THREADS environment variable, else the CPUs this process may run on.\n"
        "threads='openmp': the library's work runs on the calling thread's OpenMP team\n"
        "(num_threads None: the team's size) instead of threads of its own.\n"
        "One caller thread uses a context at a time (others wait); give each Python\n"
        "thread its own context to run in parallel.",
    .tp_new = PyType_GenericNew,
    .tp_init = context_init,
    .tp_dealloc = context_dealloc,
    .tp_repr = context_repr,
    .tp_getset = context_getset,
    .tp_methods = context_methods,
};

pyx_context *pyx_context_arg(PyObject *obj) {
  if (!PyObject_TypeCheck(obj, &pyx_context_type)) {
    PyErr_Format(PyExc_TypeError, "ctx must be a pagedattn.Context or None, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
  }
  pyx_context *c = (pyx_context *)obj;
  return context_ready(c) ? c : NULL;
}
