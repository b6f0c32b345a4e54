// mmq.cc: GEMM core functions of ggml_hsa_iron's MUL_MAT design for weights moved as the
// bytes ggml stores them: f16 and the block-quantized types (f32 or bf16 activations, f32
// results).
//
// C[m x n] += A[m x a_k] . B[a_k x n] for one core tile and one A tile, with the bf16
// aie::mmul microkernel of shape MM_R x MM_S x MM_T, as mm.cc does, except for B:
//   A: blocks (i < m/r, kk < a_k/s), each r x s row-major, f32 (src1; re-laid by the memory
//      tile as for mm.cc, rounded to bf16 here as mm.cc rounds f32 operands), or with A_BF16
//      bf16 as it comes (half the bytes through every channel that carries A);
//   B: TILE_N rows of TILE_K / QB whole blocks of BB bytes each, as ggml stores src0 (the
//      memory tile cannot re-lay blocks: one block's bytes hold QB values), decoded here;
//   C: blocks (i < m/r, j < n/t), each r x t row-major, f32.
// A K step of TILE_K values (whole blocks: 256 for the K-quants) may come as A_SPLIT A tiles
// of A_K columns each, one call per A tile with the same B tile (`part`), so that a K-quant
// block does not need a 256-column A tile in the core's memory.
// Each call rounds its A tile to bf16 once, in place, for every column block. For each group
// of MM_T weight rows (one column block j of C) the A tile's columns of the rows are decoded
// 32 values at a time on the vector unit (block_decode.h's piece(), the GEMV's decoder; f16:
// 16 values converted) into `wt`, t x s blocks turned once to the s x t layout the
// microkernel takes B in, then the row blocks of A are multiplied with it, four at a time so
// that each load of a decoded block serves four products. Only one column block is decoded
// at a time: `wt` is MM_T x A_K bf16 (static data, one copy per core, counted by the plan:
// tiling.gemm_blocks_l1), not the whole n x k tile.
//
// Precision: the GEMV's (mvq.cc): weights formed as its decoder forms them and activations
// rounded to bf16 (round to nearest even), exact products summed in f32.
//
// Defines: one of MVQ_<type> (block_decode.h); MM_R MM_S MM_T TILE_M TILE_N TILE_K; A_SPLIT
// (default 1); A_BF16 (A tiles of bf16).

#include "ggml_aie.h"

using namespace ggml_aie;

#include "block_decode.h"

using MMUL = aie::mmul<MM_R, MM_S, MM_T, bfloat16, bfloat16>;

#ifndef A_SPLIT
#define A_SPLIT 1
#endif
// Columns of an A tile: the K step, or its part.
constexpr unsigned A_K = TILE_K / A_SPLIT;

static_assert(TILE_K % QB == 0 && TILE_K % A_SPLIT == 0, "a K step is whole blocks and A tiles");
static_assert(32 % MM_S == 0 && VEC % MM_S == 0, "pieces (32 values, f16: VEC) are whole s blocks");
#if MVQ_F16
static_assert(A_K % VEC == 0, "an A tile is whole pieces");
#else
static_assert(A_K % 32 == 0, "an A tile is whole pieces");
#endif
static_assert(TILE_N % MM_T == 0 && TILE_M % MM_R == 0, "tiles are whole microkernel blocks");
static_assert((TILE_M * A_K) % VEC == 0, "the A tile is whole vectors");
constexpr int ROW_BYTES = TILE_K / QB * BB;
constexpr unsigned KB = A_K / MM_S;
constexpr unsigned MB = TILE_M / MM_R;
// Row blocks sharing each load of a decoded block (accumulators held at once).
constexpr unsigned RB = MB % 4 == 0 ? 4 : MB % 2 == 0 ? 2 : 1;

// One column block's weights of the A tile's columns, decoded: KB blocks of MM_S x MM_T bf16.
alignas(64) static bfloat16 wt[KB * MM_T * MM_S];

// Values v0 .. v0 + N of the A tile's columns of weight row jj (< MM_T) into the rows jj of
// the t x s blocks they fall in.
template <unsigned N>
static inline void stage(unsigned jj, unsigned v0, const aie::vector<bfloat16, N> &v) {
#pragma GCC unroll 8
  for (unsigned h = 0; h < N / MM_S; ++h)
    aie::store_v(wt + ((v0 / MM_S + h) * MM_T + jj) * MM_S, v.template extract<MM_S>(h));
}

#if MVQ_Q4_K || MVQ_Q5_K || MVQ_Q6_K
// A K-quant block split over A tiles (A_K < 256): its scales are made by the call of the first
// A tile it falls in and kept, as their bf16 halves, for the calls of the others (the core's
// static data, counted by the plan).
constexpr bool KEEP_SCALES = A_K < QB;
alignas(64) static bfloat16 kept[KEEP_SCALES ? TILE_N * (TILE_K / QB) * 32 : 32];

