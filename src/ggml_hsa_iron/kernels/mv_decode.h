// mv_decode.h: DECODE_LAYER(_FF)_<glu>'s projection phase in the GEMV core source of the
// layer's program (mv.cc, mvq.cc with MV_GLU, MV_NORM, MV_ADD and MV_FA: the attention's and
// the block's functions), included inside its extern "C" block after mv_norm.h (its norm
// chunks, norm_s_of, norm_scale_rows; the GLU's stash g_stash). The including file names the
// functions: GGML_MV_DL_ROPE_LOAD, GGML_MV_DL_SCALE_ROPE, GGML_MV_DL_SCALE, GGML_MV_DL_STORE_F16.
//
// The projections' sums are the lone RMS_NORM_MUL_MAT(_ROPE)'s: y (f32 rows: Q, f32 K or V)
// through mv_norm.h's zero and norm functions, the stash (f16 rows) through its gate ones
// (stash zero with a new round, normed sums); only the end of a round is this file's, with the
// attention norm's eps (DL_EPS; OP_P0 is the FFN norm's) and the round's global first row
// passed by the core (its Worker knows its rounds: one token, no counting).
//   GGML_MV_DL_ROPE_LOAD(c)            once per dispatch, per x object behind n_attn: (FF) the
//                                      N_DIMS/2 frequency factors, then the token's position
//   GGML_MV_DL_SCALE_ROPE(y, row0)     y *= s, then y's rows (row0 ..) rotated
//   GGML_MV_DL_SCALE(y)                y *= s
//   GGML_MV_DL_STORE_F16(y, half, row0)  stash *= s, rotated when row0 >= 0, rounded to f16
//                                      into f16 values half * MV_ROWS .. of y (an nr-f32
//                                      object holds two rounds' f16 rows)
// Defines: DL_EPS (f32 bits), DL_HEAD (D), DL_FF_WORDS, rope_math.h's.

#if !MV_GLU || !MV_NORM || MV_ROPE || MV_OUT_F16
#error "the projection phase is DECODE_LAYER's: in the block's GLU object"
#endif

#include "rope_math.h"
#include "mv_rope_rows.h"

static_assert(DL_FF_WORDS == FF_WORDS, "the factors' words");
constexpr int DL_WORDS = FF_WORDS + 1; // the factors, then the token's position
constexpr int DL_OBJECTS = (DL_WORDS + MV_KC - 1) / MV_KC;

static int32_t g_dl_position;
static int32_t g_dl_loaded; // constants objects kept this dispatch (mod DL_OBJECTS)

void GGML_MV_DL_ROPE_LOAD(float *c) {
  const int32_t first = g_dl_loaded * MV_KC;
  if (g_dl_loaded == 0)
    g_valid = false; // a new dispatch: its position
  for (int32_t j = 0; j < MV_KC && first + j < DL_WORDS; ++j) {
    int32_t w;
    __builtin_memcpy(&w, c + j, sizeof w); // the word's bits (the position is i32)
    if (first + j < FF_WORDS)
      g_ff[first + j] = __builtin_bit_cast(float, w);
    else
      g_dl_position = w;
  }
  g_dl_loaded = (g_dl_loaded + 1) % DL_OBJECTS;
}

void GGML_MV_DL_SCALE_ROPE(float *y, int32_t row0) {
  norm_scale_rows(y, norm_s_of((uint32_t)DL_EPS));
  set_ggml_rounding();
  rope_rows_at(y, row0, g_dl_position, DL_HEAD, MV_ROWS);
}

void GGML_MV_DL_SCALE(float *y) { norm_scale_rows(y, norm_s_of((uint32_t)DL_EPS)); }

// The f32 sums scaled and rotated first, so the one rounding to f16 is of the rotated value
// (as mv_rope.h's store).
void GGML_MV_DL_STORE_F16(float *y, int32_t half, int32_t row0) {
  norm_scale_rows(g_stash, norm_s_of((uint32_t)DL_EPS));
  if (row0 >= 0) {
    set_ggml_rounding();
    rope_rows_at(g_stash, row0, g_dl_position, DL_HEAD, MV_ROWS);
  }
  uint16_t *out = reinterpret_cast<uint16_t *>(y) + half * MV_ROWS;
  for (int r = 0; r < MV_ROWS; ++r)
    out[r] = f32_to_f16(g_stash[r]);
}
