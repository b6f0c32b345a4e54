"""RMS_NORM_MUL_ADD: rms_norm(x) * w + r per row (gemma's norms after the attention and the
block, ahead of the residual ADD), the row design with r's rows beside x's.

* the plan: r travels as SOFT_MAX's mask does (the second input channel, one task per run of
  rows), w resident; the refusals (r not f32 or not x's shape, w not one row);
* end to end: the design compiled for `--target emu` and run on real data (tests/util_emu.py)
  against numpy's ggml-cpu order (the norm rounded to f32, times w, plus r), on aie2p and
  aie2, rows off the column grid and out in r's memory's place (the same bytes in, in place).
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

    from ggml_hsa_iron.tests.util_emu import have_tools, run_request

    HAVE_NUMPY = True
except ImportError:  # numpy is installed by scripts/check-iron.sh
    HAVE_NUMPY = False

EPS = 1e-6


def request(ne, arch="aie2p", r=None, w=None):
    x = tensor("f32", ne)
    ins = [x, r or tensor("f32", ne), w or tensor("f32", [ne[0]])]
    eps = struct.unpack("<i", struct.pack("<f", EPS))[0]
    return request_json("RMS_NORM_MUL_ADD", ins, x, arch=arch, op_params=[eps])


class PlanTest(unittest.TestCase):
    def test_r_travels_as_a_mask(self):
        spec = prepare(parse_request(request([2048, 3])))
        self.assertIs(spec.mask, spec.request.inputs[1])
        self.assertIs(spec.weight, spec.request.inputs[2])
        self.assertEqual(spec.core.defines["GGML_OP_RMS_NORM_MUL_ADD"], 1)
        self.assertEqual([t for t, _ in spec.sequence], ["f32"] * 4)

    def test_refusals(self):
        for kw in (
            {"r": tensor("f16", [64, 4])},
            {"r": tensor("f32", [64, 1])},
            {"w": tensor("f32", [64, 4])},
        ):
            with self.subTest(kw=kw), self.assertRaises(UnsupportedError):
                prepare(parse_request(request([64, 4], **kw)))


@unittest.skipUnless(HAVE_NUMPY and have_tools(), "numpy and a C++ compiler are needed")
class EmulationTest(unittest.TestCase):
    def check(self, ne, arch, seed):
        rng = np.random.default_rng(seed)
        rows = int(np.prod(ne[1:]))
        x = rng.standard_normal((rows, ne[0])).astype(np.float32)
        r = rng.standard_normal((rows, ne[0])).astype(np.float32)
        w = rng.uniform(0.5, 1.5, ne[0]).astype(np.float32)
        out = run_request(request(ne, arch), [x.tobytes(), r.tobytes(), w.tobytes()])
        got = np.frombuffer(out, np.float32).reshape(rows, ne[0])
        mean = (x.astype(np.float64) ** 2).mean(axis=1, keepdims=True)
        norm = (x / np.sqrt(mean + EPS)).astype(np.float32)
        want = (norm * w).astype(np.float32) + r
        err = np.abs(got - want).max()
        self.assertLess(err, 1e-5 * max(1.0, np.abs(want).max()), f"{ne} {arch}: {err}")

    def test_rows(self):
        self.check([2304, 1], "aie2p", 1)  # gemma2-2B's n_embd, a decode step
        self.check([256, 7, 2], "aie2", 2)
        self.check([1152, 5], "aie2p", 3)


if __name__ == "__main__":
    unittest.main()
