//! Executor semantics (ggml reference formulas).

use hsa_runtime64::exec::{bf16_from_f32, bf16_to_f32, unary_f32};
use hsa_runtime64::ops::UnaryOp::*;

#[test]
fn bf16_rounding_matches_ggml() {
    assert_eq!(bf16_from_f32(1.0), 0x3f80);
    // 1 + 2^-8 is exactly between two bf16 values: ties to even (down).
    assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(bf16_from_f32(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert!(bf16_to_f32(bf16_from_f32(f32::NAN)).is_nan());
    assert_eq!(bf16_to_f32(bf16_from_f32(f32::INFINITY)), f32::INFINITY);
}

#[test]
fn unary_formulas() {
    assert_eq!(unary_f32(Sgn, -0.0), 0.0);
    assert_eq!(unary_f32(Sgn, -2.0), -1.0);
    assert_eq!(unary_f32(Step, 0.0), 0.0);
    assert_eq!(unary_f32(Step, 1e-30), 1.0);
    assert_eq!(unary_f32(Round, 2.5), 3.0);
    assert_eq!(unary_f32(Round, -2.5), -3.0);
    assert_eq!(unary_f32(Trunc, -2.7), -2.0);
    assert_eq!(unary_f32(Hardswish, 1.0), 1.0 * (4.0f32 / 6.0));
    assert_eq!(unary_f32(Hardswish, -4.0), -0.0);
    assert_eq!(unary_f32(Hardsigmoid, 5.0), 1.0);
    assert_eq!(unary_f32(Elu, -1.0), (-1.0f32).exp_m1());
    assert_eq!(unary_f32(Relu, -1.0), 0.0);
    // GELU goes through fp16 like ggml-cpu's table; saturates at +-10.
    assert_eq!(unary_f32(Gelu, 12.0), 12.0);
    assert_eq!(unary_f32(Gelu, -12.0), 0.0);
    let g = unary_f32(Gelu, 1.0);
    assert!((g - 0.841_192).abs() < 1e-3, "{g}");
    assert_eq!(g, half::f16::from_f32(g).to_f32());
    let gq = unary_f32(GeluQuick, 1.0);
    assert!((gq - 1.0 / (1.0 + (-1.702f32).exp())).abs() < 1e-3);
    let ge = unary_f32(GeluErf, 1.0);
    assert!((ge - 0.841_344_7).abs() < 1e-6, "{ge}");
    assert!((unary_f32(Sigmoid, 0.0) - 0.5).abs() < 1e-7);
    assert!((unary_f32(Silu, 1.0) - 0.731_058_6).abs() < 1e-6);
}

#[test]
fn dev_heap_placement_avoids_device_address_aliases() {
    use hsa_runtime64::memory::aliases_device_address;
    assert!(aliases_device_address(0x7f00_0400_0000, 4096));
    assert!(aliases_device_address(0x7f00_06ff_f000, 4096));
    assert!(aliases_device_address(0x7f00_03ff_f000, 8192));
    assert!(!aliases_device_address(0x7f00_03ff_f000, 4096));
    assert!(!aliases_device_address(0x7f00_0500_0000, 0x100_0000));
    assert!(aliases_device_address(0x7f00_ffff_f000, 0x400_2000)); // wraps into the next window
}
