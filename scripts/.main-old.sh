#!/usr/bin/env bash
# The main job: llama.cpp running real models with their supported ops on HSA0, an aie2p NPU
# simulated by hsa-sim (no NPU needed). On a fresh machine it fetches and builds everything:
#   1. the pinned llama.cpp, built with ggml-hsa through the CMake hook (GGML_BACKEND_DL=ON);
#   2. the hsa-sim software NPU (its HSA runtime and kernel compiler);
#   3. the models (scripts/models.sh): the tiny llama and all-MiniLM-L6-v2;
# then runs
#   * llama-simple on the tiny llama (greedy), once on the CPU alone and once with HSA0, and
#     prints both texts and where the scheduler put the nodes (GGML_SCHED_DEBUG=2); on HSA0 the
#     kernels are the IRON designs of src/ggml_hsa_iron, emulated (`python3 -m ggml_hsa_iron
#     --target emu` as the JIT compiler: the package's own capabilities, its AIE core kernels
#     built for the host, hsa-sim running the recorded dataflow); it prints which ops ran as
#     emulated IRON kernels (MAIN_LLAMA_COMPILER=reference: hsa-sim's reference executor instead);
#   * llama-embedding on all-MiniLM-L6-v2 on HSA0: the sentence similarity matrix, with the
#     published figures next to it;
#   * the simulator's counters (doorbells, kernels, PDI loads, simulated device time).
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

scripts/llama-cpp.sh build-dl ggml-hsa llama-simple llama-embedding test-backend-ops
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

say "tiny llama ($llama) on the CPU alone"
cpu_text=$("$bin/llama-simple" -m "$llama" -n 24 "$prompt" 2>/dev/null)
echo "$cpu_text"

if [ ${#emu_env[@]} -gt 0 ]; then
    say "tiny llama on HSA0 (plugin $plugin, NPU: hsa-sim running the IRON designs, emulated)"
else
    say "tiny llama on HSA0 (plugin $plugin, NPU: hsa-sim's reference executor)"
fi
t0=$(date +%s.%N)
npu_text=$(env "${emu_env[@]}" GGML_BACKEND_PATH="$plugin" GGML_SCHED_DEBUG=2 \
    HSA_SIM_COUNTERS="$out/counters-llama.json" \
    "$bin/llama-simple" -m "$llama" -n 24 "$prompt" 2>"$out/llama.log")
t1=$(date +%s.%N)
echo "$npu_text"
if [ "$npu_text" = "$cpu_text" ]; then
    echo "(identical to the CPU's text)"
else
    echo "(differs from the CPU's text)"
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

say "hsa-sim counters of the tiny llama run"
cat "$out/counters-llama.json"
say "hsa-sim counters of the MiniLM run"
cat "$out/counters-minilm.json"
echo
echo "logs: $out"
