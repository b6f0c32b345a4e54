// mv.cc: GEMV core functions of ggml_hsa_iron's MUL_MAT design (one src1 row).
//
// y[r] += dot(W[r, 0:KC], x[0:KC]) for r < MV_ROWS: W (src0's type W_T) is
// MV_ROWS rows of MV_KC contiguous elements, x (src1's type X_T) MV_KC
// elements, y (dst's type Y_T) MV_ROWS results accumulated over the K chunks.
// MV_KC is any chunk of K (whole vectors, then a zero-padded tail).
// MV_GLU=1 with GGML_OP_<glu op> (f32 y): the fused MUL_MAT_<glu> functions (mv_glu.h).
// MV_ADD=1 (f32 x and y): the fused MUL_MAT_ADD epilogue (mv_add.h).
// MV_FA=1 with mv_fa.h's FA_* defines (f32 x and y): FLASH_ATTN_FFN_<glu>'s attention phase.
// MV_OUT_F16=1 (Y_T uint16_t, f16 bit patterns): the K chunks are summed in an f32 stash and
// each output rounded to f16 once, at the end of the round (mv_stash.h); no ggml_mv/_zero.
// MV_NORM=1 with MV_NORM_K, OP_P0 (f32 x; y f32, or f16 with MV_OUT_F16): the fused
// RMS_NORM_MUL_MAT(_<glu>) functions (mv_norm.h).
// MV_ROPE=1 with MV_NORM (no MV_GLU), MV_ROPE_HEAD, MV_ROPE_N, MV_ROPE_BLOCK, MV_ROPE_TOKENS and
// rope_math.h's defines: the fused RMS_NORM_MUL_MAT_ROPE(_FF) epilogue, each round's rows
// rotated as ggml's ROPE after the norm's scale (mv_rope.h; f32 y, or f16 with MV_OUT_F16).
// MV_DECODE=1 with MV_GLU, MV_NORM, DL_EPS, DL_HEAD, DL_FF_WORDS and rope_math.h's defines:
// DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu>'s projection phase (mv_decode.h); with DL_POST_NORM=1
// and DL_POST_EPS_ATTN, DL_POST_EPS_FFN gemma's norm-add phases (mv_post_norm.h).
// Floats: bf16 x bf16 uses the native bf16 multiply-accumulate into f32
// accumulators, and so does bf16 W against f32 x with MV_X_BF16=1 (x rounded to bf16 once per
// call, as ggml's CPU backend rounds it); other float pairs are widened to f32. Integers:
// 32-bit sums.

#include "ggml_aie.h"
#if MV_GLU
#include "glu.h"
#endif
#if MV_FA
#include "fa_rows.h"
#endif

using namespace ggml_aie;

#if !defined(MV_OUT_F16)
#define MV_OUT_F16 0
#endif
// One activation row per call: several at once (MV_NX) are mvq.cc's, for block-quantized weights.
#if defined(MV_NX) && MV_NX != 1
#error "MV_NX is mvq.cc's"
#endif
#define MV_NX 1
#if MV_OUT_F16 && (MV_GLU || MV_ADD || MV_INT)
#error "an f16 output is MUL_MAT's and RMS_NORM_MUL_MAT's, over float operands"
#endif
static_assert(!MV_OUT_F16 || std::is_same_v<Y_T, uint16_t>, "f16 outputs are bit patterns");

#if !MV_INT
// Rows of the W tile start MV_KC elements apart: aligned vector loads when MV_KC is
// whole vectors, unaligned ones otherwise; the last MV_KC % VEC elements of a row are
// read zero-padded.
constexpr bool KC_ALIGNED = MV_KC % VEC == 0;
constexpr int KC_BODY = MV_KC - MV_KC % VEC;

template <typename T> static inline aie::vector<T, VEC> raw_load(const T *p) {
  if constexpr (KC_ALIGNED)
    return aie::load_v<VEC>(p);
  else
    return aie::load_unaligned_v<VEC>(p);
}

