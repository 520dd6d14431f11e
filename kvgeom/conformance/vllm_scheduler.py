"""vLLM 0.33's real v1 ``Scheduler`` admitting one request over a GPU prefix cache and an offload tier
the caller chooses (needs an installed vLLM).

:func:`scheduler_admits` answers the question :func:`kvgeom.request.plan_request` answers -- how many
tokens the GPU prefix cache gives (``local_hit_tokens``), how many the connector adds
(``external_hit_tokens``) and which offload keys are loaded -- by running vLLM's own code:
``Scheduler.schedule`` (``v1/core/sched/scheduler.py``) with its ``KVCacheManager`` and coordinator,
and the real ``OffloadingConnector`` (``offloading_connector.py``) with its
``OffloadingConnectorScheduler``. The numbers are read where the Scheduler hands them on:

* ``local_hit_tokens`` / ``external_hit_tokens``: the ``num_new_computed_tokens`` and
  ``num_external_computed_tokens`` the Scheduler passes to ``KVCacheManager.allocate_slots`` for the
  request (recorded by a pass-through wrapper around vLLM's method);
* ``connector_asked_from`` / ``connector_answer``: the arguments and result of the connector's
  ``get_num_new_matched_tokens``;
* ``entries``: per group, the first GPU block-table index and the block count of the load job
  (``dst_spec.block_indices`` / ``group_sizes``) in the ``SchedulerOutput``'s connector metadata;
* ``loads``: the offload keys ``update_state_after_alloc`` hands the tier's ``prepare_load``, per
  group, as end tokens (each key's block hash located in the request's hash chain);
* ``num_computed_tokens``: the request's ``num_computed_tokens`` in the ``SchedulerOutput``
  (``NewRequestData``), or the request's own count when it waits for an asynchronous load.

Stand-ins (everything else is vLLM's code, built by :mod:`kvgeom.conformance.vllm_objects`):

* **VllmConfig**: :func:`kvgeom.conformance.vllm_objects.build_vllm_config`'s stand-in, plus what the
  Scheduler reads: a real ``SchedulerConfig`` (chunked prefill on, 8192 batched tokens, 16 sequences),
  a real ``ObservabilityConfig``, ``cache_config.num_gpu_blocks`` =
  :data:`~kvgeom.conformance.vllm_objects.NUM_GPU_BLOCKS`, no LoRA / encoder / KV-events
  configuration, one batch in flight, a text-only generate model.
* **The GPU prefix cache**: entry *e* of group *g* is placed straight into vLLM's ``BlockPool``: a
  free block is taken, keyed by the request's chain hash at *e* tokens and group *g* (a full block
  when the group's span divides *e*, else through vLLM's own ``BlockPool.cache_partial_block``), and
  freed again, so it sits in the free queue as an evictable cached block -- what the allocator leaves
  after an earlier request computed the entry and finished, and evictions removed the others.
* **The offload tier**: :class:`~kvgeom.conformance.vllm_objects.ChosenTier` (HIT for exactly the
  chosen keys), reached through an offloading spec registered with vLLM's ``OffloadingSpecFactory``
  under :data:`SPEC_NAME`; the ``OffloadingConnector`` around it is vLLM's own.
* **Requests**: :func:`kvgeom.conformance.vllm_objects.build_request` (prompt ids ``0..n-1``,
  ``max_tokens`` 1).

Import this module only where vLLM is installed; ``import kvgeom`` never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from vllm.config import ObservabilityConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_offload.base import OffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from kvgeom.conformance import vllm_objects as vo
from kvgeom.geometry import Geometry
from kvgeom.prefix import resident_sets
from kvgeom.residency import split_offload_key

__all__ = [
    "SPEC_NAME",
    "Admission",
    "ChosenTierSpec",
    "build_scheduler",
    "place_gpu_entries",
    "classify",
    "differences",
    "kvgeom_admission",
    "scheduler_admits",
    "scheduler_vllm_config",
]

SPEC_NAME = "KvgeomChosenTierSpec"
"""Name of the offloading spec registered with vLLM's ``OffloadingSpecFactory`` (a :class:`ChosenTier`)."""


