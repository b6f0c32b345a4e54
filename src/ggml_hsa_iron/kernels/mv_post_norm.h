// mv_post_norm.h: DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu>'s norm-add phases in the GEMV core
// source (mv.cc, mvq.cc), included inside its extern "C" block after mv_norm.h (NORM_STEPS,
// NORM_BODY) and mv_decode.h. gemma's norms after the attention's projection and after the
// block: r' = rms_norm(p) * n + r, p being a whole projection (K values, MV_NORM_K), which the
// phase before wrote to memory; each core computes its MV_ROWS rows of a round.
// Defines: DL_POST_NORM=1, DL_POST_EPS_ATTN and DL_POST_EPS_FFN (f32 bits); with MV_NX tokens
// MV_ADD_ROWS (mv_add.h's: a token's run in a round's object). The including file names the
// functions:
//   GGML_MV_PN_SQUARES(x)            p's next K chunk of each token (MV_NX chunks of MV_KC): its
//                                    squares summed (the phase's first NORM_STEPS objects; the
//                                    sums restart with each phase)
//   GGML_MV_PN_KEEP(x, which, off)   the round's object of p's (which 0) or n's (1) column
//                                    values, a run per token: the core's MV_ROWS from `off` kept
//   GGML_MV_PN_OUT(r, y, off, norm)  per token t: y[t][j] = p[t][j] * s[t] * n[t][j] +
//                                    r[t][off + j], s = 1 / sqrt(sum / K + eps) with the eps of
//                                    `norm` (0 attention, 1 block)
// The arithmetic is RMS_NORM_MUL_ADD's row kernel (rows.cc): squares summed in VEC lanes in
// order (the same lanes where MV_KC is whole vectors), each result rounded to f32. The sums go
// to mv_norm.h's per-row sums and s is its norm_s_of: a norm-add phase runs between the rounds
// of the layer's norms (each of which starts its sums anew), so the two never hold sums at once.

#if MV_NX > 1 && !defined(MV_ADD_ROWS)
#error "the post norms over several tokens need MV_ADD_ROWS, a token's values in a round's object"
#endif
#if !defined(MV_ADD_ROWS)
#define MV_ADD_ROWS 0
#endif

constexpr int PN_ROWS_PAD = (MV_ROWS + (int)VEC - 1) / (int)VEC * (int)VEC;
alignas(64) static float g_pn_rows[2][MV_NX][PN_ROWS_PAD]; // p's rows, n's rows
static int32_t g_pn_chunk;                                 // p's chunks summed this phase

void GGML_MV_PN_SQUARES(float *x_rows) {
  set_ggml_rounding();
  for (int t = 0; t < MV_NX; ++t) {
    const float *x = x_rows + t * MV_KC;
    float *sums = g_norm_ss + t * VEC;
    vf ss = g_pn_chunk == 0 ? splat(0.0f) : load_aligned(sums);
    for (int i = 0; i < NORM_BODY; i += VEC) {
      vf v = load_aligned(x + i);
      ss = add(ss, mul(v, v));
    }
    if constexpr (NORM_BODY < MV_KC) {
      vf v = load_part_zero(x + NORM_BODY, MV_KC - NORM_BODY);
      ss = add(ss, mul(v, v));
    }
    store_aligned(sums, ss);
  }
  g_pn_chunk = (g_pn_chunk + 1) % NORM_STEPS;
}

void GGML_MV_PN_KEEP(float *x, int32_t which, int32_t offset) {
  for (int t = 0; t < MV_NX; ++t) {
    const float *src = x + t * MV_ADD_ROWS + offset;
    float *d = g_pn_rows[which][t];
    for (int j = 0; j < MV_ROWS; j += VEC) {
      const int n = MV_ROWS - j < (int)VEC ? MV_ROWS - j : (int)VEC;
      store_part(d + j, load_part(src + j, n), n);
    }
  }
}

void GGML_MV_PN_OUT(float *r, float *y, int32_t offset, int32_t norm) {
  const uint32_t eps_bits = norm ? (uint32_t)DL_POST_EPS_FFN : (uint32_t)DL_POST_EPS_ATTN;
  for (int t = 0; t < MV_NX; ++t) {
    const vf s = norm_s_of(eps_bits, t);
    const float *p = g_pn_rows[0][t], *w = g_pn_rows[1][t];
    const float *rt = r + t * MV_ADD_ROWS + offset;
    float *yt = y + t * MV_ROWS;
    for (int j = 0; j < MV_ROWS; j += VEC) {
      const int n = MV_ROWS - j < (int)VEC ? MV_ROWS - j : (int)VEC;
      vf v = mul(mul(load_part(p + j, n), s), load_part(w + j, n));
      store_part(yt + j, add(v, load_part(rt + j, n)), n);
    }
  }
}
