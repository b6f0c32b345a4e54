"""What each core of the MUL_MAT designs receives and where its results go.

Built from the same pure-Python plan the design uses (`spec.tasks()`, the memory
tile re-layouts `a_dims`/`b_dims`/`c_dims`), the way the DMAs move data:

* a shim task walks its tap; the column's memory tile receives the stream in
  objects (A: a_feed_rows*m*a_k per feed, B: n*k, C: R*m*n; GEMV W: R*nr*kc, x: kc,
  y: R*nr);
* an A feed's objects are split into a_feed_rows consecutive parts, each going
  to the cores of its array row in every column (with two channels per feed, the
  memory tile joins their halves, each re-laid in turn); W objects are split into R
  consecutive parts, one per core of the column; B and x objects go to every
  core of the column; C and y objects are joined from R consecutive parts;
* `dims_to_stream` re-lays a part on its way: the core's element j is the
  part's element walk(dims)[j]; for C, stream element j is the joined object's
  element walk(c_dims)[j].

Each core's lists hold, per object, the operand element index of each element it
receives (A, B, W, x) or the dst element index each result element lands on (C, y); B's are
src0's byte offsets when the GEMM moves the weights as bytes (f16, block-quantized), which
reach the cores as read (no re-layout).
"""

from ggml_hsa_iron.tiling import walk


