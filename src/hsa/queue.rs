//! RAII AIE queues: a 64-slot ring of 64-byte packets whose doorbell submits synchronously.
//!
//! ROCR processes everything up to the write index when the doorbell signal is stored, on the
//! calling thread, and has advanced the read index by the time the store returns. A submission is
//! therefore: write packets into free slots, advance the write index, ring once, and check that
//! the read index caught up and no error was reported through the queue callback.
//!
//! The error callback is registered on every queue, whatever the packet generation: it records
//! the first status in the queue's shared state. ROCR (generation c at least) calls it on the
//! thread that rang the doorbell and then suspends the queue for good, so a queue that reported
//! an error is never used again: the stream replaces it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use super::error::HsaError;
use super::runtime::Runtime;
use super::sys::*;

/// Packets per queue: ROCR's AIE agents support exactly this size.
pub const QUEUE_SIZE: u32 = 64;
const PACKET_BYTES: usize = 64;

/// Errors the runtime reported asynchronously through the queue callback (first one kept).
#[derive(Debug, Default)]
struct CallbackErrors {
    status: AtomicU32,
}

/// Why a submission failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue has {free} free slots, {wanted} packets were submitted")]
    QueueFull { free: u64, wanted: usize },
    /// The queue's error callback fired during the doorbell. `ran` packets of the submission
    /// completed first (ROCR advances the read index by the packets that ran before it calls
    /// the callback and suspends the queue; a suspended queue ignores every later doorbell, so
    /// its owner must replace it).
    #[error("the runtime reported {} on the queue (after {ran} packet(s) ran); the queue is suspended", super::status::name(*.status).unwrap_or("an error"))]
    Runtime { status: hsa_status_t, ran: u64 },
    #[error(
        "the runtime processed {done} of {submitted} packets before returning from the doorbell"
    )]
    Incomplete { done: u64, submitted: u64 },
}

/// A queue on one agent, destroyed on drop.
#[derive(Debug)]
pub struct Queue {
    runtime: &'static Runtime,
    queue: *mut hsa_queue_t,
    errors: Box<CallbackErrors>,
}

// SAFETY: the queue is used by one thread at a time (the owner serialises submissions, as ROCR
// requires for AIE queues); the raw pointer is only dereferenced under `&mut self`/`&self` calls.
unsafe impl Send for Queue {}

unsafe extern "C" fn queue_error(
    status: hsa_status_t,
    _source: *mut hsa_queue_t,
    data: *mut c_void,
) {
    // SAFETY: `data` is the Box<CallbackErrors> owned by the Queue, which outlives the runtime
    // queue (the queue is destroyed before the box is dropped).
    let errors = unsafe { &*data.cast::<CallbackErrors>() };
    let _ = errors
        .status
        .compare_exchange(0, status, Ordering::AcqRel, Ordering::Acquire);
}

impl Runtime {
    /// Creates a single-producer queue of [`QUEUE_SIZE`] packets on `agent`.
    pub fn queue(&'static self, agent: hsa_agent_t) -> Result<Queue, HsaError> {
        let errors = Box::<CallbackErrors>::default();
        let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
        // SAFETY: all pointers are valid; the callback data lives in `errors`, which the Queue keeps
        // alive until after hsa_queue_destroy.
        let rc = unsafe {
            (self.api().hsa_queue_create)(
                agent,
                QUEUE_SIZE,
                HSA_QUEUE_TYPE_SINGLE,
                Some(queue_error),
                (&*errors as *const CallbackErrors).cast_mut().cast(),
                0,
                0,
                &mut queue,
            )
        };
        self.check("hsa_queue_create", rc)?;
        if queue.is_null() {
            return Err(HsaError::Call {
                call: "hsa_queue_create",
                status: HSA_STATUS_ERROR,
                description: "the runtime returned success and a NULL queue".into(),
            });
        }
        Ok(Queue {
            runtime: self,
            queue,
            errors,
        })
    }
}

impl Queue {
    fn size(&self) -> u64 {
        // SAFETY: the queue is live; `size` is immutable after creation.
        u64::from(unsafe { (*self.queue).size })
    }

    /// Writes `packets` into the ring and rings the doorbell once.
    pub fn submit(&mut self, packets: &[[u8; PACKET_BYTES]]) -> Result<(), SubmitError> {
        let api = self.runtime.api();
        // SAFETY: the queue is live.
        let write = unsafe { (api.hsa_queue_load_write_index_relaxed)(self.queue) };
        // SAFETY: the queue is live.
        let read = unsafe { (api.hsa_queue_load_read_index_scacquire)(self.queue) };
        let size = self.size();
        let free = size.saturating_sub(write.wrapping_sub(read));
        if packets.len() as u64 > free {
            return Err(SubmitError::QueueFull {
                free,
                wanted: packets.len(),
            });
        }
        // SAFETY: the queue is live; base_address is immutable after creation.
        let base = unsafe { (*self.queue).base_address }.cast::<u8>();
        for (i, packet) in packets.iter().enumerate() {
            let slot = (write + i as u64) % size;
            // SAFETY: slot < size and the ring holds `size` packets of 64 bytes; the slot is free
            // (between read and write indices nothing is pending after a synchronous doorbell).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    packet.as_ptr(),
                    base.add(slot as usize * PACKET_BYTES),
                    PACKET_BYTES,
                );
            }
        }
        let n = packets.len() as u64;
        // SAFETY: the queue is live; this thread is the only producer.
        unsafe { (api.hsa_queue_add_write_index_relaxed)(self.queue, n) };
        // SAFETY: the doorbell signal belongs to the live queue; the value is the last packet id.
        unsafe {
            (api.hsa_signal_store_screlease)((*self.queue).doorbell_signal, (write + n - 1) as i64)
        };

        let status = self.errors.status.load(Ordering::Acquire);
        // SAFETY: the queue is live.
        let done = unsafe { (api.hsa_queue_load_read_index_scacquire)(self.queue) };
        if status != 0 {
            return Err(SubmitError::Runtime {
                status,
                ran: done.wrapping_sub(write).min(n),
            });
        }
        if done != write + n {
            return Err(SubmitError::Incomplete {
                done: done.wrapping_sub(write),
                submitted: n,
            });
        }
        Ok(())
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the queue is live and destroyed exactly once; the callback box outlives it.
        let _ = unsafe { (self.runtime.api().hsa_queue_destroy)(self.queue) };
    }
}
