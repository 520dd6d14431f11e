"""GPU prefix-cache hits from per-group residency, as vLLM 0.33's KV cache coordinator finds them.

A request's hash chain is cut every H tokens; an entry of group g *ending at e* is the entry keyed
by the hash of the prefix ``[0, e)`` (e a multiple of H). For an attention group it is block
``cdiv(e, S) - 1`` holding ``[S * (cdiv(e, S) - 1), e)`` -- a full block when S divides e, a
partial entry otherwise (partial hash hits); for an align-mode Mamba group it is the state after
exactly e tokens. :func:`prefix_hit` takes which entries are resident (a mapping
``{group: [end tokens]}`` or a probe ``contains(group, end_token)``, e.g.
:meth:`kvgeom.Residency.probe`) and returns the longest common hit the way vLLM 0.33 computes it
(``v1/core/kv_cache_coordinator.py``: ``UnitaryKVCacheCoordinator`` and
``HybridKVCacheCoordinator.find_longest_cache_hit``; the per-kind ``find_longest_cache_hit`` of
``v1/core/single_type_kv_cache_manager.py``):

* full attention (MLA, sink, DSA containers): the longest run of cached spans from the left, then,
  with partial hash hits (A = H < S), the highest cached H boundary inside the next span;
* sliding window: right to left for ``cdiv(sliding_window - 1, S)`` contiguous cached blocks whose
  right edge is on the hit alignment A (a run reaching block 0 counts even when shorter);
* chunked local: the blocks of the current attention chunk, left to right; earlier chunks are
  outside the window and count as computed;
* Mamba: right to left for one cached state on A (every H boundary with partial hash hits);
* groups with equal specs are looked up together (an entry counts only when every member holds
  it); full attention goes first and is looked up once; the other groups lower the candidate in
  turn until none does (one pass for one full-attention group plus one other);
* the hit never reaches the last token: the candidate starts at ``num_tokens - 1``.

Speculative decoding: a group with ``GroupGeometry.proof_margin`` set drops the volatile unit
(one H with fine-grained lookups, else one span; a sliding-window group needs one more block and
pops it); in the hybrid coordinator such a group is first queried ``proof_margin`` past the
candidate so the drop lands back on it, at most once per candidate (vLLM issue #32802). Mamba never
drops. The retention interval is not read here: it thins which entries exist (what
:class:`kvgeom.sim` caches), not how a lookup reads them.

Invariants (``tests/property/test_prefix_laws.py``):

* ``hit_tokens < num_tokens`` and ``hit_tokens`` is a multiple of the hit alignment A;
* the hit never exceeds a full-attention group's contiguous usable prefix (every span below the
  hit, and the entry at the hit, are resident);
* adding a resident entry never lowers the hit; removing one never raises it (without
  speculative drops);
* every align-mode Mamba group restores the state ending at exactly ``hit_tokens``;
* with a drop on, the hit never includes the volatile unit past the last verified entry.

>>> import kvgeom
>>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)   # full attention span 32 + Mamba 16, H = A = 16
>>> hit = prefix_hit(g, 100, {0: [32, 64, 80], 1: [16, 48, 80]})
>>> hit.hit_tokens, hit.groups[0].end_tokens, hit.groups[1].end_tokens
(80, (32, 64, 80), (80,))
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, assert_never

from kvgeom._check import nonneg
from kvgeom._check import scenario as check_scenario
from kvgeom._math import cdiv
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry
from kvgeom.specs import Family

__all__ = [
    "Contains",
    "GroupPrefixHit",
    "LookupGroup",
    "PrefixHit",
    "Resident",
    "prefix_hit",
    "prefix_hit_from_scenario",
    "lookup_groups",
    "refuse_unlookable",
    "resident_sets",
    "scheduler_keeps_load",
    "unitary_coordinator",
]

Contains: TypeAlias = Callable[[int, int], bool]
"""``contains(group, end_token)``: whether the group holds the entry of this request ending there."""

Resident: TypeAlias = Mapping[Any, Collection[int]] | Contains
"""Residency of one request's chain: ``{group: [end tokens]}`` or a ``contains`` probe."""


