// Core functions of the calibration designs (calibration.py): vectorized as the
// published designs' kernels are (their facts: what each call moves and computes), written
// against the AIE API so that the stand-in counts their cycles.
//
//   cal_passthrough(in, out, n)               n int32 copied, 512 bits at a time
//   cal_matvec(a, b, c)                       c[i] = dot(a[0:CAL_K], b) for the call's row
//                                             i (counted modulo CAL_M_OUT), bf16 in, f32
//                                             accumulation, bf16 out
//   cal_matvec_rows(a, b, c)                  c[r] = dot(a[r*CAL_K:(r+1)*CAL_K], b) for the
//                                             object's CAL_ROWS rows, likewise

#include "ggml_aie.h"

extern "C" {

void cal_passthrough(int32_t *in, int32_t *out, int32_t n) {
  for (int32_t i = 0; i < n; i += 16)
    aie::store_v(out + i, aie::load_v<16>(in + i));
}

#if defined(CAL_K) && defined(CAL_M_OUT)
static int32_t g_row;

void cal_matvec(bfloat16 *a, bfloat16 *b, bfloat16 *c) {
  constexpr int L = 32;
  aie::accum<accfloat, L> acc = aie::zeros<accfloat, L>();
  for (int k = 0; k < CAL_K; k += L)
    acc = aie::mac(acc, aie::load_v<L>(a + k), aie::load_v<L>(b + k));
  c[g_row] = bfloat16(aie::reduce_add(acc.template to_vector<float>()));
  g_row = (g_row + 1) % CAL_M_OUT;
}
#endif

#if defined(CAL_K) && defined(CAL_ROWS)
void cal_matvec_rows(bfloat16 *a, bfloat16 *b, bfloat16 *c) {
  constexpr int L = 32;
  for (int r = 0; r < CAL_ROWS; r++) {
    aie::accum<accfloat, L> acc = aie::zeros<accfloat, L>();
    for (int k = 0; k < CAL_K; k += L)
      acc = aie::mac(acc, aie::load_v<L>(a + r * CAL_K + k), aie::load_v<L>(b + k));
    c[r] = bfloat16(aie::reduce_add(acc.template to_vector<float>()));
  }
}
#endif

} // extern "C"
