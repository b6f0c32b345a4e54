//! A backend stream: one HSA queue on a device, executing graphs.
//!
//! Consecutive kernel nodes are encoded into the queue ring and submitted behind one doorbell (at
//! most [`MAX_PACKETS_PER_DOORBELL`]); ROCR turns them into one command chain. Host-side nodes run
//! immediately when they touch nothing a pending kernel reads or writes, and otherwise wait for
//! the pending batch first, so the device is only waited for where a result is needed.
//!
//! ROCR keeps at most [`MAX_PDIS_PER_QUEUE`] distinct PDIs per queue and fails the next one; a
//! stream about to exceed that submits what it has and starts a fresh queue. So does a stream
//! whose queue has run kernels when the device has since evicted some: ROCR knows cached PDIs
//! by their buffers, and a kernel loaded into an evicted one's memory must not pass for it.
//!
//! A graph's plan (each node's step, the fusion decisions and the loaded kernels) is kept for the
//! next graph with the same [`GraphKey`]: llama.cpp's decode loop hands over the same graph for
//! every token, and re-planning, re-fusing and looking every kernel up again would cost more host
//! time than the node takes on the device.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::device::{Device, DeviceError, LoadedKernel, OPERAND_ALIGNMENT};
use super::stats::{self, GraphStats, NodeRun};
use crate::hsa::memory::PoolAlloc;
use crate::hsa::packet::Operand;
use crate::hsa::queue::{Queue, SubmitError, QUEUE_SIZE};
use crate::hsa::signal::{Signal, DEVICE_TIMEOUT};
use crate::kernels::KernelDesc;
use crate::ops::host::HostOp;
use crate::ops::{self, Memory, Node, Plan, RowScatter, RowsProducer, Tensor};

/// Packets behind one doorbell: half the ring, and below the ~40 commands ROCR fits into one
/// command chain.
pub const MAX_PACKETS_PER_DOORBELL: usize = 32;
/// Distinct PDIs ROCR caches per queue.
pub const MAX_PDIS_PER_QUEUE: usize = 32;
/// Operands one kernel may take (inputs plus outputs): DECODE_LAYER_FF_<GLU> takes 22.
pub const MAX_OPERANDS: usize = 24;

const _: () = assert!(MAX_PACKETS_PER_DOORBELL as u32 <= QUEUE_SIZE);

/// Runs host-side ops: implemented by `ffi`, which owns access to ggml's tensor memory.
pub trait HostMemory {
    fn run(&mut self, op: &HostOp) -> Result<(), String>;
    /// Computes node `index` of the graph on ggml's CPU backend (`GGML_HSA_CPU_FALLBACK`).
    fn run_on_cpu(&mut self, index: usize) -> Result<(), String>;
    /// The bytes of `t` (from its address, `t.bytes` of them), read on the host.
    fn read(&mut self, t: &Tensor) -> Result<Vec<u8>, String>;
}

/// What one node becomes.
#[derive(Debug)]
enum Step {
    Plan(Plan),
    /// No NPU kernel (`reason`): ggml's CPU backend computes it (`GGML_HSA_CPU_FALLBACK`).
    Cpu(String),
    /// Computed by another node's kernel: the first node of its fused run, or a fold's kernel.
    Fused,
}

/// What the folds over the planned graph (`ops::fold_rms_norm`, `ops::fold_rope`) see of a step.
fn planned(steps: &[Step], k: usize) -> ops::Planned<'_> {
    match &steps[k] {
        Step::Plan(Plan::Kernel { desc, operands }) => ops::Planned::Kernel(desc, operands),
        Step::Fused => ops::Planned::Covered,
        Step::Plan(Plan::Skip) => ops::Planned::Nothing,
        _ => ops::Planned::Elsewhere,
    }
}

/// The folds applied to a graph's steps, each with the steps it replaced, so that a fold whose
/// kernel is refused at compile time can be undone.
#[derive(Default)]
struct Folds {
    list: Vec<Fold>,
    /// The fold whose kernel each node runs.
    of: HashMap<usize, usize>,
}

#[derive(Default)]
struct Fold {
    /// Each changed node, its step before the fold and the fold that made that step, if any
    /// (empty once undone).
    originals: Vec<(usize, Step, Option<usize>)>,
    /// Folds made on top of this one's kernels: undone before it.
    dependents: Vec<usize>,
}

impl Folds {
    /// Replaces the steps of `changes`' nodes; returns the fold's id.
    fn apply(&mut self, steps: &mut [Step], changes: Vec<(usize, Step)>) -> usize {
        let id = self.list.len();
        let mut originals = Vec::with_capacity(changes.len());
        for (k, step) in changes {
            let before = if matches!(step, Step::Plan(_)) {
                self.of.insert(k, id)
            } else {
                self.of.get(&k).copied()
            };
            originals.push((k, std::mem::replace(&mut steps[k], step), before));
        }
        self.list.push(Fold {
            originals,
            dependents: Vec::new(),
        });
        id
    }

    /// Folds the kernels of nodes `from` into node `into`, which runs `plan`; a dependent of the
    /// fold that made `into`'s kernel, else of the one that made the first of `from`'s, if any.
    fn apply_on(&mut self, steps: &mut [Step], from: &[usize], into: usize, plan: Plan) {
        let within = self
            .of
            .get(&into)
            .or_else(|| from.first().and_then(|k| self.of.get(k)))
            .copied();
        let mut changes: Vec<(usize, Step)> = from.iter().map(|&k| (k, Step::Fused)).collect();
        changes.push((into, Step::Plan(plan)));
        let id = self.apply(steps, changes);
        if let Some(parent) = within {
            self.list[parent].dependents.push(id);
        }
    }

    /// Undoes fold `id` (its dependents first); returns the nodes whose steps were restored.
    fn undo(&mut self, id: usize, steps: &mut [Step]) -> Vec<usize> {
        let mut restored = Vec::new();
        for d in std::mem::take(&mut self.list[id].dependents) {
            restored.extend(self.undo(d, steps));
        }
        for (k, original, before) in std::mem::take(&mut self.list[id].originals) {
            // The node's kernel is again the one the earlier fold made (a fold on top of
            // another's kernel), or no fold's.
            if self.of.get(&k) == Some(&id) {
                match before {
                    Some(b) => self.of.insert(k, b),
                    None => self.of.remove(&k),
                };
            }
            steps[k] = original;
            restored.push(k);
        }
        restored
    }
}

