"""RMS_NORM_QKV_ROPE and RMS_NORM_QKV_ROPE_FF: llama's Q, K and V projections of one normalised x
in one dispatch (three outputs), the array's columns partitioned between three GEMVs.

Inputs Wq [K, Mq], Wk [K, Mk], Wv [K, Mv] (one K; each of any type its group's op takes, so
that llama.cpp's Q4_K_M layers of q4_K Wq, Wk and q6_K Wv are one dispatch too), x f32 [K, N]
(the norm's input), n f32 [K], the i32 positions [>= N] and for _FF the f32 frequency factors
[>= n_dims / 2];
outputs Q f32 [D, Hq, N] (`output`), then K [D, Hk, N] and V [Mv, N], each f32 or f16 (the
request's `extra_outputs`), dense. op_params: RMS_NORM_MUL_MAT_ROPE's 12 words (0..10 the ROPE's,
11 eps). Q = rope(Wq . y), K = rope(Wk . y), V = Wv . y with y = x / sqrt(mean(x^2) + eps) * n
per token.

Each projection is a group of whole columns (`tiling.split_columns`: in proportion to the rows,
at least one column each; Llama-3.2-1B's 2048, 512, 512 rows take 4, 2, 2 of aie2p's 8 columns,
2, 1, 1 of aie2's 4). A group is exactly the GEMV of the op computing its projection alone
(`GROUP_OPS`), planned over its columns (`prepare_rms_norm_mul_mat`'s `columns`): its plan,
refusals, core source and epilogue (Q's and K's rotation, V's f16 rounding) are that op's, so
its values are bit for bit that op's when both plans chunk K alike. Every column receives x
(and n, and the rotation's constants for Q and K, once per dispatch ahead of x) from its own
shim tile as a lone GEMV's column does; the three groups' DMA task groups are issued together,
so that the weights stream through every column at once.

Each group links its own core object (its own defines: weight type, rows, K chunk, output type,
epilogue): `QkvGroup.core`, the GEMV source of the group's weight type (mv.cc or mvq.cc) with its
extern "C" functions renamed with the group's suffix (`_q`, `_k`, `_v`), so that the design's
Kernels name distinct functions. A group's fifos, DMA taps and runtime-sequence argument are its
own GEMV's too, so the three weight types need not agree: nothing of one group is sized or laid
out by another's weights. What they share is x and n (each column's shim sends them in its own
group's K chunks), hence the one K.
"""

from dataclasses import dataclass

from .archs import Arch
from .errors import RequestError, UnsupportedError
from .plans import (
    ROPE_PARAMS,
    CoreSource,
    MatmulSpec,
    _check_common,
    prepare_rms_norm_mul_mat,
    prepare_rms_norm_mul_mat_rope,
)
from .request import Request, Tensor
from .tiling import (
    MAX_TASKS_PER_CHANNEL,
    SHIM_GROUP_TASKS,
    gemv_memtile_bytes,
    split_columns,
)

# The suffixes of the GEMV core sources' extern "C" functions (mv.cc and mvq.cc with
# mv_stash.h, mv_norm.h, mv_glu.h, mv_add.h) after ggml_mv / ggml_mvq: a group's object
# defines them renamed, whichever its defines compile.
GEMV_FUNCTIONS = (
    "",
    "_zero",
    "_stash_zero",
    "_stash",
    "_store_f16",
    "_gate_zero",
    "_gate",
    "_glu",
    "_add",
    "_norm_load",
    "_norm_zero",
    "_norm",
    "_norm_scale",
    "_norm_stash_zero",
    "_norm_stash",
    "_norm_store_f16",
    "_norm_gate_zero",
    "_norm_gate",
    "_rope_load",
    "_norm_rope_scale",
    "_norm_rope_store_f16",
    "_bias_load",
)

# The projections: name, and the op computing it alone (its group's GEMV; RMS_NORM_QKV_ROPE_FF:
# RMS_NORM_MUL_MAT_ROPE_FF; RMS_NORM_QKV_HEAD_NORM_ROPE: RMS_NORM_MUL_MAT_HEAD_NORM_ROPE).
GROUP_OPS = (
    ("q", "RMS_NORM_MUL_MAT_ROPE"),
    ("k", "RMS_NORM_MUL_MAT_ROPE"),
    ("v", "RMS_NORM_MUL_MAT"),
)


