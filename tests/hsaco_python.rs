//! The IRON package's hsaco writer (`src/ggml_hsa_iron/hsaco.py`, for machines without
//! mlir-aie's packer) and the shared Rust writer (`crates/aie-hsaco`) produce identical bytes,
//! which the strict reader accepts.

use std::process::Command;

use aie_hsaco::{Kernel, KernelKind, Section};

const SCRIPT: &str = r#"
import sys
from ggml_hsa_iron import hsaco
k = hsaco.Kernel
files = {
    "one": {"aie2p": [k("add-f32_4-f32_4-f32_4", insts=b"\x01\x00\x00\x00\x02\x00\x00\x00",
                        pdi=b"\xab" * 32, kernarg_size=48, num_cols=8)]},
    "two": {"aie2": [k("k1", insts=b"\x01\x00\x00\x00", pdi=b"\x09" * 16, kernarg_size=48, num_cols=4),
                     k("k2", insts=b"\x01\x00\x00\x00", pdi=b"\x09" * 16, kernarg_size=32, num_cols=4)],
            "aie2p": [k("main:sequence", insts=b"\x7fELF-ish", kind=hsaco.KIND_FULL_ELF, kernarg_size=32)]},
}
sys.stdout.buffer.write(hsaco.write(files[sys.argv[1]]))
"#;

fn python(which: &str) -> Option<Vec<u8>> {
    let out = Command::new("python3")
        .args(["-c", SCRIPT, which])
        .env("PYTHONPATH", concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out.stdout)
}

#[test]
fn python_and_rust_writers_agree() {
    let Some(one) = python("one") else {
        eprintln!("skipped: no python3");
        return;
    };
    let rust_one = aie_hsaco::write(&[Section {
        arch: "aie2p".into(),
        kernels: vec![Kernel::pdi_insts(
            "add-f32_4-f32_4-f32_4",
            vec![0xab; 32],
            vec![1, 0, 0, 0, 2, 0, 0, 0],
            3,
            8,
        )],
    }])
    .unwrap();
    assert_eq!(one, rust_one);

    let two = python("two").unwrap();
    let k = |name: &str, kernarg_size| Kernel {
        kernarg_size,
        ..Kernel::pdi_insts(name, vec![9; 16], vec![1, 0, 0, 0], 0, 4)
    };
    let sections = vec![
        Section {
            arch: "aie2".into(),
            kernels: vec![k("k1", 48), k("k2", 32)],
        },
        Section {
            arch: "aie2p".into(),
            kernels: vec![Kernel {
                name: "main:sequence".into(),
                kind: KernelKind::FullElf,
                insts: b"\x7fELF-ish".to_vec(),
                pdi: vec![],
                kernarg_size: 32,
                num_cols: 1,
            }],
        },
    ];
    assert_eq!(two, aie_hsaco::write(&sections).unwrap());
    assert_eq!(aie_hsaco::read_all(&two).unwrap(), sections);
}
