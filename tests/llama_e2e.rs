//! llama.cpp end to end on `HSA0` (the plugin on the hsa-sim software NPU) against the same
//! llama.cpp on the CPU alone:
//! * the tiny llama (scripts/models.sh), greedy, through the DL plugin of the hook build
//!   (`scripts/llama-cpp.sh build-dl`) loaded with `GGML_BACKEND_PATH`: the same tokens, logits
//!   within NMSE 1e-4 per step, and the scheduler's placement (`GGML_SCHED_DEBUG=2`): at most one
//!   split per layer for a 32-token batch and for 1-token batches;
//! * the quantized variants, the in-tree static build (`build-static`), the CPU fallback option;
//! * all-MiniLM-L6-v2 embeddings: cosine ≥ 0.9999 with the CPU's, and the published sentence
//!   similarities;
//! * the f32 and quantized tiny llamas and MiniLM again under packet ABI c (AIE code objects),
//!   checked against the same CPU runs;
//! * no usable NPU (no runtime, a runtime that is not a library, an unsupported agent): llama.cpp
//!   runs on the CPU with one log line saying why;
//! * parallel sequences (`llama-parallel -np 4`, greedy): every sequence's text on HSA0 equals a
//!   serial (`-np 1`) HSA0 run's, and the CPU's except after a near-tie (printed);
//! * through the emulated designs, decode steps of several tokens: four sequences side by side
//!   and batches of three tokens of one sequence with the CPU's logits, `llama-parallel` and
//!   `llama-speculative` on HSA0.
//!
//! The builds and models are made by scripts/test.sh before `cargo test`. When one is missing the
//! test says so and passes, unless `GGML_HSA_REQUIRE_E2E=1` (set by CI), where it fails.

mod common;

use common::llama::*;
use std::path::Path;
use std::process::Command;

/// Decoder layers of the tiny llama (scripts/models/make_tiny_llama.py).
const TINY_LLAMA_LAYERS: usize = 4;

#[test]
fn tiny_llama_f32_on_hsa0_matches_cpu_with_one_split_per_layer_or_fewer() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let env = sim_env("f32");
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let npu = greedy(&bin, &model, LONG_PROMPT, Some(&env));
    assert!(
        npu.prompt_tokens >= 32,
        "prompt of {} tokens",
        npu.prompt_tokens
    );
    compare("tiny-llama-f32", &npu, &cpu, MAX_LOGITS_NMSE);

    let graphs = graphs(&npu.log);
    report_placement("tiny-llama-f32", &graphs);
    assert!(graphs.len() >= 3, "too few graphs:\n{}", tail(&npu.log));
    for (i, g) in graphs.iter().enumerate() {
        assert!(
            g.splits.len() <= TINY_LLAMA_LAYERS,
            "graph {i}: {} splits {:?} for {TINY_LLAMA_LAYERS} layers; off HSA0: {:?}",
            g.splits.len(),
            g.splits,
            g.off_device
        );
        let on_npu = g.nodes.get("HSA0").copied().unwrap_or(0);
        assert!(
            on_npu >= 80,
            "graph {i}: only {on_npu} nodes on HSA0: {:?}",
            g.nodes
        );
        // Only the token embedding lookup (the input layer, which llama.cpp keeps on the CPU).
        let off: usize = g.off_device.values().sum();
        assert!(off <= 1, "graph {i}: nodes off HSA0: {:?}", g.off_device);
    }
    // The same run decoding one token per batch from the start (decode-sized graphs only).
    let short = greedy(&bin, &model, "Hello", Some(&env));
    let short_cpu = greedy(&bin, &model, "Hello", None);
    compare(
        "tiny-llama-f32 (batch 1)",
        &short,
        &short_cpu,
        MAX_LOGITS_NMSE,
    );
    for g in common::llama::graphs(&short.log) {
        assert!(g.splits.len() <= TINY_LLAMA_LAYERS, "{:?}", g.splits);
    }
    // A decode layer ran as one kernel (its Q/K/V, attention, output projection and
    // feed-forward block: DECODE_LAYER_SWIGLU), its parts built for the prompt's graphs.
    common::assert_kernels_built(
        &common::scratch_path("e2e-f32").join("aie2p"),
        &[
            "decode_layer_swiglu-",
            "rms_norm_qkv_rope-",
            "flash_attn_ext_mask-",
        ],
    );
}

/// A run on hsa-sim under packet ABI c (found by `auto`): every kernel is loaded as an AIE code
/// object and dispatched by its kernel object. The returned check reads hsa-sim's counters and
/// fails unless the run really was a generation-c one that dispatched kernels.
fn abi_c_env(tag: &str) -> (Vec<(String, String)>, impl Fn()) {
    let mut env = sim_env(&format!("{tag}-abi-c"));
    let counters = common::scratch_dir(&format!("e2e-{tag}-abi-c-counters")).join("counters.json");
    env.extend([
        ("HSA_SIM_PACKET_ABI".to_owned(), "c".to_owned()),
        // This crate's plugin as cargo built it (the hook build's copy may predate ABI c).
        (
            "GGML_BACKEND_PATH".to_owned(),
            common::plugin_path().display().to_string(),
        ),
        (
            "HSA_SIM_COUNTERS".to_owned(),
            counters.display().to_string(),
        ),
    ]);
    let tag = tag.to_owned();
    let check = move || {
        let c = read_json(&counters);
        assert_eq!(c["packet_abi"], "c", "{tag}: {c}");
        assert!(
            c["dispatches"].as_u64().unwrap_or(0) > 0 && c["dispatch_errors"] == 0,
            "{tag}: {c}"
        );
        assert!(
            c["executables_created"].as_u64().unwrap_or(0) > 1,
            "{tag}: {c}"
        );
        println!(
            "{tag} (ABI c): {} dispatches, {} executables loaded",
            c["dispatches"], c["executables_created"]
        );
    };
    (env, check)
}

/// The tiny llama under packet ABI c: the logits still match the CPU's.
#[test]
fn tiny_llama_f32_under_packet_abi_c_matches_cpu() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let (env, check_abi_c) = abi_c_env("f32");
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let npu = greedy(&bin, &model, LONG_PROMPT, Some(&env));
    check_abi_c();
    compare("tiny-llama-f32 (ABI c)", &npu, &cpu, MAX_LOGITS_NMSE);
    let graphs = graphs(&npu.log);
    assert!(graphs.len() >= 3, "too few graphs:\n{}", tail(&npu.log));
    for (i, g) in graphs.iter().enumerate() {
        let on_npu = g.nodes.get("HSA0").copied().unwrap_or(0);
        assert!(on_npu >= 80, "graph {i}: only {on_npu} nodes on HSA0");
    }
}

/// Quantized weights: ggml quantizes the activations too (to Q8_0/Q8_K) before the dot products,
/// so the small differences of the NPU's f32 activations grow to NMSE ~1e-3, enough to flip a
/// near-tie of the random model. The NPU run is therefore teacher-forced with the CPU's tokens:
/// the same sequence, logits within NMSE 5e-3 at every step, and the same argmax wherever the
/// CPU's top two logits are at least 0.5 apart.
const MAX_QUANTIZED_LOGITS_NMSE: f64 = 5e-3;

/// The f16 and quantized tiny llamas under the default packet ABI and under ABI c (the CPU's
/// run is shared), all held to the quantized models' bound.
#[test]
fn tiny_llama_quantized_on_hsa0_matches_cpu() {
    let Some(bin) = dl_bin() else { return };
    for name in [
        "tiny-llama-f16",
        "tiny-llama-q8_0",
        "tiny-llama-q4_0",
        "tiny-llama-q4_k_m",
    ] {
        let Some(model) = model(name) else { return };
        let cpu = greedy(&bin, &model, LONG_PROMPT, None);
        let npu = greedy_args(
            &bin,
            &model,
            LONG_PROMPT,
            Some(&sim_env(name)),
            &cpu.tokens,
            &[],
        );
        check_quantized(name, &npu, &cpu);
        let (env, check_abi_c) = abi_c_env(name);
        let npu = greedy_args(&bin, &model, LONG_PROMPT, Some(&env), &cpu.tokens, &[]);
        check_abi_c();
        check_quantized(&format!("{name} (ABI c)"), &npu, &cpu);
    }
}

