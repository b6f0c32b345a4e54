//! Loads the built plugin (`libggml_hsa.so`) with dlopen, as ggml does, and checks its exported
//! symbols and its behaviour without a usable HSA runtime.

mod common;

use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;

use ggml_hsa::ffi::sys;
use libloading::Library;

const EXPORTS: &[&str] = &[
    "ggml_backend_init",
    "ggml_backend_score",
    "ggml_backend_hsa_init",
    "ggml_backend_is_hsa",
    "ggml_backend_hsa_buffer_type",
    "ggml_backend_hsa_host_buffer_type",
    "ggml_backend_hsa_get_device_count",
    "ggml_backend_hsa_get_device_description",
    "ggml_backend_hsa_get_device_memory",
    "ggml_backend_hsa_register_host_buffer",
    "ggml_backend_hsa_unregister_host_buffer",
    "ggml_backend_hsa_reg",
];

static LOG: Mutex<String> = Mutex::new(String::new());

unsafe extern "C" fn capture_log(_level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    // SAFETY: ggml passes a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    LOG.lock().unwrap().push_str(&text);
}

fn sym<T: Copy>(lib: &Library, name: &str) -> T {
    // SAFETY: the caller names the type of an exported function of the plugin.
    unsafe { *lib.get::<T>(name.as_bytes()).unwrap() }
}

#[test]
fn exports_every_public_function() {
    // SAFETY: loading the plugin runs no initialisers with side effects.
    let lib = unsafe { Library::new(common::plugin_path()) }.unwrap();
    for name in EXPORTS {
        // SAFETY: only the presence of the symbol is checked; it is never called.
        let found = unsafe { lib.get::<*const c_void>(name.as_bytes()) }.is_ok();
        assert!(found, "missing {name}");
    }
}

/// One test, because the plugin reads the environment once per process.
#[test]
fn without_an_hsa_runtime_the_backend_has_no_device_and_says_why() {
    let missing = common::scratch_dir("no-hsa").join("libhsa-runtime64.so.1");
    // SAFETY: no other test of this binary reads or writes the environment concurrently (the other
    // test only dlopens the plugin, which does not read it).
    std::env::set_var("GGML_HSA_LIBHSA_PATH", &missing);
    // SAFETY: capture_log matches ggml_log_callback and stays valid for the whole process.
    unsafe { sys::ggml_log_set(Some(capture_log), std::ptr::null_mut()) };

    // SAFETY: loading the plugin runs no initialisers with side effects.
    let lib = unsafe { Library::new(common::plugin_path()) }.unwrap();
    type Init = unsafe extern "C" fn() -> sys::ggml_backend_reg_t;
    type Score = unsafe extern "C" fn() -> i32;
    type Count = unsafe extern "C" fn() -> i32;
    type HsaInit = unsafe extern "C" fn(i32) -> sys::ggml_backend_t;
    type Buft = unsafe extern "C" fn(i32) -> sys::ggml_backend_buffer_type_t;
    type HostBuft = unsafe extern "C" fn() -> sys::ggml_backend_buffer_type_t;
    type Desc = unsafe extern "C" fn(i32, *mut c_char, usize);
    type Mem = unsafe extern "C" fn(i32, *mut usize, *mut usize);
    type IsHsa = unsafe extern "C" fn(sys::ggml_backend_t) -> bool;
    type Register = unsafe extern "C" fn(*mut c_void, usize) -> bool;

    // SAFETY: each symbol below is called with the C signature of include/ggml-hsa.h and valid
    // arguments; the registry pointer is checked non-NULL before its table is read.
    unsafe {
        assert_eq!(sym::<Score>(&lib, "ggml_backend_score")(), 0);

        let reg = sym::<Init>(&lib, "ggml_backend_init")();
        assert!(
            !reg.is_null(),
            "ggml_backend_init declined although ggml matches"
        );
        assert_eq!(
            reg,
            sym::<Init>(&lib, "ggml_backend_init")(),
            "not the same reg"
        );
        assert_eq!(reg, sym::<Init>(&lib, "ggml_backend_hsa_reg")());
        assert_eq!((*reg).api_version, sys::GGML_BACKEND_API_VERSION as i32);
        let name = CStr::from_ptr((*reg).iface.get_name.unwrap()(reg));
        assert_eq!(name.to_str().unwrap(), "HSA");
        assert_eq!((*reg).iface.get_device_count.unwrap()(reg), 0);
        assert!((*reg).iface.get_device.unwrap()(reg, 0).is_null());
        let proc_address = (*reg).iface.get_proc_address.unwrap();
        assert!(!proc_address(reg, c"ggml_backend_register_host_buffer".as_ptr()).is_null());
        assert!(proc_address(reg, c"ggml_backend_no_such_function".as_ptr()).is_null());
        assert!(proc_address(reg, std::ptr::null()).is_null());

        assert_eq!(sym::<Count>(&lib, "ggml_backend_hsa_get_device_count")(), 0);
        assert!(sym::<HsaInit>(&lib, "ggml_backend_hsa_init")(0).is_null());
        assert!(sym::<HsaInit>(&lib, "ggml_backend_hsa_init")(-1).is_null());
        assert!(sym::<Buft>(&lib, "ggml_backend_hsa_buffer_type")(0).is_null());
        assert!(sym::<HostBuft>(&lib, "ggml_backend_hsa_host_buffer_type")().is_null());
        assert!(!sym::<IsHsa>(&lib, "ggml_backend_is_hsa")(
            std::ptr::null_mut()
        ));

        let mut desc = [b'x' as c_char; 16];
        let describe = sym::<Desc>(&lib, "ggml_backend_hsa_get_device_description");
        describe(0, desc.as_mut_ptr(), desc.len());
        assert_eq!(desc[0], 0);
        describe(0, std::ptr::null_mut(), 0);

        let (mut free, mut total) = (7usize, 7usize);
        let memory = sym::<Mem>(&lib, "ggml_backend_hsa_get_device_memory");
        memory(0, &mut free, &mut total);
        assert_eq!((free, total), (0, 0));
        memory(0, std::ptr::null_mut(), std::ptr::null_mut());

        let mut buffer = [0u8; 64];
        let register = sym::<Register>(&lib, "ggml_backend_hsa_register_host_buffer");
        assert!(!register(buffer.as_mut_ptr().cast(), buffer.len()));
    }

    let log = LOG.lock().unwrap().clone();
    let reason: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("HSA: no device available"))
        .collect();
    assert_eq!(reason.len(), 1, "the reason is logged exactly once:\n{log}");
    assert!(
        reason[0].contains(&missing.display().to_string()) && reason[0].contains("no such file"),
        "the reason names the path tried:\n{log}"
    );
    assert!(
        log.contains("ggml_backend_hsa_init: no HSA device 0"),
        "{log}"
    );
}
