"""MUL_MAT_ADD: W . x + r (the backend's fusion of a MUL_MAT and the ADD of its product).

* the plan: every core gets, per round, its W rows over all of K in order, the x row's K
  chunks, then one object holding its column's r values (r's row for the product, repeated
  over the product as ggml's ADD repeats it) and padding from x; each dst element is written
  once (whole rounds: an ADD in place into r stays correct); the shim descriptors per task
  group and the tasks per channel; the refusals;
* the DMA limits of large decode and prefill shapes, recorded against the emulation's stand-in;
* end to end: the design compiled for `--target emu` and its recorded program run on real data
  (tests/util_emu.py) against numpy, for f32, f16, q4_0, q8_0 and q4_K weights, one and a few
  src1 rows, r of the product's shape and one bias row broadcast, a strided r and batches,
  aie2p and aie2.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import random
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import Tensor, parse_request
from ggml_hsa_iron.tiling import MAX_TASKS_PER_CHANNEL, SHIM_GROUP_TASKS

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests.util_matmul import check_structure

try:
    import numpy as np

    from ggml_hsa_iron.tests.test_mul_mat_glu import _bf16, _weights
    from ggml_hsa_iron.tests.util_emu import run_request

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False


def add_request(wtype, M, N, K, arch="aie2p", r_ne=None, b2=1, r2=1, r=None, **kw):
    """W [K, N, b2] . x [K, M, b2*r2] + r; r dense of `r_ne` (default: the product's shape)
    unless given."""
    B = b2 * r2
    w, x = tensor(wtype, [K, N, b2]), tensor("f32", [K, M, B])
    if r is None:
        r = tensor("f32", r_ne or [N, M, B])
    return request_json("MUL_MAT_ADD", [w, x, r], tensor("f32", [N, M, B]), arch, **kw)


def add_spec(*args, **kw):
    return prepare(parse_request(add_request(*args, **kw)))


def add_streams(spec):
    """{core: {"w", "x", "y", "r"}}: what every core receives from the runtime sequence
    `spec.tasks()` the design issues (util_matmul.gemv_streams' reading of the DMAs), the x
    channel's r objects apart: per round the r indices the core adds (its nr values of the
    object at offset i*nr). Checks the x channel's order: per round K/kc x chunks, then one
    object of the column's r values followed by x's padding."""
    p = spec.plan
    R, nr, kc, steps = p.rows, p.rows_per_tile, p.k_chunk, p.k_steps
    kw = p.w_units(kc)  # a W row's chunk: elements, or bytes of whole blocks
    cores = {
        (c, i): {"w": [], "x": [], "y": [], "r": []} for c in range(p.columns) for i in range(R)
    }

    def objects(indices, size):
        assert len(indices) % size == 0
        return [indices[i : i + size] for i in range(0, len(indices), size)]

    for group in spec.tasks():
        for col, (w, x, y, rs, pad) in enumerate(group):
            wobj = objects(w.indices(), R * nr * kw)
            ys = objects(y.indices(), R * nr)
            assert len(wobj) == steps * len(rs) and len(ys) == len(rs)
            xs = objects(x.indices(), kc)
            assert len(xs) == steps
            for t, r in enumerate(rs):
                # The round's r object: R*nr values of r, then the padding (x's values).
                r_obj = r.indices() + (pad.indices() if pad is not None else [])
                assert len(r_obj) == kc and len(r.indices()) == R * nr
                for i in range(R):
                    core = cores[(col, i)]
                    tiles = wobj[t * steps : (t + 1) * steps]
                    core["w"] += [o[i * nr * kw : (i + 1) * nr * kw] for o in tiles]
                    core["x"] += xs
                    core["y"].append(ys[t][i * nr : (i + 1) * nr])
                    core["r"].append(r_obj[i * nr : (i + 1) * nr])
    return cores


def _check_r(test, spec, cores):
    """Every core adds to dst[b, i, j] the value r[i % rn1, b % rn2 ..., j]."""
    r = spec.r
    N, M, B2 = spec.dst.ne[0], spec.dst.ne[1], spec.dst.ne[2]
    span = spec.sequence[2][1]
    for core in cores.values():
        for dest, rr in zip(core["y"], core["r"]):
            for d, ri in zip(dest, rr):
                j, i1, rest = d % N, (d // N) % M, d // (N * M)
                i2, i3 = rest % B2, rest // B2
                idx = (j, i1 % r.ne[1], i2 % r.ne[2], i3 % r.ne[3])
                want = sum(a * b for a, b in zip(idx, r.nb)) // 4
                test.assertTrue(0 <= ri < span)
                test.assertEqual(ri, want, (d, idx))


class AddPlanTest(unittest.TestCase):
    def test_every_core_adds_its_rows_of_r_once(self):
        shapes = [
            ("f32", 1, 32, 256, None, 1, 1),  # test-backend-ops' decode with a bias
            ("f32", 3, 96, 48, [96, 1], 1, 1),  # a bias row over 3 rows
            ("f32", 1, 37, 64, None, 1, 1),  # N prime: one row per round on one core
            ("bf16", 2, 4096, 512, None, 1, 1),  # many rounds: several task groups
            ("q4_0", 2, 64, 256, [64, 1, 2], 2, 2),  # batches, r broadcast over rows
            ("q4_K", 1, 256, 512, [256, 1, 1], 1, 4),  # one bias for every batch
        ]
        for arch in ("aie2", "aie2p"):
            for w, M, N, K, r_ne, b2, r2 in shapes:
                with self.subTest(arch=arch, w=w, M=M, N=N, K=K, r=r_ne):
                    spec = add_spec(w, M, N, K, arch, r_ne, b2, r2)
                    self.assertTrue(spec.gemv and spec.plan.add)
                    self.assertEqual(N % spec.plan.block, 0)
                    cores = add_streams(spec)
                    if w in ("f32", "bf16"):
                        writes = check_structure(spec, cores)
                        self.assertEqual(writes, spec.dst.nelements)  # each written once
                    _check_r(self, spec, cores)

    def test_tasks_fit_the_shim_descriptors_and_channels(self):
        for arch in ("aie2", "aie2p"):
            for ty, M, N, K in (("f32", 1, 4096, 256), ("q4_0", 3, 2048, 512), ("q8_0", 1, 64, 32)):
                with self.subTest(arch=arch, ty=ty, N=N, K=K):
                    spec = add_spec(ty, M, N, K, arch)
                    p = spec.plan
                    x_tasks = 0
                    for group in spec.tasks():
                        self.assertEqual(len(group), p.columns)
                        for w, x, _y, rs, pad in group:
                            # W, y, and per round x, r and the padding.
                            per_round = 2 + (pad is not None)
                            self.assertLessEqual(2 + per_round * len(rs), SHIM_GROUP_TASKS)
                            self.assertEqual(w.sizes[0], len(rs))
                            self.assertEqual(x.sizes[0], 1)
                        x_tasks += per_round * len(group[0][3])
                    self.assertEqual(x_tasks, p.w_tasks(len(spec.products)))
                    self.assertLessEqual(x_tasks, MAX_TASKS_PER_CHANNEL)
                    self.assertEqual(
                        [t for t, _ in spec.sequence],
                        ["i8" if ty[0] == "q" else ty, "f32", "f32", "f32"],
                    )

    def test_defines_and_sources(self):
        s = add_spec("f32", 1, 64, 256)
        self.assertEqual((s.core.source, s.core.defines["MV_ADD"]), ("mv.cc", 1))
        self.assertNotIn("MV_GLU", s.core.defines)
        q = add_spec("q4_K", 2, 64, 256)
        self.assertEqual((q.core.source, q.core.defines["MV_ADD"]), ("mvq.cc", 1))
        self.assertEqual(q.core.defines["MVQ_Q4_K"], 1)

    def test_strided_r_rows(self):
        # r a view: rows of N values 2N apart (the rest of each row belongs to another tensor).
        N, M, K = 64, 3, 128
        r = Tensor("f32", (N, M, 1, 1), (4, 8 * N, 8 * N * M, 8 * N * M))
        spec = add_spec("f32", M, N, K, r=r)
        self.assertEqual(spec.sequence[2], ("f32", (M - 1) * 2 * N + N))
        _check_r(self, spec, add_streams(spec))

    def test_refusals(self):
        # r repeated along dimension 0 (one value per row), or a transposed view.
        with self.assertRaises(UnsupportedError):
            add_spec("f32", 2, 64, 64, r_ne=[1, 2])
        with self.assertRaises(UnsupportedError):
            add_spec("f32", 2, 64, 64, r=Tensor("f32", (64, 2, 1, 1), (8, 4, 512, 512)))
        # r that cannot be repeated over the product: a malformed request.
        with self.assertRaises(RequestError):
            add_spec("f32", 2, 64, 64, r_ne=[64, 3])
        # r not f32, x not f32, integer weights.
        with self.assertRaises(UnsupportedError):
            add_spec("f32", 1, 64, 64, r=tensor("bf16", [64]))
        w, x, r = tensor("bf16", [64, 32]), tensor("bf16", [64, 1]), tensor("f32", [32])
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("MUL_MAT_ADD", [w, x, r], tensor("f32", [32]))))
        w, x = tensor("i8", [64, 32]), tensor("i8", [64, 1])
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("MUL_MAT_ADD", [w, x, r], tensor("i32", [32]))))
        # A strided output.
        out = Tensor("f32", (32, 2, 1, 1), (4, 256, 512, 512))
        w, x, r = tensor("f32", [64, 32]), tensor("f32", [64, 2]), tensor("f32", [32])
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("MUL_MAT_ADD", [w, x, r], out)))
        # Rows MUL_MAT's GEMM takes (it reads the weights once per M block, the GEMV once
        # per row): the GEMM and the ADD run unfused.
        for ty, M in (("f32", 4), ("q4_0", 16), ("q4_K", 512)):
            with self.subTest(ty=ty, M=M), self.assertRaisesRegex(UnsupportedError, "GEMM"):
                add_spec(ty, M, 64, 256)
        # A long batch the GEMM does not take (K not whole K steps): x's channel takes 2 or 3
        # tasks per round and src1 row.
        with self.assertRaisesRegex(UnsupportedError, "1024"):
            add_spec("f32", 512, 4096, 100)
        # op_params: the op reads none.
        with self.assertRaises(UnsupportedError):
            add_spec("f32", 1, 64, 64, op_params=[1])
        # Two inputs.
        with self.assertRaises(RequestError):
            prepare(parse_request(request_json("MUL_MAT_ADD", [w, x], tensor("f32", [32, 2]))))


@unittest.skipUnless(HAVE_NUMPY, "numpy is missing")
class AddRecordTest(unittest.TestCase):
    """Large decode and prefill shapes recorded against the emulation's stand-in, which checks
    every shim DMA, the descriptors in flight and the core memory (no g++ build)."""

    def test_large_shapes_stay_within_the_dma_limits(self):
        from ggml_hsa_iron.emu.compile import record

        for arch in ("aie2", "aie2p"):
            for ty, M, N, K, r_ne in (
                ("q4_0", 1, 2048, 8192, None),  # llama's ffn_down + residual
                ("q4_K", 1, 4096, 4096, None),  # attn_output + residual
                ("f32", 1, 4096, 4096, [4096]),  # a bias
                ("q8_0", 3, 2048, 2048, None),
                ("bf16", 2, 14336, 4096, None),
            ):
                with self.subTest(arch=arch, ty=ty, M=M, N=N, K=K):
                    record(add_spec(ty, M, N, K, arch, r_ne))  # raises on any hardware limit


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class AddEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu` and its recorded program run on real data."""

    def check(self, ty, M, N, K, arch, r_ne=None, b2=1, r2=1, r=None, seed=0):
        rng = random.Random(seed)
        B = b2 * r2
        w_bytes, w = zip(*(_weights(ty, N, K, rng) for _ in range(b2)))
        x = np.asarray([rng.uniform(-1, 1) for _ in range(B * M * K)], np.float32)
        if r is None:
            r = tensor("f32", r_ne or [N, M, B])
        span = (r.ne[0] - 1) * r.nb[0] + sum((n - 1) * s for n, s in zip(r.ne[1:], r.nb[1:])) + 4
        r_buf = np.asarray([rng.uniform(-4, 4) for _ in range(span // 4)], np.float32)
        got_bytes = run_request(
            add_request(ty, M, N, K, arch, b2=b2, r2=r2, r=r),
            [b"".join(w_bytes), x.tobytes(), r_buf.tobytes()],
        )
        got = np.frombuffer(got_bytes, np.float32).astype(np.float64).reshape(B, M, N)
        # bf16 and block-quantized weights take x rounded to bf16 (as ggml's CPU backend rounds
        # it for bf16 weights); f32 weights take it as it is.
        xv = x.astype(np.float64) if ty == "f32" else _bf16(x)
        xv = xv.reshape(B, M, K)
        for b in range(B):
            prods = xv[b][:, None, :] * w[b // r2][None, :, :]  # [M, N, K]
            rv = np.empty((M, N))
            for i in range(M):
                idx = (i % r.ne[1], b % r.ne[2])  # batches are dimension 2 here
                off = (idx[0] * r.nb[1] + idx[1] * r.nb[2]) // 4
                rv[i] = r_buf[off : off + N]
            want = prods.sum(axis=2) + rv
            tol = np.abs(prods).sum(axis=2) * 2.0**-20 + np.abs(want) * 2.0**-22 + 1e-30
            bad = ~(np.abs(got[b] - want) <= tol)  # NaN fails too
            if bad.any():
                self.fail(
                    f"{ty} batch {b}: {int(bad.sum())} of {got[b].size} wrong, first at "
                    f"{np.argwhere(bad)[0]}: {got[b][bad][0]} vs {want[bad][0]}"
                )

    def test_weight_types_rows_and_r_layouts(self):
        cases = [
            ("f32", 1, 32, 256, "aie2p", None),
            ("f32", 3, 37, 48, "aie2", [37, 1]),
            ("f16", 1, 64, 96, "aie2p", [64]),
            ("f16", 3, 48, 64, "aie2", None),
            ("q4_0", 1, 70, 256, "aie2", None),
            ("q4_0", 3, 64, 128, "aie2p", [64, 1]),
            ("q8_0", 1, 45, 128, "aie2p", [45]),
            ("q8_0", 2, 32, 64, "aie2", None),
            ("q4_K", 1, 64, 256, "aie2", [64, 1]),
            ("q4_K", 3, 19, 512, "aie2p", None),
        ]
        for i, (ty, M, N, K, arch, r_ne) in enumerate(cases):
            with self.subTest(ty=ty, M=M, N=N, K=K, arch=arch, r=r_ne):
                self.check(ty, M, N, K, arch, r_ne, seed=i)

    def test_batches_and_strided_r(self):
        # Weights broadcast over x's batches and a bias per batch (test-backend-ops' with_bias).
        self.check("q8_0", 2, 32, 256, "aie2p", r_ne=[32, 1, 4], b2=2, r2=2, seed=11)
        self.check("f32", 1, 32, 256, "aie2", r_ne=[32, 1, 4], b2=4, seed=12)
        # r's rows 3N apart (a view), and many rounds on aie2.
        N, M = 64, 2
        r = Tensor("f32", (N, M, 1, 1), (4, 12 * N, 12 * N * M, 12 * N * M))
        self.check("f32", M, N, 32, "aie2", r=r, seed=13)
        self.check("bf16", 1, 1024, 32, "aie2", seed=14)


if __name__ == "__main__":
    unittest.main()
