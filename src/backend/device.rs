//! One NPU as a ggml device: its pools, packet ABI, kernel store and the kernels loaded into its
//! dev heap.
//!
//! Loaded kernels stay loaded (architecture §8) until the dev heap is full: a kernel that does
//! not fit evicts the least recently used kernels that nothing but the device's table holds (no
//! batch or graph in flight has them), freeing their PDI and instruction stream or destroying
//! their executable, and is loaded again. When the last stream of the device is freed, every
//! idle kernel is released the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::Npu;
use crate::config::Config;
use crate::hsa::executable::KernelObject;
use crate::hsa::memory::{select_pools, AgentPools, PoolAlloc};
use crate::hsa::packet::{Dispatch, Operand, PacketAbi};
use crate::hsa::{HsaError, Runtime};
use crate::kernels::{Compiler, KernelDesc, KernelError, KernelFiles, KernelStore};
use crate::ops::{self, Node, Plan, PlanOptions};

/// Tensor alignment inside a buffer. The NPU's DMA engines address 32-bit words; 64 bytes keeps
/// every tensor on its own cache line without wasting much on small tensors.
pub const TENSOR_ALIGNMENT: usize = 64;

/// Alignment every kernel operand must start at: the NPU's DMA engines address 32-bit words.
/// Buffers keep [`TENSOR_ALIGNMENT`]; a view can start anywhere inside one.
pub const OPERAND_ALIGNMENT: u64 = 4;

/// A kernel loaded on the device.
#[derive(Debug)]
pub struct LoadedKernel {
    pub name: String,
    /// This load's number on the device, never reused: what takes one of a queue's PDI slots.
    /// A kernel evicted and loaded again is a new PDI to the queue (a new buffer to ROCR), even
    /// when its memory lands at the address the old copy had.
    pub id: u64,
    /// The device's use clock when a graph last asked for this kernel (eviction order).
    last_used: AtomicU64,
    pub code: KernelCode,
}

/// Where a loaded kernel's code lives, by packet ABI.
#[derive(Debug)]
pub enum KernelCode {
    /// a1..b: the PDI and instruction stream, copied into the dev heap by the backend.
    Blobs {
        pdi: PoolAlloc,
        insts: PoolAlloc,
        /// Length of the instruction stream (the allocation may be rounded up).
        insts_bytes: u64,
        /// A kernel told its KV length at dispatch: its streams, one per length.
        by_n_kv: Option<NkvStreams>,
    },
    /// c: a kernel of an AIE code object loaded into an executable. The executable lives as
    /// long as this kernel (an `Arc`): the device's table and every batch that dispatches it
    /// hold one, so it is destroyed only after its last dispatch has completed.
    Object(KernelObject),
}

/// The instruction streams of a kernel told its KV length at dispatch (`KernelDesc::n_kv_step`):
/// the stream's last word is the length (docs/kernel-compiler-protocol.md), so each length gets
/// its own copy, made on first use and kept while the kernel is loaded: a batch in flight may
/// still read any of them, and a context grows through a few dozen lengths at most.
#[derive(Debug)]
pub struct NkvStreams {
    template: Vec<u8>,
    copies: Mutex<Vec<(u32, PoolAlloc)>>,
}

impl LoadedKernel {
    /// What takes one of the queue's PDI slots: this load of the kernel (ROCR counts PDI
    /// buffers, and under ABI c every loaded kernel has its own copy of its PDI).
    pub fn pdi_slot(&self) -> u64 {
        self.id
    }

    /// The packet generation's view of a launch of this kernel.
    pub fn dispatch<'a>(&self, operands: &'a [Operand]) -> Dispatch<'a> {
        match &self.code {
            KernelCode::Blobs {
                pdi,
                insts,
                insts_bytes,
                ..
            } => Dispatch {
                kernel_object: 0,
                pdi_addr: pdi.device_addr(),
                insts_addr: insts.device_addr(),
                insts_bytes: *insts_bytes,
                operands,
            },
            KernelCode::Object(k) => Dispatch {
                kernel_object: k.handle,
                pdi_addr: 0,
                insts_addr: 0,
                insts_bytes: 0,
                operands,
            },
        }
    }
}

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Hsa(#[from] HsaError),
    #[error(transparent)]
    Kernel(#[from] crate::kernels::KernelError),
    #[error("kernel {name}: {reason}")]
    KernelLoad { name: String, reason: String },
    #[error(
        "kernel {name}: the dev heap is full and none of its {loaded} loaded kernel(s) can be \
         evicted (all are used by graphs or batches in flight): {source}"
    )]
    DevHeapFull {
        name: String,
        loaded: usize,
        source: HsaError,
    },
}

