// ggml_aie.h's exp_nonpos against exp on the host: every STEP-th f32 bit pattern from -0 to
// -inf, then -inf, -0 and NaNs of both signs. Prints the values checked and each difference
// (at most 8): exp_nonpos must give exp's bits where exp's result is normal (x >= -87.33), 0
// below.
#include "ggml_aie.h"

#include <cstdio>

using namespace ggml_aie;

#ifndef STEP
#define STEP 997
#endif

static long checked = 0, differ = 0;

static void check(const float *x) {
  const vf e = exp(load_aligned(x)), n = exp_nonpos(load_aligned(x));
  for (unsigned i = 0; i < VEC; ++i) {
    const uint32_t eb = __builtin_bit_cast(uint32_t, e.get(i));
    const uint32_t nb = __builtin_bit_cast(uint32_t, n.get(i));
    // NaNs: exp's value (the lane compares order them as integers: negative ones 0) or NaN
    // (positive ones, which exp takes for overflow: inf).
    const bool ok = x[i] != x[i] ? eb == nb || n.get(i) != n.get(i)
                    : x[i] >= -87.33f ? eb == nb
                                      : nb == 0;
    ++checked;
    if (!ok && differ++ < 8)
      std::printf("x %a: exp %08x, exp_nonpos %08x\n", x[i], eb, nb);
  }
}

int main() {
  alignas(64) float x[VEC];
  unsigned n = 0;
  for (uint64_t b = 0x80000000u; b <= 0xff800000u; b += STEP) {
    x[n++] = __builtin_bit_cast(float, uint32_t(b));
    if (n == VEC) {
      check(x);
      n = 0;
    }
  }
  const uint32_t specials[] = {0xff800000u, 0x80000000u, 0xffc00001u, 0x7fc00000u};
  for (unsigned i = 0; i < VEC; ++i)
    x[i] = __builtin_bit_cast(float, specials[i % 4]);
  check(x);
  std::printf("checked %ld differ %ld\n", checked, differ);
  return 0;
}
