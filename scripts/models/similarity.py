"""Embed sentences with llama-embedding and print their pairwise cosine similarities.

Runs one llama-embedding process for all the sentences (one prompt line each, mean
pooling, Euclidean normalisation, JSON output), reads the embeddings back and prints the
cosine matrix. Arguments after `--` go to llama-embedding unchanged (device flags such
as `-dev HSA0 -ngl 99`, threads, ...); the environment is passed through as it is, so
GGML_BACKEND_PATH and friends reach it too.

Usage:
  similarity.py --bin <dir-or-llama-embedding> -m minilm.gguf [--sentence S ...]
                [--expect 0.6660,0.1046,0.1411 --tol 0.01] [--json out.json] [-- ARGS...]

Without --sentence it embeds the sentence-transformers example: "The weather is lovely
today.", "It's so sunny outside!" and "He drove to the stadium.". With --expect it
compares the upper triangle (row by row: 1-2, 1-3, ..., 2-3, ...) with the given values
and exits 1 when one is off by more than --tol.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

DEFAULT_SENTENCES = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
]
# Published by sentence-transformers for all-MiniLM-L6-v2 and DEFAULT_SENTENCES.
PUBLISHED = [0.6660, 0.1046, 0.1411]


def find_binary(path: Path) -> Path:
    exe = path / "llama-embedding" if path.is_dir() else path
    if not exe.is_file():
        raise SystemExit(f"llama-embedding not found at {exe}")
    return exe


def embed(
    exe: Path, model: Path, sentences: list[str], extra: list[str], attempts: int
) -> list[list[float]]:
    for s in sentences:
        if "\n" in s:
            raise SystemExit(f"a sentence may not contain a newline: {s!r}")
    cmd = [
        str(exe),
        "-m", str(model),
        "--pooling", "mean",
        "--embd-normalize", "2",
        "--embd-output-format", "json",
        "-p", "\n".join(sentences),
        *extra,
    ]  # fmt: skip
    for attempt in range(1, attempts + 1):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(
                f"llama-embedding failed with exit code {proc.returncode}: {cmd}"
            )
        try:
            doc = json.loads(proc.stdout)
            break
        except json.JSONDecodeError as err:
            # llama-embedding prints through llama.cpp's asynchronous logger, which the
            # pinned version does not flush at exit: now and then the tail of stdout is
            # lost. Only a complete document counts; run it again.
            print(
                f"llama-embedding output cut short ({err}); attempt {attempt}/{attempts}",
                file=sys.stderr,
            )
    else:
        sys.stderr.write(proc.stdout[-1000:] + "\n" + proc.stderr[-2000:])
        raise SystemExit(f"no complete JSON document from llama-embedding: {cmd}")
    rows = sorted(doc["data"], key=lambda d: d["index"])
    if len(rows) != len(sentences):
        raise SystemExit(f"asked for {len(sentences)} embeddings, got {len(rows)}")
    return [r["embedding"] for r in rows]


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb)


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bin",
        type=Path,
        required=True,
        help="llama-embedding, or the directory that holds it",
    )
    parser.add_argument(
        "-m", "--model", type=Path, required=True, help="an embedding GGUF"
    )
    parser.add_argument(
        "--sentence",
        action="append",
        dest="sentences",
        help="a sentence to embed (repeat; default: the published example)",
    )
    parser.add_argument(
        "--expect", help="comma-separated upper-triangle values to check"
    )
    parser.add_argument(
        "--tol", type=float, default=0.01, help="tolerance for --expect"
    )
    parser.add_argument(
        "--attempts",
        type=int,
        default=8,
        help="runs allowed to get a complete JSON document (default 8)",
    )
    parser.add_argument("--json", type=Path, help="also write the matrix here as JSON")
    args = parser.parse_args(argv)

    sentences = args.sentences or DEFAULT_SENTENCES
    exe = find_binary(args.bin)
    vectors = embed(exe, args.model, sentences, extra, args.attempts)
    n = len(sentences)
    matrix = [[cosine(vectors[i], vectors[j]) for j in range(n)] for i in range(n)]
    upper = [matrix[i][j] for i in range(n) for j in range(i + 1, n)]

    for i, s in enumerate(sentences):
        print(f"[{i + 1}] {s}")
    print("     " + "".join(f"{j + 1:>8}" for j in range(n)))
    for i in range(n):
        print(f"{i + 1:>5}" + "".join(f"{v:8.4f}" for v in matrix[i]))
    if sentences == DEFAULT_SENTENCES:
        pairs = ["1-2", "1-3", "2-3"]
        print(
            "published all-MiniLM-L6-v2: "
            + ", ".join(f"{p} {v:.4f}" for p, v in zip(pairs, PUBLISHED))
        )
    if args.json:
        args.json.write_text(
            json.dumps({"sentences": sentences, "cosine": matrix}, indent=1)
        )

    if args.expect:
        expect = [float(v) for v in args.expect.split(",")]
        if len(expect) != len(upper):
            raise SystemExit(
                f"--expect has {len(expect)} values, the matrix has {len(upper)}"
            )
        worst = max(abs(a - b) for a, b in zip(upper, expect))
        verdict = "ok" if worst <= args.tol else "FAIL"
        print(
            f"largest difference from --expect: {worst:.4f} (tolerance {args.tol}): {verdict}"
        )
        if worst > args.tol:
            sys.exit(1)


if __name__ == "__main__":
    main()
