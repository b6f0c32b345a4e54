//! Gen A1 (ROCR 2025-03-28 .. at least 2025-08-09): ERT packet, AmdFormat 3, no completion
//! signal (offset 48 is `reserved5`; the simulator requires it to be 0).

use super::ert::{self, ErtGen};
use super::{Command, DecodeCtx, PacketError, PacketFormat};
use crate::config::PacketAbi;
use crate::consts::*;

const GEN: ErtGen = ErtGen {
    name: "A1",
    format_byte: HSA_AMD_PACKET_TYPE_AIE_ERT,
    has_completion_signal: false,
};

#[derive(Debug)]
pub struct A1;

impl PacketFormat for A1 {
    fn abi(&self) -> PacketAbi {
        PacketAbi::A1
    }
    fn decode(&self, slot: &[u8; PACKET_SIZE], ctx: &DecodeCtx) -> Result<Command, PacketError> {
        ert::decode(&GEN, slot, ctx)
    }
    fn completion_signal_field(&self, slot: &[u8; PACKET_SIZE]) -> u64 {
        ert::completion_field(&GEN, slot)
    }
    fn ext_version_minor(&self) -> u16 {
        // HSA_AMD_INTERFACE_VERSION_MINOR of the Aug-2025 ROCR snapshot.
        11
    }
}
