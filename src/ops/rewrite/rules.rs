//! The rules every rewrite checks before a kernel takes over other nodes' work: ggml's allocator
//! gives the memory of dead tensors to later ones, and a fused kernel reads its inputs and writes
//! its outputs at one node, so nothing else may read what the absorbed nodes wrote, nothing in
//! between may write what the kernel reads, and its outputs may overlap none of its inputs.

use super::Planned;
use crate::ops::tensor::{Node, Tensor};

/// Whether `p` and `q` are the same tensor (address, type, shape and strides).
pub fn same(p: &Tensor, q: &Tensor) -> bool {
    p.addr == q.addr && p.ne == q.ne && p.nb == q.nb && p.dtype == q.dtype
}

/// Whether a node of `later` reads `t` before a node overwrites its memory: ggml's allocator
/// gives the memory of dead tensors to later ones, so what is read there afterwards is not `t`.
pub fn read_later(t: &Tensor, later: &[Node]) -> bool {
    for n in later {
        if n.reads(t) {
            return true;
        }
        if n.dst.overlaps(t) {
            return false;
        }
    }
    false
}

/// Whether a node after `from` other than `reader` (and those `counts` leaves out: views,
/// nodes another kernel computes) reads `t` before `reader` or a node after it overwrites its
/// memory (a reader computed in place, as ggml's allocator may put a ROPE's output over its
/// input, ends `t` too). A fold whose kernel runs at `reader` never writes `t`, so no other node
/// may need it.
pub fn read_elsewhere(
    nodes: &[Node],
    t: &Tensor,
    from: usize,
    reader: usize,
    counts: impl Fn(usize) -> bool,
) -> bool {
    for (j, node) in nodes.iter().enumerate().skip(from + 1) {
        if j != reader && counts(j) && node.reads(t) {
            return true;
        }
        if j >= reader && node.dst.overlaps(t) {
            break;
        }
    }
    false
}

/// Whether a node of `range` that `counts` keeps writes any of `tensors`: a kernel moved past
/// those nodes would read the new values.
pub fn written_in(
    nodes: &[Node],
    range: std::ops::Range<usize>,
    tensors: &[&Tensor],
    counts: impl Fn(usize) -> bool,
) -> bool {
    range
        .filter(|&j| counts(j))
        .any(|j| tensors.iter().any(|t| nodes[j].dst.overlaps(t)))
}

/// The last node before `at` writing `t`'s memory, and the node whose kernel computes it (the
/// first of its run when a fused kernel covers it).
pub fn kernel_writing<'a>(
    nodes: &[Node],
    at: usize,
    t: &Tensor,
    planned: &impl Fn(usize) -> Planned<'a>,
) -> Option<(usize, usize)> {
    let writer = (0..at)
        .rev()
        .find(|&k| !matches!(planned(k), Planned::Nothing) && nodes[k].dst.overlaps(t))?;
    let mut k = writer;
    while matches!(planned(k), Planned::Covered) {
        k = k.checked_sub(1)?;
    }
    Some((writer, k))
}

/// What node `j`'s step reads and writes where it runs: a kernel its operands (the inputs,
/// then its outputs), a node the host or the CPU computes its sources and its output; a view,
/// or a node a kernel elsewhere computes, nothing here.
pub fn step_io<'a>(
    nodes: &'a [Node],
    j: usize,
    planned: Planned<'a>,
) -> (Vec<&'a Tensor>, Vec<&'a Tensor>) {
    match planned {
        Planned::Kernel(desc, operands) => {
            let inputs = operands.len().saturating_sub(1 + desc.extra_outputs.len());
            let (read, written) = operands.split_at(inputs);
            (read.iter().collect(), written.iter().collect())
        }
        Planned::Elsewhere => (nodes[j].src.iter().flatten().collect(), vec![&nodes[j].dst]),
        Planned::Covered | Planned::Nothing => (Vec::new(), Vec::new()),
    }
}
