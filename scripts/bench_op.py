#!/usr/bin/env python3
"""One test-backend-ops case on HSA0 through its emulated IRON design, per architecture: the
device time hsa-sim's timing model gives and where it went (`scripts/bench.sh op 'CASE'`).

CASE is a test-backend-ops case string, `OP(params)` as the program prints it, for example
`MUL_MAT(type_a=q4_0,type_b=f32,m=8192,n=1,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1)`.
test-backend-ops builds that one node and runs it on HSA0 (the plugin on hsa-sim, the IRON
package's emulation target as its compiler) and on the CPU, and compares them; the counters of
hsa-sim give the figures. Nothing here ran on an NPU (docs/timing-model.md).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import TBO_SUMMARY, cost_constants, emulated_hsa0_env


def mul_mat_flops(params: str) -> int | None:
    """2 m n k per matrix of a MUL_MAT case (bs and nr broadcast the batch), else None."""
    p = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,]+)", params))
    try:
        m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
        batch = 1
        for key in ("bs", "nr"):
            for v in p.get(key, "[1,1]").strip("[]").split(","):
                batch *= int(v)
    except (KeyError, ValueError):
        return None
    return 2 * m * n * k * batch


def run(args, arch: str, op: str, params: str, work: Path) -> dict | None:
    counters = work / f"counters-{arch}.json"
    kernels = work / f"kernels-{arch}"
    kernels.mkdir()
    env = emulated_hsa0_env(args.bin, args.target, kernels, arch)
    env["HSA_SIM_COUNTERS"] = str(counters)
    cmd = [str(args.bin / "test-backend-ops"), "test", "-b", "HSA0", "-o", op]
    # The params as an ECMAScript regex (std::regex), anchored: exactly this case.
    cmd += ["-p", "^" + re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", params) + "$"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = TBO_SUMMARY.findall(out.stdout)
    if out.returncode != 0 or not found or found[-1] != ("1", "1"):
        if "not supported" in out.stdout:
            return None
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-2000:])
        raise SystemExit(f"{arch}: the case did not run once and pass: {' '.join(cmd)}")
    return json.loads(counters.read_text())


def report(arch: str, c: dict, flops: int | None, k: dict, dram_gbps: float) -> None:
    us = lambda ns: f"{ns / 1e3:,.1f} µs"  # noqa: E731
    d = c["dispatches"]
    if d == 0 or not c.get("dataflow_timed"):
        print(f"{arch}: no emulated IRON design ran (the node went to the CPU)")
        return
    work = c["work_time_ns"]
    total = c["device_time_ns"]
    moved = c["bytes_read"] + c["bytes_written"]
    gbs = moved / work if work else 0.0
    print(f"{arch}: {d} command(s), {c['dataflow_timed']} timed from their emulated dataflow")
    print(f"  device time      {us(total)}: the work {us(work)}, dispatch {us(c['dispatch_time_ns'])},")
    print(f"                   hardware-context build {us(total - work - c['dispatch_time_ns'])}")
    print(f"  bytes moved      {moved:,} at {gbs:.1f} GB/s: {gbs / dram_gbps:.0%} of the DRAM roof")
    if flops:
        peak = 2 * k["bf16_macs_per_core_cycle"] * k["cores"] * k["clock_hz"]
        rate = flops / (work * 1e-9)
        print(f"  arithmetic       {flops:,} flop at {rate / 1e12:.3f} TFLOPS: {rate / peak:.1%} of the bf16 MAC roof")
    print("  where the time went (busiest unit, summed over commands):")
    print(f"    cores          {us(c['core_busy_ns'])}")
    print(f"    shim DMA       {us(c['shim_busy_ns'])} (DRAM waits included)")
    print(f"    tile DMA       {us(c['tile_busy_ns'])} (memory tiles and core-to-core)")
    busiest = max(c["core_busy_ns"], c["shim_busy_ns"], c["tile_busy_ns"])
    print(f"    waits          {us(max(work - busiest, 0))} (the critical path beyond the busiest unit)")
    print(f"  roofline bound   {us(c['roofline_time_ns'])} (bytes at {dram_gbps:g} GB/s, the old model)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="the hook build's bin directory")
    ap.add_argument("--target", type=Path, required=True, help="hsa-sim's release directory")
    ap.add_argument("--arch", action="append", choices=["aie2p", "aie2"])
    ap.add_argument("case", help="OP(params), as test-backend-ops prints it")
    args = ap.parse_args()
    m = re.fullmatch(r"([A-Z0-9_]+)\((.*)\)", args.case.strip())
    if not m:
        raise SystemExit(f"not a test-backend-ops case string (OP(params)): {args.case!r}")
    op, params = m.groups()
    flops = mul_mat_flops(params) if op == "MUL_MAT" else None
    print(f"{args.case}, simulated (hsa-sim's timing model; nothing ran on an NPU)")
    with tempfile.TemporaryDirectory(prefix="bench-op-") as work:
        for arch in args.arch or ["aie2p", "aie2"]:
            k = cost_constants(arch)
            if not k:
                raise SystemExit(f"no model for {arch} in crates/hsa-sim/src/cost.rs")
            dram = float(os.environ.get("HSA_SIM_DRAM_GBPS") or k["bandwidth_bytes_per_s"] / 1e9)
            c = run(args, arch, op, params, Path(work))
            if c is None:
                print(f"{arch}: not supported on HSA0 (test-backend-ops ran it nowhere)")
            else:
                report(arch, c, flops, k, dram)
    return 0


if __name__ == "__main__":
    sys.exit(main())
