/* Compiled with -mamx-tile -mamx-bf16; called only when the CPU reports AMX-BF16 and the OS
 * grants this process the tile state (pab_amx_granted). */
#define _DEFAULT_SOURCE /* syscall */
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "roofline_kernels.h"

int pab_amx_granted(void) {
#if defined(SYS_arch_prctl)
  enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
  unsigned long features = 0;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &features) != 0) return 0;
  return (int)((features >> XFEATURE_XTILEDATA) & 1);
#else
  return 0;
#endif
}

float pab_tdpbf16_amx(uint64_t iters) {
  /* Four accumulator tiles (two A and two B tiles, as a 2 x 2 register block) keep the tile
   * unit busy; the inputs are tiny bf16 values, so the sums stay finite. */
  unsigned char config[64];
  memset(config, 0, sizeof config);
  config[0] = 1;
  for (int t = 0; t < 8; t++) {
    config[16 + 2 * t] = 64;
    config[48 + t] = 16;
  }
  static uint16_t a[16 * 32], b[16 * 32];
  for (int i = 0; i < 16 * 32; i++) a[i] = b[i] = 0x3a83; /* about 1e-3 */
  float c[16 * 16];
  _tile_loadconfig(config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  for (uint64_t i = 0; i < iters; i++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}
