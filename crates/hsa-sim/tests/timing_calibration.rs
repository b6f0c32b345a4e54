//! The timing model against published measurements: designs that mirror published designs
//! (src/ggml_hsa_iron/tests/calibration.py: columns, tiles, fifo depths and channel use of the
//! originals) are emulated with the arch's rates, and each time must land within its row's
//! tolerance of the time measured on real hardware. A row that leaves its tolerance is a
//! finding about the model: fix the model's mechanism, never fit a constant to one row.
//! docs/timing-model.md keeps the table this test prints.

mod iron_common;

use hsa_runtime64::cost::{ArchModel, AIE2, AIE2P};
use iron_common::*;
use std::process::Command;

struct Row {
    design: &'static str,
    what: &'static str,
    /// The arch's model with the DRAM bandwidth of the machine the row was measured on.
    model: ArchModel,
    published_us: f64,
    tolerance: f64,
    /// Whether the test fails when the row leaves its tolerance: a row whose mirror is
    /// uncertain (docs/timing-model.md says why) is printed, not held.
    gated: bool,
    source: &'static str,
}

fn image(design: &str, arch: &str) -> Vec<u8> {
    let dir = tempdir();
    let img = dir.join("cal.pdi");
    let out = Command::new("python3")
        .args(["-m", "ggml_hsa_iron.tests.calibration", design, arch])
        .arg(&img)
        .env("PYTHONPATH", package_src())
        .env("GGML_HSA_EMU_CACHE_DIR", cache_dir())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "calibration design {design}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&img).expect("image written");
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// Operand buffers of the program's argument sizes: the inputs filled with small bf16 values
/// (-0.375 to 0.375 by eighths: whatever the element type, a host's float arithmetic stays off
/// its slow paths), the output (the last) with 0xA5.
fn buffers(img: &[u8]) -> Buffers {
    let (json, _) = hsa_runtime64::image::split_image_v2(img).expect("image v2");
    let prog: serde_json::Value = serde_json::from_slice(json).expect("program JSON");
    let args = prog["args"].as_array().expect("args");
    let bufs = args
        .iter()
        .enumerate()
        .map(|(k, a)| {
            let n = a["bytes"].as_u64().expect("bytes") as usize;
            if k + 1 == args.len() {
                vec![0xA5; n]
            } else {
                (0..n.div_ceil(2))
                    .flat_map(|i| bf16_bits(small_value(i + k)).to_le_bytes())
                    .take(n)
                    .collect()
            }
        })
        .collect();
    Buffers { bufs }
}

fn small_value(i: usize) -> f32 {
    ((i * 5 + 3) % 7) as f32 / 8.0 - 0.375
}

fn bf16_bits(x: f32) -> u16 {
    (x.to_bits() >> 16) as u16
}

fn bf16_value(b: &[u8], i: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
}

#[test]
fn published_designs_take_their_published_times() {
    let rows = [
        Row {
            design: "memcpy",
            what: "memcpy through the array, 64 MiB in + 64 MiB out, 8 columns x 2 channels",
            // DRAM binds this design alone, so the row checks that nothing else (channels,
            // the fifos' fill and drain, the passthrough cores) adds time. Its DRAM figure is
            // another measurement's: the 63-70 GB/s read+write roof amd/IRON PR #195 measured
            // on NPU2 (the middle).
            model: ArchModel {
                bandwidth_bytes_per_s: 66.5e9,
                ..AIE2P
            },
            published_us: 2016.0,
            tolerance: 0.10,
            gated: true,
            source: "Xilinx/mlir-aie PR #2559",
        },
        Row {
            design: "gemv",
            what: "amd/IRON GEMV, bf16, 2048 x 8192, 8 columns x 1 core",
            model: AIE2P,
            published_us: 682.0,
            tolerance: 0.15,
            gated: true,
            source: "Xilinx/mlir-air PR #1360",
        },
        Row {
            design: "gemv_air",
            what: "mlir-air GEMV, bf16, 2048 x 2048, 8 columns x 1 core, A through L2",
            model: AIE2P,
            published_us: 330.0,
            tolerance: 0.20,
            gated: true,
            source: "Xilinx/mlir-air kernel_registry/details/GEMV_bf16.md",
        },
        Row {
            design: "gemm_air_2048_n512",
            what: "mlir-air GEMM, bf16 in, f32 out, 2048 x 2048 x 512 (M x K x N), 8 x 4 cores, \
                   tiles 64/256/32/128 (7342 GFLOPS)",
            model: AIE2P,
            published_us: 2.0 * 2048.0 * 2048.0 * 512.0 / 7342e3,
            tolerance: 0.20,
            // The registry's own tile sweep prices each L2 tile of K: at 2048³, tile_k_l2 512
            // runs 13 % faster than 256. The mirror cannot hold L2 tiles larger than its L1
            // objects and pays nothing per L2 tile; this shape has twice as many per launch
            // as the 2048³ row (docs/timing-model.md).
            gated: false,
            source: "Xilinx/mlir-air kernel_registry/details/GEMM_bf16_in_fp32_out.md",
        },
        Row {
            design: "gemm_air_2048",
            what: "mlir-air GEMM, bf16 in, f32 out, 2048³, 8 x 4 cores, tiles 64/512/32/128 \
                   (8508 GFLOPS)",
            model: AIE2P,
            published_us: 2.0 * 2048.0 * 2048.0 * 2048.0 / 8508e3,
            tolerance: 0.20,
            gated: true,
            source: "Xilinx/mlir-air kernel_registry/details/GEMM_bf16_in_fp32_out.md",
        },
        Row {
            design: "gemm_air_2048_tn64",
            what: "the same GEMM at 2048³ with tile_n 64 (6367 GFLOPS)",
            model: AIE2P,
            published_us: 2.0 * 2048.0 * 2048.0 * 2048.0 / 6367e3,
            tolerance: 0.20,
            gated: false,
            source: "Xilinx/mlir-air kernel_registry/details/GEMM_bf16_in_fp32_out.md",
        },
        Row {
            design: "gemv_air_8192",
            what: "mlir-air GEMV, bf16, 8192 x 2048, 8 columns x 1 core, A through L2",
            model: AIE2P,
            published_us: 1067.0,
            tolerance: 0.20,
            // The published times of this design grow by about 8 µs per panel of 32 KiB per
            // column from 2048 to 16384 rows; the mirror's single buffers in L2 and L1 take
            // 10.7 µs, double buffers would take 5.4: how the lowering buffers is not known.
            gated: false,
            source: "Xilinx/mlir-air kernel_registry/details/GEMV_bf16.md",
        },
    ];
    let mut failures = Vec::new();
    println!(
        "| configuration | published | model | ratio | tolerance | binds | busy µs: cores / shim / tile | source |"
    );
    println!("|---|---:|---:|---:|---:|---|---|---|");
    for r in &rows {
        let img = image(r.design, r.model.arch);
        let mut b = buffers(&img);
        let t = run_emu_timed(&img, &mut b, &r.model).expect("the design runs");
        assert!(
            t.cores_counted,
            "{}: the core library counts no cycles",
            r.design
        );
        let us = t.device_ns as f64 / 1e3;
        let ratio = us / r.published_us;
        let binds = [
            ("cores", t.core_busy_ns),
            ("shim DMA", t.shim_busy_ns),
            ("tile DMA", t.tile_busy_ns),
        ]
        .into_iter()
        .max_by_key(|(_, ns)| *ns)
        .map(|(w, _)| w)
        .unwrap_or("-");
        let tolerance = if r.gated {
            format!("±{:.0} %", r.tolerance * 100.0)
        } else {
            "not held".to_owned()
        };
        let busy = |ns: u64| ns as f64 / 1e3;
        println!(
            "| {} | {:.0} µs | {us:.0} µs | {ratio:.2} | {tolerance} | {binds} | {:.0} / {:.0} / {:.0} | {} |",
            r.what,
            r.published_us,
            busy(t.core_busy_ns),
            busy(t.shim_busy_ns),
            busy(t.tile_busy_ns),
            r.source
        );
        if r.gated && (ratio - 1.0).abs() > r.tolerance {
            failures.push(format!(
                "{}: {us:.0} µs, {ratio:.2} x the published {:.0} µs (tolerance ±{:.0} %)",
                r.what,
                r.published_us,
                r.tolerance * 100.0
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A published trace of one core's kernel: the cycles of a call, against what the stand-in
/// counts for the mirror's call (the design's busiest core over its calls).
struct KernelRow {
    design: &'static str,
    what: &'static str,
    model: ArchModel,
    /// Output values of one call, whose count the last argument's size gives.
    values_per_call: usize,
    published_cycles: f64,
    tolerance: f64,
    source: &'static str,
}

#[test]
fn published_kernels_take_their_published_cycles() {
    // AMD's mlir-aie weight-expand examples, README "Explaining the weight expand examples"
    // (public, Apache-2.0 WITH LLVM-exception; the repository holding it was not identified).
    const EXPAND: &str = "AMD's weight-expand examples (mlir-aie), README: AIE2 traces";
    let rows = [
        KernelRow {
            design: "expand_bf16",
            what: "1024 int4 values, a bf16 scale per 32, to bf16, one aie2 core",
            model: AIE2,
            values_per_call: 1024,
            published_cycles: 293.0,
            tolerance: 0.20,
            source: EXPAND,
        },
        KernelRow {
            design: "expand_int16",
            what: "the same to int16 with int16 scales",
            model: AIE2,
            values_per_call: 1024,
            published_cycles: 117.0,
            tolerance: 0.20,
            source: EXPAND,
        },
    ];
    let mut failures = Vec::new();
    println!("| kernel | published cycles per call | model | ratio | tolerance | source |");
    println!("|---|---:|---:|---:|---:|---|");
    for r in &rows {
        let img = image(r.design, r.model.arch);
        let mut b = buffers(&img);
        let values = b.bufs.last().expect("an output").len() / 2;
        let t = run_emu_timed(&img, &mut b, &r.model).expect("the design runs");
        assert!(
            t.cores_counted,
            "{}: the core library counts no cycles",
            r.design
        );
        let calls = (values / r.values_per_call) as f64;
        let cycles = t.core_busy_ns as f64 * r.model.clock_hz / 1e9 / calls;
        let ratio = cycles / r.published_cycles;
        println!(
            "| {} | {:.0} | {cycles:.0} | {ratio:.2} | ±{:.0} % | {} |",
            r.what,
            r.published_cycles,
            r.tolerance * 100.0,
            r.source
        );
        if (ratio - 1.0).abs() > r.tolerance {
            failures.push(format!(
                "{}: {cycles:.0} cycles, {ratio:.2} x the published {:.0}",
                r.what, r.published_cycles
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The memcpy design moves its input to its output unchanged (the timing rides on a correct
/// dataflow); its task groups end in order within the dispatch and move, between them, the
/// input in and the output out.
#[test]
fn the_memcpy_design_copies() {
    let img = image("memcpy", "aie2p");
    let mut b = buffers(&img);
    let t = run_emu_timed(&img, &mut b, &AIE2P).expect("runs");
    assert!(b.bufs[0] == b.bufs[1], "output differs from input");
    assert!(!t.groups.is_empty());
    assert!(t.groups.windows(2).all(|w| w[0].end_ns <= w[1].end_ns));
    assert!(t.groups.last().expect("a group").end_ns <= t.device_ns);
    let moved: u64 = t.groups.iter().map(|g| g.shim_bytes).sum();
    assert_eq!(moved, (b.bufs[0].len() + b.bufs[1].len()) as u64);
}

/// The GEMM mirror computes its product: every core gets its tiles of A and B in the order the
/// kernel expects, and its C tile lands where the runtime sequence drains it
/// (calibration.py's `gemm_air` layouts, aie2p's 8 x 8 x 8 blocks). Its cores' work falls
/// within its task groups' spans: each span's busiest core computes no longer than the span,
/// and together no less than the busiest core over the whole dispatch.
#[test]
fn the_gemm_design_multiplies() {
    let (m, k, n) = (1024usize, 256usize, 1024usize);
    let (tm, tn, herd_m, herd_n, blk) = (64usize, 128usize, 8usize, 4usize, 8usize);
    let img = image("gemm_air_small", "aie2p");
    let mut b = buffers(&img);
    let t = run_emu_timed(&img, &mut b, &AIE2P).expect("runs");
    let mut start = 0;
    for g in &t.groups {
        assert!(g.core_busy_ns <= g.end_ns - start + 1, "{g:?} from {start}");
        start = g.end_ns;
    }
    let per_span: u64 = t.groups.iter().map(|g| g.core_busy_ns).sum();
    assert!(
        per_span >= t.core_busy_ns && t.core_busy_ns > 0,
        "{per_span} {}",
        t.core_busy_ns
    );
    // A as [M/8][K/8][8][8], B as [N/8][K/8][8][8] (each block k-major: [k][n]).
    let a = |i: usize, kk: usize| {
        let at = ((i / blk) * (k / blk) + kk / blk) * 64 + (i % blk) * blk + kk % blk;
        bf16_value(&b.bufs[0], at)
    };
    let bv = |kk: usize, j: usize| {
        let at = ((j / blk) * (k / blk) + kk / blk) * 64 + (kk % blk) * blk + j % blk;
        bf16_value(&b.bufs[1], at)
    };
    let out = &b.bufs[2];
    let tile = tm * tn;
    let mut worst = 0f32;
    for i in (0..m).step_by(7) {
        for j in (0..n).step_by(5) {
            let want: f32 = (0..k).map(|kk| a(i, kk) * bv(kk, j)).sum();
            let (bm, x, ti) = (i / (tm * herd_m), (i / tm) % herd_m, i % tm);
            let (bn, y, tj) = (j / (tn * herd_n), (j / tn) % herd_n, j % tn);
            let block = ((bm * (n / (tn * herd_n)) + bn) * herd_m + x) * herd_n + y;
            let at = block * tile
                + ((ti / blk) * (tn / blk) + tj / blk) * 64
                + (ti % blk) * blk
                + tj % blk;
            let got = f32::from_le_bytes(out[4 * at..4 * at + 4].try_into().unwrap());
            worst = worst.max((got - want).abs());
        }
    }
    assert!(worst < 1e-3, "C differs from A x B by up to {worst}");
}

/// `hsa-sim-time` (what `scripts/bench.sh op` runs for a shape test-backend-ops has no case
/// of) gives the design's time and, on the same inputs, its output as the executor does, and
/// refuses a file that is no image.
#[test]
fn hsa_sim_time_times_an_image() {
    let img = image("gemm_air_small", "aie2p");
    let mut b = buffers(&img);
    let t = run_emu_timed(&img, &mut b, &AIE2P).expect("runs");
    let dir = tempdir();
    let path = dir.join("gemm.pdi");
    std::fs::write(&path, &img).expect("write image");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hsa-sim-time"));
    cmd.arg(&path).args(["--arch", "aie2p"]);
    let last = b.bufs.len() - 1;
    for (k, input) in b.bufs[..last].iter().enumerate() {
        let file = dir.join(format!("in{k}"));
        std::fs::write(&file, input).expect("write input");
        cmd.arg("--input").arg(format!("{k}={}", file.display()));
    }
    let result = dir.join("out");
    cmd.arg("--output")
        .arg(format!("{last}={}", result.display()));
    let out = cmd.output().expect("run hsa-sim-time");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&result).expect("the output written") == b.bufs[last],
        "hsa-sim-time's output is not the executor's"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["device_ns"].as_u64(), Some(t.device_ns));
    assert_eq!(v["core_busy_ns"].as_u64(), Some(t.core_busy_ns));
    assert_eq!(v["cores_counted"].as_bool(), Some(true));
    let groups = v["groups"].as_array().expect("the task groups");
    assert_eq!(groups.len(), t.groups.len());
    assert_eq!(groups[0]["end_ns"].as_u64(), Some(t.groups[0].end_ns));

    std::fs::write(&path, b"not an image").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_hsa-sim-time"))
        .arg(&path)
        .output()
        .expect("run hsa-sim-time");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("hsa-sim-time: "));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An attention over 75 query rows of head size 40 (blocks of 20 rows, the last moved back):
/// a worker calls its kernel at the top of its forever loop's next round after the last drain,
/// which nothing waits for. The dispatch ends with its drains; that call is in no task group's
/// span and the groups end by the dispatch's end.
#[test]
fn a_call_after_the_last_drain_is_in_no_task_group() {
    let c = Case::new(
        "FLASH_ATTN_EXT_MASK",
        &[
            Operand::dense("f32", [40, 75, 4, 1]),
            Operand::dense("f16", [40, 512, 4, 1]),
            Operand::dense("f16", [40, 512, 4, 1]),
            Operand::dense("f16", [512, 75, 1, 1]),
        ],
        Operand::dense("f32", [40, 4, 75, 1]),
    )
    .params(&[0.125f32.to_bits() as i32, 0, 0]);
    let req = request_json(&c, "aie2p");
    let img = compile_emu_from(&package_src(), &req, &c.name("aie2p")).expect("compiles");
    let mut b = Buffers::new(&c, 7);
    let t = run_emu_timed(&img, &mut b, &AIE2P).expect("runs");
    let last = t.groups.last().expect("a task group");
    assert!(last.end_ns <= t.device_ns, "{t:?}");
}
