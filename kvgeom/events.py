"""Residency from vLLM's KV events: per replica, per group, per medium, O(1) per block.

vLLM publishes what its caches hold as a stream of KV events (vLLM 0.33
``distributed/kv_events.py``): ``BlockStored`` (``block_hashes``, ``parent_block_hash``,
``token_ids``, ``block_size``, ``lora_id``, ``medium``, ``group_idx``, ``kv_cache_spec_kind``,
...), ``BlockRemoved`` (``block_hashes``, ``medium``, ``group_idx``) and ``AllBlocksCleared``,
batched as ``[ts, events, data_parallel_rank]``. KV-aware routers index these events to score
replicas. :class:`KVEventReader` reads them, as the vLLM objects themselves or as the dicts a
msgpack / JSON decoder gives (``{"type": "BlockStored", ...}``), into one
:class:`kvgeom.Residency` per medium with one holder bit per replica (kept as packed holder rows,
:class:`kvgeom.holders.PackedHolders`, until a residency is first asked for), and checks every event
against the geometry first, so a wrong block size or group index is an error, never a silent
misread (routers that fell back to the wrong block size: Dynamo #9376).

What an event means, in kvgeom's words (vLLM 0.33 ``v1/core/block_pool.py``):

* every block hash is the request's chained hash at the hash unit H at the block's *end token*
  (``BlockHashListWithBlockSize`` takes the last H-hash of a block), so the entry of group g
  keyed by hash *i* of a request's chain ends at token ``(i+1)*H``. Block hashes stay opaque:
  kvgeom never recomputes them; the caller hands the request's chain to the router
  (:mod:`kvgeom.router`), in the same encoding the events use (bytes from msgpack, base64
  strings from JSON, ints with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``);
* ``block_size`` is the group's span S for full blocks (``cache_full_blocks`` passes the
  manager's ``block_size``, which is ``spec.block_size * dcp`` for a DCP-sharded group), H for a
  partial-prefix entry (``cache_partial_block``: one hash, ``block_size = H``), and 0 for the
  offloading connector's placeholder stores (``offloading/events.py``: empty ``token_ids``, the
  chunk's key hash); anything else does not fit the geometry and is an error;
* ``medium`` ``None`` is the GPU prefix cache (``BlockPool``'s default medium); case is ignored
  (Mooncake's store worker publishes ``"cpu"``);
* ``group_idx`` ``None`` is only readable when the geometry has a single group.

Invariants (tested in ``tests/test_events.py`` and ``tests/property/test_router_laws.py``):

* each block of an event is one dict operation and one integer bit operation (O(1));
* an event is checked completely before any of it is applied; a batch is checked completely
  before any of its events is applied (a bad batch changes nothing);
* with ``count_duplicates`` (the default) a hash announced k times by one replica on one medium
  stays held until it is removed k times (vLLM caches duplicate blocks under one hash, and the
  offloading connector re-announces shared hashes once per chunk; its docstring asks consumers to
  reference-count);
* replaying a stream gives the same residency as adding the final state from scratch.

>>> import kvgeom
>>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)          # spans (32, 16), H = 16
>>> reader = KVEventReader(g)
>>> reader.apply({"type": "BlockStored", "block_hashes": [b"h1", b"h3"], "parent_block_hash": None,
...               "token_ids": list(range(64)), "block_size": 32, "lora_id": None, "medium": "GPU",
...               "group_idx": 0}, replica=2)
>>> reader.residency("GPU").holders(0, b"h3")            # bit 2: replica 2
4
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain
from types import NoneType
from typing import TYPE_CHECKING, Any

from kvgeom.errors import KVGeomError, Problem
from kvgeom.holders import PackedHolders
from kvgeom.residency import Residency
from kvgeom.specs import (
    ChunkedLocalSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlySpec,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    MambaSpec,
    MLASpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformSpec,
)

if TYPE_CHECKING:
    from kvgeom.geometry import Geometry, GroupGeometry

__all__ = ["KVEventError", "KVEventReader", "MEDIA", "EVENT_TYPES", "vllm_spec_kinds"]

MEDIA: tuple[str, ...] = ("GPU", "CPU", "STORAGE")
"""vLLM 0.33's media (``MEDIUM_GPU``, ``MEDIUM_CPU``, ``MEDIUM_STORAGE`` in ``kv_events.py``)."""

