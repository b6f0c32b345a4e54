//! The pinned llama.cpp's `test-backend-ops` comparing `HSA0` with the CPU backend, with the
//! IRON package's emulation target as the JIT compiler: every kernel HSA0 runs is an IRON
//! design (recorded by the `aie.iron` stand-in) with its AIE core kernels compiled for the
//! host, executed by hsa-sim's dataflow emulator (`exec::iron`). Capabilities are the IRON
//! package's own, so everything a real NPU would not take goes to the CPU (`not supported`).
//! Every op the package declares, on aie2p and on aie2: 0 failures.

mod common;

use common::test_backend_ops::{run, Report};

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
    let report = run(
        &common::llama_program("test-backend-ops"),
        &["-b", "HSA0", "-o", ops],
        &vars,
        "HSA0",
    );
    println!(
        "{tag}: {}/{} cases passed, {} not supported, {:.0} s",
        report.passed,
        report.total,
        report.not_supported,
        t.elapsed().as_secs_f64()
    );
    report
}

fn check(r: &Report, tag: &str) {
    if let Err(e) = r.expect_cases("HSA0") {
        panic!("{tag}: {e}\n{}", r.output);
    }
    assert!(!r.output.contains("internal error"), "{}", r.output);
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
