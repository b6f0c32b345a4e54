// mv_add.h: the fused MUL_MAT_ADD epilogue of a GEMV core source (mv.cc, mvq.cc), included
// inside its extern "C" block. The including file names the function: GGML_MV_ADD.
//
// Per round, once the K chunks' sums are in y, the x fifo delivers one more object: the
// column's r values for the round's rows (core i of the column takes values offset ..
// offset + MV_ROWS, offset = i * MV_ROWS), then padding the core ignores:
//   GGML_MV_ADD(r, y, offset)   y[j] += r[offset + j]
// One f32 addition per value after the whole product, as ggml adds r to the MUL_MAT's f32
// result. The object's values start at any multiple of MV_ROWS: loaded through load_part's
// aligned staging (no scalar float arithmetic).

void GGML_MV_ADD(float *r, float *y, int32_t offset) {
  const float *rr = r + offset;
  for (int j = 0; j < MV_ROWS; j += VEC) {
    const int n = MV_ROWS - j < (int)VEC ? MV_ROWS - j : (int)VEC;
    store_part(y + j, add(load_part(y + j, n), load_part(rr + j, n)), n);
  }
}
