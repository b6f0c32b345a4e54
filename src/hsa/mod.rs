//! The HSA runtime (`libhsa-runtime64`), loaded at run time with libloading. The only module
//! besides `ffi` that contains unsafe code: it calls the runtime's C functions.
//!
//! * [`sys`]: types and constants from the documented ABI.
//! * [`api`]: the symbol table (required and optional functions).
//! * [`loader`]: where the library is searched for.
//! * [`packet`]: the AIE dispatch packet generations, one module each.
//! * [`executable`]: AIE code objects loaded into executables (packet ABI c).
//! * [`runtime`]: the process-wide runtime and agent discovery.
//! * [`status`], [`error`]: status names and typed errors.

pub mod api;
pub mod error;
pub mod executable;
pub mod loader;
pub mod memory;
pub mod packet;
pub mod queue;
#[cfg(ggml_hsa_rocr_abi_check)]
mod rocr_abi_check;
pub mod runtime;
pub mod signal;
pub mod status;
pub mod sys;

pub use error::HsaError;
pub use runtime::{AgentDesc, Runtime};
