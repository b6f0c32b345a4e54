#!/usr/bin/env python3
"""The compiles section of docs/perf.md (`scripts/bench.sh --compiles`): a long generation on
HSA0 (llama-bench's prompt-and-generation test, the kernels counted by hsa-sim, not computed)
and the kernels it compiles and the PDIs it loads, in all and after the first generated token.
Kernel names carry shapes, so a growing context compiles its attention kernels again; this is
the figure a design taking the context length at run time brings to zero. Nothing here ran on
an NPU.
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import hsa_env, iron_capabilities, write_section

HEADING = "## Compiles during generation"
PROMPTS_HEADING = "## Compiles across prompts"
# A conversation's prompts: lengths up to llama.cpp's batch, mostly not powers of two.
PROMPT_LENGTHS = (37, 100, 173, 300, 411, 512, 45, 260, 88, 150, 333, 19, 222, 470, 61, 390)
# The prompts after which compiles are counted apart: the conversation's later turns.
LATER = 6
# The context of a server: llama-batched-bench keeps it for every prompt.
CONTEXT = 4096
PROMPT = 512
# Generated tokens: with the prompt's graph, a power of two of graphs, after which
# GGML_HSA_STATS logs its last totals.
GENERATED = 4095
STATS = re.compile(r"GGML_HSA_STATS after (\d+) graph\(s\): (\{.*\})")
COMPILED = re.compile(r"\] (\S+) for \S+: compiled in")


def run(args, name: str, model: Path, work: Path) -> dict:
    """One model's run: compiles in all and after the first generated token (by kernel
    family), PDI loads likewise, from the plugin's log."""
    d = work / name
    d.mkdir(parents=True)
    env = hsa_env(args.target, args.bin / "libggml-hsa.so", d, False, args.declare)
    env.update(GGML_HSA_ENABLE_LOG="1", GGML_HSA_STATS="1")
    cmd = [str(args.bin / "llama-bench"), "-v", "-m", str(model), "-r", "1", "-p", "0", "-n", "0"]
    cmd += ["-pg", f"{PROMPT},{GENERATED}", "-dev", "HSA0", "-ngl", "99", "--no-warmup"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"llama-bench failed ({done.returncode}): {' '.join(cmd)}")
    totals: dict[int, dict] = {}
    compiles, late = [], []
    for line in done.stderr.splitlines():
        m = STATS.search(line)
        if m:
            totals[int(m.group(1))] = json.loads(m.group(2))
            continue
        m = COMPILED.search(line)
        if m:
            # After the stats of the second graph: the first generated token's graph has run.
            (late if 2 in totals else compiles).append(m.group(1))
    last = totals[max(totals)]
    if last["graphs"] != 1 + GENERATED:
        raise SystemExit(f"{name}: {last['graphs']} graphs logged, {1 + GENERATED} expected")
    families: dict[str, int] = {}
    for kernel in late:
        family = kernel.split("-")[0].upper()
        families[family] = families.get(family, 0) + 1
    return {
        "compiles": len(compiles) + len(late),
        "late": len(late),
        "families": families,
        "pdi_loads": last["pdi_loads"],
        "late_pdi_loads": last["pdi_loads"] - totals[2]["pdi_loads"],
    }


def prompt_runs(args, model: Path, work: Path, pieces: bool, declare: Path) -> list[dict]:
    """Each prompt of PROMPT_LENGTHS in a process of its own (llama-batched-bench, one sequence,
    the same context), the kernel cache shared: the kernels each compiles (the cache's new
    PDIs), its dispatches and hsa-sim's device time (the roofline cost model)."""
    cache = work / "kernels" / "aie2p"
    rows = []
    for n in PROMPT_LENGTHS:
        d = work / str(n)
        d.mkdir(parents=True)
        env = hsa_env(args.target, args.bin / "libggml-hsa.so", d, False, declare)
        env["GGML_HSA_ROW_PIECES"] = "1" if pieces else "0"
        before = set(cache.glob("*.pdi")) if cache.is_dir() else set()
        cmd = [str(args.bin / "llama-batched-bench"), "-m", str(model), "-c", str(CONTEXT)]
        cmd += ["-b", "512", "-ub", "512", "-npp", str(n), "-ntg", "0", "-npl", "1"]
        cmd += ["-dev", "HSA0", "-ngl", "99"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"llama-batched-bench failed ({done.returncode}): {' '.join(cmd)}")
        counters = json.loads((d / "counters.json").read_text())
        rows.append(
            {
                "compiled": len(set(cache.glob("*.pdi")) - before),
                "dispatches": counters["dispatches"],
                "device_ms": counters["device_time_ns"] / 1e6,
            }
        )
    return rows


