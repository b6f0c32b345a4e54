//! ggml's block-quantized weight formats (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) and the dot
//! products ggml-cpu's MUL_MAT takes over them.
//!
//! Block layouts (little-endian, as ggml stores them):
//! * Q4_0, 32 values in 18 bytes: f16 scale `d`, then 16 bytes whose low nibbles are values
//!   0..16 and high nibbles values 16..32; value = d · (nibble − 8).
//! * Q8_0, 32 values in 34 bytes: f16 scale `d`, then 32 signed bytes; value = d · q.
//! * Q4_K, 256 values in 144 bytes: f16 `d`, f16 `dmin`, 12 bytes packing eight 6-bit
//!   sub-block scales and eight 6-bit sub-block mins, then 128 bytes of nibbles. Sub-block `s`
//!   (32 values) is in bytes `32·(s/2) ..` (low nibbles for even `s`, high for odd);
//!   value = d · scale_s · nibble − dmin · min_s.
//! * Q4_1, 32 values in 20 bytes: f16 scale `d`, f16 min `m`, 16 bytes of nibbles as Q4_0's;
//!   value = d · nibble + m.
//! * Q5_0, 32 values in 22 bytes: f16 scale `d`, a little-endian u32 whose bit `j` is the fifth
//!   bit of value `j`, 16 bytes of nibbles as Q4_0's; value = d · (nibble | bit·16 − 16).
//! * Q5_K, 256 values in 176 bytes: Q4_K's `d`, `dmin` and 12 scale bytes, 32 bytes `qh`, 128
//!   bytes of nibbles laid out as Q4_K's; value `i` of sub-block `s` takes bit `s` of
//!   `qh[i % 32]` as its fifth bit; value = d · scale_s · q − dmin · min_s.
//! * Q6_K, 256 values in 210 bytes: 128 bytes `ql`, 64 bytes `qh`, 16 signed scales, f16 `d`.
//!   Each half (128 values, `h`) uses `ql[64h..]` and `qh[32h..]`: value `32q + l` of the half
//!   takes the low nibble (q even) or high nibble (q odd) of `ql[64h + 32(q % 2) + l]` and bits
//!   `2q, 2q+1` of `qh[32h + l]` as its top two bits; value = d · scales[i / 16] · (q6 − 32).
//!
//! Why the activations are quantized too: ggml-cpu never multiplies quantized weights by f32
//! activations directly. It first quantizes every activation row to the weight type's "vec_dot
//! type" (Q8_0 for Q4_0 and Q8_0 weights, Q8_K for Q4_K) and then takes integer dot products
//! block by block, scaled in f32. That quantization loses precision (8 bits per activation: an
//! NMSE of about 1e-5 on test-backend-ops' uniform data). The simulator does the same, so it
//! agrees with the CPU backend up to float summation order rather than up to that error. (With
//! exact f32 activations every test-backend-ops case still passes its 5e-4 tolerance; mirroring
//! ggml-cpu keeps the whole budget for the kernel's own rounding, as on the real NPU where the
//! activations are converted to a narrower type too.)

use crate::ops::DType;

/// Values per Q4_0 / Q8_0 block.
const QK: usize = 32;
/// Values per K-quant super-block.
const QK_K: usize = 256;

fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// One activation row quantized to 8 bits: a scale per block, the values, and the sum of the
/// values of every 32-value group (Q8_K keeps such sums to apply Q4_K's sub-block mins).
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Row {
    /// Elements per scale: 32 (Q8_0) or 256 (Q8_K).
    pub block: usize,
    pub d: Vec<f32>,
    pub q: Vec<i8>,
    pub sums32: Vec<i32>,
    /// Q8_1 only: per block d · Σq, rounded to f16 as ggml stores it (applies Q4_1's min).
    pub s: Vec<f32>,
}

impl Q8Row {
    fn with_sums(block: usize, d: Vec<f32>, q: Vec<i8>) -> Q8Row {
        let sums32 = q
            .chunks(QK)
            .map(|c| c.iter().map(|&v| i32::from(v)).sum())
            .collect();
        Q8Row {
            block,
            d,
            q,
            sums32,
            s: Vec::new(),
        }
    }
}

