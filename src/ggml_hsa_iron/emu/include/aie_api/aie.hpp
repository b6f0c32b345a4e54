// A host-side stand-in for the subset of the AIE API (aie_api/aie.hpp) that
// the ggml_hsa_iron core functions use, so that their logic (indexing,
// broadcasting, tails, the vector math) can be compiled with g++ and checked
// numerically on the build machine.
//
// It encodes this project's reading of the AIE API semantics, not the real
// headers: it cannot show that the kernels compile with Peano, only that
// they compute the right thing if the AIE API behaves as described here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = (uint16_t)((u >> 16) | 64);
    } else {
      bits = (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
    }
  }
  operator float() const {
    uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct accfloat {};
struct acc32 {};
struct acc64 {};

namespace aie {

template <typename T, unsigned N> struct vector {
  T v[N];
  T operator[](unsigned i) const { return v[i]; }
  T get(unsigned i) const { return v[i]; }
  void set(T x, unsigned i) { v[i] = x; }
  static constexpr unsigned size() { return N; }
  template <unsigned M> vector<T, M> extract(unsigned idx) const {
    vector<T, M> r;
    for (unsigned i = 0; i < M; ++i)
      r.v[i] = v[idx * M + i];
    return r;
  }
  template <unsigned M> vector &insert(unsigned idx, const vector<T, M> &x) {
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
  template <typename T> explicit accum(const vector<T, N> &x) { from_vector(x); }
  template <typename T> void from_vector(const vector<T, N> &x) {
    for (unsigned i = 0; i < N; ++i)
      v[i] = (float)x.v[i];
  }
  template <typename T> vector<T, N> to_vector() const {
    vector<T, N> r;
    for (unsigned i = 0; i < N; ++i)
      r.v[i] = T(v[i]);
    return r;
  }
};

template <unsigned N> struct accum<acc32, N> {
  int64_t v[N] = {};
  template <typename T> void from_vector(const vector<T, N> &x) {
    for (unsigned i = 0; i < N; ++i)
      v[i] = x.v[i];
  }
  template <typename T> vector<T, N> to_vector(int shift = 0) const {
    vector<T, N> r;
    for (unsigned i = 0; i < N; ++i)
      r.v[i] = (T)(int32_t)(v[i] >> shift);
    return r;
  }
};

template <unsigned N, typename T> vector<std::remove_const_t<T>, N> load_v(T *p) {
  vector<std::remove_const_t<T>, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = p[i];
  return r;
}
template <unsigned N, typename T>
vector<std::remove_const_t<T>, N> load_unaligned_v(T *p, unsigned = 1) {
  return load_v<N>(p);
}
template <typename T, unsigned N> void store_v(T *p, const vector<T, N> &x) {
  for (unsigned i = 0; i < N; ++i)
    p[i] = x.v[i];
}
template <typename T, unsigned N> void store_unaligned_v(T *p, const vector<T, N> &x, unsigned = 1) {
  store_v(p, x);
}

template <typename T, unsigned N> vector<T, N> broadcast(T x) {
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = x;
  return r;
}

template <typename U, typename T, unsigned N> vector<U, N * sizeof(T) / sizeof(U)> vector_cast(const vector<T, N> &x) {
  vector<U, N * sizeof(T) / sizeof(U)> r;
  std::memcpy(r.v, x.v, sizeof(x.v));
  return r;
}

// Integer vectors wrap around; float vectors compute in float.
template <typename T> static T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return (T)((std::make_unsigned_t<T>)a + (std::make_unsigned_t<T>)b);
  else
    return (T)((float)a + (float)b);
}
template <typename T> static T wrap_sub(T a, T b) {
  if constexpr (std::is_integral_v<T>)
    return (T)((std::make_unsigned_t<T>)a - (std::make_unsigned_t<T>)b);
  else
    return (T)((float)a - (float)b);
}

template <typename T, unsigned N> vector<T, N> add(const vector<T, N> &a, const vector<T, N> &b) {
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = wrap_add(a.v[i], b.v[i]);
  return r;
}
template <typename T, unsigned N> vector<T, N> add(const vector<T, N> &a, T b) {
  return add(a, broadcast<T, N>(b));
}
template <typename T, unsigned N> vector<T, N> sub(const vector<T, N> &a, const vector<T, N> &b) {
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = wrap_sub(a.v[i], b.v[i]);
  return r;
}

template <unsigned N> accum<accfloat, N> mul(const vector<float, N> &a, const vector<float, N> &b) {
  accum<accfloat, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = a.v[i] * b.v[i];
  return r;
}
template <unsigned N> accum<accfloat, N> mul(const vector<float, N> &a, float s) {
  return mul(a, broadcast<float, N>(s));
}

template <unsigned N> vector<int32_t, N> bit_and(const vector<int32_t, N> &a, const vector<int32_t, N> &b) {
  vector<int32_t, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = a.v[i] & b.v[i];
  return r;
}
template <unsigned N> vector<int32_t, N> bit_or(const vector<int32_t, N> &a, const vector<int32_t, N> &b) {
  vector<int32_t, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = a.v[i] | b.v[i];
  return r;
}
template <unsigned N> vector<int32_t, N> bit_xor(const vector<int32_t, N> &a, const vector<int32_t, N> &b) {
  vector<int32_t, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = a.v[i] ^ b.v[i];
  return r;
}
template <unsigned N> vector<int32_t, N> downshift(const vector<int32_t, N> &a, unsigned s) {
  vector<int32_t, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = a.v[i] >> s;
  return r;
}
template <unsigned N> vector<int32_t, N> upshift(const vector<int32_t, N> &a, unsigned s) {
  vector<int32_t, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = (int32_t)((uint32_t)a.v[i] << s);
  return r;
}
template <typename T, unsigned N> mask<N> lt(const vector<T, N> &a, const vector<T, N> &b) {
  mask<N> m;
  for (unsigned i = 0; i < N; ++i)
    m.m[i] = a.v[i] < b.v[i];
  return m;
}
template <typename T, unsigned N> mask<N> eq(const vector<T, N> &a, const vector<T, N> &b) {
  mask<N> m;
  for (unsigned i = 0; i < N; ++i)
    m.m[i] = a.v[i] == b.v[i];
  return m;
}
// select(a, b, m): b where the mask bit is set, a elsewhere.
template <typename T, unsigned N> vector<T, N> select(const vector<T, N> &a, const vector<T, N> &b, const mask<N> &m) {
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] = m.m[i] ? b.v[i] : a.v[i];
  return r;
}

template <typename T, unsigned N> T reduce_add(const vector<T, N> &a) {
  T s = 0;
  for (unsigned i = 0; i < N; ++i)
    s += a.v[i];
  return s;
}

// transpose(v, rows, cols): v holds a rows x cols row-major matrix; the
// result holds its transpose (cols x rows, row-major).
template <typename T, unsigned N> vector<T, N> transpose(const vector<T, N> &a, unsigned rows, unsigned cols) {
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
  template <typename V> explicit mmul(const V &acc) {
    for (unsigned i = 0; i < R * T; ++i)
      c[i] = acc.v[i];
  }
  template <typename VA, typename VB> void mac(const VA &a, const VB &b) {
    for (unsigned i = 0; i < R; ++i)
      for (unsigned j = 0; j < T; ++j) {
        acc_t s = 0;
        for (unsigned k = 0; k < S; ++k)
          s += (acc_t)(float_or_int(a.v[i * S + k])) * (acc_t)(float_or_int(b.v[k * T + j]));
        c[i * T + j] += s;
      }
  }
  template <typename V> static auto float_or_int(V x) {
    if constexpr (std::is_integral_v<V>)
      return (int64_t)x;
    else
      return (float)x;
  }
  template <typename U> vector<U, R * T> to_vector(int shift = 0) const {
    vector<U, R * T> r;
    for (unsigned i = 0; i < R * T; ++i) {
      if constexpr (std::is_integral_v<U>)
        r.v[i] = (U)(int32_t)((int64_t)c[i] >> shift);
      else
        r.v[i] = U((float)c[i]);
    }
    return r;
  }
};

} // namespace aie

namespace aie {
template <typename Tag, unsigned N> accum<Tag, N> zeros() { return accum<Tag, N>(); }
template <unsigned N, typename T> accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<T, N> &a, const vector<T, N> &b) {
  accum<accfloat, N> r = acc;
  for (unsigned i = 0; i < N; ++i)
    r.v[i] += (float)a.v[i] * (float)b.v[i];
  return r;
}
} // namespace aie
