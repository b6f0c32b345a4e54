//! The kernel store: NPU architectures, canonical kernel names, the precompiled and cache
//! directories and the JIT compiler protocol (architecture §8).
//!
//! Kernel files live under `<root>/<arch>/`, so the architecture is the first thing the store
//! knows about a device.

pub mod compiler;
pub mod desc;
pub mod gen_config;
pub mod kernel_dir;
pub mod record;
pub mod store;
pub mod trust;

use std::fmt;

pub use compiler::{Capabilities, Compiler};
pub use desc::{KernelDesc, Layout};
pub use store::{KernelError, KernelFiles, KernelStore};

/// An NPU architecture, as an HSA AIE agent names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// XDNA (NPU1): Phoenix, Hawk Point. 4 usable columns.
    Aie2,
    /// XDNA2 (NPU2): Strix Point, Strix Halo, Krackan. 8 columns.
    Aie2p,
}

impl Arch {
    /// The architecture of an agent called `name`, or `None` for one this backend cannot drive.
    pub fn from_agent_name(name: &str) -> Option<Arch> {
        match name {
            "aie2" => Some(Arch::Aie2),
            "aie2p" => Some(Arch::Aie2p),
            _ => None,
        }
    }

    /// The agent name, also the kernel subdirectory name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Aie2 => "aie2",
            Arch::Aie2p => "aie2p",
        }
    }

    /// Columns of the partition the IRON designs are compiled for (mlir-aie's NPU1 device uses
    /// 4 of Phoenix's 5 columns, NPU2 all 8): the `num_cols` of a kernel wrapped as an AIE
    /// hsaco, since a PDI does not record it.
    pub fn columns(self) -> u32 {
        match self {
            Arch::Aie2 => 4,
            Arch::Aie2p => 8,
        }
    }

    /// Wraps a PDI and instruction stream as an AIE hsaco: one PDI + instructions kernel called
    /// `name`, taking `n_args` buffers, in the section of this architecture.
    pub fn wrap_hsaco(
        self,
        name: &str,
        pdi: &[u8],
        insts: &[u8],
        n_args: u32,
    ) -> Result<Vec<u8>, aie_hsaco::HsacoError> {
        aie_hsaco::write_single(self.name(), name, pdi, insts, n_args, self.columns())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_round_trip() {
        for arch in [Arch::Aie2, Arch::Aie2p] {
            assert_eq!(Arch::from_agent_name(arch.name()), Some(arch));
        }
        assert_eq!(Arch::from_agent_name("aie4"), None);
        assert_eq!(Arch::from_agent_name("AIE2"), None);
        assert_eq!(Arch::Aie2p.to_string(), "aie2p");
    }
}
