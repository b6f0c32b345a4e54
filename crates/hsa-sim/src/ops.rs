//! The op catalogue: exactly the ops and element types the executor implements. The compiler's
//! `capabilities` output and its request validation are generated from this table.

use serde::{Deserialize, Serialize};

/// Element types of tensor descriptors: ggml's names, including the block-quantized weight
/// types MUL_MAT reads (`q4_0`, `q4_1`, `q5_0`, `q8_0`, `q4_K`, `q5_K`, `q6_K`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    Bf16,
    I8,
    I16,
    I32,
    I64,
    /// Blocks of 32 values: f16 scale, 16 bytes of 4-bit values (offset 8).
    #[serde(rename = "q4_0")]
    Q4_0,
    /// Blocks of 32 values: f16 scale, 32 signed bytes.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// Super-blocks of 256 values: f16 scale and min scale, 12 bytes of 6-bit sub-block scales
    /// and mins, 128 bytes of 4-bit values.
    #[serde(rename = "q4_K")]
    Q4K,
    /// Blocks of 32 values: f16 scale, f16 min, 16 bytes of 4-bit values.
    #[serde(rename = "q4_1")]
    Q4_1,
    /// Blocks of 32 values: f16 scale, 4 bytes of fifth bits, 16 bytes of low nibbles
    /// (offset 16).
    #[serde(rename = "q5_0")]
    Q5_0,
    /// Super-blocks of 256 values: Q4_K's scales and mins, 32 bytes of fifth bits, 128 bytes
    /// of low nibbles.
    #[serde(rename = "q5_K")]
    Q5K,
    /// Super-blocks of 256 values: 128 bytes of low nibbles, 64 bytes of 2-bit high parts,
    /// 16 signed 8-bit scales (one per 16 values), f16 scale (offset 32).
    #[serde(rename = "q6_K")]
    Q6K,
}

impl DType {
    /// Bytes per element, or per block for the block-quantized types.
    pub fn size(self) -> usize {
        match self {
            DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::Bf16 | DType::I16 => 2,
            DType::I8 => 1,
            DType::Q4_0 => 18,
            DType::Q8_0 => 34,
            DType::Q4K => 144,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    /// Elements per block (1 for the types stored one element at a time). A block-quantized
    /// tensor's `nb[0]` is the block size in bytes and its `ne[0]` a multiple of this.
    pub fn block(self) -> usize {
        match self {
            DType::Q4_0 | DType::Q8_0 | DType::Q4_1 | DType::Q5_0 => 32,
            DType::Q4K | DType::Q5K | DType::Q6K => 256,
            _ => 1,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block() > 1
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Q4_0 => "q4_0",
            DType::Q8_0 => "q8_0",
            DType::Q4K => "q4_K",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5K => "q5_K",
            DType::Q6K => "q6_K",
        }
    }

    /// Types the executor computes with (in f32, rounding on store).
    pub fn is_supported(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16)
    }
}

/// Element-wise binary ops (ggml broadcasting of src1 over src0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// Element-wise unary ops (ggml's GGML_OP_UNARY kinds plus SQR, SQRT, LOG, SIN, COS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Abs,
    Sgn,
    Neg,
    Step,
    Tanh,
    Elu,
    Relu,
    Sigmoid,
    Gelu,
    GeluQuick,
    Silu,
    Hardswish,
    Hardsigmoid,
    Exp,
    GeluErf,
    Floor,
    Ceil,
    Round,
    Trunc,
    Sqr,
    Sqrt,
    Log,
    Sin,
    Cos,
}

