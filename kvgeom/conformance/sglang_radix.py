"""Hit lengths from SGLang 0.5.23's own unified radix cache against :func:`kvgeom.engines.sglang.prefix_hit`.

SGLang ships a test kit (``sglang/test/kits/unified_radix_cache``) that builds a real
``UnifiedRadixCache`` on CPU when its device helper answers ``"cpu"`` (patched here) and SGLang is told
it runs on a CUDA platform (``override_platform(is_cuda=True)``). A :class:`Stack` names the pools
(full + Mamba, full + sliding window, or all three), the page size and the window. :func:`radix_hits`
builds that cache, inserts token sequences the way the kit's own insert does (a full-KV value, a Mamba
state at each insert's end when there is a Mamba pool) with, per insert, the tokens whose sliding-window
KV the request had already freed (SGLang's ``swa_evicted_seqlen``), optionally runs SGLang's own
eviction walk on the SWA pool, and asks ``match_prefix`` for each query: the device prefix and the
full-KV hit.

:func:`kvgeom_hits` answers the same from kvgeom alone: on the tree page, the full-KV hit is the longest
prefix of the query the inserts share with it, the checkpoints are the insert ends that are prefixes of
the query, the tombstones come from :func:`kvgeom.engines.sglang.swa_tombstones`, and
:func:`~kvgeom.engines.sglang.prefix_hit` does the rest. After an eviction walk (which kvgeom does not
model: SGLang picks victims by LRU) the residency is read off SGLang's tree instead
(:func:`tree_residency`) and only the hit rule is compared.

The kit's Mamba pool takes page size 1 without the extra buffer and any page size with it; its DCP
stand-in (a tree page size) is not valid for hit lengths, so DCP is 1 here. This module imports SGLang.
"""

from __future__ import annotations

import importlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import sglang.test.kits.unified_radix_cache.fixtures as kit
from hypothesis import strategies as st
from sglang.srt.disaggregation.kv_events import BlockStored, KVEventBatch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
from sglang.srt.runtime_context import override_platform
from sglang.test.kits.unified_radix_cache.config import CacheConfig
from sglang.test.kits.unified_radix_cache.mixins import UnifiedRadixCacheFixtures

from kvgeom.engines.sglang import SGLangGeometry, prefix_hit, resolve_sglang, swa_tombstones

__all__ = ["STACKS", "RadixCase", "Residency", "Stack", "check_case", "event_replica", "kvgeom_hits", "kvgeom_hits_on",
           "radix_cases", "radix_hits", "radix_run", "tree_residency"]

Hit = tuple[int, int]
"""(device prefix, full-KV hit)."""


@dataclass(frozen=True)
class Stack:
    """The pools of one kit cache: ``pools`` among full, swa, mamba (full always), the page size, the
    model's sliding window and a fused draft's SWA read-back (``draft_swa_window``)."""

    pools: tuple[str, ...] = ("full", "mamba")
    page_size: int = 1
    sliding_window_size: int | None = None
    draft_swa_window: int = 0

    def geometry(self) -> SGLangGeometry:
        """kvgeom's geometry of the stack (no_buffer at page 1, extra_buffer above, as the kit builds it)."""
        cfg: dict[str, Any] = {"page_size": self.page_size, "pools": list(self.pools),
                               "sliding_window_size": self.sliding_window_size,
                               "draft_swa_window": self.draft_swa_window}
        if "mamba" in self.pools:
            if self.page_size == 1:
                cfg.update(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True,
                           mamba_track_interval=1)
            else:
                cfg.update(mamba_radix_cache_strategy="extra_buffer", mamba_track_interval=self.page_size,
                           mamba_chunk_size=max(64, self.page_size))
        return resolve_sglang(cfg)

    def cache_config(self, max_tokens: int) -> CacheConfig:
        kinds = {"full": ComponentType.FULL, "swa": ComponentType.SWA, "mamba": ComponentType.MAMBA}
        size = max(1024, 4 * max_tokens + 4 * self.page_size)
        return CacheConfig(
            page_size=self.page_size, components=tuple(kinds[p] for p in ("full", "swa", "mamba") if p in self.pools),
            sliding_window_size=self.sliding_window_size, draft_swa_window=self.draft_swa_window,
            enable_mamba_extra_buffer="mamba" in self.pools and self.page_size > 1, mamba_cache_size=64,
            max_num_reqs=64, kv_size=size, max_context_len=size)


def _insert(helper: Any, cache: Any, allocator: Any, req_to_token: Any, tokens: list[int], evicted: int) -> None:
    """The kit's insert (``UnifiedRadixCacheFixtures._insert``) plus the request's freed SWA prefix."""
    key = RadixKey(array("q", tokens))
    value = helper._alloc(allocator, len(tokens))
    params = InsertParams(key=key, value=value[: len(key)])
    if evicted:
        params.set_evicted_seqlen(ComponentType.SWA, evicted)
    if helper.cfg.has_mamba:
        params.mamba_value = helper._make_req(req_to_token).kv.mamba_pool_idx.unsqueeze(0)
    cache.insert(params)


