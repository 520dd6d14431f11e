"""The offloading connector's geometry (vLLM 0.33 ``build_offloading_config``,
``SchedulerOffloadConfig.from_spec``): which groups it offloads, the chunk factor k, each group's chunk
and window in chunks, the alignment, the Mamba chunk grid, the retention checks and partial tails.

Invariants (property-tested in ``tests/property``):

* the offloaded groups are exactly the prefix-cacheable ones, and none is cross-attention;
* ``tokens_per_chunk = S_g * k`` and ``hashes_per_chunk = S_g * k / H``, with H dividing every span;
* ``window_chunks`` is None for full attention, 1 for Mamba, and the chunks a windowed group's
  ``window_need`` covers otherwise;
* partial tails need k = 1, one common span, an align Mamba group with span > H, no sliding or
  chunked-local group and DCP 1.
"""

from __future__ import annotations

import math

from kvgeom._math import cdiv
from kvgeom._resolve.problems import Collector, group_name, span_words
from kvgeom.config import KVGeomConfig
from kvgeom.errors import OffloadConfigError
from kvgeom.geometry import GeometryWarning, GroupGeometry, OffloadGeometry, OffloadGroupGeometry

__all__ = ["partial_tail_shape", "resolve_offload_geometry", "window_chunks"]


def window_chunks(g: GroupGeometry, chunk: int) -> int | None:
    """Chunks a lookup needs ending at the hit (``get_sliding_window_size_in_chunks``; first layer decides).

    Sliding window ``max(cdiv(sw, C), cdiv(sw - 1 + extra, C))``, chunked local
    ``cdiv(attention_chunk_size, C)``, Mamba 1, full attention None (unbounded); read from the group's
    ``gpu_window_need`` (``sw - 1``, ``attention_chunk_size - 1``) and ``window_need``.
    """
    match g.family:
        case "sliding" if g.window_need is not None and g.gpu_window_need is not None:
            return max(cdiv(g.gpu_window_need + 1, chunk), cdiv(g.window_need, chunk))
        case "chunked" if g.window_need is not None:
            return cdiv(g.window_need + 1, chunk)
        case _:
            return 1 if g.family == "mamba" else None


def _why_h_is_l(cfg: KVGeomConfig, groups: list[GroupGeometry]) -> str:
    if any(x.mamba_mode in {"none", "all"} for x in groups):
        return "a Mamba group is not in align mode"
    return "prefix caching is off" if not cfg.cache.prefix_caching else "of the group layout"


def _check_selected(
    cfg: KVGeomConfig, groups: list[GroupGeometry], selected: list[GroupGeometry], H: int, L: int, hash_ok: bool,
    out: Collector,
) -> None:
    """No cross-attention group is offloaded, and H divides every offloaded span."""
    for g in selected:
        if g.family == "cross":
            out.add(
                OffloadConfigError,
                "cross_attention_offload",
                f"{group_name(g)} would be offloaded, but cross-attention KV depends on the encoder input, not on "
                "the prefix, and vLLM's connector cannot window it: set prefix_cacheable=false on the group "
                "or remove the offload section",
                f"groups[{g.index}]",
            )
    if not hash_ok:
        return
    for g in selected:
        if g.span % H:
            out.add(
                OffloadConfigError,
                "tokens_per_block_not_divisible",
                f"tokens_per_block={g.span} of {group_name(g)} is not a multiple of tokens_per_hash={H}; "
                f"{span_words(g, cfg.parallel.kv_shards)}. H equals the scheduler block L={L} here because "
                + _why_h_is_l(cfg, groups)
                + ": enable prefix caching with Mamba align mode, or make the spans equal",
                f"groups[{g.index}].block_size",
                tokens_per_block=g.span,
                tokens_per_hash=H,
            )


def _chunk_factor(cfg: KVGeomConfig, selected: list[GroupGeometry], out: Collector) -> int:
    """k: blocks per chunk, from ``blocks_per_chunk`` or ``offload.block_size`` (one common span); 1 by default."""
    assert cfg.offload is not None
    oc = cfg.offload
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
            return oc.block_size // spans[0]
    elif oc.blocks_per_chunk is not None:
        return oc.blocks_per_chunk
    return 1


def _offload_groups(selected: list[GroupGeometry], k: int, H: int) -> list[OffloadGroupGeometry]:
    out = []
    for g in selected:
        chunk = g.span * k
        out.append(
            OffloadGroupGeometry(
                index=g.index,
                tokens_per_block=g.span,
                tokens_per_chunk=chunk,
                hashes_per_chunk=chunk // H,
                window_chunks=None if g.family == "cross" else window_chunks(g, chunk),
            )
        )
    return out


