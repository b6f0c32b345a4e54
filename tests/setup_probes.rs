//! The setup probes of the scripts (`--deps`/`deps` modes of test.sh, main.sh, llama-cpp.sh,
//! models.sh and check-iron.sh, all through `scripts/lib/apt.sh`) run against a fake Debian
//! machine: shims of `dpkg-query`, `apt-get`, `python3`, `cargo` and `rustup` on an otherwise
//! empty PATH, backed by a state directory listing what is "installed". The probes must ask for
//! every package the next steps need when it is missing, whatever else is present (a stock
//! machine has libclang-cpp14, which once hid a missing libclang-dev), and for nothing when all
//! is there.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const DPKG_QUERY: &str = r#"#!/bin/bash
# dpkg-query -W -f=FORMAT PKG
pkg=${!#}
if grep -qx "$pkg" "$FAKE_STATE/installed"; then echo "install ok installed"; exit 0; fi
echo "dpkg-query: no packages found matching $pkg" >&2
exit 1
"#;

const APT_GET: &str = r#"#!/bin/bash
case "$1" in
    update) exit 0 ;;
    install)
        shift
        for a in "$@"; do
            case "$a" in -*) ;; *) echo "apt $a" >>"$FAKE_STATE/requested"; echo "$a" >>"$FAKE_STATE/installed" ;; esac
        done ;;
    *) exit 100 ;;
esac
"#;

/// python3 as Debian packages it: `-m pip` needs python3-pip, `import ensurepip` python3-venv.
const PYTHON3: &str = r#"#!/bin/bash
has() { grep -qx "$1" "$FAKE_STATE/installed"; }
case "$1 $2" in
    "-m pip")
        has python3-pip || { echo "No module named pip" >&2; exit 1; }
        if [ "$3" = install ]; then
            for a in "${@:4}"; do case "$a" in -*) ;; *) echo "pip $a" >>"$FAKE_STATE/requested"; echo "pip:$a" >>"$FAKE_STATE/installed" ;; esac; done
        fi ;;
    "-m ruff")
        v=$(sed -n 's/^pip:ruff==//p' "$FAKE_STATE/installed" | tail -n 1)
        [ -n "$v" ] || exit 1
        echo "ruff $v" ;;
    "-c import ensurepip") has python3-venv || exit 1 ;;
    "-c import numpy, ml_dtypes"*)
        # The probe also asks for numpy >= 2: the newest numpy pip installed answers.
        grep -q '^pip:ml_dtypes==' "$FAKE_STATE/installed" || exit 1
        v=$(sed -n 's/^pip:numpy==//p' "$FAKE_STATE/installed" | tail -n 1)
        [ "${v%%.*}" -ge 2 ] 2>/dev/null || exit 1 ;;
    *) echo "python3 shim: unexpected $*" >&2; exit 3 ;;
esac
"#;

const CARGO: &str = r#"#!/bin/bash
case "$1" in
    fmt) grep -qx rustup:rustfmt "$FAKE_STATE/installed" ;;
    *) echo "cargo shim: unexpected $*" >&2; exit 3 ;;
esac
"#;

/// `rustc --print sysroot`: a sysroot whose `bin/clippy-driver` exists once clippy is installed.
const RUSTC: &str = r#"#!/bin/bash
[ "$1 $2" = "--print sysroot" ] || { echo "rustc shim: unexpected $*" >&2; exit 3; }
if grep -qx rustup:clippy "$FAKE_STATE/installed"; then
    echo "$FAKE_STATE/sysroot-with-clippy"
else
    echo "$FAKE_STATE/sysroot"
fi
"#;

const RUSTUP: &str = r#"#!/bin/bash
[ "$1 $2" = "component add" ] || { echo "rustup shim: unexpected $*" >&2; exit 3; }
echo "rustup $3" >>"$FAKE_STATE/requested"
echo "rustup:$3" >>"$FAKE_STATE/installed"
"#;

const SUDO: &str = "#!/bin/bash\nexec \"$@\"\n";

/// The base system's tools the scripts' setup paths use; nothing else of the real machine is on
/// the fake machine's PATH (no real dpkg-query, apt-get, python3, cmake or cargo can answer).
const BASE_TOOLS: &[&str] = &[
    "bash",
    "cat",
    "cut",
    "dirname",
    "env",
    "grep",
    "head",
    "id",
    "mkdir",
    "mktemp",
    "paste",
    "readlink",
    "rm",
    "sed",
    "sha256sum",
    "tail",
    "tr",
];

