// mv_decode.h: DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu>'s projection phase in the GEMV core
// source of the layer's program (mv.cc, mvq.cc with MV_GLU, MV_NORM, MV_ADD and MV_FA: the
// attention's and the block's functions), included inside its extern "C" block after mv_norm.h
// (its norm chunks, norm_scale_runs; the GLU's stash g_stash). The including file names the
// functions: GGML_MV_DL_ROPE_LOAD, GGML_MV_DL_BIAS_LOAD, GGML_MV_DL_SCALE_ROPE, GGML_MV_DL_SCALE,
// GGML_MV_DL_STORE_F16, GGML_MV_DL_KEEP, GGML_MV_DL_HEADS, GGML_MV_DL_EMIT.
//
// The projections' sums are the lone RMS_NORM_MUL_MAT[_BIAS|_HEAD_NORM](_ROPE)'s: y (f32 rows:
// Q, f32 K or V) through mv_norm.h's zero and norm functions, the stash (f16 rows) through its
// gate ones (stash zero with a new round, normed sums); only the end of a round is this file's,
// with the attention norm's eps (DL_EPS; OP_P0 is the FFN norm's) and the round's global first
// row passed by the core (its Worker knows its rounds: one step, no counting). With MV_NX tokens
// y and the stash hold a run of MV_ROWS values per token, each scaled by its token's s and
// rotated by its token's position. The end of a round is the lone op's, in its order: the
// norm's scale, (DL_BIAS) the round's bias values added, (DL_HEAD_NORM) each head normalised,
// the rotation, (f16 rows) the one rounding.
//   GGML_MV_DL_ROPE_LOAD(c)            once per dispatch, per x object behind n_attn: (FF) the
//                                      N_DIMS/2 frequency factors, (DL_HEAD_NORM) the group's
//                                      head norm weights (D), then the tokens' positions
//   GGML_MV_DL_BIAS_LOAD(b, offset, words)  (DL_BIAS) once per dispatch, per x object behind
//                                      the rotation's constants: the column's bias values of
//                                      each of its group's rounds (DL_BIAS_COLUMN_ROWS a round,
//                                      `words` in all, then padding); the core keeps its
//                                      MV_ROWS of each round (`offset`: its first row within
//                                      the column's rows of a round)
//   GGML_MV_DL_SCALE_ROPE(y, row0, round)  y *= s, (bias) + the values of the group's round
//                                      `round`, then y's rows (row0 ..) rotated
//   GGML_MV_DL_SCALE(y, round)         y *= s, (bias) + the round's values
//   GGML_MV_DL_STORE_F16(y, half, row0, round)  stash *= s, (bias) + the round's values,
//                                      rotated when row0 >= 0, rounded to f16 into y: token t's
//                                      MV_ROWS values at f16 value (half * MV_NX + t) * MV_ROWS
//                                      (an object of MV_NX nr f32 holds two rounds' f16 rows)
// `round` is the round's index in its group (its bias values), or -1 without a bias.
// With DL_SPLIT a group's heads span DL_SPLIT rounds of a core (NeoX pairs or head norms of
// heads longer than a core's rows): its rounds' sums are kept, the heads finished whole, then
// handed out:
//   GGML_MV_DL_KEEP(slot, round)       the stash (the round's normed sums) *= s, (bias) + the
//                                      round's values, kept as slot `slot` of the heads
//   GGML_MV_DL_HEADS(row0)             the kept heads (global rows row0 ..) normalised
//                                      (DL_HEAD_NORM) and rotated
//   GGML_MV_DL_EMIT(y, slot, f16)      slot `slot` into y (f32), or slots `slot`, `slot` + 1
//                                      rounded to f16 (GGML_MV_DL_STORE_F16's layout)
// Defines: DL_EPS (f32 bits), DL_HEAD (D), DL_FF_WORDS, rope_math.h's; DL_ROPE_IN_FA_Q=1 keeps
// rope_math.h's arrays in the attention's q rows (mv_fa.h's g_fa_q, which must hold them);
// DL_HEAD_NORM=1 with HEAD_NORM_EPS (qwen3's Q and K norms); DL_BIAS=1 with DL_BIAS_ROUNDS (the
// longest group's rounds) and DL_BIAS_COLUMN_ROWS (R * MV_ROWS) (qwen2's Q, K and V biases);
// DL_SPLIT (rounds per head) where a group splits its heads.

