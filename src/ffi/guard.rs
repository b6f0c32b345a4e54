//! The one panic guard every `extern "C"` function of this crate goes through.
//!
//! A Rust panic must never unwind into C (current Rust aborts the process when it tries). The guard
//! catches it, logs it through ggml's logger together with the slot that panicked, and returns the
//! slot's failure value (NULL, false, 0, `GGML_STATUS_FAILED`, or nothing for `void` slots).

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::log;

/// Runs `body` for the C entry point `slot`; on a panic, logs it and returns `on_panic`. Every
/// entry from C passes here first, so this is also where the backend's log lines are routed to
/// ggml's logger.
pub(crate) fn guard<R>(slot: &'static str, on_panic: R, body: impl FnOnce() -> R) -> R {
    log::set_sink(super::log_sink::ggml_sink);
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            log::error(&format!(
                "internal error in {slot}: {}; the call failed",
                panic_message(payload.as_ref())
            ));
            on_panic
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "panic with a non-string payload"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_body_value() {
        assert_eq!(guard("test", 0, || 7), 7);
    }

    #[test]
    fn turns_a_panic_into_the_failure_value() {
        let value = guard("test_slot", std::ptr::null_mut::<u8>(), || panic!("boom"));
        assert!(value.is_null());
        assert!(!guard("test_slot", false, || -> bool {
            panic!("{}", String::from("x"))
        }));
    }

    #[test]
    fn names_the_payload() {
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&42_u32), "panic with a non-string payload");
    }
}
