#!/usr/bin/env bash
# The main job: llama.cpp running real models with their supported ops on HSA0, an aie2p NPU
# simulated by hsa-sim (no NPU needed). On a fresh machine it fetches and builds everything:
#   1. the pinned llama.cpp, built with ggml-hsa through the CMake hook (GGML_BACKEND_DL=ON);
#   2. the hsa-sim software NPU (its HSA runtime and kernel compiler);
#   3. the models (scripts/models.sh): the tiny llama and all-MiniLM-L6-v2;
# then runs
#   * the tiny llama (random weights), greedy, with tests/c/llama_greedy.cpp (the end-to-end
#     tests' decoder against libllama, built into the run's directory), once on the CPU alone and
#     once with HSA0, and prints both texts and where the scheduler put the nodes
#     (GGML_SCHED_DEBUG=2); on HSA0 the kernels are the IRON designs of src/ggml_hsa_iron,
#     emulated (`python3 -m ggml_hsa_iron --target emu` as the JIT compiler: the package's own
#     capabilities, its AIE core kernels built for the host, hsa-sim running the recorded
#     dataflow); it prints which ops ran as emulated IRON kernels (MAIN_LLAMA_COMPILER=reference:
#     hsa-sim's reference executor instead);
#   * the two runs' logits compared position by position (scripts/models/compare_logits.py, the
#     CPU fed HSA0's tokens): NMSE, top-1 and top-5 agreement, against the tests' tolerance; the
#     designs multiply in bf16, so the texts may part at a near-tie of the random model;
#   * the tiny llama through the f32 reference path (hsa-sim's reference executor): the CPU's
#     text, token for token, and its logits within the f32 tolerance;
#   * llama-embedding on all-MiniLM-L6-v2 on HSA0: the sentence similarity matrix, with the
#     published figures next to it;
#   * the simulator's counters per token: dispatches, doorbells, simulated device time (hsa-sim's
#     cost model, named). Exits 1 when a comparison is outside its tolerance.
#
#   scripts/main.sh                          the above
#   scripts/main.sh test-backend-ops [ARGS]  ggml's op tests on HSA0 instead (e.g. -o MUL_MAT)
#   scripts/main.sh --deps                   install the system packages it needs, nothing else
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=lib/apt.sh
. scripts/lib/apt.sh
if [ "${1:-}" = "--deps" ]; then
    scripts/llama-cpp.sh deps
    scripts/models.sh deps
    python_emu_install
    exit
fi

say() { printf '\n== %s\n' "$*"; }

scripts/llama-cpp.sh build-dl ggml-hsa llama-embedding test-backend-ops
bin=$(scripts/llama-cpp.sh path bin-dl)
cargo build --release --locked -p hsa-sim
out=$(mktemp -d)
export GGML_HSA_LIBHSA_PATH=$PWD/target/release/libhsa_runtime64.so
export GGML_HSA_JIT_COMPILER=$PWD/target/release/hsa-sim-compile
export GGML_HSA_KERNEL_CACHE_DIR=${GGML_HSA_KERNEL_CACHE_DIR:-$out/kernels}
export HSA_SIM_COUNTERS=$out/counters.json
plugin=$bin/libggml-hsa.so

if [ "${1:-}" = "test-backend-ops" ]; then
    shift
    say "test-backend-ops -b HSA0 $* (plugin $plugin, NPU: hsa-sim)"
    GGML_BACKEND_PATH=$plugin "$bin/test-backend-ops" -b HSA0 "$@"
    say "hsa-sim counters"
    cat "$HSA_SIM_COUNTERS"
    exit 0
fi

# The emulation target needs numpy and ml_dtypes (the designs' tensor types) and g++ (the
# build tools above).
python_emu_install
emu_compiler="python3 -m ggml_hsa_iron --target emu"
emu_env=(GGML_HSA_JIT_COMPILER="$emu_compiler" PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    GGML_HSA_KERNEL_CACHE_DIR="$out/kernels-emu")
if [ "${MAIN_LLAMA_COMPILER:-emu}" = reference ]; then
    emu_env=()
fi

