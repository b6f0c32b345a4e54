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
//   HAS_MASK, FA_M_WORDS, FA_M_OBJECTS, FA_M_STRIDE   the block's f16 mask span: its words, its
//                      objects, the values between two of its rows (the mask's ne0); row r of
//                      the block's rows reads mask row r of the span (the mask is broadcast
//                      over the block's heads)
//   FA_BLOCKS, FA_M_SKIPS  per block, the f16 values of its span before its first row (one
//                      when rows of an odd length start mid-word, more at the buffer's end;
//                      0 for every block when undefined)
//   HAS_SINKS, FA_S_OBJECTS  every head's sink (FA_N_HEAD f32, then padding), once per core
//   FA_N_HEAD          heads
//   FA_SCALE, FA_SOFTCAP   f32 bit patterns (the scale already divided by the softcap)
//   ALIBI_SLOPES       the slope of every head (max_bias > 0)
//
// Functions (arguments as the object fifos deliver them, 32-bit words):
//   ggml_fa_begin(first, step, head)   the core's first block, the block stride (columns)
//                                and its head within a block (its row of the column's cores)
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
// per key: the same sums, rounded differently). Everything is f32 on the vector unit; each
// row's arithmetic is that of a block of one row (a K or V row is decoded once per chunk for
// the G rows, to the same f32 values).

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
static float run_max[G], run_sum[G];
#if HAS_MASK
alignas(64) static uint32_t mask_words[FA_M_WORDS + VEC / 2];
#endif
#if HAS_SINKS
static float sinks[FA_N_HEAD];
#endif
static int32_t block, block_step, head, q_object, side_object, sink_object, kv_row, mask_skip,
    out_row;

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
using fa_rows::NEG_INF;

// Rows decoded in pair order (fa_rows::in_pairs): q kept in K's order, the accumulators in
// V's, put back in order by ggml_fa_out.
static constexpr bool K_PAIRS = fa_rows::in_pairs<FA_K_TYPE, FA_D>;
static constexpr bool V_PAIRS = fa_rows::in_pairs<FA_V_TYPE, FA_DV>;

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
  for (int i = 0; i < G * DVP; i += VEC)
    aie::store_v(acc + i, splat(0.0f));
}

