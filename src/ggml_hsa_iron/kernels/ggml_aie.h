// ggml_aie.h: vector helpers shared by the AIE core functions of ggml_hsa_iron.
//
// Compiled with Peano (llvm-aie) for aie2 and aie2p against the AIE API
// headers of mlir-aie. Every AIE API call the kernels make goes through the
// few helpers below, so that a difference between targets or header versions
// is fixed in one place.
//
// Floats are computed in f32 (bf16 operands are widened, results rounded back
// on store), which is how ggml's CPU backend computes bf16 ops too. Float
// comparisons are done on "sortable" integer views of the bit patterns, and
// transcendental functions are built from add, multiply and bit operations.

#ifndef GGML_AIE_H
#define GGML_AIE_H

#include <stdint.h>

#include <aie_api/aie.hpp>

namespace ggml_aie {

constexpr unsigned VEC = 16;

// The rounding of vector conversions to bf16 is a per-core mode whose reset value is floor
// (truncation); ggml rounds to nearest even. Every core function that converts calls this.
inline void set_ggml_rounding() { aie::set_rounding(aie::rounding_mode::conv_even); }

// f(0), ..., f(N - 1) as straight-line code: a short loop of a fixed count unrolled, as the
// kernels' compiler unrolls one (no loop control on the scalar unit).
template <unsigned I, unsigned N, typename F> inline void unrolled_from(F &f) {
  if constexpr (I < N) {
    f(I);
    unrolled_from<I + 1, N>(f);
  }
}
template <unsigned N, typename F> inline void unrolled(F &&f) { unrolled_from<0, N>(f); }

using vf = aie::vector<float, VEC>;
using vi = aie::vector<int32_t, VEC>;
using vmask = aie::mask<VEC>;

// ---------------------------------------------------------------- conversions

inline vf widen(aie::vector<float, VEC> v) { return v; }

inline vf widen(aie::vector<bfloat16, VEC> v) {
  aie::accum<accfloat, VEC> acc;
  acc.from_vector(v);
  return acc.template to_vector<float>();
}

template <typename T> inline aie::vector<T, VEC> narrow(vf v);

template <> inline aie::vector<float, VEC> narrow<float>(vf v) { return v; }

template <> inline aie::vector<bfloat16, VEC> narrow<bfloat16>(vf v) {
  aie::accum<accfloat, VEC> acc;
  acc.from_vector(v);
  return acc.template to_vector<bfloat16>();
}

// Loads and stores of VEC elements as f32. `aligned` pointers are at a
// multiple of VEC elements from the start of an object FIFO buffer.
template <typename T> inline vf load_aligned(const T *p) { return widen(aie::load_v<VEC>(p)); }

template <typename T> inline vf load_any(const T *p) {
  return widen(aie::load_unaligned_v<VEC>(p));
}

template <typename T> inline void store_aligned(T *p, vf v) { aie::store_v(p, narrow<T>(v)); }

template <typename T> inline void store_any(T *p, vf v) {
  aie::store_unaligned_v(p, narrow<T>(v));
}

// ------------------------------------------------------------ bit-level views

inline vi bits(vf v) { return aie::vector_cast<int32_t>(v); }
inline vf from_bits(vi v) { return aie::vector_cast<float>(v); }
inline vf splat(float x) { return aie::broadcast<float, VEC>(x); }
inline vi splat_i(int32_t x) { return aie::broadcast<int32_t, VEC>(x); }

// m ? if_true : if_false (aie::select takes the second vector where the mask is set).
inline vi pick_i(vmask m, vi if_true, vi if_false) { return aie::select(if_false, if_true, m); }
inline vf pick(vmask m, vf if_true, vf if_false) {
  return from_bits(pick_i(m, bits(if_true), bits(if_false)));
}

// An integer whose signed order is the order of the floats (NaNs aside).
inline vi sortable(vf v) {
  vi b = bits(v);
  vi sign = aie::downshift(b, 31); // 0 or -1 (arithmetic shift)
  return aie::bit_xor(b, aie::bit_and(sign, splat_i(0x7fffffff)));
}

// The scalar form: x > y on the sortable views (aie2's scalar unit has no float compare).
inline bool greater(float x, float y) {
  int32_t a = __builtin_bit_cast(int32_t, x), b = __builtin_bit_cast(int32_t, y);
  a = a < 0 ? a ^ 0x7fffffff : a;
  b = b < 0 ? b ^ 0x7fffffff : b;
  return a > b;
}

inline vmask lt(vf a, vf b) { return aie::lt(sortable(a), sortable(b)); }
inline vmask gt(vf a, vf b) { return lt(b, a); }
inline vf fmax(vf a, vf b) { return pick(lt(a, b), b, a); }
inline vf fmin(vf a, vf b) { return pick(lt(b, a), b, a); }

// ----------------------------------------------------------------- arithmetic

inline vf add(vf a, vf b) { return aie::add(a, b); }
inline vf sub(vf a, vf b) { return aie::sub(a, b); }
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
// aie2 has no f32 vector multiplier (the AIE API emulates it with bf16 inputs, accuracy
// "low"): split each operand into three bf16 pieces (a = a0 + a1 + a2, exactly enough for
// f32's 24 bits) and sum the eight products that matter, smallest first, in the f32
// accumulator. Each bf16 x bf16 product is exact in f32. The pieces are truncated, not
// rounded (the low 16 bits of the f32 cleared), so all three have a's sign and |a0| <= |a|:
// no partial sum exceeds the exact product, and a product just below FLT_MAX (e^88.72 as
// 0.9999 * 2^64 * 2^64) does not overflow through a leading piece rounded up to a power of two.
// (A NaN stays a NaN: clearing a payload held in the low bits would make it an infinity.)
inline vf trunc_bf16(vf a) {
  vf t = from_bits(aie::bit_and(bits(a), splat_i(int32_t(0xffff0000u))));
  vmask nan = aie::lt(splat_i(0x7f800000), aie::bit_and(bits(a), splat_i(0x7fffffff)));
  return pick(nan, a, t);
}

inline void split3(vf a, aie::vector<bfloat16, VEC> &p0, aie::vector<bfloat16, VEC> &p1,
                   aie::vector<bfloat16, VEC> &p2) {
  // Each piece is a bf16 value already: the conversions are exact in any rounding mode.
  aie::accum<accfloat, VEC> acc;
  vf t0 = trunc_bf16(a);
  acc.from_vector(t0);
  p0 = acc.template to_vector<bfloat16>();
  vf r = aie::sub(a, t0);
  vf t1 = trunc_bf16(r);
  acc.from_vector(t1);
  p1 = acc.template to_vector<bfloat16>();
  acc.from_vector(aie::sub(r, t1));
  p2 = acc.template to_vector<bfloat16>();
}

// A factor split once (split3) for the several products that share it (a polynomial's
// argument).
struct Factor {
  aie::vector<bfloat16, VEC> b0, b1, b2;
};
inline Factor factor(vf b) {
  Factor f;
  split3(b, f.b0, f.b1, f.b2);
  return f;
}

inline vf mul(vf a, const Factor &f) {
  const auto &b0 = f.b0, &b1 = f.b1, &b2 = f.b2;
  aie::vector<bfloat16, VEC> a0, a1, a2;
  split3(a, a0, a1, a2);
  // Truncated pieces leave the omitted terms one sign: the two of order 2^-24 are kept, so
  // only a2 * b2 (2^-32 of the product) is dropped.
  auto acc = aie::mul(a2, b1);
  acc = aie::mac(acc, a1, b2);
  acc = aie::mac(acc, a2, b0);
  acc = aie::mac(acc, a1, b1);
  acc = aie::mac(acc, a0, b2);
  acc = aie::mac(acc, a1, b0);
  acc = aie::mac(acc, a0, b1);
  acc = aie::mac(acc, a0, b0);
  // Infinities and NaNs: the product of the leading pieces has the IEEE result.
  vf top = aie::mul(a0, b0).template to_vector<float>();
  const vi expo = splat_i(0x7f800000);
  return pick(aie::eq(aie::bit_and(bits(top), expo), expo), top, acc.template to_vector<float>());
}
inline vf mul(vf a, vf b) { return mul(a, factor(b)); }
inline vf mul(vf a, float s) { return mul(a, aie::broadcast<float, VEC>(s)); }
#else
using Factor = vf; // aie2p multiplies f32: nothing to split
inline Factor factor(vf b) { return b; }
inline vf mul(vf a, vf b) { return aie::mul(a, b).template to_vector<float>(); }
inline vf mul(vf a, float s) { return aie::mul(a, s).template to_vector<float>(); }
#endif
inline vf fma(vf a, vf b, vf c) { return add(mul(a, b), c); }

inline vf fabs(vf v) { return from_bits(aie::bit_and(bits(v), splat_i(0x7fffffff))); }
inline vf fneg(vf v) { return from_bits(aie::bit_xor(bits(v), splat_i(int32_t(0x80000000u)))); }

// 1/b: initial guess from the exponent bits, then Newton-Raphson steps.
inline vf recip(vf b) {
  vi sign = aie::bit_and(bits(b), splat_i(int32_t(0x80000000u)));
  vf mag = fabs(b);
  vf x = from_bits(aie::sub(splat_i(0x7ef311c3), bits(mag)));
  vf two = splat(2.0f);
  for (int i = 0; i < 3; ++i)
    x = mul(x, sub(two, mul(mag, x)));
  // A last step in residual form, x + x (1 - |b| x): the product form above can stop one
  // ulp short (1/1 = 0.99999994), which shows when ggml's results are rounded to bf16 at a
  // tie (SWIGLU: 92 * 34 = 3128 in f32, between two bf16 values).
  x = add(x, mul(x, sub(splat(1.0f), mul(mag, x))));
  // 1/0 = inf, as IEEE division gives.
  vmask zero = aie::eq(bits(mag), splat_i(0));
  x = pick(zero, from_bits(splat_i(0x7f800000)), x);
  // |b| >= 2^126 (infinity included): 1/b is below the normal range (the initial guess would
  // underflow into garbage); 0, as a flush-to-zero unit gives.
  x = pick(aie::lt(bits(mag), splat_i(0x7e800000)), x, splat(0.0f));
  return from_bits(aie::bit_or(bits(x), sign));
}

inline vf div(vf a, vf b) { return mul(a, recip(b)); }

// The constants of exp and exp_nonpos, each a vector in memory: loaded where used (a load
// each) rather than broadcast (an ALU operation each), as a loop over vectors holds them.
struct ExpTable {
  enum { HI, LO, NONPOS_LO, LOG2E, MAGIC, LN2, C7, C6, C5, C4, C3, C2, C1, C0, BIAS, ZERO, INF,
         COUNT };
  alignas(64) float v[COUNT][VEC];
};
constexpr ExpTable make_exp_table() {
  const float c[ExpTable::COUNT] = {
      // hi: the largest float whose e^x is finite (ln FLT_MAX = 88.7228391...); above it, inf.
      88.7228317f, -103.97f,
      // exp_nonpos's: below it 2^n would be subnormal.
      -87.33f, 1.44269504088896341f,
      12582912.0f, // 1.5 * 2^23
      0.69314718055994531f, 1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f,
      1.0f / 6.0f, 0.5f, 1.0f, 1.0f, __builtin_bit_cast(float, int32_t(127)), 0.0f,
      __builtin_bit_cast(float, int32_t(0x7f800000))};
  ExpTable t{};
  for (int i = 0; i < ExpTable::COUNT; ++i)
    for (unsigned l = 0; l < VEC; ++l)
      t.v[i][l] = c[i];
  return t;
}
inline constexpr ExpTable kExp = make_exp_table();
inline vf exp_const(int i) { return load_aligned(kExp.v[i]); }

// e^(f ln 2) for |f| <= 0.5 by a degree-7 polynomial (Horner).
inline vf exp_poly(vf y) {
  const Factor yf = factor(y);
  vf p = exp_const(ExpTable::C7);
#pragma GCC unroll 8
  for (int c = ExpTable::C6; c <= ExpTable::C0; ++c)
    p = add(mul(p, yf), exp_const(c));
  return p;
}

// e^x. x*log2(e) = n + f with n an integer (rounded with the 1.5*2^23 trick)
// and |f| <= 0.5; e^x = 2^n * e^(f ln 2), the latter by a degree-7 polynomial.
inline vf exp(vf x) {
  using T = ExpTable;
  vmask over = gt(x, exp_const(T::HI));
  vmask under = lt(x, exp_const(T::LO));
  x = fmin(fmax(x, exp_const(T::LO)), exp_const(T::HI));
  vf t = mul(x, exp_const(T::LOG2E));
  vf big = add(t, exp_const(T::MAGIC));
  vi n = aie::sub(bits(big), bits(exp_const(T::MAGIC)));
  vf nf = sub(big, exp_const(T::MAGIC));
  vf p = exp_poly(mul(sub(t, nf), exp_const(T::LN2)));
  // 2^n in two halves so that subnormal results (n < -126) stay representable.
  vi n1 = aie::downshift(n, 1);
  vi n2 = aie::sub(n, n1);
  vf s1 = from_bits(aie::upshift(aie::add(n1, bits(exp_const(T::BIAS))), 23));
  vf s2 = from_bits(aie::upshift(aie::add(n2, bits(exp_const(T::BIAS))), 23));
  vf r = mul(mul(p, s1), s2);
  r = pick(over, exp_const(T::INF), r);
  return pick(under, exp_const(T::ZERO), r);
}

// e^x for a softmax's exponents (x <= 0, -inf or NaN): exp's arithmetic, so the same values,
// without its overflow test (nothing overflows; a positive NaN stays NaN where exp gives inf)
// and with the results below FLT_MIN (x under -87.33, where 2^n would be subnormal) 0 instead
// of subnormal: a probability under 2^-126 beside the row's largest, 1, changes no f32 sum.
inline vf exp_nonpos(vf x) {
  using T = ExpTable;
  vmask under = lt(x, exp_const(T::NONPOS_LO));
  vf t = mul(x, exp_const(T::LOG2E));
  vf big = add(t, exp_const(T::MAGIC));
  vi n = aie::sub(bits(big), bits(exp_const(T::MAGIC)));
  vf nf = sub(big, exp_const(T::MAGIC));
  vf p = exp_poly(mul(sub(t, nf), exp_const(T::LN2)));
  vf scale = from_bits(aie::upshift(aie::add(n, bits(exp_const(T::BIAS))), 23));
  return pick(under, exp_const(T::ZERO), mul(p, scale));
}

inline vf sigmoid(vf x) { return recip(add(splat(1.0f), exp(fneg(x)))); }

inline vf tanh(vf x) { return sub(mul(sigmoid(mul(x, 2.0f)), 2.0f), splat(1.0f)); }

// erf by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7).
inline vf erf(vf x) {
  vi sign = aie::bit_and(bits(x), splat_i(int32_t(0x80000000u)));
  vf z = fabs(x);
  vf t = recip(add(splat(1.0f), mul(z, 0.3275911f)));
  vf p = splat(1.061405429f);
  p = fma(p, t, splat(-1.453152027f));
  p = fma(p, t, splat(1.421413741f));
  p = fma(p, t, splat(-0.284496736f));
  p = fma(p, t, splat(0.254829592f));
  p = mul(p, t);
  vf e = exp(fneg(mul(z, z)));
  vf r = sub(splat(1.0f), mul(p, e));
  return from_bits(aie::bit_or(bits(r), sign));
}

// ------------------------------------------------------- ggml's activations
// GELU (tanh approximation), GELU_QUICK, SILU and GELU_ERF as ggml-cpu computes them, and the
// GLU ops built from them (act(x) * g). Shared by eltwise.cc (the unary and GLU ops) and the
// fused MUL_MAT_<glu> GEMVs (mv.cc, mvq.cc); glu.h picks the GLU op of a build.

inline vf gelu(vf x) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  vf inner = mul(add(x, mul(mul(mul(x, x), x), 0.044715f)), 0.79788456080286536f);
  return mul(mul(x, 0.5f), add(splat(1.0f), tanh(inner)));
}
inline vf gelu_quick(vf x) { return mul(x, sigmoid(mul(x, 1.702f))); }
inline vf silu(vf x) { return mul(x, sigmoid(x)); }
inline vf gelu_erf(vf x) {
  return mul(mul(x, 0.5f), add(splat(1.0f), erf(mul(x, 0.70710678118654752f))));
}

