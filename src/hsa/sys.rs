//! HSA types and constants, declared from the documented HSA/ROCR ABI (x86-64, LP64). No vendor
//! header is copied; `tests/hsa_abi.rs` checks these against Debian's `libhsa-runtime-dev` headers
//! when they are installed.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// `hsa_status_t`: a C enum whose values are all non-negative, hence `unsigned int` in C.
pub type hsa_status_t = u32;

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
pub const HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS: hsa_status_t = 0x100D;
pub const HSA_STATUS_ERROR_INVALID_CODE_OBJECT: hsa_status_t = 0x1010;
pub const HSA_STATUS_ERROR_INVALID_EXECUTABLE: hsa_status_t = 0x1011;
pub const HSA_STATUS_ERROR_FROZEN_EXECUTABLE: hsa_status_t = 0x1012;
pub const HSA_STATUS_ERROR_INVALID_SYMBOL_NAME: hsa_status_t = 0x1013;
pub const HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED: hsa_status_t = 0x1014;
pub const HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER: hsa_status_t = 0x1021;
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
pub type hsa_agent_info_t = u32;
/// `char[64]`.
pub const HSA_AGENT_INFO_NAME: hsa_agent_info_t = 0;
/// `hsa_device_type_t`.
pub const HSA_AGENT_INFO_DEVICE: hsa_agent_info_t = 17;

/// `hsa_device_type_t`.
pub type hsa_device_type_t = u32;
pub const HSA_DEVICE_TYPE_CPU: hsa_device_type_t = 0;
pub const HSA_DEVICE_TYPE_GPU: hsa_device_type_t = 1;
pub const HSA_DEVICE_TYPE_DSP: hsa_device_type_t = 2;
pub const HSA_DEVICE_TYPE_AIE: hsa_device_type_t = 3;

/// Size of the buffer `HSA_AGENT_INFO_NAME` writes.
pub const AGENT_NAME_LEN: usize = 64;

pub type hsa_agent_iterate_callback_t =
    Option<unsafe extern "C" fn(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t>;

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

/// `hsa_signal_t`: handle 0 means "no signal".
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct hsa_signal_t {
    pub handle: u64,
}

/// `hsa_amd_memory_pool_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct hsa_amd_memory_pool_t {
    pub handle: u64,
}

pub type hsa_signal_value_t = i64;
pub type hsa_queue_type32_t = u32;
pub const HSA_QUEUE_TYPE_MULTI: hsa_queue_type32_t = 0;
pub const HSA_QUEUE_TYPE_SINGLE: hsa_queue_type32_t = 1;

/// `hsa_queue_t` (LP64 layout: `base_address` is a plain pointer at offset 8).
#[repr(C)]
#[derive(Debug)]
pub struct hsa_queue_t {
    pub type_: hsa_queue_type32_t,
    pub features: u32,
    pub base_address: *mut c_void,
    pub doorbell_signal: hsa_signal_t,
    pub size: u32,
    pub reserved1: u32,
    pub id: u64,
}

pub const HSA_AGENT_INFO_QUEUE_MIN_SIZE: hsa_agent_info_t = 13;
pub const HSA_AGENT_INFO_QUEUE_MAX_SIZE: hsa_agent_info_t = 14;

pub type hsa_signal_condition_t = u32;
pub const HSA_SIGNAL_CONDITION_EQ: hsa_signal_condition_t = 0;
pub const HSA_SIGNAL_CONDITION_NE: hsa_signal_condition_t = 1;
pub const HSA_SIGNAL_CONDITION_LT: hsa_signal_condition_t = 2;
pub const HSA_SIGNAL_CONDITION_GTE: hsa_signal_condition_t = 3;
pub type hsa_wait_state_t = u32;
pub const HSA_WAIT_STATE_BLOCKED: hsa_wait_state_t = 0;
pub const HSA_WAIT_STATE_ACTIVE: hsa_wait_state_t = 1;

/// `hsa_system_info_t` (AMD extension values).
pub type hsa_system_info_t = u32;
pub const HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY: hsa_system_info_t = 3;
pub const HSA_AMD_SYSTEM_INFO_EXT_VERSION_MAJOR: hsa_system_info_t = 0x207;
pub const HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR: hsa_system_info_t = 0x208;

/// `hsa_amd_segment_t`.
pub type hsa_amd_segment_t = u32;
pub const HSA_AMD_SEGMENT_GLOBAL: hsa_amd_segment_t = 0;

