//! Finding kernel files: the precompiled directory (`GGML_HSA_KERNEL_DIR/<arch>/`) first, then the
//! JIT cache (`<cache dir>/<arch>/`), then a JIT compile into the cache.
//!
//! Files that exist but are unusable (empty, an instruction stream whose size is not a multiple
//! of 4 bytes) are reported with their path and treated as missing. Compile failures are
//! remembered for the rest of the run (negative cache) so a graph does not retry them per node.
//!
//! The cache may be shared by several processes (and, at its default location, with other ggml
//! tools). So: a compile holds an exclusive lock on `<cache>/<arch>/.<name>.lock`, and a process
//! that finds the lock taken waits for it and then uses the other's result instead of compiling
//! again; the compiler writes each file aside and renames it into place, so nobody sees half a
//! kernel; and every kernel this backend wrote is listed in `<cache>/<arch>/.ggml-hsa-kernels`,
//! which is what `GGML_HSA_KERNEL_CACHE_CLEAR` removes (never other files of the directory).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use parking_lot::Mutex;

use super::compiler::{Capabilities, Compiler};
use super::desc::KernelDesc;
use super::Arch;
use crate::log;

/// The two files of a kernel, read into memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFiles {
    pub name: String,
    pub pdi: Vec<u8>,
    pub insts: Vec<u8>,
    /// The `.pdi` (or `.hsaco`) file they came from.
    pub path: PathBuf,
    /// The AIE code object when the kernel came from `<name>.hsaco` (packet ABI c loads it as
    /// it is; the PDI and instruction stream above are its kernel's blobs).
    pub hsaco: Option<Vec<u8>>,
}

/// The list of kernels this backend wrote into a cache directory, one name per line.
pub const MANIFEST: &str = ".ggml-hsa-kernels";

/// Why there is no kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel {name}: {reason}")]
pub struct KernelError {
    pub name: String,
    pub reason: String,
    /// The compiler declined this kernel as well-formed but unsupported (its capabilities, or a
    /// compile that exited 2): the op is one it takes, this shape or layout is not. Such a node
    /// runs on the CPU instead of failing its graph (see `backend::stream`).
    pub refused: bool,
}

