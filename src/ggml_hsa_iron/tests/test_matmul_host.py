"""The MUL_MAT core functions (mm.cc, mv.cc) run on the host against the AIE API stand-in.

For a request, the plan the design uses gives every core's input objects and where its
results go (tests/util_matmul.py: the shim DMA tasks, the memory tile's split, broadcast,
join and re-layouts); tests/host/matmul_driver.cc runs the core functions on those
objects with g++, built with the defines the real build passes to Peano. The result is
compared with a plain-Python matrix product (ggml's MUL_MAT with batch broadcasting):
integers exactly, floats within f32 summation error of the product of the values the
kernel multiplies (the GEMM rounds f32 operands to bf16 for the bf16 microkernel). This
checks the kernels' arithmetic and the data movement plan together, not that Peano
accepts the kernels. Skipped when no host C++ compiler is installed.
"""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import math
import random
import subprocess
import tempfile
import unittest

from ggml_hsa_iron.tests import host_program
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_kernels_host import HERE, KERNELS, bf16_round, f32
from ggml_hsa_iron.tests.test_tiling import mul_mat_spec, stream_of
from ggml_hsa_iron.tests.util_matmul import check_structure

INT_RANGE = {"i8": 100, "i16": 2000}


def values(dtype, count, rng):
    if dtype in INT_RANGE:
        r = INT_RANGE[dtype]
        return [rng.randint(-r, r) for _ in range(count)]
    xs = [f32(rng.uniform(-2.0, 2.0)) for _ in range(count)]
    return [bf16_round(x) for x in xs] if dtype == "bf16" else xs


def driver_input(spec, src0, src1) -> str:
    cores = stream_of(spec)
    steps = spec.plan.k_steps
    first, second, outs = ("w", "x", "y") if spec.gemv else ("a", "b", "c")
    lines = [f"{len(src0)} {len(src1)} {spec.dst.nelements} {len(cores)}"]
    lines.append(" ".join(float.hex(float(v)) if isinstance(v, float) else str(v) for v in src0))
    lines.append(" ".join(float.hex(float(v)) if isinstance(v, float) else str(v) for v in src1))
    for core in cores.values():
        lines.append(f"{len(core[outs])} {steps}")
        for t, dest in enumerate(core[outs]):
            for s in range(steps):
                lines.append(" ".join(map(str, core[first][t * steps + s])))
                lines.append(" ".join(map(str, core[second][t * steps + s])))
            lines.append(" ".join(map(str, dest)))
    return "\n".join(lines) + "\n"