@dataclass(frozen=True, slots=True)
class GroupPrefixHit:
    """The cached entries one group reuses for the hit (vLLM's non-null hit blocks of the group)."""

    index: int
    end_tokens: tuple[int, ...]
    """End tokens of the reused entries, ascending (for a partial entry: its H boundary)."""
    block_indices: tuple[int, ...]
    """Block-table entries they fill: ``cdiv(end, S) - 1`` each."""


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """A GPU prefix-cache hit: ``hit_tokens`` (vLLM's ``num_new_computed_tokens``) and per group the
    reused entries, every group of the geometry in index order (empty when it reuses nothing)."""

    hit_tokens: int
    num_tokens: int
    groups: tuple[GroupPrefixHit, ...]

    def to_dict(self) -> dict[str, Any]:
        """The stable ``prefix_hit`` contract ``{"hit_tokens", "groups": [{"index", "blocks"}]}``
        (``blocks``: end tokens of the reused entries)."""
        return {
            "hit_tokens": self.hit_tokens,
            "groups": [{"index": g.index, "blocks": list(g.end_tokens)} for g in self.groups],
        }


# -- input ------------------------------------------------------------------------------------------


def resident_sets(geom: Geometry, resident: Mapping[Any, Collection[int]], field: str = "resident") -> dict[
    int, frozenset[int]
]:
    """``{group: [end tokens]}`` checked against the geometry: groups are prefix-cacheable indices
    (ints or their strings, as in JSON), end tokens positive multiples of H.

    >>> import kvgeom
    >>> resident_sets(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), {"1": [16, 48]})
    {1: frozenset({16, 48})}
    """
    if not isinstance(resident, Mapping):
        raise QueryError.single(
            "bad_resident",
            f"{field} must map a group index to end tokens, got {type(resident).__name__}",
            field,
        )
    H = geom.hash_block_size
    out: dict[int, frozenset[int]] = {}
    for key, ends in resident.items():
        try:
            index = int(key)
            if isinstance(key, bool) or (isinstance(key, str) and not key.strip().isdigit()):
                raise ValueError
        except (TypeError, ValueError):
            raise QueryError.single(
                "bad_resident", f"{field} key {key!r} is not a group index", field, key=str(key)
            ) from None
        if not 0 <= index < len(geom.groups):
            raise QueryError.single(
                "no_such_group",
                f"{field} names group {index}; this geometry has groups 0..{len(geom.groups) - 1}",
                f"{field}.{key}",
                group=index,
            )
        g = geom.groups[index]
        if not g.prefix_cacheable:
            raise QueryError.single(
                "group_not_prefix_cacheable",
                f"{field} names group {index} ({g.kind}), which is not prefix-cacheable and never holds "
                "a cached entry; drop it from the residency",
                f"{field}.{key}",
                group=index,
            )
        if isinstance(ends, str | bytes) or not isinstance(ends, Collection):
            raise QueryError.single(
                "bad_resident", f"{field}[{key!r}] must be a list of end tokens", f"{field}.{key}"
            )
        checked: set[int] = set()
        for e in ends:
            e = nonneg(f"{field}.{key} end token", e)
            if e == 0 or e % H:
                raise QueryError.single(
                    "not_on_hash_grid",
                    f"{field}[{key!r}] holds end token {e}; entries end on positive multiples of the hash "
                    f"unit H={H}",
                    f"{field}.{key}",
                    end_token=e,
                    hash_block_size=H,
                )
            checked.add(e)
        out[index] = frozenset(checked | out.get(index, frozenset()))
    return out


def _probe(geom: Geometry, resident: Resident, chain_tokens: int) -> Contains:
    """One ``contains`` over either input form; entries past the request's hash chain are never held."""
    if callable(resident) and not isinstance(resident, Mapping):
        probe = resident

        def contains_probe(group: int, end: int) -> bool:
            return end <= chain_tokens and bool(probe(group, end))

        return contains_probe
    sets = resident_sets(geom, resident)
    empty: frozenset[int] = frozenset()

    def contains_sets(group: int, end: int) -> bool:
        return end <= chain_tokens and end in sets.get(group, empty)

    return contains_sets


# -- per-kind lookups (one spec group: every member must hold an entry) ------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    hit: int
    """Tokens this spec group can serve (vLLM: ``len(blocks) * S``, or the exact boundary)."""
    ends: tuple[int, ...]
    """End tokens of the non-null entries, ascending."""


