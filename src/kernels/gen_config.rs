//! Kernel configs: the JSON files `ggml-hsa-gen-kernels` reads to pregenerate kernels.
//!
//! A config lists kernels the way the IRON kernel package names them (a kernel function in a
//! Python source file) with their operands as text descriptors, so it can be written by hand:
//!
//! ```json
//! {"kernels": [{"kernel_name": "ggml_op_add", "kernel_source": "binary_ops.py", "arch": "aie2p",
//!               "input_tensors": ["(1024,1,1,1)/f32", "(1024,1,1,1)/f32"],
//!               "output_tensor": "(1024,1,1,1)/f32",
//!               "exported_name": "add-f32_1024-f32_1024-f32_1024"}]}
//! ```
//!
//! Each entry maps onto one [`KernelDesc`] (and back), so a config entry and a compile request
//! of the backend describe the same kernel. The backend looks kernels up by canonical name only;
//! an `exported_name` other than the canonical one produces files the backend never finds.
//!
//! Tensor descriptors are `(ne0,ne1,ne2,ne3)/dtype[/(nb0,nb1,nb2,nb3)]`: ggml's elements per
//! dimension, the element type and optionally ggml's **byte** strides (dense when omitted).

use serde::{Deserialize, Serialize};

use super::desc::{dtype_block, KernelDesc, Layout};
use super::Arch;
use crate::op_catalogue::{self as catalogue, OpEntry};

/// Bytes per element (per block for the block-quantized types) of `dtype`, for the types a
/// descriptor may name (the kernel operand types, [`DTYPES`]).
pub fn dtype_size(dtype: &str) -> Option<u64> {
    dtype_block(dtype).map(|(_, bytes)| bytes)
}

/// What is wrong with a kernel config. Messages quote the offending text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid kernel config: {0}")]
    Json(String),
    #[error(
        "invalid tensor descriptor {text:?}: {reason} \
         (expected (d0,d1,d2,d3)/dtype or (d0,d1,d2,d3)/dtype/(s0,s1,s2,s3))"
    )]
    InvalidTensor { text: String, reason: String },
    #[error("shape must have exactly 4 dimensions: {text:?} has {count}")]
    ShapeDims { text: String, count: usize },
    #[error(
        "unknown dtype {dtype:?} in {text:?} (supported: f32, f16, bf16, i8, i16, i32, i64, \
         q4_0, q4_1, q5_0, q8_0, q4_K, q5_K, q6_K)"
    )]
    UnknownDtype { text: String, dtype: String },
    #[error("strides must have 4 values: {text:?} has {count}")]
    StrideCount { text: String, count: usize },
    #[error("invalid {what} {value:?} in tensor descriptor {text:?}: {reason}")]
    InvalidNumber {
        text: String,
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error(
        "stride {stride} of dimension {dim} in {text:?} is not a multiple of the {dtype} {unit} \
         size ({size} bytes): strides are byte strides (ggml nb)"
    )]
    MisalignedStride {
        text: String,
        dim: usize,
        stride: u64,
        dtype: String,
        /// `element`, or `block` for the block-quantized types.
        unit: &'static str,
        size: u64,
    },
    #[error("kernel source not found: {}", source_hint(.kernel_name, .kernel_source, *.defined_in))]
    KernelSourceNotFound {
        kernel_name: String,
        kernel_source: String,
        /// The source that does define `kernel_name`, if any.
        defined_in: Option<&'static str>,
    },
    #[error("unknown arch {0:?} (supported: aie2, aie2p)")]
    UnknownArch(String),
    #[error("{kernel_name} takes {expected} input tensor(s), the entry lists {got}")]
    InputCount {
        kernel_name: String,
        expected: usize,
        got: usize,
    },
    #[error("{kernel_name} takes at most {max} op_params, the entry has {got}")]
    TooManyParams {
        kernel_name: String,
        max: usize,
        got: usize,
    },
    #[error(
        "invalid exported_name {0:?}: it must be 1-200 characters of [A-Za-z0-9_.-] \
         not starting with '.' (it names the kernel files)"
    )]
    InvalidExportedName(String),
}

