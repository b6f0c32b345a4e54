"""MUL_MAT's GEMM over f16 and block-quantized weights (M > 1, dense), end to end.

The design compiled for `--target emu` (the recording `aie.iron` with its hardware checks:
core and memory tile memory, DMA limits, channels) and its recorded program run on real data
(tests/util_emu.py: shim taps, the memory tile's split, forward, join and `to_stream`
re-layouts, every core running mmq.cc built with g++), compared with numpy: ggml's MUL_MAT of
the decoded weights (test_mul_mat_glu's reading of ggml's block layouts) rounded to bf16 and
the activations rounded to bf16, within f32 summation error. Shapes are off the tile grid in
M and N (overlapping last blocks) and with batches (src0 broadcast over src1's dimension 2),
on aie2 and aie2p. The output starts as 0xFF bytes (NaN): an element never written fails.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import random
import unittest

from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_json, tensor

try:
    import numpy as np

    from ggml_hsa_iron.tests.test_mul_mat_strided import _bf16, _random_rows, _reference
    from ggml_hsa_iron.tests.util_emu import run_request

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class ByteWeightsGemmEmulationTest(unittest.TestCase):
    def check(self, ty, arch, M, N, K, b2=1, r2=1, seed=0, gemv=False, x="f32"):
        a = tensor(ty, [K, N, b2])
        b = tensor(x, [K, M, b2 * r2])
        d = tensor("f32", [N, M, b2 * r2])
        text = request_json("MUL_MAT", [a, b], d, arch)
        spec = prepare(parse_request(text))
        self.assertEqual(spec.gemv, gemv, "the GEMV takes it" if gemv else "the GEMM takes it")
        rng = random.Random(seed)
        a_bytes, av = _random_rows(a, rng)
        b_bytes, bv = _random_rows(tensor("f32", list(b.ne)), rng)
        if x == "bf16":
            # bf16 activations: the f32 values rounded, stored as their top halves.
            bv = _bf16(bv)
            b_bytes = (bv.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        got = np.frombuffer(run_request(text, [a_bytes, b_bytes]), np.float32)
        got = got.astype(np.float64).reshape(1, b2 * r2, M, N)
        want, err = _reference(a, b, av, bv, spec.weight_bytes or not gemv)
        bad = ~(np.abs(got - want) <= err + 2e-6 * np.abs(want))
        if bad.any():
            self.fail(
                f"{ty} M={M} N={N} K={K} on {arch} ({spec.plan}): {int(bad.sum())} of "
                f"{got.size} wrong, first at {np.argwhere(bad)[0]}: {got[bad][0]} vs "
                f"{want[bad][0]}"
            )
        return spec

    def test_weight_types_off_the_grid(self):
        # (Up to 8 rows of block-quantized weights take the GEMV of several rows.)
        cases = [
            ("q4_0", "aie2", 13, 44, 256),
            ("q4_0", "aie2p", 21, 100, 512),
            ("q8_0", "aie2p", 13, 44, 256),
            ("q8_0", "aie2", 10, 36, 128),
            ("q4_K", "aie2p", 37, 72, 512),
            ("q4_K", "aie2", 12, 20, 256),
            ("q6_K", "aie2", 9, 40, 256),
            ("q6_K", "aie2p", 11, 66, 512),
            ("f16", "aie2p", 21, 100, 96),
            ("f16", "aie2", 7, 12, 48),
        ]
        for n, (ty, arch, M, N, K) in enumerate(cases):
            with self.subTest(ty=ty, arch=arch, M=M, N=N, K=K):
                spec = self.check(ty, arch, M, N, K, seed=n)
                # Off the grid: the last M block or N round starts early.
                p = spec.plan
                self.assertTrue(M % p.m_block or N % p.n_block)

    def test_batches_broadcast_src0(self):
        # src0 [K, N, 2] over src1 [K, M, 4]: src1 batches 0-1 use weight matrix 0.
        self.check("q4_0", "aie2p", 10, 24, 256, b2=2, r2=2, seed=20)
        self.check("q6_K", "aie2", 8, 16, 256, b2=2, r2=2, seed=21)

    def test_a_tiles_split_the_k_step(self):
        # K-quant K steps of 256 values with A in tiles of fewer columns: each core takes a
        # K step's A tiles one by one against the same weight tile.
        for ty, arch in (("q4_K", "aie2p"), ("q6_K", "aie2")):
            with self.subTest(ty=ty, arch=arch):
                spec = self.check(ty, arch, 136, 256, 1024, seed=40)
                self.assertGreater(spec.plan.a_split, 1)
        # q6_K's K steps are pairs of blocks (420 bytes a row: whole DMA words): A in tiles of
        # a piece's 32 columns, so that 32 rows of A fit beside 32 weight rows.
        spec = self.check("q6_K", "aie2p", 128, 256, 512, seed=41)
        self.assertEqual((spec.plan.m, spec.plan.k, spec.plan.a_split), (32, 512, 16))

    def test_gemv_with_x_shared_by_every_core(self):
        # One src1 row over 960 weight rows: x from one shim channel to every core, the
        # weights over the 2 C - 1 others (GemvPlan.shared_x), two cores each.
        for ty, arch in (("q4_0", "aie2p"), ("q6_K", "aie2"), ("f16", "aie2p"), ("f32", "aie2")):
            with self.subTest(ty=ty, arch=arch):
                spec = self.check(ty, arch, 1, 960, 256, seed=50, gemv=True)
                p = spec.plan
                self.assertTrue(p.shared_x)
                self.assertEqual((p.columns, p.rows), (2 * spec.arch.columns - 1, 2))

    def test_prompt_tiles_held_once(self):
        # A prompt's GEMM on aie2p: each A feed over two shims joined by its memory tile, and
        # m = 64 rows with one C tile (q4_0) or one C and one weight tile (q4_K), N off the
        # grid.
        for ty, (M, N, K), depths in (
            ("q4_0", (512, 520, 256), (2, 1)),
            ("q4_K", (512, 520, 256), (1, 1)),
        ):
            with self.subTest(ty=ty):
                p = self.check(ty, "aie2p", M, N, K, seed=60).plan
                self.assertEqual((p.m, p.a_channels, p.b_depth, p.c_depth), (64, 2, *depths))

    def test_bf16_activations(self):
        # A prompt's activations written as bf16 for its GEMMs: the A tiles move half the
        # bytes and the cores take them as they come; on aie2p over two shims per feed.
        for ty, arch, (M, N, K) in (
            ("q4_0", "aie2p", (512, 520, 256)),
            ("q6_K", "aie2p", (128, 256, 512)),
            ("q4_K", "aie2", (37, 72, 512)),
            ("f16", "aie2", (21, 100, 96)),
        ):
            with self.subTest(ty=ty, arch=arch):
                spec = self.check(ty, arch, M, N, K, seed=70, x="bf16")
                self.assertEqual(spec.plan.a_size, 2)
                self.assertEqual(spec.core.defines.get("A_BF16"), 1)

    def test_more_k_steps(self):
        # K over several K steps: the C tile accumulates across them.
        spec = self.check("q4_0", "aie2p", 70, 136, 4096, seed=30)
        self.assertGreater(spec.plan.k_steps, 1)


if __name__ == "__main__":
    unittest.main()
