"""Numpy batch paths: the scalar reference functions over many positions or requests.

Every function here has exactly the meaning of a scalar function in
:mod:`kvgeom.ranks`, :mod:`kvgeom.keys`, :mod:`kvgeom.boundaries` or
:mod:`kvgeom.hits`, applied element by element (a property test checks this,
``tests/property/test_batch_agrees_with_scalar.py``). Arrays go in and come
out as ``int64``; nothing is rounded, clipped or wrapped differently.

Input rules (all raise :class:`kvgeom.QueryError`):

* token counts, positions, chunks and block ids are integer arrays of the
  stated shape (any numpy integer dtype or a list of Python ints); bool and
  float arrays are refused, except that an empty input of any dtype is fine;
* negative values are refused (``negative``), and so are values or results
  past what int64 holds (``int64_overflow``): kvgeom checks with a max
  reduction before it computes, so no result ever wraps around;
* per-request arrays of one call must have the same length.

Twins (scalar -> batch):

* :mod:`kvgeom.ranks`: ``dcp_placement`` -> :func:`placements` (rank ``-1``
  for "every rank"), ``dcp_slot`` -> :func:`slot_mapping`, ``rank_lengths``
  -> :func:`rank_lengths`;
* :mod:`kvgeom.keys`: ``chunk_hash_index``, ``chunk_end_token``,
  ``chunk_state_block``, ``chunk_of_entry``, ``boundary_hash_index``,
  ``num_keys`` -> same names; ``chunk_for_end_token`` -> same name with ``-1``
  for ``None``; ``chunk_block_entries`` -> :func:`chunk_first_entry` (the
  range is ``[first, first + k)``); ``key_map`` -> :func:`key_maps`;
* :mod:`kvgeom.boundaries`: ``state_block_for_boundary``,
  ``restore_read_block``, ``running_state_block``, ``is_restorable``,
  ``max_restorable_tokens`` -> same names;
* :mod:`kvgeom.hits`: ``lookup_hit`` -> :func:`lookup_hits`, ``plan_load`` ->
  :func:`plan_loads`, ``plan_store`` -> :func:`plan_stores`,
  ``skipped_tokens`` -> same name. Each result object gives the scalar value
  of one element back (``Hits.hit(i)``, ``LoadPlans.plan(i)``,
  ``StorePlans.plan(i)``, ``KeyMaps.key_map(i)``) for comparison.

Scalar functions without a batch twin, and why:

* :meth:`kvgeom.Geometry.plan_hit` / :func:`kvgeom.hits.plan_hit`: they parse
  one scenario dict into the JSON contract; the batch form is
  :func:`lookup_hits` then :func:`plan_loads`;
* :func:`kvgeom.keys.offload_group`, :func:`kvgeom.boundaries.mamba_chunk_tokens`,
  :func:`kvgeom.masks.default_alignment`: per-group constants, no per-element
  argument;
* :func:`kvgeom.masks.reachable_block_mask` returns a set per call; its
  conditions are evaluated per chunk, vectorised, inside :func:`plan_stores`
  (the store plan is the only consumer of a mask), and the agreement
  property compares the resulting store plans.

Where the scalar accepts a result past int64 as a Python int (a slot, hash
index, end token or block entry of an int64-sized input; ``computed +
scheduled`` in ``running_state_block``), the batch function raises
``int64_overflow`` instead: it never wraps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvgeom._format import show
from kvgeom._math import INT64_MAX
from kvgeom.boundaries import mamba_group
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry, OffloadGeometry, OffloadGroupGeometry
from kvgeom.hits import GroupLoad, GroupStore, Hit, StorePlan
from kvgeom.keys import offload_group, positional_blocks_per_chunk
from kvgeom.masks import default_alignment, swa_store_need
from kvgeom.probes import stored_group_index
from kvgeom.ranks import slot_mapped_group
from kvgeom.specs import attention_chunk_size_of, sliding_window_of

__all__ = [
    "GroupKeys",
    "GroupLoads",
    "KeyMaps",
    "GroupStores",
    "Hits",
    "LoadPlans",
    "Placements",
    "StorePlans",
    "boundary_hash_index",
    "chunk_end_token",
    "chunk_first_entry",
    "chunk_for_end_token",
    "chunk_hash_index",
    "chunk_of_entry",
    "chunk_state_block",
    "is_restorable",
    "key_maps",
    "lookup_hits",
    "max_restorable_tokens",
    "num_keys",
    "placements",
    "plan_loads",
    "plan_stores",
    "rank_lengths",
    "restore_read_block",
    "running_state_block",
    "skipped_tokens",
    "slot_mapping",
    "state_block_for_boundary",
]

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

# --------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------


def _overflow(name: str, value: int, what: str = "") -> QueryError:
    return QueryError.single(  # type: ignore[return-value]
        "int64_overflow",
        f"{name} reaches {show(value)}{what}, past what int64 holds ({INT64_MAX}); no cache has that many tokens or "
        "blocks: split the request or use smaller numbers",
        name,
        **{name: value},
    )


def _ints(name: str, x: Any, ndim: int = 1, *, allow_minus_one: bool = False, signed: bool = False) -> I64:
    """``x`` as a non-negative int64 array of ``ndim`` dimensions (no copy when it already is one).

    ``allow_minus_one`` accepts ``-1`` as padding; ``signed`` skips the sign check (the caller checks
    the elements it uses, as the scalar does for a block-table row).
    """
    if isinstance(x, np.ndarray) and x.dtype == np.int64 and x.ndim == ndim:
        a = x
    else:
        try:
            a = np.asarray(x)
        except (ValueError, TypeError) as e:
            raise QueryError.single(
                "bad_shape", f"{name} is not a rectangular array ({show(str(e))}); pass a {ndim}-D integer array", name
            ) from None
        if a.ndim != ndim:
            raise QueryError.single(
                "bad_shape",
                f"{name} has shape {a.shape}, expected a {ndim}-D integer array",
                name,
                shape=a.shape,
            )
        if a.size == 0:
            return np.zeros(a.shape, dtype=np.int64)
        if a.dtype == object:
            flat = a.ravel().tolist()
            if not all(type(v) is int or (isinstance(v, np.integer) and not isinstance(v, np.bool_)) for v in flat):
                raise QueryError.single(
                    "not_an_integer_array", f"{name} must hold integers, got {a.dtype} elements", name
                )
            lo, hi = int(min(flat)), int(max(flat))
            _check_range(name, max(lo, 0) if signed else lo, hi, allow_minus_one)
            return a.astype(np.int64)
        if a.dtype.kind not in "iu":
            raise QueryError.single(
                "not_an_integer_array",
                f"{name} must be an integer array, got dtype {a.dtype}; token counts and indices are integers",
                name,
                dtype=str(a.dtype),
            )
        if a.dtype.kind == "u" and a.dtype.itemsize == 8:
            hi = int(a.max())
            if hi > INT64_MAX:
                raise _overflow(name, hi)
        a = a.astype(np.int64, copy=False)
    if a.size and not signed:
        lo = int(a.min())
        if lo < (-1 if allow_minus_one else 0):
            _check_range(name, lo, 0, allow_minus_one)
    return a


def _check_range(name: str, lo: int, hi: int, allow_minus_one: bool) -> None:
    if lo < (-1 if allow_minus_one else 0):
        extra = " (-1 marks padding)" if allow_minus_one else ""
        raise QueryError.single(
            "negative",
            f"{name} holds {show(lo)}, which is negative; token counts and indices are >= 0{extra}",
            name,
            **{name: lo},
        )
    if hi > INT64_MAX:
        raise _overflow(name, hi)


def _int_or_array(name: str, x: Any, size: int) -> I64:
    """A scalar (broadcast to ``size``) or a 1-D array of length ``size``."""
    if isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_):
        v = int(x)
        _check_range(name, v, v, False)
        return np.full(size, v, dtype=np.int64)
    a = _ints(name, x)
    _same_length(name, a, size)
    return a


def _same_length(name: str, a: np.ndarray, size: int) -> None:
    if a.shape[0] != size:
        raise QueryError.single(
            "length_mismatch",
            f"{name} has {a.shape[0]} entries but num_tokens has {size}; pass one value per request",
            name,
            length=int(a.shape[0]),
            expected=size,
        )


def _lookup_args(
    n: I64, num_prompt_tokens: Any, local_computed_tokens: Any, max_num_new_tokens: Any, max_load_tokens: Any
) -> tuple[I64, I64, I64 | None, I64 | None]:
    """The per-request arguments of a batch lookup, checked against ``num_tokens`` ``n``: prompt, local
    prefix (``local_past_request`` when past the request), and the optional new-token and load caps."""
    size = n.shape[0]
    prompt = _prompt_tokens(num_prompt_tokens, n)
    if local_computed_tokens is None:
        local = np.zeros(size, dtype=np.int64)
    else:
        local = _int_or_array("local_computed_tokens", local_computed_tokens, size)
        if (local > n).any():
            i = int(np.argmax(local > n))
            raise QueryError.single(
                "local_past_request",
                f"local_computed_tokens={int(local[i])} exceeds num_tokens={int(n[i])} (request {i})",
                "local_computed_tokens",
                local_computed_tokens=int(local[i]),
                num_tokens=int(n[i]),
            )
    mnn = None if max_num_new_tokens is None else _int_or_array("max_num_new_tokens", max_num_new_tokens, size)
    mlt = None if max_load_tokens is None else _int_or_array("max_load_tokens", max_load_tokens, size)
    return prompt, local, mnn, mlt


def _prompt_tokens(num_prompt_tokens: Any, n: I64) -> I64:
    """Per request, ``num_prompt_tokens`` checked against ``num_tokens`` (``None``: all prompt); the batch
    twin of :func:`kvgeom._check.prompt_tokens` (``prompt_longer_than_request`` names the first request)."""
    if num_prompt_tokens is None:
        return n
    prompt = _ints("num_prompt_tokens", num_prompt_tokens)
    _same_length("num_prompt_tokens", prompt, n.shape[0])
    if (prompt > n).any():
        i = int(np.argmax(prompt > n))
        raise QueryError.single(
            "prompt_longer_than_request",
            f"num_prompt_tokens={int(prompt[i])} exceeds num_tokens={int(n[i])} (request {i}); a request "
            "holds its whole prompt",
            "num_prompt_tokens",
            num_prompt_tokens=int(prompt[i]),
            num_tokens=int(n[i]),
        )
    return prompt


def _fits(name: str, max_result: int) -> None:
    """Raise unless a result bounded by ``max_result`` (a Python int) fits int64."""
    if max_result > INT64_MAX:
        raise _overflow(name, max_result, " in the result")


_MAX_RESULT = 1 << 26
"""Most elements a CSR result may hold (2**26 int64 = 512 MiB per array, seconds to build): beyond it, refuse
up front."""


def _check_total(what: str, total: int) -> None:
    """Refuse a result too large to build, before numpy tries to allocate it."""
    if total > _MAX_RESULT:
        raise QueryError.single(
            "result_too_large",
            f"{what} would hold {total} entries (more than {_MAX_RESULT}); ask for fewer requests or shorter "
            "prefixes at a time",
            what,
            total=total,
        )


def _max(a: I64) -> int:
    return int(a.max()) if a.size else 0


def _offload(geom: Geometry) -> OffloadGeometry:
    if geom.offload is None:
        offload_group(geom, 0)  # raises the no_offload QueryError
    assert geom.offload is not None
    return geom.offload


def _pow2_shift(d: int) -> int | None:
    return d.bit_length() - 1 if d & (d - 1) == 0 else None


def _div(a: I64, d: int) -> I64:
    """``a // d`` for non-negative ``a`` (a shift when ``d`` is a power of two)."""
    s = _pow2_shift(d)
    if s == 0:
        return a
    out: I64 = np.right_shift(a, s) if s is not None else np.floor_divide(a, d)
    return out


