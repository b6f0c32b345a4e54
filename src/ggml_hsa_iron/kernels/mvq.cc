// mvq.cc: GEMV core functions of ggml_hsa_iron's MUL_MAT design for weights moved as the
// bytes ggml stores them: f16 and the block-quantized types (f32 activations and results).
//
// y[r] += dot(W[r, 0:MV_KC], x[0:MV_KC]) for r < MV_ROWS. A W tile is MV_ROWS rows of
// MV_KC / QB blocks of BB bytes (ggml's block layouts, ggml-common.h; f16: 2-byte values),
// x is MV_KC f32 values, y MV_ROWS f32 sums accumulated over the K chunks.
//
// Every 16 values of a block share one scale and one offset (Q4_0, Q4_1, Q5_0, Q8_0: the
// block's; Q4_K, Q5_K: their 32-value sub-block's; Q6_K: their own). A group's integer codes
// are unpacked by the scalar unit (bytes, shifts and masks: no floating point, which the
// scalar unit does not have), turned into f32 exactly (small integers) and scaled with f32
// vector operations; the f32 weights and activations are then rounded to bf16 and multiplied
// in the bf16 MAC with f32 accumulators (bf16 in, f32 accumulate, as the float GEMV does).
//
// Precision against ggml's CPU backend: ggml-cpu quantizes each activation row to 8 bits per
// value (Q8_0, Q8_1 or Q8_K) and sums integer products; here the activations and the decoded
// weights are rounded to bf16 instead (8 significant bits, relative error <= 2^-9 each), so
// the results differ from the CPU's by rounding of a similar size, within test-backend-ops'
// MUL_MAT tolerance.
//
// Defines: exactly one of MVQ_F16, MVQ_Q4_0, MVQ_Q4_1, MVQ_Q5_0, MVQ_Q8_0, MVQ_Q4_K,
// MVQ_Q5_K, MVQ_Q6_K; MV_ROWS, MV_KC. MV_GLU=1 with GGML_OP_<glu op>: the fused
// MUL_MAT_<glu> functions (mv_glu.h).

#include "ggml_aie.h"
#if MV_GLU
#include "glu.h"
#endif

using namespace ggml_aie;

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
#error "mvq.cc: define one MVQ_<type>"
#endif

static_assert(MV_KC % QB == 0, "a K chunk is whole blocks");
constexpr int ROW_BYTES = MV_KC / QB * BB;

