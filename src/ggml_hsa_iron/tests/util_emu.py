"""Runs a design compiled for the emulation target on real data, in Python.

`run_request(request_json, inputs)` does what `python3 -m ggml_hsa_iron --target emu compile`
does (plan, record the unmodified IRON design against the `aie.iron` stand-in with its hardware
checks, build the core source with g++ against the AIE-API stand-in), then interprets the
recorded program (the JSON of the simulator image) on the given operand bytes:

* the runtime sequence's fills walk their taps over the argument bytes into their fifo's
  stream, cut into objects of the fifo's size; drains walk their taps over the output;
* memory-tile links: `split` hands each sub-fifo its segment of every object, `join`
  assembles an object from one object of every sub-fifo at its offset; a fifo with several
  consumers (broadcast) gives each of them every object;
* every Worker runs its recorded body (loops, acquire/release, kernel calls) against its own
  copy of the kernel library (core-local static data, as on the NPU); an object a producer
  acquires starts as 0xFF bytes (f32 NaN), so a kernel that reads its output before writing
  it shows.

FIFOs are unbounded and actors run one after the other (all fills, the splits, the workers in
order, the joins, the workers that read a join's output, the drains): this checks what data every core receives, what it computes
and where its results go, not timing or deadlocks (hsa-sim's executor checks those when the
image runs under `cargo test`). A memory tile's `to_stream` re-layout (the GEMM's A and B
blocks, its C rows) permutes each object as it leaves the memory tile; a `forward` is a split
into one sub-fifo. Consumer-side re-layouts (`from_stream`) are not interpreted: a program
using them is refused here.
"""

import ctypes
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ggml_hsa_iron.emu.compile import build_program
from ggml_hsa_iron.emu.params import instantiate
from ggml_hsa_iron.plans import prepare
from ggml_hsa_iron.request import parse_request


