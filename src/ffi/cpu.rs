//! `GGML_HSA_CPU_FALLBACK` (development option): nodes the NPU has no kernel for run on ggml's
//! own CPU backend, one node at a time, directly on the graph's tensors (all of them are in
//! host-mapped memory; `supports_op` refuses anything else).
//!
//! The plugin links only `libggml-base`; the CPU backend is reached through the registry of the
//! ggml that loaded it (`ggml_backend_init_by_type` in `libggml`), looked up in the process's
//! global symbols. A static executable exports it only when linked to: the CMake shim's static
//! build (`GGML_BACKEND_DL=OFF`) adds `--export-dynamic-symbol=ggml_backend_init_by_type` to every
//! program linking ggml. Elsewhere the fallback is then unavailable and says so once.

use std::sync::OnceLock;

use libloading::os::unix::{Library, Symbol};

use super::sys::*;
use crate::log;

type InitByType =
    unsafe extern "C" fn(ggml_backend_dev_type, *const std::ffi::c_char) -> ggml_backend_t;

/// `ggml_backend_init_by_type`, if the process exports it.
fn init_by_type() -> Option<InitByType> {
    static FOUND: OnceLock<Option<InitByType>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let this = Library::this();
        // SAFETY: the symbol, when present, is ggml's `ggml_backend_t
        // ggml_backend_init_by_type(enum ggml_backend_dev_type, const char *)` (ggml-backend.h).
        let symbol: Result<Symbol<InitByType>, _> =
            unsafe { this.get(b"ggml_backend_init_by_type\0") };
        match symbol {
            Ok(f) => Some(*f),
            Err(e) => {
                log::error(&format!(
                    "GGML_HSA_CPU_FALLBACK: ggml's registry is not reachable from the plugin \
                     ({e}); the fallback is unavailable (a static executable must export it: \
                     -Wl,--export-dynamic-symbol=ggml_backend_init_by_type or -rdynamic)"
                ));
                None
            }
        }
    })
}

/// A CPU backend owned by one of our streams, created on first use.
#[derive(Debug, Default)]
pub(crate) struct CpuFallback {
    backend: Option<ggml_backend_t>,
}

// SAFETY: the CPU backend is used by one stream at a time (behind the stream's mutex).
unsafe impl Send for CpuFallback {}

impl CpuFallback {
    fn backend(&mut self) -> Result<ggml_backend_t, String> {
        if let Some(b) = self.backend {
            return Ok(b);
        }
        let init = init_by_type().ok_or("ggml's CPU backend is not reachable")?;
        // SAFETY: a valid device type and NULL parameters, as ggml documents.
        let backend = unsafe { init(GGML_BACKEND_DEVICE_TYPE_CPU, std::ptr::null()) };
        if backend.is_null() {
            return Err("ggml could not create a CPU backend".into());
        }
        self.backend = Some(backend);
        Ok(backend)
    }

    /// Computes `node` on the CPU backend. Its inputs must be ready (the caller has waited for
    /// the NPU); the CPU backend computes synchronously.
    ///
    /// # Safety
    /// `node` is a valid node of the graph being computed, with host-accessible data.
    pub(crate) unsafe fn compute(&mut self, node: *mut ggml_tensor) -> Result<(), String> {
        let backend = self.backend()?;
        // A one-node graph: its metadata lives in a small context of its own; the node and its
        // sources keep pointing at the graph's tensors and their memory.
        // SAFETY: plain size computations.
        let size =
            unsafe { ggml_graph_overhead_custom(1, false) } + unsafe { ggml_tensor_overhead() };
        let params = ggml_init_params {
            mem_size: size,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: valid parameters; the context is freed below.
        let ctx = unsafe { ggml_init(params) };
        if ctx.is_null() {
            return Err("cannot allocate a ggml context for the CPU fallback".into());
        }
        // SAFETY: ctx has room for a one-node graph; `node` is a valid tensor; the CPU backend
        // reads and writes host memory only.
        let status = unsafe {
            let graph = ggml_new_graph_custom(ctx, 1, false);
            ggml_graph_add_node(graph, node);
            let status = ggml_backend_graph_compute(backend, graph);
            ggml_free(ctx);
            status
        };
        if status == GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(format!("the CPU backend failed (ggml status {status})"))
        }
    }
}

impl Drop for CpuFallback {
    fn drop(&mut self) {
        if let Some(b) = self.backend.take() {
            // SAFETY: a backend created by ggml_backend_init_by_type and not freed yet.
            unsafe { ggml_backend_free(b) };
        }
    }
}