@dataclass(frozen=True)
class Residency:
    """One query's path in SGLang's tree: the matched full-KV tokens, the depths holding a Mamba
    state, and the token ranges whose SWA value is None (tombstones)."""

    matched: int
    checkpoints: tuple[int, ...]
    tombstones: tuple[tuple[int, int], ...]


def tree_residency(cache: Any, tokens: Sequence[int], page_size: int) -> Residency:
    """Walk SGLang's tree along ``tokens`` (page by page, without matching: a match splits nodes) and read
    each node's full, Mamba and SWA device values."""
    node, depth = cache.root_node_handle(), 0
    checkpoints: list[int] = []
    tombs: list[tuple[int, int]] = []
    q = list(tokens)[: len(tokens) - len(tokens) % page_size]
    while depth < len(q):
        nxt = None
        for child in kit.node_children(cache, node):
            ids = list(kit.node_token_ids(cache, child))
            if ids[:page_size] == q[depth: depth + page_size]:
                nxt, key = child, ids
                break
        if nxt is None or kit.node_device_value(cache, nxt, ComponentType.FULL) is None:
            break
        n = 0
        while n < min(len(key), len(q) - depth) and key[n] == q[depth + n]:
            n += 1
        n -= n % page_size
        if n == 0:
            break
        comps = cache.cache_init_params.tree_components
        if ComponentType.SWA in comps and kit.node_device_value(cache, nxt, ComponentType.SWA) is None:
            tombs.append((depth, depth + n))
        if n < len(key):
            depth += n
            break
        depth += n
        if ComponentType.MAMBA in comps and kit.node_device_value(cache, nxt, ComponentType.MAMBA) is not None:
            checkpoints.append(depth)
        node = nxt
    return Residency(depth, tuple(checkpoints), tuple(tombs))


def radix_hits(
    inserts: Sequence[Sequence[int]], queries: Sequence[Sequence[int]], stack: Stack = Stack(),
    evicted: Sequence[int] | None = None, swa_evict_tokens: int = 0,
) -> list[Hit]:
    """SGLang's answers (see :func:`radix_run`): each query's (device prefix, full-KV hit)."""
    return radix_run(inserts, queries, stack, evicted, swa_evict_tokens)[0]


def radix_run(
    inserts: Sequence[Sequence[int]], queries: Sequence[Sequence[int]], stack: Stack = Stack(),
    evicted: Sequence[int] | None = None, swa_evict_tokens: int = 0,
) -> tuple[list[Hit], list[Residency]]:
    """SGLang's answers: a fresh kit cache of ``stack``, ``inserts`` in order (``evicted[i]`` tokens of
    insert ``i`` already out of the SWA window), then, when ``swa_evict_tokens`` is positive, SGLang's
    eviction walk asked for that many SWA tokens; then each query's hit, and its path residency read
    just before the query."""
    evicted = list(evicted) if evicted is not None else [0] * len(inserts)
    with mock.patch.object(kit, "get_device", lambda: "cpu"), override_platform(is_cuda=True):
        cfg = stack.cache_config(max((len(s) for s in [*inserts, *queries]), default=1) * max(len(inserts), 1))
        cache, allocator, req_to_token = kit.build_fixture(cfg)
        helper: Any = UnifiedRadixCacheFixtures.__new__(UnifiedRadixCacheFixtures)
        helper.cfg, helper._rid = cfg, 0
        for tokens, e in zip(inserts, evicted, strict=True):
            _insert(helper, cache, allocator, req_to_token, list(tokens), e)
        if swa_evict_tokens:
            cache.evict(EvictParams(swa_num_tokens=swa_evict_tokens))
        hits, paths = [], []
        for q in queries:
            paths.append(tree_residency(cache, q, stack.page_size))
            m = kit.match_prefix(cache, list(q))
            hits.append((int(m.device_prefix_len), int(m.full_kv_hit_length)))
        return hits, paths


def _common(a: Sequence[int], b: Sequence[int], page: int) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n - n % page


def kvgeom_hits(
    inserts: Sequence[Sequence[int]], queries: Sequence[Sequence[int]], stack: Stack = Stack(),
    evicted: Sequence[int] | None = None,
) -> list[Hit]:
    """kvgeom's answers to the same, from the inserts alone (no eviction walk)."""
    geom, page = stack.geometry(), stack.page_size
    evicted = list(evicted) if evicted is not None else [0] * len(inserts)
    out = []
    for q in queries:
        q = list(q)[: len(q) - len(q) % page]
        keys = [list(s)[: len(s) - len(s) % page] for s in inserts]
        shared = [_common(k, q, page) for k in keys]
        matched = max(shared, default=0)
        checkpoints = [len(k) for k, n in zip(keys, shared, strict=True) if k and n == len(k)]
        tombs = swa_tombstones(geom, list(zip(shared, evicted, strict=True))) if geom.swa_window else ()
        hit = prefix_hit(geom, matched, checkpoints, swa_tombstones=tombs)
        out.append((hit.device_prefix, hit.full_kv_hit))
    return out


