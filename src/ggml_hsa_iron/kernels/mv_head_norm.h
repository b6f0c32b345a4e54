// mv_head_norm.h: qwen3's per-head Q and K norms in a GEMV core source's rotation epilogue
// (mv_rope.h, and DECODE_LAYER_HEAD_NORM_<glu>'s mv_decode.h), included by it. Each head of a
// run of whole heads is RMS-normalised and multiplied by the head norm's weights, as ggml's
// RMS_NORM over the head's values then MUL by a row of them compute it. The includer fills
// g_head_norm from its per-dispatch constants.
// Defines: HEAD_NORM_D (a head's rows, D), HEAD_NORM_EPS (f32 bits).

alignas(64) static float g_head_norm[(HEAD_NORM_D + VEC - 1) / VEC * VEC];

// Each head of v's `rows` rows (whole heads): v *= 1 / sqrt(mean(v^2) + eps), then v *= the
// weights (the two roundings of ggml's RMS_NORM and MUL).
static void head_norm_rows(float *v, int rows) {
  const float eps = __builtin_bit_cast(float, (uint32_t)HEAD_NORM_EPS);
  for (int h = 0; h < rows; h += HEAD_NORM_D) {
    float *r = v + h;
    vf ss = splat(0.0f);
    for (int i = 0; i < HEAD_NORM_D; i += VEC) {
      const int n = HEAD_NORM_D - i < (int)VEC ? HEAD_NORM_D - i : (int)VEC;
      const vf a = load_part_zero(r + i, n);
      ss = add(ss, mul(a, a));
    }
    const vf mean = mul(splat(aie::reduce_add(ss)), 1.0f / HEAD_NORM_D);
    const vf s = recip(sqrt(add(mean, splat(eps))));
    for (int i = 0; i < HEAD_NORM_D; i += VEC) {
      const int n = HEAD_NORM_D - i < (int)VEC ? HEAD_NORM_D - i : (int)VEC;
      store_part(r + i, mul(mul(load_part(r + i, n), s), load_part(g_head_norm + i, n)), n);
    }
  }
}
