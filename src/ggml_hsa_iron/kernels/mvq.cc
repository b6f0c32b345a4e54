// mvq.cc: GEMV core functions of ggml_hsa_iron's MUL_MAT design for weights moved as the
// bytes ggml stores them: f16 and the block-quantized types (f32 activations and results).
//
// y[r] += dot(W[r, 0:MV_KC], x[0:MV_KC]) for r < MV_ROWS. A W tile is MV_ROWS rows of
// MV_KC / QB blocks of BB bytes (ggml's block layouts, ggml-common.h; f16: 2-byte values),
// x is MV_KC f32 values, y MV_ROWS f32 sums accumulated over the K chunks.
//
// The blocks are decoded 32 values at a time on the vector unit by block_decode.h's piece()
// to bf16 weights; x is rounded to bf16 once per call; they are multiplied in the bf16 MAC
// with f32 accumulators (bf16 in, f32 accumulate, as the float GEMV does). f16 weights are
// converted 32 at a time by shifts and masks (ggml_aie.h's HalfPairs, in an order x is
// converted to once per call) where K chunks are whole pairs of vectors, else 16 at a time
// (halves) with x.
//
// Precision against ggml's CPU backend: ggml-cpu quantizes each activation row to 8 bits per
// value (Q8_0, Q8_1 or Q8_K) and sums integer products; here the activations and the decoded
// weights are rounded to bf16 instead (8 significant bits, relative error <= 2^-9 each), so
// the results differ from the CPU's by rounding of a similar size, within test-backend-ops'
// MUL_MAT tolerance.
//
// Defines: exactly one of MVQ_F16, MVQ_Q4_0, MVQ_Q4_1, MVQ_Q5_0, MVQ_Q8_0, MVQ_Q4_K,
// MVQ_Q5_K, MVQ_Q6_K; MV_ROWS, MV_KC. MV_GLU=1 with GGML_OP_<glu op>: the fused
// MUL_MAT_<glu> functions (mv_glu.h). MV_ADD=1: the fused MUL_MAT_ADD epilogue (mv_add.h).
// MV_FA=1 with mv_fa.h's FA_* defines: FLASH_ATTN_FFN_<glu>'s attention phase (mv_fa.h).
// MV_OUT_F16=1: an f16 output, the K chunks summed in an f32 stash and each output rounded
// to f16 once, at the end of the round (mv_stash.h); no ggml_mvq/_zero.
// MV_NORM=1 with MV_NORM_K, OP_P0: the fused RMS_NORM_MUL_MAT(_<glu>) functions (mv_norm.h;
// with MV_OUT_F16, RMS_NORM_MUL_MAT's f16 output). MV_ROPE=1 with MV_NORM: the fused
// RMS_NORM_MUL_MAT_ROPE(_FF) epilogue (mv_rope.h: each round's rows rotated as ggml's ROPE after
// the norm's scale, before the f32 store or the f16 rounding). MV_NX=n (block-quantized
// weights; MUL_MAT and the GLU, ADD, norm, bias, rotation, attention and layer's projection
// functions, f32 or f16 outputs): x is the
// K chunk of n activation rows one after the other and y their n runs of MV_ROWS sums; each 32-value piece
// of a row is decoded once and multiplied with every row's chunk, so a W tile serves n products
// (a decode step of several tokens). With MV_ADD it needs MV_ADD_ROWS (mv_add.h).

#include "ggml_aie.h"
#if MV_GLU
#include "glu.h"
#endif
#if MV_FA
#include "fa_rows.h"
#endif

using namespace ggml_aie;

#include "block_decode.h"

#if !defined(MV_OUT_F16)
#define MV_OUT_F16 0
#endif
#if MV_OUT_F16 && (MV_GLU || MV_ADD)
#error "an f16 output is MUL_MAT's and RMS_NORM_MUL_MAT's"
#endif
#if !defined(MV_NX)
#define MV_NX 1
#endif
#if MV_NX > 1 && MVQ_F16
#error "several activation rows per call: block-quantized weights"
#endif

static_assert(MV_KC % QB == 0, "a K chunk is whole blocks");
constexpr int ROW_BYTES = MV_KC / QB * BB;

#if !MVQ_F16

// x's chunk in bf16 (MV_NX rows' chunks, one after the other), converted once per call for all
// the tile's rows.
alignas(64) static bfloat16 g_xb[MV_NX * MV_KC];

static inline void convert_x(const float *x) {
  for (int k = 0; k < MV_NX * MV_KC; k += VEC)
    aie::store_v(g_xb + k, narrow<bfloat16>(load_aligned(x + k)));
}

