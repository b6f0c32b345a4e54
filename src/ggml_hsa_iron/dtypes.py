"""Element types of the protocol and how the designs treat them."""

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str  # protocol name: f32, bf16, ...
    size: int  # bytes per element
    ctype: str  # the C++ type of the AIE core functions
    numpy: str  # the numpy / ml_dtypes name the IRON designs use
    is_float: bool
    # Elements per block: 1, or ggml's block size for the block-quantized types, whose
    # `size` is then the bytes of one block (ggml's type_size).
    block: int = 1


DTYPES: dict[str, DType] = {
    "f32": DType("f32", 4, "float", "float32", True),
    # The AIE has no f16 arithmetic: core functions hold f16 as its bit pattern (uint16_t)
    # and convert it to and from f32 with integer operations (kernels/ggml_aie.h).
    "f16": DType("f16", 2, "uint16_t", "float16", True),
    "bf16": DType("bf16", 2, "bfloat16", "bfloat16", True),
    "i8": DType("i8", 1, "int8_t", "int8", False),
    "i16": DType("i16", 2, "int16_t", "int16", False),
    "i32": DType("i32", 4, "int32_t", "int32", False),
    # SET_ROWS's row indices only (moved as bytes with the rows, read on the core).
    "i64": DType("i64", 8, "int64_t", "int64", False),
    # ggml's block-quantized weight types (MUL_MAT's src0 only), moved as the bytes ggml
    # stores (int8 object FIFOs) and decoded on the cores.
    "q4_0": DType("q4_0", 18, "", "int8", True, 32),
    "q4_1": DType("q4_1", 20, "", "int8", True, 32),
    "q5_0": DType("q5_0", 22, "", "int8", True, 32),
    "q8_0": DType("q8_0", 34, "", "int8", True, 32),
    "q4_K": DType("q4_K", 144, "", "int8", True, 256),
    "q5_K": DType("q5_K", 176, "", "int8", True, 256),
    "q6_K": DType("q6_K", 210, "", "int8", True, 256),
}

# What the NPU designs compute natively (the seeds' table: I8, I16, I32 and BF16
# are native, F32 is emulated). F16 has no arithmetic on the AIE: only the GLU and
# ROPE designs accept it, converting it to and from f32 on the core.
NATIVE = ("bf16", "i8", "i16", "i32")
EMULATED = ("f32",)
FLOAT_TYPES = ("bf16", "f32")
INT_TYPES = ("i8", "i16", "i32")
ALL_TYPES = FLOAT_TYPES + INT_TYPES
QUANT_TYPES = ("q4_0", "q4_1", "q5_0", "q8_0", "q4_K", "q5_K", "q6_K")

# DMA engines move 32-bit words: every transfer and every contiguous run of a
# transfer must be a whole number of words.
DMA_WORD = 4


def dtype(name: str) -> DType:
    try:
        return DTYPES[name]
    except KeyError:
        raise KeyError(f"unknown element type {name!r}") from None


def elems_per_word(name: str) -> int:
    """How many elements of `name` one 32-bit DMA word holds."""
    return DMA_WORD // dtype(name).size