def run_driver(spec, src0, src1) -> list:
    defines = dict(spec.core.defines)
    defines["GEMV"] = int(spec.gemv)
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "input.txt"
        data.write_text(driver_input(spec, src0, src1))
        cmd = ["-std=c++20", "-O0", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
        cmd += [f"-D{k}={v}" for k, v in defines.items()]
        cmd += [str(HERE / "host" / "matmul_driver.cc")]
        exe = host_program.build(cmd)
        out = subprocess.run([str(exe), str(data)], check=True, capture_output=True, text=True)
    result = []
    for line in out.stdout.splitlines():
        _, v = line.split()
        result.append(int(v) if v.lstrip("-").isdigit() else float.fromhex(v))
    return result


def reference(spec, src0, src1):
    """ggml's MUL_MAT: dst[b, i, j] = sum_k src1[b, i, k] * src0[b0, j, k] (b0 by ggml's
    broadcast), and sum_k |products| for the float tolerance."""
    K, N = spec.src0.ne[0], spec.src0.ne[1]
    M = spec.src1.ne[1]
    s0, s1 = spec.src0.ne, spec.src1.ne
    r2, r3 = s1[2] // s0[2], s1[3] // s0[3]
    want, mag = [], []
    for i13 in range(s1[3]):
        for i12 in range(s1[2]):
            b0 = (i13 // r3) * s0[2] + i12 // r2
            b1 = i13 * s1[2] + i12
            for i in range(M):
                x = src1[(b1 * M + i) * K : (b1 * M + i + 1) * K]
                for j in range(N):
                    w = src0[(b0 * N + j) * K : (b0 * N + j + 1) * K]
                    prods = [a * b for a, b in zip(x, w)]
                    want.append(sum(prods))
                    mag.append(sum(abs(p) for p in prods))
    return want, mag


@unittest.skipUnless(CXX, "no host C++ compiler")
class MatmulHostTest(unittest.TestCase):
    def check(self, arch, w, x, M, N, K, b2=1, b3=1, r2=1, r3=1, gemv=None):
        spec = mul_mat_spec(arch, w, x, M, N, K, b2, b3, r2, r3)
        if gemv is not None:
            self.assertEqual(spec.gemv, gemv)
        check_structure(spec, stream_of(spec))
        rng = random.Random(f"{arch}{w}{x}{M}{N}{K}")
        src0 = values(w, spec.src0.nelements, rng)
        src1 = values(x, spec.src1.nelements, rng)
        got = run_driver(spec, src0, src1)
        if not spec.gemv and spec.compute == "bf16":
            # The GEMM's bf16 microkernel multiplies bf16-rounded operands.
            src0 = [bf16_round(v) for v in src0]
            src1 = [bf16_round(v) for v in src1]
        elif spec.gemv and (w, x) == ("bf16", "f32"):
            # The GEMV rounds f32 x to bf16 against bf16 weights, as ggml's CPU backend does;
            # other pairs it computes in f32.
            src1 = [bf16_round(v) for v in src1]
        want, mag = reference(spec, src0, src1)
        self.assertEqual(len(got), len(want))
        if w in INT_RANGE:
            self.assertEqual(got, want)
            return spec
        for i, (g, v, m) in enumerate(zip(got, want, mag)):
            self.assertFalse(math.isnan(g), f"dst[{i}] never written")
            self.assertLessEqual(abs(g - v), 2e-6 * m + 1e-30, f"dst[{i}]: {g} vs {v}")
        return spec

    def test_gemm(self):
        cases = [
            ("aie2", "bf16", "f32", 13, 44, 48),  # M and N off the grid: overlapping blocks
            ("aie2p", "f32", "f32", 9, 20, 64),
            ("aie2", "i8", "i8", 8, 16, 32),
            ("aie2p", "i8", "i8", 12, 20, 32),  # 8-row microkernel, M off its grid
            ("aie2p", "i16", "i16", 6, 12, 16),
            ("aie2", "bf16", "bf16", 16, 64, 128),
        ]
        for case in cases:
            with self.subTest(case=case):
                self.check(*case, gemv=False)

    def test_gemm_batches_broadcast_src0(self):
        # src0 [32, 16, 2, 1] over src1 [32, 8, 4, 1]: src1 batches 0-1 use matrix 0.
        spec = self.check("aie2p", "bf16", "bf16", 8, 16, 32, b2=2, r2=2, gemv=False)
        self.assertEqual(len(spec.batches), 4)

    def test_gemv(self):
        cases = [
            ("aie2p", "bf16", "f32", 1, 37, 48, 2, 1),  # N prime: the last round overlaps
            ("aie2", "f32", "f32", 1, 5, 2051),  # odd K: chunks of 293, a vector tail
            ("aie2", "bf16", "f32", 3, 16, 256),  # M below the GEMM's rows
            ("aie2p", "f32", "f32", 16, 16, 4),  # K below a GEMM K step (test-backend-ops)
            ("aie2", "i8", "i8", 1, 20, 64, 1, 2),
            ("aie2p", "bf16", "bf16", 2, 9, 40),  # bf16 multiply-accumulate, tail of 8
        ]
        for case in cases:
            with self.subTest(case=case):
                self.check(*case, gemv=True)


if __name__ == "__main__":
    unittest.main()
