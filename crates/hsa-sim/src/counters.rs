//! Counters, written as JSON to `HSA_SIM_COUNTERS` after every doorbell and every
//! `hsa_executable_destroy` (atomic rewrite) and at the last `hsa_shut_down`.

use crate::config::PacketAbi;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Counters {
    /// Packet ABI the simulator speaks ("a1", "a2", "a3", "b").
    pub packet_abi: String,
    /// Doorbell stores on queue doorbell signals.
    pub doorbells: u64,
    /// Packets consumed (read index advanced past them), valid or not.
    pub packets: u64,
    /// START_CU packets executed successfully.
    pub dispatches: u64,
    /// Command chains submitted (consecutive START_CUs behind one doorbell, split at the
    /// 4 KiB chain-buffer capacity).
    pub chains: u64,
    /// PDIs loaded (first use of a PDI allocation on a queue).
    pub pdi_loads: u64,
    /// Hardware-context (re)builds; every PDI load rebuilds the queue's context.
    pub context_rebuilds: u64,
    /// Bytes read from operands by executed kernels.
    pub bytes_read: u64,
    /// Bytes written to outputs by executed kernels.
    pub bytes_written: u64,
    /// Arithmetic operations of executed kernels (model input).
    pub flops: u64,
    /// Packets or doorbells that reported an error (callback and/or completion signal).
    pub dispatch_errors: u64,
    /// Faults injected through HSA_SIM_* variables.
    pub injected_faults: u64,
    /// Simulated device time in nanoseconds (cost model).
    pub device_time_ns: u64,
    /// The part of `device_time_ns` the commands' dispatch costs make (chain latency, chained
    /// commands with a new or a loaded PDI), without their work and context rebuilds.
    pub dispatch_time_ns: u64,
    /// The part of `device_time_ns` the commands' work makes: the dataflow time of emulated
    /// IRON designs (`dataflow_timed` commands), the roofline of the others.
    pub work_time_ns: u64,
    /// Commands timed from their executed dataflow (emulated IRON designs).
    pub dataflow_timed: u64,
    /// The busiest core's kernel calls, summed over the dataflow-timed commands.
    pub core_busy_ns: u64,
    /// The busiest shim DMA channel's transfers (DRAM waits included), summed likewise.
    pub shim_busy_ns: u64,
    /// The busiest memory-tile or core DMA channel's transfers, summed likewise.
    pub tile_busy_ns: u64,
    /// The roofline bound of every command's work (bytes at the DRAM bandwidth or arithmetic
    /// at the best measured GEMM rate, the slower), printed beside the dataflow time.
    pub roofline_time_ns: u64,
    /// Chained commands whose PDI differed from the previous command's (the array reconfigured).
    pub pdi_switches: u64,
    /// Last error message, empty if none.
    pub last_error: String,
    /// Dispatches of IRON emulation images (version 2), per op (the kernel name's first part,
    /// upper case): the nodes that ran as emulated IRON designs.
    pub emulated_ops: std::collections::BTreeMap<String, u64>,
    /// Dispatches per kernel (its name), with its compile request where the image carries it
    /// (the simulator's reference images): what a benchmark needs to time each kernel of a
    /// graph on its own (`hsa-sim-time`) and weigh it by its dispatches.
    pub kernels: std::collections::BTreeMap<String, KernelTally>,
    /// Host wall time spent emulating them, in nanoseconds (a benchmark figure).
    pub emulation_wall_ns: u64,
    /// Executables created (`hsa_executable_create_alt`, packet ABI c).
    pub executables_created: u64,
    /// Executables destroyed (`hsa_executable_destroy`); created minus destroyed are live.
    pub executables_destroyed: u64,
}

/// One kernel's dispatches (`Counters::kernels`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct KernelTally {
    pub dispatches: u64,
    /// The work its dispatches were charged (nanoseconds; `work_time_ns`'s share).
    pub work_ns: u64,
    /// The compile request (the reference image's description); absent for emulated images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::image::KernelDesc>,
}

impl Counters {
    pub fn new(abi: PacketAbi) -> Counters {
        Counters {
            packet_abi: abi.name().to_string(),
            ..Counters::default()
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{}".to_string())
    }
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so a
/// reader never sees a partial file.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    static WRITER: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    let _serialise = WRITER.lock();
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "counters".to_string());
    let tmp = path.with_file_name(format!(".{file_name}.tmp.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
    }
    std::fs::rename(&tmp, path)
}
