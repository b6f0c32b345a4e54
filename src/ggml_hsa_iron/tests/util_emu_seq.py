"""Runs a design compiled for the emulation target with its runtime sequence in order, in
Python: for designs whose later DMA tasks read what earlier ones wrote (RMS_NORM_FFN_<glu>'s h,
drained by its first phase and read back by its second) and for operands that share memory
(an output written in place over inputs, as the backend passes llama's residual ADD).

tests/util_emu.py's `run_program` issues every fill first (there they read inputs only), runs
the cores, then the drains. Here the sequence runs in order, on the fifos, links and cores of
util_emu.py: a fill reads its bytes when it is issued, a drain is queued, and an await runs the
dataflow (splits, every core as far as its fifos let it, joins, drains) until nothing moves,
then requires the awaited tasks to have completed (a drain: its bytes written; a fill: its
objects taken by every consumer of its fifo). Operands given as one array are one memory.
The sequence's synchronisation is checked, as the hardware needs it:

* a fill must not read bytes that an issued drain not yet awaited writes (the read would race
  the write);
* a drain must not write bytes that a fill has not delivered yet (a fill's data counts as
  delivered once every consumer of its fifo has taken the objects holding it).

Cores blocked at the end of the sequence (a body not run to its end), objects left in fifos
and drains that never complete are errors, as in `run_program`.
"""

from pathlib import Path
import tempfile

import numpy as np

from ggml_hsa_iron.dtypes import DTYPES
from ggml_hsa_iron.tests.util_emu import _Core, _Fifo, _tap_bytes, build_spec


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.intersect1d(a, b).size)


class _Run:
    """One dispatch of a recorded program (`prog`, its JSON) on `args` (np.uint8 arrays)."""

    def __init__(self, prog: dict, args: list[np.ndarray], cores_dir: Path, lib: bytes):
        self.prog, self.args = prog, args
        for link in prog["links"]:
            if link["kind"] not in ("split", "join"):
                raise NotImplementedError(f"link kind {link['kind']}")
        for f in prog["fifos"]:
            if any(c.get("from_stream") for c in f["consumers"]):
                raise NotImplementedError(f"stream re-layouts on the consumer side ({f['name']})")
        self.fifos = [_Fifo(f) for f in prog["fifos"]]
        self.splits = [link for link in prog["links"] if link["kind"] == "split"]
        self.joins = [link for link in prog["links"] if link["kind"] == "join"]
        self.cores = []
        for i, w in enumerate(prog["workers"]):
            path = cores_dir / f"core{i}.so"  # one copy per core: its own static data
            path.write_bytes(lib)
            self.cores.append(_Core(w, path, prog["kernels"], self.fifos))
        self.steps = [c.steps(c.w["body"]) for c in self.cores]
        self.waits = [None] * len(self.cores)  # the queue a core waits on
        self.finished = [False] * len(self.cores)
        # Memories some drain writes: fills from them are checked against the drains.
        self.written = {id(args[op["arg"]]) for op in prog["sequence"] if op["op"] == "drain"}
        self.streamed = [0] * len(self.fifos)  # bytes the fills pushed into each fifo
        self.fills = []  # (memory, byte indices, fifo, last object) not known delivered
        self.drains = {}  # fifo -> [(task, memory, byte indices)], in issue order
        self.drained = {}  # fifo -> bytes taken from the fifo for its first drain
        self.unawaited = {}  # drain task -> (memory, byte indices)
        self.done = set()  # completed drain tasks
        self.fill_ends = {}  # fill task -> (fifo, its last object)

    def cons(self, fid: int, link_id) -> int:
        return next(
            i for i, c in enumerate(self.fifos[fid].j["consumers"]) if c.get("link") == link_id
        )

    def fill(self, op):
        mem = self.args[op["arg"]]
        idx = _tap_bytes(op["tap"], op["elem_bytes"])
        fifo = self.fifos[op["fifo"]]
        for task, (m, written) in self.unawaited.items():
            if m is mem and _overlap(idx, written):
                raise RuntimeError(
                    f"fill task {op['task']} of {fifo.j['name']} reads bytes of operand "
                    f"{op['arg']} that drain task {task}, not awaited yet, writes"
                )
        fifo.push_stream(mem[idx])
        self.streamed[op["fifo"]] += idx.size
        last = (self.streamed[op["fifo"]] - 1) // fifo.obj
        self.fill_ends[op["task"]] = (op["fifo"], last)
        if id(mem) in self.written:
            self.fills.append((mem, idx, op["fifo"], last, op["task"]))

    def delivered(self, fid: int, last: int) -> bool:
        fifo = self.fifos[fid]
        pushed = self.streamed[fid] // fifo.obj
        return all(pushed - len(q) > last for q in fifo.queues)

    def drain_ready(self, fid: int) -> bool:
        """Completes the first queued drain of fifo `fid` if its bytes are there."""
        task, mem, idx = self.drains[fid][0]
        fifo = self.fifos[fid]
        q = fifo.queues[next(i for i, c in enumerate(fifo.j["consumers"]) if c["kind"] == "shim")]
        buf = self.drained.setdefault(fid, bytearray())
        while len(buf) < idx.size and q:
            buf += q.pop(0).tobytes()
        if len(buf) < idx.size:
            return False
        self.fills = [f for f in self.fills if not self.delivered(f[2], f[3])]
        for m, fidx, ffid, _, ftask in self.fills:
            if m is mem and _overlap(idx, fidx):
                raise RuntimeError(
                    f"drain task {task} of {fifo.j['name']} writes bytes that fill task {ftask} "
                    f"of {self.fifos[ffid].j['name']} has not delivered yet"
                )
        mem[idx] = np.frombuffer(bytes(buf[: idx.size]), dtype=np.uint8)
        del buf[: idx.size]
        self.drains[fid].pop(0)
        self.done.add(task)
        return True

    def pump(self):
        """Runs the dataflow until nothing moves."""
        moved = True
        while moved:
            moved = False
            for link in self.splits:
                q = self.fifos[link["fifo"]].queues[self.cons(link["fifo"], link["id"])]
                while q:
                    obj = q.pop(0)
                    for sub, off in zip(link["subfifos"], link["offsets"]):
                        self.fifos[sub].push(obj[off : off + self.fifos[sub].obj])
                    moved = True
            for i, steps in enumerate(self.steps):
                if self.finished[i] or (self.waits[i] is not None and not self.waits[i]):
                    continue
                try:
                    _, self.waits[i] = next(steps)
                except StopIteration:
                    self.finished[i] = True
                moved = True
            for link in self.joins:
                parent = self.fifos[link["fifo"]]
                subs = [self.fifos[s] for s in link["subfifos"]]
                qs = [s.queues[self.cons(s.j["id"], link["id"])] for s in subs]
                while all(qs):
                    obj = np.zeros(parent.obj, dtype=np.uint8)
                    for s, q, off in zip(subs, qs, link["offsets"]):
                        obj[off : off + s.obj] = q.pop(0)
                    parent.push(obj)
                    moved = True
            for fid, queued in self.drains.items():
                while queued and self.drain_ready(fid):
                    moved = True

    def run(self):
        for op in self.prog["sequence"]:
            if op["op"] == "fill":
                self.fill(op)
            elif op["op"] == "drain":
                idx = _tap_bytes(op["tap"], op["elem_bytes"])
                mem = self.args[op["arg"]]
                self.drains.setdefault(op["fifo"], []).append((op["task"], mem, idx))
                self.unawaited[op["task"]] = (mem, idx)
            else:  # await
                self.pump()
                for task in op["tasks"]:
                    if task in self.fill_ends:
                        if not self.delivered(*self.fill_ends[task]):
                            raise RuntimeError(
                                f"the sequence awaits fill task {task}, which cannot complete: "
                                "the cores took too little of it"
                            )
                    elif task not in self.done:
                        raise RuntimeError(
                            f"the sequence awaits task {task}, which cannot complete: the "
                            "cores produced too little for it"
                        )
                    self.unawaited.pop(task, None)
        for f in self.fifos:
            if f.stream:
                raise RuntimeError(f"fifo {f.j['name']}: a fill ends inside an object")
        self.pump()
        for c, ok in zip(self.cores, self.finished):
            if not ok:
                raise RuntimeError(
                    f"worker {c.w['tile']} starves: it waits on a fifo the sequence no longer "
                    "fills (the sequence sent fewer objects than the core takes)"
                )
            for (fid, _), held in c.held.items():
                if held:
                    raise RuntimeError(
                        f"worker {c.w['tile']} still holds {self.fifos[fid].j['name']}"
                    )
        for fid, queued in self.drains.items():
            if queued:
                raise RuntimeError(f"drain of {self.fifos[fid].j['name']}: never completed")
        for fid, f in enumerate(self.fifos):
            if any(f.queues) or self.drained.get(fid):
                raise RuntimeError(f"fifo {f.j['name']}: objects left undrained")


