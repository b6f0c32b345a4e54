"""Row design: ops that compute every row (dimension 0) of input 0 on its own, or reduce it.

RMS_NORM, NORM, SOFT_MAX (with mask, sinks, ALiBi), ARGMAX; the core function of each op is
compiled from kernels/rows.cc with -DGGML_OP_<OP>.

Layout (plan from `tiling.plan_rows`): C columns, one worker each. Column c takes the
`rows_per_column` consecutive rows starting at c * rows_per_column, streamed from its shim
tile straight to its worker in objects of `block` whole rows; the results go back the same
way. **Rows are resident**: a worker holds whole rows while it computes them (the norms'
two or three passes and SOFT_MAX's three passes run over the row in the compute tile), so
the row length is limited by the compute tile's 48 KiB budget with the FIFO depths (about
6000 f32 elements for the norms single-buffered, 4000 for SOFT_MAX with an f32 mask); longer
rows are refused (exit 2) before anything is built. The number of columns divides the rows
exactly, so no row is computed twice and in-place kernels (output = input) stay correct.

SOFT_MAX's mask comes through the column's second shim input channel, one DMA task per run
of x rows using consecutive mask rows (ggml repeats the mask over x's dimensions 2 and 3);
its sinks ride in the x objects (a compute tile has two input channels): behind the rows of
an object come their sinks, one DMA task per run of rows of one head (at most 64 rows: the
task's repeat count copies sinks[head], a BD's only dimension that may have stride 0).
RMS_NORM_MUL's weight row is sent once per dispatch from the shim tile of a column without
a worker to every worker (one broadcast FIFO) and stays resident. RMS_NORM_MUL_ADD's residual
rows come as a mask's do (beside x's, on the second input channel), and its weight row as the
first object of that channel (the row repeated to the object's rows by the task's repeat
count), which the worker copies into its static data: a core has two input channels.

Runtime-sequence arguments: the inputs in request order, then the output.
"""

import numpy as np
from aie.helpers.taplib import TensorAccessPattern
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.controlflow import range_
from aie.iron.device import Tile
from aie.iron.runtime import TaskGroup

from ._common import device, vector_type

OBJECT = "rows.o"
SHIM_ROW = 0
FIRST_CORE_ROW = 2


def _linear(total: int, offset: int, length: int) -> TensorAccessPattern:
    return TensorAccessPattern((total,), offset, [1, 1, 1, length], [0, 0, 0, 1])


def _mask_tap(spec, task) -> TensorAccessPattern:
    """The first `length` elements of `task.rows` mask rows `task.row_stride` apart; a row
    is walked as a x b elements so that no inner dimension wraps beyond the DMA's limit."""
    total = spec.mask.nelements
    length = spec.length
    if task.row_stride == length:
        return _linear(total, task.offset, task.rows * length)
    a, b = spec.mask_split
    return TensorAccessPattern(
        (total,), task.offset, [1, task.rows, a, b], [0, task.row_stride, b, 1]
    )


