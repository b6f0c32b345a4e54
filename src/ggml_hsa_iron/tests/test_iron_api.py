"""Static check: the designs use only IRON names that exist in mlir-aie v1.4.4.

Every Python file of the package that imports `aie` (the designs and the
compiler) is parsed with `ast`: each `aie.*` import must be listed in
iron_api_v1.4.4.txt, calls of imported IRON names and of IRON methods may only
use the keyword arguments listed there, and every method called on an object
must be an IRON method from the list or one of the package's own helpers.
"""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ast
import re
import unittest

PACKAGE = Path(__file__).resolve().parent.parent
API_FILE = PACKAGE / "iron_api_v1.4.4.txt"

# Methods called on objects that are not IRON's: the package's own plan and
# spec objects, Python containers and strings, numpy.
OWN_METHODS = {
    "start",  # EltwisePlan.start (also Runtime.start, listed)
    "tasks",  # GemmPlan.tasks / GemvPlan.tasks via the spec
    "w_units",  # GemvPlan.w_units
    "norm_tap",  # GemvPlan.norm_tap / norm_taps (RMS_NORM_MUL_MAT)
    "norm_taps",
    "rope_taps",  # GemvPlan.rope_taps (RMS_NORM_MUL_MAT_ROPE)
    "bias_taps",  # GemvPlan.bias_taps (RMS_NORM_MUL_MAT_BIAS)
    "first_row",  # RowSpec.first_row
    "rounds",  # RowSpec.rounds
    "share",  # ReduceSpec.share: a column's share of the operands
    "a_dims",
    "b_dims",
    "c_dims",
    "c_segment_dims",  # GemmPlan: the join output's walk of one transfer
    "a_feed_column",  # GemmPlan: the column carrying an A feed
    "array_tile",  # GemvPlan.array_tile: a shared_x plan column's array column and cores
    "fill_tap",  # EltwiseSpec.fill_tap (GLU's strided inputs), CopySpec.fill_tap
    "drain_tap",  # CopySpec.drain_tap (a strided output)
    "drains",  # CopySpec, CopyRowsSpec: a column's drains (into CPY_ROWS' rows)
    "idx_tap",  # SetRowsSpec: a slab's indices, source rows and destination rows
    "src_tap",
    "dst_tap",
    "pos_tap",  # RopeSpec.pos_tap / ff_tap
    "ff_tap",
    "column_blocks",  # FlashAttnSpec: a column's blocks of query rows and the taps of one block
    "q_tap",
    "mask_tap",
    "sink_taps",
    "k_tap",
    "v_tap",
    "out_tap",
    "column_heads",  # FaPhase (FLASH_ATTN_FFN_<glu>): a column's KV heads, a's drain
    "a_tap",
    "w_taps",  # QkvGroup (DECODE_LAYER_<glu>): a unit's taps, a core's rows, a column's group
    "x_tap",
    "y_tap",
    "row0",
    "prologue",
    "group_of",
    "post_norm_squares",  # DecodeSpec (DECODE_LAYER[_HEAD_NORM]_POST_NORM_<glu>): the norm-add
    "post_norm_rounds",  # phases' taps
    "index",
    "append",
    "extend",
    "items",
    "values",
    "copy",
    "write_text",
    "is_file",
    "stat",
    "exists",
    "unlink",
    "get",
    "lower",
    "upper",
    "join",  # str.join is never called in designs; ObjectFifoHandle.join is listed
    "ndarray",
    "dtype",
    "int32",
    "import_module",
}


def load_api(path=API_FILE):
    names, methods = {}, {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"(\.?[A-Za-z_][\w.]*)(?:\((.*)\))?", line)
        if not m:
            raise ValueError(f"bad line in {path.name}: {raw!r}")
        name, args = m.group(1), m.group(2)
        kwargs = {a.strip() for a in args.split(",") if a.strip()} if args else set()
        (methods if name.startswith(".") else names)[name.lstrip(".")] = kwargs
    return names, methods


def aie_files():
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "tests" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        if any(
            (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "aie")
            or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "aie" for a in n.names))
            for n in ast.walk(tree)
        ):
            out.append((path, tree))
    # The designs import IRON indirectly too (designs/_common.py and friends).
    design_dir = PACKAGE / "designs"
    listed = {p for p, _ in out}
    for path in sorted(design_dir.glob("*.py")):
        if path not in listed:
            out.append((path, ast.parse(path.read_text(), filename=str(path))))
    return out


