//! Graph rewrites (architecture §7: fewer dispatches): which nodes one kernel computes.
//!
//! A graph's plan is one [`Step`] per node. Every rewrite is one row of [`REWRITES`]
//! (`table.rs`): its name, the node it is asked about, the work its kernel takes over and its
//! builder (`builders.rs`). A builder recognises its pattern with the shared rules of `rules.rs`
//! (nothing else reads what the absorbed nodes wrote, nothing in between writes what the kernel
//! reads, no output overlaps an input), leaving the nodes as they are whenever the graph differs
//! from it, and lays out the kernel's operands and parameters ([`Rewritten`]). [`apply`] puts a
//! rewrite into the plan: the kernel's node gets a [`KernelStep`] holding the steps it replaced
//! (its `fallback`), and the nodes it covers get [`Step::Covered`].
//!
//! The stream applies the rows one [`Stage`] at a time and loads the kernels each stage made
//! before the next stage looks at them. A kernel the compiler refuses gives its nodes back the
//! steps they had before. A kernel writing KV-cache rows ([`CacheRows`]) learns which rows when
//! the graph runs, from the indices of the SET_ROWS it absorbs; when they are not consecutive, its
//! fallback runs in its place.

mod builders;
mod fused;
mod kv_length;
mod rules;
mod table;

pub use kv_length::named_by_n_kv;
pub use table::{Rewrite, Stage, REWRITES};

use super::host::HostOp;
use super::pieces::Piece;
use super::plan::{Plan, PlanOptions};
use super::scatter::RowScatter;
use super::tensor::{Node, Tensor};
use crate::kernels::KernelDesc;

/// What one node of a graph becomes. `K` is the loaded kernel's handle (the stream's).
// Kernel is the common variant (most nodes of a model's graph); boxing it would add an
// allocation per node to save memory only on the rarer ones.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Step<K> {
    /// A kernel, computing this node and those it covers.
    Kernel(KernelStep<K>),
    /// Runs on the host.
    Host(Box<HostOp>),
    /// No NPU kernel (the reason): ggml's CPU backend computes it (`GGML_HSA_CPU_FALLBACK`).
    Cpu(String),
    /// Nothing to compute (layout-only ops, empty tensors).
    Skip,
    /// Computed by the kernel of another node.
    Covered,
}

/// A kernel step.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelStep<K> {
    pub desc: KernelDesc,
    /// The tensors bound to its operands: inputs in the kernel's order, the output, then
    /// `desc.extra_outputs`'. Those `rows` names stand for the whole cache until dispatch.
    pub operands: Vec<Tensor>,
    /// The other nodes it computes.
    pub covers: Vec<usize>,
    /// Operands that are KV-cache rows named when the graph runs.
    pub rows: Vec<CacheRows>,
    /// The steps of its node and of the nodes it covers before it replaced them, in node
    /// order: put back when its kernel is refused, and run in its place when its rows are not
    /// consecutive.
    pub fallback: Vec<(usize, Step<K>)>,
    /// The KV length given to a kernel that takes it at dispatch (`KernelDesc::n_kv_step`).
    pub n_kv: Option<u32>,
    /// The kernel, once loaded.
    pub loaded: Option<K>,
    /// The kernels over slices of its rows it runs as instead ([`crate::ops::pieces`]): `None`
    /// until that is decided; empty: it runs whole, as `loaded`.
    pub pieces: Option<Vec<Piece<K>>>,
    /// A copy into cache rows (its one `rows` entry's `scatter.copy`): the one-row copy
    /// (`scatter.row_copy`) once loaded, dispatched once per index when they are not
    /// consecutive.
    pub row_copy: Option<K>,
    /// A copy into cache rows: the copies of its rows apart in groups (`scatter.rows_copies`,
    /// in their order) once loaded, dispatched in place of the one-row copies.
    pub rows_copies: Vec<K>,
}

impl<K> KernelStep<K> {
    /// The one-row copy to load for a copy into cache rows (see `row_copy`).
    pub fn row_copy_desc(&self) -> Option<&KernelDesc> {
        match self.rows.as_slice() {
            [r] if r.scatter.copy == self.desc => r.scatter.row_copy.as_ref(),
            _ => None,
        }
    }

