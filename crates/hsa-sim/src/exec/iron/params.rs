//! Run-time parameters of an image-version-2 program (docs/kernel-compiler-protocol.md,
//! "Version 2"): scalars the runtime sequence takes (an attention's KV length), so that one
//! compiled design serves every value.
//!
//! A parametric program is a template: top-level `params` (the sequence's scalar arguments,
//! whose values the instruction stream carries) and `rtps` (run-time-parameter buffers, int32
//! words in a compute tile's memory), `rtp` sequence ops writing those words, and expressions
//! in place of integers: `{"param": p, "mul": m, "div": d, "add": a}` in the sequence (tap
//! offsets, sizes and strides, rtp values) and `{"rtp": [b, i]}` in worker bodies (loop counts,
//! i32 call arguments), the word a core reads as mlir-aie's RTPs let it.
//!
//! A template is instantiated by substitution: every expression is replaced by its value and
//! `params`, `rtps` and the rtp ops are removed, which leaves a concrete [`Program`] that
//! [`Program::check`], the scheduler and the timing model take as they take any other. Every
//! structural rule of the template (expressions only where they may be, an rtp word read only
//! on its own tile and only if the sequence writes it) is checked once by [`Template::parse`],
//! so a malformed program fails when its image loads, not at some value.

use super::program::Program;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashSet;

/// One scalar of the runtime sequence: its values are `min..=max` in steps of `step`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ParamDef {
    pub name: String,
    pub min: u64,
    pub max: u64,
    pub step: u64,
}

/// A run-time-parameter buffer: `words` int32 words in the memory of compute tile `tile`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RtpDef {
    pub id: usize,
    pub tile: [u32; 2],
    pub words: u32,
}

/// Largest RTP buffer, in words (mlir-aie's RTP buffers are a few words; this bounds the
/// bookkeeping of a malformed one).
pub const MAX_RTP_WORDS: u32 = 64;

fn one() -> i64 {
    1
}

/// `(value of param × mul) / div + add`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamExpr {
    param: usize,
    #[serde(default = "one")]
    mul: i64,
    #[serde(default = "one")]
    div: i64,
    #[serde(default)]
    add: i64,
}

/// `{"rtp": [buffer, word]}`: the word the sequence writes.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RtpRef {
    rtp: [usize; 2],
}

/// `{"op": "rtp", "buffer": b, "index": i, "value": V}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RtpOp {
    #[allow(dead_code)] // the tag ("rtp"), declared so that deny_unknown_fields admits it
    op: String,
    buffer: usize,
    index: usize,
    value: Value,
}

#[derive(Clone, Copy, Debug)]
enum WordValue {
    Const(i32),
    Param(ParamExpr),
}

#[derive(Clone, Debug)]
struct RtpWrite {
    word: (usize, usize),
    value: WordValue,
    place: String,
}

#[derive(Clone, Copy, Debug)]
enum SlotExpr {
    /// A tap's offset, size or stride: a u64.
    Tap(ParamExpr),
    /// A loop count: the word, which must not be negative.
    Count((usize, usize)),
    /// An i32 call argument: the word.
    I32((usize, usize)),
}

/// One expression of the template: where it is (a JSON pointer into the program without its
/// rtp ops), how errors name it, and what it is.
#[derive(Clone, Debug)]
struct Slot {
    pointer: String,
    place: String,
    expr: SlotExpr,
}

/// A program with run-time parameters, ready to be instantiated at values.
#[derive(Clone, Debug)]
pub struct Template {
    name: String,
    params: Vec<ParamDef>,
    rtps: Vec<RtpDef>,
    /// The program JSON without `params`, `rtps` and the rtp ops; expressions still in place.
    body: Value,
    writes: Vec<RtpWrite>,
    slots: Vec<Slot>,
}

const WHERE_EXPRESSIONS: &str = "expressions may only be a sequence tap's offset, sizes and \
                                 strides, an rtp op's value, a worker loop's count or an i32 \
                                 call argument";

