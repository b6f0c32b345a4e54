// flash_attn.cc: ggml's FLASH_ATTN_EXT on one core (aie2 / aie2p), one work item (a query
// row of one head) at a time, the online softmax over chunks of K and V rows.
//
// Built once per kernel with Peano; the design (designs/flash_attn.py, plan plans_fa.py) sets:
//   FA_D, FA_DV        head sizes of q/K and of V
//   FA_NKV, FA_CHUNK   K/V rows per item, rows per object (FA_NKV / FA_CHUNK objects per item)
//   FA_K_TYPE, FA_V_TYPE   0 f32, 1 f16, 2 bf16
//   FA_A_WORDS, FA_B_WORDS 32-bit words of an object of fifo A (K chunks, q, mask, sink) and
//                      of fifo B (V chunks)
//   FA_Q_OBJECTS       objects of the q row on fifo A (the row, repeated to whole objects)
//   HAS_MASK, FA_M_WORDS, FA_M_OBJECTS   the f16 mask row: its words, its objects
//   FA_ITEMS, FA_M_SKIPS   per item, the f16 values of its mask words before its row (one when
//                      a row of an odd length starts mid-word, more at the buffer's end;
//                      0 for every item when undefined)
//   HAS_SINKS, FA_S_OBJECTS              the head's sink (one f32, repeated)
//   FA_N_HEAD          heads (the item's head is item % FA_N_HEAD)
//   FA_SCALE, FA_SOFTCAP   f32 bit patterns (the scale already divided by the softcap)
//   ALIBI_SLOPES       the slope of every head (max_bias > 0)
//
// Functions (arguments as the object fifos deliver them, 32-bit words):
//   ggml_fa_begin(first, step)   the core's first item and the item stride (columns)
//   ggml_fa_side(a)              one object of the item's q / mask / sink, kept in static data
//   ggml_fa_chunk(a, b)          FA_CHUNK K rows (a) and V rows (b)
//   ggml_fa_out(o)               the item's output row (FA_DV f32); next item
//
// ggml-cpu's semantics: q rounded to K's type, s = scale * q.k; softcap * tanh(s) with a
// softcap; + slope * mask (keys whose mask is -inf are skipped, their V rows never read);
// softmax with the sink as one more logit without a value; an empty row (every key masked,
// no sink) is 0. Scores of a chunk share one rescaling of the accumulator (ggml rescales per
// key: the same sums, rounded differently). Everything is f32 on the vector unit.

#include "ggml_aie.h"

#ifndef FA_D
#error "FA_D must be defined"
#endif

using namespace ggml_aie;

static constexpr int K_ROW_WORDS = FA_A_WORDS / FA_CHUNK;
static constexpr int V_ROW_WORDS = FA_B_WORDS / FA_CHUNK;
static constexpr int CHUNK_VECS = (FA_CHUNK + (int)VEC - 1) / (int)VEC;

alignas(64) static float q_row[FA_D + VEC];
alignas(64) static float acc[FA_DV + VEC];
alignas(64) static float scores[CHUNK_VECS * VEC];
#if HAS_MASK
alignas(64) static uint32_t mask_row[FA_M_WORDS + VEC / 2];
#endif
static float run_max, run_sum, sink_value;
static int32_t item, item_step, side_object, kv_row, mask_skip;

// The f16 values of the item's mask words before its row.
static inline int32_t item_mask_skip() {
#ifdef FA_M_SKIPS
  static const uint16_t skips[FA_ITEMS] = {FA_M_SKIPS};
  return item < FA_ITEMS ? skips[item] : 0;
#else
  return 0;
#endif
}

static inline float bits_to_float(uint32_t b) { return __builtin_bit_cast(float, b); }
static inline uint32_t float_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
static inline float lane0(vf v) { return v.get(0); }
static constexpr uint32_t NEG_INF = 0xff800000u;

