//! The fused kernels' families and their parameters. A fused kernel's catalogue name spells its
//! parameters (`RMS_NORM_FFN_SWIGLU`: the GLU; `RMS_NORM_QKV_ROPE_FF`: frequency factors), since
//! the kernel compilers know ops by name; this is the one place that reads and writes them, so
//! that builders match on a family and carry its parameters over as values.

use crate::op_catalogue::OpEntry;

/// The gated linear unit a feed-forward kernel applies (ggml's split GLU ops).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glu {
    Reglu,
    Geglu,
    Swiglu,
    GegluErf,
    GegluQuick,
}

impl Glu {
    const ALL: [Glu; 5] = [
        Glu::Reglu,
        Glu::Geglu,
        Glu::Swiglu,
        Glu::GegluErf,
        Glu::GegluQuick,
    ];

    /// ggml's name of the op (`SWIGLU`), which is also its kernel's.
    pub fn name(self) -> &'static str {
        match self {
            Glu::Reglu => "REGLU",
            Glu::Geglu => "GEGLU",
            Glu::Swiglu => "SWIGLU",
            Glu::GegluErf => "GEGLU_ERF",
            Glu::GegluQuick => "GEGLU_QUICK",
        }
    }

    /// The GLU named `name`.
    pub fn of(name: &str) -> Option<Glu> {
        Glu::ALL.into_iter().find(|g| g.name() == name)
    }
}

/// A fused kernel: its family and the parameters its name carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fused {
    /// `MUL_MAT_<GLU>`: a gate/up pair and its GLU.
    MulMatGlu(Glu),
    /// `RMS_NORM_MUL_MAT`: a projection of a normalised x.
    RmsNormMulMat,
    /// `RMS_NORM_MUL_MAT_BIAS`: the same plus one row of values (qwen2's V and its bias).
    RmsNormMulMatBias,
    /// `RMS_NORM_MUL_MAT_<GLU>`: a gate/up pair of a normalised x and its GLU.
    RmsNormMulMatGlu(Glu),
    /// `RMS_NORM_MUL_MAT[_BIAS][_HEAD_NORM]_ROPE[_FF]`: a projection of a normalised x, rotated
    /// (`ff`: with frequency factors; `bias`: a bias added first, qwen2's Q and K; `head_norm`:
    /// each head normalised first, qwen3's Q and K norms).
    RmsNormMulMatRope {
        ff: bool,
        head_norm: bool,
        bias: bool,
    },
    /// `RMS_NORM_FFN_<GLU>`: a feed-forward block and its residual.
    RmsNormFfn(Glu),
    /// `MUL_MAT_ADD_RMS_NORM_FFN_<GLU>`: the attention output projection, then the block.
    MulMatAddRmsNormFfn(Glu),
    /// `FLASH_ATTN_FFN_<GLU>`: a decode step's attention, then the two above.
    FlashAttnFfn(Glu),
    /// `FLASH_ATTN_GLU_<GLU>`: the same up to the block's GLU (its down projection, of another
    /// weight type, a kernel of its own).
    FlashAttnGlu(Glu),
    /// `RMS_NORM_QKV[_BIAS][_HEAD_NORM]_ROPE[_FF]`: Q, K and V of one normalised x, Q and K
    /// rotated (with their biases added, and their heads normalised first).
    RmsNormQkvRope {
        ff: bool,
        head_norm: bool,
        bias: bool,
    },
    /// `DECODE_LAYER[_BIAS][_HEAD_NORM][_POST_NORM][_FF]_<GLU>`: the Q/K/V kernel
    /// (`RmsNormQkvRope` of the same `ff`, `head_norm` and `bias`), then the attention and the
    /// block (`post_norm`: gemma's, with norms after the attention's projection and after the
    /// block, each before its residual).
    DecodeLayer {
        ff: bool,
        head_norm: bool,
        bias: bool,
        post_norm: bool,
        glu: Glu,
    },
}

impl Fused {
    /// The catalogue name.
    pub fn name(self) -> String {
        let ff = |ff: bool| if ff { "_FF" } else { "" };
        let extra = |bias: bool, head_norm: bool| {
            let b = if bias { "_BIAS" } else { "" };
            let h = if head_norm { "_HEAD_NORM" } else { "" };
            format!("{b}{h}")
        };
        match self {
            Fused::MulMatGlu(g) => format!("MUL_MAT_{}", g.name()),
            Fused::RmsNormMulMat => "RMS_NORM_MUL_MAT".to_owned(),
            Fused::RmsNormMulMatBias => "RMS_NORM_MUL_MAT_BIAS".to_owned(),
            Fused::RmsNormMulMatGlu(g) => format!("RMS_NORM_MUL_MAT_{}", g.name()),
            Fused::RmsNormMulMatRope {
                ff: f,
                head_norm,
                bias,
            } => format!("RMS_NORM_MUL_MAT{}_ROPE{}", extra(bias, head_norm), ff(f)),
            Fused::RmsNormFfn(g) => format!("RMS_NORM_FFN_{}", g.name()),
            Fused::MulMatAddRmsNormFfn(g) => format!("MUL_MAT_ADD_RMS_NORM_FFN_{}", g.name()),
            Fused::FlashAttnFfn(g) => format!("FLASH_ATTN_FFN_{}", g.name()),
            Fused::FlashAttnGlu(g) => format!("FLASH_ATTN_GLU_{}", g.name()),
            Fused::RmsNormQkvRope {
                ff: f,
                head_norm,
                bias,
            } => format!("RMS_NORM_QKV{}_ROPE{}", extra(bias, head_norm), ff(f)),
            Fused::DecodeLayer {
                ff: f,
                head_norm,
                bias,
                post_norm,
                glu,
            } => format!(
                "DECODE_LAYER{}{}{}_{}",
                extra(bias, head_norm),
                if post_norm { "_POST_NORM" } else { "" },
                ff(f),
                glu.name()
            ),
        }
    }

