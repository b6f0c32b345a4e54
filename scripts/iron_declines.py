#!/usr/bin/env python3
"""hsa-sim-compile behind the IRON package's planners: the benchmarks' kernel compiler.

Usage: iron_declines.py <hsa-sim-compile> <the compiler protocol's arguments>

A compile request the IRON package's planners refuse (what its compiler answers with exit 2,
"cannot build this kernel": a prompt's GEMM-sized fused kernel, a block of two weight types)
is declined the same way, so that the backend falls back to the kernels a real NPU would run;
every other command and request goes to hsa-sim-compile, which computes the kernel (or, with
HSA_SIM_COMPILE_DECLARE, declares the IRON package's ops). Planning needs no mlir-aie.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def main() -> int:
    sim, args = sys.argv[1], sys.argv[2:]
    if args[:1] == ["compile"] and "--request" in args:
        from ggml_hsa_iron.errors import RequestError, UnsupportedError
        from ggml_hsa_iron.plans import prepare
        from ggml_hsa_iron.request import parse_request

        request = Path(args[args.index("--request") + 1])
        try:
            prepare(parse_request(request.read_text()))
        except (UnsupportedError, RequestError) as e:
            print(f"the IRON package declines it: {e}", file=sys.stderr)
            return 2
    os.execv(sim, [sim, *args])
    return 1


if __name__ == "__main__":
    sys.exit(main())
