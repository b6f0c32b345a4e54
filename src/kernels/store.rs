//! Finding kernel files: the precompiled directory (`GGML_HSA_KERNEL_DIR/<arch>/`) first, then the
//! JIT cache (`<cache dir>/<arch>/`), then a JIT compile into the cache.
//!
//! Files that exist but are unusable (empty, an instruction stream whose size is not a multiple
//! of 4 bytes, an hsaco the strict reader rejects, or files whose size or checksum differs from
//! what the directory's manifest recorded when they were written) are reported with their path
//! and treated as missing: a bad kernel in the cache is removed under its lock (and compiled
//! again when a compiler is set); one in `GGML_HSA_KERNEL_DIR` (the user's) is never touched,
//! only declined. Compile failures are remembered for the rest of the run (negative cache) so a
//! graph does not retry them per node.
//!
//! The cache may be shared by several processes (and, at its default location, with other ggml
//! tools). So: a compile holds an exclusive lock on `<cache>/<arch>/.<name>.lock`, and a process
//! that finds the lock taken waits for it and then uses the other's result instead of compiling
//! again; the compiler writes each file aside and renames it into place, so nobody sees half a
//! kernel; and every kernel this backend wrote is listed in `<cache>/<arch>/.ggml-hsa-kernels`,
//! which is what `GGML_HSA_KERNEL_CACHE_CLEAR` removes (never other files of the directory).
//! Each manifest line is `<name> <file>:<size>:<fnv1a-64 hex> ...`, appended (one write, so
//! atomic) while the kernel's lock is held, after the compiler renamed its files into place; the
//! last line of a name wins. Files without a line (an older backend's, a failed append) get the
//! format checks only. ggml-hsa-gen-kernels writes the same manifest into its output directory,
//! so pregenerated kernels are checked the same way.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use parking_lot::Mutex;

use super::compiler::{Capabilities, Compiler};
use super::desc::{fnv1a64, KernelDesc};
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

/// The list of kernels this backend wrote into a cache directory, one line per kernel: its name,
/// then `<file>:<size>:<checksum>` for each of its files.
pub const MANIFEST: &str = ".ggml-hsa-kernels";

