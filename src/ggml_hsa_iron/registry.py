"""The op table: every op a design implements, with what it accepts.

This table is the single source of the capabilities the compiler declares
(`capabilities.py`) and of the dispatch to the design files
(`designs/<source>` defines `ggml_op_<op>` for each op it implements); a unit
test checks both against each other without mlir-aie.

Element types (the seeds' table): bf16, i8, i16 and i32 are native to the AIE
vector units, f32 is emulated. Type rules beyond the per-op list:

* element-wise ops: float operands (bf16, f32) may be mixed freely, integer
  operands must all have one type; floats and integers do not mix;
* MUL_MAT: see `MUL_MAT_COMBOS`; MUL_MAT_<glu>: `MUL_MAT_GLU_COMBOS` (input 1, the up
  weights, has input 0's type); MUL_MAT_ADD: `MUL_MAT_ADD_COMBOS` (r is f32);
  RMS_NORM_MUL_MAT: `RMS_NORM_MUL_MAT_COMBOS`, RMS_NORM_MUL_MAT_<glu>:
  `RMS_NORM_MUL_MAT_GLU_COMBOS` (n is f32); RMS_NORM_MUL_MAT_ROPE(_FF): RMS_NORM_MUL_MAT's
  combos (n and the frequency factors f32, the positions i32); RMS_NORM_QKV_ROPE(_FF):
  `RMS_NORM_QKV_ROPE_COMBOS`, per projection (Q, K, V) and independent of the others';
  RMS_NORM_FFN_<glu>: `RMS_NORM_FFN_COMBOS`, MUL_MAT_ADD_RMS_NORM_FFN_<glu>:
  `MUL_MAT_ADD_RMS_NORM_FFN_COMBOS` (every weight input of the first type, the rest f32);
  FLASH_ATTN_FFN_<glu> and FLASH_ATTN_GLU_<glu>: `FLASH_ATTN_FFN_COMBOS` for their weights and
  activations, K and V of `FLASH_ATTN_FFN_KV_TYPES` (each independently), the mask f16.
"""

from dataclasses import dataclass

from .dtypes import ALL_TYPES, FLOAT_TYPES, QUANT_TYPES

BINARY_OPS = "binary_ops.py"
UNARY_OPS = "unary_ops.py"
MUL_MAT = "mul_mat.py"
ROW_OPS = "row_ops.py"
GLU_OPS = "glu_ops.py"
ROPE = "rope.py"
COPY_OPS = "copy_ops.py"
FLASH_ATTN = "flash_attn.py"
REDUCE_OPS = "reduce_ops.py"
FFN = "ffn.py"


@dataclass(frozen=True)
class OpSpec:
    op: str  # protocol name (upper case)
    source: str  # design file under designs/
    inputs: int
    types: tuple[str, ...]
    broadcast: bool
    noncontiguous: bool
    # "binary", "unary", "mul_mat", "mul_mat_glu", "mul_mat_add", "rows", "glu", "rope", "copy",
    # "copy_rows", "set_rows",
    # "flash_attn", "reduce", "rms_norm_mul_mat", "rms_norm_mul_mat_rope",
    # "rms_norm_qkv_rope", "rms_norm_ffn", "mul_mat_add_rms_norm_ffn", "flash_attn_ffn",
    # "flash_attn_glu", "decode_layer"
    kind: str
    constraints: str  # human-readable limits beyond the protocol fields
    # op_params words the op reads (the backend sends none, or SCALE's and CLAMP's two
    # f32 bit patterns); non-zero words beyond them are refused.
    params: int = 0
    # Outputs: the request's `output`, then `outputs - 1` tensors in its "extra_outputs"
    # (RMS_NORM_QKV_ROPE(_FF): Q, then K and V); an op of one output refuses extra_outputs;
    # 0: one per row of input 0 (CPY_ROWS).
    outputs: int = 1

    @property
    def kernel_name(self) -> str:
        return f"ggml_op_{self.op.lower()}"

    @property
    def run_time_n_kv(self) -> bool:
        """Whether the request may make n_kv a run-time argument (`n_kv_step`): the lone
        attention with a mask, and the fused ones (plans_fa.run_time_step)."""
        fused = ("flash_attn_ffn", "flash_attn_glu", "decode_layer")
        return self.kind in fused or self.op == "FLASH_ATTN_EXT_MASK"


_ELTWISE_LIMITS = (
    "contiguous operands; float operands may mix bf16 and f32, integer operands share "
    "one type; an element count that is not whole 32-bit words is moved rounded up (the "
    "operands' last word whole, the output's pad elements keep input 0's values when it "
    "has the output's type)"
)
_BCAST_LIMITS = (
    _ELTWISE_LIMITS + "; input 1 is repeated over input 0 (ggml broadcasting) and "
    "must fit in a compute tile (at most 8192 bytes)"
)
_MM_LIMITS = (
    "src0 [K,N,b2,b3], src1 [K,M,b2*r2,b3*r3], dst [N,M,...]; "
    "whole-array GEMM when M is at least the microkernel rows (4, 8 for i8 on aie2p), "
    "N >= 8 and K a multiple of 8, otherwise one GEMV per src1 row; rows of src0 and src1 start on 32-bit words (K even for 2-byte, "
    "a multiple of 4 for 1-byte types); type pairs: see type_combos. f16 and block-quantized "
    "weights (q4_0 q4_1 q5_0 q8_0 q4_K q5_K q6_K, as ggml stores them) with f32 activations: "
    "one GEMV per src1 row (also for M > 1), the weight rows decoded to bf16 on the cores and "
    "multiplied with the activations rounded to bf16, f32 sums; a weight row's bytes must be "
    "whole 32-bit words, or the rows of a core's tile together (then K is not chunked), and at "
    "most 1024 DMA tasks (batches x src1 rows x rounds). Strided operands (views, permuted "
    "tensors: the attention's KV-cache views) take the GEMV: rows dense (nb[0] the element's "
    "or block's bytes; a transposed view is refused), row strides and every row's offset on "
    "32-bit words, row strides up to 2^20 words; dst rows dense. An f16 dst (f32 src1, any "
    "of those weights; the backend's product written into the f16 KV cache): the GEMV only "
    "(one src1 row, M below the GEMM's rows, strided operands; dense rows the GEMM takes are "
    "refused), the sums in f32 and each value rounded to f16 (nearest even) once; N even and "
    "dst rows on 32-bit words"
)

