//! Tensor and node descriptors: plain copies of what the planner needs from a `ggml_tensor`,
//! made by `ffi` so that planning and execution never touch ggml pointers.

use std::fmt;

/// Element types the backend knows by name. Everything else ggml has (quantized types, i64,
/// ...) is carried as `Other` with ggml's type name so messages can say what it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
    I8,
    I16,
    I32,
    I64,
    /// A block-quantized type (Q4_0, Q8_0, Q4_K, ...), converted by ggml's own routines.
    Quant(QuantType),
    Other(&'static str),
}

/// What the planner knows of a block-quantized ggml type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantType {
    pub name: &'static str,
    /// ggml's type id, for the conversion routines.
    pub id: u32,
    /// Elements per block.
    pub block: u64,
    /// Bytes per block.
    pub block_bytes: u64,
    /// ggml can convert it to f32 (`to_float`).
    pub decode: bool,
    /// ggml can convert f32 to it (`from_float_ref`).
    pub encode: bool,
}

impl DType {
    /// The name used in kernel requests and canonical kernel names (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Quant(q) => q.name,
            DType::Other(name) => name,
        }
    }

    /// Bytes per element, for the types stored one element at a time.
    pub fn size(self) -> Option<u64> {
        match self {
            DType::I64 => Some(8),
            DType::F32 | DType::I32 => Some(4),
            DType::F16 | DType::Bf16 | DType::I16 => Some(2),
            DType::I8 => Some(1),
            DType::Quant(_) | DType::Other(_) => None,
        }
    }

    /// The floating-point types host-side copies convert between.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a tensor's data lives, as far as the backend is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// In a buffer of this backend (NPU-reachable pool memory) on the device with this index.
    Device(usize),
    /// In some other host-accessible buffer (the CPU backend's, a host buffer, ...).
    Host,
    /// In a buffer the host cannot read directly (another accelerator's memory).
    Foreign,
    /// No data yet (`data == NULL`), as in `supports_op` queries.
    Unallocated,
}

/// One tensor as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    /// Elements per dimension (ggml `ne`).
    pub ne: [i64; 4],
    /// Byte strides per dimension (ggml `nb`).
    pub nb: [u64; 4],
    /// Address of the first element (ggml `data`), 0 when unallocated.
    pub addr: u64,
    /// Bytes from `addr` to the end of the last element (`ggml_nbytes`).
    pub bytes: u64,
    pub memory: Memory,
}

impl Tensor {
    pub fn nelements(&self) -> i64 {
        self.ne.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.ne.contains(&0)
    }

    pub fn same_shape(&self, other: &Tensor) -> bool {
        self.ne == other.ne
    }

    /// Whether the rows of a quantized tensor are whole, dense blocks (ggml's layout for them).
    pub fn has_whole_blocks(&self) -> bool {
        match self.dtype {
            DType::Quant(q) => {
                q.block > 0
                    && (self.ne[0] as u64).is_multiple_of(q.block)
                    && self.nb[0] == q.block_bytes
            }
            _ => false,
        }
    }

    /// Row-major and dense, by ggml's rule: dimensions of size 1 may have any stride.
    pub fn is_contiguous(&self) -> bool {
        let Some(size) = self.dtype.size() else {
            return false;
        };
        let mut next = size;
        for d in 0..4 {
            if self.ne[d] != 1 {
                if self.nb[d] != next {
                    return false;
                }
                next *= self.ne[d] as u64;
            }
        }
        true
    }

    /// Whether this tensor's memory overlaps `u`'s.
    pub fn overlaps(&self, u: &Tensor) -> bool {
        self.addr < u.addr + u.bytes && u.addr < self.addr + self.bytes
    }

    /// Whether `self` can be repeated over `to` (ggml broadcasting: every dimension divides).
    pub fn can_repeat_to(&self, to: &Tensor) -> bool {
        !self.is_empty() && (0..4).all(|d| self.ne[d] > 0 && to.ne[d] % self.ne[d] == 0)
    }

