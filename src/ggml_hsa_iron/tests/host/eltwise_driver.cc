// Host driver for kernels/eltwise.cc on the AIE API stand-in (aie_api/aie.hpp).
// Emulates what the element-wise design does: every worker (column c, row r)
// runs K tiles of TILE elements starting at start(c, r) + k * step. N_TOTAL is
// the element count the design moves (whole DMA words), N_B input 1's. Prints the
// inputs and the output, one value per line, as C99 hex floats or integers.
#include <cstdio>
#include <cstring>
#include <vector>

#include "eltwise.cc"

static uint32_t lcg = 12345;
static float rnd() {
  lcg = lcg * 1664525u + 1013904223u;
  return ((lcg >> 8) & 0xffff) / 65535.0f * 8.0f - 4.0f;
}

template <typename T> static T make(float x) {
  if constexpr (std::is_integral_v<T>)
    return (T)(int)(x * 20.0f);
  else
    return T(x);
}

template <typename T> static void print(const char *tag, const std::vector<T> &v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_integral_v<T>)
      std::printf("%s %lld\n", tag, (long long)v[i]);
    else
      std::printf("%s %a\n", tag, (double)(float)v[i]);
  }
}

int main() {
  const int n = N_TOTAL;
  std::vector<IN0_T> a(n);
  for (auto &x : a)
    x = make<IN0_T>(rnd());
#ifdef SPECIALS
  // The first elements of input 0: given f32 bit patterns (zeros, halves, infinities, ...).
  const uint32_t specials[] = SPECIALS;
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]) && i < a.size(); ++i) {
    float f;
    std::memcpy(&f, &specials[i], 4);
    a[i] = IN0_T(f);
  }
#endif
  std::vector<OUT_T> out(n, make<OUT_T>(-3.25f)); // every element is written
#if BINARY
  std::vector<IN1_T> b(N_B);
  for (auto &x : b) {
    float v = rnd();
#if defined(GGML_OP_DIV)
    v = v < 0 ? v - 0.5f : v + 0.5f;
#endif
    x = make<IN1_T>(v);
  }
#endif
  for (int c = 0; c < PLAN_C; ++c)
    for (int r = 0; r < PLAN_R; ++r) {
      int start = c * PLAN_K * PLAN_R * TILE + r * TILE;
      int step = PLAN_R * TILE;
#if BCAST || PAD
      ggml_eltwise_begin(start, step);
#endif
      for (int k = 0; k < PLAN_K; ++k) {
        int off = start + k * step;
#if !BINARY
        ggml_eltwise_unary(a.data() + off, out.data() + off);
#elif !BCAST
        ggml_eltwise_binary(a.data() + off, b.data() + off, out.data() + off);
#else
        ggml_eltwise_bcast(a.data() + off, b.data(), out.data() + off);
#endif
      }
    }
  print("a", a);
#if BINARY
  print("b", b);
#endif
  print("o", out);
  return 0;
}
