"""The AIE core functions compiled for the host against an AIE API stand-in.

emu/include/aie_api/aie.hpp implements the subset of the AIE API the kernels
use, with the semantics this project reads in the AIE API documentation. The
kernels are built with g++ using the defines the real build passes to Peano
(from `plans.prepare`), run the way the designs run them, and compared with
reference implementations of ggml's ops. This checks the kernels' logic
(indexing, broadcasting, tails, vector math accuracy), not that Peano accepts
them. The case lists over ops, types and shapes take a turn of the rotation
(tests/sample.py); the programs are built once per content (tests/host_program.py).
Skipped when no host C++ compiler is installed.
"""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools
import math
import subprocess
import unittest

from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request

from ggml_hsa_iron.tests import host_program, sample
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_json, tensor

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent / "kernels"


def bf16_round(x: float) -> float:
    import struct

    if math.isnan(x):
        return x
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", u))[0]


def f32(x: float) -> float:
    """x rounded to f32 (NaN and infinities kept)."""
    import struct

    if math.isnan(x) or math.isinf(x):
        return x
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def f32_bits(x: float) -> int:
    import struct

    return struct.unpack("<I", struct.pack("<f", x))[0]


def c_sqrt(x):
    if math.isnan(x) or x == 0:
        return x
    return math.nan if x < 0 else math.sqrt(x)


def c_log(x):
    if math.isnan(x):
        return x
    if x == 0:
        return -math.inf
    return math.nan if x < 0 else math.log(x)


def finite_or_same(fn):
    """C's floorf & co. keep infinities and NaNs."""
    return lambda x: x if (math.isnan(x) or math.isinf(x)) else float(fn(x))


def c_round(x):
    return math.copysign(math.floor(abs(x) + 0.5), x)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x)) if x > -80 else 0.0


UNARY_REF = {
    "ABS": abs,
    "NEG": lambda x: -x,
    "SGN": lambda x: (x > 0) - (x < 0),
    "STEP": lambda x: 1.0 if x > 0 else 0.0,
    "RELU": lambda x: x if x > 0 else 0.0,
    "TANH": math.tanh,
    "ELU": lambda x: x if x > 0 else math.expm1(x),
    "SIGMOID": sigmoid,
    "GELU": lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "GELU_QUICK": lambda x: x * sigmoid(1.702 * x),
    "SILU": lambda x: x * sigmoid(x),
    "HARDSWISH": lambda x: x * min(1.0, max(0.0, (x + 3) / 6)),
    "HARDSIGMOID": lambda x: min(1.0, max(0.0, (x + 3) / 6)),
    "EXP": math.exp,
    "GELU_ERF": lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2))),
    "SQR": lambda x: x * x,
    "SQRT": c_sqrt,
    "LOG": c_log,
    "SIN": lambda x: math.nan if math.isinf(x) else math.sin(x),
    "COS": lambda x: math.nan if math.isinf(x) else math.cos(x),
    "FLOOR": finite_or_same(math.floor),
    "CEIL": finite_or_same(math.ceil),
    "ROUND": finite_or_same(c_round),
    "TRUNC": finite_or_same(math.trunc),
}

INF, NAN = math.inf, math.nan
# Special inputs per op (the first elements of input 0), beyond the random ones in [-4, 4].
ROUNDING_SPECIALS = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.0, -0.0, 0.49999997, -0.49999997,
                     8388607.5, -8388607.5, 8388609.0, -8388609.0, 1e30, -1e30, INF, -INF, NAN,
                     1e-40, -1e-40, 3.0, -3.0, 0.999999, -0.999999]  # fmt: skip
