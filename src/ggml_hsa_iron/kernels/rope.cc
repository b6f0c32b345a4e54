// rope.cc: ROPE and ROPE_FF core functions of ggml_hsa_iron (aie2 / aie2p).
//
// Built once per kernel with Peano; the design (designs/rope.py) sets:
//   X_T                 x's C type: float, or uint16_t (f16 bit patterns)
//   OUT_T               the output's C type (default X_T): X_T, or uint16_t with a float X_T
//                       (the backend's ROPE fused with the f16 KV-cache write: each rotated
//                       value rounded to f16 to nearest even, as ggml's f32 -> f16 copy)
//   NE0                 elements per row; TILE_ROWS rows per object FIFO tile
//   NE1, NE2            x's ne1 (rows per position) and ne2 (positions)
//   TABLE_WORDS         32-bit words of the positions' FIFO object: (FF) the N_DIMS/2
//                       factors, then the positions table of the worker's column
//   N_DIMS, NEOX, FF, YARN, THETA_SCALE, FREQ_SCALE, EXT_FACTOR, MSCALE, CORR_LOW, CORR_DEN
//                       the rotation (rope_math.h, shared with the GEMV's epilogue mv_rope.h)
//
// Functions (arguments as the object FIFOs deliver them):
//   ggml_rope_begin(tab, first, step)  once per dispatch, with the held table object: forget
//                                      the cached position, (FF) copy the factors (f32
//                                      bits) aside; the worker's tiles start at rows first,
//                                      first + step, ... of its column
//   ggml_rope(x, tab, out)             the next TILE_ROWS rows; row j of the column takes
//                                      position tab[FF_WORDS + (j / NE1) % NE2] (the table
//                                      is the column's i2 groups, or all of positions[0 ..
//                                      NE2) when the column has whole i3 slices: the DMA
//                                      sends each position once, not once per row)
//
// ggml's order of operations and the cos/sin cache of a position: rope_math.h. The cache is
// computed when a row's position differs from the previous row's (a position's heads share
// it); dimensions past N_DIMS are copied.

#include "ggml_aie.h"

#ifndef TILE_ROWS
#error "TILE_ROWS must be defined"
#endif

using namespace ggml_aie;

#if !defined(OUT_T)
#define OUT_T X_T
#endif
static_assert(std::is_same_v<X_T, OUT_T> ||
                  (std::is_same_v<X_T, float> && std::is_same_v<OUT_T, uint16_t>),
              "the output is x's type, or f16 from f32");

#include "rope_math.h"

static_assert(TABLE_WORDS > FF_WORDS, "the table holds at least one position");

// The first row (in the column) of the next tile, and the rows between two of this
// worker's tiles (the memory tile deals the column's tiles round-robin to its workers).
static int32_t g_row, g_step;

static inline float to_f32(float v) { return v; }
static inline float to_f32(uint16_t v) { return f16_to_f32(v); }
static inline void from_f32(float &d, float v) { d = v; }
static inline void from_f32(uint16_t &d, float v) { d = f32_to_f16(v); }

static void rotate_row(const X_T *x, OUT_T *out) {
  for (int i = 0; i < HALF; ++i) {
    g_a[i] = to_f32(x[rope_ia(i)]);
    g_b[i] = to_f32(x[rope_ib(i)]);
  }
  for (int i = HALF; i < HALF_PAD; ++i)
    g_a[i] = g_b[i] = 0.0f;
  rope_rotate_ab();
  for (int i = 0; i < HALF; ++i) {
    from_f32(out[rope_ia(i)], g_a[i]);
    from_f32(out[rope_ib(i)], g_b[i]);
  }
  // Dimensions past n_dims are copied: bit for bit within a type; f32 -> f16 rounded as the
  // rotated values are (ggml copies them in f32, then the cache write rounds them).
  for (int i = N_DIMS; i < NE0; ++i) {
    if constexpr (std::is_same_v<X_T, OUT_T>)
      out[i] = x[i];
    else
      from_f32(out[i], to_f32(x[i]));
  }
}

extern "C" {

void ggml_rope_begin(int32_t *tab, int32_t first, int32_t step) {
  g_valid = false;
  g_row = first;
  g_step = step;
#if FF
  for (int i = 0; i < HALF; ++i)
    g_ff[i] = __builtin_bit_cast(float, tab[i]);
#else
  (void)tab;
#endif
}

void ggml_rope(X_T *x, int32_t *tab, OUT_T *out) {
  // Round to nearest even: on aie2 the f32 vector multiply of ggml_aie.h splits its operands
  // into bf16 pieces by conversions in the core's rounding mode (reset value: floor).
  set_ggml_rounding();
  const int32_t *pos = tab + FF_WORDS;
  for (int r = 0; r < TILE_ROWS; ++r) {
    int32_t p = pos[((g_row + r) / NE1) % NE2];
    if (!g_valid || p != g_pos)
      rope_fill_cache(p);
    rotate_row(x + r * NE0, out + r * NE0);
  }
  g_row += g_step;
}

} // extern "C"
