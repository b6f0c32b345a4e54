"""FLASH_ATTN_EXT (and _MASK, _SINKS, _MASK_SINKS): designs/flash_attn.py, plans_fa.py and
kernels/flash_attn.cc, whose work item is a block of G query rows (gr consecutive rows of gh
heads sharing a KV head).

* the core functions built with g++ against the AIE-API stand-in and called directly on
  hand-made objects for two consecutive blocks of G > 1 rows (CoreBlockTest), against a
  float64 row reference: rows of several heads and query rows, a mask row shared by a block's
  heads with -inf keys and a fully masked row (0), NaN V rows under -inf masks never used,
  per-head sinks and ALiBi slopes of a block not starting at head 0, softcap, f32/f16/bf16,
  Dv != D, aie2p and aie2;
* the plan: blocks cover every (row, head, sequence), each inside one KV group (one head with
  a per-head mask); every block's taps read exactly its q rows in the core's order, its mask
  rows (every value inside the mask buffer, rows of an odd length starting mid-word), the
  sinks once, every K and V row of its KV head, as whole objects (q and V on fifo B, the mask,
  the sinks and K on A), and its output rows are drained where they belong; the shim tile's
  16 buffer descriptors per round and 1024 tasks per channel; a decode (GQA) needs no more tasks and K/V bytes than one item per row and head
  did and reads each KV head's K/V once; Llama-3.2-1B-shaped 512-row prefills (D 64 and 128,
  n_kv 512..4096) fit the tasks and core memory on aie2p and aie2; refusals;
* end to end: the design compiled for the emulation target and its recorded program run on
  real data (tests/util_emu.py) against a numpy reference of ggml-cpu's semantics (q rounded
  to K's type, scale, softcap, ALiBi, -inf masks, sinks, GQA, mask broadcast), D 64 and 128,
  n_kv 256, 512 and 200 (chunks that are not powers of two), n_q 1 to 7, f32, f16 and bf16
  K/V, aie2p and aie2; blocks of several rows and heads with a last row block overlapping
  the one before, a per-head mask, masks per sequence; mask rows of an odd length (embedding
  models: n_kv = n_q = 25 and 7, q a permuted view, contiguous f16 K/V; decode rows with the
  mask broadcast per head); the recorded design's tasks per channel are the plan's.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import json
import struct
import tempfile
import types
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import alibi_slopes, prepare
from ggml_hsa_iron.plans_fa import SHIM_BDS
from ggml_hsa_iron.request import Tensor, canonical_name, parse_request

try:
    import numpy as np
    from ml_dtypes import bfloat16

    from ggml_hsa_iron.tests.util_emu import have_tools, run_request

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

    def have_tools():
        return False


SIZES = {"f32": 4, "f16": 2, "bf16": 2}


def f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def cache_view(dtype, d, n_kv, n_head_kv, n_ctx, n_seq=1):
    """A KV-cache view as llama.cpp makes it: [d, n_kv, n_head_kv, n_seq] with the heads
    interleaved inside a cache row of n_ctx rows."""
    s = SIZES[dtype]
    nb1 = n_head_kv * d * s
    return Tensor(dtype, (d, n_kv, n_head_kv, n_seq), (s, nb1, d * s, n_ctx * nb1))


def dense(dtype, ne):
    ne = tuple(ne) + (1,) * (4 - len(ne))
    return Tensor.dense(dtype, ne)


def fa_request(
    d=64,
    dv=None,
    n_kv=256,
    n_q=1,
    n_head=4,
    n_head_kv=2,
    n_seq=1,
    kv="f16",
    mask=False,
    sinks=False,
    scale=0.125,
    max_bias=0.0,
    softcap=0.0,
    arch="aie2p",
    n_ctx=None,
    mask_ne=None,
    q_nb=None,
    kv_dense=False,
):
    dv = dv or d
    n_ctx = n_ctx or n_kv + 32
    q = dense("f32", [d, n_q, n_head, n_seq])
    if q_nb is not None:
        q = Tensor("f32", q.ne, tuple(q_nb))
    if kv_dense:  # K and V computed in the graph (no KV cache): contiguous
        k = dense(kv, [d, n_kv, n_head_kv, n_seq])
        v = dense(kv, [dv, n_kv, n_head_kv, n_seq])
    else:
        k = cache_view(kv, d, n_kv, n_head_kv, n_ctx, n_seq)
        v = cache_view(kv, dv, n_kv, n_head_kv, n_ctx, n_seq)
    ins = [q, k, v]
    op = "FLASH_ATTN_EXT"
    if mask:
        ins.append(dense("f16", mask_ne or [n_kv + (n_kv % 2), n_q + 3, 1, 1]))
        op += "_MASK"
    if sinks:
        ins.append(dense("f32", [n_head]))
        op += "_SINKS"
    out = dense("f32", [dv, n_head, n_q, n_seq])
    params = [f32_bits(scale), f32_bits(max_bias), f32_bits(softcap)]

    def t(x):
        return {"type": x.dtype, "ne": list(x.ne), "nb": list(x.nb)}

    return json.dumps(
        {
            "name": canonical_name(op, params, ins, out),
            "arch": arch,
            "op": op,
            "op_params": params,
            "inputs": [t(x) for x in ins],
            "output": t(out),
        }
    )


def spec_of(**kw):
    return prepare(parse_request(fa_request(**kw)))


def embedding(n_kv=25, **kw):
    """An embedding model's attention (all-MiniLM-L6-v2 through llama.cpp): no KV cache,
    n_q = n_kv tokens, q a permuted view [D, tokens, heads] of [D, heads, tokens], K and V
    f16 contiguous, the mask f16 [n_kv, n_kv] (rows of an odd length for an odd n_kv)."""
    d, heads = 32, 12
    args = dict(d=d, n_kv=n_kv, n_q=n_kv, n_head=heads, n_head_kv=heads, kv="f16",
                kv_dense=True, mask=True, mask_ne=[n_kv, n_kv, 1, 1], scale=d**-0.5,
                q_nb=[4, heads * d * 4, d * 4, n_kv * heads * d * 4])  # fmt: skip
    args.update(kw)
    return args


# Odd mask rows: the embedding case, a decode row with the mask broadcast per head (rows
# starting at both parities), a mask row longer than n_kv.
ODD_MASKS = (
    embedding(25),
    embedding(7),
    dict(d=32, n_kv=25, n_q=1, n_head=12, n_head_kv=12, kv="f16", kv_dense=True, mask=True,
         mask_ne=[25, 1, 12, 1]),
    dict(d=32, n_kv=7, n_q=1, n_head=12, n_head_kv=4, kv="f16", mask=True,
         mask_ne=[7, 1, 12, 1]),
    dict(d=64, n_kv=256, n_q=4, mask=True, mask_ne=[257, 5, 1, 1]),
)  # fmt: skip


# ------------------------------------------------------------------ data and reference


def _extent(t: Tensor) -> int:
    return t.size + sum((n - 1) * s for n, s in zip(t.ne, t.nb))


NP = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _np_type(dtype):
    return bfloat16 if dtype == "bf16" else np.dtype(NP[dtype])


def place(t: Tensor, values) -> bytes:
    """The bytes of operand t (its extent rounded up to words) holding `values` (shape ne
    reversed: [ne3, ne2, ne1, ne0]) at t's strides; the gaps hold NaN patterns."""
    n = -(-_extent(t) // 4) * 4
    buf = np.full(n, 0xFF, dtype=np.uint8)
    vals = np.asarray(values, dtype=_np_type(t.dtype))
    raw = vals.view(np.uint8).reshape(*vals.shape[:-1], vals.shape[-1] * t.size)
    for i3 in range(t.ne[3]):
        for i2 in range(t.ne[2]):
            for i1 in range(t.ne[1]):
                off = i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]
                buf[off : off + t.ne[0] * t.size] = raw[i3, i2, i1]
    return buf.tobytes()


