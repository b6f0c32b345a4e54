#!/usr/bin/env bash
# Runs every check of the project, on a fresh machine too: installs what is missing (system
# packages, rustfmt/clippy, the pinned llama.cpp built by scripts/llama-cpp.sh), then runs
#   rustfmt --check, clippy -D warnings (in the test build), cargo test (unit, ABI, header drift,
#   C/C++ header check, test-backend-ops runs against the plugin), and a release build with its
#   link check.
# Ends with one line `N passed, N failed` over all suites; exits non-zero if anything failed.
# `--long` runs every case of the sampled sweeps (GGML_HSA_TEST_SAMPLE=all; a default run takes a
# turn of a rotation, docs/testing.md) and adds the reliability checks at full size, with their
# figures printed: the parser property tests at 20,000 cases each, the soak at 10,000 decode
# graphs, test-backend-ops and the tiny llama on HSA0 under valgrind memcheck, and the RPC
# figures (tokens/s and bytes per token for a local, one remote and two remote HSA0s).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '\n[test] %s\n' "$*"; }
passed=0
failed=0
failures=()

# shellcheck source=lib/apt.sh
. scripts/lib/apt.sh

# Each step's duration, printed with the summary: what to cut when CI gets slow.
durations=()
step_timed() {
    local name=$1 start=$SECONDS status
    shift
    "$@"
    status=$?
    durations+=("$(printf '%6d s  %s' $((SECONDS - start)) "$name")")
    return $status
}

# A check that counts as one case.
check() {
    local name=$1
    shift
    log "$name: $*"
    if step_timed "$name" "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failures+=("$name")
    fi
}

# --- setup: everything a fresh machine lacks ---------------------------------------------------
# Each step's own probe installs what that step runs (scripts/lib/apt.sh: package names, or the
# exact program). `scripts/test.sh --deps` runs only these and exits.
install_deps() {
    # Debian's ROCm runtime: a real libhsa-runtime64 without any device (the zero-device test), and
    # its headers (the check of src/hsa/sys.rs against them).
    deps_install rocr memcheck &&
        # rustfmt and clippy: the exact commands the checks run.
        { cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt; } &&
        # clippy: the driver the linted build runs (`linted` below).
        { [ -x "$(rustc --print sysroot)/bin/clippy-driver" ] || rustup component add clippy; } &&
        scripts/llama-cpp.sh deps &&
        scripts/models.sh deps &&
        scripts/check-iron.sh --deps
}
# The long sweeps (test-backend-ops through the emulation and the reference executors,
# test-llama-archs) take one turn of a rotation chosen by the commit in a default run, every case
# under --long (tests/common/sample.rs).
[ "${1:-}" = "--long" ] && export GGML_HSA_TEST_SAMPLE=all
if [ "${1:-}" = "--deps" ]; then
    install_deps
    exit
fi
step_timed "setup: system packages, cargo components, Python packages" install_deps ||
    { echo "0 passed, 1 failed"; exit 1; }
# Every relative link and #anchor of README.md and docs/*.md resolves (cheap: first).
check "docs: links and anchors (scripts/check_links.py)" python3 scripts/check_links.py
export GGML_HSA_REQUIRE_ROCR=1
step_timed "llama.cpp: ggml-base ggml-cpu test-backend-ops" \
    scripts/llama-cpp.sh build ggml-base ggml-cpu test-backend-ops ||
    { echo "0 passed, 1 failed"; exit 1; }
eval "$(scripts/llama-cpp.sh env)"
# llama.cpp end to end (tests/llama_e2e.rs): the pinned tree built with the backend both ways
# docs/building.md documents (the CMake hook, DL; the integration helper, in-tree static), and the
# models.
# Both with ggml's RPC backend and ggml-rpc-server (tests/rpc_e2e.rs: HSA0 served to clients on
# other "machines"); the hook build's test-backend-ops tests the RPC device backed by HSA0.
check "llama.cpp + ggml-hsa through the CMake hook (GGML_BACKEND_DL=ON, GGML_RPC=ON)" \
    scripts/llama-cpp.sh build-dl ggml-hsa llama-simple llama-embedding llama-parallel \
    llama-speculative llama-server ggml-rpc ggml-rpc-server test-backend-ops
