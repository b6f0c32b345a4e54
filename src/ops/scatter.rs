//! SET_ROWS as a copy into the destination rows its indices name, the indices read by the host
//! when the graph runs.
//!
//! The SET_ROWS kernel writes the whole destination (a layer's KV cache: megabytes per token at
//! long contexts) to change the few rows a token adds, because a kernel's DMA addresses are fixed
//! when it is dispatched and the row indices are data. llama.cpp's indices are a graph input the
//! application set before the graph ran, and the NPU shares system memory, so the host can read
//! them at dispatch: when they name consecutive rows in range (every decode step and every
//! prompt of a KV cache filled in order), the node is one copy kernel from the source rows into
//! those rows, addressed at dispatch. Other indices in range (a step of several sequences, each
//! writing its own cells) are one copy of a row per index, each addressed at dispatch: a few
//! rows' bytes, where the SET_ROWS kernel would read and write the whole cache. Indices out of
//! range run the SET_ROWS kernel as planned.
//!
//! Better still, the node that computes the source (llama's roped K, its V projection) can
//! write the destination rows itself, in their type: [`RowScatter::producer`]. The copy's
//! dispatch then disappears too.

use super::plan::{as_layout, device_copy, Plan};
use super::tensor::{DType, Node, Op, Tensor};
use crate::kernels::{KernelDesc, Layout};
use crate::op_catalogue as catalogue;

/// The most rows one CPY_ROWS copies (a decode step's tokens: llama.cpp's sequences of a step,
/// a speculative draft's batch).
pub const MAX_ROWS_APART: usize = 8;

/// The group sizes of `n` rows apart: whole groups of at most `MAX_ROWS_APART`, and the rest.
fn group_sizes(n: usize) -> (usize, usize) {
    let whole = n.clamp(1, MAX_ROWS_APART);
    (whole, if n > whole { n % whole } else { 0 })
}

/// A SET_ROWS node that can run as a copy into consecutive destination rows.
#[derive(Debug, Clone, PartialEq)]
pub struct RowScatter {
    /// The copy kernel: the source rows into `rows` destination rows.
    pub copy: KernelDesc,
    /// The copy of one row, dispatched once per index when the indices are not consecutive
    /// (`row_operands`); `None` for one row, or source rows not dense.
    pub row_copy: Option<KernelDesc>,
    /// The copies of groups of rows into their own destination rows (CPY_ROWS), dispatched
    /// when the indices are not consecutive, in place of `row_copy` per index: the rows in
    /// groups of `MAX_ROWS_APART` (all of them when fewer), then the rest; one kernel per group
    /// size, that of the whole groups first (`rows_copy_groups`). Empty without `row_copy`.
    pub rows_copies: Vec<KernelDesc>,
    src: Tensor,
    /// The indices, read when the graph runs.
    pub idx: Tensor,
    /// The destination rows the copy writes, at row 0 of the destination.
    rows: Tensor,
    /// Rows of the destination (the bound of an index).
    dst_rows: i64,
    /// The whole destination.
    dst: Tensor,
}

/// The kernel that computes a [`RowScatter`]'s source, retargeted to write the destination rows
/// itself in the destination's type (`RowScatter::producer`).
#[derive(Debug, Clone, PartialEq)]
pub struct RowsProducer {
    /// The producer's kernel with its output in the destination's type.
    pub kernel: KernelDesc,
    /// Its input operands; the output operand is the rows the indices name.
    pub inputs: Vec<Tensor>,
}

/// The kernels whose result in another float type is their f32 result converted as SET_ROWS
/// converts it (rounded to nearest even), so that writing the rows directly changes nothing:
/// llama's K (ROPE, or RMS_NORM_MUL_MAT[_BIAS|_HEAD_NORM]_ROPE[_FF] when its projection, and
/// qwen2's bias or qwen3's head norm, are folded into it) and V (MUL_MAT, or
/// RMS_NORM_MUL_MAT[_BIAS] when its norm is folded into it). A compiler that cannot write the type declines the retargeted kernel, and the copy
/// runs.
const RETARGETABLE: [&str; 11] = [
    "ROPE",
    "ROPE_FF",
    "MUL_MAT",
    "RMS_NORM_MUL_MAT",
    "RMS_NORM_MUL_MAT_BIAS",
    "RMS_NORM_MUL_MAT_ROPE",
    "RMS_NORM_MUL_MAT_ROPE_FF",
    "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE",
    "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE_FF",
    "RMS_NORM_MUL_MAT_BIAS_ROPE",
    "RMS_NORM_MUL_MAT_BIAS_ROPE_FF",
];

