//! Soak: the tiny llama decodes `GGML_HSA_SOAK_GRAPHS` tokens (300 by default;
//! 10,000 in `scripts/test.sh --long`), one decode graph each, with HSA0 on hsa-sim and this
//! crate's plugin, while the test samples the process's resident memory and open file
//! descriptors. After the warm-up (model load, kernel compiles, first graphs) both must stay
//! flat, and the simulator's PDI loads and context rebuilds must not grow with the graphs.
//! Figures are printed at the start and end.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::llama::{dl_bin, greedy_exe, model, sim_env};

/// One sample of the running process.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    fds: usize,
}

fn sample(pid: u32, at: Duration) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some(Sample { at, rss_kib, fds })
}

fn counter(counters: &serde_json::Value, key: &str) -> u64 {
    counters[key]
        .as_u64()
        .unwrap_or_else(|| panic!("counter {key} missing: {counters}"))
}

#[test]
fn decode_graphs_keep_memory_handles_and_queues_flat() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let graphs: u32 = std::env::var("GGML_HSA_SOAK_GRAPHS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = common::scratch_dir("soak");
    let counters_path = dir.join("counters.json");
    let mut cmd = Command::new(greedy_exe(&bin));
    cmd.arg("--backend-dir")
        .arg(&bin)
        .arg("-m")
        .arg(&model)
        .args(["-n", &graphs.to_string(), "Once upon a time"])
        .env("GGML_BACKEND_PATH", common::plugin_path())
        .env("HSA_SIM_COUNTERS", &counters_path)
        .env("HSA_SIM_QUIET", "1")
        .envs(sim_env("soak"))
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .stdin(Stdio::null());
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let mut samples = Vec::new();
    let limit = Duration::from_secs(60 + u64::from(graphs) * 2);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{graphs} decode graphs did not finish within {limit:?}");
        }
        if let Some(s) = sample(child.id(), started.elapsed()) {
            samples.push(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The generated text of a random model is not always UTF-8.
    let read = |f: &str| String::from_utf8_lossy(&std::fs::read(dir.join(f)).unwrap()).into_owned();
    let (stdout, stderr) = (read("stdout"), read("stderr"));
    assert!(status.success(), "llama_greedy failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("gen_tokens: {}", graphs - 1)),
        "{stdout}"
    );
    // The warm-up is the first quarter of the run (load, compiles, the prompt graph); the rest
    // is decode graphs only.
    assert!(
        samples.len() >= 8,
        "too few samples ({}) to judge",
        samples.len()
    );
    let steady = &samples[samples.len() / 4..];
    let (first, last) = (steady[0], *steady.last().unwrap());
    let peak_rss = steady.iter().map(|s| s.rss_kib).max().unwrap();
    let max_fds = steady.iter().map(|s| s.fds).max().unwrap();
    let counters: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&counters_path).unwrap()).unwrap();
    let (pdi_loads, rebuilds, dispatches) = (
        counter(&counters, "pdi_loads"),
        counter(&counters, "context_rebuilds"),
        counter(&counters, "dispatches"),
    );
    println!(
        "soak: {graphs} decode graphs in {:.1} s, {} samples; steady state from {:.1} s: \
         RSS {} KiB -> {} KiB (peak {peak_rss} KiB), open fds {} -> {} (max {max_fds}); \
         hsa-sim: {dispatches} dispatches, {pdi_loads} PDI loads, {rebuilds} context rebuilds, \
         {} doorbells",
        started.elapsed().as_secs_f64(),
        samples.len(),
        first.at.as_secs_f64(),
        first.rss_kib,
        last.rss_kib,
        first.fds,
        last.fds,
        counter(&counters, "doorbells"),
    );
    // The KV cache lives in HSA0 buffers (host memory under hsa-sim) whose pages are touched as
    // it fills, one cell per token: that growth is expected, anything beyond it is not.
    let kv_bytes_per_cell = kv_cache_bytes_per_cell(&stderr);
    let kv_growth_kib = kv_bytes_per_cell * u64::from(graphs) / 1024;
    println!(
        "soak: RSS grew {} KiB in the steady state; the KV cache may account for {kv_growth_kib} \
         KiB ({kv_bytes_per_cell} bytes per token)",
        peak_rss.saturating_sub(first.rss_kib)
    );
    // Flat: as many descriptors open at the end as at the start of the steady state. A sample
    // may catch some open for a moment: the simulator's counters file is rewritten after every
    // doorbell, and as the context grows the attention's shapes change and new kernels are
    // compiled (the compiler's pipes, lock and request files of two jobs: at most 17 seen in
    // 10,000 graphs, from 5). Resident memory within the KV cache's growth + 8 MiB (allocator noise) of
    // the start.
    assert_eq!(last.fds, first.fds, "open descriptors grew: {steady:?}");
    assert!(
        max_fds <= first.fds + 32,
        "open descriptors grew: {steady:?}"
    );
    assert!(
        peak_rss <= first.rss_kib + kv_growth_kib + 8 * 1024,
        "resident memory grew from {} KiB to {peak_rss} KiB",
        first.rss_kib
    );
    // Bounded: a PDI is loaded once per queue, not per graph.
    assert!(
        pdi_loads < u64::from(graphs) && rebuilds <= pdi_loads,
        "{pdi_loads} PDI loads, {rebuilds} rebuilds for {graphs} graphs"
    );
    assert_eq!(counter(&counters, "dispatch_errors"), 0);
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}

/// Bytes per KV cell from llama.cpp's log line
/// `llama_kv_cache: size =   20.00 MiB ( 10240 cells, ...`.
fn kv_cache_bytes_per_cell(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("llama_kv_cache: size ="))
        .unwrap_or_else(|| panic!("no KV cache size in the log:\n{log}"));
    let mib: f64 = line
        .split("size =")
        .nth(1)
        .and_then(|r| r.split("MiB").next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let cells: f64 = line
        .split('(')
        .nth(1)
        .and_then(|r| r.split("cells").next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    (mib * 1024.0 * 1024.0 / cells).ceil() as u64
}
