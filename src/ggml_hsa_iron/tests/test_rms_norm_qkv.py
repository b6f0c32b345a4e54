"""RMS_NORM_QKV_ROPE and RMS_NORM_QKV_ROPE_FF: llama's Q, K and V projections of one normalised x
in one dispatch of three outputs, the array's columns partitioned between three GEMVs.

* the plan: the columns split in proportion to Mq, Mk, Mv (4, 2, 2 of aie2p's 8 columns and
  2, 1, 1 of aie2's 4 for Llama-3.2-1B; at least one each, refused when they do not go round);
  each group exactly the GEMV of RMS_NORM_MUL_MAT_ROPE(_FF) (Q, K) or RMS_NORM_MUL_MAT (V)
  planned over its columns (the same plan and defines), its own core object with its functions
  renamed; the runtime sequence's arguments (the request's operands in dispatch order); the
  shim tasks of every column within the descriptors and channels; the memory tiles; the
  refusals (GEMM-sized N, the outputs' types and shapes, one K, whatever the groups' ops refuse,
  a weight type included); weights of different types (llama.cpp's Q4_K_M: q4_K Wq and Wk, q6_K
  Wv), each group planned, typed and linked as its op alone;
* Llama-sized shapes recorded against the emulation's stand-in (its DMA and memory checks, the
  three groups' Workers and Kernels on their columns, each group's W fifos of its own weights'
  tiles);
* end to end: the design compiled for `--target emu` (three core objects linked into one
  library) and run on real data (tests/util_emu.py, every output written by the program's
  drains) against numpy (util_norm's RMS_NORM_MUL_MAT reference, ggml's ROPE for Q and K, f16
  outputs within half an ulp): Llama-3.2-1B's shapes (K = 2048, Mq = 2048, Mk = Mv = 512,
  D = 64, one token) on aie2p and aie2, f32, q4_0 and q8_0 weights, K and V in f16 and in f32,
  mode 0 with and without the frequency factors, mode 2, and a small odd shape; each output bit
  for bit the separate RMS_NORM_MUL_MAT_ROPE (Q, K) and RMS_NORM_MUL_MAT (V) designs' when
  their plans chunk K alike; mixed weights (q4_K, q4_K, q6_K and q4_0, q4_0, q8_0 at Llama's
  shapes on aie2p and aie2, f32, q8_0, q4_0 on a small shape) against numpy and bit for bit the
  separate designs.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dataclasses
import json
import random
import unittest
from unittest import mock

from ggml_hsa_iron.archs import ARCHS
from ggml_hsa_iron.dtypes import DTYPES
from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import (
    core_sources,
    prepare,
    prepare_rms_norm_mul_mat,
    prepare_rms_norm_mul_mat_rope,
)
from ggml_hsa_iron.plans_qkv import GEMV_FUNCTIONS, QkvSpec
from ggml_hsa_iron.request import Tensor, parse_request
from ggml_hsa_iron.tiling import (
    MAX_TASKS_PER_CHANNEL,
    SHIM_GROUP_TASKS,
    gemv_memtile_bytes,
    split_columns,
)

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_rms_norm_mul_mat_rope import fbits, llama3_ff, rope_params
from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests import sample

try:
    import numpy as np

    from ggml_hsa_iron.tests.util_emu import run_request, run_request_outputs, run_spec_outputs
    from ggml_hsa_iron.tests.util_norm import (
        f16_half_ulp,
        norm_inputs,
        norm_reference,
        norm_weights,
        rope_reference,
    )

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

OP = "RMS_NORM_QKV_ROPE"
HEAD_EPS = 1e-6  # the head norms' eps (qwen3's rms_norm_eps)
LLAMA = dict(K=2048, D=64, Hq=32, Hk=8)  # Llama-3.2-1B: Mq = 2048, Mk = Mv = 512


def weight_types(ty) -> tuple[str, str, str]:
    """Wq's, Wk's and Wv's types: `ty` one type for the three, or a triple of them (llama.cpp's
    Q4_K_M mixes q4_K and q6_K)."""
    return (ty,) * 3 if isinstance(ty, str) else tuple(ty)


def qkv_tensors(
    ty,
    K,
    D,
    Hq,
    Hk,
    T=1,
    ff=False,
    kty="f16",
    vty="f16",
    n_dims=None,
    P=None,
    head_norm=False,
    bias=False,
):
    """(inputs, outputs): Wq [K, D*Hq], Wk and Wv [K, D*Hk] of type ty (one type, or Wq's, Wk's
    and Wv's: weight_types), x [K, T], n [K], the positions [P] (T by default), (ff) the factors
    [n_dims/2], (head_norm) Q's and K's head norm weights [D], (bias) Q's, K's and V's biases;
    Q f32 [D, Hq, T], K of kty [D, Hk, T], V of vty [D*Hk, T]."""
    n_dims = n_dims or D
    tq, tk, tv = weight_types(ty)
    ins = [tensor(tq, [K, D * Hq]), tensor(tk, [K, D * Hk]), tensor(tv, [K, D * Hk])]
    ins += [tensor("f32", [K, T]), tensor("f32", [K]), tensor("i32", [P or T])]
    ins += [tensor("f32", [n_dims // 2])] if ff else []
    ins += [tensor("f32", [D])] * 2 if head_norm else []
    ins += [tensor("f32", [D * H]) for H in (Hq, Hk, Hk)] if bias else []
    outs = [tensor("f32", [D, Hq, T]), tensor(kty, [D, Hk, T]), tensor(vty, [D * Hk, T])]
    return ins, outs


def qkv_request(ty, K, D, Hq, Hk, T=1, mode=0, ff=False, arch="aie2p", kty="f16", vty="f16", **kw):
    """The request of qkv_tensors' operands. kw: n_dims, P, head_norm (RMS_NORM_QKV_HEAD_NORM_ROPE,
    its eps HEAD_EPS), rope_params' (freq_scale, ext, ...), or `inputs`, `outputs`, `params`
    replacing the request's."""
    n_dims, P, hn = kw.pop("n_dims", None), kw.pop("P", None), kw.pop("head_norm", False)
    bias = kw.pop("bias", False)
    ins, outs = qkv_tensors(ty, K, D, Hq, Hk, T, ff, kty, vty, n_dims, P, hn, bias)
    ins, outs = kw.pop("inputs", ins), kw.pop("outputs", outs)
    params = kw.pop("params", None) or rope_params(n_dims or D, mode, **kw) + (
        [fbits(HEAD_EPS)] if hn else []
    )
    op = "RMS_NORM_QKV_HEAD_NORM_ROPE" if hn else "RMS_NORM_QKV_BIAS_ROPE" if bias else OP
    # _FF: one input more than the op's (the factors; `inputs` may add them).
    op += "_FF" if len(ins) == 7 + 2 * hn + 3 * bias else ""
    return request_json(op, ins, outs[0], arch, op_params=params, extra_outputs=outs[1:])