fn source_hint(kernel_name: &str, kernel_source: &str, defined_in: Option<&str>) -> String {
    match defined_in {
        Some(source) => format!(
            "{kernel_source:?} does not define kernel {kernel_name:?}, which is in {source:?}"
        ),
        None => {
            let mut sources: Vec<&str> = catalogue::CATALOGUE
                .iter()
                .filter_map(|e| e.iron_source)
                .collect();
            sources.dedup();
            format!(
                "no kernel source defines kernel {kernel_name:?} (the entry says \
                 {kernel_source:?}; known sources: {})",
                sources.join(", ")
            )
        }
    }
}

/// Parses `(ne0,ne1,ne2,ne3)/dtype[/(nb0,nb1,nb2,nb3)]`. Strides are byte strides and default to
/// a dense layout.
pub fn parse_tensor(s: &str) -> Result<Layout, ConfigError> {
    let invalid = |reason: &str| ConfigError::InvalidTensor {
        text: s.to_owned(),
        reason: reason.to_owned(),
    };
    let (shape, rest) = parenthesised(s.trim())
        .ok_or_else(|| invalid("the shape must be written in parentheses"))?;
    let rest = rest
        .strip_prefix('/')
        .ok_or_else(|| invalid("the shape must be followed by /dtype"))?;
    let (dtype, strides) = match rest.split_once('/') {
        Some((dtype, strides)) => (dtype.trim(), Some(strides.trim())),
        None => (rest.trim(), None),
    };

    let dims = list(shape);
    if dims.len() != 4 {
        return Err(ConfigError::ShapeDims {
            text: s.to_owned(),
            count: dims.len(),
        });
    }
    let mut ne = [0i64; 4];
    for (n, v) in ne.iter_mut().zip(&dims) {
        *n =
            v.parse::<i64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| ConfigError::InvalidNumber {
                    text: s.to_owned(),
                    what: "dimension",
                    value: (*v).to_owned(),
                    reason: "dimensions are positive integers (1 for unused dimensions)",
                })?;
    }

    if dtype.is_empty() {
        return Err(invalid("the dtype is missing"));
    }
    let (block, size) = dtype_block(dtype).ok_or_else(|| ConfigError::UnknownDtype {
        text: s.to_owned(),
        dtype: dtype.to_owned(),
    })?;
    if !(ne[0] as u64).is_multiple_of(block) {
        return Err(invalid(&format!(
            "{dtype} rows are whole blocks: dimension 0 must be a multiple of {block}"
        )));
    }
    // Layout::contiguous multiplies the dimensions; refuse sizes that would overflow rather
    // than panic or wrap.
    if ne
        .iter()
        .try_fold(size, |acc, &n| acc.checked_mul(n as u64))
        .is_none()
    {
        return Err(invalid(
            "the tensor's size in bytes does not fit in 64 bits",
        ));
    }
    let mut layout = Layout::dense(dtype, ne).expect("a known dtype");

    if let Some(strides) = strides {
        let (values, rest) = parenthesised(strides)
            .ok_or_else(|| invalid("the strides must be written in parentheses"))?;
        if !rest.trim().is_empty() {
            return Err(invalid("unexpected text after the strides"));
        }
        let values = list(values);
        if values.len() != 4 {
            return Err(ConfigError::StrideCount {
                text: s.to_owned(),
                count: values.len(),
            });
        }
        for (nb, v) in layout.nb.iter_mut().zip(&values) {
            *nb = v.parse::<u64>().map_err(|_| ConfigError::InvalidNumber {
                text: s.to_owned(),
                what: "stride",
                value: (*v).to_owned(),
                reason: "strides are non-negative integers (bytes)",
            })?;
        }
        // A stride that splits an element is a mistake (often element strides given where ggml
        // wants bytes). Dimensions of size 1 are never stepped over, so their stride is free.
        for dim in 0..4 {
            let stride = layout.nb[dim];
            if layout.ne[dim] > 1 && !stride.is_multiple_of(size) {
                return Err(ConfigError::MisalignedStride {
                    text: s.to_owned(),
                    dim,
                    stride,
                    dtype: dtype.to_owned(),
                    unit: if block > 1 { "block" } else { "element" },
                    size,
                });
            }
        }
    }
    Ok(layout)
}

