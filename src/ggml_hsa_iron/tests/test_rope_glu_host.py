"""The GLU and ROPE core functions and the f16 conversions, built for the host with g++
against the AIE API stand-in (as tests/test_kernels_host.py does for the other kernels) with
the defines `plans.prepare` gives, and compared with numpy references of ggml's semantics.
Skipped without a host C++ compiler or numpy."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools
import struct
import subprocess
import tempfile
import unittest

from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request

from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests import host_program, sample
from ggml_hsa_iron.tests.host_program import CXX

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
ARCH_DEFINE = {"aie2": 20, "aie2p": 21}


def fbits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def build(tmp: Path, source: str, defines: dict, driver: str, arch: str) -> Path:
    cmd = ["-std=c++20", "-O1", f"-I{PACKAGE / 'emu' / 'include'}"]
    cmd += [f"-I{PACKAGE / 'kernels'}", f"-D__AIE_ARCH__={ARCH_DEFINE[arch]}"]
    cmd += [f"-D{k}={v}" for k, v in defines.items()] + [f"-DDRIVER_{driver}=1"]
    cmd += [
        "-include",
        str(PACKAGE / "kernels" / source),
        str(HERE / "host" / "rope_glu_driver.cc"),
    ]
    return host_program.build(cmd)


@unittest.skipUnless(CXX and np is not None, "no host C++ compiler or numpy")
class F16Test(unittest.TestCase):
    def test_every_f16_round_trips_and_f32_rounds_to_nearest_even(self):
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            exe = build(tmp, "ggml_aie.h", {}, "F16", "aie2p")
            every = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
            rng = np.random.default_rng(7)
            # Random f32 bit patterns across the whole range, ties and halfway points of f16.
            rand = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
            ties = (np.arange(65536, dtype=np.uint32) << 13 | 0x1000).view(np.float32)
            values = np.concatenate([every, rand.view(np.float32), ties[:30000]])
            values.tofile(tmp / "in.bin")
            subprocess.run([exe, tmp / "in.bin", tmp / "out.bin", str(len(values))], check=True)
            raw = (tmp / "out.bin").read_bytes()
            n = len(values)
            bits = np.frombuffer(raw[: 2 * n], dtype=np.uint16)
            back = np.frombuffer(raw[2 * n :], dtype=np.float32)
            with np.errstate(all="ignore"):
                want = values.astype(np.float16)  # numpy rounds to nearest even
            nan = np.isnan(values)
            np.testing.assert_array_equal(bits[~nan], want.view(np.uint16)[~nan])
            self.assertTrue(np.isnan(bits[nan].view(np.float16)).all())
            np.testing.assert_array_equal(back[~nan], want.astype(np.float32)[~nan])
            # f16 -> f32 is exact for every pattern (the first 65536 values came from f16).
            np.testing.assert_array_equal(back[:65536][~nan[:65536]], every[~nan[:65536]])


def walk(offset, sizes, strides):
    """Element indices of an access pattern, outermost dimension first."""
    for idx in itertools.product(*(range(n) for n in sizes)):
        yield offset + sum(i * s for i, s in zip(idx, strides))


def glu_ref(op: str, x, g):
    x, g = x.astype(np.float64), g.astype(np.float64)
    with np.errstate(all="ignore"):
        if op == "REGLU":
            act = np.where(x > 0, x, 0.0)
        elif op == "GEGLU":
            act = 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))
        elif op == "SWIGLU":
            act = x / (1 + np.exp(-x))
        elif op == "GEGLU_ERF":
            from math import erf

            act = 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))
        else:
            act = x / (1 + np.exp(-1.702 * x))
    return act * g


@unittest.skipUnless(CXX and np is not None, "no host C++ compiler or numpy")
class GluHostTest(unittest.TestCase):
    def test_every_glu_op_in_f32_and_f16_on_both_archs(self):
        rng = np.random.default_rng(3)
        n = 128 * 8
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            for op in ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK"):
                for dtype, npt, rtol in (("f32", np.float32, 2e-5), ("f16", np.float16, 2e-3)):
                    for arch in ("aie2", "aie2p"):
                        with self.subTest(op=op, dtype=dtype, arch=arch):
                            t = tensor(dtype, [128, 8])
                            spec = prepare(parse_request(request_json(op, [t, t], t, arch=arch)))
                            defs = dict(spec.core.defines)
                            defs["TILE"] = 128  # whole tiles over n (the driver's loop)
                            exe = build(tmp, "eltwise.cc", defs, "GLU", arch)
                            x = rng.uniform(-150, 150, n).astype(npt)
                            g = rng.uniform(-150, 150, n).astype(npt)
                            x[:8] = [0, -0.0, 1e-3, -1e-3, 88.5, -88.5, 10, -10]
                            x.tofile(tmp / "a.bin")
                            g.tofile(tmp / "b.bin")
                            subprocess.run(
                                [exe, tmp / "a.bin", tmp / "b.bin", tmp / "o.bin", str(n)],
                                check=True,
                            )
                            got = np.fromfile(tmp / "o.bin", dtype=npt).astype(np.float64)
                            want = glu_ref(op, x.astype(np.float32), g.astype(np.float32))
                            with np.errstate(all="ignore"):
                                want = want.astype(npt).astype(np.float64)
                            # Values reach 150 * 150; near-underflow results (gelu(-x) and
                            # the like) may differ by tiny absolute amounts.
                            # GEGLU_ERF: erf's absolute error (1.5e-7, Abramowitz & Stegun
                            # 7.1.26) is relative to 1 + erf(x), small in the negative tail.
                            tol = max(rtol, 3e-4) if op == "GEGLU_ERF" else rtol
                            np.testing.assert_allclose(got, want, rtol=tol, atol=1e-5)


def rope_ref(x, pos, ff, n_dims, neox, theta_scale, freq_scale, ext, mscale, low, den):
    """ggml-cpu's ROPE in f32 (the theta recurrence and YaRN ramp rounded as ggml does)."""
    f = np.float32
    rows, ne0 = x.shape
    out = x.astype(np.float32).copy()
    half = n_dims // 2
    for r in range(rows):
        theta = f(pos[r])
        c = np.empty(half, np.float64)
        s = np.empty(half, np.float64)
        for i in range(half):
            extrap = f(theta / f(ff[i])) if ff is not None else theta
            interp = f(f(freq_scale) * extrap)
            th = interp
            if ext != 0:
                y = f(f(f(i) - f(low)) / f(den))
                y = min(f(1), max(f(0), y))
                mix = f(f(f(1) - y) * f(ext))
                th = f(f(interp * f(f(1) - mix)) + f(extrap * mix))
            c[i] = f(np.cos(np.float64(th))) * mscale
            s[i] = f(np.sin(np.float64(th))) * mscale
            theta = f(theta * f(theta_scale))
        xr = x[r].astype(np.float64)
        ia = np.arange(half) if neox else 2 * np.arange(half)
        ib = ia + half if neox else ia + 1
        out[r, ia] = xr[ia] * c - xr[ib] * s
        out[r, ib] = xr[ia] * s + xr[ib] * c
    return out