/// Q8_0 as ggml-cpu's x86 SIMD quantizer writes it: per 32 values, d = max|x| / 127 stored as
/// f16, q = x · (127 / max|x|) rounded to nearest, ties to even.
pub fn quantize_q8_0(x: &[f32]) -> Q8Row {
    let mut d = Vec::with_capacity(x.len() / QK);
    let mut q = Vec::with_capacity(x.len());
    for block in x.chunks(QK) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        d.push(half::f16::from_f32(amax / 127.0).to_f32());
        q.extend(block.iter().map(|v| (v * id).round_ties_even() as i8));
    }
    Q8Row::with_sums(QK, d, q)
}

/// Q8_1 as ggml-cpu's x86 SIMD quantizer writes it: Q8_0's values and f16 scale, plus
/// s = d · Σq per block (with the unrounded d = max|x| / 127), stored as f16.
pub fn quantize_q8_1(x: &[f32]) -> Q8Row {
    let mut row = quantize_q8_0(x);
    row.s = x
        .chunks(QK)
        .zip(&row.sums32)
        .map(|(block, &sum)| {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            half::f16::from_f32(amax / 127.0 * sum as f32).to_f32()
        })
        .collect();
    row
}

/// Q8_K as ggml writes it: per 256 values, the value of largest magnitude `max` sets
/// iscale = −127 / max; q = min(127, round(iscale · x)) (ties to even), d = 1 / iscale in f32.
pub fn quantize_q8_k(x: &[f32]) -> Q8Row {
    let mut d = Vec::with_capacity(x.len() / QK_K);
    let mut q = Vec::with_capacity(x.len());
    for block in x.chunks(QK_K) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in block {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            d.push(0.0);
            q.extend(std::iter::repeat_n(0i8, block.len()));
            continue;
        }
        let iscale = -127.0 / max;
        d.push(1.0 / iscale);
        q.extend(
            block
                .iter()
                .map(|v| ((iscale * v).round_ties_even() as i32).min(127) as i8),
        );
    }
    Q8Row::with_sums(QK_K, d, q)
}

/// The activation row quantized as ggml-cpu does for weights of type `ty`.
pub fn quantize_for(ty: DType, x: &[f32]) -> Q8Row {
    match ty {
        DType::Q4K | DType::Q5K | DType::Q6K => quantize_q8_k(x),
        DType::Q4_1 => quantize_q8_1(x),
        _ => quantize_q8_0(x),
    }
}

/// Q4_K's 6-bit scale and min of sub-block `s` (0..8) from the 12 packed bytes.
fn q4k_scale_min(scales: &[u8], s: usize) -> (i32, i32) {
    if s < 4 {
        (i32::from(scales[s] & 63), i32::from(scales[s + 4] & 63))
    } else {
        let sc = (scales[s + 4] & 0x0f) | ((scales[s - 4] >> 6) << 4);
        let m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
        (i32::from(sc), i32::from(m))
    }
}

/// The 4-bit value `i` (0..256) of a Q4_K super-block's 128 nibble bytes.
fn q4k_nibble(qs: &[u8], i: usize) -> i32 {
    let (sub, j) = (i / QK, i % QK);
    let byte = qs[QK * (sub / 2) + j];
    i32::from(if sub % 2 == 0 { byte & 0x0f } else { byte >> 4 })
}

/// The 4-bit value `j` (0..32) of a Q4_0 block's 16 nibble bytes, offset by −8.
fn q4_0_value(qs: &[u8], j: usize) -> i32 {
    let b = qs[j % 16];
    i32::from(if j < 16 { b & 0x0f } else { b >> 4 }) - 8
}

/// The unsigned 4-bit value `j` (0..32) of a Q4_0 / Q4_1 / Q5_0 block's 16 nibble bytes.
fn nibble32(qs: &[u8], j: usize) -> i32 {
    let b = qs[j % 16];
    i32::from(if j < 16 { b & 0x0f } else { b >> 4 })
}

