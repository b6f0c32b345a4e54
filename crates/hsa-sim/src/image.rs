//! Simulator kernel images (the PDI files the simulator's compiler writes) and instruction
//! streams (`<name>_insts.bin`).
//!
//! Image version 1 (reference executor): `"HSASIMK1"` (8 bytes) | format version u32 LE (= 1) |
//! payload length u32 LE | payload (UTF-8 JSON, a [`KernelDesc`]).
//!
//! Image version 2 (IRON emulation, written by `python3 -m ggml_hsa_iron --target emu`):
//! `"HSASIMK1"` | version u32 LE (= 2) | program JSON length u32 | library length u32 |
//! reserved u32 (= 0) | program JSON (UTF-8, see `exec::iron::program`) | the host shared
//! library of the core kernels. Its payload (for the instruction stream's hash) is the JSON
//! and library bytes.
//!
//! Instruction stream: 8 little-endian u32 words:
//! `[0x4d495348 "HSIM", 0x31534e49 "INS1", version = 1, word count = 8 + k,
//!   payload hash low, payload hash high, payload length, 0]`,
//! where the hash is FNV-1a 64 of the image payload bytes, so the runtime can check that an
//! instruction stream belongs to the PDI it is dispatched with; then k words, the values of a
//! version-2 program's run-time parameters in order (`exec::iron::params`; k = 0 otherwise).

use crate::ops::{DType, Op};
use serde::{Deserialize, Serialize};

pub const IMAGE_MAGIC: &[u8; 8] = b"HSASIMK1";
pub const IMAGE_FORMAT_VERSION: u32 = 1;
pub const IMAGE_HEADER_LEN: usize = 16;
/// Largest payload accepted (sanity bound).
pub const MAX_PAYLOAD_LEN: usize = 1 << 20;
pub const IMAGE_V2: u32 = 2;
pub const IMAGE_V2_HEADER_LEN: usize = 24;
/// Largest program JSON and library of a version-2 image (sanity bounds).
pub const MAX_PROGRAM_LEN: usize = 16 << 20;
pub const MAX_LIBRARY_LEN: usize = 64 << 20;

pub const INSTS_MAGIC0: u32 = u32::from_le_bytes(*b"HSIM");
pub const INSTS_MAGIC1: u32 = u32::from_le_bytes(*b"INS1");
pub const INSTS_VERSION: u32 = 1;
pub const INSTS_WORDS: usize = 8;

/// A tensor operand: ggml's ne (elements per dim) and nb (byte strides) plus the element type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorDesc {
    pub ne: [i64; 4],
    pub nb: [i64; 4],
    #[serde(rename = "type")]
    pub ty: DType,
}

impl TensorDesc {
    /// A contiguous tensor of this shape (rows of whole blocks for block-quantized types).
    pub fn contiguous(ne: [i64; 4], ty: DType) -> TensorDesc {
        let s = ty.size() as i64;
        let row = s * ne[0] / ty.block() as i64;
        let nb = [s, row, row * ne[1], row * ne[1] * ne[2]];
        TensorDesc { ne, nb, ty }
    }

    pub fn nelements(&self) -> u64 {
        self.ne.iter().map(|&n| n.max(0) as u64).product()
    }

    /// A dense Q [D, H, T] as an attention reads it: [D, T, H, 1], the same bytes (llama's
    /// permuted view of Q).
    pub fn heads_view(&self) -> TensorDesc {
        let [d, h, t, _] = self.ne;
        let nb = TensorDesc::contiguous(self.ne, self.ty).nb;
        TensorDesc {
            ne: [d, t, h, 1],
            nb: [nb[0], nb[2], nb[1], nb[3]],
            ty: self.ty,
        }
    }

    /// Bytes spanned from the first to one past the last element (0 if empty). Dimension 0 of
    /// a block-quantized tensor is stepped over in blocks.
    pub fn extent(&self) -> u64 {
        if self.nelements() == 0 {
            return 0;
        }
        let mut ne = self.ne.map(|n| n as u64);
        ne[0] = ne[0].div_ceil(self.ty.block() as u64);
        let last = ne.iter().zip(self.nb).fold(0u64, |acc, (&n, nb)| {
            acc.saturating_add((n - 1).saturating_mul(nb as u64))
        });
        last.saturating_add(self.ty.size() as u64)
    }

    /// Bytes of the data proper (elements, or whole blocks), for the cost model.
    pub fn data_bytes(&self) -> u64 {
        self.nelements() / self.ty.block() as u64 * self.ty.size() as u64
    }
}

/// The most op_params words a description holds: ggml's 16, and three more for
/// DECODE_LAYER_HEAD_NORM_POST_NORM_<GLU> (the heads' eps and the two post norms' after the
/// words of a whole layer's kernels).
pub const MAX_OP_PARAMS: usize = 19;

/// The kernel description: the compile request and the image payload are the same JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelDesc {
    pub name: String,
    pub arch: String,
    pub op: String,
    /// Up to `MAX_OP_PARAMS` i32 (missing entries are 0); always written as that many.
    #[serde(default, deserialize_with = "de_params")]
    pub op_params: [i32; MAX_OP_PARAMS],
    pub inputs: Vec<TensorDesc>,
    pub output: TensorDesc,
    /// The outputs after `output` of an op with several (`RMS_NORM_QKV_ROPE`: K and V), whose
    /// operands follow the output's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_outputs: Vec<TensorDesc>,
    /// Compute the f16 operands as bf16 (the backend's `GGML_HSA_F16_AS_BF16`): f16 inputs are
    /// rounded to bf16 when read and f16 outputs to bf16 precision before they are stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub f16_as_bf16: bool,
    /// The KV length is given at dispatch (the instruction stream's word after the eighth), a
    /// multiple of this step up to the K and V operands' rows; the mask's rows are that long
    /// (docs/kernel-compiler-protocol.md, `n_kv_step`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_kv_step: Option<u32>,
}

fn de_params<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[i32; MAX_OP_PARAMS], D::Error> {
    let v: Vec<i32> = Vec::deserialize(d)?;
    if v.len() > MAX_OP_PARAMS {
        return Err(serde::de::Error::custom(format!(
            "op_params has {} entries, at most {MAX_OP_PARAMS} allowed",
            v.len()
        )));
    }
    let mut out = [0i32; MAX_OP_PARAMS];
    out[..v.len()].copy_from_slice(&v);
    Ok(out)
}

