"""The resolved geometry: the one place where spans, L, H, A and chunks are decided.

:func:`resolve` turns a config into a :class:`Geometry`. Every other part of
kvgeom (keys, boundaries, hits, ranks, the CLI) reads the numbers from here and
never recomputes them. The rules restate vLLM 0.33 (vLLM 0.33
`v1/core/kv_cache_utils.py`, `offloading/config.py`, `SchedulerOffloadConfig.from_spec`);
where vLLM is wrong kvgeom does the correct thing and says so.

Invariants (property-tested in ``tests/property``):

* span: ``S_g = block_size * kv_shards`` for a DCP-sharded group, ``block_size``
  otherwise; PCP never scales a span unless ``pcp_shards_kv`` (vLLM #46570);
* ``L = lcm(S_g)`` over all groups, so every span divides L;
* ``H`` divides every prefix-cacheable span and L;
* ``A`` is H or L, and a multiple of every ``tokens_per_state > 1``;
* offload: ``tokens_per_chunk = S_g * k`` and ``hashes_per_chunk = S_g * k / H``;
* row widths: sharded attention ``cdiv(max_model_len, S_g)``, Mamba
  ``cdiv(max_model_len, block_size) + num_speculative_blocks``, never divided by
  DCP (#50287).

One door upward: ``Geometry``'s query methods (``key_map``, ``plan_hit``, ``prefix_hit``,
``plan_request``, ``fingerprint``, ``to_report``) are thin conveniences. Each does one call-time
import from :mod:`kvgeom.report` (a consumer floor above the rule modules) and forwards to it, so this
value type imports none of its consumers at load time; the free functions (:func:`kvgeom.keys.key_map`,
:func:`kvgeom.hits.plan_hit`, ...) are the rules.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import reduce
from typing import Any, Literal

from kvgeom._format import show
from kvgeom._math import INT64_MAX, cdiv
from kvgeom.config import KVGeomConfig, load_config
from kvgeom.errors import (
    GeometryError,
    KVGeomError,
    OffloadConfigError,
    ParallelismError,
    Problem,
    QueryError,
)
from kvgeom.parallel import ParallelConfig, check_parallel
from kvgeom.specs import (
    AnySpec,
    CircularBufferSpec,
    Family,
    MambaSpec,
    SinkFullAttentionSpec,
    UniformSpec,
    attention_chunk_size_of,
    family,
    is_dcp_sharded,
    is_prefix_cacheable,
    iter_leaves,
    scheduler_view,
    sliding_window_of,
    tokens_per_state_of,
)

__all__ = [
    "Geometry",
    "GeometryWarning",
    "GroupGeometry",
    "OffloadGeometry",
    "OffloadGroupGeometry",
    "SpeculativeGeometry",
    "resolve",
]

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

    @property
    def parallel(self) -> ParallelConfig:
        return self.config.parallel

    @property
    def kv_shards(self) -> int:
        """Ranks a sharded group's positions are dealt across (``dcp``, or ``dcp*pcp`` with ``pcp_shards_kv``)."""
        return self.config.parallel.kv_shards

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

        >>> from kvgeom import DEFAULT_CONFIG
        >>> km = resolve(DEFAULT_CONFIG).key_map(64)
        >>> [k["block_entries"] for k in km["groups"][0]["keys"]], [k["state_block"] for k in km["groups"][1]["keys"]]
        ([[0], [1]], [0, 1, 2, 3])
        """
        from kvgeom.report import key_map_dict

        return key_map_dict(self, prefix_tokens)

    def plan_hit(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        """Hit length and load plan for a scenario (see :func:`kvgeom.hits.plan_hit`), as the contract dict
        ``{"hit_tokens", "end_token", "groups": [{"index", "load_keys", "block_entries", "state_block"}]}``.

        >>> from kvgeom import DEFAULT_CONFIG
        >>> scenario = {"num_tokens": 64, "stored": {"0": [32, 64], "1": [16, 32, 48]}}
        >>> resolve(DEFAULT_CONFIG).plan_hit(scenario)["hit_tokens"]
        48
        """
        from kvgeom.report import plan_hit_dict

        return plan_hit_dict(self, scenario)

    def prefix_hit(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        """The GPU prefix-cache hit for ``{"num_tokens": N, "resident": {"<group>": [end tokens]}}`` (see
        :func:`kvgeom.prefix.prefix_hit`), as ``{"hit_tokens", "groups": [{"index", "blocks"}]}``.

        >>> from kvgeom import DEFAULT_CONFIG
        >>> resolve(DEFAULT_CONFIG).prefix_hit({"num_tokens": 65, "resident": {"0": [32, 64], "1": [48]}})["hit_tokens"]
        48
        """
        from kvgeom.report import prefix_hit_dict

        return prefix_hit_dict(self, scenario)

    def plan_request(self, scenario: Mapping[str, Any]) -> dict[str, Any]:
        """GPU hit then connector hit, as the Scheduler admits a request (see :func:`kvgeom.request.plan_request`):
        ``{"local_hit_tokens", "external_hit_tokens", "groups": [loads as in plan_hit]}``.

        >>> from kvgeom import DEFAULT_CONFIG
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

        >>> from kvgeom import DEFAULT_CONFIG
        >>> resolve(DEFAULT_CONFIG).fingerprint().startswith("kvg2-")
        True
        """
        from kvgeom.report import fingerprint

        return fingerprint(self)

    def to_report(self, *, vllm_names: bool = False) -> dict[str, Any]:
        """A JSON-serialisable summary; the key set is a stable contract.

        ``vllm_names=True`` adds vLLM's name next to some keys (same values; nothing renamed or
        removed): :mod:`kvgeom.glossary`, ``docs/glossary.md``.

        >>> from kvgeom import DEFAULT_CONFIG
        >>> r = resolve(DEFAULT_CONFIG).to_report()
        >>> [g["span"] for g in r["groups"]], r["scheduler_block_size"], r["hash_block_size"]
        ([32, 16], 32, 16)
        """
        from kvgeom.report import to_report

        return to_report(self, vllm_names=vllm_names)


def _span_words(g: GroupGeometry, shards: int) -> str:
    if g.dcp_sharded and shards > 1:
        return (
            f"the group is DCP-sharded, so its span is block_size*kv_shards = {g.block_size}*{shards} = {g.span}"
        )
    if g.dcp_sharded:
        return f"its span is its block_size {g.span}"
    return f"the group is replicated across DCP ranks, so its span is its block_size {g.span}"


def _gname(g: GroupGeometry) -> str:
    return f"group {g.index} ({g.kind})"


class _Collector:
    """Problems found so far, each tagged with the error class it belongs to."""

    def __init__(self) -> None:
        self.items: list[tuple[type[KVGeomError], Problem]] = []

    def add(self, cls: type[KVGeomError], code: str, message: str, field: str = "", **values: Any) -> None:
        self.items.append((cls, Problem(code, message, field, values)))

    def extend(self, cls: type[KVGeomError], problems: list[Problem]) -> None:
        self.items.extend((cls, p) for p in problems)

    def raise_if_any(self) -> None:
        if not self.items:
            return
        classes = {cls for cls, _ in self.items}
        cls = classes.pop() if len(classes) == 1 else GeometryError
        raise cls([p for _, p in self.items])


def _resolve_mamba_mode(spec: AnySpec, prefix_caching: bool) -> MambaMode | None:
    view = scheduler_view(spec)
    if not isinstance(view, MambaSpec):
        return None
    if view.mamba_cache_mode is not None:
        return view.mamba_cache_mode
    return "align" if prefix_caching else "none"


#: What vLLM 0.33 does with a DCP-sharded group of each family kvgeom rejects (docs/deviations.md,
#: ``dcp-sharded-windowed-rejected``). The hybrid coordinator (prefix caching on, two or more groups)
#: asserts on all of them; elsewhere each family fares differently.
_VLLM_ON_SHARDED = {
    "sliding": "vLLM 0.33 rejects it in the hybrid coordinator (prefix caching on, two or more groups) and "
    "otherwise at memory planning (SlidingWindowSpec.max_memory_usage_bytes)",
    "chunked": "vLLM 0.33 rejects it in the hybrid coordinator (prefix caching on, two or more groups), "
    "otherwise at its first prefix-cache lookup, and not at all with prefix caching off",
    "cross": "vLLM 0.33 rejects it only in the hybrid coordinator (prefix caching on, two or more groups)",
    "circular": "vLLM 0.33 rejects it only in the hybrid coordinator (prefix caching on, two or more groups) "
    "and otherwise runs it",
}


def _shard_words(cfg: KVGeomConfig) -> str:
    """How the KV shards come about: ``dcp=2``, or ``dcp=2 x pcp=2`` in the pre-#46570 design."""
    p = cfg.parallel
    return f"dcp={p.dcp} x pcp={p.pcp}, pcp_shards_kv" if p.kv_shards != p.dcp else f"dcp={p.dcp}"


