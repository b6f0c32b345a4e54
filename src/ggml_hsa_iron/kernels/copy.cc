// copy.cc: core functions of the copy designs of ggml_hsa_iron (designs/copy_ops.py).
//
// Built once per type combination; the plan (plans_copy.py) sets either
//   COPY_ELEMENTS=1, IN_T, OUT_T             DUP / CPY / CONT
// or
//   SET_ROWS=1, SRC_T, DST_T, IDX_I64        SET_ROWS
// (f16 operands are uint16_t bit patterns, bf16 the AIE's bfloat16). Sizes are runtime
// arguments, constants of the design: one core object serves every shape of a type
// combination, so kernels of different shapes share it (and its build).
//
// Functions (arguments as the object FIFOs and the design deliver them):
//   ggml_copy(in, out, n)                    n elements in logical order
//   ggml_set_rows_begin(first_row, row_len, n_src_rows, tile_rows, col_rows)
//                                            the worker's first destination row of a slab,
//                                            the row length, the source rows of a slab, the
//                                            rows of a tile and of the worker's share
//   ggml_set_rows_tile(side, in, out)        one tile of destination rows: copied, then the
//                                            source rows indexed into it written over it
//
// Conversions are ggml-cpu's: f32 -> f16 and f32 -> bf16 round to nearest even (bf16 NaNs
// made quiet, as ggml_compute_fp32_to_bf16 does), f16 and bf16 -> f32 exact; a copy between
// equal types moves the bits. They are integer code, exact whatever the core's rounding mode;
// the mode is set anyway, as in every core function that converts.

#include "ggml_aie.h"

using namespace ggml_aie;

static inline float bf16_bits_to_f32(uint16_t h) {
  return __builtin_bit_cast(float, (uint32_t)h << 16);
}

static inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 64u);
  return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

static inline float to_f32(float v) { return v; }
static inline float to_f32(uint16_t v) { return f16_to_f32(v); }
static inline float to_f32(bfloat16 v) {
  uint16_t b;
  __builtin_memcpy(&b, &v, sizeof b);
  return bf16_bits_to_f32(b);
}

static inline void from_f32(float &d, float v) { d = v; }
static inline void from_f32(uint16_t &d, float v) { d = f32_to_f16(v); }
static inline void from_f32(bfloat16 &d, float v) {
  uint16_t b = f32_to_bf16_bits(v);
  __builtin_memcpy(&d, &b, sizeof b);
}

template <typename S, typename D> static inline void convert(const S *in, D *out, int n) {
  if constexpr (std::is_same_v<S, D>) {
    for (int i = 0; i < n; ++i)
      out[i] = in[i];
  } else {
    for (int i = 0; i < n; ++i)
      from_f32(out[i], to_f32(in[i]));
  }
}

extern "C" {

#if COPY_ELEMENTS
void ggml_copy(IN_T *in, OUT_T *out, int32_t n) {
  set_ggml_rounding();
  convert(in, out, n);
}
#endif

#if SET_ROWS
#if IDX_I64
constexpr int IDX_BYTES = 8;
#else
constexpr int IDX_BYTES = 4;
#endif

// The slab row of the next tile (relative to the slab), the worker's first one, and the
// sizes of ggml_set_rows_begin.
static int32_t g_first, g_row, g_row_len, g_src_rows, g_tile_rows, g_col_rows;

void ggml_set_rows_begin(int32_t first_row, int32_t row_len, int32_t n_src_rows,
                         int32_t tile_rows, int32_t col_rows) {
  g_first = first_row;
  g_row = first_row;
  g_row_len = row_len;
  g_src_rows = n_src_rows;
  g_tile_rows = tile_rows;
  g_col_rows = col_rows;
}

void ggml_set_rows_tile(SRC_T *side, DST_T *in, DST_T *out) {
  set_ggml_rounding();
  convert(in, out, g_tile_rows * g_row_len);
  const uint8_t *bytes = (const uint8_t *)side;
  const SRC_T *rows = (const SRC_T *)(bytes + g_src_rows * IDX_BYTES);
  // In order: a later source row with the same index wins, as in ggml-cpu.
  for (int i = 0; i < g_src_rows; ++i) {
    int64_t index;
#if IDX_I64
    __builtin_memcpy(&index, bytes + 8 * i, 8);
#else
    int32_t v;
    __builtin_memcpy(&v, bytes + 4 * i, 4);
    index = v;
#endif
    int64_t r = index - g_row;
    if (r < 0 || r >= g_tile_rows)
      continue;
    convert(rows + (int64_t)i * g_row_len, out + r * g_row_len, g_row_len);
  }
  g_row += g_tile_rows;
  if (g_row >= g_first + g_col_rows)
    g_row = g_first; // the next slab
}
#endif

} // extern "C"
