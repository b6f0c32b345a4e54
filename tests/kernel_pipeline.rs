//! The kernel pipeline end to end, with the pinned test-backend-ops on hsa-sim: record mode and
//! pregeneration (`GGML_HSA_KERNEL_RECORD`, then `ggml-hsa-gen-kernels`, then a run with JIT off
//! and `GGML_HSA_KERNEL_DIR`), the cache (a second run compiles nothing; clearing removes only what
//! the backend wrote), and two processes compiling into one cache at the same time.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::test_backend_ops::{op_names_filter, run, Report};

/// A small selection: binary with broadcast, unary, SCALE with parameters, f32 only.
const OPS: &str = "ADD,GELU,SCALE";
const PARAMS: &str = "type=f32";

fn tbo(env: &[(&str, &str)]) -> Report {
    let plugin = common::plugin_path();
    let sim = common::sim_artifact("libhsa_runtime64.so");
    let mut vars = vec![
        ("GGML_BACKEND_PATH", plugin.to_str().unwrap()),
        ("GGML_HSA_LIBHSA_PATH", sim.to_str().unwrap()),
        ("GGML_HSA_ENABLE_LOG", "1"),
    ];
    vars.extend_from_slice(env);
    let report = run(
        &common::llama_program("test-backend-ops"),
        &["-b", "HSA0", "-o", &op_names_filter(OPS), "-p", PARAMS],
        &vars,
        "HSA0",
    );
    if let Err(e) = report.expect_cases("HSA0") {
        panic!("{e}\n{}", report.output);
    }
    report
}

/// Kernels compiled by this run, from the backend's progress lines.
fn compiles(r: &Report) -> usize {
    r.output
        .lines()
        .filter(|l| l.starts_with("HSA: [") && l.contains(": compiled in"))
        .count()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn compiler() -> PathBuf {
    common::sim_artifact("hsa-sim-compile")
}

/// A kernel the compiler declines during the recorded run (a shape its design refuses) is not
/// left in the record: pregenerating it could only fail, and its nodes ran another way.
#[test]
fn a_declined_kernel_is_not_recorded() {
    let dir = common::scratch_dir("pipeline-record-declined");
    let record = dir.join("record.json");
    let wrapper = common::declining_compiler(&dir, "SCALE");
    let run = tbo(&[
        ("GGML_HSA_JIT_COMPILER", wrapper.to_str().unwrap()),
        (
            "GGML_HSA_KERNEL_CACHE_DIR",
            dir.join("cache").to_str().unwrap(),
        ),
        ("GGML_HSA_KERNEL_RECORD", record.to_str().unwrap()),
    ]);
    assert!(
        run.output.contains("declined by the compiler"),
        "{}",
        run.output
    );
    let config = std::fs::read_to_string(&record).expect("the record file was written");
    let parsed: serde_json::Value = serde_json::from_str(&config).unwrap();
    let ops: Vec<&str> = parsed["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kernel_name"].as_str().unwrap())
        .collect();
    assert!(ops.contains(&"ggml_op_add"), "{config}");
    assert!(!ops.contains(&"ggml_op_scale"), "{config}");
    let out = Command::new(env!("CARGO_BIN_EXE_ggml-hsa-gen-kernels"))
        .arg("--config")
        .arg(&record)
        .arg("--output-dir")
        .arg(dir.join("kernels"))
        .arg("--compiler")
        .arg(compiler())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains(", 0 failed"),
        "{stderr}"
    );
}

#[test]
fn record_pregenerate_and_run_without_jit() {
    let dir = common::scratch_dir("pipeline-record");
    let record = dir.join("record.json");
    let cache = dir.join("cache");
    let first = tbo(&[
        ("GGML_HSA_JIT_COMPILER", compiler().to_str().unwrap()),
        ("GGML_HSA_KERNEL_CACHE_DIR", cache.to_str().unwrap()),
        ("GGML_HSA_KERNEL_RECORD", record.to_str().unwrap()),
    ]);
    let compiled = compiles(&first);
    assert!(compiled > 5, "{}", first.output);
    let config = std::fs::read_to_string(&record).expect("the record file was written");
    let parsed: serde_json::Value = serde_json::from_str(&config).unwrap();
    // Every kernel compiled, and the whole kernels of those that ran over power-of-two counts
    // of their rows (`ops::pieces`): `supports_op` counts on them, so a run with JIT off
    // needs them too.
    let recorded = parsed["kernels"].as_array().unwrap().len();
    assert!(recorded >= compiled, "{compiled} compiled: {config}");

    // Pregenerate the recorded kernels into a fresh directory.
    let kernels = dir.join("kernels");
    let out = Command::new(env!("CARGO_BIN_EXE_ggml-hsa-gen-kernels"))
        .arg("--config")
        .arg(&record)
        .arg("--output-dir")
        .arg(&kernels)
        .arg("--compiler")
        .arg(compiler())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One .pdi and one _insts.bin per kernel, and the manifest with their sizes and checksums
    // (one line per kernel), which the backend checks the files against.
    let generated = files(&kernels.join("aie2p"));
    assert_eq!(
        generated.len(),
        2 * recorded + 1,
        "one .pdi and one _insts.bin per kernel, and the manifest: {generated:?}"
    );
    let manifest =
        std::fs::read_to_string(kernels.join("aie2p").join(".ggml-hsa-kernels")).unwrap();
    assert_eq!(manifest.lines().count(), recorded, "{manifest}");

    // The same run with JIT off and an empty cache: everything comes from the kernel dir.
    let empty_cache = dir.join("empty-cache");
    let second = tbo(&[
        ("GGML_HSA_JIT_COMPILER", "off"),
        ("GGML_HSA_KERNEL_DIR", kernels.to_str().unwrap()),
        ("GGML_HSA_KERNEL_CACHE_DIR", empty_cache.to_str().unwrap()),
    ]);
    assert_eq!((second.passed, second.total), (first.passed, first.total));
    assert_eq!(compiles(&second), 0, "{}", second.output);
    assert!(files(&empty_cache).is_empty());

    // JIT off and no kernels at all: the ops are reported unsupported, nothing fails.
    let none = run(
        &common::llama_program("test-backend-ops"),
        &["-b", "HSA0", "-o", "GELU", "-p", PARAMS],
        &[
            ("GGML_BACKEND_PATH", common::plugin_path().to_str().unwrap()),
            (
                "GGML_HSA_LIBHSA_PATH",
                common::sim_artifact("libhsa_runtime64.so")
                    .to_str()
                    .unwrap(),
            ),
            ("GGML_HSA_JIT_COMPILER", "off"),
            ("GGML_HSA_KERNEL_CACHE_DIR", empty_cache.to_str().unwrap()),
        ],
        "HSA0",
    );
    assert_eq!(none.total, 0, "{}", none.output);
    assert!(none.not_supported > 0, "{}", none.output);
    assert!(none.failing.is_empty());
}