/// Everything the scripts' setup installs on a bare Debian 12 machine.
const ALL_APT: &[&str] = &[
    "cmake",
    "ninja-build",
    "g++",
    "ccache",
    "libclang-dev",
    "libhsa-runtime64-1",
    "libhsa-runtime-dev",
    "valgrind",
    "python3-pip",
    "python3-venv",
];

struct FakeMachine {
    dir: PathBuf,
}

impl FakeMachine {
    /// A machine on which dpkg lists `installed` (plus the rustup components and pip packages
    /// given as `rustup:NAME` / `pip:NAME==V`), with or without dpkg itself.
    fn new(name: &str, installed: &[&str], debian: bool) -> FakeMachine {
        let dir = std::env::temp_dir().join(format!(
            "ggml-hsa-setup-probes-{}-{name}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        let bin = dir.join("bin");
        let state = dir.join("state");
        fs::create_dir_all(&bin).unwrap();
        fs::create_dir_all(&state).unwrap();
        for tool in BASE_TOOLS {
            let real = ["/usr/bin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{tool} is not in /usr/bin or /bin"));
            std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
        }
        let mut shims = vec![
            ("apt-get", APT_GET),
            ("python3", PYTHON3),
            ("cargo", CARGO),
            ("rustc", RUSTC),
            ("rustup", RUSTUP),
            ("sudo", SUDO),
        ];
        if debian {
            shims.push(("dpkg-query", DPKG_QUERY));
        }
        for (name, text) in shims {
            let p = bin.join(name);
            fs::write(&p, text).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let driver = state.join("sysroot-with-clippy/bin/clippy-driver");
        fs::create_dir_all(driver.parent().unwrap()).unwrap();
        fs::write(&driver, "#!/bin/bash\n").unwrap();
        fs::set_permissions(&driver, fs::Permissions::from_mode(0o755)).unwrap();
        let mut list = installed.join("\n");
        list.push('\n');
        fs::write(state.join("installed"), list).unwrap();
        fs::write(state.join("requested"), "").unwrap();
        FakeMachine { dir }
    }

    /// Runs a script of the repository on this machine; returns (success, stderr).
    fn run(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        // The shims and BASE_TOOLS only: no real cmake, python3, cargo or dpkg of the
        // developer's machine can answer a probe.
        let path = self.dir.join("bin");
        let mut cmd = Command::new("/bin/bash");
        cmd.arg(root.join(script))
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("HOME", &self.dir)
            .env("FAKE_STATE", self.dir.join("state"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("bash runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// What the probes asked for: `apt PKG`, `pip SPEC`, `rustup COMPONENT`.
    fn requested(&self) -> BTreeSet<String> {
        fs::read_to_string(self.dir.join("state/requested"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn requested_apt(&self) -> BTreeSet<String> {
        self.requested()
            .iter()
            .filter_map(|l| l.strip_prefix("apt ").map(str::to_owned))
            .collect()
    }
}

impl Drop for FakeMachine {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The pinned numpy and ml_dtypes of scripts/lib/apt.sh (the emulation target's).
fn pinned_emu_python() -> Vec<String> {
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lib/apt.sh"))
        .unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("EMU_PY=("))
        .expect("scripts/lib/apt.sh pins the emulation's Python packages");
    line.trim_end_matches(')')
        .split(' ')
        .map(str::to_owned)
        .collect()
}

/// The pinned ruff of scripts/check-iron.sh.
fn pinned_ruff() -> String {
    let text =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check-iron.sh"))
            .unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RUFF="))
        .expect("check-iron.sh pins ruff");
    line.to_owned()
}

#[test]
fn stock_debian_gets_every_package_including_libclang_dev() {
    // A stock Debian 12 with Rust and Python 3: libclang-cpp14 is there, libclang-dev is not.
    let m = FakeMachine::new("stock", &["libclang-cpp14", "python3"], true);
    let (ok, err) = m.run("scripts/test.sh", &["--deps"], &[]);
    assert!(ok, "test.sh --deps failed:\n{err}");
    assert_eq!(m.requested_apt(), set(ALL_APT), "stderr:\n{err}");
    let r = m.requested();
    assert!(
        r.contains("rustup rustfmt") && r.contains("rustup clippy"),
        "{r:?}"
    );
    assert!(r.contains(&format!("pip {}", pinned_ruff())), "{r:?}");
    for p in pinned_emu_python() {
        assert!(r.contains(&format!("pip {p}")), "{p}: {r:?}");
    }
}

#[test]
fn each_script_asks_for_what_its_next_steps_run() {
    let cases: &[(&str, &[&str], &[&str])] = &[
        (
            "scripts/llama-cpp.sh",
            &["deps"],
            &[
                "cmake",
                "ninja-build",
                "g++",
                "ccache",
                "libclang-dev",
                "python3-pip",
            ],
        ),
        (
            "scripts/models.sh",
            &["deps"],
            &[
                "cmake",
                "ninja-build",
                "g++",
                "ccache",
                "libclang-dev",
                "python3-pip",
                "python3-venv",
            ],
        ),
        (
            "scripts/check-iron.sh",
            &["--deps"],
            &["g++", "python3-pip"],
        ),
        (
            "scripts/main.sh",
            &["--deps"],
            &[
                "cmake",
                "ninja-build",
                "g++",
                "ccache",
                "libclang-dev",
                "python3-pip",
                "python3-venv",
            ],
        ),
    ];
    for (script, args, want) in cases {
        let m = FakeMachine::new("each", &["libclang-cpp14", "python3"], true);
        let (ok, err) = m.run(script, args, &[]);
        assert!(ok, "{script} {args:?} failed:\n{err}");
        assert_eq!(m.requested_apt(), set(want), "{script}; stderr:\n{err}");
    }
    // The main job runs the tiny llama through the IRON emulation: numpy and ml_dtypes too.
    let m = FakeMachine::new("main-emu", &["libclang-cpp14", "python3"], true);
    let (ok, err) = m.run("scripts/main.sh", &["--deps"], &[]);
    assert!(ok, "{err}");
    for p in pinned_emu_python() {
        assert!(m.requested().contains(&format!("pip {p}")), "{p}: {err}");
    }
}

#[test]
fn every_package_is_requested_when_it_alone_is_missing() {
    let ruff = format!("pip:{}", pinned_ruff());
    for missing in ALL_APT {
        let mut installed: Vec<&str> = ALL_APT.iter().copied().filter(|p| p != missing).collect();
        installed.extend(["libclang-cpp14", "rustup:rustfmt", "rustup:clippy", &ruff]);
        let m = FakeMachine::new("one-missing", &installed, true);
        let (ok, err) = m.run("scripts/test.sh", &["--deps"], &[]);
        assert!(ok, "without {missing}: test.sh --deps failed:\n{err}");
        assert_eq!(
            m.requested_apt(),
            set(&[missing]),
            "without {missing}; stderr:\n{err}"
        );
    }
}

#[test]
fn a_complete_machine_installs_nothing() {
    let ruff = format!("pip:{}", pinned_ruff());
    let emu: Vec<String> = pinned_emu_python()
        .iter()
        .map(|p| format!("pip:{p}"))
        .collect();
    let mut installed = ALL_APT.to_vec();
    installed.extend(["rustup:rustfmt", "rustup:clippy", &ruff]);
    installed.extend(emu.iter().map(String::as_str));
    let m = FakeMachine::new("complete", &installed, true);
    let (ok, err) = m.run("scripts/test.sh", &["--deps"], &[]);
    assert!(ok, "{err}");
    assert_eq!(m.requested(), BTreeSet::new(), "stderr:\n{err}");
}

/// `scripts/llama-cpp.sh deps` on a fake machine with pip whose `llvm/lib` holds `files`
/// (empty), with LIBCLANG_PATH naming that directory: the machine, the lib dir, and the run's
/// success and stderr.
fn llama_deps_with_libclang_dir(
    name: &str,
    files: &[&str],
) -> (FakeMachine, PathBuf, bool, String) {
    let m = FakeMachine::new(name, &["python3-pip"], true);
    let lib = m.dir.join("llvm/lib");
    fs::create_dir_all(&lib).unwrap();
    for f in files {
        fs::write(lib.join(f), b"").unwrap();
    }
    let (ok, err) = m.run(
        "scripts/llama-cpp.sh",
        &["deps"],
        &[("LIBCLANG_PATH", lib.to_str().unwrap())],
    );
    (m, lib, ok, err)
}

#[test]
fn libclang_path_replaces_libclang_dev_only_when_it_holds_a_loadable_libclang() {
    // What bindgen's loader (clang-sys) opens under LIBCLANG_PATH: the file itself, or in a
    // directory libclang.so, libclang-N.so, libclang.so.N or libclang-N.so.N, never libclang-cpp.
    let loadable: &[&[&str]] = &[&["libclang.so"], &["libclang-14.so.1"], &["libclang.so.14"]];
    for files in loadable {
        let (m, lib, ok, err) = llama_deps_with_libclang_dir("libclang-path", files);
        assert!(ok, "{files:?}: {err}");
        assert_eq!(
            m.requested_apt(),
            set(&["cmake", "ninja-build", "g++", "ccache"]),
            "{files:?}"
        );
        // The file itself serves as well as its directory.
        let file = lib.join(files[0]);
        let m2 = FakeMachine::new("libclang-path-file", &["python3-pip"], true);
        let (ok, err) = m2.run(
            "scripts/llama-cpp.sh",
            &["deps"],
            &[("LIBCLANG_PATH", file.to_str().unwrap())],
        );
        assert!(ok, "{file:?}: {err}");
    }

    // A path that exists but holds nothing bindgen loads (empty, or only libclang-cpp as on a
    // stock Debian) fails the setup with the reason, before the build script would.
    let unloadable: &[&[&str]] = &[&[], &["libclang-cpp.so.14"], &["libclang-cpp.so"]];
    for files in unloadable {
        let (m, _, ok, err) = llama_deps_with_libclang_dir("libclang-path-unloadable", files);
        assert!(!ok, "{files:?} accepted:\n{err}");
        assert!(
            err.contains("holds no libclang that bindgen can load"),
            "{files:?}: {err}"
        );
        assert_eq!(m.requested_apt(), BTreeSet::new());
    }

    let m = FakeMachine::new("libclang-path-missing", &["python3-pip"], true);
    let (ok, err) = m.run(
        "scripts/llama-cpp.sh",
        &["deps"],
        &[("LIBCLANG_PATH", "/nonexistent/llvm/lib")],
    );
    assert!(!ok);
    assert!(
        err.contains("LIBCLANG_PATH=/nonexistent/llvm/lib holds no libclang"),
        "{err}"
    );
    assert_eq!(m.requested_apt(), BTreeSet::new());
}

#[test]
fn every_python_package_is_requested_when_it_alone_is_missing_or_too_old() {
    let ruff = format!("pip:{}", pinned_ruff());
    let emu: Vec<String> = pinned_emu_python()
        .iter()
        .map(|p| format!("pip:{p}"))
        .collect();
    let numpy = emu.iter().find(|p| p.starts_with("pip:numpy==")).unwrap();
    let ml_dtypes = emu
        .iter()
        .find(|p| p.starts_with("pip:ml_dtypes=="))
        .unwrap();
    // (what is installed besides the apt packages, the pip packages that must be requested)
    let cases: Vec<(Vec<&str>, Vec<String>)> = vec![
        // ruff missing, or another version than check-iron.sh pins
        (
            vec![numpy, ml_dtypes],
            vec![format!("pip {}", pinned_ruff())],
        ),
        (
            vec![numpy, ml_dtypes, "pip:ruff==0.0.1"],
            vec![format!("pip {}", pinned_ruff())],
        ),
        // ml_dtypes missing, or an installed numpy 1.x: the pinned pair is installed
        (
            vec![&ruff, numpy],
            pinned_emu_python()
                .iter()
                .map(|p| format!("pip {p}"))
                .collect(),
        ),
        (
            vec![&ruff, ml_dtypes, "pip:numpy==1.26.4"],
            pinned_emu_python()
                .iter()
                .map(|p| format!("pip {p}"))
                .collect(),
        ),
    ];
    for (extra, want) in cases {
        let mut installed = ALL_APT.to_vec();
        installed.extend(["rustup:rustfmt", "rustup:clippy"]);
        installed.extend(extra.iter().copied());
        let m = FakeMachine::new("pip-missing", &installed, true);
        let (ok, err) = m.run("scripts/test.sh", &["--deps"], &[]);
        assert!(ok, "{extra:?}: {err}");
        let want: BTreeSet<String> = want.into_iter().collect();
        assert_eq!(m.requested(), want, "with {extra:?}; stderr:\n{err}");
    }
}

#[test]
fn without_dpkg_the_packages_are_named_not_guessed() {
    let m = FakeMachine::new("no-dpkg", &["python3-pip"], false);
    let (ok, err) = m.run("scripts/llama-cpp.sh", &["deps"], &[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("not a Debian system") && err.contains("libclang-dev"),
        "{err}"
    );
    assert_eq!(m.requested_apt(), BTreeSet::new());
}
