"""vLLM's answer sheet: the questions of :mod:`kvgeom.conformance.answers`, asked of an installed vLLM.

Every number comes from vLLM's own code, called on the objects :mod:`kvgeom.conformance.vllm_objects`
builds (vLLM 0.33):

* validity: ``v1/core/kv_cache_utils.py::resolve_kv_cache_block_sizes``, the KV cache coordinator
  (``v1/core/kv_cache_coordinator.py::get_kv_cache_coordinator``), ``VllmConfig.validate_block_size``
  (called on the stand-in config), the offloading config (``offloading/config.py::build_offloading_config``)
  and ``SchedulerOffloadConfig.from_spec``; any exception they raise means "vLLM rejects", with its text;
  so does a block holding no compressed state, on which vLLM's KV-cache planning divides by a 0-byte page
  (:func:`kvgeom.conformance.vllm_objects.empty_pages`);
* spans: ``resolve_dcp_kv_block_size``; L and H: ``resolve_kv_cache_block_sizes``; A:
  ``resolve_cache_hit_alignment_tokens``;
* offload config: the ``SchedulerOffloadConfig`` of vLLM's ``OffloadingConnectorScheduler`` and its
  ``_mamba_align_size``;
* keys: the offload keys ``RequestOffloadState.update_offload_keys`` makes for a real request, read back
  with their positions; each key's bytes are split with :func:`kvgeom.split_offload_key` and its block
  hash located in the request's hash chain;
* hit: ``get_num_new_matched_tokens`` (``_lookup`` -> ``_lookup_complete_chunks``) on a tier holding
  exactly :func:`kvgeom.conformance.answers.tier_contents`;
* load: ``update_state_after_alloc``: the keys it hands the tier's ``prepare_load`` and the block indices
  and counts of the GPU load spec; the restored Mamba state boundary is the position of the Mamba key
  loaded;
* GPU prefix-cache hit: the KV cache coordinator's ``find_longest_cache_hit`` over a block pool holding
  exactly the scenario's ``gpu_resident`` entries (:mod:`kvgeom.conformance.vllm_prefix`).

Import this module only where vLLM is installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgeom.conformance import vllm_objects as vo
from kvgeom.conformance.answers import check_scenario, tier_contents
from kvgeom.conformance.vllm_prefix import vllm_prefix_answers
from kvgeom.geometry import Geometry
from kvgeom.residency import split_offload_key

__all__ = ["VLLM_VERSION", "vllm_answers"]

VLLM_VERSION = vo.VLLM_VERSION


def _error(where: str, e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{where}: {type(e).__name__}" + (f": {text}" if text else "")


def _geometry_answers(geom: Geometry, sheet: dict[str, Any]) -> vo.VllmObjects | None:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_utils import (
        resolve_cache_hit_alignment_tokens,
        resolve_dcp_kv_block_size,
        resolve_kv_cache_block_sizes,
    )

    try:
        vc = vo.build_vllm_config(geom)
        kcc = vo.build_kv_cache_config(geom)
    except Exception as e:
        sheet.update(valid=False, error=_error("building vLLM's config objects", e))
        return None
    empty = vo.empty_pages(kcc)
    if empty:
        sheet.update(valid=False, error=f"get_kv_cache_config_from_groups: {empty[0]}")
        return None
    dcp = geom.config.parallel.dcp
    sheet["spans"] = [resolve_dcp_kv_block_size(g.kv_cache_spec, dcp) for g in kcc.kv_cache_groups]
    step = "resolve_kv_cache_block_sizes"
    try:
        L, H = resolve_kv_cache_block_sizes(kcc, vc)
        sheet["scheduler_block_size"], sheet["hash_block_size"] = L, H
        step = "resolve_cache_hit_alignment_tokens"
        sheet["hit_alignment_tokens"] = resolve_cache_hit_alignment_tokens(kcc, vc, L, H)
        step = "VllmConfig.validate_block_size"
        VllmConfig.validate_block_size(vc)
        step = "the KV cache coordinator"
        objs = vo.build(geom, scheduler_block_size=L, hash_block_size=H)
    except Exception as e:
        sheet.update(valid=False, error=_error(step, e))
        return None
    sched = objs.scheduler
    if sched is not None:
        c = sched.config
        sheet.update(
            {
                "offload.blocks_per_chunk": c.blocks_per_chunk,
                "offload.tokens_per_hash": c.tokens_per_hash,
                "offload.alignment_tokens": c.alignment_tokens,
                "offload.mamba_align_size": sched._mamba_align_size,
                "offload.supports_partial_tail": c.supports_partial_tail,
                "offload.retention_interval": c.retention_interval,
                "offload.groups": [
                    [
                        gc.group_idx,
                        gc.tokens_per_block,
                        gc.tokens_per_chunk,
                        gc.hashes_per_chunk,
                        gc.sliding_window_size_in_chunks,
                    ]
                    for gc in c.kv_group_configs
                ],
            }
        )
    return objs


def vllm_answers(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's answer sheet for ``geom`` and ``scenario`` (same entries as
    :func:`kvgeom.conformance.answers.kvgeom_answers`; ``valid`` False plus ``error`` when vLLM rejects
    the geometry, ``lookup_error`` when its connector raises during the scenario, ``prefix.error`` when
    its coordinator raises during the prefix-cache lookup).

    >>> import kvgeom
    >>> g = kvgeom.resolve({"groups": [{"kind": "full_attention", "block_size": 16},
    ...                                {"kind": "mamba", "block_size": 24, "mamba_cache_mode": "align"}],
    ...                     "offload": {}})
    >>> s = vllm_answers(g, {"num_tokens": 80, "stored_tokens": 73})
    >>> s["hit_tokens"], s["mamba_state_after"]
    (64, {'1': 72})
    """
    scenario = check_scenario(scenario)
    sheet: dict[str, Any] = {"valid": True}
    try:
        objs = _geometry_answers(geom, sheet)
    except Exception as e:
        sheet.update(valid=False, error=_error("offloading config", e))
        return sheet
    if objs is None:
        return sheet
    if scenario.get("gpu_resident") is not None:
        try:
            sheet.update(
                vllm_prefix_answers(
                    geom,
                    scenario,
                    scheduler_block_size=sheet["scheduler_block_size"],
                    hash_block_size=sheet["hash_block_size"],
                )
            )
        except Exception as e:
            sheet["prefix.error"] = _error("KV cache coordinator find_longest_cache_hit", e)
    if objs.scheduler is None:
        return sheet
    try:
        _scenario_answers(geom, objs, scenario, sheet)
    except Exception as e:
        sheet["lookup_error"] = _error("OffloadingConnectorScheduler", e)
    return sheet