/// Why loading one kernel failed.
enum UploadError {
    /// The dev heap has no room for it: evicting a kernel may help.
    OutOfResources(HsaError),
    Failed(DeviceError),
}

/// The kernels of one request, and how many loaded kernels were evicted to make room.
#[derive(Debug)]
pub struct Kernels {
    pub kernels: Vec<Result<Arc<LoadedKernel>, DeviceError>>,
    pub evicted: u64,
    /// Time spent reading, compiling and uploading kernels; looking up loaded ones is not part
    /// of it.
    pub loading: std::time::Duration,
}

impl DeviceError {
    /// The kernel compiler declined this kernel (a shape or layout it does not take), as
    /// opposed to something failing.
    pub fn is_refused(&self) -> bool {
        matches!(self, DeviceError::Kernel(k) if k.refused)
    }
}

/// An NPU the backend drives.
#[derive(Debug)]
pub struct Device {
    pub index: usize,
    /// `HSA0`, `HSA1`, ...
    pub name: String,
    pub npu: Npu,
    pub packet_abi: PacketAbi,
    pub(crate) runtime: &'static Runtime,
    pub(crate) pools: AgentPools,
    /// Run-time planning choices (`GGML_HSA_F16_AS_BF16`).
    pub plan_options: PlanOptions,
    store: KernelStore,
    loaded: Mutex<HashMap<String, Arc<LoadedKernel>>>,
    /// Advances once per [`Device::kernels`] call (a graph); each kernel keeps the value of its
    /// last use, so marking a kernel used is one store, and eviction scans only when the heap
    /// is full.
    use_clock: AtomicU64,
    /// Numbers of loads ([`LoadedKernel::id`]).
    next_kernel_id: AtomicU64,
    /// Kernels evicted or released so far. A stream whose queue has run kernels since the last
    /// change replaces its queue (see `Stream::enqueue`).
    evictions: AtomicU64,
    /// Live streams of this device; the last one to go releases the idle kernels.
    streams: AtomicUsize,
    /// `GGML_HSA_CPU_FALLBACK`: claim every op; nodes without a kernel run on ggml's CPU backend.
    pub cpu_fallback: bool,
}

impl Device {
    /// Opens device `index` on `npu`: finds its pools and sets up its kernel store.
    pub fn open(
        index: usize,
        npu: Npu,
        runtime: &'static Runtime,
        packet_abi: PacketAbi,
        config: &Config,
    ) -> Result<Device, String> {
        let pools = runtime
            .pools(npu.agent.agent)
            .map_err(|e| e.to_string())
            .and_then(|p| select_pools(&p))
            .map_err(|e| format!("agent '{}': {e}", npu.agent.name))?;
        let jit = config
            .jit_compiler
            .as_deref()
            .and_then(Compiler::new)
            .map(|c| c.with_timeout(config.jit_timeout));
        let store = KernelStore::new(
            npu.arch,
            config.kernel_dir.clone(),
            config.cache_dir.clone(),
            jit,
            config.jit_verbose,
        )
        .with_cache_fallback(Some(config.cache_fallback.clone()))
        .with_cache_max(config.cache_max)
        .with_record(config.kernel_record.clone());
        if config.cache_clear {
            let removed = store.clear_cache();
            crate::log::notice(&format!(
                "GGML_HSA_KERNEL_CACHE_CLEAR: removed {} file(s) this backend wrote under {}/{}{}",
                removed.len(),
                config.cache_dir.display(),
                npu.arch,
                removed
                    .iter()
                    .filter_map(|p| p.file_name()?.to_str())
                    .map(|n| format!("\n  {n}"))
                    .collect::<String>()
            ));
        }
        Ok(Device {
            index,
            name: format!("HSA{index}"),
            npu,
            packet_abi,
            runtime,
            pools,
            plan_options: PlanOptions {
                f16_as_bf16: config.f16_as_bf16,
                row_pieces: config.row_pieces,
            },
            store,
            loaded: Mutex::new(HashMap::new()),
            use_clock: AtomicU64::new(0),
            next_kernel_id: AtomicU64::new(1),
            evictions: AtomicU64::new(0),
            streams: AtomicUsize::new(0),
            cpu_fallback: config.cpu_fallback,
        })
    }

