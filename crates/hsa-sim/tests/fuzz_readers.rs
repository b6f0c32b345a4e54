//! Property tests of hsa-sim's readers of outside input: kernel images (PDIs) and
//! their instruction streams, compile requests (`hsa-sim-compile`'s input), the 64-byte packets
//! of every ABI generation, and AIE code objects through the loader's C ABI.
//!
//! Inputs are mutated seeds (`tests/corpus/<reader>/` of the repository, see
//! `tests/fuzz/mutate.rs`); packets are also mutated from valid packets built in a live session
//! (their addresses exist only there). Checked: no panic, no hang, an error status or message,
//! and what is accepted is consistent. `PROPTEST_CASES` raises the case count.

mod common;
#[path = "../../../tests/fuzz/mutate.rs"]
mod mutate;

use std::cell::Cell;
use std::path::{Path, PathBuf};

use common::*;
use hsa_runtime64::config::PacketAbi;
use hsa_runtime64::consts::*;
use hsa_runtime64::image::{self, TensorDesc};
use hsa_runtime64::ops::DType;
use hsa_runtime64::packet::{self, DecodeCtx};
use mutate::{cases, corpus, mutated, mutated_text, no_hang};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};

fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus")
}

fn seeds(reader: &str) -> Vec<Vec<u8>> {
    corpus(&corpus_root(), reader)
}

fn runner(default_cases: u32) -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases: cases(default_cases),
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

fn add_desc(name: &str) -> image::KernelDesc {
    desc(
        name,
        "aie2p",
        "ADD",
        vec![f32_tensor([8, 3, 1, 1]), f32_tensor([8, 1, 1, 1])],
        f32_tensor([8, 3, 1, 1]),
    )
}

/// The seeds of the `image`, `request` and `sim_insts` corpora as this build writes them.
fn binary_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let add = add_desc("add");
    let mut scale = desc(
        "scale",
        "aie2",
        "SCALE",
        vec![TensorDesc::contiguous([64, 1, 1, 1], DType::F16)],
        TensorDesc::contiguous([64, 1, 1, 1], DType::F16),
    );
    scale.op_params[0] = 0x3f00_0000;
    scale.f16_as_bf16 = true;
    let add_image = image::encode_image(&add);
    let scale_image = image::encode_image(&scale);
    // A version-2 (emulation) image: header, program JSON, library bytes.
    let program = br#"{"program":"seed"}"#;
    let library = b"\x7fELF library bytes";
    let mut v2 = image::IMAGE_MAGIC.to_vec();
    for w in [
        image::IMAGE_V2,
        program.len() as u32,
        library.len() as u32,
        0,
    ] {
        v2.extend(w.to_le_bytes());
    }
    v2.extend_from_slice(program);
    v2.extend_from_slice(library);
    vec![
        ("image", "01-add.pdi", add_image.clone()),
        ("image", "02-scale-f16.pdi", scale_image.clone()),
        ("image", "03-v2.pdi", v2.clone()),
        ("request", "01-add.json", add.to_json().into_bytes()),
        ("request", "02-scale-f16.json", scale.to_json().into_bytes()),
        ("sim_insts", "01-add.bin", image::encode_insts(&add_image)),
        ("sim_insts", "02-v2.bin", image::encode_insts_v2(&v2)),
    ]
}