def own_inputs(op: str) -> int:
    """The inputs of `op` that are one group's own, after those all share: Q's and K's head
    norm weights (qwen3), or Q's, K's and V's biases (qwen2); 0 without."""
    if "_HEAD_NORM_" in op:
        return 2
    return 3 if "_BIAS_" in op else 0


@dataclass(frozen=True)
class QkvGroup:
    """One projection's GEMV on array columns col0 .. col0 + columns - 1."""

    name: str  # "q", "k" or "v"
    spec: MatmulSpec  # the GEMV of the op computing the projection alone, over `columns`
    col0: int
    columns: int  # allotted (the plan uses at most this many)

    @property
    def suffix(self) -> str:
        """What ends the names of the group's Kernels (and their functions in its object)."""
        return f"_{self.name}"

    @property
    def core(self) -> CoreSource:
        """The group's core object: its GEMV's source and defines, the functions renamed."""
        c = self.spec.core
        fn = "ggml_mvq" if self.spec.weight_bytes else "ggml_mv"
        stem = c.object_name.removesuffix(".o")
        return c.renamed(f"{stem}{self.suffix}.o", [fn + f for f in GEMV_FUNCTIONS], self.suffix)


@dataclass(frozen=True)
class QkvSpec:
    request: Request
    arch: Arch
    groups: tuple[QkvGroup, ...]  # Q, K, V

    @property
    def columns(self) -> int:
        return sum(g.columns for g in self.groups)

    @property
    def own_inputs(self) -> int:
        """The groups' own inputs (`own_inputs`)."""
        return own_inputs(self.request.op)

    @property
    def cores(self) -> tuple[CoreSource, ...]:
        return tuple(g.core for g in self.groups)

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments: the request's operands in order
        (Wq, Wk, Wv, x, n, the positions, (the factors,) Q, K, V), each as its group's GEMV
        declares it (weights moved as bytes: i8; the positions and factors f32, the words of x's
        fifo)."""
        q, k, v = (g.spec.sequence for g in self.groups)
        # Q's GEMV's: W, x, n, the positions, (the factors,) (Q's head norm weights or bias,)
        # Q; then K's (and V's) own.
        own = [k[-2], v[-2]][: max(self.own_inputs - 1, 0)]
        return [q[0], k[0], v[0], *q[1:-1], *own, q[-1], k[-1], v[-1]]

    def tasks(self) -> list[list]:
        """Per group its GEMV's DMA task groups (GemvPlan.tasks); the design issues the
        groups' i-th task groups together."""
        return [g.spec.tasks() for g in self.groups]


def _operand_checks(req: Request):
    """Shapes and types beyond the groups' own checks: one K, x f32 [K, N], n, Q f32 and the
    outputs' types and layouts, V's shape. The weights' types are each group's: its op takes
    or refuses its projection's weights (`_group_spec`)."""
    wq, wk, wv, x, n = req.inputs[:5]
    q, k, v = req.outputs
    op = req.op
    K = wq.ne[0]
    if any(t.ne[0] != K for t in (wk, wv, x, n)):
        raise RequestError(
            f"{op}: Wq, Wk, Wv, x and n must have one K (ne0): {wq.ne[0]}, {wk.ne[0]}, "
            f"{wv.ne[0]}, {x.ne[0]}, {n.ne[0]}"
        )
    for what, t in (("Wq", wq), ("Wk", wk), ("Wv", wv)):
        if t.ne[2:] != (1, 1):
            raise UnsupportedError(f"{op}: {what} {list(t.ne)} is not one matrix [K, M]")
    if q.dtype != "f32":
        raise UnsupportedError(f"{op}: Q (the output) is f32, the request has {q.dtype}")
    for what, t in (("Q", q), ("K", k), ("V", v)):
        if t.dtype not in ("f32", "f16") or not t.is_dense():
            raise UnsupportedError(
                f"{op}: {what} ({t.dtype}, strides {list(t.nb)}) must be dense f32 or f16"
            )
    N = x.ne[1]
    if v.ne != (wv.ne[1], N, 1, 1):
        raise RequestError(f"{op}: V {list(v.ne)} is not [Mv, N] = [{wv.ne[1]}, {N}]")