// ggml: x > 0 ? x * g : 0 (not relu(x) * g: a zero x times an infinite g is 0).
inline vf reglu(vf x, vf g) {
  const vf zero = splat(0.0f);
  return pick(lt(zero, x), mul(x, g), zero);
}
inline vf geglu(vf x, vf g) { return mul(gelu(x), g); }
inline vf swiglu(vf x, vf g) { return mul(silu(x), g); }
inline vf geglu_erf(vf x, vf g) { return mul(gelu_erf(x), g); }
inline vf geglu_quick(vf x, vf g) { return mul(gelu_quick(x), g); }

// ------------------------------------------------------- more float functions

inline vi sign_bit(vf v) { return aie::bit_and(bits(v), splat_i(int32_t(0x80000000u))); }

// |r| with the sign of s (bit operations: exact for zeros, infinities and NaNs).
inline vf copysign(vf r, vf s) {
  return from_bits(aie::bit_or(aie::bit_and(bits(r), splat_i(0x7fffffff)), sign_bit(s)));
}

inline vmask is_negative(vf v) { return aie::lt(bits(v), splat_i(0)); } // sign bit set
inline vmask is_zero(vf v) { return aie::eq(bits(fabs(v)), splat_i(0)); }
inline vmask is_nan(vf v) { return aie::lt(splat_i(0x7f800000), bits(fabs(v))); }
inline vmask is_inf(vf v) { return aie::eq(bits(fabs(v)), splat_i(0x7f800000)); }

