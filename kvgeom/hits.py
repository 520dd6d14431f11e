"""Hit lengths, load plans and store plans of an offloading connector.

This is vLLM 0.33's OffloadingConnector algorithm (vLLM 0.33
`offloading/scheduler.py`: `_build_store_jobs`, `_lookup_complete_chunks`, `_lookup`,
`update_state_after_alloc`) with one deliberate difference: **kvgeom re-aligns the candidate
hit to the Mamba chunk after every clamp**, where vLLM aligns once and relies
on the Mamba group being looked up last (``docs/deviations.md``, ``realign-after-clamp``; a fork hit the
unaligned case, weicj/vLLM-2080Ti-Definitive #133).

The guarantee every plan here keeps (property-tested): a restored Mamba state
is the state after exactly the hit's end token N, and N < num_tokens (the last
token is always recomputed, #44599), so N is a multiple of the Mamba chunk or
an exact partial-tail boundary.

With a drafter, an eagle group's lookup queries one chunk more and pops it
(:func:`eagle_pops`, :func:`eagle_query_end`) and its store holds back the
volatile last chunk while the request decodes (:func:`store_holdback_chunks`).

Not modelled: look-ahead hash tokens, SimpleCPUOffloadConnector's lazy mode.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvgeom._check import flag, mapping, nonneg, prompt_tokens
from kvgeom._check import scenario as check_scenario
from kvgeom._math import INT64_MAX, cdiv, rdown
from kvgeom.boundaries import restore_read_block, state_block_for_boundary
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry, OffloadGeometry, OffloadGroupGeometry
from kvgeom.handoff import (
    checked_chunk_ends,
    checked_prefill_split,
    default_chunk_ends,
    handed_over_tokens,
    mamba_handoffs,
    partial_tail_boundary,
    partial_tail_key,
    partial_tail_max_boundary,
)
from kvgeom.keys import num_keys, offload_group
from kvgeom.masks import check_result_size, check_store_size, reachable_block_mask, reachable_points, swa_store_horizon
from kvgeom.prefix import scheduler_keeps_load
from kvgeom.probes import (
    HIT,
    MISS,
    PENDING,
    RETRY,
    Probe,
    RecordingProbe,
    Unsettled,
    arm,
    as_probe,
    check_chain_length,
)
from kvgeom.probes import stored_group_index as stored_group_index  # moved to probes; kept importable here
from kvgeom.residency import Residency
from kvgeom.specs import rswa_window_of

__all__ = [
    "GroupLoad",
    "GroupStore",
    "Hit",
    "HitPlan",
    "LookupTrace",
    "ProbeCall",
    "StorePlan",
    "eagle_pops",
    "eagle_query_end",
    "lookup_hit",
    "lookup_trace",
    "plan_hit",
    "plan_load",
    "plan_store",
    "plan_store_steps",
    "rswa_gap_blocks",
    "skipped_tokens",
    "store_holdback_chunks",
]


@dataclass(frozen=True, slots=True)
class Hit:
    """Result of a lookup: ``end_token = local_computed_tokens + hit_tokens``."""

    hit_tokens: int
    end_token: int
    local_computed_tokens: int
    """The local prefix the lookup started from (rounded down to L, as the scheduler hands it)."""
    partial_tail: bool


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """What one group loads for a hit ending at ``end_token``."""

    index: int
    load_keys: tuple[int, ...]
    """End tokens of the keys to load, in order."""
    block_entries: tuple[int, ...]
    """Block-table entries written (for align Mamba: the one state block)."""
    skip_in_first_chunk: int
    """Sub-blocks of the first loaded chunk that are skipped (``first_entry % k``)."""
    state_block: int | None
    """Align-mode Mamba: the block holding the restored state (``(N-1) // B_m``)."""

    def to_dict(self) -> dict[str, Any]:
        """One group's entry of the ``plan_hit`` and ``plan_request`` contracts."""
        return {
            "index": self.index,
            "load_keys": list(self.load_keys),
            "block_entries": list(self.block_entries),
            "state_block": self.state_block,
        }


@dataclass(frozen=True, slots=True)
class HitPlan:
    hit: Hit
    groups: tuple[GroupLoad, ...]

    def to_dict(self) -> dict[str, Any]:
        """The stable ``plan_hit`` contract."""
        return {
            "hit_tokens": self.hit.hit_tokens,
            "end_token": self.hit.end_token,
            "groups": [g.to_dict() for g in self.groups],
        }


def _offload(geom: Geometry) -> OffloadGeometry:
    if geom.offload is None:
        offload_group(geom, 0)  # raises the no_offload QueryError
    assert geom.offload is not None
    return geom.offload


#: Consecutive misses after which a window scan asks the probe where the next held chunk may be
#: (:meth:`kvgeom.probes.Probe.below`) instead of stepping: a set-backed probe then sorts its chunks
#: once, which a scan that stops within a few chunks (the common case) never pays for.
_MISSES_BEFORE_SKIP = 8


def _scan_window(
    g: GroupGeometry, og: OffloadGroupGeometry, probe: Probe, end: int, start_chunk: int, pop: int = 0
) -> int | None:
    """Right-to-left scan for a run of stored chunks that serves a hit ending at ``end``.

    Returns the new candidate end (the right edge of the run found), or None.
    The first run may end inside a chunk; later runs end on chunk boundaries.
    A run that reaches the start of the scan counts even when short (vLLM 0.33
    ``offloading/scheduler.py::_sliding_window_lookup``). Chunks are probed from the one holding
    ``end - 1`` downwards, each once, and the scan stops as soon as the run is long enough.

    ``pop`` 1 is an unverified eagle group (vLLM 0.33 ``_lookup_complete_chunks``): the scan starts one chunk
    higher (the volatile chunk past ``end``), every run needs one chunk more, and the run found is answered
    without its top chunk (popped). Chunks are still asked once each, right to left, as vLLM asks them.
    """
    C = og.tokens_per_chunk
    w = g.window_need  # None: Mamba, one key
    window = og.window_chunks or 1
    sliding = g.family == "sliding"
    contains, index = probe.contains, og.index
    # The run a hit ending at ``at`` needs (written out where it is used; no closure per scan): Mamba, the
    # single key ending at the candidate; a chunked-local group, its fixed window of chunks
    # (``load_window_size_in_chunks``, not padded for a candidate inside a chunk); a sliding window, at least
    # the group's window in chunks, even when the positions before the hit fit in fewer (a window of 1 needs
    # no stored position at all): max(cdiv(w + (-at) % C, C), window); plus the popped chunk.
    if not sliding:
        w = None if w is None else 0
    run_end = end  # the right edge of the current run once its popped chunk is off
    cur = pop + (1 if w is None else max(-(-(w + (-run_end) % C) // C), window))
    run = 0
    misses = 0
    j = -(-end // C) - 1 + pop
    while j >= start_chunk:
        if cur <= run:
            return run_end
        if contains(index, (j + 1) * C):
            run += 1
            misses = 0
            j -= 1
            continue
        run = 0
        run_end = (j - pop) * C
        cur = pop + (1 if w is None else max(-(-(w + (-run_end) % C) // C), window))
        if cur <= 0:
            return run_end
        misses += 1
        nxt = j - 1
        if misses >= _MISSES_BEFORE_SKIP:
            # Every chunk down to the next one that may be held is a miss too, and a miss on the chunk
            # grid always needs the same run: jump there (a long request with few keys stays cheap).
            nxt = max(probe.below(index, C, j), start_chunk - 1)
            if nxt < j - 1:
                run_end = (nxt + 1 - pop) * C
                cur = pop + (1 if w is None else max(-(-(w + (-run_end) % C) // C), window))
        j = nxt
    if run >= cur or run > 0:
        return run_end
    return None


def _align_to_mamba_chunk(m: int, mamba_chunk: int | None) -> int:
    """A candidate hit rounded down to the Mamba chunk (#44599); module level so the property tests
    can break it on purpose and show the hit laws catch it."""
    return m - m % mamba_chunk if mamba_chunk else m


def lookup_hit(
    geom: Geometry,
    num_tokens: int,
    *,
    stored: Any,
    block_hashes: Sequence[Hashable] | None = None,
    holder: int = 0,
    req_context: Any = None,
    num_prompt_tokens: int | None = None,
    local_computed_tokens: int = 0,
    max_load_tokens: int | None = None,
    max_num_new_tokens: int | None = None,
    offload_keys: Any = None,
) -> Hit:
    """How many tokens past the local prefix an offload tier can supply (vLLM 0.33
    ``offloading/scheduler.py::_lookup_complete_chunks`` and ``_lookup``).

    ``stored`` is the tier in any form :func:`kvgeom.probes.as_probe` accepts: a mapping from a
    group index to the end tokens (or a bool chunk mask) of the keys held for this request, a
    ``contains(group, end_token)`` callable, a :class:`kvgeom.Residency` or an object with the
    offload manager's ``lookup(key, req_context)`` (these two with ``block_hashes``, the
    request's hash chain). A connector that already holds the request's offload keys per group
    (vLLM 0.33's request state: ``[s.offload_keys for s in req_status.group_states]``) passes them
    as ``offload_keys`` with its manager instead: keys are then read, never built (a geometry with
    partial tails needs ``block_hashes`` as well, for the partial-tail key). The tier is probed
    lazily, key by key in vLLM's order: full-attention groups from the local prefix forwards,
    stopping at the first miss; windowed groups from the candidate end backwards, each chunk once,
    stopping when a run is long enough (and asked again in every pass of the windowed groups, as vLLM
    asks them). A probe that knows where its next held chunk is (:meth:`kvgeom.probes.Probe.below`) lets
    a long run of misses be jumped; otherwise the keys asked are the ones :func:`lookup_trace` lists: vLLM
    0.33's, but where kvgeom's re-alignment to the Mamba chunk (the registered ``realign-after-clamp``
    deviation) ends or moves a scan. The stored set is never validated or sorted as a whole.

    The local prefix is rounded down to the scheduler block L first, as the scheduler hands it to
    the connector.

    Postconditions: ``end_token < num_tokens`` whenever a windowed (sliding,
    chunked or Mamba) group exists; with an align Mamba group ``end_token`` is
    a multiple of the Mamba chunk, or an exact partial-tail boundary whose
    boundary key every group holds; every full-attention chunk covering
    ``[local, end_token)`` is stored; the Mamba key ending at ``end_token`` is
    stored. Every store form gives the same :class:`Hit` for the same held keys.

    A tier whose ``lookup`` answers ``HIT_PENDING`` (held, not readable yet) or ``RETRY`` (location unknown)
    for a key the lookup asks is read as vLLM 0.33's connector reads it (``_maximal_prefix_lookup``,
    ``_sliding_window_lookup``, ``_lookup_complete_chunks``, ``_lookup``): a full-attention scan with such
    a key before its first miss defers, and does not lower the candidate; a windowed scan defers on any
    ``RETRY`` and on a ``HIT_PENDING`` inside the run it returns, while a miss below a pending key cancels
    it (the scan goes on and loads what the window still supports); a group that lowers the candidate
    clears the deferral and every group is asked again; a partial tail with such a key is no tail, and
    defers only when the complete-chunk hit is 0. Where vLLM ends deferred, :class:`kvgeom.QueryError`
    ``lookup_not_ready``; otherwise the hit vLLM loads.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> lookup_hit(g, 64, stored={0: [32, 64], 1: [16, 32, 48, 64]}).end_token
    48
    >>> lookup_hit(g, 65, stored=lambda group, end: end <= 64).end_token
    64
    """
    cached = _ORDERS.get(id(geom))
    order = cached[1] if cached is not None and cached[0] is geom else _order(geom)
    # ints in [0, int64 max] pass without a call; anything else gets nonneg's checks and messages
    n = num_tokens if type(num_tokens) is int and 0 <= num_tokens <= INT64_MAX else nonneg("num_tokens", num_tokens)
    prompt = n if num_prompt_tokens is None else prompt_tokens(num_prompt_tokens, n)
    local = local_computed_tokens
    if type(local) is not int or not 0 <= local <= INT64_MAX:
        local = nonneg("local_computed_tokens", local)
    if local > n:
        raise QueryError.single(
            "local_past_request",
            f"local_computed_tokens={local} exceeds num_tokens={n}",
            "local_computed_tokens",
            local_computed_tokens=local,
            num_tokens=n,
        )
    mnn = None if max_num_new_tokens is None else nonneg("max_num_new_tokens", max_num_new_tokens)
    mlt = None if max_load_tokens is None else nonneg("max_load_tokens", max_load_tokens)
    c = local - local % order.L if local else 0
    M = n
    if mnn is not None:
        M = min(M, c + mnn)
    if mlt is not None:
        M = min(M, c + mlt)
    limit = M
    if order.windowed:
        M = _align_to_mamba_chunk(M - 1 if M else 0, order.Cm)
    if M - c < order.first_chunk and not order.partial_tail_span:
        # Not one chunk of the first group fits past c: no hit, and no key to ask. A store in a form
        # whose probe would be built without a further check (a Residency with a list chain and the
        # default holder; a manager's lookup with a list of per-group key lists covering every offloaded
        # group, each checked where it is read) is not built; any other is built, which checks it, so bad
        # input is refused whatever the request.
        if offload_keys is None:
            hot = type(stored) is Residency and type(block_hashes) is list and type(holder) is int and holder == 0
        else:
            hot = (block_hashes is None and type(offload_keys) is list and len(offload_keys) >= order.groups_top
                   and callable(getattr(stored, "lookup", None)))
        if not hot:
            as_probe(geom, stored, block_hashes=block_hashes, holder=holder, req_context=req_context,
                     offload_keys=offload_keys)
        if block_hashes is not None and len(block_hashes) < n // order.H:
            check_chain_length(geom, n, block_hashes)  # a short chain would read as misses: a silent 0 (issue 19)
        hit = _NO_HIT.get(c)
        return hit if hit is not None else _no_hit(c)
    probe = as_probe(geom, stored, block_hashes=block_hashes, holder=holder, req_context=req_context,
                     offload_keys=offload_keys)
    if block_hashes is not None and len(block_hashes) < n // order.H:
        check_chain_length(geom, n, block_hashes)
    # an offload manager's answers are recorded, and its first HIT_PENDING / RETRY answer stops the settled walk:
    # the walk by vLLM's rules for them then replays them, so the manager is asked vLLM's keys once (issue 19)
    tape = arm(probe)
    try:
        try:
            # the first group's clamp can only lower M: less than its chunk past c is no hit, with no key asked
            # a partial tail asks its bridge chunk only of the groups whose prefix scan did not reach past it
            reach: dict[int, int] | None = {} if order.partial_tail_span else None
            done = c if M - c < order.first_chunk else _complete(geom, order, probe, n, c, M, mlt is not None, reach)
            found = _partial_tail(geom, order, probe, n, prompt, c, done, limit, reach) if reach is not None else None
            if found is None:
                found = _NO_HIT.get(c) if done == c else _HITS.get((done, c))
                if found is None:
                    found = _no_hit(c) if done == c else _hit(done, c, False)
            if not probe.unsettled:
                return found
        except Unsettled:
            assert tape is not None  # only a tape raises it
            tape.replaying()
        # the tier answered HIT_PENDING or RETRY for a key the lookup asked: walk by vLLM's rules for them (a
        # Probe subclass that says so only through its unsettled flag is asked again from the start)
        unsettled = _lookup_unsettled(geom, order, probe, n, prompt, c, M, limit, mlt is not None)
    finally:
        if tape is not None and probe is stored:  # a probe built here is dropped; one passed in is given back as it was
            tape.disarm()
    if unsettled is None:
        raise QueryError.single(
            "lookup_not_ready",
            f"the tier answered HIT_PENDING or RETRY for a key the hit of this {n}-token request depends on; "
            "vLLM 0.33 defers the request (get_num_new_matched_tokens answers None): ask again when the tier "
            "settles",
            "stored",
            num_tokens=n,
        )
    return unsettled


class ProbeCall(NamedTuple):
    """One key a lookup asked the tier for (:func:`lookup_trace`)."""

    group: int
    end_token: int
    """The key's prefix ends here (the partial-tail or chunk key ending at this token)."""
    hash_index: int
    """Its index in the request's hash chain, ``end_token // H - 1`` (vLLM's ``block_hashes`` index)."""
    held: bool


class LookupTrace(NamedTuple):
    """:func:`lookup_trace`'s answer: the hit and every key asked for it, in order."""

    hit: Hit
    probes: tuple[ProbeCall, ...]


def lookup_trace(geom: Geometry, num_tokens: int, *, stored: Any, block_hashes: Sequence[Hashable] | None = None,
                 holder: int = 0, req_context: Any = None, **options: Any) -> LookupTrace:
    """Which keys :func:`lookup_hit` asks the tier for, in order, and its hit (the same :class:`Hit`).

    ``stored``, ``block_hashes``, ``holder``, ``req_context`` and ``options`` (``num_prompt_tokens``,
    ``local_computed_tokens``, ``max_load_tokens``, ``max_num_new_tokens``) are :func:`lookup_hit`'s. The
    tier is wrapped in a :class:`kvgeom.probes.RecordingProbe`, which only records (and has no bound, so no
    run of misses is jumped): the keys :func:`lookup_hit` asks, in the order vLLM 0.33's
    ``_lookup_complete_chunks`` and ``_lookup`` ask the offload manager's ``lookup`` in, a key asked again
    listed again (checked on vLLM runs in ``tests/test_store_conformance.py`` and ``tests/test_hits_edges.py``;
    where kvgeom re-aligns a candidate to the Mamba chunk after a clamp, the registered
    ``realign-after-clamp`` deviation, kvgeom may stop asking earlier, or the keys asked differ with the hit).

    Over a tier that answers ``HIT_PENDING`` or ``RETRY`` for a key the lookup asks, :func:`lookup_hit` walks
    the keys as over a settled tier until the first such answer and then by vLLM's rules for those answers; the
    trace lists the second walk, the one vLLM asks (checked on vLLM runs by ``tests/test_scheduler_conformance.py``'s
    seeded pending-tier sweep and rows in ``tests/test_hits_edges.py``). An offload manager is asked exactly
    those keys, once each time the walk asks them: the second walk replays the answers the first was given
    (:class:`kvgeom.probes.Tape`). Where the lookup defers, the ``lookup_not_ready`` :class:`kvgeom.QueryError`
    carries the keys asked as its ``probes``.

    Postconditions: ``hit`` equals :func:`lookup_hit`'s; each probe's ``held`` is the tier's answer; every
    key the hit loads was asked and held.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...                                {"kind": "mamba", "block_size": 16}], "offload": {}})
    >>> t = lookup_trace(g, 70, stored={0: [16, 32, 48, 64], 1: [32]})   # vLLM 0.33 run: the same keys
    >>> t.hit.end_token, [(p.group, p.end_token, p.held) for p in t.probes]
    (32, [(0, 16, True), (0, 32, True), (0, 48, True), (0, 64, True), (1, 64, False), (1, 48, False), (1, 32, True)])
    """
    recorder = _TraceProbe(as_probe(geom, stored, block_hashes=block_hashes, holder=holder, req_context=req_context))
    try:
        hit = lookup_hit(geom, num_tokens, stored=recorder, **options)
    except QueryError as e:
        if e.code == "lookup_not_ready":  # deferred: the keys asked travel with the error
            e.probes = _trace_calls(geom, recorder)
        raise
    return LookupTrace(hit, _trace_calls(geom, recorder))


def _trace_calls(geom: Geometry, recorder: _TraceProbe) -> tuple[ProbeCall, ...]:
    """The keys :func:`lookup_trace` lists: every call, or over a tier that answered HIT_PENDING or RETRY, the
    calls of the walk by vLLM's rules for those answers (the settled walk's calls before it are not vLLM's walk;
    an offload manager's answers to them are replayed, not asked again)."""
    H = geom.hash_block_size
    calls = recorder.calls
    if recorder.unsettled:
        calls = calls[len(calls) if recorder.first_state is None else recorder.first_state:]
    return tuple(ProbeCall(g, e, e // H - 1, held) for g, e, held in calls)


class _TraceProbe(RecordingProbe):
    """:func:`lookup_trace`'s recorder: also notes where :func:`lookup_hit`'s walk over a tier that answered
    HIT_PENDING or RETRY (the keys asked through :meth:`kvgeom.probes.Probe.state`) begins."""

    __slots__ = ("first_state",)

    def __init__(self, inner: Probe) -> None:
        super().__init__(inner)
        self.first_state: int | None = None

    def state(self, group: int, end_token: int) -> str:
        if self.first_state is None:
            self.first_state = len(self.calls)
        return super().state(group, end_token)


class _Order:
    """What a lookup reads from the geometry, computed once per geometry (slots: read on every lookup)."""

    __slots__ = ("Cm", "H", "L", "first_chunk", "full", "groups_top", "off", "partial_tail_span", "windowed")

    def __init__(self, off: OffloadGeometry, L: int, H: int, Cm: int | None, full: tuple[OffloadGroupGeometry, ...],
                 windowed: tuple[OffloadGroupGeometry, ...], partial_tail_span: int, first_chunk: int,
                 groups_top: int) -> None:
        self.off, self.L, self.H, self.Cm, self.full = off, L, H, Cm, full
        self.windowed = windowed
        """Windowed groups by decreasing window, stable: vLLM's ``_lookup_groups`` order after the full ones."""
        self.partial_tail_span = partial_tail_span
        """The common span when partial tails are supported, else 0."""
        self.first_chunk = first_chunk
        """The chunk of the first group looked up: a candidate less than this past the local prefix is no hit."""
        self.groups_top = groups_top
        """One past the highest offloaded group index (how many entries per-group offload keys need)."""


_ORDERS: dict[int, tuple[Geometry, _Order]] = {}


def _order(geom: Geometry) -> _Order:
    """The geometry's :class:`_Order` (cached by identity; a geometry is immutable)."""
    cached = _ORDERS.get(id(geom))
    if cached is not None and cached[0] is geom:
        return cached[1]
    off = _offload(geom)
    windowed = [og for og in off.groups if og.window_chunks is not None]
    windowed.sort(key=lambda og: -(og.window_chunks or 0))
    full = [og for og in off.groups if og.window_chunks is None]
    order = _Order(
        off, geom.scheduler_block_size, geom.hash_block_size, off.mamba_align_size, tuple(full), tuple(windowed),
        off.groups[0].tokens_per_block if off.supports_partial_tail else 0,
        (full[0] if full else windowed[0]).tokens_per_chunk, max(og.index for og in off.groups) + 1,
    )
    if len(_ORDERS) >= 256:
        _ORDERS.clear()
    _ORDERS[id(geom)] = (geom, order)
    return order


def _partial_tail(
    geom: Geometry, order: _Order, probe: Probe, n: int, prompt: int, c: int, done: int, limit: int,
    reach: Mapping[int, int],
) -> Hit | None:
    """The partial-tail hit past the complete chunks ending at ``done`` (up to ``limit``, the candidate
    before the alignment), or None; only for a geometry with partial tails. ``reach``: per full-attention
    group, the chunk its complete-chunk prefix scan stopped at (:func:`_complete`)."""
    H = order.H
    span = order.partial_tail_span
    contains = probe.contains
    groups = order.off.groups
    b = partial_tail_max_boundary(geom, n, prompt, done, limit)
    # a tail past the next block also loads that block's chunk: it must be stored (_bridge_groups)
    bridged = _bridge_groups(geom, order, done, reach)
    if b >= done + span and not all(contains(og.index, done + span) for og in bridged):
        b = done + span - H
    while b > done:
        if all(contains(og.index, partial_tail_key(og, b)) for og in groups):
            return _hit(b, c, True)
        b -= H
    return None


def _bridge_groups(
    geom: Geometry, order: _Order, done: int, reach: Mapping[int, int]
) -> Iterator[OffloadGroupGeometry]:
    """The groups asked for a partial tail's bridge chunk (the chunk of the block after ``done``, index
    ``done // span``: one block per chunk), which a tail past that block also loads: every offloaded group but
    the align Mamba ones, except a full-attention group whose complete-chunk prefix scan already confirmed it
    (``reach``, vLLM 0.33's ``lookup_hit_end_chunk_idx``, past the bridge; an eagle group's popped chunk
    included). A group not scanned, or a windowed one, is asked. The one rule of both walks, settled
    (:func:`_partial_tail`) and over pending answers (:func:`_lookup_unsettled`)."""
    bridge = done // order.partial_tail_span
    for og in order.off.groups:
        if not geom.groups[og.index].is_align_mamba and reach.get(og.index, 0) <= bridge:
            yield og


#: "No hit past c", by c, and every other Hit handed out, by (end, c) (complete chunks) or (end, c, True)
#: (a partial tail): a Hit is immutable, so a lookup hands back a shared one instead of building a frozen
#: dataclass per call (which costs more than a whole short lookup).
_NO_HIT: dict[int, Hit] = {}
_HITS: dict[tuple[int, int] | tuple[int, int, bool], Hit] = {}


def _no_hit(c: int) -> Hit:
    """The shared "no hit past ``c``" :class:`Hit`."""
    hit = _NO_HIT.get(c)
    if hit is None:
        if len(_NO_HIT) >= 1024:
            _NO_HIT.clear()
        hit = _NO_HIT[c] = Hit(0, c, c, False)
    return hit


def _hit(end: int, c: int, partial_tail: bool) -> Hit:
    """The shared :class:`Hit` ending at ``end`` from the local prefix ``c``."""
    key: tuple[int, int] | tuple[int, int, bool] = (end, c, True) if partial_tail else (end, c)
    hit = _HITS.get(key)
    if hit is None:
        if len(_HITS) >= 4096:
            _HITS.clear()
        hit = _HITS[key] = Hit(end - c, end, c, partial_tail)
    return hit


def _complete(geom: Geometry, order: _Order, probe: Probe, n: int, c: int, M: int, load_capped: bool,
              reach: dict[int, int] | None = None) -> int:
    """Complete-chunk hit end: each group in turn clamps the candidate (re-aligned to the Mamba chunk
    after every clamp, kvgeom's difference from vLLM), then scans its keys; windowed groups repeat
    until a pass in which no group but the first lowers the candidate (the first one, by its own run end
    alone). A candidate less than one chunk past ``c`` is no hit. ``reach`` (when given) receives, per
    full-attention group scanned, the chunk its prefix scan stopped at (vLLM 0.33's
    ``lookup_hit_end_chunk_idx``: one past the last held chunk asked, an eagle group's popped one included)."""
    Cm = order.Cm
    keyed = n // order.H
    verified: set[int] = set()  # eagle groups that popped their volatile chunk at the current candidate
    m = M
    for og in order.full:
        before = m
        found = _group_end(geom, probe, og, c, _clamp(og, m, keyed, load_capped, Cm), keyed, verified, reach)
        if found is None:
            return c
        m = _align_to_mamba_chunk(found, Cm)
        if m - c < og.tokens_per_chunk:
            return c
        if verified and _pops_again(og, m, before, found):
            verified.clear()
    windowed = order.windowed
    # Every windowed group is asked again in every pass, one that found its run at the current candidate
    # too, as vLLM 0.33 asks it (its keys are asked again: lookup_trace lists them twice).
    while windowed:
        changed = False
        for og in windowed:
            before = m
            found = _group_end(geom, probe, og, c, _clamp(og, m, keyed, load_capped, Cm), keyed, verified)
            if found is None:
                return c
            m = _align_to_mamba_chunk(found, Cm)
            if m - c < og.tokens_per_chunk:
                return c
            if verified and _pops_again(og, m, before, found):
                verified.clear()
            changed = changed or (m < before and _asks_again(og, windowed[0], m, found, keyed, load_capped, Cm))
        if not changed:
            break
    return m


def _lookup_unsettled(
    geom: Geometry, order: _Order, probe: Probe, n: int, prompt: int, c: int, M: int, limit: int, load_capped: bool,
) -> Hit | None:
    """:func:`lookup_hit` over a tier that answered HIT_PENDING or RETRY, from the same local prefix ``c``,
    candidate ``M`` and cap ``limit``: the same steps, asking :meth:`kvgeom.probes.Probe.state` key by key in
    vLLM 0.33's order; None where vLLM defers."""
    done: int | None = c
    reach: dict[int, int] = {}
    if M - c >= order.first_chunk:
        done = _complete_unsettled(geom, order, probe, n, c, M, load_capped, reach)
    if done is None:
        return None
    span = order.partial_tail_span
    if span:
        H = order.H
        groups = order.off.groups
        pending = False
        b = partial_tail_max_boundary(geom, n, prompt, done, limit)
        bridge = False
        if b >= done + span:  # the tail also loads the next block's chunk: its keys must be stored
            for og in _bridge_groups(geom, order, done, reach):
                s = probe.state(og.index, done + span)
                if s == MISS:
                    b = done + span - H
                    break
                pending |= s != HIT
            bridge = pending
        while b > done:
            tail_pending = bridge and b >= done + span
            missed = False
            for og in groups:
                s = probe.state(og.index, partial_tail_key(og, b))
                if s == MISS:
                    missed = True
                    break
                tail_pending |= s != HIT
            if not missed and not tail_pending:
                return Hit(b - c, b, c, True)
            pending |= tail_pending
            b -= H
        if pending and done == c:
            return None
    return Hit(done - c, done, c, False)


def _complete_unsettled(
    geom: Geometry, order: _Order, probe: Probe, n: int, c: int, M: int, load_capped: bool,
    reach: dict[int, int] | None = None,
) -> int | None:
    """:func:`_complete` with three-valued answers (None: deferred): a group whose scan defers leaves the
    candidate as it is; a group that lowers the candidate clears the deferral and every group is asked again,
    as vLLM 0.33's ``_lookup_complete_chunks``. Without a deferral, which groups are asked again and which eagle
    groups pop again follow :func:`_complete`'s rules, so over HIT and MISS answers both walks ask the same keys
    in the same order (a law, ``tests/property/test_probe_laws.py``; inside the ``realign-after-clamp``
    deviation, where vLLM's keys differ, too). ``reach``
    (when given) receives, per full-attention group, the chunk its last prefix scan confirmed up to (vLLM's
    ``lookup_hit_end_chunk_idx``: the local chunk when the scan deferred)."""
    Cm = order.Cm
    keyed = n // order.H
    everything = (*order.full, *order.windowed)
    verified: set[int] = set()
    deferred = False
    m = M
    first_group = True  # a lowering by the walk's first group (its clamp) clears no deferral: none came before it
    todo: tuple[OffloadGroupGeometry, ...] = everything
    while todo:
        first: OffloadGroupGeometry | None = None  # the pass's first windowed group
        current, todo = todo, ()
        for og in current:
            before = m
            C = og.tokens_per_chunk
            keys = keyed // og.hashes_per_chunk
            m = _clamp(og, m, keyed, load_capped, Cm)
            if m - c < C:
                return c
            pop = int(og.eagle_group and og.index not in verified)
            top = min(cdiv(min(m + C, keys * C) if pop else m, C), keys)
            start = c // C
            if og.window_chunks is None:
                count = _prefix_states(probe, og.index, C, start, top)
                if reach is not None:
                    reach[og.index] = start + (count or 0)
            else:
                g = geom.groups[og.index]
                first_need = _window_need(g, og, min(m, (top - pop) * C)) + pop
                count = _window_states(probe, og.index, C, start, top, og.window_chunks + pop, first_need)
            if count == 0:
                return c
            found = m
            if count is None:
                deferred = True
            else:
                if pop:
                    count -= 1
                    verified.add(og.index)
                found = min(m, C * (start + count))
                m = _align_to_mamba_chunk(found, Cm)
            if m - c < C:
                return c
            # which eagle groups pop again, and when every windowed group is asked again: _complete's rules (the
            # two walks ask the same keys over settled answers, a law), with vLLM 0.33's for a deferral on top: a
            # group that lowers the candidate clears it and every group is asked again
            if verified and _pops_again(og, m, before, found):
                verified.clear()
            if m < before and deferred and not first_group:
                deferred = False
                todo = everything
            first_group = False
            if og.window_chunks is not None:
                if first is None:
                    first = og
                if (m < before and not todo and not deferred
                        and _asks_again(og, first, m, found, keyed, load_capped, Cm)):
                    todo = order.windowed
    return None if deferred else m


def _pops_again(og: OffloadGroupGeometry, m: int, before: int, found: int) -> bool:
    """Whether the eagle groups verified at the candidate pop again after ``og``'s step lowered it from ``before``
    to ``m`` (its run ending at ``found``): another group's lowering, or, for a windowed group, the Mamba
    re-alignment below its own run end (vLLM's Mamba group makes that lowering, and the drafter pops again).
    Both walks (:func:`_complete`, :func:`_complete_unsettled`) read it."""
    return (m < before and not og.eagle_group) or (og.window_chunks is not None and m < found)


def _asks_again(og: OffloadGroupGeometry, first: OffloadGroupGeometry | None, m: int, found: int, keyed: int,
                load_capped: bool, Cm: int | None) -> bool:
    """Whether windowed group ``og``'s lowering of the candidate to ``m`` sends every windowed group round again:
    always, unless ``og`` is the pass's ``first`` windowed group, lowered to exactly its own run end ``found`` and
    at rest there (its clamp, the one home of that rule, leaves ``m`` as it is: under max_load_tokens it rounds
    down to the group's chunk, so a candidate off that grid moves); vLLM 0.33 asks no key again then. Both walks
    read it."""
    return og is not first or m != found or _clamp(og, m, keyed, load_capped, Cm) != m


def _window_need(g: GroupGeometry, og: OffloadGroupGeometry, end: int) -> int:
    """Chunks a windowed group's first run needs for a hit ending at ``end`` (``load_window_size_in_chunks``):
    the positions before ``end`` in chunks, at least the group's window (Mamba: its one key)."""
    if g.window_need is None:
        return 1
    if g.family != "sliding":
        return og.window_chunks or 1
    C = og.tokens_per_chunk
    return max(cdiv(g.window_need + (-end) % C, C), og.window_chunks or 1)


def _prefix_states(probe: Probe, group: int, C: int, start: int, stop: int) -> int | None:
    """Held chunks from ``start`` up to the first miss below ``stop``; None when a pending or retried key
    comes first (``_maximal_prefix_lookup``: the scan goes on past them to let the tier start its lookups)."""
    count = 0
    unsettled = False
    for j in range(start, stop):
        s = probe.state(group, (j + 1) * C)
        if s == MISS:
            break
        if s != RETRY:
            count += 1
        unsettled |= s != HIT
    return None if unsettled else count


def _window_states(probe: Probe, group: int, C: int, start: int, stop: int, window: int, first: int) -> int | None:
    """Right-to-left run search over chunks ``[start, stop)`` (``_sliding_window_lookup``): the end of the
    first run of ``first`` (later runs: ``window``) held chunks, relative to ``start``, or the run that
    reaches ``start``; a RETRY breaks the run and defers; a pending key defers only if it is in the run
    returned, since a miss below it clears it; None when deferred."""
    retried = pending = False
    run = 0
    need = first
    for j in range(stop - 1, start - 1, -1):
        s = probe.state(group, (j + 1) * C)
        if s in (HIT, PENDING):
            run += 1
            pending |= s == PENDING
        else:
            retried |= s == RETRY
            run = 0
            pending = False
            need = window
        if run == need:
            return None if retried or pending else j - start + need
    return None if retried or pending else run


def _clamp(og: OffloadGroupGeometry, m: int, keyed_hashes: int, load_capped: bool, Cm: int | None) -> int:
    """The candidate limited to the group's keyed chunks (and its chunk grid under max_load_tokens), re-aligned."""
    C = og.tokens_per_chunk
    keyed = keyed_hashes // og.hashes_per_chunk * C
    if keyed < m:
        m = keyed
    if load_capped:
        m = rdown(m, C)
    return _align_to_mamba_chunk(m, Cm)


# ------------------------------------------------------------------ the eagle pop
# vLLM 0.33 offloading/scheduler.py::OffloadingConnectorScheduler._lookup_complete_chunks and _lookup.


def eagle_pops(og: OffloadGroupGeometry, verified: set[int]) -> int:
    """1 when an offload lookup of ``og`` must query one extra chunk and then pop it (an eagle group not yet
    verified at the current candidate), else 0; marks the group verified. A non-eagle group that lowers the
    candidate clears ``verified`` (the caller does that), so the eagle group pops again.
    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> verified = set()
    >>> eagle_pops(geom.offload.group(2), verified), eagle_pops(geom.offload.group(2), verified)
    (1, 0)
    """
    if og.eagle_group and og.index not in verified:
        verified.add(og.index)
        return 1
    return 0


def eagle_query_end(og: OffloadGroupGeometry, m: int, keyed_end: int, pop: int) -> int:
    """How far a lookup of ``og`` queries for candidate ``m``: one chunk further when it pops, capped at the
    group's keyed end; ``m`` otherwise.
    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> eagle_query_end(geom.offload.group(2), 64, 96, 1), eagle_query_end(geom.offload.group(2), 64, 96, 0)
    (96, 64)
    """
    return min(m + og.tokens_per_chunk, keyed_end) if pop else m



def _group_end(
    geom: Geometry, probe: Probe, og: OffloadGroupGeometry, c: int, m: int, keyed_hashes: int, verified: set[int],
    reach: dict[int, int] | None = None,
) -> int | None:
    """One group's lookup from a clamped candidate ``m``: the lowered candidate (not yet re-aligned),
    or None when the group cannot serve any hit past ``c``. This is the per-group rule; a rule that
    changes what one group probes (an extra look-ahead chunk, say) changes only this function.

    An eagle group not yet verified at this candidate queries one chunk more and pops it
    (:func:`eagle_pops`, vLLM 0.33 ``_lookup_complete_chunks``). A full-attention group's prefix scan
    writes the chunk it stopped at to ``reach`` (when given)."""
    if m - c < og.tokens_per_chunk:
        return None
    if og.eagle_group and eagle_pops(og, verified):
        return _eagle_group_end(geom, probe, og, c, m, keyed_hashes // og.hashes_per_chunk, reach)
    if og.window_chunks is None:
        C = og.tokens_per_chunk
        j = probe.forward(og.index, C, c // C, m)
        if reach is not None:
            reach[og.index] = j
        end = C * j
        return end if end < m else m
    found = _scan_window(geom.groups[og.index], og, probe, m, c // og.tokens_per_chunk)
    return found if found is None or found < m else m


def _eagle_group_end(geom: Geometry, probe: Probe, og: OffloadGroupGeometry, c: int, m: int, keyed: int,
                     reach: dict[int, int] | None = None) -> int | None:
    """An unverified eagle group: the run of held chunks up to one chunk past ``m`` (capped at the keyed
    chunks), minus the last one. A windowed group scans its chunks right to left, each once, for a run one
    chunk longer than the window and pops its top chunk (:func:`_scan_window` with ``pop``, as vLLM 0.33's
    ``_sliding_window_lookup`` over the widened keys); None when nothing is left after the pop. A
    full-attention group's prefix scan writes the chunk it stopped at to ``reach`` (when given)."""
    C = og.tokens_per_chunk
    query = eagle_query_end(og, m, keyed * C, 1)
    if og.window_chunks is None:
        j = probe.forward(og.index, C, c // C, query)
        if reach is not None:
            reach[og.index] = j
        return None if j == c // C else min(m, C * (j - 1))
    stop = min(cdiv(query, C), keyed)
    found = _scan_window(geom.groups[og.index], og, probe, min(m, (stop - 1) * C), c // C, 1)
    return None if found is None else min(m, found)


def skipped_tokens(geom: Geometry, group: int, end_token: int) -> int:
    """Leading tokens a group does not need for a request resuming at ``end_token`` (`get_num_skipped_tokens`).

    Full attention 0; sliding window ``N - sliding_window + 1 - extra``; chunked
    local ``rdown(N, attention_chunk_size)``; Mamba ``N - 1`` (only the last
    state matters).

    >>> import kvgeom
    >>> skipped_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, 64)
    63
    """
    g = geom.group(group)
    N = nonneg("end_token", end_token)
    need = g.window_need
    match g.family:
        case "sliding" if need is not None:  # GroupGeometry.window_need: sliding_window - 1 + extra
            return max(N - need, 0)
        case "chunked" if need is not None:  # window_need + 1 is the attention chunk
            return rdown(N, need + 1)
        case "mamba":
            return max(N - 1, 0)
        case _:
            return 0


def rswa_gap_blocks(geom: Geometry, group: int, num_prompt_tokens: int, num_computed_tokens: int) -> range:
    """The blocks of a reference sliding-window (``rswa``) group vLLM 0.33 has freed from a decoding request.

    vLLM 0.33's ``RSWAManager.remove_skipped_blocks`` replaces by the null block every block wholly between the
    prompt and the last ``rswa_window`` processed tokens: blocks ``[cdiv(P, S), max(P, T - W) // S)`` for a
    prompt of ``P`` tokens, ``T`` processed tokens, window ``W`` and span ``S``. It frees on every step, so
    the range at ``T`` is every block freed so far. Everything else about the group is full attention (hits,
    keys, stores: nothing of the prompt is ever freed).

    Invariants: the range is empty or starts at ``cdiv(P, S)`` (no block holding a prompt token is freed);
    it ends at or before the block holding token ``T - W`` (the last ``W`` processed tokens stay); it grows
    with ``T``. ``P <= T`` is required; a group of another kind is :class:`kvgeom.QueryError` ``not_rswa``.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...                                {"kind": "rswa", "block_size": 16, "rswa_window": 40}]})
    >>> rswa_gap_blocks(g, 1, 50, 100), rswa_gap_blocks(g, 1, 50, 120), rswa_gap_blocks(g, 1, 50, 160)
    (range(4, 4), range(4, 5), range(4, 7))
    """
    g = geom.group(group)
    W = rswa_window_of(g.spec)
    if W is None:
        raise QueryError.single(
            "not_rswa",
            f"group {group} ({g.kind}) is not a reference sliding-window group; only kind 'rswa' frees decode "
            "blocks this way (a sliding window's dropped tokens are kvgeom.hits.skipped_tokens)",
            "group",
            group=group,
        )
    P = nonneg("num_prompt_tokens", num_prompt_tokens)
    T = nonneg("num_computed_tokens", num_computed_tokens)
    if T < P:
        raise QueryError.single(
            "computed_before_prompt",
            f"num_computed_tokens={T} is less than num_prompt_tokens={P}; vLLM frees R-SWA gap blocks only while "
            "decoding, after the whole prompt is processed: pass T >= P",
            "num_computed_tokens",
            num_computed_tokens=T,
            num_prompt_tokens=P,
        )
    S = g.span
    first = cdiv(P, S)
    return range(first, max(first, max(P, T - W) // S))


def plan_load(geom: Geometry, hit: Hit) -> tuple[GroupLoad, ...]:
    """Per offloaded group, the keys to load and the block entries they fill (`update_state_after_alloc`).

    First entry ``max(cdiv(c, S), skipped(N) // S)``; entries up to
    ``cdiv(N, S)``; keys are chunks ``[first // k, cdiv(N, C))``, the last one
    replaced by the boundary key N for a partial tail. An align Mamba group
    loads exactly the one key ending at N into block ``(N - 1) // B_m``.
    """
    off = _offload(geom)
    c, N = hit.local_computed_tokens, hit.end_token
    out = []
    for og in off.groups:
        g = geom.groups[og.index]
        S, C = og.tokens_per_block, og.tokens_per_chunk
        k = off.blocks_per_chunk
        stop = cdiv(N, S)
        first = max(cdiv(c, S), skipped_tokens(geom, og.index, N) // S)
        if hit.hit_tokens == 0 or first >= stop:
            out.append(GroupLoad(og.index, (), (), 0, None))
            continue
        last = cdiv(N, C) - (1 if hit.partial_tail else 0)
        keys = tuple((j + 1) * C for j in range(first // k, last))
        if hit.partial_tail:
            keys += (partial_tail_key(og, N),)
        state = restore_read_block(geom, og.index, N) if g.is_align_mamba else None
        out.append(GroupLoad(og.index, keys, tuple(range(first, stop)), first % k, state))
    return tuple(out)


def plan_hit(geom: Geometry, scenario: Mapping[str, Any]) -> HitPlan:
    """Lookup and load plan for a scenario dict (the CLI's ``hit`` input).

    ``scenario``: ``num_tokens``, optional ``num_prompt_tokens``,
    ``local_computed_tokens``, ``stored`` (``{"<group>": [end tokens]}``),
    ``max_load_tokens``, ``max_num_new_tokens``; unknown keys are an error. ``groups`` hold only
    the loads the Scheduler runs (:func:`kvgeom.prefix.scheduler_keeps_load`: none when the local
    prefix is not a multiple of L and the hit does not pass it); ``hit_tokens`` is the connector's.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> plan_hit(g, {"num_tokens": 65, "stored": {"0": [32, 64], "1": [16, 32, 48, 64]}}).to_dict()["groups"][1]
    {'index': 1, 'load_keys': [64], 'block_entries': [3], 'state_block': 3}
    """
    check_scenario(scenario, ("num_tokens", "num_prompt_tokens", "local_computed_tokens", "stored", "max_load_tokens",
                              "max_num_new_tokens"))
    stored = scenario.get("stored", {})
    if isinstance(stored, Mapping):
        # the JSON contract checks every end token (lookup_hit reads a set value only where it probes)
        stored = {k: list(v) if isinstance(v, AbstractSet) else v for k, v in stored.items()}
    hit = lookup_hit(
        geom,
        scenario["num_tokens"],
        stored=stored,
        num_prompt_tokens=scenario.get("num_prompt_tokens"),
        local_computed_tokens=scenario.get("local_computed_tokens", 0),
        max_load_tokens=scenario.get("max_load_tokens"),
        max_num_new_tokens=scenario.get("max_num_new_tokens"),
    )
    if not scheduler_keeps_load(scenario.get("local_computed_tokens", 0), geom.scheduler_block_size, hit.hit_tokens):
        return HitPlan(hit, plan_load(geom, Hit(0, hit.local_computed_tokens, hit.local_computed_tokens, False)))
    return HitPlan(hit, plan_load(geom, hit))


@dataclass(frozen=True, slots=True)
class GroupStore:
    """What one group stores this step: chunk indices and their key end tokens, and a partial-tail key."""

    index: int
    chunks: tuple[int, ...]
    end_tokens: tuple[int, ...]
    block_entries: tuple[tuple[int, ...], ...]
    """Positional groups: the entries of each chunk. Align Mamba: the one state block per key."""
    partial_tail: int | None = None
    """End token of the group's partial-tail key (off the chunk grid; read from block-table entry
    ``boundary // span``, the copied state for Mamba), or None (:func:`kvgeom.handoff.partial_tail_boundary`)."""
    next_stored_chunk: int | None = None
    """The chunk the group's next step starts at: ``max(stored_chunks[g], storable chunks)`` (vLLM 0.33
    ``RequestOffloadState.advance_stored_idx``); for an align Mamba group inside the prompt
    ``max(stored_chunks[g], handed // C)``, ``handed`` the tokens whose states the GPU manager has offered
    (:func:`kvgeom.handoff.handed_over_tokens`): its keys are those hand-offs, each offered once. Pass it as
    ``stored_chunks[g]`` when planning the next step: chunks below it that this step did not list were skipped
    for good. None only in a ``GroupStore`` built by hand."""

    @property
    def stored_end_tokens(self) -> tuple[int, ...]:
        """Every key end token this step stores: the chunks' and the partial tail's."""
        return self.end_tokens if self.partial_tail is None else (*self.end_tokens, self.partial_tail)


@dataclass(frozen=True, slots=True)
class StorePlan:
    offloadable_tokens: int
    groups: tuple[GroupStore, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "offloadable_tokens": self.offloadable_tokens,
            "groups": [
                {
                    "index": g.index,
                    "chunks": list(g.chunks),
                    "end_tokens": list(g.end_tokens),
                    "block_entries": [list(e) for e in g.block_entries],
                    "partial_tail": g.partial_tail,
                    "next_stored_chunk": g.next_stored_chunk,
                }
                for g in self.groups
            ],
        }


def store_holdback_chunks(
    geom: Geometry, group: int, storable: int, offloadable_tokens: int, num_prompt_tokens: int, finished: bool
) -> int:
    """Storable chunks of a group after the eagle hold-back: an eagle group's last offloadable chunk is
    volatile while the request decodes and is not stored until it finishes (vLLM 0.33
    ``offloading/scheduler.py::RequestOffloadState.storable_chunks``, issue #52735). Other groups, prefill
    steps and finished requests keep ``storable``.

    Postcondition: ``storable - 1 <= result <= storable`` and ``result >= 0``.

    >>> import kvgeom
    >>> cfg = {"groups": [{"kind": "full_attention", "block_size": 16}, {"kind": "mamba", "block_size": 16},
    ...                   {"kind": "full_attention", "block_size": 16, "num_kv_heads": 4, "drafter": True}],
    ...        "parallel": {"tp": 2, "dcp": 2}, "offload": {},
    ...        "speculative": {"method": "eagle", "num_speculative_tokens": 2}}
    >>> geom = kvgeom.resolve(cfg)
    >>> store_holdback_chunks(geom, 2, 3, 100, 90, False), store_holdback_chunks(geom, 2, 3, 100, 90, True)
    (2, 3)
    """
    off = geom.offload
    if off is None or not off.group(group).eagle_group:
        return storable
    C = off.group(group).tokens_per_chunk
    decoding = offloadable_tokens > num_prompt_tokens
    if decoding and not finished:
        return min(storable, max(0, offloadable_tokens // C - 1))
    return storable



def plan_store(
    geom: Geometry,
    *,
    num_tokens: int,
    num_computed_tokens: int,
    num_prompt_tokens: int | None = None,
    stored_chunks: Mapping[int, int] | None = None,
    allocated_blocks: Mapping[int, int] | None = None,
    reachable: Collection[int] | None = None,
    offload_prompt_only: bool = True,
    max_offload_tokens: int | None = None,
    finished: bool = False,
    chunk_ends: Collection[int] | None = None,
    loaded_from_offload: bool = False,
    partial_tail_stored: bool = False,
) -> StorePlan:
    """Chunks each offloaded group stores after a step (vLLM 0.33 `_build_store_jobs`).

    Offloadable tokens = min(computed, num_tokens, max_offload_tokens, and the
    prompt when ``offload_prompt_only``); a finished request stops at
    ``max(num_prompt, num_tokens - 1)``. Per group the storable chunks are
    ``min(offloadable // C, allocated // k, keyed chunks)``, from
    ``stored_chunks[g]`` (default 0) on, thinned by
    :func:`kvgeom.masks.reachable_block_mask` (a chunk survives if any of its
    blocks is kept). ``reachable`` defaults to the replay boundary
    ``num_prompt - 1``. A sliding-window group's mask is the connector's store
    mask (window widened by ``extra_retained_tokens``; with retention ``None`` the
    tail of the request's last segment, ending where
    :func:`kvgeom.masks.swa_store_horizon` says, and a finished request revisits
    that segment's skipped chunks), as vLLM 0.33's ``_build_store_jobs`` does.

    Postcondition: an align Mamba group stores only keys ending on multiples of
    its chunk ``C_m = B_m * k``, each from state block ``end / B_m - 1`` --
    never ``end / (B_m * dcp) - 1`` (#49962).

    With a drafter (:mod:`kvgeom.speculative`): an eagle group's last offloadable
    chunk is held back while the request decodes and stored once it finishes
    (:func:`store_holdback_chunks`).

    An align Mamba group's keys inside the prompt are the states its GPU manager
    hands the connector (:func:`kvgeom.handoff.mamba_handoffs`): a prefill chunk
    ended there, the prefix is cacheable there, and the store mask keeps the block
    at the replay boundaries (or ``reachable``) or it is the prompt's H-grid
    checkpoint. ``chunk_ends`` are the token counts at which the request's prefill
    chunks ended (:func:`kvgeom.prefill.prefill_chunk_ends`, e.g. with the
    deployment's ``max_num_batched_tokens``); None: vLLM's split with an unbounded
    token budget (:func:`kvgeom.handoff.state_ends`); ``num_computed_tokens`` below
    the prompt is itself a chunk end. Mamba keys past the prompt (decode) follow the
    store mask alone; states written while decoding and handed off then are not
    modelled.

    Partial tails (DCP 1, :func:`kvgeom.handoff.partial_tail_boundary`): once the
    GPU manager has handed over the prompt's sub-block H-grid checkpoint (in the step
    after the one that cached exactly it), every group also stores the key there
    (``GroupStore.partial_tail``); with an eagle proof margin only for a request that
    ``loaded_from_offload``. vLLM 0.33 stores the tail once, in the hand-off step, and
    the Mamba copy it reads lives only then. So a caller that plans step by step passes
    what earlier steps stored: ``stored_chunks`` per group, and ``partial_tail_stored``
    True once a plan listed the tail; the plan of every prefill step (and of the step
    after the request finished) then lists exactly the keys vLLM 0.33 stores in it
    (:func:`plan_store_steps`, vLLM runs; issue 19). One call over the whole prefill
    (``stored_chunks`` None, ``partial_tail_stored`` False) lists every key.

    Size: a group's plan walks its chunks from ``stored_chunks[g]`` to its storable end, and the plan is
    refused (:class:`kvgeom.QueryError` ``result_too_large``) past :data:`kvgeom.masks.MAX_STORE_BLOCKS`
    walked blocks in all. The store masks cover only the walked chunks, so a step with a few chunks left
    is answered however long the request or wide a sliding window's segments. The one wider mask: a
    finished sliding-window group that revisits its last segment (retention ``None``, a final horizon
    other than the prompt's, an alignment that is a multiple of its span, not an EAGLE group) builds its
    masks from that segment's first chunk, each refused past :data:`kvgeom.masks.MAX_SCALAR_RESULT` blocks.

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "cache": {"retention_interval": None}})
    >>> [s.chunks for s in plan_store(g, num_tokens=64, num_computed_tokens=64).groups]  # vLLM run: chunks end 48, 64
    [(0, 1), (2, 3)]
    >>> swa = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "sliding_window", "block_size": 32, "sliding_window": 16}],
    ...     "cache": {"retention_interval": None}, "offload": {}})
    >>> plan_store(swa, num_tokens=200, num_computed_tokens=200).groups[1].end_tokens  # issue 13
    (64, 128, 192)
    """
    off = _offload(geom)
    n = nonneg("num_tokens", num_tokens)
    computed = nonneg("num_computed_tokens", num_computed_tokens)
    offload_prompt_only, finished = flag("offload_prompt_only", offload_prompt_only), flag("finished", finished)
    loaded_from_offload = flag("loaded_from_offload", loaded_from_offload)
    partial_tail_stored = flag("partial_tail_stored", partial_tail_stored)
    stored_chunks = None if stored_chunks is None else mapping("stored_chunks", stored_chunks)
    allocated_blocks = None if allocated_blocks is None else mapping("allocated_blocks", allocated_blocks)
    prompt = n if num_prompt_tokens is None else nonneg("num_prompt_tokens", num_prompt_tokens)
    offloadable = min(computed, n)
    prompt_offloadable = min(prompt, n)
    if max_offload_tokens is not None:
        offloadable = min(offloadable, nonneg("max_offload_tokens", max_offload_tokens))
        prompt_offloadable = min(prompt_offloadable, max_offload_tokens)
    if offload_prompt_only:
        offloadable = min(offloadable, prompt)
    if finished:
        offloadable = min(offloadable, max(prompt, n - 1))
    points = tuple(reachable_points(reachable)) if reachable is not None else ((prompt - 1,) if prompt > 0 else ())
    ends = None if chunk_ends is None else checked_chunk_ends(chunk_ends)
    tail = None if partial_tail_stored else partial_tail_boundary(
        geom, prompt, computed, ends, loaded_from_offload=loaded_from_offload, max_offload_tokens=max_offload_tokens
    )
    out = []
    walked = 0  # blocks visited so far: the plan is refused before a group that would pass MAX_STORE_BLOCKS
    for og in off.groups:
        g = geom.groups[og.index]
        C = og.tokens_per_chunk
        k = off.blocks_per_chunk
        keyed = num_keys(geom, og.index, n)
        storable = store_holdback_chunks(geom, og.index, min(offloadable // C, keyed), offloadable, prompt, finished)
        if allocated_blocks is not None and og.index in allocated_blocks:
            storable = min(storable, nonneg(f"allocated_blocks[{og.index}]", allocated_blocks[og.index]) // k)
        start = nonneg(f"stored_chunks[{og.index}]", (stored_chunks or {}).get(og.index, 0))
        check_result_size(storable - start)
        check_store_size(walked := walked + max(storable - start, 0) * k)
        prompt_chunks = prompt_offloadable // C
        horizon = swa_store_horizon(
            geom, og.index, storable_chunks=storable, prompt_chunks=prompt_chunks, finished=finished
        )
        entries: tuple[tuple[int, ...], ...]
        if g.is_align_mamba:
            # Boundary hand-off: the state after exactly (j+1)*C tokens lives in block (j+1)*C/B_m - 1.
            handed = frozenset(
                mamba_handoffs(geom, og.index, prompt, computed, ends, reachable=reachable, above=start * C,
                               upto=storable * C)
            )
            decode = max(start, prompt // C)  # the first chunk ending past the prompt
            mask = None
            if decode < storable:  # past the prompt: the store mask alone
                mask = reachable_block_mask(geom, og.index, storable * k, first_block=decode * k, reachable=points)
            states = {j: state_block_for_boundary(geom, og.index, (j + 1) * C) for j in range(start, storable)}
            chunks = tuple(
                j for j, b in states.items()
                if ((j + 1) * C in handed) or ((j + 1) * C > prompt and (mask is None or b in mask))
            )
            entries = tuple((states[j],) for j in chunks)
        else:
            revisit = _swa_revisit_start(geom, og, start, storable, prompt_chunks, finished)
            mask = reachable_block_mask(
                geom,
                og.index,
                storable * k,
                first_block=revisit * k,
                reachable=points,
                final_segment_end_block=None if horizon is None else horizon * k,
            )
            chunks = tuple(j for j in range(start, storable) if _chunk_kept(mask, j, k))
            if revisit < start:
                chunks = _swa_revisited_chunks(geom, og, revisit, start, storable, prompt_chunks, points, mask) + chunks
            entries = tuple(tuple(range(j * k, (j + 1) * k)) for j in chunks)
        ptail = None if tail is None else partial_tail_key(og, tail)
        offered = handed_over_tokens(geom, og.index, prompt, computed) if g.is_align_mamba else None
        nxt = max(start, storable if offered is None else offered // C)
        out.append(GroupStore(og.index, chunks, tuple((j + 1) * C for j in chunks), entries, ptail, nxt))
    return StorePlan(offloadable, tuple(out))


MAX_STORE_STEPS = 1 << 10
"""The most prefill steps :func:`plan_store_steps` plans: each step's plan reads every chunk end, so the work grows with
the square of the steps (1,024 steps: about half a second; a 128k-token prompt split by a 256-token budget has 512)."""


def plan_store_steps(
    geom: Geometry,
    *,
    num_prompt_tokens: int,
    chunk_ends: Collection[int] | None = None,
    finished: bool = True,
    loaded_from_offload: bool = False,
    max_offload_tokens: int | None = None,
) -> tuple[StorePlan, ...]:
    """What a connector stores at each step of a prompt's prefill (vLLM 0.33 builds store jobs every step): one
    :func:`plan_store` per chunk end ``e`` (``num_computed_tokens = e``), then, with ``finished``, one for the step
    after the request finished with one sampled token (``num_tokens = prompt + 1``, ``finished=True``). Each step
    passes what the earlier ones stored: ``stored_chunks`` from the last plan's
    :attr:`GroupStore.next_stored_chunk` and ``partial_tail_stored`` once a plan listed the partial tail.

    ``chunk_ends``: the prefill's split (strictly increasing, the last one the prompt; ``bad_chunk_ends``
    otherwise), e.g. :func:`kvgeom.prefill.prefill_chunk_ends` with the deployment's token budget, per step if it
    changes; None: vLLM's split with an unbounded budget (one chunk without an align Mamba group). More than
    :data:`MAX_STORE_STEPS` steps is ``result_too_large``.

    Postcondition (tested against vLLM 0.33 runs step by step): every key is listed in exactly one step, and the
    keys of all steps are those of one :func:`plan_store` over the whole prefill (``num_computed_tokens`` the
    prompt, nothing stored before), the finish step's included.

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 64},
    ...     {"kind": "mamba", "block_size": 64}], "cache": {"prefix_match_unit": 16}, "offload": {},
    ...     "speculative": {"method": "mtp", "num_speculative_tokens": 3, "mtp_modules": 3}})
    >>> steps = plan_store_steps(g, num_prompt_tokens=100, chunk_ends=[64, 80, 82, 100])
    >>> [[gs.stored_end_tokens for gs in p.groups] for p in steps]   # vLLM 0.33 run: the tail at 80 in step 100
    [[(64,), ()], [(), ()], [(), ()], [(80,), (80,)], [(), ()]]
    """
    n = nonneg("num_prompt_tokens", num_prompt_tokens)
    ends = default_chunk_ends(geom, n) if chunk_ends is None else checked_prefill_split(chunk_ends, n)
    if len(ends) > MAX_STORE_STEPS:
        raise QueryError.single(
            "result_too_large",
            f"chunk_ends has {len(ends)} prefill steps; plan_store_steps plans at most {MAX_STORE_STEPS} (each "
            "step reads every chunk end): plan the steps you need with plan_store, passing stored_chunks and "
            "partial_tail_stored",
            "chunk_ends",
            total=len(ends),
            limit=MAX_STORE_STEPS,
        )
    steps = [(n, e, False) for e in ends] + ([(n + 1, n, True)] if flag("finished", finished) else [])
    stored: dict[int, int] = {}
    tail_stored = False
    plans = []
    for num_tokens, computed, done in steps:
        plan = plan_store(
            geom, num_tokens=num_tokens, num_computed_tokens=computed, num_prompt_tokens=n, finished=done,
            chunk_ends=ends, stored_chunks=stored, partial_tail_stored=tail_stored,
            loaded_from_offload=loaded_from_offload, max_offload_tokens=max_offload_tokens,
        )
        plans.append(plan)
        stored = {gs.index: gs.next_stored_chunk for gs in plan.groups if gs.next_stored_chunk is not None}
        tail_stored = tail_stored or any(gs.partial_tail is not None for gs in plan.groups)
    return tuple(plans)


def _chunk_kept(mask: frozenset[int] | None, chunk: int, k: int) -> bool:
    """A positional chunk is stored when any of its ``k`` blocks is in the mask (None: every block)."""
    return mask is None or any(b in mask for b in range(chunk * k, (chunk + 1) * k))


def _swa_revisit_start(
    geom: Geometry, og: OffloadGroupGeometry, start: int, storable: int, prompt_chunks: int, finished: bool
) -> int:
    """The first chunk a finished sliding-window group reconsiders (``start`` when it reconsiders none).

    vLLM 0.33 ``_build_store_jobs`` (``reconsider_final_swa_tail``): when a request finishes with a
    store horizon other than the prompt's (``storable != prompt_chunks``), with ``retention_interval =
    None`` and an alignment that is a multiple of the group's span, the chunks of the request's last
    partial alignment segment are looked at again: a chunk skipped under the prompt's horizon may
    be in the final segment's tail now.
    """
    off = geom.offload
    assert off is not None
    align = off.alignment_tokens
    g = geom.groups[og.index]
    if (
        not finished
        or storable == prompt_chunks
        or geom.config.cache.retention_interval is not None
        or g.family != "sliding"
        or og.eagle_group  # vLLM's _final_swa_alignment_blocks: None for an EAGLE group
        or align is None
        or align % og.tokens_per_block
    ):
        return start
    k = off.blocks_per_chunk
    horizon_blocks = storable * k
    return min(start, (horizon_blocks - horizon_blocks % (align // og.tokens_per_block)) // k)


def _swa_revisited_chunks(
    geom: Geometry,
    og: OffloadGroupGeometry,
    revisit: int,
    start: int,
    storable: int,
    prompt_chunks: int,
    points: tuple[int, ...],
    final_mask: frozenset[int] | None,
) -> tuple[int, ...]:
    """Chunks in ``[revisit, min(start, storable))`` stored now: kept under the final horizon, skipped under the
    prompt's. Capped at ``storable``: no mask holds a block past it (:func:`reachable_block_mask`'s domain), and an
    earlier store may reach far past it (``stored_chunks`` 1.3e17 with 132 storable chunks made this a loop of
    1.3e17 steps; found by the batch-vs-scalar store law under the ``thorough`` profile). The batch twin
    (``kvgeom.batch.hits.plan_stores``) draws its candidates from ``[first, storable)`` the same way."""
    off = geom.offload
    assert off is not None
    k = off.blocks_per_chunk
    prompt_mask = reachable_block_mask(
        geom, og.index, storable * k, first_block=revisit * k, reachable=points,
        final_segment_end_block=prompt_chunks * k,
    )
    if prompt_mask is None:
        return ()
    return tuple(
        j for j in range(revisit, min(start, storable))
        if not _chunk_kept(prompt_mask, j, k) and _chunk_kept(final_mask, j, k)
    )