def run_program_in_order(prog: dict, lib: bytes, args: list[np.ndarray]) -> None:
    """Interprets `prog` (the recorded program's JSON) with the core library `lib` on the
    runtime-sequence arguments `args` (np.uint8 arrays, written in place), the sequence in
    order (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="ggml-hsa-emu-seq-") as d:
        _Run(prog, args, Path(d), lib).run()


def arg_bytes(spec) -> list[int]:
    """The byte size of every runtime-sequence argument of `spec`, in order."""
    return [count * DTYPES[t].size for t, count in spec.sequence]


def run_spec_in_order(spec, args: list[np.ndarray], n_kv: int | None = None) -> None:
    """Records `spec`'s design (the stand-in's hardware checks), builds its core library and
    runs it in order on `args`: one np.uint8 array per runtime-sequence argument, inputs with
    their bytes, outputs of any content (written in place); one array given for several
    arguments is one memory. `n_kv`: a run-time KV length's value (its largest by default)."""
    prog, lib = build_spec(spec, n_kv)
    sizes = [a["bytes"] for a in prog["args"]]
    if [a.size for a in args] != sizes:
        raise ValueError(f"arguments of {[a.size for a in args]} bytes, the design takes {sizes}")
    run_program_in_order(prog, lib, args)


def new_buffer(nbytes: int) -> np.ndarray:
    """An output's memory before the dispatch: 0xFF bytes (f32 NaN), so that what no drain
    writes shows."""
    return np.full(nbytes, 0xFF, dtype=np.uint8)


def buffer_of(data) -> np.ndarray:
    """An input's memory: a copy of `data`'s bytes (bytes, or a numpy array)."""
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    return np.frombuffer(raw, dtype=np.uint8).copy()