def _cdiv(a: I64, d: int) -> I64:
    """Ceiling division for non-negative ``a`` (no overflow: ``a // d + (a % d != 0)``)."""
    q, r = np.divmod(a, d)
    out: I64 = q + (r != 0)
    return out


def _rdown(a: I64, d: int) -> I64:
    return a - a % d


# --------------------------------------------------------------------------------------------------
# DCP dealing (kvgeom.ranks)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placements:
    """Column, owning rank (``-1``: every rank holds it) and in-page offset per position."""

    column: I64
    rank: I64
    offset: I64


def _deal(geom: Geometry, g: GroupGeometry, p: I64, want_rank: bool = True) -> tuple[I64, I64 | None, I64]:
    """(column, rank or None when replicated, offset) of non-negative positions ``p``."""
    if not g.dealt:
        col = _div(p, g.block_size)
        return col, None, p - col * g.block_size
    D = geom.kv_shards
    interleave = geom.config.parallel.cp_interleave
    S = g.span
    col = _div(p, S)
    o = p - col * S
    if interleave == 1:
        hi = _div(o, D)
        return col, (o - hi * D) if want_rank else None, hi
    t = _div(o, interleave)
    within = o - t * interleave
    hi = _div(t, D)
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
    p = _ints("positions", positions)
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
    p = _int64_view("positions", positions)
    req = _int64_view("request_index", request_index)
    table = _ints("block_table", block_table, ndim=2, signed=True)
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
        _ints("positions", p)
    rmax = int(req.view(np.uint64).max())
    if rmax > INT64_MAX:
        _ints("request_index", req)
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


