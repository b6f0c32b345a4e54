// block_decode.h: ggml's f16 and block-quantized weight layouts (ggml-common.h) decoded on
// the core, for the GEMV (mvq.cc) and the GEMM (mmq.cc) over weights moved as the bytes ggml
// stores them.
//
// Every 16 values of a block share one scale and one offset (Q4_0, Q4_1, Q5_0, Q8_0: the
// block's; Q4_K, Q5_K: their 32-value sub-block's; Q6_K: their own). piece(b, j, s, k) decodes
// 32 values of a block to bf16 on the vector unit, for the GEMV, which decodes every weight
// once per token and must keep up with its DMA, and for the GEMM, which decodes each weight
// tile once for many rows of activations; f16 weights are converted 16 at a time (halves).
//
// Defines: exactly one of MVQ_F16, MVQ_Q4_0, MVQ_Q4_1, MVQ_Q5_0, MVQ_Q8_0, MVQ_Q4_K,
// MVQ_Q5_K, MVQ_Q6_K. QB is the block's values, BB its bytes.

#pragma once

#include "ggml_aie.h"

namespace ggml_aie {

#if MVQ_F16
constexpr int QB = 1, BB = 2;
#elif MVQ_Q4_0
constexpr int QB = 32, BB = 18;
#elif MVQ_Q4_1
constexpr int QB = 32, BB = 20;
#elif MVQ_Q5_0
constexpr int QB = 32, BB = 22;
#elif MVQ_Q8_0
constexpr int QB = 32, BB = 34;
#elif MVQ_Q4_K
constexpr int QB = 256, BB = 144;
#elif MVQ_Q5_K
constexpr int QB = 256, BB = 176;
#elif MVQ_Q6_K
constexpr int QB = 256, BB = 210;
#else
#error "block_decode.h: define one MVQ_<type>"
#endif

// Q4_0, Q4_1, Q5_0: where a block's 16 bytes of nibbles start (after d; d, m; d, qh), values
// 0..16 in their low nibbles, 16..32 in the high ones.
#if MVQ_Q4_0
constexpr int NIBBLES_AT = 2;
#elif MVQ_Q4_1
constexpr int NIBBLES_AT = 4;
#elif MVQ_Q5_0
constexpr int NIBBLES_AT = 6;
#endif

// Little-endian 16- and 32-bit fields of a block (blocks are not aligned: 18-, 20-, 22-,
// 34- and 210-byte blocks follow each other).
static inline int32_t u16_at(const uint8_t *p) { return int32_t(p[0]) | (int32_t(p[1]) << 8); }
static inline uint32_t u32_at(const uint8_t *p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

#if MVQ_F16

// n (<= VEC) f16 values from p, the other lanes 0.
static inline vf halves(const uint8_t *p, int n) {
  alignas(64) int32_t u[VEC];
  for (int i = 0; i < (int)VEC; ++i)
    u[i] = i < n ? u16_at(p + 2 * i) : 0;
  return half_bits_to_f32(aie::load_v<VEC>(u));
}

// The pair decoder's constants, made once per call.
struct BlockConsts {
  HalfPairs halves;
};

#else

// Q4_K / Q5_K: the 6-bit scale and min of sub-block s (0..8) from the 12 packed bytes.
static inline void k_scale_min(const uint8_t *sc, int s, int32_t &scale, int32_t &min) {
  if (s < 4) {
    scale = sc[s] & 63;
    min = sc[s + 4] & 63;
  } else {
    scale = (sc[s + 4] & 0x0f) | ((sc[s - 4] >> 6) << 4);
    min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

// The decoding, on the vector unit, 32 values of a row ("a piece") at a time: the codes
// unpacked with vector shifts and masks and turned into bf16 exactly (integers below 2^8),
// then weight = scale * code (+ min) formed in the f32 accumulator and rounded to bf16 once.
// The bf16 MAC takes the scale and the min as two bf16 halves each (hi + lo: an f16 field
// exactly, the K-quants' d * sub-block scale to 16 bits), so that a weight near zero (a scaled
// code less its min) keeps its own precision. The scales are made once per block: the f16
// fields split on the scalar unit (which has no floating point: integer code), the K-quants'
// sub-block products on the vector unit.
using vb32 = aie::vector<bfloat16, 32>;
using vb16 = aie::vector<bfloat16, 16>;
using vs32 = aie::vector<int16_t, 32>;
using vu32 = aie::vector<uint16_t, 32>;
constexpr int PIECES = QB / 32;
#if MVQ_Q4_1 || MVQ_Q4_K || MVQ_Q5_K
#define MVQ_HAS_MIN 1
#else
#define MVQ_HAS_MIN 0
#endif
// Every type but Q8_0: a code c (< 64) becomes the bf16 value 128 + c by its bits alone
// (0x4300 | c), and the MAC takes scale * (128 + the type's offset) off again, half by half:
// no conversion on the vector ALU. Exact, so the weight is the one the converted codes give:
// the scale (an f16 d of 11 significant bits, times a K-quant sub-block scale of at most 7)
// has at most 18 significant bits, 2^e its top one, so its halves lie on the grids of
// 2^(e-7) (hi) and 2^(e-17) (lo); (128 + c) hi less (128 + offset) hi is (c - offset) hi, 16
// bits; adding (128 + c) lo stays below 2^(e+7) on the grid of 2^(e-17), 24 bits; taking
// (128 + offset) lo off leaves (c - offset)(hi + lo): every partial sum exact in the f32
// accumulator (the mins follow as before).
#if MVQ_Q4_0 || MVQ_Q4_1 || MVQ_Q5_0 || MVQ_Q4_K || MVQ_Q5_K || MVQ_Q6_K
#define MVQ_CODE_BIAS 1
#else
#define MVQ_CODE_BIAS 0
#endif

// A value as the sum of two bf16.
struct Bf16Pair {
  bfloat16 hi, lo;
};

// An f16 field (negated if asked) as hi + lo exactly: hi its f32 bits truncated to bf16, lo the
// rest (at most 3 significant bits); inf and NaN in hi. On the scalar unit.
static inline Bf16Pair half_split(const uint8_t *p, bool negate = false) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f16_to_f32(uint16_t(u16_at(p)))) ^
                     (negate ? 0x80000000u : 0u);
  const uint32_t e = (u >> 23) & 0xffu, rem = u & 0xffffu;
  uint16_t hi = uint16_t(u >> 16), lo = 0;
  if (e == 0xffu) {
    hi = (u & 0x7fffffu) ? uint16_t((u >> 16) | 0x40u) : hi; // NaN stays NaN
  } else if (rem != 0) {
    const uint32_t top = 31u - uint32_t(__builtin_clz(rem)); // rem = 2^top * (1 + f)
    const uint32_t bits = (u & 0x80000000u) | ((e - 23u + top) << 23) | ((rem << (23u - top)) & 0x7fffffu);
    lo = uint16_t(bits >> 16);
  }
  return {__builtin_bit_cast(bfloat16, hi), __builtin_bit_cast(bfloat16, lo)};
}

// The vectors the type's pieces are decoded with, made once per call.
struct BlockConsts {
#if MVQ_Q4_0 || MVQ_Q4_1 || MVQ_Q5_0
  aie::vector<uint16_t, 16> low_nibble16 = aie::broadcast<uint16_t, 16>(0x0f);
#endif
#if MVQ_Q4_K || MVQ_Q5_K || MVQ_Q6_K
  vu32 low_nibble = aie::broadcast<uint16_t, 32>(0x0f);
#endif
#if MVQ_Q5_K
  vu32 one = aie::broadcast<uint16_t, 32>(1);
#endif
#if MVQ_HAS_MIN
  vb32 ones = aie::broadcast<bfloat16, 32>(bfloat16(1.0f));
#endif
#if MVQ_CODE_BIAS
  vu32 bias_bits = aie::broadcast<uint16_t, 32>(0x4300); // bf16 128.0
#if MVQ_Q4_0
  vb32 neg_bias = aie::broadcast<bfloat16, 32>(bfloat16(-136.0f)); // 128 + 8
#elif MVQ_Q5_0
  vb32 neg_bias = aie::broadcast<bfloat16, 32>(bfloat16(-144.0f)); // 128 + 16
#elif MVQ_Q6_K
  vb32 neg_bias = aie::broadcast<bfloat16, 32>(bfloat16(-160.0f)); // 128 + 32
#else // Q4_1, Q4_K, Q5_K: unsigned codes
  vb32 neg_bias = aie::broadcast<bfloat16, 32>(bfloat16(-128.0f));
#endif
#endif
#if MVQ_Q5_0
  vu32 zero = aie::broadcast<uint16_t, 32>(0);
  vu32 sixteen = aie::broadcast<uint16_t, 32>(16);
  // Lane i's fifth bit is bit i % 16 of its half of qh.
  vu32 lane_bit = lane_bits();
  static vu32 lane_bits() {
    alignas(64) uint16_t b[32];
    for (int i = 0; i < 32; ++i)
      b[i] = uint16_t(1u << (i % 16));
    return aie::load_v<32>(b);
  }
#elif MVQ_Q6_K
  vu32 three = aie::broadcast<uint16_t, 32>(3);
#endif
};

// A block's scales (and mins) as bf16 halves: d (and m) for the 32-value blocks; for Q4_K and
// Q5_K, lanes 0..8 the sub-blocks' d * scale, lanes 8..16 their -dmin * min; for Q6_K the 16
// groups' d * scale.
struct BlockScales {
#if MVQ_Q4_0 || MVQ_Q4_1 || MVQ_Q5_0 || MVQ_Q8_0
  Bf16Pair d;
#if MVQ_Q4_1
  Bf16Pair m;
#endif
#else
  vb16 hi, lo;
#endif
};

#if MVQ_Q4_K || MVQ_Q5_K || MVQ_Q6_K
// f * c exactly in f32 (c small integers in bf16, f = fh + fl), split into bf16 halves.
static inline BlockScales split_products(vb16 c, vb16 fh, vb16 fl) {
  const vf p = aie::mac(aie::mul(c, fh), c, fl).template to_vector<float>();
  const vb16 hi = narrow<bfloat16>(p);
  return {hi, narrow<bfloat16>(sub(p, widen(hi)))};
}
#endif

static inline BlockScales block_scales(const uint8_t *b) {
#if MVQ_Q4_1
  return {half_split(b), half_split(b + 2)};
#elif MVQ_Q4_0 || MVQ_Q5_0 || MVQ_Q8_0
  return {half_split(b)};
#elif MVQ_Q4_K || MVQ_Q5_K
  alignas(32) int16_t sm[16];
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    int32_t sc, mn;
    k_scale_min(b + 4, s, sc, mn);
    sm[s] = int16_t(sc);
    sm[8 + s] = int16_t(mn);
  }
  const Bf16Pair d = half_split(b), nm = half_split(b + 2, true);
  return split_products(aie::to_float<bfloat16>(aie::load_v<16>(sm)),
                        aie::concat(aie::broadcast<bfloat16, 8>(d.hi), aie::broadcast<bfloat16, 8>(nm.hi)),
                        aie::concat(aie::broadcast<bfloat16, 8>(d.lo), aie::broadcast<bfloat16, 8>(nm.lo)));
#else // MVQ_Q6_K: 16 signed 8-bit scales after ql and qh
  const auto sc = aie::unpack(aie::load_unaligned_v<16>(reinterpret_cast<const int8_t *>(b + 192)));
  const Bf16Pair d = half_split(b + 208);
  return split_products(aie::to_float<bfloat16>(sc), aie::broadcast<bfloat16, 16>(d.hi),
                        aie::broadcast<bfloat16, 16>(d.lo));
#endif
}

// The 32 unsigned bytes at p as uint16 lanes.
static inline vu32 bytes32(const uint8_t *p) { return aie::unpack(aie::load_unaligned_v<32>(p)); }

// Piece j's 32 codes in value order as bf16: Q8_0's as they are, the others' plus 128
// (MVQ_CODE_BIAS).
static inline vb32 piece_codes(const uint8_t *b, int j, const BlockConsts &k) {
#if MVQ_Q8_0
  (void)j, (void)k;
  return aie::to_float<bfloat16>(
      aie::unpack(aie::load_unaligned_v<32>(reinterpret_cast<const int8_t *>(b + 2))));
#elif MVQ_Q4_0 || MVQ_Q4_1 || MVQ_Q5_0
  (void)j;
  const auto q = aie::unpack(aie::load_unaligned_v<16>(b + NIBBLES_AT));
  vu32 c = aie::concat(aie::bit_and(q, k.low_nibble16), aie::downshift(q, 4));
#if MVQ_Q5_0
  // The fifth bit of value i is bit i of the little-endian u32 after the scale.
  const uint32_t qh = u32_at(b + 2);
  const vu32 h = aie::concat(aie::broadcast<uint16_t, 16>(uint16_t(qh & 0xffffu)),
                             aie::broadcast<uint16_t, 16>(uint16_t(qh >> 16)));
  c = aie::bit_or(c, aie::select(k.zero, k.sixteen, aie::lt(k.zero, aie::bit_and(h, k.lane_bit))));
#endif
  return aie::vector_cast<bfloat16>(aie::bit_or(c, k.bias_bits));
#elif MVQ_Q4_K || MVQ_Q5_K
  // Sub-block j uses the 32 bytes 32 * (j / 2) .. of the nibbles, low nibbles for even j;
  // Q5_K's fifth bit of value l is bit j of qh[l].
#if MVQ_Q4_K
  const vu32 q = bytes32(b + 16 + 32 * (j / 2)); // after d, dmin, scales
#else
  const vu32 q = bytes32(b + 48 + 32 * (j / 2)); // after d, dmin, scales, qh
#endif
  vu32 c = j % 2 ? aie::downshift(q, 4) : aie::bit_and(q, k.low_nibble);
#if MVQ_Q5_K
  c = aie::bit_or(c, aie::upshift(aie::bit_and(aie::downshift(bytes32(b + 16), j), k.one), 4));
#endif
  return aie::vector_cast<bfloat16>(aie::bit_or(c, k.bias_bits));
#else // MVQ_Q6_K
  // Half h = j / 4 (128 values) uses ql[64h ..] and qh[32h ..]; quarter q = j % 4 takes the low
  // (q < 2) or high nibble of ql[64h + 32(q % 2) + l] and bits 2q, 2q+1 of qh[32h + l].
  const int h = j / 4, q = j % 4;
  const vu32 ql = bytes32(b + 64 * h + 32 * (q % 2));
  const vu32 lo = q < 2 ? aie::bit_and(ql, k.low_nibble) : aie::downshift(ql, 4);
  const vu32 hi = aie::bit_and(aie::downshift(bytes32(b + 128 + 32 * h), 2 * q), k.three);
  return aie::vector_cast<bfloat16>(aie::bit_or(aie::bit_or(lo, aie::upshift(hi, 4)), k.bias_bits));
#endif
}

// Piece j's scale half (hi or lo) in every lane.
static inline vb32 scale_lanes(const BlockScales &s, int j, bool hi) {
#if MVQ_Q4_0 || MVQ_Q4_1 || MVQ_Q5_0 || MVQ_Q8_0
  (void)j;
  return aie::broadcast<bfloat16, 32>(hi ? s.d.hi : s.d.lo);
#elif MVQ_Q4_K || MVQ_Q5_K
  return aie::broadcast<bfloat16, 32>((hi ? s.hi : s.lo).get(j));
#else // MVQ_Q6_K: one scale per 16 values
  const vb16 &v = hi ? s.hi : s.lo;
  return aie::concat(aie::broadcast<bfloat16, 16>(v.get(2 * j)), aie::broadcast<bfloat16, 16>(v.get(2 * j + 1)));
#endif
}

#if MVQ_HAS_MIN
// Piece j's min half (m; -dmin * min for the K-quants) in every lane.
static inline vb32 min_lanes(const BlockScales &s, int j, bool hi) {
#if MVQ_Q4_1
  (void)j;
  return aie::broadcast<bfloat16, 32>(hi ? s.m.hi : s.m.lo);
#else
  return aie::broadcast<bfloat16, 32>((hi ? s.hi : s.lo).get(8 + j));
#endif
}
#endif

// Piece j's 32 weights, scale * code (+ min) rounded to bf16 once.
static inline vb32 piece(const uint8_t *b, int j, const BlockScales &s, const BlockConsts &k) {
  const vb32 codes = piece_codes(b, j, k);
  const vb32 hi = scale_lanes(s, j, true), lo = scale_lanes(s, j, false);
  auto w = aie::mul(codes, hi);
#if MVQ_CODE_BIAS
  // In this order: every partial sum exact (above).
  w = aie::mac(w, k.neg_bias, hi);
  w = aie::mac(w, codes, lo);
  w = aie::mac(w, k.neg_bias, lo);
#else
  w = aie::mac(w, codes, lo);
#endif
#if MVQ_HAS_MIN
  w = aie::mac(w, k.ones, min_lanes(s, j, true));
  w = aie::mac(w, k.ones, min_lanes(s, j, false));
#endif
  return w.template to_vector<bfloat16>();
}

#endif

} // namespace ggml_aie
