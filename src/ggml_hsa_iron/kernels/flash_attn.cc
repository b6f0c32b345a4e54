// flash_attn.cc: ggml's FLASH_ATTN_EXT on the cores of a column (aie2 / aie2p), one block of
// FA_GH x FA_GR query rows (FA_GR consecutive rows of FA_GH heads sharing one KV head) at a
// time: the block's K and V rows go to its FA_GH cores at once, core j computing head j's
// G = FA_GR rows (the online softmax of all of them over each chunk of K and V rows), so K
// and V are read once per block.
//
// Built once per kernel with Peano; the design (designs/flash_attn.py, plan plans_fa.py) sets:
//   FA_D, FA_DV        head sizes of q/K and of V
//   FA_NKV, FA_CHUNK   K/V rows per block, rows per object (FA_NKV / FA_CHUNK objects per block)
//   FA_K_TYPE, FA_V_TYPE   0 f32, 1 f16, 2 bf16
//   FA_A_WORDS, FA_B_WORDS 32-bit words of an object of fifo A (K chunks, mask, sinks) and
//                      of fifo B (V chunks, q)
//   FA_GH, FA_GR       heads (and cores) and query rows of a block; its row r FA_GH + j is
//                      query row r of head h0 + j (the output's order), core j's row r
//   FA_NHB             head blocks (block b's first head is (b % FA_NHB) FA_GH)
//   FA_Q_OBJECTS       objects of the block's q rows on fifo B (G rows of FA_D, repeated to
//                      whole objects)
//   HAS_MASK, FA_M_WORDS, FA_M_OBJECTS   the block's f16 mask span: its words (the most, with
//                      the KV length given at dispatch), its objects; row r of the block's rows
//                      reads mask row r of the span (the mask is broadcast over the block's
//                      heads), rows ggml_fa_begin's m_stride values apart
//   FA_BLOCKS, FA_M_SKIPS  per block, the f16 values of its span before its first row (one
//                      when rows of an odd length start mid-word, more at the buffer's end;
//                      0 for every block when undefined)
//   HAS_SINKS, FA_S_OBJECTS  every head's sink (FA_N_HEAD f32, then padding), once per core
//   FA_N_HEAD          heads
//   FA_SCALE, FA_SOFTCAP   f32 bit patterns (the scale already divided by the softcap)
//   ALIBI_SLOPES       the slope of every head (max_bias > 0)
//
// Functions (arguments as the object fifos deliver them, 32-bit words):
//   ggml_fa_begin(first, step, head, m_stride)   the core's first block, the block stride
//                                (columns), its head within a block (its row of the column's
//                                cores) and the values between two mask rows (the mask's ne0:
//                                n_kv when the KV length is given at dispatch)
//   ggml_fa_sinks(a)             one object of the sinks (FA_S_OBJECTS, before the blocks)
//   ggml_fa_q(b)                 one object of the block's q rows (fifo B); the core's head's
//                                rows kept in static data
//   ggml_fa_side(a)              one object of the block's mask span (fifo A), kept likewise
//   ggml_fa_chunk(a, b)          FA_CHUNK K rows (a) and V rows (b), for all G rows
//   ggml_fa_out(o)               the core's next output row (FA_DV f32); after G rows the
//                                next block
//
// ggml-cpu's semantics: q rounded to K's type, s = scale * q.k; softcap * tanh(s) with a
// softcap; + slope(head) * mask (keys whose mask is -inf are skipped, their V rows never used);
// softmax with the sink as one more logit without a value; an empty row (every key masked,
// no sink) is 0. Scores of a chunk share one rescaling of a row's accumulator (ggml rescales
// per key: the same sums, rounded differently). Everything is f32 on the vector unit (on aie2,
// which multiplies bf16 only, q.k and p V are sums of exact products of bf16 pieces: fa_rows.h);
// each row's arithmetic is that of a block of one row (a K or V row is decoded once per chunk
// for the G rows, to the same f32 values).

#include "ggml_aie.h"

#ifndef FA_D
#error "FA_D must be defined"
#endif

using namespace ggml_aie;

static constexpr int G = FA_GR; // this core's rows of a block: its head's
static constexpr int K_ROW_WORDS = FA_A_WORDS / FA_CHUNK;
static constexpr int V_ROW_WORDS = FA_B_WORDS / FA_CHUNK;
// Rows of the static arrays padded to whole vectors (aligned loads; the pad lanes stay 0).
static constexpr int DP = (FA_D + (int)VEC - 1) / (int)VEC * (int)VEC;
static constexpr int DVP = (FA_DV + (int)VEC - 1) / (int)VEC * (int)VEC;
static constexpr int CP = (FA_CHUNK + (int)VEC - 1) / (int)VEC * (int)VEC;

