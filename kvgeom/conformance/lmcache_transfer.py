"""LMCache 0.5.6's transfer side, run on CPU: the blocks it stages per chunk, its lookup's Mamba hold-back,
its chunk hash chain (needs LMCache and vLLM).

Three of LMCache's own code paths, each run on vLLM 0.33's real spec objects and compared with
:mod:`kvgeom.engines.lmcache`:

* **staging** (:func:`lmcache_staged`): LMCache's ``downsample_and_stage_block_ids`` over a cache context
  built the way its worker builds one at registration. The engine group infos come from LMCache's own
  helpers in ``kv_cache_groups`` (span by ``get_tokens_per_block``, window and recurrent flag per layer,
  merged per group) on vLLM's ``KVCacheGroupSpec`` objects; the ``KVLayerGroupsManager`` is LMCache's
  class with one kernel group per vLLM group (every layer of a group has one shape), each checked by its
  own ``_validate_block_chunk_size_config`` as its constructor does; the context's block counting and
  staging are ``BaseCacheContext``'s functions. Only the KV tensors are missing: a kernel group's
  physical slots per block (vLLM's ``num_states`` of the spec, the rows of the manager-block view vLLM
  hands its connectors) stand in for the shape LMCache reads off them. A geometry whose block holds no
  state is one vLLM cannot plan (:func:`check_vllm_plans`). The block ids are LMCache's
  ``slice_block_ids_per_group`` of every chunk.
* **hold-back** (:func:`lmcache_lookup_end`): LMCache's scheduler-side connector, constructed for real
  (``LMCacheMPConnector(vllm_config, SCHEDULER, kv_cache_config)``: every validator, the spans, the
  identity, the relocation window), with a request client that records what it is sent instead of a
  server; then its adapter's ``maybe_submit_lookup_request`` with the connector's own
  ``reserve_last_token`` flag. The end of the key it sends is how far the lookup reaches.
* **hash chain** (:func:`lmcache_chunks`): the multiprocess server's ``TokenHasher`` and the in-process
  ``ChunkedTokenDatabase.process_tokens`` (``save_unfull_chunk`` off, as the MP path) on real token lists.

:func:`check_case` compares each with kvgeom's model (a difference is a model bug) and with vLLM's
geometry (kvgeom's store mask, request hashes), and the conformance run
(:mod:`kvgeom.conformance.lmcache_engine`) draws the cases.

>>> import kvgeom
>>> geom = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 32},
...     {"kind": "sliding_window", "block_size": 32, "sliding_window": 64}]})
>>> lmcache_staged(geom, {"chunk_size": 128}, 2)["staged"]
[[0, 1, 2, 3, 4, 5, 6, 7], [2, 3, 6, 7]]
>>> lmcache_lookup_end(geom, {}, 600)
512
"""

from __future__ import annotations

import contextlib
import logging
import os
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import kvgeom.conformance.vllm_objects as vo  # first: quiets vLLM's logging before LMCache imports it

os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")
logging.getLogger("lmcache").setLevel(logging.WARNING)

import torch  # noqa: E402
from lmcache.integration.vllm import kv_cache_groups as kcg  # noqa: E402
from lmcache.integration.vllm import lmcache_mp_connector as mp  # noqa: E402
from lmcache.integration.vllm import vllm_multi_process_adapter as adapter_module  # noqa: E402
from lmcache.integration.vllm.lmcache_mp_metadata import (  # noqa: E402
    LMCacheMPRequestMetadata,
    LMCacheMPRequestTracker,
)
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.kv_layer_groups import KernelGroupInfo, KVLayerGroupsManager  # noqa: E402
from lmcache.v1.multiprocess.group_view import EngineGroupInfo, slice_block_ids_per_group  # noqa: E402
from lmcache.v1.multiprocess.object_group_transfer import downsample_and_stage_block_ids  # noqa: E402
from lmcache.v1.multiprocess.token_hasher import TokenHasher  # noqa: E402
from lmcache.v1.platform.base.cache_context import BaseCacheContext  # noqa: E402
from lmcache.v1.token_database import ChunkedTokenDatabase  # noqa: E402
from vllm.config import KVTransferConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import AttentionSpec  # noqa: E402

