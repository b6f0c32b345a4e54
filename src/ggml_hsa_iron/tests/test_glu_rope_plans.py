"""The GLU and ROPE plans' DMA walks, in pure Python: every column's fill of a strided GLU
input reads exactly the view's elements in logical order, and ROPE's positions walk gives
every row positions[i2]; shapes the walks cannot take are refused (exit 2)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools
import unittest

from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import Tensor, parse_request

from ggml_hsa_iron.tests.util import request_json, tensor


def walk(offset, sizes, strides):
    """Element indices of a 4-D access pattern, outermost dimension first."""
    for idx in itertools.product(*(range(n) for n in sizes)):
        yield offset + sum(i * s for i, s in zip(idx, strides))


def half_view(dtype, ne):
    """One half (ne0 elements of each row) of a dense [2 ne0, ...] tensor, the fused GLU
    form; offsets relative to the view's first element."""
    full = Tensor.dense(dtype, (2 * ne[0],) + tuple(ne[1:]))
    return Tensor(dtype, tuple(ne), full.nb)


class GluWalkTest(unittest.TestCase):
    def test_strided_halves_are_read_row_by_row_in_logical_order(self):
        for dtype, ne, arch in (
            ("f32", (5, 7, 11, 13), "aie2p"),
            ("f16", (128, 2, 2, 2), "aie2"),
            ("bf16", (2048, 3, 1, 1), "aie2p"),  # rows longer than one DMA wrap of words
        ):
            with self.subTest(dtype=dtype, ne=ne):
                x = half_view(dtype, ne)
                out = tensor(dtype, ne)
                spec = prepare(parse_request(request_json("SWIGLU", [x, out], out, arch=arch)))
                p = spec.plan
                self.assertEqual(p.column_chunk % ne[0], 0)
                stride = x.nb[1] // x.size
                want = [
                    r * stride + i for r in range(p.n // ne[0]) for i in range(ne[0])
                ]  # logical order of the view
                got = []
                for c in range(p.columns):
                    offset, sizes, strides = spec.fill_tap(0, c * p.column_chunk, p.column_chunk)
                    got += list(walk(offset, sizes, strides))
                    # the two wrap-limited dimensions in 32-bit words
                    words = sizes[3] * x.size // 4
                    self.assertLessEqual(words, 1023)
                    self.assertLessEqual(sizes[2], 1023)
                self.assertEqual(got, want)
                # the dense input 1 is read linearly
                self.assertEqual(spec.fill_tap(1, 0, 8), (0, (1, 1, 1, 8), (0, 0, 0, 1)))
                # the runtime argument spans the view: last row's end
                self.assertGreaterEqual(spec.sequence[0][1], want[-1] + 1)

    def test_rows_that_are_not_whole_words_are_refused(self):
        x = half_view("f16", (5, 7, 1, 1))
        out = tensor("f16", (5, 7))
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("GEGLU", [x, x], out)))

    def test_rows_not_one_stride_apart_are_refused(self):
        ne = (8, 3, 2, 1)
        x = Tensor("f32", ne, (4, 64, 1000, 2000))  # dimension 2 not ne1 rows further
        out = tensor("f32", ne)
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("REGLU", [x, out], out)))


