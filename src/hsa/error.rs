//! Typed errors of the HSA layer. They are flattened into log lines only at the C boundary.

use std::path::PathBuf;

use super::status;
use super::sys::hsa_status_t;

/// One place the loader looked for the HSA runtime, and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub candidate: PathBuf,
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HsaError {
    #[error("cannot load the HSA runtime (libhsa-runtime64); tried: {}", list_attempts(.attempts))]
    Load { attempts: Vec<Attempt> },

    #[error(
        "{library} is not a usable HSA runtime: required symbol `{symbol}` is missing ({reason})"
    )]
    MissingSymbol {
        library: PathBuf,
        symbol: &'static str,
        reason: String,
    },

    #[error("{call} failed with {}: {description}", status::name(*.status).map_or_else(|| format!("HSA status {:#x}", .status), str::to_owned))]
    Call {
        call: &'static str,
        status: hsa_status_t,
        /// The runtime's own text when it has one, else ours.
        description: String,
    },

    #[error("a callback of {call} panicked: {message}")]
    CallbackPanic { call: &'static str, message: String },
}

impl HsaError {
    /// The runtime ran out of a resource (`HSA_STATUS_ERROR_OUT_OF_RESOURCES`): for an
    /// allocation from the dev heap or the load of a code object into it, the heap is full.
    pub fn is_out_of_resources(&self) -> bool {
        matches!(
            self,
            HsaError::Call {
                status: super::sys::HSA_STATUS_ERROR_OUT_OF_RESOURCES,
                ..
            }
        )
    }
}

fn list_attempts(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(|a| format!("{} ({})", a.candidate.display(), a.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_error_lists_every_attempt() {
        let e = HsaError::Load {
            attempts: vec![
                Attempt {
                    candidate: "/opt/rocm/lib/libhsa-runtime64.so.1".into(),
                    reason: "not found".into(),
                },
                Attempt {
                    candidate: "libhsa-runtime64.so".into(),
                    reason: "cannot open shared object file".into(),
                },
            ],
        };
        let text = e.to_string();
        assert!(
            text.contains("/opt/rocm/lib/libhsa-runtime64.so.1 (not found)"),
            "{text}"
        );
        assert!(text.contains("libhsa-runtime64.so (cannot open"), "{text}");
    }

    #[test]
    fn call_error_names_the_status() {
        let e = HsaError::Call {
            call: "hsa_init",
            status: 0x1008,
            description: "no devices".into(),
        };
        assert_eq!(
            e.to_string(),
            "hsa_init failed with HSA_STATUS_ERROR_OUT_OF_RESOURCES: no devices"
        );
        let e = HsaError::Call {
            call: "hsa_init",
            status: 0x4242,
            description: "?".into(),
        };
        assert!(e.to_string().contains("HSA status 0x4242"));
    }

    #[test]
    fn out_of_resources_is_recognised_by_status() {
        let call = |status| HsaError::Call {
            call: "hsa_amd_memory_pool_allocate",
            status,
            description: String::new(),
        };
        assert!(call(0x1008).is_out_of_resources());
        assert!(!call(0x1000).is_out_of_resources());
        assert!(!HsaError::Load { attempts: vec![] }.is_out_of_resources());
    }
}
