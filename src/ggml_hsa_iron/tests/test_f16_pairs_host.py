"""ggml_aie.h's half_pairs_to_f32 (the decode attention's f16 K and V rows, mv_fa.h) on the
host: every f16 bit pattern, in words of consecutive patterns (vectors of normal numbers take
the shift-and-mask path, the zeros, subnormals, infinities and NaNs the exact fallback) and in
shuffled words (one odd value sends a whole vector to the fallback), against numpy's f16 to
f32 conversion, bit for bit (NaN payloads included). Built for aie2 and aie2p. Skipped when no
host C++ compiler or numpy is installed."""

import random
import subprocess
import tempfile
import unittest
from pathlib import Path

from ggml_hsa_iron.tests import host_program
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_kernels_host import HERE, KERNELS

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

VEC = 16


def decode(patterns: list[int], arch: str) -> list[int]:
    """The f32 bits the driver gives for f16 `patterns` (a multiple of 2 VEC), in order."""
    words = [patterns[i] | patterns[i + 1] << 16 for i in range(0, len(patterns), 2)]
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "words.txt"
        data.write_text(" ".join(f"{w:x}" for w in words))
        cmd = ["-std=c++20", "-O1", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
        cmd += [f"-D__AIE_ARCH__={ {'aie2': 20, 'aie2p': 21}[arch] }"]
        exe = host_program.build([*cmd, str(HERE / "host" / "f16_pairs_driver.cc")])
        out = subprocess.run([str(exe), str(data)], check=True, capture_output=True, text=True)
    return [int(v, 16) for v in out.stdout.split()]


@unittest.skipUnless(CXX and np is not None, "no host C++ compiler or numpy")
class F16PairsHostTest(unittest.TestCase):
    def check(self, patterns: list[int], arch: str):
        got = decode(patterns, arch)
        want = np.array(patterns, dtype=np.uint16).view(np.float16).astype(np.float32)
        want = want.view(np.uint32).tolist()
        bad = [(hex(p), hex(g), hex(w)) for p, g, w in zip(patterns, got, want) if g != w]
        self.assertEqual(bad[:5], [], f"{len(bad)} of {len(patterns)} values differ")

    def test_every_pattern(self):
        every = list(range(1 << 16))
        shuffled = every[:]
        random.Random(7).shuffle(shuffled)
        for arch in ("aie2p", "aie2"):
            with self.subTest(arch=arch):
                self.check(every, arch)
                self.check(shuffled, arch)


if __name__ == "__main__":
    unittest.main()
