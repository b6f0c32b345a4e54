"""DECODE_LAYER_<glu> and DECODE_LAYER_FF_<glu>: a llama layer of one decode step as one program
(designs/ffn.py): RMS_NORM_QKV_ROPE(_FF), then FLASH_ATTN_FFN_<glu> with q = Q and r0 = x.

The request: inputs Wq [K, Mq], Wk [K, Mk], Wv [K, Mv] (RMS_NORM_QKV_ROPE's), x f32 [K, 1] (the
layer's input and the residual r0), n_attn f32 [K], the positions i32, (_FF) the frequency
factors f32, k and v (KV-cache views, FLASH_ATTN_EXT's), the mask f16, W_o, W_g, W_u, W_d and
n_ffn f32 [K] (the seven weights of one type); `output` out f32 [K, 1]; `extra_outputs` Q f32
[D, Hq, 1] (rotated), K rows [D, Hk, 1] and V rows [Mv, 1] (f32 or f16, dense: the cache rows
of this token), a f32 [Dv, Hq, 1, 1], r1 f32 [K, 1], h f32 [F, 1]; op_params: words 0..11
RMS_NORM_QKV_ROPE's (ROPE's 0..10, the attention norm's eps), 12..14 FLASH_ATTN_EXT's scale,
max_bias and logit_softcap, 15 the FFN norm's eps.

The program: the projection phase (`QkvPhase`), then FLASH_ATTN_FFN_<glu>'s four phases
(plans_fa_ffn), all on the same shape (C columns, R cores per column, nr rows per core, kc
words per x object), the same fifos (per core one W fifo in, one x fifo in, one y fifo out)
and one core object. k and v include the rows this program writes: every drain of Q, K rows
and V rows is awaited before the attention's first fill.

The projection phase runs Q, K and V side by side on disjoint groups of columns (Q from column
0, then K, then V), each group exactly the GEMV of the op computing its projection alone
(RMS_NORM_MUL_MAT_ROPE(_FF) for Q and K, RMS_NORM_MUL_MAT for V) on the program's R, nr and kc
and the group's columns. K and V are small (Llama-3.2-1B: 512 rows each, while a round of the
block's shape covers 2048), so a group takes only the columns it fills: the columns are chosen
per candidate shape so that the phase ends soonest (the most rounds of any group the fewest),
each group's rows whole rounds of its columns. Columns outside every group have no task in the
phase, and their cores skip it (a worker's loop counts are its own Python ints).

f16 cache rows: the y fifo's objects are nr f32 (4 nr bytes) and the DMA neither converts nor
drops bytes, so a core of an f16 group fills one y object with two rounds' nr f16 values each
(`pack` 2: its rows of round 2u, then of round 2u + 1), every byte real data; the joined object
(R cores' 2 nr f16) is drained into the cache rows with one tap (`QkvGroup.y_tap`). Such a
group's rounds are whole pairs. This adds no fifo: the memory tile's 6 S2MM and 6 MM2S
channels per column already carry W in, its R splits, y's R joins and y out (R + 1 each way).

The norm prologue: every column of a group receives n_attn once ahead of its first x row (as
the lone op's), Q's and K's columns then the rotation's constants (the factors, the token's
position), which each core keeps (mv_rope_bytes, counted in its memory with every other
phase's static data). The FFN's n later replaces n_attn in the same array (mv_norm.h refills
from its start at each load of K values). The attention norm's eps and the FFN norm's are two
compile-time constants of the one object (DL_EPS and OP_P0).

Several tokens (up to 8 of one KV cache: a unified cache's sequences, a draft's verification
batch): every phase takes them at once, each weight tile decoded once for all (GemvPlan.nx),
the projection phase's x objects holding each token's K chunk and its y objects each token's
run of rows (mv_decode.h: each token's scale and position); the attention reads Q as its
permuted view [D, T, Hq]. The layer then takes the block's own shape (FLASH_ATTN_FFN_<glu>'s
alone) or is refused: the cores bind over several tokens, so a smaller shape would cost more
than the dispatch it saves.

Refused (UnsupportedError): weights not all of one type (llama.cpp's Q4_K_M layers with a q6_K
Wv or W_d); whatever RMS_NORM_QKV_ROPE(_FF) or FLASH_ATTN_FFN_<glu> refuses (more than 8
tokens, several tokens of unquantized weights); several tokens where the projections do not fit
beside the block's own shape; and where no shape fits every phase.
"""

