//! ggml graphs computed by the plugin on the hsa-sim software NPU, built and run through ggml's
//! own API the way an application does (the plugin is dlopen'ed like a dynamic backend):
//! batching of consecutive kernels behind one doorbell, the per-queue PDI limit, every packet
//! ABI with `auto` detection, and the injected failures of the simulator, each of which must give a
//! logged error and a failed graph (or a declined backend), never a crash or a hang, after which
//! the backend keeps working.
//!
//! The plugin and the simulator read their environment once per process, so each scenario runs
//! in a child process (this test binary, running the ignored `child_graph` test).

mod common;

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use ggml_hsa::ffi::sys;

const N: usize = 1024;
/// The canonical name of the chain's kernel (an ADD of two flattened f32 vectors).
const CHAIN_KERNEL: &str = "add-f32_1024-f32_1024-f32_1024";

struct Outcome {
    /// Everything the child printed (its result lines and the captured ggml log).
    text: String,
    counters: HashMap<String, serde_json::Value>,
}

impl Outcome {
    fn counter(&self, key: &str) -> u64 {
        self.counters
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("counter {key} missing:\n{}", self.text))
    }

    fn has(&self, needle: &str) -> bool {
        self.text.contains(needle)
    }
}

/// Runs `graph` (`chain` or `pdis`) `computes` times in a child process with `env`.
fn run(tag: &str, graph: &str, computes: u32, env: &[(&str, &str)]) -> Outcome {
    let dir = common::scratch_dir(&format!("graph-{tag}"));
    let counters = dir.join("counters.json");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", "child_graph", "--nocapture"])
        .env("GGML_HSA_TEST_GRAPH", graph)
        .env("GGML_HSA_TEST_COMPUTES", computes.to_string())
        .env("GGML_HSA_TEST_PLUGIN", common::plugin_path())
        .env(
            "GGML_HSA_LIBHSA_PATH",
            common::sim_artifact("libhsa_runtime64.so"),
        )
        .env(
            "GGML_HSA_JIT_COMPILER",
            common::sim_artifact("hsa-sim-compile"),
        )
        .env("GGML_HSA_KERNEL_CACHE_DIR", dir.join("cache"))
        .env("GGML_HSA_ENABLE_LOG", "1")
        .env("HSA_SIM_COUNTERS", &counters);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child process failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the child test did not run:\n{text}"
    );
    assert!(!text.contains("internal error"), "{text}");
    let counters = std::fs::read_to_string(&counters)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    Outcome { text, counters }
}

#[test]
fn twenty_consecutive_kernels_ring_one_doorbell_with_every_packet_abi() {
    for abi in ["a1", "a2", "a3", "b", "c"] {
        // The plugin is not told the ABI: `auto` must find it from the runtime.
        let o = run(
            &format!("chain-{abi}"),
            "chain",
            1,
            &[("HSA_SIM_PACKET_ABI", abi)],
        );
        assert!(o.has("STATUS 0 0"), "{abi}:\n{}", o.text);
        assert!(o.has("RESULT 0 ok"), "{abi}:\n{}", o.text);
        assert!(
            o.has(&format!("packet ABI {abi} (auto")),
            "{abi}:\n{}",
            o.text
        );
        assert_eq!(o.counter("doorbells"), 1, "{abi}:\n{}", o.text);
        assert_eq!(o.counter("dispatches"), 20, "{abi}");
        assert_eq!(o.counter("chains"), 1, "{abi}");
        assert_eq!(o.counter("pdi_loads"), 1, "{abi}");
        assert_eq!(o.counter("dispatch_errors"), 0, "{abi}");
    }
}

#[test]
fn bad_handles_and_a_null_graph_are_refused() {
    let o = run(
        "bad-handles",
        "chain",
        1,
        &[("GGML_HSA_TEST_BAD_HANDLES", "1")],
    );
    assert!(o.has("RESULT 0 ok"), "{}", o.text);
    let failed = sys::GGML_STATUS_FAILED;
    assert!(o.has(&format!("NULL_GRAPH {failed}")), "{}", o.text);
    assert!(o.has(&format!("FOREIGN_BACKEND {failed}")), "{}", o.text);
    assert!(o.has("NULL_BUFFER survived"), "{}", o.text);
    assert!(o.has("graph_compute: no graph (NULL)"), "{}", o.text);
    assert!(
        o.has("backend::graph_compute: not a backend of this plugin"),
        "{}",
        o.text
    );
    assert!(
        o.has("buffer::clear: not a buffer of this backend"),
        "{}",
        o.text
    );
    assert_eq!(o.counter("doorbells"), 1, "{}", o.text);
}

#[test]
fn an_aie2_agent_runs_the_same_graph() {
    let o = run("chain-aie2", "chain", 2, &[("HSA_SIM_AGENTS", "aie2")]);
    assert!(o.has("RESULT 0 ok") && o.has("RESULT 1 ok"), "{}", o.text);
    // The second compute reuses the loaded kernel: still one PDI load, one doorbell per graph.
    assert_eq!(o.counter("doorbells"), 2);
    assert_eq!(o.counter("pdi_loads"), 1);
}

/// The plan cache: a repeated graph reuses its plan, a graph with one source at another address
/// is planned again (and computes with that source), and the first graph's plan is still kept.
#[test]
fn a_repeated_graph_reuses_its_plan_and_a_moved_tensor_misses() {
    let dir = common::scratch_dir("graph-rebind-stats");
    let stats = dir.join("stats.json");
    let o = run(
        "rebind",
        "rebind",
        4,
        &[("GGML_HSA_STATS", stats.to_str().unwrap())],
    );
    for round in 0..4 {
        assert!(o.has(&format!("RESULT {round} ok")), "{}", o.text);
    }
    let totals: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(totals["graphs"], 4, "{totals}");
    // Planned for rounds 0 and 1 (b moved); rounds 2 and 3 find those plans.
    assert_eq!(totals["plan_hits"], 2, "{totals}");
    // One kernel, loaded once.
    assert_eq!(totals["pdi_loads"], 1, "{totals}");
    assert_eq!(totals["steady_pdi_loads"], 0, "{totals}");
}

#[test]
fn a_one_row_gather_between_kernels_is_read_through_and_its_index_still_checked() {
    // A kernel's one-row result gathered by one index, then read by another kernel: the
    // gather is a view (no host node, one command chain); index 1 (out of range) fails the
    // second compute cleanly, before anything is dispatched.
    let o = run("gather", "gather", 2, &[]);
    assert!(o.has("STATUS 0 0") && o.has("RESULT 0 ok"), "{}", o.text);
    assert!(!o.has("STATUS 1 0"), "{}", o.text);
    assert!(o.has("GET_ROWS index 1 out of range"), "{}", o.text);
    assert_eq!(o.counter("dispatches"), 2, "{}", o.text);
    assert_eq!(o.counter("doorbells"), 1, "{}", o.text);
}

#[test]
fn more_distinct_kernels_than_a_queue_holds_start_a_fresh_queue() {
    let o = run("pdis", "pdis", 1, &[]);
    assert!(o.has("STATUS 0 0") && o.has("RESULT 0 ok"), "{}", o.text);
    assert_eq!(o.counter("dispatches"), 40);
    assert_eq!(o.counter("pdi_loads"), 40);
    assert_eq!(o.counter("dispatch_errors"), 0, "{}", o.text);
    // 32 kernels behind the first doorbell, the other 8 on a fresh queue.
    assert_eq!(o.counter("doorbells"), 2, "{}", o.text);
}

/// Graphs of the "evict" child: each scales by its own factors, so every graph has kernels of
/// its own.
const EVICT_GRAPHS: usize = 5;
const EVICT_KERNELS_PER_GRAPH: usize = 4;
/// Each kernel takes two 4 KiB blocks of hsa-sim's dev heap (image and instruction stream), so
/// a 64 KiB heap holds 8 kernels: two of the graphs.
const EVICT_DEV_HEAP: &str = "64K";

/// More distinct kernels than the dev heap holds, on one device: the least recently used idle
/// kernels are evicted (their memory freed, under ABI c their executables destroyed) and
/// loaded again when needed, every graph computes the right values, and freeing the backend
/// releases the rest.
#[test]
fn a_full_dev_heap_evicts_the_least_recently_used_kernels() {
    for abi in ["a1", "c"] {
        let stats_dir = common::scratch_dir(&format!("graph-evict-stats-{abi}"));
        let stats = stats_dir.join("stats.json");
        let o = run(
            &format!("evict-{abi}"),
            "evict",
            2,
            &[
                ("HSA_SIM_PACKET_ABI", abi),
                ("HSA_SIM_DEV_HEAP_SIZE", EVICT_DEV_HEAP),
                ("GGML_HSA_STATS", stats.to_str().unwrap()),
            ],
        );
        let computes = 2 * EVICT_GRAPHS;
        for i in 0..computes {
            assert!(o.has(&format!("STATUS {i} 0")), "{abi}:\n{}", o.text);
            assert!(o.has(&format!("RESULT {i} ok")), "{abi}:\n{}", o.text);
        }
        let kernels = (computes * EVICT_KERNELS_PER_GRAPH) as u64;
        assert_eq!(o.counter("dispatches"), kernels, "{abi}");
        assert_eq!(o.counter("dispatch_errors"), 0, "{abi}:\n{}", o.text);
        // Two graphs fit: the first pass evicts the kernels of its first three graphs, the
        // second pass (in the same order) finds none of its kernels loaded.
        let distinct = (EVICT_GRAPHS * EVICT_KERNELS_PER_GRAPH) as u64;
        let fit = 2 * EVICT_KERNELS_PER_GRAPH as u64;
        let evictions = (distinct - fit) + distinct;
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        assert_eq!(s["kernel_evictions"], evictions, "{abi}: {s}");
        // Every load is a new PDI to its queue, on a queue replaced after each eviction.
        assert_eq!(o.counter("pdi_loads"), kernels, "{abi}");
        if abi == "c" {
            // One executable per load, per load that found the heap full (destroyed at once:
            // at least one per eviction, more when a graph first found the heap full of kernels
            // the stream's cached plans held and was planned again without them) and for the ABI
            // probe; the evicted ones were destroyed while the backend lived, the rest when it
            // was freed.
            let created = o.counter("executables_created");
            assert!(
                created > kernels + evictions,
                "{abi}: {created} executables"
            );
            assert!(
                o.has(&format!(
                    "EXECUTABLES before free: created {created} destroyed {}",
                    created - fit
                )),
                "{}",
                o.text
            );
            assert_eq!(o.counter("executables_destroyed"), created, "{abi}");
        }
    }
}