// x > y on the sortable integer views (no scalar float compare: aie2 has no float unit).
static inline bool greater(float x, float y) {
  int32_t a = (int32_t)float_bits(x), b = (int32_t)float_bits(y);
  a = a < 0 ? a ^ 0x7fffffff : a;
  b = b < 0 ? b ^ 0x7fffffff : b;
  return a > b;
}

// q rounded to K's type, as ggml-cpu converts q before the dot product.
static inline float round_q(float x) {
#if FA_K_TYPE == 1
  return f16_to_f32(f32_to_f16(x));
#elif FA_K_TYPE == 2
  uint32_t b = float_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) // NaN: quiet (ggml_compute_fp32_to_bf16)
    return bits_to_float((b | 0x00400000u) & 0xffff0000u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return bits_to_float(b & 0xffff0000u);
#else
  return x;
#endif
}

// n (<= VEC) elements from element i of a K or V row of type T, the other lanes 0, as f32.
template <int T> static inline vf load_kv(const int32_t *row, int i, int n) {
  if constexpr (T == 1) {
    return load_f16_zero(reinterpret_cast<const uint16_t *>(row) + i, n);
  } else if constexpr (T == 2) {
    const bfloat16 *p = reinterpret_cast<const bfloat16 *>(row) + i;
    return n == (int)VEC ? load_any(p) : load_part_zero(p, n);
  } else {
    const float *p = reinterpret_cast<const float *>(row) + i;
    return n == (int)VEC ? load_any(p) : load_part_zero(p, n);
  }
}

static void reset_item() {
  side_object = 0;
  kv_row = 0;
  mask_skip = item_mask_skip();
  run_max = bits_to_float(NEG_INF);
  run_sum = 0.0f;
  sink_value = bits_to_float(NEG_INF);
  for (int i = 0; i < FA_DV; i += VEC)
    aie::store_v(acc + i, splat(0.0f));
}

