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
    # the engine core sets cache_config.block_size to the smallest per-rank block
    cache = CacheConfig(block_size=min(s.block_size for s in specs))
    vc = VllmConfig(parallel_config=ParallelConfig(**par), cache_config=cache, kv_transfer_config=offloading(**extra))
    worker = kv_config(*specs)
    flat = [next(iter(s.kv_cache_specs.values())) if isinstance(s, UniformTypeKVCacheSpecs) else s for s in specs]
    scheduler = kv_config(*flat)
    gw, gs = geometry_from_vllm(worker, vc), geometry_from_vllm(scheduler, vc)
    assert gw.groups[0].kind == "uniform" and gs.groups[0].kind == "mla"
    assert geometry_facts(gw) == geometry_facts(gs)
    # without page fields the two forms differ only in the container label
    cw = config_from_vllm(worker, vc, include_pages=False)
    assert all(k not in leaf for leaf in cw["groups"][0]["layers"] for k in ("head_size", "dtype"))
    # ... and the fingerprint covers only what both views know (docs/fingerprint.md): equal (issue 10)
    fw = geometry_from_vllm(worker, vc, include_pages=False).fingerprint()
    assert fw == geometry_from_vllm(scheduler, vc, include_pages=False).fingerprint()
    # with page fields the flattened view knows one layer's page only, and says so by differing
    assert gw.fingerprint() != gs.fingerprint()


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
    # values given as strings: vLLM int()s them (offloading/config.py::build_offloading_config)
    (
        KVTransferConfig("OffloadingConnector", kv_connector_extra_config={"blocks_per_chunk": "4"}),
        {"blocks_per_chunk": 4},
    ),
    # inside a MultiConnector (NIXL + offloading, as in #53889), NIXL declared as keeping no chunks
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
    # another connector only, declared as keeping no chunks: no offload section
    (KVTransferConfig("NixlConnector"), None),
    # SimpleCPUOffloadConnector with its chunking passed: one CPU block per GPU block
    (KVTransferConfig("SimpleCPUOffloadConnector"), {"blocks_per_chunk": 1}),
]

CHUNKING = {"NixlConnector": None, "SimpleCPUOffloadConnector": {"blocks_per_chunk": "1"}}


@pytest.mark.parametrize(("transfer", "expected"), OFFLOAD)
def test_offload_section_from_kv_transfer_config(transfer, expected):
    cfg = config_from_vllm(
        kv_config(FullAttentionSpec(block_size=16)),
        VllmConfig(kv_transfer_config=transfer),
        connector_chunking=CHUNKING,
    )
    assert cfg.get("offload") == expected


def test_unknown_spec_class_is_an_error_unless_mapped():
    @dataclass
    class MyLatentSpec:
        block_size: int = 64

    with pytest.raises(ConfigError) as info:
        config_from_vllm(kv_config(MyLatentSpec()), VllmConfig())
    assert (info.value.code, info.value.field) == ("unsupported_vllm_spec", "groups[0]")
    assert "spec_kinds" in str(info.value)
    cfg = config_from_vllm(kv_config(MyLatentSpec()), VllmConfig(), spec_kinds={"MyLatentSpec": "mla"})
    assert cfg["groups"][0]["kind"] == "mla"