alignas(64) static float q_rows[G * DP];
alignas(64) static float acc[G * DVP];
alignas(64) static float scores[G * CP];
alignas(64) static float k_row[DP]; // the chunk's current K row, decoded
// V rows decoded V_BATCH at a time, so that each row's accumulators take all of them at once
// (on aie2p in the accumulator registers).
static constexpr int V_BATCH =
    FA_CHUNK % 8 == 0 ? 8 : FA_CHUNK % 4 == 0 ? 4 : FA_CHUNK % 2 == 0 ? 2 : 1;
alignas(64) static float v_rows[V_BATCH * DVP];
// Rows padded to whole vectors: the running maxima are rescaled VEC rows at a time.
static constexpr int GV = (G + (int)VEC - 1) / (int)VEC * (int)VEC;
alignas(64) static float run_max[GV];
static float run_sum[G];
#if HAS_MASK
alignas(64) static uint32_t mask_words[FA_M_WORDS + VEC / 2];
#endif
#if HAS_SINKS
static float sinks[FA_N_HEAD];
#endif
static int32_t block, block_step, head, q_object, side_object, sink_object, kv_row, mask_skip,
    out_row, m_stride;

// The f16 values of the block's mask span before its first row.
static inline int32_t block_mask_skip() {
#ifdef FA_M_SKIPS
  static const uint16_t skips[FA_BLOCKS] = {FA_M_SKIPS};
  return block < FA_BLOCKS ? skips[block] : 0;
#else
  return 0;
#endif
}

#include "fa_rows.h"

using fa_rows::bits_to_float;
using fa_rows::float_bits;
using fa_rows::F16_NEG_INF;
using fa_rows::NEG_INF;

// Rows decoded in pair order (fa_rows::in_pairs): q kept in K's order, the accumulators in
// V's, put back in order by ggml_fa_out.
static constexpr bool K_PAIRS = fa_rows::in_pairs<FA_K_TYPE, FA_D>;
static constexpr bool V_PAIRS = fa_rows::in_pairs<FA_V_TYPE, FA_DV>;

#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
// aie2: q.k and p V from bf16 pieces (fa_rows::pieces): the q rows split once per block, a K
// or V row once per chunk, a row's probabilities once per chunk.
static constexpr int PK = fa_rows::pieces(FA_K_TYPE), PV = fa_rows::pieces(FA_V_TYPE);
using fa_rows::bvec;
alignas(64) static bfloat16 q_pieces[G * PK * DP];
alignas(64) static bfloat16 k_pieces[PK * DP];
alignas(64) static bfloat16 v_pieces[V_BATCH * PV * DVP];
alignas(64) static bfloat16 p_pieces[G * 3 * CP];
#endif

// q rounded to K's type, as ggml-cpu converts q before the dot product.
static inline float round_q(float x) { return fa_rows::round_q<FA_K_TYPE>(x); }

static inline int block_head0() { return (block % FA_NHB) * FA_GH; }

static void reset_block() {
  q_object = 0;
  side_object = 0;
  kv_row = 0;
  out_row = 0;
  mask_skip = block_mask_skip();
  for (int g = 0; g < G; ++g) {
    run_max[g] = bits_to_float(NEG_INF);
    run_sum[g] = 0.0f;
  }
  for (int g = G; g < GV; ++g)
    run_max[g] = 0.0f;
  for (int i = 0; i < G * DVP; i += VEC)
    aie::store_v(acc + i, splat(0.0f));
}

// How the mask treats a row's keys of the chunk: it hides every one (-inf), none (SEEN_ZERO:
// none, and adds 0 to every score), or some (then tested key by key).
enum : uint8_t { SEEN_NONE, SEEN_ALL, SEEN_ZERO, SEEN_SOME };

#ifdef ALIBI_SLOPES
// Every head's ALiBi slope (f32 bits), the block's heads from block_head0().
static const uint32_t alibi_slopes[] = {ALIBI_SLOPES};
#endif

#if HAS_MASK
// Row g's mask value of the chunk's key j.
static inline uint16_t mask_value(int g, int j) {
  return reinterpret_cast<const uint16_t *>(mask_words)[mask_skip + g * m_stride + kv_row + j];
}

