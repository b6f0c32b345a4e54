//! ggml-hsa: a ggml backend for AMD XDNA/XDNA2 NPUs (Ryzen AI) through the ROCm HSA runtime.
//!
//! Layers (architecture §2), top to bottom:
//! * [`ffi`]: the only code that touches ggml pointers: the exported C API, the ggml vtables, the
//!   panic guard, logging through ggml's logger and the bindgen'd ggml types.
//! * [`backend`]: safe Rust: devices, buffers, streams, graph planning and execution.
//! * [`ops`]: per-op support rules and tensor transforms.
//! * [`kernels`]: the kernel store: architectures, canonical names, precompiled and cached kernels.
//! * [`hsa`]: the only code that touches HSA or libloading: the run-time loaded `libhsa-runtime64`.
//!
//! Beside them, used by every layer: [`config`] (the environment, read once), [`log`] (the
//! logging facade; `ffi` routes it to ggml's logger) and [`op_catalogue`] (every op, declared
//! once in `src/op_catalogue.toml`).
//!
//! Unsafe code lives in `ffi` and `hsa` only.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod config;
pub mod ffi;
pub mod hsa;
pub mod kernels;
pub mod log;
pub mod op_catalogue;
pub mod ops;