/// `hsa_amd_memory_pool_global_flag_t` bits.
pub const HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT: u32 = 1;
pub const HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED: u32 = 2;
pub const HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED: u32 = 4;

/// `hsa_amd_memory_pool_info_t`.
pub type hsa_amd_memory_pool_info_t = u32;
pub const HSA_AMD_MEMORY_POOL_INFO_SEGMENT: hsa_amd_memory_pool_info_t = 0;
pub const HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS: hsa_amd_memory_pool_info_t = 1;
pub const HSA_AMD_MEMORY_POOL_INFO_SIZE: hsa_amd_memory_pool_info_t = 2;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED: hsa_amd_memory_pool_info_t = 5;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE: hsa_amd_memory_pool_info_t = 6;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT: hsa_amd_memory_pool_info_t = 7;
pub const HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL: hsa_amd_memory_pool_info_t = 15;
pub const HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE: hsa_amd_memory_pool_info_t = 16;
pub const HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_REC_GRANULE: hsa_amd_memory_pool_info_t = 18;

/// AMD vendor packet header (`hsa_amd_vendor_packet_header_t`, 4 bytes), shared by the ERT packets.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct hsa_amd_vendor_packet_header_t {
    pub header: u16,
    pub amd_format: u8,
    pub reserved: u8,
}

/// `HSA_AMD_PACKET_TYPE_AIE_ERT` in ROCR's packet generations A0..A2.
pub const HSA_AMD_PACKET_TYPE_AIE_ERT: u8 = 3;
/// The same packet's format byte from generation A3 on (`HSA_AMD_PACKET_TYPE_RESERVED200`).
pub const HSA_AMD_PACKET_TYPE_AIE_ERT_A3: u8 = 200;

/// ERT command state NEW and opcode START_CU (`hsa_amd_aie_ert_state`, `..._cmd_opcode_t`).
pub const HSA_AMD_AIE_ERT_STATE_NEW: u32 = 1;
pub const HSA_AMD_AIE_ERT_START_CU: u32 = 0;

/// `hsa_amd_aie_ert_packet_t` (64 bytes), generations A1..A3. The 32-bit `ert` word packs, LSB
/// first: state (4 bits), custom (8), count (11), opcode (5), type (4).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct hsa_amd_aie_ert_packet_t {
    pub header: hsa_amd_vendor_packet_header_t,
    pub ert: u32,
    pub reserved0: u64,
    pub reserved1: u64,
    pub reserved2: u64,
    pub reserved3: u64,
    pub reserved4: u64,
    /// `reserved5` in A1; the completion signal in A2/A3.
    pub completion_signal: u64,
    /// Host address of the START_CU payload.
    pub payload_data: u64,
}

/// Packs the ERT bit-field word.
pub const fn ert_word(state: u32, count: u32, opcode: u32) -> u32 {
    (state & 0xF) | ((count & 0x7FF) << 12) | ((opcode & 0x1F) << 23)
}

/// `hsa_amd_aie_kernel_dispatch_packet_t` (64 bytes), generation B.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct hsa_amd_aie_kernel_dispatch_packet_t {
    pub header: u16,
    pub opcode: u16,
    /// Must be 24.
    pub count: u16,
    pub reserved0: u8,
    pub reserved1: u8,
    pub completion_signal: hsa_signal_t,
    pub reserved2: u32,
    pub insts_addr_low: u32,
    pub insts_addr_high: u32,
    pub num_kernargs: u16,
    pub reserved3: u16,
    /// `2·N` u64: N argument addresses, then N sizes in bytes.
    pub kernarg_address: u64,
    /// In bytes (generation A counts dwords).
    pub insts_size: u64,
    pub pdi_addr: u64,
    pub reserved4: u64,
}

/// Generation B header: packet type READY (0) with system-scope acquire and release fences.
pub const HSA_AMD_AIE_DISPATCH_HEADER: u16 = (2 << 9) | (2 << 11);
pub const HSA_AMD_AIE_PACKET_OPCODE_KMQ: u16 = 0;
pub const HSA_AMD_AIE_DISPATCH_COUNT: u16 = 24;

pub type hsa_amd_memory_pool_iterate_callback_t =
    Option<unsafe extern "C" fn(pool: hsa_amd_memory_pool_t, data: *mut c_void) -> hsa_status_t>;
pub type hsa_queue_callback_t =
    unsafe extern "C" fn(status: hsa_status_t, source: *mut hsa_queue_t, data: *mut c_void);

