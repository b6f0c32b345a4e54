"""RMS_NORM_MUL_MAT and RMS_NORM_MUL_MAT_<glu>: the projection(s) of y = x / sqrt(mean(x^2) +
eps) * n, the norm folded into MUL_MAT's GEMV (and MUL_MAT_<glu>'s).

* the plan: MUL_MAT's (MUL_MAT_<glu>'s) GEMV with n sent once, ahead of the first x row, in
  K chunks on the x channel; n's static copy counted in the core's memory; the shim
  descriptors of the first task group (n's extra task) and the channel's tasks; the defines;
  the refusals (dense M that MUL_MAT's GEMM takes, non-f32 x, n or output, n's shape, a K too
  large to keep n on a core);
* the DMA limits of Llama-sized shapes, recorded against the emulation's stand-in;
* end to end: the design compiled for `--target emu` and its recorded program run on real data
  (tests/util_emu.py) against numpy, for f32, f16, q4_0, q8_0 and q4_K weights, K = 2048 with
  N = 512 and 2048 (Llama-3.2-1B's K/V and Q projections), a small odd shape, M = 1 and 2,
  RMS_NORM_MUL_MAT, _SWIGLU and _GEGLU, aie2p and aie2;
* RMS_NORM_MUL_MAT with an f16 output (the backend's V projection, its attn_norm folded in,
  written into the f16 KV cache): the plan (stash and n both counted, the defines), the
  refusals (the _<glu> variants, dense M the GEMM takes, an odd N), and end to end for f32 and
  q4_0 weights at Llama-3.2-1B's V (K = 2048, N = 512, M = 1) on aie2p and aie2 and a small odd
  K: the f16 result is the f32 design's rounded to nearest even, bit for bit (both plans chunk
  K alike in these cases, checked: the same f32 sums, squares and s), and close to numpy.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dataclasses
import random
import struct
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tiling import (
    GLU_GROUP_ROUNDS,
    MAX_TASKS_PER_CHANNEL,
    SHIM_GROUP_TASKS,
    stash_bytes,
    mv_norm_bytes,
)

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests import sample

try:
    import numpy as np
    from ggml_hsa_iron.tests.test_mul_mat_glu import _check_glu
    from ggml_hsa_iron.tests.util_emu import run_request
    from ggml_hsa_iron.tests.util_norm import (
        f16_half_ulp,
        norm_inputs,
        norm_reference,
        norm_weights,
    )

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

EPS = 1e-5
EPS_BITS = struct.unpack("<I", struct.pack("<f", EPS))[0]


def norm_request(op, wtype, M, N, K, arch="aie2p", xtype="f32", ntype="f32", otype="f32", n=None):
    """op ("" for RMS_NORM_MUL_MAT, else the GLU) over W [K, N] and x [K, M], n [K]."""
    w, x = tensor(wtype, [K, N]), tensor(xtype, [K, M])
    n = n or tensor(ntype, [K])
    name = f"RMS_NORM_MUL_MAT_{op}" if op else "RMS_NORM_MUL_MAT"
    ins = [w, w, x, n] if op else [w, x, n]
    out = tensor(otype, [N, M])
    return request_json(name, ins, out, arch, op_params=[EPS_BITS])


def norm_spec(*args, **kw):
    return prepare(parse_request(norm_request(*args, **kw)))


class NormPlanTest(unittest.TestCase):
    def test_the_projection_plan_with_n_ahead_of_x(self):
        for op in ("", "SWIGLU"):
            for ty, M, N, K in (("f32", 1, 512, 2048), ("q4_0", 2, 2048, 2048), ("f32", 2, 19, 30)):
                with self.subTest(op=op, ty=ty, M=M, N=N, K=K):
                    spec = norm_spec(op, ty, M, N, K)
                    p = spec.plan
                    self.assertTrue(spec.gemv and p.norm and bool(p.glu) == bool(op))
                    tap = p.norm_tap()
                    self.assertEqual(tap.indices(), list(range(K)))
                    self.assertEqual(tap.sizes[3], p.k_chunk)  # one x object per chunk
                    # The runtime sequence's arguments: the weights, x, n, dst.
                    names = [t for t, _ in spec.sequence]
                    self.assertEqual(len(names), 5 if op else 4)
                    self.assertEqual(spec.sequence[-2], ("f32", K))

    def test_n_is_counted_in_the_core_memory(self):
        for arch in ("aie2", "aie2p"):
            for op in ("", "GEGLU"):
                spec = norm_spec(op, "f32", 1, 2048, 2048, arch)
                p, a = spec.plan, spec.arch
                nr, kc = p.rows_per_tile, p.k_chunk
                l1 = 2 * nr * kc * 4 + 2 * kc * 4 + 2 * nr * 4 + mv_norm_bytes(2048, kc)
                l1 += stash_bytes(nr) if op else 0
                self.assertLessEqual(l1, a.l1_budget)
                self.assertGreaterEqual(mv_norm_bytes(2048, kc), 2048 * 4)

    def test_tasks_fit_the_shim_descriptors_and_channels(self):
        for op in ("", "SWIGLU"):
            spec = norm_spec(op, "q4_K", 2, 2048, 2048)
            groups = spec.tasks()
            for g, group in enumerate(groups):
                for w, *_ in group:
                    ws = w if op else (w,)
                    tasks = 2 * len(ws) if op else 1
                    tasks += 2 + (g == 0)  # x, y, and n ahead of the first x row
                    self.assertLessEqual(tasks, SHIM_GROUP_TASKS)
            if op:
                # Groups of one round fewer than MUL_MAT_<glu>'s: room for n's task.
                many = dataclasses.replace(spec.plan, N=spec.plan.block * 20)
                self.assertEqual(max(c for _, c in many.round_tasks()), GLU_GROUP_ROUNDS - 1)
            self.assertLessEqual(len(groups) + 1, MAX_TASKS_PER_CHANNEL)

    def test_defines(self):
        spec = norm_spec("SWIGLU", "q8_0", 1, 64, 256)
        d = spec.core.defines
        self.assertEqual((d["MV_NORM"], d["MV_NORM_K"], d["OP_P0"]), (1, 256, EPS_BITS))
        self.assertEqual((d["MV_GLU"], d["GGML_OP_SWIGLU"]), (1, 1))
        self.assertEqual(spec.core.object_name, "mvq.o")
        d = norm_spec("", "f32", 1, 64, 256).core.defines
        self.assertEqual((d["MV_NORM"], d["X_T"], d["Y_T"]), (1, "float", "float"))

    def test_refusals(self):
        refused = [
            ("", "f32", 8, 64, 64, {}),  # dense M the GEMM takes
            ("SWIGLU", "q4_0", 16, 64, 256, {}),  # more rows than one GEMV takes at once
            ("", "f32", 1, 64, 64, {"xtype": "f16"}),
            ("", "bf16", 1, 64, 64, {"xtype": "bf16"}),
            ("", "f32", 1, 64, 64, {"ntype": "f16"}),
            ("SWIGLU", "f32", 1, 64, 64, {"otype": "f16"}),
            ("GEGLU", "q4_0", 1, 64, 256, {"otype": "f16"}),
            ("", "f32", 1, 64, 64, {"otype": "bf16"}),
            ("", "f32", 1, 64, 16384, {}),  # n does not fit a core
            ("GEGLU", "q4_K", 1, 64, 16384, {}),
        ]
        for op, ty, M, N, K, kw in refused:
            with self.subTest(op=op, ty=ty, M=M, K=K, **kw):
                with self.assertRaises(UnsupportedError):
                    norm_spec(op, ty, M, N, K, **kw)
        with self.assertRaises(RequestError):
            norm_spec("", "f32", 1, 64, 64, n=tensor("f32", [32]))
        # What the request's names say is compiled.
        self.assertIsNotNone(norm_spec("", "bf16", 1, 64, 64))
        self.assertIsNotNone(norm_spec("", "f32", 3, 64, 64))  # M below the GEMM's rows


class NormF16OutPlanTest(unittest.TestCase):
    """RMS_NORM_MUL_MAT with an f16 output: MUL_MAT's f16 GEMV (f32 stash, one rounding) with
    the norm's prologue."""

    def test_the_plan_counts_the_stash_and_n(self):
        for ty in ("f32", "bf16", "f16", "q4_0", "q4_K"):
            for arch in ("aie2", "aie2p"):
                with self.subTest(ty=ty, arch=arch):
                    spec = norm_spec("", ty, 1, 512, 2048, arch, otype="f16")
                    p = spec.plan
                    self.assertTrue(spec.gemv and spec.f16_out and p.norm)
                    d = spec.core.defines
                    self.assertEqual((d["MV_OUT_F16"], d["MV_NORM"], d["MV_NORM_K"]), (1, 1, 2048))
                    self.assertNotIn("MV_GLU", d)
                    self.assertEqual(spec.sequence[-2:], [("f32", 2048), ("f16", 512)])
                    nr, kc = p.rows_per_tile, p.k_chunk
                    self.assertEqual(nr % 2, 0)  # nr f16 values: whole 32-bit words
                    w = p.w_units(kc) * (p.w_size or 1)
                    l1 = 2 * nr * w + 2 * kc * 4 + 2 * nr * 2
                    l1 += stash_bytes(nr) + mv_norm_bytes(2048, kc)
                    self.assertLessEqual(l1, spec.arch.l1_budget)
                    for group in spec.tasks():
                        for _, _, y in group:
                            self.assertEqual(y.offset % 2, 0)
                            self.assertEqual((y.sizes[-1] % 2, y.strides[-1]), (0, 1))

    def test_refusals(self):
        # The _<glu> variants keep an f32 output (the GLU is computed in f32).
        for op in ("SWIGLU", "GEGLU"):
            with self.subTest(op=op), self.assertRaisesRegex(UnsupportedError, "f32 output"):
                norm_spec(op, "q4_0", 1, 512, 2048, otype="f16")
        # Dense M that MUL_MAT's GEMM takes: no norm prologue there, as for the f32 output.
        for ty, M in (("f32", 8), ("q4_0", 16)):
            with self.subTest(ty=ty, M=M):
                with self.assertRaisesRegex(UnsupportedError, "GEMM, which has no norm"):
                    norm_spec("", ty, M, 512, 2048, otype="f16")
        # An odd N: the rows' last words would reach past them.
        with self.assertRaisesRegex(UnsupportedError, "RMS_NORM_MUL_MAT: an f16 output"):
            norm_spec("", "q4_0", 1, 63, 256, otype="f16")
        # The capabilities declare the f16 output for RMS_NORM_MUL_MAT only.
        from ggml_hsa_iron.capabilities import capabilities

        ops = {o["op"]: o for o in capabilities()["ops"]}
        self.assertIn(["q4_0", "f32", "f16"], ops["RMS_NORM_MUL_MAT"]["type_combos"])
        for op in ("RMS_NORM_MUL_MAT_SWIGLU", "MUL_MAT_ADD"):
            self.assertFalse([c for c in ops[op]["type_combos"] if c[2] == "f16"], op)


