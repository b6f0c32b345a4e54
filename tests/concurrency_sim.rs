//! Concurrency and cache faults on the hsa-sim software NPU, through ggml's API the
//! way an application uses the plugin:
//!
//! * N threads, each with its own backend on device 0, compute graphs at the same time; every
//!   result is bit-identical to the one the same graph gave run serially;
//! * two processes that need the same missing kernels at the same time, sharing one cache: each
//!   kernel is compiled once (the other process waits on its lock and uses the result), both
//!   compute right, and the cache holds whole files and a manifest listing each kernel once;
//! * a process SIGKILLed while its compiler runs (it held the kernel's lock, the compiler left a
//!   partial file): the next process compiles the kernel and computes right;
//! * a compiler SIGKILLed mid-compile, a read-only cache (empty, or holding good kernels, or a
//!   damaged one), a full cache filesystem, a cache deleted between graphs, cached kernels
//!   truncated or damaged after they were written: a clear message, the graph fails cleanly or
//!   runs, nothing good in the cache is lost and nothing bad is kept.
//!
//! Read-only and full filesystems are mounts (permission bits do not stop root): as another
//! user, or without CAP_SYS_ADMIN, those cases are skipped with a message, and fail under
//! `GGML_HSA_REQUIRE_E2E=1` (scripts/test.sh) so that CI cannot skip them silently.
//!
//! The plugin and the simulator read their environment once per process, so each scenario runs
//! in a child process (this test binary, running the ignored `child` test).

mod common;

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ggml_hsa::ffi::sys;

const N: usize = 4096;
const THREADS: usize = 4;
const ROUNDS: u32 = 8;
/// The distinct kernels of [`build_graph`] (ADD, MUL and SCALE of 4096 f32).
const KERNELS: usize = 3;
const SCALE: f32 = 0.25;

/// A JIT compiler wrapper around hsa-sim-compile that logs each compile (`<pid> <request>`) to
/// `$GGML_HSA_TEST_COMPILE_LOG` and waits a little before compiling, so that concurrent
/// processes really overlap; `GGML_HSA_TEST_COMPILER_MODE=kill` makes it write half a kernel
/// file and SIGKILL itself, `sleep` makes it hang (until killed).
fn compiler_wrapper(dir: &Path) -> PathBuf {
    let path = dir.join("compiler.sh");
    let script = format!(
        r#"#!/bin/sh
if [ "$1" = compile ]; then
  echo "$$ $3" >> "$GGML_HSA_TEST_COMPILE_LOG"
  case "$GGML_HSA_TEST_COMPILER_MODE" in
    kill) name=$(basename "$3" | sed 's/^\.//; s/\.request\..*//')
          printf 'HSASIMK1half' > "$5/$name.pdi"
          printf 'HSASIMK1half' > "$5/.$name.pdi.tmp$$"
          kill -9 $$ ;;
    sleep) name=$(basename "$3" | sed 's/^\.//; s/\.request\..*//')
           printf 'HSASIMK1half' > "$5/.$name.pdi.tmp$$"
           exec sleep 600 ;;
  esac
  sleep 0.5
fi
exec "{}" "$@"
"#,
        common::sim_artifact("hsa-sim-compile").display()
    );
    common::write_script(&path, &script);
    path
}