def _all(contains: Contains, members: tuple[int, ...], end: int) -> bool:
    return all(contains(g, end) for g in members)


def _full(
    contains: Contains, members: tuple[int, ...], S: int, A: int, max_len: int, chain: int, drop: bool
) -> _Found:
    """Full attention: cached spans left to right, then (A < S) the highest cached H boundary inside
    the next span; with a drop, minus ``min(A, S)``; rounded down to A."""
    ends: list[int] = []
    for j in range(min(max_len, chain) // S):
        if not _all(contains, members, (j + 1) * S):
            break
        ends.append((j + 1) * S)
    hit = len(ends) * S
    if A < S and S % A == 0:
        first = len(ends) * (S // A)
        top = min(first + S // A - 1, max_len // A, chain // A)
        for f in range(top - 1, first - 1, -1):
            if _all(contains, members, (f + 1) * A):
                ends.append((f + 1) * A)
                hit = (f + 1) * A
                break
    if drop and hit > 0:
        hit -= min(A, S)
    hit -= hit % A
    return _Found(hit, tuple(ends[: cdiv(hit, S)]))


def _sliding(
    contains: Contains, members: tuple[int, ...], S: int, A: int, window: int, max_len: int, drop: bool
) -> _Found:
    """Sliding window: right to left for ``cdiv(window - 1, S)`` (+1 with a drop) contiguous cached
    blocks whose right edge (after the drop) is on A; a run reaching block 0 counts when shorter."""
    need = cdiv(window - 1, S) + (1 if drop else 0)
    run = 0
    found: int | None = None
    for i in range(max_len // S - 1, -1, -1):
        if _all(contains, members, (i + 1) * S):
            if run == 0 and S != A and ((i if drop else i + 1) * S) % A:
                continue
            run += 1
            if run >= need:
                found = i
                break
        else:
            run = 0
    if found is not None:
        low, length = found, found + run
    else:
        low, length = 0, run
        while S != A and length * S % A:
            length -= 1
    if drop and length > 0:
        length -= 1
        while S != A and length * S % A:
            length -= 1
    return _Found(length * S, tuple((i + 1) * S for i in range(low, length)))


def _chunked(contains: Contains, members: tuple[int, ...], S: int, chunk: int, max_len: int) -> _Found:
    """Chunked local: blocks before the current attention chunk count as computed; the chunk's own
    blocks must be cached, left to right."""
    start_block = ((max_len // chunk) * chunk if max_len > 0 else 0) // S
    ends: list[int] = []
    for i in range(start_block, max_len // S):
        if not _all(contains, members, (i + 1) * S):
            break
        ends.append((i + 1) * S)
    return _Found((start_block + len(ends)) * S, tuple(ends))


def _mamba(
    contains: Contains, members: tuple[int, ...], S: int, A: int, max_len: int, chain: int
) -> _Found:
    """Mamba: right to left for one cached state on A (every H boundary when A < S)."""
    if A < S and S % A == 0:
        for f in range(min(max_len, chain) // A - 1, -1, -1):
            if _all(contains, members, (f + 1) * A):
                return _Found((f + 1) * A, ((f + 1) * A,))
        return _Found(0, ())
    for i in range(max_len // S - 1, -1, -1):
        e = (i + 1) * S
        if _all(contains, members, e) and (S == A or e % A == 0):
            return _Found(e, (e,))
    return _Found(0, ())


@dataclass(frozen=True, slots=True)
class LookupGroup:
    """Groups that vLLM 0.33's KV cache coordinator looks up together: equal specs, one manager.

    The one home of this question for every GPU prefix-cache path (:func:`prefix_hit`, its batch twin
    ``kvgeom.batch.prefix.prefix_hits`` and the router's ``kvgeom.router.replica_hits`` /
    ``score_replicas``), so the grouping, the order and the refusals cannot drift apart.

    ``group_ids`` are the members (ascending); ``group`` is the first member's geometry (every member has
    its spec). ``full_attention`` is vLLM's ``isinstance(spec, FullAttentionSpec)`` on the scheduler's view
    (full attention, MLA, sink attention, and uniform containers of those): ``family == "full"``. Such a
    group is looked up first and only once. ``window`` is the sliding window in tokens, ``chunk`` the
    attention chunk of a chunked-local group, ``proof_margin`` the speculative margin when the group drops
    (a non-Mamba member has ``GroupGeometry.proof_margin``), else None.
    """

    group_ids: tuple[int, ...]
    group: GroupGeometry
    family: Family
    span: int
    full_attention: bool
    window: int | None
    chunk: int | None
    proof_margin: int | None


def lookup_groups(geom: Geometry) -> tuple[LookupGroup, ...]:
    """The prefix-cacheable groups of ``geom`` as vLLM 0.33's coordinator looks them up: groups with
    equal specs merged (``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``), full attention
    first, stable order otherwise.

    Postconditions: every prefix-cacheable group is in exactly one lookup group, no other group is;
    members of a lookup group have equal specs; full-attention lookup groups come first.

    >>> import kvgeom
    >>> [(lg.family, lg.group_ids) for lg in lookup_groups(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))]
    [('full', (0,)), ('mamba', (1,))]
    """
    merged: list[list[GroupGeometry]] = []
    for g in geom.groups:
        if not g.prefix_cacheable:
            continue
        for bucket in merged:
            if bucket[0].spec == g.spec and bucket[0].family == g.family:
                bucket.append(g)
                break
        else:
            merged.append([g])
    out = []
    for bucket in merged:
        first = bucket[0]
        window = first.gpu_window_need + 1 if first.gpu_window_need is not None else None
        margins = [m.proof_margin for m in bucket if m.proof_margin is not None]
        out.append(
            LookupGroup(
                group_ids=tuple(m.index for m in bucket),
                group=first,
                family=first.family,
                span=first.span,
                full_attention=first.family == "full",
                window=window if first.family == "sliding" else None,
                chunk=window if first.family == "chunked" else None,
                proof_margin=margins[0] if margins and first.family != "mamba" else None,
            )
        )
    return tuple(sorted(out, key=lambda lg: not lg.full_attention))


def refuse_unlookable(geom: Geometry, groups: Collection[LookupGroup]) -> None:
    """Raise the :class:`QueryError` of the first lookup group vLLM 0.33 cannot look up, whatever the request.

    vLLM's coordinator asks every group's manager even for an empty hit (a request of 0 or 1 tokens), so a
    geometry with such a group fails every lookup, not only the long ones (found by ``kvgeom conform``:
    chunked local beside a wider full-attention span, ``num_tokens`` 0). The refusals, in lookup order:
    prefix-cacheable cross attention (``CrossAttentionManager`` has no lookup); chunked local taking the
    speculative drop; chunked local whose span is not the hit alignment A in a hybrid geometry (the
    chunked-local manager asserts ``block_size == alignment``). A ring buffer is never prefix-cacheable
    (:func:`kvgeom.resolve` refuses it), so it never reaches here.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "cross_attention", "block_size": 16}]})
    >>> try:
    ...     refuse_unlookable(g, lookup_groups(g))
    ... except kvgeom.QueryError as e:
    ...     print(e.problems[0].code, e.problems[0].field)
    cross_attention_prefix_cache groups[0].prefix_cacheable
    """
    A = geom.hit_alignment_tokens
    for lg in groups:
        g = lg.group
        if lg.family == "cross":
            raise QueryError.single(
                "cross_attention_prefix_cache",
                f"group {g.index} (cross_attention) is prefix-cacheable, but vLLM 0.33's cross-attention "
                "manager has no prefix-cache lookup (encoder states are per request): set "
                "prefix_cacheable=false on the group or cache.prefix_caching=false",
                f"groups[{g.index}].prefix_cacheable",
            )
        if lg.family != "chunked":
            continue
        if lg.proof_margin is not None:
            raise QueryError.single(
                "drop_on_chunked_local",
                f"group {g.index} (chunked_local) would take the speculative drop; vLLM 0.33 has no "
                "prefix-cache lookup for that (it disables the hybrid allocator instead): turn the drop off",
                f"groups[{g.index}]",
            )
        if len(geom.groups) > 1 and lg.span != A:
            raise QueryError.single(
                "chunked_local_span_not_alignment",
                f"group {g.index} (chunked_local) has span {lg.span} but hits align to A={A}; vLLM 0.33's "
                "chunked-local lookup needs them equal: give every group the same span",
                f"groups[{g.index}].block_size",
                span=lg.span,
                hit_alignment_tokens=A,
            )


def _lookup(lg: LookupGroup, contains: Contains, A: int, max_len: int, chain: int, drop: bool) -> _Found:
    """One lookup group's hit (the groups :func:`refuse_unlookable` refuses never get here)."""
    S = lg.span
    match lg.family:
        case "full":
            return _full(contains, lg.group_ids, S, A, max_len, chain, drop)
        case "sliding":
            assert lg.window is not None  # a sliding family always has a window (GroupGeometry.gpu_window_need)
            return _sliding(contains, lg.group_ids, S, A, lg.window, max_len, drop)
        case "chunked":
            assert lg.chunk is not None  # a chunked family always has an attention chunk
            return _chunked(contains, lg.group_ids, S, lg.chunk, max_len)
        case "mamba":
            return _mamba(contains, lg.group_ids, S, A, max_len, chain)
        case "cross" | "circular" | "hisparse" | "encoder":  # refused by refuse_unlookable / never prefix-cacheable
            return _Found(0, ())
        case _:
            assert_never(lg.family)


def _query_limit(candidate: int, margin: int | None, drop: bool, chain: int) -> int:
    """How far a spec group is queried for a candidate: ``margin`` further when it will drop (so the
    drop lands back on the candidate), capped at the chain. Module level so the teeth tests can
    reintroduce #45614 by widening a group that does not drop."""
    if drop and margin is not None:
        return min(candidate + margin, chain)
    return candidate


def unitary_coordinator(geom: Geometry) -> bool:
    """Whether vLLM 0.33 looks prefix hits up with its ``UnitaryKVCacheCoordinator`` (one KV cache group: one
    lookup, no fixed point) rather than the hybrid coordinator's fixed point (``get_kv_cache_coordinator``).
    The one home of that choice: :func:`prefix_hit`, :func:`kvgeom.batch.prefix.prefix_hits` and the router's
    kernel read it. A second pass is not harmless: a chunked-local finder depends on the candidate, so with a
    chunk off the block grid it lowers the hit again. A unitary geometry's hit alignment is its span
    (``hit_alignment_tokens``: partial hash hits need two groups).

    >>> import kvgeom
    >>> unitary_coordinator(kvgeom.resolve({"groups": [{"kind": "mamba", "block_size": 16}]}))
    True
    """
    return len(geom.groups) == 1


def _chain_tokens(geom: Geometry, n: int) -> int:
    """Tokens covered by the request's hash chain: ``floor(n / H) * H``, or ``floor((n - P) / H) * H``
    with look-ahead hashes (a hash is emitted once its P look-ahead tokens exist)."""
    return geom.request_hashes(n) * geom.hash_block_size


def prefix_hit(
    geom: Geometry, num_tokens: int, resident: Resident, *, max_hit_tokens: int | None = None
) -> PrefixHit:
    """The GPU prefix-cache hit of a ``num_tokens`` request whose entries ``resident`` holds.

    ``resident``: ``{group: [end tokens]}`` (ints or JSON strings as keys) or a probe
    ``contains(group, end_token) -> bool``. ``max_hit_tokens`` caps the hit (vLLM's
    ``max_cache_hit_length``; default ``num_tokens - 1``).

    Postconditions: ``0 <= hit_tokens <= min(num_tokens - 1, max_hit_tokens)``; ``hit_tokens`` is a
    multiple of A; each full-attention group reuses exactly ``cdiv(hit_tokens, S)`` entries, all
    resident; an align-mode Mamba group reuses the one state ending at ``hit_tokens`` (none when the
    hit is 0); prefix caching off gives 0. A geometry with a group vLLM 0.33 cannot look up
    (chunked local whose span is not A, or taking the speculative drop; prefix-cacheable cross
    attention) raises :class:`kvgeom.QueryError` for every ``num_tokens``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> prefix_hit(g, 65, {"0": [32, 64], "1": [16, 32, 48, 64]}).hit_tokens
    64
    """
    n = nonneg("num_tokens", num_tokens)
    cap = n - 1 if max_hit_tokens is None else min(nonneg("max_hit_tokens", max_hit_tokens), max(n - 1, 0))
    chain = _chain_tokens(geom, n)
    contains = _probe(geom, resident, chain)
    empty = tuple(GroupPrefixHit(g.index, (), ()) for g in geom.groups)
    if not geom.config.cache.prefix_caching:
        return PrefixHit(0, n, empty)
    specs = lookup_groups(geom)
    if not specs:
        return PrefixHit(0, n, empty)
    refuse_unlookable(geom, specs)
    if cap <= 0:
        return PrefixHit(0, n, empty)
    found: dict[int, _Found] = {}
    if unitary_coordinator(geom):
        # UnitaryKVCacheCoordinator: alignment is the span, no widening.
        sg = specs[0]
        found[0] = _lookup(sg, contains, sg.span, cap, chain, sg.proof_margin is not None)
        return _result(geom, n, found[0].hit, specs, found)
    hit = _converge(specs, contains, geom.hit_alignment_tokens, cap, chain, found)
    return _result(geom, n, hit, specs, found)


def _converge(
    specs: tuple[LookupGroup, ...], contains: Contains, A: int, cap: int, chain: int, found: dict[int, _Found]
) -> int:
    """vLLM 0.33's fixed point: each spec group accepts or lowers the candidate; full attention is
    looked up once and then only trimmed; one pass for one full-attention group plus one other."""
    simple = len(specs) == 2 and specs[0].full_attention
    hit = cap
    verified: set[int] = set()
    while True:
        curr = hit
        for idx, sg in enumerate(specs):
            if sg.full_attention and idx in found:
                curr = min(curr, found[idx].hit)
                continue
            drop = sg.proof_margin is not None and idx not in verified
            f = _lookup(sg, contains, A, _query_limit(curr, sg.proof_margin, drop, chain), chain, drop)
            if drop:
                verified.add(idx)
            elif f.hit < curr:
                verified.clear()
            curr = f.hit
            found[idx] = f
        if curr >= hit:
            # vLLM keeps the candidate here; no lookup answers past its limit, so curr == hit.
            return curr
        hit = curr
        if simple:
            return hit


def _result(
    geom: Geometry, n: int, hit: int, specs: tuple[LookupGroup, ...], found: Mapping[int, _Found]
) -> PrefixHit:
    per: dict[int, tuple[int, ...]] = {}
    for idx, f in found.items():
        sg = specs[idx]
        ends = f.ends
        if sg.full_attention:
            ends = ends[: cdiv(hit, sg.span)]
        for m in sg.group_ids:
            per[m] = ends
    groups = []
    for g in geom.groups:
        ends = per.get(g.index, ())
        groups.append(GroupPrefixHit(g.index, ends, tuple(cdiv(e, g.span) - 1 for e in ends)))
    return PrefixHit(hit, n, tuple(groups))


def prefix_hit_from_scenario(geom: Geometry, scenario: Mapping[str, Any]) -> PrefixHit:
    """:func:`prefix_hit` for the JSON contract ``{"num_tokens": N, "resident": {"<group>": [ends]}}``
    (optional ``max_hit_tokens``; unknown keys are an error).

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> prefix_hit_from_scenario(g, {"num_tokens": 65, "resident": {"0": [32], "1": [16, 32]}}).to_dict()
    {'hit_tokens': 32, 'groups': [{'index': 0, 'blocks': [32]}, {'index': 1, 'blocks': [32]}]}
    """
    check_scenario(scenario, ("num_tokens", "resident", "max_hit_tokens"))
    return prefix_hit(
        geom, scenario["num_tokens"], scenario.get("resident", {}), max_hit_tokens=scenario.get("max_hit_tokens")
    )


def scheduler_keeps_load(local_computed_tokens: int, scheduler_block_size: int, external_tokens: int) -> bool:
    """Whether vLLM 0.33's Scheduler runs a connector load when it admits a request
    (``Scheduler.schedule``, where it calls ``get_num_new_matched_tokens``).

    The connector is asked from the local hit rounded down to the scheduler block L and answers
    ``external_tokens`` past that. When the local hit is a multiple of L the answer stands. When it
    is not, the load runs only if it reaches strictly past the unrounded local hit (the local
    sub-block tail is then dropped and the load covers it); otherwise the Scheduler keeps the local
    hit and loads nothing.

    >>> scheduler_keeps_load(48, 32, 16), scheduler_keeps_load(48, 32, 32), scheduler_keeps_load(64, 32, 16)
    (False, True, True)
    """
    tail = local_computed_tokens % scheduler_block_size
    return external_tokens > 0 and (tail == 0 or external_tokens > tail)
