#!/usr/bin/env bash
# Fetches the crate's dependencies (Cargo.lock) into cargo's cache, so that builds through the
# CMake shim, which run `cargo build --offline --locked`, never touch the network.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cargo >/dev/null || { echo "fetch-deps.sh: cargo not found (install Rust: https://rustup.rs)" >&2; exit 1; }
cargo fetch --locked
echo "fetch-deps.sh: dependencies of $(pwd)/Cargo.lock are in cargo's cache"
