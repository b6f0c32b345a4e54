"""MUL_MAT: whole-array GEMM (M > 1, dense) and a GEMV path (M == 1, strided operands, or a
GEMM that does not tile).

ggml: dst[N, M] = src1[K, M] . src0[K, N]^T per batch, src0 broadcast over
src1's dimensions 2 and 3. In matrix terms C = A . B with A = src1 (M rows of
K), B = src0 stored column-major (N rows of K) and C = dst (M rows of N).

GEMM (plan `tiling.GemmPlan`): `rows` compute rows x `columns` columns. A is
read once per round and broadcast along the array's rows: each A feed (a shim
channel and its memory tile, `GemmPlan.a_feeds` spread over the columns)
streams the m x k blocks of consecutive array rows, and its memory tile sends
row i's block, re-laid into r x s microkernel blocks, to the cores of row i in
every column; n x k blocks of B go to all R cores of the column at once
(broadcast), through the column's memory tile (re-laid into t x s blocks) or,
for weights moved as bytes, straight from the shim; the R m x n results are
joined in the memory tile and written back row-major. Each core walks its output
tiles (batch, M block, N block) and, for each, the K steps. M and N need not
be multiples of the blocks: the last block starts early and overlaps the one
before it (same inputs, same outputs written twice).

f16 and block-quantized weights (q4_0 ... q6_K) in the GEMM (plan
`tiling.plan_gemm_blocks`): B is moved as the bytes ggml stores (int8 fifos, n rows of the
K step's whole blocks; K steps of whole blocks, 256 values for the K-quants) from the shim
to the cores without a re-layout (one block's bytes hold 32 or 256 values: the DMA cannot
re-lay them); each core decodes t rows at a time into the t x s bf16 blocks the
microkernel takes (kernels/mmq.cc) and multiplies them with its A blocks (f32, re-laid and
rounded to bf16 as for f32 src1), a K step's A in `a_split` tiles of a_k columns (a
K-quant block's 256 columns of f32 A would not fit a core beside its weights). Where that
GEMM does not tile (M below r, N below the smallest N tile, K not whole K steps, rows that
are not whole words, the 1024 DMA tasks), such weights take the GEMV.

GEMV: W = src0 (N rows of K) is split by rows over columns x rows cores; x =
a src1 row is broadcast to the cores of each column, K in chunks; each core
accumulates its rows' dot products. One product per src1 row and batch. Where the plan is
faster so (`GemvPlan.shared_x`, chosen by `tiling.gemv_cycles`), one x fifo from the first
column's shim reaches every core and W streams over the 2 C - 1 other shim channels, two
cores each.
f16 and block-quantized weights take it for M = 1, strided operands and what their GEMM
does not tile: W is moved as the bytes ggml stores (int8 fifos, whole blocks per K chunk)
and the cores decode it (kernels/mvq.cc). Block-quantized weights with 2 to 8 src1 rows in one
batch (a decode step of several tokens) take it ahead of the GEMM, all the rows at once
(`GemvPlan.nx`): an x object is the K chunk of every row, a y object a core's sums of each,
and each W tile, streamed once, is decoded once for all of them (mvq.cc's MV_NX).

The DMA access patterns of the runtime sequence come from `GemmPlan.tasks` and
`GemvPlan.tasks` (pure Python, walked by the host tests).

MUL_MAT_<glu> (REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK; the backend's fusion of a
feed-forward block's gate and up projections with their GLU): dst = act(W_g . x) * (W_u . x),
the GEMV dataflow for every src1 row with both weight matrices on one W fifo. Per round each
core zeroes its stash (nr f32 in the core function's static data), accumulates W_g's K chunks
into it, then acquires y, accumulates W_u's K chunks into y and sets y = act(stash) * y
(kernels/mv_glu.h). The shim fills the column's W fifo per round with the tap of the gate
rows from W_g, then the same tap from W_u (`GemvPlan.tasks` with `glu`), and x twice (one
tap with a stride-0 repeat).

An f16 output (MUL_MAT and RMS_NORM_MUL_MAT, below; the backend's V projection written straight into the f16 KV
cache): the GEMV, each core summing a round's K chunks into its f32 stash (kernels/mv_stash.h,
counted by the plan) and rounding the round's sums to f16 into y once, so the y fifos carry
f16 and the result is the f32 product rounded to nearest even. Dense products the GEMM takes
are refused (its C tile is f32): the backend then runs the MUL_MAT and the copy unfused.

MUL_MAT_ADD (the backend's fusion of a MUL_MAT and the ADD of its product, llama's residual
connections and biases): dst = W . x + r, the GEMV dataflow for every src1 row. The x fifo
carries per round, behind x's K chunks, one more object: the column's r values for the round's
rows (padded to the object with x's first values); each core adds its nr values to y before
releasing it (kernels/mv_add.h), so the product never leaves the core without r.
`GemvPlan.add` keeps rounds whole (no shifted last round re-reading r's rows after the output,
possibly in r's own memory, was written) and a column's r values within one x object.

RMS_NORM_MUL_MAT and RMS_NORM_MUL_MAT_<glu> (the backend's fold of llama's attn_norm /
ffn_norm, RMS_NORM then MUL by a weight row n, into the projections reading it): the GEMV and
GLU GEMV dataflows on the norm's input x, with a prologue. With s = 1 / sqrt(mean(x^2) + eps)
one scalar per x row, W . (x * s * n) = s * (W . (x * n)): every core already receives all of
x chunk by chunk, so it multiplies each chunk by n, sums its squares and scales the round's
sums by s at the end of the round, before the GLU (kernels/mv_norm.h). A core has two input
channels (W and x), so n goes on the x channel once per dispatch ahead of x's rows
(`GemvPlan.norm_tap`, one shim task) and each core keeps it in its static data (the plan counts
it). MUL_MAT's GEMM has no such prologue: those requests are refused. RMS_NORM_MUL_MAT with an
f16 output (the backend's V projection, its attn_norm folded in, written into the f16 KV cache)
combines both: the normed chunks' sums in the core's f32 stash, scaled by s at the end of the
round, then rounded to f16 once (the _<glu> variants keep an f32 output).

RMS_NORM_MUL_MAT_ROPE and RMS_NORM_MUL_MAT_ROPE_FF (the backend's fold of llama's Q and K
projections with the ROPE that follows each): RMS_NORM_MUL_MAT's GEMV (f32 or f16 output) with a
rotation epilogue. A token's product of M rows is ggml's [D, H] view, heads of D rows whose first
n_dims are rotated in pairs by the token's position, as ROPE (ROPE_FF) does (kernels/rope_math.h,
shared with ROPE's cores). The per-dispatch constants travel as n does: on the x channel once
per dispatch, behind n, in whole x objects (`GemvPlan.rope_taps`: the frequency factors, the
positions of the x rows, n's first values as padding), kept by every core (mv_rope.h, counted
by the plan). At the end of each round, after the norm's scale s, each core rotates its rows
in place (y, or the f32 stash before the one rounding to f16); it knows their global rows from
its first row within a round (a Worker argument: (column * R + row) * nr) and its own count of
rounds (the token, and the round's start as GemvPlan lays the rounds out). The plan keeps every
pair within one core's rows of a round (`tiling.RopeRows`: a NeoX head's whole n_dims span;
rows per core of one or two heads are tried), or refuses the request.

RMS_NORM_MUL_MAT_HEAD_NORM_ROPE(_FF) (qwen3's Q and K, with the norm of each head folded in):
the head norm's D weights travel with the rotation's constants and are kept by every core;
each core's rows of a round are whole heads (`RopeRows.head_norm`), which it normalises (RMS
over the head's D values, times the weights) after the norm's scale and before the rotation
(mv_rope.h).

RMS_NORM_MUL_MAT_BIAS and RMS_NORM_MUL_MAT_BIAS_ROPE(_FF) (qwen2's V, Q and K with their
biases): once per dispatch, behind n and the rotation's constants, each column's x channel
carries the bias values of the column's rows of every round (`GemvPlan.bias_taps`), of which
each core keeps its own (mv_bias.h; its first row in the column's block is a Worker
argument); rounds are whole, and each core adds its round's values after the norm's scale,
before the rotation or the rounding to f16.

RMS_NORM_QKV_ROPE and RMS_NORM_QKV_ROPE_FF (the backend's merge of llama's Q, K and V
projections of one normalised x, three outputs; plans_qkv): the array's columns partitioned
between three GEMVs, each exactly the GEMV of the op computing its projection alone
(RMS_NORM_MUL_MAT_ROPE(_FF) for Q and K, RMS_NORM_MUL_MAT for V) on its group of columns
(`_gemv_group`: its W split over each column's cores, its x fifo per column, its y joined, its
epilogue), linking its own core object (its Kernels' names end in _q, _k, _v). Every fifo,
Kernel and tap of a group is typed by its own spec, so the three weight types may differ
(llama.cpp's Q4_K_M: q4_K Wq and Wk, q6_K Wv). RMS_NORM_QKV_HEAD_NORM_ROPE(_FF) and
RMS_NORM_QKV_BIAS_ROPE(_FF) give each group its own head norm weights or bias, as the ops
above take them. Every column's
shim fills n (and for Q and K the rotation's constants) ahead of x as a lone GEMV's does; task
group i of the runtime sequence holds task group i of every group's GEMV, so that the three
weight matrices stream through all the columns at once.

Runtime-sequence arguments: src0, src1, dst (the request's order); MUL_MAT_<glu>: W_g, W_u,
x, dst; MUL_MAT_ADD: W, x, r, dst; RMS_NORM_MUL_MAT: W, x, n, dst; RMS_NORM_MUL_MAT_<glu>:
W_g, W_u, x, n, dst; RMS_NORM_MUL_MAT_ROPE: W, x, n, positions, dst; RMS_NORM_MUL_MAT_ROPE_FF:
W, x, n, positions, factors, dst; RMS_NORM_MUL_MAT_BIAS: W, x, n, b, dst;
RMS_NORM_MUL_MAT_{HEAD_NORM,BIAS}_ROPE(_FF): W, x, n, positions, (factors,) the head norm's
weights or the bias, dst; RMS_NORM_QKV_ROPE(_FF): Wq, Wk, Wv, x, n, positions, (factors,)
(Q's and K's head norm weights, or Q's, K's and V's biases,) Q, K, V.
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


def _tap(total, tap):
    """The IRON access pattern of a `tiling.Tap` over a 1-D tensor of `total` elements."""
    return TensorAccessPattern((total,), tap.offset, list(tap.sizes), list(tap.strides))


def _walk(elems, dims):
    """A memory-tile stream re-layout: (size, stride) pairs, outermost first, over one object
    of `elems` elements."""
    return TensorAccessPattern((elems,), 0, [d[0] for d in dims], [d[1] for d in dims])


def _k_chunks(of_w, of_x, k_steps, fn, *out):
    """A GEMV round's K chunks: fn(w, x, *out) on each W tile and x chunk."""
    for _ in range_(k_steps):
        w = of_w.acquire(1)
        x = of_x.acquire(1)
        fn(w, x, *out)
        of_w.release(1)
        of_x.release(1)


