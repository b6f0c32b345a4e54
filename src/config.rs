//! The `GGML_HSA_*` environment, read once per process into a [`Config`].
//!
//! Bad values never abort: each one produces a warning (logged once, when the backend first
//! starts) and the documented default is used instead.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::hsa::packet::PacketAbi;

/// The most devices the backend exposes (`GGML_HSA_MAX_DEVICES` in `ggml-hsa.h`).
pub const MAX_DEVICES: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `GGML_HSA_ENABLE_LOG`: debug/info lines of the backend. Default: on in debug builds.
    pub enable_log: bool,
    /// `GGML_HSA_LIBHSA_PATH`: the HSA runtime to load (a file, or a directory holding it).
    pub libhsa_path: Option<PathBuf>,
    /// `GGML_HSA_MAX_DEVICES`: how many NPUs to expose, 1..=16. Default 16.
    pub max_devices: usize,
    /// `GGML_HSA_PACKET_ABI`: the AIE packet generation to speak; `None` (`auto`, the default)
    /// probes the runtime.
    pub packet_abi: Option<PacketAbi>,
    /// `GGML_HSA_KERNEL_DIR`: precompiled kernels (`<dir>/<arch>/<name>.hsaco`, or `.pdi` +
    /// `_insts.bin`), searched first.
    pub kernel_dir: Option<PathBuf>,
    /// Where JIT-compiled kernels are cached: `GGML_HSA_KERNEL_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/ggml`, else `$HOME/.cache/ggml`, else `/tmp/ggml/ggml-hsa`.
    pub cache_dir: PathBuf,
    /// The JIT compiler's command line (`GGML_HSA_JIT_COMPILER`, default
    /// [`DEFAULT_JIT_COMPILER`]); `None` when JIT compilation was disabled at build time.
    pub jit_compiler: Option<String>,
    /// `GGML_HSA_JIT_VERBOSE`: log the compiler's output for every compile.
    pub jit_verbose: bool,
    /// `GGML_HSA_KERNEL_CACHE_CLEAR` (older name `GGML_HSA_JIT_CLEAR_CACHE`): remove the kernels
    /// this backend wrote into the cache, once, when the backend starts.
    pub cache_clear: bool,
    /// `GGML_HSA_KERNEL_RECORD`: write every kernel a run needs into this gen-kernels config.
    pub kernel_record: Option<PathBuf>,
    /// `GGML_HSA_CPU_FALLBACK` (development): claim every op and run those without an NPU kernel
    /// on ggml's CPU backend. Default: the CMake option of the same name ([`cpu_fallback_at_build`]).
    pub cpu_fallback: bool,
    /// `GGML_HSA_F16_AS_BF16`: kernels compute their f16 operands as bf16 (off by default: it
    /// loses precision, see README).
    pub f16_as_bf16: bool,
    /// `GGML_HSA_STATS`: write run statistics (nodes per op on the NPU, the host and the CPU;
    /// doorbells, packets, wall and wait time) to this JSON file after every graph.
    pub stats_path: Option<PathBuf>,
    /// What was wrong with the environment, to be logged once.
    pub warnings: Vec<String>,
}

/// The kernel compiler used when `GGML_HSA_JIT_COMPILER` is unset: the project's IRON package.
pub const DEFAULT_JIT_COMPILER: &str = "python3 -m ggml_hsa_iron";

/// Whether this build may compile kernels at run time (CMake `GGML_HSA_JIT_COMPILE`, passed to
/// cargo as the environment variable of the same name; on unless it is `OFF`/`0`/`false`/`no`).
pub fn jit_enabled_at_build() -> bool {
    !matches!(
        option_env!("GGML_HSA_JIT_COMPILE").map(parse_bool),
        Some(Some(false))
    )
}

/// The CMake option `GGML_HSA_CPU_FALLBACK` (passed to cargo as the environment variable of the
/// same name): the default of the run-time variable. Off unless it is `ON`/`1`/`true`/`yes`.
pub fn cpu_fallback_at_build() -> bool {
    option_env!("GGML_HSA_CPU_FALLBACK").and_then(parse_bool) == Some(true)
}

