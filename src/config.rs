//! The `GGML_HSA_*` environment, read once per process into a [`Config`].
//!
//! Bad values never abort: each one produces a warning (logged once, when the backend first
//! starts) and the documented default is used instead.

use std::cell::RefCell;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

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
    /// `$XDG_CACHE_HOME/ggml`, else `$HOME/.cache/ggml`, else [`Config::cache_fallback`].
    pub cache_dir: PathBuf,
    /// The per-user place used when `cache_dir` is refused (not private) or unknown:
    /// `$XDG_RUNTIME_DIR/ggml-hsa`, else `/tmp/ggml-hsa-<uid>`.
    pub cache_fallback: PathBuf,
    /// `GGML_HSA_KERNEL_CACHE_MAX`: the most bytes of kernels kept per architecture in the
    /// cache (a number with an optional K, M or G suffix). Default 2 GiB.
    pub cache_max: u64,
    /// The JIT compiler's command line (`GGML_HSA_JIT_COMPILER`, default
    /// [`DEFAULT_JIT_COMPILER`]); `None` when JIT compilation was disabled at build time.
    pub jit_compiler: Option<String>,
    /// `GGML_HSA_JIT_VERBOSE`: log the compiler's output for every compile.
    pub jit_verbose: bool,
    /// `GGML_HSA_JIT_TIMEOUT`: seconds a compile may take before it is stopped; `0`: no limit.
    /// Default [`crate::kernels::compiler::DEFAULT_TIMEOUT`].
    pub jit_timeout: Option<Duration>,
    /// `GGML_HSA_KERNEL_CACHE_CLEAR` (older name `GGML_HSA_JIT_CLEAR_CACHE`): remove the kernels
    /// this backend wrote into the cache, once, when the backend starts.
    pub cache_clear: bool,
    /// `GGML_HSA_KERNEL_RECORD`: write every kernel a run needs into this gen-kernels config.
    pub kernel_record: Option<PathBuf>,
    /// `GGML_HSA_CPU_FALLBACK` (development): claim every op and run those without an NPU kernel
    /// on ggml's CPU backend. Default: the CMake option of the same name ([`cpu_fallback_at_build`]).
    pub cpu_fallback: bool,
    /// `GGML_HSA_F16_AS_BF16`: kernels compute their f16 operands as bf16 (off by default: it
    /// loses precision, see docs/environment.md).
    pub f16_as_bf16: bool,
    /// `GGML_HSA_ROW_PIECES` (default on): kernels over many rows run as kernels over
    /// power-of-two counts of them, so that new prompt lengths compile nothing (`ops::pieces`).
    pub row_pieces: bool,
    /// `GGML_HSA_STATS`: run statistics (nodes per op on the NPU, the host and the CPU;
    /// doorbells, packets, wall and wait time): `1` (or another true value) logs them, a path
    /// writes them to that JSON file after every graph.
    pub stats: Option<StatsSink>,
    /// What was wrong with the environment, to be logged once.
    pub warnings: Vec<String>,
}

/// Where `GGML_HSA_STATS` sends the statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsSink {
    Log,
    File(PathBuf),
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

