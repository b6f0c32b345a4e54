//! `include/ggml-hsa.h` together with ggml's headers, compiled as C and as C++, linked against the
//! plugin and run without an HSA runtime.

mod common;

use std::path::Path;
use std::process::Command;

fn build_and_run(compiler: &str, std: &str, language: &str, name: &str) {
    build_and_run_with(compiler, std, language, name, &[], &[]);
}

/// [`build_and_run`] with extra compiler flags (the sanitizers) and the program run through
/// `runner` (valgrind) when that is not empty.
fn build_and_run_with(
    compiler: &str,
    std: &str,
    language: &str,
    name: &str,
    flags: &[&str],
    runner: &[&str],
) {
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
        .args(flags)
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

    let mut command = match runner.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let run = command
        .env("GGML_HSA_LIBHSA_PATH", dir.join("no-such-libhsa.so"))
        // Any sanitizer report fails the run (exit 1) and a leak counts as one.
        .env("ASAN_OPTIONS", "detect_leaks=1:exitcode=1")
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
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

/// The C program under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer: the
/// header's inline parts and the plugin's C entry points as a C program calls them. The plugin
/// itself is not instrumented, but its allocations go through the sanitizer's malloc, so a
/// block it leaks to the C side, or a free of a wrong pointer, is reported too.
#[test]
fn header_program_is_clean_under_asan_and_ubsan() {
    build_and_run_with(
        "cc",
        "-std=c11",
        "c",
        "header-c-asan",
        &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            "-g",
        ],
        &[],
    );
}

/// The same program under valgrind memcheck: no invalid access, no definite or indirect leak
/// (exit status 99 otherwise). No suppressions: nothing was reported.
#[test]
fn header_program_is_clean_under_valgrind_memcheck() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        // scripts/test.sh installs it: there (GGML_HSA_REQUIRE_E2E=1) a skip is a failure.
        assert!(
            std::env::var("GGML_HSA_REQUIRE_E2E").as_deref() != Ok("1"),
            "valgrind is not installed (GGML_HSA_REQUIRE_E2E=1: this case must run)"
        );
        eprintln!("SKIPPED: valgrind is not installed (apt-get install valgrind)");
        return;
    }
    build_and_run_with(
        "cc",
        "-std=c11",
        "c",
        "header-c-memcheck",
        &["-g"],
        &[
            "valgrind",
            "-q",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
        ],
    );
}
