"""vLLM adapter with stand-in objects that have vLLM 0.33's attribute shapes (no vllm import)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import kvgeom
from kvgeom.adapters.vllm import config_from_vllm, dtype_name, geometry_from_vllm
from kvgeom.errors import ConfigError
from kvgeom.pages import maybe_page_bytes


class TorchDtype:
    """Stands in for torch.dtype: only str() is read."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


BF16 = TorchDtype("bfloat16")
F32 = TorchDtype("float32")


@dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int = 8
    head_size: int = 128
    head_size_v: int = 128
    dtype: Any = BF16
    dcp_sharded: bool = True
    page_size_padded: int | None = None
    tokens_per_state: int = 1
    prefix_cacheable: bool = True
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


@dataclass
class MLAAttentionSpec(FullAttentionSpec):
    num_kv_heads: int = 1
    head_size: int = 576
    head_size_v: int = 0
    cache_dtype_str: str = "auto"
    alignment: int | None = None
    cache_role: str | None = None


@dataclass
class SlidingWindowSpec(FullAttentionSpec):
    sliding_window: int | None = 4096
    extra_retained_tokens: int = 0


@dataclass
class MambaSpec:
    block_size: int
    shapes: tuple = ((16, 64, 64), (3, 256))
    dtypes: tuple = (F32, BF16)
    page_size_padded: int | None = None
    mamba_cache_mode: str = "align"
    num_speculative_blocks: int = 0
    dcp_sharded: bool = False
    tokens_per_state: int = -1
    prefix_cacheable: bool = True


@dataclass
class UniformTypeKVCacheSpecs:
    block_size: int
    kv_cache_specs: dict
    dcp_sharded: bool = True


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
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    cp_kv_cache_interleave_size: int = 1


@dataclass
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_match_unit: int | None = None
    prefix_cache_retention_interval: int | None = 0
    mamba_cache_mode: str = "align"


@dataclass
class ModelConfig:
    max_model_len: int = 4096


@dataclass
class KVTransferConfig:
    kv_connector: str
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = field(default_factory=dict)


@dataclass
class VllmConfig:
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    kv_transfer_config: KVTransferConfig | None = None


def kv_config(*specs):
    return KVCacheConfig(
        num_blocks=100,
        kv_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layer.{i}"], s) for i, s in enumerate(specs)],
    )


def offloading(**extra):
    return KVTransferConfig("OffloadingConnector", kv_connector_extra_config=extra)


def dsa_container(block=64):
    return UniformTypeKVCacheSpecs(
        block_size=block,
        kv_cache_specs={
            "model.layers.0.self_attn.attn": MLAAttentionSpec(block_size=block),
            "model.layers.0.self_attn.indexer": MLAAttentionSpec(
                block_size=block, head_size=132, dtype=TorchDtype("uint8"), cache_role="indexer"
            ),
        },
    )


def geometry_facts(g):
    """Everything of a geometry except group kinds and the fingerprint (labels that legitimately differ)."""
    report = g.to_report()
    report.pop("fingerprint", None)
    for grp in report["groups"]:
        grp.pop("kind")
    return report


WRAPPED_VS_FLAT = [
    # #50883 / example 5: DSA wrapper at DCP 2, block 64 -> span 128 both sides
    ([dsa_container()], {"tensor_parallel_size": 2, "decode_context_parallel_size": 2}, {}),
    # example 5 at DCP 8 -> 512
    ([dsa_container()], {"tensor_parallel_size": 8, "decode_context_parallel_size": 8}, {"blocks_per_chunk": 2}),
    # a DSA wrapper next to an align-Mamba group (hybrid, DCP 2)
    (
        [dsa_container(64), MambaSpec(block_size=64)],
        {"tensor_parallel_size": 2, "decode_context_parallel_size": 2},
        {"blocks_per_chunk": 1},
    ),
]


@pytest.mark.parametrize(("specs", "par", "extra"), WRAPPED_VS_FLAT)
def test_worker_and_scheduler_forms_give_identical_geometry(specs, par, extra):
    vc = VllmConfig(parallel_config=ParallelConfig(**par), kv_transfer_config=offloading(**extra))
    worker = kv_config(*specs)
    flat = [next(iter(s.kv_cache_specs.values())) if isinstance(s, UniformTypeKVCacheSpecs) else s for s in specs]
    scheduler = kv_config(*flat)
    gw, gs = geometry_from_vllm(worker, vc), geometry_from_vllm(scheduler, vc)
    assert gw.groups[0].kind == "uniform" and gs.groups[0].kind == "mla"
    assert geometry_facts(gw) == geometry_facts(gs)
    # without page fields the two forms differ only in the container label
    cw = config_from_vllm(worker, vc, include_pages=False)
    assert all(k not in leaf for leaf in cw["groups"][0]["layers"] for k in ("head_size", "dtype"))


def test_example_1_hybrid_under_dcp_49964():
    # #49964: full attention 16 + Mamba align 16, TP 2 / DCP 2, k = 1 -> tokens_per_block (32, 16)
    vc = VllmConfig(
        parallel_config=ParallelConfig(tensor_parallel_size=2, decode_context_parallel_size=2),
        kv_transfer_config=offloading(),
    )
    g = geometry_from_vllm(kv_config(FullAttentionSpec(block_size=16), MambaSpec(block_size=16)), vc)
    assert [o.tokens_per_block for o in g.offload.groups] == [32, 16]
    assert g.hash_block_size == 16
    assert g.config.cache.max_model_len == 4096