/// Why a description cannot be compiled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DescError {
    /// Malformed or inconsistent request (compiler exit code 1).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// Well-formed but not implemented (compiler exit code 2).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl KernelDesc {
    pub fn parse_json(text: &str) -> Result<KernelDesc, DescError> {
        serde_json::from_str(text).map_err(|e| DescError::Invalid(e.to_string()))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The operands in dispatch order: the inputs, the output, the extra outputs.
    pub fn operands(&self) -> impl Iterator<Item = &TensorDesc> {
        self.inputs
            .iter()
            .chain(std::iter::once(&self.output))
            .chain(&self.extra_outputs)
    }

    /// A DECODE_LAYER[_BIAS|_HEAD_NORM][_FF]_<GLU> description as the two kernels it replaces:
    /// RMS_NORM_QKV[_BIAS|_HEAD_NORM]_ROPE[_FF] (Wq, Wk, Wv, x, n_attn, positions[, factors][,
    /// its biases or heads' norm weights] into Q, K rows, V rows; the heads' eps its
    /// op_params[12], the layer's op_params[16]), then FLASH_ATTN_FFN_<GLU> with q = Q
    /// [D, Hq, T] viewed as [D, T, Hq, 1] (llama's permuted view: the same bytes) and r0 = x.
    /// With post norms (gemma's `_POST_NORM_`) the attention part covers the attention and
    /// the block as their shapes (its inputs and outputs but the norms' weights, o and d, which
    /// `post_norm_operands` checks).
    pub fn decode_layer_parts(&self) -> Result<(KernelDesc, KernelDesc), String> {
        let (qkv_op, attn_op) = Op::decode_layer_kernels(&self.op)
            .ok_or_else(|| format!("{} is not a DECODE_LAYER op", self.op))?;
        let Some(qkv_kernel @ Op::NormedQkv { head_norm, .. }) = Op::from_name(&qkv_op) else {
            return Err(format!("{} is not a DECODE_LAYER op", self.op));
        };
        let b = qkv_kernel.arity();
        let post = 2 * usize::from(self.op.contains("_POST_NORM_"));
        if self.inputs.len() != b + 8 + post || self.extra_outputs.len() != 6 + post {
            return Err(format!(
                "{} takes {} inputs and has {} outputs: out, Q, K rows, V rows, a, r1, h{}",
                self.op,
                b + 8 + post,
                7 + post,
                if post > 0 { ", o, d" } else { "" }
            ));
        }
        let (qkv_in, rest) = self.inputs.split_at(b);
        let rest = &rest[..rest.len() - post];
        let [q, k_rows, v_rows, a, r1, h, ..] = self.extra_outputs.as_slice() else {
            unreachable!("checked above")
        };
        let mut qkv = self.clone();
        qkv.op = qkv_op;
        qkv.inputs = qkv_in.to_vec();
        qkv.output = q.clone();
        qkv.extra_outputs = vec![k_rows.clone(), v_rows.clone()];
        qkv.op_params = [0; MAX_OP_PARAMS];
        qkv.op_params[..12].copy_from_slice(&self.op_params[..12]);
        if head_norm {
            qkv.op_params[12] = self.op_params[16];
        }
        let mut attn = self.clone();
        attn.op = attn_op;
        let q4 = q.heads_view();
        attn.inputs = [&q4, &rest[0], &rest[1], &rest[2], &rest[3], &qkv_in[3]]
            .into_iter()
            .chain(&rest[4..])
            .cloned()
            .collect();
        attn.extra_outputs = vec![a.clone(), r1.clone(), h.clone()];
        attn.op_params = [0; MAX_OP_PARAMS];
        attn.op_params[..4].copy_from_slice(&self.op_params[12..16]);
        Ok((qkv, attn))
    }

    /// Checks the description and returns its op.
    /// The input index of the attention's K cache view (V's and the mask's follow) of an op
    /// that may take its KV length at dispatch.
    fn kv_input(op: Op) -> Option<usize> {
        match op {
            Op::FlashAttnExt {
                mask: true,
                sinks: false,
            }
            | Op::AttnFfn(_)
            | Op::AttnGlu(_) => Some(1),
            Op::DecodeLayer { .. } => op.layer_qkv().map(Op::arity),
            _ => None,
        }
    }

    /// The description of a kernel taking its KV length at dispatch, for `n_kv`: K's and V's
    /// rows and the mask's row length `n_kv`, the mask dense; `Err` for a value off the step or
    /// beyond the operands' rows, or a description without `n_kv_step`.
    pub fn at_n_kv(&self, n_kv: u32) -> Result<KernelDesc, String> {
        let (Some(step), Some(k)) = (
            self.n_kv_step,
            Op::from_name(&self.op).and_then(Self::kv_input),
        ) else {
            return Err(format!(
                "kernel {} takes no KV length at dispatch",
                self.name
            ));
        };
        let n = i64::from(n_kv);
        let most = self.inputs.get(k).map_or(0, |t| t.ne[1]);
        if n_kv == 0 || !n_kv.is_multiple_of(step) || n > most {
            return Err(format!(
                "kernel {}: n_kv {n_kv} is not a multiple of {step} up to {most}",
                self.name
            ));
        }
        let mut d = self.clone();
        d.n_kv_step = None;
        d.inputs[k].ne[1] = n;
        d.inputs[k + 1].ne[1] = n;
        let m = &d.inputs[k + 2];
        let mut ne = m.ne;
        ne[0] = n;
        d.inputs[k + 2] = TensorDesc::contiguous(ne, m.ty);
        Ok(d)
    }

    /// The attention of FLASH_ATTN_FFN_<GLU> and FLASH_ATTN_GLU_<GLU>, validated as the
    /// FLASH_ATTN_EXT_MASK kernel it replaces (`qkvm` into `a`, which must be dense); returns a
    /// as the output projection reads it, [Ka, N].
    fn attention_part(
        &self,
        qkvm: [&TensorDesc; 4],
        a: &TensorDesc,
    ) -> Result<TensorDesc, DescError> {
        if *a != TensorDesc::contiguous(a.ne, a.ty) {
            let why = format!("{}: the attention output a must be dense", self.op);
            return Err(DescError::Invalid(why));
        }
        let mut part = self.clone();
        part.op = "FLASH_ATTN_EXT_MASK".into();
        part.inputs = qkvm.map(TensorDesc::clone).to_vec();
        part.output = a.clone();
        part.extra_outputs.clear();
        part.op_params = [0; MAX_OP_PARAMS];
        part.op_params[..3].copy_from_slice(&self.op_params[..3]);
        part.validate()?;
        let [dv, heads, rows, seqs] = a.ne;
        Ok(TensorDesc::contiguous(
            [dv * heads, rows * seqs, 1, 1],
            a.ty,
        ))
    }

    pub fn validate(&self) -> Result<Op, DescError> {
        let inv = |m: String| Err(DescError::Invalid(m));
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 200
            && !self.name.starts_with('.')
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
        if !name_ok {
            return inv(format!(
                "name {:?} must be 1-200 characters of [A-Za-z0-9_.-], not starting with '.'",
                self.name
            ));
        }
        let tensors = self.operands();
        for (i, t) in tensors.enumerate() {
            if t.ne.iter().any(|&n| n < 0) || t.nb.iter().any(|&n| n < 0) {
                return inv(format!("tensor {i}: ne and nb must be non-negative"));
            }
            if t.ne.iter().any(|&n| n > (1 << 40)) || t.nb.iter().any(|&n| n > (1 << 48)) {
                return inv(format!("tensor {i}: ne or nb out of range"));
            }
        }
        let Some(op) = Op::from_name(&self.op) else {
            return Err(DescError::Unsupported(format!("op {:?}", self.op)));
        };
        if let Some(step) = self.n_kv_step {
            // Checked as the kernel of its largest KV length.
            let k = Self::kv_input(op).filter(|&k| k + 2 < self.inputs.len());
            let most = k.map_or(0, |k| self.inputs[k].ne[1]);
            if k.is_none() || step == 0 || most % i64::from(step) != 0 {
                return Err(DescError::Unsupported(format!(
                    "{} with n_kv_step {step} (K's rows {most})",
                    self.op
                )));
            }
            let most = u32::try_from(most)
                .map_err(|_| DescError::Invalid(format!("K's rows {most} out of range")))?;
            return self
                .at_n_kv(most)
                .map_err(DescError::Unsupported)?
                .validate();
        }
        // 0: one output per row of input 0.
        let outputs = match op.outputs() {
            0 => self.inputs.first().map_or(0, |t| t.ne[1].max(0) as usize),
            n => n,
        };
        if self.extra_outputs.len() + 1 != outputs {
            return inv(format!(
                "op {} has {} output(s), request has {}",
                self.op,
                outputs,
                self.extra_outputs.len() + 1
            ));
        }
        if self.inputs.len() != op.arity() {
            return inv(format!(
                "op {} takes {} input(s), request has {}",
                self.op,
                op.arity(),
                self.inputs.len()
            ));
        }
        let src0 = &self.inputs[0];
        if let Op::MulMatGlu(_) | Op::NormedMulMat(Some(_)) = op {
            let up = &self.inputs[1];
            if up.ty != src0.ty || up.ne != src0.ne {
                return inv(format!(
                    "{}: the gate and up weights differ: {} {:?} and {} {:?}",
                    self.op,
                    src0.ty.name(),
                    src0.ne,
                    up.ty.name(),
                    up.ne
                ));
            }
        }
        if op == Op::MulMatAdd {
            let (r, o) = (self.inputs[2].ne, self.output.ne);
            if !(0..4).all(|d| r[d] > 0 && o[d] % r[d] == 0) {
                return inv(format!(
                    "MUL_MAT_ADD: r {r:?} cannot be repeated over the output {o:?}"
                ));
            }
        }
        if let Op::NormedMulMat(glu) = op {
            let (x, n) = (
                &self.inputs[1 + usize::from(glu.is_some())],
                self.inputs.last().unwrap(),
            );
            if x.ty != crate::ops::DType::F32
                || n.ty != crate::ops::DType::F32
                || n.ne != [x.ne[0], 1, 1, 1]
            {
                return inv(format!(
                    "{}: x must be f32 and the norm weight one f32 row of x's {} elements: x {} {:?}, weight {} {:?}",
                    self.op,
                    x.ne[0],
                    x.ty.name(),
                    x.ne,
                    n.ty.name(),
                    n.ne
                ));
            }
        }
        if matches!(
            op,
            Op::MulMat
                | Op::MulMatGlu(_)
                | Op::MulMatAdd
                | Op::NormedMulMat(_)
                | Op::NormedMulMatBias
        ) {
            let x = if matches!(op, Op::MulMatGlu(_) | Op::NormedMulMat(Some(_))) {
                2
            } else {
                1
            };
            let (a, b, o) = (src0.ne, self.inputs[x].ne, self.output.ne);
            let broadcast_ok = (2..4).all(|d| a[d] > 0 && b[d] % a[d] == 0);
            if a[0] != b[0] || o != [a[1], b[1], b[2], b[3]] || !broadcast_ok {
                return inv(format!(
                    "{} shapes do not agree: weights {a:?}, activations {b:?}, output {o:?}",
                    self.op
                ));
            }
            // A plain product may be written in f16 or bf16 (the backend writes llama's V
            // projection straight into the f16 KV cache): the f32 result, converted once.
            let converting = matches!(
                op,
                Op::MulMat | Op::NormedMulMat(None) | Op::NormedMulMatBias
            ) && matches!(
                self.output.ty,
                crate::ops::DType::F16 | crate::ops::DType::Bf16
            );
            if self.output.ty != crate::ops::DType::F32 && !converting {
                return Err(DescError::Unsupported(format!(
                    "{} output other than f32 (f16 or bf16 for MUL_MAT and RMS_NORM_MUL_MAT)",
                    self.op
                )));
            }
            if op == Op::NormedMulMatBias && self.inputs[3].ne != [a[1], 1, 1, 1] {
                return inv(format!(
                    "{}: the bias must be one row of the product's {} values, not {:?}",
                    self.op, a[1], self.inputs[3].ne
                ));
            }
        } else if let Op::NormedFfn(_) = op {
            // As the two kernels it replaces: RMS_NORM_MUL_MAT_<GLU> into h, MUL_MAT_ADD of h.
            let [wg, wu, wd, x, n, r] = self.inputs.as_slice() else {
                return inv(format!("{} takes 6 inputs", self.op));
            };
            if wu.ty != wg.ty || wd.ty != wg.ty {
                return inv(format!("{}: Wg, Wu and Wd must have one type", self.op));
            }
            let h = &self.extra_outputs[0];
            let mut part = self.clone();
            part.extra_outputs.clear();
            part.op = self.op.replacen("RMS_NORM_FFN_", "RMS_NORM_MUL_MAT_", 1);
            part.inputs = vec![wg.clone(), wu.clone(), x.clone(), n.clone()];
            part.output = h.clone();
            part.validate()?;
            part.op = "MUL_MAT_ADD".into();
            part.inputs = vec![wd.clone(), h.clone(), r.clone()];
            part.output = self.output.clone();
            part.validate()?;
        } else if let Op::ProjectedFfn(_) = op {
            // As the two kernels it replaces: MUL_MAT_ADD into r1, RMS_NORM_FFN_<GLU> of r1.
            let [wo, a, r0, wg, wu, wd, n] = self.inputs.as_slice() else {
                return inv(format!("{} takes 7 inputs", self.op));
            };
            let [r1, h] = self.extra_outputs.as_slice() else {
                return inv(format!("{} has 3 outputs: out, r1, h", self.op));
            };
            if [wg, wu, wd].iter().any(|w| w.ty != wo.ty) {
                return inv(format!("{}: Wo, Wg, Wu and Wd must have one type", self.op));
            }
            let mut part = self.clone();
            part.op = "MUL_MAT_ADD".into();
            part.inputs = vec![wo.clone(), a.clone(), r0.clone()];
            part.output = r1.clone();
            part.extra_outputs.clear();
            part.validate()?;
            part.op = self.op.replacen("MUL_MAT_ADD_", "", 1);
            part.inputs = vec![
                wg.clone(),
                wu.clone(),
                wd.clone(),
                r1.clone(),
                n.clone(),
                r1.clone(),
            ];
            part.output = self.output.clone();
            part.extra_outputs = vec![h.clone()];
            part.validate()?;
        } else if let Op::AttnFfn(_) = op {
            // As the two kernels it replaces: FLASH_ATTN_EXT_MASK into a, then
            // MUL_MAT_ADD_RMS_NORM_FFN_<GLU> reading a as [Ka, N] (a is dense).
            let [q, k, v, mask, wo, r0, wg, wu, wd, n] = self.inputs.as_slice() else {
                return inv(format!("{} takes 10 inputs", self.op));
            };
            let [a, r1, h] = self.extra_outputs.as_slice() else {
                return inv(format!("{} has 4 outputs: out, a, r1, h", self.op));
            };
            let flat = self.attention_part([q, k, v, mask], a)?;
            let mut part = self.clone();
            part.op = self.op.replacen("FLASH_ATTN_", "MUL_MAT_ADD_RMS_NORM_", 1);
            part.inputs = [wo, &flat, r0, wg, wu, wd, n]
                .map(TensorDesc::clone)
                .to_vec();
            part.output = self.output.clone();
            part.extra_outputs = vec![r1.clone(), h.clone()];
            part.op_params = [0; MAX_OP_PARAMS];
            part.op_params[0] = self.op_params[3];
            part.validate()?;
        } else if let Op::AttnGlu(_) = op {
            // As the three kernels it replaces: FLASH_ATTN_EXT_MASK into a, MUL_MAT_ADD reading
            // a as [Ka, N] into r1, RMS_NORM_MUL_MAT_<GLU> of r1 into h (a is dense).
            let [q, k, v, mask, wo, r0, wg, wu, n] = self.inputs.as_slice() else {
                return inv(format!("{} takes 9 inputs", self.op));
            };
            let [a, r1] = self.extra_outputs.as_slice() else {
                return inv(format!("{} has 3 outputs: h, a, r1", self.op));
            };
            if [wg, wu].iter().any(|w| w.ty != wo.ty) {
                return inv(format!("{}: Wo, Wg and Wu must have one type", self.op));
            }
            let flat = self.attention_part([q, k, v, mask], a)?;
            let mut part = self.clone();
            part.extra_outputs.clear();
            part.op_params = [0; MAX_OP_PARAMS];
            part.op = "MUL_MAT_ADD".into();
            part.inputs = [wo, &flat, r0].map(TensorDesc::clone).to_vec();
            part.output = r1.clone();
            part.validate()?;
            part.op = self.op.replacen("FLASH_ATTN_GLU_", "RMS_NORM_MUL_MAT_", 1);
            part.inputs = [wg, wu, r1, n].map(TensorDesc::clone).to_vec();
            part.output = self.output.clone();
            part.op_params[0] = self.op_params[3];
            part.validate()?;
        } else if let Op::DecodeLayer { post_norm, .. } = op {
            // As the two kernels it replaces.
            let (qkv, attn) = self.decode_layer_parts().map_err(DescError::Invalid)?;
            qkv.validate()?;
            attn.validate()?;
            if post_norm {
                // The norms' weights [K]; o and d as r1 [K, T]: dense f32.
                let r1 = &attn.extra_outputs[1];
                let k = r1.ne[0];
                let dense_f32 = |t: &TensorDesc, n: u64| {
                    t.ty == crate::ops::DType::F32 && t.ne[0] == k && t.nelements() == n
                };
                let weights = &self.inputs[self.inputs.len() - 2..];
                let projections = &self.extra_outputs[6..];
                if !weights.iter().all(|t| dense_f32(t, k as u64))
                    || !projections.iter().all(|t| dense_f32(t, r1.nelements()))
                {
                    return inv(format!(
                        "{}: the post norms' weights must be f32 [{k}], o and d f32 as r1",
                        self.op
                    ));
                }
            }
        } else if let Op::NormedQkv {
            ff,
            head_norm,
            bias,
        } = op
        {
            // Each projection as the NormedMulMatRope (Q, K) or NormedMulMat[Bias] (V) it
            // replaces.
            let [wq, wk, wv, x, n, pos, rest @ ..] = self.inputs.as_slice() else {
                return inv(format!("{} takes 6 to 10 inputs", self.op));
            };
            // The rotation's shared operands, then each projection's own.
            let (consts, own) = rest.split_at(usize::from(ff));
            if self.output.ty != crate::ops::DType::F32 {
                return Err(DescError::Unsupported(format!(
                    "{}: Q other than f32",
                    self.op
                )));
            }
            let mut part = self.clone();
            part.extra_outputs.clear();
            let extra = match (head_norm, bias) {
                (true, _) => "HEAD_NORM_",
                (_, true) => "BIAS_",
                _ => "",
            };
            part.op = format!(
                "RMS_NORM_MUL_MAT_{extra}ROPE{}",
                if ff { "_FF" } else { "" }
            );
            for (i, (w, out)) in [(wq, &self.output), (wk, &self.extra_outputs[0])]
                .into_iter()
                .enumerate()
            {
                part.inputs = [w, x, n, pos].into_iter().chain(consts).cloned().collect();
                part.inputs.extend(own.get(i).cloned());
                part.output = out.clone();
                part.validate()?;
            }
            part.op = if bias {
                "RMS_NORM_MUL_MAT_BIAS"
            } else {
                "RMS_NORM_MUL_MAT"
            }
            .into();
            part.inputs = vec![wv.clone(), x.clone(), n.clone()];
            part.inputs.extend(own.get(2).filter(|_| bias).cloned());
            part.output = self.extra_outputs[1].clone();
            part.op_params = [0; MAX_OP_PARAMS];
            part.op_params[0] = self.op_params[11];
            part.validate()?;
        } else if let Op::NormedMulMatRope {
            ff,
            head_norm,
            bias,
        } = op
        {
            let (w, x, n, pos) = (src0.ne, &self.inputs[1], &self.inputs[2], &self.inputs[3]);
            let o = self.output.ne;
            let p = |i: usize| self.op_params.get(i).copied().unwrap_or(0);
            let (n_dims, mode) = (i64::from(p(1)), p(2));
            let f32 = crate::ops::DType::F32;
            let shapes_ok = w[0] == x.ne[0]
                && w[2] == 1
                && w[3] == 1
                && x.ne[2] == 1
                && x.ne[3] == 1
                && n.ne == [x.ne[0], 1, 1, 1]
                && o[0] * o[1] == w[1]
                && o[2] == x.ne[1]
                && o[3] == 1;
            if !shapes_ok || x.ty != f32 || n.ty != f32 {
                return inv(format!(
                    "{} shapes do not agree: weights {w:?}, x {} {:?}, n {} {:?}, output {o:?}                      (one matrix of weights, f32 x and n, the output [D, H, N] with D * H the                      weights' rows)",
                    self.op,
                    x.ty.name(),
                    x.ne,
                    n.ty.name(),
                    n.ne
                ));
            }
            if pos.ty != crate::ops::DType::I32 || (pos.nelements() as i64) < x.ne[1] {
                return inv(format!("{}: positions must be i32, one per x row", self.op));
            }
            if n_dims <= 0 || n_dims % 2 != 0 || n_dims > o[0] {
                return inv(format!(
                    "{}: n_dims {n_dims} for heads of {}",
                    self.op, o[0]
                ));
            }
            if ff && (self.inputs[4].ty != f32 || (self.inputs[4].nelements() as i64) < n_dims / 2)
            {
                return inv(format!(
                    "{}: frequency factors must be f32 covering n_dims / 2",
                    self.op
                ));
            }
            // The inputs after the factors: the head norm's weights, then the bias.
            let own = [
                (head_norm, o[0], "the head norm's weights", "one head"),
                (bias, w[1], "the bias", "one row of the product"),
            ];
            let present = own.into_iter().filter(|o| o.0);
            for (at, (_, len, what, of)) in (4 + usize::from(ff)..).zip(present) {
                let t = &self.inputs[at];
                if t.ty != f32 || t.ne != [len, 1, 1, 1] {
                    return inv(format!(
                        "{}: {what} must be f32 [{len}] ({of}), not {} {:?}",
                        self.op,
                        t.ty.name(),
                        t.ne
                    ));
                }
            }
            if !(mode == 0 || mode == 2) || p(15) != 0 {
                return Err(DescError::Unsupported(format!(
                    "{} rope mode {mode} with offset {} (normal and NeoX without offset only)",
                    self.op,
                    p(15)
                )));
            }
        } else if op == Op::ArgMax {
            let (a, o) = (src0.ne, self.output.ne);
            if a[2] != 1 || a[3] != 1 || o != [a[1], 1, 1, 1] {
                return inv(format!(
                    "ARGMAX takes a matrix and gives one index per row: input {a:?}, output {o:?}"
                ));
            }
        } else if matches!(op, Op::CountEqual | Op::CrossEntropyLoss) {
            let (a, b, o) = (src0.ne, self.inputs[1].ne, self.output.ne);
            if a != b || o != [1, 1, 1, 1] {
                return inv(format!(
                    "{} takes two inputs of one shape and gives one value: inputs {a:?} and \
                     {b:?}, output {o:?}",
                    self.op
                ));
            }
        } else if let Op::FlashAttnExt { mask, sinks } = op {
            let (q, k, v, o) = (
                src0.ne,
                self.inputs[1].ne,
                self.inputs[2].ne,
                self.output.ne,
            );
            let heads_ok = (2..4).all(|d| k[d] > 0 && v[d] == k[d] && q[d] % k[d] == 0);
            if k[0] != q[0] || v[1] != k[1] || !heads_ok || o != [v[0], q[2], q[1], q[3]] {
                return inv(format!(
                    "FLASH_ATTN_EXT shapes do not agree: q {q:?}, k {k:?}, v {v:?}, output {o:?}"
                ));
            }
            let rows_dense = self.inputs[..3]
                .iter()
                .all(|t| t.nb[0] == t.ty.size() as i64);
            if !rows_dense {
                return inv("FLASH_ATTN_EXT q, k and v rows must be dense".into());
            }
            if let Some(m) = self.inputs.get(3).filter(|_| mask).map(|m| m.ne) {
                let ok =
                    m[0] >= k[1] && m[1] >= q[1] && (2..4).all(|d| m[d] > 0 && q[d] % m[d] == 0);
                if !ok {
                    return inv(format!(
                        "mask ne {m:?} does not cover n_kv x n_q of q {q:?}"
                    ));
                }
            }
            if sinks
                && self
                    .inputs
                    .last()
                    .is_some_and(|s| s.nelements() < q[2] as u64)
            {
                return inv("fewer sinks than heads (q ne[2])".into());
            }
        } else if op == Op::Copy {
            if src0.nelements() != self.output.nelements() {
                return inv(format!(
                    "a copy of {} elements into {}",
                    src0.nelements(),
                    self.output.nelements()
                ));
            }
        } else if op == Op::CopyRows {
            let rows = src0.ne;
            let row = [rows[0], 1, 1, 1];
            if rows[2] != 1 || rows[3] != 1 || rows[1] < 2 {
                return inv(format!(
                    "CPY_ROWS copies 2 or more rows of one matrix, not {rows:?}"
                ));
            }
            let outputs = std::iter::once(&self.output).chain(&self.extra_outputs);
            if let Some(o) = outputs.into_iter().find(|o| o.ne != row) {
                return inv(format!("CPY_ROWS writes rows {row:?}, not {:?}", o.ne));
            }
        } else if op == Op::SetRows {
            let (s, i, d) = (src0.ne, self.inputs[1].ne, self.output.ne);
            let ok = s[0] == d[0]
                && s[2] == d[2]
                && s[3] == d[3]
                && i[0] == s[1]
                && i[3] == 1
                && i[1] > 0
                && i[2] > 0
                && s[2] % i[1] == 0
                && s[3] % i[2] == 0;
            if !ok {
                return inv(format!(
                    "SET_ROWS shapes do not agree: rows {s:?}, indices {i:?}, destination {d:?}"
                ));
            }
        } else if op == Op::RmsNormMul && self.inputs[1].ne != [src0.ne[0], 1, 1, 1] {
            return inv(format!(
                "RMS_NORM_MUL's weight must be one row of x's {} elements: {:?}",
                src0.ne[0], self.inputs[1].ne
            ));
        } else if op == Op::RmsNormMulAdd
            && (self.inputs[1].ne != src0.ne || self.inputs[2].ne != [src0.ne[0], 1, 1, 1])
        {
            return inv(format!(
                "RMS_NORM_MUL_ADD takes r of x's shape {:?} and one weight row: {:?}, {:?}",
                src0.ne, self.inputs[1].ne, self.inputs[2].ne
            ));
        } else if self.output.ne != src0.ne {
            return inv(format!(
                "output ne {:?} differs from inputs[0] ne {:?}",
                self.output.ne, src0.ne
            ));
        }
        if let Op::SoftMax { mask, sinks } = op {
            let x = src0;
            if let Some(m) = self.inputs.get(1).filter(|_| mask) {
                let ok = m.ne[0] >= x.ne[0]
                    && m.ne[1] >= x.ne[1]
                    && (2..4).all(|d| m.ne[d] > 0 && x.ne[d] % m.ne[d] == 0);
                if !ok {
                    return inv(format!("mask ne {:?} does not cover x ne {:?}", m.ne, x.ne));
                }
            }
            if sinks
                && self
                    .inputs
                    .last()
                    .is_some_and(|k| k.nelements() < x.ne[2] as u64)
            {
                return inv("fewer sinks than heads (x ne[2])".into());
            }
        }
        if let Op::Rope { ff } = op {
            let (x, pos) = (src0, &self.inputs[1]);
            let p = |i: usize| self.op_params.get(i).copied().unwrap_or(0);
            let (n_dims, mode, offset) = (p(1) as i64, p(2), p(15));
            if pos.ty != crate::ops::DType::I32 || (pos.nelements() as i64) < x.ne[2] {
                return inv("ROPE positions must be i32, one per x row of dimension 2".into());
            }
            if n_dims <= 0 || n_dims % 2 != 0 || n_dims > x.ne[0] {
                return inv(format!("ROPE n_dims {n_dims} for rows of {}", x.ne[0]));
            }
            if ff && (self.inputs[2].nelements() as i64) < n_dims / 2 {
                return inv("ROPE frequency factors must cover n_dims / 2".into());
            }
            if !(mode == 0 || mode == 2) || offset != 0 {
                return Err(DescError::Unsupported(format!(
                    "ROPE mode {mode} with offset {offset} (normal and NeoX without offset only)"
                )));
            }
        }
        let elementwise = !matches!(
            op,
            Op::MulMat
                | Op::MulMatGlu(_)
                | Op::MulMatAdd
                | Op::NormedMulMat(_)
                | Op::NormedMulMatRope { .. }
                | Op::NormedQkv { .. }
                | Op::NormedFfn(_)
                | Op::ProjectedFfn(_)
                | Op::AttnFfn(_)
                | Op::AttnGlu(_)
                | Op::DecodeLayer { .. }
                | Op::SoftMax { .. }
                | Op::Rope { .. }
                | Op::CountEqual
                | Op::CrossEntropyLoss
                | Op::FlashAttnExt { .. }
                | Op::Copy
                | Op::SetRows
        );
        if let Some(src1) = self.inputs.get(1).filter(|_| elementwise) {
            for d in 0..4 {
                let (a, b) = (src0.ne[d], src1.ne[d]);
                let ok = if b == 0 { a == 0 } else { a % b == 0 };
                if !ok {
                    return inv(format!(
                        "inputs[1] ne {:?} cannot be repeated over inputs[0] ne {:?}",
                        src1.ne, src0.ne
                    ));
                }
            }
        }
        if !crate::ops::ARCHS.contains(&self.arch.as_str()) {
            return Err(DescError::Unsupported(format!("arch {:?}", self.arch)));
        }
        let tensors = self.operands();
        for (i, t) in tensors.enumerate() {
            if t.ty.is_quantized() && op.is_weight(i) {
                let (block, size) = (t.ty.block() as i64, t.ty.size() as i64);
                if t.ne[0] % block != 0 || t.nb[0] != size {
                    return inv(format!(
                        "tensor {i}: {} rows must be whole blocks of {block} values \
                         (ne[0] a multiple of {block}, nb[0] = {size} bytes)",
                        t.ty.name()
                    ));
                }
            }
            if !op.operand_types(i).contains(&t.ty) {
                let what = if i >= op.arity() {
                    format!("output {}", i - op.arity())
                } else {
                    format!("input {i}")
                };
                return Err(DescError::Unsupported(format!(
                    "type {} for {what} of op {}",
                    t.ty.name(),
                    self.op
                )));
            }
        }
        Ok(op)
    }
}

