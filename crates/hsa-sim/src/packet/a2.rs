//! Gen A2 (ROCR after Aug 2025): the A1 packet with `reserved5` renamed `completion_signal`
//! (offset 48); the runtime subtracts 1 from it when the packet completes.

use super::ert::{self, ErtGen};
use super::{Command, DecodeCtx, PacketError, PacketFormat};
use crate::config::PacketAbi;
use crate::consts::*;

const GEN: ErtGen = ErtGen {
    name: "A2",
    format_byte: HSA_AMD_PACKET_TYPE_AIE_ERT,
    has_completion_signal: true,
};

#[derive(Debug)]
pub struct A2;

impl PacketFormat for A2 {
    fn abi(&self) -> PacketAbi {
        PacketAbi::A2
    }
    fn decode(&self, slot: &[u8; PACKET_SIZE], ctx: &DecodeCtx) -> Result<Command, PacketError> {
        ert::decode(&GEN, slot, ctx)
    }
    fn completion_signal_field(&self, slot: &[u8; PACKET_SIZE]) -> u64 {
        ert::completion_field(&GEN, slot)
    }
    fn ext_version_minor(&self) -> u16 {
        // Not documented for the real A2 window (between 11 and 20); the simulator's choice.
        12
    }
}