pub type hsa_system_get_info_fn =
    unsafe extern "C" fn(attribute: hsa_system_info_t, value: *mut c_void) -> hsa_status_t;
pub type hsa_amd_agent_iterate_memory_pools_fn = unsafe extern "C" fn(
    agent: hsa_agent_t,
    callback: hsa_amd_memory_pool_iterate_callback_t,
    data: *mut c_void,
) -> hsa_status_t;
pub type hsa_amd_memory_pool_get_info_fn = unsafe extern "C" fn(
    pool: hsa_amd_memory_pool_t,
    attribute: hsa_amd_memory_pool_info_t,
    value: *mut c_void,
) -> hsa_status_t;
pub type hsa_amd_memory_pool_allocate_fn = unsafe extern "C" fn(
    pool: hsa_amd_memory_pool_t,
    size: usize,
    flags: u32,
    ptr: *mut *mut c_void,
) -> hsa_status_t;
pub type hsa_amd_memory_pool_free_fn = unsafe extern "C" fn(ptr: *mut c_void) -> hsa_status_t;
pub type hsa_queue_create_fn = unsafe extern "C" fn(
    agent: hsa_agent_t,
    size: u32,
    type_: hsa_queue_type32_t,
    callback: Option<hsa_queue_callback_t>,
    data: *mut c_void,
    private_segment_size: u32,
    group_segment_size: u32,
    queue: *mut *mut hsa_queue_t,
) -> hsa_status_t;
pub type hsa_queue_destroy_fn = unsafe extern "C" fn(queue: *mut hsa_queue_t) -> hsa_status_t;
pub type hsa_queue_index_fn = unsafe extern "C" fn(queue: *const hsa_queue_t) -> u64;
pub type hsa_queue_add_index_fn =
    unsafe extern "C" fn(queue: *const hsa_queue_t, value: u64) -> u64;
pub type hsa_signal_create_fn = unsafe extern "C" fn(
    initial_value: hsa_signal_value_t,
    num_consumers: u32,
    consumers: *const hsa_agent_t,
    signal: *mut hsa_signal_t,
) -> hsa_status_t;
pub type hsa_signal_destroy_fn = unsafe extern "C" fn(signal: hsa_signal_t) -> hsa_status_t;
pub type hsa_signal_store_fn =
    unsafe extern "C" fn(signal: hsa_signal_t, value: hsa_signal_value_t);
pub type hsa_signal_load_fn = unsafe extern "C" fn(signal: hsa_signal_t) -> hsa_signal_value_t;
pub type hsa_signal_wait_fn = unsafe extern "C" fn(
    signal: hsa_signal_t,
    condition: hsa_signal_condition_t,
    compare_value: hsa_signal_value_t,
    timeout_hint: u64,
    wait_state_hint: hsa_wait_state_t,
) -> hsa_signal_value_t;

/// `hsa_code_object_reader_t`, `hsa_executable_t`, `hsa_executable_symbol_t`,
/// `hsa_loaded_code_object_t`: opaque handles passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct hsa_code_object_reader_t {
    pub handle: u64,
}
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct hsa_executable_t {
    pub handle: u64,
}
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct hsa_executable_symbol_t {
    pub handle: u64,
}
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct hsa_loaded_code_object_t {
    pub handle: u64,
}

/// `hsa_profile_t`: any profile works for AIE code objects; ROCR and ggml pass FULL.
pub const HSA_PROFILE_FULL: u32 = 1;
/// `hsa_default_float_rounding_mode_t`.
pub const HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT: u32 = 0;
/// `hsa_executable_symbol_info_t`: `uint32_t` kernarg bytes.
pub const HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE: u32 = 11;
/// `hsa_executable_symbol_info_t`: `uint64_t` kernel object.
pub const HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT: u32 = 22;

pub type hsa_code_object_reader_create_from_memory_fn = unsafe extern "C" fn(
    code_object: *const c_void,
    size: usize,
    reader: *mut hsa_code_object_reader_t,
) -> hsa_status_t;
pub type hsa_code_object_reader_destroy_fn =
    unsafe extern "C" fn(reader: hsa_code_object_reader_t) -> hsa_status_t;
