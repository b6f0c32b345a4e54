//! The dataflow of one dispatch, run by a deterministic round-robin scheduler over actors:
//!
//! * the runtime sequence (issues DMA tasks to the shim channels, blocks at awaits);
//! * per fifo with a shim producer, a fill walker (host memory -> stream, along the task's
//!   access pattern); per fifo with a shim consumer, a drain walker (stream -> host memory);
//! * per fifo, a DMA mover: when the producer has a full object and every consumer a free
//!   buffer, the object goes over the stream (walked by the producer's `to_stream`, written by
//!   each consumer's `from_stream`); memory-tile split/join endpoints read or write their
//!   segment of the link's buffer ring;
//! * per worker, an interpreter of its body (acquire/release on the core's buffer rings, calls
//!   of the core functions in the core's own copy of the kernel library).
//!
//! A dispatch completes when the sequence has run and every drain task has finished (workers
//! blocked in their forever loop are fine). If a whole round makes no progress before that,
//! the dispatch fails with a deadlock message naming each blocked actor and what it waits for.
//!
//! Times travel with the data (see `timing`): the order in which the scheduler runs actors is
//! not the order of events on the array, so every time is computed from the times of what the
//! event waited for, never from the scheduler's order (except the DRAM ledger's bias).

use super::dl::CoreLib;
use super::program::{BodyOp, EpKind, Program, SeqOp, Walk};
use super::timing::{DramLedger, Rates, TaskGroupTime, Timeline};
use crate::exec::{ExecStats, OperandMem};
use std::collections::VecDeque;

/// A worker body flattened into instructions.
#[derive(Clone, Debug)]
pub enum Ins {
    /// `count` = u64::MAX: forever; `end` = index of the matching LoopEnd.
    LoopStart {
        count: u64,
        end: usize,
    },
    LoopEnd {
        start: usize,
    },
    Acquire {
        port: Port,
        n: u64,
        var: usize,
    },
    Release {
        port: Port,
        n: u64,
    },
    Call {
        kernel: usize,
        args: Vec<Arg>,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct Port {
    pub fifo: usize,
    pub prod: bool,
}

#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Var { var: usize, index: u64 },
    I32(i32),
}

pub fn flatten(body: &[BodyOp], out: &mut Vec<Ins>) {
    for op in body {
        match op {
            BodyOp::Loop {
                count,
                forever,
                body,
            } => {
                let start = out.len();
                out.push(Ins::LoopStart { count: 0, end: 0 });
                flatten(body, out);
                let end = out.len();
                out.push(Ins::LoopEnd { start });
                out[start] = Ins::LoopStart {
                    count: if *forever { u64::MAX } else { *count },
                    end,
                };
            }
            BodyOp::Acquire {
                fifo, cons, n, var, ..
            } => out.push(Ins::Acquire {
                port: Port {
                    fifo: *fifo,
                    prod: cons.is_none(),
                },
                n: *n as u64,
                var: *var,
            }),
            BodyOp::Release { fifo, cons, n } => out.push(Ins::Release {
                port: Port {
                    fifo: *fifo,
                    prod: cons.is_none(),
                },
                n: *n as u64,
            }),
            BodyOp::Call { kernel, args } => out.push(Ins::Call {
                kernel: *kernel,
                args: args
                    .iter()
                    .map(|a| match (a.var, a.i32) {
                        (Some(v), _) => Arg::Var {
                            var: v,
                            index: a.index as u64,
                        },
                        (None, Some(x)) => Arg::I32(x),
                        (None, None) => Arg::I32(0), // excluded by Program::check
                    })
                    .collect(),
            }),
        }
    }
}

/// A ring of `depth` object buffers. Counters are absolute object numbers:
/// `filled` objects were made full, `freed` were given back, `claimed` were acquired by a
/// worker; link rings use `cursors` (one per sub-fifo) instead of a worker. Per slot, the time
/// its object was made full (`ready_t`) and the time its last occupant was given back
/// (`free_t`); both only grow, so a link's parts combine with `max`.
#[derive(Debug)]
struct Ring {
    depth: u64,
    obj_bytes: usize,
    slots: Vec<Vec<u64>>,
    claimed: u64,
    filled: u64,
    freed: u64,
    cursors: Vec<u64>,
    ready_t: Vec<f64>,
    free_t: Vec<f64>,
}

impl Ring {
    fn new(depth: u32, obj_bytes: u64, cursors: usize) -> Ring {
        let words = (obj_bytes as usize).div_ceil(8);
        Ring {
            depth: depth as u64,
            obj_bytes: obj_bytes as usize,
            slots: (0..depth).map(|_| vec![0u64; words]).collect(),
            claimed: 0,
            filled: 0,
            freed: 0,
            cursors: vec![0; cursors],
            ready_t: vec![0.0; depth as usize],
            free_t: vec![0.0; depth as usize],
        }
    }

