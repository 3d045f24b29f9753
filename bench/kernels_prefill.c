/* pagedattn-kernel-bench --prefill: the packed (prefill) micro-kernels alone, as attend.c's
 * packed_tile calls them for one KV head's tile: pack K and V, Q K^T for every row, the softmax,
 * P V; the `_tiled` cases read a tiled cache's blocks in place instead (no pack; an FP8 cache's
 * conversion per tile, stage_tiled, shows as the pack), where the path has those kernels. The tile
 * and its rows stay in L1/L2 (one item of 128 rows per KV head, 32 query tokens of a 4:1 GQA group,
 * unless --rows says how many, over PA_PACK_KEYS keys, every key visible), so the figures are the
 * kernels' own speed against this machine's f32 FMA and bf16 dot peaks measured in the same
 * process, the ceiling a whole prefill can approach. Internal tool: it includes the library's
 * private headers (src/). */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "kernels_prefill.h"
#include "util.h"

enum { TILE_KEYS = PA_PACK_KEYS };

typedef struct prefill_case {
  const char *name;
  pa_dtype act, cache;
  size_t head_size;
  size_t tiled_block; /* 0: packed; else a tiled cache of blocks of this many tokens */
} prefill_case;

static const prefill_case cases[] = {
    {"bf16", PA_BF16, PA_BF16, 128, 0},
    {"f32", PA_F32, PA_F32, 128, 0},
    {"f16", PA_F16, PA_F16, 128, 0},
    {"fp8_e4m3", PA_BF16, PA_FP8_E4M3, 128, 0},
    {"bf16_hs64", PA_BF16, PA_BF16, 64, 0},
    {"bf16_hs96", PA_BF16, PA_BF16, 96, 0},
    {"bf16_hs256", PA_BF16, PA_BF16, 256, 0},
    {"bf16_tiled", PA_BF16, PA_BF16, 128, 128},
    {"bf16_tiled_bs16", PA_BF16, PA_BF16, 128, 16},
    {"bf16_hs64_tiled", PA_BF16, PA_BF16, 64, 128},
    {"fp8_e4m3_tiled", PA_BF16, PA_FP8_E4M3, 128, 128},
    {"f16_fp8_e4m3_tiled", PA_F16, PA_FP8_E4M3, 128, 128},
};

typedef struct prefill_times {
  double pack, qk, softmax, pv; /* seconds, summed over the timed reps */
} prefill_times;