import dataclasses
from dataclasses import dataclass

from .archs import Arch
from .dtypes import DMA_WORD
from .errors import RequestError, UnsupportedError
from .plans import ROPE_PARAMS, MatmulSpec, _check_common
from .plans_fa_ffn import fa_ffn_phases
from .plans_ffn import FfnSpec, _replan
from .plans_qkv import prepare_qkv
from .request import Request, Tensor
from .tiling import (
    SHIM_GROUP_TASKS,
    GemvPlan,
    Tap,
    _byte_tap_ok,
    _rows_ok,
    mv_rope_bytes,
    rope_array_floats,
)

PREFIX = "DECODE_LAYER_"
FF_PREFIX = "DECODE_LAYER_FF_"
# op_params: RMS_NORM_QKV_ROPE's 12 words, FLASH_ATTN_EXT's 3, the FFN norm's eps.
QKV_PARAMS = ROPE_PARAMS + 1
PARAMS = QKV_PARAMS + 4
# The projections in the order of their column groups.
NAMES = ("q", "k", "v")
# The rope_math.h defines of the lone RMS_NORM_MUL_MAT_ROPE's core kept by the layer's object.
ROPE_DEFINES = (
    "N_DIMS",
    "NEOX",
    "FF",
    "YARN",
    "THETA_SCALE",
    "FREQ_SCALE",
    "EXT_FACTOR",
    "MSCALE",
    "CORR_LOW",
    "CORR_DEN",
)


