"""Batch twins of :mod:`kvgeom.handoff` (one entry per request): the align Mamba states and partial tails a
prefill hands the offload connector.

The hand-off is a handful of positions per prompt, decided by the prompt, the computed tokens and the
prefill's chunk ends; each distinct combination is answered once by the scalar rule and scattered back, so
``tests/property/test_batch_agrees_with_scalar.py`` compares the batch store plans with the scalar ones
element by element. :func:`partial_tail_top` is the closed form of the highest partial-tail boundary a
batch lookup probes (:func:`kvgeom.speculative.partial_tail_max_boundary`), per request.
"""

from __future__ import annotations

import numpy as np

from kvgeom.batch._arrays import I64, Bools
from kvgeom.geometry import Geometry
from kvgeom.handoff import handed_over_tokens, mamba_handoffs, partial_tail_boundary

__all__ = ["handed_over", "mamba_handoff_matrix", "partial_tail_boundaries", "partial_tail_top"]


def handed_over(geom: Geometry, group: int, prompt: I64, computed: I64) -> I64:
    """:func:`kvgeom.handoff.handed_over_tokens` per request (``-1``: None), each distinct ``(prompt, computed)``
    answered once."""
    pairs, inverse = np.unique(np.stack([prompt, computed], axis=1), axis=0, return_inverse=True)
    answers = [handed_over_tokens(geom, group, int(p), int(c)) for p, c in pairs]
    return np.array([-1 if a is None else a for a in answers], dtype=np.int64)[inverse.reshape(prompt.shape)]


def _row(m: I64 | None, i: int) -> tuple[int, ...] | None:
    return None if m is None else tuple(int(e) for e in m[i] if e >= 0)


def mamba_handoff_matrix(
    geom: Geometry,
    group: int,
    prompt: I64,
    computed: I64,
    chunk_ends: I64 | None,
    reachable: I64 | None,
    above: I64,
    upto: I64,
) -> I64:
    """:func:`kvgeom.handoff.mamba_handoffs` per request as a ``-1``-padded matrix (``chunk_ends`` /
    ``reachable``: ``-1``-padded rows, or None for the scalar defaults; keys in ``(above, upto]``)."""
    memo: dict[tuple[object, ...], tuple[int, ...]] = {}
    rows: list[tuple[int, ...]] = []
    for i in range(prompt.shape[0]):
        p, c = int(prompt[i]), int(computed[i])
        ends, points = _row(chunk_ends, i), _row(reachable, i)
        lo, hi = int(above[i]), int(upto[i])
        key = (p, min(c, p), ends, points, lo, hi)
        if key not in memo:
            memo[key] = mamba_handoffs(geom, group, p, c, ends, reachable=points, above=lo, upto=hi) if p else ()
        rows.append(memo[key])
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), max(width, 1)), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def partial_tail_boundaries(
    geom: Geometry,
    prompt: I64,
    computed: I64,
    chunk_ends: I64 | None,
    loaded_from_offload: Bools,
    max_offload_tokens: I64 | None,
) -> I64:
    """:func:`kvgeom.handoff.partial_tail_boundary` per request (``-1``: none)."""
    off = geom.offload
    out = np.full(prompt.shape[0], -1, dtype=np.int64)
    if off is None or not off.supports_partial_tail:
        return out
    memo: dict[tuple[object, ...], int | None] = {}
    for i in range(prompt.shape[0]):
        limit = None if max_offload_tokens is None else int(max_offload_tokens[i])
        key = (int(prompt[i]), int(computed[i]), _row(chunk_ends, i), bool(loaded_from_offload[i]), limit)
        if key not in memo:
            memo[key] = partial_tail_boundary(
                geom, key[0], key[1], key[2], loaded_from_offload=key[3], max_offload_tokens=limit
            )
        t = memo[key]
        out[i] = -1 if t is None else t
    return out


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