    fn idx(&self, abs: u64) -> usize {
        (abs % self.depth) as usize
    }

    /// The latest time among objects `base..base + n` of `times` (`ready_t` or `free_t`).
    fn latest(&self, times: &[f64], base: u64, n: u64) -> f64 {
        (base..base + n)
            .map(|a| times[self.idx(a)])
            .fold(0.0, f64::max)
    }

    fn slot(&self, abs: u64) -> &[u8] {
        let s = &self.slots[(abs % self.depth) as usize];
        // SAFETY: a u64 buffer viewed as bytes: u8 has no alignment or validity requirement,
        // and the view covers obj_bytes <= 8 * len bytes of it.
        unsafe { std::slice::from_raw_parts(s.as_ptr() as *const u8, self.obj_bytes) }
    }

    fn slot_mut(&mut self, abs: u64) -> &mut [u8] {
        let n = self.obj_bytes;
        let s = &mut self.slots[(abs % self.depth) as usize];
        // SAFETY: as in `slot`, with the exclusive borrow of the buffer.
        unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr() as *mut u8, n) }
    }
}

#[derive(Debug)]
enum Src {
    Shim,
    /// A core producer's ring, or a join's ring in the memory tile.
    Ring(usize),
    /// Segment `index` of a split's ring, at byte `off`.
    Split {
        ring: usize,
        index: usize,
        off: usize,
    },
}

#[derive(Debug)]
enum Dst {
    Shim,
    /// A core consumer's ring, or a split's ring in the memory tile.
    Ring(usize),
    /// Segment `index` of a join's ring, at byte `off`.
    Join {
        ring: usize,
        index: usize,
        off: usize,
    },
}

/// A DMA walk over host memory, in runs of contiguous elements.
#[derive(Debug)]
struct Walker {
    offset: u64,
    sizes: Vec<u64>,
    strides: Vec<u64>,
    idx: Vec<u64>,
    pos: u64,
    done: bool,
}

impl Walker {
    fn new(w: &Walk) -> Walker {
        Walker {
            offset: w.offset,
            sizes: w.sizes.clone(),
            strides: w.strides.clone(),
            idx: vec![0; w.sizes.len()],
            pos: 0,
            done: false,
        }
    }

    /// The next run of at most `max` contiguous elements: (first element, count).
    fn next(&mut self, max: u64) -> Option<(u64, u64)> {
        if self.done || max == 0 {
            return None;
        }
        let l = self.sizes.len() - 1;
        let base = self.offset + (0..l).map(|d| self.idx[d] * self.strides[d]).sum::<u64>();
        let (n, s) = (self.sizes[l], self.strides[l]);
        let count = if s == 1 { (n - self.pos).min(max) } else { 1 };
        let first = base + self.pos * s;
        self.pos += count;
        if self.pos == n {
            self.pos = 0;
            let mut d = l;
            loop {
                if d == 0 {
                    self.done = true;
                    break;
                }
                d -= 1;
                self.idx[d] += 1;
                if self.idx[d] < self.sizes[d] {
                    break;
                }
                self.idx[d] = 0;
            }
        }
        Some((first, count))
    }
}

#[derive(Debug)]
struct Transfer {
    task: usize,
    arg: usize,
    walker: Walker,
    /// When the runtime sequence issued the task.
    issued: f64,
}

#[derive(Debug)]
struct FifoRt {
    src: Src,
    dsts: Vec<Dst>,
    obj_bytes: usize,
    elem_bytes: usize,
    to_idx: Option<Vec<u32>>,
    from_idx: Vec<Option<Vec<u32>>>,
    /// Shim producer: the object being assembled from fill tasks.
    fill_stage: Vec<u8>,
    fill_len: usize,
    fills: VecDeque<Transfer>,
    /// Shim consumer: the object being written out by drain tasks.
    drain_stage: Vec<u8>,
    drain_pos: usize,
    drain_len: usize,
    drains: VecDeque<Transfer>,
    sent: u64,
    /// Shim producer: when the staged bytes were issued, and the fill tasks whose last bytes
    /// they are (done when the object has gone).
    fill_t: f64,
    stage_tasks: Vec<usize>,
    /// Shim consumer: when the staged object arrived.
    drain_t: f64,
    /// The producer's channel and each consumer's: free from these times.
    prod_clock: f64,
    cons_clock: Vec<f64>,
    /// Time its transfers took (DRAM waits included).
    busy: f64,
}

impl FifoRt {
    /// Whether a shim tile is an endpoint: its bytes go to or come from DRAM.
    fn through_shim(&self) -> bool {
        matches!(self.src, Src::Shim) || self.dsts.iter().any(|d| matches!(d, Dst::Shim))
    }
}

#[derive(Debug)]
struct WorkerRt {
    pc: usize,
    stack: Vec<u64>,
    vars: Vec<Option<(usize, u64, bool)>>,
    done: bool,
    clock: f64,
    busy: f64,
}

