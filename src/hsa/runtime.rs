//! The process-wide HSA runtime: loaded, resolved and initialised once, never shut down.
//!
//! The outcome is cached, failure included, so a missing runtime is probed once per process.
//! `hsa_shut_down` is never called and the library never unloaded: ROCR's worker threads may
//! outlive any ggml object, and unloading at exit has crashed other ROCR clients.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::OnceLock;

use super::api::HsaApi;
use super::error::HsaError;
use super::loader;
use super::status;
use super::sys::*;

#[derive(Debug)]
pub struct Runtime {
    api: HsaApi,
    /// System timestamp ticks per millisecond, for wait hints (read once at open).
    pub(super) ticks_per_ms: u64,
}

/// What an agent reports about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDesc {
    pub agent: hsa_agent_t,
    pub name: String,
    pub device_type: hsa_device_type_t,
}

static RUNTIME: OnceLock<Result<Runtime, HsaError>> = OnceLock::new();

/// The runtime, opened on first use from `explicit_path` (or the default search when `None`).
/// Later calls return the first outcome whatever path they pass.
pub fn get(explicit_path: Option<&Path>) -> Result<&'static Runtime, &'static HsaError> {
    RUNTIME
        .get_or_init(|| Runtime::open(&loader::default_candidates(explicit_path)))
        .as_ref()
}

impl Runtime {
    /// Loads the first usable library of `candidates`, resolves the symbol table and calls
    /// `hsa_init`.
    pub fn open(candidates: &[loader::Candidate]) -> Result<Runtime, HsaError> {
        let (library, path) = loader::open(candidates)?;
        // SAFETY: the library was found by the HSA search and is never unloaded (ManuallyDrop,
        // kept for the process lifetime by the caller's static).
        let api = unsafe { HsaApi::resolve(&library, &path) }?;
        let mut runtime = Runtime {
            api,
            ticks_per_ms: 0,
        };
        // SAFETY: hsa_init takes no arguments; it is reference counted and safe to call once per
        // process here.
        let status = unsafe { (runtime.api.hsa_init)() };
        runtime.check("hsa_init", status)?;
        runtime.ticks_per_ms = runtime.query_ticks_per_ms();
        Ok(runtime)
    }

    /// System timestamp ticks per millisecond; 1 ms at 1 GHz when the runtime cannot say.
    fn query_ticks_per_ms(&self) -> u64 {
        let Some(get_info) = self.api.hsa_system_get_info else {
            return 1_000_000;
        };
        let mut freq: u64 = 0;
        // SAFETY: HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY writes one u64.
        let rc = unsafe {
            get_info(
                HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY,
                (&mut freq as *mut u64).cast(),
            )
        };
        if rc == HSA_STATUS_SUCCESS && freq >= 1000 {
            freq / 1000
        } else {
            1_000_000
        }
    }

    /// `HSA_AMD_INTERFACE_VERSION_MINOR` of the runtime (`hsa_system_get_info(0x208)`, a
    /// `uint16_t`), or `None` when the runtime does not say.
    pub fn interface_minor(&self) -> Option<u16> {
        let get_info = self.api.hsa_system_get_info?;
        // 8 zeroed bytes: older runtimes write 16 bits, a careless one might write more.
        let mut value: u64 = 0;
        // SAFETY: the attribute writes a uint16_t; `value` has room for 8 bytes.
        let rc = unsafe {
            get_info(
                HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR,
                (&mut value as *mut u64).cast(),
            )
        };
        (rc == HSA_STATUS_SUCCESS).then_some(value as u16)
    }

    /// The library the runtime was loaded from.
    pub fn library(&self) -> &Path {
        &self.api.library
    }

    /// The resolved symbol table.
    pub(super) fn api(&self) -> &HsaApi {
        &self.api
    }

    /// Turns a status into `Ok` or a typed error carrying the runtime's description.
    pub(super) fn check(&self, call: &'static str, status: hsa_status_t) -> Result<(), HsaError> {
        if status == HSA_STATUS_SUCCESS || status == HSA_STATUS_INFO_BREAK {
            return Ok(());
        }
        Err(HsaError::Call {
            call,
            status,
            description: self.status_text(status),
        })
    }

