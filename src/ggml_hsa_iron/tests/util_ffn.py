"""RMS_NORM_FFN_<glu>'s test scaffolding: its requests, Llama-sized random operands made with
numpy, the design run in order (util_emu_seq.py) with r and out in x's memory or apart, the
two kernels it replaces (RMS_NORM_MUL_MAT_<glu>, then MUL_MAT_ADD) run in sequence, and the
numpy references (test_rms_norm_ffn.py). Everything past the requests needs numpy and
ml_dtypes."""

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
        g, g_err = norm_reference(self.ty, self.x, self.n, self.wg)
        u, u_err = norm_reference(self.ty, self.x, self.n, self.wu)
        _check_glu(test, self.glu, h.astype(np.float64), g, u, g_err, u_err, f"h of {what}")
        hv = h.astype(np.float64) if self.ty == "f32" else _bf16(h)
        prods = np.abs(hv) @ np.abs(self.wd).T
        want = hv @ self.wd.T + self.r.astype(np.float64)
        tol = prods * 2.0**-20 + np.abs(want) * 2.0**-22 + 1e-30
        bad = ~(np.abs(out.astype(np.float64) - want) <= tol)  # NaN fails too
        if bad.any():
            test.fail(
                f"out of {what}: {int(bad.sum())} of {out.size} wrong, first at "
                f"{np.argwhere(bad)[0]}: {out[bad][0]} vs {want[bad][0]}"
            )


def assert_same_bits(test, got, want, what):
    """got and want (f32 arrays) equal bit for bit."""
    diff = got.view(np.uint32) != want.view(np.uint32)
    if diff.any():
        i = tuple(np.argwhere(diff)[0])
        test.fail(f"{what}: {int(diff.sum())} values differ, first at {i}: {got[i]} vs {want[i]}")
