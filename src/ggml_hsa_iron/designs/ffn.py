"""RMS_NORM_FFN_<glu> (REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK): a feed-forward block in
one dispatch, what RMS_NORM_MUL_MAT_<glu> then MUL_MAT_ADD compute (designs/mul_mat.py):

    h   = act(W_g . y) * (W_u . y),  y = x / sqrt(mean(x^2) + eps) * n   (extra output, [F, N])
    out = W_d . h + r                                                     (output, [K, N])

MUL_MAT_ADD_RMS_NORM_FFN_<glu>: the same block with llama's attention output projection and its
residual ADD (MUL_MAT_ADD) ahead of it, x and r being that ADD's result:

    r1  = W_o . a + r0                                                    (extra output, [K, N])
    h, out as above with x = r = r1                    (extra output h, [F, N]; output out)

One program, its phases on the same cores, fifos and core object, each separated from the next
in the runtime sequence by the completion of every write of what the next one reads.

Phase 0 (MUL_MAT_ADD_RMS_NORM_FFN_<glu> only) is MUL_MAT_ADD's GEMV dataflow (mul_mat.py's
`_gemv` with `add`) over a (its K is Ka) with r0 as r, writing r1: per round the W fifo carries a
tile of W_o's rows, the x fifo a's Ka/kc chunks and one more object holding the column's r0
values for the round's rows (padded with a's first values); each core sums its rows into y, adds
its nr values of r0 (kernels/mv_add.h) and the joined y objects are drained into r1.

Phase 1 is RMS_NORM_MUL_MAT_<glu>'s GEMV dataflow (mul_mat.py's `_gemv_glu` with the norm's
prologue) on x (r1 after phase 0): per column the shim fills the W fifo with a round's tile of
W_g's rows, then the same tile of W_u, the memory tile splits each object over the column's R
cores (nr rows each), the x fifo carries n once per dispatch and then x twice per round, K in
chunks of kc, and the cores' y objects (nr values) are joined by the memory tile and drained
into h. Each core keeps n (kernels/mv_norm.h), sums the gate rows of normalised chunks into its
stash, the up rows into y, scales both by 1 / sqrt(mean(x^2) + eps) and sets
y = act(stash) * y (kernels/mv_glu.h).

Phase 2 is MUL_MAT_ADD's GEMV dataflow again with h as x (its K is F) and r (r1 after phase 0)
as r, writing out. Rounds are whole (K is a multiple of the C*R*nr rows of a round), so with
out in r's memory (an ADD in place; x's memory too; phase 0's r1 in r0's memory likewise) no
round reads r's rows after they were written; x itself is read only in phase 1.

The synchronisation: every task group ends with `finish()`, which awaits its drains (issued
with wait=True), and a phase's first task is issued after the previous phase's last group
finished: r1 is complete in memory before phase 1 reads it as x (and phase 2 as r), h before
phase 2 reads it. Within a core the phases need nothing more: its fifos deliver each phase's
objects before the next one's.

Every phase shares the ObjectFifos (a core has two input DMA channels, W and x, and one output
channel here, y), so their plans share one shape (plans_ffn.plan_phases): C columns, R cores per
column, nr rows per core (W tiles nr x kc of the weight type, y objects nr f32) and kc (x
objects kc f32, dividing every phase's K: Ka, K and F), checked as each phase's planner checks
it; the core memory counts every phase (n kept for the norm and the GLU's stash, besides the
fifos' buffers), the memory tile's rings are the one shape's, and the DMA tasks of each shim
channel are counted over the whole program. The core object is one build of the weight type's
GEMV source (mv.cc or mvq.cc) with the norm's, the GLU's and the ADD's functions: each core
runs phase 0's rounds (plain sums, + r0), phase 1's (the norm's prologue, gate and up sums, the
GLU) and then phase 2's (down sums, + r), with the very functions the ops' own designs call,
so with equal K chunks every output is bit for bit what those kernels produce in sequence.

The pieces are mul_mat.py's: the per-column fifos and Workers (`_gemv_columns`, on phase 1's
spec: every phase's tiles are the same types), the GLU's core functions and rounds
(`_glu_kernels`, `_glu_rounds`), MUL_MAT_ADD's epilogue (`_add_r`) and the ops' task groups
(`_glu_fill` with n's `_norm_prologue_fills`, `_add_fill`), each on its phase's spec and plan.

Runtime-sequence arguments (the request's order): W_g, W_u, W_d, x, n, r, out, h;
MUL_MAT_ADD_RMS_NORM_FFN_<glu>: W_o, a, r0, W_g, W_u, W_d, n, out, r1, h.
"""

import numpy as np
from aie.iron import Program, Runtime
from aie.iron.controlflow import range_
from aie.iron.runtime import TaskGroup

from ._common import device, vector_type
from .mul_mat import (
    _add_fill,
    _add_r,
    _gemv_columns,
    _gemv_kern,
    _gemv_tiles,
    _glu_fill,
    _glu_kernels,
    _glu_rounds,
    _k_chunks,
    _norm_prologue_fills,
)


def _add_rounds(of_w, of_x, of_y, rounds, k_steps, zero, mv, add, r_offset):
    """A MUL_MAT_ADD phase's rounds on a core: the rows' sums into y, then the object behind
    the round's x chunks, the column's r values, added to them (mul_mat._gemv_group's)."""
    for _ in range_(rounds):
        y = of_y.acquire(1)
        zero(y)
        _k_chunks(of_w, of_x, k_steps, mv, y)
        _add_r(of_x, add, y, r_offset)
        of_y.release(1)


