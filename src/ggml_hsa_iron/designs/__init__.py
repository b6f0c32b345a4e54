"""IRON designs (mlir-aie v1.4.4). Importing these modules needs the IRON environment, or the
emulation stand-in (`emu.install()`, `--target emu`).

Each design file defines `ggml_op_<op>(spec)` for the ops the registry maps to
it; the function returns the resolved MLIR module of the design for a spec
made by `ggml_hsa_iron.plans.prepare`.
"""