def test_unknown_dtype_is_an_error():
    with pytest.raises(ConfigError) as info:
        config_from_vllm(
            kv_config(FullAttentionSpec(block_size=16, dtype=TorchDtype("float4_e2m1fn_x2"))), VllmConfig()
        )
    assert (info.value.code, info.value.field) == ("unknown_dtype", "groups[0].dtype")
    # without pages the dtype is not read
    assert (
        "dtype"
        not in config_from_vllm(
            kv_config(FullAttentionSpec(block_size=16, dtype=TorchDtype("float4_e2m1fn_x2"))),
            VllmConfig(),
            include_pages=False,
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


# -- issue 10: a bridge that is never silently wrong -----------------------------------------------------

from typing import NamedTuple  # noqa: E402

from kvgeom.adapters.vllm import (  # noqa: E402
    OffloadKeys,
    coerce_extra_int,
    offload_from_transfer,
    speculative_from_vllm,
)
from kvgeom.errors import QueryError  # noqa: E402
from kvgeom.residency import Residency, make_offload_key  # noqa: E402

SEED_PAR = ParallelConfig(tensor_parallel_size=2, decode_context_parallel_size=2)


def seed_kv():
    """The seed geometry: full attention 16 + align-Mamba 16 (vLLM at TP 2 / DCP 2: spans [32, 16])."""
    return kv_config(FullAttentionSpec(block_size=16), MambaSpec(block_size=16))


def seed_vc(**changes):
    base = {"parallel_config": SEED_PAR, "kv_transfer_config": offloading(blocks_per_chunk=2)}
    return VllmConfig(**{**base, **changes})


class GroupOffloadConfig(NamedTuple):
    """vLLM 0.33 offloading/scheduler.py GroupOffloadConfig (the fields the adapter reads)."""

    group_idx: int
    tokens_per_block: int
    tokens_per_chunk: int
    hashes_per_chunk: int
    sliding_window_size_in_chunks: int | None
    kv_cache_spec: Any
    is_eagle_group: bool = False


class SchedulerOffloadConfig(NamedTuple):
    """vLLM 0.33 offloading/scheduler.py SchedulerOffloadConfig."""

    kv_group_configs: tuple
    blocks_per_chunk: int
    tokens_per_hash: int
    num_workers: int = 2
    offload_prompt_only: bool = True
    supports_partial_tail: bool = False
    alignment_tokens: int | None = None
    retention_interval: int | None = None
    dcp_world_size: int = 1


def seed_sched(**changes):
    """The SchedulerOffloadConfig vLLM 0.33's from_spec builds for the seed at k = 2 (recorded from a run of
    vLLM 0.33 on the real classes; tests/test_adapters_vllm_real.py recomputes it)."""
    fa, mb = seed_kv().kv_cache_groups
    groups = (
        GroupOffloadConfig(0, 32, 64, 4, None, fa.kv_cache_spec),
        GroupOffloadConfig(1, 16, 32, 2, 1, mb.kv_cache_spec),
    )
    base = {
        "kv_group_configs": groups,
        "blocks_per_chunk": 2,
        "tokens_per_hash": 16,
        "alignment_tokens": 64,
        "retention_interval": 0,
        "dcp_world_size": 2,
    }
    return SchedulerOffloadConfig(**{**base, **changes})


@dataclass
class OffloadingGroupConfig:
    """vLLM 0.33 v1/kv_offload/config.py OffloadingGroupConfig (layer names omitted)."""

    tokens_per_block: int
    group_id: int
    sliding_window_size_in_chunks: int | None = None


@dataclass
class OffloadingCacheConfig:
    tokens_per_hash: int
    blocks_per_chunk: int


@dataclass
class OffloadingParallelConfig:
    tp_size: int = 2
    pp_size: int = 1
    dcp_size: int = 2
    pcp_size: int = 1


@dataclass
class OffloadingConfig:
    """vLLM 0.33 OffloadingConfig: the fields the adapter compares."""

    groups: tuple
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig = field(default_factory=OffloadingParallelConfig)


@dataclass
class ParallelNoInterleave:
    tensor_parallel_size: int = 2
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 2
    prefill_context_parallel_size: int = 1


@dataclass
class SpeculativeConfig:
    method: str = "eagle"
    num_speculative_tokens: int = 3
    disable_eagle_block_drop: bool = False
    disable_lookahead_block_hashes: bool = False
    draft_model_config: Any = None


@dataclass
class VllmConfigSpec(VllmConfig):
    speculative_config: Any = None


def _with_group_flag(kv, i, **flags):
    for name, value in flags.items():
        setattr(kv.kv_cache_groups[i], name, value)
    return kv


def _draft_spec_kv():
    kv = seed_kv()
    kv.kv_cache_groups[0].kv_cache_spec.is_draft = True
    return kv


def _kv_with(**resolved):
    kv = seed_kv()
    for name, value in resolved.items():
        setattr(kv, name, value)
    return kv


# Every adapter path either returns vLLM's geometry or refuses/warns: (call, expected error code or None).
NEVER_SILENT = [
    # issue 10: the seed without vllm_config used to give spans [16, 16]; the parallel layout is unknown
    (lambda: geometry_from_vllm(seed_kv()), "parallel_layout_unknown"),
    # a VllmConfig without a parallel_config: same
    (lambda: geometry_from_vllm(seed_kv(), VllmConfig(parallel_config=None)), "parallel_layout_unknown"),
    # a parallel_config missing the interleave: named, not defaulted
    (
        lambda: geometry_from_vllm(seed_kv(), VllmConfig(parallel_config=ParallelNoInterleave())),
        "parallel_layout_unknown",
    ),
    # no cache_config: prefix caching on/off changes H, A and the Mamba mode
    (
        lambda: geometry_from_vllm(seed_kv(), VllmConfig(parallel_config=SEED_PAR, cache_config=None)),
        "cache_config_unknown",
    ),
    # a P/D connector nobody described: never skipped
    (
        lambda: geometry_from_vllm(seed_kv(), seed_vc(kv_transfer_config=KVTransferConfig("NixlConnector"))),
        "connector_chunking_unknown",
    ),
    # SimpleCPUOffloadConnector: its chunking is not OffloadingConnector's, so it must be passed
    (
        lambda: geometry_from_vllm(
            seed_kv(), seed_vc(kv_transfer_config=KVTransferConfig("SimpleCPUOffloadConnector"))
        ),
        "connector_chunking_unknown",
    ),
    # an extra-config value int() refuses
    (
        lambda: geometry_from_vllm(seed_kv(), seed_vc(kv_transfer_config=offloading(blocks_per_chunk="two"))),
        "bad_extra_config",
    ),
    # a connector declared chunk-less while prefix caching is off: vLLM still hashes at the gcd
    (
        lambda: geometry_from_vllm(
            seed_kv(),
            seed_vc(
                kv_transfer_config=KVTransferConfig("NixlConnector"),
                cache_config=CacheConfig(enable_prefix_caching=False),
            ),
            connector_chunking={"NixlConnector": None},
        ),
        "connector_hashes_unmodelled",
    ),
    # a group vLLM marks is_eagle_group, with no speculative_config in sight: the drafter flag has no method
    (
        lambda: geometry_from_vllm(_with_group_flag(seed_kv(), 0, is_eagle_group=True), seed_vc()),
        "drafter_without_speculative",
    ),
    # a drafter's layer spec (is_draft), no speculative_config either
    (lambda: geometry_from_vllm(_draft_spec_kv(), seed_vc()), "drafter_without_speculative"),
    # a speculative method kvgeom has no model for
    (
        lambda: geometry_from_vllm(
            seed_kv(), VllmConfigSpec(parallel_config=SEED_PAR, speculative_config=SpeculativeConfig("suffix"))
        ),
        "unsupported_speculative_method",
    ),
    # a single group whose per-rank block is not cache_config.block_size, from which vLLM derives L = H
    (
        lambda: geometry_from_vllm(
            kv_config(FullAttentionSpec(block_size=64)), seed_vc(), connector_chunking={"OffloadingConnector": None}
        ),
        "vllm_disagrees",
    ),
    # the engine core resolved another H than kvgeom derives from the same objects
    (lambda: geometry_from_vllm(_kv_with(hash_block_size=32), seed_vc()), "vllm_disagrees"),
    # ... or another hit alignment A
    (lambda: geometry_from_vllm(_kv_with(cache_hit_alignment_tokens=32), seed_vc()), "vllm_disagrees"),
    # a SchedulerOffloadConfig from another deployment (DCP 1 spans)
    (
        lambda: geometry_from_vllm(seed_sched(dcp_world_size=1), seed_vc()),
        "vllm_disagrees",
    ),
    # ... whose group 0 chunk disagrees
    (
        lambda: geometry_from_vllm(
            seed_sched(
                kv_group_configs=(
                    seed_sched().kv_group_configs[0]._replace(tokens_per_chunk=32),
                    seed_sched().kv_group_configs[1],
                )
            ),
            seed_vc(),
        ),
        "vllm_disagrees",
    ),
    # the worker side's OffloadingConfig with another k than the extra config gives
    (
        lambda: geometry_from_vllm(
            seed_kv(),
            seed_vc(),
            offloading_config=OffloadingConfig(
                groups=(OffloadingGroupConfig(32, 0), OffloadingGroupConfig(16, 1, 1)),
                cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=4),
            ),
        ),
        "vllm_disagrees",
    ),
    # ... or another DCP size
    (
        lambda: geometry_from_vllm(
            seed_kv(),
            seed_vc(),
            offloading_config=OffloadingConfig(
                groups=(OffloadingGroupConfig(32, 0), OffloadingGroupConfig(16, 1, 1)),
                cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=2),
                parallel=OffloadingParallelConfig(dcp_size=1),
            ),
        ),
        "vllm_disagrees",
    ),
    # the worker side's OffloadingConfig as vLLM 0.33 builds it for the seed: agrees
    (
        lambda: geometry_from_vllm(
            seed_kv(),
            seed_vc(),
            offloading_config=OffloadingConfig(
                groups=(OffloadingGroupConfig(32, 0), OffloadingGroupConfig(16, 1, 1)),
                cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=2),
                parallel=OffloadingParallelConfig(),
            ),
        ),
        None,
    ),
    # a SchedulerOffloadConfig missing group 1 (not offloaded): the groups cannot be known from it alone
    (
        lambda: geometry_from_vllm(
            seed_sched(kv_group_configs=(seed_sched().kv_group_configs[1]._replace(group_idx=1),)), seed_vc()
        ),
        "groups_not_offloaded",
    ),
    # the seed with its VllmConfig: vLLM's spans [32, 16], no error
    (lambda: geometry_from_vllm(seed_kv(), seed_vc()), None),
    # the seed from the scheduler side's offload config alone: same geometry, with a warning
    (lambda: geometry_from_vllm(seed_sched(), seed_vc()), None),
    # both: every number cross-checked
    (lambda: geometry_from_vllm(seed_kv(), seed_vc(), scheduler_offload_config=seed_sched()), None),
    # explicit parallel layout and cache section instead of a VllmConfig
    (
        lambda: geometry_from_vllm(seed_kv(), parallel={"tp": 2, "dcp": 2}, cache={}, offload={"blocks_per_chunk": 2}),
        None,
    ),
]


