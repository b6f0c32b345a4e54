//! Fault injection.

mod common;
use common::*;
use hsa_runtime64::consts::*;
use hsa_runtime64::*;
use std::ffi::c_void;

fn add_kernel(pools: &Pools) -> (Kernel, [(*mut u8, usize); 3]) {
    let d = desc(
        "add",
        "aie2p",
        "ADD",
        vec![f32_tensor([4, 1, 1, 1]); 2],
        f32_tensor([4, 1, 1, 1]),
    );
    let k = load_kernel(pools, &d);
    let a = alloc(pools.data, 16);
    let b = alloc(pools.data, 16);
    let c = alloc(pools.data, 16);
    write_f32(a, &[1.0, 2.0, 3.0, 4.0]);
    write_f32(b, &[1.0, 1.0, 1.0, 1.0]);
    (k, [(a, 16), (b, 16), (c, 16)])
}

#[test]
fn fail_init() {
    let _s = Session::start_raw(Config {
        fail_init: true,
        ..quiet(PacketAbi::A1)
    });
    // SAFETY: the simulator C ABI is called with live locals and handles of this session.
    assert_eq!(unsafe { hsa_init() }, HSA_STATUS_ERROR);
    // SAFETY: the simulator C ABI is called with live locals and handles of this session.
    assert_eq!(unsafe { hsa_shut_down() }, HSA_STATUS_ERROR_NOT_INITIALIZED);
}

#[test]
fn fail_alloc_nth() {
    let s = Session::start(Config {
        fail_alloc: Some(2),
        ..quiet(PacketAbi::A1)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let _first = alloc(pools.data, 10);
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(
        // SAFETY: the simulator C ABI is called with live locals and handles of this session.
        unsafe { hsa_amd_memory_pool_allocate(pools.data, 10, 0, &mut p) },
        HSA_STATUS_ERROR_OUT_OF_RESOURCES
    );
    let _third = alloc(pools.data, 10);
}

#[test]
fn fail_dispatch_nth() {
    let s = Session::start(Config {
        fail_dispatch: Some(2),
        ..quiet(PacketAbi::A2)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_kernel(&pools);
    let sig = new_signal(2);
    q.submit(&[packet_for(PacketAbi::A2, &pools, &k, &ops, sig.handle)]);
    assert_eq!(load(sig), 1);
    q.submit(&[packet_for(PacketAbi::A2, &pools, &k, &ops, sig.handle)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR]);
    assert_eq!(load(sig), -1);
    assert_eq!(q.read_index(), 2);
    let c = counters();
    assert_eq!(
        (c.dispatches, c.dispatch_errors, c.injected_faults),
        (1, 1, 1)
    );
}

#[test]
fn hang_dispatch_nth() {
    let s = Session::start(Config {
        hang_dispatch: Some(2),
        ..quiet(PacketAbi::A2)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_kernel(&pools);
    let sig = new_signal(3);
    let pkts: Vec<[u8; 64]> = (0..3)
        .map(|_| packet_for(PacketAbi::A2, &pools, &k, &ops, sig.handle))
        .collect();
    q.submit(&pkts);
    // Packet 0 completed; packet 1 hangs: read index stays on it, its signal never moves.
    assert_eq!(q.read_index(), 1);
    assert_eq!(load(sig), 2);
    let t = std::time::Instant::now();
    // SAFETY: the simulator C ABI is called with live locals and handles of this session.
    let v = unsafe {
        hsa_signal_wait_scacquire(
            sig,
            HSA_SIGNAL_CONDITION_EQ,
            0,
            30_000_000,
            HSA_WAIT_STATE_BLOCKED,
        )
    };
    assert_eq!(v, 2);
    assert!(t.elapsed() >= std::time::Duration::from_millis(30));
    // Further doorbells do nothing.
    q.ring();
    assert_eq!(q.read_index(), 1);
    assert!(errors().is_empty());
}

#[test]
fn error_state_nth_doorbell() {
    let s = Session::start(Config {
        error_state: Some(2),
        ..quiet(PacketAbi::B)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_kernel(&pools);
    let sig = new_signal(1);
    q.submit(&[packet_for(PacketAbi::B, &pools, &k, &ops, sig.handle)]);
    assert!(errors().is_empty());
    assert_eq!(load(sig), 0);
    let sig2 = new_signal(1);
    q.submit(&[packet_for(PacketAbi::B, &pools, &k, &ops, sig2.handle)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_FATAL]);
    assert_eq!(load(sig2), -1);
    q.submit(&[packet_for(PacketAbi::B, &pools, &k, &ops, 0)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_FATAL, HSA_STATUS_ERROR_FATAL]);
    assert_eq!(q.read_index(), 3);
    assert_eq!(counters().dispatches, 1);
}
