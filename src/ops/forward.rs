//! Gathers that can only copy their source whole, forwarded to their readers.
//!
//! llama.cpp's last layer picks the rows it outputs (`inp_out_ids`) with two GET_ROWS: of the
//! attention's output projection and of the layer's input, ahead of the residual ADD. Decoding
//! one token, each has a one-row source and one index, so the only index that is not out of
//! range is 0 and the result is the source itself. Run on the host, those two nodes split the
//! layer's kernels into two command chains and keep the projection, its residual and the
//! feed-forward block from folding into one kernel as they do in every other layer.
//!
//! [`forward_gathers`] rewrites such a gather into a view (it computes nothing) and gives the
//! nodes that read its output its source instead, where that is the same data: the source is
//! not overwritten before the last of them, the output is not read through another view, and
//! the application does not read the output. The index is still checked every time the graph
//! runs ([`Forwarded::check`]): an index other than 0 fails the graph as the GET_ROWS would.
//! A reader that ends up on ggml's CPU backend reads the gather's real output: the stream runs
//! the gather again for it ([`Forwarded::readers`]).

use std::borrow::Cow;

use super::tensor::{DType, Node, Op, Tensor};

/// A GET_ROWS turned into a view of its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Forwarded {
    /// The GET_ROWS node.
    pub node: usize,
    /// Its index tensor (one i32), read when the graph runs.
    pub idx: Tensor,
    /// The nodes that read the source in place of the gather's output.
    pub readers: Vec<usize>,
}

impl Forwarded {
    /// Whether `bytes`, the index tensor's contents, name the source's only row; the reason
    /// otherwise (the GET_ROWS would have failed).
    pub fn check(&self, bytes: &[u8]) -> Result<(), String> {
        let index = bytes
            .get(..4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or("GET_ROWS index tensor is shorter than one i32")?;
        if index == 0 {
            Ok(())
        } else {
            Err(format!(
                "GET_ROWS index {index} out of range (the source has one row)"
            ))
        }
    }
}

/// Whether `node` is a GET_ROWS that can only copy its source: one contiguous f32 row gathered
/// by one i32 index into a contiguous f32 row of the same shape.
fn copies_whole(node: &Node) -> bool {
    let (Some(Some(src)), Some(Some(idx))) = (node.src.first(), node.src.get(1)) else {
        return false;
    };
    let dst = &node.dst;
    node.op == Op::GetRows
        && src.ne[1..] == [1, 1, 1]
        && src.dtype == DType::F32
        && dst.dtype == DType::F32
        && src.same_shape(dst)
        && src.nb == dst.nb
        && src.is_contiguous()
        && dst.is_contiguous()
        && idx.dtype == DType::I32
        && idx.nelements() == 1
}

/// The graph with every forwardable gather a view and its readers reading its source, and the
/// gathers forwarded; `nodes` itself (borrowed) when there are none.
pub fn forward_gathers(nodes: &[Node]) -> (Cow<'_, [Node]>, Vec<Forwarded>) {
    let mut candidates: Vec<usize> = (0..nodes.len())
        .filter(|&i| {
            let node = &nodes[i];
            // The index an input of the graph (read when it runs), not a node's result.
            let idx_input = |idx: &Tensor| !nodes[..i].iter().any(|n| n.dst.overlaps(idx));
            copies_whole(node) && !node.is_output && node.src[1].as_ref().is_some_and(idx_input)
        })
        .collect();
    // The conditions of one gather count the writes of the others as gone: drop the gathers
    // that fail them until none does.
    let forwarded = loop {
        let found: Vec<Option<Forwarded>> = candidates
            .iter()
            .map(|&g| forwardable(nodes, g, &candidates))
            .collect();
        if found.iter().all(Option::is_some) {
            break found.into_iter().flatten().collect::<Vec<_>>();
        }
        candidates = candidates
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_some())
            .map(|(&g, _)| g)
            .collect();
    };
    if forwarded.is_empty() {
        return (Cow::Borrowed(nodes), forwarded);
    }
    // Each reader's inputs as the graph has them decide what it reads instead (one gather's
    // source may be another's output memory).
    let mut rewritten = nodes.to_vec();
    for f in &forwarded {
        let gather = &nodes[f.node];
        let (src, dst) = (gather.src[0].as_ref().expect("a source"), &gather.dst);
        rewritten[f.node].op = Op::Layout;
        for &r in &f.readers {
            for (k, s) in nodes[r].src.iter().enumerate() {
                if s.as_ref() == Some(dst) {
                    rewritten[r].src[k] = Some(src.clone());
                }
            }
        }
    }
    (Cow::Owned(rewritten), forwarded)
}

