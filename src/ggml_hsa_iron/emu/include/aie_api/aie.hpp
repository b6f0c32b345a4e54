// A host-side stand-in for the subset of the AIE API (aie_api/aie.hpp) that
// the ggml_hsa_iron core functions use, so that their logic (indexing,
// broadcasting, tails, the vector math) can be compiled with g++ and checked
// numerically on the build machine, and so that the emulation target
// (ggml_hsa_iron --target emu) can run them in hsa-sim.
//
// It encodes this project's reading of the AIE API semantics, not the real
// headers: it cannot show that the kernels compile with Peano, only that
// they compute the right thing if the AIE API behaves as described here.
// Modelled (see the package README's table): the rounding mode of
// accumulator -> bf16 conversions (aie::set_rounding, per core, reset value
// floor), and on aie2 (__AIE_ARCH__ == 20) the f32 vector multiply emulated
// with bf16-rounded inputs. Not modelled: saturation (integers wrap), fp32
// accumulation rounding details, scalar float -> bf16 conversions (the
// compiler's round-to-nearest-even).
//
// It also counts the core's cycles for hsa-sim's timing model: every
// operation books its issue slots (two 256-bit load ports, one 256-bit store
// port, the vector multiplier, the vector ALU/shuffle unit, the scalar unit),
// the kernel's own code outside this API one scalar cycle per basic block it
// executes, and a kernel call lasts its busiest slot's count
// (docs/timing-model.md: perfect software pipelining, an optimistic bound).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