def _scenario_answers(geom: Geometry, objs: vo.VllmObjects, scenario: Mapping[str, Any], sheet: dict[str, Any]) -> None:
    sched = objs.scheduler
    assert sched is not None
    L, H = sheet["scheduler_block_size"], sheet["hash_block_size"]
    n = scenario["num_tokens"]
    request = vo.build_request(n, H)
    chain = {bytes(h): i for i, h in enumerate(request.block_hashes)}
    held = tier_contents(geom, scenario)
    objs.tier.keys = {vo.offload_key(request, g, e, H) for g, ends in held.items() for e in ends}

    sched.on_new_request(request)
    local = scenario["local_computed_tokens"]
    local -= local % L  # the scheduler hands the connector an L-aligned local prefix
    hit, _ = sched.get_num_new_matched_tokens(request, local)
    state = sched._req_status[request.request_id]
    ctx = state.req_context
    keys: dict[str, list[list[int]]] = {}
    for gc, gs in zip(sched.config.kv_group_configs, state.group_states, strict=True):
        rows = []
        for key in gs.offload_keys:
            block_hash, group = split_offload_key(bytes(key))
            if group != gc.group_idx:
                raise AssertionError(f"key of group {group} among group {gc.group_idx}'s keys")
            rows.append([ctx.get_offload_key_position(key), chain.get(block_hash, -1)])
        keys[str(gc.group_idx)] = rows
    sheet["keys"] = keys
    hit = hit or 0
    sheet["hit_tokens"] = hit
    sheet["end_token"] = local + hit
    load: dict[str, Any] = {}
    mamba_state: dict[str, int] = {}
    if hit:
        N = local + hit
        blocks = vo.gpu_blocks_for_load(
            objs.coordinator, objs.kv_cache_config, geom.config.parallel.dcp, local, N
        )
        sched.update_state_after_alloc(request, blocks, hit)
        job = next(iter(sched._current_batch_load_jobs.values()))
        per_group: dict[int, list[int]] = {}
        for key in objs.tier.loaded:
            _, group = split_offload_key(key)
            per_group.setdefault(group, []).append(ctx.get_offload_key_position(key))
        dst = job.dst_spec
        for gc, size, first in zip(sched.config.kv_group_configs, dst.group_sizes, dst.block_indices, strict=True):
            g = gc.group_idx
            load[str(g)] = {
                "keys": per_group.get(g, []),
                "first_entry": first if size else None,
                "num_entries": size,
            }
            spec = gc.kv_cache_spec
            if getattr(spec, "mamba_cache_mode", None) == "align" and per_group.get(g):
                mamba_state[str(g)] = per_group[g][-1]
    sheet["load"] = load
    sheet["mamba_state_after"] = mamba_state
