"""`compile` of the emulation target: request -> spec -> recorded design + host kernels ->
simulator image version 2 (`<name>.pdi`) and its instruction stream (`<name>_insts.bin`).

Image: "HSASIMK1" | version u32 = 2 | program JSON length u32 | library length u32 |
reserved u32 = 0 | program JSON (UTF-8) | shared library. Instruction stream: the 8 words of
version 1, hashing the payload (JSON + library bytes), then a word per run-time argument
(a request with `n_kv_step`: n_kv, written by the backend at dispatch).

Images are cached in the emulation's cache directory by what they depend on (the request, the
package's sources, the C++ compiler), so a design is recorded once per shape.
"""

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import struct
import sys
from pathlib import Path

from ..errors import BuildError
from ..outputs import install_kernel
from ..plans import core_sources, prepare
from ..registry import lookup
from ..request import Request
from . import install, iron
from .build import build_library, cache_dir, compiler, read_cached, sources_digest, write_cached
from .params import parametrize
from .program import DesignError

MAGIC = b"HSASIMK1"
VERSION = 2


def record(spec):
    """Runs the IRON design of `spec` against the stand-in; returns the program.Recorded."""
    install()
    iron.reset()
    op = lookup(spec.request.op)
    design = importlib.import_module(f"{__package__.rsplit('.', 1)[0]}.designs.{op.source[:-3]}")
    try:
        return getattr(design, op.kernel_name)(spec)
    except DesignError as e:
        raise BuildError(f"the IRON design is invalid: {e}") from e
    except Exception as e:  # the stand-in raises what IRON would raise
        raise BuildError(f"the IRON design failed: {type(e).__name__}: {e}") from e


def image_bytes(program: dict, library: bytes) -> bytes:
    text = json.dumps(program, separators=(",", ":")).encode()
    head = MAGIC + struct.pack("<IIII", VERSION, len(text), len(library), 0)
    return head + text + library


def insts_bytes(image: bytes, params: int = 0) -> bytes:
    """The stream naming `image`, then one word per run-time argument of its program, which
    the backend writes at each dispatch (0 here: not a valid value)."""
    payload = image[24:]
    h = fnv1a64_bytes(payload)
    words = [0x4D495348, 0x31534E49, 1, 8 + params, h & 0xFFFFFFFF, h >> 32, len(payload), 0]
    return struct.pack(f"<{8 + params}I", *words, *[0] * params)


def fnv1a64_bytes(data: bytes) -> int:
    """FNV-1a 64 (the instruction stream's payload hash), chunked for speed."""
    h = 0xCBF29CE484222325
    mask = 0xFFFFFFFFFFFFFFFF
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & mask
    return h


def check_objects(rec, cores) -> None:
    """Every recorded Kernel is in an object the design's core sources build, and the
    objects' names are distinct."""
    objects = [c.object_name for c in cores]
    if len(set(objects)) != len(objects):
        raise BuildError(f"the design's core sources build objects of one name: {objects}")
    for k in rec.kernels:
        if k.object_file_name not in objects:
            raise BuildError(
                f"Kernel {k.name} is in {k.object_file_name}, the design's core sources build "
                f"{', '.join(objects)}"
            )


PACKAGE = Path(__file__).resolve().parent.parent


@functools.cache
def _package_digest() -> bytes:
    """The package's Python (plans, designs, the stand-in), the kernel sources and the AIE-API
    stand-in."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE.rglob("*.py")):
        if "tests" not in p.relative_to(PACKAGE).parts:
            h.update(str(p.relative_to(PACKAGE)).encode() + b"\0" + p.read_bytes())
    h.update(sources_digest())
    return h.digest()


def _design_key(req: Request) -> str:
    """What an image depends on: the request, the package's sources and the C++ compiler."""
    try:
        cxx = compiler()
    except BuildError:
        cxx = ""  # nothing cached is found; the compile then says what is missing, in order
    h = hashlib.sha256(repr(req).encode() + b"\0" + cxx.encode() + b"\0")
    h.update(_package_digest())
    return h.hexdigest()[:32]


def compile_emu(req: Request, output_dir: Path) -> None:
    """Writes the kernel of `req`. A request compiled before with the same sources is installed
    from the emulation cache (`designs/`): a design is recorded once per shape, whichever test
    or run asks for it; refusals and failures are not cached."""
    cached = cache_dir() / "designs" / f"{_design_key(req)}.pdi"
    params = 1 if req.extra.get("n_kv_step") else 0
    image = read_cached(cached)
    if image is not None:
        install_kernel(req, output_dir, image, insts_bytes(image, params))
        return
    image = _compile_image(req)
    install_kernel(req, output_dir, image, insts_bytes(image, params))
    try:
        write_cached(cached, image)
    except OSError:
        pass  # a read-only or full cache: the next compile records the design again


def _compile_image(req: Request) -> bytes:
    spec = prepare(req)  # UnsupportedError before anything runs
    program, lib = build_program(spec)
    return image_bytes(program, lib)


def build_program(spec) -> tuple[dict, bytes]:
    """The program JSON of `spec`'s recorded design (the stand-in's hardware checks passed)
    and the host library of its core sources. A spec whose n_kv is a run-time argument
    (`fa.step`) is recorded at several values and merged into one program (emu/params.py),
    every recording with the same core sources."""
    req = spec.request
    # The attention's spec: the op's own (FLASH_ATTN_EXT_MASK) or its phase.
    fa = getattr(spec, "fa", spec)
    if not getattr(fa, "step", 0):
        rec = record(spec)
        cores = core_sources(spec)
        check_objects(rec, cores)
        return rec.to_json(req.name, req.arch), _library(cores, rec.kernels, req.arch)
    lo, hi = fa.step, fa.n_kv_max
    # Two values fit each number's line, the others check it (the middle one, the largest).
    ns = sorted({lo, min(2 * lo, hi), max(lo, hi // 2 // lo * lo), hi})
    programs, cores, kernels = [], None, None
    for n in ns:
        at = fa.at(n) if fa is spec else dataclasses.replace(spec, fa=fa.at(n))
        rec = record(at)
        got = core_sources(at)
        check_objects(rec, got)
        if cores is not None and got != cores:
            raise BuildError(f"the core sources differ between n_kv {ns[0]} and {n}")
        cores, kernels = got, rec.kernels
        programs.append((n, rec.to_json(req.name, req.arch)))
    try:
        program = parametrize(programs, lo, hi, lo)
    except DesignError as e:
        raise BuildError(f"the IRON design is invalid: {e}") from e
    return program, _library(cores, kernels, req.arch)


def _library(cores, kernels, arch) -> bytes:
    verbose = os.environ.get("GGML_HSA_JIT_VERBOSE", "").lower() in ("1", "true", "yes", "on")
    return build_library(
        cores, kernels, arch, log=(lambda m: print(m, file=sys.stderr)) if verbose else None
    )