/// The child process running `mode` with the cache in `cache` and the wrapper as its compiler.
fn child_process(mode: &str, dir: &Path, cache: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", "child", "--nocapture"])
        .env("GGML_HSA_TEST_MODE", mode)
        .env("GGML_HSA_TEST_PLUGIN", common::plugin_path())
        .env(
            "GGML_HSA_LIBHSA_PATH",
            common::sim_artifact("libhsa_runtime64.so"),
        )
        .env("GGML_HSA_JIT_COMPILER", compiler_wrapper(dir))
        .env("GGML_HSA_KERNEL_CACHE_DIR", cache)
        .env("GGML_HSA_TEST_COMPILE_LOG", dir.join("compiles.log"))
        .env("GGML_HSA_ENABLE_LOG", "1")
        .env("HSA_SIM_QUIET", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn finish(c: Child) -> String {
    let out = c.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child process failed:\n{text}");
    assert!(text.contains("1 passed"), "the child did not run:\n{text}");
    text
}

fn run_child(mode: &str, dir: &Path, cache: &Path, env: &[(&str, &str)]) -> String {
    let text = finish(child_process(mode, dir, cache, env).spawn().unwrap());
    // The messages a user would see for the fault (shown with --nocapture).
    for line in text
        .lines()
        .filter(|l| l.contains("failed") || l.contains("cannot") || l.contains("another process"))
    {
        eprintln!("[{mode}] {}", line.chars().take(400).collect::<String>());
    }
    text
}

/// Compiles per kernel name (from the wrapper's log).
fn compiles(dir: &Path) -> BTreeMap<String, usize> {
    let log = std::fs::read_to_string(dir.join("compiles.log")).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let request = line.split_whitespace().nth(1).unwrap_or("");
        let name = Path::new(request)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches('.')
            .split(".request.")
            .next()
            .unwrap()
            .to_owned();
        *out.entry(name).or_insert(0) += 1;
    }
    out
}

/// The cache holds whole kernels only: every `.pdi` is a complete simulator image with its
/// matching instruction stream, and the manifest lists each kernel once.
fn assert_cache_whole(arch_dir: &Path, kernels: usize) {
    let mut pdis = 0;
    for e in std::fs::read_dir(arch_dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".pdi") {
            // A simulator image: "HSASIMK1", version 1, payload length, payload (JSON); its
            // instruction stream is 8 words.
            let image = std::fs::read(&path).unwrap();
            let insts = std::fs::read(arch_dir.join(format!("{stem}_insts.bin"))).unwrap();
            assert!(
                image.starts_with(b"HSASIMK1") && image.len() > 16,
                "{}",
                path.display()
            );
            let payload = u32::from_le_bytes(image[12..16].try_into().unwrap()) as usize;
            assert_eq!(image.len(), 16 + payload, "{} is torn", path.display());
            serde_json::from_slice::<serde_json::Value>(&image[16..])
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(insts.len(), 32, "{stem}_insts.bin");
            pdis += 1;
        }
    }
    let manifest = std::fs::read_to_string(arch_dir.join(".ggml-hsa-kernels")).unwrap();
    let mut names: Vec<&str> = manifest.lines().collect();
    let listed = names.len();
    names.sort();
    names.dedup();
    assert_eq!(
        names.len(),
        listed,
        "manifest lists a kernel twice:\n{manifest}"
    );
    assert_eq!(pdis, kernels, "{}", arch_dir.display());
    assert_eq!(listed, kernels, "{manifest}");
}

