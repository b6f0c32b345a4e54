//! Packet ABI c: the AIE code object loader (readers, executables, symbols, kernel objects)
//! with ROCR's validation, the generation-c packet, and the queue's suspension on error.

mod common;
use common::*;
use hsa_runtime64::consts::*;
use hsa_runtime64::*;

fn add_desc(name: &str, arch: &str) -> hsa_runtime64::image::KernelDesc {
    desc(
        name,
        arch,
        "ADD",
        vec![f32_tensor([8, 3, 1, 1]), f32_tensor([4, 1, 1, 1])],
        f32_tensor([8, 3, 1, 1]),
    )
}

fn add_hsaco(name: &str, arch: &str) -> Vec<u8> {
    let img = hsa_runtime64::image::encode_image(&add_desc(name, arch));
    let insts = hsa_runtime64::image::encode_insts(&img);
    aie_hsaco::write_single(arch, name, &img, &insts, 3, 1).unwrap()
}

fn operands(pools: &Pools) -> [(*mut u8, usize); 3] {
    let a = alloc(pools.data, 96);
    let b = alloc(pools.data, 16);
    let c = alloc(pools.data, 96);
    write_f32(a, &(0..24).map(|i| i as f32).collect::<Vec<_>>());
    write_f32(b, &[100.0, 200.0, 300.0, 400.0]);
    [(a, 96), (b, 16), (c, 96)]
}

#[test]
fn load_freeze_lookup_dispatch_destroy() {
    let s = Session::start(quiet(PacketAbi::C));
    let agent = s.aie[0];
    let pools = aie_pools(&s, agent);
    let f = add_hsaco("add", "aie2p");
    let (exe, st) = load_executable(agent, &f);
    assert_eq!(st, HSA_STATUS_SUCCESS);
    // KERNEL_OBJECT reads 0 until the executable is frozen.
    assert_eq!(kernel_object_of(exe, agent, "add"), Ok(0));
    // SAFETY: the simulator C ABI with live locals.
    assert_eq!(unsafe { hsa_executable_freeze(exe, std::ptr::null()) }, 0);
    // SAFETY: as above.
    let refrozen = unsafe { hsa_executable_freeze(exe, std::ptr::null()) };
    assert_eq!(refrozen, HSA_STATUS_ERROR_FROZEN_EXECUTABLE);
    let ko = kernel_object_of(exe, agent, "add").unwrap();
    assert_ne!(ko, 0);
    // The descriptor's first u32 is its version, 1.
    // SAFETY: the kernel object is the address of the live descriptor.
    assert_eq!(unsafe { (ko as *const u32).read() }, 1);
    // Symbols are agent symbols: no agent, the wrong agent or the wrong name find nothing.
    let name = std::ffi::CString::new("add").unwrap();
    let mut sym = HsaHandle { handle: 0 };
    // SAFETY: as above.
    let st = unsafe {
        hsa_executable_get_symbol_by_name(exe, name.as_ptr(), std::ptr::null(), &mut sym)
    };
    assert_eq!(st, HSA_STATUS_ERROR_INVALID_SYMBOL_NAME);
    assert_eq!(
        kernel_object_of(exe, s.cpu, "add"),
        Err(HSA_STATUS_ERROR_INVALID_SYMBOL_NAME)
    );
    assert_eq!(
        kernel_object_of(exe, agent, "add.kd"),
        Err(HSA_STATUS_ERROR_INVALID_SYMBOL_NAME)
    );
    // Kernarg size from the entry.
    // SAFETY: as above.
    unsafe {
        assert_eq!(
            hsa_executable_get_symbol_by_name(exe, name.as_ptr(), &agent, &mut sym),
            0
        );
        let mut ks = 0u32;
        assert_eq!(
            hsa_executable_symbol_get_info(sym, 11, (&mut ks as *mut u32).cast()),
            0
        );
        assert_eq!(ks, 48);
    }
    // Dispatch.
    let q = create_queue(agent);
    let ops = operands(&pools);
    let k = Kernel {
        pdi: std::ptr::null_mut(),
        insts: std::ptr::null_mut(),
        insts_bytes: 0,
        kernel_object: ko,
    };
    let sig = new_signal(1);
    q.submit(&[c_packet(&pools, &k, &ops, sig.handle)]);
    assert_eq!(errors(), Vec::<u32>::new(), "{}", counters().last_error);
    assert_eq!(load(sig), 0);
    assert_eq!(read_f32(ops[2].0, 24)[5], 5.0 + 200.0);
    // Destroyed: the kernel object is gone, a packet naming it is refused.
    // SAFETY: as above.
    assert_eq!(unsafe { hsa_executable_destroy(exe) }, 0);
    // SAFETY: as above.
    let again = unsafe { hsa_executable_destroy(exe) };
    assert_eq!(again, HSA_STATUS_ERROR_INVALID_EXECUTABLE);
    let q2 = create_queue(agent);
    q2.submit(&[c_packet(&pools, &k, &ops, 0)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT]);
    assert!(counters().last_error.contains("not a kernel of a live"));
    // Created and destroyed are counted (the reader and the failed destroy are not).
    assert_eq!(
        (
            counters().executables_created,
            counters().executables_destroyed
        ),
        (1, 1)
    );
}

