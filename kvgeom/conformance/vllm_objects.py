"""Build vLLM 0.33's own objects from a resolved kvgeom geometry (needs an installed vLLM).

This module is the one place where kvgeom turns a :class:`kvgeom.Geometry` into the objects vLLM's
geometry code reads, so a conformance check, a benchmark or a test can then call vLLM's code on
them. It imports vLLM (and torch) at import time; ``import kvgeom`` and ``import
kvgeom.conformance`` never import it.

What is built, and what is bypassed (nothing else is):

* **Spec classes** (``vllm/v1/kv_cache_interface.py``): one real spec per group, with the group's
  per-rank ``block_size``, ``dcp_sharded``, window / chunk / sink / Mamba-mode fields. Byte-shape
  fields that no geometry rule reads are fixed small values (1 KV head, head size 8, float16; a Mamba
  state of one ``(8,)`` float16 tensor) unless the kvgeom spec gives them.
* **Drafter layers**: a layer (or group) marked ``drafter`` gets ``is_draft=True`` (what vLLM's model
  runner sets for a drafter's layers); ``is_eagle_group`` is then set as
  ``get_global_kv_cache_groups`` sets it (only under ``use_eagle_block_drop()``: any layer
  ``is_draft``), and with a ``speculative`` section every sliding-window spec gets its
  ``extra_retained_tokens = max(0, num_prefill_lookahead_tokens - 1)`` (vLLM overrides an explicit
  value too). Mamba ``num_speculative_blocks`` is the kvgeom spec's (K by default,
  :func:`kvgeom.speculative.apply_defaults`, as ``MambaBase.get_kv_cache_spec`` sets it).
* **KVCacheConfig / KVCacheGroupSpec**: one group per kvgeom group, layer names ``layer.<g>.<i>``,
  ``num_blocks`` = :data:`NUM_GPU_BLOCKS`, no ``KVCacheTensor`` (nothing is allocated). The
  scheduler view replaces a uniform group by its first layer, as vLLM's
  ``generate_scheduler_kv_cache_config`` does (it is called).
* **VllmConfig**: a stand-in object carrying the *real* ``CacheConfig``, ``ParallelConfig`` and
  ``KVTransferConfig`` (``OffloadingConnector``) built from the kvgeom config; ``model_config`` is
  a small stand-in (model name ``"kvgeom-conformance"``, dtype float16, ``use_mla`` when an MLA group
  exists, ``max_model_len``), because a real ``ModelConfig`` loads a model from a hub;
  ``kv_events_config`` is None. Without a ``speculative`` section ``speculative_config`` is None; with
  one it is a stand-in carrying the fields vLLM's scheduler side reads (method, K,
  ``disable_eagle_block_drop``, ``disable_lookahead_block_hashes``, a draft ``hf_config`` with
  ``num_nextn_predict_layers`` = ``mtp_modules``, no parallel drafting, no per-batch-size K) and
  ``SpeculativeConfig``'s own predicate functions (``use_eagle``, ``needs_eagle_block_drop``,
  ``use_eagle_block_drop``, ``use_multi_module_mtp``, ...); no draft model is loaded. The derived
  fields ``num_speculative_tokens``, ``num_lookahead_tokens``, ``num_prefill_lookahead_tokens`` and
  ``num_hash_lookahead_tokens`` are vLLM's ``VllmConfig`` properties evaluated on the stand-in.
  ``cache_config.block_size`` is set as vLLM's engine core sets it: the smallest per-rank block of
  the prefix-cacheable groups (all groups when none is).
* **The offload tier**: :class:`ChosenTier`, an ``OffloadingManager`` whose ``lookup`` answers HIT
  for exactly the offload keys the caller chose, MISS otherwise, and which records the keys
  ``prepare_load`` is asked for. The real tiers (CPU, file system) would hold the same keys after the
  stores; the connector code under test (``OffloadingConnectorScheduler``) is vLLM's own.
* **Requests**: a real ``vllm.v1.request.Request`` with prompt token ids ``0..n-1`` and vLLM's own
  block hasher at the hash unit H (``get_request_block_hasher``, sha256).
* **The GPU block table handed to** ``update_state_after_alloc``: built here, block *j* of group g
  null when it is wholly before the tokens the group skips (``get_num_skipped_tokens(N)`` asked of
  vLLM's own single-type manager, from vLLM's own coordinator), hashed when inside the local prefix,
  fresh otherwise, the way vLLM's allocator leaves it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
import vllm
from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig, SpeculativeConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_coordinator import get_kv_cache_coordinator
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import (
    KVCacheBlock,
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
    make_block_hash_with_group_id,
)
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    make_offload_key,
)
from vllm.v1.request import Request

from kvgeom.geometry import Geometry
from kvgeom.prefill import engine_block_size
from kvgeom.specs import AnySpec, UniformSpec

__all__ = [
    "NUM_GPU_BLOCKS",
    "SPECULATIVE_FIELDS",
    "VLLM_VERSION",
    "ChosenTier",
    "VllmObjects",
    "build",
    "build_kv_cache_config",
    "build_kv_cache_spec",
    "build_request",
    "build_scheduler",
    "build_vllm_config",
    "empty_pages",
    "gpu_blocks_for_load",
    "offload_key",
]

for _name in ("vllm", "vllm.v1", "vllm.distributed"):
    logging.getLogger(_name).setLevel(logging.ERROR)

VLLM_VERSION: str = str(vllm.__version__)
"""The installed vLLM's version string."""

