//! Shared by the property tests of the parsers (`tests/fuzz_parsers.rs`, hsa-sim's
//! `tests/fuzz_readers.rs`): the seed corpus in `tests/corpus/<parser>/`, a proptest strategy that
//! mutates its files the way a fuzzer would, and a watchdog that turns a hang into a failure.
//!
//! Inputs are corpus files with a handful of byte-level mutations (flip, overwrite with an
//! interesting value, insert, delete, truncate, duplicate a range, splice in part of another seed):
//! most stay close enough to valid to reach the deep checks of a parser, which random bytes
//! rarely do. Fresh random bytes are mixed in too.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use proptest::prelude::*;

/// The files of `<corpus_root>/<parser>/`, sorted by name; panics when there are none (a corpus
/// that went missing must not turn the property tests into no-ops).
pub fn corpus(corpus_root: &Path, parser: &str) -> Vec<Vec<u8>> {
    let dir = corpus_root.join(parser);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "seed corpus {} is empty", dir.display());
    paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Bytes that make parsers take unusual paths: boundaries of integer types, JSON and descriptor
/// punctuation, digits, signs.
const INTERESTING: &[u8] = &[
    0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe, b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'(',
    b')', b'/', b'-', b'+', b'0', b'9', b'e', b'.', b'x', b' ', b'\n',
];

#[derive(Debug, Clone)]
enum Edit {
    FlipBit(usize, u8),
    Overwrite(usize, u8),
    Interesting(usize, usize),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    Duplicate(usize, usize, usize),
    Splice(usize, usize, usize, usize),
    /// Little-endian u32 boundary value written over 4 bytes (lengths, counts, offsets).
    Word(usize, u32),
}

fn edit() -> impl Strategy<Value = Edit> {
    let word = prop_oneof![
        Just(0u32),
        Just(1),
        Just(u32::MAX),
        Just(u32::MAX - 1),
        Just(0x8000_0000),
        Just(0x7fff_ffff),
        any::<u32>(),
        0u32..4096,
    ];
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(p, b)| Edit::FlipBit(p, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(p, v)| Edit::Overwrite(p, v)),
        (any::<usize>(), any::<usize>()).prop_map(|(p, i)| Edit::Interesting(p, i)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(p, b)| Edit::Insert(p, b)),
        (any::<usize>(), 1usize..32).prop_map(|(p, n)| Edit::Delete(p, n)),
        any::<usize>().prop_map(Edit::Truncate),
        (any::<usize>(), 1usize..64, any::<usize>()).prop_map(|(a, n, b)| Edit::Duplicate(a, n, b)),
        (any::<usize>(), any::<usize>(), 1usize..64, any::<usize>())
            .prop_map(|(s, a, n, b)| Edit::Splice(s, a, n, b)),
        (any::<usize>(), word).prop_map(|(p, w)| Edit::Word(p, w)),
    ]
}

fn apply(mut data: Vec<u8>, edits: &[Edit], seeds: &[Vec<u8>]) -> Vec<u8> {
    for e in edits {
        let len = data.len();
        let at = |p: usize| if len == 0 { 0 } else { p % len };
        match e {
            Edit::FlipBit(p, b) if len > 0 => data[at(*p)] ^= 1 << b,
            Edit::Overwrite(p, v) if len > 0 => data[at(*p)] = *v,
            Edit::Interesting(p, i) if len > 0 => data[at(*p)] = INTERESTING[i % INTERESTING.len()],
            Edit::Insert(p, bytes) => {
                let p = if len == 0 { 0 } else { p % (len + 1) };
                data.splice(p..p, bytes.iter().copied());
            }
            Edit::Delete(p, n) if len > 0 => {
                let p = at(*p);
                data.drain(p..(p + n).min(len));
            }
            Edit::Truncate(p) => data.truncate(if len == 0 { 0 } else { p % len }),
            Edit::Duplicate(a, n, b) if len > 0 => {
                let a = at(*a);
                let chunk = data[a..(a + n).min(len)].to_vec();
                let b = b % (len + 1);
                data.splice(b..b, chunk);
            }
            Edit::Splice(s, a, n, b) => {
                let other = &seeds[s % seeds.len()];
                if !other.is_empty() {
                    let a = a % other.len();
                    let chunk = &other[a..(a + n).min(other.len())];
                    let b = if len == 0 { 0 } else { b % (len + 1) };
                    data.splice(b..b, chunk.iter().copied());
                }
            }
            Edit::Word(p, w) if len >= 4 => {
                let p = p % (len - 3);
                data[p..p + 4].copy_from_slice(&w.to_le_bytes());
            }
            _ => {}
        }
    }
    data
}

/// Inputs for a parser: a seed unchanged (1 in 16), a seed with 1 to 8 edits, or up to 512
/// random bytes (1 in 16).
pub fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    let seeds = std::sync::Arc::new(seeds);
    let s1 = seeds.clone();
    let s2 = seeds.clone();
    prop_oneof![
        1 => (0..n).prop_map(move |i| s1[i].clone()),
        14 => (0..n, proptest::collection::vec(edit(), 1..8))
            .prop_map(move |(i, edits)| apply(s2[i].clone(), &edits, &s2)),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
    ]
}

/// Text inputs: the mutated bytes read as UTF-8 (invalid sequences replaced).
pub fn mutated_text(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = String> {
    mutated(seeds).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// How long one parse may take before it counts as a hang (generous: debug builds, two cores
/// shared with other work).
pub const HANG_LIMIT: Duration = Duration::from_secs(20);

/// Runs `f` on its own thread and returns its result; fails the case when it panicked (the
/// panic is re-raised with its message) or ran longer than [`HANG_LIMIT`] (the runaway thread is
/// left behind: a hang cannot be interrupted, only reported).
pub fn no_hang<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let out = f();
        let _ = tx.send(());
        out
    });
    match rx.recv_timeout(HANG_LIMIT) {
        Ok(()) => worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p)),
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(_) => unreachable!("the worker sends before it returns"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not return within {HANG_LIMIT:?}: a hang")
        }
    }
}

/// Cases per property: `PROPTEST_CASES` when set (the `--long` run of scripts/test.sh raises
/// it), else `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
