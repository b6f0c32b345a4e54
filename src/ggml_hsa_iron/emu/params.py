"""Run-time arguments of a recorded program (a kernel whose KV length n_kv is given at
dispatch): the program JSON of several recordings of one design, each for one value, merged
into one program whose numbers that differ are affine expressions of the value.

The design is recorded as it is for a fixed value; what may depend on the value is where the
hardware takes run-time numbers:

* the runtime sequence's access patterns (offset, sizes, strides): the instruction stream's
  buffer-descriptor words, which the host writes per dispatch;
* a Worker's loop counts and its kernels' int32 arguments: words of a run-time-parameter
  buffer in the core's memory (mlir-aie's RTPs), which the instruction stream writes before
  the first transfer and the core reads.

Anything else that differs between the recordings (a fifo's object size, a task's count, a
kernel's define) means the design is not one program for every value: a `DesignError`. An
expression is `{"param": p, "mul": m, "div": d, "add": a}`, meaning (value * m) / d + a with
an exact division, fitted on two recordings and checked on every other one; a worker refers
to its RTP word as `{"rtp": [buffer, index]}` (docs/kernel-compiler-protocol.md, image
version 2). `instantiate` is the reverse: the concrete program for given values, as hsa-sim
computes it at dispatch.
"""

import math

from .program import DesignError


def _fit(points: list[tuple[int, int]], where: str) -> dict | int:
    """The number at `where` over the recordings' (value, number) points: the number itself
    when they agree, else the affine expression through them."""
    values = {v for _, v in points}
    if len(values) == 1:
        return points[0][1]
    (n0, v0), (n1, v1) = points[0], points[1]
    mul, div = v1 - v0, n1 - n0
    g = math.gcd(mul, div)
    mul, div = mul // g, div // g
    if div < 0:
        mul, div = -mul, -div
    if (n0 * mul) % div:
        raise DesignError(f"{where}: {v0} at n_kv {n0}, {v1} at {n1}: not an integer line")
    add = v0 - n0 * mul // div
    for n, v in points:
        if (n * mul) % div or n * mul // div + add != v:
            raise DesignError(
                f"{where}: {[p[1] for p in points]} at n_kv {[p[0] for p in points]} is not "
                "affine in n_kv: the design is not one program for every n_kv"
            )
    expr = {"param": 0, "mul": mul}
    if div != 1:
        expr["div"] = div
    if add:
        expr["add"] = add
    return expr


def _merge(trees: list, ns: list[int], where: str, numbers) -> object:
    """The recordings' JSON trees merged; `numbers(where, points)` decides what a number that
    differs becomes (or refuses it)."""
    first = trees[0]
    if isinstance(first, dict):
        if any(not isinstance(t, dict) or t.keys() != first.keys() for t in trees):
            raise DesignError(f"{where}: the recordings differ in structure")
        return {k: _merge([t[k] for t in trees], ns, f"{where}.{k}", numbers) for k in first}
    if isinstance(first, list):
        if any(not isinstance(t, list) or len(t) != len(first) for t in trees):
            raise DesignError(
                f"{where}: {[len(t) if isinstance(t, list) else t for t in trees]} items at "
                f"n_kv {ns}: the design is not one program for every n_kv"
            )
        return [
            _merge([t[i] for t in trees], ns, f"{where}[{i}]", numbers) for i in range(len(first))
        ]
    if isinstance(first, int) and not isinstance(first, bool):
        if any(isinstance(t, bool) or not isinstance(t, int) for t in trees):
            raise DesignError(f"{where}: the recordings differ in structure")
        if all(t == first for t in trees):
            return first
        return numbers(where, list(zip(ns, trees)))
    if any(t != first for t in trees):
        raise DesignError(f"{where}: {trees} at n_kv {ns}: not a run-time number")
    return first


