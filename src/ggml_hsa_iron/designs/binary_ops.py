"""Binary element-wise ops (ADD, SUB, MUL, DIV) with ggml broadcasting of input 1."""

from . import _eltwise


def ggml_op_add(spec):
    """GGML ADD: the element-wise design, core function compiled with -DGGML_OP_ADD."""
    return _eltwise.build(spec)


def ggml_op_sub(spec):
    """GGML SUB: the element-wise design, core function compiled with -DGGML_OP_SUB."""
    return _eltwise.build(spec)


def ggml_op_mul(spec):
    """GGML MUL: the element-wise design, core function compiled with -DGGML_OP_MUL."""
    return _eltwise.build(spec)


def ggml_op_div(spec):
    """GGML DIV: the element-wise design, core function compiled with -DGGML_OP_DIV."""
    return _eltwise.build(spec)
