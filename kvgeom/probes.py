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
  ``True``) is held, ``MISS`` (or ``False``) is not; ``HIT_PENDING`` (held, not readable yet) and
  ``RETRY`` (location unknown) are *unsettled* answers (:meth:`Probe.state`): the lookup then follows
  vLLM 0.33's own rules for them (a later miss can cancel a pending key; where vLLM defers the request,
  :func:`kvgeom.hits.lookup_hit` raises ``lookup_not_ready``);
* the same ``lookup`` object and the request's own per-group offload keys (``offload_keys``, entry
  ``[g][j]`` the key of group g's chunk j, ending at ``(j + 1) * C_g``: vLLM 0.33's
  ``RequestGroupState.offload_keys``, kept by ``update_offload_keys``): the keys are read, never
  built, so a probe costs the tier's ``lookup`` and a list read; answers are read as above;
* a mapping ``{group: end tokens}`` (the ``stored`` of :func:`kvgeom.hits.plan_hit`): a
  ``set`` / ``frozenset`` value is read in place, only at the probed entries; any other
  collection is checked entry by entry as it is turned into a set (no sorting);
* a mapping ``{group: bool array over chunk indices}`` (entry j: the key ending at
  ``(j + 1) * C_g``);
* a :class:`Probe` subclass (its ``contains``, and ``forward`` / ``below`` when it can answer
  them faster than the defaults).

Invariants (``tests/property/test_probe_laws.py``):

* every form answers exactly what the ``stored`` mapping form answers for the same keys, so
  :func:`kvgeom.hits.lookup_hit` returns the same :class:`kvgeom.hits.Hit` whatever the form (with
  ``offload_keys`` as with ``block_hashes``, when the lists are the keys the chain names);
* an end token off the hash grid, not positive, or past a known :attr:`Probe.bound` is never held;
* :meth:`Probe.below` never skips a held chunk: every chunk it jumps over is a miss, and
  :meth:`Probe.forward` stops exactly where stepping with ``contains`` would.

A windowed eagle group's popped answer is the ordinary window scan's over a derived question, "are this
chunk and the next one both held?" (:func:`eagle_pair_held`, the rule stated as a probe). The lookup
itself does not ask it: it scans the group's chunks right to left, each once, for a run one chunk longer
and pops the top one, as vLLM 0.33 asks them (:func:`kvgeom.hits.lookup_hit`; a law checks both give the
same run, ``tests/property/test_probe_laws.py``).
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
    "HIT",
    "MAX_STORED_ENDS",
    "MISS",
    "PENDING",
    "RETRY",
    "Probe",
    "RecordingProbe",
    "as_probe",
    "check_chain_length",
    "eagle_pair_held",
    "stored_group_index",
    "validated_stored",
]

#: The four answers a tier gives for one key (vLLM 0.33 ``LookupResult``): held; not held; held but not
#: readable yet (``HIT_PENDING``); location unknown (``RETRY``). :meth:`Probe.state` returns one of them.
HIT, MISS, PENDING, RETRY = "hit", "miss", "pending", "retry"

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

    #: Whether the tier answered :data:`PENDING` or :data:`RETRY` for a key asked so far (a tier that can say
    #: so sets it; :func:`kvgeom.hits.lookup_hit` then re-asks by vLLM's rules through :meth:`state`).
    unsettled: bool = False

    def __init__(self, bound: int | None = None) -> None:
        self.bound = bound

    def contains(self, group: int, end_token: int) -> bool:
        """Whether the tier holds ``group``'s key ending at ``end_token`` (a positive multiple of H)."""
        raise NotImplementedError

    def state(self, group: int, end_token: int) -> str:
        """The tier's answer for the key: :data:`HIT` or :data:`MISS` (from :meth:`contains`), or, for a tier
        that can say so (an offload manager's ``lookup``), :data:`PENDING` or :data:`RETRY`."""
        return HIT if self.contains(group, end_token) else MISS

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


