"""The NPU generations the designs target.

aie2 is XDNA (Phoenix, Hawk Point): IRON's ``NPU1`` device, 4 usable columns.
aie2p is XDNA2 (Strix Point, Strix Halo, Krackan): ``NPU2``, 8 columns. Each
column has a shim tile (row 0, DMA to and from DDR), a memory tile (row 1,
512 KiB) and 4 compute tiles (rows 2-5, 64 KiB data memory each).
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arch:
    name: str
    device: str  # the aie.iron.device class
    columns: int
    compute_rows: int
    peano_target: str  # clang --target of Peano
    l1_bytes: int  # data memory of one compute tile
    l1_budget: int  # what the designs allow themselves for buffers (stack, locks aside)
    memtile_bytes: int
    # aie::mmul shapes (r, s, t) per (input type): A is r x s, B is s x t. Compared, not
    # hashed (a dict): the name and sizes tell Archs apart for the planners' caches.
    mmul: dict = field(hash=False)
    # DRAM bytes per array cycle, every shim channel together: what the planners weigh a
    # plan's traffic with (a shim channel moves 4 bytes per cycle, AM020). Published DRAM
    # rates over estimated clocks (the NPU's clock is not published): XDNA2 47-67 GB/s
    # measured, 56 over ~1.53 GHz; XDNA ~28 GB/s (7 GB/s per column, qvac) over ~1.0 GHz.
    dram_bytes_per_cycle: float

    @property
    def first_compute_row(self) -> int:
        return 2


ARCHS: dict[str, Arch] = {
    "aie2": Arch(
        name="aie2",
        device="NPU1",
        columns=4,
        compute_rows=4,
        peano_target="aie2-none-unknown-elf",
        l1_bytes=64 * 1024,
        l1_budget=48 * 1024,
        memtile_bytes=512 * 1024,
        mmul={"bf16": (4, 8, 4), "i8": (4, 8, 8), "i16": (4, 4, 4)},
        dram_bytes_per_cycle=28.0,
    ),
    "aie2p": Arch(
        name="aie2p",
        device="NPU2",
        columns=8,
        compute_rows=4,
        peano_target="aie2p-none-unknown-elf",
        l1_bytes=64 * 1024,
        l1_budget=48 * 1024,
        memtile_bytes=512 * 1024,
        mmul={"bf16": (4, 8, 8), "i8": (8, 8, 8), "i16": (4, 4, 8)},
        dram_bytes_per_cycle=36.6,
    ),
}


def arch(name: str) -> Arch:
    try:
        return ARCHS[name]
    except KeyError:
        raise KeyError(f"unknown arch {name!r} (supported: aie2, aie2p)") from None