class ChosenTierSpec(OffloadingSpec):  # type: ignore[misc]
    """Offloading spec whose manager is a fresh ``tier_class`` (a
    :class:`~kvgeom.conformance.vllm_objects.ChosenTier`; a subclass names another tier class)."""

    tier_class: type[vo.ChosenTier] = vo.ChosenTier

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.tier = self.tier_class()

    def get_manager(self) -> Any:
        return self.tier

    def get_worker(self, kv_caches: Any) -> Any:
        raise NotImplementedError("the scheduler harness runs the scheduler side only")


if SPEC_NAME not in OffloadingSpecFactory._registry:
    OffloadingSpecFactory.register_spec(SPEC_NAME, __name__, "ChosenTierSpec")


def scheduler_vllm_config(geom: Geometry, *, max_num_batched_tokens: int = 8192, spec_name: str = SPEC_NAME) -> Any:
    """The stand-in VllmConfig the Scheduler is built with (see the module docstring): a token budget of
    ``max_num_batched_tokens`` (also the tokens in flight), the offload tier of the offloading spec
    registered as ``spec_name``; with a drafter, vLLM's own ``VllmConfig._set_max_num_scheduled_tokens``
    (its ``max_num_batched_tokens <= num_lookahead_tokens`` refusal included)."""
    vc = vo.build_vllm_config(geom)
    max_len = vc.model_config.max_model_len
    vc.scheduler_config = SchedulerConfig(
        max_model_len=max_len,
        is_encoder_decoder=False,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=16,
        enable_chunked_prefill=True,
    )
    vc.cache_config.num_gpu_blocks = vo.NUM_GPU_BLOCKS
    vc.observability_config = ObservabilityConfig()
    vc.lora_config = None
    vc.ec_transfer_config = None
    vc.is_mm_encoder_only = False
    vc.max_concurrent_batches = 1
    vc.max_in_flight_tokens = max_num_batched_tokens
    if vc.speculative_config is not None:
        VllmConfig._set_max_num_scheduled_tokens(vc)
    vc.ec_manager_config = SimpleNamespace(get_encoder_cache_manager_obj=lambda: None)
    vc.aux_output_config = SimpleNamespace(enabled=False)
    m = vc.model_config
    m.uses_mrope = False
    m.is_encoder_decoder = False
    m.runner_type = "generate"
    m.is_diffusion = False
    m.supports_multimodal_inputs = False
    m.return_sampling_mask = False
    if vc.kv_transfer_config is not None:
        vc.kv_transfer_config.kv_connector_extra_config["spec_name"] = spec_name
    return vc


def build_scheduler(geom: Geometry, *, scheduler_block_size: int, hash_block_size: int,
                    max_num_batched_tokens: int = 8192, spec_name: str = SPEC_NAME) -> Scheduler:
    """vLLM's v1 ``Scheduler`` for ``geom`` (see the module docstring for the stand-ins; the budget and
    the tier's spec as :func:`scheduler_vllm_config` takes them)."""
    from vllm.v1.structured_output import StructuredOutputManager

    vc = scheduler_vllm_config(geom, max_num_batched_tokens=max_num_batched_tokens, spec_name=spec_name)
    kcc = vo.build_kv_cache_config(geom)
    return Scheduler(
        vllm_config=vc,
        kv_cache_config=kcc,
        structured_output_manager=StructuredOutputManager.__new__(StructuredOutputManager),
        block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
    )


