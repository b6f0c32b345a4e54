"""The declared capabilities are exactly what the design registry implements."""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ast
import json
import re
import subprocess
import unittest

from ggml_hsa_iron import registry
from ggml_hsa_iron.capabilities import capabilities, capabilities_json
from ggml_hsa_iron.dtypes import ALL_TYPES, FLOAT_TYPES, QUANT_TYPES
from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request

from ggml_hsa_iron.tests.util import request_json, tensor

PACKAGE = Path(__file__).resolve().parent.parent
SRC = PACKAGE.parent
KERNELS = PACKAGE / "kernels"

# The seed's kernel list: what the package must implement.
SEED_BINARY = ["ADD", "SUB", "MUL", "DIV"]
SEED_UNARY = [
    "ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU",
    "GELU_QUICK", "SILU", "HARDSWISH", "HARDSIGMOID", "EXP", "GELU_ERF",
]  # fmt: skip
# The other element-wise ops the backend sends (src/ops/plan.rs); SCALE and CLAMP
# carry two op_params words.
EXTRA_UNARY = ["SQR", "SQRT", "LOG", "SIN", "COS", "FLOOR", "CEIL", "ROUND", "TRUNC"]
WITH_PARAMS = ["SCALE", "CLAMP"]
ROW_OPS = [
    "RMS_NORM",
    "NORM",
    "RMS_NORM_MUL",
    "RMS_NORM_MUL_ADD",
    "SOFT_MAX",
    "SOFT_MAX_MASK",
    "SOFT_MAX_SINKS",
    "SOFT_MAX_MASK_SINKS",
    "ARGMAX",
]


def row_request(op: str, dtype: str, arch: str) -> str:
    """A request of the row design `op` in which some operand has `dtype`."""
    x = tensor("f32", [64, 8, 4])
    if op == "ARGMAX":
        return request_json(op, [tensor("f32", [64, 32])], tensor("i32", [32]), arch=arch)
    inputs = [x]
    if op.startswith("SOFT_MAX_MASK"):
        inputs.append(tensor(dtype, [64, 8]))
    if op.endswith("SINKS"):
        inputs.append(tensor("f32", [4]))
    if op == "RMS_NORM_MUL_ADD":
        inputs.append(tensor("f32", [64, 8, 4]))
    if op in ("RMS_NORM_MUL", "RMS_NORM_MUL_ADD"):
        inputs.append(tensor("f32", [64]))
    return request_json(op, inputs, x, arch=arch)


# The GLU family (x, g; f32/f16/bf16) and ROPE (x, positions[, frequency
# factors]; 11 op_params words).
GLU = ["REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK"]
# The backend's fusion of MUL_MAT(W_g, x), MUL_MAT(W_u, x) and their split GLU.
MM_GLU = [f"MUL_MAT_{op}" for op in GLU]
NORM_MM = ["RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_BIAS"] + [f"RMS_NORM_MUL_MAT_{op}" for op in GLU]
# The projections that take f16 outputs (the V projection into the KV cache; with qwen2's bias).
NORM_MM_V = ("RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_BIAS")
# The Q and K projections with the norm folded in and their ROPE (positions i32, 12 op_params;
# with qwen3's heads' norm, its weights and eps: 13; with qwen2's bias, the bias).
NORM_MM_ROPE = [
    "RMS_NORM_MUL_MAT_ROPE",
    "RMS_NORM_MUL_MAT_ROPE_FF",
    "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE",
    "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE_FF",
    "RMS_NORM_MUL_MAT_BIAS_ROPE",
    "RMS_NORM_MUL_MAT_BIAS_ROPE_FF",
]
# Q, K and V of one normalised x in one kernel (three outputs; the inputs of both above).
NORM_QKV = [
    "RMS_NORM_QKV_ROPE",
    "RMS_NORM_QKV_ROPE_FF",
    "RMS_NORM_QKV_HEAD_NORM_ROPE",
    "RMS_NORM_QKV_HEAD_NORM_ROPE_FF",
    "RMS_NORM_QKV_BIAS_ROPE",
    "RMS_NORM_QKV_BIAS_ROPE_FF",
]
# A feed-forward block in one kernel (RMS_NORM_MUL_MAT_<glu>, then MUL_MAT_ADD; two outputs).
NORM_FFN = [f"RMS_NORM_FFN_{op}" for op in GLU]
# The attention output projection and residual ADD ahead of the feed-forward block (MUL_MAT_ADD,
# then RMS_NORM_FFN_<glu>'s phases; three outputs).
ATTN_FFN = [f"MUL_MAT_ADD_RMS_NORM_FFN_{op}" for op in GLU]
# A decode step's attention (FLASH_ATTN_EXT_MASK) ahead of that block (four outputs).
FA_FFN = [f"FLASH_ATTN_FFN_{op}" for op in GLU]
# The same without the block's down projection (three outputs).
FA_GLU = [f"FLASH_ATTN_GLU_{op}" for op in GLU]
# A decode step's layer: RMS_NORM_QKV_ROPE(_FF) ahead of FLASH_ATTN_FFN_<glu> (seven outputs);
# qwen2's with the biases, qwen3's with the head norms (no _FF variants).
DECODE = [
    f"DECODE_LAYER_{kind}{op}"
    for op in GLU
    for kind in ("", "FF_", "BIAS_", "HEAD_NORM_", "POST_NORM_", "HEAD_NORM_POST_NORM_")
]
ROPE = ["ROPE", "ROPE_FF"]
# The copies and the KV-cache write (f32/f16/bf16; SET_ROWS' i32/i64 indices).
COPIES = ["DUP", "CPY", "CONT"]
# The whole-tensor reductions to one scalar (designs/reduce_ops.py).
REDUCTIONS = ["COUNT_EQUAL", "CROSS_ENTROPY_LOSS"]
WITH_F16 = GLU + ROPE + COPIES + ["SET_ROWS"]


