//! Ops that run on the host: type-converting copies (`DUP`, `CPY`, `CONT`), row gathers
//! (`GET_ROWS`) and row scatters (`SET_ROWS`, the KV cache update).
//!
//! The NPU's memory is system memory mapped into the host, so these read and write the tensors in
//! place. Rounding matches ggml's reference conversions: f16 round-to-nearest-even (IEEE), bf16
//! round-to-nearest-even with NaNs kept quiet (ggml's `fp32_to_bf16`).

use half::{bf16, f16};

use super::tensor::{DType, Tensor};

/// A host-side op and the tensors it touches.
#[derive(Debug, Clone, PartialEq)]
pub enum HostOp {
    /// Copy `src` into `dst` element by element in logical (row-major) order, converting types.
    Convert { src: Tensor, dst: Tensor },
    /// `dst[:, i10, i11, i12] = src[:, idx[i10, i11, i12], i11, i12]` (ggml's GET_ROWS).
    GetRows {
        src: Tensor,
        idx: Tensor,
        dst: Tensor,
    },
    /// `dst[:, idx[i, i02 % n11, i03 % n12], i02, i03] = src[:, i, i02, i03]` (ggml's SET_ROWS).
    SetRows {
        src: Tensor,
        idx: Tensor,
        dst: Tensor,
    },
}

impl HostOp {
    /// A converting copy, if the types and element counts allow it.
    pub fn convert(src: &Tensor, dst: &Tensor) -> Result<HostOp, String> {
        let convertible = (src.dtype.is_float() && dst.dtype.is_float())
            || (src.dtype == dst.dtype && src.dtype.size().is_some());
        if !convertible {
            return Err(format!(
                "copies from {} to {} are not supported",
                src.dtype, dst.dtype
            ));
        }
        if src.nelements() != dst.nelements() {
            return Err(format!(
                "copy of {} elements into {}",
                src.nelements(),
                dst.nelements()
            ));
        }
        Ok(HostOp::Convert {
            src: src.clone(),
            dst: dst.clone(),
        })
    }

    /// A GET_ROWS of float rows by i32 indices into a float output.
    pub fn get_rows(src: &Tensor, idx: &Tensor, dst: &Tensor) -> Result<HostOp, String> {
        if !src.dtype.is_float() || !dst.dtype.is_float() || idx.dtype != DType::I32 {
            return Err(format!(
                "GET_ROWS of {} rows by {} indices into {} is not supported",
                src.dtype, idx.dtype, dst.dtype
            ));
        }
        let shape_ok = dst.ne == [src.ne[0], idx.ne[0], idx.ne[1], idx.ne[2]]
            && src.ne[2] == idx.ne[1]
            && src.ne[3] == idx.ne[2];
        if !shape_ok {
            return Err("GET_ROWS shapes do not agree".into());
        }
        Ok(HostOp::GetRows {
            src: src.clone(),
            idx: idx.clone(),
            dst: dst.clone(),
        })
    }

    /// A SET_ROWS of f32 rows into a float tensor by i32 or i64 indices.
    pub fn set_rows(src: &Tensor, idx: &Tensor, dst: &Tensor) -> Result<HostOp, String> {
        if !src.dtype.is_float()
            || !dst.dtype.is_float()
            || !matches!(idx.dtype, DType::I32 | DType::I64)
        {
            return Err(format!(
                "SET_ROWS of {} rows by {} indices into {} is not supported",
                src.dtype, idx.dtype, dst.dtype
            ));
        }
        let shape_ok = src.ne[0] == dst.ne[0]
            && src.ne[2] == dst.ne[2]
            && src.ne[3] == dst.ne[3]
            && idx.ne[0] == src.ne[1]
            && idx.ne[1] > 0
            && idx.ne[2] > 0
            && src.ne[2] % idx.ne[1] == 0
            && src.ne[3] % idx.ne[2] == 0;
        if !shape_ok {
            return Err("SET_ROWS shapes do not agree".into());
        }
        Ok(HostOp::SetRows {
            src: src.clone(),
            idx: idx.clone(),
            dst: dst.clone(),
        })
    }

    /// The tensors read (in the order [`HostOp::run`] takes their bytes) and the one written.
    pub fn tensors(&self) -> (Vec<&Tensor>, &Tensor) {
        match self {
            HostOp::Convert { src, dst } => (vec![src], dst),
            HostOp::GetRows { src, idx, dst } | HostOp::SetRows { src, idx, dst } => {
                (vec![src, idx], dst)
            }
        }
    }

