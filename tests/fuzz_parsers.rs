//! Property tests of every parser of the backend that reads outside input: tensor
//! descriptors and `ggml-hsa-gen-kernels` configs (and the kernel names and compile requests made
//! from them), the compiler protocol's capabilities, the environment (`Config::from_lookup`, the
//! compiler command line), AIE code objects (`aie-hsaco`), kernel files in the precompiled and
//! cache directories, and the cache manifest that `GGML_HSA_KERNEL_CACHE_CLEAR` reads.
//!
//! Each property mutates the seed corpus `tests/corpus/<parser>/` (see `tests/fuzz/mutate.rs`)
//! and checks: no panic, no hang, a typed error with a message, and, for what is accepted, that
//! it is usable (it round-trips, names are file-name safe, kernels have their blobs).
//! `PROPTEST_CASES` raises the case count (`scripts/test.sh --long`).

#[path = "fuzz/mutate.rs"]
mod mutate;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ggml_hsa::config::{parse_bool, Config, MAX_DEVICES};
use ggml_hsa::kernels::compiler::{Capabilities, Compiler};
use ggml_hsa::kernels::desc::{KernelDesc, Layout, DTYPES};
use ggml_hsa::kernels::gen_config::{format_tensor, parse_tensor, KernelConfig, KernelEntry};
use ggml_hsa::kernels::kernel_dir::{clear_cache_dir, parse_manifest, MANIFEST};
use ggml_hsa::kernels::store::KernelStore;
use ggml_hsa::kernels::Arch;
use mutate::{cases, corpus, mutated, mutated_text, no_hang};
use proptest::prelude::*;

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn seeds(parser: &str) -> Vec<Vec<u8>> {
    corpus(&corpus_root(), parser)
}

/// A canonical kernel name: `[a-z0-9_x-]`, at most 160 characters (it names files).
fn assert_name_safe(name: &str) {
    assert!(!name.is_empty() && name.len() <= 160, "{name:?}");
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'),
        "{name:?}"
    );
}

/// What a usable description must give: a safe name and a request that is JSON.
fn check_desc(desc: &KernelDesc) {
    assert_name_safe(&desc.canonical_name());
    for arch in [Arch::Aie2, Arch::Aie2p] {
        let request: serde_json::Value = serde_json::from_str(&desc.request_json(arch)).unwrap();
        assert_eq!(request["name"], desc.canonical_name().as_str());
    }
}

