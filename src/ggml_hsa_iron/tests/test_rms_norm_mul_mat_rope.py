"""RMS_NORM_MUL_MAT_ROPE and RMS_NORM_MUL_MAT_ROPE_FF: RMS_NORM_MUL_MAT's product of each token
viewed as [D, H] and rotated as ggml's ROPE (ROPE_FF), one kernel (llama's Q and K projections).

* the plan: RMS_NORM_MUL_MAT's GEMV with the rotation's constants (the frequency factors, the
  positions, padding from n) once per dispatch behind n on the x channel, in whole x objects;
  every core's rows of every round hold whole rotation pairs (checked on the rows each core
  receives, util_matmul.gemv_streams), a NeoX head of 128 rows on one core; the static data
  counted in the core's memory; the shim descriptors and channel tasks; the defines (eps from
  word 11); the refusals (modes, n_dims, D * H != M, the output's type and layout, the
  positions and factors, dense M the GEMM takes, heads no plan keeps whole, a K too large);
* Llama-sized shapes recorded against the emulation's stand-in (its DMA and memory checks);
* end to end: the design compiled for `--target emu` and run on real data (tests/util_emu.py)
  against numpy (util_norm's RMS_NORM_MUL_MAT reference, then test_rope_glu_host's ggml ROPE
  reference): Llama-3.2-1B's Q (K = 2048, M = 2048, D = 64, H = 32) and K (M = 512, H = 8, f16
  output), modes 0 and 2, with and without Llama 3's frequency factors, YaRN (ext_factor != 0),
  f32, q4_0, q8_0 and q4_K weights, aie2p and aie2, small odd shapes (n_dims < D, heads split
  between cores, a shifted last round, several tokens); the f16 output bit for bit against the
  f32 design's rounded to nearest even; the f32 output bit for bit against RMS_NORM_MUL_MAT's
  design followed by ROPE's (the same sums, the shared rotation code of rope_math.h).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import math
import random
import unittest

from ggml_hsa_iron.errors import RequestError, UnsupportedError
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import Tensor, parse_request
from ggml_hsa_iron.tiling import (
    MAX_TASKS_PER_CHANNEL,
    SHIM_GROUP_TASKS,
    RopeRows,
    mv_norm_bytes,
    mv_rope_bytes,
    stash_bytes,
)

from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_rope_glu_host import fbits
from ggml_hsa_iron.tests.test_rms_norm_mul_mat import EPS_BITS, norm_request
from ggml_hsa_iron.tests.util import request_json, tensor
from ggml_hsa_iron.tests.util_matmul import gemv_streams

try:
    import numpy as np

    from ggml_hsa_iron.tests.util_emu import run_request
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

OP = "RMS_NORM_MUL_MAT_ROPE"
LLAMA3_BASE = 500000.0


def rope_params(n_dims, mode, freq_base=LLAMA3_BASE, freq_scale=1.0, ext=0.0, attn=1.0, ctx=0):
    """ROPE's 11 op_params words as ggml stores them (n_past, n_dims, mode, n_ctx, n_ctx_orig,
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow), then eps."""
    floats = (freq_base, freq_scale, ext, attn, 32.0, 1.0)
    return [0, n_dims, mode, 0, ctx] + [fbits(v) for v in floats] + [EPS_BITS]


def rope_request(
    ty, K, D, H, T=1, mode=0, ff=False, arch="aie2p", otype="f32", n_dims=None, P=None, **kw
):
    """W [K, D*H] of type ty, x [K, T], n [K], the positions [P] (T by default), (ff) the
    factors [n_dims/2]; the output [D, H, T] of otype. kw: rope_params' (freq_scale, ext, ...),
    or `inputs`, `out`, `params` replacing the request's."""
    n_dims = n_dims or D
    ins = [tensor(ty, [K, D * H]), tensor("f32", [K, T]), tensor("f32", [K])]
    ins.append(tensor("i32", [P or T]))
    if ff:
        ins.append(tensor("f32", [n_dims // 2]))
    ins = kw.pop("inputs", ins)
    out = kw.pop("out", tensor(otype, [D, H, T]))
    params = kw.pop("params", None) or rope_params(n_dims, mode, **kw)
    op = f"{OP}_FF" if len(ins) == 5 else OP
    return request_json(op, ins, out, arch, op_params=params)


def rope_spec(*args, **kw):
    return prepare(parse_request(rope_request(*args, **kw)))


def pairs(M, D, n_dims, neox):
    """The (first, second) product rows of every rotated pair of the heads of M rows."""
    half = n_dims // 2
    out = []
    for h in range(M // D):
        for i in range(half):
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            out.append((h * D + a, h * D + b))
    return out


def llama3_ff(n_dims, base=LLAMA3_BASE, factor=32.0, low=1.0, high=4.0, old_ctx=8192):
    """Llama 3's rope frequency factors (convert_hf_to_gguf's rope_freqs): 1 for the short
    wavelengths, `factor` for the long ones, a smooth blend between."""
    out = []
    for i in range(0, n_dims, 2):
        wavelen = 2 * math.pi * base ** (i / n_dims)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


class NormRopePlanTest(unittest.TestCase):
    def check_pairs(self, spec):
        """Every core's rows of every round (the dst rows its y objects land on) hold both
        rows of a pair or neither, and one token's rows."""
        r, M = spec.plan.rope, spec.plan.N
        ps = pairs(M, r.head, r.n_dims, r.neox)
        objects = 0
        for core in gemv_streams(spec).values():
            for dest in core["y"]:
                self.assertEqual(len({d // M for d in dest}), 1)
                rows = {d % M for d in dest}
                for a, b in ps:
                    self.assertEqual(a in rows, b in rows, (a, b, sorted(rows)[:4]))
                objects += 1
        return objects

    def test_llama_plans_keep_pairs_on_one_core(self):
        cases = [
            # K, D, H, T, mode, weights, output, arch
            (2048, 64, 32, 1, 0, "f32", "f32", "aie2p"),  # Llama-3.2-1B's Q
            (2048, 64, 8, 1, 2, "q4_0", "f16", "aie2"),  # its K, into the f16 cache
            (2048, 64, 8, 3, 0, "q8_0", "f16", "aie2p"),
            (4096, 128, 32, 1, 2, "q4_0", "f32", "aie2p"),  # Llama-3-8B-sized Q, NeoX
            (4096, 128, 8, 1, 2, "f32", "f16", "aie2"),
            (4096, 128, 32, 2, 0, "q4_0", "f32", "aie2"),
            (64, 6, 5, 2, 2, "f32", "f32", "aie2"),  # a shifted last round
        ]
        for K, D, H, T, mode, ty, ot, arch in cases:
            with self.subTest(K=K, D=D, H=H, T=T, mode=mode, ty=ty, ot=ot, arch=arch):
                spec = rope_spec(ty, K, D, H, T, mode, arch=arch, otype=ot)
                p = spec.plan
                self.assertTrue(spec.gemv and p.norm and spec.n is not None)
                self.assertEqual(p.rope, RopeRows(D, D, mode == 2, T, 0))
                self.assertEqual(spec.dst.ne, (D * H, T, 1, 1))  # the product's view
                self.assertEqual(self.check_pairs(spec), p.columns * p.rows * p.rounds * T)
                if mode == 2:
                    # A NeoX head's span on one core: rows per core of whole heads.
                    self.assertEqual(p.rows_per_tile % D, 0)

    def test_heads_split_between_cores_in_normal_mode(self):
        # Pairs (2i, 2i + 1) only need even boundaries: the 128-row heads of f32 weights go to
        # cores fewer rows at a time here, a head on several cores.
        spec = rope_spec("f32", 2048, 128, 4, 1, 0, n_dims=96)
        self.assertLess(spec.plan.rows_per_tile, 128)
        self.check_pairs(spec)
        # Past n_dims nothing is paired: a boundary there splits nothing.
        rows = RopeRows(128, 96, True, 1)
        self.assertFalse(any(rows.splits(b) for b in (0, 96, 100, 128, 256 + 97)))
        self.assertTrue(all(rows.splits(b) for b in (1, 48, 95, 128 + 64)))
        rows = RopeRows(128, 96, False, 1)
        self.assertEqual([b for b in range(100) if rows.splits(b)], list(range(1, 96, 2)))

    def test_the_constants_ride_behind_n_in_whole_x_objects(self):
        for ff, P in ((False, 1), (True, 1), (True, 7)):
            with self.subTest(ff=ff, P=P):
                spec = rope_spec("q4_0", 2048, 64, 32, 1, 0, ff=ff, P=P)
                p = spec.plan
                kc, taps = p.k_chunk, p.rope_taps()
                names = [name for name, _ in taps]
                self.assertEqual(names[: 1 + ff], ["ff", "pos"] if ff else ["pos"])
                words = sum(t.sizes[3] for _, t in taps)
                self.assertEqual(words, p.rope_objects * kc)
                self.assertEqual(p.rope_objects, -(-(32 * ff + 1) // kc))
                for _, t in taps:
                    self.assertEqual((t.offset, t.sizes[:3]), (0, (1, 1, 1)))
                self.assertEqual(dict(taps)["pos"].sizes[3], 1)  # the first T positions only
                # The runtime sequence: W, x, n, the positions, (the factors,) dst.
                seq = spec.sequence
                want = [("f32", 2048), ("f32", 2048), ("f32", P)] + [("f32", 32)] * ff
                self.assertEqual(seq[1:-1], want)
                self.assertEqual(seq[-1], ("f32", 2048))
                # x's channel: n, the constants, then x per group; within the descriptors.
                groups = spec.tasks()
                first = 1 + 1 + len(taps) + 1 + 1  # W, n, constants, x, y
                self.assertLessEqual(first, SHIM_GROUP_TASKS)
                x_tasks = len(groups) + 1 + len(taps)
                self.assertLessEqual(x_tasks, MAX_TASKS_PER_CHANNEL)

    def test_heads_norm_keeps_whole_heads_on_a_core_and_rides_with_the_constants(self):
        # qwen3's Q: every boundary inside a head splits it (normal mode too, past n_dims too);
        # the head's D weights travel between the factors and the positions.
        rows = RopeRows(64, 32, False, 1, 0, True)
        self.assertEqual([b for b in range(130) if not rows.splits(b)], [0, 64, 128])
        self.assertEqual(rows.words, 64 + 1)
        self.assertGreater(mv_rope_bytes(rows), mv_rope_bytes(RopeRows(64, 32, False, 1)))
        ins = [tensor("q4_0", [1024, 2048]), tensor("f32", [1024, 1]), tensor("f32", [1024])]
        ins += [tensor("i32", [1]), tensor("f32", [128])]
        params = rope_params(128, 2) + [fbits(1e-6)]
        text = request_json(
            "RMS_NORM_MUL_MAT_HEAD_NORM_ROPE", ins, tensor("f32", [128, 16, 1]), op_params=params
        )
        spec = prepare(parse_request(text))
        p = spec.plan
        self.assertEqual(p.rows_per_tile % 128, 0)
        self.assertEqual([name for name, _ in p.rope_taps()][:2], ["hn", "pos"])
        self.assertEqual(spec.core.defines["MV_ROPE_HEAD_NORM"], 1)
        self.assertEqual(spec.core.defines["HEAD_NORM_EPS"], fbits(1e-6))

    def test_a_bias_rides_once_per_dispatch_per_column_in_whole_rounds(self):
        # qwen2's Q: each column's values of every round in one tap behind the constants, x's
        # first values padding the last object; rounds whole.
        ins = [tensor("q4_0", [896, 896]), tensor("f32", [896, 1]), tensor("f32", [896])]
        ins += [tensor("i32", [1]), tensor("f32", [896])]
        text = request_json(
            "RMS_NORM_MUL_MAT_BIAS_ROPE", ins, tensor("f32", [64, 14, 1]),
            op_params=rope_params(64, 2),
        )  # fmt: skip
        spec = prepare(parse_request(text))
        p = spec.plan
        self.assertEqual(p.N % p.block, 0)
        cr = p.rows * p.rows_per_tile
        for col in range(p.columns):
            taps = dict(p.bias_taps(col))
            self.assertEqual(taps["b"].offset, col * cr)
            self.assertEqual(taps["b"].sizes, (1, 1, p.rounds, cr))
            self.assertEqual(taps["b"].strides[2], p.block)
            pad = taps["x"].sizes[3] if "x" in taps else 0
            self.assertEqual(p.rounds * cr + pad, p.bias_objects * p.k_chunk)
        self.assertEqual(spec.sequence[-2], ("f32", 896))
        d = spec.core.defines
        self.assertEqual((d["MV_BIAS_ROUNDS"], d["MV_BIAS_COLUMN_ROWS"]), (p.rounds, cr))

    def test_the_static_data_is_counted_in_the_core_memory(self):
        for arch in ("aie2", "aie2p"):
            for ty, ot in (("f32", "f32"), ("f32", "f16"), ("q4_K", "f32")):
                with self.subTest(arch=arch, ty=ty, ot=ot):
                    spec = rope_spec(ty, 2048, 64, 32, 3, 2, ff=True, arch=arch, otype=ot)
                    p = spec.plan
                    nr, kc = p.rows_per_tile, p.k_chunk
                    w = p.w_units(kc) * (p.w_size or 1)
                    y = 2 if ot == "f16" else 4
                    l1 = 2 * nr * w + 2 * kc * 4 + 2 * nr * y + mv_norm_bytes(2048, kc)
                    l1 += (stash_bytes(nr) if ot == "f16" else 0) + mv_rope_bytes(p.rope)
                    self.assertLessEqual(l1, spec.arch.l1_budget)
                    # Six arrays of n_dims/2 = 32 floats, 3 positions, counters.
                    self.assertEqual(mv_rope_bytes(p.rope), 6 * 4 * 32 + 3 * 4 + 16)

    def test_defines(self):
        params = rope_params(48, 2, freq_scale=0.25, ext=1.0, attn=1.0, ctx=4096)
        spec = rope_spec("q8_0", 256, 64, 4, 2, ff=True, n_dims=48, params=params)
        d = spec.core.defines
        self.assertEqual(spec.core.object_name, "mvq.o")
        self.assertEqual((d["MV_NORM"], d["MV_NORM_K"], d["OP_P0"]), (1, 256, EPS_BITS))
        want = {"MV_ROPE": 1, "MV_ROPE_HEAD": 64, "MV_ROPE_N": 256, "MV_ROPE_TOKENS": 2}
        want.update(N_DIMS=48, NEOX=1, FF=1, YARN=1, MV_ROPE_BLOCK=spec.plan.block)
        self.assertEqual({k: d[k] for k in want}, want)
        self.assertEqual(d["FREQ_SCALE"], fbits(0.25))
        self.assertNotIn("MV_GLU", d)
        d = rope_spec("f32", 64, 16, 4, otype="f16").core.defines
        self.assertEqual((d["MV_OUT_F16"], d["MV_ROPE"], d["FF"], d["YARN"]), (1, 1, 0, 0))

    def test_refusals(self):
        def refused(regex, *args, **kw):
            with self.subTest(regex=regex, args=args, kw=kw):
                with self.assertRaisesRegex(UnsupportedError, regex):
                    rope_spec(*args, **kw)

        for mode in (1, 8, 24, 40):  # GPT-J-less modes: multi-section, vision, imrope
            refused("mode", "f32", 256, 64, 4, 1, mode)
        for n_dims in (63, 66, 128):
            refused("n_dims", "f32", 256, 64, 4, n_dims=n_dims)
        refused("n_dims", "f32", 256, 64, 4, params=[0, 0, 0] + [0] * 8 + [EPS_BITS])
        # The output: D * H != M, its dimension 2 not the tokens, its type, its layout.
        refused("D \\* H = M", "f32", 256, 64, 4, out=tensor("f32", [64, 3, 1]))
        refused("D \\* H = M", "f32", 256, 64, 4, 2, out=tensor("f32", [64, 4, 1]))
        for ot in ("bf16", "i32"):
            refused("dense f32 or f16", "f32", 256, 64, 4, otype=ot)
        strided = Tensor("f32", (64, 4, 1, 1), (4, 512, 2048, 2048))
        refused("dense f32 or f16", "f32", 256, 64, 4, out=strided)
        # The positions and the factors.
        w, x, n = tensor("f32", [256, 256]), tensor("f32", [256, 2]), tensor("f32", [256])
        refused("positions", "f32", 256, 64, 4, 2, inputs=[w, x, n, tensor("i32", [1])])
        refused("positions", "f32", 256, 64, 4, 2, inputs=[w, x, n, tensor("f32", [2])])
        pos = tensor("i32", [2])
        for ff in (tensor("f32", [31]), tensor("f16", [32])):
            refused("frequency factors", "f32", 256, 64, 4, 2, inputs=[w, x, n, pos, ff])
        # x batched, or strided.
        xb = tensor("f32", [256, 1, 2])
        refused("no batches", "f32", 256, 64, 4, inputs=[w, xb, n, tensor("i32", [2])])
        # RMS_NORM_MUL_MAT's refusals: dense M that MUL_MAT's GEMM takes, x not f32, a K that
        # does not keep n on a core, an f16 output of rows off whole words.
        refused("GEMM, which has no norm", "f32", 256, 64, 4, 8)
        refused("GEMM, which has no norm", "q4_0", 2048, 64, 8, 16, otype="f16")
        xh = tensor("f16", [256, 1])
        refused("f32 x and n", "f32", 256, 64, 4, inputs=[w, xh, n, tensor("i32", [1])])
        refused("K = 16384 too large", "f32", 16384, 64, 4)
        refused("K = 16384 too large", "q4_K", 16384, 64, 32, 1, 2)
        refused("f16 output", "q4_0", 256, 3, 21, otype="f16", n_dims=2)
        # No plan keeps a NeoX head of 2048 rows on one core (at most 1023 rows per core).
        refused("keeps a head's 2048 rotated rows", "q4_0", 256, 2048, 1, 1, 2)
        # A NeoX head of 128 rows on one core takes 2 x 128 rows of a K chunk of whole 256-value
        # q4_K blocks (36 KiB) besides n (16 KiB at K = 4096): over the core's 48 KiB. Normal
        # mode splits such heads between cores.
        refused("keeps a head's 128 rotated rows", "q4_K", 4096, 128, 32, 1, 2)
        self.assertLess(rope_spec("q4_K", 4096, 128, 32, 1, 0).plan.rows_per_tile, 128)
        # op_params past eps.
        with self.assertRaises(UnsupportedError):
            rope_spec("f32", 256, 64, 4, params=rope_params(64, 0) + [1])
        with self.assertRaisesRegex(RequestError, "n \\[32, 1, 1, 1\\] is not one row"):
            x1 = tensor("f32", [256, 1])
            rope_spec("f32", 256, 64, 4, inputs=[w, x1, tensor("f32", [32]), tensor("i32", [1])])
        # What is compiled: NeoX heads off the usual rows per core (6 rows, a shifted last
        # round), normal-mode heads split between cores, several tokens below the GEMM's rows.
        self.assertEqual(rope_spec("f32", 64, 6, 5, 1, 2).plan.rows_per_tile % 6, 0)
        self.assertIsNotNone(rope_spec("f32", 2048, 128, 4, 3, 0))


class NormRopeRecordTest(unittest.TestCase):
    """Llama-sized decode shapes record against the emulation's stand-in, which checks every
    shim DMA, the descriptors in flight and the core memory (no g++ build)."""

    def test_large_shapes_stay_within_the_dma_limits(self):
        from ggml_hsa_iron.emu.compile import record

        cases = [
            # K, D, H, T, mode, ff, weights, output
            (2048, 64, 32, 1, 0, True, "q4_0", "f32"),
            (2048, 64, 8, 1, 0, True, "q4_0", "f16"),
            (2048, 64, 32, 3, 2, False, "f32", "f32"),
            (4096, 128, 32, 1, 2, True, "q4_0", "f32"),
            (4096, 128, 32, 1, 0, True, "q4_K", "f32"),
            (4096, 128, 8, 2, 0, False, "q8_0", "f16"),
        ]
        for arch in ("aie2", "aie2p"):
            for K, D, H, T, mode, ff, ty, ot in cases:
                with self.subTest(arch=arch, K=K, D=D, H=H, T=T, mode=mode, ty=ty, ot=ot):
                    record(rope_spec(ty, K, D, H, T, mode, ff=ff, arch=arch, otype=ot))


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class NormRopeEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu` and its recorded program run on real data."""

    def run_case(self, ty, K, D, H, T, mode, ff, arch, otype="f32", n_dims=None, seed=0, **kw):
        """(spec, the operands' bytes, the output as float64 [T, D*H], the reference values
        and their tolerance)."""
        n_dims = n_dims or D
        M = D * H
        text = rope_request(ty, K, D, H, T, mode, ff, arch, otype, n_dims, P=T + 2, **kw)
        spec = prepare(parse_request(text))
        nrng, rng = np.random.default_rng(seed), random.Random(seed)
        w_bytes, w = norm_weights(ty, M, K, nrng, rng)
        x, n = norm_inputs(nrng, T, K)
        pos = nrng.integers(0, 4096, T + 2).astype(np.int32)  # the last two are not read
        ffv = np.array(llama3_ff(n_dims), np.float32) if ff else None
        ins = [w_bytes, x.tobytes(), n.tobytes(), pos.tobytes()]
        ins += [ffv.tobytes()] if ff else []
        npt = np.float16 if otype == "f16" else np.float32
        got = np.frombuffer(run_request(text, ins), npt).astype(np.float64).reshape(T, M)
        # The projection as the cores compute it, then ggml's ROPE of each token's heads.
        y, err = norm_reference(ty, x, n, w)
        want, tol = rope_reference(y, err, pos, ffv, n_dims, mode == 2, spec.rope.constants, D)
        if otype == "f16":
            tol = tol + f16_half_ulp(want)
        return spec, ins, got, want, tol

    def check(self, *args, **kw):
        spec, ins, got, want, tol = self.run_case(*args, **kw)
        bad = ~(np.abs(got - want) <= tol + 1e-30)  # NaN fails too
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            self.fail(
                f"{args} {kw}: {int(bad.sum())} of {got.size} wrong, first at {i}: {got[i]} vs "
                f"{want[i]} (tolerance {tol[i]})"
            )
        return spec, ins, got

    def check_f16(self, ty, K, D, H, T, mode, ff, arch, seed, **kw):
        """The f16 output against numpy and, bit for bit, against the f32 design's result
        rounded to nearest even (both plans chunk K alike here: the same sums, s and rotation
        of each value, rounded once)."""
        spec, ins, got = self.check(ty, K, D, H, T, mode, ff, arch, "f16", seed=seed, **kw)
        text = rope_request(ty, K, D, H, T, mode, ff, arch, "f32", P=T + 2, **kw)
        self.assertEqual(spec.plan.k_chunk, prepare(parse_request(text)).plan.k_chunk)
        f32 = np.frombuffer(run_request(text, ins), np.float32).reshape(got.shape)
        rounded = f32.astype(np.float16)
        diff = got.astype(np.float16).view(np.uint16) != rounded.view(np.uint16)
        if diff.any():
            i = tuple(np.argwhere(diff)[0])
            self.fail(
                f"f16 {ty} D={D} H={H} mode={mode} {arch}: {int(diff.sum())} values differ from "
                f"the f32 design's rounded, first at {i}: {got[i]} vs {rounded[i]}"
            )

    def test_llama_3_2_1b_q_projection(self):
        # K = 2048, M = 2048: 32 heads of 64; decode (one token).
        cases = [
            ("f32", 0, False, "aie2p", {}),
            ("q4_0", 0, True, "aie2", {}),
            ("q4_0", 2, True, "aie2p", {}),
            # YaRN: ext_factor != 0 (the ramp between interpolation and extrapolation) and its
            # magnitude scale.
            ("f32", 2, False, "aie2", dict(freq_scale=0.25, ext=1.0, attn=1.0, ctx=4096)),
            ("q4_K", 0, False, "aie2p", {}),
        ]
        for i, (ty, mode, ff, arch, kw) in enumerate(cases):
            with self.subTest(ty=ty, mode=mode, ff=ff, arch=arch, **kw):
                self.check(ty, 2048, 64, 32, 1, mode, ff, arch, seed=i, **kw)

    def test_llama_3_2_1b_k_projection_into_the_f16_cache(self):
        # K = 2048, M = 512: 8 KV heads of 64, written as f16.
        cases = [
            ("f32", 0, True, "aie2p"),
            ("q4_0", 2, False, "aie2"),
            ("q4_0", 0, True, "aie2p"),
            ("q8_0", 2, True, "aie2"),
        ]
        for i, (ty, mode, ff, arch) in enumerate(cases):
            with self.subTest(ty=ty, mode=mode, ff=ff, arch=arch):
                self.check_f16(ty, 2048, 64, 8, 1, mode, ff, arch, seed=10 + i)

    def test_a_few_tokens_at_once(self):
        # A decode step of several tokens: one GEMV takes them all (GemvPlan.nx), each token's
        # rows rotated by its own position; Q in f32, K written as f16 (the cache rows).
        for i, (ty, T, arch) in enumerate((("q4_0", 4, "aie2p"), ("q4_K", 3, "aie2"))):
            with self.subTest(ty=ty, T=T, arch=arch):
                self.assertEqual(rope_spec(ty, 2048, 64, 32, T, 0, True, arch).plan.nx, T)
                self.check(ty, 2048, 64, 32, T, 0, True, arch, seed=60 + i)
                self.check_f16(ty, 2048, 64, 8, T, 2, False, arch, seed=70 + i)

    def test_small_odd_shapes(self):
        # Heads whose last rows pass through (n_dims < D), NeoX heads on cores of whole heads
        # with a shifted last round, normal-mode heads split between cores (and a shifted last
        # round whose start is not a whole number of heads after the previous one's: a wrong
        # start would rotate rows as other dimensions), K off the vector lanes, several tokens.
        cases = [
            ("f32", 48, 6, 5, 2, 0, False, "aie2", 4),
            ("f32", 48, 10, 5, 2, 0, True, "aie2", 8),
            ("f32", 48, 6, 5, 2, 2, True, "aie2p", 4),
            ("q4_0", 64, 6, 7, 1, 2, False, "aie2", 6),
            ("f32", 75, 128, 3, 3, 0, True, "aie2p", 96),
            ("f32", 30, 10, 3, 1, 2, True, "aie2", 8),
        ]
        shifted = set()
        for i, (ty, K, D, H, T, mode, ff, arch, n_dims) in enumerate(cases):
            with self.subTest(ty=ty, K=K, D=D, H=H, T=T, mode=mode, ff=ff, arch=arch):
                spec, _, _ = self.check(ty, K, D, H, T, mode, ff, arch, n_dims=n_dims, seed=20 + i)
                p = spec.plan
                if p.N % p.block:
                    shifted.add((mode, p.block % D != 0))
        self.assertEqual(shifted, {(0, False), (0, True), (2, False)})
        self.check_f16("f32", 48, 6, 5, 2, 2, True, "aie2", seed=30, n_dims=4)

    def test_fused_equals_rms_norm_mul_mat_then_rope(self):
        # The f32 output is RMS_NORM_MUL_MAT's design's followed by ROPE's (ROPE_FF's), bit for
        # bit, when the two GEMVs chunk K alike: the same sums and s, and the rotation code the
        # ROPE cores run (rope_math.h).
        cases = [
            ("q4_0", 2048, 64, 32, 1, 0, True, "aie2p", 64),
            ("f32", 48, 6, 5, 2, 2, False, "aie2", 4),
        ]
        for ty, K, D, H, T, mode, ff, arch, n_dims in cases:
            with self.subTest(ty=ty, K=K, D=D, H=H, T=T, mode=mode, ff=ff, arch=arch):
                spec, ins, got = self.check(ty, K, D, H, T, mode, ff, arch, n_dims=n_dims)
                text = norm_request("", ty, T, D * H, K, arch)
                self.assertEqual(spec.plan.k_chunk, prepare(parse_request(text)).plan.k_chunk)
                y = run_request(text, ins[:3])
                x = tensor("f32", [D, H, T])
                rope_ins = [x, tensor("i32", [T + 2])] + ([tensor("f32", [n_dims // 2])] * ff)
                params = rope_params(n_dims, mode)[:11]
                rope = request_json(
                    "ROPE_FF" if ff else "ROPE", rope_ins, x, arch, op_params=params
                )
                want = np.frombuffer(run_request(rope, [y] + ins[3:]), np.float32)
                np.testing.assert_array_equal(got.reshape(-1), want.astype(np.float64))


if __name__ == "__main__":
    unittest.main()
