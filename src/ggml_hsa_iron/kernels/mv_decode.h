// mv_decode.h: DECODE_LAYER(_FF)_<glu>'s projection phase in the GEMV core source of the
// layer's program (mv.cc, mvq.cc with MV_GLU, MV_NORM, MV_ADD and MV_FA: the attention's and
// the block's functions), included inside its extern "C" block after mv_norm.h (its norm
// chunks, norm_scale_runs; the GLU's stash g_stash). The including file names the
// functions: GGML_MV_DL_ROPE_LOAD, GGML_MV_DL_SCALE_ROPE, GGML_MV_DL_SCALE, GGML_MV_DL_STORE_F16.
//
// The projections' sums are the lone RMS_NORM_MUL_MAT(_ROPE)'s: y (f32 rows: Q, f32 K or V)
// through mv_norm.h's zero and norm functions, the stash (f16 rows) through its gate ones
// (stash zero with a new round, normed sums); only the end of a round is this file's, with the
// attention norm's eps (DL_EPS; OP_P0 is the FFN norm's) and the round's global first row
// passed by the core (its Worker knows its rounds: one step, no counting). With MV_NX tokens y
// and the stash hold a run of MV_ROWS values per token, each scaled by its token's s and
// rotated by its token's position.
//   GGML_MV_DL_ROPE_LOAD(c)            once per dispatch, per x object behind n_attn: (FF) the
//                                      N_DIMS/2 frequency factors, then the tokens' positions
//   GGML_MV_DL_SCALE_ROPE(y, row0)     y *= s, then y's rows (row0 ..) rotated
//   GGML_MV_DL_SCALE(y)                y *= s
//   GGML_MV_DL_STORE_F16(y, half, row0)  stash *= s, rotated when row0 >= 0, rounded to f16
//                                      into y: token t's MV_ROWS values at f16 value
//                                      (half * MV_NX + t) * MV_ROWS (an object of MV_NX nr
//                                      f32 holds two rounds' f16 rows)
// Defines: DL_EPS (f32 bits), DL_HEAD (D), DL_FF_WORDS, rope_math.h's; DL_ROPE_IN_FA_Q=1 keeps
// rope_math.h's arrays in the attention's q rows (mv_fa.h's g_fa_q, which must hold them).

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

static_assert(DL_FF_WORDS == FF_WORDS, "the factors' words");
constexpr int DL_WORDS = FF_WORDS + MV_NX; // the factors, then the tokens' positions
// x objects are MV_NX * MV_KC words (one K chunk of each token).
constexpr int DL_OBJECT_WORDS = MV_NX * MV_KC;
constexpr int DL_OBJECTS = (DL_WORDS + DL_OBJECT_WORDS - 1) / DL_OBJECT_WORDS;

static int32_t g_dl_positions[MV_NX];
static int32_t g_dl_loaded; // constants objects kept this dispatch (mod DL_OBJECTS)

void GGML_MV_DL_ROPE_LOAD(float *c) {
  const int32_t first = g_dl_loaded * DL_OBJECT_WORDS;
  if (g_dl_loaded == 0)
    g_valid = false; // a new dispatch: its positions
  for (int32_t j = 0; j < DL_OBJECT_WORDS && first + j < DL_WORDS; ++j) {
    int32_t w;
    __builtin_memcpy(&w, c + j, sizeof w); // the word's bits (positions are i32)
    if (first + j < FF_WORDS)
      g_ff[first + j] = __builtin_bit_cast(float, w);
    else
      g_dl_positions[first + j - FF_WORDS] = w;
  }
  g_dl_loaded = (g_dl_loaded + 1) % DL_OBJECTS;
}

// Each token's run of v, global rows row0 .., rotated by its position.
static inline void dl_rope_runs(float *v, int32_t row0) {
  set_ggml_rounding();
  for (int t = 0; t < MV_NX; ++t)
    rope_rows_at(v + t * MV_ROWS, row0, g_dl_positions[t], DL_HEAD, MV_ROWS);
}

void GGML_MV_DL_SCALE_ROPE(float *y, int32_t row0) {
  norm_scale_runs(y, (uint32_t)DL_EPS);
  dl_rope_runs(y, row0);
}

void GGML_MV_DL_SCALE(float *y) { norm_scale_runs(y, (uint32_t)DL_EPS); }

// The f32 sums scaled and rotated first, so the one rounding to f16 is of the rotated value
// (as mv_rope.h's store).
void GGML_MV_DL_STORE_F16(float *y, int32_t half, int32_t row0) {
  norm_scale_runs(g_stash, (uint32_t)DL_EPS);
  if (row0 >= 0)
    dl_rope_runs(g_stash, row0);
  uint16_t *out = reinterpret_cast<uint16_t *>(y) + half * MV_NX * MV_ROWS;
  for (int r = 0; r < MV_NX * MV_ROWS; ++r)
    out[r] = f32_to_f16(g_stash[r]);
}
