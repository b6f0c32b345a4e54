//! The op catalogue (`src/op_catalogue.toml`, compiled into `ggml_hsa::op_catalogue`) against
//! every other place that lists ops: the simulator's compiler (what hsa-sim executes), the IRON
//! package (what a real NPU can run), and the op table of docs/ops-where.md. An op added to one
//! of them and not to the catalogue, or the other way round, fails here.
//!
//! `GGML_HSA_BLESS=1 cargo test --test op_catalogue` rewrites that table.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ggml_hsa::op_catalogue::{kernels, Runs, CATALOGUE};

/// `ops[]` of a compiler's `capabilities` output: op name -> number of inputs.
fn declared_ops(caps: &serde_json::Value) -> BTreeMap<String, u64> {
    caps["ops"]
        .as_array()
        .expect("capabilities list ops")
        .iter()
        .map(|o| {
            (
                o["op"].as_str().expect("op name").to_owned(),
                o["inputs"].as_u64().expect("inputs"),
            )
        })
        .collect()
}

fn capabilities(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.arg("capabilities").output().expect("the compiler runs");
    assert!(
        out.status.success(),
        "capabilities failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("capabilities print JSON")
}

#[test]
fn the_simulator_executes_exactly_the_catalogue_sim_ops() {
    let caps = capabilities(&mut Command::new(common::sim_artifact("hsa-sim-compile")));
    let want: BTreeMap<String, u64> = kernels()
        .filter(|e| e.sim)
        .map(|e| (e.name.to_owned(), e.inputs as u64))
        .collect();
    assert_eq!(
        declared_ops(&caps),
        want,
        "hsa-sim-compile's ops (left) differ from the catalogue's `sim = true` kernel ops (right)"
    );
}

#[test]
fn the_iron_package_declares_exactly_the_catalogue_iron_ops() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let caps = capabilities(
        Command::new("python3")
            .args(["-m", "ggml_hsa_iron"])
            .env("PYTHONPATH", root.join("src")),
    );
    let want: BTreeMap<String, u64> = kernels()
        .filter(|e| !e.iron.is_empty())
        .map(|e| (e.name.to_owned(), e.inputs as u64))
        .collect();
    assert_eq!(
        declared_ops(&caps),
        want,
        "the IRON package's ops (left) differ from the catalogue's ops with `iron` archs (right)"
    );
    let archs: Vec<&str> = caps["archs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for e in kernels().filter(|e| !e.iron.is_empty()) {
        assert_eq!(e.iron, archs.as_slice(), "{}: archs", e.name);
    }
}

/// The op table of docs/ops-where.md, from the catalogue.
fn op_table() -> String {
    let mut t = String::from(
        "| op | from ggml | on HSA0 in this repository (hsa-sim) | on a real NPU |\n\
         |---|---|---|---|\n",
    );
    for e in CATALOGUE {
        let (sim, npu) = match e.runs {
            Runs::Host => (
                "host: the backend, on the CPU, in place".to_owned(),
                "host: the backend, on the CPU, in place".to_owned(),
            ),
            Runs::KernelOrHost => {
                let host = "otherwise host: the backend, on the CPU, in place";
                let sim = if e.sim {
                    "kernel when the compiler declares the node's types and layouts (simulator \
                     reference executor, and the IRON design emulated with `--target emu`)"
                } else {
                    "kernel when the compiler declares it"
                };
                let npu = match e.iron_source {
                    Some(src) => format!(
                        "kernel: IRON design `{src}` ({}) for what it declares, not yet run on \
                         hardware",
                        e.iron.join(", ")
                    ),
                    None => "no IRON design".to_owned(),
                };
                (format!("{sim}; {host}"), format!("{npu}; {host}"))
            }
            Runs::Kernel => {
                let sim = match (e.sim, e.iron.is_empty()) {
                    (true, false) => {
                        "kernel: simulator reference executor, and the IRON design emulated \
                         (`--target emu`)"
                    }
                    (true, true) => "kernel: simulator reference executor only",
                    (false, false) => "kernel: the IRON design emulated (`--target emu`) only",
                    (false, true) => "not run",
                };
                let npu = match e.iron_source {
                    Some(src) => format!(
                        "kernel: IRON design `{src}` ({}), not yet run on hardware",
                        e.iron.join(", ")
                    ),
                    // A fusion: its ggml op's name, `_`, and the op fused after it
                    // (`MUL_MAT_ADD`, `RMS_NORM_MUL`). Without its kernel the nodes are not
                    // fused and run as their own.
                    None if e
                        .name
                        .strip_prefix(e.ggml)
                        .and_then(|rest| rest.strip_prefix('_'))
                        .is_some_and(|after| CATALOGUE.iter().any(|o| o.name == after)) =>
                    {
                        "no IRON design: not fused, its nodes run as their own kernels".to_owned()
                    }
                    None => "no IRON design: declined, ggml runs it on the CPU".to_owned(),
                };
                (sim.to_owned(), npu)
            }
        };
        t.push_str(&format!(
            "| `{}` | `{}` | {sim} | {npu} |\n",
            e.name, e.ggml
        ));
    }
    t
}

const BEGIN: &str = "<!-- op-catalogue:begin (generated by tests/op_catalogue.rs) -->\n";
const END: &str = "<!-- op-catalogue:end -->";

#[test]
fn the_docs_op_table_is_the_catalogue() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ops-where.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc
        .find(BEGIN)
        .expect("docs/ops-where.md has the op-catalogue begin marker")
        + BEGIN.len();
    let end = doc[start..]
        .find(END)
        .expect("docs/ops-where.md has the end marker")
        + start;
    let want = op_table();
    if doc[start..end] == want {
        return;
    }
    if std::env::var_os("GGML_HSA_BLESS").is_some() {
        let updated = format!("{}{want}{}", &doc[..start], &doc[end..]);
        std::fs::write(&path, updated).unwrap();
        return;
    }
    panic!(
        "the op table of docs/ops-where.md is not the catalogue's; run \
         `GGML_HSA_BLESS=1 cargo test --test op_catalogue` and commit it. Expected:\n{want}"
    );
}
