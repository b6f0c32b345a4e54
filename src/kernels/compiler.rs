//! The JIT kernel compiler: an external program spoken to through a small protocol (protocol 1,
//! documented in `docs/kernel-compiler-protocol.md`):
//!
//! * `<compiler> capabilities` prints one JSON object: the archs, ops and types it compiles;
//! * `<compiler> compile --request <file.json> --output-dir <dir>` writes `<dir>/<name>.pdi` and
//!   `<dir>/<name>_insts.bin`; exit 2 means "well-formed but unsupported", anything else non-zero
//!   is a failure.
//!
//! The compiler's output is always captured (at most [`OUTPUT_CAP`] bytes of each stream), so it
//! never reaches the application's stdout; it is shown in the log when a compile fails (or with
//! `GGML_HSA_JIT_VERBOSE`). It runs as a program that might be fooled by what it finds around
//! it, so it gets only what it needs: no descriptor of the host process but its three streams
//! (the `child-process` crate), the cache directory as its working directory, only the
//! variables listed in [`PASSED`] and [`PASSED_PREFIXES`] plus `PYTHONSAFEPATH=1` (Python does
//! not import from the working directory or the script's folder), and a time limit
//! (`GGML_HSA_JIT_TIMEOUT`).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use child_process::{Finished, Limits};

use serde::Deserialize;

use super::desc::KernelDesc;
use super::Arch;

/// What the compiler says it can build.
#[derive(Debug, Clone, Deserialize)]
pub struct Capabilities {
    pub protocol: u32,
    #[serde(default)]
    pub compiler: String,
    pub archs: Vec<String>,
    pub ops: Vec<OpCapability>,
    /// Whether requests may ask for f16 operands to be computed as bf16 (`f16_as_bf16`).
    #[serde(default)]
    pub f16_as_bf16: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct OpCapability {
    pub op: String,
    pub inputs: usize,
    /// Number of outputs: `output`, then the request's `extra_outputs`; 0: one per row of
    /// input 0 (CPY_ROWS).
    #[serde(default = "one")]
    pub outputs: usize,
    pub types: Vec<String>,
    /// Whether a second input smaller than the first is repeated over it (ggml broadcasting).
    #[serde(default)]
    pub broadcast: bool,
    /// Whether operands may be strided views.
    #[serde(default)]
    pub noncontiguous: bool,
    /// Whether a request may give the KV length at dispatch (`n_kv_step`).
    #[serde(default)]
    pub run_time_n_kv: bool,
}

fn one() -> usize {
    1
}

impl Capabilities {
    pub fn parse(json: &str) -> Result<Capabilities, String> {
        let caps: Capabilities = serde_json::from_str(json)
            .map_err(|e| format!("the compiler's capabilities are not valid JSON: {e}"))?;
        if caps.protocol != 1 {
            return Err(format!(
                "the compiler speaks protocol {}, this backend protocol 1",
                caps.protocol
            ));
        }
        Ok(caps)
    }

    /// `Ok` when the compiler declares it can build `desc` for `arch`; otherwise why not.
    pub fn check(&self, arch: Arch, desc: &KernelDesc) -> Result<(), String> {
        if !self.archs.iter().any(|a| a == arch.name()) {
            return Err(format!("the compiler does not target {arch}"));
        }
        let op = self
            .ops
            .iter()
            .find(|o| o.op == desc.op)
            .ok_or_else(|| format!("the compiler has no {} kernel", desc.op))?;
        if op.inputs != desc.inputs.len() {
            return Err(format!(
                "{} takes {} inputs in the compiler, {} here",
                desc.op,
                op.inputs,
                desc.inputs.len()
            ));
        }
        if desc.n_kv_step.is_some() && !op.run_time_n_kv {
            return Err(format!(
                "{} takes no run-time KV length in the compiler",
                desc.op
            ));
        }
        let outputs = match op.outputs {
            0 => desc.inputs.first().map_or(0, |t| t.ne[1].max(0) as usize),
            n => n,
        };
        if outputs != 1 + desc.extra_outputs.len() {
            return Err(format!(
                "{} has {} outputs in the compiler, {} here",
                desc.op,
                outputs,
                1 + desc.extra_outputs.len()
            ));
        }
        let operands = || {
            desc.inputs
                .iter()
                .chain([&desc.output])
                .chain(&desc.extra_outputs)
        };
        for t in operands() {
            if !op.types.contains(&t.dtype) {
                return Err(format!("{} is not compiled for type {}", desc.op, t.dtype));
            }
        }
        // Broadcasting repeats an input with fewer elements than the output; reductions
        // (ARGMAX, COUNT_EQUAL, ...) have outputs smaller than their inputs, which is not
        // broadcasting.
        // Element counts in u128, saturating: the shapes may come from a config file, where a
        // product of four i64 can overflow any integer type.
        let count = |ne: &[i64; 4]| {
            ne.iter()
                .fold(1u128, |acc, &n| acc.saturating_mul(n.max(0) as u128))
        };
        let smaller = |t: &super::desc::Layout| count(&t.ne) < count(&desc.output.ne);
        if !op.broadcast && desc.inputs.iter().any(smaller) {
            return Err(format!("{} kernels do not broadcast", desc.op));
        }
        if desc.f16_as_bf16 && !self.f16_as_bf16 {
            return Err("the compiler cannot compute f16 operands as bf16".into());
        }
        if !op.noncontiguous && !operands().all(super::desc::Layout::is_dense) {
            return Err(format!("{} kernels need contiguous operands", desc.op));
        }
        Ok(())
    }
}

/// Why a compile did not produce a kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("the compiler cannot build this kernel: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Failed(String),
}