SPECIALS = {
    "FLOOR": ROUNDING_SPECIALS,
    "CEIL": ROUNDING_SPECIALS,
    "ROUND": ROUNDING_SPECIALS,
    "TRUNC": ROUNDING_SPECIALS,
    "SQRT": [0.0, -0.0, -1.0, INF, -INF, NAN, 1e-40, 1e-45, 3e38, 1.0, 2.0, 1e-30, 0.25],
    "LOG": [
        0.0,
        -0.0,
        -1.0,
        INF,
        -INF,
        NAN,
        1e-40,
        1e-45,
        3e38,
        1.0,
        2.0,
        1e-30,
        0.7071067,
        0.7071068,
        1.4142135,
    ],  # fmt: skip
    "SIN": [
        0.0,
        -0.0,
        INF,
        -INF,
        NAN,
        3.14159265,
        -3.14159265,
        1.5707963,
        6.2831853,
        100.0,
        -1000.0,
        5000.0,
        1e-20,
    ],  # fmt: skip
    "COS": [
        0.0,
        -0.0,
        INF,
        -INF,
        NAN,
        3.14159265,
        -3.14159265,
        1.5707963,
        6.2831853,
        100.0,
        -1000.0,
        5000.0,
        1e-20,
    ],  # fmt: skip
    "SQR": [0.0, -0.0, INF, -INF, NAN, 1e20, -1e-20, 3.0],
    "ABS": [0.0, -0.0, INF, -INF, NAN],
    "NEG": [0.0, -0.0, INF, -INF, NAN],
}

BINARY_REF = {
    "ADD": lambda a, b: a + b,
    "SUB": lambda a, b: a - b,
    "MUL": lambda a, b: a * b,
    "DIV": lambda a, b: a / b,
}


def wrap(x, bits):
    x &= (1 << bits) - 1
    return x - (1 << bits) if x >> (bits - 1) else x


def int_binary(op, a, b, bits):
    if op == "ADD":
        return wrap(a + b, bits)
    if op == "SUB":
        return wrap(a - b, bits)
    if op == "MUL":
        return wrap(a * b, bits)
    q = abs(a) // abs(b) if b else 0
    return q if (a >= 0) == (b >= 0) else -q


def parse_value(v: str):
    """An integer, or a C99 hex float ("inf", "-nan" and friends included)."""
    if v.lstrip("-").isdigit():
        return int(v)
    return float.fromhex(v) if "x" in v else float(v)


