//! The pinned llama.cpp's `test-backend-ops` comparing `HSA0` on the hsa-sim software NPU with the
//! CPU backend, for the starter ops: every case that runs must pass, and hundreds must run. Once
//! per simulated packet ABI (detected by the plugin's `auto` probe) and per NPU architecture.

mod common;

use common::sample::{named, run_sample, sampled_runs, Sample};
use common::test_backend_ops::{run, Report};

/// Every op of the starter set.
const STARTER_OPS: &str = "ADD,SUB,MUL,DIV,ABS,SGN,NEG,STEP,TANH,ELU,RELU,SIGMOID,GELU,GELU_QUICK,\
SILU,HARDSWISH,HARDSIGMOID,EXP,GELU_ERF,FLOOR,CEIL,ROUND,TRUNC,SQR,SQRT,LOG,SIN,COS,SCALE,CLAMP,\
CPY,CONT,DUP";
/// The ops of a model's graph beyond the element-wise ones, MUL_MAT aside.
const ROW_AND_REDUCTION_OPS: &str =
    "RMS_NORM,NORM,GET_ROWS,SET_ROWS,ARGMAX,COUNT_EQUAL,CROSS_ENTROPY_LOSS";
/// The ops of a model's graph beyond the element-wise ones.
const MODEL_OPS: &str =
    "MUL_MAT,RMS_NORM,NORM,GET_ROWS,SET_ROWS,ARGMAX,COUNT_EQUAL,CROSS_ENTROPY_LOSS";
/// test-backend-ops' filter for the cases with f32 (first) operands: about a third of them.
/// Every case of every op runs under packet ABI c on aie2p in `every_op_under_packet_abi_c`; the
/// other runs here check what differs between packet ABIs and architectures (how a
/// dispatch is encoded and which agent runs it, not what a kernel computes: the reference
/// executors are the same), for which a third of the cases serves.
const F32_CASES: [&str; 2] = ["-p", "type(_a|_src)?=f32,"];

/// A default run's share of the sweeps below that sample (`tbo_sampled`): one turn of a
/// rotation chosen by the commit, every op and type combination in each turn
/// (tests/common/sample.rs); `GGML_HSA_TEST_SAMPLE=all` (scripts/test.sh --long) runs them whole.
const SHARE: u64 = 8;