def build(spec):
    p = spec.plan
    C, B, L = p.columns, p.block, spec.length
    has_mask = spec.mask is not None
    resident = spec.weight
    # RMS_NORM_MUL_ADD: the weight row is the second channel's first object, kept by the core.
    weight_in_mask = spec.op == "RMS_NORM_MUL_ADD"
    fifo_weight = resident is not None and not weight_in_mask
    dev = device(spec.arch, C + (1 if fifo_weight else 0))
    seq_types = [vector_type(count, t) for t, count in spec.sequence]

    x_obj = vector_type(B * (L + spec.x_row_extra), "f32")
    out_obj = vector_type(B * spec.out_row, spec.out.dtype)
    args = [x_obj]
    if has_mask:
        m_obj = vector_type(B * L, spec.mask.dtype)
        args.append(m_obj)
    if fifo_weight:
        r_obj = vector_type(resident.nelements, resident.dtype)
        args.append(r_obj)
    args.append(out_obj)
    kern = Kernel("ggml_rows", OBJECT, args)
    kern_weight = Kernel("ggml_rows_weight", OBJECT, [m_obj]) if weight_in_mask else None
    # The first row of the worker (SOFT_MAX's head index for ALiBi).
    kern_begin = Kernel("ggml_rows_begin", OBJECT, [np.int32])

    def core(*a):
        # (x, [mask], [resident], out, kern, kern_begin, first_row): the optional handles
        # are present as the spec says (Worker passes its fn_args positionally).
        args = iter(a)
        of_x = next(args)
        of_m = next(args) if has_mask else None
        of_r = next(args) if fifo_weight else None
        of_o, fn, fn_begin, *weight_fn, first = args
        r = of_r.acquire(1) if of_r is not None else None
        fn_begin(first)
        if weight_fn:
            w = of_m.acquire(1)
            weight_fn[0](w)
            of_m.release(1)
        for _ in range_(p.iterations):
            x = of_x.acquire(1)
            m = of_m.acquire(1) if of_m is not None else None
            o = of_o.acquire(1)
            fn(*[v for v in (x, m, r, o) if v is not None])
            of_x.release(1)
            if of_m is not None:
                of_m.release(1)
            of_o.release(1)
        if of_r is not None:
            of_r.release(1)

    r_fifo = None
    if fifo_weight:
        r_fifo = ObjectFifo(r_obj, name="resident", depth=1)
    x_fifos, m_fifos, o_fifos, workers = [], [], [], []
    for c in range(C):
        x_fifo = ObjectFifo(x_obj, name=f"x_c{c}", depth=p.depth)
        o_fifo = ObjectFifo(out_obj, name=f"out_c{c}", depth=p.depth)
        x_fifos.append(x_fifo)
        o_fifos.append(o_fifo)
        fn_args = [x_fifo.cons()]
        if has_mask:
            m_fifo = ObjectFifo(m_obj, name=f"mask_c{c}", depth=p.depth)
            m_fifos.append(m_fifo)
            fn_args.append(m_fifo.cons())
        if r_fifo is not None:
            fn_args.append(r_fifo.cons())
        fn_args += [o_fifo.prod(), kern, kern_begin]
        fn_args += [kern_weight] if weight_in_mask else []
        fn_args.append(spec.first_row(c))
        workers.append(Worker(core, fn_args=fn_args, tile=Tile(c, FIRST_CORE_ROW)))

    # Runtime endpoints: column c's shim fills x (and the mask) and drains the output; the
    # resident operand comes from the shim of column C (no worker there).
    handles = []
    for c in range(C):
        shim = Tile(c, SHIM_ROW)
        handles.append(x_fifos[c].prod(tile=shim))
        if has_mask:
            handles.append(m_fifos[c].prod(tile=shim))
    if r_fifo is not None:
        handles.append(r_fifo.prod(tile=Tile(C, SHIM_ROW)))
    drains = [o_fifos[c].cons(tile=Tile(c, SHIM_ROW)) for c in range(C)]
    n_seq = len(seq_types)
    x_total, out_total = spec.x.nelements, spec.out.nelements

    def sequence(*a):
        bufs, hs = a[:n_seq], iter(a[n_seq:])
        x_buf, out_buf = bufs[0], bufs[-1]
        m_buf = bufs[1] if has_mask else None
        s_buf = bufs[2 if has_mask else 1] if spec.sinks is not None else None
        r_buf = bufs[-2] if resident is not None else None
        fills = []
        for _ in range(C):
            hx = next(hs)
            fills.append((hx, next(hs) if has_mask else None))
        r_handle = next(hs) if r_fifo is not None else None
        out_handles = list(hs)
        rounds = [spec.rounds(c) for c in range(C)]
        for i in range(max(len(r) for r in rounds)):
            tg = TaskGroup()
            if i == 0 and r_handle is not None:
                r_handle.fill(r_buf, group=tg)
            for c in range(C):
                if i >= len(rounds[c]):
                    continue
                rd = rounds[c][i]
                hx, hm = fills[c]
                if i == 0 and weight_in_mask:
                    a, b = spec.mask_split
                    tap = TensorAccessPattern((L,), 0, [B, 1, a, b], [0, 0, b, 1])
                    hm.fill(r_buf, tap=tap, group=tg)
                for t in rd.x:
                    if t.sink:  # a head's sink, once for each of its rows in the object
                        # The copies are the task's repeat (outermost dimension, the only one
                        # a BD lets have stride 0) of a one-word walk.
                        tap = TensorAccessPattern(
                            (spec.sinks.nelements,), t.offset, [t.count, 1, 1, 1], [0, 0, 0, 1]
                        )
                        hx.fill(s_buf, tap=tap, group=tg)
                    else:
                        hx.fill(x_buf, tap=_linear(x_total, t.offset, t.count), group=tg)
                for t in rd.mask:
                    hm.fill(m_buf, tap=_mask_tap(spec, t), group=tg)
                n_out = spec.out_row
                out_handles[c].drain(
                    out_buf,
                    tap=_linear(out_total, rd.first_row * n_out, rd.rows * n_out),
                    group=tg,
                    wait=True,
                )
            tg.finish()

    rt = Runtime(sequence, [*seq_types, *handles, *drains])
    return Program(dev, rt, workers=workers).resolve_program()