EVENT_TYPES: tuple[str, ...] = ("BlockStored", "BlockRemoved", "AllBlocksCleared")

_UNKNOWN_KIND = "unknown"
_HASH_TYPES = frozenset({bytes, int, str})


class KVEventError(KVGeomError):
    """A KV event that cannot be read against the geometry: an unknown event type or medium, a group
    index outside the geometry, a block size that is not the group's span (nor H for a partial
    entry), a malformed field. ``field`` names the event field (``events[3].block_size`` inside a
    batch)."""


def vllm_spec_kinds(group: GroupGeometry) -> frozenset[str]:
    """The ``kv_cache_spec_kind`` values vLLM 0.33 may put on a store event of ``group``
    (``kv_cache_interface.py::get_kv_cache_spec_kind``; ``"unknown"`` is always accepted).

    >>> import kvgeom
    >>> sorted(vllm_spec_kinds(kvgeom.resolve(kvgeom.DEFAULT_CONFIG).groups[1]))
    ['mamba', 'unknown']
    """
    kinds = {_UNKNOWN_KIND}
    spec = group.spec
    if isinstance(spec, UniformSpec):
        inner = {_leaf_kind(leaf) for leaf in spec.layers}
        if len(inner) == 1:
            kinds |= inner
        elif all(_leaf_kind(leaf) in ("full_attention", "mla_attention", "sink_full_attention")
                 for leaf in spec.layers):
            kinds.add("full_attention")
    else:
        kinds.add(_leaf_kind(spec))
    return frozenset(kinds)


def _leaf_kind(spec: Any) -> str:
    match spec:
        case SlidingWindowMLASpec():
            return "sliding_window_mla"
        case MLASpec():
            return "mla_attention"
        case SinkFullAttentionSpec():
            return "sink_full_attention"
        case FullAttentionSpec() | RSWASpec():  # vLLM 0.33: RSWASpec is a FullAttentionSpec
            return "full_attention"
        case ChunkedLocalSpec():
            return "chunked_local_attention"
        case SlidingWindowSpec():
            return "sliding_window"
        case MambaSpec():
            return "mamba"
        case CrossAttentionSpec():
            return "cross_attention"
        case EncoderOnlySpec():
            return "encoder_only_attention"
        case CircularBufferSpec() | HiSparseHotSpec() | HiSparseResidentSpec():
            return _UNKNOWN_KIND
        case _:  # pragma: no cover - every leaf kind is listed above
            raise TypeError(f"unhandled spec {type(spec).__name__}")


def _get(event: Any, name: str, default: Any = None) -> Any:
    if isinstance(event, Mapping):
        return event.get(name, default)
    return getattr(event, name, default)


def _event_type(event: Any) -> str | None:
    if isinstance(event, Mapping):
        t = event.get("type")
        return t if t in EVENT_TYPES else None
    name = type(event).__name__
    return name if name in EVENT_TYPES else None


# A checked event: ("stored" | "removed", medium, group, hashes) or ("cleared",).
_Op = tuple[Any, ...]


