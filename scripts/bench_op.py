#!/usr/bin/env python3
"""One test-backend-ops case on HSA0 through its emulated IRON design, per architecture: the
device time hsa-sim's timing model gives and where it went (`scripts/bench.sh op 'CASE'`).

CASE is a test-backend-ops case string, `OP(params)` as the program prints it, for example
`MUL_MAT(type_a=q4_0,type_b=f32,m=8192,n=1,k=2048,bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1)`.
test-backend-ops builds that one node and runs it on HSA0 (the plugin on hsa-sim, the IRON
package's emulation target as its compiler) and on the CPU, and compares them; the counters of
hsa-sim give the figures. A MUL_MAT of contiguous operands that test-backend-ops has no case of
(the shapes of a model's weights, say) is built as the backend would request it, compiled by
the emulation target and timed by `hsa-sim-time`, without the backend: the kernel's work alone,
no dispatch. Nothing here ran on an NPU (docs/timing-model.md).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from ggml_hsa_iron.plans_decode import q_heads_view  # noqa: E402
from ggml_hsa_iron.request import Tensor, parse_request  # noqa: E402
from ggml_hsa_iron.tests.util import request_dict, tensor  # noqa: E402  (the package's requests)


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


def mul_mat_request(params: str, arch: str) -> dict:
    """The compile request of a MUL_MAT case of contiguous operands (per=[0,1,2,3], k_v=0,
    o=1), as the backend sends it: A [k, m, bs], B [k, n, bs * nr], f32 C [m, n, bs * nr]."""
    p = dict(re.findall(r"(\w+)=(\[[^\]]*\]|[^,]+)", params))
    layout = (p.get("per", "[0,1,2,3]"), p.get("k_v", "0"), p.get("o", "1"))
    if layout != ("[0,1,2,3]", "0", "1"):
        raise SystemExit("only contiguous MUL_MAT operands (per=[0,1,2,3],k_v=0,o=1) are built here")
    try:
        m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
        bs = [int(v) for v in p.get("bs", "[1,1]").strip("[]").split(",")]
        nr = [int(v) for v in p.get("nr", "[1,1]").strip("[]").split(",")]
        outer = [bs[0] * nr[0], bs[1] * nr[1]]
        a, b = tensor(p["type_a"], [k, m, *bs]), tensor(p["type_b"], [k, n, *outer])
    except (KeyError, ValueError) as e:
        raise SystemExit(f"not a MUL_MAT case the backend would request: {params!r} ({e})") from None
    return request_dict("MUL_MAT", [a, b], tensor("f32", [m, n, *outer]), arch)


GLUS = ("REGLU", "GEGLU", "SWIGLU", "GEGLU_ERF", "GEGLU_QUICK")


def causal_mask(n_q: int, n_kv: int, rows: int) -> bytes:
    """llama.cpp's mask of a prompt's n_q tokens after n_kv - n_q cached ones, as f16 bytes of
    [n_kv, rows]: query row i sees keys 0 .. n_kv - n_q + i (0); the later keys and the
    padding rows are -inf."""
    import numpy as np  # the emulation's packages (bench.sh installs them)

    row = np.arange(rows)[:, None]
    key = np.arange(n_kv)[None, :]
    seen = (row < n_q) & (key <= n_kv - n_q + row)
    return np.where(seen, 0.0, -np.inf).astype(np.float16).tobytes()


def timed_inputs(req: dict) -> dict[int, bytes] | None:
    """The operands a kernel's time depends on, as `time_request` takes them: a prompt's
    FLASH_ATTN_EXT_MASK gets llama.cpp's causal mask (its cores skip the keys it hides)."""
    if not req["op"].startswith("FLASH_ATTN_EXT_MASK") or req["inputs"][0]["ne"][1] == 1:
        return None
    q, k, mask = (req["inputs"][i] for i in (0, 1, 3))
    return {3: causal_mask(q["ne"][1], k["ne"][1], mask["ne"][1])}