check "llama.cpp + ggml-hsa in-tree via cmake/integrate.sh (GGML_BACKEND_DL=OFF, static, GGML_RPC=ON)" \
    scripts/llama-cpp.sh build-static llama-simple ggml-rpc-server test-llama-archs
check "models (scripts/models.sh)" scripts/models.sh
export GGML_HSA_REQUIRE_E2E=1

# --- checks ----------------------------------------------------------------------------------
check rustfmt cargo fmt --all --check
# clippy-driver compiles the workspace's own crates (RUSTC_WORKSPACE_WRAPPER, what `cargo clippy`
# sets for its check): the build the tests run is linted in the same pass, where a separate
# `cargo clippy` would check every crate and rebuild every proc macro again (about 4 minutes on a
# fresh machine). Every cargo command below runs through `linted` so that none rebuilds what
# another built. The build is of the tests' targets: a plain `cargo build` resolves the
# dependencies' features without the dev-dependencies (resolver 2) and would compile a second
# copy of most of them.
linted=(env "RUSTC_WORKSPACE_WRAPPER=$(rustc --print sysroot)/bin/clippy-driver")
build_and_clippy() {
    local out status
    out=$(mktemp)
    "${linted[@]}" cargo test --workspace --all-targets --locked --no-run 2>&1 | tee "$out"
    status=${PIPESTATUS[0]}
    # -D warnings: any warning of rustc, clippy or cargo fails the step (cargo replays the
    # warnings of crates it does not rebuild).
    if grep -qE '^(warning|error)(\[|:)' "$out"; then
        echo "clippy: the warnings above fail the build (-D warnings)"
        status=1
    fi
    rm -f "$out"
    return "$status"
}
check "build and clippy -D warnings (workspace, all targets)" build_and_clippy

log "cargo test --workspace --locked --no-fail-fast"
test_log=$(mktemp)
test_start=$SECONDS
"${linted[@]}" cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$test_log"
test_status=${PIPESTATUS[0]}
durations+=("$(printf '%6d s  %s' $((SECONDS - test_start)) "cargo test (per binary: its 'finished in')")")
read -r t_passed t_failed < <(awk '/^test result:/ {
        for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
    } END { print p + 0, f + 0 }' "$test_log")
passed=$((passed + t_passed))
failed=$((failed + t_failed))
if [ "$test_status" -ne 0 ] && [ "$t_failed" -eq 0 ]; then
    # cargo failed before or outside a test (a build error): count it.
    failed=$((failed + 1))
    failures+=("cargo test (exit $test_status)")
elif [ "$t_failed" -ne 0 ]; then
    failures+=("cargo test: $(grep -E '^test .* FAILED$' "$test_log" | sed 's/^test //; s/ \.\.\. FAILED$//' | paste -sd, -)")
fi
rm -f "$test_log"

if [ "${1:-}" = "--long" ]; then
    check "parser properties, 20,000 cases each (long)" env PROPTEST_CASES=20000 \
        "${linted[@]}" cargo test --locked --test fuzz_parsers -- --nocapture
    check "hsa-sim reader properties, 20,000 cases each (long)" env PROPTEST_CASES=20000 \
        "${linted[@]}" cargo test --locked -p hsa-sim --test fuzz_readers -- --nocapture
    check "soak: 10,000 decode graphs of the tiny llama (long)" env GGML_HSA_SOAK_GRAPHS=10000 \
        "${linted[@]}" cargo test --locked --test soak_sim -- --nocapture
    check "test-backend-ops and the tiny llama on HSA0 under valgrind memcheck (long)" \
        env GGML_HSA_MEMCHECK=1 "${linted[@]}" cargo test --locked --test memcheck_sim -- --nocapture
    check "RPC figures: local vs one vs two remote HSA0s (long)" \
        "${linted[@]}" cargo test --locked --test rpc_e2e figures_local_vs_one_remote_vs_two_remote -- \
        --ignored --nocapture
