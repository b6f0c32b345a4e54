//! hsa_init, hsa_shut_down, hsa_status_string, hsa_system_get_info, and the simulator-only
//! `hsa_sim_packet_abi`.

use super::{guard, put, with_rt};
use crate::consts::*;
use crate::packet;
use crate::runtime;
use crate::signal::TIMESTAMP_FREQUENCY;
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;
use std::time::Instant;

/// `hsa_status_t hsa_init(void)`: reference counted; the first call reads the configuration.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_init() -> Status {
    guard(HSA_STATUS_ERROR, runtime::init)
}

/// `hsa_status_t hsa_shut_down(void)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_shut_down() -> Status {
    guard(HSA_STATUS_ERROR, runtime::shut_down)
}

/// `hsa_status_t hsa_status_string(hsa_status_t status, const char** status_string)`.
/// Works without hsa_init.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_status_string(
    status: Status,
    status_string: *mut *const c_char,
) -> Status {
    guard(HSA_STATUS_ERROR, || {
        if status_string.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        match STATUS_STRINGS.iter().find(|(s, _)| *s == status) {
            Some((_, text)) => {
                // SAFETY: status_string is non-null (checked) and points to a `const char*`
                // the client owns; the string is 'static.
                unsafe { status_string.write_unaligned(text.as_ptr()) };
                HSA_STATUS_SUCCESS
            }
            None => HSA_STATUS_ERROR_INVALID_ARGUMENT,
        }
    })
}

fn timestamp_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// `hsa_status_t hsa_system_get_info(hsa_system_info_t attribute, void* value)`.
///
/// `HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR` (0x208, written as uint16_t) identifies the packet
/// ABI generation: 11 = A1, 12 = A2, 20 = A3, 21 = B and C (major is 1; no query tells
/// B from C, clients probe C by loading an AIE code object).
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_system_get_info(attribute: u32, value: *mut c_void) -> Status {
    with_rt(|rt| {
        if value.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: (all `put` calls below) value is non-null and, per the HSA contract, points
        // to storage of the attribute's documented type.
        unsafe {
            match attribute {
                HSA_SYSTEM_INFO_VERSION_MAJOR => put::<u16>(value, 1),
                HSA_SYSTEM_INFO_VERSION_MINOR => put::<u16>(value, 1),
                HSA_SYSTEM_INFO_TIMESTAMP => put::<u64>(value, timestamp_ns()),
                HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY => put::<u64>(value, TIMESTAMP_FREQUENCY),
                HSA_SYSTEM_INFO_SIGNAL_MAX_WAIT => put::<u64>(value, u64::MAX),
                HSA_SYSTEM_INFO_ENDIANNESS => put::<u32>(value, 0),
                HSA_SYSTEM_INFO_MACHINE_MODEL => put::<u32>(value, HSA_MACHINE_MODEL_LARGE),
                HSA_SYSTEM_INFO_EXTENSIONS => put::<[u8; 128]>(value, [0u8; 128]),
                HSA_AMD_SYSTEM_INFO_EXT_VERSION_MAJOR => put::<u16>(value, 1),
                HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR => put::<u16>(
                    value,
                    packet::format_for(rt.config.packet_abi).ext_version_minor(),
                ),
                _ => return HSA_STATUS_ERROR_INVALID_ARGUMENT,
            }
        }
        HSA_STATUS_SUCCESS
    })
}

/// Simulator-only: the packet ABI the live runtime speaks ("a1", "a2", "a3", "b"), or NULL
/// before hsa_init. Real ROCR has no such symbol; test harnesses may use it to detect the
/// simulator (clients should probe `HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR`).
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_sim_packet_abi() -> *const c_char {
    guard(std::ptr::null(), || match runtime::get() {
        Some(rt) => match rt.config.packet_abi {
            crate::PacketAbi::A1 => c"a1".as_ptr(),
            crate::PacketAbi::A2 => c"a2".as_ptr(),
            crate::PacketAbi::A3 => c"a3".as_ptr(),
            crate::PacketAbi::B => c"b".as_ptr(),
            crate::PacketAbi::C => c"c".as_ptr(),
        },
        None => std::ptr::null(),
    })
}
