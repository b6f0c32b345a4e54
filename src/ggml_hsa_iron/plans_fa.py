"""FLASH_ATTN_EXT (and _MASK, _SINKS, _MASK_SINKS): request validation and the plan.

Operands (request order): q f32 [D, n_q, n_head, n_seq] (rows dense, other strides any), k
[D, n_kv, n_head_kv, n_seq_kv] and v [Dv, n_kv, n_head_kv, n_seq_kv] (f32, f16 or bf16, rows
dense, row and head strides any: views of the KV cache), the mask (f16 [>= n_kv, >= n_q, m2,
m3], contiguous, broadcast over heads and sequences) and the sinks (f32, one per head) when
the op has them; output f32 [Dv, n_head, n_q, n_seq] dense. op_params: scale, max_bias,
logit_softcap (f32 bit patterns).

Work items are (query row i1, head h, sequence i3), numbered t = ((i3 n_q + i1) n_head + h):
the output row of item t is at t * Dv. Column c of C computes items c, c + C, ... with one
worker; its shim fills two fifos moving 32-bit words (every operand is declared as i32 in the
runtime sequence, so that q, the mask, the sinks and K share a fifo): A (objects of
`a_words`, a chunk of `chunk` K rows) per item: the q row, the mask row and the sink, each
padded to whole objects by repeating it (a stride-0 dimension of its tap; the mask row as
whole words covering it, the core skipping the values before the row per item, so rows of an
odd length may start mid-word), then the K rows of the item's kv head; B (objects of a chunk
of V rows) per item: the V rows. One DMA task per operand per item; the output rows of a round
of items are drained by one strided task.
"""

import math
from dataclasses import dataclass

from . import registry
from .archs import Arch
from .errors import RequestError, UnsupportedError
from .plans import CoreSource, _bits_f32, _check_common, _f32, _f32_bits, alibi_slopes
from .request import Request, Tensor
from .tiling import MAX_STRIDE_WORDS, MAX_TASKS_PER_CHANNEL, MAX_WRAP, Tap, divisors, split_run

SOURCE = "flash_attn.cc"
KV_TYPES = ("f32", "f16", "bf16")
KV_CODE = {"f32": 0, "f16": 1, "bf16": 2}
SHIM_BDS = 16  # buffer descriptors of a shim tile: DMA tasks in flight before an await
MAX_CHUNK = 128  # K/V rows per object
MAX_SIDE_OBJECTS = 8  # objects one padded q / mask / sink may take
CHUNK_OVERHEAD = 256  # words-equivalent of one object handshake (chunk choice)
MAX_MASK_SKIP = 0xFFFF  # f16 values before an item's mask row in its span (a u16 table)
STATIC_SLACK = 256  # bytes of the core function's scalar state and staging vectors


