"""FLASH_ATTN_EXT, FLASH_ATTN_EXT_MASK, FLASH_ATTN_EXT_SINKS, FLASH_ATTN_EXT_MASK_SINKS.

out[:, h, i1, i3] = softmax(s) . V with s_j = scale q.k_j (softcap * tanh(s_j) with a softcap)
+ slope(h) mask[j, i1] (the sink as one more logit without a value), ggml-cpu's semantics; the
core function is kernels/flash_attn.cc, the plan plans_fa.py (see its docstring).

Layout: C columns of gh workers (rows 2 ..). Column c computes the blocks c, c + C, ... (a
block: G = gh x gr query rows, gr consecutive rows of gh heads sharing a KV head), its worker j
head j of each block (gr rows). Its shim fills fifo A (first the sinks of every head, once,
padded to whole objects with K's first words; then per block its mask span, repeated to whole
objects, then the KV head's K chunks) and fifo B (per block its q rows, repeated to whole
objects, then the V chunks), each broadcast to the column's workers; the workers' output rows
are joined in the column's memory tile (a query row's gh rows, consecutive in the output) and
the shim drains each block's G output rows with one strided task. A repeat is the task's repeat
count (outermost dimension, at most 64), the one DMA dimension that may have stride 0. A worker
consumes the sink objects (`ggml_fa_sinks`), then per block the q objects (`ggml_fa_q`: it
keeps its head's rows) and the mask objects (`ggml_fa_side`), FA_NKV / FA_CHUNK pairs of K and
V objects (`ggml_fa_chunk`, the online softmax of its gr rows) and writes its gr rows
(`ggml_fa_out`, one output object each).

Every input is declared as 32-bit words in the runtime sequence (the mask, the sinks and K
share fifo A, q and V fifo B); the output is f32. Runtime-sequence arguments: the inputs in request order,
then the output.
"""

import numpy as np
from aie.helpers.taplib import TensorAccessPattern
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.controlflow import range_
from aie.iron.device import Tile
from aie.iron.runtime import TaskGroup

from ._common import device, vector_type

SHIM_ROW = 0
MEM_ROW = 1
CORE_ROW = 2


def _tap(total, tap):
    return TensorAccessPattern((total,), tap.offset, list(tap.sizes), list(tap.strides))