def _group_request(req: Request, name: str, op: str, w: Tensor, out: Tensor) -> Request:
    """The request of `op` computing projection `name` alone:
    RMS_NORM_MUL_MAT[_HEAD_NORM|_BIAS]_ROPE(_FF) (W, x, n, the positions, (the factors,) (its
    head norm's weights or bias); the 12 or 13 words) or RMS_NORM_MUL_MAT[_BIAS] (W, x, n, (its
    bias); eps)."""
    x, n, *consts = req.inputs[3:]
    params = list(req.op_params) + [0] * (ROPE_PARAMS + 1 - len(req.op_params))
    own = own_inputs(req.op)
    consts, mine = consts[: len(consts) - own], consts[len(consts) - own :]
    mine = mine["qkv".index(name) : "qkv".index(name) + 1]
    if op == "RMS_NORM_MUL_MAT":
        op += "_BIAS" if mine else ""  # V's bias
        return Request(req.name, req.arch, op, (params[ROPE_PARAMS],), (w, x, n, *mine), out)
    if "_HEAD_NORM_" in req.op:
        op = op.replace("_ROPE", "_HEAD_NORM_ROPE")
    elif "_BIAS_" in req.op:
        op = op.replace("_ROPE", "_BIAS_ROPE")
    op += "_FF" if req.op.endswith("_FF") else ""
    return Request(req.name, req.arch, op, tuple(params), (w, x, n, *consts, *mine), out)


def _check_limits(spec: QkvSpec) -> None:
    """The limits of each column, every column one group's: its memory tile (the W and y
    rings) and its shim channels' DMA tasks (its GEMV's task groups; on the x channel also the
    prologue, n and the rotation's constants, whose fills join W's, x's and y's in the first
    task group). A core's memory (n, the stash, the rotation's tables) is its group's plan's."""
    op, arch = spec.request.op, spec.arch
    for g in spec.groups:
        p = g.spec.plan
        unit = 1 if g.spec.weight_bytes else g.spec.src0.size
        if gemv_memtile_bytes(p, unit, g.spec.dst.size) > arch.memtile_bytes:
            raise UnsupportedError(f"{op}: {g.name.upper()}'s memory tile rings overflow it")
        prologue = 1 + (len(p.rope_taps()) if g.spec.rope is not None else 0)
        if len(g.spec.tasks()) + prologue > MAX_TASKS_PER_CHANNEL:
            raise UnsupportedError(
                f"{op}: {g.name.upper()}'s x channel takes more than {MAX_TASKS_PER_CHANNEL} "
                f"DMA tasks"
            )
        if 3 + prologue > SHIM_GROUP_TASKS:
            raise UnsupportedError(f"{op}: {g.name.upper()}'s first task group outgrows a shim")


def prepare_qkv(req: Request) -> QkvSpec:
    """RMS_NORM_QKV_ROPE(_FF): see the module docstring."""
    _, arch = _check_common(req)  # the op, arch, input count, op_params, types, dense operands
    _operand_checks(req)
    wq, wk, wv = req.inputs[:3]
    q, k, v = req.outputs
    outs = {"q": (wq, q), "k": (wk, k), "v": (wv, v)}
    split = split_columns([w.ne[1] for w, _ in outs.values()], arch.columns)
    if split is None:
        raise UnsupportedError(
            f"{req.op}: {arch.columns} columns on {arch.name} do not go round the Q, K and V "
            f"GEMVs (one column each at least)"
        )
    groups, col0 = [], 0
    for (name, op), columns in zip(GROUP_OPS, split):
        w, out = outs[name]
        gspec = _group_spec(req, _group_request(req, name, op, w, out), columns, name)
        groups.append(QkvGroup(name, gspec, col0, columns))
        col0 += columns
    spec = QkvSpec(req, arch, tuple(groups))
    _check_limits(spec)
    return spec


def _group_spec(req: Request, sub: Request, columns: int, name: str) -> MatmulSpec:
    """One group's GEMV: the op computing the projection alone, planned over `columns`; its
    refusals are the request's."""
    lone = sub.op in ("RMS_NORM_MUL_MAT", "RMS_NORM_MUL_MAT_BIAS")
    prepare = prepare_rms_norm_mul_mat if lone else prepare_rms_norm_mul_mat_rope
    try:
        return prepare(sub, columns=columns)
    except (UnsupportedError, RequestError) as e:
        raise type(e)(f"{req.op}, {name.upper()} over {columns} column(s): {e}") from None