def _extent_words(t: Tensor) -> int:
    """32-bit words from t's first element to one past its last, rounded up."""
    b = t.size + sum((n - 1) * s for n, s in zip(t.ne, t.nb))
    return -(-b // 4)


@dataclass(frozen=True)
class Side:
    """A small operand part sent on fifo A: `words` words padded to `objects` objects by
    repeating them `rep` times."""

    words: int
    rep: int
    objects: int


def _side(words: int, obj: int) -> Side | None:
    total = math.lcm(words, obj)
    if total // obj > MAX_SIDE_OBJECTS:
        return None
    return Side(words, total // words, total // obj)


@dataclass(frozen=True)
class FlashAttnSpec:
    request: Request
    arch: Arch
    op: str
    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    sinks: Tensor | None
    out: Tensor
    chunk: int  # K/V rows per object
    columns: int
    group: int  # items per task group (round) and column
    q_side: Side
    m_side: Side | None
    s_side: Side | None
    params: tuple[int, int, int]  # scale, max_bias, softcap bits
    slopes: tuple[int, ...]

    # --- shapes
    @property
    def d(self) -> int:
        return self.q.ne[0]

    @property
    def dv(self) -> int:
        return self.v.ne[0]

    @property
    def n_kv(self) -> int:
        return self.k.ne[1]

    @property
    def n_head(self) -> int:
        return self.q.ne[2]

    @property
    def items(self) -> int:
        return self.q.ne[1] * self.q.ne[2] * self.q.ne[3]

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
        return sum(s.objects for s in (self.q_side, self.m_side, self.s_side) if s is not None)

    def column_items(self, c: int) -> list[int]:
        return list(range(c, self.items, self.columns))

    def item_index(self, t: int) -> tuple[int, int, int]:
        """(i1, h, i3) of item t."""
        nq, nh = self.q.ne[1], self.q.ne[2]
        return (t // nh) % nq, t % nh, t // (nh * nq)

    # --- taps (over the operands as 32-bit words)
    def q_tap(self, t: int) -> Tap:
        i1, h, i3 = self.item_index(t)
        nb = self.q.nb
        off = (i1 * nb[1] + h * nb[2] + i3 * nb[3]) // 4
        s = self.q_side
        return Tap(off, (1, s.rep, self.d), (0, 0, 1))

    def mask_span(self, t: int) -> tuple[int, int]:
        """(first word, skipped f16 values) of item t's mask row: the `m_side.words` words
        from the first word hold the row's n_kv values after the skipped ones. The span
        starts on the word holding the row's first value (one skipped when the row starts
        mid-word); when it would run past the mask buffer it is moved back to end on the
        buffer's last word (more values skipped)."""
        i1, h, i3 = self.item_index(t)
        m = self.mask.ne
        elem = (((i3 % m[3]) * m[2] + h % m[2]) * m[1] + i1) * m[0]
        first = min(elem // 2, _extent_words(self.mask) - self.m_side.words)
        return first, elem - 2 * first

    def mask_skips(self) -> tuple[int, ...]:
        """Skipped f16 values of every item's mask row (all 0 for rows of an even length)."""
        return tuple(self.mask_span(t)[1] for t in range(self.items))

    def mask_tap(self, t: int) -> Tap:
        s = self.m_side
        a, b = split_run(s.words, 4)
        return Tap(self.mask_span(t)[0], (s.rep, a, b), (0, b, 1))

    def sink_tap(self, t: int) -> Tap:
        _, h, _ = self.item_index(t)
        a, b = split_run(self.a_words * self.s_side.objects, 4)
        return Tap(h, (1, a, b), (0, 0, 0))

    def _kv_tap(self, t: Tensor, i1: int, h: int, i3: int, row_words: int) -> Tap:
        r2 = self.n_head // t.ne[2]
        r3 = self.q.ne[3] // t.ne[3]
        off = ((h // r2) * t.nb[2] + (i3 // r3) * t.nb[3]) // 4
        n, stride = self.n_kv, t.nb[1] // 4
        if stride == row_words or n == 1:
            return Tap(off, (1, n * row_words), (0, 1))
        r = _rows_split(n)
        return Tap(off, (n // r, r, row_words), (r * stride, stride, 1))

    def k_tap(self, t: int) -> Tap:
        return self._kv_tap(self.k, *self.item_index(t), self.k_row_words)

    def v_tap(self, t: int) -> Tap:
        return self._kv_tap(self.v, *self.item_index(t), self.v_row_words)

    def rounds(self, c: int) -> list[list[int]]:
        its = self.column_items(c)
        return [its[i : i + self.group] for i in range(0, len(its), self.group)]

    def out_tap(self, items: list[int]) -> Tap:
        """The output rows of consecutive items of one column (C items apart), in f32."""
        return Tap(items[0] * self.dv, (1, len(items), self.dv), (0, self.columns * self.dv, 1))

    @property
    def tasks_per_item(self) -> tuple[int, int]:
        """(fifo A, fifo B) DMA tasks per item."""
        a = 2 + (self.m_side is not None) + (self.s_side is not None)
        return a, 1

    @property
    def sequence(self) -> list[tuple[str, int]]:
        ins = [t for t in (self.q, self.k, self.v, self.mask, self.sinks) if t is not None]
        return [("i32", _extent_words(t)) for t in ins] + [("f32", self.out.nelements)]

    @property
    def core(self) -> CoreSource:
        d = {
            "FA_D": self.d,
            "FA_DV": self.dv,
            "FA_NKV": self.n_kv,
            "FA_CHUNK": self.chunk,
            "FA_K_TYPE": KV_CODE[self.k.dtype],
            "FA_V_TYPE": KV_CODE[self.v.dtype],
            "FA_A_WORDS": self.a_words,
            "FA_B_WORDS": self.b_words,
            "FA_Q_OBJECTS": self.q_side.objects,
            "FA_N_HEAD": self.n_head,
            "FA_SCALE": self.params[0],
            "FA_SOFTCAP": self.params[2],
        }
        if self.m_side is not None:
            d["HAS_MASK"] = 1
            d["FA_M_WORDS"] = self.m_side.words
            d["FA_M_OBJECTS"] = self.m_side.objects
            skips = self.mask_skips()
            if any(skips):
                d["FA_ITEMS"] = self.items
                d["FA_M_SKIPS"] = ",".join(map(str, skips))
        if self.s_side is not None:
            d["HAS_SINKS"] = 1
            d["FA_S_OBJECTS"] = self.s_side.objects
        if self.slopes:
            d["ALIBI_SLOPES"] = ",".join(f"0x{b:08x}u" for b in self.slopes)
        return CoreSource(SOURCE, "flash_attn.o", d)

    def static_bytes(self) -> int:
        """The core function's static data: q, the mask row, the accumulator, the scores."""
        m = 0
        if self.m_side is not None:
            m = 4 * self.m_side.words
            if any(self.mask_skips()):  # the per-item skips, a u16 each
                m += -(-self.items // 2) * 4
        return 4 * (self.d + self.dv + self.chunk + 16) + m + STATIC_SLACK

    def fifo_bytes(self) -> int:
        return 2 * 4 * (self.a_words + self.b_words + self.dv)


def _mask_side(mask: Tensor, n_kv: int, obj: int) -> Side | None:
    """The mask row's side: the fewest words (within the mask buffer) holding the row's n_kv
    f16 values wherever it starts (one more value when rows of an odd length start mid-word)
    that pad to at most MAX_SIDE_OBJECTS objects of `obj` words. More words than the row
    needs (a divisor or a multiple of `obj`) read the values after it, or before it at the
    buffer's end (FlashAttnSpec.mask_span)."""
    need = -(-(n_kv + mask.ne[0] % 2) // 2)
    cands = {need} | {x for x in divisors(obj) if x > need}
    cands |= {obj * k for k in range(1, MAX_SIDE_OBJECTS + 1) if obj * k > need}
    for w in sorted(cands):
        if w > _extent_words(mask):
            break
        side = _side(w, obj)
        if side is not None and 2 * w - n_kv <= MAX_MASK_SKIP:
            return side
    return None


def _rows_split(n: int) -> int:
    """The inner row count r (n = a r, both within a DMA wrap) of a strided K/V walk."""
    for r in reversed(divisors(n)):
        if r <= MAX_WRAP and n // r <= MAX_WRAP:
            return r
    raise UnsupportedError(f"FLASH_ATTN_EXT: {n} K/V rows cannot be walked by one DMA task")


def prepare_flash_attn(req: Request) -> FlashAttnSpec:
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
        and out.is_dense()
    )
    if not shapes_ok:
        raise RequestError(f"{op}: q, k, v and the output do not agree")
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

    items = n_q * n_head * n_seq
    columns = min(arch.columns, items)
    best = None
    for c in divisors(n_kv):
        if c > MAX_CHUNK:
            continue
        kw, vw = c * d * k.size, c * dv * v.size
        if kw % 4 or vw % 4:
            continue
        a_words = kw // 4
        q_side = _side(d, a_words)
        m_side = _mask_side(mask, n_kv, a_words) if mask is not None else None
        s_side = _side(1, a_words) if sinks is not None else None
        if q_side is None or (mask is not None and m_side is None):
            continue
        cand = FlashAttnSpec(
            req, arch, op, q, k, v, mask, sinks, out, c, columns, 1,
            q_side, m_side, s_side, core_params, slopes,
        )  # fmt: skip
        if cand.fifo_bytes() + cand.static_bytes() > arch.l1_budget:
            continue
        try:
            for t in range(min(items, 1)):
                cand.k_tap(t)
                cand.v_tap(t)
                if mask is not None:
                    cand.mask_tap(t)
                if sinks is not None:
                    cand.sink_tap(t)
        except (UnsupportedError, TypeError):
            continue
        cost = cand.side_objects * a_words + cand.chunks * CHUNK_OVERHEAD
        if best is None or cost < best[0]:
            best = (cost, cand)
    if best is None:
        raise UnsupportedError(
            f"{op}: no K/V chunk of n_kv = {n_kv} rows (D = {d}, Dv = {dv}, {k.dtype}/{v.dtype}"
            f"{', with a mask' if mask is not None else ''}) fits a compute tile with q and the "
            "mask padded to whole objects"
        )
    cand = best[1]
    ta, tb = cand.tasks_per_item
    group = max(1, (SHIM_BDS - 1) // (ta + tb))
    per_col = -(-items // columns)
    group = min(group, per_col, MAX_WRAP)
    result = FlashAttnSpec(
        req, arch, op, q, k, v, mask, sinks, out, cand.chunk, columns, group,
        cand.q_side, cand.m_side, cand.s_side, core_params, slopes,
    )  # fmt: skip
    if per_col * ta > MAX_TASKS_PER_CHANNEL:
        raise UnsupportedError(
            f"{op}: {per_col * ta} DMA tasks on a shim channel (items per column x {ta}), at "
            f"most {MAX_TASKS_PER_CHANNEL}: too many query rows x heads ({items}) for one kernel"
        )
    return result
