// eltwise.cc: element-wise core functions of ggml_hsa_iron (aie2 / aie2p).
//
// Built once per kernel with Peano; the design (designs/_eltwise.py) sets:
//   GGML_OP_<OP>=1      the op (ADD SUB MUL DIV, one of the unary ops, SCALE, CLAMP)
//   OP_P0, OP_P1        SCALE's scale and bias, CLAMP's min and max (f32 bit patterns)
//   TILE                elements per object FIFO tile
//   IN0_T, IN1_T, OUT_T operand C types (IN1_T for binary ops)
//   COMPUTE_F32 / COMPUTE_INT   float operands (computed in f32) or integers
//   BINARY=1            binary op; BCAST=1 input 1 repeated over the output,
//   GLU=1               with BINARY: a GLU op (GGML_OP_REGLU ...), act(a) * b
//                       (f16 operands are uint16_t bits, converted in ggml_aie.h)
//   OUT_NE0..3, SRC_NE0..3      the output's and input 1's shapes
//   PAD=1, N_VALID      the element count (N_VALID) is not whole 32-bit words: the
//                       design moves it rounded up, so the last tile ends in pad
//                       elements (the rest of the operands' last DMA words)
//
// Functions (arguments: inputs, then output, as the object FIFOs deliver them):
//   ggml_eltwise_begin(start, step)  (BCAST or PAD) first logical index of this
//                                    worker's tiles, stride between them
//   ggml_eltwise_unary(in, out)            TILE elements
//   ggml_eltwise_binary(a, b, out)         TILE elements, same shapes
//   ggml_eltwise_bcast(a, b_all, out)      TILE elements, b_all = all of input 1
//
// Pad elements (PAD): the output's get input 0's bits when input 0 has the
// output's type, so an in-place kernel (output = input 0) writes the words it
// shares with neighbouring data back unchanged; otherwise they get the op's
// result on whatever input 0 held there.

#include "ggml_aie.h"

#ifndef TILE
#error "TILE must be defined"
#endif

using namespace ggml_aie;

#if COMPUTE_F32

// ------------------------------------------------------------------ float ops

#if BINARY && defined(GLU)
// GLU ops: act(x) * g, with ggml's activations (ggml_aie.h, picked by glu.h).
#include "glu.h"
static inline vf op2(vf x, vf g) { return glu_op(x, g); }
#elif BINARY
static inline vf op2(vf a, vf b) {
#if defined(GGML_OP_ADD)
  return add(a, b);
#elif defined(GGML_OP_SUB)
  return sub(a, b);
#elif defined(GGML_OP_MUL)
  return mul(a, b);
#elif defined(GGML_OP_DIV)
  return div(a, b);
#else
#error "unknown binary op"
#endif
}
#else
static inline vf op1(vf x) {
  const vf zero = splat(0.0f), one = splat(1.0f);
#if defined(GGML_OP_ABS)
  return fabs(x);
#elif defined(GGML_OP_NEG)
  return fneg(x);
#elif defined(GGML_OP_SGN)
  return pick(gt(x, zero), one, pick(lt(x, zero), splat(-1.0f), zero));
#elif defined(GGML_OP_STEP)
  return pick(gt(x, zero), one, zero);
#elif defined(GGML_OP_RELU)
  return pick(gt(x, zero), x, zero);
#elif defined(GGML_OP_TANH)
  return tanh(x);
#elif defined(GGML_OP_ELU)
  return pick(gt(x, zero), x, sub(exp(x), one));
#elif defined(GGML_OP_SIGMOID)
  return sigmoid(x);
#elif defined(GGML_OP_GELU)
  return gelu(x);
#elif defined(GGML_OP_GELU_QUICK)
  return gelu_quick(x);
#elif defined(GGML_OP_SILU)
  return silu(x);
#elif defined(GGML_OP_HARDSIGMOID)
  return fmin(one, fmax(zero, mul(add(x, splat(3.0f)), 1.0f / 6.0f)));
#elif defined(GGML_OP_HARDSWISH)
  return mul(x, fmin(one, fmax(zero, mul(add(x, splat(3.0f)), 1.0f / 6.0f))));
#elif defined(GGML_OP_EXP)
  return exp(x);
#elif defined(GGML_OP_GELU_ERF)
  return gelu_erf(x);
#elif defined(GGML_OP_SQR)
  return mul(x, x);
#elif defined(GGML_OP_SQRT)
  return sqrt(x);
#elif defined(GGML_OP_LOG)
  return log(x);
#elif defined(GGML_OP_SIN)
  return sin(x);
#elif defined(GGML_OP_COS)
  return cos(x);
#elif defined(GGML_OP_FLOOR)
  return floor(x);
#elif defined(GGML_OP_CEIL)
  return ceil(x);
#elif defined(GGML_OP_ROUND)
  return round(x);
#elif defined(GGML_OP_TRUNC)
  return trunc(x);
#elif defined(GGML_OP_SCALE)
  // ggml: x * scale + bias (x * scale when bias is 0); OP_P0/OP_P1 are their f32 bits.
  const vf scale = from_bits(splat_i(OP_P0));
#if OP_P1 == 0
  return mul(x, scale);
#else
  return add(mul(x, scale), from_bits(splat_i(OP_P1)));
#endif
#elif defined(GGML_OP_CLAMP)
  // ggml: MAX(MIN(x, max), min); OP_P0/OP_P1 are the f32 bits of min and max.
  return fmax(fmin(x, from_bits(splat_i(OP_P1))), from_bits(splat_i(OP_P0)));
#else
#error "unknown unary op"
#endif
}
#endif