/// Why a graph failed.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("node {index} ({op}): {reason}")]
    Node {
        index: usize,
        op: &'static str,
        reason: String,
    },
    #[error("node {index} ({op}): {source}")]
    Device {
        index: usize,
        op: &'static str,
        source: DeviceError,
    },
    #[error("submitting {packets} kernel(s): {source}")]
    Submit { packets: usize, source: SubmitError },
    #[error("node {index} ({op}, kernel {kernel}) failed on the NPU (packet {at} of a batch of {packets}): {source}")]
    NodeFailed {
        index: usize,
        op: &'static str,
        kernel: String,
        at: usize,
        packets: usize,
        source: SubmitError,
    },
    #[error("submitting {packets} kernel(s): {reason}")]
    Completion { packets: usize, reason: String },
    #[error("creating a queue: {0}")]
    Queue(DeviceError),
}

/// Graphs whose plans a stream keeps (most recently used first): the decode graph, the prompt
/// graph and a few more (llama.cpp's graphs change shape as the KV cache grows).
pub const PLAN_CACHE_ENTRIES: usize = 8;

/// What identifies a graph for the plan cache: two graphs with equal keys have equal nodes, so
/// the plan of one is the plan of the other.
#[derive(Debug, Clone, Copy)]
pub enum GraphKey<'a> {
    /// Words the C entry reads from ggml's tensors (`ffi::descriptors::graph_key`): everything
    /// a node's descriptor is made of (op, op_params, flags, and for the node and each source
    /// its type, shape, strides, data address and buffer type).
    Words(&'a [u64]),
    /// The descriptors themselves.
    Nodes(&'a [Node]),
}

#[derive(Debug, PartialEq)]
enum OwnedKey {
    Words(Vec<u64>),
    Nodes(Vec<Node>),
}

impl GraphKey<'_> {
    fn matches(&self, key: &OwnedKey) -> bool {
        match (self, key) {
            (GraphKey::Words(a), OwnedKey::Words(b)) => *a == b.as_slice(),
            (GraphKey::Nodes(a), OwnedKey::Nodes(b)) => *a == b.as_slice(),
            _ => false,
        }
    }

    fn to_owned(self) -> OwnedKey {
        match self {
            GraphKey::Words(w) => OwnedKey::Words(w.to_vec()),
            GraphKey::Nodes(n) => OwnedKey::Nodes(n.to_vec()),
        }
    }
}

/// A planned graph: what the nodes became, before anything ran.
#[derive(Debug)]
struct GraphPlan {
    steps: Vec<Step>,
    /// Memory of the attention outputs moved out of the way of the block after them
    /// (`ops::relocate`); the plan's operands point into it.
    _scratch: Option<crate::hsa::memory::PoolAlloc>,
    /// The one-row GET_ROWS whose readers read their source (`ops::forward_gathers`): their
    /// indices are checked before the graph runs.
    forwarded: Vec<ops::Forwarded>,
    /// The loaded kernel of every kernel step.
    kernels: Vec<Option<Arc<LoadedKernel>>>,
    /// Each node's op, to name it in errors and statistics.
    ops: Vec<&'static str>,
    /// The SET_ROWS kernel steps that run as a copy into the rows their indices name when the
    /// indices are consecutive (`ops::scatter`), with the copy's loaded kernel.
    scatters: Vec<Option<(RowScatter, Arc<LoadedKernel>)>>,
    /// The kernel steps that, when their SET_ROWS's indices are consecutive, write its
    /// destination rows themselves (`RowScatter::producer`), with the retargeted kernel.
    producers: Vec<Option<(RowsProducer, Arc<LoadedKernel>)>>,
    /// Q's, K's and V's kernels merged into one (`ops::merge_qkv`), at the node where it runs.
    merged: Vec<Option<MergedKernel>>,
    /// The member nodes of a merge that run at the merge's node, not at their own.
    deferred: Vec<bool>,
    /// A decode layer's Q/K/V merge and attention kernel as one (`ops::merge_layer`), at the
    /// attention kernel's node.
    layers: Vec<Option<LayerKernel>>,
}

/// One kernel for a llama decode layer (`ops::merge_layer`): dispatched when K's and V's rows
/// can be written directly, as the Q/K/V merge it contains is; otherwise the merge (or its
/// members), the two SET_ROWS and the attention's kernel run in turn.
#[derive(Debug)]
struct LayerKernel {
    /// The node of the Q/K/V merge it contains (deferred to this one).
    merge_at: usize,
    /// K's and V's SET_ROWS (deferred to this one too).
    set_rows: [usize; 2],
    kernel: Arc<LoadedKernel>,
    /// Its operands before K's and V's rows, and after them.
    before_rows: Vec<Tensor>,
    after_rows: Vec<Tensor>,
}

/// One kernel in place of several (`ops::merge_qkv`): dispatched when each member's rows can
/// be written directly (its SET_ROWS's indices are consecutive); the members run one by one
/// otherwise.
#[derive(Debug)]
struct MergedKernel {
    members: [usize; 3],
    kernel: Arc<LoadedKernel>,
    /// Its operands before the rows of the members writing cache rows.
    operands: Vec<Tensor>,
}

/// Plans of recent graphs, most recently used first.
#[derive(Debug, Default)]
struct PlanCache {
    entries: Vec<(OwnedKey, Arc<GraphPlan>)>,
    hits: u64,
    misses: u64,
}

impl PlanCache {
    fn get(&mut self, key: GraphKey) -> Option<Arc<GraphPlan>> {
        let at = self.entries.iter().position(|(k, _)| key.matches(k))?;
        let entry = self.entries.remove(at);
        let plan = entry.1.clone();
        self.entries.insert(0, entry);
        Some(plan)
    }

    fn insert(&mut self, key: GraphKey, plan: Arc<GraphPlan>) {
        self.entries.truncate(PLAN_CACHE_ENTRIES - 1);
        self.entries.insert(0, (key.to_owned(), plan));
    }
}

/// A byte range `[start, end)` of a pending kernel's operand.
#[derive(Debug, Clone, Copy)]
struct Pending {
    start: u64,
    end: u64,
    written: bool,
}

