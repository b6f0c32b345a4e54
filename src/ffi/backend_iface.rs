//! Backends (ggml's "streams"): a [`Stream`] behind ggml's `ggml_backend_i`.

use std::borrow::Cow;
use std::ffi::c_char;

use parking_lot::Mutex;

use super::cpu::CpuFallback;
use super::guard::guard;
use super::sys::*;
use super::{descriptors, handles};
use crate::backend::stream::GraphKey;
use crate::backend::{ComputeError, Stream};
use crate::log;
use crate::ops::Node;

/// The context of one backend.
struct Context {
    stream: Mutex<(Stream, CpuFallback)>,
}

/// Creates a backend on device `index`; NULL (with a logged reason) when the device cannot
/// provide a queue.
pub(crate) fn init(index: usize) -> ggml_backend_t {
    let (Some(device), Some(dev_ptr)) = (handles::device(index), handles::device_ptr(index)) else {
        return std::ptr::null_mut();
    };
    let stream = match Stream::new(device) {
        Ok(stream) => stream,
        Err(e) => {
            log::error(&format!("{}: cannot create a backend: {e}", device.name));
            return std::ptr::null_mut();
        }
    };
    log::info(&format!(
        "{}: backend on {} (packet ABI {})",
        device.name,
        device.description(),
        device.packet_abi
    ));
    let context = Box::into_raw(Box::new(Context {
        stream: Mutex::new((stream, CpuFallback::default())),
    }));
    Box::into_raw(Box::new(ggml_backend {
        guid: handles::guid(),
        iface: BACKEND_IFACE,
        device: dev_ptr,
        context: context.cast(),
    }))
}

/// Every optional slot is left to ggml's synchronous fallbacks. Where the releases differ (docs/building.md,
/// "Supported ggml releases"): the 2-D async slots exist from ggml 0.10 on
/// (`ggml_backend_tensor_2d_async`, set by the build script), and `graph_optimize` gained a params argument
/// there, which a NULL slot does not see.
static BACKEND_IFACE: ggml_backend_i = ggml_backend_i {
    get_name: Some(get_name),
    free: Some(free),
    set_tensor_async: None,
    get_tensor_async: None,
    #[cfg(ggml_backend_tensor_2d_async)]
    set_tensor_2d_async: None,
    #[cfg(ggml_backend_tensor_2d_async)]
    get_tensor_2d_async: None,
    cpy_tensor_async: None,
    synchronize: Some(synchronize),
    graph_plan_create: None,
    graph_plan_free: None,
    graph_plan_update: None,
    graph_plan_compute: None,
    graph_compute: Some(graph_compute),
    event_record: None,
    event_wait: None,
    graph_optimize: None,
};

/// Our context of `backend`, or `None` (logged, naming `slot`) when `backend` is NULL or not a
/// backend of this plugin (its guid is not ours, or it has no context).
///
/// # Safety
/// `backend` is NULL or a valid ggml backend; a backend of ours is live (not yet freed).
unsafe fn context<'a>(backend: ggml_backend_t, slot: &str) -> Option<&'a Context> {
    // SAFETY: a non-NULL backend is valid and its guid points to 16 bytes.
    let ours = !backend.is_null()
        && unsafe {
            !(*backend).guid.is_null()
                && ggml_guid_matches((*backend).guid, handles::guid())
                && !(*backend).context.is_null()
        };
    if !ours {
        log::error(&format!("backend::{slot}: not a backend of this plugin"));
        return None;
    }
    // SAFETY: backends with our guid carry a Box<Context> until `free`.
    Some(unsafe { &*(*backend).context.cast::<Context>() })
}

unsafe extern "C" fn get_name(backend: ggml_backend_t) -> *const c_char {
    guard("backend::get_name", std::ptr::null(), || {
        // SAFETY: ggml passes a valid backend (or NULL).
        if unsafe { context(backend, "get_name") }.is_none() {
            return std::ptr::null();
        }
        // SAFETY: a live backend of ours; its device pointer is one of ours.
        let dev = unsafe { (*backend).device };
        // SAFETY: `dev` is a device of this backend, whose get_name accepts any pointer.
        unsafe { ggml_backend_dev_name(dev) }
    })
}

unsafe extern "C" fn free(backend: ggml_backend_t) {
    guard("backend::free", (), || {
        // SAFETY: ggml passes a valid backend (or NULL).
        if unsafe { context(backend, "free") }.is_none() {
            return;
        }
        // SAFETY: ggml frees each backend once; both boxes were leaked in `init`.
        unsafe {
            drop(Box::from_raw((*backend).context.cast::<Context>()));
            drop(Box::from_raw(backend));
        }
    })
}

unsafe extern "C" fn synchronize(backend: ggml_backend_t) {
    guard("backend::synchronize", (), || {
        // SAFETY: ggml passes a valid backend (or NULL).
        let Some(ctx) = (unsafe { context(backend, "synchronize") }) else {
            return;
        };
        if let Err(e) = ctx.stream.lock().0.synchronize() {
            log::error(&format!("synchronize: {e}"));
        }
    })
}

unsafe extern "C" fn graph_compute(
    backend: ggml_backend_t,
    graph: *mut ggml_cgraph,
) -> ggml_status {
    guard("backend::graph_compute", GGML_STATUS_FAILED, || {
        // SAFETY: ggml passes a valid backend (or NULL).
        let Some(ctx) = (unsafe { context(backend, "graph_compute") }) else {
            return GGML_STATUS_FAILED;
        };
        if graph.is_null() {
            log::error("backend::graph_compute: no graph (NULL)");
            return GGML_STATUS_FAILED;
        }
        // The backend's host time starts here: reading the graph's key is part of it.
        let started = std::time::Instant::now();
        // SAFETY: a non-NULL graph from ggml is valid.
        let descriptors::GraphNodes {
            key,
            tensors,
            read_after,
        } = unsafe { descriptors::graph_key(graph) };
        // Descriptors are made only when the stream has no plan for this graph yet.
        let nodes = || -> Cow<'_, [Node]> {
            // SAFETY: the graph's nodes, valid for the whole call.
            Cow::Owned(
                tensors
                    .iter()
                    .zip(&read_after)
                    .map(|(&t, &after)| unsafe { descriptors::node(t, after) })
                    .collect(),
            )
        };
        let mut guard = ctx.stream.lock();
        let (stream, cpu) = &mut *guard;
        let mut memory = descriptors::GraphMemory {
            nodes: &tensors,
            cpu,
        };
        match stream.compute_keyed(GraphKey::Words(&key), &nodes, &mut memory, started) {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                // A scheduler never hands us a node we declined; a caller that does not ask
                // (ggml-rpc-server, which also aborts on a failed graph) needs the fallback.
                let hint = if !stream.device().cpu_fallback
                    && matches!(e, ComputeError::Node { .. } | ComputeError::Device { .. })
                {
                    " (a caller that does not ask supports_op, such as ggml-rpc-server, needs \
                     GGML_HSA_CPU_FALLBACK=1 so that such nodes run on the CPU)"
                } else {
                    ""
                };
                log::error(&format!(
                    "{}: graph_compute failed: {e}{hint}",
                    stream.device().name
                ));
                GGML_STATUS_FAILED
            }
        }
    })
}
