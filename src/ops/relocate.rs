//! Attention outputs moved out of memory that the block after them reuses.
//!
//! In llama.cpp's last layer, ggml's allocator hands the attention's output memory (dead once
//! the output projection has read it) to the residual ADD after the projection. The two
//! one-row GET_ROWS between them are forwarded as views (`ops::forward_gathers`). A kernel
//! that computes the projection and its ADD together (MUL_MAT_ADD, and the layer kernels built
//! on it) would then write its output over its own input, so that layer stayed in five kernels.
//!
//! [`attention_outputs_to_move`] finds such outputs: a FLASH_ATTN_EXT output of one query row
//! that nothing reads but views of it and one MUL_MAT, and whose memory is next written by a
//! node reading that MUL_MAT's product. [`relocate`] gives each of them memory of its own (the stream's scratch
//! buffer) and rewrites the attention's node, the views and the projection to use it. Nothing
//! else reads the output, so no other node sees the move. The stream plans the graph again
//! without the move if one of those nodes ends up on ggml's CPU backend, which reads the
//! graph's own memory.

use super::tensor::{DType, Memory, Node, Op, Tensor};

/// Alignment of each moved output in the scratch buffer.
const ALIGN: u64 = 64;

/// An attention output to move.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// The FLASH_ATTN_EXT node.
    pub node: usize,
    /// The views of its output and the projection reading it.
    pub readers: Vec<usize>,
    /// Where it goes in the scratch buffer.
    pub offset: u64,
}

/// The outputs to move and the scratch bytes they take.
pub fn attention_outputs_to_move(nodes: &[Node]) -> (Vec<Move>, u64) {
    let mut moves = Vec::new();
    let mut size = 0;
    for (f, node) in nodes.iter().enumerate() {
        let a = &node.dst;
        // One query row (a decode step): only there do the kernels after it fold into one
        // (a prompt's attention output is also far larger to copy aside).
        if node.op != Op::FlashAttnExt
            || node.is_output
            || a.dtype != DType::F32
            || !a.is_contiguous()
            || a.ne[2] * a.ne[3] != 1
        {
            continue;
        }
        let Some(readers) = clobbered_readers(nodes, f) else {
            continue;
        };
        moves.push(Move {
            node: f,
            readers,
            offset: size,
        });
        size += a.bytes.next_multiple_of(ALIGN);
    }
    (moves, size)
}

/// The views of node `f`'s output and the one MUL_MAT reading it, when the node that next
/// writes that memory reads the MUL_MAT's product (folding the two would clobber the input).
fn clobbered_readers(nodes: &[Node], f: usize) -> Option<Vec<usize>> {
    let a = &nodes[f].dst;
    let mut readers = Vec::new();
    let mut product: Option<&Tensor> = None;
    for (j, node) in nodes.iter().enumerate().skip(f + 1) {
        let reads = node.src.iter().flatten().any(|s| s.overlaps(a));
        if node.op == Op::Layout {
            // A view of the output passes its memory on; any other view is nothing to it.
            if reads {
                readers.push(j);
            }
            continue;
        }
        if node.dst.overlaps(a) {
            // The next write: by a node reading the product (the residual ADD), or no move.
            let by_reader = product.is_some_and(|p| node.src.iter().flatten().any(|s| s == p));
            return (by_reader && !reads).then_some(readers);
        }
        if reads {
            if node.op != Op::MulMat || product.is_some() {
                return None;
            }
            product = Some(&node.dst);
            readers.push(j);
        }
    }
    None
}

/// `nodes` with each move's output at `base + offset` in `memory` (the scratch buffer), as the
/// attention writes it and its views and projection read it.
pub fn relocate(nodes: &[Node], moves: &[Move], base: u64, memory: Memory) -> Vec<Node> {
    let mut out = nodes.to_vec();
    for m in moves {
        let a = nodes[m.node].dst.clone();
        let moved = |t: &Tensor| Tensor {
            addr: t.addr - a.addr + base + m.offset,
            memory,
            ..t.clone()
        };
        move_output(&mut out, m.node, &m.readers, &a, moved);
    }
    out
}

