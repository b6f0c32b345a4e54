//! hsa-sim-compile: the simulator's kernel compiler (protocol 1).
//!
//! ```text
//! hsa-sim-compile capabilities
//! hsa-sim-compile compile --request <req.json> --output-dir <dir> [--hsaco]
//! ```
//! `--hsaco` (not part of protocol 1; the backend never passes it) also writes `<name>.hsaco`,
//! the kernel as an AIE code object for packet ABI c (shared `aie-hsaco` writer).
//! Exit codes: 0 success, 1 bad input (usage, unreadable or malformed request, I/O error),
//! 2 well-formed but unsupported request (one-line reason on stderr).

use hsa_runtime64::image::{self, DescError, KernelDesc};
use hsa_runtime64::ops::{self, Op};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage: hsa-sim-compile capabilities\n       \
                     hsa-sim-compile compile --request <req.json> --output-dir <dir> [--hsaco]";

fn capabilities() -> serde_json::Value {
    let ops: Vec<serde_json::Value> = Op::all_names()
        .into_iter()
        .filter_map(|name| Op::from_name(name).map(|op| (name, op)))
        .map(|(name, op)| {
            let types: Vec<&str> = op.all_types().iter().map(|t| t.name()).collect();
            json!({
                "op": name,
                "inputs": op.arity(),
                "outputs": op.outputs(),
                "types": types,
                "broadcast": matches!(op, Op::Binary(_) | Op::RmsNormMul | Op::RmsNormMulAdd | Op::MulMat | Op::MulMatGlu(_) | Op::MulMatAdd | Op::NormedMulMat(_) | Op::NormedMulMatBias | Op::NormedMulMatRope { .. } | Op::NormedQkv { .. } | Op::NormedFfn(_) | Op::ProjectedFfn(_) | Op::AttnFfn(_) | Op::AttnGlu(_) | Op::DecodeLayer { .. } | Op::SoftMax { .. } | Op::Rope { .. } | Op::FlashAttnExt { .. } | Op::SetRows),
                "noncontiguous": true,
                // An attention's KV length may be given at dispatch (`n_kv_step`).
                "run_time_n_kv": matches!(
                    op,
                    Op::AttnFfn(_)
                        | Op::AttnGlu(_)
                        | Op::DecodeLayer { .. }
                        | Op::FlashAttnExt {
                            mask: true,
                            sinks: false
                        }
                ),
                "op_params": op.params_doc(),
            })
        })
        .collect();
    json!({
        "protocol": 1,
        "compiler": "hsa-sim-compile",
        "version": env!("CARGO_PKG_VERSION"),
        "archs": ops::ARCHS,
        "image_format": "HSASIMK1",
        "f16_as_bf16": true,
        "types_note": "float operands may independently be f32, f16 or bf16 (computed in f32, rounded on store) unless the op says otherwise; \
                       ROPE's i32 type is for its positions, MUL_MAT's block-quantized types (q4_0, q4_1, q5_0, q8_0, q4_K, q5_K, q6_K) for its weights (input 0) only; \
                       ARGMAX reads f32 and writes i32, COUNT_EQUAL reads i32 and writes i64, CROSS_ENTROPY_LOSS is f32 only; \
                       FLASH_ATTN_EXT takes f32 q, f32/f16/bf16 k and v, an f16 mask and f32 sinks, and writes f32; \
                       SET_ROWS takes f32/f16 rows and i32/i64 indices",
        "ops": ops,
    })
}

