//! A prompt's activations that only GEMMs read, written as bf16 into scratch memory.
//!
//! The prompt's GEMMs over block-quantized weights (moved as bytes, decoded on the cores) round
//! their activations to bf16 on the cores, and the activations' bytes bind them: the array's
//! rows each receive every A tile once per N round, f32 through 4-byte-a-cycle channels
//! (`docs/perf.md`, "The timing model"). A producer that writes bf16 halves those bytes with
//! the same values (the cores rounded the f32 to nearest even, as the producer does).
//!
//! [`to_move`] finds such activations: the output of a node whose kernel can write bf16
//! ([`PRODUCERS`]), of at least [`MIN_ROWS`] rows (a prompt's: a decode step's few rows take the
//! GEMV, which reads f32), that nothing reads but MUL_MATs over block-quantized weights (through
//! views), and that the application does not read. [`narrow`] gives each of them bf16 memory of
//! its own (the stream's scratch buffer) and rewrites the producer, the views and the MUL_MATs
//! to use it. Outputs whose lives do not overlap share scratch memory. The stream plans the
//! graph again without the moves if one of those nodes ends up on ggml's CPU backend, which
//! reads the graph's own memory.

use super::pieces;
use super::tensor::{BinaryOp, DType, Memory, Node, Op, Tensor};

/// Alignment of each moved output in the scratch buffer.
const ALIGN: u64 = 64;

/// Rows an activation has at least to move: a prompt's (the decode steps of a few sequences
/// keep their rows in f32 for the GEMV).
pub const MIN_ROWS: i64 = pieces::MIN_ROWS;

/// The ops whose kernels write a bf16 output from f32 inputs: the GLUs (a feed-forward block's
/// hidden activations, read by its down projection) and MUL (a norm's weighting: llama's
/// attn_norm, read by Q, K and V, and ffn_norm, read by the gate and up projections; the
/// RMS_NORM_MUL kernel they fuse into writes bf16 too).
fn produces_bf16(op: &Op) -> bool {
    matches!(op, Op::Glu { .. } | Op::Binary(BinaryOp::Mul))
}

/// An activation to write as bf16.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// The node producing it.
    pub node: usize,
    /// The views of it and the MUL_MATs reading it, in order.
    pub readers: Vec<usize>,
    /// Where it goes in the scratch buffer.
    pub offset: u64,
}

/// The activations to move and the scratch bytes they take. `plans` says whether the device
/// runs a node as it would be after the move (the producer writing bf16, each MUL_MAT reading
/// it).
pub fn to_move(nodes: &[Node], plans: impl Fn(&Node) -> bool) -> (Vec<Move>, u64) {
    let mut moves = Vec::new();
    // (offset, bytes, last reader) of the moves so far: a later move takes memory no live one
    // holds.
    let mut held: Vec<(u64, u64, usize)> = Vec::new();
    let mut size = 0;
    for (f, node) in nodes.iter().enumerate() {
        let a = &node.dst;
        if !produces_bf16(&node.op)
            || node.is_output
            || a.dtype != DType::F32
            || !a.is_contiguous()
            || a.ne[1] * a.ne[2] * a.ne[3] < MIN_ROWS
        {
            continue;
        }
        let Some(readers) = gemm_readers(nodes, f) else {
            continue;
        };
        // The producer and its readers as the move leaves them (the rest of the graph is not
        // copied: one check per candidate on the planning path).
        let mut part: Vec<Node> = [f]
            .iter()
            .chain(&readers)
            .map(|&i| nodes[i].clone())
            .collect();
        let one = [Move {
            node: 0,
            readers: (1..part.len()).collect(),
            offset: 0,
        }];
        part = narrow(&part, &one, 0, a.memory);
        if !part.iter().all(|n| n.op == Op::Layout || plans(n)) {
            continue;
        }
        let bytes = (a.bytes / 2).next_multiple_of(ALIGN);
        let last = *readers.last().expect("at least one reader");
        held.retain(|&(_, _, end)| end >= f);
        held.sort_unstable();
        let mut offset = 0;
        for &(o, b, _) in &held {
            if offset + bytes <= o {
                break;
            }
            offset = offset.max(o + b);
        }
        held.push((offset, bytes, last));
        size = size.max(offset + bytes);
        moves.push(Move {
            node: f,
            readers,
            offset,
        });
    }
    (moves, size)
}

