// rope_math.h: ggml's ROPE arithmetic on a core, shared by the ROPE design's core functions
// (rope.cc) and the GEMV's rotation epilogue (mv_rope.h, RMS_NORM_MUL_MAT_ROPE(_FF)): the
// cos/sin cache of one position (the theta recurrence, the frequency factors, YaRN's ramp and
// magnitude scale) and the rotation of a row's pairs staged in g_a / g_b. Include after
// ggml_aie.h, at file scope.
//
// Defines:
//   N_DIMS              rotated elements per row (even); pairs i = 0 .. N_DIMS/2 - 1
//   NEOX=1              NeoX mode: pair i is (i, i + N_DIMS/2); otherwise (2i, 2i + 1)
//   FF=1                frequency factors: theta is divided by g_ff[i] (the includer fills it)
//   YARN=1              ext_factor != 0 (YaRN's ramp between interpolation and extrapolation)
//   THETA_SCALE, FREQ_SCALE, EXT_FACTOR, MSCALE, CORR_LOW, CORR_DEN
//                       f32 bit patterns of ggml's constants, computed by the compiler as
//                       ggml computes them (plans.rope_constants): theta_scale =
//                       freq_base^(-2/n_dims), the YaRN correction dims low and
//                       max(0.001, high - low), and attn_factor times YaRN's magnitude scale
//                       when ext_factor != 0
//
// ggml's order of operations (per position p, i = 0 .. N_DIMS/2 - 1): theta_extrap =
// theta / ff[i] with theta = p * theta_scale^i built by repeated multiplication; theta_interp
// = freq_scale * theta_extrap; with ext_factor != 0, ramp = 1 - clamp((i - low) / den, 0, 1),
// mix = ramp * ext_factor, theta = theta_interp (1 - mix) + theta_extrap mix; cos and sin of
// theta times mscale. The theta recurrence is scalar f32 (one multiply per pair, once per
// distinct position) so that it rounds as ggml's does; sin and cos are the vector functions of
// ggml_aie.h (accurate for |theta| below about 6000). Pairs are rotated 16 at a time in f32.
//
//   rope_fill_cache(p)    g_cos, g_sin of position p (g_pos = p, g_valid)
//   rope_ia(i), rope_ib(i)  the row offsets of pair i
//   rope_rotate_ab()      (g_a[i], g_b[i]) = (a cos - b sin, a sin + b cos) for every pair
//
// Everything of HALF_PAD floats is static, per core (each core links its own copy): 6 arrays
// the plans count against the core's data memory, so the stack stays small.
//   ROPE_MATH_SHARED    an includer's 64-byte-aligned f32 array of 6 HALF_PAD floats or more
//                       holding the 6 arrays instead (the includer checks its size): its own
//                       data are never live while a rotation's are, and the includer rebuilds
//                       the rotation's (g_ff, g_valid) each time it starts rotating again

#if !defined(NEOX)
#define NEOX 0
#endif
#if !defined(FF)
#define FF 0
#endif

static_assert(N_DIMS > 0 && N_DIMS % 2 == 0, "pairs of rotated elements");
constexpr int HALF = N_DIMS / 2;
constexpr int FF_WORDS = FF ? HALF : 0;
constexpr int HALF_PAD = (HALF + (int)ggml_aie::VEC - 1) / (int)ggml_aie::VEC * (int)ggml_aie::VEC;

static inline float f32_of(uint32_t bits) { return __builtin_bit_cast(float, bits); }

static int32_t g_pos;  // the position of the cache
static bool g_valid;   // the cache holds g_pos's values
#if defined(ROPE_MATH_SHARED)
static float *const g_cos = ROPE_MATH_SHARED;
static float *const g_sin = ROPE_MATH_SHARED + HALF_PAD;
static float *const g_ff = ROPE_MATH_SHARED + 2 * HALF_PAD;
static float *const g_theta = ROPE_MATH_SHARED + 3 * HALF_PAD;
static float *const g_a = ROPE_MATH_SHARED + 4 * HALF_PAD;
static float *const g_b = ROPE_MATH_SHARED + 5 * HALF_PAD;
#else
alignas(64) static float g_cos[HALF_PAD];
alignas(64) static float g_sin[HALF_PAD];
alignas(64) static float g_ff[HALF_PAD];
alignas(64) static float g_theta[HALF_PAD];
alignas(64) static float g_a[HALF_PAD];
alignas(64) static float g_b[HALF_PAD];
#endif

static constexpr int rope_ia(int i) { return NEOX ? i : 2 * i; }
static constexpr int rope_ib(int i) { return NEOX ? i + HALF : 2 * i + 1; }

static void rope_fill_cache(int32_t p) {
  using namespace ggml_aie;
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

// The pairs staged in g_a (first elements) and g_b (second), zero past HALF.
static inline void rope_rotate_ab() {
  using namespace ggml_aie;
  for (int i = 0; i < HALF_PAD; i += VEC) {
    vf va = aie::load_v<VEC>(g_a + i), vb = aie::load_v<VEC>(g_b + i);
    vf c = aie::load_v<VEC>(g_cos + i), s = aie::load_v<VEC>(g_sin + i);
    // ggml: x0 cos - x1 sin, x0 sin + x1 cos
    aie::store_v(g_a + i, sub(mul(va, c), mul(vb, s)));
    aie::store_v(g_b + i, add(mul(va, s), mul(vb, c)));
  }
}
