"""Batch twins of :mod:`kvgeom.masks`: which candidate store chunks survive the reachable-block mask.

:func:`kvgeom.masks.reachable_block_mask` returns a set of blocks per call; the store plan is its only
consumer, so its conditions are evaluated here per candidate chunk, vectorised, for
:func:`kvgeom.batch.plan_stores`: :func:`chunk_kept` filters candidates (a chunk survives when one of
its ``k`` blocks is kept; align Mamba: when its state block is kept), :func:`kept_from_points`
generates the few kept chunks of a retention-0 mask directly from the reachable boundaries, and
:func:`swa_store_horizons` is :func:`kvgeom.masks.swa_store_horizon` per request. The agreement law
compares the resulting store plans with the scalar ones (``tests/property/test_batch_agrees_with_scalar.py``).
"""

from __future__ import annotations

import numpy as np

from kvgeom.batch._arrays import I64, Bools, div, offload_of, rdown
from kvgeom.geometry import Geometry, GroupGeometry, OffloadGroupGeometry
from kvgeom.masks import default_alignment, swa_run

__all__ = ["chunk_kept", "kept_from_points", "swa_store_horizons"]


def swa_store_horizons(
    geom: Geometry, g: GroupGeometry, storable: I64, prompt_chunks: I64, fin: Bools
) -> I64 | None:
    """:func:`kvgeom.masks.swa_store_horizon` per request (-1: no final tail); None when it never applies."""
    if geom.config.cache.retention_interval is not None or g.family != "sliding":
        return None
    og = offload_of(geom).get(g.index)
    if og is not None and og.eagle_group:
        return None  # no store horizon for an EAGLE group
    return np.where(fin, storable, np.where(storable <= prompt_chunks, prompt_chunks, -1))