def test_fields_are_mapped():
    cfg = config_from_vllm(
        kv_config(
            FullAttentionSpec(block_size=32, num_kv_heads=4, head_size=192, head_size_v=128),
            SlidingWindowSpec(block_size=32, dcp_sharded=False, sliding_window=1024, extra_retained_tokens=8),
            MLAAttentionSpec(block_size=32, cache_dtype_str="fp8_ds_mla", dtype=TorchDtype("uint8"), alignment=576),
            MambaSpec(block_size=32, page_size_padded=300000, num_speculative_blocks=2),
        ),
        VllmConfig(
            parallel_config=ParallelConfig(tensor_parallel_size=4, pipeline_parallel_size=2),
            cache_config=CacheConfig(prefix_match_unit=32, prefix_cache_retention_interval=None),
        ),
    )
    full, swa, mla, mamba = cfg["groups"]
    assert full == {
        "kind": "full_attention",
        "block_size": 32,
        "dcp_sharded": True,
        "num_kv_heads": 4,
        "head_size": 192,
        "head_size_v": 128,
        "dtype": "bfloat16",
    }
    assert (swa["dcp_sharded"], swa["sliding_window"], swa["extra_retained_tokens"]) == (False, 1024, 8)
    assert (mla["dtype"], mla["alignment"], "num_kv_heads" in mla) == ("fp8_ds_mla", 576, False)
    assert mamba["dtypes"] == ["float32", "bfloat16"] and mamba["shapes"] == [[16, 64, 64], [3, 256]]
    assert (mamba["page_size_padded"], mamba["num_speculative_blocks"]) == (300000, 2)
    assert cfg["parallel"] == {"tp": 4, "pp": 2, "dcp": 1, "pcp": 1, "cp_interleave": 1}
    assert cfg["cache"] == {
        "prefix_caching": True,
        "prefix_match_unit": 32,
        "retention_interval": None,
        "max_model_len": 4096,
    }
    assert "offload" not in cfg
    g = kvgeom.resolve(cfg)
    # page bytes: full 32*4*(192+128)*2; fp8_ds_mla 32*656 rounded up to a multiple of 576
    assert maybe_page_bytes(g.groups[0].spec) == 32 * 4 * 320 * 2
    assert maybe_page_bytes(g.groups[2].spec) == 21312  # 20992 -> 37*576


OFFLOAD = [
    # OffloadingConnector with blocks_per_chunk
    (
        KVTransferConfig("OffloadingConnector", kv_connector_extra_config={"blocks_per_chunk": 4}),
        {"blocks_per_chunk": 4},
    ),
    # OffloadingConnector with tokens per chunk
    (KVTransferConfig("OffloadingConnector", kv_connector_extra_config={"block_size": 64}), {"block_size": 64}),
    # inside a MultiConnector (NIXL + offloading, as in #53889)
    (
        KVTransferConfig(
            "MultiConnector",
            kv_connector_extra_config={
                "connectors": [
                    {"kv_connector": "NixlConnector"},
                    {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"blocks_per_chunk": 2}},
                ]
            },
        ),
        {"blocks_per_chunk": 2},
    ),
    # another connector only: no offload section
    (KVTransferConfig("NixlConnector"), None),
]


@pytest.mark.parametrize(("transfer", "expected"), OFFLOAD)
def test_offload_section_from_kv_transfer_config(transfer, expected):
    cfg = config_from_vllm(kv_config(FullAttentionSpec(block_size=16)), VllmConfig(kv_transfer_config=transfer))
    assert cfg.get("offload") == expected


def test_unknown_spec_class_is_an_error_unless_mapped():
    @dataclass
    class MyLatentSpec:
        block_size: int = 64

    with pytest.raises(ConfigError) as info:
        config_from_vllm(kv_config(MyLatentSpec()))
    assert (info.value.code, info.value.field) == ("unsupported_vllm_spec", "groups[0]")
    assert "spec_kinds" in str(info.value)
    cfg = config_from_vllm(kv_config(MyLatentSpec()), spec_kinds={"MyLatentSpec": "mla"})
    assert cfg["groups"][0]["kind"] == "mla"


def test_unknown_dtype_is_an_error():
    with pytest.raises(ConfigError) as info:
        config_from_vllm(kv_config(FullAttentionSpec(block_size=16, dtype=TorchDtype("float4_e2m1fn_x2"))))
    assert (info.value.code, info.value.field) == ("unknown_dtype", "groups[0].dtype")
    # without pages the dtype is not read
    assert (
        "dtype"
        not in config_from_vllm(
            kv_config(FullAttentionSpec(block_size=16, dtype=TorchDtype("float4_e2m1fn_x2"))), include_pages=False
        )["groups"][0]
    )


def test_not_a_kv_cache_config():
    with pytest.raises(ConfigError) as info:
        config_from_vllm(object())
    assert info.value.code == "not_a_kv_cache_config"


def test_dtype_names():
    # torch names, aliases and vLLM cache dtype strings
    assert [dtype_name(TorchDtype(n)) for n in ("float16", "half", "float8_e5m2")] == ["float16", "float16", "fp8_e5m2"]
    assert dtype_name(None) is None


def test_import_kvgeom_and_adapter_pull_no_vllm_torch_hypothesis():
    code = (
        "import sys, kvgeom, kvgeom.adapters.vllm, kvgeom.resolution, kvgeom.compat, kvgeom.fingerprint\n"
        "bad = [m for m in ('vllm', 'torch', 'hypothesis') if m in sys.modules]\n"
        "print(bad)\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"
