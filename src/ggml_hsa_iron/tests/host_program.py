"""The host test programs (a driver of `tests/host/` with a kernel source and its defines),
compiled once per content: cached in the emulation's cache directory by the hash of the
compiler's arguments and of every source they can include (the kernels, the AIE-API stand-in,
the drivers), so a second run of a test builds nothing it built before."""

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ggml_hsa_iron.emu.build import cache_dir, private_dir, sources_digest, trusted

HERE = Path(__file__).resolve().parent
CXX = shutil.which("g++") or shutil.which("clang++")


@functools.cache
def _drivers_digest() -> bytes:
    h = hashlib.sha256()
    for p in sorted((HERE / "host").glob("*.cc")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.digest()


def build(args: list) -> Path:
    """The program `CXX *args -o EXE` builds (args: flags, defines and sources), from the cache
    (a file it trusts) or compiled into it. The cached file is replaced atomically, so
    concurrent tests race benignly."""
    args = [str(a) for a in args]
    h = hashlib.sha256()
    for part in (CXX, *args):
        h.update(part.encode() + b"\0")
    h.update(sources_digest())
    h.update(_drivers_digest())
    d = cache_dir() / "host-programs"
    exe = d / h.hexdigest()[:32]
    if trusted(exe):
        return exe
    private_dir(d)
    fd, tmp = tempfile.mkstemp(prefix=".build-", dir=d)
    os.close(fd)
    try:
        cmd = [CXX, *args, "-o", tmp]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stdout}{run.stderr}")
        os.chmod(tmp, 0o700)
        os.replace(tmp, exe)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return exe