/// `(inside)rest` -> (`inside`, `rest`).
fn parenthesised(s: &str) -> Option<(&str, &str)> {
    s.strip_prefix('(')?.split_once(')')
}

/// The comma-separated items of `s`, trimmed; none for an empty `s`.
fn list(s: &str) -> Vec<&str> {
    if s.trim().is_empty() {
        Vec::new()
    } else {
        s.split(',').map(str::trim).collect()
    }
}

/// Writes `t` as a descriptor [`parse_tensor`] reads back to `t`: strides only when they are not
/// the dense ones.
pub fn format_tensor(t: &Layout) -> String {
    let join = |v: &[String]| v.join(",");
    let ne: Vec<String> = t.ne.iter().map(i64::to_string).collect();
    let mut text = format!("({})/{}", join(&ne), t.dtype);
    let dense = Layout::dense(&t.dtype, t.ne).is_some_and(|d| d.nb == t.nb);
    if !dense {
        let nb: Vec<String> = t.nb.iter().map(u64::to_string).collect();
        text.push_str(&format!("/({})", join(&nb)));
    }
    text
}

/// A kernel config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelConfig {
    pub kernels: Vec<KernelEntry>,
}

/// One kernel of a config.
// Unknown fields are refused so that a misspelt optional field (`exported_nmae`) is an error
// instead of silently producing a kernel under another name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelEntry {
    /// `ggml_op_<op>` (an op of [`catalogue::CATALOGUE`]).
    pub kernel_name: String,
    /// The IRON design file defining the kernel (`binary_ops.py`, ...); empty or absent for
    /// ops without an IRON design (the catalogue's `iron_source`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_source: String,
    /// `aie2` or `aie2p`.
    pub arch: String,
    /// Tensor descriptors of the inputs, in kernel order.
    pub input_tensors: Vec<String>,
    pub output_tensor: String,
    /// Tensor descriptors of the outputs after the first, for ops with several (an extension
    /// of the IRON config format, as `op_params` is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_output_tensors: Vec<String>,
    /// The kernel files' name; the canonical name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_name: Option<String>,
    /// ggml's op parameters as i32 words (SCALE: scale and bias, CLAMP: min and max, as f32 bit
    /// patterns). An extension of the IRON config format, which has no way to express them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_params: Option<Vec<i32>>,
    /// `true`: the kernel computes its f16 operands as bf16 (`GGML_HSA_F16_AS_BF16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub f16_as_bf16: Option<bool>,
    /// The kernel is told its KV length at dispatch, in these steps (`KernelDesc::n_kv_step`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_kv_step: Option<u32>,
}

impl KernelConfig {
    pub fn parse(json: &str) -> Result<KernelConfig, ConfigError> {
        serde_json::from_str(json).map_err(|e| ConfigError::Json(e.to_string()))
    }

    /// The config as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("kernel configs always serialise")
    }
}

impl KernelEntry {
    /// The entry describing `desc` for `arch`, exported under its canonical name, with the
    /// catalogue's IRON source of the op (none for ops without an IRON design).
    pub fn from_desc(desc: &KernelDesc, arch: Arch) -> KernelEntry {
        let source = OpEntry::by_name(&desc.op)
            .and_then(|e| e.iron_source)
            .unwrap_or("");
        KernelEntry {
            kernel_name: catalogue::kernel_name(&desc.op),
            kernel_source: source.to_owned(),
            arch: arch.name().to_owned(),
            input_tensors: desc.inputs.iter().map(format_tensor).collect(),
            output_tensor: format_tensor(&desc.output),
            extra_output_tensors: desc.extra_outputs.iter().map(format_tensor).collect(),
            exported_name: Some(desc.canonical_name()),
            op_params: (!desc.op_params.is_empty()).then(|| desc.op_params.clone()),
            f16_as_bf16: desc.f16_as_bf16.then_some(true),
            n_kv_step: desc.n_kv_step,
        }
    }

