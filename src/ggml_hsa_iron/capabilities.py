"""The `capabilities` answer, derived from the op table (no mlir-aie needed)."""

import json

from . import COMPILER_NAME, MLIR_AIE_VERSION, PROTOCOL
from .archs import ARCHS
from .registry import (
    DECODE_LAYER_COMBOS,
    DECODE_LAYER_ROW_TYPES,
    FLASH_ATTN_FFN_COMBOS,
    FLASH_ATTN_FFN_KV_TYPES,
    MUL_MAT_ADD_COMBOS,
    MUL_MAT_ADD_RMS_NORM_FFN_COMBOS,
    MUL_MAT_COMBOS,
    MUL_MAT_GLU_COMBOS,
    OPS,
    RMS_NORM_FFN_COMBOS,
    RMS_NORM_MUL_MAT_COMBOS,
    RMS_NORM_MUL_MAT_GLU_COMBOS,
    RMS_NORM_MUL_MAT_ROPE_COMBOS,
    RMS_NORM_QKV_ROPE_COMBOS,
)


def capabilities(target: str = "npu") -> dict:
    """What the designs compile; the same for both targets (the emulation target runs the
    designs a real NPU would run, so it takes exactly what they take), but for a run-time n_kv,
    which only the emulation target compiles."""
    ops = []
    for spec in OPS:
        entry = {
            "op": spec.op,
            "inputs": spec.inputs,
            "types": list(spec.types),
            "broadcast": spec.broadcast,
            "noncontiguous": spec.noncontiguous,
            # Extra fields: ignored by the backend, kept for people and tools.
            "kernel_name": spec.kernel_name,
            "kernel_source": spec.source,
            "constraints": spec.constraints,
        }
        if spec.outputs != 1:
            # `output`, then the request's extra_outputs (0: one per row of input 0).
            entry["outputs"] = spec.outputs
        if spec.run_time_n_kv and target == "emu":
            # The request may give n_kv at dispatch (`n_kv_step`): the emulation target
            # records the design for every n_kv at once; the npu target cannot yet.
            entry["run_time_n_kv"] = True
        if spec.op == "MUL_MAT":
            entry["type_combos"] = [list(c) for c in MUL_MAT_COMBOS]
        elif spec.kind == "mul_mat_glu":
            # (weights, x, dst); inputs 0 and 1 both have the weights' type.
            entry["type_combos"] = [list(c) for c in MUL_MAT_GLU_COMBOS]
        elif spec.kind == "mul_mat_add":
            # (weights, x, dst); r is f32.
            entry["type_combos"] = [list(c) for c in MUL_MAT_ADD_COMBOS]
        elif spec.op in ("RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_BIAS"):
            # (weights, x, dst); n (and the bias) f32.
            entry["type_combos"] = [list(c) for c in RMS_NORM_MUL_MAT_COMBOS]
        elif spec.kind == "rms_norm_qkv_rope":
            # Per projection ("Q", "K", "V") its (weights, x, output) triples, each projection's
            # independent of the others' (the weights may mix types); n and the frequency
            # factors f32, the positions i32. One list of triples cannot say that (it would
            # claim one weight type, or accept an f16 Q): another field, so that a reader of
            # `type_combos` does not take these for triples of the whole request.
            entry["group_type_combos"] = {
                g: [list(c) for c in combos] for g, combos in RMS_NORM_QKV_ROPE_COMBOS.items()
            }
        elif spec.kind == "rms_norm_mul_mat_rope":
            # (weights, x, dst); n and the frequency factors f32, the positions i32.
            entry["type_combos"] = [list(c) for c in RMS_NORM_MUL_MAT_ROPE_COMBOS]
        elif spec.kind == "rms_norm_ffn":
            # (weights, x, out); W_u and W_d have the weights' type, n, r and h are f32.
            entry["type_combos"] = [list(c) for c in RMS_NORM_FFN_COMBOS]
        elif spec.kind == "mul_mat_add_rms_norm_ffn":
            # (weights, a, out); W_g, W_u and W_d have the weights' type, r0, n, r1 and h are
            # f32.
            entry["type_combos"] = [list(c) for c in MUL_MAT_ADD_RMS_NORM_FFN_COMBOS]
        elif spec.kind in ("flash_attn_ffn", "flash_attn_glu"):
            # (weights, q, out); W_g, W_u (and W_d) have the weights' type, r0, n, a, r1 and h
            # are f32, the mask f16; K and V each of `kv_types` (a field of its own: the
            # triples cannot say it).
            entry["type_combos"] = [list(c) for c in FLASH_ATTN_FFN_COMBOS]
            entry["kv_types"] = list(FLASH_ATTN_FFN_KV_TYPES)
        elif spec.kind == "decode_layer":
            # (weights, x, out); all seven weights of the weights' type, x, n_attn, (the
            # factors,) n_ffn, Q, a, r1 and h f32, the positions i32, the mask f16; the cache
            # views K and V each of `kv_types`, the K and V rows each of `row_types`.
            entry["type_combos"] = [list(c) for c in DECODE_LAYER_COMBOS if c[0] in spec.types]
            entry["kv_types"] = list(FLASH_ATTN_FFN_KV_TYPES)
            entry["row_types"] = list(DECODE_LAYER_ROW_TYPES)
        elif spec.kind == "rms_norm_mul_mat":
            # (weights, x, dst); the up weights have the weights' type, n is f32.
            entry["type_combos"] = [list(c) for c in RMS_NORM_MUL_MAT_GLU_COMBOS]
        ops.append(entry)
    return {
        "protocol": PROTOCOL,
        "compiler": f"{COMPILER_NAME} (IRON, mlir-aie {MLIR_AIE_VERSION})"
        + (", emulated" if target == "emu" else ""),
        "archs": sorted(ARCHS),
        "ops": ops,
    }


def capabilities_json(target: str = "npu") -> str:
    return json.dumps(capabilities(target), separators=(",", ":"))