/// A teacher-forced quantized run against the CPU's (see [`MAX_QUANTIZED_LOGITS_NMSE`]).
fn check_quantized(name: &str, npu: &Greedy, cpu: &Greedy) {
    let n_vocab = cpu.logits.len() / cpu.tokens.len();
    let mut worst = 0.0f64;
    let mut checked = 0;
    for step in 0..cpu.tokens.len() {
        let r = step * n_vocab..(step + 1) * n_vocab;
        worst = worst.max(nmse(&npu.logits[r.clone()], &cpu.logits[r.clone()]));
        let mut top: Vec<f32> = cpu.logits[r].to_vec();
        top.sort_by(|a, b| b.total_cmp(a));
        if top[0] - top[1] >= 0.5 {
            checked += 1;
            assert_eq!(
                npu.tokens[step], cpu.tokens[step],
                "{name}: argmax differs at step {step}"
            );
        }
    }
    println!(
        "{name}: teacher-forced {} steps, argmax equal at the {checked} with a clear winner, \
         worst logits NMSE {worst:.2e} (limit {MAX_QUANTIZED_LOGITS_NMSE:.0e})",
        cpu.tokens.len()
    );
    assert!(
        worst <= MAX_QUANTIZED_LOGITS_NMSE,
        "{name}: NMSE {worst:.3e}"
    );
    let graphs = graphs(&npu.log);
    report_placement(name, &graphs);
    let on_npu = graphs.last().and_then(|g| g.nodes.get("HSA0").copied());
    assert!(
        on_npu.unwrap_or(0) >= 50,
        "{name}: {on_npu:?} nodes on HSA0"
    );
}

/// `-ngl` and `-nkvo` place layers and the KV cache as llama.cpp users expect; the text is the
/// CPU's in every case.
#[test]
fn ngl_and_nkvo_place_layers_and_kv_cache() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let env = sim_env("ngl");
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let nodes = |run: &Greedy, backend: &str| {
        graphs(&run.log)
            .last()
            .and_then(|g| g.nodes.get(backend).copied())
            .unwrap_or(0)
    };
    // -ngl 0: every layer on the CPU; HSA0 computes nothing.
    let none = greedy_args(&bin, &model, LONG_PROMPT, Some(&env), &[], &["-ngl", "0"]);
    compare("-ngl 0", &none, &cpu, MAX_LOGITS_NMSE);
    assert_eq!(nodes(&none, "HSA0"), 0, "-ngl 0 ran nodes on HSA0");
    assert!(
        none.log.contains("CPU KV buffer size"),
        "-ngl 0: KV cache not on the CPU"
    );
    // -ngl 2: the last layer and the output layer on HSA0, the rest on the CPU.
    let some = greedy_args(&bin, &model, LONG_PROMPT, Some(&env), &[], &["-ngl", "2"]);
    compare("-ngl 2", &some, &cpu, MAX_LOGITS_NMSE);
    let (on_npu, on_cpu) = (nodes(&some, "HSA0"), nodes(&some, "CPU"));
    println!("-ngl 2: {on_npu} nodes on HSA0, {on_cpu} on the CPU");
    assert!(
        on_npu > 10 && on_cpu > 10,
        "-ngl 2: {on_npu} on HSA0, {on_cpu} on CPU"
    );
    // -nkvo: the KV cache (and attention over it) stays on the CPU; the rest on HSA0.
    let nkvo = greedy_args(&bin, &model, LONG_PROMPT, Some(&env), &[], &["-nkvo"]);
    compare("-nkvo", &nkvo, &cpu, MAX_LOGITS_NMSE);
    assert!(
        nkvo.log.contains("CPU KV buffer size"),
        "-nkvo: KV cache not on the CPU"
    );
    assert!(
        !nkvo.log.contains("HSA0 KV buffer size"),
        "-nkvo: KV cache on HSA0"
    );
    let (on_npu, on_cpu) = (nodes(&nkvo, "HSA0"), nodes(&nkvo, "CPU"));
    println!("-nkvo: {on_npu} nodes on HSA0, {on_cpu} on the CPU");
    assert!(on_npu > 10, "-nkvo: {on_npu} on HSA0");
}

#[test]
fn cpu_fallback_option_claims_every_node() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let mut env = sim_env("fallback");
    env.push(("GGML_HSA_CPU_FALLBACK".into(), "1".into()));
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let npu = greedy(&bin, &model, LONG_PROMPT, Some(&env));
    compare(
        "tiny-llama-f32 (GGML_HSA_CPU_FALLBACK=1)",
        &npu,
        &cpu,
        MAX_LOGITS_NMSE,
    );
    let graphs = graphs(&npu.log);
    report_placement("GGML_HSA_CPU_FALLBACK=1", &graphs);
    // Everything but the input layer's embedding lookup, whose weight llama.cpp keeps in host
    // memory for the CPU. Flash attention runs on HSA0 too (hsa-sim's compiler takes
    // FLASH_ATTN_EXT).
    assert!(!graphs.is_empty());
    for g in &graphs {
        assert!(
            g.splits.len() <= 2,
            "{:?}; off HSA0: {:?}",
            g.splits,
            g.off_device
        );
        let off: usize = g.off_device.values().sum();
        assert!(off <= 1, "off HSA0: {:?}", g.off_device);
    }
}

/// llama-simple's generated text (it prints the prompt, then the tokens, with printf).
fn simple_text(
    program: &Path,
    model: &Path,
    env: &[(String, String)],
    plugin: Option<&Path>,
) -> (String, String) {
    let mut cmd = Command::new(program);
    cmd.arg("-m")
        .arg(model)
        .args(["-n", "12", "Hello world"])
        .env_remove("GGML_BACKEND_PATH")
        .env("GGML_SCHED_DEBUG", "2")
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(p) = plugin {
        cmd.env("GGML_BACKEND_PATH", p);
    }
    let out = cmd.output().expect("llama-simple runs");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "llama-simple failed:\n{}", tail(&log));
    (String::from_utf8_lossy(&out.stdout).trim().to_owned(), log)
}

/// Lines the backend logged (its prefix is the registry name).
fn backend_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.starts_with("HSA:")).collect()
}

#[test]
fn static_in_tree_build_runs_the_tiny_llama_on_hsa0() {
    let bin = script_output("llama-cpp.sh", &["path", "bin-static"]);
    let (Some(simple), Some(model)) = (
        require(
            bin.join("llama-simple"),
            "scripts/llama-cpp.sh build-static",
        ),
        model("tiny-llama-f32"),
    ) else {
        return;
    };
    // The backend is linked in: without a runtime it has no device and llama.cpp uses the CPU.
    let no_runtime = [(
        "GGML_HSA_LIBHSA_PATH".to_owned(),
        "/nonexistent/libhsa-runtime64.so".to_owned(),
    )];
    let (cpu_text, cpu_log) = simple_text(&simple, &model, &no_runtime, None);
    assert_eq!(
        backend_lines(&cpu_log).len(),
        1,
        "{:?}",
        backend_lines(&cpu_log)
    );
    let (npu_text, npu_log) = simple_text(&simple, &model, &sim_env("static"), None);
    assert_eq!(npu_text, cpu_text, "static build: NPU and CPU texts differ");
    let graphs = graphs(&npu_log);
    report_placement("static build", &graphs);
    let on_npu = graphs.last().and_then(|g| g.nodes.get("HSA0").copied());
    assert!(
        on_npu.unwrap_or(0) >= 80,
        "static build: {on_npu:?} nodes on HSA0"
    );
    println!("static build: same text on HSA0 and CPU: {npu_text}");
}

