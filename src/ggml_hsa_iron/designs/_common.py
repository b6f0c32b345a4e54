"""Helpers shared by the designs: numpy types and devices."""

import numpy as np
from aie.iron.device import NPU1, NPU2
from ml_dtypes import bfloat16

NUMPY_TYPES = {
    "f32": np.float32,
    "bf16": bfloat16,
    "f16": np.float16,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,  # COUNT_EQUAL's count (moved as two 32-bit words)
}

DEVICES = {"NPU1": NPU1, "NPU2": NPU2}


def vector_type(n: int, dtype: str):
    """The IRON tensor type of n elements of `dtype` (a protocol type name)."""
    return np.ndarray[(n,), np.dtype[NUMPY_TYPES[dtype]]]


def device(arch, columns_needed: int):
    dev = DEVICES[arch.device]()
    if dev.cols < columns_needed:
        raise ValueError(
            f"device {arch.device} has {dev.cols} columns, the plan needs {columns_needed}"
        )
    return dev
