//! The pinned llama.cpp's `test-backend-ops` loading the plugin through `GGML_BACKEND_PATH`, the
//! way an unmodified upstream ggml does, with no usable NPU: the plugin must decline cleanly, say
//! why in one line, and leave the program running.

mod common;

use std::path::Path;

use common::test_backend_ops::{run, Report};

fn tbo(plugin: &Path, env: &[(&str, &str)]) -> Report {
    let plugin = plugin.to_str().unwrap();
    let mut vars = vec![("GGML_BACKEND_PATH", plugin)];
    vars.extend_from_slice(env);
    run(
        &common::llama_program("test-backend-ops"),
        &["-b", "HSA0", "-o", "ADD"],
        &vars,
        "HSA0",
    )
}

fn assert_ran_on_cpu_only(r: &Report) {
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert!(!r.device_tested, "{}", r.output);
    assert!(r.output.contains("Backend 1/1: CPU"), "{}", r.output);
    assert!(r.output.contains("1/1 backends passed"), "{}", r.output);
    assert!(
        !r.output.contains("panicked") && !r.output.contains("internal error"),
        "{}",
        r.output
    );
}

#[test]
fn without_an_hsa_runtime_the_plugin_declines_and_says_why() {
    let missing = common::scratch_dir("tbo-no-hsa").join("libhsa-runtime64.so.1");
    let r = tbo(
        &common::plugin_path(),
        &[("GGML_HSA_LIBHSA_PATH", missing.to_str().unwrap())],
    );
    assert_ran_on_cpu_only(&r);
    let reasons: Vec<_> = r
        .output
        .lines()
        .filter(|l| l.starts_with("HSA: no device available: cannot load the HSA runtime"))
        .collect();
    assert_eq!(reasons.len(), 1, "{}", r.output);
    assert!(reasons[0].contains("no such file"), "{}", r.output);
    assert!(
        r.output.contains("is not supported on this system"),
        "{}",
        r.output
    );
    // The strict reading a CI check applies when it expects cases: this run must not pass it.
    assert!(r.expect_cases("HSA0").unwrap_err().contains("not found"));
}

#[test]
fn a_library_that_is_not_hsa_is_reported() {
    // libm loads but exports no HSA function: the missing symbol is named.
    let r = tbo(
        &common::plugin_path(),
        &[("GGML_HSA_LIBHSA_PATH", "libm.so.6")],
    );
    assert_ran_on_cpu_only(&r);
    assert!(
        r.output.contains("required symbol `hsa_init` is missing"),
        "{}",
        r.output
    );
}

#[test]
fn garbage_in_ggml_backend_path_is_reported_and_the_program_continues() {
    let dir = common::scratch_dir("tbo-garbage");
    let garbage = dir.join("libggml-hsa.so");
    std::fs::write(&garbage, "not a shared library\n".repeat(300)).unwrap();
    let r = tbo(&garbage, &[]);
    assert_ran_on_cpu_only(&r);
    assert!(r.output.contains("failed to load"), "{}", r.output);
}

/// A plugin cut inside its ELF headers (an interrupted copy) is refused by the dynamic loader with
/// a message, and the program goes on. (A file cut after its program headers makes glibc's dlopen
/// itself fail with SIGBUS before any code of the plugin runs; no plugin can prevent that, see
/// docs/limitations.md.)
#[test]
fn a_truncated_plugin_is_reported_and_the_program_continues() {
    let dir = common::scratch_dir("tbo-truncated");
    let bytes = std::fs::read(common::plugin_path()).unwrap();
    for (len, reason) in [(40, "file too short"), (500, "cannot read file data")] {
        let truncated = dir.join(format!("libggml-hsa-{len}.so"));
        std::fs::write(&truncated, &bytes[..len]).unwrap();
        let r = tbo(&truncated, &[]);
        assert_ran_on_cpu_only(&r);
        assert!(r.output.contains("failed to load"), "{}", r.output);
        assert!(r.output.contains(reason), "{}", r.output);
    }
}

/// Debian's ROCm runtime (`libhsa-runtime64-1`, ROCm 5.2.3) loads here but finds no device
/// (there is no /dev/kfd and no NPU): the backend must report zero devices cleanly with a real
/// ROCR present. CI installs the package; set GGML_HSA_REQUIRE_ROCR=1 to make its absence a
/// failure rather than a skip.
#[test]
fn with_debians_real_rocr_the_backend_reports_zero_devices() {
    let rocr = Path::new("/usr/lib/x86_64-linux-gnu/libhsa-runtime64.so.1");
    if !rocr.exists() {
        let required = std::env::var("GGML_HSA_REQUIRE_ROCR").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{} is not installed (apt-get install libhsa-runtime64-1)",
            rocr.display()
        );
        eprintln!("skipped: {} is not installed", rocr.display());
        return;
    }
    let r = tbo(
        &common::plugin_path(),
        &[("GGML_HSA_LIBHSA_PATH", rocr.to_str().unwrap())],
    );
    assert_ran_on_cpu_only(&r);
    let reasons: Vec<_> = r
        .output
        .lines()
        .filter(|l| l.starts_with("HSA: no device available:"))
        .collect();
    assert_eq!(reasons.len(), 1, "{}", r.output);
    // Without /dev/kfd ROCR's hsa_init fails; on a machine with a GPU but no NPU it succeeds and
    // reports no AIE agent. Either is a clean zero-device outcome.
    assert!(
        reasons[0].contains("hsa_init failed with HSA_STATUS_")
            || reasons[0].contains("no AIE agent"),
        "{}",
        r.output
    );
}
