"""Tiling and alignment arithmetic of the designs."""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools
import math
import unittest

import numpy as np

from ggml_hsa_iron.archs import ARCHS
from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tiling import (
    MAX_REPEAT,
    Broadcast,
    block_starts,
    chunks,
    divisors,
    plan_eltwise,
    plan_gemm,
    plan_gemv,
    round_tasks,
    walk,
    word_multiple,
)

from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests.util_emu import walk_array
from ggml_hsa_iron.tests.util_matmul import check_structure, gemm_streams, gemv_streams

AIE2, AIE2P = ARCHS["aie2"], ARCHS["aie2p"]


def mul_mat_spec(arch, w, x, M, N, K, b2=1, b3=1, r2=1, r3=1):
    """The spec of a MUL_MAT request: src0 [K, N, b2, b3], src1 [K, M, b2*r2, b3*r3]."""
    dst = "i32" if w in ("i8", "i16") else "f32"
    src0 = tensor(w, [K, N, b2, b3])
    src1 = tensor(x, [K, M, b2 * r2, b3 * r3])
    out = tensor(dst, [N, M, b2 * r2, b3 * r3])
    return prepare(parse_request(request_json("MUL_MAT", [src0, src1], out, arch=arch)))


def stream_of(spec):
    return gemv_streams(spec) if spec.gemv else gemm_streams(spec)


def tap_index_array(tap):
    """Every element offset `tap` walks (Tap.indices as a numpy array: a 4096 x 4096 weight's
    taps list millions)."""
    idx = np.array([tap.offset], dtype=np.int64)
    for n, stride in zip(tap.sizes, tap.strides):
        idx = (idx[:, None] + np.arange(n, dtype=np.int64) * stride).ravel()
    return idx


class ArithmeticTest(unittest.TestCase):
    def test_divisors(self):
        self.assertEqual(divisors(1), [1])
        self.assertEqual(divisors(12), [1, 2, 3, 4, 6, 12])
        self.assertEqual(divisors(49), [1, 7, 49])

    def test_word_multiple(self):
        self.assertEqual(word_multiple([4, 4]), 1)
        self.assertEqual(word_multiple([2, 4]), 2)
        self.assertEqual(word_multiple([1, 2]), 4)

    def test_chunks(self):
        self.assertEqual(chunks(130, 64), [(0, 64), (64, 64), (128, 2)])
        self.assertEqual(chunks(0, 64), [])

    def test_walk(self):
        self.assertEqual(walk([(2, 3), (3, 1)]), [0, 1, 2, 3, 4, 5])
        self.assertEqual(walk([(2, 1), (2, 2)]), [0, 2, 1, 3])

    def test_the_emulations_walk_array_is_the_walk(self):
        rng = np.random.default_rng(5)
        for _ in range(200):
            dims = [(int(s), int(t)) for s, t in rng.integers(0, 6, size=(rng.integers(1, 5), 2))]
            self.assertEqual(walk_array(dims).tolist(), walk(dims), dims)


class EltwisePlanTest(unittest.TestCase):
    def check(self, plan, n, sizes, arch, rows, resident=0):
        self.assertIsNotNone(plan)
        self.assertEqual(plan.n, n)
        self.assertLessEqual(plan.columns, arch.columns)
        self.assertLessEqual(plan.rows, rows)
        self.assertEqual(plan.workers * plan.iterations * plan.tile, n)
        for s in sizes:
            self.assertEqual((plan.tile * s) % 4, 0, "tiles are whole DMA words")
        self.assertLessEqual(2 * plan.tile * sum(sizes) + resident, arch.l1_budget)
        covered = sorted(plan.covers())
        expect = 0
        for start, length in covered:
            self.assertEqual(start, expect, "tiles cover the elements once, in order")
            expect += length
        self.assertEqual(expect, n)

    def test_many_sizes_cover_exactly(self):
        for n in (4, 16, 64, 100, 600, 1000, 4096, 5005, 65536, 1 << 20, 3 * 7 * 11 * 13 * 4):
            for sizes in ([4, 4], [4, 4, 4], [2, 2], [2, 4, 2], [1, 1]):
                for arch, rows in ((AIE2, 4), (AIE2P, 2)):
                    if (n * min(sizes)) % 4:
                        self.assertIsNone(plan_eltwise(n, sizes, arch, rows))
                        continue
                    with self.subTest(n=n, sizes=sizes, arch=arch.name):
                        self.check(plan_eltwise(n, sizes, arch, rows), n, sizes, arch, rows)

    def test_large_sizes_use_the_whole_array(self):
        p = plan_eltwise(1 << 20, [4, 4], AIE2P, 4)
        self.assertEqual((p.columns, p.rows), (8, 4))
        p = plan_eltwise(1 << 20, [2, 2, 2], AIE2, 2)
        self.assertEqual((p.columns, p.rows), (4, 2))

    def test_odd_bf16_counts_are_not_whole_words(self):
        self.assertIsNone(plan_eltwise(5005, [2, 2], AIE2P, 4))

    def test_a_prime_count_still_plans_for_words(self):
        p = plan_eltwise(4099, [4, 4], AIE2, 4)
        self.assertEqual((p.workers, p.tile, p.iterations), (1, 1, 4099))

    def test_resident_bytes_shrink_tiles(self):
        free = plan_eltwise(1 << 16, [4, 4], AIE2, 4)
        tight = plan_eltwise(1 << 16, [4, 4], AIE2, 4, resident_bytes=40 * 1024)
        self.assertLess(tight.tile, free.tile)
        self.check(tight, 1 << 16, [4, 4], AIE2, 4, 40 * 1024)

    def test_broadcast_index(self):
        b = Broadcast((4, 3, 2, 1), (4, 1, 1, 1))
        self.assertEqual([b.source_index(i) for i in range(8)], [0, 1, 2, 3, 0, 1, 2, 3])
        b = Broadcast((2, 4, 1, 1), (1, 2, 1, 1))
        self.assertEqual([b.source_index(i) for i in range(8)], [0, 0, 1, 1, 0, 0, 1, 1])


