//! Gen C (ROCR's `aie-hsaco` branch): the 64-byte `hsa_amd_aie_kernel_dispatch_packet_t`
//! carrying a kernel object.
//!
//! `[0..2)` header (type bits 0-7 = READY (0); barrier bit 8 and fence scopes bits 9-12
//! allowed), `[2..4)` opcode = KMQ (0), `[4..6)` count = 24, `[6]`, `[7]` reserved = 0,
//! `[8..16)` completion_signal, `[16..20)` reserved2 = 0, `[20..24)` kernel object low,
//! `[24..28)` kernel object high, `[28..30)` num_kernargs N, `[30..32)` reserved3 = 0,
//! `[32..40)` kernarg_address -> N u64 addresses then N u64 sizes (NULL iff N = 0),
//! `[40..64)` reserved4..6 = 0. The kernel object must be one a frozen, live executable handed
//! out (`HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT`); its code (PDI, instruction stream) was
//! copied into the agent's dev heap when the code object was loaded.

use super::{
    check_dispatch_header, dispatch_operands, u32_at, u64_at, Command, DecodeCtx, PacketError,
    PacketFormat,
};
use crate::config::PacketAbi;
use crate::consts::*;

#[derive(Debug)]
pub struct C;

impl PacketFormat for C {
    fn abi(&self) -> PacketAbi {
        PacketAbi::C
    }

    fn decode(&self, slot: &[u8; PACKET_SIZE], ctx: &DecodeCtx) -> Result<Command, PacketError> {
        check_dispatch_header(slot, "C")?;
        if slot[40..64].iter().any(|&b| b != 0) {
            return Err(PacketError::format(
                "C: reserved words 40..64 are not zero (a Gen B packet's insts_size/pdi_addr?)",
            ));
        }
        let completion_signal = u64_at(slot, 8);
        let kernel_object = (u32_at(slot, 24) as u64) << 32 | u32_at(slot, 20) as u64;
        if kernel_object == 0 {
            return Err(PacketError::format("C: kernel object is 0"));
        }
        let code = ctx.code.lock().kernel_code(kernel_object).ok_or_else(|| {
            PacketError::format(format!(
                "C: kernel object {kernel_object:#x} is not a kernel of a live, frozen executable"
            ))
        })?;
        let operands = dispatch_operands(slot, ctx, "C")?;
        Ok(Command {
            pdi_addr: code.pdi_addr,
            insts_addr: code.insts_addr,
            insts_bytes: code.insts_bytes,
            operands,
            completion_signal,
            insts_word_addr: None,
        })
    }

    fn completion_signal_field(&self, slot: &[u8; PACKET_SIZE]) -> u64 {
        u64_at(slot, 8)
    }

    fn ext_version_minor(&self) -> u16 {
        // No query tells Gen C from Gen B (interface 1.0 in both headers); the branch is based
        // on a ROCR reporting 1.21 like B. Clients probe by loading an AIE code object.
        21
    }
}
