//! HSA0 served through ggml's RPC backend (docs/several-machines.md): `ggml-rpc-server -d HSA0`
//! processes of the hook build, each on its own simulated NPU (hsa-sim) with its own kernel
//! cache, on 127.0.0.1 at ports chosen free at run time, and llama.cpp clients without the plugin:
//! * the tiny llama (f32, Q4_0) with every layer on one remote HSA0 gives the CPU's greedy text;
//!   the client's scheduler put the layers on the RPC device and the server's NPU ran kernels;
//! * two servers with the layers split between them (`-ts 1,1`): the same text, both NPUs busy;
//! * test-backend-ops against the RPC device backed by HSA0, for the starter ops;
//! * faults: a server killed mid-generation gives the client a clear error within a bound; a
//!   kernel that fails to compile on the server runs on the server's CPU and the server lives on;
//! * `--ignored` (the long mode): tokens/s and bytes per token over the socket for a local
//!   HSA0, one remote and two remote HSA0s.
//!
//! Every child process is bounded by a timeout and killed at the end. The builds and models are
//! made by scripts/test.sh; a missing one is a skip, or a failure under `GGML_HSA_REQUIRE_E2E=1`.

mod common;

use common::llama::*;
use common::test_backend_ops::{op_names_filter, Report};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A client run (model load over the socket, a 33-token batch, 11 one-token steps).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The fewest kernels a server's NPU dispatches for a tiny llama's greedy run: one per layer (4)
/// for each of its 12 generated tokens at least.
const MIN_DISPATCHES: u64 = 4 * 12;

/// The serving environment docs/several-machines.md documents: the plugin, hsa-sim, a kernel cache of the
/// server's own, and `GGML_HSA_CPU_FALLBACK=1` (ggml's RPC client claims every op for the
/// remote device and the server aborts on a failed graph, so nodes without an NPU kernel must
/// run on the server's CPU).
struct RpcServer {
    child: Child,
    port: u16,
    log: PathBuf,
    counters: PathBuf,
    cache: PathBuf,
}

/// A port nobody listens on now (the kernel's choice for an ephemeral bind).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

impl RpcServer {
    /// The hook build's server, loading the plugin through `GGML_BACKEND_PATH`.
    fn start(bin: &Path, tag: &str, extra_env: &[(&str, &str)]) -> RpcServer {
        let plugin = bin.join("libggml-hsa.so");
        Self::start_program(&bin.join("ggml-rpc-server"), Some(&plugin), tag, extra_env)
    }

    /// `program` (a ggml-rpc-server) serving HSA0, with `plugin` as `GGML_BACKEND_PATH` (none
    /// for a build with the backend linked in).
    fn start_program(
        program: &Path,
        plugin: Option<&Path>,
        tag: &str,
        extra_env: &[(&str, &str)],
    ) -> RpcServer {
        // Another process may take the port between our probe and the server's bind: retry.
        let mut last_log = String::new();
        for attempt in 0..3 {
            let dir = common::scratch_dir(&format!("rpc-{tag}-{attempt}"));
            let port = free_port();
            let (log, counters, cache) = (
                dir.join("server.log"),
                dir.join("counters.json"),
                dir.join("kernels"),
            );
            let file = std::fs::File::create(&log).unwrap();
            let mut cmd = Command::new(program);
            cmd.args(["-d", "HSA0", "-H", "127.0.0.1", "-p", &port.to_string()])
                .env_remove("GGML_BACKEND_PATH")
                .envs(sim_env(&format!("rpc-{tag}")))
                .env("GGML_HSA_KERNEL_CACHE_DIR", &cache)
                .env("GGML_HSA_CPU_FALLBACK", "1")
                .env("GGML_HSA_ENABLE_LOG", "1")
                .env("HSA_SIM_COUNTERS", &counters)
                .env("GGML_NO_BACKTRACE", "1")
                .envs(extra_env.iter().copied())
                .envs(plugin.map(|p| ("GGML_BACKEND_PATH", p)))
                .stdin(Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file);
            let mut server = RpcServer {
                child: cmd.spawn().expect("ggml-rpc-server starts"),
                port,
                log,
                counters,
                cache,
            };
            if server.wait_listening() {
                return server;
            }
            last_log = server.log_text();
        }
        panic!("ggml-rpc-server never listened:\n{}", tail(&last_log));
    }