#[test]
fn no_usable_npu_leaves_llama_on_the_cpu_with_one_log_line() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let simple = bin.join("llama-simple");
    let (cpu_text, _) = simple_text(&simple, &model, &[], None);
    let garbage = common::scratch_dir("e2e-garbage").join("libhsa-runtime64.so");
    std::fs::write(&garbage, b"\x7fELF but not really a library").unwrap();
    let sim = common::sim_artifact("libhsa_runtime64.so");
    let cases: [(&str, Vec<(String, String)>); 3] = [
        (
            "missing libhsa-runtime64",
            vec![(
                "GGML_HSA_LIBHSA_PATH".into(),
                "/nonexistent/libhsa-runtime64.so".into(),
            )],
        ),
        (
            "GGML_HSA_LIBHSA_PATH pointing at garbage",
            vec![("GGML_HSA_LIBHSA_PATH".into(), garbage.display().to_string())],
        ),
        (
            "an unsupported agent",
            vec![
                ("GGML_HSA_LIBHSA_PATH".into(), sim.display().to_string()),
                ("HSA_SIM_AGENTS".into(), "aie4".into()),
            ],
        ),
    ];
    for (what, env) in cases {
        let (text, log) = simple_text(&simple, &model, &env, Some(&bin.join("libggml-hsa.so")));
        assert_eq!(text, cpu_text, "{what}: output differs from the CPU run");
        let lines = backend_lines(&log);
        assert_eq!(
            lines.len(),
            1,
            "{what}: expected one line from the backend: {lines:?}"
        );
        println!(
            "{what}: CPU output unchanged; the backend said: {}",
            lines[0]
        );
    }
}

/// Embeddings from llama-embedding's JSON output. The pinned llama-embedding does not always
/// flush its stdout at exit, so a cut-off document is retried.
fn embeddings(
    bin: &Path,
    model: &Path,
    sentences: &[&str],
    env: Option<&[(String, String)]>,
) -> (Vec<Vec<f64>>, String) {
    for _attempt in 0..8 {
        let mut cmd = Command::new(bin.join("llama-embedding"));
        cmd.arg("-m")
            .arg(model)
            .args([
                "--pooling",
                "mean",
                "--embd-normalize",
                "2",
                "--embd-output-format",
                "json",
            ])
            .arg("-p")
            .arg(sentences.join("\n"))
            // -v: the debug lines, where GGML_SCHED_DEBUG prints the placement.
            .args(["-v"])
            .env("GGML_SCHED_DEBUG", "2")
            .env_remove("GGML_BACKEND_PATH");
        if let Some(env) = env {
            cmd.env("GGML_BACKEND_PATH", bin.join("libggml-hsa.so"));
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
        }
        let out = cmd.output().expect("llama-embedding runs");
        assert!(
            out.status.success(),
            "llama-embedding failed:\n{}",
            tail(&String::from_utf8_lossy(&out.stderr))
        );
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            continue;
        };
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let vectors = doc["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|d| {
                d["embedding"]
                    .as_array()
                    .expect("embedding")
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect()
            })
            .collect();
        return (vectors, log);
    }
    panic!("llama-embedding never printed a complete JSON document");
}

/// The sentence-transformers example for all-MiniLM-L6-v2.
const MINILM_SENTENCES: [&str; 3] = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
];

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn minilm_embeddings_on_hsa0_match_cpu_and_the_published_similarities() {
    let (Some(bin), Some(model)) = (dl_bin(), model("minilm")) else {
        return;
    };
    // The sentence-transformers example for all-MiniLM-L6-v2 and its published similarities.
    let sentences = MINILM_SENTENCES;
    let published = [((0, 1), 0.6660), ((0, 2), 0.1046), ((1, 2), 0.1411)];
    let (cpu, _) = embeddings(&bin, &model, &sentences, None);
    // The default packet ABI, then ABI c.
    let (abi_c, check_abi_c) = abi_c_env("minilm");
    for (tag, env) in [("minilm", sim_env("minilm")), ("minilm (ABI c)", abi_c)] {
        let (npu, log) = embeddings(&bin, &model, &sentences, Some(&env));
        if tag.contains("ABI c") {
            check_abi_c();
        }
        let graphs = graphs(&log);
        report_placement(tag, &graphs);
        let on_npu = graphs.last().and_then(|g| g.nodes.get("HSA0").copied());
        assert!(on_npu.unwrap_or(0) >= 80, "{tag}: {on_npu:?} nodes on HSA0");
        assert_eq!(npu.len(), sentences.len());
        for (i, s) in sentences.iter().enumerate() {
            let c = cosine(&npu[i], &cpu[i]);
            println!("{tag}: cos(HSA0, CPU) = {c:.7} for {s:?}");
            assert!(c >= 0.9999, "{tag}: {s:?}: cosine {c} < 0.9999");
        }
        for ((a, b), want) in published {
            let got = cosine(&npu[a], &npu[b]);
            println!(
                "{tag}: similarity {}-{} on HSA0 {got:.4}, published {want:.4}",
                a + 1,
                b + 1
            );
            assert!(
                (got - want).abs() <= 0.002,
                "{tag}: pair {a}-{b}: {got} vs {want}"
            );
        }
    }
}

/// The environment of a run with the IRON designs emulated: the JIT compiler is `python3 -m
/// ggml_hsa_iron --target emu` (every HSA0 kernel an IRON design run by hsa-sim's dataflow
/// emulator, the AIE core kernels built for the host), HSA0 takes what the IRON package declares;
/// hsa-sim's counters and the backend's statistics are written to the returned files.
fn emu_env(
    tag: &str,
) -> (
    Vec<(String, String)>,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let mut env = sim_env(&format!("{tag}-emu"));
    let dir = common::scratch_dir(&format!("e2e-emu-{tag}"));
    let (counters, stats) = (dir.join("counters.json"), dir.join("stats.json"));
    env.retain(|(k, _)| k != "GGML_HSA_JIT_COMPILER");
    env.extend(common::emu_compiler_env());
    for (k, v) in [
        ("HSA_SIM_COUNTERS", counters.display().to_string()),
        ("GGML_HSA_STATS", stats.display().to_string()),
    ] {
        env.push((k.to_owned(), v));
    }
    (env, counters, stats)
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{} was not written: {e}", path.display()));
    serde_json::from_str(&text).expect("JSON")
}

/// The gate for one run: every layer op ran as an emulated IRON kernel on HSA0. Only
/// GET_ROWS (the token embedding lookup, which llama.cpp keeps on the CPU, and row gathers) may
/// run elsewhere: off HSA0 in the scheduler's placement, or on the host inside the backend. No
/// node ran on the CPU behind HSA0's back (a kernel the IRON package refused to build).
fn assert_all_layer_ops_emulated(tag: &str, log: &str, counters: &Path, stats: &Path) {
    let graphs = graphs(log);
    report_placement(tag, &graphs);
    let c = read_json(counters);
    let s = read_json(stats);
    println!(
        "{tag}: emulated ops {}; backend: kernels {}, host {}, CPU {}; {} dispatches, {} doorbells",
        c["emulated_ops"],
        s["kernel_nodes"],
        s["host_nodes"],
        s["cpu_nodes"],
        c["dispatches"],
        c["doorbells"]
    );
    assert!(!graphs.is_empty(), "{tag}: no graph scheduled");
    for (i, g) in graphs.iter().enumerate() {
        let off: Vec<_> = g.off_device.keys().filter(|op| *op != "GET_ROWS").collect();
        assert!(
            off.is_empty(),
            "{tag}: graph {i}: ops off HSA0: {:?}",
            g.off_device
        );
    }
    let not_kernels = |field: &str| -> Vec<String> {
        s[field]
            .as_object()
            .map(|m| m.keys().filter(|op| *op != "GET_ROWS").cloned().collect())
            .unwrap_or_default()
    };
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot build this kernel"))
        .collect();
    assert!(
        not_kernels("cpu_nodes").is_empty(),
        "{tag}: nodes on the CPU: {}; refusals: {refusals:#?}",
        s["cpu_nodes"]
    );
    assert!(
        not_kernels("host_nodes").is_empty(),
        "{tag}: host nodes: {}",
        s["host_nodes"]
    );
    let emulated: u64 = c["emulated_ops"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0);
    assert!(emulated > 0, "{tag}: no emulated IRON kernel ran");
    assert_eq!(
        emulated,
        c["dispatches"].as_u64().unwrap_or(0),
        "{tag}: every dispatch is an emulated IRON kernel"
    );
    assert!(
        !log.contains("compile failed"),
        "{tag}: a kernel failed to compile:\n{}",
        tail(log)
    );
}

