"""A fork server for the emulation target's compiles, for the tests' emulated sweeps.

An emulated test-backend-ops run starts one `python3 -m ggml_hsa_iron --target emu compile`
per kernel, thousands per sweep, and most of each such process is the interpreter importing
numpy and the package before it records a design. The server imports them once; each compile
is then a fork of it:

    python3 -m ggml_hsa_iron.compile_server --socket DIR/sock     (DIR: private, 0700)
    GGML_HSA_EMU_SERVER=DIR/sock python3 -m ggml_hsa_iron --target emu compile ...

The second command (what the backend runs, unchanged) finds the variable, connects, and hands
over its arguments, working directory, environment and its stdout and stderr; a forked child
of the server runs the compile exactly as the command would (same `main`, the client's
directory, environment and output streams) and sends back the exit status, which the client
exits with. Without the variable, or when nothing listens on the socket, the command compiles
in its own process as always. Only the emulation target is served: a real compile (`--target
npu`) spends its time in mlir-aie and Peano, not in imports.

The socket's directory must belong to the user and be closed to others; server and client each
accept only a peer process of their own user (SO_PEERCRED). The server exits when its parent
process goes (the test binary that started it) and after `--idle` seconds without a request.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import stat
import struct
import sys
from pathlib import Path

# The largest request: arguments, a working directory and an environment.
MAX_REQUEST = 1 << 20


def forward(path: str, argv: list[str]) -> int | None:
    """Runs `argv` (the command line after `-m ggml_hsa_iron`) in the server at `path`: its exit
    status, or None when it is not an emulation compile or no server listens (compile here)."""
    if not _is_emu_compile(argv):
        return None
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(path)
    except OSError:
        return None
    with s:
        # Only a server of this user gets the streams and the environment.
        if _peer_uid(s) != os.getuid():
            print(
                f"ggml_hsa_iron: {path}: the server is another user's; compiling here",
                file=sys.stderr,
            )
            return None
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
        socket.send_fds(s, [json.dumps(request).encode()], [1, 2])
        reply = s.recv(64)
    try:
        return int(reply)
    except ValueError:
        print(f"ggml_hsa_iron: the compile server at {path} gave no status", file=sys.stderr)
        return 1


def _is_emu_compile(argv: list[str]) -> bool:
    emu = any(
        a == "--target=emu" or (a == "--target" and i + 1 < len(argv) and argv[i + 1] == "emu")
        for i, a in enumerate(argv)
    )
    return emu and "compile" in argv


def _private_dir(d: Path) -> str | None:
    """Why `d` may not hold the socket, or None."""
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.getuid():
        return "owned by another user"
    if st.st_mode & 0o077:
        return f"mode {stat.S_IMODE(st.st_mode):o} (0700 expected)"
    return None


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _child(conn: socket.socket, message: bytes, fds: list[int]) -> None:
    """In the forked child: the compile, as `python3 -m ggml_hsa_iron ARGV` would run it."""
    status = 1
    try:
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        request = json.loads(message)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        from ggml_hsa_iron.__main__ import main

        status = main(request["argv"])
    except SystemExit as e:  # argparse's usage errors
        status = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 (reported to the client, whatever it is)
        print(f"ggml_hsa_iron: the compile failed in the server: {e!r}", file=sys.stderr)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send(str(status).encode())
        finally:
            os._exit(0)


def serve(path: Path, idle: float) -> int:
    why = _private_dir(path.parent)
    if why:
        print(f"ggml_hsa_iron.compile_server: {path.parent}: {why}", file=sys.stderr)
        return 1
    # What every compile imports, once (one BLAS thread: nothing may run beside a fork).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import ggml_hsa_iron.__main__  # noqa: F401
    import ggml_hsa_iron.emu.compile  # noqa: F401
    import ggml_hsa_iron.registry  # noqa: F401

    parent = os.getppid()
    if path.exists() or path.is_symlink():
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(str(path))
    server.listen(64)
    server.settimeout(1.0)
    quiet = 0.0
    while os.getppid() == parent and quiet < idle:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            quiet += 1.0
            _reap()
            continue
        quiet = 0.0
        with conn:
            if _peer_uid(conn) != os.getuid():
                continue
            conn.settimeout(5.0)
            try:
                message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 2)
            except OSError:
                continue
            conn.settimeout(None)
            if len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                continue
            if os.fork() == 0:
                server.close()
                _child(conn, message, fds)
            for fd in fds:
                os.close(fd)
        _reap()
    server.close()
    path.unlink(missing_ok=True)
    return 0


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def main() -> int:
    p = argparse.ArgumentParser(prog="python3 -m ggml_hsa_iron.compile_server")
    p.add_argument("--socket", required=True, type=Path, help="in a private (0700) directory")
    p.add_argument("--idle", type=float, default=600.0, help="seconds without a request to exit")
    args = p.parse_args()
    return serve(args.socket, args.idle)


if __name__ == "__main__":
    sys.exit(main())
