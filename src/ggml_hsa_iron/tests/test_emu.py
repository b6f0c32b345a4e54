"""The emulation target's stand-ins: the recording `aie.iron` (signatures, validation against
the hardware limits) and the AIE-API header (rounding mode, aie2's f32 multiply)."""

import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

try:
    import numpy as np

    from ggml_hsa_iron.emu import install, iron
    from ggml_hsa_iron.emu.program import DesignError, check_walk

    HAVE_NUMPY = True
except ImportError:  # numpy is installed by scripts/check-iron.sh
    HAVE_NUMPY = False

CXX = shutil.which("g++") or shutil.which("clang++")
INCLUDE = Path(__file__).resolve().parents[1] / "emu" / "include"


def t(n, dtype="int32"):
    return np.ndarray[(n,), np.dtype[getattr(np, dtype)]]


@unittest.skipUnless(HAVE_NUMPY, "numpy is missing")
class StandInTest(unittest.TestCase):
    def setUp(self):
        install()
        iron.reset()
        from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
        from aie.iron.controlflow import range_
        from aie.iron.device import NPU2, Tile

        self.m = dict(
            Kernel=Kernel,
            ObjectFifo=ObjectFifo,
            Program=Program,
            Runtime=Runtime,
            Worker=Worker,
            range_=range_,
            NPU2=NPU2,
            Tile=Tile,
        )

    def passthrough(self, n=64, depth=2, acquire=1, release=1, tap=None, obj=None, extra=()):
        """shim -> core -> shim, the core copying objects of `obj` elements."""
        m = self.m
        obj = obj or n
        fin = m["ObjectFifo"](t(obj), depth=depth, name="fin")
        fout = m["ObjectFifo"](t(obj), name="fout")
        k = m["Kernel"]("copy", "x.o", [t(obj), t(obj)])

        def core(a, b, fn):
            for _ in m["range_"](n // obj):
                x = a.acquire(acquire)
                y = b.acquire(1)
                fn(x if acquire == 1 else x[0], y)
                a.release(release)
                b.release(1)

        w = m["Worker"](core, [fin.cons(), fout.prod(), k], tile=m["Tile"](0, 2), stack_size=1024)
        hin = fin.prod(tile=m["Tile"](0, 0))
        hout = fout.cons(tile=m["Tile"](0, 0))

        def seq(a, b, hi, ho):
            hi.fill(a, tap=tap)
            ho.drain(b, wait=True)

        rt = m["Runtime"](seq, [t(n), t(n), hin, hout])
        return m["Program"](m["NPU2"](), rt, workers=[w, *extra]).resolve_program()

    def test_records_a_program(self):
        p = self.passthrough()
        j = p.to_json("k", "aie2p")
        body = j["workers"][0]["body"]
        self.assertEqual(body[0]["op"], "loop")
        self.assertTrue(body[0]["forever"])
        self.assertEqual(body[0]["body"][0]["count"], 1)
        self.assertEqual([s["op"] for s in j["sequence"]], ["fill", "drain", "await"])
        self.assertEqual(j["fifos"][0]["producer"]["kind"], "shim")

    def test_unknown_keywords_are_refused(self):
        with self.assertRaises(TypeError):
            self.m["ObjectFifo"](t(4), depth=2, dims_to_stream=[(4, 1)])
        with self.assertRaises(TypeError):
            self.m["Worker"](lambda: None, [], placement=self.m["Tile"](0, 2))
        with self.assertRaises(TypeError):
            self.m["ObjectFifo"](t(4), 2)  # keyword-only after obj_type
        with self.assertRaises(NotImplementedError):
            self.m["ObjectFifo"](t(4), plio=True)

    def small(self, seq=None, core=None, extra_args=(), rt_args=None, prod_tile=None):
        """shim -> core -> shim with one kernel; `seq(a, b, hi, ho)` and `core(a, b, fn)`
        replace the defaults."""
        iron.reset()
        m = self.m
        fin = m["ObjectFifo"](t(16), name="fin")
        fout = m["ObjectFifo"](t(16), name="fout")
        k = m["Kernel"]("copy", "x.o", [t(16), t(16)])

        def core_default(a, b, fn):
            x, y = a.acquire(1), b.acquire(1)
            fn(x, y)
            a.release(1)
            b.release(1)

        def seq_default(a, b, hi, ho):
            hi.fill(a)
            ho.drain(b, wait=True)

        w = m["Worker"](core or core_default, [fin.cons(), fout.prod(), *extra_args, k])
        hin = fin.prod() if prod_tile is None else prod_tile(fin)
        hout = fout.cons(tile=m["Tile"](0, 0))
        args = [t(16), t(16), hin, hout] if rt_args is None else rt_args(hin, hout)
        rt = m["Runtime"](seq or seq_default, args)
        return m["Program"](m["NPU2"](), rt, workers=[w]).resolve_program()

    def test_upstream_errors(self):
        """What the real package raises, with its messages (iron_signatures.txt's sources)."""
        from aie.iron.runtime import TaskGroup

        def unfinished(a, b, hi, ho):
            tg = TaskGroup()
            hi.fill(a, group=tg)
            ho.drain(b, wait=True, group=tg)

        with self.assertRaisesRegex(iron.IronRuntimeError, r"Failed to close task groups: "):
            self.small(seq=unfinished)

        def mixed(a, b, hi, ho):
            tg = TaskGroup()
            hi.fill(a, group=tg)
            tg.finish()
            ho.drain(b, wait=True)

        with self.assertRaisesRegex(iron.IronRuntimeError, "Mixing explicit task groups"):
            self.small(seq=mixed)
        with self.assertRaisesRegex(RuntimeError, r"must be constructed within the function"):
            TaskGroup()
        with self.assertRaises(NotImplementedError):
            TaskGroup(id=3)

        # prod() without tile=, then prod(tile=): the one producer handle cannot be re-pinned.
        def repin(f):
            f.prod()
            return f.prod(tile=self.m["Tile"](0, 0))

        with self.assertRaisesRegex(ValueError, r"already pinned to shim tile None, cannot re-pin"):
            self.small(prod_tile=repin)
        # The same pin again is fine.
        self.small(
            prod_tile=lambda f: (
                f.prod(tile=self.m["Tile"](0, 0)),
                f.prod(tile=self.m["Tile"](0, 0)),
            )[1]
        )

        # A Kernel the Worker was not given.
        other = self.m["Kernel"]("other", "x.o", [t(16), t(16)])

        def stray(a, b, fn):
            x, y = a.acquire(1), b.acquire(1)
            other(x, y)
            a.release(1)
            b.release(1)

        with self.assertRaisesRegex(ValueError, r"Kernel must be resolved before it can be called"):
            self.small(core=stray)

        def wrong_count(a, b, fn):
            x, _y = a.acquire(1), b.acquire(1)
            fn(x)
            a.release(1)
            b.release(1)

        with self.assertRaisesRegex(ValueError, r"Kernel 'copy' expects 2 argument\(s\), but 1"):
            self.small(core=wrong_count)

        def over_release(a, b, fn):
            x, y = a.acquire(1), b.acquire(1)
            fn(x, y)
            a.release(3)
            b.release(1)

        with self.assertRaisesRegex(
            ValueError, r"Number of elements to release 3 must be smaller than depth 2"
        ):
            self.small(core=over_release)

        # Ints and scalar types in Runtime fn_args are not modelled (upstream folds an int into
        # an arith.constant value and takes a scalar type as a runtime argument).
        for bad in (4, np.int32):
            with self.assertRaises(NotImplementedError):
                self.small(rt_args=lambda hi, ho, bad=bad: [t(16), t(16), hi, ho, bad])

        # TensorAccessPattern takes all of offset, sizes and strides.
        tap_cls = iron.TensorAccessPattern
        with self.assertRaises(TypeError):
            tap_cls((16,))
        with self.assertRaises(TypeError):
            tap_cls((16,), 0, [16])
        # Kernel's second parameter is object_file_name; ExternalFunction is not modelled.
        self.assertEqual(self.m["Kernel"]("k", object_file_name="k.o").object_file_name, "k.o")
        with self.assertRaises(TypeError):
            self.m["Kernel"]("k", bin_name="k.o")
        with self.assertRaises(NotImplementedError):
            iron.ExternalFunction("f", source_file="f.cc")
        with self.assertRaises(TypeError):
            iron.ExternalFunction("f", bogus=1)
        # Tile: keyword-only tile_type / allocation_scheme (not modelled).
        with self.assertRaises(TypeError):
            self.m["Tile"](0, 2, "core")
        with self.assertRaises(NotImplementedError):
            self.m["Tile"](0, 2, tile_type="core")

    def test_join_output_walks_one_transfer(self):
        """A join's output to_stream walks one input's segment (upstream `_check_walk_size`),
        applied to every segment; over the whole object it is refused with upstream's message.
        The program JSON carries it over the whole object (segments as an outer dimension)."""
        m = self.m

        def build(walk_elems):
            iron.reset()
            seg = 8
            out = m["ObjectFifo"](
                t(2 * seg),
                name="out",
                to_stream=iron.TensorAccessPattern((walk_elems,), 0, [2, 4], [1, 2])
                if walk_elems == seg
                else iron.TensorAccessPattern((walk_elems,), 0, [2, seg], [seg, 1]),
            )
            subs = out.prod().join([0, seg], obj_types=[t(seg)] * 2, tile=m["Tile"](0, 1))
            fins = [m["ObjectFifo"](t(seg), name=f"in{i}") for i in range(2)]
            k = m["Kernel"]("copy", "x.o", [t(seg), t(seg)])

            def core(a, b, fn):
                x, y = a.acquire(1), b.acquire(1)
                fn(x, y)
                a.release(1)
                b.release(1)

            ws = [
                m["Worker"](core, [fins[i].cons(), subs[i].prod(), k], tile=m["Tile"](0, 2 + i))
                for i in range(2)
            ]
            hs = [f.prod(tile=m["Tile"](0, 0)) for f in fins]
            ho = out.cons(tile=m["Tile"](0, 0))

            def seq(a, b, c, h0, h1, ho):
                h0.fill(a)
                h1.fill(b)
                ho.drain(c, wait=True)

            rt = m["Runtime"](seq, [t(seg), t(seg), t(2 * seg), *hs, ho])
            return m["Program"](m["NPU2"](), rt, workers=ws).resolve_program()

        with self.assertRaisesRegex(
            ValueError, r"walks a tensor of shape \(16,\), but each transfer moves 8 elements"
        ):
            build(16)
        j = build(8).to_json("k", "aie2p")
        walk = next(f for f in j["fifos"] if f["name"] == "out")["to_stream"]
        self.assertEqual(walk, {"offset": 0, "sizes": [2, 2, 4], "strides": [8, 1, 2]})

    def test_default_group_lifetimes_and_bd_counts(self):
        """The default group's tasks hold their BDs until the sequence ends (awaited there),
        explicit groups' until finish(); every tile keeps BD_MARGIN BDs free."""
        from aie.iron.runtime import TaskGroup

        from ggml_hsa_iron.emu.program import BD_MARGIN, BDS

        limit = BDS["shim"] - BD_MARGIN

        def default(n):
            def seq(a, b, hi, ho):
                for _ in range(n - 1):
                    hi.fill(a)
                ho.drain(b, wait=True)

            return seq

        j = self.small(seq=default(2)).to_json("k", "aie2p")
        self.assertEqual([s["op"] for s in j["sequence"]], ["fill", "drain", "await"])

        # Awaiting at issue would have let these pass: the default group holds them all.
        def awaited_each(a, b, hi, ho):
            for _ in range(limit):
                hi.fill(a, wait=True)
            ho.drain(b, wait=True)

        with self.assertRaisesRegex(DesignError, r"buffer descriptors active at once"):
            self.small(seq=awaited_each)
        with self.assertRaisesRegex(DesignError, r"Too many simultaneously active buffer"):
            self.small(seq=default(BDS["shim"] + 1))
        p = self.small(seq=default(limit))
        self.assertEqual(p.shim_bd_peak[(0, 0)], limit)

        def grouped(a, b, hi, ho):
            for _ in range(3):
                tg = TaskGroup()
                for _ in range(limit - 1):
                    hi.fill(a, group=tg)
                ho.drain(b, wait=True, group=tg)
                tg.finish()

        p = self.small(seq=grouped)
        self.assertEqual(p.shim_bd_peak[(0, 0)], limit)

    def test_acquire_beyond_depth(self):
        with self.assertRaisesRegex(ValueError, "must be smaller than depth 1"):
            self.passthrough(depth=1, acquire=2, release=2)

    def test_unbalanced_acquire_release(self):
        with self.assertRaisesRegex(DesignError, "unbalanced acquire/release"):
            self.passthrough(acquire=2, release=1)

    def test_core_memory_budget(self):
        # Two fifos of 2 x 16 KiB objects plus the stack: 64 KiB + 1 KiB.
        with self.assertRaisesRegex(DesignError, r"65536 bytes of data memory needed|data memory"):
            self.passthrough(n=4096 * 4, obj=4096)

    def test_shim_dma_limits(self):
        with self.assertRaisesRegex(DesignError, "repeat count"):
            check_walk("t", "shim", 0, [65, 1, 2, 16], [64, 0, 16, 1], 4)
        with self.assertRaisesRegex(DesignError, "wraps after 1024"):
            check_walk("t", "shim", 0, [1, 1, 2, 1024], [0, 0, 2048, 1], 4)
        with self.assertRaisesRegex(DesignError, "stride"):
            check_walk("t", "shim", 0, [1, 1, 2, 16], [0, 0, (1 << 20) + 16, 1], 4)
        with self.assertRaisesRegex(DesignError, "32-bit"):
            check_walk("t", "shim", 1, [1, 1, 1, 3], [0, 0, 0, 1], 2)
        with self.assertRaisesRegex(DesignError, "dimensions"):
            check_walk("t", "core", 0, [2, 2, 2, 8], [64, 32, 16, 1], 4)
        # A linear transfer has no wrap limit.
        check_walk("t", "shim", 0, [1, 1, 1, 100000], [0, 0, 0, 1], 4)
        # Through a design: a fill tap repeating 65 times.
        tap = iron.TensorAccessPattern((64,), 0, [65, 1, 1, 64], [0, 0, 0, 1])
        with self.assertRaisesRegex(DesignError, "repeat count"):
            self.passthrough(n=64, tap=tap)

    def test_stride_0_only_on_the_shim_repeat(self):
        # Refused: positions[i] repeated 4 times by an address dimension (ROPE's old walk),
        # named by fifo, task, runtime tensor and dimension.
        tap = iron.TensorAccessPattern((64,), 0, [1, 16, 4, 1], [0, 1, 0, 1])
        with self.assertRaisesRegex(
            DesignError,
            r"fill of fin \(task 0, runtime tensor 0\): dimension 2 \(size 4\) has stride 0",
        ):
            self.passthrough(n=64, tap=tap)
        # Refused: a three-dimensional tap's outermost dimension is an address dimension (d2).
        with self.assertRaisesRegex(DesignError, r"dimension 0 \(size 4\) has stride 0"):
            check_walk("t", "shim", 0, [4, 1, 16], [0, 0, 1], 4)
        # A stride-0 d0 (SOFT_MAX_SINKS' old sink walk).
        with self.assertRaisesRegex(DesignError, r"dimension 3 \(size 8\) has stride 0"):
            check_walk("t", "shim", 0, [1, 1, 1, 8], [0, 0, 0, 0], 4)
        # Memory and compute tile BDs repeat nothing.
        for kind in ("mem", "core"):
            with self.assertRaisesRegex(DesignError, f"a {kind} tile BD cannot repeat data"):
                check_walk("t", kind, 0, [2, 16], [0, 1], 4)
            check_walk("t", kind, 0, [1, 2, 16], [0, 16, 1], 4)  # size 1: stride unused
        check_walk("t", "shim", 0, [4, 1, 4, 16], [0, 0, 16, 1], 4)

    def test_stride_0_on_the_shim_repeat_is_accepted(self):
        # The same 64 elements as the repeat (the outermost of four dimensions).
        tap = iron.TensorAccessPattern((64,), 0, [4, 1, 1, 16], [0, 0, 0, 1])
        p = self.passthrough(n=64, tap=tap)
        fill = p.to_json("k", "aie2p")["sequence"][0]
        self.assertEqual(fill["tap"]["sizes"], [4, 1, 1, 16])

    def test_dma_wraps_and_strides_per_tile_kind(self):
        # Compute tiles: 8-bit wraps, 13-bit strides, 3 dimensions.
        with self.assertRaisesRegex(DesignError, r"dimension 1 \(d0\) wraps after 256 words"):
            check_walk("t", "core", 0, [2, 256], [1, 2], 4)
        check_walk("t", "core", 0, [4, 128], [1, 4], 4)  # a transposing walk within the limits
        with self.assertRaisesRegex(DesignError, r"stride of 8193 words, at most 8192"):
            check_walk("t", "core", 0, [2, 16], [8193, 1], 4)
        # Memory tiles: d2 has a wrap too (10 bits), 17-bit strides.
        with self.assertRaisesRegex(DesignError, r"dimension 0 \(d2\) wraps after 1024"):
            check_walk("t", "mem", 0, [1024, 2, 2], [4, 2, 1], 4)
        check_walk("t", "mem", 0, [1023, 2, 2], [4, 2, 1], 4)
        with self.assertRaisesRegex(DesignError, r"at most 131072"):
            check_walk("t", "mem", 0, [2, 16], [(1 << 17) + 16, 1], 4)
        check_walk("t", "shim", 0, [1, 1, 2, 16], [0, 0, (1 << 17) + 16, 1], 4)
        # 2-byte elements: the innermost wrap counts words (2048 bf16 = 1024 words).
        with self.assertRaisesRegex(DesignError, r"d0\) wraps after 1024 words"):
            check_walk("t", "shim", 0, [1, 1, 2, 2048], [0, 0, 4096, 1], 2)
        check_walk("t", "shim", 0, [1, 1, 2, 2046], [0, 0, 4096, 1], 2)

    def test_over_long_run_is_rejected_when_the_design_is_recorded(self):
        # 2048 contiguous words as two rows of 1024: one DMA dimension longer than its wrap.
        # Named: the fifo, the runtime tensor and the dimension.
        tap = iron.TensorAccessPattern((2048,), 0, [1, 1, 2, 1024], [0, 0, 1024, 1])
        with self.assertRaisesRegex(
            DesignError,
            r"fill of fin \(task 0, runtime tensor 0\): dimension 3 \(d0\) wraps after 1024",
        ):
            self.passthrough(n=2048, obj=256, tap=tap)
        # The GEMV's K-long x chunk (K = 2048 here): one row of K with the chunk stride K on a
        # size-1 dimension is not the linear form, so d0 = K words.
        tap = iron.TensorAccessPattern((2048,), 0, [1, 1, 1, 2048], [0, 0, 2048, 1])
        with self.assertRaisesRegex(DesignError, r"dimension 3 \(d0\) wraps after 2048 words"):
            iron.reset()
            self.setUp()
            self.passthrough(n=2048, obj=256, tap=tap)
        # The same elements as one linear run (the BD's length, no wrap), as a linear run
        # repeated (a repeat of a linear BD is still linear), or as 4 x 512: accepted.
        for sizes, strides in (
            ([1, 1, 1, 2048], [0, 0, 0, 1]),
            ([2, 1, 1, 1024], [1024, 0, 0, 1]),
            ([1, 1, 4, 512], [0, 0, 512, 1]),
        ):
            iron.reset()
            self.setUp()
            tap = iron.TensorAccessPattern((2048,), 0, sizes, strides)
            p = self.passthrough(n=2048, obj=256, tap=tap)
            self.assertEqual(p.to_json("k", "aie2p")["sequence"][0]["tap"]["sizes"], sizes)

    def test_object_longer_than_a_bd_is_rejected(self):
        # 16384 words in one object: a compute tile's BD length field has 14 bits.
        with self.assertRaisesRegex(DesignError, r"fin: objects of 16384 words .* at most 16383"):
            self.passthrough(n=16384, obj=16384)

    def test_dma_channels(self):
        m = self.m
        fifos = [m["ObjectFifo"](t(16), name=f"f{i}") for i in range(3)]
        k = m["Kernel"]("k3", "x.o", [t(16)] * 3)

        def core(a, b, c, fn):
            x, y, z = a.acquire(1), b.acquire(1), c.acquire(1)
            fn(x, y, z)
            a.release(1)
            b.release(1)
            c.release(1)

        w = m["Worker"](core, [f.cons() for f in fifos] + [k], tile=m["Tile"](0, 2))
        hs = [f.prod(tile=m["Tile"](0, 0)) for f in fifos]

        def seq(a, *h):
            for x in h:
                x.fill(a)

        rt = m["Runtime"](seq, [t(16), *hs])
        with self.assertRaisesRegex(DesignError, "DMA channels"):
            m["Program"](m["NPU2"](), rt, workers=[w]).resolve_program()


@unittest.skipUnless(CXX, "no host C++ compiler")
class AieApiTest(unittest.TestCase):
    def run_cc(self, body: str, arch: int | None = None) -> str:
        src = (
            "#include <aie_api/aie.hpp>\n#include <cstdio>\nint main() {\n"
            + body
            + "\nreturn 0;}\n"
        )
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "t.cc").write_text(src)
            cmd = [CXX, "-std=c++20", f"-I{INCLUDE}", str(Path(d) / "t.cc"), "-o", f"{d}/t"]
            if arch is not None:
                cmd.append(f"-D__AIE_ARCH__={arch}")
            subprocess.run(cmd, check=True)
            return subprocess.run([f"{d}/t"], check=True, capture_output=True, text=True).stdout

    def test_rounding_mode_default_floor_and_conv_even(self):
        body = """
        aie::accum<accfloat, 4> acc;
        aie::vector<float, 4> v;
        float x[4] = {1.0f + 3.0f / 256, -(1.0f + 3.0f / 256), 1.0f + 1.0f / 256, 1.0f + 3.0f / 512};
        for (int i = 0; i < 4; ++i) v.set(x[i], i);
        acc.from_vector(v);
        auto a = acc.to_vector<bfloat16>();
        aie::set_rounding(aie::rounding_mode::conv_even);
        auto b = acc.to_vector<bfloat16>();
        for (int i = 0; i < 4; ++i) printf("%04x %04x\\n", a[i].bits, b[i].bits);
        printf("%d\\n", (int)aie::get_rounding());
        """
        out = self.run_cc(body).split()
        # 1 + 3/256: floor keeps 0x3f81, nearest even rounds the tie up to 0x3f82.
        self.assertEqual(out[0:2], ["3f81", "3f82"])
        # Negative: floor goes toward -inf (magnitude up).
        self.assertEqual(out[2:4], ["bf82", "bf82"])
        # 1 + 1/256 (a tie, even below): both 0x3f80; 1 + 3/512 (above the tie): floor 3f80.
        self.assertEqual(out[4:8], ["3f80", "3f80", "3f80", "3f81"])
        self.assertEqual(out[8], "6")

    def test_aie2_f32_multiply_rounds_inputs_to_bf16(self):
        body = """
        aie::vector<float, 1> a, b;
        a.set(1.0f + 1.0f / 1024, 0);
        b.set(3.0f, 0);
        printf("%.9g\\n", aie::mul(a, b).to_vector<float>()[0]);
        """
        self.assertEqual(self.run_cc(body, 21).strip(), "3.00292969")
        self.assertEqual(self.run_cc(body, 20).strip(), "3")


if __name__ == "__main__":
    unittest.main()