def _check_group(
    i: int, spec: AnySpec, cfg: KVGeomConfig, out: _Collector
) -> tuple[bool | None, Family, MambaMode | None]:
    """Per-group rules; returns whether the group is sharded (None when undecidable), its family and
    its resolved Mamba mode."""
    where = f"groups[{i}]"
    kind = spec.kind
    try:
        sharded = is_dcp_sharded(spec)
    except KVGeomError as e:
        for p in e.problems:
            out.add(GeometryError, p.code, f"group {i} ({kind}): {p.message}", f"{where}.layers", **p.values)
        sharded = None
    if isinstance(spec, UniformSpec):
        fams = [family(layer) for layer in spec.layers]
        if len(set(fams)) > 1:
            out.add(
                GeometryError,
                "uniform_mixed_kinds",
                f"group {i} (uniform) mixes layers of different manager families {fams}; a uniform group "
                "holds layers of one family (e.g. MLA and its indexer): split them into separate groups",
                f"{where}.layers",
                families=fams,
            )
        modes = {layer.mamba_cache_mode for layer in spec.layers if isinstance(layer, MambaSpec)}
        if len(modes) > 1:
            out.add(
                GeometryError,
                "uniform_mixed_mamba_modes",
                f"group {i} (uniform) has Mamba layers in different modes {sorted(map(str, modes))}; "
                "give every layer the same mamba_cache_mode",
                f"{where}.layers",
            )
        for j, layer in enumerate(spec.layers):
            if layer.prefix_cacheable is False:
                out.add(
                    GeometryError,
                    "uniform_layer_not_cacheable",
                    f"group {i} (uniform) layer {j} sets prefix_cacheable=false; every layer of a uniform group "
                    "must be cacheable: move the layer to its own group",
                    f"{where}.layers[{j}].prefix_cacheable",
                )
    fam = family(spec)
    if isinstance(spec, CircularBufferSpec) and spec.prefix_cacheable:
        out.add(
            GeometryError,
            "circular_buffer_cacheable",
            f"group {i} (circular_buffer) sets prefix_cacheable=true, but a ring buffer overwrites its slots "
            "and cannot serve prefix hits: remove the key",
            f"{where}.prefix_cacheable",
        )
    if fam == "mamba" and spec.dcp_sharded:
        out.add(
            GeometryError,
            "mamba_cannot_shard",
            f"group {i} ({kind}) sets dcp_sharded=true, but recurrent state is one vector per sequence and is "
            "replicated on every DCP rank: remove dcp_sharded",
            f"{where}.dcp_sharded",
        )
        sharded = False
    mode = _resolve_mamba_mode(spec, cfg.cache.prefix_caching)
    if mode == "none" and cfg.cache.prefix_caching:
        out.add(
            GeometryError,
            "mamba_none_with_prefix_caching",
            f"group {i} ({kind}) uses mamba_cache_mode='none' with prefix caching on; vLLM 0.33 rejects this "
            "(only align mode keeps per-block states): set mamba_cache_mode='align' or cache.prefix_caching=false",
            f"{where}.mamba_cache_mode",
        )
    shards = cfg.parallel.kv_shards
    if sharded and shards > 1 and fam in _VLLM_ON_SHARDED:
        out.add(
            ParallelismError,
            "sharded_kind_under_dcp",
            f"group {i} ({kind}) is dealt across {shards} KV shards ({_shard_words(cfg)}), but kvgeom deals only "
            f"full-attention-family groups (full attention, MLA, sink) across ranks; {_VLLM_ON_SHARDED[fam]}: "
            "set dcp_sharded=false on it (a replicated group) or use dcp=1",
            f"{where}.dcp_sharded",
            dcp=cfg.parallel.dcp,
        )
    if sharded and shards > 1:
        interleave = cfg.parallel.cp_interleave
        if interleave > spec.block_size or spec.block_size % interleave:
            out.add(
                ParallelismError,
                "interleave_mismatch",
                f"cp_interleave={interleave} does not fit group {i} ({kind}) with per-rank block_size="
                f"{spec.block_size}; every DCP-sharded group's block must be >= the interleave and a multiple "
                f"of it (kvgeom checks each sharded group, not only the smallest block as vLLM does): choose "
                f"cp_interleave among the divisors of {spec.block_size}",
                "parallel.cp_interleave",
                cp_interleave=interleave,
                block_size=spec.block_size,
                group=i,
            )
    if isinstance(spec, SinkFullAttentionSpec) and sharded is not None:
        span = spec.block_size * (shards if sharded else 1)
        if spec.sink_len % span:
            out.add(
                GeometryError,
                "sink_len_not_multiple_of_span",
                f"sink_len={spec.sink_len} of group {i} ({kind}) is not a multiple of the group's span {span}; "
                f"the sink must cover whole blocks: use a multiple of {span}",
                f"{where}.sink_len",
                sink_len=spec.sink_len,
                span=span,
            )
    return sharded, fam, mode