from kvgeom.conformance.vllm_rswa import vllm_null_blocks  # noqa: E402
from kvgeom.engines import lmcache as model  # noqa: E402
from kvgeom.geometry import Geometry  # noqa: E402
from kvgeom.specs import rswa_window_of  # noqa: E402

__all__ = ["check_vllm_plans", "connector_answers", "lmcache_chunks", "lmcache_connector",
           "lmcache_decode_stored_freed", "lmcache_lookup_end", "lmcache_staged", "lmcache_worker_registration",
           "stand_in_context", "VLLMRejects", "worker_kv_cache_config"]


def _settings(s: Mapping[str, Any]) -> model.LMCacheSettings:
    return model.LMCacheSettings(**dict(s))


# --------------------------------------------------------------------------- staging


def worker_kv_cache_config(geom: Geometry) -> Any:
    """The ``KVCacheConfig`` LMCache's worker-side connector is built with: every layer of each group (uniform
    groups not collapsed), without an encoder-only group. vLLM's worker initialises the connector before its
    model runner appends the encoder-only group to its own copy of the config (``Worker.initialize_from_config``,
    ``GPUModelRunner.may_add_encoder_only_layers_to_kv_cache_config``)."""
    kcc = vo.build_kv_cache_config(geom, scheduler_view=False)
    kcc.kv_cache_groups = [g for g, gg in zip(kcc.kv_cache_groups, geom.groups, strict=True)
                           if model.reaches_lmcache(gg)]
    return kcc


def _engine_group_infos(geom: Geometry) -> tuple[list[EngineGroupInfo], list[int]]:
    """LMCache's engine group infos for ``geom`` (one per prefix-cacheable vLLM group, as its
    ``create_engine_group_infos_from_vllm`` derives them) and each group's physical slots per block."""
    kcc = worker_kv_cache_config(geom)  # the worker's view: every layer, no encoder-only group
    groups = kcc.kv_cache_groups
    names = [n for g in groups for n in g.layer_names]
    index = {n: i for i, n in enumerate(names)}
    windows = kcg._resolve_per_layer_sw_sizes(groups, index, len(names))
    recurrent = kcg._resolve_per_layer_recurrent(groups, index, len(names))
    infos, slots = [], []
    for gid, group in enumerate(groups):
        span = kcg.get_tokens_per_block(group.kv_cache_spec, geom.parallel.dcp)
        if span == 0:
            continue
        layers = [index[n] for n in group.layer_names]
        infos.append(EngineGroupInfo(
            engine_group_id=gid, layer_indices=tuple(layers), tokens_per_block=span,
            sw_size_tokens=kcg._merge_layer_sw_sizes(windows, layers),
            recurrent_state=kcg._merge_layer_recurrent(recurrent, layers),
        ))
        slots.append(_rows_per_block(group.kv_cache_spec))
    return infos, slots


def _leaves(spec: Any) -> list[Any]:
    return list(spec.kv_cache_specs.values()) if hasattr(spec, "kv_cache_specs") else [spec]


def _rows_per_block(spec: Any) -> int:
    """Rows per block of the cache tensor vLLM hands its connectors for ``spec`` (its first layer's): the
    manager-block view, ``num_states`` of an attention spec (vLLM's ``get_num_kernel_states(block_size)``:
    ``block_size // tokens_per_state``), the block size of any other spec."""
    leaf = _leaves(spec)[0]
    return int(leaf.num_states) if isinstance(leaf, AttentionSpec) else int(leaf.block_size)


def check_vllm_plans(kcc: Any) -> None:
    """:class:`VLLMRejects` when vLLM 0.33 cannot plan the KV cache of ``kcc``
    (:func:`kvgeom.conformance.vllm_objects.empty_pages`: a block holding no state), so there is no LMCache
    behaviour to compare."""
    problems = vo.empty_pages(kcc)
    if problems:
        raise VLLMRejects(problems[0])


class _StandInContext:
    """A cache context without KV tensors: LMCache's own ``BaseCacheContext`` block counting and staging
    over LMCache's ``KVLayerGroupsManager``."""

    calculate_num_blocks = BaseCacheContext.calculate_num_blocks
    stage_block_ids = BaseCacheContext.stage_block_ids

    def __init__(self, manager: KVLayerGroupsManager, chunk_size: int) -> None:
        self.kv_layer_groups_manager = manager
        self.lmcache_tokens_per_chunk = chunk_size
        self.block_ids_buffer_ = torch.empty(1 << 16, dtype=torch.long)