/// Gather `g` forwarded, when its readers may read its source (`gathers`: the gathers being
/// forwarded, whose outputs are not written).
fn forwardable(nodes: &[Node], g: usize, gathers: &[usize]) -> Option<Forwarded> {
    let gather = &nodes[g];
    let (src, idx, dst) = (
        gather.src[0].as_ref()?,
        gather.src[1].as_ref()?,
        &gather.dst,
    );
    // Another gather reading this one's output (a chain of them): left alone. (Another's output
    // in this one's source is not written once both are views.)
    let tangled = gathers
        .iter()
        .filter(|&&o| o > g)
        .any(|&o| nodes[o].src[0].as_ref().is_some_and(|s| s.overlaps(dst)));
    if tangled {
        return None;
    }
    // The readers of the output until its memory is written again (a node writing it in place
    // reads it first).
    let mut readers = Vec::new();
    for (j, node) in nodes.iter().enumerate().skip(g + 1) {
        let reads: Vec<&Tensor> = node
            .src
            .iter()
            .flatten()
            .filter(|s| s.overlaps(dst))
            .collect();
        if !reads.is_empty() {
            // Read whole, by a node that computes (a view would pass the memory on).
            if node.op == Op::Layout || reads.iter().any(|s| *s != dst) {
                return None;
            }
            readers.push(j);
        }
        if node.dst.overlaps(dst) && !gathers.contains(&j) {
            break;
        }
    }
    let last = *readers.last()?;
    // The source unchanged until the last reader reads it.
    let rewritten = (g + 1..=last)
        .filter(|j| !gathers.contains(j))
        .any(|j| nodes[j].dst.overlaps(src));
    if rewritten {
        return None;
    }
    Some(Forwarded {
        node: g,
        idx: idx.clone(),
        readers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tensor::test_util::{node, tensor};
    use crate::ops::{BinaryOp, UnaryOp};

    /// llama's last layer in small: cur (0x1000) and inpSA (0x2000) gathered by one index
    /// (0x3000) into 0x4000 and 0x5000, then their ADD into `out`, then `after`.
    fn last_layer(out: u64, after: Vec<Node>) -> Vec<Node> {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let idx = tensor(DType::I32, [1, 1, 1, 1], 0x3000);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        let mut nodes = vec![
            relu(f32(0x1000), f32(0x9000)),
            node(Op::GetRows, f32(0x4000), vec![f32(0x1000), idx.clone()]),
            node(Op::GetRows, f32(0x5000), vec![f32(0x2000), idx]),
            node(
                Op::Binary(BinaryOp::Add),
                f32(out),
                vec![f32(0x4000), f32(0x5000)],
            ),
        ];
        nodes.extend(after);
        nodes
    }

    #[test]
    fn a_one_row_gather_is_a_view_its_reader_reads_through() {
        let graph = last_layer(0x6000, vec![]);
        let (nodes, forwarded) = forward_gathers(&graph);
        assert_eq!(forwarded.len(), 2, "{forwarded:?}");
        assert_eq!((forwarded[0].node, forwarded[1].node), (1, 2));
        assert_eq!(forwarded[0].readers, [3]);
        assert!(nodes[1].op == Op::Layout && nodes[2].op == Op::Layout);
        let reads: Vec<u64> = nodes[3].src.iter().flatten().map(|t| t.addr).collect();
        assert_eq!(reads, [0x1000, 0x2000]);
        // inpSA's gathered row in cur's memory (dead after its gather, for ggml's allocator):
        // neither gather writes, so cur is still there for the ADD.
        let mut graph = last_layer(0x6000, vec![]);
        graph[2].dst.addr = 0x1000;
        graph[3].src[1].as_mut().unwrap().addr = 0x1000;
        let (nodes, forwarded) = forward_gathers(&graph);
        assert_eq!(forwarded.len(), 2);
        let reads: Vec<u64> = nodes[3].src.iter().flatten().map(|t| t.addr).collect();
        assert_eq!(reads, [0x1000, 0x2000]);
        // The ADD in place into a gather's output (ggml's allocator reusing it): the same.
        let graph = last_layer(0x4000, vec![]);
        let (nodes, forwarded) = forward_gathers(&graph);
        assert_eq!(forwarded.len(), 2);
        let reads: Vec<u64> = nodes[3].src.iter().flatten().map(|t| t.addr).collect();
        assert_eq!(reads, [0x1000, 0x2000]);
        // The index is checked when the graph runs.
        assert!(forwarded[0].check(&0i32.to_le_bytes()).is_ok());
        let e = forwarded[0].check(&3i32.to_le_bytes()).unwrap_err();
        assert!(e.contains("index 3 out of range"), "{e}");
    }

    #[test]
    fn a_gather_stays_when_its_source_changes_or_its_output_is_needed() {
        let f32 = |addr| tensor(DType::F32, [64, 1, 1, 1], addr);
        let relu = |dst, src| node(Op::Unary(UnaryOp::Relu), dst, vec![src]);
        // cur's memory reused before the ADD (the node after the gathers writes it): only
        // inpSA's gather is forwarded.
        let mut nodes = last_layer(0x6000, vec![]);
        nodes.insert(3, relu(f32(0x1000), f32(0x8000)));
        let (_, forwarded) = forward_gathers(&nodes);
        assert_eq!(forwarded.iter().map(|f| f.node).collect::<Vec<_>>(), [2]);
        // The gathered tensor read again after the ADD, through a view: left alone.
        let view = node(Op::Layout, f32(0x4000), vec![f32(0x4000)]);
        let (_, forwarded) = forward_gathers(&last_layer(0x6000, vec![view]));
        assert_eq!(forwarded.iter().map(|f| f.node).collect::<Vec<_>>(), [2]);
        // The application reads the gathered rows.
        let mut nodes = last_layer(0x6000, vec![]);
        nodes[1].is_output = true;
        let (_, forwarded) = forward_gathers(&nodes);
        assert_eq!(forwarded.iter().map(|f| f.node).collect::<Vec<_>>(), [2]);
        // Two rows gathered (a prompt's outputs), or the index computed by the graph: nothing.
        let mut nodes = last_layer(0x6000, vec![]);
        for g in [1, 2] {
            nodes[g].src[0].as_mut().unwrap().ne = [32, 2, 1, 1];
            nodes[g].dst.ne = [32, 2, 1, 1];
        }
        assert!(forward_gathers(&nodes).1.is_empty());
        let idx = tensor(DType::I32, [1, 1, 1, 1], 0x3000);
        let mut nodes = last_layer(0x6000, vec![]);
        nodes.insert(0, node(Op::Cpy, idx.clone(), vec![idx]));
        let (rewritten, forwarded) = forward_gathers(&nodes);
        assert!(forwarded.is_empty());
        assert!(matches!(rewritten, Cow::Borrowed(_)));
    }
}
