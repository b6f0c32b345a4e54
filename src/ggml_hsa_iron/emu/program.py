"""A recorded IRON program: endpoint resolution, validation against the hardware limits, and
the program JSON of image version 2 (docs/kernel-compiler-protocol.md, "Emulation images").

Validation raises `DesignError` with a message naming the tile, fifo or task at fault; the
limits are those of mlir-aie's AIE2 target model (aie2 and aie2p report the same numbers).
"""

from .iron import ObjectFifoHandle, Runtime, Tile, Worker, _Link, check_walk_size, tap_json

CORE_MEMORY = 64 * 1024
MEMTILE_MEMORY = 512 * 1024
BDS = {"core": 16, "mem": 48, "shim": 16}
LOCKS = {"core": 16, "mem": 64, "shim": 16}
CHANNELS = {"core": 2, "mem": 6, "shim": 2}
WORD = 4
# Buffer descriptors every design leaves free on every tile, at any time: a margin for a
# transfer the real toolchain splits into more BDs than counted here.
BD_MARGIN = 2


def task_bds(sizes, strides, elem_bytes) -> int:
    """The BDs of one shim task: mlir-aie's fill/drain is one BD (`shim_dma_single_bd_task`);
    `check_walk` refuses the walks that would need more (over 4 dimensions, repeats over 64,
    wraps beyond the fields)."""
    return 1


class DmaLimits:
    """A buffer descriptor's limits at one kind of tile (AIE-ML/XDNA register widths, as
    mlir-aie's `verifyStridesWraps` checks them; aie2p has the same fields).

    `dims`: address dimensions (the innermost first); `wrapped`: those whose size is a field of
    `wrap_bits` (the outermost address dimension of a shim or core BD has no size field: it
    runs until the BD's length); `step_bits`: every stride is a field of that width (in 32-bit
    words, stored minus one); `length_bits`: the BD's length in words, which alone describes a
    linear transfer (no wraps at all). A repeat (iteration) of at most 64 may wrap everything.
    """

    def __init__(self, dims, wrapped, wrap_bits, step_bits, length_bits):
        self.dims, self.wrapped = dims, wrapped
        self.max_wrap = (1 << wrap_bits) - 1
        self.max_stride = 1 << step_bits
        self.max_length = (1 << length_bits) - 1


# Shim (NOC) tile: d0, d1 wraps of 10 bits, d2 implied by the length, 20-bit steps, 32-bit
# length. Memory tile: d0, d1, d2 wraps of 10 bits, d3 implied, 17-bit steps and length.
# Compute tile: d0, d1 wraps of 8 bits, d2 implied, 13-bit steps, 14-bit length.
LIMITS = {
    "shim": DmaLimits(3, (0, 1), 10, 20, 32),
    "mem": DmaLimits(4, (0, 1, 2), 10, 17, 17),
    "core": DmaLimits(3, (0, 1), 8, 13, 14),
}
# The repeat (iteration) count of a BD.
MAX_REPEAT = 64
# Kept for callers and tests that name the shim's limits.
MAX_WRAP = LIMITS["shim"].max_wrap
MAX_STRIDE_WORDS = LIMITS["shim"].max_stride
DIMS = {k: v.dims + (1 if k == "shim" else 0) for k, v in LIMITS.items()}


class DesignError(Exception):
    """What the real toolchain or hardware would reject."""


def _tile_json(t: Tile):
    return [t.col, t.row]


def _kind(t: Tile) -> str:
    return "shim" if t.row == 0 else "mem" if t.row == 1 else "core"


def _linear(sizes, strides, dims: int) -> bool:
    """The canonical linear form [1, 1, len] with strides [0, 0, 1] (the address dimensions,
    outermost first, padded to `dims` with size 1 and stride 0 as IRON pads a pattern; a
    shim's repeat is not part of it): mlir-aie lowers it to a BD without wraps
    (`isLinearTransferWithoutTransformation`, the repeat excluded), whose length field has no
    1023 limit. Anything else is programmed with wraps and checked against them: mlir-aie
    before its canonicalisation (zeroing the strides of size-1 dimensions, folding contiguous
    walks) takes [1, 1, 4096] with strides [0, 4096, 1], or [2, 1024] with [1024, 1], as
    d0 = 4096 or 1024 words and rejects it, so a design must spell a long run exactly so."""
    pad = max(0, dims - len(sizes))
    sizes, strides = [1] * pad + list(sizes), [0] * pad + list(strides)
    outer = all(n == 1 and s == 0 for n, s in zip(sizes[:-1], strides[:-1]))
    return outer and (sizes[-1] == 1 or strides[-1] == 1)