impl RowScatter {
    /// The scatter of `node` when it is a SET_ROWS of one matrix of rows (dimensions 2 and 3 of
    /// one) with one index per row, into a destination whose elements are dense, and `available`
    /// says the kernel store provides the copy kernel.
    pub fn of(node: &Node, available: impl Fn(&KernelDesc) -> bool) -> Option<RowScatter> {
        if node.op != Op::SetRows {
            return None;
        }
        let (src, idx, dst) = (node.src(0)?, node.src(1)?, &node.dst);
        let n = src.ne[1];
        let one_matrix = |t: &Tensor| t.ne[2] == 1 && t.ne[3] == 1;
        let index_type = matches!(idx.dtype, DType::I32 | DType::I64);
        let elem = dst.dtype.size()?;
        if !one_matrix(src)
            || !one_matrix(dst)
            || !index_type
            || idx.ne != [n, 1, 1, 1]
            || n < 1
            || n > dst.ne[1]
            || src.ne[0] != dst.ne[0]
            || dst.nb[0] != elem
        {
            return None;
        }
        let rows = Tensor {
            ne: [dst.ne[0], n, 1, 1],
            nb: [elem, dst.nb[1], dst.nb[1] * n as u64, dst.nb[1] * n as u64],
            bytes: (n as u64 - 1) * dst.nb[1] + dst.ne[0] as u64 * elem,
            ..dst.clone()
        };
        let copy = Node {
            op: Op::Cpy,
            op_params: [0; 16],
            dst: rows.clone(),
            src: vec![Some(src.clone())],
            is_output: false,
        };
        // One row of each side, for indices that are not consecutive.
        let one_row = |t: &Tensor| Tensor {
            ne: [t.ne[0], 1, 1, 1],
            bytes: t.ne[0] as u64 * t.nb[0],
            ..t.clone()
        };
        let row_copy = Node {
            dst: one_row(&rows),
            src: vec![Some(one_row(src))],
            ..copy.clone()
        };
        let src_elem = src.dtype.size()?;
        let row_copy = match device_copy(&row_copy) {
            Some(Plan::Kernel { desc, .. }) if n > 1 && src.nb[0] == src_elem => Some(desc),
            _ => None,
        };
        // A group of `g` rows into as many destination rows.
        let group = |one: &KernelDesc, g: usize| KernelDesc {
            op: catalogue::CPY_ROWS.name.to_owned(),
            inputs: vec![as_layout(&Tensor {
                ne: [src.ne[0], g as i64, 1, 1],
                ..src.clone()
            })],
            output: one.output.clone(),
            extra_outputs: vec![one.output.clone(); g - 1],
            ..one.clone()
        };
        let (whole, rest) = group_sizes(n as usize);
        let rows_copies = match &row_copy {
            Some(one) => [whole, rest]
                .into_iter()
                .filter(|&g| g > 1)
                .map(|g| group(one, g))
                .collect(),
            None => Vec::new(),
        };
        match device_copy(&copy)? {
            Plan::Kernel { desc, .. } if available(&desc) => Some(RowScatter {
                rows_copies,
                copy: desc,
                row_copy,
                src: src.clone(),
                idx: idx.clone(),
                rows,
                dst_rows: dst.ne[1],
                dst: dst.clone(),
            }),
            _ => None,
        }
    }