@unittest.skipUnless(CXX and np is not None, "no host C++ compiler or numpy")
class RopeHostTest(unittest.TestCase):
    def test_rope_modes_types_yarn_and_frequency_factors(self):
        rng = np.random.default_rng(5)
        ne0, ne1, ne2 = 40, 3, 4
        cases = [
            # n_dims, mode, freq_scale, ext_factor, attn_factor, ff, x/output type, arch, ne3
            (32, 0, 1.0, 0.0, 1.0, False, "f32", "aie2p", 1),
            (32, 2, 1.4245, 0.7465, 1.4245, True, "f32", "aie2", 2),
            (40, 0, 1.4245, 0.7465, 1.0, False, "f16", "aie2p", 3),
            (16, 2, 1.0, 0.0, 1.4245, True, "f16", "aie2", 1),
            # f32 rotated into f16 rows (ROPE fused with the f16 KV-cache write), the tail
            # past n_dims rounded too
            (24, 0, 1.4245, 0.7465, 1.0, True, "f32>f16", "aie2", 2),
            (40, 2, 1.0, 0.0, 1.4245, False, "f32>f16", "aie2p", 1),
        ]
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            for n_dims, mode, fs, ef, af, use_ff, types, arch, ne3 in cases:
                with self.subTest(n_dims=n_dims, mode=mode, ef=ef, ff=use_ff, types=types):
                    dtype, _, out_dtype = types.partition(">")
                    out_dtype = out_dtype or dtype
                    rows = ne1 * ne2 * ne3
                    x = tensor(dtype, [ne0, ne1, ne2, ne3])
                    out = tensor(out_dtype, [ne0, ne1, ne2, ne3])
                    ins = [x, tensor("i32", [ne2])] + (
                        [tensor("f32", [n_dims // 2])] if use_ff else []
                    )
                    params = [0, n_dims, mode, 0, 4096, fbits(10000.0), fbits(fs), fbits(ef)]
                    params += [fbits(af), fbits(32.0), fbits(1.0)]
                    op = "ROPE_FF" if use_ff else "ROPE"
                    spec = prepare(
                        parse_request(request_json(op, ins, out, arch=arch, op_params=params))
                    )
                    exe = build(tmp, "rope.cc", dict(spec.core.defines), "ROPE", arch)
                    npt = np.float32 if dtype == "f32" else np.float16
                    out_npt = np.float32 if out_dtype == "f32" else np.float16
                    xv = rng.uniform(-1, 1, (rows, ne0)).astype(npt)
                    pos = rng.integers(0, 4096, ne2).astype(np.int32)
                    ff = rng.uniform(0.9, 1.1, n_dims // 2).astype(np.float32)
                    # Per column, as the design runs it: the table object from the design's
                    # taps (factors, then positions), the column's rows dealt to its workers.
                    p = spec.plan
                    chunk = p.column_chunk
                    got = []
                    for c in range(p.columns):
                        table = []
                        if use_ff:
                            table += [ff.view(np.int32)[i] for i in walk(*spec.ff_tap())]
                        table += [pos[i] for i in walk(*spec.pos_tap(c * chunk))]
                        self.assertEqual(len(table), spec.table_words)
                        xv[c * chunk : (c + 1) * chunk].tofile(tmp / "x.bin")
                        np.array(table, dtype=np.int32).tofile(tmp / "t.bin")
                        subprocess.run(
                            [exe, tmp / "x.bin", tmp / "t.bin", tmp / "o.bin", str(chunk)]
                            + [str(p.rows)],
                            check=True,
                        )
                        o = np.fromfile(tmp / "o.bin", dtype=out_npt)
                        got.append(o.reshape(chunk, ne0))
                    got = np.concatenate(got).astype(np.float64)
                    row_pos = pos[(np.arange(rows) // ne1) % ne2]  # ggml: positions[i2]
                    consts = {
                        k: struct.unpack("<f", struct.pack("<I", v))[0]
                        for k, v in spec.constants.items()
                    }
                    want = rope_ref(
                        xv.astype(np.float32), row_pos, ff if use_ff else None, n_dims, mode == 2,
                        consts["THETA_SCALE"], fs, ef, consts["MSCALE"], consts["CORR_LOW"],
                        consts["CORR_DEN"],
                    )  # fmt: skip
                    tol = 1e-5 if out_dtype == "f32" else 2e-3
                    np.testing.assert_allclose(got, want, rtol=0, atol=tol * max(1.0, af * 1.2))
                    # the tail past n_dims is copied: bit for bit, or rounded to f16
                    np.testing.assert_array_equal(
                        got[:, n_dims:], xv[:, n_dims:].astype(out_npt).astype(np.float64)
                    )


@unittest.skipUnless(CXX and np is not None, "no host C++ compiler or numpy")
class RopeEmuTest(unittest.TestCase):
    """The whole design in the emulation (every column and worker, the positions table held
    by the cores): each row rotated by its positions[i2]."""

    def test_columns_and_workers_index_the_table(self):
        from ggml_hsa_iron.tests.util_emu import run_request

        rng = np.random.default_rng(11)
        seen = set()
        for ne, ff_on, dtype, arch in (
            ((256, 8, 24, 1), False, "f32", "aie2"),  # 4 columns x 2 workers, 3 tiles each
            ((512, 2, 5, 6), True, "f32", "aie2"),  # whole i3 slices per column, 2 tiles each
            ((512, 6, 10, 1), False, "f16", "aie2p"),  # 3-row tiles: groups across tiles
            ((16, 3, 5, 2), False, "f16", "aie2p"),
        ):
            with self.subTest(ne=ne, ff=ff_on, dtype=dtype):
                n_dims = ne[0]
                x = tensor(dtype, list(ne))
                ins = [x, tensor("i32", [ne[2]])] + (
                    [tensor("f32", [n_dims // 2])] if ff_on else []
                )
                params = [0, n_dims, 0, 0, 0, fbits(10000.0), fbits(1.0), 0, fbits(1.0), 0, 0]
                op = "ROPE_FF" if ff_on else "ROPE"
                text = request_json(op, ins, x, arch=arch, op_params=params)
                spec = prepare(parse_request(text))
                p = spec.plan
                seen.add((p.columns > 1, p.rows > 1, p.iterations > 1))
                rows = ne[1] * ne[2] * ne[3]
                npt = np.float32 if dtype == "f32" else np.float16
                xv = rng.uniform(-1, 1, (rows, ne[0])).astype(npt)
                pos = rng.permutation(1000)[: ne[2]].astype(np.int32)  # distinct positions
                ff = rng.uniform(0.9, 1.1, n_dims // 2).astype(np.float32)
                data = [xv.tobytes(), pos.tobytes()] + ([ff.tobytes()] if ff_on else [])
                got = np.frombuffer(run_request(text, data), dtype=npt).reshape(rows, ne[0])
                consts = {
                    k: struct.unpack("<f", struct.pack("<I", v))[0]
                    for k, v in spec.constants.items()
                }
                want = rope_ref(
                    xv.astype(np.float32), pos[(np.arange(rows) // ne[1]) % ne[2]],
                    ff if ff_on else None, n_dims, False, consts["THETA_SCALE"], 1.0, 0.0,
                    consts["MSCALE"], consts["CORR_LOW"], consts["CORR_DEN"],
                )  # fmt: skip
                tol = 1e-5 if dtype == "f32" else 2e-3
                np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=tol)
        # several columns, several workers per column and several tiles per worker
        self.assertIn((True, True, True), seen)

    def test_a_view_whose_tokens_lie_apart(self):
        """x a view of one product of several projections (phi3's Q or K of one attn_qkv
        matrix): each token's heads contiguous, the tokens a column of the product apart."""
        from ggml_hsa_iron.request import Tensor
        from ggml_hsa_iron.tests.util_emu import run_request

        rng = np.random.default_rng(12)
        for (ne0, ne1, ne2), column, dtype, arch, mode in (
            ((64, 4, 6), 384, "f32", "aie2p", 2),
            ((96, 3, 5), 400, "f32", "aie2", 0),
            ((32, 2, 7), 96, "f16", "aie2p", 2),
        ):
            with self.subTest(ne=(ne0, ne1, ne2), dtype=dtype, arch=arch):
                size = 4 if dtype == "f32" else 2
                nb = (size, ne0 * size, column * size, column * ne2 * size)
                x = Tensor(dtype, (ne0, ne1, ne2, 1), nb)
                out = tensor(dtype, [ne0, ne1, ne2])
                params = [0, ne0, mode, 0, 0, fbits(10000.0), fbits(1.0), 0, fbits(1.0), 0, 0]
                text = request_json("ROPE", [x, tensor("i32", [ne2])], out, arch=arch,
                                    op_params=params)  # fmt: skip
                spec = prepare(parse_request(text))
                npt = np.float32 if dtype == "f32" else np.float16
                product = rng.uniform(-1, 1, (ne2, column)).astype(npt)
                span = (ne2 - 1) * column + ne1 * ne0
                xv = product[:, : ne1 * ne0].reshape(ne2 * ne1, ne0)
                pos = rng.permutation(1000)[:ne2].astype(np.int32)
                data = [product.reshape(-1)[:span].tobytes(), pos.tobytes()]
                got = np.frombuffer(run_request(text, data), dtype=npt).reshape(-1, ne0)
                consts = {
                    k: struct.unpack("<f", struct.pack("<I", v))[0]
                    for k, v in spec.constants.items()
                }
                want = rope_ref(
                    xv.astype(np.float32), pos[np.arange(ne1 * ne2) // ne1], None, ne0,
                    mode == 2, consts["THETA_SCALE"], 1.0, 0.0, consts["MSCALE"],
                    consts["CORR_LOW"], consts["CORR_DEN"],
                )  # fmt: skip
                tol = 1e-5 if dtype == "f32" else 2e-3
                np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=tol)
        # Rows of one token apart, or tokens overlapping, are refused.
        for nb in ((4, 512, 1024, 4096), (4, 256, 512, 4096)):
            with self.subTest(nb=nb):
                x = Tensor("f32", (64, 4, 6, 1), nb)
                params = [0, 64, 0, 0, 0, fbits(10000.0), fbits(1.0), 0, fbits(1.0), 0, 0]
                text = request_json("ROPE", [x, tensor("i32", [6])], tensor("f32", [64, 4, 6]),
                                    op_params=params)  # fmt: skip
                with self.assertRaises(UnsupportedError):
                    prepare(parse_request(text))


@unittest.skipUnless(CXX and np is not None, "no host C++ compiler or numpy")
class RopeF16OutputEmuTest(unittest.TestCase):
    """ROPE fused with the f16 KV-cache write (f32 x, f16 output) in the emulation, on decode
    shapes: Llama-3.2-1B's K (head dim 64, 8 KV heads) and head dim 128, 1 and 5 tokens. The
    f16 rows must be the f32 design's rows rounded to nearest even bit for bit (the same
    arithmetic, then ggml's f32 -> f16 conversion, as ROPE followed by the cache's SET_ROWS),
    and within f16 rounding of the numpy reference."""

    def test_decode_shapes_modes_and_frequency_factors_on_both_archs(self):
        from ggml_hsa_iron.tests.util_emu import run_request

        rng = np.random.default_rng(17)
        shapes = itertools.product((64, 128), (1, 5), (0, 2), (False, True), ("aie2", "aie2p"))
        for head, tokens, mode, ff_on, arch in sample.pick(shapes):
            with self.subTest(head=head, tokens=tokens, mode=mode, ff=ff_on, arch=arch):
                ne = (head, 8, tokens, 1)
                x, out = tensor("f32", list(ne)), tensor("f16", list(ne))
                ins = [x, tensor("i32", [tokens])] + ([tensor("f32", [head // 2])] if ff_on else [])
                # Llama 3's freq_base 500000, n_ctx_orig 8192
                params = [0, head, mode, 0, 8192, fbits(500000.0), fbits(1.0), 0, fbits(1.0)]
                params += [fbits(32.0), fbits(1.0)]
                op = "ROPE_FF" if ff_on else "ROPE"
                text = request_json(op, ins, out, arch=arch, op_params=params)
                spec = prepare(parse_request(text))
                self.assertEqual(spec.core.defines["OUT_T"], "uint16_t")
                rows = 8 * tokens
                xv = rng.uniform(-8, 8, (rows, head)).astype(np.float32)
                pos = (rng.integers(0, 4000) + np.arange(tokens)).astype(np.int32)
                ff = rng.uniform(1.0, 8.0, head // 2).astype(np.float32)
                data = [xv.tobytes(), pos.tobytes()] + ([ff.tobytes()] if ff_on else [])
                got = np.frombuffer(run_request(text, data), dtype=np.float16)
                got = got.reshape(rows, head)
                f32_text = request_json(op, ins, x, arch=arch, op_params=params)
                rotated = np.frombuffer(run_request(f32_text, data), dtype=np.float32)
                np.testing.assert_array_equal(
                    got.view(np.uint16),
                    rotated.astype(np.float16).view(np.uint16).reshape(got.shape),
                )
                consts = {
                    k: struct.unpack("<f", struct.pack("<I", v))[0]
                    for k, v in spec.constants.items()
                }
                want = rope_ref(
                    xv, pos[(np.arange(rows) // 8) % tokens], ff if ff_on else None, head,
                    mode == 2, consts["THETA_SCALE"], 1.0, 0.0, consts["MSCALE"],
                    consts["CORR_LOW"], consts["CORR_DEN"],
                )  # fmt: skip
                # f16's half ulp (2^-11 relative), plus the f32 arithmetic's error
                np.testing.assert_allclose(got.astype(np.float64), want, rtol=5e-4, atol=2e-5)


if __name__ == "__main__":
    unittest.main()
