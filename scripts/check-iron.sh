#!/usr/bin/env bash
# Checks the IRON kernel package (src/ggml_hsa_iron) without mlir-aie:
# ruff lint and format, byte-compilation, the unit tests (request parsing,
# capabilities against the designs and the backend's op names, tiling, the
# CLI's error path without IRON, the IRON v1.4.4 API name check of the
# designs, the AIE core functions run on the host with g++ against an
# AIE API stand-in, and the emulation target's stand-ins and validation).
# Exits non-zero on any failure.
#
#   scripts/check-iron.sh          install what is missing, run the checks
#   scripts/check-iron.sh --deps   install what is missing (g++, pip, the pinned ruff, numpy,
#                                  ml_dtypes), nothing else
set -euo pipefail
cd "$(dirname "$0")/.."
PKG=src/ggml_hsa_iron
# shellcheck source=lib/apt.sh
. scripts/lib/apt.sh

deps_install cxx || exit 1
python_pip_install || exit 1

# ruff is pinned so lint and format results do not change under us.
RUFF=ruff==0.17.6
if [ "$(python3 -m ruff --version 2>/dev/null)" != "ruff ${RUFF#ruff==}" ]; then
  python3 -m pip install --quiet "$RUFF" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "$RUFF"
fi
# numpy and ml_dtypes: the designs' tensor types, for the emulation target (--target emu) and
# its tests here and in cargo test (crates/hsa-sim/tests/iron_emu.rs, tests/backend_ops_emu.rs).
python_emu_install || exit 1
[ "${1:-}" = "--deps" ] && exit 0

# The emulated cores' libraries go to the cache cargo test's emulated tests use too
# (tests/common/mod.rs, emu_cache_dir): each is built once per content.
export GGML_HSA_EMU_CACHE_DIR=${GGML_HSA_EMU_CACHE_DIR:-$(realpath -m "${CARGO_TARGET_DIR:-target}")/tmp/ggml-hsa-emu-cache}
status=0
step() {
  echo "== $*"
  "$@" || { echo "FAILED: $*"; status=1; }
}
step python3 -m ruff check --config "$PKG/ruff.toml" "$PKG"
step python3 -m ruff format --check --config "$PKG/ruff.toml" "$PKG"
step python3 -m compileall -q "$PKG"
# The test modules one process each, as many at once as there are cores (most of their time is
# g++ building the emulated cores, one compiler at a time per module), the largest files first:
# they are the slowest modules, and started last one of them would run alone at the end. A
# failing module's whole output is printed, the others' one summary line each.
unit_tests() {
  ls -S "$PKG"/tests/test_*.py | PKG=$PKG xargs -P "$(nproc)" -n 1 sh -c '
    m=$(basename "$1" .py)
    if out=$(python3 -m unittest discover -s "$PKG/tests" -p "$m.py" 2>&1); then
      echo "$m: $(echo "$out" | grep -E "^Ran ")"
    else
      printf "%s\n" "$out"
      echo "FAILED: $m"
      exit 1
    fi' sh
}
step unit_tests
exit $status
