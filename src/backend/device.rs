//! One NPU as a ggml device: its pools, packet ABI, kernel store and the kernels loaded into its
//! dev heap.

use std::collections::HashMap;
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

/// A kernel loaded on the device.
#[derive(Debug)]
pub struct LoadedKernel {
    pub name: String,
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
    },
    /// c: a kernel of an AIE code object loaded into an executable. The executable lives as
    /// long as this kernel (an `Arc`): the device's table and every batch that dispatches it
    /// hold one, so it is destroyed only after its last dispatch has completed.
    Object(KernelObject),
}

impl LoadedKernel {
    /// What takes one of the queue's PDI slots: the PDI's address, or for ABI c the kernel
    /// object (ROCR counts PDI buffers, and every loaded kernel has its own copy of its PDI).
    pub fn pdi_slot(&self) -> u64 {
        match &self.code {
            KernelCode::Blobs { pdi, .. } => pdi.device_addr(),
            KernelCode::Object(k) => k.handle,
        }
    }

    /// The packet generation's view of a launch of this kernel.
    pub fn dispatch<'a>(&self, operands: &'a [Operand]) -> Dispatch<'a> {
        match &self.code {
            KernelCode::Blobs {
                pdi,
                insts,
                insts_bytes,
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
        let store = KernelStore::new(
            npu.arch,
            config.kernel_dir.clone(),
            config.cache_dir.clone(),
            config.jit_compiler.as_deref().and_then(Compiler::new),
            config.jit_verbose,
        )
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
            },
            store,
            loaded: Mutex::new(HashMap::new()),
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
        self.store.supports(desc).is_ok()
    }

    /// The kernels for `descs`, in order: those not loaded yet are found or compiled (the
    /// missing ones in parallel) and loaded into the dev heap. Also returns the time spent
    /// reading, compiling and uploading kernels; looking up loaded ones is not part of it.
    pub fn kernels(
        &self,
        descs: &[KernelDesc],
    ) -> (
        Vec<Result<Arc<LoadedKernel>, DeviceError>>,
        std::time::Duration,
    ) {
        let names: Vec<String> = descs.iter().map(KernelDesc::canonical_name).collect();
        let (new_names, new_descs): (Vec<String>, Vec<KernelDesc>) = {
            let loaded = self.loaded.lock();
            names
                .iter()
                .zip(descs)
                .filter(|(n, _)| !loaded.contains_key(*n))
                .map(|(n, d)| (n.clone(), d.clone()))
                .unzip()
        };
        let mut loading = std::time::Duration::ZERO;
        let started = std::time::Instant::now();
        let mut files: HashMap<String, Result<KernelFiles, KernelError>> = if new_descs.is_empty() {
            HashMap::new()
        } else {
            let files = new_names
                .into_iter()
                .zip(self.store.load_many(&new_descs))
                .collect();
            loading += started.elapsed();
            files
        };
        let n_args: HashMap<&str, u32> = names
            .iter()
            .zip(descs)
            .map(|(n, d)| (n.as_str(), d.inputs.len() as u32 + 1))
            .collect();
        let kernels = names
            .iter()
            .map(|name| {
                if let Some(k) = self.loaded.lock().get(name) {
                    return Ok(k.clone());
                }
                // A kernel several nodes need is requested once; its failure is every one's
                // (a refused kernel must not become "not requested" for the second node).
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
                let kernel = self.upload(&files, n_args[name.as_str()]);
                loading += uploading.elapsed();
                Ok(self
                    .loaded
                    .lock()
                    .entry(name.clone())
                    .or_insert(Arc::new(kernel?))
                    .clone())
            })
            .collect();
        (kernels, loading)
    }

    /// Loads a kernel: for ABI c its code object (the `.hsaco` file, or one wrapping the PDI and
    /// instruction stream: a kind-0 kernel under the agent's architecture, named by the
    /// kernel's canonical name, taking `n_args` buffers); otherwise copies its PDI and
    /// instruction stream into the dev heap.
    fn upload(&self, files: &KernelFiles, n_args: u32) -> Result<LoadedKernel, DeviceError> {
        let failed = |reason: String| DeviceError::KernelLoad {
            name: files.name.clone(),
            reason,
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
            let mut objects = self
                .runtime
                .load_code_object(self.npu.agent.agent, hsaco, &[&files.name])
                .map_err(|e| failed(format!("loading its code object: {e}")))?;
            let object = objects
                .pop()
                .ok_or_else(|| failed("the code object has no kernel".into()))?;
            return Ok(LoadedKernel {
                name: files.name.clone(),
                code: KernelCode::Object(object),
            });
        }
        let load = |bytes: &[u8]| -> Result<PoolAlloc, DeviceError> {
            let alloc = self
                .runtime
                .allocate(self.pools.dev_heap.pool, bytes.len())?;
            alloc
                .write_at(0, bytes)
                .map_err(|e| DeviceError::KernelLoad {
                    name: files.name.clone(),
                    reason: e.to_string(),
                })?;
            Ok(alloc)
        };
        Ok(LoadedKernel {
            name: files.name.clone(),
            code: KernelCode::Blobs {
                pdi: load(&files.pdi)?,
                insts: load(&files.insts)?,
                insts_bytes: files.insts.len() as u64,
            },
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