/// A failed graph, then a second compute that works (the stream replaced its queue).
#[test]
fn set_rows_into_consecutive_rows_is_a_copy_into_them() {
    // The indices are read when the graph runs: consecutive ones make the node a copy kernel
    // into those rows (the cache is not streamed whole), others in range one copy of the rows
    // apart (CPY_ROWS), or a copy of one row per index where a row is named twice (in order:
    // the later one wins); the same graph (one plan) takes each path per compute.
    let o = run("setrows", "setrows", 1, &[]);
    for round in 0..SET_ROWS_ROUNDS.len() {
        assert!(o.has(&format!("STATUS {round} 0")), "{}", o.text);
        assert!(o.has(&format!("SET_ROWS {round} ok")), "{}", o.text);
    }
    // Rounds 0 and 3 wrote 3 rows of 64 f16 (the copy, one kernel over its 192 elements: 3
    // rows, too few to run as powers of two, `ops::pieces`); round 1 too, the rows apart in one
    // kernel, and round 2, a row per dispatch (the copy of 64 elements). The SET_ROWS kernel,
    // loaded for indices out of range, never ran.
    assert_eq!(o.counter("dispatches"), 1 + 1 + 3 + 1, "{}", o.text);
    let cache = kernel_cache("setrows");
    common::assert_kernels_built(
        &cache,
        &[
            "cpy-f32_192-f16_192",
            "cpy-f32_64-f16_64",
            "cpy_rows-f32_64x3",
            "set_rows-f32_64x3",
        ],
    );
    let row = 64 * 2;
    assert_eq!(o.counter("bytes_written"), 4 * 3 * row, "{}", o.text);
}

#[test]
fn a_rope_into_consecutive_rows_writes_them_itself() {
    // llama's K: the ROPE's f32 output only feeds a SET_ROWS into an f16 cache. When the
    // indices are consecutive, the ROPE kernel writes the cache rows in f16 and nothing else
    // dispatches; other indices run the ROPE into its own output, then one copy of the rows
    // apart (a copy of each row where a row is named twice).
    let o = run("setrows-rope", "setrows-rope", 1, &[]);
    for round in 0..SET_ROWS_ROUNDS.len() {
        assert!(o.has(&format!("STATUS {round} 0")), "{}", o.text);
        assert!(o.has(&format!("SET_ROWS {round} ok")), "{}", o.text);
    }
    // Rounds 0 and 3: one dispatch; round 1: the ROPE and the copy of the rows apart; round
    // 2: the ROPE and three copies.
    assert_eq!(o.counter("dispatches"), 1 + 2 + 4 + 1, "{}", o.text);
    let cache = kernel_cache("setrows-rope");
    common::assert_kernels_built(
        &cache,
        &[
            "rope-f32_64x1x3-i32_3-f32_64x1x3",
            "rope-f32_64x1x3-i32_3-f16_64x1x3",
            "cpy_rows-f32_64x3",
            "set_rows-f32_64x3",
        ],
    );
    // Rounds 0 and 3 wrote 3 rows of 64 f16 (the ROPE into them); rounds 1 and 2 the ROPE's
    // f32 output and the same 3 rows.
    let row = 64 * 2;
    assert_eq!(
        o.counter("bytes_written"),
        2 * 3 * row + 2 * (3 * 64 * 4 + 3 * row),
        "{}",
        o.text
    );
}

#[test]
fn a_projection_into_consecutive_rows_writes_them_itself() {
    // llama's V: a MUL_MAT whose f32 product only feeds a SET_ROWS into an f16 cache. With
    // consecutive indices the product is written into the cache rows in f16, one dispatch;
    // other indices: the product, then one copy of the rows apart (a copy of each row where a
    // row is named twice).
    let o = run("setrows-mul-mat", "setrows-mul-mat", 1, &[]);
    for round in 0..SET_ROWS_ROUNDS.len() {
        assert!(o.has(&format!("STATUS {round} 0")), "{}", o.text);
        assert!(o.has(&format!("SET_ROWS {round} ok")), "{}", o.text);
    }
    assert_eq!(o.counter("dispatches"), 1 + 2 + 4 + 1, "{}", o.text);
    let cache = kernel_cache("setrows-mul-mat");
    common::assert_kernels_built(
        &cache,
        &[
            "mul_mat-f32_32x64-f32_32x3-f32_64x3",
            "mul_mat-f32_32x64-f32_32x3-f16_64x3",
            "cpy_rows-f32_64x3",
            "set_rows-f32_64x3",
        ],
    );
}

#[test]
fn a_norm_read_only_by_projections_runs_inside_them_or_alone_if_they_cannot() {
    // The norm and its weight's MUL are not dispatched: Q and K each normalise x themselves
    // (RMS_NORM_MUL_MAT), and K's writes its cache row in f16 itself (the SET_ROWS dispatches
    // nothing): two dispatches.
    let o = run("normfold", "normfold", 1, &[]);
    assert!(o.has("STATUS 0 0"), "{}", o.text);
    for what in ["q", "cache"] {
        assert!(o.has(&format!("NORMFOLD {what} ok")), "{what}: {}", o.text);
    }
    assert_eq!(o.counter("dispatches"), 2, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("normfold"),
        &[
            "rms_norm_mul_mat-f32_64x64-f32_64-f32_64-f32_64-",
            "rms_norm_mul_mat-f32_64x16-f32_64-f32_64-f16_16-",
        ],
    );
    // A compiler that declines the folded kernels (exit 2, as the IRON package does for a
    // prompt's GEMM-sized products): the fold is undone, the norm runs, then the projections.
    let o = run_declining("normfold-declined", "normfold", "RMS_NORM_MUL_MAT");
    assert!(o.has("STATUS 0 0"), "{}", o.text);
    for what in ["q", "cache"] {
        assert!(o.has(&format!("NORMFOLD {what} ok")), "{what}: {}", o.text);
    }
    // The norm, Q, and K (writing the cache row itself as a plain MUL_MAT).
    assert_eq!(o.counter("dispatches"), 3, "{}", o.text);
    assert!(!o.has("runs on the CPU"), "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("normfold-declined"),
        &["rms_norm_mul-", "mul_mat-"],
    );
}

#[test]
fn a_norm_another_split_reads_is_written_even_when_folded() {
    // The graph is one split of a larger one (a view of it, as ggml's scheduler hands out):
    // the norm's output z feeds a projection here and, through a reshape, a node of the next
    // split (on the CPU, say: a MoE's experts beside its router). Folding the norm into the
    // projection would leave z unwritten; the whole graph's use counts show the reader.
    let o = run("normsplit", "normsplit", 1, &[]);
    assert!(o.has("STATUS 0 0"), "{}", o.text);
    for what in ["z", "router"] {
        assert!(o.has(&format!("NORMSPLIT {what} ok")), "{what}: {}", o.text);
    }
    // Without a reader elsewhere the same split folds the norm: one dispatch, z not written.
    let o = run("normsplit-alone", "normsplit-alone", 1, &[]);
    assert!(o.has("NORMSPLIT router ok"), "{}", o.text);
    assert_eq!(o.counter("dispatches"), 1, "{}", o.text);
}

#[test]
fn a_feed_forward_block_runs_as_one_kernel_or_two_if_declined() {
    // llama's ffn_norm, gate/up pair with SWIGLU, ffn_down and residual ADD: one kernel
    // (RMS_NORM_FFN_SWIGLU).
    let all_ok = |o: &Outcome| {
        assert!(o.has("STATUS 0 0"), "{}", o.text);
        assert!(o.has("FFN ok"), "{}", o.text);
    };
    let o = run("ffn", "ffn", 1, &[]);
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 1, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn"),
        &["rms_norm_ffn_swiglu-f32_64x128-f32_64x128-f32_128x64-f32_64-f32_64-f32_64-f32_64-f32_128-p"],
    );
    // Declined: the normed gate/up kernel, then the down projection with the residual.
    let o = run_declining("ffn-declined", "ffn", "RMS_NORM_FFN_SWIGLU");
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 2, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn-declined"),
        &["rms_norm_mul_mat_swiglu-", "mul_mat_add-"],
    );
}

