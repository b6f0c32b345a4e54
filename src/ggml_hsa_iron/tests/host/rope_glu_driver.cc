// Host driver of the GLU (eltwise.cc with GLU=1) and ROPE (rope.cc) core functions, built
// with g++ against the AIE API stand-in by tests/test_rope_glu_host.py. Operands are raw
// files; the driver calls the core functions tile by tile, as the designs' workers do.
//   GLU:  driver a.bin b.bin out.bin n            (n a multiple of TILE)
//   ROPE: driver x.bin tab.bin out.bin rows workers (one column: its rows, a multiple of
//                                                    workers x TILE_ROWS; tab: the positions
//                                                    FIFO's object of TABLE_WORDS; the tiles
//                                                    dealt round-robin to the workers, each
//                                                    run after the other)
//   F16:  driver in.bin out.bin n                 (f32 -> f16 -> f32 round trip of n f32
//                                                    values: out holds the f16 bits, then
//                                                    their f32 values)
#include <cstdio>
#include <cstdlib>
#include <vector>

template <typename T> static std::vector<T> slurp(const char *path, size_t n) {
  std::vector<T> v(n);
  FILE *f = fopen(path, "rb");
  if (!f || fread(v.data(), sizeof(T), n, f) != n)
    exit(2);
  fclose(f);
  return v;
}

template <typename T> static void spit(const char *path, const std::vector<T> &v) {
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(v.data(), sizeof(T), v.size(), f) != v.size())
    exit(3);
  fclose(f);
}

int main(int argc, char **argv) {
#if defined(DRIVER_GLU)
  (void)argc;
  size_t n = strtoul(argv[4], nullptr, 10);
  auto a = slurp<IN0_T>(argv[1], n);
  auto b = slurp<IN1_T>(argv[2], n);
  std::vector<OUT_T> out(n);
  for (size_t i = 0; i < n; i += TILE)
    ggml_eltwise_binary(a.data() + i, b.data() + i, out.data() + i);
  spit(argv[3], out);
#elif defined(DRIVER_ROPE)
  (void)argc;
  size_t rows = strtoul(argv[4], nullptr, 10);
  int workers = (int)strtol(argv[5], nullptr, 10);
  auto x = slurp<X_T>(argv[1], rows * NE0);
  auto tab = slurp<int32_t>(argv[2], TABLE_WORDS);
  std::vector<OUT_T> out(rows * NE0);
  const int step = workers * TILE_ROWS;
  for (int w = 0; w < workers; ++w) {
    ggml_rope_begin(tab.data(), w * TILE_ROWS, step);
    for (size_t r = w * TILE_ROWS; r < rows; r += step)
      ggml_rope(x.data() + r * NE0, tab.data(), out.data() + r * NE0);
  }
  spit(argv[3], out);
#elif defined(DRIVER_F16)
  (void)argc;
  size_t n = strtoul(argv[3], nullptr, 10);
  auto in = slurp<float>(argv[1], n);
  std::vector<uint16_t> bits(n);
  std::vector<float> back(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = ggml_aie::f32_to_f16(in[i]);
    back[i] = ggml_aie::f16_to_f32(bits[i]);
  }
  spit(argv[2], bits);
  FILE *f = fopen(argv[2], "ab");
  if (!f || fwrite(back.data(), 4, n, f) != n)
    exit(3);
  fclose(f);
#endif
  return 0;
}