NUM_GPU_BLOCKS = 4096
"""GPU blocks in the KVCacheConfig built here (enough for every request the checker makes)."""

_DTYPE = torch.float16
_HEADS = 1
_HEAD_SIZE = 8
_HISPARSE_PAGE = 1024  # bytes of a HiSparse page when the kvgeom spec gives none
_HASH_SEEDED = False


def _attention_args(spec: Any, dcp_sharded: bool) -> dict[str, Any]:
    args: dict[str, Any] = {
        "block_size": spec.block_size,
        "num_kv_heads": spec.num_kv_heads or _HEADS,
        "head_size": spec.head_size or _HEAD_SIZE,
        "dtype": _DTYPE,
        "dcp_sharded": dcp_sharded,
    }
    if getattr(spec, "tokens_per_state", None):
        args["tokens_per_state"] = spec.tokens_per_state
    return args


def _leaf(spec: Any, block_size: int, dcp_sharded: bool, mamba_mode: str | None, *, is_draft: bool = False,
          extra_retained: int | None = None) -> KVCacheSpec:
    spec = spec.model_copy(update={"block_size": block_size})
    a = _attention_args(spec, dcp_sharded) if spec.kind not in ("mamba", "hisparse_hot", "hisparse_resident") else {}
    if a:
        a["is_draft"] = is_draft
    if extra_retained is not None and spec.kind in ("sliding_window", "sliding_window_mla"):
        spec = spec.model_copy(update={"extra_retained_tokens": extra_retained})
    match spec.kind:
        case "full_attention":
            return FullAttentionSpec(**a)
        case "mla":
            role = SparseCacheRole.INDEXER if spec.cache_role == "indexer" else SparseCacheRole.SPARSE
            return MLAAttentionSpec(**a, cache_role=role)
        case "sink_full_attention":
            return SinkFullAttentionSpec(**a, sink_len=spec.sink_len)
        case "sliding_window":
            return SlidingWindowSpec(
                **a, sliding_window=spec.sliding_window, extra_retained_tokens=spec.extra_retained_tokens
            )
        case "sliding_window_mla":
            return SlidingWindowMLASpec(
                **a,
                sliding_window=spec.sliding_window,
                extra_retained_tokens=spec.extra_retained_tokens,
                bounded_replay=spec.bounded_replay,
            )
        case "chunked_local":
            return ChunkedLocalAttentionSpec(**a, attention_chunk_size=spec.attention_chunk_size)
        case "cross_attention":
            return CrossAttentionSpec(**a)
        case "circular_buffer":
            return CircularBufferSpec(**a)
        case "rswa":
            return RSWASpec(**a, rswa_window=spec.rswa_window)
        case "encoder_only":
            return EncoderOnlyAttentionSpec(**a)
        case "hisparse_hot":
            return HiSparseHotSpec(block_size=block_size, page_size=spec.page_size or _HISPARSE_PAGE,
                                   blocks_per_request=spec.blocks_per_request)
        case "hisparse_resident":
            return HiSparseResidentSpec(block_size=block_size, page_size=spec.page_size or _HISPARSE_PAGE)
        case "mamba":
            shapes = tuple(tuple(s) for s in spec.shapes) if spec.shapes else ((8,),)
            return MambaSpec(
                block_size=block_size,
                shapes=shapes,
                dtypes=(_DTYPE,) * len(shapes),
                mamba_cache_mode=mamba_mode or "none",
                num_speculative_blocks=spec.num_speculative_blocks,
            )
    raise ValueError(f"kvgeom kind {spec.kind!r} has no vLLM spec class in this checker")


