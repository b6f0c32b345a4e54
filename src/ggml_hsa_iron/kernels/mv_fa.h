// mv_fa.h: the attention phase of FLASH_ATTN_FFN_<glu> in a GEMV core source (mv.cc, mvq.cc),
// included inside its extern "C" block: ggml's FLASH_ATTN_EXT of FA_T query rows (a decode
// step's tokens, of one KV cache or of FA_S caches, one per sequence, FA_T / FA_S rows each)
// for this core's FA_GH q heads of a KV head, computed from objects of the
// GEMV's own x fifo (FA_XW = MV_NX x MV_KC 32-bit words each: the GEMV takes the FA_T = MV_NX
// tokens' rows at once) and written as objects of its y fifo (MV_NX x MV_ROWS f32), so that
// the attention needs no fifo, channel or program of its own (designs/ffn.py,
// plans_fa_ffn.py).
//
// Per KV head (a round of the phase) the column's x stream carries, each piece padded to
// whole objects (the q rows and the mask words by repeating them; K and V are whole objects,
// each FA_K_KEYS (FA_V_KEYS) keys of the chunk: its rows read as runs of FA_K_PART_ROWS
// consecutive rows, run j from key j FA_K_PART_STEP of the object, overlapping where the object
// holds more rows than keys; each key is taken once, from the first run that holds it):
//   per token the group's FA_GQ q rows (f32, FA_D each; this core keeps FA_GH of them from
//   word `first` of each token's), then per stream (its cache, its tokens) the keys in FA_NC
//   chunks of n_kv / FA_NC keys, each as every one of its tokens' part of its mask row (f16,
//   all repeated FA_M_REP times), its K rows (FA_K_ROW_WORDS words each, of type FA_K_TYPE),
//   then its V rows (FA_V_ROW_WORDS words, FA_V_TYPE).
// A row of the core's state is a (token, head) pair, FA_R = FA_T x FA_GH of them, token-major;
// a stream's are FA_RS consecutive ones, whose scores the core keeps while its chunks pass.
// n_kv is an argument of the round's first q object, not a define: a kernel whose KV length
// is given at dispatch runs every length with one core program.
// The softmax is online over the chunks: the core keeps one chunk's scores (FA_RS x FA_CHUNK
// f32, FA_CHUNK the largest chunk), the running maximum m and sum l per row, and the
// accumulators. Once a chunk's last K object is in, its maximum updates m, the sums and
// accumulators so far are rescaled by exp(m_old - m) (only when m grew), and its scores become
// p_j = exp(s_j - m); its V objects then add p_j V_j. With one chunk this is the two-pass
// softmax exactly.
//
// ggml-cpu's semantics (as flash_attn.cc, whose row helpers fa_rows.h this shares): q rounded
// to K's type; s = scale q.k, softcap * tanh(s) with a softcap (the scale already divided by
// it), + mask; a key whose mask is -inf for every token is skipped (its K and V rows are never
// read: they may hold anything); out = sum p_j V_j / sum p_j, 0 for a row whose every key is
// masked.
//
// Defines (plans_fa_ffn.FaPhase.defines): FA_D, FA_DV, FA_CHUNK, FA_NC, FA_GQ, FA_GH, FA_T, FA_S,
// FA_K_TYPE, FA_V_TYPE (0 f32, 1 f16, 2 bf16), FA_K_ROW_WORDS, FA_V_ROW_WORDS, FA_K_KEYS,
// FA_K_PART_ROWS, FA_K_PART_STEP, FA_V_KEYS, FA_V_PART_ROWS, FA_V_PART_STEP, FA_SCALE,
// FA_SOFTCAP (f32 bits), FA_Q_OBJECTS, FA_M_REP. The including file names the
// functions: GGML_MV_FA_Q, GGML_MV_FA_MASK, GGML_MV_FA_K, GGML_MV_FA_V, GGML_MV_FA_OUT:
//   GGML_MV_FA_Q(x, first, n_kv)   one object of the q rows; the first starts the KV head's
//                            round over n_kv keys
//   GGML_MV_FA_MASK(x)       one object of the chunk's mask words: the scores of a token's
//                            heads start as its row
//   GGML_MV_FA_K(x)          one object of K rows: their scores; after the chunk's last, the
//                            chunk's softmax step
//   GGML_MV_FA_V(x)          one object of V rows: acc += p_j V_j; after the chunk's last, the
//                            next chunk starts
//   GGML_MV_FA_OUT(y)        the next MV_ROWS outputs of a head (head by head, FA_DV / MV_ROWS
//                            objects each) for each token, divided by the row's sum
// fa_rows.h (templates: C++ linkage) is included by the including file at file scope.