    /// The groups of `copies` (the one-row copies' operands, in order) that `rows_copies`
    /// copies: per group the index of its kernel in `rows_copies` (`None`: one row, the
    /// one-row copy) and its operands, the group's source rows then its destination rows.
    pub fn rows_copy_groups(&self, copies: &[[Tensor; 2]]) -> Vec<(Option<usize>, Vec<Tensor>)> {
        let (whole, _) = group_sizes(copies.len());
        copies
            .chunks(whole)
            .enumerate()
            .map(|(i, group)| {
                let kernel = match group.len() {
                    1 => None,
                    g if g == whole => Some(0),
                    _ => Some(1),
                };
                let first = (i * whole) as u64;
                let src = Tensor {
                    addr: self.src.addr + first * self.src.nb[1],
                    ne: [self.src.ne[0], group.len() as i64, 1, 1],
                    bytes: (group.len() as u64 - 1) * self.src.nb[1]
                        + self.src.ne[0] as u64 * self.src.nb[0],
                    ..self.src.clone()
                };
                let mut operands = vec![src];
                operands.extend(group.iter().map(|[_, dst]| dst.clone()));
                (kernel, operands)
            })
            .collect()
    }

    /// The source rows.
    pub fn source(&self) -> &Tensor {
        &self.src
    }

    /// The whole destination.
    pub fn destination(&self) -> &Tensor {
        &self.dst
    }

    /// The destination rows at row 0: what a kernel's operand is bound to until the indices
    /// name the rows (`operands`).
    pub fn rows_placeholder(&self) -> Tensor {
        self.rows.clone()
    }

    /// The copy kernel's operands with the destination rows' placeholder.
    pub fn copy_operands(&self) -> Vec<Tensor> {
        vec![self.src.clone(), self.rows_placeholder()]
    }

    /// The copy kernel's operands (source rows, destination rows) when `indices` (the index
    /// tensor's bytes) name consecutive rows inside the destination; `None` otherwise.
    pub fn operands(&self, indices: &[u8]) -> Option<[Tensor; 2]> {
        let n = self.src.ne[1];
        let index = |i: i64| self.index(indices, i);
        let first = index(0)?;
        if first < 0 || first + n > self.dst_rows {
            return None;
        }
        for i in 1..n {
            if index(i)? != first + i {
                return None;
            }
        }
        let rows = Tensor {
            addr: self.rows.addr + first as u64 * self.rows.nb[1],
            ..self.rows.clone()
        };
        Some([self.src.clone(), rows])
    }

    /// The operands (source row, destination row) of `row_copy` for each index, in order (a
    /// later row wins where two indices are equal, as in ggml-cpu), when `indices` (the index
    /// tensor's bytes) all name rows inside the destination; `None` otherwise.
    pub fn row_operands(&self, indices: &[u8]) -> Option<Vec<[Tensor; 2]>> {
        let n = self.src.ne[1];
        let elem = self.rows.dtype.size()?;
        let row = |t: &Tensor, addr: u64, elem: u64| {
            let bytes = t.ne[0] as u64 * elem;
            Tensor {
                ne: [t.ne[0], 1, 1, 1],
                nb: [elem, bytes, bytes, bytes],
                bytes,
                addr,
                ..t.clone()
            }
        };
        let src_elem = self.src.dtype.size()?;
        (0..n)
            .map(|i| {
                let at = self.index(indices, i)?;
                if at < 0 || at >= self.dst_rows {
                    return None;
                }
                let src = row(
                    &self.src,
                    self.src.addr + i as u64 * self.src.nb[1],
                    src_elem,
                );
                let dst = row(
                    &self.rows,
                    self.rows.addr + at as u64 * self.rows.nb[1],
                    elem,
                );
                Some([src, dst])
            })
            .collect()
    }

    /// Index `i` of `indices` (the index tensor's bytes), read through its stride.
    fn index(&self, indices: &[u8], i: i64) -> Option<i64> {
        let at = i as usize * self.idx.nb[0] as usize;
        Some(match self.idx.dtype {
            DType::I64 => i64::from_le_bytes(indices.get(at..at + 8)?.try_into().ok()?),
            _ => i64::from(i32::from_le_bytes(
                indices.get(at..at + 4)?.try_into().ok()?,
            )),
        })
    }