    /// Polls the port until the server accepts (each probe is a client that says nothing and
    /// leaves; the server goes back to accepting) or exits.
    fn wait_listening(&mut self) -> bool {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the server printed so far (stdout and stderr).
    fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// hsa-sim's counters of this server's NPU (rewritten after every doorbell).
    fn dispatches(&self) -> u64 {
        let Ok(text) = std::fs::read_to_string(&self.counters) else {
            return 0;
        };
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        doc["dispatches"].as_u64().unwrap_or(0)
    }

    /// Nodes the server's backend ran on its CPU instead of the NPU (GGML_HSA_ENABLE_LOG).
    fn cpu_nodes(&self) -> usize {
        self.cpu_ops().values().sum()
    }

    /// [`Self::cpu_nodes`] per op.
    fn cpu_ops(&self) -> std::collections::BTreeMap<String, usize> {
        let mut ops = std::collections::BTreeMap::new();
        for line in self.log_text().lines() {
            if let Some((head, _)) = line.split_once(") on the CPU: ") {
                if let Some((_, op)) = head.rsplit_once('(') {
                    *ops.entry(op.to_owned()).or_default() += 1;
                }
            }
        }
        ops
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A client run with every layer on the RPC devices of `servers` (`-ts` when given).
fn remote(
    bin: &Path,
    model: &Path,
    prompt: &str,
    servers: &[&RpcServer],
    split: Option<&str>,
    forced: &[i32],
) -> Greedy {
    let endpoints: Vec<String> = servers.iter().map(|s| s.endpoint()).collect();
    let joined = endpoints.join(",");
    let mut extra = vec!["--rpc", &joined];
    if let Some(ts) = split {
        extra.extend(["-ts", ts]);
    }
    let args = GreedyArgs {
        plugin_env: None,
        forced,
        extra: &extra,
        n_predict: None,
    };
    let (mut cmd, logits) = greedy_command(bin, model, prompt, &args);
    // An abort must not attach gdb to print a backtrace.
    cmd.env("GGML_NO_BACKTRACE", "1");
    parse_greedy(&run_bounded(&mut cmd, CLIENT_TIMEOUT), &logits)
}

/// Nodes per split backend (full names: `RPC0[127.0.0.1:port]`) of the client's last scheduled
/// graph. The scheduler prints each split's header before its nodes, and cuts the backend name
/// in node lines (`RPC0[`), so the split headers tell servers apart.
fn last_graph_nodes(run: &Greedy) -> std::collections::BTreeMap<String, usize> {
    let start = run.log.rfind("## SPLIT #0:").unwrap_or(0);
    let mut nodes = std::collections::BTreeMap::new();
    let mut backend = String::new();
    for line in run.log[start..].lines() {
        if let Some((_, rest)) = line.split_once("## SPLIT #") {
            let name = rest.split_once(':').map_or("", |(_, r)| r);
            backend = name.split_whitespace().next().unwrap_or("").to_owned();
        } else if line.contains("node #") {
            *nodes.entry(backend.clone()).or_default() += 1;
        }
    }
    nodes
}

/// Nodes the client's scheduler gave to the RPC device of `server` in the last graph.
fn nodes_on(run: &Greedy, server: &RpcServer) -> usize {
    last_graph_nodes(run)
        .iter()
        .filter(|(backend, _)| backend.ends_with(&format!("[{}]", server.endpoint())))
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn server_lists_hsa0_with_its_name_description_and_memory() {
    let Some(bin) = dl_bin() else { return };
    let server = RpcServer::start(&bin, "list", &[]);
    // The server prints its devices before it listens; its stdout is a file, flushed when it
    // accepts a client (the readiness probe).
    let deadline = Instant::now() + START_TIMEOUT;
    while !server.log_text().contains("Accepted client") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = server.log_text();
    let line = log
        .lines()
        .find(|l| l.trim_start().starts_with("HSA0:"))
        .unwrap_or_else(|| panic!("no HSA0 in the server's device list:\n{}", tail(&log)));
    println!("ggml-rpc-server -d HSA0 lists: {}", line.trim());
    // "HSA0: aie2p (N MiB, M MiB free)": the agent name and the data pool's size.
    assert!(line.contains("aie2p") && line.contains(" MiB"), "{line}");
    assert!(
        log.contains(&format!("127.0.0.1:{}", server.port)),
        "endpoint not printed:\n{log}"
    );
}

#[test]
fn tiny_llama_on_one_remote_hsa0_gives_the_cpus_text() {
    let Some(bin) = dl_bin() else { return };
    let server = RpcServer::start(&bin, "one", &[]);
    for name in ["tiny-llama-f32", "tiny-llama-q4_0"] {
        let Some(model) = model(name) else { return };
        let cpu = greedy(&bin, &model, LONG_PROMPT, None);
        let before = server.dispatches();
        let npu = remote(&bin, &model, LONG_PROMPT, &[&server], None, &[]);
        assert_eq!(
            npu.text, cpu.text,
            "{name}: remote HSA0 and CPU texts differ"
        );
        let worst = compare(name, &npu, &cpu, quantized_tolerance(name));
        let on_rpc = nodes_on(&npu, &server);
        let dispatched = server.dispatches() - before;
        println!(
            "{name} on RPC0[{}] (HSA0): same text as the CPU ({:?}), worst logits NMSE \
             {worst:.2e}; client's last graph: {:?}; server: {dispatched} NPU dispatches, \
             nodes on its CPU so far: {:?}",
            server.endpoint(),
            npu.text,
            last_graph_nodes(&npu),
            server.cpu_ops()
        );
        // Every layer on the remote device: all but the input layer's embedding lookup.
        assert!(on_rpc >= 80, "{name}: {on_rpc} nodes on the RPC device");
        assert!(
            dispatched >= MIN_DISPATCHES,
            "{name}: {dispatched} dispatches on the server's NPU"
        );
    }
}

/// f32: the CPU's logits within 1e-4 (tests/llama_e2e.rs). Q4_0: the CPU quantizes the
/// activations to Q8_0 before its dot products and HSA0 keeps them in f32, so the logits differ
/// more (docs/status.md); the text must still be the same.
fn quantized_tolerance(name: &str) -> f64 {
    if name.ends_with("f32") {
        MAX_LOGITS_NMSE
    } else {
        5e-3
    }
}

/// The in-tree static build (`scripts/llama-cpp.sh build-static`): its ggml-rpc-server has HSA
/// linked in (no `GGML_BACKEND_PATH`) and serves the hook build's client.
#[test]
fn static_build_server_serves_hsa0_to_a_client() {
    let static_bin = script_output("llama-cpp.sh", &["path", "bin-static"]);
    let (Some(bin), Some(program), Some(model)) = (
        dl_bin(),
        require(
            static_bin.join("ggml-rpc-server"),
            "scripts/llama-cpp.sh build-static ggml-rpc-server",
        ),
        model("tiny-llama-f32"),
    ) else {
        return;
    };
    let server = RpcServer::start_program(&program, None, "static", &[]);
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let npu = remote(&bin, &model, LONG_PROMPT, &[&server], None, &[]);
    compare(
        "static build's ggml-rpc-server",
        &npu,
        &cpu,
        MAX_LOGITS_NMSE,
    );
    assert!(server.log_text().contains("HSA0: aie2p"));
    assert!(nodes_on(&npu, &server) >= 80);
    assert!(server.dispatches() >= MIN_DISPATCHES);
}

#[test]
fn layers_split_between_two_remote_hsa0s_give_the_cpus_text() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let (a, b) = (
        RpcServer::start(&bin, "split-a", &[]),
        RpcServer::start(&bin, "split-b", &[]),
    );
    assert_ne!(a.cache, b.cache);
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let npu = remote(&bin, &model, LONG_PROMPT, &[&a, &b], Some("1,1"), &[]);
    compare(
        "tiny-llama-f32 on two RPC HSA0s",
        &npu,
        &cpu,
        MAX_LOGITS_NMSE,
    );
    let (on_a, on_b) = (nodes_on(&npu, &a), nodes_on(&npu, &b));
    println!(
        "-ts 1,1: {on_a} nodes on {}, {on_b} on {}; NPU dispatches {} and {}; splits {:?}",
        a.endpoint(),
        b.endpoint(),
        a.dispatches(),
        b.dispatches(),
        graphs(&npu.log).pop().map(|g| g.splits)
    );
    // llama.cpp rounds the split of 4 layers and the output layer: 3 layers on one, a layer and
    // the output on the other; at least a layer (about 20 nodes) each.
    assert!(on_a >= 20 && on_b >= 20, "{on_a} and {on_b} nodes");
    assert!(
        on_a + on_b >= 80,
        "{on_a} + {on_b} nodes on the two servers"
    );
    assert!(a.dispatches() > 0 && b.dispatches() > 0);
    // Each server compiled into its own cache.
    for s in [&a, &b] {
        let kernels = walk_count(&s.cache);
        assert!(kernels > 0, "no kernel in {}", s.cache.display());
    }
}

fn walk_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let p = e.path();
                    if p.is_dir() {
                        walk_count(&p)
                    } else {
                        usize::from(p.extension().is_some_and(|x| x == "pdi"))
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// tests/c/rpc_devices_plugin.cpp: registers an RPC server's devices in test-backend-ops.
fn rpc_devices_plugin(bin: &Path) -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let src = script_output("llama-cpp.sh", &["path", "src"]);
        let lib = common::scratch_dir("rpc-plugin").join("librpc_devices_plugin.so");
        let out = Command::new("g++")
            .args([
                "-std=c++17",
                "-O1",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-shared",
                "-fPIC",
            ])
            .arg(format!("-I{}", src.join("ggml/include").display()))
            .arg(root().join("tests/c/rpc_devices_plugin.cpp"))
            .arg("-o")
            .arg(&lib)
            .arg(format!("-L{}", bin.display()))
            .args(["-lggml", "-lggml-base"])
            .arg(format!("-Wl,-rpath,{}", bin.display()))
            .output()
            .expect("g++ runs");
        assert!(
            out.status.success(),
            "building rpc_devices_plugin failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    })
    .clone()
}

/// The buffer slots ggml's RPC server calls on HSA0's buffers, from a client
/// (tests/c/rpc_buffer_ops.cpp): set/get, cpy_tensor between two buffers on the server, memset,
/// clear and get_alloc_size, each checked by reading back; the server's `GGML_RPC_DEBUG` log
/// shows it performed each command.
#[test]
fn the_servers_buffer_commands_work_on_hsa0_buffers() {
    let Some(bin) = dl_bin() else { return };
    let src = script_output("llama-cpp.sh", &["path", "src"]);
    let exe = common::scratch_dir("rpc-buffer-ops").join("rpc_buffer_ops");
    let out = Command::new("g++")
        .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-I{}", src.join("ggml/include").display()))
        .arg(format!("-I{}", src.join("ggml/src").display()))
        .arg(root().join("tests/c/rpc_buffer_ops.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", bin.display()))
        .args(["-lggml", "-lggml-base"])
        .arg(format!("-Wl,-rpath,{}", bin.display()))
        .output()
        .expect("g++ runs");
    assert!(
        out.status.success(),
        "building rpc_buffer_ops failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let server = RpcServer::start(&bin, "buffers", &[("GGML_RPC_DEBUG", "1")]);
    let mut cmd = Command::new(&exe);
    cmd.arg(&bin)
        .arg(server.endpoint())
        .env_remove("GGML_BACKEND_PATH")
        .env("GGML_NO_BACKTRACE", "1");
    let run = run_bounded(&mut cmd, CLIENT_TIMEOUT);
    assert!(
        run.status.is_some_and(|s| s.success()) && run.stdout.contains("all ok"),
        "{}{}\nserver:\n{}",
        run.stdout,
        run.stderr,
        tail(&server.log_text())
    );
    print!("{}", run.stdout);
    let log = server.log_text();
    for command in [
        "[copy_tensor]",
        "[memset_tensor]",
        "[buffer_clear]",
        "[get_alloc_size]",
    ] {
        assert!(log.contains(command), "the server never ran {command}");
    }
}

const STARTER_OPS: &str = "ADD,SUB,MUL,DIV,ABS,SGN,NEG,STEP,TANH,ELU,RELU,SIGMOID,GELU,GELU_QUICK,\
     SILU,HARDSWISH,HARDSIGMOID,EXP,GELU_ERF,SQR,SQRT,LOG,SIN,COS,FLOOR,CEIL,ROUND,TRUNC,SCALE,\
     CLAMP,MUL_MAT";

#[test]
fn test_backend_ops_on_the_rpc_device_backed_by_hsa0() {
    let Some(bin) = dl_bin() else { return };
    let program = bin.join("test-backend-ops");
    let Some(program) = require(program, "scripts/llama-cpp.sh build-dl test-backend-ops") else {
        return;
    };
    let server = RpcServer::start(&bin, "tbo", &[]);
    // ggml-rpc names the devices of the servers a process adds RPC0, RPC1, ... (description: the
    // endpoint).
    let device = "RPC0".to_owned();
    let plugin = rpc_devices_plugin(&bin);
    // The cases with f32 operands (about a third): the transport carries every type alike, and
    // HSA0's own sweeps (backend_ops_sim.rs, backend_ops_emu.rs) run every type.
    let mut cmd = Command::new(&program);
    cmd.args([
        "-b",
        &device,
        "-o",
        &op_names_filter(STARTER_OPS),
        "-p",
        "type(_a|_src)?=f32,",
    ])
    .env("GGML_BACKEND_PATH", &plugin)
    .env("GGML_HSA_TEST_RPC_ENDPOINT", server.endpoint())
    .env("GGML_NO_BACKTRACE", "1");
    let run = run_bounded(&mut cmd, Duration::from_secs(1500));
    let text = format!("{}{}", run.stdout, run.stderr);
    let report = Report::parse(&text, run.status.and_then(|s| s.code()), &device);
    println!(
        "test-backend-ops -b {device}: {}/{} passed in {:.0?}; server: {} NPU dispatches, {} \
         nodes on its CPU (cases HSA0 declines: ggml's RPC client does not ask)",
        report.passed,
        report.total,
        run.elapsed,
        server.dispatches(),
        server.cpu_nodes()
    );
    if let Err(e) = report.expect_cases(&device) {
        panic!(
            "{e}\n{}\nserver:\n{}",
            tail(&text),
            tail(&server.log_text())
        );
    }
    assert!(report.total >= 300, "only {} cases ran", report.total);
    // Most of them on the NPU (the rest on the server's CPU).
    assert!(
        server.dispatches() >= 300,
        "{} NPU dispatches",
        server.dispatches()
    );
}

/// The line a client whose server went away ended with: ggml-rpc's error, then an abort. The
/// clients here ignore SIGPIPE (`--ignore-sigpipe`), so a send to a closed socket fails with
/// EPIPE and is reported like any other failure; a client that does not ignore it dies of
/// SIGPIPE, silently, whenever the server goes while it is sending (docs/several-machines.md).
fn rpc_abort(status: std::process::ExitStatus, log: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    let line = log
        .lines()
        .find(|l| l.contains("Remote RPC server crashed"))
        .unwrap_or_else(|| panic!("{status}, no RPC error in the client's log:\n{}", tail(log)));
    assert_eq!(
        status.signal(),
        Some(6),
        "{status}: the client did not abort after: {line}\n{}",
        tail(log)
    );
    line.trim().to_owned()
}

#[test]
fn a_server_killed_mid_generation_gives_the_client_a_clear_error() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let mut server = RpcServer::start(&bin, "killed", &[]);
    let endpoint = server.endpoint();
    let extra = ["--rpc", endpoint.as_str(), "--ignore-sigpipe"];
    let args = GreedyArgs {
        plugin_env: None,
        forced: &[],
        extra: &extra,
        n_predict: Some(200),
    };
    let (mut cmd, _) = greedy_command(&bin, &model, "Hello", &args);
    let dir = common::scratch_dir("rpc-killed-client");
    let err = dir.join("stderr");
    let mut client = cmd
        .env("GGML_NO_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    // Kill the server once the client is generating (a few one-token graphs scheduled).
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    // The log may hold bytes that are not UTF-8 (a token cut in the middle): read it lossily.
    let read_log =
        || String::from_utf8_lossy(&std::fs::read(&err).unwrap_or_default()).into_owned();
    let graphs_so_far = || read_log().matches("## SPLIT #0").count();
    while graphs_so_far() < 4 && Instant::now() < deadline {
        assert!(
            client.try_wait().unwrap().is_none(),
            "the client ended before the kill:\n{}",
            tail(&read_log())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(graphs_so_far() >= 4, "the client never got going");
    server.kill();
    let killed_at = Instant::now();
    let status = wait_bounded(&mut client, Duration::from_secs(60));
    let log = read_log();
    let status = status.unwrap_or_else(|| {
        panic!(
            "the client hung for 60 s after its server died:\n{}",
            tail(&log)
        )
    });
    assert!(!status.success(), "the client succeeded without its server");
    let message = rpc_abort(status, &log);
    println!(
        "server killed mid-generation: the client ended {:.1?} later ({status}) saying: {}",
        killed_at.elapsed(),
        message
    );
}

/// A JIT compiler that fails (exit 1, a compile failure rather than a refusal) every request
/// containing `pattern` and compiles the rest with hsa-sim-compile; returns its command.
fn failing_compiler(tag: &str, pattern: &str, what: &str) -> String {
    common::compiler_declining(
        tag,
        pattern,
        &format!("injected failure: no {what} today"),
        1,
    )
}

#[test]
fn a_kernel_that_fails_to_compile_on_the_server_runs_on_the_servers_cpu() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    // A compiler that fails every RMS_NORM kernel (and every RMS_NORM_MUL, the norm fused with
    // its weight row, which gives its nodes back) and compiles the rest with hsa-sim-compile.
    let compiler = failing_compiler(
        "rpc-failing-compiler",
        "\"RMS_NORM\\(_MUL\\)*\"",
        "RMS_NORM",
    );
    let mut server = RpcServer::start(
        &bin,
        "failing",
        &[("GGML_HSA_JIT_COMPILER", compiler.as_str())],
    );
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let npu = remote(&bin, &model, LONG_PROMPT, &[&server], None, &[]);
    compare(
        "RMS_NORM failing to compile on the server",
        &npu,
        &cpu,
        MAX_LOGITS_NMSE,
    );
    let log = server.log_text();
    assert!(
        log.contains("injected failure"),
        "the compiler's failure was not logged:\n{}",
        tail(&log)
    );
    let rms_on_cpu = log
        .lines()
        .filter(|l| l.contains("(RMS_NORM) on the CPU"))
        .count();
    println!(
        "server: {rms_on_cpu} RMS_NORM nodes on its CPU after the compile failure, {} NPU \
         dispatches for the rest; still serving",
        server.dispatches()
    );
    assert!(rms_on_cpu > 0);
    assert!(server.alive(), "the server died:\n{}", tail(&log));
    // And it serves the next client.
    let again = remote(&bin, &model, "Hello", &[&server], None, &[]);
    assert!(!again.tokens.is_empty());
    assert!(server.alive());
}

/// The documented limitation (docs/limitations.md): without `GGML_HSA_CPU_FALLBACK` the
/// first node HSA0 cannot run fails the server's graph and ggml-rpc-server aborts; its log says
/// what to set, and the client ends with ggml's RPC error instead of hanging. hsa-sim runs every
/// node of the tiny llama (FLASH_ATTN_EXT included, which the client turns on for an RPC
/// device), so the server's compiler fails the FLASH_ATTN_EXT kernels (exit 1, not a refusal,
/// which would run the node on the CPU).
#[test]
fn without_the_cpu_fallback_a_server_stops_and_says_why() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let compiler = failing_compiler(
        "rpc-no-fallback-compiler",
        "\"FLASH_ATTN_EXT",
        "FLASH_ATTN_EXT",
    );
    let mut server = RpcServer::start(
        &bin,
        "no-fallback",
        &[
            ("GGML_HSA_CPU_FALLBACK", "0"),
            ("GGML_HSA_JIT_COMPILER", compiler.as_str()),
        ],
    );
    let endpoint = server.endpoint();
    let extra = ["--rpc", endpoint.as_str(), "--ignore-sigpipe"];
    let args = GreedyArgs {
        plugin_env: None,
        forced: &[],
        extra: &extra,
        n_predict: None,
    };
    let (mut cmd, _) = greedy_command(&bin, &model, "Hello", &args);
    cmd.env("GGML_NO_BACKTRACE", "1");
    let run = run_bounded(&mut cmd, CLIENT_TIMEOUT);
    let status = run.status.expect("the client hung");
    assert!(!status.success(), "the client succeeded");
    // ggml-rpc's error and an abort; the server's log below says why.
    let message = rpc_abort(status, &run.stderr);
    let deadline = Instant::now() + START_TIMEOUT;
    while server.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = server.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("graph_compute failed"))
        .unwrap_or_else(|| panic!("no failure logged:\n{}", tail(&log)));
    println!(
        "without the fallback the server stopped ({}) after: {line}; the client: {message}",
        !server.alive()
    );
    assert!(line.contains("GGML_HSA_CPU_FALLBACK=1"), "{line}");
}

/// docs/several-machines.md: one server records the kernels of a representative run,
/// `ggml-hsa-gen-kernels` pregenerates them, and a server with that directory and JIT off serves
/// the same model without compiling anything: the CPU's text, and no node on the server's CPU
/// but the ops HSA0 never takes (a missing kernel would put its nodes there).
#[test]
fn pregenerated_kernels_let_a_server_serve_without_compiling() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let dir = common::scratch_dir("rpc-pregenerated");
    let (config, kernels) = (dir.join("kernels.json"), dir.join("kernels"));
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    {
        let config = config.display().to_string();
        let recorder = RpcServer::start(&bin, "record", &[("GGML_HSA_KERNEL_RECORD", &config)]);
        remote(&bin, &model, LONG_PROMPT, &[&recorder], None, &[]);
    }
    let compiler = common::sim_artifact("hsa-sim-compile");
    let mut gen = Command::new(bin.join("ggml-hsa-gen-kernels"));
    gen.arg("--config")
        .arg(&config)
        .arg("--output-dir")
        .arg(&kernels)
        .arg("--compiler")
        .arg(&compiler);
    let run = run_bounded(&mut gen, CLIENT_TIMEOUT);
    assert!(
        run.status.is_some_and(|s| s.success()),
        "ggml-hsa-gen-kernels failed:\n{}{}",
        run.stdout,
        run.stderr
    );
    let pregenerated = walk_count(&kernels);
    let kernel_dir = kernels.display().to_string();
    let server = RpcServer::start(
        &bin,
        "pregenerated",
        &[
            ("GGML_HSA_KERNEL_DIR", kernel_dir.as_str()),
            ("GGML_HSA_JIT_COMPILER", "off"),
        ],
    );
    let npu = remote(&bin, &model, LONG_PROMPT, &[&server], None, &[]);
    compare(
        "served from pregenerated kernels, JIT off",
        &npu,
        &cpu,
        MAX_LOGITS_NMSE,
    );
    let log = server.log_text();
    let on_cpu: std::collections::BTreeSet<&str> = log
        .lines()
        .filter_map(|l| l.split_once(") on the CPU: "))
        .filter_map(|(head, _)| head.rsplit_once('(').map(|(_, op)| op))
        .collect();
    println!(
        "{pregenerated} kernels pregenerated; the JIT-off server dispatched {} kernels, compiled \
         {} and ran only {on_cpu:?} on its CPU",
        server.dispatches(),
        walk_count(&server.cache)
    );
    assert!(pregenerated > 0);
    assert_eq!(walk_count(&server.cache), 0, "the server compiled kernels");
    assert!(
        on_cpu.iter().all(|op| *op == "FLASH_ATTN_EXT"),
        "nodes without a kernel ran on the server's CPU: {on_cpu:?}"
    );
    assert!(server.dispatches() >= MIN_DISPATCHES);
}

/// Forwards one TCP endpoint to another and counts the bytes each way.
struct CountingProxy {
    port: u16,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl CountingProxy {
    fn new(target: u16) -> CountingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let (u, d, s) = (up.clone(), down.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    u.clone(),
                );
                pump(server, client, d.clone());
            }
        });
        CountingProxy {
            port,
            up,
            down,
            stop,
        }
    }