static_assert(FA_T == MV_NX, "the tokens are the GEMV's activation rows");
constexpr int FA_XW = MV_NX * MV_KC;
static_assert(FA_XW % FA_K_ROW_WORDS == 0 && FA_XW % FA_V_ROW_WORDS == 0,
              "an x object holds whole K and V rows");
static_assert(FA_DV % MV_ROWS == 0, "a head's outputs are whole y objects");

constexpr int FA_DP = (FA_D + (int)VEC - 1) / (int)VEC * (int)VEC;
constexpr int FA_DVP = (FA_DV + (int)VEC - 1) / (int)VEC * (int)VEC;
constexpr int FA_NP = (FA_CHUNK + (int)VEC - 1) / (int)VEC * (int)VEC;
constexpr int FA_ROWP = FA_DP > FA_DVP ? FA_DP : FA_DVP;
constexpr int FA_K_PER_OBJ = FA_XW / FA_K_ROW_WORDS; // rows of an object
constexpr int FA_V_PER_OBJ = FA_XW / FA_V_ROW_WORDS;
static_assert(FA_K_PER_OBJ % FA_K_PART_ROWS == 0 && FA_V_PER_OBJ % FA_V_PART_ROWS == 0,
              "an object's rows are whole runs");
static_assert((FA_K_PER_OBJ / FA_K_PART_ROWS - 1) * FA_K_PART_STEP + FA_K_PART_ROWS == FA_K_KEYS &&
                  (FA_V_PER_OBJ / FA_V_PART_ROWS - 1) * FA_V_PART_STEP + FA_V_PART_ROWS == FA_V_KEYS,
              "the runs end at the object's last key");
constexpr int FA_OUT_PER_HEAD = FA_DV / MV_ROWS;
static_assert(FA_T % FA_S == 0, "every stream has the same query rows");
constexpr int FA_TS = FA_T / FA_S;
constexpr int FA_R = FA_T * FA_GH;
constexpr int FA_RS = FA_TS * FA_GH;
// Rows decoded in pair order (fa_rows::in_pairs): q kept in K's order, the accumulators in
// V's, put back in order by GGML_MV_FA_OUT.
constexpr bool FA_K_PAIRS = fa_rows::in_pairs<FA_K_TYPE, FA_D>;
constexpr bool FA_V_PAIRS = fa_rows::in_pairs<FA_V_TYPE, FA_DV>;

alignas(64) static float g_fa_q[FA_R * FA_DP];     // this core's q rows, rounded (tail 0)
alignas(64) static float g_fa_s[FA_RS * FA_NP];    // a chunk's scores, then its p_j (tail -inf)
alignas(64) static float g_fa_acc[FA_R * FA_DVP];  // sum p_j V_j per row
alignas(64) static float g_fa_row[FA_ROWP];        // the current K or V row, decoded
alignas(64) static float g_fa_dots[FA_RS * VEC];   // a vector of keys' q.k per row
static float g_fa_max[FA_R];                       // per row the running maximum m
static float g_fa_sum[FA_R];                       // per row its sum of p_j (scaled to m)
static int32_t g_fa_q_obj, g_fa_m_obj, g_fa_k_obj, g_fa_v_obj, g_fa_out_obj;
// The stream whose chunks pass (its rows start at row g_fa_row0), and its chunks so far.
static int32_t g_fa_row0, g_fa_chunks;
// A chunk's keys, rounded up to whole vectors, and its mask, K and V objects.
static int32_t g_fa_chunk, g_fa_np, g_fa_m_objects, g_fa_k_objects, g_fa_v_objects;