def rope_request(ne, n_dims=None, ff=False, arch="aie2p"):
    x = tensor("f32", ne)
    n_dims = n_dims or ne[0]
    ins = [x, tensor("i32", [ne[2]])] + ([tensor("f32", [n_dims // 2])] if ff else [])
    params = [0, n_dims, 0, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0]
    return request_json("ROPE_FF" if ff else "ROPE", ins, x, arch=arch, op_params=params)


class RopeWalkTest(unittest.TestCase):
    def test_every_row_gets_its_position(self):
        for ne, ff in (
            ((128, 32, 2, 1), False),
            ((16, 16, 8192, 1), True),
            ((128, 5, 3, 4), False),
            ((64, 1, 7, 1), True),
        ):
            with self.subTest(ne=ne, ff=ff):
                spec = prepare(parse_request(rope_request(ne, ff=ff)))
                p = spec.plan
                rows = ne[1] * ne[2] * ne[3]
                self.assertEqual(p.n, rows)
                head = ne[0] // 2 if ff else 0
                got = []
                for c in range(p.columns):
                    taps = [spec.pos_tap(c * p.column_chunk)] + ([spec.ff_tap()] if ff else [])
                    for _, sizes, strides in taps:
                        # one linear walk each: no dimension repeats data
                        self.assertEqual(list(sizes[:3]), [1, 1, 1])
                        self.assertEqual(strides[3], 1)
                    table = list(walk(*spec.pos_tap(c * p.column_chunk)))
                    self.assertEqual(head + len(table), spec.table_words)
                    # rope.cc: row j of the column takes table[(j / ne1) % ne2]
                    got += [table[(j // ne[1]) % ne[2]] for j in range(p.column_chunk)]
                want = [(r // ne[1]) % ne[2] for r in range(rows)]
                self.assertEqual(got, want)
                if ff:
                    self.assertEqual(list(walk(*spec.ff_tap())), list(range(ne[0] // 2)))

    def test_static_arrays_tiles_and_table_fit_a_core(self):
        spec = prepare(parse_request(rope_request((512, 8, 512, 1), n_dims=128, ff=True)))
        p = spec.plan
        tile_bytes = 2 * (2 * p.tile * 512 * 4)  # x and out tiles, 2 buffers each
        static = 6 * 4 * 64  # rope.cc's HALF_PAD arrays
        self.assertLessEqual(tile_bytes + static + 4 * spec.table_words, spec.arch.l1_budget)
        self.assertEqual(spec.table_words, 64 + min(512, p.column_chunk // 8))

    def test_unsupported_modes_and_views_are_refused(self):
        params = [0, 128, 8, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0]  # mrope
        x = tensor("f32", (128, 4, 2))
        req = request_json("ROPE", [x, tensor("i32", [2])], x, op_params=params)
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(req))
        view = Tensor("f32", (128, 4, 2, 1), (4, 1024, 4096, 8192))
        params[2] = 0
        req = request_json("ROPE", [view, tensor("i32", [2])], x, op_params=params)
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(req))

    def test_output_types_same_as_x_or_f16_from_f32(self):
        params = [0, 64, 0, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0]
        ne = (64, 8, 5, 1)
        pos = tensor("i32", [5])
        accepted = (("f32", "f32"), ("f16", "f16"), ("f32", "f16"))
        for xt, ot in itertools.product(("f32", "f16", "bf16"), repeat=2):
            with self.subTest(x=xt, out=ot):
                req = request_json("ROPE", [tensor(xt, ne), pos], tensor(ot, ne), op_params=params)
                if (xt, ot) in accepted:
                    spec = prepare(parse_request(req))
                    # the runtime sequence's output and the core's output type are the output's
                    self.assertEqual(spec.sequence[-1][0], ot)
                    want = "uint16_t" if ot == "f16" else "float"
                    self.assertEqual(spec.core.defines["OUT_T"], want)
                else:
                    with self.assertRaises(UnsupportedError):
                        prepare(parse_request(req))
        # f16 rows of an odd length are not whole 32-bit words (f32 ones are)
        odd = (63, 8, 1, 1)
        params[1] = 62
        one = tensor("i32", [1])
        prepare(
            parse_request(
                request_json(
                    "ROPE", [tensor("f32", odd), one], tensor("f32", odd), op_params=params
                )
            )
        )
        with self.assertRaises(UnsupportedError):
            req = request_json(
                "ROPE", [tensor("f32", odd), one], tensor("f16", odd), op_params=params
            )
            prepare(parse_request(req))
        # one shape
        with self.assertRaises(UnsupportedError):
            req = request_json(
                "ROPE", [tensor("f32", ne), pos], tensor("f16", (64, 8, 5, 2)), op_params=params
            )
            prepare(parse_request(req))


if __name__ == "__main__":
    unittest.main()
