#!/usr/bin/env python3
"""Runs llama-bench on the CPU and on HSA0 and prints per-token figures (scripts/bench.sh).

For every model NAME=PATH: one llama-bench run on the CPU (prompt processing and generation),
then one HSA0 run per test (so that the simulator's counters, HSA_SIM_COUNTERS, and the
backend's statistics, GGML_HSA_STATS, belong to one test). Per token: the nodes the backend was
given and how they ran (NPU kernel, host, CPU), dispatches, doorbells, PDI loads, bytes read by
kernels, host µs per node, the simulated device time (hsa-sim's cost model, aie2p), the bound
(generation: weight bytes / DRAM bandwidth; prompt: arithmetic / the measured GEMM rate), their
ratio, and the published peers. In the full mode the table and a plot go to docs/perf.md and
docs/perf.svg. Nothing here ran on an NPU: the NPU figures are simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# aie2p (XDNA2) constants of hsa-sim's cost model (crates/hsa-sim/src/cost.rs).
DRAM_BYTES_PER_S = 56.0e9
BF16_FLOPS = 14.71e12
# Published figures on XDNA2 NPUs, for reference (landscape: FastFlowLM on Krackan, qvac
# ggml-xdna on Strix Halo). Not the same models as ours: shapes only.
PEERS = [
    ("FastFlowLM, Llama-3.2-1B, Krackan (XDNA2)", 64.5, 1690.0),
    ("qvac ggml-xdna, Qwen3.5-0.8B Q4_K_M (XDNA2)", 52.0, None),
]
SIZES = {"quick": (32, 16), "full": (512, 128)}


def llama_bench(
    bin_dir: Path, model: Path, args: list[str], env: dict[str, str]
) -> tuple[list[dict], str]:
    """llama-bench's JSON results and its log (-v: llama.cpp's graph sizes are in it)."""
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-r", "1", "-o", "json", "-v"]
    run = subprocess.run(cmd + args, env=env, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.stderr.write(run.stderr[-4000:])
        raise SystemExit(f"llama-bench failed ({run.returncode}): {' '.join(cmd + args)}")
    return json.loads(run.stdout), run.stderr


# llama_context's graph reservation log: "graph: nodes = N, ..." or, when the prompt and the
# generation graphs differ, "graph (pp bs=.., tg bs=..): nodes = PP / TG, ...".
GRAPH_NODES = re.compile(r"graph(?: \(pp bs=\d+, tg bs=\d+\))?: nodes = (\d+)(?: / (\d+))?")


def graph_nodes(log: str, kind: str) -> int | None:
    """Nodes of llama.cpp's whole graph (every backend's) for a test of `kind` ("pp"/"tg")."""
    found = GRAPH_NODES.findall(log)
    if not found:
        return None
    pp, tg = found[-1]
    return int(tg) if kind == "tg" and tg else int(pp)


def iron_capabilities(out: Path, target: str = "npu") -> Path:
    """The IRON package's declared capabilities (`python3 -m ggml_hsa_iron --target <target>
    capabilities`: its registry, no mlir-aie needed), written to `out`."""
    root = Path(__file__).resolve().parent.parent
    caps = subprocess.run(
        [sys.executable, "-m", "ggml_hsa_iron", "--target", target, "capabilities"],
        env={**os.environ, "PYTHONPATH": str(root / "src")},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    out.write_text(caps)
    return out


def hsa_env(
    target: Path, plugin: Path, work: Path, execute: bool, declare: Path | None
) -> dict[str, str]:
    env = dict(os.environ)
    compiler = str(target / "hsa-sim-compile")
    if declare is not None:
        # HSA0 declares the IRON package's kernels only (hsa-sim-compile computes them), and
        # declines what its planners refuse: what a real NPU would run as kernels; the rest
        # goes to the CPU.
        env["HSA_SIM_COMPILE_DECLARE"] = str(declare)
        declines = Path(__file__).resolve().parent / "iron_declines.py"
        compiler = f"{sys.executable} {declines} {compiler}"
    env.update(
        GGML_BACKEND_PATH=str(plugin),
        GGML_HSA_LIBHSA_PATH=str(target / "libhsa_runtime64.so"),
        GGML_HSA_JIT_COMPILER=compiler,
        GGML_HSA_KERNEL_CACHE_DIR=str(work.parent / "kernels"),
        GGML_HSA_ENABLE_LOG="0",
        HSA_SIM_QUIET="1",
        HSA_SIM_COUNTERS=str(work / "counters.json"),
        GGML_HSA_STATS=str(work / "stats.json"),
        HSA_SIM_EXECUTE="1" if execute else "0",
    )
    return env


def device_and_host_s(counters: dict, stats: dict) -> tuple[float, float]:
    """A run's simulated device seconds and the backend's host seconds."""
    host_us = max(stats["compute_wall_us"] - stats["device_wait_us"] - stats["kernel_load_us"], 0)
    return counters["device_time_ns"] / 1e9, host_us / 1e6


class KernelTimes:
    """Each kernel a run dispatched, timed alone by hsa-sim's timing model, once per kernel
    name: its compile request (the counters' `kernels`, which the simulator's reference
    images carry) compiled by the IRON package's emulation target and run by hsa-sim-time. A
    prompt's attention gets llama.cpp's causal mask as its data (its cores skip the keys the
    mask hides); every other operand holds small values."""

    def __init__(self, target: Path, work: Path):
        self.target, self.work, self.ns = target, work, {}

    def work_ns(self, name: str, request: dict | None) -> float | None:
        """The kernel's device time alone, or None: no request, or the IRON package declines
        it and it is no fused op whose parts the backend would run instead. A declined fused
        kernel (a prompt's GEMM-sized MUL_MAT_ADD or MUL_MAT_<glu>, a layer's kernel over
        tokens that do not fit it) is timed as those parts, one after the other
        (bench_op.unfused_requests, each itself timed so), each part after the first charged
        one more chained command switching PDI (the parts alternate)."""
        from bench_op import unfused_requests  # both import this module

        if name not in self.ns:
            ns = self._time(request) if request else None
            if ns is None and request:
                parts = [self.work_ns(r["name"], r) for r in unfused_requests(request)]
                if parts and None not in parts:
                    switch = cost_constants(request["arch"])["chained_new_pdi_ns"]
                    ns = sum(parts) + (len(parts) - 1) * switch
            self.ns[name] = ns
        return self.ns[name]

    def _time(self, req: dict) -> float | None:
        from bench_op import time_request, timed_inputs

        d = Path(tempfile.mkdtemp(dir=self.work))
        dram = cost_constants(req["arch"])["bandwidth_bytes_per_s"] / 1e9
        try:
            c = time_request(
                argparse.Namespace(target=self.target), req, d, dram, inputs=timed_inputs(req)
            )
        except SystemExit as e:  # the design failed to compile or to run: left at the roofline
            print(f"[bench] {req['name']}: not timed: {e}", file=sys.stderr)
            return None
        return None if c is None else float(c["work_time_ns"])


def timed_device_ns(counters: dict, times: KernelTimes) -> tuple[float, int]:
    """A run's device time with its kernels' work from the timing model: the dispatch and
    context costs as charged, each dispatch of a kernel the IRON package builds its design's
    time alone (KernelTimes), the others' their charged roofline. Also the dispatches left at
    the roofline."""
    device, left = float(counters["device_time_ns"]), 0
    for name, t in counters.get("kernels", {}).items():
        ns = times.work_ns(name, t.get("request"))
        if ns is None:
            left += t["dispatches"]
        else:
            device += t["dispatches"] * ns - t["work_ns"]
    return device, left


def timed_figures(row: dict, hsa: dict, tokens: int, times: KernelTimes, first=None) -> None:
    """The row's figures under the timing model (KernelTimes) beside the roofline's."""
    _, host_s = device_and_host_s(hsa["counters"], hsa["stats"])
    device, left = timed_device_ns(hsa["counters"], times)
    row["tm_device_ms"] = device / 1e6 / tokens
    row["tm_tps"] = tokens / (device / 1e9 + host_s)
    row["tm_roofline_dispatches"] = left / tokens
    row["tm_steady_tps"] = float("nan")
    if first is not None and tokens > 1:
        _, host_one = device_and_host_s(first["counters"], first["stats"])
        device_one, _ = timed_device_ns(first["counters"], times)
        row["tm_steady_tps"] = (tokens - 1) / max(
            (device - device_one) / 1e9 + host_s - host_one, 1e-9
        )


def figures(name, path, cpu, hsa, tokens, kind, first=None):
    """One row: the per-token figures of one test (`kind` "pp" or "tg") on HSA0. `first`: the
    counters and statistics of a run of the first token alone (generation), whose costs (the
    hardware context built, the graph planned) the steady-state figure leaves out."""
    c, s, wall_tps = hsa["counters"], hsa["stats"], hsa["tps"]
    nodes = s["nodes"] - s["skipped_nodes"]
    # llama.cpp's graph, every backend's nodes (those the scheduler kept on the CPU included),
    # once per graph the backend computed; the CPU backend's time per node is its whole time per
    # token (arithmetic included) over that graph's nodes.
    per_graph = hsa["graph_nodes"]
    graph_nodes_tok = per_graph * s["graphs"] / tokens if per_graph else float("nan")
    cpu_us_per_node = 1e6 / cpu / graph_nodes_tok if per_graph else float("nan")
    steady_graphs = s["graphs"] - 1
    host_us = max(s["compute_wall_us"] - s["device_wait_us"] - s["kernel_load_us"], 0)
    device_s = c["device_time_ns"] / 1e9
    sim_tps = tokens / (device_s + host_us / 1e6)
    if kind == "tg":
        bound = DRAM_BYTES_PER_S / path.stat().st_size
    else:
        bound = BF16_FLOPS / max(c["flops"] / tokens, 1.0)
    # Tokens 2..n: the run minus the first token's run.
    steady_tps = float("nan")
    if first is not None and tokens > 1:
        d_all, h_all = device_and_host_s(c, s)
        d_one, h_one = device_and_host_s(first["counters"], first["stats"])
        steady_tps = (tokens - 1) / max((d_all - d_one) + (h_all - h_one), 1e-9)
    return {
        "model": name,
        "test": f"{kind}{tokens}",
        "cpu_tps": cpu,
        "graph_nodes": graph_nodes_tok,
        "nodes": s["nodes"] / tokens,
        "kernels": sum(s["kernel_nodes"].values()) / tokens,
        "host": sum(s["host_nodes"].values()) / tokens,
        "cpu_nodes": sum(s["cpu_nodes"].values()) / tokens,
        "dispatches": c["dispatches"] / tokens,
        "pdi_switches": c["pdi_switches"] / tokens,
        "dispatch_ms": c["dispatch_time_ns"] / 1e6 / tokens,
        "doorbells": c["doorbells"] / tokens,
        "pdi_loads": c["pdi_loads"],
        # PDI loads per graph after the first (none: a single graph, as pp is).
        "pdi_steady": s["steady_pdi_loads"] / steady_graphs if steady_graphs else float("nan"),
        "plan_hits": s["plan_hits"],
        "graphs": s["graphs"],
        "mb_read": c["bytes_read"] / tokens / 1e6,
        "host_us_per_node": host_us / max(nodes, 1),
        "cpu_us_per_node": cpu_us_per_node,
        "device_ms": device_s * 1e3 / tokens,
        "sim_tps": sim_tps,
        "steady_tps": steady_tps,
        "bound_tps": bound,
        "ratio": sim_tps / bound,
        "wall_tps": wall_tps,
        "host_nodes": s["host_nodes"],
        "cpu_nodes_by_op": s["cpu_nodes"],
    }


def run_model(args, name: str, path: Path, work: Path, times: KernelTimes) -> list[dict]:
    pp, tg = SIZES[args.mode]
    cpu_env = {k: v for k, v in os.environ.items() if k != "GGML_BACKEND_PATH"}
    cpu, _ = llama_bench(
        args.bin, path, ["-p", str(pp), "-n", str(tg), "-dev", "none"], cpu_env
    )
    cpu_tps = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in cpu}
    rows = []
    for kind, test_args, tokens in (
        ("pp", ["-p", str(pp), "-n", "0"], pp),
        ("tg", ["-p", "0", "-n", str(tg)], tg),
    ):
        d = work / f"{name}-{kind}"
        d.mkdir(parents=True, exist_ok=True)
        env = hsa_env(args.target, args.bin / "libggml-hsa.so", d, args.mode == "quick", args.declare_file)
        # No warm-up: the counters then hold exactly the test's tokens (kernels are compiled by
        # the first graph; their time is reported apart and left out of the host time).
        res, log = llama_bench(
            args.bin, path, test_args + ["-dev", "HSA0", "-ngl", "99", "--no-warmup"], env
        )
        hsa = {
            "counters": json.loads((d / "counters.json").read_text()),
            "stats": json.loads((d / "stats.json").read_text()),
            "tps": res[0]["avg_ts"],
            "graph_nodes": graph_nodes(log, kind),
        }
        first = None
        if kind == "tg":
            # The first token alone, in a process of its own as the run's was: what the run
            # spends once (the hardware context, planning its graph), for the steady state.
            d1 = work / f"{name}-tg1"
            d1.mkdir(parents=True, exist_ok=True)
            env1 = hsa_env(args.target, args.bin / "libggml-hsa.so", d1, args.mode == "quick", args.declare_file)
            llama_bench(
                args.bin, path, ["-p", "0", "-n", "1", "-dev", "HSA0", "-ngl", "99", "--no-warmup"],
                env1,
            )
            first = {
                "counters": json.loads((d1 / "counters.json").read_text()),
                "stats": json.loads((d1 / "stats.json").read_text()),
            }
        row = figures(name, path, cpu_tps[kind], hsa, tokens, kind, first)
        timed_figures(row, hsa, tokens, times, first)
        rows.append(row)
        # The table rounds to one decimal: the log keeps two (a target like 70 t/s is judged
        # on these figures).
        tps, steady = row["sim_tps"], row["steady_tps"]
        after = f", {steady:.2f} t/s after the first token" if first is not None else ""
        timed = f"; timing model {row['tm_tps']:.2f} t/s"
        if first is not None:
            timed += f", {row['tm_steady_tps']:.2f} t/s after the first token"
        print(
            f"[bench] {name} {kind}{tokens}: done, simulated {tps:.2f} t/s{after}{timed}",
            file=sys.stderr,
        )
    return rows


# Emulated test-backend-ops cases on HSA0 (the IRON designs through hsa-sim's dataflow emulator,
# their AIE cores built for the host with g++): what the emulated sweeps of the tests cost.
# (ops, -p filter) per mode; the same cases three times: "cold" with an empty core-library cache
# (every core built by g++), "warm" with the cores built, and warm again with each compile a fork
# of the compile server the tests use (src/ggml_hsa_iron/compile_server.py). The kernel cache is
# fresh each time: every design is recorded again.
EMU_CASES = {
    "quick": [("ADD", r"type=f32,ne=\[10,5,4,3\]")],
    "full": [
        ("ADD,CONT,RMS_NORM,SOFT_MAX,GET_ROWS", None),
        ("MUL_MAT", r"type_a=(q4_0|bf16),type_b=f32,"),
    ],
}
TBO_SUMMARY = re.compile(r"(\d+)/(\d+) tests passed")


def cost_constants(arch: str) -> dict:
    """The numeric constants of hsa-sim's model for `arch` (crates/hsa-sim/src/cost.rs), by
    field name; empty when the file has no model of that name."""
    src = (Path(__file__).resolve().parent.parent / "crates/hsa-sim/src/cost.rs").read_text()
    block = re.search(rf"pub const {arch.upper()}: ArchModel = ArchModel \{{(.*?)\n\}};", src, re.S)
    return {
        name: float(value.replace("_", ""))
        for name, value in re.findall(r"^\s*(\w+): ([0-9_.e]+),", block.group(1) if block else "", re.M)
    }


def emulated_hsa0_env(bin_dir: Path, target: Path, kernels: Path, arch: str) -> dict:
    """The environment of a llama.cpp program on HSA0 with the IRON package's emulation target
    as the compiler: the plugin on hsa-sim, its kernels in `kernels`, agent `arch`."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    env.update(
        GGML_BACKEND_PATH=str(bin_dir / "libggml-hsa.so"),
        GGML_HSA_LIBHSA_PATH=str(target / "libhsa_runtime64.so"),
        GGML_HSA_JIT_COMPILER=f"{sys.executable} -m ggml_hsa_iron --target emu",
        PYTHONPATH=str(root / "src"),
        GGML_HSA_KERNEL_CACHE_DIR=str(kernels),
        GGML_HSA_ENABLE_LOG="0",
        HSA_SIM_QUIET="1",
        HSA_SIM_AGENTS=arch,
    )
    return env


def emulation_speed(args, work: Path) -> list[dict]:
    """Emulated test-backend-ops cases per second, cold and warm (EMU_CASES)."""
    root = Path(__file__).resolve().parent.parent
    cores = work / "emu-cores"
    work.mkdir(parents=True, exist_ok=True)
    server_dir = Path(tempfile.mkdtemp(dir=work))  # 0700
    server = subprocess.Popen(
        [sys.executable, "-m", "ggml_hsa_iron.compile_server", "--socket", str(server_dir / "s")],
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    rows = []
    for state in ("cold", "warm", "warm, compile server"):
        cases, start = 0, time.monotonic()
        for i, (ops, pattern) in enumerate(EMU_CASES[args.mode]):
            kernels = work / f"emu-kernels-{state}-{i}"
            kernels.mkdir(parents=True)
            env = emulated_hsa0_env(args.bin, args.target, kernels, "aie2p")
            env["GGML_HSA_EMU_CACHE_DIR"] = str(cores)
            if "server" in state:
                env["GGML_HSA_EMU_SERVER"] = str(server_dir / "s")
            # Several names as one anchored regex: test-backend-ops compiles a regex per case
            # for every plain name that is not the case's op.
            names = "|".join(f"^{o}$" for o in ops.split(",")) if "," in ops else ops
            cmd = [str(args.bin / "test-backend-ops"), "test", "-b", "HSA0", "-o", names]
            if pattern:
                cmd += ["-p", pattern]
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            found = TBO_SUMMARY.findall(run.stdout)
            if run.returncode != 0 or not found or found[-1][0] != found[-1][1] or found[-1][1] == "0":
                sys.stderr.write(run.stdout[-4000:] + run.stderr[-2000:])
                raise SystemExit(f"emulated test-backend-ops failed: {' '.join(cmd)}")
            cases += int(found[-1][1])
        seconds = time.monotonic() - start
        rows.append({"state": state, "cases": cases, "seconds": seconds})
        print(
            f"[bench] emulation ({state}): {cases} cases in {seconds:.0f} s, "
            f"{cases / seconds:.2f} cases/s",
            file=sys.stderr,
        )
    server.terminate()
    server.wait()
    return rows


def emulation_lines(rows: list[dict], mode: str) -> list[str]:
    selection = "; ".join(f"`-o {o}`" + (f" `-p '{p}'`" if p else "") for o, p in EMU_CASES[mode])
    return [
        f"Emulated test-backend-ops on HSA0, aie2p ({selection}), one process per selection:",
        "",
        "| AIE cores, compiles | cases | seconds | cases/s |",
        "|---|---:|---:|---:|",
        *(
            f"| {r['state']} | {r['cases']} | {r['seconds']:.0f} | {r['cases'] / r['seconds']:.2f} |"
            for r in rows
        ),
    ]


COLUMNS = [
    ("model", "model", "{}"),
    ("test", "test", "{}"),
    ("CPU t/s", "cpu_tps", "{:.1f}"),
    ("graph nodes", "graph_nodes", "{:.1f}"),
    ("nodes to HSA0", "nodes", "{:.1f}"),
    ("NPU kernels", "kernels", "{:.1f}"),
    ("host nodes", "host", "{:.1f}"),
    ("CPU nodes", "cpu_nodes", "{:.1f}"),
    ("dispatches", "dispatches", "{:.1f}"),
    ("PDI switches", "pdi_switches", "{:.1f}"),
    ("doorbells", "doorbells", "{:.2f}"),
    ("PDI loads (run)", "pdi_loads", "{}"),
    ("PDI loads/graph (steady)", "pdi_steady", "{:.1f}"),
    ("MB read by kernels", "mb_read", "{:.1f}"),
    ("host µs/node", "host_us_per_node", "{:.1f}"),
    ("CPU µs/node", "cpu_us_per_node", "{:.1f}"),
    ("sim. device ms", "device_ms", "{:.2f}"),
    ("of which dispatch ms", "dispatch_ms", "{:.2f}"),
    ("sim. t/s", "sim_tps", "{:.1f}"),
    ("sim. t/s after the 1st token", "steady_tps", "{:.1f}"),
    ("bound t/s", "bound_tps", "{:.1f}"),
    ("sim/bound", "ratio", "{:.2f}"),
    ("timing model device ms", "tm_device_ms", "{:.2f}"),
    ("timing model t/s", "tm_tps", "{:.1f}"),
    ("timing model t/s after the 1st token", "tm_steady_tps", "{:.1f}"),
    ("dispatches at the roofline", "tm_roofline_dispatches", "{:.1f}"),
]


def cell(fmt: str, value) -> str:
    return "-" if isinstance(value, float) and value != value else fmt.format(value)


def table(rows: list[dict]) -> list[str]:
    out = ["| " + " | ".join(h for h, _, _ in COLUMNS) + " |"]
    out.append("|" + "---|" * len(COLUMNS))
    for r in rows:
        out.append("| " + " | ".join(cell(f, r[k]) for _, k, f in COLUMNS) + " |")
    return out


def svg(rows: list[dict]) -> str:
    """Generation t/s per model: simulated, bound, and the peers' published figures."""
    tg = [r for r in rows if r["test"].startswith("tg")]
    bars = []
    for r in tg:
        bars.append((r["model"].replace("llama-1b-shape-", ""), r["sim_tps"], r["bound_tps"]))
    peak = max([b for _, s, b in bars] + [s for _, s, _ in bars] + [p[1] for p in PEERS]) * 1.1
    w, h, left, top, bottom = 640, 320, 60, 30, 50
    plot_h = h - top - bottom
    group = (w - left - 20) / max(len(bars) + len(PEERS), 1)

    def y(v):
        return top + plot_h * (1 - v / peak)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="18" font-size="13">Decode (tg) tokens/s on the aie2p cost model, '
        "simulated, vs the bandwidth bound and published peers</text>",
        f'<line x1="{left}" y1="{top + plot_h}" x2="{w - 20}" y2="{top + plot_h}" stroke="black"/>',
    ]
    for tick in range(0, int(peak) + 1, max(int(peak / 5 / 10) * 10, 10)):
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4}" text-anchor="end">{tick}</text>')
        parts.append(
            f'<line x1="{left}" y1="{y(tick)}" x2="{w - 20}" y2="{y(tick)}" stroke="#ddd"/>'
        )
    x = left + 8
    for label, sim, bound in bars:
        bw = group * 0.35
        parts.append(
            f'<rect x="{x}" y="{y(sim)}" width="{bw}" height="{y(0) - y(sim)}" fill="#c0392b"/>'
        )
        parts.append(
            f'<rect x="{x + bw}" y="{y(bound)}" width="{bw}" height="{y(0) - y(bound)}" '
            'fill="#95a5a6"/>'
        )
        parts.append(f'<text x="{x + bw}" y="{h - 30}" text-anchor="middle">{label}</text>')
        x += group
    for label, tps, _ in PEERS:
        bw = group * 0.35
        parts.append(
            f'<rect x="{x}" y="{y(tps)}" width="{bw}" height="{y(0) - y(tps)}" fill="#2980b9"/>'
        )
        parts.append(
            f'<text x="{x + bw / 2}" y="{h - 30}" text-anchor="middle">{label.split(",")[0]}</text>'
        )
        x += group
    legend = [("#c0392b", "simulated (ours)"), ("#95a5a6", "bandwidth bound"), ("#2980b9", "peer")]
    for i, (colour, text) in enumerate(legend):
        lx = left + i * 150
        parts.append(f'<rect x="{lx}" y="{h - 16}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{lx + 14}" y="{h - 7}">{text}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=sorted(SIZES), required=True)
    ap.add_argument(
        "--bin",
        type=Path,
        required=True,
        help="llama.cpp's bin directory (the CMake hook's build: llama-bench and the plugin)",
    )
    ap.add_argument(
        "--target", type=Path, required=True, help="cargo's release directory (hsa-sim)"
    )
    ap.add_argument(
        "--kernels",
        choices=("iron", "reference"),
        default="iron",
        help="iron: HSA0 declares the IRON package's kernels only (what a real NPU runs); "
        "reference: every kernel hsa-sim's reference compiler has",
    )
    ap.add_argument(
        "--emulation-only",
        action="store_true",
        help="the emulation's speed alone, written over that section of docs/perf.md",
    )
    ap.add_argument("models", nargs="*", metavar="NAME=PATH")
    args = ap.parse_args()
    if args.emulation_only:
        with tempfile.TemporaryDirectory(prefix="ggml-hsa-bench-") as tmp:
            emu_lines = emulation_lines(emulation_speed(args, Path(tmp)), args.mode)
        print("\n".join(emu_lines))
        write_emulation_section(emu_lines)
        return 0
    if not args.models:
        ap.error("no models")
    args.target = args.target.resolve()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ggml-hsa-bench-") as tmp:
        args.declare_file = (
            iron_capabilities(Path(tmp) / "iron-capabilities.json")
            if args.kernels == "iron"
            else None
        )
        (Path(tmp) / "timed").mkdir()
        times = KernelTimes(args.target, Path(tmp) / "timed")
        for spec in args.models:
            name, _, path = spec.partition("=")
            rows += run_model(args, name, Path(path), Path(tmp) / "runs", times)
        emu_rows = emulation_speed(args, Path(tmp) / "emulation")
    lines = table(rows)
    emu_lines = emulation_lines(emu_rows, args.mode)
    mode_note = (
        "kernels computed by hsa-sim's reference executors"
        if args.mode == "quick"
        else "hsa-sim's host-overhead mode (HSA_SIM_EXECUTE=0: kernels counted and charged, "
        "not computed)"
    )
    print("\n".join(lines))
    print()
    kernels_note = (
        "the kernels the IRON package declares (the rest on the CPU)"
        if args.kernels == "iron"
        else "every kernel of hsa-sim's reference compiler, IRON design or not"
    )
    print(f"HSA0: the plugin on hsa-sim (aie2p cost model), {kernels_note}; {mode_note}. Per token.")
    for label, tg, pp in PEERS:
        print(f"peer: {label}: {tg} t/s decode" + (f", {pp} t/s prefill" if pp else ""))
    for r in rows:
        print(f"{r['model']} {r['test']}: {r['graphs']} graph(s), {r['plan_hits']} from the plan cache")
        if r["host_nodes"] or r["cpu_nodes_by_op"]:
            print(f"{r['model']} {r['test']}: host nodes {r['host_nodes']}, "
                  f"CPU nodes {r['cpu_nodes_by_op']}")
    print()
    print("\n".join(emu_lines))
    if args.mode == "full":
        write_docs(rows, lines, kernels_note, emu_lines)
    return 0


EMULATION_HEADING = "## Emulation speed"


def emulation_section(emu_lines: list[str]) -> list[str]:
    return [
        EMULATION_HEADING,
        "",
        "How fast this machine runs the IRON designs through the emulation (the tests' emulated",
        "sweeps, `docs/testing.md`): wall time of test-backend-ops with the IRON package as the",
        "compiler, each case's kernels compiled (design recorded) and executed by hsa-sim's",
        "dataflow emulator, then compared with the CPU. \"cold\": every AIE core built by g++",
        "first; \"warm\": the cores' libraries and the recorded designs cached (as in a test",
        "run after the first);",
        "\"compile server\": each compile a fork of a Python that imported numpy and the package",
        "once, as in the tests (`src/ggml_hsa_iron/compile_server.py`). `scripts/bench.sh",
        "--emulation` measures this section alone.",
        "",
        *emu_lines,
        "",
    ]


