"""The connector loop of docs/connector.md runs as written, with stand-ins for vLLM 0.33's
KVCacheConfig and VllmConfig (attribute shapes only; no vllm import), and the index it keeps
equals one rebuilt from the tier's final contents."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kvgeom
from kvgeom.hits import lookup_hit

DOC = Path(__file__).resolve().parent.parent / "docs" / "connector.md"


@dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int = 8
    head_size: int = 128
    head_size_v: int = 128
    dtype: Any = "torch.bfloat16"
    dcp_sharded: bool = True
    page_size_padded: int | None = None
    tokens_per_state: int = 1
    prefix_cacheable: bool = True
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


@dataclass
class MambaSpec:
    block_size: int
    shapes: tuple = ((16, 64, 64), (3, 256))
    dtypes: tuple = ("torch.float32", "torch.bfloat16")
    page_size_padded: int | None = None
    mamba_cache_mode: str = "align"
    num_speculative_blocks: int = 0
    dcp_sharded: bool = False
    tokens_per_state: int = -1
    prefix_cacheable: bool = True


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: Any


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_tensors: list
    kv_cache_groups: list


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 2
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 2
    prefill_context_parallel_size: int = 1
    cp_kv_cache_interleave_size: int = 1


@dataclass
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_match_unit: int | None = None
    prefix_cache_retention_interval: int | None = None
    mamba_cache_mode: str = "align"


@dataclass
class ModelConfig:
    max_model_len: int = 4096


@dataclass
class KVTransferConfig:
    kv_connector: str = "OffloadingConnector"
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)


@dataclass
class VllmConfig:
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    kv_transfer_config: KVTransferConfig | None = field(default_factory=KVTransferConfig)


def _doc_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


def _run_doc() -> dict[str, Any]:
    scope: dict[str, Any] = {
        "kv_cache_config": KVCacheConfig(100, [], [KVCacheGroupSpec(["layer.0"], FullAttentionSpec(16)),
                                                   KVCacheGroupSpec(["layer.1"], MambaSpec(16))]),
        "vllm_config": VllmConfig(),
    }
    exec(compile(_doc_code(), str(DOC), "exec"), scope)
    return scope


def test_the_connector_page_runs_as_written():
    scope = _run_doc()
    geom = scope["geom"]
    # the stand-ins are the seed geometry: attention span 32 under DCP 2, Mamba 16
    assert [g.span for g in geom.groups] == [32, 16]
    assert (scope["hit"].hit_tokens, scope["after"].hit_tokens) == (192, 176)  # 12 shared hash blocks


def test_the_index_the_loop_kept_equals_one_rebuilt_from_the_tier():
    scope = _run_doc()
    tier, keys, evicted = scope["tier"], scope["keys"], scope["evicted"]
    rebuilt = kvgeom.Residency()
    rebuilt.add_keys(k for k in keys if k not in evicted)
    assert len(tier) == len(rebuilt)
    for k in keys:
        block_hash, group = kvgeom.split_offload_key(k)
        assert tier.contains(group, block_hash) == rebuilt.contains(group, block_hash)
    # and lookups through the kept index equal lookups through the stored end-token lists
    geom, H = scope["geom"], scope["H"]
    b, b_hashes = scope["b"], scope["b_hashes"]
    index = {h: i for i, h in enumerate(b_hashes)}
    stored: dict[int, list[int]] = {og.index: [] for og in geom.offload.groups}
    for k in keys:
        block_hash, group = kvgeom.split_offload_key(k)
        if k not in evicted and block_hash in index:
            stored[group].append((index[block_hash] + 1) * H)
    assert lookup_hit(geom, len(b), stored=tier, block_hashes=b_hashes) == lookup_hit(geom, len(b), stored=stored)
