// fa_rows.h: the K/V row helpers of ggml's FLASH_ATTN_EXT shared by its core sources
// (flash_attn.cc, and mv_fa.h: the attention phase of FLASH_ATTN_FFN_<glu>'s GEMV core), so
// that both round q and decode K and V rows to the same f32 values. Included after
// ggml_aie.h.
//
// Type codes (the plans' KV_CODE): 0 f32, 1 f16, 2 bf16.

#pragma once

namespace fa_rows {

using namespace ggml_aie;

inline float bits_to_float(uint32_t b) { return __builtin_bit_cast(float, b); }
inline uint32_t float_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
constexpr uint32_t NEG_INF = 0xff800000u;
constexpr uint16_t F16_NEG_INF = 0xfc00u; // -inf as f16 (a mask value hiding a key)

// q rounded to K's type T, as ggml-cpu converts q before the dot product (integer operations
// on the bit patterns: the scalar unit has no floating point).
template <int T> inline float round_q(float x) {
  if constexpr (T == 1) {
    return f16_to_f32(f32_to_f16(x));
  } else if constexpr (T == 2) {
    uint32_t b = float_bits(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) // NaN: quiet (ggml_compute_fp32_to_bf16)
      return bits_to_float((b | 0x00400000u) & 0xffff0000u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return bits_to_float(b & 0xffff0000u);
  } else {
    return x;
  }
}

// n (<= VEC) elements from element i of a K or V row of type T, the other lanes 0, as f32.
template <int T> inline vf load_kv(const int32_t *row, int i, int n) {
  if constexpr (T == 1) {
    return load_f16_zero(reinterpret_cast<const uint16_t *>(row) + i, n);
  } else if constexpr (T == 2) {
    const bfloat16 *p = reinterpret_cast<const bfloat16 *>(row) + i;
    return n == (int)VEC ? load_any(p) : load_part_zero(p, n);
  } else {
    const float *p = reinterpret_cast<const float *>(row) + i;
    return n == (int)VEC ? load_any(p) : load_part_zero(p, n);
  }
}

// A K or V row of LEN elements of type T decoded to f32 in dst (whole vectors, tail 0).
template <int T, int LEN> inline void decode_row(const int32_t *row, float *dst) {
  for (int i = 0; i < LEN; i += VEC) {
    const int n = LEN - i < (int)VEC ? LEN - i : (int)VEC;
    aie::store_v(dst + i, load_kv<T>(row, i, n));
  }
}

// Whether rows of LEN values of type T are decoded in pair order (HalfPairs::slot): f16 rows
// of whole pairs of vectors. The kernels keep q in K's order and the accumulators in V's.
template <int T, int LEN> constexpr bool in_pairs = T == 1 && LEN % (2 * (int)VEC) == 0;

// A row of LEN f16 values (LEN a multiple of 2 VEC, the row at a multiple of 64 bytes) decoded
// to f32 in dst in pair order (HalfPairs::slot): by shifts and masks when every value of the
// row is a normal number (one test per row), else exactly for every value (HalfPairs).
template <int LEN>
inline void decode_f16_pairs(const HalfPairs &h, const int32_t *row, float *dst) {
  static_assert(LEN % (2 * (int)VEC) == 0, "whole pairs of vectors");
  constexpr int N = LEN / (2 * (int)VEC);
  const bool normal = h.all_normal(row, N);
  for (int i = 0; i < N; ++i) {
    const vi w = aie::load_v<VEC>(row + i * (int)VEC);
    vf even_v, odd_v;
    if (normal)
      h.normal(w, even_v, odd_v);
    else
      HalfPairs::any(w, even_v, odd_v);
    aie::store_v(dst + 2 * i * (int)VEC, even_v);
    aie::store_v(dst + (2 * i + 1) * (int)VEC, odd_v);
  }
}

// A K or V row of LEN values of type T decoded to f32 in dst: in pair order where in_pairs,
// else in order (decode_row).
template <int T, int LEN>
inline void decode_kv_row(const HalfPairs &h, const int32_t *row, float *dst) {
  if constexpr (in_pairs<T, LEN>)
    decode_f16_pairs<LEN>(h, row, dst);
  else
    decode_row<T, LEN>(row, dst);
}

#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
// aie2 multiplies bf16 only (ggml_aie.h's f32 mul splits both operands into three bf16 pieces
// every time, with the ALU work of the splits). A K row and the q rows it meets are values of
// K's type: f16 values are exactly two bf16 pieces, bf16 values one, so each is split once and
// a q.k is the sum of the pieces' exact products in the f32 accumulator: f16 x f16 and
// bf16 x bf16 exactly, f32 as mul (the smallest product dropped). A V row likewise times p
// (any f32: three pieces).
constexpr int pieces(int type) { return type == 2 ? 1 : type == 1 ? 2 : 3; }
using bvec = aie::vector<bfloat16, VEC>;

// n values of src (whole vectors) as N bf16 pieces, piece k at dst + k * stride.
template <int N> inline void split(const float *src, int n, bfloat16 *dst, int stride) {
  for (int i = 0; i < n; i += VEC) {
    bvec p[3];
    split3(load_aligned(src + i), p[0], p[1], p[2]);
#pragma GCC unroll 3
    for (int k = 0; k < N; ++k)
      aie::store_v(dst + k * stride + i, p[k]);
  }
}

// acc plus the products of a's PA pieces and b's PB whose orders sum to at most 3, smallest
// first, each exact in the f32 accumulator. (Compile-time loops: the core's compiler unrolls
// them into the multiplies alone.)
template <int PA, int PB>
inline void mac_pieces(aie::accum<accfloat, VEC> &acc, const bvec *a, const bvec *b) {
#pragma GCC unroll 8
  for (int order = PA + PB - 2; order >= 0; --order)
#pragma GCC unroll 3
    for (int x = 0; x < PA; ++x) {
      const int y = order - x;
      if (y >= 0 && y < PB && x + y <= 3)
        acc = aie::mac(acc, a[x], b[y]);
    }
}

// The products of a's and b's pieces summed (mac_pieces): one vector of VEC lanes' products.
template <int PA, int PB> inline vf product(const bvec *a, const bvec *b) {
  auto acc = aie::zeros<accfloat, VEC>();
  mac_pieces<PA, PB>(acc, a, b);
  return acc.template to_vector<float>();
}

// The N pieces of VEC values from p (piece k at p + k * stride).
template <int N> inline void load_pieces(const bfloat16 *p, int stride, bvec *v) {
#pragma GCC unroll 3
  for (int k = 0; k < N; ++k)
    v[k] = aie::load_v<VEC>(p + k * stride);
}
#endif

} // namespace fa_rows
