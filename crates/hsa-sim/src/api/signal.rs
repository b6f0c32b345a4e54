//! Signals. A store to a queue's doorbell signal submits the queue's packets synchronously.

use super::{agent::agent_index, guard, put, with_rt, HsaAgent, HsaSignal};
use crate::consts::*;
use crate::queue::ring_doorbell;
use crate::runtime::{self, Runtime};
use crate::signal::{Signal, SignalKind};
use std::sync::Arc;

/// `hsa_status_t hsa_signal_create(hsa_signal_value_t initial_value, uint32_t num_consumers,
///     const hsa_agent_t* consumers, hsa_signal_t* signal)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_signal_create(
    initial_value: i64,
    num_consumers: u32,
    consumers: *const HsaAgent,
    signal: *mut HsaSignal,
) -> Status {
    with_rt(|rt| {
        if signal.is_null() || (num_consumers > 0 && consumers.is_null()) {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        for i in 0..num_consumers as usize {
            // SAFETY: consumers is non-null and the client guarantees num_consumers elements.
            let a = unsafe { consumers.add(i).read_unaligned() };
            if agent_index(rt, a).is_none() {
                return HSA_STATUS_ERROR_INVALID_AGENT;
            }
        }
        let h = rt.new_signal(SignalKind::User, initial_value);
        // SAFETY: signal is non-null (checked) and points to the client's hsa_signal_t.
        unsafe { put(signal.cast(), HsaSignal { handle: h }) };
        HSA_STATUS_SUCCESS
    })
}

/// `hsa_status_t hsa_signal_destroy(hsa_signal_t signal)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_signal_destroy(signal: HsaSignal) -> Status {
    with_rt(|rt| {
        let mut table = rt.signals.write();
        match table.get(&signal.handle) {
            Some(s) if s.kind == SignalKind::User => {
                table.remove(&signal.handle);
                HSA_STATUS_SUCCESS
            }
            _ => HSA_STATUS_ERROR_INVALID_SIGNAL,
        }
    })
}

/// Runs `f` on the signal; `fallback` when there is no runtime or no such signal.
fn with_signal<R: Copy>(
    signal: HsaSignal,
    fallback: R,
    f: impl FnOnce(&Runtime, &Arc<Signal>) -> R,
) -> R {
    guard(fallback, || {
        let Some(rt) = runtime::get() else {
            return fallback;
        };
        match rt.signal(signal.handle) {
            Some(s) => f(&rt, &s),
            None => {
                rt.log(&format!("signal {:#x} does not exist", signal.handle));
                fallback
            }
        }
    })
}

fn store(signal: HsaSignal, value: i64) {
    with_signal(signal, (), |rt, s| {
        s.store(value);
        if let SignalKind::Doorbell(public) = s.kind {
            if let Some(q) = rt.queue(public) {
                ring_doorbell(rt, &q);
            }
        }
    })
}

macro_rules! store_fn {
    ($name:ident) => {
        /// `void (hsa_signal_t signal, hsa_signal_value_t value)`; on a doorbell: submit.
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(signal: HsaSignal, value: i64) {
            store(signal, value)
        }
    };
}
store_fn!(hsa_signal_store_relaxed);
store_fn!(hsa_signal_store_screlease);
store_fn!(hsa_signal_store_release);

macro_rules! load_fn {
    ($name:ident) => {
        /// `hsa_signal_value_t (hsa_signal_t signal)`.
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(signal: HsaSignal) -> i64 {
            with_signal(signal, 0, |_, s| s.load())
        }
    };
}
load_fn!(hsa_signal_load_relaxed);
load_fn!(hsa_signal_load_scacquire);
load_fn!(hsa_signal_load_acquire);

macro_rules! rmw_fn {
    ($name:ident, $method:ident) => {
        /// `void (hsa_signal_t signal, hsa_signal_value_t value)`.
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(signal: HsaSignal, value: i64) {
            with_signal(signal, (), |_, s| s.$method(value))
        }
    };
}
rmw_fn!(hsa_signal_add_relaxed, add);
rmw_fn!(hsa_signal_add_screlease, add);
rmw_fn!(hsa_signal_add_scacquire, add);
rmw_fn!(hsa_signal_add_scacq_screl, add);
rmw_fn!(hsa_signal_subtract_relaxed, sub);
rmw_fn!(hsa_signal_subtract_screlease, sub);
rmw_fn!(hsa_signal_subtract_scacquire, sub);
rmw_fn!(hsa_signal_subtract_scacq_screl, sub);

macro_rules! wait_fn {
    ($name:ident) => {
        /// `hsa_signal_value_t (hsa_signal_t signal, hsa_signal_condition_t condition,
        ///     hsa_signal_value_t compare_value, uint64_t timeout_hint,
        ///     hsa_wait_state_t wait_state_hint)`: returns the last observed value; the timeout
        /// is in timestamp ticks (1 ns; UINT64_MAX = forever).
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            signal: HsaSignal,
            condition: u32,
            compare_value: i64,
            timeout_hint: u64,
            wait_state_hint: u32,
        ) -> i64 {
            let _ = wait_state_hint; // both states block on a condition variable
            with_signal(signal, 0, |_, s| {
                s.wait(condition, compare_value, timeout_hint)
            })
        }
    };
}
wait_fn!(hsa_signal_wait_scacquire);
wait_fn!(hsa_signal_wait_relaxed);
wait_fn!(hsa_signal_wait_acquire);

/// Reports whether a signal handle is live (used by tests).
pub fn signal_exists(signal: HsaSignal) -> bool {
    runtime::get().is_some_and(|rt| rt.signal(signal.handle).is_some())
}