    /// The kernel this entry describes, and its architecture.
    pub fn to_desc(&self) -> Result<(Arch, KernelDesc), ConfigError> {
        let kind = self.kind()?;
        let arch = Arch::from_agent_name(&self.arch)
            .ok_or_else(|| ConfigError::UnknownArch(self.arch.clone()))?;
        if self.input_tensors.len() != kind.inputs {
            return Err(ConfigError::InputCount {
                kernel_name: self.kernel_name.clone(),
                expected: kind.inputs,
                got: self.input_tensors.len(),
            });
        }
        let op_params = self.op_params.clone().unwrap_or_default();
        if op_params.len() > kind.params {
            return Err(ConfigError::TooManyParams {
                kernel_name: self.kernel_name.clone(),
                max: kind.params,
                got: op_params.len(),
            });
        }
        if let Some(name) = &self.exported_name {
            if !is_file_name(name) {
                return Err(ConfigError::InvalidExportedName(name.clone()));
            }
        }
        let inputs = self
            .input_tensors
            .iter()
            .map(|t| parse_tensor(t))
            .collect::<Result<Vec<_>, _>>()?;
        let output = parse_tensor(&self.output_tensor)?;
        let extra_outputs = self
            .extra_output_tensors
            .iter()
            .map(|t| parse_tensor(t))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((
            arch,
            KernelDesc {
                op: kind.name.to_owned(),
                op_params,
                inputs,
                output,
                extra_outputs,
                f16_as_bf16: self.f16_as_bf16.unwrap_or(false),
                n_kv_step: self.n_kv_step,
            },
        ))
    }

    /// The catalogue row of this entry's kernel, checking that `kernel_source` is the IRON
    /// design defining it (empty for an op without one).
    fn kind(&self) -> Result<&'static OpEntry, ConfigError> {
        let kind = OpEntry::by_kernel_name(&self.kernel_name);
        match kind {
            Some(k) if k.iron_source.unwrap_or("") == self.kernel_source => Ok(k),
            _ => Err(ConfigError::KernelSourceNotFound {
                kernel_name: self.kernel_name.clone(),
                kernel_source: self.kernel_source.clone(),
                defined_in: kind.map(|k| {
                    k.iron_source
                        .unwrap_or("(no IRON design: leave kernel_source out)")
                }),
            }),
        }
    }

    /// The name the kernel files get: `exported_name`, else the canonical name of `desc`.
    pub fn file_name(&self, desc: &KernelDesc) -> String {
        self.exported_name
            .clone()
            .unwrap_or_else(|| desc.canonical_name())
    }
}