class SpecTest(unittest.TestCase):
    def spec(self, op, inputs, out, arch="aie2p"):
        return prepare(parse_request(request_json(op, inputs, out, arch=arch)))

    def test_kinds_and_rows_per_column(self):
        t = tensor("f32", [4096])
        s = self.spec("GELU", [t], t)
        self.assertEqual(s.kind, "unary")
        self.assertLessEqual(s.plan.rows, 4)
        s = self.spec("ADD", [t, t], t)
        self.assertEqual(s.kind, "binary")
        self.assertLessEqual(s.plan.rows, 2)
        a, b = tensor("f32", [256, 64]), tensor("f32", [256])
        s = self.spec("ADD", [a, b], a)
        self.assertEqual(s.kind, "bcast")
        self.assertEqual(s.core.defines["SRC_NE0"], 256)
        self.assertEqual(s.core.defines["OUT_NE1"], 64)

    def test_defines_name_types_and_op(self):
        a, b = tensor("bf16", [64]), tensor("f32", [64])
        d = self.spec("MUL", [a, b], a).core.defines
        self.assertEqual((d["IN0_T"], d["IN1_T"], d["OUT_T"]), ("bfloat16", "float", "bfloat16"))
        self.assertEqual(d["GGML_OP_MUL"], 1)
        self.assertEqual((d["COMPUTE_F32"], d["COMPUTE_INT"]), (1, 0))
        i = tensor("i16", [64])
        d = self.spec("ADD", [i, i], i).core.defines
        self.assertEqual((d["COMPUTE_F32"], d["COMPUTE_INT"], d["IN0_T"]), (0, 1, "int16_t"))


