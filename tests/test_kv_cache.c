/*
 * pa_write_kv, pa_copy_blocks and pa_swap_blocks, byte for byte: every
 * F16/BF16 code and every rounding midpoint of the narrow formats go through
 * pa_write_kv into every cache dtype; padding slots, repeated slots and
 * chains of block pairs follow the header's order rules. The same writes,
 * copies and swaps over strided caches (0.2: block_stride, head_stride) in
 * every layout of harness.h, swaps between caches of different layouts
 * included, must store the same tiles and leave every byte between the
 * tiles as it was.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pa_context *g_ctx1, *g_ctx3;

static pa_kv_cache make_cache(int64_t num_blocks, int block_size, int nkv, int d, pa_dtype t,
                              float k_scale, float v_scale) {
  pa_kv_cache c;
  memset(&c, 0, sizeof c);
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.num_kv_heads = nkv;
  c.head_size = d;
  c.dtype = t;
  c.k_scale = k_scale;
  c.v_scale = v_scale;
  c.key = tu_malloc(hx_cache_bytes(&c));
  c.value = tu_malloc(hx_cache_bytes(&c));
  return c;
}

static void free_cache(pa_kv_cache *c) {
  free(c->key);
  free(c->value);
}

/* Writes num_tokens rows (already filled) through pa_write_kv and compares
 * the whole cache with what the contract says it must hold. */
static void write_and_check(const char *tag, pa_context *ctx, const pa_kv_cache *cache,
                            const void *key, int64_t ks, const void *value, int64_t vs,
                            pa_dtype src, int64_t n, const int64_t *slots) {
  size_t bytes = hx_cache_bytes(cache);
  unsigned char *img[4];
  for (int i = 0; i < 4; i++) {
    img[i] = tu_malloc(bytes);
    hx_gather_tiles(cache, i % 2, img[i]);
  }
  hx_expect_write(cache, img[0], img[1], img[2], img[3], key, ks, value, vs, src, n, slots);
  pa_status st = pa_write_kv(ctx, cache, key, ks, value, vs, src, n, slots);
  TU_CHECK(st == PA_OK, "%s: pa_write_kv: %s (%s)", tag, pa_status_string(st), pa_last_error());
  hx_compare_cache(tag, cache, img[0], img[1], img[2], img[3]);
  for (int i = 0; i < 4; i++) free(img[i]);
}

/* Slots 0 .. n-1 in random order, with padding rows mixed in; returns the
 * number of rows (>= n). */
static int64_t shuffled_slots(tu_rng *rng, int64_t n, int64_t *slots) {
  int64_t rows = 0;
  int64_t *perm = tu_malloc((size_t)n * sizeof(int64_t));
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(tu_next(rng) % (uint64_t)(i + 1)), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int64_t i = 0; i < n; i++) {
    if (tu_chance(rng, 0.05)) slots[rows++] = -1 - (int64_t)tu_int(rng, 0, 1000);
    slots[rows++] = perm[i];
  }
  free(perm);
  return rows;
}

/* Every value of `values` (f32) stored as src dtype rows, written into a
 * cache of each dtype, with unit and random FP8 scales. */
static void write_values(tu_rng *rng, const char *what, const float *values, int64_t count,
                         pa_dtype src, pa_kv_layout order) {
  const int nkv = 2, d = 64, width = nkv * d, bs = 16;
  int64_t tokens = (count + width - 1) / width;
  int64_t blocks = (tokens + bs - 1) / bs + 1;
  int64_t ks = width + 3, vs = width;
  void *krows = hx_alloc_rows(tokens + blocks * bs, ks, src);
  void *vrows = hx_alloc_rows(tokens + blocks * bs, vs, src);
  int64_t *slots = tu_malloc((size_t)(2 * (tokens + 1)) * sizeof(int64_t));
  for (int t = PA_F32; t <= PA_FP8_E5M2; t++) {
    for (int scaled = 0; scaled < 2; scaled++) {
      if (scaled && t < PA_FP8_E4M3) continue;
      char tag[128];
      snprintf(tag, sizeof tag, "write %s as %s into %s%s cache%s", what, pa_dtype_name(src),
               order == PA_KV_TILED ? "tiled " : "", pa_dtype_name((pa_dtype)t),
               scaled ? " with random scales" : "");
      float k_scale = scaled ? (float)tu_range(rng, 0.01, 3.0) : 1.0f;
      float v_scale = scaled ? (float)tu_range(rng, 0.01, 3.0) : 1.0f;
      pa_kv_cache cache = make_cache(blocks, bs, nkv, d, (pa_dtype)t, k_scale, v_scale);
      cache.layout = order;
      tu_fill_random_bytes(rng, cache.key, hx_cache_bytes(&cache));
      tu_fill_random_bytes(rng, cache.value, hx_cache_bytes(&cache));
      int64_t rows = shuffled_slots(rng, tokens, slots);
      /* Row r carries values in order (keys) and reversed (values); padding
       * rows carry them too, so skipping them is checked. */
      for (int64_t r = 0; r < rows; r++) {
        int64_t tok = slots[r] < 0 ? 0 : slots[r];
        for (int c = 0; c < width; c++) {
          int64_t i = tok * width + c;
          float kx = i < count ? values[i] : 0.0f;
          float vx = i < count ? values[count - 1 - i] : 1.0f;
          ref_store(krows, r * ks + c, hx_ref_dtype(src), kx);
          ref_store(vrows, r * vs + c, hx_ref_dtype(src), vx);
        }
      }
      write_and_check(tag, scaled ? g_ctx3 : g_ctx1, &cache, krows, ks, vrows, vs, src, rows,
                      slots);
      free_cache(&cache);
    }
  }
  free(krows);
  free(vrows);
  free(slots);
}

