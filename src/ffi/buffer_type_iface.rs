//! The buffer types' table of functions (`ggml_backend_buffer_type_i`): `HSA<n>` and the host
//! buffer type `HSA<n>_Host`, both in the device's data pool (see `device_iface` for why both
//! are host buffer types).

use std::ffi::c_char;

use super::buffer_iface;
use super::guard::guard;
use super::handles::{device, device_of_buft, is_host_buft, table};
use super::sys::*;
use crate::backend::device::TENSOR_ALIGNMENT;
use crate::backend::Device;
use crate::log;

pub(super) static BUFT_IFACE: ggml_backend_buffer_type_i = ggml_backend_buffer_type_i {
    get_name: Some(buft_get_name),
    alloc_buffer: Some(buft_alloc_buffer),
    get_alignment: Some(buft_get_alignment),
    get_max_size: Some(buft_get_max_size),
    get_alloc_size: None,
    is_host: Some(buft_is_host),
};

unsafe extern "C" fn buft_get_name(buft: ggml_backend_buffer_type_t) -> *const c_char {
    guard("buffer_type::get_name", std::ptr::null(), || {
        device_of_buft(buft).map_or(std::ptr::null(), |i| {
            let o = &table()[i];
            if is_host_buft(buft) {
                o.host_name.as_ptr()
            } else {
                o.name.as_ptr()
            }
        })
    })
}

unsafe extern "C" fn buft_alloc_buffer(
    buft: ggml_backend_buffer_type_t,
    size: usize,
) -> ggml_backend_buffer_t {
    guard("buffer_type::alloc_buffer", std::ptr::null_mut(), || {
        let Some(index) = device_of_buft(buft) else {
            log::error("alloc_buffer: not a buffer type of this backend");
            return std::ptr::null_mut();
        };
        buffer_iface::alloc(buft, index, size)
    })
}

unsafe extern "C" fn buft_get_alignment(_buft: ggml_backend_buffer_type_t) -> usize {
    guard("buffer_type::get_alignment", TENSOR_ALIGNMENT, || {
        TENSOR_ALIGNMENT
    })
}

unsafe extern "C" fn buft_get_max_size(buft: ggml_backend_buffer_type_t) -> usize {
    guard("buffer_type::get_max_size", 0, || {
        device_of_buft(buft)
            .and_then(device)
            .map_or(0, Device::max_buffer_size)
    })
}

/// The data pool is system memory mapped into the host on these APUs: ggml and the CPU backend
/// may read and write its tensors in place (docs/llama-cpp.md, "Memory").
unsafe extern "C" fn buft_is_host(_buft: ggml_backend_buffer_type_t) -> bool {
    guard("buffer_type::is_host", false, || true)
}
