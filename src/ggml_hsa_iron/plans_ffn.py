"""RMS_NORM_FFN_<glu>: a feed-forward block's two GEMVs as one program (designs/ffn.py).

The request: inputs W_g, W_u [K, F], W_d [F, K] (one weight type), x f32 [K, N] (the norm's
input), n f32 [K], r f32 (MUL_MAT_ADD's r: [K, N], or repeated over the output); op_params[0]
eps; `output` out f32 [K, N] = W_d . h + r and `extra_outputs` [h f32 [F, N]] with
h = act(W_g . y) * (W_u . y), y = x / sqrt(mean(x^2) + eps) * n.

It is planned as its two phases, each by its own op's planner, so that each phase refuses what
that op refuses: phase 1 is RMS_NORM_MUL_MAT_<glu> (W_g, W_u, x, n) writing h, phase 2
MUL_MAT_ADD (W_d, h, r) writing out. The design runs both on the same cores and fifos, so the
phases' GemvPlans are then replanned onto one shape (`plan_ffn`): the same columns, rows per
column, rows per core (nr: the W tiles' and y objects' rows) and K chunk (kc: the x objects,
a divisor of both K and F), checked as each phase's planner checks a candidate, with the core's
memory (both phases' buffers, n kept for the norm, the GLU's stash) and the DMA tasks of each
shim channel counted over the whole program.
"""

import dataclasses
from dataclasses import dataclass

from .archs import Arch
from .dtypes import DMA_WORD
from .errors import RequestError, UnsupportedError
from .plans import CoreSource, MatmulSpec, _check_common, prepare_mul_mat_add
from .plans import prepare_rms_norm_mul_mat
from .request import Request
from .tiling import (
    GEMV_MAX_CHUNK_WORDS,
    GEMV_ROWS,
    MAX_TASKS_PER_CHANNEL,
    MAX_WRAP,
    VECTOR_ELEMS,
    GemvPlan,
    _add_ok,
    _byte_tap_ok,
    _norm_ok,
    _rows_ok,
    _w_taps,
    divisors,
    mv_norm_bytes,
    stash_bytes,
)

PREFIX = "RMS_NORM_FFN_"
# The phases' f32 operands: x and y objects of the GEMVs.
F32 = 4


@dataclass(frozen=True)
class FfnSpec:
    """RMS_NORM_FFN_<glu>'s spec: its two phases as MatmulSpecs on one shape of the array.

    `up` is RMS_NORM_MUL_MAT_<glu>'s spec over (W_g, W_u, x, n) with h as its dst, `down`
    MUL_MAT_ADD's over (W_d, h, r) with out as its dst; their plans share columns, rows,
    rows_per_tile and k_chunk (`plan_ffn`)."""

    request: Request
    arch: Arch
    up: MatmulSpec
    down: MatmulSpec

    @property
    def glu(self) -> str:
        return self.up.glu

    @property
    def weight_bytes(self) -> bool:
        return self.up.weight_bytes

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments, in dispatch order: W_g, W_u, W_d,
        x, n, r, out, h."""
        wg, wu, x, n, h = self.up.sequence
        wd, _, r, out = self.down.sequence
        return [wg, wu, wd, x, n, r, out, h]

    def tasks(self):
        """Each phase's task groups (GemvPlan.tasks: the GLU's, then MUL_MAT_ADD's)."""
        return self.up.tasks(), self.down.tasks()

    @property
    def core(self) -> CoreSource:
        """One core source with both phases' functions: the GEMV source of the weight type with
        the norm's and the GLU's defines (phase 1) and the ADD epilogue's (phase 2); the shared
        defines (types, MV_ROWS, MV_KC) are equal, since the plans share nr and kc."""
        a, b = self.up.core, self.down.core
        clash = {k for k in a.defines.keys() & b.defines.keys() if a.defines[k] != b.defines[k]}
        if (a.source, a.object_name) != (b.source, b.object_name) or clash:
            raise AssertionError(f"the phases' core sources differ: {a} and {b}")
        return CoreSource(a.source, a.object_name, {**b.defines, **a.defines})


