"""MUL_MAT with an f16 output (the backend's V projection written straight into the f16 KV
cache): the GEMV sums in an f32 stash on the core and rounds once per value.

* the plan: the defines and sources, every core's W rows and x chunks over all of K and each
  dst element written (util_matmul.check_structure), y's DMAs on 32-bit words, the stash
  counted in the core's memory; the refusals (rows the GEMM takes, bf16 outputs, f16 outputs
  of other activations or of the fused ops, rows of an odd N or starting mid-word);
* large decode and prefill shapes recorded against the emulation's stand-in (DMA limits, core
  memory);
* end to end: the design compiled for `--target emu` and its recorded program run on real data
  (tests/util_emu.py) for f32, bf16, f16, q4_0, q8_0 and q4_K weights, one to three src1 rows,
  Llama-3.2-1B's V projection (K = 2048, N = 512) and small shapes off the round grid, aie2p
  and aie2: the f16 result is the f32 design's result rounded to nearest even, bit for bit (both
  plans chunk K alike in these cases: the same f32 sums in the same order), and within
  summation error plus half an f16 ulp of numpy.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import random
import unittest

from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import Tensor, parse_request
from ggml_hsa_iron.tiling import stash_bytes

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests.util_matmul import check_structure, gemv_streams
from ggml_hsa_iron.tests import sample

try:
    import numpy as np

    from ggml_hsa_iron.tests.test_mul_mat_glu import _bf16, _weights
    from ggml_hsa_iron.tests.util_emu import run_request

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

WEIGHTS = ("f32", "bf16", "f16", "q4_0", "q8_0", "q4_K")


def mm_request(wtype, M, N, K, arch="aie2p", out="f16", x="f32", dst=None):
    w, xs = tensor(wtype, [K, N]), tensor(x, [K, M])
    return request_json("MUL_MAT", [w, xs], dst or tensor(out, [N, M]), arch)


def mm_spec(*args, **kw):
    return prepare(parse_request(mm_request(*args, **kw)))


class F16OutPlanTest(unittest.TestCase):
    def test_defines_and_sources(self):
        for ty in WEIGHTS:
            with self.subTest(ty=ty):
                s = mm_spec(ty, 1, 512, 2048)
                self.assertTrue(s.gemv and s.f16_out)
                self.assertEqual(s.core.defines["MV_OUT_F16"], 1)
                self.assertNotIn("MV_GLU", s.core.defines)
                self.assertNotIn("MV_ADD", s.core.defines)
                self.assertEqual(s.sequence[-1], ("f16", 512))
                if ty in ("f32", "bf16"):
                    self.assertEqual(s.core.source, "mv.cc")
                    self.assertEqual(s.core.defines["Y_T"], "uint16_t")
                else:
                    self.assertEqual(s.core.source, "mvq.cc")
                # The f32 product's plan has no stash define.
                self.assertNotIn("MV_OUT_F16", mm_spec(ty, 1, 512, 2048, out="f32").core.defines)

    def test_every_core_reads_its_rows_and_every_value_is_written(self):
        for ty, M, N, K, arch in (
            ("f32", 1, 512, 2048, "aie2p"),
            ("f32", 3, 38, 75, "aie2"),
            ("bf16", 2, 70, 96, "aie2p"),
        ):
            with self.subTest(ty=ty, M=M, N=N, K=K, arch=arch):
                s = mm_spec(ty, M, N, K, arch)
                self.assertGreaterEqual(check_structure(s, gemv_streams(s)), N * M)

    def test_y_dmas_are_whole_words_and_the_stash_is_counted(self):
        for ty in WEIGHTS:
            for M, N, K in ((1, 512, 2048), (3, 38, 256), (2, 4096, 4096)):
                for arch in ("aie2", "aie2p"):
                    with self.subTest(ty=ty, M=M, N=N, K=K, arch=arch):
                        s = mm_spec(ty, M, N, K, arch)
                        p = s.plan
                        nr, kc = p.rows_per_tile, p.k_chunk
                        self.assertEqual(nr % 2, 0)  # nr f16 values: whole words
                        for group in s.tasks():
                            for _, _, y in group:
                                # f16 elements: even offsets, outer strides and runs.
                                self.assertEqual(y.offset % 2, 0)
                                self.assertEqual((y.sizes[-1] % 2, y.strides[-1]), (0, 1))
                                self.assertTrue(all(st % 2 == 0 for st in y.strides[:-1]))
                        w = p.w_units(kc) * (p.w_size or 1)
                        l1 = 2 * nr * w + 2 * kc * 4 + 2 * nr * 2 + stash_bytes(nr)
                        self.assertLessEqual(l1, s.arch.l1_budget)

    def test_strided_output_rows(self):
        # dst rows padded to 2N values: accepted (even strides); an odd row stride is not on
        # 32-bit words.
        N, M, K = 64, 2, 128
        dst = Tensor("f16", (N, M, 1, 1), (2, 4 * N, 4 * N * M, 4 * N * M))
        s = mm_spec("q8_0", M, N, K, dst=dst)
        self.assertEqual(s.sequence[-1], ("f16", 2 * N + N))
        dst = Tensor("f16", (N, M, 1, 1), (2, 2 * N + 2, (2 * N + 2) * M, (2 * N + 2) * M))
        with self.assertRaisesRegex(UnsupportedError, "32-bit words"):
            mm_spec("f32", M, N, K, dst=dst)

    def test_refusals(self):
        # Rows the GEMM takes: its C tile is f32 (the MUL_MAT and the copy run unfused).
        for ty, M in (("f32", 4), ("bf16", 16), ("f16", 8), ("q4_0", 16), ("q4_K", 512)):
            with self.subTest(ty=ty, M=M), self.assertRaisesRegex(UnsupportedError, "GEMV only"):
                mm_spec(ty, M, 64, 256)
        # ... but M >= 4 rows the GEMM does not tile take the GEMV (K not a multiple of 8).
        self.assertTrue(mm_spec("f32", 4, 64, 100).gemv)
        # A bf16 output, f16 outputs of non-f32 activations, integer products.
        for w, x, out in (
            ("f32", "f32", "bf16"),
            ("bf16", "bf16", "f16"),
            ("f16", "f16", "f16"),
            ("i8", "i8", "f16"),
        ):
            with self.subTest(w=w, x=x, out=out), self.assertRaises(UnsupportedError):
                mm_spec(w, 1, 64, 256, out=out, x=x)
        # An odd N: the rows' last words would reach past them.
        for M in (1, 2):
            with self.subTest(M=M), self.assertRaisesRegex(UnsupportedError, "32-bit words"):
                mm_spec("q4_0", M, 63, 256)
        # The fused products keep their f32 output.
        w, x, r = tensor("q4_0", [256, 64]), tensor("f32", [256, 1]), tensor("f32", [64])
        for op, ins in (("MUL_MAT_SWIGLU", [w, w, x]), ("MUL_MAT_ADD", [w, x, r])):
            with self.subTest(op=op), self.assertRaises(UnsupportedError):
                prepare(parse_request(request_json(op, ins, tensor("f16", [64, 1]))))


@unittest.skipUnless(HAVE_NUMPY, "numpy is missing")
class F16OutRecordTest(unittest.TestCase):
    """Large shapes recorded against the emulation's stand-in, which checks every shim DMA,
    the descriptors in flight and the core memory (no g++ build)."""

    def test_large_shapes_stay_within_the_dma_limits(self):
        from ggml_hsa_iron.emu.compile import record

        for arch in ("aie2", "aie2p"):
            for ty, M, N, K in (
                ("q4_K", 1, 4096, 4096),
                ("q8_0", 3, 1024, 4096),
                ("f16", 1, 1024, 8192),
                ("f32", 2, 512, 2048),
            ):
                with self.subTest(arch=arch, ty=ty, M=M, N=N, K=K):
                    record(mm_spec(ty, M, N, K, arch))  # raises on any hardware limit


def _f16_ulp(v):
    """The f16 ulp at each value (normal or subnormal)."""
    e = np.floor(np.log2(np.maximum(np.abs(v), 2.0**-14)))
    return 2.0 ** (e - 10)


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class F16OutEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu` and its recorded program run on real data."""

    def check(self, ty, M, N, K, arch, seed):
        rng = random.Random(seed)
        w_bytes, w = _weights(ty, N, K, rng)
        x = np.asarray([rng.uniform(-1, 1) for _ in range(M * K)], np.float32)
        inputs = [w_bytes, x.tobytes()]
        got = np.frombuffer(run_request(mm_request(ty, M, N, K, arch), inputs), np.float16)
        f32 = np.frombuffer(run_request(mm_request(ty, M, N, K, arch, "f32"), inputs), np.float32)
        got, f32 = got.reshape(M, N), f32.reshape(M, N)
        # Against the f32 design: its result rounded to nearest even (numpy's conversion, as
        # ggml's), bit for bit. Both plans chunk K alike here (the f16 one differs in an even
        # nr and the stash it counts), so every row's sums are the same f32 additions in the
        # same order; another chunk would only change the order (within an f16 ulp).
        self.assertEqual(
            mm_spec(ty, M, N, K, arch).plan.k_chunk,
            mm_spec(ty, M, N, K, arch, "f32").plan.k_chunk,
        )
        rounded = f32.astype(np.float16)
        diff = got.view(np.uint16) != rounded.view(np.uint16)
        if diff.any():
            i = tuple(np.argwhere(diff)[0])
            self.fail(
                f"{ty}: {int(diff.sum())} values differ from the f32 design's rounded, first "
                f"at {i}: {got[i]} vs {rounded[i]}"
            )
        # Against numpy: the summation error of the f32 design plus half an f16 ulp.
        xv = x.astype(np.float64) if ty == "f32" else _bf16(x)  # bf16 weights: bf16 x too
        prods = xv.reshape(M, K)[:, None, :] * w[None, :, :]  # [M, N, K]
        want = prods.sum(axis=2)
        tol = np.abs(prods).sum(axis=2) * 2.0**-20 + _f16_ulp(want) / 2 + 1e-30
        bad = ~(np.abs(got.astype(np.float64) - want) <= tol)  # NaN fails too
        if bad.any():
            self.fail(
                f"{ty}: {int(bad.sum())} of {got.size} wrong, first at {np.argwhere(bad)[0]}: "
                f"{got[bad][0]} vs {want[bad][0]}"
            )

    def test_weight_types_rows_and_shapes(self):
        # Llama-3.2-1B's V projection (K = 2048, N = 512) decoding and for 2-3 tokens, and
        # small shapes whose last round is shifted (N off the round grid; f32: an odd K).
        cases = []
        for ty in ("f32", "f16", "q4_0", "q8_0", "q4_K"):
            small_k = {"f32": 75, "q4_K": 256}.get(ty, 96)
            cases += [
                (ty, 1, 512, 2048, "aie2p"),
                (ty, 1, 512, 2048, "aie2"),
                (ty, 3, 512, 2048, "aie2p"),
                (ty, 2, 38, small_k, "aie2"),
                (ty, 3, 38, small_k, "aie2p"),
            ]
        cases.append(("bf16", 2, 512, 2048, "aie2"))
        for i, (ty, M, N, K, arch) in sample.pick(enumerate(cases)):
            with self.subTest(ty=ty, M=M, N=N, K=K, arch=arch):
                self.check(ty, M, N, K, arch, seed=i)


if __name__ == "__main__":
    unittest.main()