// The emulation target counts the kernel's own code with g++'s -fsanitize-coverage=trace-pc
// (and GGML_HSA_EMU_COUNT_SCALAR): __sanitizer_cov_trace_pc, in the library's generated unit,
// books a scalar cycle per basic block executed. This API's operations are calls that are not
// instrumented, so that their loops over lanes are not counted as the kernel's; their helpers
// are not instrumented either (g++ inlines a function only into one instrumented alike).
#ifdef GGML_HSA_EMU_COUNT_SCALAR
#define AIE_OP __attribute__((noinline, no_sanitize_coverage))
#define AIE_INL __attribute__((no_sanitize_coverage))
#else
#define AIE_OP
#define AIE_INL
#endif

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  // Scalar conversion: the compiler's round-to-nearest-even (not the vector unit's mode).
  AIE_INL bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = (uint16_t)((u >> 16) | 64);
    } else {
      bits = (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
    }
  }
  AIE_INL operator float() const {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

namespace aie {
enum class rounding_mode {
  floor,
  ceil,
  positive_inf,
  negative_inf,
  symmetric_inf,
  symmetric_zero,
  conv_even,
  conv_odd,
};
enum class saturation_mode { none, saturate, symmetric };
namespace detail {
// Per core: every core loads its own copy of the kernel library, and these hidden,
// non-unique (-fno-gnu-unique) inline variables are one per copy, shared by the library's
// translation units: a template any unit instantiates (the linker keeps one) reads the mode
// the core set, whichever unit set it.
inline rounding_mode g_rounding = rounding_mode::floor; // the hardware's reset value
inline saturation_mode g_saturation = saturation_mode::none;

// f32 -> bf16 bits in rounding mode m (NaNs stay quiet NaNs).
AIE_INL static inline uint16_t bf16_round(float f, rounding_mode m) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 64);
  uint32_t hi = u >> 16, lo = u & 0xffffu;
  bool neg = (u >> 31) != 0, up = false;
  switch (m) {
  case rounding_mode::floor: up = neg && lo; break;
  case rounding_mode::ceil: up = !neg && lo; break;
  case rounding_mode::positive_inf: up = lo > 0x8000u || (lo == 0x8000u && !neg); break;
  case rounding_mode::negative_inf: up = lo > 0x8000u || (lo == 0x8000u && neg); break;
  case rounding_mode::symmetric_inf: up = lo >= 0x8000u; break;
  case rounding_mode::symmetric_zero: up = lo > 0x8000u; break;
  case rounding_mode::conv_even: up = lo > 0x8000u || (lo == 0x8000u && (hi & 1)); break;
  case rounding_mode::conv_odd: up = lo > 0x8000u || (lo == 0x8000u && !(hi & 1)); break;
  }
  return (uint16_t)(hi + (up ? 1 : 0));
}
// Cycle counting (see the top of the file). Hidden, non-unique symbols: one
// counter per loaded copy of the library, that is per core.
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
// aie2 (AIE-ML, mlir-aie's aie2 mm.cc shapes): bf16 4x8x4, int8 4x8x8, int16
// 4x4x4 MACs per mmul; 16 accumulator lanes per element-wise float multiply.
inline constexpr unsigned kMacsBf16 = 128, kMacsI8 = 256, kMacsI16 = 64, kMulLanes = 16;
#else
// aie2p (mlir-aie's aie2p mm.cc shapes): bf16 4x8x8, int8 8x8x8, int16 4x4x8.
inline constexpr unsigned kMacsBf16 = 256, kMacsI8 = 512, kMacsI16 = 128, kMulLanes = 32;
#endif
// 16-bit integers: 32 lanes per element-wise multiply and per narrowing of their 32-bit
// accumulator, on either arch (AIE-ML intrinsics, UG1583: mul_elem_32 of two v32int16 into a
// v32acc32, srs_to_v32int16 and srs_to_v32int8 of a v32acc32, one instruction each).
inline constexpr unsigned kIntLanes = 32;
struct Slots {
  uint64_t load = 0, store = 0, mul = 0, alu = 0, scalar = 0;
};
inline Slots g_slots;
inline uint64_t g_cycles = 0;
AIE_INL static inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
AIE_INL static inline void count_load(uint64_t bytes) { g_slots.load += ceil_div(bytes, 32); }
AIE_INL static inline void count_store(uint64_t bytes) { g_slots.store += ceil_div(bytes, 32); }
AIE_INL static inline void count_alu(uint64_t bytes) { g_slots.alu += ceil_div(bytes, 64); }
AIE_INL static inline void count_mul(uint64_t lanes, uint64_t per_op = kMulLanes) {
  g_slots.mul += ceil_div(lanes, per_op);
}
AIE_INL static inline void count_scalar(uint64_t n) { g_slots.scalar += n; }
AIE_OP static inline void begin_call() { g_slots = Slots{}; }
AIE_OP static inline void end_call() {
  const uint64_t slots[] = {ceil_div(g_slots.load, 2), g_slots.store, g_slots.mul, g_slots.alu,
                            g_slots.scalar};
  uint64_t c = 0;
  for (uint64_t s : slots)
    c = s > c ? s : c;
  g_cycles += c;
}
} // namespace detail
AIE_INL static inline void set_rounding(rounding_mode m) { detail::g_rounding = m; }
AIE_INL static inline rounding_mode get_rounding() { return detail::g_rounding; }
AIE_INL static inline void set_saturation(saturation_mode m) { detail::g_saturation = m; }
AIE_INL static inline saturation_mode get_saturation() { return detail::g_saturation; }
} // namespace aie

// One lane of a packed 4-bit vector: two lanes per byte in memory, the low nibble first
// (what a load_v of int4 reads and the AIE API's int4 vectors hold).
struct int4 {
  int8_t v = 0;
};

struct accfloat {};
struct acc32 {};
struct acc64 {};