#if MV_NX > 1
// A row's dot products with each of the MV_NX activation rows' chunks: every piece decoded once.
static inline void row_dots(const uint8_t *row, const BlockConsts &k, float *out) {
  aie::accum<accfloat, 32> acc[MV_NX];
  for (int n = 0; n < MV_NX; ++n)
    acc[n] = aie::zeros<accfloat, 32>();
  for (int blk = 0; blk < MV_KC / QB; ++blk) {
    const uint8_t *b = row + blk * BB;
    const BlockScales s = block_scales(b);
    for (int j = 0; j < PIECES; ++j) {
      const auto w = piece(b, j, s, k);
      for (int n = 0; n < MV_NX; ++n)
        acc[n] = aie::mac(acc[n], w, aie::load_v<32>(g_xb + n * MV_KC + blk * QB + 32 * j));
    }
  }
  for (int n = 0; n < MV_NX; ++n)
    out[n] = aie::reduce_add(acc[n].template to_vector<float>());
}
#endif

static inline float row_dot(const uint8_t *row, const float *, const BlockConsts &k) {
  auto acc = aie::zeros<accfloat, 32>();
  for (int blk = 0; blk < MV_KC / QB; ++blk) {
    const uint8_t *b = row + blk * BB;
    const BlockScales s = block_scales(b);
    for (int j = 0; j < PIECES; ++j) {
      const auto xb = aie::load_v<32>(g_xb + blk * QB + 32 * j);
      acc = aie::mac(acc, piece(b, j, s, k), xb);
    }
  }
  return aie::reduce_add(acc.template to_vector<float>());
}

#elif MV_KC % 32 == 0 // MVQ_F16, K chunks of whole pairs of vectors
static_assert(2 * VEC == 32, "HalfPairs decode 32 values a word vector");

// x's chunk in bf16 in the weights' pair order (HalfPairs: per 32 values the even-indexed,
// then the odd ones), converted once per call for all the tile's rows.
alignas(64) static bfloat16 g_xb[MV_KC];

static inline void convert_x(const float *x) {
  alignas(64) float t[2 * VEC];
  for (int k = 0; k < MV_KC; k += 2 * VEC) {
    for (int i = 0; i < 2 * (int)VEC; ++i)
      t[HalfPairs::slot(i)] = x[k + i];
    aie::store_v(g_xb + k, narrow<bfloat16>(aie::load_v<VEC>(t)));
    aie::store_v(g_xb + k + VEC, narrow<bfloat16>(aie::load_v<VEC>(t + VEC)));
  }
}

// A row's f16 weights 32 at a time by HalfPairs (shifts and masks when the whole row holds
// normal numbers, one test per row; else exactly), in pair order against g_xb.
static inline float row_dot(const uint8_t *row, const float *, const BlockConsts &k) {
  constexpr int N = MV_KC / (2 * VEC);
  const int32_t *w = reinterpret_cast<const int32_t *>(row);
  const bool normal = k.halves.all_normal(w, N);
  auto acc = aie::zeros<accfloat, VEC>();
  for (int i = 0; i < N; ++i) {
    vf even_v, odd_v;
    if (normal)
      k.halves.normal(aie::load_v<VEC>(w + i * VEC), even_v, odd_v);
    else
      HalfPairs::any(aie::load_v<VEC>(w + i * VEC), even_v, odd_v);
    acc = aie::mac(acc, narrow<bfloat16>(even_v), aie::load_v<VEC>(g_xb + 2 * i * VEC));
    acc = aie::mac(acc, narrow<bfloat16>(odd_v), aie::load_v<VEC>(g_xb + (2 * i + 1) * VEC));
  }
  return aie::reduce_add(acc.template to_vector<float>());
}

#else // MVQ_F16, other K chunks

static inline void convert_x(const float *) {}

