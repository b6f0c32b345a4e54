"""DECODE_LAYER[_BIAS|_HEAD_NORM](_FF)_<glu>: a llama (qwen2, qwen3) layer of one decode step in
one program (plans_decode.py, designs/ffn.py): its plans at Llama-3.2-1B's, the qwen shapes and
the tiny llama's shapes, its refusals, the
recorded synchronisation (Q, K rows and V rows complete before the attention reads them), and
end to end in the emulation: the projections bit for bit against the lone kernels on the same
shape, the new token's K and V rows inside the cache views the attention reads, a, r1, h and out
against numpy."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import json
import shutil
import types
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tiling import rope_array_floats
from ggml_hsa_iron.tests import sample
from ggml_hsa_iron.tests.test_flash_attn import cache_view, f32_bits
from ggml_hsa_iron.tests.test_rms_norm_mul_mat_rope import llama3_ff, rope_params
from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests.util_ffn import EPS_BITS, np

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
HAVE_NUMPY = np is not None
# (K, n_head, n_head_kv, D, F, n_kv)
LLAMA = (2048, 32, 8, 64, 8192, 256)
TINY = (256, 4, 2, 64, 512, 256)
QWEN3_0_6B = (1024, 16, 8, 128, 3072, 256)
QWEN2_5_1_5B = (1536, 12, 2, 128, 8960, 256)
GEMMA3_1B = (1152, 4, 1, 256, 6912, 256)
GEMMA2_2B = (2304, 8, 4, 256, 9216, 256)
GLUS = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")
# The post norms' eps (after the attention's projection, after the block).
POST_EPS = (1e-6, 1e-5)
# The runtime-sequence arguments without the factors (the op's operand order).
ARGS = "Wq Wk Wv x n_attn pos k v mask Wo Wg Wu Wd n_ffn out Q Kr Vr a r1 h".split()


def layer_tensors(wt, K, H, Hk, D, F, n_kv, ff=False, kv="f16", rows=None, T=1, kind="", **over):
    """(inputs, output, extra_outputs) of a decode layer: the cache of n_kv + 32 rows (llama's
    layout, KV heads interleaved in a row), K and V rows of `rows` (default the cache's type);
    `kind` "BIAS" (Q's, K's and V's biases) or "HEAD_NORM" (Q's and K's head norm weights),
    with "POST_NORM" (gemma's norms after the attention's projection and after the block: their
    weights behind n_ffn, o and d behind h). `over`: per-input type overrides (wv, wd)."""
    rows = rows or kv
    Mq, Mk = D * H, D * Hk
    ins = [
        tensor(wt, [K, Mq]),
        tensor(wt, [K, Mk]),
        tensor(over.get("wv", wt), [K, Mk]),
        tensor("f32", [K, T]),
        tensor("f32", [K]),
        tensor("i32", [T]),
    ]
    ins += [tensor("f32", [D // 2])] if ff else []
    ins += [tensor("f32", [M]) for M in (Mq, Mk, Mk)] if kind == "BIAS" else []
    ins += [tensor("f32", [D])] * 2 if kind.startswith("HEAD_NORM") else []
    ins += [cache_view(kv, D, n_kv, Hk, n_kv + 32), cache_view(kv, D, n_kv, Hk, n_kv + 32)]
    ins += [tensor("f16", [n_kv, 64]), tensor(wt, [Mq, K]), tensor(wt, [K, F])]
    ins += [tensor(wt, [K, F]), tensor(over.get("wd", wt), [F, K]), tensor("f32", [K])]
    ins += [tensor("f32", [K])] * 2 if "POST_NORM" in kind else []
    extras = [
        tensor("f32", [D, H, T]),
        tensor(rows, [D, Hk, T]),
        tensor(rows, [Mk, T]),
        tensor("f32", [D, H, T]),
        tensor("f32", [K, T]),
        tensor("f32", [F, T]),
    ]
    extras += [tensor("f32", [K, T])] * 2 if "POST_NORM" in kind else []
    return ins, tensor("f32", [K, T]), extras


def layer_params(D, mode=0, scale=0.125, max_bias=0.0, softcap=0.0, kind=""):
    fa = [f32_bits(scale), f32_bits(max_bias), f32_bits(softcap), EPS_BITS]
    # The head norm's eps (qwen3's 1e-6), then the post norms' (gemma's 1e-6, 1e-5).
    head = [f32_bits(1e-6)] if kind.startswith("HEAD_NORM") else []
    if "POST_NORM" in kind:
        head = (head or [0]) + [f32_bits(POST_EPS[0]), f32_bits(POST_EPS[1])]
    return rope_params(D, mode) + fa + head


def layer_request(glu, wt, dims, arch="aie2p", ff=False, kv="f16", rows=None, T=1, **kw):
    """The request; `n_kv_step`: n_kv given at dispatch in these steps, dims' n_kv the most;
    `kind`: "", "BIAS" or "HEAD_NORM" (the op's variant)."""
    kind = kw.pop("kind", "")
    over = kw.pop("w", {})
    ins, out, extras = layer_tensors(wt, *dims, ff=ff, kv=kv, rows=rows, T=T, kind=kind, **over)
    op = f"DECODE_LAYER_{kind + '_' if kind else ''}{'FF_' if ff else ''}{glu}"
    step = kw.pop("n_kv_step", 0)
    params = kw.pop("op_params", None) or layer_params(dims[3], kind=kind, **kw)
    text = request_json(op, ins, out, arch, op_params=params, extra_outputs=extras)
    if not step:
        return text
    return json.dumps({**json.loads(text), "n_kv_step": step})


def layer_spec(*args, **kw):
    return prepare(parse_request(layer_request(*args, **kw)))


def shape(spec):
    p = spec.up.plan
    return p.columns, p.rows, p.rows_per_tile, p.k_chunk


def groups(spec):
    """(name, first column, columns, rounds, rounds per y object) of the projections."""
    return [(g.name, g.col0, g.plan.columns, g.plan.rounds, g.pack) for g in spec.qkv.groups]


class DecodeLayerPlanTest(unittest.TestCase):
    def test_llama_3_2_1b(self):
        # The block's own shape (FLASH_ATTN_FFN_<glu>'s), Q on half the columns, K and V on
        # one column each, two rounds of f16 rows packed into each y object.
        want = {
            ("q4_0", "aie2p"): ((8, 4, 64, 256), [("q", 0, 4, 2, 1), ("k", 4, 1, 2, 2), ("v", 5, 1, 2, 2)]),
            ("q4_0", "aie2"): ((4, 4, 64, 256), [("q", 0, 2, 4, 1), ("k", 2, 1, 2, 2), ("v", 3, 1, 2, 2)]),
            ("f16", "aie2p"): ((8, 4, 32, 256), [("q", 0, 4, 4, 1), ("k", 4, 1, 4, 2), ("v", 5, 1, 4, 2)]),
            ("f16", "aie2"): ((4, 4, 32, 256), [("q", 0, 2, 8, 1), ("k", 2, 1, 4, 2), ("v", 3, 1, 4, 2)]),
        }  # fmt: skip
        for (wt, arch), (sh, gs) in want.items():
            for ff in (False, True):
                with self.subTest(wt=wt, arch=arch, ff=ff):
                    spec = layer_spec("SWIGLU", wt, LLAMA, arch, ff=ff)
                    self.assertEqual(shape(spec), sh)
                    self.assertEqual(groups(spec), gs)
                    # FLASH_ATTN_FFN_<glu>'s phases on their own choose the same shape.
                    from ggml_hsa_iron.tests.util_ffn import fa_ffn_spec

                    own = fa_ffn_spec("SWIGLU", wt, *LLAMA, arch=arch)
                    self.assertEqual(shape(own), sh)
                    self.assertEqual(len(spec.sequence), 21 + ff)

    def test_a_few_tokens_take_the_block_s_own_shape(self):
        from ggml_hsa_iron.tests.util_ffn import fa_ffn_spec

        for arch, T in (("aie2p", 4), ("aie2", 8)):
            with self.subTest(arch=arch, T=T):
                spec = layer_spec("SWIGLU", "q4_0", LLAMA[:5] + (1024,), arch, T=T)
                own = fa_ffn_spec("SWIGLU", "q4_0", *LLAMA[:5], 1024, n_q=T, arch=arch)
                self.assertEqual(shape(spec), shape(own))
                self.assertEqual({p.plan.nx for p in spec.phases}, {T})
                self.assertEqual({g.plan.nx for g in spec.qkv.groups}, {T})

    def test_tiny_llama(self):
        spec = layer_spec("SWIGLU", "f32", TINY)
        self.assertEqual(shape(spec), (8, 2, 16, 256))
        self.assertEqual(groups(spec), [("q", 0, 4, 2, 1), ("k", 4, 2, 2, 2), ("v", 6, 2, 2, 2)])
        # f32 cache rows: one round per y object.
        spec = layer_spec("SWIGLU", "f32", TINY, kv="f32")
        self.assertEqual({g.pack for g in spec.qkv.groups}, {1})

    def test_qwen_layers(self):
        # qwen2 (NeoX) on the block's own shape: each group's bias values kept for its rounds,
        # the array sized for the longest group; the three biases follow the positions. Heads
        # of 128 rows: Q's and K's cores take theirs in four rounds of 32, Q's drained with one
        # tap a head.
        spec = layer_spec("SWIGLU", "q4_0", QWEN2_5_1_5B, kind="BIAS", mode=2)
        self.assertEqual(shape(spec), (8, 2, 32, 256))
        self.assertEqual(groups(spec), [("q", 0, 6, 4, 1), ("k", 6, 1, 4, 2), ("v", 7, 1, 4, 2)])
        self.assertEqual([g.split for g in spec.qkv.groups], [4, 4, 1])
        self.assertEqual([g.rounds_per_unit for g in spec.qkv.groups], [4, 2, 2])
        d = spec.core.defines
        self.assertEqual((d["DL_BIAS"], d["DL_BIAS_ROUNDS"], d["DL_BIAS_COLUMN_ROWS"]), (1, 4, 64))
        self.assertEqual(d["DL_SPLIT"], 4)
        self.assertEqual(len(spec.sequence), 24)
        self.assertEqual([n for _, n in spec.sequence[6:9]], [1536, 256, 256])
        for g in spec.qkv.groups:
            self.assertIn("b", [n for n, _ in g.prologue(0)])
        # qwen3: Q's and K's head norm weights among the rotation's constants.
        spec = layer_spec("SWIGLU", "q4_0", QWEN3_0_6B, kind="HEAD_NORM", mode=2)
        self.assertEqual(shape(spec), (8, 2, 64, 256))
        self.assertEqual(groups(spec), [("q", 0, 4, 4, 1), ("k", 4, 2, 4, 2), ("v", 6, 2, 4, 2)])
        self.assertEqual((spec.core.defines["DL_HEAD_NORM"], spec.core.defines["DL_SPLIT"]), (1, 2))
        self.assertNotIn("DL_BIAS", spec.core.defines)
        self.assertEqual(len(spec.sequence), 23)
        self.assertIn("hn", [n for n, _ in spec.qkv.q.prologue(0)])
        # A task group holds whole heads: their y objects leave at the head's last round.
        self.assertEqual(spec.qkv.units_per_task_group % 2, 0)

    def test_the_taps_write_each_row_once(self):
        # Llama-3.2-1B's heads whole in a core's round, Qwen3-0.6B's split over two, Qwen2.5's
        # over four.
        cases = [(LLAMA, 0, kv, 1) for kv in ("f16", "f32")]
        cases += [
            (QWEN3_0_6B, 2, "f16", 2),
            (QWEN2_5_1_5B, 2, "f16", 4),
            (QWEN2_5_1_5B, 2, "f32", 4),
        ]
        for dims, mode, kv, split in cases:
            spec = layer_spec("SWIGLU", "q4_0", dims, kv=kv, mode=mode)
            self.assertEqual(spec.qkv.split, split)
            for g in spec.qkv.groups:
                words = []
                for c in range(g.plan.columns):
                    for u in range(g.units):
                        t = g.y_tap(c, u)
                        for a in range(t.sizes[0]):
                            for b in range(t.sizes[1]):
                                for d in range(t.sizes[2]):
                                    off = t.offset + a * t.strides[0] + b * t.strides[1]
                                    off += d * t.strides[2]
                                    words += range(off, off + t.sizes[3])
                self.assertEqual(sorted(words), list(range(g.out_words)), (kv, g.name))
                # And every W unit (dense rows) is read once.
                units = []
                for c in range(g.plan.columns):
                    for u in range(g.units):
                        for t in g.w_taps(c, u):
                            for idx in np.ndindex(*t.sizes[:3]):
                                off = t.offset + sum(i * st for i, st in zip(idx, t.strides))
                                units += range(off, off + t.sizes[3])
                n_units = g.plan.N * g.plan.row_stride
                self.assertEqual(sorted(units), list(range(n_units)), (dims, g.name))

    def test_limits_count_every_phase(self):
        from ggml_hsa_iron.plans_ffn import ffn_core_bytes, program_tasks

        for arch in ("aie2p", "aie2"):
            spec = layer_spec("SWIGLU", "q4_0", LLAMA, arch)
            core = ffn_core_bytes(spec.up.plan) + spec.fa.core_bytes + spec.qkv.core_bytes
            self.assertLessEqual(core, spec.arch.l1_budget)
            self.assertGreater(spec.qkv.core_bytes, 0)
            tasks = program_tasks([s.plan for s in spec.phases], 1)
            for k in tasks:
                tasks[k] += spec.fa.tasks[k] + spec.qkv.tasks[k]
            self.assertLessEqual(max(tasks.values()), 1024)
            defines = spec.core.defines
            self.assertEqual((defines["MV_DECODE"], defines["DL_HEAD"]), (1, 64))
            self.assertEqual(defines["MV_FA"], 1)

    def test_rotation_kept_in_the_q_rows(self):
        # Over several tokens the layer takes the block's own shape: the 1B shape's 8 tokens
        # on aie2p fit it only with the rotation's arrays in the attention's q rows (not live
        # at once); 4 tokens fit without.
        for n_kv in (256, 1024):
            spec = layer_spec("SWIGLU", "q4_0", LLAMA[:5] + (n_kv,), "aie2p", T=8)
            self.assertEqual(shape(spec), (8, 4, 32, 256))
            self.assertTrue(spec.qkv.rope_in_fa_q)
            self.assertEqual(spec.core.defines["DL_ROPE_IN_FA_Q"], 1)
            self.assertGreaterEqual(spec.fa.q_floats, rope_array_floats(spec.qkv.rope_rows))
        spec = layer_spec("SWIGLU", "q4_0", LLAMA, "aie2p", T=4)
        self.assertFalse(spec.qkv.rope_in_fa_q)
        self.assertEqual(spec.core.defines["DL_ROPE_IN_FA_Q"], 0)

    def test_gemma_layers(self):
        # Gemma 3 1B's shape takes the one program on aie2p; its post norms' phases a round
        # each after the squares' group. Gemma 2 2B's Q and K heads of 256 rows (no shape of
        # the projection phase) are refused (the layer's kernels run).
        spec = layer_spec("GEGLU", "q4_0", GEMMA3_1B, kind="HEAD_NORM_POST_NORM", mode=2)
        # One core per column: K's one head of 256 rows is whole on one core of its column
        # (NeoX pairs, the head norm), and every core of a group's column has rows.
        self.assertEqual(shape(spec), (6, 1, 64, 128))
        names = [name for name, _ in spec.sequence_phases()]
        self.assertEqual(names[2:], ["O", "O's norm + residual", "norm, gate, up", "down",
                                     "down's norm + residual"])  # fmt: skip
        self.assertEqual(spec.core.defines["DL_POST_NORM"], 1)
        self.assertEqual(len(spec.sequence), 27)
        with self.assertRaises(UnsupportedError):
            layer_spec("GEGLU", "q4_0", GEMMA2_2B, kind="POST_NORM", mode=2)

    def test_refusals(self):
        # f32 weights take their tokens one at a time, the attention's objects all of them.
        with self.assertRaisesRegex(UnsupportedError, "one at a time"):
            layer_spec("SWIGLU", "f32", TINY, T=2)
        with self.assertRaisesRegex(UnsupportedError, "Wv is q6_K"):
            layer_spec("SWIGLU", "q4_K", (2048, 32, 8, 64, 8192, 256), w={"wv": "q6_K"})
        with self.assertRaisesRegex(UnsupportedError, "W_d is q6_K"):
            layer_spec("SWIGLU", "q4_K", (2048, 32, 8, 64, 8192, 256), w={"wd": "q6_K"})
        # RMS_NORM_QKV_ROPE's (rope mode 1) and FLASH_ATTN_FFN_<glu>'s (ALiBi) refusals.
        with self.assertRaisesRegex(UnsupportedError, "rope mode"):
            layer_spec("SWIGLU", "f32", TINY, mode=1)
        with self.assertRaisesRegex(UnsupportedError, "ALiBi"):
            layer_spec("SWIGLU", "f32", TINY, max_bias=8.0)
        with self.assertRaises(RequestError):
            req = parse_request(layer_request("SWIGLU", "f32", TINY))
            import dataclasses

            prepare(dataclasses.replace(req, extra_outputs=req.extra_outputs[:3]))
        for glu in GLUS:
            for ff in (False, True):
                self.assertIsNotNone(layer_spec(glu, "f32", TINY, ff=ff))


class DecodeLayerRecordTest(unittest.TestCase):
    def test_projections_complete_before_the_attention(self):
        from ggml_hsa_iron.emu.compile import record

        for dims, wt, arch in ((LLAMA, "q4_0", "aie2"), (TINY, "f32", "aie2p")):
            with self.subTest(dims=dims, arch=arch):
                spec = layer_spec("SWIGLU", wt, dims, arch)
                seq = record(spec).to_json("dl", arch)["sequence"]
                a = {n: i for i, n in enumerate(ARGS)}
                first = next(
                    i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == a["Q"]
                )
                outs = {a["Q"], a["Kr"], a["Vr"]}
                drains = {op["task"] for op in seq if op["op"] == "drain" and op["arg"] in outs}
                awaited = {t for op in seq[:first] if op["op"] == "await" for t in op["tasks"]}
                self.assertTrue(drains)
                self.assertLessEqual(drains, awaited)
                # Nothing of the attention reads k or v before that.
                cache = {a["k"], a["v"]}
                self.assertFalse([op for op in seq[:first] if op.get("arg") in cache])
                # The drains of every projection happen before `first`.
                before = {op["arg"] for op in seq[:first] if op["op"] == "drain"}
                self.assertEqual(before, outs)
                # sequence_phases counts the awaits: each phase after the first reads what the
                # phase before wrote (its first fill of it) between that phase's last await
                # and its own first await; its weights go out at most one task group early
                # (designs/ffn.py's _ahead), after the await of the group before that one.
                # Together the phases' awaits are the sequence's.
                phases = spec.sequence_phases()
                awaits = [i for i, op in enumerate(seq) if op["op"] == "await"]
                self.assertEqual(sum(n for _, n in phases), len(awaits))
                ends = np.cumsum([n for _, n in phases])

                def first_fill(arg, seq=seq, a=a):
                    return next(
                        i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == a[arg]
                    )

                for arg, before in zip(("Q", "a", "r1", "h"), ends[:-1]):
                    self.assertLess(awaits[before - 1], first_fill(arg), arg)
                    self.assertLess(first_fill(arg), awaits[before], arg)
                for arg, before in zip(("Wo", "Wg", "Wd"), ends[1:-1]):
                    self.assertLess(awaits[before - 2] if before > 1 else -1, first_fill(arg), arg)
                    self.assertLess(first_fill(arg), awaits[before], arg)
                # Here the attention has one task group per column round: its KV head's
                # rows. W_o's tiles go out while it runs.
                self.assertLess(first_fill("Wo"), awaits[ends[1] - 1])


def check_post_norm(test, p, n, r, got, eps, what):
    """got [T, K] against rms_norm(p) * n + r (RMS_NORM_MUL_ADD's nodes) of p [T, K], within
    f32 rounding of its sums and steps."""
    p64 = p.astype(np.float64)
    s = 1 / np.sqrt((p64 * p64).mean(axis=-1, keepdims=True) + eps)
    normed = p64 * s * n
    want = normed + r
    tol = (np.abs(normed) + np.abs(r)) * 2.0**-20 + 1e-30
    bad = ~(np.abs(got.astype(np.float64) - want) <= tol)
    if bad.any():
        test.fail(
            f"{what}: {int(bad.sum())} of {got.size} wrong, first at "
            f"{np.argwhere(bad)[0]}: {got[bad][0]} vs {want[bad][0]}"
        )


class LayerCase:
    """One request's operands: weights (fast_weights), x and n (util_norm's), the caches of
    `kv` (masked keys' rows NaN, never read), the T tokens at cache rows `row` ...; `kind`'s
    own inputs (biases, head norm weights) per projection."""

    def __init__(
        self, glu, wt, dims, arch, ff=False, kv="f16", seed=0, masked=5, pos=7, n=0, T=1, **kw
    ):
        from ggml_hsa_iron.tests.test_flash_attn import _np_type, place
        from ggml_hsa_iron.tests.util_ffn import fast_weights
        from ggml_hsa_iron.tests.util_norm import norm_inputs

        K, H, Hk, D, F, n_kv = dims
        self.dims, self.glu, self.wt, self.kv, self.arch, self.T = dims, glu, wt, kv, arch, T
        step = 256 if n else 0
        self.n = n or n_kv
        kind = kw.get("kind", "")
        req = layer_request(glu, wt, dims, arch, ff=ff, kv=kv, n_kv_step=step, T=T, **kw)
        self.req = parse_request(req)
        self.spec = prepare(self.req)
        nrng = np.random.default_rng(seed)
        self.w = {}
        for name, rows, cols in (("Wq", D * H, K), ("Wk", D * Hk, K), ("Wv", D * Hk, K),
                                 ("Wo", K, D * H), ("Wg", F, K), ("Wu", F, K), ("Wd", K, F)):  # fmt: skip
            self.w[name] = fast_weights(wt, rows, cols, nrng)
        self.x, self.n_attn = norm_inputs(nrng, T, K)
        _, self.n_ffn = norm_inputs(nrng, 1, K)
        # Each token its own position (a unified cache's sequences), not in order.
        self.pos = np.array([pos + 5 * ((3 * t) % T) for t in range(T)], np.int32)
        self.ff = np.array(llama3_ff(D), np.float32) if ff else None
        # Each projection's own input: its bias (qwen2), its head norm's weights (qwen3: Q, K).
        own = {"BIAS": [D * H, D * Hk, D * Hk], "HEAD_NORM": [D, D]}.get(
            kind.removesuffix("_POST_NORM"), []
        )
        lo, hi = (0.2, 2) if kind.startswith("HEAD_NORM") else (-1, 1)
        self.own = [nrng.uniform(lo, hi, m).astype(np.float32) for m in own]
        # gemma's post norms' weights.
        self.post = [norm_inputs(nrng, 1, K)[1] for _ in range(2 * ("POST_NORM" in kind))]
        kt, vt, mt = self.req.inputs[6 + ff + len(own) : 9 + ff + len(own)]
        self.kt, self.vt = kt, vt
        k = nrng.standard_normal((1, Hk, n_kv, D)).astype(_np_type(kv))
        v = nrng.standard_normal((1, Hk, n_kv, D)).astype(_np_type(kv))
        # n: a run-time n_kv of a request whose n_kv (dims') is the largest: the mask is then
        # n values a row, dense (llama.cpp's for n_kv = n), the cache's first n rows are read.
        cols = self.n
        mask = (nrng.standard_normal((1, 1, mt.ne[1], cols)) * 2).astype(np.float16)
        mask[..., ::masked] = -np.inf
        # The tokens' cache rows, consecutive: the first not masked.
        last = self.n - 2 - T
        self.row = last if last % masked else last + 1
        self.k, self.v, self.mask = k[:, :, : self.n].copy(), v[:, :, : self.n].copy(), mask
        k[:, :, ::masked] = np.nan
        v[:, :, ::masked] = np.nan
        m = place(mt, np.zeros((1, 1, mt.ne[1], mt.ne[0]), np.float16))
        m = np.frombuffer(m, np.uint8).copy()
        m[: mask.nbytes] = mask.reshape(-1).view(np.uint8)
        self.cache = [place(kt, k), place(vt, v), m.tobytes()]

    def args(self):
        """Fresh memories in the sequence's order; K rows and V rows are the token's row of the
        cache memories (views: one memory)."""
        from ggml_hsa_iron.tests.util_emu_seq import arg_bytes, buffer_of, new_buffer

        sizes = arg_bytes(self.spec)
        w = {k: buffer_of(b) for k, (b, _) in self.w.items()}
        kc, vc, m = (buffer_of(b) for b in self.cache)
        consts = [buffer_of(self.pos)] + ([buffer_of(self.ff)] if self.ff is not None else [])
        nb1 = self.kt.nb[1]
        kr = kc[self.row * nb1 : (self.row + self.T) * nb1]
        vr = vc[self.row * nb1 : (self.row + self.T) * nb1]
        # out, Q, then (K rows, V rows), a, r1, h (, o, d).
        extra = 2 * bool(self.post)
        outs = [new_buffer(sizes[i - extra]) for i in (-7, -6)] + [kr, vr]
        outs += [new_buffer(sizes[i]) for i in range(-3 - extra, 0)]
        ins = [w["Wq"], w["Wk"], w["Wv"], buffer_of(self.x), buffer_of(self.n_attn), *consts]
        ins += [buffer_of(o) for o in self.own]
        ins += [kc, vc, m, w["Wo"], w["Wg"], w["Wu"], w["Wd"], buffer_of(self.n_ffn)]
        ins += [buffer_of(n) for n in self.post]
        return ins + outs

    def run(self):
        from ggml_hsa_iron.tests.util_emu_seq import run_spec_in_order

        args = self.args()
        run_spec_in_order(self.spec, args, self.n)
        return args

    def lone(self, g, args):
        """The bytes of projection g computed by its lone kernel
        (RMS_NORM_MUL_MAT[_BIAS|_HEAD_NORM]_ROPE(_FF), RMS_NORM_MUL_MAT[_BIAS]) planned on the
        group's shape; a group splitting its heads over rounds on one core of a column whose
        rows of a round are a head (the lone kernel holds its heads whole)."""
        import dataclasses

        from ggml_hsa_iron.tests.util_emu_seq import arg_bytes, new_buffer, run_spec_in_order

        if g.split > 1:
            p = g.plan
            whole = dataclasses.replace(p, columns=1, rows=1, rows_per_tile=p.rope.head)
            g = dataclasses.replace(g, spec=dataclasses.replace(g.spec, plan=whole), split=1)

        j = ("q", "k", "v").index(g.name)
        nc = 2 if self.ff is not None else 1
        ins = [args[j], args[3], args[4]] + (args[5 : 5 + nc] if g.rope else [])
        if g.own_input:
            ins.append(args[5 + nc + j])
        out = new_buffer(arg_bytes(g.spec)[-1])
        run_spec_in_order(g.spec, [*ins, out])
        return out


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class DecodeLayerEmulationTest(unittest.TestCase):
    def check(self, glu, wt, dims, arch, ff=False, kv="f16", seed=0, n=0, T=1, **kw):
        """kw: layer_request's `kind` and `mode` (the rotation's)."""
        from ggml_hsa_iron.tests.test_flash_attn import _np_type, reference
        from ggml_hsa_iron.tests.util_ffn import check_add, check_h

        case = LayerCase(glu, wt, dims, arch, ff=ff, kv=kv, seed=seed, n=n, T=T, **kw)
        args = case.run()
        K, H, Hk, D, F, n_kv = dims
        what = f"{kw} {glu} {wt} {dims} {arch} ff={ff} kv={kv} n={n} T={T}"
        # gemma's post norms: o and d behind the other outputs.
        od = [np.frombuffer(b.tobytes(), np.float32).copy() for b in args[len(args) - 2 :]]
        if case.post:
            args = args[:-2]
        q_arg, kr_arg, vr_arg = args[-6], args[-5], args[-4]
        # The projections: bit for bit the lone kernels' on the same shape.
        for g, got in zip(case.spec.qkv.groups, (q_arg, kr_arg, vr_arg)):
            want = case.lone(g, args)
            self.assertEqual(got.tobytes(), want.tobytes(), f"{g.name.upper()} of {what}")
        # The attention read the cache holding the new rows: numpy on the caches' values with
        # the tokens' rows replaced by what the design wrote.
        kt = _np_type(kv)
        k, v = case.k.copy(), case.v.copy()
        rows = slice(case.row, case.row + T)
        k[0, :, rows] = np.frombuffer(kr_arg.tobytes(), kt).reshape(T, Hk, D).transpose(1, 0, 2)
        v[0, :, rows] = np.frombuffer(vr_arg.tobytes(), kt).reshape(T, Hk, D).transpose(1, 0, 2)
        q = np.frombuffer(q_arg.tobytes(), np.float32).reshape(T, H, D).transpose(1, 0, 2)[None]
        params = case.req.op_params
        fa = types.SimpleNamespace(
            op_params=params[12:15], inputs=(case.spec.fa.q, case.kt, case.vt)
        )
        ref = reference(fa, q, k, v, case.mask).reshape(-1)
        f32 = [np.frombuffer(b.tobytes(), np.float32).copy() for b in (args[-7], *args[-3:])]
        out, a, r1, h = f32
        self.assertTrue(np.isfinite(a).all(), f"a of {what}")
        err = np.abs(a - ref).max()
        self.assertLess(err, 2e-5 * max(1.0, np.abs(ref).max()), f"a of {what}: {err}")
        wo, wg, wu, wd = (case.w[n][1] for n in ("Wo", "Wg", "Wu", "Wd"))
        a, r1, h, out = (t.reshape(T, -1) for t in (a, r1, h, out))
        if not case.post:
            check_add(self, wt, a, wo, case.x, r1, f"r1 of {what}")
            check_h(self, glu, wt, r1, case.n_ffn, wg, wu, h, f"h of {what}")
            check_add(self, wt, h, wd, r1, out, f"out of {what}")
            return
        o, d = (t.reshape(T, -1) for t in od)
        check_add(self, wt, a, wo, np.zeros_like(o), o, f"o of {what}")
        check_post_norm(self, o, case.post[0], case.x, r1, POST_EPS[0], f"r1 of {what}")
        check_h(self, glu, wt, r1, case.n_ffn, wg, wu, h, f"h of {what}")
        check_add(self, wt, h, wd, np.zeros_like(d), d, f"d of {what}")
        check_post_norm(self, d, case.post[1], r1, out, POST_EPS[1], f"out of {what}")

    def test_tiny_llama(self):
        for i, arch in enumerate(("aie2p", "aie2")):
            with self.subTest(arch=arch):
                self.check("SWIGLU", "f32", TINY, arch, seed=i)

    def test_tiny_llama_factors_and_f32_cache(self):
        self.check("GEGLU", "q4_0", TINY, "aie2p", ff=True, seed=5)
        self.check("REGLU", "f32", TINY, "aie2", kv="f32", seed=6)

    def test_llama_3_2_1b(self):
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=10)

    def test_run_time_n_kv(self):
        # One program for n_kv up to 1024 in steps of 256, run at a few of them: the cache's
        # rows past n_kv (NaN) and the mask row's end are never read.
        dims = TINY[:5] + (1024,)
        for arch, n in (("aie2p", 256), ("aie2p", 768), ("aie2", 512), ("aie2", 1024)):
            with self.subTest(arch=arch, n=n):
                self.check("SWIGLU", "q4_0", dims, arch, seed=n, n=n)

    def test_a_few_tokens_at_once(self):
        """A step of several tokens (a unified cache's sequences, a draft's verification): the
        1B shape over 4 tokens, the tiny llama's shape in q8_0 over 2 with the factors on aie2,
        and 8 tokens told n_kv at dispatch."""
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=60, T=4)
        tiny = (256, 4, 2, 64, 512, 256)
        self.check("GEGLU", "q8_0", tiny, "aie2", ff=True, seed=61, T=2)
        self.check("SWIGLU", "q4_0", tiny[:5] + (1024,), "aie2p", seed=62, n=512, T=8)
        # Three tokens: the attention's objects of 24 K rows carry 16 keys each.
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=63, T=3)
        # Eight at the 1B shape: the rotation's arrays in the attention's q rows.
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=64, T=8)

    def test_qwen_layers(self):
        """qwen2's layer (Q, K and V biases) and qwen3's (Q's and K's head norms), NeoX
        rotations as theirs: each projection bit for bit its lone RMS_NORM_MUL_MAT_BIAS(_ROPE)
        or RMS_NORM_MUL_MAT_HEAD_NORM_ROPE kernel on the group's shape (where the group splits
        its heads over rounds, on one core holding a head a round); several tokens; the real
        shapes, whose heads of 128 rows each core takes in two rounds of 64 or four of 32."""
        # A share of the cases a run (tests/sample.py), every one over the rotation.
        cases = [
            (("SWIGLU", "q4_0", TINY, "aie2p"), dict(seed=70, kind="BIAS", mode=2)),
            (("SWIGLU", "q4_0", TINY, "aie2"), dict(seed=71, kind="BIAS", kv="f32", mode=2)),
            (("SWIGLU", "q8_0", TINY, "aie2"), dict(seed=72, kind="BIAS", T=3, mode=2)),
            (("SWIGLU", "q4_0", TINY, "aie2p"), dict(seed=73, kind="HEAD_NORM", mode=2)),
            (("GEGLU", "q8_0", TINY, "aie2"), dict(seed=74, kind="HEAD_NORM", kv="f32", T=2)),
            (("SWIGLU", "q4_0", QWEN2_5_1_5B, "aie2"), dict(seed=75, kind="BIAS", mode=2)),
            (("SWIGLU", "q4_0", QWEN2_5_1_5B, "aie2p"), dict(seed=78, kind="BIAS", mode=2)),
            (("SWIGLU", "q4_0", QWEN3_0_6B, "aie2p"), dict(seed=76, kind="HEAD_NORM", mode=2)),
        ]
        for args, kw in sample.pick(cases):
            with self.subTest(args=args[1:], **kw):
                self.check(*args, **kw)

    def test_gemma_layers(self):
        """gemma2's layer (the norms after the attention's projection and after the block, a
        softcap on the scores) and gemma3's (with qwen3's head norms), NeoX rotations and
        GEGLU as theirs: o, r1, h, d and out against numpy; the tiny shapes on both archs and
        Gemma 3 1B's on aie2p, one token and several."""
        cases = [
            (("GEGLU", "q4_0", TINY, "aie2p"), dict(seed=80, kind="POST_NORM", softcap=50.0)),
            (("GEGLU", "q8_0", TINY, "aie2"), dict(seed=81, kind="POST_NORM", kv="f32")),
            (("GEGLU", "q4_0", TINY, "aie2"), dict(seed=82, kind="HEAD_NORM_POST_NORM")),
            (("GEGLU", "q8_0", TINY, "aie2p"), dict(seed=83, kind="HEAD_NORM_POST_NORM")),
            (("GEGLU", "q4_0", GEMMA3_1B, "aie2p"), dict(seed=84, kind="HEAD_NORM_POST_NORM")),
            # Several tokens: each norm-add object a run per token.
            (("GEGLU", "q4_0", TINY, "aie2p"), dict(seed=85, kind="POST_NORM", T=3)),
            (("GEGLU", "q8_0", TINY, "aie2"), dict(seed=86, kind="HEAD_NORM_POST_NORM", T=2)),
        ]
        for args, kw in sample.pick(cases):
            with self.subTest(args=args[1:], **kw):
                self.check(*args, mode=2, **kw)

    def test_neox_heads_split_over_rounds(self):
        # phi3's NeoX rotation, its pairs half a head apart: the tiny model's cores take their
        # heads in four rounds of 16 rows.
        spec = layer_spec("SWIGLU", "q4_0", TINY, mode=2)
        self.assertEqual([g.split for g in spec.qkv.groups], [4, 4, 1])
        self.check("SWIGLU", "q4_0", TINY, "aie2p", seed=77, mode=2)

    def test_run_time_n_kv_in_chunks(self):
        # A 16384-row cache whose scores take chunks of keys (nc of them for every n_kv: each
        # n_kv / nc keys), run at a short and at the longest n_kv.
        dims = TINY[:5] + (16384,)
        for arch, n in (("aie2p", 768), ("aie2", 16384)):
            with self.subTest(arch=arch, n=n):
                spec = layer_spec("SWIGLU", "q4_0", dims, arch, n_kv_step=256)
                self.assertGreater(spec.fa.nc, 1)
                self.check("SWIGLU", "q4_0", dims, arch, seed=n, n=n)


if __name__ == "__main__":
    unittest.main()