/// Every op the executor knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Binary(BinaryOp),
    Unary(UnaryOp),
    /// y = s*x + b with s = f32 bits of op_params[0], b = f32 bits of op_params[1].
    Scale,
    /// y = max(min(x, hi), lo) with lo = op_params[0], hi = op_params[1] (f32 bits).
    Clamp,
    /// ggml's soft_max_ext over each row: x·scale (+ slope·mask) and optional sinks; inputs x,
    /// then the mask if `mask`, then the sinks if `sinks`.
    SoftMax {
        mask: bool,
        sinks: bool,
    },
    /// ggml's ROPE (normal or NeoX mode, YaRN parameters, no offset): inputs x (f32/f16), the
    /// i32 positions (one per x row of dimension 2), and the f32 frequency factors if `ff`.
    Rope {
        ff: bool,
    },
    /// Gated linear units: y = act(x) * g, inputs (x, g) of the output's shape.
    Glu(UnaryOp),
    /// Per row: y = x / sqrt(mean(x²) + eps), eps = f32 bits of op_params[0].
    RmsNorm,
    /// Per row: y = (x - mean) / sqrt(var + eps), eps = f32 bits of op_params[0].
    Norm,
    /// RMS_NORM followed by MUL with one weight row (llama's attn_norm / ffn_norm, fused by
    /// the backend): y = x / sqrt(mean(x²) + eps) * w, w of ne[0] elements repeated over rows.
    RmsNormMul,
    /// `RmsNormMul` then the ADD of a residual of x's shape (gemma's norms after the attention
    /// and the block, fused by the backend): inputs x, r, w; y = rms_norm(x) * w + r.
    RmsNormMulAdd,
    /// ggml's MUL_MAT: dst[m, n, i2, i3] = sum_k src0[k, m, i2/r2, i3/r3] * src1[k, n, i2, i3].
    MulMat,
    /// Two MUL_MATs of one activation and their split GLU, fused by the backend (a feed-forward
    /// block's gate and up projections): y = act(gate . x) * (up . x); inputs the gate
    /// weights, the up weights (MUL_MAT's src0, one type and shape) and x (MUL_MAT's src1).
    MulMatGlu(UnaryOp),
    /// A MUL_MAT and the ADD of its product and r, fused by the backend (residual connections,
    /// biases): y = w . x + r, r repeated over the product; inputs the weights, x and r.
    MulMatAdd,
    /// RMS_NORM, MUL by one weight row n, then MUL_MAT (`None`) or a gate/up MUL_MAT pair and
    /// its GLU (`Some(act)`) of the result, fused by the backend (llama's attn_norm / ffn_norm
    /// and the projections reading them): inputs the weights (gate, up), x (the norm's
    /// input), n; op_params[0] = eps.
    NormedMulMat(Option<UnaryOp>),
    /// `NormedMulMat(None)` whose product, viewed as the output's `[D, H, N]`, is rotated as
    /// `Rope` rotates its input (llama's Q and K projections and their ROPE, fused by the
    /// backend): inputs the weights, x (the norm's input), n, the i32 positions, and the f32
    /// frequency factors if `ff`; op_params[0..=10] the rope's, op_params[11] = eps. With
    /// `head_norm` (qwen3's per-head Q and K norms, RMS_NORM then MUL by a weight row of one
    /// head) each head of the product is normalised before the rotation: one more input, the
    /// head's weights f32 [D], and op_params[12] = that norm's eps.
    /// With `bias` (qwen2's Q and K) one row of the product's values is added before the
    /// rotation: the last input, f32 [M].
    NormedMulMatRope {
        ff: bool,
        head_norm: bool,
        bias: bool,
    },
    /// `NormedMulMat(None)` plus one row of values added to every product (qwen2's V bias):
    /// inputs the weights, x, n, the bias f32 [M]; op_params[0] = eps.
    NormedMulMatBias,
    /// llama's Q, K and V projections of one normalised x, fused by the backend: Q and K as
    /// `NormedMulMatRope`, V as `NormedMulMat(None)`; inputs Wq, Wk, Wv, x, n, the positions and
    /// the frequency factors if `ff`, then with `head_norm` Q's and K's head weights; outputs Q
    /// (f32), then K and V (extra outputs); op_params as `NormedMulMatRope`'s.
    /// With `bias`, then Q's, K's and V's biases.
    NormedQkv {
        ff: bool,
        head_norm: bool,
        bias: bool,
    },
    /// A feed-forward block, fused by the backend: `NormedMulMat(Some(act))` then `MulMatAdd`
    /// of its result; inputs Wg, Wu, Wd, x, n, r; outputs Wd . h + r, then h (the extra
    /// output); op_params[0] = eps.
    NormedFfn(UnaryOp),
    /// The attention output projection with its residual, then the feed-forward block, fused by
    /// the backend: `MulMatAdd` (Wo, a, r0) into r1, then `NormedFfn` with x = r = r1; inputs
    /// Wo, a, r0, Wg, Wu, Wd, n; outputs Wd . h + r1, then r1 and h (the extra outputs);
    /// op_params[0] = eps.
    ProjectedFfn(UnaryOp),
    /// The attention of a decode step, then `ProjectedFfn`, fused by the backend:
    /// `FlashAttnExt` (q, k, v, mask) into a, then `ProjectedFfn` (Wo, a viewed as [Ka, N], r0,
    /// Wg, Wu, Wd, n); inputs q, k, v, mask, Wo, r0, Wg, Wu, Wd, n; outputs Wd . h + r1, then a,
    /// r1 and h (the extra outputs); op_params FLASH_ATTN_EXT's three, then eps.
    AttnFfn(UnaryOp),
    /// `AttnFfn` without the block's down projection (for a Wd of another weight type, which
    /// runs as its MUL_MAT_ADD after it): `FlashAttnExt` into a, `MulMatAdd` (Wo, a, r0) into
    /// r1, then `NormedMulMat(Some(_))` (Wg, Wu, r1, n) into h; inputs q, k, v, mask, Wo, r0,
    /// Wg, Wu, n; outputs h, then a and r1; op_params `AttnFfn`'s.
    AttnGlu(UnaryOp),
    /// A llama decode layer, fused by the backend: `NormedQkv` of the same `ff`, `head_norm`
    /// and `bias` (Wq, Wk, Wv, x, n_attn, positions[, factors][, its own inputs]) into Q, K rows
    /// and V rows, then `AttnFfn` with q = Q (viewed as [D, 1, Hq, 1]) and r0 = x, its k and v
    /// cache views seeing the new rows; inputs `NormedQkv`'s, then k, v, mask, Wo, Wg, Wu, Wd,
    /// n_ffn; outputs the layer's output, then Q, K rows, V rows, a, r1 and h; op_params
    /// `NormedQkv`'s first twelve, FLASH_ATTN_EXT's three, the FFN norm's eps, then with
    /// `head_norm` the heads' eps (`NormedQkv`'s op_params[12]). `post_norm` (gemma's layers):
    /// the attention's projection and the block's down projection each without its residual
    /// (o and d), then r1 = rms_norm(o) · n_post_attn + r0 and out = rms_norm(d) · n_post_ffn +
    /// r1 (`RmsNormMulAdd`'s); the two norms' weights are the last inputs, o and d the last
    /// outputs, their eps op_params[17] and [18].
    DecodeLayer {
        ff: bool,
        head_norm: bool,
        bias: bool,
        post_norm: bool,
        act: UnaryOp,
    },
    /// ggml's ARGMAX: per row of an f32 matrix, the i32 index of its largest value (the last
    /// one among equals, as ggml-cpu's loop finds it).
    ArgMax,
    /// ggml's COUNT_EQUAL: the number of equal elements of two i32 tensors, as one i64.
    CountEqual,
    /// ggml's CROSS_ENTROPY_LOSS: −(1/rows) Σ_rows Σ_i labels_i · log_softmax(logits)_i, one f32.
    CrossEntropyLoss,
    /// ggml's FLASH_ATTN_EXT: per query row and head, softmax(scale·q·kᵀ (softcapped) +
    /// slope·mask, with the sink) · v; inputs q (f32), k, v, then the f16 mask if `mask`, then
    /// the f32 sinks if `sinks`; output f32 `[Dv, n_head, n_q, n_seq]`.
    FlashAttnExt {
        mask: bool,
        sinks: bool,
    },
    /// ggml's DUP, CPY and CONT: input 0's elements copied into the output in logical
    /// (row-major) order, converting between f32, f16 and bf16; equal element counts, any
    /// shapes and strides.
    Copy,
    /// ggml's SET_ROWS: `dst[:, idx[i, i02 % n11, i03 % n12], i02, i03] = src[:, i, i02, i03]`;
    /// inputs the rows (f32/f16) and the i32/i64 indices, the output the whole destination
    /// (f32/f16/bf16), written in place (rows not indexed keep their values).
    SetRows,
    /// SET_ROWS into rows apart: input 0's rows (f32/f16/bf16) `[ne0, T]` copied and converted
    /// into T outputs, row t into output t (`[ne0]` each, f32/f16/bf16): the output and the
    /// extra outputs, one per row (`outputs` 0 in the capabilities).
    CopyRows,
}

const BINARY: &[(&str, BinaryOp)] = &[
    ("ADD", BinaryOp::Add),
    ("SUB", BinaryOp::Sub),
    ("MUL", BinaryOp::Mul),
    ("DIV", BinaryOp::Div),
];

