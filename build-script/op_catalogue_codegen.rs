//! Turns `src/op_catalogue.toml` into `$OUT_DIR/op_catalogue.rs`: the table `CATALOGUE` and
//! one constant per op (`ADD`, `ROPE_FF`, ...) included by `src/op_catalogue.rs`. Every rule
//! the file's header states is checked here, so a malformed catalogue fails the build with the
//! op named.

use serde::Deserialize;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

const ARCHS: &[&str] = &["aie2", "aie2p"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Catalogue {
    op: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    ggml: String,
    inputs: usize,
    params: usize,
    runs: String,
    sim: bool,
    iron: Vec<String>,
    iron_source: Option<String>,
    rows: Option<Vec<String>>,
}

/// The generated Rust source, or what is wrong with the catalogue.
pub fn generate(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let catalogue: Catalogue =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut names = BTreeSet::new();
    let mut table = String::new();
    let mut consts = String::new();
    for (i, e) in catalogue.op.iter().enumerate() {
        let bad = |what: String| format!("{}: op {}: {what}", path.display(), e.name);
        let is_name = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        };
        if !is_name(&e.name) {
            return Err(bad(
                "the name must be upper case letters, digits and _".into()
            ));
        }
        if !names.insert(e.name.clone()) {
            return Err(bad("declared twice".into()));
        }
        let ggml_ok = match e.ggml.split_once(':') {
            Some((kind, sub)) => matches!(kind, "UNARY" | "GLU") && is_name(sub),
            None => is_name(&e.ggml),
        };
        if !ggml_ok {
            return Err(bad(format!(
                "ggml = {:?}: expected OP, UNARY:OP or GLU:OP",
                e.ggml
            )));
        }
        let runs = match e.runs.as_str() {
            "kernel" => "Runs::Kernel",
            "host" => "Runs::Host",
            "kernel_or_host" => "Runs::KernelOrHost",
            other => {
                return Err(bad(format!(
                    "runs = {other:?}: expected kernel, host or kernel_or_host"
                )))
            }
        };
        if e.runs == "host" && (e.sim || !e.iron.is_empty()) {
            return Err(bad(
                "a host op has no simulator executor or IRON design".into()
            ));
        }
        // A kernel takes at most 27 operands, an output among them (`MAX_OPERANDS`,
        // src/backend/stream.rs); hsa-sim's kernel description holds at most 19 op_params words
        // (`image::MAX_OP_PARAMS`: DECODE_LAYER_HEAD_NORM_POST_NORM_<GLU>'s).
        if e.inputs == 0 || e.inputs > 26 || e.params > 19 {
            return Err(bad("inputs must be 1..=26 and params 0..=19".into()));
        }
        if let Some(a) = e.iron.iter().find(|a| !ARCHS.contains(&a.as_str())) {
            return Err(bad(format!("unknown arch {a:?} (expected {ARCHS:?})")));
        }
        match (&e.iron_source, e.iron.is_empty()) {
            (Some(s), false) if s.ends_with(".py") && !s.contains('/') => {}
            (None, true) => {}
            _ => {
                return Err(bad(
                    "iron_source names the design file (x.py) exactly when iron lists archs".into(),
                ))
            }
        }
        let rows = match &e.rows {
            None => String::new(),
            Some(rows) => {
                if rows.len() <= e.inputs || rows.iter().all(|r| r == "-") {
                    return Err(bad(
                        "rows names each input and at least one output, and some dimension".into(),
                    ));
                }
                let mut cells = Vec::new();
                for r in rows {
                    cells.push(match r.as_str() {
                        "-" => "Rows::Whole".to_owned(),
                        "outer" => "Rows::Outer(0)".to_owned(),
                        "outer_row" => "Rows::Outer(1)".to_owned(),
                        "0" | "1" | "2" | "3" => format!("Rows::Dim({r})"),
                        other => {
                            return Err(bad(format!(
                                "rows entry {other:?}: expected \"0\" to \"3\", \"outer\", \"outer_row\" or \"-\""
                            )))
                        }
                    });
                }
                cells.join(", ")
            }
        };
        let iron = e
            .iron
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let source = e
            .iron_source
            .as_ref()
            .map_or("None".into(), |s| format!("Some({s:?})"));
        writeln!(
            table,
            "    OpEntry {{ name: {:?}, ggml: {:?}, inputs: {}, params: {}, runs: {runs}, \
             sim: {}, iron: &[{iron}], iron_source: {source}, rows: &[{rows}] }},",
            e.name, e.ggml, e.inputs, e.params, e.sim
        )
        .unwrap();
        writeln!(
            consts,
            "/// The catalogue's `{}`.\npub const {}: &OpEntry = &CATALOGUE[{i}];",
            e.name, e.name
        )
        .unwrap();
    }
    Ok(format!(
        "/// Every op of `src/op_catalogue.toml`, in its order.\n\
         pub const CATALOGUE: &[OpEntry] = &[\n{table}];\n\n{consts}"
    ))
}
