"""Membership probes: the one question a hit lookup asks of an offload tier.

A lookup never needs the tier's whole contents. It asks, key by key and in vLLM's order,
"does the tier hold the key of group g whose prefix ends at token e?" and stops at the first
answer that settles the hit. :class:`Probe` is that question, built from whatever form the
caller holds the tier in (:func:`as_probe`):

* a callable ``contains(group, end_token) -> bool``;
* a :class:`kvgeom.Residency` and the request's hash chain (``block_hashes``);
* an object with the offload manager's ``lookup(key, req_context)`` shape (vLLM 0.33
  ``v1/kv_offload/base.py::OffloadingManager.lookup``) and the request's hash chain: keys are
  built as vLLM builds them (:func:`kvgeom.make_offload_key`); an answer named ``HIT`` (or
  ``True``) is held, ``MISS`` (or ``False``) is not, and ``HIT_PENDING`` / ``RETRY`` raise
  ``lookup_not_ready`` (vLLM defers such a request; kvgeom has no deferred hit, so it says so
  instead of guessing);
* a mapping ``{group: end tokens}`` (the ``stored`` of :func:`kvgeom.hits.plan_hit`): a
  ``set`` / ``frozenset`` value is read in place, only at the probed entries; any other
  collection is checked entry by entry as it is turned into a set (no sorting);
* a mapping ``{group: bool array over chunk indices}`` (entry j: the key ending at
  ``(j + 1) * C_g``).

Invariants (``tests/property/test_probe_laws.py``):

* every form answers exactly what the ``stored`` mapping form answers for the same keys, so
  :func:`kvgeom.hits.lookup_hit` returns the same :class:`kvgeom.hits.Hit` whatever the form;
* an end token off the hash grid, not positive, or past a known :attr:`Probe.bound` is never held;
* :meth:`Probe.below` never skips a held chunk: every chunk it jumps over is a miss.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import numpy as np

from kvgeom._check import nonneg
from kvgeom.errors import QueryError
from kvgeom.residency import GROUP_INDEX_BYTES, Residency

if TYPE_CHECKING:
    from kvgeom.geometry import Geometry

__all__ = ["Probe", "as_probe", "stored_group_index", "validated_stored"]

Contains = Callable[[int, int], bool]


class Probe:
    """``contains(group, end_token)`` plus what the lookup may use to skip misses.

    Attributes:
        contains: the membership question; called only for offloaded groups and end tokens
            on the hash grid.
        bound: per group, an end token past which nothing is held (``None``: unknown).
    """

    __slots__ = ("_chunks", "_ends", "bound", "contains")

    def __init__(
        self,
        contains: Contains,
        bound: Mapping[int, int] | None = None,
        ends: Mapping[int, AbstractSet[int]] | None = None,
    ) -> None:
        self.contains = contains
        self.bound = dict(bound) if bound is not None else None
        self._ends = ends
        self._chunks: dict[tuple[int, int], list[int]] = {}

    def below(self, group: int, tokens_per_chunk: int, j: int) -> int:
        """Highest chunk index ``i < j`` that may be held (``-1`` when none): every chunk in
        ``(i, j)`` is a miss. Without knowledge of the store this is ``j - 1``.

        A set-backed probe sorts its held chunks the first time this is asked (only after a
        long run of misses, see :func:`kvgeom.hits.lookup_hit`); a bounded probe jumps to its
        bound.
        """
        C = tokens_per_chunk
        if self._ends is not None:
            chunks = self._chunks.get((group, C))
            if chunks is None:
                ends = self._ends.get(group, frozenset())
                if not _plain_ints(ends):
                    return j - 1  # foreign elements (16.0 == 16): no safe order, keep stepping
                chunks = self._chunks[(group, C)] = sorted(int(e) // C - 1 for e in ends if e > 0 and e % C == 0)
            k = bisect_right(chunks, j - 1) - 1
            return chunks[k] if k >= 0 else -1
        if self.bound is not None:
            return min(j - 1, self.bound.get(group, 0) // C - 1)
        return j - 1


def _plain_ints(values: AbstractSet[Any]) -> bool:
    return all(type(e) is int or (isinstance(e, np.integer) and not isinstance(e, np.bool_)) for e in values)


def stored_group_index(key: Any, offloaded: Collection[int]) -> int:
    """The group index a ``stored`` key names (an int or its string, as in JSON), checked to be offloaded."""
    try:
        index = int(key)
    except (TypeError, ValueError):
        raise QueryError.single(
            "bad_stored", f"stored key {key!r} is not a group index", "stored", key=str(key)
        ) from None
    if index not in offloaded:
        raise QueryError.single(
            "group_not_offloaded",
            f"stored names group {index}, which is not offloaded; offloaded groups are {sorted(offloaded)}",
            f"stored.{key}",
            group=index,
        )
    return index


def _ends_checked(key: Any, ends: Any, H: int) -> frozenset[int]:
    if isinstance(ends, str | bytes) or not isinstance(ends, Collection):
        raise QueryError.single("bad_stored", f"stored[{key!r}] must be a list of end tokens", f"stored.{key}")
    checked = set()
    for e in ends:
        e = nonneg(f"stored.{key} end token", e)
        if e == 0 or e % H:
            raise QueryError.single(
                "not_on_hash_grid",
                f"stored[{key!r}] holds end token {e}; keys end on positive multiples of the hash unit H={H}",
                f"stored.{key}",
                end_token=e,
                hash_block_size=H,
            )
        checked.add(e)
    return frozenset(checked)


def validated_stored(geom: Geometry, stored: Any) -> dict[int, frozenset[int]]:
    """Every end token of a ``stored`` mapping checked (the JSON ``plan_hit`` contract): one set per
    offloaded group. Raises ``bad_stored``, ``group_not_offloaded``, ``not_an_integer``, ``negative``
    or ``not_on_hash_grid``.

    >>> import kvgeom
    >>> validated_stored(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), {"1": [16, 32]})[1] == {16, 32}
    True
    """
    off = _offloaded(geom)
    if not isinstance(stored, Mapping):
        raise QueryError.single(
            "bad_stored", f"stored must map a group index to end tokens, got {type(stored).__name__}", "stored"
        )
    out: dict[int, frozenset[int]] = dict.fromkeys(off, frozenset())
    for key, ends in stored.items():
        out[stored_group_index(key, out)] = _ends_checked(key, ends, geom.hash_block_size)
    return out


def _offloaded(geom: Geometry) -> tuple[int, ...]:
    if geom.offload is None:
        from kvgeom.keys import offload_group

        offload_group(geom, 0)  # raises the no_offload QueryError
    assert geom.offload is not None
    return tuple(og.index for og in geom.offload.groups)


def _sets_probe(sets: dict[int, AbstractSet[int]]) -> Probe:
    def contains(group: int, end_token: int) -> bool:
        return end_token in sets[group]

    return Probe(contains, ends=sets)


def _mapping_probe(geom: Geometry, stored: Mapping[Any, Any]) -> Probe:
    off = _offloaded(geom)
    sets: dict[int, AbstractSet[int]] = dict.fromkeys(off, frozenset())
    masks: dict[int, np.ndarray] = {}
    for key, ends in stored.items():
        index = stored_group_index(key, sets)
        if isinstance(ends, np.ndarray) and ends.dtype == np.bool_:
            if ends.ndim != 1:
                raise QueryError.single(
                    "bad_stored",
                    f"stored[{key!r}] is a bool array of shape {ends.shape}; a chunk mask is one-dimensional "
                    "(entry j: the key ending at (j + 1) * C of the group)",
                    f"stored.{key}",
                )
            masks[index] = ends
        elif isinstance(ends, AbstractSet):
            sets[index] = ends
        else:
            sets[index] = _ends_checked(key, ends, geom.hash_block_size)
    if not masks:
        return _sets_probe(sets)
    assert geom.offload is not None
    chunk = {og.index: og.tokens_per_chunk for og in geom.offload.groups}
    # one Python list per mask: indexing a list is cheaper than indexing a numpy array element
    lists = {g: m.tolist() for g, m in masks.items()}

    def contains(group: int, end_token: int) -> bool:
        held = lists.get(group)
        if held is None:
            return end_token in sets[group]
        C = chunk[group]
        if end_token % C:
            return False
        j = end_token // C - 1
        return j < len(held) and bool(held[j])

    # a set with foreign elements (16.0 == 16) has no safe bound: the scan then steps
    if not all(_plain_ints(sets[g]) for g in off if g not in lists):
        return Probe(contains)
    bound = {g: (len(lists[g]) * chunk[g] if g in lists else int(max(sets[g], default=0))) for g in off}
    return Probe(contains, bound=bound)


def _chain(block_hashes: Any, form: str) -> Sequence[Hashable]:
    if block_hashes is None:
        raise QueryError.single(
            "missing_block_hashes",
            f"a {form} store is keyed by block hash: pass block_hashes=<the request's hash chain>"
            " (vLLM: request.block_hashes)",
            "block_hashes",
        )
    if not isinstance(block_hashes, Sequence) or isinstance(block_hashes, str | bytes):
        raise QueryError.single(
            "bad_block_hashes",
            f"block_hashes must be a sequence of block hashes, got {type(block_hashes).__name__}",
            "block_hashes",
        )
    return block_hashes


def _residency_probe(geom: Geometry, res: Residency, chain: Sequence[Hashable], holder: int) -> Probe:
    off = _offloaded(geom)
    n = len(chain) * geom.hash_block_size
    return Probe(res.probe(geom, chain, holder), bound=dict.fromkeys(off, n))


def _result_held(result: Any, key: bytes) -> bool:
    if result is True or result is False:
        return result
    name = getattr(result, "name", None)
    if name == "HIT":
        return True
    if name == "MISS":
        return False
    raise QueryError.single(
        "lookup_not_ready",
        f"the tier answered {result!r} for offload key {key!r}; kvgeom counts only HIT and MISS. A pending or "
        "retried key makes vLLM defer the request: ask again when the tier settles",
        "stored",
    )


def _lookup_probe(geom: Geometry, manager: Any, chain: Sequence[Hashable], req_context: Any) -> Probe:
    off = _offloaded(geom)
    H = geom.hash_block_size
    n = len(chain)
    lookup = manager.lookup

    def contains(group: int, end_token: int) -> bool:
        i = end_token // H - 1
        if i >= n or end_token <= 0 or end_token % H:
            return False
        block_hash = chain[i]
        if not isinstance(block_hash, bytes):
            raise QueryError.single(
                "bad_block_hash",
                f"block_hashes[{i}] is {type(block_hash).__name__}; an offload manager is keyed by bytes hashes",
                f"block_hashes[{i}]",
            )
        key = block_hash + group.to_bytes(GROUP_INDEX_BYTES, "big")
        return _result_held(lookup(key, req_context), key)

    return Probe(contains, bound=dict.fromkeys(off, n * H))


def as_probe(
    geom: Geometry,
    stored: Any,
    *,
    block_hashes: Sequence[Hashable] | None = None,
    holder: int = 0,
    req_context: Any = None,
) -> Probe:
    """The :class:`Probe` of a store in any accepted form (see the module docstring).

    ``block_hashes`` (the request's hash chain at the hash unit H, hash i ending at token
    ``(i + 1) * H``) is required for a :class:`kvgeom.Residency` and for a ``lookup`` object,
    and refused otherwise; ``holder`` selects the Residency holder; ``req_context`` is passed to
    ``lookup``. A :class:`Probe` is returned unchanged.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> p = as_probe(g, {1: {16, 32}})
    >>> p.contains(1, 32), p.contains(0, 32)
    (True, False)
    """
    if isinstance(stored, Probe):
        return stored
    if isinstance(stored, Residency):
        return _residency_probe(geom, stored, _chain(block_hashes, "Residency"), holder)
    if callable(getattr(stored, "lookup", None)) and not isinstance(stored, Mapping):
        chain = _chain(block_hashes, "lookup(key, req_context)")
        return _lookup_probe(geom, stored, chain, req_context)
    if block_hashes is not None:
        raise QueryError.single(
            "unexpected_block_hashes",
            "block_hashes is only read with a Residency or lookup() store; this store already names end tokens",
            "block_hashes",
        )
    if isinstance(stored, Mapping):
        return _mapping_probe(geom, stored)
    if callable(stored):
        _offloaded(geom)
        return Probe(stored)
    raise QueryError.single(
        "bad_stored",
        f"stored must be a mapping {{group: end tokens}}, a contains(group, end_token) callable, a Residency or "
        f"an object with lookup(key, req_context); got {type(stored).__name__}",
        "stored",
    )
