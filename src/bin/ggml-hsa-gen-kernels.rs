//! ggml-hsa-gen-kernels: compiles the kernels a config lists ahead of time, into
//! `<output-dir>/<arch>/<name>.pdi` + `<name>_insts.bin`, the layout `GGML_HSA_KERNEL_DIR` expects,
//! or with `--format hsaco` into `<output-dir>/<arch>/<name>.hsaco` (an AIE code object, the
//! kernel named `<name>`, written by the shared aie-hsaco writer), each listed with its files'
//! sizes and checksums in `<output-dir>/<arch>/.ggml-hsa-kernels` (the backend declines a copy
//! that no longer matches).
//! Machines that run the backend from such a directory need no kernel compiler at all.
//!
//! The whole config is validated before the compiler is asked anything, so a config can be checked
//! on a machine without one. Compiles run in parallel through the same compiler protocol the
//! backend's JIT uses; everything the tool and the compiler print goes to stderr.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Parser;
use ggml_hsa::config::DEFAULT_JIT_COMPILER;
use ggml_hsa::kernels::gen_config::{ConfigError, KernelConfig};
use ggml_hsa::kernels::{Arch, Compiler, KernelDesc};

/// Pregenerates NPU kernels for ggml-hsa from a kernel config, so that the backend can run them
/// (GGML_HSA_KERNEL_DIR=<output-dir>) without a kernel compiler.
#[derive(Debug, Parser)]
#[command(name = "ggml-hsa-gen-kernels", version)]
struct Args {
    /// The kernel config (JSON) listing the kernels to generate
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Where to write the kernels, as <DIR>/<arch>/<name>.pdi and <name>_insts.bin
    #[arg(long, value_name = "DIR")]
    output_dir: PathBuf,
    /// Also print the compiler's output for every kernel
    #[arg(long)]
    verbose: bool,
    /// Kernels compiled at the same time [default: the number of CPUs]
    #[arg(long, value_name = "N")]
    jobs: Option<NonZeroUsize>,
    // The help is built from the constant so that it names the backend's actual default.
    #[arg(
        long,
        value_name = "COMMAND",
        help = format!(
            "The kernel compiler's command line [default: $GGML_HSA_JIT_COMPILER, else \
             `{DEFAULT_JIT_COMPILER}`]"
        )
    )]
    compiler: Option<String>,
    /// What to write per kernel: `pdi` (<name>.pdi + <name>_insts.bin), `hsaco` (<name>.hsaco,
    /// an AIE code object for packet ABI c; every ABI can use it) or `both`
    #[arg(long, value_enum, default_value_t = Format::Pdi)]
    format: Format,
}

/// The kernel file format written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Pdi,
    Hsaco,
    Both,
}

/// Why the tool stopped before compiling (failed compiles are reported in the summary instead).
#[derive(Debug, thiserror::Error)]
enum GenError {
    #[error("cannot read the kernel config {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Config { path: PathBuf, source: ConfigError },
    #[error("{path}: {count} invalid kernel entr{}", if *.count == 1 { "y" } else { "ies" })]
    InvalidEntries { path: PathBuf, count: usize },
    #[error("the kernel compiler command line is empty")]
    EmptyCompiler,
    #[error("GGML_HSA_JIT_COMPILER={0:?} is not valid UTF-8; pass --compiler")]
    CompilerNotUtf8(std::ffi::OsString),
    #[error(
        "kernel compiler environment missing: {reason}\n\
         Activate the IRON environment (e.g. `source env_setup.sh` in your mlir-aie/IRON checkout) \
         or set GGML_HSA_JIT_COMPILER (or pass --compiler) to a kernel compiler's command line."
    )]
    CompilerMissing { reason: String },
    #[error("cannot create {path}: {source}")]
    OutputDir {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One kernel to compile.
#[derive(Debug)]
struct Job {
    arch: Arch,
    desc: KernelDesc,
    /// The files' name: the entry's exported_name, else the canonical name.
    name: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ggml-hsa-gen-kernels: error: {e}");
            ExitCode::from(1)
        }
    }
}