    /// The agent's name (`aie2`, `aie2p`): the device description.
    pub fn description(&self) -> &str {
        &self.npu.agent.name
    }

    /// Free and total bytes for tensors. The data pool is system memory shared with the host, so
    /// the total is the pool size the runtime reports and the free part is bounded by what the
    /// system has available now.
    pub fn memory(&self) -> (usize, usize) {
        let total = self.pools.data.size;
        let free = available_system_memory().map_or(total, |avail| avail.min(total));
        (free, total)
    }

    /// The largest single buffer.
    pub fn max_buffer_size(&self) -> usize {
        match self.pools.data.alloc_max {
            0 => self.pools.data.size,
            max => max,
        }
    }

    /// A tensor buffer of `size` bytes in the data pool.
    pub fn alloc_buffer(&self, size: usize) -> Result<PoolAlloc, HsaError> {
        self.runtime.allocate(self.pools.data.pool, size.max(1))
    }

    /// Whether this device runs `node`. Cheap, and never compiles: the answer comes from the
    /// op rules and the kernel store (files on disk, the compiler's declared capabilities).
    pub fn supports(&self, node: &Node) -> Result<(), String> {
        let supported = self.plan(node).and_then(|plan| match plan {
            Plan::Skip | Plan::Host(_) => Ok(()),
            Plan::Kernel { desc, .. } => self.store.supports(&desc),
        });
        // With the CPU fallback every op is claimed; the caller has checked that its tensors
        // are host-accessible.
        if self.cpu_fallback {
            return Ok(());
        }
        supported
    }

    /// The plan of `node` on this device: an op that runs as a kernel or on the host (the
    /// copies, SET_ROWS) is a kernel when the kernel store can provide it.
    pub fn plan(&self, node: &Node) -> Result<Plan, String> {
        ops::plan_preferring(node, self.plan_options, |desc| self.supports_kernel(desc))
    }

    /// Whether the kernel store can provide `desc` (files on disk or the compiler's declared
    /// capabilities; a compile may still refuse the shape). Never compiles.
    pub fn supports_kernel(&self, desc: &KernelDesc) -> bool {
        // Under ABI c the instruction stream is inside the loaded code object: one per kernel,
        // not one per KV length.
        if desc.n_kv_step.is_some() && self.packet_abi == PacketAbi::C {
            return false;
        }
        self.store.supports(desc).is_ok()
    }

    /// The address of `kernel`'s instruction stream telling it `n_kv` (a kernel told its KV
    /// length at dispatch), made now if this length is new.
    pub fn n_kv_insts(&self, kernel: &LoadedKernel, n_kv: u32) -> Result<u64, String> {
        let KernelCode::Blobs {
            by_n_kv: Some(streams),
            ..
        } = &kernel.code
        else {
            return Err(format!(
                "kernel {} does not take its KV length at dispatch",
                kernel.name
            ));
        };
        let mut copies = streams.copies.lock();
        if let Some((_, a)) = copies.iter().find(|(n, _)| *n == n_kv) {
            return Ok(a.device_addr());
        }
        let mut words = streams.template.clone();
        let last = words
            .len()
            .checked_sub(4)
            .ok_or_else(|| format!("kernel {}: an empty instruction stream", kernel.name))?;
        words[last..].copy_from_slice(&n_kv.to_le_bytes());
        let alloc = self
            .runtime
            .allocate(self.pools.dev_heap.pool, words.len())
            .map_err(|e| format!("kernel {}: its stream for n_kv {n_kv}: {e}", kernel.name))?;
        alloc
            .write_at(0, &words)
            .map_err(|e| format!("kernel {}: {e}", kernel.name))?;
        let addr = alloc.device_addr();
        copies.push((n_kv, alloc));
        Ok(addr)
    }