@pytest.mark.parametrize(("call", "code"), NEVER_SILENT)
def test_no_adapter_path_differs_from_vllm_silently(call, code):
    if code is not None:
        with pytest.raises(kvgeom.KVGeomError) as info:
            call()
        assert info.value.code == code, str(info.value)
        assert len(str(info.value)) > 60  # a message that names the fix, not a bare code
        return
    g = call()
    # vLLM 0.33 for the seed at TP 2 / DCP 2, k = 2: spans [32, 16], H 16, chunks [64, 32], alignment 64
    assert [x.span for x in g.groups] == [32, 16]
    assert (g.hash_block_size, [o.tokens_per_chunk for o in g.offload.groups]) == (16, [64, 32])
    assert g.offload.alignment_tokens == 64


def test_offload_config_alone_warns_and_matches_the_full_view():
    full = geometry_from_vllm(seed_kv(), seed_vc())
    alone = geometry_from_vllm(seed_sched(), seed_vc())
    assert "groups_from_offload_config" in [w.code for w in alone.warnings]
    assert "groups_from_offload_config" not in [w.code for w in full.warnings]
    assert alone.fingerprint() == full.fingerprint()
    assert {k: v for k, v in alone.to_report().items() if k != "warnings"} == {
        k: v for k, v in full.to_report().items() if k != "warnings"
    }


