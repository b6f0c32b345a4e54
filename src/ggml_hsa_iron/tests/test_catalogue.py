"""The registry against the backend's op catalogue (src/op_catalogue.toml).

The catalogue declares every op once, with the architectures that have an IRON design
and the design file defining `ggml_op_<op>`. The registry is this package's own
declaration (it ships without the backend's sources); this test keeps the two equal
when the package sits in the repository next to the catalogue.
"""

import sys
import tomllib
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ggml_hsa_iron import registry
from ggml_hsa_iron.archs import ARCHS

CATALOGUE = Path(__file__).resolve().parents[2] / "op_catalogue.toml"


def iron_entries() -> dict[str, dict]:
    ops = tomllib.loads(CATALOGUE.read_text())["op"]
    return {e["name"]: e for e in ops if e["iron"]}


@unittest.skipUnless(CATALOGUE.is_file(), "the backend's catalogue is not next to the package")
class CatalogueTest(unittest.TestCase):
    def test_the_registry_has_exactly_the_catalogue_iron_ops(self):
        self.assertEqual({s.op for s in registry.OPS}, set(iron_entries()))

    def test_sources_arity_parameters_and_archs_agree(self):
        entries = iron_entries()
        for spec in registry.OPS:
            e = entries.get(spec.op)
            if e is None:
                continue
            with self.subTest(op=spec.op):
                self.assertEqual(spec.source, e["iron_source"])
                self.assertEqual(spec.inputs, e["inputs"])
                self.assertEqual(spec.params, e["params"])
                self.assertEqual(sorted(e["iron"]), sorted(ARCHS))

    def test_every_source_defines_its_kernels(self):
        designs = Path(registry.__file__).resolve().parent / "designs"
        for name, e in iron_entries().items():
            with self.subTest(op=name):
                text = (designs / e["iron_source"]).read_text()
                self.assertIn(f"ggml_op_{name.lower()}", text)


if __name__ == "__main__":
    unittest.main()