/// Checks `values` (the instruction stream's words after the 8th) against `params`: one per
/// param, each in its range and a multiple of its step.
pub fn check_values(kernel: &str, params: &[ParamDef], values: &[u32]) -> Result<(), String> {
    if values.len() != params.len() {
        let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
        return Err(if params.is_empty() {
            format!(
                "kernel {kernel} takes no run-time parameters, the instruction stream carries {} \
                 value(s)",
                values.len()
            )
        } else {
            format!(
                "kernel {kernel} takes {} run-time parameter(s) ({}), the instruction stream \
                 carries {} value(s)",
                params.len(),
                names.join(", "),
                values.len()
            )
        });
    }
    for (p, &v) in params.iter().zip(values) {
        let v = v as u64;
        if v < p.min || v > p.max || !v.is_multiple_of(p.step) {
            return Err(format!(
                "kernel {kernel}: run-time parameter {} = {v} is not one of {} to {} in steps \
                 of {}",
                p.name, p.min, p.max, p.step
            ));
        }
    }
    Ok(())
}

impl Template {
    /// Reads the program JSON's parameters. `Ok(None)`: the program has none of the
    /// additions (no `params`, `rtps`, rtp ops or expressions; or it is not even an object),
    /// so it is a [`Program`] as it stands and [`Program::parse`] reads it.
    pub fn parse(text: &str) -> Result<Option<Template>, String> {
        let mut v: Value = serde_json::from_str(text).map_err(|e| format!("program JSON: {e}"))?;
        let Some(obj) = v.as_object_mut() else {
            return Ok(None);
        };
        let had_params = obj.contains_key("params");
        let had_rtps = obj.contains_key("rtps");
        let params: Vec<ParamDef> = match obj.remove("params") {
            Some(p) => {
                serde_json::from_value(p).map_err(|e| format!("program JSON: params: {e}"))?
            }
            None => Vec::new(),
        };
        let rtps: Vec<RtpDef> = match obj.remove("rtps") {
            Some(r) => serde_json::from_value(r).map_err(|e| format!("program JSON: rtps: {e}"))?,
            None => Vec::new(),
        };
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let mut t = Template {
            name,
            params,
            rtps,
            body: Value::Null,
            writes: Vec::new(),
            slots: Vec::new(),
        };
        t.check_defs()?;
        if let Some(seq) = obj.get_mut("sequence") {
            t.read_sequence(seq)?;
        }
        for (k, x) in obj.iter() {
            match k.as_str() {
                "sequence" => {}
                "workers" => t.read_workers(x)?,
                _ => forbid(x, &mut vec![k.clone()])?,
            }
        }
        if !had_params && !had_rtps && t.writes.is_empty() && t.slots.is_empty() {
            return Ok(None);
        }
        t.body = v;
        Ok(Some(t))
    }

    pub fn params(&self) -> &[ParamDef] {
        &self.params
    }

    pub fn rtps(&self) -> &[RtpDef] {
        &self.rtps
    }

    /// Every param at its minimum.
    pub fn min_values(&self) -> Vec<u32> {
        self.params.iter().map(|p| p.min as u32).collect()
    }

    /// Every param at its maximum.
    pub fn max_values(&self) -> Vec<u32> {
        self.params.iter().map(|p| p.max as u32).collect()
    }

    /// The concrete program at `values` (one per param, in order), checked.
    pub fn instantiate(&self, values: &[u32]) -> Result<Program, String> {
        check_values(&self.name, &self.params, values)?;
        self.substitute(values).map_err(|e| {
            if self.params.is_empty() {
                e
            } else {
                let at: Vec<String> = self
                    .params
                    .iter()
                    .zip(values)
                    .map(|(p, v)| format!("{} = {v}", p.name))
                    .collect();
                format!("{e} (at {})", at.join(", "))
            }
        })
    }

