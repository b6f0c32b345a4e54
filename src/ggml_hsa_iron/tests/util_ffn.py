"""RMS_NORM_FFN_<glu>'s and MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s test scaffolding: their requests,
Llama-sized random operands made with numpy, the design run in order (util_emu_seq.py) with r
and out in x's memory or apart (r1 and out in r0's), the kernels it replaces
(RMS_NORM_MUL_MAT_<glu>, then MUL_MAT_ADD; MUL_MAT_ADD ahead of them) run in sequence, and the
numpy references (test_rms_norm_ffn.py, test_mul_mat_add_rms_norm_ffn.py). Everything past the
requests needs numpy and ml_dtypes."""

import json
import struct

from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tests.util import request_json, tensor

EPS = 1e-5
EPS_BITS = struct.unpack("<I", struct.pack("<f", EPS))[0]
GLU_OPS = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")


def ffn_request(glu, wtype, N, K, F, arch="aie2p", r=None, wd_type=None, **kw):
    """RMS_NORM_FFN_<glu> of W_g, W_u [K, F], W_d [F, K] (of `wd_type`, default `wtype`), x
    [K, N], n [K] and r (default [K, N]); out [K, N], h [F, N]. `kw`: request_json's (and
    per-operand overrides: x, n, out, h as Tensors)."""
    wg, wd = tensor(wtype, [K, F]), tensor(wd_type or wtype, [F, K])
    x = kw.pop("x", None) or tensor("f32", [K, N])
    n = kw.pop("n", None) or tensor("f32", [K])
    out = kw.pop("out", None) or tensor("f32", [K, N])
    h = kw.pop("h", None) or tensor("f32", [F, N])
    r = r or tensor("f32", [K, N])
    kw.setdefault("op_params", [EPS_BITS])
    kw.setdefault("extra_outputs", [h])
    return request_json(f"RMS_NORM_FFN_{glu}", [wg, wg, wd, x, n, r], out, arch, **kw)


def ffn_spec(*args, **kw):
    return prepare(parse_request(ffn_request(*args, **kw)))


def attn_ffn_request(glu, wtype, N, Ka, K, F, arch="aie2p", r0=None, wo_type=None, **kw):
    """MUL_MAT_ADD_RMS_NORM_FFN_<glu> of W_o [Ka, K] (of `wo_type`, default `wtype`), a [Ka, N],
    r0 (default [K, N]), W_g, W_u [K, F], W_d [F, K] (of `wd_type`, default `wtype`) and n [K];
    out [K, N], r1 [K, N], h [F, N]. `kw`: request_json's (and per-operand overrides: a, n,
    out, r1, h as Tensors)."""
    wo = tensor(wo_type or wtype, [Ka, K])
    wg, wd = tensor(wtype, [K, F]), tensor(kw.pop("wd_type", None) or wtype, [F, K])
    a = kw.pop("a", None) or tensor("f32", [Ka, N])
    n = kw.pop("n", None) or tensor("f32", [K])
    out = kw.pop("out", None) or tensor("f32", [K, N])
    r1 = kw.pop("r1", None) or tensor("f32", [K, N])
    h = kw.pop("h", None) or tensor("f32", [F, N])
    r0 = r0 or tensor("f32", [K, N])
    kw.setdefault("op_params", [EPS_BITS])
    kw.setdefault("extra_outputs", [r1, h])
    op = f"MUL_MAT_ADD_RMS_NORM_FFN_{glu}"
    return request_json(op, [wo, a, r0, wg, wg, wd, n], out, arch, **kw)


def attn_ffn_spec(*args, **kw):
    return prepare(parse_request(attn_ffn_request(*args, **kw)))


try:
    import numpy as np

    from ggml_hsa_iron.tests.test_mul_mat_glu import _bf16, _check_glu
    from ggml_hsa_iron.tests.util_emu_seq import (
        arg_bytes,
        buffer_of,
        new_buffer,
        run_spec_in_order,
    )
    from ggml_hsa_iron.tests.util_norm import norm_inputs, norm_reference
