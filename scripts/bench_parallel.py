#!/usr/bin/env python3
"""The section "Several sequences" of docs/perf.md (`scripts/bench.sh --parallel`): decode
steps of 1, 4 and 8 sequences at once of the 1B shape on HSA0 (llama-batched-bench, the
kernels counted by hsa-sim, not computed), per step: the tokens, the dispatches, the bytes the
kernels read, the device time (the roofline and the timing model) and the tokens per second
in total and per sequence. Nothing here ran on an NPU.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import KernelTimes, device_and_host_s, hsa_env, iron_capabilities, timed_device_ns
from bench import write_section

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # the IRON package

HEADING = "## Several sequences"
SEQUENCES = (1, 4, 8)
# Each sequence's prompt, and the decode steps counted: the steps of a run of 1 + STEPS
# generated tokens less those of a run of 1, so that the prompts and the first step are not.
PROMPT = 64
STEPS = 32
CONTEXT = 4096
# The feed-forward block of the 1B shape timed alone over a step's tokens.
FFN_SHAPE = (2048, 8192)  # K (n_embd), F (n_ff)
FFN_TOKENS = (1, 2, 3, 4, 8)
FFN_TYPES = ("q4_0", "q4_K")
# The decode layer kernel of the 1B shape over a step's tokens: (n_embd, n_head, n_head_kv,
# head_dim, n_ff, n_kv).
LAYER_DIMS = (2048, 32, 8, 64, 8192, 1024)


def run(args, model: Path, work: Path, sequences: int, generated: int, unified: bool) -> dict:
    """One llama-batched-bench process: `sequences` prompts of PROMPT tokens, then `generated`
    steps of one token of each, a KV cache per sequence or one `unified` (`-kvu`, as
    llama-server's default four slots); hsa-sim's counters and the plugin's statistics."""
    work.mkdir(parents=True)
    env = hsa_env(args.target, args.bin / "libggml-hsa.so", work, False, args.declare)
    cmd = [str(args.bin / "llama-batched-bench"), "-m", str(model), "-c", str(CONTEXT)]
    cmd += ["-b", "512", "-ub", "512", "-npp", str(PROMPT), "-ntg", str(generated)]
    cmd += ["-npl", str(sequences), "-dev", "HSA0", "-ngl", "99"] + ["-kvu"] * unified
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"llama-batched-bench failed ({done.returncode}): {' '.join(cmd)}")
    return {
        "counters": json.loads((work / "counters.json").read_text()),
        "stats": json.loads((work / "stats.json").read_text()),
    }


def steps_of(long: dict, short: dict) -> dict:
    """The counters and statistics of the steps `long` ran beyond `short`."""
    a, b = long["counters"], short["counters"]
    counters = {k: a[k] - b.get(k, 0) for k in ("device_time_ns", "dispatches", "bytes_read")}
    counters["kernels"] = {}
    for name, t in a.get("kernels", {}).items():
        before = b.get("kernels", {}).get(name, {})
        dispatches = t["dispatches"] - before.get("dispatches", 0)
        if dispatches:
            counters["kernels"][name] = {
                "dispatches": dispatches,
                "work_ns": t["work_ns"] - before.get("work_ns", 0),
                "request": t.get("request"),
            }
    stats = {
        k: long["stats"][k] - short["stats"][k]
        for k in ("compute_wall_us", "device_wait_us", "kernel_load_us")
    }
    return {"counters": counters, "stats": stats}


