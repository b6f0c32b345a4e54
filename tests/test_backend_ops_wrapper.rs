//! The strict reading of test-backend-ops output, checked on outputs of real runs.

mod common;

use common::test_backend_ops::{strip_ansi, Report};

const PASSING: &str = "load_backend: loaded CPU backend from build/bin/libggml-cpu.so
load_backend: loaded HSA backend from /x/libggml-hsa.so
Testing 2 devices

Backend 1/2: CPU
  Skipping CPU backend
Backend 2/2: HSA0
  Device description: aie2p
  Device memory: 1024 MB (1024 MB free)

  ADD(type=f16,ne=[1,1,8,1],nr=[1,1,1,1],nf=1,perm1=0,src_overlap=0): not supported [HSA]
  ADD(type=f32,ne=[16,5,4,3],nr=[1,1,1,1],nf=16,perm1=0,src_overlap=0): \x1b[1;32mOK\x1b[0m
  18/18 tests passed
  Backend HSA: \x1b[1;32mOK\x1b[0m
2/2 backends passed
\x1b[1;32mOK\x1b[0m
";

const FAILING: &str = "Backend 1/1: HSA0
  Device description: aie2p
  [ADD] ERR = 0.600191308 > 0.000000100   ADD(type=f32,ne=[1280,16,16,1]): \x1b[1;31mFAIL\x1b[0m
  17/18 tests passed

  Failing tests:
    ADD(type=f32,ne=[1280,16,16,1])
  Backend HSA: \x1b[1;31mFAIL\x1b[0m
0/1 backends passed
";

const NOT_FOUND: &str = "load_backend: backend /x/libggml-hsa.so is not supported on this system
Testing 1 devices

Backend 1/1: CPU
  Skipping
1/1 backends passed
OK
";

const NOTHING_RAN: &str = "Backend 1/1: HSA0
  Device description: aie2p
  SQRT(type=f32,ne=[10,5,4,3]): not supported [HSA]
  0/0 tests passed
  Backend HSA: OK
1/1 backends passed
OK
";

#[test]
fn a_passing_run_is_accepted_with_its_counts() {
    let r = Report::parse(PASSING, Some(0), "HSA0");
    assert!(r.device_tested);
    assert_eq!((r.passed, r.total, r.not_supported), (18, 18, 1));
    assert_eq!(r.expect_cases("HSA0"), Ok(()));
}

#[test]
fn failures_are_reported_with_their_names() {
    let r = Report::parse(FAILING, Some(1), "HSA0");
    assert_eq!((r.passed, r.total), (17, 18));
    assert_eq!(r.failing, ["ADD(type=f32,ne=[1280,16,16,1])"]);
    let err = r.expect_cases("HSA0").unwrap_err();
    assert!(err.contains("17/18"), "{err}");
}

#[test]
fn a_missing_backend_is_a_failure_despite_exit_0() {
    let r = Report::parse(NOT_FOUND, Some(0), "HSA0");
    assert!(!r.device_tested);
    let err = r.expect_cases("HSA0").unwrap_err();
    assert!(err.contains("backend HSA0 not found"), "{err}");
}

#[test]
fn zero_cases_is_a_failure_despite_exit_0() {
    let r = Report::parse(NOTHING_RAN, Some(0), "HSA0");
    assert!(r.device_tested);
    let err = r.expect_cases("HSA0").unwrap_err();
    assert!(err.contains("0/0"), "{err}");
}

#[test]
fn a_nonzero_exit_is_a_failure() {
    let r = Report::parse(PASSING, Some(134), "HSA0");
    assert!(r.expect_cases("HSA0").unwrap_err().contains("134"));
}

#[test]
fn counts_of_another_device_are_not_taken() {
    let text = "Backend 1/2: CPU\n  5/5 tests passed\nBackend 2/2: HSA0\n  0/0 tests passed\n";
    let r = Report::parse(text, Some(0), "HSA0");
    assert_eq!((r.passed, r.total), (0, 0));
}

#[test]
fn colour_codes_are_removed() {
    assert_eq!(strip_ansi("a \x1b[1;32mOK\x1b[0m b"), "a OK b");
}
