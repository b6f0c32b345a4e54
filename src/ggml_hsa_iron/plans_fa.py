"""FLASH_ATTN_EXT (and _MASK, _SINKS, _MASK_SINKS): request validation and the plan.

Operands (request order): q f32 [D, n_q, n_head, n_seq] (rows dense, other strides any), k
[D, n_kv, n_head_kv, n_seq_kv] and v [Dv, n_kv, n_head_kv, n_seq_kv] (f32, f16 or bf16, rows
dense, row and head strides any: views of the KV cache), the mask (f16 [>= n_kv, >= n_q, m2,
m3], contiguous, broadcast over heads and sequences) and the sinks (f32, one per head) when
the op has them; output f32 [Dv, n_head, n_q, n_seq] dense. op_params: scale, max_bias,
logit_softcap (f32 bit patterns).

A work item is a block of G = gh x gr query rows of one sequence: gr consecutive query rows
(i1_0 .. i1_0 + gr - 1) of gh consecutive heads that share one KV head (gh divides n_head /
n_head_kv), so one pass over the KV head's K and V serves all G rows. Blocks are numbered b =
(i3 n_rb + rb) n_hb + hb (n_hb = n_head / gh head blocks, n_rb = ceil(n_q / gr) row blocks;
the last row block starts early to end at n_q, its overlap computed twice with the same
values). The core orders a block's rows g = r gh + j (row i1_0 + r, head h0 + j), which is
the output's order: the block's output rows are one strided walk. With a per-head mask (m2 >
1) a block has one head (gh = 1): the rows of a block then always have one mask row each, in
consecutive mask rows.

Column c computes blocks c, c + C, ... with gh workers, worker j head h0 + j of each block (gr
rows; gh is at most the column's cores), the inputs broadcast to them and their output rows
joined by the column's memory tile into the output's order; its shim fills two fifos moving
32-bit words (every operand is declared as i32 in the runtime sequence, so that the mask, the
sinks and K share fifo A, q and V fifo B): A (objects of `a_words`, a chunk of `chunk` K rows),
first once per column the n_head sinks (repeated to whole objects, or, when that takes more
than MAX_REPEAT copies, once and padded by a second task with the first words of K, which the
core ignores), then
per block the mask span of its gr rows (one task: the words covering the rows' values, which
are consecutive in the mask; widened to pad to whole objects, moved back to end inside the
mask buffer, the core skipping the values before the first row from a per-block table when
rows of an odd length start mid-word) and the KV head's K rows; B (objects of a chunk of V
rows) per block: its q rows (one strided task: [gr, gh, D] at q's row and head strides,
repeated to whole objects), then the V rows. So a block costs 2 tasks on each of A and B (1 on
A without a mask) and one drain task of its G output rows; K and V are read once per block.
A padding repeat (q rows, mask span) is the task's repeat count, the outermost of its four
dimensions and at most MAX_REPEAT: the only DMA dimension that may have stride 0 (a BD's
address dimensions cannot re-read data).

G is chosen (with the chunk) by a cost model: the busiest column's DMA words (q, mask, K and
V), a handshake per object and a core's vector work (its gr rows), plus all columns' DMA
words over DDR_SHARE (the DRAM bandwidth the columns share, which makes a GQA decode take whole
KV groups), within a core's budget (q, the f32 accumulators, scores and running max/sum of its
gr rows, a decoded K row and a batch of V rows, the mask span, the fifos) and within 1024 DMA
tasks per shim channel;
what has no such plan is refused.
"""

import dataclasses
import math
from dataclasses import dataclass

from . import registry
from .archs import Arch
from .errors import RequestError, UnsupportedError
from .plans import CoreSource, _bits_f32, _check_common, _f32, _f32_bits, alibi_slopes
from .request import Request, Tensor
from .tiling import (
    MAX_REPEAT,
    MAX_STRIDE_WORDS,
    MAX_TASKS_PER_CHANNEL,
    MAX_WRAP,
    SHIM_GROUP_TASKS,
    Tap,
    block_starts,
    divisors,
    split_run,
)