    fn substitute(&self, values: &[u32]) -> Result<Program, String> {
        let mut words = std::collections::HashMap::new();
        for w in &self.writes {
            let x = match w.value {
                WordValue::Const(c) => c,
                WordValue::Param(e) => {
                    let r = self.eval(&e, values, &w.place)?;
                    i32::try_from(r).ok().filter(|&r| r >= 0).ok_or_else(|| {
                        format!(
                            "{}: {} is {r}, not a non-negative int32",
                            w.place,
                            self.show(&e, values)
                        )
                    })?
                }
            };
            words.insert(w.word, x);
        }
        let word = |s: &Slot, w: (usize, usize)| {
            words.get(&w).copied().ok_or_else(|| {
                // Parse checked that the sequence writes every word a worker reads.
                format!("{}: rtp word [{}, {}] is not written", s.place, w.0, w.1)
            })
        };
        let mut body = self.body.clone();
        for s in &self.slots {
            let n: Value = match s.expr {
                SlotExpr::Tap(e) => {
                    let r = self.eval(&e, values, &s.place)?;
                    u64::try_from(r).map(Value::from).map_err(|_| {
                        format!(
                            "{}: {} is {r}, not a non-negative 64-bit integer",
                            s.place,
                            self.show(&e, values)
                        )
                    })?
                }
                SlotExpr::Count(w) => {
                    let x = word(s, w)?;
                    if x < 0 {
                        return Err(format!(
                            "{}: loop count from rtp word [{}, {}] is {x}, below 0",
                            s.place, w.0, w.1
                        ));
                    }
                    Value::from(x)
                }
                SlotExpr::I32(w) => Value::from(word(s, w)?),
            };
            *body
                .pointer_mut(&s.pointer)
                .ok_or_else(|| format!("{}: not found in the program", s.place))? = n;
        }
        let p: Program = serde_json::from_value(body).map_err(|e| format!("program JSON: {e}"))?;
        p.check()?;
        Ok(p)
    }

    fn eval(&self, e: &ParamExpr, values: &[u32], place: &str) -> Result<i128, String> {
        let num = values[e.param] as i128 * e.mul as i128;
        let div = e.div as i128;
        if num % div != 0 {
            return Err(format!(
                "{place}: {} is not an integer (inexact division)",
                self.show(e, values)
            ));
        }
        Ok(num / div + e.add as i128)
    }

    fn show(&self, e: &ParamExpr, values: &[u32]) -> String {
        format!(
            "({} = {}) * {} / {} + {}",
            self.params[e.param].name, values[e.param], e.mul, e.div, e.add
        )
    }