    /// Runs the op. `inputs` hold the bytes of the tensors read (as [`HostOp::tensors`] lists
    /// them), each from its first element; `dst` the destination's.
    pub fn run(&self, inputs: &[Vec<u8>], dst_bytes: &mut [u8]) -> Result<(), String> {
        let (tensors, dst) = self.tensors();
        let short = inputs.len() != tensors.len()
            || inputs
                .iter()
                .zip(&tensors)
                .any(|(b, t)| (b.len() as u64) < t.bytes)
            || (dst_bytes.len() as u64) < dst.bytes;
        if short {
            return Err("tensor memory is smaller than the tensor".into());
        }
        match self {
            HostOp::Convert { src, dst } => convert(src, &inputs[0], dst, dst_bytes),
            HostOp::GetRows { src, idx, dst } => {
                let index = |i: [i64; 4]| read_index(idx, &inputs[1], i);
                for i12 in 0..idx.ne[2] {
                    for i11 in 0..idx.ne[1] {
                        for i10 in 0..idx.ne[0] {
                            let row = index([i10, i11, i12, 0])?;
                            if !(0..src.ne[1]).contains(&row) {
                                return Err(format!("GET_ROWS index {row} out of range"));
                            }
                            copy_row(
                                src,
                                &inputs[0],
                                [row, i11, i12],
                                dst,
                                dst_bytes,
                                [i10, i11, i12],
                            )?;
                        }
                    }
                }
                Ok(())
            }
            HostOp::SetRows { src, idx, dst } => {
                let index = |i: [i64; 4]| read_index(idx, &inputs[1], i);
                for i03 in 0..src.ne[3] {
                    for i02 in 0..src.ne[2] {
                        for i in 0..src.ne[1] {
                            let row = index([i, i02 % idx.ne[1], i03 % idx.ne[2], 0])?;
                            if !(0..dst.ne[1]).contains(&row) {
                                return Err(format!("SET_ROWS index {row} out of range"));
                            }
                            copy_row(
                                src,
                                &inputs[0],
                                [i, i02, i03],
                                dst,
                                dst_bytes,
                                [row, i02, i03],
                            )?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

/// Reads the index at position `i` of an i32 or i64 tensor.
fn read_index(idx: &Tensor, bytes: &[u8], i: [i64; 4]) -> Result<i64, String> {
    let off = (0..4).map(|d| i[d] as u64 * idx.nb[d]).sum::<u64>() as usize;
    let b = |n: usize| bytes.get(off..off + n).ok_or("index out of its tensor");
    Ok(match idx.dtype {
        DType::I64 => i64::from_le_bytes(b(8)?.try_into().expect("8 bytes")),
        _ => i64::from(i32::from_le_bytes(b(4)?.try_into().expect("4 bytes"))),
    })
}

/// Copies row `[i1, i2, i3]` of `src` into row `[j1, j2, j3]` of `dst`, converting types.
fn copy_row(
    src: &Tensor,
    src_bytes: &[u8],
    [i1, i2, i3]: [i64; 3],
    dst: &Tensor,
    dst_bytes: &mut [u8],
    [j1, j2, j3]: [i64; 3],
) -> Result<(), String> {
    let (ss, ds) = (src.dtype.size().unwrap_or(0), dst.dtype.size().unwrap_or(0));
    let from = i1 as u64 * src.nb[1] + i2 as u64 * src.nb[2] + i3 as u64 * src.nb[3];
    let to = j1 as u64 * dst.nb[1] + j2 as u64 * dst.nb[2] + j3 as u64 * dst.nb[3];
    for i0 in 0..src.ne[0] as u64 {
        let so = (from + i0 * src.nb[0]) as usize;
        let d_o = (to + i0 * dst.nb[0]) as usize;
        let a = src_bytes
            .get(so..so + ss as usize)
            .ok_or("row out of its tensor")?;
        let b = dst_bytes
            .get_mut(d_o..d_o + ds as usize)
            .ok_or("row out of its tensor")?;
        if src.dtype == dst.dtype {
            b.copy_from_slice(a);
        } else {
            store(dst.dtype, b, load(src.dtype, a));
        }
    }
    Ok(())
}

/// The converting copy of `src` into `dst` in logical order.
fn convert(
    src: &Tensor,
    src_bytes: &[u8],
    dst: &Tensor,
    dst_bytes: &mut [u8],
) -> Result<(), String> {
    {
        if src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous() {
            let n = src.bytes as usize;
            dst_bytes[..n].copy_from_slice(&src_bytes[..n]);
            return Ok(());
        }
        let (ss, ds) = (src.dtype.size(), dst.dtype.size());
        let (ss, ds) = (ss.unwrap_or(0) as usize, ds.unwrap_or(0) as usize);
        for (so, d_o) in src.element_offsets().zip(dst.element_offsets()) {
            let (so, d_o) = (so as usize, d_o as usize);
            let from = src_bytes
                .get(so..so + ss)
                .ok_or("source element out of range")?;
            let to = dst_bytes
                .get_mut(d_o..d_o + ds)
                .ok_or("destination element out of range")?;
            if src.dtype == dst.dtype {
                to.copy_from_slice(from);
            } else {
                store(dst.dtype, to, load(src.dtype, from));
            }
        }
        Ok(())
    }
}

fn load(dtype: DType, b: &[u8]) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        _ => unreachable!("only float types are converted"),
    }
}

fn store(dtype: DType, b: &mut [u8], v: f32) {
    match dtype {
        DType::F32 => b.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => b.copy_from_slice(&f16::from_f32(v).to_le_bytes()),
        DType::Bf16 => b.copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
        _ => unreachable!("only float types are converted"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tensor::test_util::tensor;
    use super::*;

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn converts_f32_to_f16_and_bf16_with_round_to_nearest_even() {
        let src = tensor(DType::F32, [4, 1, 1, 1], 0);
        let input = bytes_f32(&[1.0, 1.0 + 1.0 / 2048.0, f32::NAN, 65520.0]);
        let dst = tensor(DType::F16, [4, 1, 1, 1], 0);
        let mut out = vec![0u8; 8];
        HostOp::convert(&src, &dst)
            .unwrap()
            .run(std::slice::from_ref(&input), &mut out)
            .unwrap();
        let h: Vec<u16> = out
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(h[0], 0x3c00);
        assert_eq!(h[1], 0x3c00, "ties go to even");
        assert!(f16::from_bits(h[2]).is_nan());
        assert_eq!(h[3], 0x7c00, "65520 rounds to infinity");

        let dst = tensor(DType::Bf16, [4, 1, 1, 1], 0);
        let input = bytes_f32(&[
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            -2.0,
            0.0,
        ]);
        HostOp::convert(&src, &dst)
            .unwrap()
            .run(std::slice::from_ref(&input), &mut out)
            .unwrap();
        let h: Vec<u16> = out
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(h, [0x3f80, 0x3f82, 0xc000, 0]);
    }

    #[test]
    fn copies_a_transposed_view_into_a_contiguous_tensor() {
        // src: a 2x3 f32 matrix viewed transposed (3x2), dst: contiguous 3x2.
        let mut src = tensor(DType::F32, [3, 2, 1, 1], 0);
        src.nb = [8, 4, 24, 24];
        let dst = tensor(DType::F32, [3, 2, 1, 1], 0);
        let input = bytes_f32(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let mut out = vec![0u8; 24];
        HostOp::convert(&src, &dst)
            .unwrap()
            .run(std::slice::from_ref(&input), &mut out)
            .unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
    }

    #[test]
    fn refuses_what_it_cannot_convert() {
        let f = tensor(DType::F32, [4, 1, 1, 1], 0);
        let i = tensor(DType::I32, [4, 1, 1, 1], 0);
        assert!(HostOp::convert(&f, &i).is_err());
        assert!(HostOp::convert(&i, &i).is_ok());
        assert!(HostOp::convert(&f, &tensor(DType::F32, [5, 1, 1, 1], 0)).is_err());
        let op = HostOp::convert(&f, &f).unwrap();
        assert!(op.run(&[vec![0u8; 8]], &mut [0u8; 16]).is_err());
    }

    #[test]
    fn get_rows_gathers_and_set_rows_scatters_with_conversion() {
        // src: 3 rows of 2 f32; gather rows [2, 0] into f32.
        let src = tensor(DType::F32, [2, 3, 1, 1], 0);
        let idx = tensor(DType::I32, [2, 1, 1, 1], 0);
        let dst = tensor(DType::F32, [2, 2, 1, 1], 0);
        let rows = bytes_f32(&[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
        let picks: Vec<u8> = [2i32, 0].iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut out = vec![0u8; 16];
        let op = HostOp::get_rows(&src, &idx, &dst).unwrap();
        op.run(&[rows, picks], &mut out).unwrap();
        assert_eq!(out, bytes_f32(&[20.0, 21.0, 0.0, 1.0]));

        // Scatter 2 f32 rows into a 3-row f16 tensor at i64 rows [1, 2]; row 0 stays.
        let src = tensor(DType::F32, [2, 2, 1, 1], 0);
        let idx = tensor(DType::I64, [2, 1, 1, 1], 0);
        let dst = tensor(DType::F16, [2, 3, 1, 1], 0);
        let at: Vec<u8> = [1i64, 2].iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut out = vec![0xffu8; 12];
        let op = HostOp::set_rows(&src, &idx, &dst).unwrap();
        op.run(&[bytes_f32(&[1.0, 2.0, 3.0, 4.0]), at], &mut out)
            .unwrap();
        let h: Vec<f32> = out
            .chunks(2)
            .skip(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        assert_eq!(h, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(&out[..4], &[0xff; 4]);

        // An index out of range is an error, not a wild write.
        let bad: Vec<u8> = [1i64, 3].iter().flat_map(|i| i.to_le_bytes()).collect();
        let err = op.run(&[bytes_f32(&[0.0; 4]), bad], &mut out).unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        // Quantized rows are not gathered here.
        let mut q = tensor(DType::F32, [32, 3, 1, 1], 0);
        q.dtype = DType::Other("q4_0");
        let idx = tensor(DType::I32, [2, 1, 1, 1], 0);
        assert!(HostOp::get_rows(&q, &idx, &tensor(DType::F32, [32, 2, 1, 1], 0)).is_err());
    }
}