namespace aie {

template <typename T, unsigned N> struct vector {
  T v[N];
  // Lane access goes through the scalar unit.
  AIE_INL T operator[](unsigned i) const {
    detail::count_scalar(1);
    return v[i];
  }
  AIE_INL T get(unsigned i) const { return (*this)[i]; }
  AIE_INL void set(T x, unsigned i) {
    detail::count_scalar(1);
    v[i] = x;
  }
  AIE_INL static constexpr unsigned size() { return N; }
  template <unsigned M> AIE_OP vector<T, M> extract(unsigned idx) const {
    detail::count_alu(M * sizeof(T));
    vector<T, M> r;
    for (unsigned i = 0; i < M; ++i)
      r.v[i] = v[idx * M + i];
    return r;
  }
  template <unsigned M> AIE_OP vector &insert(unsigned idx, const vector<T, M> &x) {
    detail::count_alu(M * sizeof(T));
    for (unsigned i = 0; i < M; ++i)
      v[idx * M + i] = x.v[i];
    return *this;
  }
};

template <unsigned N> struct mask {
  bool m[N];
};

template <typename Tag, unsigned N> struct accum;

template <unsigned N> struct accum<accfloat, N> {
  float v[N] = {};
  accum() = default;
  template <typename T> AIE_INL explicit accum(const vector<T, N> &x) { from_vector(x); }
  template <typename T> AIE_OP void from_vector(const vector<T, N> &x) {
    detail::count_alu(N * 4);
    for (unsigned i = 0; i < N; ++i)
      v[i] = (float)x.v[i];
  }
  // To bf16 in the core's rounding mode (aie::set_rounding); to float exactly.
  template <typename T> AIE_OP vector<T, N> to_vector() const {
    detail::count_alu(N * 4);
    vector<T, N> r;
    for (unsigned i = 0; i < N; ++i) {
      if constexpr (std::is_same_v<T, bfloat16>)
        r.v[i].bits = detail::bf16_round(v[i], detail::g_rounding);
      else
        r.v[i] = T(v[i]);
    }
    return r;
  }
};

template <unsigned N> struct accum<acc32, N> {
  int64_t v[N] = {};
  template <typename T> AIE_OP void from_vector(const vector<T, N> &x) {
    detail::count_alu(N * 4);
    for (unsigned i = 0; i < N; ++i)
      v[i] = x.v[i];
  }
  // To 8- or 16-bit lanes: one shift-round-saturate per kIntLanes lanes; else by the bytes.
  template <typename T> AIE_OP vector<T, N> to_vector(int shift = 0) const {
    if constexpr (sizeof(T) <= 2)
      detail::count_alu(detail::ceil_div(N, detail::kIntLanes) * 64);
    else
      detail::count_alu(N * 4);
    vector<T, N> r;
    for (unsigned i = 0; i < N; ++i)
      r.v[i] = (T)(int32_t)(v[i] >> shift);
    return r;
  }
};

template <unsigned N, typename T> AIE_OP vector<std::remove_const_t<T>, N> load_v(T *p) {
  detail::count_load(N * sizeof(T));
  vector<std::remove_const_t<T>, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = p[i];
  return r;
}
// N 4-bit lanes from N / 2 bytes, sign-extended.
template <unsigned N> AIE_OP vector<int4, N> load_v(const int4 *p) {
  detail::count_load(N / 2);
  const auto *b = reinterpret_cast<const uint8_t *>(p);
  vector<int4, N> r;
  for (unsigned i = 0; i < N; ++i) {
    const int nib = (b[i / 2] >> (4 * (i % 2))) & 0x0f;
    r.v[i].v = int8_t(nib >= 8 ? nib - 16 : nib);
  }
  return r;
}
// A pointer not aligned to the vector: the two aligned vectors around it and a shift.
template <unsigned N, typename T>
AIE_OP vector<std::remove_const_t<T>, N> load_unaligned_v(T *p, unsigned = 1) {
  detail::count_load(N * sizeof(T));
  detail::count_alu(N * sizeof(T));
  return load_v<N>(p);
}
template <typename T, unsigned N> AIE_OP void store_v(T *p, const vector<T, N> &x) {
  detail::count_store(N * sizeof(T));
  for (unsigned i = 0; i < N; ++i)
    p[i] = x.v[i];
}
template <typename T, unsigned N> AIE_OP void store_unaligned_v(T *p, const vector<T, N> &x, unsigned = 1) {
  store_v(p, x);
}

template <typename T, unsigned N> AIE_OP vector<T, N> broadcast(T x) {
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = x;
  return r;
}

template <typename U, typename T, unsigned N> AIE_OP vector<U, N * sizeof(T) / sizeof(U)> vector_cast(const vector<T, N> &x) {
  vector<U, N * sizeof(T) / sizeof(U)> r;
  std::memcpy(r.v, x.v, sizeof(x.v));
  return r;
}

// Integer vectors wrap around; float vectors compute in float.
template <typename T> AIE_INL static T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return (T)((std::make_unsigned_t<T>)a + (std::make_unsigned_t<T>)b);
  else
    return (T)((float)a + (float)b);
}
template <typename T> AIE_INL static T wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return (T)((std::make_unsigned_t<T>)a - (std::make_unsigned_t<T>)b);
  else
    return (T)((float)a - (float)b);
}

