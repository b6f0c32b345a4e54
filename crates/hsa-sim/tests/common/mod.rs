//! Test client: drives the simulator through its exported C functions, the way the backend does.
#![allow(dead_code)]

use hsa_runtime64::consts::*;
use hsa_runtime64::image::{self, KernelDesc, TensorDesc};
use hsa_runtime64::ops::DType;
use hsa_runtime64::queue::HsaQueue;
use hsa_runtime64::*;
use parking_lot::{Mutex, MutexGuard};
use std::ffi::c_void;

/// Tests in one binary share the process-global runtime: they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());
/// Statuses delivered to the queue error callback.
pub static ERRORS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

pub unsafe extern "C" fn record_error(status: u32, _q: *mut HsaQueue, _data: *mut c_void) {
    ERRORS.lock().push(status);
}

pub fn errors() -> Vec<u32> {
    ERRORS.lock().clone()
}

/// Holds the serialisation lock and the runtime reference; shuts down on drop.
pub struct Session {
    _guard: MutexGuard<'static, ()>,
    pub cpu: HsaAgent,
    pub aie: Vec<HsaAgent>,
    initialised: bool,
}

pub fn quiet(abi: PacketAbi) -> Config {
    Config {
        packet_abi: abi,
        quiet: true,
        ..Config::default()
    }
}

unsafe extern "C" fn collect_agent(a: HsaAgent, data: *mut c_void) -> u32 {
    // SAFETY: data is the &mut Vec passed by Session::start.
    unsafe { (*(data as *mut Vec<HsaAgent>)).push(a) };
    HSA_STATUS_SUCCESS
}

unsafe extern "C" fn collect_pool(p: HsaPool, data: *mut c_void) -> u32 {
    // SAFETY: data is the &mut Vec passed by pools().
    unsafe { (*(data as *mut Vec<HsaPool>)).push(p) };
    HSA_STATUS_SUCCESS
}

impl Session {
    /// Locks, installs `cfg`, and calls hsa_init (expecting success).
    pub fn start(cfg: Config) -> Session {
        let s = Session::start_raw(cfg);
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        assert_eq!(unsafe { hsa_init() }, HSA_STATUS_SUCCESS);
        let mut agents: Vec<HsaAgent> = Vec::new();
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        let st = unsafe {
            hsa_iterate_agents(Some(collect_agent), &mut agents as *mut _ as *mut c_void)
        };
        assert_eq!(st, HSA_STATUS_SUCCESS);
        let mut s = s;
        s.initialised = true;
        s.cpu = agents[0];
        s.aie = agents[1..].to_vec();
        s
    }

    /// Locks and installs `cfg` without calling hsa_init.
    pub fn start_raw(cfg: Config) -> Session {
        let guard = SERIAL.lock();
        config::set_override(Some(cfg));
        ERRORS.lock().clear();
        Session {
            _guard: guard,
            cpu: HsaAgent { handle: 0 },
            aie: Vec::new(),
            initialised: false,
        }
    }

    pub fn pools(&self, agent: HsaAgent) -> Vec<HsaPool> {
        let mut v: Vec<HsaPool> = Vec::new();
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        let st = unsafe {
            hsa_amd_agent_iterate_memory_pools(
                agent,
                Some(collect_pool),
                &mut v as *mut _ as *mut c_void,
            )
        };
        assert_eq!(st, HSA_STATUS_SUCCESS);
        v
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.initialised {
            // Drain every reference this session may still hold.
            // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
            while unsafe { hsa_shut_down() } == HSA_STATUS_SUCCESS {}
        }
        config::set_override(None);
    }
}

pub fn alloc(pool: HsaPool, size: usize) -> *mut u8 {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
    let st = unsafe { hsa_amd_memory_pool_allocate(pool, size, 0, &mut p) };
    assert_eq!(st, HSA_STATUS_SUCCESS, "allocation of {size} bytes");
    p as *mut u8
}

pub fn write_bytes(ptr: *mut u8, bytes: &[u8]) {
    // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
}

pub fn write_f32(ptr: *mut u8, v: &[f32]) {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    write_bytes(ptr, &b);
}

