//! The builders of the rewrites of `table.rs`: each recognises its pattern, with checks that
//! leave the nodes as they are whenever the graph differs from it (other ops, types or layouts,
//! an intermediate tensor the application or a later node reads), and lays out the kernel's
//! operands and parameters.

use super::fused::{Fused, Glu};
use super::kv_length::STEP_TOKENS;
use super::rules::{kernel_writing, read_elsewhere, read_later, same, step_io, written_in};
use super::{Planned, Rewritten};
use crate::kernels::{KernelDesc, Layout};
use crate::op_catalogue::{self as catalogue, OpEntry};
use crate::ops::plan::{as_layout, kernel_as_laid_out, mul_mat, rows_layout, Plan, PlanOptions};
use crate::ops::tensor::{BinaryOp, DType, Node, Op, Tensor};

/// ggml's RMS_NORM → MUL fusion (llama's `attn_norm`, `ffn_norm`): `norm` is an RMS_NORM and
/// `mul` the node after it, a MUL of the norm's output (input 0) by one f32 weight row repeated
/// over it; `later` are the graph's nodes after the MUL. One `RMS_NORM_MUL` kernel (x and the
/// weight row into the MUL's output) replaces both when nothing else reads the norm's output
/// and the application does not read it either (no graph output): ggml's own fusion rule.
/// `None` when the pair does not fuse. Every operand is contiguous f32, but the output may be
/// bf16 (a prompt's activations for its GEMMs: `ops::bf16_activations`).
pub fn fuse_rms_norm_mul(norm: &Node, mul: &Node, later: &[Node]) -> Option<Plan> {
    if norm.op != (Op::Norm { rms: true }) || mul.op != Op::Binary(BinaryOp::Mul) {
        return None;
    }
    let (x, y) = (norm.src(0)?, &norm.dst);
    let (a, w, out) = (mul.src(0)?, mul.src(1)?, &mul.dst);
    let f32_dense = |t: &Tensor| t.dtype == DType::F32 && t.is_contiguous();
    let same = |p: &Tensor, q: &Tensor| p.addr == q.addr && p.ne == q.ne && p.dtype == q.dtype;
    let out_ok = matches!(out.dtype, DType::F32 | DType::Bf16) && out.is_contiguous();
    let fuses = [x, y, w].into_iter().all(f32_dense)
        && out_ok
        && !norm.is_output
        && y.addr != 0
        && same(a, y)
        && x.same_shape(y)
        && out.same_shape(y)
        && w.ne == [y.ne[0], 1, 1, 1];
    if !fuses {
        return None;
    }
    // An in-place MUL (ggml's allocator puts its output in y's memory) ends y itself.
    if !out.overlaps(y) && read_later(y, later) {
        return None;
    }
    let op = catalogue::RMS_NORM_MUL;
    Some(Plan::Kernel {
        desc: KernelDesc {
            op: op.name.to_owned(),
            op_params: norm.op_params[..op.params].to_vec(),
            inputs: vec![rows_layout(x, true), as_layout(w)],
            output: rows_layout(out, true),
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        },
        operands: vec![x.clone(), w.clone(), out.clone()],
    })
}

/// The fold of the `RMS_NORM_MUL` kernel computing one input y of the ADD kernel planned at
/// node `at` (gemma's norms after the attention and the block, then the residual ADD) into one
/// `RMS_NORM_MUL_ADD` kernel at `at`: out = rms_norm(x) * w + r, r the ADD's other input, of
/// the output's shape (no broadcasting). Only when y is the norm's whole output, the
/// application does not read it, no node that runs reads it elsewhere (it is never written
/// now), no node between the two writes x or w, and the output overlaps no input but x or r
/// (an ADD in place; the row design computes a row before writing it). It covers the norm's
/// node. `None` otherwise.
pub fn fold_rms_norm_mul_add<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(add, [p, q, out]) = planned(at) else {
        return None;
    };
    if nodes[at].op != Op::Binary(BinaryOp::Add) || add.op != catalogue::ADD.name {
        return None;
    }
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    let f32_dense = |t: &Tensor| t.dtype == DType::F32 && t.is_contiguous();
    for (y, r) in [(p, q), (q, p)] {
        let Some((writer, k)) = kernel_writing(nodes, at, y, &planned) else {
            continue;
        };
        let Planned::Kernel(norm, [x, w, yn]) = planned(k) else {
            continue;
        };
        let fits = norm.op == catalogue::RMS_NORM_MUL.name
            && same(yn, y)
            && same(&nodes[writer].dst, y)
            && !nodes[writer].is_output
            && [r, out].into_iter().all(f32_dense)
            && r.same_shape(out)
            && y.same_shape(out)
            && !read_elsewhere(nodes, y, writer, at, runs)
            && !written_in(nodes, k + 1..at, &[x, w], runs)
            && !out.overlaps(w);
        if !fits {
            continue;
        }
        let op = catalogue::RMS_NORM_MUL_ADD;
        let desc = KernelDesc {
            op: op.name.to_owned(),
            op_params: norm.op_params.clone(),
            inputs: vec![
                norm.inputs[0].clone(),
                rows_layout(r, true),
                norm.inputs[1].clone(),
            ],
            output: rows_layout(out, true),
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        };
        let operands = [x, r, w, out].map(Tensor::clone).to_vec();
        return Some(Rewritten::kernel(at, vec![k], desc, operands));
    }
    None
}

/// A feed-forward block's gate and up projections and their GLU (llama's `ffn_gate`, `ffn_up`,
/// `swiglu`): `products` are two MUL_MATs, in either order, of one activation x by weights of
/// one type, shape and layout; `glu` the node after them, a split GLU (not swapped) of their
/// outputs; `later` the graph's nodes after it. One `MUL_MAT_<GLU>` kernel (the gate weights,
/// the up weights, x into the GLU's output) replaces the three when neither product is read by
/// the application or a later node, and the output does not overlap what the kernel reads.
/// The gate is the product the GLU activates (its first input).
pub fn fuse_mul_mat_glu(
    products: [&Node; 2],
    glu: &Node,
    later: &[Node],
    options: PlanOptions,
) -> Option<Plan> {
    let Op::Glu { name, .. } = glu.op else {
        return None;
    };
    if products.iter().any(|p| p.op != Op::MulMat || p.is_output) || glu.op_params[1] != 0 {
        return None;
    }
    let (a, b) = (glu.src(0)?, glu.src(1)?);
    let [p, q] = products;
    let (gate, up) = if same(&p.dst, a) && same(&q.dst, b) {
        (p, q)
    } else if same(&q.dst, a) && same(&p.dst, b) {
        (q, p)
    } else {
        return None;
    };
    let (wg, wu, x) = (gate.src(0)?, up.src(0)?, gate.src(1)?);
    let out = &glu.dst;
    let fuses = same(x, up.src(1)?)
        && wg.dtype == wu.dtype
        && wg.ne == wu.ne
        && wg.nb == wu.nb
        && mul_mat(wg, x, &gate.dst).is_ok()
        && out.dtype == DType::F32
        && out.same_shape(&gate.dst)
        && gate.dst.addr != up.dst.addr
        && ![wg, wu, x].into_iter().any(|t| t.overlaps(out));
    if !fuses
        || [&gate.dst, &up.dst]
            .into_iter()
            .any(|t| read_later(t, later))
    {
        return None;
    }
    let op = Fused::MulMatGlu(Glu::of(name)?).entry()?;
    Some(mul_mat_kernel(op, &[wg, wu, x], out, options))
}

/// A fused MUL_MAT kernel `op` over `inputs` (weights first) into `out`, every operand as laid
/// out in memory; f16 weights are computed as bf16 when the unfused MUL_MAT's would be
/// (`plan_with`).
fn mul_mat_kernel(
    op: &'static OpEntry,
    inputs: &[&Tensor],
    out: &Tensor,
    options: PlanOptions,
) -> Plan {
    let mut plan = kernel_as_laid_out(op, Vec::new(), inputs, out);
    if let Plan::Kernel { desc, .. } = &mut plan {
        desc.f16_as_bf16 = options.f16_as_bf16 && inputs[0].dtype == DType::F16;
    }
    plan
}

/// A MUL_MAT and the split GLU right after it of its product's two halves (phi3's `ffn_up`,
/// whose weights are the gate's rows and then the up projection's, and its `swiglu`): one
/// `MUL_MAT_<GLU>` kernel whose gate and up weights are the two halves of the rows, when the
/// application and no later node read the product and the output overlaps no input. ggml's
/// GLU of one tensor activates the first half (not swapped).
pub fn fuse_mul_mat_glu_halves(
    mm: &Node,
    glu: &Node,
    later: &[Node],
    options: PlanOptions,
) -> Option<Plan> {
    let Op::Glu { name, .. } = glu.op else {
        return None;
    };
    if mm.op != Op::MulMat || mm.is_output || glu.op_params[1] != 0 || glu.src(1).is_some() {
        return None;
    }
    let (w, x, product, out) = (mm.src(0)?, mm.src(1)?, &mm.dst, &glu.dst);
    let f = product.ne[0] / 2;
    if !same(glu.src(0)?, product) || product.ne[0] != 2 * f || w.ne[1] != product.ne[0] {
        return None;
    }
    let (wg, wu) = (weight_rows(w, 0, f)?, weight_rows(w, f, f)?);
    let fuses = mul_mat(&wg, x, out).is_ok()
        && out.dtype == DType::F32
        && out.ne == [f, product.ne[1], product.ne[2], product.ne[3]]
        && ![w, x].into_iter().any(|t| t.overlaps(out));
    if !fuses || read_later(product, later) {
        return None;
    }
    let op = Fused::MulMatGlu(Glu::of(name)?).entry()?;
    Some(mul_mat_kernel(op, &[&wg, &wu, x], out, options))
}

/// Rows `first .. first + rows` of the weights `w` (one matrix) as a tensor of their own, when
/// they start on a 32-bit word (the NPU's DMA addresses words).
fn weight_rows(w: &Tensor, first: i64, rows: i64) -> Option<Tensor> {
    let row = w.nb[1];
    let offset = first as u64 * row;
    if w.ne[2..] != [1, 1] || first + rows > w.ne[1] || rows < 1 || !offset.is_multiple_of(4) {
        return None;
    }
    Some(Tensor {
        addr: w.addr + offset,
        ne: [w.ne[0], rows, 1, 1],
        nb: [w.nb[0], row, row * rows as u64, row * rows as u64],
        bytes: row * rows as u64,
        ..w.clone()
    })
}

/// A MUL_MAT and the ADD after it of its product and another f32 tensor r (llama's residual
/// connections after `attn_output` and `ffn_down`, a projection's bias); `later` are the
/// graph's nodes after the ADD. One `MUL_MAT_ADD` kernel (the weights, x and r into the ADD's
/// output) replaces both when the application does not read the product and no later node
/// reads it before its memory is reused (an ADD in place, into the product's memory, ends it
/// itself). r is the ADD's second input repeated over the product (ggml broadcasting), or its
/// first input of the product's shape. The output may be r itself (an ADD in place into r) but
/// must not overlap the weights, x or part of r.
pub fn fuse_mul_mat_add(
    mm: &Node,
    add: &Node,
    later: &[Node],
    options: PlanOptions,
) -> Option<Plan> {
    if mm.op != Op::MulMat || mm.is_output || add.op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let (w, x, product, out) = (mm.src(0)?, mm.src(1)?, &mm.dst, &add.dst);
    let (a, b) = (add.src(0)?, add.src(1)?);
    let r = if same(a, product) && b.can_repeat_to(product) {
        b
    } else if same(b, product) && a.same_shape(product) {
        a
    } else {
        return None;
    };
    let fuses = mul_mat(w, x, product).is_ok()
        && r.dtype == DType::F32
        && out.dtype == DType::F32
        && out.same_shape(product)
        && out.is_contiguous()
        && ![w, x].into_iter().any(|t| t.overlaps(out))
        && (!r.overlaps(out) || same(r, out));
    if !fuses || (!out.overlaps(product) && read_later(product, later)) {
        return None;
    }
    Some(mul_mat_kernel(
        catalogue::MUL_MAT_ADD,
        &[w, x, r],
        out,
        options,
    ))
}

/// The fold of the `RMS_NORM_MUL` kernel planned at node `at` (`planned(k)`: node k's plan)
/// into the projections that read its output z (llama's attn_norm into Q, K and V, its
/// ffn_norm into the gate/up pair): each reader, a `MUL_MAT` or `MUL_MAT_<GLU>` kernel taking
/// z as its activations, becomes `RMS_NORM_MUL_MAT[_<GLU>]` over the norm's input x and weight
/// n, and the norm runs nowhere. Only when every node reading z before its memory is reused is
/// such a kernel (a view of z computes nothing, but a node reading it must be one), the
/// application does not read z, x has z's layout, and no node until the last reader writes x
/// or n. The readers' kernels cover the norm's two nodes. Empty otherwise.
pub fn fold_rms_norm<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Vec<Rewritten>> {
    let Planned::Kernel(desc, [x, n, z]) = planned(at) else {
        return None;
    };
    let covered = |k: usize| matches!(planned(k), Planned::Covered);
    if desc.op != catalogue::RMS_NORM_MUL.name
        || !covered(at + 1)
        || nodes.get(at + 1)?.is_output
        || x.ne != z.ne
        || x.nb != z.nb
        || x.dtype != z.dtype
        || x.overlaps(z)
    {
        return None;
    }
    let eps = *desc.op_params.first()?;
    let mut readers = Vec::new();
    // Nodes before `reader_end` belong to an accepted reader's kernel.
    let mut reader_end = 0;
    for (k, node) in nodes.iter().enumerate().skip(at + 2) {
        if node.reads(z) && k >= reader_end && !matches!(planned(k), Planned::Nothing) {
            let Planned::Kernel(desc, operands) = planned(k) else {
                return None;
            };
            let (desc, operands) = normed(desc, operands, x, n, z, eps)?;
            readers.push(Rewritten::kernel(k, vec![at, at + 1], desc, operands));
            reader_end = k + 1 + (k + 1..nodes.len()).take_while(|&j| covered(j)).count();
        }
        if k >= reader_end && node.dst.overlaps(z) {
            break;
        }
    }
    let last = reader_end.checked_sub(1)?;
    let written = |t: &Tensor| (at + 2..=last).any(|k| nodes[k].dst.overlaps(t));
    if readers.is_empty() || written(x) || written(n) {
        return None;
    }
    Some(readers)
}

/// The fold of the two `RMS_NORM_MUL_MAT` kernels computing the inputs of the GLU kernel
/// planned at node `at` into it: one `RMS_NORM_MUL_MAT_<GLU>` kernel at `at`. Only when the
/// two share x, n and eps, their weights have one type, shape and layout, nothing but the GLU
/// reads the products before their memory is reused and the application does not read them,
/// no node between writes what the projections read, and the GLU's output overlaps none of
/// it. Or the one `RMS_NORM_MUL_MAT` kernel of one token writing both halves of the GLU's one
/// input, with the halves of its weight rows. It covers the projections' nodes. `None`
/// otherwise.
pub fn fold_glu<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(glu, [a, b, out]) = planned(at) else {
        return None;
    };
    let op = Fused::RmsNormMulMatGlu(Glu::of(&glu.op)?).entry()?;
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing);
    let projection = |t: &Tensor| {
        let k = (0..at)
            .rev()
            .find(|&k| runs(k) && nodes[k].dst.overlaps(t))?;
        match planned(k) {
            Planned::Kernel(desc, [w, x, n, p])
                if desc.op == catalogue::RMS_NORM_MUL_MAT.name
                    && same(p, t)
                    && !nodes[k].is_output
                    && same(&nodes[k].dst, t) =>
            {
                Some((k, desc, [w, x, n]))
            }
            _ => None,
        }
    };
    // One projection of one token writing both halves of the GLU's one input (phi3's ffn_up:
    // the gate's rows, then the up projection's), as ggml's GLU of one tensor splits it.
    let halves = || {
        let k = (0..at)
            .rev()
            .find(|&k| runs(k) && nodes[k].dst.overlaps(a))?;
        let Planned::Kernel(desc, [w, x, n, p]) = planned(k) else {
            return None;
        };
        let f = a.nelements();
        let dense = |t: &Tensor| t.dtype == DType::F32 && t.is_contiguous();
        let exact = [a, b, p].into_iter().all(dense)
            && p.ne == [2 * f, 1, 1, 1]
            && a.addr == p.addr
            && b.addr == p.addr + 4 * f as u64
            && a.bytes == 4 * f as u64
            && b.bytes == a.bytes;
        let projection = Fused::of(&desc.op) == Some(Fused::RmsNormMulMat);
        if !exact || !projection || nodes[k].is_output || !same(&nodes[k].dst, p) {
            return None;
        }
        Some((k, desc, weight_rows(w, 0, f)?, weight_rows(w, f, f)?, x, n))
    };
    let (covers, gate, wg, wu, x, n) = match (projection(a), projection(b)) {
        (Some((g, gate, [wg, x, n])), Some((u, up, [wu, xu, nu]))) => {
            let pair = g != u
                && same(x, xu)
                && same(n, nu)
                && gate.op_params == up.op_params
                && wg.dtype == wu.dtype
                && wg.ne == wu.ne
                && wg.nb == wu.nb;
            if !pair {
                return None;
            }
            (vec![g.min(u), g.max(u)], gate, wg.clone(), wu.clone(), x, n)
        }
        _ => {
            let (k, desc, wg, wu, x, n) = halves()?;
            (vec![k], desc, wg, wu, x, n)
        }
    };
    let fits = out.dtype == DType::F32 && out.same_shape(a);
    if !fits || [&wg, &wu, x, n].iter().any(|t| out.overlaps(t)) {
        return None;
    }
    // Nothing but the GLU reads the products before their memory is reused.
    let first = covers[0];
    if [a, b]
        .iter()
        .any(|p| read_elsewhere(nodes, p, first, at, runs))
        || written_in(nodes, first + 1..at, &[&wg, &wu, x, n], runs)
    {
        return None;
    }
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params: gate.op_params.clone(),
        inputs: vec![
            as_layout(&wg),
            as_layout(&wu),
            gate.inputs[1].clone(),
            gate.inputs[2].clone(),
        ],
        output: as_layout(out),
        extra_outputs: Vec::new(),
        f16_as_bf16: gate.f16_as_bf16,
        n_kv_step: None,
    };
    let operands = vec![wg, wu, x.clone(), n.clone(), out.clone()];
    Some(Rewritten::kernel(at, covers, desc, operands))
}

/// The split of the projection planned at node `at` (a `MUL_MAT` or `RMS_NORM_MUL_MAT` kernel
/// of one token) whose product P only views of whole row ranges read (phi3's Q, K and V of one
/// attn_qkv matrix): each view's node runs the projection by the weight rows that make its
/// rows, into the view's memory, and the projection's node runs nothing. The kernels that read
/// a view (a ROPE, a cache write) then find their input computed at its node, as llama's
/// separate projections are. Only when no node reads P but inside a view after its node (and
/// none that another kernel computes reads it at all), the application reads neither P nor a
/// view, and no node before the last view writes what the projection reads. Each kernel covers
/// the projection's node. Empty otherwise.
pub fn split_projection<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Vec<Rewritten> {
    split(nodes, at, planned).unwrap_or_default()
}