static prefill_times time_packed_tile(const pa_kernels *k, const prefill_case *c, size_t m,
                                      int reps) {
  const pa_attn_ops *ops = &k->attn[c->act][c->cache];
  size_t d = c->head_size, n = TILE_KEYS, ldq = (d + 63) / 64 * 64;
  size_t row_bytes = d * pa_dtype_size(c->cache);
  char *q = pab_xcalloc(m * ldq, 4), *q_act = pab_xcalloc(ldq, 4);
  char *kv = pab_xcalloc(2 * n, row_bytes);
  float *q_f32 = pab_xcalloc(ldq, sizeof(float)), *s = pab_xcalloc(m * n, sizeof(float));
  float *o = pab_xcalloc(m * d, sizeof(float)), *row_max = pab_xcalloc(m, sizeof(float));
  float *row_sum = pab_xcalloc(m, sizeof(float)), *rescale = pab_xcalloc(m, sizeof(float));
  void *k_packed = pab_xcalloc(1, pa_packed_bytes(d));
  void *v_packed = pab_xcalloc(1, pa_packed_bytes(d));
  const void **k_rows = pab_xcalloc(n, sizeof(void *)), **v_rows = pab_xcalloc(n, sizeof(void *));
  pab_rng rng = {44};
  for (size_t r = 0; r < m; r++) {
    for (size_t e = 0; e < d; e++) q_f32[e] = (float)(pab_rng_next(&rng) % 100) / 50 - 1;
    k->store_row[c->act](q_act, q_f32, d, 1.0f);
    pa_load_row_fn load_q =
        c->tiled_block && ops->load_q_tiled ? ops->load_q_tiled : ops->load_q_packed;
    load_q(q + r * ldq * ops->q_size, q_act, d, 0.1f);
  }
  /* Bytes 0x30-0x3b: small normal values of every cache dtype (see bench/kernels.c). */
  for (size_t i = 0; i < 2 * n * row_bytes; i++) kv[i] = (char)(0x30 | (pab_rng_next(&rng) & 0x0b));
  for (size_t j = 0; j < n; j++) {
    k_rows[j] = kv + j * row_bytes;
    v_rows[j] = kv + (n + j) * row_bytes;
    if (c->tiled_block) { /* anchors in consecutive blocks of the tiled order */
      size_t bs = c->tiled_block, block = j / bs * bs * row_bytes, size = pa_dtype_size(c->cache);
      k_rows[j] = kv + block + (size_t)pa_tiled_key_anchor((int64_t)(j % bs), (int64_t)d) * size;
      v_rows[j] =
          kv + n * row_bytes + block + (size_t)pa_tiled_value_anchor((int64_t)(j % bs)) * size;
    }
  }
  prefill_times t = {0, 0, 0, 0};
  for (int rep = -reps / 4; rep < reps; rep++) { /* negative: warm-up */
    for (size_t i = 0; i < m; i++) {
      row_max[i] = -INFINITY;
      row_sum[i] = 0.0f;
    }
    pa_softmax_tile tile = {.m = m,
                            .n = n,
                            .score_scale = ops->scale_scores ? 0.1f : 1.0f,
                            .row_max = row_max,
                            .row_sum = row_sum,
                            .rescale = rescale,
                            .bf16_weights = ops->p_bf16};
    double t0 = pab_now();
    if (!c->tiled_block) {
      ops->pack_k(k_packed, k_rows, n, d);
      ops->pack_v(v_packed, v_rows, n, d);
    } else if (ops->stage_tiled[0]) { /* FP8: converted for the tiles */
      ops->stage_tiled[0](k_packed, k_rows, n, d, c->tiled_block);
      ops->stage_tiled[1](v_packed, v_rows, n, d, c->tiled_block);
    }
    double t1 = pab_now();
    if (c->tiled_block) {
      ops->qk_tiled(m, n, d, q, ldq, k_rows, k_packed, s, n, NULL);
    } else {
      ops->qk_packed(m, n, d, q, ldq, k_packed, s, n, NULL);
    }
    double t2 = pab_now();
    (c->tiled_block && ops->tiled_p_split ? k->softmax_split_rows
     : ops->packed_p_bf16_rows            ? k->softmax_bf16_rows
                                          : k->softmax)(&tile, s, n);
    double t3 = pab_now();
    if (c->tiled_block) {
      ops->pv_tiled(m, n, d, s, n, v_rows, c->tiled_block, v_packed, o, d, rescale, NULL);
    } else {
      ops->pv_packed(m, n, d, s, n, v_packed, o, d, rescale, NULL);
    }
    double t4 = pab_now();
    if (rep >= 0) {
      t.pack += t1 - t0;
      t.qk += t2 - t1;
      t.softmax += t3 - t2;
      t.pv += t4 - t3;
    }
  }
  if (k->release_tiles) k->release_tiles(); /* before the next roofline's tiles */
  free(q), free(q_act), free(kv), free(q_f32), free(s), free(o), free(row_max), free(row_sum);
  free(rescale), free(k_packed), free(v_packed), free(k_rows), free(v_rows);
  return t;
}

void pab_prefill_kernels(const pa_kernels *k, const pab_machine *mach, size_t rows, int quick) {
  int one = 1;
  pab_roof roof;
  pab_roofline_measure(mach, &one, 1, (size_t)16 << 20, quick ? 0.01 : 0.05, quick ? 2 : 5, &roof);
  printf(
      "# pagedattn-kernel-bench --prefill isa=%s%s cpu=%s fma_gflops=%.1f bf16_gflops=%.1f "
      "(1 thread)\n",
      k->isa, k->bf16_dot ? "" : " (bf16 on FMA)", mach->cpu, roof.fma_gflops, roof.bf16_gflops);
  printf(
      "# one packed tile of %zu rows x %d keys in cache; us per tile for each phase; GFLOP/s "
      "of Q K^T, of P V, and of the whole tile (2 x 2 x rows x keys x d)\n",
      rows, TILE_KEYS);
  printf("%-15s %4s %8s %8s %8s %8s %8s %8s %8s\n", "case", "d", "pack", "qk", "softmax", "pv",
         "qk_gf", "pv_gf", "tile_gf");
  int reps = quick ? 8 : 4000;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const prefill_case *c = &cases[i];
    const pa_attn_ops *ops = &k->attn[c->act][c->cache];
    if (c->tiled_block && (!ops->qk_tiled || c->head_size % ops->tiled_head_multiple)) {
      printf("%-15s %4zu   (no tiled kernels on this path)\n", c->name, c->head_size);
      continue;
    }
    prefill_times t = time_packed_tile(k, c, rows, reps);
    double flops = 2.0 * (double)rows * TILE_KEYS * (double)c->head_size, per = 1e6 / reps;
    double total = t.pack + t.qk + t.softmax + t.pv;
    printf("%-15s %4zu %8.2f %8.2f %8.2f %8.2f %8.1f %8.1f %8.1f\n", c->name, c->head_size,
           t.pack * per, t.qk * per, t.softmax * per, t.pv * per, flops * reps / t.qk * 1e-9,
           flops * reps / t.pv * 1e-9, 2 * flops * reps / total * 1e-9);
  }
}