def qkv_spec(*args, **kw) -> QkvSpec:
    return prepare(parse_request(qkv_request(*args, **kw)))


def single_requests(req):
    """The requests of the three ops computing Q, K and V alone (their own kernels)."""
    wq, wk, wv, x, n, *consts = req.inputs
    q, k, v = req.outputs
    rope = f"RMS_NORM_MUL_MAT_ROPE{'_FF' if req.op.endswith('_FF') else ''}"
    p = req.op_params
    return [
        request_json(rope, [wq, x, n, *consts], q, req.arch, op_params=p),
        request_json(rope, [wk, x, n, *consts], k, req.arch, op_params=p),
        request_json("RMS_NORM_MUL_MAT", [wv, x, n], v, req.arch, op_params=[p[11]]),
    ]


class QkvPlanTest(unittest.TestCase):
    def test_the_columns_go_to_the_projections_in_proportion(self):
        self.assertEqual(split_columns((2048, 512, 512), 8), (4, 2, 2))
        self.assertEqual(split_columns((2048, 512, 512), 4), (2, 1, 1))
        self.assertEqual(split_columns((4096, 1024, 1024), 8), (4, 2, 2))  # Llama-3-8B
        self.assertEqual(split_columns((3072, 1024, 1024), 8), (4, 2, 2))  # Llama-3.2-3B
        self.assertEqual(split_columns((512, 512, 512), 8), (2, 3, 3))
        self.assertEqual(split_columns((64, 8, 8), 4), (2, 1, 1))  # at least one each
        self.assertEqual(split_columns((64, 8, 8), 3), (1, 1, 1))
        self.assertIsNone(split_columns((64, 8, 8), 2))
        for arch, want in (("aie2p", (4, 2, 2)), ("aie2", (2, 1, 1))):
            with self.subTest(arch=arch):
                spec = qkv_spec("q4_0", **LLAMA, arch=arch)
                self.assertEqual(tuple(g.columns for g in spec.groups), want)
                self.assertEqual([g.col0 for g in spec.groups], [0, want[0], want[0] + want[1]])
                self.assertEqual(spec.columns, ARCHS[arch].columns)
                for g in spec.groups:
                    self.assertEqual(g.spec.plan.columns, g.columns)  # every column streams

    def test_each_group_is_its_op_alone_over_its_columns(self):
        for ty, kty, vty, ff, mode, arch in (
            ("q4_0", "f16", "f16", True, 0, "aie2p"),
            ("f32", "f32", "f16", False, 2, "aie2"),
            ("q8_0", "f16", "f32", False, 0, "aie2p"),
            # Mixed weights: llama.cpp's Q4_K_M (q6_K Wv), Q4_0 with a q8_0 Wv, and groups of
            # both sources (mv.cc for f32 and bf16, mvq.cc for f16 and the blocks).
            (("q4_K", "q4_K", "q6_K"), "f16", "f16", True, 0, "aie2p"),
            (("q4_K", "q4_K", "q6_K"), "f16", "f16", False, 2, "aie2"),
            (("q4_0", "q4_0", "q8_0"), "f16", "f32", True, 0, "aie2"),
            (("f32", "f16", "q8_0"), "f32", "f16", False, 0, "aie2p"),
            (("q6_K", "bf16", "q4_K"), "f16", "f32", True, 0, "aie2"),
        ):
            with self.subTest(ty=ty, kty=kty, vty=vty, ff=ff, mode=mode, arch=arch):
                text = qkv_request(ty, **LLAMA, mode=mode, ff=ff, arch=arch, kty=kty, vty=vty)
                spec = prepare(parse_request(text))
                singles = [parse_request(s) for s in single_requests(parse_request(text))]
                objects = set()
                for g, single in zip(spec.groups, singles):
                    alone = prepare(single)
                    if g.name == "v":
                        over = prepare_rms_norm_mul_mat(single, columns=g.columns)
                        self.assertIsNone(g.spec.rope)
                    else:
                        over = prepare_rms_norm_mul_mat_rope(single, columns=g.columns)
                        self.assertEqual(g.spec.rope, alone.rope)
                        self.assertEqual(g.spec.plan.rope.head, 64)
                    self.assertEqual(g.spec.plan, over.plan)
                    self.assertEqual((g.spec.src0, g.spec.dst.dtype), (alone.src0, alone.dst.dtype))
                    self.assertEqual(g.spec.src0.dtype, weight_types(ty)["qkv".index(g.name)])
                    # The object: the op's source and defines (its weight type's), every
                    # function renamed.
                    core = g.core
                    fn = "ggml_mvq" if g.spec.src0.dtype not in ("f32", "bf16") else "ggml_mv"
                    self.assertEqual(core.source, alone.core.source)
                    self.assertEqual(core.source, "mvq.cc" if fn == "ggml_mvq" else "mv.cc")
                    renamed = {f"{fn}{f}": f"{fn}{f}_{g.name}" for f in GEMV_FUNCTIONS}
                    self.assertEqual(core.defines, {**over.core.defines, **renamed})
                    self.assertTrue(core.object_name.endswith(f"_{g.name}.o"))
                    objects.add(core.object_name)
                self.assertEqual(len(objects), 3)
                self.assertEqual(core_sources(spec), spec.cores)

    def test_the_runtime_sequence_is_the_operands_in_dispatch_order(self):
        for ff in (False, True):
            spec = qkv_spec("q4_0", **LLAMA, ff=ff, P=5, kty="f16", vty="f32")
            wq, wk = 2048 * 2048 // 32 * 18, 512 * 2048 // 32 * 18
            want = [("i8", wq), ("i8", wk), ("i8", wk), ("f32", 2048), ("f32", 2048)]
            want += [("f32", 5)] + [("f32", 32)] * ff  # positions and factors: x's words
            want += [("f32", 2048), ("f16", 512), ("f32", 512)]
            self.assertEqual(spec.sequence, want)
            q = spec.groups[0].spec.sequence  # W, x, n, positions, (factors,) Q: the same
            self.assertEqual(spec.sequence[3:-3], q[1:-1])
        # Mixed weights: each its own type's bytes (q4_K: 144 per 256 values, q6_K: 210).
        spec = qkv_spec(("q4_K", "q4_K", "q6_K"), **LLAMA, kty="f16", vty="f16")
        wq, wk, wv = 2048 * 2048 // 256 * 144, 512 * 2048 // 256 * 144, 512 * 2048 // 256 * 210
        self.assertEqual(spec.sequence[:3], [("i8", wq), ("i8", wk), ("i8", wv)])
        spec = qkv_spec(("f32", "bf16", "q8_0"), **LLAMA, kty="f32", vty="f16")
        want = [("f32", 2048 * 2048), ("bf16", 512 * 2048), ("i8", 512 * 2048 // 32 * 34)]
        self.assertEqual(spec.sequence[:3], want)
        self.assertEqual(spec.sequence[-3:], [("f32", 2048), ("f32", 512), ("f16", 512)])

    def test_shim_tasks_and_memory_tiles(self):
        for arch in ("aie2", "aie2p"):
            for ty, T, ff in (
                ("q4_K", 3, True),
                ("f32", 1, False),
                (("q4_K", "q4_K", "q6_K"), 2, True),
                (("q4_0", "q4_0", "q8_0"), 1, False),
            ):
                with self.subTest(arch=arch, ty=ty, T=T):
                    spec = qkv_spec(ty, **LLAMA, T=T, ff=ff, arch=arch)
                    a = spec.arch
                    for g, tasks in zip(spec.groups, spec.tasks()):
                        p = g.spec.plan
                        unit = 1 if g.spec.weight_bytes else DTYPES[g.spec.src0.dtype].size
                        mem = gemv_memtile_bytes(p, unit, g.spec.dst.size)
                        self.assertLessEqual(mem, a.memtile_bytes)
                        consts = len(p.rope_taps()) if g.spec.rope else 0
                        # A column's first task group: W, n, the constants, x, y.
                        self.assertLessEqual(3 + 1 + consts, SHIM_GROUP_TASKS)
                        self.assertLessEqual(len(tasks) + 1 + consts, MAX_TASKS_PER_CHANNEL)
                        for group in tasks:
                            self.assertEqual(len(group), p.columns)

    def test_refusals(self):
        def refused(error, regex, *args, **kw):
            with self.subTest(regex=regex, args=args, kw=kw):
                with self.assertRaisesRegex(error, regex):
                    qkv_spec(*args, **kw)

        U, R = UnsupportedError, RequestError
        ins, outs = qkv_tensors("f32", 256, 16, 4, 2)
        # GEMM-sized: dense N that MUL_MAT's GEMM takes has no norm prologue (any projection).
        refused(U, "GEMM, which has no norm", "f32", 256, 16, 4, 2, 8)
        refused(U, "GEMM, which has no norm", "q4_0", 2048, 64, 32, 8, 16)
        # The outputs: Q f32, K and V f32 or f16, dense; V [Mv, N].
        refused(U, "Q \\(the output\\) is f32", "f32", 256, 16, 4, 2, outputs=[outs[1]] * 3)
        refused(U, "K \\(bf16", "f32", 256, 16, 4, 2, kty="bf16")
        refused(U, "V \\(i32", "f32", 256, 16, 4, 2, vty="i32")
        strided = Tensor("f16", (16, 2, 1, 1), (2, 64, 128, 128))
        refused(U, "strided", "f32", 256, 16, 4, 2, outputs=[outs[0], strided, outs[2]])
        refused(R, "V \\[16, 2, 1, 1\\] is not", "f32", 256, 16, 4, 2, outputs=[*outs[:2], outs[1]])
        refused(U, "D \\* H = M", "f32", 256, 16, 4, 2, outputs=[tensor("f32", [16, 3]), *outs[1:]])
        # One K (the weights' types are each group's: below).
        refused(
            R, "one K", "f32", 256, 16, 4, 2, inputs=[ins[0], tensor("f32", [128, 32])] + ins[2:]
        )
        # The groups' ops' refusals, named after the projection.
        refused(U, "Q over 4 column\\(s\\): .*mode", "f32", 256, 16, 4, 2, mode=1)
        refused(U, "n_dims", "f32", 256, 16, 4, 2, n_dims=32)
        refused(U, "V over 3 column\\(s\\): .*f16 output", "f32", 256, 3, 4, 3, kty="f32", n_dims=2)
        refused(U, "too large", "f32", 16384, 64, 8, 2)
        refused(U, "positions", "f32", 256, 16, 4, 2, 2, P=1)
        refused(U, "frequency factors", "f32", 256, 16, 4, 2, inputs=[*ins, tensor("f32", [4])])
        # Fewer columns than projections.
        two = dataclasses.replace(ARCHS["aie2"], columns=2)
        with mock.patch.dict(ARCHS, {"aie2": two}):
            refused(U, "do not go round", "f32", 256, 16, 4, 2, arch="aie2")
        # op_params past eps.
        refused(U, "op_params", "f32", 256, 16, 4, 2, params=rope_params(16, 0) + [1])
        # A weight type one group's op refuses for its projection, the others' planning: V's
        # 9 rows of 210-byte q6_K rows (K = 256) are no whole words over any of its cores,
        # where K's 9 rows of q4_K (144 bytes) are.
        tys = ("q4_K", "q4_K", "q6_K")
        odd = dict(n_dims=2, kty="f32", vty="f32")
        refused(U, "V over 3 column\\(s\\): .*q6_K", tys, 256, 3, 4, 3, **odd)
        self.assertIsNotNone(qkv_spec(("q4_K",) * 3, 256, 3, 4, 3, **odd))
        # What is compiled: a few tokens below the GEMM's rows, K and V in f32, odd heads.
        self.assertIsNotNone(qkv_spec("f32", 256, 16, 4, 2, 3, kty="f32", vty="f32"))
        self.assertIsNotNone(qkv_spec("f32", 48, 6, 5, 3, 2, 2, n_dims=4, vty="f32"))
        # ... and weights of three types (no "one type" refusal any more).
        self.assertIsNotNone(qkv_spec(("f32", "q4_0", "bf16"), 256, 16, 4, 2, kty="f32"))


class QkvRecordTest(unittest.TestCase):
    """Llama-sized decode shapes record against the emulation's stand-in, which checks every
    shim DMA, the descriptors in flight, the memory tiles and the core memory (no g++ build)."""

    def test_large_shapes_stay_within_the_dma_limits(self):
        from ggml_hsa_iron.emu.compile import record

        cases = [
            # weights, K, D, Hq, Hk, tokens, mode, ff, K's and V's types
            ("q4_0", 2048, 64, 32, 8, 1, 0, True, "f16", "f16"),
            ("f32", 2048, 64, 32, 8, 1, 2, False, "f32", "f16"),
            ("q4_K", 2048, 64, 32, 8, 3, 0, True, "f16", "f32"),
            ("q8_0", 4096, 128, 32, 8, 1, 0, True, "f16", "f16"),  # Llama-3-8B-sized
            ("q4_0", 3072, 128, 24, 8, 2, 0, True, "f16", "f16"),  # Llama-3.2-3B-sized
            # Mixed weights: llama.cpp's Q4_K_M layers (q6_K Wv), Q4_0 with a q8_0 Wv, and
            # the float GEMV's groups beside the decoding GEMV's.
            (("q4_K", "q4_K", "q6_K"), 2048, 64, 32, 8, 1, 0, True, "f16", "f16"),
            (("q4_K", "q4_K", "q6_K"), 4096, 128, 32, 8, 2, 0, True, "f16", "f16"),
            (("q4_0", "q4_0", "q8_0"), 2048, 64, 32, 8, 1, 0, False, "f16", "f32"),
            (("bf16", "q6_K", "f32"), 2048, 64, 32, 8, 1, 0, True, "f32", "f16"),
        ]
        for arch in ("aie2", "aie2p"):
            for ty, K, D, Hq, Hk, T, mode, ff, kty, vty in cases:
                with self.subTest(arch=arch, ty=ty, K=K, D=D, Hq=Hq, T=T, mode=mode):
                    spec = qkv_spec(ty, K, D, Hq, Hk, T, mode, ff, arch, kty, vty)
                    rec = record(spec)  # raises on any limit
                    # Each group's Workers on its columns, calling its object's functions.
                    for g in spec.groups:
                        cols = range(g.col0, g.col0 + g.spec.plan.columns)
                        mine = [w for w in rec.workers if w.tile.col in cols]
                        self.assertEqual(len(mine), g.spec.plan.columns * g.spec.plan.rows)
                    for k in rec.kernels:
                        g = k.object_file_name.removesuffix(".o")[-1]
                        self.assertTrue(k.name.endswith(f"_{g}"), k.name)
                    # Each group's W fifos carry its own weights' tiles: R rows of nr rows of
                    # a K chunk, in its type's bytes (weights of three types: three sizes).
                    fifos = {f.name: f.obj for f in rec.fifos}
                    for g in spec.groups:
                        p, w = g.spec.plan, g.spec.src0
                        unit = 1 if g.spec.weight_bytes else DTYPES[w.dtype].size
                        want = p.rows * p.rows_per_tile * p.w_units(p.k_chunk) * unit
                        for col in range(g.col0, g.col0 + p.columns):
                            self.assertEqual(fifos[f"W_c{col}"].bytes, want, (g.name, col))
                            self.assertEqual(fifos[f"W_c{col}"].elem_bytes, unit, (g.name, col))


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class QkvCompileTest(unittest.TestCase):
    def test_the_emulation_target_writes_a_kernel_of_nine_operands(self):
        # What `--target emu compile` installs: the image (its program takes the 9 operands,
        # drains write the last three, one library of the three groups' objects) and the hsaco
        # of 9 operands.
        import struct
        import tempfile

        from ggml_hsa_iron import hsaco
        from ggml_hsa_iron.emu.compile import compile_emu

        req = parse_request(qkv_request("q4_0", 256, 16, 4, 2, 1, 0, True, "aie2"))
        with tempfile.TemporaryDirectory() as d:
            compile_emu(req, Path(d))
            image = (Path(d) / f"{req.name}.pdi").read_bytes()
            insts = (Path(d) / f"{req.name}_insts.bin").read_bytes()
            code = (Path(d) / f"{req.name}.hsaco").read_bytes()
        version, json_len, lib_len, _ = struct.unpack("<4I", image[8:24])
        self.assertEqual(
            (image[:8], version, len(image)), (b"HSASIMK1", 2, 24 + json_len + lib_len)
        )
        prog = json.loads(image[24 : 24 + json_len])
        self.assertEqual(len(prog["args"]), 10)  # 7 inputs (with the factors), Q, K, V
        drained = {op["arg"] for op in prog["sequence"] if op["op"] == "drain"}
        self.assertEqual(drained, {7, 8, 9})
        filled = {op["arg"] for op in prog["sequence"] if op["op"] == "fill"}
        self.assertEqual(filled, set(range(7)))
        names = {k["name"] for k in prog["kernels"]}
        self.assertEqual({n.rsplit("_", 1)[1] for n in names}, {"q", "k", "v"})
        self.assertEqual(code, hsaco.single_kernel("aie2", req.name, image, insts, 10, 4))


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
def head_norm_reference(y, err, w, D):
    """qwen3's norm of each head of y [T, M] (heads of D rows) as the cores compute it: s =
    1 / sqrt(mean(h^2) + eps) in f32, h * s, then times the weights w [D]; (the values, their
    tolerance: y's error scaled, and f32 rounding)."""
    T, M = y.shape
    h = y.reshape(T, M // D, D)
    s = 1 / np.sqrt((h * h).mean(axis=2, keepdims=True) + HEAD_EPS)
    out = (h * s * w.astype(np.float64)).reshape(T, M)
    scale = np.broadcast_to(s * np.abs(w), h.shape).reshape(T, M)
    # A head's s moves with its values' errors: ds / s <= sum(|h| err) / sum(h^2).
    e = err.reshape(T, M // D, D)
    rel = (np.abs(h) * e).sum(axis=2, keepdims=True) / (h * h).sum(axis=2, keepdims=True)
    rel = np.broadcast_to(rel, h.shape).reshape(T, M)
    return out, err * scale + rel * np.abs(out) + np.abs(out) * 2e-6


class QkvEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu` and its recorded program run on real data."""

    def run_case(self, ty, K, D, Hq, Hk, T, mode, ff, arch, kty, vty, seed=0, **kw):
        """(the request, the operands' bytes, the outputs' bytes) after checking each output
        against numpy. kw `head_norm`: Q's and K's heads normalised (qwen3); `bias`: Q's, K's
        and V's biases (qwen2)."""
        n_dims = kw.get("n_dims") or D
        head_norm, bias = kw.get("head_norm", False), kw.get("bias", False)
        text = qkv_request(ty, K, D, Hq, Hk, T, mode, ff, arch, kty, vty, P=T + 2, **kw)
        spec = prepare(parse_request(text))
        nrng, rng = np.random.default_rng(seed), random.Random(seed)
        types = weight_types(ty)
        ws = [norm_weights(t, D * H, K, nrng, rng) for t, H in zip(types, (Hq, Hk, Hk))]
        x, n = norm_inputs(nrng, T, K)
        pos = nrng.integers(0, 4096, T + 2).astype(np.int32)  # the last two are not read
        ffv = np.array(llama3_ff(n_dims), np.float32) if ff else None
        ins = [b for b, _ in ws] + [x.tobytes(), n.tobytes(), pos.tobytes()]
        ins += [ffv.tobytes()] if ff else []
        norms = [nrng.uniform(0.2, 2, D).astype(np.float32) for _ in range(2 * head_norm)]
        ins += [w.tobytes() for w in norms]
        biases = [nrng.uniform(-1, 1, D * H).astype(np.float32) for H in (Hq, Hk, Hk) if bias]
        ins += [b.tobytes() for b in biases]
        outs = run_request_outputs(text, ins)
        for i, (g, t, (_, w), out, dt) in enumerate(
            zip(spec.groups, types, ws, outs, ("f32", kty, vty))
        ):
            y, err = norm_reference(t, x, n, w)
            if bias:
                y = y + biases[i].astype(np.float64)
                err = err + np.abs(y) * 2.0**-24
            if g.spec.rope is not None and head_norm:
                y, err = head_norm_reference(y, err, norms[i], D)
            if g.spec.rope is not None:
                y, err = rope_reference(
                    y, err, pos, ffv, n_dims, mode == 2, g.spec.rope.constants, D
                )
            if dt == "f16":
                err = err + f16_half_ulp(y)
            got = np.frombuffer(out, np.float16 if dt == "f16" else np.float32)
            got = got.astype(np.float64).reshape(y.shape)
            bad = ~(np.abs(got - y) <= err + 1e-30)  # NaN (an output left unwritten) fails too
            if bad.any():
                i = tuple(np.argwhere(bad)[0])
                self.fail(
                    f"{g.name.upper()} of {t} ({types}) K={K} D={D} mode={mode} ff={ff} {arch}: "
                    f"{int(bad.sum())} of {got.size} wrong, first at {i}: {got[i]} vs {y[i]} "
                    f"(tolerance {err[i]})"
                )
        return text, ins, outs

    def check_singles(self, text, ins, outs):
        """Each output bit for bit the separate design's (RMS_NORM_MUL_MAT_ROPE for Q and K,
        RMS_NORM_MUL_MAT for V) planned over the group's columns (the same plan: the three
        groups side by side change nothing of each), and over the whole array where that
        plan chunks K alike (the same sums, s, rotation and rounding of each value). Returns
        how many outputs the latter compared."""
        spec = prepare(parse_request(text))
        wq, wk, wv, x, n, *consts = ins
        operands = [[wq, x, n, *consts], [wk, x, n, *consts], [wv, x, n]]
        compared = 0
        for g, single, ops, out in zip(spec.groups, single_requests(spec.request), operands, outs):
            req = parse_request(single)
            over = prepare_rms_norm_mul_mat_rope if g.spec.rope else prepare_rms_norm_mul_mat
            (same,) = run_spec_outputs(over(req, columns=g.columns), ops)
            self.assertEqual(same, out, f"{g.name.upper()} differs from its op's design")
            if prepare(req).plan.k_chunk == g.spec.plan.k_chunk:
                self.assertEqual(run_request(single, ops), out, f"{g.name.upper()} differs")
                compared += 1
        return compared

    def test_llama_3_2_1b(self):
        cases = [
            # weights, mode, ff, K's and V's types, arch
            ("f32", 0, True, "f16", "f16", "aie2p"),
            ("f32", 0, False, "f32", "f32", "aie2"),
            ("q4_0", 2, False, "f32", "f32", "aie2p"),
            ("q4_0", 0, True, "f16", "f16", "aie2"),
            ("q4_0", 0, False, "f16", "f32", "aie2p"),
            ("q8_0", 0, True, "f32", "f16", "aie2"),
        ]
        for i, (ty, mode, ff, kty, vty, arch) in sample.pick(enumerate(cases)):
            with self.subTest(ty=ty, mode=mode, ff=ff, kty=kty, vty=vty, arch=arch):
                self.run_case(ty, 2048, 64, 32, 8, 1, mode, ff, arch, kty, vty, seed=i)

    def test_small_odd_shape(self):
        # Heads of 6 rows (n_dims 4: the rest passes through), K off the vector lanes, two
        # tokens, NeoX, the frequency factors; Q's 30 rows over its columns with a shifted last
        # round.
        self.run_case("f32", 30, 6, 5, 3, 2, 2, True, "aie2", "f16", "f32", seed=9, n_dims=4)
        self.run_case("q4_0", 64, 6, 7, 3, 1, 0, False, "aie2p", "f32", "f16", seed=8, n_dims=4)

    def test_a_few_tokens_at_once(self):
        # Llama-3.2-1B's Q, K and V of 4 tokens: each group's GEMV takes them at once
        # (GemvPlan.nx), K and V written as f16 cache rows.
        text, ins, outs = self.run_case("q4_0", 2048, 64, 32, 8, 4, 0, True, "aie2p", "f16", "f16")
        self.assertEqual({g.spec.plan.nx for g in prepare(parse_request(text)).groups}, {4})
        self.check_singles(text, ins, outs)

    def test_mixed_weight_types(self):
        # Llama-3.2-1B's shapes with llama.cpp's Q4_K_M layers (q4_K Wq and Wk, q6_K Wv) and
        # Q4_0 with a q8_0 Wv, aie2p and aie2: against numpy, and each output bit for bit the
        # design of its op alone over the group's columns (its weight type's object; over the
        # whole array too where that plan chunks K alike).
        cases = [
            (("q4_K", "q4_K", "q6_K"), 0, True, "f16", "f16", "aie2p"),
            (("q4_K", "q4_K", "q6_K"), 2, False, "f16", "f32", "aie2"),
            (("q4_0", "q4_0", "q8_0"), 0, True, "f16", "f16", "aie2"),
            (("q4_0", "q4_0", "q8_0"), 0, False, "f32", "f16", "aie2p"),
        ]
        for i, (ty, mode, ff, kty, vty, arch) in sample.pick(enumerate(cases)):
            with self.subTest(ty=ty, mode=mode, ff=ff, kty=kty, vty=vty, arch=arch):
                text, ins, outs = self.run_case(
                    ty, 2048, 64, 32, 8, 1, mode, ff, arch, kty, vty, seed=20 + i
                )
                self.check_singles(text, ins, outs)
        # A small odd shape whose groups link both sources (mv.cc for Wq, mvq.cc for Wk, Wv)
        # into one library: two tokens, heads of 6 rows, shifted last rounds.
        ty = ("f32", "q8_0", "q4_0")
        text, ins, outs = self.run_case(
            ty, 64, 6, 7, 3, 2, 0, True, "aie2p", "f16", "f32", seed=29, n_dims=4
        )
        self.assertEqual(self.check_singles(text, ins, outs), 3)

    def test_qwen3_head_norms(self):
        # Qwen3-0.6B's shapes (K = 1024, heads of 128, 16 / 8 heads, NeoX): each core's rows of
        # a round whole heads, normalised before the rotation; a small shape with normal
        # rotation, the frequency factors and two tokens.
        cases = [
            ("q4_0", 1024, "f16", "f16", "aie2p"),
            ("f32", 1024, "f32", "f16", "aie2"),
        ]
        for i, (ty, K, kty, vty, arch) in sample.pick(enumerate(cases)):
            with self.subTest(ty=ty, arch=arch):
                self.run_case(
                    ty, K, 128, 16, 8, 1, 2, False, arch, kty, vty, seed=40 + i, head_norm=True
                )
        self.run_case(
            "f32", 64, 8, 5, 3, 2, 0, True, "aie2p", "f16", "f32", seed=49, head_norm=True
        )

    def test_qwen2_biases(self):
        # Qwen2.5-0.5B's shapes (K = 896, heads of 64, 14 / 2 heads, NeoX): each column's bias
        # values sent once, each core adding its own after the norm's scale, before the
        # rotation and the f16 rounding; a small shape with normal rotation, the frequency
        # factors and two tokens.
        cases = [
            ("q4_0", "f16", "f16", "aie2p"),
            ("q8_0", "f32", "f16", "aie2"),
        ]
        for i, (ty, kty, vty, arch) in sample.pick(enumerate(cases)):
            with self.subTest(ty=ty, arch=arch):
                self.run_case(
                    ty, 896, 64, 14, 2, 1, 2, False, arch, kty, vty, seed=50 + i, bias=True
                )
        self.run_case("f32", 64, 8, 4, 2, 2, 0, True, "aie2p", "f16", "f32", seed=59, bias=True)
        # Three tokens at once (GemvPlan.nx): each token's rows get the same bias values.
        text, _, _ = self.run_case(
            "q4_0", 896, 64, 14, 2, 3, 2, False, "aie2p", "f16", "f16", seed=58, bias=True
        )
        self.assertEqual({g.spec.plan.nx for g in prepare(parse_request(text)).groups}, {3})

    def test_bit_for_bit_the_separate_designs(self):
        # Llama-3.2-1B on aie2: Q's group plans as RMS_NORM_MUL_MAT_ROPE's whole-array design
        # does (K and V take fewer, larger K chunks over the whole array); a small shape whose
        # groups all chunk K as their ops do over the whole array.
        text, ins, outs = self.run_case("q4_0", 2048, 64, 32, 8, 1, 0, True, "aie2", "f16", "f16")
        self.assertEqual(self.check_singles(text, ins, outs), 1)
        text, ins, outs = self.run_case(
            "f32", 48, 6, 5, 3, 2, 2, False, "aie2", "f32", "f16", n_dims=4
        )
        self.assertEqual(self.check_singles(text, ins, outs), 3)


if __name__ == "__main__":
    unittest.main()
