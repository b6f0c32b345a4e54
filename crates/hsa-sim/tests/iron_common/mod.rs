//! Helpers of the IRON emulation tests: compile a request with the IRON package's emulation
//! target, run it with the emulation executor, and compare with the reference executor.
#![allow(dead_code)]

use hsa_runtime64::exec::{self, OperandMem};
use hsa_runtime64::image::{self, KernelDesc};
use hsa_runtime64::ops::Op;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The package directory tests compile with (a mutated copy in the mutation test).
pub fn package_src() -> PathBuf {
    repo().join("src")
}

/// The emulation's cache of AIE core libraries, shared with the workspace's other tests and
/// scripts/check-iron.sh (content-keyed, so safe to share).
pub fn cache_dir() -> PathBuf {
    // Tests know cargo's scratch directory; the example that shares this module does not.
    let d = option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("ggml-hsa-emu-cache");
    std::fs::create_dir_all(&d).expect("cache dir");
    d
}

#[derive(Clone, Debug)]
pub struct Operand {
    pub ty: &'static str,
    pub ne: [i64; 4],
}

impl Operand {
    pub fn dense(ty: &'static str, ne: [i64; 4]) -> Operand {
        Operand { ty, ne }
    }
    pub fn size(&self) -> usize {
        match self.ty {
            "f32" | "i32" => 4,
            "bf16" | "f16" | "i16" => 2,
            _ => 1,
        }
    }
    pub fn n(&self) -> usize {
        self.ne.iter().product::<i64>() as usize
    }
    pub fn nbytes(&self) -> usize {
        self.n() * self.size()
    }
    fn json(&self) -> String {
        let s = self.size() as i64;
        let nb = [
            s,
            s * self.ne[0],
            s * self.ne[0] * self.ne[1],
            s * self.ne[0] * self.ne[1] * self.ne[2],
        ];
        format!(
            r#"{{"type":"{}","ne":[{},{},{},{}],"nb":[{},{},{},{}]}}"#,
            self.ty, self.ne[0], self.ne[1], self.ne[2], self.ne[3], nb[0], nb[1], nb[2], nb[3]
        )
    }
}

#[derive(Clone, Debug)]
pub struct Case {
    pub op: &'static str,
    pub inputs: Vec<Operand>,
    pub output: Operand,
    pub params: Vec<i32>,
    /// Input magnitude (see [`data_scaled`]).
    pub scale: f64,
}

pub fn request_json(c: &Case, arch: &str) -> String {
    let name = format!(
        "{}-{}-{}",
        c.op.to_lowercase(),
        arch,
        fnv(format!("{:?}", (c.op, &c.inputs, &c.output, &c.params)).as_bytes())
    );
    let ins: Vec<String> = c.inputs.iter().map(|o| o.json()).collect();
    format!(
        r#"{{"name":"{name}","arch":"{arch}","op":"{}","op_params":{:?},"inputs":[{}],"output":{}}}"#,
        c.op,
        c.params,
        ins.join(","),
        c.output.json()
    )
}

fn fnv(b: &[u8]) -> String {
    format!("{:016x}", image::fnv1a64(b))
}

/// Compiles `req` with `python3 -m ggml_hsa_iron --target emu` from `src`; the image, or the
/// compiler's stderr on failure.
pub fn compile_emu_from(src: &Path, req: &str, name: &str) -> Result<Vec<u8>, String> {
    compile_emu_with(src, req, name, &cache_dir())
}