def _alignment(
    groups: list[GroupGeometry], ogroups: list[OffloadGroupGeometry]
) -> tuple[int | None, list[GeometryWarning]]:
    """``alignment_tokens``: the full-attention chunk (None when they differ, with a warning), else the
    largest chunk."""
    full_chunks = [og.tokens_per_chunk for og in ogroups if groups[og.index].family == "full"]
    if not full_chunks:
        return max(og.tokens_per_chunk for og in ogroups), []
    if len(set(full_chunks)) == 1:
        return full_chunks[0], []
    return None, [
        GeometryWarning(
            "alignment_tokens_none",
            f"the full-attention groups have different chunks {full_chunks}, so the connector has no "
            "alignment_tokens and its store masks for sliding-window and non-align Mamba groups fall back "
            "to dense (every block stored); give the full-attention groups one span",
        )
    ]


def _mamba_align(groups: list[GroupGeometry], ogroups: list[OffloadGroupGeometry], out: Collector) -> int | None:
    """``mamba_align_size``: the one chunk of the align/all Mamba groups (refused when they differ)."""
    mamba_chunks = {
        og.index: og.tokens_per_chunk for og in ogroups if groups[og.index].mamba_mode in {"align", "all"}
    }
    if not mamba_chunks:
        return None
    if len(set(mamba_chunks.values())) > 1:
        out.add(
            OffloadConfigError,
            "mamba_chunk_mismatch",
            f"the align-mode Mamba groups have different offload chunks {mamba_chunks} (group: tokens); "
            "a hit must land on one Mamba chunk grid: give every Mamba group the same block_size",
            "groups",
            chunks=mamba_chunks,
        )
    return max(mamba_chunks.values())


def _check_retention(
    cfg: KVGeomConfig, groups: list[GroupGeometry], ogroups: list[OffloadGroupGeometry], out: Collector
) -> None:
    """A retention interval is a multiple of every windowed offloaded group's chunk."""
    R = cfg.cache.retention_interval
    if not R:
        return
    for og in ogroups:
        if groups[og.index].family in {"sliding", "chunked", "mamba"} and R % og.tokens_per_chunk:
            out.add(
                OffloadConfigError,
                "retention_not_multiple_of_chunk",
                f"retention_interval={R} is not a multiple of tokens_per_chunk={og.tokens_per_chunk} of "
                f"{group_name(groups[og.index])}: use a multiple of "
                f"{math.lcm(*(o.tokens_per_chunk for o in ogroups))}",
                "cache.retention_interval",
                retention_interval=R,
                tokens_per_chunk=og.tokens_per_chunk,
            )


def partial_tail_shape(k: int, offloaded: list[GroupGeometry], H: int) -> bool:
    """Every condition of vLLM 0.33's ``supports_partial_tail`` but DCP 1: k = 1, one common span, an
    align-mode Mamba group with span > H, and no windowed group other than Mamba."""
    return (
        k == 1
        and len({g.span for g in offloaded}) == 1
        and any(g.is_align_mamba and g.span > H for g in offloaded)
        and not any(g.family in {"sliding", "chunked"} for g in offloaded)
    )


def resolve_offload_geometry(
    cfg: KVGeomConfig, groups: list[GroupGeometry], H: int, L: int, hash_ok: bool, out: Collector
) -> tuple[OffloadGeometry | None, list[GeometryWarning]]:
    """Offloading connector geometry (vLLM 0.33 `build_offloading_config`, `SchedulerOffloadConfig.from_spec`),
    or None without an offload section or an offloadable group; problems go to ``out``."""
    if cfg.offload is None:
        return None, []
    selected = [g for g in groups if g.prefix_cacheable]
    if not selected:
        out.add(
            OffloadConfigError,
            "no_offloadable_groups",
            "offloading is configured but no group is prefix-cacheable, so there is nothing to offload: "
            "remove the offload section or mark a group prefix_cacheable",
            "offload",
        )
        return None, []
    _check_selected(cfg, groups, selected, H, L, hash_ok, out)
    k = _chunk_factor(cfg, selected, out)
    ogroups = _offload_groups(selected, k, H)
    alignment, warnings = _alignment(groups, ogroups)
    mamba_align = _mamba_align(groups, ogroups, out)
    _check_retention(cfg, groups, ogroups, out)
    offload = OffloadGeometry(
        blocks_per_chunk=k,
        tokens_per_hash=H,
        alignment_tokens=alignment,
        mamba_align_size=mamba_align,
        retention_interval=cfg.cache.retention_interval,
        supports_partial_tail=partial_tail_shape(k, selected, H) and cfg.parallel.dcp == 1,
        groups=tuple(ogroups),
    )
    return offload, warnings
