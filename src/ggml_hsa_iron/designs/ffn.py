"""RMS_NORM_FFN_<glu> (REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK): a feed-forward block in
one dispatch, what RMS_NORM_MUL_MAT_<glu> then MUL_MAT_ADD compute (designs/mul_mat.py):

    h   = act(W_g . y) * (W_u . y),  y = x / sqrt(mean(x^2) + eps) * n   (extra output, [F, N])
    out = W_d . h + r                                                     (output, [K, N])

One program, two phases on the same cores, fifos and core object, separated in the runtime
sequence by the completion of every write of h.

Phase 1 is RMS_NORM_MUL_MAT_<glu>'s GEMV dataflow (mul_mat.py's `_gemv_glu` with the norm's
prologue): per column the shim fills the W fifo with a round's tile of W_g's rows, then the same
tile of W_u, the memory tile splits each object over the column's R cores (nr rows each), the x
fifo carries n once per dispatch and then x twice per round, K in chunks of kc, and the cores'
y objects (nr values) are joined by the memory tile and drained into h. Each core keeps n
(kernels/mv_norm.h), sums the gate rows of normalised chunks into its stash, the up rows into
y, scales both by 1 / sqrt(mean(x^2) + eps) and sets y = act(stash) * y (kernels/mv_glu.h).

Phase 2 is MUL_MAT_ADD's GEMV dataflow (mul_mat.py's `_gemv` with `add`) with h as x (its K is
F): per round the W fifo carries a tile of W_d's rows, the x fifo h's F/kc chunks and one more
object holding the column's r values for the round's rows (padded with h's first values); each
core sums its rows into y, adds its nr values of r (kernels/mv_add.h) and the joined y objects
are drained into out. Rounds are whole (K is a multiple of the C*R*nr rows of a round), so with
out in r's memory (an ADD in place; x's memory too) no round reads r's rows after they were
written; x itself is read only in phase 1.

The synchronisation: every task group of phase 1 ends with `finish()`, which awaits its h
drains (issued with wait=True), and phase 2's first x task is issued after phase 1's last
group finished, so h is complete in memory before any of it is read back. Within a core the
phases need nothing more: its fifos deliver phase 1's objects before phase 2's.

Both phases share the ObjectFifos (a core has two input DMA channels, W and x, and one output
channel here, y), so their plans share one shape (plans_ffn.plan_ffn): C columns, R cores per
column, nr rows per core (W tiles nr x kc of the weight type, y objects nr f32) and kc (x
objects kc f32, dividing K and F), checked as each phase's planner checks it; the core memory
counts both phases (n kept for the norm and the GLU's stash, besides the fifos' buffers), and
the DMA tasks of each shim channel are counted over the whole program. The core object is one
build of the weight type's GEMV source (mv.cc or mvq.cc) with the norm's, the GLU's and the
ADD's functions: each core runs phase 1's rounds (the norm's prologue, gate and up sums, the
GLU) and then phase 2's (down sums, + r), with the very functions the two ops' designs call, so
with equal K chunks both outputs are bit for bit what the two kernels produce in sequence.

Runtime-sequence arguments (the request's order): W_g, W_u, W_d, x, n, r, out, h.
"""

import numpy as np
from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
from aie.iron.controlflow import range_
from aie.iron.device import Tile
from aie.iron.runtime import TaskGroup

from ._common import device, vector_type
from .mul_mat import MEM_ROW, SHIM_ROW, _k_chunks, _norm_prologue, _tap


def _kernels(spec, w_tile, x_tile, y_tile):
    """The core functions of both phases, in the order the Worker body takes them: phase 1's
    (RMS_NORM_MUL_MAT_<glu>: n's load, the gate's stash zero and sums, y's zero and the up sums,
    the scale, the GLU), then phase 2's (MUL_MAT_ADD: the plain sums and the r epilogue; y's
    zero is phase 1's)."""
    obj = spec.core.object_name
    fn = "ggml_mvq" if spec.weight_bytes else "ggml_mv"

    def k(name, args):
        return Kernel(f"{fn}{name}", obj, args)

    return [
        k("_norm_load", [x_tile]),
        k("_norm_gate_zero", []),
        k("_norm_gate", [w_tile, x_tile]),
        k("_zero", [y_tile]),
        k("_norm", [w_tile, x_tile, y_tile]),
        k("_norm_scale", [y_tile]),
        k("_glu", [y_tile]),
        k("", [w_tile, x_tile, y_tile]),
        k("_add", [x_tile, y_tile, np.int32]),
    ]


