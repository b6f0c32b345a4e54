"""The RMS_NORM_MUL_MAT family's test data and numpy reference, shared by
test_rms_norm_mul_mat.py, test_rms_norm_mul_mat_rope.py and test_rms_norm_qkv.py (numpy and
ml_dtypes needed)."""

import numpy as np

from ggml_hsa_iron.plans import _bits_f32
from ggml_hsa_iron.tests.test_mul_mat_glu import _bf16, _weights
from ggml_hsa_iron.tests.test_rope_glu_host import rope_ref

EPS = 1e-5


def norm_weights(ty, rows, K, nrng, rng):
    """(bytes, the values the kernel multiplies as float64 [rows, K]) of random weights: f32 and
    f16 drawn from the numpy generator `nrng` (fast for Llama-sized shapes; f16 is rounded to
    bf16 on the core), the block-quantized types from `rng` (random.Random, ggml's blocks)."""
    if ty not in ("f32", "f16"):
        return _weights(ty, rows, K, rng)
    w = nrng.uniform(-0.2, 0.2, (rows, K)).astype(np.float32 if ty == "f32" else np.float16)
    vals = w.astype(np.float64)
    return w.tobytes(), vals if ty == "f32" else _bf16(vals)


def norm_inputs(nrng, M, K):
    """x [M, K] (rows of unequal magnitude: the scale matters) and n [K], f32."""
    x = nrng.uniform(-1, 1, (M, K)).astype(np.float32)
    x[:, ::7] *= 8
    n = nrng.uniform(0.2, 2, K).astype(np.float32)
    return x, n


def norm_reference(ty, x, n, w, eps=EPS):
    """(s * (W . (x * n)) [M, N], its error bound) as the cores compute it: x multiplied by n in
    f32 (rounded to bf16 for the decoding GEMV of f16 and block weights), the products summed in
    f32 and the sums scaled by s = 1 / sqrt(mean(x^2) + eps), computed in f32, at the end of a
    round."""
    xn = x * n
    xn = xn.astype(np.float64) if ty == "f32" else _bf16(xn)
    x64 = x.astype(np.float64)
    s = 1 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + eps)  # [M, 1]
    prods = xn[:, None, :] * w[None, :, :]  # [M, N, K]
    sums = s * prods.sum(axis=2)
    err = s * np.abs(prods).sum(axis=2) * 2.0**-18 + np.abs(sums) * 1e-5
    return sums, err


def f16_half_ulp(want):
    """Half an f16 ulp of each value (normals; subnormals' spacing below 2^-14)."""
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 2.0**-14))) - 11)


def rope_reference(y, err, pos, ff, n_dims, neox, constants, D):
    """ggml's ROPE (ROPE_FF with the factors `ff`) of each token's product y [T, M] viewed as
    heads of D rows, token t at position pos[t], with `constants` (the spec's, f32 bits; see
    plans.rope_constants): (the rotated values [T, M] as float64, their tolerance). `err` is y's
    error bound (norm_reference's): a rotated value mixes its pair's two errors, and the
    rotation adds f32 rounding."""
    T, M = y.shape
    H = M // D
    c = {k: _bits_f32(v) for k, v in constants.items()}
    want = rope_ref(
        y.reshape(T * H, D), np.repeat(pos[:T], H), ff, n_dims, neox, c["THETA_SCALE"],
        c["FREQ_SCALE"], c["EXT_FACTOR"], c["MSCALE"], c["CORR_LOW"], c["CORR_DEN"],
    ).astype(np.float64)  # fmt: skip
    e, a = err.reshape(T * H, D), np.abs(y).reshape(T * H, D)
    half = n_dims // 2
    ia = np.arange(half) if neox else 2 * np.arange(half)
    ib = ia + half if neox else ia + 1
    mixed = (e[:, ia] + e[:, ib] + (a[:, ia] + a[:, ib]) * 1e-5) * c["MSCALE"]
    tol = e.copy()
    tol[:, ia], tol[:, ib] = mixed, mixed
    return want.reshape(T, M), tol.reshape(T, M)