/// A dev heap shrunk by `HSA_SIM_DEV_HEAP_SIZE` fills after a few code objects; loading one
/// more fails with OUT_OF_RESOURCES (what a client's eviction acts on), and destroying an
/// executable gives its blobs back.
#[test]
fn a_small_dev_heap_fills_and_destroy_frees_it() {
    // Each kernel is two 4 KiB blocks (the image and the instruction stream).
    let s = Session::start(Config {
        dev_heap_size: 5 * 4096,
        ..quiet(PacketAbi::C)
    });
    let agent = s.aie[0];
    let dev_heap = s.pools(agent)[1];
    let mut size: usize = 0;
    // SAFETY: SIZE writes one size_t into a live local.
    let st = unsafe {
        hsa_amd_memory_pool_get_info(
            dev_heap,
            HSA_AMD_MEMORY_POOL_INFO_SIZE,
            (&mut size as *mut usize).cast(),
        )
    };
    assert_eq!((st, size), (HSA_STATUS_SUCCESS, 5 * 4096));
    let f = add_hsaco("add", "aie2p");
    let (a, st) = load_executable(agent, &f);
    assert_eq!(st, HSA_STATUS_SUCCESS);
    let (b, st) = load_executable(agent, &f);
    assert_eq!(st, HSA_STATUS_SUCCESS);
    let (c, st) = load_executable(agent, &f);
    assert_eq!(st, HSA_STATUS_ERROR_OUT_OF_RESOURCES);
    // SAFETY: the simulator C ABI, live handles.
    unsafe {
        assert_eq!(hsa_executable_destroy(c), 0);
        assert_eq!(hsa_executable_destroy(a), 0);
    }
    let (d, st) = load_executable(agent, &f);
    assert_eq!(st, HSA_STATUS_SUCCESS);
    // SAFETY: as above.
    unsafe {
        assert_eq!(hsa_executable_destroy(b), 0);
        assert_eq!(hsa_executable_destroy(d), 0);
    }
    let c = counters();
    assert_eq!((c.executables_created, c.executables_destroyed), (4, 4));
}

