/* pa_write_kv from arbitrary bytes: cache geometry and strides, source
 * dtype, token count, row strides and slots. PA_OK must leave exactly the
 * reference's bytes in the cache's tiles and every byte between them as it
 * was; an error must leave every byte of the cache's buffers as it was. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_TOKENS = 64 };

static int is_activation(pa_dtype t) { return t == PA_F32 || t == PA_F16 || t == PA_BF16; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  pa_context *ctx = fz_context(&in);
  fz_cache fc;
  fz_decode_cache(&in, &fc, 0, 0, 0);
  const pa_kv_cache *cache = fz_one_in(&in, 48) ? NULL : &fc.c;
  pa_dtype src = fz_one_in(&in, 16) ? (pa_dtype)fz_int(FZ_EDGY(&in, 3, 7, -1, INT32_MIN))
                                    : (pa_dtype)fz_range(&in, 0, 2);
  int64_t n = FZ_EDGY(&in, 0, 12, -1, INT64_MIN, INT64_MAX, (int64_t)1 << 61, (int64_t)1 << 40,
                      MAX_TOKENS + 1, (int64_t)1 << 31);
  int geometry = fz_cache_geometry_ok(&fc.c);
  int64_t width = (int64_t)fc.c.num_kv_heads * fc.c.head_size;
  int64_t strides[2];
  for (int i = 0; i < 2; i++)
    strides[i] = FZ_EDGY(&in, width, width + 3, width - 1, 0, -1, INT64_MIN, INT64_MAX,
                         INT64_MAX / 2, (int64_t)1 << 40, (int64_t)1 << 33);
  int null_key = fz_one_in(&in, 48), null_value = fz_one_in(&in, 48);
  int null_slots = fz_one_in(&in, 48);
  int64_t num_slots = geometry ? fc.c.num_blocks * fc.c.block_size : 0;

  /* The model. */
  fz_expect e = {"pa_write_kv", 0, 0};
  fz_need(&e, !ctx, PA_ERR_INVALID_ARGUMENT);
  fz_model_cache(&e, cache);
  fz_allow(&e, !geometry, PA_ERR_OUT_OF_RANGE); /* slots against a meaningless size */
  fz_need(&e, (int)src < 0 || (int)src > 4, PA_ERR_INVALID_ARGUMENT);
  fz_need(&e, src == PA_FP8_E4M3 || src == PA_FP8_E5M2, PA_ERR_UNSUPPORTED);
  fz_need(&e, n < 0 || n > INT64_MAX / 8, PA_ERR_INVALID_ARGUMENT);
  int possible = n > 0 && n <= INT64_MAX / 8;
  if (possible) {
    fz_need(&e, null_key || null_value || null_slots, PA_ERR_INVALID_ARGUMENT);
  } else {
    fz_allow(&e, null_key || null_value || null_slots, PA_ERR_INVALID_ARGUMENT);
  }
  size_t src_size = is_activation(src) ? pa_dtype_size(src) : 0;
  int rows_known = geometry && src_size && possible;
  for (int i = 0; i < 2; i++) {
    if (rows_known) fz_model_rows(&e, n, strides[i], width, src_size);
    if (!possible) fz_allow(&e, strides[i] < width, PA_ERR_INVALID_ARGUMENT);
  }
  if (possible && n > MAX_TOKENS) {
    fz_cache_free(&fc);
    return 0; /* a slot_mapping this long is not backed */
  }

  /* The slots, read as long as the count is possible; an impossible count
   * gets a token that no byte of may be read. */
  int64_t *slots = NULL;
  fz_buf slot_token;
  fz_alloc_token(&slot_token);
  if (!possible && n > 0) slots = (int64_t *)slot_token.p;
  if (possible) {
    slots = malloc((size_t)n * sizeof *slots);
    for (int64_t t = 0; t < n; t++) {
      slots[t] = FZ_EDGY(&in, -1, num_slots < 200 ? num_slots : 200, num_slots, num_slots - 1,
                         fz_sat_add(num_slots, 1), INT64_MAX, INT64_MIN, -2, (int64_t)1 << 31,
                         (int64_t)1 << 32);
      if (geometry) fz_need(&e, slots[t] >= num_slots, PA_ERR_OUT_OF_RANGE);
    }
  }

  /* Rows: backed when the call may read them, a token otherwise. */
  fz_rows rows[2];
  int backed = 1;
  for (int i = 0; i < 2; i++) {
    int ok = rows_known && fz_extent(n, strides[i], width, src_size) != UINT64_MAX;
    backed &= fz_rows_alloc(&rows[i], ok ? n : 0, 0, strides[i], width, src_size, ok);
    if (ok) fz_rows_fill(&rows[i], 11 + (uint64_t)i * 7 + in.at, src, 2.0);
  }
  if (cache && geometry && !fc.provisioned) backed = 0;

  if (backed) {
    fz_cache_fill(&fc, in.at);
    size_t bytes = fc.provisioned ? (size_t)fz_cache_elems(&fc.c) * pa_dtype_size(fc.c.dtype) : 0;
    unsigned char *before[2] = {fz_copy(fz_cache_buf(&fc, 0), fz_cache_buf_bytes(&fc, 0)),
                                fz_copy(fz_cache_buf(&fc, 1), fz_cache_buf_bytes(&fc, 1))};
    unsigned char *img[4] = {NULL, NULL, NULL, NULL};
    pa_kv_cache backing = fz_cache_backing(&fc); /* the call may be given NULL pointers */
    if (fz_may_succeed(&e)) {
      for (int i = 0; i < 4; i++) {
        img[i] = malloc(bytes + 1);
        if (!img[i]) fz_fail("out of memory");
        if (bytes) hx_gather_tiles(&backing, i % 2, img[i]);
      }
      hx_expect_write(&backing, img[0], img[1], img[2], img[3], rows[0].buf.p, strides[0],
                      rows[1].buf.p, strides[1], src, n, slots);
    }
    int64_t *slot_copy = possible ? (int64_t *)fz_copy(slots, (size_t)n * sizeof *slots) : NULL;
    fz_plant_stale_message();
    pa_status st = pa_write_kv(ctx, cache, null_key ? NULL : rows[0].buf.p, strides[0],
                               null_value ? NULL : rows[1].buf.p, strides[1], src, n,
                               null_slots ? NULL : slots);
    if (fz_check_status(&e, st)) {
      if (bytes) hx_compare_cache("pa_write_kv", &backing, img[0], img[1], img[2], img[3]);
      FZ_ASSERT(tu_failures == 0, "pa_write_kv stored other bytes than the reference");
      FZ_ASSERT(fz_cache_padding_ok(&fc), "pa_write_kv wrote between the cache's tiles");
    } else {
      for (int m = 0; m < 2; m++)
        FZ_ASSERT(memcmp(before[m], fz_cache_buf(&fc, m), fz_cache_buf_bytes(&fc, m)) == 0,
                  "pa_write_kv failed (%s) but changed the cache", pa_last_error());
    }
    FZ_ASSERT(fz_rows_unchanged(&rows[0]) && fz_rows_unchanged(&rows[1]),
              "pa_write_kv changed its key or value rows");
    FZ_ASSERT(!possible || memcmp(slot_copy, slots, (size_t)n * sizeof *slots) == 0,
              "pa_write_kv changed slot_mapping");
    free(slot_copy);
    for (int i = 0; i < 4; i++) free(img[i]);
    free(before[0]);
    free(before[1]);
  }
  fz_rows_free(&rows[0]);
  fz_rows_free(&rows[1]);
  if (possible) free(slots);
  fz_free(&slot_token);
  fz_cache_free(&fc);
  return 0;
}