def ffn_core_bytes(up: GemvPlan) -> int:
    """What a core holds besides its stack, over both phases: the W tiles, x and y objects
    (double-buffered, the same fifos in both phases), n kept for the norm (mv_norm.h) and the
    GLU's stash of nr gate sums (mv_stash.h). Phase 2 (MUL_MAT_ADD) keeps nothing else."""
    nr, kc = up.rows_per_tile, up.k_chunk
    w = up.w_units(kc) * max(up.w_size, 1)
    return 2 * nr * w + 2 * kc * F32 + 2 * nr * F32 + stash_bytes(nr) + mv_norm_bytes(up.K, kc)


def channel_tasks(up: GemvPlan, down: GemvPlan, products: int) -> dict[str, int]:
    """DMA tasks of a column's shim channels over the whole program (`products` x rows, the
    same for both phases): W (phase 1: W_g's and W_u's tap per round; phase 2: W_d's runs of
    rounds), x (n once, x per group of rounds; then per round h's chunks, r and the padding) and
    y (the drains of h's groups, then out's)."""
    u, d = len(up.round_tasks()), len(down.round_tasks())
    return {
        "W": up.w_tasks(products) + products * d,
        "x": 1 + products * u + down.w_tasks(products),
        "y": products * (u + d),
    }


def _phase_ok(q: GemvPlan, products, add: bool) -> bool:
    """Whether one phase's plan on a candidate shape is one its planner (tiling.plan_gemv,
    plan_gemv_blocks) could choose: the rows of a round, the K chunk's DMA runs (whole words,
    whole blocks, within a wrap), MUL_MAT_ADD's whole rounds with a column's r values in one x
    object, n's task on the x channel. Memory, tasks and the weights' taps: `plan_ffn`."""
    C, R, nr, kc, K, N = q.columns, q.rows, q.rows_per_tile, q.k_chunk, q.K, q.N
    if C * R * nr > N or not _rows_ok(N, C, R, nr, None):
        return False
    if K % kc or K // kc > MAX_WRAP or kc * F32 > DMA_WORD * GEMV_MAX_CHUNK_WORDS:
        return False
    kcw = q.w_units(kc)
    if q.w_block_bytes:
        if kc % q.w_block or (nr * kcw) % DMA_WORD:
            return False
        if kc != K and (kcw % DMA_WORD or kcw > DMA_WORD * GEMV_MAX_CHUNK_WORDS):
            return False
        if kc == K and R * nr * kcw > DMA_WORD * MAX_WRAP:
            return False
    elif (kc * q.w_size) % DMA_WORD or kc * q.w_size > DMA_WORD * GEMV_MAX_CHUNK_WORDS:
        return False
    if add and not _add_ok(N, R, nr, q.block, kc):
        return False
    return _norm_ok(q, len(products))


def _taps_ok(q: GemvPlan, products) -> bool:
    """Weights moved as bytes: every W tap of the phase moves whole, word-aligned words (the
    last of a candidate's checks: it walks the phase's tasks)."""
    return not q.w_block_bytes or all(_byte_tap_ok(w) for w in _w_taps(q, products))