def unfused_requests(req: dict) -> list[dict]:
    """The kernels the backend runs for a fused MUL_MAT_ADD or MUL_MAT_<glu> the IRON package
    declines (a prompt's GEMM-sized ones): the MUL_MAT (both, for the GLU's gate and up) into
    a dense f32 product, then the ADD of the residual or the GLU of the two products; for a
    FLASH_ATTN_FFN_<glu> (a step of several sequences with a cache each) the attention alone,
    then MUL_MAT_ADD_RMS_NORM_FFN_<glu> of its output (FLASH_ATTN_GLU_<glu>: then W_o's
    MUL_MAT_ADD and RMS_NORM_MUL_MAT_<glu>); for a DECODE_LAYER(_FF)_<glu> (a step of
    tokens whose projections do not fit beside the block's own shape) the Q/K/V kernel, then
    FLASH_ATTN_FFN_<glu> reading Q; [] for any other op."""
    op, arch = req["op"], req["arch"]
    ins = [tensor(t["type"], t["ne"]) for t in req["inputs"]]
    out = tensor(req["output"]["type"], req["output"]["ne"])
    if op.startswith("DECODE_LAYER_"):
        # Wq, Wk, Wv, x, n_attn, the positions, (the factors,) k, v, the mask, W_o, W_g, W_u,
        # W_d, n_ffn; out, then Q, K rows, V rows, a, r1, h; op_params RMS_NORM_QKV_ROPE's 12
        # words, FLASH_ATTN_FFN_<glu>'s 4.
        sent = parse_request(json.dumps(req))
        ff = op.startswith("DECODE_LAYER_FF_")
        glu = op.removeprefix("DECODE_LAYER_FF_" if ff else "DECODE_LAYER_")
        n = 6 + ff
        qkv_ins, (k, v, mask, wo, wg, wu, wd, n_ffn) = sent.inputs[:n], sent.inputs[n:]
        q, kr, vr, a, r1, h = sent.extra_outputs
        x, params = qkv_ins[3], req["op_params"]
        qkv = "RMS_NORM_QKV_ROPE" + ("_FF" if ff else "")
        attn = request_dict(
            f"FLASH_ATTN_FFN_{glu}",
            [q_heads_view(q), k, v, mask, wo, x, wg, wu, wd, n_ffn],
            sent.output,
            arch,
            params[12:],
            None,
            [a, r1, h],
        )
        if "n_kv_step" in req:
            attn["n_kv_step"] = req["n_kv_step"]
        return [request_dict(qkv, list(qkv_ins), q, arch, params[:12], None, [kr, vr]), attn]
    if op.startswith("FLASH_ATTN_FFN_"):
        # Its operands as sent (the cache views' strides kept): q, k, v, mask, W_o, r0, W_g,
        # W_u, W_d, n; out, then a, r1 and h; op_params the attention's three words, then eps.
        sent = parse_request(json.dumps(req))
        q, k, v, mask, wo, r0, wg, wu, wd, n = sent.inputs
        a, r1, h = sent.extra_outputs
        a_rows = Tensor.dense(a.dtype, (wo.ne[0], r0.ne[1], 1, 1))  # a read as [Ka, N]
        params, glu = req["op_params"], op.removeprefix("FLASH_ATTN_FFN_")
        block = f"MUL_MAT_ADD_RMS_NORM_FFN_{glu}"
        return [
            request_dict("FLASH_ATTN_EXT_MASK", [q, k, v, mask], a, arch, params[:3]),
            request_dict(block, [wo, a_rows, r0, wg, wu, wd, n], out, arch, params[3:], None, [r1, h]),
        ]
    if op.startswith("FLASH_ATTN_GLU_"):
        # q, k, v, mask, W_o, r0, W_g, W_u, n; h, then a and r1: the attention alone, W_o's
        # MUL_MAT_ADD over it, then the gate and up products of r1 normed.
        sent = parse_request(json.dumps(req))
        q, k, v, mask, wo, r0, wg, wu, n = sent.inputs
        a, r1 = sent.extra_outputs
        a_rows = Tensor.dense(a.dtype, (wo.ne[0], r0.ne[1], 1, 1))
        params, glu = req["op_params"], op.removeprefix("FLASH_ATTN_GLU_")
        return [
            request_dict("FLASH_ATTN_EXT_MASK", [q, k, v, mask], a, arch, params[:3]),
            request_dict("MUL_MAT_ADD", [wo, a_rows, r0], r1, arch),
            request_dict(f"RMS_NORM_MUL_MAT_{glu}", [wg, wu, r1, n], out, arch, params[3:]),
        ]
    if op == "MUL_MAT_ADD":
        w, x, r = ins
        return [
            request_dict("MUL_MAT", [w, x], out, arch),
            request_dict("ADD", [out, r], out, arch),
        ]
    glu = op.removeprefix("MUL_MAT_")
    if op.startswith("MUL_MAT_") and glu in GLUS:
        wg, wu, x = ins
        return [
            request_dict("MUL_MAT", [wg, x], out, arch),
            request_dict("MUL_MAT", [wu, x], out, arch),
            request_dict(glu, [out, out], out, arch),
        ]
    return []