/// The views of node `f`'s output and the MUL_MATs reading it (as their activations, over
/// block-quantized weights), up to the next write of its memory; `None` when anything else
/// reads it.
fn gemm_readers(nodes: &[Node], f: usize) -> Option<Vec<usize>> {
    let a = &nodes[f].dst;
    let mut readers = Vec::new();
    let mut gemms = 0;
    for (j, node) in nodes.iter().enumerate().skip(f + 1) {
        let reads = node.src.iter().flatten().any(|s| s.overlaps(a));
        if node.op == Op::Layout {
            if reads {
                // A view passes the memory on; one that is itself read later is checked as
                // its readers are (they read the same memory).
                if node.is_output {
                    return None;
                }
                readers.push(j);
            }
            continue;
        }
        if reads {
            let gemm = node.op == Op::MulMat
                && node
                    .src(0)
                    .is_some_and(|w| moves_as_bytes(w) && !w.overlaps(a))
                && node
                    .src(1)
                    .is_some_and(|x| x.overlaps(a) && x.dtype == DType::F32);
            if !gemm || node.dst.overlaps(a) {
                return None;
            }
            gemms += 1;
            readers.push(j);
            continue;
        }
        if node.dst.overlaps(a) {
            break;
        }
    }
    (gemms > 0).then_some(readers)
}

/// Block-quantized weights, which the GEMM moves as bytes and decodes on the cores. (f16
/// weights, decoded so too, are left out: a few-row product of them may fuse with its GLU,
/// which reads f32, and their GEMM is bound by its cores, so the bytes saved gain little.)
fn moves_as_bytes(w: &Tensor) -> bool {
    matches!(w.dtype, DType::Quant(_))
}

