/* Decode micro-kernels for FP8 caches on the f32 FMA units, for the CPUs of
 * this family whose bf16 dot products are slower than their FMAs
 * (pa_bf16_dot_is_fast), under every activation dtype.
 *
 * 64 FP8 values become bf16 codes as for the dot products (two byte-table
 * lookups, the sign or-ed in, and a byte interleave: the 64 values in the
 * order {0-7, 16-23, 32-39, 48-55} then {8-15, 24-31, ...}), and each 32-bit
 * lane of those codes, a pair of values, is split into two f32: shifted left
 * by 16 the first, its low half cleared the second. No instruction beyond
 * the lookups and the interleave runs on the shuffle port, which on these
 * Xeons is one of the two FMA ports. So a group of 64 values lands in four
 * f32 vectors in an order of its own, the slot order: slot 16v + l holds
 * value 16a + 8b + 2c + e, where l = 4a + c and v = 2b + e. Q is loaded in
 * slot order (zeros past the head size), so the dot products match; the P V
 * accumulators hold O's whole groups in slot order from one call to the
 * next (pa_attn_ops.o_to_columns), and a group that d cuts short is put in
 * slot order on loading and back on storing. Blocks are those of the f32
 * kernels: 4 rows x 4 keys of dot products reduced by a transpose tree; O in
 * blocks of 64 or 128 columns. */
#include <pthread.h>

#include "avx512bf16-common.h"
#include "prefetch.h"

/* A reorder of one 64-value group held in four vectors: output vector v is
 * two two-source permutations (of inputs 0-1 and 2-3) blended, lanes 8-15
 * from the second. */
typedef struct group_reorder {
  int32_t index[4][16];
} group_reorder;

/* to_slots: column order -> slot order; to_columns: back. */
static group_reorder pa_to_slots, pa_to_columns;

static void reorder_tables(void) {
  for (int v = 0; v < 4; v++) {
    for (int l = 0; l < 16; l++) {
      /* slot 16v + l holds value 16a + 8b + 2c + e (see the top) */
      int a = l / 4, c = l % 4, b = v / 2, e = v % 2;
      pa_to_slots.index[v][l] = (a % 2) * 16 + 8 * b + 2 * c + e;
      /* column vector v, lane l: value 16v + l, with b = l / 8, c = (l / 2) % 4 and
       * e = l % 2, sits in slot vector 2b + e, lane 4v + c */
      int from = (l / 8) * 2 + l % 2;
      pa_to_columns.index[v][l] = (from % 2) * 16 + 4 * v + (l / 2) % 4;
    }
  }
}

PA_INLINE void reorder_group(const group_reorder *r, const __m512 in[4], __m512 out[4]) {
  for (int v = 0; v < 4; v++) {
    __m512i index = _mm512_loadu_si512(r->index[v]);
    __m512 first = _mm512_permutex2var_ps(in[0], index, in[1]);
    __m512 second = _mm512_permutex2var_ps(in[2], index, in[3]);
    out[v] = _mm512_mask_blend_ps(0xff00, first, second);
  }
}

/* The values [c, c + 64) of a row of d FP8 values as f32 in slot order,
 * those at or past d as 0 (a masked byte load reads none of them). */
PA_INLINE void decode(const void *row, size_t c, size_t d, const pa_fp8_tables *t, __m512 out[4]) {
  __m512i pairs[2];
  to_bf16x64(load64((const char *)row + c, tail_mask64(d - c)), t, &pairs[0], &pairs[1]);
  for (int h = 0; h < 2; h++) {
    out[2 * h] = pa512_pair_even(pairs[h]);
    out[2 * h + 1] = pa512_pair_odd(pairs[h]);
  }
}

/* Q row conversion (see pa_load_row_fn): n elements times `factor`, each
 * group of 64 in slot order, zeros up to the last group's end. */