/// Per-dispatch state of a loaded program.
pub struct Sim<'a> {
    prog: &'a Program,
    code: &'a [Vec<Ins>],
    libs: &'a [CoreLib],
    ops: &'a [OperandMem],
    rings: Vec<Ring>,
    prod_ring: Vec<Option<usize>>,
    cons_ring: Vec<Vec<Option<usize>>>,
    fifos: Vec<FifoRt>,
    workers: Vec<WorkerRt>,
    seq_pc: usize,
    task_done: Vec<bool>,
    drain_tasks: Vec<usize>,
    stats: ExecStats,
    rates: Rates,
    dram: DramLedger,
    seq_t: f64,
    task_t: Vec<f64>,
    /// The sequence's clock at each await that returned (the task groups' ends), every
    /// object a shim channel moved (when its move ended, its bytes) and every kernel call
    /// (its core, when it ended, its cycles): what each group's span of time holds
    /// (`timeline`).
    group_ends: Vec<f64>,
    shim_moves: Vec<(f64, u64)>,
    core_calls: Vec<(usize, f64, f64)>,
}

fn walk_indices(w: &Walk) -> Vec<u32> {
    let mut out = Vec::with_capacity(w.count() as usize);
    let mut wk = Walker::new(w);
    while let Some((first, n)) = wk.next(u64::MAX) {
        out.extend((first..first + n).map(|i| i as u32));
    }
    out
}

fn is_identity(v: &[u32]) -> bool {
    v.iter().enumerate().all(|(i, &x)| i as u32 == x)
}

const STEP_BUDGET: usize = 256;