fn split<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Vec<Rewritten>> {
    let Planned::Kernel(desc, operands) = planned(at) else {
        return None;
    };
    let projection =
        desc.op == catalogue::MUL_MAT.name || Fused::of(&desc.op) == Some(Fused::RmsNormMulMat);
    let (p, inputs) = operands.split_last()?;
    let w = inputs.first()?;
    let one_token = p.dtype == DType::F32 && p.is_contiguous() && p.ne[1..] == [1, 1, 1];
    if !projection || !one_token || nodes[at].is_output || !same(&nodes[at].dst, p) {
        return None;
    }
    let within = |t: &Tensor, v: &Tensor| v.addr <= t.addr && t.addr + t.bytes <= v.addr + v.bytes;
    let computes = |j: usize| !matches!(planned(j), Planned::Nothing);
    // The views of P until its memory is written again.
    let mut views: Vec<usize> = Vec::new();
    let mut end = nodes.len();
    for (j, node) in nodes.iter().enumerate().skip(at + 1) {
        if computes(j) {
            if node.dst.overlaps(p) {
                end = j;
                break;
            }
            continue;
        }
        let v = &node.dst;
        if node.op == Op::Layout && node.src(0).is_some_and(|s| same(s, p)) {
            let dense = v.dtype == DType::F32 && v.is_contiguous() && within(v, p);
            let apart = views.iter().all(|&u| !nodes[u].dst.overlaps(v));
            if !dense || !apart || node.is_output {
                return None;
            }
            views.push(j);
        }
    }
    let last = *views.last()?;
    if views.len() < 2 {
        return None;
    }
    // Every read of P's memory is inside a view, after the view's node, by a node that runs
    // there.
    for (j, node) in nodes.iter().enumerate().take(end).skip(at + 1) {
        if !computes(j) || !node.reads(p) {
            continue;
        }
        for t in node.src.iter().flatten().filter(|t| t.overlaps(p)) {
            let inside = views.iter().any(|&v| v < j && within(t, &nodes[v].dst));
            if !inside || matches!(planned(j), Planned::Covered) {
                return None;
            }
        }
    }
    let read: Vec<&Tensor> = inputs.iter().collect();
    if written_in(nodes, at + 1..last, &read, computes) {
        return None;
    }
    views
        .into_iter()
        .map(|j| {
            let v = &nodes[j].dst;
            let rows = v.nelements();
            let slice = weight_rows(w, ((v.addr - p.addr) / 4) as i64, rows)?;
            let out = Tensor {
                addr: v.addr,
                ne: [rows, 1, 1, 1],
                nb: [4, 4 * rows as u64, 4 * rows as u64, 4 * rows as u64],
                bytes: 4 * rows as u64,
                ..p.clone()
            };
            let mut desc = desc.clone();
            desc.inputs[0] = as_layout(&slice);
            desc.output = as_layout(&out);
            let mut operands = vec![slice];
            operands.extend(inputs[1..].iter().cloned());
            operands.push(out);
            Some(Rewritten::kernel(j, vec![at], desc, operands))
        })
        .collect()
}

/// The fold of the SCALE kernel computing q, the first input of the attention kernel planned
/// at node `at` (phi3 scales Q before the attention and passes it a scale of 1), into the
/// attention's own scale: its q is the SCALE's input and its scale the product of both
/// (ggml scales the scores q . k, and a bias-free SCALE of q scales each of them alike). q may
/// be a view of the scaled tensor's bytes (llama's permuted q of several tokens): the attention
/// then reads the SCALE's input through the same view. Only when nothing but the attention
/// reads the scaled q, the application does not, no node in between writes the SCALE's input,
/// and the attention's output is apart from that input or exactly its memory, head by head
/// (gemma's attention output in the memory of Q, dead once scaled: each query row is read
/// before the row of its output is written). It covers the SCALE's node. `None` otherwise.
pub fn fold_scale_into_attention<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(fa, operands) = planned(at) else {
        return None;
    };
    let attention = OpEntry::by_name(&fa.op)
        .is_some_and(|e| e.ggml == "FLASH_ATTN_EXT" && Fused::of(e.name).is_none());
    let (q, out) = (operands.first()?, operands.last()?);
    if !attention {
        return None;
    }
    let (writer, k) = kernel_writing(nodes, at, q, &planned)?;
    let Planned::Kernel(scale, [x, scaled]) = planned(k) else {
        return None;
    };
    let f32_dense = |t: &Tensor| t.dtype == DType::F32 && t.is_contiguous();
    let exact = scaled.addr == q.addr
        && scaled.bytes == q.bytes
        && q.dtype == DType::F32
        && x.ne == scaled.ne
        && x.nb == scaled.nb
        && [x, scaled].into_iter().all(f32_dense);
    let no_bias = scale
        .op_params
        .get(1)
        .is_none_or(|&b| f32::from_bits(b as u32) == 0.0);
    if scale.op != catalogue::SCALE.name || writer != k || nodes[k].is_output || !exact || !no_bias
    {
        return None;
    }
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    // The output over x: [Dv, H, T] dense over x's [D, H, T], each row where its query's is.
    let over_x = out.addr == x.addr && out.ne == x.ne && out.nb == x.nb && f32_dense(out);
    if read_elsewhere(nodes, scaled, k, at, runs)
        || written_in(nodes, k + 1..at, &[x], runs)
        || (out.overlaps(x) && !over_x)
    {
        return None;
    }
    let s = f32::from_bits(*scale.op_params.first()? as u32);
    let mut desc = fa.clone();
    let kq_scale = f32::from_bits(*desc.op_params.first()? as u32);
    desc.op_params[0] = (kq_scale * s).to_bits() as i32;
    let mut operands = operands.to_vec();
    operands[0] = Tensor {
        addr: x.addr,
        memory: x.memory,
        ..q.clone()
    };
    Some(Rewritten::kernel(at, vec![k], desc, operands))
}

/// The fold of the `RMS_NORM_MUL_MAT` kernel that computes the input of the ROPE kernel planned
/// at node `at` into it (`planned(k)`: node k's plan): one `RMS_NORM_MUL_MAT_ROPE[_FF]` kernel
/// at the ROPE's node computes the product and rotates it, and the projection's node runs
/// nothing. Only when the ROPE's input is exactly the product's memory (a reshape of it, f32,
/// dense, one matrix), nothing else reads the product before its memory is reused and the
/// application does not read it, and no node between the two writes the projection's inputs
/// (they are read later than planned). It covers the projection's node.
///
/// Between the two there may be an `RMS_NORM_MUL` kernel normalising each head of the product
/// (qwen3's Q and K norms: the norm over rows of the head's D values, then the MUL by one head's
/// weights): its work joins the kernel (`RMS_NORM_MUL_MAT_HEAD_NORM_ROPE[_FF]`), under the same
/// rules for its result. `None` otherwise.
pub fn fold_rope<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(rope, rope_operands) = planned(at) else {
        return None;
    };
    let ff = match rope.op.as_str() {
        "ROPE" => false,
        "ROPE_FF" => true,
        _ => return None,
    };
    let (out, rope_inputs) = rope_operands.split_last()?;
    let x = rope_inputs.first()?;
    let f32_dense = |t: &Tensor| t.dtype == DType::F32 && t.is_contiguous();
    if !f32_dense(x) || !f32_dense(out) || x.ne != out.ne || out.ne[3] != 1 {
        return None;
    }
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing);
    // The kernel that computed the ROPE's input: the projection, or the heads' norm of its
    // product.
    let (writer, k) = kernel_writing(nodes, at, x, &planned)?;
    let head_norm = head_norm_of(nodes, at, (writer, k), x, &planned);
    // The projection's kernel, and the node of its result (its ADD's with a bias: a node the
    // kernel covers).
    let (k, writer, product) = match &head_norm {
        Some(h) => {
            let (writer, j) = kernel_writing(nodes, k, h.x, &planned)?;
            (j, writer, h.x)
        }
        None => (k, writer, x),
    };
    let Planned::Kernel(projection, operands) = planned(k) else {
        return None;
    };
    // RMS_NORM_MUL_MAT's operands, or RMS_NORM_MUL_MAT_BIAS's (then the bias).
    let (w, xin, n, z, bias, kind) = match operands {
        [w, xin, n, z] => (w, xin, n, z, None, Fused::RmsNormMulMat),
        [w, xin, n, b, z] => (w, xin, n, z, Some(b), Fused::RmsNormMulMatBias),
        _ => return None,
    };
    let exact =
        z.addr == product.addr && z.bytes == product.bytes && f32_dense(z) && z.ne[2..] == [1, 1];
    if Fused::of(&projection.op) != Some(kind)
        || nodes[k].is_output
        || nodes[writer].is_output
        || !exact
        || projection.output.dtype != "f32"
        || z.ne[0] != x.ne[0] * x.ne[1]
        || z.ne[1] != x.ne[2]
    {
        return None;
    }
    // Nothing but the ROPE (or the heads' norm; and views, which compute nothing) reads the
    // product.
    let reader = head_norm.as_ref().map_or(at, |h| h.at);
    let mut inputs = vec![w, xin, n];
    inputs.extend(head_norm.as_ref().map(|h| h.w));
    inputs.extend(bias);
    // The nodes the projection's kernel covers (its ADD's, with a bias) read the product
    // inside it.
    let outside = |j: usize| runs(j) && !(k < j && j <= writer);
    if read_elsewhere(nodes, z, k, reader, outside)
        || written_in(nodes, k + 1..at, &inputs, runs)
        || inputs.iter().any(|t| out.overlaps(t))
    {
        return None;
    }
    let op = Fused::RmsNormMulMatRope {
        ff,
        head_norm: head_norm.is_some(),
        bias: bias.is_some(),
    }
    .entry()?;
    let eps = *projection.op_params.first()?;
    let mut op_params = rope.op_params.clone();
    op_params.resize(catalogue::ROPE.params, 0);
    op_params.push(eps);
    op_params.extend(head_norm.as_ref().map(|h| h.eps));
    let mut desc = rope.clone();
    desc.op = op.name.to_owned();
    desc.op_params = op_params;
    // W, x, n, the positions, (the factors,) (the heads' norm weights,) (the bias).
    desc.inputs = projection.inputs[..3].to_vec();
    desc.inputs.extend_from_slice(&rope.inputs[1..]);
    desc.inputs
        .extend(head_norm.as_ref().map(|h| as_layout(h.w)));
    desc.inputs.extend(bias.map(as_layout));
    desc.f16_as_bf16 = projection.f16_as_bf16 || rope.f16_as_bf16;
    let mut kernel_operands = vec![w.clone(), xin.clone(), n.clone()];
    kernel_operands.extend(rope_inputs[1..].iter().cloned());
    kernel_operands.extend(head_norm.as_ref().map(|h| h.w.clone()));
    kernel_operands.extend(bias.cloned());
    kernel_operands.push(out.clone());
    let mut covers = vec![k];
    covers.extend(head_norm.map(|h| h.at));
    Some(Rewritten::kernel(at, covers, desc, kernel_operands))
}

/// An `RMS_NORM_MUL` kernel normalising each head of a projection's product ahead of a ROPE.
struct HeadNorm<'a> {
    /// Its node.
    at: usize,
    /// Its input: the product, as heads [D, H, N].
    x: &'a Tensor,
    /// The weights of one head, f32 [D].
    w: &'a Tensor,
    /// The norm's eps (f32 bits).
    eps: i32,
}

/// The `RMS_NORM_MUL` kernel (`writer`: the node of its MUL, `k`: its kernel's node) that wrote
/// the ROPE's input `x` at node `rope`, when it normalises heads of f32 rows of x's shape by one
/// head's weights, its result is exactly x, and nothing but the ROPE reads that result.
fn head_norm_of<'a>(
    nodes: &[Node],
    rope: usize,
    (writer, k): (usize, usize),
    x: &Tensor,
    planned: &impl Fn(usize) -> Planned<'a>,
) -> Option<HeadNorm<'a>> {
    let Planned::Kernel(desc, [hx, hw, hout]) = planned(k) else {
        return None;
    };
    let f32_dense = |t: &Tensor| t.dtype == DType::F32 && t.is_contiguous();
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing);
    let ok = desc.op == catalogue::RMS_NORM_MUL.name
        && writer == k + 1
        && same(hout, x)
        && f32_dense(hx)
        && hx.ne == x.ne
        && f32_dense(hw)
        && hw.ne == [x.ne[0], 1, 1, 1]
        && !nodes[writer].is_output
        && !read_elsewhere(nodes, x, writer, rope, runs);
    ok.then(|| HeadNorm {
        at: k,
        x: hx,
        w: hw,
        eps: desc.op_params.first().copied().unwrap_or(0),
    })
}

/// The fold of the `RMS_NORM_MUL_MAT_<GLU>` kernel computing h, the activations of the
/// `MUL_MAT_ADD` kernel planned at node `at` (`planned(k)`: node k's plan), into one
/// `RMS_NORM_FFN_<GLU>` kernel at `at`: out = Wd . act(Wg . y) * (Wu . y) + r with
/// y = rms_norm(x) * n, h its second output. Only when h is exactly the product's activations,
/// nothing else reads h before its memory is reused, the application does not read it, no
/// node between the two writes what the first kernel reads (it is read later than planned),
/// and the output overlaps none of the inputs but r (an ADD in place). It covers the pair's node.
/// `None` otherwise.
pub fn fold_ffn<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(down, [wd, h, r, out]) = planned(at) else {
        return None;
    };
    if down.op != catalogue::MUL_MAT_ADD.name {
        return None;
    }
    let (writer, k) = kernel_writing(nodes, at, h, &planned)?;
    let Planned::Kernel(glu, [wg, wu, x, n, hz]) = planned(k) else {
        return None;
    };
    let Some(Fused::RmsNormMulMatGlu(act)) = Fused::of(&glu.op) else {
        return None;
    };
    let op = Fused::RmsNormFfn(act).entry()?;
    if !same(hz, h) || nodes[writer].is_output || !same(&nodes[writer].dst, h) {
        return None;
    }
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    if read_elsewhere(nodes, h, writer, at, runs) {
        return None;
    }
    let written = written_in(nodes, k + 1..at, &[wg, wu, x, n], runs);
    let clobbers = [wg, wu, wd, n, h].iter().any(|t| out.overlaps(t))
        || (out.overlaps(x) && !same(out, x))
        || (out.overlaps(r) && !same(out, r));
    if written || clobbers {
        return None;
    }
    let mut inputs = glu.inputs[..2].to_vec();
    inputs.push(down.inputs[0].clone());
    inputs.extend_from_slice(&glu.inputs[2..4]);
    inputs.push(down.inputs[2].clone());
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params: glu.op_params.clone(),
        inputs,
        output: down.output.clone(),
        extra_outputs: vec![glu.output.clone()],
        f16_as_bf16: glu.f16_as_bf16 || down.f16_as_bf16,
        n_kv_step: None,
    };
    let operands = [wg, wu, wd, x, n, r, out, h].map(Tensor::clone).to_vec();
    Some(Rewritten::kernel(at, vec![k], desc, operands))
}

/// The fold of the `MUL_MAT_ADD` kernel computing r1 = Wo . a + r0 (llama's attention output
/// projection and its residual) into the `RMS_NORM_FFN_<GLU>` kernel planned at node `at`
/// whose x and residual are both r1, as one `MUL_MAT_ADD_RMS_NORM_FFN_<GLU>` kernel at `at`
/// writing r1 and h besides its output. Only when no node that runs between the two reads r1
/// (the fused kernel writes it later than planned) or writes what the projection reads.
/// It covers the projection's node. `None` otherwise. (Whether four weights of different types
/// fit one kernel is the compiler's to say: the IRON design's phases share one weight stream
/// and refuse them.)
pub fn fold_attn_ffn<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(ffn, [wg, wu, wd, x, n, r, out, h]) = planned(at) else {
        return None;
    };
    let Some(Fused::RmsNormFfn(act)) = Fused::of(&ffn.op) else {
        return None;
    };
    let op = Fused::MulMatAddRmsNormFfn(act).entry()?;
    if !same(x, r) {
        return None;
    }
    let (writer, k) = kernel_writing(nodes, at, x, &planned)?;
    let Planned::Kernel(proj, [wo, a, r0, r1]) = planned(k) else {
        return None;
    };
    if proj.op != catalogue::MUL_MAT_ADD.name || !same(r1, x) || !same(&nodes[writer].dst, x) {
        return None;
    }
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    let read_between = (writer + 1..at)
        .filter(|&j| runs(j))
        .any(|j| nodes[j].reads(x));
    let written = written_in(nodes, k + 1..at, &[wo, a, r0], runs);
    // h and the output may take the memory of a or r0 (dead once r1 is computed): the kernel's
    // phases run in order, r1 whole before the block reads it, as the nodes did.
    if read_between || written {
        return None;
    }
    let mut inputs = proj.inputs[..3].to_vec();
    inputs.extend_from_slice(&ffn.inputs[..3]);
    inputs.push(ffn.inputs[4].clone());
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params: ffn.op_params.clone(),
        inputs,
        output: ffn.output.clone(),
        extra_outputs: vec![proj.output.clone(), ffn.extra_outputs[0].clone()],
        f16_as_bf16: proj.f16_as_bf16 || ffn.f16_as_bf16,
        n_kv_step: None,
    };
    let operands = [wo, a, r0, wg, wu, wd, n, out, r1, h]
        .map(Tensor::clone)
        .to_vec();
    Some(Rewritten::kernel(at, vec![k], desc, operands))
}

/// The `FLASH_ATTN_EXT_MASK` kernel computing a (an attention's output viewed as [Ka, N]: the
/// same dense f32 memory, whole), which the kernel planned at node `reader` reads, for a fold
/// whose kernel runs at node `at`: its node, desc and operands (q, k, v, mask, output). Only
/// when the application does not read its output, no node that runs reads it but `reader`
/// (the fold writes it later than planned) and none before `at` writes what it reads. a is read
/// where the reader's kernel starts: the nodes that kernel covers after that may reuse a's
/// memory (the norm's output, say), so the kernel writing a is the last before that start.
fn attention_read_by<'a>(
    nodes: &[Node],
    reader: usize,
    at: usize,
    a: &Tensor,
    planned: &impl Fn(usize) -> Planned<'a>,
) -> Option<(usize, &'a KernelDesc, &'a [Tensor; 5])> {
    let start = (0..reader)
        .rev()
        .take_while(|&j| matches!(planned(j), Planned::Covered | Planned::Nothing))
        .last()
        .unwrap_or(reader);
    let (writer, k) = kernel_writing(nodes, start, a, planned)?;
    let Planned::Kernel(fa, operands) = planned(k) else {
        return None;
    };
    let ops: &[Tensor; 5] = operands.try_into().ok()?;
    let [q, kc, vc, mask, fa_out] = ops;
    let whole_view = a.addr == fa_out.addr
        && a.bytes == fa_out.bytes
        && a.is_contiguous()
        && fa_out.is_contiguous();
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    let fits = fa.op == catalogue::FLASH_ATTN_EXT_MASK.name
        && writer == k
        && same(&nodes[writer].dst, fa_out)
        && !nodes[writer].is_output
        && whole_view
        && !read_elsewhere(nodes, fa_out, writer, reader, runs)
        && !written_in(nodes, k + 1..at, &[q, kc, vc, mask], runs);
    fits.then_some((k, fa, ops))
}

/// The fold of the `FLASH_ATTN_EXT_MASK` kernel computing a (llama's attention, its output
/// reshaped to [Ka, N] for the output projection) into the `MUL_MAT_ADD_RMS_NORM_FFN_<GLU>`
/// kernel planned at node `at` reading a, as one `FLASH_ATTN_FFN_<GLU>` kernel at `at` writing
/// a, r1 and h besides its output. Only when a is the attention's whole dense output, the
/// application does not read it, no node that runs between the two reads it (the fused kernel
/// writes it later than planned) and none writes what the attention reads. It covers the
/// attention's node. `None` otherwise. (Which shapes one kernel covers is the compiler's to say: the IRON design takes one token of
/// one sequence and a context its cores' memory holds, and refuses the rest.)
pub fn fold_flash_attn_ffn<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(ffn, [wo, a, r0, wg, wu, wd, n, out, r1, h]) = planned(at) else {
        return None;
    };
    let Some(Fused::MulMatAddRmsNormFfn(act)) = Fused::of(&ffn.op) else {
        return None;
    };
    let op = Fused::FlashAttnFfn(act).entry()?;
    let (k, fa, [q, kc, vc, mask, fa_out]) = attention_read_by(nodes, at, at, a, &planned)?;
    let mut inputs = fa.inputs[..4].to_vec();
    inputs.push(ffn.inputs[0].clone());
    inputs.extend_from_slice(&ffn.inputs[2..]);
    let mut op_params = fa.op_params.clone();
    op_params.resize(3, 0);
    op_params.push(ffn.op_params.first().copied().unwrap_or(0));
    let mut extra_outputs = vec![fa.output.clone()];
    extra_outputs.extend_from_slice(&ffn.extra_outputs);
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params,
        inputs,
        output: ffn.output.clone(),
        extra_outputs,
        f16_as_bf16: fa.f16_as_bf16 || ffn.f16_as_bf16,
        n_kv_step: fa.n_kv_step,
    };
    let operands = [q, kc, vc, mask, wo, r0, wg, wu, wd, n, out, fa_out, r1, h]
        .map(Tensor::clone)
        .to_vec();
    Some(Rewritten::kernel(at, vec![k], desc, operands))
}

