// rows.cc: row-wise core functions of ggml_hsa_iron (aie2 / aie2p).
//
// Built once per kernel with Peano; the design (designs/_rows.py) sets:
//   GGML_OP_<OP>=1   RMS_NORM, NORM, RMS_NORM_MUL, RMS_NORM_MUL_ADD, SOFT_MAX, SOFT_MAX_MASK,
//                    SOFT_MAX_SINKS, SOFT_MAX_MASK_SINKS or ARGMAX
//   ROW_LEN          elements per row (dimension 0 of input 0)
//   ROW_BLOCK        rows per object FIFO buffer
//   ROWS_NE1, ROWS_NE2   x's dimensions 1 and 2 (a row's head index i2 for SOFT_MAX)
//   OP_P0, OP_P1     op_params as 32-bit patterns: eps (norms); scale, max_bias (SOFT_MAX)
//   HAS_MASK, MASK_F16   SOFT_MAX's mask, f16 (converted on the core) or f32
//   HAS_SINKS        SOFT_MAX's sinks: an x object holds ROW_BLOCK rows, then each row's sink
//   ALIBI_SLOPES     the f32 bit patterns of the ALiBi slope of every head (max_bias > 0)
//
// Functions (arguments as the object FIFOs deliver them):
//   ggml_rows_begin(first_row)               the index of the worker's first row
//   ggml_rows_weight(m)                      RMS_NORM_MUL_ADD: the weight row, the residual
//                                            channel's first object, kept for the dispatch
//   ggml_rows(x, [mask | weight | r], out)
//                                            ROW_BLOCK rows of ROW_LEN f32 (ARGMAX: one
//                                            i32 per row out); RMS_NORM_MUL's weight row
//                                            is resident for the dispatch, RMS_NORM_MUL_ADD's
//                                            residual rows come beside x's
//
// Every sum is accumulated in f32, 16 lanes of partial sums reduced at the end of the row
// (ggml's CPU sums the norms in double; the lanes keep the error near f32 rounding for the
// row lengths a core holds). Rows stay in the core while they are computed, so the passes
// (norms: sums, then the output; SOFT_MAX: max, exponentials and sum, scaling) reread the
// core's buffer, not DDR.

#include "ggml_aie.h"

#ifndef ROW_LEN
#error "ROW_LEN must be defined"
#endif

using namespace ggml_aie;

static constexpr int FULL = ROW_LEN / (int)VEC * (int)VEC; // elements in whole vectors
static constexpr int TAIL = ROW_LEN - FULL;

static int32_t next_row; // the index (over x's rows) of the next row this core computes

static inline float bits_to_float(uint32_t b) {
  float f;
  __builtin_memcpy(&f, &b, 4);
  return f;
}

// Scalar results through the vector code (the scalar unit has no float hardware).
static inline float rsqrt_scalar(float x) { return lane0(recip(sqrt(splat(x)))); }

extern "C" void ggml_rows_begin(int32_t first_row) { next_row = first_row; }

#if defined(GGML_OP_RMS_NORM_MUL)
#define RMS_WEIGHT 1
#define GGML_OP_RMS_NORM 1
#endif
#if defined(GGML_OP_RMS_NORM_MUL_ADD)
#define RMS_WEIGHT 1
#define RMS_ADD 1
#define GGML_OP_RMS_NORM 1
#endif

#if defined(GGML_OP_RMS_NORM) || defined(GGML_OP_NORM)

// ------------------------------------------------------------------------ norms

// The output: f32, or with OUT_BF16 (RMS_NORM_MUL: a prompt's activations for its GEMMs) each
// value rounded to bf16 once, to nearest even.
#if OUT_BF16
using out_t = bfloat16;
#else
using out_t = float;
#endif

