"""fa_rows.h's decode_f16_pairs (the decode attention's f16 K and V rows, mv_fa.h) on the
host: every f16 bit pattern in rows of 64 and 128 values, consecutive patterns (rows of normal
numbers take the shift-and-mask path, rows with zeros, subnormals, infinities or NaNs the exact
one) and shuffled (one odd value sends a whole row to the exact path), against numpy's f16 to
f32 conversion, bit for bit (NaN payloads included). Built for aie2 and aie2p. Skipped when no
host C++ compiler or numpy is installed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import random
import subprocess
import tempfile
import unittest

from ggml_hsa_iron.tests import host_program
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_kernels_host import HERE, KERNELS

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None


def decode(patterns: list[int], arch: str, row: int) -> list[int]:
    """The f32 bits the driver gives for f16 `patterns` (rows of `row` values), in order."""
    words = [patterns[i] | patterns[i + 1] << 16 for i in range(0, len(patterns), 2)]
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "words.txt"
        data.write_text(" ".join(f"{w:x}" for w in words))
        cmd = ["-std=c++20", "-O1", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
        arch_define = {"aie2": 20, "aie2p": 21}[arch]
        cmd += [f"-D__AIE_ARCH__={arch_define}", f"-DROW={row}"]
        exe = host_program.build([*cmd, str(HERE / "host" / "f16_pairs_driver.cc")])
        out = subprocess.run([str(exe), str(data)], check=True, capture_output=True, text=True)
    return [int(v, 16) for v in out.stdout.split()]


@unittest.skipUnless(CXX and np is not None, "no host C++ compiler or numpy")
class F16PairsHostTest(unittest.TestCase):
    def check(self, patterns: list[int], arch: str, row: int):
        got = decode(patterns, arch, row)
        want = np.array(patterns, dtype=np.uint16).view(np.float16).astype(np.float32)
        want = want.view(np.uint32).tolist()
        bad = [(hex(p), hex(g), hex(w)) for p, g, w in zip(patterns, got, want) if g != w]
        self.assertEqual(bad[:5], [], f"{len(bad)} of {len(patterns)} values differ")

    def test_every_pattern(self):
        every = list(range(1 << 16))
        shuffled = every[:]
        random.Random(7).shuffle(shuffled)
        for arch, row in (("aie2p", 64), ("aie2", 128)):
            with self.subTest(arch=arch, row=row):
                self.check(every, arch, row)
                self.check(shuffled, arch, row)


if __name__ == "__main__":
    unittest.main()