#if !MV_GLU || !MV_NORM || MV_ROPE || MV_OUT_F16
#error "the projection phase is DECODE_LAYER's: in the block's GLU object"
#endif

#if DL_ROPE_IN_FA_Q
// The rotation's arrays in the attention's q rows: the projection phase ends before the
// attention loads them, and each dispatch reloads the factors and its positions' cos/sin.
#define ROPE_MATH_SHARED g_fa_q
#endif
#include "rope_math.h"
#include "mv_rope_rows.h"
#if DL_ROPE_IN_FA_Q
static_assert(FA_D == FA_DP && FA_R * FA_DP >= 6 * HALF_PAD,
              "the rotation's arrays within the q rows, which have no zero tail");
#endif

#ifndef DL_HEAD_NORM
#define DL_HEAD_NORM 0
#endif
#ifndef DL_BIAS
#define DL_BIAS 0
#endif
#ifndef DL_SPLIT
#define DL_SPLIT 0
#endif

#if DL_HEAD_NORM
#define HEAD_NORM_D DL_HEAD
#include "mv_head_norm.h"
#endif

static_assert(DL_FF_WORDS == FF_WORDS, "the factors' words");
constexpr int DL_HEAD_NORM_WORDS = DL_HEAD_NORM ? DL_HEAD : 0;
// The factors, the head norm's weights, then the tokens' positions.
constexpr int DL_WORDS = FF_WORDS + DL_HEAD_NORM_WORDS + MV_NX;
// x objects are MV_NX * MV_KC words (one K chunk of each token).
constexpr int DL_OBJECT_WORDS = MV_NX * MV_KC;
constexpr int DL_OBJECTS = (DL_WORDS + DL_OBJECT_WORDS - 1) / DL_OBJECT_WORDS;

static int32_t g_dl_positions[MV_NX];
static int32_t g_dl_loaded; // constants objects kept this dispatch (mod DL_OBJECTS)

void GGML_MV_DL_ROPE_LOAD(float *c) {
  const int32_t first = g_dl_loaded * DL_OBJECT_WORDS;
  if (g_dl_loaded == 0)
    g_valid = false; // a new dispatch: its positions
  const int32_t n = DL_WORDS - first < DL_OBJECT_WORDS ? DL_WORDS - first : DL_OBJECT_WORDS;
#if DL_HEAD_NORM
  rope_keep_words(c, first, n, DL_HEAD_NORM_WORDS, g_head_norm, g_dl_positions);
#else
  rope_keep_words(c, first, n, 0, nullptr, g_dl_positions);
#endif
  g_dl_loaded = (g_dl_loaded + 1) % DL_OBJECTS;
}

#if DL_BIAS
constexpr int DL_BIAS_KEPT = (DL_BIAS_ROUNDS * MV_ROWS + (int)VEC - 1) / (int)VEC * (int)VEC;
alignas(64) static float g_dl_bias[DL_BIAS_KEPT];
static int32_t g_dl_bias_seen; // words of the column's values delivered this dispatch

void GGML_MV_DL_BIAS_LOAD(float *b, int32_t offset, int32_t words) {
  for (int32_t j = 0; j < DL_OBJECT_WORDS && g_dl_bias_seen + j < words; ++j) {
    const int32_t w = g_dl_bias_seen + j;
    const int32_t r = w % DL_BIAS_COLUMN_ROWS - offset;
    if (r >= 0 && r < MV_ROWS)
      g_dl_bias[w / DL_BIAS_COLUMN_ROWS * MV_ROWS + r] = b[j];
  }
  g_dl_bias_seen += DL_OBJECT_WORDS;
  if (g_dl_bias_seen >= words)
    g_dl_bias_seen = 0; // the last object: the next dispatch starts again
}
#endif

// v[r] += round `round`'s value of row r (as mv_bias.h's bias_rows: one f32 addition per
// value) for each token's run; nothing without a bias (round < 0).
static inline void dl_bias_runs(float *v, int32_t round) {
#if DL_BIAS
  if (round < 0)
    return;
  const float *b = g_dl_bias + round * MV_ROWS;
  for (int t = 0; t < MV_NX; ++t) {
    float *run = v + t * MV_ROWS;
    for (int r = 0; r < MV_ROWS; r += VEC) {
      const int n = MV_ROWS - r < (int)VEC ? MV_ROWS - r : (int)VEC;
      store_part(run + r, add(load_part(run + r, n), load_part(b + r, n)), n);
    }
  }
#else
  (void)v;
  (void)round;
#endif
}