inline vf inf() { return from_bits(splat_i(0x7f800000)); }
inline vf nan() { return from_bits(splat_i(0x7fc00000)); }

// Small integers (|i| < 2^22) as floats, exactly: the 1.5 * 2^23 trick of exp() in reverse.
inline vf small_int_to_float(vi i) {
  const vf magic = splat(12582912.0f);
  return sub(from_bits(aie::add(i, bits(magic))), magic);
}

// floor(|x|) for a non-negative x: (x + 2^23) - 2^23 is an integer within 1 of x (whatever
// the rounding of the adds), corrected down when above x. x >= 2^23 (and inf, NaN) is
// already integral and kept.
inline vf floor_nonneg(vf ax) {
  const vf two23 = splat(8388608.0f);
  vf r = sub(add(ax, two23), two23);
  r = pick(gt(r, ax), sub(r, splat(1.0f)), r);
  return pick(lt(ax, two23), r, ax);
}

inline vf ceil_nonneg(vf ax) {
  vf f = floor_nonneg(ax);
  return pick(lt(f, ax), add(f, splat(1.0f)), f);
}

// C's floorf, ceilf, truncf and roundf (halves away from zero), signs of zero included.
inline vf floor(vf x) {
  vf ax = fabs(x);
  return copysign(pick(is_negative(x), ceil_nonneg(ax), floor_nonneg(ax)), x);
}

