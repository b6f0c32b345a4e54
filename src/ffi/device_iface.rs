//! The device object's table of functions (`ggml_backend_device_i`): names, memory, properties,
//! backends, buffer types and `supports_op`.
//!
//! Placement in llama.cpp (docs/llama-cpp.md, "Placement"): the device reports itself as an integrated GPU
//! (IGPU), so it is a *model device*: `--device`, `-ngl`, `-nkvo` and `-ot` place layers, the KV
//! cache and tensors on it as they would on an iGPU. Both buffer types live in the NPU's data
//! pool, which is host-mapped system memory, and both are host buffer types:
//! * `HSA<n>` (the default): offloaded layers' weights, the KV cache, the device's activations;
//! * `HSA<n>_Host` (the host buffer type): llama.cpp puts the CPU backend's activations there, so
//!   tensors pass between the NPU and the CPU with no copy in either direction. Weights of CPU
//!   layers are never computed on here (`supports_op` declines ops reading a weight held in this
//!   buffer type), so `-ngl 0` means what it says.

use std::ffi::c_char;

use super::guard::guard;
use super::handles::{
    buft_ptr, device_index, device_of, device_of_buft, host_buft_ptr, is_host_buft, table,
};
use super::sys::*;
use super::{backend_iface, descriptors};
use crate::backend::device::OPERAND_ALIGNMENT;
use crate::log;
use crate::ops::{Memory, Plan};

pub(super) static DEVICE_IFACE: ggml_backend_device_i = ggml_backend_device_i {
    get_name: Some(dev_get_name),
    get_description: Some(dev_get_description),
    get_memory: Some(dev_get_memory),
    get_type: Some(dev_get_type),
    get_props: Some(dev_get_props),
    init_backend: Some(dev_init_backend),
    get_buffer_type: Some(dev_get_buffer_type),
    get_host_buffer_type: Some(dev_get_host_buffer_type),
    buffer_from_host_ptr: None,
    supports_op: Some(dev_supports_op),
    supports_buft: Some(dev_supports_buft),
    offload_op: None,
    event_new: None,
    event_free: None,
    event_synchronize: None,
};

unsafe extern "C" fn dev_get_name(dev: ggml_backend_dev_t) -> *const c_char {
    guard("device::get_name", std::ptr::null(), || {
        device_index(dev).map_or(std::ptr::null(), |i| table()[i].name.as_ptr())
    })
}

unsafe extern "C" fn dev_get_description(dev: ggml_backend_dev_t) -> *const c_char {
    guard("device::get_description", std::ptr::null(), || {
        device_index(dev).map_or(std::ptr::null(), |i| table()[i].description.as_ptr())
    })
}

/// Writes `value` through `out` when it is not NULL.
fn write_out<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: ggml passes NULL or a pointer valid for a write of T.
        unsafe { out.write(value) };
    }
}

unsafe extern "C" fn dev_get_memory(dev: ggml_backend_dev_t, free: *mut usize, total: *mut usize) {
    guard("device::get_memory", (), || {
        let (f, t) = device_of(dev, "get_memory").map_or((0, 0), |(_, d)| d.memory());
        write_out(free, f);
        write_out(total, t);
    })
}

/// Integrated GPU: see the module documentation for why not ACCEL.
const DEVICE_TYPE: ggml_backend_dev_type = GGML_BACKEND_DEVICE_TYPE_IGPU;

unsafe extern "C" fn dev_get_type(_dev: ggml_backend_dev_t) -> ggml_backend_dev_type {
    guard("device::get_type", DEVICE_TYPE, || DEVICE_TYPE)
}

unsafe extern "C" fn dev_get_props(dev: ggml_backend_dev_t, props: *mut ggml_backend_dev_props) {
    guard("device::get_props", (), || {
        let Some((i, d)) = device_of(dev, "get_props") else {
            return;
        };
        let (free, total) = d.memory();
        write_out(
            props,
            ggml_backend_dev_props {
                name: table()[i].name.as_ptr(),
                description: table()[i].description.as_ptr(),
                memory_free: free,
                memory_total: total,
                type_: DEVICE_TYPE,
                device_id: std::ptr::null(),
                caps: ggml_backend_dev_caps {
                    async_: false,
                    host_buffer: true,
                    buffer_from_host_ptr: false,
                    events: false,
                    // From ggml 0.10 on (`ggml_dev_caps_mmap_support`, set by the build script).
                    #[cfg(ggml_dev_caps_mmap_support)]
                    mmap_support: false,
                },
            },
        );
    })
}