scripts/models.sh all >/dev/null
llama=$(scripts/models.sh path tiny-llama-f32)
minilm=$(scripts/models.sh path minilm)
prompt="Once upon a time"

# tests/c/llama_greedy.cpp (the end-to-end tests' greedy decoder, built as tests/common/llama.rs
# builds it): the text, the token ids and the logits of every position.
src=$(scripts/llama-cpp.sh path src)
g++ -std=c++17 -O1 -I"$src/include" -I"$src/ggml/include" tests/c/llama_greedy.cpp \
    -o "$out/llama_greedy" -L"$bin" -lllama -lggml -lggml-base -Wl,-rpath,"$bin"
n_predict=24
# greedy TAG [ENV...] [-- ARGS...]: llama_greedy on the tiny llama, stdout in $out/TAG.out, the
# log in $out/TAG.log, the logits in $out/TAG.logits; without ENV on the CPU alone.
greedy() {
    local tag=$1 envs=() args=()
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -eq 0 ] || { shift; args=("$@"); }
    env -u GGML_BACKEND_PATH "${envs[@]}" "$out/llama_greedy" --backend-dir "$bin" -m "$llama" \
        -n "$n_predict" --logits "$out/$tag.logits" "${args[@]}" "$prompt" \
        >"$out/$tag.out" 2>"$out/$tag.log" || {
        tail -n 20 "$out/$tag.log" >&2
        echo "llama_greedy ($tag) failed; its log: $out/$tag.log" >&2
        return 1
    }
}
field() { sed -n "s/^$2: \{0,1\}//p" "$out/$1.out"; }
# first_difference A B: the first position (1-based) where two token lists differ, or nothing.
first_difference() {
    local a b i
    read -ra a <<<"$1"
    read -ra b <<<"$2"
    for ((i = 0; i < ${#a[@]} || i < ${#b[@]}; i++)); do
        [ "${a[i]:-}" = "${b[i]:-}" ] || { echo $((i + 1)); return; }
    done
}
verdicts=()

say "tiny llama ($llama) on the CPU alone"
greedy cpu
echo "$prompt$(field cpu text)"

if [ ${#emu_env[@]} -gt 0 ]; then
    # The f32 reference path (hsa-sim's reference executor) runs meanwhile, on a core the
    # emulated run leaves mostly idle; its section follows the emulated run's.
    greedy reference GGML_BACKEND_PATH="$plugin" HSA_SIM_COUNTERS="$out/counters-reference.json" &
    reference_pid=$!
    say "tiny llama on HSA0 (plugin $plugin, NPU: hsa-sim running the IRON designs, emulated)"
    npu_what="HSA0 (IRON designs, emulated)"
    limit=(--limit tests/llama_e2e.rs:MAX_QUANTIZED_LOGITS_NMSE --default 5e-3
        --why "the bound the tests hold the emulated designs to: they multiply in bf16")
else
    say "tiny llama on HSA0 (plugin $plugin, NPU: hsa-sim's reference executor, f32)"
    npu_what="HSA0 (reference executor, f32)"
    limit=(--limit tests/common/llama.rs:MAX_LOGITS_NMSE --default 1e-4 --same-top1
        --why "the f32 path's bound in the tests; the same text is required too")
fi
t0=$(date +%s.%N)
greedy npu "${emu_env[@]}" GGML_BACKEND_PATH="$plugin" GGML_SCHED_DEBUG=2 \
    HSA_SIM_COUNTERS="$out/counters-llama.json"
t1=$(date +%s.%N)
cp "$out/npu.log" "$out/llama.log"
echo "$prompt$(field npu text)"
parted=$(first_difference "$(field cpu tokens)" "$(field npu tokens)")
if [ -z "$parted" ]; then
    echo "(the same text as the CPU's)"
elif [ ${#emu_env[@]} -gt 0 ]; then
    fmt -w 96 <<EOF
(The two texts part at token $parted of $n_predict. This is expected, not a bug: the IRON designs
multiply in bf16 where the CPU computes in f32, and this tiny llama has random weights, so its
greedy choices are often near-ties that rounding can flip; after one different token the texts
go on from different contexts. What shows HSA0 right is the logits, position by position,
below; the f32 reference path after them gives the CPU's text.)
EOF
else
    echo "(The two texts part at token $parted of $n_predict: the f32 reference path must give the"
    echo " CPU's text. See the logits below.)"
fi
grep -E "using device|assigned to device|model buffer size|KV buffer size" "$out/llama.log" | sort -u | head -n 12
python3 - "$out/counters-llama.json" "$t0" "$t1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
ops = c.get("emulated_ops", {})
wall = float(sys.argv[3]) - float(sys.argv[2])
if ops:
    print("ops that ran as emulated IRON kernels (dispatches):",
          ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))
    print(f"emulation time {c.get('emulation_wall_ns', 0) / 1e9:.2f} s of a {wall:.1f} s run "
          "(kernel compiles included in the run)")
else:
    print(f"no emulated IRON kernels (reference executor); run {wall:.1f} s")
PY

# The CPU again, fed HSA0's tokens (llama_greedy --force): at every position both have seen the
# same text. (The tests teacher-force the other way round, to the same effect.)
npu_tokens=$(field npu tokens)
greedy cpu-forced -- --force "${npu_tokens// /,}"
say "logits, $npu_what vs the CPU, at each of the $n_predict positions (the same tokens before each)"
python3 scripts/models/compare_logits.py --got "$out/npu.logits" --want "$out/cpu-forced.logits" \
    --steps "$n_predict" "${limit[@]}" || verdicts+=("the logits of $npu_what")

if [ ${#emu_env[@]} -gt 0 ]; then
    say "tiny llama on HSA0 through the f32 reference path (hsa-sim's reference executor)"
    wait "$reference_pid"
    echo "$prompt$(field reference text)"
    if [ "$(field reference tokens)" = "$(field cpu tokens)" ]; then
        echo "(the same text as the CPU's, token for token)"
    else
        echo "(DIFFERS from the CPU's text from token $(first_difference "$(field cpu tokens)" \
            "$(field reference tokens)") on: the f32 path must give the CPU's text)"
    fi
    python3 scripts/models/compare_logits.py --got "$out/reference.logits" --want "$out/cpu.logits" \
        --steps "$n_predict" --limit tests/common/llama.rs:MAX_LOGITS_NMSE --default 1e-4 \
        --same-top1 --no-table --why "the f32 path's bound in the tests" ||
        verdicts+=("the f32 reference path")
    echo "What each run proves. This one: the host side and the dispatch path (llama.cpp with the"
    echo "plugin, graph placement, buffers, KV cache, packets and doorbells through HSA to the NPU)"
    echo "are right, since with kernels computing in f32 as the CPU does the text is the CPU's. The"
    echo "emulated run above: the IRON designs themselves (their dataflow and AIE core kernels, in"
    echo "bf16) compute what the CPU does, within the tolerance of bf16."
fi

say "where the nodes ran (the last graph the scheduler printed, GGML_SCHED_DEBUG=2)"
awk '
    /## SPLIT #0:/ { delete nodes; delete ops; splits = "" }
    /## SPLIT #/ { s = $0; sub(/.*## SPLIT #[0-9]+: /, "", s); split(s, w, " "); splits = splits " " w[1] }
    /node #/ {
        line = $0; sub(/.*node # *[0-9]+ \( */, "", line)
        op = line; sub(/\).*/, "", op)
        b = line; sub(/^[^[]*\[ */, "", b); split(b, w, " ")
        nodes[w[1]]++; ops[w[1] " " op]++
    }
    END {
        printf "splits:%s\n", splits
        for (k in nodes) printf "%-5s %4d nodes\n", k, nodes[k]
        for (k in ops) printf "  %-24s %4d\n", k, ops[k]
    }' "$out/llama.log" | sort

say "all-MiniLM-L6-v2 ($minilm) on HSA0: sentence similarities"
GGML_BACKEND_PATH=$plugin HSA_SIM_COUNTERS=$out/counters-minilm.json python3 scripts/models/similarity.py --bin "$bin" -m "$minilm" \
    --expect 0.6660,0.1046,0.1411 --tol 0.002

say "what it costs on the NPU: hsa-sim's counters, per token"
arch=$(sed -n 's/.*using device HSA0 (\([a-z0-9]*\)).*/\1/p' "$out/llama.log" | head -n 1)
python3 - "${arch:-aie2p}" "$n_predict" "$(field npu prompt_tokens)" "$npu_what" \
    "$out/counters-llama.json" "$out/counters-reference.json" "$out/counters-minilm.json" <<'PY'
import json, sys, textwrap
from pathlib import Path

arch, n, n_prompt, what = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
llama, reference, minilm = (Path(p) for p in sys.argv[5:8])

# The constants of hsa-sim's cost model for this architecture (crates/hsa-sim/src/cost.rs).
sys.path.insert(0, "scripts")
from bench import cost_constants
k = cost_constants(arch)
rebuild_ns = k.get("rebuild_per_column_ns", 0) * k.get("columns", 0) + k.get(
    "first_dispatch_after_rebuild_ns", 0)

def ms(ns):
    return f"{ns / 1e6:.2f} ms"

def per_token(label, c):
    d, t = c["dispatches"], c["device_time_ns"]
    builds = c["context_rebuilds"] * rebuild_ns
    print(f"{label}: {n} tokens, one graph each (the first with the {n_prompt}-token prompt)")
    print(f"  NPU dispatches (kernel launches): {d / n:.1f} per token ({d} in all); "
          f"doorbells: {c['doorbells'] / n:.1f} per token")
    print(f"  simulated device time: {ms(t / n)} per token ({ms(t)} in all), of which dispatch "
          f"costs {ms(c['dispatch_time_ns'] / n)}")
    if c.get("dataflow_timed"):
        print(f"    the kernels' work: {ms(c['work_time_ns'] / n)} per token, "
              f"{c['dataflow_timed']} of {d} commands timed from their emulated dataflow "
              f"(roofline bound of all: {ms(c['roofline_time_ns'] / n)})")
    if builds:
        print(f"    {ms((t - builds) / n)} per token without the {c['context_rebuilds']} one-time "
              f"hardware-context builds ({ms(builds)})")

c = json.loads(llama.read_text())
per_token(f"tiny llama, {what}", c)
if reference.exists():
    per_token("tiny llama, HSA0 (f32 reference path)", json.loads(reference.read_text()))
m = json.loads(minilm.read_text())
print(f"all-MiniLM-L6-v2, 3 sentences, HSA0 (reference executor): {m['dispatches']} dispatches, "
      f"{m['doorbells']} doorbells, simulated device time {ms(m['device_time_ns'])}")
if k:
    text = (f"The device times are simulated, not measured (nothing ran on an NPU): hsa-sim's {arch} "
          f"cost model (crates/hsa-sim/src/cost.rs; docs/timing-model.md): an emulated IRON "
          f"design's command takes the critical path of its dataflow (DMA channels at "
          f"{k['shim_channel_bytes_per_cycle']:g} bytes per cycle, DRAM at "
          f"{k['bandwidth_bytes_per_s'] / 1e9:g} GB/s, the cores' counted cycles), another the "
          f"slower of its bytes at that bandwidth and its arithmetic at "
          f"{k['measured_bf16_flops'] / 1e12:g} TFLOPS bf16; plus "
          f"{k['chain_latency_ns'] / 1e3:g} µs per command chain, "
          f"{k['chained_new_pdi_ns'] / 1e3:g} µs per further command switching PDI "
          f"({k['chained_loaded_pdi_ns'] / 1e3:g} µs without) and {ms(rebuild_ns)} per "
          "hardware-context build.")
else:
    text = (f"The device times are simulated, not measured: hsa-sim's {arch} cost model "
            "(crates/hsa-sim/src/cost.rs; docs/perf.md).")
print(textwrap.fill(text, width=96))
print(f"All counters: {llama.parent}/counters-*.json")
PY
echo
echo "logs: $out"
if [ ${#verdicts[@]} -gt 0 ]; then
    printf 'OUTSIDE tolerance: %s\n' "${verdicts[@]}" >&2
    exit 1
fi
