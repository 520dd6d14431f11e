"""Tiers shared by the lookup tables and laws."""

from __future__ import annotations

from typing import Any

from kvgeom.probes import Probe


class UnsureTier(Probe):
    """A tier that answers only HIT or MISS but says it may answer otherwise (``unsettled`` from the start), so
    :func:`kvgeom.hits.lookup_hit` also walks it by vLLM's rules for pending answers (``_lookup_unsettled``)."""

    def __init__(self, inner: Probe) -> None:
        super().__init__(None)
        self.inner = inner
        self.unsettled = True

    def contains(self, group: int, end_token: int) -> Any:
        return self.inner.contains(group, end_token)