pub fn read_f32(ptr: *const u8, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
    unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr() as *mut u8, n * 4) };
    out
}

pub fn read_u16(ptr: *const u8, n: usize) -> Vec<u16> {
    let mut out = vec![0u16; n];
    // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
    unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr() as *mut u8, n * 2) };
    out
}

pub fn f32_tensor(ne: [i64; 4]) -> TensorDesc {
    TensorDesc::contiguous(ne, DType::F32)
}

pub fn desc(
    name: &str,
    arch: &str,
    op: &str,
    inputs: Vec<TensorDesc>,
    output: TensorDesc,
) -> KernelDesc {
    KernelDesc {
        name: name.into(),
        arch: arch.into(),
        op: op.into(),
        op_params: [0; image::MAX_OP_PARAMS],
        inputs,
        output,
        extra_outputs: Vec::new(),
        f16_as_bf16: false,
        n_kv_step: None,
    }
}

/// A PDI and its instruction stream loaded into the dev heap.
#[derive(Clone, Copy)]
pub struct Kernel {
    pub pdi: *mut u8,
    pub insts: *mut u8,
    pub insts_bytes: usize,
    /// ABI c: the kernel object of the PDI + instructions loaded as an AIE hsaco (0 otherwise).
    pub kernel_object: u64,
}

/// The AIE agent's pools: (kernarg, dev heap, data).
pub struct Pools {
    pub kernarg: HsaPool,
    pub dev: HsaPool,
    pub data: HsaPool,
    pub agent: HsaAgent,
}

pub fn aie_pools(s: &Session, agent: HsaAgent) -> Pools {
    let p = s.pools(agent);
    Pools {
        kernarg: p[0],
        dev: p[1],
        data: p[2],
        agent,
    }
}

pub fn load_kernel(pools: &Pools, d: &KernelDesc) -> Kernel {
    let img = image::encode_image(d);
    let insts = image::encode_insts(&img);
    let pdi = alloc(pools.dev, img.len());
    write_bytes(pdi, &img);
    let ip = alloc(pools.dev, insts.len());
    write_bytes(ip, &insts);
    // SAFETY: hsa_sim_packet_abi returns NULL or a static NUL-terminated string.
    let abi = unsafe { hsa_sim_packet_abi() };
    // SAFETY: as above; checked non-null.
    let is_c = !abi.is_null() && unsafe { std::ffi::CStr::from_ptr(abi) }.to_bytes() == b"c";
    let kernel_object = if is_c {
        let n_args = d.inputs.len() as u32 + 1;
        let hsaco = aie_hsaco::write_single(&d.arch, &d.name, &img, &insts, n_args, 1).unwrap();
        load_code_object(pools.agent, &hsaco, &d.name).expect("load the kernel's hsaco")
    } else {
        0
    };
    Kernel {
        pdi,
        insts: ip,
        insts_bytes: insts.len(),
        kernel_object,
    }
}

/// Loads an AIE hsaco for `agent` (reader, executable, load, freeze, symbol lookup) and returns
/// the kernel object of `name`, or the first failing status. The executable stays loaded.
pub fn load_code_object(agent: HsaAgent, hsaco: &[u8], name: &str) -> Result<u64, u32> {
    let (exe, st) = load_executable(agent, hsaco);
    if st != HSA_STATUS_SUCCESS {
        return Err(st);
    }
    // SAFETY: the simulator C ABI is called with pointers to live locals.
    let st = unsafe { hsa_executable_freeze(exe, std::ptr::null()) };
    if st != HSA_STATUS_SUCCESS {
        return Err(st);
    }
    kernel_object_of(exe, agent, name)
}

/// Reader + executable + load (not frozen). Returns the executable and the load status.
pub fn load_executable(agent: HsaAgent, hsaco: &[u8]) -> (HsaHandle, u32) {
    let mut reader = HsaHandle { handle: 0 };
    let mut exe = HsaHandle { handle: 0 };
    // SAFETY: the simulator C ABI is called with pointers to live locals.
    unsafe {
        let st = hsa_code_object_reader_create_from_memory(
            hsaco.as_ptr().cast(),
            hsaco.len(),
            &mut reader,
        );
        if st != HSA_STATUS_SUCCESS {
            return (exe, st);
        }
        assert_eq!(
            hsa_executable_create_alt(1, 0, std::ptr::null(), &mut exe),
            HSA_STATUS_SUCCESS
        );
        let st = hsa_executable_load_agent_code_object(
            exe,
            agent,
            reader,
            std::ptr::null(),
            std::ptr::null_mut(),
        );
        assert_eq!(hsa_code_object_reader_destroy(reader), HSA_STATUS_SUCCESS);
        (exe, st)
    }
}

