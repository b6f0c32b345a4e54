"""Designs that mirror published designs whose times on real NPUs are published, for the
calibration of hsa-sim's timing model (crates/hsa-sim/tests/timing_calibration.rs,
docs/timing-model.md). Each mirrors its original by its published facts (columns, tiles,
fifo depths, channel use, the runtime sequence's tasks and groups), not by its code; the core
functions are ours (calibration_cores.cc), vectorized as the originals are.

`python3 -m ggml_hsa_iron.tests.calibration NAME ARCH IMAGE` writes design NAME for ARCH as
an emulation image (what `--target emu compile` writes).
"""

import hashlib
import sys
from pathlib import Path

import numpy as np

from ggml_hsa_iron.emu import install, iron
from ggml_hsa_iron.emu.build import build_library
from ggml_hsa_iron.emu.compile import check_objects, image_bytes
from ggml_hsa_iron.plans import CoreSource

CORES = Path(__file__).resolve().parent / "calibration_cores.cc"
OBJECT = "cal.o"


def _core(**defines) -> CoreSource:
    # The library cache keys on the wrapper's text, which names this file but does not hold
    # it: its hash goes in as a define.
    digest = hashlib.sha256(CORES.read_bytes()).hexdigest()[:16]
    return CoreSource(str(CORES), OBJECT, {**defines, "CAL_SOURCE": f"0x{digest}"})