def _extra_retained(geom: Geometry) -> int | None:
    """With a drafter, vLLM's ``get_global_kv_cache_groups`` tags every sliding-window spec with
    ``max(0, num_prefill_lookahead_tokens - 1)``; None (keep the spec's own value) without one."""
    if geom.speculative is None:
        return None
    return max(0, int(_vllm_property("num_prefill_lookahead_tokens", build_vllm_config(geom))) - 1)


def build_kv_cache_spec(geom: Geometry, index: int) -> KVCacheSpec:
    """vLLM's spec object for group ``index`` of ``geom`` (a ``UniformTypeKVCacheSpecs`` for a uniform group).

    A layer (or group) marked ``drafter`` gets ``is_draft=True``, as vLLM's model runner marks a drafter's
    layers; with a ``speculative`` section every sliding-window layer gets vLLM's ``extra_retained_tokens``."""
    g = geom.group(index)
    spec: AnySpec = g.spec
    extra = _extra_retained(geom)
    if isinstance(spec, UniformSpec):
        leaves = {
            f"layer.{index}.{i}": _leaf(layer, g.block_size, g.dcp_sharded, g.mamba_mode,
                                        is_draft=bool(spec.drafter or layer.drafter), extra_retained=extra)
            for i, layer in enumerate(spec.layers)
        }
        return UniformTypeKVCacheSpecs(block_size=g.block_size, kv_cache_specs=leaves)
    return _leaf(spec, g.block_size, g.dcp_sharded, g.mamba_mode, is_draft=bool(spec.drafter), extra_retained=extra)


def build_kv_cache_config(geom: Geometry, *, scheduler_view: bool = True) -> KVCacheConfig:
    """vLLM's ``KVCacheConfig`` for ``geom``: one ``KVCacheGroupSpec`` per group.

    With ``scheduler_view`` (default) uniform groups are replaced by their first layer through vLLM's
    ``generate_scheduler_kv_cache_config``, which is what the scheduler, the coordinator and the
    offloading connector's scheduler side see, and the (last) encoder-only group is left out: vLLM's model
    runner appends it to its own copy after the scheduler's config is built.
    """
    groups = []
    for g in geom.groups:
        if scheduler_view and g.family == "encoder":
            continue  # vLLM's model runner appends the encoder-only group; the scheduler never sees it
        spec = build_kv_cache_spec(geom, g.index)
        names = list(spec.kv_cache_specs) if isinstance(spec, UniformTypeKVCacheSpecs) else [f"layer.{g.index}.0"]
        groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec))
    # get_global_kv_cache_groups: only under use_eagle_block_drop() a group holding a draft layer is flagged
    spec_config = _speculative_stand_in(geom)
    if spec_config is not None and spec_config.use_eagle_block_drop():
        for group in groups:
            leaves = group.kv_cache_spec.kv_cache_specs.values() if isinstance(
                group.kv_cache_spec, UniformTypeKVCacheSpecs) else (group.kv_cache_spec,)
            group.is_eagle_group = any(leaf.is_draft for leaf in leaves)
    cfg = KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=geom.config.cache.retention_interval,
    )
    if not scheduler_view:
        return cfg
    out = generate_scheduler_kv_cache_config([cfg])
    for view, full in zip(out.kv_cache_groups, cfg.kv_cache_groups, strict=True):
        view.is_eagle_group = full.is_eagle_group
    return out


class _SpeculativeStandIn:
    """The fields of vLLM's ``SpeculativeConfig`` its scheduler side reads, with vLLM's own predicates
    (the methods are ``SpeculativeConfig``'s functions, called on this object)."""

    use_eagle = SpeculativeConfig.use_eagle
    needs_eagle_block_drop = SpeculativeConfig.needs_eagle_block_drop
    use_eagle_block_drop = SpeculativeConfig.use_eagle_block_drop
    use_multi_module_mtp = SpeculativeConfig.use_multi_module_mtp
    use_dflash = SpeculativeConfig.use_dflash
    use_dspark = SpeculativeConfig.use_dspark
    uses_draft_model = SpeculativeConfig.uses_draft_model
    use_ngram = SpeculativeConfig.use_ngram
    max_num_new_slots_for_drafting = SpeculativeConfig.max_num_new_slots_for_drafting

    def __init__(self, method: str, k: int, *, disable_eagle_block_drop: bool, disable_lookahead_block_hashes: bool,
                 mtp_modules: int) -> None:
        self.method = method
        self.num_speculative_tokens = k
        self.disable_eagle_block_drop = disable_eagle_block_drop
        self.disable_lookahead_block_hashes = disable_lookahead_block_hashes
        self.parallel_drafting = False
        self.num_speculative_tokens_per_batch_size = None
        self.draft_model_config = SimpleNamespace(hf_config=SimpleNamespace(num_nextn_predict_layers=mtp_modules))


