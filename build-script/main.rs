//! Generates the ggml bindings from the ggml tree this plugin is built against, records that tree's
//! version and commit, and links `libggml-base`.
//!
//! ggml's backend tables change without an API-version bump, so the bindings are never committed:
//! they are regenerated here from the exact headers of the tree being built (architecture §3).
//!
//! Inputs (environment):
//! * `GGML_HSA_GGML_DIR`: the ggml source tree (with `include/` and `src/`). Default: the tree that
//!   `scripts/llama-cpp.sh build` unpacks into its cache.
//! * `GGML_HSA_GGML_LIB_DIR`: the directory holding `libggml-base.so`. Default: that cache's
//!   `build/bin`.
//! * `GGML_HSA_GGML_VERSION`, `GGML_HSA_GGML_COMMIT`: what `ggml_version()`/`ggml_commit()` of the
//!   library will return. Default: asked of the `libggml-base.so` in the lib dir.
//! * `GGML_HSA_RPATH`: `0` to leave the lib dir out of the run path (installed builds).
//! * `GGML_HSA_LINK`: `dylib` (default: link `libggml-base.so`, the plugin case) or `static` (the
//!   crate becomes a static archive linked into a `GGML_BACKEND_DL=OFF` ggml next to
//!   `libggml-base.a`; `GGML_HSA_GGML_VERSION`/`_COMMIT` must then be given).
//! * `GGML_HSA_ROCR_INCLUDE_DIR`: a ROCR include directory (CMake finds it through
//!   `hsa-runtime64_DIR`). When it holds `hsa/hsa.h`, the HSA declarations of `src/hsa/sys.rs`
//!   are checked against it at compile time (values of every constant and sizes of every struct
//!   the headers also declare).
//!
//! Read by the crate itself (`option_env!`): `GGML_HSA_JIT_COMPILE`, `GGML_HSA_IRON_PYTHONPATH`,
//! `GGML_HSA_CPU_FALLBACK`, `GGML_HSA_ROCR_LIB_DIR` (all set by the CMake shim in `cmake/`).

use std::env;
use std::ffi::CStr;
use std::fs;
use std::path::{Path, PathBuf};

mod op_catalogue_codegen;

const HOW_TO_GET_GGML: &str = "run `scripts/llama-cpp.sh build` (fetches and builds the pinned \
     llama.cpp), or set GGML_HSA_GGML_DIR to a ggml source tree (the directory with include/ and \
     src/) and GGML_HSA_GGML_LIB_DIR to the directory holding its libggml-base.so";