static inline bool fa_is_neg_inf(float x) { return fa_rows::float_bits(x) == fa_rows::NEG_INF; }

#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
// aie2: q.k and p V from bf16 pieces (fa_rows::pieces), q split once per round, a K or V row
// once per key, p into three pieces per key and row.
constexpr int FA_PK = fa_rows::pieces(FA_K_TYPE), FA_PV = fa_rows::pieces(FA_V_TYPE);
using fa_rows::bvec;
alignas(64) static bfloat16 g_fa_qp[FA_R * FA_PK * FA_DP]; // per row its q pieces
alignas(64) static bfloat16 g_fa_rp[3 * FA_ROWP];          // the current K or V row's pieces
#endif

// A chunk starts: no scores (every lane -inf until the mask words set the keys').
static void fa_chunk_start() {
  const vf ninf = from_bits(splat_i((int32_t)fa_rows::NEG_INF));
  for (int t = 0; t < FA_RS; ++t)
    for (int i = 0; i < g_fa_np; i += VEC)
      aie::store_v(g_fa_s + t * FA_NP + i, ninf);
  g_fa_m_obj = g_fa_k_obj = g_fa_v_obj = 0;
}

// A KV head's round over n_kv keys in FA_NC chunks starts: no maximum, no sums.
static void fa_round(int32_t n_kv) {
  g_fa_chunk = n_kv / FA_NC;
  g_fa_np = (g_fa_chunk + (int)VEC - 1) / (int)VEC * (int)VEC;
  g_fa_m_objects = FA_M_REP * FA_TS * ((g_fa_chunk + 1) / 2) / FA_XW;
  g_fa_k_objects = g_fa_chunk / FA_K_KEYS;
  g_fa_v_objects = g_fa_chunk / FA_V_KEYS;
  for (int i = 0; i < FA_R * FA_DVP; i += VEC)
    aie::store_v(g_fa_acc + i, splat(0.0f));
  for (int t = 0; t < FA_R; ++t) {
    g_fa_max[t] = fa_rows::bits_to_float(fa_rows::NEG_INF);
    g_fa_sum[t] = 0.0f;
  }
  g_fa_out_obj = 0;
  g_fa_row0 = g_fa_chunks = 0;
  fa_chunk_start();
}

// A chunk's scores are complete: per row of its stream the new maximum m (the chunk's or the
// one before), the sum and accumulators so far rescaled to it, the scores to p_j =
// exp(s_j - m). A row whose keys so far are all masked keeps p = 0 everywhere (its sum 0: its
// output is 0).
static void fa_softmax() {
  for (int r = 0; r < FA_RS; ++r) {
    const int t = g_fa_row0 + r;
    float *s = g_fa_s + r * FA_NP;
    vf vmax = from_bits(splat_i((int32_t)fa_rows::NEG_INF));
    for (int j = 0; j < g_fa_np; j += VEC)
      vmax = fmax(vmax, load_aligned(s + j));
    const float old = g_fa_max[t];
    const float top = max_lanes(vmax);
    const float m = old < top ? top : old;
    vf psum = splat(0.0f);
    if (fa_is_neg_inf(m)) {
      for (int j = 0; j < g_fa_np; j += VEC)
        aie::store_v(s + j, splat(0.0f));
      continue;
    }
    if (fa_rows::float_bits(m) != fa_rows::float_bits(old)) {
      // exp(old - m) < 1 (0 when old is -inf: nothing was added yet).
      const vf alpha = exp_nonpos(sub(splat(old), splat(m)));
      const Factor alpha_f = factor(alpha);
      float *acc = g_fa_acc + t * FA_DVP;
      for (int i = 0; i < FA_DVP; i += VEC)
        aie::store_v(acc + i, mul(load_aligned(acc + i), alpha_f));
      g_fa_sum[t] *= lane0(alpha);
      g_fa_max[t] = m;
    }
    const vf mm = splat(m);
    for (int j = 0; j < g_fa_np; j += VEC) {
      vf p = exp_nonpos(sub(load_aligned(s + j), mm)); // masked keys and the tail: 0
      aie::store_v(s + j, p);
      psum = add(psum, p);
    }
    g_fa_sum[t] += aie::reduce_add(psum);
  }
}