/// A kernel that could not be had, remembered for the rest of the run.
#[derive(Debug, Clone)]
struct Failure {
    reason: String,
    refused: bool,
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
    failed: Mutex<HashMap<String, Failure>>,
    /// `GGML_HSA_KERNEL_RECORD`: where to record the kernels used.
    record: Option<PathBuf>,
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
            record: None,
        }
    }

    /// Records every kernel this store provides into the gen-kernels config at `path`.
    pub fn with_record(mut self, path: Option<PathBuf>) -> KernelStore {
        self.record = path;
        self
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
    /// comes from the compiler's declared capabilities and, for what it cannot build, the files
    /// on disk (asked second: this runs for every node the scheduler considers).
    pub fn supports(&self, desc: &KernelDesc) -> Result<(), String> {
        let name = desc.canonical_name();
        if let Some(f) = self.failed.lock().get(&name) {
            return Err(f.reason.clone());
        }
        let compilable = match self.capabilities() {
            Ok(caps) => caps.check(self.arch, desc),
            Err(why) => Err(format!("no kernel file {name}.pdi ({why})")),
        };
        let on_disk = || {
            self.search_dirs().any(|dir| {
                dir.join(format!("{name}.pdi")).is_file()
                    || dir.join(format!("{name}.hsaco")).is_file()
            })
        };
        match compilable {
            Err(_) if on_disk() => Ok(()),
            other => other,
        }
    }

    /// The kernel for `desc`: from disk, or compiled now.
    pub fn load(&self, desc: &KernelDesc) -> Result<KernelFiles, KernelError> {
        self.load_many(std::slice::from_ref(desc))
            .pop()
            .expect("one result per description")
    }

    /// The kernels for `descs`, in order. Those not on disk are compiled first, in parallel
    /// (at most one job per core), with a progress line per kernel in the log.
    pub fn load_many(&self, descs: &[KernelDesc]) -> Vec<Result<KernelFiles, KernelError>> {
        let names: Vec<String> = descs.iter().map(KernelDesc::canonical_name).collect();
        let known_bad = |name: &String| self.failed.lock().contains_key(name);
        let mut found: Vec<Option<KernelFiles>> = names
            .iter()
            .map(|name| {
                if known_bad(name) {
                    return None;
                }
                self.search_dirs()
                    .find_map(|dir| read_kernel(&dir, name, self.arch))
            })
            .collect();
        let missing: Vec<usize> = (0..names.len())
            .filter(|&i| {
                found[i].is_none() && !known_bad(&names[i]) && !names[..i].contains(&names[i])
            })
            .collect();
        self.compile_all(descs, &names, &missing);
        // What was compiled is in the cache now (the other directories were read above).
        for (i, name) in names.iter().enumerate() {
            if found[i].is_none() && !known_bad(name) {
                found[i] = read_kernel(&self.cache_arch_dir(), name, self.arch);
            }
        }
        names
            .iter()
            .zip(descs)
            .zip(found)
            .map(|((name, desc), found)| {
                if let Some(f) = self.failed.lock().get(name) {
                    return Err(KernelError {
                        name: name.clone(),
                        reason: f.reason.clone(),
                        refused: f.refused,
                    });
                }
                if let (Some(_), Some(path)) = (&found, &self.record) {
                    super::record::record(path, self.arch, desc);
                }
                found.ok_or_else(|| {
                    let reason = match self.capabilities() {
                        Ok(_) => format!(
                            "the compiler reported success but {} holds no usable kernel \
                                 files",
                            self.cache_arch_dir().display()
                        ),
                        Err(why) => {
                            format!("not found in the precompiled or cache directories and {why}")
                        }
                    };
                    let failure = Failure {
                        reason: reason.clone(),
                        refused: false,
                    };
                    self.failed.lock().insert(name.clone(), failure);
                    KernelError {
                        name: name.clone(),
                        reason,
                        refused: false,
                    }
                })
            })
            .collect()
    }

    /// Compiles `descs[i]` for every `i` in `missing`, in parallel, recording failures.
    fn compile_all(&self, descs: &[KernelDesc], names: &[String], missing: &[usize]) {
        if missing.is_empty() || self.capabilities().is_err() {
            return;
        }
        let total = missing.len();
        let jobs = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(total);
        let started = Instant::now();
        if total > 1 {
            log::info(&format!(
                "compiling {total} kernels for {} ({jobs} at a time)",
                self.arch
            ));
        }
        let next = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = missing.get(k) else { break };
                    let one = Instant::now();
                    let outcome = self.compile(&descs[i], &names[i]);
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    match outcome {
                        Ok(how) => log::info(&format!(
                            "[{n}/{total}] {} for {}: {how} in {:.2?} ({:.2?} elapsed)",
                            names[i],
                            self.arch,
                            one.elapsed(),
                            started.elapsed()
                        )),
                        Err(failure) => {
                            log::warn(&format!(
                                "[{n}/{total}] {} for {}: compile failed: {}",
                                names[i], self.arch, failure.reason
                            ));
                            self.failed.lock().insert(names[i].clone(), failure);
                        }
                    }
                });
            }
        });
    }

    /// Compiles one kernel into the cache, unless another process is doing it (then waits for
    /// it and uses its result). Returns how the kernel came to be there.
    fn compile(&self, desc: &KernelDesc, name: &str) -> Result<&'static str, Failure> {
        let failed = |reason: String| Failure {
            reason,
            refused: false,
        };
        let caps = self.capabilities().map_err(|why| {
            failed(format!(
                "not found in the precompiled or cache directories and {why}"
            ))
        })?;
        caps.check(self.arch, desc).map_err(|reason| Failure {
            reason,
            refused: true,
        })?;
        let jit = self.jit.as_ref().expect("capabilities imply a compiler");
        let dir = self.cache_arch_dir();
        std::fs::create_dir_all(&dir).map_err(|e| {
            failed(format!(
                "cannot create the cache directory {}: {e}",
                dir.display()
            ))
        })?;
        let lock = lock_kernel(&dir, name).map_err(failed)?;
        if read_kernel(&dir, name, self.arch).is_some() {
            return Ok("compiled by another process");
        }
        // Holding the lock, nobody else writes this kernel: temporary files of it are what a
        // compiler or a process killed mid-compile left behind.
        remove_partial_files(&dir, name, false);
        let request = dir.join(format!(".{name}.request.{}.json", std::process::id()));
        std::fs::write(&request, desc.request_json(self.arch)).map_err(|e| {
            // A full disk leaves the file created but short: keep nothing half-written.
            let _ = std::fs::remove_file(&request);
            failed(format!("cannot write {}: {e}", request.display()))
        })?;
        let outcome = jit.compile(&request, &dir);
        let _ = std::fs::remove_file(&request);
        if outcome.is_err() {
            // A failed (crashed, killed) compile keeps nothing: neither its temporary files nor
            // kernel files it may have written in place before failing.
            remove_partial_files(&dir, name, true);
        }
        let output = outcome.map_err(|e| Failure {
            refused: matches!(e, super::compiler::CompileError::Unsupported(_)),
            reason: e.to_string(),
        })?;
        record_written(&dir, name);
        drop(lock);
        if self.verbose {
            log::info(&format!("compiler output for {name}:\n{output}"));
        }
        Ok("compiled")
    }

    /// Removes every kernel this backend wrote into the cache directory of this architecture
    /// (as listed in its manifest) and returns the paths removed. Other files stay.
    pub fn clear_cache(&self) -> Vec<PathBuf> {
        clear_cache_dir(&self.cache_arch_dir())
    }
}

