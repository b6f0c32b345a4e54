//! llama.cpp's own `test-llama-archs` on HSA0: a random tiny model of each architecture the
//! pinned llama.cpp knows, its logits on HSA0 against the CPU's (NMSE at most 1e-4) and a save
//! and load round trip that must give the same logits bit for bit. HSA0 runs the IRON designs
//! through the emulation target (`python3 -m ggml_hsa_iron --target emu`), what a real NPU
//! would run; `GGML_HSA_LLAMA_ARCHS_COMPILER=reference` runs hsa-sim's reference executors
//! instead.
//!
//! The program as upstream ships it loads no backend in a `GGML_BACKEND_DL` build, so it comes
//! from the in-tree static build (`scripts/llama-cpp.sh build-static test-llama-archs`), where
//! HSA0 is registered like the CPU. That build holds the backend as it was when it was built:
//! build it again after changing the backend.
//!
//! One process per architecture, two at a time, seed 42. Which architectures
//! (`GGML_HSA_LLAMA_ARCHS`): unset, a sample: every family a fused path serves and an eighth of
//! the others, the eighth chosen by the commit (tests/common/sample.rs), so that every
//! architecture runs in some CI run of eight; `all`, or `GGML_HSA_TEST_SAMPLE=all`
//! (`scripts/test.sh --long`); or a comma-separated list. It prints a table,
//! one row per architecture and configuration (dense, MoE), and fails on any FAIL, crash or
//! timeout. Each row also counts, over the architecture's whole run (`GGML_HSA_STATS`), the
//! nodes HSA0 ran as NPU kernels (emulated IRON designs, or the reference executors), on the
//! host and on the CPU, and the kernels it dispatched.
//!
//! Ignored in the plain `cargo test` run: `scripts/test.sh` runs it as a step of its own so that
//! the table shows in the log.

mod common;

use common::llama::{require, run_bounded, script_output};
use common::sample::Sample;
use common::test_backend_ops::strip_ansi;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The families whose graphs the backend folds into fused kernels (llama's norms, Q/K/V with
/// their rotation, GLU feed-forward blocks, attention), and MoE models whose experts run on the
/// CPU between those kernels: every CI run has them.
const FUSED_FAMILIES: &[&str] = &[
    "llama",
    "llama4",
    "granite",
    "granitemoe",
    "mistral3",
    "qwen2",
    "qwen2moe",
    "qwen3",
    "qwen3moe",
    "phi3",
    "gemma2",
    "gemma3",
    "deepseek2",
    "minicpm",
    "smollm3",
];

/// The other architectures run one in this many per CI run.
const SHARE: u64 = 8;

const TIMEOUT: Duration = Duration::from_secs(600);

/// The architecture names of the pinned llama.cpp, from its `LLM_ARCH_NAMES` table.
fn all_archs(src: &Path) -> Vec<String> {
    let path = src.join("src/llama-arch.cpp");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let table = text
        .split("LLM_ARCH_NAMES")
        .nth(1)
        .and_then(|t| t.split("};").next())
        .unwrap_or_else(|| panic!("no LLM_ARCH_NAMES table in {}", path.display()));
    let names: Vec<String> = table
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix("{ LLM_ARCH_")?;
            let name = rest.split('"').nth(1)?;
            (!rest.starts_with("UNKNOWN")).then(|| name.to_owned())
        })
        .collect();
    assert!(names.len() > 100, "only {} architectures read", names.len());
    names
}

fn selected(all: &[String]) -> Vec<String> {
    match std::env::var("GGML_HSA_LLAMA_ARCHS").as_deref() {
        Ok("all") => all.to_vec(),
        Ok(list) if !list.is_empty() => list.split(',').map(|s| s.trim().to_owned()).collect(),
        _ => match Sample::from_env(SHARE) {
            Sample::All => all.to_vec(),
            Sample::Turn { turn, .. } => sample(all, turn),
        },
    }
}

/// The fused families, and of the other architectures those at positions `turn` modulo SHARE.
fn sample(all: &[String], turn: u64) -> Vec<String> {
    let rest = all.iter().filter(|a| !FUSED_FAMILIES.contains(&a.as_str()));
    FUSED_FAMILIES
        .iter()
        .map(|s| (*s).to_owned())
        .chain(
            rest.enumerate()
                .filter(|(i, _)| *i as u64 % SHARE == turn)
                .map(|(_, a)| a.clone()),
        )
        .collect()
}

/// One architecture's run: its result rows and how it ended.
struct ArchRun {
    arch: String,
    rows: Vec<Row>,
    /// `None`: killed at the timeout.
    code: Option<i32>,
    seconds: f64,
    tail: String,
    /// What HSA0 did with the graphs (`GGML_HSA_STATS`), if it wrote anything.
    stats: Option<Stats>,
}

