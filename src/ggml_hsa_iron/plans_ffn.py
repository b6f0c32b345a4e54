"""RMS_NORM_FFN_<glu> and MUL_MAT_ADD_RMS_NORM_FFN_<glu>: a feed-forward block's GEMVs (with
the attention output projection ahead of them) as one program of phases (designs/ffn.py).

RMS_NORM_FFN_<glu>: inputs W_g, W_u [K, F], W_d [F, K] (one weight type), x f32 [K, N] (the
norm's input), n f32 [K], r f32 (MUL_MAT_ADD's r: [K, N], or repeated over the output);
op_params[0] eps; `output` out f32 [K, N] = W_d . h + r and `extra_outputs` [h f32 [F, N]]
with h = act(W_g . y) * (W_u . y), y = x / sqrt(mean(x^2) + eps) * n.

MUL_MAT_ADD_RMS_NORM_FFN_<glu> (llama's attention output projection and residual ADD folded
ahead of it): inputs W_o [Ka, K], a f32 [Ka, N] (the attention's output), r0 f32 (MUL_MAT_ADD's
r: the layer's input), W_g, W_u [K, F], W_d [F, K], n f32 [K] (the four weights of one type);
op_params[0] eps; `output` out f32 [K, N] and `extra_outputs` [r1 f32 [K, N], h f32 [F, N]]
with r1 = W_o . a + r0, then as RMS_NORM_FFN_<glu> with x = r = r1.

Each is planned as its phases, each by its own op's planner, so that each phase refuses what
that op refuses: (phase 0, MUL_MAT_ADD (W_o, a, r0) writing r1;) phase 1 RMS_NORM_MUL_MAT_<glu>
(W_g, W_u, x, n) writing h; phase 2 MUL_MAT_ADD (W_d, h, r) writing out. The design runs them
all on the same cores and fifos, so the phases' GemvPlans are then replanned onto one shape
(`plan_phases`): the same columns, rows per column, rows per core (nr: the W tiles' and y
objects' rows) and K chunk (kc: the x objects, a divisor of every phase's K: Ka, K and F),
checked as each phase's planner checks a candidate, with the core's memory (the fifos' buffers,
n kept for the norm, the GLU's stash), the memory tile's rings and the DMA tasks of each shim
channel counted over the whole program.

FLASH_ATTN_FFN_<glu> (plans_fa_ffn.py) plans MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s phases with an
attention phase ahead of them, checked on every candidate shape through `plan_phases`' `extra`.
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
    BD_MARGIN,
    GEMV_MAX_CHUNK_WORDS,
    GEMV_ROWS,
    MAX_TASKS_PER_CHANNEL,
    MAX_WRAP,
    MEM_BDS,
    VECTOR_ELEMS,
    GemvPlan,
    _add_ok,
    _byte_tap_ok,
    _norm_ok,
    _rows_ok,
    _w_taps,
    divisors,
    gemv_memtile_bytes,
    mv_norm_bytes,
    stash_bytes,
    x_copy_bytes,
)

PREFIX = "RMS_NORM_FFN_"
ATTN_PREFIX = "MUL_MAT_ADD_RMS_NORM_FFN_"
# The phases' f32 operands: x and y objects of the GEMVs.
F32 = 4


@dataclass(frozen=True)
class FfnSpec:
    """A feed-forward program's spec: its phases as MatmulSpecs on one shape of the array.

    `up` is RMS_NORM_MUL_MAT_<glu>'s spec over (W_g, W_u, x, n) with h as its dst, `down`
    MUL_MAT_ADD's over (W_d, h, r) with out as its dst; MUL_MAT_ADD_RMS_NORM_FFN_<glu>: `attn`
    MUL_MAT_ADD's over (W_o, a, r0) with r1 as its dst (then up's x and down's r are r1);
    FLASH_ATTN_GLU_<glu> has no `down`. Their plans share columns, rows, rows_per_tile and
    k_chunk (`plan_phases`)."""

    request: Request
    arch: Arch
    up: MatmulSpec
    down: MatmulSpec | None
    attn: MatmulSpec | None = None
    # FLASH_ATTN_FFN_<glu>: the attention phase ahead of `attn` (plans_fa_ffn.FaPhase), on the
    # same shape; its output a is attn's x.
    fa: object | None = None

    @property
    def phases(self) -> tuple[MatmulSpec, ...]:
        """The phases in the order the program runs them."""
        phases = (self.attn, self.up, self.down)
        return tuple(p for p in phases if p is not None)

    @property
    def glu(self) -> str:
        return self.up.glu

    @property
    def weight_bytes(self) -> bool:
        return self.up.weight_bytes

    @property
    def sequence(self) -> list[tuple[str, int]]:
        """(type, elements) of the runtime-sequence arguments, in the request's operand order
        (the dispatch's): W_g, W_u, W_d, x, n, r, out, h; MUL_MAT_ADD_RMS_NORM_FFN_<glu>: W_o, a,
        r0, W_g, W_u, W_d, n, out, r1, h; FLASH_ATTN_GLU_<glu>: q, k, v, mask, W_o, r0, W_g, W_u,
        n, h, a, r1."""
        wg, wu, x, n, h = self.up.sequence
        if self.down is None:
            wo, a, r0, r1 = self.attn.sequence
            return [*self.fa.sequence, wo, r0, wg, wu, n, h, a, r1]
        wd, _, r, out = self.down.sequence
        if self.attn is None:
            return [wg, wu, wd, x, n, r, out, h]
        wo, a, r0, r1 = self.attn.sequence
        if self.fa is not None:
            # FLASH_ATTN_FFN_<glu>: q, k, v, mask, W_o, r0, W_g, W_u, W_d, n, out, a, r1, h.
            return [*self.fa.sequence, wo, r0, wg, wu, wd, n, out, a, r1, h]
        return [wo, a, r0, wg, wu, wd, n, out, r1, h]

    def tasks(self):
        """Each phase's task groups (GemvPlan.tasks), in the order of `phases`."""
        return tuple(p.tasks() for p in self.phases)

    @property
    def core(self) -> CoreSource:
        """One core source with every phase's functions: the GEMV source of the weight type
        with the norm's and the GLU's defines (phase 1) and the ADD epilogue's (MUL_MAT_ADD's
        phases); the shared defines (types, MV_ROWS, MV_KC) are equal, since the plans share
        nr and kc."""
        cores = [p.core for p in self.phases]
        a = cores[0]
        defines = {}
        # Merged from the last phase back: RMS_NORM_FFN_<glu>'s defines in the order they had
        # before phase 0 existed (the down phase's, then the norm's and the GLU's).
        for b in reversed(cores):
            clash = {k for k in defines.keys() & b.defines.keys() if defines[k] != b.defines[k]}
            if (a.source, a.object_name) != (b.source, b.object_name) or clash:
                raise AssertionError(f"the phases' core sources differ: {a} and {b}")
            defines.update(b.defines)
        if self.fa is not None:
            # FLASH_ATTN_FFN_<glu>: the attention phase's functions (mv_fa.h) in the same object.
            defines.update(self.fa.defines)
        return CoreSource(a.source, a.object_name, defines)


def ffn_core_bytes(up: GemvPlan) -> int:
    """What a core holds besides its stack, over every phase: the W tiles, x and y objects
    (double-buffered, the same fifos in every phase), n kept for the norm (mv_norm.h) and the
    GLU's stash of nr gate sums (mv_stash.h), both of phase 1 (`up`), and the bf16 copy of x
    (`x_copy_bytes`); x, y, the stash and the copy of each of nx rows (GemvPlan.nx). The
    MUL_MAT_ADD phases keep nothing else."""
    nr, kc, nx = up.rows_per_tile, up.k_chunk, up.nx
    w = up.w_units(kc) * max(up.w_size, 1)
    keep = stash_bytes(nx * nr) + mv_norm_bytes(up.K, kc, nx) + x_copy_bytes(up)
    return 2 * nr * w + 2 * nx * (kc + nr) * F32 + keep


def phase_tasks(q: GemvPlan, products: int) -> dict[str, int]:
    """DMA tasks of a column's shim channels in one phase (`products` x rows): the GLU's (W_g's
    and W_u's tap per round on W; n once, then x per group of rounds; h's drain per group) or
    MUL_MAT_ADD's (W's runs of rounds; per round x's chunks, r and the padding; y's drain per
    group)."""
    groups = q.passes(products) * len(q.round_tasks())
    if q.glu:
        w, x = q.w_tasks(products), groups
    else:
        w, x = groups, q.w_tasks(products)
    return {"W": w, "x": x + (len(q.norm_taps()) if q.norm else 0), "y": groups}


def program_tasks(plans, products: int) -> dict[str, int]:
    """DMA tasks of a column's shim channels over the whole program: every phase's."""
    tasks = {"W": 0, "x": 0, "y": 0}
    for q in plans:
        for k, v in phase_tasks(q, products).items():
            tasks[k] += v
    return tasks


def _phase_ok(q: GemvPlan, products, add: bool) -> bool:
    """Whether one phase's plan on a candidate shape is one its planner (tiling.plan_gemv,
    plan_gemv_blocks) could choose: the rows of a round, the K chunk's DMA runs (whole words,
    whole blocks, within a wrap), MUL_MAT_ADD's whole rounds with a column's r values in one x
    object, n's task on the x channel. Memory, tasks and the weights' taps: `plan_phases`."""
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
    offsets = {p[0] % DMA_WORD for p in products}
    return not q.w_block_bytes or all(_byte_tap_ok(w) for w in _w_taps(q, offsets))


def _cost(q: GemvPlan, passes: int) -> int:
    """The GEMV planners' cost of a phase: rounds x K steps x (vector MACs of the nx rows + a
    fifo round trip) per pass over the weights (2 for the GLU's gate and up rows)."""
    vectors = -(-q.k_chunk // VECTOR_ELEMS)
    return passes * q.rounds * q.k_steps * (q.nx * q.rows_per_tile * vectors + 64)


def k_chunks(*plans: GemvPlan) -> list[int]:
    """K chunks every phase can take, largest first: the common divisors of their K (RMS_NORM_
    FFN_<glu>: K and F; with the attention's phase also Ka), whole blocks for weights moved as
    bytes (one weight type: the first plan's blocks)."""
    unit = plans[0].w_block if plans[0].w_block_bytes else 1
    common = set(divisors(plans[0].K))
    for q in plans[1:]:
        common &= set(divisors(q.K))
    return sorted((d for d in common if d % unit == 0), reverse=True)


# W objects a column's memory tile holds at most: a phase's first W tiles stream into this
# ring while the phase before it runs (designs/ffn.py issues each task group's W fills before
# the group before it finishes), a phase without weights (the attention) its whole length.
MAX_W_RING = 8
# The memory tile's other BDs per core of the column: W's split and y's join, 2 objects each
# side of each link.
OTHER_MEM_BDS_PER_CORE = 6


def w_ring_depth(q: GemvPlan, arch: Arch) -> int:
    """The W ring's objects in a column's memory tile: as many as its memory holds beside y's
    ring and its buffer descriptors allow (a ring object takes one per core it is split to),
    at least the two `memtile_bytes` counts, at most MAX_W_RING."""
    w_object = q.rows * q.rows_per_tile * q.w_units(q.k_chunk) * max(q.w_size, 1)
    room = arch.memtile_bytes - (memtile_bytes(q) - 2 * w_object)
    bds = (MEM_BDS - BD_MARGIN) // q.rows - OTHER_MEM_BDS_PER_CORE
    return max(2, min(MAX_W_RING, room // w_object, bds))


def memtile_bytes(q: GemvPlan) -> int:
    """A column's memory tile over the whole program: the W and y rings of the one shape (every
    phase's tiles go through the same two rings; x goes from the shim to the cores)."""
    return gemv_memtile_bytes(q, max(q.w_size, 1), F32)


def plan_phases(specs, arch: Arch, extra=None) -> tuple[GemvPlan, ...] | None:
    """The cheapest shape (columns, rows, nr, kc) every phase's plan can take, as the phases'
    plans on it, or None. `specs` are the phases' MatmulSpecs (one RMS_NORM_MUL_MAT_<glu>, the
    others MUL_MAT_ADD's), all of one weight type and one count of products. Each candidate
    keeps what its phase's planner checks (`_phase_ok`), the core's memory of every phase
    (`ffn_core_bytes`), the memory tile's rings (`memtile_bytes`) and the DMA tasks of every
    shim channel over the whole program (`program_tasks`).

    `extra` (FLASH_ATTN_FFN_<glu>'s attention phase on the same fifos): a function of a
    candidate's plans returning None where that phase does not fit the shape, else an
    object whose `core_bytes` are added to the core's memory and whose `tasks` (per shim
    channel of the busiest column) to the program's."""
    base = [s.plan for s in specs]
    products = [s.products for s in specs]
    if len({len(p) for p in products}) != 1:
        raise AssertionError("the phases have different counts of products")
    count = len(products[0])
    norm = next(i for i, s in enumerate(specs) if s.n is not None)
    options = k_chunks(*base)
    best, best_key = None, None
    for columns in range(arch.columns, 0, -1):
        for rows in (4, 2, 1):
            for nr in GEMV_ROWS:
                for kc in options:
                    shape = dict(columns=columns, rows=rows, rows_per_tile=nr, k_chunk=kc)
                    qs = [dataclasses.replace(p, **shape) for p in base]
                    fa = extra(qs) if extra is not None else None
                    if extra is not None and fa is None:
                        continue
                    fa_bytes = fa.core_bytes if fa is not None else 0
                    if ffn_core_bytes(qs[norm]) + fa_bytes > arch.l1_budget:
                        continue
                    if memtile_bytes(qs[0]) > arch.memtile_bytes:
                        continue
                    if not all(_phase_ok(q, ps, q.add) for q, ps in zip(qs, products)):
                        continue
                    tasks = program_tasks(qs, count)
                    for k, v in (fa.tasks if fa is not None else {}).items():
                        tasks[k] += v
                    if max(tasks.values()) > MAX_TASKS_PER_CHANNEL:
                        continue
                    cost = sum(_cost(q, 2 if q.glu else 1) for q in qs)
                    key = (cost, -columns * rows)
                    if best_key is not None and key >= best_key:
                        break  # smaller K chunks cost more: none of them is chosen
                    if not all(_taps_ok(q, ps) for q, ps in zip(qs, products)):
                        continue
                    best, best_key = tuple(qs), key
                    break  # the largest K chunk that fits
    return best


def _same_weights(op: str, what: str, w, wg) -> None:
    """Every phase's weights of the gate weights' type."""
    if w.dtype == wg.dtype:
        return
    # Not only the one core object: every phase's tiles go through the cores' one W fifo,
    # whose objects have one size, and no shared shape gives tiles of two types one size
    # (README, "Not done").
    raise UnsupportedError(
        f"{op}: the {what} weights are {w.dtype}, the gate and up weights {wg.dtype}: every "
        f"phase's weight tiles go through the cores' one W fifo (objects of one size) and "
        f"one GEMV core object decodes them (one weight type); the backend runs the phases' "
        f"ops unfused instead"
    )


def _phase(op: str, what: str, prepare, req: Request) -> MatmulSpec:
    try:
        return prepare(req)
    except UnsupportedError as e:
        raise UnsupportedError(f"{op}: the {what} phase: {e}") from None


def _replan(op: str, specs, arch: Arch, wtype: str, extra=None, extra_why=None):
    """The phases' specs with their plans on one shape (`plan_phases`, with `extra`), or the
    refusal (`extra_why()`: what the extra phase adds to it)."""
    if len({s.plan.nx for s in specs}) > 1:
        # One shape of the fifos' objects carries every phase's x rows. Taking them all one at
        # a time would read some weights once per row: the ops unfused read each once where
        # they can (MUL_MAT_ADD's r repeated over the rows; q6_K's norm with 8 rows).
        raise UnsupportedError(
            f"{op} ({wtype} weights, {arch.name}): its phases' GEMVs take "
            f"{' and '.join(str(s.plan.nx) for s in specs)} rows at once, and one shape of "
            f"the fifos' objects carries every phase's; the backend runs the phases' ops unfused"
        )
    plans = plan_phases(specs, arch, extra)
    if plans is not None:
        return tuple(dataclasses.replace(s, plan=q) for s, q in zip(specs, plans))
    base = [s.plan for s in specs]
    ks = " and ".join(f"{q.K}" for q in base)
    if not k_chunks(*base):
        why = f"K={ks} have no common K chunk of whole {base[0].w_block}-value blocks"
    else:
        why = (
            f"no shape of the array fits every phase: one row tile and one K chunk (dividing "
            f"{ks}, whole 32-bit words per row), rounds of the MUL_MAT_ADD phases dividing "
            f"their rows with a column's rows within one chunk, the core's {arch.l1_budget} "
            f"bytes holding the buffers, n and the GLU's stash, the memory tile's rings, and "
            f"at most {MAX_TASKS_PER_CHANNEL} DMA tasks per shim channel over every phase"
        )
        if extra_why is not None:
            why += f"; {extra_why()}"
    raise UnsupportedError(f"{op} ({wtype} weights, {arch.name}): {why}")


def _ffn_phases(req: Request, x, r, out, h, wg, wu, wd, n):
    """Phase 1 (RMS_NORM_MUL_MAT_<glu> (W_g, W_u, x, n) -> h) and phase 2 (MUL_MAT_ADD (W_d, h,
    r) -> out), each prepared by its op's planner."""
    op = req.op
    glu = op[op.index(PREFIX) + len(PREFIX) :]
    phase1 = dataclasses.replace(
        req, op=f"RMS_NORM_MUL_MAT_{glu}", inputs=(wg, wu, x, n), output=h, extra_outputs=()
    )
    phase2 = dataclasses.replace(
        req, op="MUL_MAT_ADD", inputs=(wd, h, r), output=out, op_params=(), extra_outputs=()
    )
    up = _phase(op, "gate/up", prepare_rms_norm_mul_mat, phase1)
    down = _phase(op, "down", prepare_mul_mat_add, phase2)
    return up, down


def prepare_rms_norm_ffn(req: Request) -> FfnSpec:
    """RMS_NORM_FFN_<glu>: RMS_NORM_MUL_MAT_<glu> (W_g, W_u, x, n) -> h, then MUL_MAT_ADD
    (W_d, h, r) -> out, on one shape of the array (`plan_phases`). Refused (UnsupportedError)
    where either phase is refused, where the weights are not of one type, and where no shape
    fits both phases."""
    _, arch = _check_common(req, strided=True)  # the input count, op_params, types
    op = req.op
    if len(req.extra_outputs) != 1:
        raise RequestError(f"{op} has two outputs: out, then h in extra_outputs")
    wg, wu, wd, x, n, r = req.inputs
    out, (h,) = req.output, req.extra_outputs
    _same_weights(op, "down", wd, wg)
    for what, t in (("x", x), ("n", n), ("r", r), ("out", out), ("h", h)):
        if t.dtype != "f32":
            raise UnsupportedError(f"{op}: {what} is {t.dtype}; x, n, r, out and h are f32")
    up, down = _ffn_phases(req, x, r, out, h, wg, wu, wd, n)
    up, down = _replan(op, (up, down), arch, wg.dtype)
    return FfnSpec(req, arch, up, down)


def prepare_mul_mat_add_rms_norm_ffn(req: Request) -> FfnSpec:
    """MUL_MAT_ADD_RMS_NORM_FFN_<glu>: MUL_MAT_ADD (W_o, a, r0) -> r1, then RMS_NORM_FFN_<glu>'s
    phases with x = r = r1, on one shape of the array (`plan_phases`). Refused
    (UnsupportedError) where any phase is refused, where the four weights are not of one type,
    and where no shape fits every phase."""
    arch, specs = attn_ffn_phases(req)
    attn, up, down = _replan(req.op, specs, arch, specs[1].src0.dtype)
    return FfnSpec(req, arch, up, down, attn)


def attn_ffn_phases(req: Request) -> tuple[Arch, tuple[MatmulSpec, ...]]:
    """MUL_MAT_ADD_RMS_NORM_FFN_<glu>'s checks and its three phases, each planned by its own
    op's planner (not yet on one shape: `_replan`)."""
    _, arch = _check_common(req, strided=True)  # the input count, op_params, types
    if len(req.extra_outputs) != 2:
        raise RequestError(f"{req.op} has three outputs: out, then r1 and h in extra_outputs")
    wo, a, r0, wg, wu, wd, n = req.inputs
    out, (r1, h) = req.output, req.extra_outputs
    glu = req.op.removeprefix(ATTN_PREFIX)
    return arch, attn_phases(req, glu, wo, a, r0, wg, wu, n, r1, h, (wd, out))


def attn_phases(
    req: Request, glu: str, wo, a, r0, wg, wu, n, r1, h, down=None
) -> tuple[MatmulSpec, ...]:
    """Phase 0 (MUL_MAT_ADD (W_o, a, r0) -> r1) and phase 1 (RMS_NORM_MUL_MAT_<glu> (W_g, W_u,
    r1, n) -> h), then with `down` = (W_d, out) phase 2 (MUL_MAT_ADD (W_d, h, r1) -> out), each
    planned by its own op's planner; the weights of one type, the other operands f32."""
    op = req.op
    _same_weights(op, "output projection", wo, wg)
    f32 = [("a", a), ("r0", r0), ("n", n), ("r1", r1), ("h", h)]
    if down is not None:
        _same_weights(op, "down", down[0], wg)
        f32.append(("out", down[1]))
    for what, t in f32:
        if t.dtype != "f32":
            names = ", ".join(w for w, _ in f32)
            raise UnsupportedError(f"{op}: {what} is {t.dtype}; {names} are f32")
    phase0 = dataclasses.replace(
        req, op="MUL_MAT_ADD", inputs=(wo, a, r0), output=r1, op_params=(), extra_outputs=()
    )
    # Phase 0's checks first: r1 is its output (MUL_MAT_ADD's shapes, dense), which the other
    # phases then read.
    attn = _phase(op, "attention output", prepare_mul_mat_add, phase0)
    if down is None:
        phase1 = dataclasses.replace(
            req, op=f"RMS_NORM_MUL_MAT_{glu}", inputs=(wg, wu, r1, n), output=h, extra_outputs=()
        )
        return attn, _phase(op, "gate/up", prepare_rms_norm_mul_mat, phase1)
    up, down = _ffn_phases(req, r1, r1, down[1], h, wg, wu, down[0], n)
    return attn, up, down
