// reduce.cc: whole-tensor reductions of ggml_hsa_iron (aie2 / aie2p): COUNT_EQUAL and
// CROSS_ENTROPY_LOSS.
//
// Built once per kernel with Peano; the design (designs/reduce_ops.py) sets:
//   GGML_OP_COUNT_EQUAL=1 or GGML_OP_CROSS_ENTROPY_LOSS=1
//   CHUNK        elements of each operand per object
//   N_PARTS      partials the combining core sums (the reducing cores)
//   ROW_CHUNKS   CROSS_ENTROPY_LOSS: objects per row (the row length is ROW_CHUNKS * CHUNK)
//   TOTAL_ROWS   CROSS_ENTROPY_LOSS: rows of the whole tensor (the final scale -1/rows)
//
// Functions (arguments as the object FIFOs deliver them):
//   ggml_reduce_begin()                 resets this core's running state
//   ggml_reduce_chunk(a, b)             CHUNK elements of each operand
//   ggml_reduce_end(partial)            writes this core's partial result (one element)
//   ggml_reduce_combine(parts, out)     the combining core: N_PARTS partials -> the output
//
// Sums are accumulated in f32 in 16 lanes, as ggml's CPU accumulates them per row; the
// partials are added in column order, as ggml-cpu adds its threads' sums.

#include "ggml_aie.h"

#ifndef CHUNK
#error "CHUNK must be defined"
#endif

using namespace ggml_aie;

static constexpr int FULL = CHUNK / (int)VEC * (int)VEC; // elements in whole vectors
static constexpr int TAIL = CHUNK - FULL;

#if defined(GGML_OP_COUNT_EQUAL)

// ------------------------------------------------------------------ count_equal

static int64_t count; // equal elements seen by this core

extern "C" void ggml_reduce_begin() { count = 0; }

extern "C" void ggml_reduce_chunk(int32_t *a, int32_t *b) {
  // A lane is 1 where the elements are equal; lane counts stay far below 2^31 per chunk.
  vi acc = splat_i(0);
  for (int i = 0; i < FULL; i += VEC) {
    vi va = aie::load_v<VEC>(a + i), vb = aie::load_v<VEC>(b + i);
    acc = aie::add(acc, pick_i(aie::eq(va, vb), splat_i(1), splat_i(0)));
  }
  int32_t n = aie::reduce_add(acc);
  for (int i = FULL; i < CHUNK; ++i)
    n += a[i] == b[i];
  count += n;
}

extern "C" void ggml_reduce_end(int64_t *partial) { partial[0] = count; }

extern "C" void ggml_reduce_combine(int64_t *parts, int64_t *out) {
  int64_t sum = 0;
  for (int i = 0; i < N_PARTS; ++i)
    sum += parts[i];
  out[0] = sum;
}

#elif defined(GGML_OP_CROSS_ENTROPY_LOSS)

// ----------------------------------------------------------- cross_entropy_loss

// ggml-cpu, per row: m = max(x); st = (x - m) - log(sum(exp(x - m))); loss_row = sum(st * l);
// result = -(sum of loss_row) / rows.
//
// A row arrives in ROW_CHUNKS objects, so the softmax is computed online: the running max m,
// s = sum(exp(x - m)) and a = sum(l * (x - m)) are rescaled when a chunk raises the max
// (s *= exp(m_old - m), a -= (m - m_old) * sum(l)), and at the row's end
// loss_row = a - log(s) * sum(l), which is sum(l * st) regrouped.

#ifndef ROW_CHUNKS
#error "ROW_CHUNKS must be defined"
#endif

static float run_max, run_sum, run_lx, run_l; // the current row: m, s, a, sum(l)
static int chunk_in_row;                      // chunks of the current row seen
static float total;                           // this core's sum of loss_row

extern "C" void ggml_reduce_begin() {
  chunk_in_row = 0;
  total = 0.0f;
}

extern "C" void ggml_reduce_chunk(float *x, float *l) {
  // aie2's f32 multiply splits its operands into bf16 pieces: round to nearest even there
  // as the split assumes (the reset mode truncates).
  set_ggml_rounding();
  const float neg_inf = -__builtin_inff();
  vf vmax = splat(neg_inf);
  for (int i = 0; i < FULL; i += VEC)
    vmax = fmax(vmax, load_aligned(x + i));
  if (TAIL)
    vmax = fmax(vmax, load_part_fill(x + FULL, TAIL, neg_inf));
  const float cmax = max_lanes(vmax);

  float m;
  if (chunk_in_row == 0) {
    m = cmax;
    run_sum = run_lx = run_l = 0.0f;
  } else {
    m = max_lanes(fmax(splat(run_max), splat(cmax)));
    // Rescale to the new max (a no-op when it did not change: exp(0) = 1, a shift of 0).
    const vf shift = sub(splat(m), splat(run_max));
    run_sum = lane0(mul(splat(run_sum), exp(fneg(shift))));
    run_lx = lane0(sub(splat(run_lx), mul(shift, run_l)));
  }
  run_max = m;

  const vf mm = splat(m);
  vf acc_e = splat(0.0f), acc_lx = splat(0.0f), acc_l = splat(0.0f);
  for (int i = 0; i < FULL; i += VEC) {
    const vf d = sub(load_aligned(x + i), mm);
    const vf lv = load_aligned(l + i);
    acc_e = add(acc_e, exp(d));
    acc_lx = add(acc_lx, mul(lv, d));
    acc_l = add(acc_l, lv);
  }
  if (TAIL) {
    // Padding lanes: x = -inf for the exponentials (exp(-inf) = 0); for l * (x - m) x = 0
    // and l = 0, a finite 0 (l * -inf would be NaN).
    const vf d = sub(load_part_fill(x + FULL, TAIL, neg_inf), mm);
    const vf lv = load_part_zero(l + FULL, TAIL);
    acc_e = add(acc_e, exp(d));
    acc_lx = add(acc_lx, mul(lv, sub(load_part_zero(x + FULL, TAIL), mm)));
    acc_l = add(acc_l, lv);
  }
  run_sum = lane0(add(splat(run_sum), splat(aie::reduce_add(acc_e))));
  run_lx = lane0(add(splat(run_lx), splat(aie::reduce_add(acc_lx))));
  run_l = lane0(add(splat(run_l), splat(aie::reduce_add(acc_l))));

  if (++chunk_in_row == ROW_CHUNKS) {
    // loss_row = a - log(s) * sum(l)
    const float row = lane0(sub(splat(run_lx), mul(log(splat(run_sum)), run_l)));
    total = lane0(add(splat(total), splat(row)));
    chunk_in_row = 0;
  }
}

extern "C" void ggml_reduce_end(float *partial) { partial[0] = total; }

extern "C" void ggml_reduce_combine(float *parts, float *out) {
  set_ggml_rounding();
  vf sum = splat(0.0f);
  for (int i = 0; i < N_PARTS; ++i)
    sum = add(sum, splat(parts[i]));
  // ggml-cpu: dp[0] *= -1.0f / (float) nr.
  out[0] = lane0(mul(sum, -1.0f / (float)TOTAL_ROWS));
}

#else
#error "unknown reduction"
#endif