def stand_in_context(geom: Geometry, chunk_size: int) -> tuple[_StandInContext, list[EngineGroupInfo]]:
    """LMCache's worker-side groups for ``geom`` and a stand-in cache context over them; raises LMCache's
    ``ValueError`` when its registration refuses a group (``_validate_block_chunk_size_config``)."""
    infos, slots = _engine_group_infos(geom)
    manager = KVLayerGroupsManager.__new__(KVLayerGroupsManager)
    kernel_groups = []
    for i, (info, bs) in enumerate(zip(infos, slots, strict=True)):
        KVLayerGroupsManager._validate_block_chunk_size_config(
            i, slots_per_block=bs, tokens_per_block=info.tokens_per_block, lmcache_tokens_per_chunk=chunk_size,
            sw_size_tokens=info.sw_size_tokens)
        kernel_groups.append(KernelGroupInfo(
            layer_indices=list(info.layer_indices), shape_desc=types.SimpleNamespace(bs=bs), dtype=torch.float16,
            tokens_per_block=info.tokens_per_block, engine_group_idx=info.engine_group_id,
            sw_size_tokens=info.sw_size_tokens, recurrent_state=info.recurrent_state))
    manager._kernel_groups = kernel_groups
    manager._lmcache_tokens_per_chunk = chunk_size
    manager._separate_object_groups = False
    manager._full_sw_kv = False
    manager._object_groups = manager._detect_object_groups(infos)
    return _StandInContext(manager, chunk_size), infos