class KVEventReader:
    """Per replica, per group, per medium residency maintained from vLLM KV events.

    ``geom`` is the geometry the publishing engines run (the same on every replica). ``media`` are
    the media accepted (an event with another medium is an error); ``cleared_media`` are the media
    an ``AllBlocksCleared`` empties for its replica (vLLM 0.33 publishes it from the GPU
    ``BlockPool.reset_prefix_cache``, so by default only the GPU); ``count_duplicates`` keeps a
    count per (replica, medium, group, hash) so duplicate announcements need as many removals
    (set it False for streams that re-announce reused blocks, ``kv_cache_report_mode="full"``,
    which are never removed twice).

    Replicas are holder bits: pass an int (``replica=3``) or give each publisher a stable index with
    :meth:`replica`.
    """

    __slots__ = (
        "_cleared",
        "_count",
        "_dirty",
        "_events",
        "_extra",
        "_fast_groups",
        "_fast_media",
        "_geom",
        "_hash_types",
        "_kinds",
        "_live",
        "_media",
        "_names",
        "_packed",
        "_pending",
        "_res",
        "_spans",
        "_synced",
        "_windows",
    )

    def __init__(
        self,
        geom: Geometry,
        *,
        media: Sequence[str] = MEDIA,
        cleared_media: Sequence[str] = ("GPU",),
        count_duplicates: bool = True,
    ) -> None:
        self._geom = geom
        problems: list[Problem] = []
        names = [m.upper() if isinstance(m, str) else m for m in media]
        for i, m in enumerate(names):
            if not isinstance(m, str) or not m:
                problems.append(Problem("bad_medium", f"a medium is a non-empty string such as 'GPU', got {m!r}",
                                        f"media[{i}]", {"medium": m}))
        self._media: tuple[str, ...] = tuple(dict.fromkeys(n for n in names if isinstance(n, str)))
        cleared = [m.upper() if isinstance(m, str) else m for m in cleared_media]
        for i, m in enumerate(cleared):
            if m not in self._media:
                problems.append(Problem(
                    "unknown_medium", f"cleared medium {m!r} is not one of the reader's media {list(self._media)}; "
                    "add it to media or drop it from cleared_media", f"cleared_media[{i}]", {"medium": m}))
        if problems:
            raise KVEventError(problems)
        self._cleared: tuple[str, ...] = tuple(dict.fromkeys(cleared))
        self._count = bool(count_duplicates)
        # One index while nobody asks for a Residency: the packed rows are the truth (one dict read per run of
        # consecutive rows and a few numpy calls per event). The first residency() / residencies() call builds
        # the residencies from them (O(entries held), once) and from then on both are kept current ("live"), the
        # rows from the residency through the notes below, as packed() describes.
        self._live = False
        self._res: dict[str, Residency] = {}
        self._packed: dict[str, PackedHolders] = {m: PackedHolders() for m in self._media}
        self._synced: dict[str, int] = {}
        # per medium, the events since the last packed(): (group, hashes, replica) of a store, whose bit is set
        # in those rows, or (group, hashes, -1) of a removal, whose rows are rewritten from the residency
        self._dirty: dict[str, list[tuple[int, tuple[Hashable, ...], int]]] = {}
        self._pending = 0  # hashes named in _dirty
        self._extra: dict[tuple[str, int, Hashable, int], int] = {}
        self._names: dict[Hashable, int] = {}
        self._spans = tuple(g.span for g in geom.groups)
        self._kinds = tuple(vllm_spec_kinds(g) for g in geom.groups)
        self._windows = tuple(
            g.gpu_window_need + 1 if g.family == "sliding" and g.gpu_window_need is not None else None
            for g in geom.groups
        )
        self._events = 0
        self._hash_types: set[type] = set()
        # what _accept reads: the exact medium strings and group indices the full check accepts as they are
        self._fast_media: dict[str | None, str] = {m: m for m in self._media}
        self._fast_media.update({m.lower(): m for m in self._media if m.lower().upper() == m})
        if "GPU" in self._media:
            self._fast_media[None] = "GPU"
        self._fast_groups: dict[int | None, int] = {
            g.index: g.index for g in geom.groups if g.prefix_cacheable}
        if len(geom.groups) == 1 and geom.groups[0].prefix_cacheable:
            self._fast_groups[None] = 0

    # -- what the reader holds ------------------------------------------------------------------------
    @property
    def geometry(self) -> Geometry:
        return self._geom

    @property
    def media(self) -> tuple[str, ...]:
        return self._media

    @property
    def num_events(self) -> int:
        """Events applied so far (an ``AllBlocksCleared`` counts as one)."""
        return self._events

    def residency(self, medium: str = "GPU") -> Residency:
        """The live :class:`~kvgeom.Residency` of ``medium`` (holder bit r = replica r). Not a copy.

        Until the first call (of this or :meth:`residencies`) the reader keeps one index, the packed rows of
        :meth:`packed`; that call builds every medium's residency from them (O(entries held), once), and
        from then on every event updates both."""
        key = medium.upper() if isinstance(medium, str) else medium
        if key not in self._packed:
            raise KVEventError.single(
                "unknown_medium", f"medium {medium!r} is not one of the reader's media {list(self._media)}",
                "medium", medium=medium)
        if not self._live:
            self._go_live()
        return self._res[key]

    def residencies(self) -> dict[str, Residency]:
        """Every medium's live residency, in the order of ``media`` (built on the first call, as
        :meth:`residency` says)."""
        if not self._live:
            self._go_live()
        return dict(self._res)

    def _go_live(self) -> None:
        """Build every medium's residency from its packed rows; from now on both are kept current."""
        for m in self._media:
            res = Residency()
            p = self._packed[m]
            for group in p.groups():
                hashes, masks = p.held_masks(group)
                if hashes:
                    res.add_masks(group, hashes, masks)
            self._res[m] = res
            self._synced[m] = res.version
            self._dirty[m] = []
        self._live = True

    def packed(self, medium: str = "GPU") -> PackedHolders:
        """``medium``'s residency as :class:`~kvgeom.holders.PackedHolders` (packed uint64 holder rows), the
        form :func:`kvgeom.router.score_replicas` scores attention from. Until a residency is asked for
        (:meth:`residency`), these rows are the reader's only index: every event updates them directly (one
        dict read per run of consecutive rows and a fixed number of numpy calls per event). Afterwards they are
        kept current from the residency: each event the reader applies notes its hashes (O(1) per event); the
        next call sets the bits of every noted store in one batch (one numpy pass, however many events) and
        rewrites the rows a removal named from the residency, once per distinct hash (also when the notes reach
        four times the size of the index, so they never outgrow it); rebuilt if the residency was changed
        behind the reader's back. Not a copy.

        >>> import kvgeom
        >>> reader = KVEventReader(kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16}]}))
        >>> reader.apply({"type": "BlockStored", "block_hashes": [7, 8], "block_size": 16}, replica=1)
        >>> reader.packed().rows(0, [8, 9]).tolist()
        [[2], [0]]
        """
        key = medium.upper() if isinstance(medium, str) else medium
        p = self._packed.get(key)
        if p is None:
            raise KVEventError.single(
                "unknown_medium", f"medium {medium!r} is not one of the reader's media {list(self._media)}",
                "medium", medium=medium)
        if not self._live:
            return p
        res = self._res[key]
        if self._synced[key] != res.version:
            p = self._packed[key] = PackedHolders.from_residency(res)
            self._synced[key] = res.version
            self._dirty[key] = []
        elif self._dirty[key]:
            self._refresh(key)
        return p

    def _refresh(self, medium: str) -> None:
        """Bring the packed rows of every hash named by an event since the last refresh to the residency's
        holders: one row write per distinct hash, however many events named it."""
        dirty, self._dirty[medium] = self._dirty[medium], []
        self._pending -= sum(len(h) for _, h, _r in dirty)
        res, p = self._res[medium], self._packed[medium]
        # stores first, as one batch (their bits are set whatever came before); then every hash a removal named
        # is rewritten from the residency, which is the truth after all of them (so the order within is moot)
        p.add_events([e for e in dirty if e[2] >= 0])
        by_group: dict[int, list[tuple[Hashable, ...]]] = {}
        for group, hashes, r in dirty:
            if r < 0:
                by_group.setdefault(group, []).append(hashes)
        for group, lists in by_group.items():
            distinct = list(dict.fromkeys(chain.from_iterable(lists)))
            p.set_rows(group, distinct, res.chain_masks(group, distinct))

    def replica(self, name: Hashable) -> int:
        """A stable holder index for publisher ``name`` (an endpoint, ``(endpoint, dp_rank)``, ...):
        the first name seen gets 0, the next 1, and so on.

        >>> import kvgeom
        >>> r = KVEventReader(kvgeom.resolve(kvgeom.DEFAULT_CONFIG))
        >>> r.replica("pod-a"), r.replica("pod-b"), r.replica("pod-a")
        (0, 1, 0)
        """
        index = self._names.get(name)
        if index is None:
            index = self._names[name] = len(self._names)
        return index

    @property
    def hash_types(self) -> frozenset[type]:
        """The Python types of the block hashes read so far (bytes from msgpack, str from JSON, int)."""
        return frozenset(self._hash_types)

    @property
    def replica_names(self) -> tuple[Hashable, ...]:
        """Names given to :meth:`replica`, by index."""
        return tuple(self._names)

    # -- reading events ------------------------------------------------------------------------------
    def apply(self, event: Any, replica: int = 0) -> None:
        """Check one event (a vLLM event object or its decoded dict) against the geometry, then apply
        it to ``replica``'s residency. Raises :class:`KVEventError` (nothing applied) on a bad event."""
        r = replica if type(replica) is int and replica >= 0 else self._replica(replica)
        op = self._check(event, "")
        if self._live:
            self._run(op, r)
        else:  # the one-index path, called directly (a reader's hottest loop)
            self._events += 1
            self._run_packed(op, r)

    def apply_batch(self, batch: Any, replica: int = 0) -> int:
        """Apply an event batch from ``replica``: a vLLM ``KVEventBatch``, its decoded form
        ``[ts, events]`` / ``[ts, events, data_parallel_rank]`` (``array_like``), a dict with an
        ``"events"`` list, or a plain list of events. Every event is checked before any is applied.
        Returns the number of events applied."""
        r = self._replica(replica)
        events = self._batch_events(batch)
        ops = [self._check(e, f"events[{i}].") for i, e in enumerate(events)]
        for op in ops:
            self._run(op, r)
        return len(ops)

    def apply_stream(self, items: Iterable[tuple[int, Any]]) -> int:
        """Apply ``(replica, batch)`` pairs in order; returns the number of events applied."""
        return sum(self.apply_batch(batch, replica) for replica, batch in items)

    # -- internals -----------------------------------------------------------------------------------
    def _replica(self, replica: Any) -> int:
        if type(replica) is not int or replica < 0:
            raise KVEventError.single(
                "bad_replica", f"a replica is a non-negative int (a holder bit), got {replica!r}; use "
                "reader.replica(name) to number publishers", "replica", replica=replica)
        return replica

    @staticmethod
    def _batch_events(batch: Any) -> list[Any]:
        if isinstance(batch, Mapping):
            events = batch.get("events")
        elif isinstance(batch, list | tuple) and len(batch) in (2, 3) and isinstance(batch[1], list | tuple) \
                and isinstance(batch[0], int | float) and not isinstance(batch[0], bool):
            events = batch[1]
        elif isinstance(batch, list | tuple):
            events = batch
        else:
            events = getattr(batch, "events", None)
        if not isinstance(events, list | tuple):
            raise KVEventError.single(
                "bad_batch", f"an event batch is a KVEventBatch, [ts, events, dp_rank], {{'events': [...]}} or a list "
                f"of events; got {type(batch).__name__}", "events")
        return list(events)

    def _check(self, event: Any, where: str) -> _Op:
        if type(event) is dict:
            op = self._accept(event)
            if op is not None:
                return op
        kind = _event_type(event)
        if kind is None:
            shown = event.get("type") if isinstance(event, Mapping) else type(event).__name__
            raise KVEventError.single(
                "unknown_event_type", f"event type {shown!r} is not one of {list(EVENT_TYPES)} (a decoded event "
                "is a dict with a 'type' tag, as msgspec encodes vLLM's tagged KVCacheEvent)",
                f"{where}type", type=shown)
        if kind == "AllBlocksCleared":
            return ("cleared",)
        problems: list[Problem] = []
        medium = self._medium(_get(event, "medium"), where, problems)
        group = self._group(_get(event, "group_idx"), where, problems)
        hashes = self._hashes(_get(event, "block_hashes", _MISSING), where, problems)
        if kind == "BlockStored" and group is not None:
            self._check_stored(event, group, medium, hashes, where, problems)
        if problems or medium is None or group is None or hashes is None:
            raise KVEventError(problems)  # every None above appended its problem
        return ("stored" if kind == "BlockStored" else "removed", medium, group, hashes)

    def _accept(self, event: dict[str, Any]) -> _Op | None:
        """The common decoded event, accepted with a few dict reads: a ``BlockRemoved``, or a ``BlockStored`` of
        full blocks (``block_size`` = the group's span), with a known medium and group and plain hashes.
        Returns the op :meth:`_check` would, or None for anything else (the full check then accepts it, or
        names every problem): nothing is accepted here that the full check refuses."""
        kind = event.get("type")
        if kind != "BlockStored" and kind != "BlockRemoved":
            return None
        medium = self._fast_media.get(event.get("medium")) if type(event.get("medium")) in (str, NoneType) \
            else None
        group = event.get("group_idx")
        if medium is None or (group is not None and type(group) is not int):
            return None
        group = self._fast_groups.get(group)
        hashes = event.get("block_hashes", _MISSING)
        if group is None or type(hashes) not in (list, tuple) or not set(map(type, hashes)) <= _HASH_TYPES:
            return None
        if kind == "BlockRemoved":
            return ("removed", medium, group, tuple(hashes))
        S = self._spans[group]
        size = event.get("block_size", _MISSING)
        if type(size) is not int or size != S:
            return None
        tokens = event.get("token_ids")
        if tokens is not None and (type(tokens) not in (list, tuple) or (
                tokens and (len(tokens) % S or len(tokens) < len(hashes) * S))):
            return None
        spec_kind = event.get("kv_cache_spec_kind")
        window = event.get("kv_cache_spec_sliding_window")
        if (spec_kind is not None and (type(spec_kind) is not str or spec_kind not in self._kinds[group])) or (
                window is not None and window != self._windows[group]):
            return None
        return ("stored", medium, group, tuple(hashes))

    def _medium(self, value: Any, where: str, problems: list[Problem]) -> str | None:
        if value is None:
            value = "GPU"
        if not isinstance(value, str) or value.upper() not in self._packed:
            problems.append(Problem(
                "unknown_medium", f"medium {value!r} is not one of {list(self._media)}; pass media=(...) to the "
                "reader to accept it (None means the GPU prefix cache)", f"{where}medium", {"medium": value}))
            return None
        return value.upper()

    def _group(self, value: Any, where: str, problems: list[Problem]) -> int | None:
        n = len(self._spans)
        if value is None:
            if n == 1:
                return 0
            problems.append(Problem(
                "missing_group_idx", f"the event has no group_idx but the geometry has {n} groups; a publisher older "
                "than per-group events cannot be read for a hybrid model (upgrade vLLM)", f"{where}group_idx",
                {"num_groups": n}))
            return None
        if type(value) is not int or not 0 <= value < n:
            problems.append(Problem(
                "group_out_of_range", f"group_idx {value!r} is outside the geometry's groups 0..{n - 1}; resolve the "
                "geometry the publishing engine runs (same groups, same order)", f"{where}group_idx",
                {"group_idx": value, "num_groups": n}))
            return None
        if not self._geom.groups[value].prefix_cacheable:
            problems.append(Problem(
                "group_not_cacheable", f"group {value} ({self._geom.groups[value].kind}) does not take part in prefix "
                "caching in this geometry, yet the engine published blocks for it; the geometry does not match the "
                "engine", f"{where}group_idx", {"group_idx": value}))
            return None
        return value

    @staticmethod
    def _hashes(value: Any, where: str, problems: list[Problem]) -> tuple[Hashable, ...] | None:
        if not isinstance(value, list | tuple):
            problems.append(Problem(
                "bad_block_hashes", f"block_hashes must be a list of hashes, got "
                f"{'nothing' if value is _MISSING else type(value).__name__}", f"{where}block_hashes"))
            return None
        if set(map(type, value)) <= _HASH_TYPES:  # the common case, checked in C: nothing to convert
            return tuple(value)
        out: list[Hashable] = []
        for i, h in enumerate(value):
            if isinstance(h, bytearray | memoryview):
                h = bytes(h)
            if not isinstance(h, bytes | int | str) or isinstance(h, bool):
                problems.append(Problem(
                    "bad_block_hash", f"a block hash is bytes, an int or a string, got {type(h).__name__}",
                    f"{where}block_hashes[{i}]"))
                return None
            out.append(h)
        return tuple(out)

    def _check_stored(self, event: Any, group: int, medium: str | None, hashes: tuple[Hashable, ...] | None,
                      where: str, problems: list[Problem]) -> None:
        g = self._geom.groups[group]
        S = self._spans[group]
        H = self._geom.hash_block_size
        size = _get(event, "block_size", _MISSING)
        tokens = _get(event, "token_ids", None)
        n_tokens = len(tokens) if isinstance(tokens, list | tuple) else None
        if tokens is not None and n_tokens is None:
            problems.append(Problem("bad_token_ids", f"token_ids must be a list, got {type(tokens).__name__}",
                                    f"{where}token_ids"))
        if type(size) is not int or size < 0:
            problems.append(Problem(
                "bad_block_size", f"block_size must be a non-negative int, got {size!r}", f"{where}block_size",
                {"block_size": size}))
            return
        n_hashes = len(hashes) if hashes is not None else 0
        full = size == S
        partial = size == H and H < S and n_hashes == 1
        placeholder = size == 0 and not n_tokens and medium is not None and medium != "GPU"
        if not (full or partial or placeholder):
            hints = []
            if size == H and n_hashes != 1 and H < S:
                hints.append(f" a partial-prefix entry (block_size=H={H}) carries exactly one hash, this event "
                             f"{n_hashes};")
            if size == g.block_size and g.block_size != S:
                hints.append(
                    f" {size} is the per-rank block size; group {group} is DCP-sharded, so one block id stands for "
                    f"block_size*kv_shards={S} tokens and its hashes are the chain hashes every {S} tokens (vLLM "
                    "0.33's emit_cached_block_events reports the per-rank size for reused blocks: publish with "
                    "kv_cache_report_mode='incremental');")
            hint = "".join(hints).rstrip(";")
            fix = ("resolve kvgeom's geometry from the engine's resolved block sizes and parallel sizes "
                   "(kvgeom.adapters.vllm) so spans match")
            placeholder_note = " nor 0 (an offload placeholder)" if medium != "GPU" else ""
            problems.append(Problem(
                "block_size_mismatch",
                f"block_size={size} of a BlockStored for group {group} ({g.kind}) is neither the group's span "
                f"S={S} (full blocks) nor H={H} with one hash (a partial-prefix entry){placeholder_note};"
                f"{hint or ' reading it would key the blocks at the wrong end tokens'}; {fix}",
                f"{where}block_size",
                {"block_size": size, "span": S, "hash_block_size": H, "group_idx": group}))
            return
        if size and n_tokens and n_tokens % size:
            problems.append(Problem(
                "token_ids_mismatch", f"{n_tokens} token_ids is not a multiple of block_size={size}; each stored block "
                "covers block_size tokens", f"{where}token_ids", {"num_token_ids": n_tokens, "block_size": size}))
        elif size and n_tokens and n_tokens < n_hashes * size:
            problems.append(Problem(
                "token_ids_mismatch", f"{n_tokens} token_ids cannot cover {n_hashes} blocks of {size} tokens",
                f"{where}token_ids", {"num_token_ids": n_tokens, "block_size": size, "num_hashes": n_hashes}))
        spec_kind = _get(event, "kv_cache_spec_kind")
        if spec_kind is not None and (not isinstance(spec_kind, str) or spec_kind not in self._kinds[group]):
            problems.append(Problem(
                "spec_kind_mismatch", f"kv_cache_spec_kind {spec_kind!r} does not match group {group} ({g.kind}), "
                f"which vLLM reports as {sorted(self._kinds[group] - {_UNKNOWN_KIND})}; the geometry's group order "
                "or kinds differ from the engine's", f"{where}kv_cache_spec_kind",
                {"kv_cache_spec_kind": spec_kind, "group_idx": group}))
        window = _get(event, "kv_cache_spec_sliding_window")
        if window is not None and window != self._windows[group]:
            problems.append(Problem(
                "sliding_window_mismatch", f"kv_cache_spec_sliding_window={window!r} but group {group} has "
                f"sliding_window={self._windows[group]}; the geometry does not match the engine",
                f"{where}kv_cache_spec_sliding_window", {"sliding_window": window, "group_idx": group}))

    def _run(self, op: _Op, replica: int) -> None:
        self._events += 1
        packed = self._packed
        if not self._live:
            self._run_packed(op, replica)
            return
        if op[0] == "cleared":
            for m in self._cleared:
                self._res[m].clear(replica)
                if m in packed:  # the notes first (a store noted before the clear must not outlive it)
                    if self._dirty[m]:
                        self._refresh(m)
                    packed[m].clear(replica)
                    self._synced[m] = self._res[m].version
            self._forget_duplicates(replica)
            return
        _, medium, group, hashes = op
        if not hashes:
            return
        self._hash_types.add(type(hashes[0]))
        res = self._res[medium]
        extra = self._extra
        twin = packed[medium]
        if op[0] == "stored":  # one call for the event's blocks; a hash held already is a duplicate
            self._note_duplicates(medium, group, res.add_hashes(group, hashes, replica), replica)
        else:
            gone = self._count_down(medium, group, hashes, replica) if extra else hashes
            res.discard_hashes(group, gone, replica)
            hashes = tuple(gone)
        if twin is not None:  # the packed rows catch up on the next packed() call, all events at once
            self._dirty[medium].append((group, hashes, replica if op[0] == "stored" else -1))
            self._pending += len(hashes)
            self._synced[medium] = res.version
            # notes never outgrow the index they describe (len(res) is a sum over groups: only read past 2**20)
            if self._pending > 1 << 20 and self._pending > 4 * len(res) + (1 << 20):
                for m in self._packed:
                    if self._dirty[m]:
                        self._refresh(m)

    def _run_packed(self, op: _Op, replica: int) -> None:
        """:meth:`_run` while the packed rows are the only index (no residency asked for yet)."""
        if op[0] == "cleared":
            for m in self._cleared:
                self._packed[m].clear(replica)
            self._forget_duplicates(replica)
            return
        _, medium, group, hashes = op
        if not hashes:
            return
        self._hash_types.add(type(hashes[0]))
        p = self._packed[medium]
        if op[0] == "stored":  # one call for the event's blocks; a hash held already is a duplicate
            self._note_duplicates(medium, group, p.add_hashes(group, hashes, replica), replica)
            return
        p.discard_many(group, self._count_down(medium, group, hashes, replica) if self._extra else hashes, replica)

    def _forget_duplicates(self, replica: int) -> None:
        """A replica's cleared media forget the duplicate stores counted for it there."""
        if self._extra:
            for key in [k for k in self._extra if k[3] == replica and k[0] in self._cleared]:
                del self._extra[key]

    def _note_duplicates(self, medium: str, group: int, already: Sequence[Hashable], replica: int) -> None:
        """Count the stores of hashes the replica held already (when duplicates are counted): each needs one
        removal more before the entry goes."""
        if already and self._count:
            extra = self._extra
            for h in already:
                key = (medium, group, h, replica)
                extra[key] = extra.get(key, 0) + 1

    def _count_down(self, medium: str, group: int, hashes: Sequence[Hashable], replica: int) -> list[Hashable]:
        """The removed hashes whose entries really go: a removal of a hash stored more than once only counts
        one of its duplicate stores down."""
        extra = self._extra
        gone: list[Hashable] = []
        for h in hashes:
            key = (medium, group, h, replica)
            n = extra.get(key)
            if n is None:
                gone.append(h)
            elif n == 1:
                del extra[key]
            else:
                extra[key] = n - 1
        return gone


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