/// A name usable for `<name>.pdi` in any directory: the same rule hsa-sim-compile applies to
/// request names, so a name the tool accepts is one a compiler can write.
fn is_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::super::desc::DTYPES;
    use super::*;

    fn err(s: &str) -> String {
        parse_tensor(s).unwrap_err().to_string()
    }

    #[test]
    fn descriptors_parse_with_dense_or_given_byte_strides() {
        let t = parse_tensor("(1024,1,1,1)/f32").unwrap();
        assert_eq!(t, Layout::contiguous("f32", 4, [1024, 1, 1, 1]));
        let t = parse_tensor(" ( 1024, 768 ,1,1 )/bf16 ").unwrap();
        assert_eq!(t.nb, [2, 2048, 1_572_864, 1_572_864]);
        assert_eq!(t.dtype, "bf16");
        let t = parse_tensor("(16,5,4,3)/f32/(80,4,20,1280)").unwrap();
        assert_eq!(t.ne, [16, 5, 4, 3]);
        assert_eq!(t.nb, [80, 4, 20, 1280]);
        for (dtype, block, size) in DTYPES {
            let t = parse_tensor(&format!("({},2,1,1)/{dtype}", 3 * block)).unwrap();
            assert_eq!(t.nb[..2], [size, 3 * size]);
        }
        // Block-quantized rows: nb[0] is the block's bytes.
        let t = parse_tensor("(512,3,1,1)/q4_K").unwrap();
        assert_eq!(t.nb, [144, 288, 864, 864]);
        let t = parse_tensor("(64,4,2,1)/q8_0/(34,136,68,272)").unwrap();
        assert_eq!(t.nb, [34, 136, 68, 272]);
        // Size-1 dimensions are never stepped over: any stride is fine there.
        let t = parse_tensor("(8,1,1,1)/f16/(2,3,5,7)").unwrap();
        assert_eq!(t.nb, [2, 3, 5, 7]);
    }

    #[test]
    fn bad_descriptors_say_what_is_wrong_and_quote_it() {
        let cases = [
            (
                "1024,1,1,1/f32",
                "invalid tensor descriptor \"1024,1,1,1/f32\"",
            ),
            ("(1024,1,1,1)", "must be followed by /dtype"),
            ("(1024,1,1,1)f32", "must be followed by /dtype"),
            ("(1024,1,1,1", "the shape must be written in parentheses"),
            ("(1024,1,1,1)/", "the dtype is missing"),
            (
                "(1024,1,1)/f32",
                "shape must have exactly 4 dimensions: \"(1024,1,1)/f32\" has 3",
            ),
            (
                "()/f32",
                "shape must have exactly 4 dimensions: \"()/f32\" has 0",
            ),
            ("(1,1,1,1,1)/f32", "has 5"),
            (
                "(1024,1,1,1)/f64",
                "unknown dtype \"f64\" in \"(1024,1,1,1)/f64\"",
            ),
            ("(4,1,1,1)/F32", "unknown dtype \"F32\""),
            (
                "(4,4,1,1)/f32/(4,16)",
                "strides must have 4 values: \"(4,4,1,1)/f32/(4,16)\" has 2",
            ),
            (
                "(4,4,1,1)/f32/4,16,64,64",
                "strides must be written in parentheses",
            ),
            (
                "(4,4,1,1)/f32/(4,16,64,64)x",
                "unexpected text after the strides",
            ),
            (
                "(4,4,1,1)/f32/(4,16,64,64)/(1,1,1,1)",
                "unexpected text after",
            ),
            (
                "(4,x,1,1)/f32",
                "invalid dimension \"x\" in tensor descriptor",
            ),
            ("(4,0,1,1)/f32", "invalid dimension \"0\""),
            ("(4,-2,1,1)/f32", "positive integers"),
            ("(4,,1,1)/f32", "invalid dimension \"\""),
            ("(4,4,1,1)/f32/(4,-16,64,64)", "invalid stride \"-16\""),
            (
                "(1024,1,1,1)/f32/(1,1024,1048576,1048576)",
                "stride 1 of dimension 0 in \"(1024,1,1,1)/f32/(1,1024,1048576,1048576)\" is not \
                 a multiple of the f32 element size (4 bytes): strides are byte strides",
            ),
            ("(9223372036854775807,2,1,1)/f32", "does not fit in 64 bits"),
            (
                "(48,2,1,1)/q4_0",
                "q4_0 rows are whole blocks: dimension 0 must be a multiple of 32",
            ),
            ("(256,1,1,1)/q4_k", "unknown dtype \"q4_k\""),
            (
                "(64,2,1,1)/q8_0/(34,60,120,120)",
                "stride 60 of dimension 1 in \"(64,2,1,1)/q8_0/(34,60,120,120)\" is not a \
                 multiple of the q8_0 block size (34 bytes)",
            ),
        ];
        for (text, message) in cases {
            let e = err(text);
            assert!(e.contains(message), "{text}: {e}");
        }
        assert!(err("1024/f32").starts_with("invalid tensor descriptor"));
    }

    #[test]
    fn formatting_round_trips() {
        for text in [
            "(1024,1,1,1)/f32",
            "(8,3,2,1)/i8",
            "(16,5,4,3)/f32/(80,4,20,1280)",
            "(8,1,1,1)/f16/(2,3,5,7)",
            "(4,4,1,1)/i32/(0,16,64,64)",
            "(512,3,1,1)/q4_K",
            "(64,4,2,1)/q8_0/(34,136,68,272)",
        ] {
            let t = parse_tensor(text).unwrap();
            assert_eq!(format_tensor(&t), text);
            assert_eq!(parse_tensor(&format_tensor(&t)).unwrap(), t);
        }
        // A dense layout given explicitly is written without its strides.
        let t = parse_tensor("(4,4,1,1)/bf16/(2,8,32,32)").unwrap();
        assert_eq!(format_tensor(&t), "(4,4,1,1)/bf16");
    }

    fn entry(kernel_name: &str, source: &str, inputs: &[&str], output: &str) -> KernelEntry {
        KernelEntry {
            kernel_name: kernel_name.into(),
            kernel_source: source.into(),
            arch: "aie2p".into(),
            input_tensors: inputs.iter().map(|s| s.to_string()).collect(),
            output_tensor: output.into(),
            extra_output_tensors: Vec::new(),
            exported_name: None,
            op_params: None,
            f16_as_bf16: None,
            n_kv_step: None,
        }
    }

    #[test]
    fn entries_become_descriptions() {
        let t = "(1024,1,1,1)/f32";
        let e = entry("ggml_op_add", "binary_ops.py", &[t, t], t);
        let (arch, desc) = e.to_desc().unwrap();
        assert_eq!(arch, Arch::Aie2p);
        assert_eq!(desc.op, "ADD");
        assert_eq!(desc.canonical_name(), "add-f32_1024-f32_1024-f32_1024");
        assert_eq!(e.file_name(&desc), "add-f32_1024-f32_1024-f32_1024");
        let named = KernelEntry {
            exported_name: Some("add_f32_1024".into()),
            ..e.clone()
        };
        assert_eq!(named.file_name(&desc), "add_f32_1024");

        let mut s = entry("ggml_op_scale", "unary_ops.py", &[t], t);
        s.op_params = Some(vec![0x4000_0000, 0]);
        s.arch = "aie2".into();
        let (arch, desc) = s.to_desc().unwrap();
        assert_eq!(arch, Arch::Aie2);
        assert_eq!(desc.op_params, [0x4000_0000, 0]);
        assert_eq!(desc.canonical_name(), "scale-f32_1024-f32_1024-p40000000");

        let g = entry("ggml_unary_op_gelu", "unary_ops.py", &[t], t);
        assert_eq!(g.to_desc().unwrap().1.op, "GELU");
    }

    #[test]
    fn bad_entries_are_refused_with_their_reason() {
        let t = "(1024,1,1,1)/f32";
        let msg = |e: KernelEntry| e.to_desc().unwrap_err().to_string();
        assert_eq!(
            msg(entry("ggml_op_add", "unary_ops.py", &[t, t], t)),
            "kernel source not found: \"unary_ops.py\" does not define kernel \"ggml_op_add\", \
             which is in \"binary_ops.py\""
        );
        let m = msg(entry("ggml_op_softmax", "softmax.py", &[t], t));
        assert!(
            m.starts_with(
                "kernel source not found: no kernel source defines kernel \"ggml_op_softmax\" \
                 (the entry says \"softmax.py\""
            ),
            "{m}"
        );
        // Every kernel op has an IRON design now: an entry must name its source.
        assert_eq!(
            msg(entry("ggml_op_mul_mat_add", "", &[t, t, t], t)),
            "kernel source not found: \"\" does not define kernel \"ggml_op_mul_mat_add\", \
             which is in \"mul_mat.py\""
        );
        let mut e = entry("ggml_op_relu", "unary_ops.py", &[t], t);
        e.arch = "aie4".into();
        assert_eq!(msg(e), "unknown arch \"aie4\" (supported: aie2, aie2p)");
        assert_eq!(
            msg(entry("ggml_op_sub", "binary_ops.py", &[t], t)),
            "ggml_op_sub takes 2 input tensor(s), the entry lists 1"
        );
        let mut e = entry("ggml_op_add", "binary_ops.py", &[t, t], t);
        e.op_params = Some(vec![1]);
        assert_eq!(
            msg(e),
            "ggml_op_add takes at most 0 op_params, the entry has 1"
        );
        for bad in ["", ".hidden", "a/b", "a b", "x".repeat(201).as_str()] {
            let mut e = entry("ggml_op_add", "binary_ops.py", &[t, t], t);
            e.exported_name = Some(bad.into());
            assert!(msg(e).starts_with("invalid exported_name"), "{bad:?}");
        }
        let e = entry("ggml_op_add", "binary_ops.py", &[t, "(3,1,1)/f32"], t);
        assert!(msg(e).contains("has 3"));
        let e = entry("ggml_op_neg", "unary_ops.py", &[t], "(256,1,1,1)/q5_1");
        assert!(msg(e).contains("unknown dtype \"q5_1\""));
    }

    #[test]
    fn configs_parse_and_print() {
        let json = r#"{"kernels": [{"kernel_name": "ggml_op_add", "kernel_source": "binary_ops.py",
            "arch": "aie2", "input_tensors": ["(1024,1,1,1)/f32", "(1024,1,1,1)/f32"],
            "output_tensor": "(1024,1,1,1)/f32", "exported_name": "add_f32_1024"}]}"#;
        let config = KernelConfig::parse(json).unwrap();
        assert_eq!(config.kernels.len(), 1);
        assert_eq!(
            config.kernels[0].exported_name.as_deref(),
            Some("add_f32_1024")
        );
        assert_eq!(config.kernels[0].op_params, None);
        assert_eq!(KernelConfig::parse(&config.to_json()).unwrap(), config);

        // Absent optional fields stay absent when written back.
        let mut bare = config.clone();
        bare.kernels[0].exported_name = None;
        let text = bare.to_json();
        assert!(!text.contains("exported_name") && !text.contains("op_params"));
        assert_eq!(KernelConfig::parse(&text).unwrap(), bare);

        let e = KernelConfig::parse("{\"kernels\": [")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("invalid kernel config: EOF while parsing"),
            "{e}"
        );
        let e = KernelConfig::parse(&json.replace("\"arch\"", "\"archh\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `archh`"), "{e}");
        let e = KernelConfig::parse("{}").unwrap_err().to_string();
        assert!(e.contains("missing field `kernels`"), "{e}");
    }

    #[test]
    fn entries_use_the_table_names() {
        let t = Layout::contiguous("f32", 4, [8, 1, 1, 1]);
        let desc = KernelDesc {
            op: "GELU_QUICK".into(),
            op_params: vec![],
            inputs: vec![t.clone()],
            output: t,
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        };
        let e = KernelEntry::from_desc(&desc, Arch::Aie2p);
        assert_eq!(e.kernel_name, "ggml_op_gelu_quick");
        assert_eq!(e.kernel_source, "unary_ops.py");
        assert_eq!(e.input_tensors, ["(8,1,1,1)/f32"]);
        assert_eq!(e.op_params, None);
        let unknown = KernelDesc {
            op: "CONV_2D".into(),
            ..desc
        };
        let e = KernelEntry::from_desc(&unknown, Arch::Aie2p);
        assert!(matches!(
            e.to_desc(),
            Err(ConfigError::KernelSourceNotFound { .. })
        ));
    }

    /// The shipped examples parse, and name their kernels canonically (otherwise the backend
    /// would never find the files they produce).
    #[test]
    fn the_example_configs_are_valid_and_canonical() {
        for (file, json) in [
            (
                "minimal",
                include_str!("../../share/examples/minimal-kernel-config.json"),
            ),
            (
                "example",
                include_str!("../../share/examples/example-kernel-config.json"),
            ),
        ] {
            let config = KernelConfig::parse(json).unwrap();
            assert!(!config.kernels.is_empty(), "{file}");
            for e in &config.kernels {
                let (_, desc) = e.to_desc().unwrap_or_else(|err| panic!("{file}: {err}"));
                assert_eq!(
                    e.exported_name.as_deref(),
                    Some(desc.canonical_name().as_str()),
                    "{file}"
                );
            }
        }
    }
}
