"""The real compile path (`compile` without `--target emu`: Peano, the IRON design, aiecc, the
hsaco) run against a fake toolchain: a fake Peano `clang++`, a fake mlir-aie install (its
`include/aie_api`, `bin/aiecc.py`) and a fake `aie.iron` package (the emulation stand-in, whose
program prints as a placeholder module). Each fake tool checks its command line against the
real tool's documented one and writes canned outputs, so the first user with an NPU does not
meet a typo in a flag or a file name.

The command lines checked, from mlir-aie's own callers of the tools (python/utils/compile.py
and aiecc's lit tests on upstream main, 2026-08; docs/real-hardware.md names the versions):
  Peano:  clang++ -O2 -std=c++20 --target={aie2,aie2p}-none-unknown-elf -I<aie_api dir>
          [-D...] -c <source>.cc -o <object>.o
  aiecc:  aiecc [--no-xchesscc --no-xbridge] --peano <dir> | --peano=<dir>
          --alloc-scheme=basic-sequential --get-pdi --pdi-name=<file>
          --get-npu-insts --npu-insts-name=<file> --tmpdir=<dir> <design>.mlir
(`--get-*` as the C++ aiecc spells its output requests; the Python aiecc of older releases
spelt them `--aie-generate-pdi` / `--aie-generate-npu-insts`, which the fake refuses, so a
change of spelling is a decision, not an accident.) No xclbin is packed: the kernel is the PDI
and the instruction stream, packed into the hsaco by this package (hsaco.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import json
import os
import struct
import subprocess
import tempfile
import unittest

from ggml_hsa_iron.tests.util import request_dict, tensor

SRC = Path(__file__).resolve().parent.parent.parent
CANNED_PDI = b"FAKEPDI\0" * 8
CANNED_INSTS = struct.pack("<8I", *range(8))

FAKE_CLANG = r'''#!PYTHON
"""Fake Peano clang++: checks the command line, writes a canned object."""
import json, os, sys
args = sys.argv[1:]
log = os.environ["FAKE_TOOL_LOG"]
def fail(msg):
    print("fake clang++: " + msg, file=sys.stderr)
    sys.exit(1)
known = {"-O2", "-std=c++20", "-c", "-DNDEBUG"}
targets = [a for a in args if a.startswith("--target=")]
if targets not in (["--target=aie2-none-unknown-elf"], ["--target=aie2p-none-unknown-elf"]):
    fail(f"one --target=aie2-none-unknown-elf or aie2p-none-unknown-elf expected, got {targets}")
if "-std=c++20" not in args or "-c" not in args or "-o" not in args:
    fail("-std=c++20, -c and -o expected")
src = args[args.index("-c") + 1]
out = args[args.index("-o") + 1]
if not src.endswith(".cc") or not os.path.isfile(src):
    fail(f"no source file {src}")
if not out.endswith(".o"):
    fail(f"the object {out} must end in .o (the design's Kernel names it)")
incs = [a[2:] for a in args if a.startswith("-I")]
if not any(os.path.isdir(os.path.join(i, "aie_api")) for i in incs):
    fail("no -I of mlir-aie's include directory (aie_api/)")
for a in args:
    if a.startswith("-") and not (a in known or a.startswith(("-I", "-D", "-W", "--target="))) and a != "-o":
        fail(f"unknown flag {a}")
for a in incs:
    if not os.path.isdir(a):
        fail(f"-I{a} is not a directory")
open(out, "wb").write(b"\x7fELF fake object")
with open(log, "a") as f:
    f.write(json.dumps({"tool": "clang++", "args": args, "cwd": os.getcwd()}) + "\n")
'''

FAKE_AIECC = r'''#!PYTHON
"""Fake aiecc.py: checks the command line, writes the canned PDI and instruction stream."""
import json, os, sys
args = sys.argv[1:]
log = os.environ["FAKE_TOOL_LOG"]
def fail(msg):
    print("fake aiecc: " + msg, file=sys.stderr)
    sys.exit(1)
opts, files, i = {}, [], 0
flags = {"--no-xchesscc", "--no-xbridge", "--get-pdi", "--get-npu-insts", "-v", "--verbose",
         "--no-compile-host"}
valued = {"--peano", "--pdi-name", "--npu-insts-name", "--tmpdir", "--alloc-scheme"}
while i < len(args):
    a = args[i]
    if a in flags:
        opts[a] = True
    elif a.split("=", 1)[0] in valued:
        k, eq, v = a.partition("=")
        if not eq:
            i += 1
            v = args[i]
        opts[k] = v
    elif a.startswith("-"):
        fail(f"unknown option {a}")
    else:
        files.append(a)
    i += 1
if len(files) != 1 or not files[0].endswith(".mlir") or not os.path.isfile(files[0]):
    fail(f"one existing .mlir input expected, got {files}")
if not open(files[0]).read().lstrip().startswith("module"):
    fail("the input is not an MLIR module")
for need in ("--get-pdi", "--pdi-name", "--get-npu-insts", "--npu-insts-name", "--peano"):
    if need not in opts:
        fail(f"{need} missing")
if not os.path.isfile(os.path.join(opts["--peano"], "bin", "clang++")):
    fail("--peano is not a Peano installation (bin/clang++)")
if opts.get("--alloc-scheme", "basic-sequential") not in ("basic-sequential", "bank-aware"):
    fail("unknown --alloc-scheme")
objs = [f for f in os.listdir(".") if f.endswith(".o")]
if not objs:
    fail("no core object in the working directory (the Kernels' link_with)")
open(opts["--pdi-name"], "wb").write(bytes.fromhex(os.environ["FAKE_PDI"]))
open(opts["--npu-insts-name"], "wb").write(bytes.fromhex(os.environ["FAKE_INSTS"]))
with open(log, "a") as f:
    f.write(json.dumps({"tool": "aiecc", "args": args, "opts": opts, "objects": objs}) + "\n")
'''

# The fake `aie` package: one file per stand-in module (emu._MODULES), each re-exporting the
# stand-in's names; the program prints as a placeholder module.
FAKE_AIE_INIT = """
from ggml_hsa_iron.emu import iron as _iron