pub type hsa_executable_create_alt_fn = unsafe extern "C" fn(
    profile: u32,
    default_float_rounding_mode: u32,
    options: *const c_char,
    executable: *mut hsa_executable_t,
) -> hsa_status_t;
pub type hsa_executable_load_agent_code_object_fn = unsafe extern "C" fn(
    executable: hsa_executable_t,
    agent: hsa_agent_t,
    reader: hsa_code_object_reader_t,
    options: *const c_char,
    loaded_code_object: *mut hsa_loaded_code_object_t,
) -> hsa_status_t;
pub type hsa_executable_freeze_fn =
    unsafe extern "C" fn(executable: hsa_executable_t, options: *const c_char) -> hsa_status_t;
pub type hsa_executable_destroy_fn =
    unsafe extern "C" fn(executable: hsa_executable_t) -> hsa_status_t;
pub type hsa_executable_get_symbol_by_name_fn = unsafe extern "C" fn(
    executable: hsa_executable_t,
    symbol_name: *const c_char,
    agent: *const hsa_agent_t,
    symbol: *mut hsa_executable_symbol_t,
) -> hsa_status_t;
pub type hsa_executable_symbol_get_info_fn = unsafe extern "C" fn(
    symbol: hsa_executable_symbol_t,
    attribute: u32,
    value: *mut c_void,
) -> hsa_status_t;

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn handles_are_one_u64() {
        for (size, align) in [
            (size_of::<hsa_agent_t>(), align_of::<hsa_agent_t>()),
            (size_of::<hsa_signal_t>(), align_of::<hsa_signal_t>()),
            (
                size_of::<hsa_amd_memory_pool_t>(),
                align_of::<hsa_amd_memory_pool_t>(),
            ),
        ] {
            assert_eq!((size, align), (8, 8));
        }
    }

    #[test]
    fn queue_layout() {
        assert_eq!(size_of::<hsa_queue_t>(), 40);
        assert_eq!(align_of::<hsa_queue_t>(), 8);
        assert_eq!(offset_of!(hsa_queue_t, features), 4);
        assert_eq!(offset_of!(hsa_queue_t, base_address), 8);
        assert_eq!(offset_of!(hsa_queue_t, doorbell_signal), 16);
        assert_eq!(offset_of!(hsa_queue_t, size), 24);
        assert_eq!(offset_of!(hsa_queue_t, id), 32);
    }

    #[test]
    fn vendor_header_and_ert_packet_layout() {
        assert_eq!(size_of::<hsa_amd_vendor_packet_header_t>(), 4);
        assert_eq!(offset_of!(hsa_amd_vendor_packet_header_t, amd_format), 2);
        assert_eq!(size_of::<hsa_amd_aie_ert_packet_t>(), 64);
        assert_eq!(align_of::<hsa_amd_aie_ert_packet_t>(), 8);
        assert_eq!(offset_of!(hsa_amd_aie_ert_packet_t, ert), 4);
        assert_eq!(offset_of!(hsa_amd_aie_ert_packet_t, reserved0), 8);
        assert_eq!(offset_of!(hsa_amd_aie_ert_packet_t, completion_signal), 48);
        assert_eq!(offset_of!(hsa_amd_aie_ert_packet_t, payload_data), 56);
    }

    #[test]
    fn ert_word_bit_fields() {
        // state bits 0-3, count 12-22, opcode 23-27 (documented masks).
        assert_eq!(ert_word(0xF, 0, 0), 0x0000_000F);
        assert_eq!(ert_word(0, 0x7FF, 0), 0x007F_F000);
        assert_eq!(ert_word(0, 0, 0x1F), 0x0F80_0000);
        assert_eq!(ert_word(HSA_AMD_AIE_ERT_STATE_NEW, 9, 0), 0x9001);
    }

    #[test]
    fn aie_dispatch_packet_layout() {
        type P = hsa_amd_aie_kernel_dispatch_packet_t;
        assert_eq!(size_of::<P>(), 64);
        assert_eq!(offset_of!(P, opcode), 2);
        assert_eq!(offset_of!(P, count), 4);
        assert_eq!(offset_of!(P, completion_signal), 8);
        assert_eq!(offset_of!(P, reserved2), 16);
        assert_eq!(offset_of!(P, insts_addr_low), 20);
        assert_eq!(offset_of!(P, insts_addr_high), 24);
        assert_eq!(offset_of!(P, num_kernargs), 28);
        assert_eq!(offset_of!(P, kernarg_address), 32);
        assert_eq!(offset_of!(P, insts_size), 40);
        assert_eq!(offset_of!(P, pdi_addr), 48);
        assert_eq!(offset_of!(P, reserved4), 56);
        assert_eq!(HSA_AMD_AIE_DISPATCH_HEADER, 0x1400);
    }
}