def _build(spec):
    C = spec.columns
    obj = spec.core.object_name
    dev = device(spec.arch, C)
    seq = spec.sequence
    seq_types = [vector_type(n, t) for t, n in seq]
    a_obj = vector_type(spec.a_words, "i32")
    b_obj = vector_type(spec.b_words, "i32")
    o_obj = vector_type(spec.dv, "f32")
    begin = Kernel("ggml_fa_begin", obj, [np.int32, np.int32, np.int32, np.int32])
    sinks_k = Kernel("ggml_fa_sinks", obj, [a_obj])
    q_k = Kernel("ggml_fa_q", obj, [b_obj])
    side = Kernel("ggml_fa_side", obj, [a_obj])
    chunk = Kernel("ggml_fa_chunk", obj, [a_obj, b_obj])
    finish = Kernel("ggml_fa_out", obj, [o_obj])
    n_sink, n_side, n_chunks, rows = spec.sink_objects, spec.side_objects, spec.chunks, spec.gr
    n_q = spec.q_objects

    # The kernels are passed one by one: IRON finds a Worker's kernels among its fn_args.
    def core(of_a, of_b, of_o, begin_fn, sinks_fn, q_fn, side_fn, chunk_fn, out_fn, first, step,
             head, blocks, m_stride):  # fmt: skip
        begin_fn(first, step, head, m_stride)
        if n_sink:
            for _ in range_(n_sink):
                a = of_a.acquire(1)
                sinks_fn(a)
                of_a.release(1)
        for _ in range_(blocks):
            for _ in range_(n_q):
                b = of_b.acquire(1)
                q_fn(b)
                of_b.release(1)
            for _ in range_(n_side):
                a = of_a.acquire(1)
                side_fn(a)
                of_a.release(1)
            for _ in range_(n_chunks):
                a = of_a.acquire(1)
                b = of_b.acquire(1)
                chunk_fn(a, b)
                of_a.release(1)
                of_b.release(1)
            for _ in range_(rows):
                o = of_o.acquire(1)
                out_fn(o)
                of_o.release(1)

    a_fifos, b_fifos, o_fifos, workers = [], [], [], []
    gh, dv = spec.gh, spec.dv
    for c in range(C):
        a_f = ObjectFifo(a_obj, name=f"fa_a_c{c}", depth=2)
        b_f = ObjectFifo(b_obj, name=f"fa_b_c{c}", depth=2)
        # A query row's gh output rows (one per worker), joined in the memory tile.
        o_f = ObjectFifo(vector_type(gh * dv, "f32"), name=f"fa_out_c{c}", depth=2)
        o_subs = o_f.prod().join(
            [j * dv for j in range(gh)],
            obj_types=[o_obj] * gh,
            names=[f"fa_out_c{c}_r{j}" for j in range(gh)],
            tile=Tile(c, MEM_ROW),
        )
        a_fifos.append(a_f)
        b_fifos.append(b_f)
        o_fifos.append(o_f)
        blocks = len(spec.column_blocks(c))
        fns = [begin, sinks_k, q_k, side, chunk, finish]
        for j in range(gh):
            args = [a_f.cons(), b_f.cons(), o_subs[j].prod(), *fns, c, C, j, blocks]
            args.append(spec.mask_stride)
            workers.append(Worker(core, fn_args=args, tile=Tile(c, CORE_ROW + j)))

    handles = []
    for c in range(C):
        shim = Tile(c, SHIM_ROW)
        handles += [a_fifos[c].prod(tile=shim), b_fifos[c].prod(tile=shim)]
        handles.append(o_fifos[c].cons(tile=shim))
    totals = [n for _, n in seq]
    has_mask, has_sinks = spec.mask is not None, spec.sinks is not None

    def sequence(*a):
        bufs, hs = a[: len(seq)], a[len(seq) :]
        q_buf, k_buf, v_buf = bufs[:3]
        m_buf = bufs[3] if has_mask else None
        s_buf = bufs[4 if has_mask else 3] if has_sinks else None
        out_buf = bufs[-1]
        s_total = totals[4 if has_mask else 3] if has_sinks else 0
        rounds = [spec.rounds(c) for c in range(C)]
        for r in range(max(len(x) for x in rounds)):
            tg = TaskGroup()
            for c in range(C):
                if r >= len(rounds[c]):
                    continue
                ha, hb, ho = hs[3 * c : 3 * c + 3]
                if r == 0 and has_sinks:
                    for which, tap in spec.sink_taps():
                        buf, total = (s_buf, s_total) if which == "sinks" else (k_buf, totals[1])
                        ha.fill(buf, tap=_tap(total, tap), group=tg)
                for b in rounds[c][r]:
                    hb.fill(q_buf, tap=_tap(totals[0], spec.q_tap(b)), group=tg)
                    if has_mask:
                        ha.fill(m_buf, tap=_tap(totals[3], spec.mask_tap(b)), group=tg)
                    ha.fill(k_buf, tap=_tap(totals[1], spec.k_tap(b)), group=tg)
                    hb.fill(v_buf, tap=_tap(totals[2], spec.v_tap(b)), group=tg)
                for b in rounds[c][r]:
                    ho.drain(out_buf, tap=_tap(totals[-1], spec.out_tap(b)), group=tg, wait=True)
            tg.finish()

    rt = Runtime(sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def ggml_op_flash_attn_ext(spec):
    """GGML FLASH_ATTN_EXT without mask or sinks."""
    return _build(spec)


def ggml_op_flash_attn_ext_mask(spec):
    """GGML FLASH_ATTN_EXT with an f16 mask (ALiBi slopes with max_bias > 0)."""
    return _build(spec)


def ggml_op_flash_attn_ext_sinks(spec):
    """GGML FLASH_ATTN_EXT with sinks (one extra logit per head, without a value)."""
    return _build(spec)


def ggml_op_flash_attn_ext_mask_sinks(spec):
    """GGML FLASH_ATTN_EXT with a mask and sinks."""
    return _build(spec)