_MM_GLU_LIMITS = (
    "act(W_g . x) * (W_u . x) with act ggml's relu, gelu (tanh approximation), silu, gelu_erf "
    "or gelu_quick: inputs W_g, W_u (one type, shape and strides: MUL_MAT's src0, f32, bf16, "
    "f16 or block-quantized), x (f32, MUL_MAT's src1); dst f32 [N,M,...]. One GEMV per src1 "
    "row computing both products per round (the gate sums kept on the core), dense or "
    "strided operands and rows of whole 32-bit words (whole blocks) as MUL_MAT's GEMV; at most 1024 DMA "
    "tasks on the weights' shim channel (src1 rows x rounds x 2), so long prefill batches "
    "are refused"
)

_MM_ADD_LIMITS = (
    "W . x + r: inputs W (MUL_MAT's src0: f32, bf16, f16 or block-quantized), x (f32, "
    "MUL_MAT's src1), r (f32 rows of N, of the product's shape or repeated over it as ggml's "
    "ADD repeats its second input, e.g. one bias row; rows dense at word-aligned strides); "
    "dst f32 [N,M,...] contiguous. One GEMV per src1 row (MUL_MAT's GEMV rules), r's values "
    "for a round's rows sent behind x's K chunks and added before the results leave the core; "
    "rounds of rows dividing N; at most 1024 DMA tasks on x's shim channel (src1 rows x "
    "rounds x 2 or 3), so long prefill batches are refused"
)

_NORM_MM_LIMITS = (
    "RMS_NORM then MUL by one weight row n, folded into the projection(s) reading the result: "
    "inputs the weights (MUL_MAT's src0; RMS_NORM_MUL_MAT_<glu>: W_g then W_u, as "
    "MUL_MAT_<glu>), x (f32, the norm's input, MUL_MAT's src1 layout), n (f32 [K,1,1,1], "
    "dense), RMS_NORM_MUL_MAT_BIAS: a bias b (f32 [N], one row added to every product "
    "after the norm's scale, qwen2's biases; whole rounds); "
    "op_params[0] eps; dst f32, or for RMS_NORM_MUL_MAT(_BIAS) f16 (summed in f32, rounded "
    "once per value; rows of an even N starting on 32-bit words, as MUL_MAT's f16 output). "
    "out = W . (x / sqrt(mean(x^2) + eps) * n) per row of "
    "x (then the GLU). MUL_MAT's GEMV only (one GEMV per src1 row): dense M that MUL_MAT's "
    "GEMM takes is refused (the norm then runs unfused); n is kept on every core, so K must "
    "fit the core's memory with the GEMV's buffers (4 bytes per value; K = 8192 does not)"
)

_NORM_MM_ROPE_LIMITS = (
    "RMS_NORM_MUL_MAT's product rotated as ggml's ROPE (llama's Q and K projections and their "
    "ROPE, one kernel): inputs W (RMS_NORM_MUL_MAT's weights, [K,M,1,1]), x (f32 [K,T,1,1] "
    "dense, the norm's input), n (f32 [K,1,1,1]), positions (i32, at least T: token t's is "
    "pos[t]), RMS_NORM_MUL_MAT_ROPE_FF: frequency factors (f32, at least n_dims/2); "
    "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE(_FF): last the head norm's weights (f32 [D]), each head "
    "RMS-normalised (eps op_params 12) and multiplied by them before its rotation, every core's "
    "rows of a round whole heads; RMS_NORM_MUL_MAT_BIAS_ROPE(_FF): last a bias (f32 [M]) added "
    "before the rotation, in whole rounds; "
    "op_params 0..10 ROPE's (normal and NeoX modes, YaRN parameters), 11 the norm's eps; dst "
    "f32 or f16 [D,H,T,1] dense with D*H = M (f16: rounded once, as RMS_NORM_MUL_MAT's). out = "
    "rope(W . (x / sqrt(mean(x^2) + eps) * n)) per token, heads of D rows, the first n_dims "
    "<= D of each rotated in f32. RMS_NORM_MUL_MAT's GEMV only (its refusals apply); every "
    "core's rows of a round hold whole rotation pairs (NeoX: a head's n_dims span), or the "
    "request is refused; cos/sin accurate for |theta| below about 6000"
)

_NORM_QKV_LIMITS = (
    "llama's Q, K and V projections of one normalised x in one kernel of three outputs: inputs "
    "Wq [K,Mq], Wk [K,Mk], Wv [K,Mv] (one K; each of RMS_NORM_MUL_MAT's weight types, the three "
    "independently: see group_type_combos), x (f32 [K,N] "
    "dense, the norm's input), n (f32 [K]), positions (i32, at least N), "
    "RMS_NORM_QKV_ROPE_FF: frequency factors (f32, at least n_dims/2); "
    "RMS_NORM_QKV_HEAD_NORM_ROPE(_FF): then Q's and K's head norm weights (f32 [D]), Q and K as "
    "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE computes them; RMS_NORM_QKV_BIAS_ROPE(_FF): then Q's, K's "
    "and V's biases (f32 [Mq], [Mk], [Mv]), added as RMS_NORM_MUL_MAT_BIAS(_ROPE) adds them; "
    "op_params as "
    "RMS_NORM_MUL_MAT_ROPE's (0..10 ROPE's, 11 eps); outputs Q f32 [D,Hq,N] (output), K f32 or "
    "f16 [D,Hk,N] and V f32 or f16 [Mv,N] (extra_outputs), dense. Q and K as "
    "RMS_NORM_MUL_MAT_ROPE computes them, V as RMS_NORM_MUL_MAT, each on its own group of the "
    "array's columns (in proportion to Mq, Mk, Mv, at least one each); the GEMV only (decode: "
    "dense N that MUL_MAT's GEMM takes is refused), and whatever those ops refuse for their "
    "projection over their group's columns"
)

