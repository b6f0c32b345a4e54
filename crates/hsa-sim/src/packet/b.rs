//! Gen B (`hsa_ext_amd_aie.h` v1.0): the 64-byte `hsa_amd_aie_kernel_dispatch_packet_t`.
//!
//! `[0..2)` header (type bits 0-7 = READY (0); barrier bit 8 and fence scopes bits 9-12
//! allowed), `[2..4)` opcode = KMQ (0), `[4..6)` count = 24, `[6]`, `[7]` reserved = 0,
//! `[8..16)` completion_signal, `[16..20)` reserved2 = 0, `[20..24)` insts addr low,
//! `[24..28)` insts addr high, `[28..30)` num_kernargs N, `[30..32)` reserved3 = 0,
//! `[32..40)` kernarg_address -> N u64 addresses then N u64 sizes (NULL iff N = 0),
//! `[40..48)` insts_size in bytes, `[48..56)` pdi_addr, `[56..64)` pdi_patch_offset = 0
//! (full-ELF dispatch is not simulated).

use super::{
    check_dispatch_header, dispatch_operands, u32_at, u64_at, Command, DecodeCtx, PacketError,
    PacketFormat,
};
use crate::config::PacketAbi;
use crate::consts::*;

#[derive(Debug)]
pub struct B;

impl PacketFormat for B {
    fn abi(&self) -> PacketAbi {
        PacketAbi::B
    }

    fn decode(&self, slot: &[u8; PACKET_SIZE], ctx: &DecodeCtx) -> Result<Command, PacketError> {
        check_dispatch_header(slot, "B")?;
        if u64_at(slot, 56) != 0 {
            return Err(PacketError::format(
                "B: pdi_patch_offset is non-zero (full-ELF dispatch) - not supported by the simulator",
            ));
        }
        let completion_signal = u64_at(slot, 8);
        let insts_addr = (u32_at(slot, 24) as u64) << 32 | u32_at(slot, 20) as u64;
        let insts_bytes = u64_at(slot, 40);
        let pdi_addr = u64_at(slot, 48);
        if !insts_bytes.is_multiple_of(4) {
            return Err(PacketError::format(format!(
                "B: insts_size {insts_bytes} is not a multiple of 4 (it is in bytes in Gen B)"
            )));
        }
        let operands = dispatch_operands(slot, ctx, "B")?;
        Ok(Command {
            pdi_addr,
            insts_addr,
            insts_bytes,
            operands,
            completion_signal,
            insts_word_addr: None,
        })
    }

    fn completion_signal_field(&self, slot: &[u8; PACKET_SIZE]) -> u64 {
        u64_at(slot, 8)
    }

    fn ext_version_minor(&self) -> u16 {
        // HSA_AMD interface 1.21 (the newest header seen next to hsa_ext_amd_aie.h).
        21
    }
}