inline vf ceil(vf x) {
  vf ax = fabs(x);
  return copysign(pick(is_negative(x), floor_nonneg(ax), ceil_nonneg(ax)), x);
}

inline vf trunc(vf x) { return copysign(floor_nonneg(fabs(x)), x); }

inline vf round(vf x) {
  vf ax = fabs(x);
  vf f = floor_nonneg(ax);
  // ax - f is exact (both below 2^23 and within 1 of each other).
  return copysign(pick(lt(sub(ax, f), splat(0.5f)), f, add(f, splat(1.0f))), x);
}

// sqrt(x) = x / sqrt(x): 1/sqrt(x) from the exponent bits and three Newton steps.
// Subnormals are scaled by 2^24 first; 0 -> 0 (sign kept), x < 0 -> NaN, inf -> inf.
inline vf sqrt(vf x) {
  vmask tiny = aie::lt(bits(fabs(x)), splat_i(0x00800000));
  vf xs = pick(tiny, mul(x, 16777216.0f), x);
  vf half = mul(xs, 0.5f);
  vf y = from_bits(aie::sub(splat_i(0x5f3759df), aie::downshift(bits(xs), 1)));
  for (int i = 0; i < 3; ++i)
    y = mul(y, sub(splat(1.5f), mul(mul(half, y), y))); // (x/2 * y) * y: no subnormal y*y
  vf r = mul(xs, y);
  r = add(r, mul(mul(sub(xs, mul(r, r)), y), 0.5f)); // r += (x - r^2) / (2 sqrt(x))
  r = pick(tiny, mul(r, 1.0f / 4096.0f), r);
  r = pick(is_inf(x), x, r);
  r = pick(is_negative(x), nan(), r);
  r = pick(is_nan(x), x, r);
  return pick(is_zero(x), x, r);
}

