//! The plan of one graph node: nothing to do, a host-side op, or one kernel.
//!
//! Rules (what `supports_op` answers before asking the kernel store):
//! * `NONE`, `VIEW`, `RESHAPE`, `PERMUTE`, `TRANSPOSE` and empty outputs: nothing to compute.
//! * `DUP`, `CPY`, `CONT`: host-side copies between f32, f16 and bf16 (any layout), or between
//!   equal types stored one element at a time. The NPU shares system memory, so the host reads
//!   and writes the tensors in place. Between f32, f16 and bf16 they are also one kernel each
//!   (`DUP`, `CPY`, `CONT`: input 0 copied into the output in logical order, converting), which
//!   [`plan_preferring`] chooses when the kernel store can provide it.
//! * `GET_ROWS` (f32/f16/bf16 rows, i32 indices, f32 or same-type output) and `SET_ROWS` (f32
//!   rows into f32/f16/bf16, i32 or i64 indices): host-side gathers and scatters, in place.
//!   `SET_ROWS` of f32/f16 rows into f32/f16/bf16 is also a kernel (rows, indices; the output
//!   is the whole destination, written in place), preferred the same way: the KV-cache write.
//!   When its indices name consecutive rows the stream dispatches a copy into them instead
//!   ([`super::scatter`]).
//! * `ADD`, `SUB`, `MUL`, `DIV`: one kernel; the second input is repeated over the first (ggml
//!   broadcasting); output shape = first input's shape.
//! * Unary ops (the seed list plus `SQR`, `SQRT`, `LOG`, `SIN`, `COS`), `SCALE`, `CLAMP`: one
//!   kernel, output shape = input shape.
//!
//! * `GLU` (`REGLU`, `GEGLU`, `SWIGLU`, `GEGLU_ERF`, `GEGLU_QUICK`): one two-input kernel act(x)·g;
//!   the fused form's halves are passed as two strided views of the same tensor.
//! * `SOFT_MAX` (scale, f32/f16 mask with ALiBi `max_bias`, sinks): one kernel named by the
//!   inputs present (`SOFT_MAX`, `SOFT_MAX_MASK`, `SOFT_MAX_SINKS`, `SOFT_MAX_MASK_SINKS`).
//! * `ROPE`: one kernel (`ROPE`, `ROPE_FF` with frequency factors); normal and NeoX modes, f32 or
//!   f16, YaRN parameters; multi-section, vision and offset variants are refused.
//! * `RMS_NORM`, `NORM`: one kernel normalising each row (dimension 0) with op_params[0] = eps;
//!   contiguous tensors are viewed as `[ne0, rows]`.
//! * `MUL_MAT`: one kernel; weights f32, f16, bf16 or block-quantized (`q4_0`, `q4_1`, `q5_0`,
//!   `q8_0`, `q4_K`, `q5_K`, `q6_K`, passed as ggml stores them: `nb[0]` = bytes per block, rows of whole blocks), activations
//!   f32 (broadcast over the batch dimensions as ggml does), output f32.
//! * `FLASH_ATTN_EXT`: one kernel named by the inputs present (`FLASH_ATTN_EXT`, `_MASK`,
//!   `_SINKS`, `_MASK_SINKS`): q f32 `[D, n_q, n_head, n_seq]`; k `[D, n_kv, n_head_kv, ..]`
//!   and v `[Dv, n_kv, n_head_kv, ..]` f32, f16 or bf16 (any strides, rows dense, n_head a
//!   multiple of n_head_kv: grouped-query attention); an f16 mask `[>= n_kv, >= n_q, ..]`
//!   broadcast over heads and sequences; f32 sinks, one per head; op_params = (scale,
//!   max_bias, logit_softcap); output f32 `[Dv, n_head, n_q, n_seq]`, dense. Quantized K/V are
//!   refused.
//! * `ARGMAX` (an f32 matrix to one i32 index per row), `COUNT_EQUAL` (two i32 tensors of one
//!   shape to one i64 count), `CROSS_ENTROPY_LOSS` (f32 logits and labels of one shape to one
//!   f32 loss): one reduction kernel each, operands as laid out in memory.
//!
//! Element-wise kernels on contiguous operands of the same shape are flattened to one dimension,
//! so one kernel serves every shape with the same number of elements.

use super::host::HostOp;
use super::tensor::{DType, Node, Op, Tensor};
use crate::kernels::desc::dtype_block;
use crate::kernels::{KernelDesc, Layout};
use crate::op_catalogue::{self as catalogue, OpEntry};

/// What a node needs.
// Kernel is the common variant (most nodes of a model's graph); boxing it would add an
// allocation per node to save memory only on the rarer Skip and Host plans.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Nothing to compute (layout-only ops, empty tensors).
    Skip,
    /// Runs on the host (boxed: it carries several tensor descriptors).
    Host(Box<HostOp>),
    /// One kernel: its description, and the tensors bound to its operands (inputs in the
    /// kernel's order, then the output).
    Kernel {
        desc: KernelDesc,
        operands: Vec<Tensor>,
    },
}

/// Run-time choices that change plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// `GGML_HSA_F16_AS_BF16`: kernels compute their f16 operands as bf16 (the NPUs have no
    /// f16 arithmetic; bf16 is native), trading precision for support.
    pub f16_as_bf16: bool,
    /// `GGML_HSA_ROW_PIECES`: kernels over many rows run as kernels over power-of-two counts
    /// of them ([`super::pieces`]).
    pub row_pieces: bool,
}

impl Default for PlanOptions {
    fn default() -> PlanOptions {
        PlanOptions {
            f16_as_bf16: false,
            row_pieces: true,
        }
    }
}

/// Plans `node` with `options`, or says why this backend cannot run it.
pub fn plan_with(node: &Node, options: PlanOptions) -> Result<Plan, String> {
    let mut plan = plan(node)?;
    if let Plan::Kernel { desc, .. } = &mut plan {
        let has_f16 = desc
            .inputs
            .iter()
            .chain([&desc.output])
            .any(|t| t.dtype == "f16");
        desc.f16_as_bf16 = options.f16_as_bf16 && has_f16;
    }
    Ok(plan)
}

/// Plans `node` as [`plan_with`] does, except that an op the backend can run both ways
/// (`DUP`, `CPY`, `CONT`, `SET_ROWS`: `Runs::KernelOrHost` in the catalogue) becomes its kernel
/// when `available` says the kernel store can provide it (the compiler declares its types and
/// layouts), so a layer's copies need no host node between its kernels; otherwise the host op.
pub fn plan_preferring(
    node: &Node,
    options: PlanOptions,
    available: impl Fn(&KernelDesc) -> bool,
) -> Result<Plan, String> {
    if !node.dst.is_empty() {
        if let Some(kernel) = device_copy(node) {
            if matches!(&kernel, Plan::Kernel { desc, .. } if available(desc)) {
                return Ok(kernel);
            }
        }
    }
    plan_with(node, options)
}