class RecordingProbe(Probe):
    """A probe that answers as ``inner`` and records every question it is asked, in order.

    ``calls``: one ``(group, end_token, held)`` per :meth:`contains`, in order (a key asked twice is listed
    twice). It has no :attr:`Probe.bound` and the default :meth:`Probe.forward` / :meth:`Probe.below`, so a
    lookup over it asks key by key (never jumps a run of misses as a set- or mask-backed probe may): the
    order an offload manager's ``lookup`` is asked in. :func:`kvgeom.hits.lookup_trace` reads it.

    >>> p = RecordingProbe(_FunctionProbe(lambda group, end: end <= 32))
    >>> p.contains(0, 32), p.contains(1, 48), p.calls
    (True, False, [(0, 32, True), (1, 48, False)])
    """

    __slots__ = ("calls", "inner", "unsettled")

    def __init__(self, inner: Probe) -> None:
        super().__init__(None)
        self.inner = inner
        self.calls: list[tuple[int, int, bool]] = []
        self.unsettled = False
        """The wrapped tier's :attr:`Probe.unsettled`, read after every question."""

    def contains(self, group: int, end_token: int) -> bool:
        inner = self.inner
        held = bool(inner.contains(group, end_token))
        self.calls.append((group, end_token, held))
        self.unsettled = inner.unsettled
        return held

    def state(self, group: int, end_token: int) -> str:
        # a tier that answers pending/retry is re-asked by state(): recorded too, held only for HIT
        inner = self.inner
        answer = inner.state(group, end_token)
        self.calls.append((group, end_token, answer == HIT))
        self.unsettled = inner.unsettled
        return answer


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

    __slots__ = ("_H", "_chain", "_ctx", "_lookup", "_n", "_suffix", "_tape", "unsettled")

    def __init__(self, lookup: Callable[[bytes, Any], Any], chain: Sequence[Hashable], H: int, ctx: Any) -> None:
        n = len(chain)
        self.bound = n * H
        self._lookup, self._chain, self._H, self._ctx, self._n = lookup, chain, H, ctx, n
        self._suffix: dict[int, bytes] = {}
        self.unsettled = False
        """Whether the tier has answered :data:`PENDING` or :data:`RETRY` for a key asked so far."""
        self._tape: Tape | None = None

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

    def _answer(self, key: bytes) -> str:
        tape = self._tape
        answer = self._lookup(key, self._ctx) if tape is None else tape.replay(key, self._lookup, self._ctx)
        if answer is _ANSWERS[0]:
            return HIT
        if answer is _ANSWERS[1]:
            return MISS
        state = _read_answer(answer, key)
        if state is PENDING or state is RETRY:
            self.unsettled = True
        return state

    def _held(self, key: bytes) -> bool:
        answer = self._lookup(key, self._ctx)
        tape = self._tape
        if tape is not None:
            tape.append((key, answer))
        if answer is _ANSWERS[0]:
            return True
        if answer is _ANSWERS[1]:
            return False
        state = _read_answer(answer, key)
        if state is PENDING or state is RETRY:
            # taped: the settled walk stops here. Otherwise it counts as held; the lookup re-asks with state()
            self.unsettled = True
            if tape is not None:
                raise Unsettled
            return True
        return state is HIT

    def state(self, group: int, end_token: int) -> str:
        H = self._H
        i = end_token // H - 1
        if i >= self._n or end_token <= 0 or end_token % H:
            return MISS
        return self._answer(self._key(i, group))

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