def test_missing_parallel_fields_are_named():
    with pytest.raises(ConfigError) as info:
        geometry_from_vllm(seed_kv(), VllmConfig(parallel_config=ParallelNoInterleave()))
    assert info.value.problems[0].values["missing"] == ["cp_kv_cache_interleave_size"]
    with pytest.raises(ConfigError) as info:
        geometry_from_vllm(seed_kv())
    assert "decode_context_parallel_size" in info.value.problems[0].values["missing"]


EXTRA_VALUES = [
    "4",  # a string, as JSON on the command line gives it
    " 4 ",  # int() strips whitespace
    "1_0",  # int() reads underscores
    4.9,  # a float: int() truncates, and so does vLLM
    True,  # a bool is an int
    7,  # an int as is
]


@pytest.mark.parametrize("value", EXTRA_VALUES)
def test_extra_config_values_are_read_as_vllm_int_s_them(value):
    assert coerce_extra_int(value, "f") == int(value)
    got = offload_from_transfer(offloading(blocks_per_chunk=value))
    assert got == {"blocks_per_chunk": int(value)}


@pytest.mark.parametrize("value", ["two", "4.0", None, [4], ""])
def test_extra_config_values_int_refuses_are_refused(value):
    # "4.0": int() refuses a float string, as vLLM does
    with pytest.raises(ConfigError) as info:
        coerce_extra_int(value, "blocks_per_chunk")
    assert info.value.code == "bad_extra_config"