/// The kernel of a copy (`DUP`, `CPY`, `CONT`) or a `SET_ROWS` between f32, f16 and bf16, when
/// the node is one; `None` for every other node and for what the host op alone runs
/// (quantized types, integer copies). The kernels copy exactly (no `f16_as_bf16`: a copy into
/// f16 must round to f16).
pub(super) fn device_copy(node: &Node) -> Option<Plan> {
    let float = |t: &Tensor| matches!(t.dtype, DType::F32 | DType::F16 | DType::Bf16);
    match node.op {
        Op::Dup | Op::Cpy | Op::Cont => {
            let (src, dst) = (node.src(0)?, &node.dst);
            if !float(src) || !float(dst) || src.nelements() != dst.nelements() {
                return None;
            }
            let op = match node.op {
                Op::Dup => catalogue::DUP,
                Op::Cpy => catalogue::CPY,
                _ => catalogue::CONT,
            };
            // Dense on both sides: one flat kernel serves every shape of the size.
            let flat = src.is_contiguous() && dst.is_contiguous();
            let layout = |t: &Tensor| {
                let size = t.dtype.size().expect("float types have a size");
                if flat {
                    Layout::contiguous(t.dtype.name(), size, [t.nelements(), 1, 1, 1])
                } else {
                    as_layout(t)
                }
            };
            Some(kernel(op, Vec::new(), &[src], dst, layout))
        }
        Op::SetRows if node.src(0)?.is_empty() => None,
        Op::SetRows => {
            let (src, idx, dst) = (node.src(0)?, node.src(1)?, &node.dst);
            let types_ok = matches!(src.dtype, DType::F32 | DType::F16)
                && float(dst)
                && matches!(idx.dtype, DType::I32 | DType::I64);
            // The same shape rule as the host op (ggml's): rows of dst's length, indices
            // repeated over dimensions 2 and 3.
            HostOp::set_rows(src, idx, dst).ok()?;
            if !types_ok {
                return None;
            }
            Some(kernel_as_laid_out(
                catalogue::SET_ROWS,
                Vec::new(),
                &[src, idx],
                dst,
            ))
        }
        _ => None,
    }
}

/// Plans `node` with the default options, or says why this backend cannot run it.
pub fn plan(node: &Node) -> Result<Plan, String> {
    if matches!(node.op, Op::Layout) || node.dst.is_empty() {
        return Ok(Plan::Skip);
    }
    let src = |i: usize| {
        node.src(i)
            .ok_or_else(|| format!("{} has no input {i}", node.op.name()))
    };
    match node.op {
        Op::Layout => Ok(Plan::Skip),
        Op::Dup | Op::Cpy | Op::Cont => {
            HostOp::convert(src(0)?, &node.dst).map(|op| Plan::Host(Box::new(op)))
        }
        Op::GetRows => {
            HostOp::get_rows(src(0)?, src(1)?, &node.dst).map(|op| Plan::Host(Box::new(op)))
        }
        // No rows to write (an empty view of the rows): nothing to do.
        Op::SetRows if src(0)?.is_empty() => Ok(Plan::Skip),
        Op::SetRows => {
            HostOp::set_rows(src(0)?, src(1)?, &node.dst).map(|op| Plan::Host(Box::new(op)))
        }
        Op::Binary(op) => {
            let (a, b) = (src(0)?, src(1)?);
            if !a.same_shape(&node.dst) {
                return Err(format!(
                    "{}: the output shape differs from input 0",
                    op.name()
                ));
            }
            if !b.can_repeat_to(a) {
                return Err(format!(
                    "{}: input 1 cannot be repeated over input 0",
                    op.name()
                ));
            }
            elementwise(entry(op.name())?, Vec::new(), &[a, b], &node.dst)
        }
        Op::Unary(op) => {
            let a = src(0)?;
            if !a.same_shape(&node.dst) {
                return Err(format!(
                    "{}: the output shape differs from the input",
                    op.name()
                ));
            }
            elementwise(entry(op.name())?, Vec::new(), &[a], &node.dst)
        }
        // ggml stores (scale, bias) and (min, max) as two f32 bit patterns.
        Op::Scale | Op::Clamp => {
            let a = src(0)?;
            if !a.same_shape(&node.dst) {
                return Err(format!(
                    "{}: the output shape differs from the input",
                    node.op.name()
                ));
            }
            let op = entry(node.op.name())?;
            elementwise(op, node.op_params[..op.params].to_vec(), &[a], &node.dst)
        }
        Op::MulMat => mul_mat(src(0)?, src(1)?, &node.dst),
        Op::ArgMax => {
            let a = src(0)?;
            let ok = a.dtype == DType::F32
                && node.dst.dtype == DType::I32
                && a.ne[2] == 1
                && a.ne[3] == 1
                && node.dst.ne == [a.ne[1], 1, 1, 1];
            if !ok {
                return Err("ARGMAX: an f32 matrix to one i32 index per row only".into());
            }
            Ok(kernel_as_laid_out(
                catalogue::ARGMAX,
                Vec::new(),
                &[a],
                &node.dst,
            ))
        }
        Op::CountEqual | Op::CrossEntropyLoss => {
            let (a, b) = (src(0)?, src(1)?);
            let (input, output) = if node.op == Op::CountEqual {
                (DType::I32, DType::I64)
            } else {
                (DType::F32, DType::F32)
            };
            let ok = a.dtype == input
                && b.dtype == input
                && a.same_shape(b)
                && node.dst.dtype == output
                && node.dst.nelements() == 1;
            if !ok {
                return Err(format!(
                    "{}: two {input} tensors of one shape to one {output} only",
                    node.op.name()
                ));
            }
            Ok(kernel_as_laid_out(
                entry(node.op.name())?,
                Vec::new(),
                &[a, b],
                &node.dst,
            ))
        }
        Op::Glu { name, .. } => {
            let a = src(0)?;
            let (x, g) = match node.src(1) {
                Some(b) => (a.clone(), b.clone()),
                None => {
                    let nc = a.ne[0] / 2;
                    let (x0, g0) = if node.op_params[1] != 0 {
                        (nc, 0)
                    } else {
                        (0, nc)
                    };
                    (a.slice0(x0, nc), a.slice0(g0, nc))
                }
            };
            if !x.same_shape(&node.dst) || !g.same_shape(&node.dst) {
                return Err(format!(
                    "{name}: the gate and input do not match the output"
                ));
            }
            elementwise(entry(name)?, Vec::new(), &[&x, &g], &node.dst)
        }
        Op::SoftMax => soft_max(node),
        Op::FlashAttnExt => flash_attn_ext(node),
        Op::Rope => rope(node),
        Op::Norm { .. } => {
            let a = src(0)?;
            if !a.same_shape(&node.dst) || !a.dtype.is_float() || a.dtype != node.dst.dtype {
                return Err(format!("{}: unsupported shapes or types", node.op.name()));
            }
            let flat = a.is_contiguous() && node.dst.is_contiguous();
            let rows = |t: &Tensor| rows_layout(t, flat);
            let op = entry(node.op.name())?;
            Ok(Plan::Kernel {
                desc: KernelDesc {
                    op: op.name.to_owned(),
                    op_params: node.op_params[..op.params].to_vec(),
                    inputs: vec![rows(a)],
                    output: rows(&node.dst),
                    f16_as_bf16: false,
                    n_kv_step: None,
                    extra_outputs: Vec::new(),
                },
                operands: vec![a.clone(), node.dst.clone()],
            })
        }
        Op::Other(name) => Err(format!("op {name} is not supported by this build")),
    }
}