/// Takes the compile lock of kernel `name` in `dir`, waiting while another process holds it.
fn lock_kernel(dir: &Path, name: &str) -> Result<File, String> {
    let path = dir.join(format!(".{name}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot create the lock file {}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
    Ok(file)
}

/// Removes the temporary files of kernel `name` in `dir` (`.<name>.pdi.*`, `.<name>_insts.bin.*`,
/// `.<name>.hsaco.*`: the protocol's "written aside, renamed into place"; `.<name>.request.*`),
/// and with `outputs` its kernel files too. The caller holds the kernel's lock. Canonical names
/// have no dots, so these prefixes never reach another kernel's files.
fn remove_partial_files(dir: &Path, name: &str, outputs: bool) {
    let temporary = [
        format!(".{name}.pdi."),
        format!(".{name}_insts.bin."),
        format!(".{name}.hsaco."),
        format!(".{name}.request."),
    ];
    let kernel_files = [
        format!("{name}.pdi"),
        format!("{name}_insts.bin"),
        format!("{name}.hsaco"),
    ];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        let partial = temporary.iter().any(|p| file.starts_with(p.as_str()))
            || (outputs && kernel_files.iter().any(|k| file == k.as_str()));
        if partial && std::fs::remove_file(entry.path()).is_ok() {
            log::info(&format!(
                "removed {} (left by an unfinished compile)",
                entry.path().display()
            ));
        }
    }
}

/// Adds `name` to the manifest of `dir` (one short line, appended atomically).
fn record_written(dir: &Path, name: &str) {
    let path = dir.join(MANIFEST);
    let appended = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{name}\n").as_bytes()));
    if let Err(e) = appended {
        log::warn(&format!(
            "cannot record {name} in {}: {e}; clearing the cache will not remove it",
            path.display()
        ));
    }
}

/// Removes the kernels listed in `dir`'s manifest, their lock files and the manifest.
pub fn clear_cache_dir(dir: &Path) -> Vec<PathBuf> {
    let Ok(list) = std::fs::read_to_string(dir.join(MANIFEST)) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    let names = list
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.contains('/') && !n.starts_with('.'));
    for name in names {
        for file in [
            format!("{name}.pdi"),
            format!("{name}_insts.bin"),
            format!("{name}.hsaco"),
            format!(".{name}.lock"),
        ] {
            let path = dir.join(file);
            if std::fs::remove_file(&path).is_ok() {
                removed.push(path);
            }
        }
    }
    let manifest = dir.join(MANIFEST);
    if std::fs::remove_file(&manifest).is_ok() {
        removed.push(manifest);
    }
    removed
}

