"""Write a GGUF with the shape of Llama-3.2-1B and seeded random weights, in f16.

The benchmark (scripts/bench.sh) measures dispatches, bytes and time per token, which depend
on the shapes and types of the tensors, not on their values: 16 layers, n_embd 2048, 32 heads
with 8 KV heads (head size 64), feed-forward 8192, the Llama 3 tokenizer (128256 tokens, copied
from the pinned tree's models/ggml-vocab-llama-bpe.gguf), tied output (no output.weight: the
token embedding is the output matrix), RoPE base 500000. The quantized variants are made from
this file by llama-quantize.

Usage: make_bench_llama.py --gguf-py <src>/gguf-py --vocab <src>/models/ggml-vocab-llama-bpe.gguf
                           --out llama-1b-shape-f16.gguf
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from make_tiny_llama import load_gguf, write_llama

SEED = 1
N_LAYER = 16
N_EMBD = 2048
N_HEAD = 32
N_HEAD_KV = 8
N_FF = 8192
N_CTX = 131072
ROPE_THETA = 500000.0
RMS_EPS = 1e-5


def tensors(n_vocab: int):
    """(name, array) in GGUF naming; numpy shapes are (rows, columns) = (out, in)."""
    rng = np.random.default_rng(SEED)
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV

    def linear(n_out: int, n_in: int) -> np.ndarray:
        w = rng.standard_normal((n_out, n_in), dtype=np.float32)
        w *= np.float32(1.0 / np.sqrt(n_in))
        return w.astype(np.float16)

    ones = np.ones(N_EMBD, dtype=np.float32)
    yield "token_embd.weight", linear(n_vocab, N_EMBD)
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        yield f"{blk}.attn_norm.weight", ones
        yield f"{blk}.attn_q.weight", linear(N_EMBD, N_EMBD)
        yield f"{blk}.attn_k.weight", linear(n_embd_kv, N_EMBD)
        yield f"{blk}.attn_v.weight", linear(n_embd_kv, N_EMBD)
        yield f"{blk}.attn_output.weight", linear(N_EMBD, N_EMBD)
        yield f"{blk}.ffn_norm.weight", ones
        yield f"{blk}.ffn_gate.weight", linear(N_FF, N_EMBD)
        yield f"{blk}.ffn_up.weight", linear(N_FF, N_EMBD)
        yield f"{blk}.ffn_down.weight", linear(N_EMBD, N_FF)
    yield "output_norm.weight", ones


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf-py", type=Path, required=True, help="<llama.cpp>/gguf-py")
    parser.add_argument("--vocab", type=Path, required=True, help="ggml-vocab-llama-bpe.gguf")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    gguf = load_gguf(args.gguf_py)
    write_llama(
        gguf,
        args.out,
        args.vocab,
        name="Llama-3.2-1B shape (random weights)",
        file_type=gguf.LlamaFileType.MOSTLY_F16,
        shape=(N_LAYER, N_CTX, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, ROPE_THETA, RMS_EPS),
        tensors=tensors,
    )

if __name__ == "__main__":
    main()