fn main() {
    for var in [
        "GGML_HSA_GGML_DIR",
        "GGML_HSA_GGML_LIB_DIR",
        "GGML_HSA_GGML_VERSION",
        "GGML_HSA_GGML_COMMIT",
        "GGML_HSA_RPATH",
        "GGML_HSA_LINK",
        "GGML_HSA_ROCR_INCLUDE_DIR",
        "GGML_HSA_JIT_COMPILE",
        "GGML_HSA_IRON_PYTHONPATH",
        "GGML_HSA_CPU_FALLBACK",
        "GGML_HSA_ROCR_LIB_DIR",
        "GGML_HSA_BUILD_CACHE",
        "XDG_CACHE_HOME",
        "HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=scripts/llama-cpp.pin");
    println!("cargo:rerun-if-changed=build-script");

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let catalogue = manifest_dir.join("src/op_catalogue.toml");
    println!("cargo:rerun-if-changed={}", catalogue.display());
    match op_catalogue_codegen::generate(&catalogue) {
        Ok(code) => write_out("op_catalogue.rs", &code),
        Err(e) => fail(&format!("the op catalogue is invalid: {e}")),
    }

    let default_root = default_llama_root();
    let ggml_dir = env::var_os("GGML_HSA_GGML_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| default_root.join("src/ggml"));
    let lib_dir = env::var_os("GGML_HSA_GGML_LIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| default_root.join("build/bin"));

    let include_dir = ggml_dir.join("include");
    let private_dir = ggml_dir.join("src");
    let headers = [
        include_dir.join("ggml.h"),
        include_dir.join("ggml-backend.h"),
        private_dir.join("ggml-backend-impl.h"),
        // `struct ggml_cgraph`: its use counts tell which nodes a node of another split reads.
        private_dir.join("ggml-impl.h"),
    ];
    for header in &headers {
        if !header.is_file() {
            fail(&format!(
                "the ggml source tree is missing: {} does not exist.\n  To get it, {HOW_TO_GET_GGML}.",
                header.display()
            ));
        }
        println!("cargo:rerun-if-changed={}", header.display());
    }

    let link_static = match env::var("GGML_HSA_LINK").as_deref() {
        Ok("static") => true,
        Ok("dylib") | Ok("") | Err(_) => false,
        Ok(other) => fail(&format!(
            "GGML_HSA_LINK={other}: expected `dylib` or `static`"
        )),
    };
    let base_lib = lib_dir.join(if link_static {
        "libggml-base.a"
    } else {
        "libggml-base.so"
    });
    // In a CMake build the library is built after this crate is configured; only a standalone
    // cargo build needs it up front.
    if !base_lib.exists() && env::var_os("GGML_HSA_GGML_VERSION").is_none() {
        fail(&format!(
            "libggml-base is missing: {} does not exist.\n  To get it, {HOW_TO_GET_GGML}.",
            base_lib.display()
        ));
    }

    generate_bindings(&headers, &include_dir, &private_dir);
    // For the integration tests: the C header check and the runs of the pinned test-backend-ops.
    println!(
        "cargo:rustc-env=GGML_HSA_GGML_INCLUDE_DIR={}",
        include_dir.display()
    );
    println!(
        "cargo:rustc-env=GGML_HSA_GGML_LIB_DIR={}",
        lib_dir.display()
    );
    record_ggml_identity(&base_lib);
    check_rocr_headers();

    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    if link_static {
        // The archive is linked by ggml's own build, next to its libggml-base.a: nothing is
        // bundled, and the cdylib cargo also builds keeps ggml's symbols undefined (that
        // libggml-base.a is not position-independent). Only the tool binary links it here.
        println!("cargo:rustc-link-arg-bins={}", base_lib.display());
        println!("cargo:rustc-link-arg-bins=-lstdc++");
        return;
    }
    println!("cargo:rustc-link-lib=dylib=ggml-base");
    if env::var("GGML_HSA_RPATH").as_deref() != Ok("0") {
        // Lets test binaries and a plugin used from the build tree find libggml-base. When ggml has
        // already loaded it (the plugin case) the loaded copy is used, as for ggml's own backends.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    }
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libggml-hsa.so");
}

fn fail(message: &str) -> ! {
    eprintln!("\nerror: ggml-hsa build: {message}\n");
    std::process::exit(1);
}

/// The directory `scripts/llama-cpp.sh` uses for the pinned tree; kept in step with that script.
fn default_llama_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let pin = fs::read_to_string(manifest_dir.join("scripts/llama-cpp.pin"))
        .unwrap_or_else(|e| fail(&format!("cannot read scripts/llama-cpp.pin: {e}")));
    let version = pin
        .lines()
        .find_map(|line| line.strip_prefix("LLAMA_CPP_PYTHON_VERSION="))
        .map(str::trim)
        .unwrap_or_else(|| fail("scripts/llama-cpp.pin has no LLAMA_CPP_PYTHON_VERSION"));
    let cache = env::var_os("GGML_HSA_BUILD_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            env::var_os("XDG_CACHE_HOME")
                .filter(|v| !v.is_empty())
                .map(|x| PathBuf::from(x).join("ggml-hsa-build"))
        })
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ggml-hsa-build")))
        .unwrap_or_else(|| fail("neither GGML_HSA_BUILD_CACHE, XDG_CACHE_HOME nor HOME is set"));
    cache.join(format!("llama-cpp-python-{version}"))
}

/// bindgen loads libclang at run time (clang-sys's `runtime` feature) and panics with a long
/// backtrace when it is absent; load it first, the same way, to fail with one line instead.
fn require_libclang() {
    println!("cargo:rerun-if-env-changed=LIBCLANG_PATH");
    if let Err(e) = clang_sys::load() {
        let e = e.lines().next().unwrap_or_default().to_owned();
        fail(&format!(
            "libclang not found: install libclang-dev or set LIBCLANG_PATH ({e})"
        ));
    }
}

/// bindgen with C enums as plain constants with the C names (GGML_OP_ADD, HSA_STATUS_ERROR, ...):
/// values coming from C are never turned into Rust enums, so a value this build does not know
/// cannot be undefined behaviour.
fn c_constants_builder() -> bindgen::Builder {
    require_libclang();
    bindgen::Builder::default()
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .generate_comments(false)
}

fn generate_bindings(headers: &[PathBuf], include_dir: &Path, private_dir: &Path) {
    let wrapper: String = headers
        .iter()
        .map(|h| format!("#include \"{}\"\n", h.display()))
        .collect();
    let bindings = c_constants_builder()
        .header_contents("ggml_hsa_wrapper.h", &wrapper)
        .clang_arg(format!("-I{}", include_dir.display()))
        .clang_arg(format!("-I{}", private_dir.display()))
        .allowlist_item("ggml_.*|GGML_.*")
        .layout_tests(true)
        .derive_default(true)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen failed on the ggml headers: {e}")));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo")).join("ggml_sys.rs");
    bindings
        .write_to_file(&out)
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.display())));
    emit_interface_cfgs(&bindings.to_string());
}

