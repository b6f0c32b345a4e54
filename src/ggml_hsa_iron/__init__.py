"""ggml_hsa_iron: the NPU kernel compiler of ggml-hsa.

It speaks the backend's kernel compiler protocol (version 1, see
``docs/kernel-compiler-protocol.md`` in the repository):

* ``python3 -m ggml_hsa_iron capabilities`` prints what the designs implement
  (pure Python: works without mlir-aie);
* ``python3 -m ggml_hsa_iron compile --request R --output-dir D`` builds one
  kernel into ``D/<name>.pdi`` and ``D/<name>_insts.bin`` with IRON
  (mlir-aie v1.4.4) and Peano (llvm-aie).

Only the ``compile`` path imports mlir-aie, and only after checking that the
IRON environment is active.
"""

PROTOCOL = 1
COMPILER_NAME = "ggml_hsa_iron"
MLIR_AIE_VERSION = "1.4.4"

__all__ = ["COMPILER_NAME", "MLIR_AIE_VERSION", "PROTOCOL"]
