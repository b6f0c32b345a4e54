//! Run statistics: what the backend did with the graphs it was given (`GGML_HSA_STATS=1` logs
//! them, `GGML_HSA_STATS=<file>` writes them).
//!
//! Per op: nodes that became NPU kernels, nodes run by the host in place (`HostOp`), nodes run on
//! ggml's CPU backend (a kernel the compiler refused, or `GGML_HSA_CPU_FALLBACK`); per process:
//! graphs (and those whose plan was cached), doorbells (batches submitted) and packets, PDI loads
//! (all, and those after the first graph), and the wall time of `graph_compute` with the parts
//! spent waiting for the device and loading (or JIT-compiling) kernels. Host overhead
//! per node is `(wall - wait - load) / nodes`: planning, kernel lookup, packet encoding and host
//! ops, which on a real NPU add to every token (benchmarks print it; `scripts/bench.sh`). On
//! hsa-sim the device's work is part of the wait.
//!
//! The totals are rewritten to the file (atomically, through a rename) after every graph, so a
//! process that ends without freeing its backends still leaves them behind. To the log they go
//! after graphs 1, 2, 4, 8, ... (a handful of lines for a long run) and when a backend is freed.
//! Nothing is counted or written unless the variable is set.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

use crate::config::StatsSink;

/// How one node of a graph ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRun {
    /// Nothing to compute (views, empty tensors).
    Skipped,
    /// An NPU kernel.
    Kernel,
    /// The host, in place on NPU-visible memory.
    Host,
    /// ggml's CPU backend.
    Cpu,
}

/// The counts of one graph, collected by the stream while it runs.
#[derive(Debug, Default)]
pub struct GraphStats {
    nodes: Vec<(&'static str, NodeRun)>,
    pub doorbells: u64,
    pub packets: u64,
    pub wait: Duration,
    /// Time spent finding, compiling and loading the graph's kernels.
    pub load: Duration,
    /// Whether the graph's plan came from the stream's plan cache (0 or 1).
    pub plan_hits: u64,
    /// PDIs used for the first time on their queue (a PDI load on the NPU).
    pub pdi_loads: u64,
    /// Loaded kernels evicted from the full dev heap to load this graph's.
    pub evictions: u64,
}

impl GraphStats {
    pub fn node(&mut self, op: &'static str, run: NodeRun) {
        self.nodes.push((op, run));
    }
}

/// Totals over the process, as written to the file.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Totals {
    pub graphs: u64,
    /// Every node of every graph, skipped ones included.
    pub nodes: u64,
    pub skipped_nodes: u64,
    /// Nodes per op that ran as NPU kernels.
    pub kernel_nodes: BTreeMap<String, u64>,
    /// Nodes per op that the host ran in place.
    pub host_nodes: BTreeMap<String, u64>,
    /// Nodes per op that ran on ggml's CPU backend.
    pub cpu_nodes: BTreeMap<String, u64>,
    pub doorbells: u64,
    pub packets: u64,
    /// Wall time inside `graph_compute`, in microseconds.
    pub compute_wall_us: u64,
    /// The part of it spent submitting batches and waiting for their completion.
    pub device_wait_us: u64,
    /// The part of it spent compiling (JIT), reading and uploading kernels (not looking up
    /// loaded ones).
    pub kernel_load_us: u64,
    /// Graphs whose plan came from the stream's plan cache (a repeated graph: the decode loop).
    pub plan_hits: u64,
    /// PDIs used for the first time on their queue, which the NPU loads.
    pub pdi_loads: u64,
    /// The part of them in graphs after the first: PDI loads in the steady state.
    pub steady_pdi_loads: u64,
    /// Loaded kernels evicted from a full dev heap to make room for others.
    pub kernel_evictions: u64,
}

impl Totals {
    fn add(&mut self, graph: &GraphStats, wall: Duration) {
        if self.graphs > 0 {
            self.steady_pdi_loads += graph.pdi_loads;
        }
        self.graphs += 1;
        self.plan_hits += graph.plan_hits;
        self.pdi_loads += graph.pdi_loads;
        for &(op, run) in &graph.nodes {
            self.nodes += 1;
            let per_op = match run {
                NodeRun::Skipped => {
                    self.skipped_nodes += 1;
                    continue;
                }
                NodeRun::Kernel => &mut self.kernel_nodes,
                NodeRun::Host => &mut self.host_nodes,
                NodeRun::Cpu => &mut self.cpu_nodes,
            };
            *per_op.entry(op.to_owned()).or_default() += 1;
        }
        self.doorbells += graph.doorbells;
        self.packets += graph.packets;
        self.compute_wall_us += wall.as_micros() as u64;
        self.device_wait_us += graph.wait.as_micros() as u64;
        self.kernel_load_us += graph.load.as_micros() as u64;
        self.kernel_evictions += graph.evictions;
    }
}

/// Where the totals go, if anywhere: set once from `GGML_HSA_STATS`.
#[derive(Debug)]
pub struct Recorder {
    sink: Option<StatsSink>,
    totals: Mutex<Totals>,
}