fn config(default_cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: cases(default_cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(512))]

    /// `(ne0,ne1,ne2,ne3)/dtype[/(nb0,nb1,nb2,nb3)]`: accepted descriptors read back the same
    /// after formatting and name a kernel safely.
    #[test]
    fn tensor_descriptors(text in mutated_text(seeds("tensor_descriptor"))) {
        let shown = text.clone();
        let parsed = no_hang("parse_tensor", move || parse_tensor(&text));
        match parsed {
            Ok(layout) => {
                let again = parse_tensor(&format_tensor(&layout));
                prop_assert_eq!(again.as_ref(), Ok(&layout), "{:?}", shown);
                let add = KernelDesc {
                    op: "ADD".into(),
                    op_params: vec![],
                    inputs: vec![layout.clone(), Layout::dense(&layout.dtype, [1; 4]).unwrap()],
                    output: layout,
                    f16_as_bf16: false,
                    n_kv_step: None,
                    extra_outputs: Vec::new(),
                };
                check_desc(&add);
                // The compilers' capabilities judge any accepted layout (yes or no).
                for caps in &seeds("capabilities")[..2] {
                    let caps = Capabilities::parse(std::str::from_utf8(caps).unwrap()).unwrap();
                    if let Err(why) = caps.check(Arch::Aie2p, &add) {
                        prop_assert!(!why.is_empty());
                    }
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// Kernel configs: a config that parses serialises back to itself; every entry that maps to a
    /// description maps back from it to the same description (under its canonical name).
    #[test]
    fn gen_kernels_configs(text in mutated_text(seeds("gen_config"))) {
        let parsed = no_hang("KernelConfig::parse", move || {
            let parsed = KernelConfig::parse(&text);
            let descs: Vec<_> = parsed
                .iter()
                .flat_map(|c| c.kernels.iter().map(KernelEntry::to_desc))
                .collect();
            (parsed, descs)
        });
        match parsed {
            (Ok(config), descs) => {
                prop_assert_eq!(KernelConfig::parse(&config.to_json()), Ok(config.clone()));
                for (entry, desc) in config.kernels.iter().zip(descs) {
                    match desc {
                        Ok((arch, desc)) => {
                            check_desc(&desc);
                            prop_assert!(!entry.file_name(&desc).is_empty());
                            let back = KernelEntry::from_desc(&desc, arch).to_desc();
                            prop_assert_eq!(back, Ok((arch, desc)));
                        }
                        Err(e) => prop_assert!(!e.to_string().is_empty()),
                    }
                }
            }
            (Err(e), _) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    /// The compiler's `capabilities` answer: whatever it declares, checking a kernel against it
    /// answers yes or no without panicking.
    #[test]
    fn compiler_capabilities(text in mutated_text(seeds("capabilities"))) {
        let probes = probe_descs();
        let checked = no_hang("Capabilities::parse", move || {
            Capabilities::parse(&text).map(|caps| {
                let answers: Vec<Result<(), String>> = probes
                    .iter()
                    .flat_map(|d| [Arch::Aie2, Arch::Aie2p].map(|a| caps.check(a, d)))
                    .collect();
                (caps, answers)
            })
        });
        match checked {
            Ok((caps, answers)) => {
                prop_assert_eq!(caps.protocol, 1);
                for a in answers {
                    if let Err(why) = a {
                        prop_assert!(!why.is_empty());
                    }
                }
            }
            Err(e) => prop_assert!(!e.is_empty()),
        }
    }

    /// Environment values: any value of any variable gives a configuration within its bounds, and
    /// each rejected value is named in a warning.
    #[test]
    fn environment_values(
        values in proptest::collection::vec(
            (0..ENV_VARS.len(), mutated_text(seeds("env_values"))), 0..12)
    ) {
        let env: HashMap<&str, String> =
            values.iter().map(|(i, v)| (ENV_VARS[*i], v.clone())).collect();
        let lookup_env = env.clone();
        let config = no_hang("Config::from_lookup", move || {
            Config::from_lookup(|name| lookup_env.get(name).cloned().map(Into::into))
        });
        prop_assert!((1..=MAX_DEVICES).contains(&config.max_devices));
        if let Some(n) = env.get("GGML_HSA_MAX_DEVICES").and_then(|v| v.trim().parse().ok()) {
            if (1..=MAX_DEVICES).contains(&n) {
                prop_assert_eq!(config.max_devices, n);
            }
        }
        for (name, value) in &env {
            let is_flag = FLAGS.contains(name);
            if is_flag && parse_bool(value).is_none() {
                prop_assert!(
                    config.warnings.iter().any(|w| w.contains(name)),
                    "{}={:?}: no warning in {:?}", name, value, config.warnings
                );
            }
        }
        prop_assert!(config.warnings.iter().all(|w| !w.is_empty()));
        prop_assert!(!config.cache_dir.as_os_str().is_empty());
    }

    /// `GGML_HSA_JIT_COMPILER`: any text is a command line or none.
    #[test]
    fn compiler_command_lines(text in mutated_text(seeds("compiler_command"))) {
        let expect_none = text.split_whitespace().next().is_none();
        let compiler = no_hang("Compiler::new", move || Compiler::new(&text));
        if expect_none {
            prop_assert!(compiler.is_none());
        }
    }

    /// AIE code objects: whatever `read_all` accepts, `write` writes back to the same sections;
    /// `read` for one architecture agrees with it.
    #[test]
    fn hsaco_files(bytes in mutated(seeds("hsaco"))) {
        let (all, one) = no_hang("aie_hsaco::read_all", move || {
            (aie_hsaco::read_all(&bytes), aie_hsaco::read(&bytes, "aie2p"))
        });
        match all {
            Ok(sections) => {
                if let Ok(again) = aie_hsaco::write(&sections) {
                    prop_assert_eq!(aie_hsaco::read_all(&again), Ok(sections.clone()));
                }
                let aie2p = sections.iter().find(|s| s.arch == "aie2p");
                match aie2p {
                    Some(s) => prop_assert_eq!(one, Ok(s.kernels.clone())),
                    None => prop_assert!(one.is_err()),
                }
            }
            // `read` looks at its own section only (as ROCR does), so another section's defect
            // does not stop it.
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

proptest! {
    #![proptest_config(config(96))]

    /// Kernel files found in a kernel directory: a corrupt `.hsaco` or `.pdi` + `_insts.bin` is
    /// passed over (logged) and what is loaded is a whole kernel.
    #[test]
    fn kernel_files_on_disk(
        hsaco in proptest::option::of(mutated(seeds("hsaco"))),
        pdi in proptest::option::of(mutated(seeds("pdi"))),
        insts in proptest::option::of(mutated(seeds("insts"))),
    ) {
        let root = scratch("files");
        let dir = root.join("kernels").join("aie2p");
        std::fs::create_dir_all(&dir).unwrap();
        let desc = seed_desc();
        let name = desc.canonical_name();
        let write = |file: String, bytes: &Option<Vec<u8>>| {
            if let Some(b) = bytes {
                std::fs::write(dir.join(file), b).unwrap();
            }
        };
        write(format!("{name}.hsaco"), &hsaco);
        write(format!("{name}.pdi"), &pdi);
        write(format!("{name}_insts.bin"), &insts);
        let store = KernelStore::new(
            Arch::Aie2p, Some(root.join("kernels")), root.join("cache"), None, false);
        let loaded = no_hang("KernelStore::load", move || store.load(&desc));
        match loaded {
            Ok(files) => {
                prop_assert_eq!(&files.name, &name);
                prop_assert!(!files.pdi.is_empty());
                prop_assert!(!files.insts.is_empty() && files.insts.len() % 4 == 0);
                if let Some(h) = &files.hsaco {
                    prop_assert_eq!(Some(h), hsaco.as_ref());
                    let k = aie_hsaco::read(h, "aie2p").unwrap();
                    prop_assert!(k.iter().any(|k| k.name == name && k.pdi == files.pdi));
                } else {
                    prop_assert_eq!(Some(&files.pdi), pdi.as_ref());
                    prop_assert_eq!(Some(&files.insts), insts.as_ref());
                }
            }
            Err(e) => prop_assert!(e.reason.contains("JIT compilation is disabled"), "{}", e),
        }
        let _ = std::fs::remove_dir_all(root);
    }

    /// The cache manifest names the files `GGML_HSA_KERNEL_CACHE_CLEAR` deletes: whatever it
    /// says, only kernel files of the cache directory itself go, never a file elsewhere, never a
    /// file that is not a kernel's.
    #[test]
    fn cache_manifests(text in mutated_text(seeds("manifest"))) {
        let root = scratch("manifest");
        let dir = root.join("cache").join("aie2");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        // Files every manifest line could try to reach: the listed names' kernel files, files
        // beside the cache directory and above it.
        let mut kernel_files = Vec::new();
        // A line's name is its first field (the others are its files' sizes and checksums).
        let names = text.lines().filter_map(|l| l.split_whitespace().next());
        for line in names.filter(|n| is_plain_name(n)) {
            for f in [format!("{line}.pdi"), format!("{line}_insts.bin")] {
                if std::fs::write(dir.join(&f), b"k").is_ok() {
                    kernel_files.push(dir.join(f));
                }
            }
        }
        let precious = [
            dir.join("notes.txt"),
            root.join("cache").join("keep.pdi"),
            root.join("outside").join("keep.pdi"),
            root.join("keep.pdi"),
        ];
        for p in &precious {
            std::fs::write(p, b"keep").unwrap();
        }
        std::fs::write(dir.join(MANIFEST), &text).unwrap();
        // The sizes and checksums the loader checks files against: whatever the text, a map
        // keyed by the lines' first fields, never a panic.
        let parse_text = text.clone();
        let parsed = no_hang("parse_manifest", move || parse_manifest(&parse_text));
        for name in parsed.keys() {
            prop_assert!(
                text.lines().any(|l| l.split_whitespace().next() == Some(name.as_str())),
                "{name:?} is no line's first field"
            );
        }
        let clear_dir = dir.clone();
        let removed = no_hang("clear_cache_dir", move || clear_cache_dir(&clear_dir));
        for p in &precious {
            prop_assert!(p.is_file(), "{} removed by manifest {:?}", p.display(), text);
        }
        for p in &removed {
            prop_assert_eq!(p.parent(), Some(dir.as_path()), "{}", p.display());
        }
        for p in &kernel_files {
            prop_assert!(!p.exists(), "{} listed but kept", p.display());
        }
        prop_assert!(!dir.join(MANIFEST).exists());
        let _ = std::fs::remove_dir_all(root);
    }
}

/// A manifest line's first field that is a kernel name (what the clearing accepts).
fn is_plain_name(line: &str) -> bool {
    !line.is_empty() && !line.contains('/') && !line.starts_with('.') && !line.contains('\0')
}

const FLAGS: [&str; 6] = [
    "GGML_HSA_ENABLE_LOG",
    "GGML_HSA_JIT_VERBOSE",
    "GGML_HSA_KERNEL_CACHE_CLEAR",
    "GGML_HSA_JIT_CLEAR_CACHE",
    "GGML_HSA_CPU_FALLBACK",
    "GGML_HSA_F16_AS_BF16",
];

const ENV_VARS: [&str; 19] = [
    "GGML_HSA_ENABLE_LOG",
    "GGML_HSA_LIBHSA_PATH",
    "GGML_HSA_MAX_DEVICES",
    "GGML_HSA_PACKET_ABI",
    "GGML_HSA_KERNEL_DIR",
    "GGML_HSA_KERNEL_CACHE_DIR",
    "XDG_CACHE_HOME",
    "HOME",
    "GGML_HSA_JIT_COMPILER",
    "GGML_HSA_JIT_VERBOSE",
    "GGML_HSA_KERNEL_CACHE_CLEAR",
    "GGML_HSA_JIT_CLEAR_CACHE",
    "GGML_HSA_KERNEL_RECORD",
    "GGML_HSA_CPU_FALLBACK",
    "GGML_HSA_F16_AS_BF16",
    "GGML_HSA_STATS",
    "GGML_HSA_JIT_TIMEOUT",
    "GGML_HSA_KERNEL_CACHE_MAX",
    "XDG_RUNTIME_DIR",
];

/// Descriptions the fuzzed capabilities are asked about: every operand type, broadcast and
/// strided operands, bf16 computing of f16.
fn probe_descs() -> Vec<KernelDesc> {
    let mut out = Vec::new();
    for (dtype, block, _) in DTYPES {
        let t = Layout::dense(dtype, [block as i64 * 4, 3, 1, 1]).unwrap();
        let row = Layout::dense(dtype, [block as i64 * 4, 1, 1, 1]).unwrap();
        out.push(KernelDesc {
            op: "ADD".into(),
            op_params: vec![],
            inputs: vec![t.clone(), row],
            output: t.clone(),
            f16_as_bf16: dtype == "f16",
            n_kv_step: None,
            extra_outputs: Vec::new(),
        });
        let mut strided = t.clone();
        strided.nb[1] *= 2;
        out.push(KernelDesc {
            op: "SCALE".into(),
            op_params: vec![0x3f00_0000],
            inputs: vec![strided],
            output: t,
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        });
    }
    out
}

/// The kernel the `hsaco`, `pdi` and `insts` seeds hold.
fn seed_desc() -> KernelDesc {
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ggml-hsa-fuzz-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The binary seeds (code objects and kernel file pairs) as this build writes them; the
/// committed corpus must match (`GGML_HSA_BLESS=1` rewrites it), so a format change cannot leave
/// the property tests mutating files that no longer reach the deep checks.
fn binary_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let name = seed_desc().canonical_name();
    let insts: Vec<u8> = (1u32..=8).flat_map(u32::to_le_bytes).collect();
    let pdi = b"PDI of the seed kernel".to_vec();
    let single = aie_hsaco::write_single("aie2p", &name, &pdi, &insts, 2, 1).unwrap();
    let two_archs = aie_hsaco::write(&[
        aie_hsaco::Section {
            arch: "aie2".into(),
            kernels: vec![aie_hsaco::Kernel::pdi_insts(
                &name,
                pdi.clone(),
                insts.clone(),
                2,
                4,
            )],
        },
        aie_hsaco::Section {
            arch: "aie2p".into(),
            kernels: vec![
                aie_hsaco::Kernel::pdi_insts(&name, pdi.clone(), insts.clone(), 2, 8),
                aie_hsaco::Kernel::pdi_insts("other", vec![7; 40], vec![1, 0, 0, 0], 3, 1),
                aie_hsaco::Kernel {
                    name: "full".into(),
                    kind: aie_hsaco::KernelKind::FullElf,
                    insts: b"\x7fELF nested".to_vec(),
                    pdi: Vec::new(),
                    kernarg_size: 32,
                    num_cols: 1,
                },
            ],
        },
    ])
    .unwrap();
    vec![
        ("hsaco", "01-single.hsaco", single),
        ("hsaco", "02-two-archs.hsaco", two_archs),
        ("pdi", "01.pdi", pdi),
        ("pdi", "02-one-byte.pdi", vec![0]),
        ("insts", "01.bin", insts),
        ("insts", "02-one-word.bin", vec![1, 0, 0, 0]),
    ]
}

#[test]
fn binary_seed_corpus_is_current() {
    let bless = std::env::var_os("GGML_HSA_BLESS").is_some();
    for (parser, file, bytes) in binary_seeds() {
        let path = corpus_root().join(parser).join(file);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (GGML_HSA_BLESS=1 writes it)", path.display()));
        assert!(
            committed == bytes,
            "{} differs from what this build writes (GGML_HSA_BLESS=1 rewrites it)",
            path.display()
        );
    }
}

/// The valid seeds of the text corpora are accepted, so the properties start from inputs that
/// reach the deep checks.
#[test]
fn valid_text_seeds_are_accepted() {
    for text in seeds("gen_config") {
        let config = KernelConfig::parse(std::str::from_utf8(&text).unwrap()).unwrap();
        for e in &config.kernels {
            e.to_desc().unwrap();
        }
    }
    let caps = seeds("capabilities");
    let accepted = caps
        .iter()
        .filter(|t| Capabilities::parse(std::str::from_utf8(t).unwrap()).is_ok())
        .count();
    assert_eq!(
        accepted,
        caps.len() - 1,
        "one capabilities seed speaks protocol 2"
    );
    let descriptors = seeds("tensor_descriptor");
    let ok = descriptors
        .iter()
        .filter(|t| parse_tensor(std::str::from_utf8(t).unwrap()).is_ok())
        .count();
    assert!(
        ok >= 10,
        "{ok} of {} descriptor seeds parse",
        descriptors.len()
    );
}

/// The inputs with which these properties found defects, kept as plain regression tests.
#[test]
fn found_defects_stay_fixed() {
    // Layout::is_dense multiplied the dense stride past u64 (overflow panic in debug builds,
    // a wrong answer in release ones) for a stride near 2^62.
    let huge = parse_tensor("(4,1,1,1)/f32/(4611686018427387904,4,4,4)").unwrap();
    assert!(!huge.is_dense());
    assert_name_safe(
        &KernelDesc {
            op: "RELU".into(),
            op_params: vec![],
            inputs: vec![huge.clone()],
            output: huge,
            f16_as_bf16: false,
            n_kv_step: None,
            extra_outputs: Vec::new(),
        }
        .canonical_name(),
    );
    // is_dense took nb[0] for the element size: elements 8 bytes apart in a single row counted
    // as dense, so that kernel got the dense kernel's name (and would have read it densely).
    let spaced = parse_tensor("(4,1,1,1)/f32/(8,32,32,32)").unwrap();
    let dense = parse_tensor("(4,1,1,1)/f32").unwrap();
    assert!(!spaced.is_dense() && dense.is_dense());
    let relu = |t: &Layout| KernelDesc {
        op: "RELU".into(),
        op_params: vec![],
        inputs: vec![t.clone()],
        output: t.clone(),
        f16_as_bf16: false,
        n_kv_step: None,
        extra_outputs: Vec::new(),
    };
    assert_ne!(
        relu(&spaced).canonical_name(),
        relu(&dense).canonical_name()
    );
    // Capabilities::check multiplied the four dimensions in i64.
    let wide = parse_tensor("(4294967296,4294967295,1,1)/i8").unwrap();
    let caps = Capabilities::parse(
        r#"{"protocol":1,"archs":["aie2"],"ops":[{"op":"ADD","inputs":2,"types":["i8"]}]}"#,
    )
    .unwrap();
    let add = KernelDesc {
        op: "ADD".into(),
        op_params: vec![],
        inputs: vec![wide.clone(), Layout::dense("i8", [1; 4]).unwrap()],
        output: wide,
        f16_as_bf16: false,
        n_kv_step: None,
        extra_outputs: Vec::new(),
    };
    assert_eq!(
        caps.check(Arch::Aie2, &add),
        Err("ADD kernels do not broadcast".into())
    );
    // An invalid GGML_HSA_JIT_CLEAR_CACHE went unreported when GGML_HSA_KERNEL_CACHE_CLEAR was on.
    let config = Config::from_lookup(|name| match name {
        "GGML_HSA_KERNEL_CACHE_CLEAR" => Some("1".into()),
        "GGML_HSA_JIT_CLEAR_CACHE" => Some("16".into()),
        _ => None,
    });
    assert!(config.cache_clear);
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("GGML_HSA_JIT_CLEAR_CACHE")),
        "{:?}",
        config.warnings
    );
}