// A template, so that only the branch of the operand types is instantiated.
template <typename W, typename X> static inline float row_dot(const W *row, const X *x) {
  vf acc;
  if constexpr (std::is_same_v<W, bfloat16> && std::is_same_v<X, bfloat16>) {
    auto bacc = aie::zeros<accfloat, VEC>();
    for (int k = 0; k < KC_BODY; k += VEC)
      bacc = aie::mac(bacc, raw_load(row + k), raw_load(x + k));
    acc = bacc.template to_vector<float>();
  } else {
    acc = splat(0.0f);
    for (int k = 0; k < KC_BODY; k += VEC)
      acc = add(acc, mul(widen(raw_load(row + k)), widen(raw_load(x + k))));
  }
  if constexpr (KC_BODY < MV_KC) {
    constexpr int n = MV_KC - KC_BODY;
    acc = add(acc, mul(load_part_zero(row + KC_BODY, n), load_part_zero(x + KC_BODY, n)));
  }
  return aie::reduce_add(acc);
}

#endif

extern "C" {

#if !MV_OUT_F16
void ggml_mv_zero(Y_T *y) {
  for (int r = 0; r < MV_ROWS; ++r)
    y[r] = (Y_T)0;
}
#endif

#if MV_INT

void ggml_mv(W_T *w, X_T *x, Y_T *y) {
  set_ggml_rounding();
  for (int r = 0; r < MV_ROWS; ++r) {
    int32_t s = 0;
    const W_T *row = w + r * MV_KC;
    for (int k = 0; k < MV_KC; ++k)
      s += (int32_t)row[k] * (int32_t)x[k];
    y[r] = (Y_T)((uint32_t)y[r] + (uint32_t)s);
  }
}

#else

} // extern "C"

#if MV_X_BF16
// bf16 weights against f32 x: x's chunk rounded to bf16 once per call, for every row of the
// tile, as ggml's CPU backend rounds src1 for bf16 weights (its vec_dot_type is bf16, to nearest
// even); the rows then take the native bf16 multiply-accumulate. Widened to f32 instead, each
// product would be aie2's emulated f32 multiply (six bf16 products a lane).
static_assert(std::is_same_v<W_T, bfloat16> && std::is_same_v<X_T, float>, "bf16 W, f32 x");
alignas(64) static bfloat16 g_xb[(MV_KC + VEC - 1) / VEC * VEC];

static inline const bfloat16 *x_in_bf16(const float *x) {
  for (int k = 0; k < KC_BODY; k += VEC)
    aie::store_v(g_xb + k, narrow<bfloat16>(raw_load(x + k)));
  if constexpr (KC_BODY < MV_KC)
    aie::store_v(g_xb + KC_BODY, narrow<bfloat16>(load_part_zero(x + KC_BODY, MV_KC - KC_BODY)));
  return g_xb;
}
#endif

// y[r] += dot(W[r], x): results are gathered VEC rows at a time and added to y with vector
// adds (the scalar unit has no floating point).
static inline void accumulate(const W_T *w, const X_T *x_in, float *y) {
  set_ggml_rounding();
#if MV_X_BF16
  const bfloat16 *x = x_in_bf16(x_in);
#else
  const X_T *x = x_in;
#endif
  for (int r0 = 0; r0 < MV_ROWS; r0 += VEC) {
    int n = MV_ROWS - r0 < (int)VEC ? MV_ROWS - r0 : (int)VEC;
    vf sums = splat(0.0f);
    for (int i = 0; i < n; ++i)
      sums.set(row_dot(w + (r0 + i) * MV_KC, x), i);
    store_part(y + r0, add(load_part(y + r0, n), sums), n);
  }
}

