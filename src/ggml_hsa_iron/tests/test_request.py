"""Request parsing (protocol 1) and canonical kernel names."""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dataclasses
import json
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import Tensor, canonical_name, fnv1a64, parse_request

from ggml_hsa_iron.tests.util import request_dict, tensor

PROTOCOL_EXAMPLE = {
    "name": "add-bf16_8x3-f32_8-bf16_8x3",
    "arch": "aie2p",
    "op": "ADD",
    "op_params": [],
    "inputs": [
        {"type": "bf16", "ne": [8, 3, 1, 1], "nb": [2, 16, 48, 48]},
        {"type": "f32", "ne": [8, 1, 1, 1], "nb": [4, 32, 32, 32]},
    ],
    "output": {"type": "bf16", "ne": [8, 3, 1, 1], "nb": [2, 16, 48, 48]},
}


class RequestTest(unittest.TestCase):
    def test_the_protocol_example_parses(self):
        req = parse_request(json.dumps(PROTOCOL_EXAMPLE))
        self.assertEqual(req.op, "ADD")
        self.assertEqual(req.arch, "aie2p")
        self.assertEqual(req.inputs[1], Tensor("f32", (8, 1, 1, 1), (4, 32, 32, 32)))
        self.assertTrue(all(t.is_dense() for t in req.inputs))
        self.assertEqual(req.canonical_name(), PROTOCOL_EXAMPLE["name"])

    def test_unknown_fields_are_kept_not_refused(self):
        req = parse_request(json.dumps(dict(PROTOCOL_EXAMPLE, future=1)))
        self.assertEqual(req.extra, {"future": 1})

    def test_missing_op_params_default_to_none(self):
        obj = dict(PROTOCOL_EXAMPLE)
        del obj["op_params"]
        self.assertEqual(parse_request(json.dumps(obj)).op_params, ())

    def test_malformed_requests_are_refused_with_a_reason(self):
        cases = {
            "not json": "not valid JSON",
            "[]": "JSON object",
            json.dumps({k: v for k, v in PROTOCOL_EXAMPLE.items() if k != "arch"}): "'arch'",
            json.dumps(dict(PROTOCOL_EXAMPLE, name="../evil")): "invalid kernel name",
            json.dumps(dict(PROTOCOL_EXAMPLE, name=".hidden")): "invalid kernel name",
            json.dumps(dict(PROTOCOL_EXAMPLE, op_params=[2**31])): "32-bit",
            json.dumps(dict(PROTOCOL_EXAMPLE, op_params="x")): "op_params",
            json.dumps(dict(PROTOCOL_EXAMPLE, inputs=[])): "non-empty",
        }
        bad_tensor = dict(PROTOCOL_EXAMPLE)
        bad_tensor["output"] = {"type": "q5_1", "ne": [1, 1, 1, 1], "nb": [1, 1, 1, 1]}
        cases[json.dumps(bad_tensor)] = "unknown type"
        bad_ne = dict(PROTOCOL_EXAMPLE)
        bad_ne["output"] = {"type": "f32", "ne": [0, 1, 1, 1], "nb": [4, 4, 4, 4]}
        cases[json.dumps(bad_ne)] = "positive"
        bad_nb = dict(PROTOCOL_EXAMPLE)
        bad_nb["output"] = {"type": "f32", "ne": [3, 2, 1, 1], "nb": [4, 6, 24, 24]}
        cases[json.dumps(bad_nb)] = "element size"
        short = dict(PROTOCOL_EXAMPLE)
        short["output"] = {"type": "f32", "ne": [3, 2, 1], "nb": [4, 12, 24, 24]}
        cases[json.dumps(short)] = "4 integers"
        for text, reason in cases.items():
            with self.subTest(text=text[:60]):
                with self.assertRaises(RequestError) as ctx:
                    parse_request(text)
                self.assertIn(reason, str(ctx.exception))
                self.assertNotIn("\n", str(ctx.exception))