    /// Bytes from the first element to the end of the last one (ggml_nbytes of a view).
    pub fn extent(&self) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let size = self.dtype.size().unwrap_or(0);
        (0..4)
            .map(|d| (self.ne[d] - 1) as u64 * self.nb[d])
            .sum::<u64>()
            + size
    }

    /// The view of dimension-0 elements `[start, start + len)` of this tensor.
    pub fn slice0(&self, start: i64, len: i64) -> Tensor {
        let mut t = self.clone();
        t.ne[0] = len;
        t.addr += start as u64 * self.nb[0];
        t.bytes = t.extent();
        t
    }

    /// Byte offsets of every element, in row-major logical order (dimension 0 fastest).
    pub fn element_offsets(&self) -> impl Iterator<Item = u64> + '_ {
        let [n0, n1, n2, n3] = self.ne.map(|n| n.max(0) as u64);
        let nb = self.nb;
        (0..n3).flat_map(move |i3| {
            (0..n2).flat_map(move |i2| {
                (0..n1).flat_map(move |i1| {
                    (0..n0).map(move |i0| i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3])
                })
            })
        })
    }
}

/// ggml ops the backend distinguishes. Ops it has no rule for are kept by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `NONE`, `VIEW`, `RESHAPE`, `PERMUTE`, `TRANSPOSE`: no computation, only metadata.
    Layout,
    Dup,
    Cpy,
    Cont,
    Binary(BinaryOp),
    Unary(UnaryOp),
    Scale,
    Clamp,
    /// `RMS_NORM` (`rms`) or `NORM` over each row; op_params[0] is eps.
    Norm {
        rms: bool,
    },
    /// `GLU` of kind `name` (`SWIGLU`, `GEGLU`, ...) with activation `act`: act(x) · g, where x
    /// and g are the two halves of src0's rows (swapped when op_params[1] is set) or src0 and
    /// src1.
    Glu {
        name: &'static str,
        act: UnaryOp,
    },
    /// `SOFT_MAX` (ggml's soft_max_ext): scale, optional mask (ALiBi slope from max_bias) and
    /// optional attention sinks.
    SoftMax,
    /// `ROPE`: rotary position embedding of src0 at the i32 positions src1, with optional
    /// frequency factors src2.
    Rope,
    /// `GET_ROWS`: rows of src0 picked by the i32 indices in src1.
    GetRows,
    /// `SET_ROWS`: rows of src0 written into dst at the i32/i64 indices in src1.
    SetRows,
    /// `MUL_MAT`: src0 the weights `[K, M, B2, B3]`, src1 the activations `[K, N, B2·r2, B3·r3]`.
    MulMat,
    /// `ARGMAX`: the i32 index of the largest value of each row of an f32 matrix.
    ArgMax,
    /// `COUNT_EQUAL`: how many elements of two i32 tensors are equal, as one i64.
    CountEqual,
    /// `CROSS_ENTROPY_LOSS`: f32 logits and labels of one shape to one f32 loss.
    CrossEntropyLoss,
    /// `FLASH_ATTN_EXT`: softmax(scale·q·kᵀ (softcapped) + slope·mask) · v per head, with
    /// optional attention sinks; inputs q, k, v, mask, sinks (the last two may be NULL).
    FlashAttnExt,
    /// Anything else, by ggml's op (or unary op) name.
    Other(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// Element-wise one-input ops: ggml's `UNARY` sub-ops plus the top-level math ops that behave
/// the same way (`SQR`, `SQRT`, `LOG`, `SIN`, `COS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Abs,
    Sgn,
    Neg,
    Step,
    Tanh,
    Elu,
    Relu,
    Sigmoid,
    Gelu,
    GeluQuick,
    Silu,
    Hardswish,
    Hardsigmoid,
    Exp,
    GeluErf,
    Floor,
    Ceil,
    Round,
    Trunc,
    Sqr,
    Sqrt,
    Log,
    Sin,
    Cos,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "ADD",
            BinaryOp::Sub => "SUB",
            BinaryOp::Mul => "MUL",
            BinaryOp::Div => "DIV",
        }
    }
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 24] = [
        UnaryOp::Abs,
        UnaryOp::Sgn,
        UnaryOp::Neg,
        UnaryOp::Step,
        UnaryOp::Tanh,
        UnaryOp::Elu,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::GeluQuick,
        UnaryOp::Silu,
        UnaryOp::Hardswish,
        UnaryOp::Hardsigmoid,
        UnaryOp::Exp,
        UnaryOp::GeluErf,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Trunc,
        UnaryOp::Sqr,
        UnaryOp::Sqrt,
        UnaryOp::Log,
        UnaryOp::Sin,
        UnaryOp::Cos,
    ];

    /// ggml's name for the op (`ggml_unary_op_name` / `ggml_op_name`), also the kernel op name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Abs => "ABS",
            UnaryOp::Sgn => "SGN",
            UnaryOp::Neg => "NEG",
            UnaryOp::Step => "STEP",
            UnaryOp::Tanh => "TANH",
            UnaryOp::Elu => "ELU",
            UnaryOp::Relu => "RELU",
            UnaryOp::Sigmoid => "SIGMOID",
            UnaryOp::Gelu => "GELU",
            UnaryOp::GeluQuick => "GELU_QUICK",
            UnaryOp::Silu => "SILU",
            UnaryOp::Hardswish => "HARDSWISH",
            UnaryOp::Hardsigmoid => "HARDSIGMOID",
            UnaryOp::Exp => "EXP",
            UnaryOp::GeluErf => "GELU_ERF",
            UnaryOp::Floor => "FLOOR",
            UnaryOp::Ceil => "CEIL",
            UnaryOp::Round => "ROUND",
            UnaryOp::Trunc => "TRUNC",
            UnaryOp::Sqr => "SQR",
            UnaryOp::Sqrt => "SQRT",
            UnaryOp::Log => "LOG",
            UnaryOp::Sin => "SIN",
            UnaryOp::Cos => "COS",
        }
    }

    pub fn from_name(name: &str) -> Option<UnaryOp> {
        UnaryOp::ALL.into_iter().find(|op| op.name() == name)
    }
}

