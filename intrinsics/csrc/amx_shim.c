/* x86_amx: u8 x s8 -> s32 GEMM on Intel AMX tiles, destination-passing (C += A . B).
 *
 * A is read in place: m rows of k bytes, row stride sa bytes. B arrives packed in the layout
 * AVX-512 VNNI and AMX read alike, [n/16][k/4][16][4] (tirbyoc packs weights once, at
 * compile time): one AMX B tile (16 rows of 64 bytes) is 16 consecutive k/4 rows of a panel,
 * 1 KB contiguous. C is m rows of n int32, row stride sc elements, accumulated into.
 *
 * Blocking: 2 x 2 accumulator tiles (32 x 32 outputs, tmm0-3) stay in the tile registers
 * over the whole reduction (k / 64 steps of 2 A tiles, tmm4-5, and 2 B tiles, tmm6-7: four
 * tdpbusd per step). Row remainders of 16 take one row tile; fewer than 16 rows are copied
 * into a zero-padded block first. A reduction that is not a multiple of 64 finishes its last
 * k % 64 columns (a multiple of 4) with AVX-512 VNNI on the stored accumulators, which reads
 * the same packed B. n must be a multiple of 16 and k of 4 (the template pads them).
 *
 * Linux hands a process the AMX tile state only on request: the library asks once when it is
 * loaded (a constructor), in whatever process loads it - a Python session or a deployed
 * model. The tile configuration is per thread; each thread loads it on its first call.
 *
 * TIRBYOC_AMX_EMULATED builds the same entry points as portable C: the same sums in 32-bit
 * integers (tdpbusd neither saturates nor rounds), for CPUs without AMX (x86_amx_emulated).
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
#define GEMM tirbyoc_amx_emulated_gemm_u8s8
#define GRANTED tirbyoc_amx_emulated_granted
#else
#define GEMM tirbyoc_amx_gemm_u8s8
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
int32_t GEMM(int32_t m, int32_t n, int32_t k, const uint8_t* a, int32_t sa, const int8_t* b,
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

#define TILE_ATTR __attribute__((target("amx-tile,amx-int8"), always_inline)) static inline

/* rows x cols accumulator tiles (rows, cols in {1, 2}: tmm0-1 the first row of tiles, tmm2-3 the
 * second) over k64 columns (a multiple of 64); A rows in tmm4-5, B panels in tmm6-7. Called with
 * constant rows and cols, so each use inlines to the loads and dot products it needs. */
TILE_ATTR void block(int rows, int cols, int32_t k64, int32_t k, const uint8_t* a, int32_t sa,
                     const int8_t* b, int32_t* c, int64_t cs) {
  const int8_t* b1 = b + (int64_t)k * 16;
  const uint8_t* a1 = a + 16 * (int64_t)sa;
  int32_t* c1 = (int32_t*)((char*)c + 16 * cs);
  _tile_loadd(0, c, cs);
  if (cols > 1) _tile_loadd(1, c + 16, cs);
  if (rows > 1) _tile_loadd(2, c1, cs);
  if (rows > 1 && cols > 1) _tile_loadd(3, c1 + 16, cs);
  for (int32_t s = 0; s < k64; s += 64) {
    _tile_loadd(4, a + s, sa);
    _tile_loadd(6, b + (int64_t)s * 16, 64);
    _tile_dpbusd(0, 4, 6);
    if (cols > 1) {
      _tile_loadd(7, b1 + (int64_t)s * 16, 64);
      _tile_dpbusd(1, 4, 7);
    }
    if (rows > 1) {
      _tile_loadd(5, a1 + s, sa);
      _tile_dpbusd(2, 5, 6);
      if (cols > 1) _tile_dpbusd(3, 5, 7);
    }
  }
  _tile_stored(0, c, cs);
  if (cols > 1) _tile_stored(1, c + 16, cs);
  if (rows > 1) _tile_stored(2, c1, cs);
  if (rows > 1 && cols > 1) _tile_stored(3, c1 + 16, cs);
}

/* The last k - k0 columns (a multiple of 4, under 64) of rows x n outputs with vpdpbusd. */
__attribute__((target("avx512f,avx512vnni"))) static void tail_vnni(
    int32_t rows, int32_t n, int32_t k0, int32_t k, const uint8_t* a, int32_t sa, const int8_t* b,
    int32_t* c, int32_t sc) {
  for (int32_t i = 0; i < rows; ++i)
    for (int32_t j = 0; j < n; j += 16) {
      const int8_t* panel = b + (int64_t)(j / 16) * k * 16;
      __m512i acc = _mm512_loadu_si512(c + (int64_t)i * sc + j);
      for (int32_t kk = k0; kk < k; kk += 4) {
        int32_t group;
        memcpy(&group, a + (int64_t)i * sa + kk, 4);
        acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(group), _mm512_loadu_si512(panel + kk * 16));
      }
      _mm512_storeu_si512(c + (int64_t)i * sc + j, acc);
    }
}