template <typename T, unsigned N> AIE_OP vector<T, N> add(const vector<T, N> &a, const vector<T, N> &b) {
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = wrap_add(a.v[i], b.v[i]);
  return r;
}
template <typename T, unsigned N> AIE_OP vector<T, N> add(const vector<T, N> &a, T b) {
  return add(a, broadcast<T, N>(b));
}
template <typename T, unsigned N> AIE_OP vector<T, N> sub(const vector<T, N> &a, const vector<T, N> &b) {
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = wrap_sub(a.v[i], b.v[i]);
  return r;
}

// f32 x f32. On aie2 (__AIE_ARCH__ == 20) the vector unit has no f32 multiplier: the
// product is emulated with bf16 inputs (rounded to nearest even) and an exact f32 product,
// as mlir-aie's EmulateMulFInBF16Pattern does (accuracy "low"). aie2p multiplies in f32.
template <unsigned N> AIE_OP accum<accfloat, N> mul(const vector<float, N> &a, const vector<float, N> &b) {
  detail::count_mul(N);
  accum<accfloat, N> r;
  for (unsigned i = 0; i < N; ++i) {
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
    r.v[i] = (float)bfloat16(a.v[i]) * (float)bfloat16(b.v[i]);
#else
    r.v[i] = a.v[i] * b.v[i];
#endif
  }
  return r;
}
// bf16 x bf16: exact products in the f32 accumulator.
template <unsigned N> AIE_OP accum<accfloat, N> mul(const vector<bfloat16, N> &a, const vector<bfloat16, N> &b) {
  detail::count_mul(N);
  accum<accfloat, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (float)a.v[i] * (float)b.v[i];
  return r;
}
// Integers: exact products in the 32-bit accumulator; 16-bit lanes kIntLanes per op, wider
// ones as many as the float ones.
template <typename T, unsigned N, typename = std::enable_if_t<std::is_integral_v<T>>>
AIE_OP accum<acc32, N> mul(const vector<T, N> &a, const vector<T, N> &b) {
  detail::count_mul(N, sizeof(T) <= 2 ? detail::kIntLanes : detail::kMulLanes);
  accum<acc32, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (int64_t)a.v[i] * (int64_t)b.v[i];
  return r;
}
template <unsigned N> AIE_OP accum<accfloat, N> mul(const vector<float, N> &a, float s) {
  return mul(a, broadcast<float, N>(s));
}