const UNARY: &[(&str, UnaryOp)] = &[
    ("ABS", UnaryOp::Abs),
    ("SGN", UnaryOp::Sgn),
    ("NEG", UnaryOp::Neg),
    ("STEP", UnaryOp::Step),
    ("TANH", UnaryOp::Tanh),
    ("ELU", UnaryOp::Elu),
    ("RELU", UnaryOp::Relu),
    ("SIGMOID", UnaryOp::Sigmoid),
    ("GELU", UnaryOp::Gelu),
    ("GELU_QUICK", UnaryOp::GeluQuick),
    ("SILU", UnaryOp::Silu),
    ("HARDSWISH", UnaryOp::Hardswish),
    ("HARDSIGMOID", UnaryOp::Hardsigmoid),
    ("EXP", UnaryOp::Exp),
    ("GELU_ERF", UnaryOp::GeluErf),
    ("FLOOR", UnaryOp::Floor),
    ("CEIL", UnaryOp::Ceil),
    ("ROUND", UnaryOp::Round),
    ("TRUNC", UnaryOp::Trunc),
    ("SQR", UnaryOp::Sqr),
    ("SQRT", UnaryOp::Sqrt),
    ("LOG", UnaryOp::Log),
    ("SIN", UnaryOp::Sin),
    ("COS", UnaryOp::Cos),
];

/// Architectures the compiler targets.
pub const ARCHS: &[&str] = &["aie2", "aie2p"];

/// Element types every op accepts, for every operand independently.
pub const TYPES: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

/// Block-quantized weight types MUL_MAT accepts for its first input (the weights) only.
pub const WEIGHT_TYPES: &[DType] = &[
    DType::Q4_0,
    DType::Q8_0,
    DType::Q4K,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5K,
    DType::Q6K,
];

impl Op {
    pub fn from_name(name: &str) -> Option<Op> {
        if let Some((_, b)) = BINARY.iter().find(|(n, _)| *n == name) {
            return Some(Op::Binary(*b));
        }
        if let Some((_, u)) = UNARY.iter().find(|(n, _)| *n == name) {
            return Some(Op::Unary(*u));
        }
        match name {
            "SCALE" => Some(Op::Scale),
            "CLAMP" => Some(Op::Clamp),
            "MUL_MAT" => Some(Op::MulMat),
            "RMS_NORM" => Some(Op::RmsNorm),
            "SOFT_MAX" => Some(Op::SoftMax {
                mask: false,
                sinks: false,
            }),
            "SOFT_MAX_MASK" => Some(Op::SoftMax {
                mask: true,
                sinks: false,
            }),
            "SOFT_MAX_SINKS" => Some(Op::SoftMax {
                mask: false,
                sinks: true,
            }),
            "SOFT_MAX_MASK_SINKS" => Some(Op::SoftMax {
                mask: true,
                sinks: true,
            }),
            "ROPE" => Some(Op::Rope { ff: false }),
            "ROPE_FF" => Some(Op::Rope { ff: true }),
            "REGLU" => Some(Op::Glu(UnaryOp::Relu)),
            "GEGLU" => Some(Op::Glu(UnaryOp::Gelu)),
            "SWIGLU" => Some(Op::Glu(UnaryOp::Silu)),
            "GEGLU_ERF" => Some(Op::Glu(UnaryOp::GeluErf)),
            "GEGLU_QUICK" => Some(Op::Glu(UnaryOp::GeluQuick)),
            "MUL_MAT_ADD" => Some(Op::MulMatAdd),
            "MUL_MAT_REGLU" => Some(Op::MulMatGlu(UnaryOp::Relu)),
            "MUL_MAT_GEGLU" => Some(Op::MulMatGlu(UnaryOp::Gelu)),
            "MUL_MAT_SWIGLU" => Some(Op::MulMatGlu(UnaryOp::Silu)),
            "MUL_MAT_GEGLU_ERF" => Some(Op::MulMatGlu(UnaryOp::GeluErf)),
            "MUL_MAT_GEGLU_QUICK" => Some(Op::MulMatGlu(UnaryOp::GeluQuick)),
            "RMS_NORM_MUL_MAT" => Some(Op::NormedMulMat(None)),
            "RMS_NORM_MUL_MAT_REGLU" => Some(Op::NormedMulMat(Some(UnaryOp::Relu))),
            "RMS_NORM_MUL_MAT_GEGLU" => Some(Op::NormedMulMat(Some(UnaryOp::Gelu))),
            "RMS_NORM_MUL_MAT_SWIGLU" => Some(Op::NormedMulMat(Some(UnaryOp::Silu))),
            "RMS_NORM_MUL_MAT_GEGLU_ERF" => Some(Op::NormedMulMat(Some(UnaryOp::GeluErf))),
            "RMS_NORM_MUL_MAT_GEGLU_QUICK" => Some(Op::NormedMulMat(Some(UnaryOp::GeluQuick))),
            "RMS_NORM_MUL_MAT_ROPE" => Some(Op::NormedMulMatRope {
                ff: false,
                head_norm: false,
                bias: false,
            }),
            "RMS_NORM_MUL_MAT_ROPE_FF" => Some(Op::NormedMulMatRope {
                ff: true,
                head_norm: false,
                bias: false,
            }),
            "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE" => Some(Op::NormedMulMatRope {
                ff: false,
                head_norm: true,
                bias: false,
            }),
            "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE_FF" => Some(Op::NormedMulMatRope {
                ff: true,
                head_norm: true,
                bias: false,
            }),
            "RMS_NORM_MUL_MAT_BIAS_ROPE" => Some(Op::NormedMulMatRope {
                ff: false,
                head_norm: false,
                bias: true,
            }),
            "RMS_NORM_MUL_MAT_BIAS_ROPE_FF" => Some(Op::NormedMulMatRope {
                ff: true,
                head_norm: false,
                bias: true,
            }),
            "RMS_NORM_QKV_ROPE" => Some(Op::NormedQkv {
                ff: false,
                head_norm: false,
                bias: false,
            }),
            "RMS_NORM_QKV_ROPE_FF" => Some(Op::NormedQkv {
                ff: true,
                head_norm: false,
                bias: false,
            }),
            "RMS_NORM_QKV_HEAD_NORM_ROPE" => Some(Op::NormedQkv {
                ff: false,
                head_norm: true,
                bias: false,
            }),
            "RMS_NORM_QKV_HEAD_NORM_ROPE_FF" => Some(Op::NormedQkv {
                ff: true,
                head_norm: true,
                bias: false,
            }),
            "RMS_NORM_QKV_BIAS_ROPE" => Some(Op::NormedQkv {
                ff: false,
                head_norm: false,
                bias: true,
            }),
            "RMS_NORM_QKV_BIAS_ROPE_FF" => Some(Op::NormedQkv {
                ff: true,
                head_norm: false,
                bias: true,
            }),
            "RMS_NORM_MUL_MAT_BIAS" => Some(Op::NormedMulMatBias),
            "RMS_NORM_FFN_REGLU" => Some(Op::NormedFfn(UnaryOp::Relu)),
            "RMS_NORM_FFN_GEGLU" => Some(Op::NormedFfn(UnaryOp::Gelu)),
            "RMS_NORM_FFN_SWIGLU" => Some(Op::NormedFfn(UnaryOp::Silu)),
            "RMS_NORM_FFN_GEGLU_ERF" => Some(Op::NormedFfn(UnaryOp::GeluErf)),
            "RMS_NORM_FFN_GEGLU_QUICK" => Some(Op::NormedFfn(UnaryOp::GeluQuick)),
            "MUL_MAT_ADD_RMS_NORM_FFN_REGLU" => Some(Op::ProjectedFfn(UnaryOp::Relu)),
            "MUL_MAT_ADD_RMS_NORM_FFN_GEGLU" => Some(Op::ProjectedFfn(UnaryOp::Gelu)),
            "MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU" => Some(Op::ProjectedFfn(UnaryOp::Silu)),
            "MUL_MAT_ADD_RMS_NORM_FFN_GEGLU_ERF" => Some(Op::ProjectedFfn(UnaryOp::GeluErf)),
            "MUL_MAT_ADD_RMS_NORM_FFN_GEGLU_QUICK" => Some(Op::ProjectedFfn(UnaryOp::GeluQuick)),
            name if name.starts_with("DECODE_LAYER_") => {
                let post_norm = name.contains("_POST_NORM_");
                let (qkv, attn) = Op::decode_layer_kernels(name)?;
                match (Op::from_name(&qkv)?, Op::from_name(&attn)?) {
                    (
                        Op::NormedQkv {
                            ff,
                            head_norm,
                            bias,
                        },
                        Op::AttnFfn(act),
                    ) if !(post_norm && (ff || bias)) => Some(Op::DecodeLayer {
                        ff,
                        head_norm,
                        bias,
                        post_norm,
                        act,
                    }),
                    _ => None,
                }
            }
            "FLASH_ATTN_FFN_REGLU" => Some(Op::AttnFfn(UnaryOp::Relu)),
            "FLASH_ATTN_FFN_GEGLU" => Some(Op::AttnFfn(UnaryOp::Gelu)),
            "FLASH_ATTN_FFN_SWIGLU" => Some(Op::AttnFfn(UnaryOp::Silu)),
            "FLASH_ATTN_FFN_GEGLU_ERF" => Some(Op::AttnFfn(UnaryOp::GeluErf)),
            "FLASH_ATTN_FFN_GEGLU_QUICK" => Some(Op::AttnFfn(UnaryOp::GeluQuick)),
            "FLASH_ATTN_GLU_REGLU" => Some(Op::AttnGlu(UnaryOp::Relu)),
            "FLASH_ATTN_GLU_GEGLU" => Some(Op::AttnGlu(UnaryOp::Gelu)),
            "FLASH_ATTN_GLU_SWIGLU" => Some(Op::AttnGlu(UnaryOp::Silu)),
            "FLASH_ATTN_GLU_GEGLU_ERF" => Some(Op::AttnGlu(UnaryOp::GeluErf)),
            "FLASH_ATTN_GLU_GEGLU_QUICK" => Some(Op::AttnGlu(UnaryOp::GeluQuick)),
            "NORM" => Some(Op::Norm),
            "RMS_NORM_MUL" => Some(Op::RmsNormMul),
            "RMS_NORM_MUL_ADD" => Some(Op::RmsNormMulAdd),
            "ARGMAX" => Some(Op::ArgMax),
            "COUNT_EQUAL" => Some(Op::CountEqual),
            "CROSS_ENTROPY_LOSS" => Some(Op::CrossEntropyLoss),
            "FLASH_ATTN_EXT" => Some(Op::FlashAttnExt {
                mask: false,
                sinks: false,
            }),
            "FLASH_ATTN_EXT_MASK" => Some(Op::FlashAttnExt {
                mask: true,
                sinks: false,
            }),
            "FLASH_ATTN_EXT_SINKS" => Some(Op::FlashAttnExt {
                mask: false,
                sinks: true,
            }),
            "FLASH_ATTN_EXT_MASK_SINKS" => Some(Op::FlashAttnExt {
                mask: true,
                sinks: true,
            }),
            "DUP" | "CPY" | "CONT" => Some(Op::Copy),
            "SET_ROWS" => Some(Op::SetRows),
            "CPY_ROWS" => Some(Op::CopyRows),
            _ => None,
        }
    }