#[derive(Debug)]
pub struct Stream {
    device: &'static Device,
    /// `None` after a failed submission: the next one creates a fresh queue.
    queue: Option<Queue>,
    completion: crate::hsa::signal::Signal,
    args: PoolAlloc,
    args_stride: usize,
    /// The kernels (load ids) whose PDIs the queue holds.
    resident_pdis: HashSet<u64>,
    /// The device's eviction count when `resident_pdis` was last checked against it.
    evictions_seen: u64,
    batch: Vec<[u8; 64]>,
    batch_kernels: Vec<Arc<LoadedKernel>>,
    /// The graph node (index, op) of each packet of the batch, to name a failing one.
    batch_nodes: Vec<(usize, &'static str)>,
    pending: Vec<Pending>,
    /// The running graph's statistics (`GGML_HSA_STATS`).
    stats: GraphStats,
    plans: PlanCache,
}

impl Stream {
    pub fn new(device: &'static Device) -> Result<Stream, DeviceError> {
        let format = device.packet_abi.format();
        let args_stride = format.args_bytes(MAX_OPERANDS).next_multiple_of(64);
        let rt = device.runtime;
        let stream = Stream {
            device,
            queue: Some(rt.queue(device.npu.agent.agent)?),
            completion: rt.signal(0)?,
            args: rt.allocate(
                device.pools.kernarg.pool,
                args_stride * MAX_PACKETS_PER_DOORBELL,
            )?,
            args_stride,
            resident_pdis: HashSet::new(),
            evictions_seen: device.evictions(),
            batch: Vec::new(),
            batch_kernels: Vec::new(),
            batch_nodes: Vec::new(),
            pending: Vec::new(),
            stats: GraphStats::default(),
            plans: PlanCache::default(),
        };
        device.stream_opened();
        Ok(stream)
    }

    pub fn device(&self) -> &'static Device {
        self.device
    }

    /// Executes `nodes` in order. On error the graph stops; kernels already submitted have run.
    /// A panic in the middle (caught by the C entry's guard) leaves nothing behind: the batch and
    /// pending lists are discarded on the way out, so the next graph submits only its own work.
    pub fn compute(
        &mut self,
        nodes: &[Node],
        host: &mut dyn HostMemory,
    ) -> Result<(), ComputeError> {
        let started = std::time::Instant::now();
        self.compute_keyed(
            GraphKey::Nodes(nodes),
            &|| Cow::Borrowed(nodes),
            host,
            started,
        )
    }

