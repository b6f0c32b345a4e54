//! Full dispatches per packet ABI, ABI mismatches, PDI limit, payload rewrite, counters.

mod common;
use common::*;
use hsa_runtime64::consts::*;
use hsa_runtime64::image::{self, TensorDesc};
use hsa_runtime64::ops::DType;
use hsa_runtime64::*;

const ALL: [PacketAbi; 5] = [
    PacketAbi::A1,
    PacketAbi::A2,
    PacketAbi::A3,
    PacketAbi::B,
    PacketAbi::C,
];

/// ADD of a [8,3] f32 tensor and a broadcast [4,1] f32 row, output [8,3].
fn add_setup(pools: &Pools, arch: &str, name: &str) -> (Kernel, [(*mut u8, usize); 3]) {
    let d = desc(
        name,
        arch,
        "ADD",
        vec![f32_tensor([8, 3, 1, 1]), f32_tensor([4, 1, 1, 1])],
        f32_tensor([8, 3, 1, 1]),
    );
    let k = load_kernel(pools, &d);
    let a = alloc(pools.data, 96);
    let b = alloc(pools.data, 16);
    let c = alloc(pools.data, 96);
    write_f32(a, &(0..24).map(|i| i as f32).collect::<Vec<_>>());
    write_f32(b, &[100.0, 200.0, 300.0, 400.0]);
    (k, [(a, 96), (b, 16), (c, 96)])
}

fn add_expected() -> Vec<f32> {
    (0..24)
        .map(|i| i as f32 + [100.0, 200.0, 300.0, 400.0][i % 4])
        .collect()
}

#[test]
fn full_dispatch_per_abi() {
    for abi in ALL {
        let s = Session::start(quiet(abi));
        let pools = aie_pools(&s, s.aie[0]);
        let q = create_queue(s.aie[0]);
        let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
        let sig = new_signal(1);
        let pkt = packet_for(abi, &pools, &k, &ops, sig.handle);
        q.submit(&[pkt]);
        assert_eq!(errors(), Vec::<u32>::new(), "{abi:?}");
        assert_eq!(read_f32(ops[2].0, 24), add_expected(), "{abi:?}");
        assert_eq!(q.read_index(), 1);
        // A1 never touches a completion signal (the packet carries none); the others subtract 1.
        let expected_signal = if abi == PacketAbi::A1 { 1 } else { 0 };
        assert_eq!(load(sig), expected_signal, "{abi:?}");
        let c = counters();
        assert_eq!(
            (c.doorbells, c.packets, c.dispatches, c.chains, c.pdi_loads),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(c.bytes_written, 96);
        assert!(c.device_time_ns > 0);
    }
}

#[test]
fn abi_mismatch_is_reported_not_hung() {
    for runtime_abi in ALL {
        for client_abi in ALL {
            // A1 packets are valid A2 packets (no completion signal); everything else differs.
            let compatible = runtime_abi == client_abi
                || (runtime_abi == PacketAbi::A2 && client_abi == PacketAbi::A1);
            let s = Session::start(quiet(runtime_abi));
            let pools = aie_pools(&s, s.aie[0]);
            let q = create_queue(s.aie[0]);
            let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
            let sig = new_signal(1);
            q.submit(&[packet_for(client_abi, &pools, &k, &ops, sig.handle)]);
            // A generation-c queue advances its read index by the packets that ran only, and
            // suspends itself on the failure.
            let ran = compatible || runtime_abi != PacketAbi::C;
            assert_eq!(
                q.read_index(),
                u64::from(ran),
                "{runtime_abi:?} <- {client_abi:?}: read index"
            );
            if compatible {
                assert!(
                    errors().is_empty(),
                    "{runtime_abi:?} <- {client_abi:?}: {:?}",
                    counters().last_error
                );
                assert_eq!(read_f32(ops[2].0, 24), add_expected());
            } else {
                // (A Gen B runtime reads a Gen C packet's insts_size 0 and refuses it.)
                assert_eq!(
                    errors(),
                    [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT],
                    "{runtime_abi:?} <- {client_abi:?}"
                );
                assert!(read_f32(ops[2].0, 24).iter().all(|&x| x == 0.0));
                assert_eq!(counters().dispatch_errors, 1);
            }
        }
    }
}

#[test]
fn error_marks_completion_signals() {
    let s = Session::start(quiet(PacketAbi::A2));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
    let sig_ok = new_signal(1);
    let sig_bad = new_signal(1);
    let sig_after = new_signal(1);
    let good = packet_for(PacketAbi::A2, &pools, &k, &ops, sig_ok.handle);
    let mut bad = packet_for(PacketAbi::A2, &pools, &k, &ops, sig_bad.handle);
    bad[4] = (bad[4] & 0xF0) | 2; // state QUEUED instead of NEW
    let after = packet_for(PacketAbi::A2, &pools, &k, &ops, sig_after.handle);
    q.submit(&[good, bad, after]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT]);
    assert_eq!((load(sig_ok), load(sig_bad), load(sig_after)), (0, -1, -1));
    assert_eq!(q.read_index(), 3);
    let c = counters();
    assert_eq!((c.packets, c.dispatches), (3, 1));
    assert!(c.last_error.contains("packet 1"), "{}", c.last_error);
}

