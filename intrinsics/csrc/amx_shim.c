/* x86_amx: GEMMs on Intel AMX tiles, destination-passing (C += A . B), in two element types:
 *   u8 x s8 -> s32 (tdpbusd, AMX-INT8)      tirbyoc_amx_gemm_u8s8
 *   bf16 x bf16 -> f32 (tdpbf16ps, AMX-BF16) tirbyoc_amx_gemm_bf16
 *
 * A is read in place: m rows of k elements, row stride sa elements. B arrives packed in the
 * layout AVX-512 VNNI / AVX512_BF16 and AMX read alike, [n/16][k/g][16][g] with g = 4 bytes
 * (4 int8 or 2 bf16; tirbyoc packs weights once, at compile time): one AMX B tile (16 rows of
 * 64 bytes) is 16 consecutive k/g rows of a panel, 1 KB contiguous. C is m rows of n 32-bit
 * sums (int32 or float32), row stride sc elements, accumulated into.
 *
 * Both element types take the same path once lengths are counted in bytes (a 64-byte tile row
 * is 64 int8 or 32 bf16; a B panel's k-step s bytes starts s * 16 bytes in): only the tile
 * product and the vector tail differ, chosen by a constant `kind` the compiler folds away.
 *
 * Blocking: 2 x 2 accumulator tiles (32 x 32 outputs, tmm0-3) stay in the tile registers
 * over the whole reduction (k / 64 byte-steps of 2 A tiles, tmm4-5, and 2 B tiles, tmm6-7:
 * four tile products per step). Row remainders of 16 take one row tile; fewer than 16 rows are
 * copied into a zero-padded block first. A reduction that is not a multiple of 64 bytes
 * finishes its last bytes (a multiple of 4) with AVX-512 VNNI (vpdpbusd) or AVX512_BF16
 * (vdpbf16ps) on the stored accumulators, which read the same packed B. n must be a multiple
 * of 16 and k of 4 bytes (the template pads them).
 *
 * Linux hands a process the AMX tile state only on request: the library asks once when it is
 * loaded (a constructor), in whatever process loads it - a Python session or a deployed
 * model. The tile configuration is per thread; each thread loads it on its first call.
 *
 * TIRBYOC_AMX_EMULATED builds the same entry points as portable C, for CPUs without AMX
 * (x86_amx_emulated, x86_amx_bf16_emulated): int8 with the same 32-bit sums (tdpbusd neither
 * saturates nor rounds), bf16 with float32 sums of the exact products (tdpbf16ps rounds each
 * sum in float32 too, in its own order: the twins agree to float32 rounding, not bit for bit).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#ifdef TIRBYOC_AMX_EMULATED /* its own symbols: both libraries may be loaded in one process */
#define GEMM_U8S8 tirbyoc_amx_emulated_gemm_u8s8
#define GEMM_BF16 tirbyoc_amx_emulated_gemm_bf16
#define GRANTED tirbyoc_amx_emulated_granted
#else
#define GEMM_U8S8 tirbyoc_amx_gemm_u8s8
#define GEMM_BF16 tirbyoc_amx_gemm_bf16
#define GRANTED tirbyoc_amx_granted
#endif

static int amx_granted = -1;

__attribute__((constructor)) static void amx_request(void) {
#ifndef TIRBYOC_AMX_EMULATED
  amx_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
  amx_granted = 0;
#endif
}

/* 1 when Linux granted this process the AMX tile state (0: it did not; the emulated build: 0). */
int32_t GRANTED(void) {
  if (amx_granted < 0) amx_request();
  return amx_granted;
}