#[test]
fn the_attention_output_and_the_feed_forward_block_run_as_one_kernel_or_apart_if_declined() {
    // llama's attention output projection with its residual (ffn_inp), then the feed-forward
    // block with ffn_inp as its norm's input and its residual: one kernel
    // (MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU) writing ffn_inp, h and the output.
    let all_ok = |o: &Outcome| {
        assert!(o.has("STATUS 0 0"), "{}", o.text);
        for what in ["FFN ok", "FFN x ok", "FFN gathered ok"] {
            assert!(o.has(what), "{what}: {}", o.text);
        }
        assert!(!o.has("on the CPU"), "{}", o.text);
    };
    let o = run("ffn-attn", "ffn-attn", 1, &[]);
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 1, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn-attn"),
        &["mul_mat_add_rms_norm_ffn_swiglu-f32_96x64-f32_96-f32_64-f32_64x128-f32_64x128-f32_128x64-f32_64-f32_64-f32_64-f32_128-p"],
    );
    // The block's ADD in place (its output in x's memory, as ggml's allocator may place it):
    // still one kernel, the output written over r1 last.
    let o = run("ffn-attn-inplace", "ffn-attn-inplace", 1, &[]);
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 1, "{}", o.text);
    // Declined: the projection with its residual, then the block as one kernel.
    let o = run_declining(
        "ffn-attn-declined",
        "ffn-attn",
        "MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU",
    );
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 2, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn-attn-declined"),
        &["mul_mat_add-f32_96x64-", "rms_norm_ffn_swiglu-"],
    );
    // Both declined (a basic regular expression of both names): the block's fold, restored
    // when the fold on top of it is undone, is undone in turn: three kernels.
    let o = run_declining(
        "ffn-attn-both-declined",
        "ffn-attn",
        r"\(MUL_MAT_ADD_\)\{0,1\}RMS_NORM_FFN_SWIGLU",
    );
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 3, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn-attn-both-declined"),
        &[
            "mul_mat_add-f32_96x64-",
            "rms_norm_mul_mat_swiglu-",
            "mul_mat_add-f32_128x64-",
        ],
    );
}

#[test]
fn a_decode_attention_and_the_block_after_it_run_as_one_kernel_or_apart_if_declined() {
    // llama's decode attention (FLASH_ATTN_EXT with its mask), its output projection with the
    // residual, then the feed-forward block: one kernel (FLASH_ATTN_FFN_SWIGLU) writing the
    // attention, ffn_inp, h and the output.
    let all_ok = |o: &Outcome| {
        assert!(o.has("STATUS 0 0"), "{}", o.text);
        for what in ["FFN ok", "FFN x ok", "FFN gathered ok", "FFN a ok"] {
            assert!(o.has(what), "{what}: {}", o.text);
        }
        assert!(!o.has("on the CPU"), "{}", o.text);
    };
    let o = run("ffn-fa", "ffn-fa", 1, &[]);
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 1, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn-fa"),
        &["flash_attn_ffn_swiglu-f32_32x1x3-f16_32x16-f16_32x16-f16_16-f32_96x64-f32_64-"],
    );
    // Declined: the attention, then the projection and the block as one kernel.
    let o = run_declining("ffn-fa-declined", "ffn-fa", "FLASH_ATTN_FFN_SWIGLU");
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 2, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn-fa-declined"),
        &["flash_attn_ext_mask-", "mul_mat_add_rms_norm_ffn_swiglu-"],
    );
    // Every kernel of the whole block declined (as the IRON package declines a down projection
    // of another weight type): the attention through the gate and up products, then the down
    // projection with its residual.
    let o = run_declining("ffn-fa-glu", "ffn-fa", "[A-Z_]*FFN_SWIGLU");
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 2, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("ffn-fa-glu"),
        &["flash_attn_glu_swiglu-", "mul_mat_add-"],
    );
}

/// The aie2p kernel cache of the run tagged `tag`.
fn kernel_cache(tag: &str) -> std::path::PathBuf {
    common::scratch_path(&format!("graph-{tag}"))
        .join("cache")
        .join("aie2p")
}

/// `run(tag, graph, 1, ..)` with a compiler that declines (exit 2) every kernel of protocol op
/// `op` (a grep pattern: `common::declining_compiler`).
fn run_declining(tag: &str, graph: &str, op: &str) -> Outcome {
    let dir = common::scratch_dir(&format!("{tag}-declining-compiler"));
    let wrapper = common::declining_compiler(&dir, op);
    run(
        tag,
        graph,
        1,
        &[("GGML_HSA_JIT_COMPILER", wrapper.to_str().unwrap())],
    )
}

#[test]
fn q_k_and_v_of_one_norm_run_as_one_kernel_or_apart_when_declined() {
    // llama's Q, K and V with Q's and K's ROPE and K's and V's cache writes: one kernel
    // (RMS_NORM_QKV_ROPE) normalises x, projects, rotates Q and K and writes K's and V's cache
    // rows in f16: one dispatch.
    let o = run("normfold-rope", "normfold-rope", 1, &[]);
    let all_ok = |o: &Outcome| {
        assert!(o.has("STATUS 0 0"), "{}", o.text);
        for what in ["q", "cache", "vcache"] {
            assert!(o.has(&format!("NORMFOLD {what} ok")), "{what}: {}", o.text);
        }
    };
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 1, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("normfold-rope"),
        &["rms_norm_qkv_rope-f32_64x64-f32_64x16-f32_64x16-f32_64-f32_64-i32_1-f32_16x4-f16_16-f16_16-p"],
    );
    // The merged kernel declined: each projection with its norm and rotation is one kernel
    // (RMS_NORM_MUL_MAT_ROPE), K's and V's writing their cache rows themselves.
    let o = run_declining(
        "normfold-qkv-declined",
        "normfold-rope",
        "RMS_NORM_QKV_ROPE",
    );
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 3, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("normfold-qkv-declined"),
        &[
            "rms_norm_mul_mat_rope-f32_64x64-f32_64-f32_64-i32_1-f32_16x4-p",
            "rms_norm_mul_mat_rope-f32_64x16-f32_64-f32_64-i32_1-f16_16-p",
            "rms_norm_mul_mat-f32_64x16-f32_64-f32_64-f16_16-p",
        ],
    );
    // V's weights of another type than Q's and K's (llama.cpp's Q4_K_M: q6_K V in some layers):
    // still one kernel, each projection reading its own type.
    let o = run("normfold-rope-mixed", "normfold-rope-mixed", 1, &[]);
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 1, "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("normfold-rope-mixed"),
        &["rms_norm_qkv_rope-f32_64x64-f32_64x16-f16_64x16-f32_64-f32_64-i32_1-f32_16x4-f16_16-f16_16-p"],
    );
    // qwen2's Q, K and V biases and qwen3's per-head Q and K norms: one kernel each, the
    // biases or the heads' norm on the projections' cores.
    for (family, kernel) in [
        ("qwen2", "rms_norm_qkv_bias_rope-f32_64x64-f32_64x16-f32_64x16-f32_64-f32_64-i32_1-f32_64-f32_16-f32_16-f32_16x4-f16_16-f16_16-p"),
        ("qwen3", "rms_norm_qkv_head_norm_rope-f32_64x64-f32_64x16-f32_64x16-f32_64-f32_64-i32_1-f32_16-f32_16-f32_16x4-f16_16-f16_16-p"),
    ] {
        let tag = format!("normfold-rope-{family}");
        let o = run(&tag, &tag, 1, &[]);
        all_ok(&o);
        assert_eq!(o.counter("dispatches"), 1, "{family}: {}", o.text);
        common::assert_kernels_built(&kernel_cache(&tag), &[kernel]);
    }
    // The rotation declined too (a compiler without the op's shape): the projections and the
    // ROPEs run apart, K's ROPE and V's projection still writing the cache rows.
    let o = run_declining(
        "normfold-rope-declined",
        "normfold-rope",
        "RMS_NORM_MUL_MAT_ROPE",
    );
    all_ok(&o);
    assert_eq!(o.counter("dispatches"), 5, "{}", o.text);
    assert!(!o.has("runs on the CPU"), "{}", o.text);
    common::assert_kernels_built(
        &kernel_cache("normfold-rope-declined"),
        &[
            "rms_norm_mul_mat-",
            "rope-f32_16x4-",
            "rope-f32_16-i32_1-f16_16-",
        ],
    );
}

#[test]
fn an_operand_starting_mid_word_is_declined() {
    // The NPU's DMA reads whole 32-bit words: a kernel given a view at byte offset 2 would read
    // from the word's start. Such nodes stay on the CPU; views at word offsets run.
    let o = run("midword", "midword", 1, &[]);
    for offset in 0..=8 {
        let want = u8::from(offset % 4 == 0);
        for state in ["unallocated", "allocated"] {
            assert!(
                o.has(&format!("SUPPORTS {offset} {state} {want}")),
                "offset {offset}, {state}: expected {want}\n{}",
                o.text
            );
        }
    }
    assert!(o.has("an operand starts mid-word"), "{}", o.text);
}

fn assert_fails_then_recovers(o: &Outcome, why: &str) {
    assert!(o.has("STATUS 0 -1"), "{why}:\n{}", o.text);
    assert!(o.has("graph_compute failed"), "{why}:\n{}", o.text);
    assert!(
        o.has("STATUS 1 0") && o.has("RESULT 1 ok"),
        "{why}:\n{}",
        o.text
    );
}

#[test]
fn a_failed_dispatch_fails_the_graph_and_the_next_one_runs() {
    let o = run(
        "fail-dispatch",
        "chain",
        2,
        &[("HSA_SIM_FAIL_DISPATCH", "3")],
    );
    assert_fails_then_recovers(&o, "failed dispatch");
    assert!(o.has("HSA_STATUS_ERROR"), "{}", o.text);
}

#[test]
fn a_hung_dispatch_fails_the_graph_without_hanging() {
    let o = run("hang", "chain", 2, &[("HSA_SIM_HANG_DISPATCH", "5")]);
    assert_fails_then_recovers(&o, "hung dispatch");
    assert!(o.has("processed 4 of 20"), "{}", o.text);
}

#[test]
fn a_queue_error_state_fails_the_graph() {
    let o = run("error-state", "chain", 2, &[("HSA_SIM_ERROR_STATE", "1")]);
    assert_fails_then_recovers(&o, "error state");
}