def check_walk(what: str, kind: str, offset: int, sizes, strides, elem_bytes: int) -> None:
    """The DMA limits of one access pattern (elements of `elem_bytes`, sizes and strides the
    outermost first, as IRON's TensorAccessPattern) at a `kind` tile; `what` names the fifo
    and tensor, the errors name the dimension at fault."""
    lim = LIMITS[kind]
    sizes, strides = [int(n) for n in sizes], [int(s) for s in strides]

    def fail(msg):
        raise DesignError(f"{what}: {msg} (sizes {sizes}, strides {strides}, {kind} tile DMA)")

    if any(n < 1 for n in sizes):
        fail("a dimension of size 0")
    if (offset * elem_bytes) % WORD:
        fail(f"offset {offset} x {elem_bytes} bytes is not on a 32-bit word")
    # A shim BD repeats (iterates) itself: the outermost of four dimensions.
    repeat, rstride = 1, 0
    if kind == "shim" and len(sizes) == 4:
        repeat, rstride = sizes[0], strides[0]
        sizes_in, strides_in = sizes[1:], strides[1:]
    else:
        sizes_in, strides_in = list(sizes), list(strides)
    if repeat > MAX_REPEAT:
        fail(f"the repeat count (dimension 0, the outermost) is {repeat}, at most {MAX_REPEAT}")
    if repeat > 1 and (rstride * elem_bytes) % WORD:
        fail(f"the repeat stride {rstride} x {elem_bytes} bytes is not whole 32-bit words")
    if repeat > 1 and rstride * elem_bytes // WORD > lim.max_stride:
        fail(
            f"the repeat stride (dimension 0) is {rstride * elem_bytes // WORD} words, at most "
            f"{lim.max_stride}"
        )
    # A stride of 0 re-reads (or re-writes) data, which only a shim task's repeat can do.
    # Shim tasks (fill/drain taps): mlir-aie's `verifyStridesWraps` requires a positive
    # stride on its dimensions 0-2 of size > 1 (the BD's address dimensions d0-d2, whose
    # step fields hold stride - 1: "Stride i must be a positive integer") and takes 0 on
    # dimension 3 alone, the iteration, i.e. the outermost of a four-dimensional tap
    # (`repeat` above; it is then programmed as a repeat count, the BD wrapping every
    # iteration, so the stride is never added). A tap of fewer than four dimensions is
    # padded on the outside, so its outermost dimension is an address dimension. Memory
    # and compute tile BDs (a fifo's to_stream / from_stream: `aie.dma_bd` dimensions)
    # carry no iteration dimension here, and their verifier refuses any zero step ("Invalid
    # step size; must be a positive integer"); dimensions of size 1, whose stride is never
    # applied and which IRON pads a pattern with, are let through for every tile.
    for i, (n, st) in enumerate(zip(sizes, strides)):
        is_repeat = kind == "shim" and len(sizes) == 4 and i == 0
        if n > 1 and st == 0 and not is_repeat:
            where = (
                "a shim task repeats data only by its outermost (fourth) dimension, the "
                "repeat count"
                if kind == "shim"
                else f"a {kind} tile BD cannot repeat data"
            )
            fail(f"dimension {i} (size {n}) has stride 0: {where}")
    linear = _linear(sizes_in, strides_in, lim.dims)
    # Outer address dimensions of size 1 are dropped (never walked).
    while len(sizes_in) > 1 and sizes_in[0] == 1:
        sizes_in, strides_in = sizes_in[1:], strides_in[1:]
    if linear:
        n = sizes_in[-1]
        if (n * elem_bytes) % WORD:
            fail(f"{n} elements of {elem_bytes} bytes are not whole 32-bit words")
        if n * elem_bytes // WORD > lim.max_length:
            fail(
                f"a linear transfer of {n * elem_bytes // WORD} words, the BD length allows "
                f"{lim.max_length}"
            )
        return
    if len(sizes_in) > lim.dims:
        fail(f"{len(sizes_in)} address dimensions, a {kind} tile BD has {lim.dims}")
    inner_n, inner_s = sizes_in[-1], strides_in[-1]
    if elem_bytes != WORD and inner_s != 1:
        fail(
            f"the innermost dimension (dimension {len(sizes) - 1}) moves {elem_bytes}-byte "
            f"elements with stride {inner_s}: they must be moved in contiguous 32-bit words"
        )
    if (inner_n * elem_bytes) % WORD:
        fail(
            f"the innermost dimension (dimension {len(sizes) - 1}) moves {inner_n} elements of "
            f"{elem_bytes} bytes, not whole 32-bit words"
        )
    # Hardware order: d0 innermost, sizes and strides in 32-bit words.
    hw = []
    for j, (n, st) in enumerate(zip(reversed(sizes_in), reversed(strides_in))):
        user = len(sizes) - 1 - j
        if j == 0:
            words, step = n * elem_bytes // WORD, 1
        else:
            if n > 1 and (st * elem_bytes) % WORD:
                fail(
                    f"the stride of dimension {user} ({st} x {elem_bytes} bytes) is not whole words"
                )
            words, step = n, st * elem_bytes // WORD
        hw.append((user, words, step, n))
    for d, (user, words, step, n) in enumerate(hw):
        if n > 1 and step > lim.max_stride:
            fail(f"dimension {user} (d{d}) has a stride of {step} words, at most {lim.max_stride}")
        if d in lim.wrapped and words > lim.max_wrap:
            unit = "words" if d == 0 else "steps"
            fail(
                f"dimension {user} (d{d}) wraps after {words} {unit}, the {kind} tile DMA allows "
                f"{lim.max_wrap}; a longer run must be a linear transfer or split over two "
                "dimensions"
            )


