//! The pinned llama.cpp's `test-backend-ops` comparing `HSA0` with the CPU backend, with the
//! IRON package's emulation target as the JIT compiler: every kernel HSA0 runs is an IRON
//! design (recorded by the `aie.iron` stand-in) with its AIE core kernels compiled for the
//! host, executed by hsa-sim's dataflow emulator (`exec::iron`). Capabilities are the IRON
//! package's own, so everything a real NPU would not take goes to the CPU (`not supported`).
//! Every op the package declares, on aie2p and on aie2: 0 failures among the kernels the IRON
//! designs build.
//!
//! The protocol's capabilities are per op and type, not per shape: a case the package declares
//! (say ADD with a broadcast operand of 20 KiB, more than a compute tile keeps resident) may
//! still be refused by the design's plan at compile time (exit status 2, "cannot build this
//! kernel"), which the backend reports as a failed graph. Such cases are counted and listed
//! apart ("declared but refused"); every other case must pass.

mod common;

use common::test_backend_ops::{strip_ansi, Report};
use std::process::Command;

/// The ops the IRON package declares (its registry), as test-backend-ops names them.
fn iron_ops() -> String {
    let out = std::process::Command::new("python3")
        .args(["-m", "ggml_hsa_iron", "--target", "emu", "capabilities"])
        .env("PYTHONPATH", concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let caps: serde_json::Value = serde_json::from_slice(&out.stdout).expect("capabilities JSON");
    caps["ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| o["op"].as_str().expect("op").to_owned())
        .collect::<Vec<_>>()
        .join(",")
}

fn tbo_emu(tag: &str, agents: &str, ops: &str) -> Report {
    let cache = common::scratch_dir(&format!("tbo-emu-{tag}"));
    let emu_cache = std::env::temp_dir().join("ggml-hsa-emu-tbo-cache");
    let plugin = common::plugin_path();
    let sim = common::sim_artifact("libhsa_runtime64.so");
    let vars = [
        ("GGML_BACKEND_PATH", plugin.to_str().unwrap()),
        ("GGML_HSA_LIBHSA_PATH", sim.to_str().unwrap()),
        (
            "GGML_HSA_JIT_COMPILER",
            "python3 -m ggml_hsa_iron --target emu",
        ),
        ("PYTHONPATH", concat!(env!("CARGO_MANIFEST_DIR"), "/src")),
        ("GGML_HSA_EMU_CACHE_DIR", emu_cache.to_str().unwrap()),
        ("GGML_HSA_KERNEL_CACHE_DIR", cache.to_str().unwrap()),
        ("GGML_HSA_ENABLE_LOG", "0"),
        ("HSA_SIM_AGENTS", agents),
    ];
    let t = std::time::Instant::now();
    // Line-buffered and merged, so that the backend's log lines of a case come before its
    // verdict line.
    let out = Command::new("sh")
        .arg("-c")
        .arg("exec stdbuf -oL -eL \"$0\" \"$@\" 2>&1")
        .arg(common::llama_program("test-backend-ops"))
        .args(["-b", "HSA0", "-o", ops])
        .envs(vars)
        .output()
        .expect("run test-backend-ops");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = Report::parse(&text, out.status.code(), "HSA0");
    println!(
        "{tag}: {}/{} cases passed, {} not supported, {:.0} s",
        report.passed,
        report.total,
        report.not_supported,
        t.elapsed().as_secs_f64()
    );
    report
}

/// The failing cases whose kernel the design refused at compile time, and the other failures.
fn classify(output: &str) -> (Vec<String>, Vec<String>) {
    let (mut refused, mut other) = (Vec::new(), Vec::new());
    let mut refused_here = false;
    for line in strip_ansi(output).lines() {
        let l = line.trim_end();
        if l.contains("cannot build this kernel") {
            refused_here = true;
        }
        let verdict = l.ends_with(": OK") || l.ends_with(": FAIL") || l.contains(": not supported");
        // A case's verdict (not the final `Backend HSA0: FAIL` summary).
        if l.ends_with(": FAIL") && !l.trim_start().starts_with("Backend ") {
            let case = l
                .trim()
                .trim_end_matches(": FAIL")
                .rsplit("   ")
                .next()
                .unwrap_or(l);
            if refused_here {
                refused.push(case.trim().to_owned());
            } else {
                other.push(case.trim().to_owned());
            }
        }
        if verdict {
            refused_here = false;
        }
    }
    (refused, other)
}

fn check(r: &Report, tag: &str) {
    if !r.device_tested || r.total == 0 {
        panic!("{tag}: no HSA0 case ran\n{}", r.output);
    }
    assert!(!r.output.contains("internal error"), "{}", r.output);
    let (refused, other) = classify(&r.output);
    println!(
        "{tag}: {} passed, {} declared but refused by the design's plan (exit 2), {} other \
         failures, {} not supported (CPU)",
        r.passed,
        refused.len(),
        other.len(),
        r.not_supported
    );
    for c in &refused {
        println!("  refused: {c}");
    }
    assert!(
        other.is_empty(),
        "{tag}: failures: {other:#?}\n{}",
        r.output
    );
    assert_eq!(
        r.passed as usize + refused.len(),
        r.total as usize,
        "{tag}: every case passes or is refused at compile time"
    );
}

#[test]
fn every_iron_op_emulated_on_aie2p() {
    let ops = iron_ops();
    assert!(ops.contains("MUL_MAT") && ops.contains("GELU"), "{ops}");
    let r = tbo_emu("aie2p", "aie2p", &ops);
    check(&r, "aie2p");
}

#[test]
fn every_iron_op_emulated_on_aie2() {
    let ops = iron_ops();
    let r = tbo_emu("aie2", "aie2", &ops);
    check(&r, "aie2");
}
