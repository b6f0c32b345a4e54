//! Runs ggml's `test-backend-ops` and reads its output strictly.
//!
//! test-backend-ops exits 0 when the requested backend does not exist (`-b HSA0` with no such
//! device is "skipped", and skipped counts as passed) and when it ran no case (`0/0 tests
//! passed`). A check that expects cases to run must therefore read the output, not the exit code:
//! [`Report::expect_cases`] fails on both.

use std::path::Path;
use std::process::Command;

/// What one run printed, as far as the verdict is concerned.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub exit_code: Option<i32>,
    /// `Backend i/n: <device>` was printed: the device existed and was tested.
    pub device_tested: bool,
    /// From `K/N tests passed` of that device.
    pub passed: u64,
    pub total: u64,
    /// Cases reported `not supported`.
    pub not_supported: u64,
    /// Lines of the `Failing tests:` block.
    pub failing: Vec<String>,
    /// Everything printed (stdout then stderr), without colour codes.
    pub output: String,
}

impl Report {
    /// Reads the output of a run that was asked to test `device`.
    pub fn parse(output: &str, exit_code: Option<i32>, device: &str) -> Report {
        let output = strip_ansi(output);
        let mut report = Report {
            exit_code,
            ..Report::default()
        };
        let mut in_device = false;
        let mut in_failing = false;
        for line in output.lines() {
            let trimmed = line.trim();
            if let Some((index, name)) = trimmed
                .strip_prefix("Backend ")
                .and_then(|rest| rest.split_once(": "))
            {
                // "Backend 2/2: HSA0" opens a device section; "Backend HSA: OK" closes it.
                in_device = index.contains('/') && name == device;
                report.device_tested |= in_device;
                in_failing = false;
                continue;
            }
            if !in_device {
                continue;
            }
            if trimmed.ends_with("tests passed") {
                if let Some((k, n)) = trimmed
                    .split_whitespace()
                    .next()
                    .and_then(|ratio| ratio.split_once('/'))
                {
                    report.passed = k.parse().unwrap_or(0);
                    report.total = n.parse().unwrap_or(0);
                }
                in_failing = false;
            } else if trimmed == "Failing tests:" {
                in_failing = true;
            } else if in_failing && !trimmed.is_empty() {
                report.failing.push(trimmed.to_owned());
            } else if trimmed.contains(": not supported [") {
                report.not_supported += 1;
            }
        }
        report.output = output;
        report
    }

    /// One sweep split over several processes, as one report: counts added, outputs joined,
    /// the first non-zero exit code kept.
    pub fn combine(reports: impl IntoIterator<Item = Report>) -> Report {
        let mut all = Report {
            exit_code: Some(0),
            device_tested: true,
            ..Report::default()
        };
        let mut any = false;
        for r in reports {
            any = true;
            all.device_tested &= r.device_tested;
            if all.exit_code == Some(0) {
                all.exit_code = r.exit_code;
            }
            all.passed += r.passed;
            all.total += r.total;
            all.not_supported += r.not_supported;
            all.failing.extend(r.failing);
            all.output.push_str(&r.output);
        }
        if any {
            all
        } else {
            Report::default()
        }
    }

    /// `Ok` only if the device was tested, ran at least one case, every case passed and the
    /// program exited 0.
    pub fn expect_cases(&self, device: &str) -> Result<(), String> {
        if !self.device_tested {
            return Err(format!(
                "backend {device} not found: no `Backend i/n: {device}` line"
            ));
        }
        if self.total == 0 {
            return Err(format!("{device} ran no test case (0/0 tests passed)"));
        }
        if self.passed != self.total || !self.failing.is_empty() {
            return Err(format!(
                "{device}: {}/{} tests passed; failing: {:?}",
                self.passed, self.total, self.failing
            ));
        }
        if self.exit_code != Some(0) {
            return Err(format!("test-backend-ops exited with {:?}", self.exit_code));
        }
        Ok(())
    }
}

/// An `-o` argument selecting the ops named in `ops` (a comma-separated list of exact names):
/// one anchored regex (`^ADD$|^MUL$`) for several. test-backend-ops compiles a `std::regex` per
/// case for every plain name that is not the case's op; one regex entry costs it one compile per
/// case (a listing of 95 names: 4.8 s against 72 s).
pub fn op_names_filter(ops: &str) -> String {
    let names: Vec<&str> = ops.split(',').filter(|o| !o.is_empty()).collect();
    if names.len() <= 1 {
        return ops.to_owned();
    }
    names
        .iter()
        .map(|o| format!("^{o}$"))
        .collect::<Vec<_>>()
        .join("|")
}

/// Runs `test-backend-ops` with `args` and extra environment, and reads its output for `device`.
///
/// One run at a time per test binary: some test-backend-ops cases allocate several GiB (the CPU
/// reference and the device copy of large tensors), and the test harness's parallel threads
/// running several such processes at once have exhausted a 24 GiB machine.
pub fn run(program: &Path, args: &[&str], env: &[(&str, &str)], device: &str) -> Report {
    let _turn = one_at_a_time();
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Report::parse(&text, out.status.code(), device)
}

/// The turn of one test-backend-ops run (or of a sweep that runs its own processes) among the
/// test harness's threads.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes ANSI colour sequences (test-backend-ops colours OK and FAIL).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
