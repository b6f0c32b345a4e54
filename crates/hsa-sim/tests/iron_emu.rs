//! The IRON designs and AIE core kernels of src/ggml_hsa_iron, emulated: each case is compiled
//! with `python3 -m ggml_hsa_iron --target emu compile` (image version 2), run by the
//! emulation executor (exec::iron) and compared with the reference executor (the oracle) on
//! the same inputs. Also: the mutation test (designs with a dataflow bug must fail).

mod iron_common;

use hsa_runtime64::cost::AIE2P;
use hsa_runtime64::exec::iron::timing::Rates;
use iron_common::*;

fn f32_t(ne: [i64; 4]) -> Operand {
    Operand::dense("f32", ne)
}
fn bf16_t(ne: [i64; 4]) -> Operand {
    Operand::dense("bf16", ne)
}

#[test]
fn eltwise_unary_and_binary() {
    let n = |k| [k, 1, 1, 1];
    let cases = [
        Case::new("GELU", &[bf16_t(n(5005))], bf16_t(n(5005))),
        Case::new("SILU", &[f32_t(n(4096))], f32_t(n(4096))),
        Case::new(
            "NEG",
            &[Operand::dense("i8", n(999))],
            Operand::dense("i8", n(999)),
        ),
        Case::new("ADD", &[f32_t(n(3000)), f32_t(n(3000))], f32_t(n(3000))),
        Case::new(
            "SUB",
            &[Operand::dense("i8", n(4000)), Operand::dense("i8", n(4000))],
            Operand::dense("i8", n(4000)),
        ),
        Case::new("MUL", &[bf16_t(n(777)), f32_t(n(777))], bf16_t(n(777))),
        Case::new("DIV", &[f32_t(n(1000)), f32_t(n(1000))], f32_t(n(1000))),
        Case::new(
            "ADD",
            &[f32_t([16, 10, 4, 3]), f32_t([16, 1, 4, 1])],
            f32_t([16, 10, 4, 3]),
        ),
        Case::new(
            "MUL",
            &[bf16_t([33, 7, 2, 1]), f32_t([33, 1, 1, 1])],
            bf16_t([33, 7, 2, 1]),
        )
        .params(&[]),
        Case::new("SCALE", &[f32_t(n(2048))], f32_t(n(2048)))
            .params(&[2.5f32.to_bits() as i32, 0.25f32.to_bits() as i32]),
    ];
    for arch in ["aie2p", "aie2"] {
        for c in &cases {
            c.check(arch);
        }
    }
}

/// Large inputs and infinities (test-backend-ops' wide-range cases): the kernels' reciprocal
/// of |x| >= 2^126 must be 0, not NaN (a kernel bug the emulation found through
/// test-backend-ops), so tanh, sigmoid & co. saturate.
#[test]
fn eltwise_wide_range_and_infinities() {
    let n = [1000, 1, 1, 1];
    for op in [
        "TANH",
        "SIGMOID",
        "GELU",
        "GELU_QUICK",
        "SILU",
        "EXP",
        "NEG",
        "ABS",
    ] {
        // Around exp's overflow (|x| near 88, where 1/exp(x) leaves the normal range), and
        // far beyond it with infinities.
        for scale in [60.0, 1e4] {
            let c = Case::new(op, &[f32_t(n)], f32_t(n)).scale(scale);
            c.check("aie2p");
            c.check("aie2");
        }
    }
}

#[test]
fn mul_mat_gemm_and_gemv() {
    let cases = [
        // GEMM (M > 1): on-grid and off-grid shapes, batch broadcast.
        Case::new(
            "MUL_MAT",
            &[f32_t([64, 64, 1, 1]), f32_t([64, 32, 1, 1])],
            f32_t([64, 32, 1, 1]),
        ),
        Case::new(
            "MUL_MAT",
            &[bf16_t([128, 72, 1, 1]), f32_t([128, 20, 1, 1])],
            f32_t([72, 20, 1, 1]),
        ),
        Case::new(
            "MUL_MAT",
            &[bf16_t([64, 40, 2, 1]), f32_t([64, 16, 4, 1])],
            f32_t([40, 16, 4, 1]),
        ),
        Case::new(
            "MUL_MAT",
            &[
                Operand::dense("i8", [64, 64, 1, 1]),
                Operand::dense("i8", [64, 16, 1, 1]),
            ],
            Operand::dense("i32", [64, 16, 1, 1]),
        ),
        // GEMV (M = 1), K off the vector grid.
        Case::new(
            "MUL_MAT",
            &[f32_t([2051, 37, 1, 1]), f32_t([2051, 1, 1, 1])],
            f32_t([37, 1, 1, 1]),
        ),
        Case::new(
            "MUL_MAT",
            &[bf16_t([256, 300, 1, 1]), bf16_t([256, 1, 1, 1])],
            f32_t([300, 1, 1, 1]),
        ),
    ];
    for arch in ["aie2p", "aie2"] {
        for c in &cases {
            c.check(arch);
        }
    }
}

