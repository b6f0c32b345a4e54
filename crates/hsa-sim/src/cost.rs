//! Cost model of a real XDNA (aie2) / XDNA2 (aie2p) NPU behind ROCR, used to report simulated
//! device time. Every constant names its published source.

/// Per-architecture constants.
///
/// How a submission is charged (`queue.rs`): each command chain (the START_CU packets behind one
/// doorbell, split at the driver's 4 KiB chain buffer) costs [`chain_latency_ns`] for its first
/// command; every further command of the chain costs [`chained_new_pdi_ns`] when its PDI differs
/// from the previous command's (the array is reconfigured) or [`chained_loaded_pdi_ns`] when it
/// is the one just run; a batch that adds PDIs to the queue's hardware context rebuilds the
/// context once ([`rebuild_ns`]); and every command takes the roofline time of its work
/// ([`command_ns`]: the slower of DRAM traffic and arithmetic at the measured GEMM rate).
///
/// [`chain_latency_ns`]: ArchModel::chain_latency_ns
/// [`chained_new_pdi_ns`]: ArchModel::chained_new_pdi_ns
/// [`chained_loaded_pdi_ns`]: ArchModel::chained_loaded_pdi_ns
/// [`rebuild_ns`]: ArchModel::rebuild_ns
/// [`command_ns`]: ArchModel::command_ns
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchModel {
    pub arch: &'static str,
    /// Columns a design occupies (the hardware context spans them).
    pub columns: u32,
    /// Compute cores the designs use (4 rows of each column).
    pub cores: u32,
    /// First command of a chain: one EXEC_CMD and its blocking wait.
    pub chain_latency_ns: f64,
    /// A further command of a chain whose PDI is not the one just run.
    pub chained_new_pdi_ns: f64,
    /// A further command of a chain with the PDI already loaded.
    pub chained_loaded_pdi_ns: f64,
    /// Hardware-context teardown + rebuild, per column occupied.
    pub rebuild_per_column_ns: f64,
    /// Extra latency of the first dispatch after a context rebuild.
    pub first_dispatch_after_rebuild_ns: f64,
    /// Bytes per second the NPU can pull from / push to DRAM, reads and writes together: a
    /// parameter of the SoC's memory (`HSA_SIM_DRAM_GBPS`), default the middle of its range.
    pub bandwidth_bytes_per_s: f64,
    /// A shim tile's DMA channel (2 MM2S + 2 S2MM per shim tile), bytes per array cycle.
    pub shim_channel_bytes_per_cycle: f64,
    /// A memory tile's or compute tile's DMA channel, bytes per array cycle.
    pub tile_channel_bytes_per_cycle: f64,
    /// bf16 multiply-accumulates per core per cycle (the `aie::mmul` shape's r·s·t).
    pub bf16_macs_per_core_cycle: u32,
    /// int8 multiply-accumulates per core per cycle.
    pub int8_macs_per_core_cycle: u32,
    /// Core clock, Hz.
    pub clock_hz: f64,
    /// Best measured bf16 GEMM over the whole array, flop/s: the rate charged for kernels.
    pub measured_bf16_flops: f64,
    /// Best measured int8 GEMM over the whole array, op/s.
    pub measured_int8_ops: f64,
}

/// XDNA2 (Strix Point / Strix Halo / Krackan).
pub const AIE2P: ArchModel = ArchModel {
    arch: "aie2p",
    // IRON's NPU2 device uses all 8 columns of the 4x8 array (mlir-aie's device model).
    columns: 8,
    cores: 32,
    // rocrtst on Strix through ROCR's AIE path: one dispatch 90 µs end to end.
    chain_latency_ns: 90_000.0,
    // rocrtst on Strix: 32 chained commands, each with its own PDI + instruction stream, 1538 µs:
    // (1538 - 90) / 31 = 46.7 µs per further command.
    chained_new_pdi_ns: 46_700.0,
    // IRON chain measurements (one design, chained runs): ~10 µs per further command.
    chained_loaded_pdi_ns: 10_000.0,
    // Context switch ~360 µs per column occupied (qvac's ggml-xdna: 368/693/1518/2829 µs for
    // 1/2/4/8 columns).
    rebuild_per_column_ns: 360_000.0,
    // +1.6 ms on the first dispatch after a switch (qvac).
    first_dispatch_after_rebuild_ns: 1_600_000.0,
    // NPU-reachable DRAM, read + write: 47-67 GB/s published depending on the SoC's memory
    // (xdna-engine: pure DMA ~47 GB/s; amd/IRON PR #195: "63-70 GB/s" mixed; mlir-aie PR #2559:
    // memcpy 66.6 GB/s); 56 GB/s is the middle (qvac's GEMV streaming measured about that).
    bandwidth_bytes_per_s: 56.0e9,
    // AM020 (AIE-ML architecture manual): a shim DMA channel moves 32 bits per cycle; at the
    // estimated clock that is 6.1 GB/s, what amd/IRON's 8-column GEMV reached per column
    // (49.2 GB/s / 8, Xilinx/mlir-air PR #1360).
    shim_channel_bytes_per_cycle: 4.0,
    // AM020: memory-tile and compute-tile DMA channels and the stream switch are 32 bits wide.
    tile_channel_bytes_per_cycle: 4.0,
    // mlir-aie's aie2p mm.cc: bf16 4x8x8, i8 8x8x8.
    bf16_macs_per_core_cycle: 256,
    int8_macs_per_core_cycle: 512,
    // 50 TOPS int8 (AMD) over 32 cores x 512 MACs x 2 ops: ~1.53 GHz (an estimate).
    clock_hz: 1.53e9,
    // Best published GEMMs on XDNA2 (Taka et al., arXiv 2512.13282): bf16 14.71 TFLOPS, int8
    // 38.05 TOPS.
    measured_bf16_flops: 14.71e12,
    measured_int8_ops: 38.05e12,
};

