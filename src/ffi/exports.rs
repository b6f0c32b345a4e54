//! The exported C API: the public functions of `include/ggml-hsa.h` (generated from this file by
//! cbindgen) and the two symbols of a ggml dynamic backend, `ggml_backend_init` and
//! `ggml_backend_score`. Every function goes through the panic guard.

use std::ffi::{c_char, c_void};

use super::guard::guard;
use super::sys::{
    ggml_backend_buffer_type_t, ggml_backend_reg_t, ggml_backend_t, ggml_guid_matches,
};
use super::{backend_iface, handles, platform, reg};
use crate::log;

/// The backend's name: the registry is `HSA`, devices are `HSA0`, `HSA1`, ... (declared in the
/// header through `cbindgen.toml`, which cannot export string constants).
pub const GGML_HSA_NAME: &str = "HSA";

/// The most NPUs one process uses (lower it with the `GGML_HSA_MAX_DEVICES` environment variable).
pub const GGML_HSA_MAX_DEVICES: i32 = 16;

/// Device `device` if it exists; otherwise logs why not (for `api`).
fn device_index(api: &str, device: i32) -> Option<usize> {
    let index = usize::try_from(device).ok()?;
    if index < platform().device_count() {
        Some(index)
    } else {
        no_device(api, device);
        None
    }
}

fn no_device(api: &str, device: i32) {
    let platform = platform();
    let count = platform.device_count();
    let why = platform
        .unavailable
        .as_deref()
        .unwrap_or("index out of range");
    log::error(&format!(
        "{api}: no HSA device {device} ({count} device(s): {why})"
    ));
}

/// Creates a backend (stream) on NPU `device`. NULL when there is no such device.
#[no_mangle]
pub extern "C" fn ggml_backend_hsa_init(device: i32) -> ggml_backend_t {
    guard("ggml_backend_hsa_init", std::ptr::null_mut(), || {
        device_index("ggml_backend_hsa_init", device)
            .map_or(std::ptr::null_mut(), backend_iface::init)
    })
}

/// Whether `backend` was created by this library.
///
/// # Safety
/// `backend` is NULL or a valid ggml backend.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_is_hsa(backend: ggml_backend_t) -> bool {
    guard("ggml_backend_is_hsa", false, || {
        if backend.is_null() {
            return false;
        }
        // SAFETY: the caller passes a valid backend, whose guid points to 16 bytes.
        unsafe { ggml_guid_matches((*backend).guid, handles::guid()) }
    })
}

/// The buffer type of NPU memory for `device`. NULL when there is no such device.
#[no_mangle]
pub extern "C" fn ggml_backend_hsa_buffer_type(device: i32) -> ggml_backend_buffer_type_t {
    guard("ggml_backend_hsa_buffer_type", std::ptr::null_mut(), || {
        device_index("ggml_backend_hsa_buffer_type", device)
            .and_then(handles::buft_ptr)
            .unwrap_or(std::ptr::null_mut())
    })
}

/// The host buffer type (`HSA0_Host`): host-mapped NPU pool memory, where the CPU backend keeps
/// tensors that NPU kernels read and write in place. NULL when there is no device.
#[no_mangle]
pub extern "C" fn ggml_backend_hsa_host_buffer_type() -> ggml_backend_buffer_type_t {
    guard(
        "ggml_backend_hsa_host_buffer_type",
        std::ptr::null_mut(),
        || {
            device_index("ggml_backend_hsa_host_buffer_type", 0)
                .and_then(handles::host_buft_ptr)
                .unwrap_or(std::ptr::null_mut())
        },
    )
}

/// The number of NPUs the backend exposes (0 without a usable HSA runtime).
#[no_mangle]
pub extern "C" fn ggml_backend_hsa_get_device_count() -> i32 {
    guard("ggml_backend_hsa_get_device_count", 0, || {
        platform().device_count() as i32
    })
}