extern "C" {

void ggml_fa_begin(int32_t first, int32_t step) {
  item = first;
  item_step = step;
  reset_item();
}

void ggml_fa_side(int32_t *a) {
  int o = side_object++;
  if (o < FA_Q_OBJECTS) {
    for (int w = o * FA_A_WORDS; w < (o + 1) * FA_A_WORDS && w < FA_D; ++w)
      q_row[w] = round_q(bits_to_float((uint32_t)a[w - o * FA_A_WORDS]));
    return;
  }
  o -= FA_Q_OBJECTS;
#if HAS_MASK
  if (o < FA_M_OBJECTS) {
    for (int w = o * FA_A_WORDS; w < (o + 1) * FA_A_WORDS && w < FA_M_WORDS; ++w)
      mask_row[w] = (uint32_t)a[w - o * FA_A_WORDS];
    return;
  }
  o -= FA_M_OBJECTS;
#endif
#if HAS_SINKS
  if (o == 0)
    sink_value = bits_to_float((uint32_t)a[0]);
#endif
}

void ggml_fa_chunk(int32_t *a, int32_t *b) {
  set_ggml_rounding(); // aie2's f32 multiply splits into bf16 pieces rounded to nearest
  const float scale = bits_to_float((uint32_t)FA_SCALE);
  const float softcap = bits_to_float((uint32_t)FA_SOFTCAP);
  // The raw dot products q.k of the chunk's rows.
  for (int j = 0; j < FA_CHUNK; ++j) {
    const int32_t *row = a + j * K_ROW_WORDS;
    vf s = splat(0.0f);
    for (int i = 0; i < FA_D; i += VEC) {
      const int n = FA_D - i < (int)VEC ? FA_D - i : (int)VEC;
      s = add(s, mul(load_kv<FA_K_TYPE>(row, i, n), load_aligned(q_row + i)));
    }
    scores[j] = aie::reduce_add(s);
  }
  // Scaled, softcapped, masked; the chunk's maximum.
#ifdef ALIBI_SLOPES
  static const uint32_t slopes[] = {ALIBI_SLOPES};
  const float slope = bits_to_float(slopes[item % FA_N_HEAD]);
#endif
  vf vmax = from_bits(splat_i((int32_t)NEG_INF));
  for (int j = 0; j < FA_CHUNK; j += VEC) {
    const int n = FA_CHUNK - j < (int)VEC ? FA_CHUNK - j : (int)VEC;
    vf s = mul(load_aligned(scores + j), scale);
    if (float_bits(softcap) != 0)
      s = mul(tanh(s), softcap);
#if HAS_MASK
    const uint16_t *m16 = reinterpret_cast<const uint16_t *>(mask_row) + mask_skip;
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
    aie::store_v(scores + j, s);
    vmax = fmax(vmax, s);
  }
  kv_row += FA_CHUNK;
  float cmax = bits_to_float(NEG_INF);
  for (int i = 0; i < (int)VEC; ++i)
    if (greater(vmax.get(i), cmax))
      cmax = vmax.get(i);
  if (float_bits(cmax) == NEG_INF)
    return; // every key of the chunk masked: nothing changes
  const float new_max = greater(cmax, run_max) ? cmax : run_max;
  const vf mm = splat(new_max);
  const float alpha = lane0(exp(sub(splat(run_max), mm))); // 0 while run_max is -inf
  vf psum = splat(0.0f);
  for (int j = 0; j < FA_CHUNK; j += VEC) {
    vf p = exp(sub(load_aligned(scores + j), mm)); // -inf lanes: 0
    aie::store_v(scores + j, p);
    psum = add(psum, p);
  }
  run_sum = lane0(add(mul(splat(run_sum), alpha), splat(aie::reduce_add(psum))));
  run_max = new_max;
  const vf va = splat(alpha);
  for (int i = 0; i < FA_DV; i += VEC)
    aie::store_v(acc + i, mul(aie::load_v<VEC>(acc + i), va));
  for (int j = 0; j < FA_CHUNK; ++j) {
    if (float_bits(scores[j]) == 0) {
      // p = 0: a masked key (skipped as ggml skips it: its V row may hold anything) or a
      // score too far below the maximum to count.
      continue;
    }
    const int32_t *row = b + j * V_ROW_WORDS;
    const vf p = splat(scores[j]);
    for (int i = 0; i < FA_DV; i += VEC) {
      const int n = FA_DV - i < (int)VEC ? FA_DV - i : (int)VEC;
      aie::store_v(acc + i, add(aie::load_v<VEC>(acc + i), mul(load_kv<FA_V_TYPE>(row, i, n), p)));
    }
  }
}

void ggml_fa_out(float *o) {
  set_ggml_rounding();
#if HAS_SINKS
  if (float_bits(sink_value) != NEG_INF || float_bits(run_max) != NEG_INF) {
    const float new_max = greater(sink_value, run_max) ? sink_value : run_max;
    const vf mm = splat(new_max);
    const float alpha = lane0(exp(sub(splat(run_max), mm)));
    run_sum = lane0(add(mul(splat(run_sum), alpha), exp(sub(splat(sink_value), mm))));
    for (int i = 0; i < FA_DV; i += VEC)
      aie::store_v(acc + i, mul(aie::load_v<VEC>(acc + i), alpha));
    run_max = new_max;
  }
#endif
  const vf inv = float_bits(run_sum) == 0 ? splat(0.0f) : recip(splat(run_sum));
  for (int i = 0; i < FA_DV; i += VEC) {
    const int n = FA_DV - i < (int)VEC ? FA_DV - i : (int)VEC;
    vf r = mul(aie::load_v<VEC>(acc + i), inv);
    if (n == (int)VEC)
      store_any(o + i, r);
    else
      store_part(o + i, r, n);
  }
  item += item_step;
  reset_item();
}

} // extern "C"
