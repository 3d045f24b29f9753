/* pa_swap_blocks from arbitrary bytes: a source and a destination cache
 * that share their geometry (mostly), differ in one field, or are the same
 * memory; pairs with hostile ids and counts. PA_OK must leave the
 * destination as the pairs copied one after another would (and the source,
 * unless it is the destination, unchanged); an error must leave both
 * untouched. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_PAIRS = 12 };

static size_t cache_bytes(const fz_cache *fc) {
  return fc->provisioned ? (size_t)fz_cache_elems(&fc->c) * pa_dtype_size(fc->c.dtype) : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_in in = {data, size, 0};
  pa_context *ctx = fz_context(&in);
  fz_cache fs, fd;
  fz_decode_cache(&in, &fs, 0, 0, 1);
  fz_decode_cache(&in, &fd, fs.c.num_kv_heads, fs.c.head_size, 1);
  pa_kv_cache src = fs.c, dst = fd.c;
  /* 0-5: a cache of the source's geometry (one field may differ); 6: the
   * source itself; 7: the source's memory, maybe declared smaller. */
  int mode = fz_range(&in, 0, 7), same_memory = mode >= 6;
  if (mode < 6 && !fz_one_in(&in, 8)) {
    dst.block_size = src.block_size;
    dst.dtype = src.dtype;
    dst.k_scale = src.k_scale;
    dst.v_scale = src.v_scale;
    /* dst's memory was sized for its own geometry: redo it for the new one. */
    fz_cache_free(&fd);
    fd.c = dst;
    uint64_t bytes = fz_cache_geometry_ok(&dst)
                         ? (uint64_t)fz_cache_elems(&dst) * pa_dtype_size(dst.dtype)
                         : UINT64_MAX;
    fd.provisioned = bytes <= FZ_CACHE_LIMIT;
    if (fd.provisioned) {
      fz_alloc(&fd.key, bytes);
      fz_alloc(&fd.value, bytes);
    } else {
      fz_alloc_token(&fd.key);
      fz_alloc_token(&fd.value);
    }
    dst.key = fd.c.key ? fd.key.p : NULL;
    dst.value = fd.c.value ? fd.value.p : NULL;
    fd.c = dst;
  }
  if (same_memory) {
    dst = src;
    if (mode == 7 && dst.num_blocks > 1) dst.num_blocks = fz_range(&in, 1, 3) % dst.num_blocks;
  }
  int null_src = fz_one_in(&in, 48), null_dst = fz_one_in(&in, 48);
  int null_pairs = fz_one_in(&in, 48);
  int64_t num_pairs = FZ_EDGY(&in, 0, MAX_PAIRS, -1, INT64_MIN, INT64_MAX, (int64_t)1 << 59,
                              (int64_t)1 << 60, MAX_PAIRS + 1);

  fz_expect e = {"pa_swap_blocks", 0, 0};
  fz_need(&e, !ctx, PA_ERR_INVALID_ARGUMENT);
  fz_model_cache(&e, null_src ? NULL : &src);
  fz_model_cache(&e, null_dst ? NULL : &dst);
  int src_ok = fz_cache_geometry_ok(&src), dst_ok = fz_cache_geometry_ok(&dst);
  if (src_ok && dst_ok) {
    fz_need(&e,
            src.block_size != dst.block_size || src.num_kv_heads != dst.num_kv_heads ||
                src.head_size != dst.head_size || src.dtype != dst.dtype,
            PA_ERR_INVALID_ARGUMENT);
    int fp8 = src.dtype == PA_FP8_E4M3 || src.dtype == PA_FP8_E5M2;
    fz_need(&e, fp8 && (src.k_scale != dst.k_scale || src.v_scale != dst.v_scale),
            PA_ERR_INVALID_ARGUMENT);
  }
  fz_allow(&e, !src_ok || !dst_ok || null_src || null_dst, PA_ERR_OUT_OF_RANGE);
  fz_need(&e, num_pairs < 0 || num_pairs > INT64_MAX / 16, PA_ERR_INVALID_ARGUMENT);
  int possible = num_pairs > 0 && num_pairs <= INT64_MAX / 16;
  (possible ? fz_need : fz_allow)(&e, null_pairs, PA_ERR_INVALID_ARGUMENT);

  int64_t count = possible && num_pairs <= MAX_PAIRS ? num_pairs : 0;
  int64_t *pairs = malloc((size_t)(2 * count) * sizeof *pairs + 1);
  for (int64_t p = 0; p < count; p++) {
    for (int side = 0; side < 2; side++) {
      int64_t n = side ? dst.num_blocks : src.num_blocks, lim = n > 0 && n < 200 ? n : 4;
      int64_t id =
          FZ_EDGY(&in, 0, lim, -1, n, fz_sat_add(n, -1), INT64_MAX, INT64_MIN, (int64_t)1 << 32);
      pairs[2 * p + side] = id;
      if (side ? dst_ok : src_ok) fz_need(&e, id < 0 || id >= n, PA_ERR_OUT_OF_RANGE);
    }
  }
  fz_buf token;
  fz_alloc_token(&token);
  int backed = (!possible || num_pairs <= MAX_PAIRS) && (!src_ok || fs.provisioned) &&
               (!dst_ok || same_memory || fd.provisioned);

  if (backed) {
    fz_cache_fill(&fs, in.at);
    fz_cache_fill(&fd, in.at + 1);
    size_t sb = cache_bytes(&fs), db = same_memory ? sb : cache_bytes(&fd);
    unsigned char *src_mem[2] = {fs.key.p, fs.value.p};
    unsigned char *dst_mem[2] = {same_memory ? fs.key.p : fd.key.p,
                                 same_memory ? fs.value.p : fd.value.p};
    unsigned char *before[2][2], *expect[2];
    for (int i = 0; i < 2; i++) {
      before[0][i] = fz_copy(src_mem[i], sb);
      before[1][i] = fz_copy(dst_mem[i], db);
      expect[i] = fz_copy(dst_mem[i], db);
    }
    if (fz_may_succeed(&e) && count) {
      size_t block = sb / (size_t)src.num_blocks;
      for (int i = 0; i < 2; i++)
        for (int64_t p = 0; p < count; p++) {
          /* Same memory: the source of a later pair sees the earlier copies. */
          const unsigned char *from = same_memory ? expect[i] : before[0][i];
          memmove(expect[i] + (size_t)pairs[2 * p + 1] * block, from + (size_t)pairs[2 * p] * block,
                  block);
        }
    }
    int64_t *pairs_arg = null_pairs ? NULL : count ? pairs : (int64_t *)token.p;
    fz_plant_stale_message();
    pa_status st =
        pa_swap_blocks(ctx, null_src ? NULL : &src, null_dst ? NULL : &dst, pairs_arg, num_pairs);
    int ok = fz_check_status(&e, st);
    for (int i = 0; i < 2; i++) {
      FZ_ASSERT(memcmp(ok ? expect[i] : before[1][i], dst_mem[i], db) == 0,
                "pa_swap_blocks returned %s but dst %s holds other bytes than %s",
                pa_status_string(st), i ? "values" : "keys", ok ? "the copies give" : "before");
      FZ_ASSERT(same_memory || memcmp(before[0][i], src_mem[i], sb) == 0,
                "pa_swap_blocks changed its source");
      free(before[0][i]);
      free(before[1][i]);
      free(expect[i]);
    }
  }
  free(pairs);
  fz_free(&token);
  fz_cache_free(&fs);
  fz_cache_free(&fd);
  return 0;
}
