//! KV lengths given at dispatch. An attention (a decode step's, or a prompt's after earlier
//! turns) reads the first n_kv rows of the KV cache, and llama.cpp grows n_kv in steps of 256
//! with the context (`llama_kv_cache::get_n_kv`). A kernel whose name carried n_kv would be compiled, and loaded
//! as a new PDI, every 256 tokens of a conversation. When the compiler builds the kernel for
//! every n_kv up to the cache's rows (it declares `run_time_n_kv`), the kernel is asked for at
//! that size (`KernelDesc::n_kv_step`) and told n_kv at each dispatch: one kernel from the first
//! token to the context's end.

use super::fused::Fused;
use super::{Rewritten, Step};
use crate::kernels::{KernelDesc, Layout};
use crate::op_catalogue as catalogue;
use crate::ops::tensor::{Node, Op, Tensor};

/// The granularity of n_kv: llama.cpp pads it to a multiple of 256 (the last step may be the
/// cache's size, which then takes the fixed kernel).
pub const STEP: u32 = 256;

/// The most tokens of a decode step whose fused attention is asked for told n_kv, and that a
/// layer kernel takes: several sequences of one cache side by side or a draft's verification
/// batch, which the IRON package's fused attention takes at once. A prompt's (more rows) keeps
/// the graph's length.
pub(super) const STEP_TOKENS: i64 = 8;

/// Makes `r` take its KV length at dispatch when it attends over a KV cache that a SET_ROWS of
/// `nodes` writes (the cache's rows are then known) and the kernel store provides that kernel.
pub(super) fn at_run_time(
    r: &mut Rewritten,
    nodes: &[Node],
    available: &dyn Fn(&KernelDesc) -> bool,
) {
    if let Some(n) = told_n_kv(&mut r.desc, &r.operands, nodes, available) {
        r.n_kv = Some(n);
    }
}

/// [`at_run_time`] for the kernels planned node by node (a decode step's FLASH_ATTN_EXT_MASK),
/// before the rewrites fold them into others.
pub(super) fn steps_at_run_time<K>(
    steps: &mut [Step<K>],
    nodes: &[Node],
    available: &dyn Fn(&KernelDesc) -> bool,
) {
    for step in steps.iter_mut() {
        if let Step::Kernel(k) = step {
            if k.loaded.is_none() && k.n_kv.is_none() {
                k.n_kv = told_n_kv(&mut k.desc, &k.operands, nodes, available);
            }
        }
    }
}

/// The input index of an attention's K cache view (V's and the mask's follow), in a kernel
/// with one; `None` for other kernels.
fn kv_index(desc: &KernelDesc) -> Option<usize> {
    if desc.op == catalogue::FLASH_ATTN_EXT_MASK.name {
        return Some(1);
    }
    Fused::of(&desc.op).and_then(Fused::kv_inputs)
}

/// [`kv_index`] of a kernel that may take its KV length at dispatch: the lone attention of any
/// query rows (a decode step's or a prompt's), a fused one of a decode step (out [K, T], T up
/// to [`STEP_TOKENS`]).
fn kv_input(desc: &KernelDesc) -> Option<usize> {
    let k = kv_index(desc)?;
    (desc.op == catalogue::FLASH_ATTN_EXT_MASK.name || desc.output.ne[1] <= STEP_TOKENS)
        .then_some(k)
}

