//! The reference-counted runtime instance. `hsa_init` from count 0 builds it from the
//! configuration; the matching last `hsa_shut_down` writes the final counters and drops it
//! (which frees every allocation, queue and signal, as ROCR does).

use crate::agents::{host_ram_bytes, PoolKind, Topology};
use crate::config::{self, Config};
use crate::consts::*;
use crate::counters::Counters;
use crate::faults::Faults;
use crate::memory::{AllocError, MemoryTable};
use crate::queue::Queue;
use crate::signal::{Signal, SignalKind};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const SIGNAL_HANDLE_BASE: u64 = 0x5a6e_0001_0000_0000;

#[derive(Debug)]
pub struct Runtime {
    pub config: Config,
    pub topo: Topology,
    pub memory: Mutex<MemoryTable>,
    pub signals: RwLock<HashMap<u64, Arc<Signal>>>,
    /// Queues by the address of their public `hsa_queue_t`.
    pub queues: Mutex<HashMap<usize, Arc<Queue>>>,
    pub counters: Mutex<Counters>,
    /// Code object readers, executables and kernel objects (packet ABI c).
    pub code: Mutex<crate::code_object::CodeObjects>,
    pub faults: Faults,
    next_signal: AtomicU64,
    next_queue_id: AtomicU64,
}

#[derive(Debug, Default)]
struct Global {
    refcount: u32,
    rt: Option<Arc<Runtime>>,
}

static GLOBAL: RwLock<Global> = RwLock::new(Global {
    refcount: 0,
    rt: None,
});

/// The live runtime, if `hsa_init` has been called more often than `hsa_shut_down`.
pub fn get() -> Option<Arc<Runtime>> {
    GLOBAL.read().rt.clone()
}

/// `hsa_init`.
pub fn init() -> Status {
    let mut g = GLOBAL.write();
    if g.refcount > 0 {
        g.refcount = match g.refcount.checked_add(1) {
            Some(c) => c,
            None => return HSA_STATUS_ERROR, // reference count overflow
        };
        return HSA_STATUS_SUCCESS;
    }
    let cfg = match config::current() {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("hsa-sim: hsa_init failed: {msg}");
            return HSA_STATUS_ERROR;
        }
    };
    if cfg.fail_init {
        if !cfg.quiet {
            eprintln!("hsa-sim: hsa_init failed: injected by HSA_SIM_FAIL_INIT");
        }
        return HSA_STATUS_ERROR;
    }
    let rt = Runtime::new(cfg);
    g.rt = Some(Arc::new(rt));
    g.refcount = 1;
    HSA_STATUS_SUCCESS
}

/// `hsa_shut_down`.
pub fn shut_down() -> Status {
    let rt = {
        let mut g = GLOBAL.write();
        if g.refcount == 0 {
            return HSA_STATUS_ERROR_NOT_INITIALIZED;
        }
        g.refcount -= 1;
        if g.refcount > 0 {
            return HSA_STATUS_SUCCESS;
        }
        g.rt.take()
    };
    if let Some(rt) = rt {
        rt.write_counters();
        rt.queues.lock().clear();
        rt.signals.write().clear();
    }
    HSA_STATUS_SUCCESS
}

impl Runtime {
    pub fn new(config: Config) -> Runtime {
        let topo = Topology::build(&config.agents, host_ram_bytes(), config.dev_heap_size);
        let counters = Counters::new(config.packet_abi);
        Runtime {
            config,
            topo,
            memory: Mutex::new(MemoryTable::default()),
            signals: RwLock::new(HashMap::new()),
            queues: Mutex::new(HashMap::new()),
            counters: Mutex::new(counters),
            code: Mutex::new(Default::default()),
            faults: Faults::default(),
            next_signal: AtomicU64::new(SIGNAL_HANDLE_BASE),
            next_queue_id: AtomicU64::new(0),
        }
    }

    /// Prints a diagnostic unless `HSA_SIM_QUIET=1`.
    pub fn log(&self, msg: &str) {
        if !self.config.quiet {
            eprintln!("hsa-sim: {msg}");
        }
    }

    /// Allocates from a pool. Client allocations count for `HSA_SIM_FAIL_ALLOC`.
    pub fn allocate(&self, pool: usize, size: usize, internal: bool) -> Result<usize, Status> {
        let p = &self.topo.pools[pool];
        if !internal && self.faults.alloc_fails(&self.config) {
            self.log(&format!(
                "allocation of {size} bytes failed: injected by HSA_SIM_FAIL_ALLOC"
            ));
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        let limit = p.size;
        let dev = p.kind == PoolKind::AieDevHeap;
        let res = self
            .memory
            .lock()
            .allocate(pool, size, limit, internal, dev);
        res.map_err(|AllocError::OutOfResources| {
            if p.kind == PoolKind::AieDevHeap {
                let used = self.memory.lock().used(pool);
                self.log(&format!(
                    "dev heap exhausted: {size} bytes requested, {} KiB of {} KiB in use",
                    used >> 10,
                    p.size >> 10
                ));
            }
            HSA_STATUS_ERROR_OUT_OF_RESOURCES
        })
    }

    pub fn new_signal(&self, kind: SignalKind, value: i64) -> u64 {
        let h = self.next_signal.fetch_add(1, Ordering::Relaxed);
        self.signals
            .write()
            .insert(h, Arc::new(Signal::new(kind, value)));
        h
    }

    pub fn signal(&self, handle: u64) -> Option<Arc<Signal>> {
        self.signals.read().get(&handle).cloned()
    }

    pub fn next_queue_id(&self) -> u64 {
        self.next_queue_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn queue(&self, public: usize) -> Option<Arc<Queue>> {
        self.queues.lock().get(&public).cloned()
    }

    /// Writes the counters file (if configured).
    pub fn write_counters(&self) {
        if let Some(path) = &self.config.counters_path {
            let json = self.counters.lock().to_json();
            if let Err(e) = crate::counters::write_atomic(path, &json) {
                self.log(&format!("cannot write counters to {}: {e}", path.display()));
            }
        }
    }
}
