//! AIE queues and the synchronous doorbell.
//!
//! A queue is a 64-slot ring of 64-byte packets (allocated from the agent's kernarg pool, like
//! ROCR's XDNA BO) with private 64-bit read/write indices. Storing any value to the queue's
//! doorbell signal processes packets `read_index .. write_index-1` on the calling thread, in
//! order, and then sets `read_index = write_index` (as ROCR's `amd_aie_aql_queue.cpp` does). Consecutive START_CUs behind one
//! doorbell form command chains.

use crate::agents::PoolKind;
use crate::consts::*;
use crate::cost;
use crate::exec::{self, OperandMem};
use crate::faults::DispatchFault;
use crate::image;
use crate::memory::MemoryTable;
use crate::packet::{self, Command, DecodeCtx, PacketError, PacketFormat};
use crate::runtime::Runtime;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// `hsa_queue_t` (40 bytes, align 8).
#[repr(C)]
#[derive(Debug)]
pub struct HsaQueue {
    pub type_: u32,
    pub features: u32,
    pub base_address: u64,
    pub doorbell_signal: u64,
    pub size: u32,
    pub reserved1: u32,
    pub id: u64,
}

/// The error callback given to `hsa_queue_create`.
pub type ErrorCallback = unsafe extern "C" fn(Status, *mut HsaQueue, *mut c_void);

#[derive(Debug, Default)]
pub struct QueueState {
    /// Allocation ids of the PDIs configured in the hardware context, in load order.
    pub pdi_cache: Vec<u64>,
    /// Set when the queue is in an error state: every doorbell fails with this status.
    pub error: Option<Status>,
    /// Set when a dispatch hung (HSA_SIM_HANG_DISPATCH): doorbells do nothing any more.
    pub hung: bool,
    /// ABI c (ROCR's `AieAqlQueue::suspended_`): a packet failed, the error callback was
    /// called, and every later doorbell is ignored (signals of unprocessed packets never drop).
    pub suspended: bool,
    /// Cost model: the PDI of the last command run, whether the current command switched PDI,
    /// and whether the current batch already rebuilt the hardware context.
    pub last_pdi: Option<u64>,
    pub pdi_switched: bool,
    pub batch_rebuilt: bool,
}

#[derive(Debug)]
pub struct Queue {
    /// Address of the boxed public `hsa_queue_t` handed to the client.
    pub public_addr: usize,
    /// Index of the agent in the topology.
    pub agent: usize,
    pub ring: usize,
    pub doorbell: u64,
    pub size: u32,
    pub read_index: AtomicU64,
    pub write_index: AtomicU64,
    callback: Option<ErrorCallback>,
    callback_data: usize,
    pub state: Mutex<QueueState>,
    submit: Mutex<()>,
}

impl Queue {
    /// Creates the queue object; the ring and doorbell are allocated by the caller.
    pub fn new(
        id: u64,
        agent: usize,
        ring: usize,
        doorbell: u64,
        callback: Option<ErrorCallback>,
        callback_data: usize,
    ) -> Queue {
        let public = Box::new(HsaQueue {
            type_: HSA_QUEUE_TYPE_SINGLE,
            features: 0,
            base_address: ring as u64,
            doorbell_signal: doorbell,
            size: AIE_QUEUE_SIZE,
            reserved1: 0,
            id,
        });
        Queue {
            public_addr: Box::into_raw(public) as usize,
            agent,
            ring,
            doorbell,
            size: AIE_QUEUE_SIZE,
            read_index: AtomicU64::new(0),
            write_index: AtomicU64::new(0),
            callback,
            callback_data,
            state: Mutex::new(QueueState::default()),
            submit: Mutex::new(()),
        }
    }

    pub fn public_ptr(&self) -> *mut HsaQueue {
        self.public_addr as *mut HsaQueue
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: public_addr came from Box::into_raw in Queue::new and is released only here.
        drop(unsafe { Box::from_raw(self.public_addr as *mut HsaQueue) });
    }
}

