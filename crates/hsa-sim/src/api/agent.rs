//! hsa_iterate_agents, hsa_agent_get_info.

use super::{put, put_str, visit_each, with_rt, HsaAgent};
use crate::consts::*;
use crate::runtime;
use std::ffi::c_void;

/// `hsa_status_t hsa_iterate_agents(hsa_status_t (*callback)(hsa_agent_t, void*), void* data)`:
/// the CPU agent first, then the AIE agents. A callback status other than SUCCESS stops the
/// walk and is returned.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_iterate_agents(
    callback: Option<unsafe extern "C" fn(HsaAgent, *mut c_void) -> Status>,
    data: *mut c_void,
) -> Status {
    with_rt(|rt| {
        let Some(cb) = callback else {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        };
        let handles: Vec<u64> = rt.topo.agents.iter().map(|a| a.handle).collect();
        // SAFETY: cb is the client's callback with the documented signature.
        unsafe { visit_each(handles, |handle| HsaAgent { handle }, cb, data) }
    })
}

/// `hsa_status_t hsa_agent_get_info(hsa_agent_t agent, hsa_agent_info_t attribute, void* value)`.
///
/// # Safety
/// Pointer arguments must be NULL (refused) or valid for the documented C type.
#[no_mangle]
pub unsafe extern "C" fn hsa_agent_get_info(
    agent: HsaAgent,
    attribute: u32,
    value: *mut c_void,
) -> Status {
    with_rt(|rt| {
        if value.is_null() {
            return HSA_STATUS_ERROR_INVALID_ARGUMENT;
        }
        let Some(idx) = rt.topo.agent_index(agent.handle) else {
            return HSA_STATUS_ERROR_INVALID_AGENT;
        };
        let a = &rt.topo.agents[idx];
        let aie = a.is_aie();
        // SAFETY: (all writes below) value is non-null and, per the HSA contract, points to
        // storage of the attribute's documented type and size.
        unsafe {
            match attribute {
                HSA_AGENT_INFO_NAME => put_str(value, &a.name, 64),
                HSA_AGENT_INFO_VENDOR_NAME => put_str(value, if aie { "AMD" } else { "CPU" }, 64),
                HSA_AGENT_INFO_FEATURE => put::<u32>(
                    value,
                    if aie {
                        HSA_AGENT_FEATURE_AGENT_DISPATCH
                    } else {
                        0
                    },
                ),
                HSA_AGENT_INFO_MACHINE_MODEL => put::<u32>(value, HSA_MACHINE_MODEL_LARGE),
                HSA_AGENT_INFO_PROFILE => put::<u32>(value, HSA_PROFILE_BASE),
                HSA_AGENT_INFO_WAVEFRONT_SIZE
                | HSA_AGENT_INFO_WORKGROUP_MAX_SIZE
                | HSA_AGENT_INFO_GRID_MAX_SIZE
                | HSA_AGENT_INFO_FBARRIER_MAX_SIZE => put::<u32>(value, 0),
                HSA_AGENT_INFO_QUEUES_MAX => put::<u32>(value, if aie { 1 } else { 0 }),
                HSA_AGENT_INFO_QUEUE_MIN_SIZE | HSA_AGENT_INFO_QUEUE_MAX_SIZE => {
                    put::<u32>(value, if aie { AIE_QUEUE_SIZE } else { 0 })
                }
                HSA_AGENT_INFO_QUEUE_TYPE => put::<u32>(value, HSA_QUEUE_TYPE_SINGLE),
                HSA_AGENT_INFO_NODE => put::<u32>(value, 0),
                HSA_AGENT_INFO_DEVICE => put::<u32>(value, a.device_type),
                HSA_AGENT_INFO_CACHE_SIZE => put::<[u32; 4]>(value, [0; 4]),
                HSA_AGENT_INFO_VERSION_MAJOR => put::<u16>(value, 1),
                HSA_AGENT_INFO_VERSION_MINOR => put::<u16>(value, 0),
                HSA_AMD_AGENT_INFO_CHIP_ID
                | HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT
                | HSA_AMD_AGENT_INFO_DRIVER_NODE_ID
                | HSA_AMD_AGENT_INFO_BDFID => put::<u32>(value, 0),
                HSA_AMD_AGENT_INFO_PRODUCT_NAME => {
                    put_str(value, if aie { "AIE-ML" } else { "hsa-sim CPU" }, 64)
                }
                HSA_AMD_AGENT_INFO_UUID => {
                    put_str(value, if aie { "AIE-XX" } else { "CPU-XX" }, 21)
                }
                HSA_AMD_AGENT_INFO_SVM_DIRECT_HOST_ACCESS => put::<bool>(value, true),
                _ => {
                    // ROCR's AIE agent writes a 32-bit 0 before refusing an unknown attribute.
                    put::<u32>(value, 0);
                    return HSA_STATUS_ERROR_INVALID_ARGUMENT;
                }
            }
        }
        HSA_STATUS_SUCCESS
    })
}

/// Looks up an agent index (for the other API modules).
pub(crate) fn agent_index(rt: &runtime::Runtime, agent: HsaAgent) -> Option<usize> {
    rt.topo.agent_index(agent.handle)
}
