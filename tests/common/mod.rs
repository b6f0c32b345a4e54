//! Shared by the integration tests: where the built plugin and the pinned llama.cpp binaries are,
//! and a strict reading of test-backend-ops' output.
#![allow(dead_code)]

pub mod llama;
pub mod sample;
pub mod test_backend_ops;

use std::path::{Path, PathBuf};

/// The cdylib cargo built for this test run. `cargo test` writes it to `target/<profile>/deps/`,
/// next to the test executable, and does not refresh the copy in `target/<profile>/`.
pub fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let path = exe.with_file_name("libggml_hsa.so");
    assert!(
        path.is_file(),
        "the plugin {} was not built",
        path.display()
    );
    path
}

/// The directory with the pinned llama.cpp's binaries (`LLAMA_CPP_BIN`, else the one the crate was
/// linked against, where scripts/llama-cpp.sh builds test-backend-ops).
pub fn llama_bin_dir() -> PathBuf {
    std::env::var_os("LLAMA_CPP_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("GGML_HSA_GGML_LIB_DIR")))
}

/// A llama.cpp program, which must exist (build it with `scripts/llama-cpp.sh build`).
pub fn llama_program(name: &str) -> PathBuf {
    let path = llama_bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/llama-cpp.sh build` first",
        path.display()
    );
    path
}

/// The ggml public headers the crate was built against.
pub fn ggml_include_dir() -> PathBuf {
    PathBuf::from(env!("GGML_HSA_GGML_INCLUDE_DIR"))
}

/// Where [`scratch_dir`] puts the scratch directory `name` (without emptying it).
pub fn scratch_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ggml-hsa-{name}-{}", std::process::id()))
}

/// A fresh scratch directory for one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = scratch_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A JIT compiler that exits with `status` (1: a compile failure, 2: a refusal), saying
/// `message`, for every compile request containing `pattern` (a grep pattern), and compiles the
/// rest with hsa-sim-compile; returns its command.
pub fn compiler_declining(tag: &str, pattern: &str, message: &str, status: u8) -> String {
    let script = scratch_dir(tag).join("compiler.sh");
    write_script(
        &script,
        &format!(
            "#!/bin/sh\nif [ \"$1\" = compile ] && grep -q '{pattern}' \"$3\"; then\n  \
             echo '{message}' >&2; exit {status}\nfi\nexec '{}' \"$@\"\n",
            sim_artifact("hsa-sim-compile").display()
        ),
    );
    script.display().to_string()
}

/// Writes an executable script, replacing any one at `path` at once. The file is written by
/// a child shell under a name of its own and then renamed: this process never holds a
/// writable descriptor of it (a child another test thread forks meanwhile would inherit that
/// descriptor until its exec, and running the script then fails with ETXTBSY), and a process
/// running the script it replaces (two children sharing a wrapper) keeps reading the old one.
pub fn write_script(path: &Path, text: &str) {
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    let mut child = std::process::Command::new("sh")
        .args(["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh"])
        .arg(&tmp)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sh");
    child
        .stdin
        .take()
        .expect("the shell's stdin")
        .write_all(text.as_bytes())
        .expect("write the script");
    let status = child.wait().expect("sh");
    assert!(status.success(), "writing {}", tmp.display());
    std::fs::rename(&tmp, path).expect("the script in place");
}

/// A build output of the hsa-sim workspace member (`libhsa_runtime64.so`, `hsa-sim-compile`),
/// preferring the copy cargo refreshed for this run (`deps/`) over the uplifted one.
pub fn sim_artifact(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    let candidates = [
        deps.join(name),
        deps.parent().expect("profile dir").join(name),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "{name} is missing next to {}: build the simulator first (cargo build --workspace)",
                deps.display()
            )
        })
}

/// Runs the ignored test `name` of this test binary in a child process with `env` added (tests
/// whose subject reads its environment once per process run their scenario this way). Panics,
/// with everything the child printed, unless it ran that one test and passed; returns its output.
pub fn run_child_test(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", name, "--nocapture"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the test binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} failed in a child process:\n{text}"
    );
    assert!(
        text.contains("1 passed"),
        "the child test {name} did not run:\n{text}"
    );
    text
}

/// The environment that makes the IRON package's emulation target (`python3 -m ggml_hsa_iron
/// --target emu`) the JIT compiler: the compiler command, the package on `PYTHONPATH`, and a
/// cache of the host-built core libraries shared by the tests (`emu_cache`).
///
/// The interpreter is named by its resolved path (a version manager's `python3` shim, pyenv's
/// for one, is a shell script that costs about 0.1 s per compile), and bytecode is written to a
/// cache under the target dir even where the environment says not to (`PYTHONDONTWRITEBYTECODE`,
/// set on some CI images: each compile then recompiles every module): an emulated test-backend-ops
/// run starts one compiler per kernel, thousands of them, and both halve a compile's time.
/// The AIE core libraries go to the one cache every emulated test shares ([`emu_cache_dir`]), and
/// the compiles to this test process's compile server ([`emu_compile_server`]).
pub fn emu_compiler_env() -> Vec<(String, String)> {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let python = PYTHON.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 runs");
        let exe = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(
            out.status.success() && !exe.is_empty() && !exe.contains(char::is_whitespace),
            "python3 does not name its interpreter: {exe:?}"
        );
        exe
    });
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut env = vec![
        (
            "GGML_HSA_JIT_COMPILER".into(),
            format!("{python} -m ggml_hsa_iron --target emu"),
        ),
        ("PYTHONPATH".into(), root.join("src").display().to_string()),
        ("PYTHONDONTWRITEBYTECODE".into(), String::new()),
        (
            "PYTHONPYCACHEPREFIX".into(),
            root.join("target").join("pycache").display().to_string(),
        ),
        (
            "GGML_HSA_EMU_CACHE_DIR".into(),
            emu_cache_dir().display().to_string(),
        ),
    ];
    if let Some(socket) = emu_compile_server(python, &env) {
        env.push(("GGML_HSA_EMU_SERVER".into(), socket.display().to_string()));
    }
    env
}