def kept_from_points(
    geom: Geometry, og: OffloadGroupGeometry, g: GroupGeometry, start: I64, storable: I64, points: I64
) -> tuple[I64, I64] | None:
    """The surviving ``(request, chunk)`` pairs when a mask keeps only reachable boundaries (retention 0).

    Same conditions as :func:`chunk_kept`, but the few kept chunks are generated from the boundaries
    directly instead of filtering every candidate chunk. ``None`` when the mask is dense or has
    periodic (R > 0) terms: the caller filters the candidates then.
    """
    if geom.config.cache.retention_interval != 0 or g.family not in ("mamba", "sliding"):
        return None
    align = default_alignment(geom, og.index)
    span = g.span
    k = offload_of(geom).blocks_per_chunk
    num_blocks = storable * k
    size, width = points.shape
    if not align or (g.family == "sliding" and align % span):
        return None  # dense
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    if width == 0:
        return empty
    base = rdown(np.maximum(points, 0), align)
    lo: I64
    hi: I64
    if g.family == "mamba":
        pblock = base // span - 1  # floored, as the scalar mask
        ok = (points >= 0) & (pblock >= 0) & (pblock < num_blocks[:, None])
        if g.is_align_mamba:  # chunk j holds state block (j+1)*k - 1
            ok &= (pblock + 1) % k == 0
            lo = (pblock + 1) // k - 1
        else:  # chunk j covers blocks [j*k, (j+1)*k)
            lo = np.where(pblock >= 0, pblock // k, -1)
        hi = lo + 1
    else:
        tail, shift = swa_run(geom, og.index, "offload")
        if tail == 0:
            return empty
        stop = np.minimum(base // span + shift, num_blocks[:, None])
        first = np.maximum(base // span + shift - tail, 0)
        ok = (points >= 0) & (first < stop)
        lo = first // k
        hi = (np.maximum(stop, 1) - 1) // k + 1
    lo = np.maximum(lo, start[:, None])
    hi = np.minimum(hi, storable[:, None])
    counts = np.where(ok & (lo < hi), hi - lo, 0).ravel()
    total = int(counts.sum())
    rows = np.repeat(np.repeat(np.arange(size, dtype=np.int64), width), counts)
    offsets = np.cumsum(counts) - counts
    chunk = np.arange(total, dtype=np.int64) - np.repeat(offsets - lo.ravel(), counts)
    if width > 1 and total:
        order = np.lexsort((chunk, rows))
        rows, chunk = rows[order], chunk[order]
        fresh = np.ones(total, dtype=np.bool_)
        fresh[1:] = (rows[1:] != rows[:-1]) | (chunk[1:] != chunk[:-1])
        rows, chunk = rows[fresh], chunk[fresh]
    return rows, chunk


def chunk_kept(
    geom: Geometry,
    og: OffloadGroupGeometry,
    g: GroupGeometry,
    chunk: I64,
    req: I64,
    num_blocks: I64,
    points: I64,
    final_blocks: I64 | None = None,
) -> Bools | None:
    """Which candidate chunks survive :func:`kvgeom.masks.reachable_block_mask` (None: all of them).

    The same conditions as the mask, per chunk: a chunk survives when one of
    its ``k`` blocks is kept (align Mamba: when its state block is kept).
    ``final_blocks`` is the per-request ``final_segment_end_block`` (-1: none).
    """
    R = geom.config.cache.retention_interval
    align = default_alignment(geom, og.index)
    span = g.span
    k = offload_of(geom).blocks_per_chunk
    match g.family:
        case "full" | "chunked" | "cross" | "circular" | "hisparse" | "encoder":
            return None
        case "mamba":
            if R is None or not align or (R and span >= R):
                return None
            if R and R % span:
                return None
            keep = np.zeros(chunk.shape, dtype=np.bool_)
            if g.is_align_mamba:
                # state block (j+1)*k - 1; block b is kept by R when (b+1) % step == 0
                top = (chunk + 1) * k
                if R:
                    keep |= top % (R // span) == 0
            else:
                lo = chunk * k
                if R:
                    step = R // span
                    keep |= (lo + k) // step > lo // step
            if points.shape[1]:
                # per request first: the block each reachable boundary keeps (-1: none), then one gather
                b = rdown(np.maximum(points, 0), align)
                pblock = b // span - 1  # floored, as the scalar mask
                ok = (points >= 0) & (pblock >= 0) & (pblock < num_blocks[:, None])
                pblock = np.where(ok, pblock, -1)
                for col in range(points.shape[1]):
                    pb = pblock[:, col][req]
                    if g.is_align_mamba:
                        keep |= pb == top - 1
                    else:
                        keep |= (pb >= 0) & (div(pb, k) == chunk)
            return keep
        case "sliding":
            if not align or align % span:
                return None
            need, shift = swa_run(geom, og.index, "offload")
            segment = align if R is None else (R or None)
            keep = np.zeros(chunk.shape, dtype=np.bool_)
            lo = chunk * k
            hi = lo + k
            if segment is not None:
                per = segment // span
                if need >= per:
                    return None
                if need == 0:
                    return keep
                # the first block at or after lo among the last `need` blocks of its segment (moved
                # `shift` blocks on under the EAGLE drop: block i >= shift counts as i - shift)
                at = np.maximum(lo, shift) - shift
                r = at % per
                keep |= np.where(r >= per - need, at, at - r + per - need) + shift < hi
                if R is None and final_blocks is not None and not shift:
                    fe = final_blocks[req]
                    part = np.where(fe > 0, fe % per, 0)
                    tail_lo = np.maximum(np.maximum(fe - part, fe - need), lo)
                    tail_hi = np.minimum(np.minimum(num_blocks[req], fe), hi)
                    keep |= (part > 0) & (tail_lo < tail_hi)
            if R is not None and points.shape[1]:
                # per request first: the kept interval [start, stop) of each reachable boundary, then gathers
                end = rdown(np.maximum(points, 0), align) // span + shift
                start = np.maximum(end - need, 0)
                stop = np.where(points >= 0, np.minimum(end, num_blocks[:, None]), 0)
                for col in range(points.shape[1]):
                    keep |= np.maximum(start[:, col][req], lo) < np.minimum(stop[:, col][req], hi)
            return keep
    raise AssertionError(g.family)  # pragma: no cover