/// One tiny llama with the IRON designs emulated: teacher-forced with the CPU's tokens (the NPU's
/// GEMMs multiply in bf16 and dequantize on the cores), logits close to the CPU's; returns the
/// run's log and where its counters and statistics went.
/// The emulated run of `name` (the tiny llama's greedy run through the IRON designs) checked
/// against the CPU's logits: its log, counters and stats files, and how many tokens it
/// generated.
fn tiny_llama_emulated(
    name: &str,
) -> Option<(String, std::path::PathBuf, std::path::PathBuf, usize)> {
    let bin = dl_bin()?;
    let model = model(name)?;
    let (env, counters, stats) = emu_env(name);
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let t = std::time::Instant::now();
    let npu = greedy_args(&bin, &model, LONG_PROMPT, Some(&env), &cpu.tokens, &[]);
    let secs = t.elapsed().as_secs_f64();
    let worst = worst_step_nmse(&npu, &cpu);
    println!(
        "{name}, IRON emulated: worst logits NMSE {worst:.2e} (limit \
         {MAX_QUANTIZED_LOGITS_NMSE:.0e}), {secs:.1} s"
    );
    assert!(
        worst <= MAX_QUANTIZED_LOGITS_NMSE,
        "{name}: NMSE {worst:.3e}"
    );
    Some((npu.log, counters, stats, npu.tokens.len()))
}

/// The gate of the NPU path: the tiny llama in every type the project ships (f32, f16, Q8_0, Q4_0, and
/// Q4_K_M: Q4_K with Q6_K weights) through the emulated IRON designs: the output matches the
/// CPU's, every layer op ran on HSA0 as an emulated IRON kernel (GET_ROWS on the host), every
/// NPU dispatch is one, nothing failed to compile, and the ops of a llama layer all ran as such.
/// llama.cpp's automatic flash attention is on: the IRON package declares FLASH_ATTN_EXT.
#[test]
fn tiny_llamas_run_every_layer_op_through_the_emulated_iron_designs() {
    let mut qkv_per_model = Vec::new();
    for name in [
        "tiny-llama-f32",
        "tiny-llama-f16",
        "tiny-llama-q8_0",
        "tiny-llama-q4_0",
        "tiny-llama-q4_k_m",
    ] {
        let Some((log, counters, stats, _)) = tiny_llama_emulated(name) else {
            return;
        };
        report_placement(name, &graphs(&log));
        assert_all_layer_ops_emulated(name, &log, &counters, &stats);
        let c = read_json(&counters);
        // The prompt's gate and up products: over float weights fused with their GLU; over
        // block-quantized ones GEMMs of the norm's bf16 output, the GLU alone writing bf16 for
        // ffn_down (ops::bf16_activations).
        let float = name.ends_with("f32") || name.ends_with("f16");
        let glu = if float { "MUL_MAT_SWIGLU" } else { "SWIGLU" };
        for op in [
            "MUL_MAT",
            glu,
            "RMS_NORM_MUL",
            "ROPE",
            "FLASH_ATTN_EXT_MASK",
            "ADD",
        ] {
            assert!(
                c["emulated_ops"][op].as_u64().unwrap_or(0) > 0,
                "{name}: {op} did not run as an emulated IRON kernel: {}",
                c["emulated_ops"]
            );
        }
        // Decode: a layer as one kernel (Q, K and V with their norm, rotation and cache writes,
        // the attention, its output projection with the residual, the normed feed-forward
        // block). Q4_K_M's layers with q6_K weights (V, ffn_down) beside q4_K ones are refused
        // by the design (one weight type) and run in three: Q, K and V; the attention through
        // the gate and up products; ffn_down with its residual.
        let ran = |op: &str| c["emulated_ops"][op].as_u64().unwrap_or(0);
        let layers = ran("DECODE_LAYER_SWIGLU");
        assert!(
            layers > 0,
            "{name}: no DECODE_LAYER_SWIGLU ran as an emulated IRON kernel: {}",
            c["emulated_ops"]
        );
        let split = ran("FLASH_ATTN_GLU_SWIGLU");
        assert_eq!(
            split > 0,
            name.ends_with("q4_k_m"),
            "{name}: FLASH_ATTN_GLU_SWIGLU ran {split} times: {}",
            c["emulated_ops"]
        );
        // Q, K and V of one norm with their rotation and cache writes as one kernel, alone or
        // inside the layer's.
        let qkv = ran("RMS_NORM_QKV_ROPE") + ran("RMS_NORM_QKV_ROPE_FF") + layers;

        qkv_per_model.push((name, qkv));
        // The KV-cache writes (SET_ROWS into the consecutive slots of a cache filled in order,
        // ops::scatter) dispatch nothing of their own: K's rows are written by its ROPE (in
        // decode by the Q/K/V kernel) and V's by its projection, in f16 (the IRON ROPE's and GEMV's f16 outputs). Only the prompt's
        // V, a product the IRON GEMM computes (it writes f32 only), is copied: at most one
        // graph's V writes.
        let s = read_json(&stats);
        let (set_rows, graphs) = (
            s["kernel_nodes"]["SET_ROWS"].as_u64().unwrap_or(0),
            s["graphs"].as_u64().unwrap_or(0),
        );
        assert!(set_rows > 0 && graphs > 1, "{name}: {s}");
        // A copy of the prompt's rows may run as two kernels over power-of-two counts of its
        // elements (`ops::pieces`).
        let copies = c["emulated_ops"]["CPY"].as_u64().unwrap_or(0);
        assert!(
            copies <= 2 * (set_rows / graphs / 2),
            "{name}: {copies} KV-cache rows copied of {set_rows} SET_ROWS in {graphs} graphs: \
             K's and V's producers did not write them: {}",
            c["emulated_ops"]
        );
    }
    // Every type merges Q, K and V in as many decode layers as f32 does: Q4_K_M's layers with
    // q6_K V weights and q4_K Q/K weights too.
    let (first, want) = qkv_per_model[0];
    for &(name, qkv) in &qkv_per_model {
        assert_eq!(
            qkv, want,
            "{name}: RMS_NORM_QKV_ROPE ran {qkv} times, {first} {want}"
        );
    }
}

/// The aie2p directory of the kernel cache of a run with `env`.
fn aie2p_kernels(env: &[(String, String)]) -> std::path::PathBuf {
    env.iter()
        .find(|(k, _)| k == "GGML_HSA_KERNEL_CACHE_DIR")
        .map(|(_, v)| Path::new(v).join("aie2p"))
        .expect("a kernel cache")
}

/// `prompt` and `steps` generated tokens on the CPU, then on HSA0 with `env` fed the CPU's
/// tokens (teacher forcing): the two runs.
fn teacher_forced(
    bin: &Path,
    model: &Path,
    prompt: &str,
    env: &[(String, String)],
    steps: usize,
) -> (Greedy, Greedy) {
    let args = |env, forced| GreedyArgs {
        plugin_env: env,
        forced,
        extra: &[],
        n_predict: Some(steps),
    };
    let (run, logits) = greedy_run(bin, model, prompt, &args(None, &[]), RUN_TIMEOUT);
    let cpu = parse_greedy(&run, &logits);
    let (run, logits) = greedy_run(
        bin,
        model,
        prompt,
        &args(Some(env), &cpu.tokens),
        RUN_TIMEOUT,
    );
    (cpu, parse_greedy(&run, &logits))
}

