/* pagedattn._ext.Batch (a pa_batch over int32 tensors) and
 * pagedattn._ext.Plan (a pa_plan made for a context, a layer geometry and a
 * batch: once per engine step, reused by every layer of that geometry). */
#include "ext.h"

#include <limits.h>

static int int32_vector(PyObject *obj, const char *name, pyx_tensor *t) {
  if (pyx_tensor_get(obj, name, 0, t) < 0) return -1;
  if (pyx_tensor_vector(t, name, PYX_I32) < 0) {
    pyx_tensor_release(t);
    return -1;
  }
  return 0;
}

/* An int32 [num_seqs, max_blocks] table with dense rows, spaced at least a row apart; its
 * row stride in *stride. */
static int block_table(PyObject *obj, int64_t num_seqs, pyx_tensor *t, int64_t *stride) {
  char shape[160];
  if (pyx_tensor_get(obj, "block_tables", 0, t) < 0) return -1;
  if (t->elem != PYX_I32) {
    pyx_invalid("block_tables has dtype %s; it must be int32", pyx_dtype_of(t));
  } else if (t->ndim != 2 || t->shape[0] != num_seqs) {
    pyx_invalid(
        "block_tables has shape %s; it must be [num_seqs, max_blocks] with num_seqs = "
        "len(seq_lens) = %lld",
        pyx_shape_string(t, shape, sizeof shape), (long long)num_seqs);
  } else if ((t->shape[1] > 1 && t->strides[1] != 1) ||
             (t->shape[0] > 1 && t->strides[0] < t->shape[1])) {
    pyx_invalid(
        "block_tables (shape %s) has strides [%lld, %lld]; it needs a column stride of 1 and "
        "a row stride >= %lld",
        pyx_shape_string(t, shape, sizeof shape), (long long)t->strides[0],
        (long long)t->strides[1], (long long)t->shape[1]);
  } else {
    *stride = t->shape[0] > 1 ? t->strides[0] : t->shape[1];
    if (*stride <= INT_MAX) return 0;
    pyx_invalid("block_tables has a row stride or width of %lld elements; at most %d",
                (long long)*stride, INT_MAX);
  }
  pyx_tensor_release(t);
  return -1;
}

/* Batch(query_start_loc, seq_lens, block_tables, slot_mapping=None) */
static PyObject *batch_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"query_start_loc", "seq_lens", "block_tables", "slot_mapping", NULL};
  PyObject *objs[4] = {NULL, NULL, NULL, Py_None};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O:Batch", keywords, &objs[0], &objs[1],
                                   &objs[2], &objs[3])) {
    return NULL;
  }
  pyx_tensor slots = {0};
  if (objs[3] != Py_None) {
    if (pyx_tensor_get(objs[3], "slot_mapping", 0, &slots) < 0) return NULL;
    if (pyx_tensor_vector(&slots, "slot_mapping", PYX_I64) < 0) {
      pyx_tensor_release(&slots);
      return NULL;
    }
  }
  pyx_tensor qsl = {0}, lens = {0}, table = {0};
  PyObject *result = NULL;
  int64_t num_seqs = 0, table_stride = 0;
  if (int32_vector(objs[1], "seq_lens", &lens) < 0) goto done;
  num_seqs = lens.shape[0];
  if (num_seqs > INT_MAX) {
    pyx_invalid("seq_lens has %lld entries; at most %d sequences", (long long)num_seqs, INT_MAX);
    goto done;
  }
  if (int32_vector(objs[0], "query_start_loc", &qsl) < 0) goto done;
  if (qsl.shape[0] != num_seqs + 1) {
    pyx_invalid("query_start_loc has %lld entries; seq_lens has %lld, so it needs %lld",
                (long long)qsl.shape[0], (long long)num_seqs, (long long)num_seqs + 1);
  } else if (block_table(objs[2], num_seqs, &table, &table_stride) == 0) {
    pyx_batch *self = (pyx_batch *)type->tp_alloc(type, 0);
    if (self) {
      self->batch = (pa_batch){
          .num_seqs = (int)num_seqs,
          .query_start_loc = (const int32_t *)qsl.data,
          .seq_lens = (const int32_t *)lens.data,
          .block_tables = (const int32_t *)table.data,
          .block_table_stride = (int)table_stride,
      };
      self->columns = table.shape[1];
      self->num_rows = ((const int32_t *)qsl.data)[num_seqs];
      self->slot_mapping = objs[3] != Py_None ? (const int64_t *)slots.data : NULL;
      self->num_slots = objs[3] != Py_None ? slots.shape[0] : 0;
      for (int i = 0; i < 4; i++) self->tensors[i] = objs[i] == Py_None ? NULL : Py_NewRef(objs[i]);
      result = (PyObject *)self;
    }
  }
