#!/usr/bin/env bash
# Prepares a llama.cpp (or ggml) source tree for building ggml-hsa in-tree, the way the C++
# backend sits in its fork, so that GGML_BACKEND_DL=OFF (static registration) works too:
#
#   cmake/integrate.sh /path/to/llama.cpp
#   cmake -S /path/to/llama.cpp -B build -DGGML_HSA=ON [-DGGML_BACKEND_DL=ON|OFF] ...
#
# It adds, where absent (running it again changes nothing):
#   ggml/CMakeLists.txt          option(GGML_HSA ...)
#   ggml/src/CMakeLists.txt      ggml_add_backend(HSA)
#   ggml/src/ggml-backend-reg.cpp  #include "ggml-hsa.h", register_backend(ggml_backend_hsa_reg())
#                                under GGML_USE_HSA, and ggml_backend_load_best("hsa", ...) in
#                                ggml_backend_load_all_from_path (DL builds find the plugin by name)
#   ggml/src/ggml-hsa            a symlink to this folder (the CMake shim; the crate is its parent)
set -euo pipefail

die() { printf 'integrate.sh: error: %s\n' "$*" >&2; exit 1; }
note() { printf 'integrate.sh: %s\n' "$*"; }

[ $# -eq 1 ] || die "usage: $0 <llama.cpp or ggml source tree>"
tree=$(cd "$1" 2>/dev/null && pwd) || die "no such directory: $1"
shim=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -f "$tree/ggml/CMakeLists.txt" ]; then
    ggml=$tree/ggml
elif [ -f "$tree/src/ggml-backend-reg.cpp" ]; then
    ggml=$tree
else
    die "$tree is neither a llama.cpp tree (ggml/) nor a ggml tree (src/ggml-backend-reg.cpp)"
fi
top_cmake=$ggml/CMakeLists.txt
src_cmake=$ggml/src/CMakeLists.txt
reg_cpp=$ggml/src/ggml-backend-reg.cpp
for f in "$top_cmake" "$src_cmake" "$reg_cpp"; do
    [ -f "$f" ] || die "missing $f"
    [ -w "$f" ] || die "$f is not writable"
done

# insert_after FILE ANCHOR_REGEX TEXT: puts TEXT after the first line matching ANCHOR_REGEX.
insert_after() {
    local file=$1 anchor=$2 text=$3
    grep -qE "$anchor" "$file" || die "cannot find '$anchor' in $file (unexpected ggml version?)"
    local tmp
    tmp=$(mktemp)
    ANCHOR=$anchor TEXT=$text awk '
        { print }
        !done && $0 ~ ENVIRON["ANCHOR"] { print ENVIRON["TEXT"]; done = 1 }' "$file" >"$tmp"
    cat "$tmp" >"$file"
    rm -f "$tmp"
}

# insert_before FILE ANCHOR_REGEX TEXT [NEXT_REGEX]: puts TEXT before the first line matching
# ANCHOR_REGEX (and, when given, followed by a line matching NEXT_REGEX).
insert_before() {
    local file=$1 anchor=$2 text=$3 next=${4:-}
    local tmp
    tmp=$(mktemp)
    ANCHOR=$anchor TEXT=$text NEXT=$next awk '
        { line[NR] = $0 }
        END {
            for (i = 1; i <= NR; i++) {
                if (!done && line[i] ~ ENVIRON["ANCHOR"] && (ENVIRON["NEXT"] == "" || line[i + 1] ~ ENVIRON["NEXT"])) {
                    print ENVIRON["TEXT"]; done = 1
                }
                print line[i]
            }
            exit !done
        }' "$file" >"$tmp" || { rm -f "$tmp"; die "cannot find '$anchor' in $file (unexpected ggml version?)"; }
    cat "$tmp" >"$file"
    rm -f "$tmp"
}

if grep -q 'option(GGML_HSA ' "$top_cmake"; then
    note "option(GGML_HSA) already in $top_cmake"
else
    insert_after "$top_cmake" '^option\(GGML_BLAS ' \
        'option(GGML_HSA                             "ggml: use HSA (AMD XDNA NPUs, ggml-hsa)"        OFF)'
    note "added option(GGML_HSA) to $top_cmake"
fi

if grep -q 'ggml_add_backend(HSA)' "$src_cmake"; then
    note "ggml_add_backend(HSA) already in $src_cmake"
else
    insert_after "$src_cmake" '^ggml_add_backend\(BLAS\)' 'ggml_add_backend(HSA)'
    note "added ggml_add_backend(HSA) to $src_cmake"
fi

if grep -q 'ggml_backend_hsa_reg()' "$reg_cpp"; then
    note "HSA registration already in $reg_cpp"
else
    insert_before "$reg_cpp" '^#ifdef GGML_USE_BLAS' \
        $'#ifdef GGML_USE_HSA\n#include "ggml-hsa.h"\n#endif\n'
    insert_before "$reg_cpp" '^#ifdef GGML_USE_CPU$' \
        $'#ifdef GGML_USE_HSA\n        register_backend(ggml_backend_hsa_reg());\n#endif' 'register_backend\(ggml_backend_cpu_reg'
    note "added the HSA registration to $reg_cpp"
fi
if grep -q 'ggml_backend_load_best("hsa"' "$reg_cpp"; then
    note "load_best(\"hsa\") already in $reg_cpp"
else
    insert_before "$reg_cpp" '^ *ggml_backend_load_best\("cpu"' \
        '    ggml_backend_load_best("hsa", silent, dir_path);'
    note "added load_best(\"hsa\") to $reg_cpp"
fi

link=$ggml/src/ggml-hsa
if [ -L "$link" ] && [ "$(readlink -f "$link")" = "$(readlink -f "$shim")" ]; then
    note "$link already points at $shim"
elif [ -e "$link" ] || [ -L "$link" ]; then
    die "$link exists and is not a link to $shim; remove it first"
else
    ln -s "$shim" "$link"
    note "linked $link -> $shim"
fi
note "done: configure with -DGGML_HSA=ON (GGML_BACKEND_DL=ON or OFF)"
