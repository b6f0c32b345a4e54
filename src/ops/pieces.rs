//! Kernels over many rows run as kernels over power-of-two counts of them, so that a new token
//! count compiles nothing new.
//!
//! Kernel names carry shapes, and a prompt's token count is in most of its kernels' shapes: every
//! new prompt length would compile them again (on an NPU, seconds to minutes of aiecc and Peano
//! each, in the middle of a conversation). But an op whose rows are computed independently (the
//! catalogue's `rows`: a product's columns of x, a norm's rows, a softmax's rows, attention's
//! query rows, an element-wise op's elements) computes any slice of them with the kernel of the
//! slice's shape.
//! So a kernel over R rows, R at least [`MIN_ROWS`] and not a power of two, runs as two: the
//! largest power of two P ≤ R from row 0, then the next power of two Q ≥ R − P ending at row R
//! (it computes some of P's rows again, with the same values). A product of bf16 activations
//! takes Q ≥ [`MIN_ROWS`]: only the GEMM reads bf16 (a product of a few rows would take the
//! GEMV, which reads f32).
//!
//! A kernel one of whose outputs shares memory with an input (an in-place residual, an attention
//! whose output ggml-alloc placed over its q) must not compute a row twice: it runs as the
//! powers of two of R's binary expansion, from the largest.
//!
//! Row counts below [`MIN_ROWS`] keep their kernels: a few lengths (parallel sequences, a
//! speculative batch), each bound by its weights, which a second kernel would read again. A
//! model thus compiles each kernel for at most 15 row counts below 16 and the powers of two up to
//! its batch, whatever its prompts. The cost: a second dispatch per kernel (a few in place) and
//! the weights read again, for a prompt whose length is not a power of two (`docs/perf.md`,
//! "Compiles across prompts").
//!
//! `GGML_HSA_ROW_PIECES=0` runs every kernel whole (a program of fixed shapes then dispatches
//! each kernel once).

use super::rewrite::Step;
use super::tensor::Tensor;
use crate::kernels::desc::dtype_block;
use crate::kernels::{KernelDesc, Layout};
use crate::op_catalogue::{OpEntry, Rows};

/// Row counts below this run as they are.
pub const MIN_ROWS: i64 = 16;

/// One kernel over a slice of a step's rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece<K> {
    pub desc: KernelDesc,
    /// Per operand of the step, `(byte offset, bytes)` of its slice; `None`: passed whole.
    pub slices: Vec<Option<(u64, u64)>>,
    /// The kernel, once loaded.
    pub loaded: Option<K>,
}

impl<K> Piece<K> {
    /// The step's operands (their addresses resolved) as this piece passes them.
    pub fn operands(&self, whole: &[Tensor]) -> Vec<Tensor> {
        whole
            .iter()
            .zip(&self.slices)
            .map(|(t, slice)| match slice {
                Some((offset, bytes)) => Tensor {
                    addr: t.addr + offset,
                    bytes: *bytes,
                    ..t.clone()
                },
                None => t.clone(),
            })
            .collect()
    }
}

/// Decides the pieces of every kernel step not loaded yet whose pieces are undecided (see the
/// module docstring); `alignment`: the bytes every operand's address must be a multiple of.
pub fn split_steps<K>(steps: &mut [Step<K>], alignment: u64) {
    for step in steps {
        if let Step::Kernel(k) = step {
            if k.loaded.is_none() && k.pieces.is_none() {
                k.pieces = Some(pieces(&k.desc, &k.operands, alignment));
            }
        }
    }
}

/// `(first row, rows)` of each piece of `rows` rows; empty when they run whole.
fn spans(rows: i64, disjoint: bool, least: i64) -> Vec<(i64, i64)> {
    if rows < MIN_ROWS || (rows as u64).is_power_of_two() {
        return Vec::new();
    }
    let below = |n: i64| 1_i64 << (63 - n.leading_zeros());
    if disjoint {
        // The powers of two of its binary expansion, from the largest.
        let (mut start, mut spans) = (0, Vec::new());
        while start < rows {
            let p = below(rows - start);
            spans.push((start, p));
            start += p;
        }
        return spans;
    }
    let p = below(rows);
    let q = (((rows - p) as u64).next_power_of_two() as i64).max(least);
    vec![(0, p), (rows - q, q)]
}

