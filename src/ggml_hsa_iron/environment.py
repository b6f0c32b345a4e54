"""Finding the IRON environment: mlir-aie (with IRON), numpy, ml_dtypes, Peano.

Nothing here imports mlir-aie; `check()` only looks modules up, so that the
failure is one clear line instead of a traceback.
"""

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from .errors import EnvironmentMissing

ENV_SETUP = Path(__file__).resolve().parent / "env_setup.sh"
REQUIRED_MODULES = ("numpy", "ml_dtypes", "aie.iron")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        # A parent package that is missing, or unrelated (PyPI has a package
        # called `aie` that is not mlir-aie), or broken.
        return False


def missing_modules() -> list[str]:
    return [m for m in REQUIRED_MODULES if not _has_module(m)]


def hint() -> str:
    return f"activate the IRON environment (source {ENV_SETUP}) and retry"


def check() -> None:
    """Raises EnvironmentMissing with one line when IRON cannot be used."""
    missing = missing_modules()
    if missing:
        raise EnvironmentMissing(
            f"the IRON environment is not active (no module {', '.join(missing)}): {hint()}"
        )


def _dist_dir(dist: str, subdir: str) -> Path | None:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(d.locate_file(subdir)))
    return path if path.is_dir() else None


def peano_dir() -> Path:
    """The llvm-aie (Peano) installation: $PEANO_INSTALL_DIR or the llvm-aie wheel."""
    env = os.environ.get("PEANO_INSTALL_DIR")
    candidates = [Path(env)] if env else []
    found = _dist_dir("llvm-aie", "llvm-aie") or _dist_dir("llvm_aie", "llvm-aie")
    if found:
        candidates.append(found)
    for c in candidates:
        if (c / "bin" / "clang++").exists():
            return c
    raise EnvironmentMissing(
        "Peano (llvm-aie) was not found (set PEANO_INSTALL_DIR or install llvm-aie): " + hint()
    )


def mlir_aie_dir() -> Path:
    """The mlir-aie installation holding include/aie_api and bin/aiecc.py."""
    env = os.environ.get("MLIR_AIE_INSTALL_DIR")
    candidates = [Path(env)] if env else []
    found = _dist_dir("mlir_aie", "mlir_aie") or _dist_dir("mlir-aie", "mlir_aie")
    if found:
        candidates.append(found)
    spec = importlib.util.find_spec("aie")
    if spec is not None and spec.origin:
        candidates.extend(Path(spec.origin).resolve().parents)
    for c in candidates:
        if (c / "include" / "aie_api").is_dir():
            return c
    raise EnvironmentMissing(
        "the mlir-aie installation (include/aie_api) was not found "
        "(set MLIR_AIE_INSTALL_DIR): " + hint()
    )


def aiecc_command(root: Path) -> list[str]:
    """How to run aiecc: the wheel's bin/aiecc.py with this interpreter, else PATH."""
    script = root / "bin" / "aiecc.py"
    if script.exists():
        return [sys.executable, str(script)]
    for name in ("aiecc.py", "aiecc"):
        found = shutil.which(name)
        if found:
            return [found]
    raise EnvironmentMissing("aiecc.py was not found in the mlir-aie installation: " + hint())