def kvgeom_hits_on(paths: Sequence[Residency], stack: Stack) -> list[Hit]:
    """kvgeom's hit rule on residencies read off SGLang's tree (after an eviction walk)."""
    geom = stack.geometry()
    out = []
    for r in paths:
        hit = prefix_hit(geom, r.matched, r.checkpoints, swa_tombstones=r.tombstones if geom.swa_window else ())
        out.append((hit.device_prefix, hit.full_kv_hit))
    return out


STACKS: tuple[Stack, ...] = (
    Stack(("full", "mamba"), 1),
    Stack(("full", "mamba"), 2),
    Stack(("full", "mamba"), 4),
    Stack(("full", "swa"), 1, 4),
    Stack(("full", "swa"), 1, 3, 5),
    Stack(("full", "swa"), 2, 6),
    Stack(("full", "swa"), 4, 4),
    Stack(("full", "swa"), 4, 2),
    Stack(("full", "swa", "mamba"), 1, 4),
    Stack(("full", "swa", "mamba"), 4, 4),
)
"""The stacks generated: full + Mamba at pages 1 (no buffer), 2 and 4 (extra buffer); full + sliding
window at pages 1, 2 and 4, windows below, at and above the page, with and without a draft read-back;
all three pools at pages 1 and 4."""


@dataclass(frozen=True)
class RadixCase:
    """One generated case: a stack, inserts with their freed SWA prefixes, queries, and the SWA tokens
    SGLang's eviction walk is asked for afterwards (0: none)."""

    stack: Stack
    inserts: tuple[tuple[int, ...], ...]
    evicted: tuple[int, ...]
    queries: tuple[tuple[int, ...], ...]
    swa_evict_tokens: int = 0


@st.composite
def _case(draw: st.DrawFn) -> RadixCase:
    stack = draw(st.sampled_from(STACKS))
    page, swa = stack.page_size, "swa" in stack.pools

    def seq() -> tuple[int, ...]:
        n = draw(st.integers(1, 5)) * page + draw(st.sampled_from([0, 0, 0, 1]))
        return tuple(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))

    inserts = tuple(seq() for _ in range(draw(st.integers(1, 4))))
    evicted = tuple(draw(st.integers(0, len(s) // page)) * page if swa else 0 for s in inserts)
    queries = (*[seq() for _ in range(draw(st.integers(1, 3)))], inserts[0])
    evict = draw(st.sampled_from([0, 0, page, 2 * page, 4 * page])) if swa else 0
    return RadixCase(stack, inserts, evicted, queries, evict)


def radix_cases() -> st.SearchStrategy[RadixCase]:
    """Generated cases over :data:`STACKS` (token ids 0..2, so inserts share and split prefixes often)."""
    return _case()


def check_case(case: RadixCase) -> tuple[list[Hit], list[Hit]]:
    """(SGLang's hits, kvgeom's hits) for a case: kvgeom from the inserts alone, or, after an eviction
    walk, from the residency read off SGLang's tree."""
    hits, paths = radix_run(case.inserts, case.queries, case.stack, case.evicted, case.swa_evict_tokens)
    if case.swa_evict_tokens:
        return hits, kvgeom_hits_on(paths, case.stack)
    return hits, kvgeom_hits(case.inserts, case.queries, case.stack, case.evicted)


def event_replica(
    inserts: Sequence[Sequence[int]], queries: Sequence[Sequence[int]], page_size: int = 1
) -> tuple[list[bytes], list[int], list[list[int]]]:
    """One SGLang replica, as a router sees it: a full-attention kit cache with KV events on, ``inserts``
    in order. Returns the event batches as SGLang's publisher puts them on the wire (its
    ``KVEventBatch``, msgpack-encoded), the tokens SGLang's scheduler would reuse for each query (the
    match of all but its last token: ``Req._compute_max_prefix_len`` keeps one to compute), and each
    query's chain of SGLang block hashes (its pages' hashes, as a fresh cache storing it announces them)."""
    # SGLang's publisher's encoder (msgspec, an SGLang dependency; imported by name: no stubs here)
    encode = importlib.import_module("msgspec.msgpack").Encoder().encode
    with mock.patch.object(kit, "get_device", lambda: "cpu"), override_platform(is_cuda=True):
        cfg = CacheConfig(page_size=page_size, kv_size=4096, max_context_len=4096)

        def fresh() -> Any:
            return kit.build_fixture(cfg, enable_kv_cache_events=True)

        cache, allocator, _ = fresh()
        payloads = []
        for i, tokens in enumerate(inserts):
            cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=allocator.alloc(len(tokens))))
            payloads.append(encode(KVEventBatch(ts=float(i), events=cache.take_events())))
        hits = [int(kit.match_prefix(cache, list(q)[: max(len(q) - 1, 0)]).full_kv_hit_length) for q in queries]
        chains = []
        for q in queries:
            other, alloc2, _ = fresh()
            q = list(q)[: len(q) - len(q) % page_size]
            other.insert(InsertParams(key=RadixKey(array("q", q)), value=alloc2.alloc(len(q))))
            chains.append([h for e in other.take_events() if isinstance(e, BlockStored) for h in e.block_hashes])
        return payloads, hits, chains