class Recorded:
    """The program `Program.resolve_program()` recorded, validated on construction."""

    def __init__(self, prog, state):
        self.device = prog.device
        self.rt = prog.rt
        self.workers = prog.workers
        self.fifos = state.fifos
        self.links = state.links
        self._place()
        self._endpoints()
        self._kernels()
        self.validate()

    # ------------------------------------------------------------------ resolution

    def _place(self):
        """Unplaced workers and links get the first free tiles (upstream places them with
        `--aie-place-tiles`; the emulator's choice need not match it)."""
        used = {w.tile for w in self.workers if w.tile is not None}
        seen = set()
        for w in self.workers:
            if w.tile is not None:
                if w.tile in seen:
                    raise DesignError(f"two Workers are placed on {w.tile}")
                if w.tile.col >= self.device.cols or w.tile.row >= self.device.rows:
                    raise DesignError(f"{w!r}: {w.tile} is outside {self.device!r}")
                seen.add(w.tile)
        free = (
            Tile(c, r)
            for c in range(self.device.cols)
            for r in range(2, self.device.rows)
            if Tile(c, r) not in used
        )
        for w in self.workers:
            if w.tile is None:
                try:
                    w.tile = next(free)
                except StopIteration:
                    raise DesignError("more Workers than compute tiles") from None
        for link in self.links:
            if link.tile is None:
                link.tile = Tile(0, 1)
            if link.tile.col >= self.device.cols:
                raise DesignError(f"{link!r}: {link.tile} is outside {self.device!r}")

    def _endpoint(self, h: ObjectFifoHandle, side: str):
        e = h.endpoint
        f = h._object_fifo
        if e is None:
            raise DesignError(
                f"a {side} handle of ObjectFifo {f.name} is not given to a Worker, a link or "
                "the Runtime"
            )
        if isinstance(e, Worker):
            if e not in self.workers:
                raise DesignError(f"{e!r} uses ObjectFifo {f.name} but is not in Program workers=")
            return {"kind": "core", "tile": _tile_json(e.tile), "depth": h.depth}, e.tile
        if isinstance(e, Runtime):
            t = h.tile or Tile(0, 0)
            if t.row != 0:
                raise DesignError(f"runtime endpoint of {f.name}: {t} is not a shim tile")
            return {"kind": "shim", "tile": _tile_json(t), "depth": 0}, t
        assert isinstance(e, _Link)
        d = {"kind": e.kind, "tile": _tile_json(e.tile), "depth": h.depth, "link": e.id}
        if e.kind == "split" and h.is_prod:
            d["index"] = e.subs.index(f)
        if e.kind == "join" and not h.is_prod:
            d["index"] = e.inputs.index(h)
        return d, e.tile

    def _endpoints(self):
        self.ports = {}  # handle -> (fifo id, consumer index or None)
        self.fifo_json = []
        self.tile_use = {}  # tile -> list of (what, bytes, bds, in/out)
        for f in self.fifos:
            if f._prod is None:
                raise DesignError(f"ObjectFifo {f.name} has no producer handle")
            prod, ptile = self._endpoint(f._prod, "producer")
            self.ports[f._prod] = (f.id, None)
            cons, runtime_seen = [], None
            for h in f._cons:
                c, ctile = self._endpoint(h, "consumer")
                if c["kind"] == "shim":
                    # IRON prunes duplicate runtime consumers of one fifo: every drain
                    # handle is the one shim endpoint.
                    if runtime_seen is not None:
                        self.ports[h] = (f.id, runtime_seen)
                        continue
                    runtime_seen = len(cons)
                self.ports[h] = (f.id, len(cons))
                cons.append((c, ctile, h))
            if not cons:
                raise DesignError(f"ObjectFifo {f.name} has no consumer")
            if prod["kind"] == "shim" and any(c["kind"] == "shim" for c, _, _ in cons):
                raise DesignError(f"ObjectFifo {f.name} goes from the Runtime to the Runtime")
            entry = {
                "id": f.id,
                "name": f.name,
                "obj_bytes": f.obj.bytes,
                "elem_bytes": f.obj.elem_bytes,
                "depth": f.depth,
                "producer": prod,
                "consumers": [c for c, _, _ in cons],
            }
            if f.to_stream is not None:
                if prod["kind"] == "shim":
                    raise DesignError(
                        f"ObjectFifo {f.name}: to_stream on a fifo the Runtime fills "
                        "(the fill's tap is the walk)"
                    )
                entry["to_stream"] = self._stream_walk(
                    f"{f.name} to_stream", f.to_stream, f, f._prod.endpoint, ptile
                )
            for c, ctile, h in cons:
                if h.from_stream is not None:
                    c["from_stream"] = self._stream_walk(
                        f"{f.name} from_stream", h.from_stream, f, h.endpoint, ctile
                    )
            self.fifo_json.append(entry)
            # Resources: buffers, BDs, locks, channels.
            self._use(ptile, f"{f.name} (producer)", f._prod, prod, out=True)
            for c, ctile, h in cons:
                self._use(ctile, f"{f.name} (consumer)", h, c, out=False)

    def _stream_walk(self, what, tap, f, endpoint, tile) -> dict:
        """A fifo end's stream walk: checked against one transfer (an object, or each segment
        of a link's shared object) and against that tile's BD limits; in the program JSON over
        the whole object (the walk of each segment one after the other: an outer dimension of
        the segments), as the executor applies it."""
        sizes = [f.obj.elems]
        if isinstance(endpoint, _Link):
            sizes = endpoint.transfer_sizes(f)
        check_walk_size(what, tap, sizes)
        check_walk(what, _kind(tile), 0, tap.sizes, tap.strides, f.obj.elem_bytes)
        j = tap_json(tap)
        if len(sizes) > 1:
            j["sizes"] = [len(sizes), *j["sizes"]]
            j["strides"] = [sizes[0], *j["strides"]]
        return j

    def _use(self, tile, what, h, ep, out):
        kind = ep["kind"]
        f = h._object_fifo
        u = self.tile_use.setdefault(tile, {"buffers": [], "bds": 0, "in": 0, "out": 0, "locks": 0})
        u["out" if out else "in"] += 1
        if kind == "shim":
            return
        # One BD moves one object: its length field bounds the object (a memory tile's 17
        # bits, a compute tile's 14, in words).
        lim = LIMITS[_kind(tile)]
        if f.obj.bytes // WORD > lim.max_length:
            raise DesignError(
                f"ObjectFifo {f.name}: objects of {f.obj.bytes // WORD} words at {tile}, a BD "
                f"there moves at most {lim.max_length}"
            )
        depth = h.depth
        if kind == "core":
            u["buffers"].append((f"{f.name} {depth} x {f.obj.bytes} B", depth * f.obj.bytes))
        elif (kind == "split" and not out) or (kind == "join" and out):
            # The link's ring in the memory tile: the sub-fifos share it.
            u["buffers"].append((f"{f.name} {depth} x {f.obj.bytes} B", depth * f.obj.bytes))
            # Each buffer of the shared ring moves one transfer per segment (the sub-fifos'
            # objects), each a BD of its own (upstream `ObjectFifoLink._transfer_sizes`).
            depth *= len(self.links[ep["link"]].subs)
        u["bds"] += depth
        u["locks"] += 2

    def _kernels(self):
        self.kernels = []

        def walk(body):
            for op in body:
                if op["op"] == "loop":
                    walk(op["body"])
                elif op["op"] == "call":
                    k = op["kernel"]
                    if k not in self.kernels:
                        k.index = len(self.kernels)
                        self.kernels.append(k)

        for w in self.workers:
            walk(w.body)

    # ------------------------------------------------------------------ validation

    def validate(self):
        names = {}
        for f in self.fifos:
            if f.name in names:
                raise DesignError(f"two ObjectFifos are named {f.name}")
            names[f.name] = f
        for tile, u in sorted(self.tile_use.items(), key=lambda kv: (kv[0].col, kv[0].row)):
            kind = _kind(tile)
            if kind == "core":
                w = next(w for w in self.workers if w.tile == tile)
                total = sum(b for _, b in u["buffers"]) + w.stack_size
                if total > CORE_MEMORY:
                    parts = ", ".join(d for d, _ in u["buffers"])
                    raise DesignError(
                        f"core {tile}: {total} bytes of data memory needed (fifo buffers: "
                        f"{parts}; stack {w.stack_size} B), a core has {CORE_MEMORY}"
                    )
            elif kind == "mem":
                total = sum(b for _, b in u["buffers"])
                if total > MEMTILE_MEMORY:
                    parts = ", ".join(d for d, _ in u["buffers"])
                    raise DesignError(
                        f"memory tile {tile}: {total} bytes needed ({parts}), a memory tile "
                        f"has {MEMTILE_MEMORY}"
                    )
            for d in ("in", "out"):
                if u[d] > CHANNELS[kind]:
                    what = "input (S2MM)" if d == "in" else "output (MM2S)"
                    raise DesignError(
                        f"{kind} tile {tile}: {u[d]} {what} DMA channels needed, it has "
                        f"{CHANNELS[kind]}"
                    )
            self._check_bds(f"{kind} tile {tile}", kind, u["bds"])
            if u["locks"] > LOCKS[kind]:
                raise DesignError(
                    f"{kind} tile {tile}: {u['locks']} locks needed, it has {LOCKS[kind]}"
                )
        for w in self.workers:
            self._check_balance(w)
        self._check_sequence()

    def _check_balance(self, w):
        held = {}

        def run(body, where):
            start = dict(held)
            for op in body:
                if op["op"] == "loop":
                    if op["count"] > 0:
                        run(op["body"], f"a loop of {w!r}")
                elif op["op"] == "acquire":
                    h = op["handle"]
                    held[h] = max(held.get(h, 0), op["n"])
                elif op["op"] == "release":
                    h = op["handle"]
                    if held.get(h, 0) < op["n"]:
                        raise DesignError(
                            f"{w!r} releases {op['n']} object(s) of ObjectFifo {h.name} while "
                            f"holding {held.get(h, 0)}"
                        )
                    held[h] -= op["n"]
            for h in set(start) | set(held):
                if start.get(h, 0) != held.get(h, 0):
                    raise DesignError(
                        f"unbalanced acquire/release in {where}: ObjectFifo {h.name} is held "
                        f"{start.get(h, 0)} time(s) before an iteration and {held.get(h, 0)} "
                        "after"
                    )

        run(w.body, f"the body of {w!r}")

    def _check_sequence(self):
        """Every fill's and drain's walk at the shim, and the shim tiles' buffer descriptors
        over the sequence: a task holds its BDs (`task_bds`) from its issue until its group
        frees them (`TaskGroup.finish()`; the default group's at the end of the sequence), as
        mlir-aie's runtime-sequence BD allocation assigns them ("Too many simultaneously
        active buffer descriptors")."""
        seq = self.rt.sequence
        held = {}  # shim tile -> BDs held
        owner = {}  # task -> (tile, BDs)
        frees = {}
        for t, i in seq.frees.items():
            frees.setdefault(i, []).append(t)
        self.shim_bd_peak = {}
        for i, op in enumerate(seq.ops):
            for t in frees.get(i, []):
                tile, n = owner.pop(t)
                held[tile] -= n
            if op["op"] == "await":
                continue
            h = op["handle"]
            fid, _ = self.ports[h]
            ep = self.fifo_json[fid]["producer" if op["op"] == "fill" else "consumers"]
            if op["op"] == "drain":
                ep = next(c for c in ep if c["kind"] == "shim")
            tile = tuple(ep["tile"])
            tap = op["tap"]
            what = f"{op['op']} of {h.name} (task {op['task']}, runtime tensor {op['arg']})"
            check_walk(what, "shim", tap.offset, tap.sizes, tap.strides, op["elem_bytes"])
            n = task_bds(tap.sizes, tap.strides, op["elem_bytes"])
            owner[op["task"]] = (tile, n)
            held[tile] = held.get(tile, 0) + n
            if held[tile] > self.shim_bd_peak.get(tile, (0, ""))[0]:
                self.shim_bd_peak[tile] = (held[tile], f" ({what} issued)")
            if held[tile] > BDS["shim"]:
                self._check_bds(f"shim tile {tile}", "shim", held[tile], f" ({what} issued)")
        for tile, (n, context) in self.shim_bd_peak.items():
            self._check_bds(f"shim tile {tile}", "shim", n, context)
        self.shim_bd_peak = {tile: n for tile, (n, _) in self.shim_bd_peak.items()}

    def _check_bds(self, where, kind, n, context=""):
        """The hardware's BD count, then the designs' margin (BD_MARGIN kept free)."""
        if n > BDS[kind]:
            raise DesignError(
                f"Too many simultaneously active buffer descriptors on {where}, which supports "
                f"up to {BDS[kind]}: {n} needed{context}"
            )
        if n > BDS[kind] - BD_MARGIN:
            raise DesignError(
                f"{where}: {n} buffer descriptors active at once{context}; the designs keep "
                f"{BD_MARGIN} of its {BDS[kind]} free (BD_MARGIN)"
            )

    # ------------------------------------------------------------------ JSON

    def _body_json(self, body):
        out = []
        for op in body:
            k = op["op"]
            if k == "loop":
                e = {"op": "loop", "count": op["count"], "body": self._body_json(op["body"])}
                if op.get("forever"):
                    e = {"op": "loop", "forever": True, "body": e["body"]}
                out.append(e)
            elif k in ("acquire", "release"):
                fid, ci = self.ports[op["handle"]]
                e = {"op": k, "fifo": fid, "n": op["n"]}
                if ci is not None:
                    e["cons"] = ci
                if k == "acquire":
                    e["var"] = op["var"]
                out.append(e)
            else:
                out.append({"op": "call", "kernel": op["kernel"].index, "args": op["args"]})
        return out

    def to_json(self, name: str, arch: str, args_bytes=None) -> dict:
        data = self.rt.data
        args = [
            {
                "index": d.index,
                "type": d.obj.name,
                "elem_bytes": d.obj.elem_bytes,
                "bytes": d.obj.bytes,
            }
            for d in data
        ]
        links = []
        for link in self.links:
            parent = link.handle._object_fifo
            links.append(
                {
                    "id": link.id,
                    "kind": link.kind,
                    "tile": _tile_json(link.tile),
                    "fifo": parent.id,
                    "subfifos": [f.id for f in link.subs],
                    "offsets": [o * parent.obj.elem_bytes for o in link.offsets],
                }
            )
        seq = []
        for op in self.rt.sequence.ops:
            if op["op"] == "await":
                seq.append({"op": "await", "tasks": op["tasks"]})
                continue
            fid, _ = self.ports[op["handle"]]
            seq.append(
                {
                    "op": op["op"],
                    "task": op["task"],
                    "fifo": fid,
                    "arg": op["arg"],
                    "tap": tap_json(op["tap"]),
                    "elem_bytes": op["elem_bytes"],
                    "wait": op["wait"],
                }
            )
        kernels = []
        for k in self.kernels:
            kinds = [
                {"kind": "i32"} if kk == "i32" else {"kind": "buffer", "bytes": kk.bytes}
                for kk in k.kinds
            ]
            kernels.append({"symbol": f"ggml_hsa_emu_{k.index}", "name": k.name, "args": kinds})
        return {
            "name": name,
            "arch": arch,
            "device": {"name": self.device.name, "cols": self.device.cols},
            "args": args,
            "kernels": kernels,
            "fifos": self.fifo_json,
            "links": links,
            "workers": [
                {
                    "tile": _tile_json(w.tile),
                    "stack_bytes": w.stack_size,
                    "body": self._body_json(w.body),
                }
                for w in self.workers
            ],
            "sequence": seq,
        }
