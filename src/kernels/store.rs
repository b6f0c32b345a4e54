//! Finding kernel files: the precompiled directory (`GGML_HSA_KERNEL_DIR/<arch>/`) first, then the
//! JIT cache (`<cache dir>/<arch>/`), then a JIT compile into the cache.
//!
//! Files that exist but are unusable (empty, an instruction stream whose size is not a multiple
//! of 4 bytes) are reported with their path and treated as missing. Compile failures are
//! remembered for the rest of the run (negative cache) so a graph does not retry them per node.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::compiler::{Capabilities, Compiler};
use super::desc::KernelDesc;
use super::Arch;
use crate::ffi::log;

/// The two files of a kernel, read into memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFiles {
    pub name: String,
    pub pdi: Vec<u8>,
    pub insts: Vec<u8>,
    /// The `.pdi` file they came from.
    pub path: PathBuf,
}

/// Why there is no kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel {name}: {reason}")]
pub struct KernelError {
    pub name: String,
    pub reason: String,
}

/// Where kernels come from, for one architecture.
#[derive(Debug)]
pub struct KernelStore {
    arch: Arch,
    kernel_dir: Option<PathBuf>,
    cache_dir: PathBuf,
    jit: Option<Compiler>,
    verbose: bool,
    capabilities: OnceLock<Result<Capabilities, String>>,
    failed: Mutex<HashMap<String, String>>,
}

impl KernelStore {
    /// A store for `arch`. `kernel_dir` and `cache_dir` are the roots (the `<arch>` folder is
    /// added here); `jit` is `None` when JIT compilation is disabled.
    pub fn new(
        arch: Arch,
        kernel_dir: Option<PathBuf>,
        cache_dir: PathBuf,
        jit: Option<Compiler>,
        verbose: bool,
    ) -> KernelStore {
        KernelStore {
            arch,
            kernel_dir,
            cache_dir,
            jit,
            verbose,
            capabilities: OnceLock::new(),
            failed: Mutex::new(HashMap::new()),
        }
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    fn cache_arch_dir(&self) -> PathBuf {
        self.cache_dir.join(self.arch.name())
    }

    fn search_dirs(&self) -> impl Iterator<Item = PathBuf> + '_ {
        self.kernel_dir
            .iter()
            .map(|d| d.join(self.arch.name()))
            .chain([self.cache_arch_dir()])
    }

