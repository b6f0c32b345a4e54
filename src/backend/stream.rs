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
use std::collections::HashSet;
use std::sync::Arc;

use super::device::{Device, DeviceError, LoadedKernel, OPERAND_ALIGNMENT};
use super::stats::{self, GraphStats, NodeRun};
use crate::hsa::memory::PoolAlloc;
use crate::hsa::packet::Operand;
use crate::hsa::queue::{Queue, SubmitError, QUEUE_SIZE};
use crate::hsa::signal::{Signal, DEVICE_TIMEOUT};
use crate::kernels::KernelDesc;
use crate::ops::host::HostOp;
use crate::ops::rewrite::{self, Stage};
use crate::ops::{self, Memory, Node, Plan, RowScatter, Tensor};

/// Packets behind one doorbell: half the ring, and below the ~40 commands ROCR fits into one
/// command chain.
pub const MAX_PACKETS_PER_DOORBELL: usize = 32;
/// Distinct PDIs ROCR caches per queue.
pub const MAX_PDIS_PER_QUEUE: usize = 32;
/// Operands one kernel may take (inputs plus outputs): DECODE_LAYER_HEAD_NORM_POST_NORM_<GLU>
/// takes 27.
pub const MAX_OPERANDS: usize = 27;

const _: () = assert!(MAX_PACKETS_PER_DOORBELL as u32 <= QUEUE_SIZE);

/// Runs host-side ops: implemented by `ffi`, which owns access to ggml's tensor memory.
pub trait HostMemory {
    fn run(&mut self, op: &HostOp) -> Result<(), String>;
    /// Computes node `index` of the graph on ggml's CPU backend (`GGML_HSA_CPU_FALLBACK`).
    fn run_on_cpu(&mut self, index: usize) -> Result<(), String>;
    /// The bytes of `t` (from its address, `t.bytes` of them), read on the host.
    fn read(&mut self, t: &Tensor) -> Result<Vec<u8>, String>;
}

/// What a node of a planned graph becomes, with its kernel loaded.
type Step = ops::Step<Arc<LoadedKernel>>;

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
    /// One step per node (`ops::rewrite`).
    steps: Vec<Step>,
    /// Memory of the attention outputs moved out of the way of the block after them
    /// (`ops::relocate`); the plan's operands point into it.
    _scratch: Option<crate::hsa::memory::PoolAlloc>,
    /// The one-row GET_ROWS whose readers read their source (`ops::forward_gathers`): their
    /// indices are checked before the graph runs.
    forwarded: Vec<ops::Forwarded>,
    /// Each node's op, to name it in errors and statistics.
    ops: Vec<&'static str>,
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

/// Which kernel of a step `Stream::load` loads: its own, a piece's, or its one-row copy.
enum Slot {
    Own,
    Piece(usize),
    RowCopy,
    RowsCopy,
}

