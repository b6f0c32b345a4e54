//! The program JSON of image version 2 (written by `python3 -m ggml_hsa_iron --target emu`,
//! documented in docs/kernel-compiler-protocol.md) and its structural checks: after
//! [`Program::check`], every index is in range and every walk stays inside its object or
//! operand, so the scheduler never indexes out of bounds.

use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Program {
    pub name: String,
    pub arch: String,
    pub device: DeviceDef,
    pub args: Vec<ArgDef>,
    pub kernels: Vec<KernelDef>,
    pub fifos: Vec<FifoDef>,
    pub links: Vec<LinkDef>,
    pub workers: Vec<WorkerDef>,
    pub sequence: Vec<SeqOp>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceDef {
    pub name: String,
    pub cols: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgDef {
    pub index: usize,
    #[serde(rename = "type")]
    pub ty: String,
    pub elem_bytes: u64,
    /// Bytes the design moves at most (elements rounded up to whole DMA words).
    pub bytes: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelDef {
    pub symbol: String,
    pub name: String,
    pub args: Vec<KernelArg>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum KernelArg {
    I32,
    Buffer { bytes: u64 },
}

/// An access pattern: element offset, sizes and strides (outermost first), in elements.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Walk {
    pub offset: u64,
    pub sizes: Vec<u64>,
    pub strides: Vec<u64>,
}

impl Walk {
    pub fn count(&self) -> u64 {
        self.sizes.iter().product()
    }

    /// The last element index the walk touches (None if it overflows).
    pub fn last(&self) -> Option<u64> {
        self.sizes
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |acc, (&n, &s)| {
                acc.checked_add(n.checked_sub(1)?.checked_mul(s)?)
            })
    }

    fn check(&self, what: &str, elems: u64) -> Result<(), String> {
        if self.sizes.len() != self.strides.len() || self.sizes.is_empty() || self.sizes.len() > 8 {
            return Err(format!("{what}: malformed access pattern {self:?}"));
        }
        if self.sizes.contains(&0) {
            return Err(format!("{what}: access pattern with a zero size"));
        }
        match self.last() {
            Some(l) if l < elems => Ok(()),
            _ => Err(format!(
                "{what}: access pattern {self:?} goes beyond {elems} elements"
            )),
        }
    }
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EpKind {
    Shim,
    Core,
    Split,
    Join,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub kind: EpKind,
    pub tile: [u32; 2],
    pub depth: u32,
    #[serde(default)]
    pub link: Option<usize>,
    #[serde(default)]
    pub index: Option<usize>,
    #[serde(default)]
    pub from_stream: Option<Walk>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FifoDef {
    pub id: usize,
    pub name: String,
    pub obj_bytes: u64,
    pub elem_bytes: u64,
    pub depth: u32,
    pub producer: Endpoint,
    pub consumers: Vec<Endpoint>,
    #[serde(default)]
    pub to_stream: Option<Walk>,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    Split,
    Join,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkDef {
    pub id: usize,
    pub kind: LinkKind,
    pub tile: [u32; 2],
    pub fifo: usize,
    pub subfifos: Vec<usize>,
    /// Byte offset of each sub-fifo's segment in the parent fifo's object.
    pub offsets: Vec<u64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerDef {
    pub tile: [u32; 2],
    pub stack_bytes: u64,
    pub body: Vec<BodyOp>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum BodyOp {
    Loop {
        #[serde(default)]
        count: u64,
        #[serde(default)]
        forever: bool,
        body: Vec<BodyOp>,
    },
    Acquire {
        fifo: usize,
        #[serde(default)]
        cons: Option<usize>,
        n: u32,
        var: usize,
    },
    Release {
        fifo: usize,
        #[serde(default)]
        cons: Option<usize>,
        n: u32,
    },
    Call {
        kernel: usize,
        args: Vec<CallArg>,
    },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallArg {
    #[serde(default)]
    pub var: Option<usize>,
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub i32: Option<i32>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum SeqOp {
    Fill {
        task: usize,
        fifo: usize,
        arg: usize,
        tap: Walk,
        elem_bytes: u64,
        wait: bool,
    },
    Drain {
        task: usize,
        fifo: usize,
        arg: usize,
        tap: Walk,
        elem_bytes: u64,
        wait: bool,
    },
    Await {
        tasks: Vec<usize>,
    },
}

/// Largest object a fifo may carry (a memory tile's memory).
const MAX_OBJ: u64 = 512 * 1024;
const MAX_DEPTH: u32 = 64;

impl Program {
    pub fn parse(text: &str) -> Result<Program, String> {
        let p: Program = serde_json::from_str(text).map_err(|e| format!("program JSON: {e}"))?;
        p.check()?;
        Ok(p)
    }

    /// Structural checks (see the module documentation).
    pub fn check(&self) -> Result<(), String> {
        let nf = self.fifos.len();
        for (i, a) in self.args.iter().enumerate() {
            if a.index != i || !matches!(a.elem_bytes, 1 | 2 | 4 | 8) {
                return Err(format!("argument {i}: malformed ({a:?})"));
            }
        }
        for (i, f) in self.fifos.iter().enumerate() {
            let what = format!("fifo {}", f.name);
            if f.id != i {
                return Err(format!("{what}: id {} at position {i}", f.id));
            }
            if f.obj_bytes == 0
                || f.obj_bytes > MAX_OBJ
                || !matches!(f.elem_bytes, 1 | 2 | 4 | 8)
                || f.obj_bytes % f.elem_bytes != 0
            {
                return Err(format!(
                    "{what}: object of {} bytes of {}-byte elements",
                    f.obj_bytes, f.elem_bytes
                ));
            }
            let elems = f.obj_bytes / f.elem_bytes;
            for e in std::iter::once(&f.producer).chain(&f.consumers) {
                if e.kind != EpKind::Shim && !(1..=MAX_DEPTH).contains(&e.depth) {
                    return Err(format!("{what}: depth {} out of range", e.depth));
                }
                if let Some(l) = e.link {
                    if l >= self.links.len() {
                        return Err(format!("{what}: link {l} does not exist"));
                    }
                }
                if matches!(e.kind, EpKind::Split | EpKind::Join) && e.link.is_none() {
                    return Err(format!("{what}: a link endpoint without its link"));
                }
                if let Some(w) = &e.from_stream {
                    w.check(&format!("{what} from_stream"), elems)?;
                    if w.count() != elems {
                        return Err(format!("{what}: from_stream moves {} elements", w.count()));
                    }
                }
            }
            if let Some(w) = &f.to_stream {
                w.check(&format!("{what} to_stream"), elems)?;
                if w.count() != elems {
                    return Err(format!("{what}: to_stream moves {} elements", w.count()));
                }
            }
            if f.consumers.is_empty() {
                return Err(format!("{what}: no consumer"));
            }
            let shims = f
                .consumers
                .iter()
                .filter(|c| c.kind == EpKind::Shim)
                .count();
            if shims > 1 || (shims == 1 && f.producer.kind == EpKind::Shim) {
                return Err(format!("{what}: more than one shim endpoint"));
            }
        }
        for (i, l) in self.links.iter().enumerate() {
            let what = format!("link {i}");
            if l.id != i || l.fifo >= nf || l.subfifos.len() != l.offsets.len() {
                return Err(format!("{what}: malformed"));
            }
            let parent = &self.fifos[l.fifo];
            let (pkind, pside_ok) = match l.kind {
                LinkKind::Split => (
                    EpKind::Split,
                    parent
                        .consumers
                        .iter()
                        .filter(|c| c.link == Some(i))
                        .count()
                        == 1,
                ),
                LinkKind::Join => (EpKind::Join, parent.producer.link == Some(i)),
            };
            if !pside_ok {
                return Err(format!("{what}: fifo {} does not end in it", parent.name));
            }
            for (j, (&s, &off)) in l.subfifos.iter().zip(&l.offsets).enumerate() {
                if s >= nf {
                    return Err(format!("{what}: sub-fifo {s} does not exist"));
                }
                let sub = &self.fifos[s];
                let end = off.checked_add(sub.obj_bytes);
                if end.is_none_or(|e| e > parent.obj_bytes) || sub.elem_bytes != parent.elem_bytes {
                    return Err(format!(
                        "{what}: segment {j} ({} bytes at {off}) outside fifo {} ({} bytes)",
                        sub.obj_bytes, parent.name, parent.obj_bytes
                    ));
                }
                let ok = match l.kind {
                    LinkKind::Split => {
                        sub.producer.kind == pkind
                            && sub.producer.link == Some(i)
                            && sub.producer.index == Some(j)
                    }
                    LinkKind::Join => {
                        sub.consumers
                            .iter()
                            .filter(|c| c.link == Some(i) && c.index == Some(j))
                            .count()
                            == 1
                    }
                };
                if !ok {
                    return Err(format!(
                        "{what}: sub-fifo {} is not its segment {j}",
                        sub.name
                    ));
                }
            }
        }
        for (k, kd) in self.kernels.iter().enumerate() {
            if kd.symbol != format!("ggml_hsa_emu_{k}") || kd.args.len() > 16 {
                return Err(format!("kernel {k}: malformed ({})", kd.symbol));
            }
        }
        for (w, wd) in self.workers.iter().enumerate() {
            let mut vars = std::collections::HashMap::new();
            self.check_body(w, wd, &wd.body, &mut vars)?;
        }
        let mut tasks = 0usize;
        for op in &self.sequence {
            match op {
                SeqOp::Fill {
                    task,
                    fifo,
                    arg,
                    tap,
                    elem_bytes,
                    ..
                }
                | SeqOp::Drain {
                    task,
                    fifo,
                    arg,
                    tap,
                    elem_bytes,
                    ..
                } => {
                    let fill = matches!(op, SeqOp::Fill { .. });
                    if *task != tasks || *fifo >= nf || *arg >= self.args.len() {
                        return Err(format!("sequence task {task}: malformed"));
                    }
                    tasks += 1;
                    let f = &self.fifos[*fifo];
                    let a = &self.args[*arg];
                    let shim_end = if fill {
                        f.producer.kind == EpKind::Shim
                    } else {
                        f.consumers.iter().any(|c| c.kind == EpKind::Shim)
                    };
                    if !shim_end || *elem_bytes != f.elem_bytes || *elem_bytes != a.elem_bytes {
                        return Err(format!(
                            "sequence task {task}: fifo {} has no shim end of this kind, or \
                             element sizes differ",
                            f.name
                        ));
                    }
                    tap.check(&format!("sequence task {task}"), a.bytes / a.elem_bytes)?;
                }
                SeqOp::Await { tasks: ts } => {
                    if ts.iter().any(|&t| t >= tasks) {
                        return Err("sequence: await of a task not issued yet".into());
                    }
                }
            }
        }
        Ok(())
    }

    fn check_body(
        &self,
        w: usize,
        wd: &WorkerDef,
        body: &[BodyOp],
        vars: &mut std::collections::HashMap<usize, (usize, u32)>,
    ) -> Result<(), String> {
        let what = format!("worker {w} at tile {:?}", wd.tile);
        for op in body {
            match op {
                BodyOp::Loop { body, .. } => self.check_body(w, wd, body, vars)?,
                BodyOp::Acquire { fifo, cons, n, var } => {
                    let ep = self.port(*fifo, *cons, &what)?;
                    if ep.kind != EpKind::Core || ep.tile != wd.tile {
                        return Err(format!("{what}: fifo {fifo} does not end at this core"));
                    }
                    if *n == 0 || *n > ep.depth {
                        return Err(format!("{what}: acquire of {n} with depth {}", ep.depth));
                    }
                    vars.insert(*var, (*fifo, *n));
                }
                BodyOp::Release { fifo, cons, n } => {
                    let ep = self.port(*fifo, *cons, &what)?;
                    if ep.kind != EpKind::Core || ep.tile != wd.tile || *n == 0 {
                        return Err(format!("{what}: bad release of fifo {fifo}"));
                    }
                }
                BodyOp::Call { kernel, args } => {
                    let k = self
                        .kernels
                        .get(*kernel)
                        .ok_or_else(|| format!("{what}: kernel {kernel} does not exist"))?;
                    if k.args.len() != args.len() {
                        return Err(format!(
                            "{what}: {} called with {} args",
                            k.name,
                            args.len()
                        ));
                    }
                    for (i, (ka, ca)) in k.args.iter().zip(args).enumerate() {
                        let ok = match (ka, ca.var, ca.i32) {
                            (KernelArg::I32, None, Some(_)) => true,
                            (KernelArg::Buffer { bytes }, Some(v), None) => {
                                vars.get(&v).is_some_and(|&(f, n)| {
                                    ca.index < n && self.fifos[f].obj_bytes == *bytes
                                })
                            }
                            _ => false,
                        };
                        if !ok {
                            return Err(format!("{what}: argument {i} of {} is malformed", k.name));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn port(&self, fifo: usize, cons: Option<usize>, what: &str) -> Result<&Endpoint, String> {
        let f = self
            .fifos
            .get(fifo)
            .ok_or_else(|| format!("{what}: fifo {fifo} does not exist"))?;
        match cons {
            None => Ok(&f.producer),
            Some(c) => f
                .consumers
                .get(c)
                .ok_or_else(|| format!("{what}: consumer {c} of fifo {} does not exist", f.name)),
        }
    }
}
