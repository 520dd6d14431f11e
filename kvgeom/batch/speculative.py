"""Batch twins of the speculative-decoding rules of :mod:`kvgeom.speculative` (one entry per request).

Each helper mirrors a scalar helper of :mod:`kvgeom.speculative` and is called from the batch lookup and
store paths of :mod:`kvgeom.batch`; ``tests/property/test_batch_agrees_with_scalar.py`` checks that the
batch and scalar answers agree element by element under speculation too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvgeom.geometry import Geometry, OffloadGroupGeometry

if TYPE_CHECKING:
    from kvgeom.batch import I64, Bools

__all__ = ["eagle_pair_held", "partial_tail_top", "store_holdback"]


class _PairView:
    """A held-key view (see ``kvgeom.batch._lookup_views``) in which chunk ``j`` reads as held iff chunks
    ``j`` and ``j + 1`` are both held; keys by hash index read through unchanged."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.chunks = view.chunks

    def __call__(self, rows: I64, chunks: I64) -> Bools:
        out: Bools = self.view(rows, chunks) & self.view(rows, chunks + 1)
        return out

    def hashes(self, rows: I64, cols: I64) -> Bools:
        out: Bools = self.view.hashes(rows, cols)
        return out


def eagle_pair_held(view: Any) -> Any:
    """:func:`kvgeom.speculative.eagle_pair_held` for a held-key view: chunk ``j`` reads as held iff chunks
    ``j`` and ``j + 1`` are both held (the scan's start keeps ``j + 1`` inside the queried range)."""
    return _PairView(view)


def store_holdback(
    og: OffloadGroupGeometry, storable: I64, offloadable: I64, prompt: I64, finished: Bools
) -> I64:
    """:func:`kvgeom.speculative.store_holdback_chunks` for many requests: an eagle group's last offloadable
    chunk is not stored while the request decodes and has not finished."""
    if not og.eagle_group:
        return storable
    held_back = np.maximum(offloadable // og.tokens_per_chunk - 1, 0)
    return np.where((offloadable > prompt) & ~finished, np.minimum(storable, held_back), storable)


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