def test_connector_chunking_overrides_even_offloading_connector():
    # a custom OffloadingSpec with its own chunking can be described explicitly
    got = offload_from_transfer(offloading(blocks_per_chunk=2), {"OffloadingConnector": {"block_size": "64"}})
    assert got == {"block_size": 64}
    assert offload_from_transfer(offloading(blocks_per_chunk=2), {"OffloadingConnector": None}) is None


def test_two_tiers_that_chunk_differently_are_refused():
    multi = KVTransferConfig(
        "MultiConnector",
        kv_connector_extra_config={
            "connectors": [
                {"kv_connector": "SimpleCPUOffloadConnector"},
                {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"blocks_per_chunk": 2}},
            ]
        },
    )
    with pytest.raises(ConfigError) as info:
        offload_from_transfer(multi, {"SimpleCPUOffloadConnector": {"blocks_per_chunk": 1}})
    assert info.value.code == "several_offload_tiers"
    # the same chunking on both: one tier to model
    assert offload_from_transfer(multi, {"SimpleCPUOffloadConnector": {"blocks_per_chunk": 2}}) == {
        "blocks_per_chunk": 2
    }


@dataclass
class HFConfig:
    num_nextn_predict_layers: int


@dataclass
class DraftModelConfig:
    hf_config: HFConfig


SPECULATIVE = [
    # EAGLE with vLLM's defaults: block drop and lookahead hashes on
    (
        SpeculativeConfig("eagle", 3),
        {"method": "eagle", "num_speculative_tokens": 3, "eagle_block_drop": True, "lookahead_hashes": True},
    ),
    # EAGLE-3 with both disabled
    (
        SpeculativeConfig("eagle3", 2, True, True),
        {"method": "eagle3", "num_speculative_tokens": 2, "eagle_block_drop": False, "lookahead_hashes": False},
    ),
    # an MTP model type maps to "mtp", with the draft's number of MTP modules
    (
        SpeculativeConfig("deepseek_mtp", 1, draft_model_config=DraftModelConfig(HFConfig(2))),
        {
            "method": "mtp",
            "num_speculative_tokens": 1,
            "eagle_block_drop": True,
            "lookahead_hashes": True,
            "mtp_modules": 2,
        },
    ),
    # ngram on the GPU is ngram
    (
        SpeculativeConfig("ngram_gpu", 4),
        {"method": "ngram", "num_speculative_tokens": 4, "eagle_block_drop": True, "lookahead_hashes": True},
    ),
    # a draft model and dflash keep their names
    (
        SpeculativeConfig("draft_model", 5),
        {"method": "draft_model", "num_speculative_tokens": 5, "eagle_block_drop": True, "lookahead_hashes": True},
    ),
    (
        SpeculativeConfig("dflash", 8),
        {"method": "dflash", "num_speculative_tokens": 8, "eagle_block_drop": True, "lookahead_hashes": True},
    ),
]


@pytest.mark.parametrize(("sc", "expected"), SPECULATIVE)
def test_speculative_section_uses_the_spec_schema_keys(sc, expected):
    assert speculative_from_vllm(VllmConfigSpec(speculative_config=sc)) == expected
    assert speculative_from_vllm(VllmConfigSpec()) is None


def test_speculative_config_resolves_with_the_drafter_group_flagged():
    # EAGLE3 with vLLM's is_eagle_group on group 1: kvgeom's geometry flags exactly that group (vLLM 0.33
    # get_global_kv_cache_groups flags groups holding a draft layer when the block drop is in use)
    vc = VllmConfigSpec(parallel_config=SEED_PAR, speculative_config=SpeculativeConfig("eagle3", 2))
    g = geometry_from_vllm(_with_group_flag(seed_kv(), 0, is_eagle_group=True), vc)
    assert g.speculative is not None and g.speculative.method == "eagle3"
    assert g.speculative.num_speculative_tokens == 2 and g.speculative.block_drop
    assert [x.eagle_group for x in g.groups] == [True, False]