@dataclass(frozen=True)
class QkvGroup:
    """One projection's GEMV on columns col0 .. col0 + plan.columns - 1 of the program."""

    name: str  # "q", "k" or "v"
    spec: MatmulSpec  # the lone op's spec, its plan on the program's R, nr, kc and its columns
    col0: int

    @property
    def plan(self) -> GemvPlan:
        return self.spec.plan

    @property
    def pack(self) -> int:
        """Rounds per y object: 2 for f16 rows (two rounds' nr f16 in nr f32 of bytes)."""
        return 2 if self.spec.f16_out else 1

    @property
    def rope(self) -> bool:
        return self.spec.rope is not None

    @property
    def units(self) -> int:
        """y objects of a core: rounds / pack."""
        return self.plan.rounds // self.pack

    def row0(self, col: int, i: int, rnd: int) -> int:
        """The first row of core i of the group's column col in round rnd."""
        p = self.plan
        return rnd * p.block + (col * p.rows + i) * p.rows_per_tile

    # --- taps: W in W units (bytes for weights moved as bytes); x in f32; y in f32 words
    def w_taps(self, col: int, u: int) -> list[Tap]:
        """The W tiles of unit u of column col: one task per round (a round's stride may
        exceed a DMA stride, as GemvPlan._w_tap's one-round tasks avoid)."""
        p = self.plan
        return [p._w_tap(0, self.row0(col, 0, u * self.pack + s), 1) for s in range(self.pack)]

    def x_tap(self) -> Tap:
        """x's K chunks, once per round of the unit; with several tokens (`nx`) per K chunk
        each token's (the lone GEMV's order)."""
        p = self.plan
        kc = p.k_chunk
        return Tap(0, (self.pack, p.K // kc, p.nx, kc), (0, kc, p.x_row, 1))

    def y_tap(self, col: int, u: int) -> Tap:
        """The joined y object of unit u of column col, as f32 words of the output. f32: core
        i's nr rows of each token (nx runs). f16 (pack 2): core i's nx nr words hold its nr
        rows of round 2u of each token, then of round 2u + 1 (mv_decode.h's store)."""
        p = self.plan
        R, nr, block, nx = p.rows, p.rows_per_tile, p.block, p.nx
        first = self.row0(col, 0, u * self.pack)
        token = p.N  # the output's rows per token (dense)
        if self.pack == 1:
            return Tap(first, (1, R, nx, nr), (0, nr, token, 1))
        return Tap(first // 2, (R, 2, nx, nr // 2), (nr // 2, block // 2, token // 2, 1))

    def tasks(self, units: int | None = None) -> dict[str, int]:
        """DMA tasks of one of the group's columns in the phase (or in its first `units`
        units): W one per round, x the prologue (n and its padding, the rotation's constants)
        and one per unit, y one per unit."""
        u = self.units if units is None else min(units, self.units)
        prologue = len(self.plan.norm_taps()) + (len(self.plan.rope_taps()) if self.rope else 0)
        return {"W": u * self.pack, "x": prologue + u, "y": u}

    @property
    def out_words(self) -> int:
        """The output's 32-bit words (its runtime-sequence argument, declared f32)."""
        return self.spec.dst.nbytes // 4


@dataclass(frozen=True)
class QkvPhase:
    """The projection phase of DECODE_LAYER_<glu> on one shape (see the module docstring)."""

    groups: tuple[QkvGroup, ...]  # Q, K, V
    eps: int  # the attention norm's eps, f32 bits
    defines_rope: dict  # rope_math.h's defines (the lone Q op's)
    # The rotation's arrays kept in the attention's q rows (which are loaded after this phase).
    rope_in_fa_q: bool = False

    @property
    def q(self) -> QkvGroup:
        return self.groups[0]

    @property
    def rope_rows(self):
        return self.q.plan.rope

    @property
    def rounds(self) -> int:
        """The phase's length in rounds (its longest group's)."""
        return max(g.plan.rounds for g in self.groups)

    @property
    def units(self) -> int:
        return max(g.units for g in self.groups)

    @property
    def units_per_task_group(self) -> int:
        """Units the runtime sequence issues in one task group: as many as every column's
        shim tasks allow (its first group holds the prologue too), so that a group of
        one-round units (Q's f32 rows) runs beside a group of two-round ones (f16 rows)."""
        fits = [
            u
            for u in range(1, self.units + 1)
            if all(sum(g.tasks(u).values()) <= SHIM_GROUP_TASKS for g in self.groups)
        ]
        return max(fits, default=0)

    @property
    def task_groups(self) -> list[range]:
        """The units of each of the phase's task groups."""
        n = self.units_per_task_group
        return [range(u, min(u + n, self.units)) for u in range(0, self.units, n)]

    @property
    def core_bytes(self) -> int:
        """Static data the phase adds to a core: the rotation's (rope_math.h's arrays, unless
        the attention's q rows hold them, and the positions); n_attn shares n's array, the f16
        groups the GLU's stash."""
        shared = rope_array_floats(self.rope_rows) * 4 if self.rope_in_fa_q else 0
        return mv_rope_bytes(self.rope_rows) - shared

    @property
    def tasks(self) -> dict[str, int]:
        """DMA tasks of the busiest column's shim channels in the phase."""
        out = {"W": 0, "x": 0, "y": 0}
        for g in self.groups:
            for k, v in g.tasks().items():
                out[k] = max(out[k], v)
        return out

    def group_of(self, col: int):
        """(group, column within it) of array column col, or (None, 0)."""
        for g in self.groups:
            if g.col0 <= col < g.col0 + g.plan.columns:
                return g, col - g.col0
        return None, 0

    @property
    def defines(self) -> dict[str, int]:
        return {
            "MV_DECODE": 1,
            "DL_EPS": self.eps,
            "DL_HEAD": self.rope_rows.head,
            "DL_FF_WORDS": self.rope_rows.ff,
            "DL_ROPE_IN_FA_Q": int(self.rope_in_fa_q),
            **self.defines_rope,
        }


def _group_plan(spec: MatmulSpec, shape: GemvPlan, columns: int, pack: int) -> GemvPlan | None:
    """The lone op's plan moved onto the program's R, nr, kc over `columns` columns, or None
    where it does not fit: whole rounds (whole pairs of them for f16 rows), whole rotation
    pairs per core, DMA-whole W taps."""
    p = spec.plan
    R, nr, kc = shape.rows, shape.rows_per_tile, shape.k_chunk
    q = dataclasses.replace(p, columns=columns, rows=R, rows_per_tile=nr, k_chunk=kc)
    if p.N % (q.block * pack) or not _rows_ok(p.N, columns, R, nr, p.rope):
        return None
    if pack == 2 and nr % 2:
        return None
    if p.K % kc:
        return None
    if spec.weight_bytes:
        # The group's W taps (QkvGroup.w_taps: one round each) differ only in their first row,
        # and _byte_tap_ok reads their offset modulo a DMA word: one tap per residue of it.
        g = QkvGroup("", dataclasses.replace(spec, plan=q), 0)
        firsts = {}
        for col in range(columns):
            for rnd in range(g.units * g.pack):
                first = g.row0(col, 0, rnd)
                firsts.setdefault((first * q.row_stride) % DMA_WORD, first)
        if not all(_byte_tap_ok(q._w_tap(0, first, 1)) for first in firsts.values()):
            return None
    return q


class QkvShapes:
    """The projection phase on the candidate shapes of plans_ffn.plan_phases (with the
    attention's `FaShapes`), remembering why the ones that do not fit were refused."""

    def __init__(self, lone: dict[str, MatmulSpec], eps: int, fa_shapes, arch: Arch):
        self.lone, self.eps, self.fa, self.arch = lone, eps, fa_shapes, arch
        self.why: dict[str, int] = {}
        self.cache: dict = {}

    def _options(self, name: str, shape: GemvPlan) -> dict[int, GemvPlan]:
        """Columns -> the group's plan, for every column count its rows fit."""
        key = (name, shape.rows, shape.rows_per_tile, shape.k_chunk)
        if key not in self.cache:
            spec = self.lone[name]
            pack = 2 if spec.f16_out else 1
            got = {}
            for c in range(1, self.arch.columns + 1):
                q = _group_plan(spec, shape, c, pack)
                if q is not None:
                    got[c] = q
            self.cache[key] = got
        return self.cache[key]

    def phase(self, shape: GemvPlan) -> QkvPhase | None:
        """The projection phase on `shape` (its columns the program's), or None."""
        opts = [self._options(n, shape) for n in NAMES]
        if not all(opts):
            self.why["rows"] = self.why.get("rows", 0) + 1
            return None
        best, best_key = None, None
        for cq, pq in opts[0].items():
            for ck, pk in opts[1].items():
                for cv, pv in opts[2].items():
                    if cq + ck + cv > shape.columns:
                        continue
                    # The phase ends with its longest group; then the fewest columns busy.
                    key = (max(pq.rounds, pk.rounds, pv.rounds), cq + ck + cv)
                    if best_key is None or key < best_key:
                        best, best_key = (pq, pk, pv), key
        if best is None:
            self.why["columns"] = self.why.get("columns", 0) + 1
            return None
        groups, col0 = [], 0
        for name, q in zip(NAMES, best):
            groups.append(QkvGroup(name, dataclasses.replace(self.lone[name], plan=q), col0))
            col0 += q.columns
        rope = {k: v for k, v in self.lone["q"].core.defines.items() if k in ROPE_DEFINES}
        phase = QkvPhase(tuple(groups), self.eps, rope)
        if phase.units_per_task_group == 0:
            self.why["tasks"] = self.why.get("tasks", 0) + 1
            return None
        return phase

    def __call__(self, plans):
        """The attention and projection phases on the candidate's shape, as one `extra` of
        plan_phases (their core bytes and shim tasks summed), or None."""
        qkv = self.phase(plans[0])
        if qkv is None:
            return None
        # The attention's chunks fit beside the block's and the projections' static data;
        # else, where its q rows can hold them, beside all but the rotation's arrays.
        fa = self.fa(plans, qkv.core_bytes)
        if fa is None:
            qkv = dataclasses.replace(qkv, rope_in_fa_q=True)
            fa = self.fa(plans, qkv.core_bytes)
            if fa is not None and fa.q_floats < rope_array_floats(qkv.rope_rows):
                fa = None
        return Extra(fa, qkv) if fa is not None else None

    def explain(self) -> str:
        text = {
            "rows": (
                "Q, K and V each whole rounds of R x nr rows per column (f16 rows: whole pairs "
                "of rounds, nr even) on some count of columns, every core's rows whole "
                "rotation pairs"
            ),
            "columns": "the Q, K and V groups side by side within the program's columns",
            "tasks": f"a first task group within a shim's {SHIM_GROUP_TASKS} DMA tasks",
        }
        seen = [text[k] for k in text if k in self.why]
        fa = self.fa.explain() if self.fa.why else ""
        parts = [fa] if fa else []
        if seen:
            parts.append("the projection phase needs " + "; ".join(seen))
        return "; ".join(parts) or "none fits"


@dataclass(frozen=True)
class Extra:
    """The attention and projection phases of one candidate shape (plan_phases' `extra`)."""

    fa: object
    qkv: QkvPhase

    @property
    def core_bytes(self) -> int:
        return self.fa.core_bytes + self.qkv.core_bytes

    @property
    def tasks(self) -> dict[str, int]:
        return {k: v + self.qkv.tasks[k] for k, v in self.fa.tasks.items()}


@dataclass(frozen=True)
class DecodeSpec(FfnSpec):
    """FLASH_ATTN_FFN_<glu>'s FfnSpec with the projection phase ahead of it."""

    qkv: QkvPhase | None = None

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """The request's operand order: Wq, Wk, Wv, x, n_attn, the positions, (the factors,)
        k, v, the mask, W_o, W_g, W_u, W_d, n_ffn, out, Q, K rows, V rows, a, r1, h. The
        positions and factors, k, v and the mask as f32 words (the x fifo's type); K and V
        rows as f32 words too (the y fifo's type: f16 rows travel packed in f32 objects)."""
        q, k, v = self.qkv.groups
        qseq = q.spec.sequence  # W, x, n, the positions, (the factors,) Q
        wg, wu, _, n, h = self.up.sequence
        wd, _, _, out = self.down.sequence
        wo, a, _, r1 = self.attn.sequence
        _, kc, vc, mask = self.fa.sequence
        outs = [qseq[-1]] + [("f32", g.out_words) for g in (k, v)]
        return [
            qseq[0],
            k.spec.sequence[0],
            v.spec.sequence[0],
            *qseq[1:-1],
            kc,
            vc,
            mask,
            wo,
            wg,
            wu,
            wd,
            n,
            out,
            *outs,
            a,
            r1,
            h,
        ]

    @property
    def core(self):
        c = super().core
        return dataclasses.replace(c, defines={**c.defines, **self.qkv.defines})

    def sequence_phases(self) -> list[tuple[str, int]]:
        """The runtime sequence's phases in the order designs/ffn.py issues them, each with
        its count of task groups (each group ends with an await): how a timing of the program
        splits into its phases."""
        o, gate_up, down = self.tasks()
        return [
            ("Q, K, V", len(self.qkv.task_groups)),
            ("attention", len(self.fa.column_heads(0)) * len(self.fa.round_groups)),
            ("O + residual", len(o)),
            ("norm, gate, up", len(gate_up)),
            ("down + residual", len(down)),
        ]


def _shape(p: GemvPlan) -> tuple[int, int, int, int]:
    """A program's shape: columns, cores per column, rows per core, K chunk."""
    return p.columns, p.rows, p.rows_per_tile, p.k_chunk


def q_heads_view(q: Tensor) -> Tensor:
    """Q [D, Hq, T] (dense f32) as the attention's q [D, T, Hq, 1]: the same bytes (llama's
    permuted view of Q)."""
    D, H, T = q.ne[0], q.ne[1], q.ne[2]
    return Tensor(q.dtype, (D, T, H, 1), (4, 4 * D * H, 4 * D, 4 * D * H * T))


def prepare_decode_layer(req: Request) -> DecodeSpec:
    """DECODE_LAYER(_FF)_<glu> (see the module docstring)."""
    spec, arch = _check_common(req, strided=True)  # the op, input count, op_params, types
    op = req.op
    ff = op.startswith(FF_PREFIX)
    glu = op[len(FF_PREFIX if ff else PREFIX) :]
    if len(req.extra_outputs) != 6:
        raise RequestError(
            f"{op} has seven outputs: out, then Q, K rows, V rows, a, r1 and h in extra_outputs"
        )
    n_consts = 2 if ff else 1
    wq, wk, wv, x, n_attn, *rest = req.inputs
    consts, (kc, vc, mask, wo, wg, wu, wd, n_ffn) = rest[:n_consts], rest[n_consts:]
    out, (q, kr, vr, a, r1, h) = req.output, req.extra_outputs
    params = tuple(req.op_params) + (0,) * (PARAMS - len(req.op_params))
    if x.ne[2:] != (1, 1):
        raise UnsupportedError(
            f"{op}: x {list(x.ne)} is not [K, tokens]: the layer's program decodes tokens of "
            f"one step; the backend runs RMS_NORM_QKV_ROPE{'_FF' if ff else ''} and "
            f"FLASH_ATTN_FFN_{glu} instead"
        )
    weights = (("Wq", wq), ("Wk", wk), ("Wv", wv), ("W_o", wo), ("W_g", wg), ("W_u", wu))
    for what, w in weights[1:] + (("W_d", wd),):
        if w.dtype != wq.dtype:
            raise UnsupportedError(
                f"{op}: {what} is {w.dtype}, Wq {wq.dtype}: every phase's weight tiles go "
                f"through the cores' one W fifo (objects of one size) and one GEMV core object "
                f"decodes them (one weight type); the backend runs "
                f"RMS_NORM_QKV_ROPE{'_FF' if ff else ''} and FLASH_ATTN_FFN_{glu} instead"
            )
    qkv_req = Request(
        req.name,
        req.arch,
        "RMS_NORM_QKV_ROPE" + ("_FF" if ff else ""),
        params[:QKV_PARAMS],
        (wq, wk, wv, x, n_attn, *consts),
        q,
        (kr, vr),
    )
    try:
        lone = prepare_qkv(qkv_req)  # its checks and refusals; its groups' lone specs
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: {e}") from None
    fa_req = Request(
        req.name,
        req.arch,
        f"FLASH_ATTN_FFN_{glu}",
        params[QKV_PARAMS:],
        (q_heads_view(q), kc, vc, mask, wo, x, wg, wu, wd, n_ffn),
        out,
        (a, r1, h),
        req.extra,
    )
    try:
        _, specs, fa_shapes = fa_ffn_phases(fa_req)
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: {e}") from None
    shapes = QkvShapes({g.name: g.spec for g in lone.groups}, params[ROPE_PARAMS], fa_shapes, arch)
    extra_fn, why = shapes, shapes.explain
    tokens = x.ne[1]
    if tokens > 1:
        # Over several tokens the cores' work grows with the tokens and binds (the block over
        # 8 tokens on aie2p): a shape smaller than the block's own, where the projections'
        # data do not fit beside it, costs the layer more than the dispatch it saves. The
        # layer then takes the block's own shape or is refused.
        own = _shape(_replan(op, specs, arch, wg.dtype, fa_shapes, fa_shapes.explain)[0].plan)

        def extra_fn(plans):
            return shapes(plans) if _shape(plans[0]) == own else None

        def why():
            return (
                f"{shapes.explain()}; over {tokens} tokens the layer takes the shape "
                f"FLASH_ATTN_FFN_{glu} takes alone, {own} (columns, cores per column, rows per "
                f"core, K chunk), where the projections' data must fit beside it; the backend "
                f"runs RMS_NORM_QKV_ROPE{'_FF' if ff else ''} and FLASH_ATTN_FFN_{glu}"
            )

    attn, up, down = _replan(op, specs, arch, wg.dtype, extra_fn, why)
    extra = shapes((attn.plan, up.plan, down.plan))
    if extra is None:
        raise AssertionError("the chosen shape does not fit the attention and projections")
    return DecodeSpec(req, arch, up, down, attn, extra.fa, extra.qkv)
