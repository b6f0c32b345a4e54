"""FLASH_ATTN_EXT (and _MASK, _SINKS, _MASK_SINKS): designs/flash_attn.py, plans_fa.py and
kernels/flash_attn.cc.

* the core functions built with g++ against the AIE-API stand-in and called directly on
  hand-made objects: a fully masked row is 0, a sink alone takes its share, NaN V rows under a
  -inf mask are never read, the per-core item counter picks the ALiBi slope;
* the plan: every item's taps read exactly the q row, the mask row, the sink and every K and
  V byte of the item's kv head (GQA) in order, as whole objects; the shim tile's 16 buffer
  descriptors per round and 1024 tasks per channel; the core memory; the refusals;
* end to end: the design compiled for the emulation target and its recorded program run on
  real data (tests/util_emu.py) against a numpy reference of ggml-cpu's semantics (q rounded
  to K's type, scale, softcap, ALiBi, -inf masks, sinks, GQA, mask broadcast), D 64 and 128,
  n_kv 256, 512 and 200 (chunks that are not powers of two), n_q 1 and 4, f32, f16 and bf16
  K/V, aie2p and aie2; mask rows of an odd length (embedding models: n_kv = n_q = 25 and 7,
  q a permuted view, contiguous f16 K/V; decode rows with the mask broadcast per head): the
  plan reads every value of each item's row and no word outside the mask.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import json
import struct
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


def reference(req, q, k, v, mask=None, sinks=None):
    """ggml-cpu's FLASH_ATTN_EXT (tests/hsa-sim/src/exec/attn.rs) in float64 on the same
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
                s = (K @ qr) * scale
                if softcap:
                    s = softcap * np.tanh(s)
                keep = np.ones(len(s), dtype=bool)
                if mask is not None:
                    m2, m3 = mask.shape[1], mask.shape[0]
                    mv = mask[i3 % m3, h % m2, i1, : len(s)].astype(np.float64)
                    keep = mv != -np.inf
                    s = s + slopes[h] * np.where(keep, mv, 0.0)
                logits = list(s[keep])
                if sinks is not None:
                    logits.append(float(sinks[h]))
                if not logits:
                    continue
                mx = max(logits)
                w = np.exp(s[keep] - mx)
                tot = w.sum() + (np.exp(float(sinks[h]) - mx) if sinks is not None else 0.0)
                if tot:
                    out[i3, i1, h] = (w @ V[keep]) / tot
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