/// `1`, `true`, `yes`, `on` (any case) are true; `0`, `false`, `no`, `off` and the empty string are
/// false; anything else is `None`.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "" | "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl Config {
    /// Reads the configuration through `lookup` (the process environment in [`get`]).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Config {
        let mut warnings = Vec::new();

        let enable_log = match lookup("GGML_HSA_ENABLE_LOG") {
            None => cfg!(debug_assertions),
            Some(v) => parse_bool(&v).unwrap_or_else(|| {
                warnings.push(format!(
                    "GGML_HSA_ENABLE_LOG={v:?} is not a boolean (1/true/yes/on or 0/false/no/off); \
                     logging stays off"
                ));
                false
            }),
        };

        let libhsa_path = lookup("GGML_HSA_LIBHSA_PATH")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);

        let max_devices = match lookup("GGML_HSA_MAX_DEVICES") {
            None => MAX_DEVICES,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_DEVICES).contains(&n) => n,
                _ => {
                    warnings.push(format!(
                        "GGML_HSA_MAX_DEVICES={v:?} is not a number from 1 to {MAX_DEVICES}; \
                         using {MAX_DEVICES}"
                    ));
                    MAX_DEVICES
                }
            },
        };

        let mut flag_or = |name: &str, default: bool| match lookup(name) {
            None => default,
            Some(v) => parse_bool(&v).unwrap_or_else(|| {
                let shown = if default { "on" } else { "off" };
                warnings.push(format!(
                    "{name}={v:?} is not a boolean (1/true/yes/on or 0/false/no/off); using {shown}"
                ));
                default
            }),
        };
        let jit_verbose = flag_or("GGML_HSA_JIT_VERBOSE", false);
        // Both names are read (no short-circuit), so a bad value of either is reported.
        let cache_clear_new_name = flag_or("GGML_HSA_KERNEL_CACHE_CLEAR", false);
        let cache_clear_old_name = flag_or("GGML_HSA_JIT_CLEAR_CACHE", false);
        let cache_clear = cache_clear_new_name || cache_clear_old_name;
        let cpu_fallback = flag_or("GGML_HSA_CPU_FALLBACK", cpu_fallback_at_build());
        let f16_as_bf16 = flag_or("GGML_HSA_F16_AS_BF16", false);

        let packet_abi = match lookup("GGML_HSA_PACKET_ABI") {
            None => None,
            Some(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("auto") => None,
            Some(v) => match v.parse::<PacketAbi>() {
                Ok(abi) => Some(abi),
                Err(e) => {
                    warnings.push(format!("GGML_HSA_PACKET_ABI: {e}; using auto"));
                    None
                }
            },
        };

        let kernel_dir = lookup("GGML_HSA_KERNEL_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .filter(|dir| {
                let ok = dir.is_dir();
                if !ok {
                    warnings.push(format!(
                        "GGML_HSA_KERNEL_DIR={} is not a directory; no precompiled kernels are used",
                        dir.display()
                    ));
                }
                ok
            });

        let non_empty = |name: &str| lookup(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let cache_dir = non_empty("GGML_HSA_KERNEL_CACHE_DIR")
            .or_else(|| non_empty("XDG_CACHE_HOME").map(|d| d.join("ggml")))
            .or_else(|| non_empty("HOME").map(|d| d.join(".cache").join("ggml")))
            .unwrap_or_else(|| PathBuf::from("/tmp/ggml/ggml-hsa"));

        // `off` (or `none`, `0`, `false`, `no`) disables JIT compilation at run time.
        let jit_compiler = jit_enabled_at_build()
            .then(|| {
                lookup("GGML_HSA_JIT_COMPILER")
                    .filter(|v| !v.trim().is_empty())
                    .unwrap_or_else(|| DEFAULT_JIT_COMPILER.to_owned())
            })
            .filter(|v| {
                let v = v.trim().to_ascii_lowercase();
                !(v == "none" || parse_bool(&v) == Some(false))
            });
        let kernel_record = lookup("GGML_HSA_KERNEL_RECORD")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let stats_path = lookup("GGML_HSA_STATS")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);

        Config {
            enable_log,
            libhsa_path,
            max_devices,
            packet_abi,
            kernel_dir,
            cache_dir,
            jit_compiler,
            jit_verbose,
            cache_clear,
            kernel_record,
            cpu_fallback,
            f16_as_bf16,
            stats_path,
            warnings,
        }
    }
}