// Natural logarithm: x = 2^e * m with m in [sqrt(1/2), sqrt(2)), log(m) by the Cephes
// single-precision polynomial in f = m - 1. 0 -> -inf, x < 0 -> NaN, inf -> inf.
inline vf log(vf x) {
  const vf one = splat(1.0f);
  vmask tiny = aie::lt(bits(fabs(x)), splat_i(0x00800000));
  vf xs = pick(tiny, mul(x, 8388608.0f), x); // subnormals: scaled by 2^23
  vi ib = bits(xs);
  vi e = aie::sub(aie::bit_and(aie::downshift(ib, 23), splat_i(0xff)), splat_i(126));
  e = pick_i(tiny, aie::sub(e, splat_i(23)), e);
  // m in [0.5, 1)
  vf m = from_bits(aie::bit_or(aie::bit_and(ib, splat_i(0x007fffff)), splat_i(0x3f000000)));
  vmask low = lt(m, splat(0.70710678118654752f));
  vf f = pick(low, sub(add(m, m), one), sub(m, one));
  e = pick_i(low, aie::sub(e, splat_i(1)), e);
  vf ef = small_int_to_float(e);
  vf z = mul(f, f);
  vf y = splat(7.0376836292e-2f);
  y = fma(y, f, splat(-1.1514610310e-1f));
  y = fma(y, f, splat(1.1676998740e-1f));
  y = fma(y, f, splat(-1.2420140846e-1f));
  y = fma(y, f, splat(1.4249322787e-1f));
  y = fma(y, f, splat(-1.6668057665e-1f));
  y = fma(y, f, splat(2.0000714765e-1f));
  y = fma(y, f, splat(-2.4999993993e-1f));
  y = fma(y, f, splat(3.3333331174e-1f));
  y = mul(mul(y, f), z);
  y = add(y, mul(ef, -2.12194440e-4f));
  y = sub(y, mul(z, 0.5f));
  vf r = add(add(f, y), mul(ef, 0.693359375f));
  r = pick(is_inf(x), x, r);
  r = pick(is_negative(x), nan(), r);
  r = pick(is_zero(x), fneg(inf()), r);
  return pick(is_nan(x), x, r);
}

