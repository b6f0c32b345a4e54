#!/usr/bin/env bash
# Regenerates docs/ops.md: which op/type combinations of test-backend-ops run on HSA0 (the plugin
# on the hsa-sim software NPU) and pass against the CPU backend. `support` mode finds the ops
# with any supported case (it checks only each case's final node), then `test` mode runs them
# (checking every node) and its CSV is summarised by scripts/ops_doc.py. Takes a few minutes.
#
# `--check` (what CI runs) prints the per-op table and fails if any case failed or if the
# committed docs/ops.md is out of date.
set -euo pipefail
check=0
[ "${1:-}" = "--check" ] && check=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/llama-cpp.sh build ggml-base ggml-cpu test-backend-ops >/dev/null
eval "$(scripts/llama-cpp.sh env)"
cargo build --locked --workspace --quiet
export GGML_BACKEND_PATH=$PWD/target/debug/libggml_hsa.so
export GGML_HSA_LIBHSA_PATH=$PWD/target/debug/libhsa_runtime64.so
export GGML_HSA_JIT_COMPILER=$PWD/target/debug/hsa-sim-compile
export GGML_HSA_ENABLE_LOG=0
export GGML_HSA_KERNEL_CACHE_DIR=${GGML_HSA_KERNEL_CACHE_DIR:-$(mktemp -d)}
csv=$(mktemp)
"$LLAMA_CPP_BIN/test-backend-ops" support -b HSA0 --output csv 2>/dev/null >"$csv"
ops=$(python3 scripts/ops_doc.py --ops-only <"$csv")
"$LLAMA_CPP_BIN/test-backend-ops" test -b HSA0 -o "$ops" --output csv 2>/dev/null >"$csv"
out=$(mktemp)
python3 scripts/ops_doc.py <"$csv" >"$out"
rm -f "$csv"
if [ "$check" -eq 0 ]; then
    mv "$out" docs/ops.md
    echo "wrote docs/ops.md"
    exit 0
fi
cat "$out"
status=0
if ! grep -q ' 0 failed;' "$out"; then
    echo "FAILED: some test-backend-ops cases failed on HSA0 (table above)"
    status=1
fi
if ! diff -u docs/ops.md "$out" >/dev/null; then
    diff -u docs/ops.md "$out" | head -40
    echo "FAILED: docs/ops.md is out of date: run scripts/gen-ops-doc.sh and commit it"
    status=1
fi
rm -f "$out"
exit $status
