"""COUNT_EQUAL and CROSS_ENTROPY_LOSS: the plan and its refusals, the core functions
(kernels/reduce.cc) built with g++ against the AIE-API stand-in, and the design run end to end
through the emulation target (tests/util_emu.py) against numpy references of ggml-cpu."""

import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.plans_reduce import MAX_CHUNK, MEMTILE_INPUTS
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tests.util import request_json, tensor

try:
    import numpy as np

    from ggml_hsa_iron.tests.util_emu import have_tools, run_request

    HAVE_EMU = have_tools()
except ImportError:  # numpy is installed by scripts/check-iron.sh
    HAVE_EMU = False

CXX = shutil.which("g++") or shutil.which("clang++")
PACKAGE = Path(__file__).resolve().parents[1]


def count_equal(ne, arch="aie2p", types=("i32", "i32", "i64"), out_ne=(1,)):
    return request_json(
        "COUNT_EQUAL", [tensor(types[0], ne), tensor(types[1], ne)], tensor(types[2], out_ne), arch
    )


def cross_entropy(ne, arch="aie2p", ne_b=None):
    return request_json(
        "CROSS_ENTROPY_LOSS",
        [tensor("f32", ne), tensor("f32", ne_b or ne)],
        tensor("f32", [1]),
        arch,
    )


def ce_reference(x, labels, row):
    """ggml-cpu's CROSS_ENTROPY_LOSS in float64: -(1/rows) sum(labels * log_softmax(x))."""
    x = x.astype(np.float64).reshape(-1, row)
    lab = labels.astype(np.float64).reshape(-1, row)
    m = x.max(axis=1, keepdims=True)
    st = (x - m) - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return -(st * lab).sum() / x.shape[0]


class PlanTest(unittest.TestCase):
    def test_shares_and_chunks(self):
        for ne, arch in (([500], "aie2p"), ([5000], "aie2"), ([12345], "aie2p"), ([7], "aie2")):
            s = prepare(parse_request(count_equal(ne, arch)))
            p, n = s.plan, ne[0]
            with self.subTest(ne=ne, arch=arch):
                self.assertLessEqual(p.columns, min(s.arch.columns, MEMTILE_INPUTS))
                self.assertEqual(p.columns * p.per_column, n)
                self.assertEqual(p.per_column % p.chunk, 0)
                self.assertLessEqual(p.chunk, MAX_CHUNK)
                shares = [s.share(c) for c in range(p.columns)]
                self.assertEqual(
                    [o for o, _ in shares], [c * p.per_column for c in range(p.columns)]
                )
        # The loss: whole rows per column, chunks dividing a row.
        for ne in ([10, 5, 4, 3], [30000, 1, 1, 1], [33, 7]):
            s = prepare(parse_request(cross_entropy(ne)))
            p = s.plan
            with self.subTest(ne=ne):
                self.assertEqual(p.per_column % ne[0], 0)
                self.assertEqual(ne[0] % p.chunk, 0)
                self.assertEqual(s.core.defines["ROW_CHUNKS"] * p.chunk, ne[0])
        # 60 rows over aie2p's 8 columns: 6 at most (the memory tile's input channels), and 6
        # divides 60.
        self.assertEqual(prepare(parse_request(cross_entropy([10, 5, 4, 3]))).plan.columns, 6)
        # 30000 f32 in one row: one column, chunks of 2000.
        p = prepare(parse_request(cross_entropy([30000]))).plan
        self.assertEqual((p.columns, p.chunk, p.iterations), (1, 2000, 15))

    def test_refusals(self):
        cases = [
            count_equal([16], types=("f32", "f32", "i64")),
            count_equal([16], types=("i32", "i32", "i32")),
            count_equal([16], out_ne=(2,)),
            count_equal([1 << 16, 1 << 15]),  # 2^31 elements
            cross_entropy([16, 2], ne_b=[16, 3]),
            request_json(
                "CROSS_ENTROPY_LOSS",
                [tensor("f32", [8]), tensor("f32", [8])],
                tensor("f32", [2]),
            ),
        ]
        for r in cases:
            with self.subTest(r=r[:120]), self.assertRaises(UnsupportedError):
                prepare(parse_request(r))


