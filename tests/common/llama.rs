//! llama.cpp programs on the plugin and hsa-sim, shared by tests/llama_e2e.rs and tests/rpc_e2e.rs:
//! the hook build's binaries and the models (made by scripts/test.sh; a missing one is a skip, or
//! a failure under `GGML_HSA_REQUIRE_E2E=1`), the environment that puts HSA0 on hsa-sim,
//! tests/c/llama_greedy.cpp, child processes bounded by a timeout, and the reading of
//! `GGML_SCHED_DEBUG=2` output.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A prompt of at least 32 tokens, decoded as one batch.
pub const LONG_PROMPT: &str =
    "The quick brown fox jumps over the lazy dog while the farmer counts \
     his sheep in the green valley below the old stone bridge near the river bank today";
/// Logits of each step, NPU vs CPU: sum((a-b)^2) / sum(b^2). f16 K/V products are computed in
/// f32 on hsa-sim where the CPU rounds the query to f16, which is most of the difference.
pub const MAX_LOGITS_NMSE: f64 = 1e-4;

/// Longest a llama.cpp program of these tests may run before it is killed.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(600);

pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Output of one of the project's scripts (`scripts/llama-cpp.sh path bin-dl`, ...).
pub fn script_output(script: &str, args: &[&str]) -> PathBuf {
    let out = Command::new("bash")
        .arg(root().join("scripts").join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/{script}: {e}"));
    assert!(out.status.success(), "scripts/{script} {args:?} failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `path` if it exists; otherwise `None` (a skip) or a failure under `GGML_HSA_REQUIRE_E2E=1`.
pub fn require(path: PathBuf, made_by: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let message = format!("{} is missing (made by `{made_by}`)", path.display());
    assert!(
        std::env::var("GGML_HSA_REQUIRE_E2E").as_deref() != Ok("1"),
        "{message}"
    );
    eprintln!("skipped: {message}");
    None
}

/// The hook build's bin directory (llama.cpp programs and `libggml-hsa.so`).
pub fn dl_bin() -> Option<PathBuf> {
    let bin = script_output("llama-cpp.sh", &["path", "bin-dl"]);
    require(bin.join("libggml-hsa.so"), "scripts/llama-cpp.sh build-dl").map(|_| bin)
}

pub fn model(name: &str) -> Option<PathBuf> {
    require(
        script_output("models.sh", &["path", name]),
        "scripts/models.sh",
    )
}

/// The environment that puts HSA0 on hsa-sim, with a kernel cache of its own (`tag`).
pub fn sim_env(tag: &str) -> Vec<(String, String)> {
    let cache = super::scratch_dir(&format!("e2e-{tag}"));
    vec![
        (
            "GGML_HSA_LIBHSA_PATH".into(),
            super::sim_artifact("libhsa_runtime64.so")
                .display()
                .to_string(),
        ),
        (
            "GGML_HSA_JIT_COMPILER".into(),
            super::sim_artifact("hsa-sim-compile").display().to_string(),
        ),
        (
            "GGML_HSA_KERNEL_CACHE_DIR".into(),
            cache.display().to_string(),
        ),
    ]
}

/// tests/c/llama_greedy.cpp built against the hook build's libllama.
pub fn greedy_exe(bin: &Path) -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let src = script_output("llama-cpp.sh", &["path", "src"]);
        let exe = super::scratch_dir("e2e-greedy").join("llama_greedy");
        let out = Command::new("g++")
            .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
            .arg(format!("-I{}", src.join("include").display()))
            .arg(format!("-I{}", src.join("ggml/include").display()))
            .arg(root().join("tests/c/llama_greedy.cpp"))
            .arg("-o")
            .arg(&exe)
            .arg(format!("-L{}", bin.display()))
            .args(["-lllama", "-lggml", "-lggml-base"])
            .arg(format!("-Wl,-rpath,{}", bin.display()))
            .output()
            .expect("g++ runs");
        assert!(
            out.status.success(),
            "building llama_greedy failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    })
    .clone()
}

/// How a bounded child process ended.
#[derive(Debug)]
pub struct Finished {
    /// `None` when it was killed at the timeout.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `cmd` to its end or `timeout`, whichever comes first (then kills it). Its output goes
/// to files in a scratch directory, so a chatty child never blocks on a full pipe.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Finished {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = super::scratch_dir(&format!("bounded{}", RUNS.fetch_add(1, Ordering::Relaxed)));
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let status = wait_bounded(&mut child, timeout);
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Finished {
        status,
        stdout: read(&out),
        stderr: read(&err),
        elapsed: start.elapsed(),
    }
}

/// Waits for `child` at most `timeout`; kills (and reaps) it after that and returns `None`.
pub fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[derive(Debug)]
pub struct Greedy {
    pub prompt_tokens: usize,
    pub tokens: Vec<i32>,
    pub text: String,
    pub logits: Vec<f32>,
    /// Wall time of the one-token steps, and how many there were.
    pub gen_seconds: f64,
    pub gen_tokens: usize,
    pub log: String,
}

impl Greedy {
    /// Generated tokens per second over the one-token steps.
    pub fn tokens_per_second(&self) -> f64 {
        self.gen_tokens as f64 / self.gen_seconds.max(1e-9)
    }
}

/// One llama_greedy run: the arguments and environment beyond the model and the prompt.
#[derive(Debug, Clone, Default)]
pub struct GreedyArgs<'a> {
    /// The plugin (`GGML_BACKEND_PATH`) with this environment; `None`: not loaded.
    pub plugin_env: Option<&'a [(String, String)]>,
    /// Tokens fed back instead of the argmax (teacher forcing).
    pub forced: &'a [i32],
    /// Extra llama_greedy arguments (`-ngl N`, `-nkvo`, `--rpc ...`, `-ts ...`).
    pub extra: &'a [&'a str],
    /// Tokens to generate (default 12).
    pub n_predict: Option<usize>,
}

/// Runs llama_greedy: on the CPU alone, or with the plugin and `env`.
pub fn greedy(
    bin: &Path,
    model: &Path,
    prompt: &str,
    plugin_env: Option<&[(String, String)]>,
) -> Greedy {
    greedy_args(bin, model, prompt, plugin_env, &[], &[])
}

/// [`greedy`], feeding back `forced` tokens instead of the argmax (teacher forcing) when any,
/// with extra llama_greedy arguments (`-ngl N`, `-nkvo`).
pub fn greedy_args(
    bin: &Path,
    model: &Path,
    prompt: &str,
    plugin_env: Option<&[(String, String)]>,
    forced: &[i32],
    extra: &[&str],
) -> Greedy {
    let args = GreedyArgs {
        plugin_env,
        forced,
        extra,
        n_predict: None,
    };
    let (run, logits) = greedy_run(bin, model, prompt, &args, RUN_TIMEOUT);
    parse_greedy(&run, &logits)
}

/// Starts llama_greedy with `args` and waits for it at most `timeout`; returns how it ended and
/// the file its logits were written to.
pub fn greedy_run(
    bin: &Path,
    model: &Path,
    prompt: &str,
    args: &GreedyArgs,
    timeout: Duration,
) -> (Finished, PathBuf) {
    let (mut cmd, logits) = greedy_command(bin, model, prompt, args);
    (run_bounded(&mut cmd, timeout), logits)
}

/// The llama_greedy command line of one run, and its logits file.
pub fn greedy_command(
    bin: &Path,
    model: &Path,
    prompt: &str,
    args: &GreedyArgs,
) -> (Command, PathBuf) {
    // Tests run in parallel threads: every run gets its own directory.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let logits_file = super::scratch_dir(&format!("e2e-run{run}")).join("logits.bin");
    let mut cmd = Command::new(greedy_exe(bin));
    cmd.arg("--backend-dir")
        .arg(bin)
        .arg("-m")
        .arg(model)
        .args(args.extra)
        .args(["-n", &args.n_predict.unwrap_or(12).to_string(), "--logits"])
        .arg(&logits_file)
        .arg(prompt)
        .env_remove("GGML_BACKEND_PATH")
        .env("GGML_SCHED_DEBUG", "2");
    if !args.forced.is_empty() {
        let ids: Vec<String> = args.forced.iter().map(i32::to_string).collect();
        cmd.arg("--force").arg(ids.join(","));
    }
    if let Some(env) = args.plugin_env {
        cmd.env("GGML_BACKEND_PATH", bin.join("libggml-hsa.so"));
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
    }
    (cmd, logits_file)
}

/// The result of a llama_greedy run that must have succeeded.
pub fn parse_greedy(run: &Finished, logits_file: &Path) -> Greedy {
    let (stdout, log) = (&run.stdout, &run.stderr);
    match run.status {
        Some(s) if s.success() => {}
        Some(s) => panic!("llama_greedy failed ({s}):\n{stdout}\n{}", tail(log)),
        None => panic!(
            "llama_greedy killed after {:?}:\n{stdout}\n{}",
            run.elapsed,
            tail(log)
        ),
    }
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no `{name}` in:\n{stdout}"))
            .trim()
            .to_owned()
    };
    let bytes = std::fs::read(logits_file).expect("logits written");
    Greedy {
        prompt_tokens: field("prompt_tokens:").parse().unwrap(),
        tokens: field("tokens:")
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect(),
        text: field("text:"),
        logits: bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        gen_seconds: field("gen_seconds:").parse().unwrap(),
        gen_tokens: field("gen_tokens:").parse().unwrap(),
        log: log.clone(),
    }
}

pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// One scheduled graph as `GGML_SCHED_DEBUG=2` prints it.
#[derive(Debug, Default)]
pub struct Graph {
    /// The backend of each split, in order.
    pub splits: Vec<String>,
    /// Nodes per backend.
    pub nodes: BTreeMap<String, usize>,
    /// Ops of the nodes not on HSA0.
    pub off_device: BTreeMap<String, usize>,
}

/// The graphs the scheduler printed after llama.cpp's probes of fused ops (flash attention is
/// probed with a graph of its own, then disabled when the NPU does not take it).
pub fn graphs(log: &str) -> Vec<Graph> {
    let start = log
        .rfind("resolve_fused_ops")
        .map(|at| log[at..].find('\n').map_or(log.len(), |n| at + n))
        .unwrap_or(0);
    let mut graphs: Vec<Graph> = Vec::new();
    for line in log[start..].lines() {
        if let Some(at) = line.find("## SPLIT #") {
            let rest = &line[at + "## SPLIT #".len()..];
            let (number, rest) = rest.split_once(':').unwrap_or(("", ""));
            let backend = rest.split_whitespace().next().unwrap_or("").to_owned();
            if number.trim() == "0" {
                graphs.push(Graph::default());
            }
            if let Some(g) = graphs.last_mut() {
                g.splits.push(backend);
            }
        } else if let Some(at) = line.find("node #") {
            // node #  3 (  RMS_NORM):   name (  1K) [ HSA0   ] use=...
            let rest = &line[at..];
            let (Some(open), Some(close)) = (rest.find('('), rest.find("):")) else {
                continue;
            };
            let op = rest[open + 1..close].trim().to_owned();
            let after = &rest[close..];
            let Some(b) = after.find('[') else { continue };
            let backend = after[b + 1..]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_owned();
            if let Some(g) = graphs.last_mut() {
                *g.nodes.entry(backend.clone()).or_default() += 1;
                if backend != "HSA0" {
                    *g.off_device.entry(op).or_default() += 1;
                }
            }
        }
    }
    graphs
}

pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (&a, &b) in got.iter().zip(want) {
        err += (f64::from(a) - f64::from(b)).powi(2);
        norm += f64::from(b).powi(2);
    }
    err / norm.max(f64::MIN_POSITIVE)
}

/// The worst NMSE of a step's logits, `npu`'s against `cpu`'s (the same steps: a run forced
/// with the other's tokens).
pub fn worst_step_nmse(npu: &Greedy, cpu: &Greedy) -> f64 {
    let n_vocab = cpu.logits.len() / cpu.tokens.len();
    (0..cpu.tokens.len())
        .map(|s| {
            let r = s * n_vocab..(s + 1) * n_vocab;
            nmse(&npu.logits[r.clone()], &cpu.logits[r])
        })
        .fold(0.0, f64::max)
}

/// Tokens equal, logits close step by step; returns the worst NMSE.
pub fn compare(tag: &str, npu: &Greedy, cpu: &Greedy, max_nmse: f64) -> f64 {
    assert_eq!(
        npu.tokens, cpu.tokens,
        "{tag}: tokens differ\nNPU: {}\nCPU: {}",
        npu.text, cpu.text
    );
    assert_eq!(npu.logits.len(), cpu.logits.len(), "{tag}: logits sizes");
    let steps = npu.tokens.len();
    let worst = worst_step_nmse(npu, cpu);
    println!(
        "{tag}: {} tokens identical, worst logits NMSE {worst:.2e} (limit {max_nmse:.0e}); text:{}",
        steps, npu.text
    );
    assert!(
        worst <= max_nmse,
        "{tag}: logits NMSE {worst:.3e} > {max_nmse:.0e}"
    );
    worst
}

pub fn report_placement(tag: &str, graphs: &[Graph]) {
    let last = graphs.last().expect("the scheduler printed graphs");
    println!(
        "{tag}: {} graphs scheduled; last graph: nodes per backend {:?}, splits {:?}, off HSA0: {:?}",
        graphs.len(),
        last.nodes,
        last.splits,
        last.off_device
    );
}
