"""Plans of the copy designs (designs/copy_ops.py): DUP, CPY, CONT and SET_ROWS.

Pure Python like plans.py: a request the designs cannot build raises UnsupportedError
(exit status 2) before any tool runs.

* DUP / CPY / CONT: input 0's elements copied into the output in logical (row-major) order,
  converting between f32, f16 and bf16. The element-wise dataflow of designs/_eltwise.py
  (C columns x R workers, a column's share a contiguous range of the logical order); an
  operand that is not dense (a permuted or sliced view) is read or written by the shim DMA
  along its strides, its dimensions merged where they are contiguous, at most four
  dimensions within the shim's limits per column.
* SET_ROWS: the destination (the KV cache) is streamed through the cores and written back,
  each of its tiles copied and overwritten by the source rows whose index falls in it. The
  indices are data, and a runtime sequence's DMA addresses are fixed when the design is
  built, so a row cannot be sent straight to its place: the cost is the destination's size,
  not the rows written.
"""

import dataclasses
import math
from dataclasses import dataclass

from .archs import ARCHS, Arch
from .dtypes import DMA_WORD, DTYPES
from .errors import RequestError, UnsupportedError
from .plans import CoreSource
from .request import Request, Tensor
from .tiling import MAX_REPEAT, MAX_TASKS_PER_CHANNEL, MAX_WRAP, EltwisePlan, plan_eltwise

COPY_TYPES = ("bf16", "f16", "f32")
COPY_SOURCE = "copy.cc"
# Workers per column: the memory tile splits the input to R workers and joins R outputs.
ROWS_COPY = 4
# Largest stride of a shim DMA dimension, in 32-bit words.
MAX_STRIDE_WORDS = 1 << 20


