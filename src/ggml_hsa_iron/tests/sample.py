"""Which share of the long checks one run covers: the rotation of the Rust tests
(tests/common/sample.rs in the repository).

A default run (CI's) takes one turn: the cases of a check are split into parts by a stable hash
of their names and the commit picks the part, so that every case runs in some run over the
rotation; each check keeps at least one case in every turn. ``GGML_HSA_TEST_SAMPLE=all``
(``scripts/test.sh --long``) runs everything, ``T/N`` turn T of N.
"""

import os
import subprocess
from pathlib import Path

SHARE = 8


def _commit_seed() -> int:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=15", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout.strip(), 16)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return 0


def turn():
    """None for every case, else (turn, share)."""
    spec = os.environ.get("GGML_HSA_TEST_SAMPLE", "")
    if spec == "all":
        return None
    if spec:
        t, _, n = spec.partition("/")
        if not (t.isdigit() and n.isdigit() and int(t) < int(n)):
            raise ValueError(f"GGML_HSA_TEST_SAMPLE={spec}: expected `all` or T/N with T < N")
        return int(t), int(n)
    return _commit_seed() % SHARE, SHARE


def _fnv(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def pick(cases, name=repr):
    """This run's cases of `cases` (at least one)."""
    cases = list(cases)
    t = turn()
    if t is None or not cases:
        return cases
    k, n = t
    mine = [c for c in cases if _fnv(name(c)) % n == k]
    return mine or [cases[k % len(cases)]]