_NORM_FFN_LIMITS = (
    "a feed-forward block in one dispatch, RMS_NORM_MUL_MAT_<glu> then MUL_MAT_ADD of its "
    "result: inputs W_g, W_u [K,F] and W_d [F,K] (one type: RMS_NORM_MUL_MAT_<glu>'s weights), x "
    "(f32 [K,N], the norm's input), n (f32 [K]), r (f32, MUL_MAT_ADD's r: [K,N] or repeated over "
    "the output, e.g. x itself); op_params[0] eps; outputs out f32 [K,N] = W_d . h + r "
    "(output, contiguous; may be the buffer of r and x: an ADD in place) and h f32 [F,N] = "
    "act(W_g . y) * (W_u . y), y = x / sqrt(mean(x^2) + eps) * n (extra_outputs). Both GEMVs on "
    "the same cores and fifos, h written to memory and read back after every write of it has "
    "completed: one row tile and one K chunk for both (dividing K and F), K a multiple of the "
    "array's rows per round of the down projection, n kept on every core; whatever "
    "RMS_NORM_MUL_MAT_<glu> or MUL_MAT_ADD refuses (dense N that MUL_MAT's GEMM takes, more than "
    "1024 DMA tasks per shim channel) is refused"
)

_ATTN_FFN_LIMITS = (
    "llama's attention output projection and residual ADD (MUL_MAT_ADD) and the feed-forward "
    "block reading its result (RMS_NORM_FFN_<glu>) in one dispatch: inputs W_o [Ka,K], a (f32 "
    "[Ka,N], the attention's output), r0 (f32, MUL_MAT_ADD's r: [K,N] or repeated over r1), W_g, "
    "W_u [K,F], W_d [F,K], n (f32 [K]); the four weights of one type (RMS_NORM_MUL_MAT_<glu>'s "
    "weights); op_params[0] eps; outputs out f32 [K,N] (output, contiguous) and r1 f32 [K,N] = "
    "W_o . a + r0, h f32 [F,N] (extra_outputs, in that order), then h and out as "
    "RMS_NORM_FFN_<glu> computes them with x = r = r1. The three GEMVs on the same cores and "
    "fifos, r1 and h written to memory and read back after every write of them has completed: "
    "one row tile and one K chunk for all (dividing Ka, K and F), K a multiple of the array's "
    "rows per round of the MUL_MAT_ADD phases, n kept on every core, at most 1024 DMA tasks per "
    "shim channel over the three phases; whatever MUL_MAT_ADD or RMS_NORM_MUL_MAT_<glu> refuses "
    "for its phase (dense N that MUL_MAT's GEMM takes) is refused"
)

_FA_FFN_LIMITS = (
    "llama's attention of a decode step (FLASH_ATTN_EXT_MASK) and the block after it "
    "(MUL_MAT_ADD_RMS_NORM_FFN_<glu>) in one dispatch: inputs q f32 [D,T,n_head,1] (T up to 8 "
    "query rows of one cache, rows dense), k [D,n_kv,n_head_kv,1] and v [Dv,n_kv,n_head_kv,1] "
    "(f32, f16 or bf16, rows dense, row and head strides any: KV-cache views), mask f16 (a row "
    "per token, shared by the heads), W_o [Ka,K] (Ka = Dv n_head), r0 f32 [K,T], W_g, W_u "
    "[K,F], W_d [F,K] (one weight type; block-quantized when T > 1), n f32 [K]; op_params "
    "scale, max_bias (0: no ALiBi), logit_softcap, eps; outputs out f32 [K,T] and a f32 "
    "[Dv,n_head,T,1] dense, r1 f32 [K,T], h f32 [F,T] (extra_outputs). The attention runs on "
    "the GEMV's fifos and cores: a column per KV head (R cores dividing the q heads per KV "
    "head), K and V rows whole x objects read once for the T tokens, an online softmax over at "
    "most 32 equal chunks of keys, a core's scores of one chunk in its memory (longer contexts "
    "are refused), Dv whole y objects; whatever FLASH_ATTN_EXT_MASK's operand checks or "
    "MUL_MAT_ADD_RMS_NORM_FFN_<glu> refuse is refused"
)

_FA_GLU_LIMITS = (
    "FLASH_ATTN_FFN_<glu> without the block's down projection, for a layer whose W_d has "
    "another type than W_o, W_g and W_u (llama.cpp's Q4_K_M: q6_K ffn_down beside q4_K): inputs "
    "q, k, v, mask, W_o, r0, W_g, W_u (one weight type), n; op_params scale, max_bias, "
    "logit_softcap, eps; outputs h f32 [F,T] and a, r1 (extra_outputs); the attention, W_o's "
    "MUL_MAT_ADD and RMS_NORM_MUL_MAT_<glu> as FLASH_ATTN_FFN_<glu> runs them, with its limits"
)

_DECODE_LAYER_LIMITS = (
    "a llama layer of one decode step in one dispatch: RMS_NORM_QKV_ROPE(_FF), then "
    "FLASH_ATTN_FFN_<glu> with q = Q and r0 = x, on one shape of the array and one core "
    "object. Inputs Wq, Wk, Wv, x f32 [K,1], n_attn f32 [K], the positions i32, (_FF) the "
    "frequency factors f32, k, v (KV-cache views holding this token's rows), mask f16, W_o, "
    "W_g, W_u, W_d, n_ffn f32 [K] (the seven weights of one type); op_params RMS_NORM_QKV_ROPE's "
    "12 words, FLASH_ATTN_EXT's scale, max_bias, logit_softcap, the FFN norm's eps; outputs out "
    "f32 [K,1] and Q f32 [D,Hq,1], K rows [D,Hk,1] and V rows [Mv,1] (f32 or f16, dense), a, "
    "r1, h (extra_outputs). Q, K and V run side by side on groups of columns, each group whole "
    "rounds (f16 rows: whole pairs of rounds, two rounds' f16 values per y object); up to 8 "
    "tokens; whatever RMS_NORM_QKV_ROPE(_FF) or FLASH_ATTN_FFN_<glu> refuses is refused. "
    "DECODE_LAYER_BIAS_<glu> (qwen2): RMS_NORM_QKV_BIAS_ROPE's Q, K and V biases f32 behind the "
    "positions; DECODE_LAYER_HEAD_NORM_<glu> (qwen3): RMS_NORM_QKV_HEAD_NORM_ROPE's Q and K head "
    "norm weights f32 [D] there, their eps op_params word 16 (every core's rows of a round whole "
    "heads). DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu> (gemma2, gemma3): the norms after the "
    "attention's projection and after the block, each r' = rms_norm(p) * n + r, as phases of "
    "their own (the projection p written whole first); inputs n_post_attn and n_post_ffn f32 [K] "
    "behind n_ffn, op_params words 17 and 18 their eps, outputs o and d (the projections) behind "
    "h"
)

