"""Unary element-wise ops: the ggml unary list of the seeds, SQR SQRT LOG SIN COS FLOOR
CEIL ROUND TRUNC, and SCALE and CLAMP (their two op_params are compiled in)."""

from . import _eltwise


def ggml_op_abs(spec):
    """GGML ABS: the element-wise design, core function compiled with -DGGML_OP_ABS."""
    return _eltwise.build(spec)


def ggml_op_sgn(spec):
    """GGML SGN: the element-wise design, core function compiled with -DGGML_OP_SGN."""
    return _eltwise.build(spec)


def ggml_op_neg(spec):
    """GGML NEG: the element-wise design, core function compiled with -DGGML_OP_NEG."""
    return _eltwise.build(spec)


def ggml_op_step(spec):
    """GGML STEP: the element-wise design, core function compiled with -DGGML_OP_STEP."""
    return _eltwise.build(spec)


def ggml_op_tanh(spec):
    """GGML TANH: the element-wise design, core function compiled with -DGGML_OP_TANH."""
    return _eltwise.build(spec)


def ggml_op_elu(spec):
    """GGML ELU: the element-wise design, core function compiled with -DGGML_OP_ELU."""
    return _eltwise.build(spec)


def ggml_op_relu(spec):
    """GGML RELU: the element-wise design, core function compiled with -DGGML_OP_RELU."""
    return _eltwise.build(spec)


def ggml_op_sigmoid(spec):
    """GGML SIGMOID: the element-wise design, core function compiled with -DGGML_OP_SIGMOID."""
    return _eltwise.build(spec)


def ggml_op_gelu(spec):
    """GGML GELU: the element-wise design, core function compiled with -DGGML_OP_GELU."""
    return _eltwise.build(spec)


def ggml_op_gelu_quick(spec):
    """GGML GELU_QUICK: the element-wise design, core function compiled with -DGGML_OP_GELU_QUICK."""
    return _eltwise.build(spec)


def ggml_op_silu(spec):
    """GGML SILU: the element-wise design, core function compiled with -DGGML_OP_SILU."""
    return _eltwise.build(spec)


def ggml_op_hardswish(spec):
    """GGML HARDSWISH: the element-wise design, core function compiled with -DGGML_OP_HARDSWISH."""
    return _eltwise.build(spec)


def ggml_op_hardsigmoid(spec):
    """GGML HARDSIGMOID: the element-wise design, core function compiled with -DGGML_OP_HARDSIGMOID."""
    return _eltwise.build(spec)


def ggml_op_exp(spec):
    """GGML EXP: the element-wise design, core function compiled with -DGGML_OP_EXP."""
    return _eltwise.build(spec)


def ggml_op_gelu_erf(spec):
    """GGML GELU_ERF: the element-wise design, core function compiled with -DGGML_OP_GELU_ERF."""
    return _eltwise.build(spec)


def ggml_op_sqr(spec):
    """GGML SQR: the element-wise design, core function compiled with -DGGML_OP_SQR."""
    return _eltwise.build(spec)


def ggml_op_sqrt(spec):
    """GGML SQRT: the element-wise design, core function compiled with -DGGML_OP_SQRT."""
    return _eltwise.build(spec)


def ggml_op_log(spec):
    """GGML LOG: the element-wise design, core function compiled with -DGGML_OP_LOG."""
    return _eltwise.build(spec)


def ggml_op_sin(spec):
    """GGML SIN: the element-wise design, core function compiled with -DGGML_OP_SIN."""
    return _eltwise.build(spec)


def ggml_op_cos(spec):
    """GGML COS: the element-wise design, core function compiled with -DGGML_OP_COS."""
    return _eltwise.build(spec)


def ggml_op_floor(spec):
    """GGML FLOOR: the element-wise design, core function compiled with -DGGML_OP_FLOOR."""
    return _eltwise.build(spec)


def ggml_op_ceil(spec):
    """GGML CEIL: the element-wise design, core function compiled with -DGGML_OP_CEIL."""
    return _eltwise.build(spec)


def ggml_op_round(spec):
    """GGML ROUND: the element-wise design, core function compiled with -DGGML_OP_ROUND."""
    return _eltwise.build(spec)


def ggml_op_trunc(spec):
    """GGML TRUNC: the element-wise design, core function compiled with -DGGML_OP_TRUNC."""
    return _eltwise.build(spec)


def ggml_op_scale(spec):
    """GGML SCALE: the element-wise design, core function compiled with -DGGML_OP_SCALE."""
    return _eltwise.build(spec)


def ggml_op_clamp(spec):
    """GGML CLAMP: the element-wise design, core function compiled with -DGGML_OP_CLAMP."""
    return _eltwise.build(spec)