    /// The names of the two kernels a `DECODE_LAYER[_BIAS|_HEAD_NORM][_POST_NORM][_FF]_<GLU>`
    /// name merges: `RMS_NORM_QKV[_BIAS|_HEAD_NORM]_ROPE[_FF]` and `FLASH_ATTN_FFN_<GLU>` (not
    /// necessarily ops: `from_name` says; with post norms the second is the shape of the
    /// attention and the block, whose residuals come after the norms).
    pub fn decode_layer_kernels(name: &str) -> Option<(String, String)> {
        let rest = name.strip_prefix("DECODE_LAYER_")?;
        let (own, rest) = [("_BIAS", "BIAS_"), ("_HEAD_NORM", "HEAD_NORM_")]
            .into_iter()
            .find_map(|(own, prefix)| Some((own, rest.strip_prefix(prefix)?)))
            .unwrap_or(("", rest));
        let rest = rest.strip_prefix("POST_NORM_").unwrap_or(rest);
        let (ff, glu) = match rest.strip_prefix("FF_") {
            Some(glu) => ("_FF", glu),
            None => ("", rest),
        };
        Some((
            format!("RMS_NORM_QKV{own}_ROPE{ff}"),
            format!("FLASH_ATTN_FFN_{glu}"),
        ))
    }

    /// A `DecodeLayer`'s Q/K/V kernel, whose inputs are the layer's first (`None` for other
    /// ops).
    pub fn layer_qkv(self) -> Option<Op> {
        match self {
            Op::DecodeLayer {
                ff,
                head_norm,
                bias,
                ..
            } => Some(Op::NormedQkv {
                ff,
                head_norm,
                bias,
            }),
            _ => None,
        }
    }

    /// Number of outputs (the output, then the extra outputs); 0: one per row of input 0.
    pub fn outputs(self) -> usize {
        match self {
            Op::CopyRows => 0,
            Op::AttnFfn(_) => 4,
            Op::DecodeLayer { post_norm, .. } => 7 + 2 * usize::from(post_norm),
            Op::NormedQkv { .. } | Op::ProjectedFfn(_) | Op::AttnGlu(_) => 3,
            Op::NormedFfn(_) => 2,
            _ => 1,
        }
    }

