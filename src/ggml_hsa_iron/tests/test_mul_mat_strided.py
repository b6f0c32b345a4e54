"""MUL_MAT (and MUL_MAT_<glu>) with strided operands, through the GEMV.

Operands are sent as laid out in memory (ne, byte strides nb): llama.cpp's attention
products (KQ = K-cache view x permuted q, KQV = transposed V-cache view x kq) and
test-backend-ops' permuted and viewed MUL_MATs. Rows (dimension 0) must be dense; the GEMV's
taps walk nb[1] (W rows), nb[2], nb[3] (per product, src0 broadcast as ggml does) and the
src1 and dst rows' offsets.

* the tap walks in pure Python: every core gets, per round, its W rows from the right batch
  over all of K in order, the right src1 row and writes the right dst row; per product every
  W unit (element, or byte for f16/quantized weights) of the batch's rows is read, and
  nothing else (each exactly once when N is on the grid);
* end to end (tests/util_emu.py) on real data against numpy: the gaps of every strided
  buffer are 0xFF (f32/f16 NaN), so a read outside the view poisons the result, and a dst
  with padded rows keeps its 0xFF padding;
* the refusals (UnsupportedError: exit 2, the backend runs the node on the CPU).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import random
import unittest
from collections import Counter

from ggml_hsa_iron import registry
from ggml_hsa_iron.capabilities import capabilities
from ggml_hsa_iron.dtypes import DTYPES, QUANT_TYPES
from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import BYTE_WEIGHTS, extent, prepare
from ggml_hsa_iron.request import Tensor, parse_request
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_json, tensor

try:
    import numpy as np
    from ml_dtypes import bfloat16

    from ggml_hsa_iron.tests.test_mul_mat_glu import _check_glu, _weights
    from ggml_hsa_iron.tests.util_emu import run_request

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False


def view(dtype, ne, nb):
    return Tensor(dtype, tuple(ne), tuple(nb))


def permuted(dtype, ne, per):
    """ggml_permute(new_tensor(ne[per[0]], ..., ne[per[3]]), *per), as test-backend-ops builds
    its permuted MUL_MAT operands: the result has shape `ne`, strides permuted."""
    src = Tensor.dense(dtype, tuple(ne[p] for p in per))
    nb = [0] * 4
    for i, p in enumerate(per):
        nb[p] = src.nb[i]
    return view(dtype, ne, nb)


def kv_views(D, n_kv, n_head_kv, n_ctx, n_tokens, n_head):
    """llama.cpp's attention operands: k (f16 K-cache view [D, n_kv, n_head_kv], cache rows of
    n_head_kv * D, heads interleaved in a row), q (f32 [D, n_tokens, n_head] permuted from
    [D, n_head, n_tokens]), v (the transposed V cache [n_kv, D, n_head_kv], rows of n_ctx)."""
    row = n_head_kv * D * 2
    k = view("f16", (D, n_kv, n_head_kv, 1), (2, row, D * 2, n_ctx * row))
    q = permuted("f32", (D, n_tokens, n_head, 1), (0, 2, 1, 3))
    v = view("f16", (n_kv, D, n_head_kv, 1), (2, n_ctx * 2, D * n_ctx * 2, D * n_ctx * 2 * 2))
    return k, q, v


def mm_spec(src0, src1, dst=None, arch="aie2p", op="MUL_MAT"):
    if dst is None:
        dst = tensor("f32", [src0.ne[1], src1.ne[1], src1.ne[2], src1.ne[3]])
    ins = [src0, src1] if op == "MUL_MAT" else [src0, src0, src1]
    return prepare(parse_request(request_json(op, ins, dst, arch)))


# ------------------------------------------------------------------------- the walks


def _coords(t: Tensor, w_bytes: bool):
    """{unit offset: (flat batch i3 * ne2 + i2, row i1, unit in the row)} of a (strided)
    tensor; units are bytes when `w_bytes`, else elements."""
    ne, nb = t.ne, t.nb
    unit = 1 if w_bytes else t.size
    row_units = ne[0] // t.block * t.size if w_bytes else ne[0]
    out = {}
    for i3 in range(ne[3]):
        for i2 in range(ne[2]):
            for i1 in range(ne[1]):
                base = (i1 * nb[1] + i2 * nb[2] + i3 * nb[3]) // unit
                for u in range(row_units):
                    assert base + u not in out, "overlapping rows"
                    out[base + u] = (i3 * ne[2] + i2, i1, u)
    return out


def streams(spec):
    """Per product, {core: {"w", "x", "y"}} (per object, the operand units each element is,
    W's in W units) of what every core receives, from `spec.tasks()` as the design issues
    them (GLU: the gate half, then the up half of every round, same taps)."""
    p = spec.plan
    R, nr, kc, steps = p.rows, p.rows_per_tile, p.k_chunk, p.k_steps
    kcw = p.w_units(kc)
    groups = spec.tasks()
    per = len(groups) // len(spec.products)
    out = []

    def objects(indices, size):
        assert len(indices) % size == 0
        return [indices[i : i + size] for i in range(0, len(indices), size)]

    for n in range(len(spec.products)):
        cores = {(c, i): {"w": [], "x": [], "y": []} for c in range(p.columns) for i in range(R)}
        for group in groups[n * per : (n + 1) * per]:
            for col, (w, x, y) in enumerate(group):
                ws = w if p.glu else (w,)
                xs = objects(x.indices(), kc)
                ys = objects(y.indices(), R * nr)
                # GLU: each tap issued on W_g, then on W_u (the same units of each).
                wobj = [
                    o
                    for t in ws
                    for _ in range(2 if p.glu else 1)
                    for o in objects(t.indices(), R * nr * kcw)
                ]
                for i in range(R):
                    core = cores[(col, i)]
                    core["w"] += [o[i * nr * kcw : (i + 1) * nr * kcw] for o in wobj]
                    core["x"] += xs
                    core["y"] += [o[i * nr : (i + 1) * nr] for o in ys]
                assert len(xs) == len(wobj) == len(ys) * steps * (2 if p.glu else 1)
        out.append(cores)
    return out


def check_walks(test, spec):
    """Every core computes dst[b, i, j] from row i of src1's batch b and row j of src0's
    batch (ggml's broadcast) over all of K in order; per product every W unit of the batch's
    rows is read and nothing else; every dst element is written."""
    p = spec.plan
    src0, src1, dst = spec.src0, spec.src1, spec.dst
    wb = spec.weight_bytes
    wmap, xmap, ymap = _coords(src0, wb), _coords(src1, False), _coords(dst, False)
    r2, r3 = src1.ne[2] // src0.ne[2], src1.ne[3] // src0.ne[3]

    def batch0(b):
        i13, i12 = divmod(b, src1.ne[2])
        return (i13 // r3) * src0.ne[2] + i12 // r2

    nr, kc, steps = p.rows_per_tile, p.k_chunk, p.k_steps
    kcw = p.w_units(kc)
    halves = 2 if p.glu else 1
    written = set()
    for n, cores in enumerate(streams(spec)):
        reads = Counter()
        bd = i = None
        for core in cores.values():
            reads.update(u for o in core["w"] for u in o)
            for t, dest in enumerate(core["y"]):
                pos = [ymap[d] for d in dest]
                written.update(dest)
                for h in range(halves):
                    for st in range(steps):
                        obj = (t * halves + h) * steps + st
                        w, x = core["w"][obj], core["x"][obj]
                        test.assertEqual(len({q[:2] for q in pos}), 1)
                        want = [pos[0][:2] + (st * kc + kk,) for kk in range(kc)]
                        test.assertEqual([xmap[u] for u in x], want)
                        for lr in range(nr):
                            b, _, j = pos[lr]
                            got = [wmap[u] for u in w[lr * kcw : (lr + 1) * kcw]]
                            want = [(batch0(b), j, st * kcw + kk) for kk in range(kcw)]
                            test.assertEqual(got, want)
                bd, i = pos[0][:2]
        # Every unit of the product's W batch, nothing else; once each on the grid.
        need = {u for u, (b, _, _) in wmap.items() if b == batch0(bd)}
        test.assertEqual(set(reads), need, f"product {n}")
        row = p.w_units(p.K)
        test.assertEqual(sum(reads.values()), halves * p.rounds * p.block * row)
        if p.N % p.block == 0:
            test.assertEqual(set(reads.values()), {halves})
    test.assertEqual(written, set(ymap))
    # Every tap stays inside its runtime-sequence argument.
    totals = [count for _, count in spec.sequence]
    for group in spec.tasks():
        for w, x, y in group:
            for t in w if p.glu else (w,):
                test.assertLess(max(t.indices()), totals[0])
            test.assertLess(max(x.indices()), totals[-2])
            test.assertLess(max(y.indices()), totals[-1])


def _backend_ops_cases():
    """test-backend-ops' MUL_MAT with permuted operands (m=16, k=256, bs [2, 3], nr [1, 1] or
    [2, 1]) and a k_v view (rows of 256 out of 320)."""
    out = []
    for ty in ("f32", "q4_0", "f16"):
        for per in ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)):
            for n, nr2 in ((1, 1), (3, 2)):
                a = permuted(ty, (256, 16, 2, 3), per)
                b = permuted("f32", (256, n, 2 * nr2, 3), per)
                out.append((f"{ty} per={per} n={n} nr2={nr2}", a, b))
        big = Tensor.dense(ty, (320, 16, 2, 1))
        a = view(ty, (256, 16, 2, 1), big.nb)
        out.append((f"{ty} k_v=320", a, tensor("f32", [256, 2, 2])))
    return out


def _backend_ops_all():
    """test-backend-ops' strided MUL_MAT cases (its test_mul_mat with `per` or `k_v`, for the
    weight types the backend sends, src1 f32): (case, src0, src1)."""

    def case(ta, m, n, k, bs, nr, per=(0, 1, 2, 3), k_v=0):
        ne_a, ne_b = (k, m, bs[0], bs[1]), (k, n, bs[0] * nr[0], bs[1] * nr[1])
        if per != (0, 1, 2, 3):
            return permuted(ta, ne_a, per), permuted("f32", ne_b, per)
        a, b = Tensor.dense(ta, (k_v,) + ne_a[1:]), Tensor.dense("f32", (k_v,) + ne_b[1:])
        return view(ta, ne_a, a.nb), view("f32", ne_b, b.nb)

    cases = []
    for ta in ("f32", "f16", "bf16", *QUANT_TYPES):
        for k in (256, 4) if DTYPES[ta].block == 1 else (256,):
            for n in (1, 8, 16):
                for per in ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)):
                    cases.append((ta, 16, n, k, (2, 3), (1, 1), per))
    for k in (193, 67):
        cases.append(("f16", 1056, 1, k, (1, 1), (4, 1), (0, 2, 1, 3)))
    cases.append(("f32", 16, 32, 32, (1, 1), (1, 1), (0, 1, 2, 3), 64))
    for bs2 in (1, 3):
        for bs in (1, 2, 4, 8):
            for nr in (1, 4):
                for m in (0, 1):
                    for k in (0, 1):
                        for t in ("f16", "bf16", "f32"):
                            cases.append(
                                (t, 1056 + m, 1, 128 + k, (bs, bs2), (nr, 1), (0, 2, 1, 3))
                            )
                            cases.append(
                                (
                                    t,
                                    128 + m,
                                    1,
                                    1056 + k,
                                    (bs, bs2),
                                    (nr, 1),
                                    (0, 1, 2, 3),
                                    2112 + k,
                                )
                            )
    return [(c, *case(*c)) for c in cases]


class StridedPlanTest(unittest.TestCase):
    def test_every_backend_ops_case_plans_or_exits_2(self):
        # Declared noncontiguous: every strided case the backend can send plans, or is
        # refused with UnsupportedError (exit 2), nothing else.
        planned = refused = 0
        for c, a, b in _backend_ops_all():
            if a.is_dense() and b.is_dense():
                continue
            with self.subTest(c):
                try:
                    spec = mm_spec(a, b)
                except UnsupportedError:
                    refused += 1
                    # Only rows off 32-bit words: odd f16/bf16 K, 210-byte q6_K rows.
                    self.assertTrue(a.dtype == "q6_K" or a.ne[0] % 2, c)
                    continue
                planned += 1
                self.assertTrue(spec.gemv)
                if a.ne[1] * b.ne[1] * b.ne[2] * b.ne[3] <= 256:
                    check_walks(self, spec)
        self.assertGreater(planned, 300)
        self.assertLess(refused, 150)

    def test_attention_views(self):
        for arch in ("aie2", "aie2p"):
            for n_tokens in (1, 3):
                k, q, v = kv_views(64, 256, 2, 300, n_tokens, 4)
                kq = tensor("f32", [256, n_tokens, 4])
                for what, a, b in (("KQ", k, q), ("KQV", v, kq)):
                    with self.subTest(arch=arch, n_tokens=n_tokens, op=what):
                        spec = mm_spec(a, b, arch=arch)
                        self.assertTrue(spec.gemv and spec.weight_bytes)
                        self.assertEqual(spec.sequence[0], ("i8", extent(a)))
                        check_walks(self, spec)

    def test_backend_ops_permutations_and_views(self):
        for what, a, b in _backend_ops_cases():
            for arch in ("aie2", "aie2p"):
                with self.subTest(what, arch=arch):
                    spec = mm_spec(a, b, arch=arch)
                    self.assertTrue(spec.gemv)  # strided: never the GEMM
                    self.assertEqual(spec.weight_bytes, a.dtype in BYTE_WEIGHTS)
                    check_walks(self, spec)

    def test_padded_dst_rows_and_glu(self):
        # dst rows dense, row stride padded; MUL_MAT_<glu> with strided (viewed) weights.
        a = view("f32", (48, 37, 1, 1), (4, 64 * 4, 37 * 64 * 4, 37 * 64 * 4))
        b = permuted("f32", (48, 3, 2, 1), (0, 2, 1, 3))
        d = view("f32", (37, 3, 2, 1), (4, 40 * 4, 3 * 40 * 4, 6 * 40 * 4))
        check_walks(self, mm_spec(a, b, d))
        q = view("q8_0", (256, 40, 1, 1), (34, 10 * 34, 40 * 10 * 34, 40 * 10 * 34))
        bq = permuted("f32", (256, 3, 2, 1), (0, 2, 1, 3))
        for w, x in ((a, b), (q, bq)):
            for arch in ("aie2", "aie2p"):
                with self.subTest(w=w.dtype, arch=arch):
                    spec = mm_spec(w, x, arch=arch, op="MUL_MAT_SWIGLU")
                    self.assertTrue(spec.plan.glu)
                    check_walks(self, spec)

    def test_rounds_beyond_a_dma_stride_go_one_per_task(self):
        # A K-cache view whose rows are 2^17 bytes apart: 64 rows per round are 2^23 bytes,
        # beyond a stride's 2^20 words: one round per task. The design records within every
        # hardware limit.
        from ggml_hsa_iron.emu.compile import record

        k = view("f16", (64, 4096, 1, 1), (2, 1 << 17, 128, 4096 << 17))
        spec = mm_spec(k, tensor("f32", [64, 1]))
        self.assertGreater(spec.plan.rounds, 1)
        self.assertTrue(all(n == 1 for _, n in spec.plan.round_tasks()))
        record(spec)
        k, q, v = kv_views(128, 4096, 8, 4096, 1, 32)
        for a, b in ((k, q), (v, tensor("f32", [4096, 1, 32]))):
            record(mm_spec(a, b, arch="aie2"))

    def test_refusals(self):
        x = tensor("f32", [64, 1])
        refused = {
            # A transposed weight: rows not dense.
            "transposed src0": (view("f32", (64, 32, 1, 1), (32 * 4, 4, 64 * 32 * 4, 0)), x),
            "transposed f16 src0": (view("f16", (64, 32, 1, 1), (64, 2, 64 * 64, 0)), x),
            "transposed src1": (tensor("f32", [64, 32]), view("f32", (64, 2, 1, 1), (8, 4, 0, 0))),
            # bf16 rows 33 words + 1 element apart: not on 32-bit words.
            "bf16 odd stride": (view("bf16", (64, 32, 1, 1), (2, 130, 32 * 130, 0)), x),
            # f16 rows 65 elements apart: W's byte taps are not word aligned.
            "f16 odd stride": (view("f16", (64, 32, 1, 1), (2, 130, 32 * 130, 0)), x),
            # q4_0 rows 2 blocks + 18 bytes apart (a row of 2 blocks): offsets off words.
            "q4_0 stride": (view("q4_0", (64, 32, 1, 1), (18, 54, 32 * 54, 0)), x),
            # A row stride beyond the DMA's 2^20 words.
            "huge stride": (view("f32", (64, 4, 1, 1), (4, 5 << 20, 20 << 20, 0)), x),
            # src0 one row repeated (nb[1] = 0), dst rows overlapping.
            "repeated row": (view("f32", (64, 8, 1, 1), (4, 0, 256, 256)), x),
            # bf16 x with an odd row stride.
            "bf16 src1": (
                tensor("bf16", [64, 32]),
                view("bf16", (64, 2, 1, 1), (2, 130, 260, 260)),
            ),
        }
        for what, (a, b) in refused.items():
            with self.subTest(what):
                with self.assertRaises(UnsupportedError):
                    mm_spec(a, b)
        with self.assertRaisesRegex(UnsupportedError, "overlap"):
            a, b = tensor("f32", [64, 32]), tensor("f32", [64, 2])
            mm_spec(a, b, view("f32", (32, 2, 1, 1), (4, 64, 128, 128)))
        # Strided: more products than DMA tasks on a channel (no GEMM fallback for views).
        k = view("f16", (64, 4096, 1, 1), (2, 256, 128, 0))
        with self.assertRaisesRegex(UnsupportedError, "1024"):
            mm_spec(k, tensor("f32", [64, 1100]))
        # The fused GLU refuses the same.
        with self.assertRaises(UnsupportedError):
            mm_spec(refused["transposed src0"][0], x, op="MUL_MAT_GEGLU")

    def test_declared_noncontiguous(self):
        ops = {o["op"]: o for o in capabilities()["ops"]}
        for op in ("MUL_MAT", *(s.op for s in registry.OPS if s.kind == "mul_mat_glu")):
            self.assertTrue(ops[op]["noncontiguous"], op)


# ------------------------------------------------------------------------- end to end


def _fill(t: Tensor, rows, what_bytes):
    """The bytes of a (strided) tensor: row (i1, i2, i3) from `rows`, everything else 0xFF."""
    buf = bytearray(b"\xff" * extent(t))
    ne, nb = t.ne, t.nb
    for i3 in range(ne[3]):
        for i2 in range(ne[2]):
            for i1 in range(ne[1]):
                off = i1 * nb[1] + i2 * nb[2] + i3 * nb[3]
                b = what_bytes(rows[i3, i2, i1])
                buf[off : off + len(b)] = b
    return bytes(buf)


def _bf16(a):
    return np.asarray(a, dtype=np.float32).astype(bfloat16).astype(np.float64)


def _random_rows(t: Tensor, rng):
    """(bytes of t, its rows' values as the kernel multiplies them [ne3, ne2, ne1, K]; block
    types as the decoder forms them)."""
    ne = t.ne
    K = ne[0]
    if t.dtype == "f32":
        vals = np.asarray(
            [rng.uniform(-1, 1) for _ in range(K * ne[1] * ne[2] * ne[3])], np.float32
        ).reshape(ne[3], ne[2], ne[1], K)
        return _fill(t, vals, lambda r: r.tobytes()), vals.astype(np.float64)
    if t.dtype == "f16":
        vals = np.asarray(
            [rng.uniform(-2, 2) for _ in range(K * ne[1] * ne[2] * ne[3])], np.float16
        ).reshape(ne[3], ne[2], ne[1], K)
        # The decoding GEMV rounds the weights to bf16.
        return _fill(t, vals, lambda r: r.tobytes()), _bf16(vals.astype(np.float32))
    rows = np.empty((ne[3], ne[2], ne[1]), dtype=object)
    vals = np.empty((ne[3], ne[2], ne[1], K))
    for idx in np.ndindex(rows.shape):
        rows[idx], vals[idx] = _weights(t.dtype, 1, K, rng)
    return _fill(t, rows, lambda r: r), vals


def _reference(a, b, av, bv, weight_bytes):
    """dst [ne13, ne12, M, N] and its summation error bound (src0 broadcast as ggml does)."""
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    xv = _bf16(bv) if weight_bytes else bv
    want = np.empty((b.ne[3], b.ne[2], b.ne[1], a.ne[1]))
    err = np.empty_like(want)
    for i3 in range(b.ne[3]):
        for i2 in range(b.ne[2]):
            w = av[i3 // r3, i2 // r2]  # [N, K]
            prod = xv[i3, i2][:, None, :] * w[None, :, :]  # [M, N, K]
            want[i3, i2] = prod.sum(axis=2)
            err[i3, i2] = np.abs(prod).sum(axis=2) * 2.0**-20 + 1e-30
    return want, err


def _gather(t: Tensor, data: bytes):
    """dst's values [ne3, ne2, ne1, ne0] read through its strides."""
    buf = np.frombuffer(data, np.uint8)
    out = np.empty((t.ne[3], t.ne[2], t.ne[1], t.ne[0]))
    for i3, i2, i1 in np.ndindex(t.ne[3], t.ne[2], t.ne[1]):
        off = i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3]
        out[i3, i2, i1] = np.frombuffer(buf[off : off + 4 * t.ne[0]].tobytes(), np.float32)
    return out


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class StridedEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu` and its recorded program run on real data."""

    def check(self, a, b, d=None, arch="aie2p", seed=0, op="MUL_MAT"):
        rng = random.Random(seed)
        if d is None:
            d = tensor("f32", [a.ne[1], b.ne[1], b.ne[2], b.ne[3]])
        a_bytes, av = _random_rows(a, rng)
        b_bytes, bv = _random_rows(b, rng)
        ins = [a, b] if op == "MUL_MAT" else [a, a, b]
        data = [a_bytes, b_bytes] if op == "MUL_MAT" else [a_bytes, a_bytes, b_bytes]
        got_bytes = run_request(request_json(op, ins, d, arch), data)
        self.assertEqual(len(got_bytes), extent(d))
        got = _gather(d, got_bytes)
        want, err = _reference(a, b, av, bv, a.dtype in BYTE_WEIGHTS)
        what = f"{op} {a.dtype} {list(a.nb)} x {list(b.nb)} on {arch}"
        if op == "MUL_MAT":
            bad = ~(np.abs(got - want) <= err + 2e-6 * np.abs(want))
            if bad.any():
                self.fail(
                    f"{what}: {int(bad.sum())} of {got.size} wrong, first at "
                    f"{np.argwhere(bad)[0]}: {got[bad][0]} vs {want[bad][0]}"
                )
        else:  # gate and up are the same matrix here: act(g) * g
            _check_glu(self, op[len("MUL_MAT_") :], got, want, want, err, err, what)
        # The dst's gaps (padded rows) are never written.
        written = np.zeros(len(got_bytes), bool)
        for i3, i2, i1 in np.ndindex(d.ne[3], d.ne[2], d.ne[1]):
            off = i1 * d.nb[1] + i2 * d.nb[2] + i3 * d.nb[3]
            written[off : off + 4 * d.ne[0]] = True
        gaps = np.frombuffer(got_bytes, np.uint8)[~written]
        self.assertTrue((gaps == 0xFF).all(), f"{what}: a dst gap was written")

    def test_attention_kq_and_kqv(self):
        # GQA: 4 heads over 2 KV heads, D 64, 256 cached positions of a 300-row cache.
        for n_tokens, arch in ((1, "aie2p"), (3, "aie2")):
            k, q, v = kv_views(64, 256, 2, 300, n_tokens, 4)
            with self.subTest(n_tokens=n_tokens, op="KQ"):
                self.check(k, q, arch=arch, seed=n_tokens)
            with self.subTest(n_tokens=n_tokens, op="KQV"):
                self.check(v, tensor("f32", [256, n_tokens, 4]), arch=arch, seed=10 + n_tokens)

    def test_backend_ops_permutations_and_views(self):
        cases = _backend_ops_cases()
        for n, (what, a, b) in enumerate(cases):
            if a.dtype == "f16" and "per" in what:
                continue  # f16 is covered by the attention views
            with self.subTest(what):
                self.check(a, b, arch=("aie2", "aie2p")[n % 2], seed=100 + n)

    def test_padded_dst_and_glu(self):
        a = view("f32", (48, 37, 1, 1), (4, 64 * 4, 37 * 64 * 4, 37 * 64 * 4))
        b = permuted("f32", (48, 3, 2, 1), (0, 2, 1, 3))
        d = view("f32", (37, 3, 2, 1), (4, 40 * 4, 3 * 40 * 4, 6 * 40 * 4))
        self.check(a, b, d, seed=200)
        q = view("q8_0", (256, 40, 1, 1), (34, 10 * 34, 40 * 10 * 34, 40 * 10 * 34))
        bq = permuted("f32", (256, 3, 2, 1), (0, 2, 1, 3))
        self.check(q, bq, arch="aie2", seed=201, op="MUL_MAT_SWIGLU")
        self.check(a, b, seed=202, op="MUL_MAT_GEGLU")


if __name__ == "__main__":
    unittest.main()
