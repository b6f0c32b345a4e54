// mv_stash.h: a GEMV core's f32 stash of its MV_ROWS sums, for a GEMV core source (mv.cc,
// mvq.cc), included inside its extern "C" block after its `accumulate(w, x, y)` (y[r] +=
// dot(W[r], x) for the MV_ROWS rows of a W tile). The including file names the functions and
// the W and x types: GGML_MV_STASH_ZERO, GGML_MV_STASH, GGML_MV_W_T, GGML_MV_X_T, and
// optionally GGML_MV_STORE_F16.
//
//   GGML_MV_STASH_ZERO()       stash = 0
//   GGML_MV_STASH(w, x)        stash[r] += dot(W[r], x) (one K chunk)
//   GGML_MV_STORE_F16(y)       y[r] = f16(stash[r]), rounded to nearest even (ggml_aie.h)
// Users: MUL_MAT_<glu> keeps the gate sums here (mv_glu.h); MUL_MAT with an f16 output (the
// backend's V projection written into the f16 KV cache) sums every K chunk here in f32 and
// rounds once per output value, when the round's sums are complete: summing into the f16
// output tile would round after every chunk. RMS_NORM_MUL_MAT with an f16 output does the same
// with the normed chunks, scaling the stash by the norm's s before the store (mv_norm.h).
// The stash is static: on the NPU each core links its own copy of the object (the emulation
// loads one copy of the library per core); the plan counts its bytes in the core's memory.
// With MV_NX activation rows per call (mvq.cc) it holds MV_NX runs of MV_ROWS sums, as y does.

alignas(64) static float g_stash[MV_NX * MV_ROWS];

void GGML_MV_STASH_ZERO() {
  for (int r = 0; r < MV_NX * MV_ROWS; ++r)
    g_stash[r] = 0.0f;
}

void GGML_MV_STASH(GGML_MV_W_T *w, GGML_MV_X_T *x) { accumulate(w, x, g_stash); }

#if defined(GGML_MV_STORE_F16)
// Integer operations on the bit patterns only (the scalar unit has no floating point).
void GGML_MV_STORE_F16(uint16_t *y) {
  for (int r = 0; r < MV_NX * MV_ROWS; ++r)
    y[r] = f32_to_f16(g_stash[r]);
}
#endif
