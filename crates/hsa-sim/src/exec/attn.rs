//! ggml's FLASH_ATTN_EXT as ggml-cpu computes it, one query row at a time with the online
//! softmax: each key's score s = q·k (q rounded to k's type first, as ggml-cpu converts it to
//! k's dot-product type), scaled, softcapped (softcap·tanh(s·scale/softcap)), plus slope·mask
//! (keys whose mask is −∞ are skipped); a running maximum M, sum S and v accumulator rescaled
//! by exp(M_old − M) when the maximum grows; the sink joins at the end as one more score
//! without a value; the output is the accumulator over S (0 when S is 0). The accumulator is
//! f32 for every v type (ggml-cpu keeps an f16 one for f16 v; f32 is the more exact of the two
//! and well within test-backend-ops' tolerance).

use super::Buf;
use crate::ops::DType;

/// The op parameters: scale, max_bias (ALiBi), logit_softcap.
#[derive(Clone, Copy, Debug)]
pub(super) struct Params {
    pub scale: f32,
    pub max_bias: f32,
    pub softcap: f32,
}

/// ALiBi's slope for head `h` of `n_head` (1 without ALiBi), as ggml computes it.
fn alibi_slope(h: u32, n_head: u32, max_bias: f32) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1u32 << (n_head as f32).log2().floor() as u32;
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if h < n_head_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_head_log2) as i32 + 1)
    }
}

/// One kv head's keys and values as f32, kept while the query heads sharing it are computed.
struct KvHead {
    at: (i64, i64),
    keys: Vec<f32>,
    values: Vec<f32>,
}

/// The rows `[n_kv, d]` of head `(i2, i3)` of `t` (k or v) as f32, row after row.
fn head_rows(t: &Buf<'_>, i2: i64, i3: i64) -> Vec<f32> {
    let [d, n_kv, _, _] = t.t.ne;
    let mut rows = Vec::with_capacity((d * n_kv) as usize);
    for i1 in 0..n_kv {
        for i0 in 0..d {
            rows.push(t.get([i0, i1, i2, i3]));
        }
    }
    rows
}

