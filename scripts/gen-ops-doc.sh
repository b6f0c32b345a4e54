#!/usr/bin/env bash
# Regenerates docs/ops.md: which op/type combinations of test-backend-ops run on HSA0 (the plugin
# on the hsa-sim software NPU) and pass against the CPU backend: every case of every op HSA0 takes,
# run by tests/backend_ops_sim.rs (`every_op_under_packet_abi_c`), its CSV summarised by
# scripts/ops_doc.py. Takes about 15 min.
#
# The "IRON emulated" columns (what a real NPU would run) come from docs/ops-emulated.json, the
# record of the last `--emu` run: the ops the IRON package declares, run again with the IRON
# designs emulated (`python3 -m ggml_hsa_iron --target emu` as the JIT compiler), once per
# architecture (aie2p, aie2). That takes about 40 more minutes, so CI does not repeat it:
# tests/backend_ops_emu.rs runs a sample of the same cases on every CI run, all of them under
# scripts/test.sh --long.
#
# `--emu-ops OPS` (comma-separated) runs only those ops emulated and updates their entries of
# the record, for a change to some designs; then run the script without it for docs/ops.md.
#
# `--check` prints the per-op table and fails if any case failed (in this run or in the emulated
# record), if an op the IRON package declares has no emulated record, or if the committed
# docs/ops.md is out of date.
#
# The sweep is tests/backend_ops_sim.rs `every_op_under_packet_abi_c`, run whole by this script.
# `--check --sweep CSV` (what scripts/test.sh runs) reads the one cargo test just ran instead:
# that test writes it, with the sample it covers next to it (CSV's name with .sample for .csv).
# A whole sweep (`all`, under scripts/test.sh --long) is checked as above; a sample (CI's turn
# of the rotation) is checked against the table: nothing failed, and per op no more cases ran or
# were declined than the table counts, no element type it does not list.
set -euo pipefail
check=0
emu=0
emu_only=""
sweep_csv=""
usage() { echo "usage: scripts/gen-ops-doc.sh [--check [--sweep CSV]] [--emu | --emu-ops OPS]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --check) check=1 ;;
    --sweep) [ $# -ge 2 ] || usage; sweep_csv=$2; shift ;;
    --emu) emu=1 ;;
    --emu-ops) [ $# -ge 2 ] || usage; emu=1; emu_only=$2; shift ;;
    *) usage ;;
    esac
    shift
done
[ -z "$sweep_csv" ] || [ "$check" -eq 1 ] || usage
[ -z "$sweep_csv" ] || [ "$emu" -eq 0 ] || usage
cd "$(dirname "${BASH_SOURCE[0]}")/.."

eval "$(scripts/llama-cpp.sh env)"
# A sweep cargo test already ran needs no build: a plain `cargo build` would resolve features
# without the dev-dependencies and compile most dependencies a second time.
if [ -z "$sweep_csv" ]; then
    scripts/llama-cpp.sh build ggml-base ggml-cpu test-backend-ops >/dev/null
    cargo build --locked --workspace --quiet
fi
debug=$(realpath "${CARGO_TARGET_DIR:-target}")/debug
export GGML_BACKEND_PATH=$debug/libggml_hsa.so
export GGML_HSA_LIBHSA_PATH=$debug/libhsa_runtime64.so
export GGML_HSA_JIT_COMPILER=$debug/hsa-sim-compile
export GGML_HSA_ENABLE_LOG=0
export GGML_HSA_KERNEL_CACHE_DIR=${GGML_HSA_KERNEL_CACHE_DIR:-$(mktemp -d)}
# The IRON designs, emulated (`--emu`): the same cases with the IRON package as the compiler,
# per architecture, recorded in docs/ops-emulated.json (the "IRON emulated" columns). Without
# `--emu` the columns come from that record; the check fails if an op the IRON package declares
# has no recorded run.
. scripts/lib/apt.sh
python_emu_install >/dev/null || exit 1
iron_ops=$(PYTHONPATH=$PWD/src python3 -m ggml_hsa_iron --target emu capabilities |
    python3 -c 'import json, sys; print(",".join(o["op"] for o in json.load(sys.stdin)["ops"]))')