#[test]
fn a_suspended_c_queue_is_replaced_and_the_failing_node_named() {
    // ABI c: the failing packet suspends the queue (its later doorbells would be ignored and
    // the completion signal of unprocessed packets never drops); the stream must not wait for
    // it, must name the node, and must run the next graph on a fresh queue.
    let o = run(
        "c-fail-dispatch",
        "chain",
        2,
        &[("HSA_SIM_PACKET_ABI", "c"), ("HSA_SIM_FAIL_DISPATCH", "3")],
    );
    assert_fails_then_recovers(&o, "failed dispatch under c");
    assert!(
        o.has("failed on the NPU (packet 2 of a batch of 20)"),
        "{}",
        o.text
    );
    assert!(o.has("the queue is suspended"), "{}", o.text);
    let o = run(
        "c-error-state",
        "chain",
        2,
        &[("HSA_SIM_PACKET_ABI", "c"), ("HSA_SIM_ERROR_STATE", "1")],
    );
    assert_fails_then_recovers(&o, "error state under c");
    assert!(
        o.has("failed on the NPU (packet 0 of a batch of 20)"),
        "{}",
        o.text
    );
    let o = run(
        "c-hang",
        "chain",
        2,
        &[("HSA_SIM_PACKET_ABI", "c"), ("HSA_SIM_HANG_DISPATCH", "5")],
    );
    assert_fails_then_recovers(&o, "hung dispatch under c");
}

#[test]
fn failed_allocations_are_reported_at_each_stage() {
    // 1st allocation: the backend's argument memory -> no backend.
    let o = run("alloc-1", "chain", 1, &[("HSA_SIM_FAIL_ALLOC", "1")]);
    assert!(o.has("BACKEND none"), "{}", o.text);
    assert!(o.has("cannot create a backend"), "{}", o.text);
    // 2nd: the tensor buffer -> ggml reports the failed allocation.
    let o = run("alloc-2", "chain", 1, &[("HSA_SIM_FAIL_ALLOC", "2")]);
    assert!(o.has("ALLOC failed"), "{}", o.text);
    assert!(o.has("cannot allocate a buffer"), "{}", o.text);
    // 3rd: loading the kernel into the dev heap -> the graph fails, nothing ran.
    let o = run("alloc-3", "chain", 2, &[("HSA_SIM_FAIL_ALLOC", "3")]);
    assert!(o.has("STATUS 0 -1"), "{}", o.text);
    assert!(o.has("OUT_OF_RESOURCES"), "{}", o.text);
    assert!(o.has("RESULT 1 ok"), "{}", o.text);
    assert_eq!(o.counter("doorbells"), 1, "{}", o.text);
}

#[test]
fn a_packet_abi_mismatch_is_an_error_not_a_hang() {
    for (ours, theirs) in [
        ("a2", "a1"),
        ("b", "a1"),
        ("a1", "b"),
        ("a1", "a3"),
        ("b", "c"),
        ("c", "a3"),
    ] {
        let o = run(
            &format!("abi-{ours}-{theirs}"),
            "chain",
            1,
            &[
                ("GGML_HSA_PACKET_ABI", ours),
                ("HSA_SIM_PACKET_ABI", theirs),
            ],
        );
        assert!(o.has("STATUS 0 -1"), "{ours} on {theirs}:\n{}", o.text);
        // A runtime before c cannot load the code object a c client gives it.
        let expected = if ours == "c" {
            "INVALID_CODE_OBJECT"
        } else {
            "INVALID_PACKET_FORMAT"
        };
        assert!(o.has(expected), "{ours} on {theirs}:\n{}", o.text);
    }
}

/// A `<name>.hsaco` in GGML_HSA_KERNEL_DIR is used (no compiler needed) under c, where it is
/// loaded as it is, and under b, where its blobs are; a corrupt one is ignored with a warning.
#[test]
fn hsaco_kernel_files_are_used_and_corrupt_ones_ignored() {
    // Compile the chain's kernel once, into a cache.
    let o = run("hsaco-compile", "chain", 1, &[]);
    assert!(o.has("RESULT 0 ok"), "{}", o.text);
    // (run's scratch directory; scratch_dir would empty it)
    let cache = std::env::temp_dir()
        .join(format!(
            "ggml-hsa-graph-hsaco-compile-{}",
            std::process::id()
        ))
        .join("cache")
        .join("aie2p");
    let pdi = std::fs::read(cache.join(format!("{CHAIN_KERNEL}.pdi"))).unwrap();
    let insts = std::fs::read(cache.join(format!("{CHAIN_KERNEL}_insts.bin"))).unwrap();
    let dir = common::scratch_dir("graph-hsaco-kernels");
    std::fs::create_dir_all(dir.join("aie2p")).unwrap();
    let hsaco = dir.join("aie2p").join(format!("{CHAIN_KERNEL}.hsaco"));
    let good = ggml_hsa::kernels::Arch::Aie2p
        .wrap_hsaco(CHAIN_KERNEL, &pdi, &insts, 3)
        .unwrap();
    std::fs::write(&hsaco, &good).unwrap();
    for abi in ["b", "c"] {
        let o = run(
            &format!("hsaco-{abi}"),
            "chain",
            1,
            &[
                ("HSA_SIM_PACKET_ABI", abi),
                ("GGML_HSA_KERNEL_DIR", dir.to_str().unwrap()),
                ("GGML_HSA_JIT_COMPILER", "/nonexistent/compiler"),
            ],
        );
        assert!(o.has("RESULT 0 ok"), "{abi}:\n{}", o.text);
        assert_eq!(o.counter("dispatches"), 20, "{abi}");
    }
    // Corrupt: ignored with a warning naming the file, and the kernel compiled instead.
    std::fs::write(&hsaco, &good[..good.len() - 7]).unwrap();
    let o = run(
        "hsaco-corrupt",
        "chain",
        1,
        &[
            ("HSA_SIM_PACKET_ABI", "c"),
            ("GGML_HSA_KERNEL_DIR", dir.to_str().unwrap()),
        ],
    );
    assert!(o.has("ignoring corrupt kernel file"), "{}", o.text);
    assert!(o.has(&hsaco.display().to_string()), "{}", o.text);
    assert!(o.has("RESULT 0 ok"), "{}", o.text);
}

#[test]
fn corrupt_and_foreign_kernel_files() {
    let dir = common::scratch_dir("graph-kernels");
    let arch = dir.join("aie2p");
    std::fs::create_dir_all(&arch).unwrap();
    let pdi = arch.join(format!("{CHAIN_KERNEL}.pdi"));
    let insts = arch.join(format!("{CHAIN_KERNEL}_insts.bin"));
    let kernel_dir = [("GGML_HSA_KERNEL_DIR", dir.to_str().unwrap())];

    // An instruction stream that is not a whole number of words: ignored with a warning, and
    // the kernel is compiled instead.
    std::fs::write(&pdi, b"not a PDI").unwrap();
    std::fs::write(&insts, [0u8; 30]).unwrap();
    let o = run("kernels-truncated", "chain", 1, &kernel_dir);
    assert!(o.has("ignoring corrupt kernel files"), "{}", o.text);
    assert!(o.has(&insts.display().to_string()), "{}", o.text);
    assert!(o.has("RESULT 0 ok"), "{}", o.text);

    // Well-formed files that are not a kernel image the runtime can load: the runtime refuses
    // the dispatch and the graph fails cleanly.
    std::fs::write(&insts, [0u8; 32]).unwrap();
    let o = run("kernels-foreign", "chain", 1, &kernel_dir);
    assert!(o.has("STATUS 0 -1"), "{}", o.text);
    assert!(o.has("graph_compute failed"), "{}", o.text);
}

static LOG: Mutex<String> = Mutex::new(String::new());