/// `t` as `[ne0, rows]` when `flat` (the operands of a row op are all contiguous), else as laid
/// out.
pub(super) fn rows_layout(t: &Tensor, flat: bool) -> Layout {
    let size = t.dtype.size().expect("float types have a size");
    if flat {
        Layout::contiguous(
            t.dtype.name(),
            size,
            [t.ne[0], t.nelements() / t.ne[0].max(1), 1, 1],
        )
    } else {
        as_layout(t)
    }
}

/// One ROPE kernel (`ROPE`, or `ROPE_FF` with frequency factors): normal and NeoX modes, f32 or
/// f16 data, no offset. The op parameters that do not change the result (n_past, n_ctx) are
/// dropped so one kernel serves every call with the same rotation.
fn rope(node: &Node) -> Result<Plan, String> {
    let x = node.src(0).ok_or("ROPE has no input")?;
    let pos = node.src(1).ok_or("ROPE has no positions")?;
    let ff = node.src(2);
    let p = &node.op_params;
    let (n_dims, mode, offset) = (i64::from(p[1]), p[2], p[15]);
    if !matches!(x.dtype, DType::F32 | DType::F16)
        || x.dtype != node.dst.dtype
        || !x.same_shape(&node.dst)
    {
        return Err("ROPE: data and output must be f32 or f16 of one shape".into());
    }
    if pos.dtype != DType::I32 || pos.nelements() < x.ne[2] {
        return Err("ROPE: positions must be i32, one per row of dimension 2".into());
    }
    // x contiguous, or a view whose tokens (dimension 2) lie apart, each token's rows
    // contiguous: phi3's Q and K, views of one attn_qkv product.
    let size = x.dtype.size().unwrap_or(0);
    let token = size * (x.ne[0] * x.ne[1]) as u64;
    let tokens_apart = x.nb[0] == size
        && (x.ne[1] == 1 || x.nb[1] == size * x.ne[0] as u64)
        && x.ne[3] == 1
        && x.nb[2] % 4 == 0
        && x.nb[2] >= token;
    if !(x.is_contiguous() || tokens_apart) || !node.dst.is_contiguous() {
        return Err("ROPE: strided data other than tokens apart is not supported".into());
    }
    if !(mode == 0 || mode == 2) {
        return Err(format!(
            "ROPE mode {mode} is not supported (normal and NeoX only)"
        ));
    }
    if offset != 0 {
        return Err(format!(
            "ROPE with a dimension offset ({offset}) is not supported"
        ));
    }
    // No dimension rotated: ggml copies the rows. Nothing computes that in real graphs, but
    // llama.cpp asks it of every device for its frequency-factor weights (rope_freqs); declined,
    // those weights go to a host buffer, and every split with a ROPE copies them again.
    if n_dims == 0 && ff.is_none_or(|f| f.dtype == DType::F32) {
        return HostOp::convert(x, &node.dst).map(|op| Plan::Host(Box::new(op)));
    }
    if n_dims <= 0 || n_dims % 2 != 0 || n_dims > x.ne[0] {
        return Err(format!("ROPE: n_dims {n_dims} for rows of {}", x.ne[0]));
    }
    if ff.is_some_and(|f| f.dtype != DType::F32 || f.nelements() < n_dims / 2) {
        return Err("ROPE: frequency factors must be f32 covering n_dims / 2".into());
    }
    let mut op_params = p[..catalogue::ROPE.params].to_vec();
    op_params[0] = 0; // n_past
    op_params[3] = 0; // n_ctx
    let inputs: Vec<&Tensor> = [Some(x), Some(pos), ff].into_iter().flatten().collect();
    let op = if ff.is_some() {
        catalogue::ROPE_FF
    } else {
        catalogue::ROPE
    };
    Ok(kernel_as_laid_out(op, op_params, &inputs, &node.dst))
}

/// One SOFT_MAX kernel: `SOFT_MAX`, `SOFT_MAX_MASK`, `SOFT_MAX_SINKS` or `SOFT_MAX_MASK_SINKS`
/// by the inputs present (x, then the mask, then the sinks); op_params = (scale, max_bias).
fn soft_max(node: &Node) -> Result<Plan, String> {
    let x = node.src(0).ok_or("SOFT_MAX has no input")?;
    let (mask, sinks) = (node.src(1), node.src(2));
    if x.dtype != DType::F32 || node.dst.dtype != DType::F32 || !x.same_shape(&node.dst) {
        return Err("SOFT_MAX: input and output must be f32 of one shape".into());
    }
    if let Some(m) = mask {
        let ok = matches!(m.dtype, DType::F32 | DType::F16)
            && m.ne[0] >= x.ne[0]
            && m.ne[1] >= x.ne[1]
            && m.ne[2] > 0
            && m.ne[3] > 0
            && x.ne[2] % m.ne[2] == 0
            && x.ne[3] % m.ne[3] == 0;
        if !ok {
            return Err("SOFT_MAX: unsupported mask".into());
        }
    }
    if let Some(k) = sinks {
        if k.dtype != DType::F32 || k.nelements() < x.ne[2] || !k.is_contiguous() {
            return Err("SOFT_MAX: unsupported sinks".into());
        }
    }
    let op = match (mask.is_some(), sinks.is_some()) {
        (false, false) => catalogue::SOFT_MAX,
        (true, false) => catalogue::SOFT_MAX_MASK,
        (false, true) => catalogue::SOFT_MAX_SINKS,
        (true, true) => catalogue::SOFT_MAX_MASK_SINKS,
    };
    let inputs: Vec<&Tensor> = [Some(x), mask, sinks].into_iter().flatten().collect();
    Ok(kernel_as_laid_out(
        op,
        node.op_params[..op.params].to_vec(),
        &inputs,
        &node.dst,
    ))
}

