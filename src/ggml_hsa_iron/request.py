"""The compile request of protocol 1 and the canonical kernel name.

A request (written by the backend into a file) describes one kernel::

    {"name": "add-bf16_8x3-f32_8-bf16_8x3", "arch": "aie2p", "op": "ADD",
     "op_params": [],
     "inputs": [{"type": "bf16", "ne": [8, 3, 1, 1], "nb": [2, 16, 48, 48]},
                {"type": "f32",  "ne": [8, 1, 1, 1], "nb": [4, 32, 32, 32]}],
     "output":  {"type": "bf16", "ne": [8, 3, 1, 1], "nb": [2, 16, 48, 48]}}

`ne` is ggml's elements per dimension (dimension 0 first), `nb` its byte
strides. The kernel files are named after `name`, which must be a plain file
name; the canonical name (`canonical_name`) is what the backend looks for.

An op with several outputs (`registry.OpSpec.outputs`: RMS_NORM_QKV_ROPE(_FF)'s Q, K and V)
takes the first as `output` and the others, in order, as `"extra_outputs": [tensor, ...]`; the
kernel's operands are the inputs, `output`, then the extra outputs. Any other op refuses the
field.
"""

import json
import re
from dataclasses import dataclass, field

from .dtypes import DTYPES
from .errors import RequestError
from .registry import lookup

# A name is used as a file name: no separators, no leading dot, bounded length.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
MAX_CANONICAL = 160


