"""The geometry's units: the scheduler block L, the hash unit H, partial hash hits and the hit
alignment A, and the rules that depend on them (compression, retention interval).

Invariants (property-tested in ``tests/property/test_geometry_laws.py``):

* ``L = lcm(S_g)`` over all groups, so every span divides L, and L fits int64;
* ``H`` divides every prefix-cacheable span and L;
* ``A`` is H or L, and a multiple of every ``tokens_per_state > 1``;
* a retention interval is 0, or a multiple of L with a sliding-window or Mamba group to thin.
"""

from __future__ import annotations

import math
from functools import reduce

from kvgeom._format import show
from kvgeom._math import INT64_MAX
from kvgeom._resolve.problems import Collector, group_name, span_words
from kvgeom.config import KVGeomConfig
from kvgeom.errors import GeometryError
from kvgeom.geometry import GeometryWarning, GroupGeometry
from kvgeom.specs import UniformSpec, iter_leaves, tokens_per_state_of

__all__ = [
    "check_compression",
    "check_retention",
    "hash_unit",
    "hit_alignment",
    "partial_hash_hits",
    "scheduler_block_size",
    "scheduler_block",
]


def scheduler_block_size(groups: list[GroupGeometry]) -> int:
    """L: the lcm of the resolved spans (`resolve_kv_cache_block_sizes`), never a configured block size (LMCache #4809).

    A module-level function so the property tests can swap in a broken rule and show a law catches it.
    """
    return reduce(math.lcm, (g.span for g in groups))


def scheduler_block(groups: list[GroupGeometry]) -> int:
    """L (:func:`scheduler_block_size`), refused when it is past int64."""
    L = scheduler_block_size(groups)
    if L > INT64_MAX:
        spans = [g.span for g in groups]
        raise GeometryError.single(
            "scheduler_block_too_large",
            f"the lcm of the spans {show(spans)} is {show(L)}, past int64; spans that share no factors blow up the "
            "scheduler block: make the block sizes multiples of one another",
            "groups",
            spans=spans,
            scheduler_block_size=L,
        )
    return L


def _ignored_unit(
    cfg: KVGeomConfig, groups: list[GroupGeometry], L: int, consumers: bool, non_align: list[GroupGeometry]
) -> list[GeometryWarning]:
    """The ``prefix_match_unit_ignored`` warning when a configured unit cannot apply (H = L)."""
    pmu = cfg.cache.prefix_match_unit
    if pmu is None or pmu == L:
        return []
    why = (
        "nothing consumes hashes (prefix caching and offloading are off)"
        if not consumers
        else f"{group_name(non_align[0])} is not in align mode, which forces H = L"
        if non_align
        else "no group is prefix-cacheable"
    )
    return [
        GeometryWarning(
            "prefix_match_unit_ignored",
            f"prefix_match_unit={pmu} is ignored because {why}; H = L = {L}. Remove the key.",
        )
    ]


def hash_unit(
    cfg: KVGeomConfig, groups: list[GroupGeometry], L: int, out: Collector
) -> tuple[int, bool, list[GeometryWarning]]:
    """H, whether it divides every cacheable span, and the warning of an ignored ``prefix_match_unit``.

    H = L for one group, without a hash consumer (prefix caching or offloading), with a non-align Mamba
    group or without a cacheable group; else ``prefix_match_unit`` or the gcd of the cacheable spans.
    """
    cacheable = [g for g in groups if g.prefix_cacheable]
    consumers = cfg.cache.prefix_caching or cfg.offload is not None
    pmu = cfg.cache.prefix_match_unit
    if len(groups) == 1:
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
        return L, True, []
    non_align = [g for g in groups if g.mamba_mode in {"none", "all"}]
    if not consumers or non_align or not cacheable:
        return L, True, _ignored_unit(cfg, groups, L, consumers, non_align)
    H = pmu if pmu is not None else reduce(math.gcd, (g.span for g in cacheable))
    bad = [g for g in cacheable if g.span % H]
    source_words = f"prefix_match_unit={pmu}" if pmu is not None else f"the gcd of the cacheable spans ({H})"
    for g in bad:
        out.add(
            GeometryError,
            "span_not_divisible_by_hash_unit",
            f"{group_name(g)} has span {g.span}, not a multiple of the hash unit H={H} "
            f"({source_words}); {span_words(g, cfg.parallel.kv_shards)}. Choose a prefix_match_unit that "
            f"divides every cacheable span ({[c.span for c in cacheable]}), e.g. "
            f"{reduce(math.gcd, (c.span for c in cacheable))}",
            "cache.prefix_match_unit" if pmu is not None else f"groups[{g.index}].block_size",
            span=g.span,
            hash_block_size=H,
        )
    return H, not bad, []


def partial_hash_hits(cfg: KVGeomConfig, groups: list[GroupGeometry], H: int, hash_ok: bool) -> bool:
    """Partial (fine-grained) hash hits: hybrid coordinator only (vLLM 0.33 `partial_hash_hits_enabled`)."""
    if not (cfg.cache.prefix_caching and len(groups) >= 2 and hash_ok):
        return False
    dcp = cfg.parallel.dcp
    has_mamba = any(g.is_align_mamba and (g.block_size > H if dcp == 1 else g.block_size >= H) for g in groups)
    others_ok = all(g.family in {"full", "mamba"} or g.span == H for g in groups if g.prefix_cacheable)
    return has_mamba and others_ok


def hit_alignment(H: int, L: int, partial: bool) -> int:
    """A: H with partial hash hits, else L."""
    return H if partial else L


def check_compression(groups: list[GroupGeometry], A: int, out: Collector) -> None:
    """A compressed layer (``tokens_per_state > 1``) needs A to be a multiple of its compression."""
    for g in groups:
        for j, leaf in enumerate(iter_leaves(g.spec)):
            tps = tokens_per_state_of(leaf)
            if tps is not None and tps > 1 and A % tps:
                field = f"groups[{g.index}]" + (f".layers[{j}]" if isinstance(g.spec, UniformSpec) else "")
                out.add(
                    GeometryError,
                    "hit_alignment_not_multiple_of_compression",
                    f"{group_name(g)} compresses tokens_per_state={tps} tokens per state, but prefix-cache hits "
                    f"land on multiples of A={A}; a hit boundary would split a state. Make the spans multiples of "
                    f"{tps}",
                    f"{field}.tokens_per_state",
                    tokens_per_state=tps,
                    hit_alignment_tokens=A,
                )


def check_retention(cfg: KVGeomConfig, groups: list[GroupGeometry], L: int, out: Collector) -> None:
    """Retention interval (vLLM 0.33 `_validate_prefix_cache_retention_interval`): checked by every coordinator."""
    R = cfg.cache.retention_interval
    if R is None or R == 0:
        return
    if not any(g.family in {"sliding", "mamba"} for g in groups):
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
