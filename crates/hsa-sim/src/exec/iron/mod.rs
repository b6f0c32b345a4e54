//! The IRON emulation executor: runs image version 2 (the dataflow an IRON design recorded,
//! plus its core kernels compiled for the host) over a dispatch's operands, as the NPU would:
//! shim DMA tasks walk the operands along the runtime sequence's access patterns, memory-tile
//! links split and join objects, each compute tile runs its Worker body with its own copy of
//! the kernel library. See `sched` for the scheduler and `program` for the format.
//!
//! Loaded programs (one library copy per worker, the parsed template of a program with run-time
//! parameters) are cached by payload hash across dispatches, at most [`CACHE_PROGRAMS`] of them
//! (least recently used evicted); each keeps its programs instantiated at the last
//! [`CACHE_INSTANCES`] value vectors, so a dispatch at a new value loads no library.

pub mod dl;
pub mod params;
pub mod program;
pub mod sched;
pub mod timing;

use crate::exec::{ExecStats, OperandMem};
use parking_lot::Mutex;
use program::Program;
use std::sync::Arc;

pub const CACHE_PROGRAMS: usize = 48;
/// Instantiated programs kept per loaded image besides its base (a few: a model's decode steps
/// walk n_kv upwards, so recent values repeat while older ones do not).
pub const CACHE_INSTANCES: usize = 8;

/// A concrete program (every run-time parameter substituted) and its flattened worker bodies.
#[derive(Debug)]
pub struct Instance {
    pub program: Program,
    code: Vec<Vec<sched::Ins>>,
}

impl Instance {
    fn new(program: Program) -> Instance {
        let code = program
            .workers
            .iter()
            .map(|w| {
                let mut out = Vec::new();
                sched::flatten(&w.body, &mut out);
                out
            })
            .collect();
        Instance { program, code }
    }
}

/// A program ready to run: its base instance (the program itself, or a parametric one at every
/// param's minimum), its template, recent instances and per-core libraries.
#[derive(Debug)]
pub struct Loaded {
    base: Arc<Instance>,
    base_values: Vec<u32>,
    template: Option<params::Template>,
    /// Least recently used first.
    instances: Vec<(Vec<u32>, Arc<Instance>)>,
    libs: Vec<dl::CoreLib>,
}

impl Loaded {
    /// The program at its base values. Its name, arch, arguments, kernels and workers' tiles
    /// are every instance's: expressions may only be in the sequence's taps and the workers'
    /// loop counts and i32 arguments.
    pub fn program(&self) -> &Program {
        &self.base.program
    }

    /// The runtime sequence's scalar parameters (empty for most programs).
    pub fn params(&self) -> &[params::ParamDef] {
        self.template.as_ref().map_or(&[], |t| t.params())
    }

    /// Checks a dispatch's parameter values (see [`params::check_values`]).
    pub fn check_values(&self, values: &[u32]) -> Result<(), String> {
        params::check_values(&self.base.program.name, self.params(), values)
    }

    /// The program instantiated at `values`, from the cache or made now.
    pub fn instance(&mut self, values: &[u32]) -> Result<Arc<Instance>, String> {
        self.check_values(values)?;
        if values == self.base_values.as_slice() {
            return Ok(self.base.clone());
        }
        if let Some(i) = self.instances.iter().position(|(v, _)| v == values) {
            let e = self.instances.remove(i);
            let inst = e.1.clone();
            self.instances.push(e);
            return Ok(inst);
        }
        let Some(t) = &self.template else {
            // check_values admits only the base values (none) for a program without params.
            return Ok(self.base.clone());
        };
        let name = &self.base.program.name;
        let inst = t
            .instantiate(values)
            .map_err(|e| format!("kernel {name}: {e}"))?;
        self.admit(values, inst)
    }

    /// Caches `program` as the instance at `values`, after checking that it runs on the
    /// loaded libraries (one per worker, resolving the base's kernels).
    fn admit(&mut self, values: &[u32], program: Program) -> Result<Arc<Instance>, String> {
        let base = &self.base.program;
        if program.workers.len() != base.workers.len()
            || program.kernels.len() != base.kernels.len()
        {
            return Err(format!(
                "kernel {}: at values {values:?} the program has {} workers and {} kernels, \
                 at {:?} {} and {}",
                base.name,
                program.workers.len(),
                program.kernels.len(),
                self.base_values,
                base.workers.len(),
                base.kernels.len()
            ));
        }
        let inst = Arc::new(Instance::new(program));
        if self.instances.len() >= CACHE_INSTANCES {
            self.instances.remove(0);
        }
        self.instances.push((values.to_vec(), inst.clone()));
        Ok(inst)
    }
}