void GGML_MV_FA_Q(float *x, int32_t first, int32_t n_kv) {
  if (g_fa_q_obj == 0)
    fa_round(n_kv);
  // The object's words w of the tokens' group q rows (FA_GQ * FA_D words a token); this
  // core's FA_GH rows of a token are its words first .. first + FA_GH * FA_D (the repeats
  // padding the last object lie beyond FA_T * FA_GQ * FA_D).
  const int o = g_fa_q_obj;
  const uint32_t *b = reinterpret_cast<const uint32_t *>(x);
  for (int i = 0; i < FA_XW; ++i) {
    const int w = o * FA_XW + i;
    const int t = w / (FA_GQ * FA_D), e = w % (FA_GQ * FA_D) - first;
    if (t < FA_T && e >= 0 && e < FA_GH * FA_D)
      g_fa_q[(t * FA_GH + e / FA_D) * FA_DP + (FA_K_PAIRS ? HalfPairs::slot(e % FA_D) : e % FA_D)] =
          fa_rows::round_q<FA_K_TYPE>(fa_rows::bits_to_float(b[i]));
  }
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
  if (o == FA_Q_OBJECTS - 1)
    for (int u = 0; u < FA_R; ++u)
      fa_rows::split<FA_PK>(g_fa_q + u * FA_DP, FA_DP, g_fa_qp + u * FA_PK * FA_DP, FA_DP);
#endif
  g_fa_q_obj = (o + 1) % FA_Q_OBJECTS;
}

void GGML_MV_FA_MASK(float *x) {
  // 2 FA_XW f16 values an object of the stream's tokens' chunk rows, token-major; the values
  // past the last token's (repeats) are not read.
  const uint16_t *m = reinterpret_cast<const uint16_t *>(x);
  const int p0 = g_fa_m_obj * 2 * FA_XW;
  for (int i = 0; i < 2 * FA_XW && p0 + i < FA_TS * g_fa_chunk;) {
    const int t = (p0 + i) / g_fa_chunk, key = (p0 + i) % g_fa_chunk;
    int n = 2 * FA_XW - i < (int)VEC ? 2 * FA_XW - i : (int)VEC;
    n = g_fa_chunk - key < n ? g_fa_chunk - key : n;
    const vf mv = load_f16_zero(m + i, n);
    for (int h = 0; h < FA_GH; ++h)
      store_part(g_fa_s + (t * FA_GH + h) * FA_NP + key, mv, n);
    i += n;
  }
  g_fa_m_obj = (g_fa_m_obj + 1) % g_fa_m_objects;
}