    /// The fused kernel a kernel op name is, if it is one.
    pub fn of(op: &str) -> Option<Fused> {
        /// Whether `rest` starts with `prefix`, and what follows it.
        fn flag<'a>(rest: &'a str, prefix: &str) -> (bool, &'a str) {
            match rest.strip_prefix(prefix) {
                Some(r) => (true, r),
                None => (false, rest),
            }
        }
        let glu = |prefix: &str| op.strip_prefix(prefix).and_then(Glu::of);
        // `<stem>[_BIAS][_HEAD_NORM]`: (bias, head_norm, the rest).
        let own = |stem: &str| {
            let (bias, rest) = flag(op.strip_prefix(stem)?, "_BIAS");
            let (head_norm, rest) = flag(rest, "_HEAD_NORM");
            Some((bias, head_norm, rest))
        };
        // `<stem>[_BIAS][_HEAD_NORM]_ROPE[_FF]`: (bias, head_norm, ff).
        let rotated = |stem: &str| {
            let (bias, head_norm, rest) = own(stem)?;
            match rest {
                "_ROPE" => Some((bias, head_norm, false)),
                "_ROPE_FF" => Some((bias, head_norm, true)),
                _ => None,
            }
        };
        match op {
            "RMS_NORM_MUL_MAT" => return Some(Fused::RmsNormMulMat),
            "RMS_NORM_MUL_MAT_BIAS" => return Some(Fused::RmsNormMulMatBias),
            _ => {}
        }
        if let Some((bias, head_norm, ff)) = rotated("RMS_NORM_MUL_MAT") {
            return Some(Fused::RmsNormMulMatRope {
                ff,
                head_norm,
                bias,
            });
        }
        if let Some((bias, head_norm, ff)) = rotated("RMS_NORM_QKV") {
            return Some(Fused::RmsNormQkvRope {
                ff,
                head_norm,
                bias,
            });
        }
        // `DECODE_LAYER[_BIAS][_HEAD_NORM][_POST_NORM][_FF]_<GLU>`.
        if let Some((bias, head_norm, rest)) = own("DECODE_LAYER") {
            let (post_norm, rest) = flag(rest, "_POST_NORM");
            let (ff, rest) = flag(rest, "_FF");
            return rest
                .strip_prefix('_')
                .and_then(Glu::of)
                .map(|glu| Fused::DecodeLayer {
                    ff,
                    head_norm,
                    bias,
                    post_norm,
                    glu,
                });
        }
        type Family = fn(Glu) -> Fused;
        let families: [(&str, Family); 6] = [
            ("MUL_MAT_ADD_RMS_NORM_FFN_", Fused::MulMatAddRmsNormFfn),
            ("RMS_NORM_MUL_MAT_", Fused::RmsNormMulMatGlu),
            ("RMS_NORM_FFN_", Fused::RmsNormFfn),
            ("FLASH_ATTN_FFN_", Fused::FlashAttnFfn),
            ("FLASH_ATTN_GLU_", Fused::FlashAttnGlu),
            ("MUL_MAT_", Fused::MulMatGlu),
        ];
        families
            .into_iter()
            .find_map(|(prefix, family)| glu(prefix).map(family))
    }

    /// The input index of the attention's K cache view, followed by V's and the mask's, for
    /// the kernels attending over a KV cache with one query row (a decode step).
    pub fn kv_inputs(self) -> Option<usize> {
        match self {
            Fused::FlashAttnFfn(_) | Fused::FlashAttnGlu(_) => Some(1),
            // Wq, Wk, Wv, x, n_attn, the positions, (the factors,) (the Q/K/V kernel's own
            // inputs: three biases or two heads' norm weights,) k, v, the mask, ...
            Fused::DecodeLayer {
                ff,
                head_norm,
                bias,
                ..
            } => Some(6 + usize::from(ff) + 2 * usize::from(head_norm) + 3 * usize::from(bias)),
            _ => None,
        }
    }

    /// Its catalogue entry (`None` when the catalogue has no such kernel).
    pub fn entry(self) -> Option<&'static OpEntry> {
        OpEntry::by_name(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fused_kernel_of_the_catalogue_reads_back_as_its_name() {
        let mut fused = 0;
        for entry in crate::op_catalogue::CATALOGUE {
            if let Some(f) = Fused::of(entry.name) {
                assert_eq!(f.name(), entry.name);
                assert_eq!(f.entry(), Some(entry));
                fused += 1;
            }
        }
        // Every family with each of its parameters (DECODE_LAYER: plain and _FF, _BIAS and
        // _HEAD_NORM, _POST_NORM and _HEAD_NORM_POST_NORM).
        let glus = Glu::ALL.len();
        assert_eq!(fused, 6 * glus + 6 * glus + 2 + 6 + 6);
        assert_eq!(Fused::of("MUL_MAT"), None);
        assert_eq!(Fused::of("MUL_MAT_ADD"), None);
        assert_eq!(Fused::of("RMS_NORM_MUL_MAT_ROPE_X"), None);
    }
}
