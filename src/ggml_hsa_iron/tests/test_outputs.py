"""The kernel files a compile installs: the protocol's PDI and instruction stream, and the same
kernel as an AIE code object for packet ABI c."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import struct
import tempfile
import unittest

from ggml_hsa_iron import hsaco
from ggml_hsa_iron.outputs import install_kernel
from ggml_hsa_iron.request import parse_request
from ggml_hsa_iron.tests.util import request_json, tensor


class InstallKernelTest(unittest.TestCase):
    def test_writes_the_three_files_and_nothing_else(self):
        t = tensor("f32", [64])
        for arch, columns in (("aie2", 4), ("aie2p", 8)):
            with self.subTest(arch=arch), tempfile.TemporaryDirectory() as d:
                req = parse_request(request_json("ADD", [t, t], t, arch=arch))
                pdi, insts = b"P" * 40, struct.pack("<4I", 1, 2, 3, 4)
                install_kernel(req, Path(d), pdi, insts)
                names = sorted(p.name for p in Path(d).iterdir())
                self.assertEqual(
                    names, sorted([f"{req.name}.pdi", f"{req.name}_insts.bin", f"{req.name}.hsaco"])
                )
                self.assertEqual((Path(d) / f"{req.name}.pdi").read_bytes(), pdi)
                self.assertEqual((Path(d) / f"{req.name}_insts.bin").read_bytes(), insts)
                want = hsaco.single_kernel(arch, req.name, pdi, insts, 3, columns)
                self.assertEqual((Path(d) / f"{req.name}.hsaco").read_bytes(), want)
                self.assertEqual(want[:4], b"\x7fELF")


if __name__ == "__main__":
    unittest.main()