/* Rows [0, rows) of a full-height call: 32-row blocks, then 16, over 32- and 16-column blocks. */
__attribute__((target("amx-tile,amx-int8"))) static void rows_of_tiles(
    int32_t rows, int32_t n, int32_t k64, int32_t k, const uint8_t* a, int32_t sa, const int8_t* b,
    int32_t* c, int64_t cs, int32_t sc) {
  for (int32_t j = 0; j < n; j += 32) {
    const int8_t* panel = b + (int64_t)(j / 16) * k * 16;
    int two_cols = j + 32 <= n;
    int32_t i = 0;
    for (; i + 32 <= rows; i += 32) {
      if (two_cols)
        block(2, 2, k64, k, a + (int64_t)i * sa, sa, panel, c + (int64_t)i * sc + j, cs);
      else
        block(2, 1, k64, k, a + (int64_t)i * sa, sa, panel, c + (int64_t)i * sc + j, cs);
    }
    if (i < rows) { /* 16 rows left */
      if (two_cols)
        block(1, 2, k64, k, a + (int64_t)i * sa, sa, panel, c + (int64_t)i * sc + j, cs);
      else
        block(1, 1, k64, k, a + (int64_t)i * sa, sa, panel, c + (int64_t)i * sc + j, cs);
    }
  }
}

enum { SCRATCH_ROWS = 16 };
static __thread uint8_t* scratch_a;
static __thread int32_t* scratch_c;
static __thread int64_t scratch_a_bytes, scratch_c_bytes;

/* Thread-local blocks for a remainder of fewer than 16 rows (grown as needed, kept). */
static int grow_scratch(int64_t a_bytes, int64_t c_bytes) {
  if (a_bytes > scratch_a_bytes) {
    uint8_t* p = (uint8_t*)aligned_alloc(64, (a_bytes + 63) / 64 * 64);
    if (!p) return -1;
    free(scratch_a);
    scratch_a = p;
    scratch_a_bytes = a_bytes;
  }
  if (c_bytes > scratch_c_bytes) {
    int32_t* p = (int32_t*)aligned_alloc(64, (c_bytes + 63) / 64 * 64);
    if (!p) return -1;
    free(scratch_c);
    scratch_c = p;
    scratch_c_bytes = c_bytes;
  }
  return 0;
}

/* C[m, n] += A[m, k] . B, B packed [n/16][k/4][16][4]. Returns 0, or -1 when n % 16 or k % 4
 * is not 0 or a remainder block cannot be allocated. */
__attribute__((target("amx-tile,amx-int8"))) int32_t GEMM(
    int32_t m, int32_t n, int32_t k, const uint8_t* a, int32_t sa, const int8_t* b, int32_t* c,
    int32_t sc) {
  if (n % 16 || k % 4) return -1;
  configure();
  int32_t k64 = k & ~63;
  int64_t cs = (int64_t)sc * 4;
  int32_t full = m & ~15;
  if (k64) rows_of_tiles(full, n, k64, k, a, sa, b, c, cs, sc);
  if (k64 < k) tail_vnni(full, n, k64, k, a, sa, b, c, sc);
  int32_t rest = m - full;
  if (rest) { /* copied into zero-padded 16-row blocks, computed, the valid rows copied back */
    int32_t ka = (k + 63) & ~63;
    if (grow_scratch((int64_t)SCRATCH_ROWS * ka, (int64_t)SCRATCH_ROWS * n * 4)) return -1;
    memset(scratch_a, 0, (size_t)SCRATCH_ROWS * ka);
    memset(scratch_c, 0, (size_t)SCRATCH_ROWS * n * 4);
    for (int32_t i = 0; i < rest; ++i) {
      memcpy(scratch_a + (int64_t)i * ka, a + (int64_t)(full + i) * sa, (size_t)k);
      memcpy(scratch_c + (int64_t)i * n, c + (int64_t)(full + i) * sc, (size_t)n * 4);
    }
    if (k64) rows_of_tiles(SCRATCH_ROWS, n, k64, k, scratch_a, ka, b, scratch_c, (int64_t)n * 4, n);
    if (k64 < k) tail_vnni(rest, n, k64, k, scratch_a, ka, b, scratch_c, n);
    for (int32_t i = 0; i < rest; ++i)
      memcpy(c + (int64_t)(full + i) * sc, scratch_c + (int64_t)i * n, (size_t)n * 4);
  }
  return 0;
}
#endif