def memcpy(arch: str, columns: int = 8, channels: int = 2, words: int = 16 * 1024 * 1024):
    """mlir-aie `programming_examples/basic/memcpy` with its README's task groups: every
    column's shim streams `channels` contiguous chunks of the int32 input, each through one
    passthrough core in lines of 1024 words (fifos of depth 2), back to the output; every fill
    and drain in one task group, the drains awaited together. Xilinx/mlir-aie PR #2559: 16M
    words (64 MiB in + 64 MiB out) in 2016 µs on NPU2."""
    from aie.helpers.taplib import TensorAccessPattern
    from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
    from aie.iron.controlflow import range_
    from aie.iron.device import NPU1, NPU2, Tile
    from aie.iron.runtime import TaskGroup

    line = 1024
    n = columns * channels
    chunk = words // n
    line_t = np.ndarray[(line,), np.dtype[np.int32]]
    all_t = np.ndarray[(words,), np.dtype[np.int32]]
    copy = Kernel("cal_passthrough", OBJECT, [line_t, line_t, np.int32])

    def core(of_in, of_out, fn):
        for _ in range_(chunk // line):
            o = of_out.acquire(1)
            i = of_in.acquire(1)
            fn(i, o, line)
            of_in.release(1)
            of_out.release(1)

    ins = [ObjectFifo(line_t, name=f"in{k}") for k in range(n)]
    outs = [ObjectFifo(line_t, name=f"out{k}") for k in range(n)]
    workers = [
        Worker(
            core,
            fn_args=[ins[k].cons(), outs[k].prod(), copy],
            tile=Tile(k // channels, 2 + k % channels),
        )
        for k in range(n)
    ]
    fills = [ins[k].prod(tile=Tile(k // channels, 0)) for k in range(n)]
    drains = [outs[k].cons(tile=Tile(k // channels, 0)) for k in range(n)]

    def tap(k):
        return TensorAccessPattern((words,), k * chunk, [1, 1, 1, chunk], [0, 0, 0, 1])

    def sequence(a, b, *handles):
        group = TaskGroup()
        for k, h in enumerate(handles[:n]):
            h.fill(a, tap=tap(k), group=group)
        for k, h in enumerate(handles[n:]):
            h.drain(b, tap=tap(k), group=group, wait=True)
        group.finish()

    dev = (NPU2 if arch == "aie2p" else NPU1)()
    rt = Runtime(sequence, [all_t, all_t, *fills, *drains])
    return Program(dev, rt, workers=workers).resolve_program(), _core()


def gemv(arch: str, m: int = 2048, k: int = 8192, columns: int = 8, m_out: int = 256):
    """amd/IRON `iron/operators/gemv` (its test's 2048 x 8192 case on 8 columns, tile sizes 1
    and 256): bf16 A streamed one row per object (depth 2) from each column's shim straight to
    its one core, which keeps the whole bf16 vector B (depth 1) and sends `m_out` results per
    object (depth 2); B's fills in one task group, then per column A's fill and C's drain,
    awaited. Xilinx/mlir-air PR #1360 quotes amd/IRON at 682 µs (49.2 GB/s) on NPU2."""
    from aie.helpers.taplib import TensorAccessPattern
    from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
    from aie.iron.controlflow import range_
    from aie.iron.device import NPU1, NPU2, Tile
    from ml_dtypes import bfloat16

    bf16 = np.dtype[bfloat16]
    rows = m // columns
    a_t = np.ndarray[(k,), bf16]
    b_t = np.ndarray[(k,), bf16]
    c_t = np.ndarray[(m_out,), bf16]
    # amd/IRON's kernel takes the row's place in C as an argument; the stand-in's calls take
    # constants only, so ours counts the rows itself.
    matvec = Kernel("cal_matvec", OBJECT, [a_t, b_t, c_t])

    def core(of_a, of_b, of_c, fn):
        b = of_b.acquire(1)
        for _ in range_(rows // m_out):
            c = of_c.acquire(1)
            for _ in range_(m_out):
                a = of_a.acquire(1)
                fn(a, b, c)
                of_a.release(1)
            of_c.release(1)
        of_b.release(1)

    fa = [ObjectFifo(a_t, name=f"A{c}", depth=2) for c in range(columns)]
    fb = [ObjectFifo(b_t, name=f"B{c}", depth=1) for c in range(columns)]
    fc = [ObjectFifo(c_t, name=f"C{c}", depth=2) for c in range(columns)]
    workers = [
        Worker(core, fn_args=[fa[c].cons(), fb[c].cons(), fc[c].prod(), matvec], tile=Tile(c, 2))
        for c in range(columns)
    ]
    shim = [Tile(c, 0) for c in range(columns)]
    handles = [fb[c].prod(tile=shim[c]) for c in range(columns)]
    handles += [fa[c].prod(tile=shim[c]) for c in range(columns)]
    handles += [fc[c].cons(tile=shim[c]) for c in range(columns)]

    def sequence(a, b, out, *hs):
        from aie.iron.runtime import TaskGroup

        tg_b = TaskGroup()
        for c in range(columns):
            hs[c].fill(b, tap=TensorAccessPattern((k,), 0, [1, 1, 1, k], [0, 0, 0, 1]), group=tg_b)
        tg = TaskGroup()
        for c in range(columns):
            tap = TensorAccessPattern((m * k,), c * rows * k, [1, 1, 1, rows * k], [0, 0, 0, 1])
            hs[columns + c].fill(a, tap=tap, group=tg)
        for c in range(columns):
            tap = TensorAccessPattern((m,), c * rows, [1, 1, 1, rows], [0, 0, 0, 1])
            hs[2 * columns + c].drain(out, tap=tap, group=tg, wait=True)
        tg.finish()
        tg_b.finish()

    dev = (NPU2 if arch == "aie2p" else NPU1)()
    types = [np.ndarray[(m * k,), bf16], np.ndarray[(k,), bf16], np.ndarray[(m,), bf16]]
    rt = Runtime(sequence, [*types, *handles])
    return Program(dev, rt, workers=workers).resolve_program(), _core(CAL_K=k, CAL_M_OUT=m_out)


def gemv_air(arch: str, m: int = 2048, k: int = 2048, columns: int = 8, tile_m: int = 8):
    """mlir-air `programming_examples/matrix_vector_multiplication/bf16` at its registry's best
    2048 x 2048 configuration (herd_m 8, tile_m 8, m_input 8): a 1-D herd of one core per
    column, each owning `tile_m` rows of every panel of `columns * tile_m` rows. A moves
    DRAM -> memory tile (L2) -> core (L1) in objects of `tile_m` rows, one buffer at each level:
    the builder's L2 budget holds one panel (`herd_m * tile_m * K * 2` bytes of A plus
    `herd_m * tile_m * 2` of C, at most 512 KiB), and two 32 KiB A tiles would not fit the
    64 KiB L1 beside B. C returns through L2 likewise; B (the vector) is loaded once. One
    kernel call per panel (`m_input = tile_m`), f32 accumulation of bf16 products in 32 lanes.
    Xilinx/mlir-air `kernel_registry/details/GEMV_bf16.md`: 330 µs on NPU2."""
    from aie.helpers.taplib import TensorAccessPattern
    from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
    from aie.iron.controlflow import range_
    from aie.iron.device import NPU1, NPU2, Tile
    from ml_dtypes import bfloat16

    bf16 = np.dtype[bfloat16]
    panels = m // (columns * tile_m)
    a_t = np.ndarray[(tile_m * k,), bf16]
    b_t = np.ndarray[(k,), bf16]
    c_t = np.ndarray[(tile_m,), bf16]
    matvec = Kernel("cal_matvec_rows", OBJECT, [a_t, b_t, c_t])

    def core(of_a, of_b, of_c, fn):
        b = of_b.acquire(1)
        for _ in range_(panels):
            c = of_c.acquire(1)
            a = of_a.acquire(1)
            fn(a, b, c)
            of_a.release(1)
            of_c.release(1)
        of_b.release(1)

    fa = [ObjectFifo(a_t, name=f"A{c}", depth=1) for c in range(columns)]
    fb = [ObjectFifo(b_t, name=f"B{c}", depth=1) for c in range(columns)]
    fc = [ObjectFifo(c_t, name=f"C{c}", depth=1) for c in range(columns)]
    a_l1 = [fa[c].cons().forward(tile=Tile(c, 1), depth=1, name=f"A{c}_l1") for c in range(columns)]
    c_l2 = [fc[c].cons().forward(tile=Tile(c, 1), depth=1, name=f"C{c}_l2") for c in range(columns)]
    workers = [
        Worker(core, fn_args=[a_l1[c].cons(), fb[c].cons(), fc[c].prod(), matvec], tile=Tile(c, 2))
        for c in range(columns)
    ]
    shim = [Tile(c, 0) for c in range(columns)]
    handles = [fb[c].prod(tile=shim[c]) for c in range(columns)]
    handles += [fa[c].prod(tile=shim[c]) for c in range(columns)]
    handles += [c_l2[c].cons(tile=shim[c]) for c in range(columns)]

    def sequence(a, b, out, *hs):
        from aie.iron.runtime import TaskGroup

        tg = TaskGroup()
        for c in range(columns):
            hs[c].fill(b, tap=TensorAccessPattern((k,), 0, [1, 1, 1, k], [0, 0, 0, 1]), group=tg)
        for c in range(columns):
            # A shim BD's innermost dimension runs at most 1023 words: runs of 1024 elements.
            sizes = [1, panels, tile_m * k // 1024, 1024]
            strides = [0, columns * tile_m * k, 1024, 1]
            tap = TensorAccessPattern((m * k,), c * tile_m * k, sizes, strides)
            hs[columns + c].fill(a, tap=tap, group=tg)
        for c in range(columns):
            strides = [0, 0, columns * tile_m, 1]
            tap = TensorAccessPattern((m,), c * tile_m, [1, 1, panels, tile_m], strides)
            hs[2 * columns + c].drain(out, tap=tap, group=tg, wait=True)
        tg.finish()

    dev = (NPU2 if arch == "aie2p" else NPU1)()
    types = [np.ndarray[(m * k,), bf16], np.ndarray[(k,), bf16], np.ndarray[(m,), bf16]]
    rt = Runtime(sequence, [*types, *handles])
    core_src = _core(CAL_K=k, CAL_ROWS=tile_m)
    return Program(dev, rt, workers=workers).resolve_program(), core_src


def gemm_air(
    arch: str,
    m: int = 2048,
    k: int = 2048,
    n: int = 2048,
    tile_m: int = 64,
    tile_k_l2: int = 512,
    tile_k_l1: int = 32,
    tile_n: int = 128,
    herd_m: int = 8,
    herd_n: int = 4,
):
    """mlir-air `programming_examples/matrix_multiplication/bf16_in_fp32_out`, external `mm.o`
    path (its registry's 8 x 4 herd, tiles m / k_l2 / k_l1 / n): C[M, N] = A[M, K] B[K, N],
    bf16 in, f32 out. One launch iteration per (tile_m * herd_m) x (tile_n * herd_n) block of
    C; in each, every core zeroes its f32 tile_m x tile_n accumulator in L1 and adds one
    tile_m x tile_k_l1 by tile_k_l1 x tile_n product per step of K, then drains it. Herd row
    x (the M block) is column x: its A rows go DRAM -> that column's memory tile -> the
    column's herd_n cores (broadcast); herd column y (the N block) is core row y: its B
    columns go DRAM -> a memory tile -> the herd_m cores of that row (broadcast); each
    column's cores' C tiles join in its memory tile on their way to DRAM. L1 A and B are
    double-buffered, the C accumulator single (the registry's L1 budget: f32 C 32 KiB + A/B
    ping-pong 24 KiB). The original's L2 buffers hold tile_k_l2 columns of A and rows of B
    (ping-ponged, aircc's default) and hand the cores tile_k_l1 slices of them; an IRON
    memory tile hands on objects of its own size, and a ring of tile_k_l1 objects that deep
    would need more buffer descriptors than a memory tile has, so the mirror double-buffers
    tile_k_l1 objects in L2: the same bytes over the same channels, in smaller transfers.

    The operands are in DRAM already in the cores' block order (the original's BDs reorder
    them on the way in, at no cost in the model): A as [M/R][K/S][R][S], B as
    [N/T][K/S][S][T], C written as [M-block][N-block][column][row][tile] of the kernel's
    [tile_m/R][tile_n/T][R][T] tiles (R, S, T: the arch's mmul shape, cal_matmul_bf16_f32).
    Xilinx/mlir-air `kernel_registry/details/GEMM_bf16_in_fp32_out.md`, measured on NPU2:
    8508 GFLOPS at 2048³ (tiles 64/512/32/128), 7342 at 2048 x 2048 x 512 (64/256/32/128)."""
    from aie.helpers.taplib import TensorAccessPattern
    from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
    from aie.iron.controlflow import range_
    from aie.iron.device import NPU1, NPU2, Tile
    from aie.iron.runtime import TaskGroup
    from ml_dtypes import bfloat16

    r, s, t = (8, 8, 8) if arch == "aie2p" else (4, 8, 4)
    assert m % (tile_m * herd_m) == 0 and n % (tile_n * herd_n) == 0
    assert k % tile_k_l2 == 0 and tile_k_l2 % tile_k_l1 == 0
    bf16 = np.dtype[bfloat16]
    f32 = np.dtype[np.float32]
    blocks_m, blocks_n, steps = m // (tile_m * herd_m), n // (tile_n * herd_n), k // tile_k_l1
    a_t = np.ndarray[(tile_m * tile_k_l1,), bf16]
    b_t = np.ndarray[(tile_k_l1 * tile_n,), bf16]
    c_t = np.ndarray[(tile_m * tile_n,), f32]
    c_col_t = np.ndarray[(herd_n * tile_m * tile_n,), f32]
    zero = Kernel("cal_zero_f32", OBJECT, [c_t])
    matmul = Kernel("cal_matmul_bf16_f32", OBJECT, [a_t, b_t, c_t])

    def core(of_a, of_b, of_c, zero_fn, mm_fn):
        for _ in range_(blocks_m * blocks_n):
            c = of_c.acquire(1)
            zero_fn(c)
            for _ in range_(steps):
                a = of_a.acquire(1)
                b = of_b.acquire(1)
                mm_fn(a, b, c)
                of_a.release(1)
                of_b.release(1)
            of_c.release(1)

    # B's memory tiles: spread over the columns, so that no shim or memory tile carries two.
    b_col = [(2 * y + 1) % herd_m for y in range(herd_n)]
    fa = [ObjectFifo(a_t, name=f"A{x}", depth=2) for x in range(herd_m)]
    fb = [ObjectFifo(b_t, name=f"B{y}", depth=2) for y in range(herd_n)]
    a_l1 = [fa[x].cons().forward(tile=Tile(x, 1), name=f"A{x}_l1") for x in range(herd_m)]
    b_l1 = [fb[y].cons().forward(tile=Tile(b_col[y], 1), name=f"B{y}_l1") for y in range(herd_n)]
    fc = [ObjectFifo(c_col_t, name=f"C{x}", depth=1) for x in range(herd_m)]
    tile_elems = tile_m * tile_n
    c_l1 = [
        fc[x]
        .prod()
        .join(
            [y * tile_elems for y in range(herd_n)],
            tile=Tile(x, 1),
            depths=[1] * herd_n,
            obj_types=[c_t] * herd_n,
            names=[f"C{x}_{y}" for y in range(herd_n)],
        )
        for x in range(herd_m)
    ]
    workers = [
        Worker(
            core,
            fn_args=[a_l1[x].cons(depth=2), b_l1[y].cons(depth=2), c_l1[x][y].prod(), zero, matmul],
            tile=Tile(x, 2 + y),
        )
        for x in range(herd_m)
        for y in range(herd_n)
    ]
    handles = [fa[x].prod(tile=Tile(x, 0)) for x in range(herd_m)]
    handles += [fb[y].prod(tile=Tile(b_col[y], 0)) for y in range(herd_n)]
    handles += [fc[x].cons(tile=Tile(x, 0)) for x in range(herd_m)]

    def sequence(a, b, out, *hs):
        group = TaskGroup()
        run = 512  # f32 words: a shim BD's innermost dimension runs at most 1023
        for bm in range(blocks_m):
            for x in range(herd_m):
                # A's rows of this M block for column x: [K steps][row blocks][K blocks x R x S],
                # again for every N block.
                row0 = bm * tile_m * herd_m + x * tile_m
                sizes = [blocks_n, steps, tile_m // r, tile_k_l1 * r]
                strides = [0, tile_k_l1 * r, k * r, 1]
                tap = TensorAccessPattern((m * k,), row0 * k, sizes, strides)
                hs[x].fill(a, tap=tap, group=group)
            for y in range(herd_n):
                # B's columns of core row y for every N block: [N blocks][K steps][column blocks][...].
                sizes = [blocks_n, steps, tile_n // t, tile_k_l1 * t]
                strides = [tile_n * herd_n * k, tile_k_l1 * t, k * t, 1]
                tap = TensorAccessPattern((k * n,), y * tile_n * k, sizes, strides)
                hs[herd_m + y].fill(b, tap=tap, group=group)
            for x in range(herd_m):
                per_block = herd_m * herd_n * tile_elems
                sizes = [1, blocks_n, herd_n * tile_elems // run, run]
                strides = [0, per_block, run, 1]
                first = bm * blocks_n * per_block + x * herd_n * tile_elems
                tap = TensorAccessPattern((m * n,), first, sizes, strides)
                hs[herd_m + herd_n + x].drain(out, tap=tap, group=group, wait=True)
        group.finish()

    dev = (NPU2 if arch == "aie2p" else NPU1)()
    types = [
        np.ndarray[(m * k,), bf16],
        np.ndarray[(k * n,), bf16],
        np.ndarray[(m * n,), f32],
    ]
    rt = Runtime(sequence, [*types, *handles])
    core_src = _core(CAL_TM=tile_m, CAL_TK=tile_k_l1, CAL_TN=tile_n)
    return Program(dev, rt, workers=workers).resolve_program(), core_src


def expand(arch: str, out: str = "bf16", calls: int = 64):
    """AMD's mlir-aie weight-expand examples (README "Explaining the weight expand examples":
    traces on AIE2; the repository holding it was not identified): one core upconverts 1024 int4 values, one scale per 32 after them (576
    bytes in), to 1024 bf16 (or int16) values * scale per call; `calls` objects streamed in
    and out through depth-2 fifos. Their published figures are the core's cycles per call
    (293 for bf16, 117 for int16), not the design's time: the output's DMA (2 KiB per call)
    binds the design."""
    from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
    from aie.iron.controlflow import range_
    from aie.iron.device import NPU1, NPU2, Tile
    from aie.iron.runtime import TaskGroup
    from ml_dtypes import bfloat16

    elem = np.dtype[np.int16] if out == "int16" else np.dtype[bfloat16]
    in_t = np.ndarray[(576,), np.dtype[np.int8]]
    out_t = np.ndarray[(1024,), elem]
    fn = Kernel(f"cal_expand_{out}", OBJECT, [in_t, out_t])

    def core(of_in, of_out, kernel):
        for _ in range_(calls):
            o = of_out.acquire(1)
            i = of_in.acquire(1)
            kernel(i, o)
            of_in.release(1)
            of_out.release(1)

    fin, fout = ObjectFifo(in_t, name="in"), ObjectFifo(out_t, name="out")
    worker = Worker(core, fn_args=[fin.cons(), fout.prod(), fn], tile=Tile(0, 2))
    handles = [fin.prod(tile=Tile(0, 0)), fout.cons(tile=Tile(0, 0))]

    def sequence(a, b, fill, drain):
        group = TaskGroup()
        fill.fill(a, group=group)
        drain.drain(b, group=group, wait=True)
        group.finish()

    dev = (NPU2 if arch == "aie2p" else NPU1)()
    types = [np.ndarray[(576 * calls,), np.dtype[np.int8]], np.ndarray[(1024 * calls,), elem]]
    rt = Runtime(sequence, [*types, *handles])
    return Program(dev, rt, workers=[worker]).resolve_program(), _core(CAL_EXPAND=1)


DESIGNS = {
    "memcpy": memcpy,
    "gemv": gemv,
    "gemv_air": gemv_air,
    "gemv_air_8192": lambda arch: gemv_air(arch, m=8192),
    "gemm_air_2048": lambda arch: gemm_air(arch),
    "gemm_air_2048_n512": lambda arch: gemm_air(arch, n=512, tile_k_l2=256),
    "gemm_air_2048_tn64": lambda arch: gemm_air(arch, tile_n=64),
    "expand_bf16": lambda arch: expand(arch, "bf16"),
    "expand_int16": lambda arch: expand(arch, "int16"),
    # A small GEMM whose result the test checks.
    "gemm_air_small": lambda arch: gemm_air(arch, m=1024, k=256, n=1024, tile_k_l2=128),
}


def image(name: str, arch: str) -> bytes:
    install()
    iron.reset()
    rec, core = DESIGNS[name](arch)
    check_objects(rec, [core])
    return image_bytes(rec.to_json(f"cal-{name}", arch), build_library([core], rec.kernels, arch))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in DESIGNS:
        sys.exit(
            f"usage: python3 -m ggml_hsa_iron.tests.calibration {{{','.join(DESIGNS)}}} ARCH IMAGE"
        )
    Path(sys.argv[3]).write_bytes(image(sys.argv[1], sys.argv[2]))