    /// Executes the graph `key` identifies: its cached plan when there is one, otherwise the
    /// plan of `nodes()` (called only then), which is kept for the next graph with this key.
    /// `started`: when the caller began on the graph (reading the key is host time too).
    pub fn compute_keyed<'n>(
        &mut self,
        key: GraphKey,
        nodes: &dyn Fn() -> Cow<'n, [Node]>,
        host: &mut dyn HostMemory,
        started: std::time::Instant,
    ) -> Result<(), ComputeError> {
        let result = UnwindGuard(self).compute_graph(key, nodes, host);
        let recorder = stats::recorder();
        let graph = std::mem::take(&mut self.stats);
        if recorder.enabled() {
            recorder.record(&graph, started.elapsed());
        }
        result
    }

    /// Plan cache hits and misses of this stream so far.
    pub fn plan_cache_counts(&self) -> (u64, u64) {
        (self.plans.hits, self.plans.misses)
    }

    fn compute_graph<'n>(
        &mut self,
        key: GraphKey,
        nodes: &dyn Fn() -> Cow<'n, [Node]>,
        host: &mut dyn HostMemory,
    ) -> Result<(), ComputeError> {
        let plan = match self.plans.get(key) {
            Some(plan) => {
                self.plans.hits += 1;
                self.stats.plan_hits += 1;
                plan
            }
            None => {
                self.plans.misses += 1;
                let nodes = nodes();
                let plan = match self.plan_graph(&nodes) {
                    // Cached plans hold their kernels, which keeps the device from evicting
                    // them: when the dev heap is full, the graph is planned again without them.
                    Err(ComputeError::Device {
                        source: DeviceError::DevHeapFull { .. },
                        ..
                    }) if !self.plans.entries.is_empty() => {
                        self.plans.entries.clear();
                        self.plan_graph(&nodes)?
                    }
                    planned => planned?,
                };
                let plan = Arc::new(plan);
                self.plans.insert(key, plan.clone());
                plan
            }
        };
        if stats::recorder().enabled() {
            for (step, &op) in plan.steps.iter().zip(&plan.ops) {
                let run = match step {
                    Step::Plan(Plan::Skip) => NodeRun::Skipped,
                    // The fused node runs inside the kernel of the node before it.
                    Step::Plan(Plan::Kernel { .. }) | Step::Fused => NodeRun::Kernel,
                    Step::Plan(Plan::Host(_)) => NodeRun::Host,
                    Step::Cpu(_) => NodeRun::Cpu,
                };
                self.stats.node(op, run);
            }
        }
        // The SET_ROWS nodes whose rows their source's producer wrote.
        let mut rows_written = vec![false; plan.steps.len()];
        let mut result = plan.forwarded.iter().try_for_each(|f| {
            let failed = |reason| ComputeError::Node {
                index: f.node,
                op: plan.ops[f.node],
                reason,
            };
            f.check(&host.read(&f.idx).map_err(failed)?).map_err(failed)
        });
        for i in 0..plan.steps.len() {
            if result.is_err() {
                break;
            }
            let ran = if let Some(layer) = &plan.layers[i] {
                self.run_layer(&plan, layer, i, host, &mut rows_written)
            } else if plan.deferred[i] {
                Ok(())
            } else if let Some(merged) = &plan.merged[i] {
                self.run_merged(&plan, merged, i, host, &mut rows_written)
            } else {
                self.run_step(&plan, i, host, &mut rows_written)
            };
            if let Err(e) = ran {
                result = Err(e);
                break;
            }
        }
        let flushed = self.flush();
        let result = result.and(flushed);
        if result.is_err() {
            // Nothing in a plan depends on the queue, but a graph that failed is planned afresh
            // next time rather than trusted.
            self.plans.entries.clear();
        }
        result
    }

    /// Plans `nodes`: each node's step, the fusions, and every kernel loaded (compiled first
    /// when missing).
    fn plan_graph(&mut self, graph: &[Node]) -> Result<GraphPlan, ComputeError> {
        match self.plan_graph_moving(graph, true)? {
            Some(plan) => Ok(plan),
            // A node reading a moved attention output runs on the CPU, which reads the graph's
            // own memory: planned again without the move.
            None => Ok(self
                .plan_graph_moving(graph, false)?
                .expect("nothing moved")),
        }
    }

    /// Plans `graph`, with the attention outputs the block after them would clobber moved to
    /// scratch memory when `moving` (`ops::relocate`); `None` when a node reading a moved
    /// output ended up on the CPU.
    fn plan_graph_moving(
        &mut self,
        graph: &[Node],
        moving: bool,
    ) -> Result<Option<GraphPlan>, ComputeError> {
        // A one-row GET_ROWS (llama's last layer decoding one token) is a view its readers read
        // through, so that its layer folds and chains as the others do.
        let (nodes, mut forwarded) = ops::forward_gathers(graph);
        let (moves, bytes) = if moving {
            ops::relocate::attention_outputs_to_move(&nodes)
        } else {
            (Vec::new(), 0)
        };
        let scratch = if moves.is_empty() {
            None
        } else {
            match self.device.alloc_buffer(bytes as usize) {
                Ok(scratch) => Some(scratch),
                Err(e) => {
                    crate::log::debug(&format!(
                        "{}: no scratch memory for attention outputs ({e}); the layers they \
                         end stay unfused",
                        self.device.name
                    ));
                    None
                }
            }
        };
        let moved = scratch.as_ref().map(|s| {
            let memory = Memory::Device(self.device.index);
            ops::relocate::relocate(&nodes, &moves, s.device_addr(), memory)
        });
        let nodes: &[Node] = moved.as_deref().unwrap_or(&nodes);
        let node_error = |index: usize, node: &Node, reason: String| ComputeError::Node {
            index,
            op: node.op.name(),
            reason,
        };
        let fallback = self.device.cpu_fallback;
        let mut steps = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match self.device.plan(n) {
                Ok(plan) => Ok(Step::Plan(plan)),
                Err(reason) if fallback => Ok(Step::Cpu(reason)),
                Err(reason) => Err(node_error(i, n, reason)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Fusion (architecture §7: fewer dispatches, `ops::fusion`): a run of nodes planned as
        // kernels becomes one fused kernel when the kernel store can provide it. The original
        // steps are kept: if the fused kernel is refused at compile time, the nodes run as
        // planned.
        let mut unfused: HashMap<usize, Vec<Step>> = HashMap::new();
        let options = self.device.plan_options;
        let mut i = 0;
        while i < nodes.len() {
            let fusion = ops::fuse_at(&nodes[i..], options).filter(|f| {
                // Views within the run (a forwarded gather) compute nothing.
                let all_kernels = steps[i..i + f.nodes]
                    .iter()
                    .all(|s| matches!(s, Step::Plan(Plan::Kernel { .. } | Plan::Skip)));
                let Plan::Kernel { desc, .. } = &f.plan else {
                    return false;
                };
                all_kernels && self.device.supports_kernel(desc)
            });
            let Some(fusion) = fusion else {
                i += 1;
                continue;
            };
            let first = std::mem::replace(&mut steps[i], Step::Plan(fusion.plan));
            let mut originals = vec![first];
            for step in &mut steps[i + 1..i + fusion.nodes] {
                originals.push(std::mem::replace(step, Step::Fused));
            }
            unfused.insert(i, originals);
            i += fusion.nodes;
        }
        // Every kernel is loaded before anything runs (the missing ones compiled in parallel), so
        // a missing kernel fails the graph without leaving it half computed. A kernel the
        // compiler refused (declared op, shape it cannot build: known only when it compiles) runs
        // on ggml's CPU backend instead, as every node does with the CPU fallback; `supports_op`
        // declines it from then on.
        //
        // Then the norms the projections after them can compute themselves
        // (`ops::fold_rms_norm`), then the folds built on their kernels (`ops::fold_glu`,
        // `fold_rope`, `fold_ffn`, `fold_attn_ffn`, `fold_flash_attn_ffn`): the originals of each fold are kept, and if one of its
        // kernels is refused, the whole fold is undone (the norm runs and the projections read
        // its output, say), the folds made on top of it first.
        let mut folds = Folds::default();
        for at in 0..nodes.len() {
            let Some(fold) = ops::fold_rms_norm(nodes, at, |k| planned(&steps, k)) else {
                continue;
            };
            let available = fold.readers.iter().all(|(_, plan)| match plan {
                Plan::Kernel { desc, .. } => self.device.supports_kernel(desc),
                _ => false,
            });
            if !available {
                continue;
            }
            let mut changes = vec![(at, Step::Fused)];
            changes.extend(fold.readers.into_iter().map(|(k, p)| (k, Step::Plan(p))));
            folds.apply(&mut steps, changes);
        }
        // The folds on top of them, each pattern over the whole graph in turn: the nodes whose
        // kernels a fold takes over, the node that runs its kernel, the kernel.
        let available = |plan: &Plan| match plan {
            Plan::Kernel { desc, .. } => self.device.supports_kernel(desc),
            _ => false,
        };
        for pattern in 0..5 {
            for at in 0..nodes.len() {
                let planned = |k| planned(&steps, k);
                let fold = match pattern {
                    0 => ops::fold_glu(nodes, at, planned)
                        .map(|f| (f.products.to_vec(), f.glu, f.plan)),
                    1 => ops::fold_rope(nodes, at, planned)
                        .map(|f| (vec![f.projection], f.rope, f.plan)),
                    2 => ops::fold_ffn(nodes, at, planned).map(|f| (vec![f.glu], f.down, f.plan)),
                    3 => ops::fold_attn_ffn(nodes, at, planned)
                        .map(|f| (vec![f.projection], f.ffn, f.plan)),
                    _ => ops::fold_flash_attn_ffn(nodes, at, planned)
                        .map(|f| (vec![f.attention], f.ffn, f.plan)),
                };
                if let Some((from, into, plan)) = fold.filter(|(_, _, plan)| available(plan)) {
                    folds.apply_on(&mut steps, &from, into, plan);
                }
            }
        }
        let mut kernels: Vec<Option<Arc<LoadedKernel>>> = vec![None; steps.len()];
        let mut todo: Vec<usize> = (0..steps.len()).collect();
        while !todo.is_empty() {
            let (at, descs): (Vec<usize>, Vec<KernelDesc>) = todo
                .iter()
                .filter_map(|&i| match &steps[i] {
                    Step::Plan(Plan::Kernel { desc, .. }) => Some((i, desc.clone())),
                    _ => None,
                })
                .unzip();
            todo.clear();
            let loaded = self.device.kernels(&descs);
            self.stats.load += loaded.loading;
            self.stats.evictions += loaded.evicted;
            let mut results: Vec<_> = at.into_iter().zip(loaded.kernels).collect();
            // A fold with a refused kernel is undone first, its other kernels dropped: the
            // restored steps are loaded in the next round.
            let refused_folds: Vec<usize> = results
                .iter()
                .filter(|(_, k)| k.is_err())
                .filter_map(|(i, _)| folds.of.get(i).copied())
                .collect();
            for id in refused_folds {
                for k in folds.undo(id, &mut steps) {
                    crate::log::debug(&format!(
                        "{}: node {k}: a folded kernel is not available; the fold is undone",
                        self.device.name
                    ));
                    kernels[k] = None;
                    results.retain(|(i, _)| *i != k);
                    if !todo.contains(&k) {
                        todo.push(k);
                    }
                }
            }
            for (i, kernel) in results {
                match kernel {
                    Ok(k) => kernels[i] = Some(k),
                    Err(e) if unfused.contains_key(&i) => {
                        let originals = unfused.remove(&i).expect("checked");
                        crate::log::debug(&format!(
                            "{}: node {i}: the fused kernel is not available ({e}); the {} \
                             nodes run unfused",
                            self.device.name,
                            originals.len()
                        ));
                        let run = i..i + originals.len();
                        todo.extend(run.clone());
                        for (step, original) in steps[run].iter_mut().zip(originals) {
                            *step = original;
                        }
                    }
                    Err(e) if fallback || e.is_refused() => {
                        // Once per kernel: supports_op declines the node from now on.
                        crate::log::warn(&format!(
                            "{}: node {i} ({}) runs on the CPU: {e}",
                            self.device.name,
                            nodes[i].op.name()
                        ));
                        steps[i] = Step::Cpu(e.to_string())
                    }
                    Err(source) => {
                        return Err(ComputeError::Device {
                            index: i,
                            op: nodes[i].op.name(),
                            source,
                        })
                    }
                }
            }
        }
        let on_cpu = |k: usize| matches!(steps[k], Step::Cpu(_));
        if scratch.is_some()
            && moves
                .iter()
                .any(|m| on_cpu(m.node) || m.readers.iter().any(|&r| on_cpu(r)))
        {
            return Ok(None);
        }
        // A forwarded gather one of whose readers runs on the CPU runs again: the CPU reads the
        // gather's own output.
        forwarded.retain(|f| {
            let on_cpu = f.readers.iter().any(|&r| matches!(steps[r], Step::Cpu(_)));
            if on_cpu && matches!(steps[f.node], Step::Plan(Plan::Skip)) {
                steps[f.node] = match self.device.plan(&graph[f.node]) {
                    Ok(plan) => Step::Plan(plan),
                    Err(reason) => Step::Cpu(reason),
                };
            }
            !on_cpu
        });
        // SET_ROWS kernels whose indices no node of this graph writes (an input the application
        // set, as llama.cpp's KV-cache slots are) may run as a copy into the rows they name.
        let scatters: Vec<Option<(RowScatter, Arc<LoadedKernel>)>> = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                kernels[i].as_ref()?;
                let scatter = RowScatter::of(node, |d| self.device.supports_kernel(d))?;
                let idx = &scatter.idx;
                let computed = nodes[..i].iter().any(|n| {
                    n.dst.addr < idx.addr + idx.bytes && idx.addr < n.dst.addr + n.dst.bytes
                });
                if computed || idx.addr == 0 {
                    return None;
                }
                let loaded = self.device.kernels(std::slice::from_ref(&scatter.copy));
                self.stats.load += loaded.loading;
                self.stats.evictions += loaded.evicted;
                let copy = loaded.kernels.into_iter().next()?.ok()?;
                Some((scatter, copy))
            })
            .collect();
        // The kernels that compute those SET_ROWS's sources may write the rows themselves.
        let mut producers: Vec<Option<(RowsProducer, Arc<LoadedKernel>)>> = vec![None; nodes.len()];
        for (at, scatter) in scatters.iter().enumerate() {
            let Some((scatter, _)) = scatter else {
                continue;
            };
            // A fused run's kernel computes more than its node: it is not retargeted.
            let kernel_of = |k: usize| match (&steps[k], &kernels[k]) {
                (Step::Plan(Plan::Kernel { desc, operands }), Some(_))
                    if !unfused.contains_key(&k) =>
                {
                    Some((desc, operands.as_slice()))
                }
                _ => None,
            };
            let skipped = |k: usize| matches!(steps[k], Step::Plan(Plan::Skip));
            let Some((j, producer)) = scatter.producer(nodes, at, kernel_of, skipped) else {
                continue;
            };
            if producers[j].is_some() || !self.device.supports_kernel(&producer.kernel) {
                continue;
            }
            let loaded = self.device.kernels(std::slice::from_ref(&producer.kernel));
            self.stats.load += loaded.loading;
            self.stats.evictions += loaded.evicted;
            match loaded.kernels.into_iter().next() {
                Some(Ok(kernel)) => producers[j] = Some((producer, kernel)),
                Some(Err(e)) => crate::log::debug(&format!(
                    "{}: node {j} cannot write node {at}'s rows itself ({e}); they are copied",
                    self.device.name
                )),
                None => {}
            }
        }
        // Then Q's, K's and V's kernels into one, when K and V write their cache rows.
        let mut merged: Vec<Option<MergedKernel>> = (0..nodes.len()).map(|_| None).collect();
        let mut deferred = vec![false; nodes.len()];
        let mut layers: Vec<Option<LayerKernel>> = (0..nodes.len()).map(|_| None).collect();
        let rows_kernel = |k: usize| producers[k].as_ref().map(|(p, _)| (&p.kernel, p.set_rows));
        for merge in ops::merge_qkv(nodes, |k| planned(&steps, k), rows_kernel) {
            let taken = merge
                .members
                .iter()
                .any(|&m| deferred[m] || merged[m].is_some());
            if taken || !self.device.supports_kernel(&merge.desc) {
                continue;
            }
            let loaded = self.device.kernels(std::slice::from_ref(&merge.desc));
            self.stats.load += loaded.loading;
            self.stats.evictions += loaded.evicted;
            match loaded.kernels.into_iter().next() {
                Some(Ok(kernel)) => {
                    for &m in &merge.members {
                        deferred[m] = m != merge.at;
                    }
                    // And the merged kernel into the attention's after it, when it is the same
                    // layer's (one dispatch per decode layer).
                    let set_rows = [1, 2].map(|i| {
                        producers[merge.members[i]]
                            .as_ref()
                            .map(|(p, _)| p.set_rows)
                    });
                    if let [Some(k_set), Some(v_set)] = set_rows {
                        let layer =
                            ops::merge_layer(nodes, |k| planned(&steps, k), &merge, [k_set, v_set]);
                        if let Some(layer) = layer.filter(|l| self.device.supports_kernel(&l.desc))
                        {
                            let loaded = self.device.kernels(std::slice::from_ref(&layer.desc));
                            self.stats.load += loaded.loading;
                            self.stats.evictions += loaded.evicted;
                            match loaded.kernels.into_iter().next() {
                                Some(Ok(kernel)) => {
                                    for d in [merge.at, k_set, v_set] {
                                        deferred[d] = true;
                                    }
                                    layers[layer.at] = Some(LayerKernel {
                                        merge_at: merge.at,
                                        set_rows: [k_set, v_set],
                                        kernel,
                                        before_rows: layer.before_rows,
                                        after_rows: layer.after_rows,
                                    });
                                }
                                Some(Err(e)) => crate::log::debug(&format!(
                                    "{}: nodes {} and {} run their own kernels ({e})",
                                    self.device.name, merge.at, layer.at
                                )),
                                None => {}
                            }
                        }
                    }
                    merged[merge.at] = Some(MergedKernel {
                        members: merge.members,
                        kernel,
                        operands: merge.operands,
                    });
                }
                Some(Err(e)) => crate::log::debug(&format!(
                    "{}: nodes {:?} run their own kernels ({e})",
                    self.device.name, merge.members
                )),
                None => {}
            }
        }
        Ok(Some(GraphPlan {
            steps,
            _scratch: scratch,
            forwarded,
            kernels,
            ops: graph.iter().map(|n| n.op.name()).collect(),
            scatters,
            producers,
            merged,
            deferred,
            layers,
        }))
    }

    /// Runs node `i` of `plan` (a member of a merge runs here only when the merged kernel
    /// cannot be dispatched).
    fn run_step(
        &mut self,
        plan: &GraphPlan,
        i: usize,
        host: &mut dyn HostMemory,
        rows_written: &mut [bool],
    ) -> Result<(), ComputeError> {
        let node = (i, plan.ops[i]);
        let failed = |e: Enqueue| enqueue_error(node, e);
        match (&plan.steps[i], &plan.kernels[i]) {
            (Step::Plan(Plan::Kernel { .. }), Some(_)) if rows_written[i] => Ok(()),
            (Step::Plan(Plan::Kernel { operands, desc }), Some(kernel)) => {
                if let Some((producer, retargeted)) = &plan.producers[i] {
                    if let Some(rows) = self.rows_of(plan, producer, host).map_err(failed)? {
                        let mut into_rows = producer.inputs.clone();
                        into_rows.push(rows);
                        rows_written[producer.set_rows] = true;
                        return self
                            .enqueue(retargeted.clone(), &into_rows, 1, node)
                            .map_err(failed);
                    }
                }
                let rows = match &plan.scatters[i] {
                    Some((scatter, copy)) => self
                        .scatter_operands(scatter, host)
                        .map_err(failed)?
                        .map(|operands| (copy, operands)),
                    None => None,
                };
                match rows {
                    Some((copy, rows)) => self.enqueue(copy.clone(), &rows, 1, node),
                    // Every output counts as written (RMS_NORM_FFN_<GLU>'s output before h):
                    // a host node reading one waits for the kernel.
                    None => {
                        let outputs = 1 + desc.extra_outputs.len();
                        self.enqueue(kernel.clone(), operands, outputs, node)
                    }
                }
                .map_err(failed)
            }
            (Step::Plan(Plan::Host(op)), _) => self.host(op, host).map_err(failed),
            (Step::Cpu(why), _) => {
                crate::log::debug(&format!(
                    "{}: node {i} ({}) on the CPU: {why}",
                    self.device.name, plan.ops[i]
                ));
                // The CPU may read anything a pending kernel writes.
                self.flush()?;
                host.run_on_cpu(i).map_err(|reason| ComputeError::Node {
                    index: i,
                    op: plan.ops[i],
                    reason,
                })
            }
            _ => Ok(()),
        }
    }

    /// Runs the merged kernel at node `i`: one dispatch when every member that writes cache
    /// rows can write them now (consecutive indices), otherwise each member in turn.
    fn run_merged(
        &mut self,
        plan: &GraphPlan,
        merged: &MergedKernel,
        i: usize,
        host: &mut dyn HostMemory,
        rows_written: &mut [bool],
    ) -> Result<(), ComputeError> {
        let node = (i, plan.ops[i]);
        let Some(rows) = self.member_rows(plan, merged, node, host)? else {
            for &m in &merged.members {
                self.run_step(plan, m, host, rows_written)?;
            }
            return Ok(());
        };
        let mut operands = merged.operands.clone();
        for (set_rows, tensor) in rows {
            rows_written[set_rows] = true;
            operands.push(tensor);
        }
        let outputs = operands.len() + 1 - merged.operands.len();
        self.enqueue(merged.kernel.clone(), &operands, outputs, node)
            .map_err(|e| enqueue_error(node, e))
    }

    /// The cache rows each member of `merged` that writes them can write now (its SET_ROWS's
    /// node and the rows, in member order), or `None` when some member's are not consecutive.
    fn member_rows(
        &mut self,
        plan: &GraphPlan,
        merged: &MergedKernel,
        node: (usize, &'static str),
        host: &mut dyn HostMemory,
    ) -> Result<Option<Vec<(usize, Tensor)>>, ComputeError> {
        let mut rows = Vec::new();
        for &m in &merged.members {
            let Some((producer, _)) = &plan.producers[m] else {
                continue;
            };
            match self
                .rows_of(plan, producer, host)
                .map_err(|e| enqueue_error(node, e))?
            {
                Some(tensor) => rows.push((producer.set_rows, tensor)),
                None => return Ok(None),
            }
        }
        Ok(Some(rows))
    }

    /// Runs the decode layer's kernel at node `i`: one dispatch when K's and V's rows can be
    /// written directly (consecutive indices), otherwise the Q/K/V merge, the two SET_ROWS and
    /// the attention's kernel in turn.
    fn run_layer(
        &mut self,
        plan: &GraphPlan,
        layer: &LayerKernel,
        i: usize,
        host: &mut dyn HostMemory,
        rows_written: &mut [bool],
    ) -> Result<(), ComputeError> {
        let node = (i, plan.ops[i]);
        let merged = plan.merged[layer.merge_at]
            .as_ref()
            .expect("a layer kernel contains a Q/K/V merge");
        let Some(rows) = self.member_rows(plan, merged, node, host)? else {
            self.run_merged(plan, merged, layer.merge_at, host, rows_written)?;
            for s in layer.set_rows {
                self.run_step(plan, s, host, rows_written)?;
            }
            return self.run_step(plan, i, host, rows_written);
        };
        let mut operands = layer.before_rows.clone();
        for (set_rows, tensor) in rows {
            rows_written[set_rows] = true;
            operands.push(tensor);
        }
        operands.extend(layer.after_rows.iter().cloned());
        // The layer's output, Q, K's and V's rows, a, r1 and h.
        self.enqueue(layer.kernel.clone(), &operands, 7, node)
            .map_err(|e| enqueue_error(node, e))
    }

    /// The destination rows `producer`'s SET_ROWS names when they are consecutive.
    fn rows_of(
        &mut self,
        plan: &GraphPlan,
        producer: &RowsProducer,
        host: &mut dyn HostMemory,
    ) -> Result<Option<Tensor>, Enqueue> {
        let Some((scatter, _)) = &plan.scatters[producer.set_rows] else {
            return Ok(None);
        };
        Ok(self.scatter_operands(scatter, host)?.map(|[_, rows]| rows))
    }

    /// The operands of `scatter`'s copy when the indices, read now, name consecutive rows;
    /// `None` when the SET_ROWS kernel must run. A pending kernel that writes the indices runs
    /// first.
    fn scatter_operands(
        &mut self,
        scatter: &RowScatter,
        host: &mut dyn HostMemory,
    ) -> Result<Option<[Tensor; 2]>, Enqueue> {
        let idx = &scatter.idx;
        let hazard = self
            .pending
            .iter()
            .any(|p| p.written && idx.addr < p.end && p.start < idx.addr + idx.bytes);
        if hazard {
            self.flush().map_err(Enqueue::Submit)?;
        }
        let indices = host.read(idx).map_err(Enqueue::Operand)?;
        Ok(scatter.operands(&indices))
    }

    /// Waits for everything submitted. Submissions are synchronous, so only a pending batch can
    /// be outstanding (and only between nodes of one graph).
    pub fn synchronize(&mut self) -> Result<(), ComputeError> {
        UnwindGuard(self).flush()
    }

    /// Forgets the unsubmitted batch and the queue after a panic: packets encoded for a graph
    /// that stopped midway must never be submitted by the next one, and a panic inside a
    /// submission may leave ring slots written without a doorbell, so the next submission
    /// starts on a fresh queue.
    fn abandon(&mut self) {
        self.batch.clear();
        self.batch_kernels.clear();
        self.batch_nodes.clear();
        self.pending.clear();
        self.queue = None;
        self.resident_pdis.clear();
        self.stats = GraphStats::default();
        self.plans.entries.clear();
    }

    /// Packets encoded but not yet submitted (for tests).
    pub fn unsubmitted(&self) -> usize {
        self.batch.len()
    }

    fn host(&mut self, op: &HostOp, host: &mut dyn HostMemory) -> Result<(), Enqueue> {
        let (inputs, dst) = op.tensors();
        if inputs
            .iter()
            .chain([&dst])
            .any(|t| matches!(t.memory, Memory::Unallocated))
        {
            return Err(Enqueue::Operand(
                "a tensor of a host op has no memory".into(),
            ));
        }
        let hazard = self.pending.iter().any(|p| {
            let overlaps = |t: &Tensor| t.addr < p.end && p.start < t.addr + t.bytes;
            (p.written && inputs.iter().any(|t| overlaps(t))) || overlaps(dst)
        });
        if hazard {
            self.flush().map_err(Enqueue::Submit)?;
        }
        host.run(op).map_err(Enqueue::Operand)
    }

    /// Adds a dispatch of `kernel` on `tensors` (its inputs, then its `outputs` outputs) to the
    /// pending batch.
    fn enqueue(
        &mut self,
        kernel: Arc<LoadedKernel>,
        tensors: &[Tensor],
        outputs: usize,
        node: (usize, &'static str),
    ) -> Result<(), Enqueue> {
        if tensors.len() > MAX_OPERANDS {
            return Err(Enqueue::Operand(format!(
                "{} operands, at most {MAX_OPERANDS}",
                tensors.len()
            )));
        }
        if let Some(t) = tensors
            .iter()
            .find(|t| !matches!(t.memory, Memory::Device(_)))
        {
            return Err(Enqueue::Operand(format!(
                "an operand is not in NPU memory ({:?}); kernels only reach buffers of this \
                 backend",
                t.memory
            )));
        }
        // The NPU's DMA engines address 32-bit words: a view starting mid-word would make the
        // kernel read from the word's start. supports_op declines such nodes; this is the
        // guard for a graph whose tensors moved since.
        if let Some(t) = tensors.iter().find(|t| t.addr % OPERAND_ALIGNMENT != 0) {
            return Err(Enqueue::Operand(format!(
                "an operand starts at {:#x}, not a multiple of {OPERAND_ALIGNMENT} bytes: the \
                 NPU's DMA reads whole 32-bit words",
                t.addr
            )));
        }
        let evictions = self.device.evictions();
        if evictions != self.evictions_seen {
            // Kernels were unloaded since: their PDI buffers may now hold other kernels, which
            // ROCR would take for the PDIs this queue cached. A queue that ran nothing yet has
            // none cached.
            if !self.resident_pdis.is_empty() {
                self.flush().map_err(Enqueue::Submit)?;
                self.queue = None;
                self.resident_pdis.clear();
            }
            self.evictions_seen = evictions;
        }
        let pdi = kernel.pdi_slot();
        if !self.resident_pdis.contains(&pdi) && self.resident_pdis.len() == MAX_PDIS_PER_QUEUE {
            // The queue's PDI cache is full: submit what refers to it and start a fresh queue.
            self.flush().map_err(Enqueue::Submit)?;
            self.queue = None;
            self.resident_pdis.clear();
        }
        let mut operands = [Operand { addr: 0, size: 0 }; MAX_OPERANDS];
        for (o, t) in operands.iter_mut().zip(tensors) {
            *o = Operand {
                addr: t.addr,
                size: t.bytes,
            };
        }
        let operands = &operands[..tensors.len()];
        let slot = self.batch.len();
        let stride = self.args_stride;
        let args_addr = self.args.device_addr() + (slot * stride) as u64;
        let args = &mut self.args.as_mut_slice()[slot * stride..(slot + 1) * stride];
        let packet = self
            .device
            .packet_abi
            .format()
            .encode(
                &kernel.dispatch(operands),
                args,
                args_addr,
                self.completion.handle(),
            )
            .map_err(|e| Enqueue::Operand(format!("kernel {}: {e}", kernel.name)))?;
        if self.resident_pdis.insert(pdi) {
            self.stats.pdi_loads += 1;
        }
        self.batch.push(packet);
        self.batch_kernels.push(kernel);
        self.batch_nodes.push(node);
        let first_output = tensors.len().saturating_sub(outputs);
        self.pending
            .extend(tensors.iter().enumerate().map(|(i, t)| Pending {
                start: t.addr,
                end: t.addr + t.bytes,
                written: i >= first_output,
            }));
        if self.batch.len() == MAX_PACKETS_PER_DOORBELL {
            self.flush().map_err(Enqueue::Submit)?;
        }
        Ok(())
    }

    /// Submits the pending batch behind one doorbell and waits for it.
    fn flush(&mut self) -> Result<(), ComputeError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let waiting = std::time::Instant::now();
        let result = self.submit().map_err(|e| self.name_failing_node(e));
        self.stats.doorbells += 1;
        self.stats.packets += self.batch.len() as u64;
        self.stats.wait += waiting.elapsed();
        // Only now may the batch's kernels (and, for ABI c, their executables) go.
        self.batch.clear();
        self.batch_kernels.clear();
        self.batch_nodes.clear();
        self.pending.clear();
        if result.is_err() {
            // The queue may be suspended or in an error state: the next submission gets a fresh
            // one (the error, logged by the caller, names the failing node where it is known).
            self.queue = None;
            self.resident_pdis.clear();
        }
        result
    }

    fn submit(&mut self) -> Result<(), ComputeError> {
        let packets = self.batch.len();
        if self.queue.is_none() {
            let queue = self
                .device
                .runtime
                .queue(self.device.npu.agent.agent)
                .map_err(|e| ComputeError::Queue(e.into()))?;
            self.queue = Some(queue);
        }
        let queue = self.queue.as_mut().expect("created above");
        let signals = self.device.packet_abi.format().signals_completion();
        if signals {
            self.completion.store(packets as i64);
        }
        queue
            .submit(&self.batch)
            .map_err(|source| ComputeError::Submit { packets, source })?;
        if signals {
            wait_completion(&self.completion, packets)?;
        }
        Ok(())
    }
}

