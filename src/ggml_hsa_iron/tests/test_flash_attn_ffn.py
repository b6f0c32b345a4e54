"""FLASH_ATTN_FFN_<glu>: a decode step's attention (FLASH_ATTN_EXT_MASK) ahead of
MUL_MAT_ADD_RMS_NORM_FFN_<glu>, one program whose attention phase runs on the GEMV's own fifos
and cores (designs/ffn.py, plans_fa_ffn.py, kernels/mv_fa.h).

* the plan: Llama-3.2-1B's decode shape (n_embd 2048, 32 heads / 8 KV heads, D 64, n_ff 8192,
  n_kv 256 of an f16 cache whose rows hold the 8 KV heads) with q4_0 and f16 weights on aie2p
  and aie2 takes MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s own shape; the tiny llama's (n_embd 256, 4 /
  2 heads); a group of 3 q heads per KV head (R = 1 only); the attention's taps read exactly
  each KV head's q rows, mask row, K and V rows as whole x objects and its drains write every
  row of a once; the core memory and the shim tasks counted over the whole program; the core
  defines; the refusals (ALiBi, two query rows, a per-head mask, a context whose scores do
  not fit a core, 3 q heads per KV head whose one core cannot hold them, the attention's and
  the block's own refusals, the request's outputs);
* the recorded program: every drain of a awaited before phase 0's first task (W_o's fill, then
  a read back as x), the attention touching q, k, v, the mask and a only; the in-order
  executor refusing the program with those awaits removed;
* end to end through the emulation (the runtime sequence run in order) against numpy's
  FLASH_ATTN_EXT (test_flash_attn's reference and tolerance; masked keys -inf, their K and V
  rows NaN) and the block's references on the a the design wrote, on both archs; f16, bf16
  and f32 caches, a softcap; and r1, h and out bit for bit equal to MUL_MAT_ADD_RMS_NORM_FFN's
  own program given the same a.
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
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tiling import MAX_REPEAT, MAX_TASKS_PER_CHANNEL, SHIM_GROUP_TASKS

from ggml_hsa_iron.tests.test_flash_attn import cache_view, f32_bits
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.util import tensor
from ggml_hsa_iron.tests.util_ffn import attn_ffn_spec, fa_ffn_request, fa_ffn_spec

try:
    import numpy  # noqa: F401

    from ggml_hsa_iron.tests.util_ffn import FaFfnCase, assert_same_bits

    HAVE_NUMPY = True
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    HAVE_NUMPY = False

# Llama-3.2-1B: n_embd, n_head, n_head_kv, head_dim, n_ff, n_kv (a 256-row f16 cache).
LLAMA = (2048, 32, 8, 64, 8192, 256)
# The tiny llama of the backend's tests: n_embd 256, 4 heads / 2 KV heads.
TINY = (256, 4, 2, 64, 512, 256)
# Operand indices of the runtime sequence.
Q, K, V, M, WO, R0, WG, WU, WD, NORM, OUT, A, R1, H = range(14)


def shape(p):
    return (p.columns, p.rows, p.rows_per_tile, p.k_chunk)


def block_spec(glu, ty, dims, arch):
    """MUL_MAT_ADD_RMS_NORM_FFN_<glu> of the same block alone (a as [Ka, 1])."""
    n_embd, n_head, _, d, ff, _ = dims
    return attn_ffn_spec(glu, ty, 1, d * n_head, n_embd, ff, arch)


class FaFfnPlanTest(unittest.TestCase):
    def test_llama_3_2_1b_takes_the_blocks_shape(self):
        # gq = 4 q heads per KV head over R = 4 cores: one head each; Dv = 64 whole y
        # objects; K and V rows of 32 words, 8 of them an x object of 256 words.
        want = {
            ("aie2p", "q4_0"): (8, 4, 64, 256),
            ("aie2p", "f16"): (8, 4, 32, 256),
            ("aie2", "q4_0"): (4, 4, 64, 256),
            ("aie2", "f16"): (4, 4, 32, 256),
        }
        for (arch, ty), got_want in want.items():
            with self.subTest(arch=arch, ty=ty):
                spec = fa_ffn_spec("SWIGLU", ty, *LLAMA, arch=arch)
                got = shape(spec.attn.plan)
                print(f"\nFLASH_ATTN_FFN_SWIGLU Llama-3.2-1B {ty} {arch}: C, R, nr, kc = {got}")
                self.assertEqual(got, got_want)
                self.assertEqual(got, shape(block_spec("SWIGLU", ty, LLAMA, arch).attn.plan))
                for p in (spec.up.plan, spec.down.plan):
                    self.assertEqual(shape(p), got)
                fa = spec.fa
                self.assertEqual((fa.gq, fa.gh, fa.out_objects), (4, 1, 64 // got[2]))
                self.assertEqual((fa.k_objects, fa.v_objects), (32, 32))
                self.assertEqual((fa.q_side.objects, fa.m_side.objects), (1, 1))
                # aie2p: one KV head per column; aie2's 4 columns: two each.
                rounds = [len(fa.column_heads(c)) for c in range(got[0])]
                self.assertEqual(set(rounds), {8 // got[0]})

    def test_tiny_llama(self):
        for arch in ("aie2p", "aie2"):
            with self.subTest(arch=arch):
                spec = fa_ffn_spec("SWIGLU", "f32", *TINY, arch=arch)
                fa = spec.fa
                self.assertEqual(fa.gq % fa.rows, 0)
                self.assertEqual(fa.gh * fa.rows, 2)
                # Columns past the two KV heads compute no attention.
                heads = [fa.column_heads(c) for c in range(fa.columns)]
                self.assertEqual(sorted(h for hs in heads for h in hs), [0, 1])

    def test_three_q_heads_per_kv_head_take_one_core_per_column(self):
        spec = fa_ffn_spec("SWIGLU", "q4_0", 768, 12, 4, 64, 1536, 256)
        self.assertEqual((spec.fa.rows, spec.fa.gh), (1, 3))
        self.assertEqual(shape(spec.up.plan)[1], 1)

    def test_the_phases_are_the_blocks_own_plans(self):
        # Where the attention fits the block's own shape, phases 0-2 are exactly the plans
        # MUL_MAT_ADD_RMS_NORM_FFN_<glu> makes alone (llama.cpp's cache view given).
        for dims, ty, arch in ((LLAMA, "q4_0", "aie2"), (LLAMA, "f16", "aie2p")):
            with self.subTest(dims=dims, ty=ty, arch=arch):
                spec = fa_ffn_spec("SWIGLU", ty, *dims, arch=arch)
                own = block_spec("SWIGLU", ty, dims, arch)
                for mine, theirs in zip(spec.phases, own.phases, strict=True):
                    self.assertEqual(mine.plan, theirs.plan)
                n_head_kv, d, n_kv = dims[2], dims[3], dims[5]
                k = cache_view("f16", d, n_kv, n_head_kv, n_kv + 32)
                self.assertEqual(spec.request.inputs[K], k)
        # The tiny llama's 2 q heads per KV head: R = 2 where the block alone takes 4.
        spec = fa_ffn_spec("SWIGLU", "q4_0", *TINY, arch="aie2")
        own = block_spec("SWIGLU", "q4_0", TINY, "aie2")
        self.assertEqual((spec.up.plan.rows, own.up.plan.rows), (2, 4))

    def test_the_taps_read_and_write_whole_heads(self):
        for dims, arch in ((LLAMA, "aie2"), (TINY, "aie2p")):
            with self.subTest(dims=dims, arch=arch):
                spec = fa_ffn_spec("GEGLU", "q4_0", *dims, arch=arch)
                fa, kc = spec.fa, spec.fa.kc
                q, k, v, mask = spec.request.inputs[:4]
                written = []
                for col in range(fa.columns):
                    for kvh in fa.column_heads(col):
                        # q: the group's gq rows, repeated to whole objects.
                        idx = fa.q_tap(kvh).indices()
                        self.assertEqual(len(idx) % kc, 0)
                        rows = [
                            (kvh * fa.gq + j) * q.nb[2] // 4 + i
                            for j in range(fa.gq)
                            for i in range(fa.d)
                        ]
                        self.assertEqual(idx, rows * (len(idx) // len(rows)))
                        self.check_chunks(fa, kvh, k, v)
                        # a: the joined y objects land on the column's heads' rows.
                        idx = fa.a_tap(kvh).indices()
                        self.assertEqual(len(idx), fa.gq * fa.dv)
                        written += idx
                self.assertEqual(sorted(written), list(range(fa.n_head * fa.dv)))

    def check_chunks(self, fa, kvh, k, v):
        """Per chunk its mask words repeated to whole objects, its K and V rows once in whole
        objects: over the chunks every key's once."""
        kc = fa.kc
        for c in range(fa.nc):
            keys = range(c * fa.chunk, (c + 1) * fa.chunk)
            idx = fa.mask_tap(0, c).indices()
            self.assertEqual(len(idx) % kc, 0)
            self.assertEqual(len(idx) // kc, fa.mask_side.objects)
            self.assertEqual(set(idx), set(range(keys.start // 2, -(-keys.stop // 2))))
            for t, tap, w in ((k, fa.k_tap(kvh, 0, c), fa.k_row_words),
                              (v, fa.v_tap(kvh, 0, c), fa.v_row_words)):  # fmt: skip
                want = [(kvh * t.nb[2] + j * t.nb[1]) // 4 + i for j in keys for i in range(w)]
                self.assertEqual(tap.indices(), want)
                self.assertEqual(len(want) % kc, 0)

    def test_a_long_context_takes_chunks_of_keys(self):
        """16384 keys of the 1B shape (64 KiB of one head's scores): the fewest equal chunks
        whose scores fit beside the block's data, each read once, in task groups within a
        shim's buffer descriptors."""
        for ty, arch in (("q4_0", "aie2p"), ("q4_0", "aie2"), ("f16", "aie2p")):
            with self.subTest(ty=ty, arch=arch):
                spec = fa_ffn_spec("SWIGLU", ty, *LLAMA[:5], 16384, arch=arch)
                fa = spec.fa
                self.assertGreater(fa.nc, 1)
                self.assertEqual(fa.chunk * fa.nc, 16384)
                room = spec.arch.l1_budget - ffn_core_bytes(spec.up.plan)
                self.assertLessEqual(fa.core_bytes, room)
                # One chunk fewer would not fit (the fewest that do).
                fewer = [n for n in range(1, fa.nc) if 16384 % n == 0]
                for n in fewer:
                    bigger = dataclasses.replace(fa, nc=n)
                    self.assertGreater(bigger.core_bytes, room)
                k, v = spec.request.inputs[1:3]
                for kvh in fa.column_heads(0):
                    self.check_chunks(fa, kvh, k, v)
                groups = fa.round_groups
                self.assertEqual([c for g in groups for c in g], list(range(fa.nc)))
                for i, g in enumerate(groups):
                    tasks = (i == 0) + 3 * len(g) + (i == len(groups) - 1)
                    self.assertLessEqual(tasks, SHIM_GROUP_TASKS)

    def test_object_keys(self):
        """An object's rows carry a divisor of the chunk's keys: all of them where they divide
        it, else two overlapping runs of half the rows ending at the object's last key."""
        from ggml_hsa_iron.plans_fa_ffn import ObjectKeys, object_keys

        self.assertEqual(object_keys(8, 256), ObjectKeys(8, 1, 8, 0))
        self.assertEqual(object_keys(24, 256), ObjectKeys(16, 2, 12, 4))
        self.assertEqual(object_keys(56, 1024), ObjectKeys(32, 2, 28, 4))
        self.assertEqual(object_keys(48, 128), ObjectKeys(32, 2, 24, 8))
        self.assertIsNone(object_keys(40, 8))  # no divisor of 8 from 21 to 39
        self.assertIsNone(object_keys(64, 32))  # half the rows: the same run twice
        self.assertIsNone(object_keys(3, 4))  # an odd count of rows
        for T in (3, 5, 6, 7):
            with self.subTest(T=T):
                fa = fa_ffn_spec("SWIGLU", "q4_0", *LLAMA, n_q=T).fa
                rows = fa.kc // fa.k_row_words
                self.assertEqual(rows, 8 * T)
                keys = fa.k_keys
                self.assertEqual((keys.parts, keys.part_rows), (2, rows // 2))
                self.assertEqual(fa.k_objects * keys.keys, fa.chunk)
                # Every key of a chunk read, and nothing past it.
                for c in range(fa.nc):
                    idx = fa.k_tap(0, 0, c).indices()
                    stride = fa.k.nb[1] // 4
                    first = c * fa.chunk
                    keys_read = {i // stride for i in idx}
                    self.assertEqual(keys_read, set(range(first, first + fa.chunk)))

    def test_a_few_tokens_at_once(self):
        """Four tokens of one cache (llama.cpp's unified KV cache, four sequences): the
        attention reads each KV head's K and V rows once for the four, each token's q rows
        and mask row go to the cores, a's rows of every token are written once, and the
        block's phases take the four rows at once."""
        for ty, arch in (("q4_0", "aie2p"), ("q4_K", "aie2")):
            with self.subTest(ty=ty, arch=arch):
                spec = fa_ffn_spec("SWIGLU", ty, *LLAMA, n_q=4, arch=arch)
                fa = spec.fa
                self.assertEqual(fa.tokens, 4)
                self.assertEqual([p.plan.nx for p in spec.phases], [4, 4, 4])
                q, k, v, mask = spec.request.inputs[:4]
                written = []
                for col in range(fa.columns):
                    for kvh in fa.column_heads(col):
                        idx = fa.q_tap(kvh).indices()
                        rows = [
                            t * q.nb[1] // 4 + (kvh * fa.gq + j) * q.nb[2] // 4 + i
                            for t in range(4)
                            for j in range(fa.gq)
                            for i in range(fa.d)
                        ]
                        self.assertEqual(idx, rows * (len(idx) // len(rows)))
                        for c in range(fa.nc):
                            keys = range(c * fa.chunk // 2, (c + 1) * fa.chunk // 2)
                            row = [t * mask.nb[1] // 4 + w for t in range(4) for w in keys]
                            idx = fa.mask_tap(0, c).indices()
                            self.assertEqual(idx, row * (len(idx) // len(row)))
                            self.assertEqual(len(idx), fa.mask_side.objects * fa.kc)
                        written += fa.a_tap(kvh).indices()
                self.assertEqual(sorted(written), list(range(4 * fa.n_head * fa.dv)))
                self.assertLessEqual(ffn_core_bytes(spec.up.plan) + fa.core_bytes,
                                     spec.arch.l1_budget)  # fmt: skip

    def test_a_cache_per_sequence(self):
        """Four sequences of one token, each with a cache of its own (llama.cpp's KV cache per
        sequence): a round carries every token's q rows once, then each stream's chunks (its
        tokens' mask rows, its own K and V rows); a's rows of every token are written once and
        the block's phases take the four rows at once. Two sequences of two tokens each on
        aie2. A K and V of one cache under several streams of q rows are refused."""
        for n_q, n_seq, arch in ((1, 4, "aie2p"), (2, 2, "aie2")):
            with self.subTest(n_q=n_q, n_seq=n_seq, arch=arch):
                spec = fa_ffn_spec("SWIGLU", "q4_0", *LLAMA, n_q=n_q, n_seq=n_seq, arch=arch)
                fa = spec.fa
                T = n_q * n_seq
                self.assertEqual((fa.streams, fa.stream_tokens, fa.tokens), (n_seq, n_q, T))
                self.assertEqual([p.plan.nx for p in spec.phases], [T] * 3)
                self.assertEqual(fa.steps, n_seq * fa.nc)
                rounds = len(fa.column_heads(0))
                self.assertEqual(fa.tasks["x"], (1 + 3 * fa.steps) * rounds)
                q, k, v, mask = spec.request.inputs[:4]
                # Token t of stream s at s nb3 + t nb1 (one token a stream: a dense q).
                token = [s * q.nb[3] + t * q.nb[1] for s in range(n_seq) for t in range(n_q)]
                written = []
                for col in range(fa.columns):
                    for kvh in fa.column_heads(col):
                        idx = fa.q_tap(kvh).indices()
                        rows = [
                            token[t] // 4 + (kvh * fa.gq + j) * q.nb[2] // 4 + i
                            for t in range(T)
                            for j in range(fa.gq)
                            for i in range(fa.d)
                        ]
                        self.assertEqual(idx, rows * (len(idx) // len(rows)))
                        for st in range(n_seq):
                            for c in range(fa.nc):
                                keys = range(c * fa.chunk, (c + 1) * fa.chunk)
                                words = [
                                    (st * mask.nb[3] + t * mask.nb[1]) // 4 + w // 2
                                    for t in range(n_q)
                                    for w in keys[::2]
                                ]
                                idx = fa.mask_tap(st, c).indices()
                                self.assertEqual(idx, words * (len(idx) // len(words)))
                                for t, tap, w in ((k, fa.k_tap(kvh, st, c), fa.k_row_words),
                                                  (v, fa.v_tap(kvh, st, c), fa.v_row_words)):  # fmt: skip
                                    base = st * t.nb[3] + kvh * t.nb[2]
                                    want = [
                                        (base + j * t.nb[1]) // 4 + i
                                        for j in keys
                                        for i in range(w)
                                    ]
                                    self.assertEqual(tap.indices(), want)
                        written += fa.a_tap(kvh).indices()
                self.assertEqual(sorted(written), list(range(T * fa.n_head * fa.dv)))
                self.assertLessEqual(ffn_core_bytes(spec.up.plan) + fa.core_bytes,
                                     spec.arch.l1_budget)  # fmt: skip
        # One cache (K and V of one stream) under four streams of q rows.
        one = cache_view("f16", 64, 256, 8, 288)
        with self.assertRaises(UnsupportedError) as e:
            fa_ffn_spec("SWIGLU", "q4_0", *LLAMA, n_seq=4, k=one, v=one)
        self.assertIn("one stream of q rows per KV cache", str(e.exception))

    def test_a_chunks_objects_within_a_tasks_repeat_count(self):
        """3 tokens' K objects (6 rows, 4 keys read as two runs) repeat their runs by the
        tap's outermost dimension, at most MAX_REPEAT times: 3 tokens of a 4096-row cache told
        n_kv at dispatch take 8 chunks, not 2."""
        text = fa_ffn_request("SWIGLU", "q4_0", *TINY[:5], 4096, arch="aie2p", n_q=3)
        fa = prepare(parse_request(json.dumps({**json.loads(text), "n_kv_step": 256}))).fa
        self.assertEqual(fa.k_keys.parts, 2)
        self.assertLessEqual(fa.k_tap(0, 0, 0).sizes[0], MAX_REPEAT)
        self.assertEqual(fa.nc, 8)

    def test_the_limits_count_every_phase(self):
        for dims, ty, arch in ((LLAMA, "f16", "aie2p"), (LLAMA, "q4_0", "aie2"), (TINY, "f32", "aie2")):  # fmt: skip
            with self.subTest(ty=ty, arch=arch, dims=dims):
                spec = fa_ffn_spec("SWIGLU", ty, *dims, arch=arch)
                fa, a = spec.fa, spec.arch
                self.assertLessEqual(ffn_core_bytes(spec.up.plan) + fa.core_bytes, a.l1_budget)
                # The scores of all n_kv keys in one chunk: the bulk of the phase's memory.
                self.assertEqual((fa.nc, fa.chunk), (1, fa.n_kv))
                self.assertGreaterEqual(fa.core_bytes, 4 * fa.gh * fa.n_kv)
                tasks = program_tasks([p.plan for p in spec.phases], 1)
                for k, n in fa.tasks.items():
                    self.assertLessEqual(tasks[k] + n, MAX_TASKS_PER_CHANNEL)
                # A round's tasks of one column: q, mask, K, V and a's drain.
                self.assertLessEqual(5, SHIM_GROUP_TASKS)
                self.assertEqual(fa.tasks, {"W": 0, "x": 4 * len(fa.column_heads(0)),
                                            "y": len(fa.column_heads(0))})  # fmt: skip
                self.assertEqual(fa.round_groups, [range(1)])

    def test_core_defines_and_sequence(self):
        spec = fa_ffn_spec("GEGLU_QUICK", "q4_0", *LLAMA, arch="aie2", softcap=30.0)
        core = spec.core
        self.assertEqual((core.source, core.object_name), ("mvq.cc", "mvq.o"))
        d = core.defines
        block = block_spec("GEGLU_QUICK", "q4_0", LLAMA, "aie2").core.defines
        self.assertEqual({k: v for k, v in d.items() if not k.startswith(("FA_", "MV_FA"))}, block)
        self.assertEqual(d["MV_FA"], 1)
        self.assertEqual((d["FA_D"], d["FA_DV"], d["FA_CHUNK"], d["FA_NC"]), (64, 64, 256, 1))
        self.assertEqual(d["FA_GQ"], 4)
        self.assertEqual((d["FA_K_TYPE"], d["FA_V_TYPE"]), (1, 1))
        # ggml-cpu's softcap: s = softcap tanh(q.k scale / softcap): the scale divided.
        self.assertEqual(d["FA_SCALE"], f32_bits(0.125 / 30.0) & 0xFFFFFFFF)
        self.assertEqual(d["FA_SOFTCAP"], f32_bits(30.0))
        # q, k, v and the mask as 32-bit words (f32, the x fifo's type), then the block's
        # operands with a among the outputs.
        seq = spec.sequence
        self.assertEqual(len(seq), 14)
        self.assertEqual(seq[Q], ("f32", 64 * 32))
        self.assertEqual(seq[M], ("f32", 256 * 64 // 2))
        self.assertEqual(seq[A], ("f32", 64 * 32))
        self.assertEqual([t for t, _ in seq[R0:]], ["f32"] + ["i8"] * 3 + ["f32"] * 5)

    def test_refusals(self):
        op = "FLASH_ATTN_FFN_SWIGLU"
        refused = [
            ({"max_bias": 8.0}, "ALiBi"),
            ({"n_q": 9}, "up to 8 query rows"),
            ({"mask": tensor("f16", [256, 64, 32])}, "per-head mask"),
            # 1008 x 512 keys: 63 KiB of one head's scores in each of 32 chunks.
            ({"n_kv": 1008 * 512}, "context too long"),
            ({"q": tensor("f16", [64, 1, 32])}, "the attention phase"),
        ]
        for kw, why in refused:
            with self.subTest(why=why):
                args = dict(zip(("K", "n_head", "n_head_kv", "d", "F", "n_kv"), LLAMA))
                n_kv = kw.pop("n_kv", args.pop("n_kv"))
                with self.assertRaises(UnsupportedError) as e:
                    fa_ffn_spec("SWIGLU", "q4_0", *args.values(), n_kv, **kw)
                self.assertIn(op, str(e.exception))
                self.assertIn(why, str(e.exception))
        # Three q heads per KV head: R = 1 only, its core holding three heads' scores over a
        # chunk of the 4096 keys (four heads over four cores, one each, in one chunk).
        fa = fa_ffn_spec("SWIGLU", "q4_0", 768, 12, 4, 64, 1536, 4096).fa
        self.assertEqual(fa.gh, 3)
        self.assertGreater(fa.nc, 1)
        fa = fa_ffn_spec("SWIGLU", "q4_0", 1024, 16, 4, 64, 2048, 4096).fa
        self.assertEqual((fa.gh, fa.nc), (1, 1))
        # The block's refusals: dense N is not one token; F with no common chunk with K.
        with self.assertRaises(UnsupportedError) as e:
            fa_ffn_spec("SWIGLU", "q4_0", 256, 4, 2, 64, 200, 256)
        self.assertIn(op, str(e.exception))
        # The request: four outputs, four op_params.
        d = json.loads(fa_ffn_request("SWIGLU", "f32", *TINY))
        del d["extra_outputs"][2]
        with self.assertRaises(RequestError):
            prepare(parse_request(json.dumps(d)))
        with self.assertRaises(UnsupportedError):
            fa_ffn_spec("SWIGLU", "f32", *TINY, op_params=[0x3E000000, 0, 0, 0x3727C5AC, 1])
        # What is declared plans: every GLU, K/V of each type, a dense (contiguous) K and V.
        for glu in ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK"):
            self.assertIsNotNone(fa_ffn_spec(glu, "f32", *TINY))
        for kv in ("f32", "bf16"):
            self.assertIsNotNone(fa_ffn_spec("SWIGLU", "q8_0", *TINY, kv=kv))
        dense = tensor("f16", [64, 256, 2])
        self.assertIsNotNone(fa_ffn_spec("SWIGLU", "f16", *TINY, k=dense, v=dense))


class FaGluPlanTest(unittest.TestCase):
    """FLASH_ATTN_GLU_<glu>: FLASH_ATTN_FFN_<glu> without the down phase."""

    def test_the_attention_and_the_blocks_first_two_phases(self):
        spec = fa_ffn_spec("SWIGLU", "q4_K", *LLAMA, arch="aie2p", glu_only=True)
        self.assertIsNone(spec.down)
        self.assertEqual(len(spec.phases), 2)
        self.assertEqual(len(spec.tasks()), 2)
        self.assertEqual(spec.attn.dst.ne[:2], (2048, 1))
        self.assertEqual(spec.up.dst.ne[:2], (8192, 1))
        # q, k, v, the mask, W_o, r0, W_g, W_u, n, then h, a and r1.
        seq = spec.sequence
        self.assertEqual(len(seq), 12)
        self.assertEqual(seq[9], ("f32", 8192))
        self.assertEqual(seq[10], ("f32", 64 * 32))
        self.assertEqual(seq[11], ("f32", 2048))
        self.assertEqual([t for t, _ in seq[4:9]], ["i8", "f32", "i8", "i8", "f32"])
        # The weights of W_o, W_g and W_u of one type; W_d is not the kernel's.
        with self.assertRaises(UnsupportedError) as e:
            d = json.loads(fa_ffn_request("SWIGLU", "q4_K", *LLAMA, glu_only=True))
            d["inputs"][4] = json.loads(fa_ffn_request("SWIGLU", "q6_K", *LLAMA))["inputs"][4]
            prepare(parse_request(json.dumps(d)))
        self.assertIn("FLASH_ATTN_GLU_SWIGLU", str(e.exception))
        # Three outputs.
        d = json.loads(fa_ffn_request("SWIGLU", "f32", *TINY, glu_only=True))
        del d["extra_outputs"][1]
        with self.assertRaises(RequestError):
            prepare(parse_request(json.dumps(d)))
        for glu in ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK"):
            self.assertIsNotNone(fa_ffn_spec(glu, "f32", *TINY, glu_only=True))


class FaFfnRecordTest(unittest.TestCase):
    def test_a_is_complete_before_phase_0_reads_it(self):
        from ggml_hsa_iron.emu.compile import record

        for dims, ty, arch in ((LLAMA, "q4_0", "aie2"), (TINY, "f32", "aie2p")):
            with self.subTest(dims=dims, ty=ty, arch=arch):
                spec = fa_ffn_spec("SWIGLU", ty, *dims, arch=arch)
                prog = record(spec).to_json("fa_ffn", arch)
                seq = prog["sequence"]
                self.assertEqual(len(prog["args"]), 14)
                first = next(i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == A)
                drains = {op["task"] for op in seq if op["op"] == "drain" and op["arg"] == A}
                awaited = {t for op in seq[:first] if op["op"] == "await" for t in op["tasks"]}
                self.assertTrue(drains)
                self.assertLessEqual(drains, awaited)
                # The attention phase reads q, k, v and the mask and writes a only, while W_o's
                # first tiles go out (designs/ffn.py's _ahead); nothing after it touches q, k,
                # v or the mask.
                self.assertEqual(
                    {op["arg"] for op in seq[:first] if "arg" in op}, {Q, K, V, M, A, WO}
                )
                later = {op["arg"] for op in seq[first:] if "arg" in op}
                self.assertEqual(later & {Q, K, V, M}, set())
                w_o = next(i for i, op in enumerate(seq) if op.get("arg") == WO)
                self.assertLess(
                    w_o, max(i for i, op in enumerate(seq) if op["op"] == "await" and i < first)
                )

    def test_each_task_group_of_chunks_awaits_its_last_task(self):
        """A long context's round in several task groups: each ends with an await of its last
        task (a's drain, or the group's last fill), so that no group's buffer descriptors are
        reused while the channel still moves them."""
        from ggml_hsa_iron.emu.compile import record

        spec = fa_ffn_spec("SWIGLU", "f32", *TINY[:5], 16384, arch="aie2p")
        fa = spec.fa
        self.assertGreater(len(fa.round_groups), 1)
        seq = record(spec).to_json("fa_ffn", "aie2p")["sequence"]
        first = next(i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == A)
        awaits = [i for i, op in enumerate(seq[:first]) if op["op"] == "await"]
        self.assertEqual(len(awaits), len(fa.column_heads(0)) * len(fa.round_groups))
        start = 0
        for i in awaits:
            issued = [op for op in seq[start:i] if op["op"] in ("fill", "drain")]
            issued = [op for op in issued if op["arg"] != WO]  # phase 0's, issued ahead
            # One awaited task per column: the last the group issued on its fifo.
            last_on_fifo = {op["fifo"]: op["task"] for op in issued}
            awaited = seq[i]["tasks"]
            columns = {op["fifo"] for op in issued if op["op"] == "fill"}
            self.assertEqual(len(awaited), len(columns))
            self.assertLessEqual(set(awaited), set(last_on_fifo.values()))
            start = i + 1

    @unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
    def test_the_awaits_of_a_are_needed(self):
        from ggml_hsa_iron.tests.util_emu import build_spec
        from ggml_hsa_iron.tests.util_emu_seq import run_program_in_order

        case = FaFfnCase("SWIGLU", "f32", *TINY, "aie2p", seed=40)
        prog, lib = build_spec(case.spec)
        run_program_in_order(prog, lib, case.args())  # as designed: fine
        seq = prog["sequence"]
        first = next(i for i, op in enumerate(seq) if op["op"] == "fill" and op["arg"] == A)
        broken = dict(prog, sequence=[op for op in seq[:first] if op["op"] != "await"])
        broken["sequence"] += seq[first:]
        with self.assertRaisesRegex(RuntimeError, "not awaited yet"):
            run_program_in_order(broken, lib, case.args())


@unittest.skipUnless(CXX and HAVE_NUMPY, "no host C++ compiler or numpy")
class FaFfnEmulationTest(unittest.TestCase):
    """The design compiled for `--target emu`, its program run in order on real data."""

    def check(self, glu, ty, dims, arch, kv="f16", seed=0, softcap=0.0, block=True, **kw):
        case = FaFfnCase(glu, ty, *dims, arch, kv=kv, seed=seed, softcap=softcap, **kw)
        a, r1, h, out = case.run()
        case.check(self, a, r1, h, out)
        if not block:
            return
        # MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s own program (its own plan, on this shape) on the
        # a the design wrote: r1, h and out bit for bit.
        # Where the attention needs another shape than the block's (the tiny llama's 2 q heads
        # per KV head: R = 2), the block's program on the attention's shape.
        own = prepare(parse_request(case.block_request()))
        own = dataclasses.replace(own, attn=case.spec.attn, up=case.spec.up, down=case.spec.down)
        what = f"{glu} {ty} {dims} {arch}"
        for got, want, name in zip((r1, h, out), case.run_block(own, a), ("r1", "h", "out")):
            assert_same_bits(self, got, want, f"{name} of {what}")

    def test_tiny_llama(self):
        for i, arch in enumerate(("aie2p", "aie2")):
            with self.subTest(arch=arch):
                self.check("SWIGLU", "f32", TINY, arch, seed=i)

    def test_llama_3_2_1b(self):
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=10)
        self.check("GEGLU", "q8_0", LLAMA, "aie2", seed=11)

    def test_a_long_context_in_chunks(self):
        """The tiny llama over 16384 keys: the online softmax over chunks of keys, the first
        chunk wholly masked in the second case (the maximum stays -inf through it)."""
        dims = TINY[:5] + (16384,)
        fa = fa_ffn_spec("SWIGLU", "f32", *dims, arch="aie2p").fa
        self.assertGreater(fa.nc, 1)
        self.check("SWIGLU", "f32", dims, "aie2p", seed=30, block=False)
        self.check("SWIGLU", "f32", dims, "aie2", seed=31, block=False, masked_first=fa.chunk)

    def test_a_few_tokens_at_once(self):
        """Several query rows (a unified cache's sequences), each with its own mask row: the
        1B shape over 4 tokens, the tiny llama over 2 tokens and a long context in chunks."""
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=40, n_q=4)
        dims = TINY[:5] + (16384,)
        self.assertGreater(fa_ffn_spec("GEGLU", "q8_0", *dims, n_q=2, arch="aie2").fa.nc, 1)
        self.check("GEGLU", "q8_0", dims, "aie2", seed=41, n_q=2)

    def test_tokens_whose_objects_hold_no_whole_chunk(self):
        """3, 5, 6 and 7 tokens' x objects (24, 40, 48, 56 K rows at the 1B shape) against
        chunks of powers of two: each object carries 16 or 32 keys, read as two overlapping
        runs of rows within the chunk. The 1B shape over 3 tokens, and 6 tokens of a 4096-row
        cache told n_kv at dispatch on aie2, run at 768 keys."""
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=60, n_q=3)
        self.check("GEGLU", "q8_0", TINY[:5] + (4096,), "aie2", seed=61, n_q=6, at=768)

    def test_a_few_tokens_with_n_kv_at_dispatch(self):
        """Four tokens of a 4096-row cache told n_kv at dispatch (one program for every
        multiple of 256), run at 768 keys: the mask rows n_kv values apart."""
        self.check("SWIGLU", "q4_0", TINY[:5] + (4096,), "aie2p", seed=50, n_q=4, at=768)

    def test_a_cache_per_sequence(self):
        """Sequences with a KV cache each (llama.cpp's cache per sequence): each stream's
        tokens attend to their own cache under their own mask (keys masked for one sequence
        only, NaN in its cache alone). The 1B shape over 4 sequences of one token; the tiny
        llama over 2 sequences of 2 tokens on aie2; 3 sequences of 4096-row caches told n_kv
        at dispatch, run at 768 keys."""
        self.check("SWIGLU", "q4_0", LLAMA, "aie2p", seed=80, n_seq=4)
        self.check("GEGLU", "q8_0", TINY, "aie2", seed=81, n_q=2, n_seq=2)
        self.check("SWIGLU", "q4_0", TINY[:5] + (4096,), "aie2p", seed=82, n_seq=3, at=768)

    def check_glu(self, glu, ty, dims, arch, seed, **kw):
        """FLASH_ATTN_GLU_<glu> against numpy; where it takes FLASH_ATTN_FFN_<glu>'s shape
        and chunks, its a, r1 and h bit for bit that program's on the same operands."""
        case = FaFfnCase(glu, ty, *dims, arch, seed=seed, glu_only=True, **kw)
        a, r1, h, out = case.run()
        self.assertIsNone(out)
        case.check(self, a, r1, h, out)
        ffn = FaFfnCase(glu, ty, *dims, arch, seed=seed, **kw)
        same = (
            shape(ffn.spec.up.plan) == shape(case.spec.up.plan)
            and ffn.spec.fa.nc == case.spec.fa.nc
        )
        if same:
            what = f"{glu} {ty} {dims} {arch}"
            for got, want, name in zip((a, r1, h), ffn.run()[:3], ("a", "r1", "h")):
                assert_same_bits(self, got, want, f"{name} of FLASH_ATTN_GLU {what}")
        return same

    def test_without_the_down_phase(self):
        """FLASH_ATTN_GLU_<glu> (Q4_K_M's layers whose ffn_down is q6_K; the weights' type is
        the GEMV's own business): the 1B shape on aie2p, the tiny llama over 2 tokens on aie2,
        and 3 tokens of a 4096-row cache told n_kv at dispatch."""
        self.assertTrue(self.check_glu("SWIGLU", "q4_0", LLAMA, "aie2p", seed=70))
        self.check_glu("GEGLU", "q8_0", TINY, "aie2", seed=71, n_q=2)
        self.check_glu("SWIGLU", "q4_0", TINY[:5] + (4096,), "aie2p", seed=72, n_q=3, at=768)

    def test_caches_softcap_and_groups(self):
        self.check("REGLU", "q4_0", TINY, "aie2", kv="bf16", seed=20)
        self.check("GEGLU_QUICK", "f32", TINY, "aie2p", kv="f32", seed=21, softcap=20.0)
        # Three q heads per KV head on one core per column.
        self.check("SWIGLU", "q4_0", (768, 12, 4, 64, 1536, 256), "aie2p", seed=22)


if __name__ == "__main__":
    unittest.main()
