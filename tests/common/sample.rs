//! Which part of a long sweep one test run covers.
//!
//! The long sweeps (test-backend-ops through the emulated IRON designs and the reference
//! executors, test-llama-archs over every architecture) take hours whole. A default run, CI's,
//! takes one turn of a rotation: the items are split into `share` parts by a stable hash of
//! their names and the commit picks the part, so that every item runs in some run over the
//! rotation, and a failure reproduces with the same commit (or `GGML_HSA_TEST_SAMPLE=T/N`).
//! Each stratum (an op with one combination of types: what selects a design) keeps at least one
//! item in every turn. `GGML_HSA_TEST_SAMPLE=all` (scripts/test.sh --long) runs everything.

use ggml_hsa::kernels::desc::fnv1a64;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::test_backend_ops::{op_names_filter, Report};

/// One turn of a rotation, or everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    All,
    Turn { turn: u64, share: u64 },
}

impl Sample {
    /// From `GGML_HSA_TEST_SAMPLE` (`all`, or `T/N`: turn T of N), else the commit's turn of
    /// `default_share`. A malformed value fails the test rather than silently running another
    /// sample.
    pub fn from_env(default_share: u64) -> Sample {
        match std::env::var("GGML_HSA_TEST_SAMPLE").as_deref() {
            Ok("all") => Sample::All,
            Ok(spec) if !spec.is_empty() => {
                let parsed = spec
                    .split_once('/')
                    .and_then(|(t, n)| Some((t.parse::<u64>().ok()?, n.parse::<u64>().ok()?)));
                match parsed {
                    Some((turn, share)) if share > 0 && turn < share => {
                        Sample::Turn { turn, share }
                    }
                    _ => panic!("GGML_HSA_TEST_SAMPLE={spec}: expected `all` or T/N with T < N"),
                }
            }
            _ => Sample::Turn {
                turn: commit_seed() % default_share,
                share: default_share,
            },
        }
    }

    /// Whether the item named `name` is in this turn.
    pub fn takes(&self, name: &str) -> bool {
        match *self {
            Sample::All => true,
            // The kernel names' hash: the same split on every machine and toolchain.
            Sample::Turn { turn, share } => fnv1a64(name.as_bytes()) % share == turn,
        }
    }

    /// The items of this turn, keeping in each stratum (`stratum_of`) at least one item: when
    /// the hash gives a stratum none, its item at position `turn` modulo its size.
    pub fn pick<T: Clone>(
        &self,
        items: &[T],
        name_of: impl Fn(&T) -> String,
        stratum_of: impl Fn(&T) -> String,
    ) -> Vec<T> {
        let turn = match *self {
            Sample::All => return items.to_vec(),
            Sample::Turn { turn, .. } => turn,
        };
        let mut strata: BTreeMap<String, (bool, Vec<usize>)> = BTreeMap::new();
        let mut keep = vec![false; items.len()];
        for (i, item) in items.iter().enumerate() {
            keep[i] = self.takes(&name_of(item));
            let entry = strata.entry(stratum_of(item)).or_default();
            entry.0 |= keep[i];
            entry.1.push(i);
        }
        for (_, (covered, members)) in strata {
            if !covered {
                keep[members[(turn as usize) % members.len()]] = true;
            }
        }
        items
            .iter()
            .zip(keep)
            .filter(|(_, k)| *k)
            .map(|(item, _)| item.clone())
            .collect()
    }

    /// Of a sweep that runs at least `whole` cases whole, how many this sample must run. A turn
    /// takes the cases whose name hashes to it, so its count varies around `whole / share` from
    /// commit to commit (binomially): the bound is that mean less four standard deviations (at
    /// least 1), which a sample misses only when far fewer cases than expected ran (a filter that
    /// matches nothing, a sweep cut short). Fifty cases in eighths: 3 ran at one commit.
    pub fn at_least(&self, whole: u64) -> u64 {
        match *self {
            Sample::All => whole,
            Sample::Turn { share, .. } => {
                let p = 1.0 / share as f64;
                let mean = whole as f64 * p;
                let sd = (whole as f64 * p * (1.0 - p)).sqrt();
                (mean - 4.0 * sd).floor().max(1.0) as u64
            }
        }
    }

    /// One line for a test's output: which sample ran and how to run another.
    pub fn describe(&self) -> String {
        match *self {
            Sample::All => "every case".to_owned(),
            Sample::Turn { turn, share } => format!(
                "turn {turn} of {share} of a rotation chosen by the commit, at least one case per \
                 op and types (GGML_HSA_TEST_SAMPLE=all runs every case, \
                 GGML_HSA_TEST_SAMPLE={turn}/{share} this turn again)"
            ),
        }
    }
}

/// For a test's output line: how many cases a sample named (nothing when it named none: the
/// sweep ran whole).
pub fn named(picked: usize) -> String {
    if picked > 0 {
        format!(" ({picked} cases named)")
    } else {
        String::new()
    }
}