/// `GGML_HSA_KERNEL_CACHE_MAX`'s syntax: bytes, or a number with K, M or G (powers of 1024,
/// an optional trailing `B` or `iB`).
pub fn parse_size(value: &str) -> Option<u64> {
    let v = value.trim().to_ascii_uppercase();
    let v = v
        .strip_suffix("IB")
        .or_else(|| v.strip_suffix('B'))
        .unwrap_or(&v);
    let (number, shift) = match v.chars().last()? {
        'K' => (&v[..v.len() - 1], 10),
        'M' => (&v[..v.len() - 1], 20),
        'G' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    number.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// Reads variables through a lookup, collecting what was wrong with them.
struct Reader<F> {
    lookup: F,
    warnings: RefCell<Vec<String>>,
}

impl<F: Fn(&str) -> Option<OsString>> Reader<F> {
    fn warn(&self, message: String) {
        self.warnings.borrow_mut().push(message);
    }

    /// The value of `name` as the bytes the user gave (for paths).
    fn os(&self, name: &str) -> Option<OsString> {
        (self.lookup)(name)
    }

    /// A non-empty path value.
    fn path(&self, name: &str) -> Option<PathBuf> {
        self.os(name).filter(|v| !v.is_empty()).map(PathBuf::from)
    }

    /// The value of `name` as text; a value that is not UTF-8 is reported (naming the
    /// variable and what is used instead, `fallback`) and treated as unset.
    fn text(&self, name: &str, fallback: &str) -> Option<String> {
        let value = self.os(name)?;
        match value.into_string() {
            Ok(v) => Some(v),
            Err(raw) => {
                self.warn(format!("{name}={raw:?} is not valid UTF-8; {fallback}"));
                None
            }
        }
    }

    /// A boolean switch with its default.
    fn flag(&self, name: &str, default: bool) -> bool {
        let shown = if default { "on" } else { "off" };
        match self.text(name, &format!("using {shown}")) {
            None => default,
            Some(v) => parse_bool(&v).unwrap_or_else(|| {
                self.warn(format!(
                    "{name}={v:?} is not a boolean (1/true/yes/on or 0/false/no/off); using {shown}"
                ));
                default
            }),
        }
    }
}

impl Config {
    /// Reads the configuration through `lookup` (the process environment in [`get`]).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Config {
        let r = Reader {
            lookup,
            warnings: RefCell::new(Vec::new()),
        };

        let enable_log = match r.text("GGML_HSA_ENABLE_LOG", "logging stays off") {
            None if r.os("GGML_HSA_ENABLE_LOG").is_some() => false,
            None => cfg!(debug_assertions),
            Some(v) => parse_bool(&v).unwrap_or_else(|| {
                r.warn(format!(
                    "GGML_HSA_ENABLE_LOG={v:?} is not a boolean (1/true/yes/on or 0/false/no/off); \
                     logging stays off"
                ));
                false
            }),
        };

        let libhsa_path = r.path("GGML_HSA_LIBHSA_PATH");

        let max_devices = match r.text("GGML_HSA_MAX_DEVICES", &format!("using {MAX_DEVICES}")) {
            None => MAX_DEVICES,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_DEVICES).contains(&n) => n,
                _ => {
                    r.warn(format!(
                        "GGML_HSA_MAX_DEVICES={v:?} is not a number from 1 to {MAX_DEVICES}; \
                         using {MAX_DEVICES}"
                    ));
                    MAX_DEVICES
                }
            },
        };

        let jit_verbose = r.flag("GGML_HSA_JIT_VERBOSE", false);
        // Both names are read (no short-circuit), so a bad value of either is reported.
        let cache_clear_new_name = r.flag("GGML_HSA_KERNEL_CACHE_CLEAR", false);
        let cache_clear_old_name = r.flag("GGML_HSA_JIT_CLEAR_CACHE", false);
        let cache_clear = cache_clear_new_name || cache_clear_old_name;
        let cpu_fallback = r.flag("GGML_HSA_CPU_FALLBACK", cpu_fallback_at_build());
        let f16_as_bf16 = r.flag("GGML_HSA_F16_AS_BF16", false);
        let row_pieces = r.flag("GGML_HSA_ROW_PIECES", true);

        let packet_abi = match r.text("GGML_HSA_PACKET_ABI", "using auto") {
            None => None,
            Some(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("auto") => None,
            Some(v) => match v.parse::<PacketAbi>() {
                Ok(abi) => Some(abi),
                Err(e) => {
                    r.warn(format!("GGML_HSA_PACKET_ABI: {e}; using auto"));
                    None
                }
            },
        };

        let kernel_dir = r.path("GGML_HSA_KERNEL_DIR").filter(|dir| {
            let ok = dir.is_dir();
            if !ok {
                r.warn(format!(
                    "GGML_HSA_KERNEL_DIR={} is not a directory; no precompiled kernels are used",
                    dir.display()
                ));
            }
            ok
        });

        let uid = crate::kernels::trust::euid();
        let cache_fallback = r
            .path("XDG_RUNTIME_DIR")
            .map(|d| d.join("ggml-hsa"))
            .unwrap_or_else(|| PathBuf::from(format!("/tmp/ggml-hsa-{uid}")));
        let cache_dir = r
            .path("GGML_HSA_KERNEL_CACHE_DIR")
            .or_else(|| r.path("XDG_CACHE_HOME").map(|d| d.join("ggml")))
            .or_else(|| r.path("HOME").map(|d| d.join(".cache").join("ggml")))
            .unwrap_or_else(|| cache_fallback.clone());
        let default_max = crate::kernels::store::DEFAULT_CACHE_MAX;
        let cache_max = match r.text("GGML_HSA_KERNEL_CACHE_MAX", "using 2G") {
            None => default_max,
            Some(v) => parse_size(&v).filter(|&n| n > 0).unwrap_or_else(|| {
                r.warn(format!(
                    "GGML_HSA_KERNEL_CACHE_MAX={v:?} is not a size (bytes, or a number with K, \
                     M or G); using 2G"
                ));
                default_max
            }),
        };

        // `off` (or `none`, `0`, `false`, `no`) disables JIT compilation at run time.
        let jit_compiler = jit_enabled_at_build()
            .then(
                || match r.text("GGML_HSA_JIT_COMPILER", "no kernels are compiled") {
                    None if r.os("GGML_HSA_JIT_COMPILER").is_some() => "off".to_owned(),
                    None => DEFAULT_JIT_COMPILER.to_owned(),
                    Some(v) if v.trim().is_empty() => DEFAULT_JIT_COMPILER.to_owned(),
                    Some(v) => v,
                },
            )
            .filter(|v| {
                let v = v.trim().to_ascii_lowercase();
                !(v == "none" || parse_bool(&v) == Some(false))
            });
        let default_timeout = crate::kernels::compiler::DEFAULT_TIMEOUT;
        let jit_timeout = match r.text(
            "GGML_HSA_JIT_TIMEOUT",
            &format!("using {} s", default_timeout.as_secs()),
        ) {
            None => Some(default_timeout),
            Some(v) => match v.trim().parse::<u64>() {
                Ok(0) => None,
                Ok(secs) => Some(Duration::from_secs(secs)),
                Err(_) => {
                    r.warn(format!(
                        "GGML_HSA_JIT_TIMEOUT={v:?} is not a number of seconds (0: no limit); \
                         using {}",
                        default_timeout.as_secs()
                    ));
                    Some(default_timeout)
                }
            },
        };
        let kernel_record = r.path("GGML_HSA_KERNEL_RECORD");
        let stats = r
            .os("GGML_HSA_STATS")
            .filter(|v| !v.is_empty())
            .and_then(|v| match v.to_str().map(parse_bool) {
                Some(Some(true)) => Some(StatsSink::Log),
                Some(Some(false)) => None,
                _ => Some(StatsSink::File(PathBuf::from(v))),
            });

        Config {
            enable_log,
            libhsa_path,
            max_devices,
            packet_abi,
            kernel_dir,
            cache_dir,
            cache_fallback,
            cache_max,
            jit_compiler,
            jit_verbose,
            jit_timeout,
            cache_clear,
            kernel_record,
            cpu_fallback,
            f16_as_bf16,
            row_pieces,
            stats,
            warnings: r.warnings.into_inner(),
        }
    }
}

