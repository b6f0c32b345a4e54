//! Fault injection (`HSA_SIM_FAIL_ALLOC`, `HSA_SIM_FAIL_DISPATCH`, `HSA_SIM_HANG_DISPATCH`,
//! `HSA_SIM_ERROR_STATE`; `HSA_SIM_FAIL_INIT` is handled by `hsa_init`). Every N is 1-based and
//! counted from the `hsa_init` that created the runtime instance.

use crate::config::Config;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Faults {
    allocs: AtomicU64,
    dispatches: AtomicU64,
    doorbells: AtomicU64,
}

/// What happens to one START_CU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchFault {
    None,
    /// Report an error for this packet (HSA_SIM_FAIL_DISPATCH).
    Fail,
    /// Never complete this packet (HSA_SIM_HANG_DISPATCH).
    Hang,
}

impl Faults {
    /// Counts one client allocation; true if it is the one to fail.
    pub fn alloc_fails(&self, cfg: &Config) -> bool {
        let n = self.allocs.fetch_add(1, Ordering::Relaxed) + 1;
        cfg.fail_alloc == Some(n)
    }

    /// Counts one START_CU that reached the device.
    pub fn next_dispatch(&self, cfg: &Config) -> DispatchFault {
        let n = self.dispatches.fetch_add(1, Ordering::Relaxed) + 1;
        if cfg.hang_dispatch == Some(n) {
            DispatchFault::Hang
        } else if cfg.fail_dispatch == Some(n) {
            DispatchFault::Fail
        } else {
            DispatchFault::None
        }
    }

    /// Counts one doorbell; true if this doorbell puts its queue into the error state.
    pub fn doorbell_enters_error_state(&self, cfg: &Config) -> bool {
        let n = self.doorbells.fetch_add(1, Ordering::Relaxed) + 1;
        cfg.error_state == Some(n)
    }
}