fi

# llama.cpp's test-llama-archs on HSA0 through the IRON emulation (tests/llama_archs.rs): every
# family with a fused path and a rotating eighth of the other architectures; all of them with
# --long. Its per-architecture table is printed.
check "test-llama-archs on HSA0, IRON designs emulated" \
    "${linted[@]}" cargo test --locked --test llama_archs -- --ignored --nocapture

# docs/ops.md against the sweep of every op cargo test just ran (tests/backend_ops_sim.rs): no
# failures, the table current (exactly under --long, where the sweep is whole).
check "ops on HSA0 (per-op counts, docs/ops.md)" scripts/gen-ops-doc.sh --check \
    --sweep "$(realpath "${CARGO_TARGET_DIR:-target}")/tmp/ops-sweep.csv"

# The benchmark's quick form (tiny llamas on the CPU and HSA0): the figures print, nothing fails.
check "benchmark (scripts/bench.sh --quick)" scripts/bench.sh --quick

# The IRON kernel package (Python): ruff, byte-compilation, unit tests, the IRON API check.
check "IRON package checks" scripts/check-iron.sh

# The older ggml release (docs/building.md): its tree fetched and built by
# scripts/llama-cpp.sh with the older pin (ggml, and test-backend-ops compiled against it alone:
# `build-ggml`), the plugin built against it, then the starter ops on HSA0 with that tree's test-backend-ops, and
# each release's plugin loaded into the other release: declined in one line. After every other
# debug-build step: the plugin is rebuilt in place in target/debug/deps (only the ggml-hsa crate
# depends on the ggml tree, so only it and the two test programs build again; a target dir of
# its own would build every dependency a second time), the pinned release's plugin kept aside
# first for the cross-release check.
older_ggml_release() {
    local pin=scripts/llama-cpp-older.pin
    LLAMA_CPP_PIN=$pin scripts/llama-cpp.sh build-ggml || return 1
    local pinned_bin=$LLAMA_CPP_BIN keep
    keep=$(mktemp -d) || return 1
    cp target/debug/deps/libggml_hsa.so "$keep/" || return 1
    (
        eval "$(LLAMA_CPP_PIN=$pin scripts/llama-cpp.sh env)"
        "${linted[@]}" cargo test --locked --test backend_ops_sim starter_ops_on_aie2p_with_packet_abi_a1 \
            -- --exact --nocapture &&
            GGML_HSA_OTHER_GGML_BIN=$pinned_bin GGML_HSA_OTHER_PLUGIN=$keep/libggml_hsa.so \
                "${linted[@]}" cargo test --locked --test ggml_releases -- --ignored --nocapture
    )
    local status=$?
    rm -rf "$keep"
    return $status
}
check "the older ggml release: build, starter ops on HSA0, cross-release loads declined" \
    older_ggml_release

# The release build that ships: the plugin the CMake hook built (cargo --release) above, not a
# second release build of every dependency in target/release.
release_links_ggml_base() {
    readelf -d "$(scripts/llama-cpp.sh path bin-dl)/libggml-hsa.so" |
        grep -q 'NEEDED.*\[libggml-base\.so\.0\]'
}
check "release build (the CMake hook's) links libggml-base.so.0" release_links_ggml_base

# --- summary ---------------------------------------------------------------------------------
echo
printf '%s\n' "durations:" "${durations[@]}" "$(printf '%6d s  in all' "$SECONDS")"
echo
[ ${#failures[@]} -eq 0 ] || printf 'failed: %s\n' "${failures[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
