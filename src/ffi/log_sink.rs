//! The sink that sends the backend's log lines (`crate::log`) to ggml's logger (`ggml_log_get`),
//! installed by the panic guard on the plugin's first entry.

use std::ffi::{c_void, CString};

use super::sys;
use crate::log::Level;

/// Sends one line to ggml's current logger (stderr when it has none).
pub(crate) fn ggml_sink(level: Level, line: &str) {
    let level = match level {
        Level::Error => sys::GGML_LOG_LEVEL_ERROR,
        Level::Warn => sys::GGML_LOG_LEVEL_WARN,
        Level::Info => sys::GGML_LOG_LEVEL_INFO,
        Level::Debug => sys::GGML_LOG_LEVEL_DEBUG,
    };
    let text = format!("{line}\n").replace('\0', "\\0");
    let text = CString::new(text).expect("NULs were escaped");
    let mut callback: sys::ggml_log_callback = None;
    let mut user_data: *mut c_void = std::ptr::null_mut();
    // SAFETY: ggml_log_get writes the current callback and its user data into the two pointers,
    // which point to valid locals.
    unsafe { sys::ggml_log_get(&mut callback, &mut user_data) };
    match callback {
        // SAFETY: the callback is ggml's current logger; it takes a level, a NUL-terminated string
        // that outlives the call, and the user data registered with it.
        Some(cb) => unsafe { cb(level, text.as_ptr(), user_data) },
        None => eprint!("{}", text.to_string_lossy()),
    }
}
