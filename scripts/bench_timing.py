#!/usr/bin/env python3
"""The timing model's section of docs/perf.md (`scripts/bench.sh --timing`): the calibration
against published measurements (crates/hsa-sim/tests/timing_calibration.rs), then a
Llama-3.2-1B-shaped model's decode matmuls, its decode-layer kernel and its prompt's GEMMs as
the IRON package's emulated designs run them, timed by hsa-sim's timing model, beside the
roofline the old cost model charges. Nothing here ran on an NPU (docs/timing-model.md).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import cost_constants, write_section
from bench_op import causal_mask, compile_request, run_direct, time_pdi, time_request, timed_inputs
from ggml_hsa_iron.tests.test_decode_layer import layer_request, layer_spec
from ggml_hsa_iron.tests.test_flash_attn import fa_request, llama_1b, spec_of

HEADING = "## The timing model"
ROOT = Path(__file__).resolve().parent.parent
# A decode token of the Llama-3.2-1B shape: per layer (16) the projections (m x k, count),
# then the output projection once (tied embeddings, vocabulary 128256).
LAYERS = 16
LAYER_MATMULS = [
    ("Q, O", 2048, 2048, 2, "f32"),
    ("K, V", 512, 2048, 2, "f32"),
    ("gate, up", 8192, 2048, 2, "f32"),
    ("down", 2048, 8192, 1, "f32"),
]
OUTPUT = ("output", 128256, 2048, None, "f32")
# The prompt's GEMMs (its logits are its last token's), for these types, each with the
# activations the backend gives it: over block-quantized weights bf16 where only GEMMs read
# them (the norms' outputs, the GLU's: src/ops/bf16_activations.rs), f32 for O (the
# attention's output) and over float weights.
PROMPT = 512
PROMPT_MATMULS = [
    ("Q", 2048, 2048, 1, "bf16"),
    ("O", 2048, 2048, 1, "f32"),
    ("K, V", 512, 2048, 2, "bf16"),
    ("gate, up", 8192, 2048, 2, "bf16"),
    ("down", 2048, 8192, 1, "bf16"),
]
PROMPT_TYPES = ["q4_0", "q8_0", "q4_K", "q6_K", "f16"]
TYPES = ["q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K", "f16", "bf16"]
ARCHS = ["aie2p", "aie2"]
# The decode layer kernel at the 1B shape: (n_embd, n_head, n_head_kv, head_dim, n_ff, n_kv).
N_KV = 1024
LAYER_DIMS = (2048, 32, 8, 64, 8192, N_KV)
# The KV cache of the layer kernel told n_kv at dispatch (`n_kv_step`): planned for its rows,
# timed at N_KV (llama-bench's -pg 512,4095 context, docs/perf.md "Compiles during generation").
CACHE_ROWS = 4608
# Decode at long contexts: the layer kernel of a cache of LONG_CACHE rows told n_kv at
# dispatch, timed at each of LONG_N_KV, for these weight types.
LONG_CACHE = 32768
LONG_N_KV = [1024, 8192, 32768]
LONG_TYPES = ["q4_0", "q4_K"]


def calibration_lines() -> list[str]:
    """The calibration tables the tests print (the designs' times, then one core's cycles),
    a blank line between them."""
    cmd = ["cargo", "test", "--locked", "-p", "hsa-sim", "--test", "timing_calibration"]
    cmd += ["published", "--", "--nocapture", "--test-threads", "1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    tables: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.stdout.splitlines():
        if "| configuration |" in line or "| kernel |" in line:
            line = line[line.index("|") :]  # behind libtest's "test ... " of its test
            current = tables.setdefault(line.split("|")[1].strip(), [])
        if line.startswith("|"):
            current.append(line)
    if out.returncode != 0 or set(tables) != {"configuration", "kernel"}:
        sys.stderr.write(out.stdout[-3000:] + out.stderr[-3000:])
        raise SystemExit("the calibration test failed")
    return [*tables["configuration"], "", *tables["kernel"]]


def binds(c: dict) -> str:
    units = {
        "cores": c["core_busy_ns"],
        "shim DMA": c["shim_busy_ns"],
        "tile DMA": c["tile_busy_ns"],
    }
    return max(units, key=units.get)


def matmul_lines(
    args, work: Path, types: list[str], n: int, shapes: list
) -> tuple[list[str], dict]:
    """Each (name, m, k, count per layer, activations' type) MUL_MAT of n columns timed alone
    per weight type and arch (count None: once per token or prompt, for its last token, n = 1),
    and their sum over the layers: the table's lines and each shape's time by (type, arch,
    name)."""
    head = " | ".join(
        f"{name} ({m} × {k}{', bf16 x if quantized' if x == 'bf16' else ''})"
        for name, m, k, _, x in shapes
    )
    unit = "token" if n == 1 else f"{n}-token prompt"
    times = {}
    lines = [
        f"| weights | arch | {head} | per {unit} | roofline | matmuls alone t/s | roofline t/s |",
        "|---|---|" + "---:|" * (len(shapes) + 4),
    ]
    for ty in types:
        for arch in ARCHS:
            dram = cost_constants(arch)["bandwidth_bytes_per_s"] / 1e9
            cells, total_ns, roof_ns = [], 0.0, 0.0
            for name, m, k, count, x in shapes:
                x = x if ty not in ("f32", "f16", "bf16") else "f32"
                cols = n if count else 1
                slug = "".join(ch if ch.isalnum() else "_" for ch in name)
                d = work / f"{n}-{ty}-{arch}-{slug}-{m}x{cols}x{k}-{x}"
                d.mkdir()
                c = run_direct(args, arch, f"type_a={ty},type_b={x},m={m},n={cols},k={k}", d, dram)
                if c is None:
                    cells.append("declined")
                    total_ns = roof_ns = float("nan")
                    continue
                cells.append(f"{c['work_time_ns'] / 1e3:,.0f} µs, {binds(c)}")
                times[ty, arch, name] = c["work_time_ns"]
                total_ns += (LAYERS * count if count else 1) * c["work_time_ns"]
                roof_ns += (LAYERS * count if count else 1) * c["roofline_time_ns"]
            times[ty, arch, "total"] = total_ns
            lines.append(
                f"| {ty} | {arch} | {' | '.join(cells)} | {total_ns / 1e6:,.1f} ms | {roof_ns / 1e6:,.1f} ms"
                f" | {n * 1e9 / total_ns:.1f} | {n * 1e9 / roof_ns:.1f} |"
            )
            print(lines[-1], file=sys.stderr)
    return lines, times


def phase_spans(spec, c: dict) -> dict[str, tuple[float, float, float]]:
    """Each phase of a decode layer's runtime sequence (DecodeSpec.sequence_phases: runs of
    its task groups) by name: its time from the end of the one before (ns), the bytes its shim
    tasks move and the busiest cores' time (each group's busiest, summed)."""
    groups, spans, i, t0 = c["groups"], {}, 0, 0
    phases = spec.sequence_phases()
    if sum(n for _, n in phases) != len(groups):
        raise SystemExit(f"the design's {len(groups)} task groups are not its phases' {phases}")
    for name, n in phases:
        end = groups[i + n - 1]["end_ns"]
        shim = sum(g["shim_bytes"] for g in groups[i : i + n])
        spans[name] = (end - t0, shim, sum(g["core_busy_ns"] for g in groups[i : i + n]))
        i, t0 = i + n, end
    return spans


def phase_cells(spec, c: dict, dram_gbps: float) -> list[str]:
    """Each phase's time, the bytes its shim tasks move over that time and their share of the
    DRAM roof, and the share of it the busiest core computes (phase_spans)."""
    cells = []
    for ns, shim, cores in phase_spans(spec, c).values():
        span = max(ns, 1)
        rate = shim / span
        cells.append(
            f"{ns / 1e3:,.0f} µs, {rate:.1f} GB/s ({rate / dram_gbps:.0%}), cores {cores / span:.0%}"
        )
    return cells


def long_context_lines(args, work: Path, output_ns: dict) -> list[str]:
    """The decode layer kernel of a LONG_CACHE-row cache told n_kv at dispatch (one compile),
    timed at each of LONG_N_KV: its chunks of keys, the layer, its attention phase with the
    rate at which it reads K and V and the share of it its busiest cores compute, and the token
    (layer_lines' sum)."""
    lines = [
        "| weights | arch | chunks of keys | n_kv | layer kernel | attention phase | K and V read at | attention's cores busy | token | decode t/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    _, _, n_head_kv, d, _, _ = LAYER_DIMS
    for ty in LONG_TYPES:
        for arch in ARCHS:
            k = cost_constants(arch)
            dram = k["bandwidth_bytes_per_s"] / 1e9
            out = output_ns.get((ty, arch, OUTPUT[0]))
            dims = LAYER_DIMS[:-1] + (LONG_CACHE,)
            req = json.loads(layer_request("SWIGLU", ty, dims, arch=arch, n_kv_step=256))
            d_work = work / f"long-{ty}-{arch}"
            d_work.mkdir()
            pdi = compile_request(req, d_work)
            if pdi is None or out is None:
                lines.append(f"| {ty} | {arch} | declined | | | | | | | |")
                continue
            spec = layer_spec("SWIGLU", ty, dims, arch, n_kv_step=256)
            for n in LONG_N_KV:
                c = time_pdi(args, req, pdi, d_work, dram, params=[n])
                attn_ns, _, cores_ns = phase_spans(spec, c)["attention"]
                kv_gbps = 2 * n * n_head_kv * d * 2 / attn_ns  # f16 K and V rows
                token = LAYERS * c["work_time_ns"] + out + chain_dispatch_ns(k, LAYERS)
                lines.append(
                    f"| {ty} | {arch} | {spec.fa.nc} | {n:,} | {c['work_time_ns'] / 1e3:,.0f} µs"
                    f" | {attn_ns / 1e3:,.0f} µs | {kv_gbps:.1f} GB/s ({kv_gbps / dram:.0%})"
                    f" | {cores_ns / attn_ns:.0%}"
                    f" | {token / 1e6:,.1f} ms | {1e9 / token:.1f} |"
                )
                print(lines[-1], file=sys.stderr)
    return lines


def chain_dispatch_ns(k: dict, layers: int, per_layer: int = 1) -> float:
    """A decode token's dispatches as one chain (cost constants `k`): its first command, the
    other layers' (`per_layer` kernels each: with one, every layer's PDI is loaded; with more,
    each command switches PDI), then the output norm and projection, each switching PDI."""
    rest = layers * per_layer - 1
    loaded = rest if per_layer == 1 else 0
    return (
        k["chain_latency_ns"]
        + loaded * k["chained_loaded_pdi_ns"]
        + (rest - loaded + 2) * k["chained_new_pdi_ns"]
    )


def layer_lines(args, work: Path, output_ns: dict) -> tuple[list[str], list[str]]:
    """The decode layer kernel (DECODE_LAYER_SWIGLU: norms, Q/K/V with their rotations, the
    attention over N_KV cached rows, O, the SwiGLU FFN, both residuals) at the 1B shape, and a
    token of 16 of them, the output projection and the chain's dispatches; then the layer by
    phase."""
    lines = [
        f"| weights | arch | layer kernel (n_kv {N_KV}) | busiest unit | output projection | dispatches per token | token | decode t/s | told n_kv ({CACHE_ROWS:,}-row cache) | its decode t/s |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    phase_names = None
    phases = []
    for ty in TYPES:
        for arch in ARCHS:
            k = cost_constants(arch)
            dram = k["bandwidth_bytes_per_s"] / 1e9
            d = work / f"layer-{ty}-{arch}"
            d.mkdir()
            req = json.loads(layer_request("SWIGLU", ty, LAYER_DIMS, arch=arch))
            c = time_request(args, req, d, dram)
            out = output_ns.get((ty, arch, OUTPUT[0]))
            if c is None or out is None:
                lines.append(f"| {ty} | {arch} | declined | | | | | | | |")
                continue
            dispatch = chain_dispatch_ns(k, LAYERS)
            token = LAYERS * c["work_time_ns"] + out + dispatch
            # The same layer compiled once for every n_kv up to the cache's rows, at N_KV.
            rd = work / f"layer-rt-{ty}-{arch}"
            rd.mkdir()
            dims = LAYER_DIMS[:-1] + (CACHE_ROWS,)
            rt_req = json.loads(layer_request("SWIGLU", ty, dims, arch=arch, n_kv_step=256))
            rt = time_request(args, rt_req, rd, dram, params=[N_KV])
            rt_cells = "declined | "
            if rt is not None:
                rt_token = LAYERS * rt["work_time_ns"] + out + dispatch
                rt_cells = f"{rt['work_time_ns'] / 1e3:,.0f} µs | {1e9 / rt_token:.1f}"
            lines.append(
                f"| {ty} | {arch} | {c['work_time_ns'] / 1e3:,.0f} µs | {binds(c)} | {out / 1e3:,.0f} µs"
                f" | {dispatch / 1e3:,.0f} µs | {token / 1e6:,.1f} ms | {1e9 / token:.1f} | {rt_cells} |"
            )
            print(lines[-1], file=sys.stderr)
            spec = layer_spec("SWIGLU", ty, LAYER_DIMS, arch)
            phase_names = [name for name, _ in spec.sequence_phases()]
            cells = phase_cells(spec, c, dram)
            phases.append(
                f"| {ty} | {arch} | {' | '.join(cells)} | {c['work_time_ns'] / 1e3:,.0f} µs |"
            )
    head = [
        f"| weights | arch | {' | '.join(phase_names or [])} | layer |",
        "|---|---|" + "---:|" * (len(phase_names or []) + 1),
    ]
    return lines, head + phases


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down weights a Q4_K_M model keeps
    in q6_K (src/llama-quant.cpp): the first and last eighth and every third between (8 of
    the 1B shape's 16)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_prompt_ns(times: dict, arch: str) -> float:
    """A prompt's GEMMs in llama.cpp's Q4_K_M mix, from the q4_K and q6_K shapes timed alone:
    q4_K, but V and down in q6_K in the layers use_more_bits picks, and the output in q6_K."""
    t = lambda ty, name: times[ty, arch, name]  # noqa: E731
    more = sum(use_more_bits(i, LAYERS) for i in range(LAYERS))
    every = t("q4_K", "Q") + t("q4_K", "O") + t("q4_K", "K, V") + 2 * t("q4_K", "gate, up")
    v_down = {ty: t(ty, "K, V") + t(ty, "down") for ty in ("q4_K", "q6_K")}
    return (
        LAYERS * every
        + (LAYERS - more) * v_down["q4_K"]
        + more * v_down["q6_K"]
        + t("q6_K", "output")
    )


def attention_lines(args, work: Path, prompt_ns: dict) -> list[str]:
    """A prompt's attention per layer (FLASH_ATTN_EXT_MASK at n_q = n_kv = PROMPT, the 1B
    shape's 32 heads over 8 KV heads, f16 cache, llama.cpp's causal mask: the kernel skips
    the keys it hides) per arch, and the prompt's GEMMs and attention together per weight type
    and for the Q4_K_M mix."""
    lines = [
        f"| arch | attention per layer ({PROMPT} × {PROMPT}) | busiest unit | plan (block rows, K/V rows per chunk, columns) | per prompt ({LAYERS} layers) |"
        + "".join(f" GEMMs + attention t/s, {ty} |" for ty in PROMPT_TYPES)
        + " GEMMs + attention t/s, Q4_K_M mix |"
        + f" told n_kv ({CACHE_ROWS:,}-row cache) |",
        "|---|---:|---|---|---:|" + "---:|" * (len(PROMPT_TYPES) + 2),
    ]
    for arch in ARCHS:
        dram = cost_constants(arch)["bandwidth_bytes_per_s"] / 1e9
        d = work / f"attention-{arch}"
        d.mkdir()
        kw = llama_1b(PROMPT, PROMPT, arch=arch)
        req = json.loads(fa_request(**kw))
        c = time_request(args, req, d, dram, inputs=timed_inputs(req))
        if c is None:
            lines.append(f"| {arch} | declined | | | |" + " |" * (len(PROMPT_TYPES) + 1))
            continue
        spec = spec_of(**kw)
        attn = LAYERS * c["work_time_ns"]
        gemms = [prompt_ns[ty, arch, "total"] for ty in PROMPT_TYPES]
        gemms.append(q4_k_m_prompt_ns(prompt_ns, arch))
        rates = [PROMPT * 1e9 / (g + attn) for g in gemms]
        # The same attention compiled once for every n_kv up to the cache's rows, at PROMPT:
        # the mask llama.cpp makes for n_kv = PROMPT, rows PROMPT values apart.
        rd = work / f"attention-rt-{arch}"
        rd.mkdir()
        rt_kw = llama_1b(PROMPT, CACHE_ROWS, arch=arch, mask_ne=[CACHE_ROWS, PROMPT, 1, 1])
        rt_req = {**json.loads(fa_request(**rt_kw)), "n_kv_step": 256}
        mask = {3: causal_mask(PROMPT, PROMPT, PROMPT)}
        rt = time_request(args, rt_req, rd, dram, inputs=mask, params=[PROMPT])
        rt_cell = "declined" if rt is None else f"{rt['work_time_ns'] / 1e3:,.0f} µs"
        lines.append(
            f"| {arch} | {c['work_time_ns'] / 1e3:,.0f} µs | {binds(c)} | {spec.g}, {spec.chunk}, {spec.columns}"
            f" | {attn / 1e6:,.1f} ms |" + "".join(f" {r:.0f} |" for r in rates) + f" {rt_cell} |"
        )
        print(lines[-1], file=sys.stderr)
    return lines


def section(
    calibration: list[str],
    decode: list[str],
    layers: list[str],
    layer_phases: list[str],
    long_context: list[str],
    prompt: list[str],
    attention: list[str],
) -> list[str]:
    return [
        "Regenerated by `scripts/bench.sh --timing` (about twenty minutes); the full run keeps it.",
        "hsa-sim's timing model (`docs/timing-model.md`) times an emulated IRON design from what",
        "it does: its DMA channels and the DRAM they share, the cores' counted cycles, the waits",
        "of its dataflow. Its calibration, published designs mirrored and timed against their",
        "published times, then one core's kernels against the cycles of published traces",
        "(`cargo test -p hsa-sim --test timing_calibration -- --nocapture`):",
        "",
        *calibration,
        "",
        "The matrix-vector products of one decode token of the Llama-3.2-1B shape (16 layers:",
        "Q and O 2048 × 2048, K and V 512 × 2048, gate and up 8192 × 2048, down 2048 × 8192;",
        "then the output projection, 128256 × 2048) as this package's IRON designs compute them:",
        "each shape compiled by the emulation target and timed alone (`scripts/bench.sh op",
        "'MUL_MAT(type_a=q4_0,type_b=f32,m=8192,n=1,k=2048)'` shows one in full), the busiest",
        'unit beside each time. "per token" sums them with their counts; "roofline" is what the',
        "old cost model charges the same shapes (operand bytes at the arch's DRAM rate: 56 GB/s",
        "aie2p, 28 GB/s aie2). Dispatches, attention, norms and the rest of the layer are not in",
        "these sums: the t/s columns bound decode from above. The block-quantized weights are",
        "decoded 32 values at a time on the cores' vector unit (`kernels/block_decode.h`); the",
        "cores' scalar code (the scales' conversion, loop control) is counted at one cycle per",
        "basic block, a floor (`docs/timing-model.md`).",
        "",
        *decode,
        "",
        "A decode token as the backend runs it on a llama model: one DECODE_LAYER_SWIGLU kernel",
        f"per layer (its norms, Q, K and V with their rotations, the attention over {N_KV} cached",
        "rows, O, the SwiGLU feed-forward and both residuals in one program), timed alone the same",
        "way, then the token: 16 layers, the output projection of the table above (the same weight",
        "type; the output norm's kernel is not timed) and the chain's dispatches (hsa-sim's",
        "constants: its first command, fifteen layer commands with their PDI loaded, the output",
        "norm and projection switching PDI). This is the decode the emulated designs reach under",
        "the timing model at n_kv 1024 with a same-type output projection; the llama-bench",
        "table at the top times the runs' own kernels (a q6_K output projection, n_kv up to 128).",
        f"The last two columns: the layer kernel the backend asks for when it tells n_kv at",
        f"dispatch (one kernel for every n_kv of a {CACHE_ROWS:,}-row cache: its keys in as many",
        "chunks as the cores' memory needs for the largest, each n_kv / chunks keys), timed at",
        "the same n_kv.",
        "",
        *layers,
        "",
        "The layer kernel by phase (`DecodeSpec.sequence_phases`: runs of the runtime sequence's",
        "task groups, each ending with an await): each phase's time from the end of the one",
        "before, the bytes the shim channels move over that time, their share of the DRAM roof,",
        "and the share of the time the busiest core computes (\"cores\": near 100 % a phase is",
        "bound by its cores, not its channels). Each column streams a phase's weights through",
        "one shim channel (its other one",
        "carries x, the norms, the residual and the attention's K and V rows), so a GEMV phase on",
        "every column tops out at 8 × 4 bytes per cycle, 49 GB/s, on aie2p (88 % of 56 GB/s) and",
        "16 GB/s on aie2 (57 % of 28 GB/s); Q, K and V leave columns idle where their rows do",
        "not fill whole rounds of them. Each task group's weights go out before the group before",
        "it finishes, into the memory tile's W ring: W_o's first tiles stream during the",
        "attention (whose bytes include them) and the next phase never starts from an empty ring.",
        "",
        *layer_phases,
        "",
        f"Decode at long contexts: the layer kernel of a {LONG_CACHE:,}-row cache told n_kv at",
        "dispatch (one compile for every n_kv), timed at a few n_kv, and the token as above. Its",
        "attention takes the keys in a fixed count of chunks (each n_kv / chunks keys: an online",
        "softmax, the cores keeping one chunk's scores), K and V streamed once per KV head through",
        "each column's x channel, all of a KV head's rows valid (no masked key skipped). \"K and",
        "V read at\": their f16 bytes over the attention phase's time (W_o's first tiles stream",
        "beside them), and the share of the DRAM roof; the share of the phase its busiest cores",
        "compute (near 100 %: the cores bind, not the channels). One x channel per column tops out near",
        "49 GB/s on aie2p and 16 GB/s on aie2; the f16 cache of 8,192 keys alone is 268 MB a",
        "token, 4.8 ms at 56 GB/s before any weight is read.",
        "",
        *long_context,
        "",
        f"The GEMMs of a {PROMPT}-token prompt (pp{PROMPT}) of the same shape, each timed alone: the",
        "layers' projections over the prompt's columns, the output projection once (its last",
        "token, as in decode). Each reads the activations the backend gives it: over block-quantized",
        "weights bf16 where only GEMMs read them (the norms' and the GLU's outputs, written so: Q, K,",
        "V, gate, up, down), f32 for O (the attention's output) and over f16 weights. Attention,",
        "norms and dispatches are not in these sums: the t/s columns bound prefill from above.",
        "",
        *prompt,
        "",
        "The prompt's attention (FLASH_ATTN_EXT_MASK, one kernel per layer: 32 heads over 8 KV",
        f"heads, D = 64, the f16 cache's {PROMPT} rows, llama.cpp's causal mask as its data:",
        "`hsa-sim-time --input`), timed alone the same way, and a prompt's GEMMs and attention",
        "together: a bound on prefill from above that leaves out the norms, rotations, residuals,",
        "the cache copies and the dispatches. A block of query rows of the heads of one KV head",
        "goes to a column's cores, one head each, its KV head's K and V rows streamed to them once",
        "per block (plans_fa.py); a core skips the keys the mask hides from its rows (about half",
        "of a causal prompt's), though their rows still stream. The Q4_K_M mix is llama.cpp's",
        "(src/llama-quant.cpp): q4_K, but V and down in q6_K in 8 of the 16 layers and the output",
        "in q6_K, summed from the q4_K and q6_K rows of the table above. The last column: the",
        "attention the backend asks for when it tells n_kv at dispatch (one kernel for every",
        f"n_kv of a {CACHE_ROWS:,}-row cache, planned for its largest), timed at n_kv = {PROMPT}.",
        "",
        *attention,
        "",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True, help="hsa-sim's release directory")
    args = ap.parse_args()
    args.target = args.target.resolve()
    calibration = calibration_lines()
    with tempfile.TemporaryDirectory(prefix="bench-timing-") as work:
        decode, output_ns = matmul_lines(args, Path(work), TYPES, 1, [*LAYER_MATMULS, OUTPUT])
        layers, layer_phases = layer_lines(args, Path(work), output_ns)
        long_context = long_context_lines(args, Path(work), output_ns)
        prompt, prompt_ns = matmul_lines(
            args, Path(work), PROMPT_TYPES, PROMPT, [*PROMPT_MATMULS, OUTPUT]
        )
        attention = attention_lines(args, Path(work), prompt_ns)
    lines = section(calibration, decode, layers, layer_phases, long_context, prompt, attention)
    print("\n".join(lines))
    write_section(HEADING, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
