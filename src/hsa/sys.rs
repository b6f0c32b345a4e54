//! HSA types and constants, declared from the documented HSA/ROCR ABI (x86-64, LP64). No vendor
//! header is copied; `tests/hsa_abi.rs` checks these against Debian's `libhsa-runtime-dev` headers
//! when they are installed.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// `hsa_status_t`: a 32-bit C enum.
pub type hsa_status_t = i32;

pub const HSA_STATUS_SUCCESS: hsa_status_t = 0x0;
pub const HSA_STATUS_INFO_BREAK: hsa_status_t = 0x1;
pub const HSA_STATUS_ERROR: hsa_status_t = 0x1000;
pub const HSA_STATUS_ERROR_INVALID_ARGUMENT: hsa_status_t = 0x1001;
pub const HSA_STATUS_ERROR_INVALID_QUEUE_CREATION: hsa_status_t = 0x1002;
pub const HSA_STATUS_ERROR_INVALID_ALLOCATION: hsa_status_t = 0x1003;
pub const HSA_STATUS_ERROR_INVALID_AGENT: hsa_status_t = 0x1004;
pub const HSA_STATUS_ERROR_INVALID_REGION: hsa_status_t = 0x1005;
pub const HSA_STATUS_ERROR_INVALID_SIGNAL: hsa_status_t = 0x1006;
pub const HSA_STATUS_ERROR_INVALID_QUEUE: hsa_status_t = 0x1007;
pub const HSA_STATUS_ERROR_OUT_OF_RESOURCES: hsa_status_t = 0x1008;
pub const HSA_STATUS_ERROR_INVALID_PACKET_FORMAT: hsa_status_t = 0x1009;
pub const HSA_STATUS_ERROR_RESOURCE_FREE: hsa_status_t = 0x100A;
pub const HSA_STATUS_ERROR_NOT_INITIALIZED: hsa_status_t = 0x100B;
pub const HSA_STATUS_ERROR_INVALID_CACHE: hsa_status_t = 0x1022;
pub const HSA_STATUS_ERROR_INVALID_RUNTIME_STATE: hsa_status_t = 0x1025;
pub const HSA_STATUS_ERROR_FATAL: hsa_status_t = 0x1026;
pub const HSA_STATUS_ERROR_INVALID_MEMORY_POOL: hsa_status_t = 0x28;
pub const HSA_STATUS_ERROR_RESOURCE_BUSY: hsa_status_t = 0x2E;
pub const HSA_STATUS_ERROR_NOT_SUPPORTED: hsa_status_t = 0x2F;

/// `hsa_agent_t`: an opaque handle passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct hsa_agent_t {
    pub handle: u64,
}

/// `hsa_agent_info_t`.
pub type hsa_agent_info_t = i32;
/// `char[64]`.
pub const HSA_AGENT_INFO_NAME: hsa_agent_info_t = 0;
/// `hsa_device_type_t`.
pub const HSA_AGENT_INFO_DEVICE: hsa_agent_info_t = 17;

/// `hsa_device_type_t`.
pub type hsa_device_type_t = i32;
pub const HSA_DEVICE_TYPE_CPU: hsa_device_type_t = 0;
pub const HSA_DEVICE_TYPE_GPU: hsa_device_type_t = 1;
pub const HSA_DEVICE_TYPE_DSP: hsa_device_type_t = 2;
pub const HSA_DEVICE_TYPE_AIE: hsa_device_type_t = 3;

/// Size of the buffer `HSA_AGENT_INFO_NAME` writes.
pub const AGENT_NAME_LEN: usize = 64;

pub type hsa_agent_iterate_callback_t =
    unsafe extern "C" fn(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t;

pub type hsa_init_fn = unsafe extern "C" fn() -> hsa_status_t;
pub type hsa_status_string_fn =
    unsafe extern "C" fn(status: hsa_status_t, status_string: *mut *const c_char) -> hsa_status_t;
pub type hsa_iterate_agents_fn =
    unsafe extern "C" fn(callback: hsa_agent_iterate_callback_t, data: *mut c_void) -> hsa_status_t;
pub type hsa_agent_get_info_fn = unsafe extern "C" fn(
    agent: hsa_agent_t,
    attribute: hsa_agent_info_t,
    value: *mut c_void,
) -> hsa_status_t;
