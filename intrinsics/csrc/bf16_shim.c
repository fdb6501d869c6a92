/* x86_avx512_bf16: bf16 x bf16 -> f32 GEMM with AVX512_BF16's vdpbf16ps, destination-passing.
 *
 * C[m, n] += A[m, k] . B in float32. A is read in place: m rows of k bf16, row stride sa
 * elements. B arrives packed [n/16][k/2][16][2] (tirbyoc packs weights once, at compile time:
 * the layout x86_amx_bf16 reads too), so one 64-byte row of a panel is the 16 output columns'
 * pairs for two reduction steps - what one vdpbf16ps multiplies by a broadcast pair of A.
 *
 * Register block: 8 rows x 32 columns, 16 zmm accumulators (two panels), each k-pair step two
 * panel loads, eight 4-byte broadcasts of A and sixteen vdpbf16ps (32 products each, summed in
 * float32: the instruction rounds each of its two additions). Fewer rows at the bottom and a
 * 16-column panel at the right take the same code with constant smaller shapes. n must be a
 * multiple of 16 and k of 2 (the template pads them).
 *
 * Written in C because TVM 0.27 lowers bfloat16 vectors to 16-bit integers before LLVM sees
 * them (BF16StorageLegalize), while LLVM's vdpbf16ps takes <32 x bfloat>: a TIR intrinsic
 * cannot call it. On CPUs without AVX512_BF16, x86_amx_bf16_emulated runs the same rewrite.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define BF16_ATTR __attribute__((target("avx512f,avx512bf16"), always_inline)) static inline

enum { MR = 8 };

/* rows x (16 * cols) outputs (rows <= MR, cols in {1, 2}; constants where it is inlined). */
BF16_ATTR void block(int rows, int cols, int32_t k, const uint16_t* a, int64_t sa, const uint16_t* b,
                     float* c, int64_t sc) {
  __m512 acc[MR][2];
  const uint16_t* b1 = b + (int64_t)k * 16;
  for (int r = 0; r < rows; ++r)
    for (int q = 0; q < cols; ++q) acc[r][q] = _mm512_loadu_ps(c + r * sc + 16 * q);
  for (int32_t kk = 0; kk < k; kk += 2) {
    __m512bh p0 = (__m512bh)_mm512_loadu_si512(b + (int64_t)kk * 16), p1;
    if (cols > 1) p1 = (__m512bh)_mm512_loadu_si512(b1 + (int64_t)kk * 16);
    for (int r = 0; r < rows; ++r) {
      int32_t pair;
      memcpy(&pair, a + r * sa + kk, 4);
      __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, p0);
      if (cols > 1) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, p1);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int q = 0; q < cols; ++q) _mm512_storeu_ps(c + r * sc + 16 * q, acc[r][q]);
}

/* The bottom rows (fewer than MR) as one constant-shaped block. */
#define ROWS_CASE(R)                                             \
  case R:                                                        \
    if (cols > 1)                                                \
      block(R, 2, k, a, sa, b, c, sc);                           \
    else                                                         \
      block(R, 1, k, a, sa, b, c, sc);                           \
    break;

__attribute__((target("avx512f,avx512bf16"))) static void last_rows(int rows, int cols, int32_t k,
                                                                   const uint16_t* a, int64_t sa,
                                                                   const uint16_t* b, float* c, int64_t sc) {
  switch (rows) {
    ROWS_CASE(1)
    ROWS_CASE(2)
    ROWS_CASE(3)
    ROWS_CASE(4)
    ROWS_CASE(5)
    ROWS_CASE(6)
    ROWS_CASE(7)
    default:
      break;
  }
}

/* C[m, n] += A[m, k] . B. Returns 0, or -1 when n % 16 or k % 2 is not 0. */
__attribute__((target("avx512f,avx512bf16"))) int32_t tirbyoc_avx512bf16_gemm(
    int32_t m, int32_t n, int32_t k, const uint16_t* a, int32_t sa, const uint16_t* b, float* c, int32_t sc) {
  if (n % 16 || k % 2) return -1;
  for (int32_t j = 0; j < n; j += 32) {
    const uint16_t* panel = b + (int64_t)(j / 16) * k * 16;
    int cols = j + 32 <= n ? 2 : 1;
    int32_t i = 0;
    for (; i + MR <= m; i += MR) {
      if (cols > 1)
        block(MR, 2, k, a + (int64_t)i * sa, sa, panel, c + (int64_t)i * sc + j, sc);
      else
        block(MR, 1, k, a + (int64_t)i * sa, sa, panel, c + (int64_t)i * sc + j, sc);
    }
    if (i < m) last_rows(m - i, cols, k, a + (int64_t)i * sa, sa, panel, c + (int64_t)i * sc + j, sc);
  }
  return 0;
}