class NormRecordTest(unittest.TestCase):
    """Llama-sized decode shapes record against the emulation's stand-in, which checks every
    shim DMA, the descriptors in flight and the core memory (no g++ build)."""

    def test_large_shapes_stay_within_the_dma_limits(self):
        from ggml_hsa_iron.emu.compile import record

        for arch in ("aie2", "aie2p"):
            for ty, M, N, K in (
                ("q4_0", 1, 2048, 2048),
                ("f32", 2, 512, 2048),
                ("q4_K", 1, 8192, 2048),
                ("q8_0", 3, 14336, 4096),
            ):
                for op in ("", "SWIGLU"):
                    with self.subTest(arch=arch, op=op, ty=ty, M=M, N=N, K=K):
                        record(norm_spec(op, ty, M, N, K, arch))  # raises on any limit
                with self.subTest(arch=arch, ty=ty, M=M, N=N, K=K, out="f16"):
                    record(norm_spec("", ty, M, N, K, arch, otype="f16"))


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class NormEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu` and its recorded program run on real data."""

    def check(self, op, ty, M, N, K, arch, seed=0):
        rng = random.Random(seed)
        nrng = np.random.default_rng(seed)
        (wg_bytes, wg), (wu_bytes, wu) = (norm_weights(ty, N, K, nrng, rng) for _ in range(2))
        x, n = norm_inputs(nrng, M, K)
        ins = [wg_bytes] + ([wu_bytes] if op else []) + [x.tobytes(), n.tobytes()]
        got = run_request(norm_request(op, ty, M, N, K, arch), ins)
        got = np.frombuffer(got, np.float32).astype(np.float64).reshape(M, N)
        # The cores multiply x by n in f32, round it to bf16 for the decoding GEMV, sum the
        # products in f32 and scale the sums by s (computed in f32) at the end of a round.
        g, g_err = norm_reference(ty, x, n, wg)
        what = f"{op or 'plain'} {ty} M={M} N={N} K={K} {arch}"
        if op:
            u, u_err = norm_reference(ty, x, n, wu)
            _check_glu(self, op, got, g, u, g_err, u_err, what)
            return
        bad = ~(np.abs(got - g) <= g_err + 1e-30)  # NaN fails too
        if bad.any():
            self.fail(
                f"{what}: {int(bad.sum())} of {got.size} wrong, first at {np.argwhere(bad)[0]}: "
                f"{got[bad][0]} vs {g[bad][0]}"
            )

    def test_small_and_odd_shapes(self):
        cases = [
            ("", "f32", 1, 37, 64, "aie2p"),
            ("", "f32", 2, 19, 30, "aie2"),  # K off the vector lanes
            ("SWIGLU", "f32", 2, 37, 48, "aie2"),
            ("GEGLU", "f16", 1, 21, 80, "aie2p"),
            ("", "q4_0", 2, 37, 128, "aie2p"),
            ("SWIGLU", "q8_0", 1, 45, 128, "aie2"),
            ("", "q4_K", 1, 19, 512, "aie2"),
            ("GEGLU", "q4_K", 2, 37, 256, "aie2p"),
        ]
        for i, (op, ty, M, N, K, arch) in enumerate(cases):
            with self.subTest(op=op, ty=ty, M=M, N=N, K=K, arch=arch):
                self.check(op, ty, M, N, K, arch, seed=i)

    def check_f16(self, ty, M, N, K, arch, seed):
        """RMS_NORM_MUL_MAT's f16 output against the f32 design's (rounded) and numpy."""
        nrng = np.random.default_rng(seed)
        w_bytes, w = norm_weights(ty, N, K, nrng, random.Random(seed))
        x, n = norm_inputs(nrng, M, K)
        ins = [w_bytes, x.tobytes(), n.tobytes()]
        got = run_request(norm_request("", ty, M, N, K, arch, otype="f16"), ins)
        got = np.frombuffer(got, np.float16).reshape(M, N)
        f32 = np.frombuffer(run_request(norm_request("", ty, M, N, K, arch), ins), np.float32)
        what = f"f16 out {ty} M={M} N={N} K={K} {arch}"
        # Bit for bit against the f32 design's result rounded to nearest even: both plans
        # chunk K alike here (the f16 one may differ in nr, which orders no sum), so each
        # value is the same f32 sums of the same chunks, squares and s, rounded once.
        self.assertEqual(
            norm_spec("", ty, M, N, K, arch, otype="f16").plan.k_chunk,
            norm_spec("", ty, M, N, K, arch).plan.k_chunk,
        )
        rounded = f32.reshape(M, N).astype(np.float16)
        diff = got.view(np.uint16) != rounded.view(np.uint16)
        if diff.any():
            i = tuple(np.argwhere(diff)[0])
            self.fail(
                f"{what}: {int(diff.sum())} values differ from the f32 design's rounded, first "
                f"at {i}: {got[i]} vs {rounded[i]}"
            )
        # Against numpy: the f32 design's tolerance plus half an f16 ulp.
        want, err = norm_reference(ty, x, n, w)
        tol = err + f16_half_ulp(want)
        bad = ~(np.abs(got.astype(np.float64) - want) <= tol)  # NaN fails too
        if bad.any():
            self.fail(
                f"{what}: {int(bad.sum())} of {got.size} wrong, first at {np.argwhere(bad)[0]}: "
                f"{got[bad][0]} vs {want[bad][0]}"
            )

    def test_f16_output(self):
        # Llama-3.2-1B's V projection (K = 2048, N = 512) decoding, and an odd K (f32 rows off
        # the vector lanes, a zero-padded tail of every chunk).
        cases = [
            ("f32", 1, 512, 2048, "aie2p"),
            ("f32", 1, 512, 2048, "aie2"),
            ("q4_0", 1, 512, 2048, "aie2p"),
            ("q4_0", 1, 512, 2048, "aie2"),
            ("f32", 2, 38, 75, "aie2"),
        ]
        for i, (ty, M, N, K, arch) in enumerate(cases):
            with self.subTest(ty=ty, M=M, N=N, K=K, arch=arch):
                self.check_f16(ty, M, N, K, arch, seed=40 + i)

    def test_llama_3_2_1b_projections(self):
        # K = 2048: the K/V projections (N = 512) and Q (N = 2048), decode and two rows.
        cases = [
            ("", "f32", 1, 512, 2048, "aie2p"),
            ("", "f16", 2, 512, 2048, "aie2"),
            ("", "q4_0", 1, 2048, 2048, "aie2"),
            ("", "q8_0", 2, 512, 2048, "aie2p"),
            ("", "q4_K", 1, 2048, 2048, "aie2p"),
            ("SWIGLU", "q4_K", 2, 512, 2048, "aie2"),
            ("SWIGLU", "f32", 1, 512, 2048, "aie2p"),
        ]
        for i, (op, ty, M, N, K, arch) in sample.pick(enumerate(cases)):
            with self.subTest(op=op, ty=ty, M=M, N=N, K=K, arch=arch):
                self.check(op, ty, M, N, K, arch, seed=20 + i)


if __name__ == "__main__":
    unittest.main()
