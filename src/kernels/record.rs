//! Record mode (`GGML_HSA_KERNEL_RECORD=<file.json>`): every kernel a run needs is written into a
//! `ggml-hsa-gen-kernels` config, so that a deployment can be pregenerated from one real run
//! (`ggml-hsa-gen-kernels --config <file.json> --output-dir <dir>`, then `GGML_HSA_KERNEL_DIR`).
//!
//! Kernels already in the file (from earlier runs) are kept, so several runs accumulate. The file
//! is rewritten aside and renamed after each new kernel, so it is always a complete config.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::desc::KernelDesc;
use super::gen_config::{KernelConfig, KernelEntry};
use super::Arch;
use crate::log;

#[derive(Debug)]
struct State {
    path: PathBuf,
    config: KernelConfig,
    seen: HashSet<(String, String)>,
}

/// The most kernels a record file lists: far more than any model's graph needs (a few hundred),
/// few enough that a client spraying shapes at a recording server cannot grow the file (which is
/// rewritten per new kernel) without bound.
pub const MAX_RECORDED: usize = 10_000;

/// The process's recording, if any (one file for every device).
static RECORD: Mutex<Option<State>> = Mutex::new(None);

/// Adds the kernel `desc` for `arch` to the record file at `path` (once per kernel).
pub fn record(path: &Path, arch: Arch, desc: &KernelDesc) {
    let key = (arch.name().to_owned(), desc.canonical_name());
    let mut guard = RECORD.lock();
    let state = guard.get_or_insert_with(|| open(path));
    if state.seen.contains(&key) {
        return;
    }
    if state.config.kernels.len() >= MAX_RECORDED {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            log::warn(&format!(
                "GGML_HSA_KERNEL_RECORD: {} lists {MAX_RECORDED} kernels, the most it may; \
                 further kernels are not recorded",
                state.path.display()
            ))
        });
        return;
    }
    state.seen.insert(key);
    state
        .config
        .kernels
        .push(KernelEntry::from_desc(desc, arch));
    write(state);
}

/// Removes the kernel `desc` for `arch` from the record file at `path`, if it is listed: the
/// compiler declined it (a shape its design refuses), so pregenerating it could only fail, and a
/// server without it declines it as this run did.
pub fn forget(path: &Path, arch: Arch, desc: &KernelDesc) {
    let key = (arch.name().to_owned(), desc.canonical_name());
    let mut guard = RECORD.lock();
    let state = guard.get_or_insert_with(|| open(path));
    if !state.seen.remove(&key) {
        return;
    }
    state.config.kernels.retain(|entry| {
        !matches!(entry.to_desc(), Ok((a, d)) if a.name() == key.0 && d.canonical_name() == key.1)
    });
    write(state);
}

/// Rewrites the record file aside and renames it over the old one, so that it is always a
/// complete config.
fn write(state: &State) {
    let tmp = state
        .path
        .with_extension(format!("tmp.{}", std::process::id()));
    let written = std::fs::write(&tmp, state.config.to_json())
        .and_then(|()| std::fs::rename(&tmp, &state.path));
    if let Err(e) = written {
        log::warn(&format!(
            "GGML_HSA_KERNEL_RECORD: cannot write {}: {e}",
            state.path.display()
        ));
    }
}

/// The recording state for `path`, starting from the kernels already listed there.
fn open(path: &Path) -> State {
    let mut state = State {
        path: path.to_owned(),
        config: KernelConfig {
            kernels: Vec::new(),
        },
        seen: HashSet::new(),
    };
    let Ok(text) = std::fs::read_to_string(path) else {
        return state;
    };
    match KernelConfig::parse(&text) {
        Ok(config) => {
            for entry in &config.kernels {
                if let Ok((arch, desc)) = entry.to_desc() {
                    state
                        .seen
                        .insert((arch.name().to_owned(), desc.canonical_name()));
                }
            }
            state.config = config;
        }
        Err(e) => log::warn(&format!(
            "GGML_HSA_KERNEL_RECORD: {} is not a kernel config ({e}); it will be replaced",
            path.display()
        )),
    }
    state
}
