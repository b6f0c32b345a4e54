#!/usr/bin/env bash
# Regenerates include/ggml-hsa.h from src/ffi/exports.rs with cbindgen (the same generation the
# drift test in tests/header.rs checks).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GGML_HSA_BLESS_HEADER=1 cargo test --locked -p ggml-hsa --test header -- --quiet header_matches_the_rust_exports
git --no-pager diff --stat -- include/ggml-hsa.h || true