#ifdef TIRBYOC_AMX_EMULATED
/* C[m, n] += A[m, k] . B, B packed [n/16][k/4][16][4]; wrap-around 32-bit sums like tdpbusd. */
int32_t GEMM_U8S8(int32_t m, int32_t n, int32_t k, const uint8_t* a, int32_t sa, const int8_t* b,
                  int32_t* c, int32_t sc) {
  for (int32_t i = 0; i < m; ++i)
    for (int32_t j = 0; j < n; ++j) {
      const int8_t* panel = b + (int64_t)(j / 16) * k * 16 + (j % 16) * 4;
      uint32_t acc = (uint32_t)c[(int64_t)i * sc + j];
      for (int32_t kk = 0; kk < k; ++kk)
        acc += (uint32_t)((int32_t)a[(int64_t)i * sa + kk] * (int32_t)panel[(kk / 4) * 64 + kk % 4]);
      c[(int64_t)i * sc + j] = (int32_t)acc;
    }
  return 0;
}

static float bf16_value(uint16_t bits) {
  uint32_t wide = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &wide, 4);
  return f;
}

/* C[m, n] += A[m, k] . B in float32, B packed [n/16][k/2][16][2] (bf16 as its 16 bits). */
int32_t GEMM_BF16(int32_t m, int32_t n, int32_t k, const uint16_t* a, int32_t sa, const uint16_t* b,
                  float* c, int32_t sc) {
  if (n % 16 || k % 2) return -1;
  for (int32_t i = 0; i < m; ++i)
    for (int32_t j = 0; j < n; ++j) {
      const uint16_t* panel = b + (int64_t)(j / 16) * k * 16 + (j % 16) * 2;
      float acc = c[(int64_t)i * sc + j];
      for (int32_t kk = 0; kk < k; ++kk)  /* each product is exact in float32 */
        acc += bf16_value(a[(int64_t)i * sa + kk]) * bf16_value(panel[(kk / 2) * 32 + kk % 2]);
      c[(int64_t)i * sc + j] = acc;
    }
  return 0;
}
#else
#include <immintrin.h>

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* palette 1, all eight tiles 16 rows x 64 bytes */
static const tile_config CONFIG __attribute__((aligned(64))) = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
static __thread int configured;

static inline void configure(void) {
  if (!configured) { /* ldtilecfg costs about 150 cycles: once per thread */
    __asm__ volatile("ldtilecfg %0" ::"m"(CONFIG));
    configured = 1;
  }
}

enum { U8S8 = 0, BF16 = 1 }; /* the element type: int8 (tdpbusd) or bf16 (tdpbf16ps) */
#define AMX_TARGET "amx-tile,amx-int8,amx-bf16,avx512f,avx512vnni,avx512bf16"
#define TILE_ATTR __attribute__((target(AMX_TARGET), always_inline)) static inline

/* acc += A . B in tiles: tdpbusd or tdpbf16ps (tile numbers must be constants). */
#define TILE_PRODUCT(kind, acc, ta, tb) \
  do {                                  \
    if ((kind) == BF16)                 \
      _tile_dpbf16ps(acc, ta, tb);      \
    else                                \
      _tile_dpbusd(acc, ta, tb);        \
  } while (0)

/* rows x cols accumulator tiles (rows, cols in {1, 2}: tmm0-1 the first row of tiles, tmm2-3 the
 * second) over kb64 bytes (a multiple of 64) of a kb-byte reduction; A rows in tmm4-5, B panels in
 * tmm6-7. Called with constant kind, rows and cols, so each use inlines to what it needs. */