    fn bytes(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        )
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, count: Arc<AtomicU64>) {
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    count.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// `cargo test --test rpc_e2e -- --ignored --nocapture`: tokens/s of the one-token steps and
/// bytes per generated token over the socket, for HSA0 in the client's process, one remote HSA0
/// and two remote HSA0s (`-ts 1,1`), on the tiny llama (f32). Bytes per token are the
/// difference between a 36-token and a 12-token run over 24 tokens (model upload and prompt
/// cancel out).
#[test]
#[ignore = "long mode: prints the cost of the network hop"]
fn figures_local_vs_one_remote_vs_two_remote() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let (short, long) = (12usize, 36usize);
    let run = |extra: &[&str], plugin: Option<&[(String, String)]>, n: usize| {
        let args = GreedyArgs {
            plugin_env: plugin,
            forced: &[],
            extra,
            n_predict: Some(n),
        };
        let (run, logits) = greedy_run(&bin, &model, "Hello", &args, CLIENT_TIMEOUT);
        parse_greedy(&run, &logits)
    };
    let mut rows = Vec::new();
    let cpu = run(&[], None, long);
    rows.push(("CPU only".to_owned(), cpu.tokens_per_second(), None));
    let env = sim_env("figures-local");
    let local = run(&[], Some(&env), long);
    assert_eq!(local.tokens, cpu.tokens);
    rows.push(("HSA0 local".to_owned(), local.tokens_per_second(), None));
    for servers in [1usize, 2] {
        let started: Vec<RpcServer> = (0..servers)
            .map(|i| RpcServer::start(&bin, &format!("figures-{servers}-{i}"), &[]))
            .collect();
        let proxies: Vec<CountingProxy> =
            started.iter().map(|s| CountingProxy::new(s.port)).collect();
        let endpoints: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port))
            .collect();
        let joined = endpoints.join(",");
        let mut extra = vec!["--rpc", joined.as_str()];
        if servers == 2 {
            extra.extend(["-ts", "1,1"]);
        }
        let total = |proxies: &[CountingProxy]| {
            proxies
                .iter()
                .map(|p| p.bytes())
                .fold((0, 0), |(a, b), (u, d)| (a + u, b + d))
        };
        let b0 = total(&proxies);
        let first = run(&extra, None, short);
        let b1 = total(&proxies);
        let second = run(&extra, None, long);
        let b2 = total(&proxies);
        assert_eq!(second.tokens, cpu.tokens);
        assert_eq!(first.tokens[..], cpu.tokens[..short]);
        let per_token = |i: usize| {
            let (d_short, d_long) = if i == 0 {
                (b1.0 - b0.0, b2.0 - b1.0)
            } else {
                (b1.1 - b0.1, b2.1 - b1.1)
            };
            (d_long as f64 - d_short as f64) / (long - short) as f64
        };
        rows.push((
            format!(
                "{servers} remote HSA0{}",
                if servers == 2 { "s (-ts 1,1)" } else { "" }
            ),
            second.tokens_per_second(),
            Some((per_token(0), per_token(1), b2.0 - b1.0 + b2.1 - b1.1)),
        ));
    }
    println!("\ntiny-llama-f32, greedy from \"Hello\", {long} tokens, one-token steps:");
    println!(
        "| {:<26} | {:>9} | {:>14} | {:>14} | {:>16} |",
        "devices", "tokens/s", "B/token up", "B/token down", "B/run (36 tok)"
    );
    println!(
        "|{:-<28}|{:->10}:|{:->15}:|{:->15}:|{:->17}:|",
        "", "", "", "", ""
    );
    for (name, tps, bytes) in rows {
        match bytes {
            Some((up, down, run)) => {
                println!("| {name:<26} | {tps:>9.1} | {up:>14.0} | {down:>14.0} | {run:>16} |")
            }
            None => println!(
                "| {name:<26} | {tps:>9.1} | {:>14} | {:>14} | {:>16} |",
                "-", "-", "-"
            ),
        }
    }
}