// sin(x + quadrant * pi/2): k = rint(x * 2/pi), r = x - k pi/2 in three parts (Cody-Waite,
// exact products for |k| < 2^12, i.e. |x| below about 6000), then the Cephes polynomials
// of sin and cos on |r| <= pi/4 chosen by (k + quadrant) mod 4. inf, NaN -> NaN.
inline vf sin_quadrant(vf x, int32_t quadrant) {
  const vf one = splat(1.0f);
  const vf magic = splat(12582912.0f); // 1.5 * 2^23: rounds to an integer
  vf big = add(mul(x, 0.63661977236758134f), magic);
  vi k = aie::sub(bits(big), bits(magic));
  vf kf = sub(big, magic);
  vf r = sub(x, mul(kf, 1.5703125f));
  r = sub(r, mul(kf, 4.837512969970703125e-4f));
  r = sub(r, mul(kf, 7.54978995489188216e-8f));
  vf z = mul(r, r);
  vf s = splat(-1.9515295891e-4f);
  s = fma(s, z, splat(8.3321608736e-3f));
  s = fma(s, z, splat(-1.6666654611e-1f));
  s = add(mul(mul(s, z), r), r);
  vf c = splat(2.443315711809948e-5f);
  c = fma(c, z, splat(-1.388731625493765e-3f));
  c = fma(c, z, splat(4.166664568298827e-2f));
  c = add(sub(mul(mul(c, z), z), mul(z, 0.5f)), one);
  vi q = aie::bit_and(aie::add(k, splat_i(quadrant)), splat_i(3));
  vf v = pick(aie::eq(aie::bit_and(q, splat_i(1)), splat_i(1)), c, s);
  v = pick(aie::eq(aie::bit_and(q, splat_i(2)), splat_i(2)), fneg(v), v);
  return pick(is_inf(x), nan(), v);
}

inline vf sin(vf x) { return sin_quadrant(x, 0); }
inline vf cos(vf x) { return sin_quadrant(x, 1); }

// --------------------------------------------------------------------- f16
// The AIE has no f16 arithmetic (and the AIE API no f16 vector type on aie2): f16 operands
// are held as their bit patterns (uint16_t) and converted to and from f32 with integer
// operations, 16 lanes at a time through an aligned staging buffer. f32 -> f16 rounds to
// nearest even, as ggml's CPU conversion (IEEE's default, F16C) does; the conversion is
// integer code, so the core's aie::set_rounding mode does not affect it.

