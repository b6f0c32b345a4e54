# Sourced by the scripts that install what a fresh Debian machine lacks. Every install decision
# of the project is made here, on Debian package names (dpkg's own record), or on the exact
# program a later step runs: never on a file glob, which something else can satisfy (a glob on
# libclang*.so* matched libclang-cpp14, present on stock Debian, and hid a missing libclang-dev).
#
# deps_packages GROUP: prints the Debian packages a step needs, one per line (the one list):
#   build   llama.cpp's and the crate's builds: cmake, ninja-build, g++, ccache, and libclang-dev
#           (bindgen loads libclang.so and clang's builtin headers; LIBCLANG_PATH, when set, names
#           another libclang instead and must hold one bindgen can load: libclang_at)
#   rocr    Debian's ROCm runtime and headers (the zero-device test, the header ABI check)
#   cxx     g++ alone (the IRON package's host kernel tests)
# apt_install PKG...: installs the packages dpkg does not list as installed (as root, or through
#   sudo). Prints what it installs on stderr; returns 1 with a message when it cannot.
# deps_install GROUP...: apt_install of the groups' packages.
# python_pip_install: python3-pip when `python3 -m pip` (the exact command used) does not run.
# python_venv_install: python3-venv when python3 cannot `import ensurepip` (what `python3 -m
#   venv` needs; Debian ships it in python3-venv).
# python_emu_install: numpy and ml_dtypes (the IRON designs' tensor types, for the emulation
#   target `python3 -m ggml_hsa_iron --target emu`) when python3 cannot import them or numpy is
#   older than 2 (the emulation is tested with numpy 2 only): other installed versions serve;
#   missing ones are installed at EMU_PY (numpy as
#   scripts/models.pin pins it), with pip.

deps_packages() {
    case "$1" in
        build)
            printf '%s\n' cmake ninja-build g++ ccache
            if [ -n "${LIBCLANG_PATH:-}" ]; then
                libclang_at "$LIBCLANG_PATH" || {
                    printf 'LIBCLANG_PATH=%s holds no libclang that bindgen can load (libclang.so, libclang-N.so, libclang.so.N; unset it to use libclang-dev)\n' "$LIBCLANG_PATH" >&2
                    return 1
                }
            else
                echo libclang-dev
            fi ;;
        rocr) printf '%s\n' libhsa-runtime64-1 libhsa-runtime-dev ;;
        # valgrind memcheck of the C header program and of test-backend-ops.
        memcheck) echo valgrind ;;
        cxx) echo g++ ;;
        *) printf 'deps_packages: unknown group %s\n' "$1" >&2; return 1 ;;
    esac
}

# libclang_at PATH: true when PATH is what bindgen's loader (clang-sys 1.9, build/dynamic.rs and
# build/common.rs, also used at run time by `clang_sys::load`) would open for LIBCLANG_PATH: the
# file itself, or a directory holding a file under one of the names it searches
# (libclang.so, libclang-*.so, libclang.so.*, libclang-*.so.*), where libclang-cpp.so.N, which
# it skips, does not count. Not "the path exists": an empty directory or one holding only
# libclang-cpp would pass that and fail in the build script.
libclang_at() {
    local path=$1 file name
    if [ -f "$path" ]; then
        set -- "$path"
    elif [ -d "$path" ]; then
        set -- "$path"/libclang.so "$path"/libclang-*.so "$path"/libclang.so.* "$path"/libclang-*.so.*
    else
        return 1
    fi
    for file in "$@"; do
        [ -f "$file" ] || continue
        name=${file##*/}
        case "$name" in
            *-cpp.*) ;;
            libclang.so | libclang-*.so | libclang.so.* | libclang-*.so.*) return 0 ;;
        esac
    done
    return 1
}

# apt_missing PKG...: the packages dpkg does not list as installed, one per line.
apt_missing() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -qx "install ok installed" || echo "$pkg"
    done
}

apt_install() {
    local missing sudo=""
    if ! command -v dpkg-query >/dev/null; then
        printf 'not a Debian system (no dpkg-query): make sure these are installed: %s\n' "$*" >&2
        return 0
    fi
    mapfile -t missing < <(apt_missing "$@")
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || {
        printf 'missing packages: %s (install them; there is no apt-get here)\n' "${missing[*]}" >&2
        return 1
    }
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    printf 'installing %s\n' "${missing[*]}" >&2
    $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

deps_install() {
    local group pkgs=() list
    for group in "$@"; do
        list=$(deps_packages "$group") || return 1
        mapfile -t -O "${#pkgs[@]}" pkgs <<<"$list"
    done
    apt_install "${pkgs[@]}"
}

python_pip_install() {
    python3 -m pip --version >/dev/null 2>&1 && return 0
    apt_install python3-pip || return 1
    python3 -m pip --version >/dev/null 2>&1 || {
        printf 'python3 -m pip does not run after installing python3-pip (is python3 Debian'"'"'s?)\n' >&2
        return 1
    }
}

python_venv_install() {
    python3 -c 'import ensurepip' >/dev/null 2>&1 && return 0
    apt_install python3-venv
}

EMU_PY=(numpy==2.2.6 ml_dtypes==0.6.0)
EMU_PY_PROBE="import numpy, ml_dtypes; assert int(numpy.__version__.split('.')[0]) >= 2"
python_emu_install() {
    python3 -c "$EMU_PY_PROBE" >/dev/null 2>&1 && return 0
    python_pip_install || return 1
    python3 -m pip install --quiet "${EMU_PY[@]}" 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages "${EMU_PY[@]}"
}
