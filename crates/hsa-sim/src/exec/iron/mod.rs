//! The IRON emulation executor: runs image version 2 (the dataflow an IRON design recorded,
//! plus its core kernels compiled for the host) over a dispatch's operands, as the NPU would:
//! shim DMA tasks walk the operands along the runtime sequence's access patterns, memory-tile
//! links split and join objects, each compute tile runs its Worker body with its own copy of
//! the kernel library. See `sched` for the scheduler and `program` for the format.
//!
//! Loaded programs (parsed JSON, one library copy per worker) are cached by payload hash
//! across dispatches, at most [`CACHE_PROGRAMS`] of them (least recently used evicted).

pub mod dl;
pub mod program;
pub mod sched;
pub mod timing;

use crate::exec::{ExecStats, OperandMem};
use parking_lot::Mutex;
use program::Program;
use std::sync::Arc;

pub const CACHE_PROGRAMS: usize = 48;

/// A program ready to run: its description, flattened worker bodies and per-core libraries.
#[derive(Debug)]
pub struct Loaded {
    pub program: Program,
    code: Vec<Vec<sched::Ins>>,
    libs: Vec<dl::CoreLib>,
}

impl std::fmt::Debug for sched::Sim<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sim")
    }
}

type Cache = Vec<(u64, Arc<Mutex<Loaded>>)>;
static CACHE: Mutex<Cache> = Mutex::new(Vec::new());

/// Parses and loads an image version 2 (its program JSON and core library), or returns the
/// one loaded before (keyed by the payload's hash).
pub fn load(image: &[u8]) -> Result<Arc<Mutex<Loaded>>, String> {
    let (json, library) = crate::image::split_image_v2(image)?;
    let hash = crate::image::fnv1a64(&image[crate::image::IMAGE_V2_HEADER_LEN..]);
    {
        let mut c = CACHE.lock();
        if let Some(i) = c.iter().position(|(h, _)| *h == hash) {
            let e = c.remove(i);
            let l = e.1.clone();
            c.push(e);
            return Ok(l);
        }
    }
    let text = std::str::from_utf8(json)
        .map_err(|_| "emulation image: program is not UTF-8".to_string())?;
    let program = Program::parse(text).map_err(|e| format!("emulation image: {e}"))?;
    let symbols: Vec<String> = program.kernels.iter().map(|k| k.symbol.clone()).collect();
    let mut libs = Vec::with_capacity(program.workers.len());
    for _ in &program.workers {
        libs.push(dl::CoreLib::load(library, &symbols)?);
    }
    let code = program
        .workers
        .iter()
        .map(|w| {
            let mut out = Vec::new();
            sched::flatten(&w.body, &mut out);
            out
        })
        .collect();
    let loaded = Arc::new(Mutex::new(Loaded {
        program,
        code,
        libs,
    }));
    let mut c = CACHE.lock();
    if c.len() >= CACHE_PROGRAMS {
        c.remove(0);
    }
    c.push((hash, loaded.clone()));
    Ok(loaded)
}

/// [`execute`] over operand buffers the caller owns, one per runtime-sequence argument.
pub fn execute_buffers(
    loaded: &Loaded,
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
    unsafe { execute(loaded, &operands, rates) }
}

/// Runs a loaded program over `operands` (the runtime-sequence arguments in order).
///
/// # Safety
/// Every operand range `[addr, addr + len)` must be valid for reads and writes for the
/// duration of the call; operands may overlap (in-place ops): the DMA walkers access them in
/// the order the NPU would, through raw copies.
pub unsafe fn execute(
    loaded: &Loaded,
    operands: &[OperandMem],
    rates: timing::Rates,
) -> Result<ExecStats, String> {
    let p = &loaded.program;
    if operands.len() != p.args.len() {
        return Err(format!(
            "kernel {} takes {} operands, the dispatch has {}",
            p.name,
            p.args.len(),
            operands.len()
        ));
    }
    sched::Sim::new(p, &loaded.code, &loaded.libs, operands, rates).run()
}
