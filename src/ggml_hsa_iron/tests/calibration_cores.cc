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
//   cal_zero_f32(c)                           the f32 CAL_TM x CAL_TN accumulator zeroed
//   cal_matmul_bf16_f32(a, b, c)              c += a (CAL_TM x CAL_TK) * b (CAL_TK x CAL_TN),
//                                             bf16 in, f32 accumulator in L1, in blocks of
//                                             the arch's mmul shape R x S x T: a's block
//                                             (z, i) at (z*(TK/S) + i)*R*S, b's (j, i) at
//                                             (j*(TK/S) + i)*S*T, c's (z, j) at
//                                             (z*(TN/T) + j)*R*T, each block row-major
//   cal_expand_bf16(in, out)                  1024 int4 values (512 bytes, then one bf16
//                                             scale per 32 values) to bf16 value * scale
//   cal_expand_int16(in, out)                 the same with int16 scales and results

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

#if defined(CAL_TM) && defined(CAL_TK) && defined(CAL_TN)
// mlir-air's aie2p GEMM computes in 8x8x8 mmuls (bf16 through BFP16), mlir-aie's aie2 bf16
// GEMM in 4x8x4; both expand 2x2 (two blocks of A by two of B per inner step, four
// accumulators loaded from and stored back to the f32 tile around the K loop).
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
constexpr unsigned R = 4, S = 8, T = 4;
#else
constexpr unsigned R = 8, S = 8, T = 8;
#endif
constexpr unsigned ROWS = CAL_TM / R, DEPTH = CAL_TK / S, COLS = CAL_TN / T;
static_assert(ROWS % 2 == 0 && COLS % 2 == 0 && CAL_TK % S == 0, "2x2 expansion");

void cal_zero_f32(float *c) {
  const aie::vector<float, 32> z = aie::broadcast<float, 32>(0.0f);
  for (unsigned i = 0; i < CAL_TM * CAL_TN; i += 32)
    aie::store_v(c + i, z);
}

void cal_matmul_bf16_f32(bfloat16 *a, bfloat16 *b, float *c) {
  using MMUL = aie::mmul<R, S, T, bfloat16, bfloat16, accfloat>;
  aie::set_rounding(aie::rounding_mode::conv_even);
  for (unsigned z = 0; z < ROWS; z += 2)
    for (unsigned j = 0; j < COLS; j += 2) {
      float *c00 = c + (z * COLS + j) * MMUL::size_C, *c01 = c00 + MMUL::size_C;
      float *c10 = c00 + COLS * MMUL::size_C, *c11 = c10 + MMUL::size_C;
      MMUL m00(aie::load_v<MMUL::size_C>(c00)), m01(aie::load_v<MMUL::size_C>(c01));
      MMUL m10(aie::load_v<MMUL::size_C>(c10)), m11(aie::load_v<MMUL::size_C>(c11));
      for (unsigned i = 0; i < DEPTH; ++i) {
        auto a0 = aie::load_v<MMUL::size_A>(a + (z * DEPTH + i) * MMUL::size_A);
        auto a1 = aie::load_v<MMUL::size_A>(a + ((z + 1) * DEPTH + i) * MMUL::size_A);
        auto b0 = aie::load_v<MMUL::size_B>(b + (j * DEPTH + i) * MMUL::size_B);
        auto b1 = aie::load_v<MMUL::size_B>(b + ((j + 1) * DEPTH + i) * MMUL::size_B);
        m00.mac(a0, b0);
        m01.mac(a0, b1);
        m10.mac(a1, b0);
        m11.mac(a1, b1);
      }
      aie::store_v(c00, m00.template to_vector<float>());
      aie::store_v(c01, m01.template to_vector<float>());
      aie::store_v(c10, m10.template to_vector<float>());
      aie::store_v(c11, m11.template to_vector<float>());
    }
}
#endif

} // extern "C"

#if defined(CAL_EXPAND)
// AMD's mlir-aie weight-expand kernels, as published: per 8 blocks of 32 values their 8 scales
// loaded as one vector; per block one int4 vector loaded, unpacked to int8 then int16, its
// scale broadcast, converted (bf16) and multiplied, stored.
template <typename S> static void expand(int8_t *in, S *out) {
  constexpr int N = 1024, BLOCK = 32, BLOCKS = 8;
  const int4 *q = reinterpret_cast<const int4 *>(in);
  const S *scales = reinterpret_cast<const S *>(in + N / 2);
  aie::set_rounding(aie::rounding_mode::conv_even);
  for (int i = 0; i < N / (BLOCK * BLOCKS); ++i) {
    const auto sf = aie::load_v<BLOCKS>(scales + i * BLOCKS);
    for (int k = 0; k < BLOCKS; ++k) {
      const auto v = aie::unpack(aie::unpack(aie::load_v<BLOCK>(q + (i * BLOCKS + k) * BLOCK)));
      const auto s = aie::broadcast<S, BLOCK>(sf[k]);
      if constexpr (std::is_same_v<S, bfloat16>)
        aie::store_v(out, aie::mul(aie::to_float<bfloat16>(v), s).template to_vector<bfloat16>());
      else
        aie::store_v(out, aie::mul(v, s).template to_vector<int16_t>());
      out += BLOCK;
    }
  }
}

extern "C" {
void cal_expand_bf16(int8_t *in, bfloat16 *out) { expand(in, out); }
void cal_expand_int16(int8_t *in, int16_t *out) { expand(in, out); }
}
#endif
