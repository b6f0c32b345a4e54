// mv_bias.h: the bias epilogue of RMS_NORM_MUL_MAT_BIAS, RMS_NORM_MUL_MAT_BIAS_ROPE(_FF) and
// their groups of RMS_NORM_QKV_BIAS_ROPE(_FF) (qwen2's Q, K and V biases) in a GEMV core source
// (mv.cc, mvq.cc), included inside its extern "C" block ahead of mv_norm.h, whose scale and
// store functions (and mv_rope.h's) call bias_rows. The including file names the function:
// GGML_MV_BIAS_LOAD.
//
// Once per dispatch, behind n (and the rotation's constants), the x fifo delivers the
// column's bias values of every round (MV_BIAS_COLUMN_ROWS per round, the rounds one after
// the other), then padding; the core keeps its own MV_ROWS values of each round:
//   GGML_MV_BIAS_LOAD(b, offset)   per x object; offset = the core's first row within the
//                                  column's block of a round (i * MV_ROWS)
// At the end of each round, after the norm's scale s and before a rotation or the rounding
// to f16, bias_rows adds the round's values: one f32 addition per value, as ggml's ADD of the
// bias to the f32 product. Rounds are whole (GemvPlan.bias): round j of the dispatch is round
// j % MV_BIAS_ROUNDS of its token, or with MV_NX of its MV_NX tokens, whose runs of MV_ROWS
// values each get the same values (x objects then hold MV_NX * MV_KC words).
// Defines: MV_BIAS_ROUNDS (rounds per token), MV_BIAS_COLUMN_ROWS (a column's rows of a round),
// MV_KC. Static data (per core): mv_bias_bytes (tiling.py).

constexpr int BIAS_WORDS = MV_BIAS_ROUNDS * MV_BIAS_COLUMN_ROWS;
constexpr int BIAS_OBJECT_WORDS = MV_NX * MV_KC;
constexpr int BIAS_OBJECTS = (BIAS_WORDS + BIAS_OBJECT_WORDS - 1) / BIAS_OBJECT_WORDS;
constexpr int BIAS_KEPT = (MV_BIAS_ROUNDS * MV_ROWS + (int)VEC - 1) / (int)VEC * (int)VEC;

alignas(64) static float g_bias[BIAS_KEPT];
static int32_t g_bias_loaded; // objects kept this dispatch (mod BIAS_OBJECTS)
static int32_t g_bias_round;  // rounds given their values this dispatch

void GGML_MV_BIAS_LOAD(float *b, int32_t offset) {
  const int32_t first = g_bias_loaded * BIAS_OBJECT_WORDS;
  if (g_bias_loaded == 0)
    g_bias_round = 0; // a new dispatch
  for (int32_t j = 0; j < BIAS_OBJECT_WORDS && first + j < BIAS_WORDS; ++j) {
    const int32_t w = first + j;
    const int32_t r = w % MV_BIAS_COLUMN_ROWS - offset;
    if (r >= 0 && r < MV_ROWS)
      g_bias[w / MV_BIAS_COLUMN_ROWS * MV_ROWS + r] = b[j];
  }
  g_bias_loaded = (g_bias_loaded + 1) % BIAS_OBJECTS;
}

// v[r] += the round's value of row r, for the MV_ROWS rows of the core's round (of each of
// the MV_NX runs of them in v).
static inline void bias_rows(float *v) {
  const float *b = g_bias + (g_bias_round++ % MV_BIAS_ROUNDS) * MV_ROWS;
  for (int t = 0; t < MV_NX; ++t) {
    float *run = v + t * MV_ROWS;
    for (int r = 0; r < MV_ROWS; r += VEC) {
      const int n = MV_ROWS - r < (int)VEC ? MV_ROWS - r : (int)VEC;
      store_part(run + r, add(load_part(run + r, n), load_part(b + r, n)), n);
    }
  }
}
