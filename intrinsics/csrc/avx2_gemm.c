/* x86_avx2_gemm: exact u8 x s8 -> s32 GEMM blocks on AVX2, destination-passing (C += A . B).
 *
 *   tirbyoc_avx2_gemm_u8s8(m, n, k, a, sa, b, c, sc)
 *
 * The same call as x86_amx's int8 kernel (csrc/amx_shim.c): A is read in place, m rows of k
 * u8, row stride sa; B arrives packed [n/16][k/4][16][4] i8 (x86_vnni's and AMX's layout,
 * packed once at compile time); C is m rows of n int32 sums, row stride sc, accumulated into.
 * n must be a multiple of 16 and k of 4.
 *
 * Why a kernel and not the x86_avx2 intrinsic: AVX2 has no exact 8-bit dot product
 * (vpmaddubsw saturates its 16-bit pair sums), so the exact one is vpmaddwd on operands widened
 * to 16 bits. Widened in the loop, each step spends two shuffles a row of A (vpbroadcastw,
 * vpmovzxbw) and one a column tile of B (vpmovsxbw) beside its vpmaddwd and vpaddd: 26 vector
 * operations for 8 vpmaddwd in a 4 x 2 block, where vpmaddwd alone could issue in 16. Here
 * each call widens its rows of A and each 16-column panel of B once per KC-long piece of the
 * reduction into small int16 buffers (24 KB: they stay in L1), and the loop reads them with a
 * broadcast load (vpbroadcastd, no shuffle) and a plain load: 8 vpmaddwd + 8 vpaddd a step.
 * vpmaddwd sums two 16 x 16-bit products in 32 bits: every value is exact (u8 x i8 products
 * stay within 16 bits' magnitude twice over), and the int32 sums wrap as TVM's do.
 */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define KC 256 /* reduction elements widened a pass: 32 rows x 256 + 16 x 256 int16 = 24 KB */
#define MAX_ROWS 32 /* rows widened at once (a call's block is 32 rows) */
#define ROWS 4 /* rows of the register block: 4 x 2 int32 vectors (16 columns) */
#define AVX2 __attribute__((target("avx2")))

/* rows [0, m) of A, reduction [k0, k0 + kc) -> a16[i * KC + kk] */
AVX2 static void widen_rows(const uint8_t* a, int64_t sa, int32_t m, int32_t k0, int32_t kc, int16_t* a16) {
  for (int32_t i = 0; i < m; ++i) {
    const uint8_t* row = a + (int64_t)i * sa + k0;
    int16_t* out = a16 + (int64_t)i * KC;
    int32_t kk = 0;
    for (; kk + 16 <= kc; kk += 16)
      _mm256_storeu_si256((__m256i*)(out + kk), _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(row + kk))));
    for (; kk < kc; ++kk) out[kk] = row[kk];
  }
}

/* one 16-column panel of B, reduction [k0, k0 + kc) -> b16[(half * KC / 2 + pair) * 16 + col * 2 + j]:
 * for each half of the panel (8 columns) and pair of reduction steps, one vector of 8 x 2 int16 */
AVX2 static void widen_panel(const int8_t* panel, int32_t k0, int32_t kc, int16_t* b16) {
  /* within 4 columns x 4 steps (16 bytes): steps 0-1 of each column, then steps 2-3 */
  const __m128i pairs = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  for (int32_t g = 0; g < kc / 4; ++g) {
    const int8_t* group = panel + (int64_t)(k0 / 4 + g) * 64; /* 16 columns x 4 steps */
    for (int32_t half = 0; half < 2; ++half) {
      __m128i lo = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(group + half * 32)), pairs);
      __m128i hi = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(group + half * 32 + 16)), pairs);
      int16_t* out = b16 + ((int64_t)half * (KC / 2) + 2 * g) * 16;
      _mm256_storeu_si256((__m256i*)out, _mm256_cvtepi8_epi16(_mm_unpacklo_epi64(lo, hi)));
      _mm256_storeu_si256((__m256i*)(out + 16), _mm256_cvtepi8_epi16(_mm_unpackhi_epi64(lo, hi)));
    }
  }
}

/* C[rows, 16 columns] += a16[rows, kc] . b16 (rows <= ROWS) */
AVX2 static inline void block(int32_t rows, int32_t kc, const int16_t* a16, const int16_t* b16, int32_t* c,
                              int64_t sc) {
  __m256i acc[ROWS][2];
  for (int32_t r = 0; r < rows; ++r) {
    acc[r][0] = _mm256_loadu_si256((const __m256i*)(c + r * sc));
    acc[r][1] = _mm256_loadu_si256((const __m256i*)(c + r * sc + 8));
  }
  for (int32_t q = 0; q < kc / 2; ++q) {
    __m256i b0 = _mm256_loadu_si256((const __m256i*)(b16 + (int64_t)q * 16));
    __m256i b1 = _mm256_loadu_si256((const __m256i*)(b16 + ((int64_t)KC / 2 + q) * 16));
    for (int32_t r = 0; r < ROWS; ++r) {
      if (r >= rows) break;
      int32_t pair;
      memcpy(&pair, a16 + (int64_t)r * KC + 2 * q, 4);
      __m256i a = _mm256_set1_epi32(pair);
      acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(a, b0));
      acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(a, b1));
    }
  }
  for (int32_t r = 0; r < rows; ++r) {
    _mm256_storeu_si256((__m256i*)(c + r * sc), acc[r][0]);
    _mm256_storeu_si256((__m256i*)(c + r * sc + 8), acc[r][1]);
  }
}

/* the full 4-row block, its row loop unrolled by the compiler */
AVX2 static void block4(int32_t kc, const int16_t* a16, const int16_t* b16, int32_t* c, int64_t sc) {
  block(ROWS, kc, a16, b16, c, sc);
}

AVX2 int32_t tirbyoc_avx2_gemm_u8s8(int32_t m, int32_t n, int32_t k, const uint8_t* a, int32_t sa,
                                    const int8_t* b, int32_t* c, int32_t sc) {
  if (n % 16 || k % 4) return -1;
  int16_t a16[MAX_ROWS * KC] __attribute__((aligned(32)));
  int16_t b16[16 * KC] __attribute__((aligned(32)));
  for (int32_t i0 = 0; i0 < m; i0 += MAX_ROWS) {
    int32_t mm = m - i0 < MAX_ROWS ? m - i0 : MAX_ROWS;
    const uint8_t* ai = a + (int64_t)i0 * sa;
    int32_t* ci = c + (int64_t)i0 * sc;
    for (int32_t k0 = 0; k0 < k; k0 += KC) {
      int32_t kc = k - k0 < KC ? k - k0 : KC;
      widen_rows(ai, sa, mm, k0, kc, a16);
      for (int32_t p = 0; p < n / 16; ++p) {
        widen_panel(b + (int64_t)p * k * 16, k0, kc, b16);
        int32_t i = 0;
        for (; i + ROWS <= mm; i += ROWS) block4(kc, a16 + (int64_t)i * KC, b16, ci + (int64_t)i * sc + p * 16, sc);
        if (i < mm) block(mm - i, kc, a16 + (int64_t)i * KC, b16, ci + (int64_t)i * sc + p * 16, sc);
      }
    }
  }
  return 0;
}
#endif