/// FNV-1a, 64-bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Builds the image bytes for a description.
pub fn encode_image(desc: &KernelDesc) -> Vec<u8> {
    let payload = desc.to_json().into_bytes();
    let mut out = Vec::with_capacity(IMAGE_HEADER_LEN + payload.len());
    out.extend_from_slice(IMAGE_MAGIC);
    out.extend_from_slice(&IMAGE_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Builds the instruction stream that belongs to `image`.
pub fn encode_insts(image: &[u8]) -> Vec<u8> {
    encode_insts_with(image, &[])
}

/// The instruction stream of a version-1 image dispatched with run-time `values` (a kernel
/// taking its KV length at dispatch: one word, n_kv).
pub fn encode_insts_with(image: &[u8], values: &[u32]) -> Vec<u8> {
    insts_for_payload(&image[IMAGE_HEADER_LEN.min(image.len())..], values)
}

/// Builds the instruction stream of a version-2 image (its payload: JSON and library bytes)
/// whose program has no run-time parameters.
pub fn encode_insts_v2(image: &[u8]) -> Vec<u8> {
    encode_insts_v2_with(image, &[])
}

/// Builds the instruction stream dispatching a version-2 image at run-time parameter `values`
/// (one per param of its program, in order).
pub fn encode_insts_v2_with(image: &[u8], values: &[u32]) -> Vec<u8> {
    insts_for_payload(&image[IMAGE_V2_HEADER_LEN.min(image.len())..], values)
}

/// The instruction stream naming an image payload by its length and FNV-1a 64 hash, then
/// `values`.
fn insts_for_payload(payload: &[u8], values: &[u32]) -> Vec<u8> {
    let h = fnv1a64(payload);
    let words = [
        INSTS_MAGIC0,
        INSTS_MAGIC1,
        INSTS_VERSION,
        (INSTS_WORDS + values.len()) as u32,
        h as u32,
        (h >> 32) as u32,
        payload.len() as u32,
        0,
    ];
    words
        .iter()
        .chain(values)
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// The run-time parameter values of a stream [`check_insts`] accepted: its words after the
/// 8th.
pub fn insts_values(insts: &[u8]) -> Vec<u32> {
    insts
        .get(INSTS_WORDS * 4..)
        .unwrap_or_default()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The format version of an image (after checking the magic).
pub fn image_version(header: &[u8]) -> Result<u32, String> {
    if header.len() < IMAGE_HEADER_LEN {
        return Err("PDI is shorter than the 16-byte simulator image header".into());
    }
    if &header[..8] != IMAGE_MAGIC {
        return Err(format!(
            "PDI is not a simulator kernel image (magic {:02x?}, expected \"HSASIMK1\"); \
             the simulator only runs PDIs written by hsa-sim-compile or ggml_hsa_iron --target emu",
            &header[..8]
        ));
    }
    Ok(u32::from_le_bytes([
        header[8], header[9], header[10], header[11],
    ]))
}

fn le32(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

/// Header length of an image of this version.
pub fn header_len(version: u32) -> usize {
    if version == IMAGE_V2 {
        IMAGE_V2_HEADER_LEN
    } else {
        IMAGE_HEADER_LEN
    }
}

/// Reads the image length from its header (16 bytes for version 1, 24 for version 2).
pub fn image_len_from_header(header: &[u8]) -> Result<usize, String> {
    let version = image_version(header)?;
    if version == IMAGE_V2 {
        if header.len() < IMAGE_V2_HEADER_LEN {
            return Err("PDI is shorter than the 24-byte header of image version 2".into());
        }
        let (json, lib, reserved) = (le32(header, 12), le32(header, 16), le32(header, 20));
        if json == 0 || json > MAX_PROGRAM_LEN || lib == 0 || lib > MAX_LIBRARY_LEN || reserved != 0
        {
            return Err(format!(
                "emulation image header out of range (program {json} bytes, library {lib} \
                 bytes, reserved {reserved})"
            ));
        }
        return Ok(IMAGE_V2_HEADER_LEN + json + lib);
    }
    if version != IMAGE_FORMAT_VERSION {
        return Err(format!(
            "simulator image format version {version} is not supported (expected \
             {IMAGE_FORMAT_VERSION} or {IMAGE_V2})"
        ));
    }
    let len = le32(header, 12);
    if len == 0 || len > MAX_PAYLOAD_LEN {
        return Err(format!(
            "simulator image payload length {len} is out of range"
        ));
    }
    Ok(IMAGE_HEADER_LEN + len)
}

/// The (program JSON, library) of a complete version-2 image.
pub fn split_image_v2(image: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let total = image_len_from_header(image)?;
    if image_version(image)? != IMAGE_V2 {
        return Err("not an emulation image (version 2)".into());
    }
    if image.len() < total {
        return Err(format!(
            "emulation image is truncated: {} bytes, header says {total}",
            image.len()
        ));
    }
    let json = le32(image, 12);
    let body = &image[IMAGE_V2_HEADER_LEN..total];
    Ok(body.split_at(json))
}

/// Parses a complete image (header + payload) and validates its description.
pub fn parse_image(image: &[u8]) -> Result<(KernelDesc, Op), String> {
    let total = image_len_from_header(image)?;
    if image.len() < total {
        return Err(format!(
            "simulator image is truncated: {} bytes, header says {total}",
            image.len()
        ));
    }
    if image_version(image)? != IMAGE_FORMAT_VERSION {
        return Err("not a reference-executor image (version 1)".into());
    }
    let payload = &image[IMAGE_HEADER_LEN..total];
    let text = std::str::from_utf8(payload)
        .map_err(|_| "simulator image payload is not UTF-8".to_string())?;
    let desc = KernelDesc::parse_json(text).map_err(|e| format!("simulator image payload: {e}"))?;
    let op = desc
        .validate()
        .map_err(|e| format!("simulator image payload: {e}"))?;
    Ok((desc, op))
}

/// Checks that `insts` (the bytes the packet designates) is the stream for `image`.
pub fn check_insts(insts: &[u8], image: &[u8]) -> Result<(), String> {
    if !insts.len().is_multiple_of(4) || insts.len() < INSTS_WORDS * 4 {
        return Err(format!(
            "instruction stream of {} bytes is not a simulator stream ({} bytes expected)",
            insts.len(),
            INSTS_WORDS * 4
        ));
    }
    let w = |i: usize| {
        u32::from_le_bytes([
            insts[4 * i],
            insts[4 * i + 1],
            insts[4 * i + 2],
            insts[4 * i + 3],
        ])
    };
    if w(0) != INSTS_MAGIC0 || w(1) != INSTS_MAGIC1 {
        return Err("instruction stream has no simulator magic (\"HSIMINS1\")".into());
    }
    if w(2) != INSTS_VERSION {
        return Err(format!(
            "instruction stream version {} is not supported",
            w(2)
        ));
    }
    // Word 7 is reserved as 0 (both writers, hsa-sim-compile and the IRON emulation, write 0):
    // a stream with it set was not written for this format.
    if w(7) != 0 {
        return Err(format!(
            "instruction stream word 7 is {:#x}, reserved as 0",
            w(7)
        ));
    }
    if w(3) as usize * 4 != insts.len() {
        return Err(format!(
            "instruction size {} bytes does not match the stream's own length {} bytes \
             (A-generation packets give the size in dwords, B in bytes)",
            insts.len(),
            w(3) as usize * 4
        ));
    }
    let hl = image_version(image)
        .map(header_len)
        .unwrap_or(IMAGE_HEADER_LEN);
    let payload = &image[hl.min(image.len())..];
    let h = fnv1a64(payload);
    if w(4) != h as u32 || w(5) != (h >> 32) as u32 || w(6) as usize != payload.len() {
        return Err("instruction stream does not belong to this PDI (payload hash differs)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::OperandMem;
    use crate::ops::UnaryOp;

    /// A qwen decode layer in small (K 64, Q 2 heads of 32, one KV head, 16 cached rows, F 128):
    /// `own` the Q/K/V kernel's own inputs, between the positions and the caches.
    fn layer(op: &str, own: Vec<TensorDesc>, op_params: &[i32]) -> KernelDesc {
        let f32 = |ne| TensorDesc::contiguous(ne, DType::F32);
        let f16 = |ne| TensorDesc::contiguous(ne, DType::F16);
        let mut inputs = vec![
            f32([64, 64, 1, 1]),
            f32([64, 32, 1, 1]),
            f32([64, 32, 1, 1]),
            f32([64, 1, 1, 1]),
            f32([64, 1, 1, 1]),
            TensorDesc::contiguous([1, 1, 1, 1], DType::I32),
        ];
        inputs.extend(own);
        inputs.extend([
            f16([32, 16, 1, 1]),
            f16([32, 16, 1, 1]),
            f16([16, 1, 1, 1]),
            f32([64, 64, 1, 1]),
            f32([64, 128, 1, 1]),
            f32([64, 128, 1, 1]),
            f32([128, 64, 1, 1]),
            f32([64, 1, 1, 1]),
        ]);
        let mut params = [0; MAX_OP_PARAMS];
        params[..op_params.len()].copy_from_slice(op_params);
        KernelDesc {
            name: "layer".into(),
            arch: "aie2p".into(),
            op: op.into(),
            op_params: params,
            inputs,
            output: f32([64, 1, 1, 1]),
            extra_outputs: vec![
                f32([32, 2, 1, 1]),
                f16([32, 1, 1, 1]),
                f16([32, 1, 1, 1]),
                f32([32, 2, 1, 1]),
                f32([64, 1, 1, 1]),
                f32([128, 1, 1, 1]),
            ],
            f16_as_bf16: false,
            n_kv_step: None,
        }
    }

    /// ROPE's words (n_dims 32), the attention norm's eps, FLASH_ATTN_EXT's scale, the FFN
    /// norm's eps, and with a heads' norm its eps.
    fn layer_params(head_norm: bool) -> Vec<i32> {
        let bits = |v: f32| v.to_bits() as i32;
        let mut p = vec![0, 32, 0, 0, 0, bits(10000.0), bits(1.0), 0, bits(1.0), 0, 0];
        p.extend([bits(1e-5), bits(0.125), 0, 0, bits(2e-5)]);
        if head_norm {
            p.push(bits(1e-6));
        }
        p
    }

    #[test]
    fn a_qwen_decode_layer_splits_into_its_q_k_v_kernel_and_its_attention() {
        let f32 = |ne| TensorDesc::contiguous(ne, DType::F32);
        for (op, qkv_op, own) in [
            (
                "DECODE_LAYER_BIAS_SWIGLU",
                "RMS_NORM_QKV_BIAS_ROPE",
                vec![f32([64, 1, 1, 1]), f32([32, 1, 1, 1]), f32([32, 1, 1, 1])],
            ),
            (
                "DECODE_LAYER_HEAD_NORM_SWIGLU",
                "RMS_NORM_QKV_HEAD_NORM_ROPE",
                vec![f32([32, 1, 1, 1]), f32([32, 1, 1, 1])],
            ),
        ] {
            let head_norm = qkv_op.contains("HEAD_NORM");
            let desc = layer(op, own.clone(), &layer_params(head_norm));
            assert_eq!(
                desc.validate(),
                Ok(Op::DecodeLayer {
                    ff: false,
                    head_norm,
                    bias: !head_norm,
                    post_norm: false,
                    act: UnaryOp::Silu,
                }),
                "{op}"
            );
            let (qkv, attn) = desc.decode_layer_parts().expect(op);
            // The Q/K/V kernel: the layer's inputs up to its own ones, Q, K's and V's rows; its
            // heads' eps is its word 12.
            let b = 6 + own.len();
            assert_eq!(qkv.op, qkv_op);
            assert_eq!(qkv.inputs, desc.inputs[..b]);
            assert_eq!(qkv.inputs[6..], own);
            assert_eq!(qkv.output, desc.extra_outputs[0]);
            assert_eq!(qkv.extra_outputs, desc.extra_outputs[1..3]);
            assert_eq!(qkv.op_params[..12], desc.op_params[..12]);
            let eps = if head_norm { desc.op_params[16] } else { 0 };
            assert_eq!(qkv.op_params[12..], [eps, 0, 0, 0, 0, 0, 0]);
            // The attention and the block: q = Q by heads, the caches, the mask and Wo, r0 = x,
            // then Wg, Wu, Wd and n_ffn.
            assert_eq!(attn.op, "FLASH_ATTN_FFN_SWIGLU");
            let mut want = vec![desc.extra_outputs[0].heads_view()];
            want.extend_from_slice(&desc.inputs[b..b + 4]);
            want.push(desc.inputs[3].clone());
            want.extend_from_slice(&desc.inputs[b + 4..]);
            assert_eq!(attn.inputs, want);
            assert_eq!(attn.output, desc.output);
            assert_eq!(attn.extra_outputs, desc.extra_outputs[3..]);
            assert_eq!(attn.op_params[..4], desc.op_params[12..16]);
            assert!(attn.op_params[4..].iter().all(|&p| p == 0));
        }
        // Without its own inputs the layer is not a qwen one.
        let desc = layer("DECODE_LAYER_BIAS_SWIGLU", vec![], &layer_params(false));
        assert!(desc.decode_layer_parts().is_err());
    }

    /// Pseudo-random values in [-1, 1] for a dense operand of `t` (i32: the position 5).
    fn bytes_of(t: &TensorDesc, seed: u32) -> Vec<u8> {
        (0..t.nelements() as u32)
            .flat_map(|i| {
                let h = i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503);
                let v = (h % 2001) as f32 / 1000.0 - 1.0;
                match t.ty {
                    DType::F32 => v.to_le_bytes().to_vec(),
                    DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
                    _ => 5i32.to_le_bytes().to_vec(),
                }
            })
            .collect()
    }

    /// Runs `desc` over the operands `which` of `mem` (a small layer's, `layer`: n_in inputs,
    /// the caches at b and b + 1); K's and V's rows (operands n_in + 2 and n_in + 3) are row 5
    /// of their caches.
    fn run_layer_part(
        desc: &KernelDesc,
        mem: &mut [Vec<u8>],
        which: &[usize],
        n_in: usize,
        b: usize,
    ) {
        let at: Vec<OperandMem> = mem
            .iter_mut()
            .map(|m| OperandMem {
                addr: m.as_mut_ptr() as usize,
                len: m.len(),
            })
            .collect();
        let operands: Vec<OperandMem> = which
            .iter()
            .map(|&i| match i.checked_sub(n_in + 2) {
                Some(c @ 0..=1) => OperandMem {
                    addr: at[b + c].addr + 5 * 64,
                    len: 64,
                },
                _ => at[i],
            })
            .collect();
        let op = desc.validate().expect("valid");
        // SAFETY: every operand is a live buffer of `mem` (K's and V's rows 64 bytes inside
        // their caches' 1024), at least its tensor's extent long, and nothing else reads or
        // writes `mem` during the call.
        unsafe { crate::exec::execute(desc, op, &operands) }.expect("runs");
    }

    /// A small layer's operands' first bytes, and the memory after the layer `desc` ran over
    /// all of them (n_in inputs, the caches at b and b + 1).
    fn layer_run(desc: &KernelDesc, n_in: usize, b: usize) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let start: Vec<Vec<u8>> = desc
            .operands()
            .zip(0..)
            .map(|(t, i)| bytes_of(t, i))
            .collect();
        let mut merged = start.clone();
        let all: Vec<usize> = (0..desc.operands().count()).collect();
        run_layer_part(desc, &mut merged, &all, n_in, b);
        (start, merged)
    }

    #[test]
    fn a_gemma_decode_layer_computes_what_its_kernels_do() {
        let f32 = |ne| TensorDesc::contiguous(ne, DType::F32);
        let bits = |v: f32| v.to_bits() as i32;
        for (op, own) in [
            ("DECODE_LAYER_POST_NORM_GEGLU", vec![]),
            (
                "DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU",
                vec![f32([32, 1, 1, 1]), f32([32, 1, 1, 1])],
            ),
        ] {
            let head_norm = op.contains("HEAD_NORM");
            let mut params = layer_params(head_norm);
            params[14] = bits(50.0); // gemma2's logit softcap
            params.resize(17, 0);
            params.extend([bits(1e-6), bits(2e-6)]);
            let mut desc = layer(op, own, &params);
            // The two post norms' weights; o and d.
            desc.inputs.extend([f32([64, 1, 1, 1]), f32([64, 1, 1, 1])]);
            desc.extra_outputs
                .extend([f32([64, 1, 1, 1]), f32([64, 1, 1, 1])]);
            let (qkv, attn) = desc.decode_layer_parts().expect(op);
            let n_in = desc.inputs.len();
            let b = n_in - 10;
            let (start, merged) = layer_run(&desc, n_in, b);
            // The kernels the backend ran before: Q/K/V, the attention, O, its norm and the
            // residual, the block's gate and up, its down projection, its norm and residual.
            let (out, q, a, r1, h, o, d) = (
                n_in,
                n_in + 1,
                n_in + 4,
                n_in + 5,
                n_in + 6,
                n_in + 7,
                n_in + 8,
            );
            let part =
                |name: &str, inputs: Vec<TensorDesc>, output: &TensorDesc, eps: Option<i32>| {
                    let mut p = desc.clone();
                    p.op = name.into();
                    p.inputs = inputs;
                    p.output = output.clone();
                    p.extra_outputs.clear();
                    p.op_params = [0; MAX_OP_PARAMS];
                    if let Some(eps) = eps {
                        p.op_params[0] = eps;
                    }
                    p
                };
            let mut fa = part(
                "FLASH_ATTN_EXT_MASK",
                attn.inputs[..4].to_vec(),
                &attn.extra_outputs[0],
                None,
            );
            fa.op_params[..3].copy_from_slice(&desc.op_params[12..15]);
            let (x, n_ffn) = (&desc.inputs[3], &desc.inputs[b + 7]);
            let [wo, wg, wu, wd] = [3, 4, 5, 6].map(|i| desc.inputs[b + i].clone());
            let [n_pa, n_pf] = [8, 9].map(|i| desc.inputs[b + i].clone());
            let ext = &desc.extra_outputs;
            let flat_a = f32([64, 1, 1, 1]);
            let steps: Vec<(KernelDesc, Vec<usize>)> = vec![
                (qkv, (0..b).chain(q..q + 3).collect()),
                (fa, vec![q, b, b + 1, b + 2, a]),
                (
                    part("MUL_MAT", vec![wo, flat_a], &ext[6], None),
                    vec![b + 3, a, o],
                ),
                (
                    part(
                        "RMS_NORM_MUL_ADD",
                        vec![ext[6].clone(), x.clone(), n_pa],
                        &ext[4],
                        Some(desc.op_params[17]),
                    ),
                    vec![o, 3, b + 8, r1],
                ),
                (
                    part(
                        "RMS_NORM_MUL_MAT_GEGLU",
                        vec![wg, wu, ext[4].clone(), n_ffn.clone()],
                        &ext[5],
                        Some(desc.op_params[15]),
                    ),
                    vec![b + 4, b + 5, r1, b + 7, h],
                ),
                (
                    part("MUL_MAT", vec![wd, ext[5].clone()], &ext[7], None),
                    vec![b + 6, h, d],
                ),
                (
                    part(
                        "RMS_NORM_MUL_ADD",
                        vec![ext[7].clone(), ext[4].clone(), n_pf],
                        &desc.output,
                        Some(desc.op_params[18]),
                    ),
                    vec![d, r1, b + 9, out],
                ),
            ];
            let mut parts = start.clone();
            for (kernel, operands) in &steps {
                run_layer_part(kernel, &mut parts, operands, n_in, b);
            }
            assert_eq!(merged, parts, "{op}");
            assert_ne!(merged[out], start[out], "{op}: the layer's output");
            assert_ne!(merged[o], start[o], "{op}: o");
        }
    }

    #[test]
    fn a_qwen_decode_layer_computes_what_its_two_kernels_do() {
        let f32 = |ne| TensorDesc::contiguous(ne, DType::F32);
        for (op, own) in [
            (
                "DECODE_LAYER_BIAS_SWIGLU",
                vec![f32([64, 1, 1, 1]), f32([32, 1, 1, 1]), f32([32, 1, 1, 1])],
            ),
            (
                "DECODE_LAYER_HEAD_NORM_SWIGLU",
                vec![f32([32, 1, 1, 1]), f32([32, 1, 1, 1])],
            ),
        ] {
            let desc = layer(op, own, &layer_params(op.contains("HEAD_NORM")));
            let (qkv, attn) = desc.decode_layer_parts().expect(op);
            let n_in = desc.inputs.len();
            let b = n_in - 8;
            let (start, merged) = layer_run(&desc, n_in, b);
            // The Q/K/V kernel, then the attention reading Q, the caches and x.
            let mut parts = start.clone();
            let qkv_ops: Vec<usize> = (0..b).chain(n_in + 1..n_in + 4).collect();
            run_layer_part(&qkv, &mut parts, &qkv_ops, n_in, b);
            let mut attn_ops = vec![n_in + 1, b, b + 1, b + 2, b + 3, 3];
            attn_ops.extend([
                b + 4,
                b + 5,
                b + 6,
                b + 7,
                n_in,
                n_in + 4,
                n_in + 5,
                n_in + 6,
            ]);
            run_layer_part(&attn, &mut parts, &attn_ops, n_in, b);
            assert_eq!(merged, parts, "{op}");
            assert_ne!(merged[n_in], start[n_in], "{op}: the layer's output");
            assert_ne!(merged[b][320..384], start[b][320..384], "{op}: K's row");
        }
    }

    #[test]
    fn decode_layer_names_read_as_their_two_kernels() {
        let names = |qkv: &str, attn: &str| Some((qkv.to_owned(), attn.to_owned()));
        let kernels = Op::decode_layer_kernels;
        assert_eq!(
            kernels("DECODE_LAYER_SWIGLU"),
            names("RMS_NORM_QKV_ROPE", "FLASH_ATTN_FFN_SWIGLU")
        );
        assert_eq!(
            kernels("DECODE_LAYER_FF_GEGLU_ERF"),
            names("RMS_NORM_QKV_ROPE_FF", "FLASH_ATTN_FFN_GEGLU_ERF")
        );
        assert_eq!(
            kernels("DECODE_LAYER_BIAS_REGLU"),
            names("RMS_NORM_QKV_BIAS_ROPE", "FLASH_ATTN_FFN_REGLU")
        );
        assert_eq!(
            kernels("DECODE_LAYER_HEAD_NORM_FF_GEGLU_QUICK"),
            names(
                "RMS_NORM_QKV_HEAD_NORM_ROPE_FF",
                "FLASH_ATTN_FFN_GEGLU_QUICK"
            )
        );
        assert_eq!(
            Op::from_name("DECODE_LAYER_BIAS_FF_SWIGLU"),
            Some(Op::DecodeLayer {
                ff: true,
                head_norm: false,
                bias: true,
                post_norm: false,
                act: UnaryOp::Silu,
            })
        );
        // gemma's: the post norms behind the heads' norm, two more inputs and outputs; not
        // with biases or frequency factors (no such family).
        assert_eq!(
            kernels("DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU"),
            names("RMS_NORM_QKV_HEAD_NORM_ROPE", "FLASH_ATTN_FFN_GEGLU")
        );
        let gemma3 = Op::from_name("DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU");
        assert_eq!(
            gemma3,
            Some(Op::DecodeLayer {
                ff: false,
                head_norm: true,
                bias: false,
                post_norm: true,
                act: UnaryOp::Gelu,
            })
        );
        assert_eq!(gemma3.map(|op| (op.arity(), op.outputs())), Some((18, 9)));
        assert_eq!(Op::from_name("DECODE_LAYER_BIAS_POST_NORM_GEGLU"), None);
        assert_eq!(Op::from_name("DECODE_LAYER_POST_NORM_FF_GEGLU"), None);
        // Both own inputs, or the flags out of order: no such layer.
        assert_eq!(Op::from_name("DECODE_LAYER_BIAS_HEAD_NORM_SWIGLU"), None);
        assert_eq!(Op::from_name("DECODE_LAYER_FF_BIAS_SWIGLU"), None);
        assert_eq!(
            Op::from_name("DECODE_LAYER_HEAD_NORM_SWIGLU").map(Op::arity),
            Some(16)
        );
        assert_eq!(
            Op::from_name("DECODE_LAYER_BIAS_SWIGLU").map(Op::arity),
            Some(17)
        );
    }
}
