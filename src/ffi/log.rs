//! Logging through ggml's logger (`ggml_log_get`), so that messages go wherever the application
//! sends ggml's (llama.cpp installs its own callback). Every line is prefixed with `HSA: `.
//!
//! Warnings and errors are always emitted. Debug and info lines only when `GGML_HSA_ENABLE_LOG` is
//! truthy (default: on in debug builds, off in release builds), as the C++ backend does.

use std::ffi::{c_void, CString};

use super::sys;
use crate::config;

/// Sends one line to ggml's logger.
fn emit(level: sys::ggml_log_level, message: &str) {
    let text = format!("HSA: {message}\n").replace('\0', "\\0");
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

pub fn error(message: &str) {
    emit(sys::GGML_LOG_LEVEL_ERROR, message);
}

pub fn warn(message: &str) {
    emit(sys::GGML_LOG_LEVEL_WARN, message);
}

/// An informational line the user asked for (e.g. what a cache clear removed): always emitted.
pub fn notice(message: &str) {
    emit(sys::GGML_LOG_LEVEL_INFO, message);
}

pub fn info(message: &str) {
    if config::get().enable_log {
        emit(sys::GGML_LOG_LEVEL_INFO, message);
    }
}

pub fn debug(message: &str) {
    if config::get().enable_log {
        emit(sys::GGML_LOG_LEVEL_DEBUG, message);
    }
}