unsafe extern "C" fn dev_init_backend(
    dev: ggml_backend_dev_t,
    _params: *const c_char,
) -> ggml_backend_t {
    guard("device::init_backend", std::ptr::null_mut(), || {
        device_index(dev).map_or_else(
            || {
                log::error("init_backend: not a device of this backend");
                std::ptr::null_mut()
            },
            backend_iface::init,
        )
    })
}

unsafe extern "C" fn dev_get_buffer_type(dev: ggml_backend_dev_t) -> ggml_backend_buffer_type_t {
    guard("device::get_buffer_type", std::ptr::null_mut(), || {
        device_index(dev)
            .and_then(buft_ptr)
            .unwrap_or(std::ptr::null_mut())
    })
}

unsafe extern "C" fn dev_get_host_buffer_type(
    dev: ggml_backend_dev_t,
) -> ggml_backend_buffer_type_t {
    guard("device::get_host_buffer_type", std::ptr::null_mut(), || {
        device_index(dev)
            .and_then(host_buft_ptr)
            .unwrap_or(std::ptr::null_mut())
    })
}

/// Whether one of `op`'s inputs is a weight held in a host buffer type: a CPU layer's weight.
///
/// # Safety
/// `op` is a valid tensor whose sources and their buffers are valid or NULL.
unsafe fn reads_cpu_layer_weight(op: *const ggml_tensor) -> bool {
    // SAFETY: the caller passes a valid tensor.
    let srcs = unsafe { (*op).src };
    srcs.iter().filter(|s| !s.is_null()).any(|&s| {
        // SAFETY: non-NULL sources of a valid tensor are valid tensors.
        let buffer = unsafe { (*s).buffer };
        !buffer.is_null()
            // SAFETY: a non-NULL buffer of a valid tensor is a valid buffer.
            && unsafe { ggml_backend_buffer_get_usage(buffer) } == GGML_BACKEND_BUFFER_USAGE_WEIGHTS
            // SAFETY: as above.
            && is_host_buft(unsafe { ggml_backend_buffer_get_type(buffer) })
    })
}

unsafe extern "C" fn dev_supports_op(dev: ggml_backend_dev_t, op: *const ggml_tensor) -> bool {
    guard("device::supports_op", false, || {
        let Some((_, d)) = device_of(dev, "supports_op") else {
            return false;
        };
        if op.is_null() {
            return false;
        }
        // SAFETY: ggml passes a valid tensor whose sources and buffers are valid or NULL.
        if unsafe { reads_cpu_layer_weight(op) } {
            return false;
        }
        // SAFETY: as above.
        let node = unsafe { descriptors::node(op, false) };
        // Kernels reach only NPU memory; a tensor already placed elsewhere cannot be an operand.
        if [&node.dst]
            .into_iter()
            .chain(node.inputs())
            .any(|t| t.memory == Memory::Foreign)
        {
            return false;
        }
        // SAFETY: as above.
        if unsafe { descriptors::has_operand_at_offset(op, OPERAND_ALIGNMENT) }
            && matches!(d.plan(&node), Ok(Plan::Kernel { .. }))
        {
            log::debug(&format!(
                "{}: {} not supported: an operand starts mid-word (a view at a byte offset not \
                 a multiple of {OPERAND_ALIGNMENT}); the NPU's DMA reads whole 32-bit words",
                d.name,
                node.op.name()
            ));
            return false;
        }
        match d.supports(&node) {
            Ok(()) => true,
            Err(reason) => {
                log::debug(&format!(
                    "{}: {} not supported: {reason}",
                    d.name,
                    node.op.name()
                ));
                false
            }
        }
    })
}

unsafe extern "C" fn dev_supports_buft(
    dev: ggml_backend_dev_t,
    buft: ggml_backend_buffer_type_t,
) -> bool {
    guard("device::supports_buft", false, || {
        // Every NPU reaches every buffer of this backend (they share system memory).
        device_index(dev).is_some() && device_of_buft(buft).is_some()
    })
}
