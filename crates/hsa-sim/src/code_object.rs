//! Code object readers and executables for AIE agents (packet ABI `c`): ROCR's AIE hsaco path.
//!
//! A reader holds a copy of the client's bytes. Loading it into an executable for an AIE agent
//! finds the first AIE section named like the agent (no section: INCOMPATIBLE_ARGUMENTS),
//! validates it strictly with the shared `aie-hsaco` reader (malformed: INVALID_CODE_OBJECT;
//! a PDI + instructions kernel without a PDI, or wider than the agent: INVALID_CODE_OBJECT),
//! refuses a name already loaded for that agent in that executable
//! (VARIABLE_ALREADY_DEFINED), and copies every blob into the agent's dev heap (as ROCR's
//! `place_blob` does). Each kernel gets a descriptor whose address is its kernel object, whose
//! first u32 is the descriptor version 1; `KERNEL_OBJECT` reads 0 until the executable is
//! frozen. Destroying the executable frees the blobs and the descriptors: a packet naming a
//! kernel object that is not live is refused.
//!
//! On a runtime of another packet ABI (a1..b: a ROCR before the hsaco loader), an AIE code
//! object falls through to the GPU loader and is refused with INVALID_CODE_OBJECT (the exact
//! status on such a ROCR is unconfirmed); that is what the backend's ABI probe relies on.
//!
//! Lock order: the memory table may be locked before this registry (doorbells do), never after:
//! loading allocates before it registers, destroying unregisters before it frees.

use crate::agents::PoolKind;
use crate::config::PacketAbi;
use crate::consts::*;
use crate::cost;
use crate::runtime::Runtime;
use std::collections::HashMap;

/// `AieKernelDescriptor` as far as clients may rely on it: the version word first.
#[repr(C)]
#[derive(Debug)]
pub struct Descriptor {
    pub version: u32,
    pub reserved: u32,
    pub insts_addr: u64,
    pub insts_size: u64,
    pub pdi_addr: u64,
}

/// The descriptor version ROCR's driver accepts.
pub const DESCRIPTOR_VERSION: u32 = 1;

/// What a generation-c packet resolves its kernel object to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCode {
    pub name: String,
    pub agent: usize,
    pub pdi_addr: u64,
    pub insts_addr: u64,
    pub insts_bytes: u64,
    pub kernarg_size: u32,
}

#[derive(Debug)]
struct LoadedKernel {
    code: KernelCode,
    symbol: u64,
    descriptor: Box<Descriptor>,
}

#[derive(Debug, Default)]
struct Executable {
    frozen: bool,
    kernels: Vec<LoadedKernel>,
    /// Dev-heap allocations holding the blobs (internal allocations).
    allocations: Vec<usize>,
}

/// The registry of readers, executables, symbols and kernel objects of one runtime.
#[derive(Debug, Default)]
pub struct CodeObjects {
    readers: HashMap<u64, Vec<u8>>,
    executables: HashMap<u64, Executable>,
    /// Symbol handle -> (executable, kernel index).
    symbols: HashMap<u64, (u64, usize)>,
    /// Live kernel objects (descriptor addresses of frozen executables) -> executable.
    kernel_objects: HashMap<u64, u64>,
    next: u64,
}

/// What `hsa_executable_symbol_get_info` can answer for an AIE kernel symbol.
#[derive(Clone, Debug)]
pub struct SymbolInfo {
    pub name: String,
    pub agent: usize,
    pub kernel_object: u64,
    pub kernarg_size: u32,
}

impl CodeObjects {
    fn handle(&mut self) -> u64 {
        self.next += 1;
        0x5a6e_00c0_0000_0000 | self.next
    }

    pub fn create_reader(&mut self, bytes: Vec<u8>) -> u64 {
        let h = self.handle();
        self.readers.insert(h, bytes);
        h
    }

    pub fn destroy_reader(&mut self, h: u64) -> Status {
        match self.readers.remove(&h) {
            Some(_) => HSA_STATUS_SUCCESS,
            None => HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER,
        }
    }

    pub fn create_executable(&mut self) -> u64 {
        let h = self.handle();
        self.executables.insert(h, Executable::default());
        h
    }