/// Looks `name` up for `agent` and reads its KERNEL_OBJECT.
pub fn kernel_object_of(exe: HsaHandle, agent: HsaAgent, name: &str) -> Result<u64, u32> {
    let cname = std::ffi::CString::new(name).unwrap();
    let mut sym = HsaHandle { handle: 0 };
    // SAFETY: the simulator C ABI is called with pointers to live locals.
    let st = unsafe { hsa_executable_get_symbol_by_name(exe, cname.as_ptr(), &agent, &mut sym) };
    if st != HSA_STATUS_SUCCESS {
        return Err(st);
    }
    let mut ko = 0u64;
    // SAFETY: as above; KERNEL_OBJECT (22) is a u64.
    let st = unsafe { hsa_executable_symbol_get_info(sym, 22, (&mut ko as *mut u64).cast()) };
    if st != HSA_STATUS_SUCCESS {
        return Err(st);
    }
    Ok(ko)
}

pub struct Queue {
    pub q: *mut HsaQueue,
}

pub fn create_queue(agent: HsaAgent) -> Queue {
    let mut q: *mut HsaQueue = std::ptr::null_mut();
    // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
    let st = unsafe {
        hsa_queue_create(
            agent,
            64,
            HSA_QUEUE_TYPE_SINGLE,
            Some(record_error),
            std::ptr::null_mut(),
            0,
            0,
            &mut q,
        )
    };
    assert_eq!(st, HSA_STATUS_SUCCESS);
    Queue { q }
}

/// Operands as (address, size) in packet order: inputs then output.
pub type Ops<'a> = &'a [(*mut u8, usize)];

/// Builds an ERT START_CU payload (A1/A2/A3) in the kernarg pool. Returns the payload pointer.
pub fn ert_payload(pools: &Pools, k: &Kernel, ops: Ops) -> *mut u8 {
    let n = ops.len();
    let mut words: Vec<u32> = vec![
        3,
        0,
        k.insts as u64 as u32,
        (k.insts as u64 >> 32) as u32,
        (k.insts_bytes / 4) as u32,
    ];
    for (p, _) in ops {
        words.push(*p as u64 as u32);
        words.push((*p as u64 >> 32) as u32);
    }
    for (_, sz) in ops {
        words.push(*sz as u32);
    }
    assert_eq!(words.len(), 5 + 3 * n);
    let payload = alloc(pools.kernarg, 64.max(8 + 4 * words.len()));
    let mut bytes = (k.pdi as u64).to_le_bytes().to_vec();
    bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    write_bytes(payload, &bytes);
    payload
}

/// An ERT packet (format byte 3 or 200) pointing at `payload` with `n` operands.
pub fn ert_packet(format: u8, n: usize, completion: u64, payload: *mut u8) -> [u8; 64] {
    let mut p = [0u8; 64];
    p[2] = format;
    let count = (3 + 3 * n) as u32;
    let ert = HSA_AMD_AIE_ERT_STATE_NEW | (count << 12) | (HSA_AMD_AIE_ERT_START_CU << 23);
    p[4..8].copy_from_slice(&ert.to_le_bytes());
    p[48..56].copy_from_slice(&completion.to_le_bytes());
    p[56..64].copy_from_slice(&(payload as u64).to_le_bytes());
    p
}

