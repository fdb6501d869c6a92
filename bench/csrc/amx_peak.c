/* Peak of Intel AMX-INT8 on this CPU: four independent tdpbusd chains (2 x 2 accumulator tiles,
 * 16 x 16 x 64 each), operands left in the tile registers, as a GEMM kernel's inner loop issues
 * them. Asks Linux for the tile state and loads the tile configuration in the calling thread.
 * Returns the number of multiply-accumulates performed: iters * 4 * 16 * 16 * 64 (0 when
 * Linux refuses the tile state). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

static const tile_config CONFIG __attribute__((aligned(64))) = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

__attribute__((target("amx-tile,amx-int8"))) int64_t tirbyoc_amx_peak(int64_t iters) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) return 0;
  __asm__ volatile("ldtilecfg %0" ::"m"(CONFIG));
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  _tile_release();
  return iters * 4 * 16 * 16 * 64;
}