    /// Number of input tensors.
    pub fn arity(self) -> usize {
        match self {
            Op::Binary(_)
            | Op::MulMat
            | Op::Glu(_)
            | Op::CountEqual
            | Op::CrossEntropyLoss
            | Op::RmsNormMul
            | Op::SetRows => 2,
            Op::SoftMax { mask, sinks } => 1 + usize::from(mask) + usize::from(sinks),
            Op::Rope { ff } => 2 + usize::from(ff),
            Op::MulMatGlu(_) | Op::MulMatAdd | Op::NormedMulMat(None) | Op::RmsNormMulAdd => 3,
            Op::NormedMulMat(Some(_)) => 4,
            Op::NormedMulMatBias => 4,
            Op::NormedMulMatRope {
                ff,
                head_norm,
                bias,
            } => 4 + usize::from(ff) + usize::from(head_norm) + usize::from(bias),
            Op::NormedQkv {
                ff,
                head_norm,
                bias,
            } => 6 + usize::from(ff) + 2 * usize::from(head_norm) + 3 * usize::from(bias),
            Op::NormedFfn(_) => 6,
            Op::ProjectedFfn(_) => 7,
            Op::AttnFfn(_) => 10,
            Op::AttnGlu(_) => 9,
            // The Q/K/V kernel's, then k, v, mask, Wo, Wg, Wu, Wd, n_ffn.
            Op::DecodeLayer { post_norm, .. } => {
                self.layer_qkv().map_or(0, Op::arity) + 8 + 2 * usize::from(post_norm)
            }
            Op::FlashAttnExt { mask, sinks } => 3 + usize::from(mask) + usize::from(sinks),
            _ => 1,
        }
    }

