"""ROPE and ROPE_FF (frequency factors): normal and NeoX modes, f32 or f16 data.

Layout (plan `plans.RopeSpec.plan`, an element-wise plan over rows of x): C columns x R
workers. Column c streams its contiguous share of x's rows (whole i2 groups, or whole i3
slices) from its shim tile to its memory tile, which splits each object of R*T rows into
R tiles of T rows, one per compute tile; beside it, each row's position (positions[i2],
the shim DMA repeating each position ne1 times with a stride-0 dimension) goes the same
way, T positions per tile. Results are joined in the memory tile and written back.
ROPE_FF: the frequency factors (n_dims/2 f32, as 32-bit words) go first on each column's
positions FIFO, n_dims/2 / T objects giving every worker the same T factors (a compute
tile has two input DMA channels, x and the positions take both); the core keeps them.

The core function (kernels/rope.cc) computes the cos/sin cache of a position when a row's
position differs from the previous row's (a position's heads share it) and rotates each
row; dimensions past n_dims are copied.

Runtime-sequence arguments: x, positions, [frequency factors,] output (request order).
"""

import numpy as np
from aie.helpers.taplib import TensorAccessPattern
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.controlflow import range_
from aie.iron.device import Tile

from ._common import device, vector_type

OBJECT = "rope.o"
SHIM_ROW = 0
MEM_ROW = 1


def _split(fifo, column, rows, elems, dtype, name):
    return fifo.cons().split(
        [elems * r for r in range(rows)],
        obj_types=[vector_type(elems, dtype)] * rows,
        names=[f"{name}_{r}" for r in range(rows)],
        tile=Tile(column, MEM_ROW),
    )


def _build(spec):
    p = spec.plan
    C, R, T, K = p.columns, p.rows, p.tile, p.iterations
    ne0, xt = spec.ne0, spec.x.dtype
    has_ff = spec.ff is not None
    dev = device(spec.arch, C)
    seq = spec.sequence
    seq_types = [vector_type(count, t) for t, count in seq]
    totals = [count for _, count in seq]

    x_tile, pos_tile = vector_type(T * ne0, xt), vector_type(T, "i32")
    rope = Kernel("ggml_rope", OBJECT, [x_tile, pos_tile, x_tile])
    begin = Kernel("ggml_rope_begin", OBJECT, [])
    ff_part = Kernel("ggml_rope_ff", OBJECT, [pos_tile, np.int32]) if has_ff else None
    ff_objects = spec.ff_objects

    def core(of_x, of_pos, of_out, fn, fn_begin):
        fn_begin()
        rows(of_x, of_pos, of_out, fn)

    def core_ff(of_x, of_pos, of_out, fn, fn_begin, fn_ff):
        fn_begin()
        # The frequency factors come first on the positions' FIFO.
        for j in range(ff_objects):
            part = of_pos.acquire(1)
            fn_ff(part, j)
            of_pos.release(1)
        rows(of_x, of_pos, of_out, fn)

    def rows(of_x, of_pos, of_out, fn):
        for _ in range_(K):
            x = of_x.acquire(1)
            ps = of_pos.acquire(1)
            o = of_out.acquire(1)
            fn(x, ps, o)
            of_x.release(1)
            of_pos.release(1)
            of_out.release(1)

    x_cols, pos_cols, out_cols, workers = [], [], [], []
    for c in range(C):
        x_fifo = ObjectFifo(vector_type(R * T * ne0, xt), name=f"x_c{c}")
        pos_fifo = ObjectFifo(vector_type(R * T, "i32"), name=f"pos_c{c}")
        out_fifo = ObjectFifo(vector_type(R * T * ne0, xt), name=f"out_c{c}")
        x_subs = _split(x_fifo, c, R, T * ne0, xt, f"x_c{c}_w")
        pos_subs = _split(pos_fifo, c, R, T, "i32", f"pos_c{c}_w")
        out_subs = out_fifo.prod().join(
            [T * ne0 * r for r in range(R)],
            obj_types=[x_tile] * R,
            names=[f"out_c{c}_w_{r}" for r in range(R)],
            tile=Tile(c, MEM_ROW),
        )
        x_cols.append(x_fifo)
        pos_cols.append(pos_fifo)
        out_cols.append(out_fifo)
        for r in range(R):
            a = [x_subs[r].cons(), pos_subs[r].cons(), out_subs[r].prod(), rope, begin]
            if has_ff:
                workers.append(Worker(core_ff, fn_args=a + [ff_part], tile=Tile(c, 2 + r)))
            else:
                workers.append(Worker(core, fn_args=a, tile=Tile(c, 2 + r)))

    handles = []
    for c in range(C):
        shim = Tile(c, SHIM_ROW)
        handles += [x_cols[c].prod(tile=shim), pos_cols[c].prod(tile=shim)]
    handles += [out_cols[c].cons(tile=Tile(c, SHIM_ROW)) for c in range(C)]
    chunk_rows = p.column_chunk  # rows per column
    n_x = totals[0]
    n_seq = len(seq_types)

    def sequence(*a):
        bufs, hs = a[:n_seq], a[n_seq:]
        x_buf, pos_buf, out_buf = bufs[0], bufs[1], bufs[-1]
        for c in range(C):
            hx, hp = hs[2 * c], hs[2 * c + 1]
            start = c * chunk_rows
            hx.fill(
                x_buf,
                tap=TensorAccessPattern(
                    (n_x,), start * ne0, [1, 1, 1, chunk_rows * ne0], [0, 0, 0, 1]
                ),
            )
            if has_ff:
                offset, sizes, strides = spec.ff_tap()
                hp.fill(
                    bufs[2],
                    tap=TensorAccessPattern((totals[2],), offset, list(sizes), list(strides)),
                )
            offset, sizes, strides = spec.pos_tap(start, chunk_rows)
            hp.fill(
                pos_buf,
                tap=TensorAccessPattern((totals[1],), offset, list(sizes), list(strides)),
            )
        drains = hs[2 * C :]
        for c, h in enumerate(drains):
            tap = TensorAccessPattern(
                (n_x,), c * chunk_rows * ne0, [1, 1, 1, chunk_rows * ne0], [0, 0, 0, 1]
            )
            h.drain(out_buf, tap=tap, wait=True)

    rt = Runtime(sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def ggml_op_rope(spec):
    """GGML ROPE (normal, NeoX): positions streamed per row, the core's cos/sin cache."""
    return _build(spec)


def ggml_op_rope_ff(spec):
    """GGML ROPE with frequency factors: as ROPE, the factors resident in every worker."""
    return _build(spec)
