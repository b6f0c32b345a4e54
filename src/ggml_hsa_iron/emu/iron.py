"""A recording stand-in of the `aie.iron` subset the designs use (mlir-aie 1.4.x signatures).

Installed as `aie`, `aie.iron`, `aie.iron.device`, ... by `emu.install()` for the emulation
target only. Constructors and methods take the pinned version's parameters (keyword-only where
upstream is); an unknown keyword is a TypeError, and a parameter upstream has but the emulator
does not model (packet flows, repeat counts, padding, ...) is refused with NotImplementedError
when given a non-default value, so a design cannot silently depend on unmodelled behaviour.

Nothing is lowered: `Program.resolve_program()` runs the Worker bodies and the runtime sequence
once, recording fifos, links, core-body operations and DMA tasks, and returns a
`program.Recorded` (see program.py) which validates and serialises the dataflow.
"""

import itertools
import sys
import typing

import numpy as np

# --------------------------------------------------------------------------- helpers


def _refuse(what: str, **given) -> None:
    """NotImplementedError for parameters the emulator does not model, when set."""
    for name, (value, default) in given.items():
        if value is not default and value != default:
            raise NotImplementedError(
                f"{what}: {name}={value!r} is not modelled by the emulator "
                f"(only the default {default!r} is)"
            )


class ObjType:
    """The element type and count of an IRON tensor type `np.ndarray[(n,...), np.dtype[T]]`."""

    def __init__(self, t):
        args = typing.get_args(t)
        if typing.get_origin(t) is not np.ndarray or len(args) != 2:
            raise TypeError(f"expected an np.ndarray[shape, np.dtype[T]] type, got {t!r}")
        shape, dt = args
        if isinstance(shape, int):
            shape = (shape,)
        (scalar,) = typing.get_args(dt)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(scalar)
        self.elems = 1
        for s in self.shape:
            self.elems *= s
        self.elem_bytes = self.dtype.itemsize
        self.bytes = self.elems * self.elem_bytes

    @property
    def name(self) -> str:
        return {
            "bfloat16": "bf16",
            "float32": "f32",
            "float16": "f16",
            "int8": "i8",
            "int16": "i16",
            "int64": "i64",
        }.get(self.dtype.name, "i32" if self.dtype.name == "int32" else self.dtype.name)

    def same(self, other: "ObjType") -> bool:
        return self.elems == other.elems and self.dtype == other.dtype

    def __repr__(self):
        return f"{self.name}[{'x'.join(map(str, self.shape))}]"


def _is_tensor_type(t) -> bool:
    return typing.get_origin(t) is np.ndarray


# --------------------------------------------------------------------------- device


class Tile:
    """A tile by column and row (row 0 shim, 1 memory tile, 2.. compute)."""

    def __init__(self, col: int, row: int):
        self.col, self.row = int(col), int(row)

    def __eq__(self, o):
        return isinstance(o, Tile) and (self.col, self.row) == (o.col, o.row)

    def __hash__(self):
        return hash((self.col, self.row))

    def __repr__(self):
        return f"Tile({self.col}, {self.row})"


class _AnyTile:
    def __init__(self, kind):
        self.kind = kind

    def __repr__(self):
        return f"Any{self.kind}Tile"


AnyShimTile = _AnyTile("Shim")
AnyMemTile = _AnyTile("Mem")
AnyComputeTile = _AnyTile("Compute")


class Device:
    arch = ""
    name = ""

    def __init__(self, cols: int):
        self.cols = cols
        self.rows = 6

    def __repr__(self):
        return f"{self.name}()"


class NPU1(Device):
    """XDNA (aie2): 4 columns."""

    arch, name = "aie2", "NPU1"

    def __init__(self):
        super().__init__(4)


class NPU2(Device):
    """XDNA2 (aie2p): 8 columns."""

    arch, name = "aie2p", "NPU2"

    def __init__(self):
        super().__init__(8)


class NPU1Col1(NPU1):
    def __init__(self):
        Device.__init__(self, 1)


class NPU2Col1(NPU2):
    def __init__(self):
        Device.__init__(self, 1)


# --------------------------------------------------------------------------- recording state


class _State:
    """What is being recorded: fifos and links from construction, bodies at resolve time."""

    def __init__(self):
        self.fifos = []
        self.links = []
        self.body = None  # the op list a Worker body appends to, while one runs
        self.worker = None
        self.sequence = None  # the runtime sequence being recorded
        self.next_var = 0


