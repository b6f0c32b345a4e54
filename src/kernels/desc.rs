//! Kernel descriptions: what one kernel computes (op, parameters, operand layouts), the compile
//! request sent to the JIT compiler, and the canonical kernel name derived from it.
//!
//! A description is made after the planner's transforms (element-wise ops on contiguous data are
//! flattened to one dimension), so one kernel serves every shape with the same element count.

use serde::{Deserialize, Serialize};

use super::Arch;

/// The element types a kernel operand may have, by ggml's name: elements per block (1 for the
/// types stored one element at a time) and bytes per block. Block-quantized operands are laid
/// out as ggml lays them out: `nb[0]` is the block size in bytes, rows are whole blocks.
pub const DTYPES: [(&str, u64, u64); 14] = [
    ("f32", 1, 4),
    ("f16", 1, 2),
    ("bf16", 1, 2),
    ("i8", 1, 1),
    ("i16", 1, 2),
    ("i32", 1, 4),
    ("i64", 1, 8),
    ("q4_0", 32, 18),
    ("q8_0", 32, 34),
    ("q4_K", 256, 144),
    ("q4_1", 32, 20),
    ("q5_0", 32, 22),
    ("q5_K", 256, 176),
    ("q6_K", 256, 210),
];

/// `(elements per block, bytes per block)` of `dtype`, for the types a kernel operand may have.
pub fn dtype_block(dtype: &str) -> Option<(u64, u64)> {
    DTYPES
        .iter()
        .find(|(n, _, _)| *n == dtype)
        .map(|&(_, block, bytes)| (block, bytes))
}

/// One operand of a kernel: element type, elements per dimension and byte strides (ggml's
/// `ne`/`nb`, dimension 0 first).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    #[serde(rename = "type")]
    pub dtype: String,
    pub ne: [i64; 4],
    pub nb: [u64; 4],
}

impl Layout {
    /// A dense row-major layout of `ne` elements of `elem_size` bytes.
    pub fn contiguous(dtype: &str, elem_size: u64, ne: [i64; 4]) -> Layout {
        let mut nb = [elem_size; 4];
        for d in 1..4 {
            nb[d] = nb[d - 1] * ne[d - 1].max(1) as u64;
        }
        Layout {
            dtype: dtype.to_owned(),
            ne,
            nb,
        }
    }

    /// The dense row-major layout of `ne` elements of `dtype` (rows of whole blocks for the
    /// block-quantized types), if `dtype` is one of [`DTYPES`].
    pub fn dense(dtype: &str, ne: [i64; 4]) -> Option<Layout> {
        let (block, bytes) = dtype_block(dtype)?;
        let mut layout = Layout::contiguous(dtype, bytes, ne);
        for d in 1..4 {
            layout.nb[d] /= block;
        }
        Some(layout)
    }

    /// Row-major and dense (dimensions of size 1 may have any stride). Dimension 0 of a
    /// block-quantized type is stepped over in blocks.
    pub fn is_dense(&self) -> bool {
        // Dimension 0 must step by one element (block): a view whose elements lie apart (a
        // column of a transposed matrix, a config's `(4,1,1,1)/f32/(8,...)`) is strided even when
        // its other dimensions are 1.
        let (block, bytes) = dtype_block(&self.dtype).unwrap_or((1, self.nb[0]));
        // `None` once the dense stride no longer fits in 64 bits (strides come from configs
        // too, where any number can be written): no later stepped-over dimension can match it.
        let mut expect = Some(bytes);
        for d in 0..4 {
            if self.ne[d] != 1 && Some(self.nb[d]) != expect {
                return false;
            }
            let n = self.ne[d].max(1) as u64;
            expect = expect.and_then(|e| e.checked_mul(if d == 0 { n / block } else { n }));
        }
        true
    }

    /// The same layout with the stride of every dimension of size 1 after the first set as if
    /// the dimensions up to it were dense: such a stride addresses nothing, and a view of some of
    /// a tensor's rows would otherwise carry the whole tensor's size into its kernel's name.
    pub fn canonical(&self) -> Layout {
        let (block, _) = dtype_block(&self.dtype).unwrap_or((1, self.nb[0]));
        let mut out = self.clone();
        for d in 1..4 {
            if self.ne[d] == 1 {
                let steps = self.ne[d - 1].max(1) as u64 / if d == 1 { block } else { 1 };
                out.nb[d] = out.nb[d - 1].saturating_mul(steps);
            }
        }
        out
    }