    /// The compiler's capabilities, asked once; a failure is logged once and remembered.
    fn capabilities(&self) -> Result<&Capabilities, &str> {
        let Some(jit) = &self.jit else {
            return Err("JIT compilation is disabled");
        };
        self.capabilities
            .get_or_init(|| {
                let caps = jit.capabilities();
                match &caps {
                    Ok(c) => log::info(&format!(
                        "kernel compiler `{}` ({}): {} ops",
                        jit.argv.join(" "),
                        c.compiler,
                        c.ops.len()
                    )),
                    Err(e) => log::warn(&format!(
                        "{e}; only precompiled and cached kernels can be used \
                         (set GGML_HSA_JIT_COMPILER to the kernel compiler's command line)"
                    )),
                }
                caps
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// Whether a kernel for `desc` is available or can be compiled. Never compiles: the answer
    /// comes from the files on disk and the compiler's declared capabilities.
    pub fn supports(&self, desc: &KernelDesc) -> Result<(), String> {
        let name = desc.canonical_name();
        if let Some(reason) = self.failed.lock().get(&name) {
            return Err(reason.clone());
        }
        if self
            .search_dirs()
            .any(|dir| dir.join(format!("{name}.pdi")).is_file())
        {
            return Ok(());
        }
        match self.capabilities() {
            Ok(caps) => caps.check(self.arch, desc),
            Err(why) => Err(format!("no kernel file {name}.pdi ({why})")),
        }
    }

    /// The kernel for `desc`: from disk, or compiled now.
    pub fn load(&self, desc: &KernelDesc) -> Result<KernelFiles, KernelError> {
        let name = desc.canonical_name();
        let error = |reason: String| KernelError {
            name: name.clone(),
            reason,
        };
        if let Some(reason) = self.failed.lock().get(&name) {
            return Err(error(reason.clone()));
        }
        for dir in self.search_dirs() {
            if let Some(files) = read_kernel(&dir, &name) {
                return Ok(files);
            }
        }
        let result = self.compile(desc, &name).and_then(|()| {
            read_kernel(&self.cache_arch_dir(), &name).ok_or_else(|| {
                format!(
                    "the compiler reported success but {} holds no usable kernel files",
                    self.cache_arch_dir().display()
                )
            })
        });
        result.map_err(|reason| {
            self.failed.lock().insert(name.clone(), reason.clone());
            error(reason)
        })
    }

    fn compile(&self, desc: &KernelDesc, name: &str) -> Result<(), String> {
        let caps = self.capabilities().map_err(|why| {
            format!("not found in the precompiled or cache directories and {why}")
        })?;
        caps.check(self.arch, desc)?;
        let jit = self.jit.as_ref().expect("capabilities imply a compiler");
        let dir = self.cache_arch_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create the cache directory {}: {e}", dir.display()))?;
        let request = dir.join(format!(".{name}.request.{}.json", std::process::id()));
        std::fs::write(&request, desc.request_json(self.arch))
            .map_err(|e| format!("cannot write {}: {e}", request.display()))?;
        let started = std::time::Instant::now();
        let outcome = jit.compile(&request, &dir);
        let _ = std::fs::remove_file(&request);
        match outcome {
            Ok(output) => {
                log::info(&format!(
                    "compiled {name} for {} in {:.2?}",
                    self.arch,
                    started.elapsed()
                ));
                if self.verbose {
                    log::info(&format!("compiler output for {name}:\n{output}"));
                }
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Reads `<dir>/<name>.pdi` and `<dir>/<name>_insts.bin`; `None` when absent or unusable (the
/// latter is logged with the path).
fn read_kernel(dir: &Path, name: &str) -> Option<KernelFiles> {
    let pdi_path = dir.join(format!("{name}.pdi"));
    let insts_path = dir.join(format!("{name}_insts.bin"));
    if !pdi_path.is_file() {
        return None;
    }
    let read = |path: &Path| std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()));
    let checked = read(&pdi_path).and_then(|pdi| {
        let insts = read(&insts_path)?;
        if pdi.is_empty() {
            return Err(format!("{} is empty", pdi_path.display()));
        }
        if insts.is_empty() || insts.len() % 4 != 0 {
            return Err(format!(
                "{} is {} bytes, not a non-empty multiple of 4",
                insts_path.display(),
                insts.len()
            ));
        }
        Ok((pdi, insts))
    });
    match checked {
        Ok((pdi, insts)) => Some(KernelFiles {
            name: name.to_owned(),
            pdi,
            insts,
            path: pdi_path,
        }),
        Err(reason) => {
            log::warn(&format!("ignoring corrupt kernel files: {reason}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::desc::Layout;
    use super::*;

    fn desc() -> KernelDesc {
        let t = Layout::contiguous("f32", 4, [16, 1, 1, 1]);
        KernelDesc {
            op: "RELU".into(),
            op_params: vec![],
            inputs: vec![t.clone()],
            output: t,
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ggml-hsa-store-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn precompiled_kernels_win_and_corrupt_ones_count_as_missing() {
        let root = scratch("pre");
        let pre = root.join("pre");
        let cache = root.join("cache");
        let d = desc();
        let name = d.canonical_name();
        for (dir, tag) in [(&pre, b"PRE"), (&cache, b"CAC")] {
            std::fs::create_dir_all(dir.join("aie2")).unwrap();
            std::fs::write(dir.join("aie2").join(format!("{name}.pdi")), tag).unwrap();
            std::fs::write(dir.join("aie2").join(format!("{name}_insts.bin")), [0u8; 8]).unwrap();
        }
        let store = KernelStore::new(Arch::Aie2, Some(pre.clone()), cache.clone(), None, false);
        assert_eq!(store.supports(&d), Ok(()));
        assert_eq!(store.load(&d).unwrap().pdi, b"PRE");
        // A truncated instruction stream in the precompiled dir: the cache copy is used.
        std::fs::write(pre.join("aie2").join(format!("{name}_insts.bin")), [0u8; 6]).unwrap();
        assert_eq!(store.load(&d).unwrap().pdi, b"CAC");
        // Another architecture has nothing, and JIT is off.
        let other = KernelStore::new(Arch::Aie2p, Some(pre), cache, None, false);
        let err = other.supports(&d).unwrap_err();
        assert!(err.contains("JIT compilation is disabled"), "{err}");
        assert!(other.load(&d).is_err());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn failures_are_remembered_for_the_run() {
        let root = scratch("neg");
        let store = KernelStore::new(
            Arch::Aie2,
            None,
            root.clone(),
            Compiler::new("/nonexistent/compiler"),
            false,
        );
        let first = store.load(&desc()).unwrap_err();
        assert!(first.reason.contains("/nonexistent/compiler"), "{first}");
        assert!(store.failed.lock().contains_key(&first.name));
        assert_eq!(store.load(&desc()).unwrap_err(), first);
        let _ = std::fs::remove_dir_all(root);
    }
}
