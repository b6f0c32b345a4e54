//! The executor: runs a kernel description over operand memory with ggml's reference semantics.
//! Every operand is copied in, computed in f32, rounded on store to the output type, and copied
//! back, so outputs may alias inputs (ggml's in-place ops) without undefined behaviour.

mod attn;
mod elem;
pub mod iron;
pub mod quant;
mod unary;

pub use elem::{bf16_from_f32, bf16_to_f32};
pub use unary::unary_f32;

use crate::image::{KernelDesc, TensorDesc};
use crate::ops::{BinaryOp, Op};

/// One operand: `len` bytes at `addr`, all inside one live allocation.
#[derive(Clone, Copy, Debug)]
pub struct OperandMem {
    pub addr: usize,
    pub len: usize,
}

/// What one execution moved and computed (cost-model inputs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub flops: u64,
    /// An emulated IRON design's time from its dataflow (None: reference executors, charged
    /// by the roofline alone).
    pub timeline: Option<iron::timing::Timeline>,
}

/// A tensor's bytes copied out of device memory.
struct Buf<'a> {
    t: &'a TensorDesc,
    bytes: Vec<u8>,
    /// An f16 operand computed as bf16: values are rounded to bf16 when read and written.
    as_bf16: bool,
}

/// Rounds `v` to the nearest bf16 value (ggml's rounding).
fn round_bf16(v: f32) -> f32 {
    bf16_to_f32(bf16_from_f32(v))
}

impl Buf<'_> {
    fn offset(&self, i: [i64; 4]) -> usize {
        (0..4).map(|d| (i[d] * self.t.nb[d]) as usize).sum()
    }

    /// The i32 at index `i` (an i32 tensor), exactly.
    fn get_i32(&self, i: [i64; 4]) -> i32 {
        let off = self.offset(i);
        i32::from_le_bytes(self.bytes[off..off + 4].try_into().expect("4 bytes"))
    }

    /// Stores the integer `v` at index `i` of an i32 or i64 tensor, exactly.
    fn set_int(&mut self, i: [i64; 4], v: i64) {
        let off = self.offset(i);
        match self.t.ty {
            crate::ops::DType::I64 => self.bytes[off..off + 8].copy_from_slice(&v.to_le_bytes()),
            _ => self.bytes[off..off + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        }
    }

    fn get(&self, i: [i64; 4]) -> f32 {
        let v = elem::load(self.t.ty, &self.bytes, self.offset(i));
        if self.as_bf16 {
            round_bf16(v)
        } else {
            v
        }
    }

    fn set(&mut self, i: [i64; 4], v: f32) {
        let off = self.offset(i);
        let v = if self.as_bf16 { round_bf16(v) } else { v };
        elem::store(self.t.ty, &mut self.bytes, off, v);
    }
}

/// Calls `f` for every index of `ne`, innermost dimension fastest.
fn for_each_index(ne: [i64; 4], mut f: impl FnMut([i64; 4])) {
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    f([i0, i1, i2, i3]);
                }
            }
        }
    }
}

/// ggml's ROPE (normal and NeoX modes) as ggml-cpu computes it, YaRN included: per position a
/// cache of (cos, sin) pairs, then each row's first `n_dims` values rotated in pairs (adjacent in
/// normal mode, `n_dims/2` apart in NeoX mode) and the rest copied.
fn rope(x: &Buf<'_>, pos: &Buf<'_>, ff: Option<&Buf<'_>>, params: &[i32], out: &mut Buf<'_>) {
    let p = |i: usize| params.get(i).copied().unwrap_or(0);
    let f = |i: usize| f32::from_bits(p(i) as u32);
    let (n_dims, neox, n_ctx_orig) = (p(1) as i64, p(2) == 2, p(4));
    let (freq_base, freq_scale, ext_factor) = (f(5), f(6), f(7));
    let (attn_factor, beta_fast, beta_slow) = (f(8), f(9), f(10));
    let ne = x.t.ne;
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    let corr_dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * freq_base.ln())
    };
    let corr = [
        corr_dim(beta_fast).floor().max(0.0),
        corr_dim(beta_slow).ceil().min(n_dims as f32 - 1.0),
    ];
    let mut cache = vec![0f32; ne[0] as usize + 1];
    for i2 in 0..ne[2] {
        let off = (i2 * pos.t.nb[0]) as usize;
        let position = i32::from_le_bytes(pos.bytes[off..off + 4].try_into().expect("4 bytes"));
        let mut theta = position as f32;
        // Only the rotated pairs need a cache entry (ggml-cpu fills the whole row, reading
        // frequency factors past n_dims/2 it never uses).
        for i0 in (0..n_dims).step_by(2) {
            let factor = ff.map_or(1.0, |b| b.get([i0 / 2, 0, 0, 0]));
            let theta_extrap = theta / factor;
            let theta_interp = freq_scale * theta_extrap;
            let (mut th, mut mscale) = (theta_interp, attn_factor);
            if ext_factor != 0.0 {
                let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
                let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
                th = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
                mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
            }
            cache[i0 as usize] = th.cos() * mscale;
            cache[i0 as usize + 1] = th.sin() * mscale;
            theta *= theta_scale;
        }
        for i3 in 0..ne[3] {
            for i1 in 0..ne[1] {
                let at = |i0: i64| [i0, i1, i2, i3];
                for i0 in (0..n_dims).step_by(2) {
                    let (a, b) = if neox {
                        (i0 / 2, i0 / 2 + n_dims / 2)
                    } else {
                        (i0, i0 + 1)
                    };
                    let (c, s) = (cache[i0 as usize], cache[i0 as usize + 1]);
                    let (x0, x1) = (x.get(at(a)), x.get(at(b)));
                    out.set(at(a), x0 * c - x1 * s);
                    out.set(at(b), x0 * s + x1 * c);
                }
                for i0 in n_dims..ne[0] {
                    out.set(at(i0), x.get(at(i0)));
                }
            }
        }
    }
}