def problems(tree, names, methods, label="<file>"):
    errors = []
    imported = {}
    # Modules whose functions are called as attributes: the package's own and numpy.
    local_modules = {"np", "numpy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            local_modules.update(a.asname or a.name for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "aie":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full not in names:
                    errors.append(f"{label}:{node.lineno}: {full} is not in the v1.4.4 API list")
                imported[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "aie" and alias.name not in names:
                    errors.append(f"{label}:{node.lineno}: module {alias.name} is not listed")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kws = {k.arg for k in node.keywords if k.arg}
        if isinstance(node.func, ast.Name) and node.func.id in imported:
            full = imported[node.func.id]
            bad = kws - names.get(full, set())
            if bad:
                errors.append(f"{label}:{node.lineno}: {full} has no keyword {sorted(bad)}")
        elif isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if isinstance(node.func.value, ast.Name) and node.func.value.id in local_modules:
                continue
            if attr in methods:
                bad = kws - methods[attr]
                if bad and attr not in OWN_METHODS:
                    errors.append(f"{label}:{node.lineno}: .{attr}() has no keyword {sorted(bad)}")
            elif attr not in OWN_METHODS:
                errors.append(f"{label}:{node.lineno}: .{attr}() is not an IRON method of v1.4.4")
    return errors


class IronApiTest(unittest.TestCase):
    def test_the_list_parses_and_has_the_core_names(self):
        names, methods = load_api()
        for n in (
            "aie.iron.Program",
            "aie.iron.Worker",
            "aie.iron.runtime.TaskGroup",
            "aie.iron.device.NPU1",
            "aie.iron.device.NPU2",
            "aie.iron.controlflow.range_",
            "aie.helpers.taplib.TensorAccessPattern",
        ):
            self.assertIn(n, names)
        self.assertIn("tile", methods["split"])
        self.assertNotIn("placement", methods["split"])

    def test_designs_use_only_listed_names(self):
        names, methods = load_api()
        files = aie_files()
        self.assertTrue(any(p.name == "_eltwise.py" for p, _ in files))
        self.assertTrue(any(p.name == "mul_mat.py" for p, _ in files))
        errors = []
        for path, tree in files:
            if path.parent.name != "designs":
                continue
            errors += problems(tree, names, methods, str(path.relative_to(PACKAGE)))
        self.assertEqual(errors, [])

    def test_the_checker_catches_unknown_names(self):
        names, methods = load_api()
        bad = ast.parse(
            "from aie.iron import Program, Barrier\n"
            "from aie.iron.device import Tile\n"
            "import aie.iron.experimental\n"
            "w = Worker(f, fn_args=[], placement=Tile(0, 2))\n"
            "of.cons().split([0], tile=None, unknown_kw=1)\n"
            "rt.drain_all(x)\n"
        )
        text = "\n".join(problems(bad, names, methods))
        self.assertIn("aie.iron.Barrier", text)
        self.assertIn("aie.iron.experimental", text)
        self.assertIn("unknown_kw", text)
        self.assertIn("drain_all", text)
        worker = ast.parse("from aie.iron import Worker\nWorker(f, fn_args=[], placement=1)\n")
        self.assertIn("placement", "\n".join(problems(worker, names, methods)))
        placer = ast.parse("from aie.iron.placers import SequentialPlacer\n")
        self.assertIn("aie.iron.placers", "\n".join(problems(placer, names, methods)))


if __name__ == "__main__":
    unittest.main()


SIGNATURES_FILE = PACKAGE / "iron_signatures.txt"


def load_signatures(path=SIGNATURES_FILE):
    """[(source, name, [(param, kind, default or None)])] from iron_signatures.txt; kind is
    "pos" or "kw" (keyword-only), default the text after `=` (None: required)."""
    out, source = [], None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("source:"):
            source = line[len("source:") :].strip()
            continue
        name, _, rest = line.partition("(")
        params, kind = [], "pos"
        for p in filter(None, (x.strip() for x in rest.rstrip(")").split(","))):
            if p == "*":
                kind = "kw"
                continue
            pname, eq, default = p.partition("=")
            params.append((pname, kind, default if eq else None))
        out.append((source, name, params))
    return out


def _standin_params(obj):
    """The stand-in's parameters of `obj` in the pinned list's form."""
    import inspect

    sig = inspect.signature(obj)
    out = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            out.append((("*" if p.kind == p.VAR_POSITIONAL else "**") + p.name, "var", None))
            continue
        kind = "kw" if p.kind == p.KEYWORD_ONLY else "pos"
        if p.default is p.empty:
            default = None
        elif p.default == () or p.default == []:
            default = "[]"
        elif hasattr(p.default, "kind") and type(p.default).__name__ == "_AnyTile":
            default = f"Any{p.default.kind}Tile"
        else:
            default = repr(p.default)
        out.append((p.name, kind, default))
    return out


class SignatureTest(unittest.TestCase):
    def test_stand_in_matches_the_pinned_signatures(self):
        try:
            from ggml_hsa_iron.emu import iron
        except ImportError as e:  # numpy
            self.skipTest(str(e))
        sigs = load_signatures()
        self.assertGreaterEqual(len(sigs), 18)
        for source, name, params in sigs:
            with self.subTest(name=name):
                self.assertTrue(source, f"{name}: no source line before it")
                cls, _, meth = name.partition(".")
                obj = getattr(iron, cls)
                obj = getattr(obj, meth) if meth else obj.__init__
                self.assertEqual(_standin_params(obj), params, f"{name} (pinned from {source})")

    def test_the_pinned_list_catches_a_drift(self):
        from ggml_hsa_iron.emu import iron

        params = _standin_params(iron.Kernel.__init__)
        self.assertEqual(params[1], ("object_file_name", "pos", None))
        self.assertNotEqual(
            _standin_params(lambda self, name, bin_name, arg_types=(): None), params
        )

    def test_the_stand_in_has_no_extra_tap_methods(self):
        """TensorAccessPattern has upstream's attributes only: the package's helpers (count,
        indices, JSON) are module functions of the stand-in, so a design cannot use them."""
        from ggml_hsa_iron.emu import iron

        for extra in ("count", "indices", "to_json"):
            self.assertFalse(hasattr(iron.TensorAccessPattern, extra), extra)
