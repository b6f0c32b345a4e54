//! The logging facade every layer writes to. Where the lines go is decided by the outermost
//! layer: the plugin (`ffi`) installs ggml's logger as the sink on its first entry, so messages
//! reach whatever callback the application gave ggml (llama.cpp installs its own); programs
//! without ggml (`ggml-hsa-gen-kernels`, unit tests) keep the default sink, stderr. Every line is
//! prefixed with `HSA: `.
//!
//! Warnings, errors and notices are always emitted; debug and info lines only when
//! `GGML_HSA_ENABLE_LOG` is truthy (default: on in debug builds, off in release builds), as the
//! C++ backend does.

use std::sync::OnceLock;

use crate::config;

/// The severity of one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

/// Receives every emitted line, already prefixed, without a trailing newline.
pub type Sink = fn(Level, &str);

static SINK: OnceLock<Sink> = OnceLock::new();

/// Sends every later line to `sink`. The first call wins; later ones change nothing.
pub fn set_sink(sink: Sink) {
    let _ = SINK.set(sink);
}

fn stderr_sink(_level: Level, line: &str) {
    eprintln!("{line}");
}

fn emit(level: Level, message: &str) {
    let sink = SINK.get().copied().unwrap_or(stderr_sink);
    sink(level, &format!("HSA: {message}"));
}

pub fn error(message: &str) {
    emit(Level::Error, message);
}

pub fn warn(message: &str) {
    emit(Level::Warn, message);
}

/// An informational line the user asked for (e.g. what a cache clear removed): always emitted.
pub fn notice(message: &str) {
    emit(Level::Info, message);
}

pub fn info(message: &str) {
    if config::get().enable_log {
        emit(Level::Info, message);
    }
}

pub fn debug(message: &str) {
    if config::get().enable_log {
        emit(Level::Debug, message);
    }
}