_ROWS_LIMITS = (
    "contiguous f32 rows (dimension 0) of any length up to what one compute tile holds "
    "with its other operands (a row is resident while it is computed, 48 KiB budget)"
)
_SOFT_MAX_LIMITS = (
    _ROWS_LIMITS + "; mask f32 or f16 (f16 rows of an even length), broadcast over x's "
    "dimensions 2 and 3; sinks f32; op_params scale and max_bias (ALiBi)"
)

_GLU_LIMITS = (
    "x and g of the output's shape, f32, f16 or bf16 (computed in f32; f16 converted on the "
    "core); each input dense or with rows (dimension 0) one stride apart (the fused form's "
    "halves), such rows whole 32-bit words; the output contiguous"
)
_GLU_TYPES = ("bf16", "f16", "f32")
_GLU_NAMES = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")

_ROPE_LIMITS = (
    "x f32 or f16, contiguous or a view whose tokens (dimension 2) lie apart, each token's "
    "rows contiguous (phi3's Q and K of one attn_qkv product); the output x's shape, "
    "contiguous, of x's type or f16 from f32 x (rounded "
    "to nearest even on the core), rows whole 32-bit words; positions "
    "i32 (one per i2); ROPE_FF: f32 frequency factors; normal and NeoX modes, YaRN parameters "
    "(op_params 0..10), n_dims <= ne0 (the rest copied); cos/sin accurate for |theta| below "
    "about 6000"
)

_COPY_LIMITS = (
    "input 0's elements copied into the output in logical (row-major) order, converting "
    "between f32, f16 and bf16 (f16 and bf16 rounded to nearest even on the core); equal "
    "element counts, each operand's bytes whole 32-bit words; a strided operand (a permuted "
    "or sliced view) is walked by the shim DMA: at most 4 dimensions after merging the "
    "contiguous ones, 2-byte elements in contiguous runs of whole words, inner wraps of at "
    "most 1023 words, each column's share whole outer slices (at most 64 when 4 dimensions)"
)
_COPY_ROWS_LIMITS = (
    "input 0's 2 to 8 rows (dense rows) copied and converted into as many outputs (`output`, "
    "then extra_outputs), one row each, of one type; CPY's dataflow over the rows' elements, "
    "each column's share drained into the rows it spans, every piece whole 32-bit words"
)
_SET_ROWS_LIMITS = (
    "f32 or f16 rows, i32 or i64 indices (repeated over dimensions 2 and 3), an f32, f16 or "
    "bf16 destination, contiguous, written in place; the destination is streamed through "
    "the cores and written back whole (the indices are data, DMA addresses are not), so the "
    "cost grows with the destination; per slab (i2, i3) the indices and source rows stay "
    "resident in a compute tile (a few KiB for a decode step; a long prefill batch is "
    "refused); rows and indices whole 32-bit words; indices outside the destination are "
    "skipped"
)
_COPY_TYPES = ("bf16", "f16", "f32")

_FLASH_ATTN_LIMITS = (
    "q f32 [D, n_q, n_head, n_seq] (rows dense), k [D, n_kv, n_head_kv, n_seq_kv] and v "
    "[Dv, n_kv, ...] f32, f16 or bf16 (rows dense, row and head strides any: KV-cache views; "
    "rows and strides whole 32-bit words), GQA (n_head a multiple of n_head_kv); mask f16 "
    "[>= n_kv, >= n_q, ...] dense (rows of any length), broadcast over heads and "
    "sequences; sinks f32 (one per head); op_params scale, max_bias (ALiBi, with a mask), "
    "logit_softcap; output f32 [Dv, n_head, n_q, n_seq] dense. One query row of one head per "
    "work item over up to one worker per column, K and V streamed in chunks of rows dividing "
    "n_kv (online softmax); at most 1024 DMA tasks per shim channel (a prefill with many query "
    "rows x heads is refused), D and Dv at most 1023"
)

_REDUCE_LIMITS = (
    "two dense inputs of one shape reduced to one value: C columns (at most 6, dividing the "
    "rows) each reduce their share in chunks of up to 2048 elements dividing a row "
    "(COUNT_EQUAL: the share), the partials joined in a memory tile and combined on one "
    "more core; at most 2^31 - 1 elements"
)

_INT_AND_FLOAT = ALL_TYPES
_FLOAT_ONLY = FLOAT_TYPES


def _binary(op: str) -> OpSpec:
    return OpSpec(op, BINARY_OPS, 2, _INT_AND_FLOAT, True, False, "binary", _BCAST_LIMITS)


def _rows(op: str, inputs: int, types, params: int, limits: str = _ROWS_LIMITS) -> OpSpec:
    # Reductions' outputs (ARGMAX) and SOFT_MAX's masks and sinks are smaller than the
    # output or x: the masks and sinks are broadcast (ggml's rules), so declare it.
    bcast = inputs > 1
    return OpSpec(op, ROW_OPS, inputs, tuple(types), bcast, False, "rows", limits, params)


def _glu(op: str) -> OpSpec:
    return OpSpec(op, GLU_OPS, 2, _GLU_TYPES, False, True, "glu", _GLU_LIMITS)


def _mul_mat_glu(op: str) -> OpSpec:
    # Like MUL_MAT: the inputs never have the output's shape (declared as broadcast).
    types = ("bf16", "f16", "f32") + QUANT_TYPES
    return OpSpec(op, MUL_MAT, 3, types, True, True, "mul_mat_glu", _MM_GLU_LIMITS)


def _rms_norm_mul_mat(op: str, inputs: int) -> OpSpec:
    # Like MUL_MAT: the inputs never have the output's shape (declared as broadcast).
    types = ("bf16", "f16", "f32") + QUANT_TYPES
    return OpSpec(op, MUL_MAT, inputs, types, True, True, "rms_norm_mul_mat", _NORM_MM_LIMITS, 1)


def _rms_norm_mul_mat_rope(op: str, inputs: int) -> OpSpec:
    # Like MUL_MAT: the inputs never have the output's shape (declared as broadcast); i32: the
    # positions; op_params ROPE's 11 words and eps (and the head norm's eps).
    types = ("bf16", "f16", "f32", "i32") + QUANT_TYPES
    params = 13 if "_HEAD_NORM_" in op else 12
    kind, limits = "rms_norm_mul_mat_rope", _NORM_MM_ROPE_LIMITS
    return OpSpec(op, MUL_MAT, inputs, types, True, True, kind, limits, params)