def sections(text: str) -> dict[str, str]:
    """The `## ` sections of a markdown text by heading, each its body up to the next."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return {parts[i]: parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}


def write_section(heading: str, body: list[str]) -> None:
    """docs/perf.md with the section under `heading` new (added before the emulation
    section when it has none)."""
    path = Path(__file__).resolve().parent.parent / "docs" / "perf.md"
    text = path.read_text()
    block = heading + "\n\n" + "\n".join(body).strip("\n") + "\n"
    found = re.search(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", text, flags=re.S | re.M)
    if found:
        text = text[: found.start()] + block + ("\n" if found.end() < len(text) else "") + text[found.end() :]
    elif heading != EMULATION_HEADING and "\n" + EMULATION_HEADING + "\n" in text:
        at = text.index("\n" + EMULATION_HEADING + "\n") + 1
        text = text[:at] + block + "\n" + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)
    print(f"wrote the section {heading!r} of docs/perf.md", file=sys.stderr)


def write_emulation_section(emu_lines: list[str]) -> None:
    write_section(EMULATION_HEADING, emulation_section(emu_lines)[2:])


def write_docs(
    rows: list[dict], lines: list[str], kernels_note: str, emu_lines: list[str]
) -> None:
    load, cores = os.getloadavg()[1], os.cpu_count()
    docs = Path(__file__).resolve().parent.parent / "docs"
    # Sections other runs write (`scripts/bench.sh --timing`) are kept.
    kept = [
        line
        for heading, body in sections((docs / "perf.md").read_text()).items()
        if heading != EMULATION_HEADING
        for line in (heading, "", body, "")
    ]
    (docs / "perf.svg").write_text(svg(rows))
    peers = [
        f"* {label}: {tg} t/s decode" + (f", {pp} t/s prefill" if pp else "")
        for label, tg, pp in PEERS
    ]
    text = [
        "# Performance (simulated)",
        "",
        "Generated by `scripts/bench.sh` (do not edit by hand). Models: Llama-3.2-1B-shaped GGUFs",
        "with random weights (16 layers, n_embd 2048, 32 heads / 8 KV heads, ff 8192, vocab",
        "128256, tied output); `llama-bench` pp512 and tg128, one repetition (on HSA0 without",
        "warm-up, so that the counters hold the test's tokens only; JIT compilation is left out",
        "of the host time).",
        "",
        "**Nothing here ran on an NPU.** \"CPU t/s\" is llama.cpp's CPU backend on this 2-core",
        "machine. The HSA0 figures are per token: the nodes of llama.cpp's whole graph (every",
        "backend's), the nodes it gave the backend and how they ran, the kernels' dispatches",
        "and how many of them switched PDI (a chained command whose PDI differs from the one",
        "before: the array is reconfigured), doorbells, PDI loads in the run and per graph",
        "after the first (steady state; \"-\" for",
        "a single graph), bytes the kernels read, the backend's host time per node (release",
        "build; wall time in the backend minus device waits and kernel reads/compiles/uploads)",
        "beside the CPU backend's time per node (its whole time per token, arithmetic included,",
        "over the graph's nodes), and the device time hsa-sim's",
        "cost model gives for an XDNA2 NPU (aie2p: 90 µs per command chain, 46.7 µs per chained",
        "command switching PDI, 10 µs with the PDI loaded, 56 GB/s, 14.71 TFLOPS bf16; sources in",
        "`crates/hsa-sim/README.md`): the roofline, which does not look at the designs; the section",
        "\"The timing model\" below times the emulated designs themselves. \"sim. t/s\" = tokens /",
        "(device time + host time); \"after the",
        "1st token\" leaves out what a run of the first token alone costs (the hardware context",
        "built, its graph planned: once per process), as llama-bench's warm-up would; the bound is",
        "the weights' bytes at 56 GB/s for generation and the arithmetic at the measured bf16 GEMM",
        "rate for prompt processing; \"of which dispatch ms\" is the device time the commands'",
        "dispatch costs make, the rest being their work. Kernels were counted, not computed",
        "(`HSA_SIM_EXECUTE=0`). HSA0 offered " + kernels_note + " (`--kernels`; hsa-sim-compile",
        "with `HSA_SIM_COMPILE_DECLARE`): kernels the simulator has but no IRON design are not",
        "counted as NPU work unless `--kernels reference`. A kernel the IRON package's planners",
        "refuse (a prompt's GEMM-sized fused kernels, a block of two weight types) is declined",
        "as its compiler declines it (`scripts/iron_declines.py`), so the backend runs what it",
        "falls back to, the kernels a real NPU would run. The \"timing model\" columns take the",
        "same run's device time with each kernel's work from hsa-sim's timing model instead of",
        "the roofline: every kernel the run dispatched compiled by the IRON package's emulation",
        "target and timed alone (`hsa-sim-time`; the prompt's attention with its causal mask),",
        "a fused kernel the package declines as the kernels the backend runs instead (a",
        "prompt's GEMM-sized MUL_MAT_<GLU>: two GEMMs and the GLU; MUL_MAT_ADD: the GEMM and",
        "the ADD); the dispatch and context costs as above; \"dispatches at the roofline\" are",
        "those of kernels still charged the roofline (declined, no parts to time: the V",
        "projection's GEMM into the f16 cache). These are the figures the kernels' work is",
        "measured by (`docs/timing-model.md`,",
        "\"A whole run\").",
        f"The machine's load average (5 min) at the end of the run was {load:.1f} on {cores}",
        "cores: other work slows the CPU columns and the host time per node, not the simulated",
        "device time.",
        "",
        *lines,
        "",
        "Published figures for reference (other models of a similar size, real hardware):",
        "",
        *peers,
        "",
        "![decode tokens/s: simulated, bound and peers](perf.svg)",
        "",
        *kept,
        *emulation_section(emu_lines),
    ]
    (docs / "perf.md").write_text("\n".join(text))
    print("wrote docs/perf.md and docs/perf.svg", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