/// One FLASH_ATTN_EXT kernel: `FLASH_ATTN_EXT`, `FLASH_ATTN_EXT_MASK`, `FLASH_ATTN_EXT_SINKS` or
/// `FLASH_ATTN_EXT_MASK_SINKS` by the inputs present (q, k, v, then the mask, then the sinks);
/// op_params = (scale, max_bias, logit_softcap). ggml's precision word (op_params[3]) and its
/// n_kv_max hint (op_params[4]) are dropped: kernels accumulate in f32 either way and the hint
/// does not change the result, so one kernel serves them all.
fn flash_attn_ext(node: &Node) -> Result<Plan, String> {
    let (q, k, v) = match (node.src(0), node.src(1), node.src(2)) {
        (Some(q), Some(k), Some(v)) => (q, k, v),
        _ => return Err("FLASH_ATTN_EXT needs q, k and v".into()),
    };
    let (mask, sinks) = (node.src(3), node.src(4));
    let dst = &node.dst;
    let kv_type = |t: &Tensor| matches!(t.dtype, DType::F32 | DType::F16 | DType::Bf16);
    if q.dtype != DType::F32 || !kv_type(k) || !kv_type(v) || dst.dtype != DType::F32 {
        return Err(format!(
            "FLASH_ATTN_EXT: q f32 and k/v f32, f16 or bf16 only (q {}, k {}, v {})",
            q.dtype, k.dtype, v.dtype
        ));
    }
    // Rows (head vectors) are read as dense runs; everything above them by stride.
    let dense_rows = [q, k, v].iter().all(|t| t.dtype.size() == Some(t.nb[0]));
    let [d, n_q, n_head, n_seq] = q.ne;
    let heads_ok = (2..4).all(|i| k.ne[i] > 0 && v.ne[i] == k.ne[i] && q.ne[i] % k.ne[i] == 0);
    let shapes_ok = k.ne[0] == d
        && v.ne[1] == k.ne[1]
        && heads_ok
        && dst.ne == [v.ne[0], n_head, n_q, n_seq]
        && dst.is_contiguous();
    if !dense_rows || !shapes_ok {
        return Err("FLASH_ATTN_EXT: q, k, v and the output do not agree".into());
    }
    if let Some(m) = mask {
        let ok = m.dtype == DType::F16
            && m.is_contiguous()
            && m.ne[0] >= k.ne[1]
            && m.ne[1] >= n_q
            && (2..4).all(|i| m.ne[i] > 0 && q.ne[i] % m.ne[i] == 0);
        if !ok {
            return Err("FLASH_ATTN_EXT: the mask must be f16 covering [n_kv, n_q]".into());
        }
    }
    if let Some(s) = sinks {
        if s.dtype != DType::F32 || s.nelements() < n_head || !s.is_contiguous() {
            return Err("FLASH_ATTN_EXT: sinks must be f32, one per head".into());
        }
    }
    let max_bias = f32::from_bits(node.op_params[1] as u32);
    if max_bias > 0.0 && mask.is_none() {
        return Err("FLASH_ATTN_EXT: ALiBi (max_bias) needs a mask".into());
    }
    let op = match (mask.is_some(), sinks.is_some()) {
        (false, false) => catalogue::FLASH_ATTN_EXT,
        (true, false) => catalogue::FLASH_ATTN_EXT_MASK,
        (false, true) => catalogue::FLASH_ATTN_EXT_SINKS,
        (true, true) => catalogue::FLASH_ATTN_EXT_MASK_SINKS,
    };
    let inputs: Vec<&Tensor> = [Some(q), Some(k), Some(v), mask, sinks]
        .into_iter()
        .flatten()
        .collect();
    Ok(kernel_as_laid_out(
        op,
        node.op_params[..op.params].to_vec(),
        &inputs,
        dst,
    ))
}

/// One MUL_MAT kernel, operands as laid out in memory (the kernel walks their strides). The
/// weights may be block-quantized in a type kernel descriptors can name (`kernels::DTYPES`)
/// with rows of whole blocks (ggml's layout); the compiler's capabilities decide the rest.
/// The activations are f32, or bf16 over f16 and block-quantized weights (a prompt's, written
/// so for its GEMMs: [`super::bf16_activations`]).
pub(super) fn mul_mat(w: &Tensor, x: &Tensor, dst: &Tensor) -> Result<Plan, String> {
    let quantized = matches!(w.dtype, DType::Quant(_));
    let weights_ok = w.dtype.is_float()
        || (quantized && dtype_block(w.dtype.name()).is_some() && w.has_whole_blocks());
    let x_ok =
        x.dtype == DType::F32 || (x.dtype == DType::Bf16 && (quantized || w.dtype == DType::F16));
    if !weights_ok || !x_ok || dst.dtype != DType::F32 {
        return Err(format!(
            "MUL_MAT of {} weights and {} activations into {} is not supported",
            w.dtype, x.dtype, dst.dtype
        ));
    }
    let batch_ok = (2..4).all(|d| w.ne[d] > 0 && x.ne[d] % w.ne[d] == 0);
    if w.ne[0] != x.ne[0] || dst.ne != [w.ne[1], x.ne[1], x.ne[2], x.ne[3]] || !batch_ok {
        return Err("MUL_MAT shapes do not agree".into());
    }
    Ok(kernel_as_laid_out(
        catalogue::MUL_MAT,
        Vec::new(),
        &[w, x],
        dst,
    ))
}

/// The catalogue's kernel op `name` (every op the planner names is in the catalogue; the tests
/// of `kernels::gen_config` go through all of them).
fn entry(name: &str) -> Result<&'static OpEntry, String> {
    OpEntry::by_name(name).ok_or_else(|| format!("{name} is not in the op catalogue"))
}

/// One kernel over `inputs` into `dst`, every operand as laid out in memory.
pub(super) fn kernel_as_laid_out(
    op: &'static OpEntry,
    op_params: Vec<i32>,
    inputs: &[&Tensor],
    dst: &Tensor,
) -> Plan {
    kernel(op, op_params, inputs, dst, as_layout)
}

/// One kernel over `inputs` into `dst`, each operand described by `layout`.
fn kernel(
    op: &'static OpEntry,
    op_params: Vec<i32>,
    inputs: &[&Tensor],
    dst: &Tensor,
    layout: impl Fn(&Tensor) -> Layout,
) -> Plan {
    Plan::Kernel {
        desc: KernelDesc {
            op: op.name.to_owned(),
            op_params,
            inputs: inputs.iter().map(|t| layout(t)).collect(),
            output: layout(dst),
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        },
        operands: inputs
            .iter()
            .map(|&t| t.clone())
            .chain([dst.clone()])
            .collect(),
    }
}

/// A kernel operand laid out exactly as the tensor is in memory.
pub(super) fn as_layout(t: &Tensor) -> Layout {
    Layout {
        dtype: t.dtype.name().to_owned(),
        ne: t.ne,
        nb: t.nb,
    }
}