template <typename T, unsigned N> AIE_OP vector<T, N> bit_and(const vector<T, N> &a, const vector<T, N> &b) {
  static_assert(std::is_integral_v<T>, "bit operations are on integer vectors");
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (T)(a.v[i] & b.v[i]);
  return r;
}
template <typename T, unsigned N> AIE_OP vector<T, N> bit_or(const vector<T, N> &a, const vector<T, N> &b) {
  static_assert(std::is_integral_v<T>, "bit operations are on integer vectors");
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (T)(a.v[i] | b.v[i]);
  return r;
}
template <typename T, unsigned N> AIE_OP vector<T, N> bit_xor(const vector<T, N> &a, const vector<T, N> &b) {
  static_assert(std::is_integral_v<T>, "bit operations are on integer vectors");
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (T)(a.v[i] ^ b.v[i]);
  return r;
}
// Arithmetic for signed lanes, logical for unsigned ones.
template <typename T, unsigned N> AIE_OP vector<T, N> downshift(const vector<T, N> &a, unsigned s) {
  static_assert(std::is_integral_v<T>, "shifts are on integer vectors");
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (T)(a.v[i] >> s);
  return r;
}
template <typename T, unsigned N> AIE_OP vector<T, N> upshift(const vector<T, N> &a, unsigned s) {
  static_assert(std::is_integral_v<T>, "shifts are on integer vectors");
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (T)((std::make_unsigned_t<T>)a.v[i] << s);
  return r;
}

// Lanes widened to twice their bits (sign- or zero-extended): one shuffle-unit op per 512
// bits of result.
template <typename T> struct unpacked;
template <> struct unpacked<int8_t> { using type = int16_t; };
template <> struct unpacked<uint8_t> { using type = uint16_t; };
template <unsigned N> AIE_OP vector<int8_t, N> unpack(const vector<int4, N> &a) {
  detail::count_alu(N);
  vector<int8_t, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = a.v[i].v;
  return r;
}
template <typename T, unsigned N> AIE_OP vector<typename unpacked<T>::type, N> unpack(const vector<T, N> &a) {
  using U = typename unpacked<T>::type;
  detail::count_alu(N * sizeof(U));
  vector<U, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (U)a.v[i];
  return r;
}

// a's lanes, then b's.
template <typename T, unsigned N> AIE_OP vector<T, 2 * N> concat(const vector<T, N> &a, const vector<T, N> &b) {
  detail::count_alu(2 * N * sizeof(T));
  vector<T, 2 * N> r;
  for (unsigned i = 0; i < N; ++i) {
    r.v[i] = a.v[i];
    r.v[N + i] = b.v[i];
  }
  return r;
}

// Integers (scaled by 2^-shift) to float lanes through the accumulator: two conversions, as
// from_vector and to_vector count them. Exact for the small integers the decoders make; the
// bf16 result is rounded in the core's mode otherwise.
template <typename TR, typename T, unsigned N> AIE_OP vector<TR, N> to_float(const vector<T, N> &a, int shift = 0) {
  static_assert(std::is_integral_v<T>, "to_float converts integer vectors");
  detail::count_alu(N * 4);
  detail::count_alu(N * 4);
  vector<TR, N> r;
  for (unsigned i = 0; i < N; ++i) {
    const float f = __builtin_ldexpf((float)a.v[i], -shift);
    if constexpr (std::is_same_v<TR, bfloat16>)
      r.v[i].bits = detail::bf16_round(f, detail::g_rounding);
    else
      r.v[i] = TR(f);
  }
  return r;
}
template <typename T, unsigned N> AIE_OP mask<N> lt(const vector<T, N> &a, const vector<T, N> &b) {
  detail::count_alu(N * sizeof(T));
  mask<N> m;
  for (unsigned i = 0; i < N; ++i)
    m.m[i] = a.v[i] < b.v[i];
  return m;
}
template <typename T, unsigned N> AIE_OP mask<N> eq(const vector<T, N> &a, const vector<T, N> &b) {
  detail::count_alu(N * sizeof(T));
  mask<N> m;
  for (unsigned i = 0; i < N; ++i)
    m.m[i] = a.v[i] == b.v[i];
  return m;
}
// select(a, b, m): b where the mask bit is set, a elsewhere.
template <typename T, unsigned N> AIE_OP vector<T, N> select(const vector<T, N> &a, const vector<T, N> &b, const mask<N> &m) {
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = m.m[i] ? b.v[i] : a.v[i];
  return r;
}