/// The pieces of a kernel over `operands` (inputs, then outputs); empty when it runs whole: its
/// op has no `rows`, its rows are few or a power of two, or a slice would not start on an
/// aligned address.
fn pieces<K>(desc: &KernelDesc, operands: &[Tensor], alignment: u64) -> Vec<Piece<K>> {
    let Some(entry) = OpEntry::by_name(&desc.op) else {
        return Vec::new();
    };
    let layouts: Vec<&Layout> = desc
        .inputs
        .iter()
        .chain([&desc.output])
        .chain(&desc.extra_outputs)
        .collect();
    if entry.rows.len() != layouts.len() || operands.len() != layouts.len() {
        return Vec::new();
    }
    let out = &desc.output;
    let outer = |first: usize| (first..4).rev().find(|&d| out.ne[d] != 1).unwrap_or(first);
    let mut dims = Vec::with_capacity(layouts.len());
    for (rows, l) in entry.rows.iter().zip(&layouts) {
        dims.push(match *rows {
            Rows::Whole => None,
            Rows::Dim(d) => Some(d),
            // The output's shape, or repeated over it.
            Rows::Outer(first) if (0..4).all(|d| l.ne[d] == out.ne[d] || l.ne[d] == 1) => {
                Some(outer(first))
            }
            Rows::Outer(_) => return Vec::new(),
        });
    }
    // The rows: the output's, or (an output written whole) the first sliced input's.
    let first = desc.inputs.len();
    let Some(reference) = (first..layouts.len())
        .chain(0..first)
        .find(|&i| dims[i].is_some())
    else {
        return Vec::new();
    };
    let along = dims[reference].expect("found above");
    // An element-wise op flattened to its elements is sliced along them, but its rows are the
    // graph's (the tokens): a step of a few tokens (a decode step's logits softcapped over the
    // vocabulary) keeps its kernel, as any kernel of fewer than MIN_ROWS rows does.
    let graph_rows = |t: &Tensor| t.ne[1..].iter().product::<i64>();
    if along == 0 && graph_rows(&operands[reference]) < MIN_ROWS {
        return Vec::new();
    }
    let rows = layouts[reference].ne[along];
    for (dim, l) in dims.iter_mut().zip(&layouts) {
        let Some(d) = *dim else { continue };
        let elements = dtype_block(&l.dtype).filter(|&(block, _)| block == 1);
        match l.ne[d] {
            // Repeated over the rows: read whole.
            1 if rows > 1 => *dim = None,
            // As many rows, or more (a mask's padded rows, the positions): sliced. Only whole
            // elements are sliced (never blocks of weights).
            n if n >= rows && elements.is_some() => {}
            _ => return Vec::new(),
        }
    }
    let disjoint =
        (first..operands.len()).any(|o| (0..first).any(|i| operands[o].overlaps(&operands[i])));
    // One along rows (a dimension above 0) has rows of whole words, as the DMA moves them.
    let whole_words = (0..layouts.len()).all(|i| {
        dims[i].is_none_or(|d| {
            d == 0
                || slice(layouts[i], &operands[i], d, 1, 1)
                    .0
                    .is_multiple_of(alignment)
        })
    });
    if !whole_words {
        return Vec::new();
    }
    let mut pieces = Vec::new();
    // A product of bf16 activations: every piece a GEMM's (the GEMV reads f32 only).
    let bf16_x = desc.op == "MUL_MAT" && desc.inputs.get(1).is_some_and(|x| x.dtype == "bf16");
    let least = if bf16_x { MIN_ROWS } else { 1 };
    for (start, size) in spans(rows, disjoint, least) {
        let slices: Vec<Option<(u64, u64)>> = (0..layouts.len())
            .map(|i| dims[i].map(|d| slice(layouts[i], &operands[i], d, start, size)))
            .collect();
        // Every slice starts on an aligned address.
        if slices
            .iter()
            .flatten()
            .any(|&(offset, _)| !offset.is_multiple_of(alignment))
        {
            return Vec::new();
        }
        let mut desc = desc.clone();
        let parts = desc
            .inputs
            .iter_mut()
            .chain([&mut desc.output])
            .chain(&mut desc.extra_outputs);
        for (l, d) in parts.zip(&dims) {
            if let Some(d) = *d {
                l.ne[d] = size;
            }
        }
        pieces.push(Piece {
            desc,
            slices,
            loaded: None,
        });
    }
    if disjoint && !in_order(&pieces, operands, first) {
        return Vec::new();
    }
    pieces
}

