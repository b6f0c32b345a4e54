"""The emulation target: the IRON designs recorded by a stand-in of `aie.iron` and the core
kernels compiled for the host, packed into a simulator image hsa-sim executes.

`install()` puts the stand-in into `sys.modules` as `aie`, `aie.iron`, ... (only the subset the
designs use); `compile_emu()` (compile.py) is the `compile` command of `--target emu`.
"""

import sys
import types

from . import iron

_MODULES = {
    "aie": {},
    "aie.iron": {
        "Kernel": iron.Kernel,
        "ExternalFunction": iron.ExternalFunction,
        "ObjectFifo": iron.ObjectFifo,
        "Program": iron.Program,
        "Runtime": iron.Runtime,
        "Worker": iron.Worker,
    },
    "aie.iron.device": {
        "NPU1": iron.NPU1,
        "NPU2": iron.NPU2,
        "NPU1Col1": iron.NPU1Col1,
        "NPU2Col1": iron.NPU2Col1,
        "Tile": iron.Tile,
        "AnyShimTile": iron.AnyShimTile,
        "AnyMemTile": iron.AnyMemTile,
        "AnyComputeTile": iron.AnyComputeTile,
    },
    "aie.iron.controlflow": {"range_": iron.range_},
    "aie.iron.runtime": {"Runtime": iron.Runtime, "TaskGroup": iron.TaskGroup},
    "aie.iron.dataflow": {
        "ObjectFifo": iron.ObjectFifo,
        "ObjectFifoHandle": iron.ObjectFifoHandle,
    },
    "aie.helpers": {},
    "aie.helpers.taplib": {"TensorAccessPattern": iron.TensorAccessPattern},
}


def install() -> None:
    """Makes `import aie.iron ...` load the recording stand-in (replacing any real mlir-aie)."""
    for name in list(sys.modules):
        if name == "aie" or name.startswith("aie."):
            del sys.modules[name]
    for name, attrs in _MODULES.items():
        m = types.ModuleType(name, f"ggml_hsa_iron emulation stand-in of {name} (mlir-aie 1.4.x)")
        m.__dict__.update(attrs)
        m.__path__ = []  # a package, so that submodules resolve
        sys.modules[name] = m
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], leaf, m)
    # Designs imported under the real IRON must be re-imported.
    for name in list(sys.modules):
        if name.startswith(__package__.rsplit(".", 1)[0] + ".designs"):
            del sys.modules[name]
