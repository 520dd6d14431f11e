"""Stores and requests shared by the lazy-lookup laws (test_probe_laws.py) and the resident batch laws."""

from __future__ import annotations

import enum

import numpy as np
from hypothesis import strategies as st


class LookupResult(enum.Enum):
    """The shape of vLLM's ``kv_offload.base.LookupResult`` (names are what kvgeom reads)."""

    MISS = 1
    HIT = 2
    HIT_PENDING = 3
    RETRY = 4


class Manager:
    """An object with the offload manager's ``lookup(key, req_context)``, over a set of key bytes."""

    def __init__(self, keys):
        self.keys = keys
        self.asked = []

    def lookup(self, key, req_context):
        self.asked.append(key)
        return LookupResult.HIT if key in self.keys else LookupResult.MISS


@st.composite
def requests(draw, geom, *, chunk_grid_only=False):
    """(num_tokens, local, prompt, max_load, max_new, {group: sorted end tokens})."""
    H = geom.hash_block_size
    top = max(og.tokens_per_chunk for og in geom.offload.groups) * 8 + 3 * H
    n = draw(st.integers(0, top))
    local = draw(st.integers(0, n)) if draw(st.integers(0, 3)) == 0 else 0
    prompt = draw(st.integers(0, n)) if draw(st.booleans()) else n
    mlt = draw(st.none() | st.integers(0, top))
    mnn = draw(st.none() | st.integers(0, top))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    stored = {}
    for og in geom.offload.groups:
        if not draw(st.integers(0, 5)):
            continue
        unit = og.tokens_per_chunk if chunk_grid_only else H
        ends = np.arange(unit, top + 2 * unit, unit)
        cut = rng.integers(0, top + 1)
        density = rng.choice([0.0, 0.3, 0.75, 1.0])
        on_chunks = ends % og.tokens_per_chunk == 0
        keep = ((ends <= cut) & on_chunks) | (rng.random(ends.size) < density)
        stored[og.index] = [int(e) for e in ends[keep]]
    return n, local, prompt, mlt, mnn, stored


def chain_of(geom, n, salt=b""):
    """A request's hash chain: n // H distinct bytes hashes (16 bytes each, the size of vLLM's xxhash)."""
    return [(i.to_bytes(8, "big") + b"h" + salt).ljust(16, b".") for i in range(n // geom.hash_block_size)]
