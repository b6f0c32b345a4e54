"""kernels/mvq.cc (MUL_MAT's GEMV over f16 and block-quantized weights) on the host.

Random weight blocks of every type (scales chosen in a sane range, every other byte random)
are decoded by this file's own reading of ggml's block layouts (ggml-common.h) and the
kernel's sums are compared with sum(bf16(w) * bf16(x)) in exact arithmetic: the kernel rounds
the decoded weights and the activations to bf16 (round to nearest even) and sums the exact
products in f32, so the difference is f32 summation error only. The quantized weights are
formed as the kernel forms them (`kernel_values`). Built for aie2 and aie2p. Skipped when no
host C++ compiler is installed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import random
import struct
import subprocess
import tempfile
import unittest

from ggml_hsa_iron.dtypes import DTYPES
from ggml_hsa_iron.tests import host_program
from ggml_hsa_iron.tests.host_program import CXX
from ggml_hsa_iron.tests.test_kernels_host import HERE, KERNELS, bf16_round, f32


def f16_bytes(v: float) -> bytes:
    return struct.pack("<e", v)


def f16_at(b: bytes, off: int) -> float:
    return struct.unpack_from("<e", b, off)[0]


def nib32(qs: bytes, j: int) -> int:
    return qs[j % 16] & 0x0F if j < 16 else qs[j % 16] >> 4


def k_scale_min(sc: bytes, s: int) -> tuple[int, int]:
    if s < 4:
        return sc[s] & 63, sc[s + 4] & 63
    return (sc[s + 4] & 0x0F) | ((sc[s - 4] >> 6) << 4), (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4)


# The 32-value block types.
VECTOR_BLOCKS = ("q4_0", "q4_1", "q5_0", "q8_0")


def block_codes(ty: str, b: bytes) -> tuple[float, float, list[int]]:
    """A 32-value block's scale d, min m (Q4_1; else 0) and integer codes: value = d * code + m."""
    d = f16_at(b, 0)
    if ty == "q4_0":
        return d, 0.0, [nib32(b[2:], j) - 8 for j in range(32)]
    if ty == "q4_1":
        return d, f16_at(b, 2), [nib32(b[4:], j) for j in range(32)]
    if ty == "q5_0":
        qh = struct.unpack_from("<I", b, 2)[0]
        return d, 0.0, [(nib32(b[6:], j) | ((qh >> j) & 1) << 4) - 16 for j in range(32)]
    if ty == "q8_0":
        return d, 0.0, [struct.unpack_from("b", b, 2 + j)[0] for j in range(32)]
    raise ValueError(ty)


def trunc_split(v: float) -> tuple[float, float]:
    """An f32 value as hi + lo: hi its bits truncated to bf16, lo the rest (block_decode.h's
    half_split; exact for f16 values)."""
    u = struct.unpack("<I", struct.pack("<f", v))[0]
    hi = struct.unpack("<f", struct.pack("<I", u & 0xFFFF0000))[0]
    return hi, v - hi


def round_split(v: float) -> tuple[float, float]:
    """An f32 value as bf16 hi + lo, each rounded to nearest even (split_products)."""
    hi = bf16_round(v)
    return hi, bf16_round(f32(v - hi))


def formed(code: int, scale: tuple[float, float], mn: tuple[float, float] | None) -> float:
    """The kernel's weight: code * scale (+ min) summed in f32 in its order, rounded to bf16."""
    w = f32(f32(code * scale[0]) + f32(code * scale[1]))
    if mn is not None:
        w = f32(f32(w + mn[0]) + mn[1])
    return bf16_round(w)


