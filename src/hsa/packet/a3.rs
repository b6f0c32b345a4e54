//! Generation A3 (ROCR's AMD interface 1.20): the A2 packet with format byte 200; the value 3
//! now names another packet type, so an A1/A2 packet is rejected by these runtimes.

use super::ert::ErtFormat;
use super::PacketAbi;
use crate::hsa::sys::HSA_AMD_PACKET_TYPE_AIE_ERT_A3;

pub(super) static A3: ErtFormat = ErtFormat {
    abi: PacketAbi::A3,
    format_byte: HSA_AMD_PACKET_TYPE_AIE_ERT_A3,
    completion_signal: true,
};
