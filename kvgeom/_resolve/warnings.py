"""Legal but likely unintended geometry: the warnings :func:`kvgeom.resolve` attaches, one small
function per family (issues users have reported, e.g. LMCache #4809).

Invariant: a warning never changes a resolved number; :func:`geometry_warnings` returns them in a
fixed order (scheduler block, hit floor, offload, retention, chunked local, legacy Mamba mode) that the
golden files pin.
"""

from __future__ import annotations

from kvgeom._resolve.offload import partial_tail_shape
from kvgeom._resolve.problems import group_name
from kvgeom.config import KVGeomConfig
from kvgeom.geometry import GeometryWarning, GroupGeometry, OffloadGeometry

__all__ = ["geometry_warnings"]

_RETENTION_UNREACHABLE = (
    "retention_interval={R} exceeds max_model_len={mml}: no periodic Mamba checkpoint is ever "
    "kept, only replay boundaries; use a smaller interval or 0"
)


def _lcm_blowup(groups: list[GroupGeometry], L: int, A: int) -> list[GeometryWarning]:
    spans = [g.span for g in groups]
    if not (len(groups) > 1 and max(spans) < L):
        return []
    return [
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
    ]


def _hit_floor(cfg: KVGeomConfig, groups: list[GroupGeometry], A: int) -> list[GeometryWarning]:
    smallest = min(g.span for g in groups if g.prefix_cacheable) if any(g.prefix_cacheable for g in groups) else A
    if not (cfg.cache.prefix_caching and 8 * smallest <= A):
        return []
    return [
        GeometryWarning(
            "hit_floor",
            f"prefix-cache hits land on multiples of A={A} tokens, {A // smallest}x the smallest span "
            f"{smallest}: prompts sharing fewer than {A} tokens get no hit (vllm-ascend #16270); consider a "
            "smaller block size or a prefix_match_unit",
        )
    ]


def _offload_chunk_too_long(cfg: KVGeomConfig, offload: OffloadGeometry) -> list[GeometryWarning]:
    mml = cfg.cache.max_model_len
    big = [og for og in offload.groups if mml is not None and og.tokens_per_chunk > mml]
    if not big:
        return []
    return [
        GeometryWarning(
            "offload_chunk_exceeds_max_model_len",
            f"offload chunks {[og.tokens_per_chunk for og in big]} of groups {[og.index for og in big]} "
            f"exceed max_model_len={mml}: no request can ever store a complete chunk; lower "
            "blocks_per_chunk",
        )
    ]


def _partial_tails_off(
    cfg: KVGeomConfig, groups: list[GroupGeometry], H: int, offload: OffloadGeometry
) -> list[GeometryWarning]:
    offloaded = [groups[og.index] for og in offload.groups]
    if not (cfg.parallel.dcp > 1 and partial_tail_shape(offload.blocks_per_chunk, offloaded, H)):
        return []
    return [
        GeometryWarning(
            "partial_tails_disabled_by_dcp",
            f"dcp={cfg.parallel.dcp} alone turns sub-chunk (partial-tail) offload hits off (vLLM 0.33 "
            f"SchedulerOffloadConfig.from_spec; #57216 proposes lifting it): offload hits land on multiples "
            f"of the Mamba chunk {offload.mamba_align_size} tokens where dcp=1 would allow multiples of "
            f"H={H}; run at dcp=1 for the finer hits",
        )
    ]


def _offload_retention(cfg: KVGeomConfig, offload: OffloadGeometry) -> list[GeometryWarning]:
    R, mml = offload.retention_interval, cfg.cache.max_model_len
    if R and mml is not None and mml < R and offload.mamba_align_size is not None:
        return [GeometryWarning("retention_unreachable", _RETENTION_UNREACHABLE.format(R=R, mml=mml))]
    return []


def _offload_hit_floor(groups: list[GroupGeometry], offload: OffloadGeometry) -> list[GeometryWarning]:
    # The offload tier loads only complete full-attention chunks (vLLM 0.33 `_lookup_complete_chunks`): a chunk much
    # larger than the smallest span is an offload hit floor (Kimi-K3 at DCP 8: 12288 vs 1536, #55168).
    full_chunks = [og.tokens_per_chunk for og in offload.groups if groups[og.index].family == "full"]
    if not (full_chunks and 8 * min(og.tokens_per_block for og in offload.groups) <= max(full_chunks)):
        return []
    floor = max(full_chunks)
    return [
        GeometryWarning(
            "offload_hit_floor",
            f"the offload tier loads only complete full-attention chunks of {floor} tokens, "
            f"{floor // min(og.tokens_per_block for og in offload.groups)}x the smallest span: prompts "
            f"sharing fewer than {floor} tokens never load from it; lower blocks_per_chunk, the "
            "attention block_size or dcp",
        )
    ]


def _gpu_retention(
    cfg: KVGeomConfig, groups: list[GroupGeometry], offload: OffloadGeometry | None
) -> list[GeometryWarning]:
    # Same rule as with offloading: the GPU prefix cache thins Mamba states by the same interval.
    R, mml = cfg.cache.retention_interval, cfg.cache.max_model_len
    if offload is None and R and mml is not None and mml < R and any(g.is_align_mamba for g in groups):
        return [GeometryWarning("retention_unreachable", _RETENTION_UNREACHABLE.format(R=R, mml=mml))]
    return []


def _chunked_local_mismatch(cfg: KVGeomConfig, groups: list[GroupGeometry], A: int) -> list[GeometryWarning]:
    if not (cfg.cache.prefix_caching and len(groups) > 1):
        return []
    return [
        GeometryWarning(
            "chunked_local_block_mismatch",
            f"{group_name(g)} has block_size={g.block_size} but prefix-cache hits land on multiples of "
            f"A={A}; vLLM 0.33's chunked-local lookup asserts the two are equal, so the engine crashes "
            "at the first prefix-cache lookup (deviation chunked-local-mixed-blocks): give the group "
            f"block_size={A} or turn prefix caching off",
        )
        for g in groups
        if g.family == "chunked" and g.block_size != A
    ]


def _mamba_all_legacy(groups: list[GroupGeometry]) -> list[GeometryWarning]:
    return [
        GeometryWarning(
            "mamba_mode_all_legacy",
            f"{group_name(g)} uses mamba_cache_mode='all', which vLLM 0.33 rejects; kvgeom models the older "
            "semantics (H = L, Mamba chunk alignment of #51100): use 'align' for current vLLM",
        )
        for g in groups
        if g.mamba_mode == "all"
    ]


def geometry_warnings(
    cfg: KVGeomConfig, groups: list[GroupGeometry], L: int, H: int, A: int, offload: OffloadGeometry | None
) -> list[GeometryWarning]:
    """Legal but likely unintended geometry (issues users have reported, e.g. LMCache #4809), in order."""
    out = [*_lcm_blowup(groups, L, A), *_hit_floor(cfg, groups, A)]
    if offload is not None:
        out += _offload_chunk_too_long(cfg, offload)
        out += _partial_tails_off(cfg, groups, H, offload)
        out += _offload_retention(cfg, offload)
        out += _offload_hit_floor(groups, offload)
    out += _gpu_retention(cfg, groups, offload)
    out += _chunked_local_mismatch(cfg, groups, A)
    out += _mamba_all_legacy(groups)
    return out