def _int64_view(name: str, x: Any) -> I64:
    """``x`` as a 1-D int64 array without a value check (the caller checks with one max reduction)."""
    if isinstance(x, np.ndarray) and x.dtype == np.int64 and x.ndim == 1:
        return x
    return _ints(name, x)


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
    shifts = [_pow2_shift(v) for v in (S, B, D, interleave)]
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
            raise _overflow("slot", int(entries[i]) * B + int(off[i]))
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
    n = _ints("num_tokens", num_tokens)
    D = geom.kv_shards
    if not g.dealt:
        return np.repeat(n[:, None], D, axis=1)
    interleave = geom.config.parallel.cp_interleave
    rounds, rem = np.divmod(n, D * interleave)
    r = np.arange(D, dtype=np.int64) * interleave
    return rounds[:, None] * interleave + np.clip(rem[:, None] - r[None, :], 0, interleave)


# --------------------------------------------------------------------------------------------------
# Keys (kvgeom.keys) and Mamba boundaries (kvgeom.boundaries)
# --------------------------------------------------------------------------------------------------


def chunk_hash_index(geom: Geometry, group: int, chunks: Any) -> I64:
    """:func:`kvgeom.keys.chunk_hash_index` per chunk: ``(chunk + 1) * hashes_per_chunk - 1``.

    >>> import kvgeom
    >>> chunk_hash_index(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [0, 1]).tolist()
    [1, 3]
    """
    og = offload_group(geom, group)
    j = _ints("chunk", chunks)
    _fits("hash_index", (_max(j) + 1) * og.hashes_per_chunk - 1)
    return (j + 1) * og.hashes_per_chunk - 1


def chunk_end_token(geom: Geometry, group: int, chunks: Any) -> I64:
    """:func:`kvgeom.keys.chunk_end_token` per chunk: ``(chunk + 1) * tokens_per_chunk``.

    >>> import kvgeom
    >>> chunk_end_token(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [0, 1]).tolist()
    [32, 64]
    """
    og = offload_group(geom, group)
    j = _ints("chunk", chunks)
    _fits("end_token", (_max(j) + 1) * og.tokens_per_chunk)
    return (j + 1) * og.tokens_per_chunk


def chunk_first_entry(geom: Geometry, group: int, chunks: Any) -> I64:
    """First block-table entry of each chunk (positional groups): :func:`kvgeom.keys.chunk_block_entries`
    is ``range(first, first + blocks_per_chunk)``.

    The last entry ``(chunk + 1) * k - 1`` must fit int64.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> chunk_first_entry(g, 0, [0, 1, 2]).tolist()
    [0, 4, 8]
    """
    k = positional_blocks_per_chunk(geom, group)
    j = _ints("chunk", chunks)
    _fits("block entry", (_max(j) + 1) * k - 1)
    return j * k


def chunk_state_block(geom: Geometry, group: int, chunks: Any) -> I64:
    """:func:`kvgeom.keys.chunk_state_block` per chunk: the state block of the key ending at ``(chunk+1)*C``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 2}})
    >>> chunk_state_block(g, 1, [0, 1]).tolist()
    [1, 3]
    """
    ends = chunk_end_token(geom, group, chunks)
    return state_block_for_boundary(geom, group, ends)


def chunk_of_entry(geom: Geometry, group: int, entries: Any) -> I64:
    """:func:`kvgeom.keys.chunk_of_entry` per block-table entry: ``entry // blocks_per_chunk``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {"blocks_per_chunk": 4}})
    >>> chunk_of_entry(g, 0, [0, 5, 8]).tolist()
    [0, 1, 2]
    """
    k = positional_blocks_per_chunk(geom, group)
    e = _ints("entry", entries)
    return _div(e, k)


def chunk_for_end_token(geom: Geometry, group: int, end_tokens: Any) -> I64:
    """:func:`kvgeom.keys.chunk_for_end_token` per end token; ``-1`` where the scalar returns ``None``.

    End tokens must be positive.

    >>> import kvgeom
    >>> chunk_for_end_token(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [64, 48]).tolist()
    [1, -1]
    """
    og = offload_group(geom, group)
    e = _positive("end_token", end_tokens)
    q, r = np.divmod(e, og.tokens_per_chunk)
    return np.where(r == 0, q - 1, -1)


def _positive(name: str, x: Any) -> I64:
    a = _ints(name, x)
    if a.size and int(a.min()) == 0:
        raise QueryError.single("zero", f"{name} must be positive, got 0", name, **{name: 0})
    return a


def boundary_hash_index(geom: Geometry, end_tokens: Any) -> I64:
    """:func:`kvgeom.keys.boundary_hash_index` per end token: ``end_token // H - 1`` (multiples of H only).

    >>> import kvgeom
    >>> boundary_hash_index(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), [16, 48]).tolist()
    [0, 2]
    """
    e = _positive("end_token", end_tokens)
    h = geom.hash_block_size
    q, r = np.divmod(e, h)
    if r.any():
        bad = int(e[np.argmax(r != 0)])
        raise QueryError.single(
            "not_on_hash_grid",
            f"end_token={bad} is not a multiple of the hash unit H={h}; keys exist only at multiples of H",
            "end_token",
            end_token=bad,
            hash_block_size=h,
        )
    return q - 1