#[test]
fn several_packets_form_chains() {
    let s = Session::start(quiet(PacketAbi::A1));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
    // 3 operands: slot = 52 + 4 * (6 + 6) = 100 bytes -> 40 per 4 KiB chain.
    let pkts: Vec<[u8; 64]> = (0..50)
        .map(|_| packet_for(PacketAbi::A1, &pools, &k, &ops, 0))
        .collect();
    q.submit(&pkts);
    assert!(errors().is_empty());
    let c = counters();
    assert_eq!(
        (c.doorbells, c.packets, c.dispatches, c.chains, c.pdi_loads),
        (1, 50, 50, 2, 1)
    );
    // Ring wraps: 50 more behind a second doorbell (slots 50..99 -> indices mod 64).
    let pkts: Vec<[u8; 64]> = (0..30)
        .map(|_| packet_for(PacketAbi::A1, &pools, &k, &ops, 0))
        .collect();
    q.submit(&pkts);
    assert!(errors().is_empty());
    assert_eq!(q.read_index(), 80);
    assert_eq!(counters().chains, 3);
    // Writing more than a ring's worth before ringing is refused, not read out of bounds.
    let pkts: Vec<[u8; 64]> = (0..65)
        .map(|_| packet_for(PacketAbi::A1, &pools, &k, &ops, 0))
        .collect();
    q.write(&pkts);
    q.ring();
    assert_eq!(errors(), [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT]);
    assert_eq!(q.read_index(), q.write_index());
}

