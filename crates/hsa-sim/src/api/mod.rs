//! The exported C ABI. Every function catches panics (a panic becomes `HSA_STATUS_ERROR`, or a
//! neutral value for functions without a status) and validates its arguments with ROCR's codes.

mod agent;
mod code_object;
mod init;
mod memory;
mod queue;
mod signal;

pub use agent::*;
pub use code_object::*;
pub use init::*;
pub use memory::*;
pub use queue::*;
pub use signal::*;

use crate::consts::*;
use crate::runtime::{self, Runtime};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `hsa_agent_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HsaAgent {
    pub handle: u64,
}

/// `hsa_signal_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HsaSignal {
    pub handle: u64,
}

/// `hsa_amd_memory_pool_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HsaPool {
    pub handle: u64,
}

/// Runs `f`, turning a panic into `fallback`.
pub(crate) fn guard<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Runs `f` with the live runtime; NOT_INITIALIZED without one; a panic is HSA_STATUS_ERROR.
pub(crate) fn with_rt(f: impl FnOnce(&Runtime) -> Status) -> Status {
    guard(HSA_STATUS_ERROR, || match runtime::get() {
        Some(rt) => f(&rt),
        None => HSA_STATUS_ERROR_NOT_INITIALIZED,
    })
}

/// Hands each handle to the client's iteration callback, as `hsa_iterate_agents` and
/// `hsa_amd_agent_iterate_memory_pools` do: a status other than SUCCESS stops the walk and is
/// returned.
///
/// # Safety
/// `cb` must be the client's callback of that signature and `data` its user pointer.
pub(crate) unsafe fn visit_each<H>(
    handles: Vec<u64>,
    wrap: fn(u64) -> H,
    cb: unsafe extern "C" fn(H, *mut c_void) -> Status,
    data: *mut c_void,
) -> Status {
    for h in handles {
        // SAFETY: guaranteed by the caller; no runtime lock is held while the callback runs.
        let s = unsafe { cb(wrap(h), data) };
        if s != HSA_STATUS_SUCCESS {
            return s;
        }
    }
    HSA_STATUS_SUCCESS
}

/// Writes `v` to the client's attribute storage.
///
/// # Safety
/// `value` must be non-null and point to writable storage of at least `size_of::<T>()` bytes.
pub(crate) unsafe fn put<T: Copy>(value: *mut c_void, v: T) {
    // SAFETY: guaranteed by the caller; write_unaligned imposes no alignment requirement.
    unsafe { (value as *mut T).write_unaligned(v) }
}

/// Writes a NUL-terminated string of at most `cap - 1` bytes, zero-filling the rest of `cap`.
///
/// # Safety
/// `value` must be non-null and point to `cap` writable bytes.
pub(crate) unsafe fn put_str(value: *mut c_void, s: &str, cap: usize) {
    let n = s.len().min(cap - 1);
    // SAFETY: the caller guarantees `cap` writable bytes at `value`; n < cap.
    unsafe {
        std::ptr::write_bytes(value as *mut u8, 0, cap);
        std::ptr::copy_nonoverlapping(s.as_ptr(), value as *mut u8, n);
    }
}