/// Whether pieces run one after the other compute what the whole kernel does when outputs
/// share memory with inputs: no piece reads bytes an earlier one wrote. (Row i of an output in
/// place of row i of an input is fine; an output whose rows are longer than the input's, as a
/// feed-forward's hidden rows over the residual, covers later rows of the input.) An operand
/// read or written whole counts whole.
fn in_order<K>(pieces: &[Piece<K>], operands: &[Tensor], first: usize) -> bool {
    let bytes = |piece: &Piece<K>, i: usize| {
        let (offset, extent) = piece.slices[i].unwrap_or((0, operands[i].bytes));
        let at = operands[i].addr + offset;
        at..at + extent
    };
    pieces.iter().enumerate().all(|(k, later)| {
        pieces[..k].iter().all(|earlier| {
            (first..operands.len()).all(|o| {
                let written = bytes(earlier, o);
                (0..first).all(|i| {
                    let read = bytes(later, i);
                    written.end <= read.start || read.end <= written.start
                })
            })
        })
    })
}

/// `(byte offset, bytes)` of rows `start .. start + size` along dimension `d` of operand `t`
/// laid out as `l`. The layout's strides, except where the layout and the tensor have the same
/// rows (dimensions 1 to 3) and so the tensor's own strides apply: a layout told its KV length
/// at dispatch has the largest length's row stride, the tensor the graph's. (A flattened layout,
/// or one of the KV cache's rows, differs from its tensor's shape.)
fn slice(l: &Layout, t: &Tensor, d: usize, start: i64, size: i64) -> (u64, u64) {
    if l.ne[1..] == t.ne[1..] {
        let mut rows = t.clone();
        rows.ne[d] = size;
        return (start as u64 * t.nb[d], rows.extent());
    }
    let elem = dtype_block(&l.dtype).map_or(0, |(_, bytes)| bytes);
    let mut ne = l.ne;
    ne[d] = size;
    let extent = (0..4).map(|i| (ne[i] - 1) as u64 * l.nb[i]).sum::<u64>() + elem;
    (start as u64 * l.nb[d], extent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::plan::{plan, Plan};
    use crate::ops::tensor::test_util::{node, tensor};
    use crate::ops::tensor::{BinaryOp, DType, Op, UnaryOp};

    #[test]
    fn rows_split_into_at_most_two_powers_of_two_or_disjoint_ones() {
        for rows in [1, 8, 15, 16, 64, 512] {
            assert!(spans(rows, false, 1).is_empty(), "{rows}");
        }
        assert_eq!(spans(17, false, 1), vec![(0, 16), (16, 1)]);
        assert_eq!(spans(37, false, 1), vec![(0, 32), (29, 8)]);
        assert_eq!(spans(100, false, 1), vec![(0, 64), (36, 64)]);
        assert_eq!(spans(300, false, 1), vec![(0, 256), (236, 64)]);
        assert_eq!(spans(511, false, 1), vec![(0, 256), (255, 256)]);
        assert_eq!(
            spans(300, true, 1),
            vec![(0, 256), (256, 32), (288, 8), (296, 4)]
        );
        assert_eq!(spans(100, true, 1), vec![(0, 64), (64, 32), (96, 4)]);
        // A product of bf16 activations: the second piece a GEMM's too.
        assert_eq!(spans(17, false, MIN_ROWS), vec![(0, 16), (1, 16)]);
        assert_eq!(spans(37, false, MIN_ROWS), vec![(0, 32), (21, 16)]);
        // Every row is covered, nothing past the last one, every size a power of two.
        for rows in 16..=1100 {
            for (disjoint, least) in [(false, 1), (false, MIN_ROWS), (true, 1)] {
                let s = spans(rows, disjoint, least);
                if (rows as u64).is_power_of_two() {
                    assert!(s.is_empty());
                    continue;
                }
                let mut covered = vec![false; rows as usize];
                for &(start, n) in &s {
                    assert!((n as u64).is_power_of_two(), "{rows}: {s:?}");
                    assert!(n >= least, "{rows}: {s:?}");
                    assert!(start >= 0 && start + n <= rows, "{rows}: {s:?}");
                    for r in start..start + n {
                        assert!(!(disjoint && covered[r as usize]), "{rows}: {s:?}");
                        covered[r as usize] = true;
                    }
                }
                assert!(covered.iter().all(|&c| c), "{rows}: {s:?}");
                assert!(s.len() <= if disjoint { 11 } else { 2 });
            }
        }
    }

    fn kernel(n: &crate::ops::tensor::Node) -> (KernelDesc, Vec<Tensor>) {
        match plan(n).unwrap() {
            Plan::Kernel { desc, operands } => (desc, operands),
            other => panic!("{other:?}"),
        }
    }

    fn copy(n: &crate::ops::tensor::Node) -> (KernelDesc, Vec<Tensor>) {
        match crate::ops::plan::device_copy(n) {
            Some(Plan::Kernel { desc, operands }) => (desc, operands),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_product_of_100_columns_runs_as_two_of_64() {
        let w = tensor(DType::F16, [2048, 512, 1, 1], 0x100000);
        let x = tensor(DType::F32, [2048, 100, 1, 1], 0x400000);
        let y = tensor(DType::F32, [512, 100, 1, 1], 0x800000);
        let (desc, operands) = kernel(&node(Op::MulMat, y, vec![w, x]));
        let pieces: Vec<Piece<()>> = pieces(&desc, &operands, 4);
        assert_eq!(pieces.len(), 2);
        // One kernel for both: the same name, whatever the prompt's length.
        assert_eq!(pieces[0].desc, pieces[1].desc);
        assert_eq!(
            pieces[0].desc.canonical_name(),
            "mul_mat-f16_2048x512-f32_2048x64-f32_512x64"
        );
        // The weights whole; x's and y's columns 36..100 for the second.
        assert_eq!(pieces[1].slices[0], None);
        assert_eq!(pieces[1].slices[1], Some((36 * 8192, 64 * 8192)));
        assert_eq!(pieces[1].slices[2], Some((36 * 2048, 64 * 2048)));
        let sliced = pieces[1].operands(&operands);
        assert_eq!(sliced[1].addr, 0x400000 + 36 * 8192);
        assert_eq!(sliced[0], operands[0]);
    }

    #[test]
    fn in_place_outputs_take_disjoint_pieces_and_repeated_inputs_stay_whole() {
        // x + b in place, b one row repeated over x's 100.
        let x = tensor(DType::F32, [2048, 100, 1, 1], 0x400000);
        let b = tensor(DType::F32, [2048, 1, 1, 1], 0x100000);
        let (desc, operands) = kernel(&node(Op::Binary(BinaryOp::Add), x.clone(), vec![x, b]));
        let pieces: Vec<Piece<()>> = pieces(&desc, &operands, 4);
        let rows: Vec<i64> = pieces.iter().map(|p| p.desc.output.ne[1]).collect();
        assert_eq!(rows, vec![64, 32, 4]);
        assert!(pieces.iter().all(|p| p.slices[1].is_none()));
        assert_eq!(pieces[2].slices[0], Some((96 * 8192, 4 * 8192)));
    }

    #[test]
    fn an_output_over_later_input_rows_runs_whole() {
        // y = W x with y in x's memory: y's rows as long as x's, or four times longer, so that
        // the first piece's rows of y cover the second's rows of x.
        for (m, pieces_of) in [(64, 2), (256, 0)] {
            let w = tensor(DType::F32, [64, m, 1, 1], 0x100000);
            let x = tensor(DType::F32, [64, 20, 1, 1], 0x400000);
            let y = tensor(DType::F32, [m, 20, 1, 1], 0x400000);
            let (desc, operands) = kernel(&node(Op::MulMat, y, vec![w, x]));
            assert_eq!(pieces::<()>(&desc, &operands, 4).len(), pieces_of, "{m}");
        }
    }

    #[test]
    fn few_rows_powers_of_two_and_ops_without_rows_run_whole() {
        let w = tensor(DType::F16, [2048, 512, 1, 1], 0x100000);
        for n in [1, 4, 15, 64] {
            let x = tensor(DType::F32, [2048, n, 1, 1], 0x400000);
            let y = tensor(DType::F32, [512, n, 1, 1], 0x800000);
            let (desc, operands) = kernel(&node(Op::MulMat, y, vec![w.clone(), x]));
            assert!(pieces::<()>(&desc, &operands, 4).is_empty(), "{n}");
        }
        let a = tensor(DType::I32, [100, 3, 1, 1], 0x1000);
        let b = tensor(DType::I32, [100, 3, 1, 1], 0x2000);
        let count = tensor(DType::I64, [1, 1, 1, 1], 0x3000);
        let (desc, operands) = kernel(&node(Op::CountEqual, count, vec![a, b]));
        assert!(pieces::<()>(&desc, &operands, 4).is_empty());
    }

    #[test]
    fn a_norm_splits_its_rows_never_the_elements_it_reduces() {
        let norm = |ne: [i64; 4]| {
            let mut n = node(
                Op::Norm { rms: true },
                tensor(DType::F32, ne, 0x800000),
                vec![tensor(DType::F32, ne, 0x400000)],
            );
            n.op_params[0] = 0x3727_c5ac;
            kernel(&n)
        };
        let (desc, operands) = norm([1536, 1, 1, 1]);
        assert!(pieces::<()>(&desc, &operands, 4).is_empty());
        let (desc, operands) = norm([1536, 100, 1, 1]);
        let pieces: Vec<Piece<()>> = pieces(&desc, &operands, 4);
        assert_eq!(pieces.len(), 2);
        assert_eq!(pieces[0].desc.output.ne, [1536, 64, 1, 1]);
    }

    #[test]
    fn rows_that_are_not_whole_words_run_whole() {
        // A softmax with a mask of rows of 113 f16 values: a slice's rows would start
        // mid-word.
        for (n0, pieces_of) in [(113, 0), (114, 2)] {
            let x = tensor(DType::F32, [n0, 100, 1, 1], 0x400000);
            let mask = tensor(DType::F16, [n0, 100, 1, 1], 0x100000);
            let y = tensor(DType::F32, [n0, 100, 1, 1], 0x800000);
            let (desc, operands) = kernel(&node(Op::SoftMax, y, vec![x, mask]));
            assert_eq!(pieces::<()>(&desc, &operands, 4).len(), pieces_of, "{n0}");
        }
    }

    #[test]
    fn a_slice_starting_off_the_alignment_runs_whole() {
        // 101 rows of 17 f16 elements flattened: the second piece would start at element 693
        // (byte 1386).
        let x = tensor(DType::F32, [17, 101, 1, 1], 0x10000);
        let y = tensor(DType::F16, [17, 101, 1, 1], 0x100000);
        let (desc, operands) = copy(&node(Op::Cpy, y, vec![x]));
        assert!(pieces::<()>(&desc, &operands, 4).is_empty());
        let x = tensor(DType::F32, [20, 101, 1, 1], 0x10000);
        let y = tensor(DType::F16, [20, 101, 1, 1], 0x100000);
        let (desc, operands) = copy(&node(Op::Cpy, y, vec![x]));
        assert_eq!(pieces::<()>(&desc, &operands, 4).len(), 2);
    }

    #[test]
    fn an_element_wise_op_over_a_few_rows_runs_whole() {
        // A decode step's logits softcapped in place (gemma2): 32,000 elements of one token
        // keep one kernel, not the six of their binary expansion.
        let x = tensor(DType::F32, [32000, 1, 1, 1], 0x10000);
        let (desc, operands) = kernel(&node(Op::Unary(UnaryOp::Tanh), x.clone(), vec![x]));
        assert!(pieces::<()>(&desc, &operands, 4).is_empty());
        // The same over a prompt's 20 tokens is sliced along its elements.
        let x = tensor(DType::F32, [1000, 20, 1, 1], 0x10000);
        let y = tensor(DType::F32, [1000, 20, 1, 1], 0x100000);
        let (desc, operands) = kernel(&node(Op::Unary(UnaryOp::Tanh), y, vec![x]));
        assert_eq!(pieces::<()>(&desc, &operands, 4).len(), 2);
    }
}
