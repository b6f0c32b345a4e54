//! Generation B (ROCR with `hsa_ext_amd_aie.h` 1.0): the 64-byte AIE kernel-dispatch packet. The
//! instruction stream, PDI and a kernarg array are named in the packet itself; the kernarg array
//! holds the N operand addresses followed by their N sizes, as u64. The instruction size is in
//! bytes, and the runtime decrements the completion signal at offset 8.

use super::{Dispatch, EncodeError, PacketAbi, PacketFormat};
use crate::hsa::sys::*;

#[derive(Debug)]
pub(super) struct KernelDispatch;

pub(super) static B: KernelDispatch = KernelDispatch;

impl PacketFormat for KernelDispatch {
    fn abi(&self) -> PacketAbi {
        PacketAbi::B
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
        let n = d.operands.len();
        let num_kernargs = u16::try_from(n).map_err(|_| EncodeError::TooManyOperands(n, 65535))?;
        if !d.insts_bytes.is_multiple_of(4) {
            return Err(EncodeError::UnalignedInstructions(d.insts_bytes));
        }
        write_kernargs(d, args)?;
        let p = hsa_amd_aie_kernel_dispatch_packet_t {
            header: HSA_AMD_AIE_DISPATCH_HEADER,
            opcode: HSA_AMD_AIE_PACKET_OPCODE_KMQ,
            count: HSA_AMD_AIE_DISPATCH_COUNT,
            completion_signal: completion,
            insts_addr_low: d.insts_addr as u32,
            insts_addr_high: (d.insts_addr >> 32) as u32,
            num_kernargs,
            kernarg_address: if n == 0 { 0 } else { args_addr },
            insts_size: d.insts_bytes,
            pdi_addr: d.pdi_addr,
            ..Default::default()
        };
        Ok(packet_bytes(&p))
    }
}

/// The kernarg array of a 64-byte dispatch packet (generations b and c): the operand addresses,
/// then their sizes, as u64.
pub(super) fn write_kernargs(d: &Dispatch<'_>, args: &mut [u8]) -> Result<(), EncodeError> {
    let n = d.operands.len();
    let need = 16 * n;
    if args.len() < need {
        return Err(EncodeError::ArgsTooSmall {
            got: args.len(),
            need,
        });
    }
    for (i, op) in d.operands.iter().enumerate() {
        args[8 * i..8 * i + 8].copy_from_slice(&op.addr.to_le_bytes());
        args[8 * (n + i)..8 * (n + i) + 8].copy_from_slice(&op.size.to_le_bytes());
    }
    Ok(())
}

/// The 64 bytes of a dispatch packet; the reserved bytes (6, 7, 16..20, 30..32, 56..64) stay zero.
pub(super) fn packet_bytes(p: &hsa_amd_aie_kernel_dispatch_packet_t) -> [u8; 64] {
    let mut out = [0u8; 64];
    out[0..2].copy_from_slice(&p.header.to_le_bytes());
    out[2..4].copy_from_slice(&p.opcode.to_le_bytes());
    out[4..6].copy_from_slice(&p.count.to_le_bytes());
    out[8..16].copy_from_slice(&p.completion_signal.handle.to_le_bytes());
    out[20..24].copy_from_slice(&p.insts_addr_low.to_le_bytes());
    out[24..28].copy_from_slice(&p.insts_addr_high.to_le_bytes());
    out[28..30].copy_from_slice(&p.num_kernargs.to_le_bytes());
    out[32..40].copy_from_slice(&p.kernarg_address.to_le_bytes());
    out[40..48].copy_from_slice(&p.insts_size.to_le_bytes());
    out[48..56].copy_from_slice(&p.pdi_addr.to_le_bytes());
    out
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
        let p = B
            .encode(
                &dispatch(&ops),
                &mut args,
                0x9000,
                hsa_signal_t { handle: 77 },
            )
            .unwrap();
        assert_eq!(u16::from_le_bytes([p[0], p[1]]), 0x1400);
        assert_eq!(u16::from_le_bytes([p[4], p[5]]), 24);
        assert_eq!(u64_at(&p, 8), 77);
        assert_eq!(
            u32::from_le_bytes(p[20..24].try_into().unwrap()),
            0xCCCC_D000
        );
        assert_eq!(
            u32::from_le_bytes(p[24..28].try_into().unwrap()),
            0xAAAA_BBBB
        );
        assert_eq!(u16::from_le_bytes([p[28], p[29]]), 2);
        assert_eq!(u64_at(&p, 32), 0x9000);
        assert_eq!(u64_at(&p, 40), 64, "instruction size in bytes");
        assert_eq!(u64_at(&p, 48), 0x1111_2222_3333_4000);
        assert_eq!(
            [0, 8, 16, 24].map(|o| u64_at(&args, o)),
            [0x5000, 0x6000, 100, 200]
        );
    }
}
