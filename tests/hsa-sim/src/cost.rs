//! Cost model of a real XDNA (aie2) / XDNA2 (aie2p) NPU behind ROCR, used to report simulated
//! device time. Every constant names its published source.

/// Per-architecture constants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchModel {
    pub arch: &'static str,
    /// Columns a design occupies (the hardware context spans them).
    pub columns: u32,
    /// Cost of one command chain submission and its blocking wait (one EXEC_CMD + WAIT_CMD).
    pub chain_latency_ns: f64,
    /// Extra cost of every command inside a chain.
    pub command_overhead_ns: f64,
    /// Hardware-context teardown + rebuild, per column occupied.
    pub rebuild_per_column_ns: f64,
    /// Extra latency of the first dispatch after a context rebuild.
    pub first_dispatch_after_rebuild_ns: f64,
    /// Bytes per second the NPU can pull from / push to DRAM.
    pub bandwidth_bytes_per_s: f64,
    /// Peak arithmetic throughput (bf16, measured GEMM), flop/s.
    pub peak_flops: f64,
}

/// XDNA2 (Strix Point / Strix Halo / Krackan).
pub const AIE2P: ArchModel = ArchModel {
    arch: "aie2p",
    // IRON's NPU2 device uses all 8 columns of the 4x8 array (mlir-aie's device model).
    columns: 8,
    // ~90 µs per single dispatch through ROCR on Strix (ROCR's XDNA driver README).
    chain_latency_ns: 90_000.0,
    // The submit part of an XRT dispatch is 4-5 µs (qvac's ggml-xdna notes); charged per command.
    command_overhead_ns: 5_000.0,
    // Context switch ~360 µs per column occupied (qvac's ggml-xdna measurements).
    rebuild_per_column_ns: 360_000.0,
    // +1.6 ms on the first dispatch after a switch (qvac).
    first_dispatch_after_rebuild_ns: 1_600_000.0,
    // NPU-reachable DRAM bandwidth ~56 GB/s (qvac GEMV streaming; xdna-engine 52.7-62.7).
    bandwidth_bytes_per_s: 56.0e9,
    // Best published bf16 GEMM on XDNA2, 14.71 TFLOPS (mlir-aie programming examples).
    peak_flops: 14.71e12,
};

/// XDNA (Phoenix / Hawk Point).
pub const AIE2: ArchModel = ArchModel {
    arch: "aie2",
    // IRON's NPU1 device uses 4 of Phoenix's 5 columns (mlir-aie's device model).
    columns: 4,
    // No aie2 measurement exists; ROCR's per-dispatch figure on Strix is used.
    chain_latency_ns: 90_000.0,
    // qvac's submit time, as for aie2p.
    command_overhead_ns: 5_000.0,
    // 360 µs per column (measured on XDNA2; no XDNA figure published).
    rebuild_per_column_ns: 360_000.0,
    // qvac's figure, as for aie2p.
    first_dispatch_after_rebuild_ns: 1_600_000.0,
    // No XDNA measurement; ~7 GB/s per column (qvac) x 4 columns = 28 GB/s, an estimate.
    bandwidth_bytes_per_s: 28.0e9,
    // Best published bf16 GEMM on XDNA, 3.14 TFLOPS (mlir-aie programming examples).
    peak_flops: 3.14e12,
};

/// The model for an agent name; unknown names use the XDNA2 model.
pub fn model_for(agent_name: &str) -> ArchModel {
    match agent_name {
        "aie2" => AIE2,
        _ => AIE2P,
    }
}

impl ArchModel {
    /// Device time of one command moving `bytes` and doing `flops` (roofline: the slower of
    /// memory and compute, plus the per-command overhead).
    pub fn command_ns(&self, bytes: u64, flops: u64) -> f64 {
        let mem = bytes as f64 / self.bandwidth_bytes_per_s * 1e9;
        let compute = flops as f64 / self.peak_flops * 1e9;
        self.command_overhead_ns + mem.max(compute)
    }

    /// Device time of one hardware-context rebuild (new PDI).
    pub fn rebuild_ns(&self) -> f64 {
        self.rebuild_per_column_ns * self.columns as f64 + self.first_dispatch_after_rebuild_ns
    }
}

/// Command-chain capacity model (ROCR's `amd_xdna_driver.cpp`): the driver's chain buffer is 4 KiB and each slot costs
/// 52 + 4 x (argument dwords) bytes; a command carries 6 fixed dwords plus 2 per operand, which
/// gives about 44 two-operand commands per chain.
pub const CHAIN_BUFFER_BYTES: usize = 4096;

pub fn chain_slot_bytes(operands: usize) -> usize {
    52 + 4 * (6 + 2 * operands)
}