#define PA_DEFINE_LOAD_Q_SLOTS(name, elem_t, load)                                                \
  static void name(void *out, const void *src, size_t n, float factor) {                          \
    float *dst = out;                                                                             \
    const elem_t *in = src;                                                                       \
    const __m512 f = _mm512_set1_ps(factor);                                                      \
    for (size_t g = 0; g < n; g += 64) {                                                          \
      __m512 columns[4], slots[4];                                                                \
      for (int v = 0; v < 4; v++) {                                                               \
        size_t e = g + 16 * (size_t)v;                                                            \
        columns[v] =                                                                              \
            e < n ? _mm512_mul_ps(load(in + e, pa512_tail_mask(n - e)), f) : _mm512_setzero_ps(); \
      }                                                                                           \
      reorder_group(&pa_to_slots, columns, slots);                                                \
      for (int v = 0; v < 4; v++) _mm512_storeu_ps(dst + g + 16 * v, slots[v]);                   \
    }                                                                                             \
  }

PA_DEFINE_LOAD_Q_SLOTS(pa_load_q_slots_f32_avx512bf16, float, pa512_load_f32)
PA_DEFINE_LOAD_Q_SLOTS(pa_load_q_slots_f16_avx512bf16, uint16_t, pa512_load_f16)
PA_DEFINE_LOAD_Q_SLOTS(pa_load_q_slots_bf16_avx512bf16, uint16_t, pa512_load_bf16)

/* rows x keys = 16 dot products of Q rows in slot order (stride ldq) with
 * FP8 K rows (k: `keys` pointers, padded by the caller); rows x `valid` of
 * them stored, the block before finished on the way (pa512_pending_block).
 * Q's vectors are the FMAs' memory operands: sixteen of them would not fit
 * beside the sums. */
PA_INLINE void qk_block(const int rows, const int keys, const pa_fp8_tables *t, size_t d,
                        const float *q, size_t ldq, const void *const *k, float *s, size_t lds,
                        size_t valid, pa512_pending_block *pending) {
  __m512 acc[16];
  for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
  PA_FOR_CHUNKS(c, d, 64, "GCC unroll 2", {
    for (int j = 0; j < keys; j++) {
      __m512 kv[4];
      decode(k[j], c, d, t, kv);
      for (int r = 0; r < rows; r++) {
        for (int v = 0; v < 4; v++) {
          __m512 qv = _mm512_loadu_ps(q + r * ldq + c + 16 * (size_t)v);
          acc[r * keys + j] = _mm512_fmadd_ps(qv, kv[v], acc[r * keys + j]);
        }
      }
    }
    if (c == 0) pa512_finish_block(rows, pending, lds);
  });
  pa512_finish_block(rows, pending, lds);
  pa512_reduce16_begin(acc, pending, s, valid);
}

PA_INLINE void qk_rows(const int rows, const pa_fp8_tables *t, size_t n, size_t d, const float *q,
                       size_t ldq, const void *const *k_rows, float *s, size_t lds,
                       pa_prefetch *prefetch) {
#define QK_BLOCK(keys, k, j, valid, pending) \
  qk_block(rows, keys, t, d, q, ldq, k, s + (j), lds, valid, pending)
  PA512_QK_KEY_BLOCKS(rows, n, k_rows, lds, prefetch, QK_BLOCK);
#undef QK_BLOCK
}

/* S = Q K^T (see pa_qk_fn) with Q as pa_load_q_slots_* writes it. */
PA_INLINE void qk(const pa_fp8_bytes *bytes, size_t m, size_t n, size_t d, const void *q_rows,
                  size_t ldq, const void *const *k_rows, float *s, size_t lds,
                  pa_prefetch *prefetch) {
  const pa_fp8_tables t = fp8_tables(bytes);
  const float *q = q_rows;
#define QK_GROUP(rows, i) \
  qk_rows(rows, &t, n, width, q + (i)*ldq, ldq, k_rows, s + (i)*lds, lds, prefetch)
  PA_WITH_HEAD_SIZE(d, width, PA_ROW_GROUPS(prefetch, m, n, QK_GROUP));
#undef QK_GROUP
}