// Each token's run of `rows` values of v (whole heads with DL_HEAD_NORM), global rows row0 ..,
// normalised (DL_HEAD_NORM) and rotated by its position.
static inline void dl_rope_runs(float *v, int32_t row0, int rows = MV_ROWS) {
  set_ggml_rounding();
  for (int t = 0; t < MV_NX; ++t) {
#if DL_HEAD_NORM
    head_norm_rows(v + t * rows, rows);
#endif
    rope_rows_at(v + t * rows, row0, g_dl_positions[t], DL_HEAD, rows);
  }
}

void GGML_MV_DL_SCALE_ROPE(float *y, int32_t row0, int32_t round) {
  norm_scale_runs(y, (uint32_t)DL_EPS);
  dl_bias_runs(y, round);
  dl_rope_runs(y, row0);
}

void GGML_MV_DL_SCALE(float *y, int32_t round) {
  norm_scale_runs(y, (uint32_t)DL_EPS);
  dl_bias_runs(y, round);
}

// The f32 sums scaled and rotated first, so the one rounding to f16 is of the rotated value
// (as mv_rope.h's store).
void GGML_MV_DL_STORE_F16(float *y, int32_t half, int32_t row0, int32_t round) {
  norm_scale_runs(g_stash, (uint32_t)DL_EPS);
  dl_bias_runs(g_stash, round);
  if (row0 >= 0)
    dl_rope_runs(g_stash, row0);
  uint16_t *out = reinterpret_cast<uint16_t *>(y) + half * MV_NX * MV_ROWS;
  for (int r = 0; r < MV_NX * MV_ROWS; ++r)
    out[r] = f32_to_f16(g_stash[r]);
}

#if DL_SPLIT
// Heads split over rounds: a head of DL_HEAD rows is DL_SPLIT rounds of a core's MV_ROWS rows
// (the rotation's pairs or the head norm's sum span more rows than a core holds in a round).
// Each round's sums go to the stash, are scaled (and biased) there and kept in the head's
// slot; after the last, the heads are normalised and rotated whole, as the lone op does on a
// core holding the head in one round, then handed out a round (f32) or two (f16) per y object.
static_assert(DL_HEAD == DL_SPLIT * MV_ROWS, "a head is DL_SPLIT rounds of a core's rows");
alignas(64) static float g_dl_heads[MV_NX * DL_HEAD];

// The stash (a round's sums) scaled, biased and kept as slot `slot` of each token's head.
void GGML_MV_DL_KEEP(int32_t slot, int32_t round) {
  norm_scale_runs(g_stash, (uint32_t)DL_EPS);
  dl_bias_runs(g_stash, round);
  for (int t = 0; t < MV_NX; ++t)
    for (int r = 0; r < MV_ROWS; ++r)
      g_dl_heads[t * DL_HEAD + slot * MV_ROWS + r] = g_stash[t * MV_ROWS + r];
}

// Each token's head (global rows row0 ..) normalised and rotated.
void GGML_MV_DL_HEADS(int32_t row0) { dl_rope_runs(g_dl_heads, row0, DL_HEAD); }

// Slot `slot` of each token's head into y: f32, token t's MV_ROWS values at t * MV_ROWS; or
// (f16) slots `slot` and `slot` + 1 rounded to f16, GGML_MV_DL_STORE_F16's layout.
void GGML_MV_DL_EMIT(float *y, int32_t slot, int32_t f16) {
  if (!f16) {
    for (int t = 0; t < MV_NX; ++t)
      for (int r = 0; r < MV_ROWS; ++r)
        y[t * MV_ROWS + r] = g_dl_heads[t * DL_HEAD + slot * MV_ROWS + r];
    return;
  }
  uint16_t *out = reinterpret_cast<uint16_t *>(y);
  for (int half = 0; half < 2; ++half)
    for (int t = 0; t < MV_NX; ++t)
      for (int r = 0; r < MV_ROWS; ++r)
        out[(half * MV_NX + t) * MV_ROWS + r] =
            f32_to_f16(g_dl_heads[t * DL_HEAD + (slot + half) * MV_ROWS + r]);
}
#endif
