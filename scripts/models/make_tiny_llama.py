"""Write a tiny llama-architecture GGUF with seeded random weights, or the same weights as
another family's model (--arch): phi3 (Q, K and V in one attn_qkv matrix, gate and up in one
ffn_up), qwen2 (plus seeded Q, K and V biases), qwen3 (plus per-head Q and K norm weights),
gemma2 (plus norms after the attention and the block, the output tied to the embedding),
gemma3 (gemma2's layout plus qwen3's per-head Q and K norms).

The tokenizer (every tokenizer.* key) is copied from the pinned llama.cpp tree's
models/ggml-vocab-llama-spm.gguf, so prompts tokenize like a real LLaMA model. The
weights are drawn from a fixed seed, so the same inputs always give a byte-identical
file. Their scales keep activations in range and make the output logits well separated:
greedy decoding follows the weights rather than rounding noise, and it wanders through
varied tokens instead of repeating one.

Usage: make_tiny_llama.py --gguf-py <src>/gguf-py --vocab <src>/models/ggml-vocab-llama-spm.gguf
                          [--arch llama|phi3|qwen2|qwen3|gemma2|gemma3] --out tiny-llama-f32.gguf
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# Among seeds 256-278, the one whose greedy decoding of "Hello" (BOS + one token, the
# llama-simple smoke test) keeps the largest top-1/top-2 logit gap over 16 tokens: 0.72
# with logits of standard deviation 8 (scripts/models/tiny_llama_ref.py prints the gaps).
SEED = 272
N_LAYER = 4
N_EMBD = 256
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 512
N_CTX = 256
ROPE_THETA = 10000.0
RMS_EPS = 1e-5
# Standard deviation of the logits for a unit-RMS final hidden state. Large enough that
# the top two logits are usually far apart (compared with f32 rounding or backend
# differences), small enough that the softmax is not one-hot everywhere.
LOGIT_STD = 8.0


def load_gguf(gguf_py: Path):
    sys.path.insert(0, str(gguf_py))
    import gguf  # the pinned tree's gguf-py, from sys.path above

    return gguf


def copy_tokenizer(gguf, writer, vocab_path: Path) -> int:
    """Copy every tokenizer.* key of vocab_path into writer; return the vocabulary size."""
    reader = gguf.GGUFReader(vocab_path)
    n_vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub_type = field.types[-1]
            if sub_type == gguf.GGUFValueType.STRING:
                # Raw bytes keep the strings exactly as stored.
                value = [bytes(field.parts[i]) for i in field.data]
            else:
                value = field.contents()
            writer.add_key_value(key, value, vtype, sub_type=sub_type)
            if key == gguf.Keys.Tokenizer.LIST:
                n_vocab = len(value)
        else:
            writer.add_key_value(key, field.contents(), vtype)
    if n_vocab == 0:
        raise SystemExit(f"{vocab_path}: no {gguf.Keys.Tokenizer.LIST} array")
    return n_vocab


def make_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """Return the tensors in GGUF naming; numpy shapes are (rows, columns) = (out, in)."""
    rng = np.random.default_rng(SEED)
    head_dim = N_EMBD // N_HEAD
    n_embd_kv = head_dim * N_HEAD_KV

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(
            np.float32
        )

    def linear(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        return normal((n_out, n_in), gain / np.sqrt(n_in))

    ones = np.ones(N_EMBD, dtype=np.float32)
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": normal((n_vocab, N_EMBD), 1.0)
    }
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        tensors[f"{blk}.attn_norm.weight"] = ones.copy()
        # Gain 2 on Q makes the attention scores (std ~2) pick out a few positions.
        tensors[f"{blk}.attn_q.weight"] = linear(N_EMBD, N_EMBD, 2.0)
        tensors[f"{blk}.attn_k.weight"] = linear(n_embd_kv, N_EMBD)
        tensors[f"{blk}.attn_v.weight"] = linear(n_embd_kv, N_EMBD)
        tensors[f"{blk}.attn_output.weight"] = linear(N_EMBD, N_EMBD)
        tensors[f"{blk}.ffn_norm.weight"] = ones.copy()
        tensors[f"{blk}.ffn_gate.weight"] = linear(N_FF, N_EMBD)
        tensors[f"{blk}.ffn_up.weight"] = linear(N_FF, N_EMBD)
        tensors[f"{blk}.ffn_down.weight"] = linear(N_EMBD, N_FF, 2.0)
    tensors["output_norm.weight"] = ones.copy()
    tensors["output.weight"] = linear(n_vocab, N_EMBD, LOGIT_STD)
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gguf-py", type=Path, required=True, help="<llama.cpp>/gguf-py"
    )
    parser.add_argument(
        "--vocab", type=Path, required=True, help="ggml-vocab-llama-spm.gguf"
    )
    parser.add_argument("--arch", choices=list(FAMILIES), default="llama")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    gguf = load_gguf(args.gguf_py)
    weights, arch = FAMILIES[args.arch]
    write_llama(
        gguf,
        args.out,
        args.vocab,
        # llama.cpp sets special-token attributes of models named "phi3" that a LLaMA
        # vocabulary does not have: the name leaves it out.
        name="tiny-llama (random weights)" if args.arch == "llama" else "tiny (random weights)",
        file_type=gguf.LlamaFileType.ALL_F32,
        shape=(N_LAYER, N_CTX, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, ROPE_THETA, RMS_EPS),
        tensors=lambda n_vocab: weights(n_vocab).items(),
        arch=getattr(gguf.MODEL_ARCH, arch),
        extra=EXTRA_KEYS.get(args.arch),
    )


def phi3_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """The llama weights as phi3 lays them out: attn_qkv is Q's rows, then K's, then V's;
    ffn_up is the gate's rows, then the up projection's."""
    tensors = make_weights(n_vocab)
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        q, k, v = (tensors.pop(f"{blk}.attn_{p}.weight") for p in "qkv")
        tensors[f"{blk}.attn_qkv.weight"] = np.concatenate([q, k, v])
        gate, up = tensors.pop(f"{blk}.ffn_gate.weight"), tensors.pop(f"{blk}.ffn_up.weight")
        tensors[f"{blk}.ffn_up.weight"] = np.concatenate([gate, up])
    return tensors


def qwen2_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """The llama weights with Q, K and V biases (seeded, small)."""
    tensors = make_weights(n_vocab)
    rng = np.random.default_rng(SEED + 1)
    for i in range(N_LAYER):
        for p in "qkv":
            rows = tensors[f"blk.{i}.attn_{p}.weight"].shape[0]
            bias = rng.standard_normal(rows, dtype=np.float32) * np.float32(0.1)
            tensors[f"blk.{i}.attn_{p}.bias"] = bias.astype(np.float32)
    return tensors


def with_head_norms(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`tensors` with seeded per-head RMS norm weights of Q and K."""
    rng = np.random.default_rng(SEED + 2)
    head_dim = N_EMBD // N_HEAD
    for i in range(N_LAYER):
        for p in "qk":
            w = 1 + rng.standard_normal(head_dim, dtype=np.float32) * np.float32(0.1)
            tensors[f"blk.{i}.attn_{p}_norm.weight"] = w.astype(np.float32)
    return tensors