/// The 5-bit value `j` (0..32) of a Q5_0 block (bytes after its scale), offset by −16.
fn q5_0_value(b: &[u8], j: usize) -> i32 {
    let qh = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    (nibble32(&b[4..], j) | (((qh >> j) & 1) as i32) << 4) - 16
}

/// The 5-bit value `i` (0..256) of a Q5_K super-block: `qh` (32 bytes) then `qs` (128).
fn q5k_value(qh: &[u8], qs: &[u8], i: usize) -> i32 {
    let sub = i / QK;
    q4k_nibble(qs, i) | (((i32::from(qh[i % QK]) >> sub) & 1) << 4)
}

/// The 6-bit value `i` (0..256) of a Q6_K super-block, offset by −32.
fn q6k_value(b: &[u8], i: usize) -> i32 {
    let (ql, qh) = (&b[..128], &b[128..192]);
    let (half, q, l) = (i / 128, (i % 128) / 32, i % 32);
    let byte = ql[64 * half + 32 * (q % 2) + l];
    let low = if q < 2 { byte & 0x0f } else { byte >> 4 };
    let high = (qh[32 * half + l] >> (2 * q)) & 3;
    i32::from(low | (high << 4)) - 32
}

/// Q6_K's signed scale of value `i`'s 16-value group.
fn q6k_scale(b: &[u8], i: usize) -> i32 {
    i32::from(b[192 + i / 16] as i8)
}

/// Decodes a row of whole blocks of `ty` into `out` (one f32 per value).
pub fn dequantize(ty: DType, row: &[u8], out: &mut [f32]) {
    let (block, size) = (ty.block(), ty.size());
    for (b, vals) in row.chunks(size).zip(out.chunks_mut(block)) {
        match ty {
            DType::Q4_0 => {
                let d = f16_at(b, 0);
                for (j, v) in vals.iter_mut().enumerate() {
                    *v = d * q4_0_value(&b[2..], j) as f32;
                }
            }
            DType::Q8_0 => {
                let d = f16_at(b, 0);
                for (j, v) in vals.iter_mut().enumerate() {
                    *v = d * f32::from(b[2 + j] as i8);
                }
            }
            DType::Q4K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (scales, qs) = (&b[4..16], &b[16..]);
                for (i, v) in vals.iter_mut().enumerate() {
                    let (sc, m) = q4k_scale_min(scales, i / QK);
                    *v = d * sc as f32 * q4k_nibble(qs, i) as f32 - dmin * m as f32;
                }
            }
            DType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for (j, v) in vals.iter_mut().enumerate() {
                    *v = d * nibble32(&b[4..], j) as f32 + m;
                }
            }
            DType::Q5_0 => {
                let d = f16_at(b, 0);
                for (j, v) in vals.iter_mut().enumerate() {
                    *v = d * q5_0_value(&b[2..], j) as f32;
                }
            }
            DType::Q5K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..]);
                for (i, v) in vals.iter_mut().enumerate() {
                    let (sc, m) = q4k_scale_min(scales, i / QK);
                    *v = d * sc as f32 * q5k_value(qh, qs, i) as f32 - dmin * m as f32;
                }
            }
            DType::Q6K => {
                let d = f16_at(b, 208);
                for (i, v) in vals.iter_mut().enumerate() {
                    *v = d * (q6k_scale(b, i) * q6k_value(b, i)) as f32;
                }
            }
            _ => unreachable!("{} is not block-quantized", ty.name()),
        }
    }
}

