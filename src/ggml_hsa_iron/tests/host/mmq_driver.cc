// Host driver of kernels/mmq.cc (test_mmq_host.py): reads the number of K steps, then per
// step A_SPLIT A tiles (TILE_M x A_K f32 in hex-float each, already in the r x s block layout
// the memory tile delivers) and a B tile (TILE_N rows of the weight bytes of TILE_K values, hex
// bytes, as ggml stores them); calls ggml_mmq_zero once and ggml_mmq per A tile on the same C
// tile (the accumulation over K steps), and prints the C tile (r x t blocks) in hex-float.
#include "mmq.cc"

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  FILE *f = std::fopen(argv[1], "r");
  if (!f)
    return 2;
  int steps;
  if (std::fscanf(f, "%d", &steps) != 1)
    return 3;
  alignas(64) static float a[A_SPLIT][TILE_M * A_K];
  alignas(64) static int8_t b[TILE_N * ROW_BYTES];
  alignas(64) static float c[TILE_M * TILE_N];
  ggml_mmq_zero(c);
  for (int s = 0; s < steps; ++s) {
    for (auto &tile : a)
      for (auto &v : tile) {
        char buf[64];
        if (std::fscanf(f, "%63s", buf) != 1)
          return 3;
        v = std::strtof(buf, nullptr);
      }
    for (auto &v : b) {
      unsigned u;
      if (std::fscanf(f, "%x", &u) != 1)
        return 3;
      v = int8_t(uint8_t(u));
    }
    for (int part = 0; part < A_SPLIT; ++part)
      ggml_mmq(a[part], b, c, part);
  }
  for (float v : c)
    std::printf("%a\n", (double)v);
  return 0;
}
