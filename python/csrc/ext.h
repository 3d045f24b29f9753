/* The CPython extension over libpagedattn: shared declarations.
 *
 * The extension converts tensors (torch or anything with the buffer
 * protocol, numpy included) to pointers, checks only what the library cannot
 * see (device, dtype, a dense inner dimension, that a tensor's extent covers
 * what the call touches), and calls the library with the GIL released. Every
 * other check is the library's, and its message becomes the exception. */
#ifndef PYX_EXT_H
#define PYX_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pagedattn.h>
#include <pythread.h>

/* ---- errors (errors.c) ------------------------------------------------- */

extern PyObject *pyx_error; /* pagedattn.Error, a ValueError */
int pyx_errors_init(PyObject *module);
/* Raises the exception for `status` with `message` (pagedattn.Error with
 * .status, or MemoryError); returns NULL. */
PyObject *pyx_raise_status(pa_status status, const char *message);
/* pagedattn.Error(status="invalid_argument") with a formatted message. */
PyObject *pyx_invalid(const char *fmt, ...);
/* The same with status "out_of_range". */
PyObject *pyx_out_of_range(const char *fmt, ...);

/* ---- tensors (tensor.c) ------------------------------------------------ */

/* Element types an argument may hold: the library's five (same values as
 * pa_dtype), and the index and raw-byte types. */
typedef enum pyx_elem {
  PYX_F32 = PA_F32,
  PYX_F16 = PA_F16,
  PYX_BF16 = PA_BF16,
  PYX_FP8_E4M3 = PA_FP8_E4M3,
  PYX_FP8_E5M2 = PA_FP8_E5M2,
  PYX_U8,
  PYX_I32,
  PYX_I64,
  PYX_OTHER,
} pyx_elem;

enum { PYX_MAX_DIMS = 8 };

typedef struct pyx_tensor {
  void *data;
  int ndim;
  int64_t shape[PYX_MAX_DIMS];
  int64_t strides[PYX_MAX_DIMS]; /* in elements */
  pyx_elem elem;
  char other_dtype[48]; /* the name of a dtype outside pyx_elem, for messages */
  Py_buffer view;       /* held for buffer-protocol objects */
  int has_view;
} pyx_tensor;

/* Reads `obj` (a CPU torch.Tensor or a buffer such as a numpy array) into
 * *t. TypeError for another Python type, pagedattn.Error for a tensor the
 * library cannot read in place (another device, a non-strided layout, a
 * negative or fractional stride, a read-only buffer where `writable`).
 * Returns 0, or -1 with an exception set. Release with pyx_tensor_release. */
int pyx_tensor_get(PyObject *obj, const char *name, int writable, pyx_tensor *t);
void pyx_tensor_release(pyx_tensor *t);
const char *pyx_elem_name(pyx_elem elem);
/* The tensor's dtype for messages ("bfloat16", or e.g. "torch.float64"). */
const char *pyx_dtype_of(const pyx_tensor *t);
size_t pyx_elem_size(pyx_elem elem);
/* Writes the shape as "[2, 3, 4]" into buf. */
const char *pyx_shape_string(const pyx_tensor *t, char *buf, size_t size);

/* The tensor as rows of heads: [rows, width] or [rows, width / head_size,
 * head_size], dimensions past the first dense (C order). *stride: elements
 * from one row to the next. Returns 0 or -1 with pagedattn.Error set. */
int pyx_tensor_rows(const pyx_tensor *t, const char *name, const char *width_what, int64_t width,
                    int64_t head_size, int64_t *rows, int64_t *stride);
/* A dense 1-D array of `elem` (any length). */
int pyx_tensor_vector(const pyx_tensor *t, const char *name, pyx_elem elem);
/* Requires t->elem to be an activation dtype (f32, f16, bf16). */
int pyx_tensor_activation(const pyx_tensor *t, const char *name);

/* ---- context (context.c) ----------------------------------------------- */

typedef struct pyx_context {
  PyObject_HEAD pa_context *ctx;
  PyThread_type_lock lock;  /* a context serves one caller thread at a time */
  unsigned long generation; /* of the process that made it (see context.c) */
  int openmp;               /* runs on the OpenMP team (threads='openmp') */
  int timing;               /* Context.timing: add each library call's time to library_ns */
  unsigned long long library_ns;
  PyObject *weakrefs; /* a context can key weak mappings (pagedattn.metadata.step_key) */
} pyx_context;

extern PyTypeObject pyx_context_type;
int pyx_context_init_module(void);
/* The process's OpenMP team as a pa_team_fn, and its default size; -1 with
 * pagedattn.Error set when no OpenMP runtime is loaded (team.c). */
int pyx_openmp_team(pa_team_fn *run, int *max_threads);
/* `obj` as a Context (TypeError otherwise). */
pyx_context *pyx_context_arg(PyObject *obj);