#else // COMPUTE_INT

// ---------------------------------------------------------------- integer ops
// Integer arithmetic wraps around (two's complement); division by zero gives 0.

template <typename T> static inline T iop2(T a, T b) {
#if defined(GGML_OP_ADD)
  return (T)((uint32_t)a + (uint32_t)b);
#elif defined(GGML_OP_SUB)
  return (T)((uint32_t)a - (uint32_t)b);
#elif defined(GGML_OP_MUL)
  return (T)((uint32_t)a * (uint32_t)b);
#elif defined(GGML_OP_DIV)
  return b == 0 ? (T)0 : (T)(a / b);
#else
  return a;
#endif
}

// Integer vectors are whole 512-bit registers: 64 i8, 32 i16 or 16 i32 lanes.
template <typename T> constexpr unsigned IVEC = 64 / sizeof(T);
template <typename T> using ivec = aie::vector<T, IVEC<T>>;

// m ? if_true : if_false (aie::select takes the second vector where the mask is set).
template <typename V, typename M> static inline V ipick(M m, V if_true, V if_false) {
  return aie::select(if_false, if_true, m);
}

#if !BINARY
// The unary ops on IVEC lanes; iop1 below is the same op on one element (tails).
template <typename T> static inline ivec<T> iop1_v(ivec<T> x) {
  const ivec<T> zero = aie::broadcast<T, IVEC<T>>((T)0);
  const ivec<T> one = aie::broadcast<T, IVEC<T>>((T)1);
  (void)one;
#if defined(GGML_OP_ABS)
  return ipick(aie::lt(x, zero), aie::sub(zero, x), x);
#elif defined(GGML_OP_NEG)
  return aie::sub(zero, x);
#elif defined(GGML_OP_SGN)
  const ivec<T> minus = aie::broadcast<T, IVEC<T>>((T)-1);
  return ipick(aie::lt(zero, x), one, ipick(aie::lt(x, zero), minus, zero));
#elif defined(GGML_OP_STEP)
  return ipick(aie::lt(zero, x), one, zero);
#elif defined(GGML_OP_RELU)
  return ipick(aie::lt(zero, x), x, zero);
#else
#error "no vector form of this integer unary op"
#endif
}
#endif

template <typename T> static inline T iop1(T x) {
#if defined(GGML_OP_ABS)
  return x < 0 ? (T)(0u - (uint32_t)x) : x;
#elif defined(GGML_OP_NEG)
  return (T)(0u - (uint32_t)x);
#elif defined(GGML_OP_SGN)
  return (T)((x > 0) - (x < 0));
#elif defined(GGML_OP_STEP)
  return (T)(x > 0);
#elif defined(GGML_OP_RELU)
  return x > 0 ? x : (T)0;
#else
  return x;
#endif
}

#endif

#if !defined(PAD)
#define PAD 0
#endif
#if !defined(BCAST)
#define BCAST 0
#endif

#if BCAST || PAD
// Logical index (row-major over the output) of the next tile, and the stride
// between this worker's tiles. Per core: each core links its own copy.
static int32_t g_next;
static int32_t g_step;

// The logical index of this call's tile; moves on to the next one.
static inline int32_t next_tile() {
  int32_t idx = g_next;
  g_next += g_step;
  return idx;
}
#endif

#if PAD
// How many elements of the tile at logical index idx are real.
static inline int valid_in_tile(int32_t idx) {
  int32_t v = N_VALID - idx;
  return v < 0 ? 0 : (v > TILE ? TILE : (int)v);
}

static inline void keep_pad(const IN0_T *a, OUT_T *out, int valid) {
  if constexpr (std::is_same_v<IN0_T, OUT_T>)
    for (int i = valid; i < TILE; ++i)
      out[i] = a[i];
}
#endif