/// The dot product of one weight row of `ty` (whole blocks) with an activation row quantized by
/// [`quantize_for`]: integer sums per block, scaled and accumulated in f32 as ggml-cpu does.
pub fn dot(ty: DType, row: &[u8], a: &Q8Row) -> f32 {
    let size = ty.size();
    let mut sum = 0f32;
    for (ib, b) in row.chunks(size).enumerate() {
        match ty {
            DType::Q4_0 | DType::Q8_0 | DType::Q5_0 => {
                let q = &a.q[ib * QK..(ib + 1) * QK];
                let sumi: i32 = (0..QK)
                    .map(|j| {
                        let w = match ty {
                            DType::Q4_0 => q4_0_value(&b[2..], j),
                            DType::Q5_0 => q5_0_value(&b[2..], j),
                            _ => i32::from(b[2 + j] as i8),
                        };
                        w * i32::from(q[j])
                    })
                    .sum();
                sum += f16_at(b, 0) * a.d[ib] * sumi as f32;
            }
            DType::Q4_1 => {
                // Σ (d·n + m)·(da·q) = d·da·Σ n·q + m·(da·Σq), the last factor being Q8_1's s.
                let q = &a.q[ib * QK..(ib + 1) * QK];
                let sumi: i32 = (0..QK)
                    .map(|j| nibble32(&b[4..], j) * i32::from(q[j]))
                    .sum();
                sum += f16_at(b, 0) * a.d[ib] * sumi as f32 + f16_at(b, 2) * a.s[ib];
            }
            DType::Q6K => {
                let q = &a.q[ib * QK_K..(ib + 1) * QK_K];
                let sumi: i32 = (0..QK_K)
                    .map(|i| q6k_scale(b, i) * q6k_value(b, i) * i32::from(q[i]))
                    .sum();
                sum += f16_at(b, 208) * a.d[ib] * sumi as f32;
            }
            DType::Q4K | DType::Q5K => {
                let scales = &b[4..16];
                let q = &a.q[ib * QK_K..(ib + 1) * QK_K];
                let (mut sumi, mut summ) = (0i32, 0i32);
                for s in 0..QK_K / QK {
                    let (sc, m) = q4k_scale_min(scales, s);
                    let dot: i32 = (s * QK..(s + 1) * QK)
                        .map(|i| {
                            let w = if ty == DType::Q4K {
                                q4k_nibble(&b[16..], i)
                            } else {
                                q5k_value(&b[16..48], &b[48..], i)
                            };
                            w * i32::from(q[i])
                        })
                        .sum();
                    sumi += sc * dot;
                    summ += m * a.sums32[ib * (QK_K / QK) + s];
                }
                let d = a.d[ib] * f16_at(b, 0);
                let dmin = a.d[ib] * f16_at(b, 2);
                sum += d * sumi as f32 - dmin * summ as f32;
            }
            _ => unreachable!("{} is not block-quantized", ty.name()),
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }

    /// Activations that Q8_0 and Q8_K represent exactly: integers with 127 the largest
    /// magnitude in every block, so the scale is exactly ±1.
    fn exact_activations(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                if i % QK == 0 {
                    127.0
                } else {
                    ((i * 37) % 201) as f32 - 100.0
                }
            })
            .collect()
    }

    fn plain_dot(w: &[f32], x: &[f32]) -> f32 {
        w.iter().zip(x).map(|(a, b)| a * b).sum()
    }

    #[test]
    fn q4_0_blocks_decode_and_dot() {
        // Two blocks: d = 0.5 then d = -2; nibble j of block b is (j + b) % 16.
        let mut row = Vec::new();
        for (b, d) in [(0usize, 0.5f32), (1, -2.0)] {
            row.extend(f16_bytes(d));
            for j in 0..16 {
                let lo = ((j + b) % 16) as u8;
                let hi = ((j + 16 + b) % 16) as u8;
                row.push(lo | (hi << 4));
            }
        }
        let mut w = vec![0f32; 64];
        dequantize(DType::Q4_0, &row, &mut w);
        assert_eq!(w[0], 0.5 * -8.0);
        assert_eq!(w[15], 0.5 * 7.0);
        assert_eq!(w[16], 0.5 * -8.0, "high nibbles hold values 16..32");
        assert_eq!(w[32], -2.0 * -7.0);
        let x = exact_activations(64);
        let a = quantize_q8_0(&x);
        assert_eq!(a.d, [1.0, 1.0]);
        assert_eq!(dot(DType::Q4_0, &row, &a), plain_dot(&w, &x));
    }

    #[test]
    fn q8_0_blocks_decode_and_dot() {
        let mut row = f16_bytes(0.25).to_vec();
        row.extend((0..32).map(|j| (j as i8 * 4 - 64) as u8));
        let mut w = vec![0f32; 32];
        dequantize(DType::Q8_0, &row, &mut w);
        assert_eq!(w[0], -16.0);
        assert_eq!(w[31], 0.25 * 60.0);
        let x = exact_activations(32);
        assert_eq!(
            dot(DType::Q8_0, &row, &quantize_q8_0(&x)),
            plain_dot(&w, &x)
        );
    }

    #[test]
    fn q4_k_super_blocks_decode_and_dot() {
        // d = 0.5, dmin = 0.25; sub-block s has scale 3 + 7s and min 2s + 1 (scales above 15
        // and mins above 15 need the packed high bits).
        let mut row = Vec::new();
        row.extend(f16_bytes(0.5));
        row.extend(f16_bytes(0.25));
        let sc: Vec<u8> = (0..8).map(|s| 3 + 7 * s as u8).collect();
        let mn: Vec<u8> = (0..8).map(|s| 2 * s as u8 + 1).collect();
        let mut packed = [0u8; 12];
        for s in 0..4 {
            packed[s] = sc[s] | ((sc[s + 4] >> 4) << 6);
            packed[s + 4] = mn[s] | ((mn[s + 4] >> 4) << 6);
            packed[s + 8] = (sc[s + 4] & 0x0f) | ((mn[s + 4] & 0x0f) << 4);
        }
        row.extend(packed);
        let nib = |i: usize| ((i * 5 + i / 32) % 16) as u8;
        for c in 0..4 {
            for j in 0..32 {
                row.push(nib(64 * c + j) | (nib(64 * c + 32 + j) << 4));
            }
        }
        assert_eq!(row.len(), DType::Q4K.size());
        let mut w = vec![0f32; 256];
        dequantize(DType::Q4K, &row, &mut w);
        for (i, &v) in w.iter().enumerate() {
            let s = i / 32;
            let want = 0.5 * f32::from(sc[s]) * f32::from(nib(i)) - 0.25 * f32::from(mn[s]);
            assert_eq!(v, want, "value {i}");
        }
        let x = exact_activations(256);
        let a = quantize_q8_k(&x);
        assert_eq!(a.d, [-1.0]);
        assert_eq!(dot(DType::Q4K, &row, &a), plain_dot(&w, &x));
    }

    /// Decoding and the dot product agree on activations the 8-bit quantizers keep exactly,
    /// and `spot` values (index, want) decode as the layout says.
    fn check_type(ty: DType, row: &[u8], spot: &[(usize, f32)]) {
        assert_eq!(row.len() % ty.size(), 0);
        let n = row.len() / ty.size() * ty.block();
        let mut w = vec![0f32; n];
        dequantize(ty, row, &mut w);
        for &(i, want) in spot {
            assert_eq!(w[i], want, "{} value {i}", ty.name());
        }
        let x = exact_activations(n);
        assert_eq!(
            dot(ty, row, &quantize_for(ty, &x)),
            plain_dot(&w, &x),
            "{}",
            ty.name()
        );
    }

    #[test]
    fn q4_1_and_q5_0_blocks_decode_and_dot() {
        // Q4_1: d = 0.5, m = -3; nibble j = (3j) % 16.
        let mut row = f16_bytes(0.5).to_vec();
        row.extend(f16_bytes(-3.0));
        row.extend((0..16).map(|j| ((3 * j) % 16) as u8 | ((((3 * (j + 16)) % 16) as u8) << 4)));
        check_type(
            DType::Q4_1,
            &row,
            &[
                (1, 0.5 * 3.0 - 3.0),
                (17, 0.5 * 3.0 - 3.0),
                (5, 0.5 * 15.0 - 3.0),
            ],
        );
        // Q5_0: d = 2, fifth bits set for values 1 and 17 (bits 1 and 17 of qh), nibbles 7.
        let mut row = f16_bytes(2.0).to_vec();
        row.extend(((1u32 << 1) | (1u32 << 17)).to_le_bytes());
        row.extend([0x77u8; 16]);
        check_type(
            DType::Q5_0,
            &row,
            &[
                (0, 2.0 * (7.0 - 16.0)),
                (1, 2.0 * 7.0),
                (17, 2.0 * 7.0),
                (16, -18.0),
            ],
        );
        // Q8_1's s is d·Σq in f16: with exact activations d = 1.
        let a = quantize_q8_1(&exact_activations(32));
        assert_eq!(a.s[0], a.sums32[0] as f32);
    }

    #[test]
    fn q5_k_and_q6_k_super_blocks_decode_and_dot() {
        // Q5_K: d = 0.5, dmin = 1; every scale 2 and min 1 (6-bit fields of sub-blocks 0..4 and
        // the packed ones of 4..8); nibbles 3; fifth bit set for sub-block s at l = s.
        let mut row = f16_bytes(0.5).to_vec();
        row.extend(f16_bytes(1.0));
        row.extend([2, 2, 2, 2, 1, 1, 1, 1, 0x12, 0x12, 0x12, 0x12]);
        row.extend((0..32).map(|l| if l < 8 { 1u8 << l } else { 0 }));
        row.extend([0x33u8; 128]);
        assert_eq!(row.len(), DType::Q5K.size());
        let (plain, high) = (0.5 * 2.0 * 3.0 - 1.0, 0.5 * 2.0 * 19.0 - 1.0);
        check_type(
            DType::Q5K,
            &row,
            &[
                (0, high),
                (1, plain),
                (32 + 1, high),
                (7 * 32 + 7, high),
                (7 * 32 + 6, plain),
            ],
        );
        // Q6_K: ql low nibbles 5 / high 9, qh = 0b10_01_00_11 (top bits 3, 0, 1, 2 for the four
        // quarters of each half), scales 1..=16 with the odd ones negative, d = 0.25.
        let mut row = vec![0x95u8; 128];
        row.extend([0b1001_0011u8; 64]);
        row.extend((1..=16).map(|s: i8| if s % 2 == 1 { -s } else { s } as u8));
        row.extend(f16_bytes(0.25));
        assert_eq!(row.len(), DType::Q6K.size());
        let v = |low: i32, high: i32, scale: i32| 0.25 * (scale * ((low | high << 4) - 32)) as f32;
        check_type(
            DType::Q6K,
            &row,
            &[
                (0, v(5, 3, -1)),
                (40, v(5, 0, -3)),
                (70, v(9, 1, -5)),
                (100, v(9, 2, -7)),
                (128 + 100, v(9, 2, -15)),
            ],
        );
    }

    #[test]
    fn activation_quantization_rounds_like_ggml() {
        // A block of zeros has scale 0 and all-zero values.
        let a = quantize_q8_0(&[0.0; 32]);
        assert_eq!((a.d[0], a.q[0]), (0.0, 0));
        // Ties go to even: 127/254 * x with x = 1 → 0.5 → 0; x = 3 → 1.5 → 2.
        let mut x = vec![0f32; 32];
        x[0] = 254.0;
        x[1] = 1.0;
        x[2] = 3.0;
        let a = quantize_q8_0(&x);
        assert_eq!(&a.q[..3], &[127, 0, 2]);
        assert_eq!(a.sums32, [129]);
        // Q8_K: the largest magnitude maps to -127 (its sign flipped), d = -max/127.
        let mut x = vec![1.0f32; 256];
        x[7] = -254.0;
        let a = quantize_q8_k(&x);
        assert_eq!(a.q[7], -127);
        assert_eq!(a.q[0], 0, "-0.5 rounds to even");
        assert_eq!(a.d, [2.0]);
    }
}