/// One element-wise kernel over `inputs` into `dst`, flattened when every operand is contiguous
/// and all have the output's shape.
fn elementwise(
    op: &'static OpEntry,
    op_params: Vec<i32>,
    inputs: &[&Tensor],
    dst: &Tensor,
) -> Result<Plan, String> {
    for t in inputs.iter().copied().chain([dst]) {
        if t.dtype.size().is_none() {
            return Err(format!("{}: type {} is not supported", op.name, t.dtype));
        }
    }
    let flat = inputs
        .iter()
        .all(|t| t.same_shape(dst) && t.is_contiguous())
        && dst.is_contiguous();
    let layout = |t: &Tensor| {
        let size = t.dtype.size().expect("checked above");
        if flat {
            Layout::contiguous(t.dtype.name(), size, [t.nelements(), 1, 1, 1])
        } else {
            as_layout(t)
        }
    };
    Ok(kernel(op, op_params, inputs, dst, layout))
}

#[cfg(test)]
mod tests {
    use super::super::tensor::test_util::{node, tensor};
    use super::super::tensor::{BinaryOp, DType, QuantType, UnaryOp};
    use super::*;

    #[test]
    fn same_shape_elementwise_ops_are_flattened() {
        let t = tensor(DType::F32, [8, 3, 2, 1], 0x1000);
        let n = node(
            Op::Binary(BinaryOp::Add),
            t.clone(),
            vec![t.clone(), t.clone()],
        );
        let Plan::Kernel { desc, operands } = plan(&n).unwrap() else {
            panic!()
        };
        assert_eq!(desc.canonical_name(), "add-f32_48-f32_48-f32_48");
        assert_eq!(operands.len(), 3);
        let mut u = node(Op::Unary(UnaryOp::Gelu), t.clone(), vec![t.clone()]);
        u.op_params[0] = 7; // ggml's unary op id: not a kernel parameter
        let Plan::Kernel { desc, .. } = plan(&u).unwrap() else {
            panic!()
        };
        assert_eq!(desc.canonical_name(), "gelu-f32_48-f32_48");
    }

    #[test]
    fn broadcast_and_views_keep_their_layout() {
        let a = tensor(DType::F32, [8, 3, 1, 1], 0);
        let b = tensor(DType::Bf16, [8, 1, 1, 1], 0);
        let n = node(Op::Binary(BinaryOp::Mul), a.clone(), vec![a.clone(), b]);
        let Plan::Kernel { desc, .. } = plan(&n).unwrap() else {
            panic!()
        };
        assert_eq!(desc.inputs[1].ne, [8, 1, 1, 1]);
        assert_eq!(desc.inputs[1].dtype, "bf16");
        let bad = node(
            Op::Binary(BinaryOp::Mul),
            a.clone(),
            vec![a.clone(), tensor(DType::F32, [3, 1, 1, 1], 0)],
        );
        assert!(plan(&bad).unwrap_err().contains("repeated"));
    }

    #[test]
    fn a_rope_rotating_no_dimension_is_a_copy() {
        let x = tensor(DType::F32, [64, 2, 8, 1], 0);
        let pos = tensor(DType::I32, [8, 1, 1, 1], 0x1000);
        let ff = tensor(DType::F32, [32, 1, 1, 1], 0x2000);
        let dst = tensor(DType::F32, [64, 2, 8, 1], 0x3000);
        let rope = |n_dims: i32| {
            node_with(
                Op::Rope,
                &[0, n_dims],
                dst.clone(),
                vec![x.clone(), pos.clone(), ff.clone()],
            )
        };
        assert!(matches!(plan(&rope(0)), Ok(Plan::Host(_))));
        let Ok(Plan::Kernel { desc, .. }) = plan(&rope(64)) else {
            panic!("a rotation is a kernel");
        };
        assert_eq!(desc.op, catalogue::ROPE_FF.name);
        assert!(plan(&rope(-2)).is_err());
    }

    #[test]
    fn a_rope_takes_x_contiguous_or_with_its_tokens_apart() {
        let pos = tensor(DType::I32, [8, 1, 1, 1], 0x1000);
        let dst = tensor(DType::F32, [64, 2, 8, 1], 0x3000);
        let rope = |x: Tensor| node_with(Op::Rope, &[0, 64], dst.clone(), vec![x, pos.clone()]);
        let mut x = tensor(DType::F32, [64, 2, 8, 1], 0);
        assert!(plan(&rope(x.clone())).is_ok());
        // phi3's Q of one attn_qkv product: a token's 2 heads, then the next token 384 values on.
        x.nb[2] = 384 * 4;
        assert!(plan(&rope(x.clone())).is_ok());
        // A token's heads apart, or tokens overlapping: declined.
        for nb in [[4, 512, 4096, 32768], [4, 256, 256, 2048]] {
            x.nb = nb;
            assert!(plan(&rope(x.clone())).is_err(), "{nb:?}");
        }
    }

    #[test]
    fn scale_keeps_its_two_parameters() {
        let t = tensor(DType::F32, [4, 1, 1, 1], 0);
        let mut n = node(Op::Scale, t.clone(), vec![t]);
        n.op_params[0] = 2.0f32.to_bits() as i32;
        n.op_params[1] = 0.5f32.to_bits() as i32;
        let Plan::Kernel { desc, .. } = plan(&n).unwrap() else {
            panic!()
        };
        assert_eq!(desc.op_params, [0x4000_0000, 0x3f00_0000]);
    }

    #[test]
    fn layout_ops_and_empty_outputs_are_skipped_and_unknown_ops_refused() {
        let t = tensor(DType::F32, [4, 1, 1, 1], 0);
        assert_eq!(plan(&node(Op::Layout, t.clone(), vec![])), Ok(Plan::Skip));
        let e = tensor(DType::F32, [0, 4, 1, 1], 0);
        assert_eq!(
            plan(&node(Op::Unary(UnaryOp::Exp), e.clone(), vec![e])),
            Ok(Plan::Skip)
        );
        let err = plan(&node(Op::Other("SOFT_MAX"), t.clone(), vec![t.clone(), t])).unwrap_err();
        assert!(err.contains("SOFT_MAX"));
    }