static inline bool hides(int head_of_block) {
#ifdef ALIBI_SLOPES
  return greater(bits_to_float(alibi_slopes[head_of_block]), 0.0f); // slope * -inf stays -inf
#else
  (void)head_of_block;
  return true;
#endif
}

static inline bool hidden(int g, int j) { return mask_value(g, j) == F16_NEG_INF; }

// The row's hidden keys and zeros counted a vector of words (2 VEC values) at a time where
// they start at a word, one by one otherwise.
static uint8_t row_seen(int g) {
  const int first = mask_skip + g * m_stride + kv_row;
  int n_inf = 0, n_zero = 0;
  if (FA_CHUNK % (2 * (int)VEC) == 0 && first % 2 == 0) {
    const int32_t *w = reinterpret_cast<const int32_t *>(mask_words) + first / 2;
    const vi lo_inf = splat_i(F16_NEG_INF), hi_inf = splat_i(int32_t(uint32_t(F16_NEG_INF) << 16));
    const vi lo = splat_i(0xffff), hi = splat_i(int32_t(0xffff0000u));
    const vi one = splat_i(1), zero = splat_i(0);
    vi infs = zero, zeros = zero;
    for (int i = 0; i < FA_CHUNK / 2; i += VEC) {
      const vi x = aie::load_unaligned_v<VEC>(w + i);
      const vi xl = aie::bit_and(x, lo), xh = aie::bit_and(x, hi);
      infs = aie::add(infs, pick_i(aie::eq(xl, lo_inf), one, zero));
      infs = aie::add(infs, pick_i(aie::eq(xh, hi_inf), one, zero));
      zeros = aie::add(zeros, pick_i(aie::eq(xl, zero), one, zero));
      zeros = aie::add(zeros, pick_i(aie::eq(xh, zero), one, zero));
    }
    n_inf = aie::reduce_add(infs);
    n_zero = aie::reduce_add(zeros);
  } else {
    for (int j = 0; j < FA_CHUNK; ++j) {
      n_inf += hidden(g, j);
      n_zero += mask_value(g, j) == 0;
    }
  }
  if (n_zero == FA_CHUNK)
    return SEEN_ZERO;
  if (!hides(block_head0() + head) || n_inf == 0)
    return SEEN_ALL;
  return n_inf == FA_CHUNK ? SEEN_NONE : SEEN_SOME;
}
#else
static inline bool hidden(int, int) { return false; }
static inline uint8_t row_seen(int) { return SEEN_ZERO; }
#endif