def num_keys(geom: Geometry, group: int, num_tokens: Any) -> I64:
    """:func:`kvgeom.keys.num_keys` per token count: ``(n // H) // hashes_per_chunk``.

    >>> import kvgeom
    >>> num_keys(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 0, [0, 63, 70]).tolist()
    [0, 1, 2]
    """
    og = offload_group(geom, group)
    n = _ints("num_tokens", num_tokens)
    return _div(_div(n, geom.hash_block_size), og.hashes_per_chunk)


def state_block_for_boundary(geom: Geometry, group: int, boundaries: Any) -> I64:
    """:func:`kvgeom.boundaries.state_block_for_boundary` per boundary: ``boundary // B_m - 1``.

    Boundaries must be positive multiples of the group's block size.

    >>> import kvgeom
    >>> state_block_for_boundary(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [16, 64]).tolist()
    [0, 3]
    """
    g = mamba_group(geom, group)
    b = _positive("boundary", boundaries)
    q, r = np.divmod(b, g.block_size)
    if r.any():
        bad = int(b[np.argmax(r != 0)])
        raise QueryError.single(
            "not_a_state_boundary",
            f"boundary={bad} is not a multiple of group {group}'s Mamba block_size={g.block_size}; no state "
            "block holds it",
            "boundary",
            boundary=bad,
            block_size=g.block_size,
        )
    return q - 1


def restore_read_block(geom: Geometry, group: int, num_computed_tokens: Any) -> I64:
    """:func:`kvgeom.boundaries.restore_read_block` per token count (> 0): ``(N - 1) // B_m``.

    >>> import kvgeom
    >>> restore_read_block(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [1, 64, 65]).tolist()
    [0, 3, 4]
    """
    g = mamba_group(geom, group)
    n = _positive("num_computed_tokens", num_computed_tokens)
    return _div(n - 1, g.block_size)


def running_state_block(geom: Geometry, group: int, num_computed_tokens: Any, num_scheduled_tokens: Any) -> I64:
    """:func:`kvgeom.boundaries.running_state_block` per step: ``cdiv(computed + scheduled, B_m) - 1``.

    The total must be positive and fit int64 (the scalar accepts a total past
    int64 as a Python int; a token count that large is refused here).

    >>> import kvgeom
    >>> running_state_block(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [32, 0], [5, 1]).tolist()
    [2, 0]
    """
    g = mamba_group(geom, group)
    a = _ints("num_computed_tokens", num_computed_tokens)
    s = _ints("num_scheduled_tokens", num_scheduled_tokens)
    _same_length("num_scheduled_tokens", s, a.shape[0])
    if a.size and _max(a) + _max(s) > INT64_MAX:
        over = s > INT64_MAX - a
        if over.any():
            i = int(np.argmax(over))
            raise _overflow("num_computed_tokens + num_scheduled_tokens", int(a[i]) + int(s[i]))
    total = a + s
    if total.size and int(total.min()) == 0:
        raise QueryError.single("zero", "a step with no tokens has no running state", "num_scheduled_tokens")
    return _cdiv(total, g.block_size) - 1


def is_restorable(geom: Geometry, group: int, num_tokens: Any, *, partial_tail: bool = False) -> Bools:
    """:func:`kvgeom.boundaries.is_restorable` per token count.

    >>> import kvgeom
    >>> is_restorable(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [0, 40, 48]).tolist()
    [False, False, True]
    """
    mamba_group(geom, group)
    from kvgeom.boundaries import mamba_chunk_tokens

    chunk = mamba_chunk_tokens(geom, group)
    n = _ints("num_tokens", num_tokens)
    ok: Bools = (n % chunk) == 0
    if partial_tail and geom.offload is not None and geom.offload.supports_partial_tail:
        ok |= (n % geom.hash_block_size) == 0
    ok &= n != 0
    return ok


def max_restorable_tokens(geom: Geometry, group: int, num_tokens: Any) -> I64:
    """:func:`kvgeom.boundaries.max_restorable_tokens` per token count: ``rdown(n - 1, chunk)`` (0 for 0).

    >>> import kvgeom
    >>> max_restorable_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [0, 64, 65]).tolist()
    [0, 48, 64]
    """
    mamba_group(geom, group)
    from kvgeom.boundaries import mamba_chunk_tokens

    chunk = mamba_chunk_tokens(geom, group)
    n = _ints("num_tokens", num_tokens)
    m = np.maximum(n - 1, 0)
    return np.where(n == 0, 0, _rdown(m, chunk))


def skipped_tokens(geom: Geometry, group: int, end_tokens: Any) -> I64:
    """:func:`kvgeom.hits.skipped_tokens` per end token (leading tokens a resumed request does not need).

    >>> import kvgeom
    >>> skipped_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [0, 64]).tolist()
    [0, 63]
    """
    g = geom.group(group)
    N = _ints("end_token", end_tokens)
    return _skipped(g, N)


def _skipped(g: GroupGeometry, N: I64) -> I64:
    window = sliding_window_of(g.spec)
    if window is not None:
        return np.maximum(N - (window[0] - 1 + window[1]), 0)
    size = attention_chunk_size_of(g.spec)
    if size is not None:
        return _rdown(N, size)
    return np.maximum(N - 1, 0) if g.family == "mamba" else np.zeros_like(N)


@dataclass(frozen=True)
class GroupKeys:
    """One group's keys for many requests, as CSR arrays sorted by request (see :func:`key_maps`)."""

    index: int
    kind: str
    align_mamba: bool
    blocks_per_chunk: int
    indptr: I64
    request: I64
    chunk: I64
    hash_index: I64
    end_token: I64
    block: I64
    """First block-table entry of the chunk (positional groups) or its state block (align Mamba)."""
    rank_lengths: I64 | None
    """Per-rank lengths of each prefix, shape (requests, kv_shards), for a DCP-dealt group."""