/// The fold of the `MUL_MAT_ADD` kernel computing x = r1 = Wo . a + r0 of the
/// `RMS_NORM_MUL_MAT_<GLU>` kernel planned at node `at`, and of the `FLASH_ATTN_EXT_MASK`
/// kernel computing a, into one `FLASH_ATTN_GLU_<GLU>` kernel at `at` writing a and r1 besides
/// h: what `FLASH_ATTN_FFN_<GLU>` takes over but the block's down projection, which stays a
/// kernel of its own (asked for where the compiler refused the whole block: a Wd of another
/// weight type, as llama.cpp's Q4_K_M has). Only when `fold_attn_ffn`'s rules hold for the
/// projection (no node that runs before `at` reads r1 or writes what the projection reads)
/// and `fold_flash_attn_ffn`'s for the attention (a its whole dense output, read by the
/// projection only, the application not reading it, nothing in between writing what it
/// reads). It covers both kernels' nodes. `None` otherwise.
pub fn fold_flash_attn_glu<'a>(
    nodes: &[Node],
    at: usize,
    planned: impl Fn(usize) -> Planned<'a>,
) -> Option<Rewritten> {
    let Planned::Kernel(glu, [wg, wu, x, n, h]) = planned(at) else {
        return None;
    };
    let Some(Fused::RmsNormMulMatGlu(act)) = Fused::of(&glu.op) else {
        return None;
    };
    let op = Fused::FlashAttnGlu(act).entry()?;
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    // The projection: r1 is x, written at `at` now.
    let (writer, k) = kernel_writing(nodes, at, x, &planned)?;
    let Planned::Kernel(proj, [wo, a, r0, r1]) = planned(k) else {
        return None;
    };
    if proj.op != catalogue::MUL_MAT_ADD.name || !same(r1, x) || !same(&nodes[writer].dst, x) {
        return None;
    }
    let read_between = (writer + 1..at)
        .filter(|&j| runs(j))
        .any(|j| nodes[j].reads(x));
    if read_between || written_in(nodes, k + 1..at, &[wo, a, r0], runs) {
        return None;
    }
    let (f, fa, [q, kc, vc, mask, fa_out]) = attention_read_by(nodes, k, at, a, &planned)?;
    let mut inputs = fa.inputs[..4].to_vec();
    inputs.push(proj.inputs[0].clone());
    inputs.push(proj.inputs[2].clone());
    inputs.extend_from_slice(&glu.inputs[..2]);
    inputs.push(glu.inputs[3].clone());
    let mut op_params = fa.op_params.clone();
    op_params.resize(3, 0);
    op_params.push(glu.op_params.first().copied().unwrap_or(0));
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params,
        inputs,
        output: glu.output.clone(),
        extra_outputs: vec![fa.output.clone(), proj.output.clone()],
        f16_as_bf16: fa.f16_as_bf16 || proj.f16_as_bf16 || glu.f16_as_bf16,
        n_kv_step: fa.n_kv_step,
    };
    let operands = [q, kc, vc, mask, wo, r0, wg, wu, n, h, fa_out, r1]
        .map(Tensor::clone)
        .to_vec();
    Some(Rewritten::kernel(at, vec![f, k], desc, operands))
}

/// llama's Q, K and V kernels merged into one `RMS_NORM_QKV_ROPE[_FF]` kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct QkvMerge {
    /// The nodes of Q's, K's and V's kernels.
    pub members: [usize; 3],
    /// Where the merged kernel runs: the last of the members.
    pub at: usize,
    /// The merged kernel: Q's output as planned, K's and V's as their kernels write them (the
    /// cache's rows, or their f32 outputs that SET_ROWS copies).
    pub desc: KernelDesc,
    /// Its operands up to Q's output (Wq, Wk, Wv, x, n, the positions, [the frequency
    /// factors], Q's output); K's and V's outputs follow.
    pub operands: Vec<Tensor>,
}

/// The merge of V's kernel at node `v` with Q's and K's (`planned(k)`: node k's plan;
/// `cache_kernel(k)`: for a kernel whose result goes into a KV cache, by writing its SET_ROWS's
/// destination rows itself when the indices are consecutive or by that SET_ROWS's copy after
/// it, its kernel and that SET_ROWS's node). V is an `RMS_NORM_MUL_MAT` kernel and K an
/// `RMS_NORM_MUL_MAT_ROPE[_FF]` kernel going into the cache, Q one that does not, all three of
/// one x, norm weight and eps, Q and
/// K with one rotation (parameters, positions, frequency factors); each weight of its own type
/// (llama.cpp's Q4_K_M has q6_K V weights in some layers, q4_K in the others). The
/// merged kernel runs at the last of them, so only when no node between a member and it reads
/// what the member writes (its output, the cache) or writes what the merged kernel reads, and
/// both SET_ROWS come after it.
pub fn merge_qkv<'a>(
    nodes: &[Node],
    v: usize,
    planned: impl Fn(usize) -> Planned<'a>,
    cache_kernel: impl Fn(usize) -> Option<(&'a KernelDesc, usize)>,
) -> Option<QkvMerge> {
    let kernel = |k: usize| match planned(k) {
        Planned::Kernel(desc, operands) => Some((desc, operands)),
        _ => None,
    };
    let (v_desc, v_ops) = kernel(v)?;
    // RMS_NORM_MUL_MAT's operands, or RMS_NORM_MUL_MAT_BIAS's (qwen2: then V's bias).
    let (wv, x, n, v_bias) = match (Fused::of(&v_desc.op)?, v_ops) {
        (Fused::RmsNormMulMat, [wv, x, n, _]) => (wv, x, n, None),
        (Fused::RmsNormMulMatBias, [wv, x, n, b, _]) => (wv, x, n, Some(b)),
        _ => return None,
    };
    let (v_rows, v_set) = cache_kernel(v)?;
    let rotations: Vec<usize> = (0..nodes.len())
        .filter(|&k| {
            kernel(k).is_some_and(|(d, ops)| {
                matches!(Fused::of(&d.op), Some(Fused::RmsNormMulMatRope { .. }))
                    && ops.len() >= 5
                    && same(&ops[1], x)
                    && same(&ops[2], n)
            })
        })
        .collect();
    let (q, k) = match rotations.as_slice() {
        [a, b] => match (cache_kernel(*a).is_some(), cache_kernel(*b).is_some()) {
            (false, true) => (*a, *b),
            (true, false) => (*b, *a),
            _ => return None,
        },
        _ => return None,
    };
    let (Some((q_desc, q_ops)), Some((k_desc, k_ops)), Some((k_rows, k_set))) =
        (kernel(q), kernel(k), cache_kernel(k))
    else {
        return None;
    };
    let Some(Fused::RmsNormMulMatRope {
        ff,
        head_norm,
        bias,
    }) = Fused::of(&q_desc.op)
    else {
        return None;
    };
    if bias != v_bias.is_some() {
        return None;
    }
    // The rotation's operands (the positions, the factors), then each one's own: its heads'
    // norm weights or its bias.
    let own = usize::from(head_norm || bias);
    let rotation = |ops: &'a [Tensor]| {
        let consts = &ops[3..ops.len() - 1];
        consts.split_at(consts.len() - own)
    };
    let ((q_consts, q_norm), (k_consts, k_norm)) = (rotation(q_ops), rotation(k_ops));
    // The layouts of the rotation's operands.
    let shared = |inputs: &'a [Layout]| &inputs[3..inputs.len() - own];
    let eps = v_desc.op_params.first().copied();
    let one_rotation = q_desc.op == k_desc.op
        && q_desc.op_params == k_desc.op_params
        && shared(&q_desc.inputs) == shared(&k_desc.inputs)
        && q_consts.iter().zip(k_consts).all(|(a, b)| same(a, b))
        && q_desc.op_params.get(11).copied() == eps;
    if !one_rotation || q_desc.output.dtype != "f32" {
        return None;
    }
    let members = [q, k, v];
    let at = q.max(k).max(v);
    let first = q.min(k).min(v);
    if k_set <= at || v_set <= at {
        return None;
    }
    // The other steps between the first member and the merged kernel, what they read and
    // write where they run (a node another kernel computes runs at that kernel's node).
    let between: Vec<(usize, Vec<&Tensor>, Vec<&Tensor>)> = (first + 1..at)
        .filter(|j| !members.contains(j))
        .map(|j| {
            let (read, written) = step_io(nodes, j, planned(j));
            (j, read, written)
        })
        .collect();
    let touches = |ts: &[&Tensor], t: &Tensor| ts.iter().any(|u| u.overlaps(t));
    // What the merged kernel reads, written in between: it would read the new values.
    let mut read: Vec<&Tensor> = vec![&q_ops[0], &k_ops[0], wv, x, n];
    read.extend(q_consts.iter().chain(q_norm).chain(k_norm).chain(v_bias));
    let overwritten = between
        .iter()
        .any(|(_, _, w)| read.iter().any(|t| touches(w, t)));
    // What a member writes, touched between it and the merged kernel: read too early, or
    // written before the member's late write.
    let caches = [&nodes[k_set].dst, &nodes[v_set].dst];
    let touched = members.iter().any(|&m| {
        let out = &nodes[m].dst;
        between.iter().filter(|(j, _, _)| *j > m).any(|(_, r, w)| {
            [out, caches[0], caches[1]]
                .into_iter()
                .any(|t| touches(r, t) || touches(w, t))
        })
    });
    if overwritten || touched {
        return None;
    }
    let op = Fused::RmsNormQkvRope {
        ff,
        head_norm,
        bias,
    }
    .entry()?;
    let mut inputs = vec![
        q_desc.inputs[0].clone(),
        k_desc.inputs[0].clone(),
        v_desc.inputs[0].clone(),
    ];
    // x, n, the positions, (the factors,) (Q's own, then K's, then V's bias).
    inputs.extend_from_slice(&q_desc.inputs[1..]);
    if head_norm || bias {
        inputs.extend(k_desc.inputs.last().cloned());
    }
    if bias {
        inputs.extend(v_desc.inputs.last().cloned());
    }
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params: q_desc.op_params.clone(),
        inputs,
        output: q_desc.output.clone(),
        extra_outputs: vec![k_rows.output.clone(), v_rows.output.clone()],
        f16_as_bf16: q_desc.f16_as_bf16 || k_rows.f16_as_bf16 || v_rows.f16_as_bf16,
        n_kv_step: None,
    };
    let mut operands = vec![
        q_ops[0].clone(),
        k_ops[0].clone(),
        wv.clone(),
        x.clone(),
        n.clone(),
    ];
    operands.extend(
        q_consts
            .iter()
            .chain(q_norm)
            .chain(k_norm)
            .chain(v_bias)
            .cloned(),
    );
    operands.extend(q_ops.last().cloned());
    Some(QkvMerge {
        members,
        at,
        desc,
        operands,
    })
}

/// A llama decode layer's two kernels (the Q/K/V merge and the attention with the block after
/// it) as one `DECODE_LAYER[_BIAS|_HEAD_NORM][_FF]_<GLU>` kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerMerge {
    /// Where it runs: the node of the `FLASH_ATTN_FFN_<GLU>` kernel.
    pub at: usize,
    pub desc: KernelDesc,
    /// Its operands before K's and V's cache rows (known when the graph runs): its inputs, its
    /// output and Q.
    pub before_rows: Vec<Tensor>,
    /// Its operands after them: a, r1 and h (and o and d with post norms).
    pub after_rows: Vec<Tensor>,
    /// The nodes of the kernels it takes over besides the Q/K/V kernel's and `at`'s.
    pub absorbed: Vec<usize>,
}

/// The merge of the Q/K/V kernel `merge` at node `merge_at` (`operands`: its operands up to Q's
/// output; K's and V's rows, which the SET_ROWS nodes `set_rows` name, follow) with the
/// `FLASH_ATTN_FFN_<GLU>` kernel after it whose q is Q, whose residual is the layer's input x
/// and whose k and v read those caches, as one `DECODE_LAYER[_BIAS|_HEAD_NORM][_FF]_<GLU>`
/// kernel at the attention's node (the Q/K/V kernel's biases or heads' norm weights among its
/// inputs, as that kernel's). Only when nothing runs between the two but those SET_ROWS (the
/// views, and the nodes the attention's kernel covers, run nothing): the Q/K/V kernel then runs
/// later than planned with no node in between to see the difference. `None` otherwise, and for
/// a layer the catalogue has no kernel of (qwen's with frequency factors).
pub fn merge_layer<'a>(
    nodes: &[Node],
    planned: &dyn Fn(usize) -> Planned<'a>,
    merge_at: usize,
    merge: &KernelDesc,
    operands: &[Tensor],
    set_rows: [usize; 2],
) -> Option<LayerMerge> {
    let Some(Fused::RmsNormQkvRope {
        ff,
        head_norm,
        bias,
    }) = Fused::of(&merge.op)
    else {
        return None;
    };
    let x = operands.get(3)?;
    let q_out = operands.last()?;
    let (at, glu, ffn, ops) = (merge_at + 1..nodes.len()).find_map(|j| match planned(j) {
        Planned::Kernel(d, ops) => match Fused::of(&d.op) {
            Some(Fused::FlashAttnFfn(glu)) => Some((j, glu, d, ops)),
            _ => None,
        },
        _ => None,
    })?;
    let [q, k, v, mask, wo, r0, wg, wu, wd, n, out, a, r1, h] = ops else {
        return None;
    };
    let op = Fused::DecodeLayer {
        ff,
        head_norm,
        bias,
        post_norm: false,
        glu,
    }
    .entry()?;
    // A decode step's tokens (a prompt keeps its two kernels, which split into pieces).
    let q_is_q = views_heads_of(q, q_out) && q_out.ne[2] <= STEP_TOKENS;
    let caches = k.overlaps(&nodes[set_rows[0]].dst) && v.overlaps(&nodes[set_rows[1]].dst);
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    let between = (merge_at + 1..at).any(|j| runs(j) && !set_rows.contains(&j));
    if !q_is_q || !same(r0, x) || !caches || between {
        return None;
    }
    let mut op_params = merge.op_params.clone();
    op_params.resize(12, 0);
    let mut attention = ffn.op_params.clone();
    attention.resize(4, 0);
    op_params.extend(attention);
    if head_norm {
        // The heads' eps, the Q/K/V kernel's word 12, after the attention's words.
        op_params.push(merge.op_params.get(12).copied().unwrap_or(0));
    }
    let mut inputs = merge.inputs.clone();
    inputs.extend_from_slice(&ffn.inputs[1..5]);
    inputs.extend_from_slice(&ffn.inputs[6..]);
    let mut extra_outputs = vec![merge.output.clone()];
    extra_outputs.extend_from_slice(&merge.extra_outputs);
    extra_outputs.extend_from_slice(&ffn.extra_outputs);
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params,
        inputs,
        output: ffn.output.clone(),
        extra_outputs,
        f16_as_bf16: merge.f16_as_bf16 || ffn.f16_as_bf16,
        n_kv_step: ffn.n_kv_step,
    };
    let qkv_inputs = &operands[..operands.len() - 1];
    let mut before_rows = qkv_inputs.to_vec();
    before_rows.extend([k, v, mask, wo, wg, wu, wd, n, out, q_out].map(Tensor::clone));
    Some(LayerMerge {
        at,
        desc,
        before_rows,
        after_rows: vec![a.clone(), r1.clone(), h.clone()],
        absorbed: Vec::new(),
    })
}