STATE = _State()


def reset():
    """Forgets everything recorded (one design per process run, but tests build many)."""
    global STATE
    STATE = _State()


# --------------------------------------------------------------------------- access patterns


class TensorAccessPattern:
    """`aie.helpers.taplib.TensorAccessPattern(tensor_dims, offset=0, sizes=None, strides=None)`."""

    def __init__(self, tensor_dims, offset=0, sizes=None, strides=None):
        self.tensor_dims = tuple(int(d) for d in tensor_dims)
        total = 1
        for d in self.tensor_dims:
            total *= d
        self.total = total
        if sizes is None:
            sizes = list(self.tensor_dims)
        if strides is None:
            strides, acc = [], 1
            for s in reversed(sizes):
                strides.insert(0, acc)
                acc *= s
        if len(sizes) != len(strides):
            raise ValueError(f"access pattern has {len(sizes)} sizes and {len(strides)} strides")
        self.offset = int(offset)
        self.sizes = [int(s) for s in sizes]
        self.strides = [int(s) for s in strides]
        if any(s < 1 for s in self.sizes) or any(s < 0 for s in self.strides) or self.offset < 0:
            raise ValueError(f"access pattern has a non-positive size or negative stride: {self}")
        last = self.offset + sum((n - 1) * s for n, s in zip(self.sizes, self.strides))
        if last >= total:
            raise ValueError(
                f"Access pattern goes out of bounds: {self} reaches element {last} of a "
                f"tensor of {total}"
            )

    @property
    def transformation_dims(self):
        return list(zip(self.sizes, self.strides))

    @property
    def count(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def indices(self):
        for dims in itertools.product(*[range(n) for n in self.sizes]):
            yield self.offset + sum(d * s for d, s in zip(dims, self.strides))

    def to_json(self) -> dict:
        return {"offset": self.offset, "sizes": self.sizes, "strides": self.strides}

    def __repr__(self):
        return (
            f"TensorAccessPattern({self.tensor_dims}, {self.offset}, {self.sizes}, {self.strides})"
        )


def _object_walk(what, tap, obj: ObjType):
    """A stream re-layout: a TensorAccessPattern over one object at offset 0, moving every
    element of it (upstream `_object_walk` / `_check_walk_size`)."""
    if tap is None:
        return None
    if not isinstance(tap, TensorAccessPattern):
        raise TypeError(
            f"{what} takes a TensorAccessPattern, got {type(tap).__name__}; "
            "TensorAccessPattern(shape, 0, sizes, strides) spells out a walk by its numbers"
        )
    if tap.total != obj.elems or tap.offset != 0:
        raise ValueError(
            f"{what}: the walk must be over one object of {obj.elems} elements at offset 0, "
            f"got {tap}"
        )
    if tap.count != obj.elems:
        raise ValueError(f"{what}: the walk moves {tap.count} elements, an object has {obj.elems}")
    return tap


# --------------------------------------------------------------------------- kernels


class Kernel:
    """`Kernel(name, bin_name, arg_types)`: an external core function in an object file."""

    def __init__(self, name: str, bin_name: str, arg_types=()):
        self.name = name
        self.bin_name = bin_name
        self.arg_types = list(arg_types)
        self.kinds = []
        for t in self.arg_types:
            if _is_tensor_type(t):
                self.kinds.append(ObjType(t))
            elif t in (np.int32, "i32"):
                self.kinds.append("i32")
            else:
                raise NotImplementedError(
                    f"Kernel {name}: argument type {t!r} is not modelled (tensors and np.int32)"
                )
        self.index = None  # set when the program is recorded

    def __call__(self, *args):
        if STATE.body is None:
            raise RuntimeError(f"Kernel {self.name} called outside a Worker body")
        if len(args) != len(self.kinds):
            raise TypeError(
                f"Kernel {self.name} takes {len(self.kinds)} arguments, got {len(args)}"
            )
        out = []
        for i, (a, k) in enumerate(zip(args, self.kinds)):
            if k == "i32":
                if isinstance(a, bool) or not isinstance(a, int | np.integer):
                    raise TypeError(
                        f"Kernel {self.name} argument {i}: an int32 expected, got {a!r}"
                    )
                v = int(a)
                if not -(2**31) <= v < 2**31:
                    raise ValueError(f"Kernel {self.name} argument {i}: {v} is not an int32")
                out.append({"i32": v})
            else:
                if not isinstance(a, _Var):
                    raise TypeError(
                        f"Kernel {self.name} argument {i}: an acquired object expected, got {a!r}"
                    )
                if not a.obj.same(k):
                    raise TypeError(
                        f"Kernel {self.name} argument {i}: expects {k}, fifo {a.fifo.name} "
                        f"delivers {a.obj}"
                    )
                out.append({"var": a.var, "index": a.index})
        STATE.body.append({"op": "call", "kernel": self, "args": out})


class ExternalFunction(Kernel):
    def __init__(self, *a, **k):
        raise NotImplementedError("ExternalFunction (compiled by IRON) is not modelled")


# --------------------------------------------------------------------------- control flow


class _LoopIndex:
    def __index__(self):
        raise TypeError("the index of a range_ loop is symbolic in a Worker body")


def range_(start, stop=None, step=None):
    """`range_`: inside a Worker body, records a loop of its trip count (`sys.maxsize` =
    forever); its body runs once while recording."""
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    for v in (start, stop, step):
        if not isinstance(v, int):
            raise TypeError(f"range_ bounds must be Python ints here, got {v!r}")
    if STATE.body is None:
        raise RuntimeError("range_ used outside a Worker body")
    count = max(0, -(-(stop - start) // step))
    node = {"op": "loop", "count": count, "body": []}
    if stop == sys.maxsize:
        node["forever"] = True
    outer = STATE.body
    outer.append(node)
    STATE.body = node["body"]
    try:
        yield _LoopIndex()
    finally:
        STATE.body = outer


# --------------------------------------------------------------------------- object fifos


class _Var:
    """An acquired object (or one element of an acquired view) in a Worker body."""

    def __init__(self, fifo, var, index, obj):
        self.fifo, self.var, self.index, self.obj = fifo, var, index, obj

    def __repr__(self):
        return f"<object of {self.fifo.name}>"


class _View:
    def __init__(self, fifo, var, n, obj):
        self._items = [_Var(fifo, var, i, obj) for i in range(n)]

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)


class ObjectFifo:
    """`ObjectFifo(obj_type, *, depth=2, name=None, to_stream=None, from_stream_per_cons=None,
    ...)` (1.4.x)."""

    _count = 0

    def __init__(
        self,
        obj_type,
        *,
        depth=2,
        name=None,
        to_stream=None,
        from_stream_per_cons=None,
        plio=False,
        pad_value=0,
        disable_synchronization=False,
        repeat_count=None,
        delegate_tile=None,
        via_DMA=False,
        init_values=None,
        consumer_obj_type=None,
        aie_stream=None,
        packet=False,
        packet_id=None,
    ):
        _refuse(
            "ObjectFifo",
            plio=(plio, False),
            pad_value=(pad_value, 0),
            disable_synchronization=(disable_synchronization, False),
            repeat_count=(repeat_count, None),
            delegate_tile=(delegate_tile, None),
            via_DMA=(via_DMA, False),
            init_values=(init_values, None),
            consumer_obj_type=(consumer_obj_type, None),
            aie_stream=(aie_stream, None),
            packet=(packet, False),
            packet_id=(packet_id, None),
        )
        self.obj = ObjType(obj_type)
        self.obj_type = obj_type
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"ObjectFifo depth must be a positive int, got {depth!r}")
        self.depth = depth
        if name is None:
            name = f"of{ObjectFifo._count}"
        ObjectFifo._count += 1
        self.name = name
        self.to_stream = _object_walk(f"ObjectFifo {name} to_stream", to_stream, self.obj)
        if from_stream_per_cons is not None:
            raise NotImplementedError(
                "from_stream_per_cons is not modelled; use cons(from_stream=)"
            )
        self._prod = None
        self._cons = []
        self.id = len(STATE.fifos)
        STATE.fifos.append(self)

    def prod(self, depth=None, channel=None, tile=None):
        _refuse(f"ObjectFifo {self.name}.prod", channel=(channel, None))
        if self._prod is None:
            self._prod = ObjectFifoHandle(self, True, depth or self.depth, None, tile)
        elif depth is not None and depth != self._prod.depth:
            raise ValueError(f"ObjectFifo {self.name}: producer depth {depth} differs from earlier")
        elif tile is not None:
            self._prod._set_tile(tile)
        return self._prod

    def cons(self, depth=None, from_stream=None, channel=None, tile=None):
        _refuse(f"ObjectFifo {self.name}.cons", channel=(channel, None))
        fs = _object_walk(f"ObjectFifo {self.name}.cons from_stream", from_stream, self.obj)
        h = ObjectFifoHandle(self, False, depth or self.depth, fs, tile)
        self._cons.append(h)
        return h

    def __repr__(self):
        return f"ObjectFifo({self.name})"


class ObjectFifoHandle:
    def __init__(self, fifo, is_prod, depth, from_stream, tile):
        self._object_fifo = fifo
        self.is_prod = is_prod
        self.depth = depth
        self.from_stream = from_stream
        self.endpoint = None  # a Worker, a _Link, or the Runtime
        self.tile = None
        if tile is not None:
            self._set_tile(tile)

    def _set_tile(self, tile):
        if not isinstance(tile, Tile | _AnyTile):
            raise TypeError(f"tile= takes a Tile, got {tile!r}")
        self.tile = tile if isinstance(tile, Tile) else None

    @property
    def name(self):
        return self._object_fifo.name

    @property
    def obj_type(self):
        return self._object_fifo.obj_type

    def _bind(self, endpoint):
        if self.endpoint is not None and self.endpoint is not endpoint:
            raise ValueError(
                f"a {'producer' if self.is_prod else 'consumer'} handle of ObjectFifo "
                f"{self.name} is already used by {self.endpoint!r}; take another handle"
            )
        self.endpoint = endpoint

    # --- core-body operations

    def _check_body(self, what):
        if STATE.body is None or STATE.worker is None:
            raise RuntimeError(f"{what} of ObjectFifo {self.name} outside a Worker body")
        if self.endpoint is not STATE.worker:
            raise RuntimeError(
                f"{what} of ObjectFifo {self.name} in a Worker the handle was not given to"
            )

    def acquire(self, num_elem):
        self._check_body("acquire")
        if not isinstance(num_elem, int) or num_elem < 1:
            raise ValueError(f"acquire takes a positive int, got {num_elem!r}")
        if self.depth < num_elem:
            raise ValueError(
                f"Number of elements to acquire {num_elem} must be smaller than depth "
                f"{self.depth} (ObjectFifo {self.name})"
            )
        var = STATE.next_var
        STATE.next_var += 1
        STATE.body.append({"op": "acquire", "handle": self, "n": num_elem, "var": var})
        obj = self._object_fifo.obj
        if num_elem == 1:
            return _Var(self._object_fifo, var, 0, obj)
        return _View(self._object_fifo, var, num_elem, obj)

    def release(self, num_elem):
        self._check_body("release")
        if not isinstance(num_elem, int) or num_elem < 1:
            raise ValueError(f"release takes a positive int, got {num_elem!r}")
        STATE.body.append({"op": "release", "handle": self, "n": num_elem})

    # --- memory-tile links

    def _link(self, kind, offsets, tile, depths, obj_types, names, to_stream, suffix):
        if kind == "split" and self.is_prod:
            raise ValueError(f"split needs a consumer handle of ObjectFifo {self.name}")
        if kind == "join" and not self.is_prod:
            raise ValueError(f"join needs a producer handle of ObjectFifo {self.name}")
        offsets = [int(o) for o in offsets]
        n = len(offsets)
        if obj_types is None:
            obj_types = [self._object_fifo.obj_type] * n
        if depths is None:
            depths = [self.depth] * n
        if names is None:
            names = [f"{self.name}_{suffix}{i}" for i in range(n)]
        if to_stream is None:
            to_stream = [None] * n
        for what, lst in (("obj_types", obj_types), ("depths", depths), ("names", names)):
            if len(lst) != n:
                raise ValueError(f"{kind} of {self.name}: {n} offsets but {len(lst)} {what}")
        if kind == "join" and any(t is not None for t in to_stream):
            raise NotImplementedError("join(to_stream=) is not modelled")
        if kind == "split" and len(to_stream) != n:
            raise ValueError(f"split of {self.name}: {n} offsets but {len(to_stream)} to_stream")
        link = _Link(kind, self, tile)
        subs = []
        for i in range(n):
            f = ObjectFifo(obj_types[i], depth=depths[i], name=names[i])
            if kind == "split":
                f.to_stream = _object_walk(f"split {names[i]} to_stream", to_stream[i], f.obj)
                f.prod()._bind(link)
            else:
                link.inputs.append(f.cons())
                link.inputs[-1]._bind(link)
            subs.append(f)
        link.subs = subs
        link.offsets = offsets
        self._bind(link)
        total = self._object_fifo.obj
        ends = [*offsets[1:], total.elems]
        for i, f in enumerate(subs):
            if f.obj.dtype != total.dtype:
                raise TypeError(f"{kind} {f.name}: element type {f.obj} differs from {total}")
            if offsets[i] < 0 or offsets[i] + f.obj.elems > total.elems:
                raise ValueError(
                    f"{kind} {f.name}: segment at {offsets[i]} of {f.obj.elems} elements is "
                    f"outside the {total.elems} of {self.name}"
                )
            if ends[i] - offsets[i] != f.obj.elems:
                raise ValueError(
                    f"{kind} {f.name}: offsets give {ends[i] - offsets[i]} elements, the "
                    f"object type has {f.obj.elems}"
                )
        return subs

    def split(
        self,
        offsets,
        tile=AnyMemTile,
        depths=None,
        obj_types=None,
        names=None,
        to_stream=None,
        from_stream=None,
        plio=False,
        repeat_counts=None,
        pad_value=None,
        channels=None,
    ):
        _refuse(
            "split",
            from_stream=(from_stream, None),
            plio=(plio, False),
            repeat_counts=(repeat_counts, None),
            pad_value=(pad_value, None),
            channels=(channels, None),
        )
        return self._link("split", offsets, tile, depths, obj_types, names, to_stream, "split")

    def join(
        self,
        offsets,
        tile=AnyMemTile,
        depths=None,
        obj_types=None,
        names=None,
        to_stream=None,
        from_stream=None,
        plio=False,
        repeat_counts=None,
    ):
        _refuse(
            "join",
            from_stream=(from_stream, None),
            plio=(plio, False),
            repeat_counts=(repeat_counts, None),
        )
        return self._link("join", offsets, tile, depths, obj_types, names, to_stream, "join")

    def forward(
        self,
        tile=AnyMemTile,
        obj_type=None,
        depth=None,
        name=None,
        to_stream=None,
        from_stream=None,
        plio=False,
        repeat_count=None,
        pad_value=0,
        channel=None,
    ):
        _refuse(
            "forward",
            from_stream=(from_stream, None),
            plio=(plio, False),
            repeat_count=(repeat_count, None),
            pad_value=(pad_value, 0),
            channel=(channel, None),
        )
        (sub,) = self._link(
            "split",
            [0],
            tile,
            None if depth is None else [depth],
            [obj_type or self._object_fifo.obj_type],
            [name or f"{self.name}_fwd"],
            [to_stream],
            "fwd",
        )
        return sub

    # --- runtime transfers

    def _transfer(self, kind, buf, tap, wait, group):
        seq = STATE.sequence
        if seq is None:
            raise RuntimeError(f"{kind} of ObjectFifo {self.name} outside the runtime sequence")
        if not isinstance(buf, RuntimeData):
            raise TypeError(f"{kind}: a runtime-sequence tensor expected, got {buf!r}")
        if self.endpoint is not seq.runtime:
            raise ValueError(
                f"{kind} of ObjectFifo {self.name}: the handle must be given to the Runtime "
                "in fn_args (its shim endpoint binds there)"
            )
        if tap is None:
            tap = TensorAccessPattern((buf.obj.elems,))
        if not isinstance(tap, TensorAccessPattern):
            raise TypeError(f"{kind}: tap must be a TensorAccessPattern, got {tap!r}")
        if tap.total != buf.obj.elems:
            raise ValueError(
                f"{kind} of {self.name}: the tap is over {tap.total} elements, the runtime "
                f"tensor {buf.index} has {buf.obj.elems}"
            )
        if buf.obj.dtype != self._object_fifo.obj.dtype:
            raise TypeError(
                f"{kind} of {self.name}: tensor {buf.index} is {buf.obj.name}, the fifo "
                f"moves {self._object_fifo.obj.name}"
            )
        return seq.add(kind, self, buf, tap, wait, group)

    def fill(
        self,
        source,
        tap=None,
        wait=False,
        packet=None,
        offset_parameter=None,
        group=None,
        managed=True,
        length_parameter=None,
        length_unit=None,
    ):
        _refuse(
            "fill",
            packet=(packet, None),
            offset_parameter=(offset_parameter, None),
            managed=(managed, True),
            length_parameter=(length_parameter, None),
            length_unit=(length_unit, None),
        )
        if not self.is_prod:
            raise ValueError(f"fill needs a producer handle of ObjectFifo {self.name}")
        return self._transfer("fill", source, tap, wait, group)

    def drain(
        self,
        dest,
        tap=None,
        wait=False,
        packet=None,
        offset_parameter=None,
        group=None,
        managed=True,
        length_parameter=None,
        length_unit=None,
    ):
        _refuse(
            "drain",
            packet=(packet, None),
            offset_parameter=(offset_parameter, None),
            managed=(managed, True),
            length_parameter=(length_parameter, None),
            length_unit=(length_unit, None),
        )
        if self.is_prod:
            raise ValueError(f"drain needs a consumer handle of ObjectFifo {self.name}")
        return self._transfer("drain", dest, tap, wait, group)


class _Link:
    def __init__(self, kind, handle, tile):
        if not isinstance(tile, Tile | _AnyTile):
            raise TypeError(f"{kind}: tile= takes a Tile, got {tile!r}")
        if isinstance(tile, Tile) and tile.row != 1:
            raise ValueError(f"{kind} of {handle.name}: {tile} is not a memory tile (row 1)")
        self.kind = kind
        self.handle = handle
        self.tile = tile if isinstance(tile, Tile) else None
        self.inputs = []
        self.subs = []
        self.offsets = []
        self.id = len(STATE.links)
        STATE.links.append(self)

    def __repr__(self):
        return f"{self.kind} of {self.handle.name}"


# --------------------------------------------------------------------------- workers


class Worker:
    """`Worker(core_fn, fn_args=None, tile=AnyComputeTile, while_true=True, stack_size=None,
    ...)` (1.4.x)."""

    def __init__(
        self,
        core_fn,
        fn_args=None,
        tile=AnyComputeTile,
        while_true=True,
        stack_size=None,
        data_size=None,
        trace=None,
        trace_events=None,
        dynamic_objfifo_lowering=None,
    ):
        _refuse(
            "Worker",
            data_size=(data_size, None),
            trace=(trace, None),
            trace_events=(trace_events, None),
            dynamic_objfifo_lowering=(dynamic_objfifo_lowering, None),
        )
        if not isinstance(tile, Tile | _AnyTile):
            raise TypeError(f"Worker: tile= takes a Tile, got {tile!r}")
        if isinstance(tile, Tile) and tile.row < 2:
            raise ValueError(f"Worker: {tile} is not a compute tile (rows 2 and up)")
        self.core_fn = core_fn
        self.fn_args = list(fn_args or [])
        self.tile = tile if isinstance(tile, Tile) else None
        self.while_true = while_true
        self.stack_size = 1024 if stack_size is None else int(stack_size)
        for a in self.fn_args:
            if isinstance(a, ObjectFifo):
                raise ValueError(
                    f"Worker: pass a handle (.prod() or .cons()) of ObjectFifo {a.name}, "
                    "not the ObjectFifo"
                )
            if isinstance(a, ObjectFifoHandle):
                a._bind(self)
        self.body = None

    def _record(self):
        STATE.worker = self
        STATE.body = []
        top = STATE.body
        try:
            for _ in range_(sys.maxsize if self.while_true else 1):
                self.core_fn(*self.fn_args)
        finally:
            STATE.body = None
            STATE.worker = None
        self.body = top

    def __repr__(self):
        return f"Worker({self.core_fn.__name__} at {self.tile})"


# --------------------------------------------------------------------------- runtime


class RuntimeData:
    """A runtime-sequence tensor argument."""

    def __init__(self, index, t):
        self.index = index
        self.obj = ObjType(t)

    def __repr__(self):
        return f"RuntimeData({self.index}, {self.obj})"


class TaskGroup:
    """`aie.iron.runtime.TaskGroup()`; `finish()` awaits its waited tasks."""

    def __init__(self):
        if STATE.sequence is None:
            raise RuntimeError("TaskGroup() outside the runtime sequence")
        self.seq = STATE.sequence
        self.id = self.seq.new_group()
        self.finished = False

    def finish(self):
        if self.finished:
            raise RuntimeError("TaskGroup finished twice")
        self.finished = True
        self.seq.finish(self.id)


class _Task:
    def __init__(self, index):
        self.index = index


class _Sequence:
    def __init__(self, runtime):
        self.runtime = runtime
        self.ops = []
        self.tasks = 0
        self.groups = {}  # group id -> [waited task ids not yet awaited]
        self.default_used = False
        self.explicit_used = False

    def new_group(self):
        gid = len(self.groups) + 1
        self.groups[gid] = []
        return gid

    def add(self, kind, handle, buf, tap, wait, group):
        if group is None:
            self.default_used = True
            gid = 0
        else:
            if not isinstance(group, TaskGroup):
                raise TypeError(f"group= takes a TaskGroup, got {group!r}")
            if group.finished:
                raise RuntimeError("transfer added to a finished TaskGroup")
            self.explicit_used = True
            gid = group.id
        if self.runtime.strict and self.default_used and self.explicit_used:
            raise RuntimeError(
                "Mixing explicit task groups and the default task group is prohibited"
            )
        tid = self.tasks
        self.tasks += 1
        self.ops.append(
            {
                "op": kind,
                "task": tid,
                "handle": handle,
                "arg": buf.index,
                "tap": tap,
                "elem_bytes": buf.obj.elem_bytes,
                "wait": bool(wait),
            }
        )
        if wait:
            if gid == 0:
                # Default group: a waited transfer is awaited (and freed) where it is issued.
                self.ops.append({"op": "await", "tasks": [tid]})
            else:
                self.groups[gid].append(tid)
        return _Task(tid)

    def finish(self, gid):
        tasks = self.groups.get(gid, [])
        if tasks:
            self.ops.append({"op": "await", "tasks": list(tasks)})
        self.groups[gid] = []


class Runtime:
    """`Runtime(seq_fn, fn_args=None, *, name=None, strict_task_groups=True,
    implicit_configure=True)` (1.4.x): `seq_fn(*fn_args)` is the runtime sequence."""

    def __init__(
        self, seq_fn, fn_args=None, *, name=None, strict_task_groups=True, implicit_configure=True
    ):
        _refuse("Runtime", implicit_configure=(implicit_configure, True))
        if not callable(seq_fn):
            raise TypeError(f"Runtime: seq_fn must be callable, got {seq_fn!r}")
        self.seq_fn = seq_fn
        self.name = name
        self.strict = strict_task_groups
        self.args = []
        self.data = []
        for a in list(fn_args or []):
            if _is_tensor_type(a):
                d = RuntimeData(len(self.data), a)
                self.data.append(d)
                self.args.append(d)
            else:
                if isinstance(a, ObjectFifo):
                    raise ValueError(
                        f"Runtime: pass a handle of ObjectFifo {a.name}, not the ObjectFifo"
                    )
                if isinstance(a, ObjectFifoHandle):
                    a._bind(self)
                self.args.append(a)
        self.sequence = None

    def _record(self):
        seq = _Sequence(self)
        STATE.sequence = seq
        try:
            self.seq_fn(*self.args)
        finally:
            STATE.sequence = None
        # The implicit default group is flushed at the end of the body; explicit groups
        # left unfinished are flushed too.
        for gid in list(seq.groups):
            seq.finish(gid)
        self.sequence = seq

    def __repr__(self):
        return "Runtime"


class Program:
    """`Program(device, rt, workers=None)`; `resolve_program()` records the whole design."""

    def __init__(self, device, rt, workers=None):
        if not isinstance(device, Device):
            raise TypeError(f"Program: a device expected, got {device!r}")
        if not isinstance(rt, Runtime):
            raise TypeError(f"Program: a Runtime expected, got {rt!r}")
        self.device = device
        self.rt = rt
        self.workers = list(workers or [])
        for w in self.workers:
            if not isinstance(w, Worker):
                raise TypeError(f"Program: workers= takes Workers, got {w!r}")

    def resolve_program(self, device_name="main"):
        from .program import Recorded

        for w in self.workers:
            w._record()
        self.rt._record()
        return Recorded(self, STATE)
