#!/usr/bin/env bash
# The benchmark: llama.cpp's llama-bench on the CPU and on HSA0 (the plugin on hsa-sim), with
# per-token figures against the NPU's limits and the published peers (scripts/bench.py).
#
#   scripts/bench.sh            Llama-3.2-1B-shaped GGUFs with random weights (16 layers, n_embd
#                               2048, 32 heads / 8 KV heads, ff 8192, vocab 128256, tied output)
#                               in f16, Q8_0, Q4_0 and Q4_K_M; pp512 and tg128; writes
#                               docs/perf.md and docs/perf.svg. HSA0 runs in hsa-sim's
#                               host-overhead mode (HSA_SIM_EXECUTE=0: kernels are counted and
#                               charged to the cost model, not computed), release builds.
#                               About 15 minutes on 2 cores, ~6 GB of models in the cache.
#   scripts/bench.sh --quick    the tiny llamas (f32, Q4_0), pp32 and tg16, kernels computed by
#                               hsa-sim: the same figures in about a minute (what CI runs).
#   Both end with the emulation's speed: emulated test-backend-ops cases per second on HSA0
#   (the IRON designs through hsa-sim's emulator): AIE cores built cold, warm, and warm with
#   the compile server the tests use.
#   scripts/bench.sh --models "q4_0 f16"   only these types of the full run.
#   scripts/bench.sh --emulation  the emulation's speed alone (the full run's selection),
#                               written over that section of docs/perf.md (after a change to
#                               the emulator or the compile path; about 15 minutes).
#   scripts/bench.sh --timing   the timing model's section of docs/perf.md alone: its
#                               calibration table, then the 1B shape's decode matmuls per weight
#                               type, its decode-layer kernel and its prompt's GEMMs, as the
#                               emulated IRON designs run them (scripts/bench_timing.py; about
#                               twenty minutes).
#   scripts/bench.sh --families the model families' section of docs/perf.md alone: each family's
#                               tiny model decoding on HSA0 (emulated), its dispatches per
#                               token and layer, and where a layer is one kernel the decode of
#                               the family's smallest common shape under the timing model
#                               (scripts/bench_families.py; a few minutes).
#   scripts/bench.sh --compiles [--models "q4_0 q4_k_m"]
#                               the compiles sections of docs/perf.md alone: a 512-token prompt
#                               and 4,095 generated tokens of the 1B shape on HSA0 (counted),
#                               the kernels compiled and the PDIs loaded after the first
#                               generated token; then prompts of six lengths, the kernels each
#                               compiles with and without power-of-two row counts
#                               (scripts/bench_compiles.py; a few minutes).
#   scripts/bench.sh --parallel [--models "q4_0 q4_k_m"]
#                               the section "Several sequences" of docs/perf.md alone: decode
#                               steps of 1, 4 and 8 sequences of the 1B shape on HSA0
#                               (llama-batched-bench, counted), per step the dispatches, bytes
#                               read, device time (roofline and timing model) and tokens per
#                               second in total and per sequence (scripts/bench_parallel.py;
#                               about ten minutes).
#   scripts/bench.sh op 'CASE'  one test-backend-ops case (`OP(params)` as the program prints
#                               it) on HSA0 through its emulated IRON design, aie2p and aie2:
#                               the device time hsa-sim's timing model gives, GB/s, TFLOPS
#                               (MUL_MAT), the shares of the DRAM and MAC roofs and where the
#                               time went (scripts/bench_op.py; docs/timing-model.md). A
#                               MUL_MAT shape test-backend-ops has no case of is built as the
#                               backend would request it and timed alone (hsa-sim-time).
#   scripts/bench.sh --kernels reference   HSA0 offers every kernel of hsa-sim's reference
#                               compiler; by default (--kernels iron) only those the IRON
#                               package declares, what a real NPU would run (hsa-sim computes
#                               them either way: HSA_SIM_COMPILE_DECLARE).
#
# The simulated figures come from hsa-sim's cost model (crates/hsa-sim/src/cost.rs, every
# constant with its source); nothing here has run on an NPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${1:-}" = op ]; then
    [ $# -eq 2 ] || { echo "usage: scripts/bench.sh op 'OP(params)'" >&2; exit 2; }
    scripts/llama-cpp.sh build-dl ggml-hsa test-backend-ops >/dev/null
    eval "$(scripts/llama-cpp.sh env)"
    . scripts/lib/apt.sh
    deps_install cxx >/dev/null && python_emu_install >/dev/null || exit 1
    cargo build --release --locked -p hsa-sim --quiet
    exec python3 scripts/bench_op.py --bin "$(scripts/llama-cpp.sh path bin-dl)" \
        --target "${CARGO_TARGET_DIR:-target}/release" "$2"
fi

mode=full
types=""
kernels=iron
while [ $# -gt 0 ]; do
    case $1 in
    --quick) mode=quick ;;
    --emulation) mode=emulation ;;
    --timing) mode=timing ;;
    --families) mode=families ;;
    --compiles) mode=compiles ;;
    --parallel) mode=parallel ;;
    --models)
        types=$2
        shift
        ;;
    --kernels)
        kernels=$2
        shift
        ;;
    *)
        echo "usage: scripts/bench.sh [--quick | --emulation | --timing | --families | --compiles | --parallel] [--models \"f16 q8_0 q4_0 q4_k_m\"] [--kernels iron|reference] | scripts/bench.sh op 'OP(params)'" >&2
        exit 2
        ;;
    esac
    shift