#[test]
fn loader_validation() {
    let s = Session::start(quiet(PacketAbi::C));
    let agent = s.aie[0];
    let good = add_hsaco("add", "aie2p");
    let sec_off = {
        let sec = aie_hsaco::find_section(&good, "aie2p").unwrap();
        sec.as_ptr() as usize - good.as_ptr() as usize
    };
    let patched = |off: usize, v: &[u8]| {
        let mut f = good.clone();
        f[sec_off + off..sec_off + off + v.len()].copy_from_slice(v);
        load_executable(agent, &f).1
    };
    assert_eq!(load_executable(agent, &good).1, 0);
    // Magic, version, header and entry bounds, kind 0 without a PDI.
    assert_eq!(patched(0, b"AIEX"), HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS);
    assert_eq!(patched(4, &[2, 0]), HSA_STATUS_ERROR_INVALID_CODE_OBJECT);
    assert_eq!(
        patched(12, &0u32.to_le_bytes()),
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT
    );
    assert_eq!(
        patched(48 + 4, &u32::MAX.to_le_bytes()),
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT
    );
    assert_eq!(
        patched(48 + 16, &0u32.to_le_bytes()),
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT
    );
    assert_eq!(
        patched(48 + 24, &99u32.to_le_bytes()),
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT,
        "more columns than the agent has"
    );
    // No section for this agent's architecture.
    assert_eq!(
        load_executable(agent, &add_hsaco("add", "aie2")).1,
        HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS
    );
    // Not ELF.
    assert_eq!(
        load_executable(agent, b"not an elf").1,
        HSA_STATUS_ERROR_INVALID_CODE_OBJECT
    );
    // The same name twice for one agent in one executable.
    let (exe, st) = load_executable(agent, &good);
    assert_eq!(st, 0);
    let mut reader = HsaHandle { handle: 0 };
    // SAFETY: the simulator C ABI with live locals.
    unsafe {
        assert_eq!(
            hsa_code_object_reader_create_from_memory(
                good.as_ptr().cast(),
                good.len(),
                &mut reader
            ),
            0
        );
        assert_eq!(
            hsa_executable_load_agent_code_object(
                exe,
                agent,
                reader,
                std::ptr::null(),
                std::ptr::null_mut()
            ),
            HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED
        );
        // Loading into a frozen executable.
        assert_eq!(hsa_executable_freeze(exe, std::ptr::null()), 0);
        assert_eq!(
            hsa_executable_load_agent_code_object(
                exe,
                agent,
                reader,
                std::ptr::null(),
                std::ptr::null_mut()
            ),
            HSA_STATUS_ERROR_FROZEN_EXECUTABLE
        );
        assert_eq!(hsa_code_object_reader_destroy(reader), 0);
        assert_eq!(
            hsa_code_object_reader_destroy(reader),
            HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER
        );
    }
}

#[test]
fn loader_fuzz_gives_statuses_only() {
    let s = Session::start(quiet(PacketAbi::C));
    let agent = s.aie[0];
    let good = add_hsaco("add", "aie2p");
    let mut x = 0x1234_5678_9abc_def1u64;
    for i in 0..300 {
        let mut f = good.clone();
        if i % 3 == 0 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f.truncate((x % good.len() as u64) as usize);
        }
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !f.is_empty() {
                let n = f.len();
                f[(x as usize) % n] ^= 1 << (x >> 61);
            }
        }
        if f.is_empty() {
            continue;
        }
        let (exe, st) = load_executable(agent, &f);
        assert!(
            [
                HSA_STATUS_SUCCESS,
                HSA_STATUS_ERROR_INVALID_CODE_OBJECT,
                HSA_STATUS_ERROR_INCOMPATIBLE_ARGUMENTS
            ]
            .contains(&st),
            "case {i}: status {st:#x}"
        );
        // SAFETY: the simulator C ABI with a handle it gave out.
        assert_eq!(unsafe { hsa_executable_destroy(exe) }, 0);
    }
}

#[test]
fn runtimes_before_c_refuse_aie_code_objects() {
    for abi in [PacketAbi::A1, PacketAbi::A2, PacketAbi::A3, PacketAbi::B] {
        let s = Session::start(quiet(abi));
        assert_eq!(
            load_executable(s.aie[0], &add_hsaco("add", "aie2p")).1,
            HSA_STATUS_ERROR_INVALID_CODE_OBJECT,
            "{abi:?}"
        );
    }
}

