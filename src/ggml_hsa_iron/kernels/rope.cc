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
//   N_DIMS              rotated elements per row (even, <= NE0); the rest is copied
//   NEOX=1              NeoX mode: pairs (i, i + N_DIMS/2); otherwise (2i, 2i + 1)
//   FF=1                frequency factors (ROPE_FF): theta is divided by ff[i]
//   YARN=1              ext_factor != 0 (YaRN's ramp between interpolation and extrapolation)
//   THETA_SCALE, FREQ_SCALE, EXT_FACTOR, MSCALE, CORR_LOW, CORR_DEN
//                       f32 bit patterns of ggml's constants, computed by the compiler as
//                       ggml computes them (plans.py, RopeSpec): theta_scale =
//                       freq_base^(-2/n_dims), the YaRN correction dims low and
//                       max(0.001, high - low), and attn_factor times YaRN's magnitude
//                       scale when ext_factor != 0
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
// ggml's order of operations (per position p, i = 0 .. N_DIMS/2 - 1): theta_extrap =
// theta / ff[i] with theta = p * theta_scale^i built by repeated multiplication; theta_interp
// = freq_scale * theta_extrap; with ext_factor != 0, ramp = 1 - clamp((i - low) / den, 0, 1),
// mix = ramp * ext_factor, theta = theta_interp (1 - mix) + theta_extrap mix; cos and sin of
// theta times mscale. The theta recurrence is scalar f32 (one multiply per pair, once per
// distinct position, i.e. shared by a position's heads) so that it rounds as ggml's does;
// sin and cos are the vector functions of ggml_aie.h (accurate for |theta| below about
// 6000). Rows are rotated 16 pairs at a time in f32.

#include "ggml_aie.h"

#ifndef TILE_ROWS
#error "TILE_ROWS must be defined"
#endif

using namespace ggml_aie;

#if !defined(OUT_T)
#define OUT_T X_T
#endif
#if !defined(NEOX)
#define NEOX 0
#endif
#if !defined(FF)
#define FF 0
#endif

static_assert(std::is_same_v<X_T, OUT_T> ||
                  (std::is_same_v<X_T, float> && std::is_same_v<OUT_T, uint16_t>),
              "the output is x's type, or f16 from f32");

constexpr int HALF = N_DIMS / 2;
constexpr int FF_WORDS = FF ? HALF : 0;
static_assert(TABLE_WORDS > FF_WORDS, "the table holds at least one position");
constexpr int HALF_PAD = (HALF + (int)VEC - 1) / (int)VEC * (int)VEC;

static inline float f32_of(uint32_t bits) { return __builtin_bit_cast(float, bits); }

// Per core: each core links its own copy. Everything of HALF_PAD floats is static (the
// plan counts 6 such arrays against the core's data memory), so the stack stays small.
static int32_t g_pos;
static bool g_valid;
// The first row (in the column) of the next tile, and the rows between two of this
// worker's tiles (the memory tile deals the column's tiles round-robin to its workers).
static int32_t g_row, g_step;
alignas(64) static float g_cos[HALF_PAD];
alignas(64) static float g_sin[HALF_PAD];
alignas(64) static float g_ff[HALF_PAD];
alignas(64) static float g_theta[HALF_PAD];
alignas(64) static float g_a[HALF_PAD];
alignas(64) static float g_b[HALF_PAD];

static inline float to_f32(float v) { return v; }
static inline float to_f32(uint16_t v) { return f16_to_f32(v); }
static inline void from_f32(float &d, float v) { d = v; }
static inline void from_f32(uint16_t &d, float v) { d = f32_to_f16(v); }

static void fill_cache(int32_t p) {
  const float theta_scale = f32_of(THETA_SCALE), freq_scale = f32_of(FREQ_SCALE);
  float *theta_tab = g_theta;
  float theta = (float)p;
  for (int i = 0; i < HALF; ++i) {
#if FF
    float extrap = theta / g_ff[i];
#else
    float extrap = theta;
#endif
    float interp = freq_scale * extrap;
    float th = interp;
#if YARN
    {
      float y = ((float)i - f32_of(CORR_LOW)) / f32_of(CORR_DEN);
      y = y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y);
      float mix = (1.0f - y) * f32_of(EXT_FACTOR);
      th = interp * (1.0f - mix) + extrap * mix;
    }
#endif
    theta_tab[i] = th;
    theta *= theta_scale;
  }
  for (int i = HALF; i < HALF_PAD; ++i)
    theta_tab[i] = 0.0f;
  const float mscale = f32_of(MSCALE);
  for (int i = 0; i < HALF_PAD; i += VEC) {
    vf th = aie::load_v<VEC>(theta_tab + i);
    aie::store_v(g_cos + i, mul(cos(th), mscale));
    aie::store_v(g_sin + i, mul(sin(th), mscale));
  }
  g_pos = p;
  g_valid = true;
}

static void rotate_row(const X_T *x, OUT_T *out) {
  float *a = g_a, *b = g_b;
  for (int i = 0; i < HALF; ++i) {
    int ia = NEOX ? i : 2 * i, ib = NEOX ? i + HALF : 2 * i + 1;
    a[i] = to_f32(x[ia]);
    b[i] = to_f32(x[ib]);
  }
  for (int i = HALF; i < HALF_PAD; ++i)
    a[i] = b[i] = 0.0f;
  for (int i = 0; i < HALF_PAD; i += VEC) {
    vf va = aie::load_v<VEC>(a + i), vb = aie::load_v<VEC>(b + i);
    vf c = aie::load_v<VEC>(g_cos + i), s = aie::load_v<VEC>(g_sin + i);
    // ggml: x0 cos - x1 sin, x0 sin + x1 cos
    aie::store_v(a + i, sub(mul(va, c), mul(vb, s)));
    aie::store_v(b + i, add(mul(va, s), mul(vb, c)));
  }
  for (int i = 0; i < HALF; ++i) {
    int ia = NEOX ? i : 2 * i, ib = NEOX ? i + HALF : 2 * i + 1;
    from_f32(out[ia], a[i]);
    from_f32(out[ib], b[i]);
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
      fill_cache(p);
    rotate_row(x + r * NE0, out + r * NE0);
  }
  g_row += g_step;
}

} // extern "C"