impl Op {
    /// The op of a ggml node called `op` by `ggml_op_name` (`ADD`, `UNARY`, `GLU`, ...), with the
    /// sub-op's name (`ggml_unary_op_name`, `ggml_glu_op_name`) for `UNARY` and `GLU` nodes. The
    /// catalogue's `ggml` column spells the same pairs `UNARY:GELU`; a test maps every one.
    pub fn from_ggml(op: &'static str, sub: Option<&'static str>) -> Op {
        match (op, sub) {
            ("NONE" | "VIEW" | "RESHAPE" | "PERMUTE" | "TRANSPOSE", _) => Op::Layout,
            ("DUP", _) => Op::Dup,
            ("CPY", _) => Op::Cpy,
            ("CONT", _) => Op::Cont,
            ("ADD", _) => Op::Binary(BinaryOp::Add),
            ("SUB", _) => Op::Binary(BinaryOp::Sub),
            ("MUL", _) => Op::Binary(BinaryOp::Mul),
            ("DIV", _) => Op::Binary(BinaryOp::Div),
            ("SCALE", _) => Op::Scale,
            ("CLAMP", _) => Op::Clamp,
            ("MUL_MAT", _) => Op::MulMat,
            ("ARGMAX", _) => Op::ArgMax,
            ("COUNT_EQUAL", _) => Op::CountEqual,
            ("CROSS_ENTROPY_LOSS", _) => Op::CrossEntropyLoss,
            ("FLASH_ATTN_EXT", _) => Op::FlashAttnExt,
            ("GET_ROWS", _) => Op::GetRows,
            ("SET_ROWS", _) => Op::SetRows,
            ("SOFT_MAX", _) => Op::SoftMax,
            ("ROPE", _) => Op::Rope,
            ("RMS_NORM", _) => Op::Norm { rms: true },
            ("NORM", _) => Op::Norm { rms: false },
            ("GLU", Some(name)) => {
                let act = match name {
                    "REGLU" => Some(UnaryOp::Relu),
                    "GEGLU" => Some(UnaryOp::Gelu),
                    "SWIGLU" => Some(UnaryOp::Silu),
                    "GEGLU_ERF" => Some(UnaryOp::GeluErf),
                    "GEGLU_QUICK" => Some(UnaryOp::GeluQuick),
                    _ => None,
                };
                act.map_or(Op::Other(name), |act| Op::Glu { name, act })
            }
            ("UNARY", Some(name)) => UnaryOp::from_name(name).map_or(Op::Other(name), Op::Unary),
            // The top-level math ops that behave as unary ones (SQR, SQRT, LOG, SIN, COS).
            (name, _) => UnaryOp::from_name(name).map_or(Op::Other(name), Op::Unary),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Layout => "LAYOUT",
            Op::Dup => "DUP",
            Op::Cpy => "CPY",
            Op::Cont => "CONT",
            Op::Binary(op) => op.name(),
            Op::Unary(op) => op.name(),
            Op::Scale => "SCALE",
            Op::Clamp => "CLAMP",
            Op::MulMat => "MUL_MAT",
            Op::ArgMax => "ARGMAX",
            Op::CountEqual => "COUNT_EQUAL",
            Op::CrossEntropyLoss => "CROSS_ENTROPY_LOSS",
            Op::FlashAttnExt => "FLASH_ATTN_EXT",
            Op::GetRows => "GET_ROWS",
            Op::SoftMax => "SOFT_MAX",
            Op::Rope => "ROPE",
            Op::Glu { name, .. } => name,
            Op::SetRows => "SET_ROWS",
            Op::Norm { rms: true } => "RMS_NORM",
            Op::Norm { rms: false } => "NORM",
            Op::Other(name) => name,
        }
    }
}

