//! Agents, pools, memory, queues, signals and error codes through the exported functions.

// These tests exercise the raw C ABI, so nearly every line is an `unsafe` call whose arguments are
// locals, handles or allocations the test itself owns (or deliberately invalid handles/NULL, which
// the simulator must refuse); one blanket note instead of a SAFETY comment per call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod common;
use common::*;
use hsa_runtime64::consts::*;
use hsa_runtime64::queue::HsaQueue;
use hsa_runtime64::*;
use std::ffi::{c_void, CStr};

fn agent_u32(a: HsaAgent, attr: u32) -> (u32, u32) {
    let mut v: u32 = 0xdead;
    let st = unsafe { hsa_agent_get_info(a, attr, &mut v as *mut u32 as *mut c_void) };
    (st, v)
}

fn agent_name(a: HsaAgent, attr: u32) -> String {
    let mut buf = [0u8; 64];
    assert_eq!(
        unsafe { hsa_agent_get_info(a, attr, buf.as_mut_ptr() as *mut c_void) },
        0
    );
    CStr::from_bytes_until_nul(&buf)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

fn pool_usize(p: HsaPool, attr: u32) -> usize {
    let mut v: usize = 0;
    assert_eq!(
        unsafe { hsa_amd_memory_pool_get_info(p, attr, &mut v as *mut usize as *mut c_void) },
        0
    );
    v
}

fn pool_u32(p: HsaPool, attr: u32) -> u32 {
    let mut v: u32 = 0;
    assert_eq!(
        unsafe { hsa_amd_memory_pool_get_info(p, attr, &mut v as *mut u32 as *mut c_void) },
        0
    );
    v
}

fn pool_bool(p: HsaPool, attr: u32) -> bool {
    let mut v: u8 = 7;
    assert_eq!(
        unsafe { hsa_amd_memory_pool_get_info(p, attr, &mut v as *mut u8 as *mut c_void) },
        0
    );
    v == 1
}

#[test]
fn calls_before_init_are_refused() {
    let _s = Session::start_raw(quiet(PacketAbi::A1));
    let mut v = 0u32;
    let a = HsaAgent { handle: 1 };
    assert_eq!(
        unsafe { hsa_agent_get_info(a, 0, &mut v as *mut u32 as *mut c_void) },
        HSA_STATUS_ERROR_NOT_INITIALIZED
    );
    assert_eq!(
        unsafe { hsa_iterate_agents(None, std::ptr::null_mut()) },
        HSA_STATUS_ERROR_NOT_INITIALIZED
    );
    assert_eq!(unsafe { hsa_shut_down() }, HSA_STATUS_ERROR_NOT_INITIALIZED);
    assert_eq!(
        unsafe { hsa_memory_free(std::ptr::null_mut()) },
        HSA_STATUS_ERROR_NOT_INITIALIZED
    );
    let mut s = HsaSignal { handle: 0 };
    assert_eq!(
        unsafe { hsa_signal_create(0, 0, std::ptr::null(), &mut s) },
        HSA_STATUS_ERROR_NOT_INITIALIZED
    );
    assert!(unsafe { hsa_sim_packet_abi() }.is_null());
    // hsa_status_string works without the runtime.
    let mut text: *const std::ffi::c_char = std::ptr::null();
    assert_eq!(
        unsafe { hsa_status_string(HSA_STATUS_ERROR_INVALID_AGENT, &mut text) },
        0
    );
    let t = unsafe { CStr::from_ptr(text) }.to_str().unwrap();
    assert!(t.starts_with("HSA_STATUS_ERROR_INVALID_AGENT"), "{t}");
    assert_eq!(
        unsafe { hsa_status_string(0x4242, &mut text) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { hsa_status_string(0, std::ptr::null_mut()) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
}

#[test]
fn init_is_reference_counted() {
    let _s = Session::start_raw(quiet(PacketAbi::A1));
    assert_eq!(unsafe { hsa_init() }, 0);
    assert_eq!(unsafe { hsa_init() }, 0);
    assert_eq!(unsafe { hsa_shut_down() }, 0);
    // Still initialised after one of two shut-downs.
    assert_eq!(
        unsafe { hsa_iterate_agents(None, std::ptr::null_mut()) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(unsafe { hsa_shut_down() }, 0);
    assert_eq!(
        unsafe { hsa_iterate_agents(None, std::ptr::null_mut()) },
        HSA_STATUS_ERROR_NOT_INITIALIZED
    );
    assert_eq!(unsafe { hsa_shut_down() }, HSA_STATUS_ERROR_NOT_INITIALIZED);
}

#[test]
fn agents_report_like_rocr() {
    let s = Session::start(quiet(PacketAbi::A1));
    assert_eq!(s.aie.len(), 1);
    assert_eq!(
        agent_u32(s.cpu, HSA_AGENT_INFO_DEVICE),
        (0, HSA_DEVICE_TYPE_CPU)
    );
    let a = s.aie[0];
    assert_eq!(
        agent_u32(a, HSA_AGENT_INFO_DEVICE),
        (0, HSA_DEVICE_TYPE_AIE)
    );
    assert_eq!(agent_name(a, HSA_AGENT_INFO_NAME), "aie2p");
    assert_eq!(agent_name(a, HSA_AGENT_INFO_VENDOR_NAME), "AMD");
    assert_eq!(agent_name(a, HSA_AMD_AGENT_INFO_PRODUCT_NAME), "AIE-ML");
    assert_eq!(
        agent_u32(a, HSA_AGENT_INFO_FEATURE),
        (0, HSA_AGENT_FEATURE_AGENT_DISPATCH)
    );
    assert_eq!(agent_u32(a, HSA_AGENT_INFO_PROFILE), (0, HSA_PROFILE_BASE));
    assert_eq!(agent_u32(a, HSA_AGENT_INFO_QUEUES_MAX), (0, 1));
    assert_eq!(agent_u32(a, HSA_AGENT_INFO_QUEUE_MIN_SIZE), (0, 64));
    assert_eq!(agent_u32(a, HSA_AGENT_INFO_QUEUE_MAX_SIZE), (0, 64));
    assert_eq!(
        agent_u32(a, HSA_AGENT_INFO_QUEUE_TYPE),
        (0, HSA_QUEUE_TYPE_SINGLE)
    );
    let mut v16 = 0u16;
    assert_eq!(
        unsafe {
            hsa_agent_get_info(
                a,
                HSA_AGENT_INFO_VERSION_MAJOR,
                &mut v16 as *mut u16 as *mut c_void,
            )
        },
        0
    );
    assert_eq!(v16, 1);
    // Unknown attribute: a 32-bit 0 is written and INVALID_ARGUMENT returned.
    assert_eq!(
        agent_u32(a, 19 /* ISA */),
        (HSA_STATUS_ERROR_INVALID_ARGUMENT, 0)
    );
    assert_eq!(
        agent_u32(HsaAgent { handle: 42 }, 0).0,
        HSA_STATUS_ERROR_INVALID_AGENT
    );
    let mut v = 0u32;
    assert_eq!(
        unsafe { hsa_agent_get_info(a, 0, std::ptr::null_mut()) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    let _ = &mut v;
}

#[test]
fn agent_list_from_config() {
    let cfg = Config {
        agents: vec!["aie2".into(), "aie4".into(), "aie2p".into()],
        ..quiet(PacketAbi::A1)
    };
    let s = Session::start(cfg);
    let names: Vec<String> = s.aie.iter().map(|a| agent_name(*a, 0)).collect();
    assert_eq!(names, ["aie2", "aie4", "aie2p"]);
    drop(s);
    let cfg = Config::from_lookup(|k| (k == "HSA_SIM_NO_AGENTS").then(|| "1".to_string())).unwrap();
    let s = Session::start(Config { quiet: true, ..cfg });
    assert!(s.aie.is_empty());
    assert_eq!(s.pools(s.cpu).len(), 1);
}

#[test]
fn config_parsing() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let c = Config::from_lookup(env(&[])).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.packet_abi, PacketAbi::A1);
    assert_eq!(c.agents, ["aie2p"]);
    let c = Config::from_lookup(env(&[
        ("HSA_SIM_AGENTS", "aie2, aie2p"),
        ("HSA_SIM_PACKET_ABI", "B"),
        ("HSA_SIM_FAIL_ALLOC", "3"),
        ("HSA_SIM_COUNTERS", "/tmp/x.json"),
    ]))
    .unwrap();
    assert_eq!(c.agents, ["aie2", "aie2p"]);
    assert_eq!(c.packet_abi, PacketAbi::B);
    assert_eq!(c.fail_alloc, Some(3));
    assert!(Config::from_lookup(env(&[("HSA_SIM_PACKET_ABI", "a4")])).is_err());
    assert!(Config::from_lookup(env(&[("HSA_SIM_FAIL_DISPATCH", "x")])).is_err());
    assert_eq!(c.dev_heap_size, 64 << 20);
    let heap = |v: &str| {
        Config::from_lookup(|k| (k == "HSA_SIM_DEV_HEAP_SIZE").then(|| v.to_string()))
            .map(|c| c.dev_heap_size)
    };
    for (v, bytes) in [
        ("65536", 64 << 10),
        ("64k", 64 << 10),
        ("2M", 2 << 20),
        ("64M", 64 << 20),
    ] {
        assert_eq!(heap(v), Ok(bytes), "{v}");
    }
    for bad in ["0", "100", "65M", "1G", "x", "-4K"] {
        assert!(heap(bad).is_err(), "{bad}");
    }
    let dram = |v: &str| {
        Config::from_lookup(|k| (k == "HSA_SIM_DRAM_GBPS").then(|| v.to_string()))
            .map(|c| c.dram_bytes_per_s)
    };
    assert_eq!(dram(""), Ok(None));
    assert_eq!(dram("47"), Ok(Some(47_000_000_000)));
    assert_eq!(dram(" 66.5 "), Ok(Some(66_500_000_000)));
    for bad in ["0", "0.5", "1e6", "fast", "-56", "NaN"] {
        assert!(dram(bad).is_err(), "{bad}");
    }
}

#[test]
fn pools_in_rocr_order() {
    let s = Session::start(quiet(PacketAbi::A1));
    let pools = s.pools(s.aie[0]);
    assert_eq!(pools.len(), 3);
    let flags: Vec<u32> = pools
        .iter()
        .map(|p| pool_u32(*p, HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS))
        .collect();
    assert_eq!(flags, [5, 4, 4]);
    let rec: Vec<usize> = pools
        .iter()
        .map(|p| pool_usize(*p, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_REC_GRANULE))
        .collect();
    assert_eq!(rec, [4096, 0, 4096]);
    assert_eq!(
        pool_usize(pools[1], HSA_AMD_MEMORY_POOL_INFO_SIZE),
        64 << 20
    );
    for p in &pools {
        assert_eq!(
            pool_u32(*p, HSA_AMD_MEMORY_POOL_INFO_SEGMENT),
            HSA_AMD_SEGMENT_GLOBAL
        );
        assert_eq!(
            pool_usize(*p, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE),
            4096
        );
        assert_eq!(
            pool_usize(*p, HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT),
            4096
        );
        assert!(pool_bool(
            *p,
            HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED
        ));
        assert!(pool_bool(*p, HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL));
    }
    let mut v = 0u32;
    assert_eq!(
        unsafe { hsa_amd_memory_pool_get_info(pools[0], 9999, &mut v as *mut u32 as *mut c_void) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe {
            hsa_amd_memory_pool_get_info(
                HsaPool { handle: 3 },
                0,
                &mut v as *mut u32 as *mut c_void,
            )
        },
        HSA_STATUS_ERROR_INVALID_MEMORY_POOL
    );
    assert_eq!(
        unsafe {
            hsa_amd_agent_memory_pool_get_info(
                s.aie[0],
                pools[1],
                HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS,
                &mut v as *mut u32 as *mut c_void,
            )
        },
        0
    );
    assert_eq!(v, HSA_AMD_MEMORY_POOL_ACCESS_ALLOWED_BY_DEFAULT);
}

#[test]
fn allocation_rounding_and_interior_lookup() {
    let s = Session::start(quiet(PacketAbi::A1));
    let pools = aie_pools(&s, s.aie[0]);
    let p = alloc(pools.data, 100);
    assert_eq!(p as usize % 4096, 0);
    let rt = runtime::get().unwrap();
    {
        let mem = rt.memory.lock();
        let a = mem
            .lookup(p as usize + 4000)
            .expect("interior pointer resolves");
        assert_eq!((a.base, a.size), (p as usize, 4096));
        assert_eq!(rt.topo.pools[a.pool].handle, pools.data.handle);
        assert!(mem
            .lookup(p as usize + 4096)
            .is_none_or(|b| b.base != p as usize));
        assert!(mem.lookup_range(p as usize + 4000, 200).is_none());
    }
    // Memory is usable and zeroed.
    assert!(read_f32(p, 1024).iter().all(|&x| x == 0.0));
    // Error codes.
    let mut out: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        unsafe { hsa_amd_memory_pool_allocate(pools.data, 0, 0, &mut out) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { hsa_amd_memory_pool_allocate(pools.data, 8, 0, std::ptr::null_mut()) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { hsa_amd_memory_pool_allocate(HsaPool { handle: 9 }, 8, 0, &mut out) },
        HSA_STATUS_ERROR_INVALID_MEMORY_POOL
    );
    assert_eq!(
        unsafe { hsa_amd_memory_pool_free(p.add(8) as *mut c_void) },
        HSA_STATUS_ERROR_INVALID_ALLOCATION
    );
    assert_eq!(
        unsafe { hsa_amd_memory_pool_free(std::ptr::null_mut()) },
        HSA_STATUS_SUCCESS
    );
    assert_eq!(
        unsafe { hsa_amd_memory_pool_free(p as *mut c_void) },
        HSA_STATUS_SUCCESS
    );
    assert_eq!(
        unsafe { hsa_memory_free(p as *mut c_void) },
        HSA_STATUS_ERROR_INVALID_ALLOCATION
    );
    // The dev heap is 64 MiB.
    let big = alloc(pools.dev, 60 << 20);
    assert_eq!(
        unsafe { hsa_amd_memory_pool_allocate(pools.dev, 8 << 20, 0, &mut out) },
        HSA_STATUS_ERROR_OUT_OF_RESOURCES
    );
    assert_eq!(
        unsafe { hsa_amd_memory_pool_allocate(pools.dev, 65 << 20, 0, &mut out) },
        HSA_STATUS_ERROR_OUT_OF_RESOURCES
    );
    let small = alloc(pools.dev, 1 << 20);
    assert_eq!(unsafe { hsa_memory_free(big as *mut c_void) }, 0);
    assert_eq!(unsafe { hsa_memory_free(small as *mut c_void) }, 0);
    let again = alloc(pools.dev, 64 << 20);
    assert_eq!(unsafe { hsa_memory_free(again as *mut c_void) }, 0);
}

#[test]
fn allow_access_refuses_aie_agents() {
    let s = Session::start(quiet(PacketAbi::A1));
    let pools = aie_pools(&s, s.aie[0]);
    let p = alloc(pools.data, 64) as *const c_void;
    let aie = [s.aie[0]];
    let cpu = [s.cpu];
    let both = [s.cpu, s.aie[0]];
    unsafe {
        assert_eq!(
            hsa_amd_agents_allow_access(1, aie.as_ptr(), std::ptr::null(), p),
            HSA_STATUS_ERROR_INVALID_AGENT
        );
        assert_eq!(
            hsa_amd_agents_allow_access(2, both.as_ptr(), std::ptr::null(), p),
            HSA_STATUS_ERROR_INVALID_AGENT
        );
        assert_eq!(
            hsa_amd_agents_allow_access(1, cpu.as_ptr(), std::ptr::null(), p),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            hsa_amd_agents_allow_access(0, cpu.as_ptr(), std::ptr::null(), p),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn queue_create_error_codes() {
    let s = Session::start(quiet(PacketAbi::A1));
    let a = s.aie[0];
    let mut q: *mut HsaQueue = std::ptr::null_mut();
    let create = |agent: HsaAgent, size: u32, ty: u32, q: *mut *mut HsaQueue| unsafe {
        hsa_queue_create(agent, size, ty, None, std::ptr::null_mut(), 0, 0, q)
    };
    assert_eq!(
        create(a, 64, HSA_QUEUE_TYPE_SINGLE, std::ptr::null_mut()),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        create(a, 0, HSA_QUEUE_TYPE_SINGLE, &mut q),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        create(a, 48, HSA_QUEUE_TYPE_SINGLE, &mut q),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(create(a, 64, 3, &mut q), HSA_STATUS_ERROR_INVALID_ARGUMENT);
    assert_eq!(
        create(a, 64, HSA_QUEUE_TYPE_MULTI, &mut q),
        HSA_STATUS_ERROR_INVALID_QUEUE_CREATION
    );
    assert_eq!(
        create(a, 128, HSA_QUEUE_TYPE_SINGLE, &mut q),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        create(a, 32, HSA_QUEUE_TYPE_SINGLE, &mut q),
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(
        create(HsaAgent { handle: 5 }, 64, HSA_QUEUE_TYPE_SINGLE, &mut q),
        HSA_STATUS_ERROR_INVALID_AGENT
    );
    assert_eq!(
        create(a, 64, HSA_QUEUE_TYPE_SINGLE, &mut q),
        HSA_STATUS_SUCCESS
    );
    let pub_q = unsafe { &*q };
    assert_eq!(pub_q.size, 64);
    assert_eq!(pub_q.type_, HSA_QUEUE_TYPE_SINGLE);
    assert_eq!(pub_q.base_address % 4096, 0);
    assert_ne!(pub_q.doorbell_signal, 0);
    assert_eq!(std::mem::size_of::<HsaQueue>(), 40);
    // Index operations.
    unsafe {
        assert_eq!(hsa_queue_add_write_index_relaxed(q, 1), 0);
        assert_eq!(hsa_queue_add_write_index_scacq_screl(q, 2), 1);
        assert_eq!(hsa_queue_load_write_index_scacquire(q), 3);
        hsa_queue_store_write_index_screlease(q, 0);
        assert_eq!(hsa_queue_load_write_index_relaxed(q), 0);
        assert_eq!(hsa_queue_load_read_index_relaxed(q), 0);
        assert_eq!(hsa_queue_destroy(q), 0);
        assert_eq!(hsa_queue_destroy(q), HSA_STATUS_ERROR_INVALID_QUEUE);
        assert_eq!(
            hsa_queue_destroy(std::ptr::null_mut()),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn signals_wait_and_arithmetic() {
    let _s = Session::start(quiet(PacketAbi::A1));
    let sig = new_signal(2);
    unsafe {
        hsa_signal_subtract_screlease(sig, 1);
        assert_eq!(hsa_signal_load_relaxed(sig), 1);
        hsa_signal_add_relaxed(sig, 5);
        assert_eq!(hsa_signal_load_scacquire(sig), 6);
        hsa_signal_store_relaxed(sig, 0);
        assert_eq!(
            hsa_signal_wait_scacquire(
                sig,
                HSA_SIGNAL_CONDITION_EQ,
                0,
                u64::MAX,
                HSA_WAIT_STATE_BLOCKED
            ),
            0
        );
        // A bounded wait that cannot succeed returns after the timeout with the current value.
        let t = std::time::Instant::now();
        assert_eq!(
            hsa_signal_wait_relaxed(
                sig,
                HSA_SIGNAL_CONDITION_NE,
                0,
                20_000_000,
                HSA_WAIT_STATE_ACTIVE
            ),
            0
        );
        assert!(t.elapsed() >= std::time::Duration::from_millis(20));
    }
    // A waiter is woken by another thread.
    let h = sig.handle;
    let th = std::thread::spawn(move || unsafe {
        hsa_signal_wait_scacquire(
            HsaSignal { handle: h },
            HSA_SIGNAL_CONDITION_LT,
            0,
            5_000_000_000,
            0,
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(10));
    unsafe { hsa_signal_subtract_relaxed(sig, 1) };
    assert_eq!(th.join().unwrap(), -1);
    assert_eq!(unsafe { hsa_signal_destroy(sig) }, 0);
    assert_eq!(
        unsafe { hsa_signal_destroy(sig) },
        HSA_STATUS_ERROR_INVALID_SIGNAL
    );
    let mut out = HsaSignal { handle: 0 };
    assert_eq!(
        unsafe { hsa_signal_create(0, 1, std::ptr::null(), &mut out) },
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );
}

#[test]
fn system_info_identifies_the_packet_abi() {
    for (abi, minor) in [
        (PacketAbi::A1, 11u16),
        (PacketAbi::A2, 12),
        (PacketAbi::A3, 20),
        (PacketAbi::B, 21),
        (PacketAbi::C, 21),
    ] {
        let _s = Session::start(quiet(abi));
        let mut v: u16 = 0;
        assert_eq!(
            unsafe {
                hsa_system_get_info(
                    HSA_AMD_SYSTEM_INFO_EXT_VERSION_MINOR,
                    &mut v as *mut u16 as *mut c_void,
                )
            },
            0
        );
        assert_eq!(v, minor);
        assert_eq!(
            unsafe {
                hsa_system_get_info(
                    HSA_AMD_SYSTEM_INFO_EXT_VERSION_MAJOR,
                    &mut v as *mut u16 as *mut c_void,
                )
            },
            0
        );
        assert_eq!(v, 1);
        let name = unsafe { CStr::from_ptr(hsa_sim_packet_abi()) }
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(name, abi.name());
        let mut f: u64 = 0;
        assert_eq!(
            unsafe {
                hsa_system_get_info(
                    HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY,
                    &mut f as *mut u64 as *mut c_void,
                )
            },
            0
        );
        assert_eq!(f, 1_000_000_000);
        assert_eq!(
            unsafe { hsa_system_get_info(0x9999, &mut f as *mut u64 as *mut c_void) },
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
    }
}