    fn check_defs(&self) -> Result<(), String> {
        let mut names = HashSet::new();
        for (k, p) in self.params.iter().enumerate() {
            // Values travel as u32 stream words.
            let ok = !p.name.is_empty()
                && p.min >= 1
                && p.min <= p.max
                && p.max <= u32::MAX as u64
                && p.step >= 1
                && p.min.is_multiple_of(p.step)
                && p.max.is_multiple_of(p.step);
            if !ok {
                return Err(format!(
                    "param {k} ({:?}): needs 1 <= min <= max < 2^32, step >= 1, and min and max \
                     multiples of step (min {}, max {}, step {})",
                    p.name, p.min, p.max, p.step
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(format!("param {k}: name {:?} used twice", p.name));
            }
        }
        for (b, r) in self.rtps.iter().enumerate() {
            if r.id != b {
                return Err(format!("rtp buffer {b}: id {} at position {b}", r.id));
            }
            if r.tile[1] < 2 {
                return Err(format!(
                    "rtp buffer {b}: tile {:?} is not a compute tile (row >= 2)",
                    r.tile
                ));
            }
            if !(1..=MAX_RTP_WORDS).contains(&r.words) {
                return Err(format!(
                    "rtp buffer {b}: {} words (1 to {MAX_RTP_WORDS})",
                    r.words
                ));
            }
        }
        Ok(())
    }

    fn param_expr(&self, x: &Value, place: &str) -> Result<ParamExpr, String> {
        if x.get("rtp").is_some() {
            return Err(format!(
                "{place}: only a worker reads rtp words; the sequence's expressions are \
                 {{\"param\": p, \"mul\": m, \"div\": d, \"add\": a}}"
            ));
        }
        let e: ParamExpr = serde_json::from_value(x.clone())
            .map_err(|e| format!("{place}: malformed expression: {e}"))?;
        if e.param >= self.params.len() {
            return Err(format!("{place}: param {} does not exist", e.param));
        }
        if e.div == 0 {
            return Err(format!("{place}: division by 0"));
        }
        Ok(e)
    }

    /// Takes the rtp ops out of the sequence and notes the taps' expressions.
    fn read_sequence(&mut self, seq: &mut Value) -> Result<(), String> {
        let Some(ops) = seq.as_array_mut() else {
            return forbid(seq, &mut vec!["sequence".into()]);
        };
        let is_rtp = |op: &Value| op.get("op").and_then(Value::as_str) == Some("rtp");
        let n_rtp = ops.iter().take_while(|op| is_rtp(op)).count();
        if let Some(k) = ops[n_rtp..].iter().position(is_rtp) {
            return Err(format!(
                "sequence op {}: an rtp write after the first task or await (the sequence \
                 writes run-time parameters before it starts the DMA tasks)",
                n_rtp + k
            ));
        }
        let mut written = HashSet::new();
        for (k, op) in ops.drain(..n_rtp).enumerate() {
            let place = format!("sequence op {k} (rtp)");
            let r: RtpOp =
                serde_json::from_value(op).map_err(|e| format!("{place}: malformed: {e}"))?;
            let words = self
                .rtps
                .get(r.buffer)
                .ok_or_else(|| format!("{place}: rtp buffer {} does not exist", r.buffer))?
                .words;
            if r.index >= words as usize {
                return Err(format!(
                    "{place}: word {} of rtp buffer {} ({words} words)",
                    r.index, r.buffer
                ));
            }
            if !written.insert((r.buffer, r.index)) {
                return Err(format!(
                    "{place}: rtp word [{}, {}] written twice",
                    r.buffer, r.index
                ));
            }
            let value = match &r.value {
                Value::Object(_) => WordValue::Param(self.param_expr(&r.value, &place)?),
                x => WordValue::Const(
                    x.as_i64()
                        .and_then(|c| i32::try_from(c).ok())
                        .ok_or_else(|| format!("{place}: value {x} is not an int32"))?,
                ),
            };
            self.writes.push(RtpWrite {
                word: (r.buffer, r.index),
                value,
                place,
            });
        }
        for (j, op) in ops.iter().enumerate() {
            let k = n_rtp + j;
            let Some(m) = op.as_object() else {
                forbid(op, &mut vec!["sequence".into(), k.to_string()])?;
                continue;
            };
            let dma = matches!(
                m.get("op").and_then(Value::as_str),
                Some("fill") | Some("drain")
            );
            for (f, x) in m {
                if dma && f == "tap" {
                    self.read_tap(x, k, j)?;
                } else {
                    forbid(x, &mut vec!["sequence".into(), k.to_string(), f.clone()])?;
                }
            }
        }
        Ok(())
    }

    /// The tap of sequence op `k` (at position `j` once the rtp ops are gone).
    fn read_tap(&mut self, tap: &Value, k: usize, j: usize) -> Result<(), String> {
        let Some(m) = tap.as_object() else {
            return forbid(
                tap,
                &mut vec!["sequence".into(), k.to_string(), "tap".into()],
            );
        };
        for (f, x) in m {
            let mut slot = |x: &Value, pointer: String, place: String| -> Result<(), String> {
                if x.is_object() {
                    let e = self.param_expr(x, &place)?;
                    self.slots.push(Slot {
                        pointer,
                        place,
                        expr: SlotExpr::Tap(e),
                    });
                }
                Ok(())
            };
            match (f.as_str(), x) {
                ("offset", _) => slot(
                    x,
                    format!("/sequence/{j}/tap/offset"),
                    format!("sequence op {k} tap offset"),
                )?,
                ("sizes" | "strides", Value::Array(a)) => {
                    for (i, y) in a.iter().enumerate() {
                        slot(
                            y,
                            format!("/sequence/{j}/tap/{f}/{i}"),
                            format!("sequence op {k} tap {f}[{i}]"),
                        )?;
                    }
                }
                _ => forbid(
                    x,
                    &mut vec!["sequence".into(), k.to_string(), "tap".into(), f.clone()],
                )?,
            }
        }
        Ok(())
    }

    fn read_workers(&mut self, workers: &Value) -> Result<(), String> {
        let Some(ws) = workers.as_array() else {
            return forbid(workers, &mut vec!["workers".into()]);
        };
        for (w, wd) in ws.iter().enumerate() {
            let Some(m) = wd.as_object() else {
                forbid(wd, &mut vec!["workers".into(), w.to_string()])?;
                continue;
            };
            // Read only when an rtp word needs it: a malformed tile is otherwise serde's to
            // report, as for any program.
            let tile = m
                .get("tile")
                .and_then(|t| serde_json::from_value::<[u32; 2]>(t.clone()).ok());
            for (f, x) in m {
                if f == "body" {
                    let what = format!("worker {w}");
                    self.read_body(x, &format!("/workers/{w}/body"), &what, tile)?;
                } else {
                    forbid(x, &mut vec!["workers".into(), w.to_string(), f.clone()])?;
                }
            }
        }
        Ok(())
    }

    fn read_body(
        &mut self,
        body: &Value,
        pointer: &str,
        what: &str,
        tile: Option<[u32; 2]>,
    ) -> Result<(), String> {
        let Some(ops) = body.as_array() else {
            return forbid(body, &mut segments(pointer));
        };
        for (j, op) in ops.iter().enumerate() {
            let at = format!("{pointer}/{j}");
            let Some(m) = op.as_object() else {
                forbid(op, &mut segments(&at))?;
                continue;
            };
            let kind = m.get("op").and_then(Value::as_str).unwrap_or("");
            for (f, x) in m {
                let here = format!("{at}/{f}");
                match (kind, f.as_str(), x) {
                    ("loop", "count", _) => self.rtp_slot(x, &here, what, tile, true)?,
                    ("loop", "body", _) => self.read_body(x, &here, what, tile)?,
                    ("call", "args", Value::Array(args)) => {
                        for (a, arg) in args.iter().enumerate() {
                            let Some(fields) = arg.as_object() else {
                                forbid(arg, &mut segments(&format!("{here}/{a}")))?;
                                continue;
                            };
                            for (g, y) in fields {
                                let there = format!("{here}/{a}/{g}");
                                if g == "i32" {
                                    self.rtp_slot(y, &there, what, tile, false)?;
                                } else {
                                    forbid(y, &mut segments(&there))?;
                                }
                            }
                        }
                    }
                    _ => forbid(x, &mut segments(&here))?,
                }
            }
        }
        Ok(())
    }

    /// A loop count (`count`) or i32 call argument at `pointer` that may read an rtp word.
    fn rtp_slot(
        &mut self,
        x: &Value,
        pointer: &str,
        what: &str,
        tile: Option<[u32; 2]>,
        count: bool,
    ) -> Result<(), String> {
        if !x.is_object() {
            return Ok(());
        }
        let place = format!(
            "{what} {} {}",
            &pointer[pointer.find("/body").unwrap_or(0) + 1..],
            if count {
                "(loop count)"
            } else {
                "(i32 argument)"
            }
        );
        if x.get("param").is_some() {
            return Err(format!(
                "{place}: a worker cannot read a param; the sequence writes it into an rtp \
                 word, which the worker reads as {{\"rtp\": [buffer, word]}}"
            ));
        }
        let r: RtpRef = serde_json::from_value(x.clone())
            .map_err(|e| format!("{place}: malformed expression: {e}"))?;
        let [b, i] = r.rtp;
        let buf = self
            .rtps
            .get(b)
            .ok_or_else(|| format!("{place}: rtp buffer {b} does not exist"))?;
        let tile = tile.ok_or_else(|| format!("{place}: the worker's tile is malformed"))?;
        if buf.tile != tile {
            return Err(format!(
                "{place}: rtp buffer {b} is on tile {:?}, not on the worker's tile {tile:?}",
                buf.tile
            ));
        }
        if i >= buf.words as usize {
            return Err(format!(
                "{place}: word {i} of rtp buffer {b} ({} words)",
                buf.words
            ));
        }
        if !self.writes.iter().any(|w| w.word == (b, i)) {
            return Err(format!(
                "{place}: rtp word [{b}, {i}] is never written by the sequence"
            ));
        }
        self.slots.push(Slot {
            pointer: pointer.to_owned(),
            place,
            expr: if count {
                SlotExpr::Count((b, i))
            } else {
                SlotExpr::I32((b, i))
            },
        });
        Ok(())
    }
}

/// Refuses an expression anywhere in `v` (at path `at`), where the program takes constants.
fn forbid(v: &Value, at: &mut Vec<String>) -> Result<(), String> {
    match v {
        Value::Object(m) => {
            if is_expression(m) {
                return Err(format!(
                    "/{}: an expression where the program takes a constant ({WHERE_EXPRESSIONS})",
                    at.join("/")
                ));
            }
            for (k, x) in m {
                at.push(k.clone());
                forbid(x, at)?;
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(i.to_string());
                forbid(x, at)?;
                at.pop();
            }
        }
        _ => {}
    }
    Ok(())
}

/// The fields of a JSON pointer (for [`forbid`]'s paths).
fn segments(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// No object of the program format has a `param` or `rtp` field but an expression.
fn is_expression(m: &Map<String, Value>) -> bool {
    m.contains_key("param") || m.contains_key("rtp")
}