@dataclass(frozen=True)
class Tensor:
    """One operand: element type, elements and byte strides per dimension."""

    dtype: str
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]

    @property
    def size(self) -> int:
        """Bytes per element, or per block for the block-quantized types."""
        return DTYPES[self.dtype].size

    @property
    def block(self) -> int:
        return DTYPES[self.dtype].block

    @property
    def nelements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.nelements // self.block * self.size

    @staticmethod
    def dense(dtype: str, ne) -> "Tensor":
        ne = tuple(int(n) for n in ne)
        size, block = DTYPES[dtype].size, DTYPES[dtype].block
        nb = [size, size * (ne[0] // block)]
        for d in range(2, 4):
            nb.append(nb[-1] * max(ne[d - 1], 1))
        return Tensor(dtype, ne, tuple(nb))

    def is_dense(self) -> bool:
        """Contiguous row-major layout (dimensions of size 1 may have any stride); rows of
        whole blocks for the block-quantized types (ggml's layout: nb[0] is a block's bytes)."""
        if self.ne[0] % self.block:
            return False
        expect = self.size
        for d, (n, s) in enumerate(zip(self.ne, self.nb)):
            if n != 1 and s != expect:
                return False
            expect *= max(n, 1) // self.block if d == 0 else max(n, 1)
        return True

    def name_part(self) -> str:
        dims = 1
        for i, n in enumerate(self.ne):
            if n != 1:
                dims = i + 1
        part = f"{self.dtype.lower()}_{'x'.join(str(n) for n in self.ne[:dims])}"
        if not self.is_dense():
            part += "_s" + "x".join(str(s) for s in self.nb)
        return part


@dataclass(frozen=True)
class Request:
    name: str
    arch: str
    op: str
    op_params: tuple[int, ...]
    inputs: tuple[Tensor, ...]
    output: Tensor
    # The outputs after `output` (the request's "extra_outputs"), in order.
    extra_outputs: tuple[Tensor, ...] = ()
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        """Every output: `output`, then the extra outputs."""
        return (self.output, *self.extra_outputs)

    @property
    def operands(self) -> tuple[Tensor, ...]:
        """The kernel's operands in dispatch order: the inputs, then the outputs."""
        return (*self.inputs, *self.outputs)

    def canonical_name(self) -> str:
        return canonical_name(self.op, self.op_params, self.inputs, self.output, self.extra_outputs)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def canonical_name(op: str, op_params, inputs, output, extra_outputs=()) -> str:
    """`<op>-<operand>...-<output>-<extra output>...[-p<params>]`, as the backend computes
    it."""
    parts = [op.lower()]
    parts += [t.name_part() for t in inputs]
    parts.append(output.name_part())
    parts += [t.name_part() for t in extra_outputs]
    params = list(op_params)
    while params and params[-1] == 0:
        params.pop()
    if params:
        parts.append("p" + "_".join(f"{p & 0xFFFFFFFF:x}" for p in params))
    name = "-".join(parts)
    if len(name) <= MAX_CANONICAL:
        return name
    suffix = f"-h{fnv1a64(name.encode()):016x}"
    return name[: MAX_CANONICAL - len(suffix)] + suffix


def _int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{what} must be an integer, got {value!r}")
    return value


def _tensor(obj, what: str) -> Tensor:
    if not isinstance(obj, dict):
        raise RequestError(f"{what} must be an object, got {obj!r}")
    dtype = obj.get("type")
    if dtype not in DTYPES:
        raise RequestError(
            f"{what} has unknown type {dtype!r} (expected one of {', '.join(DTYPES)})"
        )
    ne, nb = obj.get("ne"), obj.get("nb")
    if not isinstance(ne, list) or len(ne) != 4:
        raise RequestError(f"{what}.ne must be a list of 4 integers, got {ne!r}")
    if not isinstance(nb, list) or len(nb) != 4:
        raise RequestError(f"{what}.nb must be a list of 4 integers, got {nb!r}")
    ne = tuple(_int(n, f"{what}.ne") for n in ne)
    nb = tuple(_int(n, f"{what}.nb") for n in nb)
    if any(n < 1 for n in ne):
        raise RequestError(f"{what}.ne must be positive, got {list(ne)}")
    if any(s < 0 for s in nb):
        raise RequestError(f"{what}.nb must not be negative, got {list(nb)}")
    size = DTYPES[dtype].size
    for n, s in zip(ne, nb):
        if n > 1 and s % size:
            raise RequestError(
                f"{what}.nb {list(nb)} is not a multiple of the {dtype} element size "
                f"({size} bytes): strides are in bytes"
            )
    return Tensor(dtype, ne, nb)


def parse_request(text: str) -> Request:
    """Parses and validates a request; raises RequestError with a one-line reason."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(f"the request is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise RequestError("the request must be a JSON object")
    for key in ("name", "arch", "op", "inputs", "output"):
        if key not in obj:
            raise RequestError(f"the request has no {key!r}")
    name = obj["name"]
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise RequestError(
            f"invalid kernel name {name!r}: 1-200 characters of [A-Za-z0-9_.-], "
            "not starting with '.' (it names the kernel files)"
        )
    arch = obj["arch"]
    if not isinstance(arch, str):
        raise RequestError(f"arch must be a string, got {arch!r}")
    op = obj["op"]
    if not isinstance(op, str) or not op:
        raise RequestError(f"op must be a non-empty string, got {op!r}")
    params = obj.get("op_params", [])
    if not isinstance(params, list):
        raise RequestError(f"op_params must be a list, got {params!r}")
    params = tuple(_int(p, "op_params") for p in params)
    if any(p < -(2**31) or p >= 2**31 for p in params):
        raise RequestError("op_params must be 32-bit integers")
    inputs = obj["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise RequestError("inputs must be a non-empty list")
    tensors = tuple(_tensor(t, f"inputs[{i}]") for i, t in enumerate(inputs))
    output = _tensor(obj["output"], "output")
    extra_outputs = _extra_outputs(obj, op)
    extra = {k: v for k, v in obj.items() if k not in _KNOWN}
    return Request(name, arch, op, params, tensors, output, extra_outputs, extra)


def _extra_outputs(obj: dict, op: str) -> tuple[Tensor, ...]:
    """The request's "extra_outputs": absent for an op of one output; for an op of several
    (the registry's `outputs`), exactly the outputs after `output`. An op no design implements
    is left to the planner (unsupported, whatever its outputs)."""
    spec = lookup(op)
    # An op of one output per row of input 0 (outputs 0): its planner counts them.
    want = spec.outputs - 1 if spec is not None and spec.outputs else None
    if "extra_outputs" not in obj:
        if want:
            raise RequestError(
                f"{op} has {spec.outputs} outputs: the request has no 'extra_outputs' (the "
                f"{want} after 'output')"
            )
        return ()
    items = obj["extra_outputs"]
    if not isinstance(items, list) or not items:
        raise RequestError(f"extra_outputs must be a non-empty list of tensors, got {items!r}")
    tensors = tuple(_tensor(t, f"extra_outputs[{i}]") for i, t in enumerate(items))
    if want is not None and len(tensors) != want:
        if not want:
            raise RequestError(f"{op} has one output: extra_outputs is not accepted")
        raise RequestError(
            f"{op} has {spec.outputs} outputs: extra_outputs must hold {want} tensors, the "
            f"request has {len(tensors)}"
        )
    return tensors


_KNOWN = {"name", "arch", "op", "op_params", "inputs", "output", "extra_outputs"}