def _rms_norm_qkv_rope(op: str, inputs: int) -> OpSpec:
    # Like MUL_MAT: the inputs never have the outputs' shapes (declared as broadcast); i32: the
    # positions; op_params RMS_NORM_MUL_MAT[_HEAD_NORM]_ROPE's; three outputs (Q, K, V).
    types = ("bf16", "f16", "f32", "i32") + QUANT_TYPES
    params = 13 if "_HEAD_NORM_" in op else 12
    kind, limits = "rms_norm_qkv_rope", _NORM_QKV_LIMITS
    return OpSpec(op, MUL_MAT, inputs, types, True, True, kind, limits, params, outputs=3)


def _rms_norm_ffn(op: str) -> OpSpec:
    # Like MUL_MAT: the inputs never have the outputs' shapes (declared as broadcast); eps; two
    # outputs (out, then h).
    types = ("bf16", "f16", "f32") + QUANT_TYPES
    return OpSpec(op, FFN, 6, types, True, True, "rms_norm_ffn", _NORM_FFN_LIMITS, 1, outputs=2)


def _mul_mat_add_rms_norm_ffn(op: str) -> OpSpec:
    # RMS_NORM_FFN_<glu>'s types; inputs W_o, a, r0, W_g, W_u, W_d, n; eps; three outputs (out,
    # then r1 and h).
    types = ("bf16", "f16", "f32") + QUANT_TYPES
    kind, limits = "mul_mat_add_rms_norm_ffn", _ATTN_FFN_LIMITS
    return OpSpec(op, FFN, 7, types, True, True, kind, limits, 1, outputs=3)


def _flash_attn_ffn(op: str) -> OpSpec:
    # MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s types (with f16: the mask; f16, bf16, f32: K and V);
    # inputs q, k, v, mask, W_o, r0, W_g, W_u, W_d, n; scale, max_bias, softcap, eps; four
    # outputs (out, then a, r1 and h).
    types = ("bf16", "f16", "f32") + QUANT_TYPES
    kind, limits = "flash_attn_ffn", _FA_FFN_LIMITS
    return OpSpec(op, FFN, 10, types, True, True, kind, limits, 4, outputs=4)


def _flash_attn_glu(op: str) -> OpSpec:
    # FLASH_ATTN_FFN_<glu>'s types; inputs q, k, v, mask, W_o, r0, W_g, W_u, n; its four
    # op_params words; three outputs (h, then a and r1).
    types = ("bf16", "f16", "f32") + QUANT_TYPES
    kind, limits = "flash_attn_glu", _FA_GLU_LIMITS
    return OpSpec(op, FFN, 9, types, True, True, kind, limits, 4, outputs=3)


def _decode_layer(op: str, ff: bool, own: int = 0) -> OpSpec:
    # FLASH_ATTN_FFN_<glu>'s types and i32 (the positions); inputs Wq, Wk, Wv, x, n_attn, the
    # positions, (the factors,) (`own`: the biases or head norm weights,) k, v, mask, W_o, W_g,
    # W_u, W_d, n_ffn; 16 op_params words (the head norm's eps a 17th); seven outputs (out, then
    # Q, K rows, V rows, a, r1 and h).
    types = ("bf16", "f16", "f32", "i32") + QUANT_TYPES
    if "_HEAD_NORM_" in op:
        # Q's and K's rows of a round whole heads: q6_K's tiles of them do not fit a core
        # beside the block's data (heads of 16 to 128 tried); the layer's two kernels take q6_K.
        types = tuple(t for t in types if t != "q6_K")
    kind, limits = "decode_layer", _DECODE_LAYER_LIMITS
    inputs, params, outputs = 14 + ff + own, 17 if "_HEAD_NORM_" in op else 16, 7
    if "_POST_NORM_" in op:
        # The two post norms' weights, their eps (words 17 and 18), o and d.
        inputs, params, outputs = inputs + 2, 19, outputs + 2
    return OpSpec(op, FFN, inputs, types, True, True, kind, limits, params, outputs=outputs)


def _unary(op: str, types, params: int = 0, limits: str = _ELTWISE_LIMITS) -> OpSpec:
    return OpSpec(op, UNARY_OPS, 1, tuple(types), False, False, "unary", limits, params)


