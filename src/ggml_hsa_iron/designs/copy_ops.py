"""The copies (DUP, CPY, CONT) and the KV-cache write (SET_ROWS). Plans: plans_copy.py; core
functions: kernels/copy.cc.

DUP / CPY / CONT: the element-wise dataflow (as designs/_eltwise.py for a unary op): C
columns x R workers; column c's shim tile streams its contiguous share of the logical
(row-major) order to its memory tile, which splits each object of R*T elements into R tiles
of T, one per worker; the converted tiles are joined there and go back. A strided operand
(a permuted or sliced view, llama's permuted attention output before CONT) is read or
written by the shim DMA along its strides (`CopySpec.fill_tap`, `drain_tap`), so the cores
only ever see elements in logical order.

SET_ROWS: C columns, one worker each. Per slab (i2, i3) of the destination, column c's shim
sends one side object (the slab's indices, then its source rows, as bytes: one FIFO, a
compute tile has two input channels) and streams the column's rows of the slab in tiles of
T rows; the core copies each tile, overwrites the rows whose index falls in it with the
converted source rows (in order: a later row wins, as in ggml-cpu), and sends it back to the
same place. The destination is read and written whole: a runtime sequence's addresses are
fixed when the design is built and the indices are data.

Runtime-sequence arguments: the inputs in request order, then the output.
"""

import numpy as np
from aie.helpers.taplib import TensorAccessPattern
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.controlflow import range_
from aie.iron.device import Tile
from aie.iron.runtime import TaskGroup

from ._common import device, vector_type

OBJECT = "copy.o"
SHIM_ROW = 0
MEM_ROW = 1
FIRST_CORE_ROW = 2


def _tap(total: int, tap) -> TensorAccessPattern:
    offset, sizes, strides = tap
    return TensorAccessPattern((total,), offset, list(sizes), list(strides))


def _build_copy(spec):
    p = spec.plan
    C, R, T, K = p.columns, p.rows, p.tile, p.iterations
    dev = device(spec.arch, C)
    (st, s_total), (dt, _) = spec.sequence[:2]
    seq_types = [vector_type(n, t) for t, n in spec.sequence]
    totals = [n for _, n in spec.sequence]
    tile_in, tile_out = vector_type(T, st), vector_type(T, dt)
    kern = Kernel("ggml_copy", OBJECT, [tile_in, tile_out, np.int32])

    def core(of_in, of_out, fn):
        for _ in range_(K):
            a = of_in.acquire(1)
            o = of_out.acquire(1)
            fn(a, o, T)
            of_in.release(1)
            of_out.release(1)

    ins, outs, workers = [], [], []
    for c in range(C):
        fin = ObjectFifo(vector_type(R * T, st), name=f"in_c{c}")
        fout = ObjectFifo(vector_type(R * T, dt), name=f"out_c{c}")
        subs = fin.cons().split(
            [T * r for r in range(R)],
            obj_types=[tile_in] * R,
            names=[f"in_c{c}_w_{r}" for r in range(R)],
            tile=Tile(c, MEM_ROW),
        )
        joins = fout.prod().join(
            [T * r for r in range(R)],
            obj_types=[tile_out] * R,
            names=[f"out_c{c}_w_{r}" for r in range(R)],
            tile=Tile(c, MEM_ROW),
        )
        ins.append(fin)
        outs.append(fout)
        for r in range(R):
            workers.append(
                Worker(core, fn_args=[subs[r].cons(), joins[r].prod(), kern], tile=Tile(c, 2 + r))
            )

    fills = [ins[c].prod(tile=Tile(c, SHIM_ROW)) for c in range(C)]
    drains = [outs[c].cons(tile=Tile(c, SHIM_ROW)) for c in range(C)]
    chunk = p.column_chunk

    n_out = len(seq_types) - 1

    def sequence(src, *rest):
        # The source, the output(s) (CPY_ROWS: one per row), then the shim endpoints.
        dsts, handles = rest[:n_out], rest[n_out:]
        for c, h in enumerate(handles[:C]):
            h.fill(src, tap=_tap(s_total, spec.fill_tap(c * chunk, chunk)))
        for c, h in enumerate(handles[C:]):
            for j, tap in spec.drains(c):
                h.drain(dsts[j], tap=_tap(totals[1 + j], tap), wait=True)

    rt = Runtime(sequence, [*seq_types, *fills, *drains])
    return Program(dev, rt, workers=workers).resolve_program()


