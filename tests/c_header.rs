//! `include/ggml-hsa.h` together with ggml's headers, compiled as C and as C++, linked against the
//! plugin and run without an HSA runtime.

mod common;

use std::path::Path;
use std::process::Command;

fn build_and_run(compiler: &str, std: &str, language: &str, name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::scratch_dir(name);
    let plugin = common::plugin_path();
    // The plugin's file name has an underscore; link it under the name ggml uses.
    let linked = dir.join("libggml-hsa.so");
    std::fs::copy(&plugin, &linked).unwrap();
    let exe = dir.join("header_check");
    let lib_dir = common::llama_bin_dir();
    let out = Command::new(compiler)
        .args([
            "-x",
            language,
            std,
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
        ])
        .arg("-I")
        .arg(common::ggml_include_dir())
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join("tests/c/header_check.c"))
        .arg("-o")
        .arg(&exe)
        .args(["-x", "none"])
        .arg(&linked)
        .arg(format!("-L{}", lib_dir.display()))
        .args(["-lggml-base", "-lggml"])
        .arg(format!(
            "-Wl,-rpath,{}:{}",
            dir.display(),
            lib_dir.display()
        ))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {std} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run = Command::new(&exe)
        .env("GGML_HSA_LIBHSA_PATH", dir.join("no-such-libhsa.so"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        "name=HSA\nmax_devices=16\nreg=HSA\ndevices=0\ninit=null\nbuffer_type=null\n\
         description=[]\nmemory=0/0\nis_hsa=0\n"
    );
    assert_eq!(
        stderr.matches("HSA: no device available").count(),
        1,
        "one line says why:\n{stderr}"
    );
}

#[test]
fn header_compiles_and_links_as_c() {
    build_and_run("cc", "-std=c11", "c", "header-c");
}

#[test]
fn header_compiles_and_links_as_cxx() {
    build_and_run("c++", "-std=c++17", "c++", "header-cxx");
}
