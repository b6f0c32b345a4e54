//! The code object reader and executable entry points (ROCR's AIE hsaco loader; packet ABI c).
//! The logic is in [`crate::code_object`]; this file only takes the client's pointers.

use super::{put, with_rt, HsaAgent};
use crate::code_object;
use crate::consts::*;
use std::ffi::{c_char, c_void, CStr};

/// `hsa_code_object_reader_t`, `hsa_executable_t`, `hsa_executable_symbol_t`,
/// `hsa_loaded_code_object_t`: one u64 handle each.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HsaHandle {
    pub handle: u64,
}

// hsa_executable_symbol_info_t
const SYMBOL_INFO_TYPE: u32 = 0;
const SYMBOL_INFO_NAME_LENGTH: u32 = 1;
const SYMBOL_INFO_NAME: u32 = 2;
const SYMBOL_INFO_LINKAGE: u32 = 5;
const SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE: u32 = 11;
const SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT: u32 = 12;
const SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE: u32 = 13;
const SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE: u32 = 14;
const SYMBOL_INFO_AGENT: u32 = 20;
const SYMBOL_INFO_KERNEL_OBJECT: u32 = 22;
const HSA_SYMBOL_KIND_KERNEL: u32 = 1;
const HSA_SYMBOL_LINKAGE_PROGRAM: u32 = 1;

/// `hsa_code_object_reader_create_from_memory(const void*, size_t, hsa_code_object_reader_t*)`:
/// copies the bytes (the client may free them afterwards).
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_code_object_reader_create_from_memory(
    code_object: *const c_void,
    size: usize,
    reader: *mut HsaHandle,
) -> Status {
    with_rt(|rt| {
        if code_object.is_null() || size == 0 || reader.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: the client passes `size` readable bytes at `code_object` (non-null).
        let bytes = unsafe { std::slice::from_raw_parts(code_object as *const u8, size) }.to_vec();
        let h = rt.code.lock().create_reader(bytes);
        // SAFETY: reader is non-null and points to the client's handle storage.
        unsafe { reader.write_unaligned(HsaHandle { handle: h }) };
        HSA_STATUS_SUCCESS
    })
}

/// `hsa_code_object_reader_destroy(hsa_code_object_reader_t)`.
///
/// # Safety
/// None beyond the C contract (no pointers).
#[no_mangle]
pub unsafe extern "C" fn hsa_code_object_reader_destroy(reader: HsaHandle) -> Status {
    with_rt(|rt| rt.code.lock().destroy_reader(reader.handle))
}

/// `hsa_executable_create_alt(profile, rounding mode, options, hsa_executable_t*)`: any
/// profile works for AIE code objects (ROCR's AIE path runs before the profile checks).
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_executable_create_alt(
    profile: u32,
    rounding_mode: u32,
    options: *const c_char,
    executable: *mut HsaHandle,
) -> Status {
    let _ = options;
    with_rt(|rt| {
        if executable.is_null() || profile > 1 || rounding_mode > 2 {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let h = rt.code.lock().create_executable();
        rt.counters.lock().executables_created += 1;
        // SAFETY: executable is non-null and points to the client's handle storage.
        unsafe { executable.write_unaligned(HsaHandle { handle: h }) };
        HSA_STATUS_SUCCESS
    })
}

/// `hsa_executable_load_agent_code_object(exe, agent, reader, options, loaded*)`.
///
/// # Safety
/// Pointer arguments must be NULL or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_executable_load_agent_code_object(
    executable: HsaHandle,
    agent: HsaAgent,
    reader: HsaHandle,
    options: *const c_char,
    loaded: *mut HsaHandle,
) -> Status {
    let _ = options;
    with_rt(|rt| {
        let Some(a) = rt.topo.agent_index(agent.handle) else {
            return HSA_STATUS_ERROR_INVALID_AGENT;
        };
        let s = code_object::load(rt, executable.handle, a, reader.handle);
        if s == HSA_STATUS_SUCCESS && !loaded.is_null() {
            // SAFETY: loaded is non-null and points to the client's handle storage.
            unsafe { loaded.write_unaligned(HsaHandle { handle: 0 }) };
        }
        s
    })
}

