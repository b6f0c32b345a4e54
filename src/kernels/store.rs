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
//! The cache may be shared by several processes of the user. So: a compile holds an exclusive
//! lock on `<cache>/<arch>/.<name>.lock`, and a process that finds the lock taken waits for it
//! and then uses the other's result instead of compiling again; the compiler writes each file
//! aside and renames it into place, so nobody sees half a kernel (`kernel_dir` has the manifest
//! and the size cap).
//!
//! Where kernels may come from is decided once, when the store is first used (`trust`): the
//! precompiled directory only if the user or root owns it and nobody else can write it; the
//! cache likewise, created private (0700), else the per-user fallback, else none (then nothing
//! is compiled or read from a cache, and nodes without a precompiled kernel are declined). Each
//! refusal is one warning naming the path and the fix.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use parking_lot::Mutex;

use super::compiler::{Capabilities, Compiler};
use super::desc::KernelDesc;
pub use super::kernel_dir::KernelFiles;
use super::kernel_dir::{
    enforce_cap, lock_kernel, read_kernel, record_written, remove_kernel_files,
    remove_partial_files, touch, Manifests,
};
use super::{trust, Arch};
use crate::log;

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

/// The most kernels remembered as failed, or as reported corrupt (the oldest are forgotten
/// first): a run asks for few kernels; a client spraying shapes must not grow the process.
const REMEMBERED: usize = 4096;

/// The default size cap of a cache directory (`GGML_HSA_KERNEL_CACHE_MAX`), per architecture.
pub const DEFAULT_CACHE_MAX: u64 = 2 << 30;

/// A map that forgets its oldest entries when full.
#[derive(Debug)]
struct Bounded<K, V> {
    map: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K: Hash + Eq + Clone, V> Bounded<K, V> {
    fn new() -> Self {
        Bounded {
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Inserts `k`; whether it was new.
    fn insert(&mut self, k: K, v: V) -> bool {
        if self.map.insert(k.clone(), v).is_some() {
            return false;
        }
        self.order.push_back(k);
        if self.order.len() > REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        true
    }

    fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k)
    }

    fn contains_key(&self, k: &K) -> bool {
        self.map.contains_key(k)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// The directories a store may use, as decided by the trust rules.
#[derive(Debug, Clone)]
struct Places {
    kernel_dir: Option<PathBuf>,
    /// The cache root (its `<arch>` folder is created when a kernel is compiled).
    cache: Option<PathBuf>,
}

/// Where kernels come from, for one architecture.
#[derive(Debug)]
pub struct KernelStore {
    arch: Arch,
    kernel_dir: Option<PathBuf>,
    cache_dir: PathBuf,
    /// Where the cache goes when `cache_dir` is refused.
    cache_fallback: Option<PathBuf>,
    cache_max: u64,
    places: OnceLock<Places>,
    jit: Option<Compiler>,
    verbose: bool,
    capabilities: OnceLock<Result<Capabilities, String>>,
    failed: Mutex<Bounded<String, Failure>>,
    /// Precompiled kernels already reported as corrupt: `supports_op` searches for a kernel once
    /// per node, and the user needs to read about a bad file once, not once per node.
    reported: Mutex<Bounded<String, ()>>,
    manifests: Manifests,
    /// `GGML_HSA_KERNEL_RECORD`: where to record the kernels used.
    record: Option<PathBuf>,
}

/// Why a cache directory cannot be had, for a compile's error.
fn cache_error(e: trust::Untrusted) -> String {
    if e.refused {
        format!(
            "the cache directory {} is refused: {}",
            e.path.display(),
            e.why
        )
    } else {
        format!(
            "cannot create the cache directory {}: {}",
            e.path.display(),
            e.why
        )
    }
}

/// Logs `message` once per process (several devices share the same directories).
fn warn_once(message: String) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    if SAID
        .lock()
        .get_or_insert_with(HashSet::new)
        .insert(message.clone())
    {
        log::warn(&message);
    }
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
            cache_fallback: None,
            cache_max: DEFAULT_CACHE_MAX,
            places: OnceLock::new(),
            jit,
            verbose,
            capabilities: OnceLock::new(),
            failed: Mutex::new(Bounded::new()),
            reported: Mutex::new(Bounded::new()),
            manifests: Manifests::default(),
            record: None,
        }
    }

    /// The private directory to cache kernels in when the cache directory is refused.
    pub fn with_cache_fallback(mut self, dir: Option<PathBuf>) -> KernelStore {
        self.cache_fallback = dir;
        self
    }