/// The commit being tested, as a number (0 outside a git checkout).
pub fn commit_seed() -> u64 {
    Command::new("git")
        .args(["rev-parse", "--short=15", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| u64::from_str_radix(String::from_utf8_lossy(&o.stdout).trim(), 16).ok())
        .unwrap_or(0)
}

/// Runs `sample` of the cases `ops` and `args` select (`sampled_runs`), one process per piece
/// through `one_process` (given the arguments after `-b HSA0`), as one report; fails when fewer
/// cases were reported than named. Also returns how many were named (0: the sweep ran whole).
pub fn run_sample(
    tag: &str,
    sample: Sample,
    program: &Path,
    ops: &str,
    args: &[&str],
    env: &[(String, String)],
    one_process: impl Fn(&[String]) -> Report,
) -> (Report, usize) {
    let (runs, picked) = sampled_runs(sample, program, ops, args, env);
    let report = Report::combine(runs.iter().map(|a| one_process(a)));
    assert!(
        report.total + report.not_supported >= picked as u64,
        "{tag}: {picked} cases named, {} reported\n{}",
        report.total + report.not_supported,
        report.output
    );
    (report, picked)
}

/// One test-backend-ops case: its op as the program names it and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    pub op: String,
    pub params: String,
}

impl Case {
    /// The full case string test-backend-ops' `-o` matches exactly: `OP(params)`.
    pub fn full_name(&self) -> String {
        format!("{}({})", self.op, self.params)
    }

    /// The op and every type parameter (`type=`, `type_a=`, `type_src=`, ...): what selects a
    /// kernel design.
    pub fn stratum(&self) -> String {
        let types: Vec<&str> = self
            .params
            .split(',')
            .filter(|p| p.starts_with("type"))
            .collect();
        format!("{} {}", self.op, types.join(","))
    }
}

/// The cases test-backend-ops would run for `ops` (its `-o` list of exact op names; empty: every
/// op) and `args` (`-b`, `-p`...) that the device supports, from its `support` mode (which
/// builds no data and computes nothing).
///
/// The op names are matched here, not by `-o`: test-backend-ops compiles a `std::regex` for
/// every case and every `-o` entry that is not the case's op (to tell a plain name from a
/// regex), which for some 90 names over its 20,000 cases took 72 s a listing against 0.5 s
/// for the whole list.
pub fn supported_cases(
    program: &Path,
    ops: &str,
    args: &[&str],
    env: &[(String, String)],
) -> Vec<Case> {
    let wanted: Vec<&str> = ops.split(',').filter(|o| !o.is_empty()).collect();
    for op in &wanted {
        assert!(
            op.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
            "supported_cases: `{op}` is not an op name (the tests name ops exactly)"
        );
    }
    let out = Command::new(program)
        .arg("support")
        .args(args)
        .args(["--output", "csv"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("\"backend_name\",\"op_name\",\"op_params\""),
        "test-backend-ops support printed no CSV header: {header:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lines
        .filter_map(|line| {
            // "backend","op","params","support","<0|1>","<yes|no>",...: params hold no quote.
            let fields: Vec<&str> = line.split("\",\"").collect();
            (fields.len() >= 6 && fields[5] == "yes").then(|| Case {
                op: fields[1].to_owned(),
                params: fields[2].to_owned(),
            })
        })
        .filter(|c| wanted.is_empty() || wanted.contains(&c.op.as_str()))
        .collect()
}

/// `-o` arguments naming `cases` exactly, each under the kernel's per-argument limit (128 KiB):
/// one test-backend-ops process per argument.
pub fn case_filters(cases: &[Case]) -> Vec<String> {
    const LIMIT: usize = 100 * 1024;
    let mut filters: Vec<String> = Vec::new();
    for case in cases {
        let name = case.full_name();
        match filters.last_mut() {
            Some(f) if f.len() + 1 + name.len() <= LIMIT => {
                f.push(',');
                f.push_str(&name);
            }
            _ => filters.push(name),
        }
    }
    filters
}

/// The test-backend-ops processes that run `sample` of the cases `ops` (`-o`) and `args` (`-p
/// REGEX`, `-j N`) select: the arguments of each (`-o` with the cases named
/// exactly) and how many cases they name. Cases are listed by `support` mode with `env`; ops it
/// lists no case of (test-backend-ops' fusion cases, which it builds only when testing) run
/// whole.
pub fn sampled_runs(
    sample: Sample,
    program: &Path,
    ops: &str,
    args: &[&str],
    env: &[(String, String)],
) -> (Vec<Vec<String>>, usize) {
    let with_filter = |o: String| -> Vec<String> {
        let mut all = vec!["-o".to_owned(), o];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        all
    };
    if sample == Sample::All {
        return (vec![with_filter(op_names_filter(ops))], 0);
    }
    let mut list_args = vec!["-b", "HSA0"];
    list_args.extend_from_slice(args);
    let listed = supported_cases(program, ops, &list_args, env);
    let picked = sample.pick(&listed, Case::full_name, Case::stratum);
    // The other arguments stay (`-j N`; a `-p` the named cases all match).
    let mut runs: Vec<Vec<String>> = case_filters(&picked).into_iter().map(with_filter).collect();
    let unlisted: Vec<&str> = ops
        .split(',')
        .filter(|op| !listed.iter().any(|c| c.op == *op))
        .collect();
    if !unlisted.is_empty() {
        runs.push(with_filter(op_names_filter(&unlisted.join(","))));
    }
    (runs, picked.len())
}
