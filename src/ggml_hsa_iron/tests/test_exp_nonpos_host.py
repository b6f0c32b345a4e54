"""ggml_aie.h's exp_nonpos (the attention kernels' softmax exponent) on the host, against exp:
about two million non-positive f32 values, -inf, -0 and NaNs, for aie2 and aie2p. It must give
exp's bits where exp's result is normal and 0 below (x < -87.33); a NaN stays a NaN or gets
exp's value. Skipped when no host C++
compiler is installed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import subprocess
import unittest

from ggml_hsa_iron.tests import host_program
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_kernels_host import HERE, KERNELS


@unittest.skipUnless(CXX, "no host C++ compiler")
class ExpNonPosHostTest(unittest.TestCase):
    def test_matches_exp_where_normal(self):
        for arch, define in (("aie2p", 21), ("aie2", 20)):
            with self.subTest(arch=arch):
                cmd = ["-std=c++20", "-O1", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
                cmd += [f"-D__AIE_ARCH__={define}"]
                exe = host_program.build([*cmd, str(HERE / "host" / "exp_nonpos_driver.cc")])
                out = subprocess.run([str(exe)], check=True, capture_output=True, text=True)
                last = out.stdout.strip().splitlines()[-1].split()
                self.assertGreater(int(last[1]), 2_000_000)
                self.assertEqual(int(last[3]), 0, out.stdout)


if __name__ == "__main__":
    unittest.main()
