//! Names and descriptions of `hsa_status_t` values, kept locally so that an error can be explained
//! even when the runtime's own `hsa_status_string` is missing or fails.

use super::sys::*;

/// The C name of `status`, or `None` for a value this crate does not know.
pub fn name(status: hsa_status_t) -> Option<&'static str> {
    entry(status).map(|(name, _)| name)
}

/// A one-line description of `status`.
pub fn description(status: hsa_status_t) -> &'static str {
    entry(status).map_or("unknown HSA status", |(_, description)| description)
}

fn entry(status: hsa_status_t) -> Option<(&'static str, &'static str)> {
    Some(match status {
        HSA_STATUS_SUCCESS => ("HSA_STATUS_SUCCESS", "the function succeeded"),
        HSA_STATUS_INFO_BREAK => ("HSA_STATUS_INFO_BREAK", "a callback stopped the iteration"),
        HSA_STATUS_ERROR => ("HSA_STATUS_ERROR", "generic error"),
        HSA_STATUS_ERROR_INVALID_ARGUMENT => (
            "HSA_STATUS_ERROR_INVALID_ARGUMENT",
            "an argument is invalid",
        ),
        HSA_STATUS_ERROR_INVALID_QUEUE_CREATION => (
            "HSA_STATUS_ERROR_INVALID_QUEUE_CREATION",
            "the requested queue cannot be created on this agent",
        ),
        HSA_STATUS_ERROR_INVALID_ALLOCATION => (
            "HSA_STATUS_ERROR_INVALID_ALLOCATION",
            "the pointer is not the base of an allocation",
        ),
        HSA_STATUS_ERROR_INVALID_AGENT => ("HSA_STATUS_ERROR_INVALID_AGENT", "invalid agent"),
        HSA_STATUS_ERROR_INVALID_REGION => ("HSA_STATUS_ERROR_INVALID_REGION", "invalid region"),
        HSA_STATUS_ERROR_INVALID_SIGNAL => ("HSA_STATUS_ERROR_INVALID_SIGNAL", "invalid signal"),
        HSA_STATUS_ERROR_INVALID_QUEUE => ("HSA_STATUS_ERROR_INVALID_QUEUE", "invalid queue"),
        HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS => (
            "HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS",
            "the code object has no section for this agent's architecture",
        ),
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT => (
            "HSA_STATUS_ERROR_INVALID_CODE_OBJECT",
            "the code object is invalid (or the runtime has no AIE code-object loader)",
        ),
        HSA_STATUS_ERROR_INVALID_EXECUTABLE => {
            ("HSA_STATUS_ERROR_INVALID_EXECUTABLE", "invalid executable")
        }
        HSA_STATUS_ERROR_FROZEN_EXECUTABLE => (
            "HSA_STATUS_ERROR_FROZEN_EXECUTABLE",
            "the executable is frozen",
        ),
        HSA_STATUS_ERROR_INVALID_SYMBOL_NAME => (
            "HSA_STATUS_ERROR_INVALID_SYMBOL_NAME",
            "no symbol of that name for that agent",
        ),
        HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED => (
            "HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED",
            "a kernel of that name is already loaded",
        ),
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER => (
            "HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER",
            "invalid code object reader",
        ),
        HSA_STATUS_ERROR_OUT_OF_RESOURCES => (
            "HSA_STATUS_ERROR_OUT_OF_RESOURCES",
            "the runtime could not allocate the resources it needs (no usable device or driver?)",
        ),
        HSA_STATUS_ERROR_INVALID_PACKET_FORMAT => (
            "HSA_STATUS_ERROR_INVALID_PACKET_FORMAT",
            "a packet has an invalid format",
        ),
        HSA_STATUS_ERROR_RESOURCE_FREE => (
            "HSA_STATUS_ERROR_RESOURCE_FREE",
            "a resource is released while still in use",
        ),
        HSA_STATUS_ERROR_NOT_INITIALIZED => (
            "HSA_STATUS_ERROR_NOT_INITIALIZED",
            "the runtime is not initialized",
        ),
        HSA_STATUS_ERROR_INVALID_CACHE => ("HSA_STATUS_ERROR_INVALID_CACHE", "invalid cache"),
        HSA_STATUS_ERROR_INVALID_RUNTIME_STATE => (
            "HSA_STATUS_ERROR_INVALID_RUNTIME_STATE",
            "the runtime is in a state that does not allow this call",
        ),
        HSA_STATUS_ERROR_FATAL => ("HSA_STATUS_ERROR_FATAL", "fatal runtime error"),
        HSA_STATUS_ERROR_INVALID_MEMORY_POOL => (
            "HSA_STATUS_ERROR_INVALID_MEMORY_POOL",
            "invalid memory pool",
        ),
        HSA_STATUS_ERROR_RESOURCE_BUSY => ("HSA_STATUS_ERROR_RESOURCE_BUSY", "resource busy"),
        HSA_STATUS_ERROR_NOT_SUPPORTED => (
            "HSA_STATUS_ERROR_NOT_SUPPORTED",
            "the operation is not supported",
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_values() {
        assert_eq!(name(0x1008), Some("HSA_STATUS_ERROR_OUT_OF_RESOURCES"));
        assert_eq!(name(0x28), Some("HSA_STATUS_ERROR_INVALID_MEMORY_POOL"));
        assert_eq!(name(0x7777), None);
        assert_eq!(description(0x7777), "unknown HSA status");
        assert!(description(HSA_STATUS_ERROR_INVALID_AGENT).contains("agent"));
    }
}
