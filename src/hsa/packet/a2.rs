//! Generation A2: the A1 packet whose offset 48 is a completion signal the runtime decrements
//! when the packet completes.

use super::ert::ErtFormat;
use super::PacketAbi;
use crate::hsa::sys::HSA_AMD_PACKET_TYPE_AIE_ERT;

pub(super) static A2: ErtFormat = ErtFormat {
    abi: PacketAbi::A2,
    format_byte: HSA_AMD_PACKET_TYPE_AIE_ERT,
    completion_signal: true,
};
