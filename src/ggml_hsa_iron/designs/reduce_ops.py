"""Reductions of two operands to one scalar: COUNT_EQUAL and CROSS_ENTROPY_LOSS.

Layout (plan from `plans_reduce.plan_reduce`): C columns, one worker each at compute row 2,
fed by its shim tile: operand a and operand b in objects of T elements, the column's share
(`spec.share(c)`) as one linear DMA task per operand. Each worker calls
`ggml_reduce_chunk(a, b)` on every pair of objects and `ggml_reduce_end(partial)` once, into
a one-element FIFO. The memory tile of column 0 joins the C partials into one object, which
the combining worker (column 0, compute row 3) turns into the output with
`ggml_reduce_combine(partials, out)`; column 0's shim tile drains it.

Runtime-sequence arguments: a, b, the output (one element).
"""

from aie.helpers.taplib import TensorAccessPattern
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.controlflow import range_
from aie.iron.device import Tile
from aie.iron.runtime import TaskGroup

from ._common import device, vector_type

OBJECT = "reduce.o"
SHIM_ROW, MEM_ROW, WORK_ROW, COMBINE_ROW = 0, 1, 2, 3


def build(spec):
    p = spec.plan
    C, T = p.columns, p.chunk
    dev = device(spec.arch, C)
    seq_types = [vector_type(count, t) for t, count in spec.sequence]
    in_obj = vector_type(T, spec.in_type)
    part_obj = vector_type(1, spec.part_type)
    parts_obj = vector_type(C, spec.part_type)
    out_obj = vector_type(1, spec.out.dtype)

    k_begin = Kernel("ggml_reduce_begin", OBJECT, [])
    k_chunk = Kernel("ggml_reduce_chunk", OBJECT, [in_obj, in_obj])
    k_end = Kernel("ggml_reduce_end", OBJECT, [part_obj])
    k_combine = Kernel("ggml_reduce_combine", OBJECT, [parts_obj, out_obj])

    def reduce_core(of_a, of_b, of_p, begin, chunk, end):
        begin()
        for _ in range_(p.iterations):
            a = of_a.acquire(1)
            b = of_b.acquire(1)
            chunk(a, b)
            of_a.release(1)
            of_b.release(1)
        part = of_p.acquire(1)
        end(part)
        of_p.release(1)

    def combine_core(of_parts, of_out, combine):
        parts = of_parts.acquire(1)
        out = of_out.acquire(1)
        combine(parts, out)
        of_parts.release(1)
        of_out.release(1)

    parts_fifo = ObjectFifo(parts_obj, name="partials", depth=1)
    part_fifos = parts_fifo.prod().join(
        list(range(C)),
        obj_types=[part_obj] * C,
        names=[f"partial_c{c}" for c in range(C)],
        depths=[1] * C,
        tile=Tile(0, MEM_ROW),
    )
    out_fifo = ObjectFifo(out_obj, name="out", depth=1)
    a_fifos, b_fifos, workers = [], [], []
    for c in range(C):
        fa = ObjectFifo(in_obj, name=f"a_c{c}", depth=p.depth)
        fb = ObjectFifo(in_obj, name=f"b_c{c}", depth=p.depth)
        a_fifos.append(fa)
        b_fifos.append(fb)
        args = [fa.cons(), fb.cons(), part_fifos[c].prod(), k_begin, k_chunk, k_end]
        workers.append(Worker(reduce_core, fn_args=args, tile=Tile(c, WORK_ROW)))
    workers.append(
        Worker(
            combine_core,
            fn_args=[parts_fifo.cons(), out_fifo.prod(), k_combine],
            tile=Tile(0, COMBINE_ROW),
        )
    )

    handles = []
    for c in range(C):
        shim = Tile(c, SHIM_ROW)
        handles += [a_fifos[c].prod(tile=shim), b_fifos[c].prod(tile=shim)]
    drain = out_fifo.cons(tile=Tile(0, SHIM_ROW))
    totals = [spec.a.nelements, spec.b.nelements]

    def sequence(a_buf, b_buf, out_buf, *hs):
        fills, h_out = hs[:-1], hs[-1]
        tg = TaskGroup()
        for c in range(C):
            offset, count = spec.share(c)
            for buf, h, total in (
                (a_buf, fills[2 * c], totals[0]),
                (b_buf, fills[2 * c + 1], totals[1]),
            ):
                # One linear run per operand and column (no wrap limit on a linear transfer).
                tap = TensorAccessPattern((total,), offset, [1, 1, 1, count], [0, 0, 0, 1])
                h.fill(buf, tap=tap, group=tg)
        h_out.drain(
            out_buf,
            tap=TensorAccessPattern((1,), 0, [1, 1, 1, 1], [0, 0, 0, 1]),
            group=tg,
            wait=True,
        )
        tg.finish()

    rt = Runtime(sequence, [*seq_types, *handles, drain])
    return Program(dev, rt, workers=workers).resolve_program()


def ggml_op_count_equal(spec):
    """GGML COUNT_EQUAL: how many elements of two i32 tensors are equal, as one i64."""
    return build(spec)


def ggml_op_cross_entropy_loss(spec):
    """GGML CROSS_ENTROPY_LOSS: -(1/rows) * sum over rows of sum(labels * log_softmax(logits))."""
    return build(spec)