def prompts_section(args, models: list[str]) -> None:
    """The section "Compiles across prompts": each model's prompts with every kernel over all
    its rows (named by the prompt's length) and over power-of-two counts of them."""
    lines = [
        "| model | prompt tokens | kernels compiled, named by its length (npu) | power-of-two rows (npu) | power-of-two rows, n_kv at dispatch (emu) | dispatches (named / power-of-two) | device ms, roofline (named / power-of-two) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-prompts-") as work:
        npu = iron_capabilities(Path(work) / "npu.json", "npu")
        emu = iron_capabilities(Path(work) / "emu.json", "emu")
        for spec in models:
            name, path = spec.split("=", 1)
            model, at = Path(path), Path(work) / name
            named = prompt_runs(args, model, at / "named", False, npu)
            pieces = prompt_runs(args, model, at / "pieces", True, npu)
            told = prompt_runs(args, model, at / "told", True, emu)
            for n, a, b, c in zip(PROMPT_LENGTHS, named, pieces, told):
                cells = [name, str(n), str(a["compiled"]), str(b["compiled"]), str(c["compiled"])]
                cells += [f"{a['dispatches']} / {b['dispatches']}"]
                cells += [f"{a['device_ms']:.1f} / {b['device_ms']:.1f}"]
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], file=sys.stderr)
            runs = (named, pieces, told)
            total = [sum(r["compiled"] for r in rows) for rows in runs]
            later = [sum(r["compiled"] for r in rows[LATER:]) for rows in runs]
            ms = [sum(r["device_ms"] for r in rows) for rows in runs[:2]]
            calls = [sum(r["dispatches"] for r in rows) for rows in runs[:2]]
            lines.append(
                f"| {name} | all {len(PROMPT_LENGTHS)} (the last {len(PROMPT_LENGTHS) - LATER}) | "
                f"{total[0]} ({later[0]}) | {total[1]} ({later[1]}) | {total[2]} ({later[2]}) | "
                f"{calls[0]} / {calls[1]} | {ms[0]:.1f} / {ms[1]:.1f} |"
            )
    body = [
        "Regenerated by `scripts/bench.sh --compiles`. A conversation's prompts of the 1B shape,",
        f"{', '.join(map(str, PROMPT_LENGTHS))} tokens, each processed by llama-batched-bench on HSA0",
        f"(one sequence, a {CONTEXT}-token context, hsa-sim counting the kernels:",
        "`HSA_SIM_EXECUTE=0`), in that order with one kernel cache, with the declarations of",
        "each IRON target: the kernels each prompt compiles, its dispatches and the simulated",
        "device time (hsa-sim's roofline cost model: bytes and FLOPs, each dispatch's cost; a",
        "bound that does not look at the designs, not the timing model's figure).",
        "Named by its length (`GGML_HSA_ROW_PIECES=0`), every kernel of a new length is",
        "compiled again.",
        "Over power-of-two counts of rows (the default, `ops::pieces`), a prompt compiles only",
        "the powers of two it adds, so the compiles stop once a conversation has used them. The",
        "cost is the second kernel (in place, one per power of two of the length) with its",
        "weights read again, for a length that is not a power of two: the dispatches and device",
        "time columns. With the npu target's declarations the attention's kernels are also named",
        "by the KV length, llama.cpp's n_kv padded to 256, so a prompt reaching a new multiple of",
        "256 compiles those; the emulation target's take it at dispatch.",
        "",
        *lines,
    ]
    print("\n".join(body))
    write_section(PROMPTS_HEADING, body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="llama.cpp's bin directory (the hook build)")
    ap.add_argument("--target", type=Path, required=True, help="hsa-sim's release directory")
    ap.add_argument("models", nargs="+", help="NAME=PATH of each GGUF")
    args = ap.parse_args()
    args.target = args.target.resolve()
    lines = [
        "| model | IRON target's declarations | kernels compiled | of them after the 1st generated token | which (after it) | PDI loads | of them after the 1st generated token |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    targets = (("npu", "npu (n_kv in the name)"), ("emu", "emu (n_kv at dispatch)"))
    with tempfile.TemporaryDirectory(prefix="bench-compiles-") as work:
        for spec in args.models:
            name, path = spec.split("=", 1)
            for target, label in targets:
                args.declare = iron_capabilities(Path(work) / f"{target}.json", target)
                r = run(args, name, Path(path), Path(work) / target)
                which = ", ".join(f"{n} {k}" for k, n in sorted(r["families"].items())) or "-"
                cells = [name, label, str(r["compiles"]), str(r["late"]), which]
                cells += [str(r["pdi_loads"]), str(r["late_pdi_loads"])]
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], file=sys.stderr)
    body = [
        "Regenerated by `scripts/bench.sh --compiles` (about a minute). llama-bench's",
        f"`-pg {PROMPT},{GENERATED}` test on HSA0: a {PROMPT}-token prompt, then {GENERATED:,} generated tokens",
        "(with the prompt's graph, a power of two of graphs: the plugin's GGML_HSA_STATS log",
        "gives its totals after the last one), hsa-sim counting the kernels (`HSA_SIM_EXECUTE=0`)",
        "and hsa-sim-compile compiling every kernel the IRON package declares, each once (a fresh",
        "kernel cache), with the declarations of each of its targets. llama.cpp pads the KV",
        "cache's used length to a multiple of 256. The npu target names the decode's attention",
        "kernels by that length (the layer kernel, the attention with the block after it, its",
        "alternative when a step's cache rows are not consecutive, and Q4_K_M's attention apart",
        "beside q6_K weights), so every 256 tokens they are new kernels, compiled while the model",
        "generates, each a new PDI; on a real NPU each compile is seconds to minutes of `aiecc`",
        "and Peano. The emulation target builds these kernels for every length up to the",
        "cache's rows, told the length at dispatch (`ops::rewrite::kv_length`); their",
        "instruction stream for the npu target is not written yet.",
        "",
        *lines,
    ]
    print("\n".join(body))
    write_section(HEADING, body)
    prompts_section(args, args.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
