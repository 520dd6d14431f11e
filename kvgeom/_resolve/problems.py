"""The problem collector of :func:`kvgeom.resolve` and the words its messages share.

Invariants: every rule a config breaks is collected, in the order the pipeline checks them, and
reported at once (:meth:`Collector.raise_if_any`); the error class is the problems' common class, or
:class:`kvgeom.GeometryError` when they differ. Message text is part of the public contract (golden
files compare it byte for byte).
"""

from __future__ import annotations

from typing import Any

from kvgeom.config import KVGeomConfig
from kvgeom.errors import GeometryError, KVGeomError, Problem
from kvgeom.geometry import GroupGeometry

__all__ = ["Collector", "group_name", "shard_words", "span_words"]


class Collector:
    """Problems found so far, each tagged with the error class it belongs to."""

    def __init__(self) -> None:
        self.items: list[tuple[type[KVGeomError], Problem]] = []

    def add(self, cls: type[KVGeomError], code: str, message: str, field: str = "", **values: Any) -> None:
        self.items.append((cls, Problem(code, message, field, values)))

    def extend(self, cls: type[KVGeomError], problems: list[Problem]) -> None:
        self.items.extend((cls, p) for p in problems)

    def raise_if_any(self) -> None:
        if not self.items:
            return
        classes = {cls for cls, _ in self.items}
        cls = classes.pop() if len(classes) == 1 else GeometryError
        raise cls([p for _, p in self.items])


def span_words(g: GroupGeometry, shards: int) -> str:
    """Why a group has its span, for a message (sharded, replicated, or its own block size)."""
    if g.dcp_sharded and shards > 1:
        return (
            f"the group is DCP-sharded, so its span is block_size*kv_shards = {g.block_size}*{shards} = {g.span}"
        )
    if g.dcp_sharded:
        return f"its span is its block_size {g.span}"
    return f"the group is replicated across DCP ranks, so its span is its block_size {g.span}"


def group_name(g: GroupGeometry) -> str:
    """``group 0 (full_attention)``: how every message names a group."""
    return f"group {g.index} ({g.kind})"


def shard_words(cfg: KVGeomConfig) -> str:
    """How the KV shards come about: ``dcp=2``, or ``dcp=2 x pcp=2`` in the pre-#46570 design."""
    p = cfg.parallel
    return f"dcp={p.dcp} x pcp={p.pcp}, pcp_shards_kv" if p.kv_shards != p.dcp else f"dcp={p.dcp}"
