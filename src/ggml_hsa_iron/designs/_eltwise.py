"""Element-wise design: unary ops, binary ops, binary ops with broadcast.

Layout (plan from `tiling.plan_eltwise`): C columns x R workers. Column c
streams its contiguous share of every operand from its shim tile to its memory
tile, which splits each object of R*T elements into R tiles of T, one per
compute tile of the column; results go back the same way, joined in the
memory tile. With a broadcast operand (input 1 smaller than the output), the
whole of input 1 goes from each column's shim tile straight to the column's
workers once per dispatch and stays there; the core function repeats it over
the output with running indices (no division per element).

Element counts that are not whole 32-bit words (an odd number of bf16
elements, say) are moved rounded up to whole words (`EltwiseSpec.padded`): the
operands' last DMA words are read and written whole, and the core function
gives the output's pad elements input 0's bits (see kernels/eltwise.cc).

GLU ops (act(x) * g) use the binary dataflow; an input whose rows are strided (the
fused form's halves of one tensor) is read row by row (`EltwiseSpec.fill_tap`), each
column's share being whole rows.

Runtime-sequence arguments: the inputs in request order, then the output,
which is the order the backend passes the operand addresses in.
"""

import numpy as np
from aie.helpers.taplib import TensorAccessPattern
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.controlflow import range_
from aie.iron.device import Tile

from ._common import device, vector_type

OBJECT = "eltwise.o"
SHIM_ROW = 0
MEM_ROW = 1


def _linear_tap(total: int, offset: int, length: int) -> TensorAccessPattern:
    """`length` contiguous elements from `offset` of a 1-D tensor of `total`."""
    return TensorAccessPattern((total,), offset, [1, 1, 1, length], [0, 0, 0, 1])


def _split_to_workers(fifo, column, rows, tile, dtype, name):
    """Consumer handles: memory tile `column` splits each object into `rows` tiles."""
    return fifo.cons().split(
        [tile * r for r in range(rows)],
        obj_types=[vector_type(tile, dtype)] * rows,
        names=[f"{name}_{r}" for r in range(rows)],
        tile=Tile(column, MEM_ROW),
    )


def _join_from_workers(fifo, column, rows, tile, dtype, name):
    return fifo.prod().join(
        [tile * r for r in range(rows)],
        obj_types=[vector_type(tile, dtype)] * rows,
        names=[f"{name}_{r}" for r in range(rows)],
        tile=Tile(column, MEM_ROW),
    )


