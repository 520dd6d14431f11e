"""Mamba state boundaries: which state block holds which prefix, and which hits are exact.

In align mode Mamba block *i* of a request holds the recurrent state after
exactly ``(i+1) * B_m`` tokens (vLLM 0.33 `MambaManager`; ``docs/keys-and-boundaries.md``). A request that starts with
``N`` computed tokens reads its initial state from block ``(N - 1) // B_m``, so a
restore of N tokens is correct only when that block holds the state after
exactly N tokens: N must be a multiple of the Mamba chunk (or an exact
partial-tail boundary). Mamba is replicated, so none of this depends on DCP:
``B_m`` is the group's own block size, never ``block_size * dcp`` (#49964).
"""

from __future__ import annotations

from kvgeom._check import nonneg, positive, result
from kvgeom._math import cdiv, rdown
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry

__all__ = [
    "is_restorable",
    "mamba_chunk_tokens",
    "max_restorable_tokens",
    "restore_read_block",
    "running_state_block",
    "state_block_for_boundary",
]


def mamba_group(geom: Geometry, group: int) -> GroupGeometry:
    """Group ``group`` when it is an align-mode Mamba group (the only groups with state boundaries), else the
    :class:`kvgeom.QueryError` ``not_align_mamba``; the one check every boundary rule and its batch twin makes."""
    g = geom.group(group)
    if not g.is_align_mamba:
        raise QueryError.single(
            "not_align_mamba",
            f"group {group} ({g.kind}) is not an align-mode Mamba group; state boundaries exist only for "
            "mamba groups with mamba_cache_mode='align'",
            "group",
            group=group,
        )
    return g


def mamba_chunk_tokens(geom: Geometry, group: int) -> int:
    """Tokens between two restorable states of an align-mode Mamba group.

    With offloading it is the group's ``tokens_per_chunk`` (``B_m * k``, the
    connector's ``mamba_align_size``); without, the group's span ``B_m``.

    >>> import kvgeom
    >>> mamba_chunk_tokens(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1)
    16
    """
    g = mamba_group(geom, group)
    if geom.offload is not None:
        return geom.offload.group(group).tokens_per_chunk
    return g.span


def state_block_for_boundary(geom: Geometry, group: int, boundary: int) -> int:
    """The state block that holds the state after exactly ``boundary`` tokens: ``boundary // B_m - 1``.

    Postcondition: ``(result + 1) * B_m == boundary``. ``boundary`` must be a
    positive multiple of the group's block size, else :class:`QueryError`.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> [state_block_for_boundary(g, 1, b) for b in (16, 32, 48, 64)]
    [0, 1, 2, 3]
    """
    g = mamba_group(geom, group)
    b = positive("boundary", boundary)
    if b % g.block_size:
        raise QueryError.single(
            "not_a_state_boundary",
            f"boundary={b} is not a multiple of group {group}'s Mamba block_size={g.block_size}; no state "
            f"block holds it (nearest: {rdown(b, g.block_size)} or {rdown(b, g.block_size) + g.block_size})",
            "boundary",
            boundary=b,
            block_size=g.block_size,
        )
    return b // g.block_size - 1


def restore_read_block(geom: Geometry, group: int, num_computed_tokens: int) -> int:
    """The block a request starting with ``num_computed_tokens`` (> 0) reads its state from: ``(N - 1) // B_m``.

    >>> import kvgeom
    >>> restore_read_block(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, 64)
    3
    """
    g = mamba_group(geom, group)
    n = positive("num_computed_tokens", num_computed_tokens)
    return (n - 1) // g.block_size


def running_state_block(geom: Geometry, group: int, num_computed_tokens: int, num_scheduled_tokens: int) -> int:
    """The block the running state lives in during a step: ``cdiv(computed + scheduled, B_m) - 1``.

    >>> import kvgeom
    >>> running_state_block(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), 1, 32, 5)
    2
    """
    g = mamba_group(geom, group)
    total = result(
        "computed + scheduled tokens",
        nonneg("num_computed_tokens", num_computed_tokens) + nonneg("num_scheduled_tokens", num_scheduled_tokens),
    )
    if total == 0:
        raise QueryError.single("zero", "a step with no tokens has no running state", "num_scheduled_tokens")
    return cdiv(total, g.block_size) - 1


def is_restorable(geom: Geometry, group: int, num_tokens: int, *, partial_tail: bool = False) -> bool:
    """Whether a hit of ``num_tokens`` restores this group's state exactly.

    True iff ``num_tokens > 0`` and either it is a multiple of the Mamba chunk
    (:func:`mamba_chunk_tokens`), or ``partial_tail`` is set, the geometry
    supports partial tails and it is a multiple of the hash unit H (the state
    was copied on write at that boundary, #50507).

    Postcondition: when true, :func:`restore_read_block` is the block of the
    state after exactly ``num_tokens`` tokens (or its copy-on-write copy).

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> is_restorable(g, 1, 48), is_restorable(g, 1, 40)
    (True, False)
    """
    mamba_group(geom, group)
    n = nonneg("num_tokens", num_tokens)
    if n == 0:
        return False
    if n % mamba_chunk_tokens(geom, group) == 0:
        return True
    return bool(
        partial_tail
        and geom.offload is not None
        and geom.offload.supports_partial_tail
        and n % geom.hash_block_size == 0
    )


def max_restorable_tokens(geom: Geometry, group: int, num_tokens: int) -> int:
    """The largest complete-chunk hit a request of ``num_tokens`` can restore: ``rdown(num_tokens - 1, chunk)``.

    A resend never restores the state at ``num_tokens``: the last prompt token
    is always recomputed, so the state it leaves is produced by the model
    (#44599). Postcondition: result < num_tokens (0 when num_tokens is 0) and
    the result is a multiple of :func:`mamba_chunk_tokens`.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> max_restorable_tokens(g, 1, 64), max_restorable_tokens(g, 1, 65)
    (48, 64)
    """
    mamba_group(geom, group)
    n = nonneg("num_tokens", num_tokens)
    if n == 0:
        return 0
    return rdown(n - 1, mamba_chunk_tokens(geom, group))
