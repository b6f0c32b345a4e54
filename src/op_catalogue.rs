//! The op catalogue: every op the backend runs, declared once in `src/op_catalogue.toml` and
//! compiled into this module by `build-script/op_catalogue_codegen.rs`. The planner names kernel
//! ops through its constants ([`ADD`], [`ROPE_FF`], ...), the kernel configs of `ggml-hsa-gen-kernels`
//! validate against [`CATALOGUE`], and the simulator's executor and the IRON package's registry
//! are tested against it (`tests/op_catalogue.rs`, `src/ggml_hsa_iron/tests/test_catalogue.py`).

/// Where an op runs on a real device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// An NPU kernel, compiled through the kernel compiler protocol.
    Kernel,
    /// On the CPU, inside the backend, in place on the NPU's host-mapped memory.
    Host,
    /// An NPU kernel when the kernel store can provide one for the node (the compiler declares
    /// its types and layouts, or the file is on disk); otherwise on the host, as [`Runs::Host`]
    /// (copies from and into quantized types, say).
    KernelOrHost,
}

impl Runs {
    /// Whether the op can be a kernel (a protocol op name).
    pub fn kernel(self) -> bool {
        matches!(self, Runs::Kernel | Runs::KernelOrHost)
    }
}

/// How one operand of a kernel relates to the rows its outputs are computed in
/// (`ops::pieces`): the kernel over a slice of the rows reads and writes the same slice of each
/// operand's dimension, and the rest whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// Read or written whole (weights, norms, the KV cache).
    Whole,
    /// Sliced along this dimension.
    Dim(usize),
    /// Sliced along the output's outermost dimension longer than 1 among this one and those
    /// after it (0 for element-wise ops, a flattened one along its elements; 1 for rows reduced
    /// along dimension 0), unless repeated over it.
    Outer(usize),
}

/// One op of the catalogue (see the header of `src/op_catalogue.toml` for the fields).
#[derive(Debug, PartialEq, Eq)]
pub struct OpEntry {
    /// The protocol name of the kernel op (`ADD`, `ROPE_FF`, ...), or ggml's name of a host op.
    pub name: &'static str,
    /// The ggml op it comes from: `ADD`, `UNARY:GELU`, `GLU:SWIGLU`, ...
    pub ggml: &'static str,
    pub inputs: usize,
    /// Most op_params words the kernel reads.
    pub params: usize,
    pub runs: Runs,
    /// hsa-sim's reference executor computes it.
    pub sim: bool,
    /// Architectures with an IRON design.
    pub iron: &'static [&'static str],
    /// The IRON design file defining `ggml_op_<name>`.
    pub iron_source: Option<&'static str>,
    /// Per operand (inputs, then outputs), how a kernel over fewer rows slices it; empty: the
    /// op always runs whole.
    pub rows: &'static [Rows],
}

include!(concat!(env!("OUT_DIR"), "/op_catalogue.rs"));

const KERNEL_PREFIX: &str = "ggml_op_";
/// The older spelling of ggml's unary kernels (`ggml_unary_op_gelu`), accepted in configs.
const UNARY_KERNEL_PREFIX: &str = "ggml_unary_op_";

impl OpEntry {
    /// The op called `name`.
    pub fn by_name(name: &str) -> Option<&'static OpEntry> {
        CATALOGUE.iter().find(|e| e.name == name)
    }

    /// The kernel op a config's `kernel_name` names: `ggml_op_<op>` in lower case, or
    /// `ggml_unary_op_<op>` for ggml's unary ops.
    pub fn by_kernel_name(name: &str) -> Option<&'static OpEntry> {
        let (op, unary_only) = if let Some(op) = name.strip_prefix(KERNEL_PREFIX) {
            (op, false)
        } else {
            (name.strip_prefix(UNARY_KERNEL_PREFIX)?, true)
        };
        // The catalogue's kernel names are lower case; other spellings are not a kernel's name.
        if op.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        OpEntry::by_name(&op.to_ascii_uppercase())
            .filter(|e| e.runs.kernel() && (!unary_only || e.ggml.starts_with("UNARY:")))
    }

    /// The kernel function name: `ggml_op_<name>` in lower case.
    pub fn kernel_name(&self) -> String {
        kernel_name(self.name)
    }

    /// The ops a ggml node of op `ggml` (`ADD`, `UNARY:GELU`, ...) may become.
    pub fn from_ggml(ggml: &str) -> impl Iterator<Item = &'static OpEntry> + '_ {
        CATALOGUE.iter().filter(move |e| e.ggml == ggml)
    }
}

/// The kernel function name of kernel op `op`: `ggml_op_<op>` in lower case.
pub fn kernel_name(op: &str) -> String {
    format!("{KERNEL_PREFIX}{}", op.to_ascii_lowercase())
}

/// The kernel ops, in catalogue order.
pub fn kernels() -> impl Iterator<Item = &'static OpEntry> {
    CATALOGUE.iter().filter(|e| e.runs.kernel())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_their_rows_and_kernel_names_round_trip() {
        assert_eq!(ADD.name, "ADD");
        assert_eq!(ROPE_FF.inputs, 3);
        assert_eq!(SOFT_MAX_MASK_SINKS.inputs, 3);
        assert_eq!(GET_ROWS.runs, Runs::Host);
        assert_eq!(SET_ROWS.runs, Runs::KernelOrHost);
        assert_eq!(OpEntry::by_kernel_name("ggml_op_set_rows"), Some(SET_ROWS));
        for e in kernels() {
            assert_eq!(OpEntry::by_kernel_name(&e.kernel_name()), Some(e));
        }
        let gq = OpEntry::by_name("GELU_QUICK").unwrap();
        assert_eq!(
            OpEntry::by_kernel_name("ggml_unary_op_gelu_quick"),
            Some(gq)
        );
        // Only ggml's unary ops have the unary spelling; host ops are no kernels.
        assert_eq!(OpEntry::by_kernel_name("ggml_unary_op_add"), None);
        assert_eq!(OpEntry::by_kernel_name("ggml_unary_op_sqrt"), None);
        assert_eq!(OpEntry::by_kernel_name("ggml_op_get_rows"), None);
        assert_eq!(OpEntry::by_kernel_name("ggml_op_ADD"), None);
        assert_eq!(OpEntry::by_kernel_name("add"), None);
    }

    #[test]
    fn designs_name_their_file_and_host_ops_have_no_kernel() {
        for e in CATALOGUE {
            assert_eq!(e.iron.is_empty(), e.iron_source.is_none(), "{}", e.name);
            if e.runs == Runs::Host {
                assert!(!e.sim && e.iron.is_empty(), "{}", e.name);
            }
        }
        assert_eq!(SCALE.iron_source, Some("unary_ops.py"));
        assert_eq!(
            OpEntry::from_ggml("SOFT_MAX")
                .map(|e| e.name)
                .collect::<Vec<_>>(),
            [
                "SOFT_MAX",
                "SOFT_MAX_MASK",
                "SOFT_MAX_SINKS",
                "SOFT_MAX_MASK_SINKS"
            ]
        );
    }
}
