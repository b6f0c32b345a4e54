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
    // Block-quantized types are for the weights of MUL_MAT and its fused forms (MUL_MAT_ADD,
    // MUL_MAT_<GLU>, RMS_NORM_MUL_MAT[_<GLU>|_ROPE], RMS_NORM_QKV_ROPE, RMS_NORM_FFN_<GLU>,
    // FLASH_ATTN_FFN_<GLU>, FLASH_ATTN_GLU_<GLU>, DECODE_LAYER[_BIAS|_HEAD_NORM][_FF]_<GLU>) and no
    // other op's.
    for o in v["ops"].as_array().unwrap() {
        let quantized = o["types"].as_array().unwrap().contains(&"q4_K".into());
        let op = o["op"].as_str().unwrap();
        let mul_mat = op.starts_with("MUL_MAT")
            || op.starts_with("RMS_NORM_MUL_MAT")
            || op.starts_with("RMS_NORM_QKV")
            || op.starts_with("RMS_NORM_FFN")
            || op.starts_with("FLASH_ATTN_FFN")
            || op.starts_with("FLASH_ATTN_GLU")
            || op.starts_with("DECODE_LAYER");
        assert_eq!(quantized, mul_mat, "{o}");
    }
    let types = |op: &str| {
        let o = v["ops"].as_array().unwrap().iter().find(|o| o["op"] == op);
        o.unwrap()["types"].clone()
    };
    assert_eq!(types("ARGMAX"), serde_json::json!(["f32", "i32"]));
    assert_eq!(types("COUNT_EQUAL"), serde_json::json!(["i32", "i64"]));
    assert_eq!(types("CROSS_ENTROPY_LOSS"), serde_json::json!(["f32"]));
    let mm = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == "MUL_MAT");
    assert_eq!(
        mm.unwrap()["types"],
        serde_json::json!([
            "f32", "f16", "bf16", "q4_0", "q8_0", "q4_K", "q4_1", "q5_0", "q5_K", "q6_K"
        ])
    );
}

/// A MUL_MAT of [256, 2] weights of `ty` (nb0 `block` bytes) by [256, 1] f32 activations.
fn mul_mat_request(ty: &str, block: u32) -> String {
    let row = 256 / if ty.ends_with("_K") { 256 } else { 32 } * block;
    format!(
        r#"{{"name":"mm","arch":"aie2p","op":"MUL_MAT","op_params":[],
        "inputs":[{{"ne":[256,2,1,1],"nb":[{block},{row},{r2},{r2}],"type":"{ty}"}},
                  {{"ne":[256,1,1,1],"nb":[4,1024,1024,1024],"type":"f32"}}],
        "output":{{"ne":[2,1,1,1],"nb":[4,8,8,8],"type":"f32"}}}}"#,
        r2 = 2 * row
    )
}

#[test]
fn quantized_weights_are_validated() {
    for (ty, block) in [
        ("q4_0", 18),
        ("q8_0", 34),
        ("q4_K", 144),
        ("q4_1", 20),
        ("q5_0", 22),
        ("q5_K", 176),
        ("q6_K", 210),
    ] {
        let desc = image::KernelDesc::parse_json(&mul_mat_request(ty, block)).unwrap();
        assert!(desc.validate().is_ok(), "{ty}");
        assert_eq!(
            desc.inputs[0].extent(),
            2 * 256 / desc.inputs[0].ty.block() as u64 * block as u64
        );
        // nb[0] must be the block's bytes.
        let bad = mul_mat_request(ty, block).replacen(&format!("[{block},"), "[2,", 1);
        let err = image::KernelDesc::parse_json(&bad).unwrap().validate();
        assert!(
            matches!(err, Err(image::DescError::Invalid(_))),
            "{ty}: {err:?}"
        );
    }
    // Quantized activations or outputs, and quantized operands of other ops, are unsupported.
    let swapped = mul_mat_request("q8_0", 34)
        .replace("\"type\":\"q8_0\"", "\"type\":\"X\"")
        .replace("\"type\":\"f32\"}],", "\"type\":\"q8_0\"}],")
        .replace("\"type\":\"X\"", "\"type\":\"f32\"");
    let err = image::KernelDesc::parse_json(&swapped).unwrap().validate();
    assert!(
        matches!(err, Err(image::DescError::Unsupported(_))),
        "{err:?}"
    );
    let relu = r#"{"name":"r","arch":"aie2","op":"RELU","op_params":[],
        "inputs":[{"ne":[32,1,1,1],"nb":[18,18,18,18],"type":"q4_0"}],
        "output":{"ne":[32,1,1,1],"nb":[4,128,128,128],"type":"f32"}}"#;
    let err = image::KernelDesc::parse_json(relu).unwrap().validate();
    assert!(
        matches!(err, Err(image::DescError::Unsupported(_))),
        "{err:?}"
    );
}