/// What a manifest recorded of one kernel: size and checksum per file name.
type Recorded = HashMap<String, (u64, u64)>;

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
    /// Precompiled kernels already reported as corrupt: `supports_op` searches for a kernel once
    /// per node, and the user needs to read about a bad file once, not once per node.
    reported: Mutex<std::collections::HashSet<String>>,
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
            reported: Mutex::new(std::collections::HashSet::new()),
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

    /// The kernel `name` from the first directory that has a usable copy. A corrupt copy in the
    /// precompiled directory is reported and skipped (the user's files are not ours to change);
    /// a corrupt copy in the cache is returned in the second field, to be removed under its lock.
    fn search(&self, name: &str) -> (Option<KernelFiles>, Option<String>) {
        let cache = self.cache_arch_dir();
        for dir in self.search_dirs() {
            match read_kernel(&dir, name, self.arch) {
                Ok(Some(files)) => return (Some(files), None),
                Ok(None) => {}
                Err(reason) if dir == cache => return (None, Some(reason)),
                Err(reason) => {
                    if self.reported.lock().insert(name.to_owned()) {
                        log::warn(&format!(
                            "ignoring corrupt kernel files of the precompiled kernel {name}: \
                             {reason} (GGML_HSA_KERNEL_DIR is left as it is; regenerate it with \
                             ggml-hsa-gen-kernels)"
                        ))
                    }
                }
            }
        }
        (None, None)
    }

    /// Removes the corrupt cached kernel `name` (found so by [`Self::search`]) under its lock,
    /// unless another process replaced it meanwhile. One log line either way.
    fn remove_corrupt(&self, name: &str, reason: &str) {
        let dir = self.cache_arch_dir();
        let lock = match lock_kernel(&dir, name) {
            Ok(lock) => lock,
            Err(why) => {
                log::warn(&format!(
                    "corrupt cached kernel {name} kept, {why}: {reason}"
                ));
                return;
            }
        };
        if let Err(reason) = read_kernel(&dir, name, self.arch) {
            let failed = remove_kernel_files(&dir, name);
            let next = if self.capabilities().is_ok() {
                "compiling it again"
            } else {
                "no compiler to build it again"
            };
            if failed.is_empty() {
                log::warn(&format!(
                    "removed the corrupt cached kernel {name} from {}: {reason}; {next}",
                    dir.display()
                ));
            } else {
                log::warn(&format!(
                    "cannot remove the corrupt cached kernel {name} ({}): {reason}; it is \
                     not used",
                    failed.join("; ")
                ));
            }
        }
        drop(lock);
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
        let supported = match compilable {
            Err(_) if on_disk() => Ok(()),
            other => other,
        };
        // Every kernel a plan was allowed to count on is recorded, not only those it loaded: a
        // fold is only made where the kernels it would fall back to exist (a fused projection
        // under a rotation fold, say, or the single node `supports_op` asks about), so a server
        // with JIT off makes the same plans from the pregenerated set only if they are in it.
        if let (Ok(()), Some(path)) = (&supported, &self.record) {
            super::record::record(path, self.arch, desc);
        }
        supported
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
        let mut found: Vec<Option<KernelFiles>> = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            if known_bad(name) {
                found.push(None);
                continue;
            }
            let (files, corrupt) = self.search(name);
            if let Some(reason) = corrupt.filter(|_| !names[..i].contains(name)) {
                self.remove_corrupt(name, &reason);
            }
            found.push(files);
        }
        let missing: Vec<usize> = (0..names.len())
            .filter(|&i| {
                found[i].is_none() && !known_bad(&names[i]) && !names[..i].contains(&names[i])
            })
            .collect();
        self.compile_all(descs, &names, &missing);
        // What was compiled is in the cache now (the other directories were read above).
        for (i, name) in names.iter().enumerate() {
            if found[i].is_none() && !known_bad(name) {
                found[i] = match read_kernel(&self.cache_arch_dir(), name, self.arch) {
                    Ok(files) => files,
                    Err(reason) => {
                        log::warn(&format!("kernel {name}: {reason}"));
                        None
                    }
                };
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
                            // A declined shape is an answer, not a fault: the caller runs the
                            // nodes another way (unfused, or on the CPU, which it reports).
                            let say = if failure.refused {
                                log::info
                            } else {
                                log::warn
                            };
                            say(&format!(
                                "[{n}/{total}] {} for {}: {}: {}",
                                names[i],
                                self.arch,
                                if failure.refused {
                                    "declined by the compiler"
                                } else {
                                    "compile failed"
                                },
                                failure.reason
                            ));
                            if let (true, Some(path)) = (failure.refused, &self.record) {
                                super::record::forget(path, self.arch, &descs[i]);
                            }
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
        if let Ok(Some(_)) = read_kernel(&dir, name, self.arch) {
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
        // Sums of what the compiler wrote, recorded while the lock keeps anyone else from
        // writing these files. A compiler that reported success over unusable files is caught
        // by the read that follows (load_many), not recorded as good.
        match read_kernel(&dir, name, self.arch) {
            Ok(Some(_)) => record_written(&dir, name),
            // Nothing written: load_many reports it.
            Ok(None) => {}
            Err(reason) => {
                remove_kernel_files(&dir, name);
                return Err(failed(format!(
                    "the compiler reported success but wrote an unusable kernel ({reason}); \
                     removed it"
                )));
            }
        }
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

/// The files a kernel `name` may have.
fn kernel_file_names(name: &str) -> [String; 3] {
    [
        format!("{name}.pdi"),
        format!("{name}_insts.bin"),
        format!("{name}.hsaco"),
    ]
}

/// Removes the kernel files of `name` in `dir` (the caller holds its lock); returns why each
/// file that exists could not be removed.
fn remove_kernel_files(dir: &Path, name: &str) -> Vec<String> {
    kernel_file_names(name)
        .into_iter()
        .map(|f| dir.join(f))
        .filter_map(|p| match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Some(format!("{}: {e}", p.display()))
            }
            _ => None,
        })
        .collect()
}

/// The manifest line of kernel `name` as its files in `dir` are now.
fn manifest_line(dir: &Path, name: &str) -> String {
    let mut line = name.to_owned();
    for file in kernel_file_names(name) {
        if let Ok(bytes) = std::fs::read(dir.join(&file)) {
            line.push_str(&format!(" {file}:{}:{:016x}", bytes.len(), fnv1a64(&bytes)));
        }
    }
    line.push('\n');
    line
}

/// What `dir`'s manifest recorded for `name` (its last line for that name), if anything.
/// Malformed fields (a line torn by a full disk, a hand edit) are ignored.
fn recorded(dir: &Path, name: &str) -> Option<Recorded> {
    let text = std::fs::read(dir.join(MANIFEST)).ok()?;
    parse_manifest(&String::from_utf8_lossy(&text)).remove(name)
}

/// The manifest's lines: per kernel name, the files with size and checksum its last line
/// records (a bare name records nothing).
pub fn parse_manifest(text: &str) -> HashMap<String, Recorded> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(name) = fields.next() else { continue };
        let files = fields
            .filter_map(|f| {
                let mut parts = f.rsplitn(3, ':');
                let (sum, size, file) = (parts.next()?, parts.next()?, parts.next()?);
                let sum = u64::from_str_radix(sum, 16).ok()?;
                Some((file.to_owned(), (size.parse().ok()?, sum)))
            })
            .collect();
        out.insert(name.to_owned(), files);
    }
    out
}