def time_request(
    args,
    req: dict,
    work: Path,
    dram_gbps: float,
    flops: int = 0,
    inputs: dict[int, bytes] | None = None,
    params: list[int] | None = None,
) -> dict | None:
    """A compile request compiled by the emulation target and timed alone by hsa-sim-time, as
    counters (its kernel work, no dispatch); None when the IRON package declines it. `inputs`:
    the bytes of operands (by their index in the request: inputs, then outputs) whose values
    the kernel's work depends on (an attention's mask); the others hold small values.
    `params`: the run-time values of a kernel taking them (a request with `n_kv_step`: n_kv)."""
    pdi = compile_request(req, work)
    if pdi is None:
        return None
    return time_pdi(args, req, pdi, work, dram_gbps, flops, inputs, params)


def compile_request(req: dict, work: Path) -> Path | None:
    """The PDI the emulation target compiles for request `req` (in work), or None when the
    IRON package declines it."""
    arch = req["arch"]
    out_dir = work / f"direct-{arch}"
    out_dir.mkdir()
    (work / f"req-{arch}.json").write_text(json.dumps(req))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "ggml_hsa_iron", "--target", "emu", "compile"]
    cmd += ["--request", str(work / f"req-{arch}.json"), "--output-dir", str(out_dir)]
    c = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if c.returncode == 2:
        return None
    if c.returncode != 0:
        raise SystemExit(f"{arch}: the IRON package failed to compile {req['op']}: {c.stderr[-2000:]}")
    return out_dir / f"{req['name']}.pdi"


def time_pdi(
    args,
    req: dict,
    pdi: Path,
    work: Path,
    dram_gbps: float,
    flops: int = 0,
    inputs: dict[int, bytes] | None = None,
    params: list[int] | None = None,
) -> dict:
    """compile_request's PDI timed alone by hsa-sim-time (time_request's counters)."""
    arch = req["arch"]
    cmd = [str(args.target / "hsa-sim-time"), str(pdi), "--arch", arch]
    cmd += ["--dram-gbps", f"{dram_gbps:g}"]
    if params:
        cmd += ["--params", ",".join(str(p) for p in params)]
    for n, data in (inputs or {}).items():
        (work / f"input-{arch}-{n}.bin").write_bytes(data)
        cmd += ["--input", f"{n}={work / f'input-{arch}-{n}.bin'}"]
    t = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if t.returncode != 0:
        raise SystemExit(f"{arch}: {t.stderr.strip()}")
    r = json.loads(t.stdout)
    out_bytes = req["output"]["nb"][3] * req["output"]["ne"][3]
    # The roofline of crates/hsa-sim/src/cost.rs: bytes at the DRAM rate or flops at the
    # measured bf16 GEMM rate, whichever is longer.
    roof_s = max(r["operand_bytes"] / (dram_gbps * 1e9), flops / cost_constants(arch)["measured_bf16_flops"])
    return {
        "dispatches": 1,
        "dataflow_timed": 1,
        "work_time_ns": r["device_ns"],
        "device_time_ns": r["device_ns"],
        "dispatch_time_ns": 0,
        "bytes_read": r["operand_bytes"] - out_bytes,
        "bytes_written": out_bytes,
        "core_busy_ns": r["core_busy_ns"],
        "shim_busy_ns": r["shim_busy_ns"],
        "tile_busy_ns": r["tile_busy_ns"],
        "roofline_time_ns": roof_s * 1e9,
        "direct": True,
        "groups": r["groups"],
    }


def run_direct(args, arch: str, params: str, work: Path, dram_gbps: float) -> dict | None:
    """A MUL_MAT case test-backend-ops has none of, timed alone (time_request)."""
    return time_request(args, mul_mat_request(params, arch), work, dram_gbps, mul_mat_flops(params) or 0)


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
    if out.returncode == 0 and found and found[-1] == ("0", "0") and op == "MUL_MAT":
        return run_direct(args, arch, params, work, args.dram)
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
    if c.get("direct"):
        print(f"{arch}: built as the backend would request it (no test-backend-ops case), timed alone")
        print(f"  device time      {us(work)}: the work, without a dispatch")
    else:
        print(f"{arch}: {d} command(s), {c['dataflow_timed']} timed from their emulated dataflow")
        print(f"  device time      {us(total)}: the work {us(work)}, dispatch {us(c['dispatch_time_ns'])},")
        print(f"                   hardware-context build {us(total - work - c['dispatch_time_ns'])}")
    what = "operand bytes" if c.get("direct") else "bytes moved  "
    print(f"  {what}    {moved:,} at {gbs:.1f} GB/s: {gbs / dram_gbps:.0%} of the DRAM roof")
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
            args.dram = dram
            c = run(args, arch, op, params, Path(work))
            if c is None:
                print(f"{arch}: not supported on HSA0 (test-backend-ops ran it nowhere)")
            else:
                report(arch, c, flops, k, dram)
    return 0


if __name__ == "__main__":
    sys.exit(main())
