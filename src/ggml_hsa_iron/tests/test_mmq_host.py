"""kernels/mmq.cc (MUL_MAT's GEMM over f16 and block-quantized weights) on the host.

One core's work as the design gives it: K steps of an A tile (f32, in the r x s block layout
the memory tile delivers) and a B tile (n weight rows of whole blocks, the bytes ggml stores),
accumulated into one C tile (r x t blocks). Random blocks of every type (test_mvq_host's
generator) are decoded by test_mvq_host's own reading of ggml's block layouts into the weights
the vector decoder forms (`kernel_values`, the GEMV's); the kernel's results are compared with
sum(w * bf16(a)) in exact arithmetic (the kernel rounds the activations to bf16, round to
nearest even, and sums exact products in f32), so the difference is f32 summation error only.
A wrong decode, a row or block misplaced in the decoded staging buffer or in the C layout, or a
K step not accumulated fails.
Built for aie2 and aie2p (their bf16 mmul shapes differ: 4x8x4 and 4x8x8). Skipped when no
host C++ compiler is installed.
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
from ggml_hsa_iron.tests import host_program
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_kernels_host import HERE, KERNELS, bf16_round, f32
from ggml_hsa_iron.tests.test_mvq_host import kernel_values, random_block

TYPES = ("f16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K")


def a_blocked(a, m, k, r, s):
    """An m x k row-major tile in the r x s block layout (blocks i < m/r, kk < k/s)."""
    return [
        a[(i * r + rr) * k + kk * s + ss]
        for i in range(m // r)
        for kk in range(k // s)
        for rr in range(r)
        for ss in range(s)
    ]


def c_position(e, n, r, t):
    """(row, column) of element e of a C tile of r x t blocks (blocks i < m/r, j < n/t)."""
    blk, within = divmod(e, r * t)
    bi, bj = divmod(blk, n // t)
    return bi * r + within // t, bj * t + within % t


def run(ty, arch, m, n, k, steps, a_split=1):
    """(kernel's C as an m x n row-major list, reference, magnitudes) for random data."""
    r, s, t = ARCHS[arch].mmul["bf16"]
    rng = random.Random(f"{ty}{arch}{m}{n}{k}")
    block = DTYPES[ty].block
    lines = [str(steps)]
    want = [0.0] * (m * n)
    mag = [0.0] * (m * n)
    for _ in range(steps):
        a = [f32(rng.uniform(-1, 1)) for _ in range(m * k)]
        rows = [[random_block(ty, rng) for _ in range(k // block)] for _ in range(n)]
        # The K step's A in a_split tiles of ak columns, each in the r x s block layout.
        ak = k // a_split
        for h in range(a_split):
            part = [a[i * k + h * ak + j] for i in range(m) for j in range(ak)]
            lines.append(" ".join(float.hex(v) for v in a_blocked(part, m, ak, r, s)))
        lines.append(" ".join(f"{v:x}" for row in rows for blk in row for v in blk))
        w = [[v for blk in row for v in kernel_values(ty, blk)] for row in rows]
        for i in range(m):
            ai = [bf16_round(v) for v in a[i * k : (i + 1) * k]]
            for j in range(n):
                prods = [x * y for x, y in zip(ai, w[j])]
                want[i * n + j] += sum(prods)
                mag[i * n + j] += sum(abs(p) for p in prods)
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "input.txt"
        data.write_text("\n".join(lines) + "\n")
        cmd = ["-std=c++20", "-O1", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
        cmd += [f"-DMVQ_{ty.upper()}=1", f"-DMM_R={r}", f"-DMM_S={s}", f"-DMM_T={t}"]
        cmd += [f"-DTILE_M={m}", f"-DTILE_N={n}", f"-DTILE_K={k}", f"-DA_SPLIT={a_split}"]
        cmd += [f"-D__AIE_ARCH__={ {'aie2': 20, 'aie2p': 21}[arch] }"]
        cmd += [str(HERE / "host" / "mmq_driver.cc")]
        exe = host_program.build(cmd)
        out = subprocess.run([str(exe), str(data)], check=True, capture_output=True, text=True)
    got_blocked = [float.fromhex(v) for v in out.stdout.split()]
    got = [None] * (m * n)
    for e, v in enumerate(got_blocked):
        i, j = c_position(e, n, r, t)
        got[i * n + j] = v
    return got, want, mag


@unittest.skipUnless(CXX, "no host C++ compiler")
class MmqHostTest(unittest.TestCase):
    def check(self, ty, arch, m, n, k, steps, a_split=1):
        got, want, mag = run(ty, arch, m, n, k, steps, a_split)
        self.assertEqual(len(got), m * n)
        for e, (g, v, a) in enumerate(zip(got, want, mag)):
            tol = a * 2.0**-20 + 1e-30
            self.assertLessEqual(abs(g - v), tol, f"{ty} {arch} C[{e // n}, {e % n}]: {g} vs {v}")

    def test_every_type_on_both_archs(self):
        for ty in TYPES:
            block = DTYPES[ty].block
            # Two weight blocks per row along K (f16: 32 values), two column blocks of t
            # rows, two row blocks of r, two K steps.
            k = max(2 * block, 32)
            for arch in ("aie2", "aie2p"):
                _, _, t = ARCHS[arch].mmul["bf16"]
                with self.subTest(ty=ty, arch=arch):
                    self.check(ty, arch, m=8, n=2 * t, k=k, steps=2)

    def test_k_quant_larger_tile(self):
        # One K-quant block per row, more row and column blocks (aie2's 4-wide t).
        self.check("q6_K", "aie2", m=16, n=16, k=256, steps=1)

    def test_a_tiles_split_the_k_step(self):
        # A K step of whole blocks in several A tiles: the K-quants' scales made by a block's
        # first tile and kept for the others; a 32-value block type and f16 take each tile's
        # own blocks.
        for ty, k, a_split in (
            ("q4_K", 512, 8),
            ("q6_K", 256, 4),
            ("q6_K", 512, 16),
            ("q4_0", 128, 2),
            ("f16", 64, 4),
        ):
            for arch in ("aie2", "aie2p"):
                t = ARCHS[arch].mmul["bf16"][2]
                with self.subTest(ty=ty, arch=arch, a_split=a_split):
                    self.check(ty, arch, m=8, n=2 * t, k=k, steps=2, a_split=a_split)


if __name__ == "__main__":
    unittest.main()