    pub fn freeze(&mut self, exe: u64) -> Status {
        let Some(e) = self.executables.get_mut(&exe) else {
            return HSA_STATUS_ERROR_INVALID_EXECUTABLE;
        };
        if e.frozen {
            return HSA_STATUS_ERROR_FROZEN_EXECUTABLE;
        }
        e.frozen = true;
        for k in &e.kernels {
            let ko = &*k.descriptor as *const Descriptor as u64;
            self.kernel_objects.insert(ko, exe);
        }
        HSA_STATUS_SUCCESS
    }

    /// Looks a kernel symbol up by name for one agent (AIE kernels are agent symbols only).
    pub fn symbol_by_name(
        &self,
        exe: u64,
        name: &str,
        agent: Option<usize>,
    ) -> Result<u64, Status> {
        let e = self
            .executables
            .get(&exe)
            .ok_or(HSA_STATUS_ERROR_INVALID_EXECUTABLE)?;
        let agent = agent.ok_or(HSA_STATUS_ERROR_INVALID_SYMBOL_NAME)?;
        e.kernels
            .iter()
            .find(|k| k.code.name == name && k.code.agent == agent)
            .map(|k| k.symbol)
            .ok_or(HSA_STATUS_ERROR_INVALID_SYMBOL_NAME)
    }

    pub fn symbol_info(&self, sym: u64) -> Option<SymbolInfo> {
        let &(exe, idx) = self.symbols.get(&sym)?;
        let e = self.executables.get(&exe)?;
        let k = e.kernels.get(idx)?;
        Some(SymbolInfo {
            name: k.code.name.clone(),
            agent: k.code.agent,
            kernel_object: if e.frozen {
                &*k.descriptor as *const Descriptor as u64
            } else {
                0
            },
            kernarg_size: k.code.kernarg_size,
        })
    }

    /// The code behind a live kernel object (a frozen, not destroyed executable's descriptor).
    pub fn kernel_code(&self, kernel_object: u64) -> Option<KernelCode> {
        let exe = self.kernel_objects.get(&kernel_object)?;
        self.executables
            .get(exe)?
            .kernels
            .iter()
            .find(|k| &*k.descriptor as *const Descriptor as u64 == kernel_object)
            .map(|k| k.code.clone())
    }

    /// Number of live executables (tests, counters).
    pub fn executable_count(&self) -> usize {
        self.executables.len()
    }
}

