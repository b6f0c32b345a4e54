//! AIE code objects (packet ABI `c`): an hsaco is loaded through the code object reader and
//! executable API, and each kernel is then named in packets by the kernel object of its symbol.
//!
//! Load sequence (ROCR's AIE path): `hsa_code_object_reader_create_from_memory`,
//! `hsa_executable_create_alt`, `hsa_executable_load_agent_code_object` for the AIE agent,
//! `hsa_executable_freeze`, then per kernel `hsa_executable_get_symbol_by_name` **with the
//! agent** (AIE kernels are agent symbols) and `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT`. ROCR
//! copies the blobs at load time, so the reader is destroyed right after loading. The
//! [`Executable`] is destroyed on drop; whoever dispatches its kernel objects keeps it alive
//! (an `Arc`) until those dispatches have completed.

use std::ffi::CString;
use std::sync::Arc;

use super::error::HsaError;
use super::runtime::Runtime;
use super::sys::*;

/// A frozen executable, destroyed on drop.
#[derive(Debug)]
pub struct Executable {
    runtime: &'static Runtime,
    handle: hsa_executable_t,
}

/// One kernel of a loaded executable: what a generation-c packet names.
#[derive(Debug, Clone)]
pub struct KernelObject {
    pub executable: Arc<Executable>,
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT`: non-zero, opaque.
    pub handle: u64,
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE`.
    pub kernarg_size: u32,
}

impl Drop for Executable {
    fn drop(&mut self) {
        if let Some(destroy) = self.runtime.api().hsa_executable_destroy {
            // SAFETY: the handle came from hsa_executable_create_alt and is destroyed only here.
            let _ = unsafe { destroy(self.handle) };
        }
    }
}

fn missing(runtime: &Runtime, symbol: &'static str) -> HsaError {
    HsaError::MissingSymbol {
        library: runtime.library().to_owned(),
        symbol,
        reason: "needed for packet ABI c (AIE code objects)".into(),
    }
}

/// Reads one optional symbol of the table or fails naming it.
macro_rules! sym {
    ($rt:expr, $name:ident) => {
        $rt.api()
            .$name
            .ok_or_else(|| missing($rt, stringify!($name)))?
    };
}

impl Runtime {
    /// Whether the runtime exports the code object and executable entry points.
    pub fn has_code_object_api(&self) -> bool {
        let a = self.api();
        a.hsa_code_object_reader_create_from_memory.is_some()
            && a.hsa_code_object_reader_destroy.is_some()
            && a.hsa_executable_create_alt.is_some()
            && a.hsa_executable_load_agent_code_object.is_some()
            && a.hsa_executable_freeze.is_some()
            && a.hsa_executable_destroy.is_some()
            && a.hsa_executable_get_symbol_by_name.is_some()
            && a.hsa_executable_symbol_get_info.is_some()
    }