// The scores of keys key0 .. key0 + keys of the chunk, their K rows consecutive from `rows`.
static void fa_k_keys(const int32_t *rows, int key0, int keys) {
  const float scale = fa_rows::bits_to_float((uint32_t)FA_SCALE);
  const float softcap = fa_rows::bits_to_float((uint32_t)FA_SOFTCAP);
  const HalfPairs halves;
  for (int j0 = 0; j0 < keys; j0 += VEC) {
    const int n = keys - j0 < (int)VEC ? keys - j0 : (int)VEC;
    for (int i = 0; i < FA_RS * (int)VEC; i += VEC)
      aie::store_v(g_fa_dots + i, splat(0.0f));
    for (int j = 0; j < n; ++j) {
      // A token's mask row is its heads' (their scores start as it): a key masked for every
      // token is not read, its scores stay -inf (0 * scale + -inf).
      const int key = key0 + j0 + j;
      bool used = false;
      for (int t = 0; t < FA_TS && !used; ++t)
        used = !fa_is_neg_inf(g_fa_s[t * FA_GH * FA_NP + key]);
      if (!used)
        continue;
      fa_rows::decode_kv_row<FA_K_TYPE, FA_D>(halves, rows + (j0 + j) * FA_K_ROW_WORDS, g_fa_row);
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
      fa_rows::split<FA_PK>(g_fa_row, FA_DP, g_fa_rp, FA_ROWP);
      for (int t = 0; t < FA_RS; ++t) {
        const bfloat16 *q = g_fa_qp + (g_fa_row0 + t) * FA_PK * FA_DP;
        auto s = aie::zeros<accfloat, VEC>();
        for (int i = 0; i < FA_DP; i += VEC) {
          bvec kp[3], qp[3];
          fa_rows::load_pieces<FA_PK>(g_fa_rp + i, FA_ROWP, kp);
          fa_rows::load_pieces<FA_PK>(q + i, FA_DP, qp);
          fa_rows::mac_pieces<FA_PK, FA_PK>(s, kp, qp);
        }
        g_fa_dots[t * VEC + j] = aie::reduce_add(s.template to_vector<float>());
      }
#else
      // The products rounded and summed lane by lane in the accumulator.
      for (int t = 0; t < FA_RS; ++t) {
        const float *q = g_fa_q + (g_fa_row0 + t) * FA_DP;
        auto s = aie::mul(load_aligned(g_fa_row), load_aligned(q));
#pragma GCC unroll 8
        for (int i = VEC; i < FA_D; i += VEC)
          s = aie::mac(s, load_aligned(g_fa_row + i), load_aligned(q + i));
        g_fa_dots[t * VEC + j] = aie::reduce_add(s.template to_vector<float>());
      }
#endif
    }
    const Factor scale_f = factor(splat(scale));
    for (int t = 0; t < FA_RS; ++t) {
      float *sc = g_fa_s + t * FA_NP + key0 + j0;
      vf s = mul(load_aligned(g_fa_dots + t * VEC), scale_f);
      if (fa_rows::float_bits(softcap) != 0)
        s = mul(tanh(s), softcap);
      store_part(sc, add(s, load_part(sc, n)), n);
    }
  }
}

// An object's runs of rows (run j from its key j * step): each key from the first run that
// holds it, the keys run j adds starting where run j - 1 ended.
static void fa_runs(const float *x, int key0, int parts, int part_rows, int step, int row_words,
                    void (*keys_fn)(const int32_t *, int, int)) {
  const int32_t *rows = reinterpret_cast<const int32_t *>(x);
  for (int j = 0, done = 0; j < parts; ++j) {
    const int first = j * step, end = first + part_rows;
    keys_fn(rows + (j * part_rows + done - first) * row_words, key0 + done, end - done);
    done = end;
  }
}

void GGML_MV_FA_K(float *x) {
  set_ggml_rounding(); // aie2's f32 multiply splits into bf16 pieces rounded to nearest
  fa_runs(x, g_fa_k_obj * FA_K_KEYS, FA_K_PER_OBJ / FA_K_PART_ROWS, FA_K_PART_ROWS,
          FA_K_PART_STEP, FA_K_ROW_WORDS, fa_k_keys);
  if (++g_fa_k_obj == g_fa_k_objects)
    fa_softmax();
}