def _row_width(spec: AnySpec, span_factor: int, max_len: int, mode: MambaMode | None) -> int:
    """Block-table row width: the most block ids the scheduler can give one request."""
    widths = []
    for leaf in iter_leaves(spec):
        if isinstance(leaf, MambaSpec):
            if mode == "none":
                widths.append(1 + leaf.num_speculative_blocks)
            else:  # align / all: one column per block of the whole sequence, never divided by DCP (#50287)
                widths.append(cdiv(max_len, leaf.block_size) + leaf.num_speculative_blocks)
        elif isinstance(leaf, CircularBufferSpec):
            widths.append(1)
        else:
            widths.append(cdiv(max_len, leaf.block_size * span_factor))
    return max(widths)


def _scheduler_block_size(groups: list[GroupGeometry]) -> int:
    """L: the lcm of the resolved spans (`resolve_kv_cache_block_sizes`), never a configured block size (LMCache #4809).

    A module-level function so the property tests can swap in a broken rule and show a law catches it.
    """
    return reduce(math.lcm, (g.span for g in groups))


def resolve(source: KVGeomConfig | Mapping[str, Any] | str | os.PathLike[str]) -> Geometry:
    """Resolve a config (dict, ``.json``/``.toml`` path or :class:`KVGeomConfig`) into a :class:`Geometry`.

    Raises :class:`kvgeom.ConfigError` for malformed input and a
    :class:`kvgeom.GeometryError` (or subclass) listing every rule the config
    breaks. Nothing else escapes.

    Postconditions: each span is ``block_size * kv_shards`` if the group is
    sharded, else ``block_size``; ``scheduler_block_size`` is the lcm of the
    spans; ``hash_block_size`` divides every prefix-cacheable span;
    ``hit_alignment_tokens`` is ``hash_block_size`` or ``scheduler_block_size``.

    >>> from kvgeom import DEFAULT_CONFIG
    >>> g = resolve(DEFAULT_CONFIG)
    >>> [x.span for x in g.groups], g.scheduler_block_size, g.hash_block_size
    ([32, 16], 32, 16)
    >>> [o.tokens_per_block for o in g.offload.groups]
    [32, 16]
    """
    from kvgeom import speculative as _spec  # at call time: kvgeom.speculative reads this module's types

    cfg = _spec.apply_defaults(load_config(source))
    out = _Collector()
    out.extend(GeometryError, _spec.check_drafters(cfg))
    par = cfg.parallel
    cache = cfg.cache
    out.extend(ParallelismError, check_parallel(par))
    shards = par.kv_shards

    groups: list[GroupGeometry] = []
    for i, spec in enumerate(cfg.groups):
        sharded, fam, mode = _check_group(i, spec, cfg, out)
        factor = shards if sharded else 1
        groups.append(
            GroupGeometry(
                index=i,
                kind=spec.kind,
                spec=spec,
                family=fam,
                block_size=spec.block_size,
                dcp_sharded=bool(sharded),
                prefix_cacheable=is_prefix_cacheable(spec),
                span=spec.block_size * factor,
                row_width=None
                if cache.max_model_len is None
                else _row_width(spec, factor, cache.max_model_len, mode),
                mamba_mode=mode,
                dealt=bool(sharded) and shards > 1,
            )
        )
    # A span or an lcm past int64 would break every batch path: refuse it here.
    for g in groups:
        if g.span > INT64_MAX:
            out.add(
                GeometryError,
                "span_too_large",
                f"{_gname(g)} has span {g.span}, past int64: use realistic block and DCP sizes",
                f"groups[{g.index}].block_size",
                span=g.span,
            )
    out.raise_if_any()

    warnings: list[GeometryWarning] = []
    spans = [g.span for g in groups]
    L = _scheduler_block_size(groups)
    if L > INT64_MAX:
        raise GeometryError.single(
            "scheduler_block_too_large",
            f"the lcm of the spans {spans} is {L}, past int64; spans that share no factors blow up the "
            "scheduler block: make the block sizes multiples of one another",
            "groups",
            spans=spans,
            scheduler_block_size=L,
        )
    cacheable = [g for g in groups if g.prefix_cacheable]
    consumers = cache.prefix_caching or cfg.offload is not None
    pmu = cache.prefix_match_unit
    hash_ok = True
    if len(groups) == 1:
        H = L
        if consumers and pmu is not None and pmu != L:
            out.add(
                GeometryError,
                "prefix_match_unit_single_group",
                f"prefix_match_unit={pmu} with a single KV cache group: hits land on the group's span L={L}; "
                f"unset prefix_match_unit or set it to {L}",
                "cache.prefix_match_unit",
                prefix_match_unit=pmu,
                scheduler_block_size=L,
            )
    else:
        non_align = [g for g in groups if g.mamba_mode in {"none", "all"}]
        if not consumers or non_align or not cacheable:
            H = L
            if pmu is not None and pmu != L:
                why = (
                    "nothing consumes hashes (prefix caching and offloading are off)"
                    if not consumers
                    else f"{_gname(non_align[0])} is not in align mode, which forces H = L"
                    if non_align
                    else "no group is prefix-cacheable"
                )
                warnings.append(
                    GeometryWarning(
                        "prefix_match_unit_ignored",
                        f"prefix_match_unit={pmu} is ignored because {why}; H = L = {L}. Remove the key.",
                    )
                )
        else:
            H = pmu if pmu is not None else reduce(math.gcd, (g.span for g in cacheable))
            bad = [g for g in cacheable if g.span % H]
            if bad:
                hash_ok = False
                source_words = (
                    f"prefix_match_unit={pmu}" if pmu is not None else f"the gcd of the cacheable spans ({H})"
                )
                for g in bad:
                    out.add(
                        GeometryError,
                        "span_not_divisible_by_hash_unit",
                        f"{_gname(g)} has span {g.span}, not a multiple of the hash unit H={H} "
                        f"({source_words}); {_span_words(g, shards)}. Choose a prefix_match_unit that "
                        f"divides every cacheable span ({[c.span for c in cacheable]}), e.g. "
                        f"{reduce(math.gcd, (c.span for c in cacheable))}",
                        "cache.prefix_match_unit" if pmu is not None else f"groups[{g.index}].block_size",
                        span=g.span,
                        hash_block_size=H,
                    )

    # Partial (fine-grained) hash hits: hybrid coordinator only (vLLM 0.33 `partial_hash_hits_enabled`).
    partial = False
    if cache.prefix_caching and len(groups) >= 2 and hash_ok:
        has_mamba = any(
            g.is_align_mamba and (g.block_size > H if par.dcp == 1 else g.block_size >= H) for g in groups
        )
        others_ok = all(g.family in {"full", "mamba"} or g.span == H for g in cacheable)
        partial = has_mamba and others_ok
    A = H if partial else L
    for g in groups:
        for j, leaf in enumerate(iter_leaves(g.spec)):
            tps = tokens_per_state_of(leaf)
            if tps is not None and tps > 1 and A % tps:
                field = f"groups[{g.index}]" + (f".layers[{j}]" if isinstance(g.spec, UniformSpec) else "")
                out.add(
                    GeometryError,
                    "hit_alignment_not_multiple_of_compression",
                    f"{_gname(g)} compresses tokens_per_state={tps} tokens per state, but prefix-cache hits land "
                    f"on multiples of A={A}; a hit boundary would split a state. Make the spans multiples of {tps}",
                    f"{field}.tokens_per_state",
                    tokens_per_state=tps,
                    hit_alignment_tokens=A,
                )

    # Retention interval (vLLM 0.33 `_validate_prefix_cache_retention_interval`): checked by every coordinator.
    R = cache.retention_interval
    windowed_sched = any(g.family in {"sliding", "mamba"} for g in groups)
    if R is not None and R != 0:
        if not windowed_sched:
            out.add(
                GeometryError,
                "retention_without_windowed_group",
                f"retention_interval={R} but no group is sliding-window or Mamba, so there is nothing to thin "
                "out; use 0 (the default) or \"dense\"",
                "cache.retention_interval",
                retention_interval=R,
            )
        elif R % L:
            out.add(
                GeometryError,
                "retention_not_multiple_of_scheduler_block",
                f"retention_interval={R} is not a multiple of the scheduler block L={L}: use a multiple of {L}, "
                f"e.g. {max(L, R - R % L)}",
                "cache.retention_interval",
                retention_interval=R,
                scheduler_block_size=L,
            )

    speculative = _spec.speculative_geometry(cfg)
    groups, spec_problems = _spec.resolve_groups(cfg, groups, speculative, L, H, partial)
    out.extend(GeometryError, spec_problems)
    offload = None
    if cfg.offload is not None:
        offload = _resolve_offload(cfg, groups, H, L, hash_ok, out, warnings)
        if offload is not None:
            offload = _spec.resolve_offload(offload, groups, H, A, partial)
    out.raise_if_any()

    _add_warnings(cfg, groups, L, H, A, offload, warnings)
    warnings.extend(_spec.speculative_warnings(cfg, groups, A, offload, speculative))
    return Geometry(
        config=cfg,
        groups=tuple(groups),
        scheduler_block_size=L,
        hash_block_size=H,
        hit_alignment_tokens=A,
        partial_hash_hits=partial,
        offload=offload,
        warnings=tuple(warnings),
        speculative=speculative,
    )


