"""The resolved geometry: the values in which spans, L, H, A and chunks are decided once.

:func:`kvgeom.resolve` (in :mod:`kvgeom._resolve`, the one home of every resolve-time decision) turns a
config into a :class:`Geometry`. Every other part of kvgeom (keys, boundaries, hits, ranks, the CLI)
reads the numbers from these values and never recomputes them. The rules restate vLLM 0.33 (vLLM 0.33
`v1/core/kv_cache_utils.py`, `offloading/config.py`, `SchedulerOffloadConfig.from_spec`); where vLLM is
wrong kvgeom does the correct thing and says so.

This module holds values only. The one documented door upward: :class:`Geometry`'s query methods
(``key_map``, ``plan_hit``, ``prefix_hit``, ``plan_request``, ``fingerprint``, ``to_report``) import their
implementations from :mod:`kvgeom.report` at call time, and the name ``kvgeom.geometry.resolve``
(kept for old callers) is looked up at call time too through a module ``__getattr__`` (PEP 562); this
module never imports :mod:`kvgeom._resolve` at import time.

Invariants (property-tested in ``tests/property``):

* span: ``S_g = block_size * kv_shards`` for a DCP-sharded group, ``block_size``
  otherwise; PCP never scales a span unless ``pcp_shards_kv`` (vLLM #46570);
* ``L = lcm(S_g)`` over all groups, so every span divides L;
* ``H`` divides every prefix-cacheable span and L;
* ``A`` is H or L, and a multiple of every ``tokens_per_state > 1``;
* offload: ``tokens_per_chunk = S_g * k`` and ``hashes_per_chunk = S_g * k / H``;
* row widths: sharded attention ``cdiv(max_model_len, S_g)``, Mamba
  ``cdiv(max_model_len, block_size) + num_speculative_blocks``, never divided by
  DCP (#50287);
* ``GroupGeometry.window_need`` / ``gpu_window_need`` and ``Geometry.gpu_drop_groups`` are decided at
  resolve time (queries read them).

Each query method is a thin convenience: one call-time import from :mod:`kvgeom.report` (a consumer
floor above the rule modules) and a forward, so this value type imports none of its consumers at load
time; the free functions (:func:`kvgeom.keys.key_map`, :func:`kvgeom.hits.plan_hit`, ...) are the rules.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal

from kvgeom._format import show
from kvgeom.config import KVGeomConfig
from kvgeom.errors import KVGeomError, QueryError
from kvgeom.parallel import ParallelConfig
from kvgeom.specs import AnySpec, Family

__all__ = [
    "Geometry",
    "GeometryWarning",
    "GroupGeometry",
    "OffloadGeometry",
    "OffloadGroupGeometry",
    "SpeculativeGeometry",
    "resolve",  # noqa: F822 -- served at call time by __getattr__ below (PEP 562)
]


def __getattr__(name: str) -> Any:
    """``kvgeom.geometry.resolve`` for old callers, imported at call time (PEP 562; the documented door)."""
    if name == "resolve":
        from kvgeom._resolve import resolve

        return resolve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

MambaMode = Literal["align", "none", "all"]


@dataclass(frozen=True, slots=True)
class GroupGeometry:
    """One resolved cache group.

    ``span`` is how many sequence positions one block id of this group stands
    for, counted across all ranks; ``block_size`` is per rank.
    """

    index: int
    kind: str
    spec: AnySpec
    family: Family
    block_size: int
    dcp_sharded: bool
    prefix_cacheable: bool
    span: int
    row_width: int | None
    mamba_mode: MambaMode | None
    """Resolved Mamba mode of a Mamba group (``None`` for other families)."""
    dealt: bool
    """Whether DCP actually deals this group's positions over several ranks: DCP-sharded and
    ``kv_shards > 1``. Every consumer (dealing, key maps, fingerprint, simulator) reads this."""
    eagle_group: bool = False
    """Speculative decoding: ``Geometry.speculative.block_drop`` and the group holds drafter layers
    (``drafter: true`` on it or on one of its layers). vLLM 0.33
    ``v1/core/kv_cache_planning.py::get_global_kv_cache_groups`` sets ``is_eagle_group`` exactly so, only
    when ``use_eagle_block_drop()``; the flag stays under lookahead hashes (no group drops then). False
    without a ``speculative`` section. Decided in :func:`kvgeom.speculative.resolve_groups`."""
    proof_margin: int | None = None
    """Speculative decoding, GPU prefix cache: the tokens a lookup of this group matches past a
    candidate hit and then drops. Non-null iff ``Geometry.speculative.gpu_drop``, the group is
    prefix-cacheable, not Mamba, and its lookup drops: it is flagged, or no group is flagged (vLLM 0.33
    ``v1/core/kv_cache_coordinator.py::KVCacheCoordinator.__init__`` falls back to every group), or its
    spec equals a dropping group's (one lookup group,
    ``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``). Value
    ``v1/core/kv_cache_utils.py::eagle_proof_margin``: H when partial hash hits are on, the group is
    full-attention family (``supports_fine_grained_hash_lookup``) and ``S > H``, else S. The drop itself
    is ``min(A, S)`` then re-aligned to A (``FullAttentionManager.find_longest_cache_hit``)."""
    window_need: int | None = None
    """Positions before a hit end N that the offloading connector needs this group to hold (its lookup and
    its store masks): ``sliding_window - 1 + extra_retained_tokens`` for a sliding-window group (vLLM 0.33
    ``offloading/scheduler.py``: ``load_window_size_in_chunks`` and ``_reachable_store_block_mask`` widen the
    window by ``extra_retained_tokens``), ``attention_chunk_size - 1`` for chunked local (the most a hit's
    own chunk ``[rdown(N, size), N)`` can need); None for every other family (full attention needs every
    position, Mamba only its state at N, cross-attention and circular buffers have no prefix lookup).
    Decided from the scheduler view (a uniform group's first layer), as ``specs.sliding_window_of``.
    Invariant: ``window_need >= gpu_window_need`` and both are None together."""
    gpu_window_need: int | None = None
    """Positions before a hit end the GPU prefix cache needs this group to hold: ``sliding_window - 1``
    for a sliding-window group (vLLM 0.33 ``v1/core/single_type_kv_cache_manager.py::
    SlidingWindowManager.find_longest_cache_hit`` needs ``cdiv(sliding_window - 1, block_size)`` blocks;
    ``extra_retained_tokens`` does not widen it), ``attention_chunk_size - 1`` for chunked local, None for
    every other family. ``gpu_window_need + 1`` is the window itself."""

    @property
    def is_align_mamba(self) -> bool:
        """A Mamba group whose block *i* holds the state after ``(i+1)*block_size`` tokens."""
        return self.mamba_mode == "align"


@dataclass(frozen=True, slots=True)
class OffloadGroupGeometry:
    """Offload geometry of one offloaded group (vLLM ``GroupOffloadConfig``)."""

    index: int
    tokens_per_block: int
    tokens_per_chunk: int
    hashes_per_chunk: int
    window_chunks: int | None
    """Chunks a lookup needs ending at the hit (Mamba 1, full attention None)."""
    eagle_group: bool = False
    """Speculative decoding: the connector treats this group as an eagle group -- exactly
    ``GroupGeometry.eagle_group``, with no fallback when none is flagged (vLLM 0.33
    ``offloading/scheduler.py::SchedulerOffloadConfig.from_spec``, issue #52735). Its lookup queries one
    chunk more and pops one (``_lookup_complete_chunks``); its last chunk is held back from stores while
    the request decodes (``RequestOffloadState.storable_chunks``)."""
    proof_margin: int | None = None
    """Speculative decoding, offload partial tails: the group's boundary key sits at ``b + proof_margin``
    (``OffloadingConnectorScheduler._partial_tail_key_tokens``). Non-null iff partial tails are on (they
    need DCP 1) and the group is an eagle group that is not align Mamba; value
    ``eagle_proof_margin(S, H, partial hash hits and A < S and full-attention family)``
    (``OffloadingConnectorScheduler.__init__``)."""


@dataclass(frozen=True, slots=True)
class OffloadGeometry:
    """Geometry of the offloading connector (vLLM ``SchedulerOffloadConfig``)."""

    blocks_per_chunk: int
    tokens_per_hash: int
    alignment_tokens: int | None
    mamba_align_size: int | None
    retention_interval: int | None
    supports_partial_tail: bool
    groups: tuple[OffloadGroupGeometry, ...]
    _by_index: dict[int, OffloadGroupGeometry] = dc_field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        # One lookup table, so that a per-group query is O(1) however many groups there are.
        object.__setattr__(self, "_by_index", {g.index: g for g in self.groups})

    def get(self, index: int) -> OffloadGroupGeometry | None:
        """The offload geometry of group ``index`` (a plain int), or None when it is not offloaded; O(1)."""
        return self._by_index.get(index) if type(index) is int else None

    def group(self, index: int) -> OffloadGroupGeometry:
        """The offload geometry of group ``index``; :class:`KVGeomError` if it is not offloaded."""
        og = self.get(index)
        if og is not None:
            return og
        raise KVGeomError.single(
            "group_not_offloaded",
            f"group {show(index)} is not offloaded; offloaded groups are {show([g.index for g in self.groups])}",
            "group",
            index=index,
        )


@dataclass(frozen=True, slots=True)
class SpeculativeGeometry:
    """Effective speculative-decoding settings of a geometry (what vLLM 0.33 actually does).

    ``block_drop``: the method is eagle, eagle3 or mtp and ``eagle_block_drop`` is not false
    (``config/speculative.py::SpeculativeConfig.use_eagle_block_drop``).
    ``lookahead_hashes``: ``block_drop``, ``lookahead_hashes`` not false, prefix caching on and no KV
    connector -- an offload section counts as one (``config/vllm.py::VllmConfig.num_hash_lookahead_tokens``).
    ``gpu_drop``: the GPU prefix cache drops a proven unit and Mamba checkpoints move down one A:
    ``block_drop and not lookahead_hashes`` with prefix caching on (``v1/core/sched/scheduler.py::
    Scheduler.__init__`` clears the drop when lookahead hashes prove the boundary token).
    Decided in :func:`kvgeom.speculative.speculative_geometry`; ``docs/speculative.md``.
    """

    method: str
    num_speculative_tokens: int
    block_drop: bool
    lookahead_hashes: bool
    gpu_drop: bool
    prefill_lookahead_tokens: int
    """P: 0 unless the method drafts from hidden states (eagle, eagle3, mtp, dflash); K for multi-module
    MTP (``min(mtp_modules, K) > 1``); else 1 (``config/vllm.py::VllmConfig.num_prefill_lookahead_tokens``)."""


@dataclass(frozen=True, slots=True)
class GeometryWarning:
    """Something legal but likely unintended, with a stable code and a fix."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Geometry:
    """A resolved geometry (immutable). Build it with :func:`resolve`."""

    config: KVGeomConfig
    groups: tuple[GroupGeometry, ...]
    scheduler_block_size: int
    """L: lcm of all spans; the scheduler's unit of allocation."""
    hash_block_size: int
    """H: request hashes are chained every H tokens (= offload ``tokens_per_hash``)."""
    hit_alignment_tokens: int
    """A: prefix-cache hits land on multiples of A (H with partial hash hits, else L)."""
    partial_hash_hits: bool
    offload: OffloadGeometry | None
    warnings: tuple[GeometryWarning, ...]
    speculative: SpeculativeGeometry | None = None
    """The effective speculative-decoding settings, or None without a drafter."""
    gpu_drop_groups: frozenset[int] = frozenset()
    """Speculative decoding: the groups whose GPU prefix-cache lookup drops a proven unit (empty unless
    ``speculative.gpu_drop``): the flagged groups, or every group when none is flagged (vLLM 0.33
    ``v1/core/kv_cache_coordinator.py::KVCacheCoordinator.__init__``), then every group whose spec equals a
    dropping group's (one lookup group, ``HybridKVCacheCoordinator.verify_and_split_kv_cache_groups``).
    Decided in :func:`kvgeom.speculative.gpu_dropping_groups` at resolve time."""

    @property
    def parallel(self) -> ParallelConfig:
        return self.config.parallel

    @property
    def kv_shards(self) -> int:
        """Ranks a sharded group's positions are dealt across (``dcp``, or ``dcp*pcp`` with ``pcp_shards_kv``)."""
        return self.config.parallel.kv_shards

    @property
    def hash_lookahead_tokens(self) -> int:
        """Tokens past a block a request hash also covers: P (``speculative.prefill_lookahead_tokens``) under
        lookahead hashes, else 0 (vLLM 0.33 ``VllmConfig.num_hash_lookahead_tokens``). The one home of this
        rule: the hash chain, the Mamba checkpoint and the hasher all read it. A hash over ``[0, e)`` exists
        once ``e + hash_lookahead_tokens`` tokens do."""
        sg = self.speculative
        return sg.prefill_lookahead_tokens if sg is not None and sg.lookahead_hashes else 0

    def request_hashes(self, num_tokens: int) -> int:
        """How many hashes vLLM's ``request.block_hashes`` holds for a request of ``num_tokens`` tokens:
        ``max(num_tokens - P, 0) // H`` (P = :attr:`hash_lookahead_tokens`, H = ``hash_block_size``). The one
        home of that count: the prefix lookups, the chain checks and the router read it.

        Invariant: at most ``num_tokens // H``, and equal to it when P is 0.

        >>> import kvgeom
        >>> kvgeom.resolve(kvgeom.DEFAULT_CONFIG).request_hashes(100)
        6
        """
        return max(num_tokens - self.hash_lookahead_tokens, 0) // self.hash_block_size

    def group(self, index: int) -> GroupGeometry:
        """Group ``index``; :class:`kvgeom.QueryError` when out of range."""
        if type(index) is int and 0 <= index < len(self.groups):  # fast path of the check below (benchmarks)
            return self.groups[index]
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.groups):
            raise QueryError.single(
                "no_such_group",
                f"group index {show(index)} is out of range; this geometry has groups 0..{len(self.groups) - 1}",
                "group",
                index=index,
            )
        return self.groups[index]

    def key_map(self, prefix_tokens: int) -> dict[str, Any]:
        """The complete offload chunks within the first ``prefix_tokens`` tokens, per offloaded group.

        Contract: ``{"prefix_tokens", "groups": [{"index", "kind", "keys": [{"chunk", "hash_index",
        "end_token", "block_entries"}]}]}``; align-mode Mamba keys carry ``"state_block"`` instead of
        ``"block_entries"``; a DCP-sharded group also has ``"rank_lengths"`` for the prefix.

        >>> from kvgeom import DEFAULT_CONFIG, resolve
        >>> km = resolve(DEFAULT_CONFIG).key_map(64)
        >>> [k["block_entries"] for k in km["groups"][0]["keys"]], [k["state_block"] for k in km["groups"][1]["keys"]]
        ([[0], [1]], [0, 1, 2, 3])
        """
        from kvgeom.report import key_map_dict

        return key_map_dict(self, prefix_tokens)

    def plan_hit(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        """Hit length and load plan for a scenario (see :func:`kvgeom.hits.plan_hit`), as the contract dict
        ``{"hit_tokens", "end_token", "groups": [{"index", "load_keys", "block_entries", "state_block"}]}``.

        >>> from kvgeom import DEFAULT_CONFIG, resolve
        >>> scenario = {"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}}
        >>> resolve(DEFAULT_CONFIG).plan_hit(scenario)["hit_tokens"]
        48
        """
        from kvgeom.report import plan_hit_dict

        return plan_hit_dict(self, scenario)

    def prefix_hit(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        """The GPU prefix-cache hit for ``{"num_tokens": N, "resident": {"<group>": [end tokens]}}`` (see
        :func:`kvgeom.prefix.prefix_hit`), as ``{"hit_tokens", "groups": [{"index", "blocks"}]}``.

        >>> from kvgeom import DEFAULT_CONFIG, resolve
        >>> resolve(DEFAULT_CONFIG).prefix_hit({"num_tokens": 65, "resident": {"0": [32, 64], "1": [48]}})["hit_tokens"]
        48
        """
        from kvgeom.report import prefix_hit_dict

        return prefix_hit_dict(self, scenario)

    def plan_request(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        """GPU hit then connector hit, as the Scheduler admits a request (see :func:`kvgeom.request.plan_request`):
        ``{"local_hit_tokens", "external_hit_tokens", "groups": [loads as in plan_hit]}``.

        >>> from kvgeom import DEFAULT_CONFIG, resolve
        >>> sc = {"num_tokens": 100, "resident": {"0": [32, 64], "1": [48]}, "stored": {"0": [32, 64], "1": [48]}}
        >>> p = resolve(DEFAULT_CONFIG).plan_request(sc); p["local_hit_tokens"], p["external_hit_tokens"]
        (48, 0)
        """
        from kvgeom.report import plan_request_dict

        return plan_request_dict(self, scenario)

    def fingerprint(self) -> str:
        """A short, versioned, stable digest of everything behind an offload key's bytes.

        See :mod:`kvgeom.fingerprint` (``"kvg2-"`` + 16 hex digits); two layouts
        share keys safely only when their fingerprints are equal.

        >>> from kvgeom import DEFAULT_CONFIG, resolve
        >>> resolve(DEFAULT_CONFIG).fingerprint().startswith("kvg2-")
        True
        """
        from kvgeom.report import fingerprint

        return fingerprint(self)

    def to_report(self, *, vllm_names: bool = False) -> dict[str, Any]:
        """A JSON-serialisable summary; the key set is a stable contract.

        ``vllm_names=True`` adds vLLM's name next to some keys (same values; nothing renamed or
        removed): :mod:`kvgeom.glossary`, ``docs/glossary.md``.

        >>> from kvgeom import DEFAULT_CONFIG, resolve
        >>> r = resolve(DEFAULT_CONFIG).to_report()
        >>> [g["span"] for g in r["groups"]], r["scheduler_block_size"], r["hash_block_size"]
        ([32, 16], 32, 16)
        """
        from kvgeom.report import to_report

        return to_report(self, vllm_names=vllm_names)

