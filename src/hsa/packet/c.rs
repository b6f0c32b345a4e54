//! Generation c (ROCR with the AIE hsaco loader): the 64-byte AIE kernel-dispatch packet of
//! generation b, with the kernel object of a loaded code object where b has the instruction
//! stream address, and zeros where b has the instruction size and the PDI address. The kernarg
//! array is as in b: the N operand addresses, then their N sizes, as u64; the runtime
//! decrements the completion signal at offset 8 for every packet that ran.

use super::b::{packet_bytes, write_kernargs};
use super::{Dispatch, EncodeError, PacketAbi, PacketFormat};
use crate::hsa::sys::*;

#[derive(Debug)]
pub(super) struct KernelObjectDispatch;

pub(super) static C: KernelObjectDispatch = KernelObjectDispatch;

impl PacketFormat for KernelObjectDispatch {
    fn abi(&self) -> PacketAbi {
        PacketAbi::C
    }

    fn args_bytes(&self, operands: usize) -> usize {
        16 * operands
    }

    fn signals_completion(&self) -> bool {
        true
    }

    fn encode(
        &self,
        d: &Dispatch<'_>,
        args: &mut [u8],
        args_addr: u64,
        completion: hsa_signal_t,
    ) -> Result<[u8; 64], EncodeError> {
        if d.kernel_object == 0 {
            return Err(EncodeError::NoKernelObject(PacketAbi::C));
        }
        let n = d.operands.len();
        let num_kernargs = u16::try_from(n).map_err(|_| EncodeError::TooManyOperands(n, 65535))?;
        write_kernargs(d, args)?;
        // The kernel object where generation b has the instruction stream address; zeros where
        // it has the instruction size and the PDI address.
        Ok(packet_bytes(&hsa_amd_aie_kernel_dispatch_packet_t {
            header: HSA_AMD_AIE_DISPATCH_HEADER,
            opcode: HSA_AMD_AIE_PACKET_OPCODE_KMQ,
            count: HSA_AMD_AIE_DISPATCH_COUNT,
            completion_signal: completion,
            insts_addr_low: d.kernel_object as u32,
            insts_addr_high: (d.kernel_object >> 32) as u32,
            num_kernargs,
            kernarg_address: if n == 0 { 0 } else { args_addr },
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::ert::tests::dispatch;
    use super::super::Operand;
    use super::*;

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    #[test]
    fn packet_and_kernargs() {
        let ops = [
            Operand {
                addr: 0x5000,
                size: 100,
            },
            Operand {
                addr: 0x6000,
                size: 200,
            },
        ];
        let mut args = vec![0u8; 32];
        let mut d = dispatch(&ops);
        assert_eq!(
            C.encode(&d, &mut args, 0x9000, hsa_signal_t { handle: 77 }),
            Err(EncodeError::NoKernelObject(PacketAbi::C))
        );
        d.kernel_object = 0x7766_5544_3322_1100;
        let p = C
            .encode(&d, &mut args, 0x9000, hsa_signal_t { handle: 77 })
            .unwrap();
        assert_eq!(u32::from_le_bytes(p[0..4].try_into().unwrap()), 0x1400);
        assert_eq!(u16::from_le_bytes([p[4], p[5]]), 24);
        assert_eq!(u64_at(&p, 8), 77);
        assert_eq!(u64_at(&p, 16) >> 32, 0x3322_1100);
        assert_eq!(
            u32::from_le_bytes(p[24..28].try_into().unwrap()),
            0x7766_5544
        );
        assert_eq!(u16::from_le_bytes([p[28], p[29]]), 2);
        assert_eq!(u64_at(&p, 32), 0x9000);
        assert!(p[40..64].iter().all(|&b| b == 0), "reserved words are zero");
        assert!(p[6..8]
            .iter()
            .chain(&p[16..20])
            .chain(&p[30..32])
            .all(|&b| b == 0));
        assert_eq!(
            [0, 8, 16, 24].map(|o| u64_at(&args, o)),
            [0x5000, 0x6000, 100, 200]
        );
    }
}
