//! The pinned llama.cpp's `test-backend-ops` comparing `HSA0` with the CPU backend, with the
//! IRON package's emulation target as the JIT compiler: every kernel HSA0 runs is an IRON
//! design (recorded by the `aie.iron` stand-in) with its AIE core kernels compiled for the
//! host, executed by hsa-sim's dataflow emulator (`exec::iron`). Capabilities are the IRON
//! package's own, so everything a real NPU would not take goes to the CPU (`not supported`).
//! Every op the package declares, on aie2p all their cases, on aie2 MUL_MAT's and the f32 cases
//! of the others (see `every_iron_op_emulated`): 0 failures among the kernels the IRON designs
//! build. A default run (CI's) takes an eighth of those cases, a turn of a rotation chosen by the
//! commit with every op and type combination in each turn (tests/common/sample.rs);
//! `GGML_HSA_TEST_SAMPLE=all` (scripts/test.sh --long) runs them all.
//!
//! The protocol's capabilities are per op and type, not per shape: a case the package declares
//! (say ADD with a broadcast operand of 20 KiB, more than a compute tile keeps resident) may
//! still be refused by the design's plan at compile time (exit status 2, "cannot build this
//! kernel"); the backend then runs that node on ggml's CPU backend, as a real NPU's user would
//! need, and declines the kernel from then on. Those kernels are counted and listed; every case
//! must pass.

mod common;

use common::sample::{named, run_sample, Sample};
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
    let mut ops: Vec<String> = caps["ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| o["op"].as_str().expect("op").to_owned())
        .collect();
    // test-backend-ops' fused RMS_NORM -> MUL -> ADD cases (named as the IRON package's
    // RMS_NORM_MUL_ADD: the backend fuses the three where the weight is one row, the first
    // two into RMS_NORM_MUL otherwise).
    if ops.iter().any(|o| o == "RMS_NORM_MUL") && !ops.iter().any(|o| o == "RMS_NORM_MUL_ADD") {
        ops.push("RMS_NORM_MUL_ADD".into());
    }
    // Its fused gate/up MUL_MAT + GLU cases (the backend fuses the three nodes into
    // MUL_MAT_<GLU> when the compiler declares it), and the MUL_MAT + ADD of a bias in them
    // (MUL_MAT_ADD).
    if ops.iter().any(|o| o == "MUL_MAT_SWIGLU") {
        ops.push("MUL_MAT_VEC_FUSION".into());
    }
    ops.join(",")
}

/// The share of the cases a default run (CI's) takes: one turn of a rotation, at least one case
/// of every op and types (tests/common/sample.rs); `GGML_HSA_TEST_SAMPLE=all` runs every case.
/// An eighth: an emulated case costs about a second (a compiler process per kernel, the cores
/// built with g++ on first use), a reference one a tenth of that.
const SHARE: u64 = 8;

/// Runs this run's sample of the cases `ops` and `filter` select through the IRON designs
/// emulated on `agents`: one process per piece of the sample (every process keeps its own
/// simulated NPU), one kernel cache for all.
fn tbo_emu(tag: &str, agents: &str, ops: &str, filter: &[&str]) -> Report {
    let cache = common::scratch_dir(&format!("tbo-emu-{tag}"));
    let plugin = common::plugin_path();
    let sim = common::sim_artifact("libhsa_runtime64.so");
    let mut vars: Vec<(String, String)> = [
        ("GGML_BACKEND_PATH", plugin.to_str().unwrap()),
        ("GGML_HSA_LIBHSA_PATH", sim.to_str().unwrap()),
        ("GGML_HSA_KERNEL_CACHE_DIR", cache.to_str().unwrap()),
        ("GGML_HSA_ENABLE_LOG", "0"),
        ("HSA_SIM_AGENTS", agents),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .into();
    vars.extend(common::emu_compiler_env());
    let program = common::llama_program("test-backend-ops");
    let sample = Sample::from_env(SHARE);
    let t = std::time::Instant::now();
    let (report, picked) = run_sample(tag, sample, &program, ops, filter, &vars, |args| {
        // Line-buffered and merged, so that the backend's log lines of a case come before its
        // verdict line.
        let out = Command::new("sh")
            .arg("-c")
            .arg("exec stdbuf -oL -eL \"$0\" \"$@\" 2>&1")
            .arg(&program)
            .args(["-b", "HSA0"])
            .args(args)
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("run test-backend-ops");
        Report::parse(
            &String::from_utf8_lossy(&out.stdout),
            out.status.code(),
            "HSA0",
        )
    });
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{tag}: {}/{} cases passed, {} not supported, {secs:.0} s ({:.2} emulated cases per \
         second); sample: {}{}",
        report.passed,
        report.total,
        report.not_supported,
        report.total as f64 / secs,
        sample.describe(),
        named(picked)
    );
    report
}

