"""Batch twins of the speculative-decoding rules of :mod:`kvgeom.speculative` (one entry per request).

Each helper mirrors a scalar helper of :mod:`kvgeom.speculative` and is called from the batch lookup and
store paths of :mod:`kvgeom.batch`; ``tests/property/test_batch_agrees_with_scalar.py`` checks that the
batch and scalar answers agree element by element under speculation too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvgeom.geometry import Geometry, OffloadGroupGeometry

if TYPE_CHECKING:
    from kvgeom.batch import I64, Bools, _Held

__all__ = ["eagle_pair_held", "mamba_store_points", "partial_tail_top", "store_holdback"]


def eagle_pair_held(hc: _Held) -> _Held:
    """:func:`kvgeom.speculative.eagle_pair_held` for a stored matrix: chunk ``j`` reads as held iff chunks
    ``j`` and ``j + 1`` are both held (the scan's start keeps ``j + 1`` inside the queried range)."""
    from kvgeom.batch import _Held

    width, hpc = hc.width, hc.hpc
    flat = hc.flat.reshape(-1, width) if width else np.zeros((0, 0), dtype=np.bool_)
    rows = flat.shape[0] if width else 0
    out = np.zeros((rows, width), dtype=np.bool_)
    if hc.chunks >= 2:
        cols = (np.arange(hc.chunks - 1, dtype=np.int64) + 1) * hpc - 1
        out[:, cols] = flat[:, cols] & flat[:, cols + hpc]
    return _Held(out, hpc)


def store_holdback(
    og: OffloadGroupGeometry, storable: I64, offloadable: I64, prompt: I64, finished: Bools
) -> I64:
    """:func:`kvgeom.speculative.store_holdback_chunks` for many requests: an eagle group's last offloadable
    chunk is not stored while the request decodes and has not finished."""
    if not og.eagle_group:
        return storable
    held_back = np.maximum(offloadable // og.tokens_per_chunk - 1, 0)
    return np.where((offloadable > prompt) & ~finished, np.minimum(storable, held_back), storable)


def mamba_store_points(geom: Geometry, prompt: I64) -> I64 | None:
    """:func:`kvgeom.speculative.mamba_store_boundary` for many prompts, as a one-column ``reachable`` matrix
    (``-1`` for an empty prompt); None when speculation moves no checkpoint."""
    sg = geom.speculative
    if sg is None or not (sg.gpu_drop or sg.lookahead_hashes) or not any(g.is_align_mamba for g in geom.groups):
        return None
    A = geom.hit_alignment_tokens
    if sg.gpu_drop:
        pos = np.maximum(prompt - prompt % A - A, 0)
    else:
        t = prompt - max(1, sg.prefill_lookahead_tokens)
        pos = np.maximum(t - t % A, 0)
    return np.where(prompt > 0, pos, -1)[:, None]


def partial_tail_top(geom: Geometry, n: I64, prompt: I64, done: I64, limit: I64) -> I64:
    """:func:`kvgeom.speculative.partial_tail_max_boundary` for many requests."""
    off = geom.offload
    assert off is not None
    H = geom.hash_block_size
    span = off.groups[0].tokens_per_block
    margin = max((og.proof_margin or 0 for og in off.groups), default=0)
    reach = (2 if margin else 1) * span - 1
    top = done + np.minimum(np.minimum(prompt - 1 - done, reach), limit - done)
    if margin:
        top = np.minimum(top, n - n % H - margin)
    top = np.maximum(top, 0)
    return np.where(prompt > 0, top - top % H, 0)
