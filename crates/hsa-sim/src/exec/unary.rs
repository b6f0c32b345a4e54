//! Unary ops with ggml-cpu's formulas (ggml-cpu `vec.h` / `unary-ops.cpp` reference semantics).

use crate::ops::UnaryOp;

const GELU_COEF_A: f32 = 0.044715;
const GELU_QUICK_COEF: f32 = -1.702;
// sqrt(2/pi) = 0.79788456080286535587989211986876, rounded to f32 as ggml does.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const SQRT_2_INV: f32 = std::f32::consts::FRAC_1_SQRT_2;

unsafe extern "C" {
    /// C99 `erff` from the system libm (which the Rust standard library links on Linux).
    safe fn erff(x: f32) -> f32;
}

/// Rounds through IEEE half precision (ggml-cpu evaluates GELU and GELU_QUICK through 64K-entry
/// fp16 lookup tables, so its results are fp16-rounded; the simulator reproduces that).
fn via_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

fn gelu_exact(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

fn gelu_quick_exact(x: f32) -> f32 {
    x * (1.0 / (1.0 + (GELU_QUICK_COEF * x).exp()))
}

/// y = op(x) in f32.
pub fn unary_f32(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sgn => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryOp::Neg => -x,
        UnaryOp::Step => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Elu => {
            if x > 0.0 {
                x
            } else {
                x.exp_m1()
            }
        }
        UnaryOp::Relu => {
            if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Gelu => {
            if x <= -10.0 {
                0.0
            } else if x >= 10.0 {
                x
            } else {
                via_f16(gelu_exact(via_f16(x)))
            }
        }
        UnaryOp::GeluQuick => via_f16(gelu_quick_exact(via_f16(x))),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Hardswish => x * 1.0f32.min(0.0f32.max((x + 3.0) / 6.0)),
        UnaryOp::Hardsigmoid => 1.0f32.min(0.0f32.max((x + 3.0) / 6.0)),
        UnaryOp::Exp => x.exp(),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erff(x * SQRT_2_INV)),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round(),
        UnaryOp::Trunc => x.trunc(),
        UnaryOp::Sqr => x * x,
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
    }
}
