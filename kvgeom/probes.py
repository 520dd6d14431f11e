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
  ``(j + 1) * C_g``);
* a :class:`Probe` subclass (its ``contains``, and ``forward`` / ``below`` when it can answer
  them faster than the defaults).

Invariants (``tests/property/test_probe_laws.py``):

* every form answers exactly what the ``stored`` mapping form answers for the same keys, so
  :func:`kvgeom.hits.lookup_hit` returns the same :class:`kvgeom.hits.Hit` whatever the form;
* an end token off the hash grid, not positive, or past a known :attr:`Probe.bound` is never held;
* :meth:`Probe.below` never skips a held chunk: every chunk it jumps over is a miss, and
  :meth:`Probe.forward` stops exactly where stepping with ``contains`` would.

A windowed eagle group asks a derived question, "are this chunk and the next one both held?"
(:func:`eagle_pair_held`), so the ordinary window scan over it gives the popped answer.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import numpy as np

from kvgeom._check import group_key, nonneg
from kvgeom._format import show
from kvgeom._math import INT64_MAX
from kvgeom.errors import QueryError
from kvgeom.residency import GROUP_INDEX_BYTES, Residency

if TYPE_CHECKING:
    from kvgeom.geometry import Geometry

__all__ = [
    "MAX_STORED_ENDS",
    "Probe",
    "as_probe",
    "check_chain_length",
    "eagle_pair_held",
    "stored_group_index",
    "validated_stored",
]

#: Most end tokens a ``stored`` list (the JSON form) may name per group: every one is checked, so a longer
#: list (16M tokens of keys at H = 16) is refused before the work (``too_many_stored``, issue 19); a tier that
#: large is asked through a ``contains(group, end_token)`` callable or a :class:`kvgeom.Residency`.
MAX_STORED_ENDS = 1 << 20

Contains = Callable[[int, int], bool]