/// A conversation growing past 256 tokens of context: llama.cpp grows the attention's KV
/// length by 256 (n_kv 256, then 512), and the decode's attention kernels (the layer kernel, the
/// attention-and-block kernel it falls back to, and in Q4_K_M's layers with q6_K weights the
/// attention through the gate and up products) are still the ones compiled at the first token,
/// told n_kv at each dispatch
/// (`ops::rewrite::kv_length`): their instruction streams carry the length's word, the logits
/// stay the CPU's at every length. The prompt (one batch) takes the context near 256 tokens, so
/// that a few dozen decode steps, each a run of every layer through the emulation, cross it.
#[test]
fn a_growing_context_runs_the_attention_kernels_compiled_at_its_first_token() {
    const STEPS: usize = 48;
    let Some(bin) = dl_bin() else {
        return;
    };
    let prompt = [LONG_PROMPT; 7].join(", ");
    for name in ["tiny-llama-q4_0", "tiny-llama-q4_k_m"] {
        let Some(model) = model(name) else {
            return;
        };
        let (env, counters, _) = emu_env(&format!("growing-{name}"));
        let (cpu, npu) = teacher_forced(&bin, &model, &prompt, &env, STEPS);
        assert!(
            cpu.prompt_tokens < 256 && cpu.prompt_tokens + STEPS > 256 + 8,
            "the decode steps must start below 256 tokens of context and pass it: {} prompt tokens",
            cpu.prompt_tokens
        );
        let worst = worst_step_nmse(&npu, &cpu);
        assert!(
            worst <= MAX_QUANTIZED_LOGITS_NMSE,
            "{name}: NMSE {worst:.3e}"
        );
        let c = read_json(&counters);
        let layers = c["emulated_ops"]["DECODE_LAYER_SWIGLU"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            layers > 0,
            "{name}: no layer kernel ran: {}",
            c["emulated_ops"]
        );
        // Each decode attention kernel once in the kernel cache, with the length's word after
        // the stream's eight (9 words). Where q6_K weights keep ffn_down apart (Q4_K_M) the
        // decode's attention runs through the gate and up products. The attention of one query
        // row alone is, in either model, the prompt's last row's: its attention writes over q,
        // so its rows run as disjoint pieces (`ops::pieces`), 32 and 1, told n_kv as well.
        let cache = aie2p_kernels(&env);
        for (stem, required) in [
            ("decode_layer_swiglu-", true),
            ("flash_attn_ffn_swiglu-", true),
            ("flash_attn_glu_swiglu-", name.ends_with("q4_k_m")),
            ("flash_attn_ext_mask-f32_64x1x", false),
        ] {
            let streams: Vec<u64> = std::fs::read_dir(&cache)
                .expect("the kernel cache")
                .filter_map(|e| {
                    let e = e.ok()?;
                    let n = e.file_name().to_string_lossy().into_owned();
                    (n.starts_with(stem) && n.ends_with("_insts.bin")).then(|| e.metadata().ok())?
                })
                .map(|m| m.len())
                .collect();
            let runtime = streams.iter().filter(|&&b| b == 9 * 4).count();
            assert!(
                runtime <= 1 && streams.len() - runtime <= 1 && (runtime == 1 || !required),
                "{name}: {stem}* streams of {streams:?} bytes in {}",
                cache.display()
            );
        }
    }
}

/// Prompts of lengths that are not powers of two run, through the emulated IRON designs, as
/// the kernels of power-of-two row counts (`ops::pieces`): no kernel in the cache is named by
/// a prompt's token count, so a new prompt length compiles only the counts it adds; the logits
/// are the CPU's. A kernel's second piece ends at the last row, computing some of the first's
/// rows again; an in-place kernel's pieces (the residuals, an attention over its q) are
/// disjoint. The prompts' attention is told its KV length at dispatch
/// (`ops::rewrite::kv_length`): the longest prompt's n_kv is 512, the others' 256, and every
/// attention kernel is one for every length.
#[test]
fn prompts_run_as_kernels_of_power_of_two_rows_with_the_cpu_s_logits() {
    let Some(bin) = dl_bin() else {
        return;
    };
    let Some(model) = model("tiny-llama-q4_0") else {
        return;
    };
    let (env, counters, _) = emu_env("row-pieces");
    let longer = format!(
        "{LONG_PROMPT}, then the farmer counts his sheep in the green valley below the old hill"
    );
    let mut lengths = Vec::new();
    let longest = [LONG_PROMPT; 9].join(" ");
    for prompt in [LONG_PROMPT, longer.as_str(), longest.as_str()] {
        let (cpu, npu) = teacher_forced(&bin, &model, prompt, &env, 2);
        let n = cpu.prompt_tokens;
        assert!(
            n > 16 && !n.is_power_of_two(),
            "a prompt of {n} tokens: not a power of two"
        );
        let worst = worst_step_nmse(&npu, &cpu);
        println!("a prompt of {n} tokens: worst logits NMSE {worst:.2e}");
        assert!(
            worst <= MAX_QUANTIZED_LOGITS_NMSE,
            "{n} tokens: NMSE {worst:.3e}"
        );
        lengths.push(n);
    }
    let c = read_json(&counters);
    assert!(
        c["emulated_ops"]["MUL_MAT"].as_u64().unwrap_or(0) > 0,
        "no emulated product ran: {}",
        c["emulated_ops"]
    );
    let cache = aie2p_kernels(&env);
    let names: Vec<String> = std::fs::read_dir(&cache)
        .expect("the kernel cache")
        .filter_map(|e| {
            let n = e.ok()?.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".pdi").map(str::to_owned)
        })
        .collect();
    assert!(!names.is_empty(), "no kernel in {}", cache.display());
    assert!(
        lengths[2] > 256,
        "the longest prompt must reach n_kv 512: {lengths:?}"
    );
    // The down projections read the GLU's output as it wrote it for them, in bf16.
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("mul_mat-") && n.contains("-bf16_")),
        "no product of bf16 activations: {names:#?}"
    );
    let attention: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("flash_attn_ext_mask-"))
        .collect();
    assert!(
        !attention.is_empty() && attention.iter().all(|n| n.ends_with("-kv256")),
        "attention kernels not told n_kv: {attention:#?}"
    );
    for n in &lengths {
        // A dimension of n rows: `x<n>` followed by another dimension, a stride list or the
        // next operand.
        let named: Vec<&String> = names
            .iter()
            .filter(|name| {
                name.match_indices(&format!("x{n}")).any(|(at, m)| {
                    matches!(
                        name[at + m.len()..].chars().next(),
                        Some('x' | '_' | '-') | None
                    )
                })
            })
            .collect();
        assert!(
            named.is_empty(),
            "kernels named by the prompt's {n} tokens: {named:#?}"
        );
    }
}

/// A compiler that refuses every kernel told its KV length at dispatch (as one that cannot build
/// the design for a cache that long would): each such kernel is asked for again named by the
/// graph's length, so the decode layer is still one kernel, and the text is the CPU's.
#[test]
fn kernels_refused_for_every_kv_length_are_asked_for_by_the_graph_s_length() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let script = common::compiler_declining(
        "refusing-n-kv-compiler",
        "\"n_kv_step\"",
        "not for every n_kv",
        2,
    );
    let mut env = sim_env("refusing-n-kv");
    for (k, v) in &mut env {
        if k == "GGML_HSA_JIT_COMPILER" {
            v.clone_from(&script);
        }
    }
    let cpu = greedy(&bin, &model, LONG_PROMPT, None);
    let npu = greedy(&bin, &model, LONG_PROMPT, Some(&env));
    compare("tiny-llama-f32, n_kv refused", &npu, &cpu, MAX_LOGITS_NMSE);
    let cache = aie2p_kernels(&env);
    let layers: Vec<u64> = std::fs::read_dir(&cache)
        .expect("the kernel cache")
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().to_string_lossy().into_owned();
            (n.starts_with("decode_layer_swiglu-") && n.ends_with("_insts.bin"))
                .then(|| e.metadata().ok())?
        })
        .map(|m| m.len())
        .collect();
    assert_eq!(
        layers,
        vec![8 * 4],
        "decode layer streams in {}",
        cache.display()
    );
}

/// Other families' tiny models with the IRON designs emulated (the tiny llama's weights as
/// each lays them out, `scripts/models.sh`): the tiny llamas' gate (logits close to the CPU's,
/// every layer op an emulated IRON kernel on HSA0). phi3 (Q, K and V in one attn_qkv matrix,
/// gate and up in one ffn_up, Q scaled before the attention, NeoX rotation) decodes a layer as
/// one kernel as llama does: the rewrite table reads its fused matrices as row slices
/// (`ops::rewrite`). qwen3 (per-head Q and K norms) and qwen2 (Q, K and V biases) decode a
/// layer as one too, their norms or biases in its projection phase
/// (DECODE_LAYER_HEAD_NORM_SWIGLU, DECODE_LAYER_BIAS_SWIGLU). gemma2 (norms after the
/// attention's projection and after the block, softcaps, a sliding window) decodes a layer as
/// one kernel with its post norms as phases of their own (DECODE_LAYER_POST_NORM_GEGLU); gemma3
/// (gemma2's layout without softcaps, with qwen3's per-head norms) too
/// (DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU).
/// Layers of the tiny models (`scripts/models/make_tiny_llama.py`).
const TINY_LAYERS: u64 = 4;