    /// `f32_8x3` (trailing dimensions of 1 dropped), plus `_s4x64x192x192` for strided layouts
    /// (canonical strides); the type in lower case (`q4_k`), so names stay lower case.
    fn name_part(&self) -> String {
        let dims = self
            .ne
            .iter()
            .rposition(|&n| n != 1)
            .map_or(1, |last| last + 1);
        let ne: Vec<String> = self.ne[..dims].iter().map(i64::to_string).collect();
        let mut part = format!("{}_{}", self.dtype.to_ascii_lowercase(), ne.join("x"));
        if !self.is_dense() {
            let nb: Vec<String> = self.canonical().nb.iter().map(u64::to_string).collect();
            part.push_str(&format!("_s{}", nb.join("x")));
        }
        part
    }
}

/// What one kernel computes. Serialised (with `name` and `arch`) it is the compile request of the
/// compiler protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelDesc {
    /// The op as the compiler protocol names it: `ADD`, `GELU`, `SCALE`, ...
    pub op: String,
    /// ggml's op parameters as i32 words (trailing zeros may be omitted).
    pub op_params: Vec<i32>,
    pub inputs: Vec<Layout>,
    pub output: Layout,
    /// The outputs after `output`, for ops with several (`RMS_NORM_QKV_ROPE`: K and V after
    /// Q); the kernel receives them after `output`.
    pub extra_outputs: Vec<Layout>,
    /// The f16 operands are computed as bf16 (`GGML_HSA_F16_AS_BF16`): the kernel rounds f16
    /// inputs to bf16 before computing and its f16 outputs to bf16 precision, as a kernel fed
    /// bf16 copies of them would. Only set when some operand is f16.
    pub f16_as_bf16: bool,
    /// The KV length is given at dispatch, a multiple of this step up to the K and V operands'
    /// rows (`ops::rewrite::kv_length`): one kernel for every length a growing context takes.
    pub n_kv_step: Option<u32>,
}

/// Longest canonical name; longer descriptions end in a hash of the full name instead.
const MAX_NAME: usize = 160;

#[derive(Serialize)]
struct Request<'a> {
    name: &'a str,
    arch: &'a str,
    op: &'a str,
    op_params: &'a [i32],
    inputs: &'a [Layout],
    output: &'a Layout,
    #[serde(skip_serializing_if = "<[Layout]>::is_empty")]
    extra_outputs: &'a [Layout],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    f16_as_bf16: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    n_kv_step: Option<u32>,
}

impl KernelDesc {
    /// The canonical kernel name:
    /// `<op>-<input>...-<output>[-<extra output>...][-p<params>][-kv<step>][-f16asbf16]`,
    /// each operand as
    /// `<type>_<ne0>x<ne1>...` (plus `_s<strides>` when strided), op parameters as hex words with
    /// trailing zeros dropped. Stable across runs, builds and machines; file-name safe
    /// (`[a-z0-9_x-]`). Names longer than 160 characters keep their first 143 characters and end
    /// in `-h` + the FNV-1a-64 hash of the full name.
    pub fn canonical_name(&self) -> String {
        let mut parts = vec![self.op.to_ascii_lowercase()];
        parts.extend(self.inputs.iter().map(Layout::name_part));
        parts.push(self.output.name_part());
        parts.extend(self.extra_outputs.iter().map(Layout::name_part));
        let used = self
            .op_params
            .iter()
            .rposition(|&p| p != 0)
            .map_or(0, |last| last + 1);
        if used > 0 {
            let words: Vec<String> = self.op_params[..used]
                .iter()
                .map(|p| format!("{:x}", *p as u32))
                .collect();
            parts.push(format!("p{}", words.join("_")));
        }
        if let Some(step) = self.n_kv_step {
            parts.push(format!("kv{step}"));
        }
        if self.f16_as_bf16 {
            parts.push("f16asbf16".into());
        }
        let name = parts.join("-");
        if name.len() <= MAX_NAME {
            return name;
        }
        let hash = format!("-h{:016x}", fnv1a64(name.as_bytes()));
        format!("{}{hash}", &name[..MAX_NAME - hash.len()])
    }

    /// How many operands the kernel takes at dispatch: the inputs, then every output.
    pub fn operand_count(&self) -> usize {
        self.inputs.len() + 1 + self.extra_outputs.len()
    }

    /// The compile request (protocol 1) for `arch`, as JSON.
    pub fn request_json(&self, arch: Arch) -> String {
        self.request_json_named(arch, &self.canonical_name())
    }

