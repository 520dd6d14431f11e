"""The connector loop of docs/connector.md runs as written, with stand-ins for vLLM 0.33's
KVCacheConfig, VllmConfig and Request (attribute shapes and vLLM's defaults; no vllm import), and the
index it keeps equals one rebuilt from the tier's final contents.

The page's first block builds vLLM's real objects; here it is replaced by the stand-ins (same names),
and the blocks after it run unchanged. tests/test_docs_vllm.py runs every block on vLLM's real
objects in the vLLM venv."""

from __future__ import annotations

import hashlib
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
    prefix_cache_retention_interval: int | None = 0  # vLLM 0.33's default
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


@dataclass
class ReqContext:
    """vLLM's ReqContext as the page builds it: a request id."""

    req_id: str


@dataclass(frozen=True)
class LookupResult:
    """vLLM's LookupResult members as kvgeom reads them: by name."""

    name: str


HIT, MISS = LookupResult("HIT"), LookupResult("MISS")


@dataclass
class PrepareStoreOutput:
    keys_to_store: list


class CPUOffloadingManager:
    """vLLM's CPU tier as the page uses it: prepare_store / complete_store, then lookup(key, req_context)
    answers HIT for a stored key (ready once its store completed), MISS otherwise."""

    def __init__(self, num_chunks: int) -> None:
        self.num_chunks = num_chunks
        self.ready: set[bytes] = set()
        self.pending: set[bytes] = set()

    def prepare_store(self, keys: list, req_context: ReqContext) -> PrepareStoreOutput:
        new = [k for k in keys if k not in self.ready and k not in self.pending]
        assert len(self.ready) + len(self.pending) + len(new) <= self.num_chunks
        self.pending.update(new)
        return PrepareStoreOutput(new)

    def complete_store(self, keys: list, req_context: ReqContext) -> None:
        for k in keys:
            self.pending.discard(k)
            self.ready.add(k)

    def lookup(self, key: bytes, req_context: ReqContext) -> LookupResult:
        return HIT if key in self.ready else MISS


def _doc_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), flags=re.S | re.M)


@dataclass
class Request:
    """vLLM's Request as the page reads it: prompt_token_ids, num_tokens, block_hashes (one per H)."""

    request_id: str
    prompt_token_ids: list
    block_hashes: list

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids)


def _request(req_id: str, tokens: list, hash_block_size: int) -> Request:
    out, parent = [], b""
    for i in range(len(tokens) // hash_block_size):
        chunk = tokens[i * hash_block_size:(i + 1) * hash_block_size]
        parent = hashlib.sha256(parent + b"".join(t.to_bytes(4, "little") for t in chunk)).digest()
        out.append(parent)
    return Request(req_id, list(tokens), out)


def _make_vllm_config(**cache: Any) -> VllmConfig:
    return VllmConfig(cache_config=CacheConfig(**cache))


def _make_kv_cache_config(vllm_config: VllmConfig) -> KVCacheConfig:
    return KVCacheConfig(100, [], [KVCacheGroupSpec(["layer.0"], FullAttentionSpec(16)),
                                   KVCacheGroupSpec(["layer.1"], MambaSpec(16))])


def _run_doc(upto: int | None = None) -> dict[str, Any]:
    """The page's blocks after the first (which builds vLLM's real objects), on the stand-ins."""
    vllm_config = _make_vllm_config()
    scope: dict[str, Any] = {
        "make_vllm_config": _make_vllm_config,
        "make_kv_cache_config": _make_kv_cache_config,
        "request": _request,
        "vllm_config": vllm_config,
        "kv_cache_config": _make_kv_cache_config(vllm_config),
        "CPUOffloadingManager": CPUOffloadingManager,
        "ReqContext": ReqContext,
    }
    blocks = _doc_blocks()
    assert len(blocks) == 4 and "VllmConfig(" in blocks[0]
    for block in blocks[1:upto]:
        exec(compile(block, str(DOC), "exec"), scope)
    return scope


def test_the_connector_page_runs_as_written():
    scope = _run_doc(upto=2)
    geom = scope["geom"]
    # the stand-ins are the seed geometry: attention span 32 under DCP 2, Mamba 16
    assert [g.span for g in geom.groups] == [32, 16]
    # on vLLM's defaults (retention 0) B resumes at A's replay boundary, C (200 shared tokens) misses
    assert (scope["hit"].hit_tokens, scope["miss"].hit_tokens, scope["after"].hit_tokens) == (240, 0, 0)


def test_the_retention_block_runs_as_written():
    scope = _run_doc(upto=3)
    assert (scope["hit"].hit_tokens, scope["after"].hit_tokens) == (192, 128)  # 12 shared hash blocks


def test_the_own_manager_block_runs_as_written():
    # the connector's own tier and per-group keys, no index: C resumes at 192, the keys asked are the
    # request's own list entries (none built), and the same as the retention block's index answers
    scope = _run_doc()
    geom, c, manager = scope["geom"], scope["c"], scope["manager"]
    assert scope["hit"].hit_tokens == 192
    asked = []
    lookup = manager.lookup
    manager.lookup = lambda key, ctx: asked.append(key) or lookup(key, ctx)
    hit = lookup_hit(geom, c.num_tokens, stored=manager, offload_keys=scope["c_keys"], req_context=scope["c_ctx"])
    assert hit == scope["hit"]
    own = {id(k) for keys in scope["c_keys"] for k in keys}
    assert asked and all(id(k) in own for k in asked)


def test_a_token_id_of_256_or_more_hashes():
    # the page's old hash helper called bytes(tokens): ValueError on any real token id >= 256
    assert max(_run_doc(upto=2)["a"].prompt_token_ids) >= 256


def test_the_index_the_loop_kept_equals_one_rebuilt_from_the_tier():
    scope = _run_doc()  # the retention-64 tier: A stored, C's state at 192 evicted
    tier, keys, evicted = scope["tier"], scope["keys"], scope["evicted"]
    rebuilt = kvgeom.Residency()
    rebuilt.add_keys(k for k in keys if k not in evicted)
    assert len(tier) == len(rebuilt)
    for k in keys:
        block_hash, group = kvgeom.split_offload_key(k)
        assert tier.contains(group, block_hash) == rebuilt.contains(group, block_hash)
    # and lookups through the kept index equal lookups through the stored end-token lists
    geom, H = scope["geom"], scope["H"]
    b, b_hashes = scope["c"].prompt_token_ids, scope["c"].block_hashes
    index = {h: i for i, h in enumerate(b_hashes)}
    stored: dict[int, list[int]] = {og.index: [] for og in geom.offload.groups}
    for k in keys:
        block_hash, group = kvgeom.split_offload_key(k)
        if k not in evicted and block_hash in index:
            stored[group].append((index[block_hash] + 1) * H)
    hit = lookup_hit(geom, len(b), stored=tier, block_hashes=b_hashes)
    assert hit == lookup_hit(geom, len(b), stored=stored)
    assert hit.hit_tokens == 128