impl Stream {
    /// A runtime error reported after `ran` packets of the batch ran names the node of the
    /// packet that failed.
    fn name_failing_node(&self, e: ComputeError) -> ComputeError {
        match e {
            ComputeError::Submit {
                packets,
                source: source @ SubmitError::Runtime { ran, .. },
            } if (ran as usize) < self.batch_nodes.len() => {
                let at = ran as usize;
                let (index, op) = self.batch_nodes[at];
                ComputeError::NodeFailed {
                    index,
                    op,
                    kernel: self.batch_kernels[at].name.clone(),
                    at,
                    packets,
                    source,
                }
            }
            other => other,
        }
    }
}

/// A dispatch that could not be enqueued, as the error of node `node` (index, op).
fn enqueue_error(node: (usize, &'static str), e: Enqueue) -> ComputeError {
    match e {
        Enqueue::Submit(e) => e,
        Enqueue::Operand(reason) => ComputeError::Node {
            index: node.0,
            op: node.1,
            reason,
        },
    }
}

fn wait_completion(signal: &Signal, packets: usize) -> Result<(), ComputeError> {
    match signal.wait_below(1, DEVICE_TIMEOUT) {
        Ok(0) => Ok(()),
        Ok(value) => Err(ComputeError::Completion {
            packets,
            reason: format!("the runtime set the completion signal to {value} (a failed kernel)"),
        }),
        Err(value) => Err(ComputeError::Completion {
            packets,
            reason: format!(
                "no completion after {DEVICE_TIMEOUT:?} ({value} kernel(s) still pending)"
            ),
        }),
    }
}

/// The stream for the length of one entry; a panic unwinding through it abandons the stream's
/// unsubmitted work ([`Stream::abandon`]).
struct UnwindGuard<'a>(&'a mut Stream);

impl Drop for UnwindGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let dropped = self.0.batch.len();
            self.0.abandon();
            crate::log::error(&format!(
                "{}: a graph stopped midway; {dropped} unsubmitted kernel(s) discarded and the \
                 queue replaced",
                self.0.device.name
            ));
        }
    }
}

impl std::ops::Deref for UnwindGuard<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        self.0
    }
}

impl std::ops::DerefMut for UnwindGuard<'_> {
    fn deref_mut(&mut self) -> &mut Stream {
        self.0
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // The queue goes before the kernels it may have cached are released.
        self.queue = None;
        self.batch_kernels.clear();
        // Cached plans hold their kernels: released first, so the device can unload them.
        self.plans.entries.clear();
        self.device.stream_closed();
        super::stats::recorder().flush();
    }
}

/// Failure while adding one node to the batch.
enum Enqueue {
    /// The node itself cannot run.
    Operand(String),
    /// Submitting the batch before it failed.
    Submit(ComputeError),
}