/// `nodes` with each move's output as bf16 at `base + offset` in `memory` (the scratch
/// buffer), as its producer writes it and its views and MUL_MATs read it: every byte offset
/// and stride halved (the f32 layout's elements, two bytes each).
pub fn narrow(nodes: &[Node], moves: &[Move], base: u64, memory: Memory) -> Vec<Node> {
    let mut out = nodes.to_vec();
    for m in moves {
        let a = nodes[m.node].dst.clone();
        let narrowed = |t: &Tensor| Tensor {
            dtype: DType::Bf16,
            addr: base + m.offset + (t.addr - a.addr) / 2,
            nb: t.nb.map(|b| b / 2),
            bytes: t.bytes / 2,
            memory,
            ..t.clone()
        };
        super::relocate::move_output(&mut out, m.node, &m.readers, &a, narrowed);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tensor::test_util::{self, node, tensor};
    use crate::ops::UnaryOp;

    const ROWS: i64 = 32;

    fn f32(ne: [i64; 4], addr: u64) -> Tensor {
        tensor(DType::F32, ne, addr)
    }

    fn glu(dst: Tensor) -> Node {
        let act = UnaryOp::Silu;
        let (x, g) = (f32(dst.ne, 0x1000), f32(dst.ne, 0x9000));
        node(
            Op::Glu {
                name: "SWIGLU",
                act,
            },
            dst,
            vec![x, g],
        )
    }

    /// q4_0 weights [64, 32] at 0x40000: rows of two 18-byte blocks.
    fn q4_0() -> Tensor {
        Tensor {
            dtype: test_util::q4_0(),
            ne: [64, 32, 1, 1],
            nb: [18, 36, 36 * 32, 36 * 32],
            addr: 0x40000,
            bytes: 36 * 32,
            memory: Memory::Device(0),
        }
    }

    /// A product of q4_0 weights by `x` into `out`.
    fn down(x: Tensor, out: u64) -> Node {
        node(Op::MulMat, f32([32, ROWS, 1, 1], out), vec![q4_0(), x])
    }

    /// Two feed-forward blocks' GLUs into h at 0x10000 (0) and h2 at 0x20000 (1), a view of
    /// h (2), their down projections (3, 4), the residual ADD of the first (5), then a third
    /// GLU into h's memory (6) and its projection (7).
    fn blocks() -> Vec<Node> {
        let h = f32([64, ROWS, 1, 1], 0x10000);
        let h2 = f32([64, ROWS, 1, 1], 0x20000);
        vec![
            glu(h.clone()),
            glu(h2.clone()),
            node(Op::Layout, h.clone(), vec![h.clone()]),
            down(h.clone(), 0x30000),
            down(h2, 0x50000),
            node(
                Op::Binary(BinaryOp::Add),
                f32([32, ROWS, 1, 1], 0x60000),
                vec![f32([32, ROWS, 1, 1], 0x30000)],
            ),
            glu(h.clone()),
            down(h, 0x70000),
        ]
    }

    #[test]
    fn hidden_activations_the_down_projections_read_become_bf16_in_scratch() {
        let nodes = blocks();
        let (moves, size) = to_move(&nodes, |_| true);
        let at: Vec<(usize, &[usize], u64)> = moves
            .iter()
            .map(|m| (m.node, &m.readers[..], m.offset))
            .collect();
        // Each GLU's output, 64 x 32 bf16 (4 KiB): the first two live at once, the third
        // after both.
        assert_eq!(
            at,
            [(0, &[2, 3][..], 0), (1, &[4][..], 4096), (6, &[7][..], 0)]
        );
        assert_eq!(size, 8192);
        let moved = narrow(&nodes, &moves, 0x80000, Memory::Device(0));
        let h = &moved[0].dst;
        assert_eq!(
            (h.dtype, h.addr, h.nb, h.bytes),
            (DType::Bf16, 0x80000, [2, 128, 4096, 4096], 4096)
        );
        assert_eq!(moved[2].dst, *h);
        assert_eq!(moved[2].src[0].as_ref(), Some(h));
        assert_eq!(moved[3].src[1].as_ref(), Some(h));
        assert_eq!(moved[4].src[1].as_ref().map(|t| t.addr), Some(0x81000));
        // The weights, the products, the ADD and the GLUs' inputs are untouched.
        assert_eq!(moved[3].src[0], nodes[3].src[0]);
        assert_eq!(moved[3].dst, nodes[3].dst);
        assert_eq!(moved[5], nodes[5]);
        assert_eq!(moved[0].src, nodes[0].src);
    }

    #[test]
    fn activations_stay_f32_where_anything_else_reads_them() {
        let first = || {
            let b = blocks();
            vec![b[0].clone(), b[2].clone(), b[3].clone()]
        };
        assert_eq!(to_move(&first(), |_| true).0.len(), 1);
        // Another kind of reader.
        let mut nodes = first();
        let relu = Op::Unary(UnaryOp::Relu);
        let h = nodes[0].dst.clone();
        nodes.push(node(relu, f32(h.ne, 0x70000), vec![h]));
        assert!(to_move(&nodes, |_| true).0.is_empty());
        // The application.
        let mut nodes = first();
        nodes[0].is_output = true;
        assert!(to_move(&nodes, |_| true).0.is_empty());
        // A decode step's few rows.
        let mut nodes = first();
        for n in &mut nodes {
            for t in n.src.iter_mut().flatten().chain([&mut n.dst]) {
                if t.ne[1] == ROWS && t.dtype == DType::F32 {
                    *t = tensor(t.dtype, [t.ne[0], MIN_ROWS - 1, 1, 1], t.addr);
                }
            }
        }
        assert!(to_move(&nodes, |_| true).0.is_empty());
        // f32 or f16 weights.
        for w in [DType::F32, DType::F16] {
            let mut nodes = first();
            nodes[2].src[0] = Some(tensor(w, [64, 32, 1, 1], 0x40000));
            assert!(to_move(&nodes, |_| true).0.is_empty());
        }
        // A MUL_MAT the device would not run over bf16 activations.
        assert!(to_move(&first(), |n: &Node| n.op != Op::MulMat)
            .0
            .is_empty());
    }
}