TILE_ATTR void block(int kind, int rows, int cols, int32_t kb64, int32_t kb, const uint8_t* a, int64_t sa,
                     const uint8_t* b, char* c, int64_t cs) {
  const uint8_t* b1 = b + (int64_t)kb * 16;
  const uint8_t* a1 = a + 16 * sa;
  char* c1 = c + 16 * cs;
  _tile_loadd(0, c, cs);
  if (cols > 1) _tile_loadd(1, c + 64, cs);
  if (rows > 1) _tile_loadd(2, c1, cs);
  if (rows > 1 && cols > 1) _tile_loadd(3, c1 + 64, cs);
  for (int32_t s = 0; s < kb64; s += 64) {
    _tile_loadd(4, a + s, sa);
    _tile_loadd(6, b + (int64_t)s * 16, 64);
    TILE_PRODUCT(kind, 0, 4, 6);
    if (cols > 1) {
      _tile_loadd(7, b1 + (int64_t)s * 16, 64);
      TILE_PRODUCT(kind, 1, 4, 7);
    }
    if (rows > 1) {
      _tile_loadd(5, a1 + s, sa);
      TILE_PRODUCT(kind, 2, 5, 6);
      if (cols > 1) TILE_PRODUCT(kind, 3, 5, 7);
    }
  }
  _tile_stored(0, c, cs);
  if (cols > 1) _tile_stored(1, c + 64, cs);
  if (rows > 1) _tile_stored(2, c1, cs);
  if (rows > 1 && cols > 1) _tile_stored(3, c1 + 64, cs);
}

/* The last kb - k0 bytes (a multiple of 4, under 64) of rows x n outputs with vpdpbusd or
 * vdpbf16ps: one 4-byte group of A broadcast against a 64-byte row of the packed panel. */
__attribute__((target(AMX_TARGET))) static inline void tail_vector(
    int kind, int32_t rows, int32_t n, int32_t k0, int32_t kb, const uint8_t* a, int64_t sa, const uint8_t* b,
    char* c, int64_t cs) {
  for (int32_t i = 0; i < rows; ++i)
    for (int32_t j = 0; j < n; j += 16) {
      const uint8_t* panel = b + (int64_t)(j / 16) * kb * 16;
      char* out = c + (int64_t)i * cs + (int64_t)j * 4;
      __m512i acc = _mm512_loadu_si512(out);
      for (int32_t kk = k0; kk < kb; kk += 4) {
        int32_t group;
        memcpy(&group, a + (int64_t)i * sa + kk, 4);
        __m512i pair = _mm512_set1_epi32(group), row = _mm512_loadu_si512(panel + (int64_t)kk * 16);
        if (kind == BF16)
          acc = _mm512_castps_si512(_mm512_dpbf16_ps(_mm512_castsi512_ps(acc), (__m512bh)pair, (__m512bh)row));
        else
          acc = _mm512_dpbusd_epi32(acc, pair, row);
      }
      _mm512_storeu_si512(out, acc);
    }
}

/* Rows [0, rows) of a full-height call: 32-row blocks, then 16, over 32- and 16-column blocks. */
__attribute__((target(AMX_TARGET))) static inline void rows_of_tiles(
    int kind, int32_t rows, int32_t n, int32_t kb64, int32_t kb, const uint8_t* a, int64_t sa, const uint8_t* b,
    char* c, int64_t cs) {
  for (int32_t j = 0; j < n; j += 32) {
    const uint8_t* panel = b + (int64_t)(j / 16) * kb * 16;
    char* cj = c + (int64_t)j * 4;
    int two_cols = j + 32 <= n;
    int32_t i = 0;
    for (; i + 32 <= rows; i += 32) {
      if (two_cols)
        block(kind, 2, 2, kb64, kb, a + i * sa, sa, panel, cj + i * cs, cs);
      else
        block(kind, 2, 1, kb64, kb, a + i * sa, sa, panel, cj + i * cs, cs);
    }
    if (i < rows) { /* 16 rows left */
      if (two_cols)
        block(kind, 1, 2, kb64, kb, a + i * sa, sa, panel, cj + i * cs, cs);
      else
        block(kind, 1, 1, kb64, kb, a + i * sa, sa, panel, cj + i * cs, cs);
    }
  }
}

enum { SCRATCH_ROWS = 16 };
static __thread uint8_t* scratch_a;
static __thread char* scratch_c;
static __thread int64_t scratch_a_bytes, scratch_c_bytes;

/* `block` if it holds `want` bytes, else a new 64-byte aligned one (the old one freed, *have
   updated); NULL, with `block` kept, if out of memory. */
