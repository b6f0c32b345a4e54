//! Runtime configuration. Read from the environment when the runtime is first initialised
//! (`hsa_init` taking the reference count from 0 to 1); tests replace the environment with
//! [`set_override`] so that parallel tests never touch process-global environment variables.

use crate::consts::{DEV_HEAP_SIZE, PAGE_SIZE};
use parking_lot::Mutex;
use std::path::PathBuf;

/// The AIE packet ABI generation the simulator speaks (see README, "Packet ABIs").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PacketAbi {
    /// ERT packet, format byte 3, no completion signal (ROCR Mar..Aug 2025). The default.
    A1,
    /// ERT packet, format byte 3, completion signal at offset 48.
    A2,
    /// ERT packet, format byte 200, completion signal at offset 48.
    A3,
    /// 64-byte AIE kernel-dispatch packet (`hsa_ext_amd_aie.h` v1.0).
    B,
    /// 64-byte AIE kernel-dispatch packet carrying a kernel object loaded from an AIE hsaco
    /// through the code object reader / executable API (ROCR's `aie-hsaco` branch).
    C,
}

impl PacketAbi {
    /// The generation used when `HSA_SIM_PACKET_ABI` is unset: A1, the ABI of the ROCR the
    /// C++ ggml-hsa backend (be321b27) is written for.
    pub const DEFAULT: PacketAbi = PacketAbi::A1;

    pub fn parse(s: &str) -> Option<PacketAbi> {
        match s.trim().to_ascii_lowercase().as_str() {
            "a1" => Some(PacketAbi::A1),
            "a2" => Some(PacketAbi::A2),
            "a3" => Some(PacketAbi::A3),
            "b" => Some(PacketAbi::B),
            "c" => Some(PacketAbi::C),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PacketAbi::A1 => "a1",
            PacketAbi::A2 => "a2",
            PacketAbi::A3 => "a3",
            PacketAbi::B => "b",
            PacketAbi::C => "c",
        }
    }
}

/// Everything the environment can configure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// AIE agent names, in order (`HSA_SIM_AGENTS`; empty with `HSA_SIM_NO_AGENTS=1`).
    pub agents: Vec<String>,
    /// `HSA_SIM_PACKET_ABI`.
    pub packet_abi: PacketAbi,
    /// `HSA_SIM_COUNTERS`: counters JSON file.
    pub counters_path: Option<PathBuf>,
    /// `HSA_SIM_FAIL_ALLOC=N`: the Nth pool allocation fails with OUT_OF_RESOURCES.
    pub fail_alloc: Option<u64>,
    /// `HSA_SIM_FAIL_DISPATCH=N`: the Nth START_CU reports an error.
    pub fail_dispatch: Option<u64>,
    /// `HSA_SIM_HANG_DISPATCH=N`: the Nth START_CU never completes.
    pub hang_dispatch: Option<u64>,
    /// `HSA_SIM_FAIL_INIT=1`: `hsa_init` fails.
    pub fail_init: bool,
    /// `HSA_SIM_ERROR_STATE=N`: the queue rung by the Nth doorbell goes into an error state.
    pub error_state: Option<u64>,
    /// `HSA_SIM_QUIET=1`: no diagnostics on stderr.
    pub quiet: bool,
    /// `HSA_SIM_EXECUTE=0`: kernels are validated, counted and charged to the cost model but
    /// compute nothing (outputs keep their bytes), so the host's cost can be measured on
    /// full-size models. Default 1.
    pub execute: bool,
    /// `HSA_SIM_DEV_HEAP_SIZE`: bytes of each AIE agent's dev heap (default ROCR's 64 MiB;
    /// smaller values let a test fill it, and exercise a client's kernel eviction, quickly).
    pub dev_heap_size: usize,
    /// `HSA_SIM_DRAM_GBPS`: the DRAM bandwidth the NPU reaches, reads and writes together, in
    /// GB/s (default the arch model's; published XDNA2 figures span 47-67 with the SoC's
    /// memory). Held in bytes per second.
    pub dram_bytes_per_s: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            agents: vec!["aie2p".to_string()],
            packet_abi: PacketAbi::DEFAULT,
            counters_path: None,
            fail_alloc: None,
            fail_dispatch: None,
            hang_dispatch: None,
            fail_init: false,
            error_state: None,
            quiet: false,
            execute: true,
            dev_heap_size: DEV_HEAP_SIZE,
            dram_bytes_per_s: None,
        }
    }
}

