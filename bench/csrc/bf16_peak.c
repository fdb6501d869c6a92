/* Peak of AVX512_BF16 on this CPU: 24 independent vdpbf16ps zmm chains in inline assembly, as
 * x86_avx512_bf16's register block issues them (each adds 16 lanes x 2 bf16 products to
 * float32). Returns the number of multiply-accumulates performed: iters * 24 * 32. */
#include <stdint.h>

#define DP(N) "vdpbf16ps %%zmm24, %%zmm25, %%zmm" #N "\n\t"

__attribute__((target("avx512f,avx512bf16"))) int64_t tirbyoc_bf16_peak(int64_t iters) {
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(DP(0) DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7) DP(8) DP(9) DP(10) DP(11)
                     DP(12) DP(13) DP(14) DP(15) DP(16) DP(17) DP(18) DP(19) DP(20) DP(21) DP(22) DP(23)
                     :
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                       "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
                       "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
  }
  return iters * 24 * 32;
}