const REQ: &str = r#"{"name":"scale_f32_4","arch":"aie2","op":"SCALE",
  "op_params":[1073741824, 1065353216],
  "inputs":[{"ne":[4,1,1,1],"nb":[4,16,16,16],"type":"f32"}],
  "output":{"ne":[4,1,1,1],"nb":[4,16,16,16],"type":"f32"}}"#;

/// `HSA_SIM_COMPILE_DECLARE`: another compiler's ops, as far as the simulator has them; a
/// missing or malformed file is an error (exit 1), not the simulator's own list.
#[test]
fn capabilities_can_declare_another_compilers_ops() {
    let dir = tmpdir("declare");
    let theirs = dir.join("theirs.json");
    std::fs::write(
        &theirs,
        r#"{"protocol": 1, "compiler": "other", "archs": ["aie2p", "aie9"],
            "f16_as_bf16": false,
            "ops": [{"op": "ADD", "inputs": 2, "types": ["f32"]},
                    {"op": "MUL_MAT_SWIGLU", "inputs": 3, "types": ["f32", "q4_0"]},
                    {"op": "NOT_AN_OP", "inputs": 1, "types": ["f32"]}]}"#,
    )
    .unwrap();
    let out = bin()
        .arg("capabilities")
        .env("HSA_SIM_COMPILE_DECLARE", &theirs)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ops: Vec<&str> = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["ADD", "MUL_MAT_SWIGLU"]);
    assert_eq!(v["ops"][0]["types"], serde_json::json!(["f32"]));
    assert_eq!(v["archs"], serde_json::json!(["aie2p"]));
    assert_eq!(v["f16_as_bf16"], false);
    for bad in ["{not json", r#"{"archs": []}"#] {
        std::fs::write(&theirs, bad).unwrap();
        let out = bin()
            .arg("capabilities")
            .env("HSA_SIM_COMPILE_DECLARE", &theirs)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(out.stdout.is_empty());
        assert!(String::from_utf8_lossy(&out.stderr).contains("HSA_SIM_COMPILE_DECLARE"));
    }
    let out = bin()
        .arg("capabilities")
        .env("HSA_SIM_COMPILE_DECLARE", dir.join("missing.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

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

/// `--hsaco` (outside protocol 1) also writes the kernel as an AIE code object.
#[test]
fn compile_with_hsaco_writes_a_code_object() {
    let d = tmpdir("hsaco");
    std::fs::write(d.join("req.json"), REQ).unwrap();
    let out = bin()
        .args(["compile", "--hsaco", "--request"])
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
    let file = std::fs::read(d.join("out/scale_f32_4.hsaco")).unwrap();
    let (desc, _) = image::parse_image(&pdi).unwrap();
    let ks = aie_hsaco::read(&file, &desc.arch).unwrap();
    assert_eq!(ks.len(), 1);
    assert_eq!(ks[0].name, "scale_f32_4");
    assert_eq!((ks[0].pdi.clone(), ks[0].insts.clone()), (pdi, insts));
    assert_eq!(ks[0].kernarg_size, 32);
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

#[test]
fn reductions_are_validated() {
    let req = |op: &str, input: &str, inputs: usize, output: &str| {
        let inputs = vec![input; inputs].join(",");
        format!(
            r#"{{"name":"r","arch":"aie2","op":"{op}","op_params":[],
            "inputs":[{inputs}],"output":{output}}}"#
        )
    };
    let check = |text: String| image::KernelDesc::parse_json(&text).unwrap().validate();
    let f32_4x3 = r#"{"ne":[4,3,1,1],"nb":[4,16,48,48],"type":"f32"}"#;
    let i32_4x3 = r#"{"ne":[4,3,1,1],"nb":[4,16,48,48],"type":"i32"}"#;
    let i32_3 = r#"{"ne":[3,1,1,1],"nb":[4,12,12,12],"type":"i32"}"#;
    let i64_1 = r#"{"ne":[1,1,1,1],"nb":[8,8,8,8],"type":"i64"}"#;
    let f32_1 = r#"{"ne":[1,1,1,1],"nb":[4,4,4,4],"type":"f32"}"#;
    assert!(check(req("ARGMAX", f32_4x3, 1, i32_3)).is_ok());
    assert!(check(req("COUNT_EQUAL", i32_4x3, 2, i64_1)).is_ok());
    assert!(check(req("CROSS_ENTROPY_LOSS", f32_4x3, 2, f32_1)).is_ok());
    // Wrong output shapes are invalid; wrong types unsupported.
    let bad = check(req("ARGMAX", f32_4x3, 1, i64_1));
    assert!(matches!(bad, Err(image::DescError::Invalid(_))), "{bad:?}");
    let bad = check(req("COUNT_EQUAL", i32_4x3, 2, i32_3));
    assert!(matches!(bad, Err(image::DescError::Invalid(_))), "{bad:?}");
    let bad = check(req("COUNT_EQUAL", f32_4x3, 2, i64_1));
    assert!(
        matches!(bad, Err(image::DescError::Unsupported(_))),
        "{bad:?}"
    );
    let bad = check(req("CROSS_ENTROPY_LOSS", f32_4x3, 2, i64_1));
    assert!(
        matches!(bad, Err(image::DescError::Unsupported(_))),
        "{bad:?}"
    );
}

/// A FLASH_ATTN_EXT_MASK_SINKS request: q [64, 3, 8, 1] f32, k/v [64, 96, 2, 1] of `kv` (views
/// of a cache of 192 rows), an f16 mask [96, 3, 1, 1], f32 sinks [8], output [64, 8, 3, 1].
fn attention_request(kv: &str, out_ne: &str) -> String {
    let (row, head) = (128, 128 * 192);
    format!(
        r#"{{"name":"fa","arch":"aie2","op":"FLASH_ATTN_EXT_MASK_SINKS","op_params":[1040187392,0,0],
        "inputs":[{{"ne":[64,3,8,1],"nb":[4,256,768,6144],"type":"f32"}},
                  {{"ne":[64,96,2,1],"nb":[2,{row},{head},{h2}],"type":"{kv}"}},
                  {{"ne":[64,96,2,1],"nb":[2,{row},{head},{h2}],"type":"{kv}"}},
                  {{"ne":[96,3,1,1],"nb":[2,192,576,576],"type":"f16"}},
                  {{"ne":[8,1,1,1],"nb":[4,32,32,32],"type":"f32"}}],
        "output":{{"ne":{out_ne},"nb":[4,256,2048,6144],"type":"f32"}}}}"#,
        h2 = 2 * head
    )
}