/// Validates, compiles, reports. Returns the number of kernels that failed.
fn run(args: &Args) -> Result<usize, GenError> {
    let jobs = load_jobs(&args.config)?;
    if jobs.is_empty() {
        eprintln!("warning: {} lists no kernels", args.config.display());
        eprintln!("0 kernels: 0 compiled, 0 failed");
        return Ok(0);
    }

    let command_line = args
        .compiler
        .clone()
        .map(Ok)
        .or_else(|| match std::env::var("GGML_HSA_JIT_COMPILER") {
            Ok(v) => Some(Ok(v)),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(raw)) => Some(Err(GenError::CompilerNotUtf8(raw))),
        })
        .transpose()?
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_JIT_COMPILER.to_owned());
    let compiler = Compiler::new(&command_line)
        .ok_or(GenError::EmptyCompiler)?
        .with_timeout(ggml_hsa::config::get().jit_timeout);
    for arch in [Arch::Aie2, Arch::Aie2p] {
        if jobs.iter().any(|j| j.arch == arch) {
            let path = args.output_dir.join(arch.name());
            std::fs::create_dir_all(&path)
                .map_err(|source| GenError::OutputDir { path, source })?;
        }
    }
    // Asked once up front: without a working compiler every compile would fail the same way, and
    // one clear message beats N identical failures.
    let caps = compiler
        .capabilities(&args.output_dir)
        .map_err(|reason| GenError::CompilerMissing { reason })?;
    let workers = args
        .jobs
        .or_else(|| std::thread::available_parallelism().ok())
        .map_or(1, NonZeroUsize::get)
        .min(jobs.len());
    eprintln!(
        "compiling {} kernel{} with `{command_line}` ({}) into {}, {workers} at a time",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" },
        caps.compiler,
        args.output_dir.display()
    );

    let requests = RequestDir::create().map_err(|source| GenError::OutputDir {
        path: RequestDir::path(),
        source,
    })?;
    let results = compile_all(
        &compiler,
        &jobs,
        &args.output_dir,
        &requests.0,
        workers,
        args.verbose,
        args.format,
    );

    let failures: Vec<(&Job, &String)> = jobs
        .iter()
        .zip(&results)
        .filter_map(|(job, r)| r.as_ref().err().map(|e| (job, e)))
        .collect();
    eprintln!(
        "{} kernel{}: {} compiled, {} failed",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" },
        jobs.len() - failures.len(),
        failures.len()
    );
    if !failures.is_empty() {
        eprintln!("failed kernels:");
        for (job, message) in &failures {
            eprintln!(
                "  {} ({}): {}",
                job.name,
                job.arch,
                message.trim().replace('\n', "\n    ")
            );
        }
    }
    Ok(failures.len())
}

/// Reads and validates the config: every bad entry is reported (not only the first), and the
/// tool stops if there is any.
fn load_jobs(path: &Path) -> Result<Vec<Job>, GenError> {
    let text = std::fs::read_to_string(path).map_err(|source| GenError::ReadConfig {
        path: path.to_owned(),
        source,
    })?;
    let config = KernelConfig::parse(&text).map_err(|source| GenError::Config {
        path: path.to_owned(),
        source,
    })?;
    let mut jobs: Vec<Job> = Vec::new();
    let mut invalid = 0;
    for (i, entry) in config.kernels.iter().enumerate() {
        let what = format!("kernel {} ({})", i + 1, entry.kernel_name);
        let (arch, desc) = match entry.to_desc() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: {what}: {e}");
                invalid += 1;
                continue;
            }
        };
        let canonical = desc.canonical_name();
        let name = entry.file_name(&desc);
        if name != canonical {
            eprintln!(
                "warning: {what}: exported_name {name:?} is not the canonical name; the backend \
                 looks this kernel up as {canonical:?} and will not find it under {name:?}"
            );
        }
        // The same files twice: compiling both would only race on them. Two different kernels
        // exported under one name would silently overwrite each other, so that is an error.
        if let Some(first) = jobs.iter().position(|j| j.arch == arch && j.name == name) {
            if jobs[first].desc == desc {
                eprintln!("warning: {what}: {name} ({arch}) is listed twice; compiling it once");
            } else {
                eprintln!(
                    "error: {what}: exported_name {name:?} ({arch}) is already used by a \
                     different kernel"
                );
                invalid += 1;
            }
            continue;
        }
        jobs.push(Job { arch, desc, name });
    }
    if invalid > 0 {
        return Err(GenError::InvalidEntries {
            path: path.to_owned(),
            count: invalid,
        });
    }
    Ok(jobs)
}

/// A private directory for the compile requests, removed when the run ends.
#[derive(Debug)]
struct RequestDir(PathBuf);

impl RequestDir {
    fn path() -> PathBuf {
        std::env::temp_dir().join(format!("ggml-hsa-gen-kernels-{}", std::process::id()))
    }

    fn create() -> std::io::Result<RequestDir> {
        let path = RequestDir::path();
        // A leftover of an earlier process with the same pid holds nothing worth keeping.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(RequestDir(path))
    }
}

