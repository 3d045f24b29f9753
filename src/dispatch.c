/* CPU feature detection and kernel table assembly. */
#define _DEFAULT_SOURCE /* syscall (the AMX permission request) */
#include "dispatch.h"

#include <pthread.h>
#include <string.h>

#if defined(PA_HAVE_X86_KERNELS)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static uint64_t read_xcr0(void) {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
}

/* Linux hands a process the AMX tile data state only when it asks
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); the request is
 * idempotent. Elsewhere the tiles are not used. */
static int os_grants_amx(void) {
#if defined(__linux__) && defined(SYS_arch_prctl)
  enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
  unsigned long features = 0;
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &features) != 0) return 0;
  return (features >> XFEATURE_XTILEDATA) & 1;
#else
  return 0;
#endif
}

/* The CPU's vendor (0: other, 'A': AMD, 'I': Intel) and its family and
 * model as cpuid leaf 1 encodes them with their extended fields. */
static int cpu_model(unsigned *family, unsigned *model) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return 0;
  int amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;   /* AuthenticAMD */
  int intel = ebx == 0x756e6547u && edx == 0x49656e69u && ecx == 0x6c65746eu; /* GenuineIntel */
  if (!(amd || intel) || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  *family = ((eax >> 8) & 0xf) + ((eax >> 20) & 0xff);
  *model = ((eax >> 4) & 0xf) | ((eax >> 12) & 0xf0);
  return amd ? 'A' : 'I';
}

/* AMD family 19h models of Zen 4: Raphael, Genoa, Bergamo and Siena, Phoenix. */
static int is_zen4(void) {
  unsigned family = 0, model = 0;
  return cpu_model(&family, &model) == 'A' && family == 0x19 &&
         ((model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) ||
          (model >= 0xa0 && model <= 0xaf));
}

/* Intel family 6 Xeons with AVX-512 from Sapphire Rapids on: Sapphire
 * Rapids (0x8f), Emerald Rapids (0xcf), Granite Rapids (0xad, 0xae), and
 * 0xa7, the model this machine kind's AMX Xeon VM reports. */
static int is_recent_xeon(void) {
  unsigned family = 0, model = 0;
  return cpu_model(&family, &model) == 'I' && family == 6 &&
         (model == 0x8f || model == 0xcf || model == 0xad || model == 0xae || model == 0xa7);
}

pa_isa pa_isa_detect(void) {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return PA_ISA_SCALAR;
  int osxsave = (ecx >> 27) & 1, fma = (ecx >> 12) & 1, f16c = (ecx >> 29) & 1;
  if (!osxsave) return PA_ISA_SCALAR;
  uint64_t xcr0 = read_xcr0();
  int os_ymm = (xcr0 & 0x6) == 0x6;
  int os_zmm = (xcr0 & 0xe6) == 0xe6;
  int os_tiles = (xcr0 & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA */
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return PA_ISA_SCALAR;
  int avx2 = (ebx >> 5) & 1;
  int avx512f = (ebx >> 16) & 1, avx512dq = (ebx >> 17) & 1;
  int avx512bw = (ebx >> 30) & 1, avx512vl = (ebx >> 31) & 1;
  int vbmi = (ecx >> 1) & 1, amx_bf16 = (edx >> 22) & 1, amx_tile = (edx >> 24) & 1;
  if (!(os_ymm && avx2 && fma && f16c)) return PA_ISA_SCALAR;
  if (!(os_zmm && avx512f && avx512dq && avx512bw && avx512vl)) return PA_ISA_AVX2;
  /* The bf16 dot products come with vpermi2b for the FP8 lookups. */
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || !vbmi || !((eax >> 5) & 1)) {
    return PA_ISA_AVX512;
  }
  /* cppcheck-suppress knownConditionTrueFalse ; os_grants_amx is 0 only off Linux */
  if (!(amx_bf16 && amx_tile && os_tiles && os_grants_amx())) return PA_ISA_AVX512BF16;
  return PA_ISA_AMX;
}
#else
pa_isa pa_isa_detect(void) { return PA_ISA_SCALAR; }
#endif

static const char *const pa_isa_names[PA_NUM_ISAS] = {"scalar", "avx2", "avx512", "avx512bf16",
                                                      "amx"};

const char *pa_isa_name(pa_isa isa) { return pa_isa_names[isa]; }

