"""Batch twins of :mod:`kvgeom.hits`: hit lookups, load plans and store plans of many requests at once.

``lookup_hit`` -> :func:`lookup_hits` (held keys as one bool matrix per group), ``plan_load`` ->
:func:`plan_loads`, ``plan_store`` -> :func:`plan_stores`, ``skipped_tokens`` -> same name; the eagle
store hold-back (:func:`kvgeom.speculative.store_holdback_chunks`) -> :func:`store_holdback`. Each result
object gives the scalar value of one element back (``Hits.hit(i)``, ``LoadPlans.plan(i)``,
``StorePlans.plan(i)``) and ``tests/property/test_batch_agrees_with_scalar.py`` compares them with the
scalar answers element by element, under speculation too. Every step of the scalar lookup is
reproduced (the minus one and Mamba rounding, the clamps, the full-attention prefix, the windowed
right-to-left scans to a fixed point, the eagle pop and partial tails); :func:`lookup_views` is that
core over any held-key view (:mod:`kvgeom.batch.probes`), shared with :mod:`kvgeom.batch.lookup`.
The store side evaluates the reachable-block mask per candidate chunk (:mod:`kvgeom.batch.masks`) and
the Mamba hand-off per request (:mod:`kvgeom.batch.handoff`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvgeom.batch._arrays import (
    I64,
    Bools,
    bools,
    cdiv,
    check_total,
    div,
    int_or_array,
    ints,
    lookup_args,
    offload_of,
    rdown,
    same_length,
)
from kvgeom.batch.handoff import handed_over, mamba_handoff_matrix, partial_tail_boundaries, partial_tail_top
from kvgeom.batch.masks import chunk_kept, kept_from_points, swa_store_horizons
from kvgeom.batch.probes import HeldMatrix, eagle_pair_held, stored_matrices
from kvgeom.geometry import Geometry, GroupGeometry, OffloadGeometry, OffloadGroupGeometry
from kvgeom.hits import GroupLoad, GroupStore, Hit, StorePlan
from kvgeom.hits import rswa_gap_blocks as scalar_rswa_gap_blocks
from kvgeom.specs import rswa_window_of

__all__ = [
    "GroupLoads",
    "GroupStores",
    "Hits",
    "LoadPlans",
    "StorePlans",
    "lookup_hits",
    "lookup_views",
    "plan_loads",
    "plan_stores",
    "rswa_gap_blocks",
    "skipped_tokens",
    "store_holdback",
]


def skipped_tokens(geom: Geometry, group: int, end_tokens: Any) -> I64:
    """:func:`kvgeom.hits.skipped_tokens` per end token (leading tokens a resumed request does not need).

    >>> import kvgeom
    >>> skipped_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [0, 64]).tolist()
    [0, 63]
    """
    g = geom.group(group)
    N = ints("end_token", end_tokens)
    return _skipped(g, N)


def rswa_gap_blocks(geom: Geometry, group: int, num_prompt_tokens: Any, num_computed_tokens: Any) -> tuple[I64, I64]:
    """:func:`kvgeom.hits.rswa_gap_blocks` per request: ``(start, stop)`` arrays, request ``i``'s freed blocks
    being ``range(start[i], stop[i])`` (``start == stop`` when none is freed). Same refusals as the scalar,
    for the first offending element.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "rswa", "block_size": 16, "rswa_window": 40}]})
    >>> [a.tolist() for a in rswa_gap_blocks(g, 0, [50, 50, 50], [100, 120, 160])]
    [[4, 4, 4], [4, 5, 7]]
    """
    g = geom.group(group)
    W = rswa_window_of(g.spec)
    P = ints("num_prompt_tokens", num_prompt_tokens)
    T = ints("num_computed_tokens", num_computed_tokens)
    same_length("num_computed_tokens", T, P.shape[0])
    if W is None or bool((T < P).any()):
        i = int(np.argmax(T < P)) if W is not None else 0
        scalar_rswa_gap_blocks(geom, group, int(P[i]) if P.size else 0, int(T[i]) if T.size else 0)  # raises
    S = g.span
    first = cdiv(P, S)
    stop = np.maximum(first, np.maximum(P, T - (W or 0)) // S)
    return first.astype(np.int64), stop.astype(np.int64)


def _skipped(g: GroupGeometry, N: I64) -> I64:
    need = g.window_need
    match g.family:
        case "sliding" if need is not None:
            return np.maximum(N - need, 0)
        case "chunked" if need is not None:
            return rdown(N, need + 1)
        case "mamba":
            return np.maximum(N - 1, 0)
        case _:
            return np.zeros_like(N)


@dataclass(frozen=True)
class GroupStores:
    """One group's stores for many requests, as CSR arrays sorted by request.

    Request ``i``'s chunks are ``chunk[indptr[i]:indptr[i+1]]``; ``request``
    repeats ``i`` for each of them, ``end_token = (chunk + 1) * C`` and
    ``block`` is the chunk's first block-table entry (positional groups,
    entries ``[block, block + blocks_per_chunk)``) or its state block (align
    Mamba). ``partial_tail`` is each request's partial-tail key end token (``-1``: none);
    ``next_stored_chunk`` each request's :attr:`kvgeom.hits.GroupStore.next_stored_chunk`.
    """

    index: int
    align_mamba: bool
    blocks_per_chunk: int
    indptr: I64
    request: I64
    chunk: I64
    end_token: I64
    block: I64
    partial_tail: I64
    next_stored_chunk: I64

    def store(self, i: int) -> GroupStore:
        """Request ``i``'s entry as the scalar :class:`kvgeom.hits.GroupStore`."""
        lo, hi = int(self.indptr[i]), int(self.indptr[i + 1])
        chunks = tuple(int(j) for j in self.chunk[lo:hi])
        blocks = [int(b) for b in self.block[lo:hi]]
        entries = (
            tuple((b,) for b in blocks)
            if self.align_mamba
            else tuple(tuple(range(b, b + self.blocks_per_chunk)) for b in blocks)
        )
        tail = int(self.partial_tail[i])
        ends = tuple(int(e) for e in self.end_token[lo:hi])
        return GroupStore(
            self.index, chunks, ends, entries, None if tail < 0 else tail, int(self.next_stored_chunk[i])
        )