/* Group g of each row's accumulators (`vectors` per row) reordered in
 * place: a group that d cuts short comes and goes in column order, so that
 * its masked loads and stores stay within the row. */
PA_INLINE void reorder_rows_group(const group_reorder *r, const int rows, const int vectors, int g,
                                  __m512 *acc) {
  for (int i = 0; i < rows; i++) {
    __m512 *group = acc + i * vectors + 4 * g, in[4] = {group[0], group[1], group[2], group[3]};
    reorder_group(r, in, group);
  }
}

/* O[0..rows)[c0 .. c0 + 64 groups) = O * rescale + P V over n keys, c0 a
 * multiple of 64, the accumulators in slot order; each V row decoded once
 * per block. Only the last group may be cut short by d. */
PA_INLINE void pv_block(const int rows, const int groups, const pa_fp8_tables *t, size_t n,
                        size_t c0, size_t d, const float *p, size_t ldp, const void *const *v_rows,
                        float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  const int vectors = 4 * groups, cut = c0 + 64 * (size_t)groups > d;
  __mmask16 mask[8];
  __m512 acc[16];
  pa512_load_o_vectors(rows, vectors, c0, d, o, ldo, rescale, mask, acc);
  if (cut) reorder_rows_group(&pa_to_slots, rows, vectors, groups - 1, acc);
  for (size_t j = 0; j < n; j++) {
    if (j % 8 == 0) pa_prefetch_step(prefetch, j + 8);
    __m512 vv[8];
    for (int g = 0; g < groups; g++) decode(v_rows[j], c0 + 64 * (size_t)g, d, t, vv + 4 * g);
    for (int r = 0; r < rows; r++) {
      __m512 weight = _mm512_set1_ps(p[r * ldp + j]);
      for (int c = 0; c < vectors; c++)
        acc[r * vectors + c] = _mm512_fmadd_ps(weight, vv[c], acc[r * vectors + c]);
    }
  }
  if (cut) reorder_rows_group(&pa_to_columns, rows, vectors, groups - 1, acc);
  pa512_store_o_vectors(rows, vectors, c0, mask, acc, o, ldo);
}

/* One group of `rows` rows (1-4) over every column of O, in blocks of
 * `width` groups of 64 (1 or 2). */
PA_INLINE void pv_rows(const int rows, const int width, const pa_fp8_tables *t, size_t i, size_t m,
                       size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,
                       float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {
  for (size_t c0 = 0; c0 < d; c0 += 64 * (size_t)width) {
    pa_prefetch_span(prefetch, i * d + (size_t)rows * c0,
                     (size_t)rows * PA_MIN(d - c0, 64 * (size_t)width), m * d, n);
    const float *r = pa_rescale_from(rescale, i);
#define PV_BLOCK(groups) \
  pv_block(rows, groups, t, n, c0, d, p + i * ldp, ldp, v_rows, o + i * ldo, ldo, r, prefetch)
    if (width == 2 && d - c0 > 64) {
      PV_BLOCK(2);
    } else {
      PV_BLOCK(1);
    }
#undef PV_BLOCK
  }
}

/* O = O * rescale + P V (see pa_pv_fn), O's whole groups in slot order:
 * rows in groups of 4, then one of 3, 2 or 1, so that each V row is read
 * once per group: 4 or 3 rows take 64-column blocks, 2 or 1 rows 128-column
 * blocks (16 accumulators at most). */
PA_INLINE void pv(const pa_fp8_bytes *bytes, size_t m, size_t n, size_t d, const float *p,
                  size_t ldp, const void *const *v_rows, float *o, size_t ldo, const float *rescale,
                  pa_prefetch *prefetch) {
  const pa_fp8_tables t = fp8_tables(bytes);
#define PV_GROUP(rows, i) \
  pv_rows(rows, (rows) >= 3 ? 1 : 2, &t, i, m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch)
  PA_ROW_GROUPS_OF_4(m, PV_GROUP);
#undef PV_GROUP
}

/* O's whole 64-column groups between slot order and column order. */
PA_INLINE void reorder_row(const group_reorder *r, float *o, size_t d) {
  for (size_t col = 0; col + 64 <= d; col += 64) {
    __m512 in[4], out[4];
    for (int c = 0; c < 4; c++) in[c] = _mm512_loadu_ps(o + col + 16 * c);
    reorder_group(r, in, out);
    for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + col + 16 * c, out[c]);
  }
}

