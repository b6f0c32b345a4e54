//! The plugin on HSA0 (hsa-sim) under valgrind memcheck: no invalid read or write, no
//! definite or indirect leak, across the plugin's whole path (registry, buffers, graph planning,
//! kernel compile and load, packets, dispatch, teardown):
//! * test-backend-ops `-b HSA0 -o SQR` (the pinned plain build);
//! * the tiny llama, greedy, a few tokens (tests/c/llama_greedy.cpp against the hook build's
//!   libllama, the plugin through `GGML_BACKEND_PATH`): model load, a prompt batch, one-token
//!   steps, KV cache, the scheduler's copies, teardown.
//!
//! Slow (minutes on two shared cores), so they run only when `GGML_HSA_MEMCHECK=1`
//! (`scripts/test.sh --long`). No suppressions: nothing was reported (the llama run, 3 tokens:
//! 0 errors, 0 bytes definitely or indirectly lost, 44 s on two loaded cores).

mod common;

use common::llama::{dl_bin, greedy_command, model, run_bounded, sim_env, tail, GreedyArgs};
use std::process::Command;
use std::time::Duration;

/// Whether to run (with valgrind installed), else why not.
fn memcheck_enabled() -> bool {
    if std::env::var_os("GGML_HSA_MEMCHECK").is_none() {
        eprintln!("SKIPPED: set GGML_HSA_MEMCHECK=1 (scripts/test.sh --long) to run memcheck");
        return false;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        panic!("GGML_HSA_MEMCHECK=1 but valgrind is not installed");
    }
    true
}

/// memcheck's summary lines of a run's stderr.
fn summary(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.contains("ERROR SUMMARY")
                || l.contains("definitely lost")
                || l.contains("indirectly lost")
                || l.contains("suppressed:")
        })
        .collect()
}

#[test]
fn test_backend_ops_subset_is_clean_under_valgrind_memcheck() {
    if !memcheck_enabled() {
        return;
    }
    let dir = common::scratch_dir("memcheck");
    let out = Command::new("valgrind")
        .args([
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
        ])
        .arg(common::llama_program("test-backend-ops"))
        .args(["-b", "HSA0", "-o", "SQR"])
        .env("GGML_BACKEND_PATH", common::plugin_path())
        .env(
            "GGML_HSA_LIBHSA_PATH",
            common::sim_artifact("libhsa_runtime64.so"),
        )
        .env(
            "GGML_HSA_JIT_COMPILER",
            common::sim_artifact("hsa-sim-compile"),
        )
        .env("GGML_HSA_KERNEL_CACHE_DIR", dir.join("cache"))
        .env("HSA_SIM_QUIET", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let report = common::test_backend_ops::Report::parse(&stdout, Some(0), "HSA0");
    report.expect_cases("HSA0").unwrap();
    let summary = summary(&stderr);
    println!("memcheck of test-backend-ops -b HSA0 -o SQR: {summary:?}");
    assert!(
        summary
            .iter()
            .any(|l| l.contains("ERROR SUMMARY: 0 errors")),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The tiny llama on HSA0, greedy, under memcheck: the same tokens as a run without valgrind
/// (so the run under memcheck really computed), no memcheck error, no definite or indirect leak.
#[test]
fn tiny_llama_on_hsa0_is_clean_under_valgrind_memcheck() {
    if !memcheck_enabled() {
        return;
    }
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let mut env = sim_env("memcheck-llama");
    env.push(("HSA_SIM_QUIET".to_owned(), "1".to_owned()));
    let n_predict = std::env::var("GGML_HSA_MEMCHECK_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let args = GreedyArgs {
        plugin_env: Some(&env),
        forced: &[],
        extra: &[],
        n_predict: Some(n_predict),
    };
    // Without valgrind first: the kernels are compiled into the cache (the compiler is another
    // process, not under memcheck anyway), and the tokens to expect.
    let (mut plain, _) = greedy_command(&bin, &model, "Hello", &args);
    let plain = run_bounded(&mut plain, Duration::from_secs(600));
    assert!(
        plain.status.is_some_and(|s| s.success()),
        "{}",
        tail(&plain.stderr)
    );
    let tokens = |stdout: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with("tokens:"))
            .map(str::to_owned)
    };
    let (cmd, _) = greedy_command(&bin, &model, "Hello", &args);
    let mut under = Command::new("valgrind");
    under
        .args([
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--num-callers=30",
        ])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        // No sched debug dump: it only slows memcheck down.
        .env_remove("GGML_SCHED_DEBUG");
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) if k != "GGML_SCHED_DEBUG" => under.env(k, v),
            Some(_) => &mut under,
            None => under.env_remove(k),
        };
    }
    let run = run_bounded(&mut under, Duration::from_secs(3600));
    let summary = summary(&run.stderr);
    println!(
        "memcheck of the tiny llama on HSA0 ({n_predict} tokens) in {:.0?}: {summary:?}",
        run.elapsed
    );
    assert_eq!(
        run.status.and_then(|s| s.code()),
        Some(0),
        "{}\n{}",
        run.stdout,
        tail(&run.stderr)
    );
    assert_eq!(tokens(&run.stdout), tokens(&plain.stdout));
    assert!(tokens(&run.stdout).is_some(), "{}", run.stdout);
    assert!(
        summary
            .iter()
            .any(|l| l.contains("ERROR SUMMARY: 0 errors")),
        "{}",
        run.stderr
    );
}