extern "C" {

void ggml_fa_begin(int32_t first, int32_t step, int32_t core_head) {
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
  // row r of head j is row r FA_GH + j; this core keeps its head's.
  const int o = q_object++;
  for (int w = o * FA_B_WORDS; w < (o + 1) * FA_B_WORDS && w < FA_GH * G * FA_D; ++w)
    if ((w / FA_D) % FA_GH == head)
      q_rows[(w / FA_D) / FA_GH * DP + (K_PAIRS ? HalfPairs::slot(w % FA_D) : w % FA_D)] =
          round_q(bits_to_float((uint32_t)b[w - o * FA_B_WORDS]));
}

void ggml_fa_side(int32_t *a) {
#if HAS_MASK
  const int o = side_object++;
  for (int w = o * FA_A_WORDS; w < (o + 1) * FA_A_WORDS && w < FA_M_WORDS; ++w)
    mask_words[w] = (uint32_t)a[w - o * FA_A_WORDS];
#else
  (void)a;
#endif
}

void ggml_fa_chunk(int32_t *a, int32_t *b) {
  set_ggml_rounding(); // aie2's f32 multiply splits into bf16 pieces rounded to nearest
  const float scale = bits_to_float((uint32_t)FA_SCALE);
  const float softcap = bits_to_float((uint32_t)FA_SOFTCAP);
  const HalfPairs halves;
  // The raw dot products q.k of the chunk's rows with every row of the block: each K row
  // decoded once.
  for (int j = 0; j < FA_CHUNK; ++j) {
    fa_rows::decode_kv_row<FA_K_TYPE, FA_D>(halves, a + j * K_ROW_WORDS, k_row);
    for (int g = 0; g < G; ++g) {
      const float *q = q_rows + g * DP;
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
      vf s = mul(load_aligned(k_row), load_aligned(q));
      for (int i = VEC; i < FA_D; i += VEC)
        s = add(s, mul(load_aligned(k_row + i), load_aligned(q + i)));
      scores[g * CP + j] = aie::reduce_add(s);
#else
      // The products rounded and summed lane by lane in the accumulator, as mul and add do.
      auto s = aie::mul(load_aligned(k_row), load_aligned(q));
      for (int i = VEC; i < FA_D; i += VEC)
        s = aie::mac(s, load_aligned(k_row + i), load_aligned(q + i));
      scores[g * CP + j] = aie::reduce_add(s.template to_vector<float>());
#endif
    }
  }
  const int h0 = block_head0();
#ifdef ALIBI_SLOPES
  static const uint32_t slopes[] = {ALIBI_SLOPES};
#endif
  // Per row: scaled, softcapped, masked scores; the chunk's maximum; the row's rescaling and
  // its probabilities in place of its scores (0 for masked keys and for every key of a row
  // whose chunk is all masked: those add nothing).
  bool any_p = false;
  for (int g = 0; g < G; ++g) {
    float *sc = scores + g * CP;
#if HAS_MASK
    const uint16_t *m16 =
        reinterpret_cast<const uint16_t *>(mask_words) + mask_skip + g * FA_M_STRIDE;
#ifdef ALIBI_SLOPES
    const float slope = bits_to_float(slopes[h0 + head]);
#endif
#endif
    vf vmax = from_bits(splat_i((int32_t)NEG_INF));
    for (int j = 0; j < FA_CHUNK; j += VEC) {
      const int n = FA_CHUNK - j < (int)VEC ? FA_CHUNK - j : (int)VEC;
      vf s = mul(load_aligned(sc + j), scale);
      if (float_bits(softcap) != 0)
        s = mul(tanh(s), softcap);
#if HAS_MASK
      vf mv = load_f16_zero(m16 + kv_row + j, n);
#ifdef ALIBI_SLOPES
      mv = mul(mv, slope);
#endif
      s = add(s, mv);
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
    if (float_bits(cmax) == NEG_INF) {
      // Every key of the chunk masked for this row: nothing of it changes.
      for (int j = 0; j < CP; j += VEC)
        aie::store_v(sc + j, splat(0.0f));
      continue;
    }
    const float new_max = greater(cmax, run_max[g]) ? cmax : run_max[g];
    const vf mm = splat(new_max);
    const float alpha = lane0(exp(sub(splat(run_max[g]), mm))); // 0 while run_max is -inf
    vf psum = splat(0.0f);
    for (int j = 0; j < FA_CHUNK; j += VEC) {
      vf p = exp(sub(load_aligned(sc + j), mm)); // -inf lanes: 0
      aie::store_v(sc + j, p);
      psum = add(psum, p);
    }
    run_sum[g] = lane0(add(mul(splat(run_sum[g]), alpha), splat(aie::reduce_add(psum))));
    run_max[g] = new_max;
    const vf va = splat(alpha);
    float *ag = acc + g * DVP;
    for (int i = 0; i < FA_DV; i += VEC)
      aie::store_v(ag + i, mul(aie::load_v<VEC>(ag + i), va));
    any_p = true;
  }
  kv_row += FA_CHUNK;
  if (!any_p)
    return;
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
      if (used[j])
        fa_rows::decode_kv_row<FA_V_TYPE, FA_DV>(halves, b + (j0 + j) * V_ROW_WORDS,
                                                 v_rows + j * DVP);
      any = any || used[j];
    }
    if (!any)
      continue;
    constexpr int NV = DVP / (int)VEC;
    for (int g = 0; g < G; ++g) {
      float *ag = acc + g * DVP;
      const float *pg = scores + g * CP + j0;
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
      vf sum[NV];
      for (int v = 0; v < NV; ++v)
        sum[v] = aie::load_v<VEC>(ag + v * VEC);
#else
      // The products rounded and added in key order in the accumulator, as mul and add do.
      aie::accum<accfloat, VEC> sum[NV];
      for (int v = 0; v < NV; ++v)
        sum[v].from_vector(aie::load_v<VEC>(ag + v * VEC));
#endif
      for (int j = 0; j < V_BATCH; ++j) {
        if (float_bits(pg[j]) == 0)
          continue; // this row: a masked key (its V row may be NaN) or a negligible one
        const vf p = splat(pg[j]);
        for (int v = 0; v < NV; ++v)
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
          sum[v] = add(sum[v], mul(load_aligned(v_rows + j * DVP + v * VEC), p));
#else
          sum[v] = aie::mac(sum[v], load_aligned(v_rows + j * DVP + v * VEC), p);
#endif
      }
      for (int v = 0; v < NV; ++v)
#if defined(__AIE_ARCH__) && __AIE_ARCH__ == 20
        aie::store_v(ag + v * VEC, sum[v]);
#else
        aie::store_v(ag + v * VEC, sum[v].template to_vector<float>());
#endif
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