class Probe:
    """The membership question of one request's lookup: ``contains(group, end_token)``.

    Subclass it (or pass a plain callable to :func:`as_probe`) to read a tier kvgeom does not know.
    :meth:`forward` and :meth:`below` have default implementations over :meth:`contains`; a store
    that can answer them faster overrides them, with the same answers.

    Attributes:
        bound: an end token past which nothing is held, in every group (``None``: unknown).
    """

    __slots__ = ("bound",)

    def __init__(self, bound: int | None = None) -> None:
        self.bound = bound

    def contains(self, group: int, end_token: int) -> bool:
        """Whether the tier holds ``group``'s key ending at ``end_token`` (a positive multiple of H)."""
        raise NotImplementedError

    def forward(self, group: int, tokens_per_chunk: int, j: int, top: int) -> int:
        """The first chunk ``j' >= j`` that is not held or starts at or past ``top`` (the full-attention
        prefix scan, chunk ``i`` being the key ending at ``(i + 1) * tokens_per_chunk``)."""
        C = tokens_per_chunk
        contains = self.contains
        while j * C < top and contains(group, (j + 1) * C):
            j += 1
        return j

    def below(self, group: int, tokens_per_chunk: int, j: int) -> int:
        """Highest chunk index ``i < j`` that may be held (``-1`` when none): every chunk in
        ``(i, j)`` is a miss. Without knowledge of the store this is ``j - 1``; a bounded probe jumps
        to its bound; a set-backed one sorts its chunks the first time it is asked (only after a
        long run of misses, see :func:`kvgeom.hits.lookup_hit`)."""
        if self.bound is not None:
            return min(j - 1, self.bound // tokens_per_chunk - 1)
        return j - 1


class _FunctionProbe(Probe):
    __slots__ = ("_fn",)

    def __init__(self, contains: Contains) -> None:
        super().__init__()
        self._fn = contains

    def contains(self, group: int, end_token: int) -> bool:
        return bool(self._fn(group, end_token))


class _SetProbe(Probe):
    """``{group: set of end tokens}``, read in place."""

    __slots__ = ("_chunks", "_sets")

    def __init__(self, sets: dict[int, AbstractSet[int]]) -> None:
        super().__init__()
        self._sets = sets
        self._chunks: dict[tuple[int, int], list[int] | None] = {}

    def contains(self, group: int, end_token: int) -> bool:
        return end_token in self._sets[group]

    def forward(self, group: int, tokens_per_chunk: int, j: int, top: int) -> int:
        C = tokens_per_chunk
        held = self._sets[group]
        while j * C < top and (j + 1) * C in held:
            j += 1
        return j

    def below(self, group: int, tokens_per_chunk: int, j: int) -> int:
        C = tokens_per_chunk
        key = (group, C)
        if key not in self._chunks:
            ends = self._sets[group]
            # foreign elements (16.0 == 16) have no safe order: keep stepping for that group
            self._chunks[key] = sorted(int(e) // C - 1 for e in ends if e > 0 and e % C == 0) if _plain_ints(
                ends) else None
        chunks = self._chunks[key]
        if chunks is None:
            return j - 1
        k = bisect_right(chunks, j - 1) - 1
        return chunks[k] if k >= 0 else -1


class _MaskProbe(Probe):
    """Some groups as bool chunk masks (entry j: the key ending at ``(j + 1) * C``), the others as sets."""

    __slots__ = ("_chunk", "_lists", "_sets")

    def __init__(self, sets: dict[int, AbstractSet[int]], masks: dict[int, np.ndarray],
                 chunk: dict[int, int]) -> None:
        # one Python list per mask: indexing a list is cheaper than indexing a numpy array element
        self._lists = {g: m.tolist() for g, m in masks.items()}
        self._sets = sets
        self._chunk = chunk
        bound = None
        if all(_plain_ints(sets[g]) for g in sets if g not in masks):
            bound = max([len(v) * chunk[g] for g, v in self._lists.items()]
                        + [int(max(sets[g], default=0)) for g in sets if g not in masks])
        super().__init__(bound)

    def contains(self, group: int, end_token: int) -> bool:
        held = self._lists.get(group)
        if held is None:
            return end_token in self._sets[group]
        C = self._chunk[group]
        if end_token % C:
            return False
        j = end_token // C - 1
        return j < len(held) and bool(held[j])


class _ResidencyProbe(Probe):
    """A :class:`~kvgeom.Residency` read through one request's hash chain (the live index, never copied)."""

    __slots__ = ("_H", "_bit", "_chain", "_index", "_n")

    def __init__(self, index: dict[int, dict[Hashable, int]], chain: Sequence[Hashable], H: int, bit: int) -> None:
        n = len(chain)
        self.bound = n * H
        self._index, self._chain, self._H, self._bit, self._n = index, chain, H, bit, n

    def contains(self, group: int, end_token: int) -> bool:
        H = self._H
        if end_token <= 0 or end_token % H:
            return False
        i = end_token // H - 1
        if i >= self._n:
            return False
        held = self._index.get(group)
        return held is not None and bool(held.get(self._chain[i], 0) & self._bit)

    def forward(self, group: int, tokens_per_chunk: int, j: int, top: int) -> int:
        held = self._index.get(group)
        if held is None:
            return j
        C = tokens_per_chunk
        get, chain, bit = held.get, self._chain, self._bit
        hpc = C // self._H
        stop = min(-(-top // C), self._n // hpc)
        k = (j + 1) * hpc - 1
        while j < stop and get(chain[k], 0) & bit:
            j += 1
            k += hpc
        return j


class _LookupProbe(Probe):
    """An object with the offload manager's ``lookup(key, req_context)``, keyed by the chain's bytes hashes."""

    __slots__ = ("_H", "_answers", "_chain", "_ctx", "_lookup", "_n", "_suffix")

    def __init__(self, lookup: Callable[[bytes, Any], Any], chain: Sequence[Hashable], H: int, ctx: Any) -> None:
        n = len(chain)
        super().__init__(n * H)
        self._lookup, self._chain, self._H, self._ctx, self._n = lookup, chain, H, ctx, n
        self._suffix: dict[int, bytes] = {}
        self._answers: dict[Any, bool] = {}
        """Each answer object seen (an enum member, say) and whether it means held: read once by name."""

    def _key(self, i: int, group: int) -> bytes:
        block_hash = self._chain[i]
        if type(block_hash) is not bytes:
            raise QueryError.single(
                "bad_block_hash",
                f"block_hashes[{i}] is {type(block_hash).__name__}; an offload manager is keyed by bytes hashes",
                f"block_hashes[{i}]",
            )
        suffix = self._suffix.get(group)
        if suffix is None:
            suffix = self._suffix[group] = group.to_bytes(GROUP_INDEX_BYTES, "big")
        return block_hash + suffix

    def _held(self, key: bytes) -> bool:
        answer = self._lookup(key, self._ctx)
        try:
            known = self._answers.get(answer)
        except TypeError:  # an unhashable answer: read it every time
            return _result_held(answer, key)
        if known is None:
            known = self._answers[answer] = _result_held(answer, key)
        return known

    def contains(self, group: int, end_token: int) -> bool:
        H = self._H
        i = end_token // H - 1
        if i >= self._n or end_token <= 0 or end_token % H:
            return False
        return self._held(self._key(i, group))

    def forward(self, group: int, tokens_per_chunk: int, j: int, top: int) -> int:
        C = tokens_per_chunk
        hpc = C // self._H
        stop = min(-(-top // C), self._n // hpc)
        held, key = self._held, self._key
        while j < stop and held(key((j + 1) * hpc - 1, group)):
            j += 1
        return j


def _plain_ints(values: AbstractSet[Any]) -> bool:
    return all(type(e) is int or (isinstance(e, np.integer) and not isinstance(e, np.bool_)) for e in values)


def stored_group_index(key: Any, offloaded: Collection[int]) -> int:
    """The group index a ``stored`` key names (an int or its canonical decimal string, as in JSON; see
    :func:`kvgeom._check.group_key`), checked to be offloaded."""
    index = group_key("stored", key)
    if index not in offloaded:
        raise QueryError.single(
            "group_not_offloaded",
            f"stored names group {index}, which is not offloaded; offloaded groups are {show(sorted(offloaded))}",
            f"stored.{index}",
            group=index,
        )
    return index


def _ends_checked(key: Any, ends: Any, H: int) -> frozenset[int]:
    index = group_key("stored", key)
    if (
        isinstance(ends, str | bytes | Mapping)
        or not isinstance(ends, Collection)
        or (isinstance(ends, np.ndarray) and ends.ndim != 1)
    ):
        raise QueryError.single(
            "bad_stored", f"stored[{index}] must be a list of end tokens, got {show(ends)}", f"stored.{index}"
        )
    try:
        count = len(ends)
    except OverflowError:  # a range past sys.maxsize
        count = INT64_MAX + 1
    if count > MAX_STORED_ENDS:
        many = str(count) if count <= INT64_MAX else f"more than {INT64_MAX}"
        raise QueryError.single(
            "too_many_stored",
            f"stored[{index}] lists {many} end tokens; a stored list holds at most {MAX_STORED_ENDS}, each "
            "checked: pass a contains(group, end_token) callable or a Residency for a larger tier",
            f"stored.{index}",
            count=count,
            limit=MAX_STORED_ENDS,
        )
    fast = _plain_grid_ends(ends, H)
    if fast is not None:
        return fast
    checked = set()
    for e in ends:
        e = nonneg(f"stored.{index} end token", e)
        if e == 0 or e % H:
            raise QueryError.single(
                "not_on_hash_grid",
                f"stored[{index}] holds end token {e}; keys end on positive multiples of the hash unit H={H}",
                f"stored.{index}",
                end_token=e,
                hash_block_size=H,
            )
        checked.add(e)
    return frozenset(checked)


def _plain_grid_ends(ends: Collection[Any], H: int) -> frozenset[int] | None:
    """``ends`` as a set when every one is a plain int in ``(0, int64 max]`` on the H grid (checked at C speed:
    a million end tokens in well under a second), else None and the caller's loop names the first bad one."""
    try:
        held = frozenset(ends)
    except TypeError:  # an unhashable element
        return None
    if set(map(type, held)) - {int}:
        return None
    try:
        arr = np.fromiter(held, dtype=np.int64, count=len(held))
    except OverflowError:
        return None
    if arr.size and (arr.min() <= 0 or (arr % H).any()):
        return None
    return held


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
        return _SetProbe(sets)
    assert geom.offload is not None
    return _MaskProbe(sets, masks, {og.index: og.tokens_per_chunk for og in geom.offload.groups})


def check_chain_length(geom: Geometry, num_tokens: int, block_hashes: Sequence[Hashable]) -> None:
    """Refuse a hash chain shorter than a request of ``num_tokens`` has (:class:`kvgeom.QueryError`
    ``block_hashes_too_short``): vLLM's ``request.block_hashes`` holds ``max(0, num_tokens - P) // H`` hashes
    (P: :attr:`kvgeom.Geometry.hash_lookahead_tokens`), and a lookup past a short chain would read every
    missing key as not held and answer a silent 0 (issue 19).

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)  # H = 16, P = 0
    >>> check_chain_length(g, 64, ["h0", "h1", "h2", "h3"])
    >>> try:
    ...     check_chain_length(g, 64, ["h0"])
    ... except kvgeom.QueryError as e:
    ...     print(e.code, e.values)
    block_hashes_too_short {'num_hashes': 1, 'needed': 4}
    """
    needed = max(0, num_tokens - geom.hash_lookahead_tokens) // geom.hash_block_size
    if len(block_hashes) < needed:
        raise QueryError.single(
            "block_hashes_too_short",
            f"block_hashes holds {len(block_hashes)} hashes; a request of num_tokens={num_tokens} has {needed} "
            f"(one per H={geom.hash_block_size} tokens, less the {geom.hash_lookahead_tokens} look-ahead tokens): "
            "pass the request's whole chain (vLLM: request.block_hashes)",
            "block_hashes",
            num_hashes=len(block_hashes),
            needed=needed,
        )


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
    if type(holder) is not int or holder < 0:
        res.probe(geom, chain, holder)  # raises bad_holder
    return _ResidencyProbe(res._held, chain, geom.hash_block_size, 1 << holder)


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
    kind = type(stored)
    if kind is Residency:  # the hot path first: exact type checks are cheaper than ABC checks
        if type(block_hashes) is not list:
            block_hashes = _chain(block_hashes, "Residency")
        return _residency_probe(geom, stored, block_hashes, holder)
    if kind is dict and block_hashes is None:
        return _mapping_probe(geom, stored)
    if isinstance(stored, Probe):
        return stored
    if isinstance(stored, Residency):
        return _residency_probe(geom, stored, _chain(block_hashes, "Residency"), holder)
    if callable(getattr(stored, "lookup", None)) and not isinstance(stored, Mapping):
        chain = _chain(block_hashes, "lookup(key, req_context)")
        return _LookupProbe(stored.lookup, chain, geom.hash_block_size, req_context)
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
        return _FunctionProbe(stored)
    raise QueryError.single(
        "bad_stored",
        f"stored must be a mapping {{group: end tokens}}, a contains(group, end_token) callable, a Residency or "
        f"an object with lookup(key, req_context); got {type(stored).__name__}",
        "stored",
    )


def eagle_pair_held(probe: Probe, chunk: int, stop: int) -> Probe:
    """A probe in which chunk end ``e`` is held iff the chunk ending at ``e`` and the next one are both held,
    the next one ending at or before ``stop``. A windowed eagle group needs its window plus one more chunk
    and pops that one: a run of ``w + 1`` held chunks ending at ``e + C`` is a run of ``w`` such pairs ending
    at ``e``, so the ordinary window scan over this probe gives the popped answer directly.

    >>> from kvgeom.probes import as_probe
    >>> import kvgeom
    >>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}], "offload": {}})
    >>> pairs = eagle_pair_held(as_probe(geom, {0: [16, 32, 64]}), 16, 64)
    >>> [e for e in (16, 32, 48, 64) if pairs.contains(0, e)]
    [16]
    """
    return _PairProbe(probe, chunk, stop)


class _PairProbe(Probe):
    """:func:`eagle_pair_held`'s probe over an inner one."""

    __slots__ = ("_chunk", "_inner", "_stop")

    def __init__(self, inner: Probe, chunk: int, stop: int) -> None:
        super().__init__(inner.bound)
        self._inner, self._chunk, self._stop = inner, chunk, stop

    def contains(self, group: int, end_token: int) -> bool:
        C, inner = self._chunk, self._inner
        return (
            end_token % C == 0
            and end_token + C <= self._stop
            and inner.contains(group, end_token)
            and inner.contains(group, end_token + C)
        )

    def below(self, group: int, tokens_per_chunk: int, j: int) -> int:
        # every pair-held chunk is held, so the inner probe's next possibly held chunk is a safe bound
        return self._inner.below(group, tokens_per_chunk, j)