/// Adds kernel `name` with the sizes and checksums of its files in `dir` to the manifest of
/// `dir` (one short line, appended atomically). ggml-hsa-gen-kernels calls it for its outputs.
pub fn record_written(dir: &Path, name: &str) {
    let path = dir.join(MANIFEST);
    let line = manifest_line(dir, name);
    let appended = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
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
    // The name is a line's first field (the others are its files' sums).
    let names = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !n.contains('/') && !n.starts_with('.'));
    for name in names {
        let [pdi, insts, hsaco] = kernel_file_names(name);
        for file in [pdi, insts, hsaco, format!(".{name}.lock")] {
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
/// `Ok(None)` when absent, `Err` (why, with the path) when present but unusable. A corrupt
/// hsaco beside a good pair is logged and the pair used.
fn read_kernel(dir: &Path, name: &str, arch: Arch) -> Result<Option<KernelFiles>, String> {
    let sums = recorded(dir, name).unwrap_or_default();
    let hsaco_path = dir.join(format!("{name}.hsaco"));
    let hsaco = hsaco_path
        .is_file()
        .then(|| read_hsaco(&hsaco_path, name, arch, &sums));
    match hsaco {
        Some(Ok(files)) => Ok(Some(files)),
        Some(Err(reason)) => match read_pdi_insts(dir, name, &sums) {
            Ok(Some(pair)) => {
                log::warn(&format!("ignoring corrupt kernel file {reason}"));
                Ok(Some(pair))
            }
            _ => Err(reason),
        },
        None => read_pdi_insts(dir, name, &sums),
    }
}

/// `bytes`, read from `path`, checked against the manifest's record of the file, if any. The
/// checksum (FNV-1a) is against torn and damaged files, not an authenticity check: whoever can
/// write the cache can write its manifest.
fn check_recorded(path: &Path, bytes: &[u8], sums: &Recorded) -> Result<(), String> {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned());
    let Some(&(size, sum)) = file.and_then(|f| sums.get(&f)) else {
        return Ok(());
    };
    if bytes.len() as u64 != size {
        return Err(format!(
            "{} is {} bytes, the manifest recorded {size} (truncated or overwritten)",
            path.display(),
            bytes.len()
        ));
    }
    if fnv1a64(bytes) != sum {
        return Err(format!(
            "{} does not match the checksum the manifest recorded (damaged)",
            path.display()
        ));
    }
    Ok(())
}

/// The kernel `name` of an hsaco file, validated by the shared strict reader.
fn read_hsaco(path: &Path, name: &str, arch: Arch, sums: &Recorded) -> Result<KernelFiles, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    check_recorded(path, &bytes, sums)?;
    let at = |e: String| format!("{}: {e}", path.display());
    let kernels = aie_hsaco::read(&bytes, arch.name()).map_err(|e| at(e.to_string()))?;
    let k = kernels
        .into_iter()
        .find(|k| k.name == name)
        .ok_or_else(|| {
            at(format!(
                "no kernel named {name} in its {} section",
                arch.name()
            ))
        })?;
    if k.kind != aie_hsaco::KernelKind::PdiInsts {
        return Err(at(format!(
            "kernel {name} is a full ELF; this backend dispatches PDI + instruction kernels"
        )));
    }
    Ok(KernelFiles {
        name: name.to_owned(),
        pdi: k.pdi,
        insts: k.insts,
        path: path.to_owned(),
        hsaco: Some(bytes),
    })
}