#[test]
fn binary_seed_corpus_is_current() {
    let bless = std::env::var_os("GGML_HSA_BLESS").is_some();
    for (reader, file, bytes) in binary_seeds() {
        let path = corpus_root().join(reader).join(file);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (GGML_HSA_BLESS=1 writes it)", path.display()));
        assert!(
            committed == bytes,
            "{} differs from what this build writes (GGML_HSA_BLESS=1 rewrites it)",
            path.display()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(512),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Kernel images: an image `parse_image` accepts has a valid description and the length its
    /// header says; the header readers agree with each other.
    #[test]
    fn kernel_images(bytes in mutated(seeds("image"))) {
        let input = bytes.clone();
        let (parsed, len, split) = no_hang("parse_image", move || {
            (
                image::parse_image(&input).map(|(d, _)| d),
                image::image_len_from_header(&input),
                image::split_image_v2(&input).map(|(a, b)| (a.len(), b.len())),
            )
        });
        match parsed {
            Ok(desc) => {
                prop_assert!(len.as_ref().is_ok_and(|&l| l <= bytes.len()));
                prop_assert!(desc.validate().is_ok());
                prop_assert!(split.is_err(), "a version-1 image is not a version-2 one");
            }
            Err(e) => prop_assert!(!e.is_empty()),
        }
        if let Ok((json, lib)) = split {
            prop_assert_eq!(Ok(image::IMAGE_V2_HEADER_LEN + json + lib), len);
        }
    }

    /// Instruction streams: only the stream made for an image is accepted for it.
    #[test]
    fn instruction_streams(
        insts in mutated(seeds("sim_insts")),
        image_index in 0usize..3,
    ) {
        let images = seeds("image");
        let img = images[image_index % images.len()].clone();
        let (i2, img2) = (insts.clone(), img.clone());
        let checked = no_hang("check_insts", move || image::check_insts(&i2, &img2));
        let v1 = image::encode_insts(&img);
        let v2 = image::encode_insts_v2(&img);
        if checked.is_ok() {
            // The 8 words name the image (a stream may say it is longer: real ones are).
            prop_assert!(insts.len() >= 32 && (insts[..32] == v1[..] || insts[..32] == v2[..]));
        } else {
            prop_assert!(insts != v1 || image::image_version(&img) == Ok(image::IMAGE_V2));
        }
    }

    /// Compile requests (`hsa-sim-compile --request`): a request that parses and validates
    /// serialises back to itself and encodes to an image that parses to it.
    #[test]
    fn compile_requests(text in mutated_text(seeds("request"))) {
        let parsed = no_hang("KernelDesc::parse_json", move || {
            image::KernelDesc::parse_json(&text).map(|d| {
                let valid = d.validate().is_ok();
                (d, valid)
            })
        });
        match parsed {
            Ok((desc, valid)) => {
                let again = image::KernelDesc::parse_json(&desc.to_json());
                prop_assert_eq!(again.as_ref(), Ok(&desc));
                let img = image::encode_image(&desc);
                match image::parse_image(&img) {
                    Ok((back, _)) => {
                        prop_assert!(valid);
                        prop_assert_eq!(back, desc);
                    }
                    Err(e) => prop_assert!(!valid || e.contains("payload length"), "{}", e),
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

/// Mutates the 64-byte `slot` with the corpus mutator (keeping it 64 bytes).
fn to_slot(bytes: &[u8]) -> [u8; PACKET_SIZE] {
    let mut slot = [0u8; PACKET_SIZE];
    let n = bytes.len().min(PACKET_SIZE);
    slot[..n].copy_from_slice(&bytes[..n]);
    slot
}

/// Packets of every ABI generation, decoded against a live session's memory and code objects:
/// a slot the decoder refuses gets a packet error status with a message.
#[test]
fn packets_of_every_abi() {
    for abi in [
        PacketAbi::A1,
        PacketAbi::A2,
        PacketAbi::A3,
        PacketAbi::B,
        PacketAbi::C,
    ] {
        let s = Session::start(quiet(abi));
        let pools = aie_pools(&s, s.aie[0]);
        let k = load_kernel(&pools, &add_desc("add"));
        let a = alloc(pools.data, 96);
        let b = alloc(pools.data, 32);
        let c = alloc(pools.data, 96);
        let ops = [(a, 96), (b, 32), (c, 96)];
        let signal = new_signal(1);
        let mut live = vec![packet_for(abi, &pools, &k, &ops, signal.handle).to_vec()];
        live.push(packet_for(abi, &pools, &k, &ops[..1], 0).to_vec());
        live.extend(seeds("packet"));
        let rt = hsa_runtime64::runtime::get().expect("a live runtime");
        let format = packet::format_for(abi);
        let (accepted, refused) = (Cell::new(0), Cell::new(0));
        runner(256)
            .run(&mutated(live), |bytes| {
                let slot = to_slot(&bytes);
                let mem = rt.memory.lock();
                let ctx = DecodeCtx {
                    mem: &mem,
                    topo: &rt.topo,
                    code: &rt.code,
                };
                match format.decode(&slot, &ctx) {
                    // Operand addresses are resolved and checked after decoding (the queue's
                    // prepare step); the decoder's part is a well-formed command.
                    Ok(cmd) => {
                        accepted.set(accepted.get() + 1);
                        prop_assert!(cmd.operands.len() <= u16::MAX as usize);
                    }
                    Err(e) => {
                        refused.set(refused.get() + 1);
                        prop_assert!(e.status != HSA_STATUS_SUCCESS && !e.msg.is_empty());
                    }
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("ABI {}: {e}", abi.name()));
        let (accepted, refused) = (accepted.get(), refused.get());
        eprintln!(
            "ABI {}: {accepted} packets decoded, {refused} refused",
            abi.name()
        );
        assert!(
            refused > 0,
            "ABI {}: no mutated packet was refused",
            abi.name()
        );
        drop(s);
    }
}

/// AIE code objects through `hsa_executable_load_agent_code_object` (packet ABI c): a file the
/// loader accepts yields kernels; any other is refused with a status, never a crash.
#[test]
fn code_objects_through_the_loader() {
    let s = Session::start(quiet(PacketAbi::C));
    let agent = s.aie[0];
    let add = add_desc("add");
    let img = image::encode_image(&add);
    let insts = image::encode_insts(&img);
    let mut files = vec![aie_hsaco::write_single("aie2p", "add", &img, &insts, 3, 1).unwrap()];
    files.extend(corpus(&corpus_root(), "hsaco"));
    let (loaded, refused) = (Cell::new(0), Cell::new(0));
    runner(256)
        .run(&mutated(files), |bytes| {
            let (_exe, st) = load_executable(agent, &bytes);
            if st == HSA_STATUS_SUCCESS {
                loaded.set(loaded.get() + 1);
                prop_assert!(aie_hsaco::read(&bytes, "aie2p").is_ok());
            } else {
                refused.set(refused.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    let (loaded, refused) = (loaded.get(), refused.get());
    eprintln!("code objects: {loaded} loaded, {refused} refused");
    assert!(
        loaded > 0 && refused > 0,
        "{loaded} loaded, {refused} refused"
    );
}
