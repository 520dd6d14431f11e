"""Batch twins of :mod:`kvgeom.ranks`: DCP dealing of many positions at once.

``dcp_placement`` -> :func:`placements` (rank ``-1`` for "every rank"), ``dcp_slot`` ->
:func:`slot_mapping` (one slot per position, from a 2-D block table), ``rank_lengths`` ->
:func:`rank_lengths`. Element ``i`` of each result is the scalar answer for element ``i`` of the
input (``tests/property/test_batch_agrees_with_scalar.py``); where the scalar accepts a slot past
int64 as a Python int, the twin raises ``int64_overflow`` instead of wrapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvgeom._math import INT64_MAX
from kvgeom.batch._arrays import I64, check_total, div, int64_view, ints, overflow, pow2_shift
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry
from kvgeom.ranks import slot_mapped_group

__all__ = ["Placements", "placements", "rank_lengths", "slot_mapping"]


@dataclass(frozen=True)
class Placements:
    """Column, owning rank (``-1``: every rank holds it) and in-page offset per position."""

    column: I64
    rank: I64
    offset: I64


def _deal(geom: Geometry, g: GroupGeometry, p: I64, want_rank: bool = True) -> tuple[I64, I64 | None, I64]:
    """(column, rank or None when replicated, offset) of non-negative positions ``p``."""
    if not g.dealt:
        col = div(p, g.block_size)
        return col, None, p - col * g.block_size
    D = geom.kv_shards
    interleave = geom.config.parallel.cp_interleave
    S = g.span
    col = div(p, S)
    o = p - col * S
    if interleave == 1:
        hi = div(o, D)
        return col, (o - hi * D) if want_rank else None, hi
    t = div(o, interleave)
    within = o - t * interleave
    hi = div(t, D)
    rank = (t - hi * D) if want_rank else None
    return col, rank, hi * interleave + within


def placements(geom: Geometry, group: int, positions: Any) -> Placements:
    """:func:`kvgeom.ranks.dcp_placement` for a 1-D array of positions.

    ``rank`` is ``-1`` where the scalar returns ``None`` (a replicated group:
    every rank holds the position). Postconditions as the scalar:
    ``0 <= offset < block_size``; for a dealt group
    ``column * span <= position < (column + 1) * span``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> pl = placements(g, 0, [37, 53])
    >>> pl.column.tolist(), pl.rank.tolist(), pl.offset.tolist()
    ([1, 1], [1, 1], [2, 10])
    >>> placements(g, 1, [37]).rank.tolist()
    [-1]
    """
    g = geom.group(group)
    p = ints("positions", positions)
    col, rank, off = _deal(geom, g, p)
    return Placements(col, np.full(p.shape, -1, dtype=np.int64) if rank is None else rank, off)


def slot_mapping(
    geom: Geometry,
    group: int,
    positions: Any,
    block_table: Any,
    request_index: Any,
    *,
    rank: int | None = None,
    out: Any = None,
) -> I64:
    """Slot of each position given a 2-D block table and each position's request (row) index.

    Element ``i`` is :func:`kvgeom.ranks.dcp_slot` ``(geom, group, positions[i],
    block_table[request_index[i]])[1]``: ``row[column] * block_size + offset``
    on the owning rank. With ``rank`` set, the slots rank ``rank`` writes: its
    own positions (every position of a replicated group) and the pad slot
    ``-1`` for positions another rank owns. Mamba groups have no slot mapping.

    ``out``: a writable, C-contiguous 1-D int64 array of ``len(positions)``, not overlapping the
    inputs, to write the slots into and return. A serving engine keeps one slot-mapping buffer per
    step; reusing it spares the page faults of a fresh array, which cost more than the kernel itself
    past a few million positions (``benchmarks/README.md``). Anything else is the ``QueryError``
    ``bad_out``; after an error its contents are unspecified.

    Errors: a request index past the table's rows, a column past its width
    (``row_too_short``), a negative table entry, or a slot past int64.

    >>> import kvgeom
    >>> import numpy as np
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> table = np.array([[7, 9, 11]])
    >>> slot_mapping(g, 0, [37, 53], table, [0, 0]).tolist()
    [146, 154]
    >>> slot_mapping(g, 0, [36, 37], table, [0, 0], rank=0).tolist()
    [146, -1]
    >>> buf = np.empty(2, dtype=np.int64)
    >>> slot_mapping(g, 0, [37, 53], table, [0, 0], out=buf) is buf, buf.tolist()
    (True, [146, 154])
    """
    g = slot_mapped_group(geom, group)
    p = int64_view("positions", positions)
    req = int64_view("request_index", request_index)
    table = ints("block_table", block_table, ndim=2, signed=True)
    if req.shape != p.shape:
        raise QueryError.single(
            "length_mismatch",
            f"request_index has {req.shape[0]} entries but positions has {p.shape[0]}; give each position its "
            "request's row",
            "request_index",
        )
    if out is not None and not (
        isinstance(out, np.ndarray)
        and out.dtype == np.int64
        and out.shape == p.shape
        and out.flags.c_contiguous
        and out.flags.writeable
        and not np.may_share_memory(out, p)
        and not np.may_share_memory(out, req)
    ):
        raise QueryError.single(
            "bad_out",
            f"out must be a writable, C-contiguous 1-D int64 array of {p.shape[0]} entries (one per position) "
            "that does not overlap positions or request_index; "
            f"got {type(out).__name__}"
            + (f" {out.dtype} {out.shape}" if isinstance(out, np.ndarray) else ""),
            "out",
        )
    if rank is not None:
        r = int(rank) if isinstance(rank, int | np.integer) and not isinstance(rank, bool) else -1
        if not 0 <= r < geom.kv_shards:
            raise QueryError.single(
                "no_such_rank",
                f"rank={rank!r} is not a KV shard; ranks are 0..{geom.kv_shards - 1}",
                "rank",
                rank=rank,
            )
    if p.size == 0:
        return np.zeros(0, dtype=np.int64) if out is None else out
    rows, width = table.shape
    B = g.block_size
    if table.size and int(table.min()) >= 0 and int(table.max()) <= (INT64_MAX - (B - 1)) // B:
        # Every slot fits: gather from the table pre-multiplied by B (one pass over the small table).
        # The positions and request indices are checked block by block inside the kernel, while each
        # block is in the CPU cache (a separate pass would read both arrays from memory twice).
        scaled = np.ascontiguousarray(table).ravel() * B
        return _slots_blocked(geom, g, p, req, scaled, rows, width, rank, out)
    _check_slot_indices(g, p, req, rows, width)
    slots = _slots_checked(geom, g, p, req, table, rank)
    if out is None:
        return slots
    out[...] = slots
    return out


def _check_slot_indices(g: GroupGeometry, p: I64, req: I64, rows: int, width: int) -> None:
    """Raise the first problem of the positions / request indices of :func:`slot_mapping`, if any."""
    # One max reduction each over the unsigned view catches negatives (they read as values >= 2**63)
    # and gives the upper bound; the slow path only runs to name the problem.
    pmax = int(p.view(np.uint64).max())
    if pmax > INT64_MAX:
        ints("positions", p)
    rmax = int(req.view(np.uint64).max())
    if rmax > INT64_MAX:
        ints("request_index", req)
    if rmax >= rows:
        raise QueryError.single(
            "no_such_request",
            f"request_index holds {rmax}, but block_table has {rows} rows",
            "request_index",
            request_index=rmax,
            rows=rows,
        )
    top = pmax // (g.span if g.dealt else g.block_size)
    if top >= width:
        raise QueryError.single(
            "row_too_short",
            f"position {pmax} needs block-table column {top}, but the rows have {width} entries",
            "block_row",
            column=top,
            row_length=width,
        )


_BLOCK = 1 << 15
"""Elements per block of the slot-mapping kernel: the temporaries stay in the CPU cache."""


def _slots_blocked(
    geom: Geometry,
    g: GroupGeometry,
    p: I64,
    req: I64,
    scaled: I64,
    rows: int,
    width: int,
    rank: int | None,
    out: I64 | None,
) -> I64:
    """Slots in cache-sized blocks: each block's indices are checked before its gather (so the gather may
    skip bounds checks); the first bad block raises :func:`_check_slot_indices`'s error for the whole input."""
    B = g.block_size
    D = geom.kv_shards
    interleave = geom.config.parallel.cp_interleave
    dealt = g.dealt
    S = g.span if dealt else B
    shifts = [pow2_shift(v) for v in (S, B, D, interleave)]
    pow2 = None not in shifts
    sS, _, sD, sI = (s or 0 for s in shifts)  # used only when pow2
    n = p.shape[0]
    if out is None:
        out = np.empty(n, dtype=np.int64)
    size = min(_BLOCK, n)
    i64 = np.int64
    W, mask_b = i64(width), i64(B - 1)
    # Largest valid position and request index, compared on the unsigned views (negatives read as >= 2**63).
    p_lim, r_lim = width * S - 1, rows - 1
    u64 = np.uint64
    t1 = np.empty(size, dtype=np.int64)
    t2 = np.empty(size, dtype=np.int64)
    other = np.empty(size, dtype=np.bool_)
    for lo in range(0, n, size):
        hi = min(lo + size, n)
        pb, rb, ob = p[lo:hi], req[lo:hi], out[lo:hi]
        if int(pb.view(u64).max()) > p_lim or int(rb.view(u64).max()) > r_lim:
            _check_slot_indices(g, p, req, rows, width)
            raise AssertionError("unreachable: a block failed the index check that the whole input passed")
        a, b = t1[: hi - lo], t2[: hi - lo]
        # flat index of (request, column) into the pre-multiplied table
        if pow2:
            np.right_shift(pb, i64(sS), out=a)
        else:
            np.floor_divide(pb, i64(S), out=a)
        np.multiply(rb, W, out=b)
        a += b
        np.take(scaled, a, out=ob, mode="clip")
        # offset inside the owner's page
        if not dealt:
            np.bitwise_and(pb, mask_b, out=a) if pow2 else np.remainder(pb, i64(B), out=a)
        elif pow2 and interleave == 1:
            np.right_shift(pb, i64(sD), out=a)
            a &= mask_b
        elif pow2 and interleave == B:
            np.bitwise_and(pb, mask_b, out=a)
        else:
            o = np.remainder(pb, S, out=a)
            np.floor_divide(o, interleave * D, out=b)
            b *= interleave
            o %= interleave
            a += b
        ob += a
        if rank is not None and dealt:
            # owner = (p % S // I) % D; positions other ranks own get the pad slot -1
            if pow2 and interleave == 1:  # owner = p mod D: one pass, not a shift by 0 and a mask
                np.bitwise_and(pb, i64(D - 1), out=a)
            elif pow2:
                np.right_shift(pb, i64(sI), out=a)
                a &= i64(D - 1)
            else:
                np.remainder(pb, i64(S), out=a)
                a //= i64(interleave)
                a %= i64(D)
            # branch-free blend (a masked copy mispredicts on I = 1's alternating owners): -1 is all ones
            ne = other[: hi - lo]
            np.not_equal(a, i64(rank), out=ne)
            np.negative(ne.view(np.int8), out=a)
            ob |= a
    return out


