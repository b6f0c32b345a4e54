//! The backend registry object ggml sees (`ggml_backend_reg`, named `HSA`). It is one static that
//! lives for the whole process: ggml de-duplicates registries by pointer, and `ggml_backend_init`
//! may be called several times.

use std::ffi::{c_char, c_void, CStr};

use super::exports;
use super::guard::guard;
use super::sys::*;

/// A ggml object shared with C through a `*mut` pointer.
struct Shared<T>(T);

// SAFETY: ggml only reads these objects (it never writes through the reg or device pointers), and
// the context pointers they hold are NULL or point to immutable, thread-safe data.
unsafe impl<T> Sync for Shared<T> {}

pub(crate) const REG_NAME: &CStr = c"HSA";

static REG: Shared<ggml_backend_reg> = Shared(ggml_backend_reg {
    api_version: GGML_BACKEND_API_VERSION as i32,
    iface: ggml_backend_reg_i {
        get_name: Some(reg_get_name),
        get_device_count: Some(reg_get_device_count),
        get_device: Some(reg_get_device),
        get_proc_address: Some(reg_get_proc_address),
    },
    context: std::ptr::null_mut(),
});

/// The registry, always the same pointer.
pub(crate) fn reg() -> ggml_backend_reg_t {
    (&REG.0 as *const ggml_backend_reg).cast_mut()
}

unsafe extern "C" fn reg_get_name(_reg: ggml_backend_reg_t) -> *const c_char {
    guard("ggml_backend_reg_i::get_name", std::ptr::null(), || {
        REG_NAME.as_ptr()
    })
}

unsafe extern "C" fn reg_get_device_count(_reg: ggml_backend_reg_t) -> usize {
    guard("ggml_backend_reg_i::get_device_count", 0, || {
        super::platform().device_count()
    })
}

unsafe extern "C" fn reg_get_device(_reg: ggml_backend_reg_t, index: usize) -> ggml_backend_dev_t {
    guard(
        "ggml_backend_reg_i::get_device",
        std::ptr::null_mut(),
        || {
            super::handles::device_ptr(index).unwrap_or_else(|| {
                let count = super::platform().device_count();
                crate::log::error(&format!(
                    "get_device({index}): no such device ({count} device(s))"
                ));
                std::ptr::null_mut()
            })
        },
    )
}

/// Extension functions ggml and llama.cpp look up by name.
unsafe extern "C" fn reg_get_proc_address(
    _reg: ggml_backend_reg_t,
    name: *const c_char,
) -> *mut c_void {
    guard(
        "ggml_backend_reg_i::get_proc_address",
        std::ptr::null_mut(),
        || {
            if name.is_null() {
                return std::ptr::null_mut();
            }
            // SAFETY: ggml passes a NUL-terminated function name.
            let name = unsafe { CStr::from_ptr(name) };
            match name.to_bytes() {
                b"ggml_backend_register_host_buffer" => {
                    exports::ggml_backend_hsa_register_host_buffer as *mut c_void
                }
                b"ggml_backend_unregister_host_buffer" => {
                    exports::ggml_backend_hsa_unregister_host_buffer as *mut c_void
                }
                _ => std::ptr::null_mut(),
            }
        },
    )
}
