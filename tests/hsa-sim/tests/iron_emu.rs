//! The IRON designs and AIE core kernels of src/ggml_hsa_iron, emulated: each case is compiled
//! with `python3 -m ggml_hsa_iron --target emu compile` (image version 2), run by the
//! emulation executor (exec::iron) and compared with the reference executor (the oracle) on
//! the same inputs. Also: the mutation test (designs with a dataflow bug must fail).

mod iron_common;

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
