//! Memory pools: iterate, get_info, allocate, free, allow_access.

use super::{agent::agent_index, put, visit_each, with_rt, HsaAgent, HsaPool};
use crate::consts::*;
use std::ffi::c_void;

/// `hsa_status_t hsa_amd_agent_iterate_memory_pools(hsa_agent_t agent,
///     hsa_status_t (*callback)(hsa_amd_memory_pool_t, void*), void* data)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_amd_agent_iterate_memory_pools(
    agent: HsaAgent,
    callback: Option<unsafe extern "C" fn(HsaPool, *mut c_void) -> Status>,
    data: *mut c_void,
) -> Status {
    with_rt(|rt| {
        let Some(cb) = callback else {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        };
        let Some(a) = agent_index(rt, agent) else {
            return HSA_STATUS_ERROR_INVALID_AGENT;
        };
        let handles: Vec<u64> = rt.topo.agents[a]
            .pools
            .iter()
            .map(|&p| rt.topo.pools[p].handle)
            .collect();
        // SAFETY: cb is the client's callback with the documented signature.
        unsafe { visit_each(handles, |handle| HsaPool { handle }, cb, data) }
    })
}

/// `hsa_status_t hsa_amd_memory_pool_get_info(hsa_amd_memory_pool_t pool,
///     hsa_amd_memory_pool_info_t attribute, void* value)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_amd_memory_pool_get_info(
    pool: HsaPool,
    attribute: u32,
    value: *mut c_void,
) -> Status {
    with_rt(|rt| {
        if value.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let Some(p) = rt.topo.pool_index(pool.handle) else {
            return HSA_STATUS_ERROR_INVALID_MEMORY_POOL;
        };
        let p = &rt.topo.pools[p];
        // SAFETY: (all writes below) value is non-null and, per the HSA contract, points to
        // storage of the attribute's documented type (u32 enums/flags, size_t sizes, bool).
        unsafe {
            match attribute {
                HSA_AMD_MEMORY_POOL_INFO_SEGMENT => put::<u32>(value, HSA_AMD_SEGMENT_GLOBAL),
                HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS => put::<u32>(value, p.flags),
                HSA_AMD_MEMORY_POOL_INFO_SIZE => put::<usize>(value, p.size),
                HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED => put::<bool>(value, true),
                HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE
                | HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT => {
                    put::<usize>(value, PAGE_SIZE)
                }
                HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL => put::<bool>(value, true),
                HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE => put::<usize>(value, p.alloc_max),
                HSA_AMD_MEMORY_POOL_INFO_LOCATION => {
                    put::<u32>(value, HSA_AMD_MEMORY_POOL_LOCATION_CPU)
                }
                HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_REC_GRANULE => {
                    put::<usize>(value, p.rec_granule)
                }
                _ => return HSA_STATUS_ERROR_INVALID_ARGUMENT,
            }
        }
        HSA_STATUS_SUCCESS
    })
}

/// `hsa_status_t hsa_amd_agent_memory_pool_get_info(hsa_agent_t agent, hsa_amd_memory_pool_t
///     pool, hsa_amd_agent_memory_pool_info_t attribute, void* value)`: ACCESS only
/// (ALLOWED_BY_DEFAULT: all pools are host memory visible to every agent).
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_amd_agent_memory_pool_get_info(
    agent: HsaAgent,
    pool: HsaPool,
    attribute: u32,
    value: *mut c_void,
) -> Status {
    with_rt(|rt| {
        if value.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        if agent_index(rt, agent).is_none() {
            return HSA_STATUS_ERROR_INVALID_AGENT;
        }
        if rt.topo.pool_index(pool.handle).is_none() {
            return HSA_STATUS_ERROR_INVALID_MEMORY_POOL;
        }
        match attribute {
            HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS => {
                // SAFETY: value is non-null and points to a 32-bit hsa_amd_memory_pool_access_t.
                unsafe { put::<u32>(value, HSA_AMD_MEMORY_POOL_ACCESS_ALLOWED_BY_DEFAULT) };
                HSA_STATUS_SUCCESS
            }
            _ => HSA_STATUS_ERROR_INVALID_ARGUMENT,
        }
    })
}

/// `hsa_status_t hsa_amd_memory_pool_allocate(hsa_amd_memory_pool_t pool, size_t size,
///     uint32_t flags, void** ptr)`: page-aligned, zeroed, size rounded up to 4096.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_amd_memory_pool_allocate(
    pool: HsaPool,
    size: usize,
    flags: u32,
    ptr: *mut *mut c_void,
) -> Status {
    let _ = flags; // PCIE / CONTIGUOUS / EXECUTABLE are meaningless for XDNA.
    with_rt(|rt| {
        if size == 0 || ptr.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let Some(p) = rt.topo.pool_index(pool.handle) else {
            return HSA_STATUS_ERROR_INVALID_MEMORY_POOL;
        };
        match rt.allocate(p, size, false) {
            Ok(base) => {
                // SAFETY: ptr is non-null (checked) and points to the client's `void*`.
                unsafe { ptr.write_unaligned(base as *mut c_void) };
                HSA_STATUS_SUCCESS
            }
            Err(s) => s,
        }
    })
}

fn free_impl(ptr: *mut c_void) -> Status {
    with_rt(|rt| {
        if ptr.is_null() {
            return HSA_STATUS_SUCCESS;
        }
        if rt.memory.lock().free(ptr as usize, false) {
            HSA_STATUS_SUCCESS
        } else {
            HSA_STATUS_ERROR_INVALID_ALLOCATION
        }
    })
}

/// `hsa_status_t hsa_amd_memory_pool_free(void* ptr)`: NULL is SUCCESS; anything but the exact
/// base of a live allocation is INVALID_ALLOCATION.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_amd_memory_pool_free(ptr: *mut c_void) -> Status {
    free_impl(ptr)
}

/// `hsa_status_t hsa_memory_free(void* ptr)`: same as hsa_amd_memory_pool_free.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_memory_free(ptr: *mut c_void) -> Status {
    free_impl(ptr)
}

/// `hsa_status_t hsa_amd_agents_allow_access(uint32_t num_agents, const hsa_agent_t* agents,
///     const uint32_t* flags, const void* ptr)`: any AIE agent -> INVALID_AGENT (as ROCR);
/// with CPU agents only it succeeds and does nothing.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_amd_agents_allow_access(
    num_agents: u32,
    agents: *const HsaAgent,
    flags: *const u32,
    ptr: *const c_void,
) -> Status {
    with_rt(|rt| {
        if num_agents == 0 || agents.is_null() || !flags.is_null() || ptr.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        for i in 0..num_agents as usize {
            // SAFETY: agents is non-null and the client guarantees num_agents elements.
            let a = unsafe { agents.add(i).read_unaligned() };
            match agent_index(rt, a) {
                None => return HSA_STATUS_ERROR_INVALID_AGENT,
                Some(idx) if rt.topo.agents[idx].is_aie() => return HSA_STATUS_ERROR_INVALID_AGENT,
                Some(_) => {}
            }
        }
        if rt.memory.lock().lookup(ptr as usize).is_none() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        HSA_STATUS_SUCCESS
    })
}
