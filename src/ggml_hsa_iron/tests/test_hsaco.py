"""The AIE hsaco writer: layout of the worked example, de-duplication, refused requests."""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import struct
import unittest

from ggml_hsa_iron import hsaco


def _section(data: bytes, name: bytes) -> bytes:
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shnum, shstrndx = struct.unpack_from("<HH", data, 0x3C)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + 64 * i) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = data[strtab[4] : strtab[4] + strtab[5]]
    for h in headers:
        if names[h[0] :].split(b"\0", 1)[0] == name:
            return data[h[4] : h[4] + h[5]]
    raise KeyError(name)


class HsacoTest(unittest.TestCase):
    def test_worked_example_layout(self):
        ks = [
            hsaco.Kernel("k1", insts=b"\1\0\0\0", pdi=b"\x09" * 16, kernarg_size=48),
            hsaco.Kernel("k2", insts=b"\1\0\0\0", pdi=b"\x09" * 16, kernarg_size=32),
        ]
        data = hsaco.write({"aie2p": ks})
        self.assertEqual(data[:4], b"\x7fELF")
        sec = _section(data, b"aie2p")
        magic, major, minor, hsize, count, esize, soff, ssize, poff = struct.unpack_from(
            "<IHH6I", sec
        )
        self.assertEqual((magic, major, minor), (hsaco.MAGIC, 1, 0))
        self.assertEqual((hsize, count, esize), (48, 2, 44))
        self.assertEqual((soff, ssize, poff), (0x88, 6, 0x8E))
        # Both entries share the two blobs.
        self.assertEqual(len(sec), 0x8E + 4 + 16)
        e1 = struct.unpack_from("<8I", sec, 48)
        e2 = struct.unpack_from("<8I", sec, 48 + 44)
        self.assertEqual(e1[1:5], e2[1:5])
        self.assertEqual((e1[5], e2[5]), (48, 32))

    def test_refused_requests(self):
        k = hsaco.Kernel("k", insts=b"\0" * 4, pdi=b"P")
        with self.assertRaises(ValueError):
            hsaco.write({"aie2p": [k, k]})
        with self.assertRaises(ValueError):
            hsaco.write({"aie2p": [hsaco.Kernel("k", insts=b"\0" * 4)]})
        with self.assertRaises(ValueError):
            hsaco.write({"aie2p": []})
        elf = hsaco.Kernel("m:s", insts=b"E", kind=hsaco.KIND_FULL_ELF)
        hsaco.write({"aie2p": [elf]})
        with self.assertRaises(ValueError):
            hsaco.write({"aie2": [elf]})


if __name__ == "__main__":
    unittest.main()