    /// The compile request for `arch` with the kernel files called `name` instead of the canonical
    /// name: `ggml-hsa-gen-kernels` honours a config's `exported_name` this way.
    /// The operands' strides are the canonical ones the name carries ([`Layout::canonical`]).
    pub fn request_json_named(&self, arch: Arch, name: &str) -> String {
        let inputs: Vec<Layout> = self.inputs.iter().map(Layout::canonical).collect();
        let extra_outputs: Vec<Layout> = self.extra_outputs.iter().map(Layout::canonical).collect();
        serde_json::to_string(&Request {
            name,
            arch: arch.name(),
            op: &self.op,
            op_params: &self.op_params,
            inputs: &inputs,
            output: &self.output.canonical(),
            extra_outputs: &extra_outputs,
            f16_as_bf16: self.f16_as_bf16,
            n_kv_step: self.n_kv_step,
        })
        .expect("kernel descriptions always serialise")
    }
}

/// FNV-1a, 64 bits: a fixed, documented hash (std's hasher may change between Rust releases).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(ne: [i64; 4]) -> KernelDesc {
        let t = Layout::contiguous("f32", 4, ne);
        KernelDesc {
            op: "ADD".into(),
            op_params: vec![],
            inputs: vec![t.clone(), t.clone()],
            output: t,
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        }
    }

    #[test]
    fn names_are_readable_and_stable() {
        assert_eq!(
            add([4096, 1, 1, 1]).canonical_name(),
            "add-f32_4096-f32_4096-f32_4096"
        );
        let mut d = add([8, 3, 1, 1]);
        d.inputs[1] = Layout::contiguous("bf16", 2, [8, 1, 1, 1]);
        d.op_params = vec![0x3f80_0000, 0, 0];
        assert_eq!(d.canonical_name(), "add-f32_8x3-bf16_8-f32_8x3-p3f800000");
        // A transposed input carries its strides; those of dimensions of size 1 address
        // nothing and are named as if the dimensions before were dense, so that a view of
        // some of a tensor's rows is named by their count alone.
        d.inputs[0].nb = [12, 4, 96, 96];
        assert_eq!(
            d.canonical_name(),
            "add-f32_8x3_s12x4x12x12-bf16_8-f32_8x3-p3f800000"
        );
        let mut rows_of_a_larger_tensor = d.clone();
        rows_of_a_larger_tensor.inputs[0].nb = [12, 4, 1200, 1200];
        assert_eq!(rows_of_a_larger_tensor.canonical_name(), d.canonical_name());
        assert_eq!(
            rows_of_a_larger_tensor.request_json(Arch::Aie2p),
            d.request_json(Arch::Aie2p)
        );
    }

    #[test]
    fn quantized_operands_are_dense_in_blocks_and_named_in_lower_case() {
        let w = Layout::dense("q4_K", [512, 3, 2, 1]).unwrap();
        assert_eq!(w.nb, [144, 288, 864, 1728]);
        assert!(w.is_dense());
        let x = Layout::contiguous("f32", 4, [512, 5, 2, 1]);
        let d = KernelDesc {
            op: "MUL_MAT".into(),
            op_params: vec![],
            inputs: vec![w.clone(), x],
            output: Layout::contiguous("f32", 4, [3, 5, 2, 1]),
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        };
        assert_eq!(
            d.canonical_name(),
            "mul_mat-q4_k_512x3x2-f32_512x5x2-f32_3x5x2"
        );
        // A permuted batch keeps its strides in the name.
        let mut p = w;
        p.nb = [144, 576, 288, 1728];
        assert!(!p.is_dense());
        assert_eq!(p.name_part(), "q4_k_512x3x2_s144x576x288x576");
        assert_eq!(Layout::dense("q5_1", [256, 1, 1, 1]), None);
        let q8 = Layout::dense("q8_0", [64, 2, 1, 1]).unwrap();
        assert_eq!(q8.nb, [34, 68, 136, 136]);
    }

    #[test]
    fn long_names_end_in_a_hash_and_stay_distinct() {
        let mut a = add([1, 2, 3, 4]);
        a.op_params = (1..16).collect();
        a.inputs.extend(std::iter::repeat_n(a.output.clone(), 12));
        let mut b = a.clone();
        b.op_params[14] = 99;
        let (na, nb) = (a.canonical_name(), b.canonical_name());
        assert_eq!(na.len(), MAX_NAME);
        assert_ne!(na, nb);
        assert!(na.contains("-h"));
        assert!(na
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-".contains(&c)));
    }

    #[test]
    fn fnv_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn the_request_is_the_protocol_json() {
        let json = add([4, 1, 1, 1]).request_json(Arch::Aie2);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["name"], "add-f32_4-f32_4-f32_4");
        assert_eq!(v["arch"], "aie2");
        assert_eq!(v["inputs"][0]["type"], "f32");
        assert_eq!(v["output"]["nb"][1], 16);
    }
}
