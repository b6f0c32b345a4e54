#!/usr/bin/env bash
# Creates (once) and activates the IRON environment of ggml_hsa_iron: a Python
# virtual environment with mlir-aie v1.4.4 (IRON), mlir-python-extras and
# llvm-aie (Peano), plus numpy and ml_dtypes (also what --target emu needs).
#
#   source src/ggml_hsa_iron/env_setup.sh            # venv in ./ggml_hsa_iron_env
#   GGML_HSA_IRON_VENV=/path source .../env_setup.sh  # elsewhere
#
# Must be sourced (it activates the venv in the current shell). It also puts
# the package's parent directory on PYTHONPATH so that
# `python3 -m ggml_hsa_iron` (the backend's default JIT compiler) is found.

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "env_setup.sh must be sourced: source ${BASH_SOURCE[0]}" >&2
  exit 1
fi

_ghi_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
_ghi_venv=${GGML_HSA_IRON_VENV:-$PWD/ggml_hsa_iron_env}

if [ ! -x "$_ghi_venv/bin/python3" ]; then
  python3 -m venv "$_ghi_venv" || return 1
  "$_ghi_venv/bin/python3" -m pip install --upgrade pip || return 1
  MLIR_PYTHON_EXTRAS_SET_VERSION="0.0.8.3" HOST_MLIR_PYTHON_PACKAGE_PREFIX="aie" \
    "$_ghi_venv/bin/python3" -m pip install -r "$_ghi_dir/requirements.txt" || return 1
  MLIR_PYTHON_EXTRAS_SET_VERSION="0.0.8.3" HOST_MLIR_PYTHON_PACKAGE_PREFIX="aie" \
    "$_ghi_venv/bin/python3" -m pip install -r "$_ghi_dir/requirements-extras.txt" || return 1
fi

# shellcheck disable=SC1091
source "$_ghi_venv/bin/activate" || return 1
export MLIR_PYTHON_EXTRAS_SET_VERSION="0.0.8.3"
export HOST_MLIR_PYTHON_PACKAGE_PREFIX="aie"
export PYTHONPATH="$(dirname "$_ghi_dir")${PYTHONPATH:+:$PYTHONPATH}"
unset _ghi_dir _ghi_venv
