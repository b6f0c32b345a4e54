//! Safe Rust above the HSA layer: which NPUs this process can use, and (as device support lands)
//! the devices, buffers and streams ggml drives.

use crate::config::Config;
use crate::hsa::{self, sys::HSA_DEVICE_TYPE_AIE, AgentDesc};
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
    /// Usable NPUs, at most `GGML_HSA_MAX_DEVICES`.
    pub npus: Vec<Npu>,
    /// Why the backend has no device, when it has none.
    pub unavailable: Option<String>,
    /// Things worth a warning (skipped agents, bad environment values).
    pub warnings: Vec<String>,
}

impl Platform {
    /// Loads the HSA runtime named by `config` (or found by the default search) and lists its NPUs.
    pub fn discover(config: &Config) -> Platform {
        let mut warnings = config.warnings.clone();
        let agents = hsa::runtime::get(config.libhsa_path.as_deref())
            .map_err(ToString::to_string)
            .and_then(|rt| rt.agents().map_err(|e| e.to_string()));
        let (npus, unavailable) = match agents {
            Err(reason) => (Vec::new(), Some(reason)),
            Ok(agents) => {
                let (npus, skipped) = select_npus(&agents, config.max_devices);
                warnings.extend(skipped);
                let unavailable = if npus.is_empty() {
                    Some(format!(
                        "the HSA runtime reports no AIE agent named aie2 or aie2p ({} agent(s): {})",
                        agents.len(),
                        agents
                            .iter()
                            .map(|a| a.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                } else {
                    Some(format!(
                        "found {} NPU(s) ({}), but device support is not implemented in this \
                         build yet",
                        npus.len(),
                        npus.iter()
                            .map(|n| n.arch.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                };
                (npus, unavailable)
            }
        };
        Platform {
            npus,
            unavailable,
            warnings,
        }
    }

    /// Devices exposed to ggml. None yet: this build discovers NPUs but cannot drive them.
    pub fn device_count(&self) -> usize {
        0
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