/// Rewrites `desc` to take its KV length at dispatch and returns that length (the graph's,
/// `operands`' K view's rows); `None`, `desc` untouched, when it cannot. A desc that takes it
/// already (a layer merged from its attention) returns it.
fn told_n_kv(
    desc: &mut KernelDesc,
    operands: &[Tensor],
    nodes: &[Node],
    available: &dyn Fn(&KernelDesc) -> bool,
) -> Option<u32> {
    let Some(k) = kv_input(desc) else {
        // Folded from an attention told its KV length into a kernel that takes none (the
        // attention and block of a prompt): named by the graph's length again.
        let n = kv_index(desc)
            .and_then(|k| operands.get(k))
            .map(|t| t.ne[1]);
        let named = n.and_then(|n| named_by_n_kv(desc, u32::try_from(n).ok()?));
        if let Some(named) = named {
            *desc = named;
        }
        return None;
    };
    if desc.inputs.len() < k + 3 || operands.len() < k + 3 {
        return None;
    }
    // n_kv is what the graph's K view has (the operands keep the graph's shapes).
    let n = operands[k].ne[1];
    if desc.n_kv_step.is_some() {
        return u32::try_from(n).ok();
    }
    let (kl, vl, ml) = (&desc.inputs[k], &desc.inputs[k + 1], &desc.inputs[k + 2]);
    let step = i64::from(STEP);
    let lengths = [kl.ne[1], vl.ne[1], ml.ne[0]];
    if n <= 0 || n % step != 0 || lengths != [n; 3] || !ml.is_dense() {
        return None;
    }
    let kr = cache_rows(kl, &operands[k], nodes)?;
    let vr = cache_rows(vl, &operands[k + 1], nodes)?;
    let most = kr.min(vr) / step * step;
    let n_kv = u32::try_from(n).ok()?;
    let mut mask_ne = ml.ne;
    mask_ne[0] = most;
    let mask = Layout::dense(&ml.dtype, mask_ne)?;
    let mut told = desc.clone();
    told.inputs[k].ne[1] = most;
    told.inputs[k + 1].ne[1] = most;
    told.inputs[k + 2] = mask;
    told.n_kv_step = Some(STEP);
    if most < n || !available(&told) {
        return None;
    }
    *desc = told;
    Some(n_kv)
}

/// The kernel of `desc` (told its KV length at dispatch) named by `n_kv` instead: the K and V
/// rows and the mask's row `n_kv` long, as the graph has them. What a step runs when the
/// compiler refuses to build the kernel for every length (a cache too long for the design).
pub fn named_by_n_kv(desc: &KernelDesc, n_kv: u32) -> Option<KernelDesc> {
    desc.n_kv_step?;
    let k = kv_index(desc)?;
    let n = i64::from(n_kv);
    let mut named = desc.clone();
    named.n_kv_step = None;
    named.inputs.get_mut(k)?.ne[1] = n;
    named.inputs.get_mut(k + 1)?.ne[1] = n;
    let m = named.inputs.get(k + 2)?;
    let mut ne = m.ne;
    ne[0] = n;
    named.inputs[k + 2] = Layout::dense(&m.dtype, ne)?;
    Some(named)
}