SOURCE = "flash_attn.cc"
KV_TYPES = ("f32", "f16", "bf16")
KV_CODE = {"f32": 0, "f16": 1, "bf16": 2}
# aie2's bf16 pieces of a value of each K/V type (fa_rows::pieces): f16 two, bf16 one.
KV_PIECES = {"f32": 3, "f16": 2, "bf16": 1}
# DMA tasks a round's task group may hold on a shim tile until its finish() (tiling's
# SHIM_GROUP_TASKS: the shim's 16 BDs less the designs' margin).
SHIM_BDS = SHIM_GROUP_TASKS
MAX_CHUNK = 128  # K/V rows per object
MAX_SIDE_OBJECTS = 64  # objects a block's padded q rows or mask span may take
MAX_BLOCK = 64  # query rows of a core in a block (gr): its per-row state
CHUNK_OVERHEAD = 256  # words-equivalent of one object handshake (cost model)
# The core's vector work in cycles (word-equivalents), as the emulation's stand-in counts
# flash_attn.cc on aie2p (D = Dv = 64, f16 K and V): per query row and key, two cycles per
# vector of q.k and of p.V plus two (about 18); per query row and chunk, its softmax step
# (scale, mask, maximum, two exponentials, the accumulators' rescaling: about 165).
PAIR_CYCLES_BASE = 2
ROW_CHUNK_CYCLES = 165
MAX_MASK_SKIP = 0xFFFF  # f16 values before a block's first mask row in its span (a u16 table)
STATIC_SLACK = 512  # bytes of the core function's scalar state
DDR_SHARE = 2  # shim channels' worth of DRAM bandwidth all columns share (cost model)
VEC = 16  # lanes of the core's f32 vectors: its rows are padded to whole vectors