def _gemm(spec):
    p = spec.plan
    C, R = p.columns, p.rows
    m, n, k = p.m, p.n, p.k
    a_t, b_t, c_t = spec.src1.dtype, spec.src0.dtype, spec.dst.dtype
    # Weights moved as bytes (f16, block-quantized): a B tile is n rows of the K step's whole
    # blocks, decoded on the core (mmq.cc).
    b_t = "i8" if spec.weight_bytes else b_t
    fn, obj = ("ggml_mmq", "mmq.o") if spec.weight_bytes else ("ggml_mm", "mm.o")
    dev = device(spec.arch, C)
    seq_types = [vector_type(count, t) for t, count in spec.sequence]  # src0, src1, dst
    a_tile, b_tile, c_tile = (
        vector_type(m * p.a_k, a_t),
        vector_type(p.b_tile, b_t),
        vector_type(m * n, c_t),
    )
    zero = Kernel(f"{fn}_zero", obj, [c_tile])
    # mmq takes which of the K step's a_split A tiles it is given.
    part_arg = [np.int32] if spec.weight_bytes else []
    matmul = Kernel(fn, obj, [a_tile, b_tile, c_tile, *part_arg])
    tiles = spec.tiles_per_core
    k_steps = p.k_steps

    def core_fn(of_a, of_b, of_c, zero_fn, mm_fn):
        for _ in range_(tiles):
            c = of_c.acquire(1)
            zero_fn(c)
            for _ in range_(k_steps):
                b = of_b.acquire(1)
                for part in range(p.a_split):
                    a = of_a.acquire(1)
                    mm_fn(a, b, c, *([part] if part_arg else []))
                    of_a.release(1)
                of_b.release(1)
            of_c.release(1)

    # Memory tile re-layouts, (size, stride) outermost first (see GemmPlan).
    a_blocks, c_rows = p.a_dims(), p.c_segment_dims()
    b_blocks = None if spec.weight_bytes else p.b_dims()

    # A feeds: each streams fr consecutive array rows' tiles to its column's memory tile,
    # which sends row i's part to the cores of row i in every column (GemmPlan.a_feeds). With
    # two channels per feed (one array row each) the memory tile joins their halves of the
    # tile's rows and sends the tile to the row's cores.
    fr, ch = p.a_feed_rows, p.a_channels
    a_feeds, a_rows = {}, []
    for g in range(p.a_feeds):
        col = p.a_feed_column(g)
        if ch > 1:
            part = m * p.a_k // ch
            row = ObjectFifo(a_tile, name=f"A_r{g}", to_stream=_walk(part, a_blocks))
            subs = row.prod().join(
                [j * part for j in range(ch)],
                obj_types=[vector_type(part, a_t)] * ch,
                names=[f"A_f{g}_{j}" for j in range(ch)],
                tile=Tile(col, MEM_ROW),
            )
            a_rows.append(row)
            for j, sub in enumerate(subs):
                a_feeds[col + j] = sub
            continue
        fifo = ObjectFifo(vector_type(fr * m * p.a_k, a_t), name=f"A_f{g}")
        a_rows += fifo.cons().split(
            [i * m * p.a_k for i in range(fr)],
            obj_types=[a_tile] * fr,
            names=[f"A_r{g * fr + i}" for i in range(fr)],
            to_stream=[_walk(m * p.a_k, a_blocks)] * fr,
            tile=Tile(col, MEM_ROW),
        )
        a_feeds[col] = fifo

    b_cols, c_cols, workers = [], [], []
    for col in range(C):
        mem = Tile(col, MEM_ROW)
        b_fifo = ObjectFifo(b_tile, depth=p.b_depth, name=f"B_c{col}")
        if spec.weight_bytes:
            # Blocks cannot be re-laid by the DMA (one block's bytes hold many values): the
            # weight bytes go from the shim to the column's cores as read, rows of whole blocks.
            b_to_cores = b_fifo
        else:
            b_to_cores = b_fifo.cons().forward(
                obj_type=b_tile, name=f"B_c{col}_w", to_stream=_walk(k * n, b_blocks), tile=mem
            )
        # The join's output walks each core's m x n segment (one transfer) alike.
        c_fifo = ObjectFifo(
            vector_type(R * m * n, c_t), name=f"C_c{col}", to_stream=_walk(m * n, c_rows)
        )
        c_subs = c_fifo.prod().join(
            [i * m * n for i in range(R)],
            depths=[p.c_depth] * R,
            obj_types=[c_tile] * R,
            names=[f"C_c{col}_r{i}" for i in range(R)],
            tile=mem,
        )
        b_cols.append(b_fifo)
        c_cols.append(c_fifo)
        for i in range(R):
            args = [a_rows[i].cons(), b_to_cores.cons(), c_subs[i].prod(), zero, matmul]
            workers.append(Worker(core_fn, fn_args=args, tile=Tile(col, 2 + i)))

    totals = [count for _, count in spec.sequence]
    groups = spec.tasks()
    # Shim endpoints: per column, its A feed (if any) and B (src0) in, C (dst) out.
    handles, slots = [], []
    for col in range(C):
        shim = Tile(col, SHIM_ROW)
        slot = len(handles)
        if col in a_feeds:
            handles.append(a_feeds[col].prod(tile=shim))
        handles += [b_cols[col].prod(tile=shim), c_cols[col].cons(tile=shim)]
        slots.append((slot, col in a_feeds))

    def sequence(B, A, Cbuf, *hs):
        # Task groups from GemmPlan.tasks: per column its A feed's (src1), B (src0) and C
        # (dst) access patterns of one M block and a run of N rounds.
        for group in groups:
            tg = TaskGroup()
            for (slot, fed), (a, b, c) in zip(slots, group):
                if fed:
                    hs[slot].fill(A, tap=_tap(totals[1], a), group=tg)
                hb, hc = hs[slot + fed], hs[slot + fed + 1]
                hb.fill(B, tap=_tap(totals[0], b), group=tg)
                hc.drain(Cbuf, tap=_tap(totals[2], c), group=tg, wait=True)
            tg.finish()

    rt = Runtime(sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def _gemv_kern(spec, suffix="", core=None):
    """`kern(name, arg_types)`: the Kernel of the GEMV core function `<fn><name><suffix>` (fn
    ggml_mv, or ggml_mvq for weights moved as bytes) in `core`'s object (default spec.core)."""
    obj = (core or spec.core).object_name
    fn = "ggml_mvq" if spec.weight_bytes else "ggml_mv"
    return lambda name, args: Kernel(f"{fn}{name}{suffix}", obj, args)


def _gemv_tiles(spec):
    """The GEMV's object types: W's DMA element type and units per K chunk of a row (weights
    moved as bytes: a tile is nr rows of the K chunk's blocks), then a core's W, x and y tiles
    (GemvPlan.nx: x the K chunk of nx rows, y nr sums of each)."""
    p = spec.plan
    nr, kc = p.rows_per_tile, p.k_chunk
    w_t, w_elems = ("i8", p.w_units(kc)) if spec.weight_bytes else (spec.src0.dtype, kc)
    tiles = (
        vector_type(nr * w_elems, w_t),
        vector_type(p.nx * kc, spec.src1.dtype),
        vector_type(p.nx * nr, spec.dst.dtype),
    )
    return w_t, w_elems, *tiles


def _gemv_columns(spec, body, core_args, col0=0, w_depth=2):
    """The GEMV dataflow of each of the plan's columns, from array column `col0`: the W fifo
    split over the column's R cores by the memory tile, x to every core, the cores' y joined;
    the Worker of row i of the plan's column col (counted from col0) runs
    `body(W, x, y, *core_args(col, i))`. Returns the Workers and the shim endpoints, per column
    the W and x fills and the y drain (`_gemv_fill`; `_column_handles` reads them). With
    `GemvPlan.shared_x` the plan's columns are W channels on the array's tiles
    (`GemvPlan.array_tile`) and one x fifo from the first array column's shim reaches every
    core: its endpoint is listed once, after column 0's W. `w_depth`: the W objects the
    memory tile holds (the ring a phase's first tiles stream into while the phase before it
    runs, designs/ffn.py)."""
    p = spec.plan
    C, R, nr = p.columns, p.rows, p.rows_per_tile
    w_t, w_elems, w_tile, x_tile, y_tile = _gemv_tiles(spec)
    y_t = spec.dst.dtype
    w_cols, x_cols, y_cols, workers = [], [], [], []
    shared = ObjectFifo(x_tile, name="X") if p.shared_x else None
    for col in range(C):
        a, first = p.array_tile(col)
        a += col0
        mem = Tile(a, MEM_ROW)
        w_fifo = ObjectFifo(vector_type(R * nr * w_elems, w_t), name=f"W_c{col0 + col}")
        w_subs = w_fifo.cons(depth=w_depth).split(
            [i * nr * w_elems for i in range(R)],
            obj_types=[w_tile] * R,
            depths=[2] * R,
            names=[f"W_c{col0 + col}_r{i}" for i in range(R)],
            tile=mem,
        )
        x_fifo = shared or ObjectFifo(x_tile, name=f"X_c{col0 + col}")
        y_fifo = ObjectFifo(vector_type(R * nr * p.nx, y_t), name=f"Y_c{col0 + col}")
        y_subs = y_fifo.prod().join(
            [i * nr * p.nx for i in range(R)],
            obj_types=[y_tile] * R,
            names=[f"Y_c{col0 + col}_r{i}" for i in range(R)],
            tile=mem,
        )
        w_cols.append(w_fifo)
        x_cols.append(x_fifo)
        y_cols.append(y_fifo)
        for i in range(R):
            args = [w_subs[i].cons(), x_fifo.cons(), y_subs[i].prod(), *core_args(col, i)]
            workers.append(Worker(body, fn_args=args, tile=Tile(a, 2 + first + i)))
    # Shim endpoints: per column, W (src0) and x (src1; MUL_MAT_ADD: and r) in, y (dst) out.
    handles = []
    for col in range(C):
        shim = Tile(col0 + p.array_tile(col)[0], SHIM_ROW)
        handles.append(w_cols[col].prod(tile=shim))
        if not p.shared_x or col == 0:
            handles.append(x_cols[col].prod(tile=shim))
        handles.append(y_cols[col].cons(tile=shim))
    return workers, handles


def _column_handles(plan, hs, col):
    """(W, x, y) shim endpoints of the plan's column col among `_gemv_columns`' handles; x
    None for the columns after the first of a GemvPlan.shared_x plan (x is filled once)."""
    if not plan.shared_x:
        return tuple(hs[3 * col : 3 * col + 3])
    if col == 0:
        return tuple(hs[:3])
    return hs[2 * col + 1], None, hs[2 * col + 2]


def _gemv_group(spec, col0=0, suffix="", core=None):
    """The GEMV of `spec` (MUL_MAT, MUL_MAT_ADD, RMS_NORM_MUL_MAT; f32 or f16 output) on its
    plan's columns from array column `col0` (`_gemv_columns`): its Workers and shim endpoints.
    Its Kernels are in `core` (default: spec.core), their names ending in `suffix` (a design of
    several groups, each linking its own object: RMS_NORM_QKV_ROPE)."""
    p = spec.plan
    nr = p.rows_per_tile
    _, _, w_tile, x_tile, y_tile = _gemv_tiles(spec)
    kern = _gemv_kern(spec, suffix, core)
    rounds = spec.tiles_per_core
    k_steps = p.k_steps
    if spec.f16_out:
        # The sums go to the core's f32 stash; y (f16) is rounded from it once per round.
        kernels = [
            kern("_stash_zero", []),
            kern("_stash", [w_tile, x_tile]),
            kern("_store_f16", [y_tile]),
        ]
    else:
        kernels = [kern("_zero", [y_tile]), kern("", [w_tile, x_tile, y_tile])]
    # MUL_MAT_ADD: y += the core's r values, from the object behind the round's x chunks.
    add = kern("_add", [x_tile, y_tile, np.int32]) if spec.add else None
    # RMS_NORM_MUL_MAT: n kept aside, x normalised per chunk, y scaled per round (mv_norm.h).
    norm = _norm_kernels(spec, kern, x_tile, y_tile)
    # RMS_NORM_MUL_MAT_ROPE(_FF): the constants kept aside behind n, the round's rows rotated
    # after the scale (mv_rope.h): (load, scale or store with the core's first row).
    rope = spec.rope is not None
    if norm and spec.f16_out:
        # The normed chunks' sums in the stash, scaled by s and rounded to f16 by the store.
        store = "_norm_rope_store_f16" if rope else "_norm_store_f16"
        kernels = [
            kern("_norm_stash_zero", []),
            kern("_norm_stash", [w_tile, x_tile]),
            kern(store, [y_tile, np.int32] if rope else [y_tile]),
        ]
    elif norm:
        kernels = [kern("_norm_zero", [y_tile]), kern("_norm", [w_tile, x_tile, y_tile])]
    if rope and not spec.f16_out:
        norm = (norm[0], kern("_norm_rope_scale", [y_tile, np.int32]))
    rope_load = kern("_rope_load", [x_tile]) if rope else None
    # RMS_NORM_MUL_MAT_BIAS(...): the core's values of the bias kept behind the constants
    # (mv_bias.h, given its first row in a round's column block); the scale adds them.
    bias_load = kern("_bias_load", [x_tile, np.int32]) if spec.bias is not None else None

    def core_fn(
        of_w,
        of_x,
        of_y,
        zero_fn,
        mv_fn,
        add_fn=None,
        r_offset=0,
        load_fn=None,
        scale_fn=None,
        rope_fn=None,
        row0=0,
        bias_fn=None,
        bias_row=0,
    ):
        if load_fn is not None:
            _norm_prologue(of_x, load_fn, p.norm_objects)
        if rope_fn is not None:
            _norm_prologue(of_x, rope_fn, p.rope_objects)
        if bias_fn is not None:
            _bias_prologue(of_x, bias_fn, p.bias_objects, bias_row)
        for _ in range_(rounds):
            y = of_y.acquire(1)
            zero_fn(y)
            _k_chunks(of_w, of_x, k_steps, mv_fn, y)
            if rope_fn is not None:
                scale_fn(y, row0)  # scaled, then rotated
            elif scale_fn is not None:
                scale_fn(y)
            if add_fn is not None:
                _add_r(of_x, add_fn, y, r_offset)
            of_y.release(1)

    def core_fn_f16(
        of_w,
        of_x,
        of_y,
        zero_fn,
        stash_fn,
        store_fn,
        load_fn=None,
        rope_fn=None,
        row0=0,
        bias_fn=None,
        bias_row=0,
    ):
        if load_fn is not None:
            _norm_prologue(of_x, load_fn, p.norm_objects)
        if rope_fn is not None:
            _norm_prologue(of_x, rope_fn, p.rope_objects)
        if bias_fn is not None:
            _bias_prologue(of_x, bias_fn, p.bias_objects, bias_row)
        for _ in range_(rounds):
            zero_fn()
            _k_chunks(of_w, of_x, k_steps, stash_fn)
            y = of_y.acquire(1)
            if rope_fn is not None:
                store_fn(y, row0)  # scaled, rotated, rounded
            else:
                store_fn(y)
            of_y.release(1)

    def core_args(col, i):
        # The core's first row in a round (RMS_NORM_MUL_MAT_ROPE: its rows' heads).
        rotation = [rope_load, (col * p.rows + i) * nr] if rope else [None, 0]
        # Its first row within the column's block of a round (the bias values it keeps).
        bias = [bias_load, i * nr] if bias_load is not None else []
        if add is not None:
            return [*kernels, add, i * nr]
        if norm and spec.f16_out:
            return [*kernels, *norm, *rotation, *bias]  # the load; the store scales
        if norm:
            return [*kernels, None, 0, *norm, *rotation, *bias]
        return kernels

    body = core_fn_f16 if spec.f16_out else core_fn
    return _gemv_columns(spec, body, core_args, col0)


def _gemv_fill(spec, hs, group, tg, W, X, Y, prologue=(), bias=None):
    """One task group of `spec`'s GEMV (`GemvPlan.tasks`): per column (its W, x and y
    endpoints in `hs`, as `_gemv_group` returns them) the W fill of a run of rounds, the
    `prologue` fills on the x channel ((buffer, elements, Tap): RMS_NORM_MUL_MAT's n ahead of
    the first x row, `_norm_prologue_fills`), the column's values of `bias` (the bias's
    runtime buffer, in the first group only: GemvPlan.bias_taps), the x row's fill and the y
    drain."""
    totals = [count for _, count in spec.sequence]
    for col, (w, x, y) in enumerate(group):
        hw, hx, hy = _column_handles(spec.plan, hs, col)
        hw.fill(W, tap=_tap(totals[0], w), group=tg)
        if hx is not None:
            for buf, total, tap in prologue:
                hx.fill(buf, tap=_tap(total, tap), group=tg)
            for name, tap in spec.plan.bias_taps(col) if bias is not None else ():
                buf, total = (bias, totals[-2]) if name == "b" else (X, totals[1])
                hx.fill(buf, tap=_tap(total, tap), group=tg)
            hx.fill(X, tap=_tap(totals[1], x), group=tg)
        hy.drain(Y, tap=_tap(totals[-1], y), group=tg, wait=True)


def _add_fill(spec, hs, group, tg, W, X, Rbuf, Y, part=None):
    """One task group of MUL_MAT_ADD's GEMV (`GemvPlan.tasks` with `add`): per column the W fill
    of a run of rounds, per round on the x channel the x row's K chunks, the column's r values
    of the round's rows and the padding of that object (x's first values; neither with `Rbuf`
    None: y = W . x alone), and the y drain.
    `part` "w": the W fills only (tg None: counted, not issued), "rest": the others only
    (designs/ffn.py's `_ahead`). Returns the most tasks it issued on one column's shim."""
    totals = [count for _, count in spec.sequence]  # W, x, r, dst
    most = 0
    for col, (w, x, y, rs, pad) in enumerate(group):
        hw, hx, hy = hs[3 * col : 3 * col + 3]
        n = 0
        if part != "rest":
            if tg is not None:
                hw.fill(W, tap=_tap(totals[0], w), group=tg)
            n += 1
        if part != "w":
            for r in rs:
                hx.fill(X, tap=_tap(totals[1], x), group=tg)
                n += 1
                if Rbuf is None:
                    continue  # the GEMV alone (a layer's projection before its post norm)
                hx.fill(Rbuf, tap=_tap(totals[2], r), group=tg)
                n += 1
                if pad is not None:
                    hx.fill(X, tap=_tap(totals[1], pad), group=tg)
                    n += 1
            hy.drain(Y, tap=_tap(totals[3], y), group=tg, wait=True)
            n += 1
        most = max(most, n)
    return most


def _glu_fill(spec, hs, group, tg, Wg, Wu, X, Y, prologue=(), part=None):
    """One task group of MUL_MAT_<glu>'s GEMV (`GemvPlan.tasks` with `glu`): per column one W
    tap per round, issued on W_g then on W_u, the `prologue` fills on the x channel
    (RMS_NORM_MUL_MAT_<glu>'s n, `_norm_prologue_fills`), x repeated twice per round and the y
    drain of the group's rounds. `part` and the result: `_add_fill`'s."""
    totals = [count for _, count in spec.sequence]  # W_g, W_u, x, (n,) dst
    most = 0
    for col, (ws, x, y) in enumerate(group):
        hw, hx, hy = _column_handles(spec.plan, hs, col)
        n = 0
        if part != "rest":
            for w in ws:
                if tg is not None:
                    hw.fill(Wg, tap=_tap(totals[0], w), group=tg)
                    hw.fill(Wu, tap=_tap(totals[1], w), group=tg)
                n += 2
        if part != "w":
            if hx is not None:
                for buf, total, tap in prologue:
                    hx.fill(buf, tap=_tap(total, tap), group=tg)
                hx.fill(X, tap=_tap(totals[2], x), group=tg)
                n += len(prologue) + 1
            hy.drain(Y, tap=_tap(totals[-1], y), group=tg, wait=True)
            n += 1
        most = max(most, n)
    return most


def _norm_prologue_fills(spec, Nbuf, X, consts=()):
    """RMS_NORM_MUL_MAT's fills ahead of the first x row, on every column's x channel: n's K
    chunks and their padding from X, x's runtime buffer (`GemvPlan.norm_taps`);
    RMS_NORM_MUL_MAT_ROPE(_FF): then the rotation's constants
    (`GemvPlan.rope_taps`: the factors, the positions, n's or x's first values padding the
    last x object), `consts` the runtime buffers of the positions (and the factors, and the head
    norm's weights)."""
    p = spec.plan
    totals = [count for _, count in spec.sequence]
    x = (X, totals[2 if spec.glu else 1])
    fills = [(*((Nbuf, p.K) if name == "n" else x), tap) for name, tap in p.norm_taps()]
    if spec.rope is None:
        return fills
    # W, x, n, then the constants: the positions, (the factors,) (the head norm's weights,)
    totals = totals[3:]
    names = (
        ["pos"] + ["ff"] * (spec.rope.ff is not None) + ["hn"] * (spec.rope.head_norm is not None)
    )
    bufs = {name: (buf, total) for name, buf, total in zip(names, consts, totals)}
    bufs["n"], bufs["x"] = (Nbuf, p.K), x
    return fills + [(*bufs[name], tap) for name, tap in p.rope_taps()]


def _gemv(spec):
    p = spec.plan
    dev = device(spec.arch, p.array_columns)
    seq_types = [vector_type(count, t) for t, count in spec.sequence]  # src0, src1, dst
    workers, handles = _gemv_group(spec)
    groups = spec.tasks()

    def sequence(W, X, Y, *hs, Nbuf=None, consts=(), bias=None):
        # Task groups from GemvPlan.tasks: per column the W (src0), x (src1 row) and y
        # (dst row) access patterns of a run of rounds of one matrix-vector product;
        # RMS_NORM_MUL_MAT: n (RMS_NORM_MUL_MAT_ROPE(_FF): and the rotation's constants;
        # RMS_NORM_MUL_MAT_BIAS(...): and the column's bias values) ahead of the first x row.
        for g, group in enumerate(groups):
            tg = TaskGroup()
            first = (
                _norm_prologue_fills(spec, Nbuf, X, consts) if Nbuf is not None and g == 0 else ()
            )
            _gemv_fill(spec, hs, group, tg, W, X, Y, first, bias if g == 0 else None)
            tg.finish()

    # RMS_NORM_MUL_MAT_ROPE(_FF): the positions, (the factors,) (the head norm's weights);
    # RMS_NORM_MUL_MAT_BIAS(...): then the bias.
    n_consts = len(seq_types) - 4

    def sequence_norm(W, X, Nbuf, *rest):
        consts, Y, hs = rest[:n_consts], rest[n_consts], rest[n_consts + 1 :]
        bias = consts[-1] if spec.bias is not None else None
        consts = consts[:-1] if spec.bias is not None else consts
        sequence(W, X, Y, *hs, Nbuf=Nbuf, consts=consts, bias=bias)

    def sequence_add(W, X, Rbuf, Y, *hs):
        # GemvPlan.tasks with `add` (`_add_fill`): per round on the x channel the x row's K
        # chunks, the column's r values and the padding; W and y as for MUL_MAT.
        for group in groups:
            tg = TaskGroup()
            _add_fill(spec, hs, group, tg, W, X, Rbuf, Y)
            tg.finish()

    seq_fn = sequence_add if spec.add else sequence_norm if spec.n is not None else sequence
    rt = Runtime(seq_fn, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def _qkv(spec):
    """RMS_NORM_QKV_ROPE(_FF): three GEMVs side by side, each on its group of columns exactly as
    its op alone runs it (`_gemv_group`, its own core object), their task groups issued
    together (see the module docstring and plans_qkv)."""
    dev = device(spec.arch, spec.columns)
    seq_types = [vector_type(count, t) for t, count in spec.sequence]
    workers, handles, spans = [], [], []
    for g in spec.groups:
        ws, hs = _gemv_group(g.spec, g.col0, g.suffix, g.core)
        workers += ws
        spans.append((len(handles), len(handles) + len(hs)))
        handles += hs
    tasks = spec.tasks()
    n_args = len(seq_types)

    def sequence(*args):
        # Wq, Wk, Wv, x, n, the positions (and the factors) (and Q's and K's head norm
        # weights), Q, K, V; then the groups' shim endpoints. Task group i of every group's
        # GEMV in one task group: all the columns' weights stream at once.
        W, (X, Nbuf), Y = args[:3], args[3:5], args[n_args - 3 : n_args]
        consts = args[5 : n_args - 3]  # the positions, (the factors,) (the head norms)
        # The constants all rotations share, then each group's own (Q's and K's head norm
        # weights, or Q's, K's and V's biases).
        n_shared = len(consts) - spec.own_inputs
        shared, own = consts[:n_shared], consts[n_shared:]
        hs = args[n_args:]
        for i in range(max(len(t) for t in tasks)):
            tg = TaskGroup()
            for j, g in enumerate(spec.groups):
                if i < len(tasks[j]):
                    gh = hs[spans[j][0] : spans[j][1]]
                    mine = own[j : j + 1]
                    bias = mine[0] if g.spec.bias is not None else None
                    c = shared if bias is not None else (*shared, *mine)
                    prologue = _norm_prologue_fills(g.spec, Nbuf, X, c) if i == 0 else ()
                    b = bias if i == 0 else None
                    _gemv_fill(g.spec, gh, tasks[j][i], tg, W[j], X, Y[j], prologue, b)
            tg.finish()

    rt = Runtime(sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def _norm_kernels(spec, kern, x_tile, y_tile):
    """RMS_NORM_MUL_MAT(_<glu>)'s load (a chunk of n kept aside) and scale (y, and the GLU's
    stash, times 1 / sqrt(mean(x^2) + eps)) kernels, `kern(name, args)` making the Kernel of
    `<fn><name>`; () without the norm. With an f16 output the load only: its store kernel
    scales the stash before rounding."""
    if spec.n is None:
        return ()
    if spec.f16_out:
        return (kern("_norm_load", [x_tile]),)
    return (kern("_norm_load", [x_tile]), kern("_norm_scale", [y_tile]))


def _norm_prologue(of_x, load_fn, objects):
    """Once per dispatch: n's K chunks in `objects` x objects (GemvPlan.norm_objects), ahead of
    x's rows on the x fifo, kept by the core."""
    for _ in range_(objects):
        n = of_x.acquire(1)
        load_fn(n)
        of_x.release(1)


def _bias_prologue(of_x, load_fn, objects, *args):
    """Once per dispatch, behind the constants: the column's bias values of every round, of
    which the core keeps its own (`args`: its first row in the column's block of a round, then
    whatever else `load_fn` takes)."""
    for _ in range_(objects):
        b = of_x.acquire(1)
        load_fn(b, *args)
        of_x.release(1)


def ggml_op_mul_mat(spec):
    """GGML MUL_MAT: the GEMV design for one src1 row, the GEMM design otherwise."""
    return _gemv(spec) if spec.gemv else _gemm(spec)


def _add_r(of_x, add_fn, y, r_offset):
    """MUL_MAT_ADD's epilogue of a round: y += the core's r values, from the x object behind
    the round's K chunks."""
    r = of_x.acquire(1)
    add_fn(r, y, r_offset)
    of_x.release(1)


def _glu_kernels(spec):
    """MUL_MAT_<glu>'s core functions, in `_glu_rounds`' order: the gate's stash zero and sums,
    y's zero, the up sums, the GLU; RMS_NORM_MUL_MAT_<glu>: the normed sums, then n's load and
    the scale."""
    _, _, w_tile, x_tile, y_tile = _gemv_tiles(spec)
    kern = _gemv_kern(spec)
    gate_zero = kern("_gate_zero", [])
    gate = kern("_gate", [w_tile, x_tile])
    zero = kern("_zero", [y_tile])
    matvec = kern("", [w_tile, x_tile, y_tile])
    glu = kern("_glu", [y_tile])
    # RMS_NORM_MUL_MAT_<glu>: n kept aside, x normalised per chunk, the gate and up sums scaled
    # before the GLU (mv_norm.h).
    norm = _norm_kernels(spec, kern, x_tile, y_tile)
    if norm:
        gate_zero = kern("_norm_gate_zero", [])
        gate = kern("_norm_gate", [w_tile, x_tile])
        matvec = kern("_norm", [w_tile, x_tile, y_tile])
    return [gate_zero, gate, zero, matvec, glu, *norm]


def _glu_rounds(
    of_w,
    of_x,
    of_y,
    rounds,
    k_steps,
    gate_zero_fn,
    gate_fn,
    zero_fn,
    mv_fn,
    glu_fn,
    load_fn=None,
    scale_fn=None,
    *,
    norm_objects,
):
    """A MUL_MAT_<glu> core's dispatch (`_glu_kernels`' functions): RMS_NORM_MUL_MAT_<glu>'s n
    first (`norm_objects` x objects, GemvPlan.norm_objects), then per round the gate rows' sums
    into the stash, the up rows' into y (both scaled by the norm's s) and y = act(stash) * y."""
    if load_fn is not None:
        _norm_prologue(of_x, load_fn, norm_objects)
    for _ in range_(rounds):
        # The gate rows' sums into the core's stash.
        gate_zero_fn()
        _k_chunks(of_w, of_x, k_steps, gate_fn)
        # The up rows' sums into y, then y = act(stash) * y.
        y = of_y.acquire(1)
        zero_fn(y)
        _k_chunks(of_w, of_x, k_steps, mv_fn, y)
        if scale_fn is not None:
            scale_fn(y)
        glu_fn(y)
        of_y.release(1)


def _gemv_glu(spec):
    """MUL_MAT_<glu>: the GEMV dataflow with the gate and up weights on one W fifo (see the
    module docstring)."""
    p = spec.plan
    dev = device(spec.arch, p.array_columns)
    seq_types = [vector_type(count, t) for t, count in spec.sequence]  # W_g, W_u, x, dst
    rounds = spec.tiles_per_core
    k_steps = p.k_steps

    def core_fn(of_w, of_x, of_y, *kernels):
        _glu_rounds(of_w, of_x, of_y, rounds, k_steps, *kernels, norm_objects=p.norm_objects)

    kernels = _glu_kernels(spec)
    workers, handles = _gemv_columns(spec, core_fn, lambda col, i: kernels)
    groups = spec.tasks()

    def sequence(Wg, Wu, X, Y, *hs, Nbuf=None):
        # Task groups from GemvPlan.tasks (glu, `_glu_fill`): per column one W tap per round,
        # issued on W_g then on W_u, x repeated twice per round, y of the group's rounds;
        # RMS_NORM_MUL_MAT_<glu>: n ahead of the first x row.
        for g, group in enumerate(groups):
            tg = TaskGroup()
            first = _norm_prologue_fills(spec, Nbuf, X) if Nbuf is not None and g == 0 else ()
            _glu_fill(spec, hs, group, tg, Wg, Wu, X, Y, first)
            tg.finish()

    def sequence_norm(Wg, Wu, X, Nbuf, Y, *hs):
        sequence(Wg, Wu, X, Y, *hs, Nbuf=Nbuf)

    rt = Runtime(sequence_norm if spec.n is not None else sequence, [*seq_types, *handles])
    return Program(dev, rt, workers=workers).resolve_program()


def ggml_op_mul_mat_add(spec):
    """MUL_MAT_ADD: W . x + r, the GEMV with r's values behind each round's x chunks (see the
    module docstring)."""
    return _gemv(spec)


def ggml_op_mul_mat_reglu(spec):
    """MUL_MAT_REGLU: relu(W_g . x) * (W_u . x) (ggml: x > 0 ? x * g : 0)."""
    return _gemv_glu(spec)


def ggml_op_mul_mat_geglu(spec):
    """MUL_MAT_GEGLU: gelu(W_g . x) * (W_u . x), ggml's tanh approximation of gelu."""
    return _gemv_glu(spec)


def ggml_op_mul_mat_swiglu(spec):
    """MUL_MAT_SWIGLU: silu(W_g . x) * (W_u . x)."""
    return _gemv_glu(spec)


def ggml_op_mul_mat_geglu_erf(spec):
    """MUL_MAT_GEGLU_ERF: gelu_erf(W_g . x) * (W_u . x)."""
    return _gemv_glu(spec)


def ggml_op_mul_mat_geglu_quick(spec):
    """MUL_MAT_GEGLU_QUICK: gelu_quick(W_g . x) * (W_u . x)."""
    return _gemv_glu(spec)


def ggml_op_rms_norm_mul_mat(spec):
    """RMS_NORM_MUL_MAT: W . (rms_norm(x) * n), the GEMV with the norm's prologue (see the
    module docstring)."""
    return _gemv(spec)


def ggml_op_rms_norm_mul_mat_reglu(spec):
    """RMS_NORM_MUL_MAT_REGLU: MUL_MAT_REGLU of y = rms_norm(x) * n."""
    return _gemv_glu(spec)


def ggml_op_rms_norm_mul_mat_geglu(spec):
    """RMS_NORM_MUL_MAT_GEGLU: MUL_MAT_GEGLU of y = rms_norm(x) * n."""
    return _gemv_glu(spec)


def ggml_op_rms_norm_mul_mat_swiglu(spec):
    """RMS_NORM_MUL_MAT_SWIGLU: MUL_MAT_SWIGLU of y = rms_norm(x) * n."""
    return _gemv_glu(spec)


def ggml_op_rms_norm_mul_mat_geglu_erf(spec):
    """RMS_NORM_MUL_MAT_GEGLU_ERF: MUL_MAT_GEGLU_ERF of y = rms_norm(x) * n."""
    return _gemv_glu(spec)


def ggml_op_rms_norm_mul_mat_geglu_quick(spec):
    """RMS_NORM_MUL_MAT_GEGLU_QUICK: MUL_MAT_GEGLU_QUICK of y = rms_norm(x) * n."""
    return _gemv_glu(spec)


def ggml_op_rms_norm_mul_mat_rope(spec):
    """RMS_NORM_MUL_MAT_ROPE: ROPE of W . (rms_norm(x) * n), the GEMV with the norm's prologue
    and the rotation's epilogue (see the module docstring)."""
    return _gemv(spec)


def ggml_op_rms_norm_mul_mat_rope_ff(spec):
    """RMS_NORM_MUL_MAT_ROPE_FF: as RMS_NORM_MUL_MAT_ROPE, theta divided by the frequency
    factors (ROPE_FF)."""
    return _gemv(spec)


def ggml_op_rms_norm_qkv_rope(spec):
    """RMS_NORM_QKV_ROPE: Q = rope(Wq . y), K = rope(Wk . y), V = Wv . y of y = rms_norm(x) * n,
    three GEMVs on their groups of columns (see the module docstring)."""
    return _qkv(spec)


def ggml_op_rms_norm_qkv_rope_ff(spec):
    """RMS_NORM_QKV_ROPE_FF: as RMS_NORM_QKV_ROPE, Q's and K's theta divided by the frequency
    factors (ROPE_FF)."""
    return _qkv(spec)


def ggml_op_rms_norm_mul_mat_head_norm_rope(spec):
    """RMS_NORM_MUL_MAT_HEAD_NORM_ROPE: as RMS_NORM_MUL_MAT_ROPE, each head of the product
    RMS-normalised and multiplied by the head norm's weights before its rotation (qwen3)."""
    return _gemv(spec)


def ggml_op_rms_norm_mul_mat_head_norm_rope_ff(spec):
    """RMS_NORM_MUL_MAT_HEAD_NORM_ROPE_FF: as RMS_NORM_MUL_MAT_HEAD_NORM_ROPE with ROPE_FF's
    frequency factors."""
    return _gemv(spec)


def ggml_op_rms_norm_qkv_head_norm_rope(spec):
    """RMS_NORM_QKV_HEAD_NORM_ROPE: as RMS_NORM_QKV_ROPE, Q and K as
    RMS_NORM_MUL_MAT_HEAD_NORM_ROPE computes them (qwen3)."""
    return _qkv(spec)


def ggml_op_rms_norm_qkv_head_norm_rope_ff(spec):
    """RMS_NORM_QKV_HEAD_NORM_ROPE_FF: as RMS_NORM_QKV_HEAD_NORM_ROPE with ROPE_FF's frequency
    factors."""
    return _qkv(spec)


def ggml_op_rms_norm_mul_mat_bias(spec):
    """RMS_NORM_MUL_MAT_BIAS: W . (rms_norm(x) * n) + b, the bias kept by the cores and added
    after the norm's scale (qwen2's V; see the module docstring)."""
    return _gemv(spec)


def ggml_op_rms_norm_mul_mat_bias_rope(spec):
    """RMS_NORM_MUL_MAT_BIAS_ROPE: as RMS_NORM_MUL_MAT_ROPE, the bias added before the
    rotation (qwen2's Q and K)."""
    return _gemv(spec)


def ggml_op_rms_norm_mul_mat_bias_rope_ff(spec):
    """RMS_NORM_MUL_MAT_BIAS_ROPE_FF: as RMS_NORM_MUL_MAT_BIAS_ROPE with ROPE_FF's frequency
    factors."""
    return _gemv(spec)


def ggml_op_rms_norm_qkv_bias_rope(spec):
    """RMS_NORM_QKV_BIAS_ROPE: as RMS_NORM_QKV_ROPE, Q, K and V with their biases (qwen2)."""
    return _qkv(spec)


def ggml_op_rms_norm_qkv_bias_rope_ff(spec):
    """RMS_NORM_QKV_BIAS_ROPE_FF: as RMS_NORM_QKV_BIAS_ROPE with ROPE_FF's frequency factors."""
    return _qkv(spec)
