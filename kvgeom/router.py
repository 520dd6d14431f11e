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

This module is the batch twin of :func:`kvgeom.prefix.prefix_hit` over replicas: the residency of
replica r is holder bit r, and for each request the held hashes become a (hashes x replicas)
boolean matrix per group; every rule above is a handful of numpy operations over all replicas at
once (``argmin`` for the full-attention run, cumulative sums for window runs, a masked
last-true search for Mamba).

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

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kvgeom._check import nonneg
from kvgeom._math import cdiv
from kvgeom.errors import QueryError
from kvgeom.residency import Residency
from kvgeom.specs import (
    FullAttentionSpec,
    MLASpec,
    SinkFullAttentionSpec,
    UniformSpec,
    attention_chunk_size_of,
    scheduler_view,
    sliding_window_of,
)

if TYPE_CHECKING:
    from kvgeom.events import KVEventReader
    from kvgeom.geometry import Geometry

__all__ = ["LookupGroup", "RouterScores", "chain_matrix", "lookup_groups", "prefix_hits", "score_replicas"]

BoolMatrix = npt.NDArray[np.bool_]
IntVector = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class LookupGroup:
    """Groups that vLLM 0.33 looks up together (equal specs, one manager): a ``SpecGroup``.

    ``full_attention`` is vLLM's ``isinstance(spec, FullAttentionSpec)`` (full attention, MLA, sink
    attention): such a group is looked up first and only once. ``window`` is the sliding window,
    ``chunk`` the attention chunk of a chunked-local group.
    """

    family: str
    group_ids: tuple[int, ...]
    span: int
    full_attention: bool
    window: int | None
    chunk: int | None


def lookup_groups(geom: Geometry) -> tuple[LookupGroup, ...]:
    """The prefix-cacheable groups of ``geom`` as vLLM 0.33's coordinator looks them up: equal specs
    merged, full attention first (stable order otherwise).

    >>> import kvgeom
    >>> [(lg.family, lg.group_ids) for lg in lookup_groups(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))]
    [('full', (0,)), ('mamba', (1,))]
    """
    merged: list[tuple[Any, list[int]]] = []
    for g in geom.groups:
        if not g.prefix_cacheable:
            continue
        for spec, ids in merged:
            if spec == g.spec:
                ids.append(g.index)
                break
        else:
            merged.append((g.spec, [g.index]))
    out = []
    for spec, ids in merged:
        g = geom.groups[ids[0]]
        if g.family in ("cross", "circular"):
            raise QueryError.single(
                "no_prefix_lookup",
                f"group {g.index} ({g.kind}) is marked prefix-cacheable but vLLM 0.33 has no prefix-cache lookup "
                "for it (CrossAttentionManager.find_longest_cache_hit raises); set prefix_cacheable = false",
                f"groups[{g.index}]", group=g.index)
        window = sliding_window_of(spec)
        view = scheduler_view(spec)
        out.append(LookupGroup(
            family=g.family,
            group_ids=tuple(ids),
            span=g.span,
            full_attention=isinstance(view if isinstance(spec, UniformSpec) else spec,
                                      FullAttentionSpec | MLASpec | SinkFullAttentionSpec),
            window=window[0] if window else None,
            chunk=attention_chunk_size_of(spec),
        ))
    return tuple(sorted(out, key=lambda lg: not lg.full_attention))


# -- the held matrix ---------------------------------------------------------------------------------
def chain_matrix(residency: Residency, group: int, chain: Sequence[Hashable], num_replicas: int) -> BoolMatrix:
    """``M[i, r]``: replica ``r`` (holder bit r) holds ``group``'s entry keyed by ``chain[i]``, i.e.
    the entry ending at token ``(i+1)*H``. Shape ``(len(chain), num_replicas)``.

    >>> r = Residency(); r.add(0, "a", holder=1); r.add(0, "b", holder=0)
    >>> chain_matrix(r, 0, ["a", "b", "c"], 2).astype(int).tolist()
    [[0, 1], [1, 0], [0, 0]]
    """
    R = nonneg("num_replicas", num_replicas)
    try:
        masks = residency.chain_masks(group, chain)
    except TypeError as e:  # an unhashable hash (a list from a careless decoder)
        raise QueryError.single("bad_block_hash", f"the hash chain holds an unhashable value: {e}", "chain") from e
    n = len(masks)
    if R == 0 or not any(masks):
        return np.zeros((n, R), dtype=bool)
    nb = (R + 7) // 8
    try:
        buf = b"".join([m.to_bytes(nb, "little") for m in masks])
    except OverflowError:
        top = max(masks).bit_length() - 1
        raise QueryError.single(
            "replica_out_of_range",
            f"replica {top} holds entries of group {group} but num_replicas={R}; pass num_replicas > {top}",
            "num_replicas", num_replicas=R, replica=top) from None
    packed = np.frombuffer(buf, dtype=np.uint8).reshape(n, nb)
    return np.unpackbits(packed, axis=1, count=R, bitorder="little").view(bool)