@dataclass(frozen=True)
class KeyMaps:
    """Key maps of many prefixes: one :class:`GroupKeys` per offloaded group."""

    prefix_tokens: I64
    groups: tuple[GroupKeys, ...]

    def __len__(self) -> int:
        return int(self.prefix_tokens.shape[0])

    def key_map(self, i: int) -> dict[str, Any]:
        """Prefix ``i``'s map in the :meth:`kvgeom.Geometry.key_map` contract (compare with ``==``)."""
        groups = []
        for g in self.groups:
            lo, hi = int(g.indptr[i]), int(g.indptr[i + 1])
            keys = []
            for j in range(lo, hi):
                entry: dict[str, Any] = {
                    "chunk": int(g.chunk[j]),
                    "hash_index": int(g.hash_index[j]),
                    "end_token": int(g.end_token[j]),
                }
                b = int(g.block[j])
                if g.align_mamba:
                    entry["state_block"] = b
                else:
                    entry["block_entries"] = list(range(b, b + g.blocks_per_chunk))
                keys.append(entry)
            item: dict[str, Any] = {"index": g.index, "kind": g.kind, "keys": keys}
            if g.rank_lengths is not None:
                item["rank_lengths"] = g.rank_lengths[i].tolist()
            groups.append(item)
        return {"prefix_tokens": int(self.prefix_tokens[i]), "groups": groups}


def key_maps(geom: Geometry, prefix_tokens: Any) -> KeyMaps:
    """:func:`kvgeom.keys.key_map` for many prefixes: every complete chunk's key, per offloaded group.

    Per group, CSR arrays over all prefixes: request ``i``'s keys are
    ``[indptr[i], indptr[i+1])`` with chunk, hash index, end token and first
    block entry (align Mamba: state block), and for a DCP-dealt group the
    per-rank lengths. ``KeyMaps.key_map(i) == key_map(geom, prefix_tokens[i])``.

    >>> import kvgeom
    >>> km = key_maps(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), [64, 40])
    >>> km.groups[1].request.tolist(), km.groups[1].block.tolist()
    ([0, 0, 0, 0, 1, 1], [0, 1, 2, 3, 0, 1])
    >>> km.key_map(1)["groups"][0]["rank_lengths"]
    [20, 20]
    """
    off = _offload(geom)
    n = _ints("prefix_tokens", prefix_tokens)
    size = n.shape[0]
    keyed = _div(n, geom.hash_block_size)
    out = []
    for og in off.groups:
        g = geom.groups[og.index]
        C, hpc = og.tokens_per_chunk, og.hashes_per_chunk
        k = C // og.tokens_per_block
        counts = _div(keyed, hpc)
        indptr = np.zeros(size + 1, dtype=np.int64)
        _check_total("key_maps", int(counts.sum(dtype=np.float64)) if size else 0)
        np.cumsum(counts, out=indptr[1:])
        total = int(indptr[-1])
        req = np.repeat(np.arange(size, dtype=np.int64), counts)
        chunk = np.arange(total, dtype=np.int64)
        chunk -= np.repeat(indptr[:-1], counts)
        top = chunk + 1
        end = top * C
        block = _div(end, g.block_size) - 1 if g.is_align_mamba else chunk * k
        lengths = rank_lengths(geom, og.index, n) if g.dealt else None
        out.append(
            GroupKeys(og.index, g.kind, g.is_align_mamba, k, indptr, req, chunk, top * hpc - 1, end, block, lengths)
        )
    return KeyMaps(n, tuple(out))


