//! Ops that run on the host: type-converting copies (`DUP`, `CPY`, `CONT`).
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

    /// The tensor read and the tensor written.
    pub fn tensors(&self) -> (&Tensor, &Tensor) {
        match self {
            HostOp::Convert { src, dst } => (src, dst),
        }
    }

    /// Runs the op. `src` holds the source tensor's bytes from its first element (`src.bytes`
    /// long), `dst` the destination's.
    pub fn run(&self, src_bytes: &[u8], dst_bytes: &mut [u8]) -> Result<(), String> {
        let HostOp::Convert { src, dst } = self;
        if (src_bytes.len() as u64) < src.bytes || (dst_bytes.len() as u64) < dst.bytes {
            return Err("tensor memory is smaller than the tensor".into());
        }
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
            .run(&input, &mut out)
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
            .run(&input, &mut out)
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
            .run(&input, &mut out)
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
        assert!(op.run(&[0u8; 8], &mut [0u8; 16]).is_err());
    }
}