    /// The copies of rows apart in groups to load for a copy into cache rows (see
    /// `rows_copies`).
    pub fn rows_copy_descs(&self) -> &[KernelDesc] {
        match self.rows.as_slice() {
            [r] if r.scatter.copy == self.desc => &r.scatter.rows_copies,
            _ => &[],
        }
    }

    /// How many of the operands (the last ones) it writes.
    pub fn outputs(&self) -> usize {
        1 + self.desc.extra_outputs.len()
    }
}

/// A kernel operand that is the rows of a KV cache a SET_ROWS names: addressed when the graph
/// runs, if its indices name consecutive rows (`RowScatter::operands`).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheRows {
    /// The operand's index.
    pub operand: usize,
    /// The SET_ROWS node: it runs nothing once the kernel wrote its rows.
    pub set_rows: usize,
    pub scatter: RowScatter,
}

impl<K> Step<K> {
    /// The step of a node planned on its own.
    pub fn of(plan: Plan) -> Step<K> {
        match plan {
            Plan::Skip => Step::Skip,
            Plan::Host(op) => Step::Host(op),
            Plan::Kernel { desc, operands } => Step::Kernel(KernelStep {
                desc,
                operands,
                covers: Vec::new(),
                rows: Vec::new(),
                fallback: Vec::new(),
                n_kv: None,
                loaded: None,
                pieces: None,
                row_copy: None,
                rows_copies: Vec::new(),
            }),
        }
    }

    /// What the builders see of it.
    pub fn planned(&self) -> Planned<'_> {
        match self {
            Step::Kernel(k) => Planned::Kernel(&k.desc, &k.operands),
            Step::Covered => Planned::Covered,
            Step::Skip => Planned::Nothing,
            Step::Host(_) | Step::Cpu(_) => Planned::Elsewhere,
        }
    }
}

/// What a builder sees of a node's step.
#[derive(Debug, Clone, Copy)]
pub enum Planned<'a> {
    /// A kernel, and its operands.
    Kernel(&'a KernelDesc, &'a [Tensor]),
    /// Computed by the kernel of another node.
    Covered,
    /// Nothing to compute (views).
    Nothing,
    /// The host or the CPU computes it.
    Elsewhere,
}

/// The steps of a graph as builders see them, whatever the stream's kernel handles are.
pub trait Steps {
    fn planned(&self, k: usize) -> Planned<'_>;
    /// A kernel step's cache-row operands and covered nodes (empty for other steps).
    fn rows(&self, k: usize) -> &[CacheRows];
    fn covers(&self, k: usize) -> &[usize];
}

/// A graph's steps seen as [`Steps`].
struct StepList<'a, K>(&'a [Step<K>]);

impl<K> Steps for StepList<'_, K> {
    fn planned(&self, k: usize) -> Planned<'_> {
        self.0[k].planned()
    }

    fn rows(&self, k: usize) -> &[CacheRows] {
        match &self.0[k] {
            Step::Kernel(step) => &step.rows,
            _ => &[],
        }
    }

    fn covers(&self, k: usize) -> &[usize] {
        match &self.0[k] {
            Step::Kernel(step) => &step.covers,
            _ => &[],
        }
    }
}

/// What a builder is given: the graph's nodes, their steps so far, the plan options.
pub struct Graph<'a> {
    pub nodes: &'a [Node],
    pub steps: &'a dyn Steps,
    pub options: PlanOptions,
}

impl std::fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({} nodes)", self.nodes.len())
    }
}

impl<'a> Graph<'a> {
    pub fn planned(&self, k: usize) -> Planned<'a> {
        self.steps.planned(k)
    }
}

/// A kernel a builder made: it runs at node `at` and computes the nodes of `covers` too.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewritten {
    pub at: usize,
    pub covers: Vec<usize>,
    pub desc: KernelDesc,
    pub operands: Vec<Tensor>,
    pub rows: Vec<CacheRows>,
    /// The KV length given at dispatch, when its desc takes one (`kv_length`).
    pub n_kv: Option<u32>,
}

impl Rewritten {
    /// A kernel at `at` covering `covers`, with no cache rows.
    pub fn kernel(
        at: usize,
        covers: Vec<usize>,
        desc: KernelDesc,
        operands: Vec<Tensor>,
    ) -> Rewritten {
        Rewritten {
            at,
            covers,
            desc,
            operands,
            rows: Vec::new(),
            n_kv: None,
        }
    }
}

