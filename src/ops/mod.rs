//! Per-op planning: which ggml ops and type/layout combinations a device runs, and the tensor
//! transforms (type conversion, making layouts contiguous, flattening element-wise ops) that map a
//! ggml node onto a kernel. Nothing here touches ggml pointers; it works on descriptors copied out
//! by `ffi`.
//!
//! This build has no device support yet, so no op is planned (see README, "Status").
