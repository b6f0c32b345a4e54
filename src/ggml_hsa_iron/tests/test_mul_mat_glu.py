"""MUL_MAT_<glu> (REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK): act(W_g . x) * (W_u . x).

* the core functions (mv.cc / mvq.cc with MV_GLU, tests/host/mv_glu_driver.cc) on the host
  against numpy: one round over two K chunks, run twice (the stash is reset per round);
* the plan: every core gets, per round, its gate rows from W_g and then the same rows from
  W_u over all of K in order, with x twice (util_matmul.check_structure on each half), within
  the shim tile's buffer descriptors and the 1024 tasks of a channel; the stash counted in
  the core's memory; the refusals;
* end to end: the design compiled for the emulation target and its recorded program run on
  real data (tests/util_emu.py) against a numpy reference, for f32, q4_0, q8_0 and q4_K
  weights, M = 1 and 3, N off the grid, a broadcast batch, aie2p and aie2.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import random
import subprocess
import tempfile
import unittest

from ggml_hsa_iron.archs import ARCHS
from ggml_hsa_iron.dtypes import DTYPES
from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import Tensor, parse_request
from ggml_hsa_iron.tiling import GLU_GROUP_ROUNDS, MAX_TASKS_PER_CHANNEL, stash_bytes

from ggml_hsa_iron.tests import host_program
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_kernels_host import HERE, KERNELS
from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests.util_matmul import check_structure

try:
    import numpy as np
    from ml_dtypes import bfloat16

    from ggml_hsa_iron.tests import util_blocks
    from ggml_hsa_iron.tests.test_rope_glu_host import glu_ref
    from ggml_hsa_iron.tests.util_emu import run_request

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

ARCH_DEFINE = {"aie2": 20, "aie2p": 21}
GLU_OPS = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")


def glu_request(op, wtype, M, N, K, arch="aie2p", b2=1, r2=1, xtype="f32", **kw):
    w = tensor(wtype, [K, N, b2])
    x = tensor(xtype, [K, M, b2 * r2])
    return request_json(f"MUL_MAT_{op}", [w, w, x], tensor("f32", [N, M, b2 * r2]), arch, **kw)


def glu_spec(*args, **kw):
    return prepare(parse_request(glu_request(*args, **kw)))


def glu_streams(spec):
    """({core: {"w", "x", "y"}} of the gate products, the same of the up products): what every
    core receives from the runtime sequence `spec.tasks()` the design issues, per round W_g's
    tap then W_u's (one W fifo), x's tap repeating the row twice (the first k_steps objects
    for the gate, the next for the up rows), y once."""
    p = spec.plan
    R, nr, kc, steps = p.rows, p.rows_per_tile, p.k_chunk, p.k_steps
    keys = [(c, i) for c in range(p.columns) for i in range(R)]
    gate = {k: {"w": [], "x": [], "y": []} for k in keys}
    up = {k: {"w": [], "x": [], "y": []} for k in keys}

    def objects(indices, size):
        assert len(indices) % size == 0
        return [indices[i : i + size] for i in range(0, len(indices), size)]

    for group in spec.tasks():
        for col, (ws, x, y) in enumerate(group):
            xs = objects(x.indices(), kc)
            ys = objects(y.indices(), R * nr)
            assert len(xs) == 2 * steps * len(ws) and len(ys) == len(ws)
            for r, w in enumerate(ws):
                wobj = objects(w.indices(), R * nr * kc)
                assert len(wobj) == steps
                for half, cores in ((0, gate), (1, up)):
                    for i in range(R):
                        core = cores[(col, i)]
                        core["w"] += [o[i * nr * kc : (i + 1) * nr * kc] for o in wobj]
                        core["x"] += xs[(2 * r + half) * steps : (2 * r + half + 1) * steps]
                        core["y"].append(ys[r][i * nr : (i + 1) * nr])
    return gate, up


class GluPlanTest(unittest.TestCase):
    def test_every_core_gets_its_gate_then_up_rows_over_all_of_k(self):
        shapes = [
            ("f32", 1, 37, 64, 1, 1),  # N prime: the last round overlaps
            ("f32", 3, 100, 48, 1, 1),
            ("bf16", 1, 4096, 512, 1, 1),  # many rounds: several task groups per row
            ("f32", 2, 9, 2051, 2, 2),  # K odd (f32), a broadcast batch
        ]
        for arch in ("aie2", "aie2p"):
            for w, M, N, K, b2, r2 in shapes:
                with self.subTest(arch=arch, w=w, M=M, N=N, K=K):
                    spec = glu_spec("SWIGLU", w, M, N, K, arch, b2, r2)
                    self.assertTrue(spec.gemv and spec.plan.glu)
                    gate, up = glu_streams(spec)
                    check_structure(spec, gate)
                    check_structure(spec, up)
                    # The core consumes per round k_steps gate objects then k_steps up ones:
                    # both halves' y are the same round's.
                    for key in gate:
                        self.assertEqual(gate[key]["y"], up[key]["y"])

    def test_tasks_fit_the_shim_descriptors_and_channels(self):
        for arch in ("aie2", "aie2p"):
            for ty, M, N, K in (
                ("f32", 1, 4096, 256),
                ("q4_0", 3, 1000, 512),
                ("q6_K", 2, 64, 256),
            ):
                with self.subTest(arch=arch, ty=ty):
                    spec = glu_spec("GEGLU", ty, M, N, K, arch)
                    p = spec.plan
                    groups = spec.tasks()
                    w_tasks = 0
                    for group in groups:
                        self.assertEqual(len(group), p.columns)
                        for ws, x, y in group:
                            # 2 W tasks per round, x and y: a shim tile's 16 descriptors.
                            self.assertLessEqual(len(ws), GLU_GROUP_ROUNDS)
                            self.assertLessEqual(2 * len(ws) + 2, 16)
                            self.assertEqual(x.sizes[0], 2 * len(ws))
                            self.assertEqual(x.strides[0], 0)
                            # Its rounds of y (GemvPlan.nx: the outer dimension).
                            self.assertEqual(y.sizes[0 if p.nx > 1 else 2], len(ws))
                            for w in ws:
                                self.assertEqual(w.sizes[0], 1)  # one round per W task
                        w_tasks += 2 * len(group[0][0])
                    self.assertEqual(w_tasks, 2 * p.passes(len(spec.products)) * p.rounds)
                    self.assertLessEqual(w_tasks, MAX_TASKS_PER_CHANNEL)
                    self.assertEqual(spec.sequence[0], spec.sequence[1])

    def test_byte_weights_read_every_row_of_both_matrices_in_whole_words(self):
        for ty in ("f16", "q4_0", "q8_0", "q4_K", "q6_K"):
            block, size = DTYPES[ty].block, DTYPES[ty].size
            for arch in ("aie2", "aie2p"):
                with self.subTest(ty=ty, arch=arch):
                    N, K = 36, 512
                    spec = glu_spec("REGLU", ty, 2, N, K, arch)
                    row = K // block * size
                    self.assertEqual(spec.sequence[:2], [("i8", N * row)] * 2)
                    groups = spec.tasks()
                    # One pass over the weights per group of nx rows (GemvPlan.nx).
                    nx = spec.plan.nx
                    per = len(groups) // spec.plan.passes(len(spec.products))
                    for i, (w_off, _, _) in enumerate(spec.products[::nx]):
                        read = []
                        for g in groups[i * per : (i + 1) * per]:
                            for ws, _, _ in g:
                                for w in ws:
                                    self.assertEqual(w.offset % 4, 0)
                                    self.assertEqual(w.sizes[3] % 4, 0)
                                    read += w.indices()
                        self.assertEqual(set(read), set(range(w_off, w_off + N * row)))

    def test_the_stash_is_counted_in_the_core_memory(self):
        for arch in ("aie2", "aie2p"):
            for ty, N, K in (("f32", 4096, 4096), ("bf16", 11008, 4096), ("q4_K", 4096, 4096)):
                with self.subTest(arch=arch, ty=ty):
                    spec = glu_spec("SWIGLU", ty, 1, N, K, arch)
                    p = spec.plan
                    w_tile = p.rows_per_tile * p.w_units(p.k_chunk)
                    if not spec.weight_bytes:
                        w_tile *= spec.src0.size
                    l1 = 2 * w_tile + 2 * p.k_chunk * 4 + 2 * p.rows_per_tile * 4
                    l1 += stash_bytes(p.rows_per_tile)
                    self.assertLessEqual(l1, ARCHS[arch].l1_budget)
        self.assertEqual(stash_bytes(1), 64)
        self.assertEqual(stash_bytes(64), 256)

    def test_defines_name_the_glu_op(self):
        for op in GLU_OPS:
            d = glu_spec(op, "q8_0", 1, 64, 256).core.defines
            self.assertEqual((d["MV_GLU"], d[f"GGML_OP_{op}"], d["MVQ_Q8_0"]), (1, 1, 1))
            s = glu_spec(op, "f32", 1, 64, 256)
            self.assertEqual(s.core.source, "mv.cc")
            self.assertEqual(s.core.defines[f"GGML_OP_{op}"], 1)

    def test_refusals(self):
        # A long prefill batch: 2 W tasks per round and src1 row exceed a channel's 1024.
        with self.assertRaisesRegex(UnsupportedError, "1024"):
            glu_spec("SWIGLU", "q4_0", 512, 4096, 4096)
        # bf16 weights with an odd K: rows do not start on 32-bit words.
        with self.assertRaises(UnsupportedError):
            glu_spec("SWIGLU", "bf16", 1, 64, 255)
        # Integer weights: no GLU of integer products.
        w, x = tensor("i8", [64, 32]), tensor("i8", [64, 1])
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("MUL_MAT_REGLU", [w, w, x], tensor("i32", [32]))))
        # op_params: the ops read none.
        with self.assertRaises(UnsupportedError):
            glu_spec("GEGLU", "f32", 1, 64, 64, op_params=[1])
        # Gate and up weights of different types, shapes or strides: a malformed request.
        x, out = tensor("f32", [256, 1]), tensor("f32", [64, 1])
        for up in (
            tensor("q8_0", [256, 64]),
            tensor("q4_0", [256, 32]),
            Tensor("q4_0", (256, 64, 1, 1), (18, 160, 160 * 64, 160 * 64)),
        ):
            with self.subTest(up=up):
                req = request_json("MUL_MAT_SWIGLU", [tensor("q4_0", [256, 64]), up, x], out)
                with self.assertRaises(RequestError):
                    prepare(parse_request(req))
        # Three inputs.
        w = tensor("f32", [64, 8])
        with self.assertRaises(RequestError):
            prepare(parse_request(request_json("MUL_MAT_SWIGLU", [w, x], tensor("f32", [8]))))


@unittest.skipUnless(HAVE_NUMPY, "numpy is missing")
class GluRecordTest(unittest.TestCase):
    """Large decode and prefill shapes: the designs record against the emulation's stand-in,
    which checks every shim DMA (strides below 2^20 words, wraps, repeat counts), the
    descriptors in flight and the core memory (no g++ build)."""

    def test_large_shapes_stay_within_the_dma_limits(self):
        from ggml_hsa_iron.emu.compile import record

        for arch in ("aie2", "aie2p"):
            for ty, M, N, K in (
                ("q4_0", 1, 4096, 4096),
                ("q4_0", 16, 4096, 4096),
                ("f32", 1, 4096, 4096),
                ("q4_K", 4, 11008, 4096),
                ("bf16", 2, 14336, 4096),
            ):
                for op in ("MUL_MAT", "MUL_MAT_SWIGLU"):
                    with self.subTest(arch=arch, op=op, ty=ty, M=M, N=N, K=K):
                        w, x = tensor(ty, [K, N]), tensor("f32", [K, M])
                        ins = [w, x] if op == "MUL_MAT" else [w, w, x]
                        out = tensor("f32", [N, M])
                        spec = prepare(parse_request(request_json(op, ins, out, arch=arch)))
                        record(spec)  # raises on any hardware limit


# ----------------------------------------------------------------- numpy reference


def _bf16(a):
    return np.asarray(a, dtype=np.float32).astype(bfloat16).astype(np.float64)


def _weights(ty, rows, K, rng):
    """(bytes as ggml stores them, the values the kernel multiplies as float64 [rows, K]): as
    the decoder forms them (block_decode.h)."""
    if ty in ("f32", "bf16"):
        npt = np.float32 if ty == "f32" else bfloat16
        g = np.random.default_rng(rng.getrandbits(64))
        w = g.uniform(-0.2, 0.2, rows * K).astype(np.float32).astype(npt)
        return w.tobytes(), w.astype(np.float64).reshape(rows, K)
    blocks = util_blocks.random_blocks(ty, rows * K // DTYPES[ty].block, rng)
    vals = util_blocks.kernel_values(ty, blocks).astype(np.float64)
    return blocks.tobytes(), vals.reshape(rows, K)


# An upper bound of |act'(g)| (gelu's peaks at about 1.13, gelu_quick's at 1.09).
ACT_SLOPE = 1.2


def _check_glu(test, op, got, gate, up, g_err, u_err, what):
    """got vs act(gate) * up, allowing each sum its summation error (g_err, u_err) carried
    through act (|act'| <= 1.2), the activations' own approximation (erf: 1.5e-7 absolute,
    the others a few f32 ulps) and the result's f32 rounding."""
    want = glu_ref(op, gate, up)
    act = glu_ref(op, gate, np.ones_like(gate))
    tol = ACT_SLOPE * g_err * np.abs(up) + np.abs(act) * u_err
    tol += 2e-6 * np.abs(want) + 1e-6 * np.abs(gate * up) + 1e-30
    bad = ~(np.abs(got - want) <= tol)  # NaN fails too
    if bad.any():
        test.fail(
            f"{what}: {int(bad.sum())} of {got.size} wrong, first at {np.argwhere(bad)[0]}: "
            f"{got[bad][0]} vs {want[bad][0]} (tol {tol[bad][0]})"
        )


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class GluKernelHostTest(unittest.TestCase):
    """mv.cc / mvq.cc's MUL_MAT_<glu> functions, one round over two K chunks, twice."""

    def run_driver(self, tmp, ty, op, arch, rows, kc, tiles, xs):
        defs = {"MV_ROWS": rows, "MV_KC": kc, "MV_GLU": 1, f"GGML_OP_{op}": 1}
        if ty in ("f32", "bf16"):
            ctype = DTYPES[ty].ctype
            defs.update(W_T=ctype, X_T="float", Y_T="float", MV_INT=0)
        else:
            defs.update({f"MVQ_{ty.upper()}": 1, "DRIVER_MVQ": 1})
        cmd = ["-std=c++20", "-O1", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
        cmd += [f"-D{k}={v}" for k, v in defs.items()]
        cmd += [f"-D__AIE_ARCH__={ARCH_DEFINE[arch]}"]
        cmd += [str(HERE / "host" / "mv_glu_driver.cc")]
        exe = host_program.build(cmd)
        data = tmp / "in.txt"
        text = " ".join(f"{b:x}" for t in tiles for b in t) + "\n"
        text += " ".join(float.hex(float(v)) for x in xs for v in x) + "\n"
        data.write_text(text)
        out = subprocess.run([str(exe), str(data)], check=True, capture_output=True, text=True)
        return np.asarray([float.fromhex(v) for v in out.stdout.split()])

    def test_every_op_and_weight_kind_on_both_archs(self):
        rng = random.Random(7)
        cases = [("f32", 19, 40), ("bf16", 16, 32), ("q4_0", 17, 64), ("q8_0", 5, 32)]
        cases += [("q4_K", 3, 256), ("q6_K", 2, 256), ("f16", 18, 24)]
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            for n, (ty, rows, kc) in enumerate(cases):
                op = GLU_OPS[n % len(GLU_OPS)]
                for arch in ("aie2", "aie2p"):
                    with self.subTest(ty=ty, op=op, arch=arch):
                        tiles, vals = [], []
                        for _ in range(4):  # W_g chunk 0, 1, W_u chunk 0, 1
                            b, v = _weights(ty, rows, kc, rng)
                            tiles.append(b)
                            vals.append(v)
                        xs = [
                            np.asarray([rng.uniform(-1, 1) for _ in range(kc)], np.float32)
                            for _ in range(2)
                        ]
                        got = self.run_driver(tmp, ty, op, arch, rows, kc, tiles, xs)
                        x = [x.astype(np.float64) for x in xs]
                        if ty not in ("f32", "bf16"):
                            x = [_bf16(v) for v in xs]
                        gp = [vals[0] * x[0], vals[1] * x[1]]
                        up = [vals[2] * x[0], vals[3] * x[1]]
                        g = sum(p.sum(axis=1) for p in gp)
                        u = sum(p.sum(axis=1) for p in up)
                        g_err = sum(np.abs(p).sum(axis=1) for p in gp) * 2.0**-20
                        u_err = sum(np.abs(p).sum(axis=1) for p in up) * 2.0**-20
                        # The second round reruns the first: the stash was reset.
                        np.testing.assert_array_equal(got[:rows], got[rows:])
                        _check_glu(self, op, got[:rows], g, u, g_err, u_err, f"{ty} {op}")

    def test_every_activation_in_f32(self):
        # Gate sums over a wide range (x from -12 to 12 through the activations' tails).
        rows, kc = 33, 16
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            for op in GLU_OPS:
                for arch in ("aie2", "aie2p"):
                    with self.subTest(op=op, arch=arch):
                        gate = np.zeros((2, rows, kc), np.float32)
                        gate[0, :, 0] = np.linspace(-12, 12, rows, dtype=np.float32)
                        upw = np.zeros((2, rows, kc), np.float32)
                        upw[0, :, 0] = np.linspace(3, -2, rows, dtype=np.float32)
                        tiles = [gate[0].tobytes(), gate[1].tobytes()]
                        tiles += [upw[0].tobytes(), upw[1].tobytes()]
                        xs = [np.zeros(kc, np.float32), np.zeros(kc, np.float32)]
                        xs[0][0] = 1.0
                        got = self.run_driver(tmp, "f32", op, arch, rows, kc, tiles, xs)
                        g = gate[0, :, 0].astype(np.float64)
                        u = upw[0, :, 0].astype(np.float64)
                        z = np.zeros(rows)
                        _check_glu(self, op, got[:rows], g, u, z, z, op)


# ------------------------------------------------------------------- end to end


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class GluEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu` and its recorded program run on real data."""

    def check(self, op, ty, M, N, K, arch, b2=1, r2=1, seed=0):
        rng = random.Random(seed)
        B = b2 * r2
        wg_bytes, wg = zip(*(_weights(ty, N, K, rng) for _ in range(b2)))
        wu_bytes, wu = zip(*(_weights(ty, N, K, rng) for _ in range(b2)))
        x = np.asarray([rng.uniform(-1, 1) for _ in range(B * M * K)], np.float32)
        got_bytes = run_request(
            glu_request(op, ty, M, N, K, arch, b2, r2),
            [b"".join(wg_bytes), b"".join(wu_bytes), x.tobytes()],
        )
        got = np.frombuffer(got_bytes, np.float32).astype(np.float64).reshape(B, M, N)
        xv = x.astype(np.float64) if ty in ("f32", "bf16") else _bf16(x)
        xv = xv.reshape(B, M, K)
        for b in range(B):
            i0 = b // r2  # ggml's broadcast of the weights over x's batches
            gp = xv[b][:, None, :] * wg[i0][None, :, :]  # [M, N, K]
            up = xv[b][:, None, :] * wu[i0][None, :, :]
            g, u = gp.sum(axis=2), up.sum(axis=2)
            g_err = np.abs(gp).sum(axis=2) * 2.0**-20
            u_err = np.abs(up).sum(axis=2) * 2.0**-20
            _check_glu(self, op, got[b], g, u, g_err, u_err, f"{op} {ty} batch {b}")

    def test_weight_types_rows_and_archs(self):
        cases = [
            ("SWIGLU", "f32", 1, 37, 64, "aie2p"),
            ("GEGLU", "f32", 3, 37, 48, "aie2"),
            ("SWIGLU", "q4_0", 1, 37, 256, "aie2p"),
            ("REGLU", "q4_0", 3, 70, 128, "aie2"),
            ("GEGLU_QUICK", "q8_0", 1, 45, 128, "aie2"),
            ("GEGLU_ERF", "q8_0", 3, 37, 64, "aie2p"),
            ("SWIGLU", "q4_K", 1, 37, 256, "aie2p"),
            ("GEGLU", "q4_K", 3, 19, 512, "aie2"),
        ]
        for i, (op, ty, M, N, K, arch) in enumerate(cases):
            with self.subTest(op=op, ty=ty, M=M, N=N, K=K, arch=arch):
                self.check(op, ty, M, N, K, arch, seed=i)

    def test_broadcast_batch_and_many_rounds(self):
        # Weights broadcast over x's batches (ggml: i02 = i12 / r2), and N large enough for
        # several task groups per src1 row (7 rounds each).
        self.check("SWIGLU", "q8_0", 2, 40, 64, "aie2p", b2=2, r2=2, seed=11)
        self.check("SWIGLU", "f32", 1, 1000, 32, "aie2", seed=12)


if __name__ == "__main__":
    unittest.main()
