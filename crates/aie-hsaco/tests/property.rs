//! Property tests of the strict reader: random valid files round-trip, and truncations, flipped
//! bytes, out-of-bounds offsets and sizes, overlapping regions, wrong magic or version and
//! duplicate names give typed errors, never a panic. The generator is a seeded xorshift (the
//! build machines are offline, so no proptest); every failure prints its seed and case.
//!
//! `tests/corpus/`: `valid-*.hsaco` must read, `corrupt-*.hsaco` must be refused.
//! `HSACO_BLESS=1 cargo test -p aie-hsaco --test property` rewrites the corpus.

use aie_hsaco::{
    build_section, find_section, parse_section, read, read_all, write, HsacoError, Kernel,
    KernelKind, Section,
};
use std::path::PathBuf;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    fn bytes(&mut self, max: u64) -> Vec<u8> {
        let n = 1 + self.below(max) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn words(&mut self, max: u64) -> Vec<u8> {
        let n = 4 * (1 + self.below(max) as usize);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn random_section(r: &mut Rng, arch: &str) -> Section {
    let n = 1 + r.below(5) as usize;
    let shared_pdi = r.bytes(40);
    let kernels = (0..n)
        .map(|i| {
            let full_elf = arch == "aie2p" && r.below(5) == 0;
            let name = format!("k{i}-{}", r.below(1000));
            if full_elf {
                Kernel {
                    name: format!("{name}:sequence"),
                    kind: KernelKind::FullElf,
                    insts: r.bytes(50),
                    pdi: vec![],
                    kernarg_size: 16 * r.below(5) as u32,
                    num_cols: 1 + r.below(8) as u32,
                }
            } else {
                let pdi = if r.below(2) == 0 {
                    shared_pdi.clone()
                } else {
                    r.bytes(40)
                };
                Kernel::pdi_insts(
                    name,
                    pdi,
                    r.words(10),
                    1 + r.below(4) as u32,
                    1 + r.below(4) as u32,
                )
            }
        })
        .collect();
    Section {
        arch: arch.to_string(),
        kernels,
    }
}

fn random_file(r: &mut Rng) -> Vec<Section> {
    match r.below(3) {
        0 => vec![random_section(r, "aie2")],
        1 => vec![random_section(r, "aie2p")],
        _ => vec![random_section(r, "aie2p"), random_section(r, "aie2")],
    }
}

/// The reader must return, never panic; a successful read must give well-formed kernels.
fn check_no_panic(bytes: &[u8], ctx: &str) {
    let res = std::panic::catch_unwind(|| {
        for arch in ["aie2", "aie2p"] {
            if let Ok(ks) = read(bytes, arch) {
                assert!(!ks.is_empty());
                for k in ks {
                    assert!(!k.name.is_empty() && !k.insts.is_empty() && k.num_cols >= 1);
                    if k.kind == KernelKind::PdiInsts {
                        assert!(!k.pdi.is_empty() && k.insts.len().is_multiple_of(4));
                    }
                }
            }
        }
        let _ = read_all(bytes);
    });
    assert!(res.is_ok(), "reader panicked on {ctx}");
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn random_files_round_trip() {
    for seed in 1..300u64 {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let secs = random_file(&mut r);
        let f = write(&secs).unwrap_or_else(|e| panic!("seed {seed}: write failed: {e}"));
        for s in &secs {
            assert_eq!(read(&f, &s.arch).unwrap(), s.kernels, "seed {seed}");
        }
        assert_eq!(read_all(&f).unwrap(), secs, "seed {seed}");
    }
}

#[test]
fn every_truncation_is_a_clean_error() {
    for seed in 1..40u64 {
        let mut r = Rng(seed * 7919 + 1);
        let secs = random_file(&mut r);
        let f = write(&secs).unwrap();
        for len in 0..f.len() {
            let t = &f[..len];
            check_no_panic(t, &format!("seed {seed} truncated to {len}"));
            // The section header table is at the end: any truncation loses it.
            assert!(read(t, &secs[0].arch).is_err(), "seed {seed} len {len}");
        }
        // A truncated section (the section's size shrunk inside a valid ELF).
        let sec = find_section(&f, &secs[0].arch).unwrap();
        for len in 0..sec.len() {
            assert!(
                parse_section(&sec[..len], &secs[0].arch).is_err(),
                "seed {seed}: section truncated to {len} was accepted"
            );
        }
    }
}

#[test]
fn flipped_bytes_never_panic() {
    for seed in 1..200u64 {
        let mut r = Rng(seed * 104_729 + 3);
        let secs = random_file(&mut r);
        let mut f = write(&secs).unwrap();
        for _ in 0..1 + r.below(8) {
            let i = r.below(f.len() as u64) as usize;
            f[i] ^= 1 << r.below(8);
        }
        check_no_panic(&f, &format!("seed {seed} with flipped bytes"));
        // Whole random garbage behind an ELF magic, too.
        let mut g = b"\x7fELF\x02\x01\x01".to_vec();
        g.extend(r.bytes(400));
        check_no_panic(&g, &format!("seed {seed} garbage"));
    }
}

/// Section-relative header fields: (offset, name).
const HEADER_FIELDS: [(usize, &str); 6] = [
    (8, "header_size"),
    (12, "kernel_count"),
    (16, "kernel_entry_size"),
    (20, "string_table_offset"),
    (24, "string_table_size"),
    (28, "blob_pool_offset"),
];

#[test]
fn out_of_bounds_and_overlapping_fields_are_refused() {
    let interesting = |r: &mut Rng, len: u32| -> u32 {
        match r.below(6) {
            0 => 0,
            1 => u32::MAX,
            2 => len,
            3 => len + 1,
            4 => r.below(len as u64 + 64) as u32,
            _ => r.next() as u32,
        }
    };
    let mut refused = 0;
    for seed in 1..400u64 {
        let mut r = Rng(seed * 31 + 17);
        let arch = if r.below(2) == 0 { "aie2" } else { "aie2p" };
        let s = random_section(&mut r, arch);
        let mut sec = build_section(arch, &s.kernels).unwrap();
        let len = sec.len() as u32;
        let n = s.kernels.len();
        if r.below(2) == 0 {
            let (off, _) = HEADER_FIELDS[r.below(6) as usize];
            let v = interesting(&mut r, len);
            put_u32(&mut sec, off, v);
        } else {
            let k = r.below(n as u64) as usize;
            let field = r.below(8) as usize;
            let v = interesting(&mut r, len);
            put_u32(&mut sec, 48 + 44 * k + 4 * field, v);
        }
        let res = std::panic::catch_unwind(|| parse_section(&sec, arch));
        let Ok(res) = res else {
            panic!("seed {seed}: parse_section panicked");
        };
        if let Ok(ks) = res {
            // Accepted: every blob it returns was inside the section.
            for k in &ks {
                assert!(k.insts.len() <= sec.len() && k.pdi.len() <= sec.len());
            }
        } else {
            refused += 1;
        }
    }
    assert!(refused > 200, "only {refused} of 399 corruptions refused");
}

#[test]
fn specific_corruptions_give_specific_errors() {
    let s = Section {
        arch: "aie2p".into(),
        kernels: vec![
            Kernel::pdi_insts("a", vec![1; 8], vec![2; 8], 2, 1),
            Kernel::pdi_insts("b", vec![3; 8], vec![4; 8], 2, 1),
        ],
    };
    let good = build_section("aie2p", &s.kernels).unwrap();
    let with = |off: usize, v: u32| {
        let mut b = good.clone();
        put_u32(&mut b, off, v);
        parse_section(&b, "aie2p")
    };
    assert!(matches!(with(0, 0x4B45_4942), Err(HsacoError::BadMagic(_))));
    let mut v2 = good.clone();
    v2[4] = 2;
    assert_eq!(parse_section(&v2, "aie2p"), Err(HsacoError::BadVersion(2)));
    assert_eq!(with(8, 47), Err(HsacoError::HeaderSize(47)));
    assert_eq!(with(12, 0), Err(HsacoError::NoKernels));
    assert_eq!(with(16, 43), Err(HsacoError::EntrySize(43)));
    // String table overlapping the kernel table.
    assert!(matches!(
        with(20, 48 + 44),
        Err(HsacoError::OutOfBounds { .. })
    ));
    // Blob pool overlapping the string table, or beyond the section.
    assert!(matches!(with(28, 136), Err(HsacoError::OutOfBounds { .. })));
    assert!(matches!(
        with(28, good.len() as u32 + 1),
        Err(HsacoError::OutOfBounds { .. })
    ));
    // An instruction blob before the pool (overlapping the tables), and one past the end.
    assert!(matches!(
        with(48 + 4, 0),
        Err(HsacoError::OutOfBounds { .. })
    ));
    assert!(matches!(
        with(48 + 8, u32::MAX),
        Err(HsacoError::OutOfBounds { .. })
    ));
    // Name offset outside the string table.
    assert!(matches!(with(48, 100), Err(HsacoError::BadName { .. })));
    // Duplicate names: point the second entry's name at the first.
    assert_eq!(with(48 + 44, 0), Err(HsacoError::DuplicateName("a".into())));
    // No PDI on a kind-0 kernel, a bad kind, insts not a multiple of 4, zero columns.
    let mut nopdi = good.clone();
    put_u32(&mut nopdi, 48 + 12, 0);
    put_u32(&mut nopdi, 48 + 16, 0);
    assert!(matches!(
        parse_section(&nopdi, "aie2p"),
        Err(HsacoError::BadKernel { .. })
    ));
    assert!(matches!(with(48 + 28, 2), Err(HsacoError::BadKind { .. })));
    assert!(matches!(with(48 + 8, 7), Err(HsacoError::BadKernel { .. })));
    assert!(matches!(
        with(48 + 24, 0),
        Err(HsacoError::BadKernel { .. })
    ));
    // Not ELF at all, and an ELF without the architecture's section.
    let f = write(std::slice::from_ref(&s)).unwrap();
    assert!(matches!(read(b"AIEK", "aie2p"), Err(HsacoError::NotElf(_))));
    assert_eq!(read(&f, "aie2"), Err(HsacoError::NoSection("aie2".into())));
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let k = |n: &str| Kernel::pdi_insts(n, vec![0xAB; 32], vec![1, 0, 0, 0, 2, 0, 0, 0], 3, 1);
    let one = write(&[Section {
        arch: "aie2p".into(),
        kernels: vec![k("add-f32_4-f32_4-f32_4")],
    }])
    .unwrap();
    let two_archs = write(&[
        Section {
            arch: "aie2".into(),
            kernels: vec![k("k1"), k("k2")],
        },
        Section {
            arch: "aie2p".into(),
            kernels: vec![k("k1")],
        },
    ])
    .unwrap();
    let sec_at = |f: &[u8]| {
        let s = find_section(f, "aie2p").unwrap();
        s.as_ptr() as usize - f.as_ptr() as usize
    };
    let o = sec_at(&one);
    let mut bad_magic = one.clone();
    bad_magic[o + 3] = b'X';
    let mut bad_version = one.clone();
    bad_version[o + 4] = 9;
    let mut oob_blob = one.clone();
    put_u32(&mut oob_blob, o + 48 + 4, 0xFFFF_0000);
    let truncated = one[..one.len() - 10].to_vec();
    let mut dup = two_archs.clone();
    let o2 = {
        let s = find_section(&dup, "aie2").unwrap();
        s.as_ptr() as usize - dup.as_ptr() as usize
    };
    put_u32(&mut dup, o2 + 48 + 44, 0);
    vec![
        ("valid-one-kernel.hsaco", one),
        ("valid-two-archs.hsaco", two_archs),
        ("corrupt-magic.hsaco", bad_magic),
        ("corrupt-version.hsaco", bad_version),
        ("corrupt-oob-blob.hsaco", oob_blob),
        ("corrupt-truncated.hsaco", truncated),
        ("corrupt-duplicate-name.hsaco", dup),
    ]
}

#[test]
fn seed_corpus() {
    let dir = corpus_dir();
    if std::env::var_os("HSACO_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in corpus() {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&p).unwrap();
        check_no_panic(&bytes, &name);
        let res = read_all(&bytes);
        let all_ok = res.is_ok() && ["aie2", "aie2p"].iter().any(|a| read(&bytes, a).is_ok());
        if name.starts_with("valid-") {
            assert!(all_ok, "{name}: {res:?}");
        } else {
            assert!(
                res.is_err() || ["aie2", "aie2p"].iter().all(|a| read(&bytes, a).is_err()),
                "{name} was accepted"
            );
        }
        n += 1;
    }
    assert!(n >= 7, "corpus has {n} files");
}

/// A 0.7 MiB section whose 8,192 entries all name one 256 KiB PDI would make a reader that copies
/// each kernel's blobs allocate 2 GiB: refused, whatever the entries say.
#[test]
fn entries_sharing_one_blob_cannot_amplify_the_file() {
    let kernel = |i: usize, pdi: Vec<u8>| Kernel {
        name: format!("k{i}"),
        kind: KernelKind::PdiInsts,
        insts: vec![0; 4],
        pdi,
        kernarg_size: 16,
        num_cols: 1,
    };
    let mut kernels = vec![kernel(0, vec![7; 256 << 10])];
    kernels.extend((1..8192).map(|i| kernel(i, vec![1])));
    let mut sec = build_section("aie2p", &kernels).unwrap();
    assert!(
        parse_section(&sec, "aie2p").is_ok(),
        "the honest file reads"
    );
    let pdi = |sec: &[u8], k: usize, field: usize| {
        let at = 48 + 44 * k + field;
        u32::from_le_bytes(sec[at..at + 4].try_into().unwrap())
    };
    let (off, size) = (pdi(&sec, 0, 12), pdi(&sec, 0, 16));
    assert_eq!(size, 256 << 10);
    for k in 1..8192 {
        put_u32(&mut sec, 48 + 44 * k + 12, off);
        put_u32(&mut sec, 48 + 44 * k + 16, size);
    }
    assert!(sec.len() < 1 << 20, "{}", sec.len());
    let err = parse_section(&sec, "aie2p").unwrap_err();
    assert!(matches!(err, HsacoError::Amplified { .. }), "{err}");
}
