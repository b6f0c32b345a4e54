// mv_rope_rows.h: the rotation of a core's rows of a round (ggml's ROPE of the [head, H] view
// of a product), shared by the GEMV's RMS_NORM_MUL_MAT_ROPE(_FF) epilogue (mv_rope.h) and
// DECODE_LAYER's projection phase (mv_decode.h), so that both rotate with the very same code.
// Include after rope_math.h, inside the GEMV source's extern "C" block.
//
//   rope_rows_at(v, row0, p, head, rows)   v's `rows` values, global rows row0 .., rotated
//                                          in place by position p (heads of `head` rows)
//   rope_keep_words(c, first, n, hn, hn_dst, positions)  words first .. first + n - 1 of a
//                                          dispatch's rotation constants, from c, kept: the
//                                          FF_WORDS factors, `hn` head norm weights (into
//                                          hn_dst), then the tokens' positions

static void rope_rows_at(float *v, int32_t row0, int32_t p, int32_t head, int32_t rows) {
  if (!g_valid || p != g_pos)
    rope_fill_cache(p);
  // The heads the rows touch; a pair is rotated when both its rows are the core's (the plan
  // splits no pair between two cores or rounds).
  for (int32_t h = row0 / head; h * head < row0 + rows; ++h) {
    const int32_t base = h * head - row0; // the head's dimension 0 in v
    bool any = false;
    for (int i = 0; i < HALF; ++i) {
      const int32_t a = base + rope_ia(i), b = base + rope_ib(i);
      const bool mine = a >= 0 && b < rows;
      g_a[i] = mine ? v[a] : 0.0f;
      g_b[i] = mine ? v[b] : 0.0f;
      any = any || mine;
    }
    if (!any)
      continue; // only dimensions past N_DIMS of this head: unchanged
    for (int i = HALF; i < HALF_PAD; ++i)
      g_a[i] = g_b[i] = 0.0f;
    rope_rotate_ab();
    for (int i = 0; i < HALF; ++i) {
      const int32_t a = base + rope_ia(i), b = base + rope_ib(i);
      if (a >= 0 && b < rows) {
        v[a] = g_a[i];
        v[b] = g_b[i];
      }
    }
  }
}

static void rope_keep_words(const float *c, int32_t first, int32_t n, int32_t hn, float *hn_dst,
                            int32_t *positions) {
  for (int32_t j = 0; j < n; ++j) {
    int32_t w;
    __builtin_memcpy(&w, c + j, sizeof w); // the word's bits (positions are i32)
    const int32_t i = first + j;
    if (i < FF_WORDS)
      g_ff[i] = __builtin_bit_cast(float, w);
    else if (i < FF_WORDS + hn)
      hn_dst[i - FF_WORDS] = __builtin_bit_cast(float, w);
    else
      positions[i - FF_WORDS - hn] = w;
  }
}