impl<'a> Sim<'a> {
    pub fn new(
        prog: &'a Program,
        code: &'a [Vec<Ins>],
        libs: &'a [CoreLib],
        ops: &'a [OperandMem],
        rates: Rates,
    ) -> Sim<'a> {
        let nf = prog.fifos.len();
        let mut rings = Vec::new();
        let mut prod_ring = vec![None; nf];
        let mut cons_ring: Vec<Vec<Option<usize>>> = prog
            .fifos
            .iter()
            .map(|f| vec![None; f.consumers.len()])
            .collect();
        for (i, f) in prog.fifos.iter().enumerate() {
            match f.producer.kind {
                EpKind::Core => {
                    prod_ring[i] = Some(rings.len());
                    rings.push(Ring::new(f.producer.depth, f.obj_bytes, 0));
                }
                EpKind::Join => {
                    let l = &prog.links[f.producer.link.unwrap_or(0)];
                    prod_ring[i] = Some(rings.len());
                    rings.push(Ring::new(f.producer.depth, f.obj_bytes, l.subfifos.len()));
                }
                _ => {}
            }
            for (c, e) in f.consumers.iter().enumerate() {
                match e.kind {
                    EpKind::Core => {
                        cons_ring[i][c] = Some(rings.len());
                        rings.push(Ring::new(e.depth, f.obj_bytes, 0));
                    }
                    EpKind::Split => {
                        let l = &prog.links[e.link.unwrap_or(0)];
                        cons_ring[i][c] = Some(rings.len());
                        rings.push(Ring::new(e.depth, f.obj_bytes, l.subfifos.len()));
                    }
                    _ => {}
                }
            }
        }
        let mut fifos = Vec::with_capacity(nf);
        for (i, f) in prog.fifos.iter().enumerate() {
            let src = match f.producer.kind {
                EpKind::Shim => Src::Shim,
                EpKind::Core | EpKind::Join => Src::Ring(prod_ring[i].unwrap_or(0)),
                EpKind::Split => {
                    let l = f.producer.link.unwrap_or(0);
                    let parent = prog.links[l].fifo;
                    let c = prog.fifos[parent]
                        .consumers
                        .iter()
                        .position(|c| c.kind == EpKind::Split && c.link == Some(l))
                        .unwrap_or(0);
                    let index = f.producer.index.unwrap_or(0);
                    Src::Split {
                        ring: cons_ring[parent][c].unwrap_or(0),
                        index,
                        off: prog.links[l].offsets[index] as usize,
                    }
                }
            };
            let dsts = f
                .consumers
                .iter()
                .enumerate()
                .map(|(c, e)| match e.kind {
                    EpKind::Shim => Dst::Shim,
                    EpKind::Core | EpKind::Split => Dst::Ring(cons_ring[i][c].unwrap_or(0)),
                    EpKind::Join => {
                        let l = e.link.unwrap_or(0);
                        let parent = prog.links[l].fifo;
                        let index = e.index.unwrap_or(0);
                        Dst::Join {
                            ring: prod_ring[parent].unwrap_or(0),
                            index,
                            off: prog.links[l].offsets[index] as usize,
                        }
                    }
                })
                .collect();
            let to_idx = f
                .to_stream
                .as_ref()
                .map(walk_indices)
                .filter(|v| !is_identity(v));
            let from_idx = f
                .consumers
                .iter()
                .map(|e| {
                    e.from_stream
                        .as_ref()
                        .map(walk_indices)
                        .filter(|v| !is_identity(v))
                })
                .collect();
            fifos.push(FifoRt {
                src,
                dsts,
                obj_bytes: f.obj_bytes as usize,
                elem_bytes: f.elem_bytes as usize,
                to_idx,
                from_idx,
                fill_stage: vec![0; f.obj_bytes as usize],
                fill_len: 0,
                fills: VecDeque::new(),
                drain_stage: vec![0; f.obj_bytes as usize],
                drain_pos: 0,
                drain_len: 0,
                drains: VecDeque::new(),
                sent: 0,
                fill_t: 0.0,
                stage_tasks: Vec::new(),
                drain_t: 0.0,
                prod_clock: 0.0,
                cons_clock: vec![0.0; f.consumers.len()],
                busy: 0.0,
            });
        }
        let workers = code
            .iter()
            .map(|c| {
                let nvars = c
                    .iter()
                    .filter_map(|i| match i {
                        Ins::Acquire { var, .. } => Some(var + 1),
                        _ => None,
                    })
                    .max()
                    .unwrap_or(0);
                WorkerRt {
                    pc: 0,
                    stack: Vec::new(),
                    vars: vec![None; nvars],
                    done: c.is_empty(),
                    clock: 0.0,
                    busy: 0.0,
                }
            })
            .collect();
        let ntasks = prog
            .sequence
            .iter()
            .filter(|o| !matches!(o, SeqOp::Await { .. }))
            .count();
        Sim {
            prog,
            code,
            libs,
            ops,
            rings,
            prod_ring,
            cons_ring,
            fifos,
            workers,
            seq_pc: 0,
            task_done: vec![false; ntasks],
            drain_tasks: Vec::new(),
            stats: ExecStats::default(),
            rates,
            dram: DramLedger::default(),
            seq_t: 0.0,
            task_t: vec![0.0; ntasks],
            group_ends: Vec::new(),
            shim_moves: Vec::new(),
            core_calls: Vec::new(),
        }
    }

    fn complete(&self) -> bool {
        self.seq_pc == self.prog.sequence.len()
            && self.drain_tasks.iter().all(|&t| self.task_done[t])
    }

    /// Runs the dispatch to completion.
    pub fn run(mut self) -> Result<ExecStats, String> {
        let nf = self.fifos.len();
        let nw = self.workers.len();
        loop {
            if self.complete() {
                self.stats.timeline = Some(self.timeline());
                return Ok(self.stats);
            }
            let mut progress = self.step_sequence();
            for f in 0..nf {
                progress |= self.step_fill(f)?;
                progress |= self.step_move(f);
                progress |= self.step_drain(f)?;
            }
            for w in 0..nw {
                progress |= self.step_worker(w)?;
            }
            if !progress && !self.complete() {
                return Err(self.deadlock());
            }
        }
    }

    // ------------------------------------------------------------------ runtime sequence

    fn step_sequence(&mut self) -> bool {
        let mut progress = false;
        while self.seq_pc < self.prog.sequence.len() {
            match &self.prog.sequence[self.seq_pc] {
                SeqOp::Fill {
                    task,
                    fifo,
                    arg,
                    tap,
                    ..
                } => self.fifos[*fifo].fills.push_back(Transfer {
                    task: *task,
                    arg: *arg,
                    walker: Walker::new(tap),
                    issued: self.seq_t,
                }),
                SeqOp::Drain {
                    task,
                    fifo,
                    arg,
                    tap,
                    ..
                } => {
                    self.drain_tasks.push(*task);
                    self.fifos[*fifo].drains.push_back(Transfer {
                        task: *task,
                        arg: *arg,
                        walker: Walker::new(tap),
                        issued: self.seq_t,
                    })
                }
                SeqOp::Await { tasks } => {
                    if !tasks.iter().all(|&t| self.task_done[t]) {
                        return progress;
                    }
                    self.seq_t = tasks
                        .iter()
                        .map(|&t| self.task_t[t])
                        .fold(self.seq_t, f64::max);
                    self.group_ends.push(self.seq_t);
                }
            }
            self.seq_pc += 1;
            progress = true;
        }
        progress
    }

    fn host_range(
        &self,
        arg: usize,
        first: u64,
        n: u64,
        eb: usize,
        what: &str,
    ) -> Result<usize, String> {
        let m = &self.ops[arg];
        let start = first as usize * eb;
        let end = start + n as usize * eb;
        if end > m.len {
            return Err(format!(
                "{what} accesses bytes {start}..{end} of operand {arg}, which has {} accessible \
                 bytes",
                m.len
            ));
        }
        Ok(m.addr + start)
    }

    fn step_fill(&mut self, f: usize) -> Result<bool, String> {
        let mut progress = false;
        loop {
            let fr = &self.fifos[f];
            if fr.fill_len == fr.obj_bytes || fr.fills.is_empty() {
                return Ok(progress);
            }
            let eb = fr.elem_bytes;
            let room = ((fr.obj_bytes - fr.fill_len) / eb) as u64;
            let fr = &mut self.fifos[f];
            let t = fr.fills.front_mut().expect("non-empty");
            let (task, arg, issued) = (t.task, t.arg, t.issued);
            match t.walker.next(room) {
                Some((first, n)) => {
                    let what = format!("fill task {task} of fifo {}", self.prog.fifos[f].name);
                    let addr = self.host_range(arg, first, n, eb, &what)?;
                    let fr = &mut self.fifos[f];
                    let len = n as usize * eb;
                    let dst = &mut fr.fill_stage[fr.fill_len..fr.fill_len + len];
                    // SAFETY: [addr, addr+len) is inside operand `arg`'s accessible range
                    // (host_range), which the caller guarantees is readable for the dispatch;
                    // `dst` is a distinct Rust buffer of len bytes.
                    unsafe { std::ptr::copy(addr as *const u8, dst.as_mut_ptr(), len) };
                    fr.fill_len += len;
                    fr.fill_t = fr.fill_t.max(issued);
                    self.stats.bytes_read += len as u64;
                    if fr.fills.front().is_some_and(|t| t.walker.done) {
                        fr.fills.pop_front();
                        if fr.fill_len == fr.obj_bytes {
                            // Done when this object has gone over the stream (move_one).
                            fr.stage_tasks.push(task);
                        } else {
                            // Its last bytes wait in the channel for the next task's: done
                            // when issued, a lower bound.
                            self.task_done[task] = true;
                            self.task_t[task] = issued;
                        }
                    }
                    progress = true;
                }
                None => {
                    fr.fills.pop_front();
                    self.task_done[task] = true;
                    self.task_t[task] = issued;
                    progress = true;
                }
            }
        }
    }

    fn step_drain(&mut self, f: usize) -> Result<bool, String> {
        let mut progress = false;
        loop {
            let fr = &self.fifos[f];
            if fr.drain_pos == fr.drain_len || fr.drains.is_empty() {
                return Ok(progress);
            }
            let eb = fr.elem_bytes;
            let avail = ((fr.drain_len - fr.drain_pos) / eb) as u64;
            let fr = &mut self.fifos[f];
            let t = fr.drains.front_mut().expect("non-empty");
            let (task, arg, issued) = (t.task, t.arg, t.issued);
            if let Some((first, n)) = t.walker.next(avail) {
                let what = format!("drain task {task} of fifo {}", self.prog.fifos[f].name);
                let addr = self.host_range(arg, first, n, eb, &what)?;
                let fr = &mut self.fifos[f];
                let len = n as usize * eb;
                let src = &fr.drain_stage[fr.drain_pos..fr.drain_pos + len];
                // SAFETY: [addr, addr+len) is inside operand `arg`'s accessible range
                // (host_range), writable for the dispatch; `src` is a distinct Rust buffer.
                unsafe { std::ptr::copy(src.as_ptr(), addr as *mut u8, len) };
                fr.drain_pos += len;
                self.stats.bytes_written += len as u64;
                progress = true;
            }
            let fr = &mut self.fifos[f];
            if fr.drains.front().is_some_and(|t| t.walker.done) {
                fr.drains.pop_front();
                self.task_done[task] = true;
                self.task_t[task] = fr.drain_t.max(issued);
                progress = true;
            }
        }
    }

    // ------------------------------------------------------------------ DMA movers

    fn src_ready(&self, f: usize) -> bool {
        let fr = &self.fifos[f];
        match fr.src {
            Src::Shim => fr.fill_len == fr.obj_bytes,
            Src::Ring(r) => fr.sent < self.rings[r].filled,
            Src::Split { ring, index, .. } => {
                self.rings[ring].cursors[index] < self.rings[ring].filled
            }
        }
    }

    fn dst_ready(&self, f: usize, d: &Dst) -> bool {
        let fr = &self.fifos[f];
        match *d {
            Dst::Shim => fr.drain_pos == fr.drain_len,
            Dst::Ring(r) => {
                let g = &self.rings[r];
                g.filled < g.freed + g.depth
            }
            Dst::Join { ring, index, .. } => {
                let g = &self.rings[ring];
                g.cursors[index] < g.freed + g.depth
            }
        }
    }

    fn step_move(&mut self, f: usize) -> bool {
        let mut progress = false;
        while self.src_ready(f) && self.fifos[f].dsts.iter().all(|d| self.dst_ready(f, d)) {
            self.move_one(f);
            progress = true;
        }
        progress
    }

    /// When the transfer of fifo `f`'s next object ends: it starts once the object is full,
    /// every consumer has its buffer free and every channel it uses is idle, and moves at the
    /// slowest channel's rate (a shim's bytes also through the DRAM ledger).
    fn transfer_end(&mut self, f: usize) -> f64 {
        let fr = &self.fifos[f];
        let r = self.rates;
        let (mut start, mut rate) = match fr.src {
            Src::Shim => (fr.fill_t, r.shim_channel),
            Src::Ring(g) => {
                let g = &self.rings[g];
                (g.ready_t[g.idx(fr.sent)], r.tile_channel)
            }
            Src::Split { ring, index, .. } => {
                let g = &self.rings[ring];
                (g.ready_t[g.idx(g.cursors[index])], r.tile_channel)
            }
        };
        start = start.max(fr.prod_clock);
        for (c, d) in fr.dsts.iter().enumerate() {
            start = start.max(fr.cons_clock[c]);
            match *d {
                Dst::Shim => rate = rate.min(r.shim_channel),
                Dst::Ring(g) => {
                    let g = &self.rings[g];
                    start = start.max(g.free_t[g.idx(g.filled)]);
                    rate = rate.min(r.tile_channel);
                }
                Dst::Join { ring, index, .. } => {
                    let g = &self.rings[ring];
                    start = start.max(g.free_t[g.idx(g.cursors[index])]);
                    rate = rate.min(r.tile_channel);
                }
            }
        }
        let bytes = fr.obj_bytes as f64;
        let end = if fr.through_shim() {
            self.dram.transfer(&r, start, bytes, rate)
        } else {
            start + bytes / rate
        };
        let fr = &mut self.fifos[f];
        fr.busy += end - start;
        fr.prod_clock = end;
        fr.cons_clock.iter_mut().for_each(|c| *c = end);
        end
    }

    fn move_one(&mut self, f: usize) {
        let end = self.transfer_end(f);
        let (ob, eb) = (self.fifos[f].obj_bytes, self.fifos[f].elem_bytes);
        if self.fifos[f].through_shim() {
            self.shim_moves.push((end, ob as u64));
        }
        // The object as it goes over the stream.
        let raw: Vec<u8> = match self.fifos[f].src {
            Src::Shim => self.fifos[f].fill_stage.clone(),
            Src::Ring(r) => self.rings[r].slot(self.fifos[f].sent).to_vec(),
            Src::Split { ring, index, off } => {
                let g = &self.rings[ring];
                g.slot(g.cursors[index])[off..off + ob].to_vec()
            }
        };
        let stream = match &self.fifos[f].to_idx {
            None => raw,
            Some(idx) => {
                let mut s = vec![0u8; ob];
                for (j, &i) in idx.iter().enumerate() {
                    let i = i as usize;
                    s[j * eb..(j + 1) * eb].copy_from_slice(&raw[i * eb..(i + 1) * eb]);
                }
                s
            }
        };
        // Producer side done with the object.
        match self.fifos[f].src {
            Src::Shim => {
                let fr = &mut self.fifos[f];
                fr.fill_len = 0;
                fr.fill_t = 0.0;
                for task in fr.stage_tasks.drain(..) {
                    self.task_done[task] = true;
                    self.task_t[task] = end;
                }
            }
            Src::Ring(r) => {
                let g = &mut self.rings[r];
                let i = g.idx(g.freed);
                g.free_t[i] = end;
                g.freed += 1;
            }
            Src::Split { ring, index, .. } => {
                let g = &mut self.rings[ring];
                let i = g.idx(g.cursors[index]);
                g.free_t[i] = g.free_t[i].max(end);
                g.cursors[index] += 1;
                g.freed = g.cursors.iter().copied().min().unwrap_or(0);
            }
        }
        self.fifos[f].sent += 1;
        for c in 0..self.fifos[f].dsts.len() {
            let from_owned = self.fifos[f].from_idx[c].take();
            let from = from_owned.as_ref();
            let write = |dst: &mut [u8]| match from {
                None => dst.copy_from_slice(&stream),
                Some(idx) => {
                    for (j, &i) in idx.iter().enumerate() {
                        let i = i as usize;
                        dst[i * eb..(i + 1) * eb].copy_from_slice(&stream[j * eb..(j + 1) * eb]);
                    }
                }
            };
            match self.fifos[f].dsts[c] {
                Dst::Shim => {
                    let fr = &mut self.fifos[f];
                    write(&mut fr.drain_stage[..]);
                    fr.drain_pos = 0;
                    fr.drain_len = ob;
                    fr.drain_t = end;
                }
                Dst::Ring(r) => {
                    let g = &mut self.rings[r];
                    let abs = g.filled;
                    write(g.slot_mut(abs));
                    let i = g.idx(abs);
                    g.ready_t[i] = end;
                    g.filled += 1;
                }
                Dst::Join { ring, index, off } => {
                    let g = &mut self.rings[ring];
                    let abs = g.cursors[index];
                    write(&mut g.slot_mut(abs)[off..off + ob]);
                    let i = g.idx(abs);
                    g.ready_t[i] = g.ready_t[i].max(end);
                    g.cursors[index] += 1;
                    g.filled = g.cursors.iter().copied().min().unwrap_or(0);
                }
            }
            self.fifos[f].from_idx[c] = from_owned;
        }
    }

    // ------------------------------------------------------------------ workers

    fn port_ring(&self, w: usize, p: Port) -> usize {
        if p.prod {
            self.prod_ring[p.fifo].unwrap_or(0)
        } else {
            // The consumer endpoint of this fifo at the worker's tile.
            let tile = self.prog.workers[w].tile;
            let f = &self.prog.fifos[p.fifo];
            let c = f
                .consumers
                .iter()
                .position(|e| e.kind == EpKind::Core && e.tile == tile)
                .unwrap_or(0);
            self.cons_ring[p.fifo][c].unwrap_or(0)
        }
    }

    fn step_worker(&mut self, w: usize) -> Result<bool, String> {
        let code = &self.code[w];
        let mut progress = false;
        for _ in 0..STEP_BUDGET {
            if self.workers[w].done {
                return Ok(progress);
            }
            let pc = self.workers[w].pc;
            if pc >= code.len() {
                self.workers[w].done = true;
                return Ok(true);
            }
            match &code[pc] {
                Ins::LoopStart { count, end } => {
                    if *count == 0 {
                        self.workers[w].pc = end + 1;
                    } else {
                        self.workers[w].stack.push(*count);
                        self.workers[w].pc += 1;
                    }
                }
                Ins::LoopEnd { start } => {
                    let wr = &mut self.workers[w];
                    let top = wr.stack.last_mut().expect("balanced loops");
                    if *top != u64::MAX {
                        *top -= 1;
                    }
                    if *top == 0 {
                        wr.stack.pop();
                        wr.pc += 1;
                    } else {
                        wr.pc = start + 1;
                    }
                }
                Ins::Acquire { port, n, var } => {
                    let r = self.port_ring(w, *port);
                    let g = &mut self.rings[r];
                    let (base, ok) = if port.prod {
                        (g.filled, g.filled + n <= g.freed + g.depth)
                    } else {
                        (g.freed, g.freed + n <= g.filled)
                    };
                    if !ok {
                        return Ok(progress);
                    }
                    // A producer waits for its buffers' last occupants to be given back, a
                    // consumer for its objects to be full.
                    let t = if port.prod {
                        g.latest(&g.free_t, base, *n)
                    } else {
                        g.latest(&g.ready_t, base, *n)
                    };
                    let wr = &mut self.workers[w];
                    wr.clock = wr.clock.max(t);
                    let g = &mut self.rings[r];
                    g.claimed = g.claimed.max(base + n);
                    self.workers[w].vars[*var] = Some((r, base, port.prod));
                    self.workers[w].pc += 1;
                }
                Ins::Release { port, n } => {
                    let r = self.port_ring(w, *port);
                    let g = &mut self.rings[r];
                    let rel = if port.prod {
                        &mut g.filled
                    } else {
                        &mut g.freed
                    };
                    if *rel + n > g.claimed {
                        return Err(format!(
                            "worker at tile {:?} releases {n} object(s) of fifo {} it has not \
                             acquired",
                            self.prog.workers[w].tile, self.prog.fifos[port.fifo].name
                        ));
                    }
                    let first = *rel;
                    *rel += n;
                    let t = self.workers[w].clock;
                    for abs in first..first + n {
                        let i = g.idx(abs);
                        if port.prod {
                            g.ready_t[i] = t;
                        } else {
                            g.free_t[i] = t;
                        }
                    }
                    self.workers[w].pc += 1;
                }
                Ins::Call { kernel, args } => {
                    let mut words = [0u64; 16];
                    for (i, a) in args.iter().enumerate() {
                        words[i] = match *a {
                            Arg::I32(x) => x as u32 as u64,
                            Arg::Var { var, index } => {
                                let Some((r, base, prod)) = self.workers[w].vars[var] else {
                                    return Err(format!(
                                        "worker at tile {:?}: kernel call before its acquire",
                                        self.prog.workers[w].tile
                                    ));
                                };
                                let g = &mut self.rings[r];
                                let abs = base + index;
                                let held_from = if prod { g.filled } else { g.freed };
                                if abs < held_from || abs >= g.claimed {
                                    return Err(format!(
                                        "worker at tile {:?}: {} is called on an object it \
                                         no longer holds",
                                        self.prog.workers[w].tile, self.prog.kernels[*kernel].name
                                    ));
                                }
                                g.slot_mut(abs).as_mut_ptr() as u64
                            }
                        };
                    }
                    let lib = &self.libs[w];
                    let f = lib.entries[*kernel];
                    let before = lib.core_cycles();
                    // SAFETY: `f` is the wrapper of kernel `kernel` in this worker's own copy
                    // of the library; each buffer argument points at a live object buffer of
                    // the recorded size (Program::check matched it with the kernel's argument
                    // type), which the worker holds; no other reference to it is used during
                    // the call.
                    unsafe { f(words.as_ptr()) };
                    let cycles = lib.core_cycles().saturating_sub(before) as f64;
                    let wr = &mut self.workers[w];
                    wr.clock += cycles;
                    wr.busy += cycles;
                    wr.pc += 1;
                    let end = wr.clock;
                    self.core_calls.push((w, end, cycles));
                }
            }
            progress = true;
        }
        Ok(progress)
    }

    // ------------------------------------------------------------------ time

    /// The dispatch's time: the sequence's end or its last task's, whichever is later.
    fn timeline(&self) -> Timeline {
        let end = self.task_t.iter().copied().fold(self.seq_t, f64::max);
        let ns = |cycles: f64| (cycles * self.rates.cycle_ns).round() as u64;
        let max = |v: &mut dyn Iterator<Item = f64>| v.fold(0.0, f64::max);
        let busiest = |shim: bool| {
            max(&mut self
                .fifos
                .iter()
                .filter(|f| f.through_shim() == shim)
                .map(|f| f.busy))
        };
        // Each group's span: from the end of the one before (the dispatch's start) to its
        // own; moves after the last await end with the dispatch, as one more span. A call
        // ending after the dispatch (a worker's forever loop starting its next round, which
        // no drain waits for) is in no span.
        let moves = self.shim_moves.iter().filter(|&&(t, _)| t <= end);
        let calls = self.core_calls.iter().filter(|&&(_, t, _)| t <= end);
        let mut ends = self.group_ends.clone();
        let after_last = |t: f64| ends.last().is_none_or(|&e| t > e);
        if moves.clone().any(|&(t, _)| after_last(t))
            || calls.clone().any(|&(_, t, _)| after_last(t))
        {
            ends.push(end);
        }
        let mut groups: Vec<TaskGroupTime> = ends
            .iter()
            .map(|&t| TaskGroupTime {
                end_ns: ns(t),
                ..TaskGroupTime::default()
            })
            .collect();
        // The last span ends at or after every move and call (above).
        let span = |t: f64| ends.partition_point(|&e| e < t);
        for &(t, bytes) in moves {
            groups[span(t)].shim_bytes += bytes;
        }
        let mut busy = vec![vec![0.0; self.workers.len()]; groups.len()];
        for &(w, t, cycles) in calls {
            busy[span(t)][w] += cycles;
        }
        for (g, per_core) in groups.iter_mut().zip(&mut busy) {
            g.core_busy_ns = ns(max(&mut per_core.iter().copied()));
        }
        Timeline {
            device_ns: ns(end),
            core_busy_ns: ns(max(&mut self.workers.iter().map(|w| w.busy))),
            shim_busy_ns: ns(busiest(true)),
            tile_busy_ns: ns(busiest(false)),
            cores_counted: self.libs.iter().all(|l| l.counts_cycles()),
            groups,
        }
    }

    // ------------------------------------------------------------------ diagnostics

    fn deadlock(&self) -> String {
        let mut waits = Vec::new();
        for (w, wr) in self.workers.iter().enumerate() {
            if wr.done {
                continue;
            }
            if let Some(Ins::Acquire { port, n, .. }) = self.code[w].get(wr.pc) {
                let f = &self.prog.fifos[port.fifo];
                waits.push(format!(
                    "worker at tile {:?} waits to acquire {n} object(s) of fifo {} ({} side)",
                    self.prog.workers[w].tile,
                    f.name,
                    if port.prod { "producer" } else { "consumer" }
                ));
            }
        }
        for (f, fr) in self.fifos.iter().enumerate() {
            let name = &self.prog.fifos[f].name;
            if let Some(t) = fr.fills.front() {
                waits.push(format!(
                    "fill task {} waits for fifo {name} to take an object",
                    t.task
                ));
            }
            if let Some(t) = fr.drains.front() {
                waits.push(format!(
                    "drain task {} waits for data from fifo {name}",
                    t.task
                ));
            }
            if self.src_ready(f) {
                let blocked: Vec<String> = fr
                    .dsts
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| !self.dst_ready(f, d))
                    .map(|(c, _)| {
                        let e = &self.prog.fifos[f].consumers[c];
                        format!("{:?} at tile {:?}", e.kind, e.tile).to_lowercase()
                    })
                    .collect();
                waits.push(format!(
                    "fifo {name} holds an object its consumer(s) {} have no room for",
                    blocked.join(", ")
                ));
            }
        }
        if let Some(SeqOp::Await { tasks }) = self.prog.sequence.get(self.seq_pc) {
            waits.push(format!("the runtime sequence awaits tasks {tasks:?}"));
        }
        format!(
            "IRON emulation of kernel {}: deadlock: no DMA, core or sequence step can proceed; {}",
            self.prog.name,
            waits.join("; ")
        )
    }
}