def parametrize(programs: list[tuple[int, dict]], lo: int, hi: int, step: int) -> dict:
    """One program for every n_kv in lo..hi (multiples of step) from the recordings
    `programs` [(n_kv, program JSON)], at least two values when lo < hi."""
    ns = [n for n, _ in programs]
    if len(set(ns)) != len(ns) or (lo < hi and len(ns) < 2):
        raise ValueError(f"recordings at n_kv {ns}: two distinct values at least")
    jsons = [p for _, p in programs]
    for key in jsons[0]:
        if key not in ("workers", "sequence"):
            _merge([j[key] for j in jsons], ns, key, _refuse)
    sequence = _merge([j["sequence"] for j in jsons], ns, "sequence", _in_sequence)
    rtps, writes, workers = [], [], []
    for w, trees in enumerate(zip(*[j["workers"] for j in jsons])):
        slots: list = []
        worker = _merge(list(trees), ns, f"workers[{w}]", _rtp_words(slots, len(rtps)))
        workers.append(worker)
        if slots:
            writes += [
                {"op": "rtp", "buffer": len(rtps), "index": i, "value": e}
                for i, e in enumerate(slots)
            ]
            rtps.append({"id": len(rtps), "tile": worker["tile"], "words": len(slots)})
    out = dict(jsons[0])
    out["params"] = [{"name": "n_kv", "min": lo, "max": hi, "step": step}]
    out["rtps"] = rtps
    out["workers"] = workers
    out["sequence"] = writes + sequence
    return out


def _rtp_words(slots: list, buffer: int):
    """A worker's numbers that vary: each expression a word of its RTP buffer (`slots`)."""

    def word(where, points):
        if not _worker_number(where):
            _refuse(where, points)
        expr = _fit(points, where)
        if expr not in slots:
            slots.append(expr)
        return {"rtp": [buffer, slots.index(expr)]}

    return word


def _refuse(where, points):
    raise DesignError(
        f"{where}: {[v for _, v in points]} at n_kv {[n for n, _ in points]}: only the runtime "
        "sequence's access patterns and the workers' loop counts and int32 arguments may "
        "depend on n_kv"
    )


def _in_sequence(where: str, points):
    """A number of the runtime sequence: a tap's offset, size or stride may vary."""
    if ".tap." not in where:
        _refuse(where, points)
    return _fit(points, where)


def _worker_number(where: str) -> bool:
    """A loop's count or a call's int32 argument in a worker body."""
    return where.endswith(".count") or where.endswith(".i32")


# ------------------------------------------------------------------ instantiation


def _value(expr, values: list[int], rtp: dict) -> int:
    if isinstance(expr, int):
        return expr
    if "rtp" in expr:
        return rtp[tuple(expr["rtp"])]
    x = values[expr["param"]] * expr.get("mul", 1)
    div = expr.get("div", 1)
    if x % div:
        raise ValueError(f"{expr} at {values}: not an exact division")
    return x // div + expr.get("add", 0)


def _subst(tree, values, rtp):
    if isinstance(tree, dict):
        if "param" in tree or "rtp" in tree:
            return _value(tree, values, rtp)
        return {k: _subst(v, values, rtp) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_subst(t, values, rtp) for t in tree]
    return tree


def instantiate(program: dict, values: list[int]) -> dict:
    """The concrete program of a parametric one at `values` (one per param), or the program
    itself when it has none."""
    params = program.get("params", [])
    if len(values) != len(params):
        raise ValueError(f"the program takes {len(params)} run-time values, got {len(values)}")
    for p, v in zip(params, values):
        if not p["min"] <= v <= p["max"] or v % p["step"]:
            raise ValueError(
                f"{p['name']} = {v}: not a multiple of {p['step']} in {p['min']}..{p['max']}"
            )
    if not params:
        return program
    writes = [op for op in program["sequence"] if op["op"] == "rtp"]
    rtp = {(op["buffer"], op["index"]): _value(op["value"], values, {}) for op in writes}
    out = {k: v for k, v in program.items() if k not in ("params", "rtps")}
    out["sequence"] = [op for op in program["sequence"] if op["op"] != "rtp"]
    return _subst(out, values, rtp)