unsafe extern "C" fn capture_log(_level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    // SAFETY: ggml passes a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    LOG.lock().unwrap().push_str(&text);
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
#[ignore = "run by the tests above in a child process"]
fn child_graph() {
    let graph = std::env::var("GGML_HSA_TEST_GRAPH").unwrap();
    let computes: u32 = std::env::var("GGML_HSA_TEST_COMPUTES")
        .unwrap()
        .parse()
        .unwrap();
    let plugin = std::env::var("GGML_HSA_TEST_PLUGIN").unwrap();
    // SAFETY: capture_log matches ggml_log_callback and lives for the whole process.
    unsafe { sys::ggml_log_set(Some(capture_log), std::ptr::null_mut()) };
    // SAFETY: the plugin is this crate's cdylib; it is never unloaded (leaked below).
    let lib = Box::leak(Box::new(
        unsafe { libloading::Library::new(Path::new(&plugin)) }.unwrap(),
    ));
    // SAFETY: every call below follows ggml's C API with valid arguments: pointers come from the
    // calls before them and are checked for NULL where ggml may return NULL.
    unsafe {
        let init = *lib
            .get::<unsafe extern "C" fn() -> sys::ggml_backend_reg_t>(b"ggml_backend_init")
            .unwrap();
        let reg = init();
        assert!(!reg.is_null());
        compute(reg, &graph, computes);
    }
    eprintln!("--- captured ggml log ---\n{}", LOG.lock().unwrap());
}

/// # Safety
/// `reg` is the plugin's registry.
unsafe fn compute(reg: sys::ggml_backend_reg_t, graph: &str, computes: u32) {
    if graph == "evict" {
        // SAFETY: as for this function.
        return unsafe { compute_evict(reg, computes) };
    }
    if let Some(variant) = graph.strip_prefix("ffn") {
        let fa = variant == "-fa";
        // SAFETY: as for this function.
        return unsafe {
            compute_ffn(
                reg,
                variant.starts_with("-attn") || fa,
                variant == "-attn-inplace",
                fa,
            )
        };
    }
    if let Some(variant) = graph.strip_prefix("normsplit") {
        // SAFETY: as for this function.
        return unsafe { compute_norm_split(reg, variant != "-alone") };
    }
    if let Some(rope) = graph.strip_prefix("normfold") {
        // SAFETY: as for this function.
        return unsafe {
            compute_norm_fold(
                reg,
                rope.starts_with("-rope"),
                rope == "-rope-mixed",
                rope.strip_prefix("-rope-").unwrap_or(""),
            )
        };
    }
    if let Some(source) = graph.strip_prefix("setrows") {
        // SAFETY: as for this function.
        return unsafe { compute_set_rows(reg, source) };
    }
    if graph == "midword" {
        // SAFETY: as for this function.
        return unsafe { supports_views(reg) };
    }
    // SAFETY: see child_graph.
    unsafe {
        let dev = sys::ggml_backend_reg_dev_get(reg, 0);
        if dev.is_null() {
            println!("DEVICE none");
            return;
        }
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        if backend.is_null() {
            println!("BACKEND none");
            return;
        }
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: 1 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        let a = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
        let b = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
        let input: Vec<f32> = (0..N).map(|i| i as f32 * 0.25).collect();
        let mut expect = input.clone();
        let mut x = a;
        // `rebind`: the chain, with `b` pointed at another tensor's memory for the second
        // compute and back for the third (the plan cache must miss, then hit the first plan).
        let b2 = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
        // `gather`: the one row of a kernel's result gathered by one index (0, then 1 in the
        // second compute) and read by another kernel.
        let idx = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, 1);
        match graph {
            "gather" => {
                x = sys::ggml_scale(ctx, x, 2.0);
                let row = sys::ggml_reshape_2d(ctx, x, N as i64, 1);
                let gathered = sys::ggml_get_rows(ctx, row, idx);
                x = sys::ggml_scale(ctx, gathered, 3.0);
                expect.iter_mut().for_each(|e| *e *= 6.0);
            }
            "chain" | "rebind" => {
                for _ in 0..20 {
                    x = sys::ggml_add(ctx, x, b);
                    expect.iter_mut().for_each(|e| *e += 0.5);
                }
            }
            "pdis" => {
                for i in 0..40 {
                    let s = 1.0 + i as f32 / 1024.0;
                    x = sys::ggml_scale(ctx, x, s);
                    expect.iter_mut().for_each(|e| *e *= s);
                }
            }
            other => panic!("unknown graph {other}"),
        }
        let gf = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(gf, x);
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        if buffer.is_null() {
            println!("ALLOC failed");
        } else {
            sys::ggml_backend_tensor_set(a, f32_bytes(&input).as_ptr().cast(), 0, 4 * N);
            sys::ggml_backend_tensor_set(b, f32_bytes(&vec![0.5; N]).as_ptr().cast(), 0, 4 * N);
            sys::ggml_backend_tensor_set(b2, f32_bytes(&vec![1.5; N]).as_ptr().cast(), 0, 4 * N);
            let (b_data, b2_data) = ((*b).data, (*b2).data);
            for round in 0..computes {
                let index = round as i32;
                sys::ggml_backend_tensor_set(idx, index.to_le_bytes().as_ptr().cast(), 0, 4);
                if graph == "rebind" {
                    let rebound = round % 2 == 1;
                    (*b).data = if rebound { b2_data } else { b_data };
                    let add = if rebound { 1.5 } else { 0.5 };
                    expect = input.iter().map(|v| v + 20.0 * add).collect();
                }
                let status = sys::ggml_backend_graph_compute(backend, gf);
                println!("STATUS {round} {status}");
                if status == sys::GGML_STATUS_SUCCESS {
                    let mut out = vec![0u8; 4 * N];
                    sys::ggml_backend_tensor_get(x, out.as_mut_ptr().cast(), 0, 4 * N);
                    let got: Vec<f32> = out
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    let ok = got
                        .iter()
                        .zip(&expect)
                        .all(|(g, e)| (g - e).abs() <= 1e-5 * e.abs().max(1.0));
                    println!("RESULT {round} {}", if ok { "ok" } else { "bad" });
                }
            }
            if std::env::var_os("GGML_HSA_TEST_BAD_HANDLES").is_some() {
                // The backend's own slots, called with a NULL graph and with a backend that is
                // not the plugin's (another guid): refused, never dereferenced.
                let graph_compute = (*backend).iface.graph_compute.unwrap();
                println!(
                    "NULL_GRAPH {}",
                    graph_compute(backend, std::ptr::null_mut())
                );
                let mut other_guid: sys::ggml_guid = [7; 16];
                let mut foreign = *backend;
                foreign.guid = &mut other_guid;
                println!("FOREIGN_BACKEND {}", graph_compute(&mut foreign, gf));
                let buffer_clear = (*buffer).iface.clear.unwrap();
                buffer_clear(std::ptr::null_mut(), 0);
                println!("NULL_BUFFER survived");
            }
            sys::ggml_backend_buffer_free(buffer);
        }
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
    }
}

/// Device 0 of the plugin, a backend on it and a ggml context for tensors without data (the
/// children that must find a device).
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn open_device(
    reg: sys::ggml_backend_reg_t,
) -> (
    sys::ggml_backend_dev_t,
    sys::ggml_backend_t,
    *mut sys::ggml_context,
) {
    // SAFETY: see child_graph.
    unsafe {
        let dev = sys::ggml_backend_reg_dev_get(reg, 0);
        assert!(!dev.is_null());
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        assert!(!backend.is_null());
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: 1 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        (dev, backend, ctx)
    }
}

/// Index sets of the "setrows" child, one per compute of the same graph: consecutive rows (a
/// copy into them), then scattered and descending ones (a copy of a row each), then consecutive
/// again up to the last row.
const SET_ROWS_ROUNDS: [[i64; 3]; 4] = [[3, 4, 5], [9, 2, 7], [6, 5, 6], [13, 14, 15]];

/// ggml's ROPE of one head of `x.len()` values at position `pos` in normal mode (pairs of
/// neighbours rotated by pos * 10000^(-2i / n), no scaling), computed in f64.
fn rope_normal(x: &[f32], pos: f64) -> Vec<f32> {
    let n = x.len();
    let mut out = vec![0.0; n];
    for i in (0..n).step_by(2) {
        let theta = pos * 10000f64.powf(-(i as f64) / n as f64);
        let (sin, cos) = theta.sin_cos();
        let (a, b) = (f64::from(x[i]), f64::from(x[i + 1]));
        out[i] = (a * cos - b * sin) as f32;
        out[i + 1] = (a * sin + b * cos) as f32;
    }
    out
}

/// The "setrows" child: one graph writing 3 f32 rows of 64 into a 16-row f16 destination at
/// the i64 indices of each round of [`SET_ROWS_ROUNDS`] (set before each compute, as llama.cpp
/// sets its KV-cache slots), the destination checked after every compute; prints
/// `SET_ROWS <round> <ok|bad>`. `source` says where the rows come from: "" (the "setrows"
/// child) an input; "-rope" the input roped as llama's K is (one head of 64 per token,
/// positions 10 * round + row, the ROPE's output reshaped into the SET_ROWS's rows);
/// "-mul-mat" the product of an f32 weight matrix [32, 64] (small integers) and the input's
/// rows of 32, as llama's V projection (exact in f16).
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn compute_set_rows(reg: sys::ggml_backend_reg_t, source: &str) {
    const ROW: usize = 64;
    const ROWS: usize = 16;
    const K: usize = 32;
    let (rope, mul_mat) = (source == "-rope", source == "-mul-mat");
    // SAFETY: see child_graph.
    unsafe {
        let (_, backend, ctx) = open_device(reg);
        let cache = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F16, ROW as i64, ROWS as i64);
        let mut weights = std::ptr::null_mut();
        let (src, pos, rows) = if rope {
            let x = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_F32, ROW as i64, 1, 3);
            let pos = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, 3);
            let roped = sys::ggml_rope(ctx, x, pos, ROW as i32, 0);
            (x, pos, sys::ggml_reshape_2d(ctx, roped, ROW as i64, 3))
        } else if mul_mat {
            weights = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, K as i64, ROW as i64);
            let x = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, K as i64, 3);
            (x, std::ptr::null_mut(), sys::ggml_mul_mat(ctx, weights, x))
        } else {
            let src = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, ROW as i64, 3);
            (src, std::ptr::null_mut(), src)
        };
        let idx = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I64, 3);
        let out = sys::ggml_set_rows(ctx, cache, rows, idx);
        let gf = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(gf, out);
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null());
        sys::ggml_backend_tensor_memset(cache, 0, 0, 2 * ROW * ROWS);
        // W[n][k] in -2..=2.
        let w: Vec<f32> = (0..ROW * K)
            .map(|i| ((i / K + i % K) % 5) as f32 - 2.0)
            .collect();
        if mul_mat {
            sys::ggml_backend_tensor_set(weights, f32_bytes(&w).as_ptr().cast(), 0, 4 * w.len());
        }
        let mut expect = vec![0.0f32; ROW * ROWS];
        for (round, indices) in SET_ROWS_ROUNDS.iter().enumerate() {
            // Values exact in f16 (integers below 2048): round, source row and column.
            let values: Vec<f32> = if mul_mat {
                // x[r][k] in 0..=2: products below 2048 in magnitude.
                let x: Vec<f32> = (0..3 * K).map(|i| ((round + i) % 3) as f32).collect();
                sys::ggml_backend_tensor_set(src, f32_bytes(&x).as_ptr().cast(), 0, 4 * x.len());
                (0..3 * ROW)
                    .map(|i| {
                        let (r, n) = (i / ROW, i % ROW);
                        (0..K).map(|k| w[n * K + k] * x[r * K + k]).sum()
                    })
                    .collect()
            } else {
                let values: Vec<f32> = (0..3 * ROW)
                    .map(|i| (round * 256 + (i / ROW) * ROW + i % ROW) as f32)
                    .collect();
                sys::ggml_backend_tensor_set(
                    src,
                    f32_bytes(&values).as_ptr().cast(),
                    0,
                    4 * 3 * ROW,
                );
                values
            };
            let idx_bytes: Vec<u8> = indices.iter().flat_map(|i| i.to_le_bytes()).collect();
            sys::ggml_backend_tensor_set(idx, idx_bytes.as_ptr().cast(), 0, idx_bytes.len());
            let positions: Vec<i32> = (0..3).map(|r| (10 * round + r) as i32).collect();
            if rope {
                let bytes: Vec<u8> = positions.iter().flat_map(|p| p.to_le_bytes()).collect();
                sys::ggml_backend_tensor_set(pos, bytes.as_ptr().cast(), 0, bytes.len());
            }
            for (r, &row) in indices.iter().enumerate() {
                let row = row as usize;
                let mut values = values[r * ROW..(r + 1) * ROW].to_vec();
                if rope {
                    values = rope_normal(&values, f64::from(positions[r]));
                }
                // As the destination holds them.
                let values = values.iter().map(|&v| half::f16::from_f32(v).to_f32());
                for (e, v) in expect[row * ROW..(row + 1) * ROW].iter_mut().zip(values) {
                    *e = v;
                }
            }
            let status = sys::ggml_backend_graph_compute(backend, gf);
            println!("STATUS {round} {status}");
            let mut got = vec![0u8; 2 * ROW * ROWS];
            sys::ggml_backend_tensor_get(cache, got.as_mut_ptr().cast(), 0, got.len());
            // Exact for the copies (the values are exact in f16); within an f16 step of values
            // below 1024 for the rotations (the kernel's sin and cos are f32).
            let tolerance = if rope { 0.5 } else { 0.0 };
            let ok = got
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .zip(&expect)
                .all(|(g, e)| (g - e).abs() <= tolerance);
            println!("SET_ROWS {round} {}", if ok { "ok" } else { "bad" });
            if !ok {
                let got: Vec<f32> = got
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect();
                for r in 0..ROWS {
                    let (g, e) = (
                        &got[r * ROW..(r + 1) * ROW],
                        &expect[r * ROW..(r + 1) * ROW],
                    );
                    if g != e {
                        println!("  row {r}: got {:?}.., expected {:?}..", &g[..3], &e[..3]);
                    }
                }
            }
        }
        sys::ggml_backend_buffer_free(buffer);
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
    }
}