#[test]
fn tiny_families_run_every_layer_op_through_the_emulated_iron_designs() {
    for (name, kernel) in [
        ("tiny-phi3-f32", "DECODE_LAYER_SWIGLU"),
        ("tiny-qwen2-f32", "DECODE_LAYER_BIAS_SWIGLU"),
        ("tiny-qwen3-f32", "DECODE_LAYER_HEAD_NORM_SWIGLU"),
        ("tiny-gemma2-f32", "DECODE_LAYER_POST_NORM_GEGLU"),
        ("tiny-gemma3-f32", "DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU"),
    ] {
        let Some((log, counters, stats, tokens)) = tiny_llama_emulated(name) else {
            return;
        };
        assert_all_layer_ops_emulated(name, &log, &counters, &stats);
        let c = read_json(&counters);
        let layers = c["emulated_ops"][kernel].as_u64().unwrap_or(0);
        println!("{name}: {layers} decode layers ran {kernel}");
        // Every layer of every decode step (each generated token but the first, which the
        // prompt's graph gives).
        let want = TINY_LAYERS * (tokens as u64 - 1);
        assert_eq!(
            layers, want,
            "{name}: {kernel} ran {layers} times, not once per decode layer: {}",
            c["emulated_ops"]
        );
    }
}

/// all-MiniLM-L6-v2 with the IRON designs emulated: every layer op on HSA0 as an emulated IRON
/// kernel (its attention's MUL_MATs on permuted views included), GET_ROWS on the host, and
/// embeddings close to the CPU's (the NPU's GEMMs multiply in bf16, so the bound is looser than
/// the reference executors' 0.9999). The same gate for MiniLM.
#[test]
fn minilm_runs_every_layer_op_through_the_emulated_iron_designs() {
    let (Some(bin), Some(model)) = (dl_bin(), model("minilm")) else {
        return;
    };
    let sentences = MINILM_SENTENCES;
    let (env, counters, stats) = emu_env("minilm");
    let (cpu, _) = embeddings(&bin, &model, &sentences, None);
    let (npu, log) = embeddings(&bin, &model, &sentences, Some(&env));
    assert_all_layer_ops_emulated("minilm", &log, &counters, &stats);
    assert_eq!(npu.len(), sentences.len());
    for (i, s) in sentences.iter().enumerate() {
        let c = cosine(&npu[i], &cpu[i]);
        println!("minilm, IRON emulated: cos(HSA0, CPU) = {c:.6} for {s:?}");
        assert!(c >= 0.999, "{s:?}: cosine {c} < 0.999");
    }
}

/// One finished request of llama-parallel: its prompt and the text generated for it.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    input: String,
    response: String,
}

/// llama-parallel (`-np` clients, 8 requests, greedy, the system prompt shared through the KV
/// cache, continuous batching (its default), 12 tokens each) on the CPU or on HSA0: the
/// requests by sequence number, and hsa-sim's kernel dispatch count.
fn parallel_run(
    program: &Path,
    model: &Path,
    clients: usize,
    env: Option<&[(String, String)]>,
) -> (std::collections::BTreeMap<usize, Request>, u64) {
    let counters =
        common::scratch_dir(&format!("parallel-{clients}-{}", env.is_some())).join("counters.json");
    let mut cmd = Command::new(program);
    cmd.arg("-m")
        .arg(model)
        .args(["-np", &clients.to_string(), "-ns", "8", "-n", "12"])
        .args([
            "--temp", "0", "--seed", "42", "-c", "4096", "-ngl", "99", "-pps",
        ])
        .env_remove("GGML_BACKEND_PATH");
    if let Some(env) = env {
        cmd.env(
            "GGML_BACKEND_PATH",
            program.with_file_name("libggml-hsa.so"),
        )
        .envs(env.iter().map(|(k, v)| (k, v)));
    }
    cmd.env("HSA_SIM_COUNTERS", &counters);
    let run = run_bounded(&mut cmd, RUN_TIMEOUT);
    let log = format!("{}{}", run.stdout, run.stderr);
    assert!(
        run.status.is_some_and(|s| s.success()),
        "llama-parallel -np {clients} failed ({:?}):\n{}",
        run.status,
        tail(&log)
    );
    // "Client %3d, seq %3d/%3d, ... \n\nInput:    %s\n\033[35mResponse: %s\033[0m": the
    // response ends at the colour reset (a generated text may hold blank lines).
    let mut requests = std::collections::BTreeMap::new();
    for block in log.split("\u{1b}[31mClient ").skip(1) {
        let Some((_, after_seq)) = block.split_once(", seq ") else {
            continue;
        };
        let Some((seq, _)) = after_seq.split_once('/') else {
            continue;
        };
        let Some((_, input)) = block.split_once("Input:    ") else {
            continue;
        };
        let (input, rest) = input
            .split_once("\n\u{1b}[35mResponse: ")
            .expect("a response after the input");
        let (response, _) = rest.split_once("\u{1b}[0m").expect("the response's end");
        let seq: usize = seq.trim().parse().expect("a sequence number");
        let request = Request {
            input: input.to_owned(),
            response: response.to_owned(),
        };
        assert!(requests.insert(seq, request).is_none(), "seq {seq} twice");
    }
    (requests, dispatches_in(&counters))
}

/// The kernel dispatches hsa-sim counted (its `HSA_SIM_COUNTERS` file), 0 when it wrote none.
fn dispatches_in(counters: &Path) -> u64 {
    std::fs::read_to_string(counters)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["dispatches"].as_u64())
        .unwrap_or(0)
}

#[test]
fn parallel_sequences_on_hsa0_match_serial_runs_and_mostly_the_cpu() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let Some(program) = require(
        bin.join("llama-parallel"),
        "scripts/llama-cpp.sh build-dl llama-parallel",
    ) else {
        return;
    };
    let env = sim_env("parallel");
    let (cpu, _) = parallel_run(&program, &model, 4, None);
    let (npu, on_hsa0) = parallel_run(&program, &model, 4, Some(&env));
    let (serial, _) = parallel_run(&program, &model, 1, Some(&env));
    assert_eq!(cpu.len(), 8, "{cpu:?}");
    assert!(
        cpu.values().any(|r| !r.response.trim().is_empty()),
        "nothing generated: {cpu:?}"
    );
    // The strict check: on one device, a sequence's text does not depend on the sequences
    // decoded beside it (KV cache cells shared, copied and reused between requests). Against the
    // CPU the texts are the same but where greedy meets a near-tie: two of the eight requests
    // (the same prompt twice) part from the CPU's text at their sixth token in serial HSA0 runs
    // as much as in parallel ones (HSA0 keeps f32 where the CPU rounds K/V products to f16).
    assert_eq!(npu.len(), serial.len());
    for (seq, want) in &serial {
        assert_eq!(
            npu.get(seq),
            Some(want),
            "sequence {seq}: HSA0 -np 4 vs HSA0 -np 1"
        );
    }
    assert_eq!(npu.len(), cpu.len());
    let same_as_cpu: Vec<usize> = cpu
        .iter()
        .filter(|(seq, want)| npu.get(seq) == Some(want))
        .map(|(seq, _)| *seq)
        .collect();
    let common_start = |seq: &usize| {
        let (a, b) = (&npu[seq].response, &cpu[seq].response);
        a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
    };
    let differing: Vec<(usize, usize)> = cpu
        .keys()
        .filter(|s| !same_as_cpu.contains(s))
        .map(|s| (*s, common_start(s)))
        .collect();
    for (seq, at) in &differing {
        // The same prompt, and a text that parts after a common start, never at once.
        assert_eq!(npu[seq].input, cpu[seq].input);
        assert!(
            *at > 0,
            "sequence {seq}: HSA0 and CPU differ from the first character"
        );
    }
    let distinct: std::collections::BTreeSet<&str> =
        cpu.values().map(|r| r.input.as_str()).collect();
    println!(
        "llama-parallel -np 4 -ns 8 (continuous batching, shared system prompt): {} sequences \
         ({} distinct prompts) identical on HSA0 -np 4 and HSA0 -np 1; {} of them identical to \
         the CPU's ({same_as_cpu:?}), the others part after a common start of (sequence, \
         characters) {differing:?}; {on_hsa0} kernel dispatches on HSA0 (hsa-sim)",
        cpu.len(),
        distinct.len(),
        same_as_cpu.len(),
    );
    assert!(
        same_as_cpu.len() * 2 >= cpu.len(),
        "most sequences differ from the CPU's: {differing:?}"
    );
    // The graphs (batches of several sequences) ran on HSA0: at least a kernel per layer (4)
    // in each of the steps generating 8 sequences' 12 tokens 4 at a time.
    assert!(
        on_hsa0 >= 4 * (8 * 12 / 4),
        "{on_hsa0} kernel dispatches on HSA0"
    );
}