    /// Every op name, in catalogue order.
    pub fn all_names() -> Vec<&'static str> {
        let mut v: Vec<&'static str> = BINARY.iter().map(|(n, _)| *n).collect();
        v.extend(UNARY.iter().map(|(n, _)| *n));
        v.push("SCALE");
        v.push("CLAMP");
        v.push("MUL_MAT");
        v.extend([
            "MUL_MAT_REGLU",
            "MUL_MAT_GEGLU",
            "MUL_MAT_SWIGLU",
            "MUL_MAT_GEGLU_ERF",
            "MUL_MAT_GEGLU_QUICK",
            "MUL_MAT_ADD",
        ]);
        v.push("RMS_NORM");
        v.push("NORM");
        v.extend([
            "SOFT_MAX",
            "SOFT_MAX_MASK",
            "SOFT_MAX_SINKS",
            "SOFT_MAX_MASK_SINKS",
        ]);
        v.extend(["ROPE", "ROPE_FF"]);
        v.extend(["REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK"]);
        v.extend(["ARGMAX", "COUNT_EQUAL", "CROSS_ENTROPY_LOSS"]);
        v.extend([
            "FLASH_ATTN_EXT",
            "FLASH_ATTN_EXT_MASK",
            "FLASH_ATTN_EXT_SINKS",
            "FLASH_ATTN_EXT_MASK_SINKS",
        ]);
        v.push("RMS_NORM_MUL");
        v.push("RMS_NORM_MUL_ADD");
        v.extend([
            "RMS_NORM_MUL_MAT",
            "RMS_NORM_MUL_MAT_REGLU",
            "RMS_NORM_MUL_MAT_GEGLU",
            "RMS_NORM_MUL_MAT_SWIGLU",
            "RMS_NORM_MUL_MAT_GEGLU_ERF",
            "RMS_NORM_MUL_MAT_GEGLU_QUICK",
            "RMS_NORM_MUL_MAT_ROPE",
            "RMS_NORM_MUL_MAT_ROPE_FF",
            "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE",
            "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE_FF",
            "RMS_NORM_MUL_MAT_BIAS",
            "RMS_NORM_MUL_MAT_BIAS_ROPE",
            "RMS_NORM_MUL_MAT_BIAS_ROPE_FF",
            "RMS_NORM_QKV_ROPE",
            "RMS_NORM_QKV_ROPE_FF",
            "RMS_NORM_QKV_HEAD_NORM_ROPE",
            "RMS_NORM_QKV_HEAD_NORM_ROPE_FF",
            "RMS_NORM_QKV_BIAS_ROPE",
            "RMS_NORM_QKV_BIAS_ROPE_FF",
            "RMS_NORM_FFN_REGLU",
            "RMS_NORM_FFN_GEGLU",
            "RMS_NORM_FFN_SWIGLU",
            "RMS_NORM_FFN_GEGLU_ERF",
            "RMS_NORM_FFN_GEGLU_QUICK",
            "MUL_MAT_ADD_RMS_NORM_FFN_REGLU",
            "MUL_MAT_ADD_RMS_NORM_FFN_GEGLU",
            "MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU",
            "MUL_MAT_ADD_RMS_NORM_FFN_GEGLU_ERF",
            "MUL_MAT_ADD_RMS_NORM_FFN_GEGLU_QUICK",
            "FLASH_ATTN_FFN_REGLU",
            "FLASH_ATTN_FFN_GEGLU",
            "FLASH_ATTN_FFN_SWIGLU",
            "FLASH_ATTN_FFN_GEGLU_ERF",
            "FLASH_ATTN_FFN_GEGLU_QUICK",
            "FLASH_ATTN_GLU_REGLU",
            "FLASH_ATTN_GLU_GEGLU",
            "FLASH_ATTN_GLU_SWIGLU",
            "FLASH_ATTN_GLU_GEGLU_ERF",
            "FLASH_ATTN_GLU_GEGLU_QUICK",
        ]);
        v.extend([
            "DECODE_LAYER_REGLU",
            "DECODE_LAYER_GEGLU",
            "DECODE_LAYER_SWIGLU",
            "DECODE_LAYER_GEGLU_ERF",
            "DECODE_LAYER_GEGLU_QUICK",
            "DECODE_LAYER_FF_REGLU",
            "DECODE_LAYER_FF_GEGLU",
            "DECODE_LAYER_FF_SWIGLU",
            "DECODE_LAYER_FF_GEGLU_ERF",
            "DECODE_LAYER_FF_GEGLU_QUICK",
            "DECODE_LAYER_BIAS_REGLU",
            "DECODE_LAYER_BIAS_GEGLU",
            "DECODE_LAYER_BIAS_SWIGLU",
            "DECODE_LAYER_BIAS_GEGLU_ERF",
            "DECODE_LAYER_BIAS_GEGLU_QUICK",
            "DECODE_LAYER_HEAD_NORM_REGLU",
            "DECODE_LAYER_HEAD_NORM_GEGLU",
            "DECODE_LAYER_HEAD_NORM_SWIGLU",
            "DECODE_LAYER_HEAD_NORM_GEGLU_ERF",
            "DECODE_LAYER_HEAD_NORM_GEGLU_QUICK",
            "DECODE_LAYER_POST_NORM_REGLU",
            "DECODE_LAYER_POST_NORM_GEGLU",
            "DECODE_LAYER_POST_NORM_SWIGLU",
            "DECODE_LAYER_POST_NORM_GEGLU_ERF",
            "DECODE_LAYER_POST_NORM_GEGLU_QUICK",
            "DECODE_LAYER_HEAD_NORM_POST_NORM_REGLU",
            "DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU",
            "DECODE_LAYER_HEAD_NORM_POST_NORM_SWIGLU",
            "DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU_ERF",
            "DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU_QUICK",
        ]);
        v.extend(["SET_ROWS", "DUP", "CPY", "CONT", "CPY_ROWS"]);
        v
    }

    /// Whether the op reduces its input to fewer output elements (its cost is per input
    /// element).
    pub fn is_reduction(self) -> bool {
        matches!(self, Op::ArgMax | Op::CountEqual | Op::CrossEntropyLoss)
    }

    /// The element types operand `i` may have (the inputs in order, then the outputs from
    /// `i == arity()`).
    pub fn operand_types(self, i: usize) -> Vec<DType> {
        let output = i >= self.arity();
        match self {
            Op::Rope { .. } if i == 1 => vec![DType::I32],
            Op::NormedMulMatRope { .. } if i == 3 => vec![DType::I32],
            // x, n and the frequency factors f32; the output f32, or f16/bf16 (K's rows of the
            // KV cache).
            Op::NormedMulMatRope { .. } if i > 0 && !output => vec![DType::F32],
            Op::NormedQkv { .. } if i == 5 => vec![DType::I32],
            // x, n and the frequency factors f32; Q f32; K and V f32, or f16/bf16 (the cache).
            Op::NormedQkv { .. } if (3..=self.arity()).contains(&i) => vec![DType::F32],
            // x, n, r and both outputs f32.
            Op::NormedFfn(_) if i >= 3 => vec![DType::F32],
            // a, r0, n and the three outputs f32.
            Op::ProjectedFfn(_) if !self.is_weight(i) => vec![DType::F32],
            // k and v any float type, the mask f16, q, r0, n and the outputs f32.
            Op::AttnFfn(_) | Op::AttnGlu(_) if matches!(i, 1 | 2) => TYPES.to_vec(),
            Op::AttnFfn(_) | Op::AttnGlu(_) if i == 3 => vec![DType::F16],
            Op::AttnFfn(_) | Op::AttnGlu(_) if !self.is_weight(i) => vec![DType::F32],
            // The positions i32, the caches any float type, the mask f16; K's and V's rows f32,
            // f16 or bf16 (the cache's); the rest f32.
            Op::DecodeLayer { .. } => {
                let b = self.layer_qkv().map_or(0, Op::arity);
                match i {
                    5 => vec![DType::I32],
                    _ if i == b || i == b + 1 => TYPES.to_vec(),
                    _ if i == b + 2 => vec![DType::F16],
                    _ if self.is_weight(i) => TYPES.iter().chain(WEIGHT_TYPES).copied().collect(),
                    _ if i == self.arity() + 2 || i == self.arity() + 3 => TYPES.to_vec(),
                    _ => vec![DType::F32],
                }
            }
            _ if self.is_weight(i) => TYPES.iter().chain(WEIGHT_TYPES).copied().collect(),
            Op::ArgMax if output => vec![DType::I32],
            Op::ArgMax => vec![DType::F32],
            Op::CountEqual if output => vec![DType::I64],
            Op::CountEqual => vec![DType::I32],
            Op::CrossEntropyLoss => vec![DType::F32],
            // f32 or f16 rows, i32 or i64 indices, a float destination.
            Op::SetRows if i == 0 => vec![DType::F32, DType::F16],
            Op::SetRows if i == 1 => vec![DType::I32, DType::I64],
            // q and the output f32, k and v any float type, the mask f16, the sinks f32.
            Op::FlashAttnExt { mask, .. } => match i {
                1 | 2 => TYPES.to_vec(),
                3 if mask => vec![DType::F16],
                _ => vec![DType::F32],
            },
            _ => TYPES.to_vec(),
        }
    }

    /// Whether operand `i` is a MUL_MAT's weights (f32/f16/bf16 or ggml's quantized blocks).
    pub fn is_weight(self, i: usize) -> bool {
        match self {
            Op::MulMat
            | Op::MulMatAdd
            | Op::NormedMulMat(None)
            | Op::NormedMulMatBias
            | Op::NormedMulMatRope { .. } => i == 0,
            Op::MulMatGlu(_) | Op::NormedMulMat(Some(_)) => i < 2,
            Op::NormedQkv { .. } | Op::NormedFfn(_) => i < 3,
            Op::ProjectedFfn(_) => matches!(i, 0 | 3 | 4 | 5),
            Op::AttnFfn(_) => matches!(i, 4 | 6 | 7 | 8),
            Op::AttnGlu(_) => matches!(i, 4 | 6 | 7),
            // Wq, Wk, Wv, then Wo, Wg, Wu, Wd after the Q/K/V kernel's other inputs, k, v and
            // the mask.
            Op::DecodeLayer { .. } => {
                let b = self.layer_qkv().map_or(0, Op::arity);
                i < 3 || (b + 3..b + 7).contains(&i)
            }
            _ => false,
        }
    }

    /// Every type any operand may have, in the order the operands first name them.
    pub fn all_types(self) -> Vec<DType> {
        let mut all = Vec::new();
        for i in 0..self.arity() + self.outputs() {
            for t in self.operand_types(i) {
                if !all.contains(&t) {
                    all.push(t);
                }
            }
        }
        all
    }

    /// Arithmetic operations per output element (cost-model input); `k` is the reduction length
    /// of a MUL_MAT.
    pub fn flops_per_element(self, k: u64) -> u64 {
        match self {
            // Per input element (see `is_reduction`).
            Op::ArgMax | Op::CountEqual => 1,
            Op::CrossEntropyLoss => 6,
            Op::MulMat => 2 * k,
            // Two products and the GLU.
            Op::MulMatGlu(_) => 4 * k + 9,
            Op::MulMatAdd => 2 * k + 1,
            // The products, and the norm of x's row (3 per element of it) spread over the row's
            // outputs: counted as one more operation per output.
            Op::NormedMulMat(None) => 2 * k + 1,
            Op::NormedMulMatBias => 2 * k + 2,
            Op::NormedMulMat(Some(_)) => 4 * k + 10,
            // The product's, then the rotation's.
            Op::NormedMulMatRope { .. } => 2 * k + 1 + 6,
            // Per output element of Q, K and V (the rotation counted on all three).
            Op::NormedQkv { .. } => 2 * k + 1 + 6,
            // Per element of h (the norm, both products and the GLU); `stats_of` adds the down
            // product and the ADD per output element.
            Op::NormedFfn(_) => 4 * k + 10,
            // Per element of r1 (the projection and the ADD); `stats_of` adds the block's.
            Op::ProjectedFfn(_) => 2 * k + 1,
            // Per query row, head and key, as FlashAttnExt's; `stats_of` adds the rest.
            Op::AttnFfn(_) | Op::AttnGlu(_) => 4 * k,
            // Per element of the layer's output; `stats_of` counts the parts.
            Op::DecodeLayer { .. } => 2 * k,
            // Per query row, head and key (the executor multiplies by rows and keys): the q·k
            // dot product and the v update, 2·D + 2·Dv, counted as 4·D with k = D.
            Op::FlashAttnExt { .. } => 4 * k,
            Op::RmsNorm | Op::Norm => 4,
            Op::RmsNormMul => 5,
            Op::RmsNormMulAdd => 6,
            Op::Glu(_) => 9,
            Op::SoftMax { .. } => 5,
            Op::Rope { .. } => 6,
            Op::Binary(_) | Op::Copy | Op::SetRows | Op::CopyRows => 1,
            Op::Scale | Op::Clamp => 2,
            Op::Unary(UnaryOp::Gelu | UnaryOp::GeluErf | UnaryOp::GeluQuick | UnaryOp::Silu) => 8,
            Op::Unary(_) => 2,
        }
    }

    /// What op_params means for this op (for the capabilities listing).
    pub fn params_doc(self) -> &'static str {
        match self {
            Op::Scale => "op_params[0] = scale, op_params[1] = bias (f32 bit patterns); y = scale*x + bias",
            Op::Clamp => "op_params[0] = min, op_params[1] = max (f32 bit patterns); y = max(min(x, max), min)",
            Op::SoftMax { .. } => "op_params[0] = scale, op_params[1] = max_bias (f32 bit patterns); inputs x, [mask f32/f16], [sinks f32]",
            Op::Rope { .. } => "ggml's rope op_params: [1] n_dims, [2] mode (0 normal, 2 neox), [4] n_ctx_orig, [5..11] freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow (f32 bits), [15] offset (must be 0); inputs x, positions i32, [freq factors f32]",
            Op::Glu(_) => "unused; inputs (x, g) of the output's shape; y = act(x) * g",
            Op::RmsNorm | Op::Norm => "op_params[0] = eps (f32 bit pattern); normalises each row (dimension 0)",
            Op::RmsNormMul => "op_params[0] = eps (f32 bit pattern); inputs x and one weight row w [ne0]; y = rms_norm(x) * w per row",
            Op::RmsNormMulAdd => "op_params[0] = eps (f32 bit pattern); inputs x, r of x's shape and one weight row w [ne0]; y = rms_norm(x) * w + r per row",
            Op::MulMat => "unused; inputs[0] = weights [K, M, B2, B3] (f32/f16/bf16, or q4_0/q4_1/q5_0/q8_0/q4_K/q5_K/q6_K blocks as ggml stores them: nb[0] = block bytes), inputs[1] = activations [K, N, B2*r2, B3*r3], output f32 [M, N, ...]",
            Op::MulMatGlu(_) => "unused; inputs[0] = gate weights, inputs[1] = up weights (one type and shape: MUL_MAT's inputs[0]), inputs[2] = activations (MUL_MAT's inputs[1]), output f32 [M, N, ...] = act(gate . x) * (up . x)",
            Op::MulMatAdd => "unused; inputs[0] = weights, inputs[1] = activations (MUL_MAT's inputs), inputs[2] = r f32, repeated over the product; output f32 [M, N, ...] = w . x + r",
            Op::NormedMulMat(None) => "op_params[0] = eps (f32 bit pattern); inputs[0] = weights (MUL_MAT's inputs[0]), inputs[1] = x f32 [K, N, ...] (not normalised), inputs[2] = n f32 [K]; output f32 [M, N, ...] = w . (rms_norm(x) * n)",
            Op::NormedMulMatBias => "op_params[0] = eps (f32 bit pattern); inputs[0] = weights (MUL_MAT's inputs[0]), inputs[1] = x f32 [K, N, ...] (not normalised), inputs[2] = n f32 [K], inputs[3] = b f32 [M]; output f32/f16/bf16 [M, N, ...] = w . (rms_norm(x) * n) + b (qwen2's V and its bias)",
            Op::NormedMulMat(Some(_)) => "op_params[0] = eps (f32 bit pattern); inputs[0] = gate weights, inputs[1] = up weights, inputs[2] = x f32 [K, N, ...] (not normalised), inputs[3] = n f32 [K]; output f32 [M, N, ...] = act(gate . y) * (up . y), y = rms_norm(x) * n",
            Op::NormedMulMatRope { .. } => "op_params[0..=10] = ggml's rope op_params (as ROPE's), op_params[11] = eps (f32 bit pattern); inputs[0] = weights [K, M] (MUL_MAT's inputs[0]), inputs[1] = x f32 [K, N] (not normalised), inputs[2] = n f32 [K], inputs[3] = positions i32 [>= N], [inputs[4] = frequency factors f32 [>= n_dims / 2]]; output f32/f16/bf16 [D, H, N] with D * H = M: rope(w . (rms_norm(x) * n)) with the product viewed as [D, H, N]; RMS_NORM_MUL_MAT_HEAD_NORM_ROPE(_FF): one more input, the head norm's weights f32 [D] (after the factors), and op_params[12] = its eps: each head of the product RMS-normalised and multiplied by them before the rotation (qwen3's Q and K norms); RMS_NORM_MUL_MAT_BIAS_ROPE(_FF): the last input a bias f32 [M] added to the product before the rotation (qwen2)",
            Op::NormedQkv { .. } => "op_params as RMS_NORM_MUL_MAT_ROPE's; inputs[0..3] = Wq [K, Mq], Wk [K, Mk], Wv [K, Mv] (each its own type, as llama.cpp's Q4_K_M mixes q4_K and q6_K), inputs[3] = x f32 [K, N] (not normalised), inputs[4] = n f32 [K], inputs[5] = positions i32 [>= N], [inputs[6] = frequency factors f32]; output Q f32 [D, Hq, N] = rope(Wq . y), extra outputs K f32/f16/bf16 [D, Hk, N] = rope(Wk . y) and V f32/f16/bf16 [Mv, N] = Wv . y, y = rms_norm(x) * n; RMS_NORM_QKV_HEAD_NORM_ROPE(_FF): then Q's and K's head norm weights f32 [D], Q and K as RMS_NORM_MUL_MAT_HEAD_NORM_ROPE computes them; RMS_NORM_QKV_BIAS_ROPE(_FF): then Q's, K's and V's biases f32 [Mq], [Mk], [Mv], added before the rotation (qwen2)",
            Op::NormedFfn(_) => "op_params[0] = eps (f32 bit pattern); inputs[0..3] = Wg, Wu [K, F] and Wd [F, K] (one type), inputs[3] = x f32 [K, N] (not normalised), inputs[4] = n f32 [K], inputs[5] = r f32 (repeated over the output); output f32 [K, N] = Wd . h + r, extra output h f32 [F, N] = act(Wg . y) * (Wu . y), y = rms_norm(x) * n",
            Op::ProjectedFfn(_) => "op_params[0] = eps (f32 bit pattern); inputs[0] = Wo [Ka, K], inputs[1] = a f32 [Ka, N] (the attention output), inputs[2] = r0 f32 (repeated over [K, N]), inputs[3..6] = Wg, Wu [K, F] and Wd [F, K] (the four weights of one type), inputs[6] = n f32 [K]; output f32 [K, N] = Wd . h + r1, extra outputs r1 f32 [K, N] = Wo . a + r0 and h f32 [F, N] = act(Wg . y) * (Wu . y), y = rms_norm(r1) * n",
            Op::AttnFfn(_) => "op_params[0..3] = FLASH_ATTN_EXT's scale, max_bias, logit_softcap, op_params[3] = eps (f32 bit patterns); inputs[0..4] = q, k, v, mask as FLASH_ATTN_EXT_MASK's, inputs[4] = Wo [Ka, K] (Ka = Dv * n_head), inputs[5] = r0 f32 (repeated over [K, N]), inputs[6..9] = Wg, Wu [K, F] and Wd [F, K] (the four weights of one type), inputs[9] = n f32 [K]; output f32 [K, N] = Wd . h + r1, extra outputs a f32 [Dv, n_head, n_q, n_seq] = the attention, r1 f32 [K, N] = Wo . a + r0 (a viewed as [Ka, N]) and h f32 [F, N] = act(Wg . y) * (Wu . y), y = rms_norm(r1) * n",
            Op::AttnGlu(_) => "as FLASH_ATTN_FFN_<GLU>'s without Wd: op_params[0..3] = FLASH_ATTN_EXT's scale, max_bias, logit_softcap, op_params[3] = eps; inputs[0..4] = q, k, v, mask as FLASH_ATTN_EXT_MASK's, inputs[4] = Wo [Ka, K], inputs[5] = r0 f32, inputs[6..8] = Wg, Wu [K, F] (the three weights of one type), inputs[8] = n f32 [K]; output h f32 [F, N] = act(Wg . y) * (Wu . y), y = rms_norm(r1) * n, extra outputs a f32 [Dv, n_head, n_q, n_seq] = the attention and r1 f32 [K, N] = Wo . a + r0 (a viewed as [Ka, N])",
            Op::DecodeLayer { .. } => "op_params[0..12] = RMS_NORM_QKV_ROPE's (ROPE's op_params, then the attention norm's eps), op_params[12..15] = FLASH_ATTN_EXT's scale, max_bias, logit_softcap, op_params[15] = the FFN norm's eps, DECODE_LAYER_HEAD_NORM_<GLU>: op_params[16] = the heads' eps (f32 bit patterns); inputs Wq, Wk, Wv, x f32 [K, 1], n_attn f32 [K], positions i32, [frequency factors f32,] [DECODE_LAYER_BIAS_<GLU>: Q's, K's and V's biases f32; DECODE_LAYER_HEAD_NORM_<GLU>: Q's and K's head norm weights f32 [D],] k and v (KV-cache views as FLASH_ATTN_EXT's), mask f16, Wo, Wg, Wu, Wd, n_ffn f32 [K] (the seven weights of one type in the IRON design); output f32 [K, 1] = the layer's output; extra outputs Q f32 [D, Hq, 1] (rotated), K rows and V rows (this token's cache rows, f32/f16/bf16), a f32 [Dv, Hq, 1, 1], r1 f32 [K, 1], h f32 [F, 1]: RMS_NORM_QKV[_BIAS|_HEAD_NORM]_ROPE, then FLASH_ATTN_FFN_<GLU> with q = Q and r0 = x, the attention reading the cache with the new rows; DECODE_LAYER[_HEAD_NORM]_POST_NORM_<GLU> (gemma): then inputs n_post_attn and n_post_ffn f32 [K], extra outputs o and d f32 [K, 1], op_params[17] and [18] their eps: o = Wo . a, r1 = rms_norm(o) * n_post_attn + x, d = Wd . h, out = rms_norm(d) * n_post_ffn + r1",
            Op::ArgMax => "unused; input f32 [N, R], output i32 [R]: the index of each row's largest value (the last among equals)",
            Op::CountEqual => "unused; inputs two i32 tensors of one shape, output i64 [1]: how many elements are equal",
            Op::FlashAttnExt { .. } => "op_params[0] = scale, op_params[1] = max_bias, op_params[2] = logit_softcap (f32 bit patterns); inputs q f32 [D, n_q, n_head, n_seq], k [D, n_kv, n_head_kv, n_seq_kv] and v [Dv, n_kv, n_head_kv, n_seq_kv] f32/f16/bf16 (n_head a multiple of n_head_kv), [mask f16 [>= n_kv, >= n_q, n_head/r2, n_seq/r3]], [sinks f32 [n_head]]; output f32 [Dv, n_head, n_q, n_seq]",
            Op::Copy => "unused; input 0 copied into the output in logical (row-major) order, converting between f32, f16 and bf16; equal element counts, any shapes and strides",
            Op::CopyRows => "unused; input 0 rows [ne0, T] (dense rows); outputs T rows [ne0] (the output, then the extra outputs), row t of input 0 copied into output t, converting between f32, f16 and bf16",
            Op::SetRows => "unused; inputs rows [ne0, n, ne2, ne3] (f32/f16) and indices [n, n11, n12] (i32/i64, repeated over dimensions 2 and 3), output the destination [ne0, rows, ne2, ne3] (f32/f16/bf16) written in place: row i of slab (i2, i3) into row idx[i, i2 % n11, i3 % n12]",
            Op::CrossEntropyLoss => "unused; inputs f32 logits and f32 labels of one shape (rows along dimension 0), output f32 [1]: -(1/rows) sum labels * log_softmax(logits)",
            _ => "unused",
        }
    }
}