def lmcache_staged(geom: Geometry, scenario: Mapping[str, Any], num_chunks: int) -> dict[str, Any]:
    """The block ids LMCache stages for ``num_chunks`` chunks of a request whose block ids are 0, 1, ...
    in every group (``staged``: per vLLM group, ``[]`` for a scratch group), or ``refused`` when its
    registration refuses a group: ``lmcache_compressed_grid`` (a span off the block's slot grid),
    ``lmcache_window_grid`` (a sub-chunk window off the span grid), ``lmcache_registration_other`` (any other
    of its checks)."""
    s = _settings(scenario)
    C = s.chunk_size
    try:
        ctx, infos = stand_in_context(geom, C)
    except ValueError as e:
        msg = str(e)
        code = ("lmcache_compressed_grid" if "slots_per_block" in msg else
                "lmcache_window_grid" if "sliding window" in msg else "lmcache_registration_other")
        return {"refused": True, "refused_code": code, "refused_message": msg}
    spans = [kcg.get_tokens_per_block(g.kv_cache_spec, geom.parallel.dcp)
             for g in worker_kv_cache_config(geom).kv_cache_groups]
    end = num_chunks * C
    ids = {g: list(range(end // sp)) for g, sp in enumerate(spans) if sp}
    sliced = slice_block_ids_per_group(ids, spans, 0, end)
    per_kernel = [list(sliced[info.engine_group_id]) for info in infos]
    staged = downsample_and_stage_block_ids(ctx, per_kernel)
    out: list[list[int]] = [[] for _ in geom.groups]  # LMCache's groups are vLLM's first ones; the rest get none
    for info, t in zip(infos, staged, strict=True):
        out[info.engine_group_id] = [int(x) for x in t.tolist()]
    return {"refused": False, "staged": out}


def lmcache_worker_registration(geom: Geometry) -> dict[str, Any]:
    """LMCache's own ``create_engine_group_infos_from_vllm`` on the worker's config when no group reaches it
    (an encoder-only model) and the KV caches vLLM registers then (none: vLLM allocates no cache tensor for
    such a config). ``refused`` with the code ``lmcache_worker_no_kv_cache`` and LMCache's exception when it
    raises; else ``{"refused": False}`` (also whenever a group reaches LMCache: the stand-in context of
    :func:`lmcache_staged` covers those)."""
    kcc = worker_kv_cache_config(geom)
    if kcc.kv_cache_groups:
        return {"refused": False}
    try:
        kcg.create_engine_group_infos_from_vllm(kcc, {}, None, geom.parallel.dcp)
    except Exception as e:  # LMCache 0.5.6 raises StopIteration here: an uncaught failure, not a ValueError
        return {"refused": True, "refused_code": "lmcache_worker_no_kv_cache",
                "refused_message": f"{type(e).__name__}: {e}"}
    return {"refused": False}


# --------------------------------------------------------------------------- the connector and its lookup


class _RecordingClient:
    """A request client that records the keys it is asked to look up (no server)."""

    def __init__(self) -> None:
        self.lookups: list[Any] = []

    def lookup(self, key: Any, tp_size: int) -> None:
        self.lookups.append(key)

    def close(self) -> None:
        pass


class _RecordingFactory:
    @staticmethod
    def create(url: str, context: Any = None, **_: Any) -> _RecordingClient:
        return _RecordingClient()


@contextlib.contextmanager
def lmcache_connector(geom: Geometry, scenario: Mapping[str, Any]) -> Iterator[Any]:
    """LMCache's scheduler-side ``LMCacheMPConnector`` for ``geom`` and the LMCache settings ``scenario``,
    constructed by its own ``__init__`` (its servers answer ``chunk_size`` and record lookups instead of
    running). Raises what the constructor raises (its refusals are ``ValueError``)."""
    s = _settings(scenario)
    vc = vo.build_vllm_config(geom)
    urls = [f"tcp://127.0.0.1:{5555 + i}" for i in range(s.servers)]
    vc.kv_transfer_config = KVTransferConfig(kv_connector="LMCacheMPConnector", kv_role="kv_both",
                                             kv_connector_extra_config={"lmcache.mp.server_urls": urls})
    vc.model_config.model = s.model
    vc.scheduler_config.max_num_batched_tokens = s.max_num_batched_tokens
    vc.adjust_dcp_kv_cache_interleave_size = types.MethodType(VllmConfig.adjust_dcp_kv_cache_interleave_size, vc)
    kcc = vo.build_kv_cache_config(geom)
    saved = adapter_module.RequestClientFactory, adapter_module.get_lmcache_chunk_size
    adapter_module.RequestClientFactory = _RecordingFactory
    adapter_module.get_lmcache_chunk_size = lambda client, timeout=None: s.chunk_size
    try:
        conn = mp.LMCacheMPConnector(vc, KVConnectorRole.SCHEDULER, kcc)
        conn.scheduler_adapter._heartbeats = {}  # no heartbeat threads: there is no server to ping
        yield conn
    finally:
        adapter_module.RequestClientFactory, adapter_module.get_lmcache_chunk_size = saved


def lmcache_lookup_end(geom: Geometry, scenario: Mapping[str, Any], num_tokens: int) -> int:
    """How far LMCache's lookup of a ``num_tokens`` prompt reaches: the ``end`` of the key its scheduler
    adapter sends, with the connector's own hold-back flag."""
    with lmcache_connector(geom, scenario) as conn:
        return _lookup_ends(conn, [num_tokens])[0]


def _lookup_ends(conn: Any, lengths: Sequence[int]) -> list[int]:
    a = conn.scheduler_adapter
    client = next(iter(a.req_clients.values()))
    ends = []
    for i, n in enumerate(lengths):
        a.maybe_submit_lookup_request(f"kvgeom-{i}", list(range(n)),
                                      reserve_last_token=conn._reserve_last_token_for_lookup)
        ends.append(int(client.lookups[-1].end))
    return ends


def connector_answers(geom: Geometry, scenario: Mapping[str, Any], lengths: Sequence[int]) -> dict[str, Any]:
    """What LMCache's constructed connector decides: the hold-back flag, the lookup end of prompts of each
    of ``lengths`` tokens, the relocation window, the unit it rounds vLLM's hits to; or ``refused`` (a
    ``ValueError`` or ``AssertionError`` of the constructor, with its message)."""
    try:
        with lmcache_connector(geom, scenario) as conn:
            return {
                "refused": False,
                "holds_back_last_token": bool(conn._reserve_last_token_for_lookup),
                "lookup_ends": _lookup_ends(conn, lengths),
                "relocation_window": int(conn._mamba_relocation_window),
                "hit_alignment": int(conn._hit_alignment_tokens),
            }
    except (ValueError, AssertionError) as e:
        return {"refused": True, "refused_message": f"{type(e).__name__}: {e}"}


# --------------------------------------------------------------------------- decode stores beside vLLM's frees


class VLLMRejects(Exception):
    """vLLM 0.33 itself fails on the deployment (its KV cache coordinator cannot be built: e.g. a sink group
    under the hybrid coordinator), so there is no vLLM behaviour to set LMCache's beside."""


def lmcache_decode_stored_freed(geom: Geometry, scenario: Mapping[str, Any]) -> dict[int, list[int]]:
    """Per reference sliding-window group whose span LMCache and vLLM agree on, the entries LMCache's store
    metadata (``LMCacheMPRequestMetadata.GetStoreMetadata`` over its own request tracker, with the scenario's
    ``save_decode_cache``) puts in a stored chunk while vLLM's row holds the null block there
    (:func:`kvgeom.conformance.vllm_rswa.vllm_null_blocks`, vLLM's own coordinator), on the probe of
    :func:`kvgeom.engines.lmcache.decode_stored_freed`: a one-chunk prompt decoded for
    :data:`kvgeom.engines.lmcache.DECODE_PROBE_CHUNKS` chunks, chunk c stored in the step that computes its
    last token (vLLM's frees after ``(c+1)*C - 1`` tokens). The tracker is given every block id up front
    (entry i is id i + 1: 0 is vLLM's null id); ``{}`` without such a group. :class:`VLLMRejects` when vLLM's
    coordinator cannot be built for the deployment."""
    s = _settings(scenario)
    C, K = s.chunk_size, model.DECODE_PROBE_CHUNKS
    vc = vo.build_vllm_config(geom)
    spans = list(mp.get_group_tokens_per_block(vc, vo.build_kv_cache_config(geom)))
    groups = [g for g in geom.groups if g.index < len(spans) and rswa_window_of(g.spec) is not None
              and spans[g.index] and spans[g.index] == g.span]
    if not groups:
        return {}
    P, N = C, (1 + K) * C
    request = vo.build_request(P, geom.hash_block_size)
    request.append_output_token_ids(list(range(1_000_000, 1_000_000 + N - P)))
    tracker = LMCacheMPRequestTracker(request)
    tracker.allocated_block_ids = {i: [b + 1 for b in range(N // sp)] if sp else [] for i, sp in enumerate(spans)}
    stored: list[dict[int, list[int]]] = []  # per chunk end, the entries stored in that step
    for _ in range(1 + K):  # one step per chunk end: tokens up to (c+1)*C computed
        tracker.increase_num_scheduled_tokens(C)
        meta = LMCacheMPRequestMetadata.GetStoreMetadata(tracker, C, spans, save_decode_cache=s.save_decode_cache)
        ids = meta.op.block_ids if meta is not None else [[] for _ in spans]
        stored.append({i: [b - 1 for b in ids[i]] for i in range(len(spans))})
    out: dict[int, list[int]] = {}
    for g in groups:
        if not any(stored[c][g.index] for c in range(1, 1 + K)):
            out[g.index] = []  # LMCache stored no decode chunk (save_decode_cache off): nothing vLLM freed
            continue
        try:
            nulls = vllm_null_blocks(geom, g.index, P, [(c + 1) * C - 1 for c in range(1, 1 + K)])
        except Exception as e:  # vLLM's own KV cache manager cannot be built: vLLM does not run the deployment
            raise VLLMRejects(f"{type(e).__name__}: {e}") from e
        out[g.index] = sorted(b for c in range(1, 1 + K) for b in set(stored[c][g.index]) & set(nulls[c - 1]))
    return out


# --------------------------------------------------------------------------- the hash chain


def lmcache_chunks(token_ids: Sequence[int], chunk_size: int) -> dict[str, Any]:
    """LMCache's chunking of ``token_ids``: the multiprocess ``TokenHasher``'s rolling chunk hashes
    (``hashes``) and ``ChunkedTokenDatabase.process_tokens``'s ``(start, end)`` ranges and hashes with
    ``save_unfull_chunk`` off (``ranges``, ``db_hashes``)."""
    tokens = list(token_ids)
    hasher = TokenHasher(chunk_size=chunk_size, hash_algorithm="blake3")
    hashes = hasher.compute_chunk_hashes(tokens)
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=chunk_size, save_unfull_chunk=False)
    db = ChunkedTokenDatabase(cfg, None)
    rows = list(db.process_tokens(tokens, make_key=False))
    return {"hashes": hashes, "ranges": [(int(a), int(b)) for a, b, _ in rows], "db_hashes": [h for _, _, h in rows]}