/// Applies the rows of `stage` to `steps`, in table order, each at every node in turn; a
/// kernel `available` declines is not made.
pub fn apply<K: Clone>(
    stage: Stage,
    nodes: &[Node],
    steps: &mut [Step<K>],
    options: PlanOptions,
    available: &dyn Fn(&KernelDesc) -> bool,
) {
    if stage == Stage::Fusions {
        kv_length::steps_at_run_time(steps, nodes, available);
    }
    for row in REWRITES.iter().filter(|r| r.stage == stage) {
        for anchor in 0..nodes.len() {
            let view = StepList(&*steps);
            let graph = Graph {
                nodes,
                steps: &view,
                options,
            };
            let mut group = (row.build)(&graph, anchor);
            for r in &mut group {
                kv_length::at_run_time(r, nodes, available);
            }
            if group.is_empty() || !group.iter().all(|r| available(&r.desc)) {
                continue;
            }
            replace(steps, group);
        }
    }
}

/// Puts the kernels of one rewrite into `steps`; each keeps the steps it replaced (taken before
/// any of the group's changes) and covers the nodes they covered.
fn replace<K: Clone>(steps: &mut [Step<K>], group: Vec<Rewritten>) {
    let fallbacks: Vec<Vec<(usize, Step<K>)>> = group
        .iter()
        .map(|r| {
            let mut nodes: Vec<usize> = r.covers.iter().copied().chain([r.at]).collect();
            nodes.sort_unstable();
            nodes.dedup();
            nodes.into_iter().map(|k| (k, steps[k].clone())).collect()
        })
        .collect();
    for (r, fallback) in group.into_iter().zip(fallbacks) {
        // It computes the nodes the kernels it takes over computed too.
        let mut covers = r.covers;
        for (_, before) in &fallback {
            if let Step::Kernel(k) = before {
                covers.extend(&k.covers);
            }
        }
        covers.retain(|&c| c != r.at);
        covers.sort_unstable();
        covers.dedup();
        for &c in &covers {
            steps[c] = Step::Covered;
        }
        steps[r.at] = Step::Kernel(KernelStep {
            desc: r.desc,
            operands: r.operands,
            covers,
            rows: r.rows,
            fallback,
            n_kv: r.n_kv,
            loaded: None,
            pieces: None,
            row_copy: None,
            rows_copies: Vec::new(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::tensor::test_util::{node, tensor};
    use crate::ops::tensor::{BinaryOp, DType, Op};

    /// A SET_ROWS of 3 f32 rows of 64 into a 16-row f16 cache at 0x10000, by i64 indices the
    /// application sets (at 0x2000).
    fn set_rows() -> Node {
        node(
            Op::SetRows,
            tensor(DType::F16, [64, 16, 1, 1], 0x10000),
            vec![
                tensor(DType::F32, [64, 3, 1, 1], 0x1000),
                tensor(DType::I64, [3, 1, 1, 1], 0x2000),
            ],
        )
    }

    #[test]
    fn a_set_rows_on_the_cpu_or_the_host_becomes_a_copy_falling_back_to_it() {
        let nodes = [set_rows()];
        for before in [Step::<()>::Cpu("refused".into()), Step::Skip] {
            let mut steps = vec![before.clone()];
            apply(
                Stage::CacheCopies,
                &nodes,
                &mut steps,
                PlanOptions::default(),
                &|_| true,
            );
            match (&before, &steps[0]) {
                (Step::Cpu(_), Step::Kernel(k)) => {
                    assert_eq!(k.desc.op, "CPY");
                    assert_eq!(k.rows.len(), 1);
                    assert_eq!((k.rows[0].operand, k.rows[0].set_rows), (1, 0));
                    assert_eq!(k.fallback, vec![(0, before.clone())]);
                }
                // Nothing planned to run there: nothing to copy in its place.
                (Step::Skip, Step::Skip) => {}
                other => panic!("{other:?}"),
            }
        }
        // A copy the kernel store does not provide: the SET_ROWS stays as planned.
        let mut steps = vec![Step::<()>::Cpu("refused".into())];
        apply(
            Stage::CacheCopies,
            &nodes,
            &mut steps,
            PlanOptions::default(),
            &|_| false,
        );
        assert!(matches!(steps[0], Step::Cpu(_)));
    }

    /// Q's, K's and V's kernels and the SET_ROWS of K and V into their caches, then an
    /// attention over those caches whose q has `streams` streams (`streams` > 1: a cache per
    /// sequence, its rows never consecutive), through the stages up to the projections' merge.
    fn qkv_steps(streams: i64) -> (Vec<Node>, Vec<Step<()>>) {
        let (mut nodes, plans) = builders::tests::qkv_graph(None);
        let mut steps: Vec<Step<()>> = plans
            .into_iter()
            .map(|p| p.map_or_else(|| Step::Cpu("SET_ROWS".into()), Step::of))
            .collect();
        let cache = |addr| tensor(DType::F16, [16, 8, 1, streams], addr);
        let q = tensor(DType::F32, [16, 1, 4, streams], 0xa000);
        let out = tensor(DType::F32, [16, 4, 1, streams], 0x60000);
        nodes.push(node(
            Op::FlashAttnExt,
            out,
            vec![q, cache(0x40000), cache(0x50000)],
        ));
        steps.push(Step::Cpu("FLASH_ATTN_EXT".into()));
        // A later layer's K in Q's memory (reused), copied into its own cache: Q's result is
        // not that copy's source.
        let reused = tensor(DType::F32, [16, 1, 1, 1], 0xa000);
        let set = node(
            Op::SetRows,
            tensor(DType::F16, [16, 8, 1, 1], 0x70000),
            vec![reused.clone(), tensor(DType::I64, [1, 1, 1, 1], 0x4000)],
        );
        nodes.extend([node(Op::Binary(BinaryOp::Add), reused, vec![]), set]);
        steps.extend([Step::Cpu("ADD".into()), Step::Cpu("SET_ROWS".into())]);
        for stage in [
            Stage::CacheCopies,
            Stage::CacheProducers,
            Stage::Projections,
        ] {
            apply(stage, &nodes, &mut steps, PlanOptions::default(), &|_| true);
        }
        (nodes, steps)
    }

    /// The merged Q/K/V kernel at V's node of `qkv_steps`, and its K's and V's output types.
    fn merged(steps: &[Step<()>]) -> (&KernelStep<()>, Vec<&str>) {
        let Step::Kernel(k) = &steps[2] else {
            panic!("{:?}", steps[2]);
        };
        assert_eq!(k.desc.op, "RMS_NORM_QKV_ROPE");
        let types = k.desc.extra_outputs.iter().map(|l| l.dtype.as_str());
        (k, types.collect())
    }

    #[test]
    fn q_k_and_v_merge_writing_the_cache_rows_or_for_a_cache_per_sequence_their_own() {
        // One cache: K and V write their rows (named when the graph runs), Q, K and V one
        // kernel at V's node, the copies' nodes running nothing once it has run.
        let (_, steps) = qkv_steps(1);
        let (k, types) = merged(&steps);
        assert_eq!(types, ["f16", "f16"]);
        let set_rows: Vec<usize> = k.rows.iter().map(|r| r.set_rows).collect();
        assert_eq!(set_rows, [3, 4]);
        // A cache per sequence: K and V are not retargeted (their rows are apart in every step
        // of several sequences); the merged kernel writes their f32 results, which the SET_ROWS
        // copies after it put into each sequence's rows.
        let (nodes, steps) = qkv_steps(4);
        let (k, types) = merged(&steps);
        assert_eq!(types, ["f32", "f32"]);
        assert!(k.rows.is_empty());
        let outputs: Vec<u64> = k.operands[k.operands.len() - 3..]
            .iter()
            .map(|t| t.addr)
            .collect();
        assert_eq!(
            outputs,
            [nodes[0].dst.addr, nodes[1].dst.addr, nodes[2].dst.addr]
        );
        assert_eq!((&steps[0], &steps[1]), (&Step::Covered, &Step::Covered));
        for s in [3, 4] {
            let Step::Kernel(copy) = &steps[s] else {
                panic!("{:?}", steps[s]);
            };
            assert_eq!((copy.desc.op.as_str(), copy.rows[0].set_rows), ("CPY", s));
        }
    }
}
