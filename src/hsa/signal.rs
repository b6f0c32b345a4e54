//! RAII HSA signals with bounded waits.

use std::time::{Duration, Instant};

use super::error::HsaError;
use super::runtime::Runtime;
use super::sys::*;

/// A signal, destroyed on drop.
#[derive(Debug)]
pub struct Signal {
    runtime: &'static Runtime,
    handle: hsa_signal_t,
}

impl Signal {
    pub fn handle(&self) -> hsa_signal_t {
        self.handle
    }

    pub fn store(&self, value: hsa_signal_value_t) {
        // SAFETY: the handle is a live signal of this runtime.
        unsafe { (self.runtime.api().hsa_signal_store_screlease)(self.handle, value) }
    }

    pub fn load(&self) -> hsa_signal_value_t {
        // SAFETY: the handle is a live signal of this runtime.
        unsafe { (self.runtime.api().hsa_signal_load_scacquire)(self.handle) }
    }

    /// Waits until the value equals `value` or `timeout` passes; returns the last value seen.
    pub fn wait_eq(
        &self,
        value: hsa_signal_value_t,
        timeout: Duration,
    ) -> Result<(), hsa_signal_value_t> {
        self.wait(HSA_SIGNAL_CONDITION_EQ, value, timeout)
            .map(|_| ())
    }

    /// Waits until the value drops below `value` (a completion count reaching 0, or the -1 a
    /// runtime stores on error) or `timeout` passes. Returns the value seen.
    pub fn wait_below(
        &self,
        value: hsa_signal_value_t,
        timeout: Duration,
    ) -> Result<hsa_signal_value_t, hsa_signal_value_t> {
        self.wait(HSA_SIGNAL_CONDITION_LT, value, timeout)
    }

    /// The runtime's wait may return early (the HSA spec allows it), hence the loop, and its
    /// timeout is only a hint, hence the deadline kept here.
    fn wait(
        &self,
        condition: hsa_signal_condition_t,
        value: hsa_signal_value_t,
        timeout: Duration,
    ) -> Result<hsa_signal_value_t, hsa_signal_value_t> {
        let met = |seen: hsa_signal_value_t| match condition {
            HSA_SIGNAL_CONDITION_LT => seen < value,
            _ => seen == value,
        };
        let deadline = Instant::now() + timeout;
        let slice_ticks = self.runtime.ticks_per_ms;
        loop {
            // SAFETY: the handle is a live signal of this runtime.
            let seen = unsafe {
                (self.runtime.api().hsa_signal_wait_scacquire)(
                    self.handle,
                    condition,
                    value,
                    slice_ticks,
                    HSA_WAIT_STATE_BLOCKED,
                )
            };
            if met(seen) {
                return Ok(seen);
            }
            if Instant::now() >= deadline {
                return Err(seen);
            }
        }
    }
}

impl Drop for Signal {
    fn drop(&mut self) {
        // SAFETY: the handle is a live signal of this runtime, destroyed exactly once here.
        let _ = unsafe { (self.runtime.api().hsa_signal_destroy)(self.handle) };
    }
}

impl Runtime {
    /// A signal any agent may wait on, starting at `initial`.
    pub fn signal(&'static self, initial: hsa_signal_value_t) -> Result<Signal, HsaError> {
        let mut handle = hsa_signal_t::default();
        // SAFETY: no consumer list (any agent may wait); `handle` is valid for the write.
        let rc =
            unsafe { (self.api().hsa_signal_create)(initial, 0, std::ptr::null(), &mut handle) };
        self.check("hsa_signal_create", rc)?;
        Ok(Signal {
            runtime: self,
            handle,
        })
    }
}

/// Default bound on waiting for the device: generous for any single batch of kernels, short
/// enough that a hung device fails the graph instead of the process.
pub const DEVICE_TIMEOUT: Duration = Duration::from_secs(10);
