//! One directory of kernel files (`<root>/<arch>/`, the precompiled one or the cache): reading a
//! kernel, the manifest of the kernels the backend wrote, compile locks, clearing, and the cache's
//! size cap.
//!
//! Every kernel this backend wrote is listed in `<dir>/.ggml-hsa-kernels`, which is what
//! `GGML_HSA_KERNEL_CACHE_CLEAR` removes (never other files of the directory) and what the size
//! cap counts. Each manifest line is `<name> <file>:<size>:<fnv1a-64 hex> ...`, appended with the
//! manifest locked (`flock` on the file itself) after the compiler renamed the kernel's files into
//! place; the last line of a name wins. Files without a line (an older backend's, a failed
//! append) get the format checks only. ggml-hsa-gen-kernels writes the same manifest into its
//! output directory, so pregenerated kernels are checked the same way. A manifest is parsed once
//! per change of the file, not per lookup, and rewritten with one line per kernel when the cap
//! evicts or stale lines pile up.
//!
//! Files are opened as `trust` says: no symbolic links, regular files, owned by the user or root,
//! size-capped.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::desc::fnv1a64;
use super::trust;
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
pub type Recorded = HashMap<String, (u64, u64)>;

/// A parsed manifest: per kernel name, what its last line records.
type Parsed = Arc<HashMap<String, Recorded>>;

/// What identifies one version of a manifest file: size, modification time, inode.
type Stamp = (u64, i64, i64, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
}

/// Parsed manifests, per directory, kept while their file does not change (a lookup costs one
/// `stat`, not a read and a parse).
#[derive(Debug, Default)]
pub struct Manifests {
    parsed: Mutex<HashMap<PathBuf, (Stamp, Parsed)>>,
}

impl Manifests {
    /// What `dir`'s manifest recorded for `name` (its last line for that name), if anything.
    /// Malformed fields (a line torn by a full disk, a hand edit) are ignored.
    pub fn recorded(&self, dir: &Path, name: &str) -> Option<Recorded> {
        self.all(dir)?.get(name).cloned()
    }

    fn all(&self, dir: &Path) -> Option<Parsed> {
        let path = dir.join(MANIFEST);
        let now = stamp(&path)?;
        if let Some((seen, parsed)) = self.parsed.lock().get(dir) {
            if *seen == now {
                return Some(parsed.clone());
            }
        }
        let text = trust::read_file(&path, trust::MANIFEST_CAP).ok()??;
        let parsed = Arc::new(parse_manifest(&String::from_utf8_lossy(&text)));
        self.parsed
            .lock()
            .insert(dir.to_owned(), (now, parsed.clone()));
        Some(parsed)
    }
}

/// The manifest of `dir` opened for appending and locked: the lock orders its writers (appends
/// and rewrites). A rewrite renames a new file over it, so a writer that waited on the old file
/// opens the new one and locks again.
fn lock_manifest(dir: &Path) -> Result<File, String> {
    let path = dir.join(MANIFEST);
    loop {
        let file = trust::open_own(&path, true)?;
        file.lock()
            .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
        let locked = file.metadata().map(|m| m.ino()).ok();
        let current = std::fs::symlink_metadata(&path).map(|m| m.ino()).ok();
        if locked.is_some() && locked == current {
            return Ok(file);
        }
    }
}

/// Marks kernel `name` in `dir` as used now (the size cap evicts the least recently used).
pub(super) fn touch(dir: &Path, name: &str) {
    for file in kernel_file_names(name) {
        if trust::set_modified_now(&dir.join(file)) {
            return;
        }
    }
}

/// When a file of `name` in `dir` was last used (its modification time; the oldest possible
/// when it has no file left).
fn last_used(dir: &Path, name: &str) -> (i64, i64) {
    kernel_file_names(name)
        .iter()
        .find_map(|f| std::fs::symlink_metadata(dir.join(f)).ok())
        .map_or((i64::MIN, 0), |m| (m.mtime(), m.mtime_nsec()))
}

/// Keeps the kernels this backend wrote into `dir` within `cap` bytes (by the sizes their
/// manifest lines record): when they are over it, the least recently used are removed, down to
/// nine tenths of the cap, except `keep` (the kernel just written) and kernels whose lock
/// another process holds. The manifest is then rewritten with one line per kernel left; it is
/// also rewritten when stale lines (names written again, removed kernels) outnumber live ones.
/// Returns the names removed.
pub(super) fn enforce_cap(dir: &Path, cap: u64, keep: &str) -> Vec<String> {
    let Ok(_locked) = lock_manifest(dir) else {
        return Vec::new();
    };
    let path = dir.join(MANIFEST);
    let Ok(Some(text)) = trust::read_file(&path, trust::MANIFEST_CAP) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&text);
    let lines = text.lines().count();
    let mut kernels = parse_manifest(&text);
    // Kernels whose files are gone (removed by hand, say) no longer count.
    kernels.retain(|name, _| {
        kernel_file_names(name)
            .iter()
            .any(|f| trust::is_regular_file(&dir.join(f)))
    });
    let size = |r: &Recorded| r.values().map(|&(bytes, _)| bytes).sum::<u64>();
    let mut total: u64 = kernels.values().map(size).sum();
    let mut evicted = Vec::new();
    if total > cap {
        let mut by_age: Vec<(_, String)> = kernels
            .keys()
            .filter(|n| n.as_str() != keep)
            .map(|n| (last_used(dir, n), n.clone()))
            .collect();
        by_age.sort();
        let target = cap / 10 * 9;
        for (_, name) in by_age {
            if total <= target {
                break;
            }
            let Some(lock) = try_lock_kernel(dir, &name) else {
                continue;
            };
            if remove_kernel_files(dir, &name).is_empty() {
                total -= kernels.remove(&name).map_or(0, |r| size(&r));
                evicted.push(name);
            }
            drop(lock);
        }
    }
    if !evicted.is_empty() || lines > 2 * kernels.len() + 64 {
        let mut names: Vec<&String> = kernels.keys().collect();
        names.sort();
        let mut compact = String::new();
        for name in names {
            compact.push_str(&record_line(name, &kernels[name]));
        }
        let aside = dir.join(format!("{MANIFEST}.{}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&aside);
        let written = trust::create_new(&aside)
            .and_then(|mut f| f.write_all(compact.as_bytes()).map_err(|e| e.to_string()))
            .and_then(|()| std::fs::rename(&aside, &path).map_err(|e| e.to_string()));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&aside);
            log::warn(&format!("cannot compact {}: {e}", path.display()));
        }
    }
    evicted
}