impl std::fmt::Debug for sched::Sim<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sim")
    }
}

type Cache = Vec<(u64, Arc<Mutex<Loaded>>)>;
static CACHE: Mutex<Cache> = Mutex::new(Vec::new());

/// The program loaded from the image of payload hash `hash`, made the most recently used.
fn cached(c: &mut Cache, hash: u64) -> Option<Arc<Mutex<Loaded>>> {
    let i = c.iter().position(|(h, _)| *h == hash)?;
    let e = c.remove(i);
    let l = e.1.clone();
    c.push(e);
    Some(l)
}

/// Parses and loads an image version 2 (its program JSON and core library), or returns the
/// one loaded before (keyed by the payload's hash). A program with run-time parameters is
/// checked as a template and instantiated at every param's minimum and maximum, so that a
/// malformed one fails here rather than at some dispatch.
pub fn load(image: &[u8]) -> Result<Arc<Mutex<Loaded>>, String> {
    let (json, library) = crate::image::split_image_v2(image)?;
    let hash = crate::image::fnv1a64(&image[crate::image::IMAGE_V2_HEADER_LEN..]);
    if let Some(l) = cached(&mut CACHE.lock(), hash) {
        return Ok(l);
    }
    let text = std::str::from_utf8(json)
        .map_err(|_| "emulation image: program is not UTF-8".to_string())?;
    let bad = |e: String| format!("emulation image: {e}");
    let template = params::Template::parse(text).map_err(bad)?;
    let (program, base_values, top) = match &template {
        None => (Program::parse(text).map_err(bad)?, Vec::new(), None),
        Some(t) => {
            let (low, high) = (t.min_values(), t.max_values());
            let program = t.instantiate(&low).map_err(bad)?;
            // Taps grow with the params: the top of their range is where a design's walks
            // would leave their operands, checked before any library is loaded.
            let top = if high != low {
                Some((t.instantiate(&high).map_err(bad)?, high))
            } else {
                None
            };
            (program, low, top)
        }
    };
    let symbols: Vec<String> = program.kernels.iter().map(|k| k.symbol.clone()).collect();
    let mut libs = Vec::with_capacity(program.workers.len());
    for _ in &program.workers {
        libs.push(dl::CoreLib::load(library, &symbols)?);
    }
    let mut loaded = Loaded {
        base: Arc::new(Instance::new(program)),
        base_values,
        template,
        instances: Vec::new(),
        libs,
    };
    if let Some((p, high)) = top {
        loaded.admit(&high, p).map_err(bad)?;
    }
    let loaded = Arc::new(Mutex::new(loaded));
    let mut c = CACHE.lock();
    // Another thread may have loaded the same image meanwhile: every caller gets that one.
    if let Some(l) = cached(&mut c, hash) {
        return Ok(l);
    }
    if c.len() >= CACHE_PROGRAMS {
        c.remove(0);
    }
    c.push((hash, loaded.clone()));
    Ok(loaded)
}

/// [`execute`] over operand buffers the caller owns, one per runtime-sequence argument.
pub fn execute_buffers(
    loaded: &mut Loaded,
    values: &[u32],
    buffers: &mut [Vec<u8>],
    rates: timing::Rates,
) -> Result<ExecStats, String> {
    let operands: Vec<OperandMem> = buffers
        .iter_mut()
        .map(|v| OperandMem {
            addr: v.as_mut_ptr() as usize,
            len: v.len(),
        })
        .collect();
    // SAFETY: each range covers a distinct Vec borrowed mutably for the whole call.
    unsafe { execute(loaded, values, &operands, rates) }
}

/// Runs a loaded program at the run-time parameter `values` (one per param, in order; none
/// for a program without params) over `operands` (the runtime-sequence arguments in order).
///
/// # Safety
/// Every operand range `[addr, addr + len)` must be valid for reads and writes for the
/// duration of the call; operands may overlap (in-place ops): the DMA walkers access them in
/// the order the NPU would, through raw copies.
pub unsafe fn execute(
    loaded: &mut Loaded,
    values: &[u32],
    operands: &[OperandMem],
    rates: timing::Rates,
) -> Result<ExecStats, String> {
    let inst = loaded.instance(values)?;
    let p = &inst.program;
    if operands.len() != p.args.len() {
        return Err(format!(
            "kernel {} takes {} operands, the dispatch has {}",
            p.name,
            p.args.len(),
            operands.len()
        ));
    }
    sched::Sim::new(p, &inst.code, &loaded.libs, operands, rates).run()
}