def _cost(q: GemvPlan, passes: int) -> int:
    """The GEMV planners' cost of a phase: rounds x K steps x (vector MACs + a fifo round trip)
    per pass over the weights (2 for the GLU's gate and up rows)."""
    vectors = -(-q.k_chunk // VECTOR_ELEMS)
    return passes * q.rounds * q.k_steps * (q.rows_per_tile * vectors + 64)


def k_chunks(up: GemvPlan, down: GemvPlan) -> list[int]:
    """K chunks both phases can take, largest first: the divisors of K and F (whole blocks for
    weights moved as bytes)."""
    unit = up.w_block if up.w_block_bytes else 1
    common = set(divisors(up.K)) & set(divisors(down.K))
    return sorted((d for d in common if d % unit == 0), reverse=True)


def plan_ffn(up: MatmulSpec, down: MatmulSpec, arch: Arch) -> tuple[GemvPlan, GemvPlan] | None:
    """The cheapest shape (columns, rows, nr, kc) both phases' plans can take, as the pair of
    plans on it, or None. Each candidate keeps what its phase's planner checks (`_phase_ok`),
    the core's memory of both phases (`ffn_core_bytes`) and the DMA tasks of every shim
    channel over the whole program (`channel_tasks`)."""
    p1, p2 = up.plan, down.plan
    pu, pd = up.products, down.products
    options = k_chunks(p1, p2)
    best, best_key = None, None
    for columns in range(arch.columns, 0, -1):
        for rows in (4, 2, 1):
            for nr in GEMV_ROWS:
                for kc in options:
                    shape = dict(columns=columns, rows=rows, rows_per_tile=nr, k_chunk=kc)
                    a = dataclasses.replace(p1, **shape)
                    b = dataclasses.replace(p2, **shape)
                    if ffn_core_bytes(a) > arch.l1_budget:
                        continue
                    if not (_phase_ok(a, pu, False) and _phase_ok(b, pd, True)):
                        continue
                    tasks = channel_tasks(a, b, len(pu))
                    if max(tasks.values()) > MAX_TASKS_PER_CHANNEL:
                        continue
                    key = (_cost(a, 2) + _cost(b, 1), -columns * rows)
                    if best_key is not None and key >= best_key:
                        break  # smaller K chunks cost more: none of them is chosen
                    if not (_taps_ok(a, pu) and _taps_ok(b, pd)):
                        continue
                    best, best_key = (a, b), key
                    break  # the largest K chunk that fits
    return best


def prepare_rms_norm_ffn(req: Request) -> FfnSpec:
    """RMS_NORM_FFN_<glu>: RMS_NORM_MUL_MAT_<glu> (W_g, W_u, x, n) -> h, then MUL_MAT_ADD
    (W_d, h, r) -> out, on one shape of the array (`plan_ffn`). Refused (UnsupportedError)
    where either phase is refused, where the weights are not of one type, and where no shape
    fits both phases."""
    _, arch = _check_common(req, strided=True)  # the input count, op_params, types
    op = req.op
    if len(req.extra_outputs) != 1:
        raise RequestError(f"{op} has two outputs: out, then h in extra_outputs")
    wg, wu, wd, x, n, r = req.inputs
    out, (h,) = req.output, req.extra_outputs
    if wd.dtype != wg.dtype:
        # Not only the one core object: both phases' tiles go through the cores' one W fifo,
        # whose objects have one size, and no shared shape gives tiles of two types one size
        # (README, "Not done").
        raise UnsupportedError(
            f"{op}: the down weights are {wd.dtype}, the gate and up weights {wg.dtype}: both "
            f"phases' weight tiles go through the cores' one W fifo (objects of one size) and "
            f"one GEMV core object decodes them (one weight type); the backend runs "
            f"RMS_NORM_MUL_MAT_{op[len(PREFIX) :]} and MUL_MAT_ADD instead"
        )
    for what, t in (("x", x), ("n", n), ("r", r), ("out", out), ("h", h)):
        if t.dtype != "f32":
            raise UnsupportedError(f"{op}: {what} is {t.dtype}; x, n, r, out and h are f32")
    glu = op[len(PREFIX) :]
    phase1 = dataclasses.replace(
        req, op=f"RMS_NORM_MUL_MAT_{glu}", inputs=(wg, wu, x, n), output=h, extra_outputs=()
    )
    phase2 = dataclasses.replace(
        req, op="MUL_MAT_ADD", inputs=(wd, h, r), output=out, op_params=(), extra_outputs=()
    )
    try:
        up = prepare_rms_norm_mul_mat(phase1)
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: the gate/up phase: {e}") from None
    try:
        down = prepare_mul_mat_add(phase2)
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: the down phase: {e}") from None
    plans = plan_ffn(up, down, arch)
    if plans is None:
        K, F = up.plan.K, down.plan.K
        chunks = k_chunks(up.plan, down.plan)
        why = (
            f"K={K} and F={F} have no common K chunk of whole {up.plan.w_block}-value blocks"
            if not chunks
            else "no shape of the array fits both phases: one row tile and one K chunk "
            f"(dividing K={K} and F={F}, whole 32-bit words per row), rounds of the down "
            f"projection dividing K with a column's rows within one chunk, the core's "
            f"{arch.l1_budget} bytes holding both phases' buffers, n and the GLU's stash, "
            f"and at most {MAX_TASKS_PER_CHANNEL} DMA tasks per shim channel"
        )
        raise UnsupportedError(f"{op} ({wg.dtype} weights, {arch.name}): {why}")
    a, b = plans
    return FfnSpec(req, arch, dataclasses.replace(up, plan=a), dataclasses.replace(down, plan=b))
