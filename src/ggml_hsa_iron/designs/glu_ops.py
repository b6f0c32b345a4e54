"""The GLU family, act(x) * g: REGLU, GEGLU, SWIGLU, GEGLU_ERF, GEGLU_QUICK.

The backend sends x and g as two inputs: two tensors (split form), or the two halves of one
tensor as views whose rows are strided (fused form; `swapped` is resolved by the backend,
which passes the half to activate as x). The element-wise design's binary dataflow runs it
(designs/_eltwise.py), strided inputs read row by row; the core function is
kernels/eltwise.cc compiled with -DGLU=1 -DGGML_OP_<op>.
"""

from . import _eltwise


def ggml_op_reglu(spec):
    """GGML REGLU: relu(x) * g."""
    return _eltwise.build(spec)


def ggml_op_geglu(spec):
    """GGML GEGLU: gelu(x) * g (ggml's tanh approximation)."""
    return _eltwise.build(spec)


def ggml_op_swiglu(spec):
    """GGML SWIGLU: silu(x) * g."""
    return _eltwise.build(spec)


def ggml_op_geglu_erf(spec):
    """GGML GEGLU_ERF: gelu_erf(x) * g."""
    return _eltwise.build(spec)


def ggml_op_geglu_quick(spec):
    """GGML GEGLU_QUICK: gelu_quick(x) * g."""
    return _eltwise.build(spec)