// r: RMS_NORM_MUL_ADD's residual row (nullptr otherwise).
static void norm_row(const float *x, const float *w, const float *r, out_t *y) {
  const float eps = bits_to_float((uint32_t)OP_P0);
#if defined(GGML_OP_RMS_NORM)
  // ggml: scale = 1 / sqrt(mean(x^2) + eps); y = x * scale.
  vf acc = splat(0.0f);
  for (int i = 0; i < FULL; i += VEC) {
    vf v = load_aligned(x + i);
    acc = add(acc, mul(v, v));
  }
  if (TAIL) {
    vf v = load_part_zero(x + FULL, TAIL);
    acc = add(acc, mul(v, v));
  }
  const float mean = lane0(mul(splat(aie::reduce_add(acc)), 1.0f / ROW_LEN));
  const float scale = rsqrt_scalar(lane0(add(splat(mean), splat(eps))));
#if RMS_ADD
  // RMS_NORM_MUL_ADD: ggml's three nodes, each result rounded to f32, then plus r.
  for (int i = 0; i < FULL; i += VEC) {
    vf v = mul(mul(load_aligned(x + i), scale), load_aligned(w + i));
    store_aligned(y + i, add(v, load_aligned(r + i)));
  }
  if (TAIL) {
    vf v = mul(mul(load_part(x + FULL, TAIL), scale), load_part(w + FULL, TAIL));
    store_part(y + FULL, add(v, load_part(r + FULL, TAIL)), TAIL);
  }
#elif RMS_WEIGHT
  (void)r;
  // RMS_NORM_MUL: ggml's two nodes, the norm rounded to f32, then times the weight row.
  for (int i = 0; i < FULL; i += VEC)
    store_aligned(y + i, mul(mul(load_aligned(x + i), scale), load_aligned(w + i)));
  if (TAIL)
    store_part(y + FULL, mul(mul(load_part(x + FULL, TAIL), scale), load_part(w + FULL, TAIL)),
               TAIL);
#else
  (void)r;
  (void)w;
  for (int i = 0; i < FULL; i += VEC)
    store_aligned(y + i, mul(load_aligned(x + i), scale));
  if (TAIL)
    store_part(y + FULL, mul(load_part(x + FULL, TAIL), scale), TAIL);
#endif
#else
  (void)w;
  (void)r;
  // ggml: mean = sum(x) / n; y = x - mean; var = sum(y^2) / n; y *= 1 / sqrt(var + eps).
  vf acc = splat(0.0f);
  for (int i = 0; i < FULL; i += VEC)
    acc = add(acc, load_aligned(x + i));
  if (TAIL)
    acc = add(acc, load_part_zero(x + FULL, TAIL));
  const vf mean = splat(lane0(mul(splat(aie::reduce_add(acc)), 1.0f / ROW_LEN)));
  vf acc2 = splat(0.0f);
  for (int i = 0; i < FULL; i += VEC) {
    vf v = sub(load_aligned(x + i), mean);
    store_aligned(y + i, v);
    acc2 = add(acc2, mul(v, v));
  }
  if (TAIL) {
    vf v = sub(load_part_zero(x + FULL, TAIL), mean);
    store_part(y + FULL, v, TAIL);
    // The padding lanes hold -mean: reload what was stored, padding lanes 0.
    v = load_part_zero(y + FULL, TAIL);
    acc2 = add(acc2, mul(v, v));
  }
  const float var = lane0(mul(splat(aie::reduce_add(acc2)), 1.0f / ROW_LEN));
  const float scale = rsqrt_scalar(lane0(add(splat(var), splat(eps))));
  for (int i = 0; i < FULL; i += VEC)
    store_aligned(y + i, mul(load_aligned(y + i), scale));
  if (TAIL)
    store_part(y + FULL, mul(load_part(y + FULL, TAIL), scale), TAIL);
#endif
}

static void norm_block(const float *x, const float *r, const float *w, out_t *out) {
  // f32 in and out, but aie2's f32 multiply splits its operands into bf16 pieces: round to
  // nearest even there as the split assumes (the reset mode truncates).
  set_ggml_rounding();
  for (int i = 0; i < ROW_BLOCK; ++i)
    norm_row(x + i * ROW_LEN, w, r ? r + i * ROW_LEN : nullptr, out + i * ROW_LEN);
  next_row += ROW_BLOCK;
}

#if RMS_ADD
// The weight row arrives as the residual channel's first object, kept for the dispatch.
alignas(64) static float weight_row[ROW_LEN];
extern "C" void ggml_rows_weight(float *m) {
  for (int i = 0; i < FULL; i += VEC)
    store_aligned(weight_row + i, load_aligned(m + i));
  if (TAIL)
    store_part(weight_row + FULL, load_part(m + FULL, TAIL), TAIL);
}
extern "C" void ggml_rows(float *x, float *r, float *out) { norm_block(x, r, weight_row, out); }
#elif RMS_WEIGHT
extern "C" void ggml_rows(float *x, float *w, out_t *out) { norm_block(x, nullptr, w, out); }
#else
extern "C" void ggml_rows(float *x, out_t *out) { norm_block(x, nullptr, nullptr, out); }
#endif

#elif defined(GGML_OP_SOFT_MAX) || defined(GGML_OP_SOFT_MAX_MASK) ||                       \
    defined(GGML_OP_SOFT_MAX_SINKS) || defined(GGML_OP_SOFT_MAX_MASK_SINKS)

// ---------------------------------------------------------------------- softmax

#if HAS_MASK
#if MASK_F16
typedef uint16_t mask_t;
// IEEE half to float on the integer unit (the AIE has no f16 arithmetic): exact for every
// half, subnormals normalised, infinities and NaNs kept.
static inline float mask_value(mask_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, b;
  if (e == 0x1f) {
    b = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    b = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    b = sign;
  } else {
    uint32_t sh = 0;
    while (!(m & 0x400u)) {
      m <<= 1;
      ++sh;
    }
    b = sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13);
  }
  return bits_to_float(b);
}
#else
typedef float mask_t;
static inline float mask_value(mask_t v) { return v; }
#endif
// VEC mask values from p (n of them, the other lanes 0) as f32.
static inline vf load_mask(const mask_t *p, int n) {
  alignas(64) float tmp[VEC];
  for (int i = 0; i < (int)VEC; ++i)
    tmp[i] = i < n ? mask_value(p[i]) : 0.0f;
  return load_aligned(tmp);
}
#endif