    /// The kernels for `descs`, in order: those not loaded yet are found or compiled (the
    /// missing ones in parallel) and loaded into the dev heap, evicting idle kernels when it is
    /// full.
    pub fn kernels(&self, descs: &[KernelDesc]) -> Kernels {
        let names: Vec<String> = descs.iter().map(KernelDesc::canonical_name).collect();
        let now = self.use_clock.fetch_add(1, Ordering::Relaxed) + 1;
        // The loaded ones are taken (and marked used) first: holding them keeps them from being
        // evicted to make room for the new kernels of the same graph.
        let mut taken: Vec<Option<Arc<LoadedKernel>>> = {
            let loaded = self.loaded.lock();
            names
                .iter()
                .map(|n| {
                    let k = loaded.get(n)?;
                    k.last_used.store(now, Ordering::Relaxed);
                    Some(k.clone())
                })
                .collect()
        };
        let (new_names, new_descs): (Vec<String>, Vec<KernelDesc>) = names
            .iter()
            .zip(descs)
            .zip(&taken)
            .filter(|(_, k)| k.is_none())
            .map(|((n, d), _)| (n.clone(), d.clone()))
            .unzip();
        let mut loading = std::time::Duration::ZERO;
        let mut files: HashMap<String, Result<KernelFiles, KernelError>> = if new_descs.is_empty() {
            HashMap::new()
        } else {
            let started = std::time::Instant::now();
            let files = new_names
                .into_iter()
                .zip(self.store.load_many(&new_descs))
                .collect();
            loading += started.elapsed();
            files
        };
        let n_args: HashMap<&str, (u32, bool)> = names
            .iter()
            .zip(descs)
            .map(|(n, d)| {
                (
                    n.as_str(),
                    (d.operand_count() as u32, d.n_kv_step.is_some()),
                )
            })
            .collect();
        let mut evicted = 0;
        let kernels = names
            .iter()
            .zip(taken.iter_mut())
            .map(|(name, taken)| {
                if let Some(k) = taken.take() {
                    return Ok(k);
                }
                // A kernel several nodes need is loaded by the first of them.
                if let Some(k) = self.loaded.lock().get(name) {
                    k.last_used.store(now, Ordering::Relaxed);
                    return Ok(k.clone());
                }
                // Its failure is every one's (a refused kernel must not become "not requested"
                // for the second node).
                let files = match files.get(name) {
                    Some(Err(e)) => Err(e.clone()),
                    Some(Ok(_)) => files.remove(name).expect("present"),
                    None => Err(KernelError {
                        name: name.clone(),
                        reason: "not requested".into(),
                        refused: false,
                    }),
                }?;
                let uploading = std::time::Instant::now();
                let (args, n_kv) = n_args[name.as_str()];
                let kernel = self.load(&files, args, n_kv, now, &mut evicted);
                loading += uploading.elapsed();
                let kernel = kernel?;
                Ok(self
                    .loaded
                    .lock()
                    .entry(name.clone())
                    .or_insert(kernel)
                    .clone())
            })
            .collect();
        Kernels {
            kernels,
            evicted,
            loading,
        }
    }

    /// Loads one kernel; while the dev heap has no room, evicts the least recently used idle
    /// kernel (counted in `evicted`) and tries again.
    fn load(
        &self,
        files: &KernelFiles,
        n_args: u32,
        n_kv: bool,
        now: u64,
        evicted: &mut u64,
    ) -> Result<Arc<LoadedKernel>, DeviceError> {
        loop {
            match self.upload(files, n_args, n_kv) {
                Ok(code) => {
                    return Ok(Arc::new(LoadedKernel {
                        name: files.name.clone(),
                        id: self.next_kernel_id.fetch_add(1, Ordering::Relaxed),
                        last_used: AtomicU64::new(now),
                        code,
                    }))
                }
                Err(UploadError::Failed(e)) => return Err(e),
                Err(UploadError::OutOfResources(source)) => {
                    if !self.evict(Some(1)) {
                        return Err(DeviceError::DevHeapFull {
                            name: files.name.clone(),
                            loaded: self.loaded.lock().len(),
                            source,
                        });
                    }
                    *evicted += 1;
                }
            }
        }
    }

