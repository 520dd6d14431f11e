"""Batch twin of :func:`kvgeom.prefix.prefix_hit`: the GPU prefix-cache hit of many residencies at
once (replicas of a router, what-if variants of one cache), vectorised over rows with numpy.

Residency comes as one boolean matrix per prefix-cacheable group: ``held[g][r, i]`` is true when
row r holds group g's entry ending at ``(i + 1) * H`` (hash i of the request's chain). Columns past
a row's chain (``num_tokens[r] // H`` hashes) are ignored; a matrix with fewer columns holds
nothing past them; a group missing from ``held`` holds nothing.

Meaning: ``prefix_hits(geom, n, held)[r] == prefix_hit(geom, n[r], row r).hit_tokens`` for every
r, empty input included (property-tested, ``tests/property/test_prefix_laws.py``). The per-kind
lookups are closed forms of the scalar scans (leading run for full attention, last held index for
Mamba, run lengths for sliding windows and chunked local); the convergence loop runs over all rows
until every row has settled.

>>> import numpy as np, kvgeom
>>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)          # attention span 32, Mamba 16, H = 16
>>> held = {0: np.array([[0, 1, 0, 1, 1, 0], [0, 1, 0, 0, 0, 0]], bool),
...         1: np.array([[1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], bool)}
>>> prefix_hits(g, 100, held).tolist()
[80, 32]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, assert_never

import numpy as np
import numpy.typing as npt

from kvgeom._math import INT64_MAX
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.prefix import LookupGroup, lookup_groups, refuse_unlookable, unitary_coordinator

__all__ = ["prefix_hits"]

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


def _tokens(num_tokens: Any) -> I64:
    arr = np.asarray(num_tokens)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
        raise QueryError.single("not_an_integer", f"num_tokens must be integers, got dtype {arr.dtype}", "num_tokens")
    if arr.ndim != 1:
        raise QueryError.single("bad_shape", f"num_tokens must be an int or a 1-d array, got shape {arr.shape}",
                                "num_tokens")
    if arr.size and int(arr.min()) < 0:
        raise QueryError.single("negative", "num_tokens has a negative value; token counts are >= 0", "num_tokens")
    if arr.size and int(arr.max()) > INT64_MAX:
        raise QueryError.single("int64_overflow", "num_tokens is past int64", "num_tokens")
    return arr.astype(np.int64)


def _held(geom: Geometry, held: Mapping[Any, Any], rows: int, cols: int) -> dict[int, B]:
    if not isinstance(held, Mapping):
        raise QueryError.single("bad_resident", f"held must map a group index to a bool matrix, got "
                                f"{type(held).__name__}", "held")
    out: dict[int, B] = {}
    for key, m in held.items():
        try:
            g = int(key)
        except (TypeError, ValueError):
            raise QueryError.single("bad_resident", f"held key {key!r} is not a group index", "held") from None
        if not 0 <= g < len(geom.groups) or not geom.groups[g].prefix_cacheable:
            raise QueryError.single(
                "group_not_prefix_cacheable",
                f"held names group {g}, which is not a prefix-cacheable group of this geometry",
                f"held.{key}",
                group=g,
            )
        arr = np.asarray(m)
        if arr.size and arr.dtype != np.bool_:
            raise QueryError.single("bad_resident", f"held[{key!r}] must be a bool matrix, got dtype {arr.dtype}",
                                    f"held.{key}")
        if arr.size == 0:
            arr = np.zeros((rows, 0), np.bool_)
        if arr.ndim != 2 or arr.shape[0] != rows:
            raise QueryError.single(
                "bad_shape", f"held[{key!r}] has shape {arr.shape}; expected ({rows}, hashes)", f"held.{key}"
            )
        fit = np.zeros((rows, cols), np.bool_)
        w = min(cols, arr.shape[1])
        fit[:, :w] = arr[:, :w]
        out[g] = fit
    return out


def _last_true(mask: B) -> I64:
    """Per row, the highest column that is true, or -1."""
    if mask.shape[1] == 0:
        return np.full(mask.shape[0], -1, np.int64)
    rev = mask[:, ::-1]
    idx = mask.shape[1] - 1 - np.argmax(rev, axis=1)
    return np.where(rev.any(axis=1), idx, -1).astype(np.int64)


def _run_down(blocks: B) -> I64:
    """``down[r, t]``: held blocks t, t-1, ... without a miss (0 when t is a miss)."""
    cols = blocks.shape[1]
    idx = np.arange(cols, dtype=np.int64)
    last_miss = np.maximum.accumulate(np.where(blocks, -1, idx[None, :]), axis=1) if cols else idx[None, :]
    return np.where(blocks, idx[None, :] - last_miss, 0).astype(np.int64)


class _Lookup:
    """The per-kind lookups of one spec group over all rows."""

    def __init__(self, sg: LookupGroup, held: dict[int, B], H: int, A: int, rows: int, cols: int) -> None:
        self.sg, self.S, self.H, self.A = sg, sg.span, H, A
        cells = np.ones((rows, cols), np.bool_)
        for m in sg.group_ids:
            cells &= held.get(m, np.zeros((rows, cols), np.bool_))
        self.cells = cells  # entry ending at (i+1)*H held by every member
        r = self.S // H
        self.blocks = cells[:, r - 1 :: r]  # span-aligned entries: block j ends at (j+1)*S
        self.nb = self.blocks.shape[1]
        self.fine = A < self.S and self.S % A == 0

    def full(self, lim: I64, chain: I64, drop: B) -> I64:
        S, A = self.S, self.A
        rows = lim.shape[0]
        if self.nb:
            lead = np.where(self.blocks.all(axis=1), self.nb, np.argmax(~self.blocks, axis=1))
        else:
            lead = np.zeros(rows, np.int64)
        count = np.minimum(lead, np.minimum(lim, chain) // S)
        hit = count * S
        if self.fine:
            r = S // A
            first = count * r
            top = np.minimum(np.minimum(first + r - 1, lim // A), chain // A)
            got = np.zeros(rows, np.bool_)
            cols = self.cells.shape[1]
            for k in range(1, r):
                f = top - k
                ok = ~got & (f >= first) & (f >= 0) & (f < cols)
                fi = np.clip(f, 0, max(cols - 1, 0))
                hitf = ok & (self.cells[np.arange(rows), fi] if cols else False)
                hit = np.where(hitf, (f + 1) * A, hit)
                got |= hitf
        hit = np.where(drop & (hit > 0), hit - min(A, S), hit)
        out: I64 = (hit - hit % A).astype(np.int64)
        return out

    def mamba(self, lim: I64, chain: I64) -> I64:
        S, A = self.S, self.A
        rows = lim.shape[0]
        if self.fine:
            last = _upto(self.cells, np.minimum(lim, chain) // A)
            return np.where(last >= 0, (last + 1) * A, 0).astype(np.int64)
        ends = (np.arange(self.nb, dtype=np.int64) + 1) * S
        ok = self.blocks & ((ends % A == 0) | (S == A))[None, :]
        last = _upto(ok, lim // S) if rows else np.zeros(0, np.int64)
        return np.where(last >= 0, (last + 1) * S, 0).astype(np.int64)

    def sliding(self, lim: I64, drop: B) -> I64:
        S, A = self.S, self.A
        assert self.sg.window is not None  # a sliding family always has a window
        base = -(-(self.sg.window - 1) // S)
        need = base + drop.astype(np.int64)
        top = lim // S - 1  # highest block the scan starts at
        idx = np.arange(self.nb, dtype=np.int64)
        down = _run_down(self.blocks)
        within = idx[None, :] <= top[:, None]
        edge = np.where(drop[:, None], idx[None, :], idx[None, :] + 1) * S
        aligned = (edge % A == 0) | (S == A)
        found_t = _last_true(self.blocks & aligned & within & (down >= need[:, None]))
        bottom_t = _last_true(self.blocks & aligned & within & (down == idx[None, :] + 1))
        length = np.where(found_t >= 0, found_t + 1, np.where(bottom_t >= 0, bottom_t + 1, 0))
        step = A // S if A % S == 0 and A > S else 1
        length = np.where(found_t >= 0, length, length - length % step)
        length = np.where(drop & (length > 0), length - 1, length)
        length = length - length % step
        out: I64 = (length * S).astype(np.int64)
        return out

    def chunked(self, lim: I64, chunk: int) -> I64:
        S = self.S
        rows = lim.shape[0]
        start = np.where(lim > 0, lim // chunk * chunk, 0) // S
        stop = lim // S
        padded = np.concatenate([self.blocks, np.zeros((rows, 1), np.bool_)], axis=1)
        idx = np.arange(padded.shape[1], dtype=np.int64)
        # next miss at or after each column
        miss = np.where(~padded, idx[None, :], padded.shape[1])
        next_miss = np.minimum.accumulate(miss[:, ::-1], axis=1)[:, ::-1]
        s = np.minimum(start, padded.shape[1] - 1)
        first_miss = next_miss[np.arange(rows), s] if rows else np.zeros(0, np.int64)
        out: I64 = (np.maximum(np.minimum(first_miss, stop), start) * S).astype(np.int64)
        return out

    def __call__(self, lim: I64, chain: I64, drop: B) -> I64:
        match self.sg.family:
            case "full":
                return self.full(lim, chain, drop)
            case "mamba":
                return self.mamba(lim, chain)
            case "sliding":
                return self.sliding(lim, drop)
            case "chunked":
                assert self.sg.chunk is not None  # a chunked family always has an attention chunk
                return self.chunked(lim, self.sg.chunk)
            case "cross" | "circular" | "hisparse" | "encoder":  # refused by refuse_unlookable / never cacheable
                return np.zeros(lim.shape[0], np.int64)
            case _:
                assert_never(self.sg.family)


def _upto(mask: B, limit: I64) -> I64:
    """Per row, the highest true column below ``limit`` (exclusive), or -1."""
    cols = mask.shape[1]
    if cols == 0:
        return np.full(mask.shape[0], -1, np.int64)
    idx = np.arange(cols, dtype=np.int64)
    last = np.maximum.accumulate(np.where(mask, idx[None, :], -1), axis=1)
    at = np.clip(limit - 1, 0, cols - 1)
    got = last[np.arange(mask.shape[0]), at]
    return np.where(limit > 0, got, -1).astype(np.int64)


def prefix_hits(geom: Geometry, num_tokens: Any, held: Mapping[Any, Any]) -> I64:
    """:func:`kvgeom.prefix.prefix_hit`'s ``hit_tokens`` for every row of ``held``.

    ``num_tokens``: one int for every row, or an int array of shape ``(R,)``; ``held``: per
    prefix-cacheable group a bool matrix ``(R, hashes)`` (see the module docstring). Returns an
    int64 array ``(R,)``. R is taken from the matrices (or from ``num_tokens`` when it is an array).
    """
    n = _tokens(num_tokens)
    rows_from_held = {np.asarray(m).shape[0] for m in held.values() if np.asarray(m).ndim == 2} if isinstance(
        held, Mapping) else set()
    if len(rows_from_held) > 1:
        raise QueryError.single("bad_shape", f"held matrices disagree on the number of rows: {sorted(rows_from_held)}",
                                "held")
    rows = n.shape[0] if np.ndim(num_tokens) else (rows_from_held.pop() if rows_from_held else 0)
    if np.ndim(num_tokens) == 0:
        n = np.full(rows, int(n[0]), np.int64)
    H = geom.hash_block_size
    P = geom.hash_lookahead_tokens
    chain = np.maximum(n - P, 0) // H * H  # Geometry.request_hashes per request, times H
    # Entries past the widest matrix are never held, and every lookup below reads a column past its
    # matrix as a miss; so the columns stop there, not at the longest chain (2^40 tokens would
    # otherwise allocate 2^36 columns for an empty residency: issue 19's hostile inputs).
    widest = max((np.shape(m)[1] for m in held.values() if np.ndim(m) == 2), default=0) if isinstance(
        held, Mapping) else 0
    cols = min(int(chain.max()) // H, widest) if rows else 0
    cells = _held(geom, held, rows, cols)
    # entries past each row's chain are never held
    if cols:
        past = np.arange(cols)[None, :] >= (chain // H)[:, None]
        for g in cells:
            cells[g] = cells[g] & ~past
    cap = np.maximum(n - 1, 0)
    out = np.zeros(rows, np.int64)
    if rows == 0 or not geom.config.cache.prefix_caching:
        return out
    specs = lookup_groups(geom)
    if not specs:
        return out
    refuse_unlookable(geom, specs)  # as the scalar prefix_hit: an unsupported group fails every row
    if unitary_coordinator(geom):
        sg = specs[0]
        look = _Lookup(sg, cells, H, sg.span, rows, cols)
        drop = np.full(rows, sg.proof_margin is not None)
        return np.where(cap > 0, look(cap, chain, drop), 0).astype(np.int64)
    A = geom.hit_alignment_tokens
    looks = [_Lookup(sg, cells, H, A, rows, cols) for sg in specs]
    simple = len(specs) == 2 and specs[0].full_attention
    hit = cap.copy()
    active = cap > 0
    verified = np.zeros((len(specs), rows), np.bool_)
    full_hits: dict[int, I64] = {}
    while active.any():
        curr = hit.copy()
        for idx, (sg, look) in enumerate(zip(specs, looks, strict=True)):
            if sg.full_attention and idx in full_hits:
                curr = np.minimum(curr, full_hits[idx])
                continue
            drop = np.full(rows, sg.proof_margin is not None) & ~verified[idx]
            lim = np.where(drop, np.minimum(curr + (sg.proof_margin or 0), chain), curr)
            new = look(lim, chain, drop)
            lowered = ~drop & (new < curr)
            verified[:, lowered] = False
            verified[idx] |= drop
            curr = new
            if sg.full_attention:
                full_hits[idx] = new
        done = active & (curr >= hit)
        out = np.where(done, curr, out)
        active &= ~done
        hit = np.where(active, curr, hit)
        if simple:
            out = np.where(active, hit, out)
            break
    return out.astype(np.int64)
