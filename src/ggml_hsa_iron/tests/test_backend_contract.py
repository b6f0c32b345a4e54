"""What the backend sends (src/ops, read-only here) against what the package declares.

The backend's planner (src/ops/plan.rs) and op names (src/ops/tensor.rs) decide the
requests: op names, operand order (inputs, then the output), op_params, layouts. These
tests read the op names from the Rust sources so that a rename on either side is caught,
and pin the request shapes the planner documents.
"""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import re
import struct
import tomllib
import unittest

from ggml_hsa_iron import registry
from ggml_hsa_iron.errors import UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request

from ggml_hsa_iron.tests.util import request_json, tensor

SRC = Path(__file__).resolve().parents[2]
TENSOR_RS = SRC / "ops" / "tensor.rs"

# The whole-tensor reductions to one scalar (designs/reduce_ops.py).
REDUCE_OPS = {"COUNT_EQUAL", "CROSS_ENTROPY_LOSS"}
# The attention design's kernels (designs/flash_attn.py): names the planner makes.
FLASH_ATTN_OPS = {
    "FLASH_ATTN_EXT", "FLASH_ATTN_EXT_MASK", "FLASH_ATTN_EXT_SINKS", "FLASH_ATTN_EXT_MASK_SINKS",
}  # fmt: skip
# The copy design's layout copies (designs/copy_ops.py; SET_ROWS is its other kind).
COPY_OPS = {"DUP", "CPY", "CONT"}
# The row design's ops (designs/_rows.py); SOFT_MAX's forms and the fused RMS_NORM_MUL are
# kernel names the backend's planner makes (src/ops/plan.rs), not ggml op names.
ROW_OPS = {
    "RMS_NORM", "NORM", "ARGMAX", "SOFT_MAX", "SOFT_MAX_MASK", "SOFT_MAX_SINKS",
    "SOFT_MAX_MASK_SINKS", "RMS_NORM_MUL", "RMS_NORM_MUL_ADD",
}  # fmt: skip
PLANNER_NAMES = {
    "SOFT_MAX_MASK", "SOFT_MAX_SINKS", "SOFT_MAX_MASK_SINKS", "RMS_NORM_MUL", "RMS_NORM_MUL_ADD",
    "CPY_ROWS",
    *FLASH_ATTN_OPS,
}  # fmt: skip
CATALOGUE = SRC / "op_catalogue.toml"


def catalogue_kernels(ggml_prefix: str) -> set[str]:
    """Kernel names of the op catalogue whose ggml op starts with `ggml_prefix`: the GLU ops
    and ROPE_FF are sent by their catalogue names (plan.rs), not tensor.rs's."""
    ops = tomllib.loads(CATALOGUE.read_text())["op"]
    return {o["name"] for o in ops if o["ggml"].startswith(ggml_prefix) and o["runs"] == "kernel"}


def f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def backend_op_names() -> dict[str, set[str]]:
    """{"binary": {...}, "unary": {...}, "other": {...}} from src/ops/tensor.rs."""
    text = TENSOR_RS.read_text()
    out = {}
    for kind, enum in (("binary", "BinaryOp"), ("unary", "UnaryOp"), ("other", "Op")):
        out[kind] = set(
            re.findall(rf'\b{enum}::\w+(?:\s*\{{[^}}]*\}})?\s*=>\s*"([A-Z_0-9]+)"', text)
        )
    return out


