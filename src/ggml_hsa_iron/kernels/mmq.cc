// mmq.cc: GEMM core functions of ggml_hsa_iron's MUL_MAT design for weights moved as the
// bytes ggml stores them: f16 and the block-quantized types (f32 activations and results).
//
// C[m x n] += A[m x k] . B[k x n] for one core tile, with the bf16 aie::mmul microkernel of
// shape MM_R x MM_S x MM_T, as mm.cc does, except for B:
//   A: blocks (i < m/r, kk < k/s), each r x s row-major, f32 (src1; re-laid by the memory
//      tile as for mm.cc, rounded to bf16 here as mm.cc rounds f32 operands);
//   B: TILE_N rows of TILE_K / QB whole blocks of BB bytes each, as ggml stores src0 (the
//      memory tile cannot re-lay blocks: one block's bytes hold QB values), decoded here;
//   C: blocks (i < m/r, j < n/t), each r x t row-major, f32.
// For each group of MM_T weight rows (one column block j of C) the rows are decoded
// (block_decode.h) and rounded to bf16 into `wt`, in the t x s block layout mm.cc's B has
// (blocks kk < k/s, each t x s, K contiguous), then every row block i of A is multiplied with
// it. Only one column block is decoded at a time: the staging buffer is MM_T x TILE_K bf16
// (static data, one copy per core, counted by the plan: tiling.plan_gemm_blocks), not the
// whole n x k tile.
//
// Precision: the GEMV's (mvq.cc): decoded weights and activations rounded to bf16 (round to
// nearest even), exact products summed in f32.
//
// Defines: one of MVQ_<type> (block_decode.h); MM_R MM_S MM_T TILE_M TILE_N TILE_K.

#include "ggml_aie.h"

using namespace ggml_aie;

#include "block_decode.h"

using MMUL = aie::mmul<MM_R, MM_S, MM_T, bfloat16, bfloat16>;

static_assert(TILE_K % QB == 0, "a K step is whole blocks");
static_assert(TILE_K % VEC == 0 && VEC % MM_S == 0, "decoded groups are whole s blocks");
static_assert(TILE_N % MM_T == 0 && TILE_M % MM_R == 0, "tiles are whole microkernel blocks");
constexpr int ROW_BYTES = TILE_K / QB * BB;
constexpr unsigned KB = TILE_K / MM_S;

// One column block's weights, decoded: KB blocks of MM_T x MM_S bf16.
alignas(64) static bfloat16 wt[KB * MM_T * MM_S];

// Rows j * MM_T .. (j + 1) * MM_T of the B tile into `wt`.
static inline void decode_block_rows(const uint8_t *b, unsigned j) {
  for (unsigned jj = 0; jj < MM_T; ++jj) {
    const uint8_t *row = b + (j * MM_T + jj) * ROW_BYTES;
    for (unsigned g = 0; g < TILE_K / VEC; ++g) {
      const aie::vector<bfloat16, VEC> v = narrow<bfloat16>(decode16(row, g));
      // Values 16g .. 16g + 16 of row jj are the rows jj of s blocks 16g / s, ...
      for (unsigned h = 0; h < VEC / MM_S; ++h) {
        const unsigned kk = g * (VEC / MM_S) + h;
        aie::store_v(wt + (kk * MM_T + jj) * MM_S, v.template extract<MM_S>(h));
      }
    }
  }
}

// MMUL::size_A f32 values rounded to bf16 (mm.cc's load_block for f32 operands).
static inline aie::vector<bfloat16, MMUL::size_A> load_a(const float *p) {
  aie::vector<bfloat16, MMUL::size_A> r;
  for (unsigned i = 0; i < MMUL::size_A / VEC; ++i)
    r.insert(i, narrow<bfloat16>(load_aligned(p + i * VEC)));
  return r;
}

extern "C" {

void ggml_mmq_zero(float *c) {
  const auto z = aie::broadcast<float, VEC>(0.0f);
  static_assert((TILE_M * TILE_N) % VEC == 0, "C tile is whole vectors");
  for (unsigned i = 0; i < TILE_M * TILE_N; i += VEC)
    aie::store_v(c + i, z);
}

void ggml_mmq(float *a, int8_t *b, float *c) {
  // Round to nearest even, as ggml converts to bf16 (the reset mode, floor, would bias every
  // decoded weight and activation down).
  set_ggml_rounding();
  const uint8_t *wb = reinterpret_cast<const uint8_t *>(b);
  constexpr unsigned NB = TILE_N / MM_T;
  for (unsigned j = 0; j < NB; ++j) {
    decode_block_rows(wb, j);
    for (unsigned i = 0; i < TILE_M / MM_R; ++i) {
      float *pc = c + (i * NB + j) * MMUL::size_C;
      MMUL acc(aie::load_v<MMUL::size_C>(pc));
      const float *pa = a + i * KB * MMUL::size_A;
      for (unsigned kk = 0; kk < KB; ++kk) {
        auto va = load_a(pa + kk * MMUL::size_A);
        auto vb = aie::transpose(aie::load_v<MMUL::size_B>(wt + kk * MMUL::size_B), MM_T, MM_S);
        acc.mac(va, vb);
      }
      aie::store_v(pc, acc.template to_vector<float>());
    }
  }
}

} // extern "C"