_resolve = _iron.Program.resolve_program


class _Module:
    def __init__(self, rec):
        self.rec = rec

    def __str__(self):
        return "module {\\n  // fake: %d workers\\n}\\n" % len(self.rec.workers)


def _fake_resolve(self, device_name="main"):
    return _Module(_resolve(self, device_name))


_iron.Program.resolve_program = _fake_resolve
"""


def write_fake_aie(site: Path) -> None:
    from ggml_hsa_iron.emu import _MODULES

    for name, attrs in _MODULES.items():
        d = site.joinpath(*name.split("."))
        d.mkdir(parents=True, exist_ok=True)
        lines = [FAKE_AIE_INIT if name == "aie" else "from ggml_hsa_iron.emu import iron\n"]
        lines += [
            f"{k} = iron.{v.__name__ if hasattr(v, '__name__') else k}\n" for k, v in attrs.items()
        ]
        (d / "__init__.py").write_text("".join(lines))


class RealCompilePathTest(unittest.TestCase):
    def setUp(self):
        try:
            import numpy  # noqa: F401  (the stand-in's tensor types)
        except ImportError:
            self.skipTest("numpy is missing")
        self.tmp = tempfile.TemporaryDirectory()
        d = Path(self.tmp.name)
        self.peano = d / "peano"
        self.aie = d / "mlir_aie"
        (self.peano / "bin").mkdir(parents=True)
        (self.aie / "bin").mkdir(parents=True)
        (self.aie / "include" / "aie_api").mkdir(parents=True)
        for path, text in (
            (self.peano / "bin" / "clang++", FAKE_CLANG),
            (self.aie / "bin" / "aiecc.py", FAKE_AIECC),
        ):
            path.write_text(text.replace("PYTHON", sys.executable, 1))
            path.chmod(0o755)
        # The fake IRON package, found first on PYTHONPATH.
        self.site = d / "site"
        write_fake_aie(self.site)
        self.log = d / "tools.log"
        self.out = d / "out"
        self.dir = d

    def tearDown(self):
        self.tmp.cleanup()

    def compile(self, req):
        path = self.dir / "request.json"
        path.write_text(json.dumps(req))
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join([str(self.site), str(SRC)]),
            PEANO_INSTALL_DIR=str(self.peano),
            MLIR_AIE_INSTALL_DIR=str(self.aie),
            FAKE_TOOL_LOG=str(self.log),
            FAKE_PDI=CANNED_PDI.hex(),
            FAKE_INSTS=CANNED_INSTS.hex(),
        )
        # A fake `aie` whose `aie.iron` is found by environment.check(): a real directory.
        return subprocess.run(
            [sys.executable, "-m", "ggml_hsa_iron", "compile", "--request", str(path)]
            + ["--output-dir", str(self.out)],
            capture_output=True,
            text=True,
            env=env,
            cwd=self.dir,
        )

    def calls(self):
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def test_every_tool_invocation_matches_the_documented_command_lines(self):
        for arch, op, ins, out in (
            ("aie2p", "ADD", [tensor("f32", [4096])] * 2, tensor("f32", [4096])),
            ("aie2", "MUL_MAT", [tensor("bf16", [256, 96]), tensor("f32", [256, 48])], None),
        ):
            with self.subTest(arch=arch, op=op):
                self.log.unlink(missing_ok=True)
                out = out or tensor("f32", [96, 48])
                req = request_dict(op, ins, out, arch=arch)
                r = self.compile(req)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout, "")
                calls = self.calls()
                tools = [c["tool"] for c in calls]
                self.assertEqual(tools[-1], "aiecc", tools)
                self.assertGreaterEqual(tools.count("clang++"), 1)
                target = f"--target={arch}-none-unknown-elf"
                for c in calls[:-1]:
                    self.assertIn(target, c["args"])
                aiecc = calls[-1]["opts"]
                self.assertEqual(aiecc["--peano"], str(self.peano))
                self.assertEqual(aiecc["--alloc-scheme"], "basic-sequential")
                # The files the package installs: the hsaco first, then insts and PDI, the
                # canned bytes inside the hsaco's section of the arch.
                name = req["name"]
                names = sorted(p.name for p in self.out.iterdir() if p.name.startswith(name))
                self.assertEqual(
                    names, sorted([f"{name}.hsaco", f"{name}.pdi", f"{name}_insts.bin"])
                )
                self.assertEqual((self.out / f"{name}.pdi").read_bytes(), CANNED_PDI)
                self.assertEqual((self.out / f"{name}_insts.bin").read_bytes(), CANNED_INSTS)
                hsaco = (self.out / f"{name}.hsaco").read_bytes()
                self.assertEqual(hsaco[:4], b"\x7fELF")
                self.assertIn(CANNED_PDI, hsaco)
                self.assertIn(CANNED_INSTS, hsaco)
                self.assertIn(arch.encode() + b"\0", hsaco)

    def test_a_typo_in_a_flag_is_caught(self):
        """The fakes refuse what the real tools would: a mutated aiecc flag fails the build."""
        from ggml_hsa_iron import compiler

        good = compiler.aiecc_args(self.peano, "design.mlir", "design.prj")
        self.assertIn("--get-pdi", good)
        aiecc = self.aie / "bin" / "aiecc.py"
        (self.dir / "design.mlir").write_text("module {}\n")
        (self.dir / "core.o").write_bytes(b"")
        env = dict(os.environ, FAKE_TOOL_LOG=str(self.log), FAKE_PDI="00", FAKE_INSTS="00")
        ok = subprocess.run([str(aiecc), *good], cwd=self.dir, env=env, capture_output=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        for bad in ("--aie-generate-pdi", "--get-pdis", "--npu-inst-name=insts.bin"):
            args = [bad if a.startswith(bad[:9]) else a for a in good]
            if bad not in args:
                args.append(bad)
            r = subprocess.run([str(aiecc), *args], cwd=self.dir, env=env, capture_output=True)
            self.assertNotEqual(r.returncode, 0, bad)


if __name__ == "__main__":
    unittest.main()