def _speculative_stand_in(geom: Geometry) -> _SpeculativeStandIn | None:
    s = geom.config.speculative
    if s is None:
        return None
    return _SpeculativeStandIn(
        s.method,
        s.num_speculative_tokens,
        disable_eagle_block_drop=not s.eagle_block_drop,
        disable_lookahead_block_hashes=not s.lookahead_hashes,
        mtp_modules=s.mtp_modules,
    )


def _vllm_property(name: str, vllm_config: Any) -> Any:
    """vLLM's own ``VllmConfig.<name>`` property, evaluated on the stand-in."""
    return getattr(VllmConfig, name).fget(vllm_config)


#: The derived speculative fields of ``VllmConfig`` the scheduler side reads (vLLM's properties).
SPECULATIVE_FIELDS = (
    "num_speculative_tokens",
    "num_lookahead_tokens",
    "num_prefill_lookahead_tokens",
    "num_hash_lookahead_tokens",
)


def empty_pages(kcc: KVCacheConfig) -> list[str]:
    """The attention layers of ``kcc`` whose block holds no state, one line each (``[]``: none).

    vLLM 0.33 keeps ``num_states`` (``get_num_kernel_states(block_size)``: ``block_size // tokens_per_state``)
    states in a block, so ``tokens_per_state`` above the block is a page of 0 bytes, and vLLM's KV-cache
    planning (``get_kv_cache_config_from_groups``) divides by it: ZeroDivisionError before any scheduler or
    connector exists (run in tests/test_lmcache_conformance.py). Read from vLLM's own spec objects."""
    out = []
    for i, group in enumerate(kcc.kv_cache_groups):
        spec = group.kv_cache_spec
        leaves = list(spec.kv_cache_specs.values()) if isinstance(spec, UniformTypeKVCacheSpecs) else [spec]
        for leaf in leaves:
            if isinstance(leaf, AttentionSpec) and leaf.num_states == 0:
                out.append(f"group {i}: a {leaf.block_size}-token block holds no state at tokens_per_state "
                           f"{leaf.tokens_per_state} (page {leaf.page_size_bytes} bytes); vLLM's KV-cache planning "
                           "divides by the page (ZeroDivisionError)")
    return out


def build_vllm_config(geom: Geometry) -> Any:
    """A stand-in ``VllmConfig`` for ``geom``: real ``CacheConfig``, ``ParallelConfig`` and
    ``KVTransferConfig`` (OffloadingConnector, when ``geom`` offloads), a small ``model_config``
    stand-in, no speculative or KV-events config (see the module docstring)."""
    cfg = geom.config
    p = cfg.parallel
    mamba_modes = {g.mamba_mode for g in geom.groups if g.mamba_mode is not None}
    cache = CacheConfig(
        block_size=engine_block_size(geom),
        enable_prefix_caching=cfg.cache.prefix_caching,
        prefix_match_unit=cfg.cache.prefix_match_unit,
        prefix_cache_retention_interval=cfg.cache.retention_interval,
        mamba_cache_mode=mamba_modes.pop() if len(mamba_modes) == 1 else "none",
    )
    parallel = ParallelConfig(
        tensor_parallel_size=p.tp,
        pipeline_parallel_size=p.pp,
        decode_context_parallel_size=p.dcp,
        prefill_context_parallel_size=p.pcp,
        cp_kv_cache_interleave_size=p.cp_interleave,
    )
    transfer = None
    if cfg.offload is not None:
        extra: dict[str, Any] = {}
        if cfg.offload.blocks_per_chunk is not None:
            extra["blocks_per_chunk"] = cfg.offload.blocks_per_chunk
        if cfg.offload.block_size is not None:
            extra["block_size"] = cfg.offload.block_size
        transfer = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=extra
        )
    max_model_len = cfg.cache.max_model_len or 1 << 20
    model = SimpleNamespace(
        model="kvgeom-conformance",
        dtype=_DTYPE,
        max_model_len=max_model_len,
        use_mla=any(g.kind == "mla" for g in geom.groups),
        get_total_num_kv_heads=lambda: _HEADS * p.tp,
    )
    vc = SimpleNamespace(
        cache_config=cache,
        parallel_config=parallel,
        kv_transfer_config=transfer,
        model_config=model,
        scheduler_config=SimpleNamespace(disable_chunked_mm_input=False),
        speculative_config=_speculative_stand_in(geom),
        diffusion_config=None,
        kv_events_config=None,
        use_v2_model_runner=False,
    )
    for name in SPECULATIVE_FIELDS:  # vLLM's own rules (config/vllm.py), on the stand-in's fields
        setattr(vc, name, _vllm_property(name, vc))
    return vc