/// Writes the description of `device` (its agent name, `aie2` or `aie2p`) as a NUL-terminated
/// string of at most `description_size` bytes; an empty string when there is no such device.
///
/// # Safety
/// `description` is NULL or points to `description_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_hsa_get_device_description(
    device: i32,
    description: *mut c_char,
    description_size: usize,
) {
    guard("ggml_backend_hsa_get_device_description", (), || {
        if description.is_null() || description_size == 0 {
            return;
        }
        let text = device_index("ggml_backend_hsa_get_device_description", device)
            .and_then(handles::device)
            .map_or("", |d| d.description());
        let n = text.len().min(description_size - 1);
        // SAFETY: the caller provides `description_size` writable bytes; n + 1 fit.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), description.cast::<u8>(), n);
            *description.add(n) = 0;
        }
    })
}

/// Writes the free and total memory of `device` in bytes; 0 and 0 when there is no such device.
///
/// # Safety
/// `free` and `total` are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_hsa_get_device_memory(
    device: i32,
    free: *mut usize,
    total: *mut usize,
) {
    guard("ggml_backend_hsa_get_device_memory", (), || {
        let (f, t) = device_index("ggml_backend_hsa_get_device_memory", device)
            .and_then(handles::device)
            .map_or((0, 0), |d| d.memory());
        for (out, value) in [(free, f), (total, t)] {
            if !out.is_null() {
                // SAFETY: the caller passes NULL or a writable size_t.
                unsafe { *out = value };
            }
        }
    })
}

/// Pins a host buffer for the NPU. Not supported: XDNA NPUs reach only memory allocated from
/// their own HSA pools (ROCR refuses to map other memory for AIE agents), so this returns false
/// and the caller keeps using the buffer as plain host memory.
#[no_mangle]
pub extern "C" fn ggml_backend_hsa_register_host_buffer(buffer: *mut c_void, size: usize) -> bool {
    guard("ggml_backend_hsa_register_host_buffer", false, || {
        log::debug(&format!(
            "register_host_buffer({buffer:p}, {size}): not supported by XDNA NPUs; the buffer \
             stays plain host memory"
        ));
        false
    })
}

/// Undoes `ggml_backend_hsa_register_host_buffer`; nothing is ever registered, so a no-op.
#[no_mangle]
pub extern "C" fn ggml_backend_hsa_unregister_host_buffer(buffer: *mut c_void) {
    guard("ggml_backend_hsa_unregister_host_buffer", (), || {
        log::debug(&format!(
            "unregister_host_buffer({buffer:p}): nothing registered"
        ));
    })
}

/// The `HSA` backend registry.
#[no_mangle]
pub extern "C" fn ggml_backend_hsa_reg() -> ggml_backend_reg_t {
    guard("ggml_backend_hsa_reg", std::ptr::null_mut(), reg::reg)
}

/// Entry point of a ggml dynamic backend: the same registry every time, or NULL when this plugin
/// was built for another ggml.
#[no_mangle]
pub extern "C" fn ggml_backend_init() -> ggml_backend_reg_t {
    guard(
        "ggml_backend_init",
        std::ptr::null_mut(),
        || match super::ggml_compatible() {
            Ok(()) => reg::reg(),
            Err(_) => std::ptr::null_mut(),
        },
    )
}

/// ggml's loader asks this before `ggml_backend_init`: 0 means "do not load here" (no usable NPU,
/// or a plugin built for another ggml); the reason is logged once.
#[no_mangle]
pub extern "C" fn ggml_backend_score() -> i32 {
    guard("ggml_backend_score", 0, || {
        if super::ggml_compatible().is_err() || platform().device_count() == 0 {
            0
        } else {
            1
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_constants_match_the_code() {
        assert_eq!(GGML_HSA_MAX_DEVICES as usize, crate::config::MAX_DEVICES);
        assert_eq!(GGML_HSA_NAME.as_bytes(), reg::REG_NAME.to_bytes());
    }
}