/// The most bytes kept of each of the compiler's stdout and stderr.
pub const OUTPUT_CAP: usize = 1 << 20;

/// How long a compile may take when `GGML_HSA_JIT_TIMEOUT` is not set: an IRON compile of the
/// largest fused kernel takes minutes on a laptop, a hung one forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(900);

/// Host variables the compiler is given: where programs, libraries and Python packages are,
/// the user's home and locale.
pub const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONPYCACHEPREFIX",
    "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "XDG_CACHE_HOME",
    "CC",
    "CXX",
];

/// Families of host variables the compiler is given: the backend's own, the IRON toolchain's
/// (mlir-aie, Peano, XRT), the locale's and ccache's, and the simulator's (its compiler's
/// `HSA_SIM_COMPILE_DECLARE`, which the benchmarks set).
pub const PASSED_PREFIXES: &[&str] = &[
    "GGML_HSA_",
    "HSA_SIM_",
    "MLIR_AIE_",
    "PEANO_",
    "XILINX_",
    "XRT_",
    "LC_",
    "CCACHE_",
];

/// Whether the host variable `name` is passed to the compiler.
fn passed(name: &str) -> bool {
    PASSED.contains(&name) || PASSED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The compiler command line (`GGML_HSA_JIT_COMPILER`, split on whitespace) and its time limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiler {
    pub argv: Vec<String>,
    /// `None`: no limit (`GGML_HSA_JIT_TIMEOUT=0`).
    pub timeout: Option<Duration>,
}

impl Compiler {
    pub fn new(command_line: &str) -> Option<Compiler> {
        let argv: Vec<String> = command_line.split_whitespace().map(String::from).collect();
        (!argv.is_empty()).then_some(Compiler {
            argv,
            timeout: Some(DEFAULT_TIMEOUT),
        })
    }

    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Compiler {
        self.timeout = timeout;
        self
    }

    /// The command, run in `work_dir` with the environment described in the module's comment.
    fn command(&self, work_dir: &Path) -> Command {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..]).current_dir(work_dir);
        let host: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| k.to_str().is_some_and(passed))
            .collect();
        cmd.envs(host).env("PYTHONSAFEPATH", "1");
        if let Some(path) = self.package_path() {
            cmd.env("PYTHONPATH", path);
        }
        cmd
    }

    /// For the IRON package run as a module (`python3 -m ggml_hsa_iron`, the default, with or
    /// without options such as `--target emu`): `PYTHONPATH` with the places a CMake build put the
    /// package in front (`GGML_HSA_IRON_PYTHONPATH`: the install tree, then the source tree), so
    /// it is found without setting anything.
    ///
    /// A built-in place is used only if it passes the rules of kernel directories (`trust`: owned
    /// by the user or root, nobody else can write it or a folder above it) and holds the package:
    /// a source tree that others can write is code others can change.
    fn package_path(&self) -> Option<OsString> {
        let built_in = option_env!("GGML_HSA_IRON_PYTHONPATH").filter(|p| !p.is_empty())?;
        let runs_package = self
            .argv
            .windows(2)
            .any(|w| w[0] == "-m" && w[1] == "ggml_hsa_iron");
        if !runs_package {
            return None;
        }
        let mut path = OsString::new();
        for place in trusted_package_dirs(built_in) {
            if !path.is_empty() {
                path.push(":");
            }
            path.push(place);
        }
        match std::env::var_os("PYTHONPATH") {
            Some(user) if !user.is_empty() => {
                if !path.is_empty() {
                    path.push(":");
                }
                path.push(user);
            }
            _ => {}
        }
        (!path.is_empty()).then_some(path)
    }

    /// Runs the compiler in `work_dir` with nothing of the host but its three streams (inside
    /// ggml-rpc-server it would otherwise hold the clients' sockets, which ggml-rpc does not
    /// make close-on-exec), stdout and stderr captured and bounded, without forking the host's
    /// memory, within its time limit.
    fn run(&self, cmd: &mut Command) -> Result<Finished, String> {
        let limits = Limits {
            timeout: self.timeout,
            output_cap: OUTPUT_CAP,
        };
        let out = child_process::output(cmd, limits).map_err(|e| {
            format!(
                "cannot run the kernel compiler `{}`: {e}",
                self.argv.join(" ")
            )
        })?;
        if out.timed_out {
            return Err(format!(
                "the kernel compiler `{}` ran past its time limit of {} s \
                 (GGML_HSA_JIT_TIMEOUT) and was stopped: {}",
                self.argv.join(" "),
                self.timeout.map_or(0, |t| t.as_secs()),
                captured(&out)
            ));
        }
        Ok(out)
    }

    /// Asks the compiler what it can build, running it in `work_dir`.
    pub fn capabilities(&self, work_dir: &Path) -> Result<Capabilities, String> {
        let out = self.run(self.command(work_dir).arg("capabilities"))?;
        if !out.status.success() {
            return Err(format!(
                "`{} capabilities` failed ({}): {}",
                self.argv.join(" "),
                out.status,
                captured(&out)
            ));
        }
        Capabilities::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// Compiles the request in `request_file` into `out_dir`. Returns the compiler's captured
    /// output on success (for verbose logging).
    pub fn compile(&self, request_file: &Path, out_dir: &Path) -> Result<String, CompileError> {
        let out = self
            .run(
                self.command(out_dir)
                    .arg("compile")
                    .arg("--request")
                    .arg(request_file)
                    .arg("--output-dir")
                    .arg(out_dir),
            )
            .map_err(CompileError::Failed)?;
        let text = captured(&out);
        match out.status.code() {
            Some(0) => Ok(text),
            Some(2) => Err(CompileError::Unsupported(text)),
            _ => Err(CompileError::Failed(format!(
                "the kernel compiler failed ({}): {text}",
                out.status
            ))),
        }
    }
}