// acc += p_j V_j for keys key0 .. key0 + keys of the chunk, their V rows consecutive from
// `rows`.
static void fa_v_keys(const int32_t *rows, int key0, int keys) {
  const HalfPairs halves;
  for (int j = 0; j < keys; ++j) {
    const int key = key0 + j;
    bool used = false;
    for (int t = 0; t < FA_RS && !used; ++t)
      used = fa_rows::float_bits(g_fa_s[t * FA_NP + key]) != 0;
    if (!used)
      continue; // p = 0 for every row: a masked key (its V row may be NaN) or a negligible one
    fa_rows::decode_kv_row<FA_V_TYPE, FA_DV>(halves, rows + j * FA_V_ROW_WORDS, g_fa_row);
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
    fa_rows::split<FA_PV>(g_fa_row, FA_DVP, g_fa_rp, FA_ROWP);
#endif
    for (int t = 0; t < FA_RS; ++t) {
      const float pj = g_fa_s[t * FA_NP + key];
      if (fa_rows::float_bits(pj) == 0)
        continue;
      float *acc = g_fa_acc + (g_fa_row0 + t) * FA_DVP;
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
      // p's three pieces (splat: the same for every part of the row) times the row's: p V_j
      // rounded once. (Split here rather than kept per chunk: their memory would shorten the
      // chunks, which costs more at long contexts.)
      bvec pp[3];
      split3(splat(pj), pp[0], pp[1], pp[2]);
      for (int i = 0; i < FA_DVP; i += VEC) {
        bvec vp[3];
        fa_rows::load_pieces<FA_PV>(g_fa_rp + i, FA_ROWP, vp);
        aie::store_v(acc + i, add(aie::load_v<VEC>(acc + i), fa_rows::product<FA_PV, 3>(vp, pp)));
      }
#else
      const vf p = splat(pj);
#pragma GCC unroll 8
      for (int i = 0; i < FA_DV; i += VEC)
        aie::store_v(acc + i, add(aie::load_v<VEC>(acc + i), mul(load_aligned(g_fa_row + i), p)));
#endif
    }
  }
}

void GGML_MV_FA_V(float *x) {
  set_ggml_rounding();
  fa_runs(x, g_fa_v_obj * FA_V_KEYS, FA_V_PER_OBJ / FA_V_PART_ROWS, FA_V_PART_ROWS,
          FA_V_PART_STEP, FA_V_ROW_WORDS, fa_v_keys);
  if (++g_fa_v_obj == g_fa_v_objects) {
    if (++g_fa_chunks == FA_NC) { // the stream's last chunk: the next stream's rows
      g_fa_chunks = 0;
      g_fa_row0 = (g_fa_row0 + FA_RS) % FA_R;
    }
    fa_chunk_start(); // the next chunk's (after the round's last: the next round resets)
  }
}

void GGML_MV_FA_OUT(float *y) {
  // Object (head j, part s): per token t the MV_ROWS outputs s MV_ROWS .. of row (t, j).
  set_ggml_rounding();
  const int j = g_fa_out_obj / FA_OUT_PER_HEAD;
  const int e0 = (g_fa_out_obj % FA_OUT_PER_HEAD) * MV_ROWS;
  for (int t = 0; t < FA_T; ++t) {
    const int u = t * FA_GH + j;
    const float *acc = g_fa_acc + u * FA_DVP + e0;
    alignas(64) float ordered[FA_V_PAIRS ? MV_ROWS : 1];
    if constexpr (FA_V_PAIRS) {
      for (int r = 0; r < MV_ROWS; ++r)
        ordered[r] = g_fa_acc[u * FA_DVP + HalfPairs::slot(e0 + r)];
      acc = ordered;
    }
    const float sum = g_fa_sum[u];
    const vf inv = fa_rows::float_bits(sum) == 0 ? splat(0.0f) : recip(splat(sum));
    for (int r = 0; r < MV_ROWS; r += VEC) {
      const int n = MV_ROWS - r < (int)VEC ? MV_ROWS - r : (int)VEC;
      store_part(y + t * MV_ROWS + r, mul(load_part(acc + r, n), inv), n);
    }
  }
  g_fa_out_obj = (g_fa_out_obj + 1) % (FA_GH * FA_OUT_PER_HEAD);
}
