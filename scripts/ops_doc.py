#!/usr/bin/env python3
"""Summarises `test-backend-ops test -b HSA0 --output csv` runs as docs/ops.md.

Reads the CSV of the run with hsa-sim's reference executors on stdin and writes Markdown on
stdout: per op, how many of the cases test-backend-ops generates ran on HSA0 and passed against
the CPU backend, how many failed, how many the backend declined, and the element types of those
that ran. `--emulated JSON` adds one "IRON emulated" column per architecture from the record of
runs with the IRON designs emulated (the JIT compiler `python3 -m ggml_hsa_iron --target emu`):
cases passed of those that ran; `--iron-ops` (the ops the IRON package declares) makes a
declared op without a record an error.

`--record JSON --ops OPS --emu ARCH=CSV[,LOG] ...` updates that record instead (no stdin): per
architecture and op of OPS the cases in the CSV, those that ran and those that failed, and the
commit they ran at; LOG (the run's stderr) names the kernels a design refused at compile time,
whose nodes ran on the CPU. The other ops' entries are kept.

`--against DOC` (with a CSV of a sample of the cases, scripts/gen-ops-doc.sh --check --sweep)
checks the sample against the committed table instead of writing one: no case failed, and per
op no more cases ran or were declined than the table counts, with no element type it does not
list. A whole sweep is compared with the table exactly by gen-ops-doc.sh.
"""

import argparse
import csv
import datetime
import json
import re
import sys
from collections import defaultdict

TYPE_KEYS = ("type", "type_a", "type_src", "type_dst", "type_b")


def types_of(params: str) -> str:
    """The element types a case names (type=, type_a=, ...), joined as a/b."""
    found = []
    for key in TYPE_KEYS:
        m = re.search(rf"(?:^|,){key}=([A-Za-z0-9_]+)", params)
        if m:
            found.append(m.group(1))
    return "/".join(found) if found else "-"


# Prose after the table: the figures of an opt-in run, measured by hand (the table above is the
# default run).
F16_AS_BF16 = [
    "## f16 computed as bf16 (`GGML_HSA_F16_AS_BF16=1`)",
    "",
    "The table is for the default settings. With `GGML_HSA_F16_AS_BF16=1` every kernel with an",
    "f16 operand computes it as bf16 (inputs rounded to bf16, f16 outputs rounded to bf16",
    "precision), as the C++ backend's F16-to-BF16 substitution did. Measured on hsa-sim against",
    "the CPU backend: MUL_MAT's 215 cases with f16 weights all pass (NMSE about 5e-6 to 8e-6",
    "against a 5e-4 tolerance); element-wise f16 cases mostly fail their 1e-7 tolerance: ADD,",
    "SUB, MUL, DIV 185 of 185 (NMSE 1.5e-6 to 1.1e-5), ROPE 108/108 (about 5e-6), SWIGLU 12/12,",
    "GELU, SILU, SQR, SQRT, CLAMP all, EXP 4/4 (about 3.4e-4), SIGMOID 1/4, TANH 0/4, SOFT_MAX",
    "with an f16 mask 1/88. In all, 328 of the 1189 cases of those ops fail, each an f16 case;",
    "f32 and bf16 cases and host-side ops are unaffected. See",
    "[environment.md](environment.md#ggml_hsa_f16_as_bf16).",
]


class Run:
    """Per-op counts of one test-backend-ops CSV."""

    def __init__(self, rows):
        self.total = defaultdict(int)
        self.supported = defaultdict(int)
        self.failed = defaultdict(int)
        self.types = defaultdict(set)
        for row in rows:
            op = row["op_name"]
            self.total[op] += 1
            if row["supported"] in ("1", "yes", "true"):
                self.supported[op] += 1
                self.types[op].add(types_of(row["op_params"]))
                if row["error_message"] not in ("", "yes"):
                    self.failed[op] += 1

    def record(self) -> dict:
        return {
            op: [self.total[op], self.supported[op], self.failed[op]] for op in sorted(self.total)
        }


# The backend's warning when the compiler refuses a declared kernel (exit 2): the node runs on
# ggml's CPU backend and the kernel is declined from then on. (A refused fused kernel is not
# warned about: its nodes run unfused on HSA0.)
REFUSED = re.compile(r"runs on the CPU: kernel ([^\s:]+): the compiler cannot build this kernel")


