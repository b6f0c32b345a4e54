//! Ops that run on the host: type-converting copies (`DUP`, `CPY`, `CONT`), row gathers
//! (`GET_ROWS`) and row scatters (`SET_ROWS`, the KV cache update).
//!
//! The NPU's memory is system memory mapped into the host, so these read and write the tensors in
//! place. Rounding matches ggml's reference conversions: f16 round-to-nearest-even (IEEE), bf16
//! round-to-nearest-even with NaNs kept quiet (ggml's `fp32_to_bf16`).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::tensor::{DType, QuantType, Tensor};

/// Converts whole blocks of a quantized type. `ffi` implements it with ggml's own routines
/// (`to_float`, `from_float_ref`), so results match ggml's.
pub trait Codec {
    /// Decodes the blocks in `src` into `out.len()` floats.
    fn decode(&self, ty: QuantType, src: &[u8], out: &mut [f32]) -> Result<(), String>;
    /// Encodes `src` into whole blocks in `out`.
    fn encode(&self, ty: QuantType, src: &[f32], out: &mut [u8]) -> Result<(), String>;
}

/// Whether values can be read from `t` as f32 (float types, or quantized ones ggml decodes).
fn readable(t: &Tensor) -> bool {
    t.dtype.is_float() || matches!(t.dtype, DType::Quant(q) if q.decode && t.has_whole_blocks())
}