/// XDNA (Phoenix / Hawk Point).
pub const AIE2: ArchModel = ArchModel {
    arch: "aie2",
    // IRON's NPU1 device uses 4 of Phoenix's 5 columns (mlir-aie's device model).
    columns: 4,
    cores: 16,
    // No aie2 measurement exists; ROCR's figures on Strix are used for every dispatch cost.
    chain_latency_ns: 90_000.0,
    chained_new_pdi_ns: 46_700.0,
    chained_loaded_pdi_ns: 10_000.0,
    // 360 µs per column (measured on XDNA2; no XDNA figure published).
    rebuild_per_column_ns: 360_000.0,
    // qvac's figure, as for aie2p.
    first_dispatch_after_rebuild_ns: 1_600_000.0,
    // No XDNA measurement; ~7 GB/s per column (qvac) x 4 columns = 28 GB/s, an estimate.
    bandwidth_bytes_per_s: 28.0e9,
    // AM020 (AIE-ML, which aie2 is): 32 bits per cycle per shim, memory-tile and core channel.
    shim_channel_bytes_per_cycle: 4.0,
    tile_channel_bytes_per_cycle: 4.0,
    // mlir-aie's aie2 mm.cc: bf16 4x8x4, i8 4x8x8.
    bf16_macs_per_core_cycle: 128,
    int8_macs_per_core_cycle: 256,
    // 10 TOPS int8 (Phoenix, AMD) over 20 cores x 256 MACs x 2 ops: ~1.0 GHz (an estimate).
    clock_hz: 1.0e9,
    // Best published GEMMs on XDNA (Taka et al., arXiv 2512.13282): bf16 3.14 TFLOPS, int8
    // 6.76 TOPS.
    measured_bf16_flops: 3.14e12,
    measured_int8_ops: 6.76e12,
};

/// The model for an agent name; unknown names use the XDNA2 model.
pub fn model_for(agent_name: &str) -> ArchModel {
    match agent_name {
        "aie2" => AIE2,
        _ => AIE2P,
    }
}

/// The arithmetic a kernel does on the cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arithmetic {
    /// Floats (and block-quantized weights dequantized to bf16) on the bf16 units.
    Bf16,
    /// Integer operands on the int8/int16 units.
    Int8,
}

impl ArchModel {
    /// The array's peak rate for `kind` (every core's MACs at the clock), op/s.
    pub fn peak_ops(&self, kind: Arithmetic) -> f64 {
        let macs = match kind {
            Arithmetic::Bf16 => self.bf16_macs_per_core_cycle,
            Arithmetic::Int8 => self.int8_macs_per_core_cycle,
        };
        2.0 * f64::from(macs) * f64::from(self.cores) * self.clock_hz
    }

    /// The rate charged: the best measured GEMM, never above the peak.
    pub fn sustained_ops(&self, kind: Arithmetic) -> f64 {
        let measured = match kind {
            Arithmetic::Bf16 => self.measured_bf16_flops,
            Arithmetic::Int8 => self.measured_int8_ops,
        };
        measured.min(self.peak_ops(kind))
    }

    /// Device time of one command's work moving `bytes` and doing `ops` (roofline: the slower
    /// of memory and compute); the dispatch costs are charged per chain position.
    pub fn command_ns(&self, bytes: u64, ops: u64, kind: Arithmetic) -> f64 {
        let mem = bytes as f64 / self.bandwidth_bytes_per_s * 1e9;
        let compute = ops as f64 / self.sustained_ops(kind) * 1e9;
        mem.max(compute)
    }

    /// Dispatch cost of a command at its place in a chain.
    pub fn dispatch_ns(&self, first_in_chain: bool, pdi_switched: bool) -> f64 {
        if first_in_chain {
            self.chain_latency_ns
        } else if pdi_switched {
            self.chained_new_pdi_ns
        } else {
            self.chained_loaded_pdi_ns
        }
    }

    /// Device time of one hardware-context rebuild (new PDIs in a batch).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thirty_two_chained_pdis_cost_what_rocrtst_measured() {
        let m = AIE2P;
        let chain: f64 = (0..32).map(|i| m.dispatch_ns(i == 0, true)).sum();
        assert!((chain / 1e3 - 1538.0).abs() < 5.0, "{chain}");
        assert_eq!(m.dispatch_ns(false, false), 10_000.0);
    }

    #[test]
    fn rates_stay_below_the_peaks_the_mac_shapes_give() {
        for m in [AIE2, AIE2P] {
            for k in [Arithmetic::Bf16, Arithmetic::Int8] {
                assert!(m.sustained_ops(k) <= m.peak_ops(k));
                assert!(m.sustained_ops(k) > 0.4 * m.peak_ops(k), "{} {k:?}", m.arch);
            }
        }
        // A 1B-parameter Q4 decode step (~0.7 GB of weights) is bandwidth-bound on aie2p.
        let ns = AIE2P.command_ns(700_000_000, 2_400_000_000, Arithmetic::Bf16);
        assert!((ns / 1e6 - 12.5).abs() < 0.1, "{ns}");
    }
}