/// The parts of ggml's backend interface that differ between the releases this plugin supports
/// (docs/building.md, "Supported ggml releases"), each as a cfg read by `src/ffi/*_iface.rs`:
/// `(cfg, struct, field)`: the cfg is set when the struct of the generated bindings has the field.
/// A slot that exists in every supported release needs no entry: the tables are written out in
/// full, so a slot added by a newer ggml fails the build until it is handled here.
const INTERFACE_CFGS: &[(&str, &str, &str)] = &[
    // 2-D tensor copies on buffers (ggml 0.10): we implement them.
    (
        "ggml_buffer_tensor_2d",
        "ggml_backend_buffer_i",
        "set_tensor_2d",
    ),
    // 2-D asynchronous copies on streams (ggml 0.10): left to ggml's synchronous fallback.
    (
        "ggml_backend_tensor_2d_async",
        "ggml_backend_i",
        "set_tensor_2d_async",
    ),
    // The device capability `mmap_support` (ggml 0.10).
    (
        "ggml_dev_caps_mmap_support",
        "ggml_backend_dev_caps",
        "mmap_support",
    ),
];

fn emit_interface_cfgs(bindings: &str) {
    for (cfg, strukt, field) in INTERFACE_CFGS {
        println!("cargo:rustc-check-cfg=cfg({cfg})");
        let Some(fields) = struct_fields(bindings, strukt) else {
            fail(&format!(
                "the generated ggml bindings have no struct {strukt}: this ggml is outside the \
                 supported range (docs/building.md, \"Supported ggml releases\")"
            ));
        };
        if fields.iter().any(|f| f == field) {
            println!("cargo:rustc-cfg={cfg}");
        }
    }
}

/// The field names of `pub struct <name> { ... }` in bindgen's output (formatted or not), or
/// `None` when the struct is not there.
fn struct_fields(code: &str, name: &str) -> Option<Vec<String>> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let start = code.match_indices("pub struct ").find_map(|(i, m)| {
        let rest = &code[i + m.len()..];
        (ident(rest) == name).then_some(i + m.len() + name.len())
    })?;
    let open = start + code[start..].find('{')?;
    // A field type holds parentheses and angle brackets but no braces; the body ends at the
    // first `}`.
    let body = &code[open + 1..open + code[open..].find('}')?];
    Some(
        body.split("pub ")
            .skip(1)
            .map(ident)
            .filter(|f| !f.is_empty())
            .collect(),
    )
}

/// Writes a generated source file into OUT_DIR.
fn write_out(name: &str, code: &str) {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo")).join(name);
    fs::write(&out, code).unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.display())));
}

/// Records the version and commit of the ggml being linked, so that the plugin can refuse to run
/// inside a different ggml (whose tables may be laid out differently).
fn record_ggml_identity(base_lib: &Path) {
    let (version, commit) = match (
        env::var("GGML_HSA_GGML_VERSION"),
        env::var("GGML_HSA_GGML_COMMIT"),
    ) {
        (Ok(v), Ok(c)) => (v, c),
        _ => query_ggml_identity(base_lib),
    };
    println!("cargo:rustc-env=GGML_HSA_BUILT_GGML_VERSION={version}");
    println!("cargo:rustc-env=GGML_HSA_BUILT_GGML_COMMIT={commit}");
}