def run_kernel(spec, extra, specials=()):
    defines = dict(spec.core.defines)
    if specials:
        defines["SPECIALS"] = "{" + ",".join(f"0x{f32_bits(x):08x}u" for x in specials) + "}"
    defines.setdefault("BINARY", 0)
    defines.setdefault("BCAST", 0)
    defines.update(extra)
    p = spec.plan
    defines.update({"PLAN_C": p.columns, "PLAN_R": p.rows, "PLAN_K": p.iterations})
    defines["N_TOTAL"] = p.n  # the elements the design moves
    if spec.kind != "unary":
        defines["N_B"] = spec.bcast_count if spec.kind == "bcast" else p.n
    cmd = ["-std=c++20", "-O0", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
    cmd += [f"-D{k}={v}" for k, v in defines.items()]
    cmd += [str(HERE / "host" / "eltwise_driver.cc")]
    exe = host_program.build(cmd)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    values = {"a": [], "b": [], "o": []}
    for line in out.splitlines():
        tag, v = line.split()
        values[tag].append(parse_value(v))
    return values


@unittest.skipUnless(CXX, "no host C++ compiler")
class HostKernelTest(unittest.TestCase):
    def check_close(self, got, want, rel, what):
        self.assertEqual(len(got), len(want), what)
        for i, (g, w) in enumerate(zip(got, want)):
            if math.isnan(w):
                self.assertTrue(math.isnan(g), f"{what}[{i}]: {g} vs NaN")
                continue
            if math.isinf(w):
                self.assertEqual(g, w, f"{what}[{i}]")
                continue
            self.assertLessEqual(abs(g - w), rel * max(1.0, abs(w)), f"{what}[{i}]: {g} vs {w}")

    def unary(self, op, dtype, n, out_dtype=None, params=(), ref=None, specials=None):
        out_dtype = out_dtype or dtype
        req = parse_request(
            request_json(op, [tensor(dtype, [n])], tensor(out_dtype, [n]), op_params=params)
        )
        spec = prepare(req)
        if specials is None:
            specials = SPECIALS.get(op, ()) if dtype in ("f32", "bf16") else ()
        v = run_kernel(spec, {}, specials)
        self.check_pad(spec, v, n)
        ref = ref or UNARY_REF[op]
        if dtype in ("i8", "i16", "i32"):
            self.assertEqual(v["o"][:n], [int(ref(x)) for x in v["a"][:n]])
            return
        want = [f32(ref(x)) for x in v["a"][:n]]
        if out_dtype == "bf16":
            self.check_close(v["o"][:n], [bf16_round(w) for w in want], 1e-2, op)
        else:
            self.check_close(v["o"][:n], want, 2e-6, op)
        return spec

    def check_pad(self, spec, v, n):
        """The elements past n (the rest of the last DMA word) hold input 0's values when
        input 0 and the output have one type."""
        self.assertEqual(len(v["o"]), spec.plan.n)
        self.assertEqual(spec.padded, spec.plan.n != n)
        if spec.in_types[0] == spec.out_type:
            self.assertEqual(v["o"][n:], v["a"][n:])

    def test_unary_f32_all_ops(self):
        for op in sample.pick(UNARY_REF):
            with self.subTest(op=op):
                self.unary(op, "f32", 200)  # 200 = 12 full vectors + a tail per tile

    def test_unary_bf16(self):
        ops = ("GELU", "SILU", "EXP", "ABS", "SGN", "SQRT", "LOG", "SIN", "ROUND", "FLOOR")
        for op in sample.pick(ops):
            with self.subTest(op=op):
                self.unary(op, "bf16", 256)

    def test_scale_and_clamp(self):
        b = f32_bits
        cases = [
            ("SCALE", (2.0, 0.0), lambda x: x * 2.0),
            ("SCALE", (0.5, -1.25), lambda x: x * 0.5 - 1.25),
            ("SCALE", (-3.0, 0.0), lambda x: x * -3.0),
            ("CLAMP", (-0.5, 0.5), lambda x: max(min(x, 0.5), -0.5)),
            ("CLAMP", (-2.0, 1.0), lambda x: max(min(x, 1.0), -2.0)),
            ("CLAMP", (1.0, -1.0), lambda x: max(min(x, -1.0), 1.0)),  # min > max: ggml gives min
        ]
        both = [(c, dtype) for c in cases for dtype in ("f32", "bf16")]
        for (op, (p0, p1), ref), dtype in sample.pick(both, name=lambda c: repr((c[0][:2], c[1]))):
            with self.subTest(op=op, params=(p0, p1), dtype=dtype):
                params = [b(p0) - (1 << 32 if b(p0) >> 31 else 0), b(p1)]
                params[1] -= 1 << 32 if params[1] >> 31 else 0
                self.unary(op, dtype, 200, params=params, ref=ref, specials=[INF, -INF, 0.0])

    def test_unary_int(self):
        # 3000 elements: tiles of 200 i8, 150 i16 or 125 i32 elements, i.e. whole
        # integer vectors (64, 32 or 16 lanes) and a scalar tail.
        ops = ("ABS", "NEG", "SGN", "RELU", "STEP")
        for op, dtype in sample.pick(itertools.product(ops, ("i8", "i16", "i32"))):
            with self.subTest(op=op, dtype=dtype):
                self.unary(op, dtype, 3000)

    def binary(self, op, ta, tb, to, ne, ne_b):
        a, b, o = tensor(ta, ne), tensor(tb, ne_b), tensor(to, ne)
        spec = prepare(parse_request(request_json(op, [a, b], o)))
        v = run_kernel(spec, {})
        n = o.nelements
        self.check_pad(spec, v, n)
        out_ne = o.ne
        src_ne = b.ne
        want = []
        for flat, x in enumerate(v["a"][:n]):
            idx, f = [], flat
            for d in out_ne:
                idx.append(f % d)
                f //= d
            bi, stride = 0, 1
            for i, s in zip(idx, src_ne):
                bi += (i % s) * stride
                stride *= s
            y = v["b"][bi]
            if ta in ("i8", "i16", "i32"):
                want.append(int_binary(op, x, y, 8 * {"i8": 1, "i16": 2, "i32": 4}[ta]))
            else:
                want.append(BINARY_REF[op](x, y))
        if ta in ("i8", "i16", "i32"):
            self.assertEqual(v["o"][:n], want)
        elif to == "bf16":
            self.check_close(v["o"][:n], [bf16_round(w) for w in want], 1e-2, op)
        else:
            self.check_close(v["o"][:n], want, 2e-6, op)
        return spec

    def test_counts_that_are_not_whole_words(self):
        # ggml's test-backend-ops runs unary ops on 5 x 7 x 11 x 13 = 5005 elements.
        spec = self.unary("GELU", "bf16", 5005)
        self.assertTrue(spec.padded)
        self.assertEqual(spec.plan.n, 5006)
        self.assertEqual(spec.core.defines["N_VALID"], 5005)
        self.unary("SQRT", "bf16", 33, out_dtype="f32")  # f32 output, pad from a bf16 input
        self.unary("ABS", "i8", 1003)
        self.unary("NEG", "i16", 77)
        for op in ("ADD", "DIV"):
            spec = self.binary(op, "bf16", "bf16", "bf16", [77], [77])
            self.assertTrue(spec.padded)
        self.binary("MUL", "bf16", "f32", "f32", [3, 7], [3, 7])
        self.binary("SUB", "i8", "i8", "i8", [1001], [1001])
        # Broadcast: input 1 is moved rounded up to whole words too.
        spec = self.binary("ADD", "bf16", "bf16", "bf16", [5, 3, 3], [5])
        self.assertEqual((spec.kind, spec.bcast_count, spec.plan.n), ("bcast", 6, 46))
        self.binary("MUL", "bf16", "f32", "bf16", [7, 5], [7, 1])
        self.binary("ADD", "i8", "i8", "i8", [3, 5, 3], [3, 1, 3])

    def test_binary_same_shape(self):
        for op in BINARY_REF:
            with self.subTest(op=op):
                spec = self.binary(op, "f32", "f32", "f32", [300], [300])
                self.assertEqual(spec.kind, "binary")
        self.binary("ADD", "bf16", "f32", "bf16", [128, 3], [128, 3])
        self.binary("MUL", "i16", "i16", "i16", [96], [96])
        self.binary("DIV", "i32", "i32", "i32", [64], [64])

    def test_binary_broadcast(self):
        cases = [
            ([16, 10, 4, 3], [16, 1, 1, 1]),  # a row (bias) over every row
            ([16, 10, 4, 3], [1, 10, 1, 1]),  # one value per row
            ([16, 10, 4, 3], [16, 5, 4, 3]),  # repeat along dimension 1
            ([12, 6, 2, 2], [4, 3, 1, 2]),  # repeat inside rows too
            ([10, 5, 4, 3], [10, 5, 1, 1]),
        ]
        for (ne, ne_b), op in sample.pick(itertools.product(cases, ("ADD", "MUL", "DIV"))):
            with self.subTest(ne=ne, ne_b=ne_b, op=op):
                spec = self.binary(op, "f32", "f32", "f32", ne, ne_b)
                self.assertEqual(spec.kind, "bcast")
        self.binary("SUB", "bf16", "f32", "bf16", [64, 8], [64, 1])
        self.binary("ADD", "i32", "i32", "i32", [16, 4], [16, 1])


if __name__ == "__main__":
    unittest.main()