@unittest.skipUnless(TENSOR_RS.is_file(), "the backend sources are not next to the package")
class OpNamesTest(unittest.TestCase):
    def test_every_declared_op_is_a_name_the_backend_sends(self):
        names = backend_op_names()
        sent = names["binary"] | names["unary"] | names["other"]
        sent |= catalogue_kernels("GLU:") | catalogue_kernels("ROPE")
        # The fused MUL_MAT_<glu> kernels go by their catalogue names (ggml op MUL_MAT).
        sent |= catalogue_kernels("MUL_MAT")
        # And the attention folded into the block after it (FLASH_ATTN_FFN_<glu> and
        # FLASH_ATTN_GLU_<glu>, ggml op FLASH_ATTN_EXT).
        sent |= catalogue_kernels("FLASH_ATTN_EXT")
        for spec in registry.OPS:
            if spec.op in PLANNER_NAMES:
                # Named by the planner (plan.rs) or its rewrites (rewrite/).
                ops_rs = "".join(p.read_text() for p in sorted((SRC / "ops").rglob("*.rs")))
                self.assertIn(f"catalogue::{spec.op}", ops_rs, spec.op)
                continue
            self.assertIn(spec.op, sent, f"{spec.op} is declared but the backend has no such op")

    def test_every_element_wise_op_the_backend_sends_is_declared(self):
        names = backend_op_names()
        self.assertTrue(names["unary"] >= {"ABS", "GELU_ERF"}, names["unary"])
        self.assertEqual(names["binary"], {"ADD", "SUB", "MUL", "DIV"})
        wanted = names["binary"] | names["unary"] | {"MUL_MAT", "SCALE", "CLAMP"}
        declared = {s.op for s in registry.OPS}
        self.assertEqual(wanted - declared, set())
        # Every kernel op the backend sends has a design now: the reductions too.
        self.assertEqual(REDUCE_OPS - declared, set())
        for spec in registry.OPS:
            want_kind = "binary" if spec.op in names["binary"] else None
            if spec.op in names["unary"] or spec.op in ("SCALE", "CLAMP"):
                want_kind = "unary"
            if spec.op == "MUL_MAT":
                want_kind = "mul_mat"
            elif spec.op == "MUL_MAT_ADD":
                want_kind = "mul_mat_add"
            elif spec.op.startswith("RMS_NORM_MUL_MAT") and "_ROPE" in spec.op:
                want_kind = "rms_norm_mul_mat_rope"
            elif spec.op.startswith("RMS_NORM_MUL_MAT"):
                want_kind = "rms_norm_mul_mat"
            elif spec.op.startswith("RMS_NORM_QKV_"):
                want_kind = "rms_norm_qkv_rope"
            elif spec.op.startswith("RMS_NORM_FFN_"):
                want_kind = "rms_norm_ffn"
            elif spec.op.startswith("MUL_MAT_ADD_RMS_NORM_FFN_"):
                want_kind = "mul_mat_add_rms_norm_ffn"
            elif spec.op.startswith("FLASH_ATTN_FFN_"):
                want_kind = "flash_attn_ffn"
            elif spec.op.startswith("FLASH_ATTN_GLU_"):
                want_kind = "flash_attn_glu"
            elif spec.op.startswith("DECODE_LAYER_"):
                want_kind = "decode_layer"
            elif spec.op in catalogue_kernels("MUL_MAT"):
                want_kind = "mul_mat_glu"
            if spec.op in ROW_OPS:
                want_kind = "rows"
            if spec.op in catalogue_kernels("GLU:"):
                want_kind = "glu"
            if spec.op in catalogue_kernels("ROPE"):
                want_kind = "rope"
            if spec.op in COPY_OPS:
                want_kind = "copy"
            if spec.op == "SET_ROWS":
                want_kind = "set_rows"
            if spec.op == "CPY_ROWS":
                want_kind = "copy_rows"
            if spec.op in FLASH_ATTN_OPS:
                want_kind = "flash_attn"
            if spec.op in REDUCE_OPS:
                want_kind = "reduce"
            self.assertEqual(spec.kind, want_kind, spec.op)