/// The emulation target's compile server (`src/ggml_hsa_iron/compile_server.py`) of this test
/// process, started on first use: each compile the backend starts is then a fork of a Python
/// that has imported numpy and the package already (half a short compile's time), with the same
/// output. It exits with this process. None when it does not start or
/// `GGML_HSA_TEST_EMU_SERVER=0` (each compile then runs in a process of its own, as without
/// tests).
pub fn emu_compile_server(python: &str, env: &[(String, String)]) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    static SERVER: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    SERVER
        .get_or_init(|| {
            if std::env::var_os("GGML_HSA_TEST_EMU_SERVER").is_some_and(|v| v == "0") {
                return None;
            }
            // A short path: a socket's must fit in 108 bytes.
            let dir = scratch_dir("emu-server");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).ok()?;
            let socket = dir.join("sock");
            let mut server = std::process::Command::new(python)
                .args(["-m", "ggml_hsa_iron.compile_server", "--socket"])
                .arg(&socket)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(std::process::Stdio::null())
                .spawn()
                .ok()?;
            let start = std::time::Instant::now();
            while !socket.exists() {
                let gone = !matches!(server.try_wait(), Ok(None));
                if gone || start.elapsed() > std::time::Duration::from_secs(60) {
                    eprintln!("the emulation's compile server did not start: compiles run alone");
                    return None;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Some(socket)
        })
        .clone()
}

/// The cache of the emulation's AIE core libraries (built with g++ per core source and
/// configuration, keyed by their content, so safe to share): one for every test of the workspace
/// (hsa-sim's too) and for scripts/check-iron.sh, in cargo's scratch directory for tests.
pub fn emu_cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ggml-hsa-emu-cache")
}

/// Asserts that the kernel cache directory `dir` (one architecture's) holds, for each of
/// `prefixes`, a kernel whose file name starts with it: what a graph asked for was compiled
/// (kernels are compiled only when a graph needs them).
pub fn assert_kernels_built(dir: &std::path::Path, prefixes: &[&str]) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for prefix in prefixes {
        assert!(
            names.iter().any(|n| n.starts_with(prefix)),
            "no kernel {prefix}* in {}: {names:?}",
            dir.display()
        );
    }
}

/// hsa-sim-compile behind a wrapper script in `dir` that declines (exit 2, "cannot build this
/// kernel", as the IRON package does for a shape its design refuses) every kernel of protocol op
/// `op`; returns the script's path.
pub fn declining_compiler(dir: &Path, op: &str) -> PathBuf {
    let wrapper = dir.join("compiler.sh");
    write_script(
        &wrapper,
        &format!(
            "#!/bin/sh\n\
             if [ \"$1\" = compile ] && grep -q '\"op\":\"{op}\"' \"$3\"; then\n\
             echo 'declined for the test' >&2; exit 2; fi\n\
             exec {} \"$@\"\n",
            sim_artifact("hsa-sim-compile").display()
        ),
    );
    wrapper
}
