//! `ggml-hsa-gen-kernels` end to end, with hsa-sim's kernel compiler: the shipped example
//! configs, parallel compiles, unsupported kernels, bad configs and a missing compiler.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ggml_hsa::kernels::gen_config::KernelConfig;

const TOOL: &str = env!("CARGO_BIN_EXE_ggml-hsa-gen-kernels");

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("share/examples")
        .join(name)
}

fn sim_compiler() -> String {
    common::sim_artifact("hsa-sim-compile")
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

/// Runs the tool; the environment's compiler setting is removed so that only the arguments count.
fn run(args: &[&str]) -> Output {
    Command::new(TOOL)
        .args(args)
        .env_remove("GGML_HSA_JIT_COMPILER")
        .output()
        .expect("run ggml-hsa-gen-kernels")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `config` through the tool with the simulator's compiler into a fresh `out` directory.
fn generate(test: &str, config: &Path, extra: &[&str]) -> (PathBuf, Output) {
    let out_dir = common::scratch_dir(test).join("out");
    let compiler = sim_compiler();
    let mut args = vec![
        "--config",
        config.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--compiler",
        &compiler,
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    // Nothing of the tool's or the compiler's output may reach stdout.
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    (out_dir, out)
}

fn write_config(test: &str, json: &str) -> PathBuf {
    let path = common::scratch_dir(&format!("{test}-config")).join("config.json");
    std::fs::write(&path, json).unwrap();
    path
}

/// Asserts that `<out>/<arch>/<name>.pdi` and a well-formed `_insts.bin` exist.
fn assert_kernel(out_dir: &Path, arch: &str, name: &str) {
    let dir = out_dir.join(arch);
    let pdi = std::fs::metadata(dir.join(format!("{name}.pdi")))
        .unwrap_or_else(|e| panic!("{arch}/{name}.pdi: {e}"));
    assert!(pdi.len() > 0, "{arch}/{name}.pdi is empty");
    let insts = std::fs::metadata(dir.join(format!("{name}_insts.bin")))
        .unwrap_or_else(|e| panic!("{arch}/{name}_insts.bin: {e}"));
    assert!(
        insts.len() > 0 && insts.len().checked_rem(4) == Some(0),
        "{arch}/{name}_insts.bin holds {} bytes",
        insts.len()
    );
}

/// Every kernel of `config` is in `out_dir`, and the summary says so.
fn assert_all_compiled(config: &Path, out_dir: &Path, out: &Output) {
    let err = stderr(out);
    assert!(out.status.success(), "{err}");
    let config = KernelConfig::parse(&std::fs::read_to_string(config).unwrap()).unwrap();
    let n = config.kernels.len();
    for entry in &config.kernels {
        let (arch, desc) = entry.to_desc().unwrap();
        assert_kernel(out_dir, arch.name(), &entry.file_name(&desc));
        let line = format!("/{n}] {} ({arch}) ok in ", entry.file_name(&desc));
        assert!(err.contains(&line), "no progress line {line:?} in {err}");
    }
    assert!(
        err.contains(&format!("{n} kernels: {n} compiled, 0 failed")),
        "{err}"
    );
}

#[test]
fn the_example_configs_compile() {
    for (test, file) in [
        ("gen-minimal", "minimal-kernel-config.json"),
        ("gen-example", "example-kernel-config.json"),
    ] {
        let config = example(file);
        let (out_dir, out) = generate(test, &config, &[]);
        assert_all_compiled(&config, &out_dir, &out);
        // The request files live in a temporary directory, not next to the kernels.
        for arch in ["aie2", "aie2p"] {
            for f in std::fs::read_dir(out_dir.join(arch)).unwrap() {
                let name = f.unwrap().file_name().into_string().unwrap();
                assert!(
                    name.ends_with(".pdi")
                        || name.ends_with("_insts.bin")
                        || name == ggml_hsa::kernels::kernel_dir::MANIFEST,
                    "{name}"
                );
            }
            // Every kernel file is recorded with its size and checksum.
            let manifest = ggml_hsa::kernels::kernel_dir::parse_manifest(
                &std::fs::read_to_string(out_dir.join(arch).join(".ggml-hsa-kernels"))
                    .unwrap_or_default(),
            );
            for f in std::fs::read_dir(out_dir.join(arch)).unwrap() {
                let name = f.unwrap().file_name().into_string().unwrap();
                if let Some(stem) = name.strip_suffix(".pdi") {
                    let len = std::fs::metadata(out_dir.join(arch).join(&name))
                        .unwrap()
                        .len();
                    assert_eq!(manifest[stem][&name].0, len, "{name}");
                }
            }
        }
    }
}

/// `--format hsaco`: one AIE code object per kernel, which the shared strict reader accepts (the
/// kernel under its file name, in the section of its architecture, with the compiled PDI and
/// instructions), and nothing else; `--format both` writes the pair too.
#[test]
fn hsaco_format_writes_one_code_object_per_kernel() {
    let config = example("minimal-kernel-config.json");
    let (pairs, out) = generate("gen-hsaco-pairs", &config, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (out_dir, out) = generate("gen-hsaco", &config, &["--format", "hsaco"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let parsed = KernelConfig::parse(&std::fs::read_to_string(&config).unwrap()).unwrap();
    assert!(!parsed.kernels.is_empty());
    for entry in &parsed.kernels {
        let (arch, desc) = entry.to_desc().unwrap();
        let name = entry.file_name(&desc);
        let dir = out_dir.join(arch.name());
        let bytes = std::fs::read(dir.join(format!("{name}.hsaco"))).unwrap();
        let kernels = aie_hsaco::read(&bytes, arch.name()).unwrap();
        assert_eq!(kernels.len(), 1);
        let k = &kernels[0];
        assert_eq!(k.name, name);
        assert_eq!(k.kind, aie_hsaco::KernelKind::PdiInsts);
        assert_eq!(k.kernarg_size, 16 * (desc.inputs.len() as u32 + 1));
        let pair = pairs.join(arch.name());
        assert_eq!(
            k.pdi,
            std::fs::read(pair.join(format!("{name}.pdi"))).unwrap()
        );
        assert_eq!(
            k.insts,
            std::fs::read(pair.join(format!("{name}_insts.bin"))).unwrap()
        );
        assert!(!dir.join(format!("{name}.pdi")).exists());
    }
    let (both, out) = generate("gen-hsaco-both", &config, &["--format", "both"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_all_compiled(&config, &both, &out);
}

#[test]
fn parallel_jobs_number_every_kernel_once() {
    let config = example("example-kernel-config.json");
    let (out_dir, out) = generate("gen-jobs", &config, &["--jobs", "2", "--verbose"]);
    assert_all_compiled(&config, &out_dir, &out);
    let err = stderr(&out);
    let n = KernelConfig::parse(&std::fs::read_to_string(&config).unwrap())
        .unwrap()
        .kernels
        .len();
    for k in 1..=n {
        let prefix = format!("[{k}/{n}] ");
        assert_eq!(
            err.lines().filter(|l| l.starts_with(&prefix)).count(),
            1,
            "{prefix} in {err}"
        );
    }
    assert!(err.contains("2 at a time"), "{err}");
    // --jobs 0 is refused by the argument parser.
    let bad = run(&["--config", "x", "--output-dir", "y", "--jobs", "0"]);
    assert!(!bad.status.success());
}

const ADD: &str = r#"{"kernel_name": "ggml_op_add", "kernel_source": "binary_ops.py",
    "arch": "aie2p", "input_tensors": ["(64,1,1,1)/f32", "(64,1,1,1)/f32"],
    "output_tensor": "(64,1,1,1)/f32"}"#;

#[test]
fn unsupported_kernels_fail_but_the_others_are_written() {
    let config = write_config(
        "gen-unsupported",
        &format!(
            r#"{{"kernels": [
            {{"kernel_name": "ggml_op_mul_mat", "kernel_source": "mul_mat.py", "arch": "aie2p",
              "input_tensors": ["(64,8,1,1)/i8", "(64,4,1,1)/f32"],
              "output_tensor": "(8,4,1,1)/f32"}},
            {ADD},
            {{"kernel_name": "ggml_op_gelu", "kernel_source": "unary_ops.py", "arch": "aie2",
              "input_tensors": ["(64,1,1,1)/i32"], "output_tensor": "(64,1,1,1)/i32"}}]}}"#
        ),
    );
    let (out_dir, out) = generate("gen-unsupported", &config, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_kernel(&out_dir, "aie2p", "add-f32_64-f32_64-f32_64");
    assert!(err.contains("3 kernels: 1 compiled, 2 failed"), "{err}");
    assert!(
        err.contains("mul_mat-i8_64x8-f32_64x4-f32_8x4 (aie2p) FAILED in "),
        "{err}"
    );
    // The failures are listed with the compiler's reason.
    let listed = err.split("failed kernels:").nth(1).expect("failure list");
    assert!(
        listed.contains("mul_mat-i8_64x8-f32_64x4-f32_8x4 (aie2p): the compiler cannot build")
            && listed.contains("MUL_MAT"),
        "{err}"
    );
    assert!(
        listed.contains("gelu-i32_64-i32_64 (aie2): the compiler cannot build")
            && listed.contains("type i32"),
        "{err}"
    );
    assert!(!out_dir.join("aie2/gelu-i32_64-i32_64.pdi").exists());
}

#[test]
fn invalid_configs_are_refused_before_compiling() {
    let cases = [
        (
            ADD.replace("\"(64,1,1,1)/f32\",", "\"64,1,1,1/f32\","),
            "invalid tensor descriptor \"64,1,1,1/f32\"",
        ),
        (
            ADD.replace("\"(64,1,1,1)/f32\",", "\"(64,1,1)/f32\","),
            "shape must have exactly 4 dimensions: \"(64,1,1)/f32\" has 3",
        ),
        (
            ADD.replace("\"(64,1,1,1)/f32\",", "\"(64,1,1,1)/f64\","),
            "unknown dtype \"f64\"",
        ),
        (
            ADD.replace("\"(64,1,1,1)/f32\",", "\"(64,1,1,1)/f32/(4,256)\","),
            "strides must have 4 values",
        ),
        (
            ADD.replace("binary_ops.py", "unary_ops.py"),
            "kernel source not found: \"unary_ops.py\" does not define kernel \"ggml_op_add\"",
        ),
        (ADD.replace("aie2p", "aie9"), "unknown arch \"aie9\""),
    ];
    for (i, (entry, message)) in cases.iter().enumerate() {
        let test = format!("gen-invalid-{i}");
        let config = write_config(&test, &format!(r#"{{"kernels": [{ADD}, {entry}]}}"#));
        // A missing compiler must not matter: the config is checked first.
        let out_dir = common::scratch_dir(&test).join("out");
        let out = run(&[
            "--config",
            config.to_str().unwrap(),
            "--output-dir",
            out_dir.to_str().unwrap(),
            "--compiler",
            "/nonexistent/compiler",
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(message), "{message:?} not in {err}");
        assert!(err.contains("kernel 2 (ggml_op_"), "{err}");
        assert!(err.contains("1 invalid kernel entry"), "{err}");
        assert!(!err.contains("environment missing"), "{err}");
        assert!(!out_dir.exists());
    }

    let config = write_config("gen-bad-json", r#"{"kernels": [{"kernel_name": 1}"#);
    let out = run(&[
        "--config",
        config.to_str().unwrap(),
        "--output-dir",
        "/tmp/x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("invalid kernel config"),
        "{}",
        stderr(&out)
    );

    let out = run(&[
        "--config",
        "/nonexistent/config.json",
        "--output-dir",
        "/tmp/x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot read the kernel config /nonexistent/config.json"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_compiler_says_how_to_get_one() {
    let config = example("minimal-kernel-config.json");
    let out_dir = common::scratch_dir("gen-no-compiler").join("out");
    let out = run(&[
        "--config",
        config.to_str().unwrap(),
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--compiler",
        "/nonexistent/x",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("kernel compiler environment missing"), "{err}");
    assert!(err.contains("/nonexistent/x"), "{err}");
    assert!(
        err.contains("IRON environment") && err.contains("GGML_HSA_JIT_COMPILER"),
        "{err}"
    );
    assert!(!err.contains("compiled"), "{err}");
}

#[test]
fn the_compiler_comes_from_the_environment_by_default() {
    let config = example("minimal-kernel-config.json");
    let out_dir = common::scratch_dir("gen-env-compiler").join("out");
    let out = Command::new(TOOL)
        .args(["--config", config.to_str().unwrap()])
        .args(["--output-dir", out_dir.to_str().unwrap()])
        .env("GGML_HSA_JIT_COMPILER", sim_compiler())
        .output()
        .unwrap();
    assert_all_compiled(&config, &out_dir, &out);
}

#[test]
fn a_non_canonical_exported_name_is_warned_about() {
    let entry = ADD.replace(
        "\"output_tensor\"",
        "\"exported_name\": \"add_f32_64\", \"output_tensor\"",
    );
    let config = write_config("gen-exported", &format!(r#"{{"kernels": [{entry}]}}"#));
    let (out_dir, out) = generate("gen-exported", &config, &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: kernel 1 (ggml_op_add): exported_name \"add_f32_64\" is not the canonical name")
            && err.contains("\"add-f32_64-f32_64-f32_64\"")
            && err.contains("will not find it"),
        "{err}"
    );
    // The files are still written under the requested name.
    assert_kernel(&out_dir, "aie2p", "add_f32_64");
    assert!(err.contains("[1/1] add_f32_64 (aie2p) ok in "), "{err}");
}

#[test]
fn repeated_kernels_compile_once_and_name_clashes_are_refused() {
    let config = write_config("gen-twice", &format!(r#"{{"kernels": [{ADD}, {ADD}]}}"#));
    let (out_dir, out) = generate("gen-twice", &config, &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("kernel 2 (ggml_op_add): add-f32_64-f32_64-f32_64 (aie2p) is listed twice"),
        "{err}"
    );
    assert!(err.contains("1 kernel: 1 compiled, 0 failed"), "{err}");
    assert_kernel(&out_dir, "aie2p", "add-f32_64-f32_64-f32_64");

    // Two different kernels exported under one name would overwrite each other.
    let named = |e: &str| {
        e.replace(
            "\"output_tensor\"",
            "\"exported_name\": \"k\", \"output_tensor\"",
        )
    };
    let sub = ADD.replace("ggml_op_add", "ggml_op_sub");
    let config = write_config(
        "gen-clash",
        &format!(r#"{{"kernels": [{}, {}]}}"#, named(ADD), named(&sub)),
    );
    let (out_dir, out) = generate("gen-clash", &config, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("kernel 2 (ggml_op_sub): exported_name \"k\" (aie2p) is already used by a different kernel"),
        "{err}"
    );
    assert!(!out_dir.exists());
}