def qkv_dict(kty="f16", vty="f32", ff=False):
    """An RMS_NORM_QKV_ROPE(_FF) request of three outputs: Q f32, then K and V (extra_outputs)."""
    ins = [tensor("q4_0", [256, 64]), tensor("q4_0", [256, 32]), tensor("q4_0", [256, 32])]
    ins += [tensor("f32", [256]), tensor("f32", [256]), tensor("i32", [1])]
    ins += [tensor("f32", [8])] if ff else []
    outs = [tensor("f32", [16, 4]), tensor(kty, [16, 2]), tensor(vty, [32])]
    params = [0, 16, 0, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0, 0x3727C5AC]
    op = "RMS_NORM_QKV_ROPE_FF" if ff else "RMS_NORM_QKV_ROPE"
    return request_dict(op, ins, outs[0], op_params=params, extra_outputs=outs[1:])


class ExtraOutputsTest(unittest.TestCase):
    """The request's extra_outputs: the outputs after `output` of the ops of several (the
    registry's `outputs`), refused for every other op."""

    def test_accepted_for_the_ops_of_three_outputs(self):
        for ff in (False, True):
            d = qkv_dict(ff=ff)
            req = parse_request(json.dumps(d))
            self.assertEqual([t.dtype for t in req.outputs], ["f32", "f16", "f32"])
            self.assertEqual(req.extra_outputs, (tensor("f16", [16, 2]), tensor("f32", [32])))
            self.assertEqual(len(req.operands), 9 + ff)
            self.assertNotIn("extra_outputs", req.extra)
            self.assertEqual(req.canonical_name(), d["name"])

    def test_names_list_the_outputs_in_order(self):
        req = parse_request(json.dumps(qkv_dict(vty="f16")))
        self.assertEqual(
            req.canonical_name(),
            "rms_norm_qkv_rope-q4_0_256x64-q4_0_256x32-q4_0_256x32-f32_256-f32_256-i32_1-"
            "f32_16x4-f16_16x2-f16_32-p0_10_0_0_0_461c4000_3f800000_0_3f800000_0_0_3727c5ac",
        )
        swapped = dataclasses.replace(req, extra_outputs=req.extra_outputs[::-1])
        self.assertNotEqual(swapped.canonical_name(), req.canonical_name())
        # The protocol document's example (f32 weights).
        f32 = [tensor("f32", [64, 64]), tensor("f32", [64, 32]), tensor("f32", [64, 32])]
        f32 += [tensor("f32", [64]), tensor("f32", [64]), tensor("i32", [1])]
        self.assertEqual(
            canonical_name("RMS_NORM_QKV_ROPE", req.op_params, f32, req.output, req.extra_outputs),
            "rms_norm_qkv_rope-f32_64x64-f32_64x32-f32_64x32-f32_64-f32_64-i32_1-f32_16x4-"
            "f16_16x2-f16_32-p0_10_0_0_0_461c4000_3f800000_0_3f800000_0_0_3727c5ac",
        )
        # Without extra outputs a name is what it always was.
        t = tensor("f32", [4096])
        self.assertEqual(canonical_name("ADD", [], [t, t], t, ()), "add-f32_4096-f32_4096-f32_4096")

    def test_refused_for_ops_of_one_output_and_when_malformed(self):
        good = qkv_dict()
        t = {"type": "f32", "ne": [4, 1, 1, 1], "nb": [4, 16, 16, 16]}
        cases = {
            "no 'extra_outputs'": {k: v for k, v in good.items() if k != "extra_outputs"},
            "must hold 2 tensors": dict(good, extra_outputs=good["extra_outputs"][:1]),
            "non-empty list": dict(good, extra_outputs=[]),
            "non-empty list of tensors": dict(good, extra_outputs=t),
            "extra_outputs[1].ne": dict(good, extra_outputs=[t, dict(t, ne=[4, 1])]),
            "extra_outputs[0] has unknown type": dict(good, extra_outputs=[dict(t, type="x")] * 2),
            "extra_outputs[0].nb [4, 6, 24, 24] is not a multiple": dict(
                good, extra_outputs=[dict(t, ne=[4, 2, 1, 1], nb=[4, 6, 24, 24])] * 2
            ),
        }
        add = dict(PROTOCOL_EXAMPLE)
        cases["ADD has one output"] = dict(add, extra_outputs=[t])
        mm = request_dict("MUL_MAT", [tensor("f32", [4, 4])] * 2, tensor("f32", [4, 4]))
        cases["MUL_MAT has one output"] = dict(mm, extra_outputs=[t, t])
        for reason, obj in cases.items():
            with self.subTest(reason=reason):
                with self.assertRaises(RequestError) as ctx:
                    parse_request(json.dumps(obj))
                self.assertIn(reason, str(ctx.exception))
        # An op no design implements is left to the planner: unsupported, whatever its outputs.
        req = parse_request(json.dumps(dict(add, op="NOPE", extra_outputs=[t])))
        with self.assertRaises(UnsupportedError):
            prepare(req)