/// The plugin on hsa-sim with its reference compiler and a fresh kernel cache for `tag`, then
/// `env` (later settings win).
fn sim_env(tag: &str, env: &[(&str, &str)]) -> Vec<(String, String)> {
    let cache = common::scratch_dir(&format!("tbo-sim-{tag}"));
    let plugin = common::plugin_path();
    let sim = common::sim_artifact("libhsa_runtime64.so");
    let compiler = common::sim_artifact("hsa-sim-compile");
    [
        ("GGML_BACKEND_PATH", plugin.to_str().unwrap()),
        ("GGML_HSA_LIBHSA_PATH", sim.to_str().unwrap()),
        ("GGML_HSA_JIT_COMPILER", compiler.to_str().unwrap()),
        ("GGML_HSA_KERNEL_CACHE_DIR", cache.to_str().unwrap()),
        ("GGML_HSA_ENABLE_LOG", "0"),
    ]
    .iter()
    .chain(env)
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

/// Every case `ops` and `args` select.
fn tbo(tag: &str, ops: &str, args: &[&str], env: &[(&str, &str)]) -> Report {
    tbo_sample(tag, ops, args, env, Sample::All)
}

/// This run's sample of the cases `ops` and `args` select, and the sample.
fn tbo_sampled(tag: &str, ops: &str, args: &[&str], env: &[(&str, &str)]) -> (Report, Sample) {
    let sample = Sample::from_env(SHARE);
    (tbo_sample(tag, ops, args, env, sample), sample)
}

fn tbo_sample(tag: &str, ops: &str, args: &[&str], env: &[(&str, &str)], sample: Sample) -> Report {
    let vars = sim_env(tag, env);
    let program = common::llama_program("test-backend-ops");
    let env_refs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (report, picked) = run_sample(tag, sample, &program, ops, args, &vars, |run_args| {
        let mut all = vec!["-b", "HSA0"];
        all.extend(run_args.iter().map(String::as_str));
        run(&program, &all, &env_refs, "HSA0")
    });
    println!(
        "{tag}: {}/{} cases passed, {} not supported; sample: {}{}",
        report.passed,
        report.total,
        report.not_supported,
        sample.describe(),
        named(picked)
    );
    report
}

/// Each of `cases` (a piece of a case's description) ran on HSA0 in some case that passed.
fn assert_cases_ran_ok(r: &Report, cases: &[&str]) {
    for case in cases {
        assert!(
            r.output
                .lines()
                .any(|l| l.contains(case) && l.trim_end().ends_with(": OK")),
            "no case with {case} ran and passed\n{}",
            r.output
        );
    }
}

fn assert_hundreds_pass(r: &Report, tag: &str, at_least: u64) {
    if let Err(e) = r.expect_cases("HSA0") {
        panic!("{tag}: {e}\n{}", r.output);
    }
    assert!(
        r.total >= at_least,
        "{tag}: only {} cases ran\n{}",
        r.total,
        r.output
    );
    assert!(!r.output.contains("internal error"), "{}", r.output);
}

#[test]
fn starter_ops_on_aie2p_with_packet_abi_a1() {
    let (r, sample) = tbo_sampled(
        "aie2p-a1",
        STARTER_OPS,
        &[],
        &[("HSA_SIM_PACKET_ABI", "a1")],
    );
    // 1416 cases with the pinned test-backend-ops; the older release's (scripts/test.sh, "the
    // older ggml release") generates 908 for the same ops.
    assert_hundreds_pass(&r, "aie2p/a1", sample.at_least(900));
    assert!(
        r.output.contains("Device description: aie2p"),
        "{}",
        r.output
    );
}

#[test]
fn starter_and_model_ops_on_aie2_with_packet_abi_c() {
    let ops = format!("{STARTER_OPS},{MODEL_OPS}");
    let (r, sample) = tbo_sampled(
        "aie2-c",
        &ops,
        &["-j", "2", F32_CASES[0], F32_CASES[1]],
        &[
            ("HSA_SIM_PACKET_ABI", "c"),
            ("GGML_HSA_PACKET_ABI", "c"),
            ("HSA_SIM_AGENTS", "aie2"),
        ],
    );
    assert_hundreds_pass(&r, "aie2/c", sample.at_least(1000));
    assert!(
        r.output.contains("Device description: aie2"),
        "{}",
        r.output
    );
}

#[test]
fn starter_ops_on_aie2_with_packet_abi_b() {
    let (r, sample) = tbo_sampled(
        "aie2-b",
        STARTER_OPS,
        &F32_CASES,
        &[("HSA_SIM_PACKET_ABI", "b"), ("HSA_SIM_AGENTS", "aie2")],
    );
    assert_hundreds_pass(&r, "aie2/b", sample.at_least(400));
    assert!(
        r.output.contains("Device description: aie2"),
        "{}",
        r.output
    );
}

/// The f32 cases of the starter ops, the norms, the row ops and the reductions with two
/// test-backend-ops workers under packet ABIs a2 and a3 (MUL_MAT under a3 below). Every op of
/// docs/ops.md runs once, under packet ABI c (two processes sharing one kernel cache), in
/// `every_op_under_packet_abi_c`; a1, the default, runs the starter ops above, b their
/// f32 cases and an explicit choice below. The ABIs differ in how a dispatch is encoded, not in
/// what a kernel computes, so one sweep of every op serves them all.
#[test]
fn starter_row_and_reduction_ops_with_two_workers_under_packet_abis_a2_and_a3() {
    let ops = format!("{STARTER_OPS},{ROW_AND_REDUCTION_OPS}");
    for abi in ["a2", "a3"] {
        let args = ["-j", "2", F32_CASES[0], F32_CASES[1]];
        let (r, sample) = tbo_sampled(abi, &ops, &args, &[("HSA_SIM_PACKET_ABI", abi)]);
        assert_hundreds_pass(&r, abi, sample.at_least(850));
    }
}

/// The norms, the row ops and the reductions under the default packet ABI (a1). MUL_MAT's
/// every case runs in `every_op_under_packet_abi_c`, its quantized weights below.
#[test]
fn row_and_reduction_ops() {
    let (r, sample) = tbo_sampled("rows", ROW_AND_REDUCTION_OPS, &[], &[]);
    assert_hundreds_pass(&r, ROW_AND_REDUCTION_OPS, sample.at_least(600));
    assert_cases_ran_ok(
        &r,
        &[
            "ARGMAX(type=f32",
            "COUNT_EQUAL(type=f32",
            "CROSS_ENTROPY_LOSS(type=f32",
        ],
    );
}

/// test-backend-ops' fusion cases (whole graphs compared with the CPU): a feed-forward block's
/// gate and up MUL_MATs and their GLU, and MUL_MATs followed by a bias ADD
/// (`MUL_MAT_VEC_FUSION`, glu_op 1 GEGLU, 2 SWIGLU; f32, f16 and quantized weights, batches of
/// 1 to 8 rows), and RMS_NORM -> MUL -> ADD (one kernel where the weight is one row). They
/// must pass, and the fused kernels
/// must be what ran: each is compiled into the kernel cache only when a graph asks for it.
#[test]
fn fused_feed_forward_and_norm_cases_run_as_one_kernel() {
    let r = tbo("fusion", "MUL_MAT_VEC_FUSION,RMS_NORM_MUL_ADD", &[], &[]);
    assert_hundreds_pass(&r, "fusion cases", 100);
    assert_cases_ran_ok(
        &r,
        &[
            "MUL_MAT_VEC_FUSION(type=f32,glu_op=2,",
            "MUL_MAT_VEC_FUSION(type=q4_0,glu_op=1,",
            "MUL_MAT_VEC_FUSION(type=q4_K,glu_op=2,",
            "RMS_NORM_MUL_ADD(type=f32",
        ],
    );
    common::assert_kernels_built(
        &common::scratch_path("tbo-sim-fusion").join("aie2p"),
        &[
            "mul_mat_swiglu-q4_0_",
            "mul_mat_geglu-f32_",
            "mul_mat_add-q8_0_",
            "rms_norm_mul_add-f32_",
        ],
    );
}

/// Quantized MUL_MAT and the reductions with two test-backend-ops workers (two graphs at once
/// on one device), under packet ABI a3: every quantized weight type the backend takes ran.
#[test]
fn quantized_mul_mat_and_reductions_with_two_workers() {
    let r = tbo(
        "quant-j2",
        "MUL_MAT,ARGMAX,COUNT_EQUAL,CROSS_ENTROPY_LOSS",
        &[
            "-j",
            "2",
            "-p",
            "^(type_a=(q4_0|q4_1|q5_0|q8_0|q4_K|q5_K|q6_K),type_b=f32|type=f32)",
        ],
        &[("HSA_SIM_PACKET_ABI", "a3")],
    );
    assert_hundreds_pass(&r, "quantized MUL_MAT, reductions, -j 2", 150);
    assert_eq!(r.not_supported, 0, "{}", r.output);
    assert_cases_ran_ok(
        &r,
        &[
            "MUL_MAT(type_a=q4_0,type_b=f32",
            "MUL_MAT(type_a=q8_0,type_b=f32",
            "MUL_MAT(type_a=q4_K,type_b=f32",
            "MUL_MAT(type_a=q4_1,type_b=f32",
            "MUL_MAT(type_a=q5_0,type_b=f32",
            "MUL_MAT(type_a=q5_K,type_b=f32",
            "MUL_MAT(type_a=q6_K,type_b=f32",
        ],
    );
}

#[test]
fn an_explicit_packet_abi_is_used() {
    let r = tbo(
        "explicit-b",
        "ADD,GELU",
        &[],
        &[("HSA_SIM_PACKET_ABI", "b"), ("GGML_HSA_PACKET_ABI", "b")],
    );
    assert_hundreds_pass(&r, "explicit b", 100);
}

/// `GGML_HSA_F16_AS_BF16=1` computes f16 kernel operands as bf16, a real loss of precision:
/// the f16 element-wise MUL cases (NMSE about 1e-5 against a 1e-7 tolerance) fail, while the
/// f16 MUL_MAT cases (NMSE about 5e-6 against 5e-4) still pass. Without the option the same MUL
/// cases pass.
#[test]
fn f16_as_bf16_changes_f16_results() {
    let f16_cases = ["-p", "^type(_a)?=f16,"];
    let off = tbo("f16-exact", "MUL", &f16_cases, &[]);
    assert_hundreds_pass(&off, "MUL f16", 40);
    let on = tbo(
        "f16-as-bf16",
        "MUL,MUL_MAT",
        &f16_cases,
        &[("GGML_HSA_F16_AS_BF16", "1")],
    );
    let failed = |op: &str| {
        on.output
            .lines()
            .filter(|l| l.contains(&format!("{op}(type")) && l.trim_end().ends_with(": FAIL"))
            .count() as u64
    };
    assert_eq!(failed("MUL"), off.total, "{}", on.output);
    assert_eq!(failed("MUL_MAT"), 0, "{}", on.output);
    assert!(on.total > off.total + 200, "{}", on.output);
    assert_eq!(on.passed, on.total - off.total, "{}", on.output);
}

/// FLASH_ATTN_EXT on aie2 under packet ABI c with two workers, a seventh of its cases: head
/// sizes 64 (every K/V type) and 576 (DeepSeek's MLA, V a view of K) with 113 keys, grouped and
/// permuted heads at 512 keys, and the softcap cases (456 run with the pinned llama.cpp), of
/// which a default run takes a turn; every case runs on aie2p in `every_op_under_packet_abi_c`.
/// The f32, f16 and bf16 K/V cases run and pass, the quantized ones are declined; decode and
/// prefill, masks, ALiBi, softcap, sinks, grouped-query heads and permuted operands are among
/// them.
#[test]
fn flash_attn_ext_on_aie2_with_packet_abi_c() {
    let (r, sample) = tbo_sampled(
        "fattn-aie2-c",
        "FLASH_ATTN_EXT",
        &[
            "-j",
            "2",
            "-p",
            "(hsk=(64|576),.*kv=113,)|logit_softcap=10\
             |(hsk=64,.*nr23=\\[4,3\\],kv=512,.*permute=\\[0,2,1,3\\])",
        ],
        &[
            ("HSA_SIM_PACKET_ABI", "c"),
            ("GGML_HSA_PACKET_ABI", "c"),
            ("HSA_SIM_AGENTS", "aie2"),
        ],
    );
    assert_hundreds_pass(&r, "FLASH_ATTN_EXT aie2/c", sample.at_least(400));
    // Every K/V type combination runs in each turn (a stratum of the sample).
    assert_cases_ran_ok(&r, &["type_K=bf16,type_V=bf16", "type_K=f32,type_V=f32"]);
    if sample == Sample::All {
        assert_cases_ran_ok(
            &r,
            &[
                "nb=1,mask=1,sinks=1",
                "nb=75,mask=1,sinks=0,max_bias=8.000000",
                "logit_softcap=10.000000",
                "nr23=[4,3]",
                "permute=[0,2,1,3]",
                "hsk=576,hsv=512",
            ],
        );
        // A turn names only the cases support mode accepts; the whole run shows the declines.
        assert!(
            r.output
                .lines()
                .any(|l| l.contains("type_K=q8_0") && l.contains("not supported")),
            "{}",
            r.output
        );
    }
}

/// Every op HSA0 takes, under packet ABI c (kernels loaded as AIE code objects, what the newest
/// ROCR takes) on aie2p: this run's sample of every case test-backend-ops generates (every case
/// with `GGML_HSA_TEST_SAMPLE=all`), none failing. The other sweeps here check what differs
/// between packet ABIs and architectures (how a dispatch is encoded and which agent runs it, not
/// what a kernel computes: the reference executors are the same).
///
/// Its CSV is the sweep `scripts/gen-ops-doc.sh --check --sweep` reads (scripts/test.sh runs it
/// next): `ops-sweep.csv` in cargo's scratch directory for tests (`target/tmp`), with the sample
/// it covers in `ops-sweep.sample` (`all`, or `T/N`); scripts/gen-ops-doc.sh runs it whole to
/// write docs/ops.md. FLASH_ATTN_EXT (about 40% of the cases)
/// and the other ops run in two processes at once, one kernel cache for both (two, not
/// test-backend-ops' -j, whose workers print CSV rows field by field into one stdout).
#[test]
fn every_op_under_packet_abi_c() {
    let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let csv_path = out_dir.join("ops-sweep.csv");
    let sample_path = out_dir.join("ops-sweep.sample");
    let _ = std::fs::remove_file(&csv_path);
    let _ = std::fs::remove_file(&sample_path);
    let sample = Sample::from_env(SHARE);
    let vars = sim_env(
        "every-op-c",
        &[("HSA_SIM_PACKET_ABI", "c"), ("GGML_HSA_PACKET_ABI", "c")],
    );
    let program = common::llama_program("test-backend-ops");
    let mut ops: Vec<String> =
        common::sample::supported_cases(&program, "", &["-b", "HSA0"], &vars)
            .into_iter()
            .map(|c| c.op)
            .collect();
    ops.sort();
    ops.dedup();
    assert!(
        ops.len() > 50,
        "only {} ops with a supported case",
        ops.len()
    );
    let (fa, rest): (Vec<String>, Vec<String>) =
        ops.into_iter().partition(|o| o == "FLASH_ATTN_EXT");
    // One group's processes one after another; CSV rows only (no header).
    let sweep = |group: &[String]| -> (Vec<String>, bool) {
        let mut rows = Vec::new();
        let mut ok = true;
        if group.is_empty() {
            return (rows, ok);
        }
        let (runs, _) = sampled_runs(sample, &program, &group.join(","), &[], &vars);
        for args in runs {
            let out = std::process::Command::new(&program)
                .args(["test", "-b", "HSA0", "--output", "csv"])
                .args(&args)
                .envs(vars.iter().map(|(k, v)| (k, v)))
                .output()
                .expect("run test-backend-ops");
            ok &= out.status.success();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            rows.extend(text.lines().skip(1).map(str::to_owned));
        }
        (rows, ok)
    };
    let turn = common::test_backend_ops::one_at_a_time();
    let ((fa_rows, fa_ok), (rows, rest_ok)) = std::thread::scope(|s| {
        let fa_run = s.spawn(|| sweep(&fa));
        let rest_run = sweep(&rest);
        (fa_run.join().expect("FLASH_ATTN_EXT sweep"), rest_run)
    });
    drop(turn);
    let header = "\"backend_name\",\"op_name\",\"op_params\",\"test_mode\",\"supported\",\
                  \"error_message\",\"backend_reg_name\"";
    let all_rows: Vec<String> = rows.into_iter().chain(fa_rows).collect();
    // A row: backend, op, params, mode, supported (1/0), then "" or "yes" when it passed.
    let ran: Vec<&String> = all_rows
        .iter()
        .filter(|r| r.split("\",\"").nth(4) == Some("1"))
        .collect();
    let failed: Vec<&&String> = ran
        .iter()
        .filter(|r| !matches!(r.split("\",\"").nth(5), Some("") | Some("yes")))
        .collect();
    println!(
        "every op under packet ABI c: {} cases, {} ran on HSA0, {} failed; sample: {}",
        all_rows.len(),
        ran.len(),
        failed.len(),
        sample.describe()
    );
    // Written before the verdict: scripts/gen-ops-doc.sh tabulates failures too.
    std::fs::write(&csv_path, format!("{header}\n{}\n", all_rows.join("\n"))).unwrap();
    let spec = match sample {
        Sample::All => "all".to_owned(),
        Sample::Turn { turn, share } => format!("{turn}/{share}"),
    };
    std::fs::write(&sample_path, spec + "\n").unwrap();
    assert!(
        ran.len() as u64 >= sample.at_least(7000),
        "only {} cases ran",
        ran.len()
    );
    assert!(failed.is_empty(), "failed: {failed:#?}");
    assert!(fa_ok && rest_ok, "test-backend-ops exited non-zero");
}

/// The sampler of the sweeps above (tests/common/sample.rs).
mod sample_rotation {
    use crate::common::sample::{case_filters, Case, Sample};

    fn cases() -> Vec<Case> {
        (0..400)
            .map(|i| Case {
                op: if i % 40 == 0 { "RARE" } else { "ADD" }.to_owned(),
                params: format!("type={},n={i}", if i % 2 == 0 { "f32" } else { "f16" }),
            })
            .collect()
    }

    #[test]
    fn the_turns_of_a_rotation_cover_every_case_once_and_every_stratum_each_turn() {
        let all = cases();
        let mut seen = vec![0; all.len()];
        for turn in 0..4 {
            let s = Sample::Turn { turn, share: 4 };
            let picked = s.pick(&all, Case::full_name, Case::stratum);
            assert!(picked.len() < all.len() / 2, "{}", picked.len());
            for stratum in ["RARE type=f32", "ADD type=f32", "ADD type=f16"] {
                assert!(picked.iter().any(|c| c.stratum() == stratum), "{stratum}");
            }
            for (i, c) in all.iter().enumerate() {
                if s.takes(&c.full_name()) {
                    seen[i] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    }

    #[test]
    fn filters_stay_under_the_argument_limit_and_name_every_case() {
        let many: Vec<Case> = (0..5000)
            .map(|i| Case {
                op: "MUL_MAT".into(),
                params: format!("type_a=q4_0,type_b=f32,m={i},n=1,k=4096,bs=[1,1],nr=[1,1]"),
            })
            .collect();
        let filters = case_filters(&many);
        assert!(filters.len() > 1);
        assert!(filters.iter().all(|f| f.len() <= 100 * 1024));
        let joined = filters.join(",");
        assert!(many.iter().all(|c| joined.contains(&c.full_name())));
    }
}