extern "C" {

#define GGML_MV_W_T W_T
#define GGML_MV_X_T X_T

#if MV_OUT_F16
// MUL_MAT with an f16 output: see mv_stash.h.
#define GGML_MV_STASH_ZERO ggml_mv_stash_zero
#define GGML_MV_STASH ggml_mv_stash
#define GGML_MV_STORE_F16 ggml_mv_store_f16
#include "mv_stash.h"
#else
void ggml_mv(W_T *w, X_T *x, Y_T *y) { accumulate(w, x, y); }
#endif

#if MV_GLU
// MUL_MAT_<glu> (the GLU op's define, see glu.h): per round the gate rows' sums go to this
// core's stash (static: each core links its own copy), then y = act(stash) * y once the up
// rows' sums are in y. The plan counts the stash in the core's data memory.
#define GGML_MV_STASH_ZERO ggml_mv_gate_zero
#define GGML_MV_STASH ggml_mv_gate
#define GGML_MV_GLU ggml_mv_glu
#include "mv_glu.h"
#endif

#if MV_ADD
// MUL_MAT_ADD: see mv_add.h.
#define GGML_MV_ADD ggml_mv_add
#include "mv_add.h"
#endif

#if MV_FA
// FLASH_ATTN_FFN_<glu>'s attention phase on the GEMV's fifos: see mv_fa.h.
#define GGML_MV_FA_Q ggml_mv_fa_q
#define GGML_MV_FA_MASK ggml_mv_fa_mask
#define GGML_MV_FA_K ggml_mv_fa_k
#define GGML_MV_FA_V ggml_mv_fa_v
#define GGML_MV_FA_OUT ggml_mv_fa_out
#include "mv_fa.h"
#endif

#if MV_NORM
#if MV_BIAS
// RMS_NORM_MUL_MAT_BIAS(...): see mv_bias.h (its epilogue runs in mv_norm.h's and mv_rope.h's).
#define GGML_MV_BIAS_LOAD ggml_mv_bias_load
#include "mv_bias.h"
#endif
// RMS_NORM_MUL_MAT(_<glu>): see mv_norm.h.
#define GGML_MV_NORM_LOAD ggml_mv_norm_load
#define GGML_MV_NORM_ZERO ggml_mv_norm_zero
#define GGML_MV_NORM ggml_mv_norm
#define GGML_MV_NORM_SCALE ggml_mv_norm_scale
#if MV_OUT_F16
// The round's sums in the stash, scaled by s, then rounded to f16 once.
#define GGML_MV_NORM_STASH_ZERO ggml_mv_norm_stash_zero
#define GGML_MV_NORM_STASH ggml_mv_norm_stash
#define GGML_MV_NORM_STORE_F16 ggml_mv_norm_store_f16
#else
// MV_GLU: the gate rows' sums in the stash.
#define GGML_MV_NORM_STASH_ZERO ggml_mv_norm_gate_zero
#define GGML_MV_NORM_STASH ggml_mv_norm_gate
#endif
#ifndef GGML_MV_W_T
#define GGML_MV_W_T W_T
#endif
#include "mv_norm.h"
#if MV_ROPE
// RMS_NORM_MUL_MAT_ROPE(_FF): see mv_rope.h.
#define GGML_MV_ROPE_LOAD ggml_mv_rope_load
#define GGML_MV_NORM_ROPE_SCALE ggml_mv_norm_rope_scale
#define GGML_MV_NORM_ROPE_STORE_F16 ggml_mv_norm_rope_store_f16
#include "mv_rope.h"
#endif
#if MV_DECODE
// DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu>'s projection phase: see mv_decode.h.
#define GGML_MV_DL_ROPE_LOAD ggml_mv_dl_rope_load
#define GGML_MV_DL_BIAS_LOAD ggml_mv_dl_bias_load
#define GGML_MV_DL_SCALE_ROPE ggml_mv_dl_scale_rope
#define GGML_MV_DL_SCALE ggml_mv_dl_scale
#define GGML_MV_DL_STORE_F16 ggml_mv_dl_store_f16
#define GGML_MV_DL_KEEP ggml_mv_dl_keep
#define GGML_MV_DL_HEADS ggml_mv_dl_heads
#define GGML_MV_DL_EMIT ggml_mv_dl_emit
#include "mv_decode.h"
#endif
#if DL_POST_NORM
// DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu>'s norm-add phases: see mv_post_norm.h.
#define GGML_MV_PN_SQUARES ggml_mv_pn_squares
#define GGML_MV_PN_KEEP ggml_mv_pn_keep
#define GGML_MV_PN_OUT ggml_mv_pn_out
#include "mv_post_norm.h"
#endif
#endif

#endif

} // extern "C"