// Vector f16 decoding (mvq.cc's f16 weights, flash_attn.cc's f16 K and V): IEEE binary16
// bit patterns (low 16 bits of each lane) to f32, exactly: normal numbers and inf/NaN re-bias
// the exponent; subnormals (exponent 0) are m * 2^-24, computed as
// (2^-14 * (1 + m/1024)) - 2^-14, exact in f32.
inline vf half_bits_to_f32(vi u) {
  vi sign = aie::upshift(aie::bit_and(u, splat_i(0x8000)), 16);
  vi o = aie::upshift(aie::bit_and(u, splat_i(0x7fff)), 13);
  vi e = aie::bit_and(o, splat_i(0x0f800000));
  vi normal = aie::add(o, splat_i(112 << 23));
  vi infnan = aie::add(o, splat_i(224 << 23));
  vf two_m14 = from_bits(splat_i(113 << 23));
  vi subn = bits(sub(from_bits(aie::add(o, splat_i(113 << 23))), two_m14));
  vi r = pick_i(aie::eq(e, splat_i(0x0f800000)), infnan, pick_i(aie::eq(e, splat_i(0)), subn, normal));
  return from_bits(aie::bit_or(r, sign));
}

// f16 values held in pairs in 32-bit words (value 2i in word i's low half, 2i + 1 in its
// high half), as the decode attention reads f16 K and V rows (fa_rows::decode_f16_pairs), to
// f32, exactly, without a shuffle: the even-indexed values of VEC words in one vector, the
// odd ones in another (a caller that keeps its operands in this pair order, as the attention
// keeps q and its accumulators, never reorders them). The constants are made once per object
// of the caller's (a vector register each on the core, not a broadcast per row).
struct HalfPairs {
  const vi exp_one = splat_i(0x04000400), exp_top4 = splat_i(0x78007800);
  const vi field_one = splat_i(0x08000800), borrows = splat_i(int32_t(0x80008000u));
  const vi keep_even = splat_i(int32_t(0x8fffffffu)), keep_odd = splat_i(int32_t(0x8fffe000u));
  const vi bias = splat_i(112 << 23);

  // Whether any value of the words has exponent 0 or 31 (zero, subnormal, infinite, NaN),
  // for both halves at once: adding 1 to each 5-bit exponent wraps those two to 0 or 1,
  // whose top four bits are zero, and a zero field borrows through the bit above it (15 or
  // 31, clear in u). Nonzero lanes are such words (all_normal tests a run of them once).
  vi odd_exponents(vi w) const {
    return aie::bit_and(aie::sub(aie::bit_and(aie::add(w, exp_one), exp_top4), field_one),
                        borrows);
  }

  // Whether the n vectors of words from w (64-byte aligned) hold normal numbers only: their
  // odd_exponents or'ed, one reduction (lanes 0, 1, -65536 or -65535 for bit 15, bit 31 and
  // both: the sum is 0 only when all are).
  bool all_normal(const int32_t *w, int n) const {
    vi odd = odd_exponents(aie::load_v<VEC>(w));
    for (int i = 1; i < n; ++i)
      odd = aie::bit_or(odd, odd_exponents(aie::load_v<VEC>(w + i * (int)VEC)));
    return aie::reduce_add(aie::downshift(odd, 15)) == 0;
  }

  // Words of normal values only: each value at the top of its lane (the even one moved there,
  // the odd one already there), one arithmetic shift right by 3 leaves the exponent and
  // mantissa where f32 has them under the sign smeared over the three bits above the
  // exponent, which one mask clears (for the odd value with the even one's bits below); an add
  // re-biases the exponent (15 to 127).
  void normal(vi w, vf &even, vf &odd) const {
    even = from_bits(
        aie::add(aie::bit_and(aie::downshift(aie::upshift(w, 16), 3), keep_even), bias));
    odd = from_bits(aie::add(aie::bit_and(aie::downshift(w, 3), keep_odd), bias));
  }

  // Any words (half_bits_to_f32 for both halves).
  static void any(vi w, vf &even, vf &odd) {
    even = half_bits_to_f32(w);
    odd = half_bits_to_f32(aie::downshift(w, 16));
  }

  // Where value i of a run decoded in pair order lands: per 2 VEC values the even-indexed
  // ones, then the odd ones.
  static constexpr int slot(int i) {
    return i / (2 * (int)VEC) * (2 * (int)VEC) + (i % 2) * (int)VEC + i % (2 * (int)VEC) / 2;
  }
};

