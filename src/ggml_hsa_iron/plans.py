"""From a request to a kernel spec: validation, type rules, tiling, C++ defines.

`prepare(request)` is pure Python: it decides whether a design implements the
request (raising UnsupportedError with the reason otherwise) and computes
everything the IRON design and the AIE core functions need. The design files
under designs/ only turn a spec into an IRON program.
"""

import dataclasses
import math
import struct
from dataclasses import dataclass, field

from . import registry
from .archs import ARCHS, Arch
from .dtypes import DTYPES, FLOAT_TYPES, INT_TYPES, QUANT_TYPES
from .errors import RequestError, UnsupportedError
from .request import Request, Tensor
from .tiling import (
    BCAST_MAX_BYTES,
    MAX_REPEAT,
    MAX_STRIDE_WORDS,
    MAX_TASKS_PER_CHANNEL,
    SHIM_GROUP_TASKS,
    Broadcast,
    EltwisePlan,
    GemmPlan,
    GemvPlan,
    RopeRows,
    RowPlan,
    can_repeat,
    gemv_cycles,
    pad_words,
    plan_eltwise,
    plan_gemm,
    plan_gemm_blocks,
    plan_gemv,
    plan_gemv_blocks,
    plan_rows,
    split_run,
    row_walk,
)

# Workers per column: the memory tile has 6 input and 6 output channels.
# unary: 1 + R in, R + 1 out; binary with both inputs streamed: 2 + R in,
# 2R + 1 out; binary with a resident broadcast operand (sent shim -> cores
# directly): 1 + R in, R + 1 out.
ROWS_UNARY = 4
ROWS_BINARY = 2
ROWS_BCAST = 4

ELTWISE_SOURCE = "eltwise.cc"
GEMM_SOURCE = "mm.cc"
GEMV_SOURCE = "mv.cc"
GEMV_BLOCKS_SOURCE = "mvq.cc"
GEMM_BLOCKS_SOURCE = "mmq.cc"
# The most src1 rows one GEMV of block-quantized weights computes from each decoded W tile
# (GemvPlan.nx): a decode step's tokens, eight sequences or a speculative batch.
GEMV_MAX_X_ROWS = 8


