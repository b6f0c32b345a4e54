// mv_glu.h: the fused MUL_MAT_<glu> functions of a GEMV core source (mv.cc, mvq.cc), included
// inside its extern "C" block after its `accumulate(w, x, y)` (y[r] += dot(W[r], x) for the
// MV_ROWS rows of a W tile) and glu.h. The including file names the functions and the W and x types:
// GGML_MV_GATE_ZERO, GGML_MV_GATE, GGML_MV_GLU, GGML_MV_W_T, GGML_MV_X_T.
//
// Per round the core computes the gate rows' sums into its stash, the up rows' sums into y,
// then y = act(stash) * y (glu.h: the build's GLU op, ggml_aie.h's activations in f32):
//   GGML_MV_GATE_ZERO()    stash = 0
//   GGML_MV_GATE(w, x)     stash[r] += dot(W_gate[r], x) (one K chunk)
//   GGML_MV_GLU(y)         y[r] = act(stash[r]) * y[r]
// The stash is static: on the NPU each core links its own copy of the object (the emulation
// loads one copy of the library per core); the plan counts its bytes in the core's memory.

alignas(64) static float g_stash[MV_ROWS];

void GGML_MV_GATE_ZERO() {
  for (int r = 0; r < MV_ROWS; ++r)
    g_stash[r] = 0.0f;
}

void GGML_MV_GATE(GGML_MV_W_T *w, GGML_MV_X_T *x) { accumulate(w, x, g_stash); }

void GGML_MV_GLU(float *y) {
  set_ggml_rounding();
  int r = 0;
  for (; r + (int)VEC <= MV_ROWS; r += VEC)
    store_aligned(y + r, glu_op(load_aligned(g_stash + r), load_aligned(y + r)));
  if (r < MV_ROWS) {
    const int n = MV_ROWS - r;
    store_part(y + r, glu_op(load_part(g_stash + r, n), load_part(y + r, n)), n);
  }
}