def refused_kernels(log_path: str) -> list[str]:
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = re.sub(r"\x1b\[[0-9;]*m", "", f.read())
    return sorted(set(REFUSED.findall(text)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--emulated", metavar="JSON", help="the record of the emulated runs")
    ap.add_argument("--iron-ops", metavar="OPS", help="the ops the IRON package declares")
    ap.add_argument("--record", metavar="JSON", help="write the record of the --emu runs")
    ap.add_argument(
        "--emu",
        action="append",
        default=[],
        metavar="ARCH=CSV[,LOG]",
        help="a run with the IRON designs emulated on ARCH (with --record)",
    )
    ap.add_argument(
        "--sampled",
        action="append",
        default=[],
        metavar="OP=PATTERN",
        help="an op whose emulated run covered only the cases matching PATTERN (with --record)",
    )
    ap.add_argument("--against", metavar="DOC", help="check a sample's CSV against DOC's table")
    ap.add_argument("--commit", default="", help="the commit the --emu runs built (with --record)")
    ap.add_argument("--ops", default="", help="the ops the --emu runs ran (with --record)")
    return ap.parse_args()


def write_record(args) -> int:
    try:
        with open(args.record, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        record = {"archs": {}, "commits": {}, "sampled": {}}
    ran_ops = set(args.ops.split(","))
    for spec in args.emu:
        arch, _, files = spec.partition("=")
        csv_path, _, log_path = files.partition(",")
        with open(csv_path, encoding="utf-8") as f:
            counts = Run(read_csv(f)).record()
        entry = record["archs"].setdefault(arch, {"ops": {}, "refused": []})
        # A kernel's name starts with its op's, lower case: the refusals of the ops not run now
        # are kept.
        prefixes = tuple(op.lower() + "-" for op in ran_ops)
        refused = [k for k in entry["refused"] if not k.startswith(prefixes)]
        refused += refused_kernels(log_path) if log_path else []
        entry["refused"] = sorted(set(refused))
        for op in ran_ops:
            entry["ops"][op] = counts.get(op, [0, 0, 0])
    for op in ran_ops:
        record["commits"][op] = args.commit
    for spec in args.sampled:
        op, _, pattern = spec.partition("=")
        if op in ran_ops:
            record["sampled"][op] = pattern
    record["about"] = (
        "scripts/gen-ops-doc.sh --emu: per architecture and op [cases, ran on HSA0, failed],"
        " the commit each op ran at"
    )
    record["date"] = datetime.date.today().isoformat()
    with open(args.record, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


def emulated_cell(counts, sampled: bool) -> str:
    if not counts or not counts[1]:
        return "-"
    _, ran, bad = counts
    return f"{ran - bad}/{ran}" + (" (sample)" if sampled else "")


def doc_table(path: str) -> dict:
    """The per-op rows of a committed docs/ops.md: op -> (ran, declined, types)."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 6 and cells[1].isdigit() and cells[4].isdigit():
                rows[cells[0]] = (int(cells[1]), int(cells[4]), set(cells[-1].split(", ")))
    return rows


def check_sample(sim: Run, doc_path: str) -> int:
    """Prints what disagrees between a sample of the sweep and the committed table; 1 if any."""
    doc = doc_table(doc_path)
    problems = []
    for op in sorted(sim.total):
        ran, bad = sim.supported[op], sim.failed[op]
        declined = sim.total[op] - ran
        if bad:
            problems.append(f"{op}: {bad} of the {ran} sampled cases that ran failed")
        if op not in doc:
            problems.append(f"{op}: {sim.total[op]} cases in the sample, no row in {doc_path}")
            continue
        doc_ran, doc_declined, doc_types = doc[op]
        if ran > doc_ran:
            problems.append(f"{op}: {ran} sampled cases ran, the table counts {doc_ran}")
        if declined > doc_declined:
            problems.append(
                f"{op}: {declined} sampled cases declined, the table counts {doc_declined}"
            )
        if sim.types[op] - doc_types:
            extra = ", ".join(sorted(sim.types[op] - doc_types))
            problems.append(f"{op}: sampled cases of types {extra} ran, not in the table")
    cases = sum(sim.total.values())
    ran = sum(sim.supported.values())
    print(
        f"sample of the sweep: {cases} cases of {len(sim.total)} ops, {ran} ran on HSA0, "
        f"{sum(sim.failed.values())} failed"
    )
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


def read_csv(f):
    rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(
            f"no rows in {getattr(f, 'name', 'stdin')}: run test-backend-ops --output csv"
        )
    return rows


def main() -> int:
    args = parse_args()
    if args.record:
        return write_record(args)
    sim = Run(read_csv(sys.stdin))
    total, supported, failed, types = sim.total, sim.supported, sim.failed, sim.types
    if args.against:
        return check_sample(sim, args.against)
    record = {"archs": {}, "commits": {}, "sampled": {}}
    if args.emulated:
        with open(args.emulated, encoding="utf-8") as f:
            record = json.load(f)
    archs = record["archs"]
    if args.iron_ops:
        for arch, run in archs.items():
            missing = [op for op in args.iron_ops.split(",") if op not in run["ops"]]
            if missing:
                raise SystemExit(
                    f"{args.emulated}: no emulated run on {arch} of {', '.join(missing)}, which"
                    " the IRON package declares: run scripts/gen-ops-doc.sh --emu"
                )
    out = [
        "# Ops on HSA0",
        "",
        "Generated by `scripts/gen-ops-doc.sh` from `test-backend-ops test -b HSA0 --output csv`",
        "(the pinned llama.cpp; every case compared with the CPU backend). Do not edit by hand.",
        "",
        "* **hsa-sim reference** (the first columns): the plugin on the hsa-sim software NPU with",
        "  its own compiler's capabilities; kernels computed by hsa-sim's Rust reference executors,",
        '  the oracle. "Ran" counts the cases whose whole graph the backend accepted; "declined"',
        "  the others (a type, layout or mode it does not implement: [status.md](status.md),",
        "  [limitations.md](limitations.md)).",
    ]
    if archs:
        commits = ", ".join(f"`{c}`" for c in sorted(set(record["commits"].values())))
        out += [
            "* **IRON emulated** (one column per architecture): the same plugin with the IRON",
            "  package as its compiler (`--target emu`): each kernel is the IRON design a real NPU",
            "  would run, executed by hsa-sim's dataflow emulator with the AIE core kernels built",
            '  for the host. "passed/ran" of the cases the IRON package accepted; "-": none, so on',
            "  a real NPU that op runs on the CPU. Nothing here has run on NPU hardware.",
            f"  Recorded by `scripts/gen-ops-doc.sh --emu`, last on {record['date']}, at the",
            f"  commits {commits} (docs/ops-emulated.json names each op's); CI reruns most of",
            "  these cases in tests/backend_ops_emu.rs.",
        ]
        for op, pattern in sorted(record["sampled"].items()):
            out += [
                f"* {op}'s emulated column (sample) covers only its cases whose parameters match",
                f"  `{pattern}`.",
            ]
    out += [""]
    emu_heads = "".join(f" IRON emulated {arch} |" for arch in archs)
    out += [
        f"| op | ran on HSA0 | passed | failed | declined |{emu_heads} types (cases that ran) |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(archs) + "---|",
    ]
    for op in sorted(total):
        kinds = ", ".join(sorted(types[op])) or "-"
        ran, bad = supported[op], failed[op]
        emu_cells = "".join(
            f" {emulated_cell(run['ops'].get(op), op in record['sampled'])} |"
            for run in archs.values()
        )
        out.append(
            f"| {op} | {ran} | {ran - bad} | {bad} | {total[op] - ran} |{emu_cells} {kinds} |"
        )
    ran, bad = sum(supported.values()), sum(failed.values())
    declined = sum(total.values()) - ran
    summary = (
        f"Total: {ran} cases ran on HSA0, {ran - bad} passed, {bad} failed; {declined} declined."
    )
    out += ["", summary]
    for arch, run in archs.items():
        e_ran = sum(c[1] for c in run["ops"].values())
        e_bad = sum(c[2] for c in run["ops"].values())
        line = f"IRON emulated on {arch}: {e_ran} cases ran, {e_ran - e_bad} passed, {e_bad} failed"
        refused = run["refused"]
        if refused:
            line += (
                f"; {len(refused)} kernels a design's plan refused at compile time ran on the CPU"
                " (listed in docs/ops-emulated.json)"
            )
        out += ["", line + "."]
    out += ["", *F16_AS_BF16]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