    /// The most bytes of kernels kept in the cache directory of this architecture.
    pub fn with_cache_max(mut self, bytes: u64) -> KernelStore {
        self.cache_max = bytes;
        self
    }

    /// The directories this store may use, decided (and each refusal logged) on first use.
    fn places(&self) -> &Places {
        self.places.get_or_init(|| {
            let kernel_dir = self
                .kernel_dir
                .as_ref()
                .and_then(|dir| match trust::check_dir(dir) {
                    Ok(real) => Some(real),
                    Err(e) => {
                        warn_once(format!(
                            "GGML_HSA_KERNEL_DIR refused, no precompiled kernels are read: {e}"
                        ));
                        None
                    }
                });
            // A directory refused by the rules sends the cache to the private fallback; one that
            // cannot be created (a read-only or full file system) stays the cache, and the compile
            // that needs it fails with the reason.
            let mut cache = None;
            for dir in std::iter::once(&self.cache_dir).chain(&self.cache_fallback) {
                match trust::private_dir(dir) {
                    Ok(real) => {
                        cache = Some(real);
                        break;
                    }
                    Err(e) if !e.refused => {
                        cache = Some(dir.clone());
                        break;
                    }
                    Err(e) => warn_once(format!(
                        "kernel cache directory refused, nothing is read from or written to it: \
                         {e}"
                    )),
                }
            }
            if cache.is_none() && self.jit.is_some() {
                warn_once(
                    "no private kernel cache directory: kernels are not compiled, only \
                     precompiled ones (GGML_HSA_KERNEL_DIR) are used; set \
                     GGML_HSA_KERNEL_CACHE_DIR to a directory of yours"
                        .to_owned(),
                );
            }
            Places { kernel_dir, cache }
        })
    }

    /// Records every kernel this store provides into the gen-kernels config at `path`.
    pub fn with_record(mut self, path: Option<PathBuf>) -> KernelStore {
        self.record = path;
        self
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The cache folder of this architecture, if there is a trusted cache and the folder exists
    /// and passes the rules.
    fn cache_arch_dir(&self) -> Option<PathBuf> {
        let root = self.places().cache.as_ref()?;
        self.arch_dir(root)
    }

    /// The cache folder of this architecture, created (with the cache, which may have been
    /// removed since the store was set up) when missing; the error says why it cannot be had.
    fn make_cache_arch_dir(&self) -> Result<PathBuf, String> {
        let root = self.places().cache.as_ref().ok_or_else(|| {
            format!(
                "the cache directory {} is refused (see the log)",
                self.cache_dir.display()
            )
        })?;
        let root = trust::private_dir(root).map_err(cache_error)?;
        trust::sub_dir(&root, self.arch.name(), true).map_err(cache_error)
    }

    /// `<root>/<arch>` if it exists and passes the rules (a refusal is logged once).
    fn arch_dir(&self, root: &std::path::Path) -> Option<PathBuf> {
        match trust::sub_dir(root, self.arch.name(), false) {
            Ok(dir) => Some(dir),
            Err(e) => {
                if e.refused {
                    warn_once(format!("kernel directory refused: {e}"));
                }
                None
            }
        }
    }

    /// The directories to look in, in order, each with whether it is the cache.
    fn search_dirs(&self) -> impl Iterator<Item = (PathBuf, bool)> + '_ {
        let places = self.places();
        places
            .kernel_dir
            .iter()
            .filter_map(|d| self.arch_dir(d))
            .map(|d| (d, false))
            .chain(self.cache_arch_dir().map(|d| (d, true)))
    }

