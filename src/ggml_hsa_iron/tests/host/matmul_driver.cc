// Host driver for kernels/mm.cc (GEMM) or kernels/mv.cc (GEMV=1) on the AIE API
// stand-in (aie_api/aie.hpp). The test (test_matmul_host.py) composes, from the
// plan the design uses, what every core receives; this driver runs the core
// functions on it the way each core's loop does:
//
//   for each output tile: zero(out); for each K step: step(first, second, out);
//   then the tile's elements are written to dst
//
// GEMM: step = ggml_mm(A tile from src1, B tile from src0, C tile);
// GEMV: step = ggml_mv(W tile from src0, x chunk from src1, y tile).
//
// Input file (argv[1]), whitespace-separated numbers:
//   n0 n1 nd cores
//   n0 values of src0, n1 values of src1 (decimal, C99 hex floats, inf, nan)
//   per core: tiles steps, then per tile: steps x (first's element indices, second's),
//             then the dst index of each output element
// Output: the nd dst values, one per line ("d <value>"); elements never written
// keep a sentinel (NaN, or INT32_MIN for integers).
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#if GEMV
#include "mv.cc"
using FIRST_T = W_T;  // from src0
using SECOND_T = X_T; // from src1
using DST_T = Y_T;
constexpr bool FIRST_FROM_SRC0 = true;
constexpr int FIRST_N = MV_ROWS * MV_KC, SECOND_N = MV_KC, OUT_N = MV_ROWS;
static void zero_tile(DST_T *o) { ggml_mv_zero(o); }
static void step(FIRST_T *f, SECOND_T *s, DST_T *o) { ggml_mv(f, s, o); }
#else
#include "mm.cc"
using FIRST_T = A_T;  // from src1
using SECOND_T = B_T; // from src0
using DST_T = C_T;
constexpr bool FIRST_FROM_SRC0 = false;
constexpr int FIRST_N = TILE_M * TILE_K, SECOND_N = TILE_K * TILE_N, OUT_N = TILE_M * TILE_N;
static void zero_tile(DST_T *o) { ggml_mm_zero(o); }
static void step(FIRST_T *f, SECOND_T *s, DST_T *o) { ggml_mm(f, s, o); }
#endif

static FILE *in;

static double num() {
  double v;
  if (std::fscanf(in, "%lf", &v) != 1) {
    std::fprintf(stderr, "short input\n");
    std::exit(2);
  }
  return v;
}

static long idx() { return (long)num(); }

template <typename T> static T from_double(double v) {
  if constexpr (std::is_integral_v<T>)
    return (T)(long long)v;
  else
    return T((float)v);
}

template <typename T> static double to_double(T v) {
  if constexpr (std::is_integral_v<T>)
    return (double)v;
  else
    return (double)(float)v;
}

int main(int argc, char **argv) {
  if (argc != 2 || !(in = std::fopen(argv[1], "r")))
    return 2;
  const long n0 = idx(), n1 = idx(), nd = idx(), cores = idx();
  std::vector<double> src0(n0), src1(n1);
  for (auto &v : src0)
    v = num();
  for (auto &v : src1)
    v = num();
  std::vector<DST_T> dst(nd);
  for (auto &v : dst) {
    if constexpr (std::is_integral_v<DST_T>)
      v = (DST_T)INT32_MIN;
    else
      v = DST_T(NAN);
  }
  const std::vector<double> &first_src = FIRST_FROM_SRC0 ? src0 : src1;
  const std::vector<double> &second_src = FIRST_FROM_SRC0 ? src1 : src0;
  alignas(64) static FIRST_T first[FIRST_N];
  alignas(64) static SECOND_T second[SECOND_N];
  alignas(64) static DST_T out[OUT_N];
  for (long c = 0; c < cores; ++c) {
    const long tiles = idx(), steps = idx();
    for (long t = 0; t < tiles; ++t) {
      zero_tile(out);
      for (long s = 0; s < steps; ++s) {
        for (int i = 0; i < FIRST_N; ++i)
          first[i] = from_double<FIRST_T>(first_src[idx()]);
        for (int i = 0; i < SECOND_N; ++i)
          second[i] = from_double<SECOND_T>(second_src[idx()]);
        step(first, second, out);
      }
      for (int i = 0; i < OUT_N; ++i)
        dst[idx()] = out[i];
    }
  }
  for (const auto &v : dst) {
    if constexpr (std::is_integral_v<DST_T>)
      std::printf("d %lld\n", (long long)v);
    else
      std::printf("d %a\n", to_double(v));
  }
  return 0;
}