#[test]
fn threads_with_their_own_backends_match_serial_runs() {
    let dir = common::scratch_dir("conc-threads");
    let text = run_child("threads", &dir, &dir.join("cache"), &[]);
    let line = format!("CONCURRENT {THREADS} threads x {ROUNDS} rounds identical to serial");
    assert!(text.contains(&line), "{text}");
    // Compiled once each (by the serial runs): the concurrent backends found them all.
    assert!(
        compiles(&dir).values().all(|&n| n == 1),
        "{:?}",
        compiles(&dir)
    );
    assert_eq!(compiles(&dir).len(), KERNELS);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn two_processes_compile_each_missing_kernel_once() {
    let dir = common::scratch_dir("conc-procs");
    let cache = dir.join("cache");
    let a = child_process("serial", &dir, &cache, &[]).spawn().unwrap();
    let b = child_process("serial", &dir, &cache, &[]).spawn().unwrap();
    let (ta, tb) = (finish(a), finish(b));
    for t in [&ta, &tb] {
        assert!(t.contains("SERIAL ok"), "{t}");
    }
    let counts = compiles(&dir);
    assert_eq!(counts.len(), KERNELS, "{counts:?}");
    assert!(counts.values().all(|&n| n == 1), "{counts:?}\n{ta}\n{tb}");
    assert!(
        ta.contains("compiled by another process") || tb.contains("compiled by another process"),
        "the processes did not overlap:\n{ta}\n{tb}"
    );
    assert_cache_whole(&cache.join("aie2p"), KERNELS);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_process_killed_while_compiling_leaves_nothing_that_stops_the_next() {
    let dir = common::scratch_dir("conc-killed");
    let cache = dir.join("cache");
    let mut hung = child_process(
        "serial",
        &dir,
        &cache,
        &[("GGML_HSA_TEST_COMPILER_MODE", "sleep")],
    )
    .spawn()
    .unwrap();
    // Wait until its compiler runs (it holds the kernel's lock then), and kill the process.
    let started = Instant::now();
    while compiles(&dir).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no compile started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    hung.kill().unwrap();
    hung.wait().unwrap();
    // Its compiler (a grandchild) sleeps on, its partial file and request file stay; the lock
    // died with the process holding it.
    let log = std::fs::read_to_string(dir.join("compiles.log")).unwrap();
    std::fs::remove_file(dir.join("compiles.log")).unwrap();
    let arch_dir = cache.join("aie2p");
    assert!(
        leftovers(&arch_dir).iter().any(|f| f.contains(".pdi.tmp")),
        "{:?}",
        leftovers(&arch_dir)
    );
    let text = run_child("serial", &dir, &cache, &[]);
    for pid in log.lines().filter_map(|l| l.split_whitespace().next()) {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    assert!(text.contains("SERIAL ok"), "{text}");
    assert!(text.contains("left by an unfinished compile"), "{text}");
    assert_cache_whole(&arch_dir, KERNELS);
    let kernel_files: Vec<String> = leftovers(&arch_dir)
        .into_iter()
        .filter(|f| f != ".ggml-hsa-kernels")
        .filter(|f| !(f.ends_with(".pdi") || f.ends_with("_insts.bin")))
        .collect();
    assert!(
        kernel_files.is_empty(),
        "stale files kept: {kernel_files:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_compiler_killed_mid_compile_fails_cleanly_and_keeps_nothing() {
    let dir = common::scratch_dir("conc-compiler-killed");
    let cache = dir.join("cache");
    let text = run_child(
        "fail",
        &dir,
        &cache,
        &[("GGML_HSA_TEST_COMPILER_MODE", "kill")],
    );
    assert!(text.contains("GRAPH failed cleanly"), "{text}");
    assert!(text.contains("SIGKILL"), "{text}");
    // Its half-written files are removed at once.
    assert_eq!(
        leftovers(&cache.join("aie2p")),
        Vec::<String>::new(),
        "{text}"
    );
    std::fs::remove_file(dir.join("compiles.log")).unwrap();
    let text = run_child("serial", &dir, &cache, &[]);
    assert!(text.contains("SERIAL ok"), "{text}");
    assert_cache_whole(&cache.join("aie2p"), KERNELS);
    let _ = std::fs::remove_dir_all(dir);
}

/// A cache "directory" under a regular file cannot be created by anyone (root included): the
/// graph fails and the message names the path.
#[test]
fn a_cache_path_under_a_regular_file_fails_the_graph_with_its_path() {
    let dir = common::scratch_dir("conc-under-file");
    let blocked = dir.join("file").join("cache");
    std::fs::write(dir.join("file"), b"not a directory").unwrap();
    let text = run_child("fail", &dir, &blocked, &[]);
    assert!(text.contains("GRAPH failed cleanly"), "{text}");
    assert!(
        text.contains("cannot create the cache directory") && text.contains("file/cache"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A case that cannot run here (it needs root for a mount): a failure under
/// `GGML_HSA_REQUIRE_E2E=1` (scripts/test.sh, CI), so that CI cannot skip it silently;
/// otherwise a skip with the reason.
fn cannot_run(why: &str) {
    assert!(
        std::env::var("GGML_HSA_REQUIRE_E2E").as_deref() != Ok("1"),
        "{why} (GGML_HSA_REQUIRE_E2E=1: this case must run)"
    );
    eprintln!("SKIPPED: {why}");
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `dir`, private (mode 0700: a tmpfs is 1777 by default, a
    /// cache the backend refuses); `None` (see [`cannot_run`]) where mounting is not
    /// permitted (not root, no CAP_SYS_ADMIN in a container).
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir.to_owned())),
            other => {
                cannot_run(&format!(
                    "cannot mount a tmpfs at {} ({other:?}); this case needs root",
                    dir.display()
                ));
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A directory made read-only for one test, writable again when dropped. Permission bits do not
/// stop root, so as root it is a read-only bind mount of itself (the kernel refuses every write:
/// EROFS); as another user its directories lose their write bits (EACCES).
enum ReadOnly {
    Mount(PathBuf),
    Modes(Vec<PathBuf>),
}

impl ReadOnly {
    fn new(dir: &Path) -> Option<ReadOnly> {
        if !is_root() {
            let mut dirs = vec![dir.to_owned()];
            let mut i = 0;
            while i < dirs.len() {
                for e in std::fs::read_dir(&dirs[i]).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        dirs.push(p);
                    }
                }
                i += 1;
            }
            for d in &dirs {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o555)).unwrap();
            }
            return Some(ReadOnly::Modes(dirs));
        }
        let mounted = |args: &[&str]| {
            Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .output()
                .map_err(|e| e.to_string())
                .and_then(|o| {
                    if o.status.success() {
                        Ok(())
                    } else {
                        Err(String::from_utf8_lossy(&o.stderr).into_owned())
                    }
                })
        };
        let bound = mounted(&["--bind"]);
        // Read-only bind: a remount of the bind (one step with `-o bind,ro` is not enough on
        // older util-linux).
        let read_only = bound.clone().and_then(|()| {
            mounted(&["-o", "remount,ro,bind"]).inspect_err(|_| {
                let _ = Command::new("umount").arg(dir).status();
            })
        });
        match read_only {
            Ok(()) => Some(ReadOnly::Mount(dir.to_owned())),
            Err(e) => {
                cannot_run(&format!(
                    "cannot bind-mount {} read-only ({}); this case needs CAP_SYS_ADMIN",
                    dir.display(),
                    e.trim()
                ));
                None
            }
        }
    }

    /// What the kernel says to a write into it.
    fn error_text(&self) -> &'static str {
        match self {
            ReadOnly::Mount(_) => "Read-only file system",
            ReadOnly::Modes(_) => "Permission denied",
        }
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        match self {
            ReadOnly::Mount(dir) => {
                let _ = Command::new("umount").arg(dir).status();
            }
            ReadOnly::Modes(dirs) => {
                for d in dirs {
                    let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755));
                }
            }
        }
    }
}

/// Every file of `dir` with its contents (lock files included: nothing may change).
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

#[test]
fn a_read_only_empty_cache_fails_the_graph_with_its_reason() {
    let dir = common::scratch_dir("conc-readonly");
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let Some(read_only) = ReadOnly::new(&cache) else {
        return;
    };
    let text = run_child("fail", &dir, &cache, &[]);
    assert!(text.contains("GRAPH failed cleanly"), "{text}");
    assert!(
        text.contains("cannot create the cache directory")
            && text.contains(&format!("{}", cache.join("aie2p").display()))
            && text.contains(read_only.error_text()),
        "{text}"
    );
    drop(read_only);
    let _ = std::fs::remove_dir_all(dir);
}

/// A cache made read-only after it was filled (a shared, provisioned cache): its kernels are
/// used, nothing is compiled, nothing in it changes. Then one of them is truncated: it is
/// reported and cannot be removed or rebuilt there, so the graph fails cleanly, and the good
/// kernels beside it stay as they were.
#[test]
fn a_read_only_cache_with_good_kernels_uses_them_and_loses_nothing() {
    let dir = common::scratch_dir("conc-readonly-good");
    let cache = dir.join("cache");
    let arch_dir = cache.join("aie2p");
    let text = run_child("serial", &dir, &cache, &[]);
    assert!(text.contains("SERIAL ok"), "{text}");
    assert_eq!(compiles(&dir).len(), KERNELS);
    std::fs::remove_file(dir.join("compiles.log")).unwrap();
    let before = snapshot(&arch_dir);
    {
        let Some(_read_only) = ReadOnly::new(&cache) else {
            return;
        };
        let text = run_child("serial", &dir, &cache, &[]);
        assert!(text.contains("SERIAL ok"), "{text}");
        assert!(compiles(&dir).is_empty(), "{:?}", compiles(&dir));
        assert_eq!(snapshot(&arch_dir), before, "the read-only cache changed");
    }
    let pdi = before
        .keys()
        .find(|f| f.ends_with(".pdi"))
        .expect("a kernel")
        .clone();
    let bytes = &before[&pdi];
    std::fs::write(arch_dir.join(&pdi), &bytes[..bytes.len() / 2]).unwrap();
    let damaged = snapshot(&arch_dir);
    let Some(read_only) = ReadOnly::new(&cache) else {
        return;
    };
    let text = run_child("fail", &dir, &cache, &[]);
    assert!(text.contains("GRAPH failed cleanly"), "{text}");
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("corrupt cached kernel"))
        .collect();
    assert_eq!(kept.len(), 1, "{text}");
    assert!(kept[0].contains(read_only.error_text()), "{}", kept[0]);
    assert!(kept[0].contains("the manifest recorded"), "{}", kept[0]);
    assert_eq!(snapshot(&arch_dir), damaged, "the read-only cache changed");
    drop(read_only);
    let _ = std::fs::remove_dir_all(dir);
}