/// One batch bringing two new PDIs rebuilds the hardware context once (ROCR configures every
/// cached PDI into the new context); a chained command whose PDI differs from the one before it
/// costs the rocrtst figure (46.7 µs), one that repeats it 10 µs.
#[test]
fn a_batch_of_new_pdis_rebuilds_once_and_chained_pdi_switches_cost_more() {
    let dir = std::env::temp_dir().join(format!("hsa-sim-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("counters.json");
    let s = Session::start(Config {
        counters_path: Some(path.clone()),
        ..quiet(PacketAbi::A1)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (a, ops) = add_setup(&pools, "aie2p", "add_a");
    let (b, _) = add_setup(&pools, "aie2p", "add_b");
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    q.submit(&[
        packet_for(PacketAbi::A1, &pools, &a, &ops, 0),
        packet_for(PacketAbi::A1, &pools, &b, &ops, 0),
    ]);
    let v = read();
    assert_eq!(
        (v["pdi_loads"].as_u64(), v["context_rebuilds"].as_u64()),
        (Some(2), Some(1))
    );
    let first = v["device_time_ns"].as_u64().unwrap();
    // 90 + 46.7 (b after a) + one rebuild of 4480 µs.
    assert!((4_616_700..4_616_800).contains(&first), "{first}");
    // Steady state: both PDIs resident, no rebuild; a, a, b: 90 + 10 + 46.7 µs.
    q.submit(&[
        packet_for(PacketAbi::A1, &pools, &a, &ops, 0),
        packet_for(PacketAbi::A1, &pools, &a, &ops, 0),
        packet_for(PacketAbi::A1, &pools, &b, &ops, 0),
    ]);
    let v = read();
    assert_eq!(v["context_rebuilds"], 1);
    let second = v["device_time_ns"].as_u64().unwrap() - first;
    assert!((146_700..146_800).contains(&second), "{second}");
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn thirty_third_pdi_fails() {
    let s = Session::start(quiet(PacketAbi::A1));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let mut kernels = Vec::new();
    let mut last_ops = None;
    for i in 0..33 {
        let (k, ops) = add_setup(&pools, "aie2p", &format!("add_{i}"));
        kernels.push(k);
        last_ops = Some(ops);
    }
    let ops = last_ops.unwrap();
    for k in &kernels[..32] {
        q.submit(&[packet_for(PacketAbi::A1, &pools, k, &ops, 0)]);
    }
    assert!(errors().is_empty());
    let c = counters();
    assert_eq!((c.pdi_loads, c.context_rebuilds), (32, 32));
    // Re-using a resident PDI is free.
    q.submit(&[packet_for(PacketAbi::A1, &pools, &kernels[0], &ops, 0)]);
    assert_eq!(counters().pdi_loads, 32);
    q.submit(&[packet_for(PacketAbi::A1, &pools, &kernels[32], &ops, 0)]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_OUT_OF_RESOURCES]);
    assert!(counters().last_error.contains("33rd"));
    // Another queue has its own 32 slots.
    let q2 = create_queue(s.aie[0]);
    q2.submit(&[packet_for(PacketAbi::A1, &pools, &kernels[32], &ops, 0)]);
    assert_eq!(errors().len(), 1);
}

#[test]
fn payload_data2_is_rewritten() {
    for abi in [PacketAbi::A1, PacketAbi::A2, PacketAbi::A3] {
        let s = Session::start(quiet(abi));
        let pools = aie_pools(&s, s.aie[0]);
        let q = create_queue(s.aie[0]);
        let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
        let payload = ert_payload(&pools, &k, &ops);
        let fmt = if abi == PacketAbi::A3 { 200 } else { 3 };
        let pkt = ert_packet(fmt, 3, 0, payload);
        q.submit(&[pkt]);
        assert!(errors().is_empty());
        // SAFETY: the payload/queue pointers are live allocations of this session, read within their bounds.
        let words = unsafe { std::slice::from_raw_parts(payload.add(8) as *const u32, 5) };
        let expected = 0x0400_0000 | (k.insts as u64 & 0x02FF_FFFF) as u32;
        assert_eq!(
            words[2], expected,
            "{abi:?}: data[2] = instruction device address"
        );
        assert_eq!(words[3], (k.insts as u64 >> 32) as u32);
        // Submitting the same payload again without refilling it fails.
        q.submit(&[pkt]);
        assert_eq!(errors(), [HSA_STATUS_ERROR_INVALID_ALLOCATION], "{abi:?}");
        assert!(
            counters().last_error.contains("refilled"),
            "{}",
            counters().last_error
        );
    }
}

#[test]
fn counters_file_is_rewritten_per_doorbell() {
    let dir = std::env::temp_dir().join(format!("hsa-sim-counters-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("counters.json");
    let cfg = Config {
        counters_path: Some(path.clone()),
        ..quiet(PacketAbi::A1)
    };
    let s = Session::start(cfg);
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
    q.submit(&[
        packet_for(PacketAbi::A1, &pools, &k, &ops, 0),
        packet_for(PacketAbi::A1, &pools, &k, &ops, 0),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["packet_abi"], "a1");
    assert_eq!(v["doorbells"], 1);
    assert_eq!(v["packets"], 2);
    assert_eq!(v["dispatches"], 2);
    assert_eq!(v["chains"], 1);
    assert_eq!(v["pdi_loads"], 1);
    assert_eq!(v["context_rebuilds"], 1);
    assert_eq!(v["bytes_read"], 2 * (96 + 16));
    assert_eq!(v["bytes_written"], 2 * 96);
    assert_eq!(v["dispatch_errors"], 0);
    // 90 µs first command + rebuild (8 columns x 360 µs + 1.6 ms) + 10 µs for the second command
    // (its PDI already loaded) + bytes / 56 GB/s (a few ns).
    let t = v["device_time_ns"].as_u64().unwrap();
    assert!((4_580_000..4_580_100).contains(&t), "{t}");
    q.submit(&[[0u8; 64]]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["doorbells"], 2);
    assert_eq!(v["dispatch_errors"], 1);
    drop(s);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["doorbells"], 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_kernels_and_operands_are_refused() {
    let s = Session::start(quiet(PacketAbi::A1));
    let pools = aie_pools(&s, s.aie[0]);
    let cpu_pool = s.pools(s.cpu)[0];
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
    let submit = |k: &Kernel, ops: Ops| {
        ERRORS.lock().clear();
        q.submit(&[packet_for(PacketAbi::A1, &pools, k, ops, 0)]);
        (errors(), counters().last_error)
    };
    // A PDI that is not a simulator image.
    let junk = Kernel {
        pdi: alloc(pools.dev, 64),
        ..k
    };
    write_bytes(junk.pdi, b"\x00\x01\x02\x03not a kernel image at all......");
    let (e, msg) = submit(&junk, &ops);
    assert_eq!(e, [HSA_STATUS_ERROR]);
    assert!(msg.contains("not a simulator kernel image"), "{msg}");
    // Instructions of another kernel.
    let (k2, _) = add_setup(&pools, "aie2p", "other");
    let mixed = Kernel {
        insts: k2.insts,
        ..k
    };
    let (e, msg) = submit(&mixed, &ops);
    assert_eq!(e, [HSA_STATUS_ERROR]);
    assert!(msg.contains("does not belong"), "{msg}");
    // PDI outside the dev heap.
    let pdi_in_data = alloc(pools.data, 4096);
    write_bytes(
        pdi_in_data,
        &image::encode_image(&desc(
            "x",
            "aie2p",
            "ABS",
            vec![f32_tensor([1, 1, 1, 1])],
            f32_tensor([1, 1, 1, 1]),
        )),
    );
    let (e, msg) = submit(
        &Kernel {
            pdi: pdi_in_data,
            ..k
        },
        &ops,
    );
    assert_eq!(e, [HSA_STATUS_ERROR_INVALID_ALLOCATION]);
    assert!(msg.contains("dev-heap"), "{msg}");
    // Kernel compiled for another arch.
    let (k3, _) = add_setup(&pools, "aie2", "add_aie2");
    let (e, msg) = submit(&k3, &ops);
    assert_eq!(e, [HSA_STATUS_ERROR]);
    assert!(msg.contains("compiled for aie2"), "{msg}");
    // Operand in CPU-agent memory.
    let cpu_mem = alloc(cpu_pool, 96);
    let (e, msg) = submit(&k, &[ops[0], ops[1], (cpu_mem, 96)]);
    assert_eq!(e, [HSA_STATUS_ERROR_INVALID_ALLOCATION]);
    assert!(msg.contains("CPU"), "{msg}");
    // Operand too small for its tensor, or running past its allocation.
    let (e, _) = submit(&k, &[ops[0], ops[1], (ops[2].0, 64)]);
    assert_eq!(e, [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT]);
    // SAFETY: the payload/queue pointers are live allocations of this session, read within their bounds.
    let (e, _) = submit(&k, &[ops[0], ops[1], (unsafe { ops[2].0.add(4090) }, 96)]);
    assert_eq!(e, [HSA_STATUS_ERROR_INVALID_ALLOCATION]);
    // Wrong operand count.
    let (e, msg) = submit(&k, &ops[..2]);
    assert_eq!(e, [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT]);
    assert!(msg.contains("takes 3 operands"), "{msg}");
    // Wrong instruction size units (bytes instead of dwords).
    let wrong = Kernel {
        insts_bytes: k.insts_bytes * 4,
        ..k
    };
    let (e, msg) = submit(&wrong, &ops);
    assert_eq!(e, [HSA_STATUS_ERROR]);
    assert!(msg.contains("dwords"), "{msg}");
    // A slot that was never written.
    ERRORS.lock().clear();
    let mut invalid = [0u8; 64];
    invalid[0] = 1;
    q.submit(&[invalid]);
    assert_eq!(errors(), [HSA_STATUS_ERROR_INVALID_PACKET_FORMAT]);
    assert!(counters().last_error.contains("INVALID"));
    // Nothing was executed.
    assert!(read_f32(ops[2].0, 24).iter().all(|&x| x == 0.0));
}

#[test]
fn bf16_and_noncontiguous_operands() {
    let s = Session::start(quiet(PacketAbi::B));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    // src0: a transposed view of a 3x4 f32 matrix (ne = [3, 4], nb = [16, 4]).
    let src0 = TensorDesc {
        ne: [3, 4, 1, 1],
        nb: [16, 4, 48, 48],
        ty: DType::F32,
    };
    let src1 = TensorDesc::contiguous([3, 1, 1, 1], DType::F32);
    let dst = TensorDesc::contiguous([3, 4, 1, 1], DType::Bf16);
    let d = desc("mul_t", "aie2p", "MUL", vec![src0, src1], dst);
    let k = load_kernel(&pools, &d);
    let a = alloc(pools.data, 48);
    let b = alloc(pools.data, 12);
    let c = alloc(pools.data, 24);
    write_f32(a, &(0..12).map(|i| i as f32 + 0.1).collect::<Vec<_>>());
    write_f32(b, &[1.0, 2.0, 3.0]);
    let sig = new_signal(1);
    q.submit(&[packet_for(
        PacketAbi::B,
        &pools,
        &k,
        &[(a, 48), (b, 12), (c, 24)],
        sig.handle,
    )]);
    assert!(errors().is_empty(), "{}", counters().last_error);
    assert_eq!(load(sig), 0);
    let out = read_u16(c, 12);
    for i1 in 0..4 {
        for i0 in 0..3 {
            let x = (i0 * 4 + i1) as f32 + 0.1; // element [i0, i1] of the transposed view
            let y = x * [1.0, 2.0, 3.0][i0];
            assert_eq!(out[i1 * 3 + i0], exec::bf16_from_f32(y), "[{i0},{i1}]");
        }
    }
    // bf16 src0 with f32 src1, in place (output aliases src0).
    let t = TensorDesc::contiguous([4, 1, 1, 1], DType::Bf16);
    let d = desc(
        "add_bf16_inplace",
        "aie2p",
        "ADD",
        vec![t.clone(), TensorDesc::contiguous([1, 1, 1, 1], DType::F32)],
        t,
    );
    let k = load_kernel(&pools, &d);
    let x = alloc(pools.data, 8);
    let one = alloc(pools.data, 4);
    let vals: Vec<u8> = [1.0f32, 2.5, -3.0, 256.0]
        .iter()
        .flat_map(|v| exec::bf16_from_f32(*v).to_le_bytes())
        .collect();
    write_bytes(x, &vals);
    write_f32(one, &[1.0]);
    q.submit(&[packet_for(
        PacketAbi::B,
        &pools,
        &k,
        &[(x, 8), (one, 4), (x, 8)],
        0,
    )]);
    assert!(errors().is_empty(), "{}", counters().last_error);
    let out: Vec<f32> = read_u16(x, 4).into_iter().map(exec::bf16_to_f32).collect();
    assert_eq!(out, [2.0, 3.5, -2.0, 256.0]); // 257 rounds to 256 in bf16 (ties to even)
}

#[test]
fn scale_clamp_and_f16_unary() {
    let s = Session::start(quiet(PacketAbi::A3));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let t = f32_tensor([4, 1, 1, 1]);
    let x = alloc(pools.data, 16);
    let y = alloc(pools.data, 16);
    write_f32(x, &[-2.0, -0.5, 0.5, 3.0]);
    let mut scale = desc("scale", "aie2p", "SCALE", vec![t.clone()], t.clone());
    scale.op_params[0] = 2.0f32.to_bits() as i32;
    scale.op_params[1] = 1.0f32.to_bits() as i32;
    let mut clamp = desc("clamp", "aie2p", "CLAMP", vec![t.clone()], t.clone());
    clamp.op_params[0] = (-1.0f32).to_bits() as i32;
    clamp.op_params[1] = 1.0f32.to_bits() as i32;
    let ks = load_kernel(&pools, &scale);
    let kc = load_kernel(&pools, &clamp);
    let z = alloc(pools.data, 16);
    // Two kernels behind one doorbell: y = 2x + 1, then z = clamp(y, -1, 1).
    q.submit(&[
        packet_for(PacketAbi::A3, &pools, &ks, &[(x, 16), (y, 16)], 0),
        packet_for(PacketAbi::A3, &pools, &kc, &[(y, 16), (z, 16)], 0),
    ]);
    assert!(errors().is_empty(), "{}", counters().last_error);
    assert_eq!(read_f32(y, 4), [-3.0, 0.0, 2.0, 7.0]);
    assert_eq!(read_f32(z, 4), [-1.0, 0.0, 1.0, 1.0]);
    assert_eq!(counters().chains, 1);
    // f16 in, f16 out.
    let h = TensorDesc::contiguous([4, 1, 1, 1], DType::F16);
    let k = load_kernel(&pools, &desc("sqr_f16", "aie2p", "SQR", vec![h.clone()], h));
    let hx = alloc(pools.data, 8);
    let hy = alloc(pools.data, 8);
    let vals: Vec<u8> = [1.5f32, -2.0, 0.1, 300.0]
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
        .collect();
    write_bytes(hx, &vals);
    q.submit(&[packet_for(
        PacketAbi::A3,
        &pools,
        &k,
        &[(hx, 8), (hy, 8)],
        0,
    )]);
    assert!(errors().is_empty(), "{}", counters().last_error);
    let out: Vec<f32> = read_u16(hy, 4)
        .into_iter()
        .map(|b| half::f16::from_bits(b).to_f32())
        .collect();
    let x01 = half::f16::from_f32(0.1).to_f32();
    assert_eq!(
        out,
        [
            2.25,
            4.0,
            half::f16::from_f32(x01 * x01).to_f32(),
            f32::INFINITY
        ]
    ); // 300^2 overflows f16
}

/// `HSA_SIM_EXECUTE=0`: the dispatch is validated and charged like an executed one, but the
/// output keeps its bytes.
#[test]
fn without_execution_outputs_are_untouched_and_costs_still_counted() {
    let cfg = Config::from_lookup(|k| (k == "HSA_SIM_EXECUTE").then(|| "0".to_string())).unwrap();
    assert!(!cfg.execute);
    assert!(Config::from_lookup(|_| None).unwrap().execute);
    assert!(Config::from_lookup(|k| (k == "HSA_SIM_EXECUTE").then(|| "maybe".into())).is_err());
    let s = Session::start(Config {
        execute: false,
        ..quiet(PacketAbi::A1)
    });
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let (k, ops) = add_setup(&pools, "aie2p", "add_f32");
    write_f32(ops[2].0, &[-1.0; 24]);
    q.submit(&[packet_for(PacketAbi::A1, &pools, &k, &ops, 0)]);
    assert!(errors().is_empty());
    assert_eq!(
        read_f32(ops[2].0, 24),
        vec![-1.0; 24],
        "the output was computed"
    );
    let c = counters();
    assert_eq!(c.dispatches, 1);
    assert_eq!(c.bytes_read, 96 + 16);
    assert!(c.device_time_ns > 0);
}
