// mv_post_norm.h: DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu>'s norm-add phases in the GEMV core
// source (mv.cc, mvq.cc), included inside its extern "C" block after mv_norm.h (NORM_STEPS,
// NORM_BODY) and mv_decode.h. gemma's norms after the attention's projection and after the
// block: r' = rms_norm(p) * n + r, p being a whole projection (K values, MV_NORM_K), which the
// phase before wrote to memory; each core computes its MV_ROWS rows of a round.
// Defines: DL_POST_NORM=1, DL_POST_EPS_ATTN and DL_POST_EPS_FFN (f32 bits). One activation row
// (MV_NX 1). The including file names the functions:
//   GGML_MV_PN_SQUARES(x)            p's next K chunk: its squares summed (the phase's first
//                                    NORM_STEPS objects; the sum restarts with each phase)
//   GGML_MV_PN_KEEP(x, which, off)   the round's object of p's (which 0) or n's (1) column
//                                    values: the core's MV_ROWS from `off` kept
//   GGML_MV_PN_OUT(r, y, off, norm)  y[j] = p[j] * s * n[j] + r[off + j], s = 1 / sqrt(sum / K
//                                    + eps) with the eps of `norm` (0 attention, 1 block)
// The arithmetic is RMS_NORM_MUL_ADD's row kernel (rows.cc): squares summed in VEC lanes in
// order (the same lanes where MV_KC is whole vectors), each result rounded to f32.

#if MV_NX != 1
#error "the post norms take one activation row"
#endif

constexpr int PN_ROWS_PAD = (MV_ROWS + (int)VEC - 1) / (int)VEC * (int)VEC;
alignas(64) static float g_pn_ss[VEC];
alignas(64) static float g_pn_rows[2][PN_ROWS_PAD]; // p's rows, n's rows
static int32_t g_pn_chunk;                          // p's chunks summed this phase

void GGML_MV_PN_SQUARES(float *x) {
  set_ggml_rounding();
  vf ss = g_pn_chunk == 0 ? splat(0.0f) : load_aligned(g_pn_ss);
  for (int i = 0; i < NORM_BODY; i += VEC) {
    vf v = load_aligned(x + i);
    ss = add(ss, mul(v, v));
  }
  if constexpr (NORM_BODY < MV_KC) {
    vf v = load_part_zero(x + NORM_BODY, MV_KC - NORM_BODY);
    ss = add(ss, mul(v, v));
  }
  store_aligned(g_pn_ss, ss);
  g_pn_chunk = (g_pn_chunk + 1) % NORM_STEPS;
}

void GGML_MV_PN_KEEP(float *x, int32_t which, int32_t offset) {
  float *d = g_pn_rows[which];
  for (int j = 0; j < MV_ROWS; j += VEC) {
    const int n = MV_ROWS - j < (int)VEC ? MV_ROWS - j : (int)VEC;
    store_part(d + j, load_part(x + offset + j, n), n);
  }
}

void GGML_MV_PN_OUT(float *r, float *y, int32_t offset, int32_t norm) {
  set_ggml_rounding();
  const uint32_t eps_bits = norm ? (uint32_t)DL_POST_EPS_FFN : (uint32_t)DL_POST_EPS_ATTN;
  const vf mean = mul(splat(aie::reduce_add(load_aligned(g_pn_ss))), 1.0f / MV_NORM_K);
  const vf s = recip(sqrt(add(mean, splat(__builtin_bit_cast(float, eps_bits)))));
  for (int j = 0; j < MV_ROWS; j += VEC) {
    const int n = MV_ROWS - j < (int)VEC ? MV_ROWS - j : (int)VEC;
    vf v = mul(mul(load_part(g_pn_rows[0] + j, n), s), load_part(g_pn_rows[1] + j, n));
    store_part(y + j, add(v, load_part(r + offset + j, n)), n);
  }
}
