"""ROPE and ROPE_FF (frequency factors): normal and NeoX modes, f32 or f16 data; the
output x's type, or f16 from f32 x (ROPE fused with the f16 KV-cache write: the core rounds
the rotated rows, so the output FIFOs carry f16 objects).

Layout (plan `plans.RopeSpec.plan`, an element-wise plan over rows of x): C columns x R
workers. Column c streams its contiguous share of x's rows (whole i2 groups, or whole i3
slices; x may be a view whose tokens lie apart, each token's rows contiguous) from its shim tile to its memory tile, which splits each object of R*T rows into
R tiles of T rows, one per compute tile; results are joined in the memory tile and written
back. The positions are not streamed per row: the column's shim sends one object per
dispatch straight to its R workers (a broadcast FIFO of depth 1), the table of the
positions the column's rows use (`RopeSpec.pos_table`: positions[i2] of its i2 groups, or
positions[0 .. ne2) when its share is whole i3 slices), which every worker holds while its
rows stream past and indexes by ((row in the column) / ne1) % ne2. ROPE_FF: the frequency
factors (n_dims/2 f32, as 32-bit words) come first in that object (a second fill task on
the same channel); the core copies them aside. No DMA walk repeats data (a stride-0
dimension), so every walk here is linear.

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
    ne0, xt, ot = spec.ne0, spec.x.dtype, spec.out.dtype
    has_ff = spec.ff is not None
    dev = device(spec.arch, C)
    seq = spec.sequence
    seq_types = [vector_type(count, t) for t, count in seq]
    totals = [count for _, count in seq]

    x_tile, table = vector_type(T * ne0, xt), vector_type(spec.table_words, "i32")
    out_tile = vector_type(T * ne0, ot)
    rope = Kernel("ggml_rope", OBJECT, [x_tile, table, out_tile])
    # (table, first row, row step): the worker's rows in its column are first + k * step + i.
    begin = Kernel("ggml_rope_begin", OBJECT, [table, np.int32, np.int32])

    def core(of_x, of_pos, of_out, fn, fn_begin, first_row):
        # The table arrives once per dispatch and is held while the rows stream past.
        tab = of_pos.acquire(1)
        fn_begin(tab, first_row, R * T)
        for _ in range_(K):
            x = of_x.acquire(1)
            o = of_out.acquire(1)
            fn(x, tab, o)
            of_x.release(1)
            of_out.release(1)
        of_pos.release(1)

    x_cols, pos_cols, out_cols, workers = [], [], [], []
    for c in range(C):
        x_fifo = ObjectFifo(vector_type(R * T * ne0, xt), name=f"x_c{c}")
        # Straight from the shim to every worker of the column (a broadcast), one object.
        pos_fifo = ObjectFifo(table, name=f"pos_c{c}", depth=1)
        out_fifo = ObjectFifo(vector_type(R * T * ne0, ot), name=f"out_c{c}")
        x_subs = _split(x_fifo, c, R, T * ne0, xt, f"x_c{c}_w")
        out_subs = out_fifo.prod().join(
            [T * ne0 * r for r in range(R)],
            obj_types=[out_tile] * R,
            names=[f"out_c{c}_w_{r}" for r in range(R)],
            tile=Tile(c, MEM_ROW),
        )
        x_cols.append(x_fifo)
        pos_cols.append(pos_fifo)
        out_cols.append(out_fifo)
        for r in range(R):
            a = [x_subs[r].cons(), pos_fifo.cons(), out_subs[r].prod(), rope, begin, r * T]
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
            offset, sizes, strides = spec.x_tap(start)
            hx.fill(x_buf, tap=TensorAccessPattern((n_x,), offset, list(sizes), list(strides)))
            # The table object: ROPE_FF's factors, then the column's positions (two tasks
            # on the channel, one object).
            if has_ff:
                offset, sizes, strides = spec.ff_tap()
                hp.fill(
                    bufs[2],
                    tap=TensorAccessPattern((totals[2],), offset, list(sizes), list(strides)),
                )
            offset, sizes, strides = spec.pos_tap(start)
            hp.fill(
                pos_buf,
                tap=TensorAccessPattern((totals[1],), offset, list(sizes), list(strides)),
            )
        drains = hs[2 * C :]
        n_out = totals[-1]
        for c, h in enumerate(drains):
            tap = TensorAccessPattern(
                (n_out,), c * chunk_rows * ne0, [1, 1, 1, chunk_rows * ne0], [0, 0, 0, 1]
            )
            h.drain(out_buf, tap=tap, wait=True)

    rt = Runtime(sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def ggml_op_rope(spec):
    """GGML ROPE (normal, NeoX): positions streamed per row, the core's cos/sin cache."""
    return _build(spec)


def ggml_op_rope_ff(spec):
    """GGML ROPE with frequency factors: as ROPE, the factors ahead of the positions table."""
    return _build(spec)
