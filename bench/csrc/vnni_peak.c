/* Peak of AVX-512 VNNI on this CPU: 24 independent vpdpbusd zmm chains in inline assembly
 * (a C loop with the _mm512_dpbusd_epi32 intrinsic spills its accumulators and reaches only
 * about half). Returns the number of multiply-accumulates performed: iters * 24 * 64. */
#include <stdint.h>

__attribute__((target("avx512f,avx512vnni"))) int64_t tirbyoc_vnni_peak(int64_t iters) {
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        "vpdpbusd %%zmm24, %%zmm25, %%zmm0\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm1\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm2\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm3\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm4\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm5\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm6\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm7\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm8\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm9\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm10\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm11\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm12\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm13\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm14\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm15\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm16\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm17\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm18\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm19\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm20\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm21\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm22\n\t"
        "vpdpbusd %%zmm24, %%zmm25, %%zmm23\n\t"
        :
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
          "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
          "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
  }
  return iters * 24 * 64;
}