@unittest.skipUnless(CXX and HAVE_EMU, "no host C++ compiler or numpy")
class CoreFunctionTest(unittest.TestCase):
    """reduce.cc called as one reducing core and the combining core call it, on chunks."""

    def run_core(self, defines, a, b, parts_of):
        """Feeds `a` and `b` (float32 or int32) to ggml_reduce_chunk in CHUNK pieces, split
        into `parts_of` cores' shares, and returns the combined result's bytes."""
        chunk = defines["CHUNK"]
        ctype = "float" if a.dtype == np.float32 else "int32_t"
        ptype = "float" if a.dtype == np.float32 else "int64_t"
        n = a.size
        src = f"""
#include <cstdio>
#include <cstdint>
#include "reduce.cc"
int main() {{
  static {ctype} a[{n}], b[{n}];
  FILE *f = fopen(\"in.bin\", \"rb\");
  if (fread(a, sizeof a, 1, f) != 1 || fread(b, sizeof b, 1, f) != 1) return 1;
  alignas(64) {ctype} ca[{chunk}], cb[{chunk}];
  {ptype} parts[{parts_of}], out[1];
  const int share = {n // parts_of};
  for (int p = 0; p < {parts_of}; ++p) {{
    ggml_reduce_begin();
    for (int i = p * share; i < (p + 1) * share; i += {chunk}) {{
      for (int j = 0; j < {chunk}; ++j) {{ ca[j] = a[i + j]; cb[j] = b[i + j]; }}
      ggml_reduce_chunk(ca, cb);
    }}
    ggml_reduce_end(parts + p);
  }}
  ggml_reduce_combine(parts, out);
  fwrite(out, sizeof out, 1, stdout);
  return 0;
}}
"""
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "t.cc").write_text(src)
            (Path(d) / "in.bin").write_bytes(a.tobytes() + b.tobytes())
            cmd = [CXX, "-std=c++20", "-O1", f"-I{PACKAGE / 'emu' / 'include'}"]
            cmd += [f"-I{PACKAGE / 'kernels'}", "-D__AIE_ARCH__=21", f"-DN_PARTS={parts_of}"]
            cmd += [f"-D{k}={v}" for k, v in defines.items()]
            cmd += [str(Path(d) / "t.cc"), "-o", f"{d}/t"]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
            return subprocess.run([f"{d}/t"], cwd=d, check=True, capture_output=True).stdout

    def test_count_equal(self):
        rng = np.random.default_rng(3)
        # Chunks with and without a tail of fewer than 16 lanes; values that differ only in
        # the sign bit or the lowest bit must not count.
        for chunk, parts in ((16, 1), (37, 3), (64, 2)):
            n = chunk * parts * 5
            a = rng.integers(-3, 3, n).astype(np.int32)
            b = a.copy()
            flip = rng.random(n) < 0.4
            b[flip] ^= np.int32(1)
            b[: n // 10] = np.where(b[: n // 10] == 0, np.int32(-(2**31)), b[: n // 10])
            d = {"GGML_OP_COUNT_EQUAL": 1, "CHUNK": chunk}
            got = np.frombuffer(self.run_core(d, a, b, parts), dtype=np.int64)[0]
            with self.subTest(chunk=chunk, parts=parts):
                self.assertEqual(got, int((a == b).sum()))

    def test_cross_entropy_loss_online_over_chunks(self):
        rng = np.random.default_rng(4)
        for row, chunk, parts, rows in ((64, 16, 2, 4), (45, 9, 3, 6), (200, 200, 1, 3)):
            x = rng.uniform(-100, 100, rows * row).astype(np.float32)
            # Rows ascending: the max rises with every chunk (each chunk rescales the sums).
            x[:row] = np.sort(x[:row])
            lab = rng.uniform(0, 1, rows * row).astype(np.float32)
            d = {
                "GGML_OP_CROSS_ENTROPY_LOSS": 1,
                "CHUNK": chunk,
                "ROW_CHUNKS": row // chunk,
                "TOTAL_ROWS": rows,
            }
            got = np.frombuffer(self.run_core(d, x, lab, parts), dtype=np.float32)[0]
            want = ce_reference(x, lab, row)
            with self.subTest(row=row, chunk=chunk, parts=parts):
                self.assertLess(abs(got - want), 1e-4 * abs(want) + 1e-4)


@unittest.skipUnless(HAVE_EMU, "numpy or a host C++ compiler is missing")
class EmulatedTest(unittest.TestCase):
    def test_count_equal(self):
        rng = np.random.default_rng(5)
        for ne, arch in (
            ([500], "aie2p"),
            ([5000], "aie2"),
            ([4999], "aie2p"),
            ([6, 4, 3], "aie2"),
        ):
            n = int(np.prod(ne))
            a = rng.integers(0, 4, n).astype(np.int32)
            b = rng.integers(0, 4, n).astype(np.int32)
            out = run_request(count_equal(ne, arch), [a.tobytes(), b.tobytes()])
            with self.subTest(ne=ne, arch=arch):
                self.assertEqual(np.frombuffer(out, dtype=np.int64)[0], int((a == b).sum()))

    def test_cross_entropy_loss(self):
        rng = np.random.default_rng(6)
        for ne, arch in (
            ([10, 5, 4, 3], "aie2p"),
            ([10, 5, 4, 3], "aie2"),
            ([30000], "aie2p"),
            ([33, 7], "aie2"),
        ):
            n = int(np.prod(ne))
            x = rng.uniform(-100, 100, n).astype(np.float32)
            lab = rng.uniform(-100, 100, n).reshape(-1, ne[0])
            lab = np.exp(lab - lab.max(axis=1, keepdims=True))
            lab = (lab / lab.sum(axis=1, keepdims=True)).astype(np.float32).reshape(-1)
            out = run_request(cross_entropy(ne, arch), [x.tobytes(), lab.tobytes()])
            got = np.frombuffer(out, dtype=np.float32)[0]
            want = ce_reference(x, lab, ne[0])
            with self.subTest(ne=ne, arch=arch):
                self.assertLess(abs(got - want), 1e-5 * abs(want))


if __name__ == "__main__":
    unittest.main()
