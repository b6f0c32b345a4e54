//! hsa_queue_create / destroy and the queue index operations.

use super::{agent::agent_index, guard, with_rt, HsaAgent};
use crate::agents::PoolKind;
use crate::consts::*;
use crate::queue::{ErrorCallback, HsaQueue, Queue};
use crate::runtime::{self, Runtime};
use crate::signal::SignalKind;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `hsa_status_t hsa_queue_create(hsa_agent_t agent, uint32_t size, hsa_queue_type32_t type,
///     void (*callback)(hsa_status_t, hsa_queue_t*, void*), void* data,
///     uint32_t private_segment_size, uint32_t group_segment_size, hsa_queue_t** queue)`.
///
/// Checks in ROCR's order: queue NULL, size 0 / not a power of two / type > 2 ->
/// INVALID_ARGUMENT; bad agent -> INVALID_AGENT; type != SINGLE -> INVALID_QUEUE_CREATION;
/// size != 64 -> INVALID_ARGUMENT. `callback` is the error callback for dispatch errors.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hsa_queue_create(
    agent: HsaAgent,
    size: u32,
    type_: u32,
    callback: Option<ErrorCallback>,
    data: *mut c_void,
    private_segment_size: u32,
    group_segment_size: u32,
    queue: *mut *mut HsaQueue,
) -> Status {
    let _ = (private_segment_size, group_segment_size); // ignored, as by ROCR's AIE queue
    with_rt(|rt| {
        if queue.is_null()
            || size == 0
            || !size.is_power_of_two()
            || type_ > HSA_QUEUE_TYPE_COOPERATIVE
        {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let Some(a) = agent_index(rt, agent) else {
            return HSA_STATUS_ERROR_INVALID_AGENT;
        };
        if !rt.topo.agents[a].is_aie() {
            return HSA_STATUS_ERROR_INVALID_AGENT;
        }
        if type_ != HSA_QUEUE_TYPE_SINGLE {
            return HSA_STATUS_ERROR_INVALID_QUEUE_CREATION;
        }
        if size != AIE_QUEUE_SIZE {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let kernarg = rt.topo.agents[a]
            .pools
            .iter()
            .copied()
            .find(|&p| rt.topo.pools[p].kind == PoolKind::AieKernarg);
        let Some(kernarg) = kernarg else {
            return HSA_STATUS_ERROR_OUT_OF_RESOURCES;
        };
        let ring = match rt.allocate(kernarg, AIE_QUEUE_SIZE as usize * PACKET_SIZE, true) {
            Ok(r) => r,
            Err(s) => return s,
        };
        let id = rt.next_queue_id();
        // The doorbell signal is created first with a placeholder kind, then bound to the queue.
        let doorbell = rt.new_signal(SignalKind::User, 0);
        let q = Arc::new(Queue::new(id, a, ring, doorbell, callback, data as usize));
        let public = q.public_addr;
        rt.signals.write().insert(
            doorbell,
            Arc::new(crate::signal::Signal::new(SignalKind::Doorbell(public), 0)),
        );
        rt.queues.lock().insert(public, q);
        // SAFETY: queue is non-null (checked) and points to the client's `hsa_queue_t*`.
        unsafe { queue.write_unaligned(public as *mut HsaQueue) };
        HSA_STATUS_SUCCESS
    })
}

/// `hsa_status_t hsa_queue_destroy(hsa_queue_t* queue)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_queue_destroy(queue: *mut HsaQueue) -> Status {
    with_rt(|rt| {
        if queue.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let Some(q) = rt.queues.lock().remove(&(queue as usize)) else {
            return HSA_STATUS_ERROR_INVALID_QUEUE;
        };
        rt.signals.write().remove(&q.doorbell);
        rt.memory.lock().free(q.ring, true);
        HSA_STATUS_SUCCESS
    })
}

/// Runs `f` on the queue behind a public pointer; `fallback` if there is none.
fn with_queue<R>(queue: *const HsaQueue, fallback: R, f: impl FnOnce(&Runtime, &Queue) -> R) -> R
where
    R: Copy,
{
    guard(fallback, || {
        let Some(rt) = runtime::get() else {
            return fallback;
        };
        match rt.queue(queue as usize) {
            Some(q) => f(&rt, &q),
            None => {
                rt.log(&format!("{queue:p} is not a live queue"));
                fallback
            }
        }
    })
}

macro_rules! add_write_index {
    ($name:ident, $order:expr) => {
        /// `uint64_t (const hsa_queue_t* queue, uint64_t value)`: atomic fetch-add on the write
        /// index; returns the previous value.
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(queue: *const HsaQueue, value: u64) -> u64 {
            with_queue(queue, 0, |_, q| q.write_index.fetch_add(value, $order))
        }
    };
}
add_write_index!(hsa_queue_add_write_index_relaxed, Ordering::Relaxed);
add_write_index!(hsa_queue_add_write_index_scacquire, Ordering::Acquire);
add_write_index!(hsa_queue_add_write_index_screlease, Ordering::Release);
add_write_index!(hsa_queue_add_write_index_scacq_screl, Ordering::AcqRel);
add_write_index!(hsa_queue_add_write_index_acquire, Ordering::Acquire);
add_write_index!(hsa_queue_add_write_index_release, Ordering::Release);
add_write_index!(hsa_queue_add_write_index_acq_rel, Ordering::AcqRel);

macro_rules! cas_write_index {
    ($name:ident, $order:expr) => {
        /// `uint64_t (const hsa_queue_t* queue, uint64_t expected, uint64_t value)`: compare and
        /// swap on the write index; returns the previous value.
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(queue: *const HsaQueue, expected: u64, value: u64) -> u64 {
            with_queue(queue, 0, |_, q| {
                match q
                    .write_index
                    .compare_exchange(expected, value, $order, Ordering::Acquire)
                {
                    Ok(v) | Err(v) => v,
                }
            })
        }
    };
}
cas_write_index!(hsa_queue_cas_write_index_relaxed, Ordering::Relaxed);
cas_write_index!(hsa_queue_cas_write_index_scacquire, Ordering::Acquire);
cas_write_index!(hsa_queue_cas_write_index_screlease, Ordering::Release);
cas_write_index!(hsa_queue_cas_write_index_scacq_screl, Ordering::AcqRel);

macro_rules! load_index {
    ($name:ident, $field:ident, $order:expr) => {
        /// `uint64_t (const hsa_queue_t* queue)`.
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(queue: *const HsaQueue) -> u64 {
            with_queue(queue, 0, |_, q| q.$field.load($order))
        }
    };
}
load_index!(
    hsa_queue_load_write_index_relaxed,
    write_index,
    Ordering::Relaxed
);
load_index!(
    hsa_queue_load_write_index_scacquire,
    write_index,
    Ordering::Acquire
);
load_index!(
    hsa_queue_load_write_index_acquire,
    write_index,
    Ordering::Acquire
);
load_index!(
    hsa_queue_load_read_index_relaxed,
    read_index,
    Ordering::Relaxed
);
load_index!(
    hsa_queue_load_read_index_scacquire,
    read_index,
    Ordering::Acquire
);
load_index!(
    hsa_queue_load_read_index_acquire,
    read_index,
    Ordering::Acquire
);

macro_rules! store_write_index {
    ($name:ident, $order:expr) => {
        /// `void (const hsa_queue_t* queue, uint64_t value)`.
        ///
        /// # Safety
        /// Pointer arguments must be NULL (refused) or valid for the documented C type.
        #[no_mangle]
        pub unsafe extern "C" fn $name(queue: *const HsaQueue, value: u64) {
            with_queue(queue, (), |_, q| q.write_index.store(value, $order))
        }
    };
}
store_write_index!(hsa_queue_store_write_index_relaxed, Ordering::Relaxed);
store_write_index!(hsa_queue_store_write_index_screlease, Ordering::Release);
store_write_index!(hsa_queue_store_write_index_release, Ordering::Release);