impl Config {
    /// Reads the configuration from an environment lookup function. Invalid values are errors
    /// (hsa_init then fails with a message), never silently ignored.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut cfg = Config::default();
        let flag = |name: &str| -> Result<bool, String> {
            match get(name) {
                None => Ok(false),
                Some(v) => match v.trim() {
                    "" | "0" | "false" | "no" => Ok(false),
                    "1" | "true" | "yes" => Ok(true),
                    other => Err(format!("{name}={other:?}: expected 0 or 1")),
                },
            }
        };
        let nth =
            |name: &str| -> Result<Option<u64>, String> {
                match get(name) {
                    None => Ok(None),
                    Some(v) if v.trim().is_empty() || v.trim() == "0" => Ok(None),
                    Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                        format!("{name}={v:?}: expected a positive integer N (1-based)")
                    }),
                }
            };
        if let Some(list) = get("HSA_SIM_AGENTS") {
            let names: Vec<String> = list
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            for n in &names {
                if n.len() >= 64 || !n.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(format!("HSA_SIM_AGENTS: bad agent name {n:?}"));
                }
            }
            cfg.agents = names;
        }
        if flag("HSA_SIM_NO_AGENTS")? {
            cfg.agents.clear();
        }
        if let Some(abi) = get("HSA_SIM_PACKET_ABI") {
            if !abi.trim().is_empty() {
                cfg.packet_abi = PacketAbi::parse(&abi).ok_or_else(|| {
                    format!("HSA_SIM_PACKET_ABI={abi:?}: expected one of a1, a2, a3, b, c")
                })?;
            }
        }
        cfg.counters_path = get("HSA_SIM_COUNTERS")
            .filter(|s| !s.trim().is_empty())
            .map(PathBuf::from);
        cfg.fail_alloc = nth("HSA_SIM_FAIL_ALLOC")?;
        cfg.fail_dispatch = nth("HSA_SIM_FAIL_DISPATCH")?;
        cfg.hang_dispatch = nth("HSA_SIM_HANG_DISPATCH")?;
        cfg.fail_init = flag("HSA_SIM_FAIL_INIT")?;
        cfg.error_state = nth("HSA_SIM_ERROR_STATE")?;
        cfg.quiet = flag("HSA_SIM_QUIET")?;
        cfg.execute = match get("HSA_SIM_EXECUTE") {
            Some(v) if !v.trim().is_empty() => flag("HSA_SIM_EXECUTE")?,
            _ => true,
        };
        if let Some(v) = get("HSA_SIM_DEV_HEAP_SIZE").filter(|v| !v.trim().is_empty()) {
            cfg.dev_heap_size = parse_size(&v)
                .filter(|n| (PAGE_SIZE..=DEV_HEAP_SIZE).contains(n))
                .ok_or_else(|| {
                    format!(
                        "HSA_SIM_DEV_HEAP_SIZE={v:?}: expected bytes (optionally with a K or M \
                         suffix, KiB/MiB) from 4K to 64M"
                    )
                })?;
        }
        if let Some(v) = get("HSA_SIM_DRAM_GBPS").filter(|v| !v.trim().is_empty()) {
            let gbps = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|g| (1.0..=1000.0).contains(g))
                .ok_or_else(|| {
                    format!("HSA_SIM_DRAM_GBPS={v:?}: expected GB/s from 1 to 1000 (say 56)")
                })?;
            cfg.dram_bytes_per_s = Some((gbps * 1e9) as u64);
        }
        Ok(cfg)
    }

    /// The configuration from the process environment.
    pub fn from_env() -> Result<Config, String> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }
}

/// `N`, `NK` or `NM` (KiB, MiB), case-insensitive.
fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let (digits, unit) = match v.as_bytes().last()?.to_ascii_uppercase() {
        b'K' => (&v[..v.len() - 1], 1usize << 10),
        b'M' => (&v[..v.len() - 1], 1 << 20),
        _ => (v, 1),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(unit)
}

static OVERRIDE: Mutex<Option<Config>> = Mutex::new(None);

/// Test hook: the configuration the next `hsa_init` (from reference count 0) uses instead of
/// the environment. `None` restores reading the environment.
pub fn set_override(cfg: Option<Config>) {
    *OVERRIDE.lock() = cfg;
}

/// The configuration for a new runtime instance.
pub fn current() -> Result<Config, String> {
    match OVERRIDE.lock().clone() {
        Some(c) => Ok(c),
        None => Config::from_env(),
    }
}
