"""vLLM's answer to the GPU prefix-cache question (needs an installed vLLM 0.33).

For a geometry and a scenario with ``gpu_resident`` (see :mod:`kvgeom.conformance.gpu_prefix`):

* the KV cache coordinator is vLLM's own (``v1/core/kv_cache_coordinator.py::get_kv_cache_coordinator``)
  over the scheduler-view ``KVCacheConfig`` of :func:`kvgeom.conformance.vllm_objects.build_kv_cache_config`,
  with vLLM's L and H (``resolve_kv_cache_block_sizes``), prefix caching as configured, each group's
  ``is_eagle_group`` and the coordinator's ``use_eagle`` from the geometry's speculative drop, and
  ``num_hash_lookahead_tokens`` / ``num_prefill_lookahead`` from its look-ahead hashes (vLLM's
  ``VllmConfig.num_hash_lookahead_tokens`` and ``num_prefill_lookahead_tokens``; the speculative
  switches are kvgeom's resolved ones, the lookup under them is vLLM's);
* the request is a real ``vllm.v1.request.Request`` (prompt ids ``0..n-1``) hashed by vLLM's own block
  hasher (``get_request_block_hasher``, sha256, with the look-ahead);
* the block pool is the coordinator's own ``BlockPool``: for every resident entry one of its blocks
  gets the entry's hash (the request's block hash at the entry's end, with the group id, as
  ``make_block_hash_with_group_id``) and is inserted into its ``cached_block_hash_to_block`` map,
  exactly as ``cache_full_blocks`` leaves a cached block;
* the lookup is ``find_longest_cache_hit(request.block_hashes, num_tokens - 1)``, the call and the cap
  of ``KVCacheManager.get_computed_blocks``; the answer is its hit length and, per group, the end
  tokens of the non-null blocks it returns (each block id maps back to the entry it was given).

Import this module only where vLLM is installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, make_block_hash_with_group_id
from vllm.v1.request import Request

from kvgeom.conformance import vllm_objects as vo
from kvgeom.geometry import Geometry

__all__ = ["vllm_prefix_answers"]


def _lookahead(geom: Geometry) -> tuple[bool, int, int]:
    """(use_eagle, num_hash_lookahead_tokens, num_prefill_lookahead) for the coordinator."""
    spec = geom.speculative
    if spec is None:
        return False, 0, 0
    return spec.gpu_drop, geom.hash_lookahead_tokens, spec.prefill_lookahead_tokens


def _request(num_tokens: int, hash_block_size: int, hash_lookahead: int) -> Request:
    vo.build_request(0, hash_block_size)  # seeds vLLM's NONE_HASH once, as the engine does at start-up
    return Request(
        request_id="prefix",
        prompt_token_ids=list(range(num_tokens)),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(hash_block_size, sha256, hash_lookahead),
    )


def vllm_prefix_answers(
    geom: Geometry, scenario: Mapping[str, Any], *, scheduler_block_size: int, hash_block_size: int
) -> dict[str, Any]:
    """vLLM's ``prefix.hit_tokens`` and ``prefix.groups`` (see the module docstring); empty when the
    scenario has no ``gpu_resident``. vLLM's exceptions propagate.

    >>> import kvgeom
    >>> g = kvgeom.resolve(kvgeom.DEFAULT_CONFIG)
    >>> vllm_prefix_answers(g, {"num_tokens": 100, "gpu_resident": {"0": [32, 64, 80], "1": [16, 48, 80]}},
    ...                     scheduler_block_size=32, hash_block_size=16)
    {'prefix.hit_tokens': 80, 'prefix.groups': {'0': [32, 64, 80], '1': [80]}}
    """
    resident = scenario.get("gpu_resident")
    if resident is None:
        return {}
    n = scenario["num_tokens"]
    H = hash_block_size
    use_eagle, hash_lookahead, prefill_lookahead = _lookahead(geom)
    kcc = vo.build_kv_cache_config(geom)
    for spec_group, g in zip(kcc.kv_cache_groups, geom.groups[: len(kcc.kv_cache_groups)], strict=True):
        spec_group.is_eagle_group = g.eagle_group
    coordinator = vo.build_coordinator(
        geom, kcc, max_model_len=max(geom.config.cache.max_model_len or 0, n + 1), use_eagle=use_eagle,
        scheduler_block_size=scheduler_block_size, hash_block_size=H,
        num_hash_lookahead_tokens=hash_lookahead, num_prefill_lookahead=prefill_lookahead,
    )
    request = _request(n, H, hash_lookahead)
    hashes = request.block_hashes
    pool = coordinator.block_pool
    end_of: dict[int, int] = {}
    next_block = 1  # block 0 is vLLM's null block
    for key, ends in resident.items():
        group = int(key)
        for e in ends:
            if e // H > len(hashes):
                continue  # past the request's hash chain: no hash to cache it under
            block = pool.blocks[next_block]
            next_block += 1
            block_hash = make_block_hash_with_group_id(hashes[e // H - 1], group)
            block.set_block_hash(block_hash)
            pool.cached_block_hash_to_block.insert(block_hash, block)
            end_of[block.block_id] = e
    blocks, hit = coordinator.find_longest_cache_hit(hashes, max(n - 1, 0))[:2]
    return {
        "prefix.hit_tokens": hit,
        "prefix.groups": {
            str(i): [end_of[b.block_id] for b in group_blocks if not b.is_null]
            for i, group_blocks in enumerate(blocks)
        },
    }
