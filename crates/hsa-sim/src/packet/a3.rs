//! Gen A3 (ROCR 359c7b06, HSA_AMD interface 1.20): the A2 packet with AmdFormat 200
//! (`HSA_AMD_PACKET_TYPE_RESERVED200`); 3 now means EXT_KERNEL_DISPATCH and is refused.

use super::ert::{self, ErtGen};
use super::{Command, DecodeCtx, PacketError, PacketFormat};
use crate::config::PacketAbi;
use crate::consts::*;

const GEN: ErtGen = ErtGen {
    name: "A3",
    format_byte: HSA_AMD_PACKET_TYPE_RESERVED200,
    has_completion_signal: true,
};

#[derive(Debug)]
pub struct A3;

impl PacketFormat for A3 {
    fn abi(&self) -> PacketAbi {
        PacketAbi::A3
    }
    fn decode(&self, slot: &[u8; PACKET_SIZE], ctx: &DecodeCtx) -> Result<Command, PacketError> {
        ert::decode(&GEN, slot, ctx)
    }
    fn completion_signal_field(&self, slot: &[u8; PACKET_SIZE]) -> u64 {
        ert::completion_field(&GEN, slot)
    }
    fn ext_version_minor(&self) -> u16 {
        20
    }
}
