//! hsa-sim-time: one emulated IRON design timed by hsa-sim's timing model, without the
//! backend (what `scripts/bench.sh op` runs for a node test-backend-ops has no case of).
//!
//! ```text
//! hsa-sim-time <image.pdi> [--arch aie2p|aie2] [--dram-gbps GBPS] [--input N=FILE]...
//!               [--params V1[,V2...]] [--output N=FILE]...
//! ```
//! The image is what the IRON package's emulation target writes (image version 2). Its
//! operands are allocated at the sizes the design declares, the inputs filled with small
//! values, and the design runs once. `--input N=FILE` fills operand N (the runtime sequence's
//! argument, from 0) from the file's bytes instead: for kernels whose work depends on the
//! data (an attention skips the keys its mask hides), the data the time is meant for.
//! `--params` gives a design with run-time parameters (an attention's n_kv) their values, in
//! the order of the program's `params`; such a design cannot be timed without them. Prints
//! one JSON object: the device time, the busiest units and the runtime sequence's task groups
//! (when each ended, the bytes the shim channels moved in its span; docs/timing-model.md),
//! and for a parametric design `"params"`, the values it ran at by name. `--output N=FILE`
//! writes operand N's bytes after the run to the file: the design's results, to check against
//! a reference.
//! Exit codes: 0 success, 1 bad input or a design that fails to run.

use hsa_runtime64::cost;
use hsa_runtime64::exec::iron::{self, timing::Rates};
use serde_json::json;
use std::process::ExitCode;

const USAGE: &str =
    "usage: hsa-sim-time <image.pdi> [--arch aie2p|aie2] [--dram-gbps GBPS] [--input N=FILE]... \
     [--params V1[,V2...]] [--output N=FILE]...";
/// The largest image read (the emulation's core libraries included).
const MAX_IMAGE: u64 = 256 << 20;