class ChosenTier(OffloadingManager):  # type: ignore[misc]
    """An offload tier holding exactly the keys the caller chose (``keys``); records every key
    ``prepare_load`` is asked to load, in order, in ``loaded``."""

    def __init__(self, keys: set[bytes] | None = None) -> None:
        self.keys: set[bytes] = set(keys or ())
        self.loaded: list[bytes] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if bytes(key) in self.keys else LookupResult.MISS

    def prepare_load(self, keys: Any, req_context: ReqContext) -> LoadStoreSpec:
        self.loaded.extend(bytes(k) for k in keys)
        return LoadStoreSpec()

    def touch(self, keys: Any, req_context: ReqContext) -> None:
        return None

    def complete_load(self, keys: Any, req_context: ReqContext) -> None:
        return None

    def prepare_store(self, keys: Any, req_context: ReqContext) -> Any:
        return None

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()


class _Spec(OffloadingSpec):  # type: ignore[misc]
    def __init__(self, config: Any, tier: ChosenTier) -> None:
        super().__init__(config)
        self._tier = tier

    def get_manager(self) -> OffloadingManager:
        return self._tier

    def get_worker(self, kv_caches: Any) -> Any:
        raise NotImplementedError("the conformance checker runs the scheduler side only")


def build_scheduler(geom: Geometry, tier: ChosenTier, *, vllm_config: Any = None,
                    kv_cache_config: KVCacheConfig | None = None) -> OffloadingConnectorScheduler:
    """vLLM's ``OffloadingConnectorScheduler`` for ``geom`` over ``tier`` (its config comes from vLLM's
    ``build_offloading_config`` and ``SchedulerOffloadConfig.from_spec``)."""
    vc = vllm_config if vllm_config is not None else build_vllm_config(geom)
    kcc = kv_cache_config if kv_cache_config is not None else build_kv_cache_config(geom)
    config = build_offloading_config(vc, kcc)
    return OffloadingConnectorScheduler(_Spec(config, tier), vc, kcc)


def build_request(num_tokens: int, hash_block_size: int, *, request_id: str = "r0",
                  hash_lookahead_tokens: int = 0, kv_transfer_params: dict[str, Any] | None = None) -> Request:
    """A real vLLM ``Request`` of ``num_tokens`` prompt tokens (ids ``0..n-1``), block hashes by vLLM's
    own hasher every ``hash_block_size`` tokens (with ``hash_lookahead_tokens``, vLLM's
    ``num_hash_lookahead_tokens``: 0 keeps the legacy hashes). ``kv_transfer_params`` (e.g.
    ``{"max_offload_tokens": 8}``) reach the connector as a client's would, through the sampling
    parameters' ``extra_args``."""
    global _HASH_SEEDED
    if not _HASH_SEEDED:
        init_none_hash(sha256)
        _HASH_SEEDED = True
    return Request(
        request_id=request_id,
        prompt_token_ids=list(range(num_tokens)),
        sampling_params=SamplingParams(max_tokens=1, extra_args=None if kv_transfer_params is None
                                       else {"kv_transfer_params": dict(kv_transfer_params)}),
        pooling_params=None,
        block_hasher=get_request_block_hasher(hash_block_size, sha256, hash_lookahead_tokens),
    )