static void test_write_conversions(tu_rng *rng) {
  /* Every F16 and BF16 code as a source: exact values, so each cache dtype
   * sees its whole rounding (and saturation, and NaN / inf) range. */
  float *v = tu_malloc(65536 * sizeof(float));
  for (int code = 0; code < 65536; code++) v[code] = ref_f16_decode((uint16_t)code);
  write_values(rng, "every f16 code", v, 65536, PA_F16, PA_KV_ROWS);
  for (int code = 0; code < 65536; code++) v[code] = ref_bf16_decode((uint16_t)code);
  write_values(rng, "every bf16 code", v, 65536, PA_BF16, PA_KV_ROWS);
  free(v);

  /* F32 sources: every midpoint between adjacent finite values of F16, BF16
   * and FP8 and the floats either side of it (the ties and near-ties that
   * round-to-even must get right), both signs, plus specials. */
  static const pa_dtype narrow[] = {PA_F16, PA_BF16, PA_FP8_E4M3, PA_FP8_E5M2};
  static const unsigned max_finite[] = {0x7BFF, 0x7F7F, 0x7E, 0x7B};
  int64_t cap = 6 * (0x7BFF + 0x7F7F + 0x7E + 0x7B) + 64, n = 0;
  float *f = tu_malloc((size_t)cap * sizeof(float));
  for (int i = 0; i < 4; i++) {
    ref_dtype rt = hx_ref_dtype(narrow[i]);
    for (unsigned code = 0; code < max_finite[i]; code++) {
      unsigned char lo_b[2] = {(unsigned char)code, (unsigned char)(code >> 8)};
      unsigned char hi_b[2] = {(unsigned char)(code + 1), (unsigned char)((code + 1) >> 8)};
      float lo = ref_load(lo_b, 0, rt), hi = ref_load(hi_b, 0, rt);
      float mid = (float)(0.5 * ((double)lo + (double)hi));
      float three[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
      for (int k = 0; k < 3; k++) {
        f[n++] = three[k];
        f[n++] = -three[k];
      }
    }
  }
  static const float specials[] = {0.0f,     -0.0f,    INFINITY, -INFINITY, NAN,
                                   FLT_MAX,  -FLT_MAX, FLT_MIN,  -FLT_MIN,  0x1p-149f,
                                   65504.0f, 65520.0f, 65536.0f, 448.0f,    464.0f,
                                   480.0f,   1e6f,     57344.0f, 61440.0f,  -1e30f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) f[n++] = specials[i];
  write_values(rng, "f32 midpoints and specials", f, n, PA_F32, PA_KV_ROWS);
  free(f);
}

/* Two rows for one slot: the later wins, also when the two rows are far
 * apart in a long write that a context may split over threads. */
static void test_write_order(void) {
  const int nkv = 1, d = 8, bs = 4, half = 3000;
  pa_kv_cache cache = make_cache(half / bs + 1, bs, nkv, d, PA_F32, 1, 1);
  size_t bytes = hx_cache_bytes(&cache);
  memset(cache.key, 0, bytes);
  memset(cache.value, 0, bytes);
  int64_t n = 2 * half;
  float *k = tu_malloc((size_t)n * d * sizeof(float)),
        *v = tu_malloc((size_t)n * d * sizeof(float));
  int64_t *slots = tu_malloc((size_t)n * sizeof(int64_t));
  for (int64_t t = 0; t < n; t++) {
    slots[t] = (t % half + 7 * (t / half)) % half; /* each slot twice */
    for (int c = 0; c < d; c++) {
      k[t * d + c] = (float)t;
      v[t * d + c] = (float)-t;
    }
  }
  write_and_check("repeated slots (later wins)", g_ctx3, &cache, k, d, v, d, PA_F32, n, slots);
  write_and_check("repeated slots (later wins), 1 thread", g_ctx1, &cache, v, d, k, d, PA_F32, n,
                  slots);

  /* Only padding, and no tokens at all: nothing changes. */
  for (int64_t t = 0; t < n; t++) slots[t] = -1 - (t % 3);
  write_and_check("only padding", g_ctx3, &cache, k, d, v, d, PA_F32, n, slots);
  write_and_check("zero tokens", g_ctx1, &cache, k, d, v, d, PA_F32, 0, slots);
  free(k);
  free(v);
  free(slots);
  free_cache(&cache);
}

/* ---- block copies -------------------------------------------------------- */

static size_t block_bytes(const pa_kv_cache *c) {
  return hx_cache_bytes(c) / (size_t)c->num_blocks;
}

/* Applies pairs in order to images of a cache, as the header defines. */
static void apply_pairs(const pa_kv_cache *src, unsigned char *src_key, unsigned char *src_val,
                        unsigned char *dst_key, unsigned char *dst_val, const int64_t *pairs,
                        int64_t n) {
  size_t bb = block_bytes(src);
  for (int64_t i = 0; i < n; i++) {
    memmove(dst_key + (size_t)pairs[2 * i + 1] * bb, src_key + (size_t)pairs[2 * i] * bb, bb);
    memmove(dst_val + (size_t)pairs[2 * i + 1] * bb, src_val + (size_t)pairs[2 * i] * bb, bb);
  }
}

static void compare_bytes(const char *tag, const pa_kv_cache *c, const unsigned char *key,
                          const unsigned char *val) {
  size_t bytes = hx_cache_bytes(c), bb = block_bytes(c);
  for (int side = 0; side < 2; side++) {
    const unsigned char *got = side ? c->value : c->key, *want = side ? val : key;
    if (memcmp(got, want, bytes) == 0) continue;
    size_t i = 0;
    while (got[i] == want[i]) i++;
    TU_CHECK(0, "%s: %s differs first in block %zu (byte %zu of the block)", tag,
             side ? "value" : "key", i / bb, i % bb);
  }
  tu_checks++;
}

static void test_copy_blocks(tu_rng *rng) {
  for (int t = PA_F32; t <= PA_FP8_E5M2; t++) {
    const int num_caches = 3;
    const int64_t nb = 12;
    pa_kv_cache caches[3];
    unsigned char *img[3][2];
    for (int i = 0; i < num_caches; i++) {
      caches[i] = make_cache(nb, 17, 2, 24, (pa_dtype)t, 0.5f, 0.25f);
      /* Random bytes, NaN patterns included: a copy moves bytes. */
      tu_fill_random_bytes(rng, caches[i].key, hx_cache_bytes(&caches[i]));
      tu_fill_random_bytes(rng, caches[i].value, hx_cache_bytes(&caches[i]));
      for (int s = 0; s < 2; s++) {
        img[i][s] = tu_malloc(hx_cache_bytes(&caches[i]));
        memcpy(img[i][s], s ? caches[i].value : caches[i].key, hx_cache_bytes(&caches[i]));
      }
    }
    /* A chain 0 -> 1 -> 2 -> 3 (block 3 ends with block 0's original), a
     * repeated destination (5 ends as 8), a self copy, then random pairs. */
    int64_t pairs[2 * 40] = {0, 1, 1, 2, 2, 3, 7, 5, 8, 5, 4, 4, 9, 10, 10, 9};
    int64_t n = 8;
    while (n < 40) {
      pairs[2 * n] = tu_int(rng, 0, (int)nb - 1);
      pairs[2 * n + 1] = tu_int(rng, 0, (int)nb - 1);
      n++;
    }
    for (int i = 0; i < num_caches; i++)
      apply_pairs(&caches[i], img[i][0], img[i][1], img[i][0], img[i][1], pairs, n);
    pa_status st = pa_copy_blocks(t % 2 ? g_ctx3 : g_ctx1, caches, num_caches, pairs, n);
    char tag[64];
    snprintf(tag, sizeof tag, "pa_copy_blocks %s", pa_dtype_name((pa_dtype)t));
    TU_CHECK(st == PA_OK, "%s: %s (%s)", tag, pa_status_string(st), pa_last_error());
    for (int i = 0; i < num_caches; i++) compare_bytes(tag, &caches[i], img[i][0], img[i][1]);

    /* No pairs, no caches: nothing happens. */
    st = pa_copy_blocks(g_ctx1, caches, num_caches, pairs, 0);
    TU_CHECK(st == PA_OK, "pa_copy_blocks with no pairs: %s", pa_last_error());
    st = pa_copy_blocks(g_ctx1, caches, 0, pairs, n);
    TU_CHECK(st == PA_OK, "pa_copy_blocks with no caches: %s", pa_last_error());
    for (int i = 0; i < num_caches; i++) {
      compare_bytes("pa_copy_blocks without work", &caches[i], img[i][0], img[i][1]);
      free(img[i][0]);
      free(img[i][1]);
      free_cache(&caches[i]);
    }
  }
}

static void test_swap_blocks(tu_rng *rng) {
  for (int t = PA_F32; t <= PA_FP8_E5M2; t++) {
    /* A small device pool and a larger host pool of the same geometry. */
    pa_kv_cache dev = make_cache(10, 16, 4, 32, (pa_dtype)t, 0.75f, 2.0f);
    pa_kv_cache host = make_cache(25, 16, 4, 32, (pa_dtype)t, 0.75f, 2.0f);
    pa_kv_cache *all[2] = {&dev, &host};
    unsigned char *img[2][2];
    for (int i = 0; i < 2; i++) {
      size_t bytes = hx_cache_bytes(all[i]);
      tu_fill_random_bytes(rng, all[i]->key, bytes);
      tu_fill_random_bytes(rng, all[i]->value, bytes);
      img[i][0] = tu_malloc(bytes);
      img[i][1] = tu_malloc(bytes);
      memcpy(img[i][0], all[i]->key, bytes);
      memcpy(img[i][1], all[i]->value, bytes);
    }
    /* Out to the host pool (24 twice: the later pair wins), then back in. */
    int64_t out[2 * 6] = {0, 24, 3, 11, 9, 0, 3, 24, 5, 12, 6, 13};
    int64_t in[2 * 4] = {24, 1, 11, 2, 0, 9, 13, 9};
    char tag[64];
    snprintf(tag, sizeof tag, "pa_swap_blocks %s out", pa_dtype_name((pa_dtype)t));
    apply_pairs(&dev, img[0][0], img[0][1], img[1][0], img[1][1], out, 6);
    pa_status st = pa_swap_blocks(g_ctx3, &dev, &host, out, 6);
    TU_CHECK(st == PA_OK, "%s: %s (%s)", tag, pa_status_string(st), pa_last_error());
    compare_bytes(tag, &host, img[1][0], img[1][1]);
    compare_bytes("pa_swap_blocks leaves its source alone", &dev, img[0][0], img[0][1]);

    snprintf(tag, sizeof tag, "pa_swap_blocks %s in", pa_dtype_name((pa_dtype)t));
    apply_pairs(&host, img[1][0], img[1][1], img[0][0], img[0][1], in, 4);
    st = pa_swap_blocks(g_ctx1, &host, &dev, in, 4);
    TU_CHECK(st == PA_OK, "%s: %s (%s)", tag, pa_status_string(st), pa_last_error());
    compare_bytes(tag, &dev, img[0][0], img[0][1]);
    compare_bytes("pa_swap_blocks leaves its source alone", &host, img[1][0], img[1][1]);

    st = pa_swap_blocks(g_ctx1, &host, &dev, in, 0);
    TU_CHECK(st == PA_OK, "pa_swap_blocks with no pairs: %s", pa_last_error());
    compare_bytes("pa_swap_blocks without pairs", &dev, img[0][0], img[0][1]);
    for (int i = 0; i < 2; i++) {
      free(img[i][0]);
      free(img[i][1]);
      free_cache(all[i]);
    }
  }
}

/* Many large blocks, so that a context has something to split. */
static void test_big_copy(tu_rng *rng) {
  pa_kv_cache c = make_cache(64, 16, 8, 128, PA_BF16, 1, 1);
  size_t bytes = hx_cache_bytes(&c);
  tu_fill_random_bytes(rng, c.key, bytes);
  tu_fill_random_bytes(rng, c.value, bytes);
  unsigned char *k = tu_malloc(bytes), *v = tu_malloc(bytes);
  memcpy(k, c.key, bytes);
  memcpy(v, c.value, bytes);
  int64_t pairs[2 * 32];
  for (int i = 0; i < 32; i++) {
    pairs[2 * i] = i;
    pairs[2 * i + 1] = 32 + (i * 7) % 32;
  }
  apply_pairs(&c, k, v, k, v, pairs, 32);
  pa_status st = pa_copy_blocks(g_ctx3, &c, 1, pairs, 32);
  TU_CHECK(st == PA_OK, "big pa_copy_blocks: %s", pa_last_error());
  compare_bytes("big pa_copy_blocks", &c, k, v);
  free(k);
  free(v);
  free_cache(&c);
}

/* ---- strided caches ------------------------------------------------------- */

typedef struct strided_cache {
  pa_kv_cache c;
  hx_cache_mem mem;
} strided_cache;

static strided_cache make_ordered(tu_rng *rng, hx_layout layout, pa_kv_layout order,
                                  int64_t num_blocks, int block_size, int nkv, int d, pa_dtype t) {
  strided_cache s;
  memset(&s, 0, sizeof s);
  s.c.layout = order;
  s.c.num_blocks = num_blocks;
  s.c.block_size = block_size;
  s.c.num_kv_heads = nkv;
  s.c.head_size = d;
  s.c.dtype = t;
  s.c.k_scale = 0.5f;
  s.c.v_scale = 0.25f;
  hx_cache_alloc(rng, &s.c, layout, &s.mem);
  /* Random tile bytes (NaN patterns included): copies move bytes. */
  unsigned char *tiles = tu_malloc(hx_cache_bytes(&s.c) + 1);
  for (int side = 0; side < 2; side++) {
    tu_fill_random_bytes(rng, tiles, hx_cache_bytes(&s.c));
    hx_scatter_tiles(&s.c, side, tiles);
  }
  free(tiles);
  return s;
}

static strided_cache make_strided(tu_rng *rng, hx_layout layout, int64_t num_blocks, int block_size,
                                  int nkv, int d, pa_dtype t) {
  return make_ordered(rng, layout, PA_KV_ROWS, num_blocks, block_size, nkv, d, t);
}

/* Dense images of both sides' tiles. */
static void gather_both(const pa_kv_cache *c, unsigned char *img[2]) {
  for (int side = 0; side < 2; side++) {
    img[side] = tu_malloc(hx_cache_bytes(c) + 1);
    hx_gather_tiles(c, side, img[side]);
  }
}

/* The cache's tiles against dense images, and its padding. */
static void compare_tiles(const char *tag, const strided_cache *s, unsigned char *const img[2]) {
  size_t bytes = hx_cache_bytes(&s->c), bb = bytes / (size_t)s->c.num_blocks;
  unsigned char *got = tu_malloc(bytes + 1);
  for (int side = 0; side < 2; side++) {
    hx_gather_tiles(&s->c, side, got);
    if (memcmp(got, img[side], bytes) == 0) continue;
    size_t i = 0;
    while (got[i] == img[side][i]) i++;
    TU_CHECK(0, "%s: %s tiles differ first in block %zu (byte %zu of its tiles)", tag,
             side ? "value" : "key", i / bb, i % bb);
  }
  tu_checks++;
  free(got);
  hx_check_padding(tag, &s->c, &s->mem);
}

/* pa_write_kv into every layout and cache dtype: the tiles the contract
 * says, nothing between them; long enough that 3 threads split each row. */
static void test_strided_write(tu_rng *rng) {
  static const int block_sizes[] = {1, 5, 16};
  for (int layout = HX_DENSE; layout < HX_NUM_LAYOUTS; layout++) {
    for (int t = PA_F32; t <= PA_FP8_E5M2; t++) {
      const int nkv = 3, d = 40, bs = block_sizes[(layout + t) % 3], width = nkv * d;
      int64_t nb = 160 / bs + 2;
      pa_dtype src = (pa_dtype)((layout + 2 * t) % 3);
      char tag[128];
      snprintf(tag, sizeof tag, "write %s rows into a %s cache of block_size %d, %s layout",
               pa_dtype_name(src), pa_dtype_name((pa_dtype)t), bs,
               hx_layout_name((hx_layout)layout));
      strided_cache s = make_strided(rng, (hx_layout)layout, nb, bs, nkv, d, (pa_dtype)t);
      int64_t *slots = tu_malloc((size_t)(2 * nb * bs + 2) * sizeof(int64_t));
      int64_t rows = shuffled_slots(rng, nb * bs - 3, slots);
      slots[rows++] = slots[0]; /* a repeated slot: the later row wins */
      int64_t ks = width + 2, vs = width;
      void *krows = hx_alloc_rows(rows, ks, src), *vrows = hx_alloc_rows(rows, vs, src);
      hx_fill_rows(rng, krows, ks, rows, width, src, 3.0);
      hx_fill_rows(rng, vrows, vs, rows, width, src, 3.0);
      write_and_check(tag, t % 2 ? g_ctx3 : g_ctx1, &s.c, krows, ks, vrows, vs, src, rows, slots);
      hx_check_padding(tag, &s.c, &s.mem);
      free(krows);
      free(vrows);
      free(slots);
      hx_cache_free(&s.mem);
    }
  }
}

/* pa_copy_blocks over three caches of three layouts at once: chains,
 * repeated destinations, self copies; with 1 and 3 threads, and big enough
 * for 3 threads to cut blocks mid-tile. */
static void test_strided_copy(tu_rng *rng) {
  for (int round = 0; round < 2 * HX_NUM_LAYOUTS; round++) {
    const int num_caches = 3;
    const int64_t nb = 12;
    int big = round >= HX_NUM_LAYOUTS;
    strided_cache caches[3];
    pa_kv_cache plain[3];
    unsigned char *img[3][2];
    for (int i = 0; i < num_caches; i++) {
      hx_layout layout = (hx_layout)((round + 2 * i) % HX_NUM_LAYOUTS);
      caches[i] = make_strided(rng, layout, nb, big ? 16 : 3 + i, 2 + i % 2, big ? 128 : 12,
                               (pa_dtype)((round + i) % 5));
      plain[i] = caches[i].c;
      gather_both(&plain[i], img[i]);
    }
    int64_t pairs[2 * 40] = {0, 1, 1, 2, 2, 3, 7, 5, 8, 5, 4, 4, 9, 10, 10, 9};
    int64_t n = 8;
    while (n < 40) {
      pairs[2 * n] = tu_int(rng, 0, (int)nb - 1);
      pairs[2 * n + 1] = tu_int(rng, 0, (int)nb - 1);
      n++;
    }
    for (int i = 0; i < num_caches; i++)
      apply_pairs(&plain[i], img[i][0], img[i][1], img[i][0], img[i][1], pairs, n);
    pa_status st = pa_copy_blocks(round % 2 ? g_ctx1 : g_ctx3, plain, num_caches, pairs, n);
    char tag[96];
    snprintf(tag, sizeof tag, "pa_copy_blocks over %s, %s and %s caches%s",
             hx_layout_name((hx_layout)(round % HX_NUM_LAYOUTS)),
             hx_layout_name((hx_layout)((round + 2) % HX_NUM_LAYOUTS)),
             hx_layout_name((hx_layout)((round + 4) % HX_NUM_LAYOUTS)), big ? ", big blocks" : "");
    TU_CHECK(st == PA_OK, "%s: %s (%s)", tag, pa_status_string(st), pa_last_error());
    for (int i = 0; i < num_caches; i++) {
      compare_tiles(tag, &caches[i], img[i]);
      free(img[i][0]);
      free(img[i][1]);
      hx_cache_free(&caches[i].mem);
    }
  }
}

/* Swaps blocks from `dev` to `host` and back (one context of 3 threads
 * one way, of 1 the other), checking every tile against an image and that
 * each source keeps every byte; frees both caches. */
static void swap_round_trip(strided_cache dev, strided_cache host, int big, const char *what,
                            const hx_layout layouts[2]) {
  unsigned char *img[2][2];
  gather_both(&dev.c, img[0]);
  gather_both(&host.c, img[1]);
  int64_t out[2 * 6] = {0, 24, 3, 11, 9, 0, 3, 24, 5, 12, 6, 13};
  int64_t in[2 * 4] = {24, 1, 11, 2, 0, 9, 13, 9};
  char tag[160];
  snprintf(tag, sizeof tag, "pa_swap_blocks %s, %s to %s", what, hx_layout_name(layouts[0]),
           hx_layout_name(layouts[1]));
  unsigned char *dev_bytes[2] = {NULL, NULL};
  for (int m = 0; m < 2; m++) {
    if (!dev.mem.buf[m]) continue;
    dev_bytes[m] = tu_malloc(dev.mem.bytes[m]);
    memcpy(dev_bytes[m], dev.mem.buf[m], dev.mem.bytes[m]);
  }
  apply_pairs(&dev.c, img[0][0], img[0][1], img[1][0], img[1][1], out, 6);
  pa_status st = pa_swap_blocks(big ? g_ctx3 : g_ctx1, &dev.c, &host.c, out, 6);
  TU_CHECK(st == PA_OK, "%s: %s (%s)", tag, pa_status_string(st), pa_last_error());
  compare_tiles(tag, &host, img[1]);
  for (int m = 0; m < 2; m++)
    TU_CHECK(!dev_bytes[m] || memcmp(dev_bytes[m], dev.mem.buf[m], dev.mem.bytes[m]) == 0,
             "%s: the source's buffer %d changed", tag, m);

  snprintf(tag, sizeof tag, "pa_swap_blocks %s, %s back to %s", what, hx_layout_name(layouts[1]),
           hx_layout_name(layouts[0]));
  apply_pairs(&host.c, img[1][0], img[1][1], img[0][0], img[0][1], in, 4);
  st = pa_swap_blocks(big ? g_ctx1 : g_ctx3, &host.c, &dev.c, in, 4);
  TU_CHECK(st == PA_OK, "%s: %s (%s)", tag, pa_status_string(st), pa_last_error());
  compare_tiles(tag, &dev, img[0]);
  snprintf(tag, sizeof tag, "pa_swap_blocks %s leaves its source alone", what);
  compare_tiles(tag, &host, img[1]);
  for (int m = 0; m < 2; m++) {
    free(img[m][0]);
    free(img[m][1]);
    free(dev_bytes[m]);
  }
  hx_cache_free(&dev.mem);
  hx_cache_free(&host.mem);
}

/* pa_swap_blocks between caches of the same geometry in different layouts:
 * a strided device cache and a dense host pool, both ways, padded ones,
 * and two strided layouts; the source keeps every byte, the destination
 * its padding. */
static void test_strided_swap(tu_rng *rng) {
  static const hx_layout pairs_of_layouts[][2] = {
      {HX_VLLM, HX_DENSE},          {HX_DENSE, HX_VLLM},
      {HX_VLLM_PADDED, HX_DENSE},   {HX_SEPARATE_PADDED, HX_VLLM_PADDED},
      {HX_BLOCK_PADDED, HX_VLLM},   {HX_VLLM, HX_VLLM_PADDED},
      {HX_DENSE_EXPLICIT, HX_VLLM}, {HX_VLLM_PADDED, HX_SEPARATE_PADDED},
  };
  for (int i = 0; i < (int)(sizeof pairs_of_layouts / sizeof pairs_of_layouts[0]); i++) {
    pa_dtype t = (pa_dtype)(i % 5);
    int big = i % 3 == 0; /* enough bytes for 3 threads to share the blocks */
    int bs = big ? 16 : 7, nkv = 4, d = big ? 128 : 20;
    strided_cache dev = make_strided(rng, pairs_of_layouts[i][0], 10, bs, nkv, d, t);
    strided_cache host = make_strided(rng, pairs_of_layouts[i][1], 25, bs, nkv, d, t);
    char what[64];
    snprintf(what, sizeof what, "%s", pa_dtype_name(t));
    swap_round_trip(dev, host, big, what, pairs_of_layouts[i]);
  }
}

/* ---- tiled caches (0.3) ----------------------------------------------------- */

/* pa_write_kv into tiled caches of every cache dtype from every source
 * dtype, in every stride layout, block sizes 16, 32 and 48 and head sizes
 * 16 to 128: shuffled slots with padding rows, repeated slots (the later
 * row wins), rows long enough for 3 threads to split; the cache compared
 * element by element through the harness's index of the tiled order, and
 * every byte between the tiles left alone. */
static void test_tiled_write(tu_rng *rng) {
  static const int block_sizes[] = {16, 32, 48}, head_sizes[] = {16, 48, 64, 128};
  for (int t = PA_F32; t <= PA_FP8_E5M2; t++) {
    for (int src_i = 0; src_i < 3; src_i++) {
      int i = t * 3 + src_i;
      hx_layout layout = (hx_layout)(i % HX_NUM_LAYOUTS);
      pa_dtype src = (pa_dtype)src_i;
      const int nkv = 1 + i % 3, d = head_sizes[i % 4], bs = block_sizes[i % 3], width = nkv * d;
      int64_t nb = 64 / bs + 2;
      char tag[160];
      snprintf(tag, sizeof tag,
               "write %s rows into a tiled %s cache of block_size %d, head_size %d, %d kv heads, "
               "%s layout",
               pa_dtype_name(src), pa_dtype_name((pa_dtype)t), bs, d, nkv, hx_layout_name(layout));
      strided_cache s = make_ordered(rng, layout, PA_KV_TILED, nb, bs, nkv, d, (pa_dtype)t);
      s.c.k_scale = (float)tu_range(rng, 0.01, 3.0);
      s.c.v_scale = (float)tu_range(rng, 0.01, 3.0);
      int64_t *slots = tu_malloc((size_t)(2 * nb * bs + 8) * sizeof(int64_t));
      int64_t rows = shuffled_slots(rng, nb * bs - 5, slots);
      for (int r = 0; r < 4; r++, rows++) /* repeated slots: the later row wins */
        slots[rows] = slots[tu_int(rng, 0, (int)rows - 1)];
      int64_t ks = width + tu_int(rng, 0, 3), vs = width + tu_int(rng, 0, 3);
      void *krows = hx_alloc_rows(rows, ks, src), *vrows = hx_alloc_rows(rows, vs, src);
      hx_fill_rows(rng, krows, ks, rows, width, src, 3.0);
      hx_fill_rows(rng, vrows, vs, rows, width, src, 3.0);
      write_and_check(tag, i % 2 ? g_ctx3 : g_ctx1, &s.c, krows, ks, vrows, vs, src, rows, slots);
      hx_check_padding(tag, &s.c, &s.mem);
      free(krows);
      free(vrows);
      free(slots);
      hx_cache_free(&s.mem);
    }
  }
}

/* Every BF16 code through a tiled cache of each dtype (with unit and
 * random FP8 scales): the conversions of a write into rows, each element
 * placed in the tiled order. */
static void test_tiled_conversions(tu_rng *rng) {
  float *v = tu_malloc(65536 * sizeof(float));
  for (int code = 0; code < 65536; code++) v[code] = ref_bf16_decode((uint16_t)code);
  write_values(rng, "every bf16 code", v, 65536, PA_BF16, PA_KV_TILED);
  free(v);
}

/* The tiled order read off memory as the header draws it, not through the
 * harness's index: each (block, KV head) key tile is block_size / 16
 * groups of head_size / 2 rows of 16 tokens x 2 elements, each value tile
 * head_size / 16 groups of block_size / 2 rows of 16 elements x 2 tokens.
 * Every slot gets a token whose elements all hold different codes: f32
 * values slot * 1000 + h * 100 + e (keys; values negated), and raw bf16
 * bits written from bf16 rows (a same-dtype write places them as they
 * are), dense and in vLLM's padded page. */
static uint32_t hand_code(pa_dtype t, int side, int64_t slot, int h, int e, int nkv, int d) {
  if (t == PA_F32) {
    float x = (float)(slot * 1000 + h * 100 + e) * (side ? -1.0f : 1.0f);
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
  }
  return (uint32_t)((1 + (slot * nkv + h) * d + e) * 2 + side) & 0xFFFFu;
}

static void test_tiled_by_hand(tu_rng *rng) {
  static const int shapes[][3] = {{32, 48, 2}, {16, 16, 1}, {48, 32, 3}};
  for (int i = 0; i < 6; i++) {
    int bs = shapes[i % 3][0], d = shapes[i % 3][1], nkv = shapes[i % 3][2], width = nkv * d;
    pa_dtype t = i < 3 ? PA_F32 : PA_BF16;
    size_t es = pa_dtype_size(t);
    hx_layout layout = i % 2 ? HX_VLLM_PADDED : HX_DENSE;
    const int64_t nb = 3;
    strided_cache s = make_ordered(rng, layout, PA_KV_TILED, nb, bs, nkv, d, t);
    int64_t n = nb * bs;
    int64_t *slots = tu_malloc((size_t)n * sizeof(int64_t));
    unsigned char *rows[2] = {tu_malloc((size_t)(n * width) * es),
                              tu_malloc((size_t)(n * width) * es)};
    for (int64_t r = 0; r < n; r++) {
      slots[r] = (r * 7 + 3) % n; /* every slot once, out of order */
      for (int side = 0; side < 2; side++)
        for (int h = 0; h < nkv; h++)
          for (int e = 0; e < d; e++) {
            uint32_t code = hand_code(t, side, slots[r], h, e, nkv, d);
            memcpy(rows[side] + (size_t)(r * width + h * d + e) * es, &code, es);
          }
    }
    char tag[128];
    snprintf(tag, sizeof tag, "tiled %s cache by hand, block_size %d, head_size %d, %s layout",
             pa_dtype_name(t), bs, d, hx_layout_name(layout));
    pa_status st =
        pa_write_kv(i % 2 ? g_ctx3 : g_ctx1, &s.c, rows[0], width, rows[1], width, t, n, slots);
    TU_CHECK(st == PA_OK, "%s: pa_write_kv: %s (%s)", tag, pa_status_string(st), pa_last_error());
    int64_t tile_stride = s.c.head_stride ? s.c.head_stride : (int64_t)bs * d;
    int64_t block_stride = s.c.block_stride ? s.c.block_stride : nkv * tile_stride;
    long bad = 0;
    for (int64_t b = 0; b < nb; b++) {
      for (int h = 0; h < nkv; h++) {
        for (int side = 0; side < 2; side++) {
          const unsigned char *tile = (const unsigned char *)(side ? s.c.value : s.c.key) +
                                      (size_t)(b * block_stride + h * tile_stride) * es;
          int groups = side ? d / 16 : bs / 16, rows_per_group = side ? bs / 2 : d / 2;
          int64_t pos = 0;
          for (int g = 0; g < groups; g++)
            for (int row = 0; row < rows_per_group; row++)
              for (int col = 0; col < 16; col++)
                for (int pair = 0; pair < 2; pair++, pos++) {
                  int tok = side ? 2 * row + pair : 16 * g + col;
                  int e = side ? 16 * g + col : 2 * row + pair;
                  uint32_t want = hand_code(t, side, b * bs + tok, h, e, nkv, d), got = 0;
                  memcpy(&got, tile + (size_t)pos * es, es);
                  if (got != want && bad++ < 4)
                    TU_CHECK(0,
                             "%s: %s tile of block %lld head %d, element %lld of the tile "
                             "(group %d, row %d, column %d, pair %d): bits 0x%X, want token %d's "
                             "element %d, 0x%X",
                             tag, side ? "value" : "key", (long long)b, h, (long long)pos, g, row,
                             col, pair, (unsigned)got, tok, e, (unsigned)want);
                }
          TU_CHECK(pos == (int64_t)bs * d, "%s: the walk covered %lld elements", tag,
                   (long long)pos);
        }
      }
    }
    TU_CHECK(bad == 0, "%s: %ld elements out of place", tag, bad);
    hx_check_padding(tag, &s.c, &s.mem);
    free(slots);
    free(rows[0]);
    free(rows[1]);
    hx_cache_free(&s.mem);
  }
}

/* Two rows for one slot of a tiled cache: the later wins, also in a long
 * write that 3 threads split. */
static void test_tiled_write_order(void) {
  const int nkv = 1, d = 16, bs = 16, half = 3000;
  pa_kv_cache cache = make_cache(half / bs + 1, bs, nkv, d, PA_BF16, 1, 1);
  cache.layout = PA_KV_TILED;
  size_t bytes = hx_cache_bytes(&cache);
  memset(cache.key, 0, bytes);
  memset(cache.value, 0, bytes);
  int64_t n = 2 * half;
  float *k = tu_malloc((size_t)n * d * sizeof(float)),
        *v = tu_malloc((size_t)n * d * sizeof(float));
  int64_t *slots = tu_malloc((size_t)n * sizeof(int64_t));
  for (int64_t t = 0; t < n; t++) {
    slots[t] = (t % half + 7 * (t / half)) % half; /* each slot twice */
    for (int c = 0; c < d; c++) {
      k[t * d + c] = (float)(t % 251);
      v[t * d + c] = (float)-(t % 241);
    }
  }
  write_and_check("tiled, repeated slots (later wins)", g_ctx3, &cache, k, d, v, d, PA_F32, n,
                  slots);
  write_and_check("tiled, repeated slots (later wins), 1 thread", g_ctx1, &cache, v, d, k, d,
                  PA_F32, n, slots);
  for (int64_t t = 0; t < n; t++) slots[t] = -1 - (t % 3);
  write_and_check("tiled, only padding", g_ctx3, &cache, k, d, v, d, PA_F32, n, slots);
  free(k);
  free(v);
  free(slots);
  free_cache(&cache);
}

/* pa_copy_blocks over three tiled caches at once (a rows cache among them
 * every other round), each in its own stride layout: chains, repeated
 * destinations, self copies; with 1 and 3 threads, and big enough for 3
 * threads to cut blocks mid-tile. The tiles move as stored: compared in
 * token rows through each cache's own order. */
static void test_tiled_copy(tu_rng *rng) {
  for (int round = 0; round < HX_NUM_LAYOUTS; round++) {
    const int num_caches = 3;
    const int64_t nb = 12;
    int big = round % 3 == 2;
    strided_cache caches[3];
    pa_kv_cache plain[3];
    unsigned char *img[3][2];
    for (int i = 0; i < num_caches; i++) {
      hx_layout layout = (hx_layout)((round + 2 * i) % HX_NUM_LAYOUTS);
      pa_kv_layout order = round % 2 && i == 1 ? PA_KV_ROWS : PA_KV_TILED;
      caches[i] = make_ordered(rng, layout, order, nb, big ? 32 : 16 * (1 + i % 3), 1 + i % 2,
                               big ? 128 : 16 + 32 * (i % 2), (pa_dtype)((round + i) % 5));
      plain[i] = caches[i].c;
      gather_both(&plain[i], img[i]);
    }
    int64_t pairs[2 * 40] = {0, 1, 1, 2, 2, 3, 7, 5, 8, 5, 4, 4, 9, 10, 10, 9};
    int64_t n = 8;
    while (n < 40) {
      pairs[2 * n] = tu_int(rng, 0, (int)nb - 1);
      pairs[2 * n + 1] = tu_int(rng, 0, (int)nb - 1);
      n++;
    }
    for (int i = 0; i < num_caches; i++)
      apply_pairs(&plain[i], img[i][0], img[i][1], img[i][0], img[i][1], pairs, n);
    pa_status st = pa_copy_blocks(round % 2 ? g_ctx1 : g_ctx3, plain, num_caches, pairs, n);
    char tag[128];
    snprintf(tag, sizeof tag, "pa_copy_blocks over tiled caches, round %d (%s, %s, %s)%s", round,
             hx_layout_name((hx_layout)(round % HX_NUM_LAYOUTS)),
             hx_layout_name((hx_layout)((round + 2) % HX_NUM_LAYOUTS)),
             hx_layout_name((hx_layout)((round + 4) % HX_NUM_LAYOUTS)), big ? ", big blocks" : "");
    TU_CHECK(st == PA_OK, "%s: %s (%s)", tag, pa_status_string(st), pa_last_error());
    for (int i = 0; i < num_caches; i++) {
      compare_tiles(tag, &caches[i], img[i]);
      free(img[i][0]);
      free(img[i][1]);
      hx_cache_free(&caches[i].mem);
    }
  }
}

/* pa_swap_blocks between two tiled caches of different strides (a strided
 * device cache and a dense host pool, both ways, padded ones, vLLM's page),
 * every dtype; the source keeps every byte, the destination its padding. */
static void test_tiled_swap(tu_rng *rng) {
  static const hx_layout pairs_of_layouts[][2] = {
      {HX_VLLM, HX_DENSE},
      {HX_DENSE, HX_VLLM_PADDED},
      {HX_SEPARATE_PADDED, HX_VLLM},
      {HX_BLOCK_PADDED, HX_DENSE},
      {HX_DENSE_EXPLICIT, HX_SEPARATE_PADDED},
  };
  for (int i = 0; i < 5; i++) {
    pa_dtype t = (pa_dtype)i;
    int big = i % 2 == 0;
    int bs = big ? 32 : 16, nkv = 2, d = big ? 128 : 48;
    strided_cache dev = make_ordered(rng, pairs_of_layouts[i][0], PA_KV_TILED, 10, bs, nkv, d, t);
    strided_cache host = make_ordered(rng, pairs_of_layouts[i][1], PA_KV_TILED, 25, bs, nkv, d, t);
    char what[64];
    snprintf(what, sizeof what, "tiled %s", pa_dtype_name(t));
    swap_round_trip(dev, host, big, what, pairs_of_layouts[i]);
  }
}

/* An initialiser of 0.1's nine fields still describes the dense layout
 * (the new fields are zero). -Wextra warns about the missing fields, which
 * is the point here. */
static void test_positional_initialiser(void) {
  enum { NB = 3, BS = 2, NKV = 2, D = 4 };
  static float key[NB * NKV * BS * D], value[NB * NKV * BS * D];
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
  pa_kv_cache cache = {key, value, NB, BS, NKV, D, PA_F32, 1.0f, 1.0f};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  TU_CHECK(cache.block_stride == 0 && cache.head_stride == 0,
           "a nine-field initialiser leaves block_stride %lld, head_stride %lld",
           (long long)cache.block_stride, (long long)cache.head_stride);
  float rows[2][NKV * D];
  for (int i = 0; i < NKV * D; i++) rows[0][i] = (float)i, rows[1][i] = (float)(100 + i);
  int64_t slots[2] = {5, 0}; /* block 2 offset 1, block 0 offset 0 */
  write_and_check("nine-field initialiser", g_ctx1, &cache, rows, NKV * D, rows, NKV * D, PA_F32, 2,
                  slots);
  /* Dense by hand: [block][head][offset][dim]. */
  TU_CHECK(key[((2 * NKV + 1) * BS + 1) * D + 3] == (float)(D + 3) && value[D + 3] == 0.0f &&
               key[(1 * BS + 0) * D + 2] == (float)(100 + D + 2),
           "nine-field initialiser: not the dense layout");

  /* 0.2's eleven fields (the strides): layout stays PA_KV_ROWS, the order
   * of 0.2. */
  static float key2[NB * NKV * BS * D], value2[NB * NKV * BS * D];
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
  pa_kv_cache cache2 = {key2, value2, NB, BS, NKV, D, PA_F32, 1.0f, 1.0f, 0, 0};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
  TU_CHECK(cache2.layout == PA_KV_ROWS, "an eleven-field initialiser leaves layout %d",
           (int)cache2.layout);
  write_and_check("eleven-field initialiser", g_ctx3, &cache2, rows, NKV * D, rows, NKV * D, PA_F32,
                  2, slots);
  TU_CHECK(key2[((2 * NKV + 1) * BS + 1) * D + 3] == (float)(D + 3) && value2[D + 3] == 0.0f &&
               key2[(1 * BS + 0) * D + 2] == (float)(100 + D + 2),
           "eleven-field initialiser: not the rows order");
}

int main(int argc, char **argv) {
  uint64_t seed = tu_seed_from_args(argc, argv, 777);
  if (pa_context_create(1, &g_ctx1) != PA_OK || pa_context_create(3, &g_ctx3) != PA_OK) {
    fprintf(stderr, "pa_context_create: %s\n", pa_last_error());
    return 1;
  }
  printf("test_kv_cache: seed %llu, isa %s\n", (unsigned long long)seed, pa_context_isa(g_ctx1));
  double t0 = tu_now();
  tu_rng rng;
  tu_rng_seed(&rng, seed);
  test_write_conversions(&rng);
  test_write_order();
  test_copy_blocks(&rng);
  test_swap_blocks(&rng);
  test_big_copy(&rng);
  test_strided_write(&rng);
  test_strided_copy(&rng);
  test_strided_swap(&rng);
  test_positional_initialiser();
  double t_tiled = tu_now();
  test_tiled_by_hand(&rng);
  test_tiled_write(&rng);
  test_tiled_conversions(&rng);
  test_tiled_write_order();
  test_tiled_copy(&rng);
  test_tiled_swap(&rng);
  printf("test_kv_cache: tiled caches %.2f s\n", tu_now() - t_tiled);
  pa_context_destroy(g_ctx1);
  pa_context_destroy(g_ctx3);
  printf("test_kv_cache: %.2f s; fp8 elements matching only x * (1 / scale): %ld\n", tu_now() - t0,
         hx_alt_matches);
  return tu_finish("test_kv_cache");
}