    fn status_text(&self, status: hsa_status_t) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: hsa_status_string writes a pointer to a static string into `text`.
        let rc = unsafe { (self.api.hsa_status_string)(status, &mut text) };
        if rc == HSA_STATUS_SUCCESS && !text.is_null() {
            // SAFETY: a successful call leaves a NUL-terminated static string.
            let s = unsafe { CStr::from_ptr(text) }.to_string_lossy();
            // ROCR's texts start with the status name; keep only the explanation.
            let s = s.split_once(": ").map_or(&*s, |(_, rest)| rest);
            return s.trim().to_owned();
        }
        status::description(status).to_owned()
    }

    /// Every agent the runtime reports, in its order.
    pub fn agents(&self) -> Result<Vec<AgentDesc>, HsaError> {
        let mut handles = Vec::new();
        self.iterate_agents(|agent| handles.push(agent))?;
        handles
            .into_iter()
            .map(|agent| {
                Ok(AgentDesc {
                    agent,
                    name: self.agent_name(agent)?,
                    device_type: self.agent_device_type(agent)?,
                })
            })
            .collect()
    }

    fn agent_name(&self, agent: hsa_agent_t) -> Result<String, HsaError> {
        let mut name = [0u8; AGENT_NAME_LEN];
        // SAFETY: HSA_AGENT_INFO_NAME writes at most 64 bytes into the buffer.
        let rc = unsafe {
            (self.api.hsa_agent_get_info)(agent, HSA_AGENT_INFO_NAME, name.as_mut_ptr().cast())
        };
        self.check("hsa_agent_get_info(HSA_AGENT_INFO_NAME)", rc)?;
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        Ok(String::from_utf8_lossy(&name[..len]).into_owned())
    }

    fn agent_device_type(&self, agent: hsa_agent_t) -> Result<hsa_device_type_t, HsaError> {
        let mut device_type: hsa_device_type_t = u32::MAX;
        // SAFETY: HSA_AGENT_INFO_DEVICE writes one 32-bit enum.
        let rc = unsafe {
            (self.api.hsa_agent_get_info)(
                agent,
                HSA_AGENT_INFO_DEVICE,
                (&mut device_type as *mut hsa_device_type_t).cast(),
            )
        };
        self.check("hsa_agent_get_info(HSA_AGENT_INFO_DEVICE)", rc)?;
        Ok(device_type)
    }

    /// Calls `visit` for each agent.
    fn iterate_agents(&self, visit: impl FnMut(hsa_agent_t)) -> Result<(), HsaError> {
        let iterate = self.api.hsa_iterate_agents;
        iterate_handles("hsa_iterate_agents", visit, |callback, data| {
            // SAFETY: callback matches the agent-callback type and `data` outlives the call.
            unsafe { iterate(Some(callback), data) }
        })
        .and_then(|rc| self.check("hsa_iterate_agents", rc))
    }

    /// Calls `visit` for each memory pool of `agent`.
    pub(super) fn iterate_pools(
        &self,
        agent: hsa_agent_t,
        visit: impl FnMut(hsa_amd_memory_pool_t),
    ) -> Result<(), HsaError> {
        let iterate = self.api.hsa_amd_agent_iterate_memory_pools;
        iterate_handles(
            "hsa_amd_agent_iterate_memory_pools",
            visit,
            |callback, data| {
                // SAFETY: callback matches the pool-callback type and `data` outlives the call.
                unsafe { iterate(agent, Some(callback), data) }
            },
        )
        .and_then(|rc| self.check("hsa_amd_agent_iterate_memory_pools", rc))
    }
}

/// Runs an HSA iteration (`call` invokes the C function with a callback and its data pointer) and
/// hands each handle to `visit`. A panic in `visit` stops the iteration and becomes an error
/// instead of unwinding through the runtime's C frames.
fn iterate_handles<H: Copy>(
    name: &'static str,
    mut visit: impl FnMut(H),
    call: impl FnOnce(unsafe extern "C" fn(H, *mut c_void) -> hsa_status_t, *mut c_void) -> hsa_status_t,
) -> Result<hsa_status_t, HsaError> {
    struct State<'a, H> {
        visit: &'a mut dyn FnMut(H),
        panic: Option<String>,
    }
    unsafe extern "C" fn trampoline<H>(handle: H, data: *mut c_void) -> hsa_status_t {
        // SAFETY: `data` is the `State<H>` passed to the iteration below, alive and not otherwise
        // borrowed for the duration of the call.
        let state = unsafe { &mut *data.cast::<State<'_, H>>() };
        match catch_unwind(AssertUnwindSafe(|| (state.visit)(handle))) {
            Ok(()) => HSA_STATUS_SUCCESS,
            Err(payload) => {
                state.panic = Some(
                    payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_default(),
                );
                HSA_STATUS_ERROR
            }
        }
    }
    let mut state = State {
        visit: &mut visit,
        panic: None,
    };
    let rc = call(trampoline::<H>, (&mut state as *mut State<'_, H>).cast());
    match state.panic {
        Some(message) => Err(HsaError::CallbackPanic {
            call: name,
            message,
        }),
        None => Ok(rc),
    }
}