except ImportError:  # numpy and ml_dtypes are installed by scripts/check-iron.sh
    np = None


def fast_weights(ty, rows, K, nrng):
    """(bytes as ggml stores them, the values the kernels multiply as float64 [rows, K]) of
    random f32, q4_0 or q8_0 weights, made with numpy (Llama-sized matrices in a second; the
    block types' values are the decoded ones rounded to bf16, as the decoding GEMV rounds them).
    q4_0: the f16 scale d, then 16 bytes whose low nibbles are values 0..15 and high nibbles
    16..31, each d * (q - 8); q8_0: d, then 32 int8 q, each d * q (ggml's layouts)."""
    if ty == "f32":
        w = nrng.uniform(-0.2, 0.2, (rows, K)).astype(np.float32)
        return w.tobytes(), w.astype(np.float64)
    blocks = rows * K // 32
    d = nrng.uniform(-0.1, 0.1, blocks).astype(np.float16)
    if ty == "q4_0":
        q = nrng.integers(0, 16, (blocks, 32), dtype=np.uint8)
        body = q[:, :16] | (q[:, 16:] << 4)
        vals = d.astype(np.float32)[:, None] * (q.astype(np.float32) - 8)
    elif ty == "q8_0":
        q = nrng.integers(-128, 128, (blocks, 32), dtype=np.int8)
        body = q.view(np.uint8)
        vals = d.astype(np.float32)[:, None] * q.astype(np.float32)
    else:
        raise ValueError(f"no fast generator of {ty} weights")
    raw = np.concatenate([d.view(np.uint8).reshape(blocks, 2), body], axis=1)
    return raw.tobytes(), _bf16(vals).reshape(rows, K)


# Where r and out are (FfnCase.layout): r and out apart; r and out in x's memory (llama's
# residual ADD in place, its residual being the block's input); out in x's memory, r apart; r
# one row [K] repeated over the tokens (a bias), out apart.
LAYOUTS = ("apart", "in_place", "out_over_x", "bias")


class FfnCase:
    """One request's random operands: weights (fast_weights), x and n (util_norm's: rows of
    unequal magnitude), and r and out as `layout` says (LAYOUTS)."""

    def __init__(self, glu, ty, N, K, F, arch, layout="apart", seed=0):
        assert layout in LAYOUTS, layout
        self.glu, self.ty, self.N, self.K, self.F, self.arch = glu, ty, N, K, F, arch
        self.layout = layout
        nrng = np.random.default_rng(seed)
        self.wg_bytes, self.wg = fast_weights(ty, F, K, nrng)
        self.wu_bytes, self.wu = fast_weights(ty, F, K, nrng)
        self.wd_bytes, self.wd = fast_weights(ty, K, F, nrng)
        self.x, self.n = norm_inputs(nrng, N, K)
        rows = 1 if layout == "bias" else N
        self.r = nrng.uniform(-4, 4, (rows, K)).astype(np.float32)
        if layout == "in_place":
            self.r = self.x
        r = tensor("f32", [K, rows]) if layout == "bias" else None
        self.spec = ffn_spec(glu, ty, N, K, F, arch, r=r)

    def args(self):
        """Fresh memories for a dispatch, in the sequence's order (W_g, W_u, W_d, x, n, r, out,
        h): x, r and out one array in place, x and out one array with out over x."""
        sizes = arg_bytes(self.spec)
        x = buffer_of(self.x)
        r = x if self.layout == "in_place" else buffer_of(self.r)
        out = x if self.layout in ("in_place", "out_over_x") else new_buffer(sizes[6])
        ws = [buffer_of(b) for b in (self.wg_bytes, self.wu_bytes, self.wd_bytes)]
        return [*ws, x, buffer_of(self.n), r, out, new_buffer(sizes[7])]

    def run(self):
        """(h [N, F], out [N, K]) as f32 arrays from the emulated RMS_NORM_FFN_<glu>."""
        args = self.args()
        run_spec_in_order(self.spec, args)
        return self._results(args[7], args[6])

    def run_two_kernels(self, up=None, down=None):
        """(h, out) from RMS_NORM_MUL_MAT_<glu>'s design (spec `up`, default the FFN's phase
        1 on its shape) and then MUL_MAT_ADD's (`down`, default phase 2) on the h it wrote,
        with the same memories (in place as the FFN runs)."""
        wg, wu, wd, x, n, r, out, h = self.args()
        run_spec_in_order(up or self.spec.up, [wg, wu, x, n, h])
        run_spec_in_order(down or self.spec.down, [wd, h, r, out])
        return self._results(h, out)

    def _results(self, h, out):
        h = np.frombuffer(h.tobytes(), np.float32).reshape(self.N, self.F)
        return h, np.frombuffer(out.tobytes(), np.float32).reshape(self.N, self.K)

    def check(self, test, h, out):
        """h against numpy (RMS_NORM_MUL_MAT_<glu>'s reference and tolerance) and out against
        W_d . h + r computed from the h the design wrote (rounded to bf16 for the decoding
        GEMV of block weights), within f32 summation error."""
        what = f"{self.glu} {self.ty} N={self.N} K={self.K} F={self.F} {self.arch}"
        check_h(test, self.glu, self.ty, self.x, self.n, self.wg, self.wu, h, f"h of {what}")
        check_add(test, self.ty, h, self.wd, self.r, out, f"out of {what}")