/// `hsa_executable_load_agent_code_object` for agent index `agent`.
pub fn load(rt: &Runtime, exe: u64, agent: usize, reader: u64) -> Status {
    let bytes = {
        let co = rt.code.lock();
        match co.executables.get(&exe) {
            None => return HSA_STATUS_ERROR_INVALID_EXECUTABLE,
            Some(e) if e.frozen => return HSA_STATUS_ERROR_FROZEN_EXECUTABLE,
            Some(_) => {}
        }
        match co.readers.get(&reader) {
            Some(b) => b.clone(),
            None => return HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER,
        }
    };
    let a = &rt.topo.agents[agent];
    if !a.is_aie() {
        rt.log("load_agent_code_object: not an AIE agent (the simulator has no GPU loader)");
        return HSA_STATUS_ERROR_INVALID_AGENT;
    }
    if rt.config.packet_abi != PacketAbi::C {
        rt.log(&format!(
            "load_agent_code_object: packet ABI {} has no AIE code-object loader; the GPU loader \
             refuses the file",
            rt.config.packet_abi.name()
        ));
        return HSA_STATUS_ERROR_INVALID_CODE_OBJECT;
    }
    let kernels = match aie_hsaco::read(&bytes, &a.name) {
        Ok(k) => k,
        Err(e @ aie_hsaco::HsacoError::NoSection(_)) => {
            rt.log(&format!("load_agent_code_object: {e}"));
            return HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS;
        }
        Err(e) => {
            rt.log(&format!(
                "load_agent_code_object: invalid AIE code object: {e}"
            ));
            return HSA_STATUS_ERROR_INVALID_CODE_OBJECT;
        }
    };
    let columns = cost::model_for(&a.name).columns;
    for k in &kernels {
        if k.kind != aie_hsaco::KernelKind::PdiInsts {
            rt.log(&format!(
                "load_agent_code_object: kernel {:?} is a full ELF, which the simulator does not execute",
                k.name
            ));
            return HSA_STATUS_ERROR_INVALID_CODE_OBJECT;
        }
        if k.num_cols > columns {
            rt.log(&format!(
                "load_agent_code_object: kernel {:?} needs {} columns, {} has {columns}",
                k.name, k.num_cols, a.name
            ));
            return HSA_STATUS_ERROR_INVALID_CODE_OBJECT;
        }
    }
    {
        let co = rt.code.lock();
        let Some(e) = co.executables.get(&exe) else {
            return HSA_STATUS_ERROR_INVALID_EXECUTABLE;
        };
        if let Some(k) = kernels.iter().find(|k| {
            e.kernels
                .iter()
                .any(|l| l.code.agent == agent && l.code.name == k.name)
        }) {
            rt.log(&format!(
                "load_agent_code_object: kernel {:?} is already defined for this agent",
                k.name
            ));
            return HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED;
        }
    }
    let Some(heap) = a
        .pools
        .iter()
        .copied()
        .find(|&p| rt.topo.pools[p].kind == PoolKind::AieDevHeap)
    else {
        return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
    };
    // Copy each blob into its own dev-heap buffer.
    let mut allocations = Vec::new();
    let free_all = |allocs: &[usize]| {
        let mut mem = rt.memory.lock();
        for &b in allocs {
            mem.free(b, true);
        }
    };
    let place = |blob: &[u8], allocs: &mut Vec<usize>| -> Result<u64, Status> {
        let base = rt.allocate(heap, blob.len().max(1), true)?;
        allocs.push(base);
        if !rt.memory.lock().write(base, blob) {
            return Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES);
        }
        Ok(base as u64)
    };
    let mut loaded = Vec::new();
    for k in kernels {
        let placed = place(&k.insts, &mut allocations)
            .and_then(|i| place(&k.pdi, &mut allocations).map(|p| (i, p)));
        let (insts_addr, pdi_addr) = match placed {
            Ok(v) => v,
            Err(s) => {
                free_all(&allocations);
                return s;
            }
        };
        loaded.push(KernelCode {
            name: k.name,
            agent,
            pdi_addr,
            insts_addr,
            insts_bytes: k.insts.len() as u64,
            kernarg_size: k.kernarg_size,
        });
    }
    let mut co = rt.code.lock();
    let mut symbols = Vec::new();
    for _ in &loaded {
        symbols.push(co.handle());
    }
    let Some(e) = co.executables.get_mut(&exe) else {
        drop(co);
        free_all(&allocations);
        return HSA_STATUS_ERROR_INVALID_EXECUTABLE;
    };
    if e.frozen {
        drop(co);
        free_all(&allocations);
        return HSA_STATUS_ERROR_FROZEN_EXECUTABLE;
    }
    let first = e.kernels.len();
    e.allocations.extend(allocations);
    for (code, &symbol) in loaded.into_iter().zip(&symbols) {
        let descriptor = Box::new(Descriptor {
            version: DESCRIPTOR_VERSION,
            reserved: 0,
            insts_addr: code.insts_addr,
            insts_size: code.insts_bytes,
            pdi_addr: code.pdi_addr,
        });
        e.kernels.push(LoadedKernel {
            code,
            symbol,
            descriptor,
        });
    }
    for (i, s) in symbols.into_iter().enumerate() {
        co.symbols.insert(s, (exe, first + i));
    }
    HSA_STATUS_SUCCESS
}

/// `hsa_executable_destroy`: unregisters, then frees the blobs.
pub fn destroy(rt: &Runtime, exe: u64) -> Status {
    let e = {
        let mut co = rt.code.lock();
        let Some(e) = co.executables.remove(&exe) else {
            return HSA_STATUS_ERROR_INVALID_EXECUTABLE;
        };
        co.symbols.retain(|_, (x, _)| *x != exe);
        co.kernel_objects.retain(|_, x| *x != exe);
        e
    };
    let mut mem = rt.memory.lock();
    for b in &e.allocations {
        mem.free(*b, true);
    }
    HSA_STATUS_SUCCESS
}