    /// The kernel `name` from the first directory that has a usable copy. A corrupt copy in the
    /// precompiled directory is reported and skipped (the user's files are not ours to change);
    /// a corrupt copy in the cache is returned in the second field, to be removed under its lock.
    fn search(&self, name: &str) -> (Option<KernelFiles>, Option<String>) {
        for (dir, is_cache) in self.search_dirs() {
            match read_kernel(&dir, name, self.arch, &self.manifests) {
                Ok(Some(files)) => {
                    if is_cache {
                        touch(&dir, name);
                    }
                    return (Some(files), None);
                }
                Ok(None) => {}
                Err(reason) if is_cache => return (None, Some(reason)),
                Err(reason) => {
                    if self.reported.lock().insert(name.to_owned(), ()) {
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
        let Some(dir) = self.cache_arch_dir() else {
            return;
        };
        let lock = match lock_kernel(&dir, name) {
            Ok(lock) => lock,
            Err(why) => {
                log::warn(&format!(
                    "corrupt cached kernel {name} kept, {why}: {reason}"
                ));
                return;
            }
        };
        if let Err(reason) = read_kernel(&dir, name, self.arch, &self.manifests) {
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
        let Some(cache) = &self.places().cache else {
            return Err("there is no private cache directory to compile into");
        };
        self.capabilities
            .get_or_init(|| {
                // Asked in the cache, which is made first (the compiler runs there).
                let caps = trust::private_dir(cache)
                    .map_err(cache_error)
                    .and_then(|dir| jit.capabilities(&dir));
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
            self.search_dirs().any(|(dir, _)| {
                trust::is_regular_file(&dir.join(format!("{name}.pdi")))
                    || trust::is_regular_file(&dir.join(format!("{name}.hsaco")))
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
        let cache = self.cache_arch_dir();
        for (i, name) in names.iter().enumerate() {
            if found[i].is_none() && !known_bad(name) {
                let Some(cache) = &cache else { continue };
                found[i] = match read_kernel(cache, name, self.arch, &self.manifests) {
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
                            cache
                                .as_deref()
                                .unwrap_or(self.cache_dir.as_path())
                                .display()
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
        // Asked once: on Linux the answer reads the cgroup's files.
        static CORES: OnceLock<usize> = OnceLock::new();
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let jobs = cores.min(total);
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
        let dir = self.make_cache_arch_dir().map_err(failed)?;
        let lock = lock_kernel(&dir, name).map_err(failed)?;
        if let Ok(Some(_)) = read_kernel(&dir, name, self.arch, &self.manifests) {
            return Ok("compiled by another process");
        }
        // Holding the lock, nobody else writes this kernel: temporary files of it are what a
        // compiler or a process killed mid-compile left behind.
        remove_partial_files(&dir, name, false);
        let request = dir.join(format!(".{name}.request.{}.json", std::process::id()));
        let written = trust::create_new(&request).and_then(|mut f| {
            use std::io::Write;
            f.write_all(desc.request_json(self.arch).as_bytes())
                .map_err(|e| format!("{}: {e}", request.display()))
        });
        written.map_err(|e| {
            // A full disk leaves the file created but short: keep nothing half-written.
            let _ = std::fs::remove_file(&request);
            failed(format!("cannot write the request {e}"))
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
        super::kernel_dir::seal_kernel_files(&dir, name);
        match read_kernel(&dir, name, self.arch, &self.manifests) {
            Ok(Some(_)) => {
                record_written(&dir, name);
                let evicted = enforce_cap(&dir, self.cache_max, name);
                if !evicted.is_empty() {
                    log::info(&format!(
                        "kernel cache {} over its {} byte cap: removed the {} least recently \
                         used kernel(s)",
                        dir.display(),
                        self.cache_max,
                        evicted.len()
                    ));
                }
            }
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
        self.cache_arch_dir()
            .map(|dir| super::kernel_dir::clear_cache_dir(&dir))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::desc::{fnv1a64, Layout};
    use super::super::kernel_dir::{clear_cache_dir, parse_manifest, MANIFEST};
    use super::*;
    use std::path::Path;

    fn desc() -> KernelDesc {
        let t = Layout::contiguous("f32", 4, [16, 1, 1, 1]);
        KernelDesc {
            op: "RELU".into(),
            op_params: vec![],
            inputs: vec![t.clone()],
            output: t,
            f16_as_bf16: false,
            n_kv_step: None,
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
        let f = read_kernel(&dir, "k", Arch::Aie2p, &Manifests::default())
            .unwrap()
            .unwrap();
        assert_eq!(
            (f.pdi.as_slice(), f.insts.as_slice()),
            (&b"PDI!"[..], &[1, 0, 0, 0][..])
        );
        assert_eq!(f.hsaco.as_deref(), Some(good.as_slice()));
        // No aie2 section, no .pdi: no kernel for aie2; another name: none either.
        assert!(read_kernel(&dir, "k", Arch::Aie2, &Manifests::default()).is_err());
        std::fs::copy(dir.join("k.hsaco"), dir.join("other.hsaco")).unwrap();
        assert!(read_kernel(&dir, "other", Arch::Aie2p, &Manifests::default()).is_err());
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
            let f = read_kernel(&dir, "k", Arch::Aie2p, &Manifests::default())
                .unwrap()
                .expect("the pair at least");
            assert!(!f.pdi.is_empty() && !f.insts.is_empty() && f.insts.len().is_multiple_of(4));
            if f.hsaco.is_none() {
                assert_eq!(f.pdi, b"PAIR", "case {i}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A kernel planted with a matching manifest, in a cache someone else could have written:
    /// never read. The store uses its private fallback instead (compiling there) or declines.
    #[test]
    fn planted_kernels_in_a_foreign_or_writable_cache_are_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let root = scratch("planted");
        let d = desc();
        let name = d.canonical_name();
        let shared = root.join("shared");
        let plant = |dir: &Path| {
            let arch = dir.join("aie2");
            std::fs::create_dir_all(&arch).unwrap();
            std::fs::write(arch.join(format!("{name}.pdi")), b"EVIL").unwrap();
            std::fs::write(arch.join(format!("{name}_insts.bin")), [0u8; 8]).unwrap();
            record_written(&arch, &name);
        };
        plant(&shared);
        let chmod = |p: &Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        // As a fresh `/tmp/ggml` made by another user would be: writable by anyone.
        chmod(&shared, 0o777);
        let store = KernelStore::new(Arch::Aie2, None, shared.clone(), None, false);
        assert!(store.load(&d).is_err(), "the planted kernel was used");
        let err = store.supports(&d).unwrap_err();
        assert!(err.contains("JIT compilation is disabled"), "{err}");
        // With a compiler and a private fallback: compiled into the fallback.
        let log = root.join("compiles.log");
        let fallback = root.join("private");
        let store = KernelStore::new(
            Arch::Aie2,
            None,
            shared.clone(),
            Some(fake_compiler(&root, &log)),
            false,
        )
        .with_cache_fallback(Some(fallback.clone()));
        let k = store.load(&d).unwrap();
        assert_eq!(k.pdi.len(), 64);
        assert!(k
            .path
            .starts_with(std::fs::canonicalize(&fallback).unwrap()));
        let mode = std::fs::metadata(&fallback).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // The arch folder writable by others inside a private cache: refused as well.
        chmod(&shared, 0o700);
        chmod(&shared.join("aie2"), 0o777);
        let store = KernelStore::new(Arch::Aie2, None, shared.clone(), None, false);
        assert!(store.load(&d).is_err());
        // Owned by another user (only root can set this up).
        chmod(&shared.join("aie2"), 0o700);
        if trust::euid() == 0 {
            let store = KernelStore::new(Arch::Aie2, None, shared.clone(), None, false);
            assert_eq!(
                store.load(&d).unwrap().pdi,
                b"EVIL",
                "the premise: ours is read"
            );
            std::os::unix::fs::chown(&shared, Some(65534), None).unwrap();
            let store = KernelStore::new(Arch::Aie2, None, shared.clone(), None, false);
            assert!(store.load(&d).is_err(), "a foreign cache was read");
            // The same for a precompiled directory.
            let store = KernelStore::new(
                Arch::Aie2,
                Some(shared.clone()),
                root.join("empty"),
                None,
                false,
            );
            assert!(
                store.load(&d).is_err(),
                "a foreign kernel directory was read"
            );
        }
        let _ = std::fs::remove_dir_all(root);
    }

    /// A FIFO where a kernel file should be would hang every reader; a link to /dev/zero would
    /// read without end; a link to another file would read what the link's author chose.
    #[test]
    fn fifos_links_and_oversized_files_are_declined_at_once() {
        let root = scratch("special");
        let d = desc();
        let name = d.canonical_name();
        let arch = root.join("cache").join("aie2");
        std::fs::create_dir_all(&arch).unwrap();
        std::fs::write(arch.join(format!("{name}.pdi")), b"PDI!").unwrap();
        let insts = arch.join(format!("{name}_insts.bin"));
        let status = std::process::Command::new("mkfifo")
            .arg(&insts)
            .status()
            .unwrap();
        assert!(status.success());
        let cache = root.join("cache");
        let store = move || KernelStore::new(Arch::Aie2, None, cache.clone(), None, false);
        let (done, wait) = std::sync::mpsc::channel();
        let first = store.clone();
        std::thread::spawn(move || done.send(first().load(&desc()).is_err()));
        let declined = wait.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(declined, Ok(true), "a FIFO hung or was read");
        // The manifest and the lock file behind links: not followed.
        for (file, target) in [
            (insts.clone(), "/dev/zero"),
            (arch.join(MANIFEST), "/dev/zero"),
        ] {
            let _ = std::fs::remove_file(&file);
            std::os::unix::fs::symlink(target, &file).unwrap();
        }
        std::fs::write(arch.join(format!("{name}.pdi")), b"PDI!").unwrap();
        assert!(store().load(&d).is_err());
        let lock = arch.join(format!(".{name}.lock"));
        std::os::unix::fs::symlink(root.join("elsewhere"), &lock).unwrap();
        assert!(lock_kernel(&arch, &name).is_err());
        assert!(
            !root.join("elsewhere").exists(),
            "the lock link was followed"
        );
        // A file past the size cap is declined without being read whole.
        let _ = std::fs::remove_file(&insts);
        std::fs::write(&insts, [0u8; 8]).unwrap();
        let pdi = std::fs::File::create(arch.join(format!("{name}.pdi"))).unwrap();
        pdi.set_len(trust::KERNEL_FILE_CAP + 4).unwrap();
        let _ = std::fs::remove_file(arch.join(MANIFEST));
        let err = read_kernel(&arch, &name, Arch::Aie2, &Manifests::default()).unwrap_err();
        assert!(err.contains("more than"), "{err}");
        let _ = std::fs::remove_dir_all(root);
    }

    /// A fast compiler (a shell script of builtins) that writes a 1 KiB kernel for any shape,
    /// and declines (exit 2) the shapes whose first dimension is a multiple of 3.
    fn spray_compiler(dir: &Path) -> Compiler {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("spray.sh");
        let script = r#"#!/bin/sh
if [ "$1" = capabilities ]; then
  echo '{"protocol": 1, "archs": ["aie2"], "ops": [{"op": "RELU", "inputs": 1, "types": ["f32"]}]}'
  exit 0
fi
f=${3##*/}; f=${f#.}; name=${f%%.request.*}
case "$name" in *_3x*|*_6x*|*_9x*) ;; esac
n=${name#*f32_}; n=${n%%[!0-9]*}
if [ $((n % 3)) -eq 0 ]; then exit 2; fi
printf '%1024s' P > "$5/$name.pdi"
printf 'INS1INS2' > "$5/${name}_insts.bin"
"#;
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Compiler::new(path.to_str().unwrap()).unwrap()
    }

    /// A client of ggml-rpc-server sending 10,000 shapes: the cache stays within its cap, the
    /// manifest and the lock files do not pile up, the remembered failures are bounded.
    #[test]
    fn a_spray_of_shapes_stays_within_the_cache_cap() {
        // In memory where there is a tmpfs: the test creates and removes some 50,000 files.
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        let root = base.join(format!("ggml-hsa-spray-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let cap = 64 << 10;
        let store = KernelStore::new(
            Arch::Aie2,
            None,
            root.join("cache"),
            Some(spray_compiler(&root)),
            false,
        )
        .with_cache_max(cap);
        let arch = root.join("cache").join("aie2");
        let shape = |n: i64| {
            let mut d = desc();
            d.inputs[0] = Layout::contiguous("f32", 4, [n, 1, 1, 1]);
            d.output = d.inputs[0].clone();
            d
        };
        let mut declined = 0;
        for n in 1..=10_000 {
            match store.load(&shape(n)) {
                Ok(k) => assert_eq!(k.pdi.len(), 1024),
                Err(e) => {
                    assert!(e.refused, "{e}");
                    declined += 1;
                }
            }
            if n % 2_500 == 0 {
                let bytes: u64 = std::fs::read_dir(&arch)
                    .unwrap()
                    .map(|e| e.unwrap().metadata().unwrap().len())
                    .sum();
                let files = std::fs::read_dir(&arch).unwrap().count();
                assert!(bytes <= cap + (64 << 10), "after {n} shapes: {bytes} bytes");
                assert!(files < 200, "after {n} shapes: {files} files");
            }
        }
        assert_eq!(declined, 3333);
        assert!(store.failed.lock().len() <= REMEMBERED);
        let locks = std::fs::read_dir(&arch)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".lock")
            })
            .count();
        assert!(locks <= 1, "{locks} lock files left");
        let manifest = std::fs::read_to_string(arch.join(MANIFEST)).unwrap();
        assert!(
            manifest.lines().count() < 200,
            "the manifest was not compacted"
        );
        // The most recent kernels are still there; the first ones were evicted.
        let kept = |n: i64| {
            trust::is_regular_file(&arch.join(format!("{}.pdi", shape(n).canonical_name())))
        };
        assert!(kept(10_000) && kept(9_998) && !kept(1));
        let _ = std::fs::remove_dir_all(root);
    }
}
