//! The `GGML_HSA_*` environment, read once per process into a [`Config`].
//!
//! Bad values never abort: each one produces a warning (logged once, when the backend first
//! starts) and the documented default is used instead.

use std::path::PathBuf;
use std::sync::OnceLock;

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
    /// What was wrong with the environment, to be logged once.
    pub warnings: Vec<String>,
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

        Config {
            enable_log,
            libhsa_path,
            max_devices,
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
        assert!(c.warnings.is_empty());
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
