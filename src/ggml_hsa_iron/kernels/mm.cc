// mm.cc: GEMM core functions of ggml_hsa_iron's MUL_MAT design (aie2 / aie2p).
//
// C[m x n] += A[m x k] . B[k x n] for one core tile, with the aie::mmul
// microkernel of shape MM_R x MM_S x MM_T. The data movement (memory tile DMA)
// delivers the tiles already blocked:
//   A: blocks (i < m/r, kk < k/s), each r x s row-major        (A_T = src1's type)
//   B: blocks (j < n/t, kk < k/s), each t x s, K contiguous     (B_T = src0's type;
//      ggml's src0 is B stored column-major, so each block is transposed here)
//   C: blocks (i < m/r, j < n/t), each r x t row-major          (C_T = dst's type)
// Defines: A_T B_T C_T MMUL_T MM_R MM_S MM_T TILE_M TILE_N TILE_K.
// f32 operands are rounded to bf16 for the bf16 microkernel (f32 is emulated).

#include "ggml_aie.h"

using namespace ggml_aie;

using MMUL = aie::mmul<MM_R, MM_S, MM_T, MMUL_T, MMUL_T>;

// N elements as the microkernel's input type.
template <unsigned N, typename T> static inline aie::vector<MMUL_T, N> load_block(const T *p) {
  if constexpr (std::is_same_v<T, float>) {
    aie::vector<MMUL_T, N> r;
    for (unsigned i = 0; i < N / VEC; ++i)
      r.insert(i, narrow<MMUL_T>(load_aligned(p + i * VEC)));
    return r;
  } else {
    return aie::load_v<N>(p);
  }
}

extern "C" {

void ggml_mm_zero(C_T *c) {
  constexpr unsigned W = 64 / sizeof(C_T);
  static_assert((TILE_M * TILE_N) % W == 0, "C tile is whole vectors");
  const auto z = aie::broadcast<C_T, W>((C_T)0);
  for (unsigned i = 0; i < TILE_M * TILE_N; i += W)
    aie::store_v(c + i, z);
}

void ggml_mm(A_T *a, B_T *b, C_T *c) {
  set_ggml_rounding();
  constexpr unsigned KB = TILE_K / MM_S;
  constexpr unsigned NB = TILE_N / MM_T;
  for (unsigned i = 0; i < TILE_M / MM_R; ++i) {
    for (unsigned j = 0; j < NB; ++j) {
      C_T *pc = c + (i * NB + j) * MMUL::size_C;
      MMUL acc(aie::load_v<MMUL::size_C>(pc));
      const A_T *pa = a + i * KB * MMUL::size_A;
      const B_T *pb = b + j * KB * MMUL::size_B;
      for (unsigned kk = 0; kk < KB; ++kk) {
        auto va = load_block<MMUL::size_A>(pa + kk * MMUL::size_A);
        auto vb = aie::transpose(load_block<MMUL::size_B>(pb + kk * MMUL::size_B), MM_T, MM_S);
        acc.mac(va, vb);
      }
      aie::store_v(pc, acc.template to_vector<C_T>());
    }
  }
}

} // extern "C"