/// How one packet ended.
enum Outcome {
    Done {
        operands: usize,
        completion_signal: u64,
    },
    Failed(PacketError),
    Hang,
}

/// Processes one doorbell store on `q`.
pub fn ring_doorbell(rt: &Runtime, q: &Queue) {
    let mut errors: Vec<PacketError> = Vec::new();
    {
        let _submit = q.submit.lock();
        rt.counters.lock().doorbells += 1;
        let enter_error = rt.faults.doorbell_enters_error_state(&rt.config);
        let mut st = q.state.lock();
        let read = q.read_index.load(Ordering::Acquire);
        let write = q.write_index.load(Ordering::Acquire);
        let fmt = packet::format_for(rt.config.packet_abi);
        let suspends = fmt.abi() == crate::config::PacketAbi::C;
        if st.hung {
            rt.log(&format!(
                "queue {:#x}: doorbell ignored, a dispatch hung (HSA_SIM_HANG_DISPATCH)",
                q.public_addr
            ));
        } else if st.suspended {
            rt.log(&format!(
                "queue {:#x}: doorbell ignored, the queue is suspended after an error",
                q.public_addr
            ));
        } else if suspends && (enter_error || st.error.is_some()) {
            // ROCR's generation-c queue: the failing batch suspends the queue; nothing ran, so
            // no signal drops and the read index stays.
            rt.counters.lock().injected_faults += u64::from(enter_error);
            st.suspended = true;
            errors.push(PacketError {
                status: st.error.unwrap_or(HSA_STATUS_ERROR_FATAL),
                msg: "queue is in an error state (HSA_SIM_ERROR_STATE); queue suspended".into(),
            });
        } else {
            if enter_error && st.error.is_none() {
                st.error = Some(HSA_STATUS_ERROR_FATAL);
                rt.counters.lock().injected_faults += 1;
            }
            if let Some(status) = st.error {
                errors.push(PacketError {
                    status,
                    msg: "queue is in an error state (HSA_SIM_ERROR_STATE); doorbell refused"
                        .into(),
                });
                fail_packets(rt, q, fmt, read, write);
                q.read_index.store(write.max(read), Ordering::Release);
            } else if write < read || write - read > q.size as u64 {
                errors.push(PacketError {
                    status: HSA_STATUS_ERROR_INVALID_PACKET_FORMAT,
                    msg: format!(
                        "write index {write} is not within one ring ({} slots) of read index {read}",
                        q.size
                    ),
                });
                q.read_index.store(write.max(read), Ordering::Release);
            } else {
                process(rt, q, &mut st, fmt, read, write, &mut errors);
            }
        }
    }
    {
        let mut c = rt.counters.lock();
        c.dispatch_errors += errors.len() as u64;
        if let Some(e) = errors.last() {
            c.last_error = e.msg.clone();
        }
    }
    rt.write_counters();
    for e in errors {
        rt.log(&format!(
            "queue {:#x}: dispatch error {:#x}: {}",
            q.public_addr, e.status, e.msg
        ));
        if let Some(cb) = q.callback {
            // SAFETY: `cb` is the error callback the client passed to hsa_queue_create, called
            // with the documented (status, queue, data) arguments and no runtime lock held.
            unsafe { cb(e.status, q.public_ptr(), q.callback_data as *mut c_void) };
        }
    }
}

fn read_slot(mem: &MemoryTable, q: &Queue, index: u64) -> Option<[u8; PACKET_SIZE]> {
    let addr = q.ring + (index % q.size as u64) as usize * PACKET_SIZE;
    let v = mem.read(addr, PACKET_SIZE)?;
    let mut slot = [0u8; PACKET_SIZE];
    slot.copy_from_slice(&v);
    Some(slot)
}