def build(spec):
    p = spec.plan
    C, R, T, K = p.columns, p.rows, p.tile, p.iterations
    n = p.n
    dev = device(spec.arch, C)
    streamed = [0] if spec.kind in ("unary", "bcast") else [0, 1]
    # GLU (act(x) * g) has the binary ops' dataflow and core function signature.
    binary = spec.kind in ("binary", "glu")

    # Runtime-sequence tensors: inputs then output (the backend's operand order).
    seq_types = [vector_type(count, t) for t, count in spec.sequence]
    seq_types_count = [count for _, count in spec.sequence]

    tile_in = [vector_type(T, t) for t in spec.in_types]
    tile_out = vector_type(T, spec.out_type)

    if spec.kind == "unary":
        kern = Kernel("ggml_eltwise_unary", OBJECT, [tile_in[0], tile_out])
    elif binary:
        kern = Kernel("ggml_eltwise_binary", OBJECT, [tile_in[0], tile_in[1], tile_out])
    else:
        b_type = seq_types[1]
        kern = Kernel("ggml_eltwise_bcast", OBJECT, [tile_in[0], b_type, tile_out])
    # With a broadcast operand, or pad elements in the last tile, the core function
    # needs the logical index of its tiles: given once per dispatch.
    kern_begin = None
    if spec.needs_begin:
        kern_begin = Kernel("ggml_eltwise_begin", OBJECT, [np.int32, np.int32])

    def core_unary(of_a, of_out, fn):
        for _ in range_(K):
            a = of_a.acquire(1)
            o = of_out.acquire(1)
            fn(a, o)
            of_a.release(1)
            of_out.release(1)

    def core_unary_begin(of_a, of_out, fn, fn_begin, start, step):
        fn_begin(start, step)
        core_unary(of_a, of_out, fn)

    def core_binary_begin(of_a, of_b, of_out, fn, fn_begin, start, step):
        fn_begin(start, step)
        core_binary(of_a, of_b, of_out, fn)

    def core_binary(of_a, of_b, of_out, fn):
        for _ in range_(K):
            a = of_a.acquire(1)
            b = of_b.acquire(1)
            o = of_out.acquire(1)
            fn(a, b, o)
            of_a.release(1)
            of_b.release(1)
            of_out.release(1)

    def core_bcast(of_a, of_b, of_out, fn_begin, fn, start, step):
        b = of_b.acquire(1)
        fn_begin(start, step)
        for _ in range_(K):
            a = of_a.acquire(1)
            o = of_out.acquire(1)
            fn(a, b, o)
            of_a.release(1)
            of_out.release(1)
        of_b.release(1)

    col_in = {j: [] for j in streamed}
    col_out, col_b, workers = [], [], []
    for c in range(C):
        subs = {}
        for j in streamed:
            fifo = ObjectFifo(vector_type(R * T, spec.in_types[j]), name=f"in{j}_c{c}")
            col_in[j].append(fifo)
            subs[j] = _split_to_workers(fifo, c, R, T, spec.in_types[j], f"in{j}_c{c}_w")
        out_fifo = ObjectFifo(vector_type(R * T, spec.out_type), name=f"out_c{c}")
        col_out.append(out_fifo)
        out_subs = _join_from_workers(out_fifo, c, R, T, spec.out_type, f"out_c{c}_w")
        if spec.kind == "bcast":
            b_fifo = ObjectFifo(seq_types[1], name=f"bc_c{c}", depth=1)
            col_b.append(b_fifo)
        for r in range(R):
            tile = Tile(c, 2 + r)
            begin = [kern_begin, p.start(c, r), p.step]
            if spec.kind == "unary":
                args = [subs[0][r].cons(), out_subs[r].prod(), kern]
                if kern_begin is None:
                    w = Worker(core_unary, fn_args=args, tile=tile)
                else:
                    w = Worker(core_unary_begin, fn_args=args + begin, tile=tile)
            elif binary:
                args = [subs[0][r].cons(), subs[1][r].cons(), out_subs[r].prod(), kern]
                if kern_begin is None:
                    w = Worker(core_binary, fn_args=args, tile=tile)
                else:
                    w = Worker(core_binary_begin, fn_args=args + begin, tile=tile)
            else:
                args = [
                    subs[0][r].cons(),
                    col_b[c].cons(),
                    out_subs[r].prod(),
                    kern_begin,
                    kern,
                    p.start(c, r),
                    p.step,
                ]
                w = Worker(core_bcast, fn_args=args, tile=tile)
            workers.append(w)

    chunk = p.column_chunk
    # Runtime endpoints: each column's shim tile fills the streamed inputs (and the
    # broadcast operand) and drains the output.
    fills = []
    for c in range(C):
        shim = Tile(c, SHIM_ROW)
        for j in streamed:
            fills.append((c, j, col_in[j][c].prod(tile=shim)))
        if spec.kind == "bcast":
            fills.append((c, None, col_b[c].prod(tile=shim)))
    drains = [col_out[c].cons(tile=Tile(c, SHIM_ROW)) for c in range(C)]
    n_seq = len(seq_types)

    def sequence(*args):
        bufs, handles = args[:n_seq], args[n_seq:]
        for (c, j, _), h in zip(fills, handles[: len(fills)]):
            if j is None:
                h.fill(bufs[1])
            else:
                # Dense inputs are read linearly; GLU's strided halves row by row.
                offset, sizes, strides = spec.fill_tap(j, c * chunk, chunk)
                total = seq_types_count[j]
                h.fill(
                    bufs[j], tap=TensorAccessPattern((total,), offset, list(sizes), list(strides))
                )
        for c, h in enumerate(handles[len(fills) :]):
            h.drain(bufs[-1], tap=_linear_tap(n, c * chunk, chunk), wait=True)

    rt = Runtime(sequence, [*seq_types, *(h for _, _, h in fills), *drains])
    return Program(dev, rt, workers=workers).resolve_program()
