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


def _flatten(args):
    """fn_args with nested lists and tuples flattened (upstream `flatten_fn_args`)."""
    for a in args:
        if isinstance(a, list | tuple):
            yield from _flatten(a)
        else:
            yield a


# --------------------------------------------------------------------------- device


class Tile:
    """`Tile(col=None, row=None, *, tile_type=None, allocation_scheme=None)` (python/iron/
    device/tile.py): a tile by column and row (row 0 shim, 1 memory tile, 2.. compute). A tile
    without both coordinates is unplaced (as AnyComputeTile & co.); `tile_type` and
    `allocation_scheme` are not modelled."""

    def __init__(self, col=None, row=None, *, tile_type=None, allocation_scheme=None):
        _refuse(
            "Tile",
            tile_type=(tile_type, None),
            allocation_scheme=(allocation_scheme, None),
        )
        self.col = None if col is None else int(col)
        self.row = None if row is None else int(row)

    @property
    def placed(self) -> bool:
        return self.col is not None and self.row is not None

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


def _placed(what, tile):
    """The placed Tile `tile` stands for, or None for an unplaced one (AnyComputeTile & co.,
    `Tile()`, or None, which upstream treats as the Any tile)."""
    if tile is None or isinstance(tile, _AnyTile):
        return None
    if not isinstance(tile, Tile):
        raise TypeError(f"{what}: tile= takes a Tile, got {tile!r}")
    if tile.col is None and tile.row is None:
        return None
    if not tile.placed:
        raise NotImplementedError(f"{what}: a partly placed {tile!r} is not modelled")
    return tile


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
    """`aie.helpers.taplib.TensorAccessPattern(tensor_dims, offset, sizes, strides)`: every
    parameter required, as upstream (python/helpers/taplib/tap.py)."""

    def __init__(self, tensor_dims, offset, sizes, strides):
        self.tensor_dims = tuple(int(d) for d in tensor_dims)
        if not self.tensor_dims or any(d < 1 for d in self.tensor_dims):
            raise ValueError(f"Tensor dimensions must be positive, got {tensor_dims!r}")
        total = 1
        for d in self.tensor_dims:
            total *= d
        self.total = total
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

    def __repr__(self):
        return (
            f"TensorAccessPattern({self.tensor_dims}, {self.offset}, {self.sizes}, {self.strides})"
        )


def linear_tap(n: int) -> TensorAccessPattern:
    """The whole of a 1-D tensor of `n` elements, in order (upstream `default_tap()`)."""
    return TensorAccessPattern((n,), 0, [n], [1])


def tap_count(tap: TensorAccessPattern) -> int:
    """The elements a pattern moves."""
    n = 1
    for s in tap.sizes:
        n *= s
    return n


def tap_indices(tap: TensorAccessPattern):
    """The element indices a pattern visits, in order."""
    for dims in itertools.product(*[range(n) for n in tap.sizes]):
        yield tap.offset + sum(d * s for d, s in zip(dims, tap.strides))


def tap_json(tap: TensorAccessPattern) -> dict:
    """A pattern in the program JSON (docs/kernel-compiler-protocol.md)."""
    return {"offset": tap.offset, "sizes": list(tap.sizes), "strides": list(tap.strides)}


def _object_walk(what, tap, obj: ObjType = None):
    """A stream re-layout (upstream `_object_walk`): a TensorAccessPattern at offset 0 moving
    every element of the tensor it walks. Which tensor that must be (one transfer: an object,
    or one segment of a link's shared object) is checked when the program is resolved
    (`check_walk_size`); `obj` is unused, kept for the callers' readability."""
    if tap is None:
        return None
    if not isinstance(tap, TensorAccessPattern):
        raise TypeError(
            f"{what} takes a TensorAccessPattern, got {type(tap).__name__}; "
            "TensorAccessPattern(shape, 0, sizes, strides) spells out a walk by its numbers"
        )
    if tap.offset != 0:
        raise ValueError(f"{what}: a stream walk starts at offset 0, got {tap}")
    if tap_count(tap) != tap.total:
        raise ValueError(
            f"{what}: the walk moves {tap_count(tap)} elements of a tensor of {tap.total}"
        )
    return tap