/// Marks the completion signals of packets `from..to` as failed (-1), for ABIs that have one.
fn fail_packets(rt: &Runtime, q: &Queue, fmt: &dyn PacketFormat, from: u64, to: u64) {
    let mem = rt.memory.lock();
    for idx in from..to {
        rt.counters.lock().packets += 1;
        if let Some(slot) = read_slot(&mem, q, idx) {
            let h = fmt.completion_signal_field(&slot);
            if h != 0 {
                if let Some(s) = rt.signal(h) {
                    s.store(-1);
                }
            }
        }
    }
}

fn process(
    rt: &Runtime,
    q: &Queue,
    st: &mut crate::queue::QueueState,
    fmt: &dyn PacketFormat,
    read: u64,
    write: u64,
    errors: &mut Vec<PacketError>,
) {
    let mut model = cost::model_for(&rt.topo.agents[q.agent].name);
    if let Some(bw) = rt.config.dram_bytes_per_s {
        model.bandwidth_bytes_per_s = bw as f64;
    }
    let mut chain_bytes: Option<usize> = None;
    // ROCR rebuilds the hardware context once for a batch that brings new PDIs.
    st.batch_rebuilt = false;
    for idx in read..write {
        let outcome = {
            let mem = rt.memory.lock();
            match read_slot(&mem, q, idx) {
                None => Outcome::Failed(PacketError::format("queue ring is not readable")),
                Some(slot) => run_packet(rt, q, st, fmt, &mem, &slot, &model),
            }
        };
        match outcome {
            Outcome::Done {
                operands,
                completion_signal,
            } => {
                rt.counters.lock().packets += 1;
                let slot_bytes = cost::chain_slot_bytes(operands);
                let new_chain = match chain_bytes {
                    Some(b) => b + slot_bytes > cost::CHAIN_BUFFER_BYTES,
                    None => true,
                };
                {
                    let mut c = rt.counters.lock();
                    if new_chain {
                        chain_bytes = Some(slot_bytes);
                        c.chains += 1;
                    } else {
                        chain_bytes = chain_bytes.map(|b| b + slot_bytes);
                    }
                    let dispatch = model.dispatch_ns(new_chain, st.pdi_switched) as u64;
                    c.device_time_ns += dispatch;
                    c.dispatch_time_ns += dispatch;
                    if !new_chain && st.pdi_switched {
                        c.pdi_switches += 1;
                    }
                }
                if completion_signal != 0 {
                    match rt.signal(completion_signal) {
                        Some(s) => s.sub(1),
                        None => errors.push(PacketError {
                            status: HSA_STATUS_ERROR_INVALID_SIGNAL,
                            msg: format!(
                                "packet {idx}: completion signal {completion_signal:#x} does not exist"
                            ),
                        }),
                    }
                }
            }
            Outcome::Hang => {
                // The packet never completes: the read index stays on it and the queue stops.
                q.read_index.store(idx, Ordering::Release);
                st.hung = true;
                rt.counters.lock().injected_faults += 1;
                rt.log(&format!(
                    "queue {:#x}: packet {idx} hangs (HSA_SIM_HANG_DISPATCH); read index stays at {idx}",
                    q.public_addr
                ));
                return;
            }
            Outcome::Failed(mut e) => {
                e.msg = format!("packet {idx}: {}", e.msg);
                errors.push(e);
                if fmt.abi() == crate::config::PacketAbi::C {
                    // ROCR's generation-c queue: the read index advances by the packets that
                    // ran, the queue is suspended, unprocessed packets keep their signals.
                    st.suspended = true;
                    q.read_index.store(idx, Ordering::Release);
                    return;
                }
                // The failed packet and everything behind it in this doorbell are consumed but
                // not executed; their completion signals (if the ABI has them) are set to -1.
                fail_packets(rt, q, fmt, idx, write);
                break;
            }
        }
    }
    q.read_index.store(write, Ordering::Release);
}

