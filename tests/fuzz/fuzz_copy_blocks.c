/* pa_copy_blocks from arbitrary bytes: up to three caches of their own
 * geometry, strides and dtype (one per layer), and pairs with hostile ids
 * and counts. PA_OK must leave every cache's tiles as the pairs copied one
 * after another would, and the bytes between them as they were; an error
 * must leave every cache untouched. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_CACHES = 3, MAX_PAIRS = 12 };

/* What a copy does: pairs in order, keys and values. */
static void expect_copies(unsigned char *key, unsigned char *value, size_t block_bytes,
                          const int64_t *pairs, int64_t num_pairs) {
  for (int64_t p = 0; p < num_pairs; p++) {
    size_t s = (size_t)pairs[2 * p], d = (size_t)pairs[2 * p + 1];
    memmove(key + d * block_bytes, key + s * block_bytes, block_bytes);
    memmove(value + d * block_bytes, value + s * block_bytes, block_bytes);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  pa_context *ctx = fz_context(&in);
  int num_caches = fz_int(FZ_EDGY(&in, 0, MAX_CACHES, -1, INT32_MIN, INT32_MAX, MAX_CACHES + 1));
  int decoded = num_caches < 0 ? 0 : num_caches > MAX_CACHES ? MAX_CACHES : num_caches;
  fz_cache fc[MAX_CACHES];
  pa_kv_cache caches[MAX_CACHES];
  int64_t min_blocks = 1 + fz_range(&in, 0, 3);
  for (int c = 0; c < decoded; c++) {
    fz_decode_cache(&in, &fc[c], 0, 0, min_blocks);
    caches[c] = fc[c].c;
  }
  int null_caches = fz_one_in(&in, 48), null_pairs = fz_one_in(&in, 48);
  int64_t num_pairs = FZ_EDGY(&in, 0, MAX_PAIRS, -1, INT64_MIN, INT64_MAX, (int64_t)1 << 59,
                              (int64_t)1 << 60, MAX_PAIRS + 1, (int64_t)1 << 31);
  int64_t limit = INT64_MAX;
  for (int c = 0; c < decoded; c++)
    if (fz_cache_geometry_ok(&caches[c]) && caches[c].num_blocks < limit)
      limit = caches[c].num_blocks;
  if (limit == INT64_MAX) limit = 4;

  fz_expect e = {"pa_copy_blocks", 0, 0};
  fz_need(&e, !ctx, PA_ERR_INVALID_ARGUMENT);
  fz_need(&e, num_caches < 0, PA_ERR_INVALID_ARGUMENT);
  (num_caches > 0 ? fz_need : fz_allow)(&e, null_caches, PA_ERR_INVALID_ARGUMENT);
  fz_need(&e, num_pairs < 0 || num_pairs > INT64_MAX / 16, PA_ERR_INVALID_ARGUMENT);
  int possible = num_pairs > 0 && num_pairs <= INT64_MAX / 16;
  (possible ? fz_need : fz_allow)(&e, null_pairs, PA_ERR_INVALID_ARGUMENT);
  int all_valid = 1;
  for (int c = 0; c < decoded; c++) {
    fz_model_cache(&e, &caches[c]);
    all_valid &= fz_cache_geometry_ok(&caches[c]);
  }
  /* Ids are checked against caches whose size means something. */
  fz_allow(&e, !all_valid, PA_ERR_OUT_OF_RANGE);

  int backed = num_caches <= MAX_CACHES && (!possible || num_pairs <= MAX_PAIRS);
  for (int c = 0; c < decoded; c++)
    if (fz_cache_geometry_ok(&caches[c]) && !fc[c].provisioned) backed = 0;

  int64_t pairs[2 * MAX_PAIRS];
  fz_buf token;
  fz_alloc_token(&token);
  int64_t count = possible && num_pairs <= MAX_PAIRS ? num_pairs : 0;
  for (int64_t i = 0; i < 2 * count; i++) {
    int64_t id = FZ_EDGY(&in, 0, fz_sat_add(limit, 1), -1, limit, fz_sat_add(limit, -1), INT64_MAX,
                         INT64_MIN, (int64_t)1 << 32, INT32_MAX);
    pairs[i] = id;
    for (int c = 0; c < decoded; c++)
      if (fz_cache_geometry_ok(&caches[c]))
        fz_need(&e, id < 0 || id >= caches[c].num_blocks, PA_ERR_OUT_OF_RANGE);
    fz_allow(&e, id < 0 || decoded == 0, PA_ERR_OUT_OF_RANGE); /* nothing to check against */
  }
  /* Exactly as long as declared, so that ASan sees a read past them. */
  int64_t *pairs_exact = (int64_t *)fz_copy(pairs, (size_t)count * 2 * sizeof(int64_t));
  int64_t *pairs_arg = null_pairs ? NULL : count ? pairs_exact : (int64_t *)token.p;
  pa_kv_cache *caches_exact = (pa_kv_cache *)fz_copy(caches, (size_t)decoded * sizeof *caches);

  if (backed) {
    unsigned char *before[MAX_CACHES][2], *expect[MAX_CACHES][2];
    size_t bytes[MAX_CACHES];
    for (int c = 0; c < decoded; c++) {
      fz_cache_fill(&fc[c], in.at + (uint64_t)c);
      bytes[c] =
          fc[c].provisioned ? (size_t)fz_cache_elems(&fc[c].c) * pa_dtype_size(fc[c].c.dtype) : 0;
      pa_kv_cache backing = fz_cache_backing(&fc[c]);
      for (int side = 0; side < 2; side++) {
        before[c][side] = fz_copy(fz_cache_buf(&fc[c], side), fz_cache_buf_bytes(&fc[c], side));
        expect[c][side] = malloc(bytes[c] + 1);
        if (!expect[c][side]) fz_fail("out of memory");
        if (bytes[c]) hx_gather_tiles(&backing, side, expect[c][side]);
      }
      if (fz_may_succeed(&e) && bytes[c])
        expect_copies(expect[c][0], expect[c][1], bytes[c] / (size_t)fc[c].c.num_blocks, pairs,
                      count);
    }
    pa_kv_cache *caches_arg = null_caches      ? NULL
                              : num_caches > 0 ? caches_exact
                                               : (pa_kv_cache *)token.p;
    fz_plant_stale_message();
    pa_status st = pa_copy_blocks(ctx, caches_arg, num_caches, pairs_arg, num_pairs);
    int ok = fz_check_status(&e, st);
    for (int c = 0; c < decoded; c++) {
      pa_kv_cache backing = fz_cache_backing(&fc[c]);
      unsigned char *tiles = malloc(bytes[c] + 1);
      if (!tiles) fz_fail("out of memory");
      for (int side = 0; side < 2; side++) {
        if (ok) {
          if (bytes[c]) hx_gather_tiles(&backing, side, tiles);
          FZ_ASSERT(memcmp(expect[c][side], tiles, bytes[c]) == 0,
                    "pa_copy_blocks returned ok but caches[%d] holds other tiles than the copies "
                    "give",
                    c);
        } else {
          FZ_ASSERT(memcmp(before[c][side], fz_cache_buf(&fc[c], side),
                           fz_cache_buf_bytes(&fc[c], side)) == 0,
                    "pa_copy_blocks returned %s but changed caches[%d]", pa_status_string(st), c);
        }
      }
      free(tiles);
      FZ_ASSERT(!ok || fz_cache_padding_ok(&fc[c]),
                "pa_copy_blocks wrote between the tiles of caches[%d]", c);
      for (int i = 0; i < 2; i++) {
        free(before[c][i]);
        free(expect[c][i]);
      }
    }
  }
  free(pairs_exact);
  free(caches_exact);
  fz_free(&token);
  for (int c = 0; c < decoded; c++) fz_cache_free(&fc[c]);
  return 0;
}
