// mv_norm.h: the fused RMS_NORM_MUL_MAT(_<glu>) functions of a GEMV core source (mv.cc,
// mvq.cc), included inside its extern "C" block after its `accumulate(w, x, y)` (y[r] +=
// dot(W[r], x) for the MV_ROWS rows of a W tile) and, with MV_GLU or MV_OUT_F16, after
// mv_stash.h (its stash). x is f32 (the norm's input, not normalised), y f32 (f16 with
// MV_OUT_F16). Defines: MV_NORM_K (K), MV_KC, OP_P0 (eps, f32 bits). The including file names
// the functions: GGML_MV_NORM_LOAD, GGML_MV_NORM_ZERO, GGML_MV_NORM, GGML_MV_NORM_SCALE (with
// MV_GLU or MV_OUT_F16 also GGML_MV_NORM_STASH_ZERO, GGML_MV_NORM_STASH; with MV_OUT_F16
// GGML_MV_NORM_STORE_F16 instead of the f32 y's GGML_MV_NORM_ZERO, GGML_MV_NORM and
// GGML_MV_NORM_SCALE), and the W type GGML_MV_W_T.
//
// With s = 1 / sqrt(mean(x^2) + eps) one scalar per x row, W . (x * s * n) = s * (W . (x * n)):
// the K chunks are multiplied by n as they arrive, their squares summed, and the round's sums
// scaled by s at its end (before the GLU, which is not linear; before the f16 rounding).
//   GGML_MV_NORM_LOAD(n)     once per dispatch, per K chunk of n ahead of x's rows: kept aside
//   GGML_MV_NORM_ZERO(y)     y = 0 and a new round (chunk counter, sum of squares)
//   GGML_MV_NORM(w, x, y)    y[r] += dot(W[r], x * n) for the round's next chunk
//   GGML_MV_NORM_SCALE(y)    y *= s (with MV_GLU the stash too)
// The stash's functions (the GLU's gate rows; an f16 output's every row):
//   GGML_MV_NORM_STASH_ZERO()     stash = 0 and a new round
//   GGML_MV_NORM_STASH(w, x)      stash[r] += dot(W[r], x * n) for the round's next chunk
//   GGML_MV_NORM_STORE_F16(y)     y[r] = f16(stash[r] * s), rounded once (mv_stash.h's store)
// With MV_GLU the gate pass starts the round with GGML_MV_NORM_STASH_ZERO; the up pass then
// zeroes y with the plain zero function and reuses GGML_MV_NORM (x comes twice: its squares
// are summed in the first pass).
// n is kept in this core's static data (each core links its own copy); the plan counts
// mv_norm_bytes() in the core's memory and refuses a K that does not fit.
// With MV_NX activation rows per call (mvq.cc): an x object holds MV_NX rows' K chunks, each
// row has its own sum of squares and s, and each n object MV_NX consecutive chunks of n (the
// last object padded with x's first chunks, which are not kept). The chunks x * n are then
// written over x in its object (the core's own buffer, filled anew for every pass), sparing a
// copy of MV_NX chunks; one row keeps a padded copy (K chunks off the vector lanes).

constexpr int NORM_STEPS = MV_NORM_K / MV_KC;
static_assert(NORM_STEPS * MV_KC == MV_NORM_K, "K is whole chunks");
// Each chunk of n at a multiple of VEC values: aligned vector loads for any MV_KC.
constexpr int NORM_KC_PAD = (MV_KC + (int)VEC - 1) / (int)VEC * (int)VEC;
constexpr int NORM_BODY = MV_KC - MV_KC % (int)VEC;
// n objects of a dispatch (MV_NX chunks each).
constexpr int NORM_OBJECTS = (NORM_STEPS + MV_NX - 1) / MV_NX;
// Several rows' chunks follow each other in x, as mvq.cc's products read them (normalised there).
static_assert(MV_NX == 1 || NORM_KC_PAD == MV_KC, "several rows: K chunks of whole vectors");

alignas(64) static float g_norm_w[NORM_STEPS * NORM_KC_PAD];
#if MV_NX == 1
alignas(64) static float g_norm_x[NORM_KC_PAD]; // the chunk x * n the products read
#endif
alignas(64) static float g_norm_ss[MV_NX * VEC]; // each row's sums of x^2 (lanes)
static int32_t g_norm_loaded;                    // n objects kept (mod NORM_OBJECTS)
static int32_t g_norm_chunk;                     // chunks of x seen this round

void GGML_MV_NORM_LOAD(float *n_object) {
  for (int j = 0; j < MV_NX; ++j) {
    const int chunk = g_norm_loaded * MV_NX + j;
    if (chunk >= NORM_STEPS)
      break; // the last object's padding
    const float *n = n_object + j * MV_KC;
    float *d = g_norm_w + chunk * NORM_KC_PAD;
    for (int i = 0; i < NORM_BODY; i += VEC)
      store_aligned(d + i, load_aligned(n + i));
    if constexpr (NORM_BODY < MV_KC)
      store_aligned(d + NORM_BODY, load_part_zero(n + NORM_BODY, MV_KC - NORM_BODY));
  }
  // Wraps after a dispatch's NORM_OBJECTS objects: the next dispatch refills from the start.
  g_norm_loaded = (g_norm_loaded + 1) % NORM_OBJECTS;
}