extern "C" {

#if BCAST || PAD
void ggml_eltwise_begin(int32_t start, int32_t step) {
  g_next = start;
  g_step = step;
}
#endif

#if !BINARY

void ggml_eltwise_unary(IN0_T *in, OUT_T *out) {
  set_ggml_rounding();
#if COMPUTE_F32
  int i = 0;
  for (; i + (int)VEC <= TILE; i += VEC)
    store_aligned(out + i, op1(load_aligned(in + i)));
  if (i < TILE)
    store_part(out + i, op1(load_part(in + i, TILE - i)), TILE - i);
#else
  // Integer operands share one type (IN0_T == OUT_T).
  constexpr int W = IVEC<IN0_T>;
  int i = 0;
  for (; i + W <= TILE; i += W)
    aie::store_v(out + i, iop1_v<IN0_T>(aie::load_v<W>(in + i)));
  for (; i < TILE; ++i)
    out[i] = (OUT_T)iop1<IN0_T>(in[i]);
#endif
#if PAD
  keep_pad(in, out, valid_in_tile(next_tile()));
#endif
}

#elif !BCAST

void ggml_eltwise_binary(IN0_T *a, IN1_T *b, OUT_T *out) {
  set_ggml_rounding();
#if COMPUTE_F32
  int i = 0;
  for (; i + (int)VEC <= TILE; i += VEC)
    store_aligned(out + i, op2(load_aligned(a + i), load_aligned(b + i)));
  if (i < TILE) {
    int n = TILE - i;
    store_part(out + i, op2(load_part(a + i, n), load_part(b + i, n)), n);
  }
#elif defined(GGML_OP_ADD) || defined(GGML_OP_SUB)
  // Integer add and subtract wrap in the vector unit too.
  constexpr int W = IVEC<OUT_T>;
  int i = 0;
  for (; i + W <= TILE; i += W) {
    auto va = aie::load_v<W>(a + i);
    auto vb = aie::load_v<W>(b + i);
#if defined(GGML_OP_ADD)
    aie::store_v(out + i, aie::add(va, vb));
#else
    aie::store_v(out + i, aie::sub(va, vb));
#endif
  }
  for (; i < TILE; ++i)
    out[i] = iop2<OUT_T>(a[i], b[i]);
#else
  for (int i = 0; i < TILE; ++i)
    out[i] = iop2<OUT_T>(a[i], b[i]);
#endif
#if PAD
  keep_pad(a, out, valid_in_tile(next_tile()));
#endif
}

#else // BCAST

// out[j] = a[j] op b[..] for `len` elements of one output row, input 1 read
// from `brow` (the row of input 1 this output row repeats) starting at i0.
static inline void bcast_segment(const IN0_T *a, const IN1_T *brow, OUT_T *out, int i0,
                                 int len) {
#if COMPUTE_F32
  if (SRC_NE0 == 1) {
    vf vb = load_part(brow, 1);
    vb = aie::broadcast<float, VEC>(vb[0]);
    int j = 0;
    for (; j + (int)VEC <= len; j += VEC)
      store_any(out + j, op2(load_any(a + j), vb));
    if (j < len)
      store_part(out + j, op2(load_part(a + j, len - j), vb), len - j);
    return;
  }
  int j = 0;
  while (j < len) {
    int bi = (i0 + j) % SRC_NE0;
    int run = SRC_NE0 - bi;
    if (run > len - j)
      run = len - j;
    int k = 0;
    for (; k + (int)VEC <= run; k += VEC)
      store_any(out + j + k, op2(load_any(a + j + k), load_any(brow + bi + k)));
    if (k < run) {
      int n = run - k;
      store_part(out + j + k, op2(load_part(a + j + k, n), load_part(brow + bi + k, n)), n);
    }
    j += run;
  }
#else
  for (int j = 0; j < len; ++j)
    out[j] = iop2<OUT_T>(a[j], brow[(i0 + j) % SRC_NE0]);
#endif
}

void ggml_eltwise_bcast(IN0_T *a, IN1_T *b, OUT_T *out) {
  set_ggml_rounding();
  int32_t idx = next_tile();
#if PAD
  const int count = valid_in_tile(idx); // the rest of the tile pads the last DMA word
#else
  const int count = TILE;
#endif
  // Position of the tile's first element in the output.
  int32_t i0 = idx % OUT_NE0;
  int32_t row = idx / OUT_NE0;
  int32_t i1 = row % OUT_NE1;
  int32_t i2 = (row / OUT_NE1) % OUT_NE2;
  int32_t i3 = row / (OUT_NE1 * OUT_NE2);
  int done = 0;
  while (done < count) {
    int len = OUT_NE0 - i0;
    if (len > count - done)
      len = count - done;
    int32_t brow = (((i3 % SRC_NE3) * SRC_NE2 + (i2 % SRC_NE2)) * SRC_NE1 + (i1 % SRC_NE1)) * SRC_NE0;
    bcast_segment(a + done, b + brow, out + done, i0, len);
    done += len;
    i0 = 0;
    if (++i1 == OUT_NE1) {
      i1 = 0;
      if (++i2 == OUT_NE2) {
        i2 = 0;
        ++i3;
      }
    }
  }
#if PAD
  keep_pad(a, out, count);
#endif
}

#endif

} // extern "C"