#[test]
fn reserved_words_and_unknown_kernel_objects_are_refused() {
    let s = Session::start(quiet(PacketAbi::C));
    let pools = aie_pools(&s, s.aie[0]);
    let k = load_kernel(&pools, &add_desc("add", "aie2p"));
    let ops = operands(&pools);
    for (i, off) in [6usize, 16, 30, 40, 48, 56, 63].into_iter().enumerate() {
        let q = create_queue(s.aie[0]);
        let mut p = c_packet(&pools, &k, &ops, 0);
        p[off] = 1;
        q.submit(&[p]);
        assert_eq!(errors().len(), i + 1, "offset {off}");
        assert_eq!(
            *errors().last().unwrap(),
            HSA_STATUS_ERROR_INVALID_PACKET_FORMAT
        );
    }
    let q = create_queue(s.aie[0]);
    let mut bogus = k;
    bogus.kernel_object = 0xdead_beef_0000;
    q.submit(&[c_packet(&pools, &bogus, &ops, 0)]);
    assert_eq!(errors().len(), 8);
    assert_eq!(counters().dispatches, 0);
}

#[test]
fn a_failing_packet_suspends_the_queue() {
    let s = Session::start(quiet(PacketAbi::C));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let k = load_kernel(&pools, &add_desc("add", "aie2p"));
    let ops = operands(&pools);
    let (sig_ok, sig_bad, sig_after) = (new_signal(1), new_signal(1), new_signal(1));
    let good = c_packet(&pools, &k, &ops, sig_ok.handle);
    let mut bad = c_packet(&pools, &k, &ops, sig_bad.handle);
    bad[4] = 23; // count must be 24
    let after = c_packet(&pools, &k, &ops, sig_after.handle);
    q.submit(&[good, bad, after]);
    // The callback ran once; only the packet that ran dropped its signal; the read index
    // advanced by the packets that ran.
    assert_eq!(errors(), [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT]);
    assert_eq!((load(sig_ok), load(sig_bad), load(sig_after)), (0, 1, 1));
    assert_eq!(q.read_index(), 1);
    // Suspended: later doorbells are ignored.
    let sig_later = new_signal(1);
    q.submit(&[c_packet(&pools, &k, &ops, sig_later.handle)]);
    assert_eq!(errors().len(), 1);
    assert_eq!(load(sig_later), 1);
    assert_eq!(q.read_index(), 1);
    assert_eq!(counters().dispatches, 1);
    // A fresh queue works.
    let q2 = create_queue(s.aie[0]);
    let sig2 = new_signal(1);
    q2.submit(&[c_packet(&pools, &k, &ops, sig2.handle)]);
    assert_eq!(load(sig2), 0);
}

#[test]
fn error_state_suspends_a_c_queue() {
    let s = Session::start(Config {
        error_state: Some(1),
        ..quiet(PacketAbi::C)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let k = load_kernel(&pools, &add_desc("add", "aie2p"));
    let ops = operands(&pools);
    let sig = new_signal(1);
    q.submit(&[c_packet(&pools, &k, &ops, sig.handle)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_FATAL]);
    assert_eq!(load(sig), 1);
    q.submit(&[c_packet(&pools, &k, &ops, sig.handle)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_FATAL]);
    assert_eq!(q.read_index(), 0);
}

#[test]
fn thirty_third_loaded_kernel_fails_on_one_queue() {
    let s = Session::start(quiet(PacketAbi::C));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let ops = operands(&pools);
    // The same contents loaded 33 times are 33 PDIs: ROCR counts BOs, not contents.
    let ks: Vec<Kernel> = (0..33)
        .map(|_| load_kernel(&pools, &add_desc("add", "aie2p")))
        .collect();
    for k in &ks[..32] {
        q.submit(&[c_packet(&pools, k, &ops, 0)]);
    }
    assert!(errors().is_empty());
    q.submit(&[c_packet(&pools, &ks[32], &ops, 0)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_OUT_OF_RESOURCES]);
}