#[test]
fn a_second_run_compiles_nothing_and_clearing_keeps_foreign_files() {
    let dir = common::scratch_dir("pipeline-cache");
    let cache = dir.join("cache");
    let compiler = compiler();
    let base = [
        ("GGML_HSA_JIT_COMPILER", compiler.to_str().unwrap()),
        ("GGML_HSA_KERNEL_CACHE_DIR", cache.to_str().unwrap()),
    ];
    let first = tbo(&base);
    let compiled = compiles(&first);
    assert!(compiled > 0);

    let second = tbo(&base);
    assert_eq!(compiles(&second), 0, "{}", second.output);
    assert_eq!(second.total, first.total);

    // A file the backend did not write, in the same cache directory.
    let arch_dir = cache.join("aie2p");
    std::fs::write(arch_dir.join("someone-elses.pdi"), b"keep me").unwrap();
    let third = tbo(&[base[0], base[1], ("GGML_HSA_KERNEL_CACHE_CLEAR", "1")]);
    // Each kernel's .pdi and _insts.bin (its lock file goes when its compile ends), and the
    // manifest.
    let removed = format!("removed {} file(s)", 2 * compiled + 1);
    assert!(
        third.output.contains(&removed),
        "{removed}?\n{}",
        third.output
    );
    // Everything was compiled again after the clear, and the foreign file survived.
    assert_eq!(compiles(&third), compiled, "{}", third.output);
    assert!(arch_dir.join("someone-elses.pdi").is_file());
}

/// A compiler that announces every compile in a log file, then takes its time.
fn slow_compiler(dir: &Path) -> (PathBuf, PathBuf) {
    let log = dir.join("compiles.log");
    let script = dir.join("slow-compiler.sh");
    common::write_script(
        &script,
        &format!(
            "#!/bin/sh\nif [ \"$1\" = compile ]; then basename \"$3\" >> '{}'; sleep 0.3; fi\nexec '{}' \"$@\"\n",
            log.display(),
            compiler().display()
        ),
    );
    (script, log)
}

#[test]
fn two_processes_compile_each_kernel_once_into_a_shared_cache() {
    let dir = common::scratch_dir("pipeline-concurrent");
    let cache = dir.join("cache");
    let (script, log) = slow_compiler(&dir);
    let spawn = || {
        let vars: Vec<(&str, String)> = vec![
            (
                "GGML_BACKEND_PATH",
                common::plugin_path().display().to_string(),
            ),
            (
                "GGML_HSA_LIBHSA_PATH",
                common::sim_artifact("libhsa_runtime64.so")
                    .display()
                    .to_string(),
            ),
            ("GGML_HSA_JIT_COMPILER", script.display().to_string()),
            ("GGML_HSA_KERNEL_CACHE_DIR", cache.display().to_string()),
            ("GGML_HSA_ENABLE_LOG", "1".into()),
        ];
        let mut cmd = Command::new(common::llama_program("test-backend-ops"));
        cmd.args(["-b", "HSA0", "-o", &op_names_filter(OPS), "-p", PARAMS]);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let r = Report::parse(&text, out.status.code(), "HSA0");
        if let Err(e) = r.expect_cases("HSA0") {
            panic!("{e}\n{text}");
        }
    }
    // Each request file is `.<name>.request.<pid>.json`: count compiles per kernel name.
    let mut per_kernel: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let name = line
            .trim_start_matches('.')
            .split(".request.")
            .next()
            .unwrap()
            .to_owned();
        *per_kernel.entry(name).or_default() += 1;
    }
    assert!(!per_kernel.is_empty());
    let twice: Vec<_> = per_kernel.iter().filter(|(_, &n)| n > 1).collect();
    assert!(twice.is_empty(), "compiled more than once: {twice:?}");
}
