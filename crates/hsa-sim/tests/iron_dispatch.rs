//! Version-2 images (the IRON designs, emulated) dispatched through the HSA API like any
//! kernel: every packet ABI, the counters of emulated dispatches, a corrupt image refused.

mod common;
mod iron_common;

use common::*;
use hsa_runtime64::*;

/// ADD of a [8,3] f32 tensor and a broadcast [4,1] f32 row (the IRON broadcast design).
fn add_image() -> Vec<u8> {
    let case = iron_common::Case::new(
        "ADD",
        &[
            iron_common::Operand::dense("f32", [8, 3, 1, 1]),
            iron_common::Operand::dense("f32", [4, 1, 1, 1]),
        ],
        iron_common::Operand::dense("f32", [8, 3, 1, 1]),
    );
    let req = iron_common::request_json(&case, "aie2p");
    iron_common::compile_emu_from(&iron_common::package_src(), &req, &case.name("aie2p"))
        .expect("the IRON package compiles it")
}

/// The image in the dev heap; under ABI c also loaded as an AIE code object (kernel "add").
fn load_image(pools: &Pools, img: &[u8], abi: PacketAbi) -> Kernel {
    let insts = image::encode_insts_v2(img);
    let pdi = alloc(pools.dev, img.len());
    write_bytes(pdi, img);
    let ip = alloc(pools.dev, insts.len());
    write_bytes(ip, &insts);
    let kernel_object = if abi == PacketAbi::C {
        let hsaco = aie_hsaco::write_single("aie2p", "add", img, &insts, 3, 1).unwrap();
        load_code_object(pools.agent, &hsaco, "add").expect("the image loads as a code object")
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

fn operands(pools: &Pools) -> [(*mut u8, usize); 3] {
    let a = alloc(pools.data, 96);
    let b = alloc(pools.data, 16);
    let c = alloc(pools.data, 96);
    write_f32(a, &(0..24).map(|i| i as f32).collect::<Vec<_>>());
    write_f32(b, &[100.0, 200.0, 300.0, 400.0]);
    [(a, 96), (b, 16), (c, 96)]
}

#[test]
fn emulated_dispatch_per_abi() {
    let img = add_image();
    let want: Vec<f32> = (0..24)
        .map(|i| i as f32 + [100.0, 200.0, 300.0, 400.0][i % 4])
        .collect();
    for abi in [
        PacketAbi::A1,
        PacketAbi::A2,
        PacketAbi::A3,
        PacketAbi::B,
        PacketAbi::C,
    ] {
        let s = Session::start(quiet(abi));
        let pools = aie_pools(&s, s.aie[0]);
        let q = create_queue(s.aie[0]);
        let k = load_image(&pools, &img, abi);
        let ops = operands(&pools);
        let sig = new_signal(1);
        q.submit(&[packet_for(abi, &pools, &k, &ops, sig.handle)]);
        assert_eq!(errors(), Vec::<u32>::new(), "{abi:?}");
        assert_eq!(read_f32(ops[2].0, 24), want, "{abi:?}");
        let c = counters();
        assert_eq!(c.dispatches, 1);
        assert_eq!(c.emulated_ops.get("ADD"), Some(&1), "{:?}", c.emulated_ops);
        assert!(c.bytes_written >= 96);
    }
}

#[test]
fn corrupt_emulation_image_is_a_dispatch_error() {
    let mut img = add_image();
    img[24] = b'['; // the program JSON no longer parses
    let s = Session::start(quiet(PacketAbi::A2));
    let pools = aie_pools(&s, s.aie[0]);
    let q = create_queue(s.aie[0]);
    let k = load_image(&pools, &img, PacketAbi::A2);
    let ops = operands(&pools);
    let sig = new_signal(1);
    q.submit(&[packet_for(PacketAbi::A2, &pools, &k, &ops, sig.handle)]);
    assert!(!errors().is_empty(), "a corrupt image must be reported");
    assert!(
        counters().last_error.contains("program JSON"),
        "{}",
        counters().last_error
    );
}
