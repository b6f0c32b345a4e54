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

FLASH_ATTN_FFN_<glu> (plans_fa_ffn.py): a decode step's attention (FLASH_ATTN_EXT_MASK) as a
phase ahead of phase 0, writing a, on the same fifos and cores: per round (a KV head of the
column) the x fifo carries every token's group q rows, then per chunk of keys every token's
part of its mask row, the chunk's K rows and its V rows; each core keeps its gh heads' rows
and one chunk's scores of every token (an online softmax, kernels/mv_fa.h) and writes their
outputs as y objects, joined and drained into a with one strided task; the W fifo carries
nothing. Every task group ends with
`finish()`: every drain of a is awaited before phase 0 reads it as x.

FLASH_ATTN_GLU_<glu>: FLASH_ATTN_FFN_<glu> without phase 2 (a W_d of another weight type runs as
its own MUL_MAT_ADD after it): the attention, phase 0 and phase 1, writing h, a and r1.

DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu> (gemma2, gemma3; plans_decode): the layer with norms
after the attention's projection and after the block, each r' = rms_norm(p) * n + r. Phase 0
and phase 2 then run without their residuals (`_add_rounds` and `_add_fill` without r), writing
o and d, and each is followed by a norm-add phase (`_post_norm_rounds`, mv_post_norm.h) on the
same fifos: a task group of its own carries p's K chunks to every core (awaited before any row
is written, so the output may take p's memory), each core summing their squares; then a task
group per round carries the column's values of the round's rows of p, of the norm's weights and
of the residual, each padded to an x object (a run per token, as MUL_MAT_ADD's r object; the
weights' run repeated), and drains the cores' rows of r' (r1, then out). Phase 1 reads r1 as
before.

Runtime-sequence arguments (the request's order): W_g, W_u, W_d, x, n, r, out, h;
MUL_MAT_ADD_RMS_NORM_FFN_<glu>: W_o, a, r0, W_g, W_u, W_d, n, out, r1, h; FLASH_ATTN_FFN_<glu>:
q, k, v, mask, W_o, r0, W_g, W_u, W_d, n, out, a, r1, h; FLASH_ATTN_GLU_<glu>: q, k, v, mask,
W_o, r0, W_g, W_u, n, h, a, r1; DECODE_LAYER's in plans_decode.DecodeSpec.sequence.
"""

import numpy as np
from aie.iron import Program, Runtime
from aie.iron.controlflow import range_
from aie.iron.runtime import TaskGroup

from ..plans_ffn import w_ring_depth
from ..tiling import SHIM_GROUP_TASKS
from ._common import device, vector_type
from .mul_mat import (
    _add_fill,
    _tap,
    _add_r,
    _bias_prologue,
    _gemv_columns,
    _gemv_kern,
    _gemv_tiles,
    _glu_fill,
    _glu_kernels,
    _glu_rounds,
    _k_chunks,
    _norm_prologue,
    _norm_prologue_fills,
)


def _add_rounds(of_w, of_x, of_y, rounds, k_steps, zero, mv, add, r_offset):
    """A MUL_MAT_ADD phase's rounds on a core: the rows' sums into y, then the object behind
    the round's x chunks, the column's r values, added to them (mul_mat._gemv_group's); with
    `add` None the sums alone (a projection whose post norm follows)."""
    for _ in range_(rounds):
        y = of_y.acquire(1)
        zero(y)
        _k_chunks(of_w, of_x, k_steps, mv, y)
        if add is not None:
            _add_r(of_x, add, y, r_offset)
        of_y.release(1)


def _post_norm_rounds(of_x, of_y, rounds, k_steps, f, r_offset, norm):
    """A norm-add phase on a core (mv_post_norm.h, `f` its functions by name): the projection
    p's K chunks, their squares summed; then per round the column's values of p and of the
    norm's weights, the core's kept, and the residual's: y = rms_norm(p) * n + r for the core's
    rows. `norm`: 0 the norm after the attention's projection, 1 after the block."""
    for _ in range_(k_steps):
        x = of_x.acquire(1)
        f["pn_squares"](x)
        of_x.release(1)
    for _ in range_(rounds):
        for which in (0, 1):
            x = of_x.acquire(1)
            f["pn_keep"](x, which, r_offset)
            of_x.release(1)
        y = of_y.acquire(1)
        r = of_x.acquire(1)
        f["pn_out"](r, y, r_offset, norm)
        of_x.release(1)
        of_y.release(1)


def _post_norm_fills(spec, hs, P, Nbuf, Rbuf, Y):
    """A norm-add phase's task groups for `_ahead` (y = rms_norm(P) * Nbuf + Rbuf into Y; P,
    Rbuf and Y [K, T], Nbuf [K]): every column's P in K chunks (`post_norm_squares`), in a
    group of its own (awaited before any row is written: Y may take P's memory), then a group
    a round (DecodeSpec.post_norm_rounds): per column the round's rows of P, of Nbuf and of
    Rbuf, each padded to an x object, and the drain of Y's."""
    p = spec.up.plan
    K, KT = p.K, p.K * p.nx

    def squares(tg):
        for col in range(p.columns):
            hs[3 * col + 1].fill(P, tap=_tap(KT, spec.post_norm_squares()), group=tg, wait=True)
        return 1

    def one_round(tg, taps):
        for col, (rows, n, y, pad) in enumerate(taps):
            _, hx, hy = hs[3 * col : 3 * col + 3]
            for buf, total, tap in ((P, KT, rows), (Nbuf, K, n), (Rbuf, KT, rows)):
                hx.fill(buf, tap=_tap(total, tap), group=tg)
                if pad is not None:
                    hx.fill(P, tap=_tap(KT, pad), group=tg)
            hy.drain(Y, tap=_tap(KT, y), group=tg, wait=True)
        return 3 * (1 + (taps[0][3] is not None)) + 1

    groups = [(lambda tg: 0, squares)]
    for taps in spec.post_norm_rounds():
        groups.append((lambda tg: 0, lambda tg, taps=taps: one_round(tg, taps)))
    return groups


def _fa_kernels(kern, x_tile, y_tile):
    """FLASH_ATTN_FFN_<glu>'s attention functions (kernels/mv_fa.h), in `_fa_rounds`' order."""
    return [
        kern("_fa_q", [x_tile, np.int32, np.int32]),
        kern("_fa_mask", [x_tile]),
        kern("_fa_k", [x_tile]),
        kern("_fa_v", [x_tile]),
        kern("_fa_out", [y_tile]),
    ]


def _fa_rounds(of_x, of_y, fa, rounds, q_fn, mask_fn, k_fn, v_fn, out_fn, first):
    """The attention phase's rounds on a core, one per KV head of its column: the group's q
    rows (the core's from word `first`; the first object tells the core n_kv), per chunk of
    keys (each stream's in turn) its mask words, K rows and V rows, then its heads' outputs as
    y objects."""

    def pieces(parts):
        for count, fn in parts:
            for _ in range_(count):
                x = of_x.acquire(1)
                fn(x)
                of_x.release(1)

    chunk = ((fa.mask_side.objects, mask_fn), (fa.k_objects, k_fn), (fa.v_objects, v_fn))
    for _ in range_(rounds):
        pieces(((fa.q_side.objects, lambda x: q_fn(x, first, fa.n_kv)),))
        for _ in range_(fa.steps):
            pieces(chunk)
        for _ in range_(fa.out_objects):
            y = of_y.acquire(1)
            out_fn(y)
            of_y.release(1)


def _fa_fill(fa, hs, r, chunks, tg, bufs, totals):
    """Round r's task group of the attention phase (its `chunks`, steps of FaPhase.round_groups)
    on every column that has the round: on the x channel the KV head's q rows (with the first
    step), per step (a stream's chunk) its mask words, K rows and V rows, and (with the last)
    the drain of its heads' outputs into a. Returns the most tasks it issued on one column's
    shim (`_ahead`)."""
    Q, Kb, V, M, A = bufs
    first, last = chunks.start == 0, chunks.stop == fa.steps
    for col in range(fa.columns):
        heads = fa.column_heads(col)
        if r >= len(heads):
            continue  # columns past the last KV head
        kvh = heads[r]
        _, hx, hy = hs[3 * col : 3 * col + 3]
        if first:
            hx.fill(Q, tap=_tap(totals["q"], fa.q_tap(kvh)), group=tg)
        for step in chunks:
            st, c = divmod(step, fa.nc)
            hx.fill(M, tap=_tap(totals["mask"], fa.mask_tap(st, c)), group=tg)
            hx.fill(Kb, tap=_tap(totals["k"], fa.k_tap(kvh, st, c)), group=tg)
            # A group without the drain awaits its last fill: its buffer descriptors are
            # free for the next group's only once the channel has moved it.
            wait = not last and step == chunks.stop - 1
            hx.fill(V, tap=_tap(totals["v"], fa.v_tap(kvh, st, c)), group=tg, wait=wait)
        if last:
            hy.drain(A, tap=_tap(totals["a"], fa.a_tap(kvh)), group=tg, wait=True)
    return first + 3 * len(chunks) + last


def _qkv_kernels(kern, x_tile, y_tile, qkv):
    """DECODE_LAYER_<glu>'s projection functions besides the GLU's (mv_norm.h's y zero with a
    new round; mv_decode.h's) by name, in the order the Worker takes them after the GLU's
    load, normed sums and normed gate functions: with biases (qwen2) their load, with split
    heads the keep, heads and emit functions."""
    i32 = np.int32
    fns = {
        "norm_zero": kern("_norm_zero", [y_tile]),
        "dl_load": kern("_dl_rope_load", [x_tile]),
        "scale_rope": kern("_dl_scale_rope", [y_tile, i32, i32]),
        "scale": kern("_dl_scale", [y_tile, i32]),
        "store": kern("_dl_store_f16", [y_tile, i32, i32, i32]),
    }
    if qkv.bias_plan is not None:
        fns["bias_load"] = kern("_dl_bias_load", [x_tile, i32, i32])
    if qkv.split > 1:
        fns["keep"] = kern("_dl_keep", [i32, i32])
        fns["heads"] = kern("_dl_heads", [i32])
        fns["emit"] = kern("_dl_emit", [y_tile, i32, i32])
    if qkv.post_eps:
        fns["pn_squares"] = kern("_pn_squares", [x_tile])
        fns["pn_keep"] = kern("_pn_keep", [x_tile, i32, i32])
        fns["pn_out"] = kern("_pn_out", [x_tile, y_tile, i32, i32])
    return fns


def _qkv_rounds(of_w, of_x, of_y, g, col, i, k_steps, f):
    """The projection phase on core i of column col of group g (plans_decode.QkvGroup), `f`
    its functions by name (`_qkv_kernels`' and the GLU's load, norm_mv, gate_zero, gate):
    n_attn kept, (Q, K) the rotation's constants kept (with the group's head norm weights),
    (biases) the core's bias values of each round kept, then per y object one round (f32 rows:
    normed sums into y, scaled with the attention norm's eps, the round's bias values added,
    rotated at the round's global rows) or two (f16 rows: normed sums into the stash, scaled,
    biased, rotated, rounded to f16 into half s of y). Split heads: per pass of `split`
    rounds each round's normed sums into the stash, scaled, biased and kept in the head's
    slot, the heads normalised and rotated whole, then handed out a y object per round (f32)
    or two rounds (f16). The rounds are unrolled: one step, a few rounds, each with its own
    first row and bias values."""
    p = g.plan
    _norm_prologue(of_x, f["load"], p.norm_objects)
    if g.rope:
        _norm_prologue(of_x, f["dl_load"], p.rope_objects)
    if p.bias:
        # The column's values of the group's rounds; the core's first row among them.
        words = p.rounds * p.rows * p.rows_per_tile
        _bias_prologue(of_x, f["bias_load"], p.bias_objects, i * p.rows_per_tile, words)

    def bias_round(rnd):
        return rnd if p.bias else -1

    if g.split > 1:
        s = g.split
        for pss in range(p.rounds // s):
            for j in range(s):
                f["gate_zero"]()
                _k_chunks(of_w, of_x, k_steps, f["gate"])
                f["keep"](j, bias_round(pss * s + j))
            f["heads"](g.row0(col, i, pss * s))
            for j in range(0, s, g.pack):
                y = of_y.acquire(1)
                f["emit"](y, j, g.pack - 1)
                of_y.release(1)
        return
    for u in range(g.units):
        y = of_y.acquire(1)
        if g.pack == 1:
            f["norm_zero"](y)
            _k_chunks(of_w, of_x, k_steps, f["norm_mv"], y)
            if g.rope:
                f["scale_rope"](y, g.row0(col, i, u), bias_round(u))
            else:
                f["scale"](y, bias_round(u))
        else:
            for h in range(g.pack):
                rnd = u * g.pack + h
                f["gate_zero"]()
                _k_chunks(of_w, of_x, k_steps, f["gate"])
                row0 = g.row0(col, i, rnd) if g.rope else -1
                f["store"](y, h, row0, bias_round(rnd))
        of_y.release(1)


def _qkv_fill(qkv, hs, units, tg, ws, ys, x, consts, totals, part=None):
    """The units of the projection phase, in task group tg, on every column of every group
    that has them: per round the group's W tile, (unit 0) the column's prologue ahead of x
    (n_attn, the rotation's constants, the bias values: `QkvGroup.prologue`; `consts`: per
    group each source's buffer and words), x once per round of the unit, and the drain of the
    unit's y objects into Q, K rows or V rows. `part` and the result: mul_mat._add_fill's."""
    tasks = {}
    for u in units:
        for j, g in enumerate(qkv.groups):
            if u >= g.units:
                continue
            for c in range(g.plan.columns):
                col = g.col0 + c
                hw, hx, hy = hs[3 * col : 3 * col + 3]
                if part != "rest":
                    for w in g.w_taps(c, u):
                        if tg is not None:
                            hw.fill(ws[j], tap=_tap(totals["w"][j], w), group=tg)
                        tasks[col] = tasks.get(col, 0) + 1
                if part == "w":
                    continue
                if u == 0:
                    for name, tap in g.prologue(c):
                        buf, total = consts[j][name]
                        hx.fill(buf, tap=_tap(total, tap), group=tg)
                        tasks[col] = tasks.get(col, 0) + 1
                hx.fill(x, tap=_tap(totals["x"], g.x_tap()), group=tg)
                hy.drain(ys[j], tap=_tap(g.out_words, g.y_tap(c, u)), group=tg, wait=True)
                tasks[col] = tasks.get(col, 0) + 2
    return max((tasks[col] for col in tasks), default=0)


def _ahead(groups):
    """Issues task groups, each (w, rest): functions that issue a group's W fills and its
    other tasks in the TaskGroup given and return the most tasks they put on one column's
    shim. Each group's W fills go out before the group before it finishes, where the shim's
    buffer descriptors allow (SHIM_GROUP_TASKS: the group before it holds its tasks until
    then): the weights have no producer in the program, so a column's W channel streams the
    next group's tiles into the memory tile's ring while the cores finish the group before,
    or while a phase without weights (the attention) runs. Its other tasks wait for that
    finish, which awaits the drains of what they may read (x, r). `w(None)` counts a group's
    W fills without issuing them."""
    prev, held = None, 0
    for w, rest in groups:
        if prev is not None and held + w(None) > SHIM_GROUP_TASKS:
            prev.finish()
            prev = None
        tg = TaskGroup()
        n_w = w(tg)
        if prev is not None:
            prev.finish()
        held = n_w + rest(tg)
        prev = tg
    if prev is not None:
        prev.finish()


def _parts(fill, head, tail):
    """One task group for `_ahead`: fill(*head, tg, *tail, part=...) for its W fills and for
    the rest."""
    return (
        lambda tg: fill(*head, tg, *tail, part="w"),
        lambda tg: fill(*head, tg, *tail, part="rest"),
    )


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
    fa = spec.fa
    if fa is not None:
        kernels += _fa_kernels(kern, x_tile, y_tile)
    # DECODE_LAYER_<glu>: the projection phase ahead of the attention.
    qkv = getattr(spec, "qkv", None)
    if qkv is not None:
        qkv_kernels = _qkv_kernels(kern, x_tile, y_tile, qkv)
        kernels += list(qkv_kernels.values())
    # DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu>: phases 0 and 2 without their residuals, each
    # followed by a norm-add phase.
    post = qkv is not None and qkv.post_eps is not None
    # FLASH_ATTN_GLU_<glu> has no phase 2.
    rounds1 = up.tiles_per_core
    rounds2, k2 = (down.tiles_per_core, down.plan.k_steps) if down is not None else (0, 0)
    k1 = p1.k_steps
    # Phase 0 (MUL_MAT_ADD_RMS_NORM_FFN_<glu>): none for RMS_NORM_FFN_<glu>, whose program is
    # then exactly the two phases'.
    rounds0, k0 = (attn.tiles_per_core, attn.plan.k_steps) if attn is not None else (0, 0)

    def core_fn(of_w, of_x, of_y, gate_zero, gate, zero, up_mv, glu, load, scale, mv, add, *rest):
        # rest: FLASH_ATTN_FFN_<glu>'s attention functions, the core's first q word and its
        # column's rounds of that phase; then the core's offset in the r objects.
        *attention, r_offset = rest
        dl = {}
        if qkv is not None:
            # The projection phase: its functions, then the core's group (-1: no rows in it),
            # its column within the group and its row.
            *attention, gi, gcol, i = attention
            n = len(qkv_kernels)  # behind the attention's five
            q_fns, attention = attention[5 : 5 + n], attention[:5] + attention[5 + n :]
            dl = dict(zip(qkv_kernels, q_fns))
            if gi >= 0:
                glu_fns = {"load": load, "norm_mv": up_mv, "gate_zero": gate_zero, "gate": gate}
                _qkv_rounds(of_w, of_x, of_y, qkv.groups[gi], gcol, i, k1, {**glu_fns, **dl})
        if attention:
            # The attention phase: per KV head of the column, the heads' outputs as rows of a.
            *fns, first, fa_rounds = attention
            if fa_rounds:
                _fa_rounds(of_x, of_y, fa, fa_rounds, *fns, first)
        if rounds0:
            # Phase 0, MUL_MAT_ADD's dispatch over a: W_o's rows' sums + r0: rows of r1. With
            # post norms the sums (rows of o), then r1 = rms_norm(o) * n_post_attn + r0.
            _add_rounds(of_w, of_x, of_y, rounds0, k0, zero, mv, None if post else add, r_offset)
            if post:
                _post_norm_rounds(of_x, of_y, rounds0, k1, dl, r_offset, 0)
        # Phase 1, RMS_NORM_MUL_MAT_<glu>'s dispatch: n kept, then per round the gate rows'
        # sums in the stash, the up rows' in y, both scaled, y = act(stash) * y: rows of h.
        glu_fns = (gate_zero, gate, zero, up_mv, glu, load, scale)
        _glu_rounds(of_w, of_x, of_y, rounds1, k1, *glu_fns, norm_objects=p1.norm_objects)
        # Phase 2, MUL_MAT_ADD's rounds over h: the down rows' sums + r: rows of out. With
        # post norms the sums (rows of d), then out = rms_norm(d) * n_post_ffn + r1.
        if rounds2:
            _add_rounds(of_w, of_x, of_y, rounds2, k2, zero, mv, None if post else add, r_offset)
            if post:
                _post_norm_rounds(of_x, of_y, rounds0, k1, dl, r_offset, 1)

    # Per column: W split over the R cores, x to every core, the cores' y joined; the same fifos
    # carry every phase's objects. Core i of a column adds r's values i * nr ...
    nr = p1.rows_per_tile

    def core_args(col, i):
        if fa is None:
            return [*kernels, i * nr]
        # Core i of a column keeps q heads i gh ... of its KV heads: words from i gh D.
        heads = [i * fa.gh * fa.d, len(fa.column_heads(col))]
        if qkv is not None:
            g, gcol = qkv.group_of(col)
            heads += [qkv.groups.index(g) if g is not None else -1, gcol, i]
        return [*kernels, *heads, i * nr]

    workers, handles = _gemv_columns(up, core_fn, core_args, w_depth=w_ring_depth(p1, spec.arch))
    *groups0, groups1, groups2 = spec.tasks() + (() if down is not None else ([],))

    # Each phase's task groups as `_ahead` takes them; every group's drains are awaited by its
    # finish, so a phase reads what the one before it wrote (x, r) complete.
    def phases(Wg, Wu, Wd, X, Nbuf, Rbuf, Out, H, hs):
        # Phase 1: RMS_NORM_MUL_MAT_<glu>'s task groups (mul_mat._glu_fill): per column and
        # round W_g's tap then W_u's, n ahead of the first x row, x twice per round, the group's
        # rows of h drained. Then phase 2, over h: MUL_MAT_ADD's task groups
        # (mul_mat._add_fill): per column W_d's run of rounds, per round h's chunks, the
        # column's r values and the padding, the group's rows of out drained.
        groups = []
        for g, group in enumerate(groups1):
            first = _norm_prologue_fills(up, Nbuf, X) if g == 0 else ()
            groups.append(_parts(_glu_fill, (up, hs, group), (Wg, Wu, X, H, first)))
        for group in groups2:
            groups.append(_parts(_add_fill, (down, hs, group), (Wd, H, Rbuf, Out)))
        return groups

    def sequence(Wg, Wu, Wd, X, Nbuf, Rbuf, Out, H, *hs):
        _ahead(phases(Wg, Wu, Wd, X, Nbuf, Rbuf, Out, H, hs))

    def attn_groups(Wo, A, R0, Wg, Wu, Wd, Nbuf, Out, R1, H, hs):
        # Phase 0: MUL_MAT_ADD's task groups over a and r0, the group's rows of r1 drained;
        # then the phases reading r1 as x (phase 1) and as r (phase 2).
        groups = [_parts(_add_fill, (attn, hs, group), (Wo, A, R0, R1)) for group in groups0[0]]
        return groups + phases(Wg, Wu, Wd, R1, Nbuf, R1, Out, H, hs)

    def sequence_attn(Wo, A, R0, Wg, Wu, Wd, Nbuf, Out, R1, H, *hs):
        _ahead(attn_groups(Wo, A, R0, Wg, Wu, Wd, Nbuf, Out, R1, H, hs))

    def attention_groups(Q, Kb, V, M, A, hs):
        # The attention phase: task groups of a round's chunks (a KV head per column), a's
        # rows drained with the round's last; it has no W fills, so phase 0's go out while it
        # runs.
        totals = dict(zip(("q", "k", "v", "mask"), (n for _, n in fa.sequence)))
        totals["a"] = attn.plan.K * fa.tokens
        bufs = (Q, Kb, V, M, A)
        return [
            (lambda tg: 0, lambda tg, r=r, g=g: _fa_fill(fa, hs, r, g, tg, bufs, totals))
            for r in range(len(fa.column_heads(0)))
            for g in fa.round_groups
        ]

    def fa_groups(Q, Kb, V, M, Wo, R0, Wg, Wu, Wd, Nbuf, Out, A, R1, H, hs):
        # The attention phase, then phase 0 over a.
        groups = attention_groups(Q, Kb, V, M, A, hs)
        return groups + attn_groups(Wo, A, R0, Wg, Wu, Wd, Nbuf, Out, R1, H, hs)

    def post_norm_groups(Q, Kb, V, M, Wo, R0, Wg, Wu, Wd, Nf, Npa, Npf, Out, A, R1, H, Po, Pd, hs):
        # gemma's layer after its projections: the attention, phase 0 writing o, r1 =
        # rms_norm(o) * n_post_attn + r0, phase 1 over r1, phase 2 writing d, out =
        # rms_norm(d) * n_post_ffn + r1.
        groups = attention_groups(Q, Kb, V, M, A, hs)
        groups += [_parts(_add_fill, (attn, hs, group), (Wo, A, None, Po)) for group in groups0[0]]
        groups += _post_norm_fills(spec, hs, Po, Npa, R0, R1)
        groups += phases(Wg, Wu, Wd, R1, Nf, None, Pd, H, hs)
        return groups + _post_norm_fills(spec, hs, Pd, Npf, R1, Out)

    def sequence_fa(Q, Kb, V, M, Wo, R0, Wg, Wu, Wd, Nbuf, Out, A, R1, H, *hs):
        _ahead(fa_groups(Q, Kb, V, M, Wo, R0, Wg, Wu, Wd, Nbuf, Out, A, R1, H, hs))

    def sequence_fa_glu(Q, Kb, V, M, Wo, R0, Wg, Wu, Nbuf, H, A, R1, *hs):
        # FLASH_ATTN_GLU_<glu>: no W_d, no out (phase 2 has no task groups).
        _ahead(fa_groups(Q, Kb, V, M, Wo, R0, Wg, Wu, None, Nbuf, None, A, R1, H, hs))

    def sequence_decode(*args):
        # Wq, Wk, Wv, x, n_attn, the positions, (the factors,) (the groups' own inputs: head
        # norm weights or biases,) k, v, the mask, W_o, W_g, W_u, W_d, n_ffn, out, Q, K rows,
        # V rows, a, r1, h; then the shim endpoints.
        n_args = len(seq_types)
        hs, args = args[n_args:], args[:n_args]
        # The positions, (the factors,) (the own inputs): behind the 20 other arguments, 24
        # with post norms (their weights, o and d).
        nc = n_args - (24 if post else 20)
        Wq, Wk, Wv, X, Na = args[:5]
        if post:
            tail = args[5 + nc :]
            Kc, Vc, M, Wo, Wg, Wu, Wd, Nf, Npa, Npf, Out, Qo, Kr, Vr, A, R1, H, Po, Pd = tail
        else:
            Kc, Vc, M, Wo, Wg, Wu, Wd, Nf, Out, Qo, Kr, Vr, A, R1, H = args[5 + nc :]
        counts = [n for _, n in spec.sequence]
        cs = list(zip(args[5 : 5 + nc], counts[5 : 5 + nc]))  # (buffer, words)
        # The x channel's sources: n_attn, its padding from x, the rotation's constants; each
        # group's own input (its head norm's weights "hn" or its bias "b").
        n_own = sum(g.own_input for g in qkv.groups)
        shared, own = cs[: nc - n_own], iter(cs[nc - n_own :])
        common = {"pos": shared[0], "n": (Na, counts[4]), "x": (X, counts[3])}
        if len(shared) == 2:
            common["ff"] = shared[1]
        consts = []
        for g in qkv.groups:
            mine = next(own) if g.own_input else None
            consts.append({**common, "hn": mine, "b": mine})
        totals = {"w": counts[:3], "x": counts[3]}
        # The projection phase: task groups of as many units (y objects of a core) as the
        # shims' tasks allow (QkvPhase.task_groups), the drains of Q, K rows and V rows. The
        # attention then reads Q as q and the cache views k and v, which hold this token's
        # rows; r0 is x.
        head = ((Wq, Wk, Wv), (Qo, Kr, Vr), X, consts, totals)
        groups = [_parts(_qkv_fill, (qkv, hs, units), head) for units in qkv.task_groups]
        if post:
            bufs = (Qo, Kc, Vc, M, Wo, X, Wg, Wu, Wd, Nf, Npa, Npf, Out, A, R1, H, Po, Pd, hs)
            rest = post_norm_groups(*bufs)
        else:
            rest = fa_groups(Qo, Kc, Vc, M, Wo, X, Wg, Wu, Wd, Nf, Out, A, R1, H, hs)
        _ahead(groups + rest)

    seq_fn = (
        sequence_decode
        if qkv is not None
        else sequence_fa_glu
        if down is None
        else sequence_fa
        if fa is not None
        else sequence_attn
        if attn is not None
        else sequence
    )
    rt = Runtime(seq_fn, [*seq_types, *handles])
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


def _decode_layer(spec):
    """DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu>: RMS_NORM_QKV[_BIAS|_HEAD_NORM]_ROPE(_FF), then
    FLASH_ATTN_FFN_<glu> of q = Q and r0 = x, one program (see the module docstring and
    plans_decode)."""
    return _ffn(spec)


def ggml_op_flash_attn_ffn_reglu(spec):
    """FLASH_ATTN_FFN_REGLU: a = FLASH_ATTN_EXT(q, k, v, mask), then
    MUL_MAT_ADD_RMS_NORM_FFN_REGLU of a."""
    return _ffn(spec)


def ggml_op_flash_attn_ffn_geglu(spec):
    """FLASH_ATTN_FFN_GEGLU: the GLU gelu (tanh approximation)."""
    return _ffn(spec)


def ggml_op_flash_attn_ffn_swiglu(spec):
    """FLASH_ATTN_FFN_SWIGLU: the GLU silu (llama's attention tail and feed-forward block of a
    decode step)."""
    return _ffn(spec)


def ggml_op_flash_attn_ffn_geglu_erf(spec):
    """FLASH_ATTN_FFN_GEGLU_ERF: the GLU gelu_erf."""
    return _ffn(spec)


def ggml_op_flash_attn_ffn_geglu_quick(spec):
    """FLASH_ATTN_FFN_GEGLU_QUICK: the GLU gelu_quick."""
    return _ffn(spec)


def ggml_op_flash_attn_glu_reglu(spec):
    """FLASH_ATTN_GLU_REGLU: FLASH_ATTN_FFN_REGLU without the down phase: h, a and r1."""
    return _ffn(spec)


def ggml_op_flash_attn_glu_geglu(spec):
    """FLASH_ATTN_GLU_GEGLU: the GLU gelu (tanh approximation)."""
    return _ffn(spec)


def ggml_op_flash_attn_glu_swiglu(spec):
    """FLASH_ATTN_GLU_SWIGLU: the GLU silu (the layers of llama.cpp's Q4_K_M whose ffn_down is
    q6_K beside q4_K W_o, W_g and W_u)."""
    return _ffn(spec)


def ggml_op_flash_attn_glu_geglu_erf(spec):
    """FLASH_ATTN_GLU_GEGLU_ERF: the GLU gelu_erf."""
    return _ffn(spec)


def ggml_op_flash_attn_glu_geglu_quick(spec):
    """FLASH_ATTN_GLU_GEGLU_QUICK: the GLU gelu_quick."""
    return _ffn(spec)


def ggml_op_decode_layer_reglu(spec):
    """DECODE_LAYER_REGLU: a decode step's layer, the GLU relu."""
    return _decode_layer(spec)


def ggml_op_decode_layer_ff_reglu(spec):
    """DECODE_LAYER_FF_REGLU: a decode step's layer, the GLU relu, Q's and K's theta divided by the frequency factors."""
    return _decode_layer(spec)


def ggml_op_decode_layer_geglu(spec):
    """DECODE_LAYER_GEGLU: a decode step's layer, the GLU gelu (tanh approximation)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_ff_geglu(spec):
    """DECODE_LAYER_FF_GEGLU: a decode step's layer, the GLU gelu (tanh approximation), Q's and K's theta divided by the frequency factors."""
    return _decode_layer(spec)


def ggml_op_decode_layer_swiglu(spec):
    """DECODE_LAYER_SWIGLU: a decode step's layer, the GLU silu (llama's layer)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_ff_swiglu(spec):
    """DECODE_LAYER_FF_SWIGLU: a decode step's layer, the GLU silu (llama's layer), Q's and K's theta divided by the frequency factors."""
    return _decode_layer(spec)


def ggml_op_decode_layer_geglu_erf(spec):
    """DECODE_LAYER_GEGLU_ERF: a decode step's layer, the GLU gelu_erf."""
    return _decode_layer(spec)


def ggml_op_decode_layer_ff_geglu_erf(spec):
    """DECODE_LAYER_FF_GEGLU_ERF: a decode step's layer, the GLU gelu_erf, Q's and K's theta divided by the frequency factors."""
    return _decode_layer(spec)


def ggml_op_decode_layer_geglu_quick(spec):
    """DECODE_LAYER_GEGLU_QUICK: a decode step's layer, the GLU gelu_quick."""
    return _decode_layer(spec)


def ggml_op_decode_layer_ff_geglu_quick(spec):
    """DECODE_LAYER_FF_GEGLU_QUICK: a decode step's layer, the GLU gelu_quick, Q's and K's theta divided by the frequency factors."""
    return _decode_layer(spec)


def ggml_op_decode_layer_bias_reglu(spec):
    """DECODE_LAYER_BIAS_REGLU: a decode step's layer, the GLU relu, Q's, K's and V's biases added (qwen2)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_bias_geglu(spec):
    """DECODE_LAYER_BIAS_GEGLU: a decode step's layer, the GLU gelu (tanh approximation), Q's, K's and V's biases added (qwen2)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_bias_swiglu(spec):
    """DECODE_LAYER_BIAS_SWIGLU: a decode step's layer, the GLU silu, Q's, K's and V's biases added (qwen2)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_bias_geglu_erf(spec):
    """DECODE_LAYER_BIAS_GEGLU_ERF: a decode step's layer, the GLU gelu_erf, Q's, K's and V's biases added (qwen2)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_bias_geglu_quick(spec):
    """DECODE_LAYER_BIAS_GEGLU_QUICK: a decode step's layer, the GLU gelu_quick, Q's, K's and V's biases added (qwen2)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_head_norm_reglu(spec):
    """DECODE_LAYER_HEAD_NORM_REGLU: a decode step's layer, the GLU relu, Q's and K's heads normalised (qwen3)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_head_norm_geglu(spec):
    """DECODE_LAYER_HEAD_NORM_GEGLU: a decode step's layer, the GLU gelu (tanh approximation), Q's and K's heads normalised (qwen3)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_head_norm_swiglu(spec):
    """DECODE_LAYER_HEAD_NORM_SWIGLU: a decode step's layer, the GLU silu, Q's and K's heads normalised (qwen3)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_head_norm_geglu_erf(spec):
    """DECODE_LAYER_HEAD_NORM_GEGLU_ERF: a decode step's layer, the GLU gelu_erf, Q's and K's heads normalised (qwen3)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_head_norm_geglu_quick(spec):
    """DECODE_LAYER_HEAD_NORM_GEGLU_QUICK: a decode step's layer, the GLU gelu_quick, Q's and K's heads normalised (qwen3)."""
    return _decode_layer(spec)


def ggml_op_decode_layer_post_norm_reglu(spec):
    """DECODE_LAYER_POST_NORM_REGLU: gemma2's layer, the GLU relu: the norms after the
    attention's projection and after the block as norm-add phases."""
    return _ffn(spec)


def ggml_op_decode_layer_head_norm_post_norm_reglu(spec):
    """DECODE_LAYER_HEAD_NORM_POST_NORM_REGLU: gemma3's layer (qwen3's head norms besides), the GLU
    relu."""
    return _ffn(spec)


def ggml_op_decode_layer_post_norm_geglu(spec):
    """DECODE_LAYER_POST_NORM_GEGLU: gemma2's layer, the GLU gelu (tanh approximation: gemma's): the norms after the
    attention's projection and after the block as norm-add phases."""
    return _ffn(spec)


def ggml_op_decode_layer_head_norm_post_norm_geglu(spec):
    """DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU: gemma3's layer (qwen3's head norms besides), the GLU
    gelu (tanh approximation: gemma's)."""
    return _ffn(spec)


def ggml_op_decode_layer_post_norm_swiglu(spec):
    """DECODE_LAYER_POST_NORM_SWIGLU: gemma2's layer, the GLU silu: the norms after the
    attention's projection and after the block as norm-add phases."""
    return _ffn(spec)


def ggml_op_decode_layer_head_norm_post_norm_swiglu(spec):
    """DECODE_LAYER_HEAD_NORM_POST_NORM_SWIGLU: gemma3's layer (qwen3's head norms besides), the GLU
    silu."""
    return _ffn(spec)


def ggml_op_decode_layer_post_norm_geglu_erf(spec):
    """DECODE_LAYER_POST_NORM_GEGLU_ERF: gemma2's layer, the GLU gelu_erf: the norms after the
    attention's projection and after the block as norm-add phases."""
    return _ffn(spec)


def ggml_op_decode_layer_head_norm_post_norm_geglu_erf(spec):
    """DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU_ERF: gemma3's layer (qwen3's head norms besides), the GLU
    gelu_erf."""
    return _ffn(spec)


def ggml_op_decode_layer_post_norm_geglu_quick(spec):
    """DECODE_LAYER_POST_NORM_GEGLU_QUICK: gemma2's layer, the GLU gelu_quick: the norms after the
    attention's projection and after the block as norm-add phases."""
    return _ffn(spec)


def ggml_op_decode_layer_head_norm_post_norm_geglu_quick(spec):
    """DECODE_LAYER_HEAD_NORM_POST_NORM_GEGLU_QUICK: gemma3's layer (qwen3's head norms besides), the GLU
    gelu_quick."""
    return _ffn(spec)