/// The places of `built_in` (a `:`-separated list) that pass the rules and hold the package;
/// each other existing place is refused with one warning.
fn trusted_package_dirs(built_in: &str) -> Vec<&str> {
    built_in
        .split(':')
        .filter(|place| !place.is_empty())
        .filter(|place| {
            let package = Path::new(place).join("ggml_hsa_iron").join("__main__.py");
            if !package.exists() {
                return false;
            }
            match super::trust::check_dir(Path::new(place)) {
                Ok(_) => true,
                Err(e) => {
                    crate::log::warn(&format!(
                        "the kernel compiler's package is not taken from {place}: {e}"
                    ));
                    false
                }
            }
        })
        .collect()
}

/// The compiler's stdout and stderr, trimmed, as one string.
fn captured(out: &Finished) -> String {
    let mut text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.trim().is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(err.trim());
    }
    if text.is_empty() {
        text.push_str("(no output)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::desc::Layout;
    use super::*;

    const CAPS: &str = r#"{"protocol": 1, "compiler": "t", "archs": ["aie2p"], "ops": [
        {"op": "ADD", "inputs": 2, "types": ["f32", "bf16"], "broadcast": true},
        {"op": "RELU", "inputs": 1, "types": ["f32"], "noncontiguous": false}]}"#;

    fn desc(op: &str, n_inputs: usize, dtype: &str) -> KernelDesc {
        let t = Layout::contiguous(dtype, 4, [8, 2, 1, 1]);
        KernelDesc {
            op: op.into(),
            op_params: vec![],
            inputs: vec![t.clone(); n_inputs],
            output: t,
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        }
    }

    #[test]
    fn declared_ops_types_and_layouts_are_honoured() {
        let caps = Capabilities::parse(CAPS).unwrap();
        assert_eq!(caps.check(Arch::Aie2p, &desc("ADD", 2, "f32")), Ok(()));
        assert!(caps.check(Arch::Aie2, &desc("ADD", 2, "f32")).is_err());
        assert!(caps.check(Arch::Aie2p, &desc("ADD", 2, "f16")).is_err());
        assert!(caps.check(Arch::Aie2p, &desc("SUB", 2, "f32")).is_err());
        assert!(caps.check(Arch::Aie2p, &desc("ADD", 1, "f32")).is_err());
        let mut relu = desc("RELU", 1, "f32");
        assert_eq!(caps.check(Arch::Aie2p, &relu), Ok(()));
        relu.inputs[0].nb = [64, 4, 64, 64];
        assert!(caps
            .check(Arch::Aie2p, &relu)
            .unwrap_err()
            .contains("contiguous"));
        let mut bcast = desc("RELU", 1, "f32");
        bcast.inputs[0].ne = [8, 1, 1, 1];
        assert!(caps
            .check(Arch::Aie2p, &bcast)
            .unwrap_err()
            .contains("broadcast"));
        // A reduction's output is smaller than its input: that is not broadcasting.
        let mut sum = desc("RELU", 1, "f32");
        sum.output = Layout::contiguous("f32", 4, [1, 1, 1, 1]);
        assert_eq!(caps.check(Arch::Aie2p, &sum), Ok(()));
        let mut rows = desc("RELU", 1, "f32");
        rows.inputs[0] = Layout::contiguous("f32", 4, [4, 500, 1, 1]);
        rows.output = Layout::contiguous("f32", 4, [500, 1, 1, 1]);
        assert_eq!(caps.check(Arch::Aie2p, &rows), Ok(()));
    }

    #[test]
    fn f16_as_bf16_needs_the_compiler_to_declare_it() {
        let mut d = desc("ADD", 2, "f32");
        d.f16_as_bf16 = true;
        let caps = Capabilities::parse(CAPS).unwrap();
        assert!(caps.check(Arch::Aie2p, &d).unwrap_err().contains("bf16"));
        let declared = CAPS.replace("\"archs\"", "\"f16_as_bf16\": true, \"archs\"");
        let caps = Capabilities::parse(&declared).unwrap();
        assert_eq!(caps.check(Arch::Aie2p, &d), Ok(()));
    }

    #[test]
    fn bad_capabilities_are_reported() {
        assert!(Capabilities::parse("nope").unwrap_err().contains("JSON"));
        let v2 = CAPS.replace("\"protocol\": 1", "\"protocol\": 2");
        assert!(Capabilities::parse(&v2).unwrap_err().contains("protocol 2"));
    }

    /// Inside ggml-rpc-server the host holds its clients' sockets without close-on-exec; the
    /// compiler must not get them (it would keep a client waiting after the server died).
    #[test]
    fn the_compiler_inherits_no_socket_of_the_host() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::PermissionsExt;
        let (_listener, stream) = child_process::inheritable_socket().unwrap();
        let fd = stream.as_raw_fd();
        let dir = std::env::temp_dir().join(format!("ggml-hsa-fds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("compiler.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nif test -e /proc/$$/fd/{fd}; then echo inherited >&2; else echo \
                 clean >&2; fi\nexit 1\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = Compiler::new(script.to_str().unwrap())
            .unwrap()
            .capabilities(&dir)
            .unwrap_err();
        assert!(err.contains("clean"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_missing_compiler_is_a_clear_error() {
        let c = Compiler::new("/nonexistent/ggml-hsa-compiler --x").unwrap();
        let err = c.capabilities(&std::env::temp_dir()).unwrap_err();
        assert!(err.contains("/nonexistent/ggml-hsa-compiler --x"), "{err}");
        assert!(Compiler::new("   ").is_none());
    }

    #[test]
    fn a_compile_past_its_time_limit_is_stopped_and_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ggml-hsa-slow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("slow.sh");
        std::fs::write(&script, "#!/bin/sh\necho working\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = Compiler::new(script.to_str().unwrap())
            .unwrap()
            .with_timeout(Some(Duration::from_millis(500)));
        let started = std::time::Instant::now();
        let err = c.compile(&dir.join("request.json"), &dir).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(20));
        let err = err.to_string();
        assert!(
            err.contains("GGML_HSA_JIT_TIMEOUT") && err.contains("working"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