#ifdef ALIBI_SLOPES
static const uint32_t alibi_slopes[] = {ALIBI_SLOPES};
#endif

// ggml: w = x * scale + slope * mask; m = max(w, sink); e = exp(w - m);
// s = sum(e) + exp(sink - m); y = e / s.
static void soft_max_row(const float *x, const void *mask_row, float sink_value, float *y,
                         int head) {
  const float scale = bits_to_float((uint32_t)OP_P0);
#ifdef ALIBI_SLOPES
  const float slope = bits_to_float(alibi_slopes[head]);
#else
  const float slope = 1.0f;
#endif
  const float neg_inf = bits_to_float(0xff800000u);
  vf vmax = splat(neg_inf);
  for (int i = 0; i < ROW_LEN; i += VEC) {
    const int n = ROW_LEN - i < (int)VEC ? ROW_LEN - i : (int)VEC;
    vf w = n == (int)VEC ? load_aligned(x + i) : load_part_fill(x + i, n, 0.0f);
    w = mul(w, scale);
#if HAS_MASK
    vf mv = load_mask((const mask_t *)mask_row + i, n);
#ifdef ALIBI_SLOPES
    mv = mul(mv, slope);
#endif
    w = add(w, mv);
#endif
    if (n == (int)VEC) {
      store_aligned(y + i, w);
    } else {
      store_part(y + i, w, n);
      w = load_part_fill(y + i, n, neg_inf);
    }
    vmax = fmax(vmax, w);
  }
  float m = max_lanes(vmax);
#if HAS_SINKS
  const vf sink = splat(sink_value);
  m = max_lanes(fmax(splat(m), sink));
#endif
  const vf mm = splat(m);
  vf acc = splat(0.0f);
  for (int i = 0; i < ROW_LEN; i += VEC) {
    const int n = ROW_LEN - i < (int)VEC ? ROW_LEN - i : (int)VEC;
    if (n == (int)VEC) {
      vf e = exp(sub(load_aligned(y + i), mm));
      store_aligned(y + i, e);
      acc = add(acc, e);
    } else {
      vf e = exp(sub(load_part_fill(y + i, n, neg_inf), mm)); // padding lanes: exp(-inf) = 0
      store_part(y + i, e, n);
      acc = add(acc, e);
    }
  }
  float sum = aie::reduce_add(acc);
#if HAS_SINKS
  sum = lane0(add(splat(sum), exp(sub(sink, mm))));
#endif
  const float inv = lane0(recip(splat(sum)));
  for (int i = 0; i < FULL; i += VEC)
    store_aligned(y + i, mul(load_aligned(y + i), inv));
  if (TAIL)
    store_part(y + FULL, mul(load_part(y + FULL, TAIL), inv), TAIL);
  (void)slope;
  (void)sink_value;
  (void)head;
  (void)mask_row;
}

static void soft_max_block(const float *x, const void *mask, float *out) {
  set_ggml_rounding(); // see the norms: aie2's f32 multiply rounds its bf16 pieces to nearest
#if HAS_SINKS
  const float *sinks = x + ROW_BLOCK * ROW_LEN; // the sink of each row, after the rows
#endif
  for (int r = 0; r < ROW_BLOCK; ++r) {
    const int head = (next_row / ROWS_NE1) % ROWS_NE2;
#if HAS_MASK
    const void *mrow = (const mask_t *)mask + r * ROW_LEN;
#else
    const void *mrow = mask;
#endif
#if HAS_SINKS
    const float sink = sinks[r];
#else
    const float sink = 0.0f;
#endif
    soft_max_row(x + r * ROW_LEN, mrow, sink, out + r * ROW_LEN, head);
    ++next_row;
  }
}

#if HAS_MASK
extern "C" void ggml_rows(float *x, mask_t *mask, float *out) { soft_max_block(x, mask, out); }
#else
extern "C" void ggml_rows(float *x, float *out) { soft_max_block(x, nullptr, out); }
#endif

#elif defined(GGML_OP_ARGMAX)

// ----------------------------------------------------------------------- argmax

// ggml-cpu: the index of the largest value, the last one among equal maxima.
// Compared on the sortable integer views: no float compare on the scalar unit.
extern "C" void ggml_rows(float *x, int32_t *out) {
  for (int r = 0; r < ROW_BLOCK; ++r) {
    const float *row = x + r * ROW_LEN;
    int32_t best = 0, best_key = 0;
    for (int i = 0; i < ROW_LEN; ++i) {
      int32_t b;
      __builtin_memcpy(&b, row + i, 4);
      const int32_t key = b < 0 ? b ^ 0x7fffffff : b; // sortable(), as in ggml_aie.h
      if (i == 0 || key >= best_key) {
        best = i;
        best_key = key;
      }
    }
    out[r] = best;
  }
  next_row += ROW_BLOCK;
}

#else
#error "unknown row op"
#endif
