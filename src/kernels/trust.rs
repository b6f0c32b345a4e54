//! Which directories kernels may come from, and how their files are opened.
//!
//! A kernel runs on the NPU (and, on hsa-sim, as native code), so a file that someone else could
//! have written is a way to run code as the user. The rules follow OpenSSH's `StrictModes` and
//! XDG's runtime directory:
//! * A directory is trusted when it, and every directory above it, is owned by the user or by
//!   root and is not writable by group or others (a directory above it with the sticky bit, such
//!   as `/tmp`, is allowed: others cannot rename what is in it). Symbolic links in the path the
//!   user gave are resolved first; below that path none are followed.
//! * The cache directory and its architecture folders are created `0700` whatever the umask.
//! * A file is opened without following a symbolic link and without blocking (a FIFO answers at
//!   once), must be a regular file owned by the user or root and not writable by group or
//!   others, and is read up to a size cap.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The most bytes read of one kernel file (`.pdi`, `_insts.bin`, `.hsaco`). The largest the
/// package writes are emulated images of about 2 MiB; a PDI for the whole array is far smaller.
pub const KERNEL_FILE_CAP: u64 = 64 << 20;

/// The most bytes read of a manifest (one short line per kernel; compacted as it grows).
pub const MANIFEST_CAP: u64 = 16 << 20;

/// A directory that cannot be used, and what the user can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct Untrusted {
    pub path: PathBuf,
    pub why: String,
    /// Refused by the rules (owner, mode, a link, not a directory), as opposed to unavailable
    /// (it cannot be created or read: a read-only or full file system, a missing parent).
    pub refused: bool,
}

impl Untrusted {
    fn new(path: &Path, why: impl Into<String>) -> Untrusted {
        Untrusted {
            path: path.to_owned(),
            why: why.into(),
            refused: true,
        }
    }

    fn unavailable(path: &Path, why: impl ToString) -> Untrusted {
        Untrusted {
            path: path.to_owned(),
            why: why.to_string(),
            refused: false,
        }
    }
}

/// The effective user of this process.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Why `meta` (of `path`) may not be trusted: a wrong owner, or write access for group or
/// others (allowed with the sticky bit when `sticky_ok`).
fn ownership_problem(path: &Path, meta: &std::fs::Metadata, sticky_ok: bool) -> Option<Untrusted> {
    let me = euid();
    if meta.uid() != me && meta.uid() != 0 {
        return Some(Untrusted::new(
            path,
            format!(
                "owned by user {}, not by this user ({me}) or root; fix: use a directory of \
                 yours (GGML_HSA_KERNEL_CACHE_DIR, GGML_HSA_KERNEL_DIR)",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode();
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !(sticky_ok && sticky) {
        return Some(Untrusted::new(
            path,
            format!(
                "writable by {} (mode {:o}); fix: chmod go-w {}",
                if mode & 0o002 != 0 {
                    "anyone"
                } else {
                    "its group"
                },
                mode & 0o7777,
                path.display()
            ),
        ));
    }
    None
}

/// Checks that `dir` may hold kernels: resolved to its real path, a directory, and it and every
/// directory above it owned by the user or root and not writable by others. Returns the real
/// path, which the caller uses from then on.
pub fn check_dir(dir: &Path) -> Result<PathBuf, Untrusted> {
    let real = std::fs::canonicalize(dir).map_err(|e| Untrusted::unavailable(dir, e))?;
    let meta =
        std::fs::symlink_metadata(&real).map_err(|e| Untrusted::new(&real, e.to_string()))?;
    if !meta.is_dir() {
        return Err(Untrusted::new(&real, "not a directory"));
    }
    if let Some(problem) = ownership_problem(&real, &meta, false) {
        return Err(problem);
    }
    for above in real.ancestors().skip(1) {
        let meta =
            std::fs::symlink_metadata(above).map_err(|e| Untrusted::new(above, e.to_string()))?;
        if let Some(problem) = ownership_problem(above, &meta, true) {
            return Err(Untrusted::new(
                &real,
                format!("a directory above it is not safe: {problem}"),
            ));
        }
    }
    Ok(real)
}

/// Creates `dir` (and what is missing above it) with mode 0700 whatever the umask, and checks
/// it as [`check_dir`] does. An existing directory is checked, not changed.
pub fn private_dir(dir: &Path) -> Result<PathBuf, Untrusted> {
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Untrusted::unavailable(dir, e))?;
        // The umask may have taken the owner's bits too.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Untrusted::unavailable(dir, format!("cannot make it private: {e}")))?;
    }
    check_dir(dir)
}

/// `name` inside the trusted directory `parent`: created 0700 if missing, else required to be
/// a directory itself (not a symbolic link) with the ownership rules.
pub fn sub_dir(parent: &Path, name: &str, create: bool) -> Result<PathBuf, Untrusted> {
    let dir = parent.join(name);
    if create {
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(
                    |e| Untrusted::unavailable(&dir, format!("cannot make it private: {e}")),
                )?;
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Untrusted::unavailable(&dir, e)),
        }
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| Untrusted::unavailable(&dir, e))?;
    if meta.file_type().is_symlink() {
        return Err(Untrusted::new(&dir, "a symbolic link (not followed)"));
    }
    if !meta.is_dir() {
        return Err(Untrusted::new(&dir, "not a directory"));
    }
    match ownership_problem(&dir, &meta, false) {
        Some(problem) => Err(problem),
        None => Ok(dir),
    }
}