fn read_pdi_insts(dir: &Path, name: &str, sums: &Recorded) -> Result<Option<KernelFiles>, String> {
    let pdi_path = dir.join(format!("{name}.pdi"));
    let insts_path = dir.join(format!("{name}_insts.bin"));
    if !pdi_path.is_file() {
        return Ok(None);
    }
    let read = |path: &Path| {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        check_recorded(path, &bytes, sums)?;
        Ok::<_, String>(bytes)
    };
    let (pdi, insts) = read(&pdi_path).and_then(|pdi| {
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
    })?;
    Ok(Some(KernelFiles {
        name: name.to_owned(),
        pdi,
        insts,
        path: pdi_path,
        hsaco: None,
    }))
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
            extra_outputs: Vec::new(),
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

    /// A compiler (a shell script) that builds RELU f32 for aie2: a 64-byte `.pdi` and an
    /// 8-byte instruction stream, renamed into place; each compile appends a line to `log`.
    fn fake_compiler(dir: &Path, log: &Path) -> Compiler {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("compiler.sh");
        let script = format!(
            r#"#!/bin/sh
if [ "$1" = capabilities ]; then
  echo '{{"protocol": 1, "archs": ["aie2"], "ops": [{{"op": "RELU", "inputs": 1, "types": ["f32"]}}]}}'
  exit 0
fi
name=$(basename "$3" | sed 's/^\.//; s/\.request\..*//')
echo "$name" >> '{}'
head -c 64 /dev/zero | tr '\0' P > "$5/.$name.pdi.tmp"
printf 'INS1INS2' > "$5/.$name"_insts.bin.tmp
mv "$5/.$name.pdi.tmp" "$5/$name.pdi"
mv "$5/.$name"_insts.bin.tmp "$5/$name"_insts.bin
"#,
            log.display()
        );
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Compiler::new(path.to_str().unwrap()).unwrap()
    }

    fn compiles(log: &Path) -> usize {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .count()
    }

    #[test]
    fn the_manifest_records_sizes_and_checksums_and_parses_leniently() {
        let dir = scratch("sums");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("k.pdi"), b"PDI").unwrap();
        std::fs::write(dir.join("k_insts.bin"), [0u8; 4]).unwrap();
        record_written(&dir, "k");
        let text = std::fs::read_to_string(dir.join(MANIFEST)).unwrap();
        assert_eq!(
            text,
            format!(
                "k k.pdi:3:{:016x} k_insts.bin:4:{:016x}\n",
                fnv1a64(b"PDI"),
                fnv1a64(&[0u8; 4])
            )
        );
        let parsed = parse_manifest(&format!(
            "{text}bare\ntorn k.pdi:3\nodd x:y:z k.pdi:9:0g a:b:c:1:ff\n  \n"
        ));
        assert_eq!(parsed["k"]["k.pdi"], (3, fnv1a64(b"PDI")));
        assert!(parsed["bare"].is_empty() && parsed["torn"].is_empty());
        // Only the well-formed field of `odd`: a file name may hold a colon, a size may not.
        assert_eq!(parsed["odd"].len(), 1, "{parsed:?}");
        assert_eq!(parsed["odd"]["a:b:c"], (1, 0xff));
        // The last line of a name wins.
        let again = parse_manifest(&format!("{text}k k.pdi:1:1\n"));
        assert_eq!(again["k"].len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_truncated_or_damaged_cached_kernel_is_removed_and_compiled_again() {
        let root = scratch("recompile");
        let log = root.join("compiles.log");
        let d = desc();
        let name = d.canonical_name();
        let cache = root.join("cache");
        let arch_dir = cache.join("aie2");
        let store = || {
            let jit = fake_compiler(&root, &log);
            KernelStore::new(Arch::Aie2, None, cache.clone(), Some(jit), false)
        };
        let good = store().load(&d).unwrap();
        assert_eq!((good.pdi.len(), compiles(&log)), (64, 1));
        let manifest = parse_manifest(&std::fs::read_to_string(arch_dir.join(MANIFEST)).unwrap());
        assert_eq!(manifest[&name][&format!("{name}.pdi")].0, 64);
        // A kernel read from a whole cache is not compiled again.
        assert_eq!(store().load(&d).unwrap(), good);
        assert_eq!(compiles(&log), 1);
        let pdi = arch_dir.join(format!("{name}.pdi"));
        type Damage = Box<dyn Fn(&mut Vec<u8>)>;
        let damages: [(&str, Damage); 3] = [
            ("truncated", Box::new(|b| b.truncate(40))),
            ("one byte changed", Box::new(|b| b[17] ^= 0x20)),
            ("grown", Box::new(|b| b.extend_from_slice(b"junk"))),
        ];
        for (n, (what, damage)) in damages.iter().enumerate() {
            let mut bytes = std::fs::read(&pdi).unwrap();
            damage(&mut bytes);
            std::fs::write(&pdi, &bytes).unwrap();
            // A new process (store): the damaged copy is removed and compiled again.
            let loaded = store().load(&d).unwrap();
            assert_eq!(loaded.pdi, good.pdi, "{what}");
            assert_eq!(compiles(&log), n + 2, "{what}");
            assert_eq!(std::fs::read(&pdi).unwrap(), good.pdi, "{what}");
        }
        // Without a compiler the damaged copy is removed all the same, and the kernel is missing.
        std::fs::write(&pdi, b"PP").unwrap();
        let no_jit = KernelStore::new(Arch::Aie2, None, cache.clone(), None, false);
        assert!(no_jit.load(&d).is_err());
        assert!(!pdi.exists() && !arch_dir.join(format!("{name}_insts.bin")).exists());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_damaged_precompiled_kernel_is_declined_and_never_removed() {
        let root = scratch("pre-damaged");
        let log = root.join("compiles.log");
        let d = desc();
        let name = d.canonical_name();
        let pre = root.join("pre").join("aie2");
        std::fs::create_dir_all(&pre).unwrap();
        std::fs::write(pre.join(format!("{name}.pdi")), [7u8; 32]).unwrap();
        std::fs::write(pre.join(format!("{name}_insts.bin")), [1u8; 8]).unwrap();
        // As ggml-hsa-gen-kernels records them.
        record_written(&pre, &name);
        let store = |jit: Option<Compiler>| {
            KernelStore::new(
                Arch::Aie2,
                Some(root.join("pre")),
                root.join("cache"),
                jit,
                false,
            )
        };
        assert_eq!(store(None).load(&d).unwrap().pdi, [7u8; 32]);
        std::fs::write(pre.join(format!("{name}.pdi")), [7u8; 31]).unwrap();
        // Declined: without a compiler the kernel is missing, with one it is compiled into the
        // cache; the user's file stays as it is either way.
        assert!(store(None).load(&d).is_err());
        let compiled = store(Some(fake_compiler(&root, &log))).load(&d).unwrap();
        assert_eq!((compiled.pdi.len(), compiles(&log)), (64, 1));
        assert!(compiled.path.starts_with(root.join("cache")));
        assert_eq!(
            std::fs::read(pre.join(format!("{name}.pdi"))).unwrap(),
            [7u8; 31]
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn hsaco_files_are_preferred_and_corrupt_ones_ignored() {
        let dir = scratch("hsaco");
        std::fs::create_dir_all(&dir).unwrap();
        let good = aie_hsaco::write_single("aie2p", "k", b"PDI!", &[1, 0, 0, 0], 2, 1).unwrap();
        std::fs::write(dir.join("k.hsaco"), &good).unwrap();
        let f = read_kernel(&dir, "k", Arch::Aie2p).unwrap().unwrap();
        assert_eq!(
            (f.pdi.as_slice(), f.insts.as_slice()),
            (&b"PDI!"[..], &[1, 0, 0, 0][..])
        );
        assert_eq!(f.hsaco.as_deref(), Some(good.as_slice()));
        // No aie2 section, no .pdi: no kernel for aie2; another name: none either.
        assert!(read_kernel(&dir, "k", Arch::Aie2).is_err());
        std::fs::copy(dir.join("k.hsaco"), dir.join("other.hsaco")).unwrap();
        assert!(read_kernel(&dir, "other", Arch::Aie2p).is_err());
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
            let f = read_kernel(&dir, "k", Arch::Aie2p)
                .unwrap()
                .expect("the pair at least");
            assert!(!f.pdi.is_empty() && !f.insts.is_empty() && f.insts.len().is_multiple_of(4));
            if f.hsaco.is_none() {
                assert_eq!(f.pdi, b"PAIR", "case {i}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
