"""FLASH_ATTN_FFN_<glu>: llama's attention of a decode step and the block after it as one
program (designs/ffn.py): FLASH_ATTN_EXT_MASK, then MUL_MAT_ADD_RMS_NORM_FFN_<glu> on its output.

The request: inputs q f32 [D, Ts, n_head, S] (a decode step's tokens: Ts query rows of each of
S streams, T = Ts S in all; rows dense, other strides any, the streams' rows evenly strided as
llama.cpp's view of one Q makes them), k [D, n_kv, n_head_kv, S] and v [Dv, n_kv, n_head_kv, S]
(f32, f16 or bf16 views of the KV cache, rows dense, row, head and stream strides any: S = 1
for one cache, unified; S > 1 for llama.cpp's cache per sequence, each stream's tokens
attending to its own), the mask (f16 [>= n_kv, >= Ts, 1, S], a row per token,
FLASH_ATTN_EXT_MASK's), W_o [Ka, K] (Ka = Dv n_head), r0 f32 [K, T], W_g, W_u [K, F], W_d [F,
K] (the four weights of one type) and n f32 [K]; op_params scale, max_bias, logit_softcap
(FLASH_ATTN_EXT's, f32 bits) and eps; `output` out f32 [K, T] and `extra_outputs` [a f32 [Dv,
n_head, Ts, S] dense, r1 f32 [K, T], h f32 [F, T]]:

    a   = FLASH_ATTN_EXT(q, k, v, mask)        r1 = W_o . a + r0  (a read as [Ka, T])
    h   = act(W_g . y) * (W_u . y), y = rms_norm(r1) * n          out = W_d . h + r1

Planned as MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s three phases (plans_ffn.attn_ffn_phases, each
refusing what its op refuses) with a phase ahead of them, the attention (`FaPhase`), which runs
on the very fifos and cores of the GEMV phases (a shim has two MM2S channels, both the GEMV's W
and x in every column): so the shape (C columns, R cores per column, nr rows per core, kc words
per x object) is chosen by plans_ffn.plan_phases with the attention's constraints checked for
every candidate (`fa_phase`), its core memory and its DMA tasks counted with the other phases'.

The attention phase: column c computes KV heads c, c + C, ... (a round each); its R cores share
the KV head's K and V, which its x fifo broadcasts to them, read from DRAM once. Core i takes
q heads kvh gq + i gh ... + gh - 1 (gq = n_head / n_head_kv, gh = gq / R). Per round the x
stream carries every token's group q rows, then stream by stream the keys of its cache in `nc`
chunks of n_kv / nc keys each: every one of its tokens' part of its mask row, the chunk's K
rows, its V rows (each piece whole x objects: the q rows and the mask parts padded by
repeating them, K and V rows whole objects of whole rows; with T > 1 the block's phases take
the T rows at once, GemvPlan.nx, and an x object holds T K chunks' words). An object's rows
carry a divisor of every chunk's keys (`ObjectKeys`): all of them where they divide it, else
(3, 5, 6 or 7 tokens' objects against chunks of powers of two) fewer, read as two overlapping
runs of rows within the chunk, the core taking each key once. So each K and V row is read
once for the tokens of its stream; a key is skipped only where every one of their mask rows
hides it. The core keeps the scores of its gh heads of a stream's tokens over one chunk and
an online softmax over the chunks
(kernels/mv_fa.h: the running maximum rescales the sums and the accumulators), so the context
is not bounded by the core's memory: the plan takes the fewest chunks whose scores fit. The
chunk count is fixed in the program and the chunk's length a fraction of n_kv, so that a
run-time n_kv changes the tasks' lengths and the loops' counts, never the program's shape.
Each core writes its gh heads' Dv outputs as Dv / nr y objects each (an object: the T tokens'
nr values), joined by the memory tile and drained into a with one strided task per round. The
W fifo carries nothing in this phase.

FLASH_ATTN_GLU_<glu>: the same program without the block's down phase, for a layer whose W_d
has another weight type than W_o, W_g and W_u (llama.cpp's Q4_K_M: q6_K ffn_down beside q4_K):
the phases share one W fifo, whose objects have one size, so such a W_d runs as its own
MUL_MAT_ADD after it. Inputs q, k, v, the mask, W_o, r0, W_g, W_u, n; the same op_params;
`output` h f32 [F, T] and `extra_outputs` [a, r1].

Refused: more than 8 query rows (T), several streams of q rows over one cache, T > 1
where the block's phases take the rows one at a time (weights not block-quantized), ALiBi
(max_bias != 0), a per-head mask, what FLASH_ATTN_EXT_MASK's operand checks or
MUL_MAT_ADD_RMS_NORM_FFN_<glu> refuse, and where no shape fits (the refusal says which of the
attention's constraints failed).
"""

