//! The `hsa_amd_aie_ert_packet_t` family (Gen A1, A2, A3) and its START_CU payload.
//!
//! Packet (64 bytes): `[0..2)` header u16 = 0, `[2]` AmdFormat (3 for A1/A2, 200 for A3),
//! `[3]` reserved = 0, `[4..8)` ERT word (state bits 0-3 = NEW, custom 4-11, count 12-22,
//! opcode 23-27 = START_CU, type 28-31), `[8..48)` reserved0..4, `[48..56)` reserved5 (A1) or
//! completion_signal (A2/A3), `[56..64)` payload address.
//!
//! Payload: `pdi_addr` u64, then `data[]` u32: `[0]` = 3, `[1]` = 0, `[2..4)` instruction VA
//! lo/hi, `[4]` instruction size in dwords, `[5+2i, 6+2i]` operand i VA lo/hi, `[5+2N+i]` operand
//! i size in bytes; packet count = 3 + 3N (data dwords after the two opcode dwords).

use super::{u32_at, u64_at, Command, DecodeCtx, Operand, PacketError};
use crate::consts::*;

#[derive(Clone, Copy, Debug)]
pub struct ErtGen {
    pub name: &'static str,
    pub format_byte: u8,
    pub has_completion_signal: bool,
}

pub fn completion_field(gen: &ErtGen, slot: &[u8; PACKET_SIZE]) -> u64 {
    if gen.has_completion_signal {
        u64_at(slot, 48)
    } else {
        0
    }
}

pub fn decode(
    gen: &ErtGen,
    slot: &[u8; PACKET_SIZE],
    ctx: &DecodeCtx,
) -> Result<Command, PacketError> {
    let g = gen.name;
    let header = u16_at16(slot);
    let format = slot[2];
    if header as u8 == HSA_PACKET_TYPE_INVALID && format == 0 {
        return Err(PacketError::format(format!(
            "{g}: slot holds an INVALID packet (header 1): the client rang the doorbell before writing it"
        )));
    }
    if format != gen.format_byte {
        let hint = match format {
            HSA_AMD_PACKET_TYPE_AIE_ERT => " (format 3 = AIE_ERT of ROCR A1/A2 headers)",
            HSA_AMD_PACKET_TYPE_RESERVED200 => " (format 200 = AIE ERT of ROCR A3 headers)",
            0 => " (looks like a Gen B kernel-dispatch packet: opcode KMQ at byte 2)",
            _ => "",
        };
        return Err(PacketError::format(format!(
            "{g}: AmdFormat byte is {format}{hint}, this runtime expects {} for AIE ERT packets",
            gen.format_byte
        )));
    }
    if header != 0 {
        return Err(PacketError::format(format!(
            "{g}: vendor header u16 is {header:#06x}, ROCR requires 0 for AIE ERT packets \
             (fence/barrier bits belong to Gen B packets)"
        )));
    }
    if slot[3] != 0 {
        return Err(PacketError::format(format!(
            "{g}: reserved header byte is {}",
            slot[3]
        )));
    }
    let ert = u32_at(slot, 4);
    let state = ert & 0xF;
    let count = (ert >> 12) & 0x7FF;
    let opcode = (ert >> 23) & 0x1F;
    if opcode != HSA_AMD_AIE_ERT_START_CU {
        let what = if opcode == HSA_AMD_AIE_ERT_CMD_CHAIN {
            " (CMD_CHAIN is built by the runtime, never by clients)"
        } else {
            ""
        };
        return Err(PacketError::format(format!(
            "{g}: ERT opcode {opcode}{what}; only START_CU (0) is accepted (real ROCR loops forever on other opcodes)"
        )));
    }
    if state != HSA_AMD_AIE_ERT_STATE_NEW {
        return Err(PacketError::format(format!(
            "{g}: ERT state {state}, expected NEW (1)"
        )));
    }
    for (i, off) in [8usize, 16, 24, 32, 40].iter().enumerate() {
        if u64_at(slot, *off) != 0 {
            return Err(PacketError::format(format!(
                "{g}: reserved{i} (offset {off}) is not zero"
            )));
        }
    }
    let completion_signal = if gen.has_completion_signal {
        u64_at(slot, 48)
    } else {
        if u64_at(slot, 48) != 0 {
            return Err(PacketError::format(format!(
                "{g}: offset 48 is reserved5 in this ROCR and must be 0; a completion signal there \
                 needs an A2/A3 runtime and would never be signalled here"
            )));
        }
        0
    };
    if count < 6 || !count.is_multiple_of(3) {
        return Err(PacketError::format(format!(
            "{g}: count {count} is not 3 + 3N with N >= 1 operands (count excludes the two opcode dwords)"
        )));
    }
    let n = (count / 3 - 1) as usize;
    let payload_addr = u64_at(slot, 56);
    if payload_addr == 0 {
        return Err(PacketError::format(format!("{g}: payload_data is NULL")));
    }
    let data_words = count as usize + 2;
    let payload = ctx.read_aie("START_CU payload", payload_addr, 8 + 4 * data_words)?;
    let data = |i: usize| u32_at(&payload, 8 + 4 * i);
    let pdi_addr = u64_at(&payload, 0);
    if data(0) != 3 || data(1) != 0 {
        return Err(PacketError::format(format!(
            "{g}: payload data[0..2] = [{}, {}], expected [3, 0] (transaction opcode)",
            data(0),
            data(1)
        )));
    }
    let insts_addr = (data(3) as u64) << 32 | data(2) as u64;
    let insts_bytes = data(4) as u64 * 4;
    let operands = (0..n)
        .map(|i| Operand {
            addr: (data(6 + 2 * i) as u64) << 32 | data(5 + 2 * i) as u64,
            size: data(5 + 2 * n + i) as u64,
        })
        .collect();
    Ok(Command {
        pdi_addr,
        insts_addr,
        insts_bytes,
        operands,
        completion_signal,
        insts_word_addr: Some(payload_addr as usize + 8 + 4 * 2),
    })
}

fn u16_at16(slot: &[u8; PACKET_SIZE]) -> u16 {
    super::u16_at(slot, 0)
}