/// Node `node`'s output `a` replaced by `moved(a)` in `out`, and every tensor of its `readers`
/// over `a` (their sources, a view's output) by `moved` of it.
pub(super) fn move_output(
    out: &mut [Node],
    node: usize,
    readers: &[usize],
    a: &Tensor,
    moved: impl Fn(&Tensor) -> Tensor,
) {
    out[node].dst = moved(a);
    for &r in readers {
        let node = &mut out[r];
        for s in node.src.iter_mut().flatten() {
            if s.overlaps(a) {
                *s = moved(s);
            }
        }
        if node.op == Op::Layout && node.dst.overlaps(a) {
            node.dst = moved(&node.dst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tensor::test_util::{node, tensor};
    use crate::ops::BinaryOp;

    /// llama's last layer after its gathers were forwarded: the attention (node 0) into a at
    /// 0x1000, its reshape (1), the projection (2) into 0x2000, then the residual ADD of the
    /// product (3) into `add_out`, then a reader of the ADD (4).
    fn last_layer(add_out: u64) -> Vec<Node> {
        let f32 = |ne, addr| tensor(DType::F32, ne, addr);
        let a = f32([32, 2, 1, 1], 0x1000);
        let flat = f32([64, 1, 1, 1], 0x1000);
        vec![
            node(Op::FlashAttnExt, a.clone(), vec![]),
            node(Op::Layout, flat.clone(), vec![a]),
            node(
                Op::MulMat,
                f32([64, 1, 1, 1], 0x2000),
                vec![f32([64, 64, 1, 1], 0x9000), flat],
            ),
            node(
                Op::Binary(BinaryOp::Add),
                f32([64, 1, 1, 1], add_out),
                vec![f32([64, 1, 1, 1], 0x2000), f32([64, 1, 1, 1], 0x3000)],
            ),
            node(
                Op::Binary(BinaryOp::Add),
                f32([64, 1, 1, 1], 0x4000),
                vec![f32([64, 1, 1, 1], add_out)],
            ),
        ]
    }

    #[test]
    fn an_attention_output_the_residual_reuses_moves_to_scratch() {
        let nodes = last_layer(0x1000);
        let (moves, size) = attention_outputs_to_move(&nodes);
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!(
            (moves[0].node, &moves[0].readers[..], size),
            (0, &[1, 2][..], 256)
        );
        let moved = relocate(&nodes, &moves, 0x80000, Memory::Device(0));
        assert_eq!(moved[0].dst.addr, 0x80000);
        assert_eq!(moved[1].dst.addr, 0x80000);
        assert_eq!(moved[1].src[0].as_ref().unwrap().addr, 0x80000);
        assert_eq!(moved[2].src[1].as_ref().unwrap().addr, 0x80000);
        // The weights, the ADD and its reader are untouched.
        assert_eq!(moved[2].src[0], nodes[2].src[0]);
        assert_eq!(moved[3..], nodes[3..]);
    }

    #[test]
    fn an_attention_output_stays_where_nothing_would_clobber_it() {
        // The ADD elsewhere (every other layer): nothing to move.
        assert!(attention_outputs_to_move(&last_layer(0x5000)).0.is_empty());
        // The output read by another node too, or the application.
        let mut nodes = last_layer(0x1000);
        nodes.insert(
            3,
            node(
                Op::Unary(crate::ops::UnaryOp::Relu),
                tensor(DType::F32, [64, 1, 1, 1], 0x6000),
                vec![tensor(DType::F32, [64, 1, 1, 1], 0x1000)],
            ),
        );
        assert!(attention_outputs_to_move(&nodes).0.is_empty());
        let mut nodes = last_layer(0x1000);
        nodes[0].is_output = true;
        assert!(attention_outputs_to_move(&nodes).0.is_empty());
        // A prompt's attention (two query rows).
        let mut nodes = last_layer(0x1000);
        nodes[0].dst.ne = [32, 1, 2, 1];
        assert!(attention_outputs_to_move(&nodes).0.is_empty());
    }
}