// Little-endian 16- and 32-bit fields of a block (blocks are not aligned: 18-, 20-, 22-,
// 34- and 210-byte blocks follow each other).
static inline int32_t u16_at(const uint8_t *p) { return int32_t(p[0]) | (int32_t(p[1]) << 8); }
static inline uint32_t u32_at(const uint8_t *p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// One f16 field as 16 equal f32 lanes.
static inline vf half_splat(const uint8_t *p) { return half_bits_to_f32(splat_i(u16_at(p))); }

// scale * code + offset for one group of 16 integer codes.
static inline vf scaled(const int32_t *codes, vf scale, vf offset) {
  vi c = aie::load_v<VEC>(codes);
  return add(mul(small_int_to_float(c), scale), offset);
}

#if !MVQ_F16

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

// Values 16g .. 16g+16 of the block at `b`, in f32.
static inline vf group(const uint8_t *b, int g) {
  alignas(64) int32_t codes[VEC];
  const vf zero = splat(0.0f);
#if MVQ_Q4_0 || MVQ_Q4_1 || MVQ_Q5_0
  // 16 bytes of nibbles: values 0..16 in the low nibbles, 16..32 in the high ones.
#if MVQ_Q4_0
  const int head = 2; // d
#elif MVQ_Q4_1
  const int head = 4; // d, m
#else
  const int head = 6; // d, qh
#endif
  const uint8_t *qs = b + head;
  for (int i = 0; i < (int)VEC; ++i)
    codes[i] = g ? qs[i] >> 4 : qs[i] & 0x0f;
#if MVQ_Q4_0
  for (int i = 0; i < (int)VEC; ++i)
    codes[i] -= 8;
  return scaled(codes, half_splat(b), zero);
#elif MVQ_Q4_1
  return scaled(codes, half_splat(b), half_splat(b + 2));
#else
  // The fifth bit of value j is bit j of the little-endian u32 after the scale.
  const uint32_t qh = u32_at(b + 2);
  for (int i = 0; i < (int)VEC; ++i)
    codes[i] = (codes[i] | int32_t(((qh >> (16 * g + i)) & 1) << 4)) - 16;
  return scaled(codes, half_splat(b), zero);
#endif
#elif MVQ_Q8_0
  for (int i = 0; i < (int)VEC; ++i)
    codes[i] = int8_t(b[2 + 16 * g + i]);
  return scaled(codes, half_splat(b), zero);
#elif MVQ_Q4_K || MVQ_Q5_K
  // Sub-block s = g / 2 (32 values) uses bytes 32 * (s / 2) .. of the nibbles, low nibbles
  // for even s; Q5_K's fifth bit of value l of a sub-block is bit s of qh[l].
  const int s = g / 2, l0 = 16 * (g % 2);
#if MVQ_Q4_K
  const uint8_t *qs = b + 16 + 32 * (s / 2); // after d, dmin, scales
#else
  const uint8_t *qs = b + 48 + 32 * (s / 2); // after d, dmin, scales, qh
#endif
  for (int i = 0; i < (int)VEC; ++i) {
    const uint8_t q = qs[l0 + i];
    codes[i] = s % 2 ? q >> 4 : q & 0x0f;
  }
#if MVQ_Q5_K
  const uint8_t *qh = b + 16;
  for (int i = 0; i < (int)VEC; ++i)
    codes[i] |= ((qh[l0 + i] >> s) & 1) << 4;
#endif
  int32_t sc, mn;
  k_scale_min(b + 4, s, sc, mn);
  vf scale = mul(half_splat(b), small_int_to_float(splat_i(sc)));
  vf offset = fneg(mul(half_splat(b + 2), small_int_to_float(splat_i(mn))));
  return scaled(codes, scale, offset);
#elif MVQ_Q6_K
  // Half h = g / 8 (128 values) uses ql[64h ..] and qh[32h ..]; quarter q = (g % 8) / 2
  // (32 values) takes the low (q < 2) or high nibble of ql[64h + 32(q % 2) + l] and bits
  // 2q, 2q+1 of qh[32h + l]; codes are offset by 32. One signed 8-bit scale per 16 values.
  const int h = g / 8, q = (g % 8) / 2, l0 = 16 * (g % 2);
  const uint8_t *ql = b + 64 * h + 32 * (q % 2);
  const uint8_t *qh = b + 128 + 32 * h;
  for (int i = 0; i < (int)VEC; ++i) {
    const int32_t lo = q < 2 ? ql[l0 + i] & 0x0f : ql[l0 + i] >> 4;
    const int32_t hi = (qh[l0 + i] >> (2 * q)) & 3;
    codes[i] = (lo | (hi << 4)) - 32;
  }
  vf scale = mul(half_splat(b + 208), small_int_to_float(splat_i(int8_t(b[192 + g]))));
  return scaled(codes, scale, zero);
#endif
}

static inline float row_dot(const uint8_t *row, const float *x) {
  auto acc = aie::zeros<accfloat, VEC>();
  for (int blk = 0; blk < MV_KC / QB; ++blk)
    for (int g = 0; g < QB / (int)VEC; ++g) {
      vf wv = group(row + blk * BB, g);
      vf xv = load_aligned(x + blk * QB + g * VEC);
      acc = aie::mac(acc, narrow<bfloat16>(wv), narrow<bfloat16>(xv));
    }
  return aie::reduce_add(acc.template to_vector<float>());
}

#else // MVQ_F16

// n (<= VEC) f16 values from p, the other lanes 0.
static inline vf halves(const uint8_t *p, int n) {
  alignas(64) int32_t u[VEC];
  for (int i = 0; i < (int)VEC; ++i)
    u[i] = i < n ? u16_at(p + 2 * i) : 0;
  return half_bits_to_f32(aie::load_v<VEC>(u));
}

static inline float row_dot(const uint8_t *row, const float *x) {
  constexpr int body = MV_KC - MV_KC % VEC;
  auto acc = aie::zeros<accfloat, VEC>();
  for (int k = 0; k < body; k += VEC)
    acc = aie::mac(acc, narrow<bfloat16>(halves(row + 2 * k, VEC)),
                   narrow<bfloat16>(load_aligned(x + k)));
  if constexpr (body < MV_KC) {
    constexpr int n = MV_KC - body;
    acc = aie::mac(acc, narrow<bfloat16>(halves(row + 2 * body, n)),
                   narrow<bfloat16>(load_part_zero(x + body, n)));
  }
  return aie::reduce_add(acc.template to_vector<float>());
}

#endif

extern "C" {

void ggml_mvq_zero(float *y) {
  for (int r = 0; r < MV_ROWS; ++r)
    y[r] = 0.0f;
}

} // extern "C"

static inline void accumulate(const int8_t *w, const float *x, float *y) {
  // The f32 -> bf16 conversions of the weights and activations round to nearest even, as
  // ggml converts to bf16; the core's reset mode (floor) would bias every product down.
  set_ggml_rounding();
  const uint8_t *wb = reinterpret_cast<const uint8_t *>(w);
  // Results are gathered VEC rows at a time and added to y with vector adds (the scalar
  // unit has no floating point).
  for (int r0 = 0; r0 < MV_ROWS; r0 += VEC) {
    int n = MV_ROWS - r0 < (int)VEC ? MV_ROWS - r0 : (int)VEC;
    vf sums = splat(0.0f);
    for (int i = 0; i < n; ++i)
      sums.set(row_dot(wb + (r0 + i) * ROW_BYTES, x), i);
    store_part(y + r0, add(load_part(y + r0, n), sums), n);
  }
}

extern "C" {

void ggml_mvq(int8_t *w, float *x, float *y) { accumulate(w, x, y); }

#if MV_GLU
// MUL_MAT_<glu>: see mv_glu.h.
#define GGML_MV_GATE_ZERO ggml_mvq_gate_zero
#define GGML_MV_GATE ggml_mvq_gate
#define GGML_MV_GLU ggml_mvq_glu
#define GGML_MV_W_T int8_t
#define GGML_MV_X_T float
#include "mv_glu.h"
#endif

} // extern "C"