/// Reads `<dir>/<name>.hsaco` (preferred: an AIE code object with a PDI + instructions kernel
/// called `name` in the section of `arch`), else `<dir>/<name>.pdi` and `<dir>/<name>_insts.bin`;
/// `None` when absent or unusable (the latter is logged with the path).
fn read_kernel(dir: &Path, name: &str, arch: Arch) -> Option<KernelFiles> {
    let hsaco_path = dir.join(format!("{name}.hsaco"));
    if hsaco_path.is_file() {
        match read_hsaco(&hsaco_path, name, arch) {
            Ok(files) => return Some(files),
            Err(reason) => log::warn(&format!(
                "ignoring corrupt kernel file {}: {reason}",
                hsaco_path.display()
            )),
        }
    }
    read_pdi_insts(dir, name)
}

/// The kernel `name` of an hsaco file, validated by the shared strict reader.
fn read_hsaco(path: &Path, name: &str, arch: Arch) -> Result<KernelFiles, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let kernels = aie_hsaco::read(&bytes, arch.name()).map_err(|e| e.to_string())?;
    let k = kernels
        .into_iter()
        .find(|k| k.name == name)
        .ok_or_else(|| format!("no kernel named {name} in its {} section", arch.name()))?;
    if k.kind != aie_hsaco::KernelKind::PdiInsts {
        return Err(format!(
            "kernel {name} is a full ELF; this backend dispatches PDI + instruction kernels"
        ));
    }
    Ok(KernelFiles {
        name: name.to_owned(),
        pdi: k.pdi,
        insts: k.insts,
        path: path.to_owned(),
        hsaco: Some(bytes),
    })
}

fn read_pdi_insts(dir: &Path, name: &str) -> Option<KernelFiles> {
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
        if insts.is_empty() || !insts.len().is_multiple_of(4) {
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
            hsaco: None,
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
            f16_as_bf16: false,
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

    #[test]
    fn clearing_removes_only_what_the_backend_wrote() {
        let dir = scratch("clear");
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "k1.pdi",
            "k1_insts.bin",
            ".k1.lock",
            "foreign.pdi",
            "notes.txt",
        ] {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        record_written(&dir, "k1");
        record_written(&dir, "gone"); // listed but already deleted by hand
        let removed = clear_cache_dir(&dir);
        assert_eq!(removed.len(), 4, "{removed:?}");
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["foreign.pdi", "notes.txt"]);
        // Nothing recorded: nothing removed.
        assert!(clear_cache_dir(&dir).is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn hsaco_files_are_preferred_and_corrupt_ones_ignored() {
        let dir = scratch("hsaco");
        std::fs::create_dir_all(&dir).unwrap();
        let good = aie_hsaco::write_single("aie2p", "k", b"PDI!", &[1, 0, 0, 0], 2, 1).unwrap();
        std::fs::write(dir.join("k.hsaco"), &good).unwrap();
        let f = read_kernel(&dir, "k", Arch::Aie2p).unwrap();
        assert_eq!(
            (f.pdi.as_slice(), f.insts.as_slice()),
            (&b"PDI!"[..], &[1, 0, 0, 0][..])
        );
        assert_eq!(f.hsaco.as_deref(), Some(good.as_slice()));
        // No aie2 section, no .pdi: no kernel for aie2; another name: none either.
        assert!(read_kernel(&dir, "k", Arch::Aie2).is_none());
        std::fs::copy(dir.join("k.hsaco"), dir.join("other.hsaco")).unwrap();
        assert!(read_kernel(&dir, "other", Arch::Aie2p).is_none());
        // With the .pdi pair beside it, a corrupt hsaco falls back to the pair; whatever the
        // corruption (truncations, flipped bytes), the result is a clean kernel or the pair.
        std::fs::write(dir.join("k.pdi"), b"PAIR").unwrap();
        std::fs::write(dir.join("k_insts.bin"), [2u8, 0, 0, 0]).unwrap();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..300 {
            let mut bytes = good.clone();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 2 == 0 {
                bytes.truncate((x % good.len() as u64) as usize);
            } else {
                let at = (x as usize) % bytes.len();
                bytes[at] ^= 1 << (x >> 61);
            }
            std::fs::write(dir.join("k.hsaco"), &bytes).unwrap();
            let f = read_kernel(&dir, "k", Arch::Aie2p).expect("the pair at least");
            assert!(!f.pdi.is_empty() && !f.insts.is_empty() && f.insts.len().is_multiple_of(4));
            if f.hsaco.is_none() {
                assert_eq!(f.pdi, b"PAIR", "case {i}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