def offload_key(request: Request, group: int, end_token: int, hash_block_size: int) -> bytes:
    """vLLM's offload key (``make_offload_key``) of ``group``'s entry ending at ``end_token``."""
    return bytes(make_offload_key(request.block_hashes[end_token // hash_block_size - 1], group))


def gpu_blocks_for_load(
    coordinator: Any, kv_cache_config: KVCacheConfig, dcp: int, local_tokens: int, end_token: int
) -> KVCacheBlocks:
    """The GPU block table ``update_state_after_alloc`` sees for a load ending at ``end_token``: per group,
    ``cdiv(end_token, S)`` blocks, null when wholly skipped (vLLM's manager ``get_num_skipped_tokens``),
    hashed inside the local prefix, fresh otherwise."""
    out = []
    next_id = 1
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        span = spec.block_size * (dcp if spec.dcp_sharded else 1)
        skipped = coordinator.single_type_managers[i].get_num_skipped_tokens(end_token)
        blocks = []
        for j in range(-(-end_token // span)):
            if (j + 1) * span <= skipped:
                blocks.append(KVCacheBlock(0, is_null=True))
                continue
            b = KVCacheBlock(next_id)
            next_id += 1
            if (j + 1) * span <= local_tokens:
                b.set_block_hash(make_block_hash_with_group_id(b"local%d" % j, i))
            blocks.append(b)
        out.append(blocks)
    return KVCacheBlocks(tuple(out))


@dataclass
class VllmObjects:
    """Everything :func:`build` makes for one geometry."""

    geometry: Geometry
    vllm_config: Any
    kv_cache_config: KVCacheConfig
    tier: ChosenTier = field(default_factory=ChosenTier)
    coordinator: Any = None
    scheduler: OffloadingConnectorScheduler | None = None


def build_coordinator(geom: Geometry, kcc: KVCacheConfig, *, max_model_len: int, scheduler_block_size: int,
                      hash_block_size: int, use_eagle: bool = False, **lookahead: int) -> Any:
    """vLLM's KV cache coordinator over ``kcc`` with ``geom``'s caching switch and DCP/PCP sizes (the one place
    the harnesses build it). ``lookahead``: ``num_prefill_lookahead`` / ``num_hash_lookahead_tokens`` when
    the geometry has them (vLLM's defaults otherwise)."""
    p = geom.config.parallel
    return get_kv_cache_coordinator(
        kcc,
        max_model_len=max_model_len,
        max_in_flight_tokens=8192,
        use_eagle=use_eagle,
        enable_caching=geom.config.cache.prefix_caching,
        enable_kv_cache_events=False,
        dcp_world_size=p.dcp,
        pcp_world_size=p.pcp,
        scheduler_block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
        **lookahead,
    )


def build(geom: Geometry, *, scheduler_block_size: int, hash_block_size: int) -> VllmObjects:
    """The vLLM objects of ``geom``: stand-in VllmConfig, scheduler-view KVCacheConfig, vLLM's KV cache
    coordinator (prefix caching as configured) and, when ``geom`` offloads, the
    OffloadingConnectorScheduler over an empty :class:`ChosenTier`.

    ``scheduler_block_size`` and ``hash_block_size`` are vLLM's own (``resolve_kv_cache_block_sizes``);
    the coordinator is built with them. vLLM's exceptions propagate (the caller records them as
    vLLM rejecting the geometry).

    >>> import kvgeom
    >>> objs = build(kvgeom.resolve(kvgeom.DEFAULT_CONFIG), scheduler_block_size=32, hash_block_size=16)
    >>> [(c.tokens_per_block, c.tokens_per_chunk) for c in objs.scheduler.config.kv_group_configs]
    [(32, 32), (16, 16)]
    """
    vc = build_vllm_config(geom)
    kcc = build_kv_cache_config(geom)
    spec = vc.speculative_config
    # Scheduler.__init__: the drop unless lookahead hashes prove the boundary token
    use_eagle = spec is not None and spec.use_eagle_block_drop() and not vc.num_hash_lookahead_tokens
    coordinator = build_coordinator(
        geom, kcc, max_model_len=vc.model_config.max_model_len, use_eagle=use_eagle,
        scheduler_block_size=scheduler_block_size, hash_block_size=hash_block_size,
        num_prefill_lookahead=vc.num_prefill_lookahead_tokens, num_hash_lookahead_tokens=vc.num_hash_lookahead_tokens,
    )
    objs = VllmObjects(geom, vc, kcc, coordinator=coordinator)
    if geom.offload is not None:
        objs.scheduler = build_scheduler(geom, objs.tier, vllm_config=vc, kv_cache_config=kcc)
    return objs