def qkv_request(op: str, q, k, v, arch: str = "aie2p") -> str:
    """RMS_NORM_QKV_ROPE(_FF) of K = 256, heads of 16 (4 for Q, 2 for K), one token, each
    projection's (weights, x, output) types `q`, `k`, `v` (x: q's)."""
    ins = [tensor(c[0], [256, m]) for c, m in zip((q, k, v), (64, 32, 32))]
    ins += [tensor(q[1], [256, 1]), tensor("f32", [256]), tensor("i32", [1])]
    if op.endswith("_FF"):
        ins.append(tensor("f32", [8]))
    params = [0, 16, 0, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0, 0x3727C5AC]
    if "_HEAD_NORM_" in op:
        ins += [tensor("f32", [16])] * 2
        params.append(0x358637BD)  # eps 1e-6
    if "_BIAS_" in op:
        ins += [tensor("f32", [m]) for m in (64, 32, 32)]
    outs = [tensor(q[2], [16, 4, 1]), tensor(k[2], [16, 2, 1]), tensor(v[2], [32, 1])]
    return request_json(op, ins, outs[0], arch=arch, op_params=params, extra_outputs=outs[1:])


def defined_functions(source: str) -> set[str]:
    tree = ast.parse((PACKAGE / "designs" / source).read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def eltwise_specs():
    return [s for s in registry.OPS if s.kind in ("unary", "binary", "glu")]


class CapabilitiesTest(unittest.TestCase):
    def test_shape_of_the_answer(self):
        caps = capabilities()
        self.assertEqual(caps["protocol"], 1)
        self.assertEqual(caps["archs"], ["aie2", "aie2p"])
        for op in caps["ops"]:
            for key, kind in (
                ("op", str),
                ("inputs", int),
                ("types", list),
                ("broadcast", bool),
                ("noncontiguous", bool),
            ):
                self.assertIsInstance(op[key], kind, op["op"])
            # MUL_MAT's weights may also be f16 or block-quantized; f16 elsewhere as listed.
            mm = (
                op["op"] in ("MUL_MAT", "MUL_MAT_ADD")
                or op["op"] in MM_GLU + NORM_MM + NORM_MM_ROPE + NORM_QKV
                or op["op"] in NORM_FFN + ATTN_FFN + FA_FFN + FA_GLU + DECODE
            )
            extra = set(("f16",) + QUANT_TYPES) if mm else {"f16"}
            if op["op"] in ("SET_ROWS", "COUNT_EQUAL"):
                extra.add("i64")  # SET_ROWS' indices, COUNT_EQUAL's count
            self.assertTrue(set(op["types"]) <= set(ALL_TYPES) | extra, op["op"])

    FLASH_ATTN = [
        "FLASH_ATTN_EXT", "FLASH_ATTN_EXT_MASK", "FLASH_ATTN_EXT_SINKS", "FLASH_ATTN_EXT_MASK_SINKS",
    ]  # fmt: skip

    def test_the_seed_list_is_declared(self):
        ops = {o["op"]: o for o in capabilities()["ops"]}
        self.assertEqual(
            sorted(ops),
            sorted(
                SEED_BINARY
                + SEED_UNARY
                + EXTRA_UNARY
                + WITH_PARAMS
                + ["MUL_MAT", "MUL_MAT_ADD"]
                + MM_GLU
                + NORM_MM
                + NORM_MM_ROPE
                + NORM_QKV
                + NORM_FFN
                + ATTN_FFN
                + FA_FFN
                + FA_GLU
                + DECODE
                + ROW_OPS
                + GLU
                + ROPE
                + COPIES
                + ["SET_ROWS", "CPY_ROWS"]
                + self.FLASH_ATTN
                + REDUCTIONS
            ),
        )
        for op, n in zip(self.FLASH_ATTN, (3, 4, 4, 5)):
            o = ops[op]
            self.assertEqual((o["inputs"], o["broadcast"], o["noncontiguous"]), (n, True, True))
            self.assertEqual(o["types"], ["f32", "f16", "bf16"])
        for op in COPIES:
            self.assertEqual((ops[op]["inputs"], ops[op]["noncontiguous"]), (1, True))
        self.assertEqual(ops["SET_ROWS"]["inputs"], 2)
        self.assertTrue(ops["SET_ROWS"]["broadcast"])
        for op in GLU:
            self.assertEqual(ops[op]["inputs"], 2)
            self.assertEqual(ops[op]["types"], ["bf16", "f16", "f32"])
            self.assertFalse(ops[op]["broadcast"])
            self.assertTrue(ops[op]["noncontiguous"])
        self.assertEqual([ops[op]["inputs"] for op in ROPE], [2, 3])
        for op in MM_GLU:
            self.assertEqual(ops[op]["inputs"], 3)
            self.assertEqual(ops[op]["types"], ["bf16", "f16", "f32", *QUANT_TYPES])
            self.assertEqual((ops[op]["broadcast"], ops[op]["noncontiguous"]), (True, True))
            self.assertEqual(ops[op]["kernel_source"], "mul_mat.py")
            # MUL_MAT's with an f32 output, but bf16 activations over weights moved as bytes
            # (the GEMM alone takes those; the fused GEMV reads f32 x).
            self.assertEqual(
                ops[op]["type_combos"],
                [
                    list(c)
                    for c in registry.MUL_MAT_COMBOS
                    if c[2] == "f32" and (c[1] == "f32" or c[0] == "bf16")
                ],
            )
        for op in SEED_BINARY:
            self.assertEqual(ops[op]["inputs"], 2)
            self.assertTrue(ops[op]["broadcast"])
        for op in SEED_UNARY + EXTRA_UNARY + WITH_PARAMS:
            self.assertEqual(ops[op]["inputs"], 1)
            self.assertFalse(ops[op]["broadcast"])
        for op in EXTRA_UNARY + WITH_PARAMS:
            self.assertEqual(ops[op]["types"], list(FLOAT_TYPES), op)
        params = {
            s.op
            for s in registry.OPS
            if s.params
            and s.kind
            not in (
                "rows",
                "rope",
                "flash_attn",
                "rms_norm_mul_mat",
                "rms_norm_mul_mat_rope",
                "rms_norm_qkv_rope",
                "rms_norm_ffn",
                "mul_mat_add_rms_norm_ffn",
                "flash_attn_ffn",
                "flash_attn_glu",
                "decode_layer",
            )
        }
        self.assertEqual(params, set(WITH_PARAMS))
        # eps
        self.assertEqual({s.params for s in registry.OPS if s.kind == "rms_norm_mul_mat"}, {1})
        self.assertEqual({s.params for s in registry.OPS if s.op in WITH_PARAMS}, {2})
        # scale, max_bias, logit_softcap
        self.assertEqual({s.params for s in registry.OPS if s.kind == "flash_attn"}, {3})
        self.assertEqual({s.params for s in registry.OPS if s.kind == "rope"}, {11})
        o = ops["MUL_MAT_ADD"]
        self.assertEqual((o["inputs"], o["broadcast"], o["noncontiguous"]), (3, True, True))
        self.assertEqual(o["types"], ["bf16", "f16", "f32", *QUANT_TYPES])
        self.assertEqual(o["kernel_source"], "mul_mat.py")
        self.assertEqual(
            o["type_combos"],
            [list(c) for c in registry.MUL_MAT_COMBOS if c[1:] == ("f32", "f32")],
        )
        for op in NORM_MM:  # the weights, (the up weights,) x, n, (the bias); eps
            o = ops[op]
            want = (3 if op == "RMS_NORM_MUL_MAT" else 4, True, True, "mul_mat.py")
            got = (o["inputs"], o["broadcast"], o["noncontiguous"], o["kernel_source"])
            self.assertEqual(got, want, op)
            want = ops["MUL_MAT_ADD"]["type_combos"]
            if op in NORM_MM_V:
                # ... and MUL_MAT's f16 outputs of f32 x (the V projection into the KV cache).
                want = want + [c for c in ops["MUL_MAT"]["type_combos"] if c[1:] == ["f32", "f16"]]
            self.assertEqual(o["type_combos"], want, op)
        # W, x, n, the positions (, the frequency factors); ROPE's 11 words and eps.
        for op, n in zip(NORM_MM_ROPE, (4, 5, 5, 6, 5, 6)):
            o = ops[op]
            got = (o["inputs"], o["broadcast"], o["noncontiguous"], o["kernel_source"])
            self.assertEqual(got, (n, True, True, "mul_mat.py"), op)
            self.assertEqual(o["type_combos"], ops["RMS_NORM_MUL_MAT"]["type_combos"], op)
            self.assertIn("i32", o["types"])
        self.assertEqual(
            {s.op: s.params for s in registry.OPS if s.kind == "rms_norm_mul_mat_rope"},
            {op: 13 if "_HEAD_NORM_" in op else 12 for op in NORM_MM_ROPE},
        )
        # Wq, Wk, Wv, x, n, the positions (, the frequency factors); RMS_NORM_MUL_MAT_ROPE's
        # words; Q, then K and V (ops of several outputs: these and RMS_NORM_FFN_<glu>).
        for op, n in zip(NORM_QKV, (6, 7, 8, 9, 9, 10)):
            o = ops[op]
            got = (o["inputs"], o["outputs"], o["broadcast"], o["noncontiguous"])
            self.assertEqual(got, (n, 3, True, True), op)
            self.assertEqual(o["kernel_source"], "mul_mat.py")
            # Per projection its (weights, x, output) triples, independent of the others': Q
            # RMS_NORM_MUL_MAT_ROPE's of an f32 output, K RMS_NORM_MUL_MAT_ROPE's, V
            # RMS_NORM_MUL_MAT's; no `type_combos`, whose triples would be the request's.
            rope = ops["RMS_NORM_MUL_MAT_ROPE"]["type_combos"]
            want = {
                "Q": [c for c in rope if c[2] == "f32"],
                "K": rope,
                "V": ops["RMS_NORM_MUL_MAT"]["type_combos"],
            }
            self.assertEqual(o["group_type_combos"], want, op)
            self.assertNotIn("type_combos", o, op)
            self.assertEqual(o["types"], ops["RMS_NORM_MUL_MAT_ROPE"]["types"], op)
        self.assertEqual(
            {s.op: s.params for s in registry.OPS if s.kind == "rms_norm_qkv_rope"},
            {op: 13 if "_HEAD_NORM_" in op else 12 for op in NORM_QKV},
        )
        self.assertEqual(
            {o["op"] for o in ops.values() if "outputs" in o},
            set(NORM_QKV + NORM_FFN + ATTN_FFN + FA_FFN + FA_GLU + DECODE + ["CPY_ROWS"]),
        )
        # CPY_ROWS: one output per row of its input.
        self.assertEqual((ops["CPY_ROWS"]["inputs"], ops["CPY_ROWS"]["outputs"]), (1, 0))
        # W_g, W_u, W_d, x, n, r; eps; out, then h (extra_outputs).
        for op in NORM_FFN:
            o = ops[op]
            got = (o["inputs"], o["outputs"], o["broadcast"], o["noncontiguous"])
            self.assertEqual(got, (6, 2, True, True), op)
            self.assertEqual(o["kernel_source"], "ffn.py")
            self.assertEqual(o["type_combos"], ops["RMS_NORM_MUL_MAT_SWIGLU"]["type_combos"], op)
            self.assertEqual(o["types"], ops["RMS_NORM_MUL_MAT_SWIGLU"]["types"], op)
        self.assertEqual({s.params for s in registry.OPS if s.kind == "rms_norm_ffn"}, {1})
        # W_o, a, r0, W_g, W_u, W_d, n; eps; out, then r1 and h (extra_outputs).
        for op in ATTN_FFN:
            o = ops[op]
            got = (o["inputs"], o["outputs"], o["broadcast"], o["noncontiguous"])
            self.assertEqual(got, (7, 3, True, True), op)
            self.assertEqual(o["kernel_source"], "ffn.py")
            self.assertEqual(o["type_combos"], ops["RMS_NORM_FFN_SWIGLU"]["type_combos"], op)
            self.assertEqual(o["types"], ops["RMS_NORM_FFN_SWIGLU"]["types"], op)
        self.assertEqual(
            {s.params for s in registry.OPS if s.kind == "mul_mat_add_rms_norm_ffn"}, {1}
        )
        # q, k, v, mask, W_o, r0, W_g, W_u, W_d, n; scale, max_bias, softcap, eps; out, then a,
        # r1 and h (extra_outputs); the block's combos, K and V of FLASH_ATTN_EXT's types.
        for op in FA_FFN:
            o = ops[op]
            got = (o["inputs"], o["outputs"], o["broadcast"], o["noncontiguous"])
            self.assertEqual(got, (10, 4, True, True), op)
            self.assertEqual(o["kernel_source"], "ffn.py")
            want = ops["MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU"]["type_combos"]
            self.assertEqual(o["type_combos"], want, op)
            self.assertEqual(o["types"], ops["MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU"]["types"], op)
            self.assertEqual(sorted(o["kv_types"]), sorted(ops["FLASH_ATTN_EXT"]["types"]), op)
        self.assertEqual({s.params for s in registry.OPS if s.kind == "flash_attn_ffn"}, {4})
        # FLASH_ATTN_FFN_<glu>'s without W_d: a and r1 (extra_outputs) after h.
        for op in FA_GLU:
            o, ffn = ops[op], ops["FLASH_ATTN_FFN_SWIGLU"]
            got = (o["inputs"], o["outputs"], o["broadcast"], o["noncontiguous"])
            self.assertEqual(got, (9, 3, True, True), op)
            self.assertEqual(o["kernel_source"], "ffn.py")
            for key in ("type_combos", "types", "kv_types"):
                self.assertEqual(o[key], ffn[key], op)
        self.assertEqual({s.params for s in registry.OPS if s.kind == "flash_attn_glu"}, {4})
        # Wq, Wk, Wv, x, n_attn, the positions, (the factors,) k, v, mask, W_o, W_g, W_u, W_d,
        # n_ffn; 16 op_params words; out, then Q, K rows, V rows, a, r1, h (extra_outputs).
        for op in DECODE:
            o = ops[op]
            got = (o["inputs"], o["outputs"], o["broadcast"], o["noncontiguous"])
            own = 3 if "_BIAS_" in op else 2 if "_HEAD_NORM_" in op else 0
            # gemma's post norms: their weights, o and d.
            post = 2 * ("_POST_NORM_" in op)
            want = 14 + ("_FF_" in op) + own + post
            self.assertEqual(got, (want, 7 + post, True, True), op)
            self.assertEqual(o["kernel_source"], "ffn.py")
            combos = ops["FLASH_ATTN_FFN_SWIGLU"]["type_combos"]
            if "_HEAD_NORM_" in op:
                # q6_K's Q and K rows of whole heads do not fit a core beside the block.
                combos = [c for c in combos if c[0] != "q6_K"]
            self.assertEqual(o["type_combos"], combos, op)
            self.assertEqual(o["kv_types"], ops["FLASH_ATTN_FFN_SWIGLU"]["kv_types"], op)
            self.assertEqual(sorted(o["row_types"]), ["f16", "f32"], op)
        for s in registry.OPS:
            if s.kind == "decode_layer":
                want = 19 if "_POST_NORM_" in s.op else 17 if "_HEAD_NORM_" in s.op else 16
                self.assertEqual(s.params, want, s.op)
        with_f16 = {o["op"] for o in ops.values() if "f16" in o["types"]}
        self.assertTrue(
            set(
                WITH_F16
                + MM_GLU
                + NORM_MM
                + NORM_MM_ROPE
                + NORM_QKV
                + NORM_FFN
                + ATTN_FFN
                + FA_FFN
                + FA_GLU
                + DECODE
                + self.FLASH_ATTN
            )
            | {"MUL_MAT", "MUL_MAT_ADD", "SOFT_MAX_MASK", "SOFT_MAX_MASK_SINKS", "CPY_ROWS"}
            >= with_f16
        )
        self.assertTrue(with_f16 >= set(WITH_F16))

    def test_every_declared_op_has_a_design_function_and_core_source(self):
        for spec in registry.OPS:
            with self.subTest(op=spec.op):
                self.assertIn(spec.kernel_name, defined_functions(spec.source))
        sources = (
            "eltwise.cc",
            "mm.cc",
            "mmq.cc",
            "mv.cc",
            "mvq.cc",
            "rows.cc",
            "rope.cc",
            "ggml_aie.h",
        )
        for source in sources + ("glu.h", "mv_glu.h", "mv_stash.h", "block_decode.h"):
            self.assertTrue((KERNELS / source).is_file(), source)
        eltwise = (KERNELS / "eltwise.cc").read_text()
        glu = (KERNELS / "glu.h").read_text()
        rows = (KERNELS / "rows.cc").read_text()
        self.assertIn('#include "glu.h"', eltwise)
        for source in ("mv.cc", "mvq.cc"):
            text = (KERNELS / source).read_text()
            self.assertIn('#include "glu.h"', text, source)
            self.assertIn('#include "mv_glu.h"', text, source)
            self.assertIn('#include "mv_add.h"', text, source)
        for spec in registry.OPS:
            if spec.kind == "glu":
                self.assertIn(f"defined(GGML_OP_{spec.op})", glu, spec.op)
            elif spec.kind == "mul_mat_glu":
                self.assertIn(f"defined(GGML_OP_{spec.op[len('MUL_MAT_') :]})", glu, spec.op)
            elif spec.kind in ("unary", "binary"):
                self.assertIn(f"defined(GGML_OP_{spec.op})", eltwise, spec.op)
            elif spec.kind == "rows":
                self.assertIn(f"defined(GGML_OP_{spec.op})", rows, spec.op)

    def test_design_files_define_nothing_undeclared(self):
        declared = {s.kernel_name for s in registry.OPS}
        for source in registry.SOURCES:
            ops = {f for f in defined_functions(source) if f.startswith("ggml_op_")}
            self.assertEqual(ops - declared, set(), source)

    def test_every_declared_type_is_accepted_by_the_planner(self):
        # For each op and declared type: a contiguous request of that type plans.
        for spec in registry.OPS:
            for dtype in spec.types:
                for arch in ("aie2", "aie2p"):
                    with self.subTest(op=spec.op, dtype=dtype, arch=arch):
                        if spec.kind == "rope":
                            if dtype == "i32":
                                continue  # the positions' type, covered by f32 and f16
                            ins = [tensor(dtype, [64, 4, 3]), tensor("i32", [3])]
                            if spec.op == "ROPE_FF":
                                ins.append(tensor("f32", [32]))
                            req = request_json(
                                spec.op,
                                ins,
                                tensor(dtype, [64, 4, 3]),
                                arch=arch,
                                op_params=[0, 64, 0, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000],
                            )
                        elif spec.kind == "mul_mat":
                            combos = [c for c in registry.MUL_MAT_COMBOS if dtype in c]
                            self.assertTrue(combos)
                            s0, s1, d = combos[0]
                            req = request_json(
                                "MUL_MAT",
                                # K = 256: whole super-blocks of the K-quants.
                                [tensor(s0, [256, 64]), tensor(s1, [256, 32])],
                                tensor(d, [64, 32]),
                                arch=arch,
                            )
                        elif spec.kind == "mul_mat_glu":
                            combos = [c for c in registry.MUL_MAT_GLU_COMBOS if dtype in c]
                            self.assertTrue(combos)
                            s0, s1, d = combos[0]
                            w = tensor(s0, [256, 64])
                            req = request_json(
                                spec.op,
                                [w, w, tensor(s1, [256, 2])],
                                tensor(d, [64, 2]),
                                arch=arch,
                            )
                        elif spec.kind == "mul_mat_add":
                            combos = [c for c in registry.MUL_MAT_ADD_COMBOS if dtype in c]
                            self.assertTrue(combos)
                            s0, s1, d = combos[0]
                            ins = [tensor(s0, [256, 64]), tensor(s1, [256, 2])]
                            req = request_json(
                                spec.op,
                                ins + [tensor("f32", [64])],  # a bias row
                                tensor(d, [64, 2]),
                                arch=arch,
                            )
                        elif spec.kind == "rms_norm_mul_mat":
                            # The weights of the type; x, n and the output f32.
                            combos = (
                                registry.RMS_NORM_MUL_MAT_COMBOS
                                if spec.op in NORM_MM_V
                                else registry.RMS_NORM_MUL_MAT_GLU_COMBOS
                            )
                            combos = [c for c in combos if dtype in c]
                            self.assertTrue(combos)
                            s0, s1, d = combos[0]
                            w = tensor(s0, [256, 64])
                            ws = [w] if spec.op in NORM_MM_V else [w, w]
                            bias = [tensor("f32", [64])] if spec.op.endswith("_BIAS") else []
                            req = request_json(
                                spec.op,
                                ws + [tensor(s1, [256, 2]), tensor("f32", [256])] + bias,
                                tensor(d, [64, 2]),
                                arch=arch,
                                op_params=[0x3727C5AC],  # eps 1e-5
                            )
                        elif spec.kind == "rms_norm_mul_mat_rope":
                            # The weights of the type (i32: the positions' type, covered by
                            # the others); x, n, the factors and the output f32.
                            if dtype == "i32":
                                continue
                            combos = registry.RMS_NORM_MUL_MAT_ROPE_COMBOS
                            s0, s1, d = [c for c in combos if dtype in c][0]
                            ins = [tensor(s0, [256, 64]), tensor(s1, [256, 1])]
                            ins += [tensor("f32", [256]), tensor("i32", [1])]
                            if spec.op.endswith("_FF"):
                                ins.append(tensor("f32", [8]))
                            params = [0, 16, 0, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000]
                            params += [0, 0, 0x3727C5AC]
                            if "_HEAD_NORM_" in spec.op:
                                ins.append(tensor("f32", [16]))
                                params.append(0x358637BD)  # the heads' eps, 1e-6
                            if "_BIAS_" in spec.op:
                                ins.append(tensor("f32", [64]))
                            req = request_json(
                                spec.op, ins, tensor(d, [16, 4, 1]), arch=arch, op_params=params
                            )
                        elif spec.kind == "rms_norm_qkv_rope":
                            # Each projection the first of its combos with the type (i32: the
                            # positions', covered by the others), else its first: x, n and the
                            # factors f32 (test_qkv_projections_take_their_combos_freely tries
                            # every combo of each projection).
                            if dtype == "i32":
                                continue
                            per = registry.RMS_NORM_QKV_ROPE_COMBOS
                            combos = [
                                next((c for c in per[g] if dtype in c), per[g][0]) for g in "QKV"
                            ]
                            self.assertIn(dtype, {t for c in combos for t in c})
                            req = qkv_request(spec.op, *combos, arch=arch)
                        elif spec.kind == "rms_norm_ffn":
                            # The three weights of the type; x, n, r, out and h f32. K and F
                            # multiples of 512: q6_K's K chunks of whole words.
                            combos = registry.RMS_NORM_FFN_COMBOS
                            s0, s1, d = [c for c in combos if dtype in c][0]
                            w, wd = tensor(s0, [512, 1024]), tensor(s0, [1024, 512])
                            x = tensor(s1, [512, 1])
                            req = request_json(
                                spec.op,
                                [w, w, wd, x, tensor("f32", [512]), x],
                                tensor(d, [512, 1]),
                                arch=arch,
                                op_params=[0x3727C5AC],
                                extra_outputs=[tensor("f32", [1024, 1])],
                            )
                        elif spec.kind == "mul_mat_add_rms_norm_ffn":
                            # The four weights of the type; a, r0, n, out, r1 and h f32. Ka, K
                            # and F multiples of 512: q6_K's K chunks of whole words.
                            combos = registry.MUL_MAT_ADD_RMS_NORM_FFN_COMBOS
                            s0, s1, d = [c for c in combos if dtype in c][0]
                            w, wd = tensor(s0, [512, 1024]), tensor(s0, [1024, 512])
                            x = tensor(s1, [512, 1])
                            req = request_json(
                                spec.op,
                                [tensor(s0, [512, 512]), x, x, w, w, wd, tensor("f32", [512])],
                                tensor(d, [512, 1]),
                                arch=arch,
                                op_params=[0x3727C5AC],
                                extra_outputs=[tensor("f32", [512, 1]), tensor("f32", [1024, 1])],
                            )
                        elif spec.kind in ("flash_attn_ffn", "flash_attn_glu"):
                            # The four (three) weights of the type (or f32 when the type is K's
                            # and V's only); K and V of the type where it is one of theirs,
                            # else f16; q, r0, n and the outputs f32, the mask f16.
                            combos = registry.FLASH_ATTN_FFN_COMBOS
                            s0, s1, d = ([c for c in combos if dtype in c] or combos)[0]
                            kv = dtype if dtype in registry.FLASH_ATTN_FFN_KV_TYPES else "f16"
                            w, wd = tensor(s0, [512, 1024]), tensor(s0, [1024, 512])
                            kvs = [tensor(kv, [64, 256, 2])] * 2
                            ins = [tensor("f32", [64, 1, 8]), *kvs, tensor("f16", [256, 1])]
                            ins += [tensor(s0, [512, 512]), tensor(s1, [512, 1]), w, w, wd]
                            outs = [
                                tensor(d, [512, 1]),
                                tensor("f32", [64, 8, 1]),
                                tensor("f32", [512, 1]),
                                tensor("f32", [1024, 1]),
                            ]
                            if spec.kind == "flash_attn_glu":
                                # No W_d, no out: h first.
                                ins, outs = ins[:-1], [outs[3], *outs[1:3]]
                            req = request_json(
                                spec.op,
                                [*ins, tensor("f32", [512])],
                                outs[0],
                                arch=arch,
                                op_params=[0x3E000000, 0, 0, 0x3727C5AC],
                                extra_outputs=outs[1:],
                            )
                        elif spec.kind == "decode_layer":
                            # The seven weights of the type (f32 when the type is only the
                            # positions' or the caches'); the caches and the K and V rows of
                            # the type where it is theirs, else f16.
                            from ggml_hsa_iron.tests.test_decode_layer import layer_request

                            combos = registry.DECODE_LAYER_COMBOS
                            s0 = ([c for c in combos if dtype in c] or [("f32",)])[0][0]
                            kv = dtype if dtype in registry.FLASH_ATTN_FFN_KV_TYPES else "f16"
                            rows = dtype if dtype in registry.DECODE_LAYER_ROW_TYPES else kv
                            rows = rows if rows in registry.DECODE_LAYER_ROW_TYPES else "f16"
                            ff = "_FF_" in spec.op
                            glu = spec.op.rsplit("LAYER_", 1)[1].removeprefix("FF_")
                            kind = ""
                            for k in ("BIAS", "HEAD_NORM_POST_NORM", "HEAD_NORM", "POST_NORM"):
                                if glu.startswith(k + "_"):
                                    kind, glu = k, glu.removeprefix(k + "_")
                                    break
                            dims = (512, 8, 2, 64, 1024, 256)
                            req = layer_request(
                                glu, s0, dims, arch, ff=ff, kv=kv, rows=rows, kind=kind
                            )
                        elif spec.kind == "rows":
                            req = row_request(spec.op, dtype, arch)
                        elif spec.kind == "copy_rows":
                            # Two rows of the type into two one-row outputs of it.
                            rows = [tensor(dtype, [64]), tensor(dtype, [64])]
                            req = request_json(
                                spec.op,
                                [tensor(dtype, [64, 2])],
                                rows[0],
                                arch=arch,
                                extra_outputs=rows[1:],
                            )
                        elif spec.kind == "set_rows":
                            # Rows f32 (or f16), indices i32 (or i64), the destination of
                            # the type; each declared type in its place.
                            src = dtype if dtype in ("f32", "f16") else "f32"
                            ix = dtype if dtype in ("i32", "i64") else "i64"
                            dst = dtype if dtype in ("bf16", "f16", "f32") else "f32"
                            req = request_json(
                                spec.op,
                                [tensor(src, [64, 2]), tensor(ix, [2])],
                                tensor(dst, [64, 16]),
                                arch=arch,
                            )
                        elif spec.kind == "reduce":
                            # COUNT_EQUAL: i32 inputs, the i64 count; the loss: all f32.
                            t_in = "i32" if spec.op == "COUNT_EQUAL" else "f32"
                            t_out = "i64" if spec.op == "COUNT_EQUAL" else "f32"
                            req = request_json(
                                spec.op,
                                [tensor(t_in, [64, 3])] * 2,
                                tensor(t_out, [1]),
                                arch=arch,
                            )
                        elif spec.kind == "flash_attn":
                            # q f32, K and V of the type (a decode step, GQA), mask f16,
                            # sinks f32; the output f32.
                            ins = [tensor("f32", [64, 1, 4])]
                            ins += [tensor(dtype, [64, 256, 2])] * 2
                            if "MASK" in spec.op:
                                ins.append(tensor("f16", [256, 1]))
                            if "SINKS" in spec.op:
                                ins.append(tensor("f32", [4]))
                            req = request_json(
                                spec.op,
                                ins,
                                tensor("f32", [64, 4, 1]),
                                arch=arch,
                                op_params=[0x3E000000],
                            )
                        else:
                            t = tensor(dtype, [1024])
                            req = request_json(spec.op, [t] * spec.inputs, t, arch=arch)
                        prepare(parse_request(req))

    def test_qkv_projections_take_their_combos_freely(self):
        # RMS_NORM_QKV_ROPE(_FF)'s group_type_combos: every triple of a projection plans with
        # the other projections' triples taken in turn from theirs (weights of up to three
        # types, outputs f32 and f16), on both architectures; triples outside a projection's
        # list are refused.
        ops = {o["op"]: o for o in capabilities()["ops"]}
        for op in NORM_QKV:
            per = {g: [tuple(c) for c in cs] for g, cs in ops[op]["group_type_combos"].items()}
            for arch in ("aie2", "aie2p"):
                for g in "QKV":
                    for i, combo in enumerate(per[g]):
                        combos = [combo if h == g else per[h][i % len(per[h])] for h in "QKV"]
                        with self.subTest(op=op, arch=arch, combos=combos):
                            prepare(parse_request(qkv_request(op, *combos, arch=arch)))
            mixed = [("q4_K", "f32", "f32"), ("q4_K", "f32", "f16"), ("q6_K", "f32", "f16")]
            self.assertTrue(all(c in per[g] for c, g in zip(mixed, "QKV")))
            for combos in (
                [("f32", "f32", "f16"), *mixed[1:]],  # Q is f32
                [mixed[0], ("q4_K", "f32", "bf16"), mixed[2]],
                [("q4_K", "f16", "f32"), *mixed[1:]],  # x (one for the three) is f32
                [*mixed[:2], ("i8", "f32", "f16")],
            ):
                with self.subTest(op=op, refused=combos):
                    self.assertFalse(all(c in per[g] for c, g in zip(combos, "QKV")))
                    with self.assertRaises(UnsupportedError):
                        prepare(parse_request(qkv_request(op, *combos)))

    def test_undeclared_combinations_are_refused_as_unsupported(self):
        t16 = tensor("f16", [64])
        cases = [
            request_json("ADD", [t16, t16], t16),
            request_json("TANH", [tensor("i32", [64])], tensor("i32", [64])),
            request_json("ADD", [tensor("i8", [64]), tensor("f32", [64])], tensor("f32", [64])),
            request_json("ADD", [tensor("i8", [64]), tensor("i16", [64])], tensor("i16", [64])),
            request_json("SQRT", [tensor("i32", [64])], tensor("i32", [64])),
            request_json("RMS_NORM", [tensor("bf16", [64])], tensor("bf16", [64])),
            request_json("RMS_NORM", [tensor("f32", [100000])], tensor("f32", [100000])),
            request_json(
                "SOFT_MAX_MASK",
                [tensor("f32", [15, 4]), tensor("f16", [15, 4])],
                tensor("f32", [15, 4]),
            ),
            request_json("ADD", [tensor("f32", [64])] * 2, tensor("f32", [64]), arch="aie4"),
            request_json(
                "MUL_MAT", [tensor("i8", [64, 64]), tensor("f32", [64, 8])], tensor("f32", [64, 8])
            ),
        ]
        for req in cases:
            with self.subTest(req=req[:80]):
                with self.assertRaises(UnsupportedError):
                    prepare(parse_request(req))

    def test_integer_types_are_declared_exactly_for_the_integer_kernels(self):
        # eltwise.cc has a float section and an integer section; an op declares i8/i16/i32
        # exactly when the integer section implements it.
        text = (KERNELS / "eltwise.cc").read_text()
        float_part, int_part = text.split("#else // COMPUTE_INT", 1)
        int_part = int_part.split('extern "C"', 1)[0]

        def ops_in(part):
            return set(re.findall(r"defined\(GGML_OP_(\w+)\)", part))

        eltwise = {s.op for s in registry.OPS if s.kind in ("unary", "binary", "glu")}
        # The GLU ops' activations are picked in glu.h (shared with the fused GEMVs).
        glu = ops_in((KERNELS / "glu.h").read_text())
        self.assertEqual(ops_in(float_part) | glu, eltwise)
        with_ints = {s.op for s in eltwise_specs() if "i32" in s.types}
        self.assertEqual(ops_in(int_part), with_ints)
        for spec in eltwise_specs():
            ints = {"i8", "i16", "i32"} & set(spec.types)
            self.assertIn(ints, (set(), {"i8", "i16", "i32"}), spec.op)

    def test_kernel_names_of_configs(self):
        self.assertEqual(registry.by_kernel_name("ggml_op_add").op, "ADD")
        self.assertEqual(registry.by_kernel_name("ggml_unary_op_gelu").op, "GELU")
        self.assertIsNone(registry.by_kernel_name("ggml_unary_op_add"))
        self.assertIsNone(registry.by_kernel_name("ggml_op_ADD"))
        self.assertIsNone(registry.by_kernel_name("gelu"))

    def test_cli_prints_only_the_json_without_mlir_aie(self):
        out = subprocess.run(
            [sys.executable, "-m", "ggml_hsa_iron", "capabilities"],
            cwd=SRC,
            capture_output=True,
            text=True,
            check=True,
        )
        self.assertEqual(json.loads(out.stdout), json.loads(capabilities_json()))
        self.assertEqual(out.stderr, "")
        # Whether the CLI imported mlir-aie (or the emulation's stand-in) is asked of a fresh
        # interpreter: this process may hold the stand-in from other tests.
        probe = (
            "import contextlib, io, runpy, sys\n"
            "sys.argv = ['ggml_hsa_iron', 'capabilities']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        runpy.run_module('ggml_hsa_iron', run_name='__main__')\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'aie'))\n"
        )
        imported = subprocess.run(
            [sys.executable, "-c", probe], cwd=SRC, capture_output=True, text=True, check=True
        )
        self.assertEqual(imported.stdout.strip(), "[]", imported.stderr)


if __name__ == "__main__":
    unittest.main()
