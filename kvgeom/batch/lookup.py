"""Batch hit lookups that read a :class:`kvgeom.Residency` directly (the batch twin of the lazy
:func:`kvgeom.hits.lookup_hit` over a Residency + hash chain).

A connector keeps one :class:`~kvgeom.Residency` current from its tier's store-complete and evict
events (:meth:`~kvgeom.Residency.add_key` / :meth:`~kvgeom.Residency.discard_key`, O(1) each) and
one :class:`RequestChains` current from its requests' block hashes (O(1) per new hash). A lookup
over many requests then reads both with numpy: per group, a bool array over hash ids kept by the
Residency, and one int64 matrix of hash ids, one row per request. Nothing is converted per key at
lookup time, and only the chunks the scans need are gathered.

Invariants (``tests/property/test_resident_batch_laws.py``):

* ``lookup_resident(...).hit(i) == lookup_hit(geom, n[i], stored=residency, block_hashes=chain[i], ...)``
  for every request, whatever order of adds and discards built the Residency;
* a :class:`RequestChains` row holds exactly the ids of the hashes given for that request, in order;
  hash index ``i`` of the row names the key ending at ``(i + 1) * H``; entries past the chain are 0
  (never held).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from kvgeom.batch._arrays import I64, Bools, ints, lookup_args, offload_of, same_length
from kvgeom.batch.hits import Hits, lookup_views
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry
from kvgeom.residency import Residency

__all__ = ["ChainRows", "RequestChains", "lookup_resident"]


class RequestChains:
    """The hash chains of the requests a connector tracks, as hash ids of one :class:`~kvgeom.Residency`.

    :meth:`update` takes a request's whole ``block_hashes`` list each time (vLLM's
    ``request.block_hashes`` grows as tokens arrive) and interns only the hashes it has not seen for
    that request: O(1) per new hash. Rows of finished requests are reused.

    >>> import kvgeom
    >>> r = kvgeom.Residency(); chains = RequestChains(r)
    >>> chains.update("req-1", [b"h0", b"h1"]); chains.update("req-1", [b"h0", b"h1", b"h2"])
    >>> chains.ids[chains.rows(["req-1"]).rows[0], :3].tolist()
    [1, 2, 3]
    """

    __slots__ = ("_free", "_len", "_row", "ids", "residency")

    def __init__(self, residency: Residency) -> None:
        if not isinstance(residency, Residency):
            raise QueryError.single(
                "bad_residency", f"RequestChains reads a kvgeom.Residency, got {type(residency).__name__}", "residency"
            )
        self.residency = residency
        self.ids = np.zeros((0, 0), dtype=np.int64)
        """Hash ids, one row per tracked request (0 past a request's chain). Read only."""
        self._row: dict[Hashable, int] = {}
        self._len: list[int] = []
        self._free: list[int] = []

    def _reserve(self, rows: int, width: int) -> None:
        width += 1  # the last column stays 0: a batch view clips every out-of-range column to it
        r, w = self.ids.shape
        if rows <= r and width <= w:
            return
        grown = np.zeros((max(rows, 2 * r if rows > r else r, 8), max(width, 2 * w if width > w else w, 64)),
                         dtype=self.ids.dtype)
        grown[:r, :w] = self.ids
        self.ids = grown

    def update(self, request_id: Hashable, block_hashes: Sequence[Hashable]) -> None:
        """Record ``request_id``'s hash chain (the full list; only its new tail is interned)."""
        if isinstance(block_hashes, str | bytes) or not isinstance(block_hashes, Sequence):
            raise QueryError.single(
                "bad_block_hashes",
                f"block_hashes must be a sequence of block hashes, got {type(block_hashes).__name__}",
                "block_hashes",
            )
        row = self._row.get(request_id)
        if row is None:
            row = self._free.pop() if self._free else len(self._len)
            if row == len(self._len):
                self._len.append(0)
            self._row[request_id] = row
        known = self._len[row]
        n = len(block_hashes)
        if n < known:
            raise QueryError.single(
                "chain_shrank",
                f"request {request_id!r} had {known} block hashes and now has {n}; a request's hash chain only grows "
                "(call remove() when the request is gone, then update() for a new one)",
                "block_hashes",
            )
        if n > known:
            self._reserve(row + 1, n)
            self.ids[row, known:n] = self.residency.intern(block_hashes[known:n])
            self._len[row] = n

    def remove(self, request_id: Hashable) -> None:
        """Forget a request (its row is reused)."""
        row = self._row.pop(request_id, None)
        if row is not None:
            self.ids[row, : self._len[row]] = 0
            self._len[row] = 0
            self._free.append(row)

    def rows(self, request_ids: Sequence[Hashable]) -> ChainRows:
        """The rows of ``request_ids`` (in that order) for :func:`lookup_resident`."""
        try:
            rows = np.array([self._row[r] for r in request_ids], dtype=np.int64)
        except KeyError as e:
            raise QueryError.single(
                "unknown_request", f"request {e.args[0]!r} is not tracked; call update() with its block hashes first",
                "request_ids",
            ) from None
        return ChainRows(self, rows)

    def __len__(self) -> int:
        return len(self._row)


def _check_chain_lengths(geom: Geometry, n: I64, lengths: I64) -> None:
    """:func:`kvgeom.probes.check_chain_length` per request: the first request whose chain is short is named."""
    needed = np.maximum(n - geom.hash_lookahead_tokens, 0) // geom.hash_block_size
    short = np.flatnonzero(lengths < needed)
    if short.size:
        i = int(short[0])
        raise QueryError.single(
            "block_hashes_too_short",
            f"request {i}'s chain holds {int(lengths[i])} hashes; a request of num_tokens={int(n[i])} has "
            f"{int(needed[i])} (one per H={geom.hash_block_size} tokens, less the {geom.hash_lookahead_tokens} "
            "look-ahead tokens): pass each request's whole chain (vLLM: request.block_hashes)",
            "chains",
            request=i,
            num_hashes=int(lengths[i]),
            needed=int(needed[i]),
        )


class ChainRows:
    """A selection of :class:`RequestChains` rows, one per request of a batch lookup."""

    __slots__ = ("chains", "rows")

    def __init__(self, chains: RequestChains, rows: I64) -> None:
        self.chains = chains
        self.rows = rows


class _ResidentView:
    """One group's held keys for the requests of a batch: ``held[ids[row_of[r], col]]``."""

    __slots__ = ("chunks", "flat", "held", "hpc", "row_base", "width")

    def __init__(self, ids: I64, row_of: I64, held: Bools, hashes_per_chunk: int) -> None:
        self.flat = ids.reshape(-1)
        self.width = ids.shape[1]
        self.row_base = row_of * self.width
        self.held = held
        self.hpc = hashes_per_chunk
        self.chunks = self.width // hashes_per_chunk

    def hashes(self, rows: I64, cols: I64) -> Bools:
        return self._gather(rows, np.array(cols, dtype=np.int64, copy=True))

    def __call__(self, rows: I64, chunks: I64) -> Bools:
        cols = chunks * self.hpc  # a fresh array: the gather below works in place on it
        cols += self.hpc - 1
        return self._gather(rows, cols)

    def _gather(self, rows: I64, cols: I64) -> Bools:
        """``held[ids[row_of[rows], cols]]``, overwriting ``cols``."""
        if self.width == 0:
            return np.zeros(np.broadcast_shapes(rows.shape, cols.shape), dtype=np.bool_)
        # The matrix's last column is always 0 (id 0: never held). Negative columns read as huge unsigned
        # numbers, so one minimum sends every column outside [0, width - 1) there.
        u = cols.view(np.uint64)
        np.minimum(u, np.uint64(self.width - 1), out=u)
        base = self.row_base[rows]
        if np.broadcast_shapes(base.shape, cols.shape) == cols.shape:
            cols += base
        else:
            cols = cols + base
        held: Bools = np.take(self.held, np.take(self.flat, cols))
        return held


def lookup_resident(
    geom: Geometry,
    residency: Residency,
    chains: ChainRows | Sequence[Sequence[Hashable]],
    num_tokens: Any,
    *,
    holder: int = 0,
    num_prompt_tokens: Any = None,
    local_computed_tokens: Any = None,
    max_load_tokens: Any = None,
    max_num_new_tokens: Any = None,
) -> Hits:
    """:func:`kvgeom.hits.lookup_hit` over a :class:`~kvgeom.Residency` for many requests at once.

    ``chains`` is either ``RequestChains.rows(request_ids)`` (the chains a connector keeps current,
    nothing converted here) or a list of hash chains, one per request (interned on this call, one
    dict read per hash). ``num_tokens`` and the optional arguments are as in
    :func:`kvgeom.batch.lookup_hits`. Result: ``Hits.hit(i) == lookup_hit(geom, num_tokens[i],
    stored=residency, block_hashes=chain_i, holder=holder, ...)``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)          # H = 16; chunks 32 (attention), 16 (Mamba)
    >>> chain = [b"h%d" % i for i in range(4)]
    >>> r = kvgeom.Residency()
    >>> for i in range(4): r.add(1, chain[i])
    >>> r.add(0, chain[1]); r.add(0, chain[3])
    >>> lookup_resident(g, r, [chain, chain[:2], [b"x", b"y", b"z"]], [65, 40, 48]).end_token.tolist()
    [64, 32, 0]
    """
    off = offload_of(geom)
    if not isinstance(residency, Residency):
        raise QueryError.single(
            "bad_residency", f"lookup_resident reads a kvgeom.Residency, got {type(residency).__name__}", "residency"
        )
    n = ints("num_tokens", num_tokens)
    size = n.shape[0]
    if isinstance(chains, ChainRows):
        if chains.chains.residency is not residency:
            raise QueryError.single(
                "foreign_chains", "these RequestChains intern hashes against another Residency", "chains"
            )
        ids, row_of = chains.chains.ids, chains.rows
        tracked = chains.chains
    else:
        if isinstance(chains, str | bytes) or not isinstance(chains, Sequence):
            raise QueryError.single(
                "bad_chains", f"chains must be RequestChains.rows(...) or a list of hash chains, got "
                f"{type(chains).__name__}", "chains",
            )
        tmp = RequestChains(residency)
        for i, chain in enumerate(chains):
            tmp.update(i, chain)
        ids, row_of, tracked = tmp.ids, np.arange(len(chains), dtype=np.int64), tmp
    same_length("chains", row_of, size)
    _check_chain_lengths(geom, n, np.asarray(tracked._len, dtype=np.int64)[row_of])
    prompt, local, mnn, mlt = lookup_args(
        n, num_prompt_tokens, local_computed_tokens, max_num_new_tokens, max_load_tokens
    )
    views = {
        og.index: _ResidentView(ids, row_of, residency.held_array(og.index, holder), og.hashes_per_chunk)
        for og in off.groups
    }
    return lookup_views(geom, off, n, prompt, local, mlt, mnn, views)