extern "C" {

void ggml_fa_begin(int32_t first, int32_t step, int32_t core_head, int32_t mask_stride) {
  m_stride = mask_stride;
  block = first;
  block_step = step;
  head = core_head;
  sink_object = 0;
  reset_block();
}

void ggml_fa_sinks(int32_t *a) {
#if HAS_SINKS
  // The sinks are the stream's first FA_N_HEAD words; the rest of the last object pads.
  const int o = sink_object++;
  for (int w = o * FA_A_WORDS; w < (o + 1) * FA_A_WORDS && w < FA_N_HEAD; ++w)
    sinks[w] = bits_to_float((uint32_t)a[w - o * FA_A_WORDS]);
#else
  (void)a;
#endif
}

void ggml_fa_q(int32_t *b) {
  // The block's q rows, FA_D words each, back to back in the output's order (then repeated):
  // row r of head j is row r FA_GH + j; this core keeps its head's (the object's rows that
  // are, whole or in part).
  const int o = q_object++;
  const int w0 = o * FA_B_WORDS, w1 = w0 + FA_B_WORDS < FA_GH * G * FA_D ? w0 + FA_B_WORDS
                                                                         : FA_GH * G * FA_D;
  for (int row = w0 / FA_D; row * FA_D < w1; ++row) {
    if (row % FA_GH != head)
      continue;
    float *dst = q_rows + row / FA_GH * DP;
    const int d0 = w0 > row * FA_D ? w0 - row * FA_D : 0;
    const int d1 = w1 < (row + 1) * FA_D ? w1 - row * FA_D : FA_D;
    for (int d = d0; d < d1; ++d)
      dst[K_PAIRS ? HalfPairs::slot(d) : d] =
          round_q(bits_to_float((uint32_t)b[row * FA_D + d - w0]));
  }
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
  if (o == FA_Q_OBJECTS - 1)
    for (int g = 0; g < G; ++g)
      fa_rows::split<PK>(q_rows + g * DP, DP, q_pieces + g * PK * DP, DP);
#endif
}

void ggml_fa_side(int32_t *a) {
#if HAS_MASK
  // Whole vectors of the span copied as vectors, the rest word by word.
  const int w0 = side_object++ * FA_A_WORDS;
  const int n = FA_M_WORDS - w0 < FA_A_WORDS ? FA_M_WORDS - w0 : FA_A_WORDS;
  int w = 0;
  for (; w + (int)VEC <= n; w += VEC)
    aie::store_v(mask_words + w0 + w, aie::load_v<VEC>(reinterpret_cast<uint32_t *>(a) + w));
  for (; w < n; ++w)
    mask_words[w0 + w] = (uint32_t)a[w];
#else
  (void)a;
#endif
}

void ggml_fa_chunk(int32_t *a, int32_t *b) {
  set_ggml_rounding(); // aie2's f32 multiply splits into bf16 pieces rounded to nearest
  const float scale = bits_to_float((uint32_t)FA_SCALE);
  const float softcap = bits_to_float((uint32_t)FA_SOFTCAP);
  const HalfPairs halves;
  const int h0 = block_head0();
  // A key whose mask value is -inf for a row adds nothing to it: ggml-cpu skips it before its
  // dot product (with ALiBi, where a positive slope keeps it -inf). Its score is left 0,
  // which the mask makes -inf below; a key hidden from every row is not decoded, and a chunk
  // hidden from every row is skipped whole (a causal mask hides about half of a prompt's).
  for (int i = 0; i < G * CP; i += VEC)
    aie::store_v(scores + i, splat(0.0f));
  uint8_t seen[G];
  bool chunk_seen = false, every_key = false;
  for (int g = 0; g < G; ++g) {
    seen[g] = row_seen(g);
    chunk_seen = chunk_seen || seen[g] != SEEN_NONE;
    every_key = every_key || seen[g] == SEEN_ALL || seen[g] == SEEN_ZERO;
  }
  if (!chunk_seen) {
    kv_row += FA_CHUNK;
    return;
  }
  // The raw dot products q.k of the chunk's rows with every row of the block: each K row
  // decoded once (on aie2 split into pieces once), its vectors held in registers for all the
  // rows (up to K_HELD of them; longer rows are loaded again for each row).
#if !defined(__AIE_ARCH__) || __AIE_ARCH__ != 20
  constexpr int K_VECS = DP / (int)VEC;
  constexpr int K_HELD = 8;
  constexpr bool HOLD = K_VECS <= K_HELD;
#endif
  for (int j = 0; j < FA_CHUNK; ++j) {
    bool key_seen = every_key;
    for (int g = 0; g < G && !key_seen; ++g)
      key_seen = seen[g] == SEEN_SOME && !hidden(g, j);
    if (!key_seen)
      continue;
    fa_rows::decode_kv_row<FA_K_TYPE, FA_D>(halves, a + j * K_ROW_WORDS, k_row);
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
    fa_rows::split<PK>(k_row, DP, k_pieces, DP);
    for (int g = 0; g < G; ++g) {
      if (seen[g] == SEEN_NONE || (seen[g] == SEEN_SOME && hidden(g, j)))
        continue;
      const bfloat16 *q = q_pieces + g * PK * DP;
      auto s = aie::zeros<accfloat, VEC>();
#pragma GCC unroll 8
      for (int i = 0; i < DP; i += VEC) {
        bvec kp[3], qp[3];
        fa_rows::load_pieces<PK>(k_pieces + i, DP, kp);
        fa_rows::load_pieces<PK>(q + i, DP, qp);
        fa_rows::mac_pieces<PK, PK>(s, kp, qp);
      }
      scores[g * CP + j] = aie::reduce_add(s.template to_vector<float>());
    }
#else
    vf held[HOLD ? K_VECS : 1];
    if constexpr (HOLD)
#pragma GCC unroll 8
      for (int v = 0; v < K_VECS; ++v)
        held[v] = load_aligned(k_row + v * VEC);
    const auto k_vec = [&](int v) {
      if constexpr (HOLD)
        return held[v];
      else
        return load_aligned(k_row + v * VEC);
    };
    for (int g = 0; g < G; ++g) {
      if (seen[g] == SEEN_NONE || (seen[g] == SEEN_SOME && hidden(g, j)))
        continue;
      const float *q = q_rows + g * DP;
      // The products rounded and summed lane by lane in the accumulator, as mul and add do.
      auto s = aie::mul(k_vec(0), load_aligned(q));
#pragma GCC unroll 8
      for (int i = VEC; i < FA_D; i += VEC)
        s = aie::mac(s, k_vec(i / VEC), load_aligned(q + i));
      scores[g * CP + j] = aie::reduce_add(s.template to_vector<float>());
    }
#endif
  }
  // Per row: scaled, softcapped, masked scores and the chunk's maximum; a row that sees a key
  // of the chunk takes its new running maximum (a row whose chunk is all masked: its scores
  // become 0, it adds nothing).
  alignas(64) float new_max[GV];
  bool live[G];
  const Factor scale_f = factor(splat(scale));
  bool any_p = false;
  for (int g = 0; g < G; ++g) {
    float *sc = scores + g * CP;
    if (seen[g] == SEEN_NONE) {
      live[g] = false;
      new_max[g] = run_max[g];
      continue;
    }
#if HAS_MASK
    const uint16_t *m16 =
        reinterpret_cast<const uint16_t *>(mask_words) + mask_skip + g * m_stride;
#ifdef ALIBI_SLOPES
    const float slope = bits_to_float(alibi_slopes[h0 + head]);
#endif
#endif
    vf vmax = from_bits(splat_i((int32_t)NEG_INF));
#pragma GCC unroll 8
    for (int j = 0; j < FA_CHUNK; j += VEC) {
      const int n = FA_CHUNK - j < (int)VEC ? FA_CHUNK - j : (int)VEC;
      vf s = mul(load_aligned(sc + j), scale_f);
      if (float_bits(softcap) != 0)
        s = mul(tanh(s), softcap);
#if HAS_MASK
      if (seen[g] != SEEN_ZERO) {
        vf mv = load_f16_zero(m16 + kv_row + j, n);
#ifdef ALIBI_SLOPES
        mv = mul(mv, slope);
#endif
        s = add(s, mv);
      }
#endif
      if (n < (int)VEC) { // lanes past the chunk: -inf
        alignas(64) float tmp[VEC];
        aie::store_v(tmp, s);
        for (int i = n; i < (int)VEC; ++i)
          tmp[i] = bits_to_float(NEG_INF);
        s = aie::load_v<VEC>(tmp);
      }
      aie::store_v(sc + j, s);
      vmax = fmax(vmax, s);
    }
    const float cmax = max_lanes_vec(vmax);
    live[g] = float_bits(cmax) != NEG_INF;
    new_max[g] = live[g] && greater(cmax, run_max[g]) ? cmax : run_max[g];
    if (!live[g])
      for (int j = 0; j < CP; j += VEC)
        aie::store_v(sc + j, splat(0.0f));
    any_p = any_p || live[g];
  }
  kv_row += FA_CHUNK;
  if (!any_p)
    return;
  // The rows' rescalings of what they summed before, VEC rows at a time (0 while a row's
  // running maximum is -inf).
  for (int g = G; g < GV; ++g)
    new_max[g] = 0.0f;
  alignas(64) float alpha[GV];
  for (int g = 0; g < GV; g += VEC)
    aie::store_v(alpha + g, exp_nonpos(sub(load_aligned(run_max + g), load_aligned(new_max + g))));
  // The live rows' probabilities in place of their scores (0 for masked keys), their sums
  // and accumulators rescaled.
  for (int g = 0; g < G; ++g) {
    if (!live[g])
      continue;
    float *sc = scores + g * CP;
    const vf mm = splat(new_max[g]);
    vf psum = splat(0.0f);
#pragma GCC unroll 8
    for (int j = 0; j < FA_CHUNK; j += VEC) {
      vf p = exp_nonpos(sub(load_aligned(sc + j), mm)); // -inf lanes: 0
      aie::store_v(sc + j, p);
      psum = add(psum, p);
    }
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
    fa_rows::split<3>(sc, CP, p_pieces + g * 3 * CP, CP);
#endif
    run_sum[g] = lane0(add(mul(splat(run_sum[g]), alpha[g]), splat(aie::reduce_add(psum))));
    run_max[g] = new_max[g];
    const Factor va = factor(splat(alpha[g]));
    float *ag = acc + g * DVP;
#pragma GCC unroll 8
    for (int i = 0; i < FA_DV; i += VEC)
      aie::store_v(ag + i, mul(aie::load_v<VEC>(ag + i), va));
  }
  // p . V: each V row decoded once, for the rows with p != 0 (for no row: a masked key,
  // skipped as ggml skips it: its V row may hold anything, or scores too far below the
  // maxima to count); V_BATCH rows at a time, each row's accumulators taking them in key
  // order.
  for (int j0 = 0; j0 < FA_CHUNK; j0 += V_BATCH) {
    bool used[V_BATCH];
    bool any = false;
    for (int j = 0; j < V_BATCH; ++j) {
      used[j] = false;
      for (int g = 0; g < G && !used[j]; ++g)
        used[j] = float_bits(scores[g * CP + j0 + j]) != 0;
      if (used[j]) {
        fa_rows::decode_kv_row<FA_V_TYPE, FA_DV>(halves, b + (j0 + j) * V_ROW_WORDS,
                                                 v_rows + j * DVP);
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
        fa_rows::split<PV>(v_rows + j * DVP, DVP, v_pieces + j * PV * DVP, DVP);
#endif
      }
      any = any || used[j];
    }
    if (!any)
      continue;
    constexpr int NV = DVP / (int)VEC;
    for (int g = 0; g < G; ++g) {
      float *ag = acc + g * DVP;
      const float *pg = scores + g * CP + j0;
      // The products added in key order in the accumulator (on aie2p rounded, as mul and add
      // do; on aie2 p's three pieces times the V row's, each exact).
      aie::accum<accfloat, VEC> sum[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        sum[v].from_vector(aie::load_v<VEC>(ag + v * VEC));
#pragma GCC unroll 8
      for (int j = 0; j < V_BATCH; ++j) {
        if (float_bits(pg[j]) == 0)
          continue; // this row: a masked key (its V row may be NaN) or a negligible one
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
        const bfloat16 *pj = p_pieces + g * 3 * CP + j0 + j;
        const bvec pp[3] = {aie::broadcast<bfloat16, VEC>(pj[0]),
                            aie::broadcast<bfloat16, VEC>(pj[CP]),
                            aie::broadcast<bfloat16, VEC>(pj[2 * CP])};
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          bvec vp[3];
          fa_rows::load_pieces<PV>(v_pieces + j * PV * DVP + v * VEC, DVP, vp);
          fa_rows::mac_pieces<PV, 3>(sum[v], vp, pp);
        }
#else
        const vf p = splat(pg[j]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          sum[v] = aie::mac(sum[v], load_aligned(v_rows + j * DVP + v * VEC), p);
#endif
      }
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        aie::store_v(ag + v * VEC, sum[v].template to_vector<float>());
    }
  }
}

void ggml_fa_out(float *o) {
  set_ggml_rounding();
  const int g = out_row;
  float *ag = acc + g * DVP;
#if HAS_SINKS
  const float sink_value = sinks[block_head0() + head];
  if (float_bits(sink_value) != NEG_INF || float_bits(run_max[g]) != NEG_INF) {
    const float new_max = greater(sink_value, run_max[g]) ? sink_value : run_max[g];
    const vf mm = splat(new_max);
    const float alpha = lane0(exp(sub(splat(run_max[g]), mm)));
    run_sum[g] = lane0(add(mul(splat(run_sum[g]), alpha), exp(sub(splat(sink_value), mm))));
    for (int i = 0; i < FA_DV; i += VEC)
      aie::store_v(ag + i, mul(aie::load_v<VEC>(ag + i), alpha));
    run_max[g] = new_max;
  }
#endif
  const vf inv = float_bits(run_sum[g]) == 0 ? splat(0.0f) : recip(splat(run_sum[g]));
  alignas(64) float ordered[V_PAIRS ? DVP : 1];
  if constexpr (V_PAIRS) {
    for (int i = 0; i < FA_DV; ++i)
      ordered[i] = ag[HalfPairs::slot(i)];
    ag = ordered;
  }
  for (int i = 0; i < FA_DV; i += VEC) {
    const int n = FA_DV - i < (int)VEC ? FA_DV - i : (int)VEC;
    vf r = mul(aie::load_v<VEC>(ag + i), inv);
    if (n == (int)VEC)
      store_any(o + i, r);
    else
      store_part(o + i, r, n);
  }
  if (++out_row == G) {
    block += block_step;
    reset_block();
  }
}

} // extern "C"