/// The process configuration, read from the environment on first use.
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config::from_lookup(|name| std::env::var(name).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Config {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn cpu_fallback_is_off_by_default_and_set_by_the_environment() {
        assert_eq!(config(&[]).cpu_fallback, cpu_fallback_at_build());
        assert!(config(&[("GGML_HSA_CPU_FALLBACK", "on")]).cpu_fallback);
        assert!(!config(&[("GGML_HSA_CPU_FALLBACK", "0")]).cpu_fallback);
        let bad = config(&[("GGML_HSA_CPU_FALLBACK", "maybe")]);
        assert_eq!(bad.cpu_fallback, cpu_fallback_at_build());
        assert!(bad.warnings[0].contains("GGML_HSA_CPU_FALLBACK=\"maybe\""));
    }

    #[test]
    fn truthy_values_in_any_case() {
        for v in ["1", "true", "TRUE", "Yes", "on", "ON", " on "] {
            assert_eq!(parse_bool(v), Some(true), "{v}");
        }
        for v in ["0", "false", "No", "OFF", ""] {
            assert_eq!(parse_bool(v), Some(false), "{v}");
        }
        assert_eq!(parse_bool("maybe"), None);
    }

    #[test]
    fn defaults() {
        let c = config(&[]);
        assert_eq!(c.enable_log, cfg!(debug_assertions));
        assert_eq!(c.libhsa_path, None);
        assert_eq!(c.max_devices, MAX_DEVICES);
        assert_eq!(c.packet_abi, None);
        assert_eq!(c.kernel_dir, None);
        assert_eq!(c.cache_dir, PathBuf::from("/tmp/ggml/ggml-hsa"));
        assert_eq!(c.jit_compiler.as_deref(), Some(DEFAULT_JIT_COMPILER));
        assert!(!c.jit_verbose);
        assert!(!c.cache_clear);
        assert_eq!(c.kernel_record, None);
        assert!(!c.f16_as_bf16);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn f16_as_bf16_is_an_opt_in_boolean() {
        for on in ["1", "true", "ON", " yes "] {
            let c = config(&[("GGML_HSA_F16_AS_BF16", on)]);
            assert!(c.f16_as_bf16, "{on}");
            assert!(c.warnings.is_empty(), "{on}");
        }
        for off in ["0", "false", "Off", "no", ""] {
            let c = config(&[("GGML_HSA_F16_AS_BF16", off)]);
            assert!(!c.f16_as_bf16, "{off}");
            assert!(c.warnings.is_empty(), "{off}");
        }
        let c = config(&[("GGML_HSA_F16_AS_BF16", "bf16")]);
        assert!(!c.f16_as_bf16, "a bad value keeps the default");
        assert_eq!(c.warnings.len(), 1);
        assert!(
            c.warnings[0].contains("GGML_HSA_F16_AS_BF16=\"bf16\" is not a boolean"),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn cache_clear_has_two_names_and_jit_can_be_switched_off() {
        assert!(config(&[("GGML_HSA_KERNEL_CACHE_CLEAR", "TRUE")]).cache_clear);
        assert!(config(&[("GGML_HSA_JIT_CLEAR_CACHE", "1")]).cache_clear);
        assert!(!config(&[("GGML_HSA_JIT_CLEAR_CACHE", "0")]).cache_clear);
        for off in ["off", "OFF", "none", "0"] {
            assert_eq!(
                config(&[("GGML_HSA_JIT_COMPILER", off)]).jit_compiler,
                None,
                "{off}"
            );
        }
        let c = config(&[("GGML_HSA_KERNEL_RECORD", "/tmp/k.json")]);
        assert_eq!(c.kernel_record, Some(PathBuf::from("/tmp/k.json")));
    }

    #[test]
    fn kernel_locations_and_packet_abi() {
        let c = config(&[
            ("HOME", "/home/u"),
            ("GGML_HSA_PACKET_ABI", "B"),
            ("GGML_HSA_JIT_COMPILER", "/x/cc --flag"),
            ("GGML_HSA_JIT_VERBOSE", "yes"),
            ("GGML_HSA_KERNEL_DIR", "/"),
        ]);
        assert_eq!(c.packet_abi, Some(PacketAbi::B));
        assert_eq!(c.cache_dir, PathBuf::from("/home/u/.cache/ggml"));
        assert_eq!(c.jit_compiler.as_deref(), Some("/x/cc --flag"));
        assert!(c.jit_verbose);
        assert_eq!(c.kernel_dir, Some(PathBuf::from("/")));
        let c = config(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")]);
        assert_eq!(c.cache_dir, PathBuf::from("/xdg/ggml"));
        let c = config(&[
            ("XDG_CACHE_HOME", "/xdg"),
            ("GGML_HSA_KERNEL_CACHE_DIR", "/k"),
        ]);
        assert_eq!(c.cache_dir, PathBuf::from("/k"));
        assert_eq!(config(&[("GGML_HSA_PACKET_ABI", "Auto")]).packet_abi, None);
    }

    #[test]
    fn bad_kernel_settings_warn() {
        let c = config(&[
            ("GGML_HSA_PACKET_ABI", "d"),
            ("GGML_HSA_KERNEL_DIR", "/nonexistent/kernels"),
            ("GGML_HSA_JIT_VERBOSE", "very"),
        ]);
        assert_eq!(c.packet_abi, None);
        assert_eq!(c.kernel_dir, None);
        assert_eq!(c.warnings.len(), 3, "{:?}", c.warnings);
        assert!(c.warnings.iter().any(|w| w.contains("not a directory")));
    }

    #[test]
    fn explicit_values() {
        let c = config(&[
            ("GGML_HSA_ENABLE_LOG", "On"),
            ("GGML_HSA_LIBHSA_PATH", "/opt/x/lib"),
            ("GGML_HSA_MAX_DEVICES", "2"),
        ]);
        assert!(c.enable_log);
        assert_eq!(c.libhsa_path, Some(PathBuf::from("/opt/x/lib")));
        assert_eq!(c.max_devices, 2);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn bad_values_warn_and_fall_back() {
        let c = config(&[
            ("GGML_HSA_ENABLE_LOG", "loud"),
            ("GGML_HSA_MAX_DEVICES", "0"),
            ("GGML_HSA_LIBHSA_PATH", ""),
        ]);
        assert!(!c.enable_log);
        assert_eq!(c.max_devices, MAX_DEVICES);
        assert_eq!(c.libhsa_path, None);
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("GGML_HSA_ENABLE_LOG=\"loud\""));
        assert!(config(&[("GGML_HSA_MAX_DEVICES", "17")]).warnings[0].contains("1 to 16"));
        assert!(config(&[("GGML_HSA_MAX_DEVICES", "x")]).warnings[0].contains("\"x\""));
    }
}