/// Compiles `req` with the emulation target of the package in `src`, its kernel libraries cached
/// in `cache`; the image, or the compiler's message.
pub fn compile_emu_with(
    src: &Path,
    req: &str,
    name: &str,
    cache: &Path,
) -> Result<Vec<u8>, String> {
    let dir = tempdir();
    let rpath = dir.join("req.json");
    std::fs::write(&rpath, req).expect("write request");
    let out = Command::new("python3")
        .args([
            "-m",
            "ggml_hsa_iron",
            "--target",
            "emu",
            "compile",
            "--request",
        ])
        .arg(&rpath)
        .arg("--output-dir")
        .arg(&dir)
        .env("PYTHONPATH", src)
        .env("GGML_HSA_EMU_CACHE_DIR", cache)
        .output()
        .expect("run python3");
    let res = if out.status.success() {
        Ok(std::fs::read(dir.join(format!("{name}.pdi"))).expect("pdi written"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let _ = std::fs::remove_dir_all(&dir);
    res
}

pub fn tempdir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "iron-emu-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).expect("tempdir");
    d
}

/// Deterministic pseudo-random operand bytes.
pub fn data(o: &Operand, seed: u64, op: &str) -> Vec<u8> {
    data_scaled(o, seed, op, 1.0)
}

/// [`data`] times `scale`; with a scale above 1000 every 17th value is +-infinity.
pub fn data_scaled(o: &Operand, seed: u64, op: &str, scale: f64) -> Vec<u8> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) as u32) as f64 / (1u64 << 31) as f64
    };
    let positive = matches!(op, "SQRT" | "LOG");
    let mut out = Vec::with_capacity(o.nbytes());
    for _ in 0..o.n() {
        let x = (next() * 4.0 - 2.0) * scale;
        let x = if positive { x.abs() + 0.01 } else { x };
        let x = if scale > 1000.0 && out.len() % 17 == 0 {
            if out.len() % 34 == 0 {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            }
        } else {
            x
        };
        match o.ty {
            "f32" => out.extend_from_slice(&(x as f32).to_le_bytes()),
            "bf16" => out.extend_from_slice(&exec::bf16_from_f32(x as f32).to_le_bytes()),
            "f16" => out.extend_from_slice(&half::f16::from_f64(x).to_bits().to_le_bytes()),
            "i8" => out.push(((next() * 256.0) as i32 - 128) as i8 as u8),
            "i16" => out.extend_from_slice(&(((next() * 512.0) as i32 - 256) as i16).to_le_bytes()),
            "i32" => out.extend_from_slice(&(((next() * 2000.0) as i32) - 1000).to_le_bytes()),
            t => panic!("type {t}"),
        }
    }
    out
}

/// Operand buffers with slack after the tensor (the design moves whole DMA words).
pub struct Buffers {
    pub bufs: Vec<Vec<u8>>,
}

impl Buffers {
    pub fn new(c: &Case, seed: u64) -> Buffers {
        let mut bufs: Vec<Vec<u8>> = c
            .inputs
            .iter()
            .enumerate()
            .map(|(i, o)| data_scaled(o, seed + i as u64, c.op, c.scale))
            .collect();
        bufs.push(vec![0xA5; c.output.nbytes()]);
        for b in &mut bufs {
            b.resize(b.len() + 64, 0);
        }
        Buffers { bufs }
    }
}

/// Runs an emulation image over `b`.
pub fn run_emu(img: &[u8], b: &mut Buffers) -> Result<(), String> {
    run_emu_timed(img, b, &hsa_runtime64::cost::AIE2P).map(|_| ())
}

/// Runs an emulation image over `b` with the array rates of `model`; the dispatch's timeline.
pub fn run_emu_timed(
    img: &[u8],
    b: &mut Buffers,
    model: &hsa_runtime64::cost::ArchModel,
) -> Result<exec::iron::timing::Timeline, String> {
    run_emu_timed_with(img, &[], b, model)
}

/// [`run_emu_timed`] of a design with run-time parameters, at `values` (in its params' order).
pub fn run_emu_timed_with(
    img: &[u8],
    values: &[u32],
    b: &mut Buffers,
    model: &hsa_runtime64::cost::ArchModel,
) -> Result<exec::iron::timing::Timeline, String> {
    let loaded = exec::iron::load(img)?;
    let mut loaded = loaded.lock();
    let rates = exec::iron::timing::Rates::of(model);
    let stats = exec::iron::execute_buffers(&mut loaded, values, &mut b.bufs, rates)?;
    stats
        .timeline
        .ok_or_else(|| "an emulated design ran without a timeline".to_string())
}

/// The reference result of `c` on `b`'s inputs (the oracle), as f64 values.
pub fn reference(c: &Case, req: &str, b: &Buffers) -> Vec<f64> {
    if c.output.ty.starts_with('i') {
        return int_reference(c, b);
    }
    let desc = KernelDesc::parse_json(req).expect("request parses");
    let op = Op::from_name(c.op).unwrap_or_else(|| panic!("hsa-sim has no op {}", c.op));
    let mut bufs: Vec<Vec<u8>> = b.bufs.clone();
    let mems: Vec<OperandMem> = bufs
        .iter_mut()
        .map(|v| OperandMem {
            addr: v.as_mut_ptr() as usize,
            len: v.len(),
        })
        .collect();
    // SAFETY: the OperandMems cover live, distinct Vecs owned here.
    unsafe { exec::execute(&desc, op, &mems) }.expect("reference runs");
    values(&c.output, bufs.last().expect("output"))
}

fn ints(o: &Operand, b: &[u8]) -> Vec<i64> {
    (0..o.n())
        .map(|i| match o.ty {
            "i8" => b[i] as i8 as i64,
            "i16" => i16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as i64,
            _ => i32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) as i64,
        })
        .collect()
}

fn wrap(ty: &str, v: i64) -> f64 {
    (match ty {
        "i8" => v as i8 as i64,
        "i16" => v as i16 as i64,
        _ => v as i32 as i64,
    }) as f64
}