impl Drop for RequestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles every job on at most `workers` threads, printing a progress line as each finishes.
/// Returns one result per job, in job order.
fn compile_all(
    compiler: &Compiler,
    jobs: &[Job],
    out_dir: &Path,
    request_dir: &Path,
    workers: usize,
    verbose: bool,
    format: Format,
) -> Vec<Result<(), String>> {
    let next = AtomicUsize::new(0);
    // Held while printing, so that a progress line and its compiler output stay together.
    let finished = Mutex::new(0usize);
    let mut results: Vec<Option<Result<(), String>>> = jobs.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break };
                        let start = Instant::now();
                        let request = request_dir.join(format!("{i}.json"));
                        let (result, output) =
                            compile_one(compiler, job, &request, out_dir, format);
                        let elapsed = start.elapsed();
                        let mut n = finished.lock().unwrap_or_else(PoisonError::into_inner);
                        *n += 1;
                        let mut line = format!(
                            "[{}/{}] {} ({}) {} in {}",
                            *n,
                            jobs.len(),
                            job.name,
                            job.arch,
                            if result.is_ok() { "ok" } else { "FAILED" },
                            seconds(elapsed)
                        );
                        if verbose {
                            for l in output.lines() {
                                line.push_str("\n    ");
                                line.push_str(l);
                            }
                        }
                        eprintln!("{line}");
                        drop(n);
                        done.push((i, result));
                    }
                    done
                })
            })
            .collect();
        for handle in handles {
            // A worker only panics on a bug; re-raise it rather than report a partial run.
            let done = handle
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            for (i, result) in done {
                results[i] = Some(result);
            }
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every job was taken by a worker"))
        .collect()
}

/// Compiles one kernel. Returns the outcome and the compiler's output (for --verbose).
fn compile_one(
    compiler: &Compiler,
    job: &Job,
    request: &Path,
    out_dir: &Path,
    format: Format,
) -> (Result<(), String>, String) {
    let dir = out_dir.join(job.arch.name());
    if let Err(e) = std::fs::write(request, job.desc.request_json_named(job.arch, &job.name)) {
        let message = format!(
            "cannot write the compile request {}: {e}",
            request.display()
        );
        return (Err(message.clone()), message);
    }
    let result = compiler.compile(request, &dir);
    let _ = std::fs::remove_file(request);
    match result {
        Ok(output) => (
            check_files(&dir, &job.name)
                .and_then(|()| write_format(job, &dir, format))
                // Sizes and checksums in the directory's manifest: the backend checks the
                // files against them when it loads them (a truncated copy is declined).
                .map(|()| {
                    ggml_hsa::kernels::kernel_dir::seal_kernel_files(&dir, &job.name);
                    ggml_hsa::kernels::kernel_dir::record_written(&dir, &job.name)
                }),
            output,
        ),
        Err(e) => {
            let message = e.to_string();
            (Err(message.clone()), message)
        }
    }
}

/// A compiler that exits 0 without usable files must not count as a success: the backend would
/// skip those files at run time.
fn check_files(dir: &Path, name: &str) -> Result<(), String> {
    let size = |file: String| {
        let path = dir.join(file);
        std::fs::metadata(&path)
            .map(|m| (path.clone(), m.len()))
            .map_err(|e| {
                format!(
                    "the compiler reported success but {} is missing: {e}",
                    path.display()
                )
            })
    };
    let (pdi, pdi_len) = size(format!("{name}.pdi"))?;
    let (insts, insts_len) = size(format!("{name}_insts.bin"))?;
    if pdi_len == 0 {
        return Err(format!("{} is empty", pdi.display()));
    }
    if insts_len == 0 || !insts_len.is_multiple_of(4) {
        return Err(format!(
            "{} holds {insts_len} bytes, not a non-zero multiple of 4",
            insts.display()
        ));
    }
    Ok(())
}

/// Wraps the compiled pair into `<name>.hsaco` for `--format hsaco|both` (the pair is removed
/// for `hsaco`). Written atomically (a temporary file, then a rename).
fn write_format(job: &Job, dir: &Path, format: Format) -> Result<(), String> {
    if format == Format::Pdi {
        return Ok(());
    }
    let pdi_path = dir.join(format!("{}.pdi", job.name));
    let insts_path = dir.join(format!("{}_insts.bin", job.name));
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let n_args = job.desc.operand_count() as u32;
    let hsaco = job
        .arch
        .wrap_hsaco(&job.name, &read(&pdi_path)?, &read(&insts_path)?, n_args)
        .map_err(|e| format!("cannot write the hsaco: {e}"))?;
    let path = dir.join(format!("{}.hsaco", job.name));
    let tmp = dir.join(format!(".{}.hsaco.tmp", job.name));
    std::fs::write(&tmp, &hsaco)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if format == Format::Hsaco {
        let _ = std::fs::remove_file(&pdi_path);
        let _ = std::fs::remove_file(&insts_path);
    }
    Ok(())
}

/// `0.42s`, `12.3s`: short enough for a progress line.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.2}s")
    } else {
        format!("{s:.1}s")
    }
}