def walk_array(dims) -> np.ndarray:
    """tiling.walk(dims) as an int64 array, built by broadcasting (a model-sized tap visits
    millions of elements, which the list takes seconds to enumerate)."""
    offsets = np.zeros(1, dtype=np.int64)
    for size, stride in dims:
        offsets = (offsets[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
    return offsets


def _tap_bytes(tap: dict, elem_bytes: int) -> np.ndarray:
    """Byte offsets (in the argument) a tap visits, in order."""
    elems = walk_array(zip(tap["sizes"], tap["strides"])) + tap["offset"]
    return (elems[:, None] * elem_bytes + np.arange(elem_bytes)[None, :]).reshape(-1)


class _Fifo:
    def __init__(self, j):
        self.j = j
        self.obj = j["obj_bytes"]
        self.queues = [[] for _ in j["consumers"]]  # per consumer: objects (np.uint8 arrays)
        self.stream = bytearray()  # a shim producer's bytes not yet a whole object
        # A memory tile producer's re-layout (`to_stream`): the consumers' byte j is the
        # object's byte relayout[j] (element walk(dims)[j // elem_bytes]).
        self.relayout = None
        if j.get("to_stream"):
            self.relayout = _tap_bytes(j["to_stream"], j["elem_bytes"])

    def push(self, obj: np.ndarray):
        if self.relayout is not None:
            obj = obj[self.relayout]
        for q in self.queues:
            q.append(obj.copy())

    def push_stream(self, data: np.ndarray):
        self.stream += data.tobytes()
        while len(self.stream) >= self.obj:
            self.push(np.frombuffer(bytes(self.stream[: self.obj]), dtype=np.uint8).copy())
            del self.stream[: self.obj]


class _Core:
    """One Worker: its body, its own copy of the kernel library."""

    def __init__(self, w, lib_path: Path, kernels, fifos):
        self.w = w
        self.lib = ctypes.CDLL(str(lib_path))
        self.fns = [getattr(self.lib, k["symbol"]) for k in kernels]
        self.fifos = fifos
        self.held = {}  # (fifo, cons index or None) -> held objects
        self.vars = {}

    def _key(self, op):
        return op["fifo"], op.get("cons")

    def run(self, body):
        for fifo, _ in self.steps(body):
            raise RuntimeError(
                f"worker {self.w['tile']}: fifo {fifo} is empty "
                "(the sequence sent fewer objects than the core takes)"
            )

    def steps(self, body):
        """`run` as a generator: while an acquire finds its queue empty, yields the fifo's name
        and that queue, and goes on when resumed (util_emu_seq's executor, which feeds the
        fifos as the runtime sequence goes)."""
        for op in body:
            k = op["op"]
            if k == "loop":
                for _ in range(1 if op.get("forever") else op["count"]):
                    yield from self.steps(op["body"])
            elif k == "acquire":
                fifo, held = self.fifos[op["fifo"]], self.held.setdefault(self._key(op), [])
                while len(held) < op["n"]:
                    if op.get("cons") is None:
                        held.append(np.full(fifo.obj, 0xFF, dtype=np.uint8))
                    else:
                        q = fifo.queues[op["cons"]]
                        while not q:
                            yield fifo.j["name"], q
                        held.append(q.pop(0))
                self.vars[op["var"]] = held[: op["n"]]
            elif k == "release":
                fifo, held = self.fifos[op["fifo"]], self.held[self._key(op)]
                out, held[:] = held[: op["n"]], held[op["n"] :]
                if op.get("cons") is None:
                    for obj in out:
                        fifo.push(obj)
            else:
                args = []
                for a in op["args"]:
                    if "i32" in a:
                        args.append(a["i32"] & 0xFFFFFFFF)
                    else:
                        args.append(self.vars[a["var"]][a["index"]].ctypes.data)
                arr = (ctypes.c_uint64 * max(1, len(args)))(*args)
                self.fns[op["kernel"]](arr)


def _consumed(body) -> set:
    """The fifos a worker body acquires from as a consumer."""
    out = set()
    for op in body:
        if op["op"] == "loop":
            out |= _consumed(op["body"])
        elif op["op"] == "acquire" and op.get("cons") is not None:
            out.add(op["fifo"])
    return out


def _joins(prog, fifos, link_cons, which) -> None:
    """Joins (the link ids in `which`): one object of every sub-fifo makes one object of the
    parent."""
    for link in prog["links"]:
        if link["kind"] == "join" and link["id"] in which:
            parent = fifos[link["fifo"]]
            subs = [fifos[s] for s in link["subfifos"]]
            counts = {len(s.queues[link_cons(s.j["id"], link["id"])]) for s in subs}
            if len(counts) != 1:
                raise RuntimeError(f"join {parent.j['name']}: unequal sub-fifo objects {counts}")
            for _ in range(counts.pop()):
                obj = np.zeros(parent.obj, dtype=np.uint8)
                for s, off in zip(subs, link["offsets"]):
                    obj[off : off + s.obj] = s.queues[link_cons(s.j["id"], link["id"])].pop(0)
                parent.push(obj)


def run_program(prog: dict, lib: bytes, args: list[np.ndarray]) -> None:
    """Interprets `prog` (the recorded program's JSON) with the core library `lib` on the
    runtime-sequence arguments `args` (np.uint8 arrays, the outputs written in place)."""
    fifos = [_Fifo(f) for f in prog["fifos"]]
    for link in prog["links"]:
        if link["kind"] not in ("split", "join"):
            raise NotImplementedError(f"link kind {link['kind']}")
    for f in prog["fifos"]:
        if any(c.get("from_stream") for c in f["consumers"]):
            raise NotImplementedError(f"stream re-layouts on the consumer side ({f['name']})")

    # The runtime sequence's fills (they read the inputs only).
    for op in prog["sequence"]:
        if op["op"] == "fill":
            idx = _tap_bytes(op["tap"], op["elem_bytes"])
            fifos[op["fifo"]].push_stream(args[op["arg"]][idx])
    for f in fifos:
        if f.stream:
            raise RuntimeError(f"fifo {f.j['name']}: a fill ends inside an object")

    def link_cons(fid, link_id):
        return next(i for i, c in enumerate(fifos[fid].j["consumers"]) if c.get("link") == link_id)

    # Splits: each object of the parent to the sub-fifos.
    for link in prog["links"]:
        if link["kind"] == "split":
            parent = fifos[link["fifo"]]
            q = parent.queues[link_cons(link["fifo"], link["id"])]
            while q:
                obj = q.pop(0)
                for sub, off in zip(link["subfifos"], link["offsets"]):
                    fifos[sub].push(obj[off : off + fifos[sub].obj])

    with tempfile.TemporaryDirectory(prefix="ggml-hsa-emu-run-") as d:
        cores = []
        for i, w in enumerate(prog["workers"]):
            path = Path(d) / f"core{i}.so"  # one copy per core: its own static data
            path.write_bytes(lib)
            cores.append(_Core(w, path, prog["kernels"], fifos))
        # Joins of the runtime sequence's fills run first; workers reading another join's
        # output (a combining core) run after those joins, the others before them.
        filled = {op["fifo"] for op in prog["sequence"] if op["op"] == "fill"}
        joins = [link for link in prog["links"] if link["kind"] == "join"]
        early = {link["id"] for link in joins if set(link["subfifos"]) <= filled}
        _joins(prog, fifos, link_cons, early)
        joined = {link["fifo"] for link in joins if link["id"] not in early}
        late = [c for c in cores if _consumed(c.w["body"]) & joined]
        for c in cores:
            if c not in late:
                c.run(c.w["body"])
        _joins(prog, fifos, link_cons, {link["id"] for link in joins} - early)
        for c in late:
            c.run(c.w["body"])
        for c in cores:
            for (fid, _), held in c.held.items():
                if held:
                    raise RuntimeError(f"worker {c.w['tile']} still holds {fifos[fid].j['name']}")

    # Drains: the shim consumer's objects, walked onto the output.
    pending = {}
    for op in prog["sequence"]:
        if op["op"] != "drain":
            continue
        fifo = fifos[op["fifo"]]
        cons = next(i for i, c in enumerate(fifo.j["consumers"]) if c["kind"] == "shim")
        idx = _tap_bytes(op["tap"], op["elem_bytes"])
        buf = pending.setdefault(op["fifo"], bytearray())
        q = fifo.queues[cons]
        while len(buf) < len(idx):
            if not q:
                raise RuntimeError(f"drain of {fifo.j['name']}: the cores produced too little")
            buf += q.pop(0).tobytes()
        args[op["arg"]][idx] = np.frombuffer(bytes(buf[: len(idx)]), dtype=np.uint8)
        del buf[: len(idx)]
    for fid, buf in pending.items():
        if buf or any(fifos[fid].queues):
            raise RuntimeError(f"fifo {fifos[fid].j['name']}: objects left undrained")


def run_request(request_json: str, inputs: list[bytes]) -> bytes:
    """Compiles `request_json` for the emulation target and runs it on the input operands'
    bytes; returns the output's bytes."""
    (out,) = run_request_outputs(request_json, inputs)
    return out


def run_request_outputs(request_json: str, inputs: list[bytes]) -> list[bytes]:
    """`run_request` for a request of any number of outputs (`output`, then its
    `extra_outputs`): the bytes of each, in order. Every output operand must be written by some
    drain of the runtime sequence (an output left as it was allocated, 0xFF bytes, is not)."""
    return run_spec_outputs(prepare(parse_request(request_json)), inputs)


def build_spec(spec, n_kv: int | None = None) -> tuple[dict, bytes]:
    """What `--target emu` builds of a prepared spec: the recorded program's JSON (the
    stand-in's hardware checks passed) and the host library of its core sources; a program
    whose n_kv is a run-time argument as hsa-sim instantiates it at dispatch, for `n_kv`
    (its largest by default)."""
    prog, lib = build_program(spec)
    if prog.get("params"):
        prog = instantiate(prog, [n_kv or prog["params"][0]["max"]])
    return prog, lib


def run_spec_outputs(spec, inputs: list[bytes], n_kv: int | None = None) -> list[bytes]:
    """`run_request_outputs` of a prepared spec (one not built by `prepare`: an op's design
    planned over some of the array's columns, say); `n_kv` for a run-time KV length."""
    req = spec.request
    prog, lib = build_spec(spec, n_kv)
    sizes = [a["bytes"] for a in prog["args"]]
    n_in, n_out = len(inputs), len(req.outputs)
    if n_in + n_out != len(sizes):
        raise ValueError(f"{n_in} inputs and {n_out} outputs, the design takes {len(sizes)}")
    args = [np.frombuffer(b, dtype=np.uint8).copy() for b in inputs]
    for a, n in zip(args, sizes):
        if a.size != n:
            raise ValueError(f"an input has {a.size} bytes, the design takes {n}")
    args += [np.full(n, 0xFF, dtype=np.uint8) for n in sizes[n_in:]]
    run_program(prog, lib, args)
    drained = {op["arg"] for op in prog["sequence"] if op["op"] == "drain"}
    for i in range(n_in, n_in + n_out):
        if i not in drained:
            raise RuntimeError(f"output {i - n_in} (operand {i}) is never drained")
    return [a.tobytes() for a in args[n_in:]]


def have_tools() -> bool:
    return bool(shutil.which("g++") or shutil.which("clang++"))