/// Generates `rocr_abi_check.rs`: compile-time assertions that every `pub const` and `struct` of
/// `src/hsa/sys.rs` that the ROCR headers also declare has the same value or size there. The
/// AIE-only names are newer than many installed headers; names the headers lack are skipped.
fn check_rocr_headers() {
    println!("cargo:rustc-check-cfg=cfg(ggml_hsa_rocr_abi_check)");
    println!("cargo:rerun-if-changed=src/hsa/sys.rs");
    let Some(dir) = env::var_os("GGML_HSA_ROCR_INCLUDE_DIR").filter(|d| !d.is_empty()) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let (hsa, ext) = (dir.join("hsa/hsa.h"), dir.join("hsa/hsa_ext_amd.h"));
    if !hsa.is_file() || !ext.is_file() {
        println!(
            "cargo:warning=GGML_HSA_ROCR_INCLUDE_DIR={}: no hsa/hsa.h and hsa/hsa_ext_amd.h, ABI not checked",
            dir.display()
        );
        return;
    }
    let rocr = c_constants_builder()
        .header(hsa.to_string_lossy())
        .header(ext.to_string_lossy())
        .clang_arg(format!("-I{}", dir.display()))
        .allowlist_item("hsa_.*|HSA_.*")
        .layout_tests(false)
        .generate()
        .unwrap_or_else(|e| {
            fail(&format!(
                "bindgen failed on the ROCR headers in {}: {e}",
                dir.display()
            ))
        })
        .to_string();
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let ours = fs::read_to_string(manifest_dir.join("src/hsa/sys.rs"))
        .unwrap_or_else(|e| fail(&format!("cannot read src/hsa/sys.rs: {e}")));
    let declared = |code: &str, keyword: &str| -> Vec<String> {
        code.split(keyword)
            .skip(1)
            .filter_map(|rest| {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                (!name.is_empty()).then_some(name)
            })
            .collect()
    };
    let theirs_consts = declared(&rocr, "pub const ");
    let theirs_structs = declared(&rocr, "pub struct ");
    let mut checks = String::from(
        "// Generated by the build script (build-script/main.rs) from the ROCR headers.\n",
    );
    let mut n = 0;
    for name in declared(&ours, "pub const ") {
        if theirs_consts.contains(&name) {
            checks += &format!(
                "const _: () = assert!(super::sys::{name} as i128 == rocr::{name} as i128, \
                 \"src/hsa/sys.rs: {name} differs from the ROCR headers\");\n"
            );
            n += 1;
        }
    }
    for name in declared(&ours, "pub struct ") {
        if theirs_structs.contains(&name) {
            checks += &format!(
                "const _: () = assert!(core::mem::size_of::<super::sys::{name}>() == \
                 core::mem::size_of::<rocr::{name}>(), \"src/hsa/sys.rs: the size of {name} \
                 differs from the ROCR headers\");\n"
            );
            n += 1;
        }
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    fs::write(out.join("rocr_sys.rs"), rocr)
        .and_then(|()| fs::write(out.join("rocr_abi_check.rs"), checks))
        .unwrap_or_else(|e| fail(&format!("cannot write to {}: {e}", out.display())));
    if n > 0 {
        println!("cargo:rustc-cfg=ggml_hsa_rocr_abi_check");
    }
}

fn query_ggml_identity(base_lib: &Path) -> (String, String) {
    type StrFn = unsafe extern "C" fn() -> *const std::ffi::c_char;
    // SAFETY: loading libggml-base runs no initialisers beyond the C++ runtime's; it is the library
    // the plugin links against, built for this host.
    let lib = unsafe { libloading::Library::new(base_lib) }
        .unwrap_or_else(|e| fail(&format!("cannot load {}: {e}", base_lib.display())));
    let call = |name: &[u8]| -> String {
        // SAFETY: ggml_version/ggml_commit are `const char *(void)` in ggml.h.
        let f = unsafe { lib.get::<StrFn>(name) }
            .unwrap_or_else(|e| fail(&format!("{}: {e}", base_lib.display())));
        // SAFETY: both return pointers to static NUL-terminated strings.
        unsafe { CStr::from_ptr(f()) }
            .to_string_lossy()
            .into_owned()
    };
    (call(b"ggml_version\0"), call(b"ggml_commit\0"))
}