done
if [ -z "$types" ]; then
    case $mode in
    compiles | parallel) types="q4_0 q4_k_m" ;;
    *) types="f16 q8_0 q4_0 q4_k_m" ;;
    esac
fi
log() { printf '[bench] %s\n' "$*" >&2; }

if [ "$mode" = timing ]; then
    eval "$(scripts/llama-cpp.sh env)"
    . scripts/lib/apt.sh
    deps_install cxx >/dev/null && python_emu_install >/dev/null || exit 1
    cargo build --release --locked -p hsa-sim --quiet
    exec python3 scripts/bench_timing.py --target "${CARGO_TARGET_DIR:-target}/release"
fi

if [ "$mode" = families ]; then
    scripts/llama-cpp.sh build-dl ggml-hsa llama-simple >/dev/null
    eval "$(scripts/llama-cpp.sh env)"
    scripts/models.sh tiny-llama >/dev/null
    . scripts/lib/apt.sh
    deps_install cxx >/dev/null && python_emu_install >/dev/null || exit 1
    cargo build --release --locked -p hsa-sim --quiet
    exec python3 scripts/bench_families.py --bin "$(scripts/llama-cpp.sh path bin-dl)" \
        --target "${CARGO_TARGET_DIR:-target}/release"
fi

# llama-bench and the plugin (the hook build: cargo --release through CMake; llama-bench loads
# the plugin through GGML_BACKEND_PATH), llama-quantize and the test models; a release build of
# the simulator.
scripts/llama-cpp.sh build-dl ggml-hsa llama-bench llama-batched-bench test-backend-ops >/dev/null
scripts/llama-cpp.sh build llama-quantize >/dev/null
eval "$(scripts/llama-cpp.sh env)"
scripts/models.sh tiny-llama >/dev/null
# The emulation's Python packages and g++ (the emulation speed).
. scripts/lib/apt.sh
deps_install cxx >/dev/null && python_emu_install >/dev/null || exit 1
log "release build of hsa-sim"
cargo build --release --locked -p hsa-sim --quiet

cache_root=${GGML_HSA_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ggml-hsa-build}
models=()
if [ "$mode" = emulation ]; then
    exec python3 scripts/bench.py --mode full --emulation-only --kernels "$kernels" \
        --bin "$(scripts/llama-cpp.sh path bin-dl)" --target target/release
elif [ "$mode" = quick ]; then
    for t in f32 q4_0; do models+=("tiny-llama-$t=$(scripts/models.sh path "tiny-llama-$t")"); done
else
    dir=$cache_root/bench-models
    mkdir -p "$dir"
    src=$(scripts/llama-cpp.sh path src)
    f16=$dir/llama-1b-shape-f16.gguf
    key="script=$(sha256sum scripts/models/make_bench_llama.py scripts/models/make_tiny_llama.py |
        cut -c1-16 | paste -sd,) vocab=$(sha256sum "$src/models/ggml-vocab-llama-bpe.gguf" | cut -c1-16)"
    if [ ! -f "$f16" ] || [ "$(cat "$f16.inputs" 2>/dev/null)" != "$key" ]; then
        log "writing $f16 (random weights, ~2.5 GB)"
        "$cache_root/py-venv/bin/python" scripts/models/make_bench_llama.py --gguf-py "$src/gguf-py" \
            --vocab "$src/models/ggml-vocab-llama-bpe.gguf" --out "$f16.tmp"
        mv -f "$f16.tmp" "$f16"
        echo "$key" >"$f16.inputs"
        rm -f "$dir"/llama-1b-shape-q*.gguf
    fi
    for t in $types; do
        out=$dir/llama-1b-shape-$t.gguf
        if [ "$t" != f16 ] && [ ! -f "$out" ]; then
            log "quantizing to $t"
            env -u GGML_BACKEND_PATH "$(scripts/llama-cpp.sh path bin)/llama-quantize" "$f16" \
                "$out.tmp" "${t^^}" >"$out.log" 2>&1 || { tail -n 20 "$out.log" >&2; exit 1; }
            mv -f "$out.tmp" "$out"
        fi
        models+=("llama-1b-shape-$t=$out")
    done
fi
if [ "$mode" = parallel ]; then
    exec python3 scripts/bench_parallel.py --bin "$(scripts/llama-cpp.sh path bin-dl)" \
        --target target/release "${models[@]}"
fi
if [ "$mode" = compiles ]; then
    exec python3 scripts/bench_compiles.py --bin "$(scripts/llama-cpp.sh path bin-dl)" \
        --target target/release "${models[@]}"
fi
exec python3 scripts/bench.py --mode "$mode" --kernels "$kernels" \
    --bin "$(scripts/llama-cpp.sh path bin-dl)" --target target/release "${models[@]}"
