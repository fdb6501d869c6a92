/* Peak of exact int8 multiply-accumulate with vpmaddwd on this CPU: independent chains of
 * vpmaddwd (two 16 x 16-bit products summed per 32-bit lane) each followed by the vpaddd that
 * accumulates it, in inline assembly - the two instructions every exact AVX2 / AVX-512 BW int8
 * kernel issues per lane pair (operands widened to 16 bits; no saturation). Each function
 * returns the multiply-accumulates performed: ymm 16 per vpmaddwd, zmm 32. */
#include <stdint.h>

__attribute__((target("avx2"))) int64_t tirbyoc_pmaddwd_ymm_peak(int64_t iters) {
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        "vpmaddwd %%ymm14, %%ymm15, %%ymm7\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm8\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm9\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm10\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm11\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm12\n\t"
        "vpmaddwd %%ymm14, %%ymm15, %%ymm13\n\t"
        "vpaddd %%ymm7, %%ymm0, %%ymm0\n\t"
        "vpaddd %%ymm8, %%ymm1, %%ymm1\n\t"
        "vpaddd %%ymm9, %%ymm2, %%ymm2\n\t"
        "vpaddd %%ymm10, %%ymm3, %%ymm3\n\t"
        "vpaddd %%ymm11, %%ymm4, %%ymm4\n\t"
        "vpaddd %%ymm12, %%ymm5, %%ymm5\n\t"
        "vpaddd %%ymm13, %%ymm6, %%ymm6\n\t"
        :
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13");
  }
  return iters * 7 * 16;
}

__attribute__((target("avx512f,avx512bw"))) int64_t tirbyoc_pmaddwd_zmm_peak(int64_t iters) {
  for (int64_t i = 0; i < iters; ++i) {
    __asm__ volatile(
        "vpmaddwd %%zmm30, %%zmm31, %%zmm14\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm15\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm16\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm17\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm18\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm19\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm20\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm21\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm22\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm23\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm24\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm25\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm26\n\t"
        "vpmaddwd %%zmm30, %%zmm31, %%zmm27\n\t"
        "vpaddd %%zmm14, %%zmm0, %%zmm0\n\t"
        "vpaddd %%zmm15, %%zmm1, %%zmm1\n\t"
        "vpaddd %%zmm16, %%zmm2, %%zmm2\n\t"
        "vpaddd %%zmm17, %%zmm3, %%zmm3\n\t"
        "vpaddd %%zmm18, %%zmm4, %%zmm4\n\t"
        "vpaddd %%zmm19, %%zmm5, %%zmm5\n\t"
        "vpaddd %%zmm20, %%zmm6, %%zmm6\n\t"
        "vpaddd %%zmm21, %%zmm7, %%zmm7\n\t"
        "vpaddd %%zmm22, %%zmm8, %%zmm8\n\t"
        "vpaddd %%zmm23, %%zmm9, %%zmm9\n\t"
        "vpaddd %%zmm24, %%zmm10, %%zmm10\n\t"
        "vpaddd %%zmm25, %%zmm11, %%zmm11\n\t"
        "vpaddd %%zmm26, %%zmm12, %%zmm12\n\t"
        "vpaddd %%zmm27, %%zmm13, %%zmm13\n\t"
        :
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27");
  }
  return iters * 14 * 32;
}
