//! The hsa-sim-compile protocol.

use hsa_runtime64::image;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hsa-sim-compile"))
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hsa-sim-compile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn capabilities_lists_ops() {
    let out = bin().arg("capabilities").output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["protocol"], 1);
    assert_eq!(v["compiler"], "hsa-sim-compile");
    assert_eq!(v["archs"], serde_json::json!(["aie2", "aie2p"]));
    let ops: Vec<&str> = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    for op in [
        "ADD", "SUB", "MUL", "DIV", "GELU", "SILU", "GELU_ERF", "SCALE", "CLAMP", "SQRT", "COS",
    ] {
        assert!(ops.contains(&op), "{op}");
    }
    assert_eq!(
        v["ops"][0]["types"],
        serde_json::json!(["f32", "f16", "bf16"])
    );
}

const REQ: &str = r#"{"name":"scale_f32_4","arch":"aie2","op":"SCALE",
  "op_params":[1073741824, 1065353216],
  "inputs":[{"ne":[4,1,1,1],"nb":[4,16,16,16],"type":"f32"}],
  "output":{"ne":[4,1,1,1],"nb":[4,16,16,16],"type":"f32"}}"#;

#[test]
fn compile_writes_pdi_and_insts() {
    let d = tmpdir("ok");
    std::fs::write(d.join("req.json"), REQ).unwrap();
    let out = bin()
        .args(["compile", "--request"])
        .arg(d.join("req.json"))
        .arg("--output-dir")
        .arg(d.join("out"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pdi = std::fs::read(d.join("out/scale_f32_4.pdi")).unwrap();
    let insts = std::fs::read(d.join("out/scale_f32_4_insts.bin")).unwrap();
    assert_eq!(&pdi[..8], b"HSASIMK1");
    assert_eq!(insts.len() % 4, 0);
    let (desc, _) = image::parse_image(&pdi).unwrap();
    assert_eq!(desc.op_params[..3], [1073741824, 1065353216, 0]);
    image::check_insts(&insts, &pdi).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(d.join("out")).unwrap().collect();
    assert_eq!(leftovers.len(), 2);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn unsupported_and_invalid_requests() {
    let d = tmpdir("bad");
    let run = |req: &str| {
        std::fs::write(d.join("req.json"), req).unwrap();
        let out = bin()
            .args(["compile", "--request"])
            .arg(d.join("req.json"))
            .arg("--output-dir")
            .arg(d.join("out"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&REQ.replace("SCALE", "CONV_2D"));
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1);
    assert_eq!(run(&REQ.replace("\"aie2\"", "\"aie4\"")).0, 2);
    assert_eq!(run(&REQ.replace("\"f32\"}]", "\"i8\"}]")).0, 2);
    assert_eq!(run("{not json").0, 1);
    assert_eq!(run(&REQ.replace("scale_f32_4", "../evil")).0, 1);
    assert_eq!(
        run(&REQ.replace(
            "\"ne\":[4,1,1,1],\"nb\":[4,16,16,16],\"type\":\"f32\"}}",
            "\"ne\":[5,1,1,1],\"nb\":[4,20,20,20],\"type\":\"f32\"}}"
        ))
        .0,
        1
    );
    let out = bin().arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    std::fs::remove_dir_all(&d).unwrap();
}
