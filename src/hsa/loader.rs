//! Finding and opening `libhsa-runtime64` at run time.
//!
//! Search order (architecture §4):
//! 1. `GGML_HSA_LIBHSA_PATH`: a file, a directory holding the library, or a bare library name
//!    (no `/`) for the dynamic linker to find. When it is set, it is the only place tried: a user
//!    who names a runtime gets that runtime or a clear error.
//! 2. The ROCR that CMake found (`hsa-runtime64_DIR`), passed to the build as
//!    `GGML_HSA_ROCR_LIB_DIR`.
//! 3. `$ROCM_PATH/lib`, then `/opt/rocm/lib`.
//! 4. The sonames `libhsa-runtime64.so.1`, then `libhsa-runtime64.so` (the dynamic linker's path).
//!
//! A loaded library is never unloaded: ROCR's threads and static state must outlive every caller.

use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

use libloading::Library;

use super::error::{Attempt, HsaError};

const SONAMES: [&str; 2] = ["libhsa-runtime64.so.1", "libhsa-runtime64.so"];

/// Where to look, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// A file path: skipped (and reported) when it does not exist.
    File(PathBuf),
    /// A bare library name, resolved by the dynamic linker.
    Name(String),
}

/// The search list for the given inputs (see the module documentation).
pub fn candidates(
    explicit: Option<&Path>,
    cmake_lib_dir: Option<&Path>,
    rocm_path: Option<&Path>,
) -> Vec<Candidate> {
    let in_dir = |dir: &Path| SONAMES.map(|name| Candidate::File(dir.join(name)));
    if let Some(path) = explicit {
        return if path.is_dir() {
            in_dir(path).to_vec()
        } else if path.components().count() == 1 && !path.exists() {
            vec![Candidate::Name(path.to_string_lossy().into_owned())]
        } else {
            vec![Candidate::File(path.to_owned())]
        };
    }
    let mut list = Vec::new();
    if let Some(dir) = cmake_lib_dir {
        list.extend(in_dir(dir));
    }
    if let Some(root) = rocm_path {
        list.extend(in_dir(&root.join("lib")));
    }
    list.extend(in_dir(Path::new("/opt/rocm/lib")));
    list.extend(SONAMES.map(|name| Candidate::Name(name.to_owned())));
    list
}

/// The search list for this process: its environment and the build's CMake hint.
pub fn default_candidates(explicit: Option<&Path>) -> Vec<Candidate> {
    let cmake_dir = option_env!("GGML_HSA_ROCR_LIB_DIR").map(Path::new);
    let rocm_path = std::env::var_os("ROCM_PATH")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    candidates(explicit, cmake_dir, rocm_path.as_deref())
}

/// Opens the first candidate that loads. The library is deliberately never closed.
pub fn open(candidates: &[Candidate]) -> Result<(ManuallyDrop<Library>, PathBuf), HsaError> {
    let mut attempts = Vec::new();
    for candidate in candidates {
        let (target, shown) = match candidate {
            Candidate::File(path) => {
                if !path.exists() {
                    attempts.push(Attempt {
                        candidate: path.clone(),
                        reason: "no such file".into(),
                    });
                    continue;
                }
                (path.as_os_str().to_owned(), path.clone())
            }
            Candidate::Name(name) => (name.into(), PathBuf::from(name)),
        };
        // SAFETY: loading a shared library runs its initialisers. The candidates are the HSA
        // runtime the user or the system designates; nothing else is loaded.
        match unsafe { Library::new(&target) } {
            Ok(lib) => return Ok((ManuallyDrop::new(lib), shown)),
            Err(e) => attempts.push(Attempt {
                reason: dl_reason(&e, &shown),
                candidate: shown,
            }),
        }
    }
    Err(HsaError::Load { attempts })
}

/// dlerror's message starts with the path, which the attempt already shows; keep what follows it.
fn dl_reason(e: &libloading::Error, path: &Path) -> String {
    let text = e.to_string();
    let prefix = format!("{}: ", path.display());
    match text.find(&prefix) {
        Some(at) => text[at + prefix.len()..].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[Candidate]) -> Vec<String> {
        list.iter()
            .map(|c| match c {
                Candidate::File(p) => p.display().to_string(),
                Candidate::Name(s) => s.clone(),
            })
            .collect()
    }

    #[test]
    fn default_order() {
        let list = candidates(
            None,
            Some(Path::new("/cmake/lib")),
            Some(Path::new("/rocm")),
        );
        assert_eq!(
            files(&list),
            [
                "/cmake/lib/libhsa-runtime64.so.1",
                "/cmake/lib/libhsa-runtime64.so",
                "/rocm/lib/libhsa-runtime64.so.1",
                "/rocm/lib/libhsa-runtime64.so",
                "/opt/rocm/lib/libhsa-runtime64.so.1",
                "/opt/rocm/lib/libhsa-runtime64.so",
                "libhsa-runtime64.so.1",
                "libhsa-runtime64.so",
            ]
        );
        let list = candidates(None, None, None);
        assert_eq!(files(&list)[0], "/opt/rocm/lib/libhsa-runtime64.so.1");
    }

    #[test]
    fn an_explicit_file_is_the_only_candidate() {
        let list = candidates(Some(Path::new("/x/libsim.so")), None, Some(Path::new("/r")));
        assert_eq!(files(&list), ["/x/libsim.so"]);
    }

    #[test]
    fn an_explicit_bare_name_goes_to_the_dynamic_linker() {
        let list = candidates(Some(Path::new("libhsa-sim.so.1")), None, None);
        assert_eq!(list, [Candidate::Name("libhsa-sim.so.1".into())]);
    }

    #[test]
    fn an_explicit_directory_is_searched_for_both_names() {
        let dir = std::env::temp_dir();
        let list = candidates(Some(&dir), None, None);
        assert_eq!(
            files(&list),
            [
                dir.join("libhsa-runtime64.so.1").display().to_string(),
                dir.join("libhsa-runtime64.so").display().to_string(),
            ]
        );
    }

    #[test]
    fn failures_list_every_place_tried() {
        let dir = tempdir();
        let garbage = dir.join("libgarbage.so");
        std::fs::write(&garbage, "this is not an ELF file\n".repeat(200)).unwrap();
        let list = [
            Candidate::File(dir.join("missing.so")),
            Candidate::File(garbage.clone()),
            Candidate::Name("libggml-hsa-test-no-such-library.so.7".into()),
        ];
        let err = open(&list).unwrap_err();
        let HsaError::Load { attempts } = &err else {
            panic!("unexpected error {err}");
        };
        assert_eq!(attempts.len(), 3);
        assert_eq!(attempts[0].reason, "no such file");
        assert_eq!(attempts[1].candidate, garbage);
        assert!(
            attempts[1].reason.contains("invalid ELF header"),
            "{:?}",
            attempts[1]
        );
        assert!(
            attempts[2]
                .reason
                .contains("cannot open shared object file"),
            "{:?}",
            attempts[2]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ggml-hsa-loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
