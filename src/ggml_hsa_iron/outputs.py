"""The kernel files a compile writes into the output directory, each under a temporary name in
that directory and renamed into place, so a reader never sees half a kernel:
`<name>.pdi`, `<name>_insts.bin` (protocol version 1) and `<name>.hsaco`, the same kernel as an
AIE code object for runtimes of packet ABI c (the backend prefers it when present).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from . import hsaco
from .archs import arch


def install_bytes(data: bytes, dest: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_kernel(req, output_dir: Path, pdi: bytes, insts: bytes) -> None:
    """Writes the request's kernel files (the hsaco first, so the PDI's presence means all are)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    columns = arch(req.arch).columns
    code_object = hsaco.single_kernel(req.arch, req.name, pdi, insts, len(req.operands), columns)
    install_bytes(code_object, output_dir / f"{req.name}.hsaco")
    install_bytes(insts, output_dir / f"{req.name}_insts.bin")
    install_bytes(pdi, output_dir / f"{req.name}.pdi")