static void* grow(void* block, int64_t* have, int64_t want) {
  if (want <= *have) return block;
  void* p = aligned_alloc(64, (want + 63) / 64 * 64);
  if (!p) return NULL;
  free(block);
  *have = want;
  return p;
}

/* Thread-local blocks for a remainder of fewer than 16 rows (grown as needed, kept). */
static int grow_scratch(int64_t a_bytes, int64_t c_bytes) {
  uint8_t* a = (uint8_t*)grow(scratch_a, &scratch_a_bytes, a_bytes);
  if (!a) return -1;
  scratch_a = a;
  char* c = (char*)grow(scratch_c, &scratch_c_bytes, c_bytes);
  if (!c) return -1;
  scratch_c = c;
  return 0;
}

/* C[m, n] += A . B with kb-byte rows of A (row stride sa bytes) and 4-byte C elements (row
 * stride cs bytes). Returns 0, or -1 when a remainder block cannot be allocated. */
__attribute__((target(AMX_TARGET))) static inline int32_t gemm(int kind, int32_t m, int32_t n, int32_t kb,
                                                             const uint8_t* a, int64_t sa, const uint8_t* b,
                                                             char* c, int64_t cs) {
  configure();
  int32_t kb64 = kb & ~63;
  int32_t full = m & ~15;
  if (kb64) rows_of_tiles(kind, full, n, kb64, kb, a, sa, b, c, cs);
  if (kb64 < kb) tail_vector(kind, full, n, kb64, kb, a, sa, b, c, cs);
  int32_t rest = m - full;
  if (rest) { /* copied into zero-padded 16-row blocks, computed, the valid rows copied back */
    int32_t ka = (kb + 63) & ~63;
    int64_t row_c = (int64_t)n * 4;
    if (grow_scratch((int64_t)SCRATCH_ROWS * ka, SCRATCH_ROWS * row_c)) return -1;
    memset(scratch_a, 0, (size_t)SCRATCH_ROWS * ka);
    memset(scratch_c, 0, (size_t)(SCRATCH_ROWS * row_c));
    for (int32_t i = 0; i < rest; ++i) {
      memcpy(scratch_a + (int64_t)i * ka, a + (full + i) * sa, (size_t)kb);
      memcpy(scratch_c + i * row_c, c + (full + i) * cs, (size_t)row_c);
    }
    if (kb64) rows_of_tiles(kind, SCRATCH_ROWS, n, kb64, kb, scratch_a, ka, b, scratch_c, row_c);
    if (kb64 < kb) tail_vector(kind, rest, n, kb64, kb, scratch_a, ka, b, scratch_c, row_c);
    for (int32_t i = 0; i < rest; ++i) memcpy(c + (full + i) * cs, scratch_c + i * row_c, (size_t)row_c);
  }
  return 0;
}

/* C[m, n] += u8 A[m, k] . s8 B, B packed [n/16][k/4][16][4]. -1 when n % 16 or k % 4 is not 0. */
__attribute__((target(AMX_TARGET))) int32_t GEMM_U8S8(int32_t m, int32_t n, int32_t k, const uint8_t* a,
                                                    int32_t sa, const int8_t* b, int32_t* c, int32_t sc) {
  if (n % 16 || k % 4) return -1;
  return gemm(U8S8, m, n, k, a, sa, (const uint8_t*)b, (char*)c, (int64_t)sc * 4);
}

/* C[m, n] += bf16 A[m, k] . bf16 B in float32, B packed [n/16][k/2][16][2]. -1 when n % 16 or
 * k % 2 is not 0. */
__attribute__((target(AMX_TARGET))) int32_t GEMM_BF16(int32_t m, int32_t n, int32_t k, const uint16_t* a,
                                                    int32_t sa, const uint16_t* b, float* c, int32_t sc) {
  if (n % 16 || k % 2) return -1;
  return gemm(BF16, m, n, 2 * k, (const uint8_t*)a, (int64_t)sa * 2, (const uint8_t*)b, (char*)c,
              (int64_t)sc * 4);
}
#endif
