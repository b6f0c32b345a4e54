//! AIE dispatch packets. ROCR's packet ABI for AIE agents has changed several times without a way
//! to query it, so each generation is its own module behind one trait, [`PacketFormat`], and the
//! backend chooses one explicitly (`GGML_HSA_PACKET_ABI`).
//!
//! | ABI | packet | format byte | completion signal | instruction size |
//! |---|---|---|---|---|
//! | `a1` | ERT (`hsa_amd_aie_ert_packet_t`) + START_CU payload | 3 | none | dwords |
//! | `a2` | same | 3 | at offset 48 | dwords |
//! | `a3` | same | 200 | at offset 48 | dwords |
//! | `b` | 64-byte AIE kernel dispatch + kernarg array | header READY, opcode KMQ, count 24 | at offset 8 | bytes |
//! | `c` | the same packet naming a kernel object (from an AIE hsaco loaded into an executable) | header READY, opcode KMQ, count 24 | at offset 8 | none (in the code object) |
//!
//! ROCR rewrites part of an ERT payload while submitting it, so the argument memory is filled anew
//! for every dispatch; nothing here keeps it between dispatches.

mod a1;
mod a2;
mod a3;
mod b;
mod c;
mod ert;

use std::fmt;
use std::str::FromStr;

use super::sys::hsa_signal_t;

/// One generation of ROCR's AIE packet ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketAbi {
    A1,
    A2,
    A3,
    B,
    C,
}

impl PacketAbi {
    pub const ALL: [PacketAbi; 5] = [
        PacketAbi::A1,
        PacketAbi::A2,
        PacketAbi::A3,
        PacketAbi::B,
        PacketAbi::C,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PacketAbi::A1 => "a1",
            PacketAbi::A2 => "a2",
            PacketAbi::A3 => "a3",
            PacketAbi::B => "b",
            PacketAbi::C => "c",
        }
    }

    /// The generation `auto` picks for a runtime reporting `HSA_AMD_INTERFACE_VERSION_MINOR` =
    /// `minor` (`None`: the runtime does not report it). The runtime has no query for its AIE
    /// packet ABI; this mapping is inferred from the ROCR versions studied (minor 11 spoke A1, 20
    /// A3, 21 the 64-byte dispatch packet B; A2 lies between 11 and 20) and is documented as such:
    ///
    /// | minor | ABI |
    /// |---|---|
    /// | unknown or ≤ 11 | `a1` |
    /// | 12 to 19 | `a2` |
    /// | 20 | `a3` |
    /// | ≥ 21 | `b` |
    ///
    /// Generation c reports the same version as b (no query tells them apart); `auto` finds it
    /// by loading a tiny AIE code object ([`crate::hsa::Runtime::probe_code_objects`]).
    pub fn from_interface_minor(minor: Option<u16>) -> PacketAbi {
        match minor {
            None | Some(0..=11) => PacketAbi::A1,
            Some(12..=19) => PacketAbi::A2,
            Some(20) => PacketAbi::A3,
            Some(_) => PacketAbi::B,
        }
    }

    /// The encoder of this generation.
    pub fn format(self) -> &'static dyn PacketFormat {
        match self {
            PacketAbi::A1 => &a1::A1,
            PacketAbi::A2 => &a2::A2,
            PacketAbi::A3 => &a3::A3,
            PacketAbi::B => &b::B,
            PacketAbi::C => &c::C,
        }
    }
}

impl fmt::Display for PacketAbi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PacketAbi {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PacketAbi::ALL
            .into_iter()
            .find(|abi| abi.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown packet ABI {s:?} (expected auto, a1, a2, a3, b or c)"))
    }
}

/// A buffer the kernel reads or writes: its device-visible address and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub addr: u64,
    pub size: u64,
}

/// One kernel launch: the PDI and instruction stream (both in the dev heap; generations a1..b)
/// or the kernel object (generation c), and the operands, inputs first, output last.
#[derive(Debug, Clone, Copy)]
pub struct Dispatch<'a> {
    /// Generation c: `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT` of the kernel (0 otherwise).
    pub kernel_object: u64,
    pub pdi_addr: u64,
    pub insts_addr: u64,
    /// Size of the instruction stream in bytes (a multiple of 4).
    pub insts_bytes: u64,
    pub operands: &'a [Operand],
}

/// Why a dispatch cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("the instruction stream is {0} bytes, not a multiple of 4")]
    UnalignedInstructions(u64),
    #[error("{0} operands do not fit one packet (at most {1})")]
    TooManyOperands(usize, usize),
    #[error("operand {index} is {size} bytes; this packet ABI carries sizes in 32 bits")]
    OperandTooLarge { index: usize, size: u64 },
    #[error("packet ABI {0} needs a kernel object; the kernel was not loaded as a code object")]
    NoKernelObject(PacketAbi),
    #[error("argument memory of {got} bytes is smaller than the {need} bytes required")]
    ArgsTooSmall { got: usize, need: usize },
}

/// An encoder for one packet generation.
pub trait PacketFormat: Sync + fmt::Debug {
    fn abi(&self) -> PacketAbi;

    /// Bytes of per-dispatch argument memory (ERT payload or kernarg array) for `operands`.
    fn args_bytes(&self, operands: usize) -> usize;

    /// Whether the runtime decrements the packet's completion signal when it completes.
    fn signals_completion(&self) -> bool;

    /// Fills `args` (host memory at device address `args_addr`, from the kernarg pool) and returns
    /// the 64-byte packet to write into the queue ring.
    fn encode(
        &self,
        dispatch: &Dispatch<'_>,
        args: &mut [u8],
        args_addr: u64,
        completion: hsa_signal_t,
    ) -> Result<[u8; 64], EncodeError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_in_any_case() {
        for abi in PacketAbi::ALL {
            assert_eq!(abi.name().parse::<PacketAbi>(), Ok(abi));
            assert_eq!(abi.name().to_uppercase().parse::<PacketAbi>(), Ok(abi));
            assert_eq!(abi.format().abi(), abi);
        }
        assert!("d".parse::<PacketAbi>().unwrap_err().contains("\"d\""));
    }

    #[test]
    fn auto_maps_the_interface_version() {
        let pick = PacketAbi::from_interface_minor;
        assert_eq!(pick(None), PacketAbi::A1);
        assert_eq!(pick(Some(11)), PacketAbi::A1);
        assert_eq!(pick(Some(12)), PacketAbi::A2);
        assert_eq!(pick(Some(20)), PacketAbi::A3);
        assert_eq!(pick(Some(21)), PacketAbi::B);
        assert_eq!(pick(Some(30)), PacketAbi::B);
    }
}