fn run(args: &[String]) -> Result<serde_json::Value, String> {
    let mut path = None;
    let mut arch = "aie2p".to_owned();
    let mut dram = None;
    let mut inputs: Vec<(usize, String)> = Vec::new();
    let mut outputs: Vec<(usize, String)> = Vec::new();
    let mut values: Option<Vec<u32>> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--arch" => arch = it.next().ok_or(USAGE)?.clone(),
            "--dram-gbps" => {
                let v = it.next().ok_or(USAGE)?;
                let g: f64 = v
                    .parse()
                    .ok()
                    .filter(|g| (1.0..=1000.0).contains(g))
                    .ok_or_else(|| format!("--dram-gbps {v:?}: expected GB/s from 1 to 1000"))?;
                dram = Some(g);
            }
            flag @ ("--input" | "--output") => {
                let v = it.next().ok_or(USAGE)?;
                let (n, file) = v
                    .split_once('=')
                    .and_then(|(n, f)| Some((n.parse::<usize>().ok()?, f.to_owned())))
                    .ok_or_else(|| format!("{flag} {v:?}: expected N=FILE"))?;
                if flag == "--input" {
                    inputs.push((n, file));
                } else {
                    outputs.push((n, file));
                }
            }
            "--params" => {
                let v = it.next().ok_or(USAGE)?;
                let parsed = v
                    .split(',')
                    .map(|x| x.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| format!("--params {v:?}: expected V1[,V2...], integers"))?;
                values = Some(parsed);
            }
            _ if path.is_none() && !a.starts_with('-') => path = Some(a.clone()),
            _ => return Err(USAGE.to_owned()),
        }
    }
    let path = path.ok_or(USAGE)?;
    if !matches!(arch.as_str(), "aie2p" | "aie2") {
        return Err(format!("--arch {arch:?}: expected aie2p or aie2"));
    }
    let size = std::fs::metadata(&path)
        .map_err(|e| format!("{path}: {e}"))?
        .len();
    if size > MAX_IMAGE {
        return Err(format!("{path}: {size} bytes, more than an image may have"));
    }
    let img = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    let loaded = iron::load(&img).map_err(|e| format!("{path}: {e}"))?;
    let mut loaded = loaded.lock();
    let values = match values {
        Some(v) => v,
        None if loaded.params().is_empty() => Vec::new(),
        None => {
            let takes: Vec<String> = loaded
                .params()
                .iter()
                .map(|p| format!("{} ({} to {} in steps of {})", p.name, p.min, p.max, p.step))
                .collect();
            return Err(format!(
                "{path}: the design takes run-time parameters {}: give their values with \
                 --params",
                takes.join(", ")
            ));
        }
    };
    if values.len() != loaded.params().len() {
        let names: Vec<&str> = loaded.params().iter().map(|p| p.name.as_str()).collect();
        let takes = if names.is_empty() {
            "none".to_owned()
        } else {
            format!("{} ({})", names.len(), names.join(", "))
        };
        return Err(format!(
            "{path}: --params gives {} value(s), the design takes {takes}",
            values.len()
        ));
    }
    loaded
        .check_values(&values)
        .map_err(|e| format!("{path}: {e}"))?;
    let params: serde_json::Map<String, serde_json::Value> = loaded
        .params()
        .iter()
        .zip(&values)
        .map(|(p, &v)| (p.name.clone(), json!(v)))
        .collect();
    let sizes: Vec<usize> = loaded
        .program()
        .args
        .iter()
        .map(|a| a.bytes as usize)
        .collect();
    // Inputs of small bf16 values (0.125 as bf16 bits, whatever the element type) keep the
    // cores' host arithmetic off its slow paths; the output is overwritten.
    let mut buffers: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| [0x00, 0x3e].repeat(n.div_ceil(2)))
        .collect();
    for (b, &n) in buffers.iter_mut().zip(&sizes) {
        b.truncate(n);
    }
    for (n, file) in &inputs {
        let buffer = buffers.get_mut(*n).ok_or_else(|| {
            format!(
                "--input {n}={file}: the design has {} operands",
                sizes.len()
            )
        })?;
        let len = std::fs::metadata(file)
            .map_err(|e| format!("{file}: {e}"))?
            .len();
        if len > buffer.len() as u64 {
            return Err(format!(
                "{file}: {len} bytes, more than operand {n}'s {}",
                buffer.len()
            ));
        }
        let data = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
        buffer[..data.len()].copy_from_slice(&data);
    }
    let mut model = cost::model_for(&arch);
    if let Some(g) = dram {
        model.bandwidth_bytes_per_s = g * 1e9;
    }
    if let Some((n, file)) = outputs.iter().find(|(n, _)| *n >= sizes.len()) {
        return Err(format!(
            "--output {n}={file}: the design has {} operands",
            sizes.len()
        ));
    }
    let stats = iron::execute_buffers(&mut loaded, &values, &mut buffers, Rates::of(&model))?;
    for (n, file) in &outputs {
        std::fs::write(file, &buffers[*n]).map_err(|e| format!("{file}: {e}"))?;
    }
    let t = stats
        .timeline
        .ok_or("the design ran without a timeline (not an emulated IRON design)")?;
    let operand_bytes: usize = sizes.iter().sum();
    let mut out = json!({
        "arch": arch,
        "device_ns": t.device_ns,
        "core_busy_ns": t.core_busy_ns,
        "shim_busy_ns": t.shim_busy_ns,
        "tile_busy_ns": t.tile_busy_ns,
        "cores_counted": t.cores_counted,
        "groups": t
            .groups
            .iter()
            .map(|g| {
                json!({
                    "end_ns": g.end_ns,
                    "shim_bytes": g.shim_bytes,
                    "core_busy_ns": g.core_busy_ns,
                })
            })
            .collect::<Vec<_>>(),
        "operand_bytes": operand_bytes,
        "dram_bytes_per_s": model.bandwidth_bytes_per_s,
    });
    // Only a parametric design's output says at which values it was timed: the others' output
    // stays what it was.
    if !params.is_empty() {
        out["params"] = serde_json::Value::Object(params);
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hsa-sim-time: {e}");
            ExitCode::FAILURE
        }
    }
}