static inline void norm_round() {
  g_norm_chunk = 0;
  for (int x = 0; x < MV_NX; ++x)
    store_aligned(g_norm_ss + x * VEC, splat(0.0f));
}

// x * n of the round's next chunk of each row (into g_norm_x, zero past MV_KC; several rows:
// over x), the squares summed once per round (the GLU's second pass over x adds nothing).
static inline const float *norm_chunk(float *x_rows) {
  set_ggml_rounding();
  const float *n = g_norm_w + (g_norm_chunk % NORM_STEPS) * NORM_KC_PAD;
  const bool first = g_norm_chunk < NORM_STEPS;
#if MV_NX == 1
  float *out = g_norm_x;
#else
  float *out = x_rows;
#endif
  for (int row = 0; row < MV_NX; ++row) {
    const float *x = x_rows + row * MV_KC;
    float *nx = out + row * NORM_KC_PAD;
    vf ss = load_aligned(g_norm_ss + row * VEC);
    for (int i = 0; i < NORM_BODY; i += VEC) {
      vf v = load_aligned(x + i);
      if (first)
        ss = add(ss, mul(v, v));
      store_aligned(nx + i, mul(v, load_aligned(n + i)));
    }
    if constexpr (NORM_BODY < MV_KC) {
      vf v = load_part_zero(x + NORM_BODY, MV_KC - NORM_BODY);
      if (first)
        ss = add(ss, mul(v, v));
      store_aligned(nx + NORM_BODY, mul(v, load_aligned(n + NORM_BODY)));
    }
    store_aligned(g_norm_ss + row * VEC, ss);
  }
  ++g_norm_chunk;
  return out;
}

#if !MV_OUT_F16
void GGML_MV_NORM_ZERO(float *y) {
  for (int r = 0; r < MV_NX * MV_ROWS; ++r)
    y[r] = 0.0f;
  norm_round();
}

void GGML_MV_NORM(GGML_MV_W_T *w, float *x, float *y) { accumulate(w, norm_chunk(x), y); }
#endif

static inline void norm_scale_rows(float *v, vf s) {
  for (int r = 0; r < MV_ROWS; r += VEC) {
    const int n = MV_ROWS - r < (int)VEC ? MV_ROWS - r : (int)VEC;
    store_part(v + r, mul(load_part(v + r, n), s), n);
  }
}

// ggml's RMS_NORM: s = 1 / sqrt(sum(x^2) / K + eps) of the round's x row `row`, in vector
// code (the scalar unit has no floating point), splat over the lanes.
// `eps_bits`: OP_P0 (norm_s), or DECODE_LAYER's attention norm's DL_EPS (mv_decode.h): one
// object holds both norms of a layer.
static inline vf norm_s_of(uint32_t eps_bits, int row = 0) {
  set_ggml_rounding();
  const float eps = __builtin_bit_cast(float, eps_bits);
  const float sum = aie::reduce_add(load_aligned(g_norm_ss + row * VEC));
  const vf mean = mul(splat(sum), 1.0f / MV_NORM_K);
  return recip(sqrt(add(mean, splat(eps))));
}

static inline vf norm_s(int row = 0) { return norm_s_of((uint32_t)OP_P0, row); }

// Each x row's run of MV_ROWS values of v (y or the stash) times the row's s (of the norm
// whose eps is `eps_bits`, norm_s_of's).
static inline void norm_scale_runs(float *v, uint32_t eps_bits = (uint32_t)OP_P0) {
  for (int row = 0; row < MV_NX; ++row)
    norm_scale_rows(v + row * MV_ROWS, norm_s_of(eps_bits, row));
}

#if MV_BIAS && MV_GLU
#error "a bias is added to a projection's rows, not a GLU's"
#endif

#if !MV_OUT_F16
void GGML_MV_NORM_SCALE(float *y) {
  norm_scale_runs(y);
#if MV_GLU
  norm_scale_runs(g_stash);
#endif
#if MV_BIAS
  bias_rows(y);
#endif
}
#endif

#if MV_GLU || MV_OUT_F16
void GGML_MV_NORM_STASH_ZERO() {
  GGML_MV_STASH_ZERO();
  norm_round();
}

void GGML_MV_NORM_STASH(GGML_MV_W_T *w, float *x) { accumulate(w, norm_chunk(x), g_stash); }
#endif

#if MV_OUT_F16
// The f32 sums are scaled first, so the one rounding to f16 is of s * (W . (x * n)).
void GGML_MV_NORM_STORE_F16(uint16_t *y) {
  norm_scale_runs(g_stash);
#if MV_BIAS
  bias_rows(g_stash);
#endif
  GGML_MV_STORE_F16(y);
}
#endif