impl Recorder {
    pub const fn new(sink: Option<StatsSink>) -> Recorder {
        Recorder {
            sink,
            totals: Mutex::new(Totals {
                graphs: 0,
                nodes: 0,
                skipped_nodes: 0,
                kernel_nodes: BTreeMap::new(),
                host_nodes: BTreeMap::new(),
                cpu_nodes: BTreeMap::new(),
                doorbells: 0,
                packets: 0,
                compute_wall_us: 0,
                device_wait_us: 0,
                kernel_load_us: 0,
                plan_hits: 0,
                pdi_loads: 0,
                steady_pdi_loads: 0,
                kernel_evictions: 0,
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.sink.is_some()
    }

    /// Adds one graph and rewrites the file (or logs the totals after graphs 1, 2, 4, ...). A
    /// file that cannot be written is reported once.
    pub fn record(&self, graph: &GraphStats, wall: Duration) {
        let Some(sink) = &self.sink else { return };
        let mut totals = self.totals.lock();
        totals.add(graph, wall);
        let path = match sink {
            StatsSink::Log => {
                if totals.graphs.is_power_of_two() {
                    log_totals(&totals);
                }
                return;
            }
            StatsSink::File(path) => path,
        };
        let text = serde_json::to_string_pretty(&*totals).unwrap_or_default();
        if let Err(e) = write_atomic(path, &text) {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                crate::log::warn(&format!(
                    "GGML_HSA_STATS: cannot write {}: {e}; statistics are not saved",
                    path.display()
                ))
            });
        }
    }

    /// Logs the totals when they go to the log (a backend is being freed).
    pub fn flush(&self) {
        if self.sink == Some(StatsSink::Log) {
            let totals = self.totals.lock();
            if totals.graphs > 0 {
                log_totals(&totals);
            }
        }
    }
}

fn log_totals(totals: &Totals) {
    crate::log::notice(&format!(
        "GGML_HSA_STATS after {} graph(s): {}",
        totals.graphs,
        serde_json::to_string(totals).unwrap_or_default()
    ));
}

/// The process's recorder (`GGML_HSA_STATS`).
pub fn recorder() -> &'static Recorder {
    static RECORDER: std::sync::OnceLock<Recorder> = std::sync::OnceLock::new();
    RECORDER.get_or_init(|| Recorder::new(crate::config::get().stats.clone()))
}

fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "stats".into());
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    std::fs::write(&tmp, format!("{text}\n"))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_count_nodes_per_op_and_kind() {
        let mut g = GraphStats::default();
        g.node("MUL_MAT", NodeRun::Kernel);
        g.node("MUL_MAT", NodeRun::Kernel);
        g.node("SET_ROWS", NodeRun::Host);
        g.node("RESHAPE", NodeRun::Skipped);
        g.node("ROPE", NodeRun::Cpu);
        g.doorbells = 2;
        g.packets = 2;
        g.wait = Duration::from_micros(30);
        g.pdi_loads = 3;
        g.evictions = 3;
        let mut t = Totals::default();
        t.add(&g, Duration::from_micros(100));
        t.add(&g, Duration::from_micros(100));
        assert_eq!(t.graphs, 2);
        assert_eq!(t.nodes, 10);
        assert_eq!(t.skipped_nodes, 2);
        assert_eq!(t.kernel_nodes["MUL_MAT"], 4);
        assert_eq!(t.host_nodes["SET_ROWS"], 2);
        assert_eq!(t.cpu_nodes["ROPE"], 2);
        assert_eq!((t.doorbells, t.packets), (4, 4));
        assert_eq!((t.compute_wall_us, t.device_wait_us), (200, 60));
        assert_eq!(
            (t.pdi_loads, t.steady_pdi_loads),
            (6, 3),
            "the first graph's loads"
        );
        assert_eq!(t.kernel_evictions, 6);
    }

    #[test]
    fn the_file_holds_the_totals_after_each_graph() {
        let dir = std::env::temp_dir().join(format!("ggml-hsa-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        let r = Recorder::new(Some(StatsSink::File(path.clone())));
        let mut g = GraphStats::default();
        g.node("ADD", NodeRun::Kernel);
        r.record(&g, Duration::from_micros(5));
        r.record(&g, Duration::from_micros(5));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["graphs"], 2);
        assert_eq!(v["kernel_nodes"]["ADD"], 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_logs_the_totals_and_writes_no_file() {
        let r = Recorder::new(Some(StatsSink::Log));
        assert!(r.enabled());
        r.record(&GraphStats::default(), Duration::ZERO);
        r.flush();
        assert_eq!(r.totals.lock().graphs, 1);
        assert!(!Path::new("1").exists());
    }

    #[test]
    fn an_unwritable_file_loses_only_the_statistics() {
        let r = Recorder::new(Some(StatsSink::File("/nonexistent-dir/stats.json".into())));
        r.record(&GraphStats::default(), Duration::ZERO);
        assert_eq!(r.totals.lock().graphs, 1);
    }
}