    /// Unloads up to `limit` (all when `None`) of the kernels only the table holds, least
    /// recently used first: their dev-heap memory is freed, or their executable destroyed.
    /// Whether any was. A strong count of 1 under the table's lock is final: every other
    /// holder got its `Arc` from the table under this lock, or from a holder.
    fn evict(&self, limit: Option<usize>) -> bool {
        let victims: Vec<Arc<LoadedKernel>> = {
            let mut loaded = self.loaded.lock();
            let mut idle: Vec<(u64, String)> = loaded
                .iter()
                .filter(|(_, k)| Arc::strong_count(k) == 1)
                .map(|(n, k)| (k.last_used.load(Ordering::Relaxed), n.clone()))
                .collect();
            let n = limit.unwrap_or(idle.len()).min(idle.len());
            if n < idle.len() {
                idle.select_nth_unstable(n);
            }
            idle.truncate(n);
            idle.iter()
                .filter_map(|(_, name)| loaded.remove(name))
                .collect()
        };
        if victims.is_empty() {
            return false;
        }
        // Counted before the memory is freed: a stream that later sees a kernel loaded into
        // that memory sees the count changed too.
        self.evictions
            .fetch_add(victims.len() as u64, Ordering::SeqCst);
        for k in &victims {
            crate::log::debug(&format!("{}: unloading kernel {}", self.name, k.name));
        }
        true
    }

    /// Kernels evicted or released so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::SeqCst)
    }

    /// A stream of this device was created.
    pub(crate) fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::SeqCst);
    }

    /// A stream of this device was freed. When it was the last one, the kernels nothing holds
    /// are released (their memory freed, their executables destroyed): without a stream nothing
    /// can dispatch them, and ggml has no hook for the device itself going away. A later stream
    /// loads what it needs again.
    pub(crate) fn stream_closed(&self) {
        if self.streams.fetch_sub(1, Ordering::SeqCst) == 1 {
            let before = self.evictions();
            if self.evict(None) {
                crate::log::debug(&format!(
                    "{}: last backend freed; {} kernel(s) unloaded",
                    self.name,
                    self.evictions() - before
                ));
            }
        }
    }

    /// Loads a kernel: for ABI c its code object (the `.hsaco` file, or one wrapping the PDI and
    /// instruction stream: a kind-0 kernel under the agent's architecture, named by the
    /// kernel's canonical name, taking `n_args` buffers); otherwise copies its PDI and
    /// instruction stream into the dev heap. A full dev heap is told apart from other failures.
    fn upload(
        &self,
        files: &KernelFiles,
        n_args: u32,
        n_kv: bool,
    ) -> Result<KernelCode, UploadError> {
        let failed = |reason: String| {
            UploadError::Failed(DeviceError::KernelLoad {
                name: files.name.clone(),
                reason,
            })
        };
        if self.packet_abi == PacketAbi::C {
            let wrapped;
            let hsaco = match &files.hsaco {
                Some(bytes) => bytes.as_slice(),
                None => {
                    wrapped = self
                        .npu
                        .arch
                        .wrap_hsaco(&files.name, &files.pdi, &files.insts, n_args)
                        .map_err(|e| {
                            failed(format!("cannot wrap it as an AIE code object: {e}"))
                        })?;
                    &wrapped
                }
            };
            // ROCR copies the code object's blobs into the dev heap when it loads it, so a full
            // heap fails the load with OUT_OF_RESOURCES (as hsa-sim does; inferred for ROCR).
            let mut objects = self
                .runtime
                .load_code_object(self.npu.agent.agent, hsaco, &[&files.name])
                .map_err(|e| match e {
                    e if e.is_out_of_resources() => UploadError::OutOfResources(e),
                    e => failed(format!("loading its code object: {e}")),
                })?;
            let object = objects
                .pop()
                .ok_or_else(|| failed("the code object has no kernel".into()))?;
            return Ok(KernelCode::Object(object));
        }
        let load = |bytes: &[u8]| -> Result<PoolAlloc, UploadError> {
            let alloc = self
                .runtime
                .allocate(self.pools.dev_heap.pool, bytes.len())
                .map_err(|e| match e {
                    e if e.is_out_of_resources() => UploadError::OutOfResources(e),
                    e => UploadError::Failed(e.into()),
                })?;
            alloc
                .write_at(0, bytes)
                .map_err(|e| failed(e.to_string()))?;
            Ok(alloc)
        };
        Ok(KernelCode::Blobs {
            pdi: load(&files.pdi)?,
            insts: load(&files.insts)?,
            insts_bytes: files.insts.len() as u64,
            by_n_kv: n_kv.then(|| NkvStreams {
                template: files.insts.clone(),
                copies: Mutex::new(Vec::new()),
            }),
        })
    }
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
fn available_system_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_available_memory_on_linux() {
        let avail = super::available_system_memory().expect("/proc/meminfo has MemAvailable");
        assert!(avail > 1 << 20);
    }
}