    /// Loads the AIE code object `hsaco` for `agent`, freezes it and returns the kernel objects
    /// of `names`, in order (all sharing the one executable).
    pub fn load_code_object(
        &'static self,
        agent: hsa_agent_t,
        hsaco: &[u8],
        names: &[&str],
    ) -> Result<Vec<KernelObject>, HsaError> {
        let create_reader = sym!(self, hsa_code_object_reader_create_from_memory);
        let destroy_reader = sym!(self, hsa_code_object_reader_destroy);
        let create_exe = sym!(self, hsa_executable_create_alt);
        let load = sym!(self, hsa_executable_load_agent_code_object);
        let freeze = sym!(self, hsa_executable_freeze);
        let _ = sym!(self, hsa_executable_destroy);
        let by_name = sym!(self, hsa_executable_get_symbol_by_name);
        let get_info = sym!(self, hsa_executable_symbol_get_info);

        let mut handle = hsa_executable_t::default();
        // SAFETY: `handle` is a valid out-pointer; options may be NULL.
        let rc = unsafe {
            create_exe(
                HSA_PROFILE_FULL,
                HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT,
                std::ptr::null(),
                &mut handle,
            )
        };
        self.check("hsa_executable_create_alt", rc)?;
        // From here on the executable is destroyed on every error path.
        let exe = Arc::new(Executable {
            runtime: self,
            handle,
        });
        let mut reader = hsa_code_object_reader_t::default();
        // SAFETY: `hsaco` is readable for its length; the runtime copies what it keeps.
        let rc = unsafe { create_reader(hsaco.as_ptr().cast(), hsaco.len(), &mut reader) };
        self.check("hsa_code_object_reader_create_from_memory", rc)?;
        // SAFETY: live executable and reader; NULL options and loaded-code-object pointer.
        let rc = unsafe {
            load(
                handle,
                agent,
                reader,
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        };
        // SAFETY: the reader is live and no longer needed (ROCR copied the blobs).
        let _ = unsafe { destroy_reader(reader) };
        self.check("hsa_executable_load_agent_code_object", rc)?;
        // SAFETY: live executable; NULL options.
        let rc = unsafe { freeze(handle, std::ptr::null()) };
        self.check("hsa_executable_freeze", rc)?;
        names
            .iter()
            .map(|name| {
                let cname = CString::new(*name).map_err(|_| HsaError::Call {
                    call: "hsa_executable_get_symbol_by_name",
                    status: HSA_STATUS_ERROR_INVALID_SYMBOL_NAME,
                    description: format!("kernel name {name:?} contains NUL"),
                })?;
                let mut symbol = hsa_executable_symbol_t::default();
                // SAFETY: live executable, NUL-terminated name, the agent by pointer, out-pointer.
                let rc = unsafe { by_name(handle, cname.as_ptr(), &agent, &mut symbol) };
                self.check("hsa_executable_get_symbol_by_name", rc)?;
                let mut kernel_object: u64 = 0;
                // SAFETY: KERNEL_OBJECT writes one u64.
                let rc = unsafe {
                    get_info(
                        symbol,
                        HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT,
                        (&mut kernel_object as *mut u64).cast(),
                    )
                };
                self.check("hsa_executable_symbol_get_info(KERNEL_OBJECT)", rc)?;
                let mut kernarg_size: u32 = 0;
                // SAFETY: KERNARG_SEGMENT_SIZE writes one u32.
                let rc = unsafe {
                    get_info(
                        symbol,
                        HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE,
                        (&mut kernarg_size as *mut u32).cast(),
                    )
                };
                self.check("hsa_executable_symbol_get_info(KERNARG_SEGMENT_SIZE)", rc)?;
                if kernel_object == 0 {
                    return Err(HsaError::Call {
                        call: "hsa_executable_symbol_get_info(KERNEL_OBJECT)",
                        status: HSA_STATUS_ERROR_INVALID_EXECUTABLE,
                        description: format!("kernel {name}: the runtime returned kernel object 0"),
                    });
                }
                Ok(KernelObject {
                    executable: exe.clone(),
                    handle: kernel_object,
                    kernarg_size,
                })
            })
            .collect()
    }

    /// The ABI c probe: loads a tiny AIE hsaco (dummy PDI and instruction stream; the loader
    /// checks structure, not contents) for `agent`. Only a generation-c runtime gives a
    /// non-zero kernel object; older ones refuse the code object. Nothing is dispatched, and
    /// the executable is destroyed before returning.
    pub fn probe_code_objects(&'static self, agent: hsa_agent_t, arch: &str) -> bool {
        if !self.has_code_object_api() {
            return false;
        }
        let Ok(hsaco) = aie_hsaco::write_single(arch, "ggml_hsa_probe", &[0; 16], &[0; 4], 1, 1)
        else {
            return false;
        };
        self.load_code_object(agent, &hsaco, &["ggml_hsa_probe"])
            .is_ok_and(|k| k.iter().all(|k| k.handle != 0))
    }
}
