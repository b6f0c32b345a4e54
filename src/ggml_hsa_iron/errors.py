"""Errors the compiler reports, with the exit status the protocol gives them."""


class KernelError(Exception):
    """Base class: a one-line message and a protocol exit status."""

    exit_status = 1


class RequestError(KernelError):
    """The request is malformed (a failure, exit status 1)."""

    exit_status = 1


class UnsupportedError(KernelError):
    """The request is well formed but no design implements it (exit status 2)."""

    exit_status = 2


class EnvironmentMissing(KernelError):
    """The IRON environment (mlir-aie, numpy, Peano) is not active (exit status 1)."""

    exit_status = 1


class BuildError(KernelError):
    """A tool of the build (IRON, Peano, aiecc) failed (exit status 1)."""

    exit_status = 1
