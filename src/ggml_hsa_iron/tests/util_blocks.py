"""Block-quantized weights of model-sized tests, made and read with numpy.

The same reading of ggml's block layouts and of the decoder's arithmetic as
test_mvq_host.py's `random_block` and `kernel_values`, over arrays of blocks at once: a
Llama-3.2-1B-shaped matrix has 131,072 blocks, which the per-value Python reference takes
more than a minute to form. test_mvq_host checks the two readings equal, bit for bit, on
random blocks of every type. The f32 arithmetic is numpy's float32 (one rounding per
operation, as the Python reference's f64 operation rounded once to f32: exact for these
products and sums).
"""

import random

import numpy as np

from ggml_hsa_iron.dtypes import DTYPES

F32 = np.float32


def bf16_round(a):
    """f32 values rounded to bf16 (nearest even), NaN kept."""
    a = np.asarray(a, F32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(np.isnan(a), a, u.view(F32))


def trunc_split(v):
    """hi (bits truncated to bf16) and lo = v - hi (block_decode.h's half_split)."""
    v = np.asarray(v, F32)
    hi = (v.view(np.uint32) & np.uint32(0xFFFF0000)).view(F32)
    return hi, v - hi


def round_split(v):
    hi = bf16_round(v)
    return hi, bf16_round(v - hi)


def formed(codes, scale, mn=None):
    """bf16(code * scale (+ min)), summed in f32 in the decoder's order."""
    c = codes.astype(F32)
    w = c * scale[0] + c * scale[1]
    if mn is not None:
        w = (w + mn[0]) + mn[1]
    return bf16_round(w)


def _f16(b, off):
    return b[:, off : off + 2].copy().view("<f2")[:, 0].astype(F32)


def _nib32(qs):
    """A 32-value block's 4-bit codes: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def _k_scale_min(sc):
    """Q4_K's and Q5_K's 6-bit scales and mins of the 8 sub-blocks, [n, 8] each."""
    sc = sc.astype(np.int32)
    lo_s, lo_m = sc[:, 0:4] & 63, sc[:, 4:8] & 63
    hi_s = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    hi_m = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return np.concatenate([lo_s, hi_s], 1), np.concatenate([lo_m, hi_m], 1)


_I = np.arange(256)
_S = _I // 32  # Q4_K/Q5_K sub-block of each value
_K_BYTE = 32 * (_S // 2) + _I % 32
_H, _Q, _LANE = _I // 128, (_I % 128) // 32, _I % 32
_Q6_LOW = 64 * _H + 32 * (_Q % 2) + _LANE
_Q6_HIGH = 128 + 32 * _H + _LANE


def kernel_values(ty: str, blocks) -> np.ndarray:
    """`blocks` ([n, size] uint8) as the decoder forms them: f32 [n, values per block]
    (scales of any bits: infinities and NaN carried through as f32 carries them)."""
    with np.errstate(all="ignore"):
        return _values(ty, np.asarray(blocks, np.uint8))


def _values(ty: str, b) -> np.ndarray:
    if ty == "f16":
        return bf16_round(b.copy().view("<f2").astype(F32))
    if ty in ("q4_0", "q4_1", "q5_0", "q8_0"):
        d = trunc_split(_f16(b, 0)[:, None])
        if ty == "q4_0":
            return formed(_nib32(b[:, 2:18]) - 8, d)
        if ty == "q4_1":
            return formed(_nib32(b[:, 4:20]), d, trunc_split(_f16(b, 2)[:, None]))
        if ty == "q5_0":
            qh = b[:, 2:6].copy().view("<u4")
            high = (qh >> np.arange(32, dtype=np.uint32)) & 1
            return formed((_nib32(b[:, 6:22]) | (high.astype(np.int32) << 4)) - 16, d)
        return formed(b[:, 2:34].view(np.int8), d)
    if ty in ("q4_K", "q5_K"):
        qs = b[:, 16:] if ty == "q4_K" else b[:, 48:]
        byte = qs[:, _K_BYTE].astype(np.int32)
        q = np.where(_S % 2 == 0, byte & 0x0F, byte >> 4)
        if ty == "q5_K":
            q |= ((b[:, 16 + _I % 32].astype(np.int32) >> _S) & 1) << 4
        sc, m = _k_scale_min(b[:, 4:16])
        d, dmin = _f16(b, 0)[:, None], _f16(b, 2)[:, None]
        return formed(
            q, round_split(d * sc[:, _S].astype(F32)), round_split(-dmin * m[:, _S].astype(F32))
        )
    if ty == "q6_K":
        low = b[:, _Q6_LOW].astype(np.int32)
        low = np.where(_Q < 2, low & 0x0F, low >> 4)
        high = (b[:, _Q6_HIGH].astype(np.int32) >> (2 * _Q)) & 3
        scales = b[:, 192:208].view(np.int8).astype(F32)[:, _I // 16]
        return formed((low | high << 4) - 32, round_split(_f16(b, 208)[:, None] * scales))
    raise ValueError(ty)


def random_blocks(ty: str, n: int, rng: random.Random) -> np.ndarray:
    """n random blocks of `ty` ([n, size] uint8), drawn as test_mvq_host's `random_block`
    draws one: every byte random but the f16 fields, which hold sane scales (f16 values: any
    finite, subnormals included)."""
    g = np.random.default_rng(rng.getrandbits(64))
    b = g.integers(0, 256, (n, DTYPES[ty].size), dtype=np.uint8)

    def put(off, v):
        b[:, off : off + 2] = np.asarray(v, "<f2").view(np.uint8).reshape(n, 2)

    if ty == "f16":
        kind = g.integers(0, 3, n)
        tiny = np.where(kind == 1, g.uniform(-1e-6, 1e-6, n), 0.0)
        put(0, np.where(kind == 0, g.uniform(-2, 2, n), tiny))
    elif ty == "q6_K":
        put(208, g.uniform(-0.05, 0.05, n))
    else:
        put(0, g.uniform(-0.1, 0.1, n))
        if ty in ("q4_1", "q4_K", "q5_K"):
            put(2, g.uniform(-0.1, 0.1, n))
    return b
