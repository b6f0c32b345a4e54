#!/usr/bin/env bash
# Regenerates docs/ops.md: which op/type combinations of test-backend-ops run on HSA0 (the plugin
# on the hsa-sim software NPU) and pass against the CPU backend. `support` mode finds the ops
# with any supported case (it checks only each case's final node), then `test` mode runs them
# (checking every node) and its CSV is summarised by scripts/ops_doc.py. Then the ops the IRON
# package declares run again with the IRON designs emulated (`python3 -m ggml_hsa_iron --target
# emu` as the JIT compiler), once per architecture (aie2p, aie2): the doc's "IRON emulated"
# columns, what a real NPU would run. Takes a few minutes, the emulated runs (`--emu`, not yet
# part of CI: tests/backend_ops_emu.rs checks the same cases there) about 15 more per
# architecture; MUL_MAT runs in a process of its own (every loaded kernel stays in the
# simulated NPU's 64 MiB device heap until the process ends).
#
# `--check` (what CI runs) prints the per-op table and fails if any case failed or if the
# committed docs/ops.md is out of date.
set -euo pipefail
check=0
emu=0
for arg in "$@"; do
    case $arg in
    --check) check=1 ;;
    --emu) emu=1 ;;
    *) echo "usage: scripts/gen-ops-doc.sh [--check] [--emu]" >&2; exit 2 ;;
    esac
done
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
# Under packet ABI c (kernels loaded as AIE code objects, what the newest ROCR takes): CI's only
# sweep of every op; the other packet ABIs run the starter and model ops
# (tests/backend_ops_sim.rs). Two processes at once sharing one kernel cache, FLASH_ATTN_EXT
# (about 40% of the cases) in one and the other ops in the other; not test-backend-ops' -j,
# whose workers print CSV rows field by field into one stdout, interleaved.
fa_ops=$(echo "$ops" | tr ',' '\n' | grep -x 'FLASH_ATTN_EXT' | paste -sd, || true)
rest_ops=$(echo "$ops" | tr ',' '\n' | grep -vx 'FLASH_ATTN_EXT' | paste -sd,)
# A failing case makes test-backend-ops exit 1: the table below shows it, --check fails on it.
sweep() { # ops, CSV file
    HSA_SIM_PACKET_ABI=c GGML_HSA_PACKET_ABI=c \
        "$LLAMA_CPP_BIN/test-backend-ops" test -b HSA0 -o "$1" --output csv 2>/dev/null >"$2" || true
}
sweep "$rest_ops" "$csv" &
sweep_pid=$!
if [ -n "$fa_ops" ]; then
    sweep "$fa_ops" "$csv.fa"
fi
wait "$sweep_pid"
if [ -s "$csv.fa" ]; then tail -n +2 "$csv.fa" >>"$csv"; fi
rm -f "$csv.fa"

# The IRON designs, emulated: the same cases with the IRON package as the compiler.
. scripts/lib/apt.sh
python_emu_install >/dev/null || exit 1
iron_ops=$(PYTHONPATH=$PWD/src python3 -m ggml_hsa_iron --target emu capabilities |
    python3 -c 'import json, sys; print(",".join(o["op"] for o in json.load(sys.stdin)["ops"]))')
other_ops=$(echo "$iron_ops" | tr ',' '\n' | grep -vx MUL_MAT | paste -sd,)
emu_args=()
emu_status=""
for arch in aie2p aie2; do
    [ "$emu" -eq 1 ] || break
    emu_csv=$(mktemp)
    emu_log=$(mktemp)
    for ops_set in MUL_MAT "$other_ops"; do
        GGML_HSA_JIT_COMPILER="python3 -m ggml_hsa_iron --target emu" PYTHONPATH=$PWD/src \
            GGML_HSA_EMU_CACHE_DIR=${GGML_HSA_EMU_CACHE_DIR:-${TMPDIR:-/tmp}/ggml-hsa-emu-ops-doc} \
            GGML_HSA_KERNEL_CACHE_DIR=$(mktemp -d) HSA_SIM_AGENTS=$arch \
            "$LLAMA_CPP_BIN/test-backend-ops" test -b HSA0 -o "$ops_set" --output csv \
            2>>"$emu_log" >"$emu_csv.part" || emu_status="$emu_status $arch"
        # One CSV header.
        if [ -s "$emu_csv" ]; then tail -n +2 "$emu_csv.part" >>"$emu_csv"; else cat "$emu_csv.part" >"$emu_csv"; fi
    done
    rm -f "$emu_csv.part"
    emu_args+=(--emu "$arch=$emu_csv,$emu_log")
done

out=$(mktemp)
python3 scripts/ops_doc.py "${emu_args[@]}" <"$csv" >"$out"
rm -f "$csv"
doc=docs/ops.md
[ "$emu" -eq 1 ] && doc=docs/ops-iron.md
if [ "$check" -eq 0 ]; then
    mv "$out" "$doc"
    echo "wrote $doc"
    exit 0
fi
cat "$out"
status=0
if ! grep -q ' 0 failed;' "$out" || grep -q 'IRON emulated on .*[1-9][0-9]* failed' "$out"; then
    echo "FAILED: some test-backend-ops cases failed on HSA0 (table above)"
    status=1
fi
if ! diff -u "$doc" "$out" >/dev/null; then
    diff -u "$doc" "$out" | head -40
    echo "FAILED: $doc is out of date: run scripts/gen-ops-doc.sh and commit it"
    status=1
fi
if [ -n "$emu_status" ]; then
    echo "FAILED: test-backend-ops with the IRON designs emulated failed on:$emu_status"
    status=1
fi
rm -f "$out"
exit $status
