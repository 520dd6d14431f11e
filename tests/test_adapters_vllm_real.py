"""The vLLM adapter on vLLM 0.33's own objects (skipped when vllm is not importable).

Run with the vLLM environment of ``scripts/install-vllm-cpu.sh`` (``.ci-vllm-venv`` by default, or
``$KVGEOM_VLLM_VENV``; ``.ci/run`` does): ``PYTHONPATH=$PWD .ci-vllm-venv/bin/python -m pytest -q
tests/test_adapters_vllm_real.py``. Built here with vLLM's real classes: the spec classes,
``KVCacheConfig``/``KVCacheGroupSpec``, ``CacheConfig``, ``ParallelConfig``, ``KVTransferConfig``,
vLLM's ``build_offloading_config``, ``SchedulerOffloadConfig.from_spec`` and
``generate_scheduler_kv_cache_config``. Bypassed (nothing else): ``VllmConfig`` is a namespace
holding those real sub-configs plus a small model stand-in (name, dtype, ``use_mla``,
``max_model_len``, total KV heads), because a real ``ModelConfig`` loads a model from a hub; the
``OffloadingSpec`` is a subclass with no manager or worker (only its ``config`` is read).
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.config import CacheConfig, KVTransferConfig, ParallelConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import SchedulerOffloadConfig  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.kv_offload.base import OffloadingSpec, make_offload_key  # noqa: E402

import kvgeom  # noqa: E402
from kvgeom.adapters.vllm import OffloadKeys, coerce_extra_int, geometry_from_vllm  # noqa: E402

for _name in ("vllm", "vllm.v1", "vllm.distributed"):
    logging.getLogger(_name).setLevel(logging.ERROR)

F16 = torch.float16


class _Spec(OffloadingSpec):
    def get_manager(self) -> Any:
        raise NotImplementedError

    def get_worker(self, kv_caches: Any) -> Any:
        raise NotImplementedError


def fa(block: int) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=8, dtype=F16, dcp_sharded=True)


def mamba(block: int) -> MambaSpec:
    return MambaSpec(block_size=block, shapes=((8,),), dtypes=(F16,), mamba_cache_mode="align")


def swa(block: int, window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block, num_kv_heads=1, head_size=8, dtype=F16, sliding_window=window, dcp_sharded=False
    )


def dsa(block: int) -> UniformTypeKVCacheSpecs:
    main = MLAAttentionSpec(block_size=block, num_kv_heads=1, head_size=576, dtype=F16, dcp_sharded=True)
    indexer = MLAAttentionSpec(
        block_size=block,
        num_kv_heads=1,
        head_size=132,
        dtype=torch.uint8,
        dcp_sharded=True,
        cache_role=SparseCacheRole.INDEXER,
    )
    return UniformTypeKVCacheSpecs(block_size=block, kv_cache_specs={"l.0.attn": main, "l.0.indexer": indexer})


def kv_config(*specs: Any) -> KVCacheConfig:
    groups = [KVCacheGroupSpec([f"layer.{i}"], s) for i, s in enumerate(specs)]
    return KVCacheConfig(num_blocks=1024, kv_cache_tensors=[], kv_cache_groups=groups)


def vllm_config(tp: int, dcp: int, extra: dict[str, Any], *, mla: bool = False, block: int = 16) -> SimpleNamespace:
    """``cache_config.block_size`` is ``block``: the engine core sets it to the smallest per-rank block."""
    model = SimpleNamespace(
        model="kvgeom-test", dtype=F16, use_mla=mla, max_model_len=65536, get_total_num_kv_heads=lambda: tp
    )
    return SimpleNamespace(
        parallel_config=ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp),
        cache_config=CacheConfig(block_size=block, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=extra
        ),
        model_config=model,
        speculative_config=None,
        kv_events_config=None,
        use_v2_model_runner=False,
    )


def scheduler_offload_config(vc: Any, kv: KVCacheConfig) -> Any:
    return SchedulerOffloadConfig.from_spec(_Spec(build_offloading_config(vc, kv)), vc, kv)


DEPLOYMENTS = [
    # the seed: full attention 16 + align-Mamba 16 at TP 2 / DCP 2, blocks_per_chunk given as a string
    ("seed", lambda: [fa(16), mamba(16)], 2, 2, {"blocks_per_chunk": "2"}),
    # the large one: 3 x full attention 64 + align-Mamba 2048 at DCP 8
    ("large", lambda: [fa(64), fa(64), fa(64), mamba(2048)], 8, 8, {"blocks_per_chunk": 1}),
    # a DSA container (MLA + indexer) at DCP 2, chunk size in tokens given as a string
    ("dsa", lambda: [dsa(64)], 2, 2, {"block_size": "256"}),
    # full attention next to a replicated sliding window: window chunks
    ("swa", lambda: [fa(16), swa(16, 128)], 2, 2, {"blocks_per_chunk": 2}),
]


@pytest.mark.parametrize(("name", "specs", "tp", "dcp", "extra"), DEPLOYMENTS, ids=[d[0] for d in DEPLOYMENTS])
def test_geometry_equals_vllm_on_every_view(name, specs, tp, dcp, extra):
    worker = kv_config(*specs())
    vc = vllm_config(tp, dcp, extra, mla=name == "dsa", block=min(s.block_size for s in specs()))
    scheduler = generate_scheduler_kv_cache_config([worker])
    sched = scheduler_offload_config(vc, scheduler)  # built on the scheduler side, from its flattened view
    L, H = resolve_kv_cache_block_sizes(worker, vc)
    views = {
        "worker": geometry_from_vllm(worker, vc),
        "scheduler": geometry_from_vllm(scheduler, vc),
        "offload config alone": geometry_from_vllm(sched, vc),
        "scheduler + offload config": geometry_from_vllm(scheduler, vc, scheduler_offload_config=sched),
        "worker + offload config": geometry_from_vllm(worker, vc, scheduler_offload_config=sched),
        "worker + OffloadingConfig": geometry_from_vllm(
            worker, vc, offloading_config=build_offloading_config(vc, worker)
        ),
    }
    for view, g in views.items():
        assert (g.scheduler_block_size, g.hash_block_size) == (L, H), view
        assert [o.tokens_per_block for o in g.offload.groups] == [c.tokens_per_block for c in sched.kv_group_configs]
        assert [o.tokens_per_chunk for o in g.offload.groups] == [c.tokens_per_chunk for c in sched.kv_group_configs]
        assert [o.window_chunks for o in g.offload.groups] == [
            c.sliding_window_size_in_chunks for c in sched.kv_group_configs
        ]
        assert g.offload.alignment_tokens == sched.alignment_tokens, view
    # the fingerprint without page fields is one value on every view (docs/fingerprint.md)
    prints = {
        geometry_from_vllm(worker, vc, include_pages=False).fingerprint(),
        geometry_from_vllm(scheduler, vc, include_pages=False).fingerprint(),
        geometry_from_vllm(sched, vc, include_pages=False).fingerprint(),
    }
    assert len(prints) == 1


def test_seed_without_vllm_config_is_refused_not_16_16():
    with pytest.raises(kvgeom.ConfigError) as info:
        geometry_from_vllm(kv_config(fa(16), mamba(16)))
    assert info.value.code == "parallel_layout_unknown"


@pytest.mark.parametrize("value", ["3", " 3 ", "1_0", 2.9, True, 4])
def test_extra_config_coercion_matches_build_offloading_config(value):
    worker = kv_config(fa(16), mamba(16))
    vc = vllm_config(2, 2, {"blocks_per_chunk": value})
    assert build_offloading_config(vc, worker).cache.blocks_per_chunk == coerce_extra_int(value, "x")
    assert geometry_from_vllm(worker, vc).offload.blocks_per_chunk == coerce_extra_int(value, "x")


def test_offload_keys_are_vllm_bytes():
    worker = kv_config(fa(16), mamba(16))
    g = geometry_from_vllm(worker, vllm_config(2, 2, {"blocks_per_chunk": 2}))
    chain = [bytes([i]) * 32 for i in range(16)]
    keys = OffloadKeys(g, chain)
    for group, end in [(0, 64), (1, 32), (0, 256)]:
        assert keys.to_vllm(group, end) == make_offload_key(chain[end // 16 - 1], group)
        assert keys.to_kvgeom(make_offload_key(chain[end // 16 - 1], group)) == (group, end)


FAMILIES = {
    "full": lambda: [fa(16)],
    "full+mamba": lambda: [fa(16), mamba(16)],
    "3 full 64 + mamba 2048": lambda: [fa(64), fa(64), fa(64), mamba(2048)],
    "dsa": lambda: [dsa(64)],
    "full+swa": lambda: [fa(16), swa(16, 128)],
    "full+swa+mamba": lambda: [fa(32), swa(32, 256), mamba(32)],
}
SWEEP = [(f, d, k, pc) for f in FAMILIES for d in (1, 2, 4) for k in (1, 3) for pc in (True, False)]


@pytest.mark.parametrize(("family", "dcp", "k", "prefix_caching"), SWEEP)
def test_sweep_every_view_equals_vllm_or_refuses(family, dcp, k, prefix_caching):
    """No adapter path returns a geometry that differs from vLLM's: either every number matches what vLLM's
    own code resolves for the same objects, or vLLM itself refuses them too."""
    specs = FAMILIES[family]()
    worker = kv_config(*specs)
    vc = vllm_config(
        dcp, dcp, {"blocks_per_chunk": str(k)}, mla=family == "dsa", block=min(s.block_size for s in specs)
    )
    vc.cache_config.enable_prefix_caching = prefix_caching
    scheduler = generate_scheduler_kv_cache_config([worker])
    try:
        L, H = resolve_kv_cache_block_sizes(worker, vc)
        sched = scheduler_offload_config(vc, scheduler)
    except (ValueError, AssertionError) as exc:  # vLLM refuses this deployment: kvgeom must refuse it too
        with pytest.raises(kvgeom.KVGeomError):
            geometry_from_vllm(worker, vc)
        pytest.skip(f"vLLM refuses it too: {exc}")
    for view in (worker, scheduler):
        g = geometry_from_vllm(view, vc, scheduler_offload_config=sched)
        assert (g.scheduler_block_size, g.hash_block_size) == (L, H)
        assert [o.tokens_per_chunk for o in g.offload.groups] == [c.tokens_per_chunk for c in sched.kv_group_configs]


def test_a_real_eagle_group_without_a_speculative_config_is_refused():
    # vLLM flags is_eagle_group only with a drafter configured; a flag with no speculative_config cannot be
    # modelled (which method? which K?) and is refused, never dropped
    kv = kv_config(fa(16), mamba(16))
    kv.kv_cache_groups[0].is_eagle_group = True
    with pytest.raises(kvgeom.KVGeomError) as info:
        geometry_from_vllm(kv, vllm_config(2, 2, {}))
    assert info.value.code == "drafter_without_speculative"
