// Host driver of kernels/mvq.cc (test_mvq_host.py): reads a W tile (MV_ROWS rows of the
// weight bytes of MV_KC values, hex bytes) and x (MV_KC f32 in hex-float), calls
// ggml_mvq_zero then ggml_mvq twice on the same y (so the accumulation over K chunks runs),
// and prints y in hex-float.
#include "mvq.cc"

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  FILE *f = std::fopen(argv[1], "r");
  if (!f)
    return 2;
  std::vector<int8_t> w(MV_ROWS * ROW_BYTES);
  for (auto &b : w) {
    unsigned v;
    if (std::fscanf(f, "%x", &v) != 1)
      return 3;
    b = int8_t(uint8_t(v));
  }
  alignas(64) static float x[MV_KC];
  for (auto &v : x) {
    char buf[64];
    if (std::fscanf(f, "%63s", buf) != 1)
      return 3;
    v = std::strtof(buf, nullptr);
  }
  alignas(64) static float y[MV_ROWS];
  ggml_mvq_zero(y);
  ggml_mvq(w.data(), x, y);
  ggml_mvq(w.data(), x, y);
  for (int r = 0; r < MV_ROWS; ++r)
    std::printf("%a\n", (double)y[r]);
  return 0;
}
