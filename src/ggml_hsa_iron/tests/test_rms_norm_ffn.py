"""RMS_NORM_FFN_<glu>: a feed-forward block (RMS_NORM_MUL_MAT_<glu>, then MUL_MAT_ADD of its
result) as one program of two phases (designs/ffn.py, plans_ffn.py).

* the request: extra_outputs (h) required, in the canonical name; the hsaco's operands;
* the plan: both phases on one shape (columns, rows, nr, kc: kc dividing K and F, whole rounds
  of the down projection, R*nr <= kc), each phase's plan otherwise its op's; the core memory of
  both phases (n and the stash included); the DMA tasks of each shim channel over the whole
  program and the descriptors per task group; one core source with both phases' defines; the
  refusals (the weights not of one type, non-f32 activations or outputs, dense N that MUL_MAT's
  GEMM takes, n too large for a core, no common shape);
* the recorded program (the emulation's stand-in checks every DMA, descriptor and the core
  memory) of Llama-sized shapes, and its synchronisation: every drain of h awaited before the
  first task reading h; the in-order executor (util_emu_seq.py) refusing the program with those
  awaits removed;
* end to end through the emulation, the runtime sequence run in order: Llama-3.2-1B's FFN
  (K = 2048, F = 8192, N = 1) on aie2p and aie2, f32, q4_0 and q8_0 weights, SWIGLU and GEGLU,
  r and out in x's memory (llama's residual ADD in place) and r apart, small odd shapes with
  every GLU, against numpy, and bit for bit against RMS_NORM_MUL_MAT_<glu>'s and then
  MUL_MAT_ADD's designs run in sequence on the same K chunking.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dataclasses
import json
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.plans_ffn import ffn_core_bytes, program_tasks
from ggml_hsa_iron.request import Tensor, parse_request
from ggml_hsa_iron.tiling import (
    MAX_TASKS_PER_CHANNEL,
    SHIM_GROUP_TASKS,
    mv_norm_bytes,
    mvq_x_bytes,
    stash_bytes,
)

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import request_dict, tensor
from ggml_hsa_iron.tests.util_ffn import EPS_BITS, GLU_OPS, ffn_request, ffn_spec
from ggml_hsa_iron.tests import sample

try:
    import numpy as np

    from ggml_hsa_iron.tests.util_ffn import FfnCase, assert_same_bits, fast_weights

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

LLAMA = (2048, 8192)  # Llama-3.2-1B: K (n_embd), F (n_ff)
SHAPES = [
    # (weights, N, K, F, arch)
    ("f32", 1, *LLAMA, "aie2p"),
    ("f32", 1, *LLAMA, "aie2"),
    ("q4_0", 1, *LLAMA, "aie2p"),
    ("q4_0", 1, *LLAMA, "aie2"),
    ("q8_0", 2, *LLAMA, "aie2p"),
    ("q4_K", 1, *LLAMA, "aie2"),
    ("bf16", 1, 1024, 2816, "aie2p"),
    ("f32", 1, 80, 60, "aie2p"),  # K, F off the vector lanes: kc = 20
    ("f32", 3, 48, 37, "aie2"),  # F prime: kc = 1, the last round of h shifted
    ("q4_0", 2, 256, 192, "aie2"),
]


class FfnRequestTest(unittest.TestCase):
    def test_h_is_an_extra_output_in_the_name(self):
        d = json.loads(ffn_request("SWIGLU", "f32", 1, 64, 96))
        req = parse_request(json.dumps(d))
        self.assertEqual([t.ne for t in req.extra_outputs], [(96, 1, 1, 1)])
        self.assertEqual(len(req.operands), 8)  # 6 inputs, out, h: the kernel's operands
        self.assertTrue(req.name.endswith("-f32_64-f32_96-p3727c5ac"), req.name)
        self.assertEqual(req.name, req.canonical_name())
        # Without h, or with h on an op of one output: malformed.
        del d["extra_outputs"]
        with self.assertRaisesRegex(RequestError, "extra_outputs"):
            parse_request(json.dumps(d))
        t = tensor("f32", [64])
        add = request_dict("ADD", [t, t], t, extra_outputs=[t])
        with self.assertRaisesRegex(RequestError, "one output"):
            parse_request(json.dumps(add))
        two = json.loads(ffn_request("SWIGLU", "f32", 1, 64, 96, extra_outputs=[t, t]))
        with self.assertRaisesRegex(RequestError, "extra_outputs must hold 1"):
            parse_request(json.dumps(two))

    def test_long_names_are_hashed_with_h_in_them(self):
        # Batched activations (4-D x, r, out and h): past 160 characters, hashed; another h
        # is another kernel.
        def name(h_ne):
            kw = {k: tensor("f32", [2048, 16, 13, 111]) for k in ("x", "r", "out")}
            h = tensor("f32", h_ne)
            return parse_request(ffn_request("GEGLU_QUICK", "q4_K", 1, *LLAMA, h=h, **kw)).name

        a, b = name([8192, 16, 13, 111]), name([8192, 16, 111, 13])
        self.assertEqual((len(a), len(b)), (160, 160))
        self.assertRegex(a, r"-h[0-9a-f]{16}$")
        self.assertNotEqual(a, b)
        self.assertEqual(a[:142], b[:142])


class FfnPlanTest(unittest.TestCase):
    def test_both_phases_on_one_shape(self):
        for ty, N, K, F, arch in SHAPES:
            with self.subTest(ty=ty, N=N, K=K, F=F, arch=arch):
                spec = ffn_spec("SWIGLU", ty, N, K, F, arch)
                a, b = spec.up.plan, spec.down.plan
                shape = lambda p: (p.columns, p.rows, p.rows_per_tile, p.k_chunk)  # noqa: E731
                self.assertEqual(shape(a), shape(b))
                C, R, nr, kc = shape(a)
                self.assertTrue(a.glu and a.norm and not a.add)
                self.assertTrue(b.add and not b.glu and not b.norm)
                self.assertEqual((a.N, a.K, b.N, b.K), (F, K, K, F))
                self.assertEqual((K % kc, F % kc), (0, 0))
                self.assertEqual(K % b.block, 0)  # whole rounds: an ADD in place stays right
                self.assertLessEqual(R * nr, kc)  # a column's r values in one x object
                self.assertLessEqual(C, spec.arch.columns)
                # Each phase is its op's plan but for the shape.
                alone_up = prepare(parse_request(json.dumps(self.phase(spec, 0))))
                alone_down = prepare(parse_request(json.dumps(self.phase(spec, 1))))
                keep = dict(columns=C, rows=R, rows_per_tile=nr, k_chunk=kc)
                self.assertEqual(a, dataclasses.replace(alone_up.plan, **keep))
                self.assertEqual(b, dataclasses.replace(alone_down.plan, **keep))

    @staticmethod
    def phase(spec, i):
        """The request of the FFN's phase i as its own op's request (the backend's two
        kernels)."""
        req = spec.request
        wg, wu, wd, x, n, r = req.inputs
        (h,) = req.extra_outputs
        if i == 0:
            op = "RMS_NORM_MUL_MAT_" + req.op[len("RMS_NORM_FFN_") :]
            return request_dict(op, [wg, wu, x, n], h, req.arch, op_params=req.op_params)
        return request_dict("MUL_MAT_ADD", [wd, h, r], req.output, req.arch)

    def test_the_core_memory_counts_both_phases(self):
        for ty, N, K, F, arch in SHAPES:
            with self.subTest(ty=ty, K=K, F=F, arch=arch):
                spec = ffn_spec("GEGLU", ty, N, K, F, arch)
                p = spec.up.plan
                nr, kc, nx = p.rows_per_tile, p.k_chunk, p.nx
                w = p.w_units(kc) * max(p.w_size, 1)
                # x, y, the stash and x in bf16 of each of nx rows (GemvPlan.nx) for the
                # decoding GEMV, one chunk of x in bf16 for bf16 weights (rounded as ggml's CPU
                # backend rounds x for them); f32 weights keep no copy.
                want = 2 * nr * w + nx * (2 * kc * 4 + 2 * nr * 4)
                want += stash_bytes(nx * nr) + mv_norm_bytes(K, kc, nx)
                copy = -(-2 * kc // 64) * 64
                want += nx * copy if p.w_block > 1 else copy if ty == "bf16" else 0
                self.assertEqual(ffn_core_bytes(p), want)
                self.assertEqual(mvq_x_bytes(p.w_block, kc) >= 2 * kc, ty not in ("f32", "bf16"))
                self.assertEqual(p.x_bf16, ty == "bf16")
                self.assertLessEqual(want, spec.arch.l1_budget)
                self.assertGreaterEqual(mv_norm_bytes(K, kc), K * 4)  # n kept whole

    def test_tasks_per_channel_and_per_group(self):
        for ty, N, K, F, arch in SHAPES:
            with self.subTest(ty=ty, N=N, K=K, F=F, arch=arch):
                spec = ffn_spec("SWIGLU", ty, N, K, F, arch)
                up, down = spec.tasks()
                C = spec.up.plan.columns
                count = {"W": [0] * C, "x": [0] * C, "y": [0] * C}
                for g, group in enumerate(up):
                    self.assertEqual(len(group), C)
                    for col, (ws, _x, _y) in enumerate(group):
                        # Per round W_g's and W_u's tap; n's ahead of the first x row.
                        tasks = {"W": 2 * len(ws), "x": 1 + (g == 0), "y": 1}
                        self.assertLessEqual(sum(tasks.values()), SHIM_GROUP_TASKS)
                        for k, v in tasks.items():
                            count[k][col] += v
                for group in down:
                    self.assertEqual(len(group), C)
                    for col, (_w, _x, _y, rs, pad) in enumerate(group):
                        # W_d's run of rounds; per round h's chunks, r and the padding.
                        tasks = {"W": 1, "x": len(rs) * (2 + (pad is not None)), "y": 1}
                        self.assertLessEqual(sum(tasks.values()), SHIM_GROUP_TASKS)
                        for k, v in tasks.items():
                            count[k][col] += v
                want = program_tasks((spec.up.plan, spec.down.plan), N)
                for k, v in count.items():
                    self.assertEqual(set(v), {want[k]}, k)
                    self.assertLessEqual(want[k], MAX_TASKS_PER_CHANNEL, k)

    def test_one_core_source_with_both_phases(self):
        spec = ffn_spec("GEGLU_QUICK", "q4_0", 1, *LLAMA, "aie2")
        core = spec.core
        self.assertEqual((core.source, core.object_name), ("mvq.cc", "mvq.o"))
        d = core.defines
        p = spec.up.plan
        self.assertEqual((d["MV_ROWS"], d["MV_KC"]), (p.rows_per_tile, p.k_chunk))
        self.assertEqual((d["MV_GLU"], d["GGML_OP_GEGLU_QUICK"], d["MV_ADD"]), (1, 1, 1))
        self.assertEqual((d["MV_NORM"], d["MV_NORM_K"], d["OP_P0"]), (1, 2048, EPS_BITS))
        self.assertEqual(d["MVQ_Q4_0"], 1)
        f = ffn_spec("SWIGLU", "bf16", 1, 64, 96).core
        self.assertEqual(
            (f.source, f.defines["W_T"], f.defines["X_T"]), ("mv.cc", "bfloat16", "float")
        )
        # The runtime sequence's arguments: the request's operands in dispatch order.
        spec = ffn_spec("SWIGLU", "f32", 2, 64, 96)
        got = spec.sequence
        want = [("f32", 64 * 96)] * 3 + [("f32", 128), ("f32", 64), ("f32", 128)]
        self.assertEqual(got, want + [("f32", 128), ("f32", 192)])
        q = ffn_spec("SWIGLU", "q4_0", 1, 256, 192).sequence
        self.assertEqual(q[:3], [("i8", 256 * 192 // 32 * 18)] * 3)

    def test_refusals(self):
        refused = [
            # The down weights of another type (llama.cpp's Q4_K_M mixes q4_K and q6_K; q4_0
            # with q8_0): both phases' tiles go through one W fifo of one object size, decoded
            # by one GEMV core object.
            ("SWIGLU", "q4_K", 1, 2048, 8192, {"wd_type": "q6_K"}),
            ("SWIGLU", "q4_K", 1, 2048, 8192, {"wd_type": "q6_K", "arch": "aie2"}),
            ("GEGLU", "q4_0", 1, 2048, 8192, {"wd_type": "q8_0", "arch": "aie2"}),
            ("SWIGLU", "f32", 1, 64, 96, {"wd_type": "bf16"}),
            # Dense N that MUL_MAT's GEMM takes: no norm prologue, no r epilogue there.
            ("SWIGLU", "f32", 8, 64, 96, {}),
            ("GEGLU", "q4_0", 16, 256, 512, {}),
            # Activations, n and outputs are f32.
            ("SWIGLU", "f32", 1, 64, 96, {"x": tensor("bf16", [64, 1])}),
            ("SWIGLU", "f32", 1, 64, 96, {"n": tensor("f16", [64])}),
            ("SWIGLU", "f32", 1, 64, 96, {"h": tensor("f16", [96, 1])}),
            ("SWIGLU", "f32", 1, 64, 96, {"out": tensor("bf16", [64, 1])}),
            ("SWIGLU", "f32", 1, 64, 96, {"r": tensor("bf16", [64, 1])}),
            # n kept on every core: K = 16384 does not fit.
            ("SWIGLU", "q4_K", 1, 16384, 4096, {}),
            # No common K chunk of whole words: 32-value q4_0 chunks are 18 bytes.
            ("SWIGLU", "q4_0", 1, 96, 160, {}),
            # r repeated along dimension 0 (MUL_MAT_ADD's refusal).
            ("SWIGLU", "f32", 1, 64, 96, {"r": tensor("f32", [1])}),
            # Phases taking their rows differently: the gate/up GEMV the 2 rows at once, the
            # down projection one at a time (one row of r repeated over them); and q6_K's
            # gate/up GEMV with the norm and 8 rows does not fit a core, the down GEMV does.
            ("SWIGLU", "q4_0", 2, 256, 192, {"r": tensor("f32", [256])}),
            ("SWIGLU", "q6_K", 8, 2048, 8192, {}),
            # A strided output (MUL_MAT_ADD writes contiguous rows).
            (
                "SWIGLU",
                "f32",
                2,
                64,
                96,
                {"out": Tensor("f32", (64, 2, 1, 1), (4, 512, 1024, 1024))},
            ),
        ]
        for glu, ty, N, K, F, kw in refused:
            with self.subTest(glu=glu, ty=ty, N=N, K=K, F=F, kw=list(kw)):
                with self.assertRaises(UnsupportedError) as e:
                    ffn_spec(glu, ty, N, K, F, **kw)
                self.assertIn(f"RMS_NORM_FFN_{glu}", str(e.exception))
                if "wd_type" in kw:
                    self.assertIn(f"down weights are {kw['wd_type']}", str(e.exception))
        # Malformed: W_g and W_u differ; h or out of the wrong shape.
        bad = json.loads(ffn_request("SWIGLU", "f32", 1, 64, 96))
        bad["inputs"][1] = request_dict("ADD", [], tensor("f32", [64, 48]))["output"]
        with self.assertRaises(RequestError):
            prepare(parse_request(json.dumps(bad)))
        with self.assertRaises(RequestError):
            ffn_spec("SWIGLU", "f32", 1, 64, 96, h=tensor("f32", [95, 1]))
        with self.assertRaises(RequestError):
            ffn_spec("SWIGLU", "f32", 1, 64, 96, out=tensor("f32", [64, 2]))
        # op_params: eps only.
        with self.assertRaises(UnsupportedError):
            ffn_spec("SWIGLU", "f32", 1, 64, 96, op_params=[EPS_BITS, 1])
        # What is declared plans: every GLU, every weight type of the combos, r one row.
        for glu in GLU_OPS:
            self.assertIsNotNone(ffn_spec(glu, "f32", 1, 64, 96))
        for ty in ("bf16", "f16", "q4_1", "q5_0", "q5_K", "q6_K"):
            with self.subTest(ty=ty):
                self.assertIsNotNone(ffn_spec("SWIGLU", ty, 1, 512, 1024))
        self.assertIsNotNone(ffn_spec("SWIGLU", "f32", 2, 64, 96, r=tensor("f32", [64])))


class FfnRecordTest(unittest.TestCase):
    """Recorded against the emulation's stand-in: every shim DMA, the descriptors in flight per
    task group, the channels and the core and memory tile memory are checked (no g++ build)."""

    def test_llama_shapes_record_and_h_is_complete_before_it_is_read(self):
        from ggml_hsa_iron.emu.compile import record

        for ty, N, K, F, arch in SHAPES:
            with self.subTest(ty=ty, N=N, K=K, F=F, arch=arch):
                spec = ffn_spec("SWIGLU", ty, N, K, F, arch)
                prog = record(spec).to_json("ffn", arch)
                seq = prog["sequence"]
                H, OUT = 7, 6
                h_drains = {op["task"] for op in seq if op["op"] == "drain" and op["arg"] == H}
                first_read = next(
                    i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == H
                )
                awaited = {t for op in seq[:first_read] if op["op"] == "await" for t in op["tasks"]}
                self.assertTrue(h_drains)
                self.assertLessEqual(h_drains, awaited)
                # Phase 2 writes out only; phase 1 reads x only. W_d's first tiles go out
                # while phase 1 runs (designs/ffn.py's _ahead).
                last_drain_h = max(i for i, op in enumerate(seq) if op.get("task") in h_drains)
                self.assertLess(last_drain_h, first_read)
                args = {op["arg"] for op in seq[first_read:] if "arg" in op}
                self.assertLessEqual({5, OUT, H}, args)  # r, out, h
                self.assertLessEqual(args, {2, 5, OUT, H})  # and W_d
                w_d = next(i for i, op in enumerate(seq) if op.get("arg") == 2)
                self.assertLess(w_d, first_read)
                self.assertEqual(len(prog["args"]), 8)


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class FfnEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu`, its program run in order on real data."""

    def test_fast_weights_are_ggml_blocks(self):
        from ggml_hsa_iron.tests.test_mvq_host import kernel_values

        for ty, size in (("q4_0", 18), ("q8_0", 34)):
            raw, vals = fast_weights(ty, 3, 64, np.random.default_rng(1))
            blocks = [raw[i : i + size] for i in range(0, len(raw), size)]
            want = np.asarray([v for b in blocks for v in kernel_values(ty, b)]).reshape(3, 64)
            np.testing.assert_array_equal(vals, want)

    def check(self, glu, ty, N, K, F, arch, layout, seed, two_kernels="ffn"):
        """The FFN against numpy, and bit for bit against the two kernels it replaces run in
        sequence: on the FFN's shape (`two_kernels` "ffn"), or as their ops plan them alone
        ("own": their K chunk must be the FFN's), or not (None)."""
        case = FfnCase(glu, ty, N, K, F, arch, layout, seed)
        h, out = case.run()
        case.check(self, h, out)
        if two_kernels:
            phases = []
            if two_kernels == "own":
                for i in (0, 1):
                    request = json.dumps(FfnPlanTest.phase(case.spec, i))
                    phases.append(prepare(parse_request(request)))
                    self.assertEqual(phases[-1].plan.k_chunk, case.spec.up.plan.k_chunk)
            h2, out2 = case.run_two_kernels(*phases)
            what = f"{glu} {ty} N={N} K={K} F={F} {arch}"
            assert_same_bits(self, h, h2, f"h of {what}")
            assert_same_bits(self, out, out2, f"out of {what}")

    def test_small_odd_shapes_every_glu_and_layout(self):
        cases = [
            ("SWIGLU", "f32", 1, 80, 60, "aie2p", "apart"),
            ("REGLU", "f32", 3, 48, 37, "aie2", "in_place"),
            ("GEGLU_ERF", "f32", 2, 80, 60, "aie2", "out_over_x"),
            ("GEGLU_QUICK", "q4_0", 1, 256, 192, "aie2p", "bias"),
            ("GEGLU", "q8_0", 1, 256, 192, "aie2", "in_place"),
        ]
        for i, (glu, ty, N, K, F, arch, layout) in enumerate(cases):
            with self.subTest(glu=glu, ty=ty, N=N, K=K, F=F, arch=arch, layout=layout):
                self.check(glu, ty, N, K, F, arch, layout, seed=i)

    def test_llama_3_2_1b_ffn(self):
        # K = 2048, F = 8192, one token; r and out in x's memory as llama runs its residual
        # ADD, or apart.
        cases = [
            ("SWIGLU", "f32", "aie2p", "in_place", "ffn"),
            ("GEGLU", "f32", "aie2", "apart", None),
            ("SWIGLU", "q4_0", "aie2p", "in_place", None),
            ("GEGLU", "q4_0", "aie2", "apart", "ffn"),
            # RMS_NORM_MUL_MAT_SWIGLU and MUL_MAT_ADD alone plan this K chunk too.
            ("SWIGLU", "q8_0", "aie2p", "in_place", "own"),
        ]
        for i, (glu, ty, arch, layout, two) in sample.pick(enumerate(cases)):
            with self.subTest(glu=glu, ty=ty, arch=arch, layout=layout):
                self.check(glu, ty, 1, *LLAMA, arch, layout, seed=10 + i, two_kernels=two)

    def test_a_few_tokens_decode_each_weight_tile_once(self):
        # A decode step of several tokens (sequences side by side, a draft's verification):
        # every phase's GEMV takes the N rows at once (GemvPlan.nx), each row normed with its
        # own s and added to its own r row; against numpy and bit for bit against the two
        # kernels, which take the rows at once too.
        cases = [
            ("SWIGLU", "q4_0", 4, 256, 192, "aie2p", "in_place"),
            ("GEGLU", "q8_0", 3, 512, 256, "aie2", "apart"),
            ("REGLU", "q4_0", 8, 256, 512, "aie2p", "out_over_x"),
            ("SWIGLU", "q4_0", 4, *LLAMA, "aie2p", "in_place"),
        ]
        for i, (glu, ty, N, K, F, arch, layout) in enumerate(cases):
            with self.subTest(glu=glu, ty=ty, N=N, K=K, F=F, arch=arch, layout=layout):
                spec = ffn_spec(glu, ty, N, K, F, arch)
                self.assertEqual((spec.up.plan.nx, spec.down.plan.nx), (N, N))
                self.check(glu, ty, N, K, F, arch, layout, seed=50 + i)

    def test_bit_for_bit_with_the_two_kernels_as_they_plan(self):
        # RMS_NORM_MUL_MAT_<glu>'s and MUL_MAT_ADD's own plans (their columns, rows and rows
        # per core) with the FFN's K chunk give its results bit for bit: only the K chunking
        # orders the sums.
        case = FfnCase("SWIGLU", "q4_0", 1, 256, 192, "aie2", "in_place", seed=30)
        spec = case.spec
        kc = spec.up.plan.k_chunk
        alone = []
        for i in (0, 1):
            own = prepare(parse_request(json.dumps(FfnPlanTest.phase(spec, i))))
            alone.append(dataclasses.replace(own, plan=dataclasses.replace(own.plan, k_chunk=kc)))
        shape = lambda p: (p.columns, p.rows, p.rows_per_tile)  # noqa: E731
        self.assertNotEqual([shape(a.plan) for a in alone], [shape(spec.up.plan)] * 2)
        h, out = case.run()
        h2, out2 = case.run_two_kernels(*alone)
        assert_same_bits(self, h, h2, "h")
        assert_same_bits(self, out, out2, "out")

    def test_the_awaits_between_the_phases_are_needed(self):
        # The recorded program run in order without the awaits of phase 1's drains: the first
        # read of h races its writes, which the in-order executor refuses.
        from ggml_hsa_iron.tests.util_emu import build_spec
        from ggml_hsa_iron.tests.util_emu_seq import run_program_in_order

        case = FfnCase("SWIGLU", "f32", 1, 80, 60, "aie2p", "in_place", seed=40)
        prog, lib = build_spec(case.spec)
        run_program_in_order(prog, lib, case.args())  # as designed: fine
        seq = prog["sequence"]
        first_read = next(i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == 7)
        broken = dict(prog, sequence=[op for op in seq[:first_read] if op["op"] != "await"])
        broken["sequence"] += seq[first_read:]
        with self.assertRaisesRegex(RuntimeError, "not awaited yet"):
            run_program_in_order(broken, lib, case.args())


if __name__ == "__main__":
    unittest.main()
