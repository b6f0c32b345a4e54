//! The ggml this plugin was built against versus the ggml it was loaded into.
//!
//! ggml reorders its backend tables without bumping `GGML_BACKEND_API_VERSION`, and the shared
//! library keeps its SONAME, so neither the loader nor the dynamic linker notices a plugin built
//! for another ggml. The plugin checks `ggml_version()`/`ggml_commit()` itself and declines to load
//! on a mismatch rather than call the wrong slots.

use std::ffi::CStr;

use super::sys;

/// A ggml build as reported by `ggml_version()` and `ggml_commit()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgmlIdentity {
    pub version: String,
    pub commit: String,
}

impl std::fmt::Display for GgmlIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ggml {} (commit {})", self.version, self.commit)
    }
}

/// The ggml whose headers generated this build's bindings (recorded by `build-script/main.rs`).
pub fn built_against() -> GgmlIdentity {
    GgmlIdentity {
        version: env!("GGML_HSA_BUILT_GGML_VERSION").to_owned(),
        commit: env!("GGML_HSA_BUILT_GGML_COMMIT").to_owned(),
    }
}

/// The ggml this process is running.
pub fn running() -> GgmlIdentity {
    // SAFETY: both functions take no arguments and return pointers to static NUL-terminated
    // strings inside libggml-base.
    let (version, commit) = unsafe { (sys::ggml_version(), sys::ggml_commit()) };
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::from("?")
        } else {
            // SAFETY: non-NULL pointers from ggml_version/ggml_commit are static C strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    GgmlIdentity {
        version: text(version),
        commit: text(commit),
    }
}

/// `Ok` when `running` is the ggml `built` was made for; otherwise the reason to decline.
pub fn check(built: &GgmlIdentity, running: &GgmlIdentity) -> Result<(), String> {
    if built == running {
        Ok(())
    } else {
        Err(format!(
            "this plugin was built against {built} but is running in {running}; its backend \
             tables may be laid out differently, so the plugin declines to load (rebuild it \
             against the ggml in use)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(version: &str, commit: &str) -> GgmlIdentity {
        GgmlIdentity {
            version: version.into(),
            commit: commit.into(),
        }
    }

    #[test]
    fn same_build_passes() {
        assert!(check(&id("0.25.3", "unknown"), &id("0.25.3", "unknown")).is_ok());
    }

    #[test]
    fn a_different_version_or_commit_is_declined() {
        let err = check(&id("0.25.3", "0c1e570"), &id("0.9.8", "be321b2")).unwrap_err();
        assert!(err.contains("ggml 0.25.3 (commit 0c1e570)"), "{err}");
        assert!(err.contains("ggml 0.9.8 (commit be321b2)"), "{err}");
        assert!(check(&id("0.25.3", "a"), &id("0.25.3", "b")).is_err());
    }

    #[test]
    fn the_linked_ggml_is_the_one_built_against() {
        // Unit tests link the same libggml-base that the build script inspected.
        assert_eq!(running(), built_against());
    }
}
