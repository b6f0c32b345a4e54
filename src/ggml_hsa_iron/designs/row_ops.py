"""Row ops: RMS_NORM, NORM and the fused RMS_NORM_MUL and RMS_NORM_MUL_ADD (op_params eps), SOFT_MAX in its four forms (op_params scale
and max_bias; mask, sinks), ARGMAX. One design (`_rows.py`), one core source
(kernels/rows.cc) compiled with -DGGML_OP_<OP>."""

from . import _rows


def ggml_op_rms_norm(spec):
    """GGML RMS_NORM: x / sqrt(mean(x^2) + eps) per row (two passes over the resident row)."""
    return _rows.build(spec)


def ggml_op_norm(spec):
    """GGML NORM: (x - mean) / sqrt(var + eps) per row (three passes over the resident row)."""
    return _rows.build(spec)


def ggml_op_rms_norm_mul(spec):
    """RMS_NORM followed by MUL with one weight row, fused by the backend: rms_norm(x) * w per
    row; w is sent once to every worker and stays resident."""
    return _rows.build(spec)


def ggml_op_rms_norm_mul_add(spec):
    """RMS_NORM, MUL with one weight row and the ADD of a residual, fused by the backend:
    rms_norm(x) * w + r per row; r's rows come beside x's on the second input channel (as
    SOFT_MAX's mask), w stays resident."""
    return _rows.build(spec)


def ggml_op_soft_max(spec):
    """GGML SOFT_MAX without mask or sinks: softmax(x * scale) per row."""
    return _rows.build(spec)


def ggml_op_soft_max_mask(spec):
    """GGML SOFT_MAX with an f32 or f16 mask: softmax(x * scale + slope * mask) per row."""
    return _rows.build(spec)


def ggml_op_soft_max_sinks(spec):
    """GGML SOFT_MAX with sinks: the head's sink joins the row's max and sum."""
    return _rows.build(spec)


def ggml_op_soft_max_mask_sinks(spec):
    """GGML SOFT_MAX with a mask and sinks."""
    return _rows.build(spec)


def ggml_op_argmax(spec):
    """GGML ARGMAX: the index of the first largest element of every row, as i32."""
    return _rows.build(spec)