/// A cached kernel truncated (or damaged) after it was written: the next process finds that it
/// no longer matches the size and checksum the manifest recorded, removes it under its lock
/// with one log line, compiles it again and computes right; the other kernels are reused.
#[test]
fn a_truncated_cached_kernel_is_removed_and_compiled_again() {
    let dir = common::scratch_dir("conc-truncated");
    let cache = dir.join("cache");
    let arch_dir = cache.join("aie2p");
    let text = run_child("serial", &dir, &cache, &[]);
    assert!(text.contains("SERIAL ok"), "{text}");
    std::fs::remove_file(dir.join("compiles.log")).unwrap();
    let before = snapshot(&arch_dir);
    let mut pdis = before.keys().filter(|f| f.ends_with(".pdi"));
    let (truncated, damaged) = (pdis.next().unwrap().clone(), pdis.next().unwrap().clone());
    let bytes = &before[&truncated];
    std::fs::write(arch_dir.join(&truncated), &bytes[..bytes.len() - 3]).unwrap();
    // Same size, one byte changed inside the simulator image's JSON (still a valid image to
    // the format checks: only the checksum tells).
    let mut bytes = before[&damaged].clone();
    let at = bytes.len() - 2;
    bytes[at] ^= 0x01;
    std::fs::write(arch_dir.join(&damaged), &bytes).unwrap();
    let text = run_child("serial", &dir, &cache, &[]);
    assert!(text.contains("SERIAL ok"), "{text}");
    let removed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("removed the corrupt cached kernel"))
        .collect();
    assert_eq!(removed.len(), 2, "{text}");
    assert!(removed
        .iter()
        .any(|l| l.contains("bytes, the manifest recorded")));
    assert!(removed.iter().any(|l| l.contains("checksum")));
    let counts = compiles(&dir);
    let stem = |f: &str| f.trim_end_matches(".pdi").to_owned();
    assert_eq!(
        counts,
        BTreeMap::from([(stem(&truncated), 1), (stem(&damaged), 1)]),
        "only the two bad kernels are compiled again"
    );
    // Whole again, byte for byte (the compiler is deterministic); the manifest's last line of
    // each kernel describes its new files.
    let after = snapshot(&arch_dir);
    for f in before
        .keys()
        .filter(|f| !f.starts_with(".ggml-hsa-kernels"))
    {
        assert_eq!(after[f], before[f], "{f}");
    }
    let manifest = String::from_utf8_lossy(&after[".ggml-hsa-kernels"]).into_owned();
    assert_eq!(manifest.lines().count(), KERNELS + 2, "{manifest}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The files of `dir` other than kernel lock files (which stay, empty, by design).
fn leftovers(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn a_full_cache_filesystem_fails_the_graph_and_keeps_no_torn_kernel() {
    // No room at all (the request file does not fit), then one page (the request fits, the
    // compiler's kernel files do not).
    for free in [0u64, 4096] {
        let dir = common::scratch_dir(&format!("conc-full-{free}"));
        let cache = dir.join("cache");
        let Some(mount) = Tmpfs::mount(&cache, "256k") else {
            return;
        };
        // Fill it (directories take no blocks on a tmpfs, so the cache's can still be made).
        let filler = cache.join("filler");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&filler).unwrap();
            while f.write_all(&[0u8; 4096]).is_ok() {}
            let len = f.metadata().unwrap().len();
            f.set_len(len / 4096 * 4096 - free).unwrap();
        }
        let text = run_child("fail", &dir, &cache, &[]);
        assert!(text.contains("GRAPH failed cleanly"), "{text}");
        assert!(text.contains("No space left on device"), "{text}");
        // Nothing half-written stays behind.
        assert_eq!(
            leftovers(&cache.join("aie2p")),
            Vec::<String>::new(),
            "{text}"
        );
        // With space again the next run compiles them all; its cache holds whole kernels only.
        std::fs::remove_file(&filler).unwrap();
        let _ = std::fs::remove_file(dir.join("compiles.log"));
        let text = run_child("serial", &dir, &cache, &[]);
        assert!(text.contains("SERIAL ok"), "{text}");
        assert_eq!(compiles(&dir).len(), KERNELS, "{:?}", compiles(&dir));
        assert_cache_whole(&cache.join("aie2p"), KERNELS);
        drop(mount);
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn a_cache_deleted_between_graphs_is_rebuilt() {
    let dir = common::scratch_dir("conc-deleted");
    let text = run_child("delete-cache", &dir, &dir.join("cache"), &[]);
    assert!(text.contains("DELETED ok"), "{text}");
    // Each graph has a backend of its own, and freeing a device's last backend unloads its
    // kernels: the graphs after the deletion compile theirs again (the first graph's three and
    // the new SCALE), each into a whole cache directory, and nothing fails.
    assert_cache_whole(&dir.join("cache").join("aie2p"), KERNELS + 1);
    let _ = std::fs::remove_dir_all(dir);
}

static LOG: Mutex<String> = Mutex::new(String::new());

unsafe extern "C" fn capture_log(_level: u32, text: *const c_char, _user: *mut c_void) {
    if !text.is_null() {
        // SAFETY: ggml passes a NUL-terminated string valid for the call.
        let s = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        LOG.lock().unwrap().push_str(&s);
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The inputs of run `seed`: distinct per thread so a mixed-up buffer shows.
fn inputs(seed: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..N)
        .map(|i| ((i * 7 + seed * 131) % 1000) as f32 * 0.01 - 3.0)
        .collect();
    let b = (0..N)
        .map(|i| ((i * 13 + seed * 17) % 97) as f32 * 0.125 + 0.5)
        .collect();
    (a, b)
}

/// One backend computing the graph `rounds` times on `seed`'s inputs: the output of each
/// round, or the failed status.
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn run_graph(
    reg: sys::ggml_backend_reg_t,
    seed: usize,
    rounds: u32,
    scale: f32,
) -> Result<Vec<Vec<u8>>, i32> {
    // SAFETY: ggml's C API with valid arguments: pointers come from the calls before them and
    // are checked for NULL where ggml may return NULL.
    unsafe {
        let dev = sys::ggml_backend_reg_dev_get(reg, 0);
        assert!(!dev.is_null(), "no device");
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        assert!(!backend.is_null(), "no backend");
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: 1 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        let a = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
        let b = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
        let mut x = a;
        // One scale factor: it is a kernel parameter, so each factor would be another kernel.
        for _ in 0..6 {
            x = sys::ggml_add(ctx, x, b);
            x = sys::ggml_mul(ctx, x, b);
            x = sys::ggml_scale(ctx, x, scale);
        }
        let gf = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(gf, x);
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null(), "buffer allocation failed");
        let (ia, ib) = inputs(seed);
        sys::ggml_backend_tensor_set(a, f32_bytes(&ia).as_ptr().cast(), 0, 4 * N);
        sys::ggml_backend_tensor_set(b, f32_bytes(&ib).as_ptr().cast(), 0, 4 * N);
        let mut outs = Vec::new();
        let mut failed = None;
        for _ in 0..rounds {
            let status = sys::ggml_backend_graph_compute(backend, gf);
            if status != sys::GGML_STATUS_SUCCESS {
                failed = Some(status);
                break;
            }
            let mut out = vec![0u8; 4 * N];
            sys::ggml_backend_tensor_get(x, out.as_mut_ptr().cast(), 0, 4 * N);
            outs.push(out);
        }
        sys::ggml_backend_buffer_free(buffer);
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
        match failed {
            Some(s) => Err(s),
            None => Ok(outs),
        }
    }
}

/// The graph's result on the CPU, in f32 as the kernels compute it.
fn expected(seed: usize, scale: f32) -> Vec<u8> {
    let (a, b) = inputs(seed);
    let out: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| {
            let mut x = x;
            for _ in 0..6 {
                x = ((x + y) * y) * scale;
            }
            x
        })
        .collect();
    f32_bytes(&out)
}

fn close(got: &[u8], want: &[u8]) -> bool {
    got.chunks_exact(4).zip(want.chunks_exact(4)).all(|(g, w)| {
        let g = f32::from_le_bytes(g.try_into().unwrap());
        let w = f32::from_le_bytes(w.try_into().unwrap());
        (g - w).abs() <= 1e-4 * w.abs().max(1.0)
    })
}

#[test]
#[ignore = "run by the tests above in a child process"]
fn child() {
    let mode = std::env::var("GGML_HSA_TEST_MODE").unwrap();
    let plugin = std::env::var("GGML_HSA_TEST_PLUGIN").unwrap();
    // SAFETY: capture_log matches ggml_log_callback and lives for the whole process.
    unsafe { sys::ggml_log_set(Some(capture_log), std::ptr::null_mut()) };
    // SAFETY: the plugin is this crate's cdylib; it is never unloaded (leaked below).
    let lib = Box::leak(Box::new(
        unsafe { libloading::Library::new(Path::new(&plugin)) }.unwrap(),
    ));
    // SAFETY: the plugin's entry point, called once.
    let reg = unsafe {
        let init = *lib
            .get::<unsafe extern "C" fn() -> sys::ggml_backend_reg_t>(b"ggml_backend_init")
            .unwrap();
        init()
    };
    assert!(!reg.is_null());
    // The registry handle is a pointer ggml's API takes from any thread.
    let reg_addr = reg as usize;
    match mode.as_str() {
        "serial" => {
            // SAFETY: reg is the plugin's registry.
            let outs = unsafe { run_graph(reg, 0, 2, SCALE) }.expect("the graph computes");
            assert!(outs.iter().all(|o| close(o, &expected(0, SCALE))));
            println!("SERIAL ok");
        }
        "fail" => {
            // SAFETY: as above.
            let status = unsafe { run_graph(reg, 0, 1, SCALE) };
            assert!(status.is_err(), "the graph computed without its kernels");
            println!("GRAPH failed cleanly: status {}", status.unwrap_err());
        }
        "delete-cache" => {
            let cache = PathBuf::from(std::env::var("GGML_HSA_KERNEL_CACHE_DIR").unwrap());
            // SAFETY: as above.
            let first = unsafe { run_graph(reg, 0, 1, SCALE) }.expect("the graph computes");
            std::fs::remove_dir_all(&cache).unwrap();
            // The same graph runs on (its kernels are loaded); one that needs a new kernel (another
            // scale factor) compiles it into a new cache directory.
            // SAFETY: as above.
            let again = unsafe { run_graph(reg, 1, 1, SCALE) }.expect("the graph computes again");
            // SAFETY: as above.
            let other = unsafe { run_graph(reg, 2, 1, 0.5) }.expect("a new kernel is compiled");
            assert!(close(&first[0], &expected(0, SCALE)));
            assert!(close(&again[0], &expected(1, SCALE)));
            assert!(close(&other[0], &expected(2, 0.5)));
            println!("DELETED ok");
        }
        "threads" => {
            // SAFETY: as above.
            let serial: Vec<Vec<u8>> = (0..THREADS)
                .map(|t| unsafe { run_graph(reg, t, 1, SCALE) }.expect("serial run")[0].clone())
                .collect();
            for (t, s) in serial.iter().enumerate() {
                assert!(close(s, &expected(t, SCALE)), "serial run {t} is wrong");
            }
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    std::thread::spawn(move || {
                        let reg = reg_addr as sys::ggml_backend_reg_t;
                        // SAFETY: as above.
                        unsafe { run_graph(reg, t, ROUNDS, SCALE) }
                    })
                })
                .collect();
            for (t, h) in handles.into_iter().enumerate() {
                let outs = h.join().unwrap().expect("a concurrent graph failed");
                assert_eq!(outs.len(), ROUNDS as usize);
                for (r, o) in outs.iter().enumerate() {
                    assert!(
                        o == &serial[t],
                        "thread {t} round {r} differs from its serial run"
                    );
                }
            }
            println!("CONCURRENT {THREADS} threads x {ROUNDS} rounds identical to serial");
        }
        other => panic!("unknown mode {other}"),
    }
    eprintln!("--- captured ggml log ---\n{}", LOG.lock().unwrap());
}