/// A copy of the IRON package with `from` replaced by `to` in `file` (exactly once).
fn mutated(file: &str, edits: &[(&str, &str)]) -> std::path::PathBuf {
    let root = tempdir();
    let pkg = root.join("ggml_hsa_iron");
    copy_dir(&package_src().join("ggml_hsa_iron"), &pkg);
    let path = pkg.join(file);
    let mut text = std::fs::read_to_string(&path).expect("read design");
    for (from, to) in edits {
        assert_eq!(
            text.matches(from).count(),
            1,
            "mutation {from:?} must match once in {file}"
        );
        text = text.replace(from, to);
    }
    std::fs::write(&path, text).expect("write mutation");
    root
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("readdir") {
        let e = e.expect("entry");
        let p = e.path();
        if p.file_name().is_some_and(|n| n == "__pycache__") {
            continue;
        }
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).expect("copy");
        }
    }
}

/// What makes the emulation worth trusting: a design with a dataflow bug fails, with a wrong result or
/// a clear message, while the unmodified design passes (the other tests).
#[test]
fn mutated_designs_fail() {
    // m = 8, n = 16 with 4 x 8 microkernel blocks, K = 2 steps of 128: no walk is trivial.
    let gemm = Case::new(
        "MUL_MAT",
        &[bf16_t([256, 96, 1, 1]), f32_t([256, 48, 1, 1])],
        f32_t([96, 48, 1, 1]),
    );
    let binary = Case::new(
        "ADD",
        &[f32_t([65536, 1, 1, 1]), f32_t([65536, 1, 1, 1])],
        f32_t([65536, 1, 1, 1]),
    );
    // (what, file, edits, case, expected message or None for a wrong result)
    type Mutation<'a> = (
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        &'a Case,
        Option<&'a str>,
    );
    let mutations: Vec<Mutation> = vec![
        (
            "C re-layout dropped (to_stream of the memory tile's C fifo)",
            "designs/mul_mat.py",
            vec![("to_stream=_walk(m * n, c_rows)", "")],
            &gemm,
            None,
        ),
        (
            "two strides of the A tap swapped",
            "tiling.py",
            vec![(
                "(count, K // ak, cm, ak), (0, ak, K, 1))",
                "(count, K // ak, cm, ak), (0, K, ak, 1))",
            )],
            &gemm,
            None,
        ),
        (
            "a core takes two A objects per step (starves: deadlock)",
            "designs/mul_mat.py",
            vec![
                ("                a = of_a.acquire(1)\n", "                a = of_a.acquire(2)[0]\n"),
                ("                of_a.release(1)\n", "                of_a.release(2)\n"),
            ],
            &gemm,
            Some("deadlock"),
        ),
        (
            "the core-side A depth shrunk below what the core acquires",
            "designs/mul_mat.py",
            vec![
                ("                a = of_a.acquire(1)\n", "                a = of_a.acquire(2)[0]\n"),
                ("                of_a.release(1)\n", "                of_a.release(2)\n"),
                ("a_rows[i].cons()", "a_rows[i].cons(depth=1)"),
            ],
            &gemm,
            Some("must be smaller than depth 1"),
        ),
        (
            "core memory budget exceeded (the plan allowed 160 KiB of buffers)",
            "archs.py",
            vec![(
                "        l1_budget=48 * 1024,\n        memtile_bytes=512 * 1024,\n        mmul={\"bf16\": (4, 8, 8)",
                "        l1_budget=160 * 1024,\n        memtile_bytes=512 * 1024,\n        mmul={\"bf16\": (4, 8, 8)",
            )],
            &binary,
            Some("bytes of data memory needed"),
        ),
    ];
    for (what, file, edits, case, expect) in mutations {
        let src = mutated(file, &edits);
        let r = case.run_from(&src, "aie2p");
        let _ = std::fs::remove_dir_all(&src);
        eprintln!("{what}: {r:?}");
        match (r, expect) {
            (Ok(e), None) => assert!(e > case.tolerance(), "{what}: still passes (nmse {e:e})"),
            (Ok(e), Some(m)) => panic!("{what}: expected an error with {m:?}, got nmse {e:e}"),
            (Err(msg), Some(m)) => assert!(msg.contains(m), "{what}: {msg}"),
            (Err(msg), None) => assert!(
                msg.contains("deadlock") || msg.contains("DMA") || msg.contains("ggml_hsa_iron:"),
                "{what}: unclear failure {msg}"
            ),
        }
    }
}

