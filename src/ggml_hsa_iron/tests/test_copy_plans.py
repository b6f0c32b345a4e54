"""The copy plans' DMA walks and SET_ROWS' side objects, in pure Python: every column of a
CPY / CONT reads and writes exactly its share of the logical order, SET_ROWS covers every
destination row once per slab with the slab's indices and rows, CPY_ROWS drains every row
into its own output, and what the DMA cannot walk is refused (exit 2); CPY_ROWS through the
emulation against numpy."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.plans_copy import shim_walk_ok
from ggml_hsa_iron.request import Tensor, parse_request

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_json, tensor

try:
    import ml_dtypes
    import numpy as np

    from ggml_hsa_iron.tests.util_emu_seq import arg_bytes, buffer_of, new_buffer, run_spec_in_order

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False


def walk(offset, sizes, strides):
    for idx in itertools.product(*(range(n) for n in sizes)):
        yield offset + sum(i * s for i, s in zip(idx, strides))


def logical(t: Tensor):
    """Element offsets of t in logical (row-major) order."""
    ne, nb = t.ne, [b // t.size for b in t.nb]
    for i3, i2, i1, i0 in itertools.product(*(range(n) for n in reversed(ne))):
        yield i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3]


def permuted(dtype, ne, order):
    """A view of shape ne whose dimensions are those of a dense tensor permuted by order."""
    base = [ne[order.index(d)] for d in range(4)]
    dense = Tensor.dense(dtype, tuple(base))
    return Tensor(dtype, tuple(ne), tuple(dense.nb[order[d]] for d in range(4)))


class CopyWalkTest(unittest.TestCase):
    def test_every_column_walks_its_share_of_the_logical_order(self):
        cases = (
            ("CONT", permuted("f32", (64, 7, 4, 1), (0, 2, 1, 3)), tensor("f32", (64, 7, 4))),
            ("CPY", permuted("f32", (6, 5, 4, 3), (1, 0, 3, 2)), tensor("f16", (6, 5, 4, 3))),
            ("CPY", tensor("f32", (256, 10)), tensor("bf16", (2560,))),
            ("DUP", permuted("bf16", (32, 3, 2, 1), (0, 2, 1, 3)), tensor("f32", (32, 3, 2))),
        )
        for op, src, dst in cases:
            for arch in ("aie2", "aie2p"):
                with self.subTest(op=op, src=src, arch=arch):
                    spec = prepare(parse_request(request_json(op, [src], dst, arch=arch)))
                    p = spec.plan
                    want_src, want_dst = list(logical(src)), list(logical(dst))
                    got_src, got_dst = [], []
                    for c in range(p.columns):
                        start = c * p.column_chunk
                        tap = spec.fill_tap(start, p.column_chunk)
                        self.assertTrue(shim_walk_ok(tap[1], tap[2], src.size), tap)
                        got_src += list(walk(*tap))
                        got_dst += list(walk(*spec.drain_tap(start, p.column_chunk)))
                    self.assertEqual(got_src, want_src)
                    self.assertEqual(got_dst, want_dst)
                    # Sizes are runtime arguments: one core object per type combination.
                    self.assertNotIn("TILE", spec.core.defines)

    def test_what_word_dma_cannot_walk_is_refused(self):
        # A transposed f16 view (2-byte elements 20 bytes apart) and odd byte counts.
        t = Tensor("f16", (10, 10, 1, 1), (20, 2, 200, 200))
        for src, dst in ((t, tensor("f16", (10, 10))), (tensor("f16", (7,)), tensor("f16", (7,)))):
            with self.assertRaises(UnsupportedError):
                prepare(parse_request(request_json("CPY", [src], dst)))
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("CPY", [tensor("i32", (8,))], tensor("f32", (8,)))))

    def test_a_stride_0_view_is_refused_but_a_repeat_is_walkable(self):
        # An expanded view: 6 rows that are all one row (nb[1] = 0) re-read by an address
        # dimension, which a BD cannot encode; the same re-reading as the repeat is fine.
        self.assertFalse(shim_walk_ok((1, 1, 6, 8), (0, 0, 0, 1), 4))
        self.assertTrue(shim_walk_ok((6, 1, 1, 8), (0, 0, 0, 1), 4))
        src = Tensor("f32", (8, 6, 1, 1), (4, 0, 32, 32))
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("CPY", [src], tensor("f32", (8, 6)))))
        # SET_ROWS' source rows likewise; with a row stride they are walked.
        idx, dst = tensor("i32", (6,)), tensor("f32", (8, 16))
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("SET_ROWS", [src, idx], dst)))
        strided = Tensor("f32", (8, 6, 1, 1), (4, 64, 384, 384))
        prepare(parse_request(request_json("SET_ROWS", [strided, idx], dst)))


class SetRowsPlanTest(unittest.TestCase):
    def test_tiles_cover_each_slab_and_side_objects_carry_indices_then_rows(self):
        # llama's K write (one token into a 256-row cache), a V-cache write with rows of one
        # element (a transposed V cache), and indices repeated over slabs.
        cases = (
            (tensor("f32", (64, 1)), tensor("i64", (1,)), tensor("f16", (64, 256))),
            (tensor("f32", (1, 64)), tensor("i64", (64,)), tensor("f16", (1, 4096))),
            (tensor("f32", (32, 2, 2, 3)), tensor("i32", (2, 1, 3)), tensor("bf16", (32, 9, 2, 3))),
        )
        for src, idx, dst in cases:
            for arch in ("aie2", "aie2p"):
                with self.subTest(src=src.ne, dst=dst, arch=arch):
                    spec = prepare(
                        parse_request(request_json("SET_ROWS", [src, idx], dst, arch=arch))
                    )
                    rows = []
                    for i2, i3 in spec.slabs:
                        for c in range(spec.columns):
                            off, sizes, strides = spec.dst_tap(i2, i3, c)
                            rows += list(walk(off, sizes, strides))
                        i_off, i_sizes, _ = spec.idx_tap(i2, i3)
                        s_off, s_sizes, _ = spec.src_tap(i2, i3)
                        moved = i_sizes[-1] + s_sizes[-2] * s_sizes[-1]
                        self.assertEqual(moved, spec.side_elems)
                        self.assertEqual(
                            i_off * src.size,
                            (i2 % idx.ne[1]) * idx.nb[1] + (i3 % idx.ne[2]) * idx.nb[2],
                        )
                    self.assertEqual(rows, list(range(dst.nelements)))
                    self.assertEqual(spec.rows_per_column % spec.tile_rows, 0)
                    budget = 4 * spec.tile_rows * dst.ne[0] * dst.size + spec.side_elems * src.size
                    self.assertLessEqual(budget, spec.arch.l1_budget)

    def test_a_long_prefill_batch_is_refused(self):
        src, idx, dst = tensor("f32", (1024, 64)), tensor("i64", (64,)), tensor("f16", (1024, 512))
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(request_json("SET_ROWS", [src, idx], dst)))


if __name__ == "__main__":
    unittest.main()


def cpy_rows_request(src, n_out, dtype, arch="aie2p"):
    """CPY_ROWS of src [ne0, T] into n_out rows [ne0] of dtype."""
    rows = [tensor(dtype, (src.ne[0],)) for _ in range(n_out)]
    return request_json("CPY_ROWS", [src], rows[0], arch=arch, extra_outputs=rows[1:])


class CopyRowsTest(unittest.TestCase):
    """CPY_ROWS: T rows into T one-row outputs (a step of several sequences writing a row of
    each one's cache): CPY's dataflow, each column's share drained into the rows it spans."""

    def test_every_element_lands_in_its_row_once(self):
        for ne0, T, dtype, arch in ((512, 4, "f16", "aie2p"), (128, 8, "f16", "aie2"),
                                    (64, 3, "bf16", "aie2p"), (256, 2, "f32", "aie2")):  # fmt: skip
            with self.subTest(ne0=ne0, T=T, dtype=dtype, arch=arch):
                src = tensor("f32", (ne0, T))
                spec = prepare(parse_request(cpy_rows_request(src, T, dtype, arch)))
                self.assertEqual(spec.kind, "copy_rows")
                self.assertEqual(len(spec.sequence), 1 + T)
                written = []
                for c in range(spec.plan.columns):
                    for row, tap in spec.drains(c):
                        written += [(row, i) for i in walk(*tap)]
                self.assertEqual(sorted(written), [(t, i) for t in range(T) for i in range(ne0)])

    def test_refusals(self):
        src = tensor("f32", (512, 4))
        with self.assertRaises(RequestError):
            prepare(parse_request(cpy_rows_request(src, 3, "f16")))  # 4 rows, 3 outputs
        with self.assertRaises(UnsupportedError):
            prepare(parse_request(cpy_rows_request(tensor("f32", (64, 9)), 9, "f16")))
        with self.assertRaises(UnsupportedError):
            # Rows of 3 f16: a row's drain is not whole 32-bit words.
            prepare(parse_request(cpy_rows_request(tensor("f32", (3, 4)), 4, "f16")))


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class CopyRowsEmulationTest(unittest.TestCase):
    def test_rows_go_to_their_outputs(self):
        for ne0, T, dtype, arch in ((512, 4, "f16", "aie2p"), (128, 8, "bf16", "aie2")):
            with self.subTest(ne0=ne0, T=T, dtype=dtype, arch=arch):
                src = tensor("f32", (ne0, T))
                spec = prepare(parse_request(cpy_rows_request(src, T, dtype, arch)))
                rng = np.random.default_rng(T)
                x = rng.standard_normal((T, ne0)).astype(np.float32)
                args = [buffer_of(x)] + [new_buffer(n) for n in arg_bytes(spec)[1:]]
                run_spec_in_order(spec, args)
                np_type = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}[dtype]
                for t in range(T):
                    got = np.frombuffer(args[1 + t].tobytes(), np_type)
                    # Rounded to nearest even, as ggml-cpu's conversion.
                    want = x[t].astype(np_type)
                    self.assertEqual(got.tobytes(), want.tobytes(), f"row {t}")
