#!/usr/bin/env bash
# The main job, as far as the project has come: builds the pinned llama.cpp and the plugin, then
# runs ggml's test-backend-ops with the plugin loaded through GGML_BACKEND_PATH, asking for HSA0.
#
# Today no device is exposed yet (device support and the hsa-sim software NPU are in progress), so
# the run shows the plugin loading, stating in one line why it has no device, and ggml carrying on
# with the CPU. Once llama.cpp integration lands this runs a small model with layers on HSA0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/llama-cpp.sh build ggml-base ggml-cpu test-backend-ops
eval "$(scripts/llama-cpp.sh env)"
cargo build --release --locked -p ggml-hsa
plugin=$PWD/target/release/libggml_hsa.so

echo "== test-backend-ops -b HSA0 -o ADD with GGML_BACKEND_PATH=$plugin"
GGML_BACKEND_PATH=$plugin "$LLAMA_CPP_BIN/test-backend-ops" -b HSA0 -o ADD "$@"