/// The "normfold" child: llama's attention input in small, x [64] normalised (RMS_NORM, MUL
/// by a weight row) and then projected by Q [64 x 64] and K [64 x 16] weights, each product
/// checked against the same computed in f64: Q's product itself (relative error 1e-4), K's
/// as written into row 5 of an f16 cache of 8 rows (SET_ROWS, the index a graph input),
/// within f16 rounding; prints `NORMFOLD <q|cache> <ok|bad>`. With `rope` (the "normfold-rope"
/// child), each product is rotated as llama's Q and K are (ROPE in normal mode, heads of 16,
/// position 7) before it is checked or written into the cache, and a V projection [64 x 16]
/// of the same normalised x is written unrotated into row 5 of a second f16 cache
/// (`NORMFOLD vcache <ok|bad>`). With `v_f16` ("normfold-rope-mixed"), V's weights are f16
/// while Q's and K's are f32, as llama.cpp's Q4_K_M mixes q4_K and q6_K (the weights are
/// multiples of 1/8: exact in both types). `family` "qwen2" ("normfold-rope-qwen2"): each
/// product plus its bias before the rotation; "qwen3": each rotated product's heads normalised
/// (RMS_NORM over the head, MUL by one head's weights) before the rotation.
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn compute_norm_fold(reg: sys::ggml_backend_reg_t, rope: bool, v_f16: bool, family: &str) {
    const K: usize = 64;
    const EPS: f32 = 1e-5;
    const HEAD: usize = 16;
    const POS: i32 = 7;
    let (qwen2, qwen3) = (family == "qwen2", family == "qwen3");
    let bias_of = |rows: usize| -> Vec<f32> { (0..rows).map(|i| (i as f32 * 0.7).cos()).collect() };
    let head_w: Vec<f32> = (0..HEAD).map(|i| 0.75 + (i % 5) as f32 * 0.125).collect();
    // SAFETY: see child_graph.
    unsafe {
        let (_, backend, ctx) = open_device(reg);
        let x = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, K as i64);
        let n = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, K as i64);
        let z = sys::ggml_mul(ctx, sys::ggml_rms_norm(ctx, x, EPS), n);
        // Q and K, rotated with `rope`; then V (never rotated) with `rope`.
        let projections: &[(usize, bool)] = if rope {
            &[(K, true), (16, true), (16, false)]
        } else {
            &[(K, false), (16, false)]
        };
        let weights: Vec<(usize, *mut sys::ggml_tensor)> = projections
            .iter()
            .enumerate()
            .map(|(i, &(rows, _))| {
                let ty = if v_f16 && i == 2 {
                    sys::GGML_TYPE_F16
                } else {
                    sys::GGML_TYPE_F32
                };
                (
                    rows,
                    sys::ggml_new_tensor_2d(ctx, ty, K as i64, rows as i64),
                )
            })
            .collect();
        let gf = sys::ggml_new_graph(ctx);
        let pos = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, 1);
        // qwen2's biases, qwen3's head norm weights (one per rotated projection).
        let mut biases = Vec::new();
        let mut norms = Vec::new();
        let products: Vec<_> = weights
            .iter()
            .zip(projections)
            .map(|(&(rows, w), &(_, rotated))| {
                let mut p = sys::ggml_mul_mat(ctx, w, z);
                if qwen2 {
                    let b = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, rows as i64);
                    biases.push(b);
                    p = sys::ggml_add(ctx, p, b);
                }
                if rotated {
                    let mut heads =
                        sys::ggml_reshape_3d(ctx, p, HEAD as i64, (rows / HEAD) as i64, 1);
                    if qwen3 {
                        let w = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, HEAD as i64);
                        norms.push(w);
                        heads = sys::ggml_mul(ctx, sys::ggml_rms_norm(ctx, heads, EPS), w);
                    }
                    let roped = sys::ggml_rope(ctx, heads, pos, HEAD as i32, 0);
                    p = sys::ggml_reshape_2d(ctx, roped, rows as i64, 1);
                }
                sys::ggml_build_forward_expand(gf, p);
                p
            })
            .collect();
        let idx = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I64, 1);
        let caches: Vec<_> = products[1..]
            .iter()
            .map(|&p| {
                let cache = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F16, 16, 8);
                let row = sys::ggml_reshape_2d(ctx, p, 16, 1);
                sys::ggml_build_forward_expand(gf, sys::ggml_set_rows(ctx, cache, row, idx));
                cache
            })
            .collect();
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null());
        for &cache in &caches {
            sys::ggml_backend_tensor_memset(cache, 0, 0, 2 * 16 * 8);
        }
        sys::ggml_backend_tensor_set(idx, 5i64.to_le_bytes().as_ptr().cast(), 0, 8);
        sys::ggml_backend_tensor_set(pos, POS.to_le_bytes().as_ptr().cast(), 0, 4);
        let xs: Vec<f32> = (0..K).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let ns: Vec<f32> = (0..K).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        sys::ggml_backend_tensor_set(x, f32_bytes(&xs).as_ptr().cast(), 0, 4 * K);
        sys::ggml_backend_tensor_set(n, f32_bytes(&ns).as_ptr().cast(), 0, 4 * K);
        for &b in &biases {
            let rows = (*b).ne[0] as usize;
            let bytes = f32_bytes(&bias_of(rows));
            sys::ggml_backend_tensor_set(b, bytes.as_ptr().cast(), 0, bytes.len());
        }
        for &w in &norms {
            sys::ggml_backend_tensor_set(w, f32_bytes(&head_w).as_ptr().cast(), 0, 4 * HEAD);
        }
        let mean_sq = xs.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / K as f64;
        let scale = 1.0 / (mean_sq + f64::from(EPS)).sqrt();
        let y: Vec<f64> = (0..K)
            .map(|i| f64::from(xs[i]) * scale * f64::from(ns[i]))
            .collect();
        let mut expected = Vec::new();
        for (&(rows, w), &(_, rotated)) in weights.iter().zip(projections) {
            let ws: Vec<f32> = (0..rows * K)
                .map(|i| ((i % 11) as f32 - 5.0) * 0.125)
                .collect();
            let bytes: Vec<u8> = if (*w).type_ == sys::GGML_TYPE_F16 {
                ws.iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect()
            } else {
                f32_bytes(&ws)
            };
            sys::ggml_backend_tensor_set(w, bytes.as_ptr().cast(), 0, bytes.len());
            // ggml multiplies f16 weights by activations rounded to f16.
            let y: Vec<f64> = if (*w).type_ == sys::GGML_TYPE_F16 {
                let f16 = |v: f64| f64::from(half::f16::from_f64(v).to_f32());
                y.iter().map(|&v| f16(v)).collect()
            } else {
                y.clone()
            };
            let bias = bias_of(rows);
            let product: Vec<f64> = (0..rows)
                .map(|r| (0..K).map(|k| f64::from(ws[r * K + k]) * y[k]).sum::<f64>())
                .zip(&bias)
                .map(|(v, &b)| if qwen2 { v + f64::from(b) } else { v })
                .collect();
            // qwen3: each head normalised and multiplied by the head's weights.
            let head_normed = |h: &[f64]| -> Vec<f64> {
                if !qwen3 {
                    return h.to_vec();
                }
                let ms = h.iter().map(|v| v * v).sum::<f64>() / h.len() as f64;
                let s = 1.0 / (ms + f64::from(EPS)).sqrt();
                h.iter()
                    .zip(&head_w)
                    .map(|(v, &w)| v * s * f64::from(w))
                    .collect()
            };
            expected.push(if rotated {
                product
                    .chunks(HEAD)
                    .flat_map(|h| {
                        let h: Vec<f32> = head_normed(h).iter().map(|&v| v as f32).collect();
                        rope_normal(&h, f64::from(POS))
                    })
                    .map(f64::from)
                    .collect()
            } else {
                product
            });
        }
        let status = sys::ggml_backend_graph_compute(backend, gf);
        println!("STATUS 0 {status}");
        // K's product only feeds the SET_ROWS (it may never be written): checked in the cache.
        for ((name, p), want) in ["q"].iter().zip(&products).zip(&expected) {
            let mut got = vec![0u8; 4 * want.len()];
            sys::ggml_backend_tensor_get(*p, got.as_mut_ptr().cast(), 0, got.len());
            let ok = got
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                .zip(want)
                .all(|(g, e)| (g - e).abs() <= 1e-4 * e.abs().max(1.0));
            println!("NORMFOLD {name} {}", if ok { "ok" } else { "bad" });
        }
        for ((name, &cache), want) in ["cache", "vcache"].iter().zip(&caches).zip(&expected[1..]) {
            let mut rows = vec![0u8; 2 * 16 * 8];
            sys::ggml_backend_tensor_get(cache, rows.as_mut_ptr().cast(), 0, rows.len());
            let rows: Vec<f32> = rows
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            let ok = (0..8).all(|r| {
                (0..16).all(|i| {
                    let (g, e) = (f64::from(rows[r * 16 + i]), want[i]);
                    if r == 5 {
                        (g - e).abs() <= 1e-3 * e.abs().max(1.0)
                    } else {
                        g == 0.0
                    }
                })
            });
            println!("NORMFOLD {name} {}", if ok { "ok" } else { "bad" });
        }
        sys::ggml_backend_buffer_free(buffer);
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
    }
}

