"""Compare two llama_greedy runs' logits position by position (tests/c/llama_greedy.cpp
--logits: n_steps x n_vocab little-endian f32), as the end-to-end tests do.

For every generated position: the NMSE of the logits, sum((got-want)^2) / sum(want^2)
(tests/common/llama.rs `nmse`), whether the top-1 (greedy) token is the same, how many of
the top 5 tokens both share, and the gap between `want`'s two best logits (a gap near 0 is a
near-tie: any rounding can flip it). Prints a compact table, a summary and a verdict, and
exits 1 when the runs are outside the tolerance:
  * every position's NMSE <= the limit (a constant read from the tests' source, --limit);
  * the top-1 token equal wherever `want`'s top two are at least --margin apart (the rule of
    check_quantized in tests/llama_e2e.rs), or at every position with --same-top1.
Both runs must have seen the same tokens (free runs that agree, or one teacher-forced with
the other's tokens, llama_greedy --force).

Usage:
  compare_logits.py --got npu.bin --want cpu.bin --steps 24
                    --limit tests/llama_e2e.rs:MAX_QUANTIZED_LOGITS_NMSE --default 5e-3
                    [--margin 0.5] [--same-top1] [--no-table] [--why TEXT] [--root DIR]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import textwrap
from pathlib import Path

import numpy as np


def read_limit(root: Path, spec: str, default: float) -> tuple[float, str]:
    """The f64 constant `NAME` of `FILE` (spec "FILE:NAME") and where it came from."""
    file, _, name = spec.partition(":")
    try:
        text = (root / file).read_text(encoding="utf-8")
    except OSError:
        text = ""
    m = re.search(rf"const\s+{re.escape(name)}\s*:\s*f64\s*=\s*([0-9_.eE+-]+)\s*;", text)
    if m:
        return float(m.group(1).replace("_", "")), f"{name}, {file}"
    return default, f"{name} not found in {file}: the script's default"


def load(path: str, steps: int) -> np.ndarray:
    data = np.fromfile(path, dtype="<f4")
    if steps < 1 or data.size == 0 or data.size % steps:
        raise SystemExit(f"{path}: {data.size} floats is not {steps} positions of logits")
    return data.reshape(steps, -1).astype(np.float64)


def table(rows: list[tuple[str, list[str]]], first: int, width: int = 6) -> list[str]:
    """Rows of per-position cells, in blocks of 12 positions."""
    out = []
    n = len(rows[0][1])
    for start in range(0, n, 12):
        end = min(start + 12, n)
        head = "".join(f"{p:>{width}}" for p in range(first + start, first + end))
        out.append(f"  {'position':<16}{head}")
        for label, cells in rows:
            out.append(f"  {label:<16}" + "".join(f"{c:>{width}}" for c in cells[start:end]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--got", required=True, help="logits of the run under test (HSA0)")
    ap.add_argument("--want", required=True, help="logits of the reference run (the CPU)")
    ap.add_argument("--steps", type=int, required=True, help="positions (llama_greedy -n)")
    ap.add_argument("--limit", required=True, help="FILE:NAME of the NMSE limit's constant")
    ap.add_argument("--default", type=float, required=True, help="the limit if not found")
    ap.add_argument("--margin", type=float, default=0.5, help="clear-winner gap (logits)")
    ap.add_argument("--same-top1", action="store_true", help="top-1 equal everywhere")
    ap.add_argument("--root", default=".", help="the repository (for --limit)")
    ap.add_argument("--no-table", action="store_true", help="the summary only")
    ap.add_argument("--why", default="", help="why the limit is what it is (printed)")
    args = ap.parse_args()

    got, want = load(args.got, args.steps), load(args.want, args.steps)
    if got.shape != want.shape:
        raise SystemExit(f"logits shapes differ: {got.shape} vs {want.shape}")
    limit, source = read_limit(Path(args.root), args.limit, args.default)

    nmse = ((got - want) ** 2).sum(axis=1) / np.maximum((want**2).sum(axis=1), 1e-300)
    top1_got, top1_want = got.argmax(axis=1), want.argmax(axis=1)
    same = top1_got == top1_want
    top5 = [len(set(np.argsort(-g)[:5]) & set(np.argsort(-w)[:5])) for g, w in zip(got, want)]
    best2 = -np.sort(-want, axis=1)[:, :2]
    gap = best2[:, 0] - best2[:, 1]
    clear = gap >= args.margin

    worst = float(nmse.max())
    exp = math.floor(math.log10(worst)) if worst > 0 else 0
    scale = 10.0**exp
    rows = (
        []
        if args.no_table
        else table(
            [
                (f"NMSE (x1e{exp})", [f"{v / scale:.1f}" for v in nmse]),
                ("top-1 same", ["yes" if s else "NO" for s in same]),
                ("top-5 shared", [str(t) for t in top5]),
                ("CPU top-2 gap", [f"{g:.2f}" if g < 10 else f"{g:.0f}" for g in gap]),
            ],
            first=1,
        )
    )
    for line in rows:
        print(line)

    n = args.steps
    ok_nmse = worst <= limit
    above = int((nmse > limit).sum())
    print(
        f"  NMSE: worst {worst:.1e}, median {float(np.median(nmse)):.1e}; "
        + (
            f"within the limit of {limit:.0e} at every position"
            if ok_nmse
            else f"ABOVE the limit of {limit:.0e} at {above} of {n} positions"
        )
    )
    note = f"(the limit: {source}" + (f"; {args.why})" if args.why else ")")
    print(textwrap.fill(note, width=96, initial_indent="    ", subsequent_indent="     "))
    differ = [i for i in range(n) if not same[i]]
    where = ", ".join(f"{i + 1} (the CPU's top two {gap[i]:.3f} apart)" for i in differ[:3])
    if len(differ) > 3:
        where += f" and {len(differ) - 3} more"
    if args.same_top1:
        ok_top1 = not differ
        print(
            f"  top-1 token: the same at {int(same.sum())} of {n} positions (required at all)"
            + (f"; differs at {where}" if differ else "")
        )
    else:
        n_clear = int(clear.sum())
        clear_same = int((same & clear).sum())
        ok_top1 = clear_same == n_clear
        print(f"  top-1 token: the same at {int(same.sum())} of {n} positions")
        print(
            f"    and at {clear_same} of the {n_clear} where the CPU's top two are >= "
            f"{args.margin:g} apart,\n    the tests' rule for clear winners (check_quantized, tests/llama_e2e.rs)"
        )
        if differ:
            print(f"    differs at position {where}" + (": a near-tie" if len(differ) == 1 else ""))
    print(f"  top-5 tokens shared: {float(np.mean(top5)):.2f} of 5 on average, fewest {min(top5)}")
    ok = ok_nmse and ok_top1
    print(f"  verdict: {'within tolerance' if ok else 'OUTSIDE tolerance'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