# --------------------------------------------------------------------------------------------------
# Store plans (kvgeom.hits.plan_store, with kvgeom.masks.reachable_block_mask)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupStores:
    """One group's stores for many requests, as CSR arrays sorted by request.

    Request ``i``'s chunks are ``chunk[indptr[i]:indptr[i+1]]``; ``request``
    repeats ``i`` for each of them, ``end_token = (chunk + 1) * C`` and
    ``block`` is the chunk's first block-table entry (positional groups,
    entries ``[block, block + blocks_per_chunk)``) or its state block (align
    Mamba). ``partial_tail`` is each request's partial-tail key end token (``-1``: none).
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
        return GroupStore(self.index, chunks, ends, entries, None if tail < 0 else tail)


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


def _bools(name: str, x: Any, size: int) -> Bools:
    if isinstance(x, bool | np.bool_):
        return np.full(size, bool(x))
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and a.dtype != np.bool_):
        raise QueryError.single("bad_shape", f"{name} must be a bool or a 1-D bool array", name)
    _same_length(name, a, size)
    return a.astype(np.bool_, copy=False)


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
) -> StorePlans:
    """:func:`kvgeom.hits.plan_store` for many requests (one entry per request in each array).

    ``stored_chunks`` / ``allocated_blocks`` map a group index to a per-request
    array (missing groups: the scalar defaults). ``reachable`` is ``None``
    (the default replay boundary ``num_prompt - 1``) or a 2-D array with one
    row of reachable boundaries per request, ``-1`` marking unused slots.
    ``finished`` is a bool or a per-request bool array. ``chunk_ends`` is None
    or a 2-D array with one row of prefill chunk ends per request (``-1``
    padding); ``loaded_from_offload`` a bool or a per-request bool array. The sparsity masks of
    :mod:`kvgeom.masks` are evaluated per candidate chunk, vectorised.
    ``StorePlans.plan(i) == plan_store(...)`` for request ``i``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    >>> sp = plan_stores(g, num_tokens=[64, 40], num_computed_tokens=[64, 40])
    >>> sp.groups[1].request.tolist(), sp.groups[1].chunk.tolist()
    ([0, 0, 0, 0, 1, 1], [0, 1, 2, 3, 0, 1])
    >>> sp.plan(0).groups[0].chunks
    (0, 1)
    """
    off = _offload(geom)
    n = _ints("num_tokens", num_tokens)
    size = n.shape[0]
    computed = _ints("num_computed_tokens", num_computed_tokens)
    _same_length("num_computed_tokens", computed, size)
    if num_prompt_tokens is None:
        prompt = n
    else:
        prompt = _ints("num_prompt_tokens", num_prompt_tokens)
        _same_length("num_prompt_tokens", prompt, size)
    offloadable = np.minimum(computed, n)
    prompt_offloadable = np.minimum(prompt, n)
    mot = None if max_offload_tokens is None else _int_or_array("max_offload_tokens", max_offload_tokens, size)
    if mot is not None:
        offloadable = np.minimum(offloadable, mot)
        prompt_offloadable = np.minimum(prompt_offloadable, mot)
    if offload_prompt_only:
        offloadable = np.minimum(offloadable, prompt)
    fin = _bools("finished", finished, size)
    if fin.any():
        offloadable = np.where(fin, np.minimum(offloadable, np.maximum(prompt, n - 1)), offloadable)
    if reachable is None:
        points = np.where(prompt > 0, prompt - 1, -1)[:, None]
    else:
        points = _ints("reachable", reachable, ndim=2, allow_minus_one=True)
        _same_length("reachable", points, size)
    from kvgeom.batch.handoff import mamba_handoff_matrix, partial_tail_boundaries
    from kvgeom.batch.speculative import store_holdback

    exists: I64 | None = None
    if chunk_ends is not None:
        exists = _ints("chunk_ends", chunk_ends, ndim=2, allow_minus_one=True)
        _same_length("chunk_ends", exists, size)
    tails = partial_tail_boundaries(
        geom, prompt, computed, exists, _bools("loaded_from_offload", loaded_from_offload, size), mot
    )
    H = geom.hash_block_size
    keyed_n = _div(n, H)
    groups = []
    for og in off.groups:
        g = geom.groups[og.index]
        C = og.tokens_per_chunk
        k = off.blocks_per_chunk
        storable = np.minimum(np.floor_divide(offloadable, C), _div(keyed_n, og.hashes_per_chunk))
        storable = store_holdback(og, storable, offloadable, prompt, fin)
        if allocated_blocks is not None and og.index in allocated_blocks:
            alloc = _ints(f"allocated_blocks[{og.index}]", allocated_blocks[og.index])
            _same_length(f"allocated_blocks[{og.index}]", alloc, size)
            storable = np.minimum(storable, _div(alloc, k))
        if stored_chunks is not None and og.index in stored_chunks:
            start = _ints(f"stored_chunks[{og.index}]", stored_chunks[og.index])
            _same_length(f"stored_chunks[{og.index}]", start, size)
        else:
            start = np.zeros(size, dtype=np.int64)
        indptr = np.zeros(size + 1, dtype=np.int64)
        group_points = points
        direct = _kept_from_points(geom, og, g, start, storable, group_points)
        if direct is not None:
            req, chunk = direct
            np.cumsum(np.bincount(req, minlength=size), out=indptr[1:])
        else:
            prompt_chunks = np.floor_divide(prompt_offloadable, C)
            final = _swa_store_horizons(geom, g, storable, prompt_chunks, fin)
            first = _swa_revisit_starts(geom, og, g, start, storable, prompt_chunks, fin)
            counts = np.maximum(storable - first, 0)
            _check_total("plan_stores candidate chunks", int(counts.sum(dtype=np.float64)) if size else 0)
            np.cumsum(counts, out=indptr[1:])
            total = int(indptr[-1])
            req = np.repeat(np.arange(size, dtype=np.int64), counts)
            chunk = np.arange(total, dtype=np.int64) - np.repeat(indptr[:-1] - first, counts)
            final_blocks = None if final is None else final * k
            keep = _chunk_kept(geom, og, g, chunk, req, storable * k, group_points, final_blocks)
            old = chunk < start[req]
            if old.any():  # revisited chunks: kept under the final horizon and skipped under the prompt's
                keep_prompt = _chunk_kept(geom, og, g, chunk, req, storable * k, group_points, prompt_chunks * k)
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
            hchunk = _div(np.maximum(hkey, 0), C) - 1
            ok = (hkey > 0) & (hkey % C == 0) & (hchunk >= start[hrow]) & (hchunk < storable[hrow])
            req = np.concatenate([req[live], hrow[ok]])
            chunk = np.concatenate([chunk[live], hchunk[ok]])
            order = np.lexsort((chunk, req))
            req, chunk = req[order], chunk[order]
            np.cumsum(np.bincount(req, minlength=size), out=indptr[1:])
        end = (chunk + 1) * C
        block = _div(end, g.block_size) - 1 if g.is_align_mamba else chunk * k
        ptail = np.where(tails >= 0, tails + (og.proof_margin or 0), -1)
        groups.append(GroupStores(og.index, g.is_align_mamba, k, indptr, req, chunk, end, block, ptail))
    return StorePlans(offloadable, tuple(groups))


def _swa_store_horizons(
    geom: Geometry, g: GroupGeometry, storable: I64, prompt_chunks: I64, fin: Bools
) -> I64 | None:
    """:func:`kvgeom.masks.swa_store_horizon` per request (-1: no final tail); None when it never applies."""
    if geom.config.cache.retention_interval is not None or g.family != "sliding":
        return None
    return np.where(fin, storable, np.where(storable <= prompt_chunks, prompt_chunks, -1))


def _swa_revisit_starts(
    geom: Geometry, og: OffloadGroupGeometry, g: GroupGeometry, start: I64, storable: I64, prompt_chunks: I64,
    fin: Bools,
) -> I64:
    """``kvgeom.hits._swa_revisit_start`` per request: where a finished request's candidates begin."""
    off = _offload(geom)
    align = off.alignment_tokens
    if (
        geom.config.cache.retention_interval is not None
        or g.family != "sliding"
        or align is None
        or align % og.tokens_per_block
    ):
        return start
    k = off.blocks_per_chunk
    blocks = storable * k
    revisit = np.minimum(start, (blocks - blocks % (align // og.tokens_per_block)) // k)
    return np.where(fin & (storable != prompt_chunks), revisit, start)


def _kept_from_points(
    geom: Geometry, og: OffloadGroupGeometry, g: GroupGeometry, start: I64, storable: I64, points: I64
) -> tuple[I64, I64] | None:
    """The surviving ``(request, chunk)`` pairs when a mask keeps only reachable boundaries (retention 0).

    Same conditions as :func:`_chunk_kept`, but the few kept chunks are generated from the boundaries
    directly instead of filtering every candidate chunk. ``None`` when the mask is dense or has
    periodic (R > 0) terms: the caller filters the candidates then.
    """
    if geom.config.cache.retention_interval != 0 or g.family not in ("mamba", "sliding"):
        return None
    align = default_alignment(geom, og.index)
    span = g.span
    k = _offload(geom).blocks_per_chunk
    num_blocks = storable * k
    size, width = points.shape
    if not align or (g.family == "sliding" and align % span):
        return None  # dense
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if width == 0:
        return empty
    base = _rdown(np.maximum(points, 0), align)
    lo: I64
    hi: I64
    if g.family == "mamba":
        pblock = base // span - 1  # floored, as the scalar mask
        ok = (points >= 0) & (pblock >= 0) & (pblock < num_blocks[:, None])
        if g.is_align_mamba:  # chunk j holds state block (j+1)*k - 1
            ok &= (pblock + 1) % k == 0
            lo = (pblock + 1) // k - 1
        else:  # chunk j covers blocks [j*k, (j+1)*k)
            lo = np.where(pblock >= 0, pblock // k, -1)
        hi = lo + 1
    else:
        tail = swa_store_need(g, span)
        if tail == 0:
            return empty
        stop = np.minimum(base // span, num_blocks[:, None])
        first = np.maximum(base // span - tail, 0)
        ok = (points >= 0) & (first < stop)
        lo = first // k
        hi = (np.maximum(stop, 1) - 1) // k + 1
    lo = np.maximum(lo, start[:, None])
    hi = np.minimum(hi, storable[:, None])
    counts = np.where(ok & (lo < hi), hi - lo, 0).ravel()
    total = int(counts.sum())
    rows = np.repeat(np.repeat(np.arange(size, dtype=np.int64), width), counts)
    offsets = np.cumsum(counts) - counts
    chunk = np.arange(total, dtype=np.int64) - np.repeat(offsets - lo.ravel(), counts)
    if width > 1 and total:
        order = np.lexsort((chunk, rows))
        rows, chunk = rows[order], chunk[order]
        fresh = np.ones(total, dtype=np.bool_)
        fresh[1:] = (rows[1:] != rows[:-1]) | (chunk[1:] != chunk[:-1])
        rows, chunk = rows[fresh], chunk[fresh]
    return rows, chunk


def _chunk_kept(
    geom: Geometry,
    og: OffloadGroupGeometry,
    g: GroupGeometry,
    chunk: I64,
    req: I64,
    num_blocks: I64,
    points: I64,
    final_blocks: I64 | None = None,
) -> Bools | None:
    """Which candidate chunks survive :func:`kvgeom.masks.reachable_block_mask` (None: all of them).

    The same conditions as the mask, per chunk: a chunk survives when one of
    its ``k`` blocks is kept (align Mamba: when its state block is kept).
    ``final_blocks`` is the per-request ``final_segment_end_block`` (-1: none).
    """
    R = geom.config.cache.retention_interval
    align = default_alignment(geom, og.index)
    span = g.span
    k = _offload(geom).blocks_per_chunk
    match g.family:
        case "full" | "chunked" | "cross" | "circular":
            return None
        case "mamba":
            if R is None or not align or (R and span >= R):
                return None
            if R and R % span:
                return None
            keep = np.zeros(chunk.shape, dtype=np.bool_)
            if g.is_align_mamba:
                # state block (j+1)*k - 1; block b is kept by R when (b+1) % step == 0
                top = (chunk + 1) * k
                if R:
                    keep |= top % (R // span) == 0
            else:
                lo = chunk * k
                if R:
                    step = R // span
                    keep |= (lo + k) // step > lo // step
            if points.shape[1]:
                # per request first: the block each reachable boundary keeps (-1: none), then one gather
                b = _rdown(np.maximum(points, 0), align)
                pblock = b // span - 1  # floored, as the scalar mask
                ok = (points >= 0) & (pblock >= 0) & (pblock < num_blocks[:, None])
                pblock = np.where(ok, pblock, -1)
                for col in range(points.shape[1]):
                    pb = pblock[:, col][req]
                    if g.is_align_mamba:
                        keep |= pb == top - 1
                    else:
                        keep |= (pb >= 0) & (_div(pb, k) == chunk)
            return keep
        case "sliding":
            if not align or align % span:
                return None
            need = swa_store_need(g, span)
            segment = align if R is None else (R or None)
            keep = np.zeros(chunk.shape, dtype=np.bool_)
            lo = chunk * k
            hi = lo + k
            if segment is not None:
                per = segment // span
                if need >= per:
                    return None
                if need == 0:
                    return keep
                # the first block at or after lo among the last `need` blocks of its segment
                r = lo % per
                keep |= np.where(r >= per - need, lo, lo - r + per - need) < hi
                if R is None and final_blocks is not None:
                    fe = final_blocks[req]
                    part = np.where(fe > 0, fe % per, 0)
                    tail_lo = np.maximum(np.maximum(fe - part, fe - need), lo)
                    tail_hi = np.minimum(np.minimum(num_blocks[req], fe), hi)
                    keep |= (part > 0) & (tail_lo < tail_hi)
            if R is not None and points.shape[1]:
                # per request first: the kept interval [start, stop) of each reachable boundary, then gathers
                end = _rdown(np.maximum(points, 0), align) // span
                start = np.maximum(end - need, 0)
                stop = np.where(points >= 0, np.minimum(end, num_blocks[:, None]), 0)
                for col in range(points.shape[1]):
                    keep |= np.maximum(start[:, col][req], lo) < np.minimum(stop[:, col][req], hi)
            return keep
    raise AssertionError(g.family)  # pragma: no cover


# --------------------------------------------------------------------------------------------------
# Hit lengths and load plans (kvgeom.hits.lookup_hit, plan_load)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hits:
    """Hits of many requests (the scalar :class:`kvgeom.hits.Hit`, one array per field)."""

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


def _stored_matrices(geom: Geometry, off: OffloadGeometry, stored: Any, size: int) -> dict[int, Bools]:
    if not isinstance(stored, Mapping):
        raise QueryError.single(
            "bad_stored",
            f"stored must map a group index to a bool matrix (requests x hash indices), got {type(stored).__name__}",
            "stored",
        )
    out = {og.index: np.zeros((size, 0), dtype=np.bool_) for og in off.groups}
    for key, m in stored.items():
        index = stored_group_index(key, out)
        a = np.asarray(m)
        if a.ndim != 2 or a.shape[0] != size or (a.size and a.dtype != np.bool_):
            raise QueryError.single(
                "bad_stored",
                f"stored[{key!r}] must be a bool matrix of shape (num requests={size}, hash indices), "
                f"got shape {a.shape} dtype {a.dtype}; column i means the key ending at (i+1)*H is held",
                f"stored.{key}",
            )
        out[index] = a.astype(np.bool_, copy=False)
    return out


class _Held:
    """A group's stored-key matrix viewed by chunk: chunk ``j`` is column ``(j + 1) * hpc - 1``."""

    def __init__(self, matrix: Bools, hashes_per_chunk: int) -> None:
        self.flat = np.ascontiguousarray(matrix).ravel()
        self.width = matrix.shape[1]
        self.hpc = hashes_per_chunk
        self.chunks = self.width // hashes_per_chunk

    def __call__(self, rows: I64, chunks: I64) -> Bools:
        """Whether chunk ``chunks`` of request ``rows`` is held (chunks past the matrix are not)."""
        return _gather_flat(self.flat, self.width, rows, (chunks + 1) * self.hpc - 1)

    def hashes(self, rows: I64, cols: I64) -> Bools:
        """Whether the key of request ``rows`` ending at ``(cols + 1) * H`` is held (a partial-tail boundary)."""
        return _gather_flat(self.flat, self.width, rows, cols)


def _gather_flat(flat: Bools, width: int, rows: I64, cols: I64) -> Bools:
    """``matrix[rows, cols]`` of a row-major bool matrix; columns outside ``[0, width)`` read as False."""
    shape = np.broadcast_shapes(rows.shape, cols.shape)
    if width == 0:
        return np.zeros(shape, dtype=np.bool_)
    inside = (cols >= 0) & (cols < width)
    idx = rows * width + np.where(inside, cols, 0)
    return np.take(flat, idx, mode="clip") & inside


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
    from kvgeom.hits import window_need_tokens

    C = og.tokens_per_chunk
    w = window_need_tokens(g)
    window = og.window_chunks or 1

    def need(at: I64) -> I64:
        if w is None:
            return np.ones_like(at)
        q = (w + np.mod(-at, C) + C - 1) // C
        out: I64 = np.maximum(q, window)  # at least the window in chunks, as in the scalar rule
        return out

    qm = int(need(np.zeros(1, dtype=np.int64))[0])
    size = rows.shape[0]
    found = np.full(size, -1, dtype=np.int64)
    has = np.zeros(size, dtype=np.bool_)
    j = _cdiv(end, C) - 1
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
    off = _offload(geom)
    n = _ints("num_tokens", num_tokens)
    size = n.shape[0]
    prompt, local, mnn, mlt = _lookup_args(
        n, num_prompt_tokens, local_computed_tokens, max_num_new_tokens, max_load_tokens
    )
    held = _stored_matrices(geom, off, stored, size)
    views = {og.index: _Held(held[og.index], og.hashes_per_chunk) for og in off.groups}
    return _lookup_views(geom, off, n, prompt, local, mlt, mnn, views)


def _lookup_views(
    geom: Geometry, off: OffloadGeometry, n: I64, prompt: I64, local: I64, mlt: I64 | None, mnn: I64 | None,
    chunk_held: Mapping[int, Any],
) -> Hits:
    """The :func:`lookup_hits` core over checked arrays and one held-key view per offloaded group (an object
    with ``view(rows, chunks)``, ``view.hashes(rows, cols)`` and ``view.chunks``, the chunk count past
    which nothing is held; :class:`_Held` over a bool matrix, or :mod:`kvgeom.batch.lookup`'s view of a
    :class:`kvgeom.Residency`)."""
    size = n.shape[0]
    H = geom.hash_block_size
    c = _rdown(local, geom.scheduler_block_size)

    M = n.copy()
    if mnn is not None:
        M = c + np.minimum(M - c, mnn)  # min(M, c + mnn) without overflow
    if mlt is not None:
        M = c + np.minimum(M - c, mlt)
    limit = M
    Cm = off.mamba_align_size

    def realign(m: I64) -> I64:
        return _rdown(m, Cm) if Cm else m

    groups = geom.groups
    windowed = [og for og in off.groups if og.window_chunks is not None]
    full = [og for og in off.groups if og.window_chunks is None]
    if windowed:
        M = realign(np.maximum(M - 1, 0))
    first_chunk = (full[0] if full else windowed[0]).tokens_per_chunk
    if not off.supports_partial_tail and not (M - c >= first_chunk).any():
        # the first group's clamp only lowers M: no request can get a chunk past its local prefix
        return Hits(np.zeros(size, dtype=np.int64), c.copy(), c, np.zeros(size, dtype=np.bool_))
    keyed = _div(n, H)

    def clamp(og: OffloadGroupGeometry, m: I64, rows: I64) -> I64:
        C = og.tokens_per_chunk
        m = np.minimum(m, _div(keyed[rows], og.hashes_per_chunk) * C)
        if mlt is not None:
            m = _rdown(m, C)
        return realign(m)

    from kvgeom.batch.speculative import eagle_pair_held, partial_tail_top

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
        query = np.where(pop > 0, np.minimum(ma + C, _div(keyed[alive], og.hashes_per_chunk) * C), ma)
        hits = _forward_run(chunk_held[og.index], alive, first, _cdiv(query, C) - first)
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
            keyed_chunks = _div(keyed[rows[wide]], og.hashes_per_chunk)
            stop = np.minimum(_cdiv(np.minimum(ma[wide] + C, keyed_chunks * C), C), keyed_chunks)
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
            ma[ok] = realign(np.minimum(ma[ok], found[has]))
            ok &= ma - cb >= C
            dead[busy[~ok]] = True
            if not og.eagle_group:
                for flags in unverified.values():
                    flags[busy[ok & (ma < before)]] = True
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
    off = _offload(geom)
    c, N = hits.local_computed_tokens, hits.end_token
    tail = hits.partial_tail
    out = []
    for og in off.groups:
        g = geom.groups[og.index]
        S, C = og.tokens_per_block, og.tokens_per_chunk
        k = off.blocks_per_chunk
        stop = _cdiv(N, S)
        first = np.maximum(_cdiv(c, S), _div(_skipped(g, N), S))
        loads = (hits.hit_tokens != 0) & (first < stop)
        zero = np.zeros_like(N)
        first_key = np.where(loads, _div(first, k), zero)
        stop_key = np.where(loads, _cdiv(N, C) - tail, zero)
        if g.is_align_mamba:
            state = np.where(loads, _div(np.maximum(N - 1, 0), g.block_size), -1)
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
