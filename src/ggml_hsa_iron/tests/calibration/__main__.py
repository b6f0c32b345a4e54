"""`python3 -m ggml_hsa_iron.tests.calibration NAME ARCH IMAGE`: see the package."""

import sys
from pathlib import Path

from . import DESIGNS, image

if len(sys.argv) != 4 or sys.argv[1] not in DESIGNS:
    sys.exit(f"usage: python3 -m {__package__} {{{','.join(DESIGNS)}}} ARCH IMAGE")
Path(sys.argv[3]).write_bytes(image(sys.argv[1], sys.argv[2]))
