"""MUL_MAT_ADD_RMS_NORM_FFN_<glu>: llama's attention output projection and residual ADD
(MUL_MAT_ADD) ahead of the feed-forward block reading its result (RMS_NORM_FFN_<glu>), one
program of three phases (designs/ffn.py, plans_ffn.py).

* the request: r1 and h required in extra_outputs, in the canonical name; the operands;
* the plan: every phase on one shape (columns, rows, nr, kc: kc dividing Ka, K and F, whole
  rounds of both MUL_MAT_ADD phases, R*nr <= kc), each phase's plan otherwise its op's;
  Llama-3.2-1B's shape (Ka = K = 2048, F = 8192, one token) on aie2p and aie2 for f32, q4_0,
  q8_0, f16 and q4_K weights, on the shape RMS_NORM_FFN_<glu> takes alone; the core memory, the
  memory tile's rings, the DMA tasks of each shim channel over the whole program and the
  descriptors per task group; one core source; the sequence's arguments; the refusals (the
  weights not of one type, non-f32 activations or outputs, dense N that MUL_MAT's GEMM takes, a
  and W_o of different Ka, a Ka whose K chunks share no whole-word chunk with K and F);
* the recorded program (the emulation's stand-in checks every DMA, descriptor and the core
  memory) and its synchronisation: every drain of r1 awaited before the first task reading r1,
  every drain of h before the first reading h; the in-order executor (util_emu_seq.py) refusing
  the program with the awaits ahead of r1's first read removed;
* end to end through the emulation, the runtime sequence run in order: Llama-3.2-1B's shape
  (q4_0, q8_0, f32) and small shapes on aie2p
  and aie2, f32, q4_0 and q8_0 weights, several GLUs, r0, r1 and out apart, in one memory
  (llama's residual ADDs in place) and r0 one bias row, against numpy, and r1, h and out bit for
  bit against MUL_MAT_ADD's, then RMS_NORM_MUL_MAT_<glu>'s and MUL_MAT_ADD's designs run in
  sequence on the same K chunking (on the program's shape, and on their own).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dataclasses
import json
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.plans_ffn import ffn_core_bytes, memtile_bytes, program_tasks
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tiling import MAX_TASKS_PER_CHANNEL, SHIM_GROUP_TASKS

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_dict, tensor
from ggml_hsa_iron.tests import sample
from ggml_hsa_iron.tests.util_ffn import (
    EPS_BITS,
    GLU_OPS,
    attn_ffn_request,
    attn_ffn_spec,
    ffn_spec,
)

try:
    # The emulation tests' operands and references (util_ffn's past the requests) need it.
    import numpy  # noqa: F401

    from ggml_hsa_iron.tests.util_ffn import AttnFfnCase, assert_same_bits

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

LLAMA = (2048, 2048, 8192)  # Llama-3.2-1B: Ka (n_head * head_dim), K (n_embd), F (n_ff)
LLAMA_TYPES = ("f32", "q4_0", "q8_0", "f16", "q4_K")
# (weights, N, Ka, K, F, arch): Llama-3.2-1B's on both archs, then small shapes.
SHAPES = [(ty, 1, *LLAMA, arch) for arch in ("aie2p", "aie2") for ty in LLAMA_TYPES] + [
    ("q8_0", 2, *LLAMA, "aie2p"),
    ("f32", 1, 64, 80, 60, "aie2p"),  # kc = 4, the only common divisor of whole words
    ("f32", 3, 96, 48, 37, "aie2"),  # F prime: kc = 1
    ("q4_0", 2, 512, 256, 192, "aie2"),
]
# Operand indices of the runtime sequence: W_o, a, r0, W_g, W_u, W_d, n, out, r1, h.
WO, A, R0, WG, WU, WD, NORM, OUT, R1, H = range(10)


def phase_request(spec, i):
    """The request of the program's phase i as its own op's request (the backend's three
    kernels): MUL_MAT_ADD (W_o, a, r0) -> r1, RMS_NORM_MUL_MAT_<glu> (W_g, W_u, r1, n) -> h,
    MUL_MAT_ADD (W_d, h, r1) -> out."""
    req = spec.request
    wo, a, r0, wg, wu, wd, n = req.inputs
    r1, h = req.extra_outputs
    if i == 0:
        return request_dict("MUL_MAT_ADD", [wo, a, r0], r1, req.arch)
    if i == 1:
        op = "RMS_NORM_MUL_MAT_" + req.op[len("MUL_MAT_ADD_RMS_NORM_FFN_") :]
        return request_dict(op, [wg, wu, r1, n], h, req.arch, op_params=req.op_params)
    return request_dict("MUL_MAT_ADD", [wd, h, r1], req.output, req.arch)


def shape(p):
    return (p.columns, p.rows, p.rows_per_tile, p.k_chunk)


class AttnFfnRequestTest(unittest.TestCase):
    def test_r1_and_h_are_extra_outputs_in_the_name(self):
        d = json.loads(attn_ffn_request("SWIGLU", "f32", 1, 32, 64, 96))
        req = parse_request(json.dumps(d))
        self.assertEqual([t.ne for t in req.extra_outputs], [(64, 1, 1, 1), (96, 1, 1, 1)])
        self.assertEqual(len(req.operands), 10)  # 7 inputs, out, r1, h: the kernel's operands
        self.assertTrue(req.name.endswith("-f32_64-f32_96-p3727c5ac"), req.name)
        self.assertEqual(req.name, req.canonical_name())
        for extra in ([], [tensor("f32", [64])]):
            d["extra_outputs"] = [request_dict("ADD", [], t)["output"] for t in extra]
            if not extra:
                del d["extra_outputs"]
            with self.assertRaisesRegex(RequestError, "extra_outputs"):
                parse_request(json.dumps(d))


class AttnFfnPlanTest(unittest.TestCase):
    def test_every_phase_on_one_shape(self):
        for ty, N, Ka, K, F, arch in SHAPES:
            with self.subTest(ty=ty, N=N, Ka=Ka, K=K, F=F, arch=arch):
                spec = attn_ffn_spec("SWIGLU", ty, N, Ka, K, F, arch)
                p0, p1, p2 = (s.plan for s in spec.phases)
                self.assertEqual(shape(p0), shape(p1))
                self.assertEqual(shape(p1), shape(p2))
                C, R, nr, kc = shape(p0)
                self.assertTrue(p0.add and not p0.glu and not p0.norm)
                self.assertTrue(p1.glu and p1.norm and not p1.add)
                self.assertTrue(p2.add and not p2.glu and not p2.norm)
                self.assertEqual((p0.N, p0.K, p1.N, p1.K, p2.N, p2.K), (K, Ka, F, K, K, F))
                self.assertEqual((Ka % kc, K % kc, F % kc), (0, 0, 0))
                self.assertEqual(K % p0.block, 0)  # whole rounds: ADDs in place stay right
                self.assertLessEqual(R * nr, kc)  # a column's r values in one x object
                self.assertLessEqual(C, spec.arch.columns)
                # Each phase is its op's plan but for the shape.
                keep = dict(columns=C, rows=R, rows_per_tile=nr, k_chunk=kc)
                for i, p in enumerate((p0, p1, p2)):
                    alone = prepare(parse_request(json.dumps(phase_request(spec, i))))
                    self.assertEqual(p, dataclasses.replace(alone.plan, **keep), i)

    def test_llama_3_2_1b_plans_on_the_feed_forward_blocks_shape(self):
        # The attention's phase costs Llama-3.2-1B no shape: RMS_NORM_FFN_<glu> alone plans the
        # same columns, rows, nr and kc (aie2p: 8 x 4 cores; aie2: 4 x 4).
        want = {
            ("aie2p", "f32"): (8, 4, 32, 128),
            ("aie2p", "f16"): (8, 4, 32, 256),
            ("aie2", "f32"): (4, 4, 32, 128),
            ("aie2", "f16"): (4, 4, 32, 256),
        }
        for arch in ("aie2p", "aie2"):
            for ty in LLAMA_TYPES:
                with self.subTest(arch=arch, ty=ty):
                    spec = attn_ffn_spec("SWIGLU", ty, 1, *LLAMA, arch)
                    ffn = ffn_spec("SWIGLU", ty, 1, *LLAMA[1:], arch)
                    got = shape(spec.attn.plan)
                    self.assertEqual(got, shape(ffn.up.plan))
                    C = 8 if arch == "aie2p" else 4
                    self.assertEqual(got, want.get((arch, ty), (C, 4, 64, 256)))

    def test_the_limits_count_every_phase(self):
        for ty, N, Ka, K, F, arch in SHAPES:
            with self.subTest(ty=ty, N=N, Ka=Ka, K=K, F=F, arch=arch):
                spec = attn_ffn_spec("GEGLU", ty, N, Ka, K, F, arch)
                p0, p1, p2 = (s.plan for s in spec.phases)
                a = spec.arch
                self.assertLessEqual(ffn_core_bytes(p1), a.l1_budget)
                self.assertLessEqual(memtile_bytes(p0), a.memtile_bytes)
                attn, up, down = spec.tasks()
                C = p0.columns
                count = {"W": [0] * C, "x": [0] * C, "y": [0] * C}

                def add_groups(groups, C=C, count=count):
                    for group in groups:
                        self.assertEqual(len(group), C)
                        for col, (_w, _x, _y, rs, pad) in enumerate(group):
                            # W's run of rounds; per round x's chunks, r and the padding.
                            tasks = {"W": 1, "x": len(rs) * (2 + (pad is not None)), "y": 1}
                            self.assertLessEqual(sum(tasks.values()), SHIM_GROUP_TASKS)
                            for k, v in tasks.items():
                                count[k][col] += v

                add_groups(attn)
                for g, group in enumerate(up):
                    self.assertEqual(len(group), C)
                    for col, (ws, _x, _y) in enumerate(group):
                        # Per round W_g's and W_u's tap; n's ahead of the first x row.
                        tasks = {"W": 2 * len(ws), "x": 1 + (g == 0), "y": 1}
                        self.assertLessEqual(sum(tasks.values()), SHIM_GROUP_TASKS)
                        for k, v in tasks.items():
                            count[k][col] += v
                add_groups(down)
                want = program_tasks((p0, p1, p2), N)
                for k, v in count.items():
                    self.assertEqual(set(v), {want[k]}, k)
                    self.assertLessEqual(want[k], MAX_TASKS_PER_CHANNEL, k)

    def test_one_core_source_and_the_sequence(self):
        spec = attn_ffn_spec("GEGLU_QUICK", "q4_0", 1, *LLAMA, "aie2")
        core = spec.core
        self.assertEqual((core.source, core.object_name), ("mvq.cc", "mvq.o"))
        d = core.defines
        p = spec.up.plan
        self.assertEqual((d["MV_ROWS"], d["MV_KC"]), (p.rows_per_tile, p.k_chunk))
        self.assertEqual((d["MV_GLU"], d["GGML_OP_GEGLU_QUICK"], d["MV_ADD"]), (1, 1, 1))
        self.assertEqual((d["MV_NORM"], d["MV_NORM_K"], d["OP_P0"]), (1, 2048, EPS_BITS))
        # The request's operands in dispatch order: W_o, a, r0, W_g, W_u, W_d, n, out, r1, h.
        spec = attn_ffn_spec("SWIGLU", "f32", 2, 32, 64, 96)
        w = [("f32", 32 * 64)] + [("f32", 64 * 96)] * 3
        acts = [("f32", 64), ("f32", 128)]  # a [32, 2], r0 [64, 2]
        outs = [("f32", 128), ("f32", 128), ("f32", 192)]
        self.assertEqual(spec.sequence, w[:1] + acts + w[1:] + [("f32", 64)] + outs)

    def test_refusals(self):
        refused = [
            # W_o or W_d of another type than W_g and W_u: every phase's tiles go through one
            # W fifo of one object size, decoded by one GEMV core object.
            ("SWIGLU", "q4_K", 1, *LLAMA, {"wo_type": "q6_K"}, "output projection weights"),
            ("SWIGLU", "q4_0", 1, *LLAMA, {"wd_type": "q8_0", "arch": "aie2"}, "down weights"),
            ("SWIGLU", "f32", 1, 32, 64, 96, {"wo_type": "bf16"}, "output projection weights"),
            # Dense N that MUL_MAT's GEMM takes: no norm prologue, no r epilogue there.
            ("SWIGLU", "f32", 8, 32, 64, 96, {}, "attention output phase"),
            ("GEGLU", "q4_0", 16, 256, 256, 512, {}, "attention output phase"),
            # Activations, n and outputs are f32.
            ("SWIGLU", "f32", 1, 32, 64, 96, {"a": tensor("bf16", [32, 1])}, "a is bf16"),
            ("SWIGLU", "f32", 1, 32, 64, 96, {"r1": tensor("f16", [64, 1])}, "r1 is f16"),
            ("SWIGLU", "f32", 1, 32, 64, 96, {"h": tensor("f16", [96, 1])}, "h is f16"),
            ("SWIGLU", "f32", 1, 32, 64, 96, {"r0": tensor("bf16", [64, 1])}, "r0 is bf16"),
            # Each op alone plans its phase (MUL_MAT_ADD with whole rows of Ka = 96), but the
            # phases share no K chunk of whole words: 32-value q4_0 chunks are 18 bytes.
            ("SWIGLU", "q4_0", 1, 96, 256, 192, {}, "no shape of the array fits every phase"),
        ]
        for glu, ty, N, Ka, K, F, kw, why in refused:
            with self.subTest(glu=glu, ty=ty, N=N, Ka=Ka, K=K, F=F, kw=list(kw)):
                with self.assertRaises(UnsupportedError) as e:
                    attn_ffn_spec(glu, ty, N, Ka, K, F, r0=kw.pop("r0", None), **kw)
                self.assertIn(f"MUL_MAT_ADD_RMS_NORM_FFN_{glu}", str(e.exception))
                self.assertIn(why, str(e.exception))
        # The last one's phases plan alone.
        spec_q = json.loads(attn_ffn_request("SWIGLU", "q4_0", 1, 96, 256, 192))
        phase0 = request_dict(
            "MUL_MAT_ADD",
            [tensor("q4_0", [96, 256]), tensor("f32", [96, 1]), tensor("f32", [256, 1])],
            tensor("f32", [256, 1]),
        )
        self.assertIsNotNone(prepare(parse_request(json.dumps(phase0))))
        self.assertEqual(spec_q["op"], "MUL_MAT_ADD_RMS_NORM_FFN_SWIGLU")
        self.assertIsNotNone(ffn_spec("SWIGLU", "q4_0", 1, 256, 192))
        # Malformed: a's Ka not W_o's; r1 or h of the wrong shape.
        with self.assertRaisesRegex(RequestError, "src1 has 48 columns, src0 32"):
            attn_ffn_spec("SWIGLU", "f32", 1, 32, 64, 96, a=tensor("f32", [48, 1]))
        with self.assertRaises(RequestError):
            attn_ffn_spec("SWIGLU", "f32", 1, 32, 64, 96, r1=tensor("f32", [63, 1]))
        with self.assertRaises(RequestError):
            attn_ffn_spec("SWIGLU", "f32", 1, 32, 64, 96, h=tensor("f32", [95, 1]))
        # op_params: eps only.
        with self.assertRaises(UnsupportedError):
            attn_ffn_spec("SWIGLU", "f32", 1, 32, 64, 96, op_params=[EPS_BITS, 1])
        # What is declared plans: every GLU, every weight type of the combos, r0 one row.
        for glu in GLU_OPS:
            self.assertIsNotNone(attn_ffn_spec(glu, "f32", 1, 32, 64, 96))
        for ty in ("bf16", "f16", "q4_1", "q5_0", "q5_K", "q6_K"):
            with self.subTest(ty=ty):
                self.assertIsNotNone(attn_ffn_spec("SWIGLU", ty, 1, 512, 512, 1024))
        r0 = tensor("f32", [64])
        self.assertIsNotNone(attn_ffn_spec("SWIGLU", "f32", 2, 32, 64, 96, r0=r0))


def first_fill(seq, arg):
    return next(i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == arg)


class AttnFfnRecordTest(unittest.TestCase):
    """Recorded against the emulation's stand-in: every shim DMA, the descriptors in flight per
    task group, the channels and the core and memory tile memory are checked (no g++ build)."""

    def test_shapes_record_and_r1_and_h_are_complete_before_they_are_read(self):
        from ggml_hsa_iron.emu.compile import record

        for ty, N, Ka, K, F, arch in SHAPES:
            with self.subTest(ty=ty, N=N, Ka=Ka, K=K, F=F, arch=arch):
                spec = attn_ffn_spec("SWIGLU", ty, N, Ka, K, F, arch)
                prog = record(spec).to_json("attn_ffn", arch)
                seq = prog["sequence"]
                self.assertEqual(len(prog["args"]), 10)
                for arg in (R1, H):
                    drains = {op["task"] for op in seq if op["op"] == "drain" and op["arg"] == arg}
                    first = first_fill(seq, arg)
                    awaited = {t for op in seq[:first] if op["op"] == "await" for t in op["tasks"]}
                    self.assertTrue(drains)
                    self.assertLessEqual(drains, awaited, arg)
                    last = max(i for i, op in enumerate(seq) if op.get("task") in drains)
                    self.assertLess(last, first, arg)
                # Phase 0 reads W_o, a and r0 and writes r1 only, every drain awaited before
                # phase 1 reads r1 (n ahead of it); W_g's and W_u's first tiles go out while
                # phase 0 runs (designs/ffn.py's _ahead); the later phases never touch W_o, a,
                # r0.
                first = first_fill(seq, R1)
                before = {op["arg"] for op in seq[:first] if "arg" in op}
                self.assertEqual(before, {WO, A, R0, R1, WG, WU, NORM})
                self.assertLess(first_fill(seq, WG), first)
                r1 = {op["task"] for op in seq if op["op"] == "drain" and op["arg"] == R1}
                awaited = {t for op in seq[:first] if op["op"] == "await" for t in op["tasks"]}
                self.assertLessEqual(r1, awaited)
                later = {op["arg"] for op in seq[first:] if "arg" in op}
                self.assertLessEqual({WD, OUT, R1, H}, later)
                self.assertLessEqual(later, {WG, WU, WD, NORM, OUT, R1, H})


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class AttnFfnEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu`, its program run in order on real data."""

    def check(self, glu, ty, N, Ka, K, F, arch, layout, seed, kernels="program"):
        """The program against numpy, and bit for bit against the three kernels it replaces run
        in sequence: on the program's shape (`kernels` "program"), or as their ops plan them
        alone with the program's K chunk ("own"), or not (None)."""
        case = AttnFfnCase(glu, ty, N, Ka, K, F, arch, layout, seed)
        r1, h, out = case.run()
        case.check(self, r1, h, out)
        if kernels is None:
            return
        phases = []
        if kernels == "own":
            kc = case.spec.up.plan.k_chunk
            for i in range(3):
                own = prepare(parse_request(json.dumps(phase_request(case.spec, i))))
                own_kc = dataclasses.replace(own.plan, k_chunk=kc)
                phases.append(dataclasses.replace(own, plan=own_kc))
            mine = [shape(s.plan)[:3] for s in case.spec.phases]
            self.assertNotEqual([shape(s.plan)[:3] for s in phases], mine)
        r1b, h2, out2 = case.run_three_kernels(*phases)
        what = f"{glu} {ty} N={N} Ka={Ka} K={K} F={F} {arch} {layout}"
        assert_same_bits(self, r1, r1b, f"r1 of {what}")
        assert_same_bits(self, h, h2, f"h of {what}")
        assert_same_bits(self, out, out2, f"out of {what}")

    def test_small_shapes(self):
        cases = [
            ("SWIGLU", "f32", 1, 64, 80, 60, "aie2p", "apart"),
            ("REGLU", "f32", 3, 96, 48, 37, "aie2", "in_place"),
            ("GEGLU_QUICK", "q4_0", 1, 512, 256, 192, "aie2p", "bias"),
            ("GEGLU", "q8_0", 1, 256, 256, 192, "aie2", "in_place"),
            ("SWIGLU", "q4_0", 1, 256, 256, 192, "aie2", "apart"),
            # A few tokens: every phase's GEMV takes them at once (GemvPlan.nx).
            ("SWIGLU", "q4_0", 4, 512, 256, 192, "aie2p", "in_place"),
            ("GEGLU", "q8_0", 3, 256, 256, 192, "aie2", "apart"),
        ]
        for i, (glu, ty, N, Ka, K, F, arch, layout) in enumerate(cases):
            with self.subTest(glu=glu, ty=ty, N=N, Ka=Ka, K=K, F=F, arch=arch, layout=layout):
                self.check(glu, ty, N, Ka, K, F, arch, layout, seed=i)

    def test_llama_3_2_1b(self):
        # Ka = K = 2048, F = 8192, one token; r0, r1 and out in one memory as llama runs its
        # residual ADDs, or apart.
        cases = [
            ("SWIGLU", "q4_0", "aie2p", "in_place", "program"),
            ("SWIGLU", "q8_0", "aie2", "apart", "program"),
            ("GEGLU", "f32", "aie2p", "apart", None),
        ]
        for i, (glu, ty, arch, layout, kernels) in sample.pick(enumerate(cases)):
            with self.subTest(glu=glu, ty=ty, arch=arch, layout=layout):
                self.check(glu, ty, 1, *LLAMA, arch, layout, seed=20 + i, kernels=kernels)

    def test_bit_for_bit_with_the_three_kernels_as_they_plan(self):
        # MUL_MAT_ADD's and RMS_NORM_MUL_MAT_<glu>'s own plans (their columns, rows and rows per
        # core) with the program's K chunk give its results bit for bit: only the K chunking
        # orders the sums.
        self.check("SWIGLU", "q4_0", 1, 256, 256, 192, "aie2p", "apart", seed=30, kernels="own")
        self.check("GEGLU_ERF", "f32", 2, 64, 80, 60, "aie2", "apart", seed=31, kernels="own")

    def test_the_awaits_of_r1_are_needed(self):
        # The recorded program run in order without the awaits ahead of phase 1's first read of
        # r1: that read races phase 0's writes, which the in-order executor refuses.
        from ggml_hsa_iron.tests.util_emu import build_spec
        from ggml_hsa_iron.tests.util_emu_seq import run_program_in_order

        case = AttnFfnCase("SWIGLU", "f32", 1, 64, 80, 60, "aie2p", "apart", seed=40)
        prog, lib = build_spec(case.spec)
        run_program_in_order(prog, lib, case.args())  # as designed: fine
        seq = prog["sequence"]
        first = first_fill(seq, R1)
        broken = dict(prog, sequence=[op for op in seq[:first] if op["op"] != "await"])
        broken["sequence"] += seq[first:]
        with self.assertRaisesRegex(RuntimeError, "not awaited yet"):
            run_program_in_order(broken, lib, case.args())


if __name__ == "__main__":
    unittest.main()