import dataclasses
from dataclasses import dataclass

from .archs import Arch
from .errors import RequestError, UnsupportedError
from .plans import GEMV_MAX_X_ROWS, _bits_f32, _check_common
from .plans_fa import (
    KV_CODE,
    RunTimeLength,
    Side,
    _extent_words,
    _rows_split,
    _run_time_mask_side,
    _side,
    check_flash_attn,
)
from .plans_ffn import FfnSpec, _replan, attn_ffn_phases, attn_phases, ffn_core_bytes
from .request import Request, Tensor
from .tiling import MAX_REPEAT, MAX_WRAP, SHIM_GROUP_TASKS, VECTOR_ELEMS, Tap, divisors, split_run

PREFIX = "FLASH_ATTN_FFN_"
GLU_PREFIX = "FLASH_ATTN_GLU_"
F32 = 4
# Chunks of keys a round may take: each costs three DMA tasks on the x channel.
MAX_CHUNKS = 32


def _vecs(n: int) -> int:
    """n rounded up to whole vectors (the core's arrays, kernels/mv_fa.h)."""
    return -(-n // VECTOR_ELEMS) * VECTOR_ELEMS


@dataclass(frozen=True)
class ObjectKeys:
    """How an x object of K (or V) rows carries a chunk's keys: `keys` of them, its rows read
    as `parts` runs of `part_rows` consecutive rows, run j from the object's key j * `part_step`
    (runs overlapping where the object holds more rows than keys: the core takes each key
    once, kernels/mv_fa.h)."""

    keys: int
    parts: int
    part_rows: int
    part_step: int


def object_keys(rows: int, unit: int) -> ObjectKeys | None:
    """An object of `rows` K or V rows for chunks whose lengths are multiples of `unit` keys:
    the `rows` keys where they divide unit, else the largest divisor u of unit below them and
    above half of them, read as two overlapping runs of rows / 2 (the second from key
    u - rows / 2: a shim task repeats rows only by its outermost dimension): every read stays
    within the chunk, a DMA pattern of whole objects for every chunk length; None where no
    divisor fits."""
    if unit % rows == 0:
        return ObjectKeys(rows, 1, rows, 0)
    if rows % 2:
        return None
    half = rows // 2
    u = max((d for d in divisors(unit) if half < d < rows), default=0)
    return ObjectKeys(u, 2, half, u - half) if u else None


@dataclass(frozen=True)
class FaPhase(RunTimeLength):
    """The attention phase of FLASH_ATTN_FFN_<glu> on one shape of the GEMV's array."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor
    a: Tensor
    params: tuple[int, int]  # scale (divided by the softcap) and softcap, f32 bits
    columns: int
    rows: int  # R: cores per column
    nr: int  # f32 values of a core's y object
    kc: int  # 32-bit words of an x object
    q_side: Side  # the group's q rows of every token, repeated to whole objects
    m_side: Side  # a chunk's mask words of every token, repeated to whole objects (at n_kv_max)
    step: int = 0  # RunTimeLength
    n: int = 0
    nc: int = 1  # chunks of keys per round (the online softmax's blocks)
    pieces: bool = False  # aie2: q and K/V rows kept as bf16 pieces too (kernels/mv_fa.h)

    # --- shapes
    @property
    def d(self) -> int:
        return self.q.ne[0]

    @property
    def streams(self) -> int:
        """S: the sequences with a KV cache each (llama.cpp's cache per sequence: q, K, V and
        the mask have one of each along dimension 3), 1 for one cache (unified)."""
        return self.q.ne[3]

    @property
    def stream_tokens(self) -> int:
        """The query rows of one stream (a stream's tokens of the step)."""
        return self.q.ne[1]

    @property
    def tokens(self) -> int:
        """T: the query rows of every stream (the step's tokens, stream by stream)."""
        return self.q.ne[1] * self.q.ne[3]

    @property
    def steps(self) -> int:
        """Chunks of keys per round: each stream's nc chunks of its own cache, stream by
        stream."""
        return self.streams * self.nc

    @property
    def dv(self) -> int:
        return self.v.ne[0]

    @property
    def chunk(self) -> int:
        """Keys of a chunk in this instance: n_kv / nc."""
        return self.n_kv // self.nc

    @property
    def chunk_max(self) -> int:
        """Keys of a chunk at n_kv_max: the scores the core keeps per head."""
        return self.n_kv_max // self.nc

    @property
    def mask_side(self) -> Side:
        """A chunk's mask words repeated to whole objects for this instance: with a run-time
        n_kv, the same repeat count for every n_kv (so that the objects are n_kv's multiple)."""
        if not self.step:
            return self.m_side
        return _run_time_mask_side(self.chunk, self.step // self.nc, self.kc, self.stream_tokens)

    @property
    def mask_row_words(self) -> int:
        """Words between two tokens' mask rows at this instance: with a run-time n_kv, rows of
        n_kv values (the mask llama.cpp makes for the graph's n_kv, dense)."""
        return (self.n_kv if self.step else self.mask.ne[0]) // 2

    @property
    def mask_stream_words(self) -> int:
        """Words between two streams' mask rows at this instance (with a run-time n_kv, a
        stream's rows of n_kv values, dense)."""
        if self.step:
            return self.mask.ne[1] * self.mask_row_words
        return self.mask.nb[3] // 4

    @property
    def n_head(self) -> int:
        return self.q.ne[2]

    @property
    def n_head_kv(self) -> int:
        return self.k.ne[2]

    @property
    def gq(self) -> int:
        """q heads per KV head (the group a column's round computes)."""
        return self.n_head // self.n_head_kv

    @property
    def gh(self) -> int:
        """q heads of one core in a round."""
        return self.gq // self.rows

    @property
    def k_row_words(self) -> int:
        return self.d * self.k.size // 4

    @property
    def v_row_words(self) -> int:
        return self.dv * self.v.size // 4

    @property
    def unit(self) -> int:
        """What every chunk length is a multiple of: a run-time n_kv's step's share, or the
        one chunk length."""
        return self.step // self.nc if self.step else self.chunk_max

    @property
    def k_keys(self) -> ObjectKeys:
        """The keys an x object of K rows carries."""
        return object_keys(self.kc // self.k_row_words, self.unit)

    @property
    def v_keys(self) -> ObjectKeys:
        """The keys an x object of V rows carries."""
        return object_keys(self.kc // self.v_row_words, self.unit)

    @property
    def k_objects(self) -> int:
        """x objects of a chunk's K rows."""
        return self.chunk // self.k_keys.keys

    @property
    def v_objects(self) -> int:
        """x objects of a chunk's V rows."""
        return self.chunk // self.v_keys.keys

    @property
    def out_objects(self) -> int:
        """y objects of a core per round: its gh heads' Dv outputs, nr at a time, each with
        every token's (the GEMV's y objects hold its T rows' nr values)."""
        return self.gh * self.dv // self.nr

    def column_heads(self, c: int) -> list[int]:
        """The KV heads column c computes, one per round."""
        return list(range(c, self.n_head_kv, self.columns))

    @property
    def q_floats(self) -> int:
        """f32 of the core's q rows (mv_fa.h's g_fa_q) another phase may keep its data in: all
        of them where the rows have no tail the attention relies on being zero (D whole
        vectors), else none."""
        return self.tokens * self.gh * self.d if self.d % VECTOR_ELEMS == 0 else 0

    # --- the plan's limits
    @property
    def core_bytes(self) -> int:
        """The core's static data of the phase (kernels/mv_fa.h): per token and head of its gh
        its q row, the accumulators, the running maximum and sum; per token of one stream
        and head one chunk's scores and a vector of dot products; one decoded K or V row,
        eleven counters; with `pieces` (aie2) the bf16 pieces of each q row and of the
        current row, three at most."""
        rows, v = self.tokens * self.gh, VECTOR_ELEMS
        floats = rows * (_vecs(self.d) + _vecs(self.dv) + 2)
        floats += self.stream_tokens * self.gh * (_vecs(self.chunk_max) + v)
        row = max(_vecs(self.d), _vecs(self.dv))
        floats += row
        pieces = 3 * (rows * _vecs(self.d) + row) * 2 if self.pieces else 0
        return floats * F32 + pieces + 11 * 4

    @property
    def round_groups(self) -> list[range]:
        """A round's chunk steps (`steps`) by task group: the first group's tasks start with
        the q rows, the last's end with a's drain, each group within a shim's buffer
        descriptors with room for the next phase's first W fills (designs/ffn.py's
        `_ahead`)."""
        room, n = SHIM_GROUP_TASKS - 2, self.steps
        groups, first = [], 0
        while first < n:
            tasks, last = int(first == 0), first  # the q rows
            while last < n and (last == first or tasks + 3 + (last + 1 == n) <= room):
                tasks, last = tasks + 3, last + 1
            groups.append(range(first, last))
            first = last
        return groups

    @property
    def tasks(self) -> dict[str, int]:
        """DMA tasks of the busiest column's shim channels (column 0's rounds): per round the
        q rows and per chunk step its mask words, K and V on x, a's drain on y."""
        rounds = len(self.column_heads(0))
        return {"W": 0, "x": (1 + 3 * self.steps) * rounds, "y": rounds}

    # --- taps (q, k, v, mask as 32-bit words; a as f32)
    def q_tap(self, kvh: int) -> Tap:
        """Per token (stream by stream: their rows evenly strided) the group's gq q rows,
        repeated to whole objects."""
        ts, hs = _token_stride(self.q) // 4, self.q.nb[2] // 4
        s = self.q_side
        return Tap(kvh * self.gq * hs, (s.rep, self.tokens, self.gq, self.d), (0, ts, hs, 1))

    def mask_tap(self, st: int, c: int) -> Tap:
        """Per token of stream st chunk c's words of its mask row (the chunk's keys' f16
        values; with one chunk of an odd n_kv and one token the last word's other half
        unused), repeated to whole objects; with a run-time n_kv, in runs of step / (2 nc)
        words (every size then n_kv's multiple)."""
        s, unit, t = self.mask_side, self.step // self.nc, self.stream_tokens
        words = s.words // t  # a token's
        a, w = (words // (unit // 2), unit // 2) if self.step else split_run(words, 4)
        off = st * self.mask_stream_words + c * self.chunk // 2
        return Tap(off, (s.rep, t, a, w), (0, self.mask_row_words, w, 1))

    def _kv_tap(
        self, t: Tensor, kvh: int, st: int, c: int, row_words: int, keys: ObjectKeys
    ) -> Tap:
        n, stride = self.chunk, t.nb[1] // 4
        off = st * t.nb[3] // 4 + kvh * t.nb[2] // 4 + c * n * stride
        if keys.parts > 1:
            # Per object its runs of rows, each from key j * part_step of the object.
            sizes = (n // keys.keys, keys.parts, keys.part_rows, row_words)
            return Tap(off, sizes, (keys.keys * stride, keys.part_step * stride, stride, 1))
        if stride == row_words or n == 1:
            return Tap(off, (1, 1, 1, n * row_words), (0, 0, 0, 1))
        r = self.step // self.nc or _rows_split(n)
        return Tap(off, (1, n // r, r, row_words), (0, r * stride, stride, 1))

    def k_tap(self, kvh: int, st: int, c: int) -> Tap:
        """Chunk c's K rows of KV head kvh in stream st's cache."""
        return self._kv_tap(self.k, kvh, st, c, self.k_row_words, self.k_keys)

    def v_tap(self, kvh: int, st: int, c: int) -> Tap:
        """Chunk c's V rows of KV head kvh in stream st's cache."""
        return self._kv_tap(self.v, kvh, st, c, self.v_row_words, self.v_keys)

    def a_tap(self, kvh: int) -> Tap:
        """The joined y objects of a round: per object of a core (its gh heads' outputs, nr at
        a time: head j's part s is object j Dv / nr + s) the R cores' objects, each the T
        tokens' nr values; core i's head j is kvh gq + i gh + j."""
        dv, nr, gh = self.dv, self.nr, self.gh
        sizes = (gh * dv // nr, self.rows, self.tokens, nr)
        return Tap(kvh * self.gq * dv, sizes, (nr, gh * dv, self.n_head * dv, 1))

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """q, k, v and the mask as 32-bit words: declared f32, the type of the x fifo they
        fill (the cores reinterpret the words)."""
        return [("f32", _extent_words(t)) for t in (self.q, self.k, self.v, self.mask)]

    @property
    def defines(self) -> dict[str, int]:
        return {
            "MV_FA": 1,
            "FA_D": self.d,
            "FA_DV": self.dv,
            "FA_CHUNK": self.chunk_max,
            "FA_NC": self.nc,
            "FA_GQ": self.gq,
            "FA_GH": self.gh,
            "FA_T": self.tokens,
            "FA_S": self.streams,
            "FA_K_TYPE": KV_CODE[self.k.dtype],
            "FA_V_TYPE": KV_CODE[self.v.dtype],
            "FA_K_ROW_WORDS": self.k_row_words,
            "FA_V_ROW_WORDS": self.v_row_words,
            "FA_K_KEYS": self.k_keys.keys,
            "FA_K_PART_ROWS": self.k_keys.part_rows,
            "FA_K_PART_STEP": self.k_keys.part_step,
            "FA_V_KEYS": self.v_keys.keys,
            "FA_V_PART_ROWS": self.v_keys.part_rows,
            "FA_V_PART_STEP": self.v_keys.part_step,
            "FA_SCALE": self.params[0],
            "FA_SOFTCAP": self.params[1],
            "FA_Q_OBJECTS": self.q_side.objects,
            "FA_M_REP": self.m_side.rep,
        }


class FaShapes:
    """`fa_phase` on the candidate shapes of plans_ffn.plan_phases, remembering why the ones
    that do not fit were refused (for the refusal's message)."""

    def __init__(self, q, k, v, mask, a, params, arch: Arch, step: int = 0):
        self.ops = (q, k, v, mask, a)
        self.params = params
        self.arch = arch
        self.step = step
        self.why: dict[str, int] = {}

    def __call__(self, plans, other_bytes: int = 0) -> FaPhase | None:
        """The phase on the shape of the candidate's GEMV plans (phase 0's first) in the fewest
        chunks whose scores fit the core beside the GEMV phases' static data (and
        `other_bytes` of another phase's), or None."""
        # Static arrays are allocated for every phase at once: the GEMV phases' too.
        norm = next(p for p in plans if p.norm)
        room = self.arch.l1_budget - ffn_core_bytes(norm) - other_bytes
        why = None
        for nc in range(1, MAX_CHUNKS + 1):
            fa = fa_phase(*self.ops, self.params, plans[0], self.step, nc, self.arch.name == "aie2")
            if not isinstance(fa, str):
                if fa.core_bytes <= room:
                    return fa
                why = "memory"
            elif why is None:
                why = fa  # one chunk's reason, unless more chunks fit the shape
                if fa in ("gq", "dv"):
                    break  # the same for every chunk count
        self.why[why] = self.why.get(why, 0) + 1
        return None

    def explain(self) -> str:
        q, k, v, _, _ = self.ops
        n_kv, d, dv = k.ne[1], q.ne[0], v.ne[0]
        gq = q.ne[2] // k.ne[2]
        text = {
            "gq": f"R (cores per column) dividing the {gq} q heads per KV head",
            "dv": f"Dv = {dv} whole y objects of nr values",
            "rows": (
                f"x objects of kc words holding whole K and V rows ({d} {k.dtype}, {dv} "
                f"{v.dtype}) and a divisor of a chunk's keys (of {n_kv}) above half the rows "
                f"an object holds"
            ),
            "sides": "the q rows and the mask row repeated to whole x objects",
            "streams": (
                "one stream of q rows per KV cache (K, V and the mask with as many along "
                "dimension 3), the q rows of the streams evenly strided and each stream's mask "
                "on whole words"
            ),
            "step": (
                f"x objects of kc words holding the K and V rows of every multiple of "
                f"{self.step} keys (a run-time n_kv)"
            ),
            "memory": (
                f"the scores of a core's q heads over a chunk of n_kv = {n_kv} keys (a context "
                f"too long for the core's memory in {MAX_CHUNKS} equal chunks of whole K and V "
                f"objects) with its q rows, accumulators and the other phases' buffers within "
                f"{self.arch.l1_budget} bytes"
            ),
        }
        seen = [text[k] for k in text if k in self.why]
        return "the attention phase needs " + "; ".join(seen) if seen else "none fits"


def _token_stride(q: Tensor) -> int:
    """Bytes between two consecutive query rows of q, stream by stream (fa_phase checks that
    they are evenly strided): q's row stride, or its stream stride for one row a stream."""
    return q.nb[3] if q.ne[1] == 1 else q.nb[1]


def fa_phase(q, k, v, mask, a, params, p, step=0, nc=1, pieces=False) -> FaPhase | str:
    """The attention phase on the shape of GEMV plan p with nc chunks of keys per round
    (`pieces`: FaPhase.pieces), or the key of why it does not fit there (FaShapes.explain):
    "gq", "dv", "rows", "sides", "streams"; with a run-time n_kv (`step`), "step" when some
    multiple of step would not be whole objects or chunks."""
    # x objects hold the GEMV's nx rows' K chunks: the attention's objects are as long.
    C, R, nr, kc = p.columns, p.rows, p.rows_per_tile, p.k_chunk * p.nx
    n_head, n_head_kv = q.ne[2], k.ne[2]
    gq = n_head // n_head_kv
    if gq % R:
        return "gq"
    if v.ne[0] % nr:
        return "dv"
    n_kv, ts, streams = k.ne[1], q.ne[1], q.ne[3]
    tokens = ts * streams
    # A cache per sequence: each stream's q rows, K, V and mask along dimension 3, the q rows
    # of all evenly strided (llama.cpp's view of one Q), the mask's streams on whole words.
    per_stream = (k.ne[3], v.ne[3], mask.ne[3]) == (streams,) * 3
    even = ts == 1 or streams == 1 or q.nb[3] == ts * q.nb[1]
    if not per_stream or not even or (streams > 1 and mask.nb[3] % 4):
        return "streams"
    chunk = n_kv // nc
    kw, vw = q.ne[0] * k.size // 4, v.ne[0] * v.size // 4
    if n_kv % nc or (nc > 1 and chunk % 2):
        return "rows"  # a chunk's mask words start on a word
    if tokens > 1 and (n_kv % 2 or mask.ne[0] % 2):
        return "rows"  # every token's mask row starts on a word
    if kc % kw or kc % vw:
        return "rows"
    # Every chunk (with a run-time n_kv: of every multiple of step) whole objects of K and V
    # rows, each object a divisor of its keys (ObjectKeys) within a DMA wrap.
    unit = step // nc if step else chunk
    if step and (step % nc or unit % 2):
        return "step"
    why = "step" if step else "rows"
    for keys in (object_keys(kc // kw, unit), object_keys(kc // vw, unit)):
        if keys is None:
            return why
        # A chunk's objects: a wrap of one run, or the repeat count of two (_kv_tap).
        if (n_kv // nc) // keys.keys > (MAX_REPEAT if keys.parts > 1 else MAX_WRAP):
            return why
    q_side = _side(tokens * gq * q.ne[0], kc)
    if step:
        # The mask words of a chunk in runs of step / (2 nc) words repeated to whole objects
        # by one count for every multiple of step.
        m_side = _run_time_mask_side(chunk, unit, kc, ts)
    else:
        m_words = -(-chunk // 2)
        m_side = _side(ts * m_words, kc)
        if m_side is not None and split_run(m_words, 4) is None:
            m_side = None
    if q_side is None or m_side is None or max(gq, tokens) > MAX_WRAP:
        return "sides"
    last_row = (streams - 1) * (mask.nb[3] // 4) + (ts - 1) * (mask.ne[0] // 2)
    if last_row + -(-n_kv // 2) > _extent_words(mask):
        return "sides"
    return FaPhase(
        q, k, v, mask, a, params, C, R, nr, kc, q_side, m_side, step, nc=nc, pieces=pieces
    )


def _dense_rows(a: Tensor) -> Tensor:
    """a [Dv, n_head, T, 1] as the MUL_MAT_ADD phase reads it: [Ka, T] (dense)."""
    return Tensor.dense(a.dtype, (a.ne[0] * a.ne[1], a.ne[2] * a.ne[3], 1, 1))


def prepare_flash_attn_ffn(req: Request) -> FfnSpec:
    """FLASH_ATTN_FFN_<glu> (see the module docstring): the attention phase and
    MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s three on one shape of the array, or UnsupportedError."""
    arch, specs, shapes = fa_ffn_phases(req)
    attn, up, down = _replan(req.op, specs, arch, specs[1].src0.dtype, shapes, shapes.explain)
    phase = shapes((attn.plan, up.plan, down.plan))
    if phase is None:
        raise AssertionError("the chosen shape does not fit the attention phase")
    return FfnSpec(req, arch, up, down, attn, phase)


def prepare_flash_attn_glu(req: Request) -> FfnSpec:
    """FLASH_ATTN_GLU_<glu> (see the module docstring): FLASH_ATTN_FFN_<glu> without its down
    phase, the attention, W_o's MUL_MAT_ADD and RMS_NORM_MUL_MAT_<glu> on one shape of the
    array, or UnsupportedError."""
    arch, specs, shapes = fa_ffn_phases(req)
    attn, up = _replan(req.op, specs, arch, specs[1].src0.dtype, shapes, shapes.explain)
    phase = shapes((attn.plan, up.plan))
    if phase is None:
        raise AssertionError("the chosen shape does not fit the attention phase")
    return FfnSpec(req, arch, up, None, attn, phase)


def fa_ffn_phases(req: Request):
    """FLASH_ATTN_FFN_<glu>'s (or FLASH_ATTN_GLU_<glu>'s) checks: (arch, the block's phases
    (MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s three, or its first two) each planned by its own op's
    planner, the attention phase's `FaShapes`), not yet on one shape (DECODE_LAYER_<glu> adds
    its own phases before choosing it)."""
    _, arch = _check_common(req, strided=True)  # the input count, op_params, types
    op = req.op
    glu_only = op.startswith(GLU_PREFIX)
    glu = op[len(GLU_PREFIX if glu_only else PREFIX) :]
    if glu_only:
        if len(req.extra_outputs) != 2:
            raise RequestError(f"{op} has three outputs: h, then a and r1 in extra_outputs")
        q, k, v, mask, wo, r0, wg, wu, n = req.inputs
        h, (a, r1) = req.output, req.extra_outputs
    else:
        if len(req.extra_outputs) != 3:
            raise RequestError(f"{op} has four outputs: out, then a, r1 and h in extra_outputs")
        q, k, v, mask, wo, r0, wg, wu, wd, n = req.inputs
        out, (a, r1, h) = req.output, req.extra_outputs
    # What runs instead of a refused kernel: the attention, then the block's kernel(s).
    block_ops = (
        f"MUL_MAT_ADD and RMS_NORM_MUL_MAT_{glu}" if glu_only else f"MUL_MAT_ADD_RMS_NORM_FFN_{glu}"
    )
    params = tuple(req.op_params) + (0,) * (4 - len(req.op_params))
    if q.ne[1] * q.ne[3] > GEMV_MAX_X_ROWS:
        raise UnsupportedError(
            f"{op}: {q.ne[1]} query rows x {q.ne[3]} sequences: the attention phase computes "
            f"up to {GEMV_MAX_X_ROWS} query rows (a decode step's tokens, of one KV cache or of a "
            f"cache per sequence); the backend runs FLASH_ATTN_EXT_MASK and {block_ops} instead"
        )
    if _bits_f32(params[1]) != 0:
        raise UnsupportedError(
            f"{op}: ALiBi (max_bias = {_bits_f32(params[1])}) is not computed by the attention "
            f"phase; the backend runs FLASH_ATTN_EXT_MASK and {block_ops}"
        )
    if mask.ne[2] != 1:
        raise UnsupportedError(
            f"{op}: a per-head mask ({mask.ne[2]} heads): the cores of a column share one mask row"
        )
    # FLASH_ATTN_EXT_MASK's checks of q, k, v, the mask and a (and its scale and softcap); its
    # own plan's limits (a mask span on the core) are not the phase's.
    fa_req = dataclasses.replace(
        req,
        op="FLASH_ATTN_EXT_MASK",
        inputs=(q, k, v, mask),
        output=a,
        op_params=params[:3],
        extra_outputs=(),
    )
    try:
        fa = check_flash_attn(fa_req)
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: the attention phase: {e}") from None
    # The block after it, a read as [Ka, N].
    try:
        if glu_only:
            block = dataclasses.replace(req, op_params=params[3:])
            specs = attn_phases(block, glu, wo, _dense_rows(a), r0, wg, wu, n, r1, h)
        else:
            ffn_req = dataclasses.replace(
                req,
                op=f"MUL_MAT_ADD_RMS_NORM_FFN_{glu}",
                inputs=(wo, _dense_rows(a), r0, wg, wu, wd, n),
                output=out,
                op_params=params[3:],
                extra_outputs=(r1, h),
            )
            _, specs = attn_ffn_phases(ffn_req)
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: {e}") from None
    tokens = q.ne[1] * q.ne[3]
    if tokens > 1 and any(s.plan.nx != tokens for s in specs):
        raise UnsupportedError(
            f"{op}: {tokens} query rows, which the block's phases take one at a time "
            f"({specs[1].src0.dtype} weights): the attention's objects are theirs, one row "
            "each; the backend runs the ops unfused"
        )
    # check_flash_attn has refused a run-time n_kv's step that is odd, too long or not a
    # divisor of k's rows.
    shapes = FaShapes(q, k, v, mask, a, (fa.params[0], fa.params[2]), arch, fa.step)
    return arch, specs, shapes