/// Takes write access for group and others away from the files of `name` the compiler wrote
/// (under a permissive umask), so that they pass the rules when read.
pub fn seal_kernel_files(dir: &Path, name: &str) {
    for file in kernel_file_names(name) {
        trust::seal(&dir.join(file));
    }
}

/// A manifest line for `name` with what `files` records.
fn record_line(name: &str, files: &Recorded) -> String {
    let mut files: Vec<_> = files.iter().collect();
    files.sort();
    let mut line = name.to_owned();
    for (file, (size, sum)) in files {
        line.push_str(&format!(" {file}:{size}:{sum:016x}"));
    }
    line.push('\n');
    line
}

/// Takes the compile lock of kernel `name` in `dir`, waiting while another process holds it.
pub(super) fn lock_kernel(dir: &Path, name: &str) -> Result<KernelLock, String> {
    let path = dir.join(format!(".{name}.lock"));
    let file =
        trust::open_own(&path, false).map_err(|e| format!("cannot create the lock file {e}"))?;
    file.lock()
        .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
    Ok(KernelLock { path, _file: file })
}

/// The compile lock of one kernel, held while it lives. Its file is removed on release, so that
/// a cache visited by many shapes does not keep one lock file per shape: a process that opened
/// the old file and waits on it then finds the kernel written (or compiles it once more, which
/// only costs time).
#[derive(Debug)]
pub(super) struct KernelLock {
    path: PathBuf,
    _file: File,
}

impl Drop for KernelLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes the lock of kernel `name` if nobody holds it.
fn try_lock_kernel(dir: &Path, name: &str) -> Option<KernelLock> {
    let path = dir.join(format!(".{name}.lock"));
    let file = trust::open_own(&path, false).ok()?;
    file.try_lock().ok()?;
    Some(KernelLock { path, _file: file })
}

/// Removes the temporary files of kernel `name` in `dir` (`.<name>.pdi.*`, `.<name>_insts.bin.*`,
/// `.<name>.hsaco.*`: the protocol's "written aside, renamed into place"; `.<name>.request.*`),
/// and with `outputs` its kernel files too. The caller holds the kernel's lock. Canonical names
/// have no dots, so these prefixes never reach another kernel's files.
pub(super) fn remove_partial_files(dir: &Path, name: &str, outputs: bool) {
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
pub(super) fn remove_kernel_files(dir: &Path, name: &str) -> Vec<String> {
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
        if let Ok(Some(bytes)) = trust::read_file(&dir.join(&file), trust::KERNEL_FILE_CAP) {
            line.push_str(&format!(" {file}:{}:{:016x}", bytes.len(), fnv1a64(&bytes)));
        }
    }
    line.push('\n');
    line
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
    let appended = lock_manifest(dir)
        .and_then(|mut f| f.write_all(line.as_bytes()).map_err(|e| e.to_string()));
    if let Err(e) = appended {
        log::warn(&format!(
            "cannot record {name} in {}: {e}; clearing the cache will not remove it",
            path.display()
        ));
    }
}

/// Removes the kernels listed in `dir`'s manifest, their lock files and the manifest.
pub fn clear_cache_dir(dir: &Path) -> Vec<PathBuf> {
    let Ok(Some(list)) = trust::read_file(&dir.join(MANIFEST), trust::MANIFEST_CAP) else {
        return Vec::new();
    };
    let list = String::from_utf8_lossy(&list);
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
pub(super) fn read_kernel(
    dir: &Path,
    name: &str,
    arch: Arch,
    manifests: &Manifests,
) -> Result<Option<KernelFiles>, String> {
    let sums = manifests.recorded(dir, name).unwrap_or_default();
    let hsaco_path = dir.join(format!("{name}.hsaco"));
    let hsaco =
        trust::is_regular_file(&hsaco_path).then(|| read_hsaco(&hsaco_path, name, arch, &sums));
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
    let bytes = trust::read_file(path, trust::KERNEL_FILE_CAP)?
        .ok_or_else(|| format!("{}: removed while being read", path.display()))?;
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
    if !trust::is_regular_file(&pdi_path) {
        return Ok(None);
    }
    let read = |path: &Path| {
        let bytes = trust::read_file(path, trust::KERNEL_FILE_CAP)?
            .ok_or_else(|| format!("{}: no such file", path.display()))?;
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
