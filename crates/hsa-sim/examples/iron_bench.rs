//! Benchmark (not a test): the kernels of one tiny-llama decode step (4 layers, n_embd 256,
//! 2 KV heads of 64, n_ff 512, 32000-token vocabulary; f32 weights) compiled by the IRON
//! package's emulation target and run by hsa-sim's dataflow emulator. Prints, per kernel, the
//! cold compile (empty library cache), the warm compile (cached library: Python + recording
//! only) and the emulated run time, and the emulated time of the whole decode step.
//!
//!   cargo run --release -p hsa-sim --example iron_bench

#[path = "../tests/iron_common/mod.rs"]
mod iron_common;

use iron_common::*;
use std::time::Instant;

fn main() {
    let cold = tempdir().join("cold-cache");
    let f32_t = |ne| Operand::dense("f32", ne);
    let gemv = |k: i64, n: i64| {
        Case::new(
            "MUL_MAT",
            &[f32_t([k, n, 1, 1]), f32_t([k, 1, 1, 1])],
            f32_t([n, 1, 1, 1]),
        )
    };
    let v = |n: i64| [n, 1, 1, 1];
    // (kernel, dispatches per decode step)
    let step: Vec<(&str, Case, u32)> = vec![
        ("wq / wo  256x256", gemv(256, 256), 8),
        ("wk / wv  256x128", gemv(256, 128), 8),
        ("gate/up  256x512", gemv(256, 512), 8),
        ("down     512x256", gemv(512, 256), 4),
        ("lm head  256x32000", gemv(256, 32000), 1),
        (
            "ADD 256",
            Case::new("ADD", &[f32_t(v(256)), f32_t(v(256))], f32_t(v(256))),
            8,
        ),
        (
            "MUL 256 (norm weight)",
            Case::new("MUL", &[f32_t(v(256)), f32_t(v(256))], f32_t(v(256))),
            9,
        ),
        (
            "SILU 512",
            Case::new("SILU", &[f32_t(v(512))], f32_t(v(512))),
            4,
        ),
        (
            "MUL 512",
            Case::new("MUL", &[f32_t(v(512)), f32_t(v(512))], f32_t(v(512))),
            4,
        ),
    ];
    println!(
        "{:<24} {:>10} {:>10} {:>12} {:>6}",
        "kernel", "cold (s)", "warm (s)", "run (ms)", "x/step"
    );
    let mut total_ms = 0.0;
    let (mut cold_total, mut warm_total) = (0.0, 0.0);
    for (what, case, count) in &step {
        let req = request_json(case, "aie2p");
        let name = case.name("aie2p");
        let t = Instant::now();
        let img = compile_with_cache(&req, &name, &cold);
        let c = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let _ = compile_with_cache(&req, &name, &cold);
        let w = t.elapsed().as_secs_f64();
        let mut b = Buffers::new(case, 1);
        run_emu(&img, &mut b).expect("first run (loads the library per core)");
        let runs = 5;
        let t = Instant::now();
        for _ in 0..runs {
            run_emu(&img, &mut b).expect("run");
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / runs as f64;
        total_ms += ms * *count as f64;
        cold_total += c;
        warm_total += w;
        println!("{what:<24} {c:>10.2} {w:>10.2} {ms:>12.2} {count:>6}");
    }
    println!(
        "decode step: {total_ms:.1} ms emulated (sum over its dispatches); compiles of these {} \
         kernels: {cold_total:.1} s cold, {warm_total:.1} s warm",
        step.len()
    );
    let _ = std::fs::remove_dir_all(cold.parent().unwrap());
}

fn compile_with_cache(req: &str, name: &str, cache: &std::path::Path) -> Vec<u8> {
    compile_emu_with(&package_src(), req, name, cache).unwrap_or_else(|e| panic!("{e}"))
}