def merged_dims(t: Tensor) -> list[tuple[int, int]]:
    """t's (size, stride in elements) per dimension, outermost first, dimensions of one
    element dropped and adjacent ones merged where the outer steps over the inner exactly."""
    dims = []
    for n, b in zip(reversed(t.ne), reversed(t.nb)):
        if n == 1:
            continue
        dims.append((n, b // t.size))
    out: list[tuple[int, int]] = []
    for n, s in dims:
        if out and out[-1][1] == n * s:
            out[-1] = (out[-1][0] * n, s)
        else:
            out.append((n, s))
    return out or [(1, 1)]


def shim_walk_ok(sizes, strides, elem_bytes: int) -> bool:
    """Whether a 4-dimensional access pattern (outermost first, in elements) is one shim DMA
    task: whole 32-bit words, two wrap-limited inner dimensions, a repeat count of at most
    MAX_REPEAT, strides within the DMA's range, no stride 0 but the repeat's (mirrors the
    emulator's check_walk)."""
    # Only the repeat (the outermost of four) may re-read data: a stride-0 address dimension
    # (a view with nb = 0, e.g. an expanded one) cannot be programmed.
    if any(n > 1 and s == 0 for n, s in list(zip(sizes, strides))[-3:]):
        return False
    contiguous, acc = True, 1
    for n, s in zip(reversed(sizes), reversed(strides)):
        if n != 1 and s != acc:
            contiguous = False
        acc *= n
    if contiguous:
        return (acc * elem_bytes) % DMA_WORD == 0
    inner_n, inner_s = sizes[-1], strides[-1]
    if elem_bytes < DMA_WORD and (inner_s != 1 or (inner_n * elem_bytes) % DMA_WORD):
        return False
    if any((s * elem_bytes) % DMA_WORD for s in strides[:-1]):
        return False
    hw_sizes = list(reversed(sizes))
    hw_strides = list(reversed(strides))
    if elem_bytes < DMA_WORD:
        hw_sizes[0] = hw_sizes[0] * elem_bytes // DMA_WORD
    hw_strides = [s * elem_bytes // DMA_WORD if s else 0 for s in hw_strides]
    for i, (n, s) in enumerate(zip(hw_sizes, hw_strides)):
        if s > MAX_STRIDE_WORDS:
            return False
        if i == 3 and n > MAX_REPEAT:
            return False
        if i < 2 and s != 0 and n > MAX_WRAP:
            return False
    return True


def _split_inner(dims, elem_bytes):
    """dims with a contiguous innermost run longer than a wrap split in two (the DMA's
    innermost dimension wraps after MAX_WRAP words), when a dimension is free for it."""
    n, s = dims[-1]
    per_word = max(1, DMA_WORD // elem_bytes)
    if s != 1 or n * elem_bytes // DMA_WORD <= MAX_WRAP or len(dims) >= 4:
        return dims
    for w in sorted((d for d in range(1, n + 1) if n % d == 0), reverse=True):
        if w % per_word == 0 and w * elem_bytes // DMA_WORD <= MAX_WRAP:
            return dims[:-1] + [(n // w, w), (w, 1)]
    return dims


@dataclass(frozen=True)
class Walk:
    """How one operand's elements in logical order are read or written: linear from element
    0 (dense), or along `dims` ((size, stride) outermost first, merged)."""

    dims: tuple  # () for a dense operand
    elem_bytes: int
    span: int  # elements from the first to one past the last

    def tap(self, start: int, length: int):
        """(offset, sizes, strides) of the logical elements [start, start + length)."""
        if not self.dims:
            return start, (1, 1, 1, length), (0, 0, 0, 1)
        dims = list(self.dims)
        inner = 1
        for n, _ in dims[1:]:
            inner *= n
        # A column's share is whole outermost slices (see CopySpec): the outer dimension
        # counts them.
        outer_stride = dims[0][1]
        sizes = [length // inner] + [n for n, _ in dims[1:]]
        strides = [outer_stride] + [s for _, s in dims[1:]]
        while len(sizes) < 4:
            sizes.insert(0, 1)
            strides.insert(0, 0)
        return (start // inner) * outer_stride, tuple(sizes), tuple(strides)

    @property
    def slice(self) -> int:
        """Logical elements of one outermost slice (a column's share is whole slices)."""
        inner = 1
        for n, _ in self.dims[1:]:
            inner *= n
        return inner


def _walk(t: Tensor) -> Walk | None:
    """The walk of t, None when it is dense; UnsupportedError when the DMA cannot walk it."""
    if t.is_dense():
        return Walk((), t.size, t.nelements)
    dims = _split_inner(merged_dims(t), t.size)
    if len(dims) > 4:
        raise UnsupportedError(
            f"a {t.dtype} view of shape {list(t.ne)} and strides {list(t.nb)} needs "
            f"{len(dims)} DMA dimensions, a shim task has 4"
        )
    span = 1 + sum((n - 1) * s for n, s in dims)
    return Walk(tuple(dims), t.size, span)


@dataclass(frozen=True)
class CopySpec:
    request: Request
    arch: Arch
    op: str
    src: Tensor
    dst: Tensor
    plan: EltwisePlan  # over the n elements in logical order
    src_walk: Walk
    dst_walk: Walk

    @property
    def kind(self) -> str:
        return "copy"

    @property
    def core(self) -> CoreSource:
        d = {
            "IN_T": DTYPES[self.src.dtype].ctype,
            "OUT_T": DTYPES[self.dst.dtype].ctype,
            "IN_F16": int(self.src.dtype == "f16"),
            "OUT_F16": int(self.dst.dtype == "f16"),
            "COPY_ELEMENTS": 1,
        }
        return CoreSource(COPY_SOURCE, "copy.o", d)

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: the source, the output (their
        spans: a view's elements from the first to one past the last)."""
        return [(self.src.dtype, self.src_walk.span), (self.dst.dtype, self.dst_walk.span)]

    def fill_tap(self, start: int, length: int):
        return self.src_walk.tap(start, length)

    def drain_tap(self, start: int, length: int):
        return self.dst_walk.tap(start, length)

    def drains(self, column: int) -> list[tuple[int, tuple]]:
        """Column `column`'s drains: (output, tap) pairs, its share of the logical order."""
        chunk = self.plan.column_chunk
        return [(0, self.drain_tap(column * chunk, chunk))]


@dataclass(frozen=True)
class CopyRowsSpec:
    """CPY_ROWS: CPY of input 0's rows into as many one-row outputs; the copy of the rows into
    a dense [ne0, T] (`copy`, whose dataflow and fills it is) with each column's share drained
    into the outputs it spans."""

    copy: CopySpec
    rows: int

    def __getattr__(self, name):
        return getattr(self.copy, name)

    @property
    def kind(self) -> str:
        return "copy_rows"

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """The source's span, then each output row."""
        row = (self.copy.dst.dtype, self.copy.dst.ne[0])
        return [self.copy.sequence[0]] + [row] * self.rows

    def drains(self, column: int) -> list[tuple[int, tuple]]:
        """Column `column`'s share of the rows' elements, one drain per row it spans: (output,
        linear tap within that row)."""
        chunk, ne0 = self.plan.column_chunk, self.copy.dst.ne[0]
        start, end = column * chunk, (column + 1) * chunk
        out = []
        while start < end:
            row, at = divmod(start, ne0)
            length = min(end, (row + 1) * ne0) - start
            out.append((row, (at, (1, 1, 1, length), (0, 0, 0, 1))))
            start += length
        return out


def _arch(req: Request) -> Arch:
    arch = ARCHS.get(req.arch)
    if arch is None:
        raise UnsupportedError(f"arch {req.arch!r} is not targeted (aie2, aie2p)")
    return arch


def prepare_copy(req: Request) -> CopySpec:
    arch = _arch(req)
    if len(req.inputs) != 1:
        raise RequestError(f"{req.op} takes 1 input, the request has {len(req.inputs)}")
    if any(req.op_params):
        raise UnsupportedError(f"{req.op} reads no op_params; the request has {req.op_params}")
    src, dst = req.inputs[0], req.output
    for t in (src, dst):
        if t.dtype not in COPY_TYPES:
            raise UnsupportedError(f"{req.op} does not take {t.dtype}; types: f32, f16, bf16")
    n = dst.nelements
    if src.nelements != n:
        raise RequestError(f"{req.op}: {src.nelements} elements into {n}")
    # No element is moved twice or padded: the output may share its first and last DMA words
    # with other data (a copy into a view), which a padded word would overwrite.
    if (n * src.size) % DMA_WORD or (n * dst.size) % DMA_WORD:
        raise UnsupportedError(
            f"{req.op}: {n} elements of {src.dtype} into {dst.dtype} are not whole 32-bit words"
        )
    sw, dw = _walk(src), _walk(dst)
    multiple = math.lcm(sw.slice if sw.dims else 1, dw.slice if dw.dims else 1)
    if n % multiple:
        raise UnsupportedError(f"{req.op}: the two layouts share no slice of the elements")
    sizes = [src.size, dst.size]
    # The most columns whose shares are walks the shim can take (a strided operand's share is
    # whole outer slices, at most MAX_REPEAT of them when the walk has four dimensions).
    for columns in sorted((c for c in range(1, arch.columns + 1)), reverse=True):
        if (n // multiple) % columns:
            continue
        plan = plan_eltwise(n, sizes, arch, ROWS_COPY, chunk_multiple=n // columns)
        if plan is None:
            continue
        chunk = plan.column_chunk
        ok = all(
            shim_walk_ok(w.tap(c * chunk, chunk)[1], w.tap(c * chunk, chunk)[2], w.elem_bytes)
            and (w.tap(c * chunk, chunk)[0] * w.elem_bytes) % DMA_WORD == 0
            for w in (sw, dw)
            for c in range(plan.columns)
        )
        if ok:
            return CopySpec(req, arch, req.op, src, dst, plan, sw, dw)
    raise UnsupportedError(
        f"{req.op}: no tiling of {n} elements ({src.dtype} {list(src.ne)} strides "
        f"{list(src.nb)} into {dst.dtype} {list(dst.ne)} strides {list(dst.nb)}) whose "
        "column shares the shim DMA can walk (whole 32-bit words, 4 dimensions, wraps of "
        f"at most {MAX_WRAP} words, a repeat count of at most {MAX_REPEAT})"
    )


# The most rows of one CPY_ROWS (the backend's scatter::MAX_ROWS_APART).
MAX_ROWS_APART = 8


def prepare_copy_rows(req: Request) -> CopyRowsSpec:
    """CPY_ROWS: the rows of input 0 [ne0, T] (2 <= T <= MAX_ROWS_APART, dense rows) into T
    outputs [ne0] of one type (`output`, then extra_outputs)."""
    outputs = (req.output, *req.extra_outputs)
    if len(req.inputs) != 1:
        raise RequestError(f"{req.op} takes 1 input, the request has {len(req.inputs)}")
    src = req.inputs[0]
    T, ne0 = src.ne[1], src.ne[0]
    if src.ne[2:] != (1, 1) or src.nb[0] != src.size:
        raise UnsupportedError(f"{req.op}: input 0 {list(src.ne)} is not one matrix of dense rows")
    if len(outputs) != T:
        raise RequestError(f"{req.op}: {T} rows into {len(outputs)} outputs")
    if not 2 <= T <= MAX_ROWS_APART:
        raise UnsupportedError(f"{req.op}: {T} rows; a kernel copies 2 to {MAX_ROWS_APART}")
    dst = outputs[0]
    for o in outputs:
        if o.dtype != dst.dtype or o.ne != (ne0, 1, 1, 1) or not o.is_dense():
            raise RequestError(f"{req.op}: the outputs must be dense rows [{ne0}] of one type")
    rows = Tensor.dense(dst.dtype, (ne0, T, 1, 1))
    copy = prepare_copy(dataclasses.replace(req, op="CPY", output=rows, extra_outputs=()))
    spec = CopyRowsSpec(copy, T)
    # Every drain whole 32-bit words of its row.
    for c in range(copy.plan.columns):
        for _, (at, sizes, _) in spec.drains(c):
            if (at * dst.size) % DMA_WORD or (sizes[-1] * dst.size) % DMA_WORD:
                raise UnsupportedError(
                    f"{req.op}: a column's share of {T} rows of {ne0} {dst.dtype} is not whole "
                    "32-bit words of each row"
                )
    return spec


SET_ROWS_SRC = ("f32", "f16")
SET_ROWS_IDX = ("i32", "i64")
# Objects per FIFO of the streamed destination (double-buffered in and out).
SET_ROWS_DEPTH = 2


@dataclass(frozen=True)
class SetRowsSpec:
    """SET_ROWS over slabs (i2, i3) of the destination: dst [ne0, ne1, ne2, ne3] dense, src
    [ne0, r, ne2, ne3], idx [r, n11, n12]. Column c streams rows [c * rows_per_column, (c +
    1) * rows_per_column) of every slab in tiles of `tile_rows` rows; beside them, per slab,
    one side object: the slab's r indices, then its r source rows, as bytes."""

    request: Request
    arch: Arch
    src: Tensor
    idx: Tensor
    dst: Tensor
    columns: int
    tile_rows: int

    @property
    def kind(self) -> str:
        return "set_rows"

    @property
    def ne0(self) -> int:
        return self.dst.ne[0]

    @property
    def r(self) -> int:
        return self.src.ne[1]

    @property
    def rows_per_column(self) -> int:
        return self.dst.ne[1] // self.columns

    @property
    def tiles_per_slab(self) -> int:
        return self.rows_per_column // self.tile_rows

    @property
    def slabs(self) -> list[tuple[int, int]]:
        return [(i2, i3) for i3 in range(self.dst.ne[3]) for i2 in range(self.dst.ne[2])]

    @property
    def idx_bytes(self) -> int:
        return self.r * self.idx.size

    @property
    def side_elems(self) -> int:
        """Elements (of the source's type) of one side object: indices, then rows."""
        return (self.idx_bytes + self.r * self.ne0 * self.src.size) // self.src.size

    @property
    def tile_elems(self) -> int:
        return self.tile_rows * self.ne0

    @property
    def core(self) -> CoreSource:
        d = {
            "SET_ROWS": 1,
            "SRC_T": DTYPES[self.src.dtype].ctype,
            "DST_T": DTYPES[self.dst.dtype].ctype,
            "SRC_F16": int(self.src.dtype == "f16"),
            "DST_F16": int(self.dst.dtype == "f16"),
            "IDX_I64": int(self.idx.dtype == "i64"),
        }
        return CoreSource(COPY_SOURCE, "copy.o", d)

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: the source rows and the
        indices (both moved as the source's type: the side objects are bytes), the output."""
        st = self.src.dtype
        src_span = _extent(self.src) // self.src.size
        idx_span = _extent(self.idx) // self.src.size
        return [(st, src_span), (st, idx_span), (self.dst.dtype, self.dst.nelements)]

    def idx_tap(self, i2: int, i3: int):
        """The slab's indices, as elements of the source's type."""
        n11, n12 = self.idx.ne[1], self.idx.ne[2]
        off = ((i2 % n11) * self.idx.nb[1] + (i3 % n12) * self.idx.nb[2]) // self.src.size
        return off, (1, 1, 1, self.idx_bytes // self.src.size), (0, 0, 0, 1)

    def src_tap(self, i2: int, i3: int):
        """The slab's r source rows (dense, or rows `nb[1]` apart)."""
        s = self.src
        off = (i2 * s.nb[2] + i3 * s.nb[3]) // s.size
        row_stride = s.nb[1] // s.size
        if self.r == 1 or row_stride == self.ne0:
            return off, (1, 1, 1, self.r * self.ne0), (0, 0, 0, 1)
        return off, (1, 1, self.r, self.ne0), (0, 0, row_stride, 1)

    def dst_tap(self, i2: int, i3: int, column: int):
        """Column `column`'s rows of the slab, linear (the destination is dense)."""
        first = (i3 * self.dst.ne[2] + i2) * self.dst.ne[1] + column * self.rows_per_column
        return first * self.ne0, (1, 1, 1, self.rows_per_column * self.ne0), (0, 0, 0, 1)


def _extent(t: Tensor) -> int:
    """Bytes from t's first element to one past its last."""
    return t.size + sum((n - 1) * b for n, b in zip(t.ne, t.nb))


def prepare_set_rows(req: Request) -> SetRowsSpec:
    arch = _arch(req)
    if len(req.inputs) != 2:
        raise RequestError(f"SET_ROWS takes 2 inputs, the request has {len(req.inputs)}")
    if any(req.op_params):
        raise UnsupportedError(f"SET_ROWS reads no op_params; the request has {req.op_params}")
    src, idx = req.inputs
    dst = req.output
    if src.dtype not in SET_ROWS_SRC or idx.dtype not in SET_ROWS_IDX:
        raise UnsupportedError(
            f"SET_ROWS of {src.dtype} rows by {idx.dtype} indices (f32/f16 rows, i32/i64 indices)"
        )
    if dst.dtype not in COPY_TYPES:
        raise UnsupportedError(f"SET_ROWS into {dst.dtype} (f32, f16, bf16)")
    ne0, r = dst.ne[0], src.ne[1]
    n11, n12 = idx.ne[1], idx.ne[2]
    shapes = (
        src.ne[0] == ne0
        and src.ne[2] == dst.ne[2]
        and src.ne[3] == dst.ne[3]
        and idx.ne[0] == r
        and idx.ne[3] == 1
        and n11 > 0
        and n12 > 0
        and dst.ne[2] % n11 == 0
        and dst.ne[3] % n12 == 0
    )
    if not shapes:
        raise RequestError("SET_ROWS shapes do not agree")
    if not dst.is_dense():
        raise UnsupportedError("SET_ROWS: the destination must be contiguous")
    if idx.nb[0] != idx.size or src.nb[0] != src.size:
        raise UnsupportedError("SET_ROWS: the rows and the indices must be dense in dimension 0")
    s = src.size
    if (r * idx.size) % DMA_WORD or (r * ne0 * s) % DMA_WORD:
        raise UnsupportedError(
            f"SET_ROWS: {r} rows of {ne0} {src.dtype} are not whole 32-bit words"
        )
    for nb in (src.nb[1:], idx.nb[1:]):
        if any(b % DMA_WORD for b in nb):
            raise UnsupportedError("SET_ROWS: strides of whole 32-bit words only")
    if r > 1 and src.nb[1] == 0:
        # One row read r times: a stride-0 address dimension, which a BD cannot encode.
        raise UnsupportedError("SET_ROWS: source rows that are one row (nb[1] = 0)")
    if r > 1 and src.nb[1] != ne0 * s and (ne0 * s) % DMA_WORD:
        raise UnsupportedError("SET_ROWS: strided source rows must be whole 32-bit words")
    side_bytes = r * idx.size + r * ne0 * s
    budget = arch.l1_budget - side_bytes  # the side object is single-buffered
    row_bytes = ne0 * dst.size
    slabs = dst.ne[2] * dst.ne[3]
    if 2 * slabs > MAX_TASKS_PER_CHANNEL:
        raise UnsupportedError(f"SET_ROWS: {slabs} slabs, {2 * slabs} DMA tasks on a channel")
    for columns in range(arch.columns, 0, -1):
        if dst.ne[1] % columns:
            continue
        per_col = dst.ne[1] // columns
        if (per_col * row_bytes) % DMA_WORD:
            continue
        best = None
        for t in range(1, per_col + 1):
            if per_col % t or (t * row_bytes) % DMA_WORD:
                continue
            if 2 * SET_ROWS_DEPTH * t * row_bytes > budget or t * ne0 > 4096:
                continue
            best = t
        if best is not None:
            return SetRowsSpec(req, arch, src, idx, dst, columns, best)
    raise UnsupportedError(
        f"SET_ROWS: no tiling of {dst.ne[1]} destination rows of {ne0} {dst.dtype} with "
        f"{side_bytes} bytes of source rows and indices resident per slab in "
        f"{arch.l1_budget} bytes of a compute tile"
    )
