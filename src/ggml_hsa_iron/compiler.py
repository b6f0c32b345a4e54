"""The compile pipeline: request -> spec -> Peano objects + IRON design -> aiecc.

Files: `<out>/<name>.pdi`, `<out>/<name>_insts.bin` and `<out>/<name>.hsaco`
(see `outputs.py`). Tool output goes to stderr (the backend captures it).
"""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import environment
from .errors import BuildError, UnsupportedError
from .outputs import install_kernel
from .plans import CoreSource, core_sources, prepare
from .registry import lookup
from .request import Request

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
PEANO_FLAGS = [
    "-O2",
    "-std=c++20",
    "-Wno-parentheses",
    "-Wno-attributes",
    "-Wno-macro-redefined",
    "-Wno-empty-body",
    "-DNDEBUG",
]


def _verbose() -> bool:
    return os.environ.get("GGML_HSA_JIT_VERBOSE", "").lower() in ("1", "true", "yes", "on")


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    if _verbose():
        print("+ " + " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    text = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        sys.stderr.write(text)
        raise BuildError(f"{what} failed (exit status {proc.returncode})")
    if _verbose():
        sys.stderr.write(text)


def peano_command(core: CoreSource, arch_target: str, peano: Path, aie_root: Path, out: Path):
    cmd = [str(peano / "bin" / "clang++"), *PEANO_FLAGS, f"--target={arch_target}"]
    cmd.append(f"-I{aie_root / 'include'}")
    cmd.append(f"-I{KERNELS_DIR}")
    cmd += [f"-D{k}={v}" for k, v in sorted(core.defines.items())]
    cmd += ["-c", str(KERNELS_DIR / core.source), "-o", str(out)]
    return cmd


def aiecc_args(peano: Path, mlir: str, prj: str) -> list[str]:
    return [
        "--no-xchesscc",
        "--no-xbridge",
        "--peano",
        str(peano),
        "--alloc-scheme=basic-sequential",
        # mlir-aie 1.4.x: outputs are explicit requests (--get-*, PR #3364); the PDI flag's
        # spelling follows the npu-insts one (unverified without the toolchain).
        "--get-pdi",
        "--pdi-name=kernel.pdi",
        "--get-npu-insts",
        "--npu-insts-name=insts.bin",
        f"--tmpdir={prj}",
        mlir,
    ]


def build_module(spec) -> str:
    """Runs the IRON design of `spec` and returns its MLIR text."""
    op = lookup(spec.request.op)
    module_name = f"{__package__}.designs.{op.source[:-3]}"
    design = importlib.import_module(module_name)
    fn = getattr(design, op.kernel_name)
    return str(fn(spec))


def compile_request(req: Request, output_dir: Path) -> None:
    if "n_kv_step" in req.extra:
        # The emulation target records such a design at several n_kv and writes where the
        # value goes (emu/params.py); aiecc's instruction stream has no such table yet.
        raise UnsupportedError(
            f"{req.op}: a run-time n_kv (n_kv_step) is compiled by the emulation target only"
        )
    spec = prepare(req)  # UnsupportedError before any tool runs
    environment.check()
    peano = environment.peano_dir()
    aie_root = environment.mlir_aie_dir()
    aiecc = environment.aiecc_command(aie_root)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{req.name}.", dir=output_dir))
    try:
        for core in core_sources(spec):
            obj = work / core.object_name
            cmd = peano_command(core, spec.arch.peano_target, peano, aie_root, obj)
            _run(cmd, work, f"Peano ({core.source})")
        try:
            mlir = build_module(spec)
        except Exception as e:  # IRON raises plain exceptions on bad designs
            raise BuildError(f"the IRON design failed: {type(e).__name__}: {e}") from e
        (work / "design.mlir").write_text(mlir)
        _run(aiecc + aiecc_args(peano, "design.mlir", "design.prj"), work, "aiecc")
        pdi, insts = work / "kernel.pdi", work / "insts.bin"
        if not pdi.is_file() or pdi.stat().st_size == 0:
            raise BuildError("aiecc produced no PDI")
        size = insts.stat().st_size if insts.is_file() else 0
        if size == 0 or size % 4:
            raise BuildError(f"aiecc produced an invalid instruction stream ({size} bytes)")
        install_kernel(req, output_dir, pdi.read_bytes(), insts.read_bytes())
    finally:
        if os.environ.get("GGML_HSA_IRON_KEEP_WORK"):
            print(f"ggml_hsa_iron: work directory kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
