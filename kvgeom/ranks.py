"""How DCP deals a sharded group's token positions to ranks (vLLM 0.33 `BlockTable.compute_slot_mapping`).

For a DCP-sharded group with per-rank block ``B``, ``D`` ranks and interleave
``I``, a block id stands for ``S = B*D`` positions. Position *p* sits in
block-table column ``p // S`` at offset ``o = p % S``; its owner is rank
``(o // I) % D`` and its offset inside that rank's page is
``(o // (I*D)) * I + o % I``. ``I = 1`` deals tokens round robin, ``I = B``
deals whole per-rank blocks. Replicated groups (Mamba, replicated drafts,
sliding windows under DCP) are not dealt: every rank holds every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from kvgeom._check import nonneg, result
from kvgeom._format import show
from kvgeom.errors import QueryError
from kvgeom.geometry import Geometry, GroupGeometry

__all__ = ["Placement", "dcp_placement", "dcp_slot", "rank_lengths", "slot_mapped_group"]


class Placement(NamedTuple):
    """Where one position of a group lives: block-table ``column``, owning ``rank``
    (``None`` when every rank holds it) and ``offset`` inside that rank's page."""

    column: int
    rank: int | None
    offset: int


def dcp_placement(geom: Geometry, group: int, position: int) -> Placement:
    """Column, owning rank and in-page offset of ``position`` in ``group``.

    Postconditions: ``0 <= offset < block_size``; for a dealt group
    ``column * span <= position < (column+1) * span`` and exactly one rank owns
    the position.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> dcp_placement(g, 0, 37)
    Placement(column=1, rank=1, offset=2)
    >>> dcp_placement(g, 1, 37)
    Placement(column=2, rank=None, offset=5)
    """
    g = geom.group(group)
    p = nonneg("position", position)
    shards = geom.kv_shards
    if not g.dealt:
        return Placement(p // g.block_size, None, p % g.block_size)
    interleave = geom.config.parallel.cp_interleave
    o = p % g.span
    rank = (o // interleave) % shards
    return Placement(p // g.span, rank, (o // (interleave * shards)) * interleave + o % interleave)


def slot_mapped_group(geom: Geometry, group: int) -> GroupGeometry:
    """``group``'s geometry when it has a slot mapping; :class:`QueryError` ``no_slot_mapping`` for Mamba,
    whose block table is a list of state indices."""
    g = geom.group(group)
    if g.family == "mamba":
        raise QueryError.single(
            "no_slot_mapping",
            f"group {group} (mamba) has no slot mapping: its block table is a list of state indices; use "
            "kvgeom.boundaries for Mamba state blocks",
            "group",
            group=group,
        )
    return g


def dcp_slot(geom: Geometry, group: int, position: int, block_row: Sequence[int]) -> tuple[int | None, int]:
    """``(rank, slot)`` of ``position`` given the request's block-table row: slot = ``row[column]*B + offset``.

    Other ranks write a pad slot for a dealt position. Align-mode and other
    Mamba groups have no slot mapping (their table holds state indices).

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> dcp_slot(g, 0, 37, [7, 9, 11]), dcp_slot(g, 0, 53, [7, 9, 11])
    ((1, 146), (1, 154))
    """
    g = slot_mapped_group(geom, group)
    col, rank, offset = dcp_placement(geom, group, position)
    if isinstance(block_row, str | bytes) or not (
        isinstance(block_row, Sequence) or (isinstance(block_row, np.ndarray) and block_row.ndim == 1)
    ):
        raise QueryError.single(
            "bad_block_row",
            f"block_row must be a list of block ids (one request's block-table row), got {type(block_row).__name__}",
            "block_row",
        )
    if col >= len(block_row):
        raise QueryError.single(
            "row_too_short",
            f"position {show(position)} needs block-table column {col}, but the row has {len(block_row)} entries",
            "block_row",
            column=col,
            row_length=len(block_row),
        )
    return rank, result("slot", nonneg("block_row entry", block_row[col]) * g.block_size + offset)


#: Most ranks :func:`rank_lengths` lists (one entry each); a geometry dealt over more is refused with
#: ``result_too_large`` rather than building a tuple that size.
MAX_RANKS_LISTED = 1 << 16


def rank_lengths(geom: Geometry, group: int, num_tokens: int) -> tuple[int, ...]:
    """Tokens each rank holds for a sequence of ``num_tokens`` (one entry per KV shard; at most
    :data:`MAX_RANKS_LISTED` ranks, else :class:`QueryError` ``result_too_large``).

    Dealt group: ``rounds*I + min(max(rem - r*I, 0), I)`` with
    ``rounds, rem = divmod(n, D*I)``; the lengths sum to ``n``. Replicated
    group: every rank holds all ``n``.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> rank_lengths(g, 0, 37), rank_lengths(g, 1, 37)
    ((19, 18), (37, 37))
    """
    g = geom.group(group)
    n = nonneg("num_tokens", num_tokens)
    shards = geom.kv_shards
    if shards > MAX_RANKS_LISTED:
        raise QueryError.single(
            "result_too_large",
            f"this geometry deals KV over {shards} ranks; rank_lengths lists at most {MAX_RANKS_LISTED} (one "
            "entry per rank); use dcp_placement for single positions",
            "num_tokens",
            shards=shards,
            limit=MAX_RANKS_LISTED,
        )
    if not g.dealt:
        return (n,) * shards
    interleave = geom.config.parallel.cp_interleave
    rounds, rem = divmod(n, shards * interleave)
    return tuple(rounds * interleave + min(max(rem - r * interleave, 0), interleave) for r in range(shards))