def check_walk_size(what, tap, sizes) -> None:
    """Upstream `_check_walk_size`: a stream walk is over the tensor one transfer moves, each of
    `sizes` (an object, or each segment of a link's shared object, a join's output walking
    every input's segment alike)."""
    if tap is None:
        return
    for size in sizes:
        if tap.total != size:
            raise ValueError(
                f"{what} {tap!r} walks a tensor of shape {tuple(tap.tensor_dims)}, but each "
                f"transfer moves {size} elements"
            )


# --------------------------------------------------------------------------- kernels


class Kernel:
    """`Kernel(name, object_file_name, arg_types=[])` (python/iron/kernel.py): an external core
    function in a pre-compiled object file. A Worker resolves the Kernels in its `fn_args`; a
    body calling one it was not given raises as upstream's unresolved Kernel does."""

    def __init__(self, name: str, object_file_name: str, arg_types=()):
        self.name = name
        self.object_file_name = object_file_name
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
        if self not in STATE.worker.kernels:
            raise ValueError("Kernel must be resolved before it can be called.")
        if len(args) != len(self.kinds):
            raise ValueError(
                f"Kernel '{self.name}' expects {len(self.kinds)} argument(s), but {len(args)} "
                "were provided."
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
    """`ExternalFunction(name, object_file_name=None, source_file=None, source_string=None,
    arg_types=[], include_dirs=[], compile_flags=[])`: compiled by IRON's JIT, not modelled."""

    def __init__(
        self,
        name,
        object_file_name=None,
        source_file=None,
        source_string=None,
        arg_types=(),
        include_dirs=(),
        compile_flags=(),
    ):
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
        if depth is not None and depth < 1:
            raise ValueError(f"Depth must be > 1, but got {depth}")
        if self._prod is None:
            self._prod = ObjectFifoHandle(self, True, depth or self.depth, None, tile)
            return self._prod
        # Upstream returns the one producer handle again; it refuses re-pinning its shim tile
        # (an earlier prod() without tile= left it unpinned: pinned to None).
        if tile is not None and not _same_pin(self._prod.shim_tile, tile):
            raise ValueError(
                f"Producer handle for {self.name} already pinned to shim tile "
                f"{self._prod.shim_tile}, cannot re-pin to {tile}."
            )
        if depth is not None and depth != self._prod.depth:
            raise ValueError(f"ObjectFifo {self.name}: producer depth {depth} differs from earlier")
        return self._prod

    def cons(self, depth=None, from_stream=None, channel=None, tile=None):
        _refuse(f"ObjectFifo {self.name}.cons", channel=(channel, None))
        fs = _object_walk(f"ObjectFifo {self.name}.cons from_stream", from_stream, self.obj)
        if depth is not None and depth < 1:
            raise ValueError(f"Depth must be > 0 but is {depth}")
        h = ObjectFifoHandle(self, False, depth or self.depth, fs, tile)
        self._cons.append(h)
        return h

    def __repr__(self):
        return f"ObjectFifo({self.name})"


def _same_pin(a, b) -> bool:
    """Whether two shim-tile pins are the same placement (by column and row; two unpinned
    ones are the same), as upstream's `_same_shim_pin`."""
    if a is None or b is None:
        return a is b
    return (a.col, a.row) == (b.col, b.row)


class ObjectFifoHandle:
    def __init__(self, fifo, is_prod, depth, from_stream, tile):
        self._object_fifo = fifo
        self.is_prod = is_prod
        self.depth = depth
        self.from_stream = from_stream
        self.endpoint = None  # a Worker, a _Link, or the Runtime
        self.shim_tile = tile  # the tile= given, as given (upstream `_shim_tile`)
        self.tile = None
        if tile is not None:
            self._set_tile(tile)

    def _set_tile(self, tile):
        self.tile = _placed(f"ObjectFifo {self.name} handle", tile)

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
        if not isinstance(num_elem, int):
            raise ValueError(f"acquire takes a positive int, got {num_elem!r}")
        if self.depth < num_elem:
            raise ValueError(
                f"Number of elements to acquire {num_elem} must be smaller than depth "
                f"{self.depth} (ObjectFifo {self.name})"
            )
        if num_elem < 1:
            raise ValueError("Must consume at least one element")
        var = STATE.next_var
        STATE.next_var += 1
        STATE.body.append({"op": "acquire", "handle": self, "n": num_elem, "var": var})
        obj = self._object_fifo.obj
        if num_elem == 1:
            return _Var(self._object_fifo, var, 0, obj)
        return _View(self._object_fifo, var, num_elem, obj)

    def release(self, num_elem):
        self._check_body("release")
        if not isinstance(num_elem, int):
            raise ValueError(f"release takes a positive int, got {num_elem!r}")
        if self.depth < num_elem:
            raise ValueError(
                f"Number of elements to release {num_elem} must be smaller than depth {self.depth}"
            )
        if num_elem < 1:
            raise ValueError("Must produce at least one element")
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
            raise NotImplementedError("join(to_stream=) (the inputs' walks) is not modelled")
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
            tap = linear_tap(buf.obj.elems)
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
        tile = _placed(kind, tile)
        if tile is not None and tile.row != 1:
            raise ValueError(f"{kind} of {handle.name}: {tile} is not a memory tile (row 1)")
        self.kind = kind
        self.handle = handle
        self.tile = tile
        self.inputs = []
        self.subs = []
        self.offsets = []
        self.id = len(STATE.links)
        STATE.links.append(self)

    def transfer_sizes(self, fifo) -> list:
        """The elements each transfer of `fifo`'s end of the link moves: every segment for the
        shared fifo (the split's input, the join's output), its own for a sub-fifo (upstream
        `ObjectFifoLink._transfer_sizes`)."""
        if fifo is self.handle._object_fifo:
            return [f.obj.elems for f in self.subs]
        return [fifo.obj.elems]

    def __repr__(self):
        return f"{self.kind} of {self.handle.name}"


# --------------------------------------------------------------------------- workers


class Worker:
    """`Worker(core_fn, fn_args=None, tile=AnyComputeTile, while_true=True, stack_size=None,
    program_memory_reserved=None, allocation_scheme=None, trace=None, trace_events=None,
    dynamic_objfifo_lowering=None)` (python/iron/worker.py)."""

    def __init__(
        self,
        core_fn,
        fn_args=None,
        tile=AnyComputeTile,
        while_true=True,
        stack_size=None,
        program_memory_reserved=None,
        allocation_scheme=None,
        trace=None,
        trace_events=None,
        dynamic_objfifo_lowering=None,
    ):
        _refuse(
            "Worker",
            program_memory_reserved=(program_memory_reserved, None),
            allocation_scheme=(allocation_scheme, None),
            trace=(trace, None),
            trace_events=(trace_events, None),
            dynamic_objfifo_lowering=(dynamic_objfifo_lowering, None),
        )
        tile = _placed("Worker", tile)
        if tile is not None and tile.row < 2:
            raise ValueError(f"Worker: {tile} is not a compute tile (rows 2 and up)")
        self.core_fn = core_fn
        self.fn_args = list(fn_args or [])
        self.tile = tile
        self.while_true = while_true
        self.stack_size = 1024 if stack_size is None else int(stack_size)
        # The Kernels the Worker resolves: those in fn_args (nested lists flattened, as
        # upstream's flatten_fn_args).
        self.kernels = []
        for a in _flatten(self.fn_args):
            if isinstance(a, ObjectFifo):
                raise ValueError(
                    f"Worker: pass a handle (.prod() or .cons()) of ObjectFifo {a.name}, "
                    "not the ObjectFifo"
                )
            if isinstance(a, ObjectFifoHandle):
                a._bind(self)
            if isinstance(a, Kernel):
                self.kernels.append(a)
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


class IronRuntimeError(Exception):
    """Upstream's error of a runtime sequence that cannot be resolved (runtime/runtime.py)."""


class TaskGroup:
    """`aie.iron.runtime.TaskGroup(id=None)` (runtime/taskgroup.py), constructed in the runtime
    sequence; `finish()` awaits its waited transfers, then frees the rest: their buffer
    descriptors are held until then. An explicit `id` (upstream: only for the runtime's own
    default group) is not modelled."""

    def __init__(self, id=None):
        _refuse("TaskGroup", id=(id, None))
        if STATE.sequence is None:
            raise RuntimeError(
                "TaskGroup() must be constructed within the function passed to "
                "Runtime(seq_fn, fn_args)."
            )
        self.seq = STATE.sequence
        self.id = self.seq.new_group(self)
        self.finished = False

    @property
    def group_id(self) -> int:
        return self.id

    def finish(self):
        if self.finished:
            raise RuntimeError(f"{self} finished twice")
        self.finished = True
        self.seq.finish(self.id)

    def __str__(self):
        return f"TaskGroup({self.id})"

    __repr__ = __str__


class _Task:
    def __init__(self, index):
        self.index = index


class _Sequence:
    """The runtime sequence as recorded: fills, drains and awaits in issue order, and for each
    task the op that frees its buffer descriptors (`frees`: task -> index of the op after which
    they are free again; the default group's at the end of the sequence, as upstream's
    `ActiveSequence.finalize` emits its awaits and frees)."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.ops = []
        self.tasks = 0
        self.groups = {0: []}  # group id -> [task ids not yet awaited or freed]
        self.waited = set()
        self.open = {}  # group id -> the TaskGroup, while not finished
        self.frees = {}
        self.default_used = False
        self.explicit_used = False

    def new_group(self, tg):
        gid = len(self.groups)
        self.groups[gid] = []
        self.open[gid] = tg
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
        self.groups[gid].append(tid)
        if wait:
            self.waited.add(tid)
        return _Task(tid)

    def finish(self, gid):
        """Await the group's waited tasks, then free every task of the group."""
        self.open.pop(gid, None)
        tasks = self.groups.get(gid, [])
        waited = [t for t in tasks if t in self.waited]
        if waited:
            self.ops.append({"op": "await", "tasks": waited})
        for t in tasks:
            self.frees[t] = len(self.ops)
        self.groups[gid] = []

    def finalize(self):
        """Upstream's `ActiveSequence.finalize`: unfinished explicit groups and (strict) mixed
        groups are errors; the default group is awaited and freed at the end."""
        if self.open:
            tgs = ", ".join(str(t) for t in self.open.values())
            raise IronRuntimeError(f"Failed to close task groups: {tgs}")
        if self.runtime.strict and self.default_used and self.explicit_used:
            raise IronRuntimeError(
                "Mixing explicit task groups and the default task group is prohibited. "
                "Please assign all tasks to a task group."
            )
        self.finish(0)


class Runtime:
    """`Runtime(seq_fn, fn_args=None, *, name=None, strict_task_groups=True,
    implicit_configure=True)` (runtime/runtime.py): `seq_fn(*fn_args)` is the runtime
    sequence. Tensor types in `fn_args` are the sequence's buffers; handles and other objects
    pass through. Scalar types (a runtime scalar argument the backend does not pass) and ints
    (upstream folds them into `arith.constant` values, not Python ints) are not modelled."""

    def __init__(
        self, seq_fn, fn_args=None, *, name=None, strict_task_groups=True, implicit_configure=True
    ):
        _refuse("Runtime", implicit_configure=(implicit_configure, True))
        if name == "":
            raise ValueError("Runtime name must not be empty.")
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
                continue
            if isinstance(a, bool | int | np.integer) or (
                isinstance(a, type) and issubclass(a, np.generic)
            ):
                raise NotImplementedError(
                    f"Runtime fn_args: {a!r} is not modelled (an int is folded into an "
                    "arith.constant value, a scalar type is a runtime argument the backend does "
                    "not pass); put constants in the sequence function"
                )
            for h in _flatten([a]):
                if isinstance(h, ObjectFifo):
                    raise ValueError(
                        f"Runtime: pass a handle of ObjectFifo {h.name}, not the ObjectFifo"
                    )
                if isinstance(h, ObjectFifoHandle):
                    h._bind(self)
            self.args.append(a)
        self.sequence = None

    def _record(self):
        seq = _Sequence(self)
        STATE.sequence = seq
        try:
            self.seq_fn(*self.args)
            seq.finalize()
        finally:
            STATE.sequence = None
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