// A tree of shuffles and adds: log2(N) steps.
template <typename T, unsigned N> AIE_OP T reduce_add(const vector<T, N> &a) {
  for (unsigned n = N; n > 1; n /= 2)
    detail::count_alu(1);
  T s = 0;
  for (unsigned i = 0; i < N; ++i)
    s += a.v[i];
  return s;
}

// A tree of shuffles and maxima: log2(N) steps.
template <typename T, unsigned N> AIE_OP T reduce_max(const vector<T, N> &a) {
  static_assert(std::is_integral_v<T>, "reduce_max here takes integer vectors");
  for (unsigned n = N; n > 1; n /= 2)
    detail::count_alu(1);
  T m = a.v[0];
  for (unsigned i = 1; i < N; ++i)
    m = a.v[i] > m ? a.v[i] : m;
  return m;
}

// transpose(v, rows, cols): v holds a rows x cols row-major matrix; the
// result holds its transpose (cols x rows, row-major).
template <typename T, unsigned N> AIE_OP vector<T, N> transpose(const vector<T, N> &a, unsigned rows, unsigned cols) {
  detail::count_alu(N * sizeof(T));
  vector<T, N> r;
  for (unsigned i = 0; i < rows; ++i)
    for (unsigned j = 0; j < cols; ++j)
      r.v[j * rows + i] = a.v[i * cols + j];
  return r;
}

template <unsigned R, unsigned S, unsigned T, typename TA, typename TB, typename Acc = void> struct mmul {
  static constexpr unsigned size_A = R * S, size_B = S * T, size_C = R * T;
  using acc_t = std::conditional_t<std::is_integral_v<TA>, int64_t, float>;
  acc_t c[R * T] = {};
  mmul() = default;
  template <typename V> AIE_OP explicit mmul(const V &acc) {
    for (unsigned i = 0; i < R * T; ++i)
      c[i] = acc.v[i];
  }
  AIE_INL static constexpr unsigned native_macs() {
    if constexpr (std::is_integral_v<TA> && sizeof(TA) == 1)
      return detail::kMacsI8;
    else if constexpr (std::is_integral_v<TA>)
      return detail::kMacsI16;
    else
      return detail::kMacsBf16;
  }
  template <typename VA, typename VB> AIE_OP void mac(const VA &a, const VB &b) {
    detail::g_slots.mul += detail::ceil_div(R * S * T, native_macs());
    for (unsigned i = 0; i < R; ++i)
      for (unsigned j = 0; j < T; ++j) {
        acc_t s = 0;
        for (unsigned k = 0; k < S; ++k)
          s += (acc_t)(float_or_int(a.v[i * S + k])) * (acc_t)(float_or_int(b.v[k * T + j]));
        c[i * T + j] += s;
      }
  }
  template <typename V> AIE_INL static auto float_or_int(V x) {
    if constexpr (std::is_integral_v<V>)
      return (int64_t)x;
    else
      return (float)x;
  }
  template <typename U> AIE_OP vector<U, R * T> to_vector(int shift = 0) const {
    detail::count_alu(R * T * 4);
    vector<U, R * T> r;
    for (unsigned i = 0; i < R * T; ++i) {
      if constexpr (std::is_integral_v<U>)
        r.v[i] = (U)(int32_t)((int64_t)c[i] >> shift);
      else if constexpr (std::is_same_v<U, bfloat16>)
        r.v[i].bits = detail::bf16_round((float)c[i], detail::g_rounding);
      else
        r.v[i] = U((float)c[i]);
    }
    return r;
  }
};

} // namespace aie

namespace aie {
template <typename Tag, unsigned N> AIE_OP accum<Tag, N> zeros() { return accum<Tag, N>(); }
template <unsigned N, typename T> AIE_OP accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<T, N> &a, const vector<T, N> &b) {
  detail::count_mul(N);
  accum<accfloat, N> r = acc;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] += (float)a.v[i] * (float)b.v[i];
  return r;
}
} // namespace aie
