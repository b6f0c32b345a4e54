"""Greedy decoding of an f32 llama GGUF in plain numpy: an independent reference.

Computes what llama.cpp computes for the tiny llama model (RMS norm, rotary embeddings
of the "normal" kind that rotate adjacent pairs, grouped-query causal attention, SwiGLU
feed-forward) and prints, for each generated token, its id, its text and the gap between
the two largest logits, so one can check that greedy decoding has a clear winner at
every step.

Usage: tiny_llama_ref.py --gguf-py <src>/gguf-py --model tiny-llama-f32.gguf [-n 16]
                         [--ids 1,15043 | --word Hello]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def load_model(gguf_py: Path, path: Path):
    sys.path.insert(0, str(gguf_py))
    import gguf  # the pinned tree's gguf-py, from sys.path above

    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()

    def kv(key: str, default=None):
        field = reader.fields.get(f"{arch}.{key}")
        return default if field is None else field.contents()

    hp = {
        "n_layer": kv("block_count"),
        "n_head": kv("attention.head_count"),
        "n_head_kv": kv("attention.head_count_kv"),
        "eps": kv("attention.layer_norm_rms_epsilon"),
        "theta": kv("rope.freq_base", 10000.0),
    }
    weights = {}
    for t in reader.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise SystemExit(
                f"{path}: {t.name} is {t.tensor_type.name}; only f32 is handled"
            )
        weights[t.name] = np.asarray(t.data, dtype=np.float64).reshape(
            [int(d) for d in reversed(t.shape)]
        )
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    bos = int(reader.fields["tokenizer.ggml.bos_token_id"].contents())
    return hp, weights, tokens, bos


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, theta: float) -> np.ndarray:
    """x: (tokens, heads, head_dim); rotates the pairs (2i, 2i+1) by pos * theta^(-2i/d)."""
    n_tok, _, d = x.shape
    freqs = theta ** (-np.arange(0, d, 2) / d)
    ang = np.arange(n_tok)[:, None] * freqs[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def forward(hp: dict, w: dict, ids: list[int]) -> np.ndarray:
    """Logits of the last position."""
    n_head, n_head_kv, eps = hp["n_head"], hp["n_head_kv"], hp["eps"]
    x = w["token_embd.weight"][ids]
    n_tok, n_embd = x.shape
    hd = n_embd // n_head
    mask = np.triu(np.full((n_tok, n_tok), -np.inf), k=1)
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        h = rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(n_tok, n_head, hd), hp["theta"])
        k = rope(
            (h @ w[p + "attn_k.weight"].T).reshape(n_tok, n_head_kv, hd), hp["theta"]
        )
        v = (h @ w[p + "attn_v.weight"].T).reshape(n_tok, n_head_kv, hd)
        group = n_head // n_head_kv
        out = np.empty((n_tok, n_head, hd))
        for hh in range(n_head):
            kk, vv = k[:, hh // group], v[:, hh // group]
            s = q[:, hh] @ kk.T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, hh] = (s / s.sum(axis=-1, keepdims=True)) @ vv
        x = x + out.reshape(n_tok, n_embd) @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], eps)
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    h = rms_norm(x[-1], w["output_norm.weight"], eps)
    return h @ w["output.weight"].T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gguf-py", type=Path, required=True, help="<llama.cpp>/gguf-py"
    )
    parser.add_argument("--model", type=Path, required=True, help="an f32 llama GGUF")
    parser.add_argument(
        "-n", type=int, default=16, help="tokens to generate (default 16)"
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--ids", help="comma-separated prompt token ids (BOS included)")
    group.add_argument(
        "--word",
        default="Hello",
        help="one-token prompt word, after BOS (default Hello)",
    )
    args = parser.parse_args()

    hp, w, tokens, bos = load_model(args.gguf_py, args.model)
    if args.ids:
        ids = [int(t) for t in args.ids.split(",")]
    else:
        piece = "\u2581" + args.word
        if piece not in tokens:
            raise SystemExit(f"'{args.word}' is not a single token; pass --ids")
        ids = [bos, tokens.index(piece)]

    print("prompt ids:", ",".join(map(str, ids)))
    gaps = []
    text = ""
    for _ in range(args.n):
        logits = forward(hp, w, ids)
        top2 = np.argsort(logits)[-2:]
        nxt, gap = int(top2[1]), float(logits[top2[1]] - logits[top2[0]])
        gaps.append(gap)
        piece = tokens[nxt].replace("\u2581", " ")
        text += piece
        print(
            f"{nxt:6d} {piece!r:24} top1-top2 {gap:7.3f}  logits std {logits.std():.2f}"
        )
        ids.append(nxt)
    print("generated ids:", ",".join(map(str, ids)))
    print("text:", repr(text))
    print(
        f"distinct tokens {len(set(ids[-args.n :]))}/{args.n}, smallest gap {min(gaps):.3f}"
    )


if __name__ == "__main__":
    main()