def check_h(test, glu, ty, x, n, wg, wu, h, what):
    """h [N, F] against numpy: RMS_NORM_MUL_MAT_<glu>'s reference and tolerance of x [N, K]."""
    g, g_err = norm_reference(ty, x, n, wg)
    u, u_err = norm_reference(ty, x, n, wu)
    _check_glu(test, glu, h.astype(np.float64), g, u, g_err, u_err, what)


def check_add(test, ty, x, w, r, got, what):
    """got [N, rows] against W . x + r (MUL_MAT_ADD) computed from x [N, cols] (rounded to bf16
    for the decoding GEMV of block weights) and the weights' values w [rows, cols], within f32
    summation error."""
    xv = x.astype(np.float64) if ty == "f32" else _bf16(x)
    prods = np.abs(xv) @ np.abs(w).T
    want = xv @ w.T + r.astype(np.float64)
    tol = prods * 2.0**-20 + np.abs(want) * 2.0**-22 + 1e-30
    bad = ~(np.abs(got.astype(np.float64) - want) <= tol)  # NaN fails too
    if bad.any():
        test.fail(
            f"{what}: {int(bad.sum())} of {got.size} wrong, first at "
            f"{np.argwhere(bad)[0]}: {got[bad][0]} vs {want[bad][0]}"
        )


# Where r0, r1 and out are (AttnFfnCase.layout): apart; r1 in r0's memory and out in it too
# (llama's two residual ADDs in place, each over its residual); r0 one row [K] repeated over
# the tokens (a bias), r1 and out apart.
ATTN_LAYOUTS = ("apart", "in_place", "bias")


