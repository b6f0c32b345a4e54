"""DECODE_LAYER[_BIAS|_HEAD_NORM][_POST_NORM](_FF)_<glu>: a llama, qwen2, qwen3, gemma2 or gemma3
layer of one decode step as one program (designs/ffn.py): RMS_NORM_QKV[_BIAS|_HEAD_NORM]_ROPE(_FF),
then FLASH_ATTN_FFN_<glu> with q = Q and r0 = x.

The request: inputs Wq [K, Mq], Wk [K, Mk], Wv [K, Mv] (RMS_NORM_QKV_ROPE's), x f32 [K, 1] (the
layer's input and the residual r0), n_attn f32 [K], the positions i32, (_FF) the frequency
factors f32, k and v (KV-cache views, FLASH_ATTN_EXT's), the mask f16, W_o, W_g, W_u, W_d and
n_ffn f32 [K] (the seven weights of one type); `output` out f32 [K, 1]; `extra_outputs` Q f32
[D, Hq, 1] (rotated), K rows [D, Hk, 1] and V rows [Mv, 1] (f32 or f16, dense: the cache rows
of this token), a f32 [Dv, Hq, 1, 1], r1 f32 [K, 1], h f32 [F, 1]; op_params: words 0..11
RMS_NORM_QKV_ROPE's (ROPE's 0..10, the attention norm's eps), 12..14 FLASH_ATTN_EXT's scale,
max_bias and logit_softcap, 15 the FFN norm's eps.

The qwen variants take the projections' own inputs behind the positions (and factors), as
their RMS_NORM_QKV op does: _BIAS Q's, K's and V's biases (qwen2), _HEAD_NORM Q's and K's head
norm weights (qwen3), whose eps is op_params word 16. Each group's columns receive its own
(`QkvGroup.tasks`): the head norm's weights among the rotation's constants, the bias values of
the column's rows of every round behind them (the lone op's `bias_taps`), which each core keeps
for its rows (mv_decode.h: one array, sized for the longest group). With biases the rounds
are whole, as the lone ops plan them.

_POST_NORM (gemma2; gemma3 with _HEAD_NORM): the norms after the attention's projection and
after the block, r1 = rms_norm(o) * n_post_attn + x and out = rms_norm(d) * n_post_ffn + r1,
as phases of their own behind the projections, which then write o and d without their
residuals (designs/ffn.py; `post_norm_rounds`). Inputs n_post_attn and n_post_ffn f32 [K]
behind n_ffn, outputs o and d f32 [K, T] behind h, op_params words 17 and 18 the norms' eps
(word 16 the head norm's, or 0). Over several tokens a norm-add phase's x objects hold a run
of each token's values, as MUL_MAT_ADD's r objects do.

Split heads: a NeoX rotation pairs rows half a head apart, and a head norm sums a whole head,
so the lone ops give each core whole heads a round; heads of 128 rows (Qwen, Phi-4) do not fit
a core beside the block's data that way. A group whose heads are a whole multiple of the
program's nr then takes each head in `split` consecutive rounds of one core (`QkvGroup.row0`:
consecutive cores split * nr rows apart, their W tiles and y objects strided so): the core
keeps each round's scaled (and biased) sums in the head's slot and finishes the heads whole at
the pass's last round, as the lone op does with the head in one round, bit for bit; then it
hands out the pass's y objects. A task group holds whole passes (`units_per_task_group`).

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
import functools
from dataclasses import dataclass

from .archs import Arch
from .errors import RequestError, UnsupportedError
from .plans import ROPE_PARAMS, MatmulSpec, _check_common
from .plans_fa_ffn import fa_ffn_phases
from .plans_ffn import FfnSpec, _replan
from .plans_qkv import own_inputs, prepare_qkv
from .request import Request, Tensor
from .tiling import (
    SHIM_GROUP_TASKS,
    GemvPlan,
    Tap,
    _byte_tap_ok,
    _rows_ok,
    mv_bias_bytes,
    mv_rope_bytes,
    rope_array_floats,
)

PREFIX = "DECODE_LAYER_"
# The projections' variants: what follows the prefix, and the RMS_NORM_QKV op it takes.
QKV_KINDS = {"BIAS_": "RMS_NORM_QKV_BIAS_ROPE", "HEAD_NORM_": "RMS_NORM_QKV_HEAD_NORM_ROPE"}
# gemma's norms after the attention's projection and after the block (behind the kind).
POST_NORM = "POST_NORM_"
# op_params: RMS_NORM_QKV_ROPE's 12 words, FLASH_ATTN_EXT's 3, the FFN norm's eps; (_HEAD_NORM)
# the head norm's eps.
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
    # Rounds per head: a core's rows of `split` consecutive rounds are one head (`row0`), where
    # the rotation's pairs or the head norm span more rows than a core's of a round.
    split: int = 1

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
    def own_input(self) -> bool:
        """Whether the group has an input of its own: its head norm's weights or its bias."""
        r = self.spec.rope
        return self.spec.bias is not None or (r is not None and r.head_norm is not None)

    @property
    def rounds_per_unit(self) -> int:
        """Rounds a unit of the runtime sequence covers (one W task each, one x task and one y
        drain for them all): a y object's (`pack`), or a split head's rounds with f32 rows
        (their y objects drained with one tap)."""
        return self.split if self.split > 1 and self.pack == 1 else self.pack

    @property
    def units(self) -> int:
        """Units of a core: rounds / rounds_per_unit."""
        return self.plan.rounds // self.rounds_per_unit

    @property
    def units_per_pass(self) -> int:
        """Units of a head's rounds (a split head's y objects are handed out together)."""
        return max(1, self.split // self.rounds_per_unit)

    def row0(self, col: int, i: int, rnd: int) -> int:
        """The first row of core i of the group's column col in round rnd: consecutive cores
        nr rows apart; with `split` each core's rows of a pass of `split` rounds one head."""
        p = self.plan
        nr, s = p.rows_per_tile, self.split
        head = (col * p.rows + i) * s * nr
        return (rnd // s) * s * p.block + head + (rnd % s) * nr

    # --- taps: W in W units (bytes for weights moved as bytes); x in f32; y in f32 words
    def w_taps(self, col: int, u: int) -> list[Tap]:
        """The W tiles of unit u of column col: one task per round (a round's stride may
        exceed a DMA stride, as GemvPlan._w_tap's one-round tasks avoid); with `split` the
        cores' tiles split * nr rows apart."""
        p = self.plan
        n = self.rounds_per_unit
        rounds = [self.row0(col, 0, u * n + s) for s in range(n)]
        if self.split == 1:
            return [p._w_tap(0, r, 1) for r in rounds]
        K, R, nr, kc = p.K, p.rows, p.rows_per_tile, p.k_chunk
        Kw, kcw, row = p.w_units(K), p.w_units(kc), p.row_stride
        core = self.split * nr * row
        if p.w_block_bytes and p.whole_rows:
            return [Tap(r * row, (1, R, nr, Kw), (0, core, row, 1)) for r in rounds]
        return [Tap(r * row, (K // kc, R, nr, kcw), (kcw, core, row, 1)) for r in rounds]

    def x_tap(self) -> Tap:
        """x's K chunks, once per round of the unit; with several tokens (`nx`) per K chunk
        each token's (the lone GEMV's order)."""
        p = self.plan
        kc = p.k_chunk
        return Tap(0, (self.rounds_per_unit, p.K // kc, p.nx, kc), (0, kc, p.x_row, 1))

    def y_tap(self, col: int, u: int) -> Tap:
        """The joined y objects of unit u of column col, as f32 words of the output. f32: core
        i's nr rows of each token (nx runs), one object a round of the unit. f16 (pack 2): core
        i's nx nr words hold its nr rows of round 2u of each token, then of round 2u + 1
        (mv_decode.h's store)."""
        p = self.plan
        R, nr, nx = p.rows, p.rows_per_tile, p.nx
        first = self.row0(col, 0, u * self.rounds_per_unit)
        token = p.N  # the output's rows per token (dense)
        core = self.split * nr  # rows between consecutive cores' first rows
        if self.pack == 1:
            # A split head's rounds: one object each, nr rows apart.
            n = self.rounds_per_unit
            return Tap(first, (n, R, nx, nr), (nr if n > 1 else 0, core, token, 1))
        second = self.row0(col, 0, u * self.pack + 1) - first
        return Tap(first // 2, (R, 2, nx, nr // 2), (core // 2, second // 2, token // 2, 1))

    def bias_taps(self, col: int) -> list[tuple[str, Tap]]:
        """The column's bias values of every round behind the rotation's constants, as
        GemvPlan.bias_taps, each round's R runs of nr values at the cores' rows (`row0`)."""
        p = self.plan
        if not p.bias or self.split == 1:
            return p.bias_taps(col)
        R, nr, s = p.rows, p.rows_per_tile, self.split
        first = self.row0(col, 0, 0)
        out = [("b", Tap(first, (p.rounds // s, s, R, nr), (s * p.block, nr, s * nr, 1)))]
        pad = p.bias_objects * p.nx * p.k_chunk - p.rounds * R * nr
        return out + [("x", tap) for tap in p._padding(pad)]

    def prologue(self, col: int) -> list[tuple[str, Tap]]:
        """Column col's fills ahead of its first x row, once per dispatch: n (padded from x's
        first chunks), the rotation's constants (Q, K), the column's bias values (qwen2)."""
        p = self.plan
        return p.norm_taps() + (p.rope_taps() if self.rope else []) + self.bias_taps(col)

    def tasks(self, units: int | None = None) -> dict[str, int]:
        """DMA tasks of one of the group's columns in the phase (or in its first `units`
        units): W one per round, x the prologue and one per unit, y one per unit."""
        u = self.units if units is None else min(units, self.units)
        return {"W": u * self.rounds_per_unit, "x": self.prologue_tasks + u, "y": u}

    @functools.cached_property
    def prologue_tasks(self) -> int:
        return len(self.prologue(0))

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
    # _POST_NORM: the eps (f32 bits) of the norms after the attention's projection and after
    # the block, whose phases (mv_post_norm.h) keep a sum and two runs of a core's rows.
    post_eps: tuple[int, int] | None = None

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
        one-round units (Q's f32 rows) runs beside a group of two-round ones (f16 rows); whole
        passes of split heads (their y objects are handed out at the pass's end, which a task
        group's await must not wait for ahead of the pass's weights)."""
        # The most units within the shim's tasks (a group's tasks grow with its units) ...
        lo, hi = 0, self.units
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if all(sum(g.tasks(mid).values()) <= SHIM_GROUP_TASKS for g in self.groups):
                lo = mid
            else:
                hi = mid - 1
        # ... that are whole passes.
        passes = (
            u
            for u in range(lo, 0, -1)
            if all(u % g.units_per_pass == 0 or u >= g.units for g in self.groups)
        )
        return next(passes, 0)

    @property
    def split(self) -> int:
        """Rounds per head of the groups that split their heads (1 where none does)."""
        return max(g.split for g in self.groups)

    @property
    def task_groups(self) -> list[range]:
        """The units of each of the phase's task groups."""
        n = self.units_per_task_group
        return [range(u, min(u + n, self.units)) for u in range(0, self.units, n)]

    @property
    def bias_plan(self) -> GemvPlan | None:
        """The plan of the group with the most rounds of bias values (every core's array is
        sized for it; all share nr), or None without biases."""
        plans = [g.plan for g in self.groups if g.plan.bias]
        return max(plans, key=lambda p: p.rounds) if plans else None

    @property
    def core_bytes(self) -> int:
        """Static data the phase adds to a core: the rotation's (rope_math.h's arrays, unless
        the attention's q rows hold them, the head norm's weights and the positions), the bias
        values, split heads; n_attn shares n's array, the f16 groups the GLU's stash."""
        shared = rope_array_floats(self.rope_rows) * 4 if self.rope_in_fa_q else 0
        bias = mv_bias_bytes(self.bias_plan) if self.bias_plan else 0
        # Split heads: each token's head kept (mv_decode.h's g_dl_heads).
        heads = self.q.plan.nx * self.rope_rows.head * 4 if self.split > 1 else 0
        p = self.q.plan
        post = post_norm_bytes(p.rows_per_tile, p.nx) if self.post_eps else 0
        return mv_rope_bytes(self.rope_rows) - shared + bias + heads + post

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
        out = {
            "MV_DECODE": 1,
            "DL_EPS": self.eps,
            "DL_HEAD": self.rope_rows.head,
            "DL_FF_WORDS": self.rope_rows.ff,
            "DL_ROPE_IN_FA_Q": int(self.rope_in_fa_q),
            **self.defines_rope,
        }
        if self.rope_rows.head_norm:
            out.update(DL_HEAD_NORM=1, HEAD_NORM_EPS=self.q.spec.rope.head_eps)
        if self.split > 1:
            out["DL_SPLIT"] = self.split
        if self.post_eps:
            attn, ffn = self.post_eps
            out.update(DL_POST_NORM=1, DL_POST_EPS_ATTN=attn, DL_POST_EPS_FFN=ffn)
        if self.bias_plan:
            p = self.bias_plan
            out.update(
                DL_BIAS=1, DL_BIAS_ROUNDS=p.rounds, DL_BIAS_COLUMN_ROWS=p.rows * p.rows_per_tile
            )
        return out


def post_norm_bytes(nr: int, nx: int) -> int:
    """mv_post_norm.h's static data: per token a core's rows of the projection and of the
    norm's weights (whole vectors each); the chunk counter (the sums are mv_norm.h's)."""
    return nx * 2 * -(-nr // 16) * 64 + 4


def _group_plan(
    name: str, spec: MatmulSpec, shape: GemvPlan, columns: int, pack: int
) -> QkvGroup | None:
    """The lone op's plan moved onto the program's R, nr, kc over `columns` columns (a group
    at column 0), or None where it does not fit: whole rounds (whole pairs of them for f16
    rows), whole rotation pairs (and heads) per core, else heads split over rounds (a head a
    whole multiple of nr, N whole passes of them), DMA-whole W taps."""
    p = spec.plan
    R, nr, kc = shape.rows, shape.rows_per_tile, shape.k_chunk
    if p.K % kc or (pack == 2 and nr % 2):
        return None
    split, block = 1, columns * R * nr
    if p.N % (block * pack) or not _rows_ok(p.N, columns, R, nr, p.rope):
        head = p.rope.head if p.rope else 0
        split = head // nr if head > nr and head % nr == 0 else 0
        if not split or p.N % (block * split) or (pack == 2 and split % 2):
            return None
    q = dataclasses.replace(p, columns=columns, rows=R, rows_per_tile=nr, k_chunk=kc)
    g = QkvGroup(name, dataclasses.replace(spec, plan=q), 0, split)
    if spec.weight_bytes:
        # Every W tap has the first one's sizes and strides; its offset (row0 rows) is a sum
        # of the steps to the next round, the next pass of split rounds and the next column,
        # each of which is also some tap's whole offset: those taps are DMA-whole iff all are.
        first, rounds = g.w_taps(0, 0)[0], g.units * g.rounds_per_unit
        reached = [(rounds > 1, g.row0(0, 0, 1)), (rounds > split, g.row0(0, 0, split))]
        reached.append((columns > 1, g.row0(1, 0, 0)))
        row = q.row_stride
        taps = [first] + [dataclasses.replace(first, offset=r * row) for ok, r in reached if ok]
        if not all(_byte_tap_ok(t) for t in taps):
            return None
    return g


class QkvShapes:
    """The projection phase on the candidate shapes of plans_ffn.plan_phases (with the
    attention's `FaShapes`), remembering why the ones that do not fit were refused."""

    def __init__(self, lone: dict[str, MatmulSpec], eps: int, fa_shapes, arch: Arch, post_eps=None):
        self.lone, self.eps, self.fa, self.arch = lone, eps, fa_shapes, arch
        self.post_eps = post_eps
        self.why: dict[str, int] = {}
        self.cache: dict = {}

    def _options(self, name: str, shape: GemvPlan) -> dict[int, QkvGroup]:
        """Columns -> the group (at column 0), for every column count its rows fit."""
        key = (name, shape.rows, shape.rows_per_tile, shape.k_chunk)
        if key not in self.cache:
            spec = self.lone[name]
            pack = 2 if spec.f16_out else 1
            got = {}
            for c in range(1, self.arch.columns + 1):
                g = _group_plan(name, spec, shape, c, pack)
                if g is not None:
                    got[c] = g
            self.cache[key] = got
        return self.cache[key]

    def phase(self, shape: GemvPlan) -> QkvPhase | None:
        """The projection phase on `shape` (its columns the program's), or None."""
        key = ("phase", shape.rows, shape.rows_per_tile, shape.k_chunk, shape.columns)
        if key not in self.cache:
            self.cache[key] = self._phase(shape)
        return self.cache[key]

    def _phase(self, shape: GemvPlan) -> QkvPhase | None:
        opts = [self._options(n, shape) for n in NAMES]
        if not all(opts):
            self.why["rows"] = self.why.get("rows", 0) + 1
            return None
        best, best_key = None, None
        for cq, gq in opts[0].items():
            for ck, gk in opts[1].items():
                for cv, gv in opts[2].items():
                    if cq + ck + cv > shape.columns:
                        continue
                    # The phase ends with its longest group; then the fewest columns busy.
                    rounds = max(g.plan.rounds for g in (gq, gk, gv))
                    key = (rounds, cq + ck + cv)
                    if best_key is None or key < best_key:
                        best, best_key = (gq, gk, gv), key
        if best is None:
            self.why["columns"] = self.why.get("columns", 0) + 1
            return None
        groups, col0 = [], 0
        for g in best:
            groups.append(dataclasses.replace(g, col0=col0))
            col0 += g.plan.columns
        rope = {k: v for k, v in self.lone["q"].core.defines.items() if k in ROPE_DEFINES}
        phase = QkvPhase(tuple(groups), self.eps, rope, post_eps=self.post_eps)
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
                "rotation pairs (with head norms whole heads)"
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
        (the groups' own inputs: Q's, K's (and V's) head norm weights or biases,) k, v, the
        mask, W_o, W_g, W_u, W_d, n_ffn, out, Q, K rows, V rows, a, r1, h. The positions,
        factors and own inputs, k, v and the mask as f32 words (the x fifo's type); K and V
        rows as f32 words too (the y fifo's type: f16 rows travel packed in f32 objects)."""
        q, k, v = self.qkv.groups
        # W, x, n, the positions, (the factors,) (Q's own input,) Q
        qseq = q.spec.sequence
        own = [g.spec.sequence[-2] for g in (k, v) if g.own_input]
        wg, wu, _, n, h = self.up.sequence
        wd, _, _, out = self.down.sequence
        wo, a, _, r1 = self.attn.sequence
        _, kc, vc, mask = self.fa.sequence
        outs = [qseq[-1]] + [("f32", g.out_words) for g in (k, v)]
        # _POST_NORM: the norms' weights behind n_ffn, the projections o and d behind h.
        post_in = [n, n] if self.qkv.post_eps else []
        post_out = [r1, r1] if self.qkv.post_eps else []
        return [
            qseq[0],
            k.spec.sequence[0],
            v.spec.sequence[0],
            *qseq[1:-1],
            *own,
            kc,
            vc,
            mask,
            wo,
            wg,
            wu,
            wd,
            n,
            *post_in,
            out,
            *outs,
            a,
            r1,
            h,
            *post_out,
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
        head = [
            ("Q, K, V", len(self.qkv.task_groups)),
            ("attention", len(self.fa.column_heads(0)) * len(self.fa.round_groups)),
        ]
        if not self.qkv.post_eps:
            return head + [
                ("O + residual", len(o)),
                ("norm, gate, up", len(gate_up)),
                ("down + residual", len(down)),
            ]
        post = 1 + len(self.post_norm_rounds())  # the squares' group, then a group a round
        return head + [
            ("O", len(o)),
            ("O's norm + residual", post),
            ("norm, gate, up", len(gate_up)),
            ("down", len(down)),
            ("down's norm + residual", post),
        ]

    def post_norm_squares(self) -> Tap:
        """_POST_NORM: a norm-add phase's first task on every column: p [K, T] in K chunks, per
        chunk each token's (the x objects of the GEMV over T tokens)."""
        p = self.up.plan
        K, kc = p.K, p.k_chunk
        return Tap(0, (1, K // kc, p.nx, kc), (0, kc, K, 1))

    def post_norm_rounds(self) -> list[list[tuple[Tap, Tap, Tap, Tap | None]]]:
        """_POST_NORM: the rounds of a norm-add phase (the output projection's rounds: whole
        rounds of K rows), each a task group: per column the taps of the column's rows of the
        round in p and r ([K, T]: a run per token, as MUL_MAT_ADD's r object) and in n ([K],
        its run repeated per token), the drain of the cores' rows (y objects of nr rows per
        token), and the padding of each x object (p's first values; None when R*nr == kc)."""
        p = self.attn.plan
        R, nr, nx, K = p.rows, p.rows_per_tile, p.nx, p.N
        rounds = []
        for group in self.tasks()[0]:
            for i in range(len(group[0][3])):
                cols = []
                for _, _, _, rs, pad in group:
                    rows = rs[i]
                    # The weights' run once per token: a shim task repeats by its outermost
                    # dimension only.
                    n = Tap(rows.offset, (nx, 1, 1, R * nr), (0, 0, 0, 1))
                    y = rows if nx == 1 else Tap(rows.offset, (1, R, nx, nr), (0, nr, K, 1))
                    cols.append((rows, n, y, pad))
                rounds.append(cols)
        return rounds


def _shape(p: GemvPlan) -> tuple[int, int, int, int]:
    """A program's shape: columns, cores per column, rows per core, K chunk."""
    return p.columns, p.rows, p.rows_per_tile, p.k_chunk


def q_heads_view(q: Tensor) -> Tensor:
    """Q [D, Hq, T] (dense f32) as the attention's q [D, T, Hq, 1]: the same bytes (llama's
    permuted view of Q)."""
    D, H, T = q.ne[0], q.ne[1], q.ne[2]
    return Tensor(q.dtype, (D, T, H, 1), (4, 4 * D * H, 4 * D, 4 * D * H * T))


def layer_parts(op: str) -> tuple[str, str]:
    """The two ops a DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu> replaces:
    RMS_NORM_QKV[_BIAS|_HEAD_NORM]_ROPE(_FF) and FLASH_ATTN_FFN_<glu> (_POST_NORM: whose GEMV
    phases the layer runs without their residuals, beside its norm-add phases)."""
    rest = op.removeprefix(PREFIX)
    qkv = "RMS_NORM_QKV_ROPE"
    for kind, name in QKV_KINDS.items():
        if rest.startswith(kind):
            rest, qkv = rest.removeprefix(kind), name
    rest = rest.removeprefix(POST_NORM)
    if rest.startswith("FF_"):
        rest, qkv = rest.removeprefix("FF_"), qkv + "_FF"
    return qkv, f"FLASH_ATTN_FFN_{rest}"


def _check_post_norm(op: str, x: Tensor, tensors) -> None:
    """_POST_NORM's own operands: the norms' weights f32 [K], o and d dense f32 [K, T] as x."""
    K, T = x.ne[0], x.ne[1]
    n_pa, n_pf, o, d = tensors
    for what, t, n in (
        ("n_post_attn", n_pa, K),
        ("n_post_ffn", n_pf, K),
        ("o", o, K * T),
        ("d", d, K * T),
    ):
        if t.dtype != "f32" or t.ne[0] != K or t.nelements != n or not t.is_dense():
            raise RequestError(f"{op}: {what} must be dense f32 of {n} values, not {t}")


def prepare_decode_layer(req: Request) -> DecodeSpec:
    """DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu> (see the module docstring)."""
    spec, arch = _check_common(req, strided=True)  # the op, input count, op_params, types
    op = req.op
    qkv_op, fa_op = layer_parts(op)
    ff = qkv_op.endswith("_FF")
    parts = f"the backend runs {qkv_op} and {fa_op} instead"
    post = POST_NORM in op
    if len(req.extra_outputs) != (8 if post else 6):
        outs = "a, r1, h, o and d" if post else "a, r1 and h"
        raise RequestError(f"{op}: outputs out, then Q, K rows, V rows, {outs} in extra_outputs")
    n_consts = (2 if ff else 1) + own_inputs(qkv_op)
    wq, wk, wv, x, n_attn, *rest = req.inputs
    # _POST_NORM: the two norms' weights behind n_ffn, o and d behind h.
    if post:
        *rest, n_pa, n_pf = rest
    consts, (kc, vc, mask, wo, wg, wu, wd, n_ffn) = rest[:n_consts], rest[n_consts:]
    out, (q, kr, vr, a, r1, h, *od) = req.output, req.extra_outputs
    params = tuple(req.op_params) + (0,) * (PARAMS + 3 - len(req.op_params))
    # RMS_NORM_QKV[_HEAD_NORM]_ROPE's words: ROPE's, the norm's eps, (the head norm's eps).
    qkv_params = params[:QKV_PARAMS] + ((params[PARAMS],) if "_HEAD_NORM_" in qkv_op else ())
    if x.ne[2:] != (1, 1):
        raise UnsupportedError(
            f"{op}: x {list(x.ne)} is not [K, tokens]: the layer's program decodes tokens of "
            f"one step; {parts}"
        )
    if post:
        _check_post_norm(op, x, (n_pa, n_pf, *od))
    weights = (("Wq", wq), ("Wk", wk), ("Wv", wv), ("W_o", wo), ("W_g", wg), ("W_u", wu))
    for what, w in weights[1:] + (("W_d", wd),):
        if w.dtype != wq.dtype:
            raise UnsupportedError(
                f"{op}: {what} is {w.dtype}, Wq {wq.dtype}: every phase's weight tiles go "
                f"through the cores' one W fifo (objects of one size) and one GEMV core object "
                f"decodes them (one weight type); {parts}"
            )
    qkv_req = Request(
        req.name,
        req.arch,
        qkv_op,
        qkv_params,
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
        fa_op,
        params[QKV_PARAMS:PARAMS],
        (q_heads_view(q), kc, vc, mask, wo, x, wg, wu, wd, n_ffn),
        out,
        (a, r1, h),
        req.extra,
    )
    try:
        _, specs, fa_shapes = fa_ffn_phases(fa_req)
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: {e}") from None
    post_eps = (params[PARAMS + 1], params[PARAMS + 2]) if post else None
    lone_specs = {g.name: g.spec for g in lone.groups}
    shapes = QkvShapes(lone_specs, params[ROPE_PARAMS], fa_shapes, arch, post_eps)
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
                f"{fa_op} takes alone, {own} (columns, cores per column, rows per core, K "
                f"chunk), where the projections' data must fit beside it; {parts}"
            )

    attn, up, down = _replan(op, specs, arch, wg.dtype, extra_fn, why)
    extra = shapes((attn.plan, up.plan, down.plan))
    if extra is None:
        raise AssertionError("the chosen shape does not fit the attention and projections")
    return DecodeSpec(req, arch, up, down, attn, extra.fa, extra.qkv)