def _ffn(spec):
    up, down = spec.up, spec.down
    p1, p2 = up.plan, down.plan
    C, R, nr, kc = p1.columns, p1.rows, p1.rows_per_tile, p1.k_chunk
    # Weights moved as bytes: a tile is nr rows of the K chunk's blocks.
    w_t, w_elems = ("i8", p1.w_units(kc)) if spec.weight_bytes else (up.src0.dtype, kc)
    dev = device(spec.arch, C)
    seq_types = [vector_type(count, t) for t, count in spec.sequence]
    w_tile, x_tile, y_tile = (
        vector_type(nr * w_elems, w_t),
        vector_type(kc, "f32"),
        vector_type(nr, "f32"),
    )
    kernels = _kernels(spec, w_tile, x_tile, y_tile)
    rounds1, rounds2 = up.tiles_per_core, down.tiles_per_core
    k1, k2 = p1.k_steps, p2.k_steps

    def core_fn(
        of_w, of_x, of_y, load, gate_zero, gate, zero, up_mv, scale, glu, mv, add, r_offset
    ):
        # Phase 1, RMS_NORM_MUL_MAT_<glu>: n kept, then per round the gate rows' sums in the
        # stash, the up rows' into y, both scaled, y = act(stash) * y: the round's rows of h.
        _norm_prologue(of_x, load, k1)
        for _ in range_(rounds1):
            gate_zero()
            _k_chunks(of_w, of_x, k1, gate)
            y = of_y.acquire(1)
            zero(y)
            _k_chunks(of_w, of_x, k1, up_mv, y)
            scale(y)
            glu(y)
            of_y.release(1)
        # Phase 2, MUL_MAT_ADD over h: the down rows' sums into y, then the object behind the
        # round's h chunks, the column's r values, added to them.
        for _ in range_(rounds2):
            y = of_y.acquire(1)
            zero(y)
            _k_chunks(of_w, of_x, k2, mv, y)
            r = of_x.acquire(1)
            add(r, y, r_offset)
            of_x.release(1)
            of_y.release(1)

    # Per column: W split over the R cores, x to every core, the cores' y joined; the same
    # fifos carry both phases' objects (one shape, see the module docstring).
    handles, workers = [], []
    for col in range(C):
        mem = Tile(col, MEM_ROW)
        w_fifo = ObjectFifo(vector_type(R * nr * w_elems, w_t), name=f"W_c{col}")
        w_subs = w_fifo.cons().split(
            [i * nr * w_elems for i in range(R)],
            obj_types=[w_tile] * R,
            names=[f"W_c{col}_r{i}" for i in range(R)],
            tile=mem,
        )
        x_fifo = ObjectFifo(x_tile, name=f"X_c{col}")
        y_fifo = ObjectFifo(vector_type(R * nr, "f32"), name=f"Y_c{col}")
        y_subs = y_fifo.prod().join(
            [i * nr for i in range(R)],
            obj_types=[y_tile] * R,
            names=[f"Y_c{col}_r{i}" for i in range(R)],
            tile=mem,
        )
        for i in range(R):
            args = [w_subs[i].cons(), x_fifo.cons(), y_subs[i].prod(), *kernels, i * nr]
            workers.append(Worker(core_fn, fn_args=args, tile=Tile(col, 2 + i)))
        shim = Tile(col, SHIM_ROW)
        handles += [w_fifo.prod(tile=shim), x_fifo.prod(tile=shim), y_fifo.cons(tile=shim)]

    totals = [count for _, count in spec.sequence]  # W_g, W_u, W_d, x, n, r, out, h
    groups1, groups2 = spec.tasks()

    def sequence(Wg, Wu, Wd, X, Nbuf, Rbuf, Out, H, *hs):
        # Phase 1: RMS_NORM_MUL_MAT_<glu>'s task groups (GemvPlan.tasks with glu and norm): per
        # column and round W_g's tap then W_u's, n ahead of the first x row, x repeated twice
        # per round, the group's rows of h drained and awaited.
        for g, group in enumerate(groups1):
            tg = TaskGroup()
            for col, (ws, x, y) in enumerate(group):
                hw, hx, hy = hs[3 * col : 3 * col + 3]
                for w in ws:
                    hw.fill(Wg, tap=_tap(totals[0], w), group=tg)
                    hw.fill(Wu, tap=_tap(totals[1], w), group=tg)
                if g == 0:
                    hx.fill(Nbuf, tap=_tap(totals[4], p1.norm_tap()), group=tg)
                hx.fill(X, tap=_tap(totals[3], x), group=tg)
                hy.drain(H, tap=_tap(totals[7], y), group=tg, wait=True)
            tg.finish()
        # Every drain of h has completed (each group's finish awaited its drains): phase 2
        # reads h. MUL_MAT_ADD's task groups (GemvPlan.tasks with add): per column W_d's run
        # of rounds, per round h's chunks, the column's r values and the padding, the group's
        # rows of out drained and awaited.
        for group in groups2:
            tg = TaskGroup()
            for col, (w, x, y, rs, pad) in enumerate(group):
                hw, hx, hy = hs[3 * col : 3 * col + 3]
                hw.fill(Wd, tap=_tap(totals[2], w), group=tg)
                for r in rs:
                    hx.fill(H, tap=_tap(totals[7], x), group=tg)
                    hx.fill(Rbuf, tap=_tap(totals[5], r), group=tg)
                    if pad is not None:
                        hx.fill(H, tap=_tap(totals[7], pad), group=tg)
                hy.drain(Out, tap=_tap(totals[6], y), group=tg, wait=True)
            tg.finish()

    rt = Runtime(sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def ggml_op_rms_norm_ffn_reglu(spec):
    """RMS_NORM_FFN_REGLU: W_d . (relu(W_g . y) * (W_u . y)) + r, y = rms_norm(x) * n."""
    return _ffn(spec)


def ggml_op_rms_norm_ffn_geglu(spec):
    """RMS_NORM_FFN_GEGLU: the GLU gelu (tanh approximation)."""
    return _ffn(spec)


def ggml_op_rms_norm_ffn_swiglu(spec):
    """RMS_NORM_FFN_SWIGLU: the GLU silu (llama's feed-forward block)."""
    return _ffn(spec)


def ggml_op_rms_norm_ffn_geglu_erf(spec):
    """RMS_NORM_FFN_GEGLU_ERF: the GLU gelu_erf."""
    return _ffn(spec)


def ggml_op_rms_norm_ffn_geglu_quick(spec):
    """RMS_NORM_FFN_GEGLU_QUICK: the GLU gelu_quick."""
    return _ffn(spec)
