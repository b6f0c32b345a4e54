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
// With MV_NX activation rows per call (mvq.cc) the object holds MV_NX runs of the column's
// MV_ADD_ROWS values (R cores' MV_ROWS each), one per activation row, and y their MV_NX runs of
// MV_ROWS sums: y[x * MV_ROWS + j] += r[x * MV_ADD_ROWS + offset + j].

#if MV_NX > 1 && !defined(MV_ADD_ROWS)
#error "MV_NX > 1 with MV_ADD needs MV_ADD_ROWS, the values of one row in the r object"
#endif
#if !defined(MV_ADD_ROWS)
#define MV_ADD_ROWS 0
#endif

void GGML_MV_ADD(float *r, float *y, int32_t offset) {
  for (int x = 0; x < MV_NX; ++x) {
    const float *rr = r + x * MV_ADD_ROWS + offset;
    float *yx = y + x * MV_ROWS;
    for (int j = 0; j < MV_ROWS; j += VEC) {
      const int n = MV_ROWS - j < (int)VEC ? MV_ROWS - j : (int)VEC;
      store_part(yx + j, add(load_part(yx + j, n), load_part(rr + j, n)), n);
    }
  }
}
