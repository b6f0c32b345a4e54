#!/usr/bin/env bash
# The main job, as far as the project has come: builds the pinned llama.cpp, the plugin and the
# hsa-sim software NPU, then runs ggml's test-backend-ops with the plugin loaded through
# GGML_BACKEND_PATH on HSA0 (an aie2p NPU simulated by hsa-sim), comparing every starter op with
# the CPU backend, and prints the simulator's counters (doorbells, kernels, PDI loads, simulated
# device time). Once the llama.cpp integration lands, this runs a small model with layers on HSA0.
#
# Extra arguments go to test-backend-ops (e.g. `-o ADD` to run one op).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/llama-cpp.sh build ggml-base ggml-cpu test-backend-ops
eval "$(scripts/llama-cpp.sh env)"
cargo build --release --locked --workspace

out=$(mktemp -d)
export GGML_BACKEND_PATH=$PWD/target/release/libggml_hsa.so
export GGML_HSA_LIBHSA_PATH=$PWD/target/release/libhsa_runtime64.so
export GGML_HSA_JIT_COMPILER=$PWD/target/release/hsa-sim-compile
export GGML_HSA_KERNEL_CACHE_DIR=${GGML_HSA_KERNEL_CACHE_DIR:-$out/kernels}
export HSA_SIM_COUNTERS=$out/counters.json

ops=ADD,SUB,MUL,DIV,ABS,SGN,NEG,STEP,TANH,ELU,RELU,SIGMOID,GELU,GELU_QUICK,SILU,HARDSWISH
ops=$ops,HARDSIGMOID,EXP,GELU_ERF,FLOOR,CEIL,ROUND,TRUNC,SQR,SQRT,LOG,SIN,COS,SCALE,CLAMP,CPY,CONT,DUP
[ $# -gt 0 ] || set -- -o "$ops"
echo "== test-backend-ops -b HSA0 $* (plugin $GGML_BACKEND_PATH, NPU: hsa-sim)"
"$LLAMA_CPP_BIN/test-backend-ops" -b HSA0 "$@"
echo "== hsa-sim counters ($HSA_SIM_COUNTERS)"
cat "$HSA_SIM_COUNTERS"
