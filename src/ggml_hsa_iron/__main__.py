"""Command line: `python3 -m ggml_hsa_iron [--target npu|emu] capabilities | compile --request R
--output-dir D`.

`--target npu` (the default) builds PDIs with mlir-aie and Peano; `--target emu` records the
same designs against the emulation stand-in of IRON and compiles the core kernels for the host,
writing simulator images (version 2) that hsa-sim executes (see emu/).

Exit status: 0 success, 2 well-formed but unsupported, 1 any other failure.
Only `capabilities` writes to stdout; messages go to stderr as one line.
"""

import os
import sys

# A compile server of the emulation target (compile_server.py) runs the compile when one is
# named: before the imports below, which are most of a short compile's time.
if __name__ == "__main__" and os.environ.get("GGML_HSA_EMU_SERVER"):
    from .compile_server import forward

    _served = forward(os.environ["GGML_HSA_EMU_SERVER"], sys.argv[1:])
    if _served is not None:
        sys.exit(_served)

import argparse  # noqa: E402
import gc  # noqa: E402
from pathlib import Path  # noqa: E402

# One kernel per process and no linear algebra: numpy's BLAS threads would only spin on the
# other cores while the design is recorded (a third of a compile's CPU time).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .capabilities import capabilities_json
from .errors import KernelError
from .request import parse_request


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m ggml_hsa_iron",
        description="ggml-hsa NPU kernel compiler (IRON, mlir-aie 1.4.4), protocol 1",
    )
    p.add_argument(
        "--target",
        choices=("npu", "emu"),
        default="npu",
        help="npu: PDIs for the NPU (mlir-aie); emu: simulator images for hsa-sim",
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("capabilities", help="print the ops, types and archs compiled (JSON)")
    c = sub.add_parser("compile", help="compile one kernel request")
    c.add_argument("--request", required=True, type=Path, help="the request JSON file")
    c.add_argument("--output-dir", required=True, type=Path, help="where the kernel files go")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "capabilities":
        sys.stdout.write(capabilities_json(args.target) + "\n")
        return 0
    try:
        try:
            text = args.request.read_text()
        except OSError as e:
            print(f"ggml_hsa_iron: cannot read the request: {e}", file=sys.stderr)
            return 1
        req = parse_request(text)
        # Imported here: the compile pipelines are not needed for capabilities.
        if args.target == "emu":
            # A short-lived process: the collector's passes over the recorded design cost a
            # fifth of its time and free nothing that matters before the process exits.
            gc.disable()
            from .emu.compile import compile_emu

            compile_emu(req, args.output_dir)
        else:
            from .compiler import compile_request

            compile_request(req, args.output_dir)
        return 0
    except KernelError as e:
        print(f"ggml_hsa_iron: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("ggml_hsa_iron: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
