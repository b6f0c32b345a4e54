//! Signals: a 64-bit value with waiters. A queue's doorbell is also a signal (its kind says so);
//! storing to it submits the queue's packets (see [`crate::queue`]).

use crate::consts::*;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// What a signal handle refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalKind {
    User,
    /// The doorbell of the queue whose public `hsa_queue_t` lives at this address.
    Doorbell(usize),
}

#[derive(Debug)]
pub struct Signal {
    pub kind: SignalKind,
    value: AtomicI64,
    lock: Mutex<()>,
    cond: Condvar,
}

/// Timestamp ticks per second reported by `HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY` (1 tick = 1 ns).
pub const TIMESTAMP_FREQUENCY: u64 = 1_000_000_000;

impl Signal {
    pub fn new(kind: SignalKind, value: i64) -> Signal {
        Signal {
            kind,
            value: AtomicI64::new(value),
            lock: Mutex::new(()),
            cond: Condvar::new(),
        }
    }

    pub fn load(&self) -> i64 {
        self.value.load(Ordering::Acquire)
    }

    fn notify(&self) {
        // Taking the lock orders the update before any waiter's re-check.
        let _g = self.lock.lock();
        self.cond.notify_all();
    }

    pub fn store(&self, v: i64) {
        self.value.store(v, Ordering::Release);
        self.notify();
    }

    pub fn add(&self, v: i64) {
        self.value.fetch_add(v, Ordering::AcqRel);
        self.notify();
    }

    pub fn sub(&self, v: i64) {
        self.value.fetch_sub(v, Ordering::AcqRel);
        self.notify();
    }

    /// Waits until `condition` holds or `timeout_ticks` (ns) elapse; returns the last observed
    /// value. `u64::MAX` waits forever. An unknown condition returns at once.
    pub fn wait(&self, condition: u32, compare: i64, timeout_ticks: u64) -> i64 {
        let holds = |v: i64| match condition {
            HSA_SIGNAL_CONDITION_EQ => v == compare,
            HSA_SIGNAL_CONDITION_NE => v != compare,
            HSA_SIGNAL_CONDITION_LT => v < compare,
            HSA_SIGNAL_CONDITION_GTE => v >= compare,
            _ => true,
        };
        let deadline = if timeout_ticks == u64::MAX {
            None
        } else {
            Instant::now().checked_add(Duration::from_nanos(timeout_ticks))
        };
        let mut g = self.lock.lock();
        loop {
            let v = self.load();
            if holds(v) {
                return v;
            }
            let slice = Duration::from_millis(50);
            match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return v;
                    }
                    let _ = self.cond.wait_for(&mut g, slice.min(d - now));
                }
                None => {
                    let _ = self.cond.wait_for(&mut g, slice);
                }
            }
        }
    }
}