def _window_chunks(g: GroupGeometry, chunk: int) -> int | None:
    """Chunks a lookup needs ending at the hit (``get_sliding_window_size_in_chunks``; first layer decides).

    Sliding window ``max(cdiv(sw, C), cdiv(sw - 1 + extra, C))``, chunked local
    ``cdiv(attention_chunk_size, C)``, Mamba 1, full attention None (unbounded).
    """
    window = sliding_window_of(g.spec)
    if window is not None:
        sw, extra = window
        return max(cdiv(sw, chunk), cdiv(sw - 1 + extra, chunk))
    size = attention_chunk_size_of(g.spec)
    if size is not None:
        return cdiv(size, chunk)
    return 1 if g.family == "mamba" else None


def _resolve_offload(
    cfg: KVGeomConfig,
    groups: list[GroupGeometry],
    H: int,
    L: int,
    hash_ok: bool,
    out: _Collector,
    warnings: list[GeometryWarning],
) -> OffloadGeometry | None:
    """Offloading connector geometry (vLLM 0.33 `build_offloading_config`, `SchedulerOffloadConfig.from_spec`)."""
    assert cfg.offload is not None
    oc = cfg.offload
    shards = cfg.parallel.kv_shards
    selected = [g for g in groups if g.prefix_cacheable]
    if not selected:
        out.add(
            OffloadConfigError,
            "no_offloadable_groups",
            "offloading is configured but no group is prefix-cacheable, so there is nothing to offload: "
            "remove the offload section or mark a group prefix_cacheable",
            "offload",
        )
        return None
    for g in selected:
        if g.family == "cross":
            out.add(
                OffloadConfigError,
                "cross_attention_offload",
                f"{_gname(g)} would be offloaded, but cross-attention KV depends on the encoder input, not on "
                "the prefix, and vLLM's connector cannot window it: set prefix_cacheable=false on the group "
                "or remove the offload section",
                f"groups[{g.index}]",
            )
    if hash_ok:
        for g in selected:
            if g.span % H:
                out.add(
                    OffloadConfigError,
                    "tokens_per_block_not_divisible",
                    f"tokens_per_block={g.span} of {_gname(g)} is not a multiple of tokens_per_hash={H}; "
                    f"{_span_words(g, shards)}. H equals the scheduler block L={L} here because "
                    + (
                        "a Mamba group is not in align mode"
                        if any(x.mamba_mode in {"none", "all"} for x in groups)
                        else "prefix caching is off"
                        if not cfg.cache.prefix_caching
                        else "of the group layout"
                    )
                    + ": enable prefix caching with Mamba align mode, or make the spans equal",
                    f"groups[{g.index}].block_size",
                    tokens_per_block=g.span,
                    tokens_per_hash=H,
                )
    k = 1
    if oc.blocks_per_chunk is not None and oc.block_size is not None:
        out.add(
            OffloadConfigError,
            "offload_chunk_both",
            f"offload gives both block_size={oc.block_size} and blocks_per_chunk={oc.blocks_per_chunk}; "
            "specify only one of them",
            "offload",
        )
    elif oc.block_size is not None:
        spans = sorted({g.span for g in selected})
        if len(spans) != 1:
            out.add(
                OffloadConfigError,
                "offload_block_size_mixed_spans",
                f"offload.block_size={oc.block_size} needs every offloaded group to have the same span, but "
                f"the spans are {[g.span for g in selected]}; set offload.blocks_per_chunk instead "
                "(in align mode a hybrid under DCP has attention span block_size*dcp and Mamba span block_size)",
                "offload.block_size",
                block_size=oc.block_size,
                spans=[g.span for g in selected],
            )
        elif oc.block_size % spans[0]:
            up = cdiv(oc.block_size, spans[0]) * spans[0]
            out.add(
                OffloadConfigError,
                "offload_block_size_not_multiple",
                f"offload.block_size={oc.block_size} is not a multiple of the GPU block span "
                f"({spans[0]} tokens); use {up} or set blocks_per_chunk={up // spans[0]}",
                "offload.block_size",
                block_size=oc.block_size,
                span=spans[0],
            )
        else:
            k = oc.block_size // spans[0]
    elif oc.blocks_per_chunk is not None:
        k = oc.blocks_per_chunk

    ogroups = []
    for g in selected:
        chunk = g.span * k
        ogroups.append(
            OffloadGroupGeometry(
                index=g.index,
                tokens_per_block=g.span,
                tokens_per_chunk=chunk,
                hashes_per_chunk=chunk // H,
                window_chunks=None if g.family == "cross" else _window_chunks(g, chunk),
            )
        )
    by_index = {g.index: g for g in groups}
    full_chunks = [og.tokens_per_chunk for og in ogroups if by_index[og.index].family == "full"]
    if full_chunks:
        alignment: int | None = full_chunks[0] if len(set(full_chunks)) == 1 else None
        if alignment is None:
            warnings.append(
                GeometryWarning(
                    "alignment_tokens_none",
                    f"the full-attention groups have different chunks {full_chunks}, so the connector has no "
                    "alignment_tokens and its store masks for sliding-window and non-align Mamba groups fall back "
                    "to dense (every block stored); give the full-attention groups one span",
                )
            )
    else:
        alignment = max(og.tokens_per_chunk for og in ogroups)
    mamba_chunks = {
        og.index: og.tokens_per_chunk for og in ogroups if by_index[og.index].mamba_mode in {"align", "all"}
    }
    mamba_align: int | None = None
    if mamba_chunks:
        if len(set(mamba_chunks.values())) > 1:
            out.add(
                OffloadConfigError,
                "mamba_chunk_mismatch",
                f"the align-mode Mamba groups have different offload chunks {mamba_chunks} (group: tokens); "
                "a hit must land on one Mamba chunk grid: give every Mamba group the same block_size",
                "groups",
                chunks=mamba_chunks,
            )
        mamba_align = max(mamba_chunks.values())
    R = cfg.cache.retention_interval
    if R:
        for og in ogroups:
            if by_index[og.index].family in {"sliding", "chunked", "mamba"} and R % og.tokens_per_chunk:
                out.add(
                    OffloadConfigError,
                    "retention_not_multiple_of_chunk",
                    f"retention_interval={R} is not a multiple of tokens_per_chunk={og.tokens_per_chunk} of "
                    f"{_gname(by_index[og.index])}: use a multiple of "
                    f"{math.lcm(*(o.tokens_per_chunk for o in ogroups))}",
                    "cache.retention_interval",
                    retention_interval=R,
                    tokens_per_chunk=og.tokens_per_chunk,
                )
    partial_tail = _partial_tail_shape(k, selected, H) and cfg.parallel.dcp == 1
    return OffloadGeometry(
        blocks_per_chunk=k,
        tokens_per_hash=H,
        alignment_tokens=alignment,
        mamba_align_size=mamba_align,
        retention_interval=R,
        supports_partial_tail=partial_tail,
        groups=tuple(ogroups),
    )