// The scales of block `bb`, the idx-th of the B tile; `first`: its first A tile.
static inline BlockScales scales_of(const uint8_t *bb, unsigned idx, bool first) {
  if constexpr (!KEEP_SCALES)
    return block_scales(bb);
  bfloat16 *p = kept + idx * 32;
  if (first) {
    const BlockScales s = block_scales(bb);
    aie::store_v(p, s.hi);
    aie::store_v(p + 16, s.lo);
    return s;
  }
  return {aie::load_v<16>(p), aie::load_v<16>(p + 16)};
}
#elif !MVQ_F16
static inline BlockScales scales_of(const uint8_t *bb, unsigned, bool) { return block_scales(bb); }
#endif

// Rows j * MM_T .. (j + 1) * MM_T of the B tile, values k0 .. k0 + A_K of each, into `wt`.
static inline void decode_block_rows(const uint8_t *b, unsigned j, unsigned k0,
                                     const BlockConsts &k) {
  for (unsigned jj = 0; jj < MM_T; ++jj) {
    const uint8_t *row = b + (j * MM_T + jj) * ROW_BYTES;
#if MVQ_F16
    (void)k;
    for (unsigned v = 0; v < A_K; v += VEC)
      stage(jj, v, narrow<bfloat16>(halves(row + 2 * (k0 + v), VEC)));
#else
    // The blocks the columns fall in (a part of one block, or whole blocks).
    for (unsigned v = 0; v < A_K;) {
      const unsigned blk = (k0 + v) / QB;
      const uint8_t *bb = row + blk * BB;
      const BlockScales s =
          scales_of(bb, (j * MM_T + jj) * (TILE_K / QB) + blk, (k0 + v) % QB == 0);
      for (unsigned p = (k0 + v) % QB / 32; p < PIECES && v < A_K; ++p, v += 32)
        stage(jj, v, piece(bb, p, s, k));
    }
#endif
  }
  // Each t x s block turned to s x t once, for all the row blocks of A.
#pragma GCC unroll 8
  for (unsigned kk = 0; kk < KB; ++kk) {
    bfloat16 *blk = wt + kk * MMUL::size_B;
    aie::store_v(blk, aie::transpose(aie::load_v<MMUL::size_B>(blk), MM_T, MM_S));
  }
}

extern "C" {

void ggml_mmq_zero(float *c) {
  const auto z = aie::broadcast<float, VEC>(0.0f);
  static_assert((TILE_M * TILE_N) % VEC == 0, "C tile is whole vectors");
  for (unsigned i = 0; i < TILE_M * TILE_N; i += VEC)
    aie::store_v(c + i, z);
}

#if A_BF16
using a_type = bfloat16;
#else
using a_type = float;
#endif

// A tile `part` (< A_SPLIT) of the K step: columns part * A_K .. of the B tile.
void ggml_mmq(a_type *a, int8_t *b, float *c, int32_t part) {
  // Round to nearest even, as ggml converts to bf16 (the reset mode, floor, would bias every
  // decoded weight and activation down).
  set_ggml_rounding();
#if A_BF16
  const bfloat16 *ab = a;
#else
  // A rounded to bf16 once, in place: the first half of the f32 tile's buffer (each vector
  // is written over values already read), kept in its r x s block layout.
  bfloat16 *ab = reinterpret_cast<bfloat16 *>(a);
  for (unsigned e = 0; e < TILE_M * A_K; e += VEC)
    aie::store_v(ab + e, narrow<bfloat16>(load_aligned(a + e)));
#endif
  const uint8_t *wb = reinterpret_cast<const uint8_t *>(b);
  const BlockConsts k;
  constexpr unsigned NB = TILE_N / MM_T;
  for (unsigned j = 0; j < NB; ++j) {
    decode_block_rows(wb, j, unsigned(part) * A_K, k);
    // RB row blocks at a time, so that each decoded block loaded serves RB products.
    for (unsigned i0 = 0; i0 < MB; i0 += RB) {
      MMUL acc[RB];
      unrolled<RB>([&](unsigned u) {
        acc[u] = MMUL(aie::load_v<MMUL::size_C>(c + ((i0 + u) * NB + j) * MMUL::size_C));
      });
#pragma GCC unroll 8
      for (unsigned kk = 0; kk < KB; ++kk) {
        const auto vb = aie::load_v<MMUL::size_B>(wt + kk * MMUL::size_B);
        unrolled<RB>([&](unsigned u) {
          acc[u].mac(aie::load_v<MMUL::size_A>(ab + ((i0 + u) * KB + kk) * MMUL::size_A), vb);
        });
      }
      unrolled<RB>([&](unsigned u) {
        aie::store_v(c + ((i0 + u) * NB + j) * MMUL::size_C, acc[u].template to_vector<float>());
      });
    }
  }
}

} // extern "C"
