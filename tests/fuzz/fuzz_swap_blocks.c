/* pa_swap_blocks from arbitrary bytes: a source and a destination cache
 * that share their geometry (mostly), differ in one field, or are the same
 * memory; each dense or strided, in the same layout or in different ones;
 * pairs with hostile ids and counts. PA_OK must leave the destination's
 * tiles as the pairs copied one after another would and the bytes between
 * them as they were (and the source, unless it is the destination,
 * unchanged); an error must leave both untouched. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_PAIRS = 12 };

/* Bytes of a cache's tiles (what a dense image of one side holds). */
static size_t tile_bytes(const fz_cache *fc, const pa_kv_cache *c) {
  return fc->provisioned ? (size_t)fz_cache_elems(c) * pa_dtype_size(c->dtype) : 0;
}

/* Dense images of a side's tiles. */
static unsigned char *gather(const pa_kv_cache *c, int side, size_t bytes) {
  unsigned char *img = malloc(bytes + 1);
  if (!img) fz_fail("out of memory");
  if (bytes) hx_gather_tiles(c, side, img);
  return img;
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
    /* Strides for the new geometry: dense, the source's layout, the ones
     * decoded for the old geometry (maybe no longer valid), or padded. */
    int64_t tile = (int64_t)dst.block_size * dst.head_size;
    switch (fz_range(&in, 0, 3)) {
      case 0:
        dst.block_stride = dst.head_stride = 0;
        fd.shared = 0;
        break;
      case 1:
        dst.block_stride = src.block_stride;
        dst.head_stride = src.head_stride;
        fd.shared = fs.shared;
        fd.value_at = fs.value_at;
        break;
      case 2: /* two buffers: a shared one's value offset was for the old tiles */
        fd.shared = 0;
        break;
      default:
        fd.shared = 0;
        /* nonsense (and strides that would overflow) */
        if (tile < 1 || tile > ((int64_t)1 << 40) || dst.num_kv_heads < 1 ||
            dst.num_kv_heads > 65536)
          break;
        dst.head_stride = tile + 3;
        dst.block_stride = (int64_t)dst.num_kv_heads * dst.head_stride + 5;
        break;
    }
    /* dst's memory was sized for its own geometry: redo it for the new one. */
    fd.c = dst;
    fz_cache_provision(&fd);
    dst = fd.c;
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
    /* The caches over their buffers (the call may be given NULL); same
     * memory: the whole of src's, where dst's fewer blocks lie too. */
    pa_kv_cache sc = fz_cache_backing(&fs), dc = same_memory ? sc : fz_cache_backing(&fd);
    const fz_cache *dst_mem = same_memory ? &fs : &fd;
    size_t sb = tile_bytes(&fs, &sc), db = tile_bytes(dst_mem, &dc);
    unsigned char *before[2][2], *expect[2];
    for (int i = 0; i < 2; i++) {
      before[0][i] = fz_copy(fz_cache_buf(&fs, i), fz_cache_buf_bytes(&fs, i));
      before[1][i] = fz_copy(fz_cache_buf(dst_mem, i), fz_cache_buf_bytes(dst_mem, i));
      expect[i] = gather(&dc, i, db);
    }
    if (fz_may_succeed(&e) && count) {
      size_t block = sb / (size_t)src.num_blocks;
      for (int i = 0; i < 2; i++) {
        unsigned char *src_img = gather(&sc, i, sb);
        for (int64_t p = 0; p < count; p++) {
          /* Same memory: the source of a later pair sees the earlier copies. */
          const unsigned char *from = same_memory ? expect[i] : src_img;
          memmove(expect[i] + (size_t)pairs[2 * p + 1] * block, from + (size_t)pairs[2 * p] * block,
                  block);
        }
        free(src_img);
      }
    }
    int64_t *pairs_arg = null_pairs ? NULL : count ? pairs : (int64_t *)token.p;
    fz_plant_stale_message();
    pa_status st =
        pa_swap_blocks(ctx, null_src ? NULL : &src, null_dst ? NULL : &dst, pairs_arg, num_pairs);
    int ok = fz_check_status(&e, st);
    for (int i = 0; i < 2; i++) {
      if (ok) {
        unsigned char *got = gather(&dc, i, db);
        FZ_ASSERT(memcmp(expect[i], got, db) == 0,
                  "pa_swap_blocks returned ok but dst %s tiles hold other bytes than the copies "
                  "give",
                  i ? "value" : "key");
        free(got);
      } else {
        FZ_ASSERT(
            memcmp(before[1][i], fz_cache_buf(dst_mem, i), fz_cache_buf_bytes(dst_mem, i)) == 0,
            "pa_swap_blocks returned %s but changed dst", pa_status_string(st));
      }
      FZ_ASSERT(same_memory ||
                    memcmp(before[0][i], fz_cache_buf(&fs, i), fz_cache_buf_bytes(&fs, i)) == 0,
                "pa_swap_blocks changed its source");
      free(before[0][i]);
      free(before[1][i]);
      free(expect[i]);
    }
    FZ_ASSERT(fz_cache_padding_ok(dst_mem), "pa_swap_blocks wrote between dst's tiles");
  }
  free(pairs);
  fz_free(&token);
  fz_cache_free(&fs);
  fz_cache_free(&fd);
  return 0;
}