fn run_packet(
    rt: &Runtime,
    q: &Queue,
    st: &mut QueueState,
    fmt: &dyn PacketFormat,
    mem: &MemoryTable,
    slot: &[u8; PACKET_SIZE],
    model: &cost::ArchModel,
) -> Outcome {
    let ctx = DecodeCtx {
        mem,
        topo: &rt.topo,
        code: &rt.code,
    };
    let cmd = match fmt.decode(slot, &ctx) {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(e),
    };
    match prepare_and_execute(rt, q, st, mem, &cmd, model) {
        Ok(Some(())) => Outcome::Done {
            operands: cmd.operands.len(),
            completion_signal: cmd.completion_signal,
        },
        Ok(None) => Outcome::Hang,
        Err(e) => Outcome::Failed(e),
    }
}

/// Resolves a dev-heap buffer of this queue's agent.
/// The fault `HSA_SIM_FAIL_DISPATCH` / `HSA_SIM_HANG_DISPATCH` inject into this dispatch of
/// kernel `name`: an error, `true` for a dispatch that never completes, `false` for none.
fn injected_fault(rt: &Runtime, name: &str) -> Result<bool, PacketError> {
    match rt.faults.next_dispatch(&rt.config) {
        DispatchFault::None => Ok(false),
        DispatchFault::Fail => {
            rt.counters.lock().injected_faults += 1;
            Err(PacketError {
                status: HSA_STATUS_ERROR,
                msg: format!("dispatch of kernel {name} failed: injected by HSA_SIM_FAIL_DISPATCH"),
            })
        }
        DispatchFault::Hang => Ok(true),
    }
}

/// The live AIE-pool allocation holding operand `i`'s whole byte range.
fn operand_allocation<'m>(
    rt: &Runtime,
    mem: &'m MemoryTable,
    i: usize,
    o: &crate::packet::Operand,
) -> Result<&'m crate::memory::Allocation, PacketError> {
    let a = mem
        .lookup_range(o.addr as usize, o.size.max(1) as usize)
        .ok_or_else(|| {
            PacketError::allocation(format!(
                "operand {i} at {:#x} ({} bytes) is not inside a live allocation",
                o.addr, o.size
            ))
        })?;
    if !rt.topo.pools[a.pool].kind.is_aie() {
        return Err(PacketError::allocation(format!(
            "operand {i} at {:#x} is CPU-agent memory; operands must come from AIE pools",
            o.addr
        )));
    }
    Ok(a)
}

fn dev_heap_alloc<'m>(
    rt: &Runtime,
    q: &Queue,
    mem: &'m MemoryTable,
    what: &str,
    addr: u64,
    len: u64,
) -> Result<&'m crate::memory::Allocation, PacketError> {
    let a = mem
        .lookup_range(addr as usize, len.max(1) as usize)
        .ok_or_else(|| {
            let mut m =
                format!("{what} at {addr:#x} ({len} bytes) is not inside a live allocation");
            if what == "instruction buffer" && (addr as u32 & 0xFC00_0000) == INSTS_DEVICE_BASE {
                m.push_str(
                    "; its low word looks like an instruction device address: the runtime \
                     rewrites payload data[2] at every dispatch, so payloads must be refilled \
                     before they are submitted again",
                );
            }
            PacketError::allocation(m)
        })?;
    let pool = &rt.topo.pools[a.pool];
    if pool.kind != PoolKind::AieDevHeap || pool.agent != q.agent {
        return Err(PacketError::allocation(format!(
            "{what} at {addr:#x} is not in this agent's dev-heap pool (pool 1: coarse-grained, \
             recommended granule 0); PDIs and instruction streams must live there"
        )));
    }
    Ok(a)
}