#[test]
fn attention_is_validated() {
    let ok = attention_request("f16", "[64,8,3,1]");
    let desc = image::KernelDesc::parse_json(&ok).unwrap();
    assert!(desc.validate().is_ok(), "{:?}", desc.validate());
    // The output must be [Dv, n_head, n_q, n_seq] (not q's layout).
    let err = image::KernelDesc::parse_json(&attention_request("f16", "[64,3,8,1]"))
        .unwrap()
        .validate();
    assert!(matches!(err, Err(image::DescError::Invalid(_))), "{err:?}");
    // Quantized K/V (rows of two 34-byte q8_0 blocks) are not computed.
    let q8 = attention_request("q8_0", "[64,8,3,1]").replace("[2,128,", "[34,68,");
    let err = image::KernelDesc::parse_json(&q8).unwrap().validate();
    assert!(
        matches!(err, Err(image::DescError::Unsupported(_))),
        "{err:?}"
    );
    // An f32 mask is not ggml's.
    let f32_mask = ok.replace(
        r#""nb":[2,192,576,576],"type":"f16""#,
        r#""nb":[4,384,1152,1152],"type":"f32""#,
    );
    let err = image::KernelDesc::parse_json(&f32_mask).unwrap().validate();
    assert!(
        matches!(err, Err(image::DescError::Unsupported(_))),
        "{err:?}"
    );
    // Heads that do not divide (8 query heads over 3 kv heads).
    let bad_heads = ok.replace("[64,96,2,1]", "[64,96,3,1]");
    let err = image::KernelDesc::parse_json(&bad_heads)
        .unwrap()
        .validate();
    assert!(matches!(err, Err(image::DescError::Invalid(_))), "{err:?}");
}