def _build_set_rows(spec):
    C = spec.columns
    dev = device(spec.arch, C)
    (st, s_total), (_, i_total), (dt, d_total) = spec.sequence
    seq_types = [vector_type(s_total, st), vector_type(i_total, st), vector_type(d_total, dt)]
    side_obj = vector_type(spec.side_elems, st)
    tile_obj = vector_type(spec.tile_elems, dt)
    kern = Kernel("ggml_set_rows_tile", OBJECT, [side_obj, tile_obj, tile_obj])
    kern_begin = Kernel("ggml_set_rows_begin", OBJECT, [np.int32] * 5)
    slabs = spec.slabs
    tiles = spec.tiles_per_slab

    sizes = (spec.ne0, spec.r, spec.tile_rows, spec.rows_per_column)

    def core(of_side, of_in, of_out, fn, fn_begin, first_row):
        fn_begin(first_row, *sizes)
        for _ in range_(len(slabs)):
            side = of_side.acquire(1)
            for _ in range_(tiles):
                a = of_in.acquire(1)
                o = of_out.acquire(1)
                fn(side, a, o)
                of_in.release(1)
                of_out.release(1)
            of_side.release(1)

    sides, ins, outs, workers = [], [], [], []
    for c in range(C):
        side = ObjectFifo(side_obj, name=f"side_c{c}", depth=1)
        fin = ObjectFifo(tile_obj, name=f"dst_in_c{c}", depth=2)
        fout = ObjectFifo(tile_obj, name=f"dst_out_c{c}", depth=2)
        sides.append(side)
        ins.append(fin)
        outs.append(fout)
        args = [side.cons(), fin.cons(), fout.prod(), kern, kern_begin, c * spec.rows_per_column]
        workers.append(Worker(core, fn_args=args, tile=Tile(c, FIRST_CORE_ROW)))

    handles = []
    for c in range(C):
        shim = Tile(c, SHIM_ROW)
        handles += [sides[c].prod(tile=shim), ins[c].prod(tile=shim)]
    handles += [outs[c].cons(tile=Tile(c, SHIM_ROW)) for c in range(C)]

    def sequence(src, idx, dst, *hs):
        for i2, i3 in slabs:
            tg = TaskGroup()
            for c in range(C):
                h_side, h_in, h_out = hs[2 * c], hs[2 * c + 1], hs[2 * C + c]
                h_side.fill(idx, tap=_tap(i_total, spec.idx_tap(i2, i3)), group=tg)
                h_side.fill(src, tap=_tap(s_total, spec.src_tap(i2, i3)), group=tg)
                h_in.fill(dst, tap=_tap(d_total, spec.dst_tap(i2, i3, c)), group=tg)
                h_out.drain(dst, tap=_tap(d_total, spec.dst_tap(i2, i3, c)), group=tg, wait=True)
            tg.finish()

    rt = Runtime(sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def ggml_op_dup(spec):
    """GGML DUP: the input copied (and converted) into the output in logical order."""
    return _build_copy(spec)


def ggml_op_cpy(spec):
    """GGML CPY: the input copied (and converted) into the output in logical order."""
    return _build_copy(spec)


def ggml_op_cont(spec):
    """GGML CONT: a strided view made contiguous (and converted) in logical order."""
    return _build_copy(spec)


def ggml_op_cpy_rows(spec):
    """CPY_ROWS: the rows copied (and converted) into as many one-row outputs: CPY's dataflow,
    each column's share drained into the rows it spans."""
    return _build_copy(spec)


def ggml_op_set_rows(spec):
    """GGML SET_ROWS: source rows scattered into the destination by their indices."""
    return _build_set_rows(spec)
