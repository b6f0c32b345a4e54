//! The JIT compiler cannot be fooled by the host's working directory or environment: it runs in
//! the cache with `PYTHONSAFEPATH=1` and only the variables it needs.
//!
//! One test in its own binary: it changes the process's working directory and environment,
//! which no other test may see.

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