def _objects(indices, size):
    assert len(indices) % size == 0, (len(indices), size)
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def gemm_streams(spec):
    """{(column, row): {"a": [...], "b": [...], "c": [...]}} for a GEMM spec."""
    p = spec.plan
    R, m, n, ak = p.rows, p.m, p.n, p.a_k
    aw, cw = walk(p.a_dims()), walk(p.c_dims())
    bw = None if p.w_block_bytes else walk(p.b_dims())
    fr, ch = p.a_feed_rows, p.a_channels
    cores = {(c, i): {"a": [], "b": [], "c": []} for c in range(p.columns) for i in range(R)}
    for group in spec.tasks():
        # Each feed's channels' objects (their parts of the rows), joined by its memory tile.
        feeds = {}
        for col, (a, _, _) in enumerate(group):
            feed = p.a_channel_of(col)
            assert (a is not None) == (feed is not None), "an A tap on a column without a feed"
            if feed is not None:
                feeds.setdefault(feed[0], {})[feed[1]] = _objects(a.indices(), fr * m * ak // ch)
        part = m * ak // ch  # a channel's share of one array row's tile
        for g, parts in feeds.items():
            assert sorted(parts) == list(range(ch)), "a feed's channels without their tasks"
            for objs in zip(*(parts[j] for j in range(ch))):
                for i in range(fr):
                    # The feed's part i goes to array row g * fr + i in every column: each
                    # channel's share of it re-laid in turn (a join walks its inputs alike).
                    tile = [obj[i * part + j] for obj in objs for j in aw]
                    for cc in range(p.columns):
                        cores[(cc, g * fr + i)]["a"].append(tile)
        for col, (_, b, c) in enumerate(group):
            for obj in _objects(b.indices(), p.b_tile):
                # Weights moved as bytes reach the cores as read (rows of whole blocks).
                blocked = obj if p.w_block_bytes else [obj[j] for j in bw]
                for i in range(R):
                    cores[(col, i)]["b"].append(blocked)
            for dest in _objects(c.indices(), R * m * n):
                joined = [None] * (R * m * n)
                for j, pos in enumerate(cw):
                    joined[pos] = dest[j]
                for i in range(R):
                    cores[(col, i)]["c"].append(joined[i * m * n : (i + 1) * m * n])
    return cores


def gemv_streams(spec):
    """{(column, row): {"w": [...], "x": [...], "y": [...]}} for a GEMV spec (W's indices in
    W's DMA units: bytes for weights moved as bytes)."""
    p = spec.plan
    R, nr, kc = p.rows, p.rows_per_tile, p.k_chunk
    kw = p.w_units(kc)
    cores = {(c, i): {"w": [], "x": [], "y": []} for c in range(p.columns) for i in range(R)}
    for group in spec.tasks():
        for col, (w, x, y) in enumerate(group):
            for obj in _objects(w.indices(), R * nr * kw):
                for i in range(R):
                    cores[(col, i)]["w"].append(obj[i * nr * kw : (i + 1) * nr * kw])
            for obj in _objects(x.indices(), kc):
                for i in range(R):
                    cores[(col, i)]["x"].append(obj)
            for dest in _objects(y.indices(), R * nr):
                for i in range(R):
                    cores[(col, i)]["y"].append(dest[i * nr : (i + 1) * nr])
    return cores


def _batch_of(spec):
    """dst batch index -> src0 batch index (ggml's broadcast of src0 over src1)."""
    s0, s1 = spec.src0.ne, spec.src1.ne
    r2, r3 = s1[2] // s0[2], s1[3] // s0[3]
    out = {}
    for i13 in range(s1[3]):
        for i12 in range(s1[2]):
            out[i13 * s1[2] + i12] = (i13 // r3) * s0[2] + (i12 // r2)
    return out


def check_structure(spec, cores):
    """Asserts that every core computes dst[b, i, j] from row i of src1 and row j of
    src0 (batch b, src0's batch by ggml's broadcast) over all of K in order, that every
    DMA stays inside its operand and that every dst element is written. Returns the
    number of dst writes (more than the dst size where blocks overlap)."""
    K, N = spec.src0.ne[0], spec.src0.ne[1]
    M = spec.src1.ne[1]
    batch0 = _batch_of(spec)
    sizes = [t.nelements for t in (spec.src0, spec.src1, spec.dst)]
    p = spec.plan
    # GEMM over weights moved as bytes: B indices are src0's bytes (rows of whole blocks).
    byte_b = not spec.gemv and p.w_block_bytes
    if byte_b:
        row_bytes = p.b_units(K)
        sizes[0] = row_bytes * N * spec.src0.ne[2] * spec.src0.ne[3]
    written = set()
    writes = 0

    def src_pos(index, rows, total):
        assert 0 <= index < total, f"DMA outside the operand: {index} of {total}"
        return index // (rows * K), (index // K) % rows, index % K

    for core in cores.values():
        if spec.gemv:
            steps, outs = p.k_steps, core["y"]
            assert len(core["w"]) == len(core["x"]) == len(outs) * steps
        else:
            steps, outs = p.k_steps, core["c"]
            assert len(core["a"]) == len(core["b"]) * p.a_split == len(outs) * steps * p.a_split
        for t, dest in enumerate(outs):
            for d in dest:
                assert 0 <= d < sizes[2], f"dst write outside: {d}"
            written.update(dest)
            writes += len(dest)
            pos = [(d // (M * N), (d // N) % M, d % N) for d in dest]
            if spec.gemv:
                nr, kc = p.rows_per_tile, p.k_chunk
                for st in range(steps):
                    w = core["w"][t * steps + st]
                    x = core["x"][t * steps + st]
                    for kk in range(kc):
                        bx, row_x, kx = src_pos(x[kk], M, sizes[1])
                        assert kx == st * kc + kk
                        for lr in range(nr):
                            bd, i, j = pos[lr]
                            bw_, row_w, kw = src_pos(w[lr * kc + kk], N, sizes[0])
                            assert (bw_, row_w, kw) == (batch0[bd], j, st * kc + kk)
                            assert (bx, row_x) == (bd, i)
                continue
            n, k, r, s, tt = p.n, p.k, p.r, p.s, p.t
            # The C tile holds r x t blocks (i < m/r, j < n/t), each row-major.
            rows_of, cols_of = {}, {}
            for e, (bd, i, j) in enumerate(pos):
                blk, within = divmod(e, r * tt)
                bi, bj = divmod(blk, n // tt)
                lr, lc = bi * r + within // tt, bj * tt + within % tt
                assert rows_of.setdefault(lr, (bd, i)) == (bd, i)
                assert cols_of.setdefault(lc, (bd, j)) == (bd, j)
            ak = p.a_k
            for st in range(steps):
                b = core["b"][t * steps + st]
                for kk in range(k):
                    kb = kk // s
                    # The K step's A comes in a_split tiles of a_k columns.
                    a = core["a"][(t * steps + st) * p.a_split + kk // ak]
                    ka = kk % ak
                    for lr, (bd, i) in rows_of.items():
                        at = ((lr // r) * (ak // s) + ka // s) * r * s + (lr % r) * s + ka % s
                        assert src_pos(a[at], M, sizes[1]) == (bd, i, st * k + kk)
                    if byte_b:
                        continue
                    for lc, (bd, j) in cols_of.items():
                        bt = ((lc // tt) * (k // s) + kb) * tt * s + (lc % tt) * s + kk % s
                        assert src_pos(b[bt], N, sizes[0]) == (batch0[bd], j, st * k + kk)
                if byte_b:
                    # Row lc of the tile is the kb bytes of src0's row j from K step st.
                    kb_ = p.b_units(k)
                    b = core["b"][t * steps + st]
                    assert len(b) == n * kb_
                    for lc, (bd, j) in cols_of.items():
                        for e in range(kb_):
                            i = b[lc * kb_ + e]
                            assert 0 <= i < sizes[0], f"DMA outside src0: {i}"
                            got = (i // (N * row_bytes), (i // row_bytes) % N, i % row_bytes)
                            assert got == (batch0[bd], j, st * kb_ + e), (got, bd, j, st, e)
    assert written == set(range(sizes[2])), "some dst elements are never written"
    return writes
