"""Writer of the AIE hsaco container (packet ABI c), for when mlir-aie's packer is absent.

The format is the one `crates/aie-hsaco` reads and writes (its Rust writer and this one produce
identical bytes for the same kernels; `tests/hsaco_python.rs` checks it): an ELF64 relocatable
(EM_AMDGPU) with `.shstrtab` and one non-loaded section per architecture (`aie2`, `aie2p`).
Each section: a 48-byte header (magic `AIEK`, version 1.0, header size, kernel count, entry
size 44, string table offset and size, blob pool offset, 16 reserved bytes), 44-byte kernel
entries (name offset, insts offset and size, PDI offset and size, kernarg size, columns, kind,
12 reserved bytes), the NUL-terminated names, then the blobs, de-duplicated by content.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x4B454941
HEADER_SIZE = 48
ENTRY_SIZE = 44
KIND_PDI_INSTS = 0
KIND_FULL_ELF = 1
_EM_AMDGPU = 224
_ET_REL = 1


@dataclass(frozen=True)
class Kernel:
    """One kernel: a PDI and an instruction stream (kind 0), or a full ELF (kind 1)."""

    name: str
    insts: bytes
    pdi: bytes = b""
    kernarg_size: int = 0
    num_cols: int = 1
    kind: int = KIND_PDI_INSTS


def _check(arch: str, kernels: list[Kernel]) -> None:
    if not kernels:
        raise ValueError(f"section {arch}: no kernels")
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise ValueError(f"section {arch}: duplicate kernel names")
    for k in kernels:
        if not k.name or "\0" in k.name:
            raise ValueError(f"bad kernel name {k.name!r}")
        if not k.insts or k.num_cols < 1:
            raise ValueError(f"kernel {k.name}: empty instructions or no columns")
        if k.kind == KIND_PDI_INSTS and (not k.pdi or len(k.insts) % 4):
            raise ValueError(f"kernel {k.name}: needs a PDI and whole 32-bit words")
        if k.kind == KIND_FULL_ELF and (k.pdi or arch == "aie2"):
            raise ValueError(f"kernel {k.name}: a full ELF has no PDI and needs aie2p")


def build_section(arch: str, kernels: list[Kernel]) -> bytes:
    """The bytes of one AIE section."""
    _check(arch, kernels)
    strings = b""
    name_offs = []
    for k in kernels:
        name_offs.append(len(strings))
        strings += k.name.encode() + b"\0"
    str_off = HEADER_SIZE + ENTRY_SIZE * len(kernels)
    pool_off = str_off + len(strings)
    pool = bytearray()
    placed: dict[bytes, int] = {}

    def place(blob: bytes) -> int:
        if blob not in placed:
            placed[blob] = pool_off + len(pool)
            pool.extend(blob)
        return placed[blob]

    entries = b""
    for k, name_off in zip(kernels, name_offs):
        insts_off = place(k.insts)
        pdi_off = place(k.pdi) if k.pdi else 0
        entries += struct.pack(
            "<8I12x",
            name_off,
            insts_off,
            len(k.insts),
            pdi_off,
            len(k.pdi),
            k.kernarg_size,
            k.num_cols,
            k.kind,
        )
    header = struct.pack(
        "<IHH6I16x",
        MAGIC,
        1,
        0,
        HEADER_SIZE,
        len(kernels),
        ENTRY_SIZE,
        str_off,
        len(strings),
        pool_off,
    )
    return header + entries + strings + bytes(pool)


def write(sections: dict[str, list[Kernel]]) -> bytes:
    """An hsaco file with one section per architecture, in the dict's order."""
    bodies = [(arch, build_section(arch, ks)) for arch, ks in sections.items()]
    shstrtab = b"\0.shstrtab\0"
    name_offs = []
    for arch, _ in bodies:
        name_offs.append(len(shstrtab))
        shstrtab += arch.encode() + b"\0"
    out = bytearray(64)
    shstrtab_off = len(out)
    out += shstrtab
    offs = []
    for _, body in bodies:
        offs.append(len(out))
        out += body
    out += b"\0" * (-len(out) % 8)
    shoff = len(out)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    out[0:64] = ident + struct.pack(
        "<HHIQQQIHHHHHH",
        _ET_REL,
        _EM_AMDGPU,
        1,
        0,
        0,
        shoff,
        0,
        64,
        0,
        0,
        64,
        2 + len(bodies),
        1,
    )

    def section_header(name: int, kind: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, off, size, 0, 0, 1, 0)

    out += section_header(0, 0, 0, 0)
    out += section_header(1, 3, shstrtab_off, len(shstrtab))
    for (_, body), off, name in zip(bodies, offs, name_offs):
        out += section_header(name, 1, off, len(body))
    return bytes(out)


def single_kernel(arch: str, name: str, pdi: bytes, insts: bytes, n_args: int, num_cols: int):
    """The hsaco of one PDI + instruction stream kernel taking `n_args` buffers (16 kernarg bytes
    each: an address and a size), as the backend wraps kernels itself under packet ABI c."""
    kernel = Kernel(name, insts, pdi, kernarg_size=16 * n_args, num_cols=num_cols)
    return write({arch: [kernel]})