/// `HSA_SIM_COMPILE_DECLARE=<file>`: the capabilities declared instead of the simulator's own
/// are another compiler's (the IRON package's, say), as far as the simulator implements them:
/// its ops the executor knows, its archs the simulator has. The backend then asks for exactly
/// the kernels that compiler declares, and the simulator computes them (scripts/bench.sh: what a
/// real NPU would run). A shape that compiler would refuse at compile time is still built here.
fn declared_instead(path: &str) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("HSA_SIM_COMPILE_DECLARE: cannot read {path}: {e}"))?;
    let theirs: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("HSA_SIM_COMPILE_DECLARE: {path} is not JSON: {e}"))?;
    let list = |key: &str| {
        theirs[key]
            .as_array()
            .cloned()
            .ok_or_else(|| format!("HSA_SIM_COMPILE_DECLARE: {path} has no \"{key}\" list"))
    };
    let ops: Vec<serde_json::Value> = list("ops")?
        .into_iter()
        .filter(|o| o["op"].as_str().and_then(Op::from_name).is_some())
        .collect();
    let archs: Vec<serde_json::Value> = list("archs")?
        .into_iter()
        .filter(|a| a.as_str().is_some_and(|a| ops::ARCHS.contains(&a)))
        .collect();
    let mut caps = capabilities();
    caps["compiler"] = json!(format!(
        "hsa-sim-compile declaring {}'s ops",
        theirs["compiler"].as_str().unwrap_or("another compiler")
    ));
    caps["archs"] = json!(archs);
    caps["ops"] = json!(ops);
    caps["f16_as_bf16"] = json!(theirs["f16_as_bf16"].as_bool().unwrap_or(false));
    Ok(caps)
}

/// Writes `bytes` to `dir/name` through a temporary file and a rename.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    // A failed write (a full disk) or rename leaves no temporary file behind.
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, dir.join(name)))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}

fn compile(request: &Path, out_dir: &Path, hsaco: bool) -> Result<(), (u8, String)> {
    let text = std::fs::read_to_string(request)
        .map_err(|e| (1, format!("cannot read request {}: {e}", request.display())))?;
    let desc = KernelDesc::parse_json(&text).map_err(|e| (1, e.to_string()))?;
    match desc.validate() {
        Ok(_) => {}
        Err(e @ DescError::Invalid(_)) => return Err((1, e.to_string())),
        Err(e @ DescError::Unsupported(_)) => return Err((2, e.to_string())),
    }
    std::fs::create_dir_all(out_dir)
        .map_err(|e| (1, format!("cannot create {}: {e}", out_dir.display())))?;
    let pdi = image::encode_image(&desc);
    // A kernel taking its KV length at dispatch: the backend writes it into the last word.
    let insts = image::encode_insts_with(&pdi, if desc.n_kv_step.is_some() { &[0] } else { &[] });
    write_atomic(out_dir, &format!("{}.pdi", desc.name), &pdi)
        .and_then(|_| write_atomic(out_dir, &format!("{}_insts.bin", desc.name), &insts))
        .map_err(|e| (1, format!("cannot write to {}: {e}", out_dir.display())))?;
    if hsaco {
        let n_args = desc.inputs.len() as u32 + 1;
        let columns = hsa_runtime64::cost::model_for(&desc.arch).columns;
        let file = aie_hsaco::write_single(&desc.arch, &desc.name, &pdi, &insts, n_args, columns)
            .map_err(|e| (1, format!("cannot build the hsaco: {e}")))?;
        write_atomic(out_dir, &format!("{}.hsaco", desc.name), &file)
            .map_err(|e| (1, format!("cannot write to {}: {e}", out_dir.display())))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("capabilities") if args.len() == 1 => {
            match std::env::var("HSA_SIM_COMPILE_DECLARE") {
                Ok(path) => match declared_instead(&path) {
                    Ok(caps) => println!("{caps}"),
                    Err(msg) => {
                        eprintln!("hsa-sim-compile: {msg}");
                        return ExitCode::from(1);
                    }
                },
                Err(_) => println!("{}", capabilities()),
            }
            ExitCode::SUCCESS
        }
        Some("compile") => {
            let mut request: Option<PathBuf> = None;
            let mut out_dir: Option<PathBuf> = None;
            let mut hsaco = false;
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--request" => request = it.next().map(PathBuf::from),
                    "--output-dir" => out_dir = it.next().map(PathBuf::from),
                    "--hsaco" => hsaco = true,
                    other => {
                        eprintln!("hsa-sim-compile: unknown argument {other:?}\n{USAGE}");
                        return ExitCode::from(1);
                    }
                }
            }
            let (Some(request), Some(out_dir)) = (request, out_dir) else {
                eprintln!("hsa-sim-compile: compile needs --request and --output-dir\n{USAGE}");
                return ExitCode::from(1);
            };
            match compile(&request, &out_dir, hsaco) {
                Ok(()) => ExitCode::SUCCESS,
                Err((code, msg)) => {
                    eprintln!("hsa-sim-compile: {msg}");
                    ExitCode::from(code)
                }
            }
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(1)
        }
    }
}