def rows_at_once(w: Tensor, x: Tensor, dst: Tensor, r: Tensor | None = None):
    """GemvPlan.nx's (rows, x's row stride, dst's, r's) for a GEMV taking x's few rows at once
    (a decode step of several tokens), or None where it takes them one at a time: weights not
    block-quantized, one row or more than GEMV_MAX_X_ROWS, several batches, or (MUL_MAT_ADD)
    an r that is not one row per x row."""
    M = x.ne[1]
    if w.dtype not in QUANT_TYPES or not 1 < M <= GEMV_MAX_X_ROWS or x.ne[2] * x.ne[3] != 1:
        return None
    if r is not None and r.ne[1] != M:
        return None
    r_row = r.nb[1] // r.size if r is not None else 0
    return (M, x.nb[1] // x.size, dst.nb[1] // dst.size, r_row)


# Weights moved as bytes and decoded on the cores (f16 has no AIE arithmetic).
BYTE_WEIGHTS = ("f16",) + QUANT_TYPES
ROWS_SOURCE = "rows.cc"


@dataclass(frozen=True)
class CoreSource:
    """One AIE C++ source compiled with Peano into `object_name`.

    A design whose Workers link different objects (RMS_NORM_QKV_ROPE's column groups: one
    GEMV source per group, its own defines) has several (`core_sources`); each object's extern
    "C" functions then get distinct names through defines renaming them (`renamed`), so that
    the design's Kernels name distinct functions (one MLIR symbol each) and the emulation
    links the objects into one library."""

    source: str  # file under kernels/
    object_name: str
    defines: dict = field(default_factory=dict)

    def renamed(self, object_name: str, functions, suffix: str) -> "CoreSource":
        """This source built into `object_name` with each of `functions` (the extern "C"
        functions it may define) named with `suffix` appended."""
        d = dict(self.defines)
        d.update({f: f + suffix for f in functions})
        return CoreSource(self.source, object_name, d)


def core_sources(spec) -> tuple[CoreSource, ...]:
    """The core sources a spec's design links: its `cores` when it has several, else its one
    `core`."""
    return tuple(getattr(spec, "cores", None) or (spec.core,))


@dataclass(frozen=True)
class EltwiseSpec:
    request: Request
    arch: Arch
    op: str
    kind: str  # "unary", "binary" or "bcast"
    in_types: tuple[str, ...]
    out_type: str
    compute: str  # "f32", "bf16" or an integer type
    plan: EltwisePlan  # over plan.n elements: n_valid rounded up to whole DMA words
    bcast: Broadcast | None
    params: tuple[int, ...] = ()  # the op_params words the op reads, zeros filled in
    n_valid: int = 0  # the output's elements
    bcast_count: int = 0  # input 1's elements moved (broadcast), rounded up to whole words
    # Per input: None (dense, moved linearly) or (row length, row stride, span) in elements
    # for an input whose rows are `row stride` apart (GLU's halves of one tensor).
    row_strides: tuple = ()

    @property
    def padded(self) -> bool:
        """The element count is not whole 32-bit words: the last word of every operand is
        read (and the output's written) whole; see `pad_words`."""
        return self.plan.n != self.n_valid

    @property
    def needs_begin(self) -> bool:
        """The core function tracks the logical index of its tiles (ggml_eltwise_begin)."""
        return self.kind == "bcast" or self.padded

    @property
    def core(self) -> CoreSource:
        d = {
            f"GGML_OP_{self.op}": 1,
            "TILE": self.plan.tile,
            "IN0_T": DTYPES[self.in_types[0]].ctype,
            "OUT_T": DTYPES[self.out_type].ctype,
            # Floats (bf16 or f32 operands) are all computed in f32.
            "COMPUTE_F32": int(self.compute in FLOAT_TYPES),
            "COMPUTE_INT": int(self.compute in INT_TYPES),
        }
        for i, p in enumerate(self.params):
            d[f"OP_P{i}"] = p
        if self.kind == "glu":
            d["GLU"] = 1
        if self.kind != "unary":
            d["IN1_T"] = DTYPES[self.in_types[1]].ctype
            d["BINARY"] = 1
        if self.padded:
            d["PAD"] = 1
            d["N_VALID"] = self.n_valid
        if self.kind == "bcast":
            d["BCAST"] = 1
            for i in range(4):
                d[f"OUT_NE{i}"] = self.bcast.out_ne[i]
                d[f"SRC_NE{i}"] = self.bcast.src_ne[i]
        return CoreSource(ELTWISE_SOURCE, "eltwise.o", d)

    @property
    def bcast_elements(self) -> int:
        n = 1
        for s in self.bcast.src_ne:
            n *= s
        return n

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: the inputs, then the output.

        The backend passes each operand as an address and a size in bytes, in this order.
        """
        out = []
        for i, t in enumerate(self.in_types):
            count = self.bcast_count if (self.kind == "bcast" and i == 1) else self.plan.n
            if self.walk(i) is not None:
                count = self.walk(i)[2]
            out.append((t, count))
        out.append((self.out_type, self.plan.n))
        return out

    def walk(self, i: int):
        return self.row_strides[i] if i < len(self.row_strides) else None

    def fill_tap(self, i: int, start: int, length: int):
        """(offset, sizes, strides) of input i's elements [start, start + length) of the
        logical (row-major) order: a linear run, or whole rows walked with their stride."""
        w = self.walk(i)
        if w is None:
            return start, (1, 1, 1, length), (0, 0, 0, 1)
        row, stride, _ = w
        sizes, strides = row_walk(row, stride, DTYPES[self.in_types[i]].size, length // row)
        return (start // row) * stride, sizes, strides


@dataclass(frozen=True)
class MvRope:
    """RMS_NORM_MUL_MAT_ROPE(_FF)'s rotation epilogue (the plan's side: GemvPlan.rope)."""

    pos: Tensor  # i32 [P, 1, 1, 1], P >= the x rows: token t's position is pos[t]
    ff: Tensor | None  # f32 [F, 1, 1, 1], F >= n_dims/2: ROPE_FF's frequency factors
    constants: dict  # name -> f32 bit pattern (rope_constants; kernels/rope_math.h)
    yarn: bool  # ext_factor != 0
    eps: int  # the norm's eps, f32 bits (op_params word 11)
    # RMS_NORM_MUL_MAT_HEAD_NORM_ROPE(_FF): the head norm's weights f32 [D] and its eps (f32
    # bits, op_params word 12).
    head_norm: Tensor | None = None
    head_eps: int = 0


@dataclass(frozen=True)
class MatmulSpec:
    request: Request
    arch: Arch
    src0: Tensor  # weights: [K, N, b02, b03]
    src1: Tensor  # activations: [K, M, b12, b13]
    dst: Tensor  # [N, M, b12, b13]
    plan: GemmPlan | GemvPlan
    compute: str  # microkernel input type: bf16, i8, i16 (or f32 for GEMV)
    # MUL_MAT_<glu>: the GLU op (REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK); src0 is then
    # the gate weights, and the up weights (the request's input 1) have src0's dtype, ne, nb.
    glu: str = ""
    # MUL_MAT_ADD: r, added to the product (the request's input 2; f32 rows of N, repeated
    # over the product as ggml's ADD repeats its second input).
    r: Tensor | None = None
    # RMS_NORM_MUL_MAT(_<glu>): n, the norm weight (the request's last input, f32 [K,1,1,1]);
    # src1 is then the norm's input, normalised on the cores (GemvPlan.norm).
    n: Tensor | None = None
    # RMS_NORM_MUL_MAT_ROPE(_FF): the product rotated as ggml's ROPE (GemvPlan.rope); dst is
    # then the product's [N, M] view of the request's [D, H, M] output (the same bytes).
    rope: MvRope | None = None
    # RMS_NORM_MUL_MAT_BIAS(...): one row of N values added to every product after the norm's
    # scale, before a rotation (qwen2's Q, K and V biases; GemvPlan.bias).
    bias: Tensor | None = None

    @property
    def add(self) -> bool:
        return self.r is not None

    @property
    def gemv(self) -> bool:
        return isinstance(self.plan, GemvPlan)

    @property
    def weight_bytes(self) -> bool:
        """src0 is moved as bytes (f16, block-quantized) and decoded by the cores."""
        return self.src0.dtype in BYTE_WEIGHTS

    @property
    def f16_out(self) -> bool:
        """MUL_MAT's or RMS_NORM_MUL_MAT's GEMV writing f16 (the KV cache): the cores sum in
        an f32 stash and round once per value (mv_stash.h)."""
        return self.dst.dtype == "f16"

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: src0, src1, dst (MUL_MAT_<glu>:
        W_g, W_u, x, dst; MUL_MAT_ADD: W, x, r, dst; RMS_NORM_MUL_MAT(_<glu>): the weights, x,
        n, dst; RMS_NORM_MUL_MAT_BIAS: W, x, n, the bias, dst;
        RMS_NORM_MUL_MAT[_HEAD_NORM|_BIAS]_ROPE(_FF): W, x, n, the positions, (the factors,)
        (the head norm's weights or the bias,) dst)."""
        w = ("i8", extent(self.src0)) if self.weight_bytes else (self.src0.dtype, _span(self.src0))
        ws = [w, w] if self.glu else [w]
        rest = (self.src1, self.r, self.dst) if self.add else (self.src1, self.dst)
        if self.n is not None:
            rest = (self.src1, self.n, self.dst)
        seq = ws + [(t.dtype, _span(t)) for t in rest]
        if self.rope is not None:
            # The positions (i32) and factors travel as 32-bit words on x's f32 fifo: declared
            # f32 like its objects; the cores read the positions' bits back as i32.
            r = self.rope
            consts = [t for t in (r.pos, r.ff, r.head_norm) if t is not None]
            seq[-1:-1] = [("f32", t.nelements) for t in consts]
        if self.bias is not None:
            seq[-1:-1] = [("f32", self.bias.nelements)]
        return seq

    @property
    def batches(self) -> list[tuple[int, int, int]]:
        """(src0, src1, dst) element offsets of every matrix product, in order."""
        return _batches(self.src0, self.src1, self.dst)

    @property
    def products(self) -> list[tuple[int, int, int]]:
        """GEMV: (src0, src1, dst) offsets of every matrix-vector product, one per src1 row
        of every batch, in order; src0's in bytes when it is moved as bytes. MUL_MAT_ADD:
        (src0, src1, dst, r), r's the offset of the row added to the product's."""
        return _products(self.src0, self.src1, self.dst, self.r)

    def tasks(self):
        """The runtime sequence's DMA task groups (see GemmPlan.tasks, GemvPlan.tasks)."""
        return self.plan.tasks(self.products if self.gemv else self.batches)

    @property
    def tiles_per_core(self) -> int:
        """Output tiles (GEMM) or rounds (GEMV) each core computes per dispatch."""
        if self.gemv:
            return -(-len(self.products) // self.plan.nx) * self.plan.rounds
        return len(self.batches) * self.plan.tiles_per_core

    @property
    def core(self) -> CoreSource:
        a, b, c = self.src1.dtype, self.src0.dtype, self.dst.dtype
        glu = {"MV_GLU": 1, f"GGML_OP_{self.glu}": 1} if self.glu else {}
        if self.add:
            glu = {"MV_ADD": 1}
        if self.f16_out:
            glu = {"MV_OUT_F16": 1}
        if self.n is not None:
            # eps as f32 bits, compiled into the kernel (the request's name carries it).
            eps = self.request.op_params[0] if self.request.op_params else 0
            if self.rope is not None:
                eps = self.rope.eps
            glu.update(MV_NORM=1, MV_NORM_K=self.src0.ne[0], OP_P0=eps)
        p = self.plan
        if self.rope is not None:
            r = p.rope
            glu.update(
                MV_ROPE=1,
                MV_ROPE_HEAD=r.head,
                MV_ROPE_N=p.N,
                MV_ROPE_BLOCK=p.block,
                MV_ROPE_TOKENS=r.tokens,
                N_DIMS=r.n_dims,
                NEOX=int(r.neox),
                FF=int(r.ff > 0),
                YARN=int(self.rope.yarn),
                **self.rope.constants,
            )
            if r.head_norm:
                glu.update(MV_ROPE_HEAD_NORM=1, HEAD_NORM_EPS=self.rope.head_eps)
        if self.bias is not None:
            glu.update(
                MV_BIAS=1, MV_BIAS_ROUNDS=p.rounds, MV_BIAS_COLUMN_ROWS=p.rows * p.rows_per_tile
            )
        # The GEMM's microkernel and tile shape (mm.cc and mmq.cc).
        gemm_tiles = (
            {}
            if self.gemv
            else {
                "MM_R": p.r,
                "MM_S": p.s,
                "MM_T": p.t,
                "TILE_M": p.m,
                "TILE_N": p.n,
                "TILE_K": p.k,
            }
        )
        if self.weight_bytes and not self.gemv:
            d = {f"MVQ_{b.upper()}": 1, **gemm_tiles, "A_SPLIT": p.a_split}
            if a == "bf16":
                d["A_BF16"] = 1
            return CoreSource(GEMM_BLOCKS_SOURCE, "mmq.o", d)
        if self.weight_bytes:
            d = {
                f"MVQ_{b.upper()}": 1,
                "MV_ROWS": p.rows_per_tile,
                "MV_KC": p.k_chunk,
                **glu,
            }
            if p.nx > 1:
                d["MV_NX"] = p.nx
                if self.add:
                    d["MV_ADD_ROWS"] = p.rows * p.rows_per_tile
            return CoreSource(GEMV_BLOCKS_SOURCE, "mvq.o", d)
        if self.gemv:
            d = {
                "W_T": DTYPES[b].ctype,
                "X_T": DTYPES[a].ctype,
                "Y_T": DTYPES[c].ctype,
                "MV_ROWS": p.rows_per_tile,
                "MV_KC": p.k_chunk,
                "MV_INT": int(self.compute in INT_TYPES),
                **glu,
            }
            if p.x_bf16:
                d["MV_X_BF16"] = 1
            return CoreSource(GEMV_SOURCE, "mv.o", d)
        d = {
            "A_T": DTYPES[a].ctype,
            "B_T": DTYPES[b].ctype,
            "C_T": DTYPES[c].ctype,
            "MMUL_T": DTYPES[self.compute].ctype,
            **gemm_tiles,
        }
        return CoreSource(GEMM_SOURCE, "mm.o", d)


def _batches(src0: Tensor, src1: Tensor, dst: Tensor) -> list[tuple[int, int, int]]:
    """(src0, src1, dst) element offsets of every matrix product, in order.

    ggml broadcasts src0 over src1's dimensions 2 and 3:
    i02 = i12 / (ne12 / ne02), i03 = i13 / (ne13 / ne03).
    """
    s0, s1, d = src0.ne, src1.ne, dst.ne
    r2, r3 = s1[2] // s0[2], s1[3] // s0[3]
    out = []
    for i13 in range(s1[3]):
        for i12 in range(s1[2]):
            i02, i03 = i12 // r2, i13 // r3
            src0_off = (i03 * s0[2] + i02) * s0[0] * s0[1]
            src1_off = (i13 * s1[2] + i12) * s1[0] * s1[1]
            dst_off = (i13 * d[2] + i12) * d[0] * d[1]
            out.append((src0_off, src1_off, dst_off))
    return out


def _products(src0: Tensor, src1: Tensor, dst: Tensor, r: Tensor | None = None) -> list[tuple]:
    """(src0, src1, dst) offsets of every matrix-vector product (one per src1 row), in order
    (batches i13, i12, then src1 rows); src0's in bytes when it is moved as bytes (f16,
    block-quantized), the others in elements. Walks each operand's byte strides nb (dense or
    strided views with dense rows), src0 broadcast as ggml does: i02 = i12 / r2,
    i03 = i13 / r3. With r (MUL_MAT_ADD) a fourth offset: r's row repeated over the product
    as ggml's ADD repeats its second input (index i % ne in every dimension)."""
    s0, s1 = src0.ne, src1.ne
    r2, r3 = s1[2] // s0[2], s1[3] // s0[3]
    w_unit = 1 if src0.dtype in BYTE_WEIGHTS else src0.size
    out = []
    for i13 in range(s1[3]):
        for i12 in range(s1[2]):
            w = ((i12 // r2) * src0.nb[2] + (i13 // r3) * src0.nb[3]) // w_unit
            for i in range(s1[1]):
                x = (i * src1.nb[1] + i12 * src1.nb[2] + i13 * src1.nb[3]) // src1.size
                y = (i * dst.nb[1] + i12 * dst.nb[2] + i13 * dst.nb[3]) // dst.size
                if r is None:
                    out.append((w, x, y))
                    continue
                idx = (i % r.ne[1], i12 % r.ne[2], i13 % r.ne[3])
                out.append((w, x, y, sum(j * b for j, b in zip(idx, r.nb[1:])) // r.size))
    return out


def extent(t: Tensor) -> int:
    """Bytes from t's first element to the end of its last (ggml_nbytes: a dense tensor's
    size, a view's span)."""
    return t.ne[0] // t.block * t.size + sum((n - 1) * b for n, b in zip(t.ne[1:], t.nb[1:]))


def _span(t: Tensor) -> int:
    """Elements of t's type from its first element to the end of its last."""
    return extent(t) // t.size


def _rows_dense(t: Tensor) -> bool:
    """Whether t's rows (dimension 0) are dense: nb[0] the element's (or block's) bytes."""
    return t.ne[0] % t.block == 0 and (t.ne[0] == t.block or t.nb[0] == t.size)


def _gemv_layout(op: str, src0: Tensor, src1: Tensor, dst: Tensor) -> int:
    """The GEMV's W row stride in W units (bytes for weights moved as bytes, else elements):
    0 when src0 is dense. Strided operands need dense rows (nb[0] the element or block size:
    a transposed view is refused) and a row stride the DMA reaches (2^20 words)."""
    for what, t in (("src0", src0), ("src1", src1), ("dst", dst)):
        if not t.is_dense() and not _rows_dense(t):
            raise UnsupportedError(
                f"{op}: {what} ({t.dtype} {list(t.ne)}, strides {list(t.nb)}) does not have "
                f"dense rows (nb[0] = {t.nb[0]}, the element is {t.size} bytes): a transposed "
                f"view is not walked"
            )
    if not dst.is_dense():
        # Every output row is written whole (the GEMV's shifted last round writes some twice,
        # with the same values): rows that overlap would race.
        n3, n2, n1 = dst.ne[3], dst.ne[2], dst.ne[1]
        starts = sorted(
            i1 * dst.nb[1] + i2 * dst.nb[2] + i3 * dst.nb[3]
            for i3 in range(n3)
            for i2 in range(n2)
            for i1 in range(n1)
        )
        if any(b - a < dst.ne[0] * dst.size for a, b in zip(starts, starts[1:])):
            raise UnsupportedError(f"{op}: dst's rows overlap (strides {list(dst.nb)})")
    if src0.is_dense() or src0.ne[1] == 1:
        return 0
    if src0.nb[1] == 0:
        raise UnsupportedError(f"{op}: src0's rows are one row repeated (nb[1] = 0)")
    if src0.nb[1] > MAX_STRIDE_WORDS * 4:
        raise UnsupportedError(
            f"{op}: src0's row stride {src0.nb[1]} bytes is beyond a DMA stride (2^20 words)"
        )
    return src0.nb[1] if src0.dtype in BYTE_WEIGHTS else src0.nb[1] // src0.size


def _plan_float_gemv(N: int, K: int, w: Tensor, x: Tensor, dst: Tensor, arch: Arch, products, **kw):
    """tiling.plan_gemv for weights w, activations x and output dst of float or integer types
    (mv.cc); bf16 weights against f32 x round x to bf16 on the cores (GemvPlan.x_bf16)."""
    x_bf16 = w.dtype == "bf16" and x.dtype == "f32"
    return plan_gemv(N, K, w.size, x.size, dst.size, arch, products, x_bf16=x_bf16, **kw)


def _check_aligned(op: str, products, src0: Tensor, src1: Tensor, dst: Tensor, w_row: int):
    """Float weights with a strided operand: every product's rows start on 32-bit words
    (block weights: their plan checks W's taps, x and y are f32; dense operands: the plan's
    whole-word rows)."""
    if all(t.is_dense() for t in (src0, src1, dst)):
        return
    w, x, y = src0.size, src1.size, dst.size
    if (w_row * w) % 4 or any((a * w) % 4 or (b * x) % 4 or (c * y) % 4 for a, b, c in products):
        raise UnsupportedError(
            f"{op}: a strided operand's row does not start on a 32-bit word (the DMA address "
            f"granularity): src0 {list(src0.nb)}, src1 {list(src1.nb)}, dst {list(dst.nb)}"
        )


def _check_f16_out(products, N: int, op: str = "MUL_MAT") -> None:
    """An f16 MUL_MAT output: every DMA of y starts on a 32-bit word. The rounds' rows are
    an even count (GemvPlan's nr), so N even and every product's row start even suffice: the
    shifted last round starts at N - block. The last word is never written past the row (the
    KV cache's next value would be overwritten)."""
    if N % 2 or any(y % 2 for _, _, y in products):
        raise UnsupportedError(
            f"{op}: an f16 output with rows of N={N} values, or rows starting mid-word, is "
            f"not written in whole 32-bit words (the DMA address granularity)"
        )


def _check_common(req: Request, strided: bool = False) -> tuple[registry.OpSpec, Arch]:
    """The op, arch, input count, op_params and types; dense operands unless `strided` (the
    op checks its strides itself)."""
    spec = registry.lookup(req.op)
    if spec is None:
        raise UnsupportedError(f"no design implements op {req.op}")
    if req.arch not in ARCHS:
        raise UnsupportedError(f"arch {req.arch!r} is not targeted (aie2, aie2p)")
    if len(req.inputs) != spec.inputs:
        raise RequestError(
            f"{req.op} takes {spec.inputs} input(s), the request has {len(req.inputs)}"
        )
    extra = req.op_params[spec.params :]
    if any(extra):
        raise UnsupportedError(
            f"{req.op} reads {spec.params} op_params word(s); the request has {list(req.op_params)}"
        )
    for i, t in enumerate(req.operands):
        if t.dtype not in spec.types:
            j = i - len(req.inputs)
            what = f"input {i}" if j < 0 else "output" if j == 0 else f"extra output {j - 1}"
            raise UnsupportedError(
                f"{req.op} does not take {t.dtype} ({what}); types: {', '.join(spec.types)}"
            )
        if not strided and not t.is_dense():
            raise UnsupportedError(f"{req.op}: strided operands are not supported")
    return spec, ARCHS[req.arch]


def _compute_type(types) -> str:
    floats = [t for t in types if t in FLOAT_TYPES]
    ints = [t for t in types if t in INT_TYPES]
    if floats and ints:
        raise UnsupportedError("float and integer operands do not mix")
    if ints:
        if len(set(ints)) != 1:
            raise UnsupportedError("integer operands must all have one type")
        return ints[0]
    return "f32" if "f32" in floats else "bf16"


def prepare_eltwise(req: Request) -> EltwiseSpec:
    spec, arch = _check_common(req)
    out = req.output
    types = [t.dtype for t in req.inputs] + [out.dtype]
    compute = _compute_type(types)
    a = req.inputs[0]
    if a.ne != out.ne:
        raise UnsupportedError(f"{spec.op}: input 0 must have the output's shape")
    n = out.nelements
    bcast, bcast_count = None, 0
    if spec.kind == "unary":
        kind, sizes, rows, resident = "unary", [a.size, out.size], ROWS_UNARY, 0
    else:
        b = req.inputs[1]
        if b.ne == out.ne:
            kind, sizes, rows, resident = "binary", [a.size, b.size, out.size], ROWS_BINARY, 0
        else:
            if not can_repeat(b.ne, out.ne):
                raise UnsupportedError(f"{spec.op}: input 1 cannot be repeated over input 0")
            bcast_count = pad_words(b.nelements, [b.size])
            resident = bcast_count * b.size
            if resident > BCAST_MAX_BYTES:
                raise UnsupportedError(
                    f"{spec.op}: the broadcast input has {b.nbytes} bytes, "
                    f"at most {BCAST_MAX_BYTES} are kept in a compute tile"
                )
            kind, sizes, rows = "bcast", [a.size, out.size], ROWS_BCAST
            bcast = Broadcast(out.ne, b.ne)
    n_moved = pad_words(n, sizes)
    plan = plan_eltwise(n_moved, sizes, arch, rows, resident)
    if plan is None:
        raise UnsupportedError(
            f"{spec.op}: no tiling of {n} elements ({'/'.join(types)}) in "
            f"{arch.l1_budget - resident} bytes of a compute tile"
        )
    params = tuple(req.op_params[: spec.params]) + (0,) * (spec.params - len(req.op_params))
    return EltwiseSpec(
        req,
        arch,
        spec.op,
        kind,
        tuple(types[:-1]),
        out.dtype,
        compute,
        plan,
        bcast,
        params,
        n_valid=n,
        bcast_count=bcast_count,
    )


GLU_TYPES = ("bf16", "f16", "f32")


def _row_strided(t: Tensor):
    """(row length, row stride, span) in elements when t's rows (dimension 0) are all one
    stride apart (a view of dimension-0 elements of a dense tensor, GLU's fused halves);
    None when t is dense; UnsupportedError otherwise."""
    if t.is_dense():
        return None
    size = t.size
    ne, nb = t.ne, t.nb
    if nb[0] != size or nb[1] % size or nb[1] < ne[0] * size:
        raise UnsupportedError("GLU: an input's elements are not contiguous within its rows")
    stride = nb[1] // size
    if (ne[2] > 1 and nb[2] != ne[1] * nb[1]) or (ne[3] > 1 and nb[3] != ne[2] * ne[1] * nb[1]):
        raise UnsupportedError("GLU: an input's rows are not evenly strided")
    rows = ne[1] * ne[2] * ne[3]
    span = (rows - 1) * stride + ne[0]
    return ne[0], stride, pad_words(span, [size])


def prepare_glu(req: Request) -> EltwiseSpec:
    """GLU ops: act(x) * g, x and g of the output's shape, each dense or a view whose rows are
    one stride apart (the backend passes the fused form's halves as two such views)."""
    spec = registry.lookup(req.op)
    arch = ARCHS.get(req.arch)
    if arch is None:
        raise UnsupportedError(f"arch {req.arch!r} is not targeted (aie2, aie2p)")
    if len(req.inputs) != 2:
        raise RequestError(f"{req.op} takes 2 inputs, the request has {len(req.inputs)}")
    if any(req.op_params):
        raise UnsupportedError(f"{req.op} reads no op_params; the request has {req.op_params}")
    out = req.output
    types = [t.dtype for t in req.inputs] + [out.dtype]
    for t in types:
        if t not in GLU_TYPES:
            raise UnsupportedError(f"{req.op} does not take {t}; types: {', '.join(GLU_TYPES)}")
    if not out.is_dense():
        raise UnsupportedError(f"{req.op}: the output must be contiguous")
    for t in req.inputs:
        if t.ne != out.ne:
            raise UnsupportedError(f"{req.op}: inputs must have the output's shape")
    walks = tuple(_row_strided(t) for t in req.inputs)
    n = out.nelements
    sizes = [t.size for t in req.inputs] + [out.size]
    row = out.ne[0]
    if any(walks):
        # Rows walked with a stride must be whole DMA words, and every column's share whole
        # rows (its walk starts at a row).
        for i, w in enumerate(walks):
            if w is not None and row_walk(w[0], w[1], sizes[i], 1) is None:
                raise UnsupportedError(
                    f"{req.op}: strided rows of {row} {types[i]} elements are not whole "
                    "32-bit words (or too long for one DMA walk)"
                )
        n_moved = n
        plan = plan_eltwise(n, sizes, arch, ROWS_BINARY, chunk_multiple=row)
    else:
        n_moved = pad_words(n, sizes)
        plan = plan_eltwise(n_moved, sizes, arch, ROWS_BINARY)
    if plan is None:
        raise UnsupportedError(
            f"{req.op}: no tiling of {n} elements ({'/'.join(types)}) in "
            f"{arch.l1_budget} bytes of a compute tile"
        )
    assert plan.n == n_moved
    return EltwiseSpec(
        req,
        arch,
        spec.op,
        "glu",
        tuple(types[:-1]),
        out.dtype,
        "f32",
        plan,
        None,
        n_valid=n,
        row_strides=walks,
    )


ROPE_SOURCE = "rope.cc"
# (x, output) pairs: one type, or f32 rotated into f16 rows (the backend fuses ROPE with the
# f16 KV-cache write, so the rotated K rows go straight into the cache).
ROPE_PAIRS = (("f32", "f32"), ("f16", "f16"), ("f32", "f16"))
# Workers per column: the memory tile splits x to R workers and joins R outputs (1 + R
# inputs, R + 1 outputs of its 6 + 6 channels); the positions go from the shim straight to
# the column's workers (one broadcast FIFO).
ROWS_ROPE = 2


def _f32(x: float) -> float:
    """x rounded to f32 (nearest even), as a Python float: every step of the constants below
    is rounded like ggml's f32 arithmetic (libm's f32 functions are taken as correctly
    rounded, which glibc's logf/powf are in nearly all cases)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _bits_f32(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


@dataclass(frozen=True)
class RopeSpec:
    """ROPE / ROPE_FF over rows of x (dimension 0), each with its position (positions[i2])."""

    request: Request
    arch: Arch
    op: str
    x: Tensor
    pos: Tensor
    ff: Tensor | None
    out: Tensor  # x's shape; x's type, or f16 from f32
    plan: EltwisePlan  # over rows: plan.n rows, tiles of plan.tile rows
    n_dims: int
    neox: bool
    constants: dict  # name -> f32 bit pattern (see kernels/rope.cc)
    yarn: bool

    @property
    def rows(self) -> int:
        return self.plan.n

    @property
    def ne0(self) -> int:
        return self.x.ne[0]

    @property
    def ff_count(self) -> int:
        return self.n_dims // 2

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: x (its span: a view's tokens
        may lie apart), positions, [ff,] output."""
        out = [(self.x.dtype, _span(self.x)), ("i32", self.pos.nelements)]
        if self.ff is not None:
            # Moved as 32-bit words through the positions' FIFO (i32 objects); the core
            # reads them back as f32.
            out.append(("i32", self.ff.nelements))
        out.append((self.out.dtype, self.out.nelements))
        return out

    @property
    def pos_table(self) -> int:
        """Positions a worker keeps for the whole dispatch: its column's i2 groups (ne3 == 1:
        a column's share is whole i2 groups) or all ne2 (ne3 > 1: whole i3 slices, each
        using positions[0 .. ne2)). The core takes a row's position from it by index
        ((row in the column) / ne1) % ne2, so nothing is repeated by the DMA."""
        ne1, ne2 = self.x.ne[1], self.x.ne[2]
        return min(ne2, self.plan.column_chunk // ne1)

    @property
    def table_words(self) -> int:
        """32-bit words of the one object of the positions' FIFO: ROPE_FF's n_dims/2
        frequency factors, then the positions table."""
        return (self.ff_count if self.ff is not None else 0) + self.pos_table

    def x_tap(self, start_row: int):
        """(offset, sizes, strides) over x: the rows of the column whose rows start at
        `start_row`. Dense x is one linear walk; a view whose tokens lie apart (phi3's Q and K
        of one attn_qkv product: each token's heads contiguous, tokens a product's column
        apart) walks its tokens, their heads, their elements."""
        x, chunk = self.x, self.plan.column_chunk
        ne0, ne1 = x.ne[0], x.ne[1]
        if x.is_dense():
            return start_row * ne0, (1, 1, 1, chunk * ne0), (0, 0, 0, 1)
        nb2 = x.nb[2] // x.size
        return (start_row // ne1) * nb2, (1, chunk // ne1, ne1, ne0), (0, nb2, ne0, 1)

    def pos_tap(self, start_row: int):
        """(offset, sizes, strides) over the positions: the table of the column whose rows
        start at `start_row`, one linear walk."""
        offset = start_row // self.x.ne[1] if self.x.ne[3] == 1 else 0
        return offset, (1, 1, 1, self.pos_table), (0, 0, 0, 1)

    def ff_tap(self):
        """(offset, sizes, strides) over the frequency factors: n_dims/2 words, linear."""
        return 0, (1, 1, 1, self.ff_count), (0, 0, 0, 1)

    @property
    def core(self) -> CoreSource:
        d = {
            "X_T": DTYPES[self.x.dtype].ctype,
            "OUT_T": DTYPES[self.out.dtype].ctype,
            "NE0": self.ne0,
            "NE1": self.x.ne[1],
            "NE2": self.x.ne[2],
            "TILE_ROWS": self.plan.tile,
            "TABLE_WORDS": self.table_words,
            "N_DIMS": self.n_dims,
            "NEOX": int(self.neox),
            "FF": int(self.ff is not None),
            "YARN": int(self.yarn),
        }
        d.update(self.constants)
        return CoreSource(ROPE_SOURCE, "rope.o", d)


def rope_constants(
    n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow
) -> dict:
    """ggml's per-kernel ROPE constants, in f32 as ggml computes them (ggml_rope_yarn_corr_dims,
    the theta scale, YaRN's magnitude scale), as f32 bit patterns."""
    f = _f32
    if not (freq_base > 0 and freq_scale > 0):
        raise UnsupportedError(f"ROPE: freq_base {freq_base}, freq_scale {freq_scale}")
    theta_scale = f(math.pow(freq_base, f(-2.0 / n_dims)))

    def logf(x):  # C's logf: -inf at 0 (n_ctx_orig = 0, as test-backend-ops passes), NaN below
        if x == 0:
            return -math.inf
        return math.nan if (x < 0 or math.isnan(x)) else f(math.log(x))

    def div(a, b):  # IEEE division (x / 0 = +-inf, 0 / 0 = NaN)
        if b == 0:
            if a == 0 or math.isnan(a):
                return math.nan
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return f(a / b)

    def corr_dim(n_rot):
        ratio = div(n_ctx_orig, f(f(n_rot * 2) * f(math.pi)))
        return div(f(n_dims * logf(ratio)), f(2 * logf(freq_base)))

    def rounded(x, fn):  # floorf / ceilf, infinities and NaN kept
        return x if (math.isinf(x) or math.isnan(x)) else float(fn(x))

    low, den = 0.0, 1.0  # the YaRN ramp is only used with ext_factor != 0
    if ext_factor != 0:
        # ggml's MAX(0, start) and MIN(n_dims - 1, end) (C macros: a NaN start or end is kept).
        start = rounded(corr_dim(beta_fast), math.floor)
        end = rounded(corr_dim(beta_slow), math.ceil)
        low = 0.0 if 0 > start else start
        high = float(n_dims - 1) if n_dims - 1 < end else end
        diff = high - low if not (math.isinf(high) and math.isinf(low)) else math.nan
        den = f(0.001) if f(0.001) > diff else f(diff)
        if not (math.isfinite(low) and math.isfinite(den)):
            raise UnsupportedError("ROPE: YaRN correction dims are not finite")
    mscale = attn_factor
    if ext_factor != 0:
        mscale = f(mscale * f(1 + f(f(0.1) * f(math.log(f(1 / freq_scale))))))
    return {
        "THETA_SCALE": _f32_bits(theta_scale),
        "FREQ_SCALE": _f32_bits(freq_scale),
        "EXT_FACTOR": _f32_bits(ext_factor),
        "MSCALE": _f32_bits(mscale),
        "CORR_LOW": _f32_bits(low),
        "CORR_DEN": _f32_bits(den),
    }


def prepare_rope(req: Request) -> RopeSpec:
    spec = registry.lookup(req.op)
    arch = ARCHS.get(req.arch)
    if arch is None:
        raise UnsupportedError(f"arch {req.arch!r} is not targeted (aie2, aie2p)")
    want = 3 if req.op == "ROPE_FF" else 2
    if len(req.inputs) != want:
        raise RequestError(f"{req.op} takes {want} inputs, the request has {len(req.inputs)}")
    x, pos = req.inputs[0], req.inputs[1]
    ff = req.inputs[2] if want == 3 else None
    out = req.output
    p = list(req.op_params) + [0] * (16 - len(req.op_params))
    if any(p[spec.params :]):
        raise UnsupportedError(f"{req.op}: op_params beyond word {spec.params} are not read")
    n_dims, mode, n_ctx_orig = p[1], p[2], p[4]
    (freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow) = (
        _bits_f32(b) for b in p[5:11]
    )
    if (x.dtype, out.dtype) not in ROPE_PAIRS or out.ne != x.ne:
        raise UnsupportedError(
            f"{req.op}: x {x.dtype} {list(x.ne)} to output {out.dtype} {list(out.ne)}: x and "
            "the output must be one shape, f32 or f16 of one type, or f32 to f16"
        )
    if pos.dtype != "i32" or pos.nelements < x.ne[2]:
        raise UnsupportedError(f"{req.op}: positions must be i32, one per row of dimension 2")
    if ff is not None and (ff.dtype != "f32" or ff.nelements < n_dims // 2):
        raise UnsupportedError(f"{req.op}: frequency factors must be f32 covering n_dims / 2")
    for t in req.inputs[1:] + (out,):
        if not t.is_dense():
            raise UnsupportedError(f"{req.op}: strided operands are not supported")
    # x may be a view whose tokens (dimension 2) lie apart, each token's rows contiguous.
    token_rows = x.ne[1] * x.ne[0] * x.size
    tokens_apart = (
        x.nb[0] == x.size
        and (x.ne[1] == 1 or x.nb[1] == x.ne[0] * x.size)
        and x.ne[3] == 1
        and x.nb[2] % 4 == 0
        and x.nb[2] >= token_rows
    )
    if not (x.is_dense() or tokens_apart):
        raise UnsupportedError(
            f"{req.op}: strided x other than tokens apart (each token's rows contiguous, one "
            "matrix) is not supported"
        )
    if mode not in (0, 2):
        raise UnsupportedError(f"{req.op}: mode {mode} (normal and NeoX only)")
    if n_dims <= 0 or n_dims % 2 or n_dims > x.ne[0]:
        raise UnsupportedError(f"{req.op}: n_dims {n_dims} for rows of {x.ne[0]}")
    for t in (x, out):
        if (t.ne[0] * t.size) % 4:
            raise UnsupportedError(
                f"{req.op}: rows of {t.ne[0]} {t.dtype} are not whole 32-bit words"
            )
    ne1, ne2, ne3 = x.ne[1], x.ne[2], x.ne[3]
    rows = ne1 * ne2 * ne3
    half_pad = -(-(n_dims // 2) // 16) * 16
    # Resident per core: rope.cc's arrays of HALF_PAD floats (the frequency factors, the
    # cos/sin cache, the theta table and two row staging buffers), and the one object of the
    # positions' FIFO held for the whole dispatch (ROPE_FF's factors and at most ne2
    # positions: the column's table is not known before the plan).
    table_max = (n_dims // 2 if ff is not None else 0) + ne2
    resident = 6 * 4 * half_pad + 4 * table_max
    # Every column's share: whole i2 groups (its table is a run of positions), or whole i3
    # slices (every slice indexes positions[0 .. ne2)).
    multiple = ne1 if ne3 == 1 else ne1 * ne2
    row_bytes = [x.ne[0] * x.size, x.ne[0] * out.size]
    plan = plan_eltwise(rows, row_bytes, arch, ROWS_ROPE, resident, chunk_multiple=multiple)
    if plan is None:
        raise UnsupportedError(
            f"{req.op}: no tiling of {rows} rows of {x.ne[0]} {x.dtype} in "
            f"{arch.l1_budget - resident} bytes of a compute tile"
        )
    consts = rope_constants(
        n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow
    )
    return RopeSpec(
        req,
        arch,
        req.op,
        x,
        pos,
        ff,
        out,
        plan,
        n_dims,
        mode == 2,
        consts,
        bool(ext_factor != 0),
    )


def _check_mul_mat_shapes(op: str, src0: Tensor, src1: Tensor, dst: Tensor) -> None:
    K, N = src0.ne[0], src0.ne[1]
    if src1.ne[0] != K:
        raise RequestError(f"{op}: src1 has {src1.ne[0]} columns, src0 {K}")
    M = src1.ne[1]
    if dst.ne != (N, M, src1.ne[2], src1.ne[3]):
        raise RequestError(f"{op}: dst shape {list(dst.ne)} is not [N, M, ne12, ne13]")
    if src1.ne[2] % src0.ne[2] or src1.ne[3] % src0.ne[3]:
        raise UnsupportedError(f"{op}: src0 cannot be broadcast over src1's batches")


def prepare_mul_mat_glu(req: Request) -> MatmulSpec:
    """MUL_MAT_<glu>: act(W_g . x) * (W_u . x), the GEMV design with two weight matrices per
    round (GemvPlan.glu) for every src1 row. Inputs: W_g, W_u (one dtype, ne and nb), x."""
    if len(req.inputs) == 3:
        gate, up, x = req.inputs
        if (gate.dtype, gate.ne, gate.nb) != (up.dtype, up.ne, up.nb):
            raise RequestError(
                f"{req.op}: the gate and up weights (inputs 0 and 1) must have one type, shape "
                f"and strides: {gate.dtype} {list(gate.ne)} {list(gate.nb)} and {up.dtype} "
                f"{list(up.ne)} {list(up.nb)}"
            )
    spec, arch = _check_common(req, strided=True)  # the input count, op_params, types
    gate, up, x = req.inputs
    dst = req.output
    combo = (gate.dtype, x.dtype, dst.dtype)
    if combo not in registry.MUL_MAT_GLU_COMBOS:
        raise UnsupportedError(
            f"{req.op} does not compile the type combination weights {combo[0]}, x "
            f"{combo[1]}, dst {combo[2]}"
        )
    _check_mul_mat_shapes(req.op, gate, x, dst)
    w_row = _gemv_layout(req.op, gate, x, dst)
    K, N, M = gate.ne[0], gate.ne[1], x.ne[1]
    products = _products(gate, x, dst)
    glu = spec.op[len("MUL_MAT_") :]
    if gate.dtype in BYTE_WEIGHTS:
        nx = rows_at_once(gate, x, dst)
        plan = None
        if nx is not None:
            # A few rows: each W tile decoded once for all of them (GemvPlan.nx).
            plan = plan_gemv_blocks(
                N, K, gate.block, gate.size, arch, products, glu=True, w_row=w_row, nx=nx
            )
        if plan is None:
            plan = plan_gemv_blocks(
                N, K, gate.block, gate.size, arch, products, glu=True, w_row=w_row
            )
        compute = "bf16"
    else:
        _check_aligned(req.op, products, gate, x, dst, w_row)
        plan = _plan_float_gemv(N, K, gate, x, dst, arch, len(products), glu=True, w_row=w_row)
        compute = gate.dtype
    if plan is None:
        raise UnsupportedError(
            f"{req.op}: no tiling of {gate.dtype} weights for M={M}, N={N}, K={K} "
            f"({len(products)} src1 rows) on {arch.name}: the GEMV needs rows of whole 32-bit "
            f"words in K (whole blocks; or a core's rows together) and at most "
            f"{MAX_TASKS_PER_CHANNEL} DMA tasks on the weights' shim channel (2 per round: "
            f"src1 rows x rounds x 2)"
        )
    return MatmulSpec(req, arch, gate, x, dst, plan, compute, glu=glu)


def _check_mul_mat_add_r(r: Tensor, dst: Tensor) -> None:
    """MUL_MAT_ADD's r: f32 rows of the product's N, repeated over the product's other
    dimensions as ggml's ADD repeats its second input, each row dense (any word-aligned row
    strides: the GEMV reads one run of a row per round)."""
    if any(dst.ne[d] % r.ne[d] for d in range(4)):
        raise RequestError(
            f"MUL_MAT_ADD: r {list(r.ne)} cannot be repeated over the product {list(dst.ne)}"
        )
    if r.ne[0] != dst.ne[0]:
        raise UnsupportedError(
            f"MUL_MAT_ADD: r's rows have {r.ne[0]} values, not the product's {dst.ne[0]} "
            f"(a row repeated along dimension 0 is not walked)"
        )
    if not _rows_dense(r) or any(b % DTYPES["f32"].size for b in r.nb):
        raise UnsupportedError(
            f"MUL_MAT_ADD: r (strides {list(r.nb)}) does not have dense f32 rows on 32-bit words"
        )


def prepare_mul_mat_add(req: Request) -> MatmulSpec:
    """MUL_MAT_ADD: W . x + r, MUL_MAT's GEMV for every src1 row with r's values for the
    round's rows behind x's K chunks (GemvPlan.add). Inputs: W, x, r; dst f32, contiguous."""
    _, arch = _check_common(req, strided=True)  # the input count, op_params, types
    w, x, r = req.inputs
    dst = req.output
    combo = (w.dtype, x.dtype, dst.dtype)
    if combo not in registry.MUL_MAT_ADD_COMBOS or r.dtype != "f32":
        raise UnsupportedError(
            f"MUL_MAT_ADD does not compile the type combination weights {combo[0]}, x "
            f"{combo[1]}, r {r.dtype}, dst {combo[2]}"
        )
    _check_mul_mat_shapes(req.op, w, x, dst)
    _check_mul_mat_add_r(r, dst)
    if not dst.is_dense():
        raise UnsupportedError(f"MUL_MAT_ADD: the output (strides {list(dst.nb)}) is strided")
    w_row = _gemv_layout(req.op, w, x, dst)
    K, N, M = w.ne[0], w.ne[1], x.ne[1]
    products = _products(w, x, dst, r)
    nx = rows_at_once(w, x, dst, r)
    if nx is not None:
        # A few rows: each W tile decoded once for all of them (GemvPlan.nx), r's rows added.
        plan = plan_gemv_blocks(N, K, w.block, w.size, arch, products, w_row=w_row, add=True, nx=nx)
        if plan is not None:
            return MatmulSpec(req, arch, w, x, dst, plan, "bf16", r=r)
    if M > 1 and all(t.is_dense() for t in (w, x)):
        # Where MUL_MAT's GEMM tiles the product it reads the weights once per M block; the
        # fused GEMV would read them once per src1 row, more than the ADD it saves costs.
        product = dataclasses.replace(req, op="MUL_MAT", inputs=(w, x))
        if not prepare_mul_mat(product, several_rows=False).gemv:
            raise UnsupportedError(
                f"MUL_MAT_ADD: M={M} dense rows take MUL_MAT's GEMM, which has no r epilogue; "
                f"the GEMM and the ADD run unfused"
            )
    if w.dtype in BYTE_WEIGHTS:
        plan = plan_gemv_blocks(N, K, w.block, w.size, arch, products, w_row=w_row, add=True)
        compute = "bf16"
    else:
        _check_aligned(req.op, [p[:3] for p in products], w, x, dst, w_row)
        plan = _plan_float_gemv(N, K, w, x, dst, arch, len(products), w_row=w_row, add=True)
        compute = w.dtype
    if plan is None:
        raise UnsupportedError(
            f"MUL_MAT_ADD: no tiling of {w.dtype} weights for M={M}, N={N}, K={K} "
            f"({len(products)} src1 rows) on {arch.name}: the GEMV needs rows of whole 32-bit "
            f"words in K (whole blocks; or a core's rows together), rounds of rows dividing N "
            f"whose r values fit one K chunk of x, and at most {MAX_TASKS_PER_CHANNEL} DMA "
            f"tasks on x's shim channel (src1 rows x rounds x 2 or 3)"
        )
    return MatmulSpec(req, arch, w, x, dst, plan, compute, r=r)


def prepare_rms_norm_mul_mat(
    req: Request, rope: RopeRows | None = None, what: str = "", columns: int | None = None
) -> MatmulSpec:
    """RMS_NORM_MUL_MAT(_<glu>): the projection(s) of x / sqrt(mean(x^2) + eps) * n, MUL_MAT's
    (MUL_MAT_<glu>'s) GEMV with n sent once ahead of x's rows and x normalised on the cores
    (GemvPlan.norm). Inputs: the weights (gate, up), x, n (RMS_NORM_MUL_MAT_BIAS: then one
    f32 row of N values added to each product, GemvPlan.bias); op_params[0] = eps. `rope`: the
    plan of RMS_NORM_MUL_MAT_ROPE(_FF)'s product (GemvPlan.rope), `what` its op name for the
    refusals. `columns`: the GEMV planned over at most that many of the array's columns (a
    group of RMS_NORM_QKV_ROPE's; whether the GEMV applies at all is still asked of the whole
    array)."""
    spec, arch = _check_common(req, strided=True)  # the input count, op_params, types
    *ws, x, n = req.inputs
    bias = None
    if req.op == "RMS_NORM_MUL_MAT_BIAS":
        *ws, x, n, bias = req.inputs
    dst = req.output
    op, w = what or req.op, ws[0]
    K = w.ne[0]
    plain = req.op in ("RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_BIAS")
    glu = "" if plain else req.op.removeprefix("RMS_NORM_MUL_MAT_")
    # An f16 output (RMS_NORM_MUL_MAT only: the backend's V projection into the f16 KV cache)
    # is MUL_MAT's: summed in the core's f32 stash, scaled by s, rounded once (mv_norm.h).
    outs = ("f32",) if glu else ("f32", "f16")
    if x.dtype != "f32" or n.dtype != "f32" or dst.dtype not in outs:
        raise UnsupportedError(
            f"{op} takes f32 x and n and an {' or '.join(outs)} output (the norm is computed "
            f"in f32); the request has x {x.dtype}, n {n.dtype}, output {dst.dtype}"
        )
    if n.ne != (K, 1, 1, 1):
        raise RequestError(f"{op}: n {list(n.ne)} is not one row of K = {K} values")
    if not n.is_dense():
        raise UnsupportedError(f"{op}: n (strides {list(n.nb)}) is strided")
    if bias is not None and (
        bias.dtype != "f32" or bias.ne != (w.ne[1], 1, 1, 1) or not bias.is_dense()
    ):
        raise UnsupportedError(
            f"{op}: the bias ({bias.dtype} {list(bias.ne)}) must be one dense f32 row of the "
            f"product's {w.ne[1]} values"
        )
    f16_out = dst.dtype == "f16"
    products = _products(w, x, dst)
    if f16_out:
        _check_f16_out(products, w.ne[1], op)
    # The projection without the norm: its checks (types, shapes, strides) and its plan. Whether
    # it takes the GEMV is asked of the f32 product (same element strides): MUL_MAT refuses an
    # f16 output the GEMM would take with its own reason.
    product = dataclasses.replace(req, op="MUL_MAT", inputs=(w, x), op_params=())
    f32_dst = Tensor("f32", dst.ne, tuple(b * 2 for b in dst.nb)) if f16_out else dst
    M = x.ne[1]
    gemm_refusal = UnsupportedError(
        f"{op}: M={M} dense rows take MUL_MAT's GEMM, which has no norm prologue; the "
        f"norm and the projections run unfused"
    )
    # A few rows of block-quantized weights: the GEMV of all of them at once (GemvPlan.nx),
    # planned by the product's planner first; otherwise a row at a time, where the GEMM would
    # not take the product.
    at_once = rows_at_once(w, x, dst) is not None
    f32_product = dataclasses.replace(product, output=f32_dst)

    def gemm_takes() -> bool:
        return not prepare_mul_mat(f32_product, several_rows=False).gemv

    if not at_once and gemm_takes():
        raise gemm_refusal
    if glu:
        product = dataclasses.replace(product, op=f"MUL_MAT_{glu}", inputs=(*ws, x))
        base = prepare_mul_mat_glu(product)
    else:
        base = prepare_mul_mat(product)
    if at_once and not (base.gemv and base.plan.nx > 1) and gemm_takes():
        raise gemm_refusal
    N, p = w.ne[1], base.plan
    if columns is not None:
        arch = dataclasses.replace(arch, columns=columns)

    def plan_norm(rope, nx=(1, 0, 0, 0)):
        if base.weight_bytes:
            return plan_gemv_blocks(
                N,
                K,
                w.block,
                w.size,
                arch,
                products,
                glu=bool(glu),
                w_row=p.w_row,
                y_size=dst.size,
                stash=f16_out,
                norm=True,
                rope=rope,
                bias=bias is not None,
                nx=nx,
            )
        return _plan_float_gemv(
            N,
            K,
            w,
            x,
            dst,
            arch,
            len(products),
            glu=bool(glu),
            w_row=p.w_row,
            stash=f16_out,
            norm=True,
            rope=rope,
            bias=bias is not None,
        )

    plan = None
    if p.nx > 1:
        plan = plan_norm(rope, (p.nx, p.x_row, p.y_row, 0))
    if plan is None:
        plan = plan_norm(rope)
    if plan is None and rope is not None and plan_norm(None) is not None:
        r = rope
        span = f"a head's {r.n_dims} rotated rows" if r.neox else "pairs of rows"
        raise UnsupportedError(
            f"{op}: no GEMV plan of {M} token(s), {N} product rows (heads of {r.head}) and "
            f"K={K} of {w.dtype} weights on {arch.name} keeps {span} on one core in every "
            f"round with the rotation's tables, n and the GEMV's buffers in the core's memory"
        )
    if plan is None:
        raise UnsupportedError(
            f"{op}: no tiling of {w.dtype} weights for M={M}, N={N}, K={K} on {arch.name} with "
            f"n kept on every core: K = {K} too large for the core's memory with the GEMV's "
            f"buffers ({arch.l1_budget} bytes), or beyond {MAX_TASKS_PER_CHANNEL} DMA tasks"
            + (", in whole rounds with the bias kept" if bias is not None else "")
        )
    return dataclasses.replace(base, request=req, plan=plan, n=n, bias=bias)


# ggml's ROPE op_params words ahead of RMS_NORM_MUL_MAT_ROPE(_FF)'s eps (word 11); the head
# norm's eps follows (word 12, RMS_NORM_MUL_MAT_HEAD_NORM_ROPE(_FF)).
ROPE_PARAMS = 11
HEAD_NORM_EPS = ROPE_PARAMS + 1


def prepare_rms_norm_mul_mat_rope(req: Request, columns: int | None = None) -> MatmulSpec:
    """RMS_NORM_MUL_MAT_ROPE(_FF): RMS_NORM_MUL_MAT's product y = W . (rms_norm(x) * n) of each
    x row (token), viewed as [D, H] and rotated as ggml's ROPE (ROPE_FF) by the token's
    position: the GEMV with the norm's prologue and a rotation epilogue (GemvPlan.rope). Inputs
    W [K, M], x f32 [K, T], n f32 [K], pos i32 [>= T], (_FF) ff f32 [>= n_dims/2]; output f32 or
    f16 [D, H, T] dense, D * H = M. op_params: ROPE's 11 words, then eps (word 11). `columns`:
    as prepare_rms_norm_mul_mat's.

    RMS_NORM_MUL_MAT_HEAD_NORM_ROPE(_FF) (qwen3's Q and K): each head of the product is
    RMS-normalised and multiplied by the head norm's weights (the last input, f32 [D]; eps in
    word 12) before the rotation, as ggml's RMS_NORM then MUL by a row of D do. Every core's
    rows of a round are then whole heads (RopeRows.head_norm).

    RMS_NORM_MUL_MAT_BIAS_ROPE(_FF) (qwen2's Q and K): one row of M values (the last input, f32
    [M]) added to the product before the rotation, as RMS_NORM_MUL_MAT_BIAS adds it."""
    op = req.op
    _check_common(req, strided=True)  # the input count, op_params (12 or 13 words), types
    head_norm = "_HEAD_NORM_" in op
    w, x, n, pos, *rest = req.inputs
    bias = rest.pop() if "_BIAS_" in op else None
    hn = rest.pop() if head_norm else None
    ff = rest[0] if rest else None
    dst = req.output
    p = list(req.op_params) + [0] * (HEAD_NORM_EPS + 1 - len(req.op_params))
    n_dims, mode, n_ctx_orig = p[1], p[2], p[4]
    (freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow) = (
        _bits_f32(b) for b in p[5:ROPE_PARAMS]
    )
    M, T = w.ne[1], x.ne[1]
    if w.ne[2:] != (1, 1) or x.ne[2:] != (1, 1) or not x.is_dense():
        raise UnsupportedError(
            f"{op}: W {list(w.ne)} and x {list(x.ne)} (strides {list(x.nb)}) must be one "
            f"matrix and dense rows of tokens (no batches)"
        )
    if dst.dtype not in ("f32", "f16") or not dst.is_dense():
        raise UnsupportedError(
            f"{op}: the output ({dst.dtype}, strides {list(dst.nb)}) must be dense f32 or f16"
        )
    D, H = dst.ne[0], dst.ne[1]
    if dst.ne[2:] != (T, 1) or D * H != M:
        raise UnsupportedError(
            f"{op}: the output {list(dst.ne)} is not [D, H, {T}, 1] with D * H = M = {M} (the "
            f"product's rows of each of the {T} x rows as heads)"
        )
    if mode not in (0, 2):
        raise UnsupportedError(f"{op}: rope mode {mode} (normal and NeoX only)")
    if n_dims <= 0 or n_dims % 2 or n_dims > D:
        raise UnsupportedError(f"{op}: n_dims {n_dims} for heads of {D}")
    if pos.dtype != "i32" or not pos.is_dense() or pos.nelements < T:
        raise UnsupportedError(f"{op}: positions must be dense i32, one per x row ({T})")
    if ff is not None and (ff.dtype != "f32" or not ff.is_dense() or ff.nelements < n_dims // 2):
        raise UnsupportedError(
            f"{op}: frequency factors must be dense f32 covering n_dims / 2 = {n_dims // 2}"
        )
    if hn is not None and (hn.dtype != "f32" or not hn.is_dense() or hn.ne != (D, 1, 1, 1)):
        raise UnsupportedError(
            f"{op}: the head norm's weights ({hn.dtype} {list(hn.ne)}) must be dense f32 [{D}]"
        )
    consts = rope_constants(
        n_dims, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow
    )
    ff_words = n_dims // 2 if ff is not None else 0
    rows = RopeRows(D, n_dims, mode == 2, T, ff_words, head_norm)
    norm = dataclasses.replace(
        req,
        op="RMS_NORM_MUL_MAT" if bias is None else "RMS_NORM_MUL_MAT_BIAS",
        inputs=(w, x, n) if bias is None else (w, x, n, bias),
        op_params=(p[ROPE_PARAMS],),
        output=Tensor.dense(dst.dtype, (M, T, 1, 1)),
    )
    base = prepare_rms_norm_mul_mat(norm, rope=rows, what=op, columns=columns)
    rope = MvRope(
        pos, ff, consts, bool(ext_factor != 0), p[ROPE_PARAMS], hn, p[HEAD_NORM_EPS] if hn else 0
    )
    return dataclasses.replace(base, request=req, rope=rope)


def gemm_blocks_plan(src0: Tensor, src1: Tensor, dst: Tensor, arch: Arch) -> GemmPlan:
    """The GEMM plan of dense f16 / block-quantized weights (moved as bytes, decoded by
    mmq.cc) times f32 or bf16 src1, or UnsupportedError saying why there is none (the caller then
    takes the GEMV)."""
    K, N, M = src0.ne[0], src0.ne[1], src1.ne[1]
    r, s, t = arch.mmul["bf16"]
    qb, bb = src0.block, src0.size
    step = math.lcm(qb, 16, s)
    what = f"the {src0.dtype} GEMM (M={M}, N={N}, K={K}, {arch.name})"
    if M < r:
        raise UnsupportedError(f"{what}: M is below the microkernel's {r} rows")
    if N < max(8, t):
        raise UnsupportedError(f"{what}: N is below the smallest N tile, {max(8, t)}")
    if K % step:
        raise UnsupportedError(
            f"{what}: K is not a multiple of a K step ({step}: whole {qb}-value blocks, "
            f"16-value decode groups, the microkernel's s = {s})"
        )
    batches = _batches(src0, src1, dst)
    plan = plan_gemm_blocks(M, N, K, arch.mmul["bf16"], qb, bb, arch, batches, src1.size)
    if plan is None:
        row = K // qb * bb
        raise UnsupportedError(
            f"{what}: no tile fits: K steps of whole blocks (at most 512 values) whose "
            f"weight bytes are whole 32-bit words along rows of {row} bytes (or, K whole, a "
            f"tile's rows together), every weight offset word-aligned, the core's "
            f"{arch.l1_budget} bytes (A tiles double-buffered, weight and C tiles once or "
            f"twice, t x k decoded bf16), the memory tile's {arch.memtile_bytes} bytes, at most "
            f"{MAX_TASKS_PER_CHANNEL} DMA tasks per shim channel (batches x M blocks x N "
            f"task chunks)"
        )
    return plan


def prepare_mul_mat(req: Request, several_rows: bool = True) -> MatmulSpec:
    """MUL_MAT's spec. `several_rows` False leaves out the GEMV of several src1 rows at once
    (GemvPlan.nx): the fused GEMVs, which take their rows one at a time, ask whether the GEMM
    would take their product."""
    _, arch = _check_common(req, strided=True)
    src0, src1 = req.inputs
    dst = req.output
    combo = (src0.dtype, src1.dtype, dst.dtype)
    if combo not in registry.MUL_MAT_COMBOS:
        raise UnsupportedError(
            "MUL_MAT does not compile the type combination src0 {}, src1 {}, dst {}".format(*combo)
        )
    _check_mul_mat_shapes("MUL_MAT", src0, src1, dst)
    # Strided operands (views, permuted tensors) with dense rows take the GEMV, which walks
    # their strides; the GEMM takes dense operands only.
    w_row = _gemv_layout("MUL_MAT", src0, src1, dst)
    dense = all(t.is_dense() for t in (src0, src1, dst))
    K, N, M = src0.ne[0], src0.ne[1], src1.ne[1]
    batches = src1.ne[2] * src1.ne[3]
    w, x, y = src0.size, src1.size, dst.size
    products = _products(src0, src1, dst)
    f16_out = dst.dtype == "f16"
    if f16_out:
        _check_f16_out(products, N)

    def gemm_spec(plan: GemmPlan, compute: str) -> MatmulSpec:
        if f16_out:
            # The GEMM sums into its f32 C tile; an f16 one would round every K step.
            raise UnsupportedError(
                f"MUL_MAT: an f16 output is written by the GEMV only; M={M} dense rows of "
                f"{src0.dtype} weights take the GEMM (f32 output): the MUL_MAT and the f16 "
                f"copy run unfused"
            )
        return MatmulSpec(req, arch, src0, src1, dst, plan, compute)

    if src0.dtype in BYTE_WEIGHTS:

        def byte_gemv(**options):
            return _faster_gemv(
                arch,
                len(products),
                lambda shared_x: plan_gemv_blocks(
                    *(N, K, src0.block, src0.size, arch, products),
                    w_row=w_row,
                    y_size=y,
                    shared_x=shared_x,
                    **options,
                ),
            )

        # A few src1 rows (a decode step of several tokens) of block-quantized weights: one
        # GEMV whose cores decode each W tile once for all of them (GemvPlan.nx), the weights
        # streamed once over every column, where the GEMM's M block would leave most cores idle.
        if src1.dtype == "bf16":
            # bf16 activations (a prompt's, produced so for its GEMMs): the GEMM only.
            if M > 1 and dense:
                return gemm_spec(gemm_blocks_plan(src0, src1, dst, arch), "bf16")
            raise UnsupportedError(
                f"MUL_MAT: bf16 activations with {src0.dtype} weights take the GEMM only "
                f"(dense, M > 1; here M={M}); the GEMV reads f32 x"
            )
        nx = rows_at_once(src0, src1, dst)
        if several_rows and nx is not None:
            plan = byte_gemv(nx=nx)
            if plan is not None:
                return MatmulSpec(req, arch, src0, src1, dst, plan, "bf16")
        # M > 1 with dense operands: the GEMM decoding the weights' blocks on the cores
        # (mmq.cc), which streams the weights once per M block instead of once per src1 row.
        # Where it does not tile, every src1 row is one GEMV over the weights as ggml stores
        # them (mvq.cc), as for M = 1 and strided operands.
        gemm_refusal = ""
        if M > 1 and dense:
            try:
                plan = gemm_blocks_plan(src0, src1, dst, arch)
            except UnsupportedError as e:
                gemm_refusal = f"; {e}"
            else:
                return gemm_spec(plan, "bf16")
        elif M > 1:
            gemm_refusal = "; the GEMM takes dense operands only"
        plan = byte_gemv(stash=f16_out)
        if plan is None:
            raise UnsupportedError(
                f"MUL_MAT: no tiling of {src0.dtype} weights for M={M}, N={N}, K={K} on "
                f"{arch.name}: the GEMV needs a row's chunk of K whole blocks in whole 32-bit "
                f"words (or a core's rows together, K whole), every weight offset "
                f"word-aligned, and at most {MAX_TASKS_PER_CHANNEL} DMA tasks (batches x src1 "
                f"rows x rounds){gemm_refusal}"
            )
        return MatmulSpec(req, arch, src0, src1, dst, plan, "bf16")
    if M > 1 and dense:
        compute = "bf16" if src0.dtype in FLOAT_TYPES else src0.dtype
        mmul = arch.mmul[compute]
        # An f16 output asks whether the f32 product would take the GEMM (then it is refused).
        c_size = DTYPES["f32"].size if f16_out else y
        plan = plan_gemm(M, N, K, mmul, x, w, c_size, arch, batches)
        if plan is not None:
            return gemm_spec(plan, compute)
    # One src1 row, strided operands, or a GEMM that does not tile (M below the microkernel
    # rows, K not a multiple of a K step): one matrix-vector product per src1 row.
    _check_aligned("MUL_MAT", products, src0, src1, dst, w_row)
    plan = _faster_gemv(
        arch,
        batches * M,
        lambda shared_x: _plan_float_gemv(
            N, K, src0, src1, dst, arch, batches * M, w_row=w_row, stash=f16_out, shared_x=shared_x
        ),
    )
    if plan is None:
        r, s, t = arch.mmul["bf16" if src0.dtype in FLOAT_TYPES else src0.dtype]
        raise UnsupportedError(
            f"MUL_MAT: no tiling for M={M}, N={N}, K={K} ({combo[0]}, {combo[1]}) on "
            f"{arch.name}: the GEMV needs whole 32-bit words in K of src0 and src1 and at "
            f"most {MAX_TASKS_PER_CHANNEL} DMA tasks (batches x src1 rows); the GEMM "
            f"M >= {r}, N >= {max(t, 8)}, K a multiple of {max(s, 8)}"
        )
    return MatmulSpec(req, arch, src0, src1, dst, plan, src0.dtype)


def _faster_gemv(arch: Arch, products: int, plan_of):
    """MUL_MAT's GEMV: the plan of x on every column's channel or of x shared by all cores
    (GemvPlan.shared_x: W on the other 2 C - 1 shim channels), whichever `gemv_cycles` finds
    faster; `plan_of(shared_x)` plans one or the other (None where none fits)."""
    plans = [p for p in (plan_of(False), plan_of(True)) if p is not None]
    if not plans:
        return None
    return min(plans, key=lambda p: gemv_cycles(p, products, arch))


def prepare(req: Request):
    """The spec of the design implementing `req`; raises UnsupportedError otherwise."""
    spec = registry.lookup(req.op)
    if spec is None:
        raise UnsupportedError(f"no design implements op {req.op}")
    if "n_kv_step" in req.extra and not spec.run_time_n_kv:
        raise UnsupportedError(f"{req.op} takes no run-time n_kv (n_kv_step)")
    if spec.kind == "mul_mat":
        return prepare_mul_mat(req)
    if spec.kind == "mul_mat_glu":
        return prepare_mul_mat_glu(req)
    if spec.kind == "mul_mat_add":
        return prepare_mul_mat_add(req)
    if spec.kind == "rms_norm_mul_mat":
        return prepare_rms_norm_mul_mat(req)
    if spec.kind == "rms_norm_mul_mat_rope":
        return prepare_rms_norm_mul_mat_rope(req)
    if spec.kind == "rms_norm_qkv_rope":
        # plans_qkv imports this module: imported here, not at the top.
        from .plans_qkv import prepare_qkv

        return prepare_qkv(req)
    if spec.kind == "rows":
        return prepare_rows(req)
    if spec.kind == "glu":
        return prepare_glu(req)
    if spec.kind == "rope":
        return prepare_rope(req)
    if spec.kind == "flash_attn":
        # plans_fa imports this module: imported here, not at the top.
        from .plans_fa import prepare_flash_attn

        return prepare_flash_attn(req)
    if spec.kind == "reduce":
        # plans_reduce imports this module: imported here, not at the top.
        from .plans_reduce import prepare_reduce

        return prepare_reduce(req)
    if spec.kind == "rms_norm_ffn":
        # plans_ffn imports this module: imported here, not at the top.
        from .plans_ffn import prepare_rms_norm_ffn

        return prepare_rms_norm_ffn(req)
    if spec.kind == "mul_mat_add_rms_norm_ffn":
        # plans_ffn imports this module: imported here, not at the top.
        from .plans_ffn import prepare_mul_mat_add_rms_norm_ffn

        return prepare_mul_mat_add_rms_norm_ffn(req)
    if spec.kind == "decode_layer":
        # plans_decode imports this module: imported here, not at the top.
        from .plans_decode import prepare_decode_layer

        return prepare_decode_layer(req)
    if spec.kind in ("flash_attn_ffn", "flash_attn_glu"):
        # plans_fa_ffn imports this module: imported here, not at the top.
        from .plans_fa_ffn import prepare_flash_attn_ffn, prepare_flash_attn_glu

        if spec.kind == "flash_attn_glu":
            return prepare_flash_attn_glu(req)
        return prepare_flash_attn_ffn(req)
    if spec.kind in ("copy", "copy_rows", "set_rows"):
        # plans_copy imports this module (CoreSource): imported here, not at the top.
        from .plans_copy import prepare_copy, prepare_copy_rows, prepare_set_rows

        prepare = {"copy": prepare_copy, "copy_rows": prepare_copy_rows}
        return prepare.get(spec.kind, prepare_set_rows)(req)
    return prepare_eltwise(req)


# ------------------------------------------------------------------------- row ops


def alibi_slopes(n_head: int, max_bias: float) -> list[float]:
    """ggml's ALiBi slope of every head (soft_max_ext with max_bias > 0): m0^(h+1) for the
    first n_head_log2 heads, m1^(2(h - n_head_log2) + 1) after, each rounded to f32 as
    ggml's powf results are (the powers here are exact to double, so the f32 slopes agree
    with powf's within its last bit)."""
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = _f32(2.0 ** _f32(-max_bias / n_head_log2))
    m1 = _f32(2.0 ** _f32(-(max_bias / 2.0) / n_head_log2))
    out = []
    for h in range(n_head):
        if h < n_head_log2:
            out.append(_f32(m0 ** (h + 1)))
        else:
            out.append(_f32(m1 ** (2 * (h - n_head_log2) + 1)))
    return out


@dataclass(frozen=True)
class MaskTask:
    """One DMA task of the SOFT_MAX mask: `rows` consecutive mask rows from element
    `offset`, `row_stride` elements apart, the first `length` elements of each."""

    offset: int
    rows: int
    row_stride: int


@dataclass(frozen=True)
class XTask:
    """One DMA task of x's channel: `count` elements from `offset` of x, or (`sink`)
    `count` copies of sinks[offset] (a run of rows of one head, at most MAX_REPEAT: the
    copies are the task's repeat)."""

    offset: int
    count: int
    sink: bool = False


# DMA tasks one round of a row design may have in flight on a shim tile (tiling's
# SHIM_GROUP_TASKS, one kept for the resident operand).
ROUND_TASKS = SHIM_GROUP_TASKS - 1


@dataclass(frozen=True)
class Round:
    """Fills of consecutive objects of one column and the drain of their rows."""

    x: list
    mask: list
    first_row: int
    rows: int

    @property
    def tasks(self) -> int:
        return len(self.x) + len(self.mask) + 1


def _merge(tasks, adjacent, join):
    out = []
    for t in tasks:
        if out and adjacent(out[-1], t):
            out[-1] = join(out[-1], t)
        else:
            out.append(t)
    return out


@dataclass(frozen=True)
class RowSpec:
    """A row design request: every row (dimension 0) of input 0 computed on its own.

    Operands: x [L, ne1, ne2, ne3] (f32), then SOFT_MAX's mask (f32 or f16) and sinks
    (f32), or RMS_NORM_MUL's weight row (f32), or RMS_NORM_MUL_ADD's residual r (f32 of x's
    shape, in `mask`: its rows travel as a mask's) and weight row, then the output (x's
    shape, f32, RMS_NORM_MUL's also bf16; or one i32 per row for ARGMAX).
    """

    request: Request
    arch: Arch
    op: str
    x: Tensor
    mask: Tensor | None
    sinks: Tensor | None
    weight: Tensor | None
    out: Tensor
    plan: RowPlan
    params: tuple[int, ...]
    slopes: tuple[int, ...] = ()  # ALiBi slope bits per head (SOFT_MAX with max_bias > 0)
    mask_split: tuple[int, int] | None = None  # (a, b): a mask row as a x b elements

    @property
    def length(self) -> int:
        return self.x.ne[0]

    @property
    def out_row(self) -> int:
        """Output elements per row."""
        return 1 if self.op == "ARGMAX" else self.length

    def first_row(self, column: int) -> int:
        return column * self.plan.rows_per_column

    @property
    def x_row_extra(self) -> int:
        """f32 values an x object carries per row after its B rows: the row's sink."""
        return 1 if self.sinks is not None else 0

    def _block_tasks(self, r0: int) -> tuple[list[XTask], list[MaskTask]]:
        """The fills of the object of rows r0 .. r0 + B: x (its rows, then with sinks the
        sink of each row: one task repeating sinks[head] per run of rows of one head; ggml's
        head is x's index i2) and the mask rows."""
        B, L = self.plan.block, self.length
        ne1, ne2 = self.x.ne[1], self.x.ne[2]
        xs = [XTask(r0 * L, B * L)]
        if self.sinks is not None:
            # A run's copies come from the shim task's repeat count (its only dimension that
            # may have stride 0), so a run longer than MAX_REPEAT rows takes several tasks.
            r = r0
            while r < r0 + B:
                n = min(ne1 - r % ne1, r0 + B - r, MAX_REPEAT)
                xs.append(XTask((r // ne1) % ne2, n, sink=True))
                r += n
        ms = []
        if self.mask is not None:
            m = self.mask.ne
            r = r0
            while r < r0 + B:
                i1, i2, i3 = r % ne1, (r // ne1) % ne2, r // (ne1 * ne2)
                n = min(ne1 - i1, r0 + B - r)
                block = (i3 % m[3]) * m[2] + (i2 % m[2])
                ms.append(MaskTask((block * m[1] + i1) * m[0], n, m[0]))
                r += n
        return xs, ms

    def rounds(self, column: int) -> list[Round]:
        """`column`'s runtime sequence in rounds: the fills of consecutive objects and the
        drain of their rows, at most ROUND_TASKS DMA tasks on the column's shim tile (its
        buffer descriptors), awaited before the next round. Adjacent walks are merged, so
        without sinks a column is usually one round."""
        p = self.plan
        first = self.first_row(column)
        rounds: list[Round] = []
        cur: Round | None = None
        for k in range(p.iterations):
            r0 = first + k * p.block
            xs, ms = self._block_tasks(r0)
            if cur is not None:
                merged = Round(
                    _merge(
                        cur.x + xs,
                        lambda a, b: not a.sink and not b.sink and a.offset + a.count == b.offset,
                        lambda a, b: XTask(a.offset, a.count + b.count),
                    ),
                    _merge(
                        cur.mask + ms,
                        lambda a, b: (
                            a.row_stride == b.row_stride
                            and a.offset + a.rows * a.row_stride == b.offset
                        ),
                        lambda a, b: MaskTask(a.offset, a.rows + b.rows, a.row_stride),
                    ),
                    cur.first_row,
                    cur.rows + p.block,
                )
                if merged.tasks <= ROUND_TASKS:
                    cur = merged
                    continue
                rounds.append(cur)
            cur = Round(xs, ms, r0, p.block)
            if cur.tasks > ROUND_TASKS:
                raise UnsupportedError(
                    f"{self.op}: {cur.tasks} DMA tasks for one object of {p.block} rows"
                )
        rounds.append(cur)
        return rounds

    @property
    def core(self) -> CoreSource:
        p = self.plan
        d = {
            f"GGML_OP_{self.op}": 1,
            "ROW_LEN": self.length,
            "ROW_BLOCK": p.block,
            "ROWS_NE1": self.x.ne[1],
            "ROWS_NE2": self.x.ne[2],
        }
        for i, v in enumerate(self.params):
            d[f"OP_P{i}"] = v
        if self.mask is not None:
            d["HAS_MASK"] = 1
            d["MASK_F16"] = int(self.mask.dtype == "f16")
        if self.sinks is not None:
            d["HAS_SINKS"] = 1
        if self.slopes:
            d["ALIBI_SLOPES"] = ",".join(f"0x{b:08x}u" for b in self.slopes)
        if self.out.dtype == "bf16":
            d["OUT_BF16"] = 1
        return CoreSource(ROWS_SOURCE, "rows.o", d)

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: the inputs, then the output."""
        ins = [self.x, self.mask, self.sinks, self.weight]
        return [(t.dtype, t.nelements) for t in ins if t is not None] + [
            (self.out.dtype, self.out.nelements)
        ]


def prepare_rows(req: Request) -> RowSpec:
    spec, arch = _check_common(req)
    op = spec.op
    x, out = req.inputs[0], req.output
    if x.dtype != "f32":
        raise UnsupportedError(f"{op}: input 0 must be f32")
    length = x.ne[0]
    rows = x.nelements // max(length, 1)
    if length < 1 or rows < 1:
        raise UnsupportedError(f"{op}: empty rows")
    mask = sinks = weight = None
    rest = list(req.inputs[1:])
    if op in ("SOFT_MAX_MASK", "SOFT_MAX_MASK_SINKS"):
        mask = rest.pop(0)
    if op in ("SOFT_MAX_SINKS", "SOFT_MAX_MASK_SINKS"):
        sinks = rest.pop(0)
    if op == "RMS_NORM_MUL_ADD":
        # The residual's rows travel as a mask's would (beside x's, one task per run of
        # rows), then the weight row, resident.
        mask = rest.pop(0)
        if mask.dtype != "f32" or mask.ne != x.ne:
            raise UnsupportedError(f"{op}: r must be f32 of x's shape {list(x.ne)}")
    if op in ("RMS_NORM_MUL", "RMS_NORM_MUL_ADD"):
        weight = rest.pop(0)
    if op == "ARGMAX":
        if out.dtype != "i32" or out.nelements != rows:
            raise UnsupportedError("ARGMAX: one i32 index per f32 row")
    elif op == "RMS_NORM_MUL" and out.dtype == "bf16" and out.ne == x.ne:
        # A prompt's activations written for its GEMMs (the backend's bf16 activations).
        if length % 2:
            raise UnsupportedError(f"{op}: bf16 rows of an odd length ({length}) are not words")
    elif out.dtype != "f32" or out.ne != x.ne:
        raise UnsupportedError(f"{op}: the output must be f32 of input 0's shape")
    streamed = length * 4 + (4 if op == "ARGMAX" else length * out.size)
    resident = 0
    mask_split = None
    if mask is not None:
        m = mask.ne
        ok = (
            mask.dtype in ("f32", "f16")
            and m[0] >= length
            and m[1] >= x.ne[1]
            and x.ne[2] % m[2] == 0
            and x.ne[3] % m[3] == 0
        )
        if not ok:
            raise UnsupportedError(f"{op}: the mask must cover x's rows (ggml broadcasting)")
        if mask.dtype == "f16" and (length % 2 or m[0] % 2):
            raise UnsupportedError(
                f"{op}: an f16 mask needs rows of an even length ({length} of {m[0]}): "
                "its rows are moved as whole 32-bit words"
            )
        mask_split = split_run(length, mask.size)
        if mask_split is None:
            raise UnsupportedError(f"{op}: mask rows of {length} elements cannot be walked")
        streamed += length * mask.size
    if sinks is not None:
        if sinks.dtype != "f32" or sinks.nelements < x.ne[2]:
            raise UnsupportedError(f"{op}: sinks must be f32, one per head (x's dimension 2)")
        # Each row's sink rides behind the rows of its x object (a compute tile has two
        # input channels: x and the mask).
        streamed += 4
    if weight is not None:
        if weight.dtype != "f32" or weight.nelements != length:
            raise UnsupportedError(f"{op}: the weight must be one f32 row of {length}")
        resident += weight.nbytes
    # One column is kept for the shim channel that broadcasts the resident operand to every
    # worker; RMS_NORM_MUL_ADD's weight row comes on each column's second channel instead (a
    # core has two input channels, x and r), as its first object, the row repeated to the
    # object's rows by the task's repeat count (ROW_BLOCK_MAX rows, within MAX_REPEAT).
    weight_in_r = op == "RMS_NORM_MUL_ADD"
    max_columns = arch.columns - (1 if resident and not weight_in_r else 0)
    plan = plan_rows(length, rows, streamed, resident, max_columns, arch)
    # Smaller objects when one object's rows need more DMA tasks than a round may have (rows
    # of many heads, each with its own sink run).
    while plan is not None and sinks is not None and plan.block > 1:
        try:
            for c in range(plan.columns):
                RowSpec(req, arch, op, x, mask, sinks, weight, out, plan, ()).rounds(c)
            break
        except UnsupportedError:
            plan = plan_rows(length, rows, streamed, resident, max_columns, arch, plan.block - 1)
    if plan is None:
        raise UnsupportedError(
            f"{op}: a row of {length} elements ({streamed} bytes over its operands) does not "
            f"fit in {arch.l1_budget - resident} bytes of a compute tile"
        )
    params = tuple(req.op_params[: spec.params]) + (0,) * (spec.params - len(req.op_params))
    slopes: tuple[int, ...] = ()
    if op.startswith("SOFT_MAX"):
        max_bias = _bits_f32(params[1])
        if max_bias > 0:
            slopes = tuple(_f32_bits(s) for s in alibi_slopes(x.ne[2], max_bias))
    result = RowSpec(req, arch, op, x, mask, sinks, weight, out, plan, params, slopes, mask_split)
    rounds = [result.rounds(c) for c in range(plan.columns)]
    n = max(sum(len(r.x) for r in rs) for rs in rounds)
    if mask is not None:
        n = max(n, max(sum(len(r.mask) for r in rs) for rs in rounds))
    if n > MAX_TASKS_PER_CHANNEL:
        raise UnsupportedError(
            f"{op}: {n} DMA tasks on a shim channel, at most {MAX_TASKS_PER_CHANNEL}"
        )
    return result
