//! AIE packet ABIs. Each generation is its own module; all of them decode a 64-byte ring slot
//! into the same [`Command`] (PDI, instruction stream, operands, completion signal), which the
//! queue then resolves, validates and executes.

pub mod a1;
pub mod a2;
pub mod a3;
pub mod b;
pub mod c;
mod ert;

use crate::agents::Topology;
use crate::config::PacketAbi;
use crate::consts::*;
use crate::memory::MemoryTable;

/// One buffer operand as the packet gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operand {
    pub addr: u64,
    pub size: u64,
}

/// A decoded START_CU / kernel dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub pdi_addr: u64,
    pub insts_addr: u64,
    /// Instruction stream length in bytes (A packets carry dwords; converted here).
    pub insts_bytes: u64,
    /// Inputs in order, then the output.
    pub operands: Vec<Operand>,
    /// Completion signal handle, 0 = none (always 0 for A1).
    pub completion_signal: u64,
    /// Address of the payload word `data[2]` (A generations), which ROCR overwrites with the
    /// instruction buffer's device address once the instruction VA has been resolved.
    pub insts_word_addr: Option<usize>,
}

/// A packet the selected ABI refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketError {
    pub status: Status,
    pub msg: String,
}

impl PacketError {
    pub fn format(msg: impl Into<String>) -> PacketError {
        PacketError {
            status: HSA_STATUS_ERROR_INVALID_PACKET_FORMAT,
            msg: msg.into(),
        }
    }

    pub fn allocation(msg: impl Into<String>) -> PacketError {
        PacketError {
            status: HSA_STATUS_ERROR_INVALID_ALLOCATION,
            msg: msg.into(),
        }
    }
}

/// What decoding may read besides the slot: the allocation table and which pools are AIE pools.
#[derive(Clone, Copy, Debug)]
pub struct DecodeCtx<'a> {
    pub mem: &'a MemoryTable,
    pub topo: &'a Topology,
    /// Resolves a generation-c kernel object (a live, frozen executable's kernel).
    pub code: &'a parking_lot::Mutex<crate::code_object::CodeObjects>,
}

impl DecodeCtx<'_> {
    /// Copies `[addr, addr+len)` if it lies inside one AIE pool allocation.
    pub fn read_aie(&self, what: &str, addr: u64, len: usize) -> Result<Vec<u8>, PacketError> {
        let a = self.mem.lookup_range(addr as usize, len).ok_or_else(|| {
            PacketError::allocation(format!(
                "{what} at {addr:#x} ({len} bytes) is not inside a live AIE pool allocation"
            ))
        })?;
        if !self.topo.pools[a.pool].kind.is_aie() {
            return Err(PacketError::allocation(format!(
                "{what} at {addr:#x} lies in a CPU-agent allocation; the NPU only reaches AIE pool memory"
            )));
        }
        self.mem
            .read(addr as usize, len)
            .ok_or_else(|| PacketError::allocation(format!("{what} at {addr:#x} is unreadable")))
    }
}

/// One packet ABI generation.
pub trait PacketFormat: Send + Sync + std::fmt::Debug {
    fn abi(&self) -> PacketAbi;
    /// Decodes and validates one ring slot.
    fn decode(&self, slot: &[u8; PACKET_SIZE], ctx: &DecodeCtx) -> Result<Command, PacketError>;
    /// The completion signal field of a slot as this ABI reads it (0 if the ABI has none).
    fn completion_signal_field(&self, slot: &[u8; PACKET_SIZE]) -> u64;
    /// `HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR` of the ROCR generation (1.x).
    fn ext_version_minor(&self) -> u16;
}

/// The format object for a generation.
pub fn format_for(abi: PacketAbi) -> &'static dyn PacketFormat {
    match abi {
        PacketAbi::A1 => &a1::A1,
        PacketAbi::A2 => &a2::A2,
        PacketAbi::A3 => &a3::A3,
        PacketAbi::B => &b::B,
        PacketAbi::C => &c::C,
    }
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(w)
}

/// The checks every 64-byte AIE kernel-dispatch packet (generations B and C) passes: a READY
/// header with no reserved bits, the KMQ opcode, count 24 and zero reserved fields. `gen`
/// prefixes the messages.
fn check_dispatch_header(slot: &[u8; PACKET_SIZE], gen: &str) -> Result<(), PacketError> {
    let header = u16_at(slot, 0);
    let ty = header as u8;
    if ty == HSA_PACKET_TYPE_INVALID {
        return Err(PacketError::format(format!(
            "{gen}: slot holds an INVALID packet (type 1): the client rang the doorbell before \
             writing it"
        )));
    }
    if ty != HSA_AMD_AIE_PACKET_TYPE_READY {
        return Err(PacketError::format(format!(
            "{gen}: header type {ty}, expected READY (0)"
        )));
    }
    if header & 0xE000 != 0 {
        return Err(PacketError::format(format!(
            "{gen}: header {header:#06x} has bits 13-15 set"
        )));
    }
    let opcode = u16_at(slot, 2);
    if opcode != HSA_AMD_AIE_PACKET_OPCODE_KMQ {
        let hint = match opcode {
            3 => " (bytes 2-3 hold AmdFormat 3: an A1/A2 ERT packet)",
            200 => " (bytes 2-3 hold AmdFormat 200: an A3 ERT packet)",
            _ => "",
        };
        return Err(PacketError::format(format!(
            "{gen}: opcode {opcode}{hint}, expected KMQ (0) for an AIE kernel-dispatch packet"
        )));
    }
    let count = u16_at(slot, 4);
    if count != HSA_AMD_AIE_KERNEL_DISPATCH_COUNT {
        return Err(PacketError::format(format!(
            "{gen}: count {count}, must be 24"
        )));
    }
    if slot[6] != 0 || slot[7] != 0 || u32_at(slot, 16) != 0 || u16_at(slot, 30) != 0 {
        return Err(PacketError::format(format!(
            "{gen}: reserved fields are not zero"
        )));
    }
    Ok(())
}

/// The operands of a 64-byte kernel-dispatch packet: `num_kernargs` (offset 28) addresses then
/// as many sizes in the kernarg table at offset 32.
fn dispatch_operands(
    slot: &[u8; PACKET_SIZE],
    ctx: &DecodeCtx,
    gen: &str,
) -> Result<Vec<Operand>, PacketError> {
    let n = u16_at(slot, 28) as usize;
    let kernarg = u64_at(slot, 32);
    if n == 0 {
        if kernarg != 0 {
            return Err(PacketError::format(format!(
                "{gen}: kernarg_address must be NULL when num_kernargs is 0"
            )));
        }
        return Ok(Vec::new());
    }
    if kernarg == 0 {
        return Err(PacketError::format(format!(
            "{gen}: kernarg_address is NULL with num_kernargs {n}"
        )));
    }
    let table = ctx.read_aie("kernarg table", kernarg, 16 * n)?;
    Ok((0..n)
        .map(|i| Operand {
            addr: u64_at(&table, 8 * i),
            size: u64_at(&table, 8 * (n + i)),
        })
        .collect())
}