OPS: tuple[OpSpec, ...] = (
    _binary("ADD"),
    _binary("SUB"),
    _binary("MUL"),
    _binary("DIV"),
    _unary("ABS", _INT_AND_FLOAT),
    _unary("SGN", _INT_AND_FLOAT),
    _unary("NEG", _INT_AND_FLOAT),
    _unary("STEP", _INT_AND_FLOAT),
    _unary("TANH", _FLOAT_ONLY),
    _unary("ELU", _FLOAT_ONLY),
    _unary("RELU", _INT_AND_FLOAT),
    _unary("SIGMOID", _FLOAT_ONLY),
    _unary("GELU", _FLOAT_ONLY),
    _unary("GELU_QUICK", _FLOAT_ONLY),
    _unary("SILU", _FLOAT_ONLY),
    _unary("HARDSWISH", _FLOAT_ONLY),
    _unary("HARDSIGMOID", _FLOAT_ONLY),
    _unary("EXP", _FLOAT_ONLY),
    _unary("GELU_ERF", _FLOAT_ONLY),
    _unary("SQR", _FLOAT_ONLY),
    _unary("SQRT", _FLOAT_ONLY),
    _unary("LOG", _FLOAT_ONLY),
    _unary("SIN", _FLOAT_ONLY, limits=_ELTWISE_LIMITS + "; accurate for |x| below about 6000"),
    _unary("COS", _FLOAT_ONLY, limits=_ELTWISE_LIMITS + "; accurate for |x| below about 6000"),
    _unary("FLOOR", _FLOAT_ONLY),
    _unary("CEIL", _FLOAT_ONLY),
    _unary("ROUND", _FLOAT_ONLY),
    _unary("TRUNC", _FLOAT_ONLY),
    # op_params: scale and bias (SCALE), min and max (CLAMP), as f32 bit patterns; each
    # value compiles its own kernel (the parameters are part of the kernel name).
    _unary("SCALE", _FLOAT_ONLY, params=2),
    _unary("CLAMP", _FLOAT_ONLY, params=2),
    # MUL_MAT's inputs never have the output's shape, so it must declare
    # broadcast for the backend to consider it at all.
    OpSpec(
        "MUL_MAT",
        MUL_MAT,
        2,
        _INT_AND_FLOAT + ("f16",) + QUANT_TYPES,
        True,
        True,
        "mul_mat",
        _MM_LIMITS,
    ),
    # A feed-forward block's gate and up projections and their GLU, fused by the backend:
    # inputs W_g, W_u, x (designs/mul_mat.py).
    _mul_mat_glu("MUL_MAT_REGLU"),
    _mul_mat_glu("MUL_MAT_GEGLU"),
    _mul_mat_glu("MUL_MAT_SWIGLU"),
    _mul_mat_glu("MUL_MAT_GEGLU_ERF"),
    _mul_mat_glu("MUL_MAT_GEGLU_QUICK"),
    # A MUL_MAT and the ADD of its product, fused by the backend (residual connections,
    # biases): inputs W, x, r (designs/mul_mat.py).
    OpSpec(
        "MUL_MAT_ADD",
        MUL_MAT,
        3,
        ("bf16", "f16", "f32") + QUANT_TYPES,
        True,
        True,
        "mul_mat_add",
        _MM_ADD_LIMITS,
    ),
    # llama's attn_norm / ffn_norm (RMS_NORM, MUL by n) folded by the backend into the
    # projections reading it: inputs the weights, x, n; op_params eps (designs/mul_mat.py).
    _rms_norm_mul_mat("RMS_NORM_MUL_MAT", 3),
    # ... plus one row of values added to the product (qwen2's V bias): inputs W, x, n, b.
    _rms_norm_mul_mat("RMS_NORM_MUL_MAT_BIAS", 4),
    _rms_norm_mul_mat("RMS_NORM_MUL_MAT_REGLU", 4),
    _rms_norm_mul_mat("RMS_NORM_MUL_MAT_GEGLU", 4),
    _rms_norm_mul_mat("RMS_NORM_MUL_MAT_SWIGLU", 4),
    _rms_norm_mul_mat("RMS_NORM_MUL_MAT_GEGLU_ERF", 4),
    _rms_norm_mul_mat("RMS_NORM_MUL_MAT_GEGLU_QUICK", 4),
    # llama's Q and K projections (their attn_norm folded in) and the ROPE of each: inputs W,
    # x, n, the positions (and the frequency factors); op_params ROPE's and eps.
    _rms_norm_mul_mat_rope("RMS_NORM_MUL_MAT_ROPE", 4),
    _rms_norm_mul_mat_rope("RMS_NORM_MUL_MAT_ROPE_FF", 5),
    # The same with each head normalised before its rotation (qwen3's Q and K norms): the head
    # norm's weights after the other inputs, its eps in op_params word 12.
    _rms_norm_mul_mat_rope("RMS_NORM_MUL_MAT_HEAD_NORM_ROPE", 5),
    _rms_norm_mul_mat_rope("RMS_NORM_MUL_MAT_HEAD_NORM_ROPE_FF", 6),
    # The same with a bias added before the rotation (qwen2's Q and K): the bias last.
    _rms_norm_mul_mat_rope("RMS_NORM_MUL_MAT_BIAS_ROPE", 5),
    _rms_norm_mul_mat_rope("RMS_NORM_MUL_MAT_BIAS_ROPE_FF", 6),
    # llama's Q, K and V projections in one dispatch, three outputs: inputs Wq, Wk, Wv, x, n,
    # the positions (and the frequency factors); op_params RMS_NORM_MUL_MAT_ROPE's.
    _rms_norm_qkv_rope("RMS_NORM_QKV_ROPE", 6),
    _rms_norm_qkv_rope("RMS_NORM_QKV_ROPE_FF", 7),
    # The same with Q's and K's heads normalised (qwen3): their head norm weights last.
    _rms_norm_qkv_rope("RMS_NORM_QKV_HEAD_NORM_ROPE", 8),
    _rms_norm_qkv_rope("RMS_NORM_QKV_HEAD_NORM_ROPE_FF", 9),
    # The same with Q's, K's and V's biases (qwen2): the three biases last.
    _rms_norm_qkv_rope("RMS_NORM_QKV_BIAS_ROPE", 9),
    _rms_norm_qkv_rope("RMS_NORM_QKV_BIAS_ROPE_FF", 10),
    # A feed-forward block (RMS_NORM_MUL_MAT_<glu>, then MUL_MAT_ADD of its result) in one
    # dispatch, two outputs: inputs W_g, W_u, W_d, x, n, r; op_params eps (designs/ffn.py).
    *(_rms_norm_ffn(f"RMS_NORM_FFN_{glu}") for glu in _GLU_NAMES),
    # The attention output projection and residual ADD (MUL_MAT_ADD) folded ahead of the
    # feed-forward block reading its result, three outputs: inputs W_o, a, r0, W_g, W_u, W_d, n;
    # op_params eps (designs/ffn.py).
    *(_mul_mat_add_rms_norm_ffn(f"MUL_MAT_ADD_RMS_NORM_FFN_{glu}") for glu in _GLU_NAMES),
    # A decode step's attention (FLASH_ATTN_EXT_MASK) ahead of that block, on its fifos, four
    # outputs: inputs q, k, v, mask, W_o, r0, W_g, W_u, W_d, n; op_params scale, max_bias,
    # logit_softcap, eps (designs/ffn.py).
    *(_flash_attn_ffn(f"FLASH_ATTN_FFN_{glu}") for glu in _GLU_NAMES),
    # The same without the block's down projection (a W_d of another weight type runs as its
    # MUL_MAT_ADD after it), three outputs: inputs q, k, v, mask, W_o, r0, W_g, W_u, n.
    *(_flash_attn_glu(f"FLASH_ATTN_GLU_{glu}") for glu in _GLU_NAMES),
    # A llama layer of a decode step: the Q, K, V projections (RMS_NORM_QKV_ROPE(_FF)) ahead
    # of the attention and the block, seven outputs (designs/ffn.py).
    *(_decode_layer(f"DECODE_LAYER_{glu}", False) for glu in _GLU_NAMES),
    *(_decode_layer(f"DECODE_LAYER_FF_{glu}", True) for glu in _GLU_NAMES),
    # qwen2's layer (Q, K and V biases) and qwen3's (Q and K head norms); no _FF variants: the
    # families have no frequency factors.
    *(_decode_layer(f"DECODE_LAYER_BIAS_{glu}", False, 3) for glu in _GLU_NAMES),
    *(_decode_layer(f"DECODE_LAYER_HEAD_NORM_{glu}", False, 2) for glu in _GLU_NAMES),
    # gemma2's layer and gemma3's (with qwen3's head norms): the norms after the attention's
    # projection and after the block, nine outputs.
    *(_decode_layer(f"DECODE_LAYER_POST_NORM_{glu}", False) for glu in _GLU_NAMES),
    *(_decode_layer(f"DECODE_LAYER_HEAD_NORM_POST_NORM_{glu}", False, 2) for glu in _GLU_NAMES),
    # Row ops (designs/_rows.py): op_params eps (norms), scale and max_bias (SOFT_MAX).
    _rows("RMS_NORM", 1, ("f32",), 1),
    _rows("NORM", 1, ("f32",), 1),
    _rows(
        "RMS_NORM_MUL",
        2,
        ("f32", "bf16"),
        1,
        _ROWS_LIMITS + "; x and the weight f32, the output f32 or bf16 (rows of an even length); "
        "the weight is one f32 row, resident in every worker",
    ),
    # The same plus a residual of x's shape (gemma's norms after the attention and the
    # block, ahead of the residual ADD): inputs x, r, the weight row; y = rms_norm(x) * w + r.
    _rows(
        "RMS_NORM_MUL_ADD",
        3,
        ("f32",),
        1,
        _ROWS_LIMITS + "; r of x's shape, dense, beside x's rows (the second input channel); "
        "the weight is one f32 row, resident in every worker",
    ),
    _rows("SOFT_MAX", 1, ("f32",), 2, _SOFT_MAX_LIMITS),
    _rows("SOFT_MAX_MASK", 2, ("f32", "f16"), 2, _SOFT_MAX_LIMITS),
    _rows("SOFT_MAX_SINKS", 2, ("f32",), 2, _SOFT_MAX_LIMITS),
    _rows("SOFT_MAX_MASK_SINKS", 3, ("f32", "f16"), 2, _SOFT_MAX_LIMITS),
    _rows("ARGMAX", 1, ("f32", "i32"), 0, _ROWS_LIMITS + "; one i32 index per row"),
    # Whole-tensor reductions to one scalar (designs/reduce_ops.py); the output is smaller
    # than the inputs, which reductions need not declare as broadcast.
    OpSpec(
        "COUNT_EQUAL",
        REDUCE_OPS,
        2,
        ("i32", "i64"),
        False,
        False,
        "reduce",
        _REDUCE_LIMITS + "; i32 inputs, one i64 count out (two 32-bit words)",
    ),
    OpSpec(
        "CROSS_ENTROPY_LOSS",
        REDUCE_OPS,
        2,
        ("f32",),
        False,
        False,
        "reduce",
        _REDUCE_LIMITS + "; f32 logits and labels, rows along dimension 0, one f32 out: "
        "-(1/rows) sum(labels * log_softmax(logits)), the softmax online over a row's chunks",
    ),
    _glu("REGLU"),
    _glu("GEGLU"),
    _glu("SWIGLU"),
    _glu("GEGLU_ERF"),
    _glu("GEGLU_QUICK"),
    # ROPE's inputs (positions, frequency factors) are smaller than the output, which the
    # protocol calls broadcast; op_params 0..10 are ggml's rope parameters.
    OpSpec("ROPE", ROPE, 2, ("f16", "f32", "i32"), True, True, "rope", _ROPE_LIMITS, 11),
    OpSpec("ROPE_FF", ROPE, 3, ("f16", "f32", "i32"), True, True, "rope", _ROPE_LIMITS, 11),
    # The copies and the KV-cache write (designs/copy_ops.py). SET_ROWS's rows and indices
    # are smaller than its output: declared as broadcast for the backend to consider it.
    OpSpec(
        "SET_ROWS",
        COPY_OPS,
        2,
        _COPY_TYPES + ("i32", "i64"),
        True,
        True,
        "set_rows",
        _SET_ROWS_LIMITS,
    ),
    OpSpec("DUP", COPY_OPS, 1, _COPY_TYPES, False, True, "copy", _COPY_LIMITS),
    OpSpec("CPY", COPY_OPS, 1, _COPY_TYPES, False, True, "copy", _COPY_LIMITS),
    OpSpec("CONT", COPY_OPS, 1, _COPY_TYPES, False, True, "copy", _COPY_LIMITS),
    OpSpec("CPY_ROWS", COPY_OPS, 1, _COPY_TYPES, False, True, "copy_rows", _COPY_ROWS_LIMITS, 0, 0),
    # Attention (designs/flash_attn.py): K and V are strided cache views (noncontiguous); the
    # mask and the sinks are smaller than the output (broadcast); op_params scale, max_bias,
    # logit_softcap.
    *(
        OpSpec(
            op,
            FLASH_ATTN,
            n,
            ("f32", "f16", "bf16"),
            True,
            True,
            "flash_attn",
            _FLASH_ATTN_LIMITS,
            3,
        )
        for op, n in (
            ("FLASH_ATTN_EXT", 3),
            ("FLASH_ATTN_EXT_MASK", 4),
            ("FLASH_ATTN_EXT_SINKS", 4),
            ("FLASH_ATTN_EXT_MASK_SINKS", 5),
        )
    ),
)