class PlanTest(unittest.TestCase):
    def _objects(self, spec, tap, words):
        idx = tap.indices()
        self.assertEqual(len(idx) % words, 0, "a fill ends inside an object")
        return idx

    def test_taps_read_each_items_operands_as_whole_objects(self):
        for kw in (
            dict(mask=True, sinks=True),
            dict(kv="f32", d=128, n_kv=512, n_q=4, mask=True),
            dict(kv="bf16", n_kv=200, mask=True, n_seq=2, n_head=4, n_head_kv=1),
        ):
            spec = spec_of(**kw)
            A, B = spec.a_words, spec.b_words
            k, v, q = spec.k, spec.v, spec.q
            for t in range(spec.items):
                i1, h, i3 = spec.item_index(t)
                self.assertEqual(t, (i3 * q.ne[1] + i1) * q.ne[2] + h)
                qi = self._objects(spec, spec.q_tap(t), A)
                qoff = (i1 * q.nb[1] + h * q.nb[2] + i3 * q.nb[3]) // 4
                self.assertEqual(qi[: spec.d], list(range(qoff, qoff + spec.d)))
                self.assertEqual(len(qi) // A, spec.q_side.objects)
                hk = h // (q.ne[2] // k.ne[2])
                i3k = i3 // (q.ne[3] // k.ne[3])
                for tensor, tap, rw in ((k, spec.k_tap(t), spec.k_row_words),
                                        (v, spec.v_tap(t), spec.v_row_words)):  # fmt: skip
                    got = tap.indices()
                    want = [
                        (j * tensor.nb[1] + hk * tensor.nb[2] + i3k * tensor.nb[3]) // 4 + w
                        for j in range(spec.n_kv)
                        for w in range(rw)
                    ]
                    self.assertEqual(got, want)
                    self.assertEqual(len(got) % (A if tensor is k else B), 0)
                if spec.mask is not None:
                    m = spec.mask.ne
                    mi = self._objects(spec, spec.mask_tap(t), A)
                    row = ((i3 % m[3]) * m[2] + h % m[2]) * m[1] + i1
                    first = row * m[0] // 2
                    w = -(-spec.n_kv // 2)
                    self.assertEqual(mi[:w], list(range(first, first + w)))
                if spec.sinks is not None:
                    si = self._objects(spec, spec.sink_tap(t), A)
                    self.assertEqual(set(si), {h})

    def test_odd_mask_rows_read_every_value_inside_the_buffer(self):
        for kw in ODD_MASKS:
            for arch in ("aie2p", "aie2"):
                with self.subTest(arch=arch, **kw):
                    self._check_mask_spans(spec_of(arch=arch, **kw))

    def _check_mask_spans(self, spec):
        m, n_kv, words = spec.mask.ne, spec.n_kv, spec.m_side.words
        total = -(-spec.mask.size * spec.mask.nelements // 4)
        skips = spec.mask_skips()
        self.assertTrue(any(skips), "no mask row starts mid-word")
        defines = spec.core.defines
        self.assertEqual(defines["FA_M_SKIPS"].split(","), [str(x) for x in skips])
        self.assertEqual(defines["FA_ITEMS"], spec.items)
        self.assertEqual(defines["FA_M_WORDS"], words)
        for t in range(spec.items):
            i1, h, i3 = spec.item_index(t)
            idx = self._objects(spec, spec.mask_tap(t), spec.a_words)
            self.assertTrue(all(0 <= i < total for i in idx), "a word outside the mask")
            first = idx[0]
            self.assertEqual(idx[:words], list(range(first, first + words)))
            # The row's f16 values, as the core reads them from the words it got.
            row = ((i3 % m[3]) * m[2] + h % m[2]) * m[1] + i1
            halves = [2 * w + j for w in idx[:words] for j in (0, 1)]
            got = halves[skips[t] : skips[t] + n_kv]
            self.assertEqual(got, list(range(row * m[0], row * m[0] + n_kv)))

    def test_dma_limits(self):
        spec = spec_of(n_q=4, n_head=8, n_head_kv=2, mask=True, sinks=True)
        ta, tb = spec.tasks_per_item
        self.assertEqual((ta, tb), (4, 1))
        for c in range(spec.columns):
            rounds = spec.rounds(c)
            self.assertEqual(sum(rounds, []), spec.column_items(c))
            for r in rounds:
                self.assertLessEqual(len(r) * (ta + tb) + 1, SHIM_BDS)
        self.assertLessEqual(spec.fifo_bytes() + spec.static_bytes(), spec.arch.l1_budget)
        # A prefill's many query rows: more than 1024 tasks on a channel, refused.
        with self.assertRaisesRegex(UnsupportedError, "DMA tasks"):
            spec_of(n_q=512, n_head=32, n_head_kv=8, mask=True)

    def test_refusals(self):
        cases = [
            (dict(kv="f16", d=63), UnsupportedError, "32-bit words"),
            (dict(max_bias=8.0), UnsupportedError, "ALiBi"),
            (dict(kv="f32", d=1024), UnsupportedError, "1023|too long"),
        ]
        for kw, err, msg in cases:
            with self.subTest(kw=kw), self.assertRaisesRegex(err, msg):
                spec_of(**kw)
        with self.assertRaises(RequestError):
            req = json.loads(fa_request())
            req["output"]["ne"] = [64, 1, 4, 1]
            prepare(parse_request(json.dumps(req)))


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

    def test_masked_rows_are_zero_and_nan_cache_rows_unread(self):
        # place() leaves NaN patterns between the heads of the cache rows and after n_kv;
        # query row 1 of the mask is all -inf: its output rows are 0 (no sinks) exactly.
        got, ref = run_case(self, d=64, n_kv=256, kv="f16", n_q=4, mask=True)
        self.assertTrue((got[:, 1] == 0).all())


if __name__ == "__main__":
    unittest.main()
