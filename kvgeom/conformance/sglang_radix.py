"""Hit lengths from SGLang 0.5.23's own unified radix cache against :func:`kvgeom.engines.sglang.prefix_hit`.

SGLang ships a test kit (``sglang/test/kits/unified_radix_cache``) that builds a real
``UnifiedRadixCache`` on CPU when its device helper answers ``"cpu"`` (patched here) and SGLang is told
it runs on a CUDA platform (``override_platform(is_cuda=True)``). :func:`radix_hits` inserts token
sequences with the kit's own insert (a full-KV value plus a Mamba state at each insert's end, the
``no_buffer`` layout the kit's Mamba component takes at page size 1) and asks ``match_prefix`` for each
query: the device prefix (for a Mamba hybrid, the Mamba branch point) and the full-KV hit.
:func:`kvgeom_hits` answers the same from kvgeom: the full-KV hit is the longest prefix of the query in
the tree, the checkpoints on its path are the inserted sequences that are prefixes of the query, and
:func:`prefix_hit` does the rest.

Only full + Mamba at page size 1 is compared (the kit's Mamba component needs page size 1 without the
extra buffer; its DCP stand-in is not valid for hit lengths). This module imports SGLang.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from unittest import mock

import sglang.test.kits.unified_radix_cache.fixtures as kit
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.runtime_context import override_platform
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.test.kits.unified_radix_cache.mixins import UnifiedRadixCacheFixtures

from kvgeom.engines.sglang import prefix_hit, resolve_sglang

__all__ = ["kvgeom_hits", "radix_hits"]

Hit = tuple[int, int]
"""(device prefix, full-KV hit). For a Mamba hybrid the device prefix is the Mamba branch point."""


def radix_hits(inserts: Sequence[Sequence[int]], queries: Sequence[Sequence[int]]) -> list[Hit]:
    """SGLang's answers: a fresh full + Mamba cache (page 1), ``inserts`` in order, then each query."""
    with mock.patch.object(kit, "get_device", lambda: "cpu"), override_platform(is_cuda=True):
        cfg = CacheConfig(page_size=1, components=(ComponentType.FULL, ComponentType.MAMBA))
        cache, allocator, req_to_token = kit.build_fixture(cfg)
        helper: Any = UnifiedRadixCacheFixtures.__new__(UnifiedRadixCacheFixtures)
        helper.cfg, helper._rid = cfg, 0
        for tokens in inserts:
            helper._insert(cache, allocator, req_to_token, list(tokens))
        out = []
        for q in queries:
            m = kit.match_prefix(cache, list(q))
            out.append((int(m.device_prefix_len), int(m.full_kv_hit_length)))
        return out


def kvgeom_hits(inserts: Sequence[Sequence[int]], queries: Sequence[Sequence[int]]) -> list[Hit]:
    """kvgeom's answers to the same (:func:`kvgeom.engines.sglang.prefix_hit`, ``no_buffer``, page 1)."""
    geom = resolve_sglang({"page_size": 1, "pools": ["full", "mamba"], "mamba_radix_cache_strategy": "no_buffer",
                           "disable_overlap_schedule": True, "mamba_track_interval": 1})
    out = []
    for q in queries:
        q = list(q)
        matched = 0
        for s in inserts:
            n = 0
            while n < min(len(s), len(q)) and s[n] == q[n]:
                n += 1
            matched = max(matched, n)
        checkpoints = [len(s) for s in inserts if len(s) <= len(q) and list(s) == q[: len(s)]]
        hit = prefix_hit(geom, matched, checkpoints)
        out.append((hit.device_prefix, hit.full_kv_hit))
    return out