/// The merge of the Q/K/V kernel `merge` at node `merge_at` (as for `merge_layer`) with the six
/// kernels that run after it in gemma2's and gemma3's layers: the attention (a
/// `FLASH_ATTN_EXT_MASK` kernel whose q is Q and whose k and v read the caches the SET_ROWS
/// `set_rows` write), the output projection (`MUL_MAT` of its whole output: o), the norm after
/// it with the residual (`RMS_NORM_MUL_ADD`: r1 = rms_norm(o) * n_post_attn + x), the block's
/// gate and up (`RMS_NORM_MUL_MAT_<GLU>` of r1: h), its down projection (`MUL_MAT`: d) and the
/// norm after it with the residual (`RMS_NORM_MUL_ADD`: out = rms_norm(d) * n_post_ffn + r1), as
/// one `DECODE_LAYER[_HEAD_NORM]_POST_NORM_<GLU>` kernel at the last one's node. Only when
/// those kernels are exactly what runs after the Q/K/V kernel but the SET_ROWS, each reading
/// the one before's result whole, and each norm's output is its projection's or its residual's
/// memory or apart from both (the kernel writes a round's rows after reading them). The kernel
/// writes every intermediate (a, o, r1, h, d) where the kernels did, in their order, so later
/// readers see what they would have. `None` otherwise.
pub fn merge_post_norm_layer<'a>(
    nodes: &[Node],
    planned: &dyn Fn(usize) -> Planned<'a>,
    merge_at: usize,
    merge: &KernelDesc,
    operands: &[Tensor],
    set_rows: [usize; 2],
) -> Option<LayerMerge> {
    let Some(Fused::RmsNormQkvRope {
        ff,
        head_norm,
        bias,
    }) = Fused::of(&merge.op)
    else {
        return None;
    };
    let x = operands.get(3)?;
    let q_out = operands.last()?;
    let runs = |j: usize| !matches!(planned(j), Planned::Nothing | Planned::Covered);
    let kernels = (merge_at + 1..nodes.len())
        .filter(|&j| runs(j) && !set_rows.contains(&j))
        .take(6)
        .map(|j| match planned(j) {
            Planned::Kernel(desc, ops) => Some((j, desc, ops)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let [(f, fa, fa_ops), (p, proj, proj_ops), (n1, post1, post1_ops), (g, glu, glu_ops), (dn, down, down_ops), (at, post2, post2_ops)] =
        kernels.as_slice()
    else {
        return None;
    };
    let Some(Fused::RmsNormMulMatGlu(act)) = Fused::of(&glu.op) else {
        return None;
    };
    let ops = [
        (fa, catalogue::FLASH_ATTN_EXT_MASK.name),
        (proj, catalogue::MUL_MAT.name),
        (post1, catalogue::RMS_NORM_MUL_ADD.name),
        (down, catalogue::MUL_MAT.name),
        (post2, catalogue::RMS_NORM_MUL_ADD.name),
    ];
    if ops.iter().any(|(d, name)| d.op != *name) {
        return None;
    }
    let [q, k, v, mask, a] = <&[Tensor; 5]>::try_from(*fa_ops).ok()?;
    let (
        [wo, a_in, o],
        [o_in, r0, n_pa, r1],
        [wg, wu, x1, n_ffn, h],
        [wd, h_in, d],
        [d_in, r1_in, n_pf, out],
    ) = (
        <&[Tensor; 3]>::try_from(*proj_ops).ok()?,
        <&[Tensor; 4]>::try_from(*post1_ops).ok()?,
        <&[Tensor; 5]>::try_from(*glu_ops).ok()?,
        <&[Tensor; 3]>::try_from(*down_ops).ok()?,
        <&[Tensor; 4]>::try_from(*post2_ops).ok()?,
    );
    let op = Fused::DecodeLayer {
        ff,
        head_norm,
        bias,
        post_norm: true,
        glu: act,
    }
    .entry()?;
    let q_is_q = views_heads_of(q, q_out) && q_out.ne[2] <= STEP_TOKENS;
    let caches = k.overlaps(&nodes[set_rows[0]].dst) && v.overlaps(&nodes[set_rows[1]].dst);
    let whole_a =
        a_in.addr == a.addr && a_in.bytes == a.bytes && a_in.is_contiguous() && a.is_contiguous();
    let chained = same(o_in, o) && same(r0, x) && same(x1, r1) && same(h_in, h);
    let chained = chained && same(d_in, d) && same(r1_in, r1);
    // A norm's output over its projection or its residual exactly, or apart from both.
    let apart = |out: &Tensor, p: &Tensor, r: &Tensor| {
        [p, r].iter().all(|t| same(out, t) || !out.overlaps(t))
    };
    if !q_is_q || !caches || !whole_a || !chained || !apart(r1, o, r0) || !apart(out, d, r1) {
        return None;
    }
    let word = |d: &KernelDesc, i: usize| d.op_params.get(i).copied().unwrap_or(0);
    let mut op_params = merge.op_params.clone();
    op_params.resize(12, 0);
    op_params.extend((0..3).map(|i| word(fa, i)));
    op_params.push(word(glu, 0));
    // The heads' eps (the Q/K/V kernel's word 12, or 0), then the two post norms' eps.
    op_params.push(if head_norm { word(merge, 12) } else { 0 });
    op_params.extend([word(post1, 0), word(post2, 0)]);
    let mut inputs = merge.inputs.clone();
    inputs.extend_from_slice(&fa.inputs[1..4]);
    inputs.push(proj.inputs[0].clone());
    inputs.extend_from_slice(&glu.inputs[..2]);
    inputs.push(down.inputs[0].clone());
    inputs.push(glu.inputs[3].clone());
    inputs.extend([post1.inputs[2].clone(), post2.inputs[2].clone()]);
    let mut extra_outputs = vec![merge.output.clone()];
    extra_outputs.extend_from_slice(&merge.extra_outputs);
    extra_outputs.extend([fa, post1, glu, proj, down].map(|d| d.output.clone()));
    let descs = [merge, *fa, *proj, *post1, *glu, *down, *post2];
    let desc = KernelDesc {
        op: op.name.to_owned(),
        op_params,
        inputs,
        output: post2.output.clone(),
        extra_outputs,
        f16_as_bf16: descs.iter().any(|d| d.f16_as_bf16),
        n_kv_step: fa.n_kv_step,
    };
    let qkv_inputs = &operands[..operands.len() - 1];
    let mut before_rows = qkv_inputs.to_vec();
    before_rows
        .extend([k, v, mask, wo, wg, wu, wd, n_ffn, n_pa, n_pf, out, q_out].map(Tensor::clone));
    Some(LayerMerge {
        at: *at,
        desc,
        before_rows,
        after_rows: [a, r1, h, o, d].map(Tensor::clone).to_vec(),
        absorbed: vec![*f, *p, *n1, *g, *dn],
    })
}

/// Whether the attention's q is the projection Q [D, H, T] (dense) viewed as [D, T, H]: the same
/// bytes, llama's permuted view (for one token Q's own layout).
fn views_heads_of(q: &Tensor, q_out: &Tensor) -> bool {
    let [d, h, t, one] = q_out.ne;
    q.addr == q_out.addr
        && q.dtype == q_out.dtype
        && q_out.is_contiguous()
        && one == 1
        && q.ne == [d, t, h, 1]
        && q.nb[0] == q_out.nb[0]
        && (t == 1 || q.nb[1] == q_out.nb[2])
        && (h == 1 || q.nb[2] == q_out.nb[1])
}

/// A reader's kernel (`MUL_MAT` or `MUL_MAT_<GLU>` with z as its activations, the last input)
/// reading x and n instead: `RMS_NORM_MUL_MAT[_<GLU>]` with eps as its parameter.
fn normed(
    desc: &KernelDesc,
    operands: &[Tensor],
    x: &Tensor,
    n: &Tensor,
    z: &Tensor,
    eps: i32,
) -> Option<(KernelDesc, Vec<Tensor>)> {
    if desc.op == catalogue::MUL_MAT_ADD.name {
        return normed_bias(desc, operands, x, n, z, eps);
    }
    let fused = match Fused::of(&desc.op) {
        _ if desc.op == catalogue::MUL_MAT.name => Fused::RmsNormMulMat,
        Some(Fused::MulMatGlu(glu)) => Fused::RmsNormMulMatGlu(glu),
        _ => return None,
    };
    let op = fused.entry()?;
    let (out, inputs) = operands.split_last()?;
    let (activations, weights) = inputs.split_last()?;
    let reads_only_as_x = same(activations, z) && !weights.iter().any(|w| w.overlaps(z));
    if op.inputs != inputs.len() + 1
        || !reads_only_as_x
        || [x, n].into_iter().any(|t| out.overlaps(t))
    {
        return None;
    }
    let mut desc = desc.clone();
    desc.op = op.name.to_owned();
    desc.op_params = vec![eps];
    desc.inputs.push(as_layout(n));
    let mut operands = weights.to_vec();
    operands.extend([x.clone(), n.clone(), out.clone()]);
    Some((desc, operands))
}

/// A `MUL_MAT_ADD` kernel with z as its activations and one f32 row of the product's values
/// as r (qwen2's Q, K and V biases; for one token llama's residual looks the same, and is the
/// same sum) reading x and n instead: `RMS_NORM_MUL_MAT_BIAS` with eps as its parameter.
fn normed_bias(
    desc: &KernelDesc,
    operands: &[Tensor],
    x: &Tensor,
    n: &Tensor,
    z: &Tensor,
    eps: i32,
) -> Option<(KernelDesc, Vec<Tensor>)> {
    let [w, activations, b, out] = operands else {
        return None;
    };
    let one_row = b.dtype == DType::F32 && b.is_contiguous() && b.ne == [out.ne[0], 1, 1, 1];
    if !same(activations, z)
        || [w, b].into_iter().any(|t| t.overlaps(z))
        || !one_row
        || [x, n, b].into_iter().any(|t| out.overlaps(t))
    {
        return None;
    }
    let op = Fused::RmsNormMulMatBias.entry()?;
    let mut desc = desc.clone();
    desc.op = op.name.to_owned();
    desc.op_params = vec![eps];
    desc.inputs = vec![
        desc.inputs[0].clone(),
        desc.inputs[1].clone(),
        as_layout(n),
        as_layout(b),
    ];
    let operands = vec![w.clone(), x.clone(), n.clone(), b.clone(), out.clone()];
    Some((desc, operands))
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{Graph, Step, StepList, REWRITES};
    use super::*;
    use crate::ops::tensor::test_util::{node, tensor};
    use crate::ops::tensor::{BinaryOp, DType, UnaryOp};

    /// A run of nodes one kernel computes: the kernel, and how many nodes (the first and those
    /// right after it).
    #[derive(Debug)]
    struct Fusion {
        plan: Plan,
        nodes: usize,
    }

    /// The run the table's run rows (the first four) make at node 0 of `nodes`.
    fn fuse_at(nodes: &[Node], options: PlanOptions) -> Option<Fusion> {
        let steps: Vec<Step<()>> = nodes
            .iter()
            .map(|n| crate::ops::plan(n).map_or(Step::Cpu(String::new()), Step::of))
            .collect();
        let view = StepList(&steps);
        let graph = Graph {
            nodes,
            steps: &view,
            options,
        };
        REWRITES[..4].iter().find_map(|row| {
            let [r] = (row.build)(&graph, 0).try_into().ok()?;
            Some(Fusion {
                plan: Plan::Kernel {
                    desc: r.desc,
                    operands: r.operands,
                },
                nodes: 1 + r.covers.len(),
            })
        })
    }

    /// llama's `ffn_norm`: RMS_NORM of x [64, 5] at 0x1000 into y at 0x2000, then MUL of y by
    /// the weight row at 0x3000 into z at 0x4000; then `later` (nodes after the MUL).
    fn rms_norm_then_mul(weight_ne: [i64; 4]) -> (Node, Node) {
        let x = tensor(DType::F32, [64, 5, 1, 1], 0x1000);
        let y = tensor(DType::F32, [64, 5, 1, 1], 0x2000);
        let w = tensor(DType::F32, weight_ne, 0x3000);
        let z = tensor(DType::F32, [64, 5, 1, 1], 0x4000);
        let mut norm = node(Op::Norm { rms: true }, y.clone(), vec![x]);
        norm.op_params[0] = 1e-6f32.to_bits() as i32;
        let mul = node(Op::Binary(BinaryOp::Mul), z, vec![y, w]);
        (norm, mul)
    }

    #[test]
    fn rms_norm_then_mul_by_a_weight_row_fuses() {
        let (norm, mul) = rms_norm_then_mul([64, 1, 1, 1]);
        let later = node(
            Op::Binary(BinaryOp::Add),
            tensor(DType::F32, [64, 5, 1, 1], 0x5000),
            vec![mul.dst.clone(), mul.dst.clone()],
        );
        let Some(Plan::Kernel { desc, operands }) = fuse_rms_norm_mul(&norm, &mul, &[later]) else {
            panic!("does not fuse");
        };
        assert_eq!(desc.op, "RMS_NORM_MUL");
        assert_eq!(desc.op_params, vec![1e-6f32.to_bits() as i32]);
        assert_eq!(desc.inputs[0].ne, [64, 5, 1, 1]);
        assert_eq!(desc.inputs[1].ne, [64, 1, 1, 1]);
        assert_eq!(desc.output.ne, [64, 5, 1, 1]);
        // x, the weight row, the MUL's output: the norm's output is never written.
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, vec![0x1000, 0x3000, 0x4000]);
    }

    #[test]
    fn memory_reused_after_the_norm_output_is_dead_does_not_stop_the_fusion() {
        let (norm, mul) = rms_norm_then_mul([64, 1, 1, 1]);
        // ggml's allocator gives y's memory (0x2000) to a later tensor, which is then read.
        let reuse = tensor(DType::F32, [64, 5, 1, 1], 0x2000);
        let writer = node(
            Op::Unary(UnaryOp::Relu),
            reuse.clone(),
            vec![mul.dst.clone()],
        );
        let reader = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [64, 5, 1, 1], 0x5000),
            vec![reuse],
        );
        assert!(fuse_rms_norm_mul(&norm, &mul, &[writer.clone(), reader.clone()]).is_some());
        // Read before anything overwrites it: y is still needed.
        assert!(fuse_rms_norm_mul(&norm, &mul, &[reader.clone(), writer]).is_none());
        // The MUL in place (its output in y's memory): what follows reads the product.
        let mut in_place = mul.clone();
        in_place.dst.addr = norm.dst.addr;
        let product_reader = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [64, 5, 1, 1], 0x5000),
            vec![in_place.dst.clone()],
        );
        let Some(Plan::Kernel { operands, .. }) =
            fuse_rms_norm_mul(&norm, &in_place, &[product_reader])
        else {
            panic!("an in-place MUL does not fuse");
        };
        assert_eq!(operands[2].addr, 0x2000);
    }

    #[test]
    fn rms_norm_then_mul_does_not_fuse_when_the_norm_output_is_needed() {
        let (norm, mul) = rms_norm_then_mul([64, 1, 1, 1]);
        // Read by a later node.
        let reader = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [64, 5, 1, 1], 0x5000),
            vec![norm.dst.clone()],
        );
        assert!(fuse_rms_norm_mul(&norm, &mul, &[reader]).is_none());
        // Read by the application (a graph output).
        let mut out = norm.clone();
        out.is_output = true;
        assert!(fuse_rms_norm_mul(&out, &mul, &[]).is_none());
    }

    #[test]
    fn rms_norm_then_mul_does_not_fuse_other_pairs() {
        // A weight of the output's shape, or repeated over rows and heads: not one row.
        for ne in [[64, 5, 1, 1], [64, 1, 2, 1]] {
            let (norm, mul) = rms_norm_then_mul(ne);
            assert!(fuse_rms_norm_mul(&norm, &mul, &[]).is_none(), "{ne:?}");
        }
        let (norm, mul) = rms_norm_then_mul([64, 1, 1, 1]);
        // The norm's output as the MUL's second operand, or a MUL of something else.
        let mut swapped = mul.clone();
        swapped.src.swap(0, 1);
        assert!(fuse_rms_norm_mul(&norm, &swapped, &[]).is_none());
        let mut other = mul.clone();
        other.src[0] = Some(tensor(DType::F32, [64, 5, 1, 1], 0x6000));
        assert!(fuse_rms_norm_mul(&norm, &other, &[]).is_none());
        // NORM (not RMS), ADD instead of MUL, f16 data.
        let mut plain = norm.clone();
        plain.op = Op::Norm { rms: false };
        assert!(fuse_rms_norm_mul(&plain, &mul, &[]).is_none());
        let mut add = mul.clone();
        add.op = Op::Binary(BinaryOp::Add);
        assert!(fuse_rms_norm_mul(&norm, &add, &[]).is_none());
        let half = |t: &Tensor| tensor(DType::F16, t.ne, t.addr);
        let mut h = mul.clone();
        h.src[1] = Some(half(mul.src[1].as_ref().unwrap()));
        assert!(fuse_rms_norm_mul(&norm, &h, &[]).is_none());
    }

    /// A feed-forward block as llama builds it: x [64, m] at 0x1000; the gate MUL_MAT (weights
    /// [64, 32] at 0x10000) into 0x2000, the up MUL_MAT (weights at 0x20000) into 0x3000,
    /// SWIGLU of (gate, up) into 0x4000.
    fn feed_forward(weights: DType, m: i64) -> [Node; 3] {
        let x = tensor(DType::F32, [64, m, 1, 1], 0x1000);
        let weight = |addr| match weights {
            // ggml's block layout: 2 blocks of 18 bytes per row.
            DType::Quant(_) => {
                let mut w = tensor(DType::I8, [64, 32, 1, 1], addr);
                w.dtype = weights;
                w.nb = [18, 36, 36 * 32, 36 * 32];
                w.bytes = 36 * 32;
                w
            }
            _ => tensor(weights, [64, 32, 1, 1], addr),
        };
        let g = tensor(DType::F32, [32, m, 1, 1], 0x2000);
        let u = tensor(DType::F32, [32, m, 1, 1], 0x3000);
        let out = tensor(DType::F32, [32, m, 1, 1], 0x4000);
        let glu = Op::Glu {
            name: "SWIGLU",
            act: UnaryOp::Silu,
        };
        [
            node(Op::MulMat, g.clone(), vec![weight(0x10000), x.clone()]),
            node(Op::MulMat, u.clone(), vec![weight(0x20000), x]),
            node(glu, out, vec![g, u]),
        ]
    }

    fn fused_operands(nodes: &[Node]) -> Option<(KernelDesc, Vec<u64>)> {
        match fuse_at(nodes, PlanOptions::default()) {
            Some(Fusion {
                plan: Plan::Kernel { desc, operands },
                nodes: 3,
            }) => Some((desc, operands.iter().map(|t| t.addr).collect())),
            None => None,
            other => panic!("not a three-node kernel: {other:?}"),
        }
    }

    #[test]
    fn gate_and_up_products_and_their_glu_fuse() {
        for m in [1, 3] {
            let (desc, addrs) = fused_operands(&feed_forward(DType::F32, m)).expect("fuses");
            assert_eq!(desc.op, "MUL_MAT_SWIGLU");
            assert!(desc.op_params.is_empty());
            assert_eq!(desc.inputs[0].ne, [64, 32, 1, 1]);
            assert_eq!(desc.inputs[2].ne, [64, m, 1, 1]);
            assert_eq!(desc.output.ne, [32, m, 1, 1]);
            // The gate weights, the up weights, x, the GLU's output: no product is written.
            assert_eq!(addrs, vec![0x10000, 0x20000, 0x1000, 0x4000]);
        }
        // The products in the other order (ggml visits the GLU's inputs in order): the gate is
        // still the activated one.
        let [g, u, glu] = feed_forward(DType::F32, 1);
        let (_, addrs) = fused_operands(&[u, g, glu]).expect("fuses");
        assert_eq!(addrs, vec![0x10000, 0x20000, 0x1000, 0x4000]);
    }

    #[test]
    fn quantized_and_f16_weights_fuse_with_the_mul_mat_rules() {
        let nodes = feed_forward(crate::ops::tensor::test_util::q4_0(), 1);
        let (desc, _) = fused_operands(&nodes).expect("fuses");
        assert_eq!(desc.inputs[1].dtype, "q4_0");
        let f16 = feed_forward(DType::F16, 1);
        let as_bf16 = PlanOptions {
            f16_as_bf16: true,
            ..PlanOptions::default()
        };
        let Some(Fusion {
            plan: Plan::Kernel { desc, .. },
            ..
        }) = fuse_at(&f16, as_bf16)
        else {
            panic!("f16 weights do not fuse");
        };
        assert!(desc.f16_as_bf16);
    }

    #[test]
    fn products_that_are_read_later_or_differ_do_not_fuse() {
        let base = feed_forward(DType::F32, 1);
        // A product read after the GLU, or read by the application.
        let reader = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [32, 1, 1, 1], 0x5000),
            vec![base[1].dst.clone()],
        );
        let mut read = base.to_vec();
        read.push(reader);
        assert!(fused_operands(&read).is_none());
        let mut output = base.clone();
        output[0].is_output = true;
        assert!(fused_operands(&output).is_none());
        // Different activations, weight types, weight shapes; a swapped or fused GLU.
        let mut other_x = base.clone();
        other_x[1].src[1] = Some(tensor(DType::F32, [64, 1, 1, 1], 0x8000));
        assert!(fused_operands(&other_x).is_none());
        let mut other_type = base.clone();
        other_type[1].src[0] = Some(tensor(DType::F16, [64, 32, 1, 1], 0x20000));
        assert!(fused_operands(&other_type).is_none());
        let mut swapped = base.clone();
        swapped[2].op_params[1] = 1;
        assert!(fused_operands(&swapped).is_none());
        let mut one_input = base.clone();
        one_input[2].src.truncate(1);
        assert!(fused_operands(&one_input).is_none());
        // A GLU of something else.
        let mut unrelated = base.clone();
        unrelated[2].src[1] = Some(tensor(DType::F32, [32, 1, 1, 1], 0x9000));
        assert!(fused_operands(&unrelated).is_none());
        // The output in x's memory (x is dead after the products): the kernel would overwrite
        // what it reads.
        let mut over_x = base.clone();
        over_x[2].dst.addr = 0x1000;
        assert!(fused_operands(&over_x).is_none());
        // In the gate product's memory (ggml's in-place GLU): nothing reads the product.
        let mut in_place = base;
        in_place[2].dst.addr = 0x2000;
        assert_eq!(fused_operands(&in_place).unwrap().1[3], 0x2000);
    }

    /// llama's residual connection after `ffn_down`: the MUL_MAT of x [64, m] at 0x1000 by
    /// weights at 0x10000 into 0x2000, then ADD of (product, residual at 0x3000) into 0x4000.
    fn projection_then_add(m: i64, residual_ne: [i64; 4]) -> [Node; 2] {
        let x = tensor(DType::F32, [64, m, 1, 1], 0x1000);
        let w = tensor(DType::F32, [64, 32, 1, 1], 0x10000);
        let p = tensor(DType::F32, [32, m, 1, 1], 0x2000);
        let r = tensor(DType::F32, residual_ne, 0x3000);
        let out = tensor(DType::F32, [32, m, 1, 1], 0x4000);
        [
            node(Op::MulMat, p.clone(), vec![w, x]),
            node(Op::Binary(BinaryOp::Add), out, vec![p, r]),
        ]
    }

    fn fused_add(nodes: &[Node]) -> Option<Vec<u64>> {
        match fuse_at(nodes, PlanOptions::default()) {
            Some(Fusion {
                plan: Plan::Kernel { desc, operands },
                nodes: 2,
            }) => {
                assert_eq!(desc.op, "MUL_MAT_ADD");
                Some(operands.iter().map(|t| t.addr).collect())
            }
            None => None,
            other => panic!("not a two-node kernel: {other:?}"),
        }
    }

    #[test]
    fn a_product_and_its_residual_or_bias_add_fuse() {
        // The residual (the product's shape), a bias row repeated over the rows.
        for (m, r) in [(1, [32, 1, 1, 1]), (3, [32, 3, 1, 1]), (3, [32, 1, 1, 1])] {
            let addrs = fused_add(&projection_then_add(m, r)).expect("fuses");
            assert_eq!(addrs, vec![0x10000, 0x1000, 0x3000, 0x4000]);
        }
        // ADD(residual, product): the residual is the ADD's first input.
        let [mm, mut add] = projection_then_add(3, [32, 3, 1, 1]);
        add.src.swap(0, 1);
        let addrs = fused_add(&[mm, add]).expect("fuses");
        assert_eq!(addrs[2], 0x3000);
        // In place into the residual, or into the product.
        for at in [0x3000, 0x2000] {
            let [mm, mut add] = projection_then_add(1, [32, 1, 1, 1]);
            add.dst.addr = at;
            assert_eq!(fused_add(&[mm, add]).expect("fuses")[3], at);
        }
    }

    #[test]
    fn views_between_a_product_and_its_add_are_covered_by_the_kernel() {
        // llama's last layer decoding one token: its two one-row GET_ROWS between the
        // projection and the ADD, forwarded as views.
        let [mm, add] = projection_then_add(1, [32, 1, 1, 1]);
        let view = |addr| {
            let t = tensor(DType::F32, [32, 1, 1, 1], addr);
            node(Op::Layout, t.clone(), vec![t])
        };
        let nodes = [mm, view(0x7000), view(0x8000), add];
        let fusion = fuse_at(&nodes, PlanOptions::default()).expect("fuses");
        assert_eq!(fusion.nodes, 4);
        // Any other node in between: not a run.
        let relu = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [32, 1, 1, 1], 0x7000),
            vec![tensor(DType::F32, [32, 1, 1, 1], 0x8000)],
        );
        let mut nodes = nodes.to_vec();
        nodes[1] = relu;
        assert!(fuse_at(&nodes, PlanOptions::default()).is_none());
    }

    #[test]
    fn a_product_add_does_not_fuse_when_the_product_is_needed_or_differs() {
        let base = projection_then_add(1, [32, 1, 1, 1]);
        let reader = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [32, 1, 1, 1], 0x5000),
            vec![base[0].dst.clone()],
        );
        let mut read = base.to_vec();
        read.push(reader);
        assert!(fused_add(&read).is_none());
        let mut output = base.clone();
        output[0].is_output = true;
        assert!(fused_add(&output).is_none());
        // A first input repeated over the product: the ADD's output would have its shape.
        let [mm, mut add] = projection_then_add(3, [32, 1, 1, 1]);
        add.src.swap(0, 1);
        assert!(fused_add(&[mm, add]).is_none());
        // SUB, an f16 residual, an output over x or over part of the residual.
        let mut sub = base.clone();
        sub[1].op = Op::Binary(BinaryOp::Sub);
        assert!(fused_add(&sub).is_none());
        let mut half = base.clone();
        half[1].src[1] = Some(tensor(DType::F16, [32, 1, 1, 1], 0x3000));
        assert!(fused_add(&half).is_none());
        for at in [0x1000, 0x3000 + 4] {
            let mut over = base.clone();
            over[1].dst.addr = at;
            assert!(fused_add(&over).is_none(), "{at:#x}");
        }
    }

    /// The plans the stream makes of `nodes`: each run `fuse_at` fuses, the rest one by one.
    fn planned_graph(nodes: &[Node]) -> Vec<Option<Plan>> {
        let mut steps: Vec<Option<Plan>> = Vec::new();
        while steps.len() < nodes.len() {
            let i = steps.len();
            match fuse_at(&nodes[i..], PlanOptions::default()) {
                Some(f) => {
                    steps.push(Some(f.plan));
                    steps.extend((1..f.nodes).map(|_| None));
                }
                None => steps.push(Some(crate::ops::plan(&nodes[i]).unwrap())),
            }
        }
        steps
    }

    fn fold_in(nodes: &[Node]) -> Option<Vec<Rewritten>> {
        let steps = planned_graph(nodes);
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            Some(Plan::Skip) => Planned::Nothing,
            Some(Plan::Host(_)) => Planned::Elsewhere,
            None => Planned::Covered,
        };
        fold_rms_norm(nodes, 0, planned)
    }

    /// llama's attention input: x [64, 1] at 0x1000 normalised (RMS_NORM into 0x2000, MUL by
    /// the weight row at 0x3000 into z at 0x4000), then Q [64 x 64] and K [64 x 16] of z
    /// (weights at 0x10000 and 0x20000, outputs at 0x5000 and 0x6000), then `after`.
    fn norm_then_projections(after: Vec<Node>) -> Vec<Node> {
        let (mut norm, mut mul) = rms_norm_then_mul([64, 1, 1, 1]);
        for t in [&mut norm.dst, norm.src[0].as_mut().unwrap(), &mut mul.dst] {
            t.ne = [64, 1, 1, 1];
            t.bytes = 256;
        }
        let y = norm.dst.clone();
        mul.src[0] = Some(y);
        let z = mul.dst.clone();
        let q = node(
            Op::MulMat,
            tensor(DType::F32, [64, 1, 1, 1], 0x5000),
            vec![tensor(DType::F32, [64, 64, 1, 1], 0x10000), z.clone()],
        );
        let k = node(
            Op::MulMat,
            tensor(DType::F32, [16, 1, 1, 1], 0x6000),
            vec![tensor(DType::F32, [64, 16, 1, 1], 0x20000), z],
        );
        let mut nodes = vec![norm, mul, q, k];
        nodes.extend(after);
        nodes
    }

    #[test]
    fn a_norm_only_projections_read_runs_inside_them() {
        let fold = fold_in(&norm_then_projections(vec![])).expect("folds");
        let readers: Vec<usize> = fold.iter().map(|r| r.at).collect();
        assert_eq!(readers, [2, 3]);
        for Rewritten {
            desc,
            operands,
            covers,
            ..
        } in &fold
        {
            // The norm and its MUL run nowhere.
            assert_eq!(covers, &[0, 1]);
            assert_eq!(desc.op, "RMS_NORM_MUL_MAT");
            assert_eq!(desc.op_params, vec![1e-6f32.to_bits() as i32]);
            assert_eq!(desc.inputs.len(), 3);
            assert_eq!(desc.inputs[2].ne, [64, 1, 1, 1]);
            // The weights, x (not z), the norm's weight row, the output.
            let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
            assert_eq!(addrs[1..3], [0x1000, 0x3000]);
        }
    }

    #[test]
    fn a_norm_read_by_anything_else_or_whose_input_changes_stays() {
        let z = tensor(DType::F32, [64, 1, 1, 1], 0x4000);
        let out = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        // Another reader of z than a projection.
        let add = node(Op::Binary(BinaryOp::Add), out(0x7000), vec![z.clone(), z]);
        assert!(fold_in(&norm_then_projections(vec![add])).is_none());
        // x overwritten before the last projection ran: K would read the new x.
        let mut nodes = norm_then_projections(vec![]);
        let writer = node(
            Op::Binary(BinaryOp::Add),
            out(0x1000),
            vec![out(0x7000), out(0x7000)],
        );
        nodes.insert(3, writer);
        assert!(fold_in(&nodes).is_none());
        // The application reads z.
        let mut nodes = norm_then_projections(vec![]);
        nodes[1].is_output = true;
        assert!(fold_in(&nodes).is_none());
    }

    #[test]
    fn a_norm_before_the_gate_and_up_pair_runs_inside_its_glu_kernel() {
        let mut nodes = norm_then_projections(vec![]);
        // K becomes the up projection of Q's shape, then SWIGLU(q, k).
        nodes[3].dst = tensor(DType::F32, [64, 1, 1, 1], 0x6000);
        nodes[3].src[0] = Some(tensor(DType::F32, [64, 64, 1, 1], 0x20000));
        let glu = node(
            Op::Glu {
                name: "SWIGLU",
                act: UnaryOp::Silu,
            },
            tensor(DType::F32, [64, 1, 1, 1], 0x8000),
            vec![nodes[2].dst.clone(), nodes[3].dst.clone()],
        );
        nodes.push(glu);
        let fold = fold_in(&nodes).expect("folds");
        let [Rewritten {
            at: 2,
            desc,
            operands,
            ..
        }] = fold.as_slice()
        else {
            panic!("one reader, the GLU kernel at node 2: {fold:?}");
        };
        assert_eq!(desc.op, "RMS_NORM_MUL_MAT_SWIGLU");
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [0x10000, 0x20000, 0x1000, 0x3000, 0x8000]);
    }

    /// `norm_then_projections` with Q's product (64 values at 0x5000) viewed as 4 heads of 16
    /// and rotated (normal mode, n_dims 16) with the positions at 0x9000 into 0xa000, then
    /// `after`; the steps as the stream plans them, the norm folded into Q and K.
    fn projections_then_rope(after: Vec<Node>) -> (Vec<Node>, Vec<Option<Plan>>) {
        let view = node(
            Op::Layout,
            tensor(DType::F32, [16, 4, 1, 1], 0x5000),
            vec![tensor(DType::F32, [64, 1, 1, 1], 0x5000)],
        );
        let mut tail = vec![view, rope_of(0x5000)];
        tail.extend(after);
        let nodes = norm_then_projections(tail);
        let steps = folded(&nodes);
        (nodes, steps)
    }

    fn rope_fold_in(nodes: &[Node], steps: &[Option<Plan>], at: usize) -> Option<Rewritten> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            Some(Plan::Skip) => Planned::Nothing,
            Some(Plan::Host(_)) => Planned::Elsewhere,
            None => Planned::Covered,
        };
        fold_rope(nodes, at, planned)
    }

    #[test]
    fn a_rope_of_a_normed_projection_runs_the_projection_itself() {
        let (nodes, steps) = projections_then_rope(vec![]);
        assert!(rope_fold_in(&nodes, &steps, 3).is_none(), "K is no ROPE");
        let fold = rope_fold_in(&nodes, &steps, 5).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[2][..], 5));
        let (desc, operands) = (&fold.desc, &fold.operands);
        assert_eq!(desc.op, "RMS_NORM_MUL_MAT_ROPE");
        // The rope's 11 words, then eps.
        assert_eq!(desc.op_params.len(), 12);
        assert_eq!(desc.op_params[1], 16);
        assert_eq!(desc.op_params[11], 1e-6f32.to_bits() as i32);
        let ne: Vec<[i64; 4]> = desc.inputs.iter().map(|l| l.ne).collect();
        assert_eq!(
            ne,
            [[64, 64, 1, 1], [64, 1, 1, 1], [64, 1, 1, 1], [1, 1, 1, 1]]
        );
        assert_eq!(desc.output.ne, [16, 4, 1, 1]);
        // The weights, x, n, the positions, the ROPE's output: the product is never written.
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [0x10000, 0x1000, 0x3000, 0x9000, 0xa000]);
    }

    #[test]
    fn a_rope_fold_keeps_the_nodes_when_the_product_or_the_inputs_are_needed() {
        let out = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        // Another reader of the product after the ROPE.
        let reader = node(Op::Unary(UnaryOp::Relu), out(0xb000), vec![out(0x5000)]);
        let (nodes, steps) = projections_then_rope(vec![reader]);
        assert!(rope_fold_in(&nodes, &steps, 5).is_none());
        // The application reads the product.
        let (mut nodes, steps) = projections_then_rope(vec![]);
        nodes[2].is_output = true;
        assert!(rope_fold_in(&nodes, &steps, 5).is_none());
        // x written between the projection and the ROPE: the fold would read the new x.
        let (mut nodes, mut steps) = projections_then_rope(vec![]);
        let writer = node(
            Op::Binary(BinaryOp::Add),
            out(0x1000),
            vec![out(0x7000), out(0x7000)],
        );
        steps.insert(4, Some(crate::ops::plan(&writer).unwrap()));
        nodes.insert(4, writer);
        assert!(rope_fold_in(&nodes, &steps, 6).is_none());
        // A projection still reading the norm's output (the norm not folded).
        let (nodes, _) = projections_then_rope(vec![]);
        let unfolded = planned_graph(&nodes);
        assert!(rope_fold_in(&nodes, &unfolded, 5).is_none());
    }

    /// ROPE of heads [16, 4] at `x` (normal mode, n_dims 16, the positions at 0x9000) into
    /// 0xa000.
    fn rope_of(x: u64) -> Node {
        let mut rope = node(
            Op::Rope,
            tensor(DType::F32, [16, 4, 1, 1], 0xa000),
            vec![
                tensor(DType::F32, [16, 4, 1, 1], x),
                tensor(DType::I32, [1, 1, 1, 1], 0x9000),
            ],
        );
        rope.op_params[1] = 16;
        rope.op_params[5] = 10000f32.to_bits() as i32;
        rope.op_params[6] = 1f32.to_bits() as i32;
        rope.op_params[8] = 1f32.to_bits() as i32;
        rope
    }

    /// The steps of `nodes` as the stream plans them, the norm at node 0 folded into its
    /// readers.
    fn folded(nodes: &[Node]) -> Vec<Option<Plan>> {
        let mut steps = planned_graph(nodes);
        for r in fold_in(nodes).expect("the norm folds") {
            for &c in &r.covers {
                steps[c] = None;
            }
            steps[r.at] = Some(Plan::Kernel {
                desc: r.desc,
                operands: r.operands,
            });
        }
        steps
    }

    #[test]
    fn a_rope_of_a_projection_s_normed_heads_runs_their_norm_too() {
        // qwen3's Q: the product's heads [16, 4] normalised (RMS_NORM into 0xc000, MUL by one
        // head's weights at 0xd000 into 0xe000), then rotated.
        let heads = tensor(DType::F32, [16, 4, 1, 1], 0x5000);
        let view = node(
            Op::Layout,
            heads.clone(),
            vec![tensor(DType::F32, [64, 1, 1, 1], 0x5000)],
        );
        let mut norm = node(
            Op::Norm { rms: true },
            tensor(DType::F32, [16, 4, 1, 1], 0xc000),
            vec![heads],
        );
        norm.op_params[0] = 1e-5f32.to_bits() as i32;
        let mul = node(
            Op::Binary(BinaryOp::Mul),
            tensor(DType::F32, [16, 4, 1, 1], 0xe000),
            vec![
                tensor(DType::F32, [16, 4, 1, 1], 0xc000),
                tensor(DType::F32, [16, 1, 1, 1], 0xd000),
            ],
        );
        let nodes = norm_then_projections(vec![view, norm, mul, rope_of(0xe000)]);
        let steps = folded(&nodes);
        let fold = rope_fold_in(&nodes, &steps, 7).expect("folds");
        // The projection and the heads' norm (its MUL covered by its kernel) run nowhere.
        assert_eq!((&fold.covers[..], fold.at), (&[2, 5][..], 7));
        assert_eq!(fold.desc.op, "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE");
        // The rope's 11 words, the norm's eps, the heads' norm's eps.
        assert_eq!(fold.desc.op_params.len(), 13);
        assert_eq!(fold.desc.op_params[12], 1e-5f32.to_bits() as i32);
        assert_eq!(fold.desc.inputs.last().unwrap().ne, [16, 1, 1, 1]);
        let addrs: Vec<u64> = fold.operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [0x10000, 0x1000, 0x3000, 0x9000, 0xd000, 0xa000]);
        // The application reads the normed heads: they stay.
        let mut read = nodes.clone();
        read[6].is_output = true;
        assert!(rope_fold_in(&read, &folded(&read), 7).is_none());
        // gemma3's Q: the rotation in place over the normed heads (ggml's allocator), then a
        // SCALE of it. The SCALE reads the rotated heads, not the normed ones: still one kernel.
        let mut in_place = nodes.clone();
        in_place[7].dst.addr = 0xe000;
        let rotated = in_place[7].dst.clone();
        in_place.push(node(
            Op::Scale,
            tensor(DType::F32, [16, 4, 1, 1], 0xf000),
            vec![rotated],
        ));
        let fold = rope_fold_in(&in_place, &folded(&in_place), 7).expect("folds");
        assert_eq!(fold.desc.op, "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE");
    }

    #[test]
    fn a_rope_of_a_biased_projection_adds_the_bias_first() {
        // qwen2's Q: the product plus a bias row (at 0xf000) into 0x5800, its heads rotated.
        let mut nodes = norm_then_projections(vec![]);
        let add = node(
            Op::Binary(BinaryOp::Add),
            tensor(DType::F32, [64, 1, 1, 1], 0x5800),
            vec![
                tensor(DType::F32, [64, 1, 1, 1], 0x5000),
                tensor(DType::F32, [64, 1, 1, 1], 0xf000),
            ],
        );
        nodes.insert(3, add);
        let view = node(
            Op::Layout,
            tensor(DType::F32, [16, 4, 1, 1], 0x5800),
            vec![tensor(DType::F32, [64, 1, 1, 1], 0x5800)],
        );
        nodes.extend([view, rope_of(0x5800)]);
        let steps = folded(&nodes);
        match &steps[2] {
            Some(Plan::Kernel { desc, .. }) => assert_eq!(desc.op, "RMS_NORM_MUL_MAT_BIAS"),
            other => panic!("the biased projection's kernel: {other:?}"),
        }
        let fold = rope_fold_in(&nodes, &steps, 6).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[2][..], 6));
        assert_eq!(fold.desc.op, "RMS_NORM_MUL_MAT_BIAS_ROPE");
        assert_eq!(fold.desc.op_params.len(), 12);
        assert_eq!(fold.desc.inputs.last().unwrap().ne, [64, 1, 1, 1]);
        // The weights, x, n, the positions, the bias, the ROPE's output.
        let addrs: Vec<u64> = fold.operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [0x10000, 0x1000, 0x3000, 0x9000, 0xf000, 0xa000]);
        // Another reader of the biased product: it stays.
        let mut read = nodes.clone();
        read.push(node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [64, 1, 1, 1], 0xb000),
            vec![tensor(DType::F32, [64, 1, 1, 1], 0x5800)],
        ));
        assert!(rope_fold_in(&read, &folded(&read), 6).is_none());
    }

    /// Q's, K's and V's planned kernels of one x (0x1000) and norm weight (0x2000) at nodes 0,
    /// 1 and 2, K's and V's writing cache rows (SET_ROWS at nodes 3 and 4), positions at
    /// 0x3000; `extra` nodes inserted at `extra.0`.
    pub(in crate::ops::rewrite) fn qkv_graph(
        extra: Option<(usize, Node)>,
    ) -> (Vec<Node>, Vec<Option<Plan>>) {
        qkv_graph_of(extra, None)
    }

    /// `qkv_graph` whose projections have their own inputs (`own`): qwen2's biases (Q's at
    /// 0xd000, K's at 0xe000, V's at 0xf000) or qwen3's head norm weights (Q's at 0xd000, K's
    /// at 0xe000, eps 1e-5).
    fn qkv_graph_of(
        extra: Option<(usize, Node)>,
        own: Option<&str>,
    ) -> (Vec<Node>, Vec<Option<Plan>>) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let (x, n, pos) = (
            f32([64, 1, 1, 1], 0x1000),
            f32([64, 1, 1, 1], 0x2000),
            tensor(DType::I32, [1, 1, 1, 1], 0x3000),
        );
        let eps = 1e-6f32.to_bits() as i32;
        let mut rope_params = vec![0, 16, 0, 0, 0, 10000f32.to_bits() as i32];
        rope_params.resize(11, 0);
        rope_params.push(eps);
        let projection = |op: &str, rows: i64, w: u64, out: Tensor, rotated: bool| {
            let mut operands = vec![f32([64, rows, 1, 1], w), x.clone(), n.clone()];
            if rotated {
                operands.push(pos.clone());
            }
            // The projection's own input, and its op's name.
            let own_at = 0xd000 + (w / 0x10000 - 1) * 0x1000;
            let op = match own {
                Some("bias") => {
                    operands.push(f32([rows, 1, 1, 1], own_at));
                    op.replace("_MAT", "_MAT_BIAS")
                }
                Some("head_norm") if rotated => {
                    operands.push(f32([16, 1, 1, 1], own_at));
                    op.replace("_MAT", "_MAT_HEAD_NORM")
                }
                _ => op.to_owned(),
            };
            let mut op_params = if rotated {
                rope_params.clone()
            } else {
                vec![eps]
            };
            if own == Some("head_norm") && rotated {
                op_params.push(1e-5f32.to_bits() as i32);
            }
            let inputs = operands.iter().map(as_layout).collect();
            operands.push(out.clone());
            let plan = Plan::Kernel {
                desc: KernelDesc {
                    op,
                    op_params,
                    inputs,
                    output: as_layout(&out),
                    extra_outputs: Vec::new(),
                    f16_as_bf16: false,
                    n_kv_step: None,
                },
                operands,
            };
            (node(Op::MulMat, out, vec![]), plan)
        };
        let rope = "RMS_NORM_MUL_MAT_ROPE";
        let q = projection(rope, 64, 0x10000, f32([16, 4, 1, 1], 0xa000), true);
        let k = projection(rope, 16, 0x20000, f32([16, 1, 1, 1], 0xb000), true);
        let v = projection(
            "RMS_NORM_MUL_MAT",
            16,
            0x30000,
            f32([16, 1, 1, 1], 0xc000),
            false,
        );
        let set_rows = |src: &Tensor, cache| {
            node(
                Op::SetRows,
                tensor(DType::F16, [16, 8, 1, 1], cache),
                vec![src.clone(), tensor(DType::I64, [1, 1, 1, 1], 0x4000)],
            )
        };
        let (sk, sv) = (set_rows(&k.0.dst, 0x40000), set_rows(&v.0.dst, 0x50000));
        let mut nodes = vec![q.0, k.0, v.0, sk, sv];
        let mut steps = vec![Some(q.1), Some(k.1), Some(v.1), None, None];
        if let Some((at, extra)) = extra {
            steps.insert(at, Some(crate::ops::plan(&extra).unwrap()));
            nodes.insert(at, extra);
        }
        (nodes, steps)
    }

    fn qkv_merges(nodes: &[Node], steps: &[Option<Plan>]) -> Vec<QkvMerge> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            _ => Planned::Elsewhere,
        };
        // K and V write f16 rows into the caches of the SET_ROWS after them.
        let rows: Vec<Option<(KernelDesc, usize)>> = (0..nodes.len())
            .map(|k| match &steps[k] {
                Some(Plan::Kernel { desc, .. }) if desc.output.ne[1] == 1 => {
                    let set = (k + 1..nodes.len()).find(|&j| {
                        nodes[j].op == Op::SetRows
                            && nodes[j].src(0).is_some_and(|s| s.addr == nodes[k].dst.addr)
                    })?;
                    let mut d = desc.clone();
                    d.output = crate::kernels::desc::Layout::contiguous("f16", 2, d.output.ne);
                    Some((d, set))
                }
                _ => None,
            })
            .collect();
        (0..nodes.len())
            .filter_map(|v| {
                merge_qkv(nodes, v, planned, |k| {
                    rows[k].as_ref().map(|(d, s)| (d, *s))
                })
            })
            .collect()
    }

    #[test]
    fn q_k_and_v_of_one_norm_merge_into_one_kernel() {
        let (nodes, steps) = qkv_graph(None);
        let [merge] = qkv_merges(&nodes, &steps).try_into().expect("one merge");
        assert_eq!((merge.members, merge.at), ([0, 1, 2], 2));
        assert_eq!(merge.desc.op, "RMS_NORM_QKV_ROPE");
        assert_eq!(merge.desc.op_params.len(), 12);
        assert_eq!(merge.desc.inputs.len(), 6);
        assert_eq!(merge.desc.output.ne, [16, 4, 1, 1]);
        let extra: Vec<&str> = merge
            .desc
            .extra_outputs
            .iter()
            .map(|l| l.dtype.as_str())
            .collect();
        assert_eq!(extra, ["f16", "f16"]);
        let addrs: Vec<u64> = merge.operands.iter().map(|t| t.addr).collect();
        assert_eq!(
            addrs,
            [0x10000, 0x20000, 0x30000, 0x1000, 0x2000, 0x3000, 0xa000]
        );
    }

    #[test]
    fn q_k_and_v_merge_with_their_biases_or_their_heads_norms() {
        // qwen2: Q's, K's and V's biases after the shared inputs, in that order.
        let (nodes, steps) = qkv_graph_of(None, Some("bias"));
        let [merge] = qkv_merges(&nodes, &steps).try_into().expect("one merge");
        assert_eq!(merge.desc.op, "RMS_NORM_QKV_BIAS_ROPE");
        assert_eq!(merge.desc.inputs.len(), 9);
        let addrs: Vec<u64> = merge.operands.iter().map(|t| t.addr).collect();
        assert_eq!(
            addrs,
            [0x10000, 0x20000, 0x30000, 0x1000, 0x2000, 0x3000, 0xd000, 0xe000, 0xf000, 0xa000]
        );
        // qwen3: Q's and K's head norm weights, and the heads' eps.
        let (nodes, steps) = qkv_graph_of(None, Some("head_norm"));
        let [merge] = qkv_merges(&nodes, &steps).try_into().expect("one merge");
        assert_eq!(merge.desc.op, "RMS_NORM_QKV_HEAD_NORM_ROPE");
        assert_eq!(merge.desc.op_params.len(), 13);
        let addrs: Vec<u64> = merge.operands.iter().map(|t| t.addr).collect();
        assert_eq!(
            addrs,
            [0x10000, 0x20000, 0x30000, 0x1000, 0x2000, 0x3000, 0xd000, 0xe000, 0xa000]
        );
        // A bias written between the members: the merged kernel would read the new one.
        let relu = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [64, 1, 1, 1], 0xd000),
            vec![tensor(DType::F32, [64, 1, 1, 1], 0x60000)],
        );
        let (nodes, steps) = qkv_graph_of(Some((1, relu)), Some("bias"));
        assert!(qkv_merges(&nodes, &steps).is_empty());
    }

    #[test]
    fn q_k_and_v_stay_apart_when_moving_them_would_change_what_is_read() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        // Q's output read before the merged kernel would have written it.
        let (nodes, steps) = qkv_graph(Some((1, relu(f32(0x60000), f32(0xa000)))));
        assert!(qkv_merges(&nodes, &steps).is_empty());
        // x written between the members: V would read the new x.
        let (nodes, steps) = qkv_graph(Some((2, relu(f32(0x1000), f32(0x60000)))));
        assert!(qkv_merges(&nodes, &steps).is_empty());
        // Unrelated nodes in between change nothing.
        let (nodes, steps) = qkv_graph(Some((2, relu(f32(0x60000), f32(0x70000)))));
        assert_eq!(qkv_merges(&nodes, &steps).len(), 1);
    }

    /// The attention output projection's MUL_MAT_ADD kernel (node 0: Wo 0x10000, a 0x1000,
    /// r0 0x2000 into r1 0x3000) and the RMS_NORM_FFN_SWIGLU kernel of r1 (node 2, the down
    /// projection's node; norm weight 0x4000, h 0x5000, output `out`), with `between` at node 1
    /// (planned as its own kernel) and `covered` saying whether node 1 runs inside another.
    fn attn_then_ffn(out: u64, between: Node, covered: bool) -> (Vec<Node>, Vec<Option<Plan>>) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let r1 = f32([64, 1, 1, 1], 0x3000);
        let kernel = |op: &str, params: Vec<i32>, operands: Vec<Tensor>, extra: Vec<Tensor>| {
            let n_in = operands.len() - 1 - extra.len();
            Plan::Kernel {
                desc: KernelDesc {
                    op: op.into(),
                    op_params: params,
                    inputs: operands[..n_in].iter().map(as_layout).collect(),
                    output: as_layout(&operands[n_in]),
                    extra_outputs: extra.iter().map(as_layout).collect(),
                    f16_as_bf16: false,
                    n_kv_step: None,
                },
                operands,
            }
        };
        let proj = kernel(
            "MUL_MAT_ADD",
            vec![],
            vec![
                f32([96, 64, 1, 1], 0x10000),
                f32([96, 1, 1, 1], 0x1000),
                f32([64, 1, 1, 1], 0x2000),
                r1.clone(),
            ],
            vec![],
        );
        let h = f32([128, 1, 1, 1], 0x5000);
        let ffn = kernel(
            "RMS_NORM_FFN_SWIGLU",
            vec![1e-5f32.to_bits() as i32],
            vec![
                f32([64, 128, 1, 1], 0x20000),
                f32([64, 128, 1, 1], 0x30000),
                f32([128, 64, 1, 1], 0x40000),
                r1.clone(),
                f32([64, 1, 1, 1], 0x4000),
                r1.clone(),
                f32([64, 1, 1, 1], out),
                h.clone(),
            ],
            vec![h],
        );
        let between_plan = (!covered).then(|| crate::ops::plan(&between).unwrap());
        let nodes = vec![
            node(Op::MulMat, r1.clone(), vec![]),
            between,
            node(Op::MulMat, f32([64, 1, 1, 1], out), vec![]),
        ];
        (nodes, vec![Some(proj), between_plan, Some(ffn)])
    }

    fn attn_ffn_fold(nodes: &[Node], steps: &[Option<Plan>]) -> Option<Rewritten> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            None => Planned::Covered,
            _ => Planned::Elsewhere,
        };
        fold_attn_ffn(nodes, 2, planned)
    }

    /// gemma's norm after the attention in small: RMS_NORM of x 0x1000 (node 0), the MUL by
    /// the weight row 0x3000 (node 1: y 0x4000), both one RMS_NORM_MUL kernel at node 0, then
    /// `add` at node 2 (its own kernel): the residual ADD of y and r 0x5000.
    fn norm_then_add(add: Node) -> (Vec<Node>, Vec<Option<Plan>>) {
        let f32 = |addr| tensor(DType::F32, [64, 2, 1, 1], addr);
        let norm = node(Op::Norm { rms: true }, f32(0x2000), vec![f32(0x1000)]);
        let w = tensor(DType::F32, [64, 1, 1, 1], 0x3000);
        let mul = node(Op::Binary(BinaryOp::Mul), f32(0x4000), vec![f32(0x2000), w]);
        let fused = fuse_rms_norm_mul(&norm, &mul, std::slice::from_ref(&add)).expect("fuses");
        let add_plan = crate::ops::plan(&add).unwrap();
        (
            vec![norm, mul, add],
            vec![Some(fused), None, Some(add_plan)],
        )
    }

    fn norm_add_fold(nodes: &[Node], steps: &[Option<Plan>]) -> Option<Rewritten> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            None => Planned::Covered,
            _ => Planned::Elsewhere,
        };
        fold_rms_norm_mul_add(nodes, 2, planned)
    }

    #[test]
    fn a_norm_times_a_row_folds_into_the_residual_add_reading_it() {
        let f32 = |addr| tensor(DType::F32, [64, 2, 1, 1], addr);
        let add = |a: u64, b: u64, out: u64| {
            node(Op::Binary(BinaryOp::Add), f32(out), vec![f32(a), f32(b)])
        };
        // Either operand order; the output in r's memory (an ADD in place) too.
        for (a, b, out) in [(0x4000, 0x5000, 0x6000), (0x5000, 0x4000, 0x5000)] {
            let (nodes, steps) = norm_then_add(add(a, b, out));
            let fold = norm_add_fold(&nodes, &steps).expect("folds");
            assert_eq!((&fold.covers[..], fold.at), (&[0][..], 2));
            assert_eq!(fold.desc.op, "RMS_NORM_MUL_ADD");
            assert_eq!(fold.desc.inputs[1].ne, [64, 2, 1, 1]);
            let addrs: Vec<u64> = fold.operands.iter().map(|t| t.addr).collect();
            assert_eq!(addrs, [0x1000, 0x5000, 0x3000, out]);
        }
        // The output over the weight row, a residual broadcast over the rows, y the
        // application reads: none fold.
        let (nodes, steps) = norm_then_add(add(0x4000, 0x5000, 0x3000));
        assert!(norm_add_fold(&nodes, &steps).is_none());
        let row = tensor(DType::F32, [64, 1, 1, 1], 0x5000);
        let bias = node(
            Op::Binary(BinaryOp::Add),
            f32(0x6000),
            vec![f32(0x4000), row],
        );
        let (nodes, steps) = norm_then_add(bias);
        assert!(norm_add_fold(&nodes, &steps).is_none());
        let (mut nodes, steps) = norm_then_add(add(0x4000, 0x5000, 0x6000));
        nodes[1].is_output = true;
        assert!(norm_add_fold(&nodes, &steps).is_none());
    }

    #[test]
    fn the_attention_output_folds_into_the_feed_forward_kernel_of_its_result() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        // A node computed inside another kernel in between (the norm, the gate/up pair); the
        // output in r1's memory (the block's ADD in place).
        let (nodes, steps) = attn_then_ffn(0x3000, relu(f32(0x6000), f32(0x3000)), true);
        let fold = attn_ffn_fold(&nodes, &steps).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[0][..], 2));
        let (desc, operands) = (&fold.desc, &fold.operands);
        assert_eq!(desc.op, "MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU");
        assert_eq!(desc.op_params, [1e-5f32.to_bits() as i32]);
        assert_eq!(desc.extra_outputs.len(), 2);
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        assert_eq!(
            addrs,
            [0x10000, 0x1000, 0x2000, 0x20000, 0x30000, 0x40000, 0x4000, 0x3000, 0x3000, 0x5000]
        );
        // Unrelated nodes that run in between change nothing.
        let (nodes, steps) = attn_then_ffn(0x7000, relu(f32(0x6000), f32(0x8000)), false);
        assert!(attn_ffn_fold(&nodes, &steps).is_some());
    }

    #[test]
    fn the_attention_output_stays_apart_when_moving_it_would_change_what_is_read() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        // r1 read by a node that runs in between: it would read r1 before it is written.
        let (nodes, steps) = attn_then_ffn(0x7000, relu(f32(0x6000), f32(0x3000)), false);
        assert!(attn_ffn_fold(&nodes, &steps).is_none());
        // r0 written in between: the projection would add the new values.
        let (nodes, steps) = attn_then_ffn(0x7000, relu(f32(0x2000), f32(0x8000)), false);
        assert!(attn_ffn_fold(&nodes, &steps).is_none());
    }

    /// A kernel plan of `op` over `operands`: its inputs, its output, then `extra` outputs.
    fn kernel_plan(op: &str, params: Vec<i32>, operands: Vec<Tensor>, extra: usize) -> Plan {
        let n_in = operands.len() - 1 - extra;
        Plan::Kernel {
            desc: KernelDesc {
                op: op.into(),
                op_params: params,
                inputs: operands[..n_in].iter().map(as_layout).collect(),
                output: as_layout(&operands[n_in]),
                extra_outputs: operands[n_in + 1..].iter().map(as_layout).collect(),
                f16_as_bf16: false,
                n_kv_step: None,
            },
            operands,
        }
    }

    /// A decode step's FLASH_ATTN_EXT_MASK kernel (node 0: q 0x100, k 0x8000, v 0x9000, mask
    /// 0xa000 into its output [32, 2] at 0x1000; `fa_op` its op), the reshape of its output to
    /// a [64, 1] (node 1, a view), `between` at node 2 (its own kernel, or `covered`) and the
    /// MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU kernel reading a (node 3: Wo 0x10000, r0 0x2000, r1
    /// 0x3000, h 0x5000, output 0x7000).
    fn attention_then_block(
        fa_op: &str,
        between: Node,
        covered: bool,
    ) -> (Vec<Node>, Vec<Option<Plan>>) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let f16 = |ne, addr| tensor(DType::F16, ne, addr);
        let kernel = kernel_plan;
        let fa_out = f32([32, 2, 1, 1], 0x1000);
        let a = f32([64, 1, 1, 1], 0x1000);
        let fa = kernel(
            fa_op,
            vec![0.125f32.to_bits() as i32, 0, 0],
            vec![
                f32([32, 1, 2, 1], 0x100),
                f16([32, 16, 1, 1], 0x8000),
                f16([32, 16, 1, 1], 0x9000),
                f16([16, 1, 1, 1], 0xa000),
                fa_out.clone(),
            ],
            0,
        );
        let (r1, h) = (f32([64, 1, 1, 1], 0x3000), f32([128, 1, 1, 1], 0x5000));
        let ffn = kernel(
            "MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU",
            vec![1e-5f32.to_bits() as i32],
            vec![
                f32([64, 64, 1, 1], 0x10000),
                a.clone(),
                f32([64, 1, 1, 1], 0x2000),
                f32([64, 128, 1, 1], 0x20000),
                f32([64, 128, 1, 1], 0x30000),
                f32([128, 64, 1, 1], 0x40000),
                f32([64, 1, 1, 1], 0x4000),
                f32([64, 1, 1, 1], 0x7000),
                r1,
                h,
            ],
            2,
        );
        let between_plan = (!covered).then(|| crate::ops::plan(&between).unwrap());
        let nodes = vec![
            node(Op::MulMat, fa_out.clone(), vec![]),
            node(Op::MulMat, a, vec![fa_out]),
            between,
            node(Op::MulMat, f32([64, 1, 1, 1], 0x7000), vec![]),
        ];
        (
            nodes,
            vec![Some(fa), Some(Plan::Skip), between_plan, Some(ffn)],
        )
    }

    fn flash_attn_ffn_fold(nodes: &[Node], steps: &[Option<Plan>]) -> Option<Rewritten> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            Some(Plan::Skip) => Planned::Nothing,
            None => Planned::Covered,
            _ => Planned::Elsewhere,
        };
        fold_flash_attn_ffn(nodes, 3, planned)
    }

    #[test]
    fn a_decode_attention_folds_into_the_kernel_of_the_block_reading_it() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        let mask = "FLASH_ATTN_EXT_MASK";
        // A node computed inside the block's kernel in between (the projection's MUL_MAT).
        let (nodes, steps) = attention_then_block(mask, relu(f32(0x6000), f32(0x1000)), true);
        let fold = flash_attn_ffn_fold(&nodes, &steps).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[0][..], 3));
        let (desc, operands) = (&fold.desc, &fold.operands);
        assert_eq!(desc.op, "FLASH_ATTN_FFN_SWIGLU");
        let eps = 1e-5f32.to_bits() as i32;
        assert_eq!(desc.op_params, [0.125f32.to_bits() as i32, 0, 0, eps]);
        assert_eq!(desc.inputs.len(), 10);
        assert_eq!(desc.extra_outputs.len(), 3);
        assert_eq!(desc.extra_outputs[0].ne, [32, 2, 1, 1]);
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        let inputs = [
            0x100, 0x8000, 0x9000, 0xa000, 0x10000, 0x2000, 0x20000, 0x30000,
        ];
        let rest = [0x40000, 0x4000, 0x7000, 0x1000, 0x3000, 0x5000];
        assert_eq!(addrs, [&inputs[..], &rest[..]].concat());
        // Unrelated nodes that run in between change nothing.
        let (nodes, steps) = attention_then_block(mask, relu(f32(0x6000), f32(0xc000)), false);
        assert!(flash_attn_ffn_fold(&nodes, &steps).is_some());
        // A node of the block's kernel after its projection writing into a's memory (dead once
        // projected: ggml's allocator gives it to the block's norm, say).
        let (nodes, steps) = attention_then_block(mask, relu(f32(0x1000), f32(0xc000)), true);
        assert!(flash_attn_ffn_fold(&nodes, &steps).is_some());
    }

    #[test]
    fn the_attention_stays_apart_when_its_output_is_needed_or_its_inputs_change() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        let mask = "FLASH_ATTN_EXT_MASK";
        // a read by a node that runs in between: it would read a before it is written.
        let (nodes, steps) = attention_then_block(mask, relu(f32(0x6000), f32(0x1000)), false);
        assert!(flash_attn_ffn_fold(&nodes, &steps).is_none());
        // The V cache written in between: the attention would read the new rows.
        let (nodes, steps) = attention_then_block(mask, relu(f32(0x9000), f32(0xc000)), false);
        assert!(flash_attn_ffn_fold(&nodes, &steps).is_none());
        // The application reads the attention's output.
        let (mut nodes, steps) = attention_then_block(mask, relu(f32(0x6000), f32(0xc000)), false);
        nodes[0].is_output = true;
        assert!(flash_attn_ffn_fold(&nodes, &steps).is_none());
        // Sinks (or no mask): the fused kernel takes FLASH_ATTN_EXT_MASK's inputs only.
        let (nodes, steps) = attention_then_block(
            "FLASH_ATTN_EXT_MASK_SINKS",
            relu(f32(0x6000), f32(0xc000)),
            false,
        );
        assert!(flash_attn_ffn_fold(&nodes, &steps).is_none());
    }

    /// A decode step's FLASH_ATTN_EXT_MASK kernel (node 0, as `attention_then_block`'s), the
    /// view of its output as a (node 1), the output projection's MUL_MAT (node 2, covered) and
    /// its MUL_MAT_ADD kernel (node 3: Wo 0x10000, a, r0 0x2000 into r1 0x3000), `between` at
    /// node 4 (its own kernel, or `covered`) and the RMS_NORM_MUL_MAT_SWIGLU kernel of r1
    /// (node 5: Wg 0x20000, Wu 0x30000, n 0x4000 into h 0x5000): what the backend has after
    /// the compiler refused the block's FLASH_ATTN_FFN_SWIGLU.
    fn attention_then_gate_up(between: Node, covered: bool) -> (Vec<Node>, Vec<Option<Plan>>) {
        let (mut nodes, mut steps) = attention_then_block(
            "FLASH_ATTN_EXT_MASK",
            node(
                Op::MulMat,
                tensor(DType::F32, [64, 1, 1, 1], 0x6800),
                vec![],
            ),
            true,
        );
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let kernel = |op: &str, params, operands| kernel_plan(op, params, operands, 0);
        let (a, r1) = (f32([64, 1, 1, 1], 0x1000), f32([64, 1, 1, 1], 0x3000));
        let proj = kernel(
            "MUL_MAT_ADD",
            vec![],
            vec![
                f32([64, 64, 1, 1], 0x10000),
                a,
                f32([64, 1, 1, 1], 0x2000),
                r1.clone(),
            ],
        );
        let glu = kernel(
            "RMS_NORM_MUL_MAT_SWIGLU",
            vec![1e-5f32.to_bits() as i32],
            vec![
                f32([64, 128, 1, 1], 0x20000),
                f32([64, 128, 1, 1], 0x30000),
                r1.clone(),
                f32([64, 1, 1, 1], 0x4000),
                f32([128, 1, 1, 1], 0x5000),
            ],
        );
        let between_plan = (!covered).then(|| crate::ops::plan(&between).unwrap());
        nodes.truncate(3);
        steps.truncate(3);
        nodes.extend([
            node(Op::Binary(BinaryOp::Add), r1, vec![]),
            between,
            node(Op::MulMat, f32([128, 1, 1, 1], 0x5000), vec![]),
        ]);
        steps.extend([Some(proj), between_plan, Some(glu)]);
        (nodes, steps)
    }

    fn flash_attn_glu_fold(nodes: &[Node], steps: &[Option<Plan>]) -> Option<Rewritten> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            Some(Plan::Skip) => Planned::Nothing,
            None => Planned::Covered,
            _ => Planned::Elsewhere,
        };
        fold_flash_attn_glu(nodes, 5, planned)
    }

    #[test]
    fn the_attention_and_projection_fold_into_the_gate_up_kernel_of_a_refused_block() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        // The block's norm in between, inside the gate/up kernel.
        let (nodes, steps) = attention_then_gate_up(relu(f32(0x6000), f32(0x3000)), true);
        let fold = flash_attn_glu_fold(&nodes, &steps).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[0, 3][..], 5));
        let (desc, operands) = (&fold.desc, &fold.operands);
        assert_eq!(desc.op, "FLASH_ATTN_GLU_SWIGLU");
        let eps = 1e-5f32.to_bits() as i32;
        assert_eq!(desc.op_params, [0.125f32.to_bits() as i32, 0, 0, eps]);
        assert_eq!((desc.inputs.len(), desc.extra_outputs.len()), (9, 2));
        assert_eq!(desc.output.ne, [128, 1, 1, 1]);
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        let inputs = [
            0x100, 0x8000, 0x9000, 0xa000, 0x10000, 0x2000, 0x20000, 0x30000, 0x4000,
        ];
        assert_eq!(addrs, [&inputs[..], &[0x5000, 0x1000, 0x3000]].concat());
        // Unrelated nodes that run in between change nothing.
        let (nodes, steps) = attention_then_gate_up(relu(f32(0x6000), f32(0xc000)), false);
        assert!(flash_attn_glu_fold(&nodes, &steps).is_some());
    }

    #[test]
    fn the_attention_and_projection_stay_apart_when_moving_them_would_change_what_is_read() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        // r1 or a read by a node that runs in between: read before they are written.
        for read in [0x3000, 0x1000] {
            let (nodes, steps) = attention_then_gate_up(relu(f32(0x6000), f32(read)), false);
            assert!(flash_attn_glu_fold(&nodes, &steps).is_none(), "{read:#x}");
        }
        // The V cache or r0 written in between: the kernel would read the new values.
        for written in [0x9000, 0x2000] {
            let (nodes, steps) = attention_then_gate_up(relu(f32(written), f32(0xc000)), false);
            assert!(
                flash_attn_glu_fold(&nodes, &steps).is_none(),
                "{written:#x}"
            );
        }
        // The application reads the attention's output.
        let (mut nodes, steps) = attention_then_gate_up(relu(f32(0x6000), f32(0xc000)), false);
        nodes[0].is_output = true;
        assert!(flash_attn_glu_fold(&nodes, &steps).is_none());
    }

    /// A decode layer in small: Q/K/V merged at node 2 (x 0x1000, Q 0xb000), K's and V's
    /// SET_ROWS into the caches 0x8000 and 0x9000 (nodes 3 and 4), `between` at node 5 (its own
    /// kernel unless `covered`), the attention's node 6 (covered) and the FLASH_ATTN_FFN_SWIGLU
    /// kernel at node 7 reading `q` as q and `r0` as its residual.
    fn layer(
        q: u64,
        r0: u64,
        between: Node,
        covered: bool,
    ) -> (Vec<Node>, Vec<Option<Plan>>, QkvMerge) {
        layer_of(q, r0, between, covered, None)
    }

    /// `layer` whose Q/K/V kernel has its own inputs (`own`): qwen2's biases (Q's at 0x17000,
    /// K's at 0x18000, V's at 0x19000) or qwen3's head norm weights (Q's at 0x17000, K's at
    /// 0x18000, the heads' eps 1e-6).
    fn layer_of(
        q: u64,
        r0: u64,
        between: Node,
        covered: bool,
        own: Option<&str>,
    ) -> (Vec<Node>, Vec<Option<Plan>>, QkvMerge) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let f16 = |ne, addr| tensor(DType::F16, ne, addr);
        let x = f32([64, 1, 1, 1], 0x1000);
        let q_out = f32([32, 2, 1, 1], 0xb000);
        let mut qkv_inputs = vec![
            f32([64, 64, 1, 1], 0x10000),
            f32([64, 32, 1, 1], 0x11000),
            f32([64, 32, 1, 1], 0x12000),
            x.clone(),
            f32([64, 1, 1, 1], 0x2000),
            tensor(DType::I32, [1, 1, 1, 1], 0x3000),
        ];
        let mut op_params = vec![0, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1e-5f32.to_bits() as i32];
        let op = match own {
            Some("bias") => {
                qkv_inputs.extend([
                    f32([64, 1, 1, 1], 0x17000),
                    f32([32, 1, 1, 1], 0x18000),
                    f32([32, 1, 1, 1], 0x19000),
                ]);
                "RMS_NORM_QKV_BIAS_ROPE"
            }
            Some("head_norm") => {
                qkv_inputs.extend([f32([32, 1, 1, 1], 0x17000), f32([32, 1, 1, 1], 0x18000)]);
                op_params.push(1e-6f32.to_bits() as i32);
                "RMS_NORM_QKV_HEAD_NORM_ROPE"
            }
            _ => "RMS_NORM_QKV_ROPE",
        };
        let layout = |ts: &[Tensor]| ts.iter().map(as_layout).collect::<Vec<_>>();
        let merge = QkvMerge {
            members: [0, 1, 2],
            at: 2,
            desc: KernelDesc {
                op: op.into(),
                op_params,
                inputs: layout(&qkv_inputs),
                output: as_layout(&q_out),
                extra_outputs: layout(&[f16([32, 1, 1, 1], 0x8000), f16([32, 1, 1, 1], 0x9000)]),
                f16_as_bf16: false,
                n_kv_step: None,
            },
            operands: [&qkv_inputs[..], std::slice::from_ref(&q_out)].concat(),
        };
        let ffn_ops = vec![
            f32([32, 1, 2, 1], q),
            f16([32, 16, 1, 1], 0x8000),
            f16([32, 16, 1, 1], 0x9000),
            f16([16, 1, 1, 1], 0xa000),
            f32([64, 64, 1, 1], 0x13000),
            f32([64, 1, 1, 1], r0),
            f32([64, 128, 1, 1], 0x14000),
            f32([64, 128, 1, 1], 0x15000),
            f32([128, 64, 1, 1], 0x16000),
            f32([64, 1, 1, 1], 0x4000),
            f32([64, 1, 1, 1], 0x7000),
            f32([32, 2, 1, 1], 0xc000),
            f32([64, 1, 1, 1], 0xd000),
            f32([128, 1, 1, 1], 0xe000),
        ];
        let ffn = Plan::Kernel {
            desc: KernelDesc {
                op: "FLASH_ATTN_FFN_SWIGLU".into(),
                op_params: vec![0.125f32.to_bits() as i32, 0, 0, 1e-5f32.to_bits() as i32],
                inputs: layout(&ffn_ops[..10]),
                output: as_layout(&ffn_ops[10]),
                extra_outputs: layout(&ffn_ops[11..]),
                f16_as_bf16: false,
                n_kv_step: None,
            },
            operands: ffn_ops,
        };
        let set_rows = |cache| node(Op::SetRows, f16([32, 16, 1, 1], cache), vec![]);
        let between_plan = (!covered).then(|| crate::ops::plan(&between).unwrap());
        let nodes = vec![
            node(Op::MulMat, q_out.clone(), vec![]),
            node(Op::MulMat, f32([32, 1, 1, 1], 0x5000), vec![]),
            node(Op::MulMat, f32([32, 1, 1, 1], 0x6000), vec![]),
            set_rows(0x8000),
            set_rows(0x9000),
            between,
            node(Op::MulMat, f32([32, 2, 1, 1], 0xc000), vec![]),
            node(Op::MulMat, f32([64, 1, 1, 1], 0x7000), vec![]),
        ];
        let kernel = |op: &str| Plan::Kernel {
            desc: KernelDesc {
                op: op.into(),
                op_params: vec![],
                inputs: vec![],
                output: as_layout(&x),
                extra_outputs: vec![],
                f16_as_bf16: false,
                n_kv_step: None,
            },
            operands: vec![],
        };
        let steps = vec![
            None,
            None,
            Some(kernel("RMS_NORM_MUL_MAT")),
            Some(kernel("SET_ROWS")),
            Some(kernel("SET_ROWS")),
            between_plan,
            None,
            Some(ffn),
        ];
        (nodes, steps, merge)
    }

    fn layer_merge(nodes: &[Node], steps: &[Option<Plan>], merge: &QkvMerge) -> Option<LayerMerge> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            Some(Plan::Skip) => Planned::Nothing,
            None => Planned::Covered,
            _ => Planned::Elsewhere,
        };
        merge_layer(
            nodes,
            &planned,
            merge.at,
            &merge.desc,
            &merge.operands,
            [3, 4],
        )
    }

    #[test]
    fn the_attention_s_q_is_q_viewed_by_heads() {
        // Q [64, 4, T] dense; llama's q: its view [64, T, 4] (permuted), or for one token Q.
        for t in [1, 4] {
            let q_out = tensor(DType::F32, [64, 4, t, 1], 0x1000);
            let mut q = tensor(DType::F32, [64, t, 4, 1], 0x1000);
            q.nb = [4, q_out.nb[2], q_out.nb[1], q_out.nb[3]];
            assert!(views_heads_of(&q, &q_out), "{t} tokens");
            let dense = tensor(DType::F32, [64, t, 4, 1], 0x1000);
            assert_eq!(
                views_heads_of(&dense, &q_out),
                t == 1,
                "{t} tokens, not permuted"
            );
            let elsewhere = Tensor { addr: 0x2000, ..q };
            assert!(!views_heads_of(&elsewhere, &q_out));
        }
    }

    #[test]
    fn a_decode_layer_s_two_kernels_merge_into_one() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        let (nodes, steps, merge) = layer(0xb000, 0x1000, relu(f32(0xf000), f32(0xf100)), true);
        let layer = layer_merge(&nodes, &steps, &merge).expect("merges");
        assert_eq!(layer.at, 7);
        assert_eq!(layer.desc.op, "DECODE_LAYER_SWIGLU");
        assert_eq!(layer.desc.op_params.len(), 16);
        assert_eq!(layer.desc.op_params[11], 1e-5f32.to_bits() as i32);
        assert_eq!(layer.desc.op_params[12], 0.125f32.to_bits() as i32);
        assert_eq!(layer.desc.inputs.len(), 14);
        assert_eq!(layer.desc.extra_outputs.len(), 6);
        let addrs = |ts: &[Tensor]| ts.iter().map(|t| t.addr).collect::<Vec<_>>();
        let qkv = [0x10000, 0x11000, 0x12000, 0x1000, 0x2000, 0x3000];
        let attn = [
            0x8000, 0x9000, 0xa000, 0x13000, 0x14000, 0x15000, 0x16000, 0x4000,
        ];
        let outs = [0x7000, 0xb000];
        assert_eq!(
            addrs(&layer.before_rows),
            [&qkv[..], &attn[..], &outs[..]].concat()
        );
        assert_eq!(addrs(&layer.after_rows), [0xc000, 0xd000, 0xe000]);
    }

    /// gemma2's layer after its Q/K/V kernel (`layer`'s at node 2, K's and V's SET_ROWS at 3
    /// and 4): the attention (5), O (6), its norm and the residual x (7), the block's gate and
    /// up (8), its down projection (9), its norm and the residual r1 (10). `r1` is r1's address
    /// (0xd000 apart from the rest); `between`, a kernel running between 7 and 8.
    fn post_norm_layer(r1: u64, between: bool) -> (Vec<Node>, Vec<Option<Plan>>, QkvMerge) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let f16 = |ne, addr| tensor(DType::F16, ne, addr);
        let quiet = node(Op::Unary(UnaryOp::Relu), f32([64, 1, 1, 1], 0xf000), vec![]);
        let (mut nodes, mut steps, merge) = layer(0xb000, 0x1000, quiet, true);
        nodes.truncate(5);
        steps.truncate(5);
        let v = |n: usize| vec![0; n];
        let kernel = |op: &str, params: Vec<i32>, ops: Vec<Tensor>| {
            let (ins, out) = ops.split_at(ops.len() - 1);
            Plan::Kernel {
                desc: KernelDesc {
                    op: op.into(),
                    op_params: params,
                    inputs: ins.iter().map(as_layout).collect(),
                    output: as_layout(&out[0]),
                    extra_outputs: Vec::new(),
                    f16_as_bf16: false,
                    n_kv_step: None,
                },
                operands: ops,
            }
        };
        let eps = |e: f32| vec![e.to_bits() as i32];
        let (a, o, h, d, out) = (0xc000, 0x20000, 0xe000, 0x21000, 0x7000);
        let x = f32([64, 1, 1, 1], 0x1000);
        let r1t = f32([64, 1, 1, 1], r1);
        let mut q = f32([32, 1, 2, 1], 0xb000);
        q.nb = [4, 128, 128, 256];
        let chain = [
            kernel(
                "FLASH_ATTN_EXT_MASK",
                vec![0.125f32.to_bits() as i32, 0, 50f32.to_bits() as i32],
                vec![
                    q,
                    f16([32, 16, 1, 1], 0x8000),
                    f16([32, 16, 1, 1], 0x9000),
                    f16([16, 1, 1, 1], 0xa000),
                    f32([32, 2, 1, 1], a),
                ],
            ),
            kernel(
                "MUL_MAT",
                v(0),
                vec![
                    f32([64, 64, 1, 1], 0x13000),
                    f32([64, 1, 1, 1], a),
                    f32([64, 1, 1, 1], o),
                ],
            ),
            kernel(
                "RMS_NORM_MUL_ADD",
                eps(1e-6),
                vec![
                    f32([64, 1, 1, 1], o),
                    x.clone(),
                    f32([64, 1, 1, 1], 0x22000),
                    r1t.clone(),
                ],
            ),
            kernel(
                "RMS_NORM_MUL_MAT_GEGLU",
                eps(1e-5),
                vec![
                    f32([64, 128, 1, 1], 0x14000),
                    f32([64, 128, 1, 1], 0x15000),
                    r1t.clone(),
                    f32([64, 1, 1, 1], 0x4000),
                    f32([128, 1, 1, 1], h),
                ],
            ),
            kernel(
                "MUL_MAT",
                v(0),
                vec![
                    f32([128, 64, 1, 1], 0x16000),
                    f32([128, 1, 1, 1], h),
                    f32([64, 1, 1, 1], d),
                ],
            ),
            kernel(
                "RMS_NORM_MUL_ADD",
                eps(2e-6),
                vec![
                    f32([64, 1, 1, 1], d),
                    r1t,
                    f32([64, 1, 1, 1], 0x23000),
                    f32([64, 1, 1, 1], out),
                ],
            ),
        ];
        for (i, plan) in chain.into_iter().enumerate() {
            let Plan::Kernel { operands, .. } = &plan else {
                unreachable!()
            };
            nodes.push(node(Op::MulMat, operands.last().unwrap().clone(), vec![]));
            steps.push(Some(plan));
            if between && i == 2 {
                let (dst, src) = (f32([64, 1, 1, 1], 0xf000), f32([64, 1, 1, 1], 0xf100));
                let relu = node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
                steps.push(Some(crate::ops::plan(&relu).unwrap()));
                nodes.push(relu);
            }
        }
        (nodes, steps, merge)
    }

    fn post_norm_merge(
        nodes: &[Node],
        steps: &[Option<Plan>],
        merge: &QkvMerge,
    ) -> Option<LayerMerge> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            Some(Plan::Skip) => Planned::Nothing,
            None => Planned::Covered,
            _ => Planned::Elsewhere,
        };
        merge_post_norm_layer(
            nodes,
            &planned,
            merge.at,
            &merge.desc,
            &merge.operands,
            [3, 4],
        )
    }

    #[test]
    fn a_gemma_decode_layer_s_kernels_merge_with_its_post_norms() {
        let (nodes, steps, merge) = post_norm_layer(0xd000, false);
        let layer = post_norm_merge(&nodes, &steps, &merge).expect("merges");
        assert_eq!(layer.at, 10);
        assert_eq!(layer.desc.op, "DECODE_LAYER_POST_NORM_GEGLU");
        let bits = |v: f32| v.to_bits() as i32;
        assert_eq!(
            layer.desc.op_params[12..],
            [
                bits(0.125),
                0,
                bits(50.0),
                bits(1e-5),
                0,
                bits(1e-6),
                bits(2e-6)
            ]
        );
        assert_eq!(layer.desc.inputs.len(), 16);
        assert_eq!(layer.desc.extra_outputs.len(), 8);
        assert_eq!(layer.absorbed, [5, 6, 7, 8, 9]);
        let addrs = |ts: &[Tensor]| ts.iter().map(|t| t.addr).collect::<Vec<_>>();
        let qkv = [0x10000, 0x11000, 0x12000, 0x1000, 0x2000, 0x3000];
        let rest = [
            0x8000, 0x9000, 0xa000, 0x13000, 0x14000, 0x15000, 0x16000, 0x4000, 0x22000, 0x23000,
            0x7000, 0xb000,
        ];
        assert_eq!(addrs(&layer.before_rows), [&qkv[..], &rest[..]].concat());
        assert_eq!(
            addrs(&layer.after_rows),
            [0xc000, 0xd000, 0xe000, 0x20000, 0x21000]
        );
        // r1 in the residual's memory (the ADD in place) merges; over part of o, or with a
        // kernel running between the norms, it does not.
        let (nodes, steps, merge) = post_norm_layer(0x1000, false);
        assert!(post_norm_merge(&nodes, &steps, &merge).is_some());
        let (nodes, steps, merge) = post_norm_layer(0x20010, false);
        assert!(post_norm_merge(&nodes, &steps, &merge).is_none());
        let (nodes, steps, merge) = post_norm_layer(0xd000, true);
        assert!(post_norm_merge(&nodes, &steps, &merge).is_none());
    }

    #[test]
    fn a_qwen_decode_layer_s_kernels_merge_with_their_biases_or_their_heads_norms() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        let quiet = || relu(f32(0xf000), f32(0xf100));
        let addrs = |ts: &[Tensor]| ts.iter().map(|t| t.addr).collect::<Vec<_>>();
        let shared = [0x10000, 0x11000, 0x12000, 0x1000, 0x2000, 0x3000];
        // The Q/K/V kernel's own inputs stay where its inputs have them: before the
        // attention's.
        let rest = [
            0x8000, 0x9000, 0xa000, 0x13000, 0x14000, 0x15000, 0x16000, 0x4000, 0x7000, 0xb000,
        ];
        // qwen2: Q's, K's and V's biases.
        let (nodes, steps, merge) = layer_of(0xb000, 0x1000, quiet(), true, Some("bias"));
        let layer = layer_merge(&nodes, &steps, &merge).expect("merges");
        assert_eq!(layer.desc.op, "DECODE_LAYER_BIAS_SWIGLU");
        assert_eq!(layer.desc.op_params.len(), 16);
        assert_eq!(layer.desc.op_params[12], 0.125f32.to_bits() as i32);
        assert_eq!(layer.desc.op_params[15], 1e-5f32.to_bits() as i32);
        assert_eq!(layer.desc.inputs.len(), 17);
        let biases = [0x17000, 0x18000, 0x19000];
        assert_eq!(
            addrs(&layer.before_rows),
            [&shared[..], &biases[..], &rest[..]].concat()
        );
        assert_eq!(addrs(&layer.after_rows), [0xc000, 0xd000, 0xe000]);
        // qwen3: Q's and K's head norm weights, and the heads' eps after the attention's words.
        let (nodes, steps, merge) = layer_of(0xb000, 0x1000, quiet(), true, Some("head_norm"));
        let layer = layer_merge(&nodes, &steps, &merge).expect("merges");
        assert_eq!(layer.desc.op, "DECODE_LAYER_HEAD_NORM_SWIGLU");
        assert_eq!(layer.desc.op_params.len(), 17);
        assert_eq!(layer.desc.op_params[..12], merge.desc.op_params[..12]);
        assert_eq!(layer.desc.op_params[12], 0.125f32.to_bits() as i32);
        assert_eq!(layer.desc.op_params[16], 1e-6f32.to_bits() as i32);
        assert_eq!(layer.desc.inputs.len(), 16);
        let norms = [0x17000, 0x18000];
        assert_eq!(
            addrs(&layer.before_rows),
            [&shared[..], &norms[..], &rest[..]].concat()
        );
        // Each operand of the merged kernel is what its description says: the inputs, then
        // the outputs before K's and V's rows.
        let layouts: Vec<Layout> = layer.before_rows.iter().map(as_layout).collect();
        let described: Vec<Layout> = layer
            .desc
            .inputs
            .iter()
            .chain([&layer.desc.output, &layer.desc.extra_outputs[0]])
            .cloned()
            .collect();
        assert_eq!(layouts, described);
        // A qwen layer with frequency factors has no kernel of its own: it stays two.
        let (nodes, steps, mut merge) = layer_of(0xb000, 0x1000, quiet(), true, Some("bias"));
        merge.desc.op = "RMS_NORM_QKV_BIAS_ROPE_FF".into();
        assert!(layer_merge(&nodes, &steps, &merge).is_none());
    }

    #[test]
    fn a_decode_layer_s_kernels_stay_apart_when_they_are_not_one_layer_s() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        let quiet = || relu(f32(0xf000), f32(0xf100));
        // A node that runs in between: the Q/K/V kernel would run after it.
        let (nodes, steps, merge) = layer(0xb000, 0x1000, quiet(), false);
        assert!(layer_merge(&nodes, &steps, &merge).is_none());
        // The attention's q is not this Q, or its residual not this x.
        let (nodes, steps, merge) = layer(0xb100, 0x1000, quiet(), true);
        assert!(layer_merge(&nodes, &steps, &merge).is_none());
        let (nodes, steps, merge) = layer(0xb000, 0x1100, quiet(), true);
        assert!(layer_merge(&nodes, &steps, &merge).is_none());
    }

    /// A normed gate/up pair of one x (0x1000) and norm weight (0x2000) as two
    /// RMS_NORM_MUL_MAT kernels (nodes 0 and 1, products at 0xa000 and 0xb000) and their
    /// SWIGLU (node 2, into `out`), then `after`.
    fn normed_pair_then_glu(out: u64, after: Vec<Node>) -> (Vec<Node>, Vec<Option<Plan>>) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let (x, n) = (f32([64, 1, 1, 1], 0x1000), f32([64, 1, 1, 1], 0x2000));
        let projection = |w: u64, p: u64| {
            let operands = vec![
                f32([64, 32, 1, 1], w),
                x.clone(),
                n.clone(),
                f32([32, 1, 1, 1], p),
            ];
            let plan = Plan::Kernel {
                desc: KernelDesc {
                    op: "RMS_NORM_MUL_MAT".into(),
                    op_params: vec![1e-6f32.to_bits() as i32],
                    inputs: operands[..3].iter().map(as_layout).collect(),
                    output: as_layout(&operands[3]),
                    extra_outputs: Vec::new(),
                    f16_as_bf16: false,
                    n_kv_step: None,
                },
                operands: operands.clone(),
            };
            (node(Op::MulMat, operands[3].clone(), vec![]), plan)
        };
        let (g, u) = (projection(0x10000, 0xa000), projection(0x20000, 0xb000));
        let glu = node(
            Op::Glu {
                name: "SWIGLU",
                act: UnaryOp::Silu,
            },
            f32([32, 1, 1, 1], out),
            vec![g.0.dst.clone(), u.0.dst.clone()],
        );
        let glu_plan = crate::ops::plan(&glu).unwrap();
        let mut nodes = vec![g.0, u.0, glu];
        let mut steps = vec![Some(g.1), Some(u.1), Some(glu_plan)];
        for extra in after {
            steps.push(Some(crate::ops::plan(&extra).unwrap()));
            nodes.push(extra);
        }
        (nodes, steps)
    }

    fn glu_fold_in(nodes: &[Node], steps: &[Option<Plan>]) -> Option<Rewritten> {
        let planned = |k: usize| match &steps[k] {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            _ => Planned::Elsewhere,
        };
        fold_glu(nodes, 2, planned)
    }

    #[test]
    fn a_normed_gate_and_up_pair_folds_into_its_glu() {
        // The GLU's output in memory the norm's output had (0x3000): no kernel reads it now.
        let (nodes, steps) = normed_pair_then_glu(0x3000, vec![]);
        let fold = glu_fold_in(&nodes, &steps).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[0, 1][..], 2));
        let (desc, operands) = (&fold.desc, &fold.operands);
        assert_eq!(desc.op, "RMS_NORM_MUL_MAT_SWIGLU");
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [0x10000, 0x20000, 0x1000, 0x2000, 0x3000]);
        // Over x: the kernel would overwrite what it reads.
        let (nodes, steps) = normed_pair_then_glu(0x1000, vec![]);
        assert!(glu_fold_in(&nodes, &steps).is_none());
        // A product read after the GLU.
        let reader = node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [32, 1, 1, 1], 0x5000),
            vec![tensor(DType::F32, [32, 1, 1, 1], 0xa000)],
        );
        let (nodes, steps) = normed_pair_then_glu(0x3000, vec![reader]);
        assert!(glu_fold_in(&nodes, &steps).is_none());
    }

    /// A planned step as the builders see it: `None` is a node another kernel computes.
    fn as_planned(step: &Option<Plan>) -> Planned<'_> {
        match step {
            Some(Plan::Kernel { desc, operands }) => Planned::Kernel(desc, operands),
            Some(Plan::Skip) => Planned::Nothing,
            Some(Plan::Host(_)) => Planned::Elsewhere,
            None => Planned::Covered,
        }
    }

    /// phi3's feed-forward projection of one token: x [64] at 0x1000 by W [64 x 64] at 0x10000
    /// (the gate's 32 rows, then the up projection's) into P at 0x2000, then SWIGLU of P's two
    /// halves into `out`.
    fn up_then_glu(out: u64) -> Vec<Node> {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let p = f32([64, 1, 1, 1], 0x2000);
        let glu = Op::Glu {
            name: "SWIGLU",
            act: UnaryOp::Silu,
        };
        vec![
            node(
                Op::MulMat,
                p.clone(),
                vec![f32([64, 64, 1, 1], 0x10000), f32([64, 1, 1, 1], 0x1000)],
            ),
            node(glu, f32([32, 1, 1, 1], out), vec![p]),
        ]
    }

    #[test]
    fn a_product_and_the_glu_of_its_two_halves_fuse_with_the_halves_of_the_rows() {
        let Some(Fusion {
            plan: Plan::Kernel { desc, operands },
            nodes: 2,
        }) = fuse_at(&up_then_glu(0x3000), PlanOptions::default())
        else {
            panic!("does not fuse");
        };
        assert_eq!(desc.op, "MUL_MAT_SWIGLU");
        assert_eq!(desc.inputs[0].ne, [64, 32, 1, 1]);
        // The gate's rows, the up projection's 32 rows of 256 bytes on, x, the output.
        let addrs: Vec<u64> = operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [0x10000, 0x10000 + 32 * 256, 0x1000, 0x3000]);
        // Swapped halves, the product read later, the output over x: no.
        let mut swapped = up_then_glu(0x3000);
        swapped[1].op_params[1] = 1;
        assert!(fuse_at(&swapped, PlanOptions::default()).is_none());
        let mut read = up_then_glu(0x3000);
        read.push(node(
            Op::Unary(UnaryOp::Relu),
            tensor(DType::F32, [64, 1, 1, 1], 0x5000),
            vec![read[0].dst.clone()],
        ));
        assert!(fuse_at(&read, PlanOptions::default()).is_none());
        assert!(fuse_at(&up_then_glu(0x1000), PlanOptions::default()).is_none());
    }

    #[test]
    fn a_normed_projection_of_both_halves_folds_into_the_glu() {
        // The norm folded into the projection (x 0x1000, n 0x4000), the GLU's output over the
        // norm's output (0x1800), which no kernel reads any more.
        let nodes = up_then_glu(0x1800);
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let operands = vec![
            f32([64, 64, 1, 1], 0x10000),
            f32([64, 1, 1, 1], 0x1000),
            f32([64, 1, 1, 1], 0x4000),
            nodes[0].dst.clone(),
        ];
        let normed = Plan::Kernel {
            desc: KernelDesc {
                op: "RMS_NORM_MUL_MAT".into(),
                op_params: vec![1e-6f32.to_bits() as i32],
                inputs: operands[..3].iter().map(as_layout).collect(),
                output: as_layout(&operands[3]),
                extra_outputs: Vec::new(),
                f16_as_bf16: false,
                n_kv_step: None,
            },
            operands,
        };
        let steps = [Some(normed), Some(crate::ops::plan(&nodes[1]).unwrap())];
        let fold = fold_glu(&nodes, 1, |k| as_planned(&steps[k])).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[0][..], 1));
        assert_eq!(fold.desc.op, "RMS_NORM_MUL_MAT_SWIGLU");
        let addrs: Vec<u64> = fold.operands.iter().map(|t| t.addr).collect();
        assert_eq!(addrs, [0x10000, 0x10000 + 32 * 256, 0x1000, 0x4000, 0x1800]);
    }

    /// phi3's Q, K and V of one token: x [64] at 0x1000 by W [64 x 48] at 0x10000 into P at
    /// 0x2000, viewed as Q (32 values), K and V (8 each) at nodes 1 to 3, each read by a RELU
    /// (nodes 4 to 6), then `after`.
    fn qkv_views(after: Vec<Node>) -> (Vec<Node>, Vec<Option<Plan>>) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let p = f32([48, 1, 1, 1], 0x2000);
        let view = |ne, offset: u64| node(Op::Layout, f32(ne, 0x2000 + offset), vec![p.clone()]);
        let relu = |src: &Node, out| {
            let v = &src.dst;
            node(Op::Unary(UnaryOp::Relu), f32(v.ne, out), vec![v.clone()])
        };
        let (q, k, v) = (
            view([16, 2, 1, 1], 0),
            view([8, 1, 1, 1], 128),
            view([8, 1, 1, 1], 160),
        );
        let readers = [relu(&q, 0x5000), relu(&k, 0x6000), relu(&v, 0x7000)];
        let mm = node(
            Op::MulMat,
            p.clone(),
            vec![f32([64, 48, 1, 1], 0x10000), f32([64, 1, 1, 1], 0x1000)],
        );
        let mut nodes = vec![mm, q, k, v];
        nodes.extend(readers);
        nodes.extend(after);
        let steps = nodes
            .iter()
            .map(|n| Some(crate::ops::plan(n).unwrap()))
            .collect();
        (nodes, steps)
    }

    fn split_in(nodes: &[Node], steps: &[Option<Plan>]) -> Vec<Rewritten> {
        split_projection(nodes, 0, |k| as_planned(&steps[k]))
    }

    #[test]
    fn a_product_read_through_views_of_its_rows_splits_into_a_kernel_per_view() {
        let (nodes, steps) = qkv_views(vec![]);
        let split = split_in(&nodes, &steps);
        let at: Vec<usize> = split.iter().map(|r| r.at).collect();
        assert_eq!(at, [1, 2, 3]);
        for (r, (first, rows)) in split.iter().zip([(0u64, 32), (32, 8), (40, 8)]) {
            assert_eq!(r.covers, [0]);
            assert_eq!(r.desc.op, "MUL_MAT");
            // The weight rows that make the view's rows, into the view's memory.
            assert_eq!(r.operands[0].addr, 0x10000 + first * 256);
            assert_eq!(r.operands[0].ne, [64, rows, 1, 1]);
            assert_eq!(r.operands[1].addr, 0x1000);
            assert_eq!(r.operands[2].addr, 0x2000 + first * 4);
            assert_eq!(r.desc.output.ne, [rows, 1, 1, 1]);
        }
    }

    #[test]
    fn a_product_read_whole_or_of_several_tokens_stays_one_kernel() {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let relu = |out, src| node(Op::Unary(UnaryOp::Relu), f32([48, 1, 1, 1], out), vec![src]);
        // P read whole after the views.
        let (nodes, steps) = qkv_views(vec![relu(0x8000, f32([48, 1, 1, 1], 0x2000))]);
        assert!(split_in(&nodes, &steps).is_empty());
        // x overwritten between the projection and a view: the view's kernel would read it.
        let (mut nodes, mut steps) = qkv_views(vec![]);
        let writer = relu(0x1000, f32([48, 1, 1, 1], 0x9000));
        steps.insert(2, Some(crate::ops::plan(&writer).unwrap()));
        nodes.insert(2, writer);
        assert!(split_in(&nodes, &steps).is_empty());
        // A view's rows read before its node.
        let (mut nodes, mut steps) = qkv_views(vec![]);
        let early = node(
            Op::Unary(UnaryOp::Relu),
            f32([8, 1, 1, 1], 0x9000),
            vec![f32([8, 1, 1, 1], 0x2000 + 160)],
        );
        steps.insert(1, Some(crate::ops::plan(&early).unwrap()));
        nodes.insert(1, early);
        assert!(split_in(&nodes, &steps).is_empty());
        // Two tokens: a view's rows are not all the weights' rows.
        let (mut nodes, mut steps) = qkv_views(vec![]);
        nodes[0].src[1] = Some(f32([64, 2, 1, 1], 0x1000));
        nodes[0].dst = f32([48, 2, 1, 1], 0x2000);
        steps[0] = Some(crate::ops::plan(&nodes[0]).unwrap());
        assert!(split_in(&nodes, &steps).is_empty());
    }

    /// phi3's attention: q_raw [16, 2] at 0x1000 scaled by `scale` (SCALE, bias `bias`) into q
    /// at 0x2000, then the attention kernel (scale 0.5) of q, K, V and the mask into 0x3000,
    /// then `after`.
    fn scaled_attention(bias: f32, after: Vec<Node>) -> (Vec<Node>, Vec<Option<Plan>>) {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let f16 = |ne, addr| tensor(DType::F16, ne, addr);
        let q = f32([16, 2, 1, 1], 0x2000);
        let mut scale = node(Op::Scale, q.clone(), vec![f32([16, 2, 1, 1], 0x1000)]);
        scale.op_params[0] = 0.25f32.to_bits() as i32;
        scale.op_params[1] = bias.to_bits() as i32;
        let inputs = vec![
            q,
            f16([16, 8, 1, 1], 0x10000),
            f16([16, 8, 1, 1], 0x11000),
            f16([8, 1, 1, 1], 0x12000),
        ];
        let out = f32([16, 2, 1, 1], 0x3000);
        let attention = Plan::Kernel {
            desc: KernelDesc {
                op: "FLASH_ATTN_EXT_MASK".into(),
                op_params: vec![0.5f32.to_bits() as i32, 0, 0],
                inputs: inputs.iter().map(as_layout).collect(),
                output: as_layout(&out),
                extra_outputs: Vec::new(),
                f16_as_bf16: false,
                n_kv_step: None,
            },
            operands: [&inputs[..], std::slice::from_ref(&out)].concat(),
        };
        let mut nodes = vec![scale.clone(), node(Op::FlashAttnExt, out, inputs)];
        let mut steps = vec![Some(crate::ops::plan(&scale).unwrap()), Some(attention)];
        for n in after {
            steps.push(Some(crate::ops::plan(&n).unwrap()));
            nodes.push(n);
        }
        (nodes, steps)
    }

    #[test]
    fn a_scaled_q_folds_into_the_attention_s_scale() {
        let (nodes, steps) = scaled_attention(0.0, vec![]);
        let fold = fold_scale_into_attention(&nodes, 1, |k| as_planned(&steps[k])).expect("folds");
        assert_eq!((&fold.covers[..], fold.at), (&[0][..], 1));
        assert_eq!(fold.desc.op_params[0], 0.125f32.to_bits() as i32);
        assert_eq!(fold.operands[0].addr, 0x1000);
        assert_eq!(fold.operands[0].ne, [16, 2, 1, 1]);
        // A bias, or the scaled q read by another node: no.
        let (nodes, steps) = scaled_attention(1.0, vec![]);
        assert!(fold_scale_into_attention(&nodes, 1, |k| as_planned(&steps[k])).is_none());
        let f32 = |addr| tensor(DType::F32, [16, 2, 1, 1], addr);
        let reader = node(Op::Unary(UnaryOp::Relu), f32(0x4000), vec![f32(0x2000)]);
        let (nodes, steps) = scaled_attention(0.0, vec![reader]);
        assert!(fold_scale_into_attention(&nodes, 1, |k| as_planned(&steps[k])).is_none());
    }

    #[test]
    fn a_permuted_q_of_several_tokens_folds_its_scale_and_may_share_q_s_memory() {
        // gemma: Q [16, 2 heads, 3 tokens] at 0x1000 scaled into 0x2000, the attention's q its
        // permuted view [16, 3, 2], the output [16, 2, 3] at `out`.
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let f16 = |ne, addr| tensor(DType::F16, ne, addr);
        let attention_at = |out: u64| {
            let scaled = f32([16, 2, 3, 1], 0x2000);
            let mut scale = node(Op::Scale, scaled.clone(), vec![f32([16, 2, 3, 1], 0x1000)]);
            scale.op_params[0] = 0.25f32.to_bits() as i32;
            let mut q = f32([16, 3, 2, 1], 0x2000);
            q.nb = [4, scaled.nb[2], scaled.nb[1], scaled.nb[3]];
            let inputs = vec![
                q,
                f16([16, 8, 1, 1], 0x10000),
                f16([16, 8, 1, 1], 0x11000),
                f16([8, 3, 1, 1], 0x12000),
            ];
            let out = f32([16, 2, 3, 1], out);
            let attention = Plan::Kernel {
                desc: KernelDesc {
                    op: "FLASH_ATTN_EXT_MASK".into(),
                    op_params: vec![0.5f32.to_bits() as i32, 0, 0],
                    inputs: inputs.iter().map(as_layout).collect(),
                    output: as_layout(&out),
                    extra_outputs: Vec::new(),
                    f16_as_bf16: false,
                    n_kv_step: None,
                },
                operands: [&inputs[..], std::slice::from_ref(&out)].concat(),
            };
            let steps = vec![Some(crate::ops::plan(&scale).unwrap()), Some(attention)];
            (vec![scale, node(Op::FlashAttnExt, out, inputs)], steps)
        };
        for out in [0x3000, 0x1000] {
            let (nodes, steps) = attention_at(out);
            let fold = fold_scale_into_attention(&nodes, 1, |k| as_planned(&steps[k]));
            let q = fold.expect("folds").operands[0].clone();
            assert_eq!(
                (q.addr, q.ne, q.nb),
                (0x1000, [16, 3, 2, 1], [4, 128, 64, 384])
            );
        }
        // The output over part of Q: no.
        let (nodes, steps) = attention_at(0x1040);
        assert!(fold_scale_into_attention(&nodes, 1, |k| as_planned(&steps[k])).is_none());
    }
}
