//! Safe Rust above the HSA layer: the NPUs this process uses ([`Platform`]), each one a
//! [`Device`] with its pools and kernels, and the [`Stream`]s that execute graphs on them.

pub mod device;
pub mod stats;
pub mod stream;

pub use device::Device;
pub use stream::{ComputeError, HostMemory, Stream};

use crate::config::Config;
use crate::hsa::packet::PacketAbi;
use crate::hsa::{self, sys::HSA_DEVICE_TYPE_AIE, AgentDesc, Runtime};
use crate::kernels::Arch;

/// An NPU agent the backend can drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Npu {
    pub arch: Arch,
    pub agent: AgentDesc,
}

/// What discovery found, once per process.
#[derive(Debug)]
pub struct Platform {
    /// The devices exposed to ggml (`HSA0`, ...), at most `GGML_HSA_MAX_DEVICES`.
    pub devices: Vec<Device>,
    /// The packet ABI the devices speak, and how it was chosen.
    pub packet_abi: Option<(PacketAbi, String)>,
    /// Why the backend has no device, when it has none.
    pub unavailable: Option<String>,
    /// Things worth a warning (skipped agents, bad environment values).
    pub warnings: Vec<String>,
}

impl Platform {
    /// Loads the HSA runtime named by `config` (or found by the default search) and opens its
    /// NPUs.
    pub fn discover(config: &Config) -> Platform {
        let mut platform = Platform {
            devices: Vec::new(),
            packet_abi: None,
            unavailable: None,
            warnings: config.warnings.clone(),
        };
        let runtime = match hsa::runtime::get(config.libhsa_path.as_deref()) {
            Ok(rt) => rt,
            Err(e) => {
                platform.unavailable = Some(e.to_string());
                return platform;
            }
        };
        let agents = match runtime.agents() {
            Ok(agents) => agents,
            Err(e) => {
                platform.unavailable = Some(e.to_string());
                return platform;
            }
        };
        let (npus, skipped) = select_npus(&agents, config.max_devices);
        if npus.is_empty() {
            // One line says it all: what the runtime has and why none of it is usable.
            platform.unavailable = Some(format!(
                "the HSA runtime {} reports no AIE agent named aie2 or aie2p ({} agent(s): {}){}",
                runtime.library().display(),
                agents.len(),
                agents
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                skipped.iter().map(|s| format!("; {s}")).collect::<String>()
            ));
            return platform;
        }
        platform.warnings.extend(skipped);
        let (abi, why) = choose_packet_abi(runtime, config, &npus[0]);
        for npu in npus {
            let index = platform.devices.len();
            match Device::open(index, npu, runtime, abi, config) {
                Ok(device) => platform.devices.push(device),
                Err(e) => platform.warnings.push(format!("skipping an NPU: {e}")),
            }
        }
        if platform.devices.is_empty() {
            platform.unavailable = Some("no NPU could be opened (see the warnings above)".into());
        }
        platform.packet_abi = Some((abi, why));
        platform
    }

    /// Devices exposed to ggml.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }
}

/// The packet ABI from `GGML_HSA_PACKET_ABI`, or probed (`auto`), with a note of how it was chosen.
///
/// Probe order: (1) the interface minor version gives a1, a2, a3 or b; (2) when that is b, a
/// tiny embedded AIE hsaco is loaded for the first NPU: only a generation-c runtime loads it and
/// hands out a non-zero kernel object, so success means c (no version query tells b from c).
fn choose_packet_abi(runtime: &'static Runtime, config: &Config, npu: &Npu) -> (PacketAbi, String) {
    match config.packet_abi {
        Some(abi) => (abi, "set by GGML_HSA_PACKET_ABI".into()),
        None => {
            let minor = runtime.interface_minor();
            let abi = PacketAbi::from_interface_minor(minor);
            let why = match minor {
                Some(m) => format!("auto: the runtime reports AMD interface minor version {m}"),
                None => "auto: the runtime does not report its interface version".into(),
            };
            if abi == PacketAbi::B && runtime.probe_code_objects(npu.agent.agent, npu.arch.name()) {
                return (
                    PacketAbi::C,
                    format!("{why}, and loads an AIE code object (generation c)"),
                );
            }
            (abi, why)
        }
    }
}

/// Keeps the AIE agents with a known architecture, at most `max`. Returns them and one warning
/// per skipped AIE agent; other agent kinds (the CPU, GPUs) are not devices of this backend.
pub fn select_npus(agents: &[AgentDesc], max: usize) -> (Vec<Npu>, Vec<String>) {
    let mut npus = Vec::new();
    let mut warnings = Vec::new();
    for agent in agents
        .iter()
        .filter(|a| a.device_type == HSA_DEVICE_TYPE_AIE)
    {
        match Arch::from_agent_name(&agent.name) {
            None => warnings.push(format!(
                "skipping AIE agent '{}': unknown architecture (supported: aie2, aie2p)",
                agent.name
            )),
            Some(_) if npus.len() == max => warnings.push(format!(
                "skipping AIE agent '{}': GGML_HSA_MAX_DEVICES={max} reached",
                agent.name
            )),
            Some(arch) => npus.push(Npu {
                arch,
                agent: agent.clone(),
            }),
        }
    }
    (npus, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hsa::sys::{hsa_agent_t, HSA_DEVICE_TYPE_CPU, HSA_DEVICE_TYPE_GPU};

    fn agent(handle: u64, name: &str, device_type: u32) -> AgentDesc {
        AgentDesc {
            agent: hsa_agent_t { handle },
            name: name.into(),
            device_type,
        }
    }

    #[test]
    fn keeps_known_aie_agents_in_order() {
        let agents = [
            agent(1, "cpu", HSA_DEVICE_TYPE_CPU),
            agent(2, "gfx1151", HSA_DEVICE_TYPE_GPU),
            agent(3, "aie2p", HSA_DEVICE_TYPE_AIE),
            agent(4, "aie2", HSA_DEVICE_TYPE_AIE),
        ];
        let (npus, warnings) = select_npus(&agents, 16);
        assert_eq!(
            npus.iter().map(|n| n.arch).collect::<Vec<_>>(),
            [Arch::Aie2p, Arch::Aie2]
        );
        assert_eq!(npus[0].agent.agent.handle, 3);
        assert!(warnings.is_empty());
    }

    #[test]
    fn unknown_aie_agents_are_skipped_with_a_warning() {
        let agents = [
            agent(1, "aie4", HSA_DEVICE_TYPE_AIE),
            agent(2, "aie2", HSA_DEVICE_TYPE_AIE),
        ];
        let (npus, warnings) = select_npus(&agents, 16);
        assert_eq!(npus.len(), 1);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("'aie4'"), "{warnings:?}");
    }

    #[test]
    fn the_device_limit_is_honoured() {
        let agents: Vec<_> = (0..3)
            .map(|i| agent(i, "aie2p", HSA_DEVICE_TYPE_AIE))
            .collect();
        let (npus, warnings) = select_npus(&agents, 2);
        assert_eq!(npus.len(), 2);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("GGML_HSA_MAX_DEVICES=2"));
    }
}
