// Host driver of the fused MUL_MAT_<glu> core functions (test_mul_mat_glu.py): mv.cc (float
// weights, f32 x) or, with DRIVER_MVQ=1, mvq.cc (f16 / block-quantized weights). Reads two K
// chunks of a W_g tile, two of a W_u tile (hex bytes, chunk after chunk) and two x chunks
// (MV_KC f32 each, hex-float), runs one round as the design does (gate_zero, gate x2, zero,
// mv x2, glu) twice over the same data (the second round checks that gate_zero resets the
// core's stash) and prints both rounds' y in hex-float.
#if DRIVER_MVQ
#include "mvq.cc"
#define FN(suffix) ggml_mvq##suffix
using WT = int8_t;
constexpr int TILE_BYTES = MV_ROWS * ROW_BYTES;
#else
#include "mv.cc"
#define FN(suffix) ggml_mv##suffix
using WT = W_T;
constexpr int TILE_BYTES = MV_ROWS * MV_KC * (int)sizeof(W_T);
#endif

#include <cstdio>
#include <cstdlib>
#include <cstring>

alignas(64) static uint8_t w_in[4][TILE_BYTES]; // W_g chunks 0, 1, W_u chunks 0, 1
alignas(64) static float x_in[2][MV_KC];
alignas(64) static float y[MV_ROWS];

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  FILE *f = std::fopen(argv[1], "r");
  if (!f)
    return 2;
  for (auto &tile : w_in)
    for (auto &b : tile) {
      unsigned v;
      if (std::fscanf(f, "%x", &v) != 1)
        return 3;
      b = uint8_t(v);
    }
  for (auto &chunk : x_in)
    for (auto &v : chunk) {
      char buf[64];
      if (std::fscanf(f, "%63s", buf) != 1)
        return 3;
      v = std::strtof(buf, nullptr);
    }
  WT *w[4];
  for (int i = 0; i < 4; ++i)
    w[i] = reinterpret_cast<WT *>(w_in[i]);
  for (int round = 0; round < 2; ++round) {
    std::memset(y, 0xff, sizeof y); // a fresh y object holds garbage (NaN here)
    FN(_gate_zero)();
    FN(_gate)(w[0], x_in[0]);
    FN(_gate)(w[1], x_in[1]);
    FN(_zero)(y);
    FN()(w[2], x_in[0], y);
    FN()(w[3], x_in[1], y);
    FN(_glu)(y);
    for (int r = 0; r < MV_ROWS; ++r)
      std::printf("%a\n", (double)y[r]);
  }
  return 0;
}