/// The rows a view of a KV cache (dimension 1 its rows, as the attention reads K and V) can
/// take before it leaves the cache: the output of the SET_ROWS node writing the memory it
/// starts in.
fn cache_rows(layout: &Layout, t: &Tensor, nodes: &[Node]) -> Option<i64> {
    let cache = nodes
        .iter()
        .filter(|n| n.op == Op::SetRows)
        .map(|n| &n.dst)
        .find(|c| c.memory == t.memory && c.addr <= t.addr && t.addr < c.addr + c.bytes)?;
    let end = cache.addr + cache.bytes;
    let room = end.checked_sub(t.addr + t.bytes)?;
    let row = layout.nb[1];
    if row == 0 {
        return None;
    }
    layout.ne[1].checked_add(i64::try_from(room / row).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::rewrite::fused::Glu;
    use crate::ops::tensor::test_util::{node, tensor};
    use crate::ops::tensor::DType;

    /// A FLASH_ATTN_FFN_SWIGLU kernel over the first `n` rows of a 64-wide f16 cache of `rows`
    /// rows at 0x100000, one KV head, and the SET_ROWS writing that cache.
    fn case(n: i64, rows: i64) -> (Rewritten, Vec<Node>) {
        let cache = tensor(DType::F16, [64, rows, 1, 1], 0x10_0000);
        let mut view = cache.clone();
        view.ne[1] = n;
        view.bytes = (64 * 2 * n) as u64;
        let mask = tensor(DType::F16, [n, 1, 1, 1], 0x1000);
        let q = tensor(DType::F32, [64, 1, 1, 1], 0x2000);
        let set_rows = node(
            Op::SetRows,
            cache,
            vec![
                tensor(DType::F32, [64, 1, 1, 1], 0x3000),
                tensor(DType::I64, [1, 1, 1, 1], 0x4000),
            ],
        );
        let layout = |t: &Tensor| Layout {
            dtype: t.dtype.name().to_owned(),
            ne: t.ne,
            nb: t.nb,
        };
        let desc = KernelDesc {
            op: Fused::FlashAttnFfn(Glu::Swiglu).name(),
            op_params: vec![],
            inputs: vec![layout(&q), layout(&view), layout(&view), layout(&mask)],
            output: layout(&q),
            extra_outputs: vec![],
            f16_as_bf16: false,
            n_kv_step: None,
        };
        let r = Rewritten::kernel(
            1,
            vec![],
            desc,
            vec![q.clone(), view.clone(), view, mask, q],
        );
        (r, vec![set_rows])
    }

    #[test]
    fn a_decode_attention_is_asked_for_at_the_cache_s_rows_and_told_n_kv() {
        let (mut r, nodes) = case(512, 4608 + 100);
        at_run_time(&mut r, &nodes, &|_| true);
        assert_eq!((r.desc.n_kv_step, r.n_kv), (Some(STEP), Some(512)));
        assert_eq!(
            (r.desc.inputs[1].ne[1], r.desc.inputs[2].ne[1]),
            (4608, 4608)
        );
        assert_eq!(r.desc.inputs[3].ne[0], 4608);
        assert!(r.desc.inputs[3].is_dense());
        assert!(r.desc.canonical_name().ends_with("-kv256"));
        // Named by its length, it is the kernel the graph asked for.
        let (plain, _) = case(512, 4608 + 100);
        assert_eq!(named_by_n_kv(&r.desc, 512), Some(plain.desc));
        // The same kernel at another length.
        let (mut other, nodes) = case(1024, 4608 + 100);
        at_run_time(&mut other, &nodes, &|_| true);
        assert_eq!(other.desc, r.desc);
        assert_eq!(other.n_kv, Some(1024));
        // Operands keep what the graph has: the dispatch reads n_kv rows.
        assert_eq!(other.operands[1].ne[1], 1024);
    }

    #[test]
    fn a_planned_attention_of_any_query_rows_is_told_n_kv() {
        for (rows, told) in [(1, Some(512)), (4, Some(512))] {
            let (r, nodes) = case(512, 4608);
            let mut desc = r.desc.clone();
            desc.op = catalogue::FLASH_ATTN_EXT_MASK.name.to_owned();
            desc.inputs[0].ne[1] = rows;
            let mut steps = vec![Step::<()>::Kernel(crate::ops::rewrite::KernelStep {
                desc,
                operands: r.operands[..4].to_vec(),
                covers: vec![],
                rows: vec![],
                fallback: vec![],
                n_kv: None,
                loaded: None,
                pieces: None,
                row_copy: None,
                rows_copies: Vec::new(),
            })];
            steps_at_run_time(&mut steps, &nodes, &|_| true);
            let Step::Kernel(k) = &steps[0] else {
                unreachable!()
            };
            assert_eq!(k.n_kv, told, "{rows} query rows");
            assert_eq!(k.desc.n_kv_step.is_some(), told.is_some());
        }
        // The attention and the block of a decode step's tokens are told n_kv; of a prompt's
        // they stay named by n_kv, and are named by it again when folded from an attention
        // told it.
        let (mut step, nodes) = case(512, 4608);
        step.desc.output.ne[1] = STEP_TOKENS;
        at_run_time(&mut step, &nodes, &|_| true);
        assert_eq!((step.desc.n_kv_step, step.n_kv), (Some(STEP), Some(512)));
        let (mut r, nodes) = case(512, 4608);
        r.desc.output.ne[1] = STEP_TOKENS + 1;
        let before = r.clone();
        at_run_time(&mut r, &nodes, &|_| true);
        assert_eq!(r, before);
        let (mut told, nodes) = case(512, 4608);
        at_run_time(&mut told, &nodes, &|_| true);
        assert_eq!(told.n_kv, Some(512));
        told.desc.output.ne[1] = STEP_TOKENS + 1;
        told.n_kv = None;
        at_run_time(&mut told, &nodes, &|_| true);
        assert_eq!((told.desc, told.n_kv), (before.desc, None));
    }

    #[test]
    fn lengths_off_the_step_no_cache_or_no_such_kernel_keep_the_fixed_kernel() {
        for (n, rows, available, cache) in [
            (500, 4608, true, true),
            (512, 4608, false, true),
            (512, 4608, true, false),
        ] {
            let (mut r, nodes) = case(n, rows);
            let before = r.clone();
            let nodes = if cache { nodes } else { vec![] };
            at_run_time(&mut r, &nodes, &|_| available);
            assert_eq!(r, before, "n {n} available {available} cache {cache}");
        }
    }
}
