"""The command line: exit statuses, stdout discipline and the error path without IRON."""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import json
import os
import subprocess
import tempfile
import unittest

from ggml_hsa_iron.request import Tensor
from ggml_hsa_iron.tests.util import request_dict, tensor

SRC = Path(__file__).resolve().parent.parent.parent


def run(args, extra_path=None):
    env = dict(os.environ)
    paths = [str(SRC)]
    if extra_path:
        paths.insert(0, str(extra_path))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run(
        [sys.executable, "-m", "ggml_hsa_iron", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )


class CliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        # A stand-in `aie` package without `aie.iron` shadows any real one, so
        # the test sees the machine without the IRON environment either way.
        shadow = self.dir / "shadow" / "aie"
        shadow.mkdir(parents=True)
        (shadow / "__init__.py").write_text("")
        self.shadow = shadow.parent
        self.out = self.dir / "out"

    def tearDown(self):
        self.tmp.cleanup()

    def compile(self, req):
        path = self.dir / "request.json"
        path.write_text(json.dumps(req) if isinstance(req, dict) else req)
        return run(["compile", "--request", str(path), "--output-dir", str(self.out)], self.shadow)

    def test_without_iron_compile_fails_with_one_clear_line(self):
        t = tensor("f32", [4096])
        r = self.compile(request_dict("ADD", [t, t], t))
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout, "")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("IRON environment is not active", lines[0])
        self.assertIn("aie.iron", lines[0])
        self.assertIn("env_setup.sh", lines[0])
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(self.out.exists() and any(self.out.iterdir()))

    def test_unsupported_requests_exit_2_even_without_iron(self):
        t = tensor("f16", [64])
        r = self.compile(request_dict("ADD", [t, t], t))
        self.assertEqual(r.returncode, 2)
        self.assertIn("f16", r.stderr)
        # COUNT_EQUAL's count is i64: an i32 output is refused.
        i = tensor("i32", [8])
        r = self.compile(request_dict("COUNT_EQUAL", [i, i], tensor("i32", [1])))
        self.assertEqual(r.returncode, 2)
        self.assertIn("COUNT_EQUAL: inputs i32 and an i64 output expected", r.stderr)
        # An op without a design (the backend's host-side ops are never sent).
        r = self.compile(request_dict("ACC", [i, i], i))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no design implements op ACC", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        # ROPE writes x's type, or f16 from f32 (the fused KV-cache write); not f32 from f16.
        x, pos = tensor("f16", [64, 8, 1]), tensor("i32", [1])
        params = [0, 64, 0, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0]
        req = request_dict("ROPE", [x, pos], tensor("f32", [64, 8, 1]), op_params=params)
        r = self.compile(req)
        self.assertEqual(r.returncode, 2)
        self.assertIn("ROPE: x f16", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        # MUL_MAT of a transposed weight view (rows not dense): declared noncontiguous, refused
        # at compile time.
        w = Tensor("f32", (64, 32, 1, 1), (128, 4, 8192, 8192))
        r = self.compile(request_dict("MUL_MAT", [w, tensor("f32", [64])], tensor("f32", [32])))
        self.assertEqual(r.returncode, 2)
        self.assertIn("dense rows", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        # An f16 MUL_MAT output of rows the GEMM takes (the GEMV alone writes f16).
        w, x = tensor("q4_0", [256, 64]), tensor("f32", [256, 16])
        r = self.compile(request_dict("MUL_MAT", [w, x], tensor("f16", [64, 16])))
        self.assertEqual(r.returncode, 2)
        self.assertIn("f16 output is written by the GEMV only", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_malformed_requests_exit_1(self):
        r = self.compile("{nope")
        self.assertEqual(r.returncode, 1)
        self.assertIn("not valid JSON", r.stderr)
        r = run(
            ["compile", "--request", str(self.dir / "missing.json"), "--output-dir", str(self.out)]
        )
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot read the request", r.stderr)

    def test_capabilities_work_without_iron(self):
        r = run(["capabilities"], self.shadow)
        self.assertEqual(r.returncode, 0, r.stderr)
        caps = json.loads(r.stdout)
        self.assertEqual(caps["protocol"], 1)

    def test_usage_errors(self):
        r = run(["frobnicate"])
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stdout, "")


if __name__ == "__main__":
    unittest.main()
