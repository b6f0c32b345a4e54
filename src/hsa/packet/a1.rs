//! Generation A1 (ROCR from 2025-03-28): the ERT packet with format byte 3 and no completion
//! signal (offset 48 is reserved and stays 0). Such runtimes do not report a failed dispatch; the
//! backend checks the queue's read index after the doorbell instead.

use super::ert::ErtFormat;
use super::PacketAbi;
use crate::hsa::sys::HSA_AMD_PACKET_TYPE_AIE_ERT;

pub(super) static A1: ErtFormat = ErtFormat {
    abi: PacketAbi::A1,
    format_byte: HSA_AMD_PACKET_TYPE_AIE_ERT,
    completion_signal: false,
};
