// mv_glu.h: the fused MUL_MAT_<glu> functions of a GEMV core source (mv.cc, mvq.cc), included
// inside its extern "C" block after its `accumulate(w, x, y)` (y[r] += dot(W[r], x) for the
// MV_ROWS rows of a W tile) and glu.h. The including file names the functions and the W and x
// types: GGML_MV_STASH_ZERO and GGML_MV_STASH (the gate's, mv_stash.h), GGML_MV_GLU,
// GGML_MV_W_T, GGML_MV_X_T.
//
// Per round the core computes the gate rows' sums into its stash (mv_stash.h), the up rows'
// sums into y, then y = act(stash) * y (glu.h: the build's GLU op, ggml_aie.h's activations
// in f32):
//   GGML_MV_STASH_ZERO()   stash = 0
//   GGML_MV_STASH(w, x)    stash[r] += dot(W_gate[r], x) (one K chunk)
//   GGML_MV_GLU(y)         y[r] = act(stash[r]) * y[r]

#include "mv_stash.h"

void GGML_MV_GLU(float *y) {
  set_ggml_rounding();
  // y and the stash hold MV_NX runs of MV_ROWS values, laid out alike: one walk over all.
  constexpr int total = MV_NX * MV_ROWS;
  int r = 0;
  for (; r + (int)VEC <= total; r += VEC)
    store_aligned(y + r, glu_op(load_aligned(g_stash + r), load_aligned(y + r)));
  if (r < total) {
    const int n = total - r;
    store_part(y + r, glu_op(load_part(g_stash + r, n), load_part(y + r, n)), n);
  }
}