def _ffn(spec):
    attn, up, down = spec.attn, spec.up, spec.down
    p1 = up.plan
    dev = device(spec.arch, p1.columns)
    seq_types = [vector_type(count, t) for t, count in spec.sequence]
    # Phase 1's functions (RMS_NORM_MUL_MAT_<glu>'s, mul_mat._glu_kernels), then MUL_MAT_ADD's
    # plain sums and r epilogue (phases 0 and 2; y's zero is phase 1's): one object, every
    # phase's tiles are the same types (one shape).
    _, _, w_tile, x_tile, y_tile = _gemv_tiles(up)
    kern = _gemv_kern(up)
    kernels = [*_glu_kernels(up), kern("", [w_tile, x_tile, y_tile])]
    kernels.append(kern("_add", [x_tile, y_tile, np.int32]))
    rounds1, rounds2 = up.tiles_per_core, down.tiles_per_core
    k1, k2 = p1.k_steps, down.plan.k_steps
    # Phase 0 (MUL_MAT_ADD_RMS_NORM_FFN_<glu>): none for RMS_NORM_FFN_<glu>, whose program is
    # then exactly the two phases'.
    rounds0, k0 = (attn.tiles_per_core, attn.plan.k_steps) if attn is not None else (0, 0)

    def core_fn(
        of_w, of_x, of_y, gate_zero, gate, zero, up_mv, glu, load, scale, mv, add, r_offset
    ):
        if rounds0:
            # Phase 0, MUL_MAT_ADD's dispatch over a: W_o's rows' sums + r0: rows of r1.
            _add_rounds(of_w, of_x, of_y, rounds0, k0, zero, mv, add, r_offset)
        # Phase 1, RMS_NORM_MUL_MAT_<glu>'s dispatch: n kept, then per round the gate rows'
        # sums in the stash, the up rows' in y, both scaled, y = act(stash) * y: rows of h.
        _glu_rounds(of_w, of_x, of_y, rounds1, k1, gate_zero, gate, zero, up_mv, glu, load, scale)
        # Phase 2, MUL_MAT_ADD's rounds over h: the down rows' sums + r: rows of out.
        _add_rounds(of_w, of_x, of_y, rounds2, k2, zero, mv, add, r_offset)

    # Per column: W split over the R cores, x to every core, the cores' y joined; the same fifos
    # carry every phase's objects. Core i of a column adds r's values i * nr ...
    nr = p1.rows_per_tile
    workers, handles = _gemv_columns(up, core_fn, lambda col, i: [*kernels, i * nr])
    *groups0, groups1, groups2 = spec.tasks()

    def phases(Wg, Wu, Wd, X, Nbuf, Rbuf, Out, H, hs):
        # Phase 1: RMS_NORM_MUL_MAT_<glu>'s task groups (mul_mat._glu_fill): per column and
        # round W_g's tap then W_u's, n ahead of the first x row, x twice per round, the group's
        # rows of h drained and awaited by the group's finish.
        for g, group in enumerate(groups1):
            tg = TaskGroup()
            first = _norm_prologue_fills(up, Nbuf) if g == 0 else ()
            _glu_fill(up, hs, group, tg, Wg, Wu, X, H, first)
            tg.finish()
        # Every drain of h has completed: phase 2 reads h. MUL_MAT_ADD's task groups
        # (mul_mat._add_fill): per column W_d's run of rounds, per round h's chunks, the
        # column's r values and the padding, the group's rows of out drained and awaited.
        for group in groups2:
            tg = TaskGroup()
            _add_fill(down, hs, group, tg, Wd, H, Rbuf, Out)
            tg.finish()

    def sequence(Wg, Wu, Wd, X, Nbuf, Rbuf, Out, H, *hs):
        phases(Wg, Wu, Wd, X, Nbuf, Rbuf, Out, H, hs)

    def sequence_attn(Wo, A, R0, Wg, Wu, Wd, Nbuf, Out, R1, H, *hs):
        # Phase 0: MUL_MAT_ADD's task groups over a and r0, the group's rows of r1 drained and
        # awaited by the group's finish.
        for group in groups0[0]:
            tg = TaskGroup()
            _add_fill(attn, hs, group, tg, Wo, A, R0, R1)
            tg.finish()
        # Every drain of r1 has completed: phase 1 reads it as x, phase 2 as r.
        phases(Wg, Wu, Wd, R1, Nbuf, R1, Out, H, hs)

    rt = Runtime(sequence_attn if attn is not None else sequence, [*seq_types, *handles])
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


def ggml_op_mul_mat_add_rms_norm_ffn_reglu(spec):
    """MUL_MAT_ADD_RMS_NORM_FFN_REGLU: r1 = W_o . a + r0, then RMS_NORM_FFN_REGLU of x = r = r1."""
    return _ffn(spec)


def ggml_op_mul_mat_add_rms_norm_ffn_geglu(spec):
    """MUL_MAT_ADD_RMS_NORM_FFN_GEGLU: the GLU gelu (tanh approximation)."""
    return _ffn(spec)


def ggml_op_mul_mat_add_rms_norm_ffn_swiglu(spec):
    """MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU: the GLU silu (llama's attention output projection,
    residual ADD and feed-forward block)."""
    return _ffn(spec)


def ggml_op_mul_mat_add_rms_norm_ffn_geglu_erf(spec):
    """MUL_MAT_ADD_RMS_NORM_FFN_GEGLU_ERF: the GLU gelu_erf."""
    return _ffn(spec)


def ggml_op_mul_mat_add_rms_norm_ffn_geglu_quick(spec):
    """MUL_MAT_ADD_RMS_NORM_FFN_GEGLU_QUICK: the GLU gelu_quick."""
    return _ffn(spec)
