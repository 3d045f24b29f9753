/* See fuzz_common.h. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "fuzz_common.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

/* ---- decoding ------------------------------------------------------------ */

unsigned fz_u8(fz_in *in) { return in->at < in->size ? in->data[in->at++] : 0u; }

uint32_t fz_u32(fz_in *in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | fz_u8(in);
  return v;
}

int fz_range(fz_in *in, int lo, int hi) { return lo + (int)(fz_u8(in) % (unsigned)(hi - lo + 1)); }

/* An exhausted input reads zeros, which must decode to the tame choice. */
int fz_one_in(fz_in *in, int n) { return fz_u8(in) % (unsigned)n == (unsigned)n - 1; }

int64_t fz_edgy(fz_in *in, int64_t lo, int64_t hi, const int64_t *edges, int num_edges) {
  unsigned b = fz_u8(in);
  if (hi < lo) hi = lo; /* an empty range of ids: lo it is */
  uint64_t span = (uint64_t)hi - (uint64_t)lo + 1;
  if (b < 232 || num_edges == 0) return (int64_t)((uint64_t)lo + (span ? b % span : b));
  return edges[(b - 232) % (unsigned)num_edges];
}

int64_t fz_sat_add(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

int fz_int(int64_t v) { return v < INT_MIN ? INT_MIN : v > INT_MAX ? INT_MAX : (int)v; }

float fz_scale(fz_in *in, int *extreme) {
  static const float tame[] = {1.0f, 0.5f, 0.25f, 2.0f, 0.125f, 4.0f, 0.01f, 0.75f};
  static const float hostile[] = {0.0f,   -1.0f, NAN,    INFINITY, -INFINITY, -0.0f,
                                  1e-40f, 3e38f, 1e-30f, 1e30f,    -INFINITY, 1e-7f};
  unsigned b = fz_u8(in);
  if (b < 232) return tame[b % 8];
  float v = hostile[(b - 232) % 12];
  if (isfinite(v) && v != 0.0f && (fabsf(v) < 1e-6f || fabsf(v) > 1e6f)) *extreme = 1;
  return v;
}

static pa_context *g_contexts[2];

static pa_context *context(int i) {
  if (!g_contexts[i] && pa_context_create(i + 1, &g_contexts[i]) != PA_OK)
    fz_fail("pa_context_create(%d): %s", i + 1, pa_last_error());
  return g_contexts[i];
}

pa_context *fz_context(fz_in *in) {
  unsigned b = fz_u8(in);
  return b == 255 ? NULL : context((int)(b % 2));
}

pa_context *fz_context_other(const pa_context *ctx) {
  return ctx == context(0) ? context(1) : context(0);
}

/* ---- failures -------------------------------------------------------------- */

void fz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FUZZ FINDING: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

/* ---- the model ------------------------------------------------------------- */

void fz_need(fz_expect *e, int cond, pa_status status) {
  if (cond) e->must |= FZ_BIT(status);
}

void fz_allow(fz_expect *e, int cond, pa_status status) {
  if (cond) e->may |= FZ_BIT(status);
}

int fz_may_succeed(const fz_expect *e) { return e->must == 0; }

static const char *mask_names(unsigned mask, char *buf, size_t size) {
  buf[0] = '\0';
  for (int s = 0; s <= PA_ERR_OUT_OF_MEMORY; s++)
    if (mask & FZ_BIT(s)) {
      size_t n = strlen(buf);
      snprintf(buf + n, size - n, "%s%s", n ? ", " : "", pa_status_string((pa_status)s));
    }
  return buf;
}

void fz_plant_stale_message(void) { (void)pa_validate_head_size(-1); }

/* With FZ_STATS set, the statuses seen are printed at exit: how much of the
 * fuzzing reaches the success path. */
static long g_statuses[PA_ERR_OUT_OF_MEMORY + 1];

static void print_stats(void) {
  fprintf(stderr, "statuses:");
  for (int s = 0; s <= PA_ERR_OUT_OF_MEMORY; s++)
    fprintf(stderr, " %s %ld%s", pa_status_string((pa_status)s), g_statuses[s],
            s < PA_ERR_OUT_OF_MEMORY ? "," : "\n");
}

int fz_check_status(const fz_expect *e, pa_status status) {
  static int registered;
  if (!registered && getenv("FZ_STATS")) registered = atexit(print_stats) == 0;
  if ((unsigned)status <= PA_ERR_OUT_OF_MEMORY) g_statuses[status]++;
  char must[96], may[96];
  const char *msg = pa_last_error();
  if (status == PA_OK) {
    FZ_ASSERT(e->must == 0, "%s returned ok for a call the contract rejects (%s)", e->entry,
              mask_names(e->must, must, sizeof must));
    return 1;
  }
  /* Running out of memory is an honest answer to any call. */
  unsigned allowed = e->must | e->may | FZ_BIT(PA_ERR_OUT_OF_MEMORY);
  FZ_ASSERT(allowed & FZ_BIT(status), "%s returned %s (%s); the contract allows %s (maybe %s)",
            e->entry, pa_status_string(status), msg, mask_names(e->must, must, sizeof must),
            mask_names(e->may, may, sizeof may));
  FZ_ASSERT(msg && strstr(msg, e->entry),
            "%s failed with %s but its message \"%s\" is stale or "
            "does not name it",
            e->entry, pa_status_string(status), msg ? msg : "(null)");
  return 0;
}

int fz_cache_geometry_ok(const pa_kv_cache *c) {
  if (c->num_blocks < 0 || c->block_size < 1 || c->num_kv_heads < 1 || c->num_kv_heads > 65536 ||
      c->head_size < 1 || c->head_size > 1024 || (int)c->dtype < 0 || (int)c->dtype > 4)
    return 0;
  if (c->dtype == PA_FP8_E4M3 || c->dtype == PA_FP8_E5M2) {
    if (!isfinite(c->k_scale) || !(c->k_scale > 0) || !isfinite(c->v_scale) || !(c->v_scale > 0))
      return 0;
  }
  /* The header: non-zero strides at least the dense ones, a zero
   * block_stride meaning num_kv_heads * block_size * head_size whatever
   * head_stride is, and every tile's bytes addressable. */
  __int128 tile = (__int128)c->block_size * c->head_size;
  if (c->head_stride < 0 || c->block_stride < 0) return 0;
  if (c->head_stride != 0 && c->head_stride < tile) return 0;
  __int128 head = c->head_stride ? c->head_stride : tile;
  __int128 block = c->block_stride ? c->block_stride : c->num_kv_heads * tile;
  if (block < c->num_kv_heads * head) return 0;
  if (c->num_blocks == 0) return 1;
  /* Below 2^127, but its bytes need not be: compare elements, not bytes. */
  __int128 end = (c->num_blocks - 1) * block + (c->num_kv_heads - 1) * head + tile;
  return end <= (__int128)INT64_MAX / (__int128)pa_dtype_size(c->dtype);
}

void fz_model_cache(fz_expect *e, const pa_kv_cache *c) {
  if (!c) {
    fz_need(e, 1, PA_ERR_INVALID_ARGUMENT);
    return;
  }
  fz_need(e, !fz_cache_geometry_ok(c), PA_ERR_INVALID_ARGUMENT);
  fz_need(e, c->num_blocks > 0 && (!c->key || !c->value), PA_ERR_INVALID_ARGUMENT);
  fz_allow(e, !c->key || !c->value, PA_ERR_INVALID_ARGUMENT);
}

uint64_t fz_extent(int64_t rows, int64_t stride, int64_t width, size_t elem) {
  if (rows <= 0) return 0;
  if (stride < width) return UINT64_MAX;
  unsigned __int128 bytes =
      ((unsigned __int128)(rows - 1) * (uint64_t)stride + (uint64_t)width) * elem;
  return bytes > (unsigned __int128)INT64_MAX ? UINT64_MAX : (uint64_t)bytes;
}

void fz_model_rows(fz_expect *e, int64_t rows, int64_t stride, int64_t width, size_t elem) {
  uint64_t bytes = fz_extent(rows > 0 ? rows : 1, stride, width, elem);
  int bad = bytes == UINT64_MAX;
  if (rows > 0) {
    fz_need(e, bad, PA_ERR_INVALID_ARGUMENT);
    /* Beyond any real address space: rejecting it is as good as serving. */
    fz_allow(e, bytes > ((uint64_t)1 << 47), PA_ERR_INVALID_ARGUMENT);
  } else {
    fz_allow(e, bad, PA_ERR_INVALID_ARGUMENT);
  }
}

/* ---- buffers --------------------------------------------------------------- */

int fz_alloc(fz_buf *b, uint64_t bytes) {
  memset(b, 0, sizeof *b);
  b->bytes = bytes;
  if (bytes <= FZ_DENSE_LIMIT) {
    b->p = malloc((size_t)bytes);
    if (!b->p && bytes) fz_fail("out of memory");
    return 1;
  }
  if (bytes > FZ_SPARSE_LIMIT) return 0;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t round = ((size_t)bytes + page - 1) / page * page;
  b->map_bytes = round + page;
  b->map = mmap(NULL, b->map_bytes, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (b->map == MAP_FAILED) {
    b->map = NULL;
    return 0;
  }
  if (mprotect((char *)b->map + round, page, PROT_NONE) != 0) fz_fail("mprotect failed");
  b->p = (unsigned char *)b->map + (round - (size_t)bytes);
  return 1;
}

void fz_alloc_token(fz_buf *b) {
  memset(b, 0, sizeof *b);
  b->p = malloc(0); /* non-NULL in glibc and ASan; no byte of it may be read */
  if (!b->p) b->p = malloc(1);
}

void fz_free(fz_buf *b) {
  if (b->map) {
    munmap(b->map, b->map_bytes);
  } else {
    free(b->p);
  }
  memset(b, 0, sizeof *b);
}

unsigned char *fz_copy(const void *p, size_t bytes) {
  unsigned char *copy = malloc(bytes ? bytes : 1);
  if (!copy) fz_fail("out of memory");
  if (bytes) memcpy(copy, p, bytes);
  return copy;
}

static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

static int64_t total_rows(const fz_rows *r) { return r->rows + r->extra_rows; }

static int64_t window(const fz_rows *r, int64_t row) {
  if (row == total_rows(r) - 1) return r->width;
  return min_i64(r->stride, r->width + FZ_PAD_WINDOW);
}

static uint64_t windows_bytes(const fz_rows *r) {
  int64_t n = total_rows(r);
  if (n == 0) return 0;
  return ((uint64_t)(n - 1) * (uint64_t)window(r, 0) + (uint64_t)r->width) * r->elem;
}

void fz_rows_free(fz_rows *r) {
  fz_free(&r->buf);
  free(r->copy);
  memset(r, 0, sizeof *r);
}

int fz_rows_alloc(fz_rows *r, int64_t rows, int64_t extra_rows, int64_t stride, int64_t width,
                  size_t elem, int shape_ok) {
  memset(r, 0, sizeof *r);
  r->stride = stride;
  r->width = width;
  r->elem = elem;
  if (!shape_ok || rows < 0 || extra_rows < 0 || stride < width || rows + extra_rows == 0) {
    fz_alloc_token(&r->buf);
    return 1;
  }
  /* More rows than the windows' budget can hold are not worth a call. */
  if (rows + extra_rows > FZ_DENSE_LIMIT) return 0;
  uint64_t bytes = fz_extent(rows + extra_rows, stride, width, elem);
  if (bytes == UINT64_MAX || !fz_alloc(&r->buf, bytes)) return 0;
  r->rows = rows;
  r->extra_rows = extra_rows;
  if (windows_bytes(r) > FZ_DENSE_LIMIT) { /* sparse, but not this sparse */
    fz_rows_free(r);
    return 0;
  }
  return 1;
}

static unsigned char *row_at(const fz_rows *r, int64_t row) {
  return r->buf.p + (uint64_t)row * (uint64_t)r->stride * r->elem;
}

void fz_rows_fill(fz_rows *r, uint64_t seed, pa_dtype t, double mag) {
  tu_rng rng;
  tu_rng_seed(&rng, seed);
  ref_dtype rt = (ref_dtype)t;
  for (int64_t row = 0; row < total_rows(r); row++) {
    unsigned char *p = row_at(r, row);
    if (row < r->rows) {
      for (int64_t c = 0; c < r->width; c++) ref_store(p, c, rt, (float)tu_range(&rng, -mag, mag));
      tu_fill_canary(p + r->width * (int64_t)r->elem,
                     (size_t)(window(r, row) - r->width) * r->elem);
    } else {
      tu_fill_canary(p, (size_t)window(r, row) * r->elem);
    }
  }
  free(r->copy);
  r->copy = malloc(windows_bytes(r) + 1);
  if (!r->copy) fz_fail("out of memory");
  unsigned char *at = r->copy;
  for (int64_t row = 0; row < total_rows(r); row++) {
    size_t n = (size_t)window(r, row) * r->elem;
    memcpy(at, row_at(r, row), n);
    at += n;
  }
}

/* Compares windows with the copy; data rows' first width elements only
 * when `data` is set. */
static int compare_windows(const fz_rows *r, int data) {
  const unsigned char *at = r->copy;
  for (int64_t row = 0; row < total_rows(r); row++) {
    size_t n = (size_t)window(r, row) * r->elem, skip = 0;
    if (!data && row < r->rows) skip = (size_t)r->width * r->elem;
    if (memcmp(at + skip, row_at(r, row) + skip, n - skip) != 0) return 0;
    at += n;
  }
  return 1;
}

int fz_rows_unchanged(const fz_rows *r) { return !r->copy || compare_windows(r, 1); }
int fz_rows_canaries_ok(const fz_rows *r) { return !r->copy || compare_windows(r, 0); }

/* ---- caches ---------------------------------------------------------------- */

int64_t fz_cache_elems(const pa_kv_cache *c) {
  return c->num_blocks * c->block_size * c->num_kv_heads * c->head_size;
}

/* Strides: tame values mostly (dense, vLLM's interleaved buffer, padding
 * after tiles and blocks), hostile ones now and then. */
static void decode_strides(fz_in *in, fz_cache *fc) {
  pa_kv_cache *c = &fc->c;
  /* Geometry past the limits (by one at most, or far) makes strides
   * meaningless; they are built from 1 then, so nothing overflows. */
  int sane = c->block_size >= 1 && c->head_size >= 1 && c->head_size <= 1025 &&
             c->num_kv_heads >= 1 && c->num_kv_heads <= 65537;
  int64_t tile = sane ? (int64_t)c->block_size * c->head_size : 1;
  int64_t heads = sane ? c->num_kv_heads : 1;
  unsigned mode = fz_u8(in) % 16;
  int64_t pad_head = fz_range(in, 1, 9), pad_block = fz_range(in, 0, 9);
  switch (mode) {
    case 10: /* vLLM: [num_blocks][num_kv_heads][2 * block_size][head_size] */
      c->head_stride = 2 * tile;
      c->block_stride = heads * c->head_stride;
      fc->shared = 1;
      fc->value_at = tile;
      break;
    case 11: /* the same with padding in each head's slot and after each block */
      c->head_stride = 2 * tile + pad_head;
      c->block_stride = heads * c->head_stride + pad_block;
      fc->shared = 1;
      fc->value_at = tile + fz_range(in, 0, (int)pad_head);
      break;
    case 12: /* separate buffers, padding after each tile and block */
      c->head_stride = tile + pad_head;
      c->block_stride = heads * c->head_stride + pad_block;
      break;
    case 13: /* adjacent heads, padded blocks */
      c->block_stride = heads * tile + pad_block + 1;
      break;
    case 14: /* hostile */
      c->head_stride = FZ_EDGY(in, tile, tile + 2, tile - 1, -1, 0, INT64_MIN, INT64_MAX,
                               INT64_MAX / 2, (int64_t)1 << 40, 2 * tile);
      c->block_stride =
          FZ_EDGY(in, heads * tile, heads * tile + 2, heads * tile - 1, -1, 0, INT64_MIN, INT64_MAX,
                  INT64_MAX / 4, (int64_t)1 << 40, heads * 2 * tile - 1);
      break;
    case 15: /* strided heads, no block stride: 0 is the dense value, too small */
      c->head_stride = 2 * tile;
      break;
    default: break; /* dense */
  }
}

/* Elements of a side from its pointer to the end of its last tile. */
static int64_t side_span(const pa_kv_cache *c) {
  if (c->num_blocks == 0) return 0;
  int64_t tile = (int64_t)c->block_size * c->head_size;
  int64_t head = c->head_stride ? c->head_stride : tile;
  int64_t block = c->block_stride ? c->block_stride : c->num_kv_heads * tile;
  return (c->num_blocks - 1) * block + (c->num_kv_heads - 1) * head + tile;
}

void fz_cache_provision(fz_cache *fc) {
  pa_kv_cache *c = &fc->c;
  int null_key = !c->key && fc->key.p, null_value = !c->value && fc->value.p;
  fz_cache_free(fc);
  fc->provisioned = 0;
  size_t es = fz_cache_geometry_ok(c) ? pa_dtype_size(c->dtype) : 0;
  uint64_t span = es ? (uint64_t)side_span(c) * es : UINT64_MAX;
  uint64_t key_bytes = fc->shared ? span + (uint64_t)fc->value_at * es : span;
  if (es && span <= FZ_CACHE_LIMIT && key_bytes <= FZ_CACHE_LIMIT) {
    fz_alloc(&fc->key, key_bytes);
    memset(fc->key.p, FZ_PAD_BYTE, (size_t)key_bytes);
    if (fc->shared) {
      fz_alloc_token(&fc->value);
    } else {
      fz_alloc(&fc->value, span);
      memset(fc->value.p, FZ_PAD_BYTE, (size_t)span);
    }
    fc->provisioned = 1;
  } else {
    fz_alloc_token(&fc->key);
    fz_alloc_token(&fc->value);
  }
  c->key = null_key ? NULL : fc->key.p;
  c->value = null_value                      ? NULL
             : fc->shared && fc->provisioned ? fc->key.p + (size_t)fc->value_at * es
                                             : fc->value.p;
}

size_t fz_cache_buf_bytes(const fz_cache *fc, int side) {
  if (!fc->provisioned || (side && fc->shared)) return 0;
  return (size_t)(side ? fc->value.bytes : fc->key.bytes);
}

unsigned char *fz_cache_buf(const fz_cache *fc, int side) { return side ? fc->value.p : fc->key.p; }

pa_kv_cache fz_cache_backing(const fz_cache *fc) {
  pa_kv_cache b = fc->c;
  size_t es = pa_dtype_size(fc->c.dtype);
  b.key = fc->key.p;
  b.value = fc->shared && fc->provisioned ? fc->key.p + (size_t)fc->value_at * es : fc->value.p;
  return b;
}

int fz_cache_padding_ok(const fz_cache *fc) {
  if (!fc->provisioned || fz_cache_elems(&fc->c) == 0) return 1;
  pa_kv_cache b = fz_cache_backing(fc);
  size_t es = pa_dtype_size(b.dtype), tile = (size_t)b.block_size * (size_t)b.head_size * es;
  int ok = 1;
  for (int m = 0; m < 2 && ok; m++) {
    size_t bytes = fz_cache_buf_bytes(fc, m);
    if (!bytes) continue;
    unsigned char *buf = fz_cache_buf(fc, m), *is_tile = calloc(bytes, 1);
    if (!is_tile) fz_fail("out of memory");
    for (int side = 0; side < 2; side++) {
      const unsigned char *base = side ? b.value : b.key;
      if (base < buf || base >= buf + bytes) continue;
      for (int64_t blk = 0; blk < b.num_blocks; blk++)
        for (int h = 0; h < b.num_kv_heads; h++)
          memset(is_tile + (base - buf) + (size_t)hx_tile_index(&b, blk, h, 0) * es, 1, tile);
    }
    for (size_t i = 0; i < bytes && ok; i++) ok = is_tile[i] || buf[i] == FZ_PAD_BYTE;
    free(is_tile);
  }
  return ok;
}

void fz_decode_cache(fz_in *in, fz_cache *fc, int nkv, int hs, int64_t min_blocks) {
  memset(fc, 0, sizeof *fc);
  pa_kv_cache *c = &fc->c;
  c->num_blocks = FZ_EDGY(in, min_blocks, min_blocks + 15, -1, 0, INT64_MIN, INT64_MAX,
                          INT64_MAX / 64, (int64_t)1 << 40, ((int64_t)1 << 31) + 1);
  c->block_size = fz_int(FZ_EDGY(in, 1, 9, 0, -1, 16, 32, INT32_MIN, INT32_MAX, 1 << 20));
  if (nkv && !fz_one_in(in, 24)) {
    c->num_kv_heads = nkv;
  } else {
    c->num_kv_heads = fz_int(FZ_EDGY(in, 1, 3, 0, -1, 65536, 65537, INT32_MIN, (int64_t)nkv + 1));
  }
  if (hs && !fz_one_in(in, 24)) {
    c->head_size = hs;
  } else {
    c->head_size = fz_int(FZ_EDGY(in, 1, 9, 0, -1, 1024, 1025, INT32_MAX, (int64_t)hs + 1));
  }
  c->dtype = fz_one_in(in, 32) ? (pa_dtype)fz_int(FZ_EDGY(in, 5, 7, -1, 1000, INT32_MIN))
                               : (pa_dtype)fz_range(in, 0, 4);
  c->k_scale = fz_scale(in, &fc->extreme);
  c->v_scale = fz_scale(in, &fc->extreme);
  if (c->dtype != PA_FP8_E4M3 && c->dtype != PA_FP8_E5M2) fc->extreme = 0; /* scales ignored */
  decode_strides(in, fc);
  int null_key = fz_one_in(in, 48), null_value = fz_one_in(in, 48);
  fz_cache_provision(fc);
  if (null_key) c->key = NULL;
  if (null_value) c->value = NULL;
}

void fz_cache_fill(fz_cache *fc, uint64_t seed) {
  if (!fc->provisioned || fz_cache_elems(&fc->c) == 0) return;
  tu_rng rng;
  tu_rng_seed(&rng, seed);
  pa_kv_cache backing = fz_cache_backing(fc); /* the call may be given NULL pointers */
  hx_fill_cache(&rng, &backing, 1.0, 0);
}

void fz_cache_free(fz_cache *fc) {
  fz_free(&fc->key);
  fz_free(&fc->value);
}

ref_cache fz_ref_cache(const pa_kv_cache *c) { return hx_ref_cache(c); }

/* ---- layers ------------------------------------------------------------------ */

void fz_decode_layer(fz_in *in, pa_layer_config *cfg, float *slopes, float *sinks, int *extreme) {
  static const int heads[] = {1, 2, 4, 3, 8, 6};
  static const int sizes[] = {16, 8, 1, 2, 3, 4, 5, 7, 12, 17, 24, 31, 32, 33, 48, 64, 80, 96, 128};
  memset(cfg, 0, sizeof *cfg);
  cfg->num_heads = heads[fz_u8(in) % 6];
  int divisors[FZ_MAX_HEADS], n = 0;
  for (int d = 1; d <= cfg->num_heads; d++)
    if (cfg->num_heads % d == 0) divisors[n++] = d;
  unsigned pick = fz_u8(in);
  cfg->num_kv_heads = pick % 5 == 4 ? 0 : divisors[pick % (unsigned)n];
  unsigned s = fz_u8(in);
  cfg->head_size = s < 250 ? sizes[s % 19] : (s == 250 ? 256 : s == 251 ? 512 : 1024);
  unsigned sc = fz_u8(in);
  static const float scales[] = {0.0f, 0.125f, 0.25f, 0.5f, 1.0f, 0.05f, 2.0f, 0.0f};
  cfg->scale = sc < 248 ? scales[sc % 8] : (sc % 2 ? 1e-30f : 1e30f);
  if (sc >= 248) *extreme = 1;
  if (fz_one_in(in, 3)) {
    static const float tame[] = {0.0f, 0.0625f, 0.125f, 0.5f, 1.0f, -0.25f, 0.03f, 2.0f};
    for (int h = 0; h < cfg->num_heads; h++) {
      unsigned b = fz_u8(in);
      slopes[h] = b < 250 ? tame[b % 8] : 1e20f;
      if (b >= 250) *extreme = 1;
    }
    cfg->alibi_slopes = slopes;
  }
  if (fz_one_in(in, 3)) {
    static const float tame[] = {-3.0f, 0.0f, 1.0f, 4.0f, -20.0f, 10.0f, 0.5f, 2.0f};
    for (int h = 0; h < cfg->num_heads; h++) {
      unsigned b = fz_u8(in);
      sinks[h] = b < 250 ? tame[b % 8] : 1e20f;
      if (b >= 250) *extreme = 1;
    }
    cfg->sinks = sinks;
  }
  if (fz_one_in(in, 3)) cfg->sliding_window = fz_int(FZ_EDGY(in, 1, 24, INT32_MAX, 1 << 30));
  if (fz_one_in(in, 4)) {
    unsigned b = fz_u8(in);
    static const float caps[] = {1.0f, 5.0f, 20.0f, 50.0f, 0.5f, 30.0f};
    cfg->logits_soft_cap = b < 250 ? caps[b % 6] : (b % 2 ? 1e-30f : 1e30f);
    if (b >= 250) *extreme = 1;
  }
  cfg->attn_type = (pa_attn_type)fz_range(in, 0, 3);
  cfg->dtype = (pa_dtype)fz_range(in, 0, 2);
}

void fz_describe_layer(const char *entry, const pa_layer_config *cfg) {
  if (!getenv("FZ_VERBOSE")) return;
  fprintf(stderr,
          "%s: heads %d kv_heads %d head_size %d scale %g window %d soft_cap %g type %d "
          "dtype %s alibi %s sinks %s\n",
          entry, cfg->num_heads, cfg->num_kv_heads, cfg->head_size, (double)cfg->scale,
          cfg->sliding_window, (double)cfg->logits_soft_cap, (int)cfg->attn_type,
          pa_dtype_name(cfg->dtype), cfg->alibi_slopes ? "yes" : "no", cfg->sinks ? "yes" : "no");
  for (int h = 0; h < cfg->num_heads && (cfg->alibi_slopes || cfg->sinks); h++)
    fprintf(stderr, "  head %d: slope %g sink %g\n", h,
            cfg->alibi_slopes ? (double)cfg->alibi_slopes[h] : 0.0,
            cfg->sinks ? (double)cfg->sinks[h] : 0.0);
}

pa_layer *fz_make_layer(fz_in *in, const char *harness, pa_layer_config *cfg, float *slopes,
                        float *sinks, int *extreme) {
  fz_decode_layer(in, cfg, slopes, sinks, extreme);
  fz_describe_layer(harness, cfg);
  pa_layer *layer = NULL;
  pa_status made = pa_layer_create(cfg, &layer);
  FZ_ASSERT(made == PA_OK, "pa_layer_create rejected a valid config: %s", pa_last_error());
  return layer;
}

ref_layer fz_ref_layer(const pa_layer_config *cfg) {
  ref_layer r;
  memset(&r, 0, sizeof r);
  r.num_heads = cfg->num_heads;
  r.num_kv_heads = cfg->num_kv_heads ? cfg->num_kv_heads : cfg->num_heads;
  r.head_size = cfg->head_size;
  r.scale = cfg->scale != 0.0f ? (double)cfg->scale : 1.0 / sqrt((double)cfg->head_size);
  r.alibi_slopes = cfg->alibi_slopes;
  r.sliding_window = cfg->sliding_window;
  r.soft_cap = cfg->logits_soft_cap;
  r.sinks = cfg->sinks;
  r.attn_type = (ref_attn)cfg->attn_type;
  return r;
}

double fz_logit_error(const pa_layer_config *cfg, double q_mag, double k_mag, int64_t max_dist) {
  double scale = cfg->scale != 0.0f ? cfg->scale : 1.0 / sqrt((double)cfg->head_size);
  double slope = 0;
  for (int h = 0; cfg->alibi_slopes && h < cfg->num_heads; h++)
    slope = fmax(slope, fabs((double)cfg->alibi_slopes[h]));
  double u = ldexp(1.0, -22); /* two f32 roundings per term, generously */
  /* The f32 sums of up to max_dist terms (softmax denominator, P V) err by
   * at most max_dist roundings relative: as good as a logit that far off. */
  return u * (scale * cfg->head_size * q_mag * k_mag + slope * (double)max_dist +
              (double)cfg->logits_soft_cap) +
         ldexp((double)max_dist, -24);
}

void fz_check_attention(const char *entry, pa_dtype act, const pa_layer_config *cfg, int64_t rows,
                        const fz_rows *out, const float *lse, int lse_extra, const double *ref_out,
                        const double *ref_lse, const double *vmax, double logit_err) {
  int nh = cfg->num_heads, d = cfg->head_size, width = nh * d;
  hx_tol tol = hx_tolerance(act);
  for (int64_t r = 0; r < rows; r++) {
    const unsigned char *row = out->buf.p + (uint64_t)r * (uint64_t)out->stride * out->elem;
    for (int c = 0; c < width; c++) {
      double got = ref_load(row, c, (ref_dtype)act), want = ref_out[r * width + c];
      int unseen = isinf(ref_lse[r * nh + c / d]);
      double lim = unseen ? 0.0 : (tol.atol + 2 * logit_err) * vmax[r] + tol.rtol * fabs(want);
      FZ_ASSERT(fabs(got - want) <= lim,
                "%s: out row %lld head %d dim %d: got %.9g, the reference %.9g (tolerance %.3g)",
                entry, (long long)r, c / d, c % d, got, want, lim);
    }
    for (int h = 0; lse && h < nh; h++) {
      double got = lse[r * nh + h], want = ref_lse[r * nh + h];
      int ok = isinf(want) ? got == want : fabs(got - want) <= HX_LSE_ATOL + logit_err;
      FZ_ASSERT(ok, "%s: lse row %lld head %d: got %.9g, the reference %.9g", entry, (long long)r,
                h, got, want);
    }
  }
  FZ_ASSERT(fz_rows_canaries_ok(out), "%s wrote outside its output rows", entry);
  if (lse) {
    size_t at = tu_find_non_canary(lse + rows * nh, (size_t)lse_extra * sizeof(float));
    FZ_ASSERT(at == (size_t)lse_extra * sizeof(float), "%s wrote lse past its rows", entry);
  }
}

/* ---- batch lengths ----------------------------------------------------------- */

static int32_t wrap_add(int32_t a, int64_t b) {
  return (int32_t)(uint32_t)((uint64_t)(int64_t)a + (uint64_t)b);
}

void fz_decode_lengths(fz_in *in, fz_lengths *l, int cumulative) {
  memset(l, 0, sizeof *l);
  l->cumulative = cumulative;
  /* No more sequences than the arrays hold: a call may read all of them. */
  l->num_seqs = fz_int(FZ_EDGY(in, 0, 4, -1, INT32_MIN, FZ_MAX_SEQS));
  l->decoded = l->num_seqs < 0 ? 0 : l->num_seqs > FZ_MAX_SEQS ? FZ_MAX_SEQS : l->num_seqs;
  l->qsl[0] = (int32_t)FZ_EDGY(in, 0, 0, 1, -1, INT32_MAX, INT32_MIN);
  l->kv[0] = cumulative ? (int32_t)FZ_EDGY(in, 0, 0, 1, -1, INT32_MAX) : 0;
  for (int s = 0; s < l->decoded; s++) {
    /* Mostly decodes, chunks and prompts of a few rows; hostile now and then. */
    int64_t q = FZ_EDGY(in, 0, 9, 1, 1, 1, 17, 64, -1, -5, INT32_MAX, INT32_MIN, 100);
    int64_t extra = FZ_EDGY(in, 0, 24, -1, -2, INT32_MAX, 257, 600, 1000, INT32_MIN, 40);
    l->qsl[s + 1] = wrap_add(l->qsl[s], q);
    if (cumulative) {
      l->kv[s + 1] = wrap_add(l->kv[s], q + extra);
    } else {
      l->kv[s] = (int32_t)(q + extra < INT32_MIN   ? INT32_MIN
                           : q + extra > INT32_MAX ? INT32_MAX
                                                   : q + extra);
    }
  }
  l->null_qsl = fz_one_in(in, 48);
  l->null_kv = fz_one_in(in, 48);
}

int64_t fz_q_len(const fz_lengths *l, int s) { return (int64_t)l->qsl[s + 1] - l->qsl[s]; }
int64_t fz_k_len(const fz_lengths *l, int s) {
  return l->cumulative ? (int64_t)l->kv[s + 1] - l->kv[s] : l->kv[s];
}

void fz_model_lengths(fz_expect *model, fz_lengths *l, int require_q_le_k) {
  const pa_status inv = PA_ERR_INVALID_ARGUMENT;
  fz_expect own = {model->entry, 0, 0}, *e = &own;
  int n = l->num_seqs;
  fz_need(e, n < 0, inv);
  (n > 0 ? fz_need : fz_allow)(e, l->null_qsl || l->null_kv, inv);
  if (n >= 0 && n <= FZ_MAX_SEQS && !l->null_qsl) {
    (n > 0 ? fz_need : fz_allow)(e, l->qsl[0] != 0, inv);
    if (l->cumulative && !l->null_kv) (n > 0 ? fz_need : fz_allow)(e, l->kv[0] != 0, inv);
    for (int s = 0; s < n; s++) {
      fz_need(e, fz_q_len(l, s) < 0, inv);
      if (!l->null_kv) {
        fz_need(e, fz_k_len(l, s) < 0, inv);
        fz_need(e, require_q_le_k && fz_q_len(l, s) > fz_k_len(l, s), inv);
      }
    }
  }
  l->ok = n >= 0 && n <= FZ_MAX_SEQS && own.must == 0 && (n == 0 || (!l->null_qsl && !l->null_kv));
  l->rows = l->keys = 0;
  for (int s = 0; l->ok && s < n; s++) {
    l->rows += fz_q_len(l, s);
    l->keys += fz_k_len(l, s);
  }
  model->must |= own.must;
  model->may |= own.may;
}