/// A corrupt version-2 image is a clean error (never a crash): truncated, bad lengths, bad
/// JSON, out-of-range indices, a library that does not load.
#[test]
fn corrupt_images_are_clean_errors() {
    use hsa_runtime64::image;
    let case = Case::new(
        "ADD",
        &[f32_t([64, 1, 1, 1]), f32_t([64, 1, 1, 1])],
        f32_t([64, 1, 1, 1]),
    );
    let img = compile_emu_from(
        &package_src(),
        &request_json(&case, "aie2p"),
        &case.name("aie2p"),
    )
    .expect("compiles");
    let (json, lib) = image::split_image_v2(&img).expect("valid image");
    let json = std::str::from_utf8(json).unwrap().to_owned();
    let rebuild = |json: &str, lib: &[u8]| {
        let mut v = b"HSASIMK1".to_vec();
        for w in [2u32, json.len() as u32, lib.len() as u32, 0] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(json.as_bytes());
        v.extend_from_slice(lib);
        v
    };
    let try_run = |img: &[u8]| -> Result<(), String> {
        let mut b = Buffers::new(&case, 3);
        run_emu(img, &mut b)
    };
    assert!(try_run(&img[..img.len() - 10])
        .unwrap_err()
        .contains("truncated"));
    let mut bad = img.clone();
    bad[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(image::image_len_from_header(&bad).is_err());
    let e = try_run(&rebuild(&json.replacen('{', "[", 1), lib)).unwrap_err();
    assert!(e.contains("program JSON"), "{e}");
    let e = try_run(&rebuild(
        &json.replacen("\"fifo\":1,", "\"fifo\":99,", 1),
        lib,
    ))
    .unwrap_err();
    assert!(
        e.contains("does not exist") || e.contains("malformed"),
        "{e}"
    );
    let e = try_run(&rebuild(&json.replacen("\"name\":", "\"nome\":", 1), lib)).unwrap_err();
    assert!(e.contains("unknown field"), "{e}");
    let e = try_run(&rebuild(&json, b"not an ELF file")).unwrap_err();
    assert!(e.contains("cannot load the kernel library"), "{e}");
    try_run(&img).expect("the original still runs");
}

/// In place (ggml's `_inplace` ops): the output is input 0's memory. The DMA walkers read and
/// write operand memory in dataflow order, so every element is read before it is overwritten.
#[test]
fn in_place_output_aliases_input_0() {
    use hsa_runtime64::exec::OperandMem;
    for (op, n) in [("ADD", 3001i64), ("MUL", 4096)] {
        let case = Case::new(
            op,
            &[f32_t([n, 1, 1, 1]), f32_t([n, 1, 1, 1])],
            f32_t([n, 1, 1, 1]),
        );
        let req = request_json(&case, "aie2p");
        let img = compile_emu_from(&package_src(), &req, &case.name("aie2p")).expect("compiles");
        let mut b = Buffers::new(&case, 11);
        let want = reference(&case, &req, &b);
        let loaded = hsa_runtime64::exec::iron::load(&img).unwrap();
        let mut loaded = loaded.lock();
        let a = OperandMem {
            addr: b.bufs[0].as_mut_ptr() as usize,
            len: b.bufs[0].len(),
        };
        let y = OperandMem {
            addr: b.bufs[1].as_mut_ptr() as usize,
            len: b.bufs[1].len(),
        };
        // SAFETY: the operands cover live Vecs of `b`; the output is input 0 on purpose.
        unsafe {
            hsa_runtime64::exec::iron::execute(&mut loaded, &[], &[a, y, a], Rates::of(&AIE2P))
        }
        .expect("runs");
        let got = values(&case.output, &b.bufs[0]);
        assert_eq!(nmse(&got, &want), 0.0, "{op} in place");
    }
}

/// The row design (designs/_rows.py, kernels/rows.cc): norms, the fused RMS_NORM_MUL and
/// SOFT_MAX's four forms, rows off the vector width, several rows per object, the f16 mask
/// converted on the core, the mask repeated over heads, per-head sinks and ALiBi slopes.
#[test]
fn row_ops() {
    let eps = [1e-5f32.to_bits() as i32];
    let scale_bias = |s: f32, b: f32| [s.to_bits() as i32, b.to_bits() as i32];
    let x = || f32_t([1025, 7, 2, 1]);
    let a = || f32_t([33, 6, 4, 1]);
    let cases = [
        Case::new("RMS_NORM", &[x()], x()).params(&eps),
        Case::new("NORM", &[a()], a()).params(&eps),
        Case::new("RMS_NORM_MUL", &[x(), f32_t([1025, 1, 1, 1])], x()).params(&eps),
        Case::new("SOFT_MAX", &[a()], a()).params(&scale_bias(0.5, 0.0)),
        Case::new(
            "SOFT_MAX_MASK",
            &[f32_t([64, 6, 4, 1]), Operand::dense("f16", [64, 8, 1, 1])],
            f32_t([64, 6, 4, 1]),
        )
        .params(&scale_bias(0.25, 8.0)),
        Case::new("SOFT_MAX_SINKS", &[a(), f32_t([4, 1, 1, 1])], a()).params(&scale_bias(1.0, 0.0)),
        Case::new(
            "SOFT_MAX_MASK_SINKS",
            &[a(), f32_t([33, 6, 2, 1]), f32_t([4, 1, 1, 1])],
            a(),
        )
        .params(&scale_bias(1.0, 4.0)),
    ];
    for arch in ["aie2p", "aie2"] {
        for c in &cases {
            c.check(arch);
        }
    }
}
