//! Element loads and stores with ggml's conversions.

use crate::ops::DType;

/// bf16 -> f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 -> bf16 as ggml does it: round to nearest even; NaNs stay NaN (quiet bit forced).
pub fn bf16_from_f32(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

pub fn load(ty: DType, bytes: &[u8], off: usize) -> f32 {
    match ty {
        DType::F32 => {
            f32::from_le_bytes([bytes[off], bytes[off + 1], bytes[off + 2], bytes[off + 3]])
        }
        DType::F16 => {
            half::f16::from_bits(u16::from_le_bytes([bytes[off], bytes[off + 1]])).to_f32()
        }
        DType::Bf16 => bf16_to_f32(u16::from_le_bytes([bytes[off], bytes[off + 1]])),
        DType::I8 => bytes[off] as i8 as f32,
        DType::I16 => i16::from_le_bytes([bytes[off], bytes[off + 1]]) as f32,
        DType::I32 => {
            i32::from_le_bytes([bytes[off], bytes[off + 1], bytes[off + 2], bytes[off + 3]]) as f32
        }
        DType::I64 => i64::from_le_bytes(bytes[off..off + 8].try_into().expect("8 bytes")) as f32,
        // Validation admits block-quantized types only as MUL_MAT weights, read by `quant`.
        DType::Q4_0
        | DType::Q8_0
        | DType::Q4K
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q5K
        | DType::Q6K => unreachable!("{} is read by blocks", ty.name()),
    }
}

pub fn store(ty: DType, bytes: &mut [u8], off: usize, v: f32) {
    match ty {
        DType::F32 => bytes[off..off + 4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => {
            bytes[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes())
        }
        DType::Bf16 => bytes[off..off + 2].copy_from_slice(&bf16_from_f32(v).to_le_bytes()),
        DType::I8 => bytes[off] = v as i8 as u8,
        DType::I16 => bytes[off..off + 2].copy_from_slice(&(v as i16).to_le_bytes()),
        DType::I32 => bytes[off..off + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I64 => bytes[off..off + 8].copy_from_slice(&(v as i64).to_le_bytes()),
        DType::Q4_0
        | DType::Q8_0
        | DType::Q4K
        | DType::Q4_1
        | DType::Q5_0
        | DType::Q5K
        | DType::Q6K => unreachable!("{} is never an output", ty.name()),
    }
}