class MatmulPlanTest(unittest.TestCase):
    def check_gemm(self, p, arch, sizes):
        a, b, c = sizes
        self.assertLessEqual(p.rows * p.m, p.M)
        self.assertLessEqual(p.columns * p.n, p.N)
        self.assertEqual(p.K % p.k, 0)
        self.assertEqual((p.m % p.r, p.n % p.t, p.k % p.s), (0, 0, 0))
        self.assertLessEqual(2 * (p.m * p.k * a + p.k * p.n * b + p.m * p.n * c), arch.l1_budget)
        self.assertLessEqual(p.columns, arch.columns)
        self.assertEqual((p.s * a) % 4, 0)
        # The DMA re-layouts visit every element of their tile exactly once.
        self.assertEqual(sorted(walk(p.a_dims())), list(range(p.m * p.k)))
        self.assertEqual(sorted(walk(p.b_dims())), list(range(p.n * p.k)))
        self.assertEqual(sorted(walk(p.c_dims())), list(range(p.rows * p.m * p.n)))
        # The design's per-transfer walk (IRON walks a join's output one core's segment at a
        # time), the segments one after the other, is the whole walk.
        seg = walk(p.c_segment_dims())
        self.assertEqual(sorted(seg), list(range(p.m * p.n)))
        mn = p.m * p.n
        self.assertEqual([i * mn + j for i in range(p.rows) for j in seg], walk(p.c_dims()))

    def test_gemm_plans(self):
        for arch in (AIE2, AIE2P):
            for (M, N, K), dt in (
                ((512, 512, 512), "bf16"),
                ((64, 4096, 4096), "bf16"),
                ((32, 64, 128), "i8"),
                ((16, 32000, 2048), "i16"),
                ((8, 128, 64), "bf16"),
            ):
                with self.subTest(arch=arch.name, M=M, N=N, K=K, dt=dt):
                    size = {"bf16": 2, "i8": 1, "i16": 2}[dt]
                    out = 4
                    p = plan_gemm(M, N, K, arch.mmul[dt], size, size, out, arch)
                    self.assertIsNotNone(p)
                    self.check_gemm(p, arch, (size, size, out))

    def test_gemm_layout_matches_the_kernel_blocks(self):
        p = plan_gemm(64, 64, 64, (4, 8, 4), 2, 2, 4, AIE2)
        order = walk(p.a_dims())
        # The first r*s elements sent are block (0, 0): rows 0..r-1, columns 0..s-1.
        first = order[: p.r * p.s]
        self.assertEqual(first, [row * p.k + col for row in range(p.r) for col in range(p.s)])
        # The C walk emits row 0 of the joined tile first, all n columns.
        c = walk(p.c_dims())[: p.n]
        block = p.r * p.t
        self.assertEqual(c, [(j // p.t) * block + j % p.t for j in range(p.n)])

    def test_gemm_needs_one_microkernel_block_and_whole_k_steps(self):
        self.assertIsNone(plan_gemm(3, 64, 64, (4, 8, 4), 2, 2, 4, AIE2))  # M < r
        self.assertIsNone(plan_gemm(64, 4, 64, (4, 8, 4), 2, 2, 4, AIE2))  # N < 8
        self.assertIsNone(plan_gemm(64, 64, 12, (4, 8, 4), 2, 2, 4, AIE2))  # no K step
        p = plan_gemm(13, 44, 48, (4, 8, 4), 2, 2, 4, AIE2)  # M, N off the grid
        self.assertIsNotNone(p)
        self.assertGreater(p.m_rounds * p.m_block, 13)

    def test_block_starts_overlap_only_at_the_end(self):
        self.assertEqual(block_starts(16, 4), [0, 4, 8, 12])
        self.assertEqual(block_starts(13, 4), [0, 4, 8, 9])
        self.assertEqual(block_starts(3, 3), [0])
        self.assertEqual(round_tasks(130 * 8 + 5, 8), [(0, 64), (512, 64), (1024, 2), (1037, 1)])

    def test_long_n_walks_are_chunked(self):
        p = plan_gemm(8, 32000, 64, (4, 8, 8), 2, 2, 4, AIE2P)
        self.assertIsNotNone(p)
        total = sum(count for _, count in p.n_tasks())
        self.assertEqual(total, p.n_rounds)
        self.assertTrue(all(count <= MAX_REPEAT for _, count in p.n_tasks()))

    def test_gemm_tasks_compute_every_output_from_the_right_rows(self):
        # Shapes on and off the grid; the structure check walks every DMA.
        shapes = [
            ("bf16", "f32", (16, 64, 64, 1, 1)),
            ("bf16", "f32", (13, 44, 48, 1, 1)),
            ("f32", "f32", (5, 9, 16, 1, 1)),
            ("bf16", "f32", (7, 100, 32, 2, 3)),
            ("bf16", "bf16", (9, 24, 64, 3, 1)),
            ("i8", "i8", (12, 20, 32, 1, 1)),
            ("i16", "i16", (6, 12, 16, 1, 1)),
        ]
        for arch in ("aie2", "aie2p"):
            for w, x, (M, N, K, b2, b3) in shapes:
                with self.subTest(arch=arch, w=w, x=x, M=M, N=N, K=K):
                    spec = mul_mat_spec(arch, w, x, M, N, K, b2, b3)
                    self.assertFalse(spec.gemv)
                    writes = check_structure(spec, stream_of(spec))
                    self.assertGreaterEqual(writes, spec.dst.nelements)

    def test_gemm_reads_a_once_per_round_whatever_the_columns(self):
        # A is broadcast along the array's rows: a round reads the M block's rows of K once,
        # not once per column; the feeds sit on distinct shims (one input channel each beside
        # B's).
        from ggml_hsa_iron.dtypes import DTYPES

        for arch, ty, (M, N, K) in (
            ("aie2p", "q4_0", (512, 8192, 2048)),
            ("aie2", "q4_0", (512, 2048, 2048)),
            ("aie2p", "bf16", (256, 4096, 512)),
            ("aie2p", "q8_0", (256, 24, 256)),  # three columns, four rows: feeds of row pairs
        ):
            with self.subTest(arch=arch, ty=ty, M=M, N=N, K=K):
                spec = mul_mat_spec(arch, ty, "f32", M, N, K)
                p = spec.plan
                self.assertFalse(spec.gemv)
                self.assertEqual(p.a_feeds * p.a_feed_rows, p.rows)
                self.assertLessEqual(p.a_feeds, p.columns)
                cols = [p.a_feed_column(g) for g in range(p.a_feeds)]
                self.assertEqual(len(set(cols)), p.a_feeds)
                a_read = sum(math.prod(a.sizes) for g in spec.tasks() for a, _, _ in g if a)
                rounds = len(p.m_starts()) * p.n_rounds
                self.assertEqual(a_read, rounds * p.rows * p.m * K)
                # Every weight is read once per M block.
                if DTYPES[ty].block > 1 or ty == "bf16":
                    b_read = sum(math.prod(b.sizes) for g in spec.tasks() for _, b, _ in g)
                    row = p.b_units(K) if p.w_block_bytes else K
                    self.assertEqual(b_read, len(p.m_starts()) * p.n_rounds * p.n_block * row)

    def test_gemv_tasks_compute_every_output_from_the_right_rows(self):
        shapes = [
            ("bf16", "f32", (1, 37, 48, 2, 1)),  # N prime: the last round overlaps
            ("f32", "f32", (1, 5, 2051, 1, 1)),  # K odd (f32): chunks of 293
            ("bf16", "f32", (3, 16, 256, 1, 1)),  # M below the GEMM's rows: one per row
            ("f32", "f32", (16, 16, 4, 1, 1)),  # K below a GEMM K step
            ("i8", "i8", (1, 20, 64, 1, 2)),
            ("bf16", "bf16", (2, 9, 40, 1, 1)),
        ]
        for arch in ("aie2", "aie2p"):
            for w, x, (M, N, K, b2, b3) in shapes:
                with self.subTest(arch=arch, w=w, x=x, M=M, N=N, K=K):
                    spec = mul_mat_spec(arch, w, x, M, N, K, b2, b3)
                    self.assertTrue(spec.gemv)
                    check_structure(spec, stream_of(spec))

    def test_gemv_plans(self):
        for arch in (AIE2, AIE2P):
            for N, K, w in (
                (4096, 4096, 2),
                (32000, 2048, 2),
                (64, 64, 4),
                (128, 256, 1),
                (509, 2051, 4),
                (7, 20, 2),
            ):
                with self.subTest(arch=arch.name, N=N, K=K):
                    p = plan_gemv(N, K, w, w, 4, arch)
                    self.assertIsNotNone(p)
                    self.assertGreaterEqual(p.rounds * p.block, N)
                    self.assertLessEqual(p.block, N)
                    self.assertEqual(p.k_steps * p.k_chunk, K)
                    self.assertEqual((p.k_chunk * w) % 4, 0)
                    self.assertLessEqual(p.k_chunk * w, 4 * 1023)
                    l1 = 2 * (p.rows_per_tile * p.k_chunk * w + p.k_chunk * w + p.rows_per_tile * 4)
                    self.assertLessEqual(l1, arch.l1_budget)
        # Rows of src0 (and src1) must start on whole 32-bit words.
        self.assertIsNone(plan_gemv(64, 21, 2, 2, 4, AIE2))
        self.assertIsNone(plan_gemv(64, 21, 1, 1, 4, AIE2))

    def test_mul_mat_refusals(self):
        # bf16 weights with an odd K: src0's rows do not start on 32-bit words.
        with self.assertRaises(UnsupportedError):
            mul_mat_spec("aie2", "bf16", "f32", 8, 16, 255)
        # More matrix-vector products than DMA tasks a shim channel takes.
        with self.assertRaises(UnsupportedError):
            mul_mat_spec("aie2", "f32", "f32", 2, 16, 4, 1024, 1)

    def test_mul_mat_specs(self):
        w, x = tensor("bf16", [4096, 512]), tensor("f32", [4096, 1])
        s = prepare(parse_request(request_json("MUL_MAT", [w, x], tensor("f32", [512, 1]))))
        self.assertTrue(s.gemv)
        self.assertEqual(s.core.defines["X_T"], "float")
        w, x = tensor("bf16", [256, 128, 2, 1]), tensor("bf16", [256, 64, 6, 1])
        s = prepare(parse_request(request_json("MUL_MAT", [w, x], tensor("f32", [128, 64, 6, 1]))))
        self.assertFalse(s.gemv)
        # src0 batch i02 = i12 / 3: batches 0-2 use matrix 0, 3-5 matrix 1.
        offs = [b[0] for b in s.batches]
        m0 = 256 * 128
        self.assertEqual(offs, [0, 0, 0, m0, m0, m0])
        self.assertEqual([b[1] for b in s.batches], [i * 256 * 64 for i in range(6)])
        self.assertEqual([b[2] for b in s.batches], [i * 128 * 64 for i in range(6)])


if __name__ == "__main__":
    unittest.main()


class ByteWeightsGemvTest(unittest.TestCase):
    """The GEMV over f16 and block-quantized weights moved as bytes (plan_gemv_blocks)."""

    TYPES = ("f16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K")

    def test_every_weight_byte_is_read_once_per_product_in_whole_words(self):
        from ggml_hsa_iron.dtypes import DTYPES

        shapes = ((1, 16, 256, 1, 1), (3, 36, 512, 2, 2), (1, 4096, 4096, 1, 1))
        for ty, arch, (M, N, K, b2, r2) in itertools.product(self.TYPES, ("aie2", "aie2p"), shapes):
            block, size = DTYPES[ty].block, DTYPES[ty].size
            with self.subTest(ty=ty, arch=arch, M=M, N=N, K=K):
                spec = mul_mat_spec(arch, ty, "f32", M, N, K, b2=b2, r2=r2)
                self.assertTrue(spec.gemv and spec.weight_bytes)
                row = K // block * size
                self.assertEqual(spec.sequence[0], ("i8", N * row * b2))
                groups = spec.tasks()
                per_product = len(groups) // len(spec.products)
                for p, (w_off, _, _) in enumerate(spec.products):
                    read = []
                    for g in groups[p * per_product : (p + 1) * per_product]:
                        for w, _, _ in g:
                            self.assertEqual(w.offset % 4, 0)
                            self.assertEqual(w.sizes[3] % 4, 0)
                            read.append(tap_index_array(w))
                    # Overlapping last rounds read some rows twice, nothing else.
                    got = np.unique(np.concatenate(read))
                    self.assertTrue(np.array_equal(got, np.arange(w_off, w_off + N * row)))
                plan = spec.plan
                l1 = 2 * plan.rows_per_tile * plan.w_units(plan.k_chunk)
                l1 += 2 * plan.k_chunk * 4 + 2 * plan.rows_per_tile * 4
                self.assertLessEqual(l1, ARCHS[arch].l1_budget)

    def test_rows_that_are_not_whole_words_are_taken_whole_or_refused(self):
        # q6_K rows of 256 values are 210 bytes: a core takes an even number of whole rows.
        spec = mul_mat_spec("aie2p", "q6_K", "f32", 1, 64, 256)
        self.assertEqual(spec.plan.k_chunk, 256)
        self.assertEqual(spec.plan.rows_per_tile * 210 % 4, 0)
        # One output row (N = 1): 210 bytes cannot be moved in whole words.
        with self.assertRaises(UnsupportedError):
            mul_mat_spec("aie2p", "q6_K", "f32", 64, 1, 256)


class RowPlanTest(unittest.TestCase):
    """The row design's tiling (tiling.plan_rows) and runtime sequence (RowSpec.rounds)."""

    def spec(self, op, inputs, output, arch="aie2p", op_params=()):
        return prepare(
            parse_request(request_json(op, inputs, output, arch=arch, op_params=op_params))
        )

    def test_columns_divide_the_rows_and_objects_fit_the_core(self):
        for arch in ("aie2", "aie2p"):
            for length, rows in ((64, 60), (1025, 60), (33, 7), (4096, 32), (16, 1024)):
                x = tensor("f32", [length, rows])
                p = self.spec("RMS_NORM", [x], x, arch).plan
                with self.subTest(arch=arch, length=length, rows=rows):
                    self.assertEqual(rows % p.columns, 0)
                    self.assertLessEqual(p.columns, ARCHS[arch].columns)
                    self.assertEqual(p.rows_per_column % p.block, 0)
                    self.assertLessEqual(p.l1_bytes, ARCHS[arch].l1_budget)
                    self.assertEqual(p.l1_bytes, p.block * length * 8 * p.depth)

    def test_rows_a_core_cannot_hold_are_refused(self):
        x = tensor("f32", [7000, 2])
        with self.assertRaises(UnsupportedError):
            self.spec("RMS_NORM", [x], x)
        # Single-buffered when a double-buffered row does not fit.
        x = tensor("f32", [4096, 2])
        self.assertEqual(self.spec("RMS_NORM", [x], x).plan.depth, 1)

    def test_soft_max_rounds_cover_every_row_once(self):
        # 33-element rows, 6 rows per head, 4 heads, 3 batches; the mask repeats over the
        # heads and batches (ggml broadcasting); one sink per head.
        x = tensor("f32", [33, 6, 4, 3])
        mask = tensor("f32", [40, 8, 1, 1])
        sinks = tensor("f32", [4])
        s = self.spec("SOFT_MAX_MASK_SINKS", [x, mask, sinks], x, op_params=(0, 0))
        L = 33
        seen = []
        for c in range(s.plan.columns):
            rows = []
            for rd in s.rounds(c):
                self.assertLessEqual(rd.tasks, 15)
                # x rows and sinks, in object order: each object's rows, then their heads' sinks.
                for t in rd.x:
                    if not t.sink:
                        self.assertEqual(t.offset % L, 0)
                        rows += range(t.offset // L, (t.offset + t.count) // L)
                mask_rows = [m.offset // 40 + k for m in rd.mask for k in range(m.rows)]
                first = rd.first_row
                self.assertEqual(mask_rows, [r % 6 for r in range(first, first + rd.rows)])
            seen += rows
        self.assertEqual(seen, list(range(6 * 4 * 3)))

    def test_sinks_follow_the_heads_of_an_objects_rows(self):
        x = tensor("f32", [16, 3, 4, 1])
        s = self.spec("SOFT_MAX_SINKS", [x, tensor("f32", [4])], x, op_params=(0, 0))
        B = s.plan.block
        heads = []
        for c in range(s.plan.columns):
            for rd in s.rounds(c):
                heads += [t.offset for t in rd.x if t.sink for _ in range(t.count)]
        self.assertEqual(len(heads), 12)
        self.assertEqual(heads, [r // 3 for r in range(12)])
        self.assertGreaterEqual(B, 1)

    def test_sink_runs_are_repeats_of_at_most_64(self):
        # 512 rows per head in objects of 64 rows: each sink task copies sinks[head] by its
        # repeat count (the only DMA dimension that may have stride 0), at most 64.
        x = tensor("f32", [8, 512, 2, 1])
        s = self.spec("SOFT_MAX_SINKS", [x, tensor("f32", [2])], x, op_params=(0, 0))
        heads, long_run = [], False
        for c in range(s.plan.columns):
            for rd in s.rounds(c):
                for t in rd.x:
                    if t.sink:
                        self.assertLessEqual(t.count, 64)
                        long_run |= t.count == 64
                        heads += [t.offset] * t.count
        self.assertTrue(long_run)
        self.assertEqual(heads, [r // 512 for r in range(1024)])

    def test_f16_masks_need_rows_of_whole_words(self):
        x = tensor("f32", [15, 4])
        with self.assertRaises(UnsupportedError):
            self.spec("SOFT_MAX_MASK", [x, tensor("f16", [15, 4])], x, op_params=(0, 0))
        x = tensor("f32", [16, 4])
        s = self.spec("SOFT_MAX_MASK", [x, tensor("f16", [16, 4])], x, op_params=(0, 0))
        self.assertEqual(s.core.defines["MASK_F16"], 1)

    def test_alibi_slopes_are_ggml_s(self):
        from ggml_hsa_iron.plans import alibi_slopes

        # 8 heads, max_bias 8: m0 = 2^-1, slopes 2^-1 ... 2^-8.
        self.assertEqual(alibi_slopes(8, 8.0), [2.0 ** -(h + 1) for h in range(8)])
        # 12 heads: n_head_log2 = 8, then m1 = 2^-0.5 to the odd powers 1, 3, 5, 7.
        s = alibi_slopes(12, 8.0)
        self.assertEqual(s[:8], [2.0 ** -(h + 1) for h in range(8)])
        for k, h in enumerate(range(8, 12)):
            self.assertAlmostEqual(s[h], 2.0 ** (-0.5 * (2 * k + 1)), places=6)


class ByteWeightsGemmTest(unittest.TestCase):
    """The GEMM over f16 and block-quantized weights moved as bytes (plan_gemm_blocks,
    kernels/mmq.cc): M > 1 with dense operands."""

    TYPES = ("f16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K")

    @staticmethod
    def core_bytes(p, t):
        # A (f32, m x a_k) tiles double-buffered, the weight bytes b_depth and C (f32) c_depth
        # times, and
        # mmq.cc's static data, the t x a_k decoded bf16 block (A is rounded to bf16 in place)
        # and, for blocks spanning A tiles, 64 bytes of scales per block of the B tile: written
        # out here, not taken from the plan's own arithmetic.
        kw = p.k // p.w_block * p.w_block_bytes
        ak = p.k // p.a_split
        kept = 64 * p.n * (p.k // p.w_block) if ak < p.w_block else 0
        b, c = p.b_depth * p.n * kw, p.c_depth * 4 * p.m * p.n
        return 2 * 4 * p.m * ak + b + c + 2 * t * ak + kept

    def test_a_few_rows_take_one_gemv_decoding_each_tile_once(self):
        # A decode step of M tokens: W streamed once, its tiles decoded once for all M rows.
        for ty in ("q4_0", "q4_K", "q6_K"):
            for M in (2, 5, 8):
                with self.subTest(ty=ty, M=M):
                    spec = mul_mat_spec("aie2p", ty, "f32", M, 2048, 2048)
                    p = spec.plan
                    self.assertTrue(spec.gemv)
                    self.assertEqual(p.nx, M)
                    self.assertEqual(spec.core.defines["MV_NX"], M)
                    self.assertEqual(p.w_tasks(M), len(p.round_tasks()))
                    for group in spec.tasks():
                        for _w, x, y in group:
                            self.assertEqual(x.sizes[1:], (2048 // p.k_chunk, M, p.k_chunk))
                            self.assertEqual(y.sizes[1:], (p.rows, M, p.rows_per_tile))
                            self.assertEqual((x.strides[2], y.strides[2]), (2048, 2048))
        self.assertFalse(mul_mat_spec("aie2p", "q4_0", "f32", 9, 2048, 2048).gemv)

    def test_every_type_tiles_in_budget_and_every_core_gets_its_rows(self):
        from ggml_hsa_iron.dtypes import DTYPES

        shapes = [
            (4, 8, 256, 2, 2, 1),  # the smallest GEMM (one batch of 4 rows takes the GEMV)
            (13, 44, 512, 1, 1, 1),  # M and N off the grid
            (9, 40, 256, 2, 2, 1),  # batches, src0 broadcast over src1's dimension 2
            (64, 520, 256, 1, 1, 1),  # every column: two A channels per feed on aie2p
        ]
        for ty in self.TYPES:
            block, size = DTYPES[ty].block, DTYPES[ty].size
            for arch in ("aie2", "aie2p"):
                a = ARCHS[arch]
                r, s, t = a.mmul["bf16"]
                for M, N, K, b2, r2, b3 in shapes:
                    with self.subTest(ty=ty, arch=arch, M=M, N=N, K=K, b2=b2):
                        spec = mul_mat_spec(arch, ty, "f32", M, N, K, b2=b2, b3=b3, r2=r2)
                        p = spec.plan
                        self.assertFalse(spec.gemv)
                        self.assertTrue(spec.weight_bytes)
                        self.assertEqual(spec.core.source, "mmq.cc")
                        self.assertEqual(spec.core.defines[f"MVQ_{ty.upper()}"], 1)
                        self.assertEqual((p.r, p.s, p.t), (r, s, t))
                        # K steps of whole blocks (256 values for the K-quants).
                        self.assertEqual(p.k % block, 0)
                        self.assertEqual(K % p.k, 0)
                        self.assertLessEqual(self.core_bytes(p, t), a.l1_budget)
                        mem = 2 * 4 * p.a_feed_rows * p.m * p.k + 2 * p.n * p.b_units(p.k)
                        mem += 2 * 4 * p.rows * p.m * p.n
                        self.assertLessEqual(mem, a.memtile_bytes)
                        self.assertEqual(spec.sequence[0], ("i8", N * K // block * size * b2))
                        for g in spec.tasks():
                            for _, b, _ in g:
                                self.assertEqual(b.offset % 4, 0)
                                self.assertEqual(b.sizes[3] % 4, 0)
                        writes = check_structure(spec, stream_of(spec))
                        self.assertGreaterEqual(writes, spec.dst.nelements)

    def test_k_quant_k_steps_and_q6_k_whole_rows(self):
        # q6_K rows of 256 values are 210 bytes, not whole words: K whole, the tile's n rows
        # one run (n * 210 whole words).
        spec = mul_mat_spec("aie2p", "q6_K", "f32", 16, 64, 256)
        self.assertFalse(spec.gemv)
        self.assertEqual(spec.plan.k, 256)
        self.assertEqual(spec.plan.n * 210 % 4, 0)
        # K = 1024 q4_K: K steps of 256 or 512 values, never a part of a block.
        p = mul_mat_spec("aie2", "q4_K", "f32", 32, 64, 1024).plan
        self.assertIn(p.k, (256, 512))

    def test_prefill_plans_the_gemm_the_gemv_refuses(self):
        from ggml_hsa_iron.plans import _products
        from ggml_hsa_iron.tiling import plan_gemv_blocks

        # 2048 src1 rows x 4096 x 4096: the GEMV (one product per src1 row) exceeds the 1024
        # DMA tasks of a shim channel; the GEMM streams the weights once per M block.
        for ty in ("q4_0", "q6_K", "f16"):
            for arch in ("aie2", "aie2p"):
                with self.subTest(ty=ty, arch=arch):
                    spec = mul_mat_spec(arch, ty, "f32", 2048, 4096, 4096)
                    self.assertFalse(spec.gemv)
                    self.assertLessEqual(len(spec.tasks()), 1024)
                    t = ARCHS[arch].mmul["bf16"][2]
                    self.assertLessEqual(self.core_bytes(spec.plan, t), ARCHS[arch].l1_budget)
                    gemv = plan_gemv_blocks(
                        4096,
                        4096,
                        spec.src0.block,
                        spec.src0.size,
                        ARCHS[arch],
                        _products(spec.src0, spec.src1, spec.dst),
                    )
                    self.assertIsNone(gemv)
                    # A 512-row prefill takes the GEMM too.
                    self.assertFalse(mul_mat_spec(arch, ty, "f32", 512, 4096, 4096).gemv)
        # f16 weights with a long K: N rounds beyond a DMA stride go one per task.
        spec = mul_mat_spec("aie2p", "f16", "f32", 64, 4096, 14336)
        self.assertFalse(spec.gemv)
        for g in spec.tasks():
            for _, b, _ in g:
                if b.sizes[0] > 1:
                    self.assertLessEqual(b.strides[0], (1 << 20) * 4)

    def test_refusals_fall_back_to_the_gemv_with_a_reason(self):
        from ggml_hsa_iron.plans import gemm_blocks_plan

        def why(ty, M, N, K, arch="aie2p"):
            a, b = tensor(ty, [K, N]), tensor("f32", [K, M])
            with self.assertRaises(UnsupportedError) as cm:
                gemm_blocks_plan(a, b, tensor("f32", [N, M]), ARCHS[arch])
            # The request itself still plans: the GEMV takes it.
            self.assertTrue(mul_mat_spec(arch, ty, "f32", M, N, K).gemv)
            return str(cm.exception)

        self.assertIn("below the microkernel", why("q4_0", 3, 64, 256))
        self.assertIn("N is below", why("q8_0", 8, 4, 256))
        self.assertIn("not a multiple of a K step", why("f16", 8, 64, 40))
        # q6_K, K = 256 and N = 9: the shifted last N block starts at row 1, 210 bytes in.
        # The GEMV cannot take it either (rows of 210 bytes): exit 2 with both reasons.
        with self.assertRaises(UnsupportedError) as cm:
            mul_mat_spec("aie2p", "q6_K", "f32", 8, 9, 256)
        self.assertIn("the GEMV needs", str(cm.exception))
        self.assertIn("the q6_K GEMM (M=8, N=9, K=256, aie2p): no tile fits", str(cm.exception))
        # Strided operands: the GEMV (the GEMM takes dense operands only).
        big = tensor("f32", [512, 8])
        from ggml_hsa_iron.request import Tensor

        b = Tensor("f32", (256, 8, 1, 1), big.nb)
        w = tensor("q4_0", [256, 64])
        s = prepare(parse_request(request_json("MUL_MAT", [w, b], tensor("f32", [64, 8]))))
        self.assertTrue(s.gemv)

    def test_budgets_bind(self):
        from dataclasses import replace

        from ggml_hsa_iron.dtypes import DTYPES
        from ggml_hsa_iron.tiling import plan_gemm_blocks

        a = ARCHS["aie2p"]
        batches = [(0, 0, 0)]
        q = DTYPES["q4_K"]
        p = plan_gemm_blocks(64, 256, 4096, a.mmul["bf16"], q.block, q.size, a, batches)
        self.assertIsNotNone(p)
        # A core budget below the smallest tile (m 4, n 8, k 256 in A tiles of 32 columns:
        # 1 KiB of A, 1.1 KiB of weights and 128 B of C held once each, 0.5 KiB decoded, 0.5
        # KiB of kept scales: 3328 B) refuses; a smaller budget shrinks the tile.
        tiny = replace(a, l1_budget=3 * 1024)
        self.assertIsNone(
            plan_gemm_blocks(64, 256, 4096, a.mmul["bf16"], q.block, q.size, tiny, batches)
        )
        small = replace(a, l1_budget=24 * 1024)
        ps = plan_gemm_blocks(64, 256, 4096, a.mmul["bf16"], q.block, q.size, small, batches)
        self.assertIsNotNone(ps)
        self.assertLessEqual(self.core_bytes(ps, 8), 24 * 1024)
        self.assertLess(self.core_bytes(ps, 8), self.core_bytes(p, 8))
        # The memory tile of an A feed: rings of m x a_k f32 A for each row the feed carries.
        no_mem = replace(a, memtile_bytes=16 * 1024)
        pm = plan_gemm_blocks(64, 256, 4096, a.mmul["bf16"], q.block, q.size, no_mem, batches)
        self.assertTrue(pm is None or 2 * 4 * pm.a_feed_rows * pm.m * pm.a_k <= 16 * 1024)