/// Opens `path` without following a symbolic link or blocking on a FIFO; it must be a regular
/// file.
fn open_regular(
    options: &mut OpenOptions,
    path: &Path,
) -> std::io::Result<(File, std::fs::Metadata)> {
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::other("a symbolic link (not followed)")
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok((file, meta))
}

/// [`open_regular`], then the ownership rules.
fn open_checked(options: &mut OpenOptions, path: &Path) -> Result<File, std::io::Error> {
    let (file, meta) = open_regular(options, path)?;
    if let Some(problem) = ownership_problem(path, &meta, false) {
        return Err(std::io::Error::other(problem.why));
    }
    Ok(file)
}

/// The bytes of `path` (`Ok(None)` when it does not exist), read as the rules say, at most
/// `cap` of them; the error names the path.
pub fn read_file(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, String> {
    let file = match open_checked(OpenOptions::new().read(true), path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    if size > cap {
        return Err(format!(
            "{}: {size} bytes, more than the {cap} a kernel file may have",
            path.display()
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > cap {
        return Err(format!(
            "{}: grew past the {cap} bytes a kernel file may have",
            path.display()
        ));
    }
    Ok(Some(bytes))
}

/// Whether `path` is a regular file, not following a symbolic link.
pub fn is_regular_file(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// Opens (creating it 0600 if missing) a file of ours in a trusted directory: a lock file or a
/// manifest. `append` opens it for appending, else for writing without truncating.
pub fn open_own(path: &Path, append: bool) -> Result<File, String> {
    let mut options = OpenOptions::new();
    options.create(true).mode(0o600);
    if append {
        options.append(true);
    } else {
        options.write(true).truncate(false);
    }
    open_checked(&mut options, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Creates a new file of ours (failing if anything exists at `path`, a link included), 0600.
pub fn create_new(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Takes write access for group and others away from a file the compiler wrote (its umask may
/// have given it), so that it passes the rules when read.
pub fn seal(path: &Path) {
    if let Ok(file) = open_checked_any_mode(path) {
        if let Ok(meta) = file.metadata() {
            let mode = meta.mode() & 0o7777 & !0o022;
            let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
        }
    }
}

/// Sets the modification time of `path`, a regular file of the user's, to now; whether it could.
pub fn set_modified_now(path: &Path) -> bool {
    open_checked_any_mode(path)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        .is_ok()
}

/// `path` opened for reading without following a link, regular and owned by the user, whatever
/// its mode (for [`seal`] and [`set_modified_now`]).
fn open_checked_any_mode(path: &Path) -> std::io::Result<File> {
    let (file, meta) = open_regular(OpenOptions::new().read(true), path)?;
    if meta.uid() == euid() {
        Ok(file)
    } else {
        Err(std::io::Error::other("not a file of this user"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ggml-hsa-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_private_dir_and_its_arch_folder_are_0700() {
        // Under other umasks: tests/compiler_sandbox.rs (the umask is the process's).
        let root = scratch("umask");
        let dir = root.join("a").join("cache");
        let real = private_dir(&dir).unwrap();
        assert_eq!(mode(&real), 0o700);
        let arch = sub_dir(&real, "aie2", true).unwrap();
        assert_eq!(mode(&arch), 0o700);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn writable_or_foreign_dirs_are_refused() {
        let root = scratch("dirs");
        std::fs::create_dir_all(root.join("d")).unwrap();
        let d = root.join("d");
        assert!(check_dir(&d).is_ok());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&d).unwrap_err();
        assert!(
            e.why.contains("writable by anyone") && e.why.contains("chmod go-w"),
            "{e}"
        );
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o775)).unwrap();
        assert!(check_dir(&d).unwrap_err().why.contains("its group"));
        // A directory above that others may write (without the sticky bit) makes it unsafe.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(d.join("inner")).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_dir(&d.join("inner"))
            .unwrap_err()
            .why
            .contains("above"));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(check_dir(&d.join("inner")).is_ok(), "sticky, as /tmp");
        // Owned by someone else (root can give it away; others cannot run this part).
        if euid() == 0 {
            std::os::unix::fs::chown(d.join("inner"), Some(65534), None).unwrap();
            let e = check_dir(&d.join("inner")).unwrap_err();
            assert!(e.why.contains("owned by user 65534"), "{e}");
        }
        // A symlink inside a trusted directory is not a sub-directory.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        symlink("/", d.join("link")).unwrap();
        assert!(sub_dir(&d, "link", false)
            .unwrap_err()
            .why
            .contains("symbolic link"));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn files_are_regular_unlinked_owned_and_capped() {
        let root = scratch("files");
        std::fs::create_dir_all(&root).unwrap();
        let f = root.join("k.pdi");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_file(&f, 10).unwrap().unwrap(), b"0123456789");
        assert!(read_file(&f, 9).unwrap_err().contains("more than"));
        assert_eq!(read_file(&root.join("none"), 10), Ok(None));
        symlink(&f, root.join("link.pdi")).unwrap();
        assert!(read_file(&root.join("link.pdi"), 10)
            .unwrap_err()
            .contains("symbolic link"));
        symlink("/dev/zero", root.join("zero.pdi")).unwrap();
        assert!(read_file(&root.join("zero.pdi"), 10).is_err());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read_file(&f, 10)
            .unwrap_err()
            .contains("writable by anyone"));
        seal(&f);
        assert_eq!(mode(&f), 0o644);
        assert!(read_file(&f, 10).is_ok());
        assert!(!is_regular_file(&root.join("link.pdi")) && is_regular_file(&f));
        assert!(create_new(&root.join("link.pdi")).is_err());
        let _ = std::fs::remove_dir_all(root);
    }
}