def tokens_table(times: KernelTimes, request_of) -> list[str]:
    """A table of FFN_TYPES on both archs by FFN_TOKENS tokens: each cell the kernel whose
    request JSON `request_of(type, arch, tokens)` gives, compiled by the emulation target and
    timed alone (KernelTimes; a declined fused kernel as the kernels the backend runs instead,
    marked "two kernels" for a layer's)."""
    from ggml_hsa_iron.errors import UnsupportedError
    from ggml_hsa_iron.plans import prepare
    from ggml_hsa_iron.request import parse_request

    head = " | ".join(f"{n} token{'s' * (n > 1)}" for n in FFN_TOKENS)
    lines = [f"| weights | arch | {head} |", "|---|---|" + "---:|" * len(FFN_TOKENS)]
    for ty in FFN_TYPES:
        for arch in ("aie2p", "aie2"):
            cells = [ty, arch]
            for n in FFN_TOKENS:
                text = request_of(ty, arch, n)
                req = json.loads(text)
                how = ""
                if req["op"].startswith("DECODE_LAYER_"):
                    try:
                        prepare(parse_request(text))
                    except UnsupportedError:
                        how = " (two kernels)"
                ns = times.work_ns(f"{arch}/{req['name']}", req)  # names omit the arch
                cells.append("declined" if ns is None else f"{ns / 1e3:,.0f} µs{how}")
            lines.append("| " + " | ".join(cells) + " |")
            print(lines[-1], file=sys.stderr)
    return lines


def ffn_lines(times: KernelTimes) -> list[str]:
    """The feed-forward block (RMS_NORM_FFN_SWIGLU) over FFN_TOKENS tokens."""
    from ggml_hsa_iron.tests.util_ffn import ffn_request

    return tokens_table(times, lambda ty, arch, n: ffn_request("SWIGLU", ty, n, *FFN_SHAPE, arch))


def layer_lines(times: KernelTimes) -> list[str]:
    """The decode layer kernel (DECODE_LAYER_SWIGLU) over FFN_TOKENS tokens; where the IRON
    package declines it, its two kernels (the Q/K/V kernel, then the attention with the block)
    with the PDI switch between them."""
    from ggml_hsa_iron.tests.test_decode_layer import layer_request

    return tokens_table(
        times, lambda ty, arch, n: layer_request("SWIGLU", ty, LAYER_DIMS, arch=arch, T=n)
    )


