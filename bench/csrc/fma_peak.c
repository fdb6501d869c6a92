/* Peak of fp32 fused multiply-adds on this CPU: 12 independent vfmadd231ps chains (two
 * multiply-adds each per iteration) in inline assembly, zmm (AVX-512F) or ymm (AVX2 + FMA3:
 * 16 registers, so the sources are ymm14/15). Each returns the multiply-accumulates it did:
 * iters * 24 * lanes. */
#include <stdint.h>

#define FMA(R, S, T, N) "vfmadd231ps %%" R #S ", %%" R #T ", %%" R #N "\n\t"
#define FMA12(R, S, T)                                                                           \
  FMA(R, S, T, 0) FMA(R, S, T, 1) FMA(R, S, T, 2) FMA(R, S, T, 3) FMA(R, S, T, 4)                \
  FMA(R, S, T, 5) FMA(R, S, T, 6) FMA(R, S, T, 7) FMA(R, S, T, 8) FMA(R, S, T, 9)                \
  FMA(R, S, T, 10) FMA(R, S, T, 11)
#define CLOBBERS                                                                                 \
  "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"

__attribute__((target("avx512f"))) int64_t tirbyoc_fma_zmm_peak(int64_t iters) {
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(FMA12("zmm", 30, 31) FMA12("zmm", 30, 31) : : : CLOBBERS);
  }
  return iters * 24 * 16;
}

__attribute__((target("avx2,fma"))) int64_t tirbyoc_fma_ymm_peak(int64_t iters) {
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(FMA12("ymm", 14, 15) FMA12("ymm", 14, 15) : : : CLOBBERS);
  }
  return iters * 24 * 8;
}