    #[test]
    fn mul_mat_keeps_layouts_and_checks_shapes() {
        let w = tensor(DType::F16, [64, 32, 2, 1], 0);
        let x = tensor(DType::F32, [64, 5, 4, 1], 0);
        let d = tensor(DType::F32, [32, 5, 4, 1], 0);
        let Plan::Kernel { desc, operands } =
            plan(&node(Op::MulMat, d.clone(), vec![w.clone(), x.clone()])).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            desc.canonical_name(),
            "mul_mat-f16_64x32x2-f32_64x5x4-f32_32x5x4"
        );
        assert_eq!(operands.len(), 3);
        let bad = tensor(DType::F32, [32, 5, 3, 1], 0);
        assert!(plan(&node(Op::MulMat, bad, vec![w.clone(), x.clone()])).is_err());
        let mut q = w;
        q.dtype = DType::Other("q4_0");
        assert!(plan(&node(Op::MulMat, d, vec![q, x]))
            .unwrap_err()
            .contains("q4_0"));
    }

    /// A block-quantized tensor of `ty` (name, block, bytes) laid out as ggml lays it out.
    fn quantized(name: &'static str, block: u64, bytes: u64, ne: [i64; 4]) -> Tensor {
        let mut t = tensor(DType::I8, ne, 0);
        t.dtype = DType::Quant(QuantType {
            name,
            id: 0,
            block,
            block_bytes: bytes,
            decode: true,
            encode: true,
        });
        let row = ne[0] as u64 / block * bytes;
        t.nb = [bytes, row, row * ne[1] as u64, row * (ne[1] * ne[2]) as u64];
        t
    }

    #[test]
    fn quantized_weights_are_mul_mat_operands_in_their_block_layout() {
        let x = tensor(DType::F32, [512, 1, 6, 1], 0);
        let d = tensor(DType::F32, [7, 1, 6, 1], 0);
        for (name, block, bytes, part) in [
            ("q4_0", 32, 18, "q4_0_512x7x3"),
            ("q8_0", 32, 34, "q8_0_512x7x3"),
            ("q4_K", 256, 144, "q4_k_512x7x3"),
            ("q4_1", 32, 20, "q4_1_512x7x3"),
            ("q5_0", 32, 22, "q5_0_512x7x3"),
            ("q5_K", 256, 176, "q5_k_512x7x3"),
            ("q6_K", 256, 210, "q6_k_512x7x3"),
        ] {
            let w = quantized(name, block, bytes, [512, 7, 3, 1]);
            let Plan::Kernel { desc, operands } =
                plan(&node(Op::MulMat, d.clone(), vec![w.clone(), x.clone()])).unwrap()
            else {
                panic!("{name}")
            };
            assert_eq!(desc.inputs[0].dtype, name);
            assert_eq!(desc.inputs[0].nb, w.nb);
            assert_eq!(
                desc.canonical_name(),
                format!("mul_mat-{part}-f32_512x1x6-f32_7x1x6")
            );
            assert_eq!(operands[0], w);
        }
        // Types the descriptor format cannot name, and quantized activations, are refused.
        let q5 = quantized("q5_1", 32, 24, [512, 7, 3, 1]);
        let err = plan(&node(Op::MulMat, d.clone(), vec![q5, x.clone()])).unwrap_err();
        assert!(err.contains("q5_1"), "{err}");
        let q8x = quantized("q8_0", 32, 34, [512, 1, 6, 1]);
        let w = tensor(DType::F32, [512, 7, 3, 1], 0);
        assert!(plan(&node(Op::MulMat, d, vec![w, q8x])).is_err());
    }

    #[test]
    fn quantized_operands_are_refused_outside_mul_mat_weights() {
        let t = tensor(DType::F32, [32, 1, 1, 1], 0);
        let q = quantized("q4_0", 32, 18, [32, 1, 1, 1]);
        let err = plan(&node(
            Op::Binary(BinaryOp::Add),
            t.clone(),
            vec![t.clone(), q.clone()],
        ))
        .unwrap_err();
        assert!(err.contains("q4_0"), "{err}");
        let err = plan(&node(Op::Unary(UnaryOp::Relu), t, vec![q])).unwrap_err();
        assert!(err.contains("q4_0"), "{err}");
    }

    #[test]
    fn argmax_count_equal_and_cross_entropy_loss_are_kernels() {
        let x = tensor(DType::F32, [100, 10, 1, 1], 0);
        let idx = tensor(DType::I32, [10, 1, 1, 1], 0);
        let Plan::Kernel { desc, .. } =
            plan(&node(Op::ArgMax, idx.clone(), vec![x.clone()])).unwrap()
        else {
            panic!()
        };
        assert_eq!(desc.canonical_name(), "argmax-f32_100x10-i32_10");
        let batched = tensor(DType::F32, [100, 10, 2, 1], 0);
        assert!(plan(&node(Op::ArgMax, idx.clone(), vec![batched])).is_err());
        assert!(plan(&node(Op::ArgMax, x.clone(), vec![x.clone()])).is_err());

        let count = tensor(DType::I64, [1, 1, 1, 1], 0);
        let Plan::Kernel { desc, operands } = plan(&node(
            Op::CountEqual,
            count.clone(),
            vec![idx.clone(), idx.clone()],
        ))
        .unwrap() else {
            panic!()
        };
        assert_eq!(desc.canonical_name(), "count_equal-i32_10-i32_10-i64_1");
        assert_eq!(operands.len(), 3);
        let other = tensor(DType::I32, [5, 1, 1, 1], 0);
        assert!(plan(&node(Op::CountEqual, count, vec![idx.clone(), other])).is_err());

        let loss = tensor(DType::F32, [1, 1, 1, 1], 0);
        let Plan::Kernel { desc, .. } = plan(&node(
            Op::CrossEntropyLoss,
            loss.clone(),
            vec![x.clone(), x.clone()],
        ))
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            desc.canonical_name(),
            "cross_entropy_loss-f32_100x10-f32_100x10-f32_1"
        );
        assert!(plan(&node(Op::CrossEntropyLoss, loss, vec![idx.clone(), idx])).is_err());
    }

    /// A FLASH_ATTN_EXT node as llama.cpp builds it: q `[d, n_q, n_head, n_seq]`, k and v views
    /// of a cache twice as long, an f16 mask, optional sinks.
    fn attention(d: i64, dv: i64, n_q: i64, n_head: i64, n_head_kv: i64, sinks: bool) -> Node {
        let n_kv = 96;
        let q = tensor(DType::F32, [d, n_q, n_head, 1], 0);
        let cache = |dim: i64| {
            let full = tensor(DType::F16, [dim, 2 * n_kv, n_head_kv, 1], 0);
            view(DType::F16, [dim, n_kv, n_head_kv, 1], full.nb)
        };
        let mask = tensor(DType::F16, [n_kv, n_q, 1, 1], 0);
        let dst = tensor(DType::F32, [dv, n_head, n_q, 1], 0);
        let mut src = vec![q, cache(d), cache(dv), mask];
        if sinks {
            src.push(tensor(DType::F32, [n_head, 1, 1, 1], 0));
        }
        let (scale, bias, cap) = (0.125f32, 0.0f32, 0.0f32);
        let prec_f32 = 10; // GGML_PREC_F32: no kernel parameter
        let params = [scale, bias, cap].map(|f| f.to_bits() as i32);
        node_with(
            Op::FlashAttnExt,
            &[params[0], params[1], params[2], prec_f32, 512],
            dst,
            src,
        )
    }

    #[test]
    fn flash_attn_ext_is_one_kernel_named_by_its_inputs() {
        let n = attention(64, 64, 7, 8, 2, false);
        let Plan::Kernel { desc, operands } = plan(&n).unwrap() else {
            panic!()
        };
        assert_eq!(desc.op, "FLASH_ATTN_EXT_MASK");
        // Only scale, max_bias and softcap: the precision and n_kv_max words are dropped.
        assert_eq!(desc.op_params, [0.125f32.to_bits() as i32, 0, 0]);
        assert_eq!(desc.inputs.len(), 4);
        // The K/V cache views keep their strides.
        assert_eq!(desc.inputs[1].nb[2], 64 * 2 * 192);
        assert_eq!(desc.output.ne, [64, 8, 7, 1]);
        assert_eq!(operands.len(), 5);
        let Plan::Kernel { desc, .. } = plan(&attention(64, 128, 1, 4, 4, true)).unwrap() else {
            panic!()
        };
        assert_eq!(desc.op, "FLASH_ATTN_EXT_MASK_SINKS");
        // Without the mask, src[3] is NULL and the sinks are the fourth input.
        let mut n = attention(64, 64, 3, 4, 1, true);
        n.src[3] = None;
        let Plan::Kernel { desc, .. } = plan(&n).unwrap() else {
            panic!()
        };
        assert_eq!(desc.op, "FLASH_ATTN_EXT_SINKS");
        assert_eq!(desc.inputs[3].dtype, "f32");
        n.src.truncate(3);
        let Plan::Kernel { desc, .. } = plan(&n).unwrap() else {
            panic!()
        };
        assert_eq!(desc.op, "FLASH_ATTN_EXT");
    }

    #[test]
    fn flash_attn_ext_declines_what_it_cannot_run() {
        let refused = |f: &dyn Fn(&mut Node)| {
            let mut n = attention(64, 64, 5, 8, 2, true);
            f(&mut n);
            plan(&n).unwrap_err()
        };
        // Quantized K (ggml's q8_0 cache) and f16 q.
        let err = refused(&|n| n.src[1].as_mut().unwrap().dtype = DType::Other("q8_0"));
        assert!(err.contains("q8_0"), "{err}");
        refused(&|n| n.src[0] = Some(tensor(DType::F16, [64, 5, 8, 1], 0)));
        // Heads that do not divide (GQA needs n_head % n_head_kv == 0).
        refused(&|n| {
            n.src[1] = Some(tensor(DType::F16, [64, 96, 3, 1], 0));
            n.src[2] = Some(tensor(DType::F16, [64, 96, 3, 1], 0));
        });
        // A mask shorter than the keys, an f32 mask, too few sinks.
        refused(&|n| n.src[3] = Some(tensor(DType::F16, [95, 5, 1, 1], 0)));
        refused(&|n| n.src[3] = Some(tensor(DType::F32, [96, 5, 1, 1], 0)));
        refused(&|n| n.src[4] = Some(tensor(DType::F32, [4, 1, 1, 1], 0)));
        // A permuted output, and ALiBi without a mask.
        refused(&|n| n.dst = tensor(DType::F32, [64, 5, 8, 1], 0));
        refused(&|n| {
            n.src[3] = None;
            n.op_params[1] = 8.0f32.to_bits() as i32;
        });
        // Rows that are not dense (a transposed k).
        refused(&|n| n.src[1].as_mut().unwrap().nb[0] = 4);
    }

    #[test]
    fn copies_and_set_rows_are_kernels_when_available_and_host_ops_otherwise() {
        let yes = |_: &KernelDesc| true;
        let no = |_: &KernelDesc| false;
        let opts = PlanOptions {
            f16_as_bf16: true,
            ..PlanOptions::default()
        };
        // A dense f32 -> f16 copy: one flat CPY kernel, never computed as bf16.
        let src = tensor(DType::F32, [8, 3, 1, 1], 0);
        let cpy = node(
            Op::Cpy,
            tensor(DType::F16, [24, 1, 1, 1], 0),
            vec![src.clone()],
        );
        let Ok(Plan::Kernel { desc, operands }) = plan_preferring(&cpy, opts, yes) else {
            panic!()
        };
        assert_eq!(desc.canonical_name(), "cpy-f32_24-f16_24");
        assert!(!desc.f16_as_bf16);
        assert_eq!(operands.len(), 2);
        assert!(matches!(plan_preferring(&cpy, opts, no), Ok(Plan::Host(_))));
        // CONT of a permuted view keeps the view's strides; DUP is its own kernel.
        let permuted = view(DType::F32, [4, 3, 2, 1], [12, 4, 48, 96]);
        let cont = node(
            Op::Cont,
            tensor(DType::F32, [4, 3, 2, 1], 0),
            vec![permuted],
        );
        let Ok(Plan::Kernel { desc, .. }) = plan_preferring(&cont, opts, yes) else {
            panic!()
        };
        assert_eq!(desc.op, "CONT");
        assert_eq!(desc.inputs[0].nb, [12, 4, 48, 96]);
        let dup = node(Op::Dup, src.clone(), vec![src.clone()]);
        let Ok(Plan::Kernel { desc, .. }) = plan_preferring(&dup, opts, yes) else {
            panic!()
        };
        assert_eq!(desc.op, "DUP");
        // Quantized copies stay on the host whatever the compiler declares.
        let q = quantized("q8_0", 32, 34, [32, 1, 1, 1]);
        let to_q = node(Op::Cpy, q, vec![tensor(DType::F32, [32, 1, 1, 1], 0)]);
        assert!(matches!(
            plan_preferring(&to_q, opts, yes),
            Ok(Plan::Host(_))
        ));
        // The KV-cache write: rows, i64 indices, the whole cache as the output.
        let rows = tensor(DType::F32, [64, 1, 1, 1], 0);
        let idx = tensor(DType::I64, [1, 1, 1, 1], 0);
        let cache = tensor(DType::F16, [64, 32, 1, 1], 0);
        let set = node(Op::SetRows, cache.clone(), vec![rows.clone(), idx.clone()]);
        let Ok(Plan::Kernel { desc, operands }) = plan_preferring(&set, opts, yes) else {
            panic!()
        };
        assert_eq!(desc.canonical_name(), "set_rows-f32_64-i64_1-f16_64x32");
        assert_eq!(operands[2], cache);
        assert!(matches!(plan_preferring(&set, opts, no), Ok(Plan::Host(_))));
        // No rows to write: nothing to do either way.
        let none = node(
            Op::SetRows,
            cache.clone(),
            vec![tensor(DType::F32, [64, 0, 1, 1], 0), idx],
        );
        assert_eq!(plan_preferring(&none, opts, yes), Ok(Plan::Skip));
        assert_eq!(plan(&none), Ok(Plan::Skip));
        // Other ops are planned as before.
        let relu = node(Op::Unary(UnaryOp::Relu), rows.clone(), vec![rows]);
        assert_eq!(plan_preferring(&relu, opts, no), plan_with(&relu, opts));
    }

    #[test]
    fn f16_as_bf16_marks_only_kernels_with_f16_operands() {
        let on = PlanOptions {
            f16_as_bf16: true,
            ..PlanOptions::default()
        };
        let h = tensor(DType::F16, [8, 1, 1, 1], 0);
        let f = tensor(DType::F32, [8, 1, 1, 1], 0);
        let desc = |n: &Node, o: PlanOptions| match plan_with(n, o).unwrap() {
            Plan::Kernel { desc, .. } => desc,
            other => panic!("{other:?}"),
        };
        let add = node(
            Op::Binary(BinaryOp::Add),
            h.clone(),
            vec![h.clone(), f.clone()],
        );
        let (exact, as_bf16) = (desc(&add, PlanOptions::default()), desc(&add, on));
        assert!(!exact.f16_as_bf16 && as_bf16.f16_as_bf16);
        assert_eq!(exact.canonical_name(), "add-f16_8-f32_8-f16_8");
        assert_eq!(as_bf16.canonical_name(), "add-f16_8-f32_8-f16_8-f16asbf16");
        assert!(as_bf16
            .request_json(crate::kernels::Arch::Aie2)
            .contains("\"f16_as_bf16\":true"));
        assert!(!exact
            .request_json(crate::kernels::Arch::Aie2)
            .contains("f16_as_bf16"));
        // Kernels without f16 operands are the same kernels either way.
        let relu = node(Op::Unary(UnaryOp::Relu), f.clone(), vec![f]);
        assert_eq!(desc(&relu, on), desc(&relu, PlanOptions::default()));
        // Host-side ops are not affected.
        let cpy = node(Op::Cpy, tensor(DType::F32, [8, 1, 1, 1], 0), vec![h]);
        assert!(matches!(plan_with(&cpy, on), Ok(Plan::Host(_))));
    }

    // The planner's descriptions against the kernel configs of gen-kernels and the catalogue.
    use crate::kernels::gen_config::{KernelConfig, KernelEntry};
    use crate::kernels::Arch;

    #[test]
    fn the_catalogue_names_every_op_the_backend_makes() {
        for op in UnaryOp::ALL {
            let k = OpEntry::by_name(op.name()).unwrap();
            assert_eq!(
                (k.iron_source, k.inputs),
                (Some("unary_ops.py"), 1),
                "{}",
                op.name()
            );
        }
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
            assert_eq!(
                OpEntry::by_name(op.name()).unwrap().iron_source,
                Some("binary_ops.py")
            );
        }
    }

    fn view(dtype: DType, ne: [i64; 4], nb: [u64; 4]) -> Tensor {
        Tensor {
            ne,
            nb,
            ..tensor(dtype, ne, 0)
        }
    }

    fn node_with(op: Op, params: &[i32], dst: Tensor, src: Vec<Tensor>) -> Node {
        let mut op_params = [0; 16];
        op_params[..params.len()].copy_from_slice(params);
        Node {
            op,
            op_params,
            dst,
            src: src.into_iter().map(Some).collect(),
            is_output: false,
        }
    }

    /// Every kind of description the planner makes: each op, each type, flattened, broadcast
    /// and strided operands, op parameters.
    fn backend_descs() -> Vec<KernelDesc> {
        let mut nodes = Vec::new();
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let t = tensor(dtype, [16, 5, 4, 3], 0);
            let size = dtype.size().unwrap();
            let permuted = view(
                dtype,
                [16, 5, 4, 3],
                [5 * size, size, 80 * size, 320 * size],
            );
            let row = tensor(dtype, [16, 1, 1, 1], 0);
            for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                let op = Op::Binary(op);
                nodes.push(node_with(op, &[], t.clone(), vec![t.clone(), t.clone()]));
                nodes.push(node_with(op, &[], t.clone(), vec![t.clone(), row.clone()]));
                nodes.push(node_with(
                    op,
                    &[],
                    t.clone(),
                    vec![t.clone(), permuted.clone()],
                ));
                let mixed = tensor(DType::F32, [16, 5, 4, 3], 0);
                nodes.push(node_with(op, &[], t.clone(), vec![t.clone(), mixed]));
            }
            for op in UnaryOp::ALL {
                let op = Op::Unary(op);
                nodes.push(node_with(op, &[], t.clone(), vec![t.clone()]));
                nodes.push(node_with(op, &[], t.clone(), vec![permuted.clone()]));
            }
            let (two, half) = (2.0f32.to_bits() as i32, 0.5f32.to_bits() as i32);
            for op in [Op::Scale, Op::Clamp] {
                nodes.push(node_with(op, &[two, half], t.clone(), vec![t.clone()]));
                nodes.push(node_with(op, &[two], t.clone(), vec![permuted.clone()]));
                nodes.push(node_with(op, &[], t.clone(), vec![t.clone()]));
            }
        }
        // Attention: views of a KV cache, grouped-query heads, with and without sinks.
        nodes.push(attention(64, 64, 7, 8, 2, false));
        nodes.push(attention(576, 512, 1, 16, 1, true));
        nodes
            .iter()
            .map(|n| match plan(n) {
                Ok(Plan::Kernel { desc, .. }) => desc,
                other => panic!("{n:?}: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn every_backend_description_round_trips_through_an_entry() {
        let mut descs = backend_descs();
        assert!(descs.len() > 100);
        // GGML_HSA_F16_AS_BF16 kernels carry the flag through configs too.
        let mut as_bf16 = descs[0].clone();
        as_bf16.f16_as_bf16 = true;
        assert!(KernelEntry::from_desc(&as_bf16, Arch::Aie2)
            .exported_name
            .unwrap()
            .ends_with("-f16asbf16"));
        descs.push(as_bf16);
        for desc in descs {
            for arch in [Arch::Aie2, Arch::Aie2p] {
                let entry = KernelEntry::from_desc(&desc, arch);
                assert_eq!(entry.exported_name, Some(desc.canonical_name()));
                assert_eq!(entry.to_desc(), Ok((arch, desc.clone())), "{entry:?}");
                // And through the JSON text.
                let config = KernelConfig {
                    kernels: vec![entry],
                };
                let back = KernelConfig::parse(&config.to_json()).unwrap();
                assert_eq!(back.kernels[0].to_desc(), Ok((arch, desc.clone())));
            }
        }
    }
}
