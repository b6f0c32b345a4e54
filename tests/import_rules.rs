//! The import rules of docs/architecture.md ("Layers and import rules"), checked on the sources:
//! which top-level module of the crate may name which (`crate::m::...`, `crate::{m, ...}`,
//! `super::` chains up to the crate root, and `ggml_hsa::m` in `src/bin/`), where `unsafe` code
//! and `libloading` may appear. Comments and string literals are not code and are skipped.
//!
//! A rule changes with the page: edit both together.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// What a module may import: another top-level module, whole or only some of its submodules.
struct Allow {
    module: &'static str,
    /// `None`: anything of `module`; `Some(subs)`: only `module::sub` for these subs.
    only: Option<&'static [&'static str]>,
}

const fn all(module: &'static str) -> Allow {
    Allow { module, only: None }
}

const fn some(module: &'static str, only: &'static [&'static str]) -> Allow {
    Allow {
        module,
        only: Some(only),
    }
}

/// The table of docs/architecture.md, section 2. `bin` is `src/bin/` (through `ggml_hsa::`).
const RULES: &[(&str, &[Allow])] = &[
    (
        "ffi",
        &[
            all("backend"),
            all("ops"),
            some("hsa", &["memory"]),
            all("config"),
            all("log"),
        ],
    ),
    (
        "backend",
        &[
            all("ops"),
            all("kernels"),
            all("hsa"),
            all("config"),
            all("log"),
        ],
    ),
    ("ops", &[all("kernels"), all("op_catalogue")]),
    ("kernels", &[all("op_catalogue"), all("log")]),
    ("hsa", &[]),
    ("config", &[some("hsa", &["packet"]), all("kernels")]),
    ("log", &[all("config")]),
    ("op_catalogue", &[]),
    (
        "bin",
        &[
            all("config"),
            all("kernels"),
            all("log"),
            all("op_catalogue"),
        ],
    ),
];

/// The directories (under `src/`) whose files may contain `unsafe` code, and name `libloading`.
const UNSAFE_IN: &[&str] = &["ffi", "hsa"];
const LIBLOADING_IN: &[&str] = &["ffi", "hsa"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The source with comments, string literals and character literals blanked out (newlines
/// kept, so positions still give line numbers).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        // Line comment.
        if at(0) == '/' && at(1) == '/' {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
            continue;
        }
        // Block comment (nested).
        if at(0) == '/' && at(1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            continue;
        }
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        // Raw strings: r"..", r#".."#, br#".."#.
        if !ident_before && (at(0) == 'r' || (at(0) == 'b' && at(1) == 'r')) {
            let start = if at(0) == 'b' { 2 } else { 1 };
            let mut k = start;
            while at(k) == '#' {
                k += 1;
            }
            if at(k) == '"' {
                let hashes = k - start;
                out.push_str(&" ".repeat(k + 1));
                i += k + 1;
                while i < c.len() {
                    if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                        out.push_str(&" ".repeat(hashes + 1));
                        i += hashes + 1;
                        break;
                    }
                    blank(&mut out, c[i]);
                    i += 1;
                }
                continue;
            }
        }
        // Strings (and byte strings: the `b` stays, harmless).
        if at(0) == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
            continue;
        }
        // Character literals ('x', '\n', '\u{..}'); a lifetime ('a) is left as it is.
        if at(0) == '\'' {
            let end = if at(1) == '\\' {
                (3..12).find(|&k| at(k) == '\'')
            } else if at(2) == '\'' {
                Some(2)
            } else {
                None
            };
            if let Some(end) = end {
                out.push_str(&" ".repeat(end + 1));
                i += end + 1;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
    PathSep,
}

/// Identifiers, `::` and single punctuation characters, each with its line.
fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

/// A reference from a file to a top-level module: (line, module, the name after it).
type Reference = (usize, String, Option<String>);

/// After a path prefix naming the crate root at `toks[i]` (`crate`, `ggml_hsa`, or the last
/// `super` of a chain reaching it): the modules named, `crate::m::x` or `crate::{m, n::x}`.
fn named_after(toks: &[(Tok, usize)], i: usize, out: &mut Vec<Reference>) {
    let line = toks[i].1;
    if toks.get(i + 1).map(|t| &t.0) != Some(&Tok::PathSep) {
        return;
    }
    if let Some(m) = ident(toks.get(i + 2)) {
        let sub = match toks.get(i + 3).map(|t| &t.0) {
            Some(Tok::PathSep) => ident(toks.get(i + 4)).map(str::to_owned),
            _ => None,
        };
        out.push((line, m.to_owned(), sub));
        return;
    }
    // `crate::{a, b::c, d::{e, f}}`: the first identifier of each item at depth 1.
    if toks.get(i + 2).map(|t| &t.0) != Some(&Tok::Punct('{')) {
        return;
    }
    let mut depth = 0;
    let mut expect_item = true;
    let mut k = i + 2;
    while k < toks.len() {
        match &toks[k].0 {
            Tok::Punct('{') => {
                depth += 1;
                if depth == 1 {
                    expect_item = true;
                }
            }
            Tok::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Punct(',') if depth == 1 => expect_item = true,
            Tok::Ident(m) if depth == 1 && expect_item => {
                expect_item = false;
                let sub = match toks.get(k + 1).map(|t| &t.0) {
                    Some(Tok::PathSep) => ident(toks.get(k + 2)).map(str::to_owned),
                    _ => None,
                };
                // `self` names the crate root itself.
                if m != "self" {
                    out.push((toks[k].1, m.clone(), sub));
                }
            }
            _ => {}
        }
        k += 1;
    }
}

/// Every reference of a file to a top-level module. `depth`: how many `super`s reach the crate
/// root from the file's own module (1 for `src/x.rs` and `src/x/mod.rs`, 2 for `src/x/y.rs`).
fn references(code: &str, depth: usize, root: &str) -> Vec<Reference> {
    let toks = tokens(code);
    let mut out = Vec::new();
    // Inline `mod name { ... }` blocks open at this point: each adds one `super`.
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut braces = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => braces += 1,
            Tok::Punct('}') => {
                braces = braces.saturating_sub(1);
                if inline_mods.last() == Some(&braces) {
                    inline_mods.pop();
                }
            }
            Tok::Ident(w)
                if w == "mod"
                    && ident(toks.get(i + 1)).is_some()
                    && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct('{')) =>
            {
                inline_mods.push(braces);
            }
            Tok::Ident(w) if w == root => {
                let after_sep = i > 0 && toks[i - 1].0 == Tok::PathSep;
                if !after_sep {
                    named_after(&toks, i, &mut out);
                }
            }
            Tok::Ident(w) if w == "super" && root == "crate" => {
                let after_sep = i > 0 && toks[i - 1].0 == Tok::PathSep;
                if !after_sep {
                    let mut n = 1;
                    let mut k = i;
                    while toks.get(k + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                        && ident(toks.get(k + 2)) == Some("super")
                    {
                        n += 1;
                        k += 2;
                    }
                    if n >= depth + inline_mods.len() {
                        named_after(&toks, k, &mut out);
                    }
                    i = k;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// A file's top-level module (`ffi` for `src/ffi/x.rs`, `config` for `src/config.rs`, `bin`
/// for `src/bin/`, `lib` for `src/lib.rs`) and its depth below the crate root.
fn module_of(rel: &Path) -> (String, usize) {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let top = parts[0].trim_end_matches(".rs").to_owned();
    let last_is_mod = parts.last().is_some_and(|p| p == "mod.rs");
    let depth = parts.len() - usize::from(last_is_mod && parts.len() > 1);
    (top, depth)
}

fn word_at(code: &str, word: &str) -> Option<usize> {
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    code.match_indices(word).find_map(|(at, _)| {
        let before = at.checked_sub(1).map(|k| bytes[k]);
        let after = bytes.get(at + word.len()).copied();
        (!before.is_some_and(is_ident) && !after.is_some_and(is_ident))
            .then(|| code[..at].matches('\n').count() + 1)
    })
}

#[test]
fn the_code_follows_the_import_rules() {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 20,
        "found only {} files under src/",
        files.len()
    );

    let lib = fs::read_to_string(src.join("lib.rs")).unwrap();
    let declared: BTreeSet<String> = tokens(&code_only(&lib))
        .windows(2)
        .filter_map(|w| match (&w[0].0, &w[1].0) {
            (Tok::Ident(m), Tok::Ident(name)) if m == "mod" => Some(name.clone()),
            _ => None,
        })
        .collect();
    let ruled: BTreeSet<String> = RULES.iter().map(|(m, _)| (*m).to_owned()).collect();
    for m in &declared {
        assert!(
            ruled.contains(m),
            "src/lib.rs declares module `{m}`, which has no import rule: add it to \
             tests/import_rules.rs and to docs/architecture.md"
        );
    }

    let mut broken = Vec::new();
    let mut seen = 0;
    for path in &files {
        let rel = path.strip_prefix(&src).unwrap();
        let (module, depth) = module_of(rel);
        if module == "lib" {
            continue;
        }
        let Some((_, allowed)) = RULES.iter().find(|(m, _)| *m == module) else {
            broken.push(format!(
                "src/{}: module `{module}` has no rule",
                rel.display()
            ));
            continue;
        };
        let code = code_only(&fs::read_to_string(path).unwrap());
        let root = if module == "bin" { "ggml_hsa" } else { "crate" };
        for (line, target, sub) in references(&code, depth, root) {
            if target == module || !declared.contains(&target) {
                continue;
            }
            seen += 1;
            let ok = allowed.iter().any(|a| {
                a.module == target
                    && a.only
                        .is_none_or(|subs| sub.as_deref().is_some_and(|s| subs.contains(&s)))
            });
            if !ok {
                let named = match &sub {
                    Some(s) => format!("{target}::{s}"),
                    None => target.clone(),
                };
                broken.push(format!(
                    "src/{}:{line}: `{module}` may not import `{named}`",
                    rel.display()
                ));
            }
        }
        if !UNSAFE_IN.contains(&module.as_str()) {
            if let Some(line) = word_at(&code, "unsafe") {
                broken.push(format!(
                    "src/{}:{line}: unsafe code outside {UNSAFE_IN:?}",
                    rel.display()
                ));
            }
        }
        if !LIBLOADING_IN.contains(&module.as_str()) {
            if let Some(line) = word_at(&code, "libloading") {
                broken.push(format!(
                    "src/{}:{line}: libloading outside {LIBLOADING_IN:?}",
                    rel.display()
                ));
            }
        }
    }
    // About a hundred today: finding none would mean the reader is broken, not the rules kept.
    assert!(seen > 40, "only {seen} references between modules found");
    assert!(
        broken.is_empty(),
        "the import rules of docs/architecture.md, section 2, are broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_what_it_must() {
    let code = code_only(
        "use crate::hsa::queue::Queue; // crate::ffi in a comment\n\
         let s = \"crate::backend\"; let c = '\"';\n\
         use crate::{config, kernels::desc::{A, B}};\n\
         mod tests { fn f() { super::super::ops::plan(); } }\n\
         /* crate::log /* nested */ crate::log */ let r = r#\"crate::log\"#;\n\
         fn g<'a>(x: &'a str) {}\n",
    );
    let refs = references(&code, 1, "crate");
    let named: Vec<(usize, &str, Option<&str>)> = refs
        .iter()
        .map(|(l, m, s)| (*l, m.as_str(), s.as_deref()))
        .collect();
    assert_eq!(
        named,
        [
            (1, "hsa", Some("queue")),
            (3, "config", None),
            (3, "kernels", Some("desc")),
            (4, "ops", Some("plan")),
        ]
    );
    assert_eq!(word_at("#![deny(unsafe_op_in_unsafe_fn)]", "unsafe"), None);
    assert_eq!(word_at("x\nunsafe { }", "unsafe"), Some(2));
    assert_eq!(module_of(Path::new("hsa/packet/a1.rs")), ("hsa".into(), 3));
    assert_eq!(module_of(Path::new("hsa/mod.rs")), ("hsa".into(), 1));
    assert_eq!(module_of(Path::new("config.rs")), ("config".into(), 1));
}