def _slots_checked(geom: Geometry, g: GroupGeometry, p: I64, req: I64, table: I64, rank: int | None) -> I64:
    """Slots with an exact check of every gathered entry (negative entries elsewhere, or int64-sized ids)."""
    width = table.shape[1]
    col, owner, off = _deal(geom, g, p, want_rank=rank is not None)
    B = g.block_size
    entries = table.ravel()[req * width + col] if table.flags.c_contiguous else table[req, col]
    lo = int(entries.min())
    if lo < 0:
        raise QueryError.single(
            "negative", f"block_row entry={lo} is negative; block ids are >= 0", "block_row entry", value=lo
        )
    if int(entries.max()) > (INT64_MAX - (B - 1)) // B:
        bad = entries > (INT64_MAX - off) // B
        if bad.any():
            i = int(np.argmax(bad))
            raise overflow("slot", int(entries[i]) * B + int(off[i]))
    slots = entries * B
    slots += off
    if owner is not None:
        slots[owner != rank] = -1
    return slots


def rank_lengths(geom: Geometry, group: int, num_tokens: Any) -> I64:
    """:func:`kvgeom.ranks.rank_lengths` for a 1-D array of token counts: shape ``(n, kv_shards)``.

    Each row sums to its token count for a dealt group; a replicated group's
    row repeats the count on every rank.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> rank_lengths(g, 0, [37, 4]).tolist(), rank_lengths(g, 1, [37]).tolist()
    ([[19, 18], [2, 2]], [[37, 37]])
    """
    g = geom.group(group)
    n = ints("num_tokens", num_tokens)
    D = geom.kv_shards
    check_total("rank_lengths", n.size * D)  # (n, D) int64: refused before numpy allocates it (issue 19)
    if not g.dealt:
        return np.repeat(n[:, None], D, axis=1)
    interleave = geom.config.parallel.cp_interleave
    rounds, rem = np.divmod(n, D * interleave)
    r = np.arange(D, dtype=np.int64) * interleave
    return rounds[:, None] * interleave + np.clip(rem[:, None] - r[None, :], 0, interleave)
