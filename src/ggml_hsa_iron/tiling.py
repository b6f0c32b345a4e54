"""Tiling and alignment arithmetic of the designs (pure Python, unit-tested).

Everything a design needs to know about how work is spread over the array is
decided here, before IRON is imported, so that it can be tested without
mlir-aie and so that an unsupported shape is refused (exit status 2) before any
tool runs.

Hardware facts the plans respect:

* DMA engines move 32-bit words: every buffer, every tile and every
  contiguous run of an access pattern is a whole number of words;
* a compute tile has 2 input and 2 output DMA channels, a memory tile 6 and 6,
  a shim tile 2 and 2;
* a compute tile has 64 KiB of data memory; double-buffered object FIFOs take
  two copies of every tile;
* a shim buffer descriptor has 3 dimensions with wraps below 1024 plus an
  outer repeat count of at most 64 (`MAX_REPEAT`); longer walks are issued as
  several DMA tasks.
"""

import functools
from dataclasses import dataclass

from .archs import Arch
from .dtypes import DMA_WORD

MAX_TILE = 4096  # elements per object of an element-wise FIFO
MAX_REPEAT = 64  # outer repeat count of one shim DMA task
MAX_WRAP = 1023  # largest wrap of an inner DMA dimension
MAX_TASKS_PER_CHANNEL = 1024  # runtime-sequence DMA tasks per shim channel
MAX_STRIDE_WORDS = 1 << 20  # largest stride of a shim DMA dimension, in 32-bit words
MEMTILE_IN_CHANNELS = 6  # input (S2MM) DMA channels of a memory tile (AM020)
ITERATION_OVERHEAD = 256  # element-equivalents one object FIFO round trip costs
BCAST_MAX_BYTES = 8192  # largest broadcast operand kept resident in a compute tile
VECTOR_ELEMS = 16  # lanes of the element-wise vector loops


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending."""
    if n < 1:
        raise ValueError(f"divisors of {n}")
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def word_multiple(sizes) -> int:
    """Smallest element count whose bytes are whole DMA words for every size."""
    m = 1
    for s in sizes:
        need = DMA_WORD // s if s < DMA_WORD else 1
        m = max(m, need)
    return m


def pad_words(n: int, sizes) -> int:
    """n rounded up to whole DMA words for every element size in `sizes`.

    An operand of n elements then ends inside its last 32-bit word; the DMA moves that
    word whole. What the kernels do with the extra elements: see kernels/eltwise.cc (PAD).
    """
    unit = word_multiple(sizes)
    return -(-n // unit) * unit


# --------------------------------------------------------------------------
# Element-wise ops


@dataclass(frozen=True)
class EltwisePlan:
    """N output elements spread over `columns` x `rows` workers.

    Column c owns the contiguous range [c*K*R*T, (c+1)*K*R*T) of the (logical,
    row-major) output; at iteration k its memory tile receives R*T elements and
    hands worker r the T elements at offset r*T. So worker (c, r) processes,
    at iteration k, the elements starting at `start(c, r) + k * step`.
    """

    n: int
    columns: int  # C
    rows: int  # R: workers per column
    tile: int  # T: elements per object
    iterations: int  # K: objects per worker

    @property
    def workers(self) -> int:
        return self.columns * self.rows

    @property
    def column_chunk(self) -> int:
        return self.iterations * self.rows * self.tile

    @property
    def step(self) -> int:
        return self.rows * self.tile

    def start(self, column: int, row: int) -> int:
        return column * self.column_chunk + row * self.tile

    def covers(self) -> list[tuple[int, int]]:
        """(start, length) of every tile every worker processes (for tests)."""
        out = []
        for c in range(self.columns):
            for r in range(self.rows):
                for k in range(self.iterations):
                    out.append((self.start(c, r) + k * self.step, self.tile))
        return out


def plan_eltwise(
    n: int,
    streamed_sizes,
    arch: Arch,
    max_rows: int,
    resident_bytes: int = 0,
    chunk_multiple: int = 1,
) -> EltwisePlan | None:
    """The cheapest plan for n elements, or None when none exists.

    `streamed_sizes` are the element sizes of the operands streamed tile by
    tile (inputs and output); `resident_bytes` is what a worker keeps for the
    whole dispatch (a broadcast operand). Every operand's tile must be whole
    DMA words, every worker's share must be whole tiles. `chunk_multiple`: each
    column's share must be a multiple of it (whole rows, when an operand is walked
    row by row).
    """
    if n < 1:
        return None
    unit = word_multiple(streamed_sizes)
    per_elem_l1 = 2 * sum(streamed_sizes)  # double-buffered
    budget = arch.l1_budget - resident_bytes
    if budget <= 0:
        return None
    max_tile = min(MAX_TILE, budget // per_elem_l1)
    best = None
    best_key = None
    for columns in range(1, arch.columns + 1):
        if n % columns or (n // columns) % chunk_multiple:
            continue
        for rows in range(1, max_rows + 1):
            workers = columns * rows
            if n % workers:
                continue
            share = n // workers
            tiles = [t for t in divisors(share) if t % unit == 0 and t <= max_tile]
            if not tiles:
                continue
            tile = tiles[-1]
            iterations = share // tile
            # A tile shorter than a vector costs a whole vector.
            cost = iterations * (max(tile, VECTOR_ELEMS) + ITERATION_OVERHEAD)
            key = (cost, workers, -tile)
            if best_key is None or key < best_key:
                best_key = key
                best = EltwisePlan(n, columns, rows, tile, iterations)
    return best


def row_walk(length: int, stride: int, elem_bytes: int, rows: int):
    """(sizes, strides) of a shim DMA walk over `rows` rows of `length` elements, `stride`
    elements apart: the row split as [length / w, w] with w at most MAX_WRAP words and
    length / w at most MAX_WRAP (the two wrap-limited dimensions), rows in the third.
    None when `length` has no such split or the rows are not whole 32-bit words."""
    if (length * elem_bytes) % DMA_WORD or (stride * elem_bytes) % DMA_WORD:
        return None
    per_word = max(1, DMA_WORD // elem_bytes)
    for w in reversed(divisors(length)):
        words = w * elem_bytes // DMA_WORD
        if w % per_word or words > MAX_WRAP:
            continue
        if length // w > MAX_WRAP:
            return None
        return (1, rows, length // w, w), (0, stride, w, 1)
    return None


@dataclass(frozen=True)
class Broadcast:
    """How input 1 is repeated over the output (ggml broadcasting).

    `out_ne` is the output shape, `src_ne` input 1's (dense) shape with
    out_ne[d] % src_ne[d] == 0. The element at output index (i0, i1, i2, i3)
    reads input 1 at (i0 % s0, i1 % s1, i2 % s2, i3 % s3).
    """

    out_ne: tuple[int, int, int, int]
    src_ne: tuple[int, int, int, int]

    def source_index(self, flat: int) -> int:
        idx = []
        for n in self.out_ne:
            idx.append(flat % n)
            flat //= n
        off, stride = 0, 1
        for i, s in zip(idx, self.src_ne):
            off += (i % s) * stride
            stride *= s
        return off


def can_repeat(src_ne, out_ne) -> bool:
    return all(o % s == 0 for s, o in zip(src_ne, out_ne))


# --------------------------------------------------------------------------
# MUL_MAT
#
# Shapes off the tile grid: M and N need not be multiples of the array's block.
# The last M block (and the last round of N blocks) starts early, at M - block,
# so it overlaps the block before it: every DMA stays inside the operands, and
# the overlapping outputs are computed twice from the same inputs and written
# twice with the same values. K is never padded: a K step is a divisor of K (a
# sum cannot overlap); the GEMV core functions take any K chunk.


@dataclass(frozen=True)
class Tap:
    """A runtime-sequence DMA access pattern: element offset, 4 sizes and strides."""

    offset: int
    sizes: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]

    def indices(self) -> list[int]:
        return [self.offset + o for o in walk(list(zip(self.sizes, self.strides)))]


def chunks(total: int, limit: int) -> list[tuple[int, int]]:
    out, first = [], 0
    while first < total:
        count = min(limit, total - first)
        out.append((first, count))
        first += count
    return out


def block_starts(total: int, block: int) -> list[int]:
    """Starts of ceil(total / block) blocks covering [0, total), the last one shifted back
    to end at `total` (block <= total)."""
    starts = list(range(0, total - block + 1, block))
    if total % block:
        starts.append(total - block)
    return starts


def round_tasks(total: int, block: int, limit: int = MAX_REPEAT) -> list[tuple[int, int]]:
    """(first element, rounds) of the DMA tasks walking `total` in rounds of `block`: the
    whole rounds in chunks of at most `limit` (MAX_REPEAT), then the shifted last round, if
    any."""
    out = [(first * block, count) for first, count in chunks(total // block, limit)]
    if total % block:
        out.append((total - block, 1))
    return out


def weight_units(elems: int, block: int, block_bytes: int) -> int:
    """DMA units of `elems` weights: elements, or bytes when the weights move as ggml stores
    them (`block` elements in `block_bytes` bytes; 0: not moved as bytes)."""
    if not block_bytes:
        return elems
    return elems // block * block_bytes


@dataclass(frozen=True)
class GemmPlan:
    """C[M,N] = A[M,K] . B[K,N] on `columns` x `rows` cores.

    A is ggml's src1 (M rows of K), B is src0 (N rows of K, i.e. B stored
    column-major) and C is dst (M rows of N). Each core computes m x n output
    tiles, k at a time, with an r x s x t microkernel. Per round the array
    covers a (rows*m) x (columns*n) block of C: row i of the array takes M
    block i, column j takes N block j. Rounds walk N blocks fastest; the last
    M block and the last N round start early when M or N is off the grid.

    A row's m x k A tiles are the same for every column, so A is read once per
    round and broadcast along the array's rows: `a_feeds` shim channels (spread
    over the columns, `a_feed_column`) each stream `a_feed_rows` consecutive
    array rows' tiles to their memory tile, which sends row i's part to the
    cores of row i in every column. B's n x k tiles go to the cores of their
    column (broadcast down the column: through its memory tile, which re-lays
    them, or straight from the shim when the weights move as bytes), C's come
    back through the column's memory tile.
    """

    M: int
    N: int
    K: int
    m: int
    n: int
    k: int
    r: int
    s: int
    t: int
    columns: int
    rows: int
    # Weights moved as bytes (f16 and block-quantized src0, plan_gemm_blocks): `w_block`
    # elements are `w_block_bytes` bytes, B's taps count bytes and a B tile is n rows of the
    # K step's whole blocks, decoded on the core (no memory tile re-layout). 0: B counts
    # elements.
    w_block: int = 1
    w_block_bytes: int = 0
    # A tiles per K step (weights moved as bytes): A comes in m x a_k tiles, a_k = k / a_split,
    # so that a K step of whole 256-value blocks does not need a 256-column A tile in the core.
    a_split: int = 1
    # C tiles a core holds: 2 drain one tile while the next is computed; 1 where a second does
    # not fit beside A and the weights (the core then waits for each tile's drain), so that a
    # larger m decodes each weight tile for more rows.
    c_depth: int = 2
    # Weight tiles a core holds (weights moved as bytes): 2 receive the next K step's while
    # the cores decode this one's; 1 where a second does not fit (each K step then waits for
    # its tile).
    b_depth: int = 2
    # Bytes of an A value (weights moved as bytes): 4 for f32 activations, 2 for bf16 ones.
    a_size: int = 4

    def b_units(self, elems: int) -> int:
        """B's DMA units (elements, or bytes when moved as bytes) of `elems` weights."""
        return weight_units(elems, self.w_block, self.w_block_bytes)

    @property
    def b_tile(self) -> int:
        """B's DMA units per core tile (n x k weights)."""
        return self.n * self.b_units(self.k)

    @property
    def m_block(self) -> int:
        return self.rows * self.m

    @property
    def n_block(self) -> int:
        return self.columns * self.n

    @property
    def m_rounds(self) -> int:
        return -(-self.M // self.m_block)

    @property
    def n_rounds(self) -> int:
        return -(-self.N // self.n_block)

    @property
    def k_steps(self) -> int:
        return self.K // self.k

    @property
    def a_k(self) -> int:
        """Columns of an A tile: the K step, or its part (a_split)."""
        return self.k // self.a_split

    @property
    def a_feeds(self) -> int:
        """Shim channels streaming A: one per array row where there are enough columns (a
        shim tile has two input channels, one of them B's), otherwise groups of rows."""
        return max(d for d in divisors(self.rows) if d <= self.columns)

    @property
    def a_feed_rows(self) -> int:
        """Array rows whose A tiles one feed carries (consecutive rows, split by its memory
        tile)."""
        return self.rows // self.a_feeds

    def a_feed_column(self, feed: int) -> int:
        """The column whose shim and memory tile carry A feed `feed` (its first channel)."""
        return feed * self.columns // self.a_feeds

    @property
    def a_channels(self) -> int:
        """Shim channels per A feed: 2 where a feed carries one array row, the columns leave
        each feed two shims (the next column's second channel is otherwise idle) and the
        weights go straight to the cores (moved as bytes), so that the feed's memory tile has
        input channels for two streams beside the C join's R: each channel then carries half
        of the tile's m rows, which the memory tile joins. The A bytes are the same; the A
        feeds' channels, which bind the prompt's GEMMs, carry half of them each."""
        two = self.a_feed_rows == 1 and self.columns >= 2 * self.a_feeds
        fits = self.w_block_bytes and self.rows + 2 <= MEMTILE_IN_CHANNELS
        return 2 if two and fits and self.m % (2 * self.r) == 0 else 1

    def a_channel_of(self, column: int) -> tuple[int, int] | None:
        """(feed, channel) whose A stream the shim of `column` carries, or None."""
        for g in range(self.a_feeds):
            ch = column - self.a_feed_column(g)
            if 0 <= ch < self.a_channels:
                return g, ch
        return None

    @property
    def tiles_per_core(self) -> int:
        return self.m_rounds * self.n_rounds

    def a_dims(self) -> list[tuple[int, int]]:
        """Memory tile -> core walk of an m x a_k row-major A tile into r x s blocks; with
        two A channels, of each channel's m / 2 rows (IRON walks a join's output one input's
        segment at a time, and the r-row groups of the first half come first either way)."""
        m, k, r, s = self.m // self.a_channels, self.a_k, self.r, self.s
        return [(m // r, r * k), (k // s, s), (r, k), (s, 1)]

    def b_dims(self) -> list[tuple[int, int]]:
        """Memory tile -> core walk of an n x k (K-contiguous) B tile into t x s blocks."""
        n, k, t, s = self.n, self.k, self.t, self.s
        return [(n // t, t * k), (k // s, s), (t, k), (s, 1)]

    def c_dims(self) -> list[tuple[int, int]]:
        """Memory tile -> shim walk of R blocked m x n C tiles into (R*m) x n row-major."""
        m, n, r, t = self.m, self.n, self.r, self.t
        return [(self.rows * m // r, r * n), (r, t), (n // t, r * t), (t, 1)]

    def c_segment_dims(self) -> list[tuple[int, int]]:
        """The same walk per core: one blocked m x n C tile into m x n row-major. IRON walks a
        join's output one input's segment (one transfer) at a time with the same pattern, and
        the R segments follow each other, so this walk over every segment is `c_dims`."""
        m, n, r, t = self.m, self.n, self.r, self.t
        return [(m // r, r * n), (r, t), (n // t, r * t), (t, 1)]

    def m_starts(self) -> list[int]:
        """First row of each M block (the last one shifted back when M is off the grid)."""
        return block_starts(self.M, self.m_block)

    def n_tasks(self) -> list[tuple[int, int]]:
        """(first column, rounds) of the DMA tasks that walk the N rounds of one M block."""
        if self.w_block_bytes and self.n_block * self.b_units(self.K) > MAX_STRIDE_WORDS * DMA_WORD:
            # Consecutive N rounds of the weights are further apart than a DMA stride
            # reaches: one round per task (no repeat, no stride).
            return round_tasks(self.N, self.n_block, 1)
        return round_tasks(self.N, self.n_block)

    def _b_tap(self, off0: int, first: int, count: int) -> Tap:
        """src0's tap for the n rows from `first` over `count` N rounds, K step by K step."""
        K, k, n, C = self.K, self.k, self.n, self.columns
        Kb, kb = self.b_units(K), self.b_units(k)
        # Bytes: a single round has no repeat, so no stride (a round's stride may exceed a DMA
        # stride's 2^20 words, see n_tasks).
        step = C * n * Kb if count > 1 or not self.w_block_bytes else 0
        if self.w_block_bytes and k == K and Kb % DMA_WORD:
            # Whole rows whose bytes are not whole words (q6_K's 210-byte rows): the n dense
            # rows are one run; only the tile need be whole words.
            return Tap(self.b_units(off0) + first * Kb, (count, 1, 1, n * Kb), (step, 0, 0, 1))
        return Tap(self.b_units(off0) + first * Kb, (count, K // k, n, kb), (step, kb, Kb, 1))

    def b_taps(self, batches):
        """src0's taps of `tasks(batches)`, each once: every M block reads the same ones."""
        for off0, _, _ in batches:
            for n0, count in self.n_tasks():
                for col in range(self.columns):
                    yield self._b_tap(off0, n0 + col * self.n, count)

    def tasks(self, batches) -> list[list[tuple[Tap | None, Tap, Tap]]]:
        """The runtime sequence: task groups, each an (A, B, C) tap per array column, A None
        where the column carries no A feed.

        `batches` are the (src0, src1, dst) element offsets of the matrix products. A feed
        (src1) streams its a_feed_rows * m rows x a_k per A tile to its memory tile, once per
        N round (each of its `a_channels` shims its part of the rows); B (src0) n rows x k per
        K step for the column's N block (bytes of whole blocks when moved as bytes, src0's
        offset converted to bytes); C (dst) takes (R*m) x n per round.
        """
        K, N, C, R = self.K, self.N, self.columns, self.rows
        m, n = self.m, self.n
        fm = self.a_feed_rows * m
        cm = fm // self.a_channels  # rows of an A object per channel
        groups = []
        for off0, off1, offd in batches:
            for row0 in self.m_starts():
                for n0, count in self.n_tasks():
                    group = []
                    for col in range(C):
                        first = n0 + col * n
                        a = None
                        feed = self.a_channel_of(col)
                        if feed is not None:
                            g, ch = feed
                            a0 = off1 + (row0 + g * fm + ch * cm) * K
                            ak = self.a_k
                            a = Tap(a0, (count, K // ak, cm, ak), (0, ak, K, 1))
                        b = self._b_tap(off0, first, count)
                        c = Tap(offd + row0 * N + first, (1, count, R * m, n), (0, C * n, N, 1))
                        group.append((a, b, c))
                    groups.append(group)
        return groups


_GEMM_M = (64, 32, 16, 8, 4)
_GEMM_N = (64, 32, 16, 8)
_GEMM_K = (128, 64, 32, 16, 8)
GEMM_K_OVERHEAD = 64  # cycles-equivalent of one k step's FIFO handshakes


def plan_gemm(
    M: int,
    N: int,
    K: int,
    mmul: tuple[int, int, int],
    a_size: int,
    b_size: int,
    c_size: int,
    arch: Arch,
    batches: int = 1,
) -> GemmPlan | None:
    """The cheapest GEMM plan, or None. M >= r and N >= max(8, t) need not be multiples of
    the tiles (the last blocks overlap); K must be a multiple of a K step k (s | k)."""
    r, s, t = mmul
    best, best_key = None, None
    for m in _GEMM_M:
        if m % r or m > M:
            continue
        for n in _GEMM_N:
            if n % t or n > N:
                continue
            for k in _GEMM_K:
                if k % s or K % k:
                    continue
                # Whole DMA words in every contiguous run: A and B rows of k,
                # microkernel blocks of s, C rows of n and blocks of t; and at the
                # start of every row (rows of K in A and B, of N in C).
                if (k * a_size) % DMA_WORD or (k * b_size) % DMA_WORD:
                    continue
                if (s * a_size) % DMA_WORD or (s * b_size) % DMA_WORD:
                    continue
                if (t * c_size) % DMA_WORD or (N * c_size) % DMA_WORD:
                    continue
                l1 = 2 * m * k * a_size + 2 * k * n * b_size + 2 * m * n * c_size
                if l1 > arch.l1_budget:
                    continue
                if m * arch.compute_rows > MAX_WRAP or k > MAX_WRAP * 4:
                    continue
                for rows in (4, 2, 1):
                    if rows > arch.compute_rows or rows * m > M:
                        continue
                    for columns in range(arch.columns, 0, -1):
                        if columns * n > N:
                            continue
                        plan = GemmPlan(M, N, K, m, n, k, r, s, t, columns, rows)
                        if not _gemm_dma_ok(plan, batches):
                            continue
                        macs = m * n * k // (r * s * t)
                        cost = gemm_cycles(plan, macs, a_size, K * b_size, c_size, arch)
                        key = (cost, -(m * n * k))
                        if best_key is None or key < best_key:
                            best, best_key = plan, key
                        break  # the most columns that fit N
    return best


# K steps of the GEMM over weights moved as bytes: whole blocks, at most this many values (a
# core holds n rows of a K step's weight bytes, double-buffered).
GEMM_BLOCKS_MAX_K = 512
# A tiles per K step at most (the core's loop over them is unrolled in its program).
GEMM_MAX_A_SPLIT = 16
# Vector ALU ops per 32 weights decoded (block_decode.h's piece and its staging in mmq.cc; about
# 20 for Q4_0, counted through the AIE-API stand-in), the cores' binding unit in the cost.
GEMM_DECODE_ALU = 20


def gemm_blocks_l1(
    m: int,
    n: int,
    k: int,
    t: int,
    w_block: int,
    w_block_bytes: int,
    a_k: int,
    depths: tuple[int, int] = (2, 2),
    a_size: int = 4,
) -> int:
    """Core data memory of a GEMM over weights moved as bytes (mmq.cc): A (m x a_k f32,
    rounded to bf16 in place, or bf16: `a_size` bytes a value) double-buffered, the weight
    bytes (n rows of k / w_block blocks) and C (m x n f32) `depths` times each, and in the
    core's static data one decoded column block of an A tile's columns (t x a_k bf16) and,
    where a block spans A tiles, the tile's blocks' scales (32 bf16 each)."""
    kw = k // w_block * w_block_bytes
    kept = n * (k // w_block) * 64 if a_k < w_block else 0
    b_depth, c_depth = depths
    a = 2 * m * a_k * a_size
    return a + b_depth * n * kw + c_depth * m * n * 4 + t * a_k * 2 + kept


def gemm_blocks_memtile(p: GemmPlan) -> int:
    """Memory tile bytes of a column carrying an A feed: the A ring (a_feed_rows * m x a_k
    values of a_size bytes) and the joined C ring (R*m x n f32), each double-buffered (the
    weights go from the shim to the cores)."""
    return 2 * p.a_feed_rows * p.m * p.a_k * p.a_size + 2 * p.rows * p.m * p.n * 4


# Bytes per cycle of a DMA channel, shim, memory tile or core (AM020: 32 bits per cycle).
CHANNEL_BYTES = 4


def gemm_cycles(
    p: GemmPlan, compute: int, a_size: int, b_row_bytes: int, c_size: int, arch: Arch
) -> int:
    """A GEMM plan's cycles as the planners weigh them: the slowest of a core's kernel calls
    (one per A tile: its `compute` cycles, or its A tile or its share of B arriving over its
    input channels; with one C tile, each tile's drain besides), an A feed's shim channels and
    the memory tile channel sending an array row its A tiles, a column's B and C shim channels,
    and the DRAM all of them share (`b_row_bytes`: one of B's rows of K)."""
    a_tile = p.m * p.a_k * a_size
    b_tile = p.n * b_row_bytes // p.k_steps // p.a_split
    step = max(compute, a_tile // CHANNEL_BYTES, b_tile // CHANNEL_BYTES) + GEMM_K_OVERHEAD
    drain = p.m * p.n * c_size // CHANNEL_BYTES if p.c_depth == 1 else 0
    # One weight tile: each K step waits for its tile.
    wait = p.n * b_row_bytes // p.k_steps // CHANNEL_BYTES if p.b_depth == 1 else 0
    rounds = p.m_rounds * p.n_rounds
    a_row = rounds * p.m * p.K * a_size
    a_feed = a_row * p.a_feed_rows // p.a_channels
    b_col = rounds * p.n * b_row_bytes
    c_col = rounds * p.rows * p.m * p.n * c_size
    dram = a_row * p.rows + (b_col + c_col) * p.columns
    return int(
        max(
            p.tiles_per_core * (p.k_steps * (p.a_split * step + wait) + drain),
            max(a_row, a_feed, b_col, c_col) / CHANNEL_BYTES,
            dram / arch.dram_bytes_per_cycle,
        )
    )


def plan_gemm_blocks(
    M: int,
    N: int,
    K: int,
    mmul: tuple[int, int, int],
    w_block: int,
    w_block_bytes: int,
    arch: Arch,
    batches,
    a_size: int = 4,
) -> GemmPlan | None:
    """The cheapest GEMM plan over weights moved as bytes (`w_block` elements in
    `w_block_bytes` bytes: f16, block-quantized types) with f32 (`a_size` 4) or bf16 (2)
    activations and f32 results, or None. `batches` are the (src0, src1, dst) element offsets of the matrix products (src0's
    are converted to bytes; every weight tap is checked for whole, aligned DMA words).

    A K step k is whole blocks (256 values for the K-quants), a multiple of 16 (the decoder's
    groups) and of s, dividing K. A tile's weight rows are word runs (k's bytes and a row's
    bytes whole words), or, with k = K, the n dense rows are one run of whole words (q6_K's
    210-byte rows, n even). A comes in a_split tiles of a_k columns per K step (whole 32-value
    pieces, f16: 16 values). Core memory (`gemm_blocks_l1`) within the 48 KiB budget, memory
    tile (`gemm_blocks_memtile`) within its 512 KiB."""
    r, s, t = mmul
    if K % w_block:
        return None
    row_bytes = K // w_block * w_block_bytes
    best, best_key = None, None
    k_options = [
        w_block * d
        for d in divisors(K // w_block)
        if w_block * d <= GEMM_BLOCKS_MAX_K and (w_block * d) % 16 == 0 and (w_block * d) % s == 0
    ]
    for m in _GEMM_M:
        if m % r or m > M:
            continue
        for n in _GEMM_N:
            if n % t or n > N:
                continue
            for k in k_options:
                kw = k // w_block * w_block_bytes
                if k == K and row_bytes % DMA_WORD:
                    if (n * kw) % DMA_WORD or n * kw > DMA_WORD * MAX_WRAP:
                        continue
                elif kw % DMA_WORD or row_bytes % DMA_WORD or kw > DMA_WORD * MAX_WRAP:
                    continue
                if k > MAX_WRAP or m * arch.compute_rows > MAX_WRAP:
                    continue
                for a_split in divisors(k // (32 if w_block >= 32 else VECTOR_ELEMS)):
                    a_k = k // a_split
                    if a_split > GEMM_MAX_A_SPLIT or a_k % s:
                        continue
                    # Two weight and two C tiles where they fit, else one C tile, else one
                    # of each.
                    depths = next(
                        (
                            d
                            for d in ((2, 2), (2, 1), (1, 1))
                            if gemm_blocks_l1(m, n, k, t, w_block, w_block_bytes, a_k, d, a_size)
                            <= arch.l1_budget
                        ),
                        None,
                    )
                    if depths is None:
                        continue
                    b_depth, c_depth = depths
                    # Per A tile every core decodes its share of the column's n weight rows
                    # (vector ALU, beside the MACs) and rounds an f32 tile to bf16.
                    macs = m * n * a_k // (r * s * t)
                    rounding = m * a_k // VECTOR_ELEMS if a_size == 4 else 0
                    compute = max(macs, n * a_k * GEMM_DECODE_ALU // 32 + rounding)
                    for rows in (4, 2, 1):
                        if rows > arch.compute_rows or rows * m > M:
                            continue
                        for columns in range(arch.columns, 0, -1):
                            if columns * n > N:
                                continue
                            plan = GemmPlan(
                                *(M, N, K, m, n, k, r, s, t, columns, rows),
                                *(w_block, w_block_bytes, a_split),
                                c_depth=c_depth,
                                b_depth=b_depth,
                                a_size=a_size,
                            )
                            if gemm_blocks_memtile(plan) > arch.memtile_bytes:
                                continue
                            if not _gemm_dma_ok(plan, len(batches)):
                                continue
                            if not all(_byte_tap_ok(b) for b in plan.b_taps(batches)):
                                continue
                            cost = gemm_cycles(plan, compute, a_size, row_bytes, 4, arch)
                            key = (cost, a_split, -(m * n * k))
                            if best_key is None or key < best_key:
                                best, best_key = plan, key
                            break  # the most columns that fit N
    return best


def _gemm_dma_ok(p: GemmPlan, batches: int) -> bool:
    if p.K // p.a_k > MAX_WRAP or p.rows * p.m > MAX_WRAP or p.n > MAX_WRAP:
        return False
    tasks = batches * p.m_rounds * len(p.n_tasks())
    return tasks <= MAX_TASKS_PER_CHANNEL


@dataclass(frozen=True)
class RopeRows:
    """RMS_NORM_MUL_MAT_ROPE(_FF)'s rotation as the GEMV plan sees it: the product's N rows
    are heads of `head` rows (ggml's [D, H] view of a token's product), the first `n_dims` of
    each rotated in pairs, (2i, 2i + 1), or (i, i + n_dims/2) with `neox`. Every core's rows of
    a round must hold whole pairs (`rounds_ok`). Once per dispatch the x channel carries, behind
    n, `ff` frequency factors (0 without), with `head_norm` the head norm's `head` weights, and
    the positions of the `tokens` x rows as 32-bit words, padded to whole x objects
    (GemvPlan.rope_taps). `head_norm` (RMS_NORM_MUL_MAT_HEAD_NORM_ROPE): each head is
    normalised before its rotation, so every core's rows of a round must be whole heads."""

    head: int
    n_dims: int
    neox: bool
    tokens: int
    ff: int = 0
    head_norm: bool = False

    @property
    def head_norm_words(self) -> int:
        """Words of the head norm's weights among the constants (0 without)."""
        return self.head if self.head_norm else 0

    @property
    def words(self) -> int:
        """32-bit words of the per-dispatch constants: the factors, the head norm's weights,
        then the positions."""
        return self.ff + self.head_norm_words + self.tokens

    def objects(self, kc: int) -> int:
        """x objects (kc values each) of the constants."""
        return -(-self.words // kc)

    def splits(self, row: int) -> bool:
        """Whether a boundary between two cores' rows before `row` separates a pair."""
        d = row % self.head
        if d == 0:
            return False
        if self.head_norm:
            return True
        if d >= self.n_dims:
            return False
        return self.neox or d % 2 == 1

    def rounds_ok(self, N: int, block: int, nr: int) -> bool:
        """Every core's nr rows of every round (GemvPlan's rounds of `block` rows over N, the
        last one shifted back when N is off the block) hold whole pairs."""
        for start in block_starts(N, block):
            if any(self.splits(start + j * nr) for j in range(block // nr + 1)):
                return False
        return True

    def row_options(self) -> tuple[int, ...]:
        """Rows per core (nr) the planner tries besides its usual ones: a head and two, so
        that rounds can hold whole heads (a NeoX head's span) when a head is not one of them."""
        return tuple(m * self.head for m in (1, 2) if m * self.head <= MAX_WRAP)


def rope_array_floats(rope: RopeRows) -> int:
    """rope_math.h's six arrays of n_dims/2 f32 padded to 16 (the frequency factors, the
    cos/sin cache, the theta table, two pair staging buffers), in f32."""
    return 6 * (-(-(rope.n_dims // 2) // VECTOR_ELEMS) * VECTOR_ELEMS)


def mv_rope_bytes(rope: RopeRows) -> int:
    """RMS_NORM_MUL_MAT_ROPE(_FF)'s static data on a core (mv_rope.h, rope_math.h): the six
    arrays, the positions and the counters; the head norm's weights."""
    head_pad = -(-rope.head_norm_words // VECTOR_ELEMS) * VECTOR_ELEMS
    return 4 * rope_array_floats(rope) + 4 * rope.tokens + 4 * head_pad + 16


@dataclass(frozen=True)
class GemvPlan:
    """y[N] = W[N,K] . x[K] for each of a list of x rows (ggml MUL_MAT with few src1 rows).

    W is src0. Per round the array covers a block of C*R*nr rows of W: worker (c, r)
    computes `rows_per_tile` outputs starting at row round_start + c*R*nr + r*nr, walking
    K in chunks of `k_chunk`. The last round starts early when N is off the grid.

    `glu` (MUL_MAT_<glu>, two weight matrices of one layout, W_g and W_u): per round the W
    channel carries the round's tile of W_g, then the same tile of W_u (two DMA tasks per
    round: two runtime buffers, one fifo), x goes twice (one tap repeating it) and y once.

    `add` (MUL_MAT_ADD, y = W . x + r): per round the x channel carries the x row's K chunks,
    then one more object of kc values, the column's R*nr values of r for the round's rows
    (one task) padded with x's first values (a second task, unless R*nr == kc), which the
    cores ignore; core i adds values i*nr .. (i+1)*nr to its y before releasing it. Rounds
    never overlap (N is whole rounds): with the output in r's memory (an ADD in place, which
    the request cannot tell), a shifted last round would read r's rows already written.

    `norm` (RMS_NORM_MUL_MAT(_<glu>)): the x channel first carries the norm weight n once per
    dispatch, K // kc objects (`norm_tap`, one task ahead of the first group's x), which every
    core keeps aside (mv_norm.h); the rounds then run as without it.

    `rope` (RMS_NORM_MUL_MAT_ROPE(_FF), with `norm`): behind n the x channel carries the
    rotation's per-dispatch constants in whole x objects (`rope_taps`), which every core keeps
    (mv_rope.h); each core's rows of a round hold whole rotation pairs (RopeRows.rounds_ok),
    rotated at the end of the round.

    `bias` (RMS_NORM_MUL_MAT[_BIAS...]'s one row of values added to every product, qwen2's Q, K
    and V biases): behind n (and `rope`'s constants) the x channel carries, once per dispatch,
    the column's R*nr values of every round (`bias_taps`), padded to whole x objects; each core
    keeps its nr values of each round (mv_bias.h) and adds them after the norm's scale, before
    a rotation. Rounds are whole (N a multiple of the block), so that a column's values of all
    its rounds are one tap.

    `shared_x` (MUL_MAT's plain GEMV): x goes to every core from one shim channel (the first
    array column's second), so that W streams over every other shim channel: `columns` are
    then W channels, 2 A - 1 of them on A array columns, `rows` cores each (at most half a
    column's): channel 0 on array column 0 (its first cores), channels 2a - 1 and 2a on array
    column a (`array_tile`). Every column's x taps are the same (one x row), issued once.

    `nx` (GEMVs of block-quantized weights over a few src1 rows, a decode step of several
    tokens): each x object holds the K chunk of nx x rows (`x_row` elements apart)
    and each y object a core's nr sums of each, so that a W tile, streamed and decoded once,
    serves nx products; a product group's y rows are `y_row` elements apart. With `add` the r
    object of a round holds nx runs of the column's R*nr values (r's rows `r_row` elements
    apart), then the padding; with `norm` each n object holds nx chunks of n (`norm_taps`);
    with `rope` each row's run is rotated by its own token's position.
    """

    N: int
    K: int
    columns: int
    rows: int
    rows_per_tile: int  # nr
    k_chunk: int  # kc
    # Weights moved as bytes (f16 and block-quantized src0): `w_block` elements are
    # `w_block_bytes` bytes, and W's taps count bytes. 0: W counts elements.
    w_block: int = 1
    w_block_bytes: int = 0
    glu: bool = False
    w_size: int = 0  # bytes of a W DMA unit (0: not known, no stride limit applied)
    # W's row stride in W units (src0's nb[1] over the unit's bytes): a strided src0 (a view,
    # a permuted tensor) with dense rows. 0: dense, rows w_units(K) apart.
    w_row: int = 0
    add: bool = False
    norm: bool = False
    rope: RopeRows | None = None
    shared_x: bool = False
    bias: bool = False
    nx: int = 1
    x_row: int = 0
    y_row: int = 0
    r_row: int = 0
    # bf16 weights against f32 x: the core rounds each K chunk of x to bf16 once (mv.cc's
    # MV_X_BF16, as ggml's CPU backend does) and keeps the copy (`x_copy_bytes`).
    x_bf16: bool = False

    def passes(self, products: int) -> int:
        """Passes over the weights for `products` x rows (nx at a time)."""
        return -(-products // self.nx)

    @property
    def array_columns(self) -> int:
        """Columns of the array the plan uses."""
        return (self.columns + 2) // 2 if self.shared_x else self.columns

    def array_tile(self, col: int) -> tuple[int, int]:
        """(array column, first core of it) of the plan's column col."""
        if not self.shared_x:
            return col, 0
        return (col + 1) // 2, self.rows if col > 0 and col % 2 == 0 else 0

    def w_units(self, elems: int) -> int:
        """W's DMA units (elements, or bytes when moved as bytes) of `elems` weights."""
        return weight_units(elems, self.w_block, self.w_block_bytes)

    @property
    def r_pad(self) -> int:
        """`add`: the values of x padding each round's r object (nx (kc - R*nr))."""
        return self.nx * (self.k_chunk - self.rows * self.rows_per_tile)

    def norm_tap(self) -> Tap:
        """`norm`: n's K values in K chunks, one task on the x channel per dispatch."""
        kc = self.k_chunk
        return Tap(0, (1, 1, self.K // kc, kc), (0, 0, kc, 1))

    @property
    def norm_objects(self) -> int:
        """`norm`: x objects carrying n (nx chunks each)."""
        return -(-self.k_steps // self.nx)

    def norm_taps(self) -> list[tuple[str, Tap]]:
        """`norm`: the tasks carrying n on the x channel, once per dispatch: ("n", n's K values,
        `norm_tap`), then with `nx` ("x", x's first chunks padding the last object; fewer than
        nx chunks, within x's nx rows, while n may be shorter)."""
        pad = (self.norm_objects * self.nx - self.k_steps) * self.k_chunk
        return [("n", self.norm_tap())] + [("x", tap) for tap in self._padding(pad)]

    @property
    def rope_objects(self) -> int:
        """`rope`: x objects of the per-dispatch constants (0 without)."""
        return self.rope.objects(self.nx * self.k_chunk) if self.rope else 0

    def rope_taps(self) -> list[tuple[str, Tap]]:
        """`rope`: the constants' tasks on the x channel, behind n's: ("ff", the frequency
        factors), ("hn", the head norm's weights), ("pos", the tokens' positions), then ("n",
        n's first values padding the last object; with `nx`, "x": x's first values, in K
        chunks then the rest), each one linear walk of 32-bit words."""
        r = self.rope
        if r is None:
            return []
        out = [("ff", Tap(0, (1, 1, 1, r.ff), (0, 0, 0, 1)))] if r.ff else []
        if r.head_norm:
            out.append(("hn", Tap(0, (1, 1, 1, r.head), (0, 0, 0, 1))))
        out.append(("pos", Tap(0, (1, 1, 1, r.tokens), (0, 0, 0, 1))))
        pad = self.rope_objects * self.nx * self.k_chunk - r.words
        # nx rows: x's first values (within its nx rows, while n may be shorter).
        source = "n" if self.nx == 1 else "x"
        return out + [(source, tap) for tap in self._padding(pad)]

    @property
    def bias_objects(self) -> int:
        """`bias`: x objects of the column's values (0 without)."""
        if not self.bias:
            return 0
        return -(-self.rounds * self.rows * self.rows_per_tile // (self.nx * self.k_chunk))

    def bias_taps(self, col: int) -> list[tuple[str, Tap]]:
        """`bias`: the tasks on column col's x channel behind the rotation's constants: ("b",
        the column's R*nr values of each round), then ("x", x's first values padding the last
        object)."""
        if not self.bias:
            return []
        cr = self.rows * self.rows_per_tile
        out = [("b", Tap(col * cr, (1, 1, self.rounds, cr), (0, 0, self.block, 1)))]
        pad = self.bias_objects * self.nx * self.k_chunk - self.rounds * cr
        return out + [("x", tap) for tap in self._padding(pad)]

    def _padding(self, words: int) -> list[Tap]:
        """The taps of a source's first `words` words padding the last x object: one run, or
        with `nx` (fewer than nx*kc words, past a DMA wrap) K chunks, then the rest."""
        if not words:
            return []
        if self.nx == 1:
            return [Tap(0, (1, 1, 1, words), (0, 0, 0, 1))]
        kc = self.k_chunk
        chunks, rest = divmod(words, kc)
        taps = [Tap(0, (1, 1, chunks, kc), (0, 0, kc, 1))] if chunks else []
        return taps + ([Tap(chunks * kc, (1, 1, 1, rest), (0, 0, 0, 1))] if rest else [])

    @property
    def x_tasks_per_round(self) -> int:
        """`add`: DMA tasks per round on the x channel (x, r, and the padding if any)."""
        return 3 if self.r_pad else 2

    @property
    def row_stride(self) -> int:
        """W units from one row of W to the next."""
        return self.w_row or self.w_units(self.K)

    @property
    def whole_rows(self) -> bool:
        """A core's tile is whole W rows (K is not chunked): its rows are one contiguous run,
        so a row need not be whole DMA words, only the tile."""
        return self.k_chunk == self.K

    @property
    def block(self) -> int:
        return self.columns * self.rows * self.rows_per_tile

    @property
    def rounds(self) -> int:
        return -(-self.N // self.block)

    @property
    def k_steps(self) -> int:
        return self.K // self.k_chunk

    def round_tasks(self) -> list[tuple[int, int]]:
        """(first row, rounds) of the DMA tasks that walk the rounds of one x row: runs of
        up to MAX_REPEAT rounds, or GLU_GROUP_ROUNDS with `glu` (a group's tasks then fit the
        shim tile's buffer descriptors: 2 W tasks per round, x and y)."""
        if self.glu:
            # `norm`: the first group's x channel also carries n's task.
            return round_tasks(self.N, self.block, GLU_GROUP_ROUNDS - self.norm)
        limit = MAX_REPEAT
        if self.add:
            # A group's x-channel tasks per round, W and y within the shim's descriptors.
            limit = (SHIM_GROUP_TASKS - 2) // self.x_tasks_per_round
        round_bytes = self.block * self.row_stride * self.w_size
        if round_bytes > MAX_STRIDE_WORDS * DMA_WORD:
            # Consecutive rounds of W are further apart than a DMA stride reaches: one round
            # per task (its repeat dimension has size 1 and no stride).
            return round_tasks(self.N, self.block, 1)
        return round_tasks(self.N, self.block, limit)

    def w_tasks(self, products: int) -> int:
        """DMA tasks on a column's W channel over `products` matrix-vector products (the
        busiest shim channel)."""
        passes = self.passes(products)
        if self.glu:
            return passes * 2 * self.rounds
        if self.add:
            # The x channel's tasks per round outnumber W's.
            return passes * self.rounds * self.x_tasks_per_round
        return passes * len(self.round_tasks())

    def _w_tap(self, w_off: int, row0: int, count: int) -> Tap:
        K, R, nr, kc = self.K, self.rows, self.rows_per_tile, self.k_chunk
        Kw, kcw, row = self.w_units(K), self.w_units(kc), self.row_stride
        # One round (every GLU task): no repeat, so no stride (a round's stride can exceed
        # the DMA's 2^20 words: 4096 rows of K = 4096 q4_0 weights apart).
        step = self.block * row if count > 1 else 0
        if self.w_block_bytes and self.whole_rows:
            if row == Kw:
                # R*nr whole dense rows: one contiguous run per round.
                return Tap(w_off + row0 * Kw, (count, 1, 1, R * nr * Kw), (step, 0, 0, 1))
            # Strided rows: R*nr runs of a whole row each (then rows must be whole words).
            return Tap(w_off + row0 * row, (count, 1, R * nr, Kw), (step, 0, row, 1))
        return Tap(w_off + row0 * row, (count, K // kc, R * nr, kcw), (step, kcw, row, 1))

    def w_tap_rows(self):
        """(first row, rounds) of each W tap `tasks` issues for one product."""
        R, nr = self.rows, self.rows_per_tile
        for r0, count in self.round_tasks():
            for col in range(self.columns):
                row0 = r0 + col * R * nr
                if self.glu:
                    yield from ((row0 + i * self.block, 1) for i in range(count))
                else:
                    yield row0, count

    def tasks(self, products) -> list[list[tuple]]:
        """Task groups, each a (W, x, y) tap per array column; `products` are the (src0,
        src1, dst) element offsets of each matrix-vector product (one per src1 row).

        With `glu`: each a (Ws, x, y) per column, Ws one W tap per round of the group (one
        round each), each issued on W_g and then on W_u; x repeats the row twice per round.

        With `add` (products are (src0, src1, dst, r) offsets): each a (W, x, y, rs, pad) per
        column, x one round's K chunks, rs one r tap per round (the column's R*nr values of
        the round's rows), pad the x values padding each r object (None when R*nr == kc); the
        x channel takes, per round, x, its r tap, then pad.

        With `nx` the products go nx at a time: each tap carries the nx rows (per x object the
        K chunk of every row; per y object and r object a core's nr or a column's R*nr values
        of each)."""
        K, C, R, nr, kc = self.K, self.columns, self.rows, self.rows_per_tile, self.k_chunk
        nx, block = self.nx, self.block
        per_round = 2 if self.glu else 1

        def x_tap(x_off: int, repeat: int) -> Tap:
            # One row: its K chunks; nx rows: per K chunk each row's.
            if nx == 1:
                return Tap(x_off, (repeat, 1, K // kc, kc), (0, 0, kc, 1))
            return Tap(x_off, (repeat, K // kc, nx, kc), (0, kc, self.x_row, 1))

        groups = []
        for w_off, x_off, y_off, *r_off in products[::nx]:
            for r0, count in self.round_tasks():
                group = []
                for col in range(C):
                    row0 = r0 + col * R * nr
                    if self.glu:
                        w = tuple(self._w_tap(w_off, row0 + i * block, 1) for i in range(count))
                    else:
                        w = self._w_tap(w_off, row0, count)
                    if nx > 1:
                        y = Tap(y_off + row0, (count, R, nx, nr), (block, nr, self.y_row, 1))
                    else:
                        y = Tap(y_off + row0, (1, 1, count, R * nr), (0, 0, block, 1))
                    if self.add:
                        x = x_tap(x_off, 1)
                        rs = tuple(
                            Tap(
                                r_off[0] + row0 + i * block,
                                (1, 1, nx, R * nr),
                                (0, 0, self.r_row, 1),
                            )
                            for i in range(count)
                        )
                        cols = kc - R * nr
                        pad = Tap(x_off, (1, 1, nx, cols), (0, 0, cols, 1)) if cols else None
                        group.append((w, x, y, rs, pad))
                        continue
                    group.append((w, x_tap(x_off, per_round * count), y))
                groups.append(group)
        return groups


GEMV_MAX_CHUNK_WORDS = MAX_WRAP  # a K chunk is one run of a DMA dimension
# Buffer descriptors of a shim tile and of a memory tile (AM020), and those every design
# leaves free (emu/program.py's BD_MARGIN: a transfer the real toolchain splits into more BDs
# than counted).
SHIM_BDS = 16
MEM_BDS = 48
BD_MARGIN = 2
# DMA tasks a shim tile may have in flight between a task group's issue and its finish() (a
# task holds its BD until then).
SHIM_GROUP_TASKS = SHIM_BDS - BD_MARGIN
# MUL_MAT_<glu>: rounds per task group, whose 2 W tasks per round, x and y must fit
# SHIM_GROUP_TASKS: 2 * 6 + 2.
GLU_GROUP_ROUNDS = (SHIM_GROUP_TASKS - 2) // 2


def mv_norm_bytes(K: int, kc: int, nx: int = 1) -> int:
    """RMS_NORM_MUL_MAT(_<glu>)'s static data on a core (mv_norm.h): n's K chunks each padded
    to 16 f32, the normalised chunk (one row; `nx` rows are normalised in their x object), the
    sums of squares of each row, and two counters."""
    pad = -(-kc // VECTOR_ELEMS) * VECTOR_ELEMS
    copy = 1 if nx == 1 else 0
    return (K // kc + copy) * pad * 4 + nx * VECTOR_ELEMS * 4 + 8


def mv_bias_bytes(plan: GemvPlan) -> int:
    """`bias`: a core's nr values of each round (mv_bias.h, padded to 16 f32) and two
    counters."""
    return -(-plan.rounds * plan.rows_per_tile // VECTOR_ELEMS) * VECTOR_ELEMS * 4 + 8


def _norm_ok(plan: GemvPlan, products: int) -> bool:
    """`norm`: n's task (and `rope`'s constants' and `bias`'s tasks) fit the x channel's DMA
    tasks."""
    prologue = len(plan.norm_taps()) + len(plan.rope_taps()) + len(plan.bias_taps(0))
    x_tasks = plan.passes(products) * len(plan.round_tasks()) + prologue
    return not plan.norm or x_tasks <= MAX_TASKS_PER_CHANNEL


def _bias_ok(plan: GemvPlan, l1: int, budget: int) -> bool:
    """`bias` (with `norm`): whole rounds, and the kept values within the core's memory."""
    if not plan.bias:
        return True
    return plan.N % plan.block == 0 and l1 + mv_bias_bytes(plan) <= budget


GEMV_ROWS = (64, 32, 16, 8, 4, 2, 1)  # rows per core (nr) the GEMV planners try


def _row_options(rope: RopeRows | None) -> tuple[int, ...]:
    """nr values to try, largest first: GEMV_ROWS, and with `rope` a head and two."""
    if rope is None:
        return GEMV_ROWS
    return tuple(sorted(set(GEMV_ROWS) | set(rope.row_options()), reverse=True))


def _rows_ok(N: int, columns: int, rows: int, nr: int, rope: RopeRows | None) -> bool:
    """A column's rows of a round are one wrap-limited DMA dimension of W's taps (R*nr; only
    `rope`'s rows per core of whole heads reach it); `rope`: every core's rows of every round
    hold whole rotation pairs."""
    if rows * nr > MAX_WRAP:
        return False
    return rope is None or rope.rounds_ok(N, columns * rows * nr, nr)


def _add_ok(N: int, rows: int, nr: int, block: int, kc: int) -> bool:
    """MUL_MAT_ADD (GemvPlan.add): whole rounds (no shifted last round) and a round's r
    values for a column within one x object."""
    return N % block == 0 and rows * nr <= kc


def plan_gemv(
    N: int,
    K: int,
    w_size: int,
    x_size: int,
    y_size: int,
    arch: Arch,
    products: int = 1,
    glu: bool = False,
    w_row: int = 0,
    add: bool = False,
    stash: bool = False,
    norm: bool = False,
    rope: RopeRows | None = None,
    shared_x: bool = False,
    bias: bool = False,
    x_bf16: bool = False,
) -> GemvPlan | None:
    """The cheapest GEMV plan for `products` matrix-vector products, or None. Any N; K
    chunks are divisors of K whose W and x runs are whole DMA words (any K for f32).
    `glu`: MUL_MAT_<glu> (GemvPlan.glu; the core also keeps its stash of nr f32). `w_row`:
    W's row stride in elements when src0 is strided (GemvPlan.w_row; 0: dense). `add`:
    MUL_MAT_ADD (GemvPlan.add: whole rounds, R*nr <= kc). `stash`: the core sums in its
    stash of nr f32 (an f16 output, rounded once per round: mv_stash.h). `norm`:
    RMS_NORM_MUL_MAT(_<glu>) (GemvPlan.norm; the core also keeps n, mv_norm_bytes). `rope`:
    RMS_NORM_MUL_MAT_ROPE(_FF) (GemvPlan.rope, with `norm`; whole rotation pairs per core and
    round, the core also keeps mv_rope_bytes). `shared_x`: GemvPlan.shared_x plans only.
    `bias`: GemvPlan.bias (with `norm`: whole rounds, the core also keeps mv_bias_bytes).
    `x_bf16`: GemvPlan.x_bf16 (the core also keeps a bf16 copy of x's chunk)."""
    if (K * w_size) % DMA_WORD or (K * x_size) % DMA_WORD:
        return None
    best, best_key = None, None
    k_options = [
        d
        for d in divisors(K)
        if (d * w_size) % DMA_WORD == 0
        and (d * x_size) % DMA_WORD == 0
        and d * max(w_size, x_size) <= DMA_WORD * GEMV_MAX_CHUNK_WORDS
    ]
    for columns, rows in _gemv_shapes(arch, shared_x):
        for nr in _row_options(rope):
            if columns * rows * nr > N or (nr * y_size) % DMA_WORD:
                continue
            if not _rows_ok(N, columns, rows, nr, rope):
                continue
            for kc in reversed(k_options):
                l1 = 2 * nr * kc * w_size + 2 * kc * x_size + 2 * nr * y_size
                l1 += bf16_copy_bytes(kc) if x_bf16 else 0
                l1 += stash_bytes(nr) if glu or stash else 0
                l1 += mv_norm_bytes(K, kc) if norm else 0
                l1 += mv_rope_bytes(rope) if rope else 0
                if l1 > arch.l1_budget or nr > MAX_WRAP or K // kc > MAX_WRAP:
                    continue
                if add and not _add_ok(N, rows, nr, columns * rows * nr, kc):
                    continue
                plan = GemvPlan(
                    N,
                    K,
                    columns,
                    rows,
                    nr,
                    kc,
                    glu=glu,
                    w_size=w_size,
                    w_row=w_row,
                    add=add,
                    norm=norm,
                    rope=rope,
                    shared_x=shared_x,
                    bias=bias,
                    x_bf16=x_bf16,
                )
                if plan.w_tasks(products) > MAX_TASKS_PER_CHANNEL:
                    continue
                if not _norm_ok(plan, products) or not _bias_ok(plan, l1, arch.l1_budget):
                    continue
                key = (gemv_core_cycles(plan), -columns * rows)
                if best_key is None or key < best_key:
                    best, best_key = plan, key
                break  # the largest K chunk that fits
    return best


def _gemv_shapes(arch: Arch, shared_x: bool):
    """(columns, rows) a GEMV plan may take, the most cores first: the array's columns and
    cores, or with `shared_x` (GemvPlan.shared_x) W channels on two array columns or more,
    at most half a column's cores each."""
    if not shared_x:
        return [(c, r) for c in range(arch.columns, 0, -1) for r in (4, 2, 1)]
    rows = [r for r in (2, 1) if 2 * r <= arch.compute_rows]
    return [(2 * a - 1, r) for a in range(arch.columns, 1, -1) for r in rows]


def gemv_core_cycles(plan: GemvPlan) -> int:
    """The planners' estimate of a GEMV core's calls for one product: per round and K chunk,
    a vector per row and VECTOR_ELEMS of the chunk, and a call's overhead."""
    vectors = -(-plan.k_chunk // VECTOR_ELEMS)
    return plan.rounds * plan.k_steps * (plan.nx * plan.rows_per_tile * vectors + 64)


def gemv_cycles(plan: GemvPlan, products: int, arch: Arch) -> float:
    """A GEMV's array cycles as its busiest resource sets them: a core's calls
    (gemv_core_cycles), a W channel's bytes at CHANNEL_BYTES per cycle, or all the weights'
    bytes through the DRAM."""
    core = gemv_core_cycles(plan)
    round_bytes = plan.rows * plan.rows_per_tile * plan.w_units(plan.K) * max(plan.w_size, 1)
    channel = plan.rounds * round_bytes / CHANNEL_BYTES
    dram = plan.rounds * plan.columns * round_bytes / arch.dram_bytes_per_cycle
    return -(-products // plan.nx) * max(core, channel, dram)


def bf16_copy_bytes(kc: int) -> int:
    """A K chunk of x in bf16 as a GEMV core keeps it (g_xb of mvq.cc and mv.cc), 64-byte
    aligned."""
    return -(-kc * 2 // 64) * 64


def mvq_x_bytes(w_block: int, kc: int) -> int:
    """The bf16 copy of a K chunk of x that the GEMV core keeps for block-quantized weights
    (kernels/mvq.cc's g_xb); 0 for the others (f16: w_block 1)."""
    return bf16_copy_bytes(kc) if w_block > 1 else 0


def x_copy_bytes(plan: "GemvPlan") -> int:
    """The bf16 copies of a K chunk of x the GEMV core keeps: one per x row with
    block-quantized weights (mvq.cc), one with bf16 weights against f32 x (mv.cc)."""
    if plan.x_bf16:
        return bf16_copy_bytes(plan.k_chunk)
    return plan.nx * mvq_x_bytes(plan.w_block, plan.k_chunk)


def stash_bytes(nr: int) -> int:
    """A GEMV core's stash of nr f32 sums (mv_stash.h, 64-byte aligned): MUL_MAT_<glu>'s gate
    sums, or the sums of an f16 output."""
    return -(-nr * 4 // 64) * 64


def _w_taps(plan: GemvPlan, offsets):
    """The W taps of products whose src0 offsets are `offsets` modulo a DMA word, as far as
    `_byte_tap_ok` can tell them apart: a tap's shape depends on its rounds, its offset on
    src0's offset and its first row, and the check reads the offset modulo a DMA word. So one
    tap per residue and rounds (a planner checks every candidate plan this way; plan.tasks
    lists thousands per plan: every round of every src1 row)."""
    seen = set()
    for first, count in plan.w_tap_rows():
        key = ((first * plan.row_stride) % DMA_WORD, count)
        if key not in seen:
            seen.add(key)
            yield from (plan._w_tap(off, first, count) for off in offsets)


def _byte_tap_ok(tap: Tap) -> bool:
    """A tap over a byte array moves whole, word-aligned 32-bit words."""
    if tap.offset % DMA_WORD or tap.sizes[3] % DMA_WORD:
        return False
    return all(n == 1 or s % DMA_WORD == 0 for n, s in zip(tap.sizes[:3], tap.strides[:3]))


def plan_gemv_blocks(
    N: int,
    K: int,
    w_block: int,
    w_block_bytes: int,
    arch: Arch,
    products,
    staging: int = 0,
    glu: bool = False,
    w_row: int = 0,
    add: bool = False,
    y_size: int = 4,
    stash: bool = False,
    norm: bool = False,
    rope: RopeRows | None = None,
    shared_x: bool = False,
    bias: bool = False,
    nx: tuple[int, int, int, int] = (1, 0, 0, 0),
) -> GemvPlan | None:
    """The cheapest GEMV plan over weights moved as bytes (`w_block` elements in
    `w_block_bytes` bytes: f16, block-quantized types) with f32 activations and results of
    `y_size` bytes (f32; f16 with `stash`, the core summing in its stash of nr f32,
    mv_stash.h), or None. `products` are the (src0 byte, src1, dst element) offsets of the
    matrix-vector products (checked for DMA alignment); `staging` is what the core function
    keeps on its stack besides the fifo buffers. K chunks are whole blocks. `glu`: MUL_MAT_<glu>
    (GemvPlan.glu; the core also keeps its stash of nr f32). `w_row`: W's row stride in bytes
    when src0 is strided (GemvPlan.w_row; 0: dense). `add`: MUL_MAT_ADD (GemvPlan.add).
    `norm`: RMS_NORM_MUL_MAT(_<glu>) (GemvPlan.norm; the core also keeps n, mv_norm_bytes).
    `rope`: RMS_NORM_MUL_MAT_ROPE(_FF) (GemvPlan.rope, as plan_gemv's). `shared_x`:
    GemvPlan.shared_x plans only. `bias`: GemvPlan.bias (as plan_gemv's). `nx`: (x rows per
    object, their stride, the y rows' stride, r's rows' stride) of GemvPlan.nx."""
    # The planner reads of `products` only their count and src0 offsets modulo a DMA word;
    # the fused planners ask for the same GEMV many times (every phase of a decode layer).
    offsets = frozenset(p[0] % DMA_WORD for p in products)
    return _plan_gemv_blocks(
        N,
        K,
        w_block,
        w_block_bytes,
        arch,
        offsets,
        len(products),
        staging,
        glu,
        w_row,
        add,
        y_size,
        stash,
        norm,
        rope,
        shared_x,
        bias,
        nx,
    )


@functools.lru_cache(maxsize=4096)
def _plan_gemv_blocks(
    N,
    K,
    w_block,
    w_block_bytes,
    arch,
    offsets,
    products,
    staging,
    glu,
    w_row,
    add,
    y_size,
    stash,
    norm,
    rope,
    shared_x,
    bias,
    nx,
) -> GemvPlan | None:
    if K % w_block:
        return None
    n_x, x_row, y_row, r_row = nx
    # Several rows: whole blocks of more than one value (not f16), r's rows apart (mv_add.h
    # reads each row's).
    if n_x > 1 and (w_block == 1 or (add and not r_row)):
        return None
    blocks = K // w_block
    x_size = 4
    best, best_key = None, None
    k_options = [w_block * d for d in divisors(blocks)]
    for columns, rows in _gemv_shapes(arch, shared_x):
        for nr in _row_options(rope):
            if columns * rows * nr > N or (nr * y_size) % DMA_WORD:
                continue
            if not _rows_ok(N, columns, rows, nr, rope):
                continue
            for kc in reversed(k_options):
                kcw = kc // w_block * w_block_bytes
                l1 = 2 * nr * kcw + 2 * n_x * (kc * x_size + nr * y_size) + staging
                l1 += n_x * mvq_x_bytes(w_block, kc)
                l1 += stash_bytes(n_x * nr) if glu or stash else 0
                l1 += mv_norm_bytes(K, kc, n_x) if norm else 0
                l1 += mv_rope_bytes(rope) if rope else 0
                if l1 > arch.l1_budget or nr > MAX_WRAP or K // kc > MAX_WRAP:
                    continue
                if (nr * kcw) % DMA_WORD:
                    continue
                if kc != K and (kcw % DMA_WORD or kcw > DMA_WORD * GEMV_MAX_CHUNK_WORDS):
                    continue
                # x's chunks too are one run of a wrap-limited dimension (whole rows
                # included: a K-long x chunk read as one run gave wrong results).
                if kc * x_size > DMA_WORD * GEMV_MAX_CHUNK_WORDS:
                    continue
                # `nx`: a round's y rows of a column are one dimension of the drain (R cores
                # of nx rows).
                rows_apart = max(x_row * x_size, y_row * y_size, r_row * x_size)
                if n_x > 1 and rows_apart > DMA_WORD * MAX_STRIDE_WORDS:
                    continue
                # Whole rows: a core row's tiles are one run of the shim's innermost
                # dimension.
                if kc == K and rows * nr * kcw > DMA_WORD * MAX_WRAP:
                    continue
                if add and not _add_ok(N, rows, nr, columns * rows * nr, kc):
                    continue
                plan = GemvPlan(
                    N,
                    K,
                    columns,
                    rows,
                    nr,
                    kc,
                    w_block,
                    w_block_bytes,
                    glu,
                    1,
                    w_row,
                    add,
                    norm,
                    rope,
                    shared_x,
                    bias,
                    n_x,
                    x_row,
                    y_row,
                    r_row,
                )
                if plan.w_tasks(products) > MAX_TASKS_PER_CHANNEL:
                    continue
                if not _norm_ok(plan, products) or not _bias_ok(plan, l1, arch.l1_budget):
                    continue
                if not all(_byte_tap_ok(w) for w in _w_taps(plan, offsets)):
                    continue
                key = (gemv_core_cycles(plan), -columns * rows)
                if best_key is None or key < best_key:
                    best, best_key = plan, key
                break  # the largest K chunk that fits
    return best


def split_columns(rows, columns: int) -> tuple[int, ...] | None:
    """The array's `columns` shared between GEMVs of `rows` rows each (RMS_NORM_QKV_ROPE's Q, K
    and V), at least one column each, in proportion to the rows: the split whose busiest
    column has the fewest rows (rows / columns of its GEMV), then the next busiest, and so on
    (the dispatch ends with its slowest GEMV; the weights stream through every column at once).
    None when there are fewer columns than GEMVs. Llama-3.2-1B's 2048, 512, 512 rows: 4, 2, 2
    of 8 columns and 2, 1, 1 of 4."""
    n = len(rows)
    if n < 1 or columns < n:
        return None
    best, best_key = None, None

    def splits(left, parts):
        if parts == 1:
            yield (left,)
            return
        for c in range(1, left - parts + 2):
            for rest in splits(left - c, parts - 1):
                yield (c, *rest)

    for split in splits(columns, n):
        key = sorted((r / c for r, c in zip(rows, split)), reverse=True)
        if best_key is None or key < best_key:
            best, best_key = split, key
    return best


def gemv_memtile_bytes(plan: GemvPlan, w_unit_bytes: int, y_size: int) -> int:
    """Memory tile bytes of one GEMV column: the W ring (R*nr rows of a K chunk, in W units of
    `w_unit_bytes`) and the joined y ring (R*nr results of `y_size` bytes), each
    double-buffered."""
    R, nr = plan.rows, plan.rows_per_tile
    y_ring = 2 * R * nr * plan.nx * y_size
    return 2 * R * nr * plan.w_units(plan.k_chunk) * w_unit_bytes + y_ring


def walk(dims) -> list[int]:
    """The element offsets a DMA access pattern [(size, stride), ...] visits, in order."""
    offsets = [0]
    for size, stride in dims:
        offsets = [o + i * stride for o in offsets for i in range(size)]
    return offsets


# ------------------------------------------------------------------------- row ops

ROW_BLOCK_MAX = 64  # rows per object of a row design (the core loops over them)


@dataclass(frozen=True)
class RowPlan:
    """Rows of `length` elements, each resident in a compute tile while it is processed.

    `columns` workers (one per column, fed straight from the column's shim tile) take
    `rows_per_column` consecutive rows each, in objects of `block` rows; FIFOs are
    `depth` deep. The worker count divides the rows exactly: no row is computed twice, so
    in-place kernels (output = input) stay correct.
    """

    length: int
    rows: int
    columns: int
    block: int
    depth: int
    l1_bytes: int  # the worker's object FIFO buffers and resident operands

    @property
    def rows_per_column(self) -> int:
        return self.rows // self.columns

    @property
    def iterations(self) -> int:
        return self.rows_per_column // self.block


def plan_rows(
    length: int,
    rows: int,
    row_bytes: int,
    resident: int,
    max_columns: int,
    arch: Arch,
    max_block: int = ROW_BLOCK_MAX,
) -> RowPlan | None:
    """The row tiling: `row_bytes` are one row's bytes over every streamed operand (input,
    mask, output) and `resident` the bytes a worker keeps for the whole dispatch. The most
    columns dividing `rows`, then the largest block of rows and deepest FIFOs within the
    compute tile budget; None when one row does not fit single-buffered."""
    columns = max(d for d in divisors(rows) if d <= max_columns)
    per_column = rows // columns
    budget = arch.l1_budget - resident
    for depth in (2, 1):
        fits = [
            b for b in divisors(per_column) if b <= max_block and b * row_bytes * depth <= budget
        ]
        if fits:
            block = max(fits)
            l1 = block * row_bytes * depth + resident
            return RowPlan(length, rows, columns, block, depth, l1)
    return None


def split_run(elements: int, elem_bytes: int) -> tuple[int, int] | None:
    """`elements` contiguous elements as (a, b) with a * b = elements, b elements of whole
    32-bit words at most MAX_WRAP words and a at most MAX_WRAP (two inner DMA dimensions);
    None if there is no such split."""
    for b in reversed(divisors(elements)):
        words, rem = divmod(b * elem_bytes, DMA_WORD)
        if rem == 0 and words <= MAX_WRAP and elements // b <= MAX_WRAP:
            return elements // b, b
    return None