def qwen3_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """The llama weights with per-head RMS norm weights of Q and K."""
    return with_head_norms(make_weights(n_vocab))


def gemma2_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """The llama weights with norms after the attention and the feed-forward block (weight
    rows of ones, as gemma stores them: ggml's RMS norm of gemma multiplies by them as they
    are); the token embedding is the output matrix, so the untied output goes."""
    tensors = make_weights(n_vocab)
    del tensors["output.weight"]
    for i in range(N_LAYER):
        tensors[f"blk.{i}.post_attention_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        tensors[f"blk.{i}.post_ffw_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
    return tensors


def gemma3_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """gemma2's weights with per-head RMS norm weights of Q and K."""
    return with_head_norms(gemma2_weights(n_vocab))


# --arch: its weights and gguf's MODEL_ARCH member.
FAMILIES = {
    "llama": (make_weights, "LLAMA"),
    "phi3": (phi3_weights, "PHI3"),
    "qwen2": (qwen2_weights, "QWEN2"),
    "qwen3": (qwen3_weights, "QWEN3"),
    "gemma2": (gemma2_weights, "GEMMA2"),
    "gemma3": (gemma3_weights, "GEMMA3"),
}
# Hyperparameters a family's loader reads beside the llama's: gemma2's softcaps and its
# sliding window (every other layer), half the context so that it hides keys; gemma3's sliding
# window (five layers of six: every layer of the tiny model), no softcaps.
EXTRA_KEYS = {
    "gemma2": {
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "attention.sliding_window": N_CTX // 2,
    },
    "gemma3": {"attention.sliding_window": N_CTX // 2},
}


def write_llama(
    gguf, out: Path, vocab: Path, name: str, file_type, shape, tensors, arch=None, extra=None
) -> None:
    """Write a llama-architecture GGUF (or `arch`'s, a gguf.MODEL_ARCH): hyperparameters
    `shape` = (layers, context, n_embd, n_ff, heads, KV heads, RoPE base, RMS eps), the
    tokenizer of `vocab`, and the (name, array) pairs `tensors(n_vocab)` yields."""
    n_layer, n_ctx, n_embd, n_ff, n_head, n_head_kv, rope_theta, rms_eps = shape
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA if arch is None else arch]
    extra = extra or {}
    writer = gguf.GGUFWriter(out, arch)
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(rms_eps)
    n_vocab = copy_tokenizer(gguf, writer, vocab)
    writer.add_vocab_size(n_vocab)
    for key, value in extra.items():
        name = f"{arch}.{key}"
        if isinstance(value, float):
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, value)
    for tensor_name, data in tensors(n_vocab):
        writer.add_tensor(tensor_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

if __name__ == "__main__":
    main()