const char *pa_isa_family_name(pa_isa isa) {
  return pa_isa_names[isa > PA_ISA_AVX512 ? PA_ISA_AVX512 : isa];
}

int pa_isa_parse(const char *name, pa_isa *isa) {
  for (int i = 0; i < PA_NUM_ISAS; i++) {
    if (strcmp(name, pa_isa_names[i]) == 0) {
      *isa = (pa_isa)i;
      return 1;
    }
  }
  return 0;
}

#if defined(PA_HAVE_X86_KERNELS)
/* Dot products whose instruction costs at most this many FMAs (it does the
 * work of two) beat widening bf16 to f32 for the FMA units. */
#define PA_DOT_MAX_COST 1.5

static int pa_dot_fast = 1;
static pthread_once_t pa_dot_once = PTHREAD_ONCE_INIT;

static void measure_dot(void) { pa_dot_fast = pa_bf16_dot_cost_avx512bf16() <= PA_DOT_MAX_COST; }
#endif

int pa_prefetch_to_l2_suits(void) {
#if defined(PA_HAVE_X86_KERNELS)
  return is_zen4() || is_recent_xeon();
#else
  return 0;
#endif
}

int pa_bf16_dot_is_fast(void) {
#if defined(PA_HAVE_X86_KERNELS)
  if (pa_isa_detect() < PA_ISA_AVX512BF16) return 0;
  pthread_once(&pa_dot_once, measure_dot);
  return pa_dot_fast;
#else
  return 0;
#endif
}

void pa_kernels_build(pa_isa isa, int bf16_dot, pa_kernels *kernels) {
  memset(kernels, 0, sizeof *kernels);
  pa_convert_kernels_scalar(kernels);
  pa_attn_kernels_scalar(kernels);
  pa_prefill_kernels_scalar(kernels);
  pa_tiled_kernels_scalar(kernels);
#if defined(PA_HAVE_X86_KERNELS)
  if (isa >= PA_ISA_AVX2) {
    pa_convert_kernels_avx2(kernels);
    pa_attn_kernels_avx2(kernels);
    pa_prefill_kernels_avx2(kernels);
  }
  if (isa >= PA_ISA_AVX512) {
    pa_convert_kernels_avx512(kernels);
    pa_attn_kernels_avx512(kernels);
    pa_attn_split_kernels_avx512(kernels);
    pa_prefill_kernels_avx512(kernels);
  }
  if (isa >= PA_ISA_AVX512BF16) {
    /* The bf16 pair layouts serve the dot products and the tiles; with
     * neither, bf16 and FP8 caches stay on the f32 path whole, whose FP8
     * kernels here decode by byte lookups. */
    int pairs = bf16_dot || isa >= PA_ISA_AMX;
    pa_convert_kernels_avx512bf16(kernels);
    pa_attn_fp8_fma_kernels_avx512bf16(kernels);
    if (pairs) pa_attn_kernels_avx512bf16(kernels, bf16_dot);
    pa_prefill_kernels_avx512bf16(kernels, pairs);
    if (pairs) pa_attn_fp8_kernels_avx512bf16(kernels);
  }
  if (isa >= PA_ISA_AMX) pa_prefill_kernels_amx(kernels);
#endif
  for (int act = 0; act < PA_NUM_ACT_DTYPES; act++) {
    for (int cache = 0; cache < PA_NUM_DTYPES; cache++) {
      pa_attn_ops *ops = &kernels->attn[act][cache];
      if (!ops->qk) { /* the f32 path: Q converted and scaled, f32 kernels */
        ops->load_q = kernels->load_row[act];
        ops->q_size = sizeof(float);
        ops->scale_scores = 0;
        ops->qk = kernels->qk[cache];
        ops->pv = kernels->pv[cache];
      }
      if (!ops->load_q_packed) ops->load_q_packed = ops->load_q;
      if (!ops->packed_min_rows) ops->packed_min_rows = kernels->packed_min_rows;
      if (!ops->partial_tile_rows) ops->partial_tile_rows = PA_PARTIAL_TILE_ROWS;
      if (!ops->qk_packed) {
        ops->pack_k = kernels->pack_k[cache];
        ops->pack_v = kernels->pack_v[cache];
        ops->qk_packed = kernels->qk_packed;
        ops->pv_packed = kernels->pv_packed;
      }
    }
  }
  kernels->isa = pa_isa_family_name(isa);
  kernels->bf16_dot = isa >= PA_ISA_AVX512BF16 && bf16_dot;
}
