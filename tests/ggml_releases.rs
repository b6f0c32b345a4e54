//! A plugin built for one ggml release loaded into another: it must decline with exactly one line
//! naming both releases, and the program must go on without it (docs/building.md, "Supported ggml
//! releases"). Both directions: this build's plugin into the other release's `test-backend-ops`,
//! and the other release's plugin into this build's.
//!
//! The other release is given by two variables, set by scripts/test.sh (its "older ggml release"
//! check, which builds the second tree with `LLAMA_CPP_PIN=scripts/llama-cpp-older.pin`):
//! * `GGML_HSA_OTHER_GGML_BIN`: that tree's `build/bin` (its `test-backend-ops`);
//! * `GGML_HSA_OTHER_PLUGIN`: a `libggml_hsa.so` built against that tree.
//!
//! The tests are ignored in a plain `cargo test` (one tree is all it has); run them with
//! `cargo test --test ggml_releases -- --ignored` and both variables set.

mod common;

use std::path::{Path, PathBuf};

use common::test_backend_ops::{run, Report};

fn other(var: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{var} is not set (see this file's documentation)"));
    assert!(path.exists(), "{var}={} does not exist", path.display());
    path
}

/// `test-backend-ops` of the tree in `bin` with `plugin` on `GGML_BACKEND_PATH` and HSA0 on
/// hsa-sim: a plugin that did not decline would be tested there.
fn tbo(bin: &Path, plugin: &Path, tag: &str) -> Report {
    let cache = common::scratch_dir(&format!("ggml-releases-{tag}"));
    let sim = common::sim_artifact("libhsa_runtime64.so");
    let compiler = common::sim_artifact("hsa-sim-compile");
    run(
        &bin.join("test-backend-ops"),
        &["-b", "HSA0", "-o", "ADD"],
        &[
            ("GGML_BACKEND_PATH", plugin.to_str().unwrap()),
            ("GGML_HSA_LIBHSA_PATH", sim.to_str().unwrap()),
            ("GGML_HSA_JIT_COMPILER", compiler.to_str().unwrap()),
            ("GGML_HSA_KERNEL_CACHE_DIR", cache.to_str().unwrap()),
        ],
        "HSA0",
    )
}

/// The one line the plugin printed, which must be its refusal naming both ggml builds.
fn assert_declined_in_one_line(r: &Report) -> String {
    assert_eq!(r.exit_code, Some(0), "{}", r.output);
    assert!(
        !r.device_tested,
        "the plugin was not refused:\n{}",
        r.output
    );
    assert!(r.output.contains("1/1 backends passed"), "{}", r.output);
    assert!(
        r.output.contains("is not supported on this system"),
        "{}",
        r.output
    );
    let ours: Vec<&str> = r.output.lines().filter(|l| l.starts_with("HSA:")).collect();
    assert_eq!(
        ours.len(),
        1,
        "the plugin must print exactly one line:\n{}",
        r.output
    );
    let line = ours[0];
    assert!(
        line.contains("this plugin was built against ggml ")
            && line.contains(" but is running in ggml ")
            && line.contains("declines to load"),
        "{line}"
    );
    line.to_owned()
}

/// The `ggml <version>` words of the refusal: (built against, running in).
fn versions(line: &str) -> (String, String) {
    let after = |marker: &str| {
        let rest = &line[line.find(marker).unwrap_or_else(|| panic!("{line}")) + marker.len()..];
        rest.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    (after("built against ggml "), after("is running in ggml "))
}

#[test]
#[ignore = "needs a second ggml tree: GGML_HSA_OTHER_GGML_BIN and GGML_HSA_OTHER_PLUGIN"]
fn this_plugin_declines_in_the_other_ggml_in_one_line() {
    let r = tbo(
        &other("GGML_HSA_OTHER_GGML_BIN"),
        &common::plugin_path(),
        "ours-in-other",
    );
    let line = assert_declined_in_one_line(&r);
    let (built, running) = versions(&line);
    assert_eq!(built, env!("GGML_HSA_BUILT_GGML_VERSION"), "{line}");
    assert_ne!(built, running, "{line}");
}

#[test]
#[ignore = "needs a second ggml tree: GGML_HSA_OTHER_GGML_BIN and GGML_HSA_OTHER_PLUGIN"]
fn the_other_plugin_declines_in_this_ggml_in_one_line() {
    let r = tbo(
        &common::llama_bin_dir(),
        &other("GGML_HSA_OTHER_PLUGIN"),
        "other-in-ours",
    );
    let line = assert_declined_in_one_line(&r);
    let (built, running) = versions(&line);
    assert_eq!(running, env!("GGML_HSA_BUILT_GGML_VERSION"), "{line}");
    assert_ne!(built, running, "{line}");
}
