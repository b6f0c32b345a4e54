"""RMS_NORM_MUL: rms_norm(x) * w per row, f32 or bf16 out (the backend writes a prompt's
activations as bf16 where only GEMMs read them: ops::bf16_activations).

End to end: the row design compiled for `--target emu` and run on real data (tests/util_emu.py)
against numpy's ggml-cpu order (the norm rounded to f32, times w), the bf16 output that f32
rounded to nearest even once; on aie2p and aie2, rows off the column grid.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import struct
import unittest

from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tests.util import request_json, tensor

try:
    import numpy as np
    from ml_dtypes import bfloat16

    from ggml_hsa_iron.tests.util_emu import have_tools, run_request

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

EPS = 1e-5


def request(ne, out="f32", arch="aie2p"):
    eps = struct.unpack("<i", struct.pack("<f", EPS))[0]
    ins = [tensor("f32", ne), tensor("f32", [ne[0]])]
    return request_json("RMS_NORM_MUL", ins, tensor(out, ne), arch=arch, op_params=[eps])


class PlanTest(unittest.TestCase):
    def test_bf16_output(self):
        spec = prepare(parse_request(request([2048, 512], "bf16")))
        self.assertEqual(spec.core.defines["OUT_BF16"], 1)
        self.assertEqual(spec.sequence[-1], ("bf16", 2048 * 512))
        # bf16 rows of an odd length are not whole words; f16 is not an output.
        for ne, out in (([63, 4], "bf16"), ([64, 4], "f16")):
            with self.subTest(ne=ne, out=out), self.assertRaises(UnsupportedError):
                prepare(parse_request(request(ne, out)))


@unittest.skipUnless(HAVE_NUMPY and have_tools(), "numpy and a C++ compiler are needed")
class EmulationTest(unittest.TestCase):
    def check(self, ne, out, arch, seed):
        rng = np.random.default_rng(seed)
        rows = int(np.prod(ne[1:]))
        x = rng.standard_normal((rows, ne[0])).astype(np.float32)
        w = rng.uniform(0.5, 1.5, ne[0]).astype(np.float32)
        data = run_request(request(ne, out, arch), [x.tobytes(), w.tobytes()])
        mean = (x.astype(np.float64) ** 2).mean(axis=1, keepdims=True)
        want = ((x / np.sqrt(mean + EPS)).astype(np.float32) * w).astype(np.float32)
        if out == "bf16":
            got = np.frombuffer(data, bfloat16).astype(np.float32).reshape(rows, ne[0])
            # The f32 result (within a few f32 ulps of numpy's) rounded to nearest even once:
            # equal but where an f32 value lies next to a rounding boundary, and there one
            # bf16 ulp apart (a truncation would differ in about half the values).
            rounded = want.astype(bfloat16).astype(np.float32)
            ulp = np.abs(rounded) * 2.0**-7
            self.assertTrue((np.abs(got - rounded) <= ulp).all(), f"{ne} {arch}")
            self.assertLess(int((got != rounded).sum()), want.size // 100 + 1, f"{ne} {arch}")
            return
        got = np.frombuffer(data, np.float32).reshape(rows, ne[0])
        err = np.abs(got - want).max()
        self.assertLess(err, 1e-5 * max(1.0, np.abs(want).max()), f"{ne} {arch}: {err}")

    def test_rows(self):
        for ne, out, arch, seed in (
            ([2048, 19], "bf16", "aie2p", 1),
            ([256, 7, 2], "bf16", "aie2", 2),
            ([1152, 5], "f32", "aie2p", 3),
        ):
            with self.subTest(ne=ne, out=out, arch=arch):
                self.check(ne, out, arch, seed)


if __name__ == "__main__":
    unittest.main()
