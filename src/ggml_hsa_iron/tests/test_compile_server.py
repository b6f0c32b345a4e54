"""The emulation's compile server: the same files and exit statuses as a compile of its own; and
the emulation's design cache: a design recorded once, a refusal never cached."""

import sys
from pathlib import Path

# Runnable as `python3 -m unittest discover -s src/ggml_hsa_iron/tests` too:
# the package's parent directory (src/) goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from ggml_hsa_iron.tests.util import request_dict, tensor

SRC = Path(__file__).resolve().parent.parent.parent


class CompileServerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.env = dict(os.environ, PYTHONPATH=str(SRC))
        self.env.setdefault("GGML_HSA_EMU_CACHE_DIR", str(self.dir / "cores"))
        self.env.pop("GGML_HSA_EMU_SERVER", None)
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.terminate()
            s.wait()
        self.tmp.cleanup()

    def start(self, sock_dir: Path):
        server = subprocess.Popen(
            [sys.executable, "-m", "ggml_hsa_iron.compile_server", "--socket", str(sock_dir / "s")],
            env=self.env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.servers.append(server)
        deadline = time.monotonic() + 60
        while not (sock_dir / "s").exists() and server.poll() is None:
            self.assertLess(time.monotonic(), deadline, "the server did not start")
            time.sleep(0.02)
        return server

    def compile(self, req: dict, out: Path, socket: Path | None, fresh_design=True):
        path = self.dir / "request.json"
        path.write_text(json.dumps(req))
        env = dict(self.env)
        if fresh_design:
            # Each compile records its design: the emulation cache would hand a second compile
            # the first one's image.
            shutil.rmtree(Path(env["GGML_HSA_EMU_CACHE_DIR"]) / "designs", ignore_errors=True)
        if socket is not None:
            env["GGML_HSA_EMU_SERVER"] = str(socket)
        return subprocess.run(
            [sys.executable, "-m", "ggml_hsa_iron", "--target", "emu", "compile"]
            + ["--request", str(path), "--output-dir", str(out)],
            env=env,
            capture_output=True,
            text=True,
            cwd=self.dir,
        )

    @staticmethod
    def files(out: Path) -> dict:
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    def test_served_compiles_match_compiles_of_their_own(self):
        sock_dir = self.dir / "server"
        sock_dir.mkdir(mode=0o700)
        self.start(sock_dir)
        t = tensor("f32", [4096])
        req = request_dict("ADD", [t, t], t)
        alone = self.compile(req, self.dir / "alone", None)
        self.assertEqual(alone.returncode, 0, alone.stderr)
        served = self.compile(req, self.dir / "served", sock_dir / "s")
        self.assertEqual(served.returncode, 0, served.stderr)
        self.assertEqual(self.files(self.dir / "alone"), self.files(self.dir / "served"))
        # A relative output directory is the client's, not the server's.
        rel = self.compile(req, Path("relative"), sock_dir / "s")
        self.assertEqual(rel.returncode, 0, rel.stderr)
        self.assertEqual(self.files(self.dir / "alone"), self.files(self.dir / "relative"))
        # Unsupported (2) and its one line on the client's stderr.
        h = tensor("f16", [64])
        r = self.compile(request_dict("ADD", [h, h], h), self.dir / "f16", sock_dir / "s")
        self.assertEqual(r.returncode, 2)
        self.assertIn("ADD does not take f16", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_a_design_is_recorded_once_and_a_refusal_never(self):
        self.env["GGML_HSA_EMU_CACHE_DIR"] = str(self.dir / "cache")
        designs = self.dir / "cache" / "designs"
        t = tensor("f32", [512])
        req = request_dict("ADD", [t, t], t)
        first = self.compile(req, self.dir / "first", None)
        self.assertEqual(first.returncode, 0, first.stderr)
        cached = list(designs.iterdir())
        self.assertEqual(len(cached), 1)
        second = self.compile(req, self.dir / "second", None, fresh_design=False)
        self.assertEqual(second.returncode, 0, second.stderr)
        self.assertEqual(self.files(self.dir / "first"), self.files(self.dir / "second"))
        self.assertEqual(list(designs.iterdir()), cached)
        # Another shape is another design; a refused request leaves nothing.
        u = tensor("f32", [1024])
        other = self.compile(request_dict("ADD", [u, u], u), self.dir / "o", None, False)
        self.assertEqual(other.returncode, 0, other.stderr)
        self.assertEqual(len(list(designs.iterdir())), 2)
        h = tensor("f16", [64])
        refused = self.compile(request_dict("ADD", [h, h], h), self.dir / "f16", None, False)
        self.assertEqual(refused.returncode, 2)
        self.assertEqual(len(list(designs.iterdir())), 2)

    def test_a_cached_design_others_could_write_is_recorded_again(self):
        self.env["GGML_HSA_EMU_CACHE_DIR"] = str(self.dir / "cache")
        t = tensor("f32", [512])
        req = request_dict("ADD", [t, t], t)
        self.assertEqual(self.compile(req, self.dir / "a", None).returncode, 0)
        (cached,) = (self.dir / "cache" / "designs").iterdir()
        decoy = self.dir / "decoy.pdi"
        decoy.write_bytes(b"HSASIMK1 not an image")
        for spoil in ("writable", "symlink"):
            with self.subTest(spoil=spoil):
                if spoil == "writable":
                    cached.write_bytes(decoy.read_bytes())
                    cached.chmod(0o666)
                else:
                    cached.unlink()
                    cached.symlink_to(decoy)
                r = self.compile(req, self.dir / spoil, None, fresh_design=False)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(self.files(self.dir / "a"), self.files(self.dir / spoil))
                self.assertFalse(cached.is_symlink())
                self.assertEqual(cached.stat().st_mode & 0o777, 0o600)

    def test_without_a_listening_server_the_compile_runs_alone(self):
        t = tensor("f32", [256])
        r = self.compile(request_dict("ADD", [t, t], t), self.dir / "o", self.dir / "nothing")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(any((self.dir / "o").iterdir()))

    def test_a_socket_in_a_directory_others_may_enter_is_refused(self):
        sock_dir = self.dir / "open"
        sock_dir.mkdir()
        os.chmod(sock_dir, 0o755)
        server = self.start(sock_dir)
        self.assertEqual(server.wait(timeout=60), 1)
        self.assertIn("0700 expected", server.stderr.read())
        self.assertFalse((sock_dir / "s").exists())


if __name__ == "__main__":
    unittest.main()