@dataclass(frozen=True)
class StorePlans:
    """Store plans of many requests: ``offloadable_tokens`` per request and one :class:`GroupStores` per group."""

    offloadable_tokens: I64
    groups: tuple[GroupStores, ...]

    def __len__(self) -> int:
        return int(self.offloadable_tokens.shape[0])

    def plan(self, i: int) -> StorePlan:
        """Request ``i``'s plan as the scalar :class:`kvgeom.hits.StorePlan` (compare with ``==``)."""
        return StorePlan(int(self.offloadable_tokens[i]), tuple(g.store(i) for g in self.groups))


def plan_stores(
    geom: Geometry,
    *,
    num_tokens: Any,
    num_computed_tokens: Any,
    num_prompt_tokens: Any = None,
    stored_chunks: Mapping[int, Any] | None = None,
    allocated_blocks: Mapping[int, Any] | None = None,
    reachable: Any = None,
    offload_prompt_only: bool = True,
    max_offload_tokens: int | None = None,
    finished: Any = False,
    chunk_ends: Any = None,
    loaded_from_offload: Any = False,
    partial_tail_stored: Any = False,
) -> StorePlans:
    """:func:`kvgeom.hits.plan_store` for many requests (one entry per request in each array).

    ``stored_chunks`` / ``allocated_blocks`` map a group index to a per-request
    array (missing groups: the scalar defaults). ``reachable`` is ``None``
    (the default replay boundary ``num_prompt - 1``) or a 2-D array with one
    row of reachable boundaries per request, ``-1`` marking unused slots.
    ``finished`` is a bool or a per-request bool array. ``chunk_ends`` is None
    or a 2-D array with one row of prefill chunk ends per request (``-1``
    padding); ``loaded_from_offload`` and ``partial_tail_stored`` a bool or a per-request
    bool array. The sparsity masks of :mod:`kvgeom.masks` are evaluated per candidate
    chunk, vectorised.
    ``StorePlans.plan(i) == plan_store(...)`` for request ``i``.

    A group whose masks are evaluated per candidate chunk (every group but a Mamba or sliding-window one
    under ``retention_interval`` 0, whose kept chunks are generated directly) refuses more than
    ``MAX_RESULT`` (2^26) candidates over all requests: ``result_too_large``, field ``plan_stores candidate
    chunks``, ``total`` that group's count (the first group past the limit, in group order). Request ``i``'s
    candidates are its chunks from its stored start (``stored_chunks``) up to its storable end; only where
    the scalar plan reconsiders chunks below the stored start (a finished sliding-window request whose
    horizon is not the prompt's, retention None, not an eagle group, the alignment a multiple of the group's
    span: its last partial alignment segment, ``kvgeom.hits._swa_revisit_start``) do they start at that
    segment's first chunk.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    >>> sp = plan_stores(g, num_tokens=[64, 40], num_computed_tokens=[64, 40])
    >>> sp.groups[1].request.tolist(), sp.groups[1].chunk.tolist()  # vLLM runs: Mamba 48, 64 and 32
    ([0, 0, 1], [2, 3, 1])
    >>> sp.plan(0).groups[0].chunks
    (0, 1)
    """
    off = offload_of(geom)
    n = ints("num_tokens", num_tokens)
    size = n.shape[0]
    computed = ints("num_computed_tokens", num_computed_tokens)
    same_length("num_computed_tokens", computed, size)
    if num_prompt_tokens is None:
        prompt = n
    else:
        prompt = ints("num_prompt_tokens", num_prompt_tokens)
        same_length("num_prompt_tokens", prompt, size)
    offloadable = np.minimum(computed, n)
    prompt_offloadable = np.minimum(prompt, n)
    mot = None if max_offload_tokens is None else int_or_array("max_offload_tokens", max_offload_tokens, size)
    if mot is not None:
        offloadable = np.minimum(offloadable, mot)
        prompt_offloadable = np.minimum(prompt_offloadable, mot)
    if offload_prompt_only:
        offloadable = np.minimum(offloadable, prompt)
    fin = bools("finished", finished, size)
    if fin.any():
        offloadable = np.where(fin, np.minimum(offloadable, np.maximum(prompt, n - 1)), offloadable)
    if reachable is None:
        points = np.where(prompt > 0, prompt - 1, -1)[:, None]
    else:
        points = ints("reachable", reachable, ndim=2, allow_minus_one=True)
        same_length("reachable", points, size)
    exists: I64 | None = None
    if chunk_ends is not None:
        exists = ints("chunk_ends", chunk_ends, ndim=2, allow_minus_one=True)
        same_length("chunk_ends", exists, size)
    tails = partial_tail_boundaries(
        geom, prompt, computed, exists, bools("loaded_from_offload", loaded_from_offload, size), mot
    )
    tails = np.where(bools("partial_tail_stored", partial_tail_stored, size), -1, tails)
    H = geom.hash_block_size
    keyed_n = div(n, H)
    groups = []
    for og in off.groups:
        g = geom.groups[og.index]
        C = og.tokens_per_chunk
        k = off.blocks_per_chunk
        storable = np.minimum(np.floor_divide(offloadable, C), div(keyed_n, og.hashes_per_chunk))
        storable = store_holdback(og, storable, offloadable, prompt, fin)
        if allocated_blocks is not None and og.index in allocated_blocks:
            alloc = ints(f"allocated_blocks[{og.index}]", allocated_blocks[og.index])
            same_length(f"allocated_blocks[{og.index}]", alloc, size)
            storable = np.minimum(storable, div(alloc, k))
        if stored_chunks is not None and og.index in stored_chunks:
            start = ints(f"stored_chunks[{og.index}]", stored_chunks[og.index])
            same_length(f"stored_chunks[{og.index}]", start, size)
        else:
            start = np.zeros(size, dtype=np.int64)
        indptr = np.zeros(size + 1, dtype=np.int64)
        group_points = points
        direct = kept_from_points(geom, og, g, start, storable, group_points)
        if direct is not None:
            req, chunk = direct
            np.cumsum(np.bincount(req, minlength=size), out=indptr[1:])
        else:
            prompt_chunks = np.floor_divide(prompt_offloadable, C)
            final = swa_store_horizons(geom, g, storable, prompt_chunks, fin)
            first = _swa_revisit_starts(geom, og, g, start, storable, prompt_chunks, fin)
            counts = np.maximum(storable - first, 0)
            check_total("plan_stores candidate chunks", int(counts.sum(dtype=np.float64)) if size else 0)
            np.cumsum(counts, out=indptr[1:])
            total = int(indptr[-1])
            req = np.repeat(np.arange(size, dtype=np.int64), counts)
            chunk = np.arange(total, dtype=np.int64) - np.repeat(indptr[:-1] - first, counts)
            final_blocks = None if final is None else final * k
            keep = chunk_kept(geom, og, g, chunk, req, storable * k, group_points, final_blocks)
            old = chunk < start[req]
            if old.any():  # revisited chunks: kept under the final horizon and skipped under the prompt's
                keep_prompt = chunk_kept(geom, og, g, chunk, req, storable * k, group_points, prompt_chunks * k)
                keep = keep if keep is not None else np.ones(total, dtype=np.bool_)
                keep = np.where(old, keep & ~keep_prompt if keep_prompt is not None else False, keep)
            if keep is not None:
                req, chunk = req[keep], chunk[keep]
                np.cumsum(np.bincount(req, minlength=size), out=indptr[1:])
        if g.is_align_mamba:
            # inside the prompt: the states the GPU manager hands off; past it (decode): the mask alone
            live = (chunk + 1) * C > prompt[req]
            handed = mamba_handoff_matrix(
                geom, og.index, prompt, computed, exists, None if reachable is None else points, start * C, storable * C
            )
            hrow = np.repeat(np.arange(size, dtype=np.int64), handed.shape[1])
            hkey = handed.ravel()
            hchunk = div(np.maximum(hkey, 0), C) - 1
            ok = (hkey > 0) & (hkey % C == 0) & (hchunk >= start[hrow]) & (hchunk < storable[hrow])
            req = np.concatenate([req[live], hrow[ok]])
            chunk = np.concatenate([chunk[live], hchunk[ok]])
            order = np.lexsort((chunk, req))
            req, chunk = req[order], chunk[order]
            np.cumsum(np.bincount(req, minlength=size), out=indptr[1:])
        end = (chunk + 1) * C
        block = div(end, g.block_size) - 1 if g.is_align_mamba else chunk * k
        ptail = np.where(tails >= 0, tails + (og.proof_margin or 0), -1)
        nxt = np.maximum(start, storable)
        if g.is_align_mamba:  # the hand-offs offered so far (GroupStore.next_stored_chunk)
            handed = handed_over(geom, og.index, prompt, computed)
            nxt = np.maximum(start, np.where(handed >= 0, handed // C, storable))
        groups.append(GroupStores(og.index, g.is_align_mamba, k, indptr, req, chunk, end, block, ptail, nxt))
    return StorePlans(offloadable, tuple(groups))


def _swa_revisit_starts(
    geom: Geometry, og: OffloadGroupGeometry, g: GroupGeometry, start: I64, storable: I64, prompt_chunks: I64,
    fin: Bools,
) -> I64:
    """``kvgeom.hits._swa_revisit_start`` per request: where a finished request's candidates begin."""
    off = offload_of(geom)
    align = off.alignment_tokens
    if (
        geom.config.cache.retention_interval is not None
        or g.family != "sliding"
        or og.eagle_group
        or align is None
        or align % og.tokens_per_block
    ):
        return start
    k = off.blocks_per_chunk
    blocks = storable * k
    revisit = np.minimum(start, (blocks - blocks % (align // og.tokens_per_block)) // k)
    return np.where(fin & (storable != prompt_chunks), revisit, start)


def store_holdback(
    og: OffloadGroupGeometry, storable: I64, offloadable: I64, prompt: I64, finished: Bools
) -> I64:
    """:func:`kvgeom.speculative.store_holdback_chunks` for many requests: an eagle group's last offloadable
    chunk is not stored while the request decodes and has not finished."""
    if not og.eagle_group:
        return storable
    held_back = np.maximum(offloadable // og.tokens_per_chunk - 1, 0)
    return np.where((offloadable > prompt) & ~finished, np.minimum(storable, held_back), storable)


@dataclass(frozen=True)
class Hits:
    """Hits of many requests (the scalar :class:`kvgeom.hits.Hit`, one array per field): ``hit_tokens``,
    ``end_token`` and ``local_computed_tokens`` are int64 arrays and ``partial_tail`` a bool array (a mask
    that selects the requests with a partial tail), whichever way the lookup ended."""

    hit_tokens: I64
    end_token: I64
    local_computed_tokens: I64
    partial_tail: Bools

    def __len__(self) -> int:
        return int(self.hit_tokens.shape[0])

    def hit(self, i: int) -> Hit:
        """Request ``i``'s hit as the scalar :class:`kvgeom.hits.Hit` (compare with ``==``)."""
        return Hit(
            int(self.hit_tokens[i]),
            int(self.end_token[i]),
            int(self.local_computed_tokens[i]),
            bool(self.partial_tail[i]),
        )


def _forward_run(hc: Any, rows: I64, start: I64, limit: I64) -> I64:
    """Consecutive held chunks from ``start`` upwards, capped at ``limit`` (the full-attention prefix scan)."""
    out = np.zeros(rows.shape, dtype=np.int64)
    active = np.flatnonzero(limit > 0)
    width = 16
    while active.size:
        steps = np.arange(width, dtype=np.int64)
        vals = hc(rows[active, None], start[active, None] + out[active, None] + steps)
        full = vals.all(axis=1)
        got = np.where(full, width, np.argmin(vals, axis=1))
        out[active] = np.minimum(out[active] + got, limit[active])
        active = active[full & (out[active] < limit[active])]
        if active.size:
            # Past the first window a run is usually long (a stored prefix): take the rest of the longest
            # one at once, within a budget of 2^22 cells per step.
            rest = int((limit[active] - out[active]).max())
            width = max(16, min(rest, 4096, (1 << 22) // active.size))
    return out


def _scan_windows(
    g: GroupGeometry, og: OffloadGroupGeometry, hc: Any, rows: I64, end: I64, start_chunk: I64
) -> tuple[I64, Bools]:
    """:func:`kvgeom.hits._scan_window` for many requests: ``(found, has)``.

    The scalar scan is a state machine over chunks ``cdiv(end, C) - 1`` down to
    ``start_chunk`` with state (run, run_end, needed chunks). Here every active
    request advances through a window of chunks per numpy step: within the
    window, the state before chunk ``i`` follows from the last miss before it,
    so the first position where ``needed <= run`` is found with a prefix max.
    """
    C = og.tokens_per_chunk
    w = g.window_need  # None: Mamba, one key
    window = og.window_chunks or 1

    def need(at: I64) -> I64:
        if w is None:
            return np.ones_like(at)
        if g.family != "sliding":  # chunked local: its fixed window of chunks, as the scalar rule
            return np.full_like(at, window)
        q = (w + np.mod(-at, C) + C - 1) // C
        out: I64 = np.maximum(q, window)  # at least the window in chunks, as in the scalar rule
        return out

    qm = int(need(np.zeros(1, dtype=np.int64))[0])
    size = rows.shape[0]
    found = np.full(size, -1, dtype=np.int64)
    has = np.zeros(size, dtype=np.bool_)
    j = cdiv(end, C) - 1
    run = np.zeros(size, dtype=np.int64)
    run_end = end.copy()
    cur = need(end)
    active = np.arange(size)
    # Chunks at or past the stored matrix are never held: a scan starting there meets misses only, so
    # jump over them at once (the scalar walks them one by one, which for int64-sized requests with a
    # short matrix never ends). Starting at chunk j > last = matrix chunks: the first candidate
    # succeeds iff it needs no chunk; after the miss at j, the run below succeeds at once iff a run
    # needs no chunk (qm <= 0); otherwise every chunk down to max(last, start) is a miss.
    last = hc.chunks
    far = np.flatnonzero((j > last) & (j >= start_chunk))
    if far.size:
        now = cur[far] <= 0
        found[far[now]], has[far[now]] = run_end[far[now]], True
        rest = far[~now]
        if qm <= 0:
            found[rest], has[rest] = j[rest] * C, True
            settled = far
        else:
            low = np.maximum(start_chunk[rest], last)
            run[rest], cur[rest], run_end[rest], j[rest] = 0, qm, low * C, low - 1
            settled = far[now]
        keep_rows = np.ones(size, dtype=np.bool_)
        keep_rows[settled] = False
        active = active[keep_rows]
    width = 8
    while active.size:
        steps = np.arange(width, dtype=np.int64)
        ja, sa = j[active], start_chunk[active]
        x = ja[:, None] - steps
        valid = x >= sa[:, None]
        miss = valid & ~hc(rows[active, None], x)
        acc = np.maximum.accumulate(np.where(miss, steps, -1), axis=1)
        before = np.empty_like(acc)
        before[:, 0] = -1
        before[:, 1:] = acc[:, :-1]
        no_miss = before < 0
        run_i = np.where(no_miss, run[active, None] + steps, steps - before - 1)
        cur_i = np.where(no_miss, cur[active, None], qm)
        ret = valid & (cur_i <= run_i)
        anyret = ret.any(axis=1)
        if anyret.any():
            at = np.argmax(ret, axis=1)[anyret]
            lm = before[anyret, at]
            ra = active[anyret]
            found[ra] = np.where(lm < 0, run_end[ra], (j[ra] - lm) * C)
            has[ra] = True
        # Requests without a return in this window: advance the state past the valid positions.
        keep = ~anyret
        active, x_last, ja, sa = active[keep], acc[keep, -1], ja[keep], sa[keep]
        nvalid = np.minimum(np.maximum(ja - sa + 1, 0), width)
        missed = x_last >= 0
        run[active] = np.where(missed, nvalid - x_last - 1, run[active] + nvalid)
        cur[active] = np.where(missed, qm, cur[active])
        run_end[active] = np.where(missed, (ja - x_last) * C, run_end[active])
        j[active] = ja - nvalid
        over = j[active] < sa
        if over.any():
            fin = active[over]
            ok = (run[fin] >= cur[fin]) | (run[fin] > 0)
            found[fin] = np.where(ok, run_end[fin], -1)
            has[fin] = ok
            active = active[~over]
        width = min(width * 2, 1024)
    return found, has


def lookup_hits(
    geom: Geometry,
    num_tokens: Any,
    *,
    stored: Mapping[Any, Any],
    num_prompt_tokens: Any = None,
    local_computed_tokens: Any = None,
    max_load_tokens: Any = None,
    max_num_new_tokens: Any = None,
) -> Hits:
    """:func:`kvgeom.hits.lookup_hit` for many requests.

    ``stored`` maps a group index to a bool matrix of shape (requests, hash
    indices): column ``i`` of row ``r`` means request ``r``'s key ending at
    ``(i + 1) * H`` is held; columns past the matrix are not held, a missing
    group holds nothing. ``num_prompt_tokens`` and ``local_computed_tokens``
    are per-request arrays (defaults as the scalar); ``max_load_tokens`` and
    ``max_num_new_tokens`` are ``None``, an int or a per-request array.
    Every step of the scalar is reproduced: the minus one and Mamba rounding,
    the clamps with re-alignment to the Mamba chunk after each, the "less than
    one chunk" returns, the full-attention prefix, the windowed right-to-left
    scans to a fixed point, and partial tails. ``Hits.hit(i) == lookup_hit(...)``.

    >>> import kvgeom
    >>> import numpy as np
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> held = np.ones((2, 4), dtype=bool)
    >>> lookup_hits(g, [64, 65], stored={0: held, 1: held}).end_token.tolist()
    [48, 64]
    """
    off = offload_of(geom)
    n = ints("num_tokens", num_tokens)
    size = n.shape[0]
    prompt, local, mnn, mlt = lookup_args(
        n, num_prompt_tokens, local_computed_tokens, max_num_new_tokens, max_load_tokens
    )
    held = stored_matrices(geom, off, stored, size)
    views = {og.index: HeldMatrix(held[og.index], og.hashes_per_chunk) for og in off.groups}
    return lookup_views(geom, off, n, prompt, local, mlt, mnn, views)


def lookup_views(
    geom: Geometry, off: OffloadGeometry, n: I64, prompt: I64, local: I64, mlt: I64 | None, mnn: I64 | None,
    chunk_held: Mapping[int, Any],
) -> Hits:
    """The :func:`lookup_hits` core over checked arrays and one held-key view per offloaded group (an object
    with ``view(rows, chunks)``, ``view.hashes(rows, cols)`` and ``view.chunks``, the chunk count past
    which nothing is held: :class:`~kvgeom.batch.probes.HeldMatrix` over a bool matrix, or
    :mod:`kvgeom.batch.lookup`'s view of a :class:`kvgeom.Residency`)."""
    size = n.shape[0]
    H = geom.hash_block_size
    c = rdown(local, geom.scheduler_block_size)

    M = n.copy()
    if mnn is not None:
        M = c + np.minimum(M - c, mnn)  # min(M, c + mnn) without overflow
    if mlt is not None:
        M = c + np.minimum(M - c, mlt)
    limit = M
    Cm = off.mamba_align_size

    def realign(m: I64) -> I64:
        return rdown(m, Cm) if Cm else m

    groups = geom.groups
    windowed = [og for og in off.groups if og.window_chunks is not None]
    full = [og for og in off.groups if og.window_chunks is None]
    if windowed:
        M = realign(np.maximum(M - 1, 0))
    first_chunk = (full[0] if full else windowed[0]).tokens_per_chunk
    if not off.supports_partial_tail and not (M - c >= first_chunk).any():
        # the first group's clamp only lowers M: no request can get a chunk past its local prefix
        return Hits(np.zeros(size, dtype=np.int64), c.copy(), c, np.zeros(size, dtype=np.bool_))
    keyed = div(n, H)

    def clamp(og: OffloadGroupGeometry, m: I64, rows: I64) -> I64:
        C = og.tokens_per_chunk
        m = np.minimum(m, div(keyed[rows], og.hashes_per_chunk) * C)
        if mlt is not None:
            m = rdown(m, C)
        return realign(m)

    m = M.copy()
    dead = np.zeros(size, dtype=np.bool_)  # requests whose scalar lookup returned c early
    alive = np.arange(size)
    # Eagle groups not yet verified at the request's current candidate (they query one chunk more and pop it).
    unverified = {og.index: np.ones(size, dtype=np.bool_) for og in off.groups if og.eagle_group}
    for og in full:
        C = og.tokens_per_chunk
        before = m[alive]
        ma = clamp(og, before, alive)
        ca = c[alive]
        ok = ma - ca >= C
        dead[alive[~ok]] = True
        alive, ma, ca, before = alive[ok], ma[ok], ca[ok], before[ok]
        first = ca // C
        pop = unverified[og.index][alive].astype(np.int64) if og.eagle_group else np.zeros_like(ma)
        if og.eagle_group:
            unverified[og.index][alive] = False
        query = np.where(pop > 0, np.minimum(ma + C, div(keyed[alive], og.hashes_per_chunk) * C), ma)
        hits = _forward_run(chunk_held[og.index], alive, first, cdiv(query, C) - first)
        ok = hits > 0
        dead[alive[~ok]] = True
        alive, ma, ca, first, hits, pop, before = (
            alive[ok], ma[ok], ca[ok], first[ok], hits[ok], pop[ok], before[ok]
        )
        ma = realign(np.minimum(ma, C * (first + hits - pop)))
        ok = ma - ca >= C
        dead[alive[~ok]] = True
        alive, ma, before = alive[ok], ma[ok], before[ok]
        if not og.eagle_group:
            for flags in unverified.values():
                flags[alive[ma < before]] = True
        m[alive] = ma
    pair_held = {og.index: eagle_pair_held(chunk_held[og.index]) for og in windowed if og.eagle_group}

    def _scan_eagle(og: OffloadGroupGeometry, rows: I64, ma: I64, start: I64) -> tuple[I64, Bools]:
        """A windowed eagle group: unverified rows scan the pair-held chunks from one chunk further."""
        C = og.tokens_per_chunk
        pop = unverified[og.index][rows]
        unverified[og.index][rows] = False
        found = np.full(rows.shape, -1, dtype=np.int64)
        has = np.zeros(rows.shape, dtype=np.bool_)
        plain = np.flatnonzero(~pop)
        if plain.size:
            found[plain], has[plain] = _scan_windows(
                groups[og.index], og, chunk_held[og.index], rows[plain], ma[plain], start[plain]
            )
        wide = np.flatnonzero(pop)
        if wide.size:
            keyed_chunks = div(keyed[rows[wide]], og.hashes_per_chunk)
            stop = np.minimum(cdiv(np.minimum(ma[wide] + C, keyed_chunks * C), C), keyed_chunks)
            found[wide], has[wide] = _scan_windows(
                groups[og.index], og, pair_held[og.index], rows[wide], np.minimum(ma[wide], (stop - 1) * C),
                start[wide],
            )
        return found, has

    # Windowed groups from the widest window (stable sort, as the scalar), repeated until no group lowers m.
    ordered = sorted(windowed, key=lambda og: -(og.window_chunks or 0))
    busy = alive
    while busy.size and ordered:
        changed = np.zeros(busy.shape, dtype=np.bool_)
        for og in ordered:
            C = og.tokens_per_chunk
            before = m[busy]
            ma = clamp(og, before, busy)
            cb = c[busy]
            ok = ma - cb >= C
            if og.eagle_group:
                found, has = _scan_eagle(og, busy[ok], ma[ok], cb[ok] // C)
            else:
                found, has = _scan_windows(
                    groups[og.index], og, chunk_held[og.index], busy[ok], ma[ok], cb[ok] // C
                )
            ok[ok] = has
            low = np.minimum(ma[ok], found[has])
            ma[ok] = realign(low)
            below_run = np.zeros(ok.shape, dtype=np.bool_)
            below_run[ok] = ma[ok] < low  # the Mamba re-alignment went below the group's own run end
            ok &= ma - cb >= C
            dead[busy[~ok]] = True
            # eagle groups pop again after another group's lowering or a re-alignment below a run end (scalar
            # _complete clears its verified set on the same condition)
            reset = ok & (below_run | (ma < before)) if not og.eagle_group else ok & below_run
            if reset.any():
                for flags in unverified.values():
                    flags[busy[reset]] = True
            changed = (changed | (ma < before))[ok]
            busy = busy[ok]
            m[busy] = ma[ok]
        busy = busy[changed]
    done = np.where(dead, c, m)
    tail = np.zeros(size, dtype=np.bool_)
    if off.supports_partial_tail and size:
        # Probe boundaries b from rdown(min(prompt - 1, done + span - 1, limit), H) down to just above done.
        span = off.groups[0].tokens_per_block
        b = partial_tail_top(geom, n, prompt, done, limit)
        far = np.flatnonzero(b >= done + span)
        if far.size:  # a tail past the next block also loads that block's chunk: it must be stored
            bridge = np.ones(far.shape, dtype=np.bool_)
            for og in off.groups:
                if not groups[og.index].is_align_mamba:
                    bridge &= chunk_held[og.index].hashes(far, (done[far] + span) // H - 1)
            b[far[~bridge]] = done[far[~bridge]] + span - H
        rows = np.flatnonzero(b > done)
        while rows.size:
            all_held = np.ones(rows.shape, dtype=np.bool_)
            for og in off.groups:
                all_held &= chunk_held[og.index].hashes(rows, (b[rows] + (og.proof_margin or 0)) // H - 1)
            tail[rows[all_held]] = True
            done[rows[all_held]] = b[rows[all_held]]
            rows = rows[~all_held]
            b[rows] -= H
            rows = rows[b[rows] > done[rows]]
    return Hits(done - c, done, c, tail)


def plan_loads(geom: Geometry, hits: Hits) -> LoadPlans:
    """:func:`kvgeom.hits.plan_load` for many hits (from :func:`lookup_hits`).

    Per group and request: block entries ``[first_entry, stop_entry)``, key
    chunks ``[first_key_chunk, stop_key_chunk)`` (end tokens ``(j + 1) * C``)
    followed by the boundary key ``end_token`` for a partial tail,
    ``skip_in_first_chunk = first_entry % k`` and, for align Mamba, the
    ``state_block`` ``(N - 1) // B_m`` (``-1`` otherwise). A group that loads
    nothing has ``loads`` false and zeros elsewhere. ``LoadPlans.plan(i) ==
    plan_load(geom, hits.hit(i))``.

    >>> import kvgeom
    >>> import numpy as np
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> held = np.ones((1, 4), dtype=bool)
    >>> lp = plan_loads(g, lookup_hits(g, [65], stored={0: held, 1: held}))
    >>> lp.groups[1].state_block.tolist(), lp.plan(0)[1].load_keys
    ([3], (64,))
    """
    off = offload_of(geom)
    c, N = hits.local_computed_tokens, hits.end_token
    tail = hits.partial_tail
    out = []
    for og in off.groups:
        g = geom.groups[og.index]
        S, C = og.tokens_per_block, og.tokens_per_chunk
        k = off.blocks_per_chunk
        stop = cdiv(N, S)
        first = np.maximum(cdiv(c, S), div(_skipped(g, N), S))
        loads = (hits.hit_tokens != 0) & (first < stop)
        zero = np.zeros_like(N)
        first_key = np.where(loads, div(first, k), zero)
        stop_key = np.where(loads, cdiv(N, C) - tail, zero)
        if g.is_align_mamba:
            state = np.where(loads, div(np.maximum(N - 1, 0), g.block_size), -1)
        else:
            state = np.full_like(N, -1)
        out.append(
            GroupLoads(
                index=og.index,
                tokens_per_chunk=C,
                loads=loads,
                first_entry=np.where(loads, first, zero),
                stop_entry=np.where(loads, stop, zero),
                first_key_chunk=first_key,
                stop_key_chunk=stop_key,
                skip_in_first_chunk=np.where(loads, first % k, zero),
                state_block=state,
                tail_key_offset=og.proof_margin or 0,
            )
        )
    return LoadPlans(hits, tuple(out))


@dataclass(frozen=True)
class GroupLoads:
    """One group's loads for many requests (see :func:`plan_loads`)."""

    index: int
    tokens_per_chunk: int
    loads: Bools
    first_entry: I64
    stop_entry: I64
    first_key_chunk: I64
    stop_key_chunk: I64
    skip_in_first_chunk: I64
    state_block: I64
    tail_key_offset: int = 0
    """Tokens past ``end_token`` where this group's partial-tail key ends (its eagle proof margin)."""


@dataclass(frozen=True)
class LoadPlans:
    """Load plans of many requests: the hits and one :class:`GroupLoads` per offloaded group."""

    hits: Hits
    groups: tuple[GroupLoads, ...]

    def __len__(self) -> int:
        return len(self.hits)

    def plan(self, i: int) -> tuple[GroupLoad, ...]:
        """Request ``i``'s plan as the scalar tuple of :class:`kvgeom.hits.GroupLoad`."""
        out = []
        tail = bool(self.hits.partial_tail[i])
        N = int(self.hits.end_token[i])
        for g in self.groups:
            if not g.loads[i]:
                out.append(GroupLoad(g.index, (), (), 0, None))
                continue
            C = g.tokens_per_chunk
            keys = tuple((j + 1) * C for j in range(int(g.first_key_chunk[i]), int(g.stop_key_chunk[i])))
            if tail:
                keys += (N + g.tail_key_offset,)
            state = int(g.state_block[i])
            out.append(
                GroupLoad(
                    g.index,
                    keys,
                    tuple(range(int(g.first_entry[i]), int(g.stop_entry[i]))),
                    int(g.skip_in_first_chunk[i]),
                    None if state < 0 else state,
                )
            )
        return tuple(out)