/// The dot product of `a` and `b` in eight partial sums (as ggml-cpu's vector dot products
/// sum in SIMD lanes): independent additions the compiler vectorizes, where one running sum
/// is a chain of dependent ones.
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Computes `out` from q, k, v and the optional mask and sinks.
pub(super) fn flash_attn_ext(
    q: &Buf<'_>,
    k: &Buf<'_>,
    v: &Buf<'_>,
    mask: Option<&Buf<'_>>,
    sinks: Option<&Buf<'_>>,
    p: Params,
    out: &mut Buf<'_>,
) {
    let [d, n_q, n_head, n_seq] = q.t.ne;
    let (dv, n_kv) = (v.t.ne[0], k.t.ne[1]);
    let (r2, r3) = (n_head / k.t.ne[2], n_seq / k.t.ne[3]);
    // ggml-cpu folds 1/softcap into the scale and multiplies tanh by softcap.
    let scale = if p.softcap != 0.0 {
        p.scale / p.softcap
    } else {
        p.scale
    };
    // q goes to k's type before the dot product (f16 k computed as bf16: bf16).
    let round_q = |x: f32| match k.t.ty {
        DType::F16 if k.as_bf16 => super::round_bf16(x),
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::Bf16 => super::round_bf16(x),
        _ => x,
    };
    let mut cached: Option<KvHead> = None;
    let mut qrow = vec![0f32; d as usize];
    let mut acc = vec![0f32; dv as usize];
    for i3 in 0..n_seq {
        for i2 in 0..n_head {
            let kv_head = (i2 / r2, i3 / r3);
            if cached.as_ref().is_none_or(|c| c.at != kv_head) {
                cached = Some(KvHead {
                    at: kv_head,
                    keys: head_rows(k, kv_head.0, kv_head.1),
                    values: head_rows(v, kv_head.0, kv_head.1),
                });
            }
            let KvHead { keys, values, .. } = cached.as_ref().expect("filled above");
            let slope = alibi_slope(i2 as u32, n_head as u32, p.max_bias);
            let sink = sinks.map(|s| s.get([i2, 0, 0, 0]));
            for i1 in 0..n_q {
                for (i0, x) in qrow.iter_mut().enumerate() {
                    *x = round_q(q.get([i0 as i64, i1, i2, i3]));
                }
                acc.fill(0.0);
                let (mut sum, mut max) = (0f32, f32::NEG_INFINITY);
                for ic in 0..n_kv {
                    let mv = mask.map_or(0.0, |m| {
                        let mn = m.t.ne;
                        slope * m.get([ic, i1, i2 % mn[2], i3 % mn[3]])
                    });
                    if mv == f32::NEG_INFINITY {
                        continue;
                    }
                    let key = &keys[(ic * d) as usize..((ic + 1) * d) as usize];
                    let dot = dot_lanes(key, &qrow);
                    let mut s = dot * scale;
                    if p.softcap != 0.0 {
                        s = p.softcap * s.tanh();
                    }
                    s += mv;
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if s > max {
                        ms = (max - s).exp();
                        max = s;
                        acc.iter_mut().for_each(|a| *a *= ms);
                    } else {
                        vs = (s - max).exp();
                    }
                    let value = &values[(ic * dv) as usize..((ic + 1) * dv) as usize];
                    for (a, x) in acc.iter_mut().zip(value) {
                        *a += x * vs;
                    }
                    sum = sum * ms + vs;
                }
                if let Some(s) = sink {
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if s > max {
                        ms = (max - s).exp();
                        acc.iter_mut().for_each(|a| *a *= ms);
                    } else {
                        vs = (s - max).exp();
                    }
                    sum = sum * ms + vs;
                }
                let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                for (i0, a) in acc.iter().enumerate() {
                    out.set([i0 as i64, i2, i1, i3], a * inv);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::TensorDesc;

    fn buf<'a>(t: &'a TensorDesc, values: &[f32]) -> Buf<'a> {
        let mut b = Buf {
            t,
            bytes: vec![0u8; t.extent() as usize],
            as_bf16: false,
        };
        let mut i = 0;
        super::super::for_each_index(t.ne, |idx| {
            b.set(idx, values[i]);
            i += 1;
        });
        b
    }

    const PLAIN: Params = Params {
        scale: 1.0,
        max_bias: 0.0,
        softcap: 0.0,
    };

    /// Two keys with scores 0 and ln 3 weigh their values 1/4 and 3/4; a −∞ mask drops a key;
    /// two query heads share one kv head (GQA) and land in dimension 1 of the output.
    #[test]
    fn weights_values_by_the_softmax_of_the_scores() {
        let qd = TensorDesc::contiguous([1, 1, 2, 1], DType::F32);
        let kd = TensorDesc::contiguous([1, 2, 1, 1], DType::F32);
        let vd = TensorDesc::contiguous([2, 2, 1, 1], DType::F32);
        let od = TensorDesc::contiguous([2, 2, 1, 1], DType::F32);
        let q = buf(&qd, &[1.0, 1.0]);
        let k = buf(&kd, &[0.0, 3f32.ln()]);
        let v = buf(&vd, &[4.0, 0.0, 8.0, 4.0]);
        let mut out = buf(&od, &[0.0; 4]);
        flash_attn_ext(&q, &k, &v, None, None, PLAIN, &mut out);
        for h in 0..2 {
            let (a, b) = (out.get([0, h, 0, 0]), out.get([1, h, 0, 0]));
            assert!((a - 7.0).abs() < 1e-5 && (b - 3.0).abs() < 1e-5, "{a} {b}");
        }
        let md = TensorDesc::contiguous([2, 1, 1, 1], DType::F16);
        let mask = buf(&md, &[0.0, f32::NEG_INFINITY]);
        flash_attn_ext(&q, &k, &v, Some(&mask), None, PLAIN, &mut out);
        assert_eq!((out.get([0, 1, 0, 0]), out.get([1, 1, 0, 0])), (4.0, 0.0));
    }

    /// A sink is a score without a value: with one key of score 0 and a sink of 0, the output
    /// is half the value; a fully masked row is 0.
    #[test]
    fn sinks_take_their_share_and_empty_rows_are_zero() {
        let qd = TensorDesc::contiguous([1, 1, 1, 1], DType::F32);
        let kd = TensorDesc::contiguous([1, 1, 1, 1], DType::F32);
        let od = TensorDesc::contiguous([1, 1, 1, 1], DType::F32);
        let q = buf(&qd, &[1.0]);
        let k = buf(&kd, &[0.0]);
        let v = buf(&kd, &[6.0]);
        let sinks = buf(&kd, &[0.0]);
        let mut out = buf(&od, &[0.0]);
        flash_attn_ext(&q, &k, &v, None, Some(&sinks), PLAIN, &mut out);
        assert_eq!(out.get([0; 4]), 3.0);
        let md = TensorDesc::contiguous([1, 1, 1, 1], DType::F16);
        let mask = buf(&md, &[f32::NEG_INFINITY]);
        flash_attn_ext(&q, &k, &v, Some(&mask), None, PLAIN, &mut out);
        assert_eq!(out.get([0; 4]), 0.0);
    }

    /// ALiBi's slopes as ggml defines them: 8 heads, max_bias 8: head h has 2^-(h+1).
    #[test]
    fn alibi_slopes_halve_per_head() {
        for h in 0..8 {
            assert_eq!(alibi_slope(h, 8, 8.0), 2f32.powi(-(h as i32 + 1)));
        }
        assert_eq!(alibi_slope(3, 8, 0.0), 1.0);
    }
}