/// `hsa_executable_freeze(exe, options)`.
///
/// # Safety
/// Pointer arguments must be NULL or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_executable_freeze(
    executable: HsaHandle,
    options: *const c_char,
) -> Status {
    let _ = options;
    with_rt(|rt| rt.code.lock().freeze(executable.handle))
}

/// `hsa_executable_destroy(exe)`: frees every blob and kernel object of the executable. The
/// counters file is rewritten, so destructions after the last doorbell are in it too.
///
/// # Safety
/// None beyond the C contract (no pointers).
#[no_mangle]
pub unsafe extern "C" fn hsa_executable_destroy(executable: HsaHandle) -> Status {
    with_rt(|rt| {
        let s = code_object::destroy(rt, executable.handle);
        if s == HSA_STATUS_SUCCESS {
            rt.counters.lock().executables_destroyed += 1;
            rt.write_counters();
        }
        s
    })
}

/// `hsa_executable_get_symbol_by_name(exe, name, const hsa_agent_t* agent, symbol*)`: AIE
/// kernels are agent symbols, so a NULL agent finds nothing.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_executable_get_symbol_by_name(
    executable: HsaHandle,
    symbol_name: *const c_char,
    agent: *const HsaAgent,
    symbol: *mut HsaHandle,
) -> Status {
    with_rt(|rt| {
        if symbol_name.is_null() || symbol.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: symbol_name is a non-null NUL-terminated string per the C contract.
        let name = unsafe { CStr::from_ptr(symbol_name) }.to_string_lossy();
        let agent = if agent.is_null() {
            None
        } else {
            // SAFETY: agent is non-null and points to an hsa_agent_t.
            let a = unsafe { agent.read_unaligned() };
            match rt.topo.agent_index(a.handle) {
                Some(i) => Some(i),
                None => return HSA_STATUS_ERROR_INVALID_AGENT,
            }
        };
        match rt
            .code
            .lock()
            .symbol_by_name(executable.handle, &name, agent)
        {
            Ok(h) => {
                // SAFETY: symbol is non-null and points to the client's handle storage.
                unsafe { symbol.write_unaligned(HsaHandle { handle: h }) };
                HSA_STATUS_SUCCESS
            }
            Err(s) => s,
        }
    })
}

/// `hsa_executable_symbol_get_info(symbol, attribute, value)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_executable_symbol_get_info(
    symbol: HsaHandle,
    attribute: u32,
    value: *mut c_void,
) -> Status {
    with_rt(|rt| {
        if value.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let Some(info) = rt.code.lock().symbol_info(symbol.handle) else {
            return HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL;
        };
        // SAFETY: (all writes) value is non-null and points to storage of the attribute's type.
        unsafe {
            match attribute {
                SYMBOL_INFO_TYPE => put::<u32>(value, HSA_SYMBOL_KIND_KERNEL),
                SYMBOL_INFO_NAME_LENGTH => put::<u32>(value, info.name.len() as u32),
                SYMBOL_INFO_NAME => {
                    let n = info.name.len();
                    std::ptr::copy_nonoverlapping(info.name.as_ptr(), value as *mut u8, n);
                }
                SYMBOL_INFO_LINKAGE => put::<u32>(value, HSA_SYMBOL_LINKAGE_PROGRAM),
                SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE => put::<u32>(value, info.kernarg_size),
                SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT => put::<u32>(value, 64),
                SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE | SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE => {
                    put::<u32>(value, 0)
                }
                SYMBOL_INFO_AGENT => put::<u64>(value, rt.topo.agents[info.agent].handle),
                SYMBOL_INFO_KERNEL_OBJECT => put::<u64>(value, info.kernel_object),
                _ => return HSA_STATUS_ERROR_INVALID_ARGUMENT,
            }
        }
        HSA_STATUS_SUCCESS
    })
}