class AttnFfnCase:
    """One MUL_MAT_ADD_RMS_NORM_FFN_<glu> request's random operands: weights (fast_weights), a
    and n (util_norm's: rows of unequal magnitude), r0 (and r1 and out) as `layout` says
    (ATTN_LAYOUTS)."""

    def __init__(self, glu, ty, N, Ka, K, F, arch, layout="apart", seed=0):
        assert layout in ATTN_LAYOUTS, layout
        self.glu, self.ty, self.N, self.Ka, self.K, self.F = glu, ty, N, Ka, K, F
        self.arch, self.layout = arch, layout
        nrng = np.random.default_rng(seed)
        self.wo_bytes, self.wo = fast_weights(ty, K, Ka, nrng)
        self.wg_bytes, self.wg = fast_weights(ty, F, K, nrng)
        self.wu_bytes, self.wu = fast_weights(ty, F, K, nrng)
        self.wd_bytes, self.wd = fast_weights(ty, K, F, nrng)
        self.a, _ = norm_inputs(nrng, N, Ka)
        _, self.n = norm_inputs(nrng, N, K)
        rows = 1 if layout == "bias" else N
        self.r0 = nrng.uniform(-4, 4, (rows, K)).astype(np.float32)
        r0 = tensor("f32", [K, rows]) if layout == "bias" else None
        self.spec = attn_ffn_spec(glu, ty, N, Ka, K, F, arch, r0=r0)

    def args(self):
        """Fresh memories for a dispatch, in the sequence's order (W_o, a, r0, W_g, W_u, W_d, n,
        out, r1, h): r0, r1 and out one array in place."""
        sizes = arg_bytes(self.spec)
        r0 = buffer_of(self.r0)
        r1 = r0 if self.layout == "in_place" else new_buffer(sizes[8])
        out = r0 if self.layout == "in_place" else new_buffer(sizes[7])
        wo, wg, wu, wd = (
            buffer_of(b) for b in (self.wo_bytes, self.wg_bytes, self.wu_bytes, self.wd_bytes)
        )
        a, n, h = buffer_of(self.a), buffer_of(self.n), new_buffer(sizes[9])
        return [wo, a, r0, wg, wu, wd, n, out, r1, h]

    def run(self):
        """(r1 [N, K], h [N, F], out [N, K]) as f32 arrays from the emulated design; in place,
        r1 is what the memory holds at the end (out)."""
        args = self.args()
        run_spec_in_order(self.spec, args)
        return self._results(args[8], args[9], args[7])

    def run_three_kernels(self, attn=None, up=None, down=None):
        """(r1, h, out) from MUL_MAT_ADD's design (spec `attn`, default the program's phase 0 on
        its shape), then RMS_NORM_MUL_MAT_<glu>'s (`up`, default phase 1) on the r1 it wrote
        and MUL_MAT_ADD's (`down`, default phase 2) on that h and r1, with the same memories
        (in place as the program runs)."""
        wo, a, r0, wg, wu, wd, n, out, r1, h = self.args()
        s = self.spec
        run_spec_in_order(attn or s.attn, [wo, a, r0, r1])
        run_spec_in_order(up or s.up, [wg, wu, r1, n, h])
        run_spec_in_order(down or s.down, [wd, h, r1, out])
        return self._results(r1, h, out)

    def _results(self, r1, h, out):
        def f32(buf, cols):
            return np.frombuffer(buf.tobytes(), np.float32).reshape(self.N, cols).copy()

        return f32(r1, self.K), f32(h, self.F), f32(out, self.K)

    def check(self, test, r1, h, out):
        """r1 against W_o . a + r0, h against RMS_NORM_MUL_MAT_<glu>'s reference of x = r1 (the
        r1 the design wrote: the phases' references chained on the design's results) and out
        against W_d . h + r1, each within its op's tolerance (check_add, check_h). In place the
        memory of r1 ends holding out: r1 is then phase 0's alone (`r1_alone`)."""
        what = f"{self.glu} {self.ty} N={self.N} Ka={self.Ka} K={self.K} F={self.F} {self.arch}"
        if self.layout == "in_place":
            # r1's memory holds out now: r1 recomputed by phase 0 alone (checked as well).
            r1 = self.r1_alone()
        check_add(test, self.ty, self.a, self.wo, self.r0, r1, f"r1 of {what}")
        check_h(test, self.glu, self.ty, r1, self.n, self.wg, self.wu, h, f"h of {what}")
        check_add(test, self.ty, h, self.wd, r1, out, f"out of {what}")

    def r1_alone(self):
        """r1 as the program's phase 0 computes it, from MUL_MAT_ADD's design alone, apart."""
        wo, a, r0 = self.args()[:3]
        r1 = new_buffer(arg_bytes(self.spec)[8])
        run_spec_in_order(self.spec.attn, [wo, a, r0, r1])
        return np.frombuffer(r1.tobytes(), np.float32).reshape(self.N, self.K).copy()