def test_speculative_config_without_flagged_groups_resolves():
    # EAGLE with no group flagged: resolves, no group is an eagle group (the GPU side's all-groups fallback is
    # reported through proof margins, not flags)
    g = geometry_from_vllm(seed_kv(), VllmConfigSpec(parallel_config=SEED_PAR, speculative_config=SpeculativeConfig()))
    assert g.speculative is not None and g.speculative.method == "eagle"
    assert [x.eagle_group for x in g.groups] == [False, False]


def test_offload_keys_round_trip_and_feed_residency():
    g = geometry_from_vllm(seed_kv(), seed_vc())
    chain = [bytes([i]) * 16 for i in range(8)]  # 8 (xxhash-sized) hashes of H = 16 tokens: 128 tokens
    keys = OffloadKeys(g, chain)
    r = Residency()
    for group, end in [(0, 64), (1, 32), (1, 128)]:
        key = keys.to_vllm(group, end)
        assert key == make_offload_key(chain[end // 16 - 1], group)  # vLLM's own bytes
        assert keys.to_kvgeom(key) == (group, end)
        r.add_key(key)
    contains = r.probe(g, chain)
    assert [contains(0, 64), contains(1, 32), contains(1, 128), contains(0, 32)] == [True, True, True, False]


OFFLOAD_KEY_ERRORS = [
    # a hash of another request
    (lambda k: k.to_kvgeom(make_offload_key(b"elsewhere".ljust(16, b"."), 0)), "unknown_block_hash"),
    # a group the geometry does not have
    (lambda k: k.to_kvgeom(make_offload_key(bytes([1]) * 16, 5)), "no_such_group"),
    # an end token off the H grid
    (lambda k: k.to_vllm(0, 40), "end_token_off_grid"),
    # an end token past the chain
    (lambda k: k.to_vllm(0, 16 * 9), "end_token_past_chain"),
    # not an offload key at all
    (lambda k: k.to_kvgeom(b"ab"), "bad_offload_key"),
    # a chain that holds something other than bytes
    (lambda k: OffloadKeys(SEED_GEOMETRY, ["h0"]).to_kvgeom(make_offload_key(bytes(16), 0)), "bad_block_hash"),
    # ... or is not a chain at all
    (lambda k: OffloadKeys(SEED_GEOMETRY, 5), "bad_block_hashes"),
]

SEED_GEOMETRY = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)


HOSTILE = [
    # an int where a KVCacheConfig belongs
    lambda: geometry_from_vllm(5, seed_vc()),
    # groups that are not a list
    lambda: geometry_from_vllm(KVCacheConfig(1, [], 5), seed_vc()),
    # a MultiConnector whose children are not a list of connectors
    lambda: offload_from_transfer(KVTransferConfig("MultiConnector", kv_connector_extra_config={"connectors": 3})),
    # a SchedulerOffloadConfig whose group list is not iterable
    lambda: geometry_from_vllm(seed_sched(kv_group_configs=7), seed_vc()),
]


@pytest.mark.parametrize("call", HOSTILE)
def test_hostile_objects_are_config_errors_not_crashes(call):
    with pytest.raises(kvgeom.KVGeomError):
        call()


@pytest.mark.parametrize(("call", "code"), OFFLOAD_KEY_ERRORS)
def test_offload_key_errors(call, code):
    keys = OffloadKeys(geometry_from_vllm(seed_kv(), seed_vc()), [bytes([i]) * 16 for i in range(8)])
    with pytest.raises(QueryError) as info:
        call(keys)
    assert info.value.code == code


def test_speculative_section_and_drafter_flags_are_emitted():
    vc = VllmConfigSpec(parallel_config=SEED_PAR, speculative_config=SpeculativeConfig("eagle", 2))
    cfg = config_from_vllm(_with_group_flag(seed_kv(), 0, is_eagle_group=True), vc)
    assert cfg["speculative"] == {
        "method": "eagle",
        "num_speculative_tokens": 2,
        "eagle_block_drop": True,
        "lookahead_hashes": True,
    }
    assert [g.get("drafter", False) for g in cfg["groups"]] == [True, False]
