#!/usr/bin/env bash
# Fetch, verify, unpack and build the pinned upstream llama.cpp (ggml) that this project plugs into.
#
#   scripts/llama-cpp.sh fetch               download the sdist, check its sha256, unpack it
#   scripts/llama-cpp.sh build [TARGET...]   fetch, configure once, build only TARGETs
#                                            (default: ggml-base ggml-cpu test-backend-ops), in
#                                            build/: configured with ggml-hsa's CMake hook
#                                            (GGML_BACKEND_DL=ON), so one tree serves both
#   scripts/llama-cpp.sh build-ggml          the same tree, only ggml (base, CPU) and
#                                            test-backend-ops compiled against ggml alone: its
#                                            source includes no llama.cpp header, and CMake's
#                                            target would build libllama and common first
#   scripts/llama-cpp.sh build-dl [TARGET...]      the same tree, default targets ggml-hsa (the
#                                            plugin built through the hook) and llama's programs
#   scripts/llama-cpp.sh build-static [TARGET...]  a copy of the tree prepared by
#                                            cmake/integrate.sh, built with -DGGML_HSA=ON and
#                                            GGML_BACKEND_DL=OFF (static), in build-static/;
#                                            its test-llama-archs finds HSA0 (no plugin to load)
#                                            Both have ggml's RPC backend (GGML_RPC=ON) and its
#                                            server, target ggml-rpc-server; build/ also has
#                                            llama-server (LLAMA_BUILD_SERVER=ON).
#   scripts/llama-cpp.sh deps                install the system packages the builds need, nothing else
#   scripts/llama-cpp.sh env                 print `export` lines for the build script and the tests
#   scripts/llama-cpp.sh path [src|ggml|build|bin]
#
# LLAMA_CPP_PIN=<file> selects another pin (default scripts/llama-cpp.pin; the older release the
# plugin is also tested against is scripts/llama-cpp-older.pin). A relative path is taken from the
# repository root.
#
# Everything lives outside the repository, keyed by the pinned version:
#   ${GGML_HSA_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ggml-hsa-build}/llama-cpp-python-<version>/
#     sdist.tar.gz   src/ (= vendor/llama.cpp)   build/ (CMake/Ninja tree with the hook; binaries
#     in build/bin)   src-static/ + build-static/ (in-tree, static)
# It works from an empty cache and installs its own system dependencies when they are missing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pin=${LLAMA_CPP_PIN:-$here/llama-cpp.pin}
case "$pin" in /*) ;; *) pin=$here/../$pin ;; esac
[ -f "$pin" ] || { printf '[llama-cpp] error: no pin file %s\n' "$pin" >&2; exit 1; }
# shellcheck source=/dev/null
. <(grep -E '^[A-Z0-9_]+=' "$pin")
version=$LLAMA_CPP_PYTHON_VERSION
sha256=$LLAMA_CPP_PYTHON_SHA256

cache_root=${GGML_HSA_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ggml-hsa-build}
root=$cache_root/llama-cpp-python-$version
src=$root/src
build=$root/build

log() { printf '[llama-cpp] %s\n' "$*" >&2; }
# shellcheck source=lib/apt.sh
. "$here/lib/apt.sh"
die() { printf '[llama-cpp] error: %s\n' "$*" >&2; exit 1; }

# What the next steps run: the build tools (package names, scripts/lib/apt.sh) and pip (`fetch`
# downloads the sdist with `python3 -m pip`).
ensure_tools() {
    deps_install build || die "cannot install the build tools ($(deps_packages build | paste -sd' '))"
    python_pip_install || die "cannot install python3-pip"
}

fetch() {
    if [ -f "$src/.complete" ]; then
        return 0
    fi
    mkdir -p "$root"
    local tarball=$root/sdist.tar.gz
    if [ ! -f "$tarball" ] || ! echo "$sha256  $tarball" | sha256sum -c --status; then
        local dl
        dl=$(mktemp -d "$root/download.XXXXXX")
        log "downloading llama-cpp-python==$version (sdist)"
        python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$version" -d "$dl" || die "pip download failed"
        local got
        got=$(find "$dl" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' | head -n1)
        [ -n "$got" ] || die "pip download produced no sdist in $dl"
        echo "$sha256  $got" | sha256sum -c --status ||
            die "sha256 mismatch for $got: expected $sha256, got $(sha256sum "$got" | cut -d' ' -f1)"
        mv "$got" "$tarball"
        rm -rf "$dl"
    fi
    log "unpacking vendor/llama.cpp"
    local tmp
    tmp=$(mktemp -d "$root/unpack.XXXXXX")
    tar -xzf "$tarball" -C "$tmp" --strip-components=3 "llama_cpp_python-$version/vendor/llama.cpp"
    [ -f "$tmp/ggml/include/ggml-backend.h" ] || die "the sdist has no vendor/llama.cpp/ggml tree"
    rm -rf "$src"
    mv "$tmp" "$src"
    touch "$src/.complete"
}

build_targets() {
    local targets=("$@")
    [ ${#targets[@]} -gt 0 ] || targets=(ggml-base ggml-cpu test-backend-ops)
    log "building ${targets[*]}"
    cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$root/build.log" 2>&1 ||
        { tail -n 40 "$root/build.log" >&2; die "build failed (log: $root/build.log)"; }
}

# test-backend-ops without libllama and common (CMake's target links both although the program
# uses ggml alone): what the older release's check needs, at a fraction of the build.
build_backend_ops_alone() {
    build_targets ggml ggml-base ggml-cpu
    local source=$src/tests/test-backend-ops.cpp out=$build/bin/test-backend-ops
    [ -f "$source" ] || die "no $source in the pinned tree"
    if [ -x "$out" ] && [ "$out" -nt "$source" ] && [ "$out" -nt "$build/bin/libggml.so" ]; then
        return 0
    fi
    log "compiling test-backend-ops against ggml"
    local launcher=()
    command -v ccache >/dev/null 2>&1 && launcher=(ccache)
    "${launcher[@]}" "${CXX:-c++}" -std=c++17 -O2 -DNDEBUG -DGGML_BACKEND_DL -DGGML_SHARED \
        -I"$src/ggml/include" "$source" -o "$out.tmp" -L"$build/bin" -lggml -lggml-base \
        -Wl,-rpath,'$ORIGIN' -pthread >"$root/build-backend-ops.log" 2>&1 ||
        { tail -n 40 "$root/build-backend-ops.log" >&2; die "test-backend-ops failed to build (log: $root/build-backend-ops.log)"; }
    mv "$out.tmp" "$out"
}

repo=$(cd "$here/.." && pwd)
# GGML_RPC=ON: ggml's RPC backend and ggml-rpc-server, which serves HSA0 to other machines
# (docs/several-machines.md); RDMA off so that the build does not depend on what libibverbs is installed.
common_flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF
    -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
    -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF)

# A build tree configured by this checkout with the current flags: `cache_has DIR LINE...` is
# true when DIR/CMakeCache.txt has every LINE (a tree from another checkout, or from before
# GGML_RPC, is configured again).
cache_has() {
    local dir=$1 line
    shift
    [ -f "$dir/build.ninja" ] || return 1
    for line in "$@"; do
        grep -qxF "$line" "$dir/CMakeCache.txt" 2>/dev/null || return 1
    done
}

# The tree every step shares: unmodified upstream with the plugin through the documented hook
# (docs/building.md); its ggml-base, ggml-cpu and test programs are what the
# crate links and the tests run, its ggml-hsa target the plugin as CMake builds it. Upstream's
# loader does not load libggml-hsa.so by name, so the plain programs run without it unless
# GGML_BACKEND_PATH names a plugin.
configure() {
    "$repo/scripts/fetch-deps.sh" >/dev/null
    # The build tree is shared by checkouts of this repository (it lives in the cache): configure
    # again when it was set up for another checkout or without the hook.
    if ! cache_has "$build" "CMAKE_PROJECT_ggml_INCLUDE:UNINITIALIZED=$repo/cmake/hook.cmake" \
        "GGML_RPC:BOOL=ON" "LLAMA_BUILD_SERVER:BOOL=ON"; then
        log "configuring $build (GGML_BACKEND_DL=ON, CMAKE_PROJECT_ggml_INCLUDE=cmake/hook.cmake)"
        # The tree is not a git checkout, so ggml_commit() reports "unknown";
        # GIT_CEILING_DIRECTORIES keeps git from picking up an enclosing repository's commit.
        GIT_CEILING_DIRECTORIES=$root cmake -S "$src" -B "$build" "${common_flags[@]}" \
            -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DLLAMA_BUILD_TESTS=ON \
            -DLLAMA_BUILD_SERVER=ON \
            -DCMAKE_PROJECT_ggml_INCLUDE="$repo/cmake/hook.cmake" -DGGML_HSA_JIT_COMPILE=ON \
            -DGGML_HSA_SOURCE_DIR="$repo" \
            >"$root/configure.log" 2>&1 ||
            { tail -n 30 "$root/configure.log" >&2; die "cmake configure failed (log: $root/configure.log)"; }
    fi
}

# In-tree and static: a copy of the pristine tree, prepared by cmake/integrate.sh.
build_static() {
    local tree=$root/src-static dir=$root/build-static
    "$repo/scripts/fetch-deps.sh" >/dev/null
    if [ ! -f "$tree/.complete" ]; then
        rm -rf "$tree"
        cp -a "$src" "$tree"
        rm -f "$tree/.complete"
        "$repo/cmake/integrate.sh" "$tree" >&2
        touch "$tree/.complete"
    fi
    # Shared by checkouts of this repository: point the tree and the build at this one.
    if [ "$(readlink -f "$tree/ggml/src/ggml-hsa")" != "$repo/cmake" ]; then
        rm -f "$tree/ggml/src/ggml-hsa"
        "$repo/cmake/integrate.sh" "$tree" >&2
    fi
    # -O1: this tree's programs run tiny models only (its CPU work is small), and it compiles
    # libllama, common and ggml a second time (the shared tree's objects cannot be reused: PIC and
    # export flags differ; at -O3 the step took 8 minutes on a fresh 2-core machine). The plugin
    # is cargo --release still.
    local opt="-O1 -DNDEBUG"
    if ! cache_has "$dir" "GGML_HSA_SOURCE_DIR:PATH=$repo" "GGML_RPC:BOOL=ON" \
        "LLAMA_BUILD_TESTS:BOOL=ON" "CMAKE_CXX_FLAGS_RELEASE:STRING=$opt"; then
        log "configuring $dir (GGML_HSA=ON, GGML_BACKEND_DL=OFF, static)"
        GIT_CEILING_DIRECTORIES=$root cmake -S "$tree" -B "$dir" "${common_flags[@]}" \
            -DBUILD_SHARED_LIBS=OFF -DGGML_BACKEND_DL=OFF -DGGML_HSA=ON -DLLAMA_BUILD_TESTS=ON \
            -DGGML_HSA_JIT_COMPILE=ON -DGGML_HSA_SOURCE_DIR="$repo" \
            -DCMAKE_C_FLAGS_RELEASE="$opt" -DCMAKE_CXX_FLAGS_RELEASE="$opt" \
            >"$root/configure-static.log" 2>&1 ||
            { tail -n 30 "$root/configure-static.log" >&2; die "configure failed (log: $root/configure-static.log)"; }
    fi
    local targets=("$@")
    [ ${#targets[@]} -gt 0 ] || targets=(llama-simple llama-completion)
    log "building ${targets[*]} in $dir"
    cmake --build "$dir" -j "$(nproc)" --target "${targets[@]}" >"$root/build-static.log" 2>&1 ||
        { tail -n 40 "$root/build-static.log" >&2; die "build failed (log: $root/build-static.log)"; }
}

print_env() {
    cat <<ENV
export GGML_HSA_GGML_DIR='$src/ggml'
export GGML_HSA_GGML_LIB_DIR='$build/bin'
export LLAMA_CPP_DIR='$src'
export LLAMA_CPP_BIN='$build/bin'
ENV
}

cmd=${1:-build}
[ $# -gt 0 ] && shift
case "$cmd" in
    deps) ensure_tools ;;
    fetch) ensure_tools; fetch ;;
    build) ensure_tools; fetch; configure; build_targets "$@" ;;
    build-ggml) ensure_tools; fetch; configure; build_backend_ops_alone ;;
    build-dl)
        ensure_tools; fetch; configure
        [ $# -gt 0 ] || set -- ggml-hsa llama-simple llama-completion llama-embedding
        build_targets "$@" ;;
    build-static) ensure_tools; fetch; build_static "$@" ;;
    env) print_env ;;
    path)
        case "${1:-}" in
            src) echo "$src" ;; ggml) echo "$src/ggml" ;; build) echo "$build" ;; bin) echo "$build/bin" ;;
            bin-dl) echo "$build/bin" ;; bin-static) echo "$root/build-static/bin" ;;
            *) die "usage: $0 path src|ggml|build|bin|bin-dl|bin-static" ;;
        esac ;;
    *) die "unknown command '$cmd' (deps|fetch|build|build-ggml|build-dl|build-static|env|path)" ;;
esac