/// The "normsplit" child: z = RMS_NORM(x) * n [64], a projection of z by W [64 x 4] (a MoE
/// router) and a reshape of z, computed as the first split of a graph whose next node (SCALE of
/// the reshape) another backend would run: `ggml_graph_view` of the nodes up to the reshape,
/// sharing the whole graph's use counts. Prints `NORMSPLIT z <ok|bad>` (z as read after the
/// split, against f64; only `elsewhere`) and `NORMSPLIT router <ok|bad>`. Without `elsewhere`
/// ("normsplit-alone") the graph has no SCALE, so nothing else reads z.
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn compute_norm_split(reg: sys::ggml_backend_reg_t, elsewhere: bool) {
    const K: usize = 64;
    const ROWS: usize = 4;
    const EPS: f32 = 1e-5;
    // SAFETY: see child_graph.
    unsafe {
        let (_, backend, ctx) = open_device(reg);
        let x = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, K as i64);
        let n = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, K as i64);
        let w = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, K as i64, ROWS as i64);
        let z = sys::ggml_mul(ctx, sys::ggml_rms_norm(ctx, x, EPS), n);
        let router = sys::ggml_mul_mat(ctx, w, z);
        let gf = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(gf, router);
        let split_end = if elsewhere {
            let experts_in = sys::ggml_reshape_2d(ctx, z, (K / 2) as i64, 2);
            sys::ggml_build_forward_expand(gf, sys::ggml_scale(ctx, experts_in, 2.0));
            sys::ggml_graph_n_nodes(gf) - 1
        } else {
            sys::ggml_graph_n_nodes(gf)
        };
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null());
        let xs: Vec<f32> = (0..K).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let ns: Vec<f32> = (0..K).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let ws: Vec<f32> = (0..ROWS * K)
            .map(|i| ((i % 11) as f32 - 5.0) * 0.125)
            .collect();
        sys::ggml_backend_tensor_set(x, f32_bytes(&xs).as_ptr().cast(), 0, 4 * K);
        sys::ggml_backend_tensor_set(n, f32_bytes(&ns).as_ptr().cast(), 0, 4 * K);
        sys::ggml_backend_tensor_set(w, f32_bytes(&ws).as_ptr().cast(), 0, 4 * ROWS * K);
        let mean_sq = xs.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / K as f64;
        let scale = 1.0 / (mean_sq + f64::from(EPS)).sqrt();
        let zs: Vec<f64> = (0..K)
            .map(|i| f64::from(xs[i]) * scale * f64::from(ns[i]))
            .collect();
        let rs: Vec<f64> = (0..ROWS)
            .map(|r| {
                (0..K)
                    .map(|k| f64::from(ws[r * K + k]) * zs[k])
                    .sum::<f64>()
            })
            .collect();
        let mut split = sys::ggml_graph_view(gf, 0, split_end);
        let status = sys::ggml_backend_graph_compute(backend, &mut split);
        println!("STATUS 0 {status}");
        let close = |t: *mut sys::ggml_tensor, want: &[f64]| {
            let mut got = vec![0u8; 4 * want.len()];
            sys::ggml_backend_tensor_get(t, got.as_mut_ptr().cast(), 0, got.len());
            got.chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                .zip(want)
                .all(|(g, e)| (g - e).abs() <= 1e-4 * e.abs().max(1.0))
        };
        let verdict = |ok: bool| if ok { "ok" } else { "bad" };
        if elsewhere {
            println!("NORMSPLIT z {}", verdict(close(z, &zs)));
        }
        println!("NORMSPLIT router {}", verdict(close(router, &rs)));
        sys::ggml_backend_buffer_free(buffer);
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
    }
}

