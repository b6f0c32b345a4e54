//! Agents and memory pools: one CPU agent first, then the AIE agents named by the configuration,
//! each with ROCR's three AIE regions in ROCR's order.

use crate::consts::*;

/// Handles are small tagged integers; 0 is never a valid handle.
const AGENT_HANDLE_BASE: u64 = 0x5a6e_0000_0001_0000;
const POOL_HANDLE_BASE: u64 = 0x5a6e_0000_0002_0000;

/// What a pool is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// The CPU agent's system pool (fine-grained, kernarg). Not an AIE pool: memory from it
    /// cannot be used as a packet operand, exactly as ROCR cannot resolve it to an XDNA BO.
    CpuSystem,
    /// AIE pool 0: kernarg / system, flags COARSE|KERNARG (5).
    AieKernarg,
    /// AIE pool 1: the 64 MiB device heap (PDIs, instruction streams; smaller with
    /// `HSA_SIM_DEV_HEAP_SIZE`), flags COARSE (4), recommended granule 0.
    AieDevHeap,
    /// AIE pool 2: other data, flags COARSE (4).
    AieData,
}

impl PoolKind {
    pub fn is_aie(self) -> bool {
        !matches!(self, PoolKind::CpuSystem)
    }
}

#[derive(Clone, Debug)]
pub struct Pool {
    pub handle: u64,
    /// Index of the owning agent in [`Topology::agents`].
    pub agent: usize,
    pub kind: PoolKind,
    pub flags: u32,
    pub size: usize,
    pub rec_granule: usize,
    pub alloc_max: usize,
}

#[derive(Clone, Debug)]
pub struct Agent {
    pub handle: u64,
    pub name: String,
    pub device_type: u32,
    /// Indices into [`Topology::pools`], in iteration order.
    pub pools: Vec<usize>,
}

impl Agent {
    pub fn is_aie(&self) -> bool {
        self.device_type == HSA_DEVICE_TYPE_AIE
    }
}

#[derive(Clone, Debug, Default)]
pub struct Topology {
    pub agents: Vec<Agent>,
    pub pools: Vec<Pool>,
}

impl Topology {
    /// Builds the CPU agent and one AIE agent per name. `ram` is the host memory size reported
    /// for the system pools, `dev_heap` the size of each AIE dev heap.
    pub fn build(aie_names: &[String], ram: usize, dev_heap: usize) -> Topology {
        let mut t = Topology::default();
        let cpu = t.add_agent("hsa-sim CPU", HSA_DEVICE_TYPE_CPU);
        t.add_pool(cpu, PoolKind::CpuSystem, ram, dev_heap);
        for name in aie_names {
            let a = t.add_agent(name, HSA_DEVICE_TYPE_AIE);
            t.add_pool(a, PoolKind::AieKernarg, ram, dev_heap);
            t.add_pool(a, PoolKind::AieDevHeap, ram, dev_heap);
            t.add_pool(a, PoolKind::AieData, ram, dev_heap);
        }
        t
    }

    fn add_agent(&mut self, name: &str, device_type: u32) -> usize {
        let idx = self.agents.len();
        self.agents.push(Agent {
            handle: AGENT_HANDLE_BASE + idx as u64,
            name: name.to_string(),
            device_type,
            pools: Vec::new(),
        });
        idx
    }

    fn add_pool(&mut self, agent: usize, kind: PoolKind, ram: usize, dev_heap: usize) {
        let idx = self.pools.len();
        let (flags, size, rec_granule) = match kind {
            PoolKind::CpuSystem => (
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT
                    | HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
                ram,
                PAGE_SIZE,
            ),
            PoolKind::AieKernarg => (
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED
                    | HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT,
                ram,
                PAGE_SIZE,
            ),
            PoolKind::AieDevHeap => (HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED, dev_heap, 0),
            PoolKind::AieData => (
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED,
                ram,
                PAGE_SIZE,
            ),
        };
        self.pools.push(Pool {
            handle: POOL_HANDLE_BASE + idx as u64,
            agent,
            kind,
            flags,
            size,
            rec_granule,
            // ROCR reports the system-memory total as ALLOC_MAX_SIZE for all three AIE pools,
            // including the dev heap (where it is wrong); the simulator does the same.
            alloc_max: ram,
        });
        self.agents[agent].pools.push(idx);
    }

    pub fn agent_index(&self, handle: u64) -> Option<usize> {
        let i = handle.checked_sub(AGENT_HANDLE_BASE)? as usize;
        (i < self.agents.len()).then_some(i)
    }

    pub fn pool_index(&self, handle: u64) -> Option<usize> {
        let i = handle.checked_sub(POOL_HANDLE_BASE)? as usize;
        (i < self.pools.len()).then_some(i)
    }
}

/// Host memory size (MemTotal from /proc/meminfo), or 16 GiB when unknown.
pub fn host_ram_bytes() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|kb| kb.parse::<usize>().ok())
                })
        })
        .map(|kb| kb * 1024)
        .unwrap_or(16 << 30)
}