static void pa_o_to_columns_fp8_fma_avx512bf16(float *o, size_t d) {
  reorder_row(&pa_to_columns, o, d);
}

static void pa_o_from_columns_fp8_fma_avx512bf16(float *o, size_t d) {
  reorder_row(&pa_to_slots, o, d);
}

#define PA_DEFINE_QK_PV(suffix, bytes)                                                         \
  static void pa_qk_f32_##suffix##_avx512bf16(size_t m, size_t n, size_t d, const void *q,     \
                                              size_t ldq, const void *const *k_rows, float *s, \
                                              size_t lds, pa_prefetch *prefetch) {             \
    qk(&(bytes), m, n, d, q, ldq, k_rows, s, lds, prefetch);                                   \
  }                                                                                            \
  static void pa_pv_f32_##suffix##_avx512bf16(                                                 \
      size_t m, size_t n, size_t d, const float *p, size_t ldp, const void *const *v_rows,     \
      float *o, size_t ldo, const float *rescale, pa_prefetch *prefetch) {                     \
    pv(&(bytes), m, n, d, p, ldp, v_rows, o, ldo, rescale, prefetch);                          \
  }

PA_DEFINE_QK_PV(e4m3, pa_e4m3_bytes)
PA_DEFINE_QK_PV(e5m2, pa_e5m2_bytes)

/* FP8 caches under every activation dtype on the f32 path: Q converted,
 * scaled and put in slot order for these direct kernels; the packed
 * (prefill) kernels take it in order. Where the bf16 dot products serve,
 * pa_attn_fp8_kernels_avx512bf16 replaces the bf16 and f16 entries. */
void pa_attn_fp8_fma_kernels_avx512bf16(pa_kernels *k) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  static const pa_load_row_fn load_q[PA_NUM_ACT_DTYPES] = {
      [PA_F32] = pa_load_q_slots_f32_avx512bf16,
      [PA_F16] = pa_load_q_slots_f16_avx512bf16,
      [PA_BF16] = pa_load_q_slots_bf16_avx512bf16,
  };
  const pa_dtype caches[2] = {PA_FP8_E4M3, PA_FP8_E5M2};
  const pa_qk_fn qk_fns[2] = {pa_qk_f32_e4m3_avx512bf16, pa_qk_f32_e5m2_avx512bf16};
  const pa_pv_fn pv_fns[2] = {pa_pv_f32_e4m3_avx512bf16, pa_pv_f32_e5m2_avx512bf16};
  pa_bf16_tables_init();
  pthread_once(&once, reorder_tables);
  for (int i = 0; i < 2; i++) {
    for (int act = 0; act < PA_NUM_ACT_DTYPES; act++) {
      pa_attn_ops *ops = &k->attn[act][caches[i]];
      ops->load_q = load_q[act];
      ops->load_q_packed = k->load_row[act];
      ops->q_size = sizeof(float);
      ops->scale_scores = 0;
      ops->qk = qk_fns[i];
      ops->pv = pv_fns[i];
      ops->o_to_columns = pa_o_to_columns_fp8_fma_avx512bf16;
      ops->o_from_columns = pa_o_from_columns_fp8_fma_avx512bf16;
    }
  }
}