def assert_same_bits(test, got, want, what):
    """got and want (f32 arrays) equal bit for bit."""
    diff = got.view(np.uint32) != want.view(np.uint32)
    if diff.any():
        i = tuple(np.argwhere(diff)[0])
        test.fail(f"{what}: {int(diff.sum())} values differ, first at {i}: {got[i]} vs {want[i]}")


def fa_ffn_request(
    glu,
    wtype,
    K,
    n_head,
    n_head_kv,
    d,
    F,
    n_kv,
    kv="f16",
    arch="aie2p",
    n_q=1,
    scale=0.125,
    max_bias=0.0,
    softcap=0.0,
    glu_only=False,
    n_seq=1,
    **kw,
):
    """FLASH_ATTN_FFN_<glu> of a decode step: q [d, n_q, n_head], k and v views of an f16 (or
    `kv`) KV cache of llama.cpp's layout (the KV heads of a token in one cache row: row stride
    n_head_kv d), the mask [n_kv, padded n_q] (f16), W_o [d n_head, K], r0 [K, n_q], W_g, W_u
    [K, F], W_d [F, K] of `wtype`, n [K]; out [K, n_q], a [d, n_head, n_q], r1, h. `n_seq` > 1:
    a cache per sequence, as llama.cpp lays it out: q [d, n_q, n_head, n_seq] (the view of one
    Q [d, n_head, n_q n_seq]; dense for one row a sequence), k and v [d, n_kv, n_head_kv, n_seq] (each sequence's cache of
    n_kv + 32 rows after the other's), the mask [n_kv, n_q, 1, n_seq]; the block's rows, a's
    too, n_q n_seq. `glu_only`: FLASH_ATTN_GLU_<glu> (no W_d; h, then a and r1). `kw`:
    request_json's and per-operand overrides (q, k, v, mask, a as Tensors)."""
    from ggml_hsa_iron.request import Tensor
    from ggml_hsa_iron.tests.test_flash_attn import cache_view, f32_bits

    Ka, T = d * n_head, n_q * n_seq
    if n_seq == 1:
        q = tensor("f32", [d, n_q, n_head])
        mask = tensor("f16", [n_kv, -(-n_q // 64) * 64])
    elif n_q == 1:
        # One row a stream: the view is dense (the backend's request says so).
        q = tensor("f32", [d, 1, n_head, n_seq])
        mask = tensor("f16", [n_kv, 1, 1, n_seq])
    else:
        row = 4 * d * n_head
        q = Tensor("f32", (d, n_q, n_head, n_seq), (4, row, 4 * d, row * n_q))
        mask = tensor("f16", [n_kv, n_q, 1, n_seq])
    q, mask = kw.pop("q", None) or q, kw.pop("mask", None) or mask
    k = kw.pop("k", None) or cache_view(kv, d, n_kv, n_head_kv, n_kv + 32, n_seq)
    v = kw.pop("v", None) or cache_view(kv, d, n_kv, n_head_kv, n_kv + 32, n_seq)
    wo = tensor(wtype, [Ka, K])
    wg, wd = tensor(wtype, [K, F]), tensor(wtype, [F, K])
    r0, n = tensor("f32", [K, T]), tensor("f32", [K])
    out = tensor("f32", [K, T])
    a = kw.pop("a", None) or tensor("f32", [d, n_head, n_q, n_seq])
    extras = [a, tensor("f32", [K, T]), tensor("f32", [F, T])]
    kw.setdefault("extra_outputs", extras)
    kw.setdefault("op_params", [f32_bits(scale), f32_bits(max_bias), f32_bits(softcap), EPS_BITS])
    if glu_only:
        kw["extra_outputs"] = kw["extra_outputs"][:2]
        ins = [q, k, v, mask, wo, r0, wg, wg, n]
        return request_json(f"FLASH_ATTN_GLU_{glu}", ins, extras[2], arch, **kw)
    ins = [q, k, v, mask, wo, r0, wg, wg, wd, n]
    return request_json(f"FLASH_ATTN_FFN_{glu}", ins, out, arch, **kw)


def fa_ffn_spec(*args, **kw):
    return prepare(parse_request(fa_ffn_request(*args, **kw)))


class FaFfnCase:
    """One FLASH_ATTN_FFN_<glu> request's random operands (a decode step of n_q query rows):
    q, K and V (of `kv`) placed in llama.cpp's cache layout (the gaps NaN), a mask with every
    `masked`-th key and the first `masked_first` keys -inf and NaN in those keys' K and V rows
    (masked keys are never read; with several rows, each row after the first also masks every
    seventh key of its own, whose rows the others read), weights (fast_weights), n
    (util_norm's) and r0; W_o's Ka is d n_head. `at`: n_kv given at dispatch (steps of 256 up
    to n_kv, the request's `n_kv_step`), the case run at `at` keys: the mask then `at` values
    a row, dense (llama.cpp's for that n_kv), the cache's first `at` rows read. `glu_only`:
    FLASH_ATTN_GLU_<glu>'s request (no W_d, no out). `n_seq` > 1: a cache per sequence
    (fa_ffn_request's), sequence s > 0 masking every third key from key s % 3 too, those keys'
    K and V rows NaN in its cache only."""

    def __init__(self, glu, ty, K, n_head, n_head_kv, d, F, n_kv, arch, kv="f16", seed=0,
                 masked=5, softcap=0.0, masked_first=0, n_q=1, at=0, glu_only=False,
                 n_seq=1):  # fmt: skip
        from ggml_hsa_iron.tests.test_flash_attn import _np_type, place

        self.glu, self.ty, self.K, self.F, self.arch = glu, ty, K, F, arch
        self.Ka, self.n_q, self.at = d * n_head, n_q * n_seq, at
        self.glu_only = glu_only
        text = fa_ffn_request(
            glu,
            ty,
            K,
            n_head,
            n_head_kv,
            d,
            F,
            n_kv,
            n_q=n_q,
            kv=kv,
            arch=arch,
            softcap=softcap,
            glu_only=glu_only,
            n_seq=n_seq,
        )
        if at:
            text = json.dumps({**json.loads(text), "n_kv_step": 256})
        self.req = parse_request(text)
        self.spec = prepare(self.req)
        qt, kt, vt, mt = self.req.inputs[:4]
        nrng = np.random.default_rng(seed)
        self.q = nrng.standard_normal((n_seq, n_head, n_q, d)).astype(np.float32)
        k = nrng.standard_normal((n_seq, n_head_kv, n_kv, d)).astype(_np_type(kv))
        v = nrng.standard_normal((n_seq, n_head_kv, n_kv, d)).astype(_np_type(kv))
        cols = at or mt.ne[0]
        mask = (nrng.standard_normal((n_seq, 1, mt.ne[1], cols)) * 2).astype(np.float16)
        mask[..., ::masked] = -np.inf
        mask[..., :masked_first] = -np.inf
        for t in range(1, n_q):
            mask[:, 0, t, t % 7 :: 7] = -np.inf
        for s in range(1, n_seq):
            mask[s, 0, :, s % 3 :: 3] = -np.inf
        self.k, self.v, self.mask = k[:, :, :cols].copy(), v[:, :, :cols].copy(), mask
        for t in (k, v):  # masked keys: never read
            t[:, :, ::masked] = np.nan
            t[:, :, :masked_first] = np.nan
            for s in range(1, n_seq):
                t[s, :, s % 3 : cols : 3] = np.nan
        shape = (n_seq, 1, mt.ne[1], mt.ne[0])
        m = np.frombuffer(place(mt, np.zeros(shape, np.float16)), np.uint8)
        m = m.copy()
        m[: mask.nbytes] = mask.reshape(-1).view(np.uint8)  # rows `cols` values apart
        self.fa_bytes = [place(qt, self.q), place(kt, k), place(vt, v), m.tobytes()]
        self.wo_bytes, self.wo = fast_weights(ty, K, self.Ka, nrng)
        self.wg_bytes, self.wg = fast_weights(ty, F, K, nrng)
        self.wu_bytes, self.wu = fast_weights(ty, F, K, nrng)
        self.wd_bytes, self.wd = fast_weights(ty, K, F, nrng)
        _, self.n = norm_inputs(nrng, 1, K)
        self.r0 = nrng.uniform(-4, 4, (self.n_q, K)).astype(np.float32)

    def args(self):
        """Fresh memories in the sequence's order: q, k, v, mask, W_o, r0, W_g, W_u, W_d, n, out,
        a, r1, h (FLASH_ATTN_GLU_<glu>: q, k, v, mask, W_o, r0, W_g, W_u, n, h, a, r1)."""
        sizes = arg_bytes(self.spec)
        wd = () if self.glu_only else (self.wd_bytes,)
        ws = (self.wo_bytes, self.r0, self.wg_bytes, self.wu_bytes, *wd, self.n)
        ins = [buffer_of(b) for b in (*self.fa_bytes, *ws)]
        return ins + [new_buffer(n) for n in sizes[len(ins) :]]

    def run(self):
        """(a [Ka], r1 [K], h [F], out [K] or None) as f32 arrays from the emulated design."""
        args = self.args()
        run_spec_in_order(self.spec, args, self.at or None)
        if self.glu_only:
            h, a, r1 = (np.frombuffer(b.tobytes(), np.float32).copy() for b in args[9:])
            return a, r1, h, None
        out, a, r1, h = (np.frombuffer(b.tobytes(), np.float32).copy() for b in args[10:])
        return a, r1, h, out

    def run_block(self, spec, a):
        """(r1, h, out) of MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s program `spec` on a (the same other
        operands)."""
        wo, r0, wg, wu, wd, n = self.args()[4:10]
        sizes = arg_bytes(spec)
        out, r1, h = (new_buffer(sizes[i]) for i in (7, 8, 9))
        run_spec_in_order(spec, [wo, buffer_of(a), r0, wg, wu, wd, n, out, r1, h])
        return tuple(np.frombuffer(b.tobytes(), np.float32).copy() for b in (r1, h, out))

    def block_request(self):
        """MUL_MAT_ADD_RMS_NORM_FFN_<glu> of this request's block (a read as [Ka, 1])."""
        return attn_ffn_request(self.glu, self.ty, self.n_q, self.Ka, self.K, self.F, self.arch)

    def check(self, test, a, r1, h, out, tol=2e-5):
        """a against numpy's FLASH_ATTN_EXT (test_flash_attn's reference and tolerance), then
        r1, h and out as AttnFfnCase checks them, from the a the design wrote."""
        from ggml_hsa_iron.tests.test_flash_attn import reference

        fa_req = self.req
        ref = reference(fa_req, self.q, self.k, self.v, self.mask).reshape(-1)
        what = f"{self.glu} {self.ty} Ka={self.Ka} K={self.K} F={self.F} {self.arch}"
        test.assertTrue(np.isfinite(a).all(), f"a of {what}: not finite")
        err = np.abs(a - ref).max()
        test.assertLess(err, tol * max(1.0, np.abs(ref).max()), f"a of {what}: error {err}")
        n = self.n_q
        a2, r1_ = a.reshape(n, self.Ka), r1.reshape(n, self.K)
        h_ = h.reshape(n, self.F)
        check_add(test, self.ty, a2, self.wo, self.r0, r1_, f"r1 of {what}")
        check_h(test, self.glu, self.ty, r1_, self.n, self.wg, self.wu, h_, f"h of {what}")
        if out is not None:
            check_add(test, self.ty, h_, self.wd, r1_, out.reshape(n, self.K), f"out of {what}")