def _partial_tail_shape(k: int, offloaded: list[GroupGeometry], H: int) -> bool:
    """Every condition of vLLM 0.33's ``supports_partial_tail`` but DCP 1: k = 1, one common span, an
    align-mode Mamba group with span > H, and no windowed group other than Mamba."""
    return (
        k == 1
        and len({g.span for g in offloaded}) == 1
        and any(g.is_align_mamba and g.span > H for g in offloaded)
        and not any(g.family in {"sliding", "chunked"} for g in offloaded)
    )


def _add_warnings(
    cfg: KVGeomConfig,
    groups: list[GroupGeometry],
    L: int,
    H: int,
    A: int,
    offload: OffloadGeometry | None,
    warnings: list[GeometryWarning],
) -> None:
    """Legal but likely unintended geometry (issues users have reported, e.g. LMCache #4809)."""
    spans = [g.span for g in groups]
    if len(groups) > 1 and max(spans) < L:
        warnings.append(
            GeometryWarning(
                "scheduler_block_lcm_blowup",
                f"the scheduler block L=lcm{tuple(spans)}={L} is larger than every group's span; "
                + (
                    f"prefix-cache hits land on multiples of L, so prompts sharing fewer than {L} tokens never hit "
                    "(vLLM #40696, #54607)"
                    if A == L
                    else f"prefix-cache hits still land on multiples of A={A} (partial hash hits), but the local "
                    f"prefix an offload connector starts from is rounded down to L={L}"
                )
                + ": make the spans multiples of one another",
            )
        )
    smallest = min(g.span for g in groups if g.prefix_cacheable) if any(g.prefix_cacheable for g in groups) else A
    if cfg.cache.prefix_caching and 8 * smallest <= A:
        warnings.append(
            GeometryWarning(
                "hit_floor",
                f"prefix-cache hits land on multiples of A={A} tokens, {A // smallest}x the smallest span "
                f"{smallest}: prompts sharing fewer than {A} tokens get no hit (vllm-ascend #16270); consider a "
                "smaller block size or a prefix_match_unit",
            )
        )
    if offload is not None:
        mml = cfg.cache.max_model_len
        if mml is not None:
            big = [og for og in offload.groups if og.tokens_per_chunk > mml]
            if big:
                warnings.append(
                    GeometryWarning(
                        "offload_chunk_exceeds_max_model_len",
                        f"offload chunks {[og.tokens_per_chunk for og in big]} of groups {[og.index for og in big]} "
                        f"exceed max_model_len={mml}: no request can ever store a complete chunk; lower "
                        "blocks_per_chunk",
                    )
                )
        offloaded = [groups[og.index] for og in offload.groups]
        if cfg.parallel.dcp > 1 and _partial_tail_shape(offload.blocks_per_chunk, offloaded, H):
            warnings.append(
                GeometryWarning(
                    "partial_tails_disabled_by_dcp",
                    f"dcp={cfg.parallel.dcp} alone turns sub-chunk (partial-tail) offload hits off (vLLM 0.33 "
                    f"SchedulerOffloadConfig.from_spec; #57216 proposes lifting it): offload hits land on multiples "
                    f"of the Mamba chunk {offload.mamba_align_size} tokens where dcp=1 would allow multiples of "
                    f"H={H}; run at dcp=1 for the finer hits",
                )
            )
        R = offload.retention_interval
        if R and mml is not None and mml < R and offload.mamba_align_size is not None:
            warnings.append(
                GeometryWarning(
                    "retention_unreachable",
                    f"retention_interval={R} exceeds max_model_len={mml}: no periodic Mamba checkpoint is ever "
                    "kept, only replay boundaries; use a smaller interval or 0",
                )
            )
        # The offload tier loads only complete full-attention chunks (vLLM 0.33 `_lookup_complete_chunks`): a chunk much
        # larger than the smallest span is an offload hit floor (Kimi-K3 at DCP 8: 12288 vs 1536, #55168).
        full_chunks = [og.tokens_per_chunk for og in offload.groups if groups[og.index].family == "full"]
        if full_chunks and 8 * min(og.tokens_per_block for og in offload.groups) <= max(full_chunks):
            floor = max(full_chunks)
            warnings.append(
                GeometryWarning(
                    "offload_hit_floor",
                    f"the offload tier loads only complete full-attention chunks of {floor} tokens, "
                    f"{floor // min(og.tokens_per_block for og in offload.groups)}x the smallest span: prompts "
                    f"sharing fewer than {floor} tokens never load from it; lower blocks_per_chunk, the "
                    "attention block_size or dcp",
                )
            )
    R = cfg.cache.retention_interval
    mml = cfg.cache.max_model_len
    if offload is None and R and mml is not None and mml < R and any(g.is_align_mamba for g in groups):
        # Same rule as with offloading: the GPU prefix cache thins Mamba states by the same interval.
        warnings.append(
            GeometryWarning(
                "retention_unreachable",
                f"retention_interval={R} exceeds max_model_len={mml}: no periodic Mamba checkpoint is ever "
                "kept, only replay boundaries; use a smaller interval or 0",
            )
        )
    if cfg.cache.prefix_caching and len(groups) > 1:
        for g in groups:
            if g.family == "chunked" and g.block_size != A:
                warnings.append(
                    GeometryWarning(
                        "chunked_local_block_mismatch",
                        f"{_gname(g)} has block_size={g.block_size} but prefix-cache hits land on multiples of "
                        f"A={A}; vLLM 0.33's chunked-local lookup asserts the two are equal, so the engine crashes "
                        "at the first prefix-cache lookup (deviation chunked-local-mixed-blocks): give the group "
                        f"block_size={A} or turn prefix caching off",
                    )
                )
    for g in groups:
        if g.mamba_mode == "all":
            warnings.append(
                GeometryWarning(
                    "mamba_mode_all_legacy",
                    f"{_gname(g)} uses mamba_cache_mode='all', which vLLM 0.33 rejects; kvgeom models the older "
                    "semantics (H = L, Mamba chunk alignment of #51100): use 'align' for current vLLM",
                )
            )