@dataclass(frozen=True)
class Admission:
    """What vLLM's Scheduler decided when it admitted the request."""

    gpu_hit_tokens: int
    """The GPU prefix-cache lookup's answer (``_get_local_prefix_cache_hit``), before a load drops its tail."""
    local_hit_tokens: int
    external_hit_tokens: int
    connector_asked_from: int | None
    connector_answer: int | None
    num_computed_tokens: int
    loads: dict[int, list[int]]
    """Per group: end tokens of the offload keys loaded, in order."""
    entries: dict[int, tuple[int, int]]
    """Per group with blocks to fill: the load job's first GPU block-table index and block count."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_hit_tokens": self.gpu_hit_tokens,
            "local_hit_tokens": self.local_hit_tokens,
            "external_hit_tokens": self.external_hit_tokens,
            "connector_asked_from": self.connector_asked_from,
            "connector_answer": self.connector_answer,
            "num_computed_tokens": self.num_computed_tokens,
            "loads": {str(g): ends for g, ends in sorted(self.loads.items())},
            "entries": {str(g): list(fc) for g, fc in sorted(self.entries.items())},
        }


def place_gpu_entries(sched: Scheduler, geom: Geometry, request: Any, resident: Mapping[int, Any], H: int) -> None:
    """Place the GPU prefix-cache entries ``resident`` (``{group: end tokens}``) of ``request``'s chain into
    vLLM's ``BlockPool`` as evictable cached blocks (see the module docstring, **The GPU prefix cache**)."""
    pool = sched.kv_cache_manager.block_pool
    dcp = geom.config.parallel.dcp
    kcc = sched.kv_cache_config
    for g, ends in sorted(resident.items()):
        spec = kcc.kv_cache_groups[g].kv_cache_spec
        span = spec.block_size * (dcp if spec.dcp_sharded else 1)
        for e in sorted(ends):
            (block,) = pool.get_new_blocks(1)
            if e % span == 0:
                key = make_block_hash_with_group_id(request.block_hashes[e // H - 1], g)
                pool._insert_block_hash(key, block, num_tokens=None)
            else:
                pool.cache_partial_block(request, block, e, g, span)
            pool.free_blocks([block])


def scheduler_admits(geom: Geometry, scenario: Mapping[str, Any]) -> Admission:
    """Admit a request of ``scenario["num_tokens"]`` prompt tokens through vLLM's real Scheduler, with
    the GPU prefix cache holding ``scenario["resident"]`` and the offload tier ``scenario["stored"]``
    (both ``{"<group>": [end tokens]}``, as :func:`kvgeom.request.plan_request` takes them).

    >>> import kvgeom
    >>> g = kvgeom.resolve({**kvgeom.DEFAULT_CONFIG, "offload": {}})
    >>> a = scheduler_admits(g, {"num_tokens": 100, "resident": {"0": [32, 48], "1": [48]},
    ...                          "stored": {"0": [32, 64], "1": [64]}})
    >>> a.local_hit_tokens, a.external_hit_tokens, a.loads
    (32, 32, {0: [64], 1: [64]})
    """
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    n = int(scenario["num_tokens"])
    L, H = resolve_kv_cache_block_sizes(vo.build_kv_cache_config(geom), vo.build_vllm_config(geom))
    sched = build_scheduler(geom, scheduler_block_size=L, hash_block_size=H)
    request = vo.build_request(n, H)
    chain = {bytes(h): i for i, h in enumerate(request.block_hashes)}
    place_gpu_entries(sched, geom, request, resident_sets(geom, scenario.get("resident", {})), H)

    tier: vo.ChosenTier | None = None
    if sched.connector is not None:
        tier = sched.connector.connector_scheduler.manager
        stored = resident_sets(geom, scenario.get("stored", {}), "stored")
        tier.keys = {vo.offload_key(request, g, e, H) for g, ends in stored.items() for e in ends}

    seen: dict[str, Any] = {}
    manager = sched.kv_cache_manager
    real_allocate = manager.allocate_slots

    def allocate_slots(req: Any, num_new_tokens: int, num_new_computed_tokens: int = 0, *args: Any,
                       **kwargs: Any) -> Any:
        if req.request_id == request.request_id and "local" not in seen:
            seen["local"] = num_new_computed_tokens
            seen["external"] = kwargs.get("num_external_computed_tokens", 0)
        return real_allocate(req, num_new_tokens, num_new_computed_tokens, *args, **kwargs)

    manager.allocate_slots = allocate_slots
    real_local = sched._get_local_prefix_cache_hit

    def get_local_prefix_cache_hit(req: Any, *args: Any, **kwargs: Any) -> Any:
        out = real_local(req, *args, **kwargs)
        seen["gpu"] = out[1]
        return out

    sched._get_local_prefix_cache_hit = get_local_prefix_cache_hit
    if sched.connector is not None:
        conn = sched.connector
        real_match = conn.get_num_new_matched_tokens

        def get_num_new_matched_tokens(req: Any, num_computed_tokens: int) -> Any:
            out = real_match(req, num_computed_tokens)
            seen["asked"], seen["answer"] = num_computed_tokens, out[0]
            return out

        conn.get_num_new_matched_tokens = get_num_new_matched_tokens

    sched.add_request(request)
    output = sched.schedule()
    new = [r for r in output.scheduled_new_reqs if r.req_id == request.request_id]
    computed = new[0].num_computed_tokens if new else request.num_computed_tokens
    loads: dict[int, list[int]] = {}
    for key in tier.loaded if tier is not None else ():
        block_hash, group = split_offload_key(key)
        loads.setdefault(group, []).append((chain[block_hash] + 1) * H)
    entries: dict[int, tuple[int, int]] = {}
    meta = output.kv_connector_metadata
    for job in getattr(meta, "load_jobs", {}).values():
        if job.req_id != request.request_id:
            continue
        configs = sched.connector.connector_scheduler.config.kv_group_configs
        dst = job.dst_spec
        for gc, size, first in zip(configs, dst.group_sizes, dst.block_indices, strict=True):
            if size:
                entries[gc.group_idx] = (int(first), int(size))
    return Admission(
        gpu_hit_tokens=seen.get("gpu", 0),
        local_hit_tokens=seen.get("local", 0),
        external_hit_tokens=seen.get("external", 0),
        connector_asked_from=seen.get("asked"),
        connector_answer=seen.get("answer"),
        num_computed_tokens=computed,
        loads=loads,
        entries=entries,
    )


def kvgeom_admission(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`kvgeom.request.plan_request`'s answer in :meth:`Admission.to_dict`'s shape (the GPU hit
    before a load drops its tail, the connector's question and answer, the loads per group)."""
    from kvgeom.request import plan_request

    plan = plan_request(geom, scenario)
    L = geom.scheduler_block_size
    asked = plan.local.hit_tokens - plan.local.hit_tokens % L
    out: dict[str, Any] = {
        "gpu_hit_tokens": plan.local.hit_tokens,
        "local_hit_tokens": plan.local_hit_tokens,
        "external_hit_tokens": plan.external_hit_tokens,
        "connector_asked_from": asked if plan.hit is not None else None,
        "connector_answer": plan.hit.hit_tokens if plan.hit is not None else None,
        "num_computed_tokens": plan.local_hit_tokens + plan.external_hit_tokens,
        "loads": {str(g.index): list(g.load_keys) for g in plan.groups if g.load_keys},
        "entries": {
            str(g.index): [g.block_entries[0], len(g.block_entries)]
            for g in plan.groups
            if g.block_entries and plan.external_hit_tokens
        },
    }
    return out


def differences(geom: Geometry, scenario: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Entries where kvgeom and vLLM's Scheduler disagree: ``{name: (kvgeom, vllm)}`` (empty when they
    agree). Names: ``gpu_hit_tokens``, ``local_hit_tokens``, ``external_hit_tokens``,
    ``connector_asked_from``, ``connector_answer``, ``num_computed_tokens``, ``loads``, ``entries``."""
    ours = kvgeom_admission(geom, scenario)
    theirs = scheduler_admits(geom, scenario).to_dict()
    return {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}


def classify(geom: Geometry, theirs: Mapping[str, Any]) -> str | None:
    """The registered deviation (:data:`kvgeom.deviations.DEVIATIONS` id) that explains vLLM's admission
    ``theirs`` (:meth:`Admission.to_dict`) differing from kvgeom's, or None for a new finding.

    ``realign-after-clamp``: vLLM loads an align-mode Mamba state that ends past the tokens it admits as
    computed (``local + external``), or (without partial tails) its connector's hit ends off an align-mode
    Mamba group's offload chunk: the connector lookup kvgeom re-aligns after every clamp.
    """
    admitted = theirs["local_hit_tokens"] + theirs["external_hit_tokens"]
    for g, ends in theirs["loads"].items():
        if geom.groups[int(g)].is_align_mamba and ends and ends[-1] > admitted:
            return "realign-after-clamp"
    off = geom.offload
    if off is not None and not off.supports_partial_tail and theirs["connector_answer"]:
        end = theirs["connector_asked_from"] + theirs["connector_answer"]
        if any(geom.groups[og.index].is_align_mamba and end % og.tokens_per_chunk for og in off.groups):
            return "realign-after-clamp"
    return None