fn int_reference(c: &Case, b: &Buffers) -> Vec<f64> {
    let t = c.output.ty;
    let a = ints(&c.inputs[0], &b.bufs[0]);
    match c.op {
        "NEG" => a.iter().map(|&x| wrap(t, -x)).collect(),
        "ADD" | "SUB" | "MUL" => {
            let y = ints(&c.inputs[1], &b.bufs[1]);
            a.iter()
                .zip(&y)
                .map(|(&x, &y)| {
                    wrap(
                        t,
                        match c.op {
                            "ADD" => x + y,
                            "SUB" => x - y,
                            _ => x * y,
                        },
                    )
                })
                .collect()
        }
        "MUL_MAT" => {
            let w = a;
            let x = ints(&c.inputs[1], &b.bufs[1]);
            let (k, n, m) = (
                c.inputs[0].ne[0] as usize,
                c.inputs[0].ne[1] as usize,
                c.inputs[1].ne[1] as usize,
            );
            let mut out = vec![0f64; n * m];
            for i in 0..m {
                for j in 0..n {
                    let s: i64 = (0..k).map(|q| w[j * k + q] * x[i * k + q]).sum();
                    out[i * n + j] = wrap(t, s);
                }
            }
            out
        }
        op => panic!("no integer reference for {op}"),
    }
}

pub fn values(o: &Operand, b: &[u8]) -> Vec<f64> {
    (0..o.n())
        .map(|i| match o.ty {
            "f32" => f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) as f64,
            "bf16" => exec::bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) as f64,
            "i8" | "i16" | "i32" => ints(o, b)[i] as f64,
            t => panic!("type {t}"),
        })
        .collect()
}

/// Normalised mean squared error (test-backend-ops' measure).
pub fn nmse(got: &[f64], want: &[f64]) -> f64 {
    let (mut e, mut s) = (0.0, 0.0);
    for (g, w) in got.iter().zip(want) {
        if g == w {
            s += if w.is_finite() { w * w } else { 0.0 };
            continue;
        }
        if !g.is_finite() || !w.is_finite() {
            return f64::INFINITY;
        }
        e += (g - w) * (g - w);
        s += w * w;
    }
    if s == 0.0 {
        e
    } else {
        e / s
    }
}

impl Case {
    pub fn new(op: &'static str, inputs: &[Operand], output: Operand) -> Case {
        Case {
            op,
            inputs: inputs.to_vec(),
            output,
            params: Vec::new(),
            scale: 1.0,
        }
    }

    pub fn scale(mut self, s: f64) -> Case {
        self.scale = s;
        self
    }

    pub fn params(mut self, p: &[i32]) -> Case {
        self.params = p.to_vec();
        self
    }

    pub fn name(&self, arch: &str) -> String {
        let req = request_json(self, arch);
        let v: serde_json::Value = serde_json::from_str(&req).unwrap();
        v["name"].as_str().unwrap().to_owned()
    }

    /// Emulated result vs reference: Ok(nmse) or the failure.
    pub fn run_from(&self, src: &Path, arch: &str) -> Result<f64, String> {
        let req = request_json(self, arch);
        let img = compile_emu_from(src, &req, &self.name(arch))?;
        let mut b = Buffers::new(self, 7);
        run_emu(&img, &mut b)?;
        let want = reference(self, &req, &b);
        let got = values(&self.output, b.bufs.last().unwrap());
        // Bytes after the output tensor are the design's pad words: never beyond them.
        Ok(nmse(&got, &want))
    }

    pub fn tolerance(&self) -> f64 {
        if self.output.ty.starts_with('i') {
            0.0
        } else if self.op == "MUL_MAT" {
            5e-4 // test-backend-ops' MUL_MAT bound (f32 is multiplied as bf16)
        } else if self.output.ty == "bf16" || self.inputs.iter().any(|i| i.ty == "bf16") {
            1e-5
        } else {
            1e-7
        }
    }

    pub fn check(&self, arch: &str) {
        let t = std::time::Instant::now();
        match self.run_from(&package_src(), arch) {
            Ok(e) => {
                eprintln!(
                    "{arch} {} {:?}: nmse {e:.3e} ({:.2} s)",
                    self.op,
                    self.inputs.iter().map(|o| (o.ty, o.ne)).collect::<Vec<_>>(),
                    t.elapsed().as_secs_f64()
                );
                assert!(
                    e <= self.tolerance(),
                    "{arch} {self:?}: nmse {e:e} above {}",
                    self.tolerance()
                );
            }
            Err(m) => panic!("{arch} {self:?}: {m}"),
        }
    }
}