# (src0, src1, dst) type triples MUL_MAT compiles. src0 holds the weights.
# bf16 weights: bf16 x bf16 microkernel, src1 converted to bf16 on the core when
# it is f32. f32 x f32: both converted to bf16 on the core (f32 is emulated).
MUL_MAT_COMBOS: tuple[tuple[str, str, str], ...] = (
    ("bf16", "bf16", "f32"),
    ("bf16", "f32", "f32"),
    ("f32", "f32", "f32"),
    ("i8", "i8", "i32"),
    ("i16", "i16", "i32"),
    # f16 and block-quantized weights (decoded to bf16 on the cores), f32 activations, or
    # bf16 ones (a prompt's activations written so for its GEMMs: the GEMM only).
    ("f16", "f32", "f32"),
    *((q, "f32", "f32") for q in QUANT_TYPES),
    *((w, "bf16", "f32") for w in ("f16", *QUANT_TYPES)),
    # An f16 output (the backend's V projection written straight into the f16 KV cache):
    # the GEMV only, summed in f32 on the core and rounded once per value.
    *((w, "f32", "f16") for w in ("bf16", "f32", "f16", *QUANT_TYPES)),
)

# (weights, x, dst) type triples of MUL_MAT_<glu>: MUL_MAT's with a float output (the GLU is
# computed in f32); both weight inputs have the first type.
MUL_MAT_GLU_COMBOS: tuple[tuple[str, str, str], ...] = tuple(
    c for c in MUL_MAT_COMBOS if c[2] == "f32" and (c[1] == "f32" or c[0] == "bf16")
)