/// ggml's SET_ROWS as ggml-cpu runs it: row i of slab (i02, i03) of `src` into row
/// `idx[i, i02 % n11, i03 % n12]` of the same slab of `out`, in order (a later row wins); an
/// index outside the destination fails the kernel (ggml-cpu asserts).
fn set_rows(src: &Buf<'_>, idx: &Buf<'_>, out: &mut Buf<'_>) -> Result<(), String> {
    let (ne, ni, rows) = (src.t.ne, idx.t.ne, out.t.ne[1]);
    for i03 in 0..ne[3] {
        for i02 in 0..ne[2] {
            for i in 0..ne[1] {
                let at = [i, i02 % ni[1], i03 % ni[2], 0];
                let off = idx.offset(at);
                let row = match idx.t.ty {
                    crate::ops::DType::I64 => {
                        i64::from_le_bytes(idx.bytes[off..off + 8].try_into().expect("8 bytes"))
                    }
                    _ => i64::from(idx.get_i32(at)),
                };
                if !(0..rows).contains(&row) {
                    return Err(format!("SET_ROWS index {row} outside {rows} rows"));
                }
                for i0 in 0..ne[0] {
                    out.set([i0, row, i02, i03], src.get([i0, i, i02, i03]));
                }
            }
        }
    }
    Ok(())
}

/// ggml's soft_max_ext, as ggml-cpu computes it: the row scaled plus slope·mask, its maximum
/// (with the sink), exponentials summed in f64 (plus exp(sink - max)).
fn soft_max(
    x: &Buf<'_>,
    mask: Option<&Buf<'_>>,
    sinks: Option<&Buf<'_>>,
    scale: f32,
    max_bias: f32,
    out: &mut Buf<'_>,
) {
    let ne = x.t.ne;
    let n_head = ne[2] as u32;
    let n_head_log2 = 1u32 << (n_head as f32).log2().floor() as u32;
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    let mut w = vec![0f32; ne[0] as usize];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            let h = i2 as u32;
            let slope = if max_bias > 0.0 {
                if h < n_head_log2 {
                    m0.powi(h as i32 + 1)
                } else {
                    m1.powi(2 * (h - n_head_log2) as i32 + 1)
                }
            } else {
                1.0
            };
            let sink = sinks.map(|k| k.get([i2, 0, 0, 0]));
            for i1 in 0..ne[1] {
                for (i0, v) in w.iter_mut().enumerate() {
                    *v = x.get([i0 as i64, i1, i2, i3]) * scale;
                    if let Some(m) = mask {
                        let mn = m.t.ne;
                        *v += slope * m.get([i0 as i64, i1, i2 % mn[2], i3 % mn[3]]);
                    }
                }
                let mut max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                if let Some(s) = sink {
                    max = max.max(s);
                }
                let mut sum = 0f64;
                for v in w.iter_mut() {
                    *v = (*v - max).exp();
                    sum += f64::from(*v);
                }
                if let Some(s) = sink {
                    sum += f64::from((s - max).exp());
                }
                let inv = (1.0 / sum) as f32;
                for (i0, v) in w.iter().enumerate() {
                    out.set([i0 as i64, i1, i2, i3], v * inv);
                }
            }
        }
    }
}

/// The three ggml nodes of a gate/up pair as ggml-cpu runs them: both products (gate `wg`,
/// up `wu`, of `x`) in f32, then the GLU act(gate) * up into `out`.
fn glu_products(
    wg: &Buf<'_>,
    wu: &Buf<'_>,
    x: &Buf<'_>,
    act: crate::ops::UnaryOp,
    out: &mut Buf<'_>,
) {
    let product = |w: &Buf<'_>| {
        let mut p = Buf {
            t: out.t,
            bytes: vec![0u8; out.bytes.len()],
            as_bf16: false,
        };
        mul_mat(w, x, &mut p);
        p
    };
    let (gate, up) = (product(wg), product(wu));
    for_each_index(out.t.ne, |i| {
        out.set(i, unary_f32(act, gate.get(i)) * up.get(i))
    });
}

/// out += r, r repeated over out (ggml's ADD broadcasting its second input), in f32.
fn add_repeated(out: &mut Buf<'_>, r: &Buf<'_>) {
    let rn = r.t.ne;
    for_each_index(out.t.ne, |i| {
        let j = [i[0] % rn[0], i[1] % rn[1], i[2] % rn[2], i[3] % rn[3]];
        out.set(i, out.get(i) + r.get(j));
    });
}

/// rms_norm(x) * n into a new f32 buffer of layout `yt` (x's shape, dense), as
/// [`rms_norm_mul`] computes it.
fn normed<'a>(x: &Buf<'_>, n: &Buf<'_>, eps: i32, yt: &'a TensorDesc) -> Buf<'a> {
    let mut y = Buf {
        t: yt,
        bytes: vec![0u8; yt.extent() as usize],
        as_bf16: false,
    };
    rms_norm_mul(x, n, eps, &mut y);
    y
}

/// ggml's ROPE of the f32 product `w . y`, viewed as `out`'s [D, H, N]; `rotation` is the
/// positions, the frequency factors (if any) and the rope's op_params.
fn rotated_product(w: &Buf<'_>, y: &Buf<'_>, rotation: Rotation<'_, '_>, out: &mut Buf<'_>) {
    let f32 = crate::ops::DType::F32;
    let pt = TensorDesc::contiguous([w.t.ne[1], y.t.ne[1], 1, 1], f32);
    let mut product = Buf {
        t: &pt,
        bytes: vec![0u8; pt.extent() as usize],
        as_bf16: false,
    };
    mul_mat(w, y, &mut product);
    if let Some(b) = rotation.bias {
        add_repeated(&mut product, b);
    }
    let rt = TensorDesc::contiguous(out.t.ne, f32);
    let mut heads = Buf {
        t: &rt,
        bytes: product.bytes,
        as_bf16: false,
    };
    let Rotation {
        pos,
        ff,
        params,
        head_norm,
        ..
    } = rotation;
    if let Some(w) = head_norm {
        // qwen3's per-head norm: RMS_NORM over each head's D rows, then MUL by its weights.
        let normed_heads = normed(&heads, w, params[12], &rt);
        heads.bytes = normed_heads.bytes;
    }
    rope(&heads, pos, ff, params, out);
}