/// Of the statistics file: nodes per op that ran as NPU kernels, on the host, on the CPU.
#[derive(Debug, Default)]
struct Stats {
    kernel: u64,
    host: u64,
    cpu: u64,
    graphs: u64,
    packets: u64,
}

impl Stats {
    fn read(path: &Path) -> Option<Stats> {
        let text = std::fs::read_to_string(path).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let sum = |key: &str| {
            v[key]
                .as_object()
                .map_or(0, |m| m.values().filter_map(|n| n.as_u64()).sum())
        };
        Some(Stats {
            kernel: sum("kernel_nodes"),
            host: sum("host_nodes"),
            cpu: sum("cpu_nodes"),
            graphs: v["graphs"].as_u64()?,
            packets: v["packets"].as_u64()?,
        })
    }

    /// The table's cells: nodes as kernels / on the host / on the CPU, dispatches per graph.
    fn cells(stats: Option<&Stats>) -> (String, String) {
        match stats {
            Some(s) => (
                format!("{} / {} / {}", s.kernel, s.host, s.cpu),
                format!("{:.1}", s.packets as f64 / s.graphs.max(1) as f64),
            ),
            None => ("-".into(), "-".into()),
        }
    }
}

/// A row of test-llama-archs' table: the configuration (Dense, MoE) and, unless the line was
/// cut short, its NMSE and round-trip cells with the colours stripped. llama.cpp's log thread
/// may lose the last lines of a process that ends at once (it is never flushed at exit), so a
/// row may be cut; the exit status, 0 only when every configuration passed, still tells.
#[derive(Debug, PartialEq)]
struct Row {
    config: String,
    cells: Option<(String, String)>,
}

impl Row {
    fn failed(&self) -> bool {
        self.cells
            .as_ref()
            .is_some_and(|(n, r)| n.contains("FAIL") || r.contains("FAIL"))
    }

    fn skipped(&self) -> bool {
        self.cells
            .as_ref()
            .is_some_and(|(n, r)| n.starts_with("SKIP") && r.starts_with("SKIP"))
    }
}

impl ArchRun {
    fn failed(&self) -> bool {
        self.code != Some(0) || self.rows.iter().any(Row::failed)
    }
}

/// The result rows of test-llama-archs' table: `|arch|device|config|nmse|roundtrip|`.
fn rows(stdout: &str, arch: &str) -> Vec<Row> {
    strip_ansi(stdout)
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            if cells.len() < 4 || cells[1] != arch {
                return None;
            }
            let done = cells.len() >= 6 && !cells[4].is_empty() && !cells[5].is_empty();
            Some(Row {
                config: cells[3].to_owned(),
                cells: done.then(|| (cells[4].to_owned(), cells[5].to_owned())),
            })
        })
        .collect()
}

fn run_arch(exe: &Path, arch: &str, env: &[(String, String)], stats: &Path) -> ArchRun {
    let stats = stats.join(format!("{arch}.json"));
    let _ = std::fs::remove_file(&stats);
    let mut cmd = Command::new(exe);
    cmd.args(["-b", "HSA0", "-s", "42", "-a", arch])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("GGML_HSA_STATS", &stats);
    let done = run_bounded(&mut cmd, TIMEOUT);
    ArchRun {
        arch: arch.to_owned(),
        rows: rows(&done.stdout, arch),
        code: done.status.and_then(|s| s.code()),
        seconds: done.elapsed.as_secs_f64(),
        tail: common::llama::tail(&format!("{}\n{}", done.stdout, done.stderr)),
        stats: Stats::read(&stats),
    }
}

