"""vLLM 0.33 objects for the side-by-side lookup benchmark (imported only when vllm is importable).

Builds, for a kvgeom geometry of full-attention and Mamba groups:

* vLLM's own spec classes, ``KVCacheConfig`` (scheduler view) and the real ``CacheConfig`` /
  ``ParallelConfig`` / ``KVTransferConfig`` (OffloadingConnector) inside a small stand-in
  ``VllmConfig`` (a real ``ModelConfig`` would load a model);
* vLLM's ``OffloadingConnectorScheduler`` over vLLM's **real** ``CPUOffloadingManager`` (LRU), its
  config from vLLM's ``build_offloading_config`` and ``SchedulerOffloadConfig.from_spec``;
* real ``Request`` objects with vLLM's sha256 block hasher at the hash unit H.

The tier is filled the way a connector fills it: ``prepare_store`` then ``complete_store`` of the
chosen offload keys (what the worker reports), so its ``lookup`` is the one a deployment runs.
Byte-shape fields no geometry rule reads are small fixed values (1 KV head, head size 8, float16,
a Mamba state of one ``(8,)`` tensor).
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
import vllm
from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.kv_offload.base import OffloadingSpec, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.request import Request

from kvgeom.geometry import Geometry
from kvgeom.prefill import engine_block_size

for _name in ("vllm", "vllm.v1", "vllm.distributed"):
    logging.getLogger(_name).setLevel(logging.ERROR)

VLLM_VERSION = str(vllm.__version__)
_DTYPE = torch.float16
_seeded = False


def _spec(geom: Geometry, index: int) -> Any:
    g = geom.group(index)
    if g.family == "mamba":
        return MambaSpec(block_size=g.block_size, shapes=((8,),), dtypes=(_DTYPE,),
                         mamba_cache_mode=g.mamba_mode or "none")
    if g.family != "full":
        raise ValueError(f"the benchmark builds full attention and Mamba groups only, not {g.family}")
    return FullAttentionSpec(block_size=g.block_size, num_kv_heads=1, head_size=8, dtype=_DTYPE,
                             dcp_sharded=g.dcp_sharded)


def kv_cache_config(geom: Geometry) -> KVCacheConfig:
    groups = [KVCacheGroupSpec(layer_names=[f"layer.{g.index}"], kv_cache_spec=_spec(geom, g.index))
              for g in geom.groups]
    cfg = KVCacheConfig(num_blocks=1 << 16, kv_cache_tensors=[], kv_cache_groups=groups,
                        prefix_cache_retention_interval=geom.config.cache.retention_interval)
    return generate_scheduler_kv_cache_config([cfg])


def vllm_config(geom: Geometry) -> Any:
    cfg = geom.config
    p = cfg.parallel
    modes = {g.mamba_mode for g in geom.groups if g.mamba_mode is not None}
    cache = CacheConfig(
        block_size=engine_block_size(geom),  # what vLLM's engine core sets
        enable_prefix_caching=True,
        prefix_match_unit=cfg.cache.prefix_match_unit,
        prefix_cache_retention_interval=cfg.cache.retention_interval,
        mamba_cache_mode=modes.pop() if len(modes) == 1 else "none",
    )
    parallel = ParallelConfig(tensor_parallel_size=p.tp, decode_context_parallel_size=p.dcp)
    extra: dict[str, Any] = {}
    if cfg.offload is not None and cfg.offload.blocks_per_chunk is not None:
        extra["blocks_per_chunk"] = cfg.offload.blocks_per_chunk
    transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                kv_connector_extra_config=extra, engine_id="kvgeom-bench")
    model = SimpleNamespace(model="kvgeom-bench", dtype=_DTYPE, max_model_len=1 << 20, use_mla=False,
                            get_total_num_kv_heads=lambda: p.tp)
    return SimpleNamespace(cache_config=cache, parallel_config=parallel, kv_transfer_config=transfer,
                           model_config=model, scheduler_config=SimpleNamespace(disable_chunked_mm_input=False),
                           speculative_config=None, kv_events_config=None, use_v2_model_runner=False)


class _CPUSpec(OffloadingSpec):
    def __init__(self, config: Any, manager: CPUOffloadingManager) -> None:
        super().__init__(config)
        self._manager = manager

    def get_manager(self) -> CPUOffloadingManager:
        return self._manager

    def get_worker(self, kv_caches: Any) -> Any:
        raise NotImplementedError("the benchmark runs the scheduler side only")


def scheduler(geom: Geometry, num_chunks: int) -> tuple[OffloadingConnectorScheduler, CPUOffloadingManager]:
    """vLLM's scheduler-side connector for ``geom`` over an empty real CPU tier of ``num_chunks`` chunks."""
    vc, kcc = vllm_config(geom), kv_cache_config(geom)
    manager = CPUOffloadingManager(num_chunks=num_chunks)
    return OffloadingConnectorScheduler(_CPUSpec(build_offloading_config(vc, kcc), manager), vc, kcc), manager


def request(num_tokens: int, hash_block_size: int, request_id: str, salt: int) -> Request:
    """A real vLLM request of ``num_tokens`` prompt tokens (distinct per ``salt``), hashed by vLLM every H tokens."""
    global _seeded
    if not _seeded:
        init_none_hash(sha256)
        _seeded = True
    return Request(request_id=request_id, prompt_token_ids=[(salt * 7919 + i) % 50000 for i in range(num_tokens)],
                   sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                   block_hasher=get_request_block_hasher(hash_block_size, sha256))


def store(manager: CPUOffloadingManager, keys: list[bytes], req_id: str = "filler") -> list[bytes]:
    """Store ``keys`` in the tier as a connector does (prepare, then the worker's completion); returns the keys
    the tier evicted to make room."""
    ctx = ReqContext(req_id)
    out = manager.prepare_store(keys, ctx)
    assert out is not None, "the tier is full of pinned chunks"
    manager.complete_store(out.keys_to_store, ctx)
    return list(out.evicted_keys)


def offload_key(block_hash: bytes, group: int) -> bytes:
    return bytes(make_offload_key(block_hash, group))