/// No node of a run ran on the CPU behind HSA0's back (the token embeddings' GET_ROWS aside):
/// its statistics file (`GGML_HSA_STATS`), written when the program ends.
fn assert_no_node_on_the_cpu(tag: &str, stats: &Path) {
    let on_cpu = read_json(stats)["cpu_nodes"].clone();
    assert!(
        on_cpu
            .as_object()
            .is_none_or(|m| m.keys().all(|op| op == "GET_ROWS")),
        "{tag}: nodes on the CPU: {on_cpu}"
    );
}

/// The gate for a step of several tokens: a decode layer kernel (`DECODE_LAYER_SWIGLU`) ran
/// over `tokens` tokens at once (its name carries the positions' operand, i32 of `tokens`).
/// The run dispatched a decode layer kernel (its name starting with `layer`) over `tokens`.
fn assert_layer_kernel_of_tokens(tag: &str, counters: &Path, layer: &str, tokens: usize) {
    let c = read_json(counters);
    let kernels = c["kernels"].as_object().expect("per-kernel counters");
    let positions = format!("-i32_{tokens}-");
    assert!(
        kernels
            .keys()
            .any(|k| k.starts_with(layer) && k.contains(&positions)),
        "{tag}: no decode layer kernel of {tokens} tokens: {:?}",
        kernels.keys().collect::<Vec<_>>()
    );
}

/// Several sequences decoding side by side through the emulated IRON designs, as llama-server's
/// slots and llama-parallel's clients do: four sequences of the tiny llama Q4_0 (prompts of
/// different lengths, so different positions and cache cells), their prompts in one batch, then
/// one token of each per step, teacher-forced along the CPU's tokens, each sequence's logits at
/// every step within the quantized bound of the CPU's; with a KV cache per sequence (llama.cpp's
/// default) and with one shared cache (`--kv-unified`, the sequences told apart by the mask).
/// Then llama-parallel (`-np 4`, 8 requests, the f32 tiny llama) on HSA0: at least half its
/// texts the CPU's, the others parting from it after a common start (greedy near-ties of the
/// random model, which HSA0 computes in bf16).
#[test]
fn several_sequences_decode_side_by_side_with_the_cpu_s_logits() {
    const STEPS: usize = 8;
    let Some(bin) = dl_bin() else {
        return;
    };
    let (Some(q4_0), Some(f32_model)) = (model("tiny-llama-q4_0"), model("tiny-llama-f32")) else {
        return;
    };
    let Some(parallel) = require(
        bin.join("llama-parallel"),
        "scripts/llama-cpp.sh build-dl llama-parallel",
    ) else {
        return;
    };
    let (env, counters, stats) = emu_env("sequences");
    for cache in [&["--seqs", "4"][..], &["--seqs", "4", "--kv-unified"]] {
        let args = |env, forced| GreedyArgs {
            plugin_env: env,
            forced,
            extra: cache,
            n_predict: Some(STEPS),
        };
        let (run, logits) = greedy_run(&bin, &q4_0, LONG_PROMPT, &args(None, &[]), RUN_TIMEOUT);
        let cpu = parse_greedy(&run, &logits);
        let (run, logits) = greedy_run(
            &bin,
            &q4_0,
            LONG_PROMPT,
            &args(Some(&env), &cpu.tokens),
            RUN_TIMEOUT,
        );
        let npu = parse_greedy(&run, &logits);
        let tag = cache.join(" ");
        assert_all_layer_ops_emulated(&tag, &npu.log, &counters, &stats);
        // A step's projections take its four tokens at once. With one cache, the whole layer
        // is one kernel (Q, K and V writing the cache rows, the attention reading each K and
        // V row once for the four, the block); with a cache per sequence, Q, K and V are one
        // (their rows copied into each sequence's cache after it, K's in one kernel and V's in
        // another), and the attention (each sequence's tokens against its own cache) with the
        // block after it another.
        if cache.contains(&"--kv-unified") {
            assert_layer_kernel_of_tokens(&tag, &counters, "decode_layer_swiglu-", 4);
        } else {
            let emulated = &read_json(&counters)["emulated_ops"];
            for op in ["RMS_NORM_QKV_ROPE", "FLASH_ATTN_FFN_SWIGLU", "CPY_ROWS"] {
                assert!(
                    emulated.get(op).is_some(),
                    "{tag}: no {op} kernel: {emulated}"
                );
            }
        }
        let worst = worst_step_nmse(&npu, &cpu);
        println!("{tag}, teacher-forced: worst NMSE of a sequence's step {worst:.3e}");
        assert!(
            worst <= MAX_QUANTIZED_LOGITS_NMSE,
            "{tag}: NMSE {worst:.3e}"
        );
    }

    let (cpu, _) = parallel_run(&parallel, &f32_model, 4, None);
    let (npu, _) = parallel_run(&parallel, &f32_model, 4, Some(&env));
    assert_no_node_on_the_cpu("llama-parallel", &stats);
    assert_eq!(npu.len(), cpu.len(), "{npu:?}");
    let mut same = 0;
    for (seq, want) in &cpu {
        let got = &npu[seq];
        assert_eq!(got.input, want.input);
        let common = got
            .response
            .chars()
            .zip(want.response.chars())
            .take_while(|(a, b)| a == b)
            .count();
        same += usize::from(got == want);
        assert!(common > 0, "sequence {seq}: {got:?} vs the CPU's {want:?}");
    }
    println!(
        "llama-parallel -np 4 -ns 8 on HSA0 (emulated): {same} of {} texts the CPU's",
        cpu.len()
    );
    assert!(
        same * 2 >= cpu.len(),
        "{same} of {} texts the CPU's",
        cpu.len()
    );
}