/// The process configuration, read from the environment on first use.
pub fn get() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| Config::from_lookup(|name| std::env::var_os(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Config {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
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
        let private = PathBuf::from(format!("/tmp/ggml-hsa-{}", crate::kernels::trust::euid()));
        assert_eq!((&c.cache_dir, &c.cache_fallback), (&private, &private));
        assert_eq!(c.cache_max, 2 << 30);
        assert_eq!(
            c.jit_timeout,
            Some(crate::kernels::compiler::DEFAULT_TIMEOUT)
        );
        assert_eq!(c.stats, None);
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

    #[test]
    fn the_cache_falls_back_to_a_per_user_place() {
        let c = config(&[("XDG_RUNTIME_DIR", "/run/user/1000")]);
        assert_eq!(c.cache_fallback, PathBuf::from("/run/user/1000/ggml-hsa"));
        assert_eq!(c.cache_dir, c.cache_fallback);
        let c = config(&[("HOME", "/home/u")]);
        assert_eq!(c.cache_dir, PathBuf::from("/home/u/.cache/ggml"));
        assert!(c
            .cache_fallback
            .to_string_lossy()
            .starts_with("/tmp/ggml-hsa-"));
    }

    #[test]
    fn sizes_timeouts_and_the_stats_switch() {
        assert_eq!(parse_size("1000"), Some(1000));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size(" 3 MiB"), Some(3 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("2T"), None);
        assert_eq!(
            config(&[("GGML_HSA_KERNEL_CACHE_MAX", "5M")]).cache_max,
            5 << 20
        );
        let bad = config(&[("GGML_HSA_KERNEL_CACHE_MAX", "lots")]);
        assert_eq!(bad.cache_max, 2 << 30);
        assert!(bad.warnings[0].contains("GGML_HSA_KERNEL_CACHE_MAX=\"lots\""));
        assert_eq!(
            config(&[("GGML_HSA_JIT_TIMEOUT", "60")]).jit_timeout,
            Some(Duration::from_secs(60))
        );
        assert_eq!(config(&[("GGML_HSA_JIT_TIMEOUT", "0")]).jit_timeout, None);
        assert!(config(&[("GGML_HSA_JIT_TIMEOUT", "1h")]).warnings[0].contains("seconds"));
        assert_eq!(
            config(&[("GGML_HSA_STATS", "1")]).stats,
            Some(StatsSink::Log)
        );
        assert_eq!(
            config(&[("GGML_HSA_STATS", "on")]).stats,
            Some(StatsSink::Log)
        );
        assert_eq!(config(&[("GGML_HSA_STATS", "0")]).stats, None);
        assert_eq!(
            config(&[("GGML_HSA_STATS", "/tmp/s.json")]).stats,
            Some(StatsSink::File(PathBuf::from("/tmp/s.json")))
        );
    }

    /// A value that is not UTF-8: paths are taken as the bytes given, every other variable is
    /// reported by name and gets its default.
    #[test]
    fn values_that_are_not_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let latin1 = std::ffi::OsStr::from_bytes(b"/data/mod\xe8les").to_owned();
        let texts = [
            "GGML_HSA_ENABLE_LOG",
            "GGML_HSA_MAX_DEVICES",
            "GGML_HSA_PACKET_ABI",
            "GGML_HSA_JIT_COMPILER",
            "GGML_HSA_JIT_VERBOSE",
            "GGML_HSA_JIT_TIMEOUT",
            "GGML_HSA_KERNEL_CACHE_CLEAR",
            "GGML_HSA_JIT_CLEAR_CACHE",
            "GGML_HSA_KERNEL_CACHE_MAX",
            "GGML_HSA_CPU_FALLBACK",
            "GGML_HSA_F16_AS_BF16",
        ];
        for name in texts {
            let c = Config::from_lookup(|n| (n == name).then(|| latin1.clone()));
            assert_eq!(c.warnings.len(), 1, "{name}: {:?}", c.warnings);
            assert!(
                c.warnings[0].starts_with(&format!("{name}=")) && c.warnings[0].contains("UTF-8"),
                "{:?}",
                c.warnings
            );
        }
        let c = Config::from_lookup(|n| (n == "GGML_HSA_JIT_COMPILER").then(|| latin1.clone()));
        assert_eq!(c.jit_compiler, None, "not run as some other program");
        let paths = |name: &str| Config::from_lookup(|n| (n == name).then(|| latin1.clone()));
        let want = PathBuf::from(latin1.clone());
        assert_eq!(paths("GGML_HSA_KERNEL_CACHE_DIR").cache_dir, want);
        assert_eq!(
            paths("GGML_HSA_LIBHSA_PATH").libhsa_path,
            Some(want.clone())
        );
        assert_eq!(
            paths("GGML_HSA_KERNEL_RECORD").kernel_record,
            Some(want.clone())
        );
        assert_eq!(
            paths("GGML_HSA_STATS").stats,
            Some(StatsSink::File(want.clone()))
        );
        // Not a directory here: reported by its name and path, not dropped silently.
        let c = paths("GGML_HSA_KERNEL_DIR");
        assert!(
            c.warnings[0].contains("GGML_HSA_KERNEL_DIR=/data/mod"),
            "{:?}",
            c.warnings
        );
        assert!(paths("GGML_HSA_KERNEL_CACHE_DIR").warnings.is_empty());
    }
}