done:
  pyx_tensor_release(&table);
  pyx_tensor_release(&qsl);
  pyx_tensor_release(&lens);
  pyx_tensor_release(&slots);
  return result;
}

int pyx_batch_check_columns(const pyx_batch *b, int block_size) {
  if (b->columns >= b->batch.block_table_stride || block_size < 1) return 0;
  for (int s = 0; s < b->batch.num_seqs; s++) {
    int64_t blocks = ((int64_t)b->batch.seq_lens[s] + block_size - 1) / block_size;
    if (blocks > b->columns) {
      pyx_out_of_range(
          "seq_lens[%d] = %d needs %lld blocks of %d tokens but block_tables has "
          "%lld columns",
          s, (int)b->batch.seq_lens[s], (long long)blocks, block_size, (long long)b->columns);
      return -1;
    }
  }
  return 0;
}

static void batch_dealloc(PyObject *self) {
  pyx_batch *b = (pyx_batch *)self;
  for (int i = 0; i < 4; i++) Py_XDECREF(b->tensors[i]);
  Py_TYPE(self)->tp_free(self);
}

static PyObject *batch_get(PyObject *self, void *closure) {
  pyx_batch *b = (pyx_batch *)self;
  return (intptr_t)closure == 1 ? PyLong_FromLongLong(b->num_rows)
                                : PyLong_FromLong(b->batch.num_seqs);
}

static PyGetSetDef batch_getset[] = {
    {"num_seqs", batch_get, NULL, NULL, NULL},
    {"num_rows", batch_get, NULL, "query_start_loc[num_seqs]: the query rows the batch owns.",
     (void *)1},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject pyx_batch_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pagedattn._ext.Batch",
    .tp_basicsize = sizeof(pyx_batch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Batch(query_start_loc, seq_lens, block_tables, slot_mapping=None)\n\n"
        "A pa_batch over int32 tensors: query_start_loc [num_seqs + 1], seq_lens\n"
        "[num_seqs], block_tables [num_seqs, max_blocks] with dense rows; and the\n"
        "int64 slots of the step's new tokens, which forward writes. The tensors are\n"
        "read at each call, not copied.",
    .tp_new = batch_tp_new,
    .tp_dealloc = batch_dealloc,
    .tp_getset = batch_getset,
};

pyx_batch *pyx_batch_arg(PyObject *obj) {
  if (!PyObject_TypeCheck(obj, &pyx_batch_type)) {
    PyErr_Format(PyExc_TypeError, "expected a pagedattn._ext.Batch, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
  }
  return (pyx_batch *)obj;
}

/* Plan(ctx, layer, batch) */
static PyObject *plan_tp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *keywords[] = {"ctx", "layer", "batch", NULL};
  PyObject *ctx_obj, *layer_obj, *batch_obj;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:Plan", keywords, &ctx_obj, &layer_obj,
                                   &batch_obj)) {
    return NULL;
  }
  pyx_context *context = pyx_context_arg(ctx_obj);
  pyx_layer *layer = context ? pyx_layer_arg(layer_obj) : NULL;
  pyx_batch *batch = layer ? pyx_batch_arg(batch_obj) : NULL;
  if (!batch) return NULL;
  const pa_layer *l = pyx_layer_for(layer, PA_F32); /* a plan depends on the geometry only */
  if (!l) return NULL;
  pa_plan *plan = NULL;
  pa_status status;
  char message[PYX_MESSAGE_SIZE];
  PYX_CALL(context, status = pa_plan_create(context->ctx, l, &batch->batch, &plan), message);
  if (status != PA_OK) return pyx_raise_status(status, message);
  pyx_plan *self = (pyx_plan *)type->tp_alloc(type, 0);
  if (!self) {
    pa_plan_destroy(plan);
    return NULL;
  }
  self->plan = plan;
  self->context = Py_NewRef(ctx_obj);
  return (PyObject *)self;
}

static void plan_dealloc(PyObject *self) {
  pyx_plan *p = (pyx_plan *)self;
  pa_plan_destroy(p->plan);
  Py_XDECREF(p->context);
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject pyx_plan_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pagedattn._ext.Plan",
    .tp_basicsize = sizeof(pyx_plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Plan(ctx, layer, batch)\n\n"
        "The split of a batch's work over ctx's threads, for every layer with the\n"
        "layer's num_heads, num_kv_heads and head_size (pa_plan_create).",
    .tp_new = plan_tp_new,
    .tp_dealloc = plan_dealloc,
};

pyx_plan *pyx_plan_arg(PyObject *obj, int *ok) {
  *ok = 1;
  if (obj == Py_None) return NULL;
  if (!PyObject_TypeCheck(obj, &pyx_plan_type)) {
    *ok = 0;
    PyErr_Format(PyExc_TypeError, "plan must be a pagedattn._ext.Plan or None, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
  }
  return (pyx_plan *)obj;
}