/// What rotates a product: the positions, the frequency factors (if any), the rope's
/// op_params, the weights of a norm of each head ahead of the rotation (if any; its eps is
/// op_params[12]), and a bias added to the product first (if any).
#[derive(Clone, Copy)]
struct Rotation<'b, 'a> {
    pos: &'b Buf<'a>,
    ff: Option<&'b Buf<'a>>,
    params: &'b [i32],
    head_norm: Option<&'b Buf<'a>>,
    bias: Option<&'b Buf<'a>>,
}

/// `w . y + b` (b one row, repeated) in f32, then converted once into `out` (f32, f16 or bf16:
/// llama's V into its cache).
fn biased_product(w: &Buf<'_>, y: &Buf<'_>, b: &Buf<'_>, out: &mut Buf<'_>) {
    let pt = TensorDesc::contiguous(out.t.ne, crate::ops::DType::F32);
    let mut product = Buf {
        t: &pt,
        bytes: vec![0u8; pt.extent() as usize],
        as_bf16: false,
    };
    mul_mat(w, y, &mut product);
    add_repeated(&mut product, b);
    for_each_index(out.t.ne, |i| out.set(i, product.get(i)));
}

/// RMS_NORM then MUL by the weight row `n` as the two ggml nodes compute them (the norm
/// rounded to f32, then the f32 product), into `y` (x's shape: f32, or bf16 rounded once from
/// the f32 product); `eps` as f32 bits.
fn rms_norm_mul(x: &Buf<'_>, n: &Buf<'_>, eps: i32, y: &mut Buf<'_>) {
    let nt = TensorDesc::contiguous(y.t.ne, crate::ops::DType::F32);
    let mut normed = Buf {
        t: &nt,
        bytes: vec![0u8; nt.extent() as usize],
        as_bf16: false,
    };
    norm_rows(x, &mut normed, f64::from(f32::from_bits(eps as u32)), true);
    for_each_index(y.t.ne, |i| y.set(i, normed.get(i) * n.get([i[0], 0, 0, 0])));
}

/// ggml's RMS_NORM (`rms`) or NORM over each row, with sums in f64 as ggml-cpu keeps them.
fn norm_rows(x: &Buf<'_>, out: &mut Buf<'_>, eps: f64, rms: bool) {
    let ne = x.t.ne;
    let n = ne[0] as f64;
    let mut row = vec![0f64; ne[0] as usize];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for (i0, r) in row.iter_mut().enumerate() {
                    *r = f64::from(x.get([i0 as i64, i1, i2, i3]));
                }
                let mean = if rms {
                    0.0
                } else {
                    row.iter().sum::<f64>() / n
                };
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
                let scale = 1.0 / (var + eps).sqrt();
                for (i0, r) in row.iter().enumerate() {
                    out.set([i0 as i64, i1, i2, i3], ((r - mean) * scale) as f32);
                }
            }
        }
    }
}

/// ggml's ARGMAX as ggml-cpu's loop computes it: a running maximum `max = max > x ? max : x`,
/// and the index moves to every element equal to it (so the last of equal maxima wins).
fn argmax(x: &Buf<'_>, out: &mut Buf<'_>) {
    let ne = x.t.ne;
    for i1 in 0..ne[1] {
        let (mut max, mut idx) = (f32::NEG_INFINITY, 0);
        for i0 in 0..ne[0] {
            let v = x.get([i0, i1, 0, 0]);
            max = if max > v { max } else { v };
            if max == v {
                idx = i0;
            }
        }
        out.set_int([i1, 0, 0, 0], idx);
    }
}

/// ggml's CROSS_ENTROPY_LOSS as ggml-cpu computes it: per row, log-softmax of the logits (the
/// exponentials summed in f64, its logarithm taken in f32), times the labels, summed (in f64,
/// stored as f32); the row sums added in f32 and scaled by −1/rows.
fn cross_entropy_loss(logits: &Buf<'_>, labels: &Buf<'_>) -> f32 {
    let ne = logits.t.ne;
    let rows = ne[1] * ne[2] * ne[3];
    let mut total = 0f32;
    let mut row = vec![0f32; ne[0] as usize];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for (i0, r) in row.iter_mut().enumerate() {
                    *r = logits.get([i0 as i64, i1, i2, i3]);
                }
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = row.iter().map(|v| f64::from((v - max).exp())).sum();
                // ggml takes logf of the sum (in f32) and adds its negation in f32.
                let log_sum = (sum as f32).ln();
                let mut dot = 0f64;
                for (i0, r) in row.iter().enumerate() {
                    let log_p = (r - max) + -log_sum;
                    dot += f64::from(log_p * labels.get([i0 as i64, i1, i2, i3]));
                }
                total += dot as f32;
            }
        }
    }
    total * (-1.0 / rows as f32)
}

