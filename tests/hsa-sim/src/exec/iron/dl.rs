//! One private copy of a kernel library per core: the bytes are written to a temporary file,
//! `dlopen`ed (RTLD_LOCAL, so copies never resolve symbols against each other) and the file is
//! removed at once (the mapping stays). Each copy has its own static data, as each AIE core
//! links its own copy of the core functions.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};

#[link(name = "dl")]
extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlclose(handle: *mut c_void) -> c_int;
    fn dlerror() -> *mut c_char;
}

const RTLD_NOW: c_int = 2;
const RTLD_LOCAL: c_int = 0;

/// A core function wrapper: `void ggml_hsa_emu_<i>(const uint64_t *args)`.
pub type EntryFn = unsafe extern "C" fn(*const u64);

static SERIAL: AtomicU64 = AtomicU64::new(0);

/// One loaded copy of a kernel library and its entry points.
#[derive(Debug)]
pub struct CoreLib {
    handle: *mut c_void,
    pub entries: Vec<EntryFn>,
}

// SAFETY: the handle is only used for dlsym (done at load) and dlclose (in Drop); the entry
// points are plain functions, called by one thread at a time (the loaded program is behind a
// mutex).
unsafe impl Send for CoreLib {}

fn last_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, valid until the
    // next dl* call on this thread; it is copied at once.
    unsafe {
        let e = dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl CoreLib {
    /// Loads a private copy of `bytes` and resolves `symbols`.
    pub fn load(bytes: &[u8], symbols: &[String]) -> Result<CoreLib, String> {
        let n = SERIAL.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("hsa-sim-iron-{}-{n}.so", std::process::id()));
        std::fs::write(&path, bytes)
            .map_err(|e| format!("cannot write the kernel library to {}: {e}", path.display()))?;
        let cpath = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| "temporary path with a NUL byte".to_string())?;
        // SAFETY: cpath is a valid NUL-terminated path; the library is ours (written just now
        // from the image); its initialisers are those of a C++ kernel built by the package.
        let handle = unsafe { dlopen(cpath.as_ptr(), RTLD_NOW | RTLD_LOCAL) };
        let err = handle.is_null().then(last_error);
        let _ = std::fs::remove_file(&path);
        if let Some(e) = err {
            return Err(format!("cannot load the kernel library: {e}"));
        }
        let mut lib = CoreLib {
            handle,
            entries: Vec::with_capacity(symbols.len()),
        };
        for s in symbols {
            let cs = CString::new(s.as_str()).map_err(|_| format!("symbol {s:?} has a NUL"))?;
            // SAFETY: handle is a live dlopen handle, cs a NUL-terminated symbol name.
            let p = unsafe { dlsym(lib.handle, cs.as_ptr()) };
            if p.is_null() {
                return Err(format!("the kernel library has no symbol {s}"));
            }
            // SAFETY: the package generates every ggml_hsa_emu_<i> symbol as
            // `extern "C" void f(const uint64_t *)`, which is EntryFn.
            lib.entries
                .push(unsafe { std::mem::transmute::<*mut c_void, EntryFn>(p) });
        }
        Ok(lib)
    }
}

impl Drop for CoreLib {
    fn drop(&mut self) {
        // SAFETY: the handle came from dlopen and is closed once; no entry point of it is
        // running or used afterwards (they are dropped with self).
        unsafe {
            dlclose(self.handle);
        }
    }
}