class _KeysProbe(Probe):
    """The offload manager's ``lookup(key, req_context)`` over the request's own per-group offload keys
    (chunk j of group g is ``keys[g][j]``): nothing is built per probe. An end token off a group's chunk
    grid (a partial-tail key) is keyed through the hash chain, when one was given."""

    __slots__ = ("_chunk", "_ctx", "_keys", "_lookup", "_tail", "_tape", "unsettled")

    def __init__(self, lookup: Callable[[Any, Any], Any], keys: Any, chunk: dict[int, int], ctx: Any,
                 tail: _LookupProbe | None) -> None:
        self.bound = None
        self._lookup, self._keys, self._chunk, self._ctx, self._tail = lookup, keys, chunk, ctx, tail
        self.unsettled = False
        """Whether the tier has answered :data:`PENDING` or :data:`RETRY` for a key asked so far."""
        self._tape: Tape | None = None

    def _slow_held(self, answer: Any, key: Any) -> bool:
        """An answer that is not the remembered HIT / MISS object (already taped, when taped); an unsettled one
        stops a taped settled walk (:class:`Unsettled`), or counts as held (the lookup re-asks with
        :meth:`state` once it has seen one)."""
        state = _read_answer(answer, key)
        if state is PENDING or state is RETRY:
            self.unsettled = True
            if self._tape is not None:
                raise Unsettled
            return True
        return state is HIT

    def state(self, group: int, end_token: int) -> str:
        C = self._chunk[group]
        if end_token > 0 and end_token % C == 0:
            keys = self._keys[group]
            if type(keys) is not list:
                keys = self._group_keys(group)
            j = end_token // C - 1
            if j >= len(keys):
                return MISS
            key = keys[j]
            tape = self._tape
            answer = self._lookup(key, self._ctx) if tape is None else tape.replay(key, self._lookup, self._ctx)
            if answer is _ANSWERS[0]:
                return HIT
            if answer is _ANSWERS[1]:
                return MISS
            state = _read_answer(answer, key)
            if state is PENDING or state is RETRY:
                self.unsettled = True
            return state
        state = self._tail_probe(group, end_token, C).state(group, end_token)
        if state is PENDING or state is RETRY:
            self.unsettled = True
        return state

    def _tail_probe(self, group: int, end_token: int, C: int) -> _LookupProbe:
        tail = self._tail
        if tail is None:
            raise QueryError.single(
                "missing_block_hashes",
                f"the key of group {group} ending at token {end_token} is off the group's chunk grid (C={C}: a "
                "partial-tail key), so it is not in offload_keys: pass block_hashes=<the request's hash chain> too",
                "block_hashes",
            )
        return tail

    def _group_keys(self, group: int) -> Sequence[Any]:
        keys = self._keys[group]
        if type(keys) is not list and (not isinstance(keys, Sequence) or isinstance(keys, str | bytes)):
            raise QueryError.single(
                "bad_offload_keys",
                f"offload_keys[{group}] must be the group's list of offload keys, chunk j at entry j (vLLM: "
                f"request state group_states[{group}].offload_keys), got {type(keys).__name__}",
                f"offload_keys.{group}",
            )
        return keys

    def contains(self, group: int, end_token: int) -> bool:
        C = self._chunk[group]
        if end_token > 0 and end_token % C == 0:
            keys = self._keys[group]
            if type(keys) is not list:
                keys = self._group_keys(group)
            j = end_token // C - 1
            if j >= len(keys):
                return False
            key = keys[j]
            answer = self._lookup(key, self._ctx)
            tape = self._tape
            if tape is not None:
                tape.append((key, answer))
            if answer is _ANSWERS[0]:
                return True
            return answer is not _ANSWERS[1] and self._slow_held(answer, key)
        tail = self._tail_probe(group, end_token, C)
        held = tail.contains(group, end_token)
        if tail.unsettled:
            self.unsettled = True
        return held

    def forward(self, group: int, tokens_per_chunk: int, j: int, top: int) -> int:
        C = tokens_per_chunk
        if self._chunk[group] != C:
            return Probe.forward(self, group, C, j, top)
        keys = self._keys[group]
        if type(keys) is not list:
            keys = self._group_keys(group)
        stop = -(-top // C)
        if len(keys) < stop:
            stop = len(keys)
        lookup, ctx, hit, tape = self._lookup, self._ctx, _ANSWERS[0], self._tape
        start = j
        while j < stop:
            key = keys[j]
            answer = lookup(key, ctx)
            if answer is not hit:
                if answer is _ANSWERS[1]:
                    break
                if tape is not None:  # the run so far and this answer, before an unsettled one stops the walk
                    tape.append((keys, start, j))
                    tape.append((key, answer))
                    start = j + 1
                if not self._slow_held(answer, key):
                    break
                hit = _ANSWERS[0]  # the remembered HIT object (this answer, unless it was unsettled)
            j += 1
        if tape is not None:
            # one entry for the run of HIT answers (replayed key by key), then the answer that ended it
            tape.append((keys, start, j))
            if j < stop and start <= j:
                tape.append((keys[j], answer))
        return j

    def below(self, group: int, tokens_per_chunk: int, j: int) -> int:
        if tokens_per_chunk == self._chunk[group]:
            return min(j - 1, len(self._group_keys(group)) - 1)
        return j - 1


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
    needed = geom.request_hashes(num_tokens)
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


#: The last answer objects a ``lookup`` gave that meant "held" and "not held" (enum members, say): answers
#: are compared to them by identity first, so an answer object is read by name only the first time it is
#: seen (an answer is a value: the same object means the same thing every time). Unsettled answers
#: (``HIT_PENDING``, ``RETRY``) are read by name every time: they are rare.
_ANSWERS: list[Any] = [True, False]

_ANSWER_NAMES = {"HIT": HIT, "MISS": MISS, "HIT_PENDING": PENDING, "RETRY": RETRY}


class Unsettled(Exception):
    """Raised inside :func:`kvgeom.hits.lookup_hit` (never out of it) by a taped offload manager's first
    ``HIT_PENDING`` or ``RETRY`` answer in the settled walk (:class:`Tape`)."""


class Tape(list[tuple[Any, ...]]):
    """One lookup's calls to an offload manager's ``lookup(key, req_context)``, so that the manager is asked
    vLLM 0.33's keys once each, as vLLM's single walk asks them (issue 19).

    :func:`kvgeom.hits.lookup_hit` walks a manager by the fast settled rules first (:meth:`Probe.contains`,
    :meth:`Probe.forward`). While taped (:func:`arm`), the probe records every answer, and the first
    ``HIT_PENDING`` / ``RETRY`` stops that walk (:class:`Unsettled`). The walk by vLLM's rules for those answers
    (:meth:`Probe.state`) then replays the recorded answers, call by call, while it asks the recorded keys in
    the recorded order, and asks the manager from the first call that differs, or past the record.

    Entries are ``(key, answer)``, or ``(keys, i, j)`` for a run of HIT answers to ``keys[i:j]`` (a prefix scan
    over per-group offload keys records one entry, not one per key). ``pos``, set by :meth:`replaying`, is the
    next entry to replay (:meth:`replay`); ``probes``, the probes that write to it (:func:`arm`).

    Invariant (``tests/property/test_probe_laws.py``, checked on vLLM runs by the pending-trace rows): over
    answers that are all HIT or MISS the two walks ask the same keys in the same order, so up to the first
    unsettled answer they agree, and the manager is asked exactly the keys of the walk by vLLM's rules.
    """

    __slots__ = ("pos", "probes")
    pos: int
    probes: tuple[Any, ...]

    def disarm(self) -> None:
        """Undo :func:`arm`: the taped probes ask their manager directly again."""
        for p in self.probes:
            p._tape = None

    def replaying(self) -> None:
        """Switch from recording to replaying: runs are spelled out key by key, each answer the remembered HIT."""
        hit = _ANSWERS[0]
        flat: list[tuple[Any, Any]] = []
        for entry in self:
            if len(entry) == 3:
                keys, i, j = entry
                flat.extend((keys[k], hit) for k in range(i, j))
            else:
                flat.append(entry)
        self[:] = flat
        self.pos = 0

    def replay(self, key: Any, lookup: Callable[[Any, Any], Any], ctx: Any) -> Any:
        """After :meth:`replaying`: the recorded answer when ``key`` is the next recorded key, else
        ``lookup(key, ctx)``, the manager's, and every later call the manager's too."""
        i = self.pos
        if i < len(self):
            recorded, answer = self[i]
            # offload keys are the same objects call to call; keys built from a hash chain are equal bytes
            if recorded is key or (type(recorded) is bytes and recorded == key):
                self.pos = i + 1
                return answer
            self.pos = len(self)  # the walks part here: every later call goes to the manager
        return lookup(key, ctx)


def arm(probe: Probe) -> Tape | None:
    """Tape an offload manager's probe (or the one a :class:`RecordingProbe` wraps) for one
    :func:`kvgeom.hits.lookup_hit`; None for any other tier. A :class:`Probe` subclass that answers unsettled
    through :meth:`Probe.state` is not taped: it is walked twice, the settled walk's answers discarded.
    :meth:`Tape.disarm` ends it."""
    while isinstance(probe, RecordingProbe):
        probe = probe.inner
    if type(probe) is _KeysProbe:
        # the partial-tail probe asks the same manager: one record, in call order
        taped: tuple[_KeysProbe | _LookupProbe, ...] = (probe,) if probe._tail is None else (probe, probe._tail)
    elif type(probe) is _LookupProbe:
        taped = (probe,)
    else:
        return None
    tape = Tape()
    tape.probes = taped
    for p in taped:
        p._tape = tape
    return tape


def _read_answer(answer: Any, key: Any) -> str:
    """An answer that is not the remembered HIT / MISS object: read it by name (an unknown answer raises
    ``lookup_not_ready``) and remember it when it is HIT or MISS."""
    state = _result_state(answer, key)
    if state is HIT:
        _ANSWERS[0] = answer
    elif state is MISS:
        _ANSWERS[1] = answer
    return state


def _result_state(result: Any, key: bytes) -> str:
    if result is True or result is False:
        return HIT if result else MISS
    name = getattr(result, "name", None)
    state = _ANSWER_NAMES.get(name) if isinstance(name, str) else None
    if state is not None:
        return state
    raise QueryError.single(
        "lookup_not_ready",
        f"the tier answered {result!r} for offload key {key!r}; kvgeom reads HIT, MISS, HIT_PENDING and RETRY "
        "(vLLM 0.33 LookupResult) or True / False",
        "stored",
    )


#: Per geometry (by identity), each offloaded group's chunk C_g and one past the highest offloaded group
#: index: what a probe over per-group offload keys reads.
_CHUNKS: dict[int, tuple[Geometry, dict[int, int], int, bool]] = {}


def _chunks(geom: Geometry) -> tuple[Geometry, dict[int, int], int, bool]:
    """``(geom, {group: C_g}, one past the highest offloaded group, partial tails supported)``, cached."""
    cached = _CHUNKS.get(id(geom))
    if cached is not None and cached[0] is geom:
        return cached
    _offloaded(geom)  # raises no_offload
    assert geom.offload is not None
    chunk = {og.index: og.tokens_per_chunk for og in geom.offload.groups}
    if len(_CHUNKS) >= 256:
        _CHUNKS.clear()
    cached = _CHUNKS[id(geom)] = (geom, chunk, max(chunk) + 1, geom.offload.supports_partial_tail)
    return cached


def _keys_probe(geom: Geometry, stored: Any, offload_keys: Any, block_hashes: Any, req_context: Any) -> Probe:
    """The probe of a ``lookup`` store over the request's own per-group offload keys (checked here: the
    outer form and that it covers every offloaded group; each group's list when it is first read)."""
    lookup = getattr(stored, "lookup", None)
    if not callable(lookup):
        raise QueryError.single(
            "unexpected_offload_keys",
            "offload_keys is read with a store that has the offload manager's lookup(key, req_context) (vLLM: "
            f"the connector's manager); got {type(stored).__name__}: pass block_hashes instead",
            "offload_keys",
        )
    cached = _CHUNKS.get(id(geom))
    if cached is None or cached[0] is not geom:
        cached = _chunks(geom)
    _, chunk, top, partial_tails = cached
    kind = type(offload_keys)
    if (kind is not list and kind is not tuple) or len(offload_keys) < top:  # the common case passes at once
        if isinstance(offload_keys, Mapping):
            missing = [g for g in chunk if g not in offload_keys]
        elif isinstance(offload_keys, Sequence) and not isinstance(offload_keys, str | bytes | bytearray):
            missing = [g for g in chunk if g >= len(offload_keys)]
        else:
            raise QueryError.single(
                "bad_offload_keys",
                "offload_keys must hold, per group index, the request's offload keys of that group (a list of "
                f"lists, vLLM: [s.offload_keys for s in request_state.group_states], or a mapping); got "
                f"{kind.__name__}",
                "offload_keys",
            )
        if missing:
            raise QueryError.single(
                "bad_offload_keys",
                f"offload_keys has no keys for offloaded group(s) {show(missing)}; entry g holds group g's keys, "
                "one per chunk (an empty list when the request has none)",
                "offload_keys",
            )
    tail = None
    if block_hashes is None:
        if partial_tails:
            raise QueryError.single(
                "missing_block_hashes",
                "this geometry stores partial-tail keys, which end off the chunk grid and so are not in "
                "offload_keys: pass block_hashes=<the request's hash chain> (vLLM: request.block_hashes) too",
                "block_hashes",
            )
    else:
        tail = _LookupProbe(lookup, _chain(block_hashes, "lookup(key, req_context)"), geom.hash_block_size,
                            req_context)
    return _KeysProbe(lookup, offload_keys, chunk, req_context, tail)


def as_probe(
    geom: Geometry,
    stored: Any,
    *,
    block_hashes: Sequence[Hashable] | None = None,
    holder: int = 0,
    req_context: Any = None,
    offload_keys: Any = None,
) -> Probe:
    """The :class:`Probe` of a store in any accepted form (see the module docstring).

    ``block_hashes`` (the request's hash chain at the hash unit H, hash i ending at token
    ``(i + 1) * H``) is required for a :class:`kvgeom.Residency` and for a ``lookup`` object,
    and refused otherwise; ``holder`` selects the Residency holder; ``req_context`` is passed to
    ``lookup``. A :class:`Probe` is returned unchanged.

    ``offload_keys`` replaces ``block_hashes`` for a ``lookup`` object: per offloaded group index g
    (a list of lists, or a mapping), the request's offload keys of group g, entry j being the key of
    the chunk ending at ``(j + 1) * C_g`` (vLLM 0.33: ``[s.offload_keys for s in
    req_status.group_states]``; the lists grow in place, so the outer list can be kept per request).
    Keys past a list's end are not held. A geometry with partial tails also needs ``block_hashes``:
    a partial-tail key is off the chunk grid (``missing_block_hashes`` when one is asked without it).

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> p = as_probe(g, {1: {16, 32}})
    >>> p.contains(1, 32), p.contains(0, 32)
    (True, False)
    >>> class Tier:  # an offload manager's lookup(key, req_context)
    ...     def lookup(self, key, req_context):
    ...         return key in {b"k0/1", b"k1/1"}
    >>> p = as_probe(g, Tier(), offload_keys=[[b"k1/0"], [b"k0/1", b"k1/1", b"k2/1"]])
    >>> p.contains(1, 32), p.contains(1, 48), p.contains(0, 32)
    (True, False, False)
    """
    if offload_keys is not None:
        return _keys_probe(geom, stored, offload_keys, block_hashes, req_context)
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
    at ``e``, so the ordinary window scan over this probe gives the popped answer directly. (The lookup
    scans the raw chunks once each instead, as vLLM 0.33 asks them, and finds the same run; this probe
    asks each chunk twice, once per pair it is in.)

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