# (weights, x, dst) type triples of MUL_MAT_ADD (r is f32): MUL_MAT's with f32 x and dst.
MUL_MAT_ADD_COMBOS: tuple[tuple[str, str, str], ...] = tuple(
    c for c in MUL_MAT_COMBOS if c[1:] == ("f32", "f32")
)

# (weights, x, dst) type triples of RMS_NORM_MUL_MAT (n is f32): MUL_MAT's with f32 x (the norm
# is computed in f32), dst f32 or f16 (the backend's V projection, its attn_norm folded in,
# written into the f16 KV cache; summed in f32 and rounded once, as MUL_MAT's f16 output).
RMS_NORM_MUL_MAT_COMBOS: tuple[tuple[str, str, str], ...] = tuple(
    c for c in MUL_MAT_COMBOS if c[1] == "f32" and c[2] in ("f32", "f16")
)

# (weights, x, dst) type triples of RMS_NORM_MUL_MAT_ROPE(_FF) (n and the frequency factors f32,
# the positions i32): RMS_NORM_MUL_MAT's (K's rotated projection written into the f16 KV cache).
RMS_NORM_MUL_MAT_ROPE_COMBOS: tuple[tuple[str, str, str], ...] = RMS_NORM_MUL_MAT_COMBOS

# (weights, x, dst) type triples of RMS_NORM_MUL_MAT_<glu> (n is f32; both weight inputs have
# the first type): MUL_MAT's with f32 x and dst (the GLU is computed in f32).
RMS_NORM_MUL_MAT_GLU_COMBOS: tuple[tuple[str, str, str], ...] = MUL_MAT_ADD_COMBOS

# RMS_NORM_QKV_ROPE(_FF) per projection: the (its weights, x, its output) type triples of the op
# computing it alone, whose GEMV its group of columns runs (plans_qkv): Q RMS_NORM_MUL_MAT_ROPE's
# with an f32 output, K RMS_NORM_MUL_MAT_ROPE's, V RMS_NORM_MUL_MAT's (K and V written into the
# f16 KV cache); n and the frequency factors f32, the positions i32. Each projection's triple is
# independent of the others' (every group has its own fifos, taps and core object), so a request
# may mix weight types (llama.cpp's Q4_K_M: q4_K Wq and Wk, q6_K Wv); they share x, hence K.
RMS_NORM_QKV_ROPE_COMBOS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "Q": tuple(c for c in RMS_NORM_MUL_MAT_ROPE_COMBOS if c[2] == "f32"),
    "K": RMS_NORM_MUL_MAT_ROPE_COMBOS,
    "V": RMS_NORM_MUL_MAT_COMBOS,
}

# (weights, x, outputs) type triples of RMS_NORM_FFN_<glu> (W_g, W_u and W_d of the first type;
# n and r f32; out and h f32): RMS_NORM_MUL_MAT_<glu>'s, which are MUL_MAT_ADD's.
RMS_NORM_FFN_COMBOS: tuple[tuple[str, str, str], ...] = RMS_NORM_MUL_MAT_GLU_COMBOS

# (weights, a, out) type triples of MUL_MAT_ADD_RMS_NORM_FFN_<glu> (W_o, W_g, W_u and W_d of the
# first type; r0, n, r1 and h f32): RMS_NORM_FFN_<glu>'s (its phase 0 is MUL_MAT_ADD, whose
# combos they are too).
MUL_MAT_ADD_RMS_NORM_FFN_COMBOS: tuple[tuple[str, str, str], ...] = RMS_NORM_FFN_COMBOS

# (weights, q, out) type triples of FLASH_ATTN_FFN_<glu> (W_o, W_g, W_u and W_d of the first
# type; q, r0, n, a, r1 and h f32): MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s. K and V take any of
# FLASH_ATTN_FFN_KV_TYPES each (FLASH_ATTN_EXT's), the mask f16.
FLASH_ATTN_FFN_COMBOS: tuple[tuple[str, str, str], ...] = MUL_MAT_ADD_RMS_NORM_FFN_COMBOS
FLASH_ATTN_FFN_KV_TYPES: tuple[str, ...] = ("f16", "bf16", "f32")
# (weights, x, out) type triples of DECODE_LAYER(_FF)_<glu>: FLASH_ATTN_FFN_<glu>'s (all seven
# weights of the first type); K and V (the cache views) of FLASH_ATTN_FFN_KV_TYPES, the K and
# V rows of DECODE_LAYER_ROW_TYPES (RMS_NORM_QKV_ROPE's outputs), the positions i32.
DECODE_LAYER_COMBOS: tuple[tuple[str, str, str], ...] = FLASH_ATTN_FFN_COMBOS
DECODE_LAYER_ROW_TYPES: tuple[str, ...] = ("f16", "f32")

BY_OP: dict[str, OpSpec] = {spec.op: spec for spec in OPS}
SOURCES: tuple[str, ...] = (
    BINARY_OPS,
    UNARY_OPS,
    MUL_MAT,
    ROW_OPS,
    GLU_OPS,
    ROPE,
    COPY_OPS,
    FLASH_ATTN,
    REDUCE_OPS,
    FFN,
)


def lookup(op: str) -> OpSpec | None:
    return BY_OP.get(op)


def by_kernel_name(name: str) -> OpSpec | None:
    """The op a config's kernel_name names: ggml_op_<op>, or ggml_unary_op_<op>."""
    for prefix, unary_only in (("ggml_op_", False), ("ggml_unary_op_", True)):
        if name.startswith(prefix):
            op = name[len(prefix) :]
            if op != op.lower():
                return None
            spec = BY_OP.get(op.upper())
            if spec is None or (unary_only and spec.kind != "unary"):
                return None
            return spec
    return None
