"""Router scoring: the effective prefix-cache hit of one request on every replica, per tier, in one
vectorised call.

A KV-aware router (llm-d's precise prefix-cache scorer, NVIDIA Dynamo's KV router) knows, per
replica, which block hashes each cache group holds (:class:`kvgeom.events.KVEventReader` keeps that
from vLLM's KV events) and must turn it into *one* hit length per replica. For a hybrid model that
is not "the longest run of held hashes": the groups' holes fall in different places, and vLLM
0.33's ``HybridKVCacheCoordinator.find_longest_cache_hit`` (``v1/core/kv_cache_coordinator.py``)
reconciles them with per-family rules (``v1/core/single_type_kv_cache_manager.py``):

* full attention: the run of held full blocks from token 0, then (partial hash hits, A = H) the
  highest held hash boundary inside the next block;
* sliding window: right to left, the last A-aligned block end with ``cdiv(sw - 1, S)`` held blocks
  before it (or a shorter run that reaches token 0);
* chunked local: the blocks of the current attention chunk, left to right;
* Mamba (align): the last held state at or below the candidate (an exact state, never a nearby
  one), on the H grid with partial hash hits, else on block ends that are multiples of A;
* groups with equal specs are looked up together (a hash counts only when all of them hold it);
  full attention first, then the others, repeated until no group lowers the candidate (once for
  one full-attention group plus one other);
* the candidate starts at ``num_tokens - 1``: the last token is always recomputed.

Speculative decoding's drop (a group with ``GroupGeometry.proof_margin``) is not in these kernels: on
such a geometry the scores come from :func:`kvgeom.batch.prefix.prefix_hits`, the (rows x hashes)
batch twin of ``prefix_hit``, with one row per replica.

This module is the batch twin of :func:`kvgeom.prefix.prefix_hit` over replicas; the residency of
replica r is holder bit r. Two kernel paths give the same answers:

* bit-parallel (full-attention and Mamba groups, the common hybrid): the rules run on the holder
  bit masks ``Residency`` stores per hash, one Python integer operation for all replicas, with
  per-replica values kept as a partition ``{value: replicas}``;
* matrix (every family): the held hashes become a (hashes x replicas) boolean matrix per group and
  every rule is a few elementwise numpy passes reduced with ``max(axis=0)`` (leading run, last held
  row below a per-replica limit, windows of held blocks by doubling).

Invariants (property-tested in ``tests/property/test_router_laws.py``):

* per replica and tier, the score equals the scalar ``prefix_hit`` of that replica's residency
  (``residency.probe(geom, chain, holder=r)``);
* ``0 <= score <= num_tokens - 1``, and a score is a multiple of A;
* scores read from a replayed event stream equal scores read from a residency built from the
  stream's final state;
* with ``cumulative=True`` a tier's score is computed on the union of that tier and the tiers
  before it, so it never falls below the previous tier's.

>>> import kvgeom
>>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)     # full attention span 32 + Mamba 16, H = A = 16
>>> gpu = kvgeom.Residency()
>>> for h in ["h1", "h3"]: gpu.add(0, h, holder=0); gpu.add(0, h, holder=1)
>>> for h in ["h0", "h1", "h2"]: gpu.add(1, h, holder=0)
>>> gpu.add(1, "h0", holder=1)
>>> score_replicas(g, gpu, [["h0", "h1", "h2", "h3"]], 65, num_replicas=2).hit_tokens[0, 0].tolist()
[48, 16]
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence, Sized
from dataclasses import dataclass
from itertools import accumulate, compress, count, takewhile
from operator import and_, ne
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kvgeom._check import bounded_ints, nonneg
from kvgeom._format import show
from kvgeom._math import INT64_MAX, cdiv
from kvgeom.batch._arrays import MAX_RESULT, check_total
from kvgeom.errors import QueryError
from kvgeom.holders import WORD_BITS, PackedHolders
from kvgeom.prefix import LookupGroup, lookup_groups, refuse_unlookable, unitary_coordinator
from kvgeom.residency import Residency

if TYPE_CHECKING:
    from kvgeom.events import KVEventReader
    from kvgeom.geometry import Geometry

__all__ = [
    "MAX_REPLICAS",
    "LookupGroup",
    "RouterScores",
    "chain_matrix",
    "lookup_groups",
    "replica_hits",
    "score_replicas",
]

BoolMatrix = npt.NDArray[np.bool_]
IntVector = npt.NDArray[np.int64]
Words = npt.NDArray[np.uint64]


# -- the held matrix ---------------------------------------------------------------------------------
def _chain_masks(residency: Residency, group: int, chain: Sequence[Hashable], num_replicas: int) -> list[int]:
    """Holder bit masks of ``chain`` in ``group``, checked against ``num_replicas``."""
    try:
        masks = residency.chain_masks(group, chain)
    except TypeError as e:  # an unhashable hash (a list from a careless decoder)
        raise QueryError.single("bad_block_hash", f"the hash chain holds an unhashable value: {e}", "chain") from e
    highest = max(masks, default=0)  # holder masks are non-negative: the largest has the highest bit
    if highest >> num_replicas:
        union = 0
        for m in masks:
            union |= m
        top = union.bit_length() - 1
        raise QueryError.single(
            "replica_out_of_range",
            f"replica {top} holds entries of group {group} but num_replicas={num_replicas}; pass num_replicas > {top}",
            "num_replicas", num_replicas=num_replicas, replica=top)
    return masks


def _unpack(masks: list[int], num_replicas: int) -> BoolMatrix:
    n = len(masks)
    if num_replicas == 0 or not any(masks):
        return np.zeros((n, num_replicas), dtype=bool)
    nb = (num_replicas + 7) // 8
    packed = np.frombuffer(b"".join([m.to_bytes(nb, "little") for m in masks]), dtype=np.uint8).reshape(n, nb)
    return np.unpackbits(packed, axis=1, count=num_replicas, bitorder="little").view(bool)


#: Most replicas a router scores (a holder is one bit of a Residency entry; 2^40 replicas would allocate a
#: terabyte): past it :class:`kvgeom.QueryError` ``result_too_large`` (issue 19).
MAX_REPLICAS = 1 << 16


def _replica_count(num_replicas: Any) -> int:
    """``num_replicas`` checked: an int in ``[0, MAX_REPLICAS]``."""
    R = nonneg("num_replicas", num_replicas)
    if R > MAX_REPLICAS:
        raise QueryError.single(
            "result_too_large",
            f"num_replicas={R}: a router scores at most {MAX_REPLICAS} replicas (one holder bit each)",
            "num_replicas",
            num_replicas=R,
            limit=MAX_REPLICAS,
        )
    return R


def chain_matrix(residency: Residency, group: int, chain: Sequence[Hashable], num_replicas: int) -> BoolMatrix:
    """``M[i, r]``: replica ``r`` (holder bit r) holds ``group``'s entry keyed by ``chain[i]``, i.e.
    the entry ending at token ``(i+1)*H``. Shape ``(len(chain), num_replicas)``.

    >>> r = Residency(); r.add(0, "a", holder=1); r.add(0, "b", holder=0)
    >>> chain_matrix(r, 0, ["a", "b", "c"], 2).astype(int).tolist()
    [[0, 1], [1, 0], [0, 0]]
    """
    R = _replica_count(num_replicas)
    if isinstance(chain, Sized):  # (hashes, replicas) bools, refused before allocating
        try:
            n = len(chain)
        except TypeError as e:  # Sized by type, not by value: a 0-d numpy array (found by the fuzz law, thorough)
            raise QueryError.single(
                "bad_chain", f"chain must be a sequence of block hashes, one per H tokens; got a "
                f"{type(chain).__name__} with no length ({e}): pass a list or a 1-d array", "chain") from e
        check_total("chain_matrix", n * R)
    return _unpack(_chain_masks(residency, group, chain, R), R)


# -- vectorised kernels ------------------------------------------------------------------------------
def _row_index(n: int) -> npt.NDArray[np.signedinteger[Any]]:
    """Row numbers 0..n-1 as a column, in the narrowest dtype that holds -1..n+1 (less memory traffic)."""
    rows: npt.NDArray[np.signedinteger[Any]] = np.arange(n, dtype=np.int16 if n < 2**15 - 2 else np.int32)
    return rows[:, None]


# The kernels below reduce (rows, replicas) C-ordered matrices along axis 0 only with elementwise
# arithmetic followed by ``max(axis=0)``: numpy runs those row by row over whole rows, while
# argmin/argmax/cumsum/accumulate along axis 0 go column by column and are ~20x slower here.
def _leading_run(F: BoolMatrix) -> IntVector:
    """Per column, the number of leading True rows."""
    n, R = F.shape
    if n == 0:
        return np.zeros(R, dtype=np.int64)
    rows = _row_index(n)
    out: IntVector = n - ((~F) * (n - rows)).max(axis=0).astype(np.int64)
    return out


def _last_true_below(Y: BoolMatrix, limit: IntVector) -> IntVector:
    """Per column r, the largest row index j < limit[r] with Y[j, r], else -1."""
    n, R = Y.shape
    if n == 0:
        return np.full(R, -1, dtype=np.int64)
    rows = _row_index(n)
    below = rows < np.clip(limit, 0, n).astype(rows.dtype)[None, :]
    out: IntVector = ((Y & below) * (rows + 1)).max(axis=0).astype(np.int64) - 1
    return out


def _first_false_from(F: BoolMatrix, start: IntVector) -> IntVector:
    """Per column r, the first row j >= start[r] with F[j, r] False (the row count when there is none)."""
    n, R = F.shape
    if n == 0:
        return np.zeros(R, dtype=np.int64)
    rows = _row_index(n)
    from_start = rows >= np.clip(start, 0, n).astype(rows.dtype)[None, :]
    out: IntVector = n - (((~F) & from_start) * (n - rows)).max(axis=0).astype(np.int64)
    return out


def _window_all(F: BoolMatrix, c: int) -> BoolMatrix:
    """``W[j, r]``: rows ``j-c+1 .. j`` of column r are all True (False for j < c - 1). O(log c) passes."""
    n, R = F.shape
    out = np.zeros((n, R), dtype=bool)
    if c > n or c <= 0:
        return out
    # Windows are kept aligned by their end row: an array for length w has n-w+1 rows, row i ending at i+w-1.
    acc: BoolMatrix | None = None
    acc_len = 0
    power, p_len, k = F, 1, c
    while True:
        if k & 1:
            if acc is None:
                acc, acc_len = power, p_len
            else:  # window of acc_len + p_len ending at t: acc's ending at t, power's ending at t - acc_len
                rows_out = n - acc_len - p_len + 1
                acc = acc[p_len:] & power[:rows_out]
                acc_len += p_len
        k >>= 1
        if not k:
            break
        rows_out = n - 2 * p_len + 1
        power = power[p_len:] & power[:rows_out]
        p_len *= 2
    assert acc is not None and acc_len == c
    out[c - 1 :] = acc
    return out


class _Lookup:
    """One lookup group's finder over all replicas, with everything independent of the candidate
    length precomputed once per request."""

    def __init__(self, lg: LookupGroup, X: BoolMatrix, H: int, A: int) -> None:
        self.lg = lg
        self.H, self.A, self.S = H, A, lg.span
        self.X = X
        n_h, R = X.shape
        self.n_h, self.R = n_h, R
        S = lg.span
        s = S // H
        self.s = s
        nblk = n_h // s
        self.nblk = nblk
        self.F = X[s - 1 : nblk * s : s]  # held full blocks: the hash at each block's end
        self.fine = A < S and S % A == 0
        self.cols = np.arange(R)
        match lg.family:
            case "full":
                self.run0 = _leading_run(self.F)
            case "sliding":
                assert lg.window is not None
                need = max(cdiv(lg.window - 1, S), 1)
                aligned = (np.arange(1, nblk + 1) * S) % A == 0
                # a run of `need` held blocks ending at the hit, or a shorter run that starts at block 0
                short = _row_index(nblk) < np.minimum(_leading_run(self.F), need - 1)[None, :]
                self.V = aligned[:, None] & (_window_all(self.F, need) | short)
            case "chunked":
                pass
            case "mamba":
                if not self.fine:
                    e = np.arange(1, nblk + 1)
                    self.V = self.F & ((e * S) % A == 0)[:, None]
            case _:  # pragma: no cover - lookup_groups refuses the others
                raise AssertionError(lg.family)

    def __call__(self, m: IntVector) -> IntVector:
        S, A = self.S, self.A
        match self.lg.family:
            case "full":
                k = np.minimum(self.run0, m // S)
                hit = k * S
                if self.fine:
                    s, n_h = self.s, self.n_h
                    lo = k * s
                    hi = np.minimum(np.minimum(lo + s - 1, m // A), n_h)
                    found = np.full(self.R, -1, dtype=np.int64)
                    for d in range(s - 2, -1, -1):  # the highest interior boundary first
                        idx = lo + d
                        ok = (found < 0) & (idx < hi)
                        if not ok.any():
                            continue
                        held = self.X[np.minimum(idx, n_h - 1), self.cols] & ok
                        found = np.where(held, idx, found)
                    hit = np.where(found >= 0, (found + 1) * A, hit)
                out: IntVector = hit - hit % A
                return out
            case "sliding":
                idx = _last_true_below(self.V, np.minimum(m // S, self.nblk))
                return (idx + 1) * S
            case "chunked":
                assert self.lg.chunk is not None
                chunk = self.lg.chunk
                sb = (m // chunk * chunk) // S
                mb = m // S
                run = np.maximum(_first_false_from(self.F, sb) - sb, 0)
                local: IntVector = ((sb + np.minimum(run, mb - sb)) * S).astype(np.int64)
                return local
            case _:  # mamba
                if self.fine:
                    idx = _last_true_below(self.X, np.minimum(m // A, self.n_h))
                    return (idx + 1) * A
                idx = _last_true_below(self.V, np.minimum(m // S, self.nblk))
                return (idx + 1) * S


def _drops(geom: Geometry) -> bool:
    """Whether a group takes the speculative-decoding drop (``GroupGeometry.proof_margin`` set)."""
    return any(g.proof_margin is not None and g.prefix_cacheable for g in geom.groups)


def _drop_hits(geom: Geometry, num_tokens: int, held: Mapping[int, BoolMatrix]) -> IntVector:
    """Geometries with the speculative drop: the (rows x hashes) batch twin of ``prefix_hit``
    (:func:`kvgeom.batch.prefix.prefix_hits`), one row per replica."""
    from kvgeom.batch.prefix import prefix_hits as rows_hits

    R = next(iter(held.values())).shape[1] if held else 0
    out: IntVector = rows_hits(geom, np.full(R, num_tokens, dtype=np.int64), {g: m.T for g, m in held.items()})
    return out


def replica_hits(geom: Geometry, held: Mapping[int, BoolMatrix], num_tokens: int) -> IntVector:
    """The GPU prefix-cache hit of one request on every replica at once.

    ``held[g]`` is the ``(hashes, replicas)`` boolean matrix of group g (:func:`chain_matrix`):
    ``held[g][i, r]`` iff replica r holds group g's entry ending at token ``(i+1)*H``. Every
    prefix-cacheable group needs a matrix, all of one shape. Returns an int64 vector, one hit per
    replica, as vLLM 0.33's coordinator computes it (see the module docstring).

    Postconditions: ``0 <= hit <= max(num_tokens - 1, 0)``, ``hit % A == 0``, and column r equals
    the scalar ``kvgeom.prefix.prefix_hit`` on replica r's residency.

    >>> import kvgeom, numpy as np
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> fa = np.array([[0], [1], [0], [1]], dtype=bool)     # attention blocks ending at 32 and 64
    >>> mamba = np.array([[1], [0], [1], [0]], dtype=bool)  # Mamba states after 16 and 48 tokens
    >>> replica_hits(g, {0: fa, 1: mamba}, 65).tolist()
    [48]
    """
    n_tokens = nonneg("num_tokens", num_tokens)
    plan = lookup_groups(geom)
    refuse_unlookable(geom, plan)
    shapes = {np.shape(held[g]) for lg in plan for g in lg.group_ids if g in held}
    missing = [g for lg in plan for g in lg.group_ids if g not in held]
    if missing or len(shapes) > 1:
        raise QueryError.single(
            "bad_held_matrices",
            f"replica_hits needs one (hashes, replicas) matrix per prefix-cacheable group, all of one shape; "
            f"missing groups {missing}, shapes {sorted(shapes)}", "held", missing=missing)
    if not plan:
        return np.zeros(0, dtype=np.int64)
    n_h, R = shapes.pop()
    H = geom.hash_block_size
    if n_h > n_tokens // H:
        raise QueryError.single(
            "chain_too_long",
            f"{n_h} hashes of H={H} tokens cover more than num_tokens={n_tokens}; the chain holds one hash per "
            f"complete H-token block ({n_tokens // H} here)", "held", num_hashes=n_h, num_tokens=n_tokens)
    if not geom.config.cache.prefix_caching:
        return np.zeros(R, dtype=np.int64)
    if _drops(geom):
        return _drop_hits(geom, n_tokens, {g: np.asarray(held[g], dtype=bool) for lg in plan for g in lg.group_ids})
    A = geom.hit_alignment_tokens
    lookups = []
    for lg in plan:
        X = np.asarray(held[lg.group_ids[0]], dtype=bool)
        for g in lg.group_ids[1:]:
            X = X & np.asarray(held[g], dtype=bool)
        lookups.append(_Lookup(lg, X, H, A))
    if unitary_coordinator(geom):  # one lookup, no fixed point (chunk 3, block 2: a second pass lowered 2 to 0)
        out: IntVector = lookups[0](np.full(R, max(n_tokens - 1, 0), dtype=np.int64))
        return out
    simple = len(plan) == 2 and plan[0].full_attention
    hit = np.full(R, max(n_tokens - 1, 0), dtype=np.int64)
    fa_hit: dict[int, IntVector] = {}
    while True:
        curr = hit
        for i, lk in enumerate(lookups):
            if lk.lg.full_attention and i in fa_hit:
                curr = np.minimum(curr, fa_hit[i])  # full attention is downward-closed: looked up once
                continue
            curr = lk(curr)
            if lk.lg.full_attention:
                fa_hit[i] = curr
        converged = bool((curr >= hit).all())
        hit = curr
        if converged or simple:
            return hit


# -- the bit-parallel path ----------------------------------------------------------------------------
# Residency stores, per hash, the set of holders as one Python int (bit r = replica r). For groups of
# the full-attention and Mamba families the coordinator's rules only need "which replicas hold this
# hash" per row, so they can run on those ints directly, 1,000 replicas per integer operation, with
# no (hashes x replicas) matrix at all. Per-replica values are kept as a partition: {value: set of
# replicas with that value}, disjoint sets covering every replica. Same answers as the matrix kernels
# (``tests/property/test_router_laws.py`` checks both against the scalar reference).
Partition = dict[int, int]

_BIT_FAMILIES = frozenset({"full", "mamba"})


def _first(item: tuple[int, int]) -> int:
    return item[0]


def _put(out: Partition, value: int, bits: int) -> None:
    if bits:
        out[value] = out.get(value, 0) | bits


def _pmin(p: Partition, q: Partition) -> Partition:
    """Per replica, the smaller of its values in ``p`` and ``q`` (two partitions of the same replicas).

    One sweep over both in ascending value: a replica is settled the first time it is seen, which is at
    its smaller value. ``O((len(p) + len(q)) log)`` integer operations, never ``len(p) * len(q)``: the
    pairwise form was quadratic in the number of distinct hits (issue 23)."""
    out: Partition = {}
    seen = 0
    for v, b in sorted([*p.items(), *q.items()], key=_first):
        new = b & ~seen
        if new:
            _put(out, v, new)
            seen |= new
    return out


def _leading_runs(blocks: list[int], everyone: int) -> Partition:
    """The run of held blocks from block 0 per replica, as ``{run length: replicas}``.

    The replicas alive after each block are a running AND (``itertools.accumulate``, in C), cut at the
    first empty set; the alive sets are nested, so they change exactly where their sizes do, and only those
    places cost a Python step. ``O(len(blocks))`` integer operations plus one step per distinct run."""
    alive = list(takewhile(bool, accumulate(blocks, and_, initial=everyone)))
    if not alive:
        return {}
    sizes = list(map(int.bit_count, alive))
    last = len(alive) - 1
    run: Partition = {j: alive[j] ^ alive[j + 1] for j in compress(count(), map(ne, sizes, sizes[1:]))}
    run[last] = alive[last]  # alive to the end (or until the next block, which no replica holds)
    return run


class _BitLookup:
    """One lookup group's finder on holder bit masks (families "full" and "mamba" only)."""

    def __init__(self, lg: LookupGroup, masks: list[int], H: int, A: int, everyone: int) -> None:
        self.lg, self.masks, self.H, self.A = lg, masks, H, A
        S = lg.span
        self.S, self.s = S, S // H
        self.n_h = len(masks)
        self.nblk = self.n_h // self.s
        self.fine = A < S and S % A == 0
        self._states: tuple[list[int], int, int] | None = None
        if lg.family == "full":
            self.run = _leading_runs(masks[self.s - 1 : self.nblk * self.s : self.s], everyone)

    def __call__(self, cand: Partition) -> Partition:
        if self.lg.family == "full":
            return self._full(cand)
        return self._mamba(cand)

    def _full(self, cand: Partition) -> Partition:
        # Per replica k = min(run, m // S). Where k = run < m // S the hit depends on the run alone (with
        # fine hits A = H, so the block after the run ends at or below the candidate); elsewhere on m alone.
        # So the replicas fall into at most len(cand) + len(run) classes, found in one ascending sweep.
        S = self.S
        out: Partition = {}
        if len(cand) == 1:
            ((m, mbits),) = cand.items()
            cap, top = m // S, m // self.A
            for run, rbits in self.run.items():
                b = mbits & rbits
                if b:
                    self._full_hit(run if run < cap else cap, top, b, out)
            return out
        limit = self.n_h + 1  # no candidate bound
        items = [(m // S, 0, m, b) for m, b in cand.items()] + [(run, 1, run, b) for run, b in self.run.items()]
        items.sort()
        seen = 0
        for k, side, key, b in items:  # at equal k the candidate side first: then k = m // S
            new = b & ~seen
            if new:
                seen |= new
                self._full_hit(k, key // self.A if side == 0 else limit, new, out)
        return out

    def _full_hit(self, k: int, top: int, b: int, out: Partition) -> None:
        """Hits of the replicas ``b`` whose full-block run is cut at block ``k``, below candidate hash
        boundary ``top`` (candidate // A), into ``out``."""
        S, s, A, H, masks = self.S, self.s, self.A, self.H, self.masks
        if self.fine:  # the highest held hash boundary inside block k, below the candidate
            lo = k * s
            idx = min(lo + s - 1, top, self.n_h) - 1
            while idx >= lo:
                found = masks[idx] & b
                if found:
                    hit = (idx + 1) * H
                    hit -= hit % A
                    _put(out, hit, found)
                    b ^= found
                    if not b:
                        return
                idx -= 1
        hit = k * S
        hit -= hit % A
        _put(out, hit, b)

    def _mamba(self, cand: Partition) -> Partition:
        # rows[i]: holders of the state that a hit of rank i would restore (0 where no state may land)
        rows, unit, n_ranks = self.state_rows()
        limits = sorted([(min(m // unit, n_ranks), b) for m, b in cand.items()], key=_first, reverse=True)
        out: Partition = {}
        pending = 0
        for k, (lim, b) in enumerate(limits):
            pending |= b
            lower = limits[k + 1][0] if k + 1 < len(limits) else 0
            for i in range(lim - 1, lower - 1, -1):  # the last held state below each replica's limit
                if not pending:
                    break
                found = rows[i] & pending
                if found:
                    out[(i + 1) * unit] = found  # one rank per value: no merge needed
                    pending ^= found
        _put(out, 0, pending)
        return out

    def state_rows(self) -> tuple[list[int], int, int]:
        """Mamba candidates as (holder masks by rank, tokens per rank, number of ranks): every hash boundary
        with fine-grained hits (A = H < S), else the block ends that are multiples of A."""
        if self._states is None:
            S, s, A, masks = self.S, self.s, self.A, self.masks
            if self.fine:
                self._states = (masks, A, self.n_h)
            else:
                if S % A == 0:  # every block end is on the alignment
                    rows = masks[s - 1 : self.nblk * s : s]
                else:
                    rows = [masks[(i + 1) * s - 1] if ((i + 1) * S) % A == 0 else 0 for i in range(self.nblk)]
                self._states = (rows, S, self.nblk)
        return self._states


def _bit_hits(plan: Sequence[LookupGroup], masks: Mapping[int, list[int]], num_tokens: int, H: int, A: int,
              everyone: int) -> Partition:
    """The coordinator loop of :func:`replica_hits` on holder bit masks (every family in ``_BIT_FAMILIES``)."""
    lookups = []
    for lg in plan:
        joint = masks[lg.group_ids[0]]
        for g in lg.group_ids[1:]:
            joint = [a & b for a, b in zip(joint, masks[g], strict=True)]
        lookups.append(_BitLookup(lg, joint, H, A, everyone))
    hit: Partition = {max(num_tokens - 1, 0): everyone}
    if len(lookups) == 1:  # one lookup group: one lookup (vLLM's UnitaryKVCacheCoordinator); a second pass
        return lookups[0](hit)  # could not lower it, every finder returns a hit it would return again
    simple = len(plan) == 2 and plan[0].full_attention
    fa_hit: dict[int, Partition] = {}
    while True:
        curr = hit
        for i, lk in enumerate(lookups):
            if lk.lg.full_attention and i in fa_hit:
                curr = _pmin(curr, fa_hit[i])
                continue
            curr = lk(curr)
            if lk.lg.full_attention:
                fa_hit[i] = curr
        converged = curr == hit
        hit = curr
        if converged or simple:
            return hit


def _unpartition(p: Partition, num_replicas: int) -> IntVector:
    """Per-replica values of a partition. Bit-sliced: group j's replicas get index j+1 written in binary
    across a dozen ints (an OR-reduction over the packed groups per bit), so the cost stays at one pass over
    the packed masks, not a (groups x replicas) matrix."""
    items = [(v, b) for v, b in p.items() if v and b]
    if not items or num_replicas == 0:
        return np.zeros(num_replicas, dtype=np.int64)
    nb = (num_replicas + 7) // 8
    k = len(items)
    packed = np.frombuffer(b"".join([b.to_bytes(nb, "little") for _, b in items]), dtype=np.uint8).reshape(k, nb)
    codes = np.arange(1, k + 1)
    nbits = int(k).bit_length()
    planes = np.empty((nbits, nb), dtype=np.uint8)
    for t in range(nbits):
        planes[t] = np.bitwise_or.reduce(packed[(codes >> t) & 1 == 1], axis=0)
    bits = np.unpackbits(planes, axis=1, count=num_replicas, bitorder="little").astype(np.int64)
    index = (np.int64(1) << np.arange(nbits, dtype=np.int64)) @ bits  # 0: no group, else j + 1
    values = np.concatenate([np.zeros(1, dtype=np.int64), np.asarray([v for v, _ in items], dtype=np.int64)])
    out: IntVector = values[index]
    return out


# -- the packed path -----------------------------------------------------------------------------------
# A KVEventReader keeps each medium's holders also as packed uint64 rows (kvgeom.holders.PackedHolders). For
# the geometry a router without group rules can score (one full-attention lookup group, hits on block ends)
# the leading run of every replica comes from a handful of numpy passes over the chain's rows: no Python step
# per hash beyond the dict read, none per replica. Same answers as the other paths (test_router_laws.py).
def _packed_ok(plan: Sequence[LookupGroup], A: int) -> bool:
    """One full-attention lookup group whose hits land on block ends (no partial hash hits inside a block)."""
    return len(plan) == 1 and plan[0].family == "full" and not (plan[0].span > A and plan[0].span % A == 0)


def _packed_chain(packed: PackedHolders, group: int, chain: Sequence[Hashable], blocks: Sequence[Hashable],
                  R: int, leading: bool = False) -> Words:
    """``group``'s packed holder rows of ``blocks`` (hashes of ``chain``) and one zero row after them (the
    sentinel :func:`_packed_full_hits` reads), after checking the whole chain against ``R`` as
    :func:`_chain_masks` does (only when some holder at or past R was ever added). With ``leading`` the rows
    stop at the first block no holder has a row for (:meth:`PackedHolders.leading_rows`: the same leading
    run, read by runs of rows); the blocks past it are still checked hashable, as a dict read per block
    would (a block read inside a run was looked up or compared equal to a held hash)."""
    try:
        if packed.top_holder >= R:
            rows = packed.rows(group, chain)
            if rows.size:
                w0, b0 = divmod(R, WORD_BITS)
                if (rows[:, w0] >> np.uint64(b0)).any() or rows[:, w0 + 1 :].any():
                    top = int.from_bytes(np.bitwise_or.reduce(rows, axis=0).tobytes(), "little").bit_length() - 1
                    raise QueryError.single(
                        "replica_out_of_range",
                        f"replica {top} holds entries of group {group} but num_replicas={R}; pass num_replicas > "
                        f"{top}", "num_replicas", num_replicas=R, replica=top)
        if leading:
            rows = packed.leading_rows(group, blocks, sentinel=True)
            hash(tuple(blocks[rows.shape[0] - 1 :]))  # the blocks past the run, unread: unhashable ones raise here
        else:
            rows = packed.rows(group, blocks, sentinel=True)
    except QueryError:
        raise
    except (TypeError, ValueError) as e:  # an unhashable hash (a list from a careless decoder); an == not a bool
        raise QueryError.single("bad_block_hash", f"the hash chain holds an unhashable value: {e}", "chain") from e
    need = max(-(-R // WORD_BITS), 1)  # every tier's rows one width: no bits at or past R remain
    if rows.shape[1] > need:
        return rows[:, :need]
    if rows.shape[1] < need:
        wide: Words = np.zeros((rows.shape[0], need), dtype=rows.dtype)
        wide[:, : rows.shape[1]] = rows
        return wide
    return rows


def _hit_blocks(chain: Sequence[Hashable], n: int, S: int, s: int) -> Sequence[Hashable]:
    """The hashes of the blocks that may hit (span S, ``s = S // H`` hashes per block): block j's hash is chain
    entry ``(j + 1) * s - 1``, for every complete block of the chain below the last token (hits stop at
    ``n - 1``). Both packed paths read these."""
    return chain[s - 1 : min(len(chain) // s, max(n - 1, 0) // S) * s : s]


def _rows_differ(alive: Words) -> npt.NDArray[np.bool_]:
    """Whether each row differs from the next: the words' inequalities folded with an OR over a uint64 view of
    the bool rows (numpy's ``any(axis=1)`` over a short row costs several times more)."""
    ne = alive[1:] != alive[:-1]  # a new C-ordered (rows - 1, words) bool array: one byte per word
    w = ne.shape[1]
    if w in (1, 2, 4, 8):
        out: npt.NDArray[np.bool_] = ne.view(f"<u{w}")[:, 0] != 0
        return out
    if w % 8:
        out = ne.any(axis=1)
        return out
    v = ne.view(np.uint64)
    acc = v[:, 0]
    for j in range(1, w // 8):
        acc = acc | v[:, j]
    out = acc != 0
    return out


def _packed_full_hits(rows: Words, S: int, A: int, R: int, scratch: bool = False) -> IntVector:
    """Per replica, the full-attention hit from the packed rows of the blocks the candidate allows (block j
    is row j) followed by one zero row (:func:`_packed_chain`'s sentinel): the run of held blocks from block
    0, in tokens on the A grid.

    The replicas alive after each block are a running AND down the rows; the alive sets are nested, so a
    replica's run is the number of distinct non-empty alive sets it belongs to, read off only the rows where
    the set changes (the sentinel makes the last non-empty set change too). O(blocks) numpy work on whole
    rows, O(changes x replicas) bits unpacked, in a fixed number of numpy calls whatever the sizes (each call
    costs more than its arithmetic here, the more so when the caches are cold between queries). With ``scratch``
    the rows are this call's own copy and are overwritten (the running AND in place: one allocation less)."""
    if rows.shape[0] <= 1 or R == 0:
        return np.zeros(R, dtype=np.int64)
    alive = np.bitwise_and.accumulate(rows, axis=0, out=rows if scratch else None)
    ends = _rows_differ(alive).nonzero()[0]  # the last row of each run of equal non-empty alive sets
    k = ends.size
    if not k:
        return np.zeros(R, dtype=np.int64)
    bits = np.unpackbits(alive[ends].view(np.uint8), axis=1, bitorder="little")  # (k, 64 * w) of 0/1
    if k <= 255:  # eight byte counters per uint64 lane, no carry between them
        survived: npt.NDArray[np.unsignedinteger[Any]] = np.add.reduce(bits.view(np.uint64), axis=0).view(np.uint8)
    else:
        survived = np.add.reduce(bits, axis=0, dtype=np.uint16)
    hits: IntVector = np.zeros(k + 1, dtype=np.int64)
    np.multiply(ends + 1, S, out=hits[1:])
    if S % A:
        hits -= hits % A
    out: IntVector = hits[survived[:R]]
    return out


# -- scoring ------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Setup:
    """What :func:`score_replicas` works out from the geometry alone, once per geometry (``_setup``)."""

    plan: tuple[LookupGroup, ...]
    groups: tuple[int, ...]  # every lookup group's group ids, in plan order
    H: int
    A: int
    drop: bool  # a group takes the speculative drop: the batch prefix_hits twin scores it
    bit_ok: bool  # every lookup group's family runs on the bit-parallel kernels
    scored: bool  # some group is looked up and prefix caching is on (else every score is 0)
    packed: bool  # the packed path applies (one full-attention lookup group, hits on block ends, no drop)


_SETUPS: dict[int, tuple[Geometry, _Setup]] = {}


def _setup(geom: Geometry) -> _Setup:
    """The geometry's :class:`_Setup`, cached by identity (a geometry is immutable), as ``kvgeom.hits`` caches
    its lookup order. A geometry ``refuse_unlookable`` refuses raises on every call and is never cached."""
    cached = _SETUPS.get(id(geom))
    if cached is not None and cached[0] is geom:
        return cached[1]
    plan = lookup_groups(geom)
    refuse_unlookable(geom, plan)
    A = geom.hit_alignment_tokens
    drop = _drops(geom)
    scored = bool(plan) and geom.config.cache.prefix_caching
    setup = _Setup(
        plan, tuple(g for lg in plan for g in lg.group_ids), geom.hash_block_size, A, drop,
        all(lg.family in _BIT_FAMILIES for lg in plan), scored, scored and not drop and _packed_ok(plan, A),
    )
    if len(_SETUPS) >= 256:
        _SETUPS.clear()
    _SETUPS[id(geom)] = (geom, setup)
    return setup


def _is_chain(c: object) -> bool:
    """A hash chain: a sequence that is not a string (lists and tuples pass without the ABC check)."""
    return type(c) is list or type(c) is tuple or (isinstance(c, Sequence) and not isinstance(c, str | bytes))


@dataclass(frozen=True, slots=True)
class RouterScores:
    """Hit tokens per request, tier and replica: ``hit_tokens[q, t, r]`` (int64)."""

    tiers: tuple[str, ...]
    hit_tokens: npt.NDArray[np.int64]

    def tier(self, name: str) -> npt.NDArray[np.int64]:
        """``(requests, replicas)`` scores of tier ``name``."""
        key = name.upper()
        if key not in self.tiers:
            raise QueryError.single("unknown_tier", f"tier {name!r} is not one of {list(self.tiers)}", "tier")
        return self.hit_tokens[:, self.tiers.index(key), :]

    def best(self, tier: str = "GPU") -> npt.NDArray[np.int64]:
        """Per request, the replica with the highest score on ``tier`` (the lowest index on ties)."""
        scores = self.tier(tier)
        if scores.shape[1] == 0:
            raise QueryError.single("no_replicas", "there are no replicas to choose from", "num_replicas")
        out: npt.NDArray[np.int64] = scores.argmax(axis=1).astype(np.int64)
        return out


def _read_chain(chain: Sequence[Hashable], n: int, H: int, hashed: int) -> Sequence[Hashable] | None:
    """The part of a request's chain a lookup reads, or None when the chain's length is not one a scorer
    accepts. Accepted: a router's chain of ``n // H`` hashes (every complete block) or vLLM's
    ``hashed = geom.request_hashes(n)`` (under lookahead hashes a block is hashed once P tokens past it
    exist). Either is read up to ``hashed``, as vLLM would: a block it has not hashed yet is never a hit.
    The one rule of :func:`score_replicas` and its one-request shortcut (their agreement is a router law)."""
    if len(chain) != n // H and len(chain) != hashed:
        return None
    return chain[:hashed] if len(chain) > hashed else chain


def _one_packed(geom: Geometry, reader: KVEventReader, chains: Sequence[Sequence[Hashable]], n: object, R: object,
                tiers: Sequence[str] | None) -> RouterScores | None:
    """A router's hot call, one request on one tier of a reader's packed rows, in fewer steps; None (the general
    path of :func:`score_replicas` then answers, or names the problem) unless every argument is of the plain
    kind and valid and the geometry scores on the packed path. The answer is the general path's (a law in
    ``tests/property/test_router_laws.py`` compares them)."""
    if not (type(R) is int and 0 < R <= MAX_REPLICAS and type(n) is int and 0 <= n <= INT64_MAX
            and type(chains) in (list, tuple) and len(chains) == 1 and isinstance(tiers, list | tuple)
            and len(tiers) == 1 and type(tiers[0]) is str):
        return None
    chain = chains[0]
    name = tiers[0].upper()
    setup = _setup(geom)
    if not setup.packed or type(chain) not in (list, tuple) or name not in reader.media:
        return None
    lg = setup.plan[0]
    S, ids = lg.span, lg.group_ids
    hashed = geom.request_hashes(n)
    read = _read_chain(chain, n, setup.H, hashed)
    if len(ids) != 1 or read is None:
        return None
    seen = reader.hash_types
    if seen and chain and type(chain[0]) not in seen:
        return None
    chain = read
    out = np.zeros((1, 1, R), dtype=np.int64)
    p = reader.packed(name)
    if p.has_group(ids[0]):
        blocks = _hit_blocks(chain, n, S, S // setup.H)
        out[0, 0] = _packed_full_hits(_packed_chain(p, ids[0], chain, blocks, R, True), S, setup.A, R, True)
    return RouterScores(tiers=(name,), hit_tokens=out)


def score_replicas(
    geom: Geometry,
    residency: Residency | Mapping[str, Residency] | KVEventReader,
    chains: Sequence[Sequence[Hashable]],
    num_tokens: int | Sequence[int],
    *,
    num_replicas: int,
    tiers: Sequence[str] | None = None,
    cumulative: bool = False,
    matrix_path: bool | None = None,
) -> RouterScores:
    """Score every request on every replica and tier: the GPU prefix-cache hit vLLM 0.33's coordinator
    would compute if the request ran on that replica and that tier's entries were its cache.

    ``residency``: one :class:`~kvgeom.Residency` (a single tier, named ``"GPU"``), a mapping tier name
    -> Residency, or a :class:`~kvgeom.events.KVEventReader` (its media). Holder bit r is replica r.
    ``chains[q]`` is request q's hash chain at H (hash i ends at token ``(i+1)*H``: exactly
    ``num_tokens[q] // H`` hashes, or ``(num_tokens[q] - P) // H`` as vLLM hashes under lookahead hashes,
    P = ``geom.hash_lookahead_tokens``), in the encoding the residency's keys use. ``num_tokens`` is one
    count for every request or one per request. ``tiers`` picks and orders the tiers (default: all).
    With ``cumulative`` a tier is scored on the union of itself and the tiers before it (GPU, then
    GPU + CPU, ...): what a replica could serve by loading from its lower tiers, under the prefix
    rules (an upper bound: the offload connector's chunk rules are in :mod:`kvgeom.hits`).
    ``matrix_path`` forces the (hashes x replicas) matrix kernels (True) or the bit-parallel ones
    (False, full-attention and Mamba groups only); by default the bit-parallel path runs whenever
    every group allows it. Both give the same scores.

    Returns :class:`RouterScores` with ``hit_tokens`` of shape ``(len(chains), len(tiers),
    num_replicas)``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]})
    >>> gpu, cpu = kvgeom.Residency(), kvgeom.Residency()
    >>> gpu.add(0, "a", holder=0); cpu.add(0, "a", holder=1); cpu.add(0, "b", holder=1)
    >>> s = score_replicas(g, {"GPU": gpu, "CPU": cpu}, [["a", "b"]], 40, num_replicas=2)
    >>> s.tier("GPU").tolist(), s.tier("CPU").tolist()
    ([[16, 0]], [[0, 32]])
    """
    from kvgeom.events import KVEventReader

    if type(residency) is KVEventReader and not cumulative and matrix_path is None:
        one = _one_packed(geom, residency, chains, num_tokens, num_replicas, tiers)
        if one is not None:
            return one
    R = num_replicas if type(num_replicas) is int and 0 <= num_replicas <= MAX_REPLICAS else \
        _replica_count(num_replicas)
    if tiers is not None and not (type(tiers) in (list, tuple) and all(type(t) is str for t in tiers)) and (
        isinstance(tiers, str) or not isinstance(tiers, Sequence) or not all(isinstance(t, str) for t in tiers)
    ):
        raise QueryError.single("bad_tiers", f"tiers is a list of tier names, got {show(tiers)}", "tiers")
    if not (type(chains) in (list, tuple) and all(map(_is_chain, chains))) and (
            isinstance(chains, str | bytes) or not isinstance(chains, Sequence) or not all(map(_is_chain, chains))):
        raise QueryError.single("bad_chains", "chains must be a list of hash chains (lists of block hashes)", "chains")
    seen_types: frozenset[type] = frozenset()
    reader: KVEventReader | None = None
    tier_names: tuple[str, ...]
    by_tier: Mapping[str, Residency] | None = None  # a reader's residencies are read only by the paths that need them
    if isinstance(residency, KVEventReader):
        reader = residency
        tier_names = residency.media
        seen_types = residency.hash_types
    elif isinstance(residency, Residency):
        by_tier = {"GPU": residency}
        tier_names = ("GPU",)
    elif isinstance(residency, Mapping):
        by_tier = {str(k).upper(): v for k, v in residency.items()}
        tier_names = tuple(by_tier)
    else:
        raise QueryError.single(
            "bad_residency", f"residency must be a Residency, a mapping of tier -> Residency or a KVEventReader, got "
            f"{type(residency).__name__}", "residency")
    names = tuple(t.upper() for t in tiers) if tiers is not None else tier_names
    unknown = [t for t in names if t not in tier_names]
    if unknown:
        raise QueryError.single("unknown_tier", f"tiers {unknown} are not among {list(tier_names)}", "tiers")
    n_q = len(chains)
    if isinstance(num_tokens, int) and not isinstance(num_tokens, bool):
        counts = [num_tokens] * n_q
    else:
        counts = bounded_ints("num_tokens", num_tokens, MAX_RESULT, "num_tokens[]", "token counts")
        if len(counts) != n_q:
            raise QueryError.single(
                "length_mismatch", f"{len(counts)} num_tokens for {n_q} chains; give one per chain or a single int",
                "num_tokens")
    setup = _setup(geom)
    plan, groups, H, A, drop = setup.plan, setup.groups, setup.H, setup.A, setup.drop
    bit_path = setup.bit_ok if matrix_path is None else not matrix_path
    if bit_path and not setup.bit_ok:
        raise QueryError.single(
            "bit_path_unsupported",
            f"the bit-parallel kernels handle full-attention and Mamba groups only; this geometry has "
            f"{sorted({lg.family for lg in plan} - _BIT_FAMILIES)} groups: leave matrix_path unset", "matrix_path")
    check_total("hit_tokens", n_q * len(names) * R)  # the result, refused before allocating
    out = np.zeros((n_q, len(names), R), dtype=np.int64)
    scored = setup.scored and R > 0
    everyone = (1 << R) - 1 if bit_path and scored and not drop else 0
    packed = {name: reader.packed(name) for name in names} \
        if reader is not None and matrix_path is None and scored and setup.packed else None
    if packed is not None:
        lg = plan[0]
        S, ids = lg.span, lg.group_ids
        s = S // H
    for q, (chain, n) in enumerate(zip(chains, counts, strict=True)):
        if type(n) is not int or not 0 <= n <= INT64_MAX:  # ints in range pass without a call
            n = nonneg(f"num_tokens[{q}]", n)
        hashed = geom.request_hashes(n)  # vLLM hashes a block once P tokens past it exist
        read = _read_chain(chain, n, H, hashed)
        if read is None:
            P = geom.hash_lookahead_tokens
            count = f"{n // H}" if hashed == n // H else f"{n // H} (or {hashed}, hashed P={P} tokens ahead)"
            raise QueryError.single(
                "chain_length_mismatch",
                f"chain {q} has {len(chain)} hashes but a {n}-token request has {count} complete blocks of the hash "
                f"unit H={H}; hash the request every H tokens (a chain at another block size would be read at the "
                "wrong end tokens)", f"chains[{q}]", num_hashes=len(chain), num_tokens=n, hash_block_size=H)
        if seen_types and chain and type(chain[0]) not in seen_types:
            raise QueryError.single(
                "chain_encoding_mismatch",
                f"chain {q} holds {type(chain[0]).__name__} hashes but the events carried "
                f"{sorted(t.__name__ for t in seen_types)}; no hash would ever match. Encode the chain as the "
                "events do (msgpack gives bytes, JSON base64 strings, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES ints)",
                f"chains[{q}]", chain_type=type(chain[0]).__name__)
        chain = read
        if packed is not None:
            blocks = _hit_blocks(chain, n, S, s)
            below: dict[int, Words] = {}
            for t, name in enumerate(names):
                p = packed[name]
                if not cumulative:
                    if len(ids) == 1:  # the common case: one group, one tier alone
                        if p.has_group(ids[0]):
                            own = _packed_chain(p, ids[0], chain, blocks, R, True)
                            out[q, t] = _packed_full_hits(own, S, A, R, True)
                        continue
                    if not all(p.has_group(g) for g in ids):
                        continue  # a tier with no entry of the group: every hit 0
                rows = {g: _packed_chain(p, g, chain, blocks, R) for g in ids}  # one length: blocks + sentinel
                if cumulative:
                    rows = below = {g: r | below[g] for g, r in rows.items()} if below else rows
                joint = rows[ids[0]]
                for g in ids[1:]:
                    joint = joint & rows[g]
                out[q, t] = _packed_full_hits(joint, S, A, R)
            continue
        if by_tier is None:
            assert reader is not None
            by_tier = reader.residencies()
        union: dict[int, list[int]] = {}
        for t, name in enumerate(names):
            res = by_tier[name]
            masks = {g: _chain_masks(res, g, chain, R) for g in groups}
            if cumulative:
                for g in groups:
                    if g in union:
                        masks[g] = [a | b for a, b in zip(masks[g], union[g], strict=True)]
                union = masks
            if not scored:
                continue
            if drop:
                out[q, t] = _drop_hits(geom, n, {g: _unpack(m, R) for g, m in masks.items()})
            elif bit_path:
                out[q, t] = _unpartition(_bit_hits(plan, masks, n, H, A, everyone), R)
            else:
                out[q, t] = replica_hits(geom, {g: _unpack(m, R) for g, m in masks.items()}, n)
    return RouterScores(tiers=names, hit_tokens=out)