/// The cache rows a SET_ROWS's indices name when the graph runs (`Stream::cache_rows`).
enum NamedRows {
    /// Consecutive rows: the operand in their place.
    Consecutive(Tensor),
    /// Rows apart, in range: a (source row, destination row) pair per index, for the one-row
    /// copy.
    Apart(Vec<[Tensor; 2]>),
    /// Neither (rows out of range, or a step without the one-row copy): its fallback runs.
    Elsewhere,
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
                    Step::Skip => NodeRun::Skipped,
                    // A covered node runs inside the kernel of another.
                    Step::Kernel(_) | Step::Covered => NodeRun::Kernel,
                    Step::Host(_) => NodeRun::Host,
                    Step::Cpu(_) => NodeRun::Cpu,
                };
                self.stats.node(op, run);
            }
        }
        // The SET_ROWS nodes whose rows a kernel wrote.
        let mut done = vec![false; plan.steps.len()];
        let mut result = plan.forwarded.iter().try_for_each(|f| {
            let failed = |reason| ComputeError::Node {
                index: f.node,
                op: plan.ops[f.node],
                reason,
            };
            f.check(&host.read(&f.idx).map_err(failed)?).map_err(failed)
        });
        for (i, step) in plan.steps.iter().enumerate() {
            if result.is_err() {
                break;
            }
            result = self.run_step(&plan, i, step, host, &mut done);
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
            // A node writing or reading a moved output runs on the CPU, which reads the
            // graph's own memory: planned again without the moves.
            None => Ok(self
                .plan_graph_moving(graph, false)?
                .expect("nothing moved")),
        }
    }

    /// Plans `graph`, with the attention outputs the block after them would clobber moved to
    /// scratch memory (`ops::relocate`) and a prompt's activations that only GEMMs read written
    /// there as bf16 (`ops::bf16_activations`) when `moving`; `None` when a node writing or
    /// reading a moved output ended up on the CPU.
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
        // A prompt's activations that only GEMMs read, written as bf16 behind them.
        let device = self.device;
        let runs = |n: &Node| match device.plan(n) {
            Ok(Plan::Kernel { desc, .. }) => device.supports_kernel(&desc),
            _ => false,
        };
        let (narrowed, narrowed_bytes) = if moving {
            ops::bf16_activations::to_move(&nodes, runs)
        } else {
            (Vec::new(), 0)
        };
        let scratch = if moves.is_empty() && narrowed.is_empty() {
            None
        } else {
            match self.device.alloc_buffer((bytes + narrowed_bytes) as usize) {
                Ok(scratch) => Some(scratch),
                Err(e) => {
                    crate::log::debug(&format!(
                        "{}: no scratch memory for attention outputs and bf16 activations \
                         ({e}); the layers they end stay unfused, the activations f32",
                        self.device.name
                    ));
                    None
                }
            }
        };
        let moved = scratch.as_ref().map(|s| {
            let memory = Memory::Device(self.device.index);
            let nodes = ops::relocate::relocate(&nodes, &moves, s.device_addr(), memory);
            let base = s.device_addr() + bytes;
            ops::bf16_activations::narrow(&nodes, &narrowed, base, memory)
        });
        let nodes: &[Node] = moved.as_deref().unwrap_or(&nodes);
        let fallback = self.device.cpu_fallback;
        let mut steps = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match self.device.plan(n) {
                Ok(plan) => Ok(Step::of(plan)),
                Err(reason) if fallback => Ok(Step::Cpu(reason)),
                Err(reason) => Err(ComputeError::Node {
                    index: i,
                    op: n.op.name(),
                    reason,
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The rewrites (architecture §7: fewer dispatches), a stage at a time, the kernels of
        // each stage loaded before the next looks at the plan: every kernel is loaded before
        // anything runs, so a missing kernel fails the graph without leaving it half computed.
        let device = self.device;
        let available = |desc: &KernelDesc| device.supports_kernel(desc);
        for stage in Stage::ALL {
            rewrite::apply(stage, nodes, &mut steps, device.plan_options, &available);
            self.load(nodes, &mut steps)?;
            if stage != Stage::Fusions {
                continue;
            }
            let on_cpu = |k: usize| matches!(steps[k], Step::Cpu(_));
            let moved_on_cpu = moves
                .iter()
                .map(|m| (m.node, &m.readers))
                .chain(narrowed.iter().map(|m| (m.node, &m.readers)))
                .any(|(node, readers)| on_cpu(node) || readers.iter().any(|&r| on_cpu(r)));
            if scratch.is_some() && moved_on_cpu {
                return Ok(None);
            }
            // A forwarded gather one of whose readers runs on the CPU runs again: the CPU reads
            // the gather's own output.
            forwarded.retain(|f| {
                let on_cpu = f.readers.iter().any(|&r| matches!(steps[r], Step::Cpu(_)));
                if on_cpu && matches!(steps[f.node], Step::Skip) {
                    steps[f.node] = match device.plan(&graph[f.node]) {
                        Ok(plan) => Step::of(plan),
                        Err(reason) => Step::Cpu(reason),
                    };
                }
                !on_cpu
            });
        }
        Ok(Some(GraphPlan {
            steps,
            _scratch: scratch,
            forwarded,
            ops: graph.iter().map(|n| n.op.name()).collect(),
        }))
    }

    /// Loads every kernel of `steps` not loaded yet (the missing ones compiled in parallel). A
    /// kernel the compiler refused (a declared op or a shape it cannot build: known only when
    /// it compiles) gives its nodes back the steps it replaced, loaded in turn; one that
    /// replaced nothing runs on ggml's CPU backend, as every node does with the CPU fallback,
    /// and `supports_op` declines it from then on.
    fn load(&mut self, nodes: &[Node], steps: &mut [Step]) -> Result<(), ComputeError> {
        loop {
            // Kernels over many rows run as kernels over power-of-two counts of them: every step
            // made since the last pass, and those a refused kernel put back.
            if self.device.plan_options.row_pieces {
                ops::pieces::split_steps(steps, OPERAND_ALIGNMENT);
            }
            // (node, slot) of every kernel to load: a step's own, its pieces', or a cache copy's
            // one-row copy.
            let mut at: Vec<(usize, Slot)> = Vec::new();
            let mut descs: Vec<KernelDesc> = Vec::new();
            for (i, s) in steps.iter().enumerate() {
                let Step::Kernel(k) = s else { continue };
                if let (Some(desc), None) = (k.row_copy_desc(), &k.row_copy) {
                    at.push((i, Slot::RowCopy));
                    descs.push(desc.clone());
                }
                if k.rows_copies.is_empty() {
                    for desc in k.rows_copy_descs() {
                        at.push((i, Slot::RowsCopy));
                        descs.push(desc.clone());
                    }
                }
                let pieces = k.pieces.as_deref().unwrap_or_default();
                if pieces.is_empty() {
                    if k.loaded.is_none() {
                        at.push((i, Slot::Own));
                        descs.push(k.desc.clone());
                    }
                    continue;
                }
                for (p, piece) in pieces.iter().enumerate() {
                    if piece.loaded.is_none() {
                        at.push((i, Slot::Piece(p)));
                        descs.push(piece.desc.clone());
                    }
                }
            }
            if at.is_empty() {
                return Ok(());
            }
            let loaded = self.device.kernels(&descs);
            self.stats.load += loaded.loading;
            self.stats.evictions += loaded.evicted;
            let mut refused = Vec::new();
            for ((i, slot), kernel) in at.into_iter().zip(loaded.kernels) {
                let Step::Kernel(step) = &mut steps[i] else {
                    continue;
                };
                match (kernel, slot) {
                    (Ok(kernel), Slot::Own) => step.loaded = Some(kernel),
                    (Ok(kernel), Slot::Piece(p)) => {
                        if let Some(piece) = step.pieces.as_mut().and_then(|v| v.get_mut(p)) {
                            piece.loaded = Some(kernel);
                        }
                    }
                    (Ok(kernel), Slot::RowCopy) => step.row_copy = Some(kernel),
                    // Loaded in `rows_copy_descs`' order; a step with any of them refused
                    // forgets them all.
                    (Ok(kernel), Slot::RowsCopy) => {
                        if step.rows_copy_descs().len() > step.rows_copies.len() {
                            step.rows_copies.push(kernel);
                        }
                    }
                    // A copy of cache rows apart in groups refused: one copy per row. Asked
                    // for once.
                    (Err(e), Slot::RowsCopy) => {
                        crate::log::debug(&format!(
                            "{}: node {i}: the copy of cache rows apart in groups is not \
                             available ({e}); they are copied one at a time",
                            self.device.name
                        ));
                        if let Some(r) = step.rows.first_mut() {
                            r.scatter.rows_copies.clear();
                        }
                        step.rows_copies.clear();
                    }
                    (Err(e), Slot::Own) => refused.push((i, e)),
                    // The one-row copy refused: indices that are not consecutive run the
                    // SET_ROWS as planned. Asked for once: the scatter forgets it.
                    (Err(e), Slot::RowCopy) => {
                        crate::log::debug(&format!(
                            "{}: node {i}: the copy of one cache row is not available ({e}); \
                             rows that are not consecutive run the SET_ROWS",
                            self.device.name
                        ));
                        if let Some(r) = step.rows.first_mut() {
                            r.scatter.row_copy = None;
                        }
                    }
                    // A piece refused (a design declining the smaller shape): the step runs
                    // whole, loaded on the next pass.
                    (Err(e), Slot::Piece(_))
                        if step.pieces.as_ref().is_some_and(|v| !v.is_empty()) =>
                    {
                        crate::log::debug(&format!(
                            "{}: node {i}: kernel {} over part of its rows is not available \
                             ({e}); it runs over all of them",
                            self.device.name, step.desc.op
                        ));
                        step.pieces = Some(Vec::new());
                    }
                    (Err(_), Slot::Piece(_)) => {}
                }
            }
            // Then the refused ones, whose fallbacks may put back steps loaded just now.
            for (i, e) in refused {
                let Step::Kernel(step) = &mut steps[i] else {
                    continue;
                };
                // A kernel for every KV length refused (a cache too long for the design): the
                // one named by this graph's length, loaded on the next pass.
                let named = step
                    .n_kv
                    .and_then(|n| rewrite::named_by_n_kv(&step.desc, n));
                if let Some(named) = named.filter(|d| self.device.supports_kernel(d)) {
                    crate::log::debug(&format!(
                        "{}: node {i}: kernel {} is not available for every KV length ({e}); \
                         this graph's length is asked for",
                        self.device.name, step.desc.op
                    ));
                    step.desc = named;
                    step.n_kv = None;
                    step.pieces = None;
                    continue;
                }
                if !step.fallback.is_empty() {
                    crate::log::debug(&format!(
                        "{}: node {i}: kernel {} is not available ({e}); the nodes it covers \
                         run as before",
                        self.device.name, step.desc.op
                    ));
                    for (j, before) in std::mem::take(&mut step.fallback) {
                        steps[j] = before;
                    }
                } else if self.device.cpu_fallback || e.is_refused() {
                    // Once per kernel: supports_op declines the node from now on.
                    crate::log::warn(&format!(
                        "{}: node {i} ({}) runs on the CPU: {e}",
                        self.device.name,
                        nodes[i].op.name()
                    ));
                    steps[i] = Step::Cpu(e.to_string());
                } else {
                    return Err(ComputeError::Device {
                        index: i,
                        op: nodes[i].op.name(),
                        source: e,
                    });
                }
            }
        }
    }

    /// Runs `step` of node `i` (inside a kernel's fallback, the step the node had before).
    /// `done`: the SET_ROWS nodes whose rows a kernel wrote.
    fn run_step(
        &mut self,
        plan: &GraphPlan,
        i: usize,
        step: &Step,
        host: &mut dyn HostMemory,
        done: &mut [bool],
    ) -> Result<(), ComputeError> {
        let node = (i, plan.ops[i]);
        let failed = |e: Enqueue| enqueue_error(node, e);
        match step {
            Step::Skip | Step::Covered => Ok(()),
            _ if done[i] => Ok(()),
            Step::Kernel(k) => {
                let not_loaded = || failed(Enqueue::Operand("its kernel is not loaded".into()));
                let mut operands = Cow::Borrowed(k.operands.as_slice());
                for r in &k.rows {
                    let row_copy = k.row_copy.as_ref();
                    match self
                        .cache_rows(&r.scatter, row_copy.is_some(), host)
                        .map_err(failed)?
                    {
                        NamedRows::Consecutive(rows) => operands.to_mut()[r.operand] = rows,
                        // A copy into rows apart (a step of several sequences, their prompts):
                        // in groups of rows, or a row each (in order where a row is named
                        // twice: the later one wins).
                        NamedRows::Apart(copies) => {
                            let mut at: Vec<u64> = copies.iter().map(|[_, d]| d.addr).collect();
                            at.sort_unstable();
                            at.dedup();
                            let grouped = at.len() == copies.len()
                                && !k.rows_copies.is_empty()
                                && k.rows_copies.len() == k.rows_copy_descs().len();
                            if grouped {
                                for (kernel, operands) in r.scatter.rows_copy_groups(&copies) {
                                    let kernel = match kernel {
                                        Some(g) => &k.rows_copies[g],
                                        None => row_copy.ok_or_else(not_loaded)?,
                                    };
                                    let outputs = operands.len() - 1;
                                    self.enqueue(kernel.clone(), &operands, outputs, None, node)
                                        .map_err(failed)?;
                                }
                            } else {
                                let kernel = row_copy.ok_or_else(not_loaded)?;
                                for pair in copies {
                                    self.enqueue(kernel.clone(), &pair, 1, None, node)
                                        .map_err(failed)?;
                                }
                            }
                            done[r.set_rows] = true;
                            return Ok(());
                        }
                        NamedRows::Elsewhere => {
                            for (j, before) in &k.fallback {
                                self.run_step(plan, *j, before, host, done)?;
                            }
                            return Ok(());
                        }
                    }
                }
                for r in &k.rows {
                    done[r.set_rows] = true;
                }
                // Every output counts as written (RMS_NORM_FFN_<GLU>'s output before h): a host
                // node reading one waits for the kernel.
                let pieces = k.pieces.as_deref().unwrap_or_default();
                for piece in pieces {
                    let kernel = piece.loaded.as_ref().ok_or_else(not_loaded)?;
                    let insts = self.n_kv_insts(kernel, k.n_kv).map_err(failed)?;
                    let slices = piece.operands(&operands);
                    self.enqueue(kernel.clone(), &slices, k.outputs(), insts, node)
                        .map_err(failed)?;
                }
                if !pieces.is_empty() {
                    return Ok(());
                }
                let kernel = k.loaded.as_ref().ok_or_else(not_loaded)?;
                let insts = self.n_kv_insts(kernel, k.n_kv).map_err(failed)?;
                self.enqueue(kernel.clone(), &operands, k.outputs(), insts, node)
                    .map_err(failed)
            }
            Step::Host(op) => self.host(op, host).map_err(failed),
            Step::Cpu(why) => {
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
        }
    }

    /// The instruction stream telling `kernel` the KV length `n_kv` (`Device::n_kv_insts`), or
    /// `None` (its own) without one.
    fn n_kv_insts(&self, kernel: &LoadedKernel, n_kv: Option<u32>) -> Result<Option<u64>, Enqueue> {
        n_kv.map(|n| self.device.n_kv_insts(kernel, n).map_err(Enqueue::Operand))
            .transpose()
    }

    /// The cache rows `scatter`'s indices, read now, name (rows apart only when the step can
    /// copy them one at a time: `apart`). A pending kernel that writes the indices runs first.
    fn cache_rows(
        &mut self,
        scatter: &RowScatter,
        apart: bool,
        host: &mut dyn HostMemory,
    ) -> Result<NamedRows, Enqueue> {
        let idx = &scatter.idx;
        let hazard = self
            .pending
            .iter()
            .any(|p| p.written && idx.addr < p.end && p.start < idx.addr + idx.bytes);
        if hazard {
            self.flush().map_err(Enqueue::Submit)?;
        }
        let indices = host.read(idx).map_err(Enqueue::Operand)?;
        if let Some([_, rows]) = scatter.operands(&indices) {
            return Ok(NamedRows::Consecutive(rows));
        }
        let copies = apart.then(|| scatter.row_operands(&indices)).flatten();
        Ok(copies.map_or(NamedRows::Elsewhere, NamedRows::Apart))
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
    /// `insts`: the instruction stream to run instead of the kernel's own (one telling it its
    /// KV length, `Device::n_kv_insts`).
    fn enqueue(
        &mut self,
        kernel: Arc<LoadedKernel>,
        tensors: &[Tensor],
        outputs: usize,
        insts: Option<u64>,
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
        let mut dispatch = kernel.dispatch(operands);
        if let Some(addr) = insts {
            dispatch.insts_addr = addr;
        }
        let packet = self
            .device
            .packet_abi
            .format()
            .encode(&dispatch, args, args_addr, self.completion.handle())
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
