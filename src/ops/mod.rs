//! Per-op planning: which ggml ops and type/layout combinations a device runs, and the tensor
//! transforms (flattening element-wise ops, choosing host-side copies) that map a ggml node onto a
//! kernel. Nothing here touches ggml pointers; it works on descriptors copied out by `ffi`.
//!
//! * [`tensor`]: the descriptors (types, tensors, ops, nodes).
//! * [`plan`]: the support rules and the plan of one node.
//! * [`rewrite`]: the table of graph rewrites (which nodes one kernel computes) and the plan of
//!   a graph, one step per node.
//! * [`scatter`]: SET_ROWS as a copy into the rows its indices name, read at dispatch.
//! * [`pieces`]: kernels over many rows run over power-of-two counts of them.
//! * [`forward`]: one-row GET_ROWS turned into views their readers read through.
//! * [`relocate`]: attention outputs moved out of memory the block after them reuses.
//! * [`bf16_activations`]: a prompt's activations that only GEMMs read, written as bf16.
//! * [`host`]: the ops that run on the host (type-converting copies).

pub mod bf16_activations;
pub mod forward;
pub mod host;
pub mod pieces;
pub mod plan;
pub mod relocate;
pub mod rewrite;
pub mod scatter;
pub mod tensor;

pub use forward::{forward_gathers, Forwarded};
pub use plan::{plan, plan_preferring, plan_with, Plan, PlanOptions};
pub use rewrite::{CacheRows, KernelStep, Stage, Step};
pub use scatter::{RowScatter, RowsProducer};
pub use tensor::{BinaryOp, DType, Memory, Node, Op, QuantType, Tensor, UnaryOp};
