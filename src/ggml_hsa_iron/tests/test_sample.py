"""The rotation the long checks are sampled by (sample.py)."""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import os
import unittest
from unittest import mock

from ggml_hsa_iron.tests import sample


class SampleTest(unittest.TestCase):
    def test_the_turns_cover_every_case_once(self):
        cases = [("case", i) for i in range(200)]
        seen = []
        for t in range(4):
            with mock.patch.dict(os.environ, {"GGML_HSA_TEST_SAMPLE": f"{t}/4"}):
                mine = sample.pick(cases)
            self.assertTrue(0 < len(mine) < len(cases))
            seen += mine
        self.assertEqual(sorted(seen), sorted(cases))

    def test_a_turn_keeps_at_least_one_case_and_all_keeps_all(self):
        with mock.patch.dict(os.environ, {"GGML_HSA_TEST_SAMPLE": "3/4"}):
            for n in (1, 2, 3):
                self.assertGreaterEqual(len(sample.pick(range(n))), 1)
        with mock.patch.dict(os.environ, {"GGML_HSA_TEST_SAMPLE": "all"}):
            self.assertEqual(sample.pick(range(9)), list(range(9)))

    def test_a_malformed_setting_is_an_error(self):
        for bad in ("4/4", "x", "1/0", "-1/4"):
            with mock.patch.dict(os.environ, {"GGML_HSA_TEST_SAMPLE": bad}):
                with self.assertRaises(ValueError):
                    sample.pick(range(3))


if __name__ == "__main__":
    unittest.main()