def kernel_values(ty: str, b: bytes) -> list[float]:
    """One block of `ty` as block_decode.h's piece makes it (the GEMV's and the GEMM's
    decoder): per value bf16(scale * code + min) formed in f32 from the scale's and the min's
    bf16 halves; f16 weights rounded to bf16."""
    if ty in VECTOR_BLOCKS:
        d, m, codes = block_codes(ty, b)
        mn = trunc_split(m) if ty == "q4_1" else None
        return [formed(c, trunc_split(d), mn) for c in codes]
    if ty in ("q4_K", "q5_K"):
        d, dmin = f16_at(b, 0), f16_at(b, 2)
        out = []
        for i, q in enumerate(k_codes(ty, b)):
            sc, m = k_scale_min(b[4:16], i // 32)
            out.append(formed(q, round_split(f32(d * sc)), round_split(f32(-dmin * m))))
        return out
    if ty == "q6_K":
        d = f16_at(b, 208)
        return [
            formed(q, round_split(f32(d * struct.unpack_from("b", b, 192 + i // 16)[0])), None)
            for i, q in enumerate(q6_codes(b))
        ]
    return [bf16_round(f32(v)) for v in decode(ty, b)]


def k_codes(ty: str, b: bytes) -> list[int]:
    """Q4_K's and Q5_K's 256 unsigned codes."""
    qs = b[16:] if ty == "q4_K" else b[48:]
    out = []
    for i in range(256):
        s = i // 32
        byte = qs[32 * (s // 2) + i % 32]
        q = byte & 0x0F if s % 2 == 0 else byte >> 4
        if ty == "q5_K":
            q |= ((b[16 + i % 32] >> s) & 1) << 4
        out.append(q)
    return out


def q6_codes(b: bytes) -> list[int]:
    """Q6_K's 256 codes, less their offset 32."""
    out = []
    for i in range(256):
        h, q, lane = i // 128, (i % 128) // 32, i % 32
        byte = b[64 * h + 32 * (q % 2) + lane]
        low = byte & 0x0F if q < 2 else byte >> 4
        high = (b[128 + 32 * h + lane] >> (2 * q)) & 3
        out.append((low | high << 4) - 32)
    return out


def decode(ty: str, b: bytes) -> list[float]:
    """One block of `ty` as exact values (Python floats)."""
    if ty == "f16":
        return [f16_at(b, 0)]
    if ty in VECTOR_BLOCKS:
        d, m, codes = block_codes(ty, b)
        return [d * c + m for c in codes]
    if ty in ("q4_K", "q5_K"):
        d, dmin, out = f16_at(b, 0), f16_at(b, 2), []
        for i, q in enumerate(k_codes(ty, b)):
            sc, m = k_scale_min(b[4:16], i // 32)
            out.append(d * sc * q - dmin * m)
        return out
    if ty == "q6_K":
        d = f16_at(b, 208)
        return [
            d * struct.unpack_from("b", b, 192 + i // 16)[0] * q for i, q in enumerate(q6_codes(b))
        ]
    raise ValueError(ty)


def random_block(ty: str, rng: random.Random) -> bytes:
    size = DTYPES[ty].size
    b = bytearray(rng.randrange(256) for _ in range(size))
    # f16 fields: sane scales (random bytes could be inf/NaN); f16 values: any finite,
    # subnormals included.
    if ty == "f16":
        v = rng.choice([rng.uniform(-2, 2), rng.uniform(-1e-6, 1e-6), 0.0])
        b[0:2] = f16_bytes(v)
    elif ty == "q6_K":
        b[208:210] = f16_bytes(rng.uniform(-0.05, 0.05))
    else:
        b[0:2] = f16_bytes(rng.uniform(-0.1, 0.1))
        if ty in ("q4_1", "q4_K", "q5_K"):
            b[2:4] = f16_bytes(rng.uniform(-0.1, 0.1))
    return bytes(b)


def run(ty: str, arch: str, rows: int, kc: int, w: bytes, x: list[float]) -> list[float]:
    arch_define = {"aie2": 20, "aie2p": 21}[arch]
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "input.txt"
        data.write_text(
            " ".join(f"{v:x}" for v in w) + "\n" + " ".join(float.hex(v) for v in x) + "\n"
        )
        cmd = ["-std=c++20", "-O1", f"-I{HERE.parent / 'emu' / 'include'}", f"-I{KERNELS}"]
        cmd += [f"-DMVQ_{ty.upper()}=1", f"-DMV_ROWS={rows}", f"-DMV_KC={kc}"]
        cmd += [f"-D__AIE_ARCH__={arch_define}", str(HERE / "host" / "mvq_driver.cc")]
        exe = host_program.build(cmd)
        out = subprocess.run([str(exe), str(data)], check=True, capture_output=True, text=True)
    return [float.fromhex(line) for line in out.stdout.split()]


@unittest.skipUnless(CXX, "no host C++ compiler")
class MvqHostTest(unittest.TestCase):
    def check(self, ty: str, arch: str, rows: int, kc: int, seed: int, blocks=None):
        rng = random.Random(seed)
        block = DTYPES[ty].block
        blocks = blocks or [random_block(ty, rng) for _ in range(rows * kc // block)]
        x = [f32(rng.uniform(-1, 1)) for _ in range(kc)]
        y = run(ty, arch, rows, kc, b"".join(blocks), x)
        per_row = kc // block
        for r in range(rows):
            wv = [w for b in blocks[r * per_row : (r + 1) * per_row] for w in kernel_values(ty, b)]
            prods = [w * bf16_round(v) for w, v in zip(wv, x)]
            # ggml_mvq ran twice on the same y: 2 * the dot product.
            want = 2 * sum(prods)
            tol = 2 * sum(abs(p) for p in prods) * 2.0**-21 + 1e-30
            self.assertLessEqual(abs(y[r] - want), tol, f"{ty} {arch} row {r}: {y[r]} vs {want}")

    def test_every_type_on_both_archs(self):
        for i, ty in enumerate(("q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K")):
            kc = 2 * DTYPES[ty].block
            for arch in ("aie2", "aie2p"):
                with self.subTest(ty=ty, arch=arch):
                    self.check(ty, arch, rows=3, kc=kc, seed=i)

    def test_f16_with_a_tail_and_subnormals(self):
        # 64: whole pairs of vectors (HalfPairs); 16 and 38: 16 at a time, a tail.
        for arch in ("aie2", "aie2p"):
            for kc in (16, 38, 64):
                with self.subTest(arch=arch, kc=kc):
                    self.check("f16", arch, rows=17, kc=kc, seed=kc)

    def test_f16_rows_of_normal_numbers(self):
        # Rows of normal numbers only take HalfPairs' shifts and masks; a row with one zero
        # among them the exact conversion.
        rng = random.Random(5)
        values = [rng.choice((-1, 1)) * rng.uniform(2.0**-14, 60000.0) for _ in range(9 * 64)]
        values[3 * 64 + 17] = 0.0
        blocks = [f16_bytes(v) for v in values]
        for arch in ("aie2", "aie2p"):
            with self.subTest(arch=arch):
                self.check("f16", arch, rows=9, kc=64, seed=0, blocks=blocks)


if __name__ == "__main__":
    unittest.main()


class NumpyReadingTest(unittest.TestCase):
    """util_blocks (the model-sized tests' numpy reading of the blocks) against this file's
    per-value reading, bit for bit, on random blocks and on blocks of extreme fields."""

    def test_equals_the_per_value_reading(self):
        try:
            import numpy as np

            from ggml_hsa_iron.tests import util_blocks
        except ImportError:
            self.skipTest("numpy is installed by scripts/check-iron.sh")
        rng = random.Random(7)
        for ty in ("f16", *VECTOR_BLOCKS, "q4_K", "q5_K", "q6_K"):
            with self.subTest(ty=ty):
                drawn = util_blocks.random_blocks(ty, 64, rng)
                # Every byte random, scales included (infinities, NaN, subnormals).
                wild = [
                    bytes(rng.randrange(256) for _ in range(DTYPES[ty].size)) for _ in range(64)
                ]
                blocks = (
                    [bytes(b) for b in drawn] + [random_block(ty, rng) for _ in range(16)] + wild
                )
                got = util_blocks.kernel_values(
                    ty, np.frombuffer(b"".join(blocks), np.uint8).reshape(len(blocks), -1)
                )
                want = np.asarray([kernel_values(ty, b) for b in blocks], np.float32)
                self.assertEqual(got.shape, want.shape)
                same = (got.view(np.uint32) == want.view(np.uint32)) | (
                    np.isnan(got) & np.isnan(want)
                )
                self.assertTrue(
                    same.all(), (ty, np.argwhere(~same)[:3], got[~same][:3], want[~same][:3])
                )