def _extent_words(t: Tensor) -> int:
    """32-bit words from t's first element to one past its last, rounded up."""
    b = t.size + sum((n - 1) * s for n, s in zip(t.ne, t.nb))
    return -(-b // 4)


def _vecs(n: int) -> int:
    """n rounded up to whole vectors."""
    return -(-n // VEC) * VEC


@dataclass(frozen=True)
class Side:
    """A part sent on a fifo ahead of K or V: `words` words padded to `objects` objects by
    repeating them `rep` times (the sinks: rep 1, padded by other words)."""

    words: int
    rep: int
    objects: int


def _side(words: int, obj: int, max_objects: int = MAX_SIDE_OBJECTS) -> Side | None:
    """`words` repeated to whole objects of `obj` words by the task's repeat count (stride 0
    on its outermost dimension only): None beyond MAX_REPEAT copies or `max_objects`."""
    total = math.lcm(words, obj)
    if total // obj > max_objects or total // words > MAX_REPEAT:
        return None
    return Side(words, total // words, total // obj)


def _sink_side(n_head: int, obj: int) -> Side:
    """The sinks: n_head words repeated to whole objects (one task) where the repeat count
    allows, else once and padded (rep 1, objects * obj > n_head: a second task)."""
    return _side(n_head, obj) or Side(n_head, 1, -(-n_head // obj))


class RunTimeLength:
    """n_kv of an attention spec with fields `k`, `step` and `n`: a run-time KV length
    (`run_time_step`) is any multiple of `step` up to n_kv_max (k's rows), given at dispatch, and
    `n` the one an instance is recorded for (0: n_kv_max); `step` 0: n_kv is k's rows, fixed."""

    @property
    def n_kv(self) -> int:
        """The keys this instance reads (the run-time value it is recorded for)."""
        return self.n or self.k.ne[1]

    @property
    def n_kv_max(self) -> int:
        """The keys the core's arrays hold: k's rows (a run-time n_kv's largest value)."""
        return self.k.ne[1]

    def at(self, n: int):
        """This spec recorded for a run-time n_kv of n (the same plan and core source)."""
        if not self.step or n % self.step or not 0 < n <= self.n_kv_max:
            raise ValueError(f"n_kv {n} is not a multiple of {self.step} up to {self.n_kv_max}")
        return dataclasses.replace(self, n=n)


@dataclass(frozen=True)
class FlashAttnOperands:
    """A FLASH_ATTN_EXT request's operands once checked (`check_flash_attn`), before any plan."""

    arch: Arch
    op: str
    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    sinks: Tensor | None
    out: Tensor
    params: tuple[int, int, int]  # the cores': scale (divided by the softcap), max_bias, softcap
    slopes: tuple[int, ...]  # ALiBi's per head, f32 bits
    step: int = 0  # run_time_step (RunTimeLength)


@dataclass(frozen=True, kw_only=True)
class FlashAttnSpec(FlashAttnOperands, RunTimeLength):
    """The checked operands and their plan."""

    request: Request
    chunk: int  # K/V rows per object
    gh: int  # heads of a block (of one KV head)
    gr: int  # consecutive query rows of a block
    columns: int
    group: int  # blocks per task group (round) and column
    q_side: Side
    m_side: Side | None
    s_side: Side | None
    n: int = 0  # RunTimeLength

    # --- shapes
    @property
    def d(self) -> int:
        return self.q.ne[0]

    @property
    def dv(self) -> int:
        return self.v.ne[0]

    @property
    def mask_side(self) -> Side | None:
        """The mask span's side for this instance: with a run-time n_kv, its gr rows' n_kv / 2
        words each in runs of step / 2, repeated to whole objects by one repeat count."""
        if not self.step or self.m_side is None:
            return self.m_side
        return _run_time_mask_side(self.n_kv, self.step, self.a_words, self.gr)

    @property
    def mask_ne(self) -> tuple[int, int, int, int]:
        """The mask's shape at this instance: with a run-time n_kv, rows of n_kv values (the
        mask llama.cpp makes for the graph's n_kv, dense), else the request's."""
        m = self.mask.ne
        return (self.n_kv, m[1], m[2], m[3]) if self.step else m

    @property
    def mask_stride(self) -> int:
        """Values between two mask rows at this instance (ggml_fa_begin's argument; 0
        without a mask)."""
        return self.mask_ne[0] if self.mask is not None else 0

    @property
    def mask_words(self) -> int:
        """The mask buffer's 32-bit words at this instance."""
        if not self.step:
            return _extent_words(self.mask)
        return -(-math.prod(self.mask_ne) // 2)

    @property
    def n_q(self) -> int:
        return self.q.ne[1]

    @property
    def n_head(self) -> int:
        return self.q.ne[2]

    @property
    def g(self) -> int:
        """Query rows of a block."""
        return self.gh * self.gr

    @property
    def n_hb(self) -> int:
        return self.n_head // self.gh

    @property
    def row_starts(self) -> list[int]:
        return block_starts(self.n_q, self.gr)

    @property
    def blocks(self) -> int:
        return self.q.ne[3] * len(self.row_starts) * self.n_hb

    @property
    def k_row_words(self) -> int:
        return self.d * self.k.size // 4

    @property
    def v_row_words(self) -> int:
        return self.dv * self.v.size // 4

    @property
    def a_words(self) -> int:
        return self.chunk * self.k_row_words

    @property
    def b_words(self) -> int:
        return self.chunk * self.v_row_words

    @property
    def chunks(self) -> int:
        return self.n_kv // self.chunk

    @property
    def side_objects(self) -> int:
        """Objects of fifo A before a block's K chunks: its mask span."""
        return self.mask_side.objects if self.m_side is not None else 0

    @property
    def q_objects(self) -> int:
        """Objects of fifo B before a block's V chunks: its q rows."""
        return self.q_side.objects

    @property
    def sink_objects(self) -> int:
        return self.s_side.objects if self.s_side is not None else 0

    def column_blocks(self, c: int) -> list[int]:
        return list(range(c, self.blocks, self.columns))

    def block_index(self, b: int) -> tuple[int, int, int]:
        """(first query row i1_0, first head h0, sequence i3) of block b."""
        starts = self.row_starts
        hb = b % self.n_hb
        rb = (b // self.n_hb) % len(starts)
        return starts[rb], hb * self.gh, b // (self.n_hb * len(starts))

    def block_rows(self, b: int) -> list[tuple[int, int, int]]:
        """(i1, h, i3) of the block's rows in the core's order (g = r gh + j)."""
        i1, h0, i3 = self.block_index(b)
        return [(i1 + r, h0 + j, i3) for r in range(self.gr) for j in range(self.gh)]

    # --- taps (over the operands as 32-bit words)
    def q_tap(self, b: int) -> Tap:
        i1, h0, i3 = self.block_index(b)
        nb = self.q.nb
        off = (i1 * nb[1] + h0 * nb[2] + i3 * nb[3]) // 4
        return Tap(off, (self.q_side.rep, self.gr, self.gh, self.d), (0, nb[1] // 4, nb[2] // 4, 1))

    def mask_span(self, b: int) -> tuple[int, int]:
        """(first word, skipped f16 values) of block b's mask span: the `m_side.words` words
        from the first word hold its gr rows (consecutive mask rows, m0 values apart) after
        the skipped values. The span starts on the word holding the first row's first value
        (one skipped when it starts mid-word); when it would run past the mask buffer it is
        moved back to end on the buffer's last word (more values skipped)."""
        i1, h0, i3 = self.block_index(b)
        m = self.mask_ne
        elem = (((i3 % m[3]) * m[2] + h0 % m[2]) * m[1] + i1) * m[0]
        first = min(elem // 2, self.mask_words - self.mask_side.words)
        return first, elem - 2 * first

    def mask_skips(self) -> tuple[int, ...]:
        """Skipped f16 values of every block's mask span."""
        return tuple(self.mask_span(b)[1] for b in range(self.blocks))

    def mask_tap(self, b: int) -> Tap:
        s = self.mask_side
        a, w = (s.words // (self.step // 2), self.step // 2) if self.step else split_run(s.words, 4)
        return Tap(self.mask_span(b)[0], (s.rep, 1, a, w), (0, 0, w, 1))

    @property
    def sink_pad(self) -> int:
        """Words after the sinks (once) to the end of their last object."""
        return self.sink_objects * self.a_words - self.n_head

    def sink_taps(self) -> list[tuple[str, Tap]]:
        """All heads' sinks, once per column, as (operand, tap) fills of fifo A: repeated to
        whole objects by the task's repeat count, or (more copies than a repeat count
        allows) once and then padded with the first words of K (read, not used: an operand
        at least an object long that needs no walk of its own)."""
        s = self.s_side
        if s.rep * s.words == s.objects * self.a_words:
            return [("sinks", Tap(0, (s.rep, 1, 1, self.n_head), (0, 0, 0, 1)))]
        return [
            ("sinks", Tap(0, (1, self.n_head), (0, 1))),
            ("k", Tap(0, (1, self.sink_pad), (0, 1))),
        ]

    @property
    def sink_tasks(self) -> int:
        return len(self.sink_taps()) if self.s_side is not None else 0

    def _kv_tap(self, t: Tensor, h: int, i3: int, row_words: int) -> Tap:
        r2 = self.n_head // t.ne[2]
        r3 = self.q.ne[3] // t.ne[3]
        off = ((h // r2) * t.nb[2] + (i3 // r3) * t.nb[3]) // 4
        n, stride = self.n_kv, t.nb[1] // 4
        if stride == row_words or n == 1:
            return Tap(off, (1, n * row_words), (0, 1))
        r = self.step or _rows_split(n)
        return Tap(off, (n // r, r, row_words), (r * stride, stride, 1))

    def k_tap(self, b: int) -> Tap:
        _, h0, i3 = self.block_index(b)
        return self._kv_tap(self.k, h0, i3, self.k_row_words)

    def v_tap(self, b: int) -> Tap:
        _, h0, i3 = self.block_index(b)
        return self._kv_tap(self.v, h0, i3, self.v_row_words)

    def out_tap(self, b: int) -> Tap:
        """The block's G output rows (f32), in the core's order."""
        i1, h0, i3 = self.block_index(b)
        off = ((i3 * self.n_q + i1) * self.n_head + h0) * self.dv
        dv = self.dv
        return Tap(off, (1, self.gr, self.gh, dv), (0, self.n_head * dv, dv, 1))

    def rounds(self, c: int) -> list[list[int]]:
        bs = self.column_blocks(c)
        return [bs[i : i + self.group] for i in range(0, len(bs), self.group)]

    @property
    def tasks_per_block(self) -> tuple[int, int, int]:
        """(fifo A, fifo B, drain) DMA tasks per block: the mask span and K on A, q and V
        on B (two per channel: a third on one channel would cap the blocks a column takes
        at 341 instead of 512)."""
        return 1 + (self.m_side is not None), 2, 1

    def channel_tasks(self) -> tuple[int, int, int]:
        """DMA tasks on the busiest column's channels: (fifo A, fifo B, output)."""
        n = len(self.column_blocks(0))
        ta, tb, to = self.tasks_per_block
        return n * ta + self.sink_tasks, n * tb, n * to

    def kv_bytes(self) -> int:
        """K and V bytes the kernel reads (each block reads its KV head's)."""
        return self.blocks * self.n_kv * (self.d * self.k.size + self.dv * self.v.size)

    @property
    def sequence(self) -> list[tuple[str, int]]:
        ins = [t for t in (self.q, self.k, self.v, self.mask, self.sinks) if t is not None]
        return [("i32", _extent_words(t)) for t in ins] + [("f32", self.out.nelements)]

    def has_skips(self) -> bool:
        """Whether some block's mask span skips values (then the core keeps the table)."""
        if self.m_side is None:
            return False
        if self.step:
            # Rows of a multiple of the (even) step, whole words; every span inside the mask.
            return False
        if self.mask.ne[0] % 2:
            return True
        # Even rows start on a word: only spans moved back at the buffer's end skip values;
        # the last blocks' spans are the furthest in.
        m = self.mask.ne
        last = set()
        for i3 in range(min(self.q.ne[3], m[3])):
            for h0 in {(hb * self.gh) % m[2] for hb in range(self.n_hb)}:
                last.add((i3, h0))
        i1 = self.row_starts[-1]
        total = _extent_words(self.mask)
        for i3, h0 in last:
            elem = (((i3 % m[3]) * m[2] + h0) * m[1] + i1) * m[0]
            if elem // 2 > total - self.m_side.words:
                return True
        return False

    @property
    def core(self) -> CoreSource:
        d = {
            "FA_D": self.d,
            "FA_DV": self.dv,
            "FA_NKV": self.n_kv_max,
            "FA_CHUNK": self.chunk,
            "FA_K_TYPE": KV_CODE[self.k.dtype],
            "FA_V_TYPE": KV_CODE[self.v.dtype],
            "FA_A_WORDS": self.a_words,
            "FA_B_WORDS": self.b_words,
            "FA_GH": self.gh,
            "FA_GR": self.gr,
            "FA_NHB": self.n_hb,
            "FA_Q_OBJECTS": self.q_side.objects,
            "FA_N_HEAD": self.n_head,
            "FA_SCALE": self.params[0],
            "FA_SOFTCAP": self.params[2],
        }
        if self.m_side is not None:
            d["HAS_MASK"] = 1
            d["FA_M_WORDS"] = self.m_side.words
            d["FA_M_OBJECTS"] = self.m_side.objects
            if self.has_skips():
                d["FA_BLOCKS"] = self.blocks
                d["FA_M_SKIPS"] = ",".join(map(str, self.mask_skips()))
        if self.s_side is not None:
            d["HAS_SINKS"] = 1
            d["FA_S_OBJECTS"] = self.s_side.objects
        if self.slopes:
            d["ALIBI_SLOPES"] = ",".join(f"0x{b:08x}u" for b in self.slopes)
        return CoreSource(SOURCE, "flash_attn.o", d)

    def static_bytes(self) -> int:
        """A core's static data: its gr q rows (one head's), accumulators and score rows, the
        running maxima and sums, a decoded K row and a batch of V rows (V_BATCH in
        flash_attn.cc), the mask span and its skip table, the sinks and slopes; on aie2 the
        bf16 pieces of the q rows, the K row, the V rows and the rows' probabilities."""
        g, dp, dvp, cp = self.gr, _vecs(self.d), _vecs(self.dv), _vecs(self.chunk)
        v_batch = next(b for b in (8, 4, 2, 1) if self.chunk % b == 0)
        words = g * (dp + dvp + cp + 2) + dp + v_batch * dvp
        if self.arch.name == "aie2":
            pk, pv = (KV_PIECES[t.dtype] for t in (self.k, self.v))
            halves = (g + 1) * pk * dp + v_batch * pv * dvp + 3 * g * cp
            words += -(-halves // 2)
        words += self.n_head * ((self.s_side is not None) + bool(self.slopes))
        if self.m_side is not None:
            words += self.m_side.words + VEC // 2
            if self.has_skips():  # a u16 per block
                words += -(-self.blocks // 2)
        return 4 * words + STATIC_SLACK

    def fifo_bytes(self) -> int:
        return 2 * 4 * (self.a_words + self.b_words + self.dv)

    def cost(self) -> int:
        """Word-equivalents of the busiest column's work (DMA words, a handshake per object,
        the vector work: a q.k and a p.v per row and key, VEC lanes at a time, and a softmax
        step per row and chunk) plus every column's DMA words over DDR_SHARE: the columns
        share the DRAM's bandwidth, so reading K and V once per KV group beats spreading a
        decode's heads over more columns."""
        words = (self.side_objects + self.chunks) * self.a_words
        words += (self.q_objects + self.chunks) * self.b_words
        handshakes = (self.side_objects + self.q_objects + 2 * self.chunks) * CHUNK_OVERHEAD
        per_pair = 2 * (_vecs(self.d) + _vecs(self.dv)) // VEC + PAIR_CYCLES_BASE
        vector = self.gr * (self.n_kv * per_pair + self.chunks * ROW_CHUNK_CYCLES)
        sink_words = self.sink_objects * self.a_words
        busiest = len(self.column_blocks(0)) * (words + handshakes + vector) + sink_words
        total = self.blocks * words + self.columns * sink_words
        return busiest + total // DDR_SHARE


def _mask_side(mask: Tensor, n_kv: int, gr: int, obj: int) -> Side | None:
    """The mask span's side: the fewest words (within the mask buffer) holding gr
    consecutive rows' values (the last row's first n_kv) wherever the span starts (one more
    value when rows of an odd length start mid-word), that pad to at most MAX_SIDE_OBJECTS
    objects of `obj` words. More words than the span needs (a divisor or a multiple of `obj`)
    read the values after it, or before it at the buffer's end (FlashAttnSpec.mask_span)."""
    m0 = mask.ne[0]
    values = (gr - 1) * m0 + n_kv
    need = -(-(values + m0 % 2) // 2)
    cands = {need} | {x for x in divisors(obj) if x > need}
    cands |= {obj * k for k in range(1, MAX_SIDE_OBJECTS + 1) if obj * k > need}
    for w in sorted(cands):
        if w > _extent_words(mask):
            break
        side = _side(w, obj)
        if side is None or 2 * w - values > MAX_MASK_SKIP or split_run(w, 4) is None:
            continue
        return side
    return None


# The request field of a run-time KV length (`run_time_step`).
RUN_TIME_KEY = "n_kv_step"
# Its largest step: step / 2 mask words and step K or V rows are one DMA dimension each.
MAX_STEP = MAX_WRAP


def run_time_step(req: Request) -> int:
    """The request's run-time KV length (`n_kv_step`, docs/kernel-compiler-protocol.md): n_kv
    is given at dispatch, any multiple of the step up to k's rows; 0 when n_kv is k's rows."""
    step = req.extra.get(RUN_TIME_KEY, 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise RequestError(f"{RUN_TIME_KEY} must be a non-negative integer, got {step!r}")
    return step


def _run_time_mask_side(n_kv: int, step: int, obj: int, rows: int = 1) -> Side | None:
    """A run-time n_kv's mask span of `rows` consecutive query rows (dense rows of n_kv
    values): rows n_kv / 2 words, moved in runs of step / 2, repeated to whole objects of `obj`
    words by one repeat count for every multiple of step."""
    words = rows * n_kv // 2
    rep = obj // math.gcd(obj, rows * step // 2)
    return Side(words, rep, rep * words // obj) if rep <= MAX_REPEAT else None


def _rows_split(n: int) -> int:
    """The inner row count r (n = a r, both within a DMA wrap) of a strided K/V walk."""
    for r in reversed(divisors(n)):
        if r <= MAX_WRAP and n // r <= MAX_WRAP:
            return r
    raise UnsupportedError(f"FLASH_ATTN_EXT: {n} K/V rows cannot be walked by one DMA task")


def check_flash_attn(req: Request) -> FlashAttnOperands:
    """What FLASH_ATTN_EXT's semantics and the DMA's words ask of the operands, whatever the
    plan: the types, the shapes, the mask, rows of whole words within a DMA's reach, a
    run-time n_kv's step; RequestError or UnsupportedError."""
    spec = registry.lookup(req.op)
    # The common checks but the dense-operand rule: K and V are strided cache views.
    _, arch = _check_common(req, strided=True)
    op = spec.op
    q, k, v = req.inputs[:3]
    rest = list(req.inputs[3:])
    mask = rest.pop(0) if "MASK" in op else None
    sinks = rest.pop(0) if "SINKS" in op else None
    out = req.output
    if q.dtype != "f32" or out.dtype != "f32":
        raise UnsupportedError(f"{op}: q and the output must be f32")
    for name, t in (("k", k), ("v", v)):
        if t.dtype not in KV_TYPES:
            raise UnsupportedError(f"{op}: {name} must be f32, f16 or bf16, not {t.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.nb[0] != t.size:
            raise UnsupportedError(f"{op}: {name}'s rows must be dense")
    d, n_q, n_head, n_seq = q.ne
    dv, n_kv = v.ne[0], k.ne[1]
    shapes_ok = (
        k.ne[0] == d
        and v.ne[1] == n_kv
        and all(v.ne[i] == k.ne[i] and q.ne[i] % k.ne[i] == 0 for i in (2, 3))
        and out.ne == (dv, n_head, n_q, n_seq)
    )
    if not shapes_ok:
        raise RequestError(f"{op}: q, k, v and the output do not agree")
    if not out.is_dense():
        # Some query rows of several sequences (a view of a larger output): the blocks' drains
        # address a dense output.
        raise UnsupportedError(f"{op}: the output must be dense, its strides are {list(out.nb)}")
    if mask is not None:
        m = mask.ne
        ok = (
            mask.dtype == "f16"
            and mask.is_dense()
            and m[0] >= n_kv
            and m[1] >= n_q
            and all(q.ne[i] % m[i] == 0 for i in (2, 3))
        )
        if not ok:
            raise UnsupportedError(f"{op}: the mask must be a dense f16 [>= n_kv, >= n_q, ...]")
    if sinks is not None and (sinks.dtype != "f32" or sinks.nelements < n_head):
        raise UnsupportedError(f"{op}: sinks must be f32, one per head")
    # Everything is moved as 32-bit words: K/V rows and their strides must be whole words.
    for name, t in (("k", k), ("v", v)):
        if (t.ne[0] * t.size) % 4 or any(s % 4 for s in t.nb[1:]):
            raise UnsupportedError(
                f"{op}: {name}'s rows ({t.ne[0]} x {t.dtype}, strides {list(t.nb)}) are not "
                "whole 32-bit words"
            )
        if t.nb[1] // 4 > MAX_STRIDE_WORDS or t.ne[0] * t.size // 4 > MAX_WRAP:
            raise UnsupportedError(f"{op}: {name}'s rows are too long or too far apart for a DMA")
    if d > MAX_WRAP or dv > MAX_WRAP:
        raise UnsupportedError(f"{op}: head sizes above {MAX_WRAP} are not supported")
    if any(s // 4 > MAX_STRIDE_WORDS for s in q.nb[1:3]):
        raise UnsupportedError(f"{op}: q's rows are too far apart for a DMA")
    step = run_time_step(req)
    if step and (
        mask is None
        or sinks is not None
        or step % 2
        or step > MAX_STEP
        or n_kv % step
        or mask.ne[0] != n_kv
    ):
        raise UnsupportedError(
            f"{op}: a run-time n_kv (n_kv_step {step}) takes a mask of the largest n_kv's rows "
            f"({n_kv}, a multiple of the step) and no sinks; the step even, at most {MAX_STEP}"
        )
    if not step:
        _rows_split(n_kv)  # the K/V walk of a block (refused when n_kv has no split)
    params = tuple(req.op_params[:3]) + (0,) * (3 - len(req.op_params[:3]))
    max_bias = _bits_f32(params[1])
    if max_bias > 0 and mask is None:
        raise UnsupportedError(f"{op}: ALiBi (max_bias > 0) without a mask is not supported")
    slopes = ()
    if max_bias > 0:
        slopes = tuple(_f32_bits(s) for s in alibi_slopes(n_head, max_bias))
    softcap = _bits_f32(params[2])
    scale = _bits_f32(params[0])
    if softcap != 0:
        # ggml-cpu folds 1/softcap into the scale: s = softcap * tanh(q.k * (scale / softcap)).
        scale = _f32(scale / softcap)
    core_params = (_f32_bits(scale), params[1], params[2])
    return FlashAttnOperands(arch, op, q, k, v, mask, sinks, out, core_params, slopes, step)


def prepare_flash_attn(req: Request) -> FlashAttnSpec:
    ops = check_flash_attn(req)
    arch, op, q, k, v, mask, sinks, step = (
        ops.arch, ops.op, ops.q, ops.k, ops.v, ops.mask, ops.sinks, ops.step
    )  # fmt: skip
    checked = {f.name: getattr(ops, f.name) for f in dataclasses.fields(ops)}
    d, n_q, n_head, n_seq = q.ne
    dv, n_kv = v.ne[0], k.ne[1]

    # A block's heads share a KV head; with a per-head mask a block has one head, so that its
    # mask rows are consecutive.
    r2 = n_head // k.ne[2]
    # A block's heads are its column's cores, one each.
    ghs = [1] if mask is not None and mask.ne[2] > 1 else divisors(r2)
    ghs = [gh for gh in ghs if gh <= arch.compute_rows]
    # With a run-time n_kv the chunks of every multiple of the step are whole.
    chunks = [
        c
        for c in divisors(step or n_kv)
        if c <= MAX_CHUNK and (c * d * k.size) % 4 == 0 and (c * dv * v.size) % 4 == 0
    ]
    best, min_tasks, fits_tasks = None, None, False
    for gh in ghs:
        for gr in range(1, min(n_q, MAX_BLOCK) + 1):
            blocks = n_seq * len(block_starts(n_q, gr)) * (n_head // gh)
            columns = min(arch.columns, blocks)
            per_col = -(-blocks // columns)
            # The sinks take one task, or two (checked per chunk below).
            tasks = max(per_col * (1 + (mask is not None)) + (sinks is not None), per_col * 2)
            min_tasks = tasks if min_tasks is None else min(min_tasks, tasks)
            if tasks > MAX_TASKS_PER_CHANNEL:
                continue
            fits_tasks = True
            for c in chunks:
                a_words, b_words = c * d * k.size // 4, c * dv * v.size // 4
                q_side = _side(gh * gr * d, b_words)
                if step:
                    m_side = _run_time_mask_side(n_kv, step, a_words, gr)
                else:
                    m_side = _mask_side(mask, n_kv, gr, a_words) if mask is not None else None
                s_side = _sink_side(n_head, a_words) if sinks is not None else None
                if q_side is None:
                    continue
                if mask is not None and m_side is None:
                    continue
                # Padding after the sinks (sink_taps) is read from K: it must stay inside.
                if s_side and s_side.objects * a_words - s_side.rep * n_head > _extent_words(k):
                    continue
                cand = FlashAttnSpec(
                    **checked, request=req, chunk=c, gh=gh, gr=gr, columns=columns, group=1,
                    q_side=q_side, m_side=m_side, s_side=s_side,
                )  # fmt: skip
                if cand.fifo_bytes() + cand.static_bytes() > arch.l1_budget:
                    continue
                if max(cand.channel_tasks()) > MAX_TASKS_PER_CHANNEL:
                    continue
                key = (cand.cost(), -cand.g)
                if best is None or key < best[0]:
                    best = (key, cand)
    if best is None and not fits_tasks:
        raise UnsupportedError(
            f"{op}: at least {min_tasks} DMA tasks on a shim channel, at most "
            f"{MAX_TASKS_PER_CHANNEL}: too many blocks of query rows x heads ({n_q} x {n_head} "
            f"x {n_seq}) for one kernel"
        )
    if best is None:
        raise UnsupportedError(
            f"{op}: no block of query rows and K/V chunk of n_kv = {n_kv} rows (D = {d}, Dv = "
            f"{dv}, {k.dtype}/{v.dtype}{', with a mask' if mask is not None else ''}) fits a "
            f"compute tile ({arch.l1_budget} bytes) within {MAX_TASKS_PER_CHANNEL} DMA tasks "
            "per shim channel"
        )
    cand = best[1]
    ta, tb, to = cand.tasks_per_block
    group = max(1, (SHIM_BDS - cand.sink_tasks) // (ta + tb + to))
    group = min(group, len(cand.column_blocks(0)))
    return dataclasses.replace(cand, group=group)
