//! hsa-sim: a software NPU.
//!
//! This crate builds a drop-in `libhsa-runtime64.so` that implements the subset of the ROCm HSA
//! runtime (ROCR) that AIE (AMD XDNA / XDNA2 NPU) clients use, and behaves like ROCR's AIE path:
//! one CPU agent followed by AIE agents, ROCR's three AIE memory pools, 64-packet queues whose
//! doorbell store submits synchronously, strict validation of the selected AIE packet ABI, the
//! per-queue limit of 32 PDIs, and execution of "simulator kernel images" (written by the
//! `hsa-sim-compile` binary) with ggml's reference semantics.
//!
//! Module map:
//! * [`api`]: the exported `extern "C"` functions (the only place that takes client pointers).
//! * [`runtime`]: the reference-counted global runtime state.
//! * [`config`]: configuration read from the environment (with a test override).
//! * [`agents`], [`memory`], [`signal`], [`queue`]: the HSA objects.
//! * [`packet`]: one module per ROCR AIE packet ABI generation (A1, A2, A3, B, C).
//! * [`code_object`]: AIE code object readers and executables (the hsaco loader of ABI C).
//! * [`image`]: the kernel image (PDI) and instruction-stream formats.
//! * [`ops`]: the op catalogue shared by the compiler and the executor.
//! * [`exec`]: the executor (ggml reference semantics).
//! * [`counters`], [`cost`], [`faults`]: observability, cost model, fault injection.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod agents;
pub mod api;
pub mod code_object;
pub mod config;
pub mod consts;
pub mod cost;
pub mod counters;
pub mod exec;
pub mod faults;
pub mod image;
pub mod memory;
pub mod ops;
pub mod packet;
pub mod queue;
pub mod runtime;
pub mod signal;

pub use api::*;
pub use config::{Config, PacketAbi};
