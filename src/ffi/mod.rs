//! The only code that touches ggml pointers: the exported C API ([`exports`]), ggml's backend
//! tables ([`reg`]), the panic guard ([`guard`]), logging through ggml's logger ([`log`]), the
//! ggml version check ([`version`]) and the bindgen'd ggml types ([`sys`]).

mod buffer;
mod cpu;
pub mod exports;
mod guard;
pub mod log;
mod objects;
mod reg;
mod stream;
pub mod sys;
mod tensor;
pub mod version;

use std::sync::OnceLock;

use crate::backend::Platform;
use crate::config;

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