static inline float row_dot(const uint8_t *row, const float *x, const BlockConsts &) {
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

#if !MV_OUT_F16
extern "C" {

void ggml_mvq_zero(float *y) {
  for (int r = 0; r < MV_NX * MV_ROWS; ++r)
    y[r] = 0.0f;
}

} // extern "C"
#endif

static inline void accumulate(const int8_t *w, const float *x, float *y) {
  // The f32 -> bf16 conversions of the weights and activations round to nearest even, as
  // ggml converts to bf16; the core's reset mode (floor) would bias every product down.
  set_ggml_rounding();
  const uint8_t *wb = reinterpret_cast<const uint8_t *>(w);
  convert_x(x);
  const BlockConsts k;
#if MV_NX > 1
  for (int r0 = 0; r0 < MV_ROWS; r0 += VEC) {
    int n = MV_ROWS - r0 < (int)VEC ? MV_ROWS - r0 : (int)VEC;
    vf sums[MV_NX];
    for (int x_row = 0; x_row < MV_NX; ++x_row)
      sums[x_row] = splat(0.0f);
    for (int i = 0; i < n; ++i) {
      float dots[MV_NX];
      row_dots(wb + (r0 + i) * ROW_BYTES, k, dots);
      for (int x_row = 0; x_row < MV_NX; ++x_row)
        sums[x_row].set(dots[x_row], i);
    }
    for (int x_row = 0; x_row < MV_NX; ++x_row) {
      float *yr = y + x_row * MV_ROWS + r0;
      store_part(yr, add(load_part(yr, n), sums[x_row]), n);
    }
  }
  return;
#endif
  // Results are gathered VEC rows at a time and added to y with vector adds (the scalar
  // unit has no floating point).
  for (int r0 = 0; r0 < MV_ROWS; r0 += VEC) {
    int n = MV_ROWS - r0 < (int)VEC ? MV_ROWS - r0 : (int)VEC;
    vf sums = splat(0.0f);
    for (int i = 0; i < n; ++i)
      sums.set(row_dot(wb + (r0 + i) * ROW_BYTES, x, k), i);
    store_part(y + r0, add(load_part(y + r0, n), sums), n);
  }
}

extern "C" {

#define GGML_MV_W_T int8_t
#define GGML_MV_X_T float

#if MV_OUT_F16
// MUL_MAT with an f16 output: see mv_stash.h.
#define GGML_MV_STASH_ZERO ggml_mvq_stash_zero
#define GGML_MV_STASH ggml_mvq_stash
#define GGML_MV_STORE_F16 ggml_mvq_store_f16
#include "mv_stash.h"
#else
void ggml_mvq(int8_t *w, float *x, float *y) { accumulate(w, x, y); }
#endif

#if MV_GLU
// MUL_MAT_<glu>: see mv_glu.h.
#define GGML_MV_STASH_ZERO ggml_mvq_gate_zero
#define GGML_MV_STASH ggml_mvq_gate
#define GGML_MV_GLU ggml_mvq_glu
#include "mv_glu.h"
#endif

#if MV_ADD
// MUL_MAT_ADD: see mv_add.h.
#define GGML_MV_ADD ggml_mvq_add
#include "mv_add.h"
#endif

#if MV_FA
// FLASH_ATTN_FFN_<glu>'s attention phase on the GEMV's fifos: see mv_fa.h.
#define GGML_MV_FA_Q ggml_mvq_fa_q
#define GGML_MV_FA_MASK ggml_mvq_fa_mask
#define GGML_MV_FA_K ggml_mvq_fa_k
#define GGML_MV_FA_V ggml_mvq_fa_v
#define GGML_MV_FA_OUT ggml_mvq_fa_out
#include "mv_fa.h"
#endif

#if MV_NORM
#if MV_BIAS
// RMS_NORM_MUL_MAT_BIAS(...): see mv_bias.h (its epilogue runs in mv_norm.h's and mv_rope.h's).
#define GGML_MV_BIAS_LOAD ggml_mvq_bias_load
#include "mv_bias.h"
#endif
// RMS_NORM_MUL_MAT(_<glu>): see mv_norm.h.
#define GGML_MV_NORM_LOAD ggml_mvq_norm_load
#define GGML_MV_NORM_ZERO ggml_mvq_norm_zero
#define GGML_MV_NORM ggml_mvq_norm
#define GGML_MV_NORM_SCALE ggml_mvq_norm_scale
#if MV_OUT_F16
// The round's sums in the stash, scaled by s, then rounded to f16 once.
#define GGML_MV_NORM_STASH_ZERO ggml_mvq_norm_stash_zero
#define GGML_MV_NORM_STASH ggml_mvq_norm_stash
#define GGML_MV_NORM_STORE_F16 ggml_mvq_norm_store_f16
#else
// MV_GLU: the gate rows' sums in the stash.
#define GGML_MV_NORM_STASH_ZERO ggml_mvq_norm_gate_zero
#define GGML_MV_NORM_STASH ggml_mvq_norm_gate
#endif
#ifndef GGML_MV_W_T
#define GGML_MV_W_T int8_t
#endif
#include "mv_norm.h"
#if MV_ROPE
// RMS_NORM_MUL_MAT_ROPE(_FF): see mv_rope.h.
#define GGML_MV_ROPE_LOAD ggml_mvq_rope_load
#define GGML_MV_NORM_ROPE_SCALE ggml_mvq_norm_rope_scale
#define GGML_MV_NORM_ROPE_STORE_F16 ggml_mvq_norm_rope_store_f16
#include "mv_rope.h"
#endif
#if MV_DECODE
// DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu>'s projection phase: see mv_decode.h.
#define GGML_MV_DL_ROPE_LOAD ggml_mvq_dl_rope_load
#define GGML_MV_DL_BIAS_LOAD ggml_mvq_dl_bias_load
#define GGML_MV_DL_SCALE_ROPE ggml_mvq_dl_scale_rope
#define GGML_MV_DL_SCALE ggml_mvq_dl_scale
#define GGML_MV_DL_STORE_F16 ggml_mvq_dl_store_f16
#define GGML_MV_DL_KEEP ggml_mvq_dl_keep
#define GGML_MV_DL_HEADS ggml_mvq_dl_heads
#define GGML_MV_DL_EMIT ggml_mvq_dl_emit
#include "mv_decode.h"
#endif
#if DL_POST_NORM
// DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu>'s norm-add phases: see mv_post_norm.h.
#define GGML_MV_PN_SQUARES ggml_mvq_pn_squares
#define GGML_MV_PN_KEEP ggml_mvq_pn_keep
#define GGML_MV_PN_OUT ggml_mvq_pn_out
#include "mv_post_norm.h"
#endif
#endif

} // extern "C"