/// ggml's MUL_MAT with block-quantized weights: each activation row is quantized to the
/// weights' dot-product type and multiplied with each weight row block by block (see
/// [`quant`] for why the activations are quantized).
/// RMS_NORM_QKV[_HEAD_NORM]_ROPE(_FF) on `bufs` (Wq, Wk, Wv, x, n, positions[, factors][, Q's
/// and K's head norm weights]) into Q, K and V as the three kernels it replaces compute them;
/// `op_params` its own.
fn normed_qkv(
    bufs: &[Buf<'_>],
    (ff, head_norm, bias): (bool, bool, bool),
    op_params: &[i32],
    [q, k, v]: [&mut Buf<'_>; 3],
) {
    let (x, n) = (&bufs[3], &bufs[4]);
    let yt = TensorDesc::contiguous(x.t.ne, crate::ops::DType::F32);
    let y = normed(x, n, op_params[11], &yt);
    // Each projection's own inputs after the shared ones.
    let own = 6 + usize::from(ff);
    let rotation = |i: usize| Rotation {
        pos: &bufs[5],
        ff: ff.then(|| &bufs[6]),
        params: op_params,
        head_norm: head_norm.then(|| &bufs[own + i]),
        bias: bias.then(|| &bufs[own + i]),
    };
    rotated_product(&bufs[0], &y, rotation(0), q);
    rotated_product(&bufs[1], &y, rotation(1), k);
    if bias {
        biased_product(&bufs[2], &y, &bufs[own + 2], v);
    } else {
        mul_mat(&bufs[2], &y, v);
    }
}

/// The block after a llama attention up to its GLU: the output projection, the residual, the
/// norm, the gate and up products.
struct Ffn<'b, 'a> {
    wo: &'b Buf<'a>,
    r0: &'b Buf<'a>,
    wg: &'b Buf<'a>,
    wu: &'b Buf<'a>,
    n: &'b Buf<'a>,
    act: crate::ops::UnaryOp,
}

/// gemma's norms after the attention's projection and after the block (`DecodeLayer`'s
/// `post_norm`): their weights and eps (f32 bits), and the projections before them, o and d.
struct PostNorms<'b, 'a> {
    n_attn: &'b Buf<'a>,
    n_ffn: &'b Buf<'a>,
    eps: [i32; 2],
    o: &'b mut Buf<'a>,
    d: &'b mut Buf<'a>,
}

/// RMS_NORM_MUL_ADD: `out` = rms_norm(p) * n + r as ggml-cpu's three nodes compute it (the
/// norm times n rounded to f32, then plus r; r of out's shape or repeated over it).
fn rms_norm_mul_add(p: &Buf<'_>, n: &Buf<'_>, eps: i32, r: &Buf<'_>, out: &mut Buf<'_>) {
    rms_norm_mul(p, n, eps, out);
    add_repeated(out, r);
}

/// FLASH_ATTN_FFN_<GLU>: FLASH_ATTN_EXT_MASK of `[q, k, v, mask]` into a, then
/// MUL_MAT_ADD_RMS_NORM_FFN_<GLU> with a viewed as [Ka, N], as the two kernels it replaces
/// compute them; `params` the attention's scale, max_bias and softcap, then the norm's eps;
/// `down` Wd and the output. Without it (FLASH_ATTN_GLU_<GLU>) the block stops at h.
fn attention_ffn(
    [q, k, v, mask]: [&Buf<'_>; 4],
    f: Ffn<'_, '_>,
    params: &[i32],
    [a, r1, h]: [&mut Buf<'_>; 3],
    down: Option<(&Buf<'_>, &mut Buf<'_>)>,
    mut post: Option<PostNorms<'_, '_>>,
) {
    let bits = |i: usize| f32::from_bits(params[i] as u32);
    let attention = attn::Params {
        scale: bits(0),
        max_bias: bits(1),
        softcap: bits(2),
    };
    attn::flash_attn_ext(q, k, v, Some(mask), None, attention, a);
    let [dv, heads, rows, seqs] = a.t.ne;
    let at = TensorDesc::contiguous([dv * heads, rows * seqs, 1, 1], a.t.ty);
    let a2 = Buf {
        t: &at,
        bytes: a.bytes.clone(),
        as_bf16: false,
    };
    match post.as_mut() {
        Some(p) => {
            mul_mat(f.wo, &a2, p.o);
            rms_norm_mul_add(p.o, p.n_attn, p.eps[0], f.r0, r1);
        }
        None => {
            mul_mat(f.wo, &a2, r1);
            add_repeated(r1, f.r0);
        }
    }
    let yt = TensorDesc::contiguous(r1.t.ne, crate::ops::DType::F32);
    let y = normed(r1, f.n, params[3], &yt);
    glu_products(f.wg, f.wu, &y, f.act, h);
    if let Some((wd, out)) = down {
        match post {
            Some(p) => {
                mul_mat(wd, h, p.d);
                rms_norm_mul_add(p.d, p.n_ffn, p.eps[1], r1, out);
            }
            None => {
                mul_mat(wd, h, out);
                add_repeated(out, r1);
            }
        }
    }
}

fn mul_mat_quantized(w: &Buf<'_>, x: &Buf<'_>, out: &mut Buf<'_>) {
    let (wn, xn, ty) = (w.t.ne, x.t.ne, w.t.ty);
    let k = wn[0];
    let (r2, r3) = (xn[2] / wn[2], xn[3] / wn[3]);
    let row_bytes = k as usize / ty.block() * ty.size();
    let mut row = vec![0f32; k as usize];
    for i3 in 0..xn[3] {
        for i2 in 0..xn[2] {
            for n in 0..xn[1] {
                for (kk, r) in row.iter_mut().enumerate() {
                    *r = x.get([kk as i64, n, i2, i3]);
                }
                let a = quant::quantize_for(ty, &row);
                let base = (i2 / r2) * w.t.nb[2] + (i3 / r3) * w.t.nb[3];
                for m in 0..wn[1] {
                    let at = (base + m * w.t.nb[1]) as usize;
                    let v = quant::dot(ty, &w.bytes[at..at + row_bytes], &a);
                    out.set([m, n, i2, i3], v);
                }
            }
        }
    }
}

/// ggml's MUL_MAT. ggml-cpu first converts the activations to the weights' type (f16 or bf16
/// weights get f16/bf16 activations) and accumulates the products in f32; so does this.
fn mul_mat(w: &Buf<'_>, x: &Buf<'_>, out: &mut Buf<'_>) {
    if w.t.ty.is_quantized() {
        return mul_mat_quantized(w, x, out);
    }
    let (wn, xn) = (w.t.ne, x.t.ne);
    let k = wn[0];
    let (r2, r3) = (xn[2] / wn[2], xn[3] / wn[3]);
    // f16 weights computed as bf16 make this a bf16 kernel: the activations go to bf16 too.
    let round = |v: f32| match w.t.ty {
        crate::ops::DType::F16 if w.as_bf16 => round_bf16(v),
        crate::ops::DType::F16 => half::f16::from_f32(v).to_f32(),
        crate::ops::DType::Bf16 => round_bf16(v),
        _ => v,
    };
    let mut row = vec![0f32; k as usize];
    for i3 in 0..xn[3] {
        for i2 in 0..xn[2] {
            for n in 0..xn[1] {
                for (kk, r) in row.iter_mut().enumerate() {
                    *r = round(x.get([kk as i64, n, i2, i3]));
                }
                for m in 0..wn[1] {
                    let mut acc = 0f32;
                    for (kk, r) in row.iter().enumerate() {
                        acc += w.get([kk as i64, m, i2 / r2, i3 / r3]) * r;
                    }
                    out.set([m, n, i2, i3], acc);
                }
            }
        }
    }
}

/// Runs `desc` (already validated, `op` its parsed op) over `operands` (inputs in order, then
/// the output).
///
/// # Safety
/// Every operand range `[addr, addr + len)` must be valid for reads and writes for the duration
/// of the call (the caller resolves them in the allocation table and holds its lock), and `len`
/// must be at least the tensor's extent.
pub unsafe fn execute(
    desc: &KernelDesc,
    op: Op,
    operands: &[OperandMem],
) -> Result<ExecStats, String> {
    let n_in = desc.inputs.len();
    let n_out = 1 + desc.extra_outputs.len();
    if operands.len() != n_in + n_out {
        return Err(format!(
            "kernel {} takes {} operands (inputs then outputs), packet has {}",
            desc.name,
            n_in + n_out,
            operands.len()
        ));
    }
    let tensors: Vec<&TensorDesc> = desc.operands().collect();
    let mut bufs = Vec::with_capacity(tensors.len());
    for (t, m) in tensors.iter().zip(operands) {
        let ext = t.extent() as usize;
        if ext > m.len {
            return Err(format!(
                "operand of {} bytes is smaller than its tensor's extent {ext}",
                m.len
            ));
        }
        let mut bytes = vec![0u8; ext];
        // SAFETY: the caller guarantees [addr, addr+len) is readable and ext <= len; `bytes` is
        // a distinct buffer of exactly ext bytes.
        unsafe { std::ptr::copy_nonoverlapping(m.addr as *const u8, bytes.as_mut_ptr(), ext) };
        let as_bf16 = desc.f16_as_bf16 && t.ty == crate::ops::DType::F16;
        bufs.push(Buf { t, bytes, as_bf16 });
    }
    let mut extra = bufs.split_off(n_in + 1);
    let mut out = bufs.pop().ok_or("no output operand")?;
    let ne = out.t.ne;
    match op {
        Op::Binary(b) => {
            let (s0, s1) = (&bufs[0], &bufs[1]);
            let ne1 = s1.t.ne;
            let f: fn(f32, f32) -> f32 = match b {
                BinaryOp::Add => |x, y| x + y,
                BinaryOp::Sub => |x, y| x - y,
                BinaryOp::Mul => |x, y| x * y,
                BinaryOp::Div => |x, y| x / y,
            };
            for_each_index(ne, |i| {
                let j = [i[0] % ne1[0], i[1] % ne1[1], i[2] % ne1[2], i[3] % ne1[3]];
                out.set(i, f(s0.get(i), s1.get(j)));
            });
        }
        Op::SoftMax { mask, sinks } => {
            let scale = f32::from_bits(desc.op_params[0] as u32);
            let max_bias = f32::from_bits(desc.op_params[1] as u32);
            let m = mask.then(|| &bufs[1]);
            let k = sinks.then(|| &bufs[bufs.len() - 1]);
            soft_max(&bufs[0], m, k, scale, max_bias, &mut out);
        }
        Op::FlashAttnExt { mask, sinks } => {
            let f = |i: usize| f32::from_bits(desc.op_params[i] as u32);
            let params = attn::Params {
                scale: f(0),
                max_bias: f(1),
                softcap: f(2),
            };
            let m = mask.then(|| &bufs[3]);
            let k = sinks.then(|| &bufs[bufs.len() - 1]);
            let (q, kk, v) = (&bufs[0], &bufs[1], &bufs[2]);
            attn::flash_attn_ext(q, kk, v, m, k, params, &mut out);
        }
        Op::Rope { ff } => {
            let ff = ff.then(|| &bufs[2]);
            rope(&bufs[0], &bufs[1], ff, &desc.op_params, &mut out);
        }
        Op::Glu(act) => {
            let (x, g) = (&bufs[0], &bufs[1]);
            for_each_index(ne, |i| out.set(i, unary_f32(act, x.get(i)) * g.get(i)));
        }
        Op::Unary(u) => {
            let s0 = &bufs[0];
            for_each_index(ne, |i| out.set(i, unary_f32(u, s0.get(i))));
        }
        Op::Scale => {
            let s = f32::from_bits(desc.op_params[0] as u32);
            let b = f32::from_bits(desc.op_params[1] as u32);
            let s0 = &bufs[0];
            for_each_index(ne, |i| out.set(i, s0.get(i) * s + b));
        }
        Op::MulMat => mul_mat(&bufs[0], &bufs[1], &mut out),
        Op::MulMatGlu(act) => glu_products(&bufs[0], &bufs[1], &bufs[2], act, &mut out),
        Op::NormedMulMat(glu) => {
            // The nodes as ggml-cpu runs them: the norm rounded to f32, the f32 product with
            // the weight row, then the product(s) (and the GLU).
            let xi = 1 + usize::from(glu.is_some());
            let (x, n) = (&bufs[xi], &bufs[xi + 1]);
            let yt = TensorDesc::contiguous(x.t.ne, crate::ops::DType::F32);
            let mut y = Buf {
                t: &yt,
                bytes: vec![0u8; yt.extent() as usize],
                as_bf16: false,
            };
            rms_norm_mul(x, n, desc.op_params[0], &mut y);
            match glu {
                None => mul_mat(&bufs[0], &y, &mut out),
                Some(act) => glu_products(&bufs[0], &bufs[1], &y, act, &mut out),
            }
        }
        Op::NormedMulMatBias => {
            // RMS_NORM_MUL into f32, the f32 product, the ADD of the bias, one conversion.
            let (x, n) = (&bufs[1], &bufs[2]);
            let yt = TensorDesc::contiguous(x.t.ne, crate::ops::DType::F32);
            let y = normed(x, n, desc.op_params[0], &yt);
            biased_product(&bufs[0], &y, &bufs[3], &mut out);
        }
        Op::NormedMulMatRope {
            ff,
            head_norm,
            bias,
        } => {
            // The nodes as ggml-cpu runs them: RMS_NORM_MUL into f32, the f32 product, (the
            // RMS_NORM_MUL of each head,) then the ROPE of the product viewed as the output's
            // [D, H, N].
            let (x, n) = (&bufs[1], &bufs[2]);
            let yt = TensorDesc::contiguous(x.t.ne, crate::ops::DType::F32);
            let y = normed(x, n, desc.op_params[11], &yt);
            let rotation = Rotation {
                pos: &bufs[3],
                ff: ff.then(|| &bufs[4]),
                params: &desc.op_params[..],
                head_norm: head_norm.then(|| &bufs[4 + usize::from(ff)]),
                bias: bias.then(|| &bufs[4 + usize::from(ff) + usize::from(head_norm)]),
            };
            rotated_product(&bufs[0], &y, rotation, &mut out);
        }
        Op::NormedQkv {
            ff,
            head_norm,
            bias,
        } => {
            let [k, v] = extra.as_mut_slice() else {
                return Err(format!("kernel {}: K and V outputs expected", desc.name));
            };
            normed_qkv(
                &bufs,
                (ff, head_norm, bias),
                &desc.op_params,
                [&mut out, k, v],
            );
        }
        Op::NormedFfn(act) => {
            // The two kernels it replaces: RMS_NORM_MUL_MAT_<GLU> into h, then MUL_MAT_ADD.
            let (x, n) = (&bufs[3], &bufs[4]);
            let yt = TensorDesc::contiguous(x.t.ne, crate::ops::DType::F32);
            let y = normed(x, n, desc.op_params[0], &yt);
            let [h] = extra.as_mut_slice() else {
                return Err(format!("kernel {}: the h output expected", desc.name));
            };
            glu_products(&bufs[0], &bufs[1], &y, act, h);
            mul_mat(&bufs[2], h, &mut out);
            add_repeated(&mut out, &bufs[5]);
        }
        Op::ProjectedFfn(act) => {
            // The two kernels it replaces: MUL_MAT_ADD into r1, then RMS_NORM_FFN_<GLU> of r1.
            let [r1, h] = extra.as_mut_slice() else {
                return Err(format!(
                    "kernel {}: the r1 and h outputs expected",
                    desc.name
                ));
            };
            mul_mat(&bufs[0], &bufs[1], r1);
            add_repeated(r1, &bufs[2]);
            let yt = TensorDesc::contiguous(r1.t.ne, crate::ops::DType::F32);
            let y = normed(r1, &bufs[6], desc.op_params[0], &yt);
            glu_products(&bufs[3], &bufs[4], &y, act, h);
            mul_mat(&bufs[5], h, &mut out);
            add_repeated(&mut out, r1);
        }
        Op::AttnFfn(act) | Op::AttnGlu(act) => {
            // q, k, v, mask, Wo, r0, Wg, Wu, [Wd,] n.
            let down = matches!(op, Op::AttnFfn(_));
            if bufs.len() != op.arity() {
                return Err(format!(
                    "kernel {}: {} inputs expected",
                    desc.name,
                    op.arity()
                ));
            }
            let ffn = Ffn {
                wo: &bufs[4],
                r0: &bufs[5],
                wg: &bufs[6],
                wu: &bufs[7],
                n: &bufs[op.arity() - 1],
                act,
            };
            let qkvm = [&bufs[0], &bufs[1], &bufs[2], &bufs[3]];
            let params = &desc.op_params[..4];
            match (extra.as_mut_slice(), down) {
                ([a, r1, h], true) => attention_ffn(
                    qkvm,
                    ffn,
                    params,
                    [a, r1, h],
                    Some((&bufs[8], &mut out)),
                    None,
                ),
                ([a, r1], false) => attention_ffn(qkvm, ffn, params, [a, r1, &mut out], None, None),
                _ => {
                    return Err(format!(
                        "kernel {}: {} outputs expected",
                        desc.name,
                        op.outputs()
                    ))
                }
            }
        }
        Op::DecodeLayer {
            ff,
            head_norm,
            bias,
            post_norm,
            act,
        } => {
            // With post norms o and d follow h.
            let layer_outputs = extra.len().min(6);
            let (outs, od) = extra.split_at_mut(layer_outputs);
            let [q, k_rows, v_rows, a, r1, h] = outs else {
                return Err(format!(
                    "kernel {}: Q, K rows, V rows, a, r1 and h outputs expected",
                    desc.name
                ));
            };
            // The Q/K/V kernel's op_params (the heads' eps its word 12).
            let (qkv, _) = desc.decode_layer_parts()?;
            normed_qkv(
                &bufs,
                (ff, head_norm, bias),
                &qkv.op_params,
                [q, k_rows, v_rows],
            );
            let b = qkv.inputs.len();
            // The attention reads the caches with this token's rows in them: where the rows
            // lie inside a cache view, its copy takes them.
            let mut caches = bufs.split_off(b);
            // Operands: K's rows and V's rows are outputs 2 and 3 (after the layer's and Q).
            for (c, rows) in [(0, &*k_rows), (1, &*v_rows)] {
                let offset = operands[n_in + 2 + c]
                    .addr
                    .wrapping_sub(operands[b + c].addr);
                let cache = &mut caches[c];
                let o = offset;
                if let Some(dst) = o
                    .checked_add(rows.bytes.len())
                    .and_then(|end| cache.bytes.get_mut(o..end))
                {
                    dst.copy_from_slice(&rows.bytes);
                }
            }
            let qt = q.t.heads_view();
            let q4 = Buf {
                t: &qt,
                bytes: q.bytes.clone(),
                as_bf16: false,
            };
            let [k, v, mask, wo, wg, wu, wd, n, norms @ ..] = &caches[..] else {
                return Err(format!(
                    "kernel {}: {} inputs expected",
                    desc.name,
                    op.arity()
                ));
            };
            let post = match (od, norms) {
                ([o, d], [n_attn, n_ffn]) if post_norm => Some(PostNorms {
                    n_attn,
                    n_ffn,
                    eps: [desc.op_params[17], desc.op_params[18]],
                    o,
                    d,
                }),
                ([], []) if !post_norm => None,
                _ => {
                    return Err(format!(
                        "kernel {}: {} inputs and {} outputs expected",
                        desc.name,
                        op.arity(),
                        op.outputs()
                    ))
                }
            };
            let ffn = Ffn {
                wo,
                r0: &bufs[3],
                wg,
                wu,
                n,
                act,
            };
            let params = [12, 13, 14, 15].map(|i| desc.op_params[i]);
            attention_ffn(
                [&q4, k, v, mask],
                ffn,
                &params,
                [a, r1, h],
                Some((wd, &mut out)),
                post,
            );
        }
        Op::MulMatAdd => {
            // The two ggml nodes as ggml-cpu runs them: the product in f32, then the f32 ADD.
            mul_mat(&bufs[0], &bufs[1], &mut out);
            add_repeated(&mut out, &bufs[2]);
        }
        Op::ArgMax => argmax(&bufs[0], &mut out),
        Op::CountEqual => {
            let (a, b) = (&bufs[0], &bufs[1]);
            let mut equal = 0i64;
            for_each_index(a.t.ne, |i| equal += i64::from(a.get_i32(i) == b.get_i32(i)));
            out.set_int([0; 4], equal);
        }
        Op::CrossEntropyLoss => {
            let loss = cross_entropy_loss(&bufs[0], &bufs[1]);
            out.set([0; 4], loss);
        }
        Op::RmsNorm | Op::Norm => {
            let eps = f64::from(f32::from_bits(desc.op_params[0] as u32));
            norm_rows(&bufs[0], &mut out, eps, op == Op::RmsNorm);
        }
        Op::RmsNormMul => {
            rms_norm_mul(&bufs[0], &bufs[1], desc.op_params[0], &mut out);
        }
        Op::RmsNormMulAdd => {
            rms_norm_mul_add(&bufs[0], &bufs[2], desc.op_params[0], &bufs[1], &mut out);
        }
        Op::Copy => {
            // Both sides walked in logical order: the k-th element of one is the k-th of the
            // other, whatever their shapes.
            let s0 = &bufs[0];
            let (src_ne, dst_ne) = (s0.t.ne, out.t.ne);
            let unravel = |mut k: i64, ne: [i64; 4]| {
                let mut i = [0i64; 4];
                for d in 0..4 {
                    let n = ne[d].max(1);
                    i[d] = k % n;
                    k /= n;
                }
                i
            };
            let mut k = 0i64;
            for_each_index(src_ne, |i| {
                out.set(unravel(k, dst_ne), s0.get(i));
                k += 1;
            });
        }
        Op::SetRows => set_rows(&bufs[0], &bufs[1], &mut out)?,
        Op::CopyRows => {
            // Row t of the source into output t (the output, then the extra outputs).
            let src = &bufs[0];
            for (t, row) in std::iter::once(&mut out)
                .chain(extra.iter_mut())
                .enumerate()
            {
                for e in 0..src.t.ne[0] {
                    row.set([e, 0, 0, 0], src.get([e, t as i64, 0, 0]));
                }
            }
        }
        Op::Clamp => {
            let lo = f32::from_bits(desc.op_params[0] as u32);
            let hi = f32::from_bits(desc.op_params[1] as u32);
            let s0 = &bufs[0];
            // ggml: MAX(MIN(x, max), min) with C's comparison-based MIN/MAX.
            for_each_index(ne, |i| {
                let x = s0.get(i);
                let m = if x < hi { x } else { hi };
                out.set(i, if m > lo { m } else { lo });
            });
        }
    }
    // The extra outputs first, the output last: the output may be written in place of one
    // (MUL_MAT_ADD_RMS_NORM_FFN's out over r1, the block's ADD in place), as the kernel's last
    // phase writes it after the others.
    let written = extra
        .iter()
        .zip(&operands[n_in + 1..])
        .chain(std::iter::once((&out, &operands[n_in])));
    for (buf, dst) in written {
        // SAFETY: the caller guarantees [dst.addr, dst.addr+dst.len) is writable and each
        // output's extent (buf.bytes.len()) is <= dst.len (checked above); `buf.bytes` is a
        // distinct Vec.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.bytes.as_ptr(), dst.addr as *mut u8, buf.bytes.len())
        };
    }
    Ok(stats_of(desc, op))
}

/// What running `desc` moves and computes (the cost model's input), without running it.
pub fn stats_of(desc: &KernelDesc, op: Op) -> ExecStats {
    let bytes_read = desc.inputs.iter().map(TensorDesc::data_bytes).sum();
    let outputs = || std::iter::once(&desc.output).chain(&desc.extra_outputs);
    ExecStats {
        timeline: None,
        bytes_read,
        bytes_written: outputs().map(TensorDesc::data_bytes).sum(),
        flops: if op.is_reduction() {
            desc.inputs[0].nelements() * op.flops_per_element(1)
        } else if let (Op::NormedFfn(_), [h]) = (op, desc.extra_outputs.as_slice()) {
            let (k, f) = (desc.inputs[3].ne[0] as u64, h.ne[0] as u64);
            h.nelements() * op.flops_per_element(k) + desc.output.nelements() * (2 * f + 1)
        } else if let (Op::ProjectedFfn(act), [r1, h]) = (op, desc.extra_outputs.as_slice()) {
            let (ka, k, f) = (desc.inputs[1].ne[0] as u64, r1.ne[0] as u64, h.ne[0] as u64);
            r1.nelements() * op.flops_per_element(ka)
                + h.nelements() * Op::NormedFfn(act).flops_per_element(k)
                + desc.output.nelements() * (2 * f + 1)
        } else if let (Op::DecodeLayer { act, .. }, Some(qkv_op), Ok((qkv, attn))) =
            (op, op.layer_qkv(), desc.decode_layer_parts())
        {
            // As the two kernels it replaces.
            stats_of(&qkv, qkv_op).flops + stats_of(&attn, Op::AttnFfn(act)).flops
        } else if let (Op::AttnFfn(act), [a, r1, h]) = (op, desc.extra_outputs.as_slice()) {
            // The attention as FlashAttnExt's, then the projection and the block.
            let (q, k) = (&desc.inputs[0], &desc.inputs[1]);
            let rows = q.nelements() / q.ne[0].max(1) as u64;
            let (ka, kk, f) = (
                a.nelements() / r1.ne[1].max(1) as u64,
                r1.ne[0] as u64,
                h.ne[0] as u64,
            );
            rows * k.ne[1] as u64 * op.flops_per_element(q.ne[0] as u64)
                + r1.nelements() * Op::ProjectedFfn(act).flops_per_element(ka)
                + h.nelements() * Op::NormedFfn(act).flops_per_element(kk)
                + desc.output.nelements() * (2 * f + 1)
        } else if let (Op::AttnGlu(act), [a, r1]) = (op, desc.extra_outputs.as_slice()) {
            // The attention as FlashAttnExt's, then the projection and the gate and up half.
            let (q, k) = (&desc.inputs[0], &desc.inputs[1]);
            let rows = q.nelements() / q.ne[0].max(1) as u64;
            let ka = a.nelements() / r1.ne[1].max(1) as u64;
            rows * k.ne[1] as u64 * op.flops_per_element(q.ne[0] as u64)
                + r1.nelements() * Op::ProjectedFfn(act).flops_per_element(ka)
                + desc.output.nelements() * Op::NormedFfn(act).flops_per_element(r1.ne[0] as u64)
        } else if let Op::FlashAttnExt { .. } = op {
            // Per query row and head, per key.
            let (q, k) = (&desc.inputs[0], &desc.inputs[1]);
            let rows = q.nelements() / q.ne[0].max(1) as u64;
            rows * k.ne[1] as u64 * op.flops_per_element(q.ne[0] as u64)
        } else {
            let elements: u64 = outputs().map(TensorDesc::nelements).sum();
            elements * op.flops_per_element(desc.inputs[0].ne[0] as u64)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::DType;

    fn buf<'a>(t: &'a TensorDesc, values: &[f32]) -> Buf<'a> {
        let mut b = Buf {
            t,
            bytes: vec![0u8; t.extent() as usize],
            as_bf16: false,
        };
        let mut i = 0;
        for_each_index(t.ne, |idx| {
            b.set(idx, values[i]);
            i += 1;
        });
        b
    }

    #[test]
    fn argmax_picks_the_last_of_equal_maxima_per_row() {
        let x = TensorDesc::contiguous([4, 3, 1, 1], DType::F32);
        let xb = buf(
            &x,
            &[
                1.0, 5.0, 5.0, 2.0, -3.0, -1.0, -2.0, -9.0, 0.0, 0.0, 0.0, 0.0,
            ],
        );
        let o = TensorDesc::contiguous([3, 1, 1, 1], DType::I32);
        let mut ob = buf(&o, &[0.0; 3]);
        argmax(&xb, &mut ob);
        assert_eq!(
            (0..3).map(|i| ob.get_i32([i, 0, 0, 0])).collect::<Vec<_>>(),
            [2, 1, 3]
        );
    }

    #[test]
    fn cross_entropy_loss_is_the_mean_row_log_loss() {
        // Row 0: uniform logits over 2 classes, label on class 0: ln 2. Row 1: logits (0, ln 3)
        // with the label on class 1: -ln(3/4).
        let x = TensorDesc::contiguous([2, 2, 1, 1], DType::F32);
        let logits = buf(&x, &[0.0, 0.0, 0.0, 3f32.ln()]);
        let labels = buf(&x, &[1.0, 0.0, 0.0, 1.0]);
        let loss = cross_entropy_loss(&logits, &labels);
        let want = (2f32.ln() - 0.75f32.ln()) / 2.0;
        assert!((loss - want).abs() < 1e-6, "{loss} vs {want}");
    }

    #[test]
    fn f16_computed_as_bf16_loses_the_low_mantissa_bits() {
        // 1 + 2^-10 is an f16 value; bf16 keeps 7 mantissa bits, so it reads as 1.
        let t = TensorDesc::contiguous([2, 1, 1, 1], DType::F16);
        let mut b = buf(&t, &[1.0 + 1.0 / 1024.0, 3.0]);
        assert_eq!(b.get([0; 4]), 1.0 + 1.0 / 1024.0);
        b.as_bf16 = true;
        assert_eq!(b.get([0; 4]), 1.0);
        assert_eq!(b.get([1, 0, 0, 0]), 3.0);
        // Written values are rounded to bf16 precision, then stored as f16.
        b.set([1, 0, 0, 0], 1.0 + 3.0 / 1024.0);
        b.as_bf16 = false;
        assert_eq!(b.get([1, 0, 0, 0]), 1.0);
        // A MUL_MAT with f16 weights differs: the activations are rounded to bf16 as well.
        let w = TensorDesc::contiguous([2, 1, 1, 1], DType::F16);
        let x = TensorDesc::contiguous([2, 1, 1, 1], DType::F32);
        let o = TensorDesc::contiguous([1, 1, 1, 1], DType::F32);
        let xb = buf(&x, &[1.0 + 1.0 / 1024.0, 1.0]);
        let mut results = Vec::new();
        for as_bf16 in [false, true] {
            let mut wb = buf(&w, &[1.0 + 1.0 / 512.0, 1.0]);
            wb.as_bf16 = as_bf16;
            let mut ob = buf(&o, &[0.0]);
            mul_mat(&wb, &xb, &mut ob);
            results.push(ob.get([0; 4]));
        }
        assert_eq!(results[1], 2.0);
        assert!(results[0] > 2.0 + 2.0 / 1024.0, "{results:?}");
    }

    #[test]
    fn integers_are_stored_exactly() {
        let o = TensorDesc::contiguous([1, 1, 1, 1], DType::I64);
        let mut ob = buf(&o, &[0.0]);
        ob.set_int([0; 4], (1 << 40) + 1);
        assert_eq!(ob.bytes, ((1i64 << 40) + 1).to_le_bytes());
    }
}