/// Whether f32 values can be written into `t` (float types, or quantized ones ggml encodes).
fn writable(t: &Tensor) -> bool {
    t.dtype.is_float() || matches!(t.dtype, DType::Quant(q) if q.encode && t.has_whole_blocks())
}

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
        // bf16 into a quantized type is declined: ggml-cpu quantizes it with its own SIMD
        // routine, whose rounding differs from ggml's reference quantizer (the one this backend
        // can call) by more than test-backend-ops tolerates for these cases.
        let bf16_to_quant = src.dtype == DType::Bf16 && matches!(dst.dtype, DType::Quant(_));
        let convertible = (readable(src) && writable(dst) && !bf16_to_quant)
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
        if !readable(src) || !dst.dtype.is_float() || idx.dtype != DType::I32 {
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
        if !src.dtype.is_float() || !writable(dst) || !matches!(idx.dtype, DType::I32 | DType::I64)
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
    /// them), each from its first element; `dst` the destination's. An input may be the
    /// tensor's own memory as long as it does not overlap `dst_bytes` (the caller copies those
    /// that do).
    pub fn run(
        &self,
        inputs: &[&[u8]],
        dst_bytes: &mut [u8],
        codec: &dyn Codec,
    ) -> Result<(), String> {
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
            HostOp::Convert { src, dst } => convert(src, inputs[0], dst, dst_bytes, codec),
            HostOp::GetRows { src, idx, dst } => {
                let index = |i: [i64; 4]| read_index(idx, inputs[1], i);
                for i12 in 0..idx.ne[2] {
                    for i11 in 0..idx.ne[1] {
                        for i10 in 0..idx.ne[0] {
                            let row = index([i10, i11, i12, 0])?;
                            if !(0..src.ne[1]).contains(&row) {
                                return Err(format!("GET_ROWS index {row} out of range"));
                            }
                            copy_row(
                                codec,
                                src,
                                inputs[0],
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
                let index = |i: [i64; 4]| read_index(idx, inputs[1], i);
                for i03 in 0..src.ne[3] {
                    for i02 in 0..src.ne[2] {
                        for i in 0..src.ne[1] {
                            let row = index([i, i02 % idx.ne[1], i03 % idx.ne[2], 0])?;
                            if !(0..dst.ne[1]).contains(&row) {
                                return Err(format!("SET_ROWS index {row} out of range"));
                            }
                            copy_row(
                                codec,
                                src,
                                inputs[0],
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
    codec: &dyn Codec,
    src: &Tensor,
    src_bytes: &[u8],
    [i1, i2, i3]: [i64; 3],
    dst: &Tensor,
    dst_bytes: &mut [u8],
    [j1, j2, j3]: [i64; 3],
) -> Result<(), String> {
    let from = i1 as u64 * src.nb[1] + i2 as u64 * src.nb[2] + i3 as u64 * src.nb[3];
    let to = j1 as u64 * dst.nb[1] + j2 as u64 * dst.nb[2] + j3 as u64 * dst.nb[3];
    if matches!(src.dtype, DType::Quant(_)) || matches!(dst.dtype, DType::Quant(_)) {
        let row = read_row(codec, src, src_bytes, from)?;
        return write_row(codec, dst, dst_bytes, to, &row);
    }
    copy_float_row(
        src.dtype,
        src_bytes,
        (from, src.nb[0]),
        dst.dtype,
        dst_bytes,
        (to, dst.nb[0]),
        src.ne[0].max(0) as usize,
    )
    .ok_or_else(|| "row out of its tensor".into())
}

/// Float values per step of [`convert_dense`]: the size of its stack buffer.
const CHUNK: usize = 256;

/// Decodes the dense values of float type `dtype` in `src` into `out` (as many as it holds).
fn decode_f32(dtype: DType, src: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            let mut h = [f16::ZERO; CHUNK];
            for (o, b) in out.chunks_mut(CHUNK).zip(src.chunks(2 * CHUNK)) {
                let h = &mut h[..o.len()];
                for (x, b) in h.iter_mut().zip(b.chunks_exact(2)) {
                    *x = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
                // half's slice conversion uses F16C where the CPU has it (same rounding).
                h.convert_to_f32_slice(o);
            }
        }
        DType::Bf16 => {
            for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        _ => unreachable!("only float types are converted"),
    }
}

/// Encodes `vals` as dense values of float type `dtype` into `out`.
fn encode_f32(dtype: DType, vals: &[f32], out: &mut [u8]) {
    match dtype {
        DType::F32 => {
            for (v, b) in vals.iter().zip(out.chunks_exact_mut(4)) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            let mut h = [f16::ZERO; CHUNK];
            for (v, b) in vals.chunks(CHUNK).zip(out.chunks_mut(2 * CHUNK)) {
                let h = &mut h[..v.len()];
                h.convert_from_f32_slice(v);
                for (x, b) in h.iter().zip(b.chunks_exact_mut(2)) {
                    b.copy_from_slice(&x.to_bits().to_le_bytes());
                }
            }
        }
        DType::Bf16 => {
            for (v, b) in vals.iter().zip(out.chunks_exact_mut(2)) {
                b.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        _ => unreachable!("only float types are converted"),
    }
}

/// Converts dense float values: `src` holds them as `from`, `dst` receives them as `to` (the
/// two slices hold the same number of values).
fn convert_dense(from: DType, src: &[u8], to: DType, dst: &mut [u8]) {
    if from == to {
        dst.copy_from_slice(src);
        return;
    }
    let (fs, ts) = (elem_size(from), elem_size(to));
    let mut buf = [0f32; CHUNK];
    for (s, d) in src.chunks(CHUNK * fs).zip(dst.chunks_mut(CHUNK * ts)) {
        let vals = &mut buf[..s.len() / fs];
        decode_f32(from, s, vals);
        encode_f32(to, vals, d);
    }
}

fn elem_size(dtype: DType) -> usize {
    dtype.size().unwrap_or(0) as usize
}

/// The byte range of `n` elements of `size` bytes from `at`, `stride` apart, if it lies in a
/// slice of `len` bytes.
fn span(at: u64, stride: u64, n: usize, size: usize, len: usize) -> Option<std::ops::Range<usize>> {
    if n == 0 {
        return Some(0..0);
    }
    let end = (n as u64 - 1)
        .checked_mul(stride)?
        .checked_add(at)?
        .checked_add(size as u64)?;
    (end <= len as u64).then_some(at as usize..end as usize)
}

/// Copies `n` float values from `(offset, element stride)` of `src` to `(offset, element
/// stride)` of `dst`, converting types; `None` when a value lies outside its slice. Dense rows
/// are converted as slices; a one-element row (the transposed V cache's SET_ROWS) is one load
/// and one store; other strided rows are gathered and scattered through a small buffer.
fn copy_float_row(
    from: DType,
    src: &[u8],
    (s_at, s_stride): (u64, u64),
    to: DType,
    dst: &mut [u8],
    (d_at, d_stride): (u64, u64),
    n: usize,
) -> Option<()> {
    let (ss, ds) = (elem_size(from), elem_size(to));
    let s = span(s_at, s_stride, n, ss, src.len())?;
    let d = span(d_at, d_stride, n, ds, dst.len())?;
    if n == 1 {
        let (a, b) = (&src[s], &mut dst[d]);
        if from == to {
            b.copy_from_slice(a);
        } else {
            store(to, b, load(from, a));
        }
        return Some(());
    }
    match (s_stride == ss as u64, d_stride == ds as u64) {
        (true, true) => convert_dense(from, &src[s], to, &mut dst[d]),
        (s_dense, d_dense) => {
            // Gather CHUNK values into dense bytes, convert, scatter (8 bytes: the widest
            // element a same-type copy moves, i64).
            let mut a = [0u8; 8 * CHUNK];
            let mut b = [0u8; 8 * CHUNK];
            for first in (0..n).step_by(CHUNK) {
                let k = CHUNK.min(n - first);
                let s0 = s.start + first * s_stride as usize;
                let d0 = d.start + first * d_stride as usize;
                let a = if s_dense {
                    &src[s0..s0 + k * ss]
                } else {
                    for i in 0..k {
                        let o = s0 + i * s_stride as usize;
                        a[i * ss..(i + 1) * ss].copy_from_slice(&src[o..o + ss]);
                    }
                    &a[..k * ss]
                };
                if d_dense {
                    convert_dense(from, a, to, &mut dst[d0..d0 + k * ds]);
                } else {
                    convert_dense(from, a, to, &mut b[..k * ds]);
                    for i in 0..k {
                        let o = d0 + i * d_stride as usize;
                        dst[o..o + ds].copy_from_slice(&b[i * ds..(i + 1) * ds]);
                    }
                }
            }
        }
    }
    Some(())
}

/// The `ne[0]` values of the row at byte offset `at` of `t`, as f32.
fn read_row(codec: &dyn Codec, t: &Tensor, bytes: &[u8], at: u64) -> Result<Vec<f32>, String> {
    let n = t.ne[0] as usize;
    let mut row = vec![0f32; n];
    match t.dtype {
        DType::Quant(q) => {
            let len = (t.ne[0] as u64 / q.block * q.block_bytes) as usize;
            let src = bytes
                .get(at as usize..at as usize + len)
                .ok_or("row out of its tensor")?;
            codec.decode(q, src, &mut row)?;
        }
        dtype => {
            let size = dtype.size().unwrap_or(0) as usize;
            for (i0, v) in row.iter_mut().enumerate() {
                let off = (at + i0 as u64 * t.nb[0]) as usize;
                *v = load(
                    dtype,
                    bytes.get(off..off + size).ok_or("row out of its tensor")?,
                );
            }
        }
    }
    Ok(row)
}

/// Writes `row` (f32 values) as the row at byte offset `at` of `t`.
fn write_row(
    codec: &dyn Codec,
    t: &Tensor,
    bytes: &mut [u8],
    at: u64,
    row: &[f32],
) -> Result<(), String> {
    match t.dtype {
        DType::Quant(q) => {
            let len = (row.len() as u64 / q.block * q.block_bytes) as usize;
            let dst = bytes
                .get_mut(at as usize..at as usize + len)
                .ok_or("row out of its tensor")?;
            if q.name == "q8_0" && q.block == Q8_0_BLOCK as u64 && q.block_bytes == 34 {
                encode_q8_0(row, dst);
                return Ok(());
            }
            codec.encode(q, row, dst)
        }
        dtype => {
            let size = dtype.size().unwrap_or(0) as usize;
            for (i0, &v) in row.iter().enumerate() {
                let off = (at + i0 as u64 * t.nb[0]) as usize;
                store(
                    dtype,
                    bytes
                        .get_mut(off..off + size)
                        .ok_or("row out of its tensor")?,
                    v,
                );
            }
            Ok(())
        }
    }
}

/// Values per Q8_0 block.
const Q8_0_BLOCK: usize = 32;

/// Encodes `src` as Q8_0 blocks (f16 scale d = max|x| / 127, then 32 signed bytes) the way
/// ggml-cpu's own quantizer does on x86, the one the CPU backend uses for copies into Q8_0:
/// q = x · (127 / max|x|) rounded to nearest, ties to even. ggml's reference quantizer (the one
/// the codec calls) computes x / d and rounds ties away from zero; the two differ by one step
/// on values landing on a tie, which sources with few mantissa bits (f16) make frequent enough
/// to fail test-backend-ops' tolerance for CPY f16 → q8_0 about one run in three.
fn encode_q8_0(src: &[f32], out: &mut [u8]) {
    for (x, block) in src.chunks(Q8_0_BLOCK).zip(out.chunks_mut(2 + Q8_0_BLOCK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        block[..2].copy_from_slice(&f16::from_f32(amax / 127.0).to_le_bytes());
        for (q, v) in block[2..].iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8 as u8;
        }
    }
}

/// Byte offsets of the rows of `t`, in logical order.
fn row_offsets(t: &Tensor) -> impl Iterator<Item = u64> + '_ {
    let [_, n1, n2, n3] = t.ne.map(|n| n.max(0) as u64);
    (0..n3).flat_map(move |i3| {
        (0..n2)
            .flat_map(move |i2| (0..n1).map(move |i1| i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]))
    })
}

/// A copy between two tensors of one quantized type: the blocks are moved as they are (no
/// re-encoding, which would lose precision), rows in logical order on both sides.
fn copy_blocks(
    src: &Tensor,
    src_bytes: &[u8],
    dst: &Tensor,
    dst_bytes: &mut [u8],
) -> Result<(), String> {
    let row_bytes = |t: &Tensor| match t.dtype {
        DType::Quant(q) => (t.ne[0] as u64 / q.block * q.block_bytes) as usize,
        _ => 0,
    };
    let mut blocks = Vec::with_capacity(src.bytes as usize);
    let n = row_bytes(src);
    for at in row_offsets(src) {
        let at = at as usize;
        blocks.extend_from_slice(src_bytes.get(at..at + n).ok_or("row out of its tensor")?);
    }
    let m = row_bytes(dst);
    for (r, at) in row_offsets(dst).enumerate() {
        let at = at as usize;
        let row = blocks
            .get(r * m..(r + 1) * m)
            .ok_or("element counts differ")?;
        dst_bytes
            .get_mut(at..at + m)
            .ok_or("row out of its tensor")?
            .copy_from_slice(row);
    }
    Ok(())
}

/// A copy where either side is quantized: every value read as f32 in logical order, then
/// written in logical order (the shapes may differ; the element counts agree).
fn convert_via_f32(
    codec: &dyn Codec,
    src: &Tensor,
    src_bytes: &[u8],
    dst: &Tensor,
    dst_bytes: &mut [u8],
) -> Result<(), String> {
    let mut values = Vec::with_capacity(src.nelements().max(0) as usize);
    for at in row_offsets(src) {
        values.extend(read_row(codec, src, src_bytes, at)?);
    }
    let n0 = dst.ne[0].max(0) as usize;
    for (r, at) in row_offsets(dst).enumerate() {
        let row = values
            .get(r * n0..(r + 1) * n0)
            .ok_or("element counts differ")?;
        write_row(codec, dst, dst_bytes, at, row)?;
    }
    Ok(())
}

/// The converting copy of `src` into `dst` in logical order.
fn convert(
    src: &Tensor,
    src_bytes: &[u8],
    dst: &Tensor,
    dst_bytes: &mut [u8],
    codec: &dyn Codec,
) -> Result<(), String> {
    if matches!(src.dtype, DType::Quant(_)) || matches!(dst.dtype, DType::Quant(_)) {
        return if src.dtype == dst.dtype {
            copy_blocks(src, src_bytes, dst, dst_bytes)
        } else {
            convert_via_f32(codec, src, src_bytes, dst, dst_bytes)
        };
    }
    if src.is_contiguous() && dst.is_contiguous() {
        // The same values in the same order: one dense conversion (or copy).
        let n = src.nelements().max(0) as usize;
        let a = src_bytes
            .get(..n * elem_size(src.dtype))
            .ok_or("source element out of range")?;
        let b = dst_bytes
            .get_mut(..n * elem_size(dst.dtype))
            .ok_or("destination element out of range")?;
        convert_dense(src.dtype, a, dst.dtype, b);
        return Ok(());
    }
    if src.ne == dst.ne {
        // One shape: row by row (a permuted CONT keeps its rows dense unless dimension 0 moved).
        let n0 = src.ne[0].max(0) as usize;
        for (so, d_o) in row_offsets(src).zip(row_offsets(dst)) {
            copy_float_row(
                src.dtype,
                src_bytes,
                (so, src.nb[0]),
                dst.dtype,
                dst_bytes,
                (d_o, dst.nb[0]),
                n0,
            )
            .ok_or("element out of range")?;
        }
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

    /// A toy block type: blocks of 2 elements stored as 2 i8 tenths.
    const TENTHS: QuantType = QuantType {
        name: "tenths",
        id: 999,
        block: 2,
        block_bytes: 2,
        decode: true,
        encode: true,
    };

    struct Tenths;

    impl Codec for Tenths {
        fn decode(&self, _: QuantType, src: &[u8], out: &mut [f32]) -> Result<(), String> {
            for (o, &b) in out.iter_mut().zip(src) {
                *o = f32::from(b as i8) / 10.0;
            }
            Ok(())
        }
        fn encode(&self, _: QuantType, src: &[f32], out: &mut [u8]) -> Result<(), String> {
            for (o, &v) in out.iter_mut().zip(src) {
                *o = (v * 10.0).round() as i8 as u8;
            }
            Ok(())
        }
    }

    /// A tensor of the toy type laid out as ggml lays out block types (nb[0] = block bytes).
    fn tenths(ne: [i64; 4]) -> Tensor {
        let mut t = tensor(DType::I8, ne, 0);
        t.dtype = DType::Quant(TENTHS);
        let row = (ne[0] / 2 * 2) as u64;
        t.nb = [2, row, row * ne[1] as u64, row * (ne[1] * ne[2]) as u64];
        t
    }

    #[test]
    fn quantized_copies_and_gathers_go_through_the_codec() {
        // f32 [2, 2] -> tenths -> a transposed f32 view.
        let src = tensor(DType::F32, [2, 2, 1, 1], 0);
        let q = tenths([2, 2, 1, 1]);
        let mut packed = vec![0u8; 4];
        let op = HostOp::convert(&src, &q).unwrap();
        op.run(&[&bytes_f32(&[0.1, 0.2, 0.3, 0.4])], &mut packed, &Tenths)
            .unwrap();
        assert_eq!(packed, [1, 2, 3, 4]);
        let back = tensor(DType::F32, [2, 2, 1, 1], 0);
        let mut out = vec![0u8; 16];
        HostOp::convert(&q, &back)
            .unwrap()
            .run(&[&packed], &mut out, &Tenths)
            .unwrap();
        assert_eq!(out, bytes_f32(&[0.1, 0.2, 0.3, 0.4]));
        // GET_ROWS of quantized rows into f32.
        let idx = tensor(DType::I32, [1, 1, 1, 1], 0);
        let dst = tensor(DType::F32, [2, 1, 1, 1], 0);
        let mut row = vec![0u8; 8];
        HostOp::get_rows(&q, &idx, &dst)
            .unwrap()
            .run(&[&packed, &1i32.to_le_bytes()], &mut row, &Tenths)
            .unwrap();
        assert_eq!(row, bytes_f32(&[0.3, 0.4]));
        // Rows that are not whole blocks are refused.
        assert!(
            HostOp::convert(&tensor(DType::F32, [3, 1, 1, 1], 0), &tenths([3, 1, 1, 1])).is_err()
        );
    }

    #[test]
    fn q8_0_is_encoded_like_ggml_cpu() {
        // One block: max |x| = 254 gives d = 2 and a multiplier of 0.5; 1.0 and 3.0 land on
        // ties (0.5, 1.5), which go to even (0, 2); -254 maps to -127.
        let mut x = vec![0f32; 32];
        x[0] = -254.0;
        x[1] = 1.0;
        x[2] = 3.0;
        x[3] = 100.2;
        let mut out = vec![0u8; 34];
        encode_q8_0(&x, &mut out);
        assert_eq!(f16::from_le_bytes([out[0], out[1]]).to_f32(), 2.0);
        assert_eq!(
            out[2..6].iter().map(|&b| b as i8).collect::<Vec<_>>(),
            [-127, 0, 2, 50]
        );
        assert!(out[6..].iter().all(|&b| b == 0));
        // A block of zeros has scale 0.
        encode_q8_0(&[0.0; 32], &mut out);
        assert!(out.iter().all(|&b| b == 0));
    }

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
            .run(&[&input], &mut out, &Tenths)
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
            .run(&[&input], &mut out, &Tenths)
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
            .run(&[&input], &mut out, &Tenths)
            .unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
    }

    /// Element-by-element reference of a converting copy: logical order on both sides.
    fn reference_copy(src: &Tensor, input: &[u8], dst: &Tensor, out: &mut [u8]) {
        let (ss, ds) = (elem_size(src.dtype), elem_size(dst.dtype));
        for (so, d_o) in src.element_offsets().zip(dst.element_offsets()) {
            let (so, d_o) = (so as usize, d_o as usize);
            let v = load(src.dtype, &input[so..so + ss]);
            store(dst.dtype, &mut out[d_o..d_o + ds], v);
        }
    }

    /// `t` with its dimensions permuted: logical dimension `d` walks memory dimension
    /// `perm[d]` of a dense tensor of shape `ne`.
    fn permuted(dtype: DType, ne: [i64; 4], perm: [usize; 4]) -> Tensor {
        let dense = tensor(dtype, ne, 0);
        let mut t = dense.clone();
        for d in 0..4 {
            t.ne[d] = ne[perm[d]];
            t.nb[d] = dense.nb[perm[d]];
        }
        t
    }

    #[test]
    fn strided_and_dense_fast_paths_match_the_element_by_element_copy() {
        let types = [DType::F32, DType::F16, DType::Bf16];
        // Rows longer than one conversion chunk, permutations that keep dimension 0 and ones
        // that move it (a transposed CONT: strided rows).
        let shapes = [[300, 3, 2, 1], [3, 4, 5, 2], [1, 7, 3, 2]];
        let perms = [
            [0, 1, 2, 3],
            [0, 2, 1, 3],
            [1, 0, 2, 3],
            [2, 1, 0, 3],
            [3, 2, 1, 0],
        ];
        for from in types {
            for to in types {
                for ne in shapes {
                    for perm in perms {
                        let src = permuted(from, ne, perm);
                        let n = src.nelements() as usize;
                        let input: Vec<u8> = (0..n as u64 * 4)
                            .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8 & 0x3f)
                            .collect();
                        for dst in [tensor(to, src.ne, 0), permuted(to, ne, perm)] {
                            let mut want = vec![0u8; n * 4];
                            reference_copy(&src, &input, &dst, &mut want);
                            let mut got = vec![0u8; n * 4];
                            HostOp::convert(&src, &dst)
                                .unwrap()
                                .run(&[&input], &mut got, &Tenths)
                                .unwrap();
                            assert_eq!(got, want, "{from} -> {to}, ne {ne:?}, perm {perm:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn set_rows_of_one_element_rows_fills_a_transposed_cache() {
        // The V cache written transposed: 6 values as one-element rows, at rows 5..11 of an f16
        // cache of 16 one-element rows; the others stay.
        let src = tensor(DType::F32, [1, 6, 1, 1], 0);
        let idx = tensor(DType::I64, [6, 1, 1, 1], 0);
        let dst = tensor(DType::F16, [1, 16, 1, 1], 0);
        let at: Vec<u8> = (5i64..11).flat_map(|i| i.to_le_bytes()).collect();
        let mut out = vec![0u8; 32];
        HostOp::set_rows(&src, &idx, &dst)
            .unwrap()
            .run(
                &[&bytes_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]), &at],
                &mut out,
                &Tenths,
            )
            .unwrap();
        let h: Vec<f32> = out
            .chunks(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        let mut want = [0f32; 16];
        want[5..11].copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        assert_eq!(h, want);
    }

    #[test]
    fn refuses_what_it_cannot_convert() {
        let f = tensor(DType::F32, [4, 1, 1, 1], 0);
        let i = tensor(DType::I32, [4, 1, 1, 1], 0);
        assert!(HostOp::convert(&f, &i).is_err());
        assert!(HostOp::convert(&i, &i).is_ok());
        assert!(HostOp::convert(&f, &tensor(DType::F32, [5, 1, 1, 1], 0)).is_err());
        let op = HostOp::convert(&f, &f).unwrap();
        assert!(op.run(&[&[0u8; 8]], &mut [0u8; 16], &Tenths).is_err());
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
        op.run(&[&rows, &picks], &mut out, &Tenths).unwrap();
        assert_eq!(out, bytes_f32(&[20.0, 21.0, 0.0, 1.0]));

        // Scatter 2 f32 rows into a 3-row f16 tensor at i64 rows [1, 2]; row 0 stays.
        let src = tensor(DType::F32, [2, 2, 1, 1], 0);
        let idx = tensor(DType::I64, [2, 1, 1, 1], 0);
        let dst = tensor(DType::F16, [2, 3, 1, 1], 0);
        let at: Vec<u8> = [1i64, 2].iter().flat_map(|i| i.to_le_bytes()).collect();
        let mut out = vec![0xffu8; 12];
        let op = HostOp::set_rows(&src, &idx, &dst).unwrap();
        op.run(&[&bytes_f32(&[1.0, 2.0, 3.0, 4.0]), &at], &mut out, &Tenths)
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
        let err = op
            .run(&[&bytes_f32(&[0.0; 4]), &bad], &mut out, &Tenths)
            .unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        // Types ggml cannot convert are not gathered.
        let mut q = tensor(DType::F32, [32, 3, 1, 1], 0);
        q.dtype = DType::Other("q4_0");
        let idx = tensor(DType::I32, [2, 1, 1, 1], 0);
        assert!(HostOp::get_rows(&q, &idx, &tensor(DType::F32, [32, 2, 1, 1], 0)).is_err());
    }
}