/* Runs a library call with the GIL released and the context held, timing it
 * when the context's timing is on, and copies pa_last_error() into `message`
 * (a char array) on failure while still on the calling thread:
 *   pa_status status;
 *   char message[PYX_MESSAGE_SIZE];
 *   PYX_CALL(context, status = pa_...(context->ctx, ...), message); */
#define PYX_CALL(context, statement, message)                                   \
  do {                                                                          \
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock((context)->lock, WAIT_LOCK);   \
    uint64_t pyx_started = (context)->timing ? pyx_now_ns() : 0;                \
    statement;                                                                  \
    if ((context)->timing) (context)->library_ns += pyx_now_ns() - pyx_started; \
    if (status != PA_OK) pyx_copy_error(message, sizeof(message));              \
    PyThread_release_lock((context)->lock);                                     \
    Py_END_ALLOW_THREADS                                                        \
  } while (0)

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t pyx_now_ns(void);

enum { PYX_MESSAGE_SIZE = 1024 };
void pyx_copy_error(char *message, size_t size);

/* ---- layer (layer.c) ---------------------------------------------------- */

/* A layer's configuration and its pa_layer for each activation dtype,
 * made on first use with that dtype. */
typedef struct pyx_layer {
  PyObject_HEAD pa_layer_config config;
  float *alibi, *sinks; /* owned copies behind config's pointers */
  pa_layer *layers[3];  /* by activation dtype */
} pyx_layer;

extern PyTypeObject pyx_layer_type;
pyx_layer *pyx_layer_arg(PyObject *obj);
/* The pa_layer for `dtype`, made if need be (NULL with an exception set). */
const pa_layer *pyx_layer_for(pyx_layer *layer, pa_dtype dtype);

/* ---- cache (cache.c) ---------------------------------------------------- */

typedef struct pyx_cache {
  PyObject_HEAD pa_kv_cache cache;
  PyObject *key, *value; /* the tensors, kept alive (value may be key: one tensor) */
} pyx_cache;

extern PyTypeObject pyx_cache_type;
pyx_cache *pyx_cache_arg(PyObject *obj);
/* A cache layout from its name, "rows" (PA_KV_ROWS) or "tiled" (PA_KV_TILED); NULL and
 * None mean "rows". TypeError for another type, pagedattn.Error for another name. Whether
 * the cache can have that layout is the library's check, at the call. */
int pyx_layout_arg(PyObject *obj, pa_kv_layout *layout);
const char *pyx_layout_name(pa_kv_layout layout);
/* The new tokens' key and value rows for `cache`: at least `tokens` rows of
 * num_kv_heads * head_size elements, both of one activation dtype. */
int pyx_kv_rows(const pyx_tensor *key, const pyx_tensor *value, const pa_kv_cache *cache,
                int64_t tokens, int64_t *key_stride, int64_t *value_stride);

/* ---- batch and plan (batch.c) ------------------------------------------ */

typedef struct pyx_batch {
  PyObject_HEAD pa_batch batch;
  int64_t columns;             /* block_tables' columns (<= batch.block_table_stride) */
  int64_t num_rows;            /* query_start_loc[num_seqs] */
  const int64_t *slot_mapping; /* the new tokens' slots; NULL when there are none */
  int64_t num_slots;
  /* query_start_loc, seq_lens, block_tables, slot_mapping (NULL: none was given; an empty
   * one, whose data may be NULL, writes nothing) */
  PyObject *tensors[4];
} pyx_batch;

typedef struct pyx_plan {
  PyObject_HEAD pa_plan *plan;
  PyObject *context; /* the Context it was made for */
} pyx_plan;

extern PyTypeObject pyx_batch_type, pyx_plan_type;
pyx_batch *pyx_batch_arg(PyObject *obj);
/* Whether every sequence's blocks of `block_size` tokens are among the block table's
 * columns (else an out_of_range Error and -1). The library checks them against
 * block_table_stride, which a table whose rows are spaced wider than they are long (a view
 * of some columns of a larger table) exceeds. */
int pyx_batch_check_columns(const pyx_batch *batch, int block_size);
/* `obj` as a Plan or NULL for None (*ok = 0 with TypeError otherwise). */
pyx_plan *pyx_plan_arg(PyObject *obj, int *ok);

/* ---- functions (cache.c, attention.c, module.c) ------------------------ */

PyObject *pyx_write_kv(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pyx_copy_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pyx_swap_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pyx_paged_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pyx_varlen_attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pyx_merge_states(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pyx_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *pyx_tensor_view(PyObject *self, PyObject *args);
PyObject *pyx_time_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* Fails with TypeError unless nargs == expected. */
int pyx_check_nargs(const char *function, Py_ssize_t nargs, Py_ssize_t expected);

#endif
