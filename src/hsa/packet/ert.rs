//! The ERT START_CU packet and payload shared by generations A1, A2 and A3.
//!
//! Payload (host memory the packet points to): the PDI address (u64), then u32 words
//! `3, 0, insts_lo, insts_hi, insts_dwords, (addr_lo, addr_hi) * N, size * N`. The packet's `count`
//! is `3 + 3N`: the words after the first two, from which ROCR derives N as `count / 3 - 1`.

use super::{Dispatch, EncodeError, PacketAbi, PacketFormat};
use crate::hsa::sys::*;

/// An ERT generation: what differs between A1, A2 and A3.
#[derive(Debug)]
pub(super) struct ErtFormat {
    pub abi: PacketAbi,
    /// The vendor header's `AmdFormat` byte.
    pub format_byte: u8,
    /// Whether offset 48 is a completion signal the runtime decrements (else it must be 0).
    pub completion_signal: bool,
}

impl PacketFormat for ErtFormat {
    fn abi(&self) -> PacketAbi {
        self.abi
    }

    fn args_bytes(&self, operands: usize) -> usize {
        payload_bytes(operands)
    }

    fn signals_completion(&self) -> bool {
        self.completion_signal
    }

    fn encode(
        &self,
        dispatch: &Dispatch<'_>,
        args: &mut [u8],
        args_addr: u64,
        completion: hsa_signal_t,
    ) -> Result<[u8; 64], EncodeError> {
        let signal = if self.completion_signal {
            completion.handle
        } else {
            0
        };
        encode(dispatch, args, args_addr, self.format_byte, signal)
    }
}

/// The most operands one packet can carry: `count` is an 11-bit field.
pub(super) const MAX_OPERANDS: usize = (0x7FF - 3) / 3;

/// Payload bytes for `n` operands.
pub(super) fn payload_bytes(n: usize) -> usize {
    8 + 4 * (5 + 3 * n)
}