def print_heaviest(counters: dict, times: KernelTimes, count: int = 8) -> None:
    """The kernels taking the most of a step's device time under the timing model (the log's
    account of where a step's time goes)."""
    spent = []
    for name, t in counters["kernels"].items():
        ns = times.work_ns(name, t.get("request"))
        ns = t["work_ns"] / t["dispatches"] if ns is None else ns
        spent.append((t["dispatches"] * ns / STEPS, t["dispatches"] / STEPS, name))
    for ns, per_step, name in sorted(spent, reverse=True)[:count]:
        print(f"    {ns / 1e6:7.2f} ms  {per_step:5.1f} x  {name}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp's bin directory (the hook build)")
    ap.add_argument("--target", type=Path, required=True, help="hsa-sim's release directory")
    ap.add_argument("models", nargs="+", help="NAME=PATH of each GGUF")
    args = ap.parse_args()
    args.target = args.target.resolve()
    lines = [
        "| model | sequences | KV cache | dispatches per step | of them at the roofline | MB read per step | device ms per step, roofline | device ms per step, timing model | t/s in total, timing model | t/s per sequence, timing model |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as work:
        args.declare = iron_capabilities(Path(work) / "npu.json", "npu")
        (Path(work) / "timed").mkdir()
        times = KernelTimes(args.target, Path(work) / "timed")
        for spec in args.models:
            name, path = spec.split("=", 1)
            for n, unified in [(n, u) for n in SEQUENCES for u in (False, True) if n > 1 or not u]:
                at = Path(work) / name / f"{n}{'-unified' * unified}"
                short = run(args, Path(path), at / "short", n, 1, unified)
                steps = steps_of(run(args, Path(path), at / "long", n, 1 + STEPS, unified), short)
                roofline_s, host_s = device_and_host_s(steps["counters"], steps["stats"])
                timed_ns, left = timed_device_ns(steps["counters"], times)
                total = n * STEPS / (timed_ns / 1e9 + host_s)
                c = steps["counters"]
                kv = "unified" if unified else "per sequence"
                cells = [name, str(n), kv, f"{c['dispatches'] / STEPS:.1f}", f"{left / STEPS:.1f}"]
                cells += [f"{c['bytes_read'] / STEPS / 1e6:.1f}"]
                cells += [f"{roofline_s * 1e3 / STEPS:.2f}", f"{timed_ns / 1e6 / STEPS:.2f}"]
                cells += [f"{total:.1f}", f"{total / n:.1f}"]
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], file=sys.stderr)
                print_heaviest(steps["counters"], times)
        ffn = ffn_lines(times)
        layer = layer_lines(times)
    body = [
        "Regenerated by `scripts/bench.sh --parallel`. llama-batched-bench on HSA0:",
        f"1, 4 or 8 sequences, each a {PROMPT}-token prompt, then steps of one token of each",
        f"(a {CONTEXT}-token context), with a KV cache per sequence (llama-batched-bench's default:",
        "each step's cells apart) or one unified (`-kvu`, llama-server's default for its four",
        "slots: a step's cells usually consecutive, written by the kernels computing K and V).",
        f"The figures are those of {STEPS} steps: a run of {1 + STEPS} steps less a run",
        "of one, in processes of their own, hsa-sim counting the kernels (`HSA_SIM_EXECUTE=0`)",
        "with the npu target's declarations; per step, the device time as hsa-sim's roofline",
        "charges it and with each kernel's work from the timing model (each kernel compiled by",
        "the IRON package's emulation target and timed alone, as in the table at the top), and",
        "the tokens per second this gives (the backend's host time included). A kernel the IRON",
        "package declines (hsa-sim's compiler builds every fused kernel; the layer kernel takes",
        "the tokens of one cache whose projections fit beside the block's own shape) is timed as",
        "the parts the backend runs",
        "instead where the benchmark knows them (each part after the first one more chained",
        "command switching PDI), else charged the roofline: the column \"at the roofline\".",
        "With a unified cache a step's layer is one kernel over its tokens (Q, K and V writing",
        "the cache rows, the attention, the block), each weight and each K and V row read once",
        "per step (over 8 tokens on aie2p with the rotation's arrays kept in the attention's q",
        "rows, which leaves the projections room beside the block's shape).",
        "With a cache per sequence a layer is four kernels: Q, K and V (their f32 rows), the",
        "copies of K's and of V's rows into each sequence's cache (CPY_ROWS: a step's rows apart",
        "in one kernel), the attention (each sequence's tokens against its own cache) with the",
        "block. Q4_K_M's layers with a q6_K ffn_down (half of them) keep ffn_down apart with",
        "either cache: with a unified one three kernels a step (Q, K and V; the attention",
        "through the gate and up products, FLASH_ATTN_GLU_SWIGLU; ffn_down).",
        "",
        *lines,
        "",
        "The feed-forward block of the same shape (RMS_NORM_FFN_SWIGLU, K 2,048, F 8,192) alone",
        "over a step's tokens, each weight tile streamed and decoded once for all of them: its",
        "time under the timing model. On aie2p up to four tokens cost what one does (the DMA",
        "binds) and the cores bind at eight (a MAC and a reduction per row and token on their",
        "vector unit); on aie2, whose multiplier has half the lanes, they bind from four.",
        "",
        *ffn,
        "",
        f"The decode layer kernel of the same shape (DECODE_LAYER_SWIGLU, n_kv {LAYER_DIMS[-1]:,})",
        "over a step's tokens, timed alone the same way: Q, K and V, the attention (each K and",
        "V row read once for all the tokens), the block. Where its projections do not fit",
        "beside the block's own shape the IRON package declines it and the backend runs two",
        "kernels, the Q/K/V kernel and the attention with the block, timed as such with the",
        "PDI switch between them.",
        "",
        *layer,
    ]
    print("\n".join(body))
    write_section(HEADING, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
