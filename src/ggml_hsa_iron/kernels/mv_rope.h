// mv_rope.h: the fused RMS_NORM_MUL_MAT_ROPE(_FF) epilogue of a GEMV core source (mv.cc,
// mvq.cc), included inside its extern "C" block after mv_norm.h (its norm_s and
// norm_scale_rows; with MV_OUT_F16 after mv_stash.h too). y is f32, or f16 with MV_OUT_F16.
// The including file names the functions: GGML_MV_ROPE_LOAD, and GGML_MV_NORM_ROPE_SCALE (f32
// y) or GGML_MV_NORM_ROPE_STORE_F16 (MV_OUT_F16).
//
// The product's rows are the rows of a [D, H] view per x row (token): row r is dimension
// r % D of head r / D, and ggml's ROPE rotates each head's first N_DIMS dimensions in pairs by
// the token's position (rope_math.h; dimensions past N_DIMS pass through). The rotation is
// applied at the end of each round, after the norm's scale s, to the round's MV_ROWS rows in
// the core (y, or the stash before its one rounding to f16), so the product never leaves the
// core unrotated. The plan makes every core's rows of a round hold whole pairs (NeoX: a head's
// whole N_DIMS span).
//   GGML_MV_ROPE_LOAD(c)                 once per dispatch, per x object behind n's chunks:
//                                        (FF) the N_DIMS/2 frequency factors, (HEAD_NORM)
//                                        the head norm's D weights, then the tokens'
//                                        positions (i32 bits), then padding; kept
//   GGML_MV_NORM_ROPE_SCALE(y, offset)   y *= s, then the round's rows rotated
//   GGML_MV_NORM_ROPE_STORE_F16(y, offset)  stash *= s, rotated, y[r] = f16(stash[r])
// `offset` is the core's first row within a round (its column's and its own share of the
// round's block: (column * rows + row) * MV_ROWS). The core counts its rounds: round j of the
// dispatch is pass j / ROPE_ROUNDS's round j % ROPE_ROUNDS, starting at row
// (j % ROPE_ROUNDS) * MV_ROPE_BLOCK, the last one shifted back to end at MV_ROPE_N when N is
// off the block (GemvPlan's rounds); a pass is one token, or with MV_NX the MV_NX tokens whose
// runs of MV_ROWS values y holds, each rotated by its own position.
// With MV_ROPE_HEAD_NORM (qwen3's Q and K norms) each head of the round's rows is first
// RMS-normalised and multiplied by the head norm's weights (mv_head_norm.h; eps HEAD_NORM_EPS).
// Defines: MV_ROPE_HEAD (D), MV_ROPE_N (the product's rows, D * H), MV_ROPE_BLOCK (the rows of
// a round over the array), MV_ROPE_TOKENS (x rows per dispatch), and rope_math.h's.
// Static data (per core): rope_math.h's arrays and the positions; the plan counts
// mv_rope_bytes() in the core's memory.

#if MV_GLU || !MV_NORM
#error "the rotation epilogue is RMS_NORM_MUL_MAT's (no GLU)"
#endif

#include "rope_math.h"
#include "mv_rope_rows.h"

#ifndef MV_ROPE_HEAD_NORM
#define MV_ROPE_HEAD_NORM 0
#endif

constexpr int ROPE_ROUNDS = (MV_ROPE_N + MV_ROPE_BLOCK - 1) / MV_ROPE_BLOCK;
constexpr int HEAD_NORM_WORDS = MV_ROPE_HEAD_NORM ? MV_ROPE_HEAD : 0;
constexpr int ROPE_WORDS = FF_WORDS + HEAD_NORM_WORDS + MV_ROPE_TOKENS;
// x objects are MV_NX * MV_KC words (one K chunk of each x row).
constexpr int ROPE_OBJECT_WORDS = MV_NX * MV_KC;
constexpr int ROPE_OBJECTS = (ROPE_WORDS + ROPE_OBJECT_WORDS - 1) / ROPE_OBJECT_WORDS;
static_assert(MV_ROPE_BLOCK <= MV_ROPE_N, "a round within the rows");
static_assert(N_DIMS <= MV_ROPE_HEAD, "the rotated dimensions within a head");

static int32_t g_rope_positions[MV_ROPE_TOKENS];
static int32_t g_rope_loaded; // constants objects kept this dispatch (mod ROPE_OBJECTS)
static int32_t g_rope_round;  // rounds rotated this dispatch

#if MV_ROPE_HEAD_NORM
static_assert(MV_ROWS % MV_ROPE_HEAD == 0, "a core's rows whole heads");
#define HEAD_NORM_D MV_ROPE_HEAD
#include "mv_head_norm.h"
#endif

// The round's MV_ROWS rows (global rows row0 ..) of the product of each token of the pass, in
// place (v holds MV_NX runs of them).
static void rope_rows(float *v, int32_t offset) {
  const int32_t j = g_rope_round++;
  const int32_t pass = j / ROPE_ROUNDS, k = j % ROPE_ROUNDS;
  const int32_t start =
      (k + 1) * MV_ROPE_BLOCK <= MV_ROPE_N ? k * MV_ROPE_BLOCK : MV_ROPE_N - MV_ROPE_BLOCK;
  const int32_t row0 = start + offset;
  for (int t = 0; t < MV_NX; ++t) {
    float *run = v + t * MV_ROWS;
#if MV_ROPE_HEAD_NORM
    head_norm_rows(run, MV_ROWS);
#endif
    rope_rows_at(run, row0, g_rope_positions[pass * MV_NX + t], MV_ROPE_HEAD, MV_ROWS);
  }
}

void GGML_MV_ROPE_LOAD(float *c) {
  const int32_t first = g_rope_loaded * ROPE_OBJECT_WORDS;
  if (g_rope_loaded == 0) {
    // A new dispatch: its positions, its rounds.
    g_valid = false;
    g_rope_round = 0;
  }
  const int32_t left = ROPE_WORDS - first;
  const int32_t n = left < ROPE_OBJECT_WORDS ? left : ROPE_OBJECT_WORDS;
#if MV_ROPE_HEAD_NORM
  rope_keep_words(c, first, n, HEAD_NORM_WORDS, g_head_norm, g_rope_positions);
#else
  rope_keep_words(c, first, n, 0, nullptr, g_rope_positions);
#endif
  g_rope_loaded = (g_rope_loaded + 1) % ROPE_OBJECTS;
}

#if !MV_OUT_F16
void GGML_MV_NORM_ROPE_SCALE(float *y, int32_t offset) {
  norm_scale_runs(y);
#if MV_BIAS
  bias_rows(y);
#endif
  set_ggml_rounding();
  rope_rows(y, offset);
}
#else
// The f32 sums are scaled and rotated first, so the one rounding to f16 is of the rotated
// value.
void GGML_MV_NORM_ROPE_STORE_F16(uint16_t *y, int32_t offset) {
  norm_scale_runs(g_stash);
#if MV_BIAS
  bias_rows(g_stash);
#endif
  set_ggml_rounding();
  rope_rows(g_stash, offset);
  GGML_MV_STORE_F16(y);
}
#endif