/// Writes the START_CU payload for `d` into `args` and returns the ERT packet pointing at it.
fn encode(
    d: &Dispatch<'_>,
    args: &mut [u8],
    args_addr: u64,
    format: u8,
    completion: u64,
) -> Result<[u8; 64], EncodeError> {
    let n = d.operands.len();
    if n > MAX_OPERANDS {
        return Err(EncodeError::TooManyOperands(n, MAX_OPERANDS));
    }
    if !d.insts_bytes.is_multiple_of(4) {
        return Err(EncodeError::UnalignedInstructions(d.insts_bytes));
    }
    let need = payload_bytes(n);
    if args.len() < need {
        return Err(EncodeError::ArgsTooSmall {
            got: args.len(),
            need,
        });
    }
    let mut words: Vec<u32> = Vec::with_capacity(5 + 3 * n);
    words.extend([
        3,
        0,
        d.insts_addr as u32,
        (d.insts_addr >> 32) as u32,
        u32::try_from(d.insts_bytes / 4)
            .map_err(|_| EncodeError::UnalignedInstructions(d.insts_bytes))?,
    ]);
    for op in d.operands {
        words.extend([op.addr as u32, (op.addr >> 32) as u32]);
    }
    for (index, op) in d.operands.iter().enumerate() {
        words.push(
            u32::try_from(op.size).map_err(|_| EncodeError::OperandTooLarge {
                index,
                size: op.size,
            })?,
        );
    }
    args[..8].copy_from_slice(&d.pdi_addr.to_le_bytes());
    for (i, w) in words.iter().enumerate() {
        args[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
    }

    let packet = hsa_amd_aie_ert_packet_t {
        header: hsa_amd_vendor_packet_header_t {
            header: 0,
            amd_format: format,
            reserved: 0,
        },
        ert: ert_word(
            HSA_AMD_AIE_ERT_STATE_NEW,
            3 + 3 * n as u32,
            HSA_AMD_AIE_ERT_START_CU,
        ),
        completion_signal: completion,
        payload_data: args_addr,
        ..Default::default()
    };
    Ok(to_bytes(&packet))
}

fn to_bytes(p: &hsa_amd_aie_ert_packet_t) -> [u8; 64] {
    let mut out = [0u8; 64];
    out[0..2].copy_from_slice(&p.header.header.to_le_bytes());
    out[2] = p.header.amd_format;
    out[3] = p.header.reserved;
    out[4..8].copy_from_slice(&p.ert.to_le_bytes());
    out[48..56].copy_from_slice(&p.completion_signal.to_le_bytes());
    out[56..64].copy_from_slice(&p.payload_data.to_le_bytes());
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::Operand;
    use super::*;

    pub fn dispatch(operands: &[Operand]) -> Dispatch<'_> {
        Dispatch {
            kernel_object: 0,
            pdi_addr: 0x1111_2222_3333_4000,
            insts_addr: 0xAAAA_BBBB_CCCC_D000,
            insts_bytes: 64,
            operands,
        }
    }

    pub fn word(args: &[u8], i: usize) -> u32 {
        u32::from_le_bytes(args[8 + 4 * i..12 + 4 * i].try_into().unwrap())
    }

    #[test]
    fn payload_layout_for_three_operands() {
        let ops = [
            Operand {
                addr: 0x10_0000_1000,
                size: 4096,
            },
            Operand {
                addr: 0x10_0000_2000,
                size: 4096,
            },
            Operand {
                addr: 0x10_0000_3000,
                size: 2048,
            },
        ];
        let mut args = vec![0xEEu8; payload_bytes(3)];
        let packet = encode(&dispatch(&ops), &mut args, 0x7000, 3, 0).unwrap();
        assert_eq!(
            u64::from_le_bytes(args[..8].try_into().unwrap()),
            0x1111_2222_3333_4000
        );
        let words: Vec<u32> = (0..14).map(|i| word(&args, i)).collect();
        assert_eq!(
            words,
            [
                3,
                0,
                0xCCCC_D000,
                0xAAAA_BBBB,
                16,
                0x1000,
                0x10,
                0x2000,
                0x10,
                0x3000,
                0x10,
                4096,
                4096,
                2048
            ]
        );
        assert_eq!(&packet[0..4], &[0, 0, 3, 0]);
        let ert = u32::from_le_bytes(packet[4..8].try_into().unwrap());
        assert_eq!(ert & 0xF, HSA_AMD_AIE_ERT_STATE_NEW);
        assert_eq!((ert >> 12) & 0x7FF, 12, "count = 3 + 3N");
        assert_eq!((ert >> 23) & 0x1F, HSA_AMD_AIE_ERT_START_CU);
        assert_eq!(
            u64::from_le_bytes(packet[56..64].try_into().unwrap()),
            0x7000
        );
    }

    #[test]
    fn generations_differ_in_format_byte_and_completion_signal() {
        let ops = [Operand {
            addr: 0x1000,
            size: 64,
        }];
        let signal = hsa_signal_t { handle: 0x55 };
        for (abi, format, completion) in [
            (PacketAbi::A1, 3u8, 0u64),
            (PacketAbi::A2, 3, 0x55),
            (PacketAbi::A3, 200, 0x55),
        ] {
            let f = abi.format();
            let mut args = vec![0u8; f.args_bytes(1)];
            let p = f
                .encode(&dispatch(&ops), &mut args, 0x7000, signal)
                .unwrap();
            assert_eq!(p[2], format, "{abi}");
            assert_eq!(
                u64::from_le_bytes(p[48..56].try_into().unwrap()),
                completion,
                "{abi}"
            );
            assert_eq!(f.signals_completion(), completion != 0, "{abi}");
        }
    }

    #[test]
    fn rejects_what_the_packet_cannot_carry() {
        let mut args = vec![0u8; 4096];
        let mut d = dispatch(&[]);
        d.insts_bytes = 6;
        assert_eq!(
            encode(&d, &mut args, 0, 3, 0),
            Err(EncodeError::UnalignedInstructions(6))
        );
        let big = [Operand {
            addr: 0,
            size: 1 << 33,
        }];
        assert!(matches!(
            encode(&dispatch(&big), &mut args, 0, 3, 0),
            Err(EncodeError::OperandTooLarge { index: 0, .. })
        ));
        let mut small = vec![0u8; 8];
        assert!(matches!(
            encode(&dispatch(&big), &mut small, 0, 3, 0),
            Err(EncodeError::ArgsTooSmall { .. })
        ));
    }
}
