//! What the host process's state cannot change: the JIT compiler cannot be fooled by the host's
//! working directory or environment (it runs in the cache with `PYTHONSAFEPATH=1` and only the
//! variables it needs), and the cache is private whatever the umask.
//!
//! Tests in their own binary, run one after the other from one test function: they change the
//! process's working directory, environment and umask, which no other test may see.

use std::path::{Path, PathBuf};

use ggml_hsa::kernels::{Arch, Compiler, KernelDesc, KernelStore, Layout};

fn relu() -> KernelDesc {
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

/// A folder as a downloaded model's might be: a `ggml_hsa_iron` package and modules named like
/// the standard library's, each leaving a mark when imported.
fn poisoned_folder(dir: &Path) {
    let mark = |name: &str| {
        format!(
            "open({:?}, 'w').write('imported')\n",
            dir.join(format!("imported-{name}")).display().to_string()
        )
    };
    std::fs::create_dir_all(dir.join("ggml_hsa_iron")).unwrap();
    std::fs::write(dir.join("ggml_hsa_iron/__init__.py"), mark("package")).unwrap();
    std::fs::write(dir.join("ggml_hsa_iron/__main__.py"), mark("main")).unwrap();
    for module in ["argparse", "json", "os", "enum", "typing"] {
        std::fs::write(dir.join(format!("{module}.py")), mark(module)).unwrap();
    }
}

fn marks(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.starts_with("imported-").then_some(name)
        })
        .collect()
}

#[test]
fn process_state_does_not_reach_the_compiler_or_the_cache() {
    the_cache_is_private_whatever_the_umask();
    the_compiler_ignores_the_working_directory_and_gets_a_clean_environment();
}

fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask only swaps the process's file mode mask; no other thread of this binary
    // creates files meanwhile (one test function).
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// Under umask 000 a compiler writes world-writable files and `mkdir` makes world-writable
/// directories; under 777 the owner loses access. The cache is 0700 either way, and the
/// compiled kernel is still read (its files are sealed before they are recorded).
fn the_cache_is_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let root = std::env::temp_dir().join(format!("ggml-hsa-umask-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let compiler = root.join("compiler.sh");
    std::fs::write(
        &compiler,
        r#"#!/bin/sh
if [ "$1" = capabilities ]; then
  echo '{"protocol": 1, "archs": ["aie2p"], "ops": [{"op": "RELU", "inputs": 1, "types": ["f32"]}]}'
  exit 0
fi
f=${3##*/}; f=${f#.}; name=${f%%.request.*}
printf 'PDI!' > "$5/$name.pdi"
printf 'INS1' > "$5/${name}_insts.bin"
"#,
    )
    .unwrap();
    std::fs::set_permissions(&compiler, std::fs::Permissions::from_mode(0o755)).unwrap();
    for mask in [0o000, 0o777] {
        let cache = root.join(format!("cache-{mask:o}"));
        let old = set_umask(mask);
        let store = KernelStore::new(
            Arch::Aie2p,
            None,
            cache.clone(),
            Compiler::new(compiler.to_str().unwrap()),
            false,
        );
        let loaded = store.load(&relu());
        set_umask(old);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&cache), 0o700, "umask {mask:o}");
        assert_eq!(mode(&cache.join("aie2p")), 0o700, "umask {mask:o}");
        if mask == 0 {
            let k = loaded.unwrap();
            assert_eq!(k.pdi, b"PDI!");
            assert_eq!(mode(&k.path) & 0o022, 0, "{:o}", mode(&k.path));
        }
    }
    let _ = std::fs::remove_dir_all(root);
}

fn the_compiler_ignores_the_working_directory_and_gets_a_clean_environment() {
    let root = std::env::temp_dir().join(format!("ggml-hsa-sandbox-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let poisoned = root.join("model");
    poisoned_folder(&poisoned);
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    // SAFETY-free in edition 2021, and this binary runs no other test: nothing reads the
    // environment or the working directory concurrently.
    std::env::set_current_dir(&poisoned).unwrap();
    std::env::set_var("PYTHONPATH", &package);
    std::env::set_var("GGML_HSA_SANDBOX_PASSED", "yes");
    std::env::set_var("SANDBOX_SECRET", "not-for-the-compiler");
    std::env::set_var("LD_PRELOAD", "/nonexistent/preload.so");

    // The real package, run as the backend runs it by default.
    let store = KernelStore::new(
        Arch::Aie2p,
        None,
        root.join("cache"),
        Compiler::new("python3 -m ggml_hsa_iron"),
        false,
    );
    let asked = store.supports(&relu());
    assert_eq!(
        marks(&poisoned),
        Vec::<String>::new(),
        "code ran from the working directory"
    );
    assert_eq!(asked, Ok(()), "the package's own capabilities");

    // What a compiler sees: its working directory, the variables it was given.
    let spy = root.join("spy.sh");
    std::fs::write(
        &spy,
        format!(
            "#!/bin/sh\n{{ pwd; env; }} > {:?}\nexit 1\n",
            root.join("seen").display().to_string()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&spy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = KernelStore::new(
        Arch::Aie2p,
        None,
        root.join("cache"),
        Compiler::new(spy.to_str().unwrap()),
        false,
    );
    assert!(store.supports(&relu()).is_err());
    let seen = std::fs::read_to_string(root.join("seen")).unwrap();
    let cwd = seen.lines().next().unwrap();
    assert_eq!(
        std::fs::canonicalize(cwd).unwrap(),
        std::fs::canonicalize(root.join("cache")).unwrap()
    );
    let vars: Vec<&str> = seen.lines().skip(1).collect();
    for wanted in ["PYTHONSAFEPATH=1", "GGML_HSA_SANDBOX_PASSED=yes"] {
        assert!(vars.contains(&wanted), "{wanted} missing: {vars:?}");
    }
    assert!(vars.iter().any(|v| v.starts_with("PATH=")), "{vars:?}");
    for unwanted in ["SANDBOX_SECRET=", "LD_PRELOAD="] {
        assert!(
            !vars.iter().any(|v| v.starts_with(unwanted)),
            "{unwanted} passed: {vars:?}"
        );
    }
    std::env::set_current_dir(std::env::temp_dir()).unwrap();
    let _ = std::fs::remove_dir_all(root);
}
