"""Batch twins of :mod:`kvgeom.boundaries`: align Mamba state boundaries of many token counts at once.

``state_block_for_boundary``, ``restore_read_block``, ``running_state_block``, ``is_restorable``,
``max_restorable_tokens`` -> same names, element by element
(``tests/property/test_batch_agrees_with_scalar.py``). Every twin refuses a group that is not an
align-mode Mamba group exactly as the scalar does (:func:`kvgeom.boundaries.mamba_group`). Where the
scalar accepts ``computed + scheduled`` past int64 as a Python int, :func:`running_state_block` raises
``int64_overflow`` instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvgeom._math import INT64_MAX
from kvgeom.batch._arrays import I64, Bools, cdiv, div, ints, largest, overflow, positive, rdown, same_length
from kvgeom.boundaries import mamba_chunk_tokens, mamba_group
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry

__all__ = [
    "is_restorable",
    "max_restorable_tokens",
    "restore_read_block",
    "running_state_block",
    "state_block_for_boundary",
]


def state_block_for_boundary(geom: Geometry, group: int, boundaries: Any) -> I64:
    """:func:`kvgeom.boundaries.state_block_for_boundary` per boundary: ``boundary // B_m - 1``.

    Boundaries must be positive multiples of the group's block size.

    >>> import kvgeom
    >>> state_block_for_boundary(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [16, 64]).tolist()
    [0, 3]
    """
    g = mamba_group(geom, group)
    b = positive("boundary", boundaries)
    q, r = np.divmod(b, g.block_size)
    if r.any():
        bad = int(b[np.argmax(r != 0)])
        raise QueryError.single(
            "not_a_state_boundary",
            f"boundary={bad} is not a multiple of group {group}'s Mamba block_size={g.block_size}; no state "
            "block holds it",
            "boundary",
            boundary=bad,
            block_size=g.block_size,
        )
    return q - 1


def restore_read_block(geom: Geometry, group: int, num_computed_tokens: Any) -> I64:
    """:func:`kvgeom.boundaries.restore_read_block` per token count (> 0): ``(N - 1) // B_m``.

    >>> import kvgeom
    >>> restore_read_block(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [1, 64, 65]).tolist()
    [0, 3, 4]
    """
    g = mamba_group(geom, group)
    n = positive("num_computed_tokens", num_computed_tokens)
    return div(n - 1, g.block_size)


def running_state_block(geom: Geometry, group: int, num_computed_tokens: Any, num_scheduled_tokens: Any) -> I64:
    """:func:`kvgeom.boundaries.running_state_block` per step: ``cdiv(computed + scheduled, B_m) - 1``.

    The total must be positive and fit int64 (the scalar accepts a total past
    int64 as a Python int; a token count that large is refused here).

    >>> import kvgeom
    >>> running_state_block(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [32, 0], [5, 1]).tolist()
    [2, 0]
    """
    g = mamba_group(geom, group)
    a = ints("num_computed_tokens", num_computed_tokens)
    s = ints("num_scheduled_tokens", num_scheduled_tokens)
    same_length("num_scheduled_tokens", s, a.shape[0])
    if a.size and largest(a) + largest(s) > INT64_MAX:
        over = s > INT64_MAX - a
        if over.any():
            i = int(np.argmax(over))
            raise overflow("num_computed_tokens + num_scheduled_tokens", int(a[i]) + int(s[i]))
    total = a + s
    if total.size and int(total.min()) == 0:
        raise QueryError.single("zero", "a step with no tokens has no running state", "num_scheduled_tokens")
    return cdiv(total, g.block_size) - 1


def is_restorable(geom: Geometry, group: int, num_tokens: Any, *, partial_tail: bool = False) -> Bools:
    """:func:`kvgeom.boundaries.is_restorable` per token count.

    >>> import kvgeom
    >>> is_restorable(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [0, 40, 48]).tolist()
    [False, False, True]
    """
    mamba_group(geom, group)
    chunk = mamba_chunk_tokens(geom, group)
    n = ints("num_tokens", num_tokens)
    ok: Bools = (n % chunk) == 0
    if partial_tail and geom.offload is not None and geom.offload.supports_partial_tail:
        ok |= (n % geom.hash_block_size) == 0
    ok &= n != 0
    return ok


def max_restorable_tokens(geom: Geometry, group: int, num_tokens: Any) -> I64:
    """:func:`kvgeom.boundaries.max_restorable_tokens` per token count: ``rdown(n - 1, chunk)`` (0 for 0).

    >>> import kvgeom
    >>> max_restorable_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, [0, 64, 65]).tolist()
    [0, 48, 64]
    """
    mamba_group(geom, group)
    chunk = mamba_chunk_tokens(geom, group)
    n = ints("num_tokens", num_tokens)
    m = np.maximum(n - 1, 0)
    return np.where(n == 0, 0, rdown(m, chunk))