#[test]
#[ignore = "run by scripts/test.sh as a step of its own (the table in the log)"]
fn test_llama_archs_on_hsa0_match_the_cpu() {
    let static_bin = script_output("llama-cpp.sh", &["path", "bin-static"]);
    let Some(exe) = require(
        static_bin.join("test-llama-archs"),
        "scripts/llama-cpp.sh build-static test-llama-archs",
    ) else {
        return;
    };
    let src = script_output("llama-cpp.sh", &["path", "src"]);
    let archs = selected(&all_archs(&src));
    let reference = std::env::var("GGML_HSA_LLAMA_ARCHS_COMPILER").as_deref() == Ok("reference");
    let cache = common::scratch_dir("llama-archs");
    let mut env: Vec<(String, String)> = vec![
        (
            "GGML_HSA_LIBHSA_PATH".into(),
            common::sim_artifact("libhsa_runtime64.so")
                .display()
                .to_string(),
        ),
        (
            "GGML_HSA_KERNEL_CACHE_DIR".into(),
            cache.join("kernels").display().to_string(),
        ),
        ("GGML_HSA_ENABLE_LOG".into(), "0".into()),
    ];
    if reference {
        env.push((
            "GGML_HSA_JIT_COMPILER".into(),
            common::sim_artifact("hsa-sim-compile")
                .display()
                .to_string(),
        ));
    } else {
        env.extend(common::emu_compiler_env());
    }

    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<ArchRun>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while let Some(arch) = archs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let run = run_arch(&exe, arch, &env, &cache);
                    results.lock().unwrap().push(run);
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| archs.iter().position(|a| *a == r.arch));

    let path = if reference {
        "hsa-sim reference"
    } else {
        "IRON designs, emulated"
    };
    println!(
        "\ntest-llama-archs on HSA0 ({path}), seed 42, {} architectures:\n",
        results.len()
    );
    println!(
        "| architecture | config | NMSE vs. CPU | round trip | nodes: NPU / host / CPU | \
         dispatches per graph | s |"
    );
    println!("|---|---|---|---|---:|---:|---:|");
    let (mut executed, mut failed, mut skipped) = (0usize, 0usize, 0usize);
    for r in &results {
        let (nodes, dispatches) = Stats::cells(r.stats.as_ref());
        let ended = match r.code {
            Some(0) => "passed (row not printed)".to_owned(),
            Some(c) => format!("FAILED (exit {c})"),
            None => "TIMEOUT".to_owned(),
        };
        if r.rows.is_empty() {
            let how = if r.code == Some(0) {
                "exit 0, no row printed (the test skips it, or the row was lost)"
            } else {
                &ended
            };
            println!(
                "| {} | - | {how} | - | {nodes} | {dispatches} | {:.0} |",
                r.arch, r.seconds
            );
            failed += usize::from(r.code != Some(0));
        }
        for row in &r.rows {
            let (nmse, roundtrip) = match &row.cells {
                Some((n, t)) => (n.as_str(), t.as_str()),
                None => (ended.as_str(), "-"),
            };
            println!(
                "| {} | {} | {nmse} | {roundtrip} | {nodes} | {dispatches} | {:.0} |",
                r.arch, row.config, r.seconds
            );
            if row.skipped() {
                skipped += 1;
            } else {
                executed += 1;
                failed += usize::from(row.failed() || (row.cells.is_none() && r.code != Some(0)));
            }
        }
    }
    println!(
        "\n{executed} configurations tested: {} passed, {failed} failed; {skipped} skipped by the \
         test itself",
        executed.saturating_sub(failed)
    );
    let bad: Vec<String> = results
        .iter()
        .filter(|r| r.failed())
        .map(|r| format!("{} (exit {:?}):\n{}", r.arch, r.code, r.tail))
        .collect();
    assert!(bad.is_empty(), "failing architectures:\n{}", bad.join("\n"));
}

#[test]
fn the_architecture_table_is_read_and_sampled() {
    let src = script_output("llama-cpp.sh", &["path", "src"]);
    if require(src.join("src/llama-arch.cpp"), "scripts/llama-cpp.sh fetch").is_none() {
        return;
    }
    let all = all_archs(&src);
    for family in FUSED_FAMILIES {
        assert!(
            all.iter().any(|a| a == family),
            "{family} is not an architecture"
        );
    }
    assert!(!all.iter().any(|a| a == "unknown"));
    // Over SHARE consecutive turns every architecture runs, the others once each.
    let mut runs = std::collections::HashMap::new();
    for turn in 0..SHARE {
        for arch in sample(&all, turn) {
            *runs.entry(arch).or_insert(0) += 1;
        }
    }
    for arch in &all {
        let want = if FUSED_FAMILIES.contains(&arch.as_str()) {
            SHARE
        } else {
            1
        };
        assert_eq!(runs.get(arch), Some(&want), "{arch}");
    }
    let row = |config: &str, cells: Option<(&str, &str)>| Row {
        config: config.to_owned(),
        cells: cells.map(|(n, r)| (n.to_owned(), r.to_owned())),
    };
    let printed =
        "|  granite|aie2p|   MoE|\u{1b}[1;31mFAIL\u{1b}[0m (1.42e+00)|  \u{1b}[1;32mOK\u{1b}[0m|";
    assert_eq!(
        rows(printed, "granite"),
        [row("MoE", Some(("FAIL (1.42e+00)", "OK")))]
    );
    assert!(rows(printed, "granite")[0].failed());
    // A row the log thread cut short.
    assert_eq!(
        rows("|  granite|aie2p| Dense|\n", "granite"),
        [row("Dense", None)]
    );
    assert!(rows("|  llama|aie2p| Dense|", "granite").is_empty());
}
