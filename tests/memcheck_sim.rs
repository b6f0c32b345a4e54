//! test-backend-ops on HSA0 (hsa-sim, this crate's plugin) under valgrind memcheck (issue 18):
//! no invalid read or write, no definite or indirect leak, across the plugin's whole path
//! (registry, buffers, graph planning, kernel compile and load, packets, dispatch, teardown).
//! Slow (about two minutes for the few SQR cases on two shared cores), so it runs only when
//! `GGML_HSA_MEMCHECK=1` (`scripts/test.sh --long`). No suppressions: nothing was reported.

mod common;

use std::process::Command;

#[test]
fn test_backend_ops_subset_is_clean_under_valgrind_memcheck() {
    if std::env::var_os("GGML_HSA_MEMCHECK").is_none() {
        eprintln!("SKIPPED: set GGML_HSA_MEMCHECK=1 (scripts/test.sh --long) to run memcheck");
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        panic!("GGML_HSA_MEMCHECK=1 but valgrind is not installed");
    }
    let dir = common::scratch_dir("memcheck");
    let out = Command::new("valgrind")
        .args([
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
        ])
        .arg(common::llama_program("test-backend-ops"))
        .args(["-b", "HSA0", "-o", "SQR"])
        .env("GGML_BACKEND_PATH", common::plugin_path())
        .env(
            "GGML_HSA_LIBHSA_PATH",
            common::sim_artifact("libhsa_runtime64.so"),
        )
        .env(
            "GGML_HSA_JIT_COMPILER",
            common::sim_artifact("hsa-sim-compile"),
        )
        .env("GGML_HSA_KERNEL_CACHE_DIR", dir.join("cache"))
        .env("HSA_SIM_QUIET", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let report = common::test_backend_ops::Report::parse(&stdout, Some(0), "HSA0");
    report.expect_cases("HSA0").unwrap();
    let summary: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("ERROR SUMMARY") || l.contains("definitely lost"))
        .collect();
    println!("memcheck of test-backend-ops -b HSA0 -o SQR: {summary:?}");
    assert!(
        summary
            .iter()
            .any(|l| l.contains("ERROR SUMMARY: 0 errors")),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