/// A Gen B kernel-dispatch packet with its kernarg table in the kernarg pool.
pub fn b_packet(pools: &Pools, k: &Kernel, ops: Ops, completion: u64) -> [u8; 64] {
    let table = alloc(pools.kernarg, 16 * ops.len());
    let mut t: Vec<u8> = Vec::new();
    for (p, _) in ops {
        t.extend((*p as u64).to_le_bytes());
    }
    for (_, s) in ops {
        t.extend((*s as u64).to_le_bytes());
    }
    write_bytes(table, &t);
    let mut p = [0u8; 64];
    p[0..2].copy_from_slice(&0x1400u16.to_le_bytes()); // READY + system acquire/release fences
    p[4..6].copy_from_slice(&24u16.to_le_bytes());
    p[8..16].copy_from_slice(&completion.to_le_bytes());
    p[20..24].copy_from_slice(&(k.insts as u64 as u32).to_le_bytes());
    p[24..28].copy_from_slice(&((k.insts as u64 >> 32) as u32).to_le_bytes());
    p[28..30].copy_from_slice(&(ops.len() as u16).to_le_bytes());
    p[32..40].copy_from_slice(&(table as u64).to_le_bytes());
    p[40..48].copy_from_slice(&(k.insts_bytes as u64).to_le_bytes());
    p[48..56].copy_from_slice(&(k.pdi as u64).to_le_bytes());
    p
}

/// A generation-c packet: the kernel object instead of the instruction/PDI addresses.
pub fn c_packet(pools: &Pools, k: &Kernel, ops: Ops, completion: u64) -> [u8; 64] {
    let mut p = b_packet(pools, k, ops, completion);
    p[20..24].copy_from_slice(&(k.kernel_object as u32).to_le_bytes());
    p[24..28].copy_from_slice(&((k.kernel_object >> 32) as u32).to_le_bytes());
    p[40..64].fill(0);
    p
}

/// Builds the packet the selected ABI expects.
pub fn packet_for(
    abi: PacketAbi,
    pools: &Pools,
    k: &Kernel,
    ops: Ops,
    completion: u64,
) -> [u8; 64] {
    match abi {
        PacketAbi::A1 => ert_packet(3, ops.len(), 0, ert_payload(pools, k, ops)),
        PacketAbi::A2 => ert_packet(3, ops.len(), completion, ert_payload(pools, k, ops)),
        PacketAbi::A3 => ert_packet(200, ops.len(), completion, ert_payload(pools, k, ops)),
        PacketAbi::B => b_packet(pools, k, ops, completion),
        PacketAbi::C => c_packet(pools, k, ops, completion),
    }
}

impl Queue {
    /// Writes packets into consecutive slots (no doorbell).
    pub fn write(&self, packets: &[[u8; 64]]) {
        for p in packets {
            // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
            let idx = unsafe { hsa_queue_add_write_index_relaxed(self.q, 1) };
            // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
            let base = unsafe { (*self.q).base_address } as *mut u8;
            // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
            let slot = unsafe { base.add((idx % 64) as usize * 64) };
            write_bytes(slot, p);
        }
    }

    pub fn ring(&self) {
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        let w = unsafe { hsa_queue_load_write_index_relaxed(self.q) };
        let doorbell = HsaSignal {
            // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
            handle: unsafe { (*self.q).doorbell_signal },
        };
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        unsafe { hsa_signal_store_screlease(doorbell, w as i64) };
    }

    /// Writes packets and rings the doorbell once.
    pub fn submit(&self, packets: &[[u8; 64]]) {
        self.write(packets);
        self.ring();
    }

    pub fn read_index(&self) -> u64 {
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        unsafe { hsa_queue_load_read_index_scacquire(self.q) }
    }

    pub fn write_index(&self) -> u64 {
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        unsafe { hsa_queue_load_write_index_relaxed(self.q) }
    }
}

pub fn new_signal(v: i64) -> HsaSignal {
    let mut s = HsaSignal { handle: 0 };
    assert_eq!(
        // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
        unsafe { hsa_signal_create(v, 0, std::ptr::null(), &mut s) },
        HSA_STATUS_SUCCESS
    );
    s
}

pub fn load(s: HsaSignal) -> i64 {
    // SAFETY: the simulator C ABI is called with pointers to live locals, queues and pool allocations owned by this test.
    unsafe { hsa_signal_load_scacquire(s) }
}

pub fn counters() -> hsa_runtime64::counters::Counters {
    hsa_runtime64::runtime::get()
        .unwrap()
        .counters
        .lock()
        .clone()
}