/// The kernels the design refused at compile time (the compiler exited 2) whose nodes then ran
/// on ggml's CPU backend: the backend warns once per kernel ("node N (OP) runs on the CPU:
/// kernel NAME: the compiler cannot build this kernel: ..."). A refused fused kernel is not
/// one: its nodes run unfused on HSA0.
fn refused_kernels(output: &str) -> Vec<String> {
    strip_ansi(output)
        .lines()
        .filter(|l| l.contains("the compiler cannot build this kernel"))
        .filter_map(|l| {
            l.split("runs on the CPU: kernel ")
                .nth(1)?
                .split(':')
                .next()
        })
        .map(str::to_owned)
        .collect()
}

fn check(r: &Report, tag: &str) {
    if !r.device_tested || r.total == 0 {
        panic!("{tag}: no HSA0 case ran\n{}", r.output);
    }
    assert!(!r.output.contains("internal error"), "{}", r.output);
    let refused = refused_kernels(&r.output);
    println!(
        "{tag}: {}/{} cases passed, {} not supported (CPU); {} kernels the design's plan refused \
         at compile time (exit 2) ran on the CPU",
        r.passed,
        r.total,
        r.not_supported,
        refused.len()
    );
    for k in &refused {
        println!("  refused: {k}");
    }
    assert_eq!(
        r.passed, r.total,
        "{tag}: every case that runs on HSA0 passes\n{}",
        r.output
    );
}

/// The declared ops in two test-backend-ops processes: MUL_MAT alone, then the others. With
/// MUL_MAT's f16 and quantized weights the cases of all ops together need more distinct
/// kernels (PDIs of the emulation: program and host library) than one 64 MiB dev heap holds.
/// Before the backend evicted idle kernels from a full heap this split was required; it is
/// kept because two processes also keep each one's heap (and eviction churn) small.
///
/// On aie2p every case of every op. On aie2 every MUL_MAT case (its mmul shapes are aie2's
/// own) and the f32 cases of the other ops (`only_f32`): what differs on aie2 is its f32
/// arithmetic (no f32 vector multiplier: products from bf16 pieces, ggml_aie.h) and its four
/// columns; f16 and bf16 operands go through the same conversions on both, and running them
/// twice would add a third of the emulated suite's time to CI for nothing new.
fn every_iron_op_emulated(arch: &str, only_f32: bool) {
    let ops = iron_ops();
    assert!(ops.contains("MUL_MAT") && ops.contains("GELU"), "{ops}");
    let apart = ["MUL_MAT", "FLASH_ATTN_EXT"];
    let others: Vec<&str> = ops.split(',').filter(|o| !apart.contains(o)).collect();
    let r = tbo_emu(&format!("{arch}-mul-mat"), arch, "MUL_MAT", &[]);
    check(&r, &format!("{arch} MUL_MAT"));
    if ops.split(',').any(|o| o == "FLASH_ATTN_EXT") {
        // FLASH_ATTN_EXT has thousands of cases (every head size, KV length, type and
        // option); through the emulation, a sample: decode and three-row batches with
        // grouped-query heads at KV lengths 113 and 512, masks, sinks, ALiBi and softcap, f32,
        // f16 and bf16 K/V, views of a KV cache and permuted (the sample docs/ops.md's IRON
        // columns record too). Every case runs with the reference executors in
        // tests/backend_ops_sim.rs.
        let sample = include_str!("../scripts/lib/flash-attn-emu-sample.txt").trim();
        let r = tbo_emu(
            &format!("{arch}-flash-attn"),
            arch,
            "FLASH_ATTN_EXT",
            &["-p", sample],
        );
        check(&r, &format!("{arch} FLASH_ATTN_EXT"));
        assert!(
            r.total >= Sample::from_env(SHARE).at_least(50),
            "{arch}: only {} FLASH_ATTN_EXT cases ran",
            r.total
        );
    }
    // Every type parameter's name ends its case's vars: type=, type_src=, type_dst=, ...
    let f32_cases: &[&str] = if only_f32 {
        &["-p", "type[a-z_0-9]*=f32"]
    } else {
        &[]
    };
    let r = tbo_emu(arch, arch, &others.join(","), f32_cases);
    check(&r, arch);
    // The fused kernels were built by the IRON design and ran (tbo_emu's kernel cache).
    common::assert_kernels_built(
        &common::scratch_path(&format!("tbo-emu-{arch}")).join(arch),
        &[
            "rms_norm_mul_add-f32_",
            "mul_mat_swiglu-f32_",
            "mul_mat_geglu-f32_",
            // MUL_MAT_VEC_FUSION's cases with a bias.
            "mul_mat_add-f32_",
        ],
    );
}

#[test]
fn every_iron_op_emulated_on_aie2p() {
    every_iron_op_emulated("aie2p", false);
}

#[test]
fn every_iron_op_emulated_on_aie2() {
    every_iron_op_emulated("aie2", true);
}
