//! One private copy of a kernel library per core: the bytes are written to a new temporary file
//! (created with a random name, mode 0600 and `O_EXCL`, so nothing planted at a guessed name is
//! followed or loaded), `dlopen`ed (RTLD_LOCAL, so copies never resolve symbols against each
//! other) and the file is removed at once (the mapping stays). Each copy has its own static data, as each AIE core
//! links its own copy of the core functions.

use std::io::Write;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// A core function wrapper: `void ggml_hsa_emu_<i>(const uint64_t *args)`.
pub type EntryFn = unsafe extern "C" fn(*const u64);

/// The core's cycle counter: `uint64_t ggml_hsa_emu_core_cycles(void)`, the cycles the AIE-API
/// stand-in counted for this copy's calls so far.
pub type CyclesFn = unsafe extern "C" fn() -> u64;

const CYCLES_SYMBOL: &[u8] = b"ggml_hsa_emu_core_cycles";

/// One loaded copy of a kernel library and its entry points (valid while `_lib` is loaded).
#[derive(Debug)]
pub struct CoreLib {
    pub entries: Vec<EntryFn>,
    cycles: Option<CyclesFn>,
    _lib: Library,
}

impl CoreLib {
    /// Loads a private copy of `bytes` and resolves `symbols`.
    pub fn load(bytes: &[u8], symbols: &[String]) -> Result<CoreLib, String> {
        let mut file = tempfile::Builder::new()
            .prefix("hsa-sim-iron-")
            .suffix(".so")
            .tempfile()
            .map_err(|e| format!("cannot create a file for the kernel library: {e}"))?;
        file.write_all(bytes)
            .and_then(|()| file.flush())
            .map_err(|e| {
                format!(
                    "cannot write the kernel library to {}: {e}",
                    file.path().display()
                )
            })?;
        // SAFETY: the library is ours (written just now from the image into a file only we
        // created); its initialisers are those of a C++ kernel library built by the package.
        let lib = unsafe { Library::open(Some(file.path()), RTLD_NOW | RTLD_LOCAL) };
        drop(file);
        let lib = lib.map_err(|e| format!("cannot load the kernel library: {e}"))?;
        let entries = symbols
            .iter()
            .map(|s| {
                // SAFETY: the package generates every ggml_hsa_emu_<i> symbol as
                // `extern "C" void f(const uint64_t *)`, which is EntryFn; the pointer is used
                // only while `_lib` keeps the library loaded.
                unsafe { lib.get::<EntryFn>(s.as_bytes()) }
                    .map(|f| *f)
                    .map_err(|e| format!("the kernel library has no symbol {s}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // SAFETY: the package generates the counter as `extern "C" uint64_t f(void)`, which is
        // CyclesFn; used only while `_lib` keeps the library loaded. Libraries built before the
        // counter existed lack it: their calls then cost no time.
        let cycles = unsafe { lib.get::<CyclesFn>(CYCLES_SYMBOL) }
            .ok()
            .map(|f| *f);
        Ok(CoreLib {
            entries,
            cycles,
            _lib: lib,
        })
    }

    /// Cycles this copy's calls were counted so far (0 without a counter).
    pub fn core_cycles(&self) -> u64 {
        match self.cycles {
            // SAFETY: see `load`; the counter only reads the library's own static data.
            Some(f) => unsafe { f() },
            None => 0,
        }
    }

    pub fn counts_cycles(&self) -> bool {
        self.cycles.is_some()
    }
}