/// Decode steps of several tokens of one sequence, as a speculative draft's verification batch
/// runs them, through the emulated IRON designs: the tiny llama Q4_0 teacher-forced along the
/// CPU's greedy tokens, the tokens after the prompt decoded 3 at a time with the logits of every
/// position (llama_greedy `--batch 3`), each layer one kernel over the batch's tokens (three: the
/// attention's objects hold more K rows than they carry keys), each position's logits within
/// the quantized bound of the CPU's, decoded one token at a time. Then llama-speculative (the
/// f32 tiny llama drafted by the
/// Q4_0 one, both on HSA0, drafts of up to 4 tokens) writes the text HSA0 gives without a draft
/// (llama-simple): its verification batches, the drafts it rejects and the cache rows it drops
/// after them change nothing. The tiny gemma3 Q4_0 the same way in batches of 3: each layer one
/// kernel over the batch with its norms after the attention's projection and after the block.
#[test]
fn verification_batches_of_several_tokens_match_one_token_at_a_time() {
    const STEPS: usize = 13;
    let Some(bin) = dl_bin() else {
        return;
    };
    let (Some(q4_0), Some(f32_model), Some(gemma3)) = (
        model("tiny-llama-q4_0"),
        model("tiny-llama-f32"),
        model("tiny-gemma3-q4_0"),
    ) else {
        return;
    };
    let Some(speculative) = require(
        bin.join("llama-speculative"),
        "scripts/llama-cpp.sh build-dl llama-speculative",
    ) else {
        return;
    };
    let (env, counters, stats) = emu_env("verify");
    let gemma3_env = emu_env("verify-gemma3");
    let cases = [
        (
            "batches of 3 tokens",
            &q4_0,
            (&env, &counters, &stats),
            "decode_layer_swiglu-",
        ),
        (
            "tiny gemma3, batches of 3 tokens",
            &gemma3,
            (&gemma3_env.0, &gemma3_env.1, &gemma3_env.2),
            "decode_layer_head_norm_post_norm_geglu-",
        ),
    ];
    for (tag, model, (env, counters, stats), layer) in cases {
        let args = |env, forced, extra| GreedyArgs {
            plugin_env: env,
            forced,
            extra,
            n_predict: Some(STEPS),
        };
        let (run, logits) =
            greedy_run(&bin, model, LONG_PROMPT, &args(None, &[], &[]), RUN_TIMEOUT);
        let cpu = parse_greedy(&run, &logits);
        let batched = args(Some(env), &cpu.tokens, &["--batch", "3"]);
        let (run, logits) = greedy_run(&bin, model, LONG_PROMPT, &batched, RUN_TIMEOUT);
        let npu = parse_greedy(&run, &logits);
        assert_all_layer_ops_emulated(tag, &npu.log, counters, stats);
        assert_layer_kernel_of_tokens(tag, counters, layer, 3);
        let worst = worst_step_nmse(&npu, &cpu);
        println!("{tag}, teacher-forced: worst step NMSE {worst:.3e}");
        assert!(
            worst <= MAX_QUANTIZED_LOGITS_NMSE,
            "{tag}: NMSE {worst:.3e}"
        );
    }

    let prompt = "Once upon a time";
    let mut cmd = Command::new(&speculative);
    cmd.arg("-m")
        .arg(&f32_model)
        .arg("-md")
        .arg(&q4_0)
        .args(["-p", prompt, "-n", "24", "--temp", "0", "-c", "512"])
        .args(["--spec-draft-n-max", "4", "--spec-draft-n-min", "1"])
        .args(["-dev", "HSA0", "-devd", "HSA0", "-ngl", "99", "-ngld", "99"])
        .env("GGML_BACKEND_PATH", bin.join("libggml-hsa.so"))
        .envs(env.iter().map(|(k, v)| (k, v)));
    let run = run_bounded(&mut cmd, RUN_TIMEOUT);
    assert!(
        run.status.is_some_and(|s| s.success()),
        "llama-speculative failed ({:?}):\n{}",
        run.status,
        tail(&run.stderr)
    );
    let count = |name: &str| -> usize {
        run.stderr
            .lines()
            .find_map(|l| {
                let (key, value) = l.split_once(&format!(" {name} "))?.1.split_once('=')?;
                key.trim().is_empty().then(|| value.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no {name} in the log:\n{}", tail(&run.stderr)))
    };
    let (drafted, accepted) = (count("n_drafted"), count("n_accept"));
    assert!(
        accepted > 0 && accepted < drafted,
        "drafts accepted and rejected: {accepted} of {drafted}"
    );
    let simple = require(
        bin.join("llama-simple"),
        "scripts/llama-cpp.sh build-dl llama-simple",
    )
    .expect("llama-simple");
    cmd.arg("-m")
        .arg(&f32_model)
        .args(["-n", "24", prompt])
        .env("GGML_BACKEND_PATH", bin.join("libggml-hsa.so"))
        .envs(env.iter().map(|(k, v)| (k, v)));
    // Its statistics are written at its end, before llama-simple runs.
    assert_no_node_on_the_cpu("llama-speculative", &stats);
    let mut cmd = Command::new(simple);
    cmd.arg("-m")
        .arg(&f32_model)
        .args(["-n", "24", prompt])
        .env("GGML_BACKEND_PATH", bin.join("libggml-hsa.so"))
        .envs(env.iter().map(|(k, v)| (k, v)));
    let plain = run_bounded(&mut cmd, RUN_TIMEOUT);
    assert!(
        plain.status.is_some_and(|s| s.success()),
        "llama-simple failed:\n{}",
        tail(&plain.stderr)
    );
    // Both print the prompt, then the generated text; llama-speculative may accept a draft's
    // tokens past the 24th.
    let (with_draft, without) = (run.stdout.trim(), plain.stdout.trim());
    println!(
        "llama-speculative on HSA0: {accepted} of {drafted} drafted tokens accepted; its text \
         {:?} begins with llama-simple's {without:?}",
        with_draft
    );
    assert!(
        without.len() > prompt.len() + 10 && with_draft.starts_with(without),
        "llama-speculative {with_draft:?} vs llama-simple {without:?} on HSA0"
    );
}

/// One completion of llama-server at `port`: the text of `prompt`'s 12 greedy tokens.
fn complete(port: u16, prompt: &str) -> String {
    use std::io::{Read, Write};
    let body = serde_json::json!({
        "prompt": prompt,
        "n_predict": 12,
        "temperature": 0.0,
        "seed": 42,
        "cache_prompt": false,
    })
    .to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(RUN_TIMEOUT)).expect("timeout");
    write!(
        s,
        "POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("receive");
    let (head, json) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(head.starts_with("HTTP/1.1 200"), "{reply}");
    let v: serde_json::Value = serde_json::from_str(json).expect("JSON");
    v["content"].as_str().expect("content").to_owned()
}

/// llama-server (`-np slots`, on HSA0 with `env`, on the CPU without) answering `prompts`, all
/// at once from one thread each when `concurrent`; the texts in the prompts' order, and the
/// kernels hsa-sim dispatched.
fn served(
    server: &Path,
    model: &Path,
    env: Option<&[(String, String)]>,
    prompts: &[&str],
    slots: usize,
    concurrent: bool,
) -> (Vec<String>, u64) {
    let tag = format!("server-{slots}-{}", env.is_some());
    let dir = common::scratch_dir(&tag);
    let counters = dir.join("counters.json");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let log = std::fs::File::create(dir.join("server.log")).expect("log");
    let mut cmd = Command::new(server);
    cmd.arg("-m")
        .arg(model)
        .args(["-np", &slots.to_string(), "-c", "1024", "-ngl", "99"])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .env_remove("GGML_BACKEND_PATH")
        .env("HSA_SIM_COUNTERS", &counters)
        .stdout(std::process::Stdio::null())
        .stderr(log);
    if let Some(env) = env {
        cmd.args(["-dev", "HSA0"])
            .env("GGML_BACKEND_PATH", server.with_file_name("libggml-hsa.so"))
            .envs(env.iter().map(|(k, v)| (k, v)));
    }
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Killed(cmd.spawn().expect("llama-server starts"));
    let deadline = std::time::Instant::now() + RUN_TIMEOUT;
    let server_log = || std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    // Ready once /health answers 200 (503 while the model loads).
    loop {
        assert!(
            child.0.try_wait().expect("wait").is_none(),
            "llama-server exited:\n{}",
            tail(&server_log())
        );
        assert!(
            std::time::Instant::now() < deadline,
            "llama-server not ready:\n{}",
            tail(&server_log())
        );
        let ready = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut s| {
            use std::io::{Read, Write};
            let mut reply = String::new();
            write!(
                s,
                "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            .is_ok()
                && s.read_to_string(&mut reply).is_ok()
                && reply.starts_with("HTTP/1.1 200")
        });
        if ready {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let texts: Vec<String> = if concurrent {
        std::thread::scope(|s| {
            let replies: Vec<_> = prompts
                .iter()
                .map(|p| s.spawn(move || complete(port, p)))
                .collect();
            replies
                .into_iter()
                .map(|r| r.join().expect("a reply"))
                .collect()
        })
    } else {
        prompts.iter().map(|p| complete(port, p)).collect()
    };
    drop(child);
    (texts, dispatches_in(&counters))
}

/// Serving several users: llama-server with four slots (`-np 4`) on HSA0 answers four
/// completions sent at once, each the text one slot gives it alone, and the CPU's text.
#[test]
fn llama_server_answers_four_concurrent_completions_with_the_cpu_s_texts() {
    let (Some(bin), Some(model)) = (dl_bin(), model("tiny-llama-f32")) else {
        return;
    };
    let Some(server) = require(
        bin.join("llama-server"),
        "scripts/llama-cpp.sh build-dl llama-server",
    ) else {
        return;
    };
    let prompts = [
        "Hello",
        "Hello world",
        "The weather today",
        "Once upon a time",
    ];
    let env = sim_env("server");
    let (cpu, _) = served(&server, &model, None, &prompts, 4, true);
    let (npu, on_hsa0) = served(&server, &model, Some(&env), &prompts, 4, true);
    let (alone, _) = served(&server, &model, Some(&env), &prompts, 1, false);
    println!("llama-server -np 4 on HSA0: {on_hsa0} kernel dispatches; texts {npu:?}");
    assert!(on_hsa0 > 0, "nothing ran on HSA0");
    assert!(cpu.iter().all(|t| !t.is_empty()), "{cpu:?}");
    assert_eq!(npu, alone, "four slots at once vs one slot at a time");
    assert_eq!(npu, cpu, "HSA0 vs the CPU");
}