class CanonicalNameTest(unittest.TestCase):
    """The same vectors as the backend's tests (src/kernels/desc.rs)."""

    def test_readable_names(self):
        t = tensor("f32", [4096])
        self.assertEqual(canonical_name("ADD", [], [t, t], t), "add-f32_4096-f32_4096-f32_4096")
        a = tensor("f32", [8, 3])
        b = tensor("bf16", [8])
        self.assertEqual(
            canonical_name("ADD", [0x3F800000, 0, 0], [a, b], a),
            "add-f32_8x3-bf16_8-f32_8x3-p3f800000",
        )
        strided = Tensor("f32", (8, 3, 1, 1), (12, 4, 96, 96))
        self.assertEqual(
            canonical_name("ADD", [0x3F800000], [strided, b], a),
            "add-f32_8x3_s12x4x96x96-bf16_8-f32_8x3-p3f800000",
        )
        x = tensor("f32", [960])
        self.assertEqual(
            canonical_name("SCALE", [0x40000000, 0], [x], x), "scale-f32_960-f32_960-p40000000"
        )

    def test_protocol_doc_examples(self):
        a = tensor("f32", [16, 10, 4, 3])
        b = tensor("f32", [16, 5, 4, 3])
        self.assertEqual(
            canonical_name("MUL", [], [a, b], a), "mul-f32_16x10x4x3-f32_16x5x4x3-f32_16x10x4x3"
        )
        c = tensor("f32", [16, 5, 4, 3])
        perm = Tensor("f32", (16, 5, 4, 3), (80, 4, 20, 1280))
        self.assertEqual(
            canonical_name("ADD", [], [c, perm], c),
            "add-f32_16x5x4x3-f32_16x5x4x3_s80x4x20x1280-f32_16x5x4x3",
        )

    def test_negative_params_are_32_bit_hex(self):
        x = tensor("f32", [4])
        self.assertEqual(canonical_name("CLAMP", [-1], [x], x), "clamp-f32_4-f32_4-pffffffff")

    def test_long_names_end_in_the_fnv_hash(self):
        t = tensor("f32", [1, 2, 3, 4])
        params = list(range(1, 16))
        name = canonical_name("ADD", params, [t] * 14, t)
        self.assertEqual(len(name), 160)
        self.assertRegex(name, r"-h[0-9a-f]{16}$")
        other = canonical_name("ADD", params[:-1] + [99], [t] * 14, t)
        self.assertNotEqual(name, other)
        self.assertEqual(name[:142], other[:142])

    def test_fnv_vectors(self):
        self.assertEqual(fnv1a64(b""), 0xCBF29CE484222325)
        self.assertEqual(fnv1a64(b"a"), 0xAF63DC4C8601EC8C)

    def test_request_names_round_trip(self):
        t = tensor("bf16", [64, 2])
        d = request_dict("GELU", [t], t)
        self.assertEqual(parse_request(json.dumps(d)).canonical_name(), d["name"])


class ReadmeRequestsTest(unittest.TestCase):
    def test_the_bring_up_requests_are_canonical_and_planned(self):
        import re

        from ggml_hsa_iron.plans import prepare

        # The bring-up steps of docs/real-hardware.md, in the repository's docs.
        readme = (Path(__file__).resolve().parents[3] / "docs" / "real-hardware.md").read_text()
        found = re.findall(r"cat > /tmp/(\w+)\.json <<'J'\n(.*?)\nJ\n", readme, re.S)
        self.assertEqual([name for name, _ in found], ["add", "mm", "mv", "gelu"])
        for name, text in found:
            with self.subTest(request=name):
                req = parse_request(text)
                self.assertEqual(req.name, req.canonical_name())
                prepare(req)


if __name__ == "__main__":
    unittest.main()