emu_args=()
emu_status=""
if [ "$emu" -eq 1 ]; then
    # FLASH_ATTN_EXT's thousands of cases through the emulation would take hours: the sample
    # tests/backend_ops_emu.rs runs too (every option, type and head grouping).
    fa_sample=$(cat scripts/lib/flash-attn-emu-sample.txt)
    # The commit the runs build, taken now: the record must not name a later one.
    emu_commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src crates || echo +changes)"
    # The compiles are forks of one compile server (src/ggml_hsa_iron/compile_server.py), which
    # has imported numpy and the package once; it goes when this script does.
    server_dir=$(mktemp -d)
    PYTHONPATH=$PWD/src python3 -m ggml_hsa_iron.compile_server --socket "$server_dir/sock" &
    server_pid=$!
    trap 'kill "$server_pid" 2>/dev/null; rm -rf "$server_dir"' EXIT
    emu_emit() { # arch, ops, CSV, log, extra test-backend-ops args...
        local arch=$1 ops=$2 out_csv=$3 log=$4
        shift 4
        # Several names as one anchored regex (^ADD$|^MUL$): test-backend-ops compiles a regex
        # per case for every plain name that is not the case's op (minutes over 90 names).
        case "$ops" in *,*) ops=$(echo "$ops" | sed 's/[^,]*/^&$/g; s/,/|/g') ;; esac
        GGML_HSA_JIT_COMPILER="python3 -m ggml_hsa_iron --target emu" PYTHONPATH=$PWD/src \
            GGML_HSA_EMU_SERVER=$server_dir/sock \
            GGML_HSA_EMU_CACHE_DIR=${GGML_HSA_EMU_CACHE_DIR:-$(realpath "${CARGO_TARGET_DIR:-target}")/tmp/ggml-hsa-emu-cache} \
            GGML_HSA_KERNEL_CACHE_DIR=$(mktemp -d) HSA_SIM_AGENTS=$arch \
            "$LLAMA_CPP_BIN/test-backend-ops" test -b HSA0 -o "$ops" --output csv "$@" \
            2>>"$log" >"$out_csv.part" || emu_status="$emu_status $arch:$ops"
        # One CSV header.
        if [ -s "$out_csv" ]; then tail -n +2 "$out_csv.part" >>"$out_csv"; else cat "$out_csv.part" >"$out_csv"; fi
        rm -f "$out_csv.part"
    }
    run_ops=$iron_ops
    if [ -n "$emu_only" ]; then
        for op in ${emu_only//,/ }; do
            echo ",$iron_ops," | grep -q ",$op," || { echo "$op: the IRON package does not declare it" >&2; exit 2; }
        done
        run_ops=$emu_only
    fi
    has() { echo ",$run_ops," | grep -q ",$1,"; }
    other_ops=$(echo "$run_ops" | tr ',' '\n' | grep -vx 'MUL_MAT\|FLASH_ATTN_EXT' | paste -sd,)
    for arch in aie2p aie2; do
        emu_csv=$(mktemp)
        emu_log=$(mktemp)
        # MUL_MAT in a process of its own: every loaded kernel stays in the simulated NPU's
        # 64 MiB device heap until the process ends.
        if has MUL_MAT; then emu_emit "$arch" MUL_MAT "$emu_csv" "$emu_log"; fi
        if has FLASH_ATTN_EXT; then
            emu_emit "$arch" FLASH_ATTN_EXT "$emu_csv" "$emu_log" -p "$fa_sample"
        fi
        if [ -n "$other_ops" ]; then emu_emit "$arch" "$other_ops" "$emu_csv" "$emu_log"; fi
        emu_args+=(--emu "$arch=$emu_csv,$emu_log")
    done
    python3 scripts/ops_doc.py --record docs/ops-emulated.json --ops "$run_ops" \
        --sampled "FLASH_ATTN_EXT=$fa_sample" \
        --commit "$emu_commit" \
        "${emu_args[@]}" </dev/null
    if [ -n "$emu_only" ]; then
        echo "updated docs/ops-emulated.json ($emu_only); scripts/gen-ops-doc.sh writes docs/ops.md"
        [ -z "$emu_status" ] || { echo "FAILED: emulated test-backend-ops failed on:$emu_status"; exit 1; }
        exit 0
    fi
fi

# The sweep of every op with the reference executors, under packet ABI c: the one
# tests/backend_ops_sim.rs runs (`every_op_under_packet_abi_c`), whole unless --sweep names a
# sample cargo test already ran. It writes its CSV even when cases fail (the table shows them).
if [ -z "$sweep_csv" ]; then
    GGML_HSA_TEST_SAMPLE=all cargo test --locked --quiet --test backend_ops_sim \
        every_op_under_packet_abi_c -- --exact --nocapture >&2 || true
    sweep_csv=$(realpath "${CARGO_TARGET_DIR:-target}")/tmp/ops-sweep.csv
fi
sample=$(cat "${sweep_csv%.csv}.sample" 2>/dev/null) ||
    { echo "FAILED: no sweep at $sweep_csv (cargo test --test backend_ops_sim writes it)"; exit 1; }
csv=$(mktemp)
cp "$sweep_csv" "$csv"
if [ "$sample" != all ]; then
    echo "docs/ops.md against turn $sample of the rotation of cases (cargo test's sweep):"
    status=0
    python3 scripts/ops_doc.py --against docs/ops.md <"$csv" || status=1
    # The emulated record still covers every op the IRON package declares.
    python3 scripts/ops_doc.py --emulated docs/ops-emulated.json --iron-ops "$iron_ops" \
        <"$csv" >/dev/null || status=1
    rm -f "$csv"
    [ "$status" -eq 0 ] || echo "FAILED: the sample disagrees with docs/ops.md (above)"
    exit $status
fi

out=$(mktemp)
python3 scripts/ops_doc.py --emulated docs/ops-emulated.json --iron-ops "$iron_ops" <"$csv" >"$out"
rm -f "$csv"
doc=docs/ops.md
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
