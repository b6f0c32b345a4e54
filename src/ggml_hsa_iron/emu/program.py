"""A recorded IRON program: endpoint resolution, validation against the hardware limits, and
the program JSON of image version 2 (docs/kernel-compiler-protocol.md, "Emulation images").

Validation raises `DesignError` with a message naming the tile, fifo or task at fault; the
limits are those of mlir-aie's AIE2 target model (aie2 and aie2p report the same numbers).
"""

from .iron import ObjectFifoHandle, Runtime, Tile, Worker, _Link

CORE_MEMORY = 64 * 1024
MEMTILE_MEMORY = 512 * 1024
BDS = {"core": 16, "mem": 48, "shim": 16}
LOCKS = {"core": 16, "mem": 64, "shim": 16}
CHANNELS = {"core": 2, "mem": 6, "shim": 2}
DIMS = {"core": 3, "mem": 4, "shim": 4}
MAX_WRAP = 1023
MAX_REPEAT = 64
MAX_STRIDE_WORDS = 1 << 20
WORD = 4


class DesignError(Exception):
    """What the real toolchain or hardware would reject."""


def _tile_json(t: Tile):
    return [t.col, t.row]


def _kind(t: Tile) -> str:
    return "shim" if t.row == 0 else "mem" if t.row == 1 else "core"


def _contiguous(sizes, strides) -> bool:
    acc = 1
    for n, s in zip(reversed(sizes), reversed(strides)):
        if n != 1 and s != acc:
            return False
        acc *= n
    return True


def check_walk(what: str, kind: str, offset: int, sizes, strides, elem_bytes: int) -> None:
    """The DMA limits of one access pattern (elements of `elem_bytes`) at a `kind` tile."""
    sizes, strides = list(sizes), list(strides)
    if _contiguous(sizes, strides):
        # A linear transfer: one buffer descriptor of a length, no dimensions.
        n = 1
        for s in sizes:
            n *= s
        if (n * elem_bytes) % WORD or (offset * elem_bytes) % WORD:
            raise DesignError(
                f"{what}: {n} elements of {elem_bytes} bytes at element {offset} are not whole "
                "32-bit words (DMA address granularity)"
            )
        return
    # Drop outer dimensions of size 1 beyond the tile's dimension count.
    while len(sizes) > DIMS[kind] and sizes[0] == 1:
        sizes, strides = sizes[1:], strides[1:]
    if len(sizes) > DIMS[kind]:
        raise DesignError(
            f"{what}: {len(sizes)} dimensions, a {kind} tile DMA has {DIMS[kind]} "
            f"(sizes {sizes}, strides {strides})"
        )
    if (offset * elem_bytes) % WORD:
        raise DesignError(f"{what}: offset {offset} x {elem_bytes} bytes is not 4-byte aligned")
    inner_n, inner_s = sizes[-1], strides[-1]
    if elem_bytes < WORD:
        if inner_s != 1 or (inner_n * elem_bytes) % WORD:
            raise DesignError(
                f"{what}: the innermost dimension moves {inner_n} elements of {elem_bytes} "
                f"bytes with stride {inner_s}; {elem_bytes}-byte elements must be moved in "
                "contiguous whole 32-bit words"
            )
    for s in strides[:-1]:
        if (s * elem_bytes) % WORD:
            raise DesignError(
                f"{what}: stride {s} x {elem_bytes} bytes is not a multiple of 32 bits "
                f"(sizes {sizes}, strides {strides})"
            )
    # Hardware order: dimension 0 innermost, in 32-bit words.
    hw_sizes = list(reversed(sizes))
    hw_strides = list(reversed(strides))
    hw_sizes[0] = hw_sizes[0] * elem_bytes // WORD if elem_bytes < WORD else hw_sizes[0]
    hw_strides = [s * elem_bytes // WORD if s else 0 for s in hw_strides]
    if elem_bytes < WORD:
        hw_strides[0] = 1
    for i, (n, s) in enumerate(zip(hw_sizes, hw_strides)):
        if s > MAX_STRIDE_WORDS:
            raise DesignError(
                f"{what}: stride of dimension {i} is {s} words, the DMA allows "
                f"{MAX_STRIDE_WORDS} (sizes {sizes}, strides {strides})"
            )
        if kind == "shim":
            if i == 3 and n > MAX_REPEAT:
                raise DesignError(
                    f"{what}: repeat count (outermost size) {n} exceeds {MAX_REPEAT} "
                    f"(sizes {sizes}, strides {strides})"
                )
            limited = i < 2 and s != 0
        else:
            limited = True
        if limited and n > MAX_WRAP:
            raise DesignError(
                f"{what}: dimension {i} wraps after {n} (words), the DMA allows {MAX_WRAP} "
                f"(sizes {sizes}, strides {strides})"
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
                if h.from_stream is not None:
                    c["from_stream"] = h.from_stream.to_json()
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
                entry["to_stream"] = f.to_stream.to_json()
                check_walk(
                    f"to_stream of {f.name}",
                    _kind(ptile),
                    0,
                    f.to_stream.sizes,
                    f.to_stream.strides,
                    f.obj.elem_bytes,
                )
            for _c, ctile, h in cons:
                if h.from_stream is not None:
                    check_walk(
                        f"from_stream of {f.name}",
                        _kind(ctile),
                        0,
                        h.from_stream.sizes,
                        h.from_stream.strides,
                        f.obj.elem_bytes,
                    )
            self.fifo_json.append(entry)
            # Resources: buffers, BDs, locks, channels.
            self._use(ptile, f"{f.name} (producer)", f._prod, prod, out=True)
            for c, ctile, h in cons:
                self._use(ctile, f"{f.name} (consumer)", h, c, out=False)

    def _use(self, tile, what, h, ep, out):
        kind = ep["kind"]
        f = h._object_fifo
        u = self.tile_use.setdefault(tile, {"buffers": [], "bds": 0, "in": 0, "out": 0, "locks": 0})
        u["out" if out else "in"] += 1
        if kind == "shim":
            return
        depth = h.depth
        if kind == "core":
            u["buffers"].append((f"{f.name} {depth} x {f.obj.bytes} B", depth * f.obj.bytes))
        elif (kind == "split" and not out) or (kind == "join" and out):
            # The link's ring in the memory tile: the sub-fifos share it.
            u["buffers"].append((f"{f.name} {depth} x {f.obj.bytes} B", depth * f.obj.bytes))
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
            if u["bds"] > BDS[kind]:
                raise DesignError(
                    f"{kind} tile {tile}: {u['bds']} buffer descriptors needed, it has {BDS[kind]}"
                )
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
        seq = self.rt.sequence
        inflight = {}
        for op in seq.ops:
            if op["op"] == "await":
                inflight = {}
                continue
            h = op["handle"]
            fid, _ = self.ports[h]
            ep = self.fifo_json[fid]["producer" if op["op"] == "fill" else "consumers"]
            if op["op"] == "drain":
                ep = next(c for c in ep if c["kind"] == "shim")
            tile = tuple(ep["tile"])
            tap = op["tap"]
            check_walk(
                f"{op['op']} of {h.name} (task {op['task']})",
                "shim",
                tap.offset,
                tap.sizes,
                tap.strides,
                op["elem_bytes"],
            )
            inflight[tile] = inflight.get(tile, 0) + 1
            if inflight[tile] > BDS["shim"]:
                raise DesignError(
                    f"shim tile {tile}: more than {BDS['shim']} DMA tasks in flight before an "
                    "await (buffer descriptors exhausted)"
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
                    "tap": op["tap"].to_json(),
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