/// Everything after decoding: address resolution, payload rewrite, image checks, PDI cache,
/// fault injection, execution. `Ok(None)` = the dispatch hangs.
fn prepare_and_execute(
    rt: &Runtime,
    q: &Queue,
    st: &mut QueueState,
    mem: &MemoryTable,
    cmd: &Command,
    model: &cost::ArchModel,
) -> Result<Option<()>, PacketError> {
    // 1. Instruction buffer (ROCR resolves it first, then rewrites data[2]).
    if cmd.insts_bytes == 0 {
        return Err(PacketError::format("instruction size is 0"));
    }
    dev_heap_alloc(
        rt,
        q,
        mem,
        "instruction buffer",
        cmd.insts_addr,
        cmd.insts_bytes,
    )?;
    let insts = mem
        .read(cmd.insts_addr as usize, cmd.insts_bytes as usize)
        .ok_or_else(|| PacketError::allocation("instruction buffer is unreadable"))?;
    if let Some(word) = cmd.insts_word_addr {
        let dev = INSTS_DEVICE_BASE | (cmd.insts_addr & INSTS_DEVICE_MASK) as u32;
        if !mem.write(word, &dev.to_le_bytes()) {
            return Err(PacketError::allocation(
                "payload word data[2] is not writable",
            ));
        }
    }
    // 2. PDI.
    let pdi_alloc = dev_heap_alloc(rt, q, mem, "PDI", cmd.pdi_addr, 1)?;
    let pdi_id = pdi_alloc.id;
    let avail = pdi_alloc.end() - cmd.pdi_addr as usize;
    let header = mem
        .read(cmd.pdi_addr as usize, image::IMAGE_V2_HEADER_LEN.min(avail))
        .unwrap_or_default();
    let bad_image = |m: String| PacketError {
        status: HSA_STATUS_ERROR,
        msg: m,
    };
    let total = image::image_len_from_header(&header).map_err(bad_image)?;
    if total > avail {
        return Err(bad_image(format!(
            "simulator image needs {total} bytes but its allocation ends {avail} bytes after pdi_addr"
        )));
    }
    let img = mem
        .read(cmd.pdi_addr as usize, total)
        .ok_or_else(|| PacketError::allocation("PDI is unreadable"))?;
    if image::image_version(&img).map_err(bad_image)? == image::IMAGE_V2 {
        return run_emulated(rt, q, st, mem, cmd, model, &img, &insts, pdi_id);
    }
    let (desc, op) = image::parse_image(&img).map_err(bad_image)?;
    // A kernel taking its KV length at dispatch computes what the fixed one of that length
    // does: the stream's one run-time value.
    let values = image::insts_values(&insts);
    let takes_n_kv = desc.n_kv_step.is_some();
    let (desc, op) = match (desc.n_kv_step, values.as_slice()) {
        (Some(_), &[n_kv]) => {
            let d = desc.at_n_kv(n_kv).map_err(bad_image)?;
            let op = d.validate().map_err(|e| bad_image(e.to_string()))?;
            (d, op)
        }
        (Some(_), _) => {
            return Err(bad_image(format!(
                "kernel {} takes its KV length at dispatch: the instruction stream carries {} \
                 value(s), not one",
                desc.name,
                values.len()
            )))
        }
        (None, _) => (desc, op),
    };
    let agent_name = &rt.topo.agents[q.agent].name;
    if &desc.arch != agent_name {
        return Err(bad_image(format!(
            "kernel {} was compiled for {} but the queue's agent is {agent_name}",
            desc.name, desc.arch
        )));
    }
    image::check_insts(&insts, &img).map_err(bad_image)?;
    // Run-time parameters are a version-2 program's; a reference image takes n_kv at most.
    if !takes_n_kv && !values.is_empty() {
        return Err(bad_image(format!(
            "kernel {} takes no run-time parameters, the instruction stream carries {} value(s)",
            desc.name,
            values.len()
        )));
    }
    // 3. Operands: inputs in order, then the output(s).
    let tensors: Vec<&image::TensorDesc> = desc.operands().collect();
    if cmd.operands.len() != tensors.len() {
        return Err(PacketError::format(format!(
            "kernel {} takes {} operands ({} input(s) then {} output(s)), the packet has {}",
            desc.name,
            tensors.len(),
            desc.inputs.len(),
            1 + desc.extra_outputs.len(),
            cmd.operands.len()
        )));
    }
    let mut mems = Vec::with_capacity(tensors.len());
    for (i, (o, t)) in cmd.operands.iter().zip(&tensors).enumerate() {
        operand_allocation(rt, mem, i, o)?;
        if o.size < t.extent() {
            return Err(PacketError::format(format!(
                "operand {i}: size {} bytes is smaller than the tensor's extent {} bytes",
                o.size,
                t.extent()
            )));
        }
        mems.push(OperandMem {
            addr: o.addr as usize,
            len: o.size as usize,
        });
    }
    // 4. PDI cache / hardware context.
    note_pdi(rt, st, pdi_id, &desc.name, model)?;
    // 5. Fault injection.
    if injected_fault(rt, &desc.name)? {
        return Ok(None);
    }
    // 6. Execute (or, with HSA_SIM_EXECUTE=0, only count what it would do).
    let stats = if rt.config.execute {
        // SAFETY: every operand range was resolved inside a live allocation of `mem`, whose lock
        // the caller holds for the duration, so the memory can be neither freed nor
        // reallocated, and each range is at least its tensor's extent.
        unsafe { exec::execute(&desc, op, &mems) }.map_err(|m| PacketError {
            status: HSA_STATUS_ERROR,
            msg: m,
        })?
    } else {
        exec::stats_of(&desc, op)
    };
    let integer = desc.inputs.iter().all(|t| {
        use crate::ops::DType;
        matches!(t.ty, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    });
    charge(rt, &stats, model, integer, &desc.name, Some(&desc));
    Ok(Some(()))
}

/// Counts an executed command and charges its work to the device time: an emulated IRON
/// design's dataflow time when it ran, else the roofline of its bytes and arithmetic (which is
/// also summed alone, as the bound beside the dataflow times), and tallies it as one more
/// dispatch of kernel `name` (`Counters::kernels`, with its request where the image has one).
fn charge(
    rt: &Runtime,
    stats: &exec::ExecStats,
    model: &cost::ArchModel,
    integer: bool,
    name: &str,
    request: Option<&image::KernelDesc>,
) {
    let kind = if integer {
        cost::Arithmetic::Int8
    } else {
        cost::Arithmetic::Bf16
    };
    let roofline =
        model.command_ns(stats.bytes_read + stats.bytes_written, stats.flops, kind) as u64;
    let mut c = rt.counters.lock();
    c.dispatches += 1;
    c.bytes_read += stats.bytes_read;
    c.bytes_written += stats.bytes_written;
    c.flops += stats.flops;
    c.roofline_time_ns += roofline;
    let work = match &stats.timeline {
        Some(t) => {
            c.dataflow_timed += 1;
            c.core_busy_ns += t.core_busy_ns;
            c.shim_busy_ns += t.shim_busy_ns;
            c.tile_busy_ns += t.tile_busy_ns;
            t.device_ns
        }
        None => roofline,
    };
    c.work_time_ns += work;
    c.device_time_ns += work;
    let t = c.kernels.entry(name.to_owned()).or_default();
    if t.request.is_none() {
        t.request = request.cloned();
    }
    t.dispatches += 1;
    t.work_ns += work;
}

/// The PDI cache / hardware-context bookkeeping of a dispatch (step 4 of both paths).
fn note_pdi(
    rt: &Runtime,
    st: &mut QueueState,
    pdi_id: u64,
    name: &str,
    model: &cost::ArchModel,
) -> Result<(), PacketError> {
    if !st.pdi_cache.contains(&pdi_id) {
        if st.pdi_cache.len() >= MAX_PDIS_PER_QUEUE {
            return Err(PacketError {
                status: HSA_STATUS_ERROR_OUT_OF_RESOURCES,
                msg: format!(
                    "PDI of kernel {name} would be the 33rd distinct PDI on this queue; a queue \
                     holds at most {MAX_PDIS_PER_QUEUE} (one CU-mask bit each)"
                ),
            });
        }
        st.pdi_cache.push(pdi_id);
        let mut c = rt.counters.lock();
        c.pdi_loads += 1;
        if !st.batch_rebuilt {
            st.batch_rebuilt = true;
            c.context_rebuilds += 1;
            c.device_time_ns += model.rebuild_ns() as u64;
        }
    }
    st.pdi_switched = st.last_pdi != Some(pdi_id);
    st.last_pdi = Some(pdi_id);
    Ok(())
}

/// A version-2 image: the IRON design's dataflow and core kernels, emulated (exec::iron).
#[allow(clippy::too_many_arguments)]
fn run_emulated(
    rt: &Runtime,
    q: &Queue,
    st: &mut QueueState,
    mem: &MemoryTable,
    cmd: &Command,
    model: &cost::ArchModel,
    img: &[u8],
    insts: &[u8],
    pdi_id: u64,
) -> Result<Option<()>, PacketError> {
    let bad_image = |m: String| PacketError {
        status: HSA_STATUS_ERROR,
        msg: m,
    };
    image::check_insts(insts, img).map_err(bad_image)?;
    let values = image::insts_values(insts);
    let loaded = exec::iron::load(img).map_err(bad_image)?;
    let mut loaded = loaded.lock();
    let prog = loaded.program();
    let agent_name = &rt.topo.agents[q.agent].name;
    if &prog.arch != agent_name {
        return Err(bad_image(format!(
            "kernel {} was compiled for {} but the queue's agent is {agent_name}",
            prog.name, prog.arch
        )));
    }
    // Checked here too so that HSA_SIM_EXECUTE=0, which does not instantiate, refuses what
    // a run would.
    loaded.check_values(&values).map_err(bad_image)?;
    let name = prog.name.clone();
    let integer = prog.args.iter().all(|a| a.ty.starts_with('i'));
    if cmd.operands.len() != prog.args.len() {
        return Err(PacketError::format(format!(
            "kernel {} takes {} operands (inputs then the output), the packet has {}",
            prog.name,
            prog.args.len(),
            cmd.operands.len()
        )));
    }
    let mut mems = Vec::with_capacity(prog.args.len());
    for (i, o) in cmd.operands.iter().enumerate() {
        let a = operand_allocation(rt, mem, i, o)?;
        // The NPU's DMA may touch the operand's allocation beyond the tensor (whole words):
        // everything up to the allocation's end is accessible.
        mems.push(OperandMem {
            addr: o.addr as usize,
            len: a.end() - o.addr as usize,
        });
    }
    note_pdi(rt, st, pdi_id, &name, model)?;
    if injected_fault(rt, &name)? {
        return Ok(None);
    }
    let t0 = std::time::Instant::now();
    let stats = if rt.config.execute {
        let rates = exec::iron::timing::Rates::of(model);
        // SAFETY: every operand range lies inside a live AIE allocation of `mem`, whose lock the
        // caller holds for the duration, so it can be neither freed nor reallocated.
        unsafe { exec::iron::execute(&mut loaded, &values, &mems, rates) }.map_err(|m| {
            PacketError {
                status: HSA_STATUS_ERROR,
                msg: m,
            }
        })?
    } else {
        // Not run: the operands' bytes are what the design would move; its arithmetic is not
        // known without running it.
        exec::ExecStats {
            bytes_read: cmd.operands[..cmd.operands.len() - 1]
                .iter()
                .map(|o| o.size)
                .sum(),
            bytes_written: cmd.operands.last().map_or(0, |o| o.size),
            flops: 0,
            timeline: None,
        }
    };
    let mut c = rt.counters.lock();
    c.emulation_wall_ns += t0.elapsed().as_nanos() as u64;
    let op = name.split('-').next().unwrap_or("").to_uppercase();
    *c.emulated_ops.entry(op).or_insert(0) += 1;
    drop(c);
    charge(rt, &stats, model, integer, &name, None);
    Ok(Some(()))
}