impl Node {
    /// Input `i`, if present.
    pub fn src(&self, i: usize) -> Option<&Tensor> {
        self.src.get(i).and_then(Option::as_ref)
    }

    /// The inputs that are present.
    pub fn inputs(&self) -> impl Iterator<Item = &Tensor> {
        self.src.iter().flatten()
    }

    /// Whether the node reads `t`'s memory. A view reads nothing: the nodes reading it read
    /// through it (and a kernel a rewrite put at a view's node reads its own operands).
    pub fn reads(&self, t: &Tensor) -> bool {
        self.op != Op::Layout && self.inputs().any(|s| s.overlaps(t))
    }
}

/// A graph node: the op, its parameters (ggml `op_params` as i32 words), the output and inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub op: Op,
    pub op_params: [i32; 16],
    pub dst: Tensor,
    /// ggml's `src[]` up to the last non-NULL one; `None` where ggml has NULL (an optional
    /// input that is absent, e.g. SOFT_MAX without a mask but with sinks).
    pub src: Vec<Option<Tensor>>,
    /// The node's tensor is read after the graph: ggml's OUTPUT flag (the application reads
    /// it), or a node of another split of the scheduler's graph reads it or a view of it
    /// (`ffi::descriptors`). No fusion may skip writing it.
    pub is_output: bool,
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    /// ggml's q4_0: blocks of 32 values in 18 bytes.
    pub fn q4_0() -> DType {
        DType::Quant(QuantType {
            name: "q4_0",
            id: 2,
            block: 32,
            block_bytes: 18,
            decode: true,
            encode: true,
        })
    }

    /// A contiguous tensor of `dtype` and shape `ne` at `addr` in device 0's memory.
    pub fn tensor(dtype: DType, ne: [i64; 4], addr: u64) -> Tensor {
        let size = dtype.size().unwrap();
        let nb = [
            size,
            size * ne[0] as u64,
            size * (ne[0] * ne[1]) as u64,
            size * (ne[0] * ne[1] * ne[2]) as u64,
        ];
        Tensor {
            dtype,
            ne,
            nb,
            addr,
            bytes: size * ne.iter().product::<i64>() as u64,
            memory: Memory::Device(0),
        }
    }

    /// A node of `op` computing `dst` from `src`, no op_params, not a graph output.
    pub fn node(op: Op, dst: Tensor, src: Vec<Tensor>) -> Node {
        Node {
            op,
            op_params: [0; 16],
            dst,
            src: src.into_iter().map(Some).collect(),
            is_output: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::tensor;
    use super::*;

    #[test]
    fn contiguity_follows_ggml() {
        let mut t = tensor(DType::F32, [4, 3, 1, 1], 0);
        assert!(t.is_contiguous());
        // A size-1 dimension may have any stride.
        t.nb[2] = 12345;
        assert!(t.is_contiguous());
        // A transposed view is not contiguous.
        t.ne = [3, 4, 1, 1];
        t.nb = [16, 4, 48, 48];
        assert!(!t.is_contiguous());
        // Block-quantized types are never "contiguous" for element-wise purposes.
        let mut q = tensor(DType::F32, [32, 1, 1, 1], 0);
        q.dtype = DType::Other("q4_0");
        assert!(!q.is_contiguous());
    }

    #[test]
    fn element_offsets_walk_views_in_logical_order() {
        let mut t = tensor(DType::F32, [2, 3, 1, 1], 0);
        assert_eq!(
            t.element_offsets().collect::<Vec<_>>(),
            [0, 4, 8, 12, 16, 20]
        );
        // Transpose: ne [3, 2], nb [8, 4].
        t.ne = [3, 2, 1, 1];
        t.nb = [8, 4, 24, 24];
        assert_eq!(
            t.element_offsets().collect::<Vec<_>>(),
            [0, 8, 16, 4, 12, 20]
        );
    }

    #[test]
    fn broadcasting_needs_every_dimension_to_divide() {
        let a = tensor(DType::F32, [8, 6, 2, 1], 0);
        assert!(tensor(DType::F32, [8, 3, 1, 1], 0).can_repeat_to(&a));
        assert!(tensor(DType::F32, [1, 1, 1, 1], 0).can_repeat_to(&a));
        assert!(!tensor(DType::F32, [8, 4, 1, 1], 0).can_repeat_to(&a));
        assert!(!tensor(DType::F32, [8, 0, 1, 1], 0).can_repeat_to(&a));
    }

    /// Every ggml op of the catalogue becomes an op the planner knows, with the catalogue's
    /// name (or, for ops with variants, one of the names of its ggml op).
    #[test]
    fn every_catalogue_op_comes_from_its_ggml_op() {
        use crate::op_catalogue::{OpEntry, CATALOGUE};
        for e in CATALOGUE {
            let op = match e.ggml.split_once(':') {
                Some((op, sub)) => {
                    Op::from_ggml(if op == "UNARY" { "UNARY" } else { "GLU" }, Some(sub))
                }
                None => Op::from_ggml(e.ggml, None),
            };
            assert!(
                !matches!(op, Op::Other(_) | Op::Layout),
                "{}: {op:?}",
                e.name
            );
            let names: Vec<_> = OpEntry::from_ggml(e.ggml).map(|e| e.name).collect();
            assert!(names.contains(&op.name()), "{} -> {}", e.ggml, op.name());
        }
        assert_eq!(Op::from_ggml("VIEW", None), Op::Layout);
        assert_eq!(
            Op::from_ggml("GLU", Some("SWIGLU_OAI")),
            Op::Other("SWIGLU_OAI")
        );
        assert_eq!(Op::from_ggml("FLASH_ATTN_EXT", None), Op::FlashAttnExt);
        assert_eq!(Op::from_ggml("CONV_2D", None), Op::Other("CONV_2D"));
    }

    #[test]
    fn unary_names_round_trip() {
        for op in UnaryOp::ALL {
            assert_eq!(UnaryOp::from_name(op.name()), Some(op));
        }
        assert_eq!(UnaryOp::from_name("SOFTPLUS"), None);
    }
}