class RequestShapesTest(unittest.TestCase):
    """The requests src/ops/plan.rs builds, as the planner's comments and tests describe them."""

    def spec(self, op, inputs, out, params=()):
        return prepare(parse_request(request_json(op, inputs, out, op_params=params)))

    def test_operands_are_inputs_then_output_with_their_byte_sizes(self):
        a, b = tensor("bf16", [64, 8]), tensor("f32", [64])
        cases = [
            ("ADD", [tensor("f32", [4096])] * 2, tensor("f32", [4096])),
            ("MUL", [a, b], a),  # broadcast: input 1 keeps its shape
            ("GELU", [tensor("bf16", [512])], tensor("bf16", [512])),
            ("MUL_MAT", [tensor("bf16", [64, 32]), tensor("f32", [64, 8])], tensor("f32", [32, 8])),
            ("MUL_MAT", [tensor("f32", [64, 32]), tensor("f32", [64, 1])], tensor("f32", [32, 1])),
        ]
        for op, inputs, out in cases:
            with self.subTest(op=op):
                s = self.spec(op, inputs, out)
                seq = s.sequence
                self.assertEqual(len(seq), len(inputs) + 1)
                for (dtype, count), t in zip(seq, list(inputs) + [out]):
                    self.assertEqual(dtype, t.dtype)
                    self.assertEqual(count * t.size, t.nbytes)

    def test_element_counts_off_whole_words_move_the_last_word_whole(self):
        # ggml's test-backend-ops sends 5 x 7 x 11 x 13 = 5005 bf16 elements (flattened).
        x, b = tensor("bf16", [5005]), tensor("bf16", [5, 7])
        a = tensor("bf16", [5, 7, 3])
        for op, inputs, out in (("GELU", [x], x), ("ADD", [x, x], x), ("MUL", [a, b], a)):
            with self.subTest(op=op):
                s = self.spec(op, inputs, out)
                self.assertTrue(s.padded)
                for (_, count), t in zip(s.sequence, list(inputs) + [out]):
                    self.assertEqual(count * t.size, -(-t.nbytes // 4) * 4)

    def test_mul_mat_requests_the_backend_sends_are_planned(self):
        # plan.rs: weights f32, f16, bf16 or block-quantized (rows of whole blocks, ggml's
        # layout); activations f32; output f32. Every declared weight type must plan.
        for w in ("f32", "bf16", "f16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K"):
            for m in (1, 8, 64):
                with self.subTest(w=w, m=m):
                    self.spec(
                        "MUL_MAT",
                        [tensor(w, [256, 64, 2, 1]), tensor("f32", [256, m, 4, 1])],
                        tensor("f32", [64, m, 4, 1]),
                    )
        caps = {s.op: s for s in registry.OPS}["MUL_MAT"]
        self.assertIn("f16", caps.types)
        self.assertIn("q6_K", caps.types)

    def test_scale_and_clamp_compile_their_two_f32_parameters(self):
        # plan.rs: SCALE sends (scale, bias), CLAMP (min, max), as f32 bit patterns; the
        # backend may drop trailing zero words.
        t = tensor("f32", [960])
        d = self.spec("SCALE", [t], t, params=[f32_bits(2.0), 0]).core.defines
        self.assertEqual((d["OP_P0"], d["OP_P1"]), (0x40000000, 0))
        d = self.spec("SCALE", [t], t, params=[f32_bits(2.0)]).core.defines
        self.assertEqual((d["OP_P0"], d["OP_P1"]), (0x40000000, 0))
        d = self.spec("CLAMP", [t], t, params=[f32_bits(-0.5), f32_bits(0.5)]).core.defines
        self.assertEqual((d["OP_P0"], d["OP_P1"]), (f32_bits(-0.5), f32_bits(0.5)))
        self.assertNotIn("OP_P0", self.spec("GELU", [t], t).core.defines)
        with self.assertRaises(UnsupportedError):
            self.spec("CLAMP", [t], t, params=[f32_bits(-0.5), f32_bits(0.5), 7])

    def test_parameterless_ops_refuse_parameters(self):
        t = tensor("f32", [64])
        self.spec("ADD", [t, t], t, params=[0, 0])  # zeros are no parameters
        for op, inputs in (("ADD", [t, t]), ("GELU", [t])):
            with self.subTest(op=op):
                with self.assertRaises(UnsupportedError):
                    self.spec(op, inputs, t, params=[f32_bits(1.0)])


if __name__ == "__main__":
    unittest.main()