/// The "ffn" child: llama's feed-forward block in small, x [64] normalised (RMS_NORM, MUL by a
/// weight row), the gate and up projections [64 x 128] and their SWIGLU, the down projection
/// [128 x 64] and the residual ADD of x, checked against the same computed in f64 (relative
/// error 1e-4); prints `FFN <ok|bad>`. With `attn` (the "ffn-attn" child), x is itself the
/// attention output projection [96 x 64] of an attention output a [96] plus the layer input r0
/// (MUL_MAT, ADD), as llama's ffn_inp; x is checked too (`FFN x <ok|bad>`), and its row as a
/// host GET_ROWS after the block gathers it (`FFN gathered <ok|bad>`). With `inplace` (the
/// "ffn-attn-inplace" child) the block's ADD writes into x (ggml_add_inplace), so x ends as
/// the output, which both checks of x then expect. With `fa` (the "ffn-fa" child) a is itself
/// a decode step's attention, FLASH_ATTN_EXT of one query row of 3 heads (D 32) sharing one KV
/// head over 16 f16 K/V rows with an f16 mask hiding the last 4 keys (their V rows NaN: a masked
/// key is skipped), reshaped to [96] as llama's output projection reads it; a is checked too
/// (`FFN a <ok|bad>`).
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn compute_ffn(reg: sys::ggml_backend_reg_t, attn: bool, inplace: bool, fa: bool) {
    const K: usize = 64;
    const F: usize = 128;
    const EPS: f32 = 1e-5;
    // SAFETY: see child_graph.
    unsafe {
        let (_, backend, ctx) = open_device(reg);
        let vector = |n: usize| sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, n as i64);
        let matrix = |k: usize, m: usize| {
            sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, k as i64, m as i64)
        };
        const KA: usize = 96;
        // The attention's shape with `fa`: D x heads = KA.
        const D: usize = 32;
        const HEADS: usize = KA / D;
        const KV: usize = 16;
        const MASKED: usize = 4;
        let f16_matrix = |k: usize, m: usize| {
            sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F16, k as i64, m as i64)
        };
        let q = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_F32, D as i64, 1, HEADS as i64);
        let (kc, vc, mask) = (f16_matrix(D, KV), f16_matrix(D, KV), f16_matrix(KV, 1));
        let attention =
            sys::ggml_flash_attn_ext(ctx, q, kc, vc, mask, 1.0 / (D as f32).sqrt(), 0.0, 0.0);
        let (a, r0, wo) = if fa {
            (
                sys::ggml_reshape_1d(ctx, attention, KA as i64),
                vector(K),
                matrix(KA, K),
            )
        } else {
            (vector(KA), vector(K), matrix(KA, K))
        };
        let x = if attn {
            sys::ggml_add(ctx, sys::ggml_mul_mat(ctx, wo, a), r0)
        } else {
            vector(K)
        };
        let n = vector(K);
        let (wg, wu, wd) = (matrix(K, F), matrix(K, F), matrix(F, K));
        let z = sys::ggml_mul(ctx, sys::ggml_rms_norm(ctx, x, EPS), n);
        let h = sys::ggml_swiglu_split(
            ctx,
            sys::ggml_mul_mat(ctx, wg, z),
            sys::ggml_mul_mat(ctx, wu, z),
        );
        let out = if inplace {
            sys::ggml_add_inplace(ctx, x, sys::ggml_mul_mat(ctx, wd, h))
        } else {
            sys::ggml_add(ctx, sys::ggml_mul_mat(ctx, wd, h), x)
        };
        let gf = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(gf, out);
        // With `attn`, x's row gathered on the host after the block (GET_ROWS, a host op): it
        // must wait for the kernel that writes x among its outputs.
        let row = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I32, 1);
        let gathered = sys::ggml_get_rows(ctx, sys::ggml_reshape_2d(ctx, x, K as i64, 1), row);
        if attn {
            sys::ggml_build_forward_expand(gf, gathered);
        }
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null());
        sys::ggml_backend_tensor_set(row, 0i32.to_le_bytes().as_ptr().cast(), 0, 4);
        let values = |len: usize, seed: usize| -> Vec<f32> {
            (0..len)
                .map(|i| (((i * 7 + seed) % 13) as f32 - 6.0) * 0.05)
                .collect()
        };
        let ns: Vec<f32> = (0..K).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let (wgs, wus, wds) = (values(K * F, 1), values(K * F, 5), values(F * K, 9));
        for (t, v) in [(n, &ns), (wg, &wgs), (wu, &wus), (wd, &wds)] {
            sys::ggml_backend_tensor_set(t, f32_bytes(v).as_ptr().cast(), 0, 4 * v.len());
        }
        let sine = |len: usize, f: f32| -> Vec<f32> {
            (0..len).map(|i| (i as f32 * f).sin() * 3.0).collect()
        };
        // x, or the projection it is made of (in f64, then rounded as the f32 tensor is).
        // With `fa`: q, K and V values f16 holds exactly (q goes to K's type first), the
        // attention in f64; else a's values themselves.
        let f16_bytes = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
                .collect()
        };
        let sixteenths = |len: usize, seed: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 5 + seed) % 11) as f32 / 16.0 - 0.3125)
                .collect()
        };
        let avs: Vec<f32> = if fa {
            let (qs, ks, mut vs) = (
                sixteenths(KA, 1),
                sixteenths(D * KV, 2),
                sixteenths(D * KV, 3),
            );
            vs[D * (KV - MASKED)..].fill(f32::NAN);
            let ms: Vec<f32> = (0..KV)
                .map(|j| {
                    if j < KV - MASKED {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            sys::ggml_backend_tensor_set(q, f32_bytes(&qs).as_ptr().cast(), 0, 4 * KA);
            for (t, v) in [(kc, &ks), (vc, &vs), (mask, &ms)] {
                sys::ggml_backend_tensor_set(t, f16_bytes(v).as_ptr().cast(), 0, 2 * v.len());
            }
            let scale = 1.0 / (D as f64).sqrt();
            let keys = KV - MASKED;
            (0..HEADS)
                .flat_map(|h| {
                    let s: Vec<f64> = (0..keys)
                        .map(|j| {
                            let dot: f64 = (0..D)
                                .map(|i| f64::from(qs[h * D + i]) * f64::from(ks[j * D + i]))
                                .sum();
                            dot * scale
                        })
                        .collect();
                    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = s.iter().map(|&v| (v - max).exp()).collect();
                    let sum: f64 = p.iter().sum();
                    let vs = &vs;
                    (0..D).map(move |d| {
                        let acc: f64 = (0..keys).map(|j| p[j] * f64::from(vs[j * D + d])).sum();
                        (acc / sum) as f32
                    })
                })
                .collect()
        } else {
            sine(KA, 0.23)
        };
        let xs: Vec<f32> = if attn {
            let (r0s, wos) = (sine(K, 0.37), values(KA * K, 3));
            if !fa {
                sys::ggml_backend_tensor_set(a, f32_bytes(&avs).as_ptr().cast(), 0, 4 * KA);
            }
            for (t, v) in [(r0, &r0s), (wo, &wos)] {
                sys::ggml_backend_tensor_set(t, f32_bytes(v).as_ptr().cast(), 0, 4 * v.len());
            }
            (0..K)
                .map(|r| {
                    let p: f64 = (0..KA)
                        .map(|i| f64::from(wos[r * KA + i]) * f64::from(avs[i]))
                        .sum();
                    (p + f64::from(r0s[r])) as f32
                })
                .collect()
        } else {
            let xs = sine(K, 0.37);
            sys::ggml_backend_tensor_set(x, f32_bytes(&xs).as_ptr().cast(), 0, 4 * K);
            xs
        };
        let mean_sq = xs.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / K as f64;
        let scale = 1.0 / (mean_sq + f64::from(EPS)).sqrt();
        let y: Vec<f64> = (0..K)
            .map(|i| f64::from(xs[i]) * scale * f64::from(ns[i]))
            .collect();
        let product = |w: &[f32], rows: usize, v: &[f64]| -> Vec<f64> {
            let k = v.len();
            (0..rows)
                .map(|r| (0..k).map(|i| f64::from(w[r * k + i]) * v[i]).sum())
                .collect()
        };
        let (g, u) = (product(&wgs, F, &y), product(&wus, F, &y));
        let hs: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
            .collect();
        let want: Vec<f64> = product(&wds, K, &hs)
            .iter()
            .zip(&xs)
            .map(|(&d, &x)| d + f64::from(x))
            .collect();
        let status = sys::ggml_backend_graph_compute(backend, gf);
        println!("STATUS 0 {status}");
        let mut got = vec![0u8; 4 * K];
        sys::ggml_backend_tensor_get(out, got.as_mut_ptr().cast(), 0, got.len());
        let ok = got
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .zip(&want)
            .all(|(g, e)| (g - e).abs() <= 1e-4 * e.abs().max(1.0));
        println!("FFN {}", if ok { "ok" } else { "bad" });
        if attn {
            let x_want: Vec<f64> = if inplace {
                want.clone()
            } else {
                xs.iter().map(|&v| f64::from(v)).collect()
            };
            for (what, t) in [("x", x), ("gathered", gathered)] {
                sys::ggml_backend_tensor_get(t, got.as_mut_ptr().cast(), 0, got.len());
                let ok = got
                    .chunks_exact(4)
                    .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                    .zip(&x_want)
                    .all(|(g, &e)| (g - e).abs() <= 1e-4 * e.abs().max(1.0));
                println!("FFN {what} {}", if ok { "ok" } else { "bad" });
            }
        }
        if fa {
            let mut got = vec![0u8; 4 * KA];
            sys::ggml_backend_tensor_get(attention, got.as_mut_ptr().cast(), 0, got.len());
            let ok = got
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                .zip(&avs)
                .all(|(g, &e)| (g - f64::from(e)).abs() <= 1e-5 * f64::from(e).abs().max(1.0));
            println!("FFN a {}", if ok { "ok" } else { "bad" });
        }
        sys::ggml_backend_buffer_free(buffer);
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
    }
}

/// The "midword" child: whether the device takes a SCALE of an f32 view starting at each byte
/// offset 0..=8 of an allocated tensor, and of the same views before allocation (only the
/// view's offset known); prints `SUPPORTS <offset> <allocated> <0|1>`.
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn supports_views(reg: sys::ggml_backend_reg_t) {
    // SAFETY: see child_graph.
    unsafe {
        let (dev, backend, ctx) = open_device(reg);
        let whole = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64 + 4);
        let scales: Vec<_> = (0..=8)
            .map(|offset| {
                let view = sys::ggml_view_1d(ctx, whole, N as i64, offset);
                (offset, sys::ggml_scale(ctx, view, 2.0))
            })
            .collect();
        for &(offset, node) in &scales {
            let ok = sys::ggml_backend_dev_supports_op(dev, node);
            println!("SUPPORTS {offset} unallocated {}", u8::from(ok));
        }
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null());
        for &(offset, node) in &scales {
            // ggml-alloc leaves views to the graph allocator: place them by hand.
            let view = (*node).src[0];
            (*view).data = (*whole).data.cast::<u8>().add(offset).cast();
            (*view).buffer = (*whole).buffer;
            let ok = sys::ggml_backend_dev_supports_op(dev, node);
            println!("SUPPORTS {offset} allocated {}", u8::from(ok));
        }
        sys::ggml_backend_buffer_free(buffer);
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
    }
}

/// The "evict" child: [`EVICT_GRAPHS`] graphs of [`EVICT_KERNELS_PER_GRAPH`] SCALE nodes with
/// factors of their own, computed in order `passes` times, each result checked; before the
/// backend is freed, hsa-sim's executable counters (its counters file) are printed.
///
/// # Safety
/// `reg` is the plugin's registry.
unsafe fn compute_evict(reg: sys::ggml_backend_reg_t, passes: u32) {
    // SAFETY: see child_graph.
    unsafe {
        let (_, backend, ctx) = open_device(reg);
        let a = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, N as i64);
        let input: Vec<f32> = (0..N).map(|i| i as f32 * 0.25).collect();
        let graphs: Vec<_> = (0..EVICT_GRAPHS)
            .map(|g| {
                let mut x = a;
                let mut factor = 1.0f32;
                for k in 0..EVICT_KERNELS_PER_GRAPH {
                    let s = 1.0 + (g * EVICT_KERNELS_PER_GRAPH + k + 1) as f32 / 1024.0;
                    x = sys::ggml_scale(ctx, x, s);
                    factor *= s;
                }
                let gf = sys::ggml_new_graph(ctx);
                sys::ggml_build_forward_expand(gf, x);
                (gf, x, factor)
            })
            .collect();
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        assert!(!buffer.is_null());
        sys::ggml_backend_tensor_set(a, f32_bytes(&input).as_ptr().cast(), 0, 4 * N);
        let mut round = 0;
        for _ in 0..passes {
            for &(gf, x, factor) in &graphs {
                let status = sys::ggml_backend_graph_compute(backend, gf);
                println!("STATUS {round} {status}");
                let mut out = vec![0u8; 4 * N];
                sys::ggml_backend_tensor_get(x, out.as_mut_ptr().cast(), 0, 4 * N);
                let ok = out
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .zip(&input)
                    .all(|(g, i)| (g - i * factor).abs() <= 1e-5 * (i * factor).abs().max(1.0));
                println!("RESULT {round} {}", if ok { "ok" } else { "bad" });
                round += 1;
            }
        }
        if let Some(path) = std::env::var_os("HSA_SIM_COUNTERS") {
            let c: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            println!(
                "EXECUTABLES before free: created {} destroyed {}",
                c["executables_created"], c["executables_destroyed"]
            );
        }
        sys::ggml_backend_buffer_free(buffer);
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
    }
}