def round_to(x, dtype):
    return np.asarray(x, dtype=np.float32).astype(_np_type(dtype)).astype(np.float64)


def attend_row(qr, K, V, scale, softcap, mv=None, slope=1.0, sink=None):
    """One query row of ggml-cpu's FLASH_ATTN_EXT in float64: qr already rounded to K's
    type, mv the row's mask values (None: no mask), sink the head's sink (None: none)."""
    s = (K @ qr) * scale
    if softcap:
        s = softcap * np.tanh(s)
    keep = np.ones(len(s), dtype=bool)
    if mv is not None:
        mv = np.asarray(mv, dtype=np.float64)
        keep = mv != -np.inf
        s = s + slope * np.where(keep, mv, 0.0)
    logits = list(s[keep]) + ([float(sink)] if sink is not None else [])
    if not logits:
        return np.zeros(V.shape[1])
    mx = max(logits)
    w = np.exp(s[keep] - mx)
    tot = w.sum() + (np.exp(float(sink) - mx) if sink is not None else 0.0)
    return (w @ V[keep]) / tot if tot else np.zeros(V.shape[1])


def reference(req, q, k, v, mask=None, sinks=None):
    """ggml-cpu's FLASH_ATTN_EXT (crates/hsa-sim/src/exec/attn.rs) in float64 on the same
    inputs (q rounded to K's type first)."""
    scale, max_bias, softcap = (
        struct.unpack("<f", struct.pack("<i", p))[0] for p in req.op_params[:3]
    )
    qt, kt, vt = req.inputs[:3]
    d, n_q, n_head, n_seq = qt.ne
    dv = vt.ne[0]
    r2, r3 = n_head // kt.ne[2], n_seq // kt.ne[3]
    if softcap:
        scale = float(np.float32(scale / softcap))
    slopes = alibi_slopes(n_head, max_bias) if max_bias > 0 else [1.0] * n_head
    out = np.zeros((n_seq, n_q, n_head, dv))
    for i3 in range(n_seq):
        for h in range(n_head):
            K = np.asarray(k[i3 // r3, h // r2], dtype=np.float64)
            V = np.asarray(v[i3 // r3, h // r2], dtype=np.float64)
            for i1 in range(n_q):
                qr = round_to(q[i3, h, i1], kt.dtype)
                mv = None
                if mask is not None:
                    m2, m3 = mask.shape[1], mask.shape[0]
                    mv = mask[i3 % m3, h % m2, i1, : len(K)]
                sink = sinks[h] if sinks is not None else None
                out[i3, i1, h] = attend_row(qr, K, V, scale, softcap, mv, slopes[h], sink)
    return out


def random_case(req, seed=0, neg_inf=True, qscale=1.0):
    rng = np.random.default_rng(seed)
    qt, kt, vt = req.inputs[:3]
    rest = list(req.inputs[3:])
    mt = rest.pop(0) if "MASK" in req.op else None
    st = rest.pop(0) if "SINKS" in req.op else None
    d, n_q, n_head, n_seq = qt.ne
    q = (rng.standard_normal((n_seq, n_head, n_q, d)) * qscale).astype(np.float32)
    k = rng.standard_normal((kt.ne[3], kt.ne[2], kt.ne[1], kt.ne[0])).astype(np.float32)
    v = rng.standard_normal((vt.ne[3], vt.ne[2], vt.ne[1], vt.ne[0])).astype(np.float32)
    k = k.astype(_np_type(kt.dtype))
    v = v.astype(_np_type(vt.dtype))
    data = [place(qt, q), place(kt, k), place(vt, v)]
    mask = sinks = None
    if mt is not None:
        m = mt.ne
        mask = (rng.standard_normal((m[3], m[2], m[1], m[0])) * 2).astype(np.float16)
        if neg_inf:
            mask[..., ::5] = -np.inf  # every 5th key masked
            if m[1] > 1:
                mask[..., 1, :] = -np.inf  # query row 1: all
        data.append(place(mt, mask))  # whole words: NaN after a mask of an odd size
    if st is not None:
        sinks = rng.standard_normal(st.ne[0]).astype(np.float32)
        data.append(sinks.tobytes())
    ref = reference(req, q, k, v, mask, sinks)
    return data, ref


def run_case(test, tol=2e-5, seed=0, qscale=1.0, **kw):
    text = fa_request(**kw)
    req = parse_request(text)
    data, ref = random_case(req, seed, qscale=qscale)
    got = np.frombuffer(run_request(text, data), dtype=np.float32)
    got = got.reshape(ref.shape)
    err = np.abs(got - ref).max()
    test.assertTrue(np.isfinite(got).all(), f"{kw}: non-finite output")
    test.assertLess(err, tol * max(1.0, np.abs(ref).max()), f"{kw}: max error {err}")
    return got, ref


# ------------------------------------------------------------------------------ tests


def llama_1b(n_q, n_kv, d=64, arch="aie2p", **kw):
    """Llama-3.2-1B's attention (32 heads, 8 KV heads, D = 64) with a causal-style mask as
    llama.cpp sends it: [n_kv, n_q padded, 1, 1]."""
    args = dict(d=d, n_q=n_q, n_kv=n_kv, n_head=32, n_head_kv=8, mask=True, arch=arch,
                mask_ne=[n_kv, -(-n_q // 64) * 64, 1, 1])  # fmt: skip
    args.update(kw)
    return args


def per_item_plan(spec):
    """DMA tasks on fifo A's channel and K/V bytes of the previous design (one work item per
    query row and head: q row, mask row, sink, K rows per item; K and V read per item): the
    baseline a decode must not fall behind."""
    items = spec.q.ne[1] * spec.n_head * spec.q.ne[3]
    per_col = -(-items // min(spec.arch.columns, items))
    ta = 2 + (spec.mask is not None) + (spec.sinks is not None)
    kv = items * spec.n_kv * (spec.d * spec.k.size + spec.dv * spec.v.size)
    return per_col * ta, kv


# Plans whose blocks have several heads (GQA), several rows, both, a last row block moved
# back (overlap), sinks, ALiBi, a per-head mask, strided q.
PLAN_CASES = (
    dict(mask=True, sinks=True),
    dict(kv="f32", d=128, n_kv=512, n_q=4, mask=True),
    dict(kv="bf16", n_kv=200, mask=True, n_seq=2, n_head=4, n_head_kv=1),
    dict(n_q=7, n_head=8, n_head_kv=2, mask=True, sinks=True, max_bias=8.0),
    dict(n_q=1, n_head=8, n_head_kv=2, mask=True, mask_ne=[256, 1, 8, 1]),
    embedding(7),
    embedding(25),
    llama_1b(1, 512),
    llama_1b(40, 256),
)


class PlanTest(unittest.TestCase):
    def _objects(self, spec, tap, words):
        idx = tap.indices()
        self.assertEqual(len(idx) % words, 0, "a fill ends inside an object")
        return idx

    def test_blocks_cover_every_row_once_per_kv_group(self):
        for kw in PLAN_CASES:
            spec = spec_of(**kw)
            with self.subTest(**kw):
                rows = [r for b in range(spec.blocks) for r in spec.block_rows(b)]
                d, n_q, n_head, n_seq = spec.q.ne
                want = {(i1, h, i3) for i1 in range(n_q) for h in range(n_head)
                        for i3 in range(n_seq)}  # fmt: skip
                self.assertEqual(set(rows), want)
                # Only a last row block moved back repeats rows.
                self.assertEqual(len(rows), len(spec.row_starts) * spec.gr * n_head * n_seq)
                r2 = n_head // spec.k.ne[2]
                for b in range(spec.blocks):
                    self.assertEqual(len({h // r2 for _, h, _ in spec.block_rows(b)}), 1)
                    if spec.mask is not None and spec.mask.ne[2] > 1:
                        self.assertEqual(spec.gh, 1)

    def test_taps_read_each_blocks_operands_as_whole_objects(self):
        for kw in PLAN_CASES:
            with self.subTest(**kw):
                self._check_taps(spec_of(**kw))

    def _check_taps(self, spec):
        A, B = spec.a_words, spec.b_words
        k, v, q = spec.k, spec.v, spec.q
        for b in range(spec.blocks):
            rows = spec.block_rows(b)
            _, h0, i3 = rows[0]
            qi = self._objects(spec, spec.q_tap(b), B)  # on fifo B, before the V rows
            self.assertEqual(len(qi) // B, spec.q_objects)
            want_q = []
            for i1, h, _ in rows:
                off = (i1 * q.nb[1] + h * q.nb[2] + i3 * q.nb[3]) // 4
                want_q += range(off, off + spec.d)
            self.assertEqual(qi[: len(want_q)], want_q)
            self.assertEqual(qi, want_q * spec.q_side.rep)
            hk = h0 // (q.ne[2] // k.ne[2])
            i3k = i3 // (q.ne[3] // k.ne[3])
            for tensor, tap, rw in ((k, spec.k_tap(b), spec.k_row_words),
                                    (v, spec.v_tap(b), spec.v_row_words)):  # fmt: skip
                got = tap.indices()
                want = [
                    (j * tensor.nb[1] + hk * tensor.nb[2] + i3k * tensor.nb[3]) // 4 + w
                    for j in range(spec.n_kv)
                    for w in range(rw)
                ]
                self.assertEqual(got, want)
                self.assertEqual(len(got) % (A if tensor is k else B), 0)
            if spec.mask is not None:
                self._check_mask(spec, b, rows)
            out = spec.out_tap(b).indices()
            want_o = []
            for i1, h, _ in rows:
                off = ((i3 * spec.n_q + i1) * spec.n_head + h) * spec.dv
                want_o += range(off, off + spec.dv)
            self.assertEqual(out, want_o)
        if spec.sinks is not None:
            # The stream's first n_head words are the sinks (the core reads those); the
            # rest of their objects repeats them or is padding from inside K.
            stream = [(w, i) for w, t in spec.sink_taps() for i in t.indices()]
            self.assertEqual(stream[: spec.n_head], [("sinks", h) for h in range(spec.n_head)])
            self.assertEqual(len(stream), A * spec.sink_objects)
            for w, i in stream:
                self.assertLess(i, spec.n_head if w == "sinks" else -(-_extent(spec.k) // 4))
        # Only a shim task's repeat (the outermost of four dimensions) may have stride 0.
        taps = [t for _, t in spec.sink_taps()] if spec.sinks is not None else []
        for b in range(spec.blocks):
            taps += [spec.q_tap(b), spec.k_tap(b), spec.v_tap(b), spec.out_tap(b)]
            taps += [spec.mask_tap(b)] if spec.mask is not None else []
        for t in taps:
            for i, (n, st) in enumerate(zip(t.sizes, t.strides)):
                if n > 1 and st == 0:
                    self.assertEqual((i, len(t.sizes)), (0, 4), f"stride 0 in {t}")
                    self.assertLessEqual(n, 64)

    def _check_mask(self, spec, b, rows):
        """The f16 values the core reads for each row of block b (row r of the span from the
        block's skip) are that row's mask row, and every word is inside the mask."""
        m, n_kv, words = spec.mask.ne, spec.n_kv, spec.m_side.words
        total = -(-spec.mask.size * spec.mask.nelements // 4)
        # Without the core's skip table (FA_M_SKIPS) every span must start on its first row.
        if "FA_M_SKIPS" not in spec.core.defines:
            self.assertEqual(spec.mask_span(b)[1], 0)
        idx = self._objects(spec, spec.mask_tap(b), spec.a_words)
        self.assertTrue(all(0 <= i < total for i in idx), "a word outside the mask")
        first = idx[0]
        self.assertEqual(idx[:words], list(range(first, first + words)))
        halves = [2 * w + j for w in idx[:words] for j in (0, 1)]
        skip = spec.mask_span(b)[1]
        for g, (i1, h, i3) in enumerate(rows):
            r = g // spec.gh
            row = ((i3 % m[3]) * m[2] + h % m[2]) * m[1] + i1
            got = halves[skip + r * m[0] : skip + r * m[0] + n_kv]
            self.assertEqual(got, list(range(row * m[0], row * m[0] + n_kv)))

    def test_sinks_are_repeated_or_padded_to_whole_objects(self):
        # 32 heads into objects of 256 words: 8 copies by one task's repeat count; 4 heads
        # into 1024 words would take 256 copies (more than a repeat count): once, then K's
        # first words as padding, a second task.
        rep = spec_of(**llama_1b(1, 512, sinks=True))
        pad = spec_of(**PLAN_CASES[0])
        self.assertEqual(rep.sink_tasks, 1)
        self.assertEqual(rep.sink_taps()[0][1].sizes, (rep.a_words // 32, 1, 1, 32))
        self.assertEqual(pad.sink_tasks, 2)
        self.assertGreater(pad.a_words // pad.n_head, 64)
        for spec in (rep, pad):
            self._check_taps(spec)

    def test_odd_mask_rows_read_every_value_inside_the_buffer(self):
        mid_word = 0
        for kw in ODD_MASKS:
            for arch in ("aie2p", "aie2"):
                with self.subTest(arch=arch, **kw):
                    spec = spec_of(arch=arch, **kw)
                    skips = spec.mask_skips()
                    mid_word += any(skips)
                    defines = spec.core.defines
                    self.assertEqual(defines["FA_M_SKIPS"].split(","), [str(x) for x in skips])
                    self.assertEqual(defines["FA_BLOCKS"], spec.blocks)
                    self.assertEqual(defines["FA_M_WORDS"], spec.m_side.words)
                    self._check_taps(spec)
        self.assertGreater(mid_word, 4, "too few mask spans start mid-word")

    def test_blocks_group_query_rows_and_heads(self):
        # A decode with GQA: one block per KV head, all of its query heads.
        spec = spec_of(**llama_1b(1, 512))
        self.assertEqual((spec.gh, spec.gr, spec.blocks), (4, 1, 8))
        # A prefill: blocks of several rows of all four heads of a KV group.
        spec = spec_of(**llama_1b(512, 512))
        self.assertEqual(spec.gh, 4)
        self.assertGreater(spec.gr, 1)
        # A per-head mask: one head per block.
        spec = spec_of(n_q=4, n_head=8, n_head_kv=2, mask=True, mask_ne=[256, 4, 8, 1])
        self.assertEqual(spec.gh, 1)
        self.assertGreater(spec.gr, 1)

    def test_decode_reads_kv_once_per_group_and_needs_no_more_tasks(self):
        for arch in ("aie2p", "aie2"):
            for kw in (
                llama_1b(1, 512, arch=arch),
                llama_1b(1, 4096, arch=arch),
                llama_1b(1, 4096, d=128, arch=arch, sinks=True),
                dict(n_q=1, n_head=12, n_head_kv=12, n_kv=256, mask=True, arch=arch),
                dict(n_q=1, n_head=8, n_head_kv=2, mask=True, mask_ne=[256, 1, 8, 1], arch=arch),
            ):
                with self.subTest(**kw):
                    spec = spec_of(**kw)
                    old_tasks, old_kv = per_item_plan(spec)
                    self.assertLessEqual(spec.channel_tasks()[0], old_tasks)
                    self.assertLessEqual(spec.kv_bytes(), old_kv)
                    if kw["n_head_kv"] < kw["n_head"] and spec.mask.ne[2] == 1:
                        kv_head = spec.n_kv * (spec.d * spec.k.size + spec.dv * spec.v.size)
                        self.assertEqual(spec.kv_bytes(), kw["n_head_kv"] * kv_head)

    def test_prefill_within_dma_tasks_and_core_memory(self):
        # 512 query rows of Llama-3.2-1B-like models: every KV length 512..4096 for D = 64
        # and 128 on aie2p and aie2 (4 columns).
        for arch, d, kvs in (("aie2p", 64, (512, 1024, 2048, 4096)),
                             ("aie2p", 128, (512, 1024, 2048, 4096)),
                             ("aie2", 64, (512, 1024, 2048, 4096)),
                             ("aie2", 128, (512, 1024, 2048, 4096))):  # fmt: skip
            for n_kv in kvs:
                with self.subTest(arch=arch, d=d, n_kv=n_kv):
                    spec = spec_of(**llama_1b(512, n_kv, d=d, arch=arch))
                    self.assertGreater(spec.g, 4)
                    for n in spec.channel_tasks():
                        self.assertLessEqual(n, 1024)
                    used = spec.fifo_bytes() + spec.static_bytes()
                    self.assertLessEqual(used, spec.arch.l1_budget)
                    # Each KV group's K/V is read once per block of gr rows.
                    kv_head = n_kv * (d * spec.k.size + d * spec.v.size)
                    self.assertEqual(spec.kv_bytes(), spec.blocks * kv_head)
                    self.assertEqual(spec.blocks, 8 * len(spec.row_starts))

    def test_dma_limits(self):
        for kw in PLAN_CASES:
            spec = spec_of(**kw)
            ta, tb, to = spec.tasks_per_block
            self.assertEqual((ta, tb, to), (1 + (spec.mask is not None), 2, 1))
            for c in range(spec.columns):
                rounds = spec.rounds(c)
                self.assertEqual(sum(rounds, []), spec.column_blocks(c))
                for i, r in enumerate(rounds):
                    sink = spec.sink_tasks if i == 0 else 0
                    self.assertLessEqual(len(r) * (ta + tb + to) + sink, SHIM_BDS)
            self.assertLessEqual(spec.fifo_bytes() + spec.static_bytes(), spec.arch.l1_budget)
        # A prefill of 8192 rows: more than 1024 tasks on a channel with every block that fits
        # a core, refused.
        with self.assertRaisesRegex(UnsupportedError, "DMA tasks"):
            spec_of(**llama_1b(8192, 512, arch="aie2"))

    def test_refusals(self):
        cases = [
            (dict(kv="f16", d=63), UnsupportedError, "32-bit words"),
            (dict(max_bias=8.0), UnsupportedError, "ALiBi"),
            (dict(kv="f32", d=1024), UnsupportedError, "1023|too long"),
            # A mask row of 32768 keys (64 KiB) alone does not fit a compute tile.
            (dict(n_kv=32768, mask=True), UnsupportedError, "fits a compute tile"),
        ]
        for kw, err, msg in cases:
            with self.subTest(kw=kw), self.assertRaisesRegex(err, msg):
                spec_of(**kw)
        # D = 256 (the largest head size of the models in scope): decode and prefill.
        for kw in (dict(d=256, kv="f16", n_q=1, n_head=8, n_head_kv=2, mask=True),
                   dict(d=256, kv="f16", n_q=512, n_kv=512, n_head=8, n_head_kv=2,
                        mask=True)):  # fmt: skip
            spec = spec_of(**kw)
            self.assertLessEqual(spec.fifo_bytes() + spec.static_bytes(), spec.arch.l1_budget)
        with self.assertRaises(RequestError):
            req = json.loads(fa_request())
            req["output"]["ne"] = [64, 1, 4, 1]
            prepare(parse_request(json.dumps(req)))
        # Some query rows of two sequences: a view of a larger output, declined.
        req = json.loads(fa_request(n_q=16, n_seq=2, mask=True))
        req["output"]["nb"][3] *= 2
        with self.assertRaisesRegex(UnsupportedError, "output must be dense"):
            prepare(parse_request(json.dumps(req)))


class _Kernel:
    """What emu.build.build_library needs of a recorded Kernel: its wrapper's index, the
    core function's name and its argument kinds."""

    def __init__(self, index, name, kinds):
        self.index, self.name, self.kinds = index, name, kinds


def core_library(spec, directory):
    """The core functions of `spec` built for the host (g++, the AIE-API stand-in), loaded:
    {name: callable(*args)} with buffers as numpy arrays and scalars as ints."""
    import ctypes
    from types import SimpleNamespace

    from ggml_hsa_iron.emu.build import build_library

    buf = SimpleNamespace(dtype=np.dtype("int32"))
    out = SimpleNamespace(dtype=np.dtype("float32"))
    names = [("ggml_fa_begin", ["i32"] * 4), ("ggml_fa_sinks", [buf]), ("ggml_fa_q", [buf]),
             ("ggml_fa_side", [buf]), ("ggml_fa_chunk", [buf, buf]), ("ggml_fa_out", [out])]  # fmt: skip
    kernels = [_Kernel(i, n, kinds) for i, (n, kinds) in enumerate(names)]
    path = Path(directory) / "core.so"
    path.write_bytes(build_library(spec.core, kernels, spec.arch.name))
    lib = ctypes.CDLL(str(path))
    fns = {}
    for k in kernels:
        fn = getattr(lib, f"ggml_hsa_emu_{k.index}")

        def call(*args, fn=fn):
            vals = [a.ctypes.data if isinstance(a, np.ndarray) else a & 0xFFFFFFFF for a in args]
            fn((ctypes.c_uint64 * len(vals))(*vals))

        fns[k.name] = call
    return fns


def as_words(values) -> np.ndarray:
    """Values (any numpy type) as 32-bit words (their bytes, little-endian)."""
    return np.frombuffer(np.ascontiguousarray(values).tobytes(), dtype=np.int32)


def objects(words: np.ndarray, size: int, count: int) -> list[np.ndarray]:
    """`words` repeated to `count` objects of `size` words (as the taps' stride-0 dimension
    repeats them), cut into objects."""
    rep = np.tile(words, -(-count * size // len(words)))[: count * size]
    return [rep[i * size : (i + 1) * size].copy() for i in range(count)]


@unittest.skipUnless(HAVE_NUMPY and have_tools(), "needs numpy, ml_dtypes and g++")
class CoreBlockTest(unittest.TestCase):
    """kernels/flash_attn.cc on the host, fed hand-made objects (not the plan's taps) for two
    consecutive blocks of G > 1 rows, against attend_row: q rows of several heads and query
    rows, one mask row per query row shared by the block's heads (a row all -inf, every 5th
    key and the last chunk's keys -inf, NaN in the K and V rows of those keys), per-head sinks and ALiBi slopes (the second
    block's heads are not the first's), softcap, f32/f16/bf16 K and V, Dv != D."""

    CASES = (
        dict(d=64, n_kv=256, n_q=4, n_head=8, n_head_kv=2, kv="f16", mask=True, sinks=True,
             max_bias=8.0),
        dict(d=64, n_kv=128, n_q=3, n_head=8, n_head_kv=2, kv="f32", softcap=20.0, scale=1.0,
             sinks=True),
        dict(d=128, dv=64, n_kv=96, n_q=4, n_head=4, n_head_kv=1, kv="bf16", mask=True,
             max_bias=4.0, softcap=30.0),
    )  # fmt: skip

    def test_blocks_of_several_rows_and_heads(self):
        for arch in ("aie2p", "aie2"):
            for kw in self.CASES:
                with self.subTest(arch=arch, **kw):
                    self._run(spec_of(arch=arch, **kw), seed=len(kw))

    def _run(self, spec, seed):
        self.assertGreater(spec.g, 1)
        self.assertGreater(spec.blocks, 1)
        rng = np.random.default_rng(seed)
        kt = _np_type(spec.k.dtype)
        d, dv, n_kv, A, B = spec.d, spec.dv, spec.n_kv, spec.a_words, spec.b_words
        scale, max_bias, softcap = (
            struct.unpack("<f", struct.pack("<i", p))[0] for p in spec.request.op_params[:3]
        )
        if softcap:
            scale = float(np.float32(scale / softcap))
        slopes = alibi_slopes(spec.n_head, max_bias) if max_bias > 0 else [1.0] * spec.n_head
        sinks = rng.standard_normal(spec.n_head).astype(np.float32)
        first = 1  # a block whose heads do not start at 0
        cases = []
        for b in (first, first + 1):
            q = rng.standard_normal((spec.g, d)).astype(np.float32)
            K = rng.standard_normal((n_kv, d)).astype(kt)
            V = rng.standard_normal((n_kv, dv)).astype(_np_type(spec.v.dtype))
            sides, m = [], None
            if spec.mask is not None:
                m0 = spec.mask.ne[0]
                m = (rng.standard_normal((spec.gr, n_kv)) * 2).astype(np.float16)
                m[:, ::5] = -np.inf
                if spec.gr > 1:
                    m[1] = -np.inf  # a row with every key masked
                if spec.chunks > 1:
                    m[:, -spec.chunk :] = -np.inf  # a chunk hidden from every row: skipped
                hidden = np.isneginf(m).all(axis=0)
                K[hidden] = np.nan  # never used: their keys are masked in every row
                V[hidden] = np.nan
                span = np.full(2 * spec.m_side.words, np.nan, dtype=np.float16)
                for r in range(spec.gr):
                    span[r * m0 : r * m0 + n_kv] = m[r]
                sides += objects(as_words(span), A, spec.m_side.objects)
            cases.append((b, q, K, V, m, sides, np.zeros((spec.g, dv), dtype=np.float32)))
        with tempfile.TemporaryDirectory() as tmp:
            fns = core_library(spec, tmp)
            # Each of the block's cores in turn (core j: head j of each block), fed the same
            # objects; its rows are the block's rows r gh + j.
            for j in range(spec.gh):
                fns["ggml_fa_begin"](first, 1, j, spec.mask_stride)
                if spec.sinks is not None:
                    for o in objects(as_words(sinks), A, spec.sink_objects):
                        fns["ggml_fa_sinks"](o)
                for _b, q, K, V, _m, sides, got in cases:
                    for o in objects(as_words(q), B, spec.q_objects):
                        fns["ggml_fa_q"](o)
                    for o in sides:
                        fns["ggml_fa_side"](o)
                    kw_, vw = as_words(K), as_words(V)
                    for c in range(spec.chunks):
                        fns["ggml_fa_chunk"](kw_[c * A : (c + 1) * A].copy(),
                                             vw[c * B : (c + 1) * B].copy())  # fmt: skip
                    for r in range(spec.gr):
                        row = np.full(dv, np.nan, dtype=np.float32)
                        fns["ggml_fa_out"](row)
                        got[r * spec.gh + j] = row
            for b, q, K, V, m, _sides, got in cases:
                h0 = (b % spec.n_hb) * spec.gh
                Kf, Vf = K.astype(np.float64), V.astype(np.float64)
                for g in range(spec.g):
                    h, r = h0 + g % spec.gh, g // spec.gh
                    mv = m[r] if m is not None else None
                    sink = sinks[h] if spec.sinks is not None else None
                    want = attend_row(round_to(q[g], spec.k.dtype), Kf, Vf, scale, softcap, mv,
                                      slopes[h], sink)  # fmt: skip
                    self.assertTrue(np.isfinite(got[g]).all(), f"block {b} row {g}")
                    err = np.abs(got[g] - want).max()
                    self.assertLess(err, 2e-5 * max(1.0, np.abs(want).max()), f"block {b} row {g}")
                    if m is not None and r == 1 and spec.sinks is None:
                        self.assertTrue((got[g] == 0).all())


@unittest.skipUnless(HAVE_NUMPY and have_tools(), "needs numpy, ml_dtypes and g++")
class EndToEndTest(unittest.TestCase):
    def test_decode_and_small_prefill(self):
        for arch in ("aie2p", "aie2"):
            for kw in (
                dict(d=64, n_kv=256, kv="f16"),
                dict(d=128, n_kv=512, kv="f32", n_q=4, mask=True),
                dict(d=64, n_kv=256, kv="f16", n_q=4, mask=True, sinks=True),
                dict(d=128, n_kv=256, kv="bf16", mask=True, max_bias=8.0, n_head=4),
            ):
                with self.subTest(arch=arch, **kw):
                    run_case(self, arch=arch, **kw)

    def test_run_time_n_kv(self):
        # One program for n_kv up to 1024 in steps of 256 (a decode step, or a prompt's rows,
        # against a growing cache), run at several: the mask is rows of n values (llama.cpp's
        # for that n_kv, dense), the cache's rows past n are NaN.
        from ggml_hsa_iron.emu.compile import build_program
        from ggml_hsa_iron.emu.params import instantiate
        from ggml_hsa_iron.tests.util_emu_seq import buffer_of, new_buffer, run_program_in_order

        most = 1024
        # (query rows, mask rows): a decode step, a prompt's piece of 32 rows, 20 rows of a
        # mask padded to 64.
        shapes = ((1, 1), (32, 32), (20, 64))
        for arch in ("aie2p", "aie2"):
            for n_q, m_rows in shapes if arch == "aie2p" else shapes[:2]:
                kw = llama_1b(n_q, most, mask_ne=[most, m_rows, 1, 1])
                text = json.dumps(
                    {**json.loads(fa_request(**{**kw, "arch": arch})), "n_kv_step": 256}
                )
                req = parse_request(text)
                spec = prepare(req)
                program, lib = build_program(spec)
                for n in (256, 768, 1024):
                    with self.subTest(arch=arch, n_q=n_q, n=n):
                        rng = np.random.default_rng(n + n_q)
                        qt, kt, vt, mt = req.inputs
                        q = rng.standard_normal((1, 32, n_q, 64)).astype(np.float32)
                        k = rng.standard_normal((1, 8, most, 64)).astype(np.float16)
                        v = rng.standard_normal((1, 8, most, 64)).astype(np.float16)
                        mask = (rng.standard_normal((1, 1, m_rows, n)) * 2).astype(np.float16)
                        mask[..., ::5] = -np.inf
                        k[:, :, n:] = np.nan
                        v[:, :, n:] = np.nan
                        m = np.zeros(-(-_extent(mt) // 4) * 4, np.uint8)
                        m[: mask.nbytes] = mask.reshape(-1).view(np.uint8)
                        ins = [
                            buffer_of(place(qt, q)),
                            buffer_of(place(kt, k)),
                            buffer_of(place(vt, v)),
                        ]
                        out = new_buffer(req.output.nelements * 4)
                        run_program_in_order(instantiate(program, [n]), lib, [*ins, m, out])
                        sub = types.SimpleNamespace(op_params=req.op_params, inputs=(qt, kt, vt))
                        ref = reference(sub, q, k[:, :, :n], v[:, :, :n], mask)
                        got = np.frombuffer(out.tobytes(), np.float32).reshape(ref.shape)
                        err = np.abs(got - ref).max()
                        self.assertTrue(np.isfinite(got).all())
                        bound = 2e-5 * max(1.0, np.abs(ref).max())
                        self.assertLess(err, bound, f"{arch} {n_q} rows, n {n}: {err}")

    def test_softcap_sinks_gqa_and_odd_chunks(self):
        for kw in (
            dict(d=64, n_kv=256, kv="f32", softcap=30.0, scale=1.0, sinks=True),
            dict(d=64, n_kv=200, kv="f16", n_q=4, mask=True, n_head=4, n_head_kv=2),
            dict(d=64, n_kv=256, kv="f16", n_q=1, n_head=4, n_head_kv=4, n_seq=2, mask=True),
            dict(d=128, dv=64, n_kv=256, kv="f16", mask=True, sinks=True, max_bias=4.0),
        ):
            with self.subTest(**kw):
                run_case(self, **kw)

    def test_odd_mask_rows(self):
        # Mask rows of an odd length: every other row starts mid-word (embedding models).
        for arch in ("aie2p", "aie2"):
            for kw in ODD_MASKS[:4]:
                with self.subTest(arch=arch, **kw):
                    run_case(self, arch=arch, **kw)
        run_case(self, **ODD_MASKS[4])

    def test_blocks_of_rows_and_heads(self):
        # Blocks of several query rows of a KV group's heads, the last row block moved back
        # (overlapping rows computed twice), per-head sinks and slopes; a per-head mask (one
        # head per block, several rows); two sequences with K/V broadcast over them.
        for kw in (
            dict(d=64, n_kv=128, kv="f16", n_q=7, n_head=8, n_head_kv=2, mask=True,
                 sinks=True, max_bias=8.0),
            dict(d=64, n_kv=128, kv="f16", n_q=5, n_head=4, n_head_kv=2, mask=True,
                 mask_ne=[128, 5, 4, 1]),
            dict(d=64, n_kv=64, kv="bf16", n_q=3, n_head=4, n_head_kv=1, n_seq=2, mask=True,
                 mask_ne=[64, 3, 1, 2]),
        ):  # fmt: skip
            spec = spec_of(**kw)
            self.assertGreater(spec.g, 1)
            with self.subTest(**kw):
                run_case(self, **kw)

    def test_design_tasks_per_channel_match_the_plan(self):
        from ggml_hsa_iron.emu.compile import record

        for kw in (dict(d=64, n_kv=128, n_q=7, n_head=8, n_head_kv=2, mask=True, sinks=True),
                   llama_1b(512, 512, arch="aie2")):  # fmt: skip
            spec = spec_of(**kw)
            counts = {}
            for op in record(spec).rt.sequence.ops:
                if op["op"] in ("fill", "drain"):
                    name = op["handle"]._object_fifo.name
                    counts[name] = counts.get(name, 0) + 1
            self.assertEqual(
                (counts["fa_a_c0"], counts["fa_b_c0"], counts["fa_out_c0"]), spec.channel_tasks()
            )
            self.assertLessEqual(max(counts.values()), 1024)

    def test_masked_rows_are_zero_and_nan_cache_rows_unread(self):
        # place() leaves NaN patterns between the heads of the cache rows and after n_kv;
        # query row 1 of the mask is all -inf: its output rows are 0 (no sinks) exactly.
        got, ref = run_case(self, d=64, n_kv=256, kv="f16", n_q=4, mask=True)
        self.assertTrue((got[:, 1] == 0).all())


if __name__ == "__main__":
    unittest.main()