# -- vectorised kernels ------------------------------------------------------------------------------
def _leading_run(F: BoolMatrix) -> IntVector:
    """Per column, the number of leading True rows."""
    n, R = F.shape
    if n == 0:
        return np.zeros(R, dtype=np.int64)
    first_false = F.argmin(axis=0)
    all_true = F[first_false, np.arange(R)]
    out: IntVector = np.where(all_true, n, first_false).astype(np.int64)
    return out


def _runs_ending(F: BoolMatrix) -> npt.NDArray[np.int32]:
    """``RL[j, r]``: the number of consecutive True rows of column r ending at row j (0 when F[j] is False)."""
    c = np.cumsum(F, axis=0, dtype=np.int32)
    reset = np.maximum.accumulate(np.where(F, 0, c), axis=0)
    out: npt.NDArray[np.int32] = c - reset
    return out


def _last_true_below(Y: BoolMatrix, limit: IntVector) -> IntVector:
    """Per column r, the largest row index j < limit[r] with Y[j, r], else -1."""
    n, R = Y.shape
    if n == 0:
        return np.full(R, -1, dtype=np.int64)
    masked = Y & (np.arange(n)[:, None] < limit[None, :])
    rev = masked[::-1]
    j = rev.argmax(axis=0)
    found = rev[j, np.arange(R)]
    out: IntVector = np.where(found, n - 1 - j, -1).astype(np.int64)
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
                e = np.arange(1, nblk + 1)
                aligned = (e * S) % A == 0
                self.V = aligned[:, None] & (_runs_ending(self.F) >= np.minimum(need, e)[:, None])
            case "chunked":
                self.RF = _runs_ending(self.F[::-1])[::-1]
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
                if self.nblk:
                    run = np.where(sb < self.nblk, self.RF[np.minimum(sb, self.nblk - 1), self.cols], 0)
                else:
                    run = np.zeros(self.R, dtype=np.int64)
                local: IntVector = ((sb + np.minimum(run, mb - sb)) * S).astype(np.int64)
                return local
            case _:  # mamba
                if self.fine:
                    idx = _last_true_below(self.X, np.minimum(m // A, self.n_h))
                    return (idx + 1) * A
                idx = _last_true_below(self.V, np.minimum(m // S, self.nblk))
                return (idx + 1) * S


def _check_geometry(geom: Geometry) -> None:
    spec = geom.speculative
    if spec is not None and spec.gpu_drop:
        raise QueryError.single(
            "speculative_not_modelled",
            f"router scoring does not model the speculative-decoding block drop yet (method {spec.method!r} drops a "
            "proven unit from GPU prefix hits); scores would be too high. Use kvgeom.prefix.prefix_hit per replica",
            "speculative", method=spec.method)


def prefix_hits(geom: Geometry, held: Mapping[int, BoolMatrix], num_tokens: int) -> IntVector:
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
    >>> prefix_hits(g, {0: fa, 1: mamba}, 65).tolist()
    [48]
    """
    n_tokens = nonneg("num_tokens", num_tokens)
    _check_geometry(geom)
    plan = lookup_groups(geom)
    shapes = {np.shape(held[g]) for lg in plan for g in lg.group_ids if g in held}
    missing = [g for lg in plan for g in lg.group_ids if g not in held]
    if missing or len(shapes) > 1:
        raise QueryError.single(
            "bad_held_matrices",
            f"prefix_hits needs one (hashes, replicas) matrix per prefix-cacheable group, all of one shape; "
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
    A = geom.hit_alignment_tokens
    lookups = []
    for lg in plan:
        X = np.asarray(held[lg.group_ids[0]], dtype=bool)
        for g in lg.group_ids[1:]:
            X = X & np.asarray(held[g], dtype=bool)
        lookups.append(_Lookup(lg, X, H, A))
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


# -- scoring ------------------------------------------------------------------------------------------
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


def score_replicas(
    geom: Geometry,
    residency: Residency | Mapping[str, Residency] | KVEventReader,
    chains: Sequence[Sequence[Hashable]],
    num_tokens: int | Sequence[int],
    *,
    num_replicas: int,
    tiers: Sequence[str] | None = None,
    cumulative: bool = False,
) -> RouterScores:
    """Score every request on every replica and tier: the GPU prefix-cache hit vLLM 0.33's coordinator
    would compute if the request ran on that replica and that tier's entries were its cache.

    ``residency``: one :class:`~kvgeom.Residency` (a single tier, named ``"GPU"``), a mapping tier name
    -> Residency, or a :class:`~kvgeom.events.KVEventReader` (its media). Holder bit r is replica r.
    ``chains[q]`` is request q's hash chain at H (hash i ends at token ``(i+1)*H``: exactly
    ``num_tokens[q] // H`` hashes), in the encoding the residency's keys use. ``num_tokens`` is one
    count for every request or one per request. ``tiers`` picks and orders the tiers (default: all).
    With ``cumulative`` a tier is scored on the union of itself and the tiers before it (GPU, then
    GPU + CPU, ...): what a replica could serve by loading from its lower tiers, under the prefix
    rules (an upper bound: the offload connector's chunk rules are in :mod:`kvgeom.hits`).

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

    R = nonneg("num_replicas", num_replicas)
    if isinstance(residency, KVEventReader):
        by_tier = residency.residencies()
    elif isinstance(residency, Residency):
        by_tier = {"GPU": residency}
    elif isinstance(residency, Mapping):
        by_tier = {str(k).upper(): v for k, v in residency.items()}
    else:
        raise QueryError.single(
            "bad_residency", f"residency must be a Residency, a mapping of tier -> Residency or a KVEventReader, got "
            f"{type(residency).__name__}", "residency")
    names = tuple(t.upper() for t in tiers) if tiers is not None else tuple(by_tier)
    unknown = [t for t in names if t not in by_tier]
    if unknown:
        raise QueryError.single("unknown_tier", f"tiers {unknown} are not among {list(by_tier)}", "tiers")
    n_q = len(chains)
    if isinstance(num_tokens, int) and not isinstance(num_tokens, bool):
        counts = [num_tokens] * n_q
    else:
        counts = list(num_tokens)  # type: ignore[arg-type]
        if len(counts) != n_q:
            raise QueryError.single(
                "length_mismatch", f"{len(counts)} num_tokens for {n_q} chains; give one per chain or a single int",
                "num_tokens")
    H = geom.hash_block_size
    _check_geometry(geom)
    plan = lookup_groups(geom)
    groups = [g for lg in plan for g in lg.group_ids]
    out = np.zeros((n_q, len(names), R), dtype=np.int64)
    for q, (chain, n) in enumerate(zip(chains, counts, strict=True)):
        n = nonneg(f"num_tokens[{q}]", n)
        if len(chain) != n // H:
            raise QueryError.single(
                "chain_length_mismatch",
                f"chain {q} has {len(chain)} hashes but a {n}-token request has {n // H} complete blocks of the hash "
                f"unit H={H}; hash the request every H tokens (a chain at another block size would be read at the "
                "wrong end tokens)", f"chains[{q}]", num_hashes=len(chain), num_tokens=n, hash_block_size=H)
        union: dict[int, BoolMatrix] = {}
        for t, name in enumerate(names):
            res = by_tier[name]
            held = {g: chain_matrix(res, g, chain, R) for g in groups}
            if cumulative:
                for g in groups:
                    if g in union:
                        held[g] = held[g] | union[g]
                union = held
            out[q, t] = prefix_hits(geom, held, n) if plan else 0
    return RouterScores(tiers=names, hit_tokens=out)
