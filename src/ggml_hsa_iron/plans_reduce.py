"""Whole-tensor reductions to one scalar: COUNT_EQUAL and CROSS_ENTROPY_LOSS (pure Python).

Both ops read two operands of one shape and write one value, so the work splits into
partial results that are combined at the end (`designs/reduce_ops.py`):

* C columns (one worker each, compute row 2) take consecutive, equal shares of the
  operands (COUNT_EQUAL: any element count; CROSS_ENTROPY_LOSS: whole rows), streamed from
  their shim tile in objects (chunks) of T elements of each operand;
* each worker reduces its share to one partial (COUNT_EQUAL: an i64 count; the loss: the f32
  sum of its rows' sum(labels * log_softmax(logits)), the softmax over a row computed online
  across the row's chunks: running max, rescaled sum of exponentials);
* the memory tile of column 0 joins the C partials into one object, which a second worker
  (column 0, compute row 3) combines into the output: the sum (COUNT_EQUAL), or the sum
  times -1/rows (CROSS_ENTROPY_LOSS, as ggml-cpu scales it).

The memory tile of column 0 receives the C partials on its input channels (6), so at most 6
columns take part; the column count divides the shares exactly (rows for the loss), and the
chunk T divides a column's share (a row for the loss), so no element is read twice or padded.
"""

from dataclasses import dataclass

from .archs import Arch
from .errors import UnsupportedError
from .plans import CoreSource, _check_common
from .request import Request, Tensor
from .tiling import divisors

REDUCE_SOURCE = "reduce.cc"
# Input (S2MM) DMA channels of the memory tile that joins the partials.
MEMTILE_INPUTS = 6
# Elements of each operand per object: 2 operands x 2 buffers x 8 KiB = 32 KiB of the
# compute tile's 64, the rest for the stack and the small partial FIFO.
MAX_CHUNK = 2048
# COUNT_EQUAL's partial counts and the element count are kept below 2^31 so that every
# index and count on the cores fits an int32 (the i64 result is summed in 64 bits).
MAX_ELEMENTS = (1 << 31) - 1


@dataclass(frozen=True)
class ReducePlan:
    columns: int  # C workers, one per column
    chunk: int  # T elements of each operand per object
    per_column: int  # elements of each operand a column reduces
    depth: int = 2

    @property
    def iterations(self) -> int:
        """Objects (chunks) each worker consumes."""
        return self.per_column // self.chunk


def plan_reduce(elements: int, unit: int, max_columns: int, max_chunk: int = MAX_CHUNK):
    """`elements` split over the most columns (at most `max_columns`) whose shares are whole
    `unit`s (rows), in the largest chunks dividing the unit (or the share when unit is 1)."""
    units = elements // unit
    columns = max(d for d in divisors(units) if d <= max_columns)
    per_column = elements // columns
    span = unit if unit > 1 else per_column
    chunk = max(d for d in divisors(span) if d <= max_chunk)
    return ReducePlan(columns, chunk, per_column)


@dataclass(frozen=True)
class ReduceSpec:
    request: Request
    arch: Arch
    op: str
    a: Tensor  # COUNT_EQUAL: input 0; CROSS_ENTROPY_LOSS: the logits
    b: Tensor  # input 1; the labels
    out: Tensor
    plan: ReducePlan
    row: int  # CROSS_ENTROPY_LOSS: the row length (ne0); COUNT_EQUAL: 1

    @property
    def rows(self) -> int:
        return self.a.nelements // self.row

    @property
    def in_type(self) -> str:
        return self.a.dtype

    @property
    def part_type(self) -> str:
        """The partials' element type: the output's (i64 counts, f32 sums)."""
        return self.out.dtype

    def share(self, column: int) -> tuple[int, int]:
        """(offset, elements) of each operand column `column` reduces."""
        return column * self.plan.per_column, self.plan.per_column

    @property
    def core(self) -> CoreSource:
        p = self.plan
        d = {f"GGML_OP_{self.op}": 1, "CHUNK": p.chunk, "N_PARTS": p.columns}
        if self.op == "CROSS_ENTROPY_LOSS":
            d["ROW_CHUNKS"] = self.row // p.chunk
            d["TOTAL_ROWS"] = self.rows
        return CoreSource(REDUCE_SOURCE, "reduce.o", d)

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: a, b, then the output."""
        return [(self.a.dtype, self.a.nelements), (self.b.dtype, self.b.nelements)] + [
            (self.out.dtype, 1)
        ]


def prepare_reduce(req: Request) -> ReduceSpec:
    spec, arch = _check_common(req)
    op = spec.op
    a, b, out = req.inputs[0], req.inputs[1], req.output
    in_type, out_type = ("i32", "i64") if op == "COUNT_EQUAL" else ("f32", "f32")
    if a.dtype != in_type or b.dtype != in_type or out.dtype != out_type:
        raise UnsupportedError(
            f"{op}: inputs {in_type} and an {out_type} output expected, got "
            f"{a.dtype}, {b.dtype} -> {out.dtype}"
        )
    if a.ne != b.ne:
        raise UnsupportedError(f"{op}: the inputs differ in shape ({list(a.ne)}, {list(b.ne)})")
    if out.nelements != 1:
        raise UnsupportedError(f"{op}: the output must be one element, it has {out.nelements}")
    n = a.nelements
    if n < 1:
        raise UnsupportedError(f"{op}: empty inputs")
    if n > MAX_ELEMENTS:
        raise UnsupportedError(f"{op}: {n} elements, at most {MAX_ELEMENTS} (int32 counts)")
    row = a.ne[0] if op == "CROSS_ENTROPY_LOSS" else 1
    plan = plan_reduce(n, row, min(arch.columns, MEMTILE_INPUTS))
    return ReduceSpec(req, arch, op, a, b, out, plan, row)