    /// The node among `nodes[..at]` (`at` is this SET_ROWS) whose kernel computes the source,
    /// when that kernel can write the destination rows instead: a ROPE or MUL_MAT kernel
    /// (`kernel_of(k)`: the node of the kernel computing node k, its own or one whose result is
    /// node k's (qwen2's biased V: its kernel at the MUL_MAT, covering the ADD), the kernel and
    /// its operands; `None` when it runs otherwise or inside a fused kernel computing more)
    /// whose f32 output is exactly the source, which no other node reads before its memory is
    /// reused (the retargeted kernel never writes it) and the application does not read; the
    /// nodes in between (`skipped(k)`: views, which compute nothing) must not touch the
    /// destination, which the producer now writes earlier than the SET_ROWS would.
    pub fn producer<'a>(
        &self,
        nodes: &[Node],
        at: usize,
        kernel_of: impl Fn(usize) -> Option<(usize, &'a KernelDesc, &'a [Tensor])>,
        skipped: impl Fn(usize) -> bool,
    ) -> Option<(usize, RowsProducer)> {
        let src = &self.src;
        if src.dtype != DType::F32 || !src.is_contiguous() || at >= nodes.len() {
            return None;
        }
        let j = (0..at)
            .rev()
            .find(|&k| !skipped(k) && nodes[k].dst.overlaps(src))?;
        let out = &nodes[j].dst;
        let exact = out.addr == src.addr
            && out.bytes == src.bytes
            && out.dtype == DType::F32
            && out.is_contiguous()
            && !nodes[j].is_output;
        let (k, desc, operands) = kernel_of(j)?;
        let (output, inputs) = operands.split_last()?;
        let f32_dense = Layout::contiguous("f32", 4, desc.output.ne);
        if !exact
            || !RETARGETABLE.contains(&desc.op.as_str())
            || desc.output != f32_dense
            || output.addr != out.addr
            || inputs.iter().any(|t| t.overlaps(&self.dst))
        {
            return None;
        }
        let touches = |n: &Node| n.dst.overlaps(&self.dst) || n.reads(src) || n.reads(&self.dst);
        if (j + 1..at).any(|k| !skipped(k) && touches(&nodes[k])) {
            return None;
        }
        // Read after the SET_ROWS before a node overwrites it: the retargeted kernel leaves it
        // unwritten.
        for (k, n) in nodes.iter().enumerate().skip(at + 1) {
            if skipped(k) {
                continue;
            }
            if n.reads(src) {
                return None;
            }
            if n.dst.overlaps(src) {
                break;
            }
        }
        let elem = self.rows.dtype.size()?;
        let mut kernel = desc.clone();
        kernel.output = Layout::contiguous(self.rows.dtype.name(), elem, desc.output.ne);
        Some((
            k,
            RowsProducer {
                kernel,
                inputs: inputs.to_vec(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tensor::test_util::{node, tensor};
    use crate::ops::BinaryOp;

    /// SET_ROWS of `n` f32 rows of 64 into a 16-row f16 destination at 0x10000, i64 indices.
    fn set_rows(n: i64) -> Node {
        let src = tensor(DType::F32, [64, n, 1, 1], 0x1000);
        let idx = tensor(DType::I64, [n, 1, 1, 1], 0x2000);
        let dst = tensor(DType::F16, [64, 16, 1, 1], 0x10000);
        Node {
            op: Op::SetRows,
            op_params: [0; 16],
            dst,
            src: vec![Some(src), Some(idx)],
            is_output: false,
        }
    }

    fn i64_bytes(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn consecutive_indices_address_the_first_row() {
        let s = RowScatter::of(&set_rows(3), |_| true).expect("a scatter");
        assert_eq!(s.copy.op, "CPY");
        // Dense rows on both sides: the flat copy of 3 x 64 elements.
        assert_eq!(s.copy.output.ne, [192, 1, 1, 1]);
        assert_eq!(s.copy.output.dtype, "f16");
        let [src, rows] = s.operands(&i64_bytes(&[5, 6, 7])).expect("consecutive");
        assert_eq!(src.addr, 0x1000);
        // Row 5 of 128-byte f16 rows; three rows' bytes.
        assert_eq!(rows.addr, 0x10000 + 5 * 128);
        assert_eq!(rows.bytes, 3 * 128);
        assert_eq!(rows.dtype, DType::F16);
    }

    #[test]
    fn other_indices_keep_the_set_rows_kernel() {
        let s = RowScatter::of(&set_rows(3), |_| true).expect("a scatter");
        assert!(s.operands(&i64_bytes(&[5, 7, 8])).is_none(), "a gap");
        assert!(s.operands(&i64_bytes(&[7, 6, 5])).is_none(), "descending");
        assert!(
            s.operands(&i64_bytes(&[14, 15, 16])).is_none(),
            "past the last row"
        );
        assert!(s.operands(&i64_bytes(&[-1, 0, 1])).is_none(), "negative");
        assert!(s.operands(&i64_bytes(&[5, 6])).is_none(), "too few bytes");
        let one = RowScatter::of(&set_rows(1), |_| true).unwrap();
        let [_, rows] = one.operands(&i64_bytes(&[15])).expect("the last row");
        assert_eq!(rows.addr, 0x10000 + 15 * 128);
    }

    #[test]
    fn indices_apart_are_a_copy_of_a_row_each() {
        let s = RowScatter::of(&set_rows(3), |_| true).expect("a scatter");
        let row_copy = s.row_copy.clone().expect("a one-row copy");
        assert_eq!(row_copy.op, "CPY");
        assert_eq!(row_copy.output.ne, [64, 1, 1, 1]);
        // All three in one kernel: the source rows, then one output row each.
        let [rows_copy] = s.rows_copies.as_slice() else {
            panic!("one CPY_ROWS: {:?}", s.rows_copies);
        };
        assert_eq!(rows_copy.op, "CPY_ROWS");
        assert_eq!(rows_copy.inputs[0].ne, [64, 3, 1, 1]);
        assert_eq!(rows_copy.extra_outputs.len(), 2);
        for out in std::iter::once(&rows_copy.output).chain(&rows_copy.extra_outputs) {
            assert_eq!((out.dtype.as_str(), out.ne), ("f16", [64, 1, 1, 1]));
        }
        let pairs = s.row_operands(&i64_bytes(&[9, 2, 7])).expect("in range");
        let groups = s.rows_copy_groups(&pairs);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].0, Some(0));
        let addrs: Vec<u64> = groups[0].1.iter().map(|t| t.addr).collect();
        assert_eq!(
            addrs,
            [
                0x1000,
                0x10000 + 9 * 128,
                0x10000 + 2 * 128,
                0x10000 + 7 * 128
            ]
        );
        // More rows than one CPY_ROWS copies (a prompt of several sequences): groups of
        // MAX_ROWS_APART, then the rest (one row: the one-row copy).
        for (n, kernels, groups) in [(13, vec![8, 5], 2), (9, vec![8], 2), (16, vec![8], 2)] {
            let s = RowScatter::of(&set_rows(n), |_| true).unwrap();
            let sizes: Vec<usize> = s
                .rows_copies
                .iter()
                .map(|d| 1 + d.extra_outputs.len())
                .collect();
            assert_eq!(sizes, kernels, "{n} rows");
            let indices: Vec<i64> = (0..n).map(|i| (i * 5) % 16).collect();
            let pairs = s.row_operands(&i64_bytes(&indices)).unwrap();
            let got = s.rows_copy_groups(&pairs);
            assert_eq!(got.len(), groups, "{n} rows");
            for (g, (kernel, operands)) in got.iter().enumerate() {
                let rows = operands.len() - 1;
                assert_eq!(
                    *kernel,
                    (rows > 1).then(|| usize::from(rows < 8)),
                    "{n} rows"
                );
                assert_eq!(operands[0].addr, 0x1000 + (g * 8 * 256) as u64);
                assert_eq!(operands[0].ne, [64, rows as i64, 1, 1]);
            }
        }
        // Three sequences' cells, one repeated: in order, each source row to its cell.
        let pairs = s.row_operands(&i64_bytes(&[9, 2, 9])).expect("in range");
        let at: Vec<(u64, u64)> = pairs.iter().map(|[a, b]| (a.addr, b.addr)).collect();
        assert_eq!(
            at,
            [
                (0x1000, 0x10000 + 9 * 128),
                (0x1000 + 256, 0x10000 + 2 * 128),
                (0x1000 + 512, 0x10000 + 9 * 128)
            ]
        );
        for [src, dst] in &pairs {
            assert_eq!((src.ne, src.bytes), ([64, 1, 1, 1], 256));
            assert_eq!(
                (dst.ne, dst.bytes, dst.dtype),
                ([64, 1, 1, 1], 128, DType::F16)
            );
        }
        assert!(
            s.row_operands(&i64_bytes(&[9, 16, 0])).is_none(),
            "past the last row"
        );
        assert!(
            s.row_operands(&i64_bytes(&[9, -1, 0])).is_none(),
            "negative"
        );
        assert!(
            s.row_operands(&i64_bytes(&[9, 2])).is_none(),
            "too few bytes"
        );
        // One row is always consecutive: no copy of a row apart.
        assert!(RowScatter::of(&set_rows(1), |_| true)
            .unwrap()
            .row_copy
            .is_none());
    }

    #[test]
    fn i32_indices_with_a_stride_are_read_through_it() {
        let mut node = set_rows(2);
        let idx = node.src[1].as_mut().unwrap();
        idx.dtype = DType::I32;
        idx.nb = [8, 16, 16, 16];
        let s = RowScatter::of(&node, |_| true).unwrap();
        let bytes: Vec<u8> = [9i32, -1, 10, -1]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let [_, rows] = s.operands(&bytes).expect("every other word");
        assert_eq!(rows.addr, 0x10000 + 9 * 128);
    }

    /// llama's K write: a ROPE of x [64, 1, 3] at 0x4000 (positions at 0x3000) into k at
    /// 0x1000 (the source of [`set_rows`]), a reshape of k (a view, computing nothing), then the
    /// SET_ROWS; `between` are nodes inserted before the SET_ROWS, `after` nodes after it.
    fn rope_then_set_rows(between: Vec<Node>, after: Vec<Node>) -> Vec<Node> {
        let x = tensor(DType::F32, [64, 1, 3, 1], 0x4000);
        let pos = tensor(DType::I32, [3, 1, 1, 1], 0x3000);
        let k = tensor(DType::F32, [64, 1, 3, 1], 0x1000);
        let mut rope = node(Op::Rope, k.clone(), vec![x, pos]);
        rope.op_params[1] = 64;
        let view = node(
            Op::Layout,
            tensor(DType::F32, [64, 3, 1, 1], 0x1000),
            vec![k],
        );
        let mut nodes = vec![rope, view];
        nodes.extend(between);
        nodes.push(set_rows(3));
        nodes.extend(after);
        nodes
    }

    /// The producer of `nodes`' SET_ROWS, every node planned alone.
    fn producer_in(nodes: &[Node]) -> Option<(usize, RowsProducer)> {
        let plans: Vec<Plan> = nodes
            .iter()
            .map(|n| super::super::plan(n).unwrap())
            .collect();
        let at = nodes.iter().position(|n| n.op == Op::SetRows).unwrap();
        let s = RowScatter::of(&nodes[at], |_| true).unwrap();
        let kernel_of = |k: usize| match &plans[k] {
            Plan::Kernel { desc, operands } => Some((k, desc, operands.as_slice())),
            _ => None,
        };
        s.producer(nodes, at, kernel_of, |k| matches!(plans[k], Plan::Skip))
    }

    #[test]
    fn a_rope_whose_output_only_feeds_the_rows_writes_them() {
        let nodes = rope_then_set_rows(vec![], vec![]);
        let (j, p) = producer_in(&nodes).expect("the ROPE writes the rows");
        assert_eq!(j, 0);
        assert_eq!(p.kernel.op, "ROPE");
        // f16, the cache's type, in the ROPE's shape; x and the positions as inputs.
        assert_eq!(p.kernel.output.dtype, "f16");
        assert_eq!(p.kernel.output.ne, [64, 1, 3, 1]);
        assert_eq!(p.kernel.output.nb, [2, 128, 128, 384]);
        let inputs: Vec<u64> = p.inputs.iter().map(|t| t.addr).collect();
        assert_eq!(inputs, [0x4000, 0x3000]);
    }

    #[test]
    fn a_projection_whose_product_only_feeds_the_rows_writes_them() {
        // llama's V: W [32, 64] at 0x5000 times x [32, 3] at 0x6000 into the source at 0x1000.
        let w = tensor(DType::F32, [32, 64, 1, 1], 0x5000);
        let x = tensor(DType::F32, [32, 3, 1, 1], 0x6000);
        let v = tensor(DType::F32, [64, 3, 1, 1], 0x1000);
        let nodes = vec![node(Op::MulMat, v, vec![w, x]), set_rows(3)];
        let (j, p) = producer_in(&nodes).expect("the product writes the rows");
        assert_eq!(j, 0);
        assert_eq!(p.kernel.op, "MUL_MAT");
        assert_eq!(p.kernel.output.dtype, "f16");
        let inputs: Vec<u64> = p.inputs.iter().map(|t| t.addr).collect();
        assert_eq!(inputs, [0x5000, 0x6000]);
    }

    #[test]
    fn a_rope_read_elsewhere_or_a_cache_touched_in_between_keeps_the_copy() {
        let k = tensor(DType::F32, [64, 3, 1, 1], 0x1000);
        let cache = tensor(DType::F16, [64, 16, 1, 1], 0x10000);
        let out = |addr| tensor(DType::F32, [64, 3, 1, 1], addr);
        // A later node reads k before anything overwrites it.
        let reader = node(
            Op::Binary(BinaryOp::Add),
            out(0x8000),
            vec![k.clone(), k.clone()],
        );
        assert!(producer_in(&rope_then_set_rows(vec![], vec![reader.clone()])).is_none());
        assert!(producer_in(&rope_then_set_rows(vec![reader], vec![])).is_none());
        // One that overwrites k first ends it.
        let over = node(
            Op::Binary(BinaryOp::Add),
            out(0x1000),
            vec![out(0x8000), out(0x8000)],
        );
        let reader = node(Op::Binary(BinaryOp::Add), out(0x9000), vec![k.clone(), k]);
        assert!(producer_in(&rope_then_set_rows(vec![], vec![over, reader])).is_some());
        // A node in between reading the cache would see the rows written early.
        let cache_reader = node(
            Op::Cpy,
            tensor(DType::F16, [64, 16, 1, 1], 0x20000),
            vec![cache],
        );
        assert!(producer_in(&rope_then_set_rows(vec![cache_reader], vec![])).is_none());
        // The application reads the ROPE's output.
        let mut nodes = rope_then_set_rows(vec![], vec![]);
        nodes[0].is_output = true;
        assert!(producer_in(&nodes).is_none());
        // Not a ROPE: a copy into k.
        let mut nodes = rope_then_set_rows(vec![], vec![]);
        nodes[0] = node(Op::Cpy, nodes[0].dst.clone(), vec![out(0x8000)]);
        nodes[0].dst.ne = [64, 1, 3, 1];
        assert!(producer_in(&nodes).is_none());
    }

    #[test]
    fn only_one_matrix_of_rows_with_its_copy_kernel() {
        assert!(
            RowScatter::of(&set_rows(3), |_| false).is_none(),
            "no copy kernel"
        );
        let mut batched = set_rows(3);
        batched.src[0].as_mut().unwrap().ne[2] = 2;
        assert!(RowScatter::of(&batched, |_| true).is_none());
        let mut too_many = set_rows(17);
        too_many.src[1].as_mut().unwrap().ne[0] = 17;
        assert!(RowScatter::of(&too_many, |_| true).is_none());
        let mut add = set_rows(3);
        add.op = Op::Binary(crate::ops::BinaryOp::Add);
        assert!(RowScatter::of(&add, |_| true).is_none());
    }
}
