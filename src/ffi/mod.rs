//! The only code that touches ggml pointers:
//! * [`exports`]: the exported C API (`include/ggml-hsa.h`, `ggml_backend_init`/`_score`);
//! * `reg`, `device_iface`, `buffer_type_iface`, `buffer_iface`, `backend_iface`: ggml's tables of
//!   functions for the registry, devices, buffer types, buffers and backends (streams);
//! * `handles`: the ggml objects of each device, and the recognition of incoming pointers;
//! * `descriptors`: copies of `ggml_tensor`s for the planner, and host ops on ggml's memory;
//! * `guard`: the panic guard of every entry; `log_sink`: `crate::log` to ggml's logger;
//! * `cpu`: ggml's CPU backend for `GGML_HSA_CPU_FALLBACK`;
//! * [`version`]: the ggml version check; [`sys`]: the bindgen'd ggml types.

mod backend_iface;
mod buffer_iface;
mod buffer_type_iface;
mod cpu;
mod descriptors;
mod device_iface;
pub mod exports;
mod guard;
mod handles;
mod log_sink;
mod reg;
pub mod sys;
pub mod version;

use std::sync::OnceLock;

use crate::backend::Platform;
use crate::config;
use crate::log;

/// The platform, discovered on first use; its warnings and the reason it has no device (if so)
/// are logged exactly once per process.
pub(crate) fn platform() -> &'static Platform {
    static PLATFORM: OnceLock<Platform> = OnceLock::new();
    PLATFORM.get_or_init(|| {
        let platform = Platform::discover(config::get());
        for warning in &platform.warnings {
            log::warn(warning);
        }
        if let Some(reason) = &platform.unavailable {
            log::warn(&format!("no device available: {reason}"));
        }
        if let Some((abi, why)) = &platform.packet_abi {
            log::info(&format!(
                "{} device(s), packet ABI {abi} ({why})",
                platform.device_count()
            ));
        }
        platform
    })
}

/// The version check, logged once: `Err` means the plugin must decline to load.
pub(crate) fn ggml_compatible() -> Result<(), &'static str> {
    static CHECK: OnceLock<Result<(), String>> = OnceLock::new();
    CHECK
        .get_or_init(|| {
            let result = version::check(&version::built_against(), &version::running());
            if let Err(reason) = &result {
                log::error(reason);
            }
            result
        })
        .as_ref()
        .map(|_| ())
        .map_err(String::as_str)
}