// n (<= VEC) f16 values from p (any 2-byte alignment), the other lanes 0, as f32.
inline vf load_f16_zero(const uint16_t *p, int n) {
  alignas(64) int32_t u[VEC];
  for (int i = 0; i < (int)VEC; ++i)
    u[i] = i < n ? int32_t(p[i]) : 0;
  return half_bits_to_f32(aie::load_v<VEC>(u));
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, b;
  if (e == 0x1f) {
    b = sign | 0x7f800000u | (m << 13); // inf, NaN (payload kept)
  } else if (e != 0) {
    b = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    b = sign;
  } else { // subnormal m * 2^-24: normalise
    uint32_t s = 0;
    while (!(m & 0x400u)) {
      m <<= 1;
      ++s;
    }
    b = sign | ((113 - s) << 23) | ((m & 0x3ffu) << 13);
  }
  return __builtin_bit_cast(float, b);
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x = __builtin_bit_cast(uint32_t, f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) // NaN: quiet, top payload bits kept
    return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x3ffu);
  if (a >= 0x477ff000u) // at or above halfway between 65504 and 65536: infinity
    return sign | 0x7c00u;
  if (a >= 0x38800000u) { // normal f16 (>= 2^-14): rebias, round the 13 dropped bits
    uint32_t r = a - (112u << 23);
    uint32_t h = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
      ++h;
    return sign | (uint16_t)h;
  }
  if (a <= 0x33000000u) // at most 2^-25 (half the smallest subnormal, ties to even 0)
    return sign;
  uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
  uint32_t shift = 126 - e; // 14..24: m * 2^(e-150) in units of 2^-24
  uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1)))
    ++h;
  return sign | (uint16_t)h;
}

inline vf load_aligned(const uint16_t *p) {
  alignas(64) float tmp[VEC];
  for (unsigned i = 0; i < VEC; ++i)
    tmp[i] = f16_to_f32(p[i]);
  return aie::load_v<VEC>(tmp);
}
inline vf load_any(const uint16_t *p) { return load_aligned(p); }

inline void store_aligned(uint16_t *p, vf v) {
  alignas(64) float tmp[VEC];
  aie::store_v(tmp, v);
  for (unsigned i = 0; i < VEC; ++i)
    p[i] = f32_to_f16(tmp[i]);
}
inline void store_any(uint16_t *p, vf v) { store_aligned(p, v); }

// Tails shorter than VEC go through aligned staging buffers, so the math is
// always the vector code (no scalar float emulation).
template <typename T> inline vf load_part(const T *p, int n) {
  alignas(64) T tmp[VEC];
  for (int i = 0; i < (int)VEC; ++i)
    tmp[i] = p[i < n ? i : 0];
  return load_aligned(tmp);
}

// n < VEC elements, the other lanes 0 (for sums such as dot products).
template <typename T> inline vf load_part_zero(const T *p, int n) {
  alignas(64) T tmp[VEC];
  for (int i = 0; i < (int)VEC; ++i)
    tmp[i] = i < n ? p[i] : T(0);
  return load_aligned(tmp);
}

// n < VEC floats, the other lanes `fill` (-inf ahead of a max or an exponential).
inline vf load_part_fill(const float *p, int n, float fill) {
  alignas(64) float tmp[VEC];
  for (int i = 0; i < (int)VEC; ++i)
    tmp[i] = i < n ? p[i] : fill;
  return load_aligned(tmp);
}

template <typename T> inline void store_part(T *p, vf v, int n) {
  alignas(64) T tmp[VEC];
  store_aligned(tmp, v);
  for (int i = 0; i < n; ++i)
    p[i] = tmp[i];
}

// Scalar results computed with the vector code (the scalar unit has no float hardware).
inline float lane0(vf v) { return v.get(0); }

// The largest lane in the order of `greater`, on the vector unit (sortable views: their
// transform is its own inverse).
inline float max_lanes_vec(vf v) {
  const int32_t s = aie::reduce_max(sortable(v));
  return __builtin_bit_cast(float, s < 0 ? s ^ 0x7fffffff : s);
}

// The largest lane in the order of `greater` (the first of equal ones).
inline float max_lanes(vf v) {
  float m = v.get(0);
  for (unsigned i = 1; i < VEC; ++i) {
    float e = v.get(i);
    if (greater(e, m))
      m = e;
  }
  return m;
}

} // namespace ggml_aie

#endif
